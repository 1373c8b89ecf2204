"""The driver: warm-up, repetitions with the configurations interleaved,
aggregation into result rows."""
from __future__ import annotations

import time
import traceback

from .core import Ctx, Experiment, Sample, fail, fmt_size
from .stats import summarize

MAX_FAIL_STREAK = 3


def param_text(p: dict) -> str:
    parts = []
    for k, v in p.items():
        if k in ("size", "file_size") and isinstance(v, int):
            parts.append(f"{k}={fmt_size(v)}")
        else:
            parts.append(f"{k}={v}")
    return " ".join(parts)


def safe_run(exp: Experiment, ctx: Ctx, cfg, p: dict) -> Sample:
    try:
        s = exp.run(ctx, cfg, p)
    except Exception as e:  # a broken run is a result, not a crash of the suite
        tb = traceback.format_exc(limit=2).strip().splitlines()[-1]
        s = fail(f"{type(e).__name__}: {e} ({tb})"[:300])
    return s


def unavailable_row(exp: Experiment, cfg, p: dict, reason: str) -> dict:
    return {"experiment": exp.name, "config": cfg.name, "params": p, "available": False,
            "valid": False, "reason": reason, "transport": None, "reps": 0, "failures": 0,
            "metrics": {}, "cpu": {}, "samples": {}, "extra": {}}


def aggregate(exp: Experiment, cfg, p: dict, samples: list[Sample]) -> dict:
    good = [s for s in samples if s.ok]
    failures = [s for s in samples if not s.ok]
    bad_transport = [s for s in good if not s.transport_ok]
    valid = bool(good) and not failures and not bad_transport
    reason = None
    if failures:
        reason = f"{len(failures)}/{len(samples)} runs failed: {failures[0].reason}"
    elif bad_transport:
        reason = bad_transport[0].reason
    elif not samples:
        reason = "no runs"
    metrics = {}
    raw = {}
    for m in exp.metrics:
        vals = [s.metrics.get(m.name) for s in good]
        st = summarize(vals)
        raw[m.name] = [v for v in vals]
        if st:
            st["unit"] = m.unit
            metrics[m.name] = st
    cpu = {}
    for key, fn in (("client_s_per_s", lambda s: s.cpu_client),
                    ("server_s_per_s", lambda s: s.cpu_server),
                    ("total_s_per_s", lambda s: s.cpu_total),
                    ("s_per_gb", lambda s: s.cpu_per_gb)):
        st = summarize([fn(s) for s in good])
        if st:
            cpu[key] = st
    transports = sorted({s.transport for s in good if s.transport})
    extra = {}
    zf = summarize([s.extra.get("zcopy_fraction") for s in good])
    if zf:
        extra["zcopy_fraction"] = zf
    for k in ("in_flight", "azcopy_fraction", "az_faults", "az_cow_copies", "stream_fraction") + \
            tuple(getattr(exp, "extra_stats", ())):
        st = summarize([s.extra.get(k) for s in good])
        if st:
            extra[k] = st
    for s in good:
        for k, v in s.extra.items():
            if k not in ("zcopy_fraction", "in_flight", "azcopy_fraction", "az_faults",
                         "az_cow_copies", "stream_fraction") and not k.startswith("sdp_stats"):
                extra.setdefault(k, v)
    return {"experiment": exp.name, "config": cfg.name, "params": p, "available": True,
            "valid": valid, "reason": reason,
            "transport": transports[0] if len(transports) == 1 else (", ".join(transports) or None),
            "reps": len(samples), "failures": len(failures), "metrics": metrics, "cpu": cpu,
            "samples": raw, "extra": extra}


def plan(exps: list[Experiment], configs: list, ctx: Ctx) -> list[tuple]:
    """[(experiment, [available configs], [unavailable (cfg, reason)], params)]"""
    out = []
    for exp in exps:
        params = exp.params(ctx.mode)
        cfgs = [c for c in configs if exp.wants(c)]
        missing = exp.missing_tools()
        why_not = exp.unavailable_reason(ctx) if not missing else None
        avail, unavail = [], []
        tiny_keep = None
        if ctx.mode == "tiny" and exp.kind == "app":
            # the test-only tiny mode runs each application under kernel TCP
            # and one SDP configuration, to stay within its time budget
            sdp = [c.name for c in cfgs if c.kind == "sdp" and c.available]
            tiny_keep = {"tcp"} | set(sdp[:1])
        for c in cfgs:
            if tiny_keep is not None and c.name not in tiny_keep:
                unavail.append((c, "not run in tiny mode (applications run under tcp and one "
                                   "SDP configuration only)"))
            elif not c.available:
                unavail.append((c, c.reason or "not available"))
            elif exp.skip_reason(c):
                unavail.append((c, exp.skip_reason(c)))
            elif missing:
                unavail.append((c, "not installed: " + ", ".join(missing)))
            elif why_not:
                unavail.append((c, why_not))
            else:
                avail.append(c)
        out.append((exp, avail, unavail, params))
    return out


def estimate_seconds(pl: list[tuple], ctx: Ctx) -> float:
    """Rough duration of a plan: the measured time of each run plus start-up."""
    total = 0.0
    for exp, avail, _, params in pl:
        # start-up costs measured on a 2-CPU machine
        per = (ctx.app_dur + 0.4) if exp.kind == "app" else (ctx.dur + 0.04)
        per = {"sockperf": 3.3, "redis": 1.0}.get(exp.name, per)
        per = exp.est_run_s(ctx) or per
        total += per * len(avail) * (len(params) * exp.reps_for(ctx) + int(exp.warmup_for(ctx)))
    return total


def count_runs(pl: list[tuple], ctx: Ctx) -> int:
    return sum(len(avail) * (len(params) * exp.reps_for(ctx) + int(exp.warmup_for(ctx)))
               for exp, avail, _, params in pl)


def run_all(pl: list[tuple], ctx: Ctx, progress, on_experiment_done=None) -> list[dict]:
    rows: list[dict] = []
    # failures in a row per configuration over the whole run
    gstreak: dict[str, int] = {}
    glimit = MAX_FAIL_STREAK if ctx.mode == "tiny" else 2 * MAX_FAIL_STREAK
    for exp, avail, unavail, params in pl:
        t0 = time.monotonic()
        for c, why in unavail:
            for p in params:
                rows.append(unavailable_row(exp, c, p, why))
        if hasattr(exp, "setup") and avail:
            exp.setup(ctx)
        try:
            # warm-up: one discarded run per configuration
            # a configuration that keeps failing (a hang costs a time-out per
            # run) is not run again in this experiment
            streak: dict[str, int] = {}

            def attempt(c, p):
                if streak.get(c.name, 0) >= MAX_FAIL_STREAK:
                    return fail(f"not run: the previous {MAX_FAIL_STREAK} runs of this "
                                f"configuration in this experiment failed")
                if gstreak.get(c.name, 0) >= glimit:
                    return fail(f"not run: the previous {glimit} runs of this configuration "
                                f"failed")
                s = safe_run(exp, ctx, c, p)
                streak[c.name] = 0 if s.ok else streak.get(c.name, 0) + 1
                gstreak[c.name] = 0 if s.ok else gstreak.get(c.name, 0) + 1
                return s

            for c in (avail if exp.warmup_for(ctx) else []):
                progress.update(f"{exp.name}: warm-up {c.name}")
                s = attempt(c, params[0])
                if not s.ok:
                    progress.message(f"  ! {exp.name} warm-up {c.name}: {s.reason}")
                progress.update(f"{exp.name}: warm-up {c.name}", advance=1)
            samples: dict[tuple[int, int], list[Sample]] = {}
            reps = exp.reps_for(ctx)
            for pi, p in enumerate(params):
                for rep in range(reps):
                    for ci, c in enumerate(avail):   # A B C A B C ...
                        msg = f"{exp.name} {param_text(p)} rep {rep + 1}/{reps} {c.name}"
                        progress.update(msg)
                        s = attempt(c, p)
                        samples.setdefault((pi, ci), []).append(s)
                        if not s.ok and rep == 0:
                            progress.message(f"  ! {exp.name} {c.name} {param_text(p)}: {s.reason}")
                        progress.update(msg, advance=1)
            for pi, p in enumerate(params):
                for ci, c in enumerate(avail):
                    rows.append(aggregate(exp, c, p, samples.get((pi, ci), [])))
        finally:
            if hasattr(exp, "teardown") and avail:
                exp.teardown(ctx)
        if on_experiment_done:
            on_experiment_done(exp, time.monotonic() - t0)
    return rows


def _med(row: dict, metric: str):
    m = row.get("metrics", {}).get(metric)
    return m["median"] if m else None


def crossover(rows: list[dict]) -> list[dict]:
    """BCopy/ZCopy crossover per number of connections (000 §4.2, Fig 12):
    the smallest message size from which sdp-zcopy-all is at least as good
    as sdp-bcopy, for bandwidth and for per-byte CPU."""
    by = {}
    for r in rows:
        if r["experiment"] != "perbyte" or not r.get("available"):
            continue
        by[(r["config"], r["params"]["streams"], r["params"]["size"])] = r
    out = []
    for streams in sorted({k[1] for k in by}):
        sizes = sorted({k[2] for k in by if k[1] == streams})
        res = {"streams": streams, "bandwidth_crossover_bytes": None,
               "cpu_crossover_bytes": None, "sizes": sizes}
        for metric, key, better in (("gbps", "bandwidth_crossover_bytes", "higher"),
                                    ("us_per_kb", "cpu_crossover_bytes", "lower")):
            for i, s in enumerate(sizes):
                b = by.get(("sdp-bcopy", streams, s))
                z = by.get(("sdp-zcopy-all", streams, s))
                if not b or not z:
                    continue
                vb, vz = _med(b, metric), _med(z, metric)
                if vb is None or vz is None:
                    continue
                wins = vz >= vb if better == "higher" else vz <= vb
                # crossover: zero copy wins here and at every larger size
                if wins and all(_wins(by, streams, t, metric, better) for t in sizes[i:]):
                    res[key] = s
                    break
        if any(("sdp-bcopy", streams, s) in by and by[("sdp-bcopy", streams, s)]["metrics"]
               for s in sizes):
            out.append(res)
    return out


def _wins(by, streams, size, metric, better) -> bool:
    b = by.get(("sdp-bcopy", streams, size))
    z = by.get(("sdp-zcopy-all", streams, size))
    if not b or not z:
        return True
    vb, vz = _med(b, metric), _med(z, metric)
    if vb is None or vz is None:
        return True
    return vz >= vb if better == "higher" else vz <= vb
