"""What machine the results come from."""
from __future__ import annotations

import datetime
import os
import platform
import socket


def _cpuinfo(key: str) -> str | None:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _cpu_model() -> str:
    return _cpuinfo("model name") or platform.processor() or "unknown"


def _mem_gib() -> float | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _autogroup() -> bool | None:
    """kernel.sched_autogroup_enabled: with it each session is a scheduling
    group, and a spinner's sched_yield runs only its own group's tasks (the
    data center's tiers run in separate sessions)."""
    try:
        with open("/proc/sys/kernel/sched_autogroup_enabled") as fh:
            return fh.read().strip() == "1"
    except OSError:
        return None


def describe() -> dict:
    return {
        "hostname": socket.gethostname(),
        "cpu_vendor": _cpuinfo("vendor_id") or "unknown",
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _mem_gib(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_at_start": _loadavg(),
        "sched_autogroup": _autogroup(),
    }
