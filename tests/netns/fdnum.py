"""The descriptor numbers an application gets for its connections
(test_ofi.py: test_descriptor_numbers_as_tcp).

usage:
  fdnum.py server ADDR PORT N
  fdnum.py client ADDR PORT N

The server listens (prints "listening"), accepts N connections one after
the other, echoes one byte on each as soon as it is accepted, then prints
one JSON line {"fds": [the accepted sockets' numbers]} and waits until the
client closed every one (EOF), then exits 0.

The client connects N times one after the other, sends one byte on each
and reads it back before the next connect (so each connection is fully set
up - over ofi the fabric's connection included - before the next one
starts), prints {"fds": [its sockets' numbers], "open": [every descriptor
of the process]} and closes them.

Kernel TCP gives each new socket the lowest free number: the lists are the
same on every run. A library that keeps descriptors of its own at numbers
the application would get shifts the application's, which breaks programs
that size their tables by their connection count (wrk: 3 per connection +
10 per event loop)."""
import json
import os
import socket
import sys


def server(addr, port, n):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    ls = socket.socket(fam, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(n + 16)
    print("listening", flush=True)
    conns = []
    for _ in range(n):
        s, _ = ls.accept()
        b = s.recv(1)
        s.sendall(b)
        conns.append(s)
    print(json.dumps({"fds": [s.fileno() for s in conns]}), flush=True)
    for s in conns:
        while s.recv(4096):
            pass
        s.close()
    return 0


def client(addr, port, n):
    socks = []
    for i in range(n):
        s = socket.create_connection((addr, port), timeout=30)
        s.sendall(b"x")
        if s.recv(1) != b"x":
            print(json.dumps({"error": f"no echo on connection {i}"}), flush=True)
            return 1
        socks.append(s)
    own = sorted(int(x) for x in os.listdir("/proc/self/fd"))
    print(json.dumps({"fds": [s.fileno() for s in socks], "open": own}), flush=True)
    for s in socks:
        s.close()
    return 0


if __name__ == "__main__":
    role, addr, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sys.exit(server(addr, port, n) if role == "server" else client(addr, port, n))
