"""Stress: 64 simultaneous connections between a server and a client, both
under `sdp run`, each moving 2-4 MiB in each direction at the same time with
random write and read sizes (1 B .. 256 KiB); ~400 MB in total. Every
connection is SHA-256 verified in both directions, by both ends.

While all 64 connections are open (before any data moves) `sdp stat --json`
must list them as transport sdp on both sides."""

import json
import os
import sys
import time

import pytest

NCONN = 64
MIN_BYTES, MAX_BYTES = 2 << 20, 4 << 20


def _wait_output(proc, text, timeout):
    deadline = time.monotonic() + timeout
    while text not in proc.stdout():
        if proc.poll() is not None:
            pytest.fail(f"{proc.name} exited ({proc.returncode}) before printing {text!r}\n"
                        f"{proc.log_tail()}", pytrace=False)
        if time.monotonic() > deadline:
            pytest.fail(f"{proc.name} did not print {text!r} within {timeout}s\n"
                        f"{proc.log_tail()}", pytrace=False)
        time.sleep(0.05)


def test_stress_64_connections_bidirectional(sdp, procs, kit, tmp_path):
    port = kit.free_port()
    prog = kit.HELPERS / "stress.py"
    server = procs.start(sdp.wrap([sys.executable, prog, "server", port]),
                         name="stress-server", env=sdp.env())
    kit.wait_port(port, server)
    before = sdp.server_stats(server) if sdp.enabled else None

    seed = int.from_bytes(os.urandom(6), "big")
    go = tmp_path / "go"
    stats_dir = sdp.new_stats_dir("stress-client")
    client = procs.start(sdp.wrap([sys.executable, prog, "client", port, NCONN, MIN_BYTES,
                                   MAX_BYTES, seed, go]),
                         name="stress-client", env=sdp.env(stats_dir))
    _wait_output(client, f"connected {NCONN}", 60)

    if sdp.enabled:
        # all connections are established and idle: both ends must list them as SDP
        conns = sdp.stat_conns()
        for who, proc in (("client", client), ("server", server)):
            pids = set(proc.pids())
            mine = [c for c in conns if int(c.get("pid", -1)) in pids]
            on_sdp = [c for c in mine if c.get("transport") == "sdp"]
            if len(on_sdp) < NCONN:
                go.touch()
                pytest.fail(f"`sdp stat --json` lists {len(on_sdp)} SDP connections for the "
                            f"stress {who} (pids {sorted(pids)}), expected {NCONN}: "
                            f"{mine[:5]}", pytrace=False)
    go.touch()

    try:
        client.wait(timeout=300)
    except Exception:
        pytest.fail(f"stress client still running after 300 s\n{client.log_tail()}\n"
                    f"{server.log_tail()}", pytrace=False)
    lines = [line for line in client.stdout().splitlines() if line.startswith("{")]
    assert lines, f"stress client printed no report\n{client.log_tail()}\n{server.log_tail()}"
    rep = json.loads(lines[-1])
    assert rep["ok"] == NCONN, f"{NCONN - rep['ok']} connections failed: {rep['failed']}\n" \
                               f"{server.log_tail()}"
    assert client.returncode == 0, client.log_tail()
    total = rep["c2s_bytes"] + rep["s2c_bytes"]
    assert total >= NCONN * 2 * MIN_BYTES

    # the server's own verdicts (connect-only port probes carry no "conn")
    deadline = time.monotonic() + 15
    while True:
        reports = [json.loads(x) for x in server.stdout().splitlines() if x.startswith("{")]
        reports = [r for r in reports if "conn" in r]
        if len(reports) >= NCONN or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sorted(r["conn"] for r in reports) == list(range(NCONN)), \
        f"server finished {len(reports)} connections\n{server.log_tail()}"
    bad = [r for r in reports if not r["ok"]]
    assert not bad, f"server-side verification failed: {bad[:5]}"

    if not sdp.enabled:
        return
    cl = sdp.client_stats(stats_dir)
    assert cl["sdp_conns"] >= NCONN and cl["tcp_conns"] == 0, f"stress client: {cl}"
    kit.assert_bytes_between("stress client SDP tx_bytes", cl["tx_bytes"], rep["c2s_bytes"],
                             kit.slack(rep["c2s_bytes"]))
    kit.assert_bytes_between("stress client SDP rx_bytes", cl["rx_bytes"], rep["s2c_bytes"],
                             kit.slack(rep["s2c_bytes"]))
    d = kit.delta(sdp.server_stats(server), before)
    assert d["sdp_conns"] >= NCONN, f"stress server SDP conns delta {d}"
    kit.assert_bytes_between("stress server SDP rx_bytes delta", d["rx_bytes"], rep["c2s_bytes"],
                             kit.slack(rep["c2s_bytes"]))
    kit.assert_bytes_between("stress server SDP tx_bytes delta", d["tx_bytes"], rep["s2c_bytes"],
                             kit.slack(rep["s2c_bytes"]))
