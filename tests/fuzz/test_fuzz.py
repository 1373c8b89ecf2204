"""Builds the libFuzzer targets (tests/fuzz/*.c, clang) and runs them.

* test_corpus: every committed input (tests/fuzz/corpus/TARGET, including
  the inputs that once crashed or hung the engine) runs once: a regression
  fails here first.
* test_fuzz: each target then fuzzes for FUZZ_SECONDS (default 20, so the
  three take about a minute), starting from the committed corpus; any
  crash, sanitizer report, leak, timeout (an input running for 5 s: a hang)
  or broken invariant fails, with the input that did it saved next to the
  build (build/fuzz/artifacts) and printed in base64.

Longer runs: `make fuzz FUZZ_SECONDS=600` (docs/TESTING.md).
"""
import base64
import os
import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("SDP_FUZZ_BUILD_DIR", ROOT / "build" / "fuzz"))
TARGETS = ["fuzz_hello", "fuzz_ring", "fuzz_policy"]
SECONDS = int(os.environ.get("FUZZ_SECONDS", "20"))


@pytest.fixture(scope="module")
def fuzz_bin():
    clang = shutil.which("clang")
    if not clang:
        pytest.fail("clang is not installed: run `bash scripts/install-deps.sh`",
                    pytrace=False)
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(BUILD), "-DSDP_FUZZ=ON",
                 "-DCMAKE_C_COMPILER=" + clang, "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                ["cmake", "--build", str(BUILD), "-j", str(os.cpu_count() or 2)]):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if res.returncode:
            pytest.fail("fuzz build failed: %s\n%s%s" % (" ".join(cmd), res.stdout[-4000:],
                                                         res.stderr[-4000:]), pytrace=False)
    return BUILD / "fuzz"


def _run(exe, args, timeout):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    res = subprocess.run([str(exe)] + args, capture_output=True, text=True,
                         timeout=timeout, env=env, stdin=subprocess.DEVNULL)
    return res


def _report(name, res, art):
    found = sorted(art.glob("*")) if art.exists() else []
    msg = ["%s exited %d" % (name, res.returncode)]
    for f in found[:3]:
        msg.append("input %s (base64): %s" % (f, base64.b64encode(f.read_bytes()).decode()))
    lines = [l for l in res.stderr.splitlines() if not l.startswith("#")]
    msg.append("\n".join(lines[-80:]))
    return "\n".join(msg)


@pytest.mark.parametrize("target", TARGETS)
def test_corpus(fuzz_bin, target, tmp_path):
    seeds = HERE / "corpus" / target.replace("fuzz_", "")
    assert seeds.is_dir() and any(seeds.iterdir()), "no committed corpus in %s" % seeds
    art = tmp_path / "art"
    art.mkdir()
    res = _run(fuzz_bin / target, ["-runs=0", "-timeout=5",
                                   "-artifact_prefix=%s/" % art, str(seeds)], 300)
    if res.returncode:
        pytest.fail(_report(target, res, art), pytrace=False)


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz(fuzz_bin, target, tmp_path):
    seeds = HERE / "corpus" / target.replace("fuzz_", "")
    work = tmp_path / "corpus"
    work.mkdir()
    art = BUILD / "artifacts" / target
    shutil.rmtree(art, ignore_errors=True)
    art.mkdir(parents=True)
    res = _run(fuzz_bin / target,
               ["-max_total_time=%d" % SECONDS, "-timeout=5", "-rss_limit_mb=2048",
                "-print_final_stats=1", "-artifact_prefix=%s/" % art, str(work), str(seeds)],
               SECONDS + 300)
    if res.returncode:
        pytest.fail(_report(target, res, art), pytrace=False)
    runs = [l for l in res.stderr.splitlines() if l.startswith("stat::number_of_executed_units")]
    assert runs, res.stderr[-2000:]
