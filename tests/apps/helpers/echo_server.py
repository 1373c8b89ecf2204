"""asyncio echo server used by the application tests.

usage: echo_server.py PORT
Echoes every byte back until the peer half-closes, then closes. Prints
"peak N" whenever the number of simultaneously open connections reaches a new
multiple of 100, and "listening" once it accepts connections.
"""
import asyncio
import resource
import sys


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


class Counter:
    open = 0
    peak = 0


async def handle(reader, writer):
    Counter.open += 1
    if Counter.open > Counter.peak:
        Counter.peak = Counter.open
        if Counter.peak % 100 == 0:
            print(f"peak {Counter.peak}", flush=True)
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
    except (ConnectionError, OSError) as e:
        print(f"connection error: {e!r}", flush=True)
    finally:
        Counter.open -= 1


async def main(port):
    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
    print("listening", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    raise_nofile()
    asyncio.run(main(int(sys.argv[1])))
