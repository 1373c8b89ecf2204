"""epoll_wait with a timeout of 0 on a writable connection whose peer does
not call the library (test_ofi.py: test_writable_arm_needs_no_peer).

usage:
  armout.py server ADDR PORT   accepts one connection, echoes one byte,
                               then reads a line on stdin (sleeping outside
                               the library) and exits
  armout.py client ADDR PORT N connects, exchanges one byte, registers the
                               socket with EPOLLIN | EPOLLOUT | EPOLLET (as
                               nginx does) and calls epoll_wait(0) N times;
                               prints {"calls": N, "slow": calls that took
                               more than 50 ms, "max_ms": ...}

epoll_wait(0) never sleeps on kernel TCP. Over ofi, a sleeper arms its
connections first: an arm that tells the peer (an RDMA Write and a
wake-up message) for a wait on writability, while the socket is writable
already, filled the peer's few wake-up buffers, and the next arm waited up
to 100 ms for the peer to take them."""
import json
import select
import socket
import sys
import time


def server(addr, port):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(4)
    print("listening", flush=True)
    s, _ = ls.accept()
    s.sendall(s.recv(1))
    print("echoed", flush=True)
    sys.stdin.readline()
    return 0


def client(addr, port, n):
    s = socket.create_connection((addr, port), timeout=30)
    s.sendall(b"x")
    assert s.recv(1) == b"x"
    s.setblocking(False)
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLIN | select.EPOLLOUT | select.EPOLLET)
    slow, worst = 0, 0.0
    for _ in range(n):
        t = time.monotonic()
        ep.poll(0)
        d = time.monotonic() - t
        worst = max(worst, d)
        slow += d > 0.05
    print(json.dumps({"calls": n, "slow": slow, "max_ms": round(worst * 1000, 1)}), flush=True)
    return 0


if __name__ == "__main__":
    a = sys.argv
    sys.exit(server(a[2], int(a[3])) if a[1] == "server" else client(a[2], int(a[3]), int(a[4])))
