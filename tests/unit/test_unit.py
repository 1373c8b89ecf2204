"""Run the C unit test programs (build/tests/unit/test_*).

Each program exits 0 on success, 77 to be skipped, anything else on failure.
The policy parser also runs under valgrind when it is installed. The build
directory is <repo>/build, or $SDP_BUILD_DIR.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from buildpaths import TESTS_UNIT as UNIT
SKIP = 77


def _programs():
    if not UNIT.is_dir():
        return []
    return sorted(p for p in UNIT.glob("test_*")
                  if p.is_file() and os.access(p, os.X_OK))


def _run(cmd, timeout):
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, timeout=timeout)
    if res.returncode == SKIP:
        pytest.skip(f"{Path(cmd[-1]).name}: {res.stdout.strip()[-300:]}")
    assert res.returncode == 0, (
        f"{' '.join(map(str, cmd))} exited {res.returncode}:\n{res.stdout}")


def test_built():
    assert (UNIT / "test_policy").is_file(), (
        f"{UNIT}/test_policy missing: build first "
        "(cmake -S . -B build && cmake --build build)")


@pytest.mark.parametrize("prog", _programs(), ids=lambda p: p.name)
def test_program(prog):
    _run([str(prog)], timeout=300)


def test_policy_valgrind():
    valgrind = shutil.which("valgrind")
    if not valgrind:
        pytest.skip("valgrind is not installed (apt-get install valgrind)")
    prog = UNIT / "test_policy"
    if not prog.is_file():
        pytest.fail(f"{prog} missing: build first")
    _run([valgrind, "-q", "--error-exitcode=1", "--leak-check=full",
          "--errors-for-leak-kinds=definite,indirect,possible", str(prog)],
         timeout=600)
