"""Micro-benchmarks driven by sdp-perf (server and client) and sdp-rawbench."""
from __future__ import annotations

import os

from .core import Ctx, Experiment, Metric, Sample, fail
from .procs import Proc, last_json, run_client

K = 1024
M = 1024 * 1024


def _tail(text: str, n: int = 200) -> str:
    text = (text or "").strip().replace("\n", " | ")
    return text[-n:]


def transport_check(cfg, cj: dict, sj: dict | None) -> tuple[bool, str, str | None]:
    """(ok, transport, reason). An SDP configuration is valid only if both
    ends' sockets answered SDP_TRANSPORT = 1; a TCP one only if none did."""
    ct = cj.get("transport")
    st = sj.get("transport") if sj else None
    t = ct if st in (None, ct, "none") else f"{ct}/{st}"
    if cfg.kind == "sdp":
        ok = ct == "sdp" and st in ("sdp", None)
        if sj is None:
            ok = False
        return ok, t, (None if ok else f"SDP path not used (client={ct}, server={st})")
    ok = ct == "tcp" and st in ("tcp", "none", None)
    return ok, t, (None if ok else f"unexpected transport (client={ct}, server={st})")


def perf_pair(ctx: Ctx, cfg, client_args: list[str], sessions: int | None,
              accept_close: bool = False, timeout: float | None = None):
    """Start an sdp-perf server under cfg, run one client against it and
    return (client_json, server_json, error)."""
    timeout = timeout or (ctx.dur * 4 + 15)
    env = cfg.environ()
    sargv = [ctx.perf, "server", "--bind", cfg.server_addr, "--port", "0",
             "--timeout", str(int(timeout + 15))]
    if sessions:
        sargv += ["--sessions", str(sessions)]
    if accept_close:
        sargv.append("--accept-close")
    srv = Proc(cfg.wrap(sargv, "server", ctx), env=env, name="sdp-perf server")
    try:
        hello = srv.wait_json(lambda j: j.get("event") == "listening", timeout=15)
        if not hello:
            alive = srv.running()
            rc = srv.stop()
            state = "no 'listening' line after 15 s" if alive else f"exited with {rc}"
            return None, None, (f"server did not start ({state}): "
                                + _tail(srv.stderr() or srv.stdout()))
        port = str(hello["port"])
        cargv = [ctx.perf] + client_args + ["--host", cfg.server_addr, "--port", port]
        res = run_client(cfg.wrap(cargv, "client", ctx), env, timeout=timeout)
        cj = last_json(res.stdout, lambda j: j.get("role") == "client")
        # the server ends by itself after its sessions; connrate stops it
        if srv.wait(0.2 if accept_close else 5.0) is None:
            srv.stop()
        sj = srv.wait_json(lambda j: j.get("role") == "server", timeout=3)
    finally:
        if srv.running():
            srv.stop()
    if res.timed_out:
        return cj, sj, "client timed out"
    if cj is None:
        return None, sj, f"client failed (exit {res.rc}): " + _tail(res.stderr or res.stdout)
    if not cj.get("ok"):
        return cj, sj, "client error: " + str(cj.get("error", "?"))
    return cj, sj, None


def sample_from_perf(cfg, cj: dict | None, sj: dict | None, err: str | None,
                     metrics: dict) -> Sample:
    if err:
        return fail(err)
    ok, transport, why = transport_check(cfg, cj, sj)
    secs = cj.get("seconds") or 0.0
    ccpu = (cj.get("cpu") or {}).get("total")
    scpu = (sj.get("cpu") or {}).get("total") if sj else None
    extra = {}
    for side, j in (("client", cj), ("server", sj)):
        if j and j.get("sdp_stats"):
            extra[f"sdp_stats_{side}"] = j["sdp_stats"]
    st = cj.get("sdp_stats") or (sj or {}).get("sdp_stats")
    if st:
        tx = sum(st.get(k, 0) for k in ("tx_bcopy_bytes", "tx_rzcopy_bytes", "tx_wzcopy_bytes",
                                        "tx_azcopy_bytes"))
        az = st.get("tx_azcopy_bytes", 0)
        zc = st.get("tx_rzcopy_bytes", 0) + st.get("tx_wzcopy_bytes", 0) + az
        if tx:
            extra["zcopy_fraction"] = zc / tx
        bc = st.get("tx_bcopy_bytes", 0)
        if bc and "tx_stream_bytes" in st:
            # Buffer Copy bytes the sender wrote with streaming stores
            # (SDP_COPY_STREAM: plain stores ran slow between the CPUs)
            extra["stream_fraction"] = st["tx_stream_bytes"] / bc
            if az:
                # Asynchronous Zero Copy: its share, and the sender's
                # faults on pages in flight / advertisements copied aside
                extra["azcopy_fraction"] = az / tx
                extra["az_faults"] = st.get("az_faults", 0)
                extra["az_cow_copies"] = st.get("az_cow_copies", 0)
    return Sample(ok=True, reason=why, metrics=metrics,
                  cpu_client=(ccpu / secs) if (ccpu is not None and secs) else None,
                  cpu_server=(scpu / secs) if (scpu is not None and secs) else None,
                  bytes=cj.get("bytes"), seconds=secs, transport=transport,
                  transport_ok=ok, extra=extra)


def rawbench(ctx: Ctx, cfg, test: str, size: int, dur: float) -> Sample:
    argv = [ctx.raw, test, "--size", str(size), "--time", f"{dur:g}"]
    if ctx.pin and ctx.cpus:
        # the tool forks its peer: it pins both processes itself
        argv += ["--cpus", f"{ctx.cpus[0]},{ctx.cpus[-1]}"]
    else:
        argv = cfg.wrap(argv, "client", ctx)
    res = run_client(argv, cfg.environ(), timeout=dur * 3 + 30)
    j = last_json(res.stdout, lambda j: j.get("tool") == "sdp-rawbench")
    if j is None:
        return fail(f"sdp-rawbench failed (exit {res.rc}): " + _tail(res.stderr))
    if not j.get("ok"):
        return fail("sdp-rawbench: " + str(j.get("error")))
    secs = j.get("seconds") or 0
    lat = j.get("lat_us") or {}
    m = {"gbps": j.get("gbps")}
    if lat:
        m.update({"p50_us": lat.get("p50"), "p99_us": lat.get("p99"), "mean_us": lat.get("mean")})
    return Sample(ok=True, metrics=m,
                  cpu_client=(j["cpu"]["total"] / secs) if secs else None,
                  cpu_server=(j["peer_cpu"]["total"] / secs) if secs else None,
                  bytes=j.get("bytes"), seconds=secs, transport="raw")


def _size_name(n: int) -> str:
    return f"{n // M} MiB" if n % M == 0 else f"{n // K} KiB" if n % K == 0 else f"{n} B"


def _pick(mode: str, full, quick, tiny):
    return {"full": full, "quick": quick, "tiny": tiny}[mode]


LAT_METRICS = [Metric("p50_us", "us", "one-way latency p50", "lower"),
               Metric("p99_us", "us", "one-way latency p99", "lower"),
               Metric("mean_us", "us", "one-way latency mean", "lower")]
BW_METRICS = [Metric("gbps", "Gbit/s", "bandwidth", "higher")]


class Latency(Experiment):
    name = "latency"
    title = "Ping-pong latency"
    reproduces = "002 Fig 1a, 001 Fig 6a, 003 Fig 5"
    description = ("One connection; the client sends a message of the given size and waits "
                   "for the same size back. One-way latency = round trip / 2, p50 and p99 over "
                   "all round trips of a run.")
    metrics = LAT_METRICS
    primary = "p50_us"
    raw_configs = ("raw-shm",)
    logy = True

    def params(self, mode):
        sizes = _pick(mode, [1, 64, K, 4 * K, 16 * K, 64 * K, 256 * K, M],
                      [64, 64 * K], [64])
        return [{"size": s} for s in sizes]

    def run(self, ctx, cfg, p):
        if cfg.kind == "raw":
            return rawbench(ctx, cfg, "shm-lat", p["size"], ctx.dur)
        cj, sj, err = perf_pair(ctx, cfg, ["pingpong", "--size", str(p["size"]),
                                           "--time", f"{ctx.dur:g}"], sessions=1)
        lat = (cj or {}).get("lat_us") or {}
        return sample_from_perf(cfg, cj, sj, err, {"p50_us": lat.get("p50"),
                                                   "p99_us": lat.get("p99"),
                                                   "mean_us": lat.get("mean")})


def _stream_args(ctx, p, **kw) -> list[str]:
    a = ["stream", "--size", str(p["size"]), "--time", f"{kw.get('dur', ctx.dur):g}"]
    for key, flag in (("streams", "--streams"), ("procs", "--procs"), ("busy_us", "--busy-us"),
                      ("window", "--window")):
        v = kw.get(key, p.get(key))
        if v:
            a += [flag, str(v)]
    if kw.get("reverse"):
        a.append("--reverse")
    return a


def _bw_sample(ctx, cfg, p, **kw) -> Sample:
    n = (kw.get("streams") or p.get("streams") or 1) * (kw.get("procs") or p.get("procs") or 1)
    cj, sj, err = perf_pair(ctx, cfg, _stream_args(ctx, p, **kw), sessions=n)
    return sample_from_perf(cfg, cj, sj, err, {"gbps": (cj or {}).get("gbps")})


class Stream(Experiment):
    name = "stream"
    title = "One-stream throughput and CPU"
    reproduces = "000 Fig 6, 001 Fig 6b, 003 Fig 6"
    description = ("One connection streams messages of the given size for a fixed time; "
                   "bandwidth is counted when the receiver has acknowledged every byte. CPU of "
                   "both ends (getrusage) as CPU-seconds per second and per GB.")
    metrics = BW_METRICS
    primary = "gbps"
    raw_configs = ("raw-cma", "raw-shm")
    cpu_bars = "total"

    def params(self, mode):
        sizes = _pick(mode, [K, 4 * K, 16 * K, 64 * K, 256 * K, M, 4 * M],
                      [4 * K, 64 * K, M], [64 * K])
        return [{"size": s} for s in sizes]

    def run(self, ctx, cfg, p):
        if cfg.kind == "raw":
            return rawbench(ctx, cfg, "cma" if cfg.name == "raw-cma" else "shm-bw",
                            p["size"], ctx.dur)
        return _bw_sample(ctx, cfg, p)


class MultiStream(Experiment):
    name = "multistream"
    title = "Multi-stream throughput and CPU"
    reproduces = "000 Figs 7-11, 002 Fig 2a, 003 Fig 7"
    description = ("N threads in one client process, each with its own connection to a "
                   "thread of the server, stream at the same time; aggregate bandwidth and "
                   "the CPU of both processes.")
    metrics = BW_METRICS
    primary = "gbps"
    xparam = "streams"
    panel_param = "size"
    logx = False
    cpu_bars = "total"

    def params(self, mode):
        sizes = _pick(mode, [64 * K, M], [64 * K], [64 * K])
        streams = _pick(mode, [1, 2, 4, 8], [1, 4], [2])
        return [{"size": s, "streams": n} for s in sizes for n in streams]

    def run(self, ctx, cfg, p):
        return _bw_sample(ctx, cfg, p)


class PerByte(Experiment):
    name = "perbyte"
    title = "Per-byte overhead and the BCopy/ZCopy crossover"
    reproduces = "000 Fig 12, 000 §4.2 (Figs 7-9)"
    description = ("Message size sweep with 1, 2 and 8 concurrent connections (--quick: 1 and "
                   "4). Per-byte "
                   "overhead = CPU / bandwidth (CPU-seconds per GB, numerically equal to "
                   "µs per KB). The crossover is the smallest size at which zero copy "
                   "(sdp-zcopy-all) beats Buffer Copy (sdp-bcopy) in bandwidth, and in "
                   "per-byte overhead.")
    metrics = [Metric("gbps", "Gbit/s", "aggregate bandwidth", "higher"),
               Metric("us_per_kb", "us/KB", "per-byte overhead (CPU / bandwidth)", "lower")]
    primary = "us_per_kb"
    series_param = "streams"
    logy = True

    def wants(self, cfg):
        return cfg.name in ("tcp", "sdp-bcopy", "sdp-zcopy-all", "sdp-azcopy")

    def params(self, mode):
        sizes = _pick(mode, [K, 4 * K, 16 * K, 64 * K, 256 * K, M],
                      [4 * K, 64 * K, M], [64 * K])
        streams = _pick(mode, [1, 2, 8], [1, 4], [1])
        return [{"size": s, "streams": n} for n in streams for s in sizes]

    def run(self, ctx, cfg, p):
        s = _bw_sample(ctx, cfg, p)
        if s.ok:
            s.metrics["us_per_kb"] = s.cpu_per_gb   # s/GB == us/KB
        return s

    def plot(self, rows, plt):
        """Left: bandwidth against message size per number of connections
        (000 Figs 6-9); right: per-byte overhead (000 Fig 12)."""
        from .plots import COLORS, MARKERS, SERIES_STYLES, size_axis
        fig, axes = plt.subplots(1, 2, figsize=(12.8, 4.6))
        use = [r for r in rows if r.get("available") and r.get("metrics")]
        streams = sorted({r["params"]["streams"] for r in rows})
        sizes = sorted({r["params"]["size"] for r in rows})
        order = []
        for r in rows:
            if r["config"] not in order:
                order.append(r["config"])
        for ax, metric, ylabel, title in (
                (axes[0], "gbps", "aggregate bandwidth (Gbit/s)", "Bandwidth (000 Figs 6-9)"),
                (axes[1], "us_per_kb", "per-byte overhead (µs/KB = CPU / bandwidth)",
                 "Per-byte overhead (000 Fig 12)")):
            for c in order:
                for si, n in enumerate(streams):
                    pts = sorted((r["params"]["size"], r["metrics"][metric]["median"]) for r in use
                                 if r["config"] == c and r["params"]["streams"] == n
                                 and metric in r["metrics"])
                    if pts:
                        ax.plot([x for x, _ in pts], [y for _, y in pts], label=f"{c}, {n} conn",
                                color=COLORS.get(c), marker=MARKERS.get(c, "o"),
                                linestyle=SERIES_STYLES[si % 4], markersize=5)
            size_axis(ax, sizes)
            if metric == "us_per_kb" and use:
                ax.set_yscale("log")
            ax.set_xlabel("message size")
            ax.set_ylabel(ylabel)
            ax.set_title(title, fontsize=10)
            ax.grid(True, alpha=0.3)
            if use:
                ax.legend(fontsize=7, framealpha=0.9)
            else:
                ax.text(0.5, 0.5, "no results", ha="center", transform=ax.transAxes)
        fig.suptitle(f"{self.name} — reproduces {self.reproduces}; median of repetitions",
                     fontsize=9)
        fig.tight_layout(rect=(0, 0.03, 1, 0.95))
        return fig


class HotSpot(Experiment):
    name = "hotspot"
    title = "Hot-spot latency"
    reproduces = "002 Fig 2b, 001 Fig 9"
    description = ("N client processes ping-pong with one server at the same time. Reported: "
                   "the mean of the clients' average one-way latencies, the p99 over all "
                   "round trips, and the server's CPU.")
    metrics = [Metric("mean_us", "us", "mean one-way latency per client", "lower"),
               Metric("p99_us", "us", "one-way latency p99", "lower")]
    primary = "mean_us"
    xparam = "clients"
    series_param = "size"
    logx = False
    cpu_bars = "server"

    def params(self, mode):
        sizes = _pick(mode, [64, 16 * K], [K], [64])
        clients = _pick(mode, [1, 2, 4, 8], [4], [2])
        return [{"size": s, "clients": c} for s in sizes for c in clients]

    def run(self, ctx, cfg, p):
        cj, sj, err = perf_pair(ctx, cfg, ["pingpong", "--size", str(p["size"]), "--procs",
                                           str(p["clients"]), "--time", f"{ctx.dur:g}"],
                                sessions=p["clients"])
        lat = (cj or {}).get("lat_us") or {}
        return sample_from_perf(cfg, cj, sj, err, {"mean_us": (cj or {}).get("client_mean_lat_us"),
                                                   "p99_us": lat.get("p99")})


class FanIn(Experiment):
    name = "fanin"
    title = "Fan-in: N clients stream to one server"
    reproduces = "002 Fig 3a"
    description = "N client processes stream to one server; aggregate bandwidth and server CPU."
    metrics = BW_METRICS
    primary = "gbps"
    xparam = "clients"
    logx = False
    cpu_bars = "server"
    reverse = False

    def params(self, mode):
        clients = _pick(mode, [1, 2, 4, 8], [4], [2])
        return [{"size": 16 * K, "clients": c} for c in clients]

    def run(self, ctx, cfg, p):
        return _bw_sample(ctx, cfg, p, procs=p["clients"], reverse=self.reverse)


class FanOut(FanIn):
    name = "fanout"
    title = "Fan-out: one server streams to N clients"
    reproduces = "002 Fig 3b"
    description = "One server streams to N client processes; aggregate bandwidth and server CPU."
    reverse = True


class MultiClient(FanIn):
    name = "multiclient"
    title = "Multi-client throughput"
    reproduces = "001 Fig 10b"
    description = ("N client processes each stream 64 KiB messages to the same server "
                   "(one server thread per connection); aggregate bandwidth.")

    def params(self, mode):
        clients = _pick(mode, [1, 2, 4, 8], [4], [2])
        return [{"size": 64 * K, "clients": c} for c in clients]


class Overlap(Experiment):
    name = "overlap"
    title = "Computation/communication overlap"
    reproduces = "001 Fig 7"
    description = ("One stream; the sender busy-loops for the given number of microseconds "
                   "between two sends. A transport that overlaps the transfer with the "
                   "computation keeps its bandwidth as the computation grows.")
    metrics = BW_METRICS
    primary = "gbps"
    xparam = "busy_us"
    panel_param = "size"
    logx = False

    def params(self, mode):
        sizes = _pick(mode, [64 * K, M], [64 * K], [64 * K])
        # 40 us: shorter than the copy of 1 MiB here (the paper's case, where
        # the transfer outlasts the computation); 200 us: the paper's point
        busy = _pick(mode, [0, 40, 50, 100, 200], [0, 100], [50])
        return [{"size": s, "busy_us": b} for s in sizes for b in busy]

    def run(self, ctx, cfg, p):
        return _bw_sample(ctx, cfg, p)

    def report_extra(self, rows):
        """Per message size and computation: each configuration's bandwidth,
        the share of its own no-computation bandwidth it keeps, the ratio to
        Zero Copy, and the bound the computation alone sets (one message per
        busy_us: size * 8 / busy_us bits per us)."""
        def med(cfg, size, busy):
            for r in rows:
                if (r["config"] == cfg and r["params"].get("size") == size
                        and r["params"].get("busy_us") == busy and r.get("valid", True)):
                    m = (r.get("metrics") or {}).get("gbps")
                    return m["median"] if m else None
            return None
        cfgs = []
        for r in rows:
            if r["config"] not in cfgs and r.get("available"):
                cfgs.append(r["config"])
        if "sdp-azcopy" not in cfgs:
            return []
        sizes = sorted({r["params"]["size"] for r in rows})
        busys = sorted({r["params"]["busy_us"] for r in rows if r["params"]["busy_us"]})
        L = ["Overlap, per configuration: bandwidth with computation / its own without "
             "(`own`), `sdp-azcopy` / `sdp-zcopy` at the same computation (`× zc`), and the "
             "bound the computation alone sets - one message per busy time, "
             "size × 8 / busy_us - with the share of it reached (`of bound`). Where the bound "
             "is below the no-computation bandwidth, the computation, not the transfer, "
             "limits every transport.", "",
             "| size | busy_us | bound (Gbit/s) | config | Gbit/s | own | of bound | × zc |",
             "|---|---|---|---|---|---|---|---|"]
        for size in sizes:
            for b in busys:
                bound = size * 8 / (b * 1000.0)
                zc = med("sdp-zcopy", size, b)
                for c in cfgs:
                    v, v0 = med(c, size, b), med(c, size, 0)
                    if v is None:
                        continue
                    own = f"{v / v0:.2f}" if v0 else "–"
                    xzc = f"{v / zc:.2f}" if (zc and c == "sdp-azcopy") else ""
                    L.append(f"| {_size_name(size)} | {b} | {bound:.1f} | `{c}` | {v:.1f} | "
                             f"{own} | {100 * v / bound:.0f} % | {xzc} |")
        L.append("")
        return L


class PageFault(Experiment):
    name = "pagefault"
    title = "Page-fault window"
    reproduces = "001 Fig 8"
    description = ("One stream; every W send (receive) calls the sender (receiver) drops its "
                   "buffer's pages (madvise MADV_DONTNEED) and writes a pattern into it, so the "
                   "next transfers work on freshly faulted pages.")
    metrics = BW_METRICS
    primary = "gbps"
    xparam = "window"
    panel_param = "size"
    logx = True

    def params(self, mode):
        sizes = _pick(mode, [64 * K, M], [64 * K], [64 * K])
        wins = _pick(mode, [1, 4, 16, 64], [1, 16], [4])
        return [{"size": s, "window": w} for s in sizes for w in wins]

    def run(self, ctx, cfg, p):
        return _bw_sample(ctx, cfg, p)


class ConnRate(Experiment):
    name = "connrate"
    title = "Connection set-up rate"
    reproduces = "002 §5.2 (connection time, Fig 7)"
    description = ("One client opens connections one after the other: connect, the server "
                   "accepts and closes, the client sees EOF and closes. Connections per second "
                   "and the time of one connect+accept+close. The client's first connection "
                   "is not timed (it may load libraries: libfabric for sdp-ofi, a cost of "
                   "once per process) and is reported apart as first_us.")
    metrics = [Metric("conn_per_s", "conn/s", "connections per second", "higher"),
               Metric("p50_us", "us", "connect+accept+close p50", "lower"),
               Metric("p99_us", "us", "connect+accept+close p99", "lower"),
               Metric("first_us", "us", "the process's first connection (untimed)", "lower")]
    primary = "conn_per_s"
    xparam = None
    logx = False

    def params(self, mode):
        return [{"count": _pick(mode, 20000, 5000, 500)}]

    def run(self, ctx, cfg, p):
        cj, sj, err = perf_pair(ctx, cfg, ["connrate", "--count", str(p["count"]),
                                           "--time", f"{ctx.dur:g}", "--warmup", "1"],
                                sessions=None, accept_close=True)
        lat = (cj or {}).get("lat_us") or {}
        s = sample_from_perf(cfg, cj, sj, err, {"conn_per_s": (cj or {}).get("conn_per_s"),
                                                "p50_us": lat.get("p50"),
                                                "p99_us": lat.get("p99"),
                                                "first_us": (cj or {}).get("first_us")})
        s.bytes = None
        return s


def experiments() -> list[Experiment]:
    return [Latency(), Stream(), MultiStream(), PerByte(), HotSpot(), FanIn(), FanOut(),
            MultiClient(), Overlap(), PageFault(), ConnRate()]


__all__ = ["experiments", "perf_pair", "transport_check", "os"]
