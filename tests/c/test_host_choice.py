"""The per-host choices of the library, simulated (src/sdp/calib.c).

Which copy routine moves stream bytes and whether zero copy between
page-aliased buffers goes through a bounce buffer are decided by measuring
the host once. These tests force each possible outcome - every copy routine
the CPU can run, and a host whose Cross Memory Attach is slow between
aliased buffers (SDP_CALIB_FAKE) - and check that the data path still moves
every byte exactly (the feature programs verify contents) and that the
chosen path was really taken (`sdp check --json`, the zc_bounced counter).
"""
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from buildpaths import SDP_BIN as SDP
from buildpaths import TESTS_C as BIN_DIR


def _env(tmp_path, **extra):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env["SDP_EXPECT"] = "sdp"
    env["SDP_CALIB_FILE"] = str(tmp_path / "calib")   # never the user's cache
    env.update(extra)
    return env


def _check_json(env):
    out = subprocess.run([str(SDP), "check", "--json"], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return json.loads(out)["host"]


def _routines(tmp_path):
    host = _check_json(_env(tmp_path))
    return sorted(host["copy"]["gbps"])


def _run(prog, env):
    res = subprocess.run([str(SDP), "run", "--", str(BIN_DIR / prog)], env=env,
                         cwd=str(BIN_DIR), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, f"{prog}: exit {res.returncode}\n{res.stderr[-3000:]}"
    return res.stderr


def test_every_routine_carries_the_stream(tmp_path):
    names = _routines(tmp_path)
    assert "libc" in names
    for name in names:
        env = _env(tmp_path, SDP_COPY=name, SDP_LOG="2")
        err = _run("t_stream", env)
        assert re.search(r"copy routine %s\b" % name, err), err[-2000:]
        _run("t_iocalls", env)


@pytest.mark.parametrize("prefer", ["avx2", "sse2", "movsb", "avx512"])
def test_simulated_host_preference(tmp_path, prefer):
    names = _routines(tmp_path)
    if prefer not in names:
        pytest.skip(f"this CPU cannot run {prefer}")
    fake = "copy=" + ",".join(f"{n}:{9.0 if n == prefer else 1.0}" for n in names) + ";cma=5:5"
    env = _env(tmp_path, SDP_CALIB_FAKE=fake)
    host = _check_json(env)
    assert host["copy"]["routine"] == prefer
    assert host["copy"]["source"] == "simulated"
    # The library makes the same choice at its first connection.
    err = _run("t_stream", dict(env, SDP_LOG="1"))
    assert re.search(r"copy routine %s\b" % prefer, err), err[-2000:]


def test_page_aliased_zero_copy_bounces(tmp_path):
    env = _env(tmp_path, SDP_CALIB_FAKE="cma=1.2:5.1", SDP_LOG="1",
               T_ZC_ALIAS_EXPECT="bounce")
    host = _check_json(env)
    assert host["zcopy"]["page_aliased"] == "bounce"
    err = _run("t_zc_alias", env)
    assert "page-aliased zero copy bounced" in err
    # ... and a host without the problem copies directly.
    env = _env(tmp_path, SDP_CALIB_FAKE="cma=5:5.1", SDP_LOG="1")
    err = _run("t_zc_alias", env)
    assert "page-aliased zero copy direct" in err
    assert re.findall(r"bounced (\d+) aliased", err) == ["0", "0"], err[-2000:]


def test_az_threshold_simulated(tmp_path):
    """The AZ threshold follows the simulated host's copy and protection
    costs, `sdp check` reports it with the two costs that decided it, and
    SDP_AZCOPY_THRESH overrides it (t_az_thresh: the sends follow it)."""
    # copies at 20 GB/s (0.2048 us a page), a cycle of 6 us + 0.05 us a
    # page: from 39 pages on (38.8), + 1 page for any alignment = 160 KiB
    fake = "copy=libc:10;cma=20:20;az=20:6:0.05"
    env = _env(tmp_path, SDP_CALIB_FAKE=fake)
    env.pop("SDP_AZCOPY_THRESH", None)
    az = _check_json(env)["az_threshold"]
    assert az["threshold"] == 40 * 4096 and az["source"] == "simulated", az
    assert az["at"]["pages"] == 39 and az["at"]["copy_us"] > az["at"]["cycle_us"], az
    assert az["below"]["pages"] == 38, az
    assert az["below"]["copy_us"] <= az["below"]["cycle_us"], az
    assert [s["bytes"] for s in az["sizes"]] == [8192 << i for i in range(10)]
    out = subprocess.run([str(SDP), "check"], env=env, capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert re.search(r"^azcopy_threshold\s+163840 bytes \(simulated", out, re.M), out
    # a host where protecting never pays
    az = _check_json(dict(env, SDP_CALIB_FAKE="copy=libc:10;cma=20:20;az=20:1000:0"))[
        "az_threshold"]
    assert az["threshold"] == 0 and az["at"] is None, az
    # the setting wins over the measurement
    az = _check_json(dict(env, SDP_AZCOPY_THRESH="65536"))["az_threshold"]
    assert az["threshold"] == 65536 and az["source"] == "SDP_AZCOPY_THRESH", az
    assert az["measured"] == 163840, az


def test_az_threshold_measured_and_cached(tmp_path):
    """On the real host: measured once, then read from the cache."""
    env = _env(tmp_path)
    env.pop("SDP_AZCOPY_THRESH", None)
    first = _check_json(env)["az_threshold"]
    assert len(first["sizes"]) == 10, first
    assert all(s["copy_us"] > 0 and s["mprotect_us"] > 0 for s in first["sizes"]), first
    again = _check_json(env)["az_threshold"]
    assert again["source"] == "cache" and again["threshold"] == first["threshold"], again
    assert "az 8192 " in (tmp_path / "calib").read_text()


def test_streaming_stores_forced_either_way(tmp_path):
    """SDP_COPY_STREAM on and off: every byte arrives (t_copy_stream
    verifies contents, both directions at once) and the counter says which
    stores wrote them. `auto` follows the host's state at the moment, which
    tests/unit/test_copy.c drives with simulated timings."""
    for mode in ("on", "off"):
        env = _env(tmp_path, SDP_COPY_STREAM=mode, SDP_ZCOPY_THRESH="0",
                   T_COPY_STREAM_EXPECT=mode)
        err = _run("t_copy_stream", env)
        got = re.findall(r"streamed (\d+) of (\d+) Buffer Copy bytes", err)
        assert got, err[-2000:]
        streamed, copied = int(got[0][0]), int(got[0][1])
        assert copied > 4_000_000, err[-2000:]
        assert (streamed > 0) == (mode == "on"), (mode, got)


def test_check_measures_both_stores_between_cpus(tmp_path):
    st = _check_json(_env(tmp_path))["copy"]["stream"]
    assert st["mode"] == "auto" and st["min_bytes"] == 4096, st
    assert _check_json(_env(tmp_path, SDP_COPY_STREAM="off"))["copy"]["stream"]["mode"] == "off"
    if len(os.sched_getaffinity(0)) >= 2:
        assert st["cpus"][0] != st["cpus"][1], st
        assert st["plain_gbps"] > 0 and st["stream_gbps"] > 0, st
    else:
        assert "plain_gbps" not in st, st
