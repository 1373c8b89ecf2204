"""CPU accounting from /proc/<pid>/stat, for processes the suite does not
build itself (iperf3, nginx, redis, the app servers, wrk)."""
from __future__ import annotations

import os
import resource

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def parse_stat(text: str) -> dict:
    """Parse the one line of /proc/<pid>/stat. The command name is in
    parentheses and may itself contain spaces and parentheses, so split at
    the last ')'. Times are returned in seconds."""
    lp = text.index("(")
    rp = text.rindex(")")
    pid = int(text[:lp].strip())
    comm = text[lp + 1:rp]
    f = text[rp + 2:].split()
    # f[0] is field 3 (state); field n is f[n - 3]
    return {
        "pid": pid,
        "comm": comm,
        "state": f[0],
        "ppid": int(f[1]),
        "utime": int(f[11]) / CLK_TCK,
        "stime": int(f[12]) / CLK_TCK,
        "cutime": int(f[13]) / CLK_TCK,
        "cstime": int(f[14]) / CLK_TCK,
        "num_threads": int(f[17]),
        "starttime": int(f[19]) / CLK_TCK,
    }


def read_stat(pid: int) -> dict | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return parse_stat(fh.read())
    except (OSError, ValueError, IndexError):
        return None


def process_cpu(pid: int) -> float | None:
    """user+system CPU seconds of a live process (all its threads)."""
    st = read_stat(pid)
    if st is None:
        return None
    return st["utime"] + st["stime"]


def all_stats() -> dict[int, dict]:
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                out[st["pid"]] = st
    return out


def descendants(root: int, stats: dict[int, dict] | None = None) -> list[int]:
    """root and every live descendant."""
    stats = stats if stats is not None else all_stats()
    children: dict[int, list[int]] = {}
    for st in stats.values():
        children.setdefault(st["ppid"], []).append(st["pid"])
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        if p in stats or p == root:
            out.append(p)
        todo.extend(children.get(p, []))
    return out


class TreeCPU:
    """CPU seconds used by process trees between start() and stop().

    Each process is sampled by (pid, starttime) so that reused pids are not
    confused; reaped children are counted through their parent's cutime and
    cstime. A process that appears and exits entirely between two samples
    without being reaped by a watched parent is missed (the suite's servers
    are long-lived, so this only loses short helpers)."""

    def __init__(self, roots: list[int]):
        self.roots = list(roots)
        self.t0: dict[tuple[int, float], float] = {}

    def _sample(self) -> dict[tuple[int, float], float]:
        stats = all_stats()
        seen: dict[tuple[int, float], float] = {}
        for r in self.roots:
            for pid in descendants(r, stats):
                st = stats.get(pid)
                if st is None:
                    continue
                seen[(pid, st["starttime"])] = (st["utime"] + st["stime"]
                                                + st["cutime"] + st["cstime"])
        return seen

    def start(self) -> None:
        self.t0 = self._sample()

    def stop(self) -> float:
        t1 = self._sample()
        total = 0.0
        for key, v in t1.items():
            total += v - self.t0.get(key, 0.0)
        return max(total, 0.0)


def children_cpu() -> float:
    """user+system seconds of all reaped children of this process."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime
