"""`sdp stat` against what other processes put in their pools, and on many
connections; the options every `sdp` command accepts.

* Forged pools: an unprivileged user (nobody, through setpriv) holds memfds
  named "sdp-pool" with counts and offsets beyond the file, huge,
  "negative", overlapping, misaligned, truncated, and a well-formed pool
  with a hostile process name. `sdp stat` run by root (plain, --procs,
  --json) must not crash, must skip the bad ones with a note, and must
  still list the real connections.
* 10,000 idle SDP connections between two processes: every one is SDP on
  both ends and `sdp stat --json` lists all 20,000 endpoints. Its time
  limit is a hang detector, not a speed assertion.
"""
import json
import os
import resource
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("SDP_BUILD_DIR", ROOT / "build"))
SDP = BUILD / "bin" / "sdp"
PY = sys.executable
HELPERS = HERE / "helpers"

# A process holding two SDP connections to itself (four endpoints) until
# its stdin closes.
HOLD = r"""
import socket, sys
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
cs = [socket.create_connection(l.getsockname()) for _ in range(2)]
ss = [l.accept()[0] for _ in range(2)]
for c, s in zip(cs, ss):
    c.sendall(b"ping"); assert s.recv(4) == b"ping"
t = [k.getsockopt(socket.SOL_TCP, 0x5D00) for k in cs + ss]
print("ready", sum(t), flush=True)
sys.stdin.read()
"""


@pytest.fixture(autouse=True)
def _built():
    if not SDP.exists():
        pytest.fail("build first: make")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SDP_") and k != "LD_PRELOAD"}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def stat(*args, timeout=60):
    t0 = time.monotonic()
    try:
        r = subprocess.run([str(SDP), "stat", *args], capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`sdp stat {' '.join(args)}` did not answer within {timeout} s")
    return r, time.monotonic() - t0


def describe(r):
    how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit {r.returncode}"
    return f"{how}\nstderr: {r.stderr[-2000:]}"


def pool_bytes(pid):
    """The bytes of process pid's connection pool (root may read them)."""
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            if os.readlink(fd).startswith("/memfd:sdp-pool"):
                return fd.read_bytes()
        except OSError:
            continue
    pytest.fail(f"process {pid} holds no connection pool")


@pytest.fixture
def holder():
    p = subprocess.Popen([str(SDP), "run", "--", PY, "-c", HOLD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=clean_env())
    try:
        line = p.stdout.readline().split()
        assert line == ["ready", "4"], f"holder: {line} (all four ends should be SDP)"
        yield p
    finally:
        p.kill()
        p.wait()


def test_forged_pools_of_another_user(holder):
    if os.geteuid() != 0:
        pytest.skip("needs root: the forger runs as nobody, sdp stat as root")
    setpriv = shutil.which("setpriv")
    python = "/usr/bin/python3"
    if not setpriv or not os.access(python, os.X_OK):
        pytest.skip("needs setpriv and /usr/bin/python3 to run a process as nobody")
    real = pool_bytes(holder.pid)
    inodes = [str(os.stat(f).st_ino) for f in Path(f"/proc/{holder.pid}/fd").iterdir()
              if os.readlink(f).startswith("socket:")]
    # The forger's script goes on its command line: nobody may not read
    # this tree.
    forger = subprocess.Popen(
        [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--",
         python, "-c", (HELPERS / "forge_pools.py").read_text(), *inodes],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=clean_env(), cwd="/")
    try:
        forger.stdin.write(real)
        forger.stdin.close()
        line = forger.stdout.readline().decode().split()
        assert line[:1] == ["ready"], f"forger did not start: {line}"
        fpid, nbad, ffd = int(line[1]), int(line[2]), int(line[3])
        assert Path(f"/proc/{fpid}").stat().st_uid == 65534

        for args in (["--json"], ["--procs", "--json"], [], ["--procs"]):
            r, _ = stat(*args)
            assert r.returncode == 0, f"sdp stat {' '.join(args)}: {describe(r)}"
            notes = [ln for ln in r.stderr.splitlines() if f"pool of pid {fpid} " in ln]
            assert len(notes) == nbad, f"sdp stat {' '.join(args)}: {nbad} bad pools, " \
                                       f"notes:\n{r.stderr}"
            if "--json" not in args:
                continue
            rows = json.loads(r.stdout)
            mine = [o for o in rows if o["pid"] == holder.pid]
            theirs = [o for o in rows if o["pid"] == fpid]
            if "--procs" in args:
                assert len(mine) == 1 and mine[0]["sdp_conns"] == 4, rows
                # the forged record names its own holder: listed, name intact
                assert [o["comm"] for o in theirs] == ['a"b\\c\n\x01\x7fz'], theirs
            else:
                assert len(mine) == 4 and all(o["transport"] == "sdp" for o in mine), rows
                # root's sockets, named in the forged pool, are not the
                # forger's; its own socket, named 1000 times, is listed once
                assert [o["fd"] for o in theirs] == [ffd], theirs
    finally:
        forger.kill()
        forger.wait()


def test_unknown_options_are_refused():
    for cmd in (["stat", "--bogus"], ["stat", "--json", "-x"], ["check", "--bogus"],
                ["check", "--json", "extra"], ["run", "--bogus", "--", "true"],
                ["bench", "--bogus"], ["nosuchcommand"], []):
        r = subprocess.run([str(SDP), *cmd], capture_output=True, text=True, timeout=60,
                           env=clean_env())
        assert r.returncode == 2, f"sdp {' '.join(cmd)}: exit {r.returncode}\n{r.stderr}"
        assert "usage:" in r.stderr, f"sdp {' '.join(cmd)}: {r.stderr}"


def test_empty_policy_option_is_refused(tmp_path):
    marker = tmp_path / "ran"
    for opt in (["--policy="], ["--policy", ""], ["--policy"]):
        r = subprocess.run([str(SDP), "run", *opt, "--", "touch", str(marker)],
                           capture_output=True, text=True, timeout=60, env=clean_env())
        assert r.returncode == 2, f"sdp run {opt}: exit {r.returncode}\n{r.stderr}"
        assert "--policy needs a file name" in r.stderr, r.stderr
        assert not marker.exists(), f"sdp run {opt} ran the command"


# ---- many connections ----------------------------------------------------------

N = 10000


def _nofile(n):
    """preexec: raise RLIMIT_NOFILE to n (the hard limit too if we may)."""
    def f():
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and hard < n:
            hard = n                     # needs privilege; fails otherwise
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))
    return f


def test_stat_lists_10000_connections():
    need = N + 200
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < need and os.geteuid() != 0:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {need} and not root")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    helper = str(HELPERS / "many_conns.py")
    procs = []

    def start(role):
        p = subprocess.Popen([str(SDP), "run", "--", PY, helper, role, str(port), str(N)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=clean_env(),
                             preexec_fn=_nofile(need), start_new_session=True)
        procs.append(p)
        return p

    def ready(p, what, timeout=120):
        # bounded: the helpers exit with a message on any error, and a
        # hang ends here
        if not select.select([p.stdout], [], [], timeout)[0]:
            pytest.fail(f"{what} not ready within {timeout} s")
        line = p.stdout.readline()
        if not line:
            p.wait(timeout=10)
            pytest.fail(f"{what} failed (exit {p.returncode}): {p.stderr.read()[-2000:]}")
        return line.split()

    try:
        srv = start("server")
        assert ready(srv, "server") == ["listening"]
        cli = start("client")
        c = ready(cli, "client")
        s = ready(srv, "server")
        assert c[0] == s[0] == "ready", (c, s)
        spid, cpid = int(s[1]), int(c[1])
        # every connection SDP on both ends, data checked (by the helpers)
        assert s[2:] == [str(N), str(N)] and c[2:] == [str(N), str(N)], (s, c)

        r, secs = stat("--json", timeout=60)
        assert r.returncode == 0, describe(r)
        rows = json.loads(r.stdout)
        by_pid = {spid: [], cpid: []}
        for o in rows:
            if o["pid"] in by_pid:
                by_pid[o["pid"]].append(o)
        for pid, role in ((spid, "server"), (cpid, "client")):
            got = by_pid[pid]
            assert len(got) == N, f"{role}: {len(got)} of {N} endpoints listed"
            assert all(o["transport"] == "sdp" and o["state"] == "established"
                       and o["role"] == role for o in got), role
            assert len({o["fd"] for o in got}) == N, f"{role}: an fd listed twice"
        print(f"sdp stat --json: {len(rows)} rows in {secs:.2f} s")
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
