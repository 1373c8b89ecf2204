#!/usr/bin/env python3
"""Commands sent on different connections, one after the other, must be
served in the order they were sent - the order redis' single-threaded event
loop gets them from epoll. Usage: redis_order.py PORT ROUNDS

Each round of each pattern sends A's command without waiting for its
answer, then B's (then C's), and checks redis served A first:

  blpop        three clients BLPOP q 0 in turn; once redis counts three
               blocked clients, RPUSH q 0 1 2: client i must get i
  brpoplpush   the same with BRPOPLPUSH q q2 0 (which pops the tail:
               LPUSH q 0 1 2)
  watch        A: WATCH k, then B: SET k; A's MULTI/EXEC must then fail
  unsubscribe  A (subscribed to c): UNSUBSCRIBE c, then B: PUBLISH c:
               nobody may receive it

Prints one JSON object: {pattern: rounds served out of order}. Every reply is
checked; a missing or malformed one is an error (exit 1), not a count.
"""
import json
import socket
import sys
import time


class Conn:
    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port))
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.s.settimeout(10)
        self.buf = b""

    def send(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.s.sendall(b"".join(out))

    def _line(self):
        while b"\r\n" not in self.buf:
            d = self.s.recv(65536)
            if not d:
                raise EOFError("redis closed the connection")
            self.buf += d
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _n(self, n):
        while len(self.buf) < n + 2:
            d = self.s.recv(65536)
            if not d:
                raise EOFError("redis closed the connection")
            self.buf += d
        v, self.buf = self.buf[:n], self.buf[n + 2:]
        return v

    def reply(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t in (b"+", b"-"):
            if t == b"-":
                raise RuntimeError("redis error: %s" % rest.decode())
            return rest.decode()
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            return None if n < 0 else self._n(n)
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise RuntimeError("bad reply %r" % line)

    def call(self, *args):
        self.send(*args)
        return self.reply()


def blocked(ctl):
    info = ctl.call("INFO", "clients").decode()
    for line in info.splitlines():
        if line.startswith("blocked_clients:"):
            return int(line.split(":")[1])
    raise RuntimeError("no blocked_clients in INFO")


def wait_blocked(ctl, n):
    end = time.monotonic() + 10
    while blocked(ctl) != n:
        if time.monotonic() > end:
            raise RuntimeError("redis never counted %d blocked clients" % n)


def blocking(port, rounds, cmd, push):
    cl = [Conn(port) for _ in range(3)]
    ctl = Conn(port)
    ctl.call("DEL", "q", "q2")
    late = 0
    for _ in range(rounds):
        for c in cl:                     # A, then B, then C: no waiting
            c.send(*cmd)
        wait_blocked(ctl, len(cl))
        assert ctl.call(push, "q", "0", "1", "2") == len(cl)
        got = []
        for c in cl:
            r = c.reply()
            got.append(int(r[1] if isinstance(r, list) else r))
        assert sorted(got) == [0, 1, 2], got
        late += got != [0, 1, 2]
        ctl.call("DEL", "q2")
    return late


def watch(port, rounds):
    a, b = Conn(port), Conn(port)
    late = 0
    for i in range(rounds):
        a.send("WATCH", "k")
        b.send("SET", "k", str(i))
        assert a.reply() == "OK" and b.reply() == "OK"
        a.send("MULTI")
        a.send("SET", "k2", str(i))
        a.send("EXEC")
        assert a.reply() == "OK" and a.reply() == "QUEUED"
        late += a.reply() is not None        # EXEC ran: SET came first
    return late


def unsubscribe(port, rounds):
    a, b = Conn(port), Conn(port)
    late = 0
    for i in range(rounds):
        assert a.call("SUBSCRIBE", "c") == [b"subscribe", b"c", 1]
        a.send("UNSUBSCRIBE", "c")
        b.send("PUBLISH", "c", str(i))
        n = b.reply()
        late += n != 0
        r = a.reply()
        if r[0] == b"message":               # delivered before the unsubscribe
            r = a.reply()
        assert r == [b"unsubscribe", b"c", 0], r
    return late


def main():
    port, rounds = int(sys.argv[1]), int(sys.argv[2])
    res = {
        "blpop": blocking(port, rounds, ("BLPOP", "q", "0"), "RPUSH"),
        "brpoplpush": blocking(port, rounds, ("BRPOPLPUSH", "q", "q2", "0"), "LPUSH"),
        "watch": watch(port, rounds),
        "unsubscribe": unsubscribe(port, rounds),
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
