"""Minimal RESP (Redis protocol) client used by the redis application test.

usage: resp_client.py PORT OP [OP ...]
  set:KEY:FILE     SET KEY to the bytes of FILE, expect +OK
  get:KEY:FILE     GET KEY and write the bulk reply to FILE
  strlen:KEY       STRLEN KEY, printed
Prints one JSON object per op on stdout; exits non-zero on any error.
"""
import json
import socket
import sys


class Resp:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.buf = bytearray()

    def command(self, *args):
        parts = [b"*%d\r\n" % len(args)]
        for a in args:
            if isinstance(a, str):
                a = a.encode()
            parts.append(b"$%d\r\n" % len(a))
            parts.append(a)
            parts.append(b"\r\n")
        self.sock.sendall(b"".join(parts))
        return self.reply()

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            self._fill()

    def _exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data = bytes(self.buf[:n])
        if self.buf[n:n + 2] != b"\r\n":
            raise ValueError("bulk string not terminated by CRLF")
        del self.buf[:n + 2]
        return data

    def reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError("server error: " + rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.reply() for _ in range(n)]
        raise ValueError(f"unexpected reply line {line[:80]!r}")


def main():
    port = int(sys.argv[1])
    r = Resp(port)
    for op in sys.argv[2:]:
        name, _, rest = op.partition(":")
        if name == "set":
            key, path = rest.split(":", 1)
            with open(path, "rb") as f:
                value = f.read()
            res = r.command("SET", key, value)
            if res != "OK":
                raise RuntimeError(f"SET {key} answered {res!r}")
            print(json.dumps({"op": "set", "key": key, "len": len(value)}), flush=True)
        elif name == "get":
            key, path = rest.split(":", 1)
            value = r.command("GET", key)
            if value is None:
                raise RuntimeError(f"GET {key}: no such key")
            with open(path, "wb") as f:
                f.write(value)
            print(json.dumps({"op": "get", "key": key, "len": len(value)}), flush=True)
        elif name == "strlen":
            print(json.dumps({"op": "strlen", "key": rest, "len": r.command("STRLEN", rest)}),
                  flush=True)
        else:
            raise SystemExit(f"unknown op {op!r}")
    r.sock.close()


if __name__ == "__main__":
    main()
