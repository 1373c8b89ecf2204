"""Client for mixed_server.py.

usage: mixed_client.py PORT ORDER NCONN SEED

Opens NCONN connections one after another (each fully checked before the
next). For server-first it first reads the exact banner. It sends its payload
in random-size writes while a second thread reads the echo, half-closes, and
compares the echo byte for byte. Prints a JSON report; exit 1 on any error.
"""
import hashlib
import json
import random
import socket
import sys
import threading

BANNER = b"220 mixed-server ready, speaking first\r\n" * 4


def payload(seed, i):
    rng = random.Random(f"{seed}:{i}")
    head = f"MIXED {seed} {i}\n".encode()
    return head + rng.randbytes(rng.randint(256 << 10, 1 << 20))


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def one(port, order, seed, i):
    data = payload(seed, i)
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        if order == "server-first":
            banner = recv_exact(s, len(BANNER))
            if banner != BANNER:
                return f"conn {i}: banner differs: {banner[:80]!r}"
        got = bytearray()
        rerr = []

        def reader():
            try:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        return
                    got.extend(chunk)
            except OSError as e:
                rerr.append(repr(e))

        t = threading.Thread(target=reader)
        t.start()
        rng = random.Random(i)
        pos = 0
        while pos < len(data):
            step = rng.randint(1, 64 << 10)
            s.sendall(data[pos:pos + step])
            pos += step
        s.shutdown(socket.SHUT_WR)
        t.join(60)
        if t.is_alive():
            return f"conn {i}: echo not finished after 60 s ({len(got)} of {len(data)} bytes)"
        if rerr:
            return f"conn {i}: read error {rerr[0]}"
        if bytes(got) != data:
            return (f"conn {i}: echo differs: {len(got)} bytes back of {len(data)}, sha "
                    f"{hashlib.sha256(got).hexdigest()[:16]} vs "
                    f"{hashlib.sha256(data).hexdigest()[:16]}")
        return None
    except OSError as e:
        return f"conn {i}: {e!r}"
    finally:
        s.close()


def main():
    port, order, n, seed = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    errors = [e for e in (one(port, order, seed, i) for i in range(n)) if e]
    print(json.dumps({"n": n, "errors": errors,
                      "bytes": sum(len(payload(seed, i)) for i in range(n))}))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
