"""memcached text-protocol client used by the memcached application test.

usage: mc_client.py PORT SEED SIZE [SIZE ...]

For each size a value is generated with random.Random(f"{SEED}:{i}") and
stored with `set`, then read back with `get` one key at a time, then all keys
with one multi-key `get`, then a pipelined burst of small sets/gets written in
one go. Prints a JSON report with the length and SHA-256 of every value read;
the test recomputes the expected values itself.
"""
import hashlib
import json
import random
import socket
import sys


def value_for(seed, i, size):
    return random.Random(f"{seed}:{i}").randbytes(size)


class Mc:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.buf = bytearray()

    def _fill(self):
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                out = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return out
            self._fill()

    def exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data = bytes(self.buf[:n])
        if self.buf[n:n + 2] != b"\r\n":
            raise ValueError("data block not terminated by CRLF")
        del self.buf[:n + 2]
        return data

    def set(self, key, flags, value):
        self.sock.sendall(b"set %s %d 0 %d\r\n" % (key, flags, len(value)) + value + b"\r\n")
        r = self.line()
        if r != b"STORED":
            raise RuntimeError(f"set {key!r}: {r!r}")

    def get(self, *keys):
        self.sock.sendall(b"get " + b" ".join(keys) + b"\r\n")
        return self.read_values()

    def read_values(self):
        out = {}
        while True:
            r = self.line()
            if r == b"END":
                return out
            parts = r.split()
            if len(parts) != 4 or parts[0] != b"VALUE":
                raise RuntimeError(f"unexpected reply {r[:100]!r}")
            out[parts[1]] = (int(parts[2]), self.exact(int(parts[3])))


def main():
    port, seed = int(sys.argv[1]), sys.argv[2]
    sizes = [int(s) for s in sys.argv[3:]]
    mc = Mc(port)
    keys = [b"sdp:%s:%d" % (seed.encode(), i) for i in range(len(sizes))]
    for i, (k, n) in enumerate(zip(keys, sizes)):
        mc.set(k, i * 7 + 1, value_for(seed, i, n))
    report = {"single": {}, "multi": {}, "pipelined": None}
    for i, k in enumerate(keys):
        got = mc.get(k)
        if list(got) != [k]:
            raise RuntimeError(f"get {k!r} returned keys {list(got)}")
        flags, v = got[k]
        report["single"][k.decode()] = [flags, len(v), hashlib.sha256(v).hexdigest()]
    got = mc.get(*keys)
    for k, (flags, v) in got.items():
        report["multi"][k.decode()] = [flags, len(v), hashlib.sha256(v).hexdigest()]

    # pipelining: 300 sets in one write, then 300 gets in one write
    n = 300
    small = [b"p%05d-" % j + value_for(seed, 10000 + j, 1 + j * 37 % 700) for j in range(n)]
    mc.sock.sendall(b"".join(b"set sdp:%s:p%d 0 0 %d\r\n%s\r\n" % (seed.encode(), j, len(v), v)
                             for j, v in enumerate(small)))
    stored = [mc.line() for _ in range(n)]
    mc.sock.sendall(b"".join(b"get sdp:%s:p%d\r\n" % (seed.encode(), j) for j in range(n)))
    bad = 0
    for j in range(n):
        vals = mc.read_values()
        if list(vals.values()) != [(0, small[j])]:
            bad += 1
    report["pipelined"] = {"n": n, "stored": sum(1 for s in stored if s == b"STORED"),
                           "mismatched": bad,
                           "bytes": sum(len(v) for v in small)}
    mc.sock.close()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
