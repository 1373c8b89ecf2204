"""A small peer for the two-host tests (test_ofi.py): one connection,
SHA-256 verified, with hooks to hold it open or to block.

usage:
  peer.py server ADDR PORT MODE     MODE: sink (read to EOF, answer the digest,
                                    close), wait (accept, then block in recv)
  peer.py client ADDR PORT MODE ARG MODE: send NBYTES (send, shut down writes,
                                    check the digest), recv (block in recv,
                                    print how it ended), keepalive (as recv,
                                    with TCP keepalive and a user timeout),
                                    flood (send without end with a user timeout
                                    and no keepalive, print how it ended),
                                    sendrecv (send 64 KiB, then as recv)
                                    (server MODE hold: accept, read nothing)
A server prints "listening" once it listens, a client "connected" once it
connected, so the test can act at those points (ready files: argv's
$PEER_READY if set).
"""
import errno
import hashlib
import os
import socket
import sys
import time


def ready(what):
    print(what, flush=True)
    f = os.environ.get("PEER_READY")
    if f:
        open(f + "." + what, "w").close()


def server(addr, port, mode):
    fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(16)
    ready("listening")
    c, _ = s.accept()
    if mode == "hold":                  # accept, read nothing, wait to be killed
        ready("accepted")
        time.sleep(120)
        return
    if mode == "wait":
        ready("accepted")
        try:
            d = c.recv(1)
            print("recv returned %d bytes" % len(d), flush=True)
        except OSError as e:
            print("recv error %s" % e.__class__.__name__, flush=True)
        return
    h = hashlib.sha256()
    n = 0
    while True:
        d = c.recv(1 << 20)
        if not d:
            break
        h.update(d)
        n += len(d)
    c.sendall(h.digest())
    c.close()
    print("server received %d" % n, flush=True)


def client(addr, port, mode, arg):
    t0 = time.monotonic()
    c = socket.create_connection((addr, port), timeout=30)
    c.settimeout(None)
    print("connect took %.3f s" % (time.monotonic() - t0), flush=True)
    if mode == "keepalive":
        c.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 1)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 3000)
    if mode == "flood":
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 3000)
        block = os.urandom(1 << 16)
        sent, told = 0, False
        try:
            while True:
                sent += c.send(block)
                if sent >= 4 << 20 and not told:
                    ready("sending")
                    told = True
        except OSError as e:
            print("send error %s (%s) after %d bytes" % (e.__class__.__name__,
                  errno.errorcode.get(e.errno, e.errno), sent), flush=True)
        return 0
    if mode == "sendrecv":              # 64 KiB the server never reads, then recv
        c.sendall(os.urandom(64 << 10))
    if mode in ("recv", "keepalive", "sendrecv"):
        ready("connected")
        try:
            d = c.recv(1)
            print("recv returned %d bytes" % len(d), flush=True)
        except OSError as e:
            print("recv error %s" % e.__class__.__name__, flush=True)
        return 0
    ready("connected")
    total = int(arg)
    block = os.urandom(1 << 20)
    h = hashlib.sha256()
    sent = 0
    while sent < total:
        k = min(len(block), total - sent)
        c.sendall(block[:k])
        h.update(block[:k])
        sent += k
    hold = os.environ.get("PEER_HOLD")
    if hold:                        # keep the connection for a look at it
        ready("sent")
        deadline = time.monotonic() + 30
        while not os.path.exists(hold) and time.monotonic() < deadline:
            time.sleep(0.01)
    c.shutdown(socket.SHUT_WR)
    got = b""
    while len(got) < 32:
        d = c.recv(32 - len(got))
        if not d:
            break
        got += d
    ok = got == h.digest()
    print("client sent %d, digest %s" % (sent, "match" if ok else "MISMATCH"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1] == "server":
        server(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
    sys.exit(client(sys.argv[2], int(sys.argv[3]), sys.argv[4],
                    sys.argv[5] if len(sys.argv) > 5 else "0"))
