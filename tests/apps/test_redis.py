"""redis-server under `sdp run`, driven by redis-benchmark, redis-cli and a
small RESP client (python3), all of them under `sdp run` as well."""

import csv
import hashlib
import io
import json
import os
import re
import sys

import pytest

BENCH_CLIENTS = 50
BENCH_REQUESTS = 20000
BIG = 10 * 1024 * 1024


@pytest.fixture(scope="module")
def redis(sdp, module_procs, kit, tmp_path_factory):
    kit.require_bins("redis-server", "redis-cli", "redis-benchmark")
    d = tmp_path_factory.mktemp("redis")
    port = kit.free_port()
    conf = d / "redis.conf"
    conf.write_text("\n".join([
        f"port {port}",
        "bind 127.0.0.1",
        "protected-mode no",
        "daemonize no",
        'save ""',
        "appendonly no",
        f"dir {d}",
        'logfile ""',
        "maxclients 4000",
        "",
    ]))
    server = module_procs.start(sdp.wrap(["redis-server", conf]), name="redis-server",
                                env=sdp.env())
    kit.wait_port(port, server)
    server.port = port
    return server


def _server_before(sdp, server):
    return sdp.server_stats(server) if sdp.enabled else None


def _commandstats(kit, port):
    res = kit.run_cmd(["redis-cli", "-h", "127.0.0.1", "-p", port, "INFO", "commandstats"],
                      timeout=30)
    calls = {}
    for m in re.finditer(r"^cmdstat_(\w+):calls=(\d+)", res.stdout, re.M):
        calls[m.group(1)] = int(m.group(2))
    return calls


def test_redis_benchmark(redis, sdp, kit):
    port = redis.port
    before = _server_before(sdp, redis)
    calls0 = _commandstats(kit, port)

    stats_dir = sdp.new_stats_dir("redis-benchmark")
    res = kit.run_cmd(sdp.wrap(["redis-benchmark", "-h", "127.0.0.1", "-p", port,
                                "-t", "set,get", "-c", BENCH_CLIENTS, "-n", BENCH_REQUESTS,
                                "--csv"]),
                      timeout=90, env=sdp.env(stats_dir))
    assert not re.search(r"error|could not|refused|reset", res.stderr + res.stdout, re.I), \
        res.describe()
    rows = list(csv.reader(io.StringIO(res.stdout)))
    assert rows and rows[0][:2] == ["test", "rps"], f"unexpected redis-benchmark CSV\n{res.stdout}"
    rps = {r[0]: float(r[1]) for r in rows[1:] if r}
    assert set(rps) == {"SET", "GET"}, f"throughput lines: {rows}"
    for name, v in rps.items():
        assert v > 0, f"{name} throughput {v}"

    # every request really reached the server
    calls = _commandstats(kit, port)
    for cmd in ("set", "get"):
        got = calls.get(cmd, 0) - calls0.get(cmd, 0)
        assert got == BENCH_REQUESTS, f"server executed {got} {cmd.upper()} of {BENCH_REQUESTS}"

    if not sdp.enabled:
        return
    cl = sdp.client_stats(stats_dir, "redis-benchmark")
    assert cl["sdp_conns"] >= BENCH_CLIENTS, f"redis-benchmark: {cl}"
    assert cl["tcp_conns"] == 0, f"redis-benchmark fell back to TCP: {cl}"
    # SET requests are > 30 bytes each; replies are "+OK\r\n" and "$3\r\nxxx\r\n"
    kit.assert_bytes_between("redis-benchmark SDP tx_bytes", cl["tx_bytes"], BENCH_REQUESTS * 30)
    kit.assert_bytes_between("redis-benchmark SDP rx_bytes", cl["rx_bytes"],
                             BENCH_REQUESTS * (5 + 9))
    d = kit.delta(sdp.server_stats(redis), before)
    assert d["sdp_conns"] >= BENCH_CLIENTS, f"redis-server SDP conns delta {d}"
    kit.assert_bytes_between("redis-server SDP rx_bytes delta", d["rx_bytes"], BENCH_REQUESTS * 30)
    kit.assert_bytes_between("redis-server SDP tx_bytes delta", d["tx_bytes"],
                             BENCH_REQUESTS * (5 + 9))


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def test_redis_10mib_value(redis, sdp, kit, tmp_path):
    port = redis.port
    before = _server_before(sdp, redis)
    helper = kit.HELPERS / "resp_client.py"
    v1, v2 = os.urandom(BIG), os.urandom(BIG)
    f1, f2 = tmp_path / "v1.bin", tmp_path / "v2.bin"
    f1.write_bytes(v1)
    f2.write_bytes(v2)
    py_stats = sdp.new_stats_dir("resp-client")
    cli_stats = sdp.new_stats_dir("redis-cli")

    # python RESP client: SET big1, GET it back
    out1 = tmp_path / "py-get-big1.bin"
    kit.run_cmd(sdp.wrap([sys.executable, helper, port, f"set:big1:{f1}", f"get:big1:{out1}"]),
                timeout=60, env=sdp.env(py_stats))
    assert _sha(out1.read_bytes()) == _sha(v1), "GET big1 (python) differs from what was SET"

    # redis-cli: SET big2 from stdin (-x), then GET both values raw
    res = kit.run_cmd(sdp.wrap(["redis-cli", "-h", "127.0.0.1", "-p", port, "-x", "SET", "big2"]),
                      timeout=60, env=sdp.env(cli_stats), input=v2)
    assert res.stdout.strip() == "OK", res.describe()
    for key, want in (("big2", v2), ("big1", v1)):
        out = tmp_path / f"cli-get-{key}.bin"
        kit.run_cmd(sdp.wrap(["redis-cli", "-h", "127.0.0.1", "-p", port, "--raw", "GET", key]),
                    timeout=60, env=sdp.env(cli_stats), stdout_path=out)
        got = out.read_bytes()
        assert got.endswith(b"\n"), f"redis-cli --raw GET {key}: no trailing newline"
        got = got[:-1]
        assert len(got) == BIG, f"redis-cli GET {key}: {len(got)} bytes, expected {BIG}"
        assert _sha(got) == _sha(want), f"redis-cli GET {key} differs from the value SET"

    # python: GET the value redis-cli stored
    out2 = tmp_path / "py-get-big2.bin"
    res = kit.run_cmd(sdp.wrap([sys.executable, helper, port, f"get:big2:{out2}",
                                "strlen:big1", "strlen:big2"]),
                      timeout=60, env=sdp.env(py_stats))
    assert _sha(out2.read_bytes()) == _sha(v2), "GET big2 (python) differs from what was SET"
    lens = [json.loads(line) for line in res.stdout.splitlines() if line.strip()]
    assert [o["len"] for o in lens if o["op"] == "strlen"] == [BIG, BIG], lens

    if not sdp.enabled:
        return
    py = sdp.client_stats(py_stats)
    assert py["sdp_conns"] >= 2 and py["tcp_conns"] == 0, f"python RESP client: {py}"
    kit.assert_bytes_between("python client SDP tx_bytes", py["tx_bytes"], BIG, kit.slack(BIG))
    kit.assert_bytes_between("python client SDP rx_bytes", py["rx_bytes"], 2 * BIG,
                             kit.slack(2 * BIG))
    cli = sdp.client_stats(cli_stats, "redis-cli")
    assert cli["sdp_conns"] >= 3 and cli["tcp_conns"] == 0, f"redis-cli: {cli}"
    kit.assert_bytes_between("redis-cli SDP tx_bytes", cli["tx_bytes"], BIG, kit.slack(BIG))
    kit.assert_bytes_between("redis-cli SDP rx_bytes", cli["rx_bytes"], 2 * BIG,
                             kit.slack(2 * BIG))
    d = kit.delta(sdp.server_stats(redis), before)
    assert d["sdp_conns"] >= 5, f"redis-server SDP conns delta {d}"
    kit.assert_bytes_between("redis-server SDP rx_bytes delta", d["rx_bytes"], 2 * BIG,
                             kit.slack(2 * BIG))
    kit.assert_bytes_between("redis-server SDP tx_bytes delta", d["tx_bytes"], 4 * BIG,
                             kit.slack(4 * BIG))


CHURN_CLIENTS = 4
CHURN_REQUESTS = 2000


def test_redis_connection_churn(redis, sdp, kit):
    """redis-benchmark -k 0: a new connection for every request. Every one of
    them goes over SDP, and (under SDP) the connection memory is reused
    between redis-benchmark and redis-server instead of made anew."""
    port = redis.port
    before = _server_before(sdp, redis)
    calls0 = _commandstats(kit, port)
    stats_dir = sdp.new_stats_dir("redis-churn")
    res = kit.run_cmd(sdp.wrap(["redis-benchmark", "-h", "127.0.0.1", "-p", port,
                                "-t", "set", "-k", "0", "-c", CHURN_CLIENTS,
                                "-n", CHURN_REQUESTS, "--csv"]),
                      timeout=90, env=sdp.env(stats_dir))
    assert not re.search(r"error|could not|refused|reset", res.stderr + res.stdout, re.I), \
        res.describe()
    got = _commandstats(kit, port).get("set", 0) - calls0.get("set", 0)
    assert got == CHURN_REQUESTS, f"server executed {got} SET of {CHURN_REQUESTS}"
    if not sdp.enabled:
        return
    cl = sdp.client_stats(stats_dir, "redis-benchmark")
    # one connection per request (plus the benchmark's own set-up ones)
    assert cl["sdp_conns"] >= CHURN_REQUESTS, f"redis-benchmark: {cl}"
    assert cl["tcp_conns"] == 0, f"redis-benchmark fell back to TCP: {cl}"
    assert cl["regions_created"] == cl["sdp_conns"], f"redis-benchmark: {cl}"
    # A fresh slot only at an arena slot's first use: a client that
    # reconnects before the server let go of the last connection's slot
    # takes another slot, and a busy peer's arenas grow (8, 16, 32... slots,
    # ARCHITECTURE.md section 4), so a loaded host sees a few more than 8;
    # everything else is reused.
    assert cl["regions_reused"] >= cl["regions_created"] - 64, \
        f"connection memory was not reused: {cl}"
    d = kit.delta(sdp.server_stats(redis), before)
    assert d["sdp_conns"] >= CHURN_REQUESTS, f"redis-server SDP conns delta {d}"
    # one mapping per arena of the client's: its first, and each one a
    # busy peer's arenas grow by (at most 8 per peer, as above)
    assert d["mappings_reused"] >= d["regions_mapped"] - 8, \
        f"redis-server mapped the client's memory anew: {d}"


ORDER_ROUNDS = 1000


def test_redis_order_across_connections(redis, sdp, kit):
    """Commands sent on different connections one after the other are served
    in that order (helpers/redis_order.py): blocked BLPOP and BRPOPLPUSH
    clients get their elements in the order they blocked, a WATCH sent
    before another client's SET makes the EXEC fail, an UNSUBSCRIBE sent
    before another client's PUBLISH keeps the message away. Kernel TCP, the
    same helper without `sdp run` against the same server, is the oracle:
    the SDP client may not be served out of order noticeably more often."""
    port = redis.port
    helper = kit.HELPERS / "redis_order.py"
    res = kit.run_cmd([sys.executable, helper, port, ORDER_ROUNDS], timeout=120)
    tcp = json.loads(res.stdout)
    before = _server_before(sdp, redis)
    stats_dir = sdp.new_stats_dir("redis-order")
    res = kit.run_cmd(sdp.wrap([sys.executable, helper, port, ORDER_ROUNDS]),
                      timeout=120, env=sdp.env(stats_dir))
    got = json.loads(res.stdout)
    assert set(got) == set(tcp) == {"blpop", "brpoplpush", "watch", "unsubscribe"}, got
    for pattern, n in got.items():
        assert n <= 2 * tcp[pattern] + 2, \
            f"{pattern}: served out of order in {n} of {ORDER_ROUNDS} rounds, " \
            f"kernel TCP: {tcp[pattern]} (all: {got}, TCP: {tcp})"

    if not sdp.enabled:
        return
    # 4 + 4 connections for the blocking patterns, 2 + 2 for the others
    cl = sdp.client_stats(stats_dir)
    assert cl["sdp_conns"] >= 12 and cl["tcp_conns"] == 0, f"redis_order.py: {cl}"
    d = kit.delta(sdp.server_stats(redis), before)
    assert d["sdp_conns"] >= 12, f"redis-server SDP conns delta {d}"
