"""Statistics of the benchmark suite on known inputs."""
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

from sdpbench import stats  # noqa: E402
from sdpbench.core import Sample  # noqa: E402


def test_median_odd_even():
    assert stats.median([3, 1, 2]) == 2
    assert stats.median([4, 1, 3, 2]) == 2.5
    assert stats.median([7]) == 7
    assert stats.median([]) is None


def test_median_ignores_missing():
    assert stats.median([None, 5, float("nan"), 1, 3]) == 3


def test_percentile_known_values():
    xs = list(range(1, 101))          # 1..100
    assert stats.percentile(xs, 0) == 1
    assert stats.percentile(xs, 100) == 100
    assert stats.percentile(xs, 50) == pytest.approx(50.5)
    assert stats.percentile(xs, 99) == pytest.approx(99.01)
    assert stats.percentile([10, 20], 25) == pytest.approx(12.5)
    assert stats.percentile([5], 99) == 5
    assert stats.percentile([], 50) is None
    with pytest.raises(ValueError):
        stats.percentile([1], 101)


def test_percentile_order_independent():
    a = [9, 1, 8, 2, 7, 3, 6, 4, 5]
    assert stats.percentile(a, 90) == stats.percentile(sorted(a), 90)


def test_summarize():
    s = stats.summarize([5.0, 1.0, 3.0, None])
    assert s == {"median": 3.0, "min": 1.0, "max": 5.0, "n": 3}
    assert stats.summarize([None]) is None


def test_ratio():
    assert stats.ratio(10, 4) == 2.5
    assert stats.ratio(1, 0) is None
    assert stats.ratio(None, 2) is None


def test_cdf_points():
    xs, ys = stats.cdf_points([3, 1, 2, 4])
    assert xs == [1, 2, 3, 4]
    assert ys == [0.25, 0.5, 0.75, 1.0]


def test_sample_cpu_per_gb():
    # 1.5 CPU-seconds per second over 2 s while moving 3 GB -> 1 s/GB
    s = Sample(ok=True, cpu_client=1.0, cpu_server=0.5, bytes=3e9, seconds=2.0)
    assert s.cpu_total == 1.5
    assert s.cpu_per_gb == pytest.approx(1.0)
    assert Sample(ok=True).cpu_per_gb is None


def test_runner_aggregate_and_crossover():
    from sdpbench import micro, runner
    from sdpbench.configs import all_configs
    exp = [e for e in micro.experiments() if e.name == "perbyte"][0]
    cfgs = {c.name: c for c in all_configs()}
    rows = []
    # zero copy wins from 64 KiB up in bandwidth, from 16 KiB up in CPU
    table = {4096: ((10, 1.0), (5, 2.0)), 16384: ((10, 1.0), (8, 0.5)),
             65536: ((10, 1.0), (20, 0.4)), 1 << 20: ((10, 1.0), (30, 0.3))}
    for size, ((bw_b, c_b), (bw_z, c_z)) in table.items():
        for name, bw, c in (("sdp-bcopy", bw_b, c_b), ("sdp-zcopy-all", bw_z, c_z)):
            samples = [Sample(ok=True, metrics={"gbps": bw + d, "us_per_kb": c}, transport="sdp")
                       for d in (-1, 0, 1)]
            rows.append(runner.aggregate(exp, cfgs[name], {"size": size, "streams": 1}, samples))
    r0 = rows[0]
    assert r0["valid"] and r0["metrics"]["gbps"] == {"median": 10, "min": 9, "max": 11, "n": 3,
                                                     "unit": "Gbit/s"}
    cross = runner.crossover(rows)
    assert cross == [{"streams": 1, "bandwidth_crossover_bytes": 65536,
                      "cpu_crossover_bytes": 16384, "sizes": sorted(table)}]


def test_aggregate_marks_failures_and_transport():
    from sdpbench import micro, runner
    from sdpbench.configs import all_configs
    exp = micro.experiments()[1]
    cfg = all_configs()[0]
    bad = Sample(ok=False, reason="boom")
    good = Sample(ok=True, metrics={"gbps": 1.0}, transport="tcp")
    row = runner.aggregate(exp, cfg, {"size": 1}, [good, bad])
    assert not row["valid"] and "boom" in row["reason"] and row["failures"] == 1
    wrong = Sample(ok=True, metrics={"gbps": 1.0}, transport="tcp", transport_ok=False,
                   reason="SDP path not used")
    row = runner.aggregate(exp, cfg, {"size": 1}, [wrong])
    assert not row["valid"] and row["reason"] == "SDP path not used"
    assert math.isclose(row["metrics"]["gbps"]["median"], 1.0)


def test_runner_interleaves_and_stops_a_failing_config():
    from sdpbench import runner
    from sdpbench.configs import Config
    from sdpbench.core import Ctx, Experiment, Metric
    from sdpbench.progress import Progress

    calls = []

    class Fake(Experiment):
        name = "fake"
        metrics = [Metric("v", "u", "value")]
        primary = "v"

        def params(self, mode):
            return [{"size": 1}, {"size": 2}]

        def run(self, ctx, cfg, p):
            calls.append((cfg.name, p["size"]))
            if cfg.name == "b":
                raise RuntimeError("hangs")
            return Sample(ok=True, metrics={"v": float(p["size"])}, transport="tcp")

    a, b = Config("a", "tcp", "A"), Config("b", "tcp", "B")
    ctx = Ctx(root=".", bindir=".", reps=3)
    pl = runner.plan([Fake()], [a, b], ctx)
    rows = runner.run_all(pl, ctx, Progress(runner.count_runs(pl, ctx), enabled=False))
    # warm-up a b, then a b a b a b for size 1 ... (interleaved)
    assert calls[:6] == [("a", 1), ("b", 1), ("a", 1), ("b", 1), ("a", 1), ("b", 1)]
    # b failed three times in a row (warm-up included): not run any more
    assert sum(1 for c in calls if c[0] == "b") == runner.MAX_FAIL_STREAK
    assert sum(1 for c in calls if c[0] == "a") == 1 + 2 * 3
    ra = [r for r in rows if r["config"] == "a"]
    rb = [r for r in rows if r["config"] == "b"]
    assert all(r["valid"] for r in ra) and len(ra) == 2
    assert all(not r["valid"] and r["reason"] for r in rb) and len(rb) == 2
    assert ra[1]["metrics"]["v"]["median"] == 2.0


def test_report_ratios_and_representative_point():
    from sdpbench import micro, report
    exps = {e.name: e for e in micro.experiments()}

    def row(exp, cfg, params, **metrics):
        return {"experiment": exp, "config": cfg, "params": params, "available": True,
                "valid": True, "metrics": {k: {"median": v, "min": v, "max": v, "n": 1, "unit": ""}
                                           for k, v in metrics.items()}}
    rows = [row("stream", "tcp", {"size": 65536}, gbps=10.0),
            row("stream", "sdp-bcopy", {"size": 65536}, gbps=30.0),
            row("stream", "raw-cma", {"size": 65536}, gbps=60.0),
            row("multistream", "sdp-bcopy", {"size": 65536, "streams": 4}, gbps=45.0),
            row("latency", "raw-shm", {"size": 64}, p50_us=0.5),
            row("latency", "tcp", {"size": 64}, p50_us=5.0)]
    assert report.raw_limit(rows, exps["stream"], rows[1]) == (60.0, "gbps")
    # multi-stream bandwidth is compared with raw-cma measured in `stream`
    assert report.raw_limit(rows, exps["multistream"], rows[3]) == (60.0, "gbps")
    assert report.raw_limit(rows, exps["latency"], rows[5]) == (0.5, "p50_us")
    assert report.tcp_peer(rows, rows[1]) is rows[0]
    ms = [row("multistream", "tcp", {"size": s, "streams": n}, gbps=1.0)
          for s in (65536, 1 << 20) for n in (1, 2, 4, 8)]
    assert report.representative(exps["multistream"], ms) == {"size": 65536, "streams": 8}
