"""End-to-end: `sdp_bench.py --quick --tiny` on a tiny parameter set. Checks
results.json against the documented schema, the PNGs and report.md. No
test here asserts a speed."""
import json
import os
import subprocess
import sys

import pytest

from buildpaths import PERF_BIN, REPO

REPO = str(REPO)
sys.path.insert(0, os.path.join(REPO, "bench"))

from sdpbench import schema  # noqa: E402
from sdpbench.plots import is_png  # noqa: E402

SDP_CONFIGS = {"sdp-bcopy", "sdp-zcopy", "sdp-zcopy-all", "sdp-azcopy"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    if not PERF_BIN.exists():
        pytest.skip(f"{PERF_BIN} not built")
    p = subprocess.run([sys.executable, os.path.join(REPO, "bench", "sdp_bench.py"), "--quick",
                        "--tiny", "--out", str(out), "--no-progress"],
                       capture_output=True, text=True, timeout=240)
    with open(out / "results.json") as fh:
        doc = json.load(fh)
    return p, out, doc


def test_exit_and_schema(run):
    p, out, doc = run
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert schema.validate(doc) == []
    assert doc["options"]["quick"] is True


def test_every_experiment_and_config_present(run):
    _, out, doc = run
    exps = {e["name"] for e in doc["experiments"]}
    assert {"latency", "stream", "multistream", "perbyte", "hotspot", "fanin", "fanout",
            "multiclient", "overlap", "pagefault", "connrate", "iperf3", "sockperf", "redis",
            "nginx", "datacenter", "pfs"} <= exps
    cfgs = {c["name"]: c for c in doc["configs"]}
    assert SDP_CONFIGS <= set(cfgs)
    for name in SDP_CONFIGS:
        c = cfgs[name]
        # an SDP configuration is either measured or says why not
        assert c["available"] or c["reason"]
        rows = [r for r in doc["rows"] if r["config"] == name]
        assert rows, f"{name} has no rows"
        if not c["available"]:
            assert all(not r["available"] and r["reason"] for r in rows)
    # kernel TCP is always measurable here
    tcp_rows = [r for r in doc["rows"] if r["config"] == "tcp" and r["experiment"] == "stream"]
    assert tcp_rows and tcp_rows[0]["available"] and tcp_rows[0]["metrics"]


def test_pngs_and_csvs(run):
    _, out, doc = run
    for e in doc["experiments"]:
        png = out / f"{e['name']}.png"
        assert png.exists(), png
        assert is_png(str(png)), png
        assert png.stat().st_size > 2000
    assert (out / "latency.csv").exists()


def test_report_mentions_everything(run):
    _, out, doc = run
    text = (out / "report.md").read_text()
    for e in doc["experiments"]:
        assert f"## {e['name']}" in text
        assert f"({e['name']}.png)" in text
    for c in doc["configs"]:
        assert f"`{c['name']}`" in text
    assert doc["machine"]["cpu_model"] in text
    assert doc["machine"]["cpu_vendor"] in text
    # the library's per-host choices are in every report
    host = doc["sdp_host"]
    assert host and host["copy"]["routine"]
    assert f"copy routine **{host['copy']['routine']}**" in text
    # ... the AZ threshold too, with what decided it
    at = host["az_threshold"]
    assert at["source"] in ("measured", "cache", "simulated", "SDP_AZCOPY_THRESH")
    assert "AZ threshold (`SDP_AZCOPY_THRESH`): **" in text
    assert "unpinned" in text or "pinned" in text
    assert "sdp bench" in text


def test_schema_validator_catches_problems(run):
    _, _, doc = run
    broken = json.loads(json.dumps(doc))
    broken["rows"][0]["metrics"] = {"x": {"median": 5, "min": 6, "max": 7, "n": 1, "unit": "u"}}
    broken["rows"][0]["config"] = "nope"
    del broken["machine"]["kernel"]
    errs = schema.validate(broken)
    assert any("min <= median" in e for e in errs)
    assert any("unknown config" in e for e in errs)
    assert any("kernel" in e for e in errs)
    assert schema.validate([]) != []


def test_namespaces_removed(run):
    _, _, doc = run
    names = doc["veth_namespaces"]
    assert names and all(n.startswith("sdpb") for n in names)
    p = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    listed = {ln.split()[0] for ln in p.stdout.splitlines() if ln.strip()}
    assert not listed & set(names), listed & set(names)


def test_pfs_rows(run):
    """The parallel file system rows of the tiny run: MooseFS under kernel
    TCP and under SDP, every client's data checked by sha256, every daemon
    connection SDP in the SDP row, the bytes counted on the chunk servers'
    sockets. Nothing about speed."""
    _, _, doc = run
    rows = [r for r in doc["rows"] if r["experiment"] == "pfs"]
    assert rows
    ran = [r for r in rows if r["available"]]
    if not ran:
        pytest.skip("pfs not run here: " + rows[0]["reason"])
    by = {r["config"]: r for r in ran}
    assert "tcp" in by and any(c in by for c in SDP_CONFIGS), sorted(by)
    for name, r in by.items():
        assert r["valid"], f"{name}: {r['reason']}"
        clients = r["params"]["clients"]
        assert len(r["extra"]["sha256"]) == clients
        assert r["extra"]["read_traveled"]["min"] >= 0.98
        assert r["extra"]["write_traveled"]["min"] >= 0.98
        for m in ("read_MBps", "write_MBps", "create_per_s"):
            assert r["metrics"][m]["median"] > 0
        if name in SDP_CONFIGS:
            assert r["transport"] == "sdp"
            conns = r["extra"]["connections"]
            for kind in ("chunkserver-master", "client-master", "client-chunkserver"):
                assert conns[kind]["sdp"] >= 1 and conns[kind]["tcp"] == 0, conns
            # the daemons' own totals, written into SDP_STATS_DIR at exit
            exits = r["extra"]["exit_stats"]
            for comm in ("mfsmaster", "mfschunkserver", "mfsmount"):
                assert exits[comm]["sdp_conns"] >= 1 and exits[comm]["tcp_conns"] == 0, exits
        else:
            assert r["transport"] == "tcp"
