"""The C feature tests (tests/c) under SDP against instrumented builds of
libsdp.so: AddressSanitizer + UndefinedBehaviorSanitizer (every program) and
ThreadSanitizer (the programs with threads, shared waits and zero copy).

The test programs are the normal build's (build/tests/c); only libsdp.so is
instrumented, in build/asan and build/tsan (cmake -DSDP_SANITIZE=address |
thread). A sanitizer runtime must be loaded before anything it intercepts,
so LD_PRELOAD is "RUNTIME:libsdp.so" (the runtime is the one the
instrumented libsdp.so was linked against, as ldd names it). Reports go to
files (log_path), so a report from a forked child or an exec'd program is
not lost: any report file fails the test, whatever the exit status.

ASan runs with detect_leaks=1: leaks of the library, and of the test
programs, at every normal exit of a process that loaded it.
"""
import importlib.util
import os
import re
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BUILD = Path(os.environ.get("SDP_BUILD_DIR", ROOT / "build"))
BIN_DIR = Path(os.environ.get("SDP_TESTS_C_DIR", BUILD / "tests" / "c"))
SKIP = 77

_spec = importlib.util.spec_from_file_location(
    "c_features", ROOT / "tests" / "c" / "test_c_features.py")
_cf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cf)
PROGRAMS = _cf.PROGRAMS
PROG_ENV = _cf.PROG_ENV

# Threads, several waiters on one connection, zero copy, signals: where a
# data race would be. (TSan costs 2-5x; t_shared_wait alone ~40 s.)
TSAN_PROGRAMS = ["t_threads", "t_shared_wait", "t_duplex", "t_zc_mixed",
                 "t_zc_signal", "t_sigpartial", "t_epoll", "t_poll", "t_fork",
                 "t_prefork", "t_peek_lowat", "t_shut_rd_wake", "t_fork_epoll"]


def _build(kind):
    d = ROOT / "build" / ("asan" if kind == "address" else "tsan")
    for cmd in (["cmake", "-S", str(ROOT), "-B", str(d), "-DSDP_SANITIZE=" + kind,
                 "-DCMAKE_BUILD_TYPE=RelWithDebInfo"],
                ["cmake", "--build", str(d), "-j", str(os.cpu_count() or 2),
                 "--target", "sdp"]):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if res.returncode:
            pytest.fail("%s build failed: %s\n%s%s" % (kind, " ".join(cmd),
                        res.stdout[-3000:], res.stderr[-3000:]), pytrace=False)
    lib = d / "lib" / "libsdp.so"
    ldd = subprocess.run(["ldd", str(lib)], capture_output=True, text=True).stdout
    name = "libasan" if kind == "address" else "libtsan"
    m = re.search(r"%s\.so[.\d]* => (\S+)" % name, ldd)
    if not m:
        pytest.fail("%s does not link a shared %s runtime:\n%s" % (lib, name, ldd),
                    pytrace=False)
    return lib, m.group(1)


@pytest.fixture(scope="module")
def asan():
    return _build("address")


@pytest.fixture(scope="module")
def tsan():
    return _build("thread")


# LeakSanitizer in the child of a fork() made while the library's progress
# thread (Asynchronous Zero Copy) ran still lists that thread, which the
# child does not have, and says so before it checks for leaks anyway. A
# report file with nothing else in it is that notice, not a finding.
_FORK_NOTICE = re.compile(r"==\d+==Running thread \d+ was not suspended\. "
                          r"False leaks are possible\.")


def _only_fork_notice(path):
    lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return bool(lines) and all(_FORK_NOTICE.fullmatch(ln.strip()) for ln in lines)


def _run(prog, lib, runtime, opts_var, opts, tmp_path):
    exe = BIN_DIR / prog
    if not exe.exists():
        pytest.fail("%s is not built (looked in %s)" % (prog, BIN_DIR))
    logs = tmp_path / "reports"
    logs.mkdir()
    env = dict(os.environ)
    env["LD_PRELOAD"] = "%s:%s" % (runtime, lib)
    env["SDP_EXPECT"] = "sdp"
    env[opts_var] = "%s:log_path=%s/report" % (opts, logs)
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1:log_path=%s/report" % logs
    env.update(PROG_ENV.get(prog, {}))
    try:
        res = subprocess.run([str(exe)], env=env, cwd=str(BIN_DIR),
                             stdin=subprocess.DEVNULL, capture_output=True,
                             timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("%s hung under the sanitizer" % prog, pytrace=False)
    reports = [r for r in sorted(logs.iterdir()) if not _only_fork_notice(r)]
    if reports:
        text = "\n".join(r.read_text(errors="replace")[:6000] for r in reports[:3])
        pytest.fail("%s: %d sanitizer report(s):\n%s" % (prog, len(reports), text),
                    pytrace=False)
    if res.returncode == SKIP:
        pytest.skip("%s: %s" % (prog, res.stderr.decode(errors="replace").strip()))
    if res.returncode != 0:
        pytest.fail("%s failed under the sanitizer (status %d)\n%s" % (
            prog, res.returncode, res.stderr.decode(errors="replace")[-4000:]),
            pytrace=False)


@pytest.mark.parametrize("prog", PROGRAMS)
def test_asan_ubsan(prog, asan, tmp_path):
    lib, rt = asan
    _run(prog, lib, rt, "ASAN_OPTIONS",
         "detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=66", tmp_path)


@pytest.mark.parametrize("prog", TSAN_PROGRAMS)
def test_tsan(prog, tsan, tmp_path):
    lib, rt = tsan
    _run(prog, lib, rt, "TSAN_OPTIONS", "halt_on_error=1:exitcode=66", tmp_path)
