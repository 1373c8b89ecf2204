"""One PNG per experiment, drawn with matplotlib's Agg backend in the
manner of the paper figure the experiment reproduces: lines for the
metric against message size / streams / clients, CPU as bars on a second
axis where the paper shows CPU, bars for single-point tests."""
from __future__ import annotations

import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402

from .core import Experiment, fmt_size, size_tick  # noqa: E402

COLORS = {
    "tcp": "#1f77b4", "tcp-veth-nooffload": "#7f7f7f", "tcp-veth-offload": "#17becf",
    "sdp-bcopy": "#d62728", "sdp-zcopy": "#2ca02c", "sdp-zcopy-all": "#9467bd",
    "sdp-azcopy": "#ff7f0e", "raw-cma": "#000000", "raw-shm": "#8c564b",
}
MARKERS = {"tcp": "o", "tcp-veth-nooffload": "v", "tcp-veth-offload": "^", "sdp-bcopy": "s",
           "sdp-zcopy": "D", "sdp-zcopy-all": "P", "sdp-azcopy": "*", "raw-cma": "x",
           "raw-shm": "+"}
SERIES_STYLES = ["-", "--", ":", "-."]


def _med(r, metric):
    m = r.get("metrics", {}).get(metric)
    return (m["median"], m["min"], m["max"]) if m else None


def _cpu(r, which):
    key = {"total": "total_s_per_s", "server": "server_s_per_s"}[which]
    m = r.get("cpu", {}).get(key)
    return m["median"] if m else None


def _xfmt(param):
    if param in ("size", "file_size"):
        return FuncFormatter(lambda v, _: size_tick(v) if v >= 1 else "")
    return FuncFormatter(lambda v, _: f"{v:g}")


def _usable(rows):
    return [r for r in rows if r.get("available") and r.get("metrics")]


def plot_experiment(exp: Experiment, rows: list[dict], path: str, configs_order: list[str]) -> str:
    rows = [r for r in rows if r["experiment"] == exp.name]
    if hasattr(exp, "plot"):
        fig = exp.plot(rows, plt)
    elif exp.xparam is None or exp.kind == "app":
        fig = _bars(exp, rows, configs_order)
    else:
        fig = _lines(exp, rows, configs_order)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _empty(ax, text="no results (configurations not available or all runs failed)"):
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=9,
            wrap=True)
    ax.set_xticks([])
    ax.set_yticks([])


def _lines(exp: Experiment, rows: list[dict], order: list[str]):
    use = _usable(rows)
    panels = sorted({r["params"].get(exp.panel_param) for r in rows}) if exp.panel_param else [None]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.4 * len(panels), 4.6), squeeze=False)
    m = exp.metric(exp.primary)
    for ax, pv in zip(axes[0], panels):
        prow = [r for r in use if pv is None or r["params"].get(exp.panel_param) == pv]
        xs_all = sorted({r["params"][exp.xparam] for r in rows
                         if pv is None or r["params"].get(exp.panel_param) == pv})
        if not prow:
            _empty(ax)
        cfgs = [c for c in order if any(r["config"] == c for r in prow)]
        series = sorted({r["params"].get(exp.series_param) for r in prow}) if exp.series_param else [None]
        ax2 = None
        if exp.cpu_bars and prow:
            ax2 = ax.twinx()
            _cpu_bars(ax2, exp, prow, cfgs, xs_all)
        for c in cfgs:
            for si, sv in enumerate(series):
                pts = sorted((r["params"][exp.xparam], _med(r, exp.primary)) for r in prow
                             if r["config"] == c and (sv is None or r["params"].get(exp.series_param) == sv)
                             and _med(r, exp.primary))
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                ys = [p[1][0] for p in pts]
                lo = [max(p[1][0] - p[1][1], 0) for p in pts]
                hi = [max(p[1][2] - p[1][0], 0) for p in pts]
                label = c if sv is None else f"{c}, {exp.series_param}={_fmt_val(exp.series_param, sv)}"
                ax.errorbar(xs, ys, yerr=[lo, hi], label=label, color=COLORS.get(c),
                            marker=MARKERS.get(c, "o"), linestyle=SERIES_STYLES[si % 4],
                            markersize=5, capsize=2, linewidth=1.5, zorder=3)
                if exp.name == "latency":
                    p99 = [(r["params"][exp.xparam], _med(r, "p99_us")) for r in prow
                           if r["config"] == c and _med(r, "p99_us")]
                    p99.sort()
                    if p99:
                        ax.plot([p[0] for p in p99], [p[1][0] for p in p99], color=COLORS.get(c),
                                linestyle=":", linewidth=1, alpha=0.7, zorder=2)
        if exp.logx and xs_all and min(xs_all) > 0:
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(xs_all))
            ax.xaxis.set_minor_locator(NullLocator())
        elif xs_all:
            ax.set_xticks(xs_all)
        ax.xaxis.set_major_formatter(_xfmt(exp.xparam))
        if exp.logy and prow:
            ax.set_yscale("log")
        ax.set_xlabel(_axis_label(exp.xparam))
        ax.set_ylabel(f"{m.label} ({m.unit})")
        ttl = exp.title if pv is None else f"{exp.title}: {_fmt_val(exp.panel_param, pv)}"
        ax.set_title(ttl, fontsize=10)
        ax.grid(True, alpha=0.3, zorder=0)
        if ax2 is not None:
            ax.set_zorder(ax2.get_zorder() + 1)
            ax.patch.set_visible(False)
        if prow:
            ax.legend(fontsize=7, loc="best", framealpha=0.9)
    if exp.name == "latency":
        fig.text(0.01, 0.01, "solid: p50, dotted: p99; error bars: min-max over repetitions",
                 fontsize=7)
    else:
        fig.text(0.01, 0.01, "median of repetitions, error bars min-max"
                 + ("; bars: CPU (right axis)" if exp.cpu_bars else ""), fontsize=7)
    fig.suptitle(f"{exp.name} — reproduces {exp.reproduces}", fontsize=9)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    return fig


def _cpu_bars(ax2, exp, prow, cfgs, xs_all):
    n = max(len(cfgs), 1)
    width_frac = 0.8 / n
    for i, c in enumerate(cfgs):
        xs, hs = [], []
        for x in xs_all:
            vals = [_cpu(r, exp.cpu_bars) for r in prow if r["config"] == c
                    and r["params"][exp.xparam] == x and _cpu(r, exp.cpu_bars) is not None]
            if not vals:
                continue
            v = max(vals) if exp.series_param else vals[0]
            off = (i - (n - 1) / 2) * width_frac
            if exp.logx and x > 0:
                xs.append(x * 2 ** off)
                hs.append(v)
            else:
                xs.append(x + off * _step(xs_all))
                hs.append(v)
        if not xs:
            continue
        if exp.logx:
            widths = [x * (2 ** (width_frac / 2) - 2 ** (-width_frac / 2)) for x in xs]
        else:
            widths = [width_frac * _step(xs_all)] * len(xs)
        ax2.bar(xs, hs, width=widths, color=COLORS.get(c), alpha=0.25, edgecolor=COLORS.get(c),
                linewidth=0.5, zorder=1)
    which = "server CPU" if exp.cpu_bars == "server" else "CPU, both ends"
    ax2.set_ylabel(f"{which} (CPU-s/s; 1.0 = one CPU busy)", fontsize=8)
    lim = ax2.get_ylim()
    ax2.set_ylim(0, max(lim[1] * 1.6, 0.1))


def size_axis(ax, sizes):
    """log2 x axis with ticks at the given message sizes."""
    if not sizes or min(sizes) <= 0:
        return
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(sizes))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(_xfmt("size"))


def _step(xs):
    if len(xs) < 2:
        return 1.0
    return min(b - a for a, b in zip(xs, xs[1:]))


def _fmt_val(param, v):
    if param in ("size", "file_size") and isinstance(v, (int, float)):
        return fmt_size(v)
    return str(v)


def _axis_label(param):
    return {"size": "message size", "streams": "number of streams",
            "clients": "number of clients", "busy_us": "computation between sends (µs)",
            "window": "page-fault window W (calls)", "file_size": "file size",
            "conns": "connections"}.get(param, param or "")


def _bars(exp: Experiment, rows: list[dict], order: list[str]):
    use = _usable(rows)
    groups = []
    for r in rows:
        key = tuple(sorted(r["params"].items()))
        if key not in groups:
            groups.append(key)
    cfgs = [c for c in order if any(r["config"] == c for r in use)]
    fig, ax = plt.subplots(figsize=(max(6.4, 1.2 * len(groups) * max(len(cfgs), 1) * 0.5 + 3), 4.6))
    if not use:
        _empty(ax)
    m = exp.metric(exp.primary)
    n = max(len(cfgs), 1)
    w = 0.8 / n
    for i, c in enumerate(cfgs):
        xs, ys, lo, hi = [], [], [], []
        for gi, g in enumerate(groups):
            for r in use:
                if r["config"] == c and tuple(sorted(r["params"].items())) == g:
                    v = _med(r, exp.primary)
                    if v:
                        xs.append(gi + (i - (n - 1) / 2) * w)
                        ys.append(v[0])
                        lo.append(max(v[0] - v[1], 0))
                        hi.append(max(v[2] - v[0], 0))
        if xs:
            ax.bar(xs, ys, width=w, color=COLORS.get(c), label=c, yerr=[lo, hi], capsize=2,
                   zorder=3)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([", ".join(f"{k}={_fmt_val(k, v)}" for k, v in g) or exp.name
                        for g in groups], fontsize=8)
    ax.set_ylabel(f"{m.label} ({m.unit})")
    ax.set_title(exp.title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3, zorder=0)
    if use:
        ax.legend(fontsize=7)
    fig.text(0.01, 0.01, "median of repetitions, error bars min-max", fontsize=7)
    fig.suptitle(f"{exp.name} — reproduces {exp.reproduces}", fontsize=9)
    fig.tight_layout(rect=(0, 0.03, 1, 0.95))
    return fig


def is_png(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(8) == b"\x89PNG\r\n\x1a\n"
    except OSError:
        return False


__all__ = ["plot_experiment", "is_png", "COLORS", "math", "os"]
