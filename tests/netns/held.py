"""Sends the fabric still holds while the sender sleeps on another
connection (test_ofi.py: test_held_sends_pushed_while_asleep).

usage:
  held.py server ADDR PORT GATE   GATE: "go" (read A as soon as the client
                                  waits) or "stdin" (then also wait for a line
                                  on stdin first: the test measures the
                                  client's CPU while A is not read)
  held.py client ADDR PORT WAIT   WAIT: recv, poll or epoll (how the client
                                  waits on B)

A is a connection to PORT, B one to PORT + 1 (the test may keep B on
plain TCP with a policy: then the client's sleep on B does not call the
library for any SDP connection).
The client opens two connections, A and B (each tagged by its first byte).
It sends on A without blocking until the socket stops taking bytes (at
most 64 MiB): the bytes it took are then the peer's or the library's to
deliver, as TCP's kernel delivers what send() took. It then sends
"go COUNT SHA256" on B and waits on B only (blocking recv, or poll /
epoll_wait on B then recv), printing "waiting" first.

The server accepts both, reads the go line on B, (GATE stdin: waits for a
line on stdin,) then reads COUNT bytes from A, checks their SHA-256 and
answers "ok" or "bad" on B. Nobody calls the client's library for A in
the meantime: unless the library pushes A's bytes by itself, the server
never gets them all and never answers.

The client prints "answer ok" and exits 0 when the answer came and said
ok; the test bounds the time.
"""
import hashlib
import os
import select
import socket
import sys


def recv_line(s):
    b = b""
    while not b.endswith(b"\n"):
        d = s.recv(1)
        if not d:
            raise SystemExit("EOF before a line: %r" % b)
        b += d
    return b.decode().strip()


def server(addr, port, gate):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    ls = socket.socket(fam, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(4)
    ls2 = socket.socket(fam, socket.SOCK_STREAM)
    ls2.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls2.bind((addr, port + 1))
    ls2.listen(4)
    print("listening", flush=True)
    conns = {}
    for s in (ls, ls2):
        c, _ = s.accept()
        conns[c.recv(1)] = c
    a, b = conns[b"A"], conns[b"B"]
    words = recv_line(b).split()
    assert words[0] == "go", words
    count, want = int(words[1]), words[2]
    print("go %d" % count, flush=True)
    if gate == "stdin":
        sys.stdin.readline()
    h = hashlib.sha256()
    n = 0
    buf = bytearray(1 << 20)
    while n < count:
        k = a.recv_into(buf, min(len(buf), count - n))
        if not k:
            break
        h.update(memoryview(buf)[:k])
        n += k
    ok = n == count and h.hexdigest() == want
    print("read %d of %d, %s" % (n, count, "match" if ok else "MISMATCH"), flush=True)
    b.sendall(b"ok\n" if ok else b"bad\n")
    b.recv(1)                           # the client's close


def client(addr, port, how):
    a = socket.create_connection((addr, port))
    a.sendall(b"A")
    b = socket.create_connection((addr, port + 1))
    b.sendall(b"B")
    data = os.urandom(64 << 20)
    a.setblocking(False)
    sent, stopped = 0, False
    view = memoryview(data)
    while sent < len(data):
        try:
            sent += a.send(view[sent:sent + (1 << 20)])
        except BlockingIOError:
            stopped = True
            break
    h = hashlib.sha256(view[:sent]).hexdigest()
    b.sendall(("go %d %s\n" % (sent, h)).encode())
    print("waiting %s sent %d stopped %s" % (how, sent, stopped), flush=True)
    if how == "poll":
        p = select.poll()
        p.register(b.fileno(), select.POLLIN)
        assert p.poll(-1)
    elif how == "epoll":
        ep = select.epoll()
        ep.register(b.fileno(), select.EPOLLIN)
        assert ep.poll(-1)
    ans = recv_line(b)
    print("answer %s" % ans, flush=True)
    b.close()
    a.close()
    return 0 if ans == "ok" else 1


def main():
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(client(sys.argv[2], int(sys.argv[3]), sys.argv[4]))


if __name__ == "__main__":
    main()
