"""A short fault campaign in `make test`: 20 SIGKILL trials over the five
phases and the four SIGSTOP trials (1 s stops). tests/soak/faults.py says
what is checked; `make soak` runs 300 trials with 3 s stops."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("SDP_BUILD_DIR", ROOT / "build"))


def test_faults_short(tmp_path):
    if not (BUILD / "lib" / "libsdp.so").exists():
        pytest.fail("libsdp.so is not built", pytrace=False)
    out = tmp_path / "faults.json"
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    res = subprocess.run([sys.executable, str(HERE / "faults.py"), "--trials", "20",
                          "--stop-seconds", "1", "--seed", str(os.getpid()),
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=600, env=env)
    if res.returncode or not out.exists():
        pytest.fail("fault campaign failed (exit %d):\n%s\n%s" % (
            res.returncode, res.stdout[-6000:], res.stderr[-2000:]), pytrace=False)
    r = json.loads(out.read_text())
    assert r["kill_trials"] == 20 and r["hangs"] == 0 and r["late_over_1s"] == 0
