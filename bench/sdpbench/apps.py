"""Real applications under every configuration: iperf3, sockperf,
redis-benchmark, nginx + wrk, a three-tier data center (nginx reverse
proxy -> two sdp-appserver application servers -> redis, driven by wrk),
and PostgreSQL with pgbench."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

from . import cpu as cpumod
from .core import Ctx, Experiment, Metric, Sample, fail
from .procs import Proc, free_port, run_client, wait_listening

K = 1024
M = 1024 * 1024

WRK_LUA = r"""
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,' ..
    '"err_connect":%d,"err_read":%d,"err_write":%d,"err_status":%d,"err_timeout":%d,' ..
    '"mean_us":%f,"max_us":%d,"cdf":[',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency.mean, latency.max))
  local ps = {1,5,10,20,30,40,50,60,70,75,80,85,90,95,97.5,99,99.5,99.9,99.99}
  for i, p in ipairs(ps) do
    if i > 1 then io.write(",") end
    io.write(string.format("[%g,%d]", p, latency:percentile(p)))
  end
  io.write(string.format(',[100,%d]]}\n', latency.max))
end
"""


# The data center's script also records each response time as it was:
# wrk corrects its own histogram for coordinated omission (stats_correct:
# every response slower than runtime / (requests per connection) adds
# copies of itself, less one interval each, down to that interval), so a
# few hundred slow first requests of a start-up burst become several per
# cent of its samples. Each request carries its send time (CLOCK_MONOTONIC,
# us) in `X-Q`; nginx sends it back (add_header X-Q $http_x_q) and the
# response's arrival closes the sample. Buckets of 100 us.
WRK_LUA_RECORDED = r"""
local ffi = require("ffi")
ffi.cdef[[ typedef struct { long tv_sec; long tv_nsec; } sdpb_ts; int clock_gettime(int, sdpb_ts *); ]]
local ts = ffi.new("sdpb_ts")
local function now_us()
  ffi.C.clock_gettime(1, ts)
  return tonumber(ts.tv_sec) * 1000000 + math.floor(tonumber(ts.tv_nsec) / 1000)
end
local threads = {}
setup = function(thread) table.insert(threads, thread) end
rec = {}
request = function()
  return wrk.format(nil, nil, {["X-Q"] = tostring(now_us())})
end
response = function(status, headers, body)
  local q = tonumber(headers["X-Q"])
  if q then
    local b = math.floor((now_us() - q) / 100)
    rec[b] = (rec[b] or 0) + 1
  end
end
""" + WRK_LUA.replace("done = function(summary, latency, requests)", """done = function(summary, latency, requests)
  local all, n, keys = {}, 0, {}
  for _, t in ipairs(threads) do
    for b, c in pairs(t:get("rec")) do
      if all[b] == nil then table.insert(keys, b) end
      all[b] = (all[b] or 0) + c
      n = n + c
    end
  end
  table.sort(keys)
  local ps, out, acc, i = {50, 90, 99, 99.9}, {}, 0, 1
  for _, b in ipairs(keys) do
    acc = acc + all[b]
    while i <= #ps and acc >= ps[i] / 100 * n do
      table.insert(out, string.format("[%g,%d]", ps[i], b * 100 + 50))
      i = i + 1
    end
  end
  io.write('WRKREC {"n":' .. n .. ',"cdf":[' .. table.concat(out, ",") .. ']}\\n')""")


def _tail(text, n=200):
    return (text or "").strip().replace("\n", " | ")[-n:]


def _pick(mode, full, quick, tiny):
    return {"full": full, "quick": quick, "tiny": tiny}[mode]


def libsdp_loaded(pids: list[int]) -> bool | None:
    """True if every process maps libsdp (None: nothing to look at)."""
    seen = False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as fh:
                maps = fh.read()
        except OSError:
            continue
        seen = True
        if "libsdp" not in maps:
            return False
    return True if seen else None


class Servers:
    """The server side of one application run: processes started under a
    configuration, their CPU, and whether libsdp is in all of them."""

    def __init__(self, ctx: Ctx, cfg):
        self.ctx, self.cfg = ctx, cfg
        self.procs: list[Proc] = []
        self.cpu = None

    def start(self, argv, port: int, name: str, ready_timeout: float = 15.0, cwd=None) -> Proc:
        p = Proc(self.cfg.wrap(argv, "server", self.ctx), env=self.cfg.environ(), cwd=cwd, name=name)
        self.procs.append(p)
        if not wait_listening(p.pid, port, ready_timeout):
            raise RuntimeError(f"{name} did not listen on port {port}: "
                               + _tail(p.stderr() or p.stdout()))
        return p

    def pids(self) -> list[int]:
        stats = cpumod.all_stats()
        out = []
        for p in self.procs:
            out += cpumod.descendants(p.pid, stats)
        return out

    def begin(self):
        self.cpu = cpumod.TreeCPU([p.pid for p in self.procs])
        self.cpu.start()
        self.loaded = libsdp_loaded(self.pids())

    def end(self) -> float:
        return self.cpu.stop() if self.cpu else 0.0

    def stop(self):
        for p in reversed(self.procs):
            p.stop()

    def transport(self) -> tuple[str, bool, str | None]:
        if self.cfg.kind == "sdp":
            if self.loaded:
                return "sdp-preloaded", True, None
            return "tcp", False, "libsdp.so not mapped in every server process"
        if self.loaded:
            return "sdp-preloaded", False, "libsdp.so mapped in a kernel-TCP configuration"
        return "tcp", True, None


def _port(ctx, cfg) -> int:
    return free_port()


def _app_sample(srv: Servers, cres, secs, metrics, nbytes=None, extra=None) -> Sample:
    scpu = srv.end()
    t, ok, why = srv.transport()
    return Sample(ok=True, reason=why, metrics=metrics,
                  cpu_client=cres.cpu / secs if secs else None,
                  cpu_server=scpu / secs if secs else None, bytes=nbytes, seconds=secs,
                  transport=t, transport_ok=ok, extra=extra or {})


class AppExperiment(Experiment):
    kind = "app"

    # The applications run for seconds each: in --quick one run per point
    # and no warm-up keep the whole suite within its time budget.
    def reps_for(self, ctx: Ctx) -> int:
        return 1 if ctx.mode == "quick" else ctx.reps

    def warmup_for(self, ctx: Ctx) -> bool:
        return ctx.mode == "full"


class Iperf3(AppExperiment):
    name = "iperf3"
    title = "iperf3 throughput"
    reproduces = "000 §3 (iperf), 002 Fig 1b"
    description = ("iperf3 server and client (one stream, and 4 parallel streams) for a fixed "
                   "time; receiver bandwidth and the CPU of both processes.")
    metrics = [Metric("gbps", "Gbit/s", "bandwidth (receiver)", "higher")]
    primary = "gbps"
    needs = ("iperf3",)
    xparam = None

    def params(self, mode):
        return [{"streams": s} for s in _pick(mode, [1, 4], [1], [1])]

    def run(self, ctx, cfg, p):
        port = _port(ctx, cfg)
        srv = Servers(ctx, cfg)
        try:
            srv.start(["iperf3", "-s", "-1", "-p", str(port), "-B", cfg.server_addr], port, "iperf3 -s")
            args = ["iperf3", "-c", cfg.server_addr, "-p", str(port), "-J", "-P", str(p["streams"])]
            args += ["-t", str(ctx.app_dur)] if ctx.mode != "tiny" else ["-n", "256M"]
            srv.begin()
            res = run_client(cfg.wrap(args, "client", ctx), cfg.environ(), timeout=ctx.app_dur * 3 + 30)
            try:
                j = json.loads(res.stdout)
            except ValueError:
                return fail(f"iperf3 client (exit {res.rc}): " + _tail(res.stderr or res.stdout))
            if j.get("error"):
                return fail("iperf3: " + str(j["error"]))
            end = j.get("end", {})
            rcv = end.get("sum_received", {})
            secs = rcv.get("seconds") or res.wall
            cu = end.get("cpu_utilization_percent", {})
            return _app_sample(srv, res, secs, {"gbps": rcv.get("bits_per_second", 0) / 1e9},
                               nbytes=rcv.get("bytes"),
                               extra={"iperf3_cpu_percent": {"client": cu.get("host_total"),
                                                             "server": cu.get("remote_total")}})
        finally:
            srv.stop()


# sockperf keeps a send-time table sized for the message rate it expects:
# in ping-pong, --mps=max (its default) means 600,000 messages/s, which a
# round trip shorter than 1.67 us overruns ("_seqN > m_maxSequenceNo") -
# SDP's is about 0.5 us. An explicit rate sizes the table for it (128 MB
# of sockperf's memory at 4 M/s for a 1 s run); as no round trip is that
# short, sockperf never has to hold a message back to keep to it.
SOCKPERF_MPS = 4_000_000


class Sockperf(AppExperiment):
    name = "sockperf"
    title = "sockperf ping-pong latency"
    reproduces = "002 Fig 1a, 003 Fig 5 (with an independent tool)"
    description = ("sockperf server (sr) and ping-pong client over TCP; one-way latency "
                   f"(--mps={SOCKPERF_MPS}: sockperf's table sized for SDP's rate).")
    metrics = [Metric("p50_us", "us", "one-way latency p50", "lower"),
               Metric("p99_us", "us", "one-way latency p99", "lower"),
               Metric("mean_us", "us", "one-way latency mean", "lower")]
    primary = "p50_us"
    needs = ("sockperf",)
    xparam = None

    def params(self, mode):
        return [{"size": s} for s in _pick(mode, [64], [64], [64])]

    def run(self, ctx, cfg, p):
        port = _port(ctx, cfg)
        srv = Servers(ctx, cfg)
        try:
            srv.start(["sockperf", "sr", "--tcp", "-i", cfg.server_addr, "-p", str(port)], port,
                      "sockperf sr")
            t = 1   # plus sockperf's own 0.4 s warm-up and its start-up
            args = ["sockperf", "pp", "--tcp", "-i", cfg.server_addr, "-p", str(port),
                    "-t", str(t), "-m", str(p["size"]), f"--mps={SOCKPERF_MPS}"]
            srv.begin()
            res = run_client(cfg.wrap(args, "client", ctx), cfg.environ(), timeout=t * 3 + 30)
            text = re.sub(r"\x1b\[[0-9;]*m", "", res.stdout + "\n" + res.stderr)
            avg = re.search(r"avg-latency=([\d.]+)", text)
            p50 = re.search(r"percentile 50\.000 =\s*([\d.]+)", text)
            p99 = re.search(r"percentile 99\.000 =\s*([\d.]+)", text)
            run = re.search(r"\[Valid Duration\] RunTime=([\d.]+)", text)
            if "m_maxSequenceNo" in text:
                return fail("sockperf's message table overflowed: the round trip is shorter "
                            f"than --mps={SOCKPERF_MPS} allows for: " + _tail(text))
            if not (avg and p50 and p99):
                return fail(f"sockperf gave no statistics (exit {res.rc}): " + _tail(text))
            secs = float(run.group(1)) if run else res.wall
            return _app_sample(srv, res, res.wall, {"p50_us": float(p50.group(1)),
                                                    "p99_us": float(p99.group(1)),
                                                    "mean_us": float(avg.group(1))},
                               extra={"valid_seconds": secs})
        finally:
            srv.stop()


class Redis(AppExperiment):
    name = "redis"
    title = "redis-benchmark GET/SET"
    reproduces = "002 §5, 003 §VI (the database tier on its own)"
    description = ("redis-server and redis-benchmark (50 and 600 clients, SET and GET); "
                   "requests per second.")
    metrics = [Metric("get_rps", "req/s", "GET requests per second", "higher"),
               Metric("set_rps", "req/s", "SET requests per second", "higher"),
               Metric("get_p99_ms", "ms", "GET latency p99", "lower")]
    primary = "get_rps"
    needs = ("redis-server", "redis-benchmark")
    xparam = None

    def params(self, mode):
        return [{"clients": c, "value_size": s}
                for c in _pick(mode, [50, 600], [50, 600], [50])
                for s in _pick(mode, [64, 4096], [64], [64])]

    def run(self, ctx, cfg, p):
        port = _port(ctx, cfg)
        srv = Servers(ctx, cfg)
        clients = p.get("clients", 50)
        # 600 clients get 3x the requests: still 100+ per client in --quick
        n = _pick(ctx.mode, 50000, 20000, 2000) * (3 if clients > 50 else 1)
        try:
            srv.start(["redis-server", "--port", str(port), "--bind", cfg.server_addr,
                       "--save", "", "--appendonly", "no", "--protected-mode", "no",
                       "--dir", ctx.tmp], port, "redis-server")
            args = ["redis-benchmark", "-h", cfg.server_addr, "-p", str(port), "-c", str(clients),
                    "-n", str(n), "-d", str(p["value_size"]), "-t", "set,get", "--csv"]
            srv.begin()
            res = run_client(cfg.wrap(args, "client", ctx), cfg.environ(), timeout=60)
            vals = {}
            for line in res.stdout.splitlines():
                cols = [c.strip('"') for c in line.split(",")]
                if len(cols) >= 7 and cols[0] in ("SET", "GET"):
                    try:
                        vals[cols[0]] = (float(cols[1]), float(cols[6]))
                    except ValueError:
                        pass
            if "GET" not in vals or "SET" not in vals:
                return fail(f"redis-benchmark gave no results (exit {res.rc}): "
                            + _tail(res.stderr or res.stdout))
            return _app_sample(srv, res, res.wall, {"get_rps": vals["GET"][0],
                                                    "set_rps": vals["SET"][0],
                                                    "get_p99_ms": vals["GET"][1]})
        finally:
            srv.stop()


def _nginx_conf(tmp: str, listen: str, body: str, workers: int = 1) -> str:
    for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        os.makedirs(os.path.join(tmp, d), exist_ok=True)
    # Started as root, nginx runs its workers as nobody unless told: the
    # workers would then be another user than the other tiers, and SDP is
    # only used between processes of one user (every hop would be TCP).
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""
{user}daemon off;
master_process on;
worker_processes {workers};
worker_rlimit_nofile 8192;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile off;
    tcp_nopush off;
    keepalive_requests 1000000;
    keepalive_timeout 60;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    default_type application/octet-stream;
{body}
    server {{
        listen {listen};
        LOCATIONS
    }}
}}
"""


def _wrk(ctx, cfg, url: str, conns: int, threads: int, dur: int, script: str):
    args = ["wrk", "-t", str(threads), "-c", str(conns), "-d", f"{dur}s", "--timeout", "5s",
            "-s", script, url]
    res = run_client(cfg.wrap(args, "client", ctx), cfg.environ(), timeout=dur * 3 + 30)
    j = rec = None
    for line in res.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        if tag in ("WRKJSON", "WRKREC"):
            try:
                v = json.loads(rest)
            except ValueError:
                continue
            if tag == "WRKJSON":
                j = v
            else:
                rec = v
    if j is not None and rec is not None:
        j["recorded"] = rec
    return res, j


def _tcp_counters(cfg) -> dict | None:
    """The kernel's TCP counters that mark connection set-ups the server
    side dropped (`ListenOverflows`: a full accept queue; `TCPSynRetrans`:
    SYNs the client had to send again, 1 s then 3 s later), read in the
    server's network namespace. Under load these, not the transport, can
    make the latency tail: compare them between configurations."""
    argv = ["cat", "/proc/net/netstat"]
    if cfg.server_ns:
        argv = ["ip", "netns", "exec", cfg.server_ns] + argv
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [ln.split() for ln in out.splitlines() if ln.startswith("TcpExt:")]
    if len(lines) < 2:
        return None
    row = dict(zip(lines[0][1:], lines[1][1:]))
    try:
        return {"listen_overflows": int(row["ListenOverflows"]),
                "syn_retrans": int(row["TCPSynRetrans"])}
    except (KeyError, ValueError):
        return None


def _wrk_metrics(j: dict) -> tuple[dict, dict, float]:
    secs = j["duration_us"] / 1e6
    cdf = j.get("cdf", [])
    pct = {p: v for p, v in cdf}
    errors = j["err_connect"] + j["err_read"] + j["err_write"] + j["err_status"] + j["err_timeout"]
    m = {"rps": j["requests"] / secs if secs else None,
         "mbytes_per_s": j["bytes"] / secs / 1e6 if secs else None,
         "p50_ms": pct.get(50, 0) / 1000.0, "p99_ms": pct.get(99, 0) / 1000.0}
    extra = {"latency_cdf_us": cdf, "errors": errors, "requests": j["requests"],
             "mean_latency_us": j.get("mean_us")}
    # Little's law: requests in flight on average. A closed-loop generator
    # with C connections should keep about C requests in flight; far fewer
    # means most connections were stuck (they do not show up as errors).
    if secs and j.get("mean_us"):
        extra["in_flight"] = j["requests"] / secs * j["mean_us"] / 1e6
    rec = j.get("recorded") or {}
    if rec.get("n"):
        rp = {p: v for p, v in rec.get("cdf", [])}
        for p, k in ((50, "rec_p50_ms"), (99, "rec_p99_ms")):
            if p in rp:
                extra[k] = rp[p] / 1000.0
    return m, extra, secs


def _check_wrk(s: Sample, j: dict, extra: dict, conns: int) -> Sample:
    if extra["errors"] > 0.01 * max(j["requests"], 1) or not j["requests"]:
        s.transport_ok = False
        s.reason = f"wrk: {extra['errors']} errors in {j['requests']} requests"
    elif extra.get("in_flight") is not None and extra["in_flight"] < 0.25 * conns:
        s.transport_ok = False
        s.reason = (f"only ~{extra['in_flight']:.0f} of {conns} connections had a request in "
                    f"flight on average (requests/s × mean latency): the others waited, so "
                    f"wrk's latencies do not show the real response time")
    return s


class Nginx(AppExperiment):
    name = "nginx"
    title = "nginx static files with wrk"
    reproduces = "002 Fig 4a/5a (static content), 003 §VI"
    description = ("nginx (1 worker, sendfile off so that every byte goes through the socket "
                   "API) serves one static file; wrk with 10 keep-alive connections. "
                   "Requests per second, transfer rate and latency.")
    metrics = [Metric("rps", "req/s", "requests per second", "higher"),
               Metric("mbytes_per_s", "MB/s", "transfer rate", "higher"),
               Metric("p50_ms", "ms", "latency p50", "lower"),
               Metric("p99_ms", "ms", "latency p99", "lower")]
    primary = "rps"
    needs = ("nginx", "wrk")
    xparam = "file_size"
    logx = True
    logy = True
    cpu_bars = "total"

    def params(self, mode):
        return [{"file_size": s} for s in _pick(mode, [K, 64 * K, M], [16 * K], [K])]

    def setup(self, ctx):
        self.www = os.path.join(ctx.tmp, "www")
        os.makedirs(self.www, exist_ok=True)
        for s in (K, 16 * K, 64 * K, 256 * K, M):
            with open(os.path.join(self.www, f"f{s}"), "wb") as fh:
                fh.write(bytes((i * 7) & 0xFF for i in range(s)))
        self.lua = os.path.join(ctx.tmp, "wrk-cdf.lua")
        with open(self.lua, "w") as fh:
            fh.write(WRK_LUA)

    def run(self, ctx, cfg, p):
        port = _port(ctx, cfg)
        tmp = os.path.join(ctx.tmp, f"nginx-{cfg.name}")
        os.makedirs(tmp, exist_ok=True)
        conf = _nginx_conf(tmp, f"{cfg.server_addr}:{port}", "").replace(
            "LOCATIONS", f"location / {{ root {self.www}; }}")
        cpath = os.path.join(tmp, "nginx.conf")
        with open(cpath, "w") as fh:
            fh.write(conf)
        srv = Servers(ctx, cfg)
        try:
            srv.start(["nginx", "-c", cpath, "-p", tmp, "-e", os.path.join(tmp, "error.log")],
                      port, "nginx")
            srv.begin()
            res, j = _wrk(ctx, cfg, f"http://{cfg.server_addr}:{port}/f{p['file_size']}",
                          conns=10, threads=1, dur=ctx.app_dur, script=self.lua)
            if j is None:
                return fail(f"wrk gave no results (exit {res.rc}): " + _tail(res.stderr or res.stdout))
            m, extra, secs = _wrk_metrics(j)
            s = _app_sample(srv, res, secs, m, nbytes=j["bytes"], extra=extra)
            return _check_wrk(s, j, extra, 10)
        finally:
            srv.stop()


class DataCenter(AppExperiment):
    name = "datacenter"
    title = "Three-tier data center: nginx proxy -> 2 app servers -> redis"
    reproduces = "002 §5 (Figs 4-7), 003 §VI (Figs 9-12: 50 vs 600 connections, latency CDF)"
    description = ("wrk drives an nginx reverse proxy (keep-alive to its upstreams) in front of "
                   "two sdp-appserver processes, each reading one redis item (1 KiB) per "
                   "request and answering with an HTML page; 50 and 600 client connections. "
                   "All tiers run under the configuration (veth: the tiers in the server "
                   "namespace, wrk in the client namespace). Requests per second and the "
                   "latency distribution.")
    metrics = [Metric("rps", "req/s", "requests per second", "higher"),
               Metric("p50_ms", "ms", "latency p50", "lower"),
               Metric("p99_ms", "ms", "latency p99", "lower")]
    primary = "rps"
    needs = ("nginx", "wrk", "redis-server")
    xparam = None
    report_note = ("The plot's right panel is the complementary CDF of the response time "
                   "(fraction of requests slower than t), as in paper 003 Fig 10.")
    extra_stats = ("syn_retrans", "listen_overflows", "rec_p50_ms", "rec_p99_ms")

    def report_extra(self, rows):
        """Per configuration and connection count: each request's recorded
        response time (p50, p99; wrk's own percentiles are corrected for
        coordinated omission, WRK_LUA_RECORDED), the requests in flight
        on average (requests/s x mean latency; a closed loop keeps about one
        per connection) and the connection set-ups the kernel dropped during
        the run (all tiers: wrk to nginx, nginx to the app servers, the app
        servers to redis): full accept queues and the SYNs sent again. A
        SYN sent again waits 1 s (then 3 s), so a run with many of them has
        a p99 of seconds whatever the transport."""
        def cell(st, fmt):
            if isinstance(st, (int, float)):
                return fmt.format(st)
            if not st:
                return "-"
            v = fmt.format(st["median"])
            if st["min"] != st["max"]:
                v += " [" + fmt.format(st["min"]) + "-" + fmt.format(st["max"]) + "]"
            return v
        L = ["Response times as recorded, and connection set-up under load (median "
             "[min-max] of the runs). wrk's p99 above is corrected for coordinated omission: "
             "each response slower than the run's time / requests per connection adds copies "
             "of itself, one interval shorter each, so a few hundred slow first requests of "
             "a start-up burst weigh several per cent. `recorded` is each request's own time "
             "(its send time echoed by nginx). Requests in flight: a closed loop keeps one per "
             "connection. SYNs sent again (each waits 1 s, then 3 s) and full accept queues: "
             "kernel counters of the server namespace, all tiers.", "",
             "| configuration | connections | p50 recorded (ms) | p99 recorded (ms) | in flight "
             "| SYNs sent again | accept queue full |",
             "|---|---|---|---|---|---|---|"]
        n = 0
        for r in rows:
            ex = r.get("extra") or {}
            if not r.get("available") or "syn_retrans" not in ex:
                continue
            L.append(f"| `{r['config']}` | {r['params'].get('conns')} | "
                     f"{cell(ex.get('rec_p50_ms'), '{:.1f}')} | "
                     f"{cell(ex.get('rec_p99_ms'), '{:.1f}')} | "
                     f"{cell(ex.get('in_flight'), '{:.0f}')} | "
                     f"{cell(ex.get('syn_retrans'), '{:.0f}')} | "
                     f"{cell(ex.get('listen_overflows'), '{:.0f}')} |")
            n += 1
        return L + [""] if n else []

    def params(self, mode):
        return [{"conns": c} for c in _pick(mode, [50, 600], [50, 600], [50])]

    def setup(self, ctx):
        self.lua = os.path.join(ctx.tmp, "wrk-cdf.lua")
        with open(self.lua, "w") as fh:
            fh.write(WRK_LUA_RECORDED)

    def run(self, ctx, cfg, p):
        if not os.path.exists(ctx.appserver):
            return fail(f"{ctx.appserver} not built")
        tmp = os.path.join(ctx.tmp, f"dc-{cfg.name}")
        os.makedirs(tmp, exist_ok=True)
        rport, a1, a2, nport = (free_port() for _ in range(4))
        conf = _nginx_conf(tmp, f"{cfg.server_addr}:{nport}",
                           f"    upstream app {{ server 127.0.0.1:{a1}; server 127.0.0.1:{a2}; "
                           f"keepalive 64; }}").replace(
            "LOCATIONS", "location / { proxy_pass http://app; proxy_http_version 1.1; "
                         "proxy_set_header Connection \"\"; add_header X-Q $http_x_q; }")
        cpath = os.path.join(tmp, "nginx.conf")
        with open(cpath, "w") as fh:
            fh.write(conf)
        srv = Servers(ctx, cfg)
        try:
            srv.start(["redis-server", "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
                       "--appendonly", "no", "--protected-mode", "no", "--dir", tmp],
                      rport, "redis-server")
            tmo = str(ctx.app_dur * 4 + 60)
            srv.start([ctx.appserver, "--port", str(a1), "--redis-port", str(rport), "--populate",
                       "--timeout", tmo], a1, "sdp-appserver 1")
            srv.start([ctx.appserver, "--port", str(a2), "--redis-port", str(rport),
                       "--timeout", tmo], a2, "sdp-appserver 2")
            srv.start(["nginx", "-c", cpath, "-p", tmp, "-e", os.path.join(tmp, "error.log")],
                      nport, "nginx proxy")
            srv.begin()
            k0 = _tcp_counters(cfg)
            res, j = _wrk(ctx, cfg, f"http://{cfg.server_addr}:{nport}/item", conns=p["conns"],
                          threads=2, dur=ctx.app_dur, script=self.lua)
            k1 = _tcp_counters(cfg)
            if j is None:
                return fail(f"wrk gave no results (exit {res.rc}): " + _tail(res.stderr or res.stdout))
            m, extra, secs = _wrk_metrics(j)
            if k0 and k1:
                for k in k0:
                    extra[k] = k1[k] - k0[k]
            m.pop("mbytes_per_s", None)
            s = _app_sample(srv, res, secs, m, nbytes=j["bytes"], extra=extra)
            return _check_wrk(s, j, extra, p["conns"])
        finally:
            srv.stop()

    def plot(self, rows, plt):
        from .plots import COLORS
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12.8, 4.6))
        use = [r for r in rows if r.get("available") and r.get("metrics")]
        conns = sorted({r["params"]["conns"] for r in rows})
        cfgs = []
        for r in use:
            if r["config"] not in cfgs:
                cfgs.append(r["config"])
        n = max(len(cfgs), 1)
        w = 0.8 / n
        for i, c in enumerate(cfgs):
            xs, ys = [], []
            for gi, cn in enumerate(conns):
                for r in use:
                    if r["config"] == c and r["params"]["conns"] == cn and "rps" in r["metrics"]:
                        xs.append(gi + (i - (n - 1) / 2) * w)
                        ys.append(r["metrics"]["rps"]["median"])
            ax1.bar(xs, ys, width=w, label=c, color=COLORS.get(c), zorder=3)
        ax1.set_xticks(range(len(conns)))
        ax1.set_xticklabels([f"{c} connections" for c in conns])
        ax1.set_ylabel("requests per second")
        ax1.set_title("Throughput (003 Fig 9/11)", fontsize=10)
        ax1.grid(True, axis="y", alpha=0.3, zorder=0)
        styles = ["-", "--", ":"]
        for r in use:
            cdf = r.get("extra", {}).get("latency_cdf_us")
            if not cdf:
                continue
            si = conns.index(r["params"]["conns"]) % 3
            xs = [v / 1000.0 for _, v in cdf]
            ys = [max(1 - pp / 100.0, 1e-5) for pp, _ in cdf]
            ax2.plot(xs, ys, styles[si], color=COLORS.get(r["config"]),
                     label=f"{r['config']}, {r['params']['conns']} conns")
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("response time (ms)")
        ax2.set_ylabel("fraction of requests slower (1 - CDF)")
        ax2.set_title("Response time, complementary CDF (003 Fig 10/12)", fontsize=10)
        ax2.grid(True, alpha=0.3)
        if use:
            ax1.legend(fontsize=7)
            ax2.legend(fontsize=7)
        else:
            for ax in (ax1, ax2):
                ax.text(0.5, 0.5, "no results", ha="center", transform=ax.transAxes)
        fig.suptitle(f"{self.name} — reproduces {self.reproduces}", fontsize=9)
        fig.tight_layout(rect=(0, 0.03, 1, 0.95))
        return fig


def _pg_bin() -> str | None:
    import glob
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))
    return os.path.dirname(found[-1]) if found else None


class Pgbench(AppExperiment):
    name = "pgbench"
    title = "PostgreSQL pgbench select-only"
    reproduces = "003 §VI (the database tier: a forking server, one process per client)"
    description = ("PostgreSQL (one backend process per connection, run as user postgres) "
                   "and pgbench -S (select-only) with 8 clients on 2 threads: kept "
                   "connections, and a new connection per transaction (-C).")
    metrics = [Metric("tps", "tx/s", "transactions per second", "higher"),
               Metric("lat_ms", "ms", "latency average", "lower")]
    primary = "tps"
    needs = ("runuser",)
    xparam = None

    def params(self, mode):
        return [{"clients": 8, "connect": c} for c in _pick(mode, [0, 1], [0, 1], [0])]

    def skip_reason(self, cfg) -> str | None:
        if cfg.name in ("sdp-zcopy", "sdp-zcopy-all", "sdp-azcopy"):
            return ("not run: queries and rows of a few hundred bytes never reach a zero-copy "
                    "threshold: the path of sdp-bcopy")
        return None

    def unavailable_reason(self, ctx) -> str | None:
        if os.geteuid() != 0:
            return "needs root (the server runs as user postgres)"
        if not _pg_bin():
            return "PostgreSQL is not installed (scripts/install-deps.sh)"
        return None

    def run(self, ctx, cfg, p):
        import pwd
        import tempfile
        bindir = _pg_bin()
        if not bindir:
            return fail("PostgreSQL is not installed (scripts/install-deps.sh)")
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            return fail("no user postgres (the PostgreSQL package makes it)")
        top = tempfile.mkdtemp(prefix="sdpb-pg-", dir="/tmp")
        os.chmod(top, 0o755)
        os.chown(top, pw.pw_uid, pw.pw_gid)
        as_pg = ["runuser", "-u", "postgres", "--"]
        data = os.path.join(top, "data")
        port = _port(ctx, cfg)
        srv = Servers(ctx, cfg)
        try:
            r = run_client(as_pg + [f"{bindir}/initdb", "-D", data, "-A", "trust", "-U",
                                    "postgres", "--no-sync"], cfg.environ(), timeout=120)
            if r.rc != 0:
                return fail("initdb: " + _tail(r.stderr or r.stdout))
            with open(os.path.join(data, "pg_hba.conf"), "a") as fh:
                fh.write("host all all 0.0.0.0/0 trust\n")     # the namespaces' client
            srv.start(as_pg + [f"{bindir}/postgres", "-D", data, "-k", top, "-p", str(port),
                               "-c", f"listen_addresses={cfg.server_addr}",
                               "-c", "max_connections=100", "-c", "fsync=off",
                               "-c", "synchronous_commit=off"], port, "postgres")
            base = as_pg + [f"{bindir}/pgbench", "-h", cfg.server_addr, "-p", str(port),
                            "-U", "postgres"]
            r = run_client(cfg.wrap(base + ["-i", "-q", "-s", "1", "postgres"], "client", ctx),
                           cfg.environ(), timeout=120)
            if r.rc != 0:
                return fail("pgbench -i: " + _tail(r.stderr or r.stdout))
            args = base + ["-S", "-c", str(p["clients"]), "-j", "2", "-T", str(ctx.app_dur)]
            if p["connect"]:
                args.append("-C")
            srv.begin()
            res = run_client(cfg.wrap(args + ["postgres"], "client", ctx), cfg.environ(),
                             timeout=ctx.app_dur * 3 + 60)
            out = res.stdout + res.stderr
            tps = re.search(r"^tps = ([\d.]+)", out, re.M)
            lat = re.search(r"latency average = ([\d.]+) ms", out)
            bad = re.search(r"number of failed transactions: (\d+)", out)
            if res.rc != 0 or not tps or not lat or (bad and int(bad.group(1))):
                return fail(f"pgbench (exit {res.rc}): " + _tail(out, 400))
            return _app_sample(srv, res, res.wall, {"tps": float(tps.group(1)),
                                                    "lat_ms": float(lat.group(1))})
        finally:
            srv.stop()
            shutil.rmtree(top, ignore_errors=True)


def experiments() -> list[Experiment]:
    return [Iperf3(), Sockperf(), Redis(), Nginx(), DataCenter(), Pgbench()]


__all__ = ["experiments", "shutil"]
