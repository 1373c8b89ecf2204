"""The policy file end to end: real processes under `sdp run --policy`, the
transport of each connection read back with getsockopt(SDP_TRANSPORT)."""
import os
import subprocess
import sys
import textwrap

import pytest

from buildpaths import SDP_BIN

SDP = str(SDP_BIN)

# One process: a listener and a client connected to it; prints the
# transport (1 SDP, 0 TCP) seen by the client and the accepted socket.
PAIR = textwrap.dedent("""
    import socket, sys
    port = int(sys.argv[1])
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port)); l.listen()
    c = socket.create_connection(("127.0.0.1", port)); s, _ = l.accept()
    c.sendall(b"x" * 100000)
    got = b""
    while len(got) < 100000:
        got += s.recv(65536)
    assert got == b"x" * 100000
    t = lambda k: k.getsockopt(socket.SOL_TCP, 0x5D00)
    print(t(c), t(s))
""")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(tmp_path, policy_text, prog_name="python3"):
    pol = tmp_path / "sdp.conf"
    pol.write_text(policy_text)
    script = tmp_path / "pair.py"
    script.write_text(PAIR)
    port = free_port()
    env = dict(os.environ)
    env.pop("SDP_CONFIG", None)
    r = subprocess.run([SDP, "run", "--policy", str(pol), "--", sys.executable,
                        str(script), str(port)], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    client, server = (int(x) for x in r.stdout.split())
    return client, server, r.stderr, str(pol)


@pytest.fixture(autouse=True)
def _built():
    if not os.path.exists(SDP):
        pytest.fail("build first: make")


def test_no_rule_matches_means_tcp(tmp_path):
    assert run_pair(tmp_path, "use sdp * nosuchprogram *:*\n")[:2] == (0, 0)


def test_match_all_uses_sdp(tmp_path):
    assert run_pair(tmp_path, "# everything\nuse both * * *\n")[:2] == (1, 1)


def test_bad_line_reported_once_and_app_still_runs(tmp_path):
    client, server, err, pol = run_pair(
        tmp_path, "use sdp * * 1.2.3.4/40:80\nuse bogus * * *\n")
    assert (client, server) == (0, 0)          # nothing valid matched: TCP
    assert err.count(f"{pol}:1:") == 1, err
    assert err.count(f"{pol}:2:") == 1, err


def test_bad_line_does_not_disable_good_lines(tmp_path):
    client, server, err, pol = run_pair(
        tmp_path, "use sdp * * *:99999\nuse sdp * python3* 127.0.0.0/8:1-65535\n")
    assert (client, server) == (1, 1)
    assert err.count(f"{pol}:1:") == 1 and f"{pol}:2:" not in err, err


def test_first_match_wins_tcp_for_program(tmp_path):
    text = "use tcp * python3* *\nuse sdp * * *\n"
    assert run_pair(tmp_path, text)[:2] == (0, 0)


def test_client_rule_without_server_rule_stays_tcp(tmp_path):
    # The server side is not allowed to offer SDP, so the client falls back.
    text = "use sdp client * *\n"
    assert run_pair(tmp_path, text)[:2] == (0, 0)


def test_port_range_selects(tmp_path):
    port_rule = "use sdp * * 127.0.0.1:1-1023\n"     # our port is above 1023
    assert run_pair(tmp_path, port_rule)[:2] == (0, 0)


@pytest.mark.parametrize("fabric, want", [("shm", (1, 1)), ("any", (1, 1)),
                                          ("tcp", (0, 0)), ("ofi", (0, 0))])
def test_rule_forces_a_fabric(tmp_path, fabric, want):
    # shm reaches 127.0.0.1; no ofi provider is built, so forcing it is TCP
    assert run_pair(tmp_path, f"use sdp * * *:* {fabric}\n")[:2] == want


def test_unknown_fabric_is_a_bad_line(tmp_path):
    client, server, err, pol = run_pair(tmp_path, "use sdp * * *:* rdma\n")
    assert (client, server) == (0, 0)
    assert f"{pol}:1: unknown fabric 'rdma'" in err, err


# The client's rule says shm, the listener's allows only ofi: the client is
# committed to SDP once its hello is queued, so the listener resets that
# connection (and accept() never returns it) rather than keep it TCP on
# its side only, which would leave both ends waiting for each other.
MISMATCH = textwrap.dedent("""
    import errno, select, socket, sys
    port = int(sys.argv[1])
    l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", port)); l.listen(); l.setblocking(False)
    c = socket.create_connection(("127.0.0.1", port))
    assert c.getsockopt(socket.SOL_TCP, 0x5D00) == 1      # the client: SDP
    select.select([l], [], [], 5)
    try:
        l.accept()
        print("accepted")
    except BlockingIOError:
        print("refused")
    c.settimeout(10)
    try:
        print("eof" if c.recv(1) == b"" else "data")
    except ConnectionResetError:
        print("reset")
""")


def test_fabric_mismatch_resets_the_client(tmp_path):
    pol = tmp_path / "sdp.conf"
    pol.write_text("use sdp server * *:* ofi\nuse sdp client * *:* shm\n")
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH)
    env = dict(os.environ)
    env.pop("SDP_CONFIG", None)
    r = subprocess.run([SDP, "run", "--policy", str(pol), "--", sys.executable,
                        str(script), str(free_port())], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["refused", "reset"], (r.stdout, r.stderr)
