"""memcached under `sdp run`, with clients under `sdp run`: a small Python
text-protocol client (values up to 1 MiB, multi-get, pipelining) and the
libmemcached tools memccp / memccat / memcslap."""

import hashlib
import importlib.util
import json
import os
import socket
import sys

import pytest

SIZES = [0, 1, 10, 100, 1000, 4096, 65535, 65536, 100000, 500000, 1 << 20]


@pytest.fixture(scope="module")
def memcached(sdp, module_procs, kit):
    kit.require_bins("memcached", "memccp", "memccat", "memcslap")
    port = kit.free_port()
    argv = ["memcached", "-p", port, "-U", "0", "-l", "127.0.0.1", "-I", "2m", "-m", "512",
            "-c", "4096"]
    if os.geteuid() == 0:
        argv += ["-u", "root"]
    server = module_procs.start(sdp.wrap(argv), name="memcached", env=sdp.env())
    kit.wait_port(port, server)
    server.port = port
    return server


def _mc_stats(port):
    """`stats` over a plain socket from the test process itself."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"stats\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    out = {}
    for line in buf.decode().splitlines():
        f = line.split()
        if len(f) == 3 and f[0] == "STAT":
            try:
                out[f[1]] = int(f[2])
            except ValueError:
                pass
    return out


def _load_helper(kit):
    spec = importlib.util.spec_from_file_location("mc_client", kit.HELPERS / "mc_client.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_memcached_text_protocol(memcached, sdp, kit):
    helper = _load_helper(kit)
    seed = os.urandom(6).hex()
    before = sdp.server_stats(memcached) if sdp.enabled else None
    stats_dir = sdp.new_stats_dir("mc-client")
    res = kit.run_cmd(sdp.wrap([sys.executable, kit.HELPERS / "mc_client.py", memcached.port,
                                seed, *SIZES]),
                      timeout=60, env=sdp.env(stats_dir))
    report = json.loads(res.stdout)
    for i, n in enumerate(SIZES):
        key = f"sdp:{seed}:{i}"
        want = [i * 7 + 1, n, hashlib.sha256(helper.value_for(seed, i, n)).hexdigest()]
        assert report["single"].get(key) == want, f"get {key} ({n} bytes) differs"
        assert report["multi"].get(key) == want, f"multi-get {key} ({n} bytes) differs"
    assert len(report["multi"]) == len(SIZES)
    p = report["pipelined"]
    assert p["stored"] == p["n"] and p["mismatched"] == 0, f"pipelined sets/gets: {p}"

    if not sdp.enabled:
        return
    total = sum(SIZES)
    cl = sdp.client_stats(stats_dir)
    assert cl["sdp_conns"] >= 1 and cl["tcp_conns"] == 0, f"python memcached client: {cl}"
    kit.assert_bytes_between("client SDP tx_bytes", cl["tx_bytes"], total + p["bytes"],
                             kit.slack(total + p["bytes"]))
    kit.assert_bytes_between("client SDP rx_bytes", cl["rx_bytes"], 2 * total + p["bytes"],
                             kit.slack(2 * total + p["bytes"]))
    d = kit.delta(sdp.server_stats(memcached), before)
    assert d["sdp_conns"] >= 1, f"memcached SDP conns delta {d}"
    kit.assert_bytes_between("memcached SDP rx_bytes delta", d["rx_bytes"], total + p["bytes"],
                             kit.slack(total + p["bytes"]))
    kit.assert_bytes_between("memcached SDP tx_bytes delta", d["tx_bytes"],
                             2 * total + p["bytes"], kit.slack(2 * total + p["bytes"]))


def test_memcached_libmemcached_tools(memcached, sdp, kit, tmp_path):
    port = memcached.port
    servers = f"--servers=127.0.0.1:{port}"
    before = sdp.server_stats(memcached) if sdp.enabled else None
    st0 = _mc_stats(port)
    stats_dir = sdp.new_stats_dir("libmemcached")

    # memccp stores the file under its base name; memccat prints it back
    data = os.urandom((1 << 20) - 4096)
    src = tmp_path / f"blob-{os.urandom(4).hex()}.bin"
    src.write_bytes(data)
    kit.run_cmd(sdp.wrap(["memccp", servers, src]), timeout=60, env=sdp.env(stats_dir))
    res = kit.run_cmd(sdp.wrap(["memccat", servers, src.name]), timeout=60,
                      env=sdp.env(stats_dir))
    got = res.stdout_b
    if got.endswith(b"\n") and len(got) == len(data) + 1:
        got = got[:-1]  # memccat terminates the value with a newline
    assert len(got) == len(data), f"memccat printed {len(got)} bytes, stored {len(data)}"
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), \
        "memccat output differs from the file memccp stored"

    # memcslap: 4 threads x 2000 sets, then 4 x 2000 gets of preloaded keys
    conc, n = 4, 2000
    for test in ("set", "get"):
        res = kit.run_cmd(sdp.wrap(["memcslap", servers, f"--concurrency={conc}",
                                    f"--execute-number={n}", f"--test={test}"]),
                          timeout=60, env=sdp.env(stats_dir))
        assert "error" not in (res.stdout + res.stderr).lower(), res.describe()
        assert f"{conc * n} keys by" in res.stdout, res.describe()
    st1 = _mc_stats(port)
    # memccp 1 + set test conc*n + get test preload n; memccat 1 + get test conc*n
    assert st1["cmd_set"] - st0["cmd_set"] == 1 + conc * n + n, (st0, st1)
    assert st1["get_hits"] - st0["get_hits"] == 1 + conc * n, (st0, st1)
    assert st1["get_misses"] - st0["get_misses"] == 0, (st0, st1)

    if not sdp.enabled:
        return
    cl = sdp.client_stats(stats_dir)
    comms = sorted({o.get("comm") for o in cl["objs"]})
    assert {"memccp", "memccat", "memcslap"} <= set(comms), f"stats files from {comms}"
    assert cl["sdp_conns"] >= 2 + 2 * conc and cl["tcp_conns"] == 0, f"libmemcached tools: {cl}"
    kit.assert_bytes_between("libmemcached tools SDP tx_bytes", cl["tx_bytes"], len(data))
    kit.assert_bytes_between("libmemcached tools SDP rx_bytes", cl["rx_bytes"], len(data))
    d = kit.delta(sdp.server_stats(memcached), before)
    assert d["sdp_conns"] >= 2 + 2 * conc, f"memcached SDP conns delta {d}"
    kit.assert_bytes_between("memcached SDP rx_bytes delta", d["rx_bytes"], len(data))
    kit.assert_bytes_between("memcached SDP tx_bytes delta", d["tx_bytes"], len(data))
