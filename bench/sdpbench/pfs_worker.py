"""One client of the parallel file system experiment (pfs.py): writes a file
sequentially, reads it back, then creates and stats small files, each phase
on command so that all clients start a phase together.

    python3 pfs_worker.py --dir DIR --client N --size BYTES --files N --nonce X

Commands, one per line on stdin: prepare, write, poison, read, verify,
create, stat, quit. Each answers one JSON line on stdout with the phase's
start and end (time.monotonic(), CLOCK_MONOTONIC: comparable between
processes) and what it moved.

The data is checked byte for byte: `prepare` builds the whole file in
memory (a pattern unique to this client, offset and run) and its sha256;
`write` writes exactly that buffer; `poison` overwrites the buffer with
another pattern; `read` reads the file back into it; `verify` hashes what
was read. Only write, read, create and stat are measured phases, so
neither building the data nor hashing it costs time or CPU in them, and a
short or skipped read cannot pass."""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import random
import struct
import sys
import time

BLOCK = 1 << 20            # bytes per read/write call
POOL = 16 << 20            # random bytes repeated through the file
HEADER = struct.Struct("<8sIIQQ")   # magic, client, nonce, offset, size: 32 bytes


def build(size: int, client: int, nonce: int) -> bytearray:
    rnd = random.Random(nonce * 1000003 + client)
    pool = rnd.randbytes(min(POOL, max(size, 1)))
    buf = bytearray(size)
    mv = memoryview(buf)
    off = 0
    while off < size:
        n = min(len(pool), size - off)
        mv[off:off + n] = pool[:n]
        off += n
    # every block names its client, run and offset: a block from another
    # client or place cannot pass the comparison
    for off in range(0, size, BLOCK):
        h = HEADER.pack(b"SDPPFS01", client, nonce & 0xFFFFFFFF, off, size)
        n = min(len(h), size - off)
        mv[off:off + n] = h[:n]
    return buf


def now() -> float:
    return time.monotonic()


class Worker:
    def __init__(self, a):
        self.a = a
        self.path = os.path.join(a.dir, f"client{a.client}.dat")
        self.small = os.path.join(a.dir, f"small{a.client}")
        self.buf = None
        self.digest = None
        self.got = None

    def prepare(self) -> dict:
        t0 = now()
        self.buf = build(self.a.size, self.a.client, self.a.nonce)
        self.digest = hashlib.sha256(self.buf).hexdigest()
        return {"phase": "prepare", "t0": t0, "t1": now(), "sha256": self.digest}

    def write(self) -> dict:
        mv = memoryview(self.buf)
        size = len(self.buf)
        t0 = now()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        off = 0
        try:
            while off < size:
                n = os.write(fd, mv[off:off + BLOCK])
                if n <= 0:
                    raise OSError(f"write returned {n} at offset {off}")
                off += n
            os.fsync(fd)      # the data is on the chunk servers
        finally:
            os.close(fd)
        t1 = now()
        return {"phase": "write", "t0": t0, "t1": t1, "bytes": off, "sha256": self.digest}

    def poison(self) -> dict:
        t0 = now()
        addr = ctypes.addressof(ctypes.c_char.from_buffer(self.buf))
        ctypes.memset(addr, 0xA5, len(self.buf))
        self.got = None
        return {"phase": "poison", "t0": t0, "t1": now()}

    def read(self) -> dict:
        size = len(self.buf)
        mv = memoryview(self.buf)
        t0 = now()
        fd = os.open(self.path, os.O_RDONLY)
        off = 0
        try:
            while off < size:
                n = os.readv(fd, [mv[off:off + BLOCK]])
                if n == 0:
                    break
                off += n
            extra = os.read(fd, 1)                   # must be at EOF now
        finally:
            os.close(fd)
        self.got = (off, extra == b"")
        return {"phase": "read", "t0": t0, "t1": now(), "bytes": off, "eof": extra == b""}

    def verify(self) -> dict:
        t0 = now()
        got = hashlib.sha256(self.buf).hexdigest()
        off, eof = self.got or (0, False)
        return {"phase": "verify", "t0": t0, "t1": now(), "bytes": off, "eof": eof,
                "sha256": got, "sha256_written": self.digest,
                "ok": got == self.digest and off == len(self.buf) and eof}

    def create(self) -> dict:
        os.makedirs(self.small, exist_ok=True)
        t0 = now()
        for i in range(self.a.files):
            fd = os.open(os.path.join(self.small, f"f{i}"),
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.close(fd)
        return {"phase": "create", "t0": t0, "t1": now(), "files": self.a.files}

    def stat(self) -> dict:
        t0 = now()
        n = 0
        for i in range(self.a.files):
            st = os.stat(os.path.join(self.small, f"f{i}"))
            n += st.st_size == 0
        return {"phase": "stat", "t0": t0, "t1": now(), "files": self.a.files,
                "ok": n == self.a.files}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--client", type=int, required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--files", type=int, required=True)
    ap.add_argument("--nonce", type=int, required=True)
    a = ap.parse_args()
    w = Worker(a)
    print(json.dumps({"phase": "started", "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "quit":
            break
        fn = getattr(w, cmd, None) if cmd in ("prepare", "write", "poison", "read",
                                              "verify", "create", "stat") else None
        if fn is None:
            out = {"phase": cmd, "error": "unknown command"}
        else:
            try:
                out = fn()
            except OSError as e:
                out = {"phase": cmd, "error": f"{type(e).__name__}: {e}"}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
