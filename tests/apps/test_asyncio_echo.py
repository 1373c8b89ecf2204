"""A Python asyncio echo server under `sdp run` and an asyncio client under
`sdp run` holding 1,000 connections open at once, each echoing its own few
KiB of data (verified byte for byte by the client)."""

import importlib.util
import json
import os
import re
import sys

NCONN = 1000
MIN_BYTES, MAX_BYTES = 2048, 8192


def _load(kit, name):
    spec = importlib.util.spec_from_file_location(name, kit.HELPERS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_asyncio_echo_1000_clients(sdp, procs, kit):
    port = kit.free_port()
    server = procs.start(sdp.wrap([sys.executable, kit.HELPERS / "echo_server.py", port]),
                         name="echo-server", env=sdp.env())
    kit.wait_port(port, server)
    before = sdp.server_stats(server) if sdp.enabled else None

    seed = os.urandom(6).hex()
    stats_dir = sdp.new_stats_dir("echo-client")
    res = kit.run_cmd(sdp.wrap([sys.executable, kit.HELPERS / "echo_client.py", port, NCONN,
                                seed, MIN_BYTES, MAX_BYTES]),
                      timeout=90, env=sdp.env(stats_dir), check=False)
    try:
        rep = json.loads(res.stdout)
    except ValueError:
        raise AssertionError(f"echo client printed no report\n{res.describe()}\n"
                             f"{server.log_tail()}")
    assert rep["ok"] == NCONN and not rep["errors"], \
        f"{NCONN - rep['ok']} of {NCONN} connections failed: {rep['errors']}\n" \
        f"{server.log_tail()}"
    assert res.returncode == 0, res.describe()
    helper = _load(kit, "echo_client")
    total = sum(len(helper.payload(seed, i, MIN_BYTES, MAX_BYTES)) for i in range(NCONN))
    assert rep["bytes"] == total, f"client verified {rep['bytes']} bytes, expected {total}"

    # the server really had all of them open at the same time
    peaks = [int(m) for m in re.findall(r"^peak (\d+)$", server.stdout(), re.M)]
    assert peaks and max(peaks) >= NCONN, f"server saw at most {max(peaks, default=0)} " \
                                          f"simultaneous connections\n{server.log_tail()}"
    assert "connection error" not in server.stdout(), server.log_tail()

    if not sdp.enabled:
        return
    cl = sdp.client_stats(stats_dir)
    assert cl["sdp_conns"] >= NCONN and cl["tcp_conns"] == 0, f"echo client: {cl}"
    kit.assert_bytes_between("echo client SDP tx_bytes", cl["tx_bytes"], total, kit.slack(total))
    kit.assert_bytes_between("echo client SDP rx_bytes", cl["rx_bytes"], total, kit.slack(total))
    d = kit.delta(sdp.server_stats(server), before)
    assert d["sdp_conns"] >= NCONN, f"echo server SDP conns delta {d}"
    kit.assert_bytes_between("echo server SDP rx_bytes delta", d["rx_bytes"], total,
                             kit.slack(total))
    kit.assert_bytes_between("echo server SDP tx_bytes delta", d["tx_bytes"], total,
                             kit.slack(total))
