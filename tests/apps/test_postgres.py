"""PostgreSQL (Debian's) under `sdp run`, with its own clients under `sdp run`:
a forking server (one backend process per connection, each waiting in
epoll with its latch), psql moving 16 MiB in and out with COPY (checked by
SHA-256), and pgbench: select-only with 8 clients, then a new connection
for every transaction (-C: a backend forked per connection, many hundreds).

PostgreSQL refuses to run as root: server and clients run as the
`postgres` user the package creates (SDP joins processes of one user only),
in a directory of their own."""

import glob
import hashlib
import os
import pwd
import re
import shutil
import tempfile
from pathlib import Path

import pytest

ROWS = 16 * 1024          # 1 KiB of text per row: 16 MiB each way


def _pg_bin():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    assert found, "PostgreSQL is not installed: run scripts/install-deps.sh"
    return Path(found[-1]).parent


def _as_pg(argv):
    return ["runuser", "-u", "postgres", "--", *[str(a) for a in argv]]


@pytest.fixture(scope="module")
def pg(sdp, module_procs, kit):
    kit.require_bins("runuser")
    bindir = _pg_bin()
    pw = pwd.getpwnam("postgres")
    top = Path(tempfile.mkdtemp(prefix="sdp-pg-", dir="/tmp"))
    os.chmod(top, 0o755)
    os.chown(top, pw.pw_uid, pw.pw_gid)
    data = top / "data"
    kit.run_cmd(_as_pg([bindir / "initdb", "-D", data, "-A", "trust", "-U", "postgres",
                        "--no-sync"]), timeout=120, env=sdp.env())
    # backends are short-lived processes: each writes its counters at exit
    sst = top / "st-server"
    sst.mkdir()
    os.chmod(sst, 0o777)
    port = kit.free_port()
    argv = [bindir / "postgres", "-D", data, "-k", top, "-p", port,
            "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=100",
            "-c", "fsync=off", "-c", "synchronous_commit=off"]
    server = module_procs.start(_as_pg(sdp.wrap(argv)), name="postgres", env=sdp.env(sst))
    kit.wait_port(port, server)
    server.port = port
    server.bindir = bindir
    server.top = top
    server.stats_dir = sst
    yield server
    server.stop()
    shutil.rmtree(top, ignore_errors=True)


def _backends(sdp, pg):
    """(SDP, TCP) connections the server accepted: the postmaster accepts
    each one before it forks its backend (live counters of its processes,
    plus the exit-time ones of those that ended)."""
    if not sdp.enabled:
        return 0, 0
    live = sdp.server_stats(pg)
    objs = sdp.read_stats_dir(pg.stats_dir)
    return (live["sdp_conns"] + sum(o.get("sdp_conns", 0) for o in objs),
            live["tcp_conns"] + sum(o.get("tcp_conns", 0) for o in objs))


def _stats_dir(pg, name):
    d = Path(tempfile.mkdtemp(prefix=f"st-{name}-", dir=pg.top))
    os.chmod(d, 0o777)
    return d


def _client(pg, sdp, kit, stats_dir, prog, *args, timeout=120, stdin=None):
    argv = _as_pg(sdp.wrap([pg.bindir / prog, "-h", "127.0.0.1", "-p", pg.port,
                            "-U", "postgres", *args]))
    return kit.run_cmd(argv, timeout=timeout, env=sdp.env(stats_dir), input=stdin)


def _psql(pg, sdp, kit, stats_dir, sql, stdin=None):
    return _client(pg, sdp, kit, stats_dir, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                   "-At", "-d", "postgres", "-c", sql, stdin=stdin)


def test_postgres_copy_in_and_out(pg, sdp, kit):
    before = _backends(sdp, pg)
    st = _stats_dir(pg, "psql")
    seed = os.urandom(8).hex()
    rows = [f"{i}\t{hashlib.sha512(f'{seed}:{i}'.encode()).hexdigest() * 8}\n"
            for i in range(ROWS)]
    data = "".join(rows).encode()
    _psql(pg, sdp, kit, st, "drop table if exists blob; create table blob (i int, t text)")
    _psql(pg, sdp, kit, st, "copy blob from stdin", stdin=data)
    res = _psql(pg, sdp, kit, st, "copy (select * from blob order by i) to stdout")
    assert len(res.stdout_b) == len(data), f"COPY out: {len(res.stdout_b)} of {len(data)} bytes"
    assert hashlib.sha256(res.stdout_b).digest() == hashlib.sha256(data).digest(), \
        "COPY out differs from what COPY in stored"
    # the server's own view of the same bytes
    res = _psql(pg, sdp, kit, st, "select count(*), sum(length(t)) from blob")
    assert res.stdout.strip() == f"{ROWS}|{ROWS * 1024}", res.describe()

    if not sdp.enabled:
        return
    cl = sdp.client_stats(st)
    assert cl["sdp_conns"] >= 4 and cl["tcp_conns"] == 0, f"psql: {cl}"
    kit.assert_bytes_between("psql SDP tx_bytes", cl["tx_bytes"], len(data))
    kit.assert_bytes_between("psql SDP rx_bytes", cl["rx_bytes"], len(data))
    after = _backends(sdp, pg)
    assert after[0] - before[0] >= 4 and after[1] == before[1], \
        f"postgres backends (SDP, TCP connections): {before} -> {after}"


def _pgbench_ok(res, clients):
    out = res.stdout + res.stderr
    m = re.search(r"number of transactions actually processed: (\d+)", out)
    assert m and int(m.group(1)) > 0, res.describe()
    assert re.search(r"number of failed transactions: 0 \(", out), res.describe()
    assert f"number of clients: {clients}" in out, res.describe()
    return int(m.group(1))


def test_postgres_pgbench(pg, sdp, kit):
    st = _stats_dir(pg, "pgbench")
    _client(pg, sdp, kit, st, "pgbench", "-i", "-q", "-s", "2", "postgres")
    res = _psql(pg, sdp, kit, st, "select count(*), sum(aid) from pgbench_accounts")
    n = 200000
    assert res.stdout.strip() == f"{n}|{n * (n + 1) // 2}", res.describe()

    before = _backends(sdp, pg)
    # 8 clients, 2 threads, select-only, 5 s
    res = _client(pg, sdp, kit, st, "pgbench", "-S", "-c", "8", "-j", "2", "-T", "5",
                  "postgres")
    _pgbench_ok(res, 8)
    # a new connection (a forked backend) for every transaction
    res = _client(pg, sdp, kit, st, "pgbench", "-S", "-C", "-c", "4", "-j", "2", "-t", "100",
                  "postgres")
    done = _pgbench_ok(res, 4)
    assert done == 400, res.describe()
    # every balance still adds up after the select-only runs
    res = _psql(pg, sdp, kit, st, "select sum(abalance) from pgbench_accounts")
    assert res.stdout.strip() == "0", res.describe()

    if not sdp.enabled:
        return
    cl = sdp.client_stats(st, comm="pgbench")
    assert cl["sdp_conns"] >= 8 + 400 and cl["tcp_conns"] == 0, f"pgbench: {cl}"
    after = _backends(sdp, pg)
    assert after[0] - before[0] >= 8 + 400 and after[1] == before[1], \
        f"postgres backends (SDP, TCP connections): {before} -> {after}"
