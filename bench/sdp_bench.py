#!/usr/bin/env python3
"""sdp bench: every experiment of the papers under every configuration
(kernel TCP over loopback and over veth, SDP Buffer Copy / Zero Copy /
Asynchronous Zero Copy, and the raw no-socket limits).

    sdp bench [--quick] [--out DIR] [--only EXPERIMENT,...] [--pin]

Writes results.json, one CSV and one PNG per experiment and report.md into
DIR (default bench/out/<date>-<host>). See docs/BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from sdpbench import SCHEMA_VERSION  # noqa: E402
from sdpbench import configs as cfgmod  # noqa: E402
from sdpbench import machine, micro, plots, report, runner, schema  # noqa: E402
from sdpbench.core import Ctx  # noqa: E402
from sdpbench.netns import Netns  # noqa: E402
from sdpbench.progress import Progress  # noqa: E402

MODES = {
    #        reps  micro s  app s
    "full": (5, 0.2, 2),
    "quick": (3, 0.1, 1),
    "tiny": (1, 0.04, 1),
}


def all_experiments():
    exps = micro.experiments()
    try:
        from sdpbench import apps
        exps += apps.experiments()
    except ImportError:
        pass
    from sdpbench import pfs
    exps += pfs.experiments()
    return exps


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="sdp bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="representative subset: fewer sizes and repetitions (< 3 min)")
    ap.add_argument("--out", metavar="DIR", help="output directory (default bench/out/<date>-<host>)")
    ap.add_argument("--only", metavar="EXP[,EXP...]", help="run only these experiments")
    ap.add_argument("--configs", metavar="CFG[,CFG...]", help="run only these configurations")
    ap.add_argument("--pin", action="store_true",
                    help="pin server and client to different CPUs with taskset")
    ap.add_argument("--reps", type=int, help="repetitions per point (default 5, --quick 3)")
    ap.add_argument("--list", action="store_true", help="list experiments and configurations")
    ap.add_argument("--no-progress", action="store_true", help="no progress line")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def default_out(root):
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return os.path.join(root, "bench", "out", f"{stamp}-{socket.gethostname()}")


def _on_term(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    root = os.path.dirname(HERE)
    bindir = os.environ.get("SDP_BENCH_BINDIR", os.path.join(root, "build", "bin"))
    mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
    reps, dur, app_dur = MODES[mode]
    if args.reps:
        reps = max(1, args.reps)
    exps = all_experiments()
    configs = cfgmod.all_configs()
    if args.list:
        for e in exps:
            print(f"{e.name:12s} {e.title} ({e.reproduces})")
        print()
        for c in configs:
            print(f"{c.name:20s} {c.description}")
        return 0
    if args.only:
        want = [w.strip() for w in args.only.split(",") if w.strip()]
        names = {e.name for e in exps}
        bad = [w for w in want if w not in names]
        if bad:
            print(f"sdp bench: unknown experiment(s) {', '.join(bad)}; known: "
                  f"{', '.join(sorted(names))}", file=sys.stderr)
            return 2
        exps = [e for e in exps if e.name in want]
    if args.configs:
        want = [w.strip() for w in args.configs.split(",") if w.strip()]
        names = {c.name for c in configs}
        bad = [w for w in want if w not in names]
        if bad:
            print(f"sdp bench: unknown configuration(s) {', '.join(bad)}; known: "
                  f"{', '.join(c.name for c in configs)}", file=sys.stderr)
            return 2
        configs = [c for c in configs if c.name in want]

    out = os.path.abspath(args.out or default_out(root))
    os.makedirs(out, exist_ok=True)
    cpus = sorted(os.sched_getaffinity(0))
    tmp = tempfile.mkdtemp(prefix="sdp-bench-")
    os.chmod(tmp, 0o755)   # nginx workers run as an unprivileged user
    ctx = Ctx(root=root, bindir=bindir, mode=mode, reps=reps, dur=dur, app_dur=app_dur,
              pin=args.pin, cpus=[cpus[0], cpus[-1]] if len(cpus) > 1 else cpus, tmp=tmp)
    if args.pin and len(cpus) < 2:
        print("sdp bench: --pin needs two CPUs; running unpinned", file=sys.stderr)
        ctx.pin = False

    signal.signal(signal.SIGTERM, _on_term)
    netns = Netns()
    ctx.netns = netns
    t_start = time.monotonic()
    prog = Progress(0, enabled=not args.no_progress)
    rows: list = []
    interrupted = False
    exp_seconds: dict = {}
    mach = machine.describe()
    command = "sdp bench " + " ".join(shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    try:
        if any(c.kind == "veth" for c in configs):
            prog.message("setting up network namespaces ...")
        cfgmod.resolve(configs, ctx, netns)
        pl = runner.plan(exps, configs, ctx)
        prog.total = max(runner.count_runs(pl, ctx), 1)
        prog.message(f"sdp bench ({mode}): {len(exps)} experiments, "
                     f"{sum(c.available for c in configs)}/{len(configs)} configurations available, "
                     f"{prog.total} runs, about {runner.estimate_seconds(pl, ctx) / 60:.0f} min "
                     f"-> {out}")
        for c in configs:
            if not c.available:
                prog.message(f"  {c.name}: not available ({c.reason})")

        def done(exp, secs):
            exp_seconds[exp.name] = round(secs, 1)
            prog.message(f"  {exp.name} done in {secs:.1f} s")

        rows = runner.run_all(pl, ctx, prog, on_experiment_done=done)
    except KeyboardInterrupt:
        interrupted = True
        prog.message("interrupted: writing partial results")
    finally:
        prog.finish()
        offl = {}
        if netns.ok:
            offl = {"nooffload": netns.offload_state(False), "offload": netns.offload_state(True)}
        netns.teardown()
        shutil.rmtree(tmp, ignore_errors=True)

    doc = {
        "schema": SCHEMA_VERSION,
        "created": mach["date"],
        "command": command.strip(),
        "options": {"mode": mode, "quick": mode != "full", "tiny": mode == "tiny",
                    "pin": ctx.pin, "cpus": ctx.cpus, "reps": reps, "dur_s": dur,
                    "app_dur_s": app_dur, "only": [e.name for e in exps],
                    "warmup_runs": 1},
        "machine": mach,
        "sdp_features": ctx.sdp_features,
        "sdp_host": ctx.sdp_host,
        "veth_offload_state": offl,
        "veth_namespaces": [n for off in (False, True) for n in netns.names(off)],
        "configs": [c.to_json() for c in configs],
        "experiments": [e.describe() for e in exps],
        "rows": rows,
        "derived": {"crossover": runner.crossover(rows)},
        "duration_s": round(time.monotonic() - t_start, 1),
        "experiment_seconds": exp_seconds,
        "interrupted": interrupted,
    }
    order = [c.name for c in configs]
    pngs = {}
    for exp in exps:
        path = os.path.join(out, f"{exp.name}.png")
        try:
            plots.plot_experiment(exp, rows, path, order)
            pngs[exp.name] = path
        except Exception as e:  # a plot problem must not lose the results
            print(f"sdp bench: plot {exp.name} failed: {e}", file=sys.stderr)
    report.write_json(doc, os.path.join(out, "results.json"))
    report.write_csvs(doc, exps, out)
    rpath = report.write_report(doc, exps, out, pngs)
    problems = schema.validate(doc)
    if problems:
        print("sdp bench: results.json does not match its schema:", file=sys.stderr)
        for p in problems[:20]:
            print("  " + p, file=sys.stderr)
    n_ok = sum(1 for r in rows if r.get("valid"))
    n_run = sum(1 for r in rows if r.get("available"))
    print(f"sdp bench: {n_ok}/{n_run} result rows valid, {doc['duration_s']:.0f} s; "
          f"report: {rpath}")
    if interrupted:
        return 130
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
