"""Between hosts: zero copy over the ofi provider, with the registration
cache observed while it runs.

One 1 MiB stream between the two namespaces of `tcp-veth-offload`: kernel
TCP there, and `sdp-ofi` with the zero-copy threshold at 64 KiB so every
send is Read Zero Copy (the sink's RDMA Read of the source's registered
buffer). While the stream runs, `sdp stat --json` is read every 0.2 s; the
client's last reading gives the registration cache's hits and misses
(`mr_cache_hits` / `mr_cache_misses`: a send from a buffer whose
registration is cached costs no registration)."""
from __future__ import annotations

import json
import subprocess
import threading

from .core import Experiment, Metric
from .micro import _bw_sample

M = 1024 * 1024


class _StatPoller:
    """Reads `sdp stat --json` until stopped; keeps the largest registration
    cache counts seen on sdp-perf client connections."""

    def __init__(self, sdp: str):
        self.sdp = sdp
        self.hits = self.misses = 0
        self.stop_ev = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop_ev.wait(0.2):
            try:
                out = subprocess.run([self.sdp, "stat", "--json"], capture_output=True,
                                     text=True, timeout=10).stdout
                conns = json.loads(out or "[]")
            except (OSError, ValueError, subprocess.TimeoutExpired):
                continue
            h = m = 0
            for c in conns:
                if c.get("role") == "client" and str(c.get("fabric", "")).startswith("ofi:"):
                    h += int(c.get("mr_cache_hits", 0))
                    m += int(c.get("mr_cache_misses", 0))
            if h + m > self.hits + self.misses:
                self.hits, self.misses = h, m

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *a):
        self.stop_ev.set()
        self.t.join(timeout=15)


class OfiZcopy(Experiment):
    name = "ofizc"
    title = "Zero copy between hosts: registration cache"
    reproduces = "000 §2.3 (registration cost and caching)"
    description = ("One stream of 1 MiB messages between the two network namespaces: kernel "
                   "TCP (`tcp-veth-offload`) and SDP over ofi with every send Read Zero Copy "
                   "(SDP_ZCOPY_THRESH=65536); the registration cache's hit rate read from "
                   "`sdp stat --json` while it runs.")
    metrics = [Metric("gbps", "Gbit/s", "bandwidth", "higher")]
    primary = "gbps"
    xparam = "size"
    extra_stats = ("mr_hit_rate",)

    def wants(self, cfg):
        return cfg.name in ("tcp-veth-offload", "sdp-ofi")

    def params(self, mode):
        return [{"size": M}]

    def run(self, ctx, cfg, p):
        if cfg.kind != "sdp":
            return _bw_sample(ctx, cfg, p)
        import copy
        zc = copy.copy(cfg)
        zc.env = dict(cfg.env, SDP_ZCOPY_THRESH="65536")
        with _StatPoller(ctx.sdp) as pol:
            s = _bw_sample(ctx, zc, p)
        n = pol.hits + pol.misses
        s.extra["mr_cache_hits"] = pol.hits
        s.extra["mr_cache_misses"] = pol.misses
        if n:
            s.extra["mr_hit_rate"] = pol.hits / n
        return s

    def report_extra(self, rows):
        L = []
        for r in rows:
            if r["config"] != "sdp-ofi" or not r.get("available"):
                continue
            hr = (r.get("extra") or {}).get("mr_hit_rate")
            zf = (r.get("extra") or {}).get("zcopy_fraction")
            L.append("Registration cache over ofi (client, last `sdp stat` reading of a run): "
                     + (f"hit rate median {hr['median'] * 100:.2f} % "
                        f"[{hr['min'] * 100:.2f}–{hr['max'] * 100:.2f} %]" if hr else
                        "no reading")
                     + (f"; zero-copy share of the bytes sent {zf['median'] * 100:.0f} %"
                        if zf else "") + ".")
        return L + [""] if L else []


def experiments() -> list[Experiment]:
    return [OfiZcopy()]
