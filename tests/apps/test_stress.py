"""Stress: 64 simultaneous connections between a server and a client, both
under `sdp run`, each moving 2-4 MiB in each direction at the same time with
random write and read sizes (1 B .. 256 KiB); ~400 MB in total. Every
connection is SHA-256 verified in both directions, by both ends.

Each connection has a sending and a receiving thread on each side. It runs
twice: with blocking sockets, and with sockets that have a timeout, where
CPython poll()s before every send/recv (so two threads poll one socket at
once, for POLLIN and POLLOUT).

While all 64 connections are open (before any data moves) `sdp stat --json`
must list them as transport sdp on both sides. A run that makes no progress
for STALL_S seconds fails with a snapshot of the connections' SDP state."""

import json
import os
import sys
import time

import pytest

NCONN = 64
MIN_BYTES, MAX_BYTES = 2 << 20, 4 << 20
STALL_S = 20
TOTAL_S = 180


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


def _progress(proc):
    vals = [int(x.split()[1]) for x in proc.stdout().splitlines() if x.startswith("progress ")]
    return vals[-1] if vals else -1


def _sdp_snapshot(sdp, procs_):
    """Summary of the live SDP connections of some Procs (for stall reports):
    both ends of each connection side by side."""
    pids = {p for pr in procs_ for p in pr.pids()}
    conns = [c for c in sdp.stat_conns() if int(c.get("pid", -1)) in pids]
    zero = [c for c in conns if c.get("credits") == 0]
    ends = {(str(c.get("local")), str(c.get("remote"))): c for c in conns}
    lines = []
    for (loc, rem), c in sorted(ends.items()):
        if c.get("role") == "client":
            continue
        peer = ends.get((rem, loc), {})
        lines.append(f"  {rem}->{loc}: server tx {c.get('tx_bytes')} rx {c.get('rx_bytes')} "
                     f"cred {c.get('credits')} | client tx {peer.get('tx_bytes')} "
                     f"rx {peer.get('rx_bytes')} cred {peer.get('credits')}")
    return (f"{len(conns)} live SDP connection ends, {len(zero)} with 0 send credits, "
            f"tx {sum(int(c.get('tx_bytes', 0)) for c in conns)} "
            f"rx {sum(int(c.get('rx_bytes', 0)) for c in conns)}\n" + "\n".join(lines[:16]))


def _wait_done(client, server, sdp):
    """Wait for the client to exit; fail when its progress stalls."""
    start = last_change = time.monotonic()
    last = None
    while client.poll() is None:
        now = time.monotonic()
        cur = _progress(client)
        if cur != last:
            last, last_change = cur, now
        if now - last_change > STALL_S or now - start > TOTAL_S:
            why = (f"no progress for {STALL_S} s" if now - last_change > STALL_S
                   else f"not finished after {TOTAL_S} s")
            snap = ""
            if sdp.enabled:
                snap = "\nSDP state: " + _sdp_snapshot(sdp, (client, server))
            pytest.fail(f"stress transfer stuck: {why}, {cur} bytes moved{snap}\n"
                        f"{client.log_tail(1500)}\n{server.log_tail(1500)}", pytrace=False)
        time.sleep(0.25)


@pytest.mark.parametrize("io", ["blocking", "timeout"])
def test_stress_64_connections_bidirectional(io, sdp, procs, kit, tmp_path):
    port = kit.free_port()
    prog = kit.HELPERS / "stress.py"
    server = procs.start(sdp.wrap([sys.executable, prog, "server", port, io]),
                         name="stress-server", env=sdp.env())
    kit.wait_port(port, server)
    before = sdp.server_stats(server) if sdp.enabled else None

    seed = int.from_bytes(os.urandom(6), "big")
    go = tmp_path / "go"
    stats_dir = sdp.new_stats_dir("stress-client")
    client = procs.start(sdp.wrap([sys.executable, prog, "client", port, io, NCONN, MIN_BYTES,
                                   MAX_BYTES, seed, go]),
                         name="stress-client", env=sdp.env(stats_dir))
    _wait_output(client, f"connected {NCONN}", 60)

    if sdp.enabled:
        # all connections are established and idle: both ends must list them
        # as SDP (the server may still be accepting: poll, bounded)
        deadline = time.monotonic() + 15
        while True:
            conns = sdp.stat_conns()
            counts = {}
            for who, proc in (("client", client), ("server", server)):
                pids = set(proc.pids())
                counts[who] = [c for c in conns if int(c.get("pid", -1)) in pids
                               and c.get("transport") == "sdp"]
            if all(len(v) >= NCONN for v in counts.values()):
                break
            if time.monotonic() > deadline:
                go.touch()
                pytest.fail(f"`sdp stat --json` lists "
                            f"{ {k: len(v) for k, v in counts.items()} } SDP connections "
                            f"for the stress client/server, expected {NCONN} each",
                            pytrace=False)
            time.sleep(0.1)
    go.touch()

    _wait_done(client, server, sdp)
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
