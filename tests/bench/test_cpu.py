"""CPU accounting from /proc: parsing and plausibility on a busy child."""
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))

from sdpbench import cpu  # noqa: E402

BUSY = "import time\nend = time.time() + 5\nwhile time.time() < end:\n    pass\n"


def test_parse_stat_with_odd_command_name():
    line = ("1234 (my (odd) name) S 1 1234 1234 0 -1 4194560 100 0 0 0 "
            f"{3 * cpu.CLK_TCK} {2 * cpu.CLK_TCK} {cpu.CLK_TCK} 0 20 0 3 0 {50 * cpu.CLK_TCK} "
            "1000 100 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0")
    st = cpu.parse_stat(line)
    assert st["pid"] == 1234
    assert st["comm"] == "my (odd) name"
    assert st["state"] == "S"
    assert st["ppid"] == 1
    assert st["utime"] == pytest.approx(3.0)
    assert st["stime"] == pytest.approx(2.0)
    assert st["cutime"] == pytest.approx(1.0)
    assert st["num_threads"] == 3
    assert st["starttime"] == pytest.approx(50.0)


def test_own_process_stat():
    st = cpu.read_stat(os.getpid())
    assert st is not None and st["pid"] == os.getpid()
    assert st["utime"] >= 0 and st["stime"] >= 0
    assert cpu.read_stat(2 ** 22 + 12345) is None


def test_busy_child_is_plausible():
    p = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        tree = cpu.TreeCPU([p.pid])
        time.sleep(0.2)
        tree.start()
        t0 = time.monotonic()
        time.sleep(1.0)
        used = tree.stop()
        wall = time.monotonic() - t0
        # a spinning process gets at most one CPU; on a busy shared machine
        # it still gets a noticeable share
        assert 0.05 <= used <= wall * 1.1 + 0.05, used
        assert cpu.process_cpu(p.pid) >= used - 0.05
        assert p.pid in cpu.descendants(p.pid)
    finally:
        p.kill()
        p.wait()


def test_children_cpu_counts_reaped_child():
    before = cpu.children_cpu()
    subprocess.run([sys.executable, "-c", BUSY.replace("5", "0.3")], check=True)
    after = cpu.children_cpu()
    assert after - before > 0.02
