"""Bidirectional stream stress: many connections, random write and read sizes,
SHA-256 verified per connection and per direction.

usage:
  stress.py server PORT IO
  stress.py client PORT IO NCONN MIN_BYTES MAX_BYTES SEED GO_FILE

IO is "blocking" (plain blocking sockets) or "timeout" (sockets with a
timeout: CPython then poll()s before every send and recv, so one thread
polls for POLLIN while another polls the same socket for POLLOUT).

Per connection the client sends a header
    magic "SDPS" | conn id u32 | c2s length u64 | s2c length u64 | s2c seed u64
then c2s bytes followed by their SHA-256 (32 bytes). Concurrently the server
sends s2c bytes followed by their SHA-256; once both directions are done it
sends the SHA-256 of what it received plus a verdict byte (1 = the client's
digest matched). Both sides write with random sizes of 1 B .. 256 KiB (log-
uniform) and read with random sizes too.

The client first opens all connections and prints "connected N"; it then
waits (up to 120 s) for GO_FILE to exist before moving any data, so the test
can look at the open connections. While data moves it prints
"progress BYTES" (bytes sent + received so far) twice a second. It prints one
JSON report at the end and exits 1 unless every connection verified in both
directions.
"""
import hashlib
import json
import os
import random
import socket
import struct
import sys
import threading
import time

HDR = struct.Struct("!4sIQQQ")
MAGIC = b"SDPS"
MAX_IO = 256 << 10
POOL = os.urandom(4 << 20)
TIMEOUT = None                      # set from the IO argument
moved = [0]                         # progress counter (approximate, racy is fine)


def io_size(rng):
    return min(MAX_IO, max(1, int(2 ** rng.uniform(0, 18))))


def recv_exact(s, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = s.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError(f"EOF after {got} of {n} bytes")
        got += k
    return bytes(buf)


def send_stream(s, length, seed):
    """Send `length` pseudo-random bytes in random-size writes; return digest."""
    rng = random.Random(seed)
    h = hashlib.sha256()
    pool = memoryview(POOL)
    left = length
    while left:
        n = min(left, io_size(rng))
        off = rng.randrange(0, len(POOL) - n + 1)
        chunk = pool[off:off + n]
        h.update(chunk)
        s.sendall(chunk)
        left -= n
        moved[0] += n
    return h.digest()


def recv_stream(s, length, seed):
    """Receive exactly `length` bytes with random read sizes; return digest."""
    rng = random.Random(seed)
    h = hashlib.sha256()
    buf = bytearray(MAX_IO)
    view = memoryview(buf)
    left = length
    while left:
        want = min(left, io_size(rng))
        k = s.recv_into(view, want)
        if k == 0:
            raise ConnectionError(f"EOF with {left} of {length} bytes missing")
        h.update(view[:k])
        left -= k
        moved[0] += k
    return h.digest()


# ---------------------------------------------------------------- server

def serve_conn(s, lock):
    rep = {"ok": False}
    try:
        s.settimeout(TIMEOUT)
        magic, cid, c2s, s2c, seed = HDR.unpack(recv_exact(s, HDR.size))
        if magic != MAGIC:
            raise ValueError(f"bad magic {magic!r}")
        rep.update(conn=cid, c2s=c2s, s2c=s2c)
        out = {}

        def sender():
            try:
                out["digest"] = send_stream(s, s2c, seed)
                s.sendall(out["digest"])
            except Exception as e:  # reported below
                out["error"] = repr(e)

        t = threading.Thread(target=sender)
        t.start()
        got = recv_stream(s, c2s, seed ^ 0xA5A5)
        claimed = recv_exact(s, 32)
        t.join()
        if "error" in out:
            raise ConnectionError("send: " + out["error"])
        match = got == claimed
        s.sendall(got + bytes([1 if match else 0]))
        s.shutdown(socket.SHUT_WR)
        rest = s.recv(1)
        rep.update(ok=match and rest == b"", c2s_match=match, trailing=len(rest))
    except Exception as e:
        rep["error"] = repr(e)
    finally:
        s.close()
    with lock:
        print(json.dumps(rep), flush=True)


def server(port):
    lock = threading.Lock()
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((os.environ.get("STRESS_BIND", "127.0.0.1"), port))
    ls.listen(256)
    n = 0
    while True:
        s, _ = ls.accept()
        n += 1
        with lock:
            print(f"accepted {n}", flush=True)
        threading.Thread(target=serve_conn, args=(s, lock), daemon=True).start()


# ---------------------------------------------------------------- client

def client_conn(s, cid, c2s, s2c, seed, rep):
    try:
        s.settimeout(TIMEOUT)
        s.sendall(HDR.pack(MAGIC, cid, c2s, s2c, seed))
        out = {}

        def receiver():
            try:
                got = recv_stream(s, s2c, seed + 1)
                out["s2c_ok"] = got == recv_exact(s, 32)
                out["c2s_seen"] = recv_exact(s, 32)
                out["verdict"] = recv_exact(s, 1)
                out["eof"] = s.recv(1) == b""
            except Exception as e:
                out["error"] = repr(e)

        t = threading.Thread(target=receiver)
        t.start()
        # write sizes and read sizes come from different generators, so reads
        # never line up with writes
        sent = send_stream(s, c2s, seed ^ 0x5A5A)
        s.sendall(sent)
        t.join()
        if "error" in out:
            raise ConnectionError(out["error"])
        rep.update(s2c_ok=out["s2c_ok"], c2s_ok=out["c2s_seen"] == sent,
                   verdict=out["verdict"] == b"\x01", eof=out["eof"])
        rep["ok"] = all((rep["s2c_ok"], rep["c2s_ok"], rep["verdict"], rep["eof"]))
    except Exception as e:
        rep["error"] = repr(e)
    finally:
        s.close()


def client(port, n, lo, hi, seed, go_file):
    rng = random.Random(seed)
    plan = [(i, rng.randint(lo, hi), rng.randint(lo, hi), rng.getrandbits(62)) for i in range(n)]
    host = os.environ.get("STRESS_HOST", "127.0.0.1")
    socks = [socket.create_connection((host, port), timeout=60) for _ in range(n)]
    print(f"connected {n}", flush=True)
    deadline = time.monotonic() + 120
    while not os.path.exists(go_file) and time.monotonic() < deadline:
        time.sleep(0.02)
    t0 = time.monotonic()

    def progress():
        while True:
            print(f"progress {moved[0]}", flush=True)
            time.sleep(0.5)

    threading.Thread(target=progress, daemon=True).start()
    reps = [{"conn": i, "c2s": c2s, "s2c": s2c, "ok": False} for i, c2s, s2c, _ in plan]
    threads = [threading.Thread(target=client_conn, args=(socks[i], i, c2s, s2c, sd, reps[i]))
               for i, c2s, s2c, sd in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.monotonic() - t0
    total = sum(r["c2s"] + r["s2c"] for r in reps)
    print(json.dumps({"n": n, "ok": sum(1 for r in reps if r["ok"]), "seconds": round(secs, 3),
                      "c2s_bytes": sum(r["c2s"] for r in reps),
                      "s2c_bytes": sum(r["s2c"] for r in reps),
                      "mb_per_s": round(total / secs / 1e6, 1),
                      "failed": [r for r in reps if not r["ok"]][:10]}), flush=True)
    return 0 if all(r["ok"] for r in reps) else 1


if __name__ == "__main__":
    TIMEOUT = {"blocking": None, "timeout": 300.0}[sys.argv[3]]
    if sys.argv[1] == "server":
        server(int(sys.argv[2]))
    else:
        a = sys.argv[2:]
        sys.exit(client(int(a[0]), int(a[2]), int(a[3]), int(a[4]), int(a[5]), a[6]))
