"""Hold N idle TCP connections between two processes (run each under `sdp run`).

    many_conns.py server PORT N      accept N connections, answer, hold them
    many_conns.py client PORT N      make N connections, check, hold them

Every connection carries one exchange, checked: the client sends 64 bytes
(its index and random bytes), the server answers with their SHA-256. Then
every SAMPLE-th connection carries BIG random bytes each way, checked by
SHA-256. Each side then prints "ready <pid> <n>" and holds its connections
until its stdin closes. Any error: a message on stderr and exit 1.
"""
import hashlib
import os
import socket
import sys

SAMPLE = 500
BIG = 256 * 1024


def recv_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        b = s.recv(n - len(buf))
        if not b:
            raise EOFError(f"connection closed after {len(buf)} of {n} bytes")
        buf += b
    return bytes(buf)


def sdp_transport(s):
    return s.getsockopt(socket.SOL_TCP, 0x5D00)       # SDP_TRANSPORT


def big_exchange(s, first_send):
    """Both ends: send BIG random bytes and their digest, read the other's."""
    mine = os.urandom(BIG)
    if first_send:
        s.sendall(mine + hashlib.sha256(mine).digest())
    theirs = recv_exact(s, BIG + 32)
    if hashlib.sha256(theirs[:BIG]).digest() != theirs[BIG:]:
        raise ValueError("sample payload corrupted")
    if not first_send:
        s.sendall(mine + hashlib.sha256(mine).digest())


def server(port, n):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4096)
    print("listening", flush=True)
    conns = []
    for _ in range(n):
        c, _ = ls.accept()
        conns.append(c)
    by_index = {}
    for c in conns:
        msg = recv_exact(c, 64)
        c.sendall(hashlib.sha256(msg).digest())
        by_index[int.from_bytes(msg[:8], "little")] = c
    if sorted(by_index) != list(range(n)):
        raise ValueError("the clients' indexes are not 0..n-1")
    for i in range(0, n, SAMPLE):         # then the samples, in index order
        big_exchange(by_index[i], first_send=False)
    return conns


def client(port, n):
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    msgs = []
    for i, c in enumerate(conns):
        m = i.to_bytes(8, "little") + os.urandom(56)
        c.sendall(m)
        msgs.append(m)
    for i, c in enumerate(conns):       # answers come in the server's order
        if recv_exact(c, 32) != hashlib.sha256(msgs[i]).digest():
            raise ValueError(f"connection {i}: wrong answer")
    for i in range(0, n, SAMPLE):
        big_exchange(conns[i], first_send=True)
    return conns


def main():
    role, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    try:
        conns = (server if role == "server" else client)(port, n)
        sdp = sum(sdp_transport(c) for c in conns)
    except Exception as e:                       # noqa: BLE001 - report any failure
        print(f"{role}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"ready {os.getpid()} {len(conns)} {sdp}", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
