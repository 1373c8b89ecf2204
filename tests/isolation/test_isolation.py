"""Isolation between users, as an attacker would try it: a root SDP
connection (server and client under `sdp run`, streaming) and a process
running as `nobody` (attacker.py) that tries to reach it:

* the pair's file descriptors (/proc/PID/fd: list, open, readlink), among
  them the connection's memfds and the pool;
* its memory: /proc/PID/map_files of the shared mappings, /proc/PID/mem,
  process_vm_readv, ptrace;
* names in /dev/shm;
* the rendezvous: well-formed hellos naming its own TCP connections (plain,
  pooled, "returned" with a guessed secret) and a flood of 4,097 more.

Every access must be refused; each forged connection must stay TCP on the
server's side and still work; afterwards a new root client still gets SDP
and the pair's stream is intact. Needs root (the pair) and a nobody user.
"""
import json
import os
import pwd
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("SDP_BUILD_DIR", ROOT / "build"))
SDP = BUILD / "bin" / "sdp"


class P:
    def __init__(self, argv, env, stdin=None, stderr=subprocess.DEVNULL):
        self.p = subprocess.Popen(argv, env=env, stdin=stdin, stdout=subprocess.PIPE,
                                  stderr=stderr, text=True, start_new_session=True)
        self.q = queue.Queue()
        threading.Thread(target=lambda: [self.q.put(l.split()) for l in self.p.stdout],
                         daemon=True).start()

    def line(self, word, timeout=10):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                ev = self.q.get(timeout=0.1)
            except queue.Empty:
                continue
            if ev and ev[0] == word:
                return ev
        pytest.fail("no %r line from %s" % (word, self.p.args), pytrace=False)

    def stop(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait()


def targets(pid):
    fds, maps = [], []
    for fd in os.listdir("/proc/%d/fd" % pid):
        fds.append(int(fd))
    for line in Path("/proc/%d/maps" % pid).read_text().splitlines():
        if "memfd:sdp" in line:
            maps.append(line.split()[0])
    return fds, maps


def test_nobody_cannot_reach_a_root_connection(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the pair runs as root, the attacker as nobody")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["SDP_LOG"] = "2"
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    run = [str(SDP), "run", "--", sys.executable]
    srv_log = tmp_path / "server.log"           # SDP_LOG=2: one line per dropped hello
    srv = P(run + [str(HERE / "pair.py"), "server", str(port)], env,
            stderr=open(srv_log, "w"))
    cli = None
    try:
        srv.line("listening")
        cli = P(run + [str(HERE / "pair.py"), "client", str(port)], env, stdin=subprocess.PIPE)
        assert cli.line("client")[1] == "1", "the root pair is not on SDP"
        assert srv.line("conn")[1] == "1"
        t = {"port": port, "server_uid": 0, "pids": [srv.p.pid, cli.p.pid],
             "fds": {}, "maps": {}}
        for pid in t["pids"]:
            fds, maps = targets(pid)
            assert any(int(fd) >= 900 for fd in fds), "no pool/arena fd in %d" % pid
            assert maps, "no sdp memfd mapping in %d" % pid
            t["fds"][str(pid)] = fds
            t["maps"][str(pid)] = maps

        def drop():
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
        # The system's python: nobody cannot run one under /root.
        py = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
        res = subprocess.run([py, str(HERE / "attacker.py"), json.dumps(t)],
                             capture_output=True, text=True, timeout=120, preexec_fn=drop,
                             env={"PATH": env.get("PATH", "/usr/bin:/bin")}, cwd="/")
        assert res.returncode == 0, res.stderr[-3000:]
        r = json.loads(res.stdout)
        checks = {k: v for k, v in r.items()
                  if k not in ("ports", "forged_sent", "flood_sent") and
                  not k.startswith("forged_conn_echo")}
        allowed = {k: v for k, v in checks.items() if v != "denied"}
        assert not allowed, "nobody got through: %s" % allowed
        assert len(checks) == 17, checks          # 8 per process + /dev/shm
        assert r["forged_sent"] == 4, r
        assert r["flood_sent"] >= 4096, r
        for k, v in r.items():
            if k.startswith("forged_conn_echo"):
                assert v == "ok", (k, v)
        # The server kept every forged connection on TCP.
        seen = {}
        for _ in r["ports"]:
            ev = srv.line("conn")
            seen[int(ev[2])] = ev[1]
        assert {p: seen.get(p) for p in r["ports"]} == {p: "0" for p in r["ports"]}, seen
        # A full rendezvous queue makes the next client use TCP (documented:
        # ARCHITECTURE.md section 11); its accept drains and drops the
        # flood, and the one after it is on SDP again. The pair is intact.
        for want in ("0", "1"):
            c2 = P(run + [str(HERE / "pair.py"), "client", str(port)], env,
                   stdin=subprocess.PIPE)
            try:
                got = c2.line("client")[1]
                c2.p.stdin.close()
                assert c2.line("verified")
                assert got == want or want == "0", "a root client after the flood: %s" % got
                # The server's accept of it: the drain before it read (and
                # dropped) what the flood left in the queue. The client
                # ends without waiting for that.
                ev = srv.line("conn", 60)
                assert ev[1] == got, (ev, got)
            finally:
                c2.stop()
        cli.p.stdin.close()
        v = cli.line("verified", 20)
        assert int(v[1]) > 0
    finally:
        if cli:
            cli.stop()
        srv.stop()
    log = srv_log.read_text()
    drops = log.count("rendezvous: dropped a")     # "... foreign hello" / "malformed
    assert drops >= r["flood_sent"] + r["forged_sent"], (drops, log[-2000:])
    print("isolation: %d checks denied, %d forged hellos dropped" % (len(checks), drops))
