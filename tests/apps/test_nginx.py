"""nginx (master + 2 workers) under `sdp run`, with curl and wrk as clients
under `sdp run`.

Files of random bytes are downloaded with curl and compared by SHA-256, once
with `sendfile off` (read + write) and once with `sendfile on` (what most real
configurations use). wrk then loads one server for 10 s; no socket error and no
non-2xx response is accepted, and both worker processes must have served
requests over SDP. The access log records the worker pid of every request, so
the worker spread is checked in TCP mode too."""

import hashlib
import os
import re
import time

import pytest

SIZES = {"1k": 1 << 10, "64k": 64 << 10, "1m": 1 << 20, "16m": 16 << 20, "64m": 64 << 20}
WORKERS = 2
WRK_SECONDS = 10
WRK_CONNS = 100
WRK_THREADS = 2
WRK_FILE = "64k"


@pytest.fixture(scope="module")
def www(tmp_path_factory):
    d = tmp_path_factory.mktemp("www")
    digests = {}
    for name, size in SIZES.items():
        data = os.urandom(size)
        (d / f"{name}.bin").write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    return d, digests


def _nginx_conf(prefix, port, root, sendfile, user=None, upstream=None, reuseport=False):
    """user: the workers' user; default root when we are root (nginx's own
    default is to switch the workers to nobody: see test_nginx_workers_as_nobody)."""
    if user:
        user = f"user {user};\n"
    else:
        user = "user root;\n" if os.geteuid() == 0 else ""
    t = prefix / "tmp"
    if upstream:   # a reverse proxy with keep-alive connections to upstream
        ups = f"    upstream up {{ server {upstream}; keepalive 8; }}\n"
        loc = ("location / { proxy_pass http://up; proxy_http_version 1.1; "
               "proxy_set_header Connection \"\"; }")
    else:
        ups, loc = "", "location / { }"
    return f"""{user}worker_processes {WORKERS};
daemon off;
master_process on;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{
    worker_connections 4096;
}}
http {{
    log_format sdp '$pid $connection $connection_requests $status $body_bytes_sent $request_uri';
    access_log {prefix}/access.log sdp;
    client_body_temp_path {t}/body;
    proxy_temp_path {t}/proxy;
    fastcgi_temp_path {t}/fastcgi;
    uwsgi_temp_path {t}/uwsgi;
    scgi_temp_path {t}/scgi;
    default_type application/octet-stream;
    sendfile {sendfile};
    keepalive_timeout 65;
    keepalive_requests 1000000;
{ups}    server {{
        listen 127.0.0.1:{port}{" reuseport" if reuseport else ""};
        root {root};
        {loc}
    }}
}}
"""


class Nginx:
    def __init__(self, proc, port, prefix):
        self.proc, self.port, self.prefix = proc, port, prefix

    def master_and_workers(self, kit):
        nginx = [p for p in self.proc.pids() if kit.comm_of(p) == "nginx"]
        workers = [p for p in nginx if kit.comm_of(_ppid(p)) == "nginx"]
        masters = [p for p in nginx if p not in workers]
        return masters, workers

    def access_log(self):
        path = self.prefix / "access.log"
        rows = []
        if path.exists():
            for line in path.read_text().splitlines():
                f = line.split()
                if len(f) == 6:
                    rows.append(dict(pid=int(f[0]), conn=int(f[1]), status=int(f[3]),
                                     bytes=int(f[4]), uri=f[5]))
        return rows


def _ppid(pid):
    try:
        stat = open(f"/proc/{pid}/stat").read()
        return int(stat[stat.rfind(")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def _start_nginx(sdp, procs, kit, prefix, root, sendfile, user=None, name="nginx",
                 upstream=None, reuseport=False, env=None):
    (prefix / "tmp").mkdir()
    port = kit.free_port()
    conf = prefix / "nginx.conf"
    conf.write_text(_nginx_conf(prefix, port, root, sendfile, user, upstream, reuseport))
    proc = procs.start(
        sdp.wrap(["nginx", "-p", prefix, "-c", conf, "-e", prefix / "error.log"]),
        name=name, env=env or sdp.env())
    kit.wait_port(port, proc)
    srv = Nginx(proc, port, prefix)
    deadline = time.monotonic() + 20
    while True:
        masters, workers = srv.master_and_workers(kit)
        if len(masters) == 1 and len(workers) == WORKERS:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"nginx: expected 1 master and {WORKERS} workers, found "
                        f"{masters} / {workers}\n{proc.log_tail()}", pytrace=False)
        time.sleep(0.05)
    srv.master, srv.workers = masters[0], workers
    return srv


@pytest.fixture(scope="module")
def nginx_server(sdp, module_procs, kit, tmp_path_factory, www):
    """nginx_server(sendfile) -> Nginx, one server per setting, started once."""
    kit.require_bins("nginx", "curl", "wrk")
    root, _ = www
    servers = {}

    def get(sendfile):
        if sendfile not in servers:
            prefix = tmp_path_factory.mktemp(f"nginx-sendfile-{sendfile}")
            servers[sendfile] = _start_nginx(sdp, module_procs, kit, prefix, root, sendfile,
                                             name=f"nginx-sendfile-{sendfile}")
        return servers[sendfile]

    return get


@pytest.mark.parametrize("sendfile", ["off", "on"])
@pytest.mark.parametrize("name", list(SIZES))
def test_nginx_curl_download(name, sendfile, nginx_server, www, sdp, kit, tmp_path):
    srv = nginx_server(sendfile)
    _, digests = www
    size = SIZES[name]
    if sdp.enabled:
        before = sdp.server_stats(srv.proc)
    stats_dir = sdp.new_stats_dir("curl")
    out = tmp_path / "download.bin"
    res = kit.run_cmd(sdp.wrap(["curl", "-sS", "--fail", "--max-time", "45", "-o", out,
                                "-w", "%{http_code} %{size_download}",
                                f"http://127.0.0.1:{srv.port}/{name}.bin"]),
                      timeout=60, env=sdp.env(stats_dir))
    assert res.stdout.split() == ["200", str(size)], res.describe()
    data = out.read_bytes()
    assert len(data) == size, f"downloaded {len(data)} bytes of {size}"
    assert hashlib.sha256(data).hexdigest() == digests[name], \
        f"{name}.bin: downloaded bytes differ from the file (sendfile {sendfile})"

    if not sdp.enabled:
        return
    cl = sdp.client_stats(stats_dir, "curl")
    assert cl["sdp_conns"] >= 1 and cl["tcp_conns"] == 0, f"curl: {cl}"
    kit.assert_bytes_between("curl SDP rx_bytes", cl["rx_bytes"], size, kit.slack(size))
    kit.assert_bytes_between("curl SDP tx_bytes", cl["tx_bytes"], 40, 64 << 10)
    d = kit.delta(sdp.server_stats(srv.proc), before)
    assert d["sdp_conns"] >= 1, f"nginx SDP conns delta {d}"
    kit.assert_bytes_between("nginx SDP tx_bytes delta", d["tx_bytes"], size, kit.slack(size))


def _wrk_summary(text):
    m = re.search(r"(\d+) requests in ([\d.]+)(\w+), ([\d.]+)(\w+) read", text)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    sock = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    return dict(
        requests=int(m.group(1)) if m else None,
        rps=float(rps.group(1)) if rps else None,
        socket_errors=[int(x) for x in sock.groups()] if sock else [0, 0, 0, 0],
        non2xx=int(non2xx.group(1)) if non2xx else 0,
    )


def test_nginx_wrk(nginx_server, sdp, kit):
    srv = nginx_server("off")
    size = SIZES[WRK_FILE]
    uri = f"/{WRK_FILE}.bin"
    if sdp.enabled:
        before = {p: sdp.procs_stats([p]).get(p) for p in srv.workers}
        missing = [p for p, v in before.items() if v is None]
        assert not missing, f"sdp stat --procs does not list nginx workers {missing}"
    log_rows0 = len(srv.access_log())
    stats_dir = sdp.new_stats_dir("wrk")
    res = kit.run_cmd(sdp.wrap(["wrk", "-t", WRK_THREADS, "-c", WRK_CONNS,
                                "-d", f"{WRK_SECONDS}s", "--timeout", "10s",
                                f"http://127.0.0.1:{srv.port}{uri}"]),
                      timeout=WRK_SECONDS + 30, env=sdp.env(stats_dir))
    s = _wrk_summary(res.stdout)
    assert s["requests"] and s["requests"] > 0, f"wrk summary does not parse\n{res.describe()}"
    assert s["rps"] and s["rps"] > 0, res.describe()
    assert s["socket_errors"] == [0, 0, 0, 0], \
        f"wrk socket errors (connect, read, write, timeout) = {s['socket_errors']}\n{res.stdout}"
    assert s["non2xx"] == 0, f"wrk: {s['non2xx']} non-2xx/3xx responses\n{res.stdout}"

    # nginx's own account: every request wrk counted was answered 200 in full,
    # and both workers served some of them
    time.sleep(0.2)  # access log lines are written after the response
    rows = [r for r in srv.access_log()[log_rows0:] if r["uri"] == uri]
    ok = [r for r in rows if r["status"] == 200 and r["bytes"] == size]
    bad = [r for r in rows if r["status"] not in (200, 499)]
    assert not bad, f"nginx logged non-200 responses: {bad[:5]}"
    assert len(ok) >= s["requests"], \
        f"nginx logged {len(ok)} complete 200s, wrk counted {s['requests']} responses"
    # wrk stops with at most one request in flight per connection; those may
    # be logged with a partial body (or 499): nothing else may be incomplete
    cut = [r for r in rows if not (r["status"] == 200 and r["bytes"] == size)]
    assert len(cut) <= WRK_CONNS, f"{len(cut)} incomplete responses: {cut[:5]}"
    by_worker = {p: sum(1 for r in ok if r["pid"] == p) for p in srv.workers}
    assert all(n > 0 for n in by_worker.values()), \
        f"not every nginx worker served wrk requests: {by_worker}"
    assert {r["pid"] for r in rows} <= set(srv.workers), "request logged by an unknown pid"

    if not sdp.enabled:
        return
    cl = sdp.client_stats(stats_dir, "wrk")
    assert cl["sdp_conns"] >= WRK_CONNS, f"wrk: {cl}"
    assert cl["tcp_conns"] == 0, f"wrk fell back to TCP: {cl}"
    kit.assert_bytes_between("wrk SDP rx_bytes", cl["rx_bytes"], s["requests"] * size)
    after = sdp.procs_stats(srv.workers)
    for p in srv.workers:
        assert p in after, f"nginx worker {p} vanished from sdp stat --procs"
        d = kit.delta(after[p], before[p])
        assert d["sdp_conns"] > 0, \
            f"nginx worker {p} took no SDP connection during wrk (served {by_worker[p]} " \
            f"requests): {d}"
        kit.assert_bytes_between(f"nginx worker {p} SDP tx_bytes delta", d["tx_bytes"],
                                 by_worker[p] * size)


def _uid_of(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return -1


def test_nginx_workers_as_nobody(sdp, procs, kit, tmp_path):
    """nginx's default when started as root: the master stays root, the
    workers switch to nobody after the fork. They share the listener, so a
    worker puts back the hellos of connections another worker will accept;
    those come back from a process of another uid and must still be taken
    (else the client, already committed to SDP, waits forever). wrk opens
    100 connections at once; every one must be answered over SDP."""
    if os.geteuid() != 0:
        pytest.skip("needs root: nginx only switches its workers' user when started as root")
    kit.require_bins("nginx", "wrk")
    import pwd
    import grp
    nobody = pwd.getpwnam("nobody")
    group = grp.getgrgid(nobody.pw_gid).gr_name
    # a document root the workers can read (pytest's tmp is root-only)
    import tempfile
    root = tempfile.mkdtemp(prefix="sdp-www-")
    try:
        os.chmod(root, 0o755)
        with open(os.path.join(root, "1k.bin"), "wb") as fh:
            fh.write(os.urandom(1024))
        os.chmod(os.path.join(root, "1k.bin"), 0o644)
        srv = _start_nginx(sdp, procs, kit, tmp_path, root, "off",
                           user=f"{nobody.pw_name} {group}", name="nginx-nobody")
        uids = {p: _uid_of(p) for p in srv.workers}
        assert all(u == nobody.pw_uid for u in uids.values()), \
            f"nginx workers should run as {nobody.pw_name}: {uids}"
        if sdp.enabled:
            before = {p: sdp.procs_stats([p]).get(p) for p in srv.workers}
            missing = [p for p, v in before.items() if v is None]
            assert not missing, f"sdp stat --procs does not list nginx workers {missing}"
        stats_dir = sdp.new_stats_dir("wrk-nobody")
        res = kit.run_cmd(sdp.wrap(["wrk", "-t", WRK_THREADS, "-c", WRK_CONNS, "-d", "3s",
                                    "--timeout", "2s", f"http://127.0.0.1:{srv.port}/1k.bin"]),
                          timeout=40, env=sdp.env(stats_dir))
        s = _wrk_summary(res.stdout)
        assert s["requests"] and s["requests"] > 0, f"wrk summary does not parse\n{res.describe()}"
        assert s["socket_errors"] == [0, 0, 0, 0], \
            f"wrk socket errors (connect, read, write, timeout) = {s['socket_errors']}\n" \
            f"{res.stdout}\n{(tmp_path / 'error.log').read_text()[-2000:]}"
        assert s["non2xx"] == 0, f"wrk: {s['non2xx']} non-2xx/3xx responses\n{res.stdout}"
        if not sdp.enabled:
            return
        cl = sdp.client_stats(stats_dir, "wrk")
        assert cl["sdp_conns"] >= WRK_CONNS and cl["tcp_conns"] == 0, f"wrk: {cl}"
        after = sdp.procs_stats(srv.workers)
        took = {p: kit.delta(after[p], before[p]) for p in srv.workers}
        assert sum(d["sdp_conns"] for d in took.values()) >= WRK_CONNS, \
            f"the workers accepted fewer than {WRK_CONNS} connections over SDP: {took}"
        # (at most one TCP connection: the harness's plain port probe, which a
        # worker may accept only after the counters above were read)
        assert sum(d["tcp_conns"] for d in took.values()) <= 1, \
            f"the workers took wrk's connections as TCP: {took}"
    finally:
        import shutil
        shutil.rmtree(root, ignore_errors=True)


def test_nginx_workers_keep_the_calibration_cache(sdp, procs, kit, tmp_path, www):
    """nginx's workers clear their environment (only TZ is kept): the
    library must still use the calibration cache the master's environment
    named (SDP_CALIB_FILE here, HOME normally), not measure the host again
    into a cache of its own at every worker's first connection."""
    if not sdp.enabled:
        pytest.skip("the calibration cache is the library's")
    kit.require_bins("nginx", "curl")
    root, digests = www
    calib = tmp_path / "calib"
    env = dict(sdp.env(), SDP_CALIB_FILE=str(calib))
    (tmp_path / "ngx").mkdir()
    srv = _start_nginx(sdp, procs, kit, tmp_path / "ngx", root, "off", name="nginx-calib",
                       env=env)
    assert not calib.exists(), "the cache was made before any connection"
    before = sdp.server_stats(srv.proc)
    out = tmp_path / "1k.bin"
    res = kit.run_cmd(sdp.wrap(["curl", "-sS", "--fail", "--max-time", "20", "-o", out,
                                f"http://127.0.0.1:{srv.port}/1k.bin"]),
                      timeout=30, env=sdp.env())
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digests["1k"]
    d = kit.delta(sdp.server_stats(srv.proc), before)
    assert d["sdp_conns"] >= 1, f"nginx SDP conns delta {d}"
    # the worker that served it resolved its `auto` choices from the cache
    # the master was given, measuring the host into it
    assert calib.exists() and calib.read_text().startswith("sdp-calib"), \
        f"no calibration cache at {calib}: the worker looked elsewhere"


def test_nginx_reverse_proxy(nginx_server, www, sdp, procs, kit, tmp_path):
    """nginx as a reverse proxy (keep-alive upstream connections) in front
    of the static nginx, both under `sdp run`, curl and wrk as clients. nginx
    registers each upstream socket with epoll before it connects, so the
    connection becomes SDP after it was registered; the answer must still
    be seen. Every hop is SDP, every download byte-exact."""
    backend = nginx_server("off")
    root, digests = www
    proxy = _start_nginx(sdp, procs, kit, tmp_path, root, "off", name="nginx-proxy",
                         upstream=f"127.0.0.1:{backend.port}")
    if sdp.enabled:
        before = {p: sdp.procs_stats([p]).get(p) for p in proxy.workers}
        assert all(before.values()), f"sdp stat --procs does not list the proxy workers {before}"
    stats_dir = sdp.new_stats_dir("curl-proxy")
    for name in ("1k", "1m", "16m", "1k"):
        out = tmp_path / f"{name}.bin"
        res = kit.run_cmd(sdp.wrap(["curl", "-sS", "--fail", "--max-time", "20", "-o", out,
                                    "-w", "%{http_code} %{size_download}",
                                    f"http://127.0.0.1:{proxy.port}/{name}.bin"]),
                          timeout=30, env=sdp.env(stats_dir))
        assert res.stdout.split() == ["200", str(SIZES[name])], res.describe()
        assert hashlib.sha256(out.read_bytes()).hexdigest() == digests[name], \
            f"{name}.bin through the proxy differs from the file"
    wrk_dir = sdp.new_stats_dir("wrk-proxy")
    res = kit.run_cmd(sdp.wrap(["wrk", "-t", "2", "-c", "50", "-d", "2s", "--timeout", "2s",
                                f"http://127.0.0.1:{proxy.port}/1k.bin"]),
                      timeout=30, env=sdp.env(wrk_dir))
    s = _wrk_summary(res.stdout)
    assert s["requests"] and s["requests"] > 0, f"wrk summary does not parse\n{res.describe()}"
    assert s["socket_errors"] == [0, 0, 0, 0] and s["non2xx"] == 0, \
        f"wrk through the proxy: socket errors {s['socket_errors']}, non-2xx {s['non2xx']}\n" \
        f"{res.stdout}"
    if not sdp.enabled:
        return
    cl = sdp.client_stats(stats_dir, "curl")
    assert cl["sdp_conns"] >= 4 and cl["tcp_conns"] == 0, f"curl: {cl}"
    after = sdp.procs_stats(proxy.workers)
    d = [kit.delta(after[p], before[p]) for p in proxy.workers]
    # accepted from curl and wrk, plus at least one upstream connection
    assert sum(x["sdp_conns"] for x in d) >= 4 + 50 + 1, f"proxy workers: {d}"
    # (at most one TCP connection: the harness's plain port probe, which a
    # worker may accept only after the counters above were read)
    assert sum(x["tcp_conns"] for x in d) <= 1, f"proxy workers used TCP: {d}"
    kit.assert_bytes_between("proxy SDP rx_bytes (from upstream)", sum(x["rx_bytes"] for x in d),
                             (1 << 20) + (16 << 20) + 2 * 1024)


def test_nginx_reuseport(sdp, procs, kit, www, tmp_path):
    """`listen ... reuseport`: the master opens one SO_REUSEPORT socket per
    worker and the kernel spreads the connections over them. curl downloads
    are byte-exact, wrk gets every answer, every worker serves, and every
    connection of every worker is SDP."""
    kit.require_bins("nginx", "curl", "wrk")
    root, digests = www
    srv = _start_nginx(sdp, procs, kit, tmp_path, root, "off", name="nginx-reuseport",
                       reuseport=True)
    if sdp.enabled:
        before = {p: sdp.procs_stats([p]).get(p) for p in srv.workers}
        assert all(before.values()), f"sdp stat --procs does not list the workers {before}"
    stats_dir = sdp.new_stats_dir("curl-reuseport")
    for name in ("1k", "1m", "16m"):
        out = tmp_path / f"{name}.out"
        res = kit.run_cmd(sdp.wrap(["curl", "-sS", "--fail", "--max-time", "45", "-o", out,
                                    f"http://127.0.0.1:{srv.port}/{name}.bin"]),
                          timeout=60, env=sdp.env(stats_dir))
        assert res.returncode == 0, res.describe()
        assert hashlib.sha256(out.read_bytes()).hexdigest() == digests[name], \
            f"{name}.bin through nginx with reuseport differs from the file"
    log_rows0 = len(srv.access_log())
    wrk_dir = sdp.new_stats_dir("wrk-reuseport")
    res = kit.run_cmd(sdp.wrap(["wrk", "-t", WRK_THREADS, "-c", WRK_CONNS, "-d", "3s",
                                "--timeout", "5s", f"http://127.0.0.1:{srv.port}/1k.bin"]),
                      timeout=40, env=sdp.env(wrk_dir))
    s = _wrk_summary(res.stdout)
    assert s["requests"] and s["requests"] > 0, f"wrk summary does not parse\n{res.describe()}"
    assert s["socket_errors"] == [0, 0, 0, 0], \
        f"wrk socket errors (connect, read, write, timeout) = {s['socket_errors']}\n" \
        f"{res.stdout}\n{(tmp_path / 'error.log').read_text()[-2000:]}"
    assert s["non2xx"] == 0, f"wrk: {s['non2xx']} non-2xx/3xx responses\n{res.stdout}"
    time.sleep(0.2)  # access log lines are written after the response
    rows = srv.access_log()[log_rows0:]
    by_worker = {p: sum(1 for r in rows if r["pid"] == p) for p in srv.workers}
    assert all(n > 0 for n in by_worker.values()), \
        f"the kernel gave not every worker connections: {by_worker}"
    if not sdp.enabled:
        return
    cl = sdp.client_stats(stats_dir, "curl")
    assert cl["sdp_conns"] == 3 and cl["tcp_conns"] == 0, f"curl: {cl}"
    w = sdp.client_stats(wrk_dir, "wrk")
    assert w["sdp_conns"] >= WRK_CONNS and w["tcp_conns"] == 0, f"wrk: {w}"
    after = sdp.procs_stats(srv.workers)
    took = {p: kit.delta(after[p], before[p]) for p in srv.workers}
    assert all(d["sdp_conns"] > 0 for d in took.values()), \
        f"not every worker took SDP connections: {took}"
    # (at most one TCP connection: the harness's plain port probe)
    assert sum(d["tcp_conns"] for d in took.values()) <= 1, \
        f"the workers took connections as TCP: {took}"
    assert sum(d["sdp_conns"] for d in took.values()) >= WRK_CONNS + 3, took
