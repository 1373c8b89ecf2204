#!/usr/bin/env python3
"""make demo: iperf3 and a 64-byte ping-pong over kernel TCP, then over SDP
(`sdp run` on both ends), side by side.

Exits non-zero, saying why, when SDP is not available (yet)."""
from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from sdpbench import configs as cfgmod  # noqa: E402
from sdpbench import cpu as cpumod  # noqa: E402
from sdpbench.apps import libsdp_loaded  # noqa: E402
from sdpbench.core import Ctx  # noqa: E402
from sdpbench.micro import perf_pair, transport_check  # noqa: E402
from sdpbench.procs import Proc, free_port, run_client, wait_listening  # noqa: E402

IPERF_SECONDS = 3


def iperf3(ctx, cfg) -> dict:
    port = free_port()
    env = cfg.environ()
    srv = Proc(cfg.wrap(["iperf3", "-s", "-1", "-p", str(port), "-B", "127.0.0.1"], "server", ctx),
               env=env, name="iperf3 -s")
    try:
        if not wait_listening(srv.pid, port, 15):
            return {"error": "iperf3 server did not start: " + srv.stderr()[-200:]}
        tree = cpumod.TreeCPU([srv.pid])
        tree.start()
        loaded = libsdp_loaded(cpumod.descendants(srv.pid))
        res = run_client(cfg.wrap(["iperf3", "-c", "127.0.0.1", "-p", str(port), "-J",
                                   "-t", str(IPERF_SECONDS)], "client", ctx), env,
                         timeout=IPERF_SECONDS * 4 + 30)
        scpu = tree.stop()
        try:
            j = json.loads(res.stdout)
        except ValueError:
            return {"error": f"iperf3 client failed (exit {res.rc}): {res.stderr.strip()[-200:]}"}
        if j.get("error"):
            return {"error": "iperf3: " + j["error"]}
        rcv = j["end"]["sum_received"]
        secs = rcv["seconds"] or res.wall
        return {"gbps": rcv["bits_per_second"] / 1e9,
                "cpu_pct": 100.0 * (res.cpu + scpu) / secs,
                "sdp_loaded": loaded}
    finally:
        srv.stop()


def pingpong(ctx, cfg) -> dict:
    cj, sj, err = perf_pair(ctx, cfg, ["pingpong", "--size", "64", "--time", "2"], sessions=1)
    if err:
        return {"error": err}
    ok, transport, why = transport_check(cfg, cj, sj)
    secs = cj["seconds"]
    return {"p50_us": cj["lat_us"]["p50"], "p99_us": cj["lat_us"]["p99"],
            "cpu_pct": 100.0 * (cj["cpu"]["total"] + (sj or {}).get("cpu", {}).get("total", 0)) / secs,
            "transport": transport, "transport_ok": ok, "why": why}


def fmt(v, unit="", digits=2):
    if v is None:
        return "–"
    return f"{v:.{digits}f}{unit}"


def main() -> int:
    root = os.path.dirname(HERE)
    bindir = os.path.join(root, "build", "bin")
    ctx = Ctx(root=root, bindir=bindir, mode="quick", dur=2.0, tmp=tempfile.gettempdir())
    tcp = cfgmod.Config("tcp", "tcp", "kernel TCP over loopback")
    sdp = cfgmod.Config("sdp", "sdp", "SDP with its default settings", feature="bcopy")

    if not os.path.exists(ctx.perf):
        print(f"demo: {ctx.perf} is missing; build first (make all)", file=sys.stderr)
        return 1
    print("SDP demo: the same unmodified programs over kernel TCP and over SDP (`sdp run`)")
    print(f"  iperf3 -t {IPERF_SECONDS} (one stream) and sdp-perf 64-byte ping-pong, both on "
          "127.0.0.1\n")
    feats, why = cfgmod.sdp_features(ctx.sdp)
    sdp_ok = feats is not None and "bcopy" in feats and os.path.exists(ctx.libsdp)
    if feats is not None and not sdp_ok:
        why = f"`sdp check --json` lists features {feats}, no 'bcopy'"

    results = {"tcp": {}, "sdp": {}}
    print("running over kernel TCP ...", flush=True)
    results["tcp"]["iperf3"] = iperf3(ctx, tcp)
    results["tcp"]["pp"] = pingpong(ctx, tcp)
    if sdp_ok:
        print("running over SDP ...", flush=True)
        results["sdp"]["iperf3"] = iperf3(ctx, sdp)
        results["sdp"]["pp"] = pingpong(ctx, sdp)

    t, s = results["tcp"], results["sdp"]

    def row(label, key, sub, unit, digits=2, ratio=True):
        a = t.get(key, {}).get(sub)
        b = s.get(key, {}).get(sub) if s else None
        r = f"{b / a:.2f}x" if (ratio and a and b) else "–"
        print(f"{label:34s} {fmt(a, unit, digits):>14s} {fmt(b, unit, digits):>14s} {r:>9s}")

    print()
    print(f"{'':34s} {'kernel TCP':>14s} {'SDP':>14s} {'SDP/TCP':>9s}")
    print("-" * 74)
    row("iperf3 bandwidth", "iperf3", "gbps", " Gb/s")
    row("iperf3 CPU, both ends (100% = 1 CPU)", "iperf3", "cpu_pct", " %", 0)
    row("ping-pong 64 B one-way p50", "pp", "p50_us", " us")
    row("ping-pong 64 B one-way p99", "pp", "p99_us", " us")
    row("ping-pong CPU, both ends", "pp", "cpu_pct", " %", 0)
    print()
    rc = 0
    for side in ("tcp", "sdp"):
        for k, v in results[side].items():
            if v.get("error"):
                print(f"{side} {k}: FAILED: {v['error']}")
                rc = 1
    if sdp_ok:
        pp = s.get("pp", {})
        if pp and not pp.get("error"):
            if pp.get("transport_ok"):
                print("SDP path verified: getsockopt(SDP_TRANSPORT) = 1 on both ends of the ping-pong")
            else:
                print(f"WARNING: {pp.get('why')}")
                rc = 1
        ip = s.get("iperf3", {})
        if ip and not ip.get("error") and ip.get("sdp_loaded") is False:
            print("WARNING: libsdp.so was not mapped into the iperf3 server")
            rc = 1
    else:
        print(f"SDP is not available yet: {why}")
        print("Only the kernel TCP column could be measured.")
        return 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
