"""asyncio client for echo_server.py: N simultaneous connections.

usage: echo_client.py PORT N SEED MIN_BYTES MAX_BYTES
Every connection connects, waits until all N are connected (so N are open at
the same time), sends its own unique payload in a few chunks, half-closes and
reads the echo to EOF. Prints a JSON report; exits 1 unless all N succeeded
with byte-identical echoes.
"""
import asyncio
import hashlib
import json
import random
import resource
import sys
import time


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def payload(seed, i, lo, hi):
    rng = random.Random(f"{seed}:{i}")
    head = f"conn {i} seed {seed}\n".encode()
    return head + rng.randbytes(rng.randint(lo, hi) - len(head))


async def one(i, port, seed, lo, hi, n, state, all_connected):
    data = payload(seed, i, lo, hi)
    for attempt in range(5):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            break
        except OSError as e:
            state["connect_retries"] += 1
            last = e
            await asyncio.sleep(0.1 * (attempt + 1))
    else:
        state["errors"].append(f"conn {i}: connect failed: {last!r}")
        state["connected"] += 1  # do not hold the others back
        if state["connected"] == n:
            all_connected.set()
        return
    state["connected"] += 1
    if state["connected"] == n:
        all_connected.set()
    try:
        await all_connected.wait()
        rng = random.Random(i)
        pos = 0
        while pos < len(data):
            step = rng.randint(1, 2048)
            writer.write(data[pos:pos + step])
            pos += step
            await writer.drain()
        writer.write_eof()
        got = await reader.read(-1)
        writer.close()
        if got != data:
            state["errors"].append(
                f"conn {i}: echo differs ({len(got)} bytes back of {len(data)}, "
                f"sha {hashlib.sha256(got).hexdigest()[:16]} vs "
                f"{hashlib.sha256(data).hexdigest()[:16]})")
        else:
            state["ok"] += 1
            state["bytes"] += len(data)
    except (OSError, asyncio.IncompleteReadError) as e:
        state["errors"].append(f"conn {i}: {e!r}")


async def main():
    port, n, seed, lo, hi = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                             int(sys.argv[4]), int(sys.argv[5]))
    state = {"ok": 0, "bytes": 0, "connected": 0, "connect_retries": 0, "errors": []}
    all_connected = asyncio.Event()
    t0 = time.monotonic()
    await asyncio.gather(*(one(i, port, seed, lo, hi, n, state, all_connected)
                           for i in range(n)))
    state["seconds"] = round(time.monotonic() - t0, 3)
    state["errors"] = state["errors"][:20]
    print(json.dumps(state))
    return 0 if state["ok"] == n else 1


if __name__ == "__main__":
    raise_nofile()
    sys.exit(asyncio.run(main()))
