"""Every decision to keep a socket on TCP says why (SDP_LOG=2), an unusable
policy file is reported and never blocks, `set` lines are reported as the
policy's lines, and SDP_STATS_DIR only gets files of processes that had
sockets."""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("SDP_BUILD_DIR", ROOT / "build"))
SDP = BUILD / "bin" / "sdp"
LIBSDP = BUILD / "lib" / "libsdp.so"
PY = sys.executable
WATCHDOG = 30          # seconds; every run here takes well under one

# One process: a listener and a client connected to it; prints the
# transports (1 SDP, 0 TCP) of both ends after checking 100,000 bytes.
PAIR = r"""
import socket
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
c = socket.create_connection(l.getsockname()); s, _ = l.accept()
c.sendall(b"x" * 100000)
got = b""
while len(got) < 100000:
    got += s.recv(65536)
assert got == b"x" * 100000
t = lambda k: k.getsockopt(socket.SOL_TCP, 0x5D00)
print(t(c), t(s))
"""


@pytest.fixture(autouse=True)
def _built():
    if not (SDP.exists() and LIBSDP.exists()):
        pytest.fail("build first: make")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(**extra):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith("SDP_") or k == "LD_PRELOAD":
            env.pop(k)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(argv, env, timeout=WATCHDOG):
    try:
        return subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{argv} did not finish in {timeout} s (blocked?); stderr so far: "
                    f"{e.stderr!r}")


# ---- issue: say why ---------------------------------------------------------

TCP_LINE = re.compile(r"sdp\[\d+\]: (listen fd \d+: TCP only|connect fd \d+: TCP|"
                      r"accept fd \d+ -> \d+: TCP|fd \d+: leaving SDP for TCP)(.*)$")


def test_every_tcp_decision_says_why(tmp_path):
    pt, ps = free_port(), free_port()
    pol = tmp_path / "sdp.conf"
    pol.write_text(f"# the policy's first rule is on line 2\n"
                   f"use tcp server * 127.0.0.1:{pt}\nuse sdp * * *\n")
    r = run([SDP, "run", "--policy", pol, "--", PY, HERE / "helpers" / "tcp_decisions.py",
             pt, ps], clean_env(SDP_LOG=2))
    assert r.returncode == 0, r.stdout + r.stderr
    out = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert out.get("policy") == "0 0" and out.get("plain-client") == "0", r.stdout
    assert out.get("exec-before") == "1" and out.get("follower") == "1", \
        r.stdout + r.stderr
    assert out.get("exec-after") == "ok:hello 0 0", r.stdout   # data intact, TCP now

    tcp = [TCP_LINE.search(line) for line in r.stderr.splitlines()]
    tcp = [(m.group(1), m.group(2)) for m in tcp if m]
    # every TCP decision has a reason in parentheses
    for what, why in tcp:
        assert re.fullmatch(r" \(.{8,}\)", why), f"no reason: {what}{why}\n{r.stderr}"
    text = "\n".join(w + why for w, why in tcp)
    # 1. the rule that decided, with file and line
    assert re.search(rf"listen fd \d+: TCP only \(policy {re.escape(str(pol))}:2 says tcp\)",
                     text), r.stderr
    assert re.search(r"connect fd \d+: TCP \(no SDP listener at the destination", text), \
        r.stderr
    assert re.search(r"accept fd \d+ -> \d+: TCP \(the listener offers TCP only", text), \
        r.stderr
    # 2. a client that did not say hello
    assert re.search(r"accept fd \d+ -> \d+: TCP \(the client sent no hello", text), r.stderr
    # 3. not this host (only when the kernel took the connect at all)
    if out["remote"] in ("EINPROGRESS", "0"):
        assert re.search(r"connect fd \d+: TCP \(the destination is not an address of "
                         r"this host\)", text), r.stderr
    # 4. both ends of the hand-back
    assert "leaving SDP for TCP (inherited across exec)" in text, r.stderr
    assert "leaving SDP for TCP (the peer left SDP" in text, r.stderr


def test_no_policy_rule_matches_says_so(tmp_path):
    pol = tmp_path / "sdp.conf"
    pol.write_text("use sdp * nosuchprogram *\n")
    r = run([SDP, "run", "--policy", pol, "--", PY, "-c", PAIR], clean_env(SDP_LOG=2))
    assert r.returncode == 0 and r.stdout.split() == ["0", "0"], r.stdout + r.stderr
    assert re.search(rf"listen fd \d+: TCP only \(no rule of policy {re.escape(str(pol))} "
                     r"matches this server", r.stderr), r.stderr
    assert re.search(rf"connect fd \d+: TCP \(no rule of policy {re.escape(str(pol))} "
                     r"matches this client", r.stderr), r.stderr


# ---- SDP_STATS_DIR: only processes that had sockets --------------------------

LISTEN_ONLY = "import socket; l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()"


def test_stats_files_only_for_processes_with_sockets(tmp_path):
    d = tmp_path / "stats"
    d.mkdir()
    env = clean_env(SDP_STATS_DIR=d)
    # a shell that runs a few programs without sockets
    r = run([SDP, "run", "--", "/bin/sh", "-c",
             f"true; ls / >/dev/null; echo x | cat >/dev/null; {PY} -c pass"], env)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in d.iterdir()) == [], "files of socketless processes"
    # a listener only, then a pair of connections
    r = run([SDP, "run", "--", PY, "-c", LISTEN_ONLY], env)
    assert r.returncode == 0, r.stderr
    r2 = run([SDP, "run", "--", "/bin/sh", "-c", f"{PY} -c \"$1\"; true", "sh", PAIR], env)
    assert r2.returncode == 0 and r2.stdout.split() == ["1", "1"], r2.stdout + r2.stderr
    objs = [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]
    assert len(objs) == 2, [p.name for p in d.iterdir()]
    assert sorted((o["sdp_conns"], o["tcp_conns"]) for o in objs) == [(0, 0), (2, 0)], objs


# ---- the policy file itself ------------------------------------------------------

def test_fifo_policy_does_not_block(tmp_path):
    fifo = tmp_path / "sdp.conf"
    os.mkfifo(fifo)
    # `sdp run` reports it once, the program runs on TCP
    r = run([SDP, "run", "--policy", fifo, "--", PY, "-c", PAIR], clean_env())
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "0"], r.stdout      # named but unusable: TCP
    assert r.stderr.count("a FIFO, not a regular file") == 1, r.stderr
    # preloaded without `sdp run`: the library says it (once per process)
    r = run([PY, "-c", PAIR], clean_env(LD_PRELOAD=LIBSDP, SDP_CONFIG=fifo, SDP_LOG=2))
    assert r.returncode == 0 and r.stdout.split() == ["0", "0"], r.stdout + r.stderr
    assert r.stderr.count(f"cannot use policy {fifo}: a FIFO, not a regular file") == 1, \
        r.stderr
    assert re.search(rf"listen fd \d+: TCP only \(policy {re.escape(str(fifo))} unusable "
                     r"\(a FIFO, not a regular file\)", r.stderr), r.stderr
    # `sdp check` says it too
    r = run([SDP, "check"], clean_env(SDP_CONFIG=fifo))
    assert re.search(r"policy\s+no\s+.*a FIFO, not a regular file", r.stdout), r.stdout


def test_device_policy_is_not_read(tmp_path):
    r = run([SDP, "run", "--policy", "/dev/zero", "--", PY, "-c", PAIR], clean_env())
    assert r.returncode == 0 and r.stdout.split() == ["0", "0"], r.stdout + r.stderr
    assert "a character device, not a regular file" in r.stderr, r.stderr


def test_bad_set_line_reported_as_the_policy_line(tmp_path):
    pol = tmp_path / "sdp.conf"
    pol.write_text("use sdp * * *\n\nset spin_us 99999999\nset copy nosuchroutine\n")
    r = run([SDP, "run", "--policy", pol, "--", PY, "-c", PAIR], clean_env())
    assert r.returncode == 0 and r.stdout.split() == ["1", "1"], r.stdout + r.stderr
    assert f"{pol}:3: ignoring set spin_us 99999999" in r.stderr, r.stderr
    assert f"{pol}:4: set copy nosuchroutine: unknown" in r.stderr, r.stderr
    assert "SDP_SPIN_US" not in r.stderr and "SDP_COPY" not in r.stderr, r.stderr
    # the environment variable is still reported as itself
    r = run([SDP, "run", "--", PY, "-c", PAIR], clean_env(SDP_SPIN_US="99999999"))
    assert "ignoring SDP_SPIN_US=99999999" in r.stderr, r.stderr
