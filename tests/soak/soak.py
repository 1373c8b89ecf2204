#!/usr/bin/env python3
"""Soak: many concurrent SDP connections moving gigabytes both ways, every
byte checked. Not part of `make test` (see docs/TESTING.md); `make soak`
runs it with the defaults below, then the fault campaign.

    python3 tests/soak/soak.py [--conns 100] [--gb 10] [--burners 2]
                               [--clients 4] [--workers 2] [--tcp] [--json F]

A pre-forked server (--workers processes accepting on one listener) and
--clients client processes, all under `sdp run` (--tcp: plain kernel TCP,
the oracle), open --conns connections at once. Each connection moves about
--gb / --conns GB (total of both directions, 0.5x-1.5x at random) in both
directions at the same time, in one of three ways:

  block   blocking sockets, a reader and a writer thread per connection
  nbio    non-blocking sockets driven by one epoll loop per process
  zc      blocking, large writes and reads, with the socket's zero-copy
          threshold (SDP_ZCOPY_THRESH option) set low so that Read and
          Write Zero Copy carry most bytes; the client processes run with
          different SDP_ZCOPY_THRESH environments (auto, 0, 16384, 262144)

Writes and reads have random sizes from 1 B to 1 MiB (log-uniform). The
byte at stream position p of a direction is POOL[(p + k) % len(POOL)], k
per connection and direction: every chunk received is compared with what
must be there (mismatching bytes = corrupted), the stream ends with the
sender's SHA-256 of everything it sent and a FIN; the receiver compares the
digest with its own, counts bytes missing at the FIN (lost) and bytes after
the announced length (duplicated). A connection that makes no progress for
--stall seconds is a hang. --burners N runs N busy loops meanwhile.

Prints one JSON report; exits 1 unless lost = duplicated = corrupted =
hangs = errors = 0 and every connection was on SDP (SDP_TRANSPORT).
"""
import argparse
import hashlib
import json
import math
import os
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDP_BIN = Path(os.environ.get("SDP_BUILD_DIR", ROOT / "build")) / "bin" / "sdp"

SDP_TRANSPORT, SDP_ZCOPY_THRESH, SDP_STATS = 0x5D00, 0x5D01, 0x5D02
STATS = struct.Struct("=12Q4I")
HDR = struct.Struct("!4sIIQQQQi")      # magic id mode c2s s2c k_c2s k_s2c thresh
MAGIC = b"SOAK"
MODES = ("block", "nbio", "zc")
MAX_IO = 1 << 20
POOL_LEN = (2 << 20) + 7
POOL = random.Random(20261124).randbytes(POOL_LEN)
POOLB = POOL + POOL[:MAX_IO]             # any slice of <= 1 MiB is contiguous
POOL2 = memoryview(POOLB)


def io_size(rng, lo=1, hi=MAX_IO):
    return max(lo, min(hi, int(2 ** rng.uniform(math.log2(lo), math.log2(hi)))))


def expect(k, pos, n):
    o = (pos + k) % POOL_LEN
    return POOL2[o:o + n]


class Dir:
    """One direction of one connection, as seen by this process."""

    def __init__(self, length, k):
        self.length, self.k = length, k
        self.pos = 0
        self.sha = hashlib.sha256()
        self.extra = 0                  # bytes after the announced length
        self.corrupt = 0
        self.digest_ok = None
        self.done = False
        self.err = None
        self.tail = bytearray()         # the 32-byte digest as it arrives


class Conn:
    def __init__(self, cid, mode, sock, tx, rx, thresh, rng):
        self.id, self.mode, self.sock = cid, mode, sock
        self.tx, self.rx, self.thresh = tx, rx, thresh
        self.rng = rng
        self.last = time.monotonic()
        self.transport = None
        self.stats = None
        self.lock = threading.Lock()


def note_progress(c):
    c.last = time.monotonic()


def check_chunk(c, buf):
    """Account received bytes buf of direction c.rx."""
    d = c.rx
    n = len(buf)
    i = 0
    if d.pos < d.length:
        k = min(n, d.length - d.pos)
        o = (d.pos + d.k) % POOL_LEN
        exp = POOLB[o:o + k]
        part = buf[:k]
        if bytes(part) != exp:          # (bytes compare: memcmp)
            d.corrupt += sum(1 for a, b in zip(bytes(part), exp) if a != b)
        d.sha.update(part)
        d.pos += k
        i = k
    if i < n and len(d.tail) < 32:
        k = min(n - i, 32 - len(d.tail))
        d.tail += bytes(buf[i:i + k])
        i += k
        if len(d.tail) == 32:
            d.digest_ok = bytes(d.tail) == d.sha.digest()
    d.extra += n - i
    note_progress(c)


def writer_chunks(c):
    """(memoryview) chunks of direction c.tx, then the digest."""
    d = c.tx
    zc = c.mode == "zc"
    while d.pos < d.length:
        n = io_size(c.rng, 65536 if zc else 1)
        n = min(n, d.length - d.pos)
        mv = expect(d.k, d.pos, n)
        d.sha.update(mv)
        d.pos += n
        yield mv
    yield memoryview(d.sha.digest())


def blocking_writer(c):
    try:
        for mv in writer_chunks(c):
            c.sock.sendall(mv)
            note_progress(c)
        c.sock.shutdown(socket.SHUT_WR)
        c.tx.done = True
    except OSError as e:
        c.tx.err = "send: %s" % e


def blocking_reader(c):
    buf = bytearray(MAX_IO)
    mv = memoryview(buf)
    try:
        while True:
            n = io_size(c.rng, 65536 if c.mode == "zc" else 1)
            flags = socket.MSG_WAITALL if c.mode == "zc" and c.rng.random() < 0.3 else 0
            left = c.rx.length + 32 - c.rx.pos - len(c.rx.tail)
            if flags and left > 0:
                n = min(n, left)
            k = c.sock.recv_into(mv[:n], n, flags)
            if k == 0:
                break
            check_chunk(c, mv[:k])
        c.rx.done = True
    except OSError as e:
        c.rx.err = "recv: %s" % e


def finish(c):
    try:
        c.transport = c.sock.getsockopt(socket.IPPROTO_TCP, SDP_TRANSPORT)
    except OSError:
        c.transport = 0
    try:
        c.stats = STATS.unpack(c.sock.getsockopt(socket.IPPROTO_TCP, SDP_STATS, STATS.size))
    except OSError:
        c.stats = None


def set_thresh(c):
    if c.thresh >= 0:
        try:
            c.sock.setsockopt(socket.IPPROTO_TCP, SDP_ZCOPY_THRESH, c.thresh)
        except OSError:
            pass


class Loop:
    """One epoll loop for the non-blocking connections of this process."""

    def __init__(self):
        self.ep = select.epoll()
        self.conns = {}
        self.lock = threading.Lock()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        self.ep.register(self.wake_r, select.EPOLLIN)
        self.buf = bytearray(MAX_IO)
        threading.Thread(target=self.run, daemon=True).start()

    def add(self, c):
        c.sock.setblocking(False)
        c.wgen = writer_chunks(c)
        c.wcur = None
        c.woff = 0
        with self.lock:
            self.conns[c.sock.fileno()] = c
            self.ep.register(c.sock.fileno(), select.EPOLLIN | select.EPOLLOUT)
        os.write(self.wake_w, b"x")

    def drop(self, c):
        with self.lock:
            self.conns.pop(c.sock.fileno(), None)
            self.ep.unregister(c.sock.fileno())
        finish(c)
        c.finished.set()

    def on_write(self, c):
        d = c.tx
        try:
            while True:
                if c.wcur is None:
                    c.wcur = next(c.wgen, None)
                    c.woff = 0
                    if c.wcur is None:
                        c.sock.shutdown(socket.SHUT_WR)
                        d.done = True
                        return False
                n = c.sock.send(c.wcur[c.woff:])
                c.woff += n
                note_progress(c)
                if c.woff == len(c.wcur):
                    c.wcur = None
        except BlockingIOError:
            return True
        except OSError as e:
            d.err = "send: %s" % e
            return False

    def on_read(self, c):
        mv = memoryview(self.buf)
        try:
            while True:
                n = io_size(c.rng)
                k = c.sock.recv_into(mv[:n], n)
                if k == 0:
                    c.rx.done = True
                    return False
                check_chunk(c, mv[:k])
        except BlockingIOError:
            return True
        except OSError as e:
            c.rx.err = "recv: %s" % e
            return False

    def run(self):
        while True:
            for fd, ev in self.ep.poll(1.0):
                if fd == self.wake_r:
                    try:
                        os.read(self.wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                c = self.conns.get(fd)
                if c is None:
                    continue
                if ev & (select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP) and not (
                        c.rx.done or c.rx.err):
                    self.on_read(c)
                if ev & (select.EPOLLOUT | select.EPOLLERR) and not (c.tx.done or c.tx.err):
                    if not self.on_write(c):
                        pass
                wr = not (c.tx.done or c.tx.err)
                rd = not (c.rx.done or c.rx.err)
                if not wr and not rd:
                    self.drop(c)
                else:
                    self.ep.modify(fd, (select.EPOLLIN if rd else 0) |
                                   (select.EPOLLOUT if wr else 0))


LOOP = None


def serve_conn(c):
    global LOOP
    set_thresh(c)
    c.finished = threading.Event()
    if c.mode == "nbio":
        LOOP.add(c)
        return
    w = threading.Thread(target=blocking_writer, args=(c,), daemon=True)
    r = threading.Thread(target=blocking_reader, args=(c,), daemon=True)
    w.start()
    r.start()

    def join():
        w.join()
        r.join()
        finish(c)
        c.finished.set()
    threading.Thread(target=join, daemon=True).start()


def conn_report(c, stall):
    st = c.stats
    hung = not c.finished.is_set() and time.monotonic() - c.last > stall
    return {
        "id": c.id, "mode": c.mode, "thresh": c.thresh, "transport": c.transport,
        "tx": c.tx.length, "rx": c.rx.length, "rx_got": c.rx.pos,
        "lost": max(0, c.rx.length - c.rx.pos), "dup": c.rx.extra,
        "corrupt": c.rx.corrupt, "digest_ok": c.rx.digest_ok,
        "err": c.tx.err or c.rx.err, "hung": hung, "done": c.finished.is_set(),
        "zc_tx": (st[5] + st[6]) if st else 0, "bcopy_tx": st[4] if st else 0,
    }


def wait_all(conns, stall, deadline):
    while True:
        pending = [c for c in conns if not c.finished.is_set()]
        if not pending:
            return
        now = time.monotonic()
        if now > deadline or all(now - c.last > stall for c in pending):
            return
        time.sleep(0.5)


def emit(conns, stall):
    out = [conn_report(c, stall) for c in conns]
    sys.stdout.write(json.dumps({"pid": os.getpid(), "conns": out}) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------- server

def server_main(port, nconns, stall, workers):
    global LOOP
    import multiprocessing
    accepted = multiprocessing.Value("i", 0)   # shared by the workers
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(1024)
    kids = []
    for _ in range(workers - 1):
        pid = os.fork()
        if pid == 0:
            kids = None
            break
        kids.append(pid)
    LOOP = Loop()
    conns = []
    ls.settimeout(5.0)
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        try:
            s, _ = ls.accept()
        except socket.timeout:
            if accepted.value < nconns:
                continue
            if all(c.finished.is_set() for c in conns):
                break
            if all(time.monotonic() - c.last > stall for c in conns
                   if not c.finished.is_set()):
                break
            continue
        s.settimeout(None)
        hdr = bytearray()
        while len(hdr) < HDR.size:
            b = s.recv(HDR.size - len(hdr))
            if not b:
                break
            hdr += b
        if len(hdr) < HDR.size:
            s.close()
            continue
        magic, cid, mode, c2s, s2c, k_c2s, k_s2c, thresh = HDR.unpack(bytes(hdr))
        c = Conn(cid, MODES[mode], s, Dir(s2c, k_s2c), Dir(c2s, k_c2s), thresh,
                 random.Random(cid * 7919 + 1))
        with accepted.get_lock():
            accepted.value += 1
        conns.append(c)
        serve_conn(c)
    wait_all(conns, stall, time.monotonic() + 60)
    emit(conns, stall)
    if kids:
        for p in kids:
            os.waitpid(p, 0)
    os._exit(0)


# ---------------------------------------------------------------- client

def client_main(port, spec, stall):
    global LOOP
    LOOP = Loop()
    conns = []
    for cid, mode, c2s, s2c, thresh in json.loads(spec):
        rng = random.Random(cid * 104729 + 3)
        k_c2s, k_s2c = rng.randrange(POOL_LEN), rng.randrange(POOL_LEN)
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(HDR.pack(MAGIC, cid, MODES.index(mode), c2s, s2c, k_c2s, k_s2c, thresh))
        conns.append(Conn(cid, mode, s, Dir(c2s, k_c2s), Dir(s2c, k_s2c), thresh, rng))
    print("connected %d" % len(conns), flush=True)
    sys.stdin.readline()                 # the driver says go
    for c in conns:
        serve_conn(c)
    wait_all(conns, stall, time.monotonic() + 3600)
    emit(conns, stall)
    os._exit(0)


# ---------------------------------------------------------------- driver

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def cpu_seconds(pid):
    try:
        f = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def driver(a):
    port = free_port()
    wrap = [] if a.tcp else [str(SDP_BIN), "run", "--"]
    me = [sys.executable, str(Path(__file__).resolve())]
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    rng = random.Random(a.seed)
    per = a.gb * 1e9 / a.conns
    specs = [[] for _ in range(a.clients)]
    zc_thr = [16384, 65536, 262144]
    tots = [per * rng.uniform(0.5, 1.5) for _ in range(a.conns)]
    scale = a.gb * 1e9 / sum(tots)              # exactly --gb in all
    for i in range(a.conns):
        mode = MODES[i % 3]
        tot = tots[i] * scale
        share = rng.uniform(0.25, 0.75)
        thresh = rng.choice(zc_thr) if mode == "zc" else rng.choice([-1, -1, 0, 65536])
        specs[i % a.clients].append([i + 1, mode, math.ceil(tot * share),
                                     math.ceil(tot * (1 - share)), thresh])
    envs = [{}, {"SDP_ZCOPY_THRESH": "0"}, {"SDP_ZCOPY_THRESH": "16384"},
            {"SDP_ZCOPY_THRESH": "262144"}]
    logdir = Path(a.logdir or "/tmp")
    srv = subprocess.Popen(wrap + me + ["server", str(port), str(a.conns), str(a.stall),
                                        str(a.workers)],
                           env=env, stdout=subprocess.PIPE, stderr=open(logdir / "soak-server.err", "wb"),
                           text=True, start_new_session=True)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.05)
    # that probe was a connection without a header: the server drops it
    clients = []
    for i, spec in enumerate(specs):
        e = dict(env)
        e.update(envs[i % len(envs)] if not a.tcp else {})
        p = subprocess.Popen(wrap + me + ["client", str(port), json.dumps(spec), str(a.stall)],
                             env=e, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=open(logdir / ("soak-client%d.err" % i), "wb"),
                             text=True, start_new_session=True)
        clients.append(p)
    for p in clients:
        line = p.stdout.readline()
        if not line.startswith("connected"):
            sys.exit("client failed to connect: %r" % line)
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                start_new_session=True) for _ in range(a.burners)]
    t0 = time.monotonic()
    for p in clients:
        p.stdin.write("go\n")
        p.stdin.flush()
    got = {"cli": [], "srv": []}
    deadline = t0 + a.max_seconds
    secs = None
    for p in clients + [srv]:
        if p is srv:
            secs = time.monotonic() - t0      # the clients verified everything
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()) + 120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        for line in out.splitlines():
            if line.startswith("{"):
                got["srv" if p is srv else "cli"] += json.loads(line)["conns"]
    for b in burners:
        b.kill()
        b.wait()
    cli, srvc = got["cli"], got["srv"]
    allc = cli + srvc
    moved = sum(c["rx_got"] for c in allc)
    res = {
        "mode": "tcp" if a.tcp else "sdp", "connections": a.conns,
        "client_conns_reported": len(cli), "server_conns_reported": len(srvc),
        "bytes_verified": moved, "seconds": round(secs, 1),
        "gbytes_per_s": round(moved / secs / 1e9, 2) if secs else 0,
        "burners": a.burners,
        "lost": sum(c["lost"] for c in allc), "duplicated": sum(c["dup"] for c in allc),
        "corrupted": sum(c["corrupt"] for c in allc),
        "digest_mismatch": sum(1 for c in allc if c["digest_ok"] is False),
        "hangs": sum(1 for c in allc if c["hung"] or not c["done"]) +
                 (a.conns - len(cli)) + (a.conns - len(srvc)),
        "errors": [c for c in allc if c["err"]][:5],
        "n_errors": sum(1 for c in allc if c["err"]),
        "not_sdp": 0 if a.tcp else sum(1 for c in allc if c["transport"] != 1),
        "zero_copy_bytes_sent": sum(c["zc_tx"] for c in allc),
        "bcopy_bytes_sent": sum(c["bcopy_tx"] for c in allc),
        "by_mode": {m: sum(1 for c in cli if c["mode"] == m) for m in MODES},
    }
    ok = (res["lost"] == res["duplicated"] == res["corrupted"] == res["digest_mismatch"] ==
          res["hangs"] == res["n_errors"] == res["not_sdp"] == 0 and
          len(cli) == a.conns and len(srvc) == a.conns)
    res["ok"] = ok
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if ok else 1


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "server":
        return server_main(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]),
                           int(sys.argv[5]))
    if len(sys.argv) > 1 and sys.argv[1] == "client":
        return client_main(int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--conns", type=int, default=100)
    ap.add_argument("--gb", type=float, default=10.0, help="total GB, both directions")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2, help="pre-forked server processes")
    ap.add_argument("--burners", type=int, default=0)
    ap.add_argument("--stall", type=float, default=60.0, help="seconds without progress = hang")
    ap.add_argument("--max-seconds", type=float, default=3600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tcp", action="store_true", help="plain kernel TCP (the oracle)")
    ap.add_argument("--json", help="also write the report here")
    ap.add_argument("--logdir", help="stderr of the processes (default /tmp)")
    return driver(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
