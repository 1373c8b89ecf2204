#!/usr/bin/env python3
"""Fault campaign: SIGKILL one end of an SDP connection at a random moment,
SIGSTOP one end for seconds. Part of `make soak` (300 trials); a short run
is in `make test` (tests/soak/test_faults.py). docs/TESTING.md.

    python3 tests/soak/faults.py [--trials 300] [--stop-seconds 3] [--tcp]
                                 [--seed N] [--json FILE]

SIGKILL trials: a server and a client process, both under `sdp run`, in one
of five phases; the victim (server or client, at random) is killed at a
random moment, and the survivor must see the end of its connection - EOF,
ECONNRESET or EPIPE (a client may also see ECONNREFUSED, a server an empty
accept queue) - within 1 s. Everything it received before must be exactly
what was sent (a prefix of the stream). Phases:

  setup     connection churn: connect, 1 byte each way, close
  bcopy     both directions stream at once, writes of 1 B - 64 KiB
  zcopy     both directions stream 1 MiB blocking writes, SDP_ZCOPY_THRESH=16384
  close     churn of 64 KiB exchanges ending in close (orderly or with
            unread data: RST)
  handback  the client streams, the server echoes; after a random moment
            the server execs itself with the socket on fd 3 (the
            connection is handed back to TCP) and goes on echoing

A survivor that has not seen the end after 5 s is a hang (its kernel wait
channel is recorded). SIGSTOP trials: a stream of 256 MiB each way; after
0.3 s one end is stopped for --stop-seconds; the other end's CPU time
meanwhile is measured; then the stream must complete, verified.

Prints a JSON report; exits 1 on any hang, late end, corrupted byte, or a
SIGSTOP survivor that used more than 10% of a CPU while it waited.
"""
import argparse
import hashlib
import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDP_BIN = Path(os.environ.get("SDP_BUILD_DIR", ROOT / "build")) / "bin" / "sdp"
ME = str(Path(__file__).resolve())
PHASES = ("setup", "bcopy", "zcopy", "close", "handback")
POOL_LEN = (1 << 20) + 7
POOL = random.Random(77).randbytes(POOL_LEN)
POOLB = POOL + POOL[:1 << 20]
END_ERRORS = (ConnectionResetError, BrokenPipeError, ConnectionRefusedError,
              ConnectionAbortedError)


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def now():
    return time.monotonic()


class Stream:
    """One direction's pattern: position and verification."""

    def __init__(self, k):
        self.k, self.pos, self.bad = k, 0, 0

    def chunk(self, n):
        o = (self.pos + self.k) % POOL_LEN
        self.pos += n
        return memoryview(POOLB)[o:o + n]

    def check(self, data):
        o = (self.pos + self.k) % POOL_LEN
        n = len(data)
        while n:
            m = min(n, 1 << 20)
            if bytes(data[:m]) != POOLB[o:o + m]:
                self.bad += 1
                if self.bad == 1:
                    got, exp = bytes(data[:m]), POOLB[o:o + m]
                    i = next(j for j in range(m) if got[j] != exp[j])
                    # where the stream went wrong: the bytes there, and
                    # whether they are the expected ones from elsewhere
                    self.first_bad = "pos %d len %d got %s exp %s shift %s" % (
                        self.pos + i, m, got[i:i + 8].hex(), exp[i:i + 8].hex(),
                        next((d for d in range(-65536, 65537)
                              if POOLB[(o + i + d) % POOL_LEN:(o + i + d) % POOL_LEN + 8]
                              == got[i:i + 8]), None))
            data, n, o = data[m:], n - m, (o + m) % POOL_LEN
            self.pos += m


# ------------------------------------------------------------ endpoints

def end(kind):
    say("end", kind, "%.6f" % now())


def stream_both(s, sizes, k_tx, k_rx, total=None):
    """Stream both ways on s until the end (or total bytes each way).
    Returns (tx Stream, rx Stream, how it ended)."""
    tx, rx = Stream(k_tx), Stream(k_rx)
    res = {}
    rng = random.Random(k_tx)

    def writer():
        try:
            while total is None or tx.pos < total:
                n = rng.randint(*sizes)
                if total is not None:
                    n = min(n, total - tx.pos)
                s.sendall(tx.chunk(n))
            s.shutdown(socket.SHUT_WR)
        except END_ERRORS as e:
            res.setdefault("end", type(e).__name__)
        except OSError as e:
            res.setdefault("end", "OSError:%d" % e.errno)
    w = threading.Thread(target=writer, daemon=True)
    w.start()
    buf = bytearray(1 << 20)
    mv = memoryview(buf)
    try:
        while True:
            n = s.recv_into(mv, random.randint(*sizes))
            if n == 0:
                res.setdefault("end", "EOF")
                break
            rx.check(mv[:n])
    except END_ERRORS as e:
        res.setdefault("end", type(e).__name__)
    except OSError as e:
        res.setdefault("end", "OSError:%d" % e.errno)
    if total is not None:
        w.join()
    return tx, rx, res.get("end")


def ep_server(port, phase, seed):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(64)
    say("listening")
    if phase in ("setup", "close"):
        ls.settimeout(0.3)
        first = True
        while True:
            try:
                s, _ = ls.accept()
            except socket.timeout:
                if not first:
                    end("idle")
                    return
                continue
            if first:
                say("ready")
                first = False
            s.settimeout(None)
            n = 1 if phase == "setup" else 65536
            try:
                got = bytearray()
                while len(got) < n:
                    b = s.recv(n - len(got))
                    if not b:
                        end("EOF")
                        return
                    got += b
                s.sendall(bytes(got))
                if phase == "close" and random.random() < 0.5:
                    s.recv(1)          # the client closes first
            except END_ERRORS as e:
                end(type(e).__name__)
                return
            s.close()
    s, _ = ls.accept()
    ls.close()
    say("ready")
    if phase == "handback":
        handback_echo(s.fileno(), seed, 0)
        return
    sizes = (1, 65536) if phase == "bcopy" else (1 << 20, 1 << 20)
    tx, rx, how = stream_both(s, sizes, seed * 2 + 1, seed * 2)
    if rx.bad:
        say("corrupt", rx.bad, rx.first_bad.replace(" ", "_"))
    end(how)


def handback_echo(fd, seed, echoed):
    """Echo on fd; after a random number of bytes (first image only), exec
    this script again with the socket on fd 3: the hand-back to TCP."""
    s = socket.socket(fileno=fd)
    rng = random.Random(seed)
    limit = rng.randint(1, 4 << 20) if echoed == 0 else None
    try:
        while True:
            b = s.recv(65536)
            if not b:
                end("EOF")
                return
            s.sendall(b)
            echoed += len(b)
            if limit is not None and echoed >= limit:
                os.dup2(fd, 3, inheritable=True)
                say("exec")
                os.execv(sys.executable, [sys.executable, ME, "echo3", str(seed), str(echoed)])
    except END_ERRORS as e:
        end(type(e).__name__)


def ep_client(port, phase, seed):
    if phase in ("setup", "close"):
        first = True
        while True:
            try:
                s = socket.create_connection(("127.0.0.1", port))
            except END_ERRORS as e:
                end(type(e).__name__)
                return
            if first:
                say("ready")
                first = False
            n = 1 if phase == "setup" else 65536
            try:
                s.sendall(b"x" * n)
                got = 0
                while got < n:
                    b = s.recv(n - got)
                    if not b:
                        end("EOF")
                        return
                    got += len(b)
            except END_ERRORS as e:
                end(type(e).__name__)
                return
            if phase == "close" and random.random() < 0.3:
                s.send(b"unread")      # close with data the peer never reads
            s.close()
    s = socket.create_connection(("127.0.0.1", port))
    say("ready")
    if phase == "handback":
        # stream out, verify the echo
        tx, rx, how = stream_both(s, (1, 65536), seed * 2 + 1, seed * 2 + 1)
    else:
        sizes = (1, 65536) if phase == "bcopy" else (1 << 20, 1 << 20)
        tx, rx, how = stream_both(s, sizes, seed * 2, seed * 2 + 1)
    if rx.bad:
        say("corrupt", rx.bad, rx.first_bad.replace(" ", "_"))
    end(how)


def ep_stopper(role, port, seed, total):
    """SIGSTOP trials: stream `total` bytes both ways, verify, report."""
    if role == "server":
        ls = socket.socket()
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("127.0.0.1", port))
        ls.listen(1)
        say("listening")
        s, _ = ls.accept()
        k_tx, k_rx = seed * 2 + 1, seed * 2
    else:
        s = socket.create_connection(("127.0.0.1", port))
        k_tx, k_rx = seed * 2, seed * 2 + 1
    say("ready")
    tx, rx, how = stream_both(s, (1, 1 << 20), k_tx, k_rx, total)
    ok = how == "EOF" and rx.pos == total and rx.bad == 0
    say("done", "ok" if ok else "bad", rx.pos, rx.bad, how)


# ------------------------------------------------------------ driver

class Proc:
    def __init__(self, argv, env):
        self.p = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                                  text=True, start_new_session=True)
        self.q = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.p.stdout:
            self.q.put(line.split())
        self.q.put(None)

    def wait_for(self, word, timeout):
        end_t = now() + timeout
        while True:
            try:
                ev = self.q.get(timeout=max(0.001, end_t - now()))
            except queue.Empty:
                return None
            if ev is None:
                return None
            if ev[0] == "corrupt":
                self.corrupt = int(ev[1])
                self.corrupt_at = ev[2] if len(ev) > 2 else ""
            if ev[0] == "exec":
                self.execed = True
            if ev[0] == "image":
                self.image_t = float(ev[1])
            if ev[0] == word:
                return ev

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wchan(pid):
    try:
        return Path("/proc/%d/wchan" % pid).read_text() + " " + \
            Path("/proc/%d/syscall" % pid).read_text().split()[0]
    except OSError:
        return "?"


def cpu_seconds(pid):
    try:
        f = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return 0.0


def kill_trial(a, rng, i, env, wrap):
    phase = a.phase or PHASES[i % len(PHASES)]
    victim = a.victim or rng.choice(("server", "client"))
    seed = rng.randrange(1 << 30)
    port = free_port()
    e = dict(env)
    if phase == "zcopy" and not a.tcp:
        e["SDP_ZCOPY_THRESH"] = "16384"
    srv = Proc(wrap + [sys.executable, ME, "ep", "server", str(port), phase, str(seed)], e)
    r = {"phase": phase, "victim": victim}
    try:
        if not srv.wait_for("listening", 10):
            r["error"] = "server did not start"
            return r
        cli = Proc(wrap + [sys.executable, ME, "ep", "client", str(port), phase, str(seed)], e)
        try:
            if not cli.wait_for("ready", 10) or not srv.wait_for("ready", 10):
                r["error"] = "no connection"
                return r
            lo, hi = (0.0, 0.3) if phase in ("setup", "close") else (0.02, 0.4)
            if phase == "handback" and rng.random() < 0.6:
                # right into the hand-back: just after the server starts it
                srv.wait_for("exec", 3.0)
                lo, hi = 0.0, a.handback_window
            time.sleep(rng.uniform(lo, hi))
            v, s = (srv, cli) if victim == "server" else (cli, srv)
            t_kill = now()
            os.kill(v.p.pid, signal.SIGKILL)
            ev = s.wait_for("end", 5.0)
            if ev is None:
                r["hang"] = True
                r["wchan"] = wchan(s.p.pid)
            else:
                r["end"] = ev[1]
                r["latency"] = round(float(ev[2]) - t_kill, 4)
                if getattr(s, "image_t", 0) > t_kill:
                    # the survivor exec'd after the kill: how much of the
                    # latency is the new image starting
                    r["image_start"] = round(s.image_t - t_kill, 4)
            r["corrupt"] = getattr(s, "corrupt", 0)
            if r["corrupt"]:
                r["corrupt_at"] = getattr(s, "corrupt_at", "")
            if phase == "handback":
                if not getattr(srv, "execed", False):
                    srv.wait_for("exec", 0.01)
                r["after_exec"] = getattr(srv, "execed", False)
        finally:
            cli.kill()
    finally:
        srv.kill()
    return r


def stop_trial(a, victim, zc, env, wrap, total=256 << 20):
    port = free_port()
    e = dict(env)
    if zc and not a.tcp:
        e["SDP_ZCOPY_THRESH"] = "16384"
    srv = Proc(wrap + [sys.executable, ME, "stopper", "server", str(port), "5", str(total)], e)
    r = {"victim": victim, "zcopy": zc, "stop_s": a.stop_seconds}
    try:
        srv.wait_for("listening", 10)
        cli = Proc(wrap + [sys.executable, ME, "stopper", "client", str(port), "5", str(total)], e)
        try:
            srv.wait_for("ready", 10)
            cli.wait_for("ready", 10)
            time.sleep(0.3)
            v, s = (srv, cli) if victim == "server" else (cli, srv)
            os.kill(v.p.pid, signal.SIGSTOP)
            time.sleep(0.2)                  # let the survivor run into the wall
            c0 = cpu_seconds(s.p.pid)
            time.sleep(a.stop_seconds)
            c1 = cpu_seconds(s.p.pid)
            os.kill(v.p.pid, signal.SIGCONT)
            r["survivor_cpu_s"] = round(c1 - c0, 3)
            r["survivor_cpu_pct"] = round(100 * (c1 - c0) / a.stop_seconds, 1)
            d1, d2 = srv.wait_for("done", 120), cli.wait_for("done", 120)
            r["resumed_intact"] = bool(d1 and d2 and d1[1] == "ok" and d2[1] == "ok")
            if not r["resumed_intact"]:
                r["detail"] = [d1, d2]
        finally:
            cli.kill()
    finally:
        srv.kill()
    return r


def driver(a):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    wrap = [] if a.tcp else [str(SDP_BIN), "run", "--"]
    rng = random.Random(a.seed)
    trials = []
    t0 = now()
    for i in range(a.trials):
        trials.append(kill_trial(a, rng, i, env, wrap))
        if a.verbose:
            print(json.dumps(trials[-1]), file=sys.stderr)
    stops = []
    if a.stop_seconds > 0:
        for victim in ("server", "client"):
            for zc in (False, True):
                stops.append(stop_trial(a, victim, zc, env, wrap))
    # "idle": a server whose client died between connections; its accept
    # timed out (0.3 s): not a connection end, not counted in the latency
    lat = sorted(t["latency"] for t in trials if "latency" in t and t["end"] != "idle")
    hangs = [t for t in trials if t.get("hang")]
    late = [t for t in trials if t.get("latency", 0) > 1.0]
    errs = [t for t in trials if "error" in t]
    bad = sum(t.get("corrupt", 0) for t in trials)
    by_phase = {}
    for t in trials:
        p = by_phase.setdefault("%s/%s" % (t["phase"], t["victim"]),
                                {"n": 0, "hang": 0, "max_ms": 0})
        p["n"] += 1
        p["hang"] += bool(t.get("hang"))
        if "latency" in t and t["end"] != "idle":
            p["max_ms"] = max(p["max_ms"], round(1000 * t["latency"], 1))
            if t["latency"] > 0.3:
                p.setdefault("slow", []).append(
                    {k: t[k] for k in ("latency", "end", "image_start") if k in t})
    ends = {}
    for t in trials:
        if "end" in t:
            ends[t["end"]] = ends.get(t["end"], 0) + 1
    stop_bad = [s for s in stops if not s["resumed_intact"] or s["survivor_cpu_pct"] > 10]
    res = {
        "mode": "tcp" if a.tcp else "sdp", "kill_trials": len(trials),
        "seconds": round(now() - t0, 1),
        "hangs": len(hangs), "late_over_1s": len(late), "setup_errors": len(errs),
        "corrupted_chunks": bad,
        "latency_ms": {"median": round(1000 * lat[len(lat) // 2], 1) if lat else None,
                       "p99": round(1000 * lat[int(len(lat) * 0.99)], 1) if lat else None,
                       "max": round(1000 * lat[-1], 1) if lat else None},
        "survivor_saw": ends, "by_phase_victim": by_phase,
        "handback_killed_after_exec": sum(1 for t in trials if t.get("after_exec")),
        "hang_detail": hangs[:10], "error_detail": errs[:5],
        "corrupt_detail": [t for t in trials if t.get("corrupt")][:10],
        "sigstop": stops,
    }
    res["ok"] = not hangs and not late and not errs and bad == 0 and not stop_bad
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["ok"] else 1


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "ep":
        role, port, phase, seed = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
        (ep_server if role == "server" else ep_client)(port, phase, seed)
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "echo3":
        say("image", "%.6f" % now())       # the exec'd image runs
        handback_echo(3, int(sys.argv[2]), int(sys.argv[3]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "stopper":
        ep_stopper(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--stop-seconds", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tcp", action="store_true", help="plain kernel TCP (the oracle)")
    ap.add_argument("--phase", choices=PHASES, help="only this phase")
    ap.add_argument("--victim", choices=("server", "client"), help="always kill this end")
    ap.add_argument("--handback-window", type=float, default=0.03,
                    help="aimed hand-back kills land this many seconds after the exec starts")
    ap.add_argument("--json")
    ap.add_argument("-v", "--verbose", action="store_true")
    return driver(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
