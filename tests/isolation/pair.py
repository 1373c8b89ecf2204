"""The root side of the isolation test (test_isolation.py).

  pair.py server PORT   echo server; prints "listening", then for every
                        accepted connection "conn TRANSPORT PEERPORT"
                        (SDP_TRANSPORT of the accepted socket)
  pair.py client PORT   connects, prints "client TRANSPORT", then streams
                        1 KiB pattern chunks and checks the echo until its
                        stdin closes; prints "verified BYTES" or "bad ..."
"""
import os
import socket
import sys
import threading

SDP_TRANSPORT = 0x5D00


def transport(s):
    try:
        return s.getsockopt(socket.IPPROTO_TCP, SDP_TRANSPORT)
    except OSError:
        return 0


def say(*w):
    sys.stdout.write(" ".join(map(str, w)) + "\n")
    sys.stdout.flush()


def echo(s):
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            s.sendall(b)
    except OSError:
        pass
    s.close()


def server(port):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(4096)
    say("listening")
    while True:
        s, peer = ls.accept()
        say("conn", transport(s), peer[1])
        threading.Thread(target=echo, args=(s,), daemon=True).start()


def client(port):
    s = socket.create_connection(("127.0.0.1", port))
    say("client", transport(s))
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    n = 0
    while not stop.wait(0.005):
        chunk = bytes((n + i) * 7 % 251 for i in range(1024))
        s.sendall(chunk)
        got = b""
        while len(got) < len(chunk):
            b = s.recv(len(chunk) - len(got))
            if not b:
                say("bad eof", n)
                return
            got += b
        if got != chunk:
            say("bad data", n)
            return
        n += len(chunk)
    say("verified", n)


if __name__ == "__main__":
    (server if sys.argv[1] == "server" else client)(int(sys.argv[2]))
