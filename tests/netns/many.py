"""Many connections in one epoll loop per side (as redis and nginx serve
them): an echo server, and a client that opens N connections, moves
checksummed bytes on every one, then ping-pongs on one connection only
while the others sit idle in the same epoll set.

usage:
  many.py server ADDR PORT
  many.py client ADDR PORT NCONN BYTES ROUNDS

The server echoes every byte back on the connection it came from (non-
blocking, one thread, level-triggered epoll). It prints "listening" once
it listens and serves until killed.

The client
1. connects NCONN times (one after the other) and prints "connected N";
2. sends BYTES random bytes (seeded per connection) on every connection at
   once and reads the echo back: SHA-256 of what came back must be that of
   what was sent, for every connection;
3. ping-pongs 64 bytes ROUNDS times on connection 0 only, waiting in epoll
   over all NCONN connections (EPOLLIN): counts the events epoll reported
   for the other connections (idle_events) - none of them has anything to
   read, so each such event is a wake-up that was another connection's;
4. prints one JSON line and exits 0 if every connection verified.
"""
import hashlib
import json
import os
import random
import select
import socket
import sys
import time


def server(addr, port):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    ls = socket.socket(fam, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(4096)
    ls.setblocking(False)
    ep = select.epoll()
    ep.register(ls.fileno(), select.EPOLLIN)
    conns, pend = {}, {}
    print("listening", flush=True)
    while True:
        for fd, ev in ep.poll(1.0):
            if fd == ls.fileno():
                while True:
                    try:
                        s, _ = ls.accept()
                    except BlockingIOError:
                        break
                    s.setblocking(False)
                    conns[s.fileno()] = s
                    pend[s.fileno()] = bytearray()
                    ep.register(s.fileno(), select.EPOLLIN)
                continue
            s = conns.get(fd)
            if s is None:
                continue
            if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                try:
                    b = s.recv(1 << 16)
                except BlockingIOError:
                    b = None
                except ConnectionError:
                    b = b""
                if b == b"":
                    ep.unregister(fd)
                    s.close()
                    del conns[fd], pend[fd]
                    continue
                if b:
                    pend[fd] += b
            if pend[fd]:
                try:
                    n = s.send(pend[fd])
                    del pend[fd][:n]
                except BlockingIOError:
                    pass
                ep.modify(fd, select.EPOLLIN | (select.EPOLLOUT if pend[fd] else 0))


def client(addr, port, n, nbytes, rounds):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    t0 = time.monotonic()
    socks = []
    for _ in range(n):
        s = socket.create_connection((addr, port), timeout=30)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setblocking(False)
        socks.append(s)
    t_conn = time.monotonic() - t0
    print(f"connected {n}", flush=True)
    # 2. checksummed bytes on every connection at once
    ep = select.epoll()
    by_fd = {}
    for i, s in enumerate(socks):
        data = random.Random(i).randbytes(nbytes)
        st = {"i": i, "s": s, "out": memoryview(data), "sent_sha": hashlib.sha256(data),
              "got_sha": hashlib.sha256(), "got": 0}
        by_fd[s.fileno()] = st
        ep.register(s.fileno(), select.EPOLLIN | select.EPOLLOUT)
    left = n
    end = time.monotonic() + 120
    while left and time.monotonic() < end:
        for fd, ev in ep.poll(1.0):
            st = by_fd[fd]
            if ev & select.EPOLLOUT and len(st["out"]):
                try:
                    k = st["s"].send(st["out"][:1 << 16])
                    st["out"] = st["out"][k:]
                except BlockingIOError:
                    pass
                if not len(st["out"]):
                    ep.modify(fd, select.EPOLLIN)
            if ev & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
                try:
                    b = st["s"].recv(1 << 16)
                except BlockingIOError:
                    continue
                if not b:
                    print(json.dumps({"error": f"EOF on connection {st['i']}"}), flush=True)
                    return 1
                st["got_sha"].update(b)
                st["got"] += len(b)
                if st["got"] == nbytes:
                    left -= 1
    verified = sum(1 for st in by_fd.values()
                   if st["got"] == nbytes and st["got_sha"].digest() == st["sent_sha"].digest())
    t_data = time.monotonic() - t0 - t_conn
    # 3. ping-pong on connection 0, the others idle in the same set
    for fd in by_fd:
        ep.modify(fd, select.EPOLLIN)
    s0 = socks[0]
    idle_events = idle_readable = 0
    msg = b"p" * 64
    t1 = time.monotonic()
    for _ in range(rounds):
        s0.send(msg)
        got = 0
        while got < len(msg):
            for fd, ev in ep.poll(10.0):
                if fd == s0.fileno():
                    try:
                        got += len(s0.recv(len(msg) - got))
                    except BlockingIOError:
                        pass
                    continue
                idle_events += 1
                try:
                    if by_fd[fd]["s"].recv(1):
                        idle_readable += 1
                except BlockingIOError:
                    pass
    t_pp = time.monotonic() - t1
    for s in socks:
        s.close()
    print(json.dumps({"connected": n, "verified": verified, "bytes": nbytes,
                      "connect_s": round(t_conn, 3), "data_s": round(t_data, 3),
                      "rounds": rounds, "pingpong_s": round(t_pp, 3),
                      "idle_events": idle_events, "idle_readable": idle_readable}), flush=True)
    return 0 if verified == n and idle_readable == 0 else 1


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]))
    else:
        a = sys.argv[2:]
        sys.exit(client(a[0], int(a[1]), int(a[2]), int(a[3]), int(a[4])))
