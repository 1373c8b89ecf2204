"""Mixed deployments: an SDP process talking to a plain TCP peer must fall back
to TCP transparently, without losing or injecting a single byte.

* sdp_side=client: client under `sdp run`, echo server plain.
* sdp_side=server: echo server under `sdp run`, client plain.

Both with the client speaking first and with the server speaking first (a
banner sent on accept, before the server reads anything). The client checks
banner and echo byte for byte; the server reports length and SHA-256 of what
it received on every connection, which must equal exactly what the client
sent. The SDP-side process must count those connections as TCP, not SDP."""

import hashlib
import importlib.util
import json
import os
import socket
import sys
import time

import pytest

NCONN = 4


def _load(kit, name):
    spec = importlib.util.spec_from_file_location(name, kit.HELPERS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _server_reports(server, want, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        reps = [json.loads(line) for line in server.stdout().splitlines()
                if line.startswith("{")]
        if sum(1 for r in reps if r["rx"] > 0) >= want or time.monotonic() > deadline:
            return reps
        time.sleep(0.05)


def _hold_plain_connection(sdp, kit, server, port, order):
    """Open a plain connection to the SDP server, exchange a few bytes and,
    while it is still open, return the `sdp stat --json` entries of the
    server's processes and the ones that are this connection."""
    helper = _load(kit, "mixed_client")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        if order == "server-first":
            assert helper.recv_exact(s, len(helper.BANNER)) == helper.BANNER
        s.sendall(b"ping\n")
        assert helper.recv_exact(s, 5) == b"ping\n"
        local = s.getsockname()[1]
        conns = mine = []
        if sdp.enabled:
            pids = set(server.pids())
            conns = [c for c in sdp.stat_conns() if int(c.get("pid", -1)) in pids]
            mine = [c for c in conns if f":{local}" in str(c.get("remote", ""))]
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass
    return local, conns, mine


@pytest.mark.parametrize("order", ["client-first", "server-first"])
@pytest.mark.parametrize("sdp_side", ["client", "server"])
def test_mixed_fallback(sdp_side, order, sdp, procs, kit):
    port = kit.free_port()
    server = procs.start(sdp.wrap([sys.executable, kit.HELPERS / "mixed_server.py", port, order],
                                  sdp=sdp_side == "server"),
                         name="mixed-server", env=sdp.env())
    kit.wait_port(port, server)
    if sdp.enabled:
        libsdp = [p for p in server.pids() if kit.has_libsdp(p)]
        if sdp_side == "server":
            before = sdp.server_stats(server)
        else:
            assert not libsdp, f"plain server has libsdp mapped: {libsdp}"

    seed = os.urandom(6).hex()
    stats_dir = sdp.new_stats_dir("mixed-client")
    res = kit.run_cmd(sdp.wrap([sys.executable, kit.HELPERS / "mixed_client.py", port, order,
                                NCONN, seed], sdp=sdp_side == "client"),
                      timeout=90, env=sdp.env(stats_dir), check=False)
    try:
        rep = json.loads(res.stdout)
    except ValueError:
        raise AssertionError(f"mixed client printed no report\n{res.describe()}\n"
                             f"{server.log_tail()}")
    assert not rep["errors"], f"client-side errors: {rep['errors']}\n{server.log_tail()}"
    assert res.returncode == 0, res.describe()

    helper = _load(kit, "mixed_client")
    sent = sorted((len(p), hashlib.sha256(p).hexdigest())
                  for p in (helper.payload(seed, i) for i in range(NCONN)))
    reps = _server_reports(server, NCONN)
    real = [r for r in reps if r["rx"] > 0]
    assert sorted((r["rx"], r["sha"]) for r in real) == sent, \
        f"what the server received differs from what the client sent\nserver: {real}\n" \
        f"client: {sent}"
    assert all(r["error"] is None for r in real), real
    # anything else the server saw is a connect-only port probe: no data
    assert all(r["rx"] == 0 for r in reps if r not in real)

    if not sdp.enabled:
        return
    total = rep["bytes"]
    assert total == sum(n for n, _ in sent)
    if sdp_side == "client":
        cl = sdp.client_stats(stats_dir)
        assert cl["sdp_conns"] == 0, f"client claims SDP connections to a plain server: {cl}"
        assert cl["tcp_conns"] == NCONN, f"client did not count {NCONN} TCP fallbacks: {cl}"
        assert cl["tx_bytes"] == 0 and cl["rx_bytes"] == 0, f"SDP bytes without SDP: {cl}"
    else:
        d = kit.delta(sdp.server_stats(server), before)
        assert d["sdp_conns"] == 0, f"server counted SDP connections from a plain client: {d}"
        assert d["tcp_conns"] >= NCONN, f"server did not count {NCONN} TCP fallbacks: {d}"
        assert d["tx_bytes"] == 0 and d["rx_bytes"] == 0, f"SDP bytes without SDP: {d}"
        local, conns, mine = _hold_plain_connection(sdp, kit, server, port, order)
        on_sdp = [c for c in mine if c.get("transport") != "tcp"]
        assert not on_sdp, f"a plain client's open connection (port {local}) is listed as " \
                           f"SDP by `sdp stat --json`: {on_sdp}"


@pytest.mark.parametrize("order", ["client-first", "server-first"])
def test_stat_lists_fallback_connection_as_tcp(order, sdp, procs, kit):
    """`sdp stat --json` lists the switched connections with their transport,
    "sdp" or "tcp": an open connection that fell back must be there as tcp."""
    port = kit.free_port()
    server = procs.start(sdp.wrap([sys.executable, kit.HELPERS / "mixed_server.py", port, order]),
                         name="mixed-server", env=sdp.env())
    kit.wait_port(port, server)
    local, conns, mine = _hold_plain_connection(sdp, kit, server, port, order)
    if not sdp.enabled:
        return
    assert mine, f"`sdp stat --json` does not list the open fallback connection from port " \
                 f"{local} to the SDP server (entries for the server: {conns})"
    assert all(c.get("transport") == "tcp" for c in mine), \
        f"fallback connection not listed with transport tcp: {mine}"
