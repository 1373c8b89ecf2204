"""results.json, CSV files and report.md."""
from __future__ import annotations

import csv
import json
import os

from .core import Experiment, fmt_size
from .stats import ratio

BW_RAW = "raw-cma"
LAT_RAW = "raw-shm"


def _fmt(v, digits=3):
    if v is None:
        return "–"
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        return f"{v:.{digits}g}"
    return str(v)


def _pval(k, v):
    if k in ("size", "file_size") and isinstance(v, int):
        return fmt_size(v)
    return str(v)


def _med(row, metric):
    m = (row or {}).get("metrics", {}).get(metric)
    return m["median"] if m else None


def raw_limit(rows: list[dict], exp: Experiment, row: dict):
    """The raw (no socket layer) value this row is compared with: raw-shm
    latency at the same size, raw-cma bandwidth at the same message size."""
    size = row["params"].get("size")
    if size is None:
        return None
    if exp.primary in ("p50_us", "mean_us") and exp.name == "latency":
        cfg, metric, exps = LAT_RAW, "p50_us", ("latency",)
    elif exp.primary == "gbps" or (exp.name == "perbyte"):
        cfg, metric, exps = BW_RAW, "gbps", (exp.name, "stream")
    else:
        return None
    for e in exps:
        for r in rows:
            if (r["experiment"] == e and r["config"] == cfg and r.get("available")
                    and r["params"].get("size") == size and _med(r, metric) is not None):
                return _med(r, metric), metric
    return None


def tcp_peer(rows: list[dict], row: dict):
    for r in rows:
        if (r["experiment"] == row["experiment"] and r["config"] == "tcp"
                and r["params"] == row["params"] and r.get("available")):
            return r
    return None


def write_json(doc: dict, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(doc, fh, indent=1, sort_keys=False)
        fh.write("\n")


def write_csvs(doc: dict, exps: list[Experiment], outdir: str) -> list[str]:
    paths = []
    for exp in exps:
        rows = [r for r in doc["rows"] if r["experiment"] == exp.name]
        if not rows:
            continue
        pkeys = []
        for r in rows:
            for k in r["params"]:
                if k not in pkeys:
                    pkeys.append(k)
        cols = ["experiment", "config"] + pkeys + ["available", "valid", "transport", "reps"]
        for m in exp.metrics:
            cols += [f"{m.name}_median", f"{m.name}_min", f"{m.name}_max"]
        cols += ["cpu_client_s_per_s", "cpu_server_s_per_s", "cpu_total_s_per_s",
                 "cpu_s_per_gb", "reason"]
        path = os.path.join(outdir, f"{exp.name}.csv")
        with open(path, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(cols)
            for r in rows:
                line = [r["experiment"], r["config"]] + [r["params"].get(k, "") for k in pkeys]
                line += [r["available"], r["valid"], r.get("transport") or "", r["reps"]]
                for m in exp.metrics:
                    st = r["metrics"].get(m.name) or {}
                    line += [st.get("median", ""), st.get("min", ""), st.get("max", "")]
                for k in ("client_s_per_s", "server_s_per_s", "total_s_per_s", "s_per_gb"):
                    line.append((r["cpu"].get(k) or {}).get("median", ""))
                line.append(r.get("reason") or "")
                w.writerow(line)
        paths.append(path)
    return paths


def _exp_table(exp: Experiment, rows: list[dict], all_rows: list[dict]) -> list[str]:
    avail = [r for r in rows if r.get("available")]
    if not avail:
        return ["_No configuration could run this experiment._", ""]
    pkeys = []
    for r in avail:
        for k in r["params"]:
            if k not in pkeys:
                pkeys.append(k)
    pm = exp.metric(exp.primary)
    others = [m for m in exp.metrics if m.name != exp.primary]
    head = pkeys + ["config", f"{pm.label} ({pm.unit}) median [min–max]"]
    head += [f"{m.label} ({m.unit})" for m in others]
    head += ["CPU client+server (s/s)", "CPU (s/GB)", "× tcp", "× raw", "transport"]
    zc = any(r.get("extra", {}).get("zcopy_fraction") for r in avail)
    if zc:
        head.append("zero-copy share")
    azc = any(r.get("extra", {}).get("azcopy_fraction") for r in avail)
    if azc:
        head.append("asynchronous share (sender faults, copies aside)")
    stc = any("stream_fraction" in r.get("extra", {}) for r in avail)
    if stc:
        head.append("streaming-store share")
    head.append("valid")
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in avail:
        st = r["metrics"].get(exp.primary)
        main = f"{_fmt(st['median'])} [{_fmt(st['min'])}–{_fmt(st['max'])}]" if st else "–"
        cells = [_pval(k, r["params"].get(k, "")) for k in pkeys] + [f"`{r['config']}`", main]
        cells += [_fmt(_med(r, m.name)) for m in others]
        cpu = r.get("cpu", {})
        cc = (cpu.get("client_s_per_s") or {}).get("median")
        cs = (cpu.get("server_s_per_s") or {}).get("median")
        ct = (cpu.get("total_s_per_s") or {}).get("median")
        cells.append(f"{_fmt(ct)} ({_fmt(cc)}+{_fmt(cs)})" if ct is not None else "–")
        cells.append(_fmt((cpu.get("s_per_gb") or {}).get("median")))
        t = tcp_peer(all_rows, r)
        rt = ratio(_med(r, exp.primary), _med(t, exp.primary)) if t and r["config"] != "tcp" else None
        cells.append(_fmt(rt, 2) if rt is not None else "–")
        lim = raw_limit(all_rows, exp, r)
        rr = None
        if lim and not r["config"].startswith("raw-"):
            rr = ratio(_med(r, lim[1]), lim[0])
        cells.append(_fmt(rr, 2) if rr is not None else "–")
        cells.append(r.get("transport") or "–")
        if zc:
            z = r.get("extra", {}).get("zcopy_fraction")
            cells.append(f"{z['median'] * 100:.0f} %" if z else "–")
        if azc:
            ex = r.get("extra", {})
            a = ex.get("azcopy_fraction")
            cells.append(f"{a['median'] * 100:.0f} % ({_fmt((ex.get('az_faults') or {}).get('median'))}, "
                         f"{_fmt((ex.get('az_cow_copies') or {}).get('median'))})" if a else "–")
        if stc:
            sf = r.get("extra", {}).get("stream_fraction")
            cells.append(f"{sf['median'] * 100:.0f} % [{sf['min'] * 100:.0f}–{sf['max'] * 100:.0f}]"
                         if sf else "–")
        if r["valid"]:
            cells.append("yes")
        else:
            cells.append("**no**: " + (r.get("reason") or "").replace("|", "/")[:160])
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    return out


def _az_threshold_line(at: dict) -> str:
    """The AZ threshold of `sdp check --json` (host.az_threshold) in words:
    what was chosen, from where, and the copy and protection-cycle costs
    that decided it."""
    def kib(b):
        return f"{b // 1024} KiB" if b % 1024 == 0 else f"{b} bytes"
    th = at.get("threshold")
    txt = ("AZ threshold (`SDP_AZCOPY_THRESH`): "
           + (f"**{kib(th)}**" if th else "**never** (a copy costs less than protecting here)")
           + f" ({at.get('source')}, protection by {at.get('protect')}")
    if at.get("source") == "SDP_AZCOPY_THRESH":
        m = at.get("measured")
        txt += f"; measured here: {kib(m) if m else 'never'}"
    for key, rel in (("at", ">"), ("below", "<=")):
        c = at.get(key)
        if c:
            txt += (f"; {c['pages']} pages: copy {c['copy_us']:.1f} µs {rel} protect + "
                    f"unprotect {c['cycle_us']:.1f} µs")
    return txt + ("). A send of the threshold has one page more than the count where "
                  "the copy costs more, whatever its alignment; smaller sends are "
                  "synchronous (zero copy or Buffer Copy).")


def write_report(doc: dict, exps: list[Experiment], outdir: str, pngs: dict) -> str:
    rows = doc["rows"]
    m = doc["machine"]
    o = doc["options"]
    L = ["# SDP benchmark report", ""]
    L += [f"- date: {doc['created']}",
          f"- command: `{doc['command']}`",
          f"- mode: {o['mode']} — {o['reps']} repetitions per point after one warm-up run per "
          f"configuration, configurations interleaved (A B C A B C …); "
          f"{o['dur_s']} s per micro-benchmark run, {o['app_dur_s']} s per application run",
          "- CPU placement: " + ("**pinned** — server on CPU %s, client on CPU %s (taskset)"
                                 % (o["cpus"][0], o["cpus"][-1]) if o["pin"] else
                                 "**unpinned** — the scheduler places client and server"),
          f"- total time: {doc['duration_s']:.0f} s"
          + (" (**interrupted**, partial results)" if doc.get("interrupted") else ""),
          ""]
    L += ["## Machine", "", "| | |", "|---|---|"]
    for k in ("hostname", "cpu_vendor", "cpu_model", "cores", "cpus_allowed", "memory_gib", "kernel", "os",
              "python", "date", "loadavg_at_start", "sched_autogroup"):
        L.append(f"| {k} | {m.get(k)} |")
    L += ["", "## Configurations", "", "| config | what | available |", "|---|---|---|"]
    for c in doc["configs"]:
        av = "yes" if c["available"] else f"**not available**: {c.get('reason')}"
        L.append(f"| `{c['name']}` | {c['description']} | {av} |")
    if doc.get("sdp_features") is not None:
        L += ["", f"`sdp check --json` features: {', '.join(doc['sdp_features']) or 'none'}"]
    h = doc.get("sdp_host")
    if h:
        cp, zc = h.get("copy", {}), h.get("zcopy", {})
        speeds = ", ".join(f"{k} {v:.1f}" for k, v in cp.get("gbps", {}).items())
        L += ["", "Per-host choices of the library (`sdp check --json`): copy routine "
              f"**{cp.get('routine')}** ({cp.get('source')}; GB/s through a ring: {speeds}); "
              f"zero-copy threshold {zc.get('threshold')} bytes; page-aliased zero copy "
              f"{zc.get('page_aliased')} (CMA 64 KiB {zc.get('cma_gbps_same_offset')} GB/s at "
              f"the same page offset, {zc.get('cma_gbps_shifted')} shifted)."]
        sm = cp.get("stream") or {}
        if sm:
            txt = (f"Streaming stores into shared memory (`SDP_COPY_STREAM`): **{sm.get('mode')}**, "
                   f"for copies of {sm.get('min_bytes')} bytes and more")
            if sm.get("plain_gbps") is not None:
                txt += (f"; at the start of this run, 16 KiB messages from CPU {sm['cpus'][0]} to "
                        f"CPU {sm['cpus'][1]} moved at {sm['plain_gbps']:.1f} GB/s with plain "
                        f"stores and {sm['stream_gbps']:.1f} GB/s with streaming stores "
                        "(on a VM this changes whenever the host moves the vCPUs; the library "
                        "learns it per thread while it runs: the streaming-store share column)")
            L += ["", txt + "."]
        at = h.get("az_threshold")
        if at:
            L += ["", _az_threshold_line(at)]
        az = h.get("azcopy")
        if az:
            L += ["", "Asynchronous Zero Copy on this host (`sdp check`, async_zero_copy): "
                  + ("" if az.get("ok") else "**not usable**: ") + str(az.get("why"))]
    L += ["", "Ratios: **× tcp** = value / value of `tcp` at the same parameters; **× raw** = "
          "value / the no-socket limit at the same message size (`raw-shm` p50 latency for "
          "latency, `raw-cma` bandwidth for bandwidth). CPU is CPU-seconds per second of the "
          "measured interval (1.0 = one CPU fully busy), client + server, and CPU-seconds per "
          "GB moved (= µs per KB, the per-byte overhead of paper 000).", ""]
    L += _summary(doc, exps)
    L += between_hosts(doc, exps)
    L += ["## Experiments", ""]
    for exp in exps:
        L.append(f"- [{exp.name}](#{exp.name}) — {exp.title} ({exp.reproduces})")
    L.append("")
    for exp in exps:
        erows = [r for r in rows if r["experiment"] == exp.name]
        L += [f"<a id=\"{exp.name}\"></a>", f"## {exp.name}: {exp.title}", "",
              f"Reproduces: {exp.reproduces}. {exp.description}", ""]
        if exp.name in pngs:
            L += [f"![{exp.name}]({os.path.basename(pngs[exp.name])})", ""]
        una = {}
        for r in erows:
            if not r.get("available"):
                una.setdefault(r["config"], r.get("reason"))
        L += _exp_table(exp, erows, rows)
        if una:
            L.append("Not available: " + "; ".join(f"`{c}` ({why})" for c, why in una.items()))
            L.append("")
        if exp.name == "perbyte":
            L += _crossover_md(doc.get("derived", {}).get("crossover", []))
        note = getattr(exp, "report_note", None)
        if note:
            L += [note, ""]
        if hasattr(exp, "report_extra"):
            L += exp.report_extra(erows)
    path = os.path.join(outdir, "report.md")
    with open(path, "w") as fh:
        fh.write("\n".join(L) + "\n")
    return path


def _crossover_md(cross: list[dict]) -> list[str]:
    L = ["### BCopy/ZCopy crossover", ""]
    if not cross:
        return L + ["_Not available: needs both `sdp-bcopy` and `sdp-zcopy-all` results._", ""]
    L += ["| connections | bandwidth crossover | per-byte CPU crossover |", "|---|---|---|"]
    for c in cross:
        b = c.get("bandwidth_crossover_bytes")
        u = c.get("cpu_crossover_bytes")
        L.append(f"| {c['streams']} | {fmt_size(b) if b else 'none in range'} | "
                 f"{fmt_size(u) if u else 'none in range'} |")
    L += ["", "Paper 000 (§4.2) found the bandwidth crossover at 256 KB for 1 connection, 64 KB "
          "for 2, 32 KB for 4 and 16 KB for 8.", ""]
    return L


def representative(exp: Experiment, rows: list[dict]) -> dict | None:
    """The parameter point a summary shows: 64 KiB messages (or the size
    closest to it), the most streams / clients / connections there are."""
    params = []
    for r in rows:
        if r["experiment"] == exp.name and r["params"] not in params:
            params.append(r["params"])
    if not params:
        return None

    def key(p):
        size = p.get("size", p.get("file_size", 65536))
        busy = p.get("busy_us", 0)
        win = p.get("window", 0)
        many = p.get("streams", 0) + p.get("clients", 0) + p.get("conns", 0)
        return (abs(size - 65536) if isinstance(size, int) else 0, busy, win, -many)
    return sorted(params, key=key)[0]


def _summary(doc: dict, exps: list[Experiment]) -> list[str]:
    rows = doc["rows"]
    cfgs = [c["name"] for c in doc["configs"] if c["available"]]
    if not cfgs:
        return []
    L = ["## Summary", "",
         "Median of the primary metric at one representative point per experiment "
         "(nearest to 64 KiB; most streams/clients); `×` = ratio to `tcp`. "
         "Invalid results are struck through.", ""]
    L.append("| experiment | point | metric | " + " | ".join(f"`{c}`" for c in cfgs) + " |")
    L.append("|---|---|---|" + "---|" * len(cfgs))
    for exp in exps:
        p = representative(exp, rows)
        if p is None:
            continue
        m = exp.metric(exp.primary)
        base = None
        for r in rows:
            if r["experiment"] == exp.name and r["config"] == "tcp" and r["params"] == p:
                base = _med(r, exp.primary)
        cells = []
        for c in cfgs:
            r = next((r for r in rows if r["experiment"] == exp.name and r["config"] == c
                      and r["params"] == p), None)
            if r is None or not r.get("available"):
                cells.append("n/a")
                continue
            v = _med(r, exp.primary)
            if v is None:
                cells.append("failed")
                continue
            txt = _fmt(v)
            if base and c != "tcp":
                txt += f" ({v / base:.2f}×)"
            if not r.get("valid"):
                txt = f"~~{txt}~~"
            cells.append(txt)
        pt = ", ".join(f"{k}={_pval(k, v)}" for k, v in p.items())
        L.append(f"| [{exp.name}](#{exp.name}) | {pt} | {m.label} ({m.unit}, "
                 f"{'lower' if m.better == 'lower' else 'higher'} is better) | "
                 + " | ".join(cells) + " |")
    L.append("")
    return L


# ---- between hosts: sdp-ofi against kernel TCP on the same veth -------------------

VETH_BASE = "tcp-veth-offload"
OFI = "sdp-ofi"
OFI_TARGET = 0.9

# The papers' figures, quoted as the reference for what an RDMA provider
# (verbs) would change; not measured here.
PAPER_REFERENCE = [
    "Paper 002 (SDP over InfiniBand, Mellanox 4x HCAs, VAPI): one-way latency for 2-byte "
    "messages 28 µs for SDP against 30 µs for IPoIB, 7 µs for VAPI send/receive and 5.5 µs "
    "for RDMA Write; bandwidth up to 471 MB/s for SDP against 169 MB/s for IPoIB (2.8×) and "
    "825 MB/s for VAPI, with a much lower share of the host CPU, \"mainly attributed to the "
    "NIC offload of the transportation and network layers\".",
    "Paper 003 (ConnectX, IPoIB with LSO/LRO): verbs 1.22 µs, SDP Buffer Copy 11.4 µs, SDP "
    "zero copy 11.8 µs, IPoIB 20.5 µs for small messages (IPoIB-RC 75.8 % above SDP-BC); SDP "
    "zero copy with one stream within 13.5 % of the verbs RDMA bandwidth, and IPoIB-UD with "
    "LSO/LRO only 6.5 % below the best multi-stream SDP bandwidth.",
    "Paper 000 (zero copy SDP): with 8 connections zero copy sustains more than 700 MB/s "
    "against 500 MB/s for Buffer Copy, with 8 times less CPU; registering memory per "
    "operation is what zero copy pays, hence the registration cache.",
]


def _perf_ratio(exp: Experiment, metric: str, v, base):
    """sdp-ofi relative to the baseline as a performance ratio (> 1 =
    better), whichever way the metric goes."""
    if v is None or not base:
        return None
    better = exp.metric(metric).better if any(m.name == metric for m in exp.metrics) else "higher"
    if better == "lower":
        return base / v if v else None
    return v / base


def between_hosts(doc: dict, exps: list[Experiment]) -> list[str]:
    rows = doc["rows"]
    if not any(r["config"] == OFI and r.get("available") for r in rows):
        return []
    L = ["## Between hosts: SDP over ofi against kernel TCP on the same veth", "",
         "**libfabric's `tcp` provider runs over kernel TCP.** Between the two network "
         "namespaces every SDP message of `sdp-ofi` travels on a TCP connection of "
         "libfabric's across the same veth pair as `tcp-veth-offload` (offloads on), so "
         "`sdp-ofi` does SDP's work on top of the TCP it is compared with: it cannot beat it. "
         f"The target is to stay within {OFI_TARGET}× of `{VETH_BASE}` (performance ratio: "
         "bandwidth or rate ÷ TCP's, TCP's latency ÷ SDP's; ≥ 1 means as good or better). "
         "`tcp-veth-nooffload` (TSO/GSO/GRO off) is TCP as a stack without segmentation "
         "offloads would give it.", ""]
    head = ["experiment", "point", "metric", f"`{VETH_BASE}`", "`tcp-veth-nooffload`",
            f"`{OFI}`", f"{OFI} ÷ {VETH_BASE}", f"≥ {OFI_TARGET}?", "CPU s/GB (TCP / SDP)"]
    L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    byexp = {e.name: e for e in exps}
    for e in exps:
        pts = []
        for r in rows:
            if r["experiment"] == e.name and r["config"] == OFI and r.get("available"):
                pts.append(r)
        for r in pts:
            def peer(cfg):
                return next((x for x in rows if x["experiment"] == e.name and x["config"] == cfg
                             and x["params"] == r["params"] and x.get("available")), None)
            b, n = peer(VETH_BASE), peer("tcp-veth-nooffload")
            metrics = [e.primary] + (["p99_us"] if e.primary == "p50_us" else [])
            for m in metrics:
                mm = byexp[e.name].metric(m)

                def cell(x):
                    st = (x or {}).get("metrics", {}).get(m)
                    if not st:
                        return "–"
                    t = f"{_fmt(st['median'])} [{_fmt(st['min'])}–{_fmt(st['max'])}]"
                    return t if x.get("valid") else f"~~{t}~~"
                rt = _perf_ratio(e, m, _med(r, m), _med(b, m))
                cg = lambda x: _fmt(((x or {}).get("cpu", {}).get("s_per_gb") or {}).get("median"))
                pt = ", ".join(f"{k}={_pval(k, v)}" for k, v in r["params"].items())
                L.append(f"| {e.name} | {pt} | {mm.label} ({mm.unit}) | {cell(b)} | {cell(n)} | "
                         f"{cell(r)} | {_fmt(rt, 2) if rt is not None else '–'} | "
                         f"{'–' if rt is None else ('yes' if rt >= OFI_TARGET else '**no**')} | "
                         f"{cg(b)} / {cg(r)} |")
    L.append("")
    zc = [r for r in rows if r["experiment"] == "ofizc" and r["config"] == OFI
          and r.get("available")]
    for r in zc:
        ex = r.get("extra") or {}
        hr = ex.get("mr_hit_rate")
        L.append("Zero copy over ofi (1 MiB sends, every one Read Zero Copy): registration cache "
                 "hit rate " + (f"**{hr['median'] * 100:.2f} %** (median of runs; "
                                f"{ex.get('mr_cache_hits', 0)} hits, "
                                f"{ex.get('mr_cache_misses', 0)} misses in the first)"
                                if hr else "not read") + ".")
        L.append("")
    L += ["**What the verbs provider would change** (not measured here: no RDMA hardware on "
          "this host). The same code runs on libfabric's `verbs` provider (InfiniBand, RoCE); "
          "there the NIC moves the bytes: no kernel TCP under SDP, RDMA Read for zero copy "
          "without the peer's CPU, completions without system calls. The papers' figures are "
          "the reference for that, labelled as such:", ""]
    L += [f"- *Reference, paper:* {t}" for t in PAPER_REFERENCE]
    L.append("")
    return L
