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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("SDP_BUILD_DIR", ROOT / "build"))
BIN_DIR = BUILD / "tests" / "c"
SDP = BUILD / "bin" / "sdp"


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
