#!/usr/bin/env python3
"""Where the time of the pfs experiment goes: runs the MooseFS cluster of
`sdp bench --only pfs` (bench/sdpbench/pfs.py) at one point under the
given configurations, one after the other and repeated, and records each
write and read phase with `perf record -e cpu-clock -a` (a software event:
works in a VM without a PMU), with call graphs. Every sample of the
run's processes is put in one bucket by its stacks:

  network   kernel TCP/IP (socket calls, skb copies, loopback/veth, the
            softirq receive path, tcp_poll) - for SDP configurations also
            the TCP socket that carries the wake-up tokens
  sdp       libsdp.so (its ring copies, polling, waits)
  fuse      the kernel FUSE driver (/dev/fuse, request queues, copies)
  tmpfs     the chunk files: shmem, page cache, their copies
  faults    page faults on fresh anonymous memory (buffers malloc hands
            out after giving them back to the kernel), wherever they hit
  mfs-code  MooseFS's own code (CRC32 of every 64 KiB block, protocol)
  memcpy    libc memcpy/memmove called by MooseFS (its buffer copies)
  sched     scheduling, wake-ups, futexes, poll/epoll/select themselves
  worker    the client programs (python3: the write/read calls' own cost)
  other     the remaining kernel and user time of these processes

plus the CPU the rest of the machine used meanwhile (other users). Prints
and writes a markdown table of CPU-seconds per GB moved per bucket, and
breakdown.json.

    python3 bench/pfs_profile.py [--configs tcp,sdp-bcopy,sdp-bcopy@SDP_SPIN_US=0] [--servers 4]
        [--clients 4] [--size-mib 256] [--reps 3] [--out DIR] [--no-perf]

Needs root, MooseFS and perf; not part of `sdp bench` (perf slows the
machine while it records)."""
from __future__ import annotations

import argparse
import copy
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from sdpbench import configs as cfgmod  # noqa: E402
from sdpbench import pfs  # noqa: E402
from sdpbench.core import Ctx  # noqa: E402
from sdpbench.netns import Netns  # noqa: E402
from sdpbench.stats import median  # noqa: E402

BUCKETS = ("network", "sdp", "fuse", "tmpfs", "faults", "mfs-code", "memcpy", "sched", "worker",
           "other")

NET = re.compile(r"^(tcp_|__tcp|tcp4|tcp6|ip_|__ip_|ip6_|ipv6_|inet_|__inet|sock_|__sock|sk_|"
                 r"__sk_|skb_|__skb|__kfree_skb|kfree_skb|consume_skb|net_rx|__netif|netif_|"
                 r"napi_|__napi|process_backlog|__dev_queue_xmit|dev_hard_start_xmit|"
                 r"loopback_xmit|veth_|__sys_sendto|__sys_recvfrom|__sys_sendmsg|__sys_recvmsg|"
                 r"___sys_sendmsg|___sys_recvmsg|__x64_sys_sendto|__x64_sys_recvfrom|"
                 r"do_softirq|__do_softirq|net_|release_sock|lock_sock|validate_xmit|"
                 r"dst_|nf_|__netdev|__napi_poll|sk_stream|sock_def_readable)")
FAULT = re.compile(r"^(exc_page_fault|asm_exc_page_fault|handle_mm_fault|__handle_mm_fault|"
                   r"do_anonymous_page|clear_page|do_user_addr_fault|do_huge_pmd_anonymous|"
                   r"__do_fault|do_fault)")
FUSE = re.compile(r"^(fuse_|__fuse|cuse_)")
TMPFS = re.compile(r"^(shmem_|__shmem|filemap_|__filemap|generic_perform_write|"
                   r"generic_file_|folio_|__folio|find_lock_entries|truncate_inode|"
                   r"simple_write_begin|shmem)")
SCHED = re.compile(r"^(schedule|__schedule|try_to_wake_up|wake_up|__wake_up|futex_|__futex|"
                   r"do_futex|do_sys_poll|__x64_sys_poll|__x64_sys_ppoll|do_poll|ep_poll|"
                   r"do_epoll|do_select|core_sys_select|pick_next|finish_task_switch|"
                   r"__x64_sys_sched_yield|do_sched_yield|hrtimer_|poll_schedule|"
                   r"__pollwait|enqueue_task|dequeue_task|update_curr|ttwu_|select_task_rq|"
                   r"native_queued_spin_lock|_raw_spin)")
MEMCPY = re.compile(r"(memmove|memcpy|memset)")


def classify(comm: str, frames: list[tuple[str, str]]) -> str:
    """frames: (symbol, dso), leaf first."""
    if comm.startswith("python"):
        return "worker"
    dsos = [d for _, d in frames]
    syms = [s for s, _ in frames]
    if any("libsdp" in d for d in dsos):
        return "sdp"
    kern = [s for s, d in frames if "kernel" in d]
    if any(FAULT.match(s) for s in kern):
        return "faults"
    if any(NET.match(s) for s in kern):
        return "network"
    if any(FUSE.match(s) for s in kern):
        return "fuse"
    if any(TMPFS.match(s) for s in kern):
        return "tmpfs"
    if kern and any(SCHED.match(s) for s in kern[:6]):
        return "sched"
    leaf_dso = dsos[0] if dsos else ""
    if re.search(r"mfs(chunkserver|mount|master)", leaf_dso):
        return "mfs-code"
    if "libc" in leaf_dso and syms and MEMCPY.search(syms[0]):
        return "memcpy"
    return "other"


def parse_script(text: str, pids: set[int], period_default: float = 250e-6) -> dict:
    """Seconds per bucket (and per comm) from `perf script -F comm,pid,tid,
    period,ip,sym,dso` output with call chains."""
    out = {b: 0.0 for b in BUCKETS}
    out["outside"] = 0.0
    comms: dict[str, dict[str, float]] = {}
    tops: dict[str, dict[str, float]] = {b: {} for b in BUCKETS}
    head = re.compile(r"^(\S.*?)\s+(\d+)/(\d+)\s+(\d+)\s*$")
    cur = None
    frames: list[tuple[str, str]] = []

    def flush():
        if cur is None:
            return
        comm, pid, period = cur
        secs = period / 1e9 if period else period_default
        if pid not in pids:
            out["outside"] += secs
            return
        b = classify(comm, frames)
        out[b] += secs
        cb = comms.setdefault(re.sub(r"\d+$", "", comm), {})
        cb[b] = cb.get(b, 0.0) + secs
        leaf = f"{frames[0][0]} ({os.path.basename(frames[0][1])})" if frames else "?"
        tops[b][leaf] = tops[b].get(leaf, 0.0) + secs

    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            flush()
            m = head.match(line.strip())
            if m:
                cur = (m.group(1), int(m.group(2)), int(m.group(4)))
            else:
                cur = None
            frames = []
            continue
        parts = line.strip().split(None, 1)
        if len(parts) < 2:
            continue
        rest = parts[1]
        dso = rest[rest.rfind("(") + 1:rest.rfind(")")] if "(" in rest else ""
        sym = rest[:rest.rfind("(")].strip() if "(" in rest else rest
        sym = sym.split("+0x")[0]
        frames.append((sym, dso))
    flush()
    out["by_comm"] = comms
    out["top"] = {b: dict(sorted(t.items(), key=lambda kv: -kv[1])[:12]) for b, t in tops.items()}
    return out


def all_pids(cl: pfs.Cluster) -> set[int]:
    stats = pfs.cpumod.all_stats()
    out = set()
    for pids in cl.role_pids().values():
        for r in pids:
            out.update(pfs.cpumod.descendants(r, stats))
    return out


def profile_phase(cl, name, tmo, outdir, tag, use_perf) -> dict:
    data = os.path.join(outdir, re.sub(r"[^\w.=-]", "_", f"{tag}-{name}") + ".perf")
    rec = None
    if use_perf:
        rec = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "999", "-a",
                                "-g", "-o", data], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(0.5)                      # perf is recording
    res, s0, s1 = cl.phase(name, tmo)
    pids = all_pids(cl)
    if rec:
        os.killpg(rec.pid, signal.SIGINT)
        rec.wait(60)
    nbytes = sum(r["bytes"] for r in res)
    span = pfs._span(res)
    cpu = pfs._cpu_delta(s0, s1)
    ours = sum(cpu.values())
    mach = s1["machine"] - s0["machine"]
    out = {"bytes": nbytes, "seconds": span, "MBps": nbytes / span / 1e6,
           "cpu_s_per_gb": {k: v / (nbytes / 1e9) for k, v in cpu.items()},
           "cpu_total_s_per_gb": ours / (nbytes / 1e9),
           "machine_other_cpu_per_s": max(mach - ours, 0) / (s1["t"] - s0["t"])}
    if rec:
        p = subprocess.run(["perf", "script", "-i", data, "-F",
                            "comm,pid,tid,period,ip,sym,dso"], capture_output=True, text=True,
                           errors="replace")
        b = parse_script(p.stdout, pids)
        out["perf_s_per_gb"] = {k: v / (nbytes / 1e9) for k, v in b.items()
                                if k not in ("by_comm", "top")}
        out["perf_top_s_per_gb"] = {bk: {s: v / (nbytes / 1e9) for s, v in t.items()}
                                    for bk, t in b["top"].items()}
        out["perf_by_comm_s_per_gb"] = {c: {k: v / (nbytes / 1e9) for k, v in d.items()}
                                        for c, d in b["by_comm"].items()}
        os.unlink(data)
    return out


def run_one(ctx, cfg, a, outdir, rep) -> dict:
    size = a.size_mib * pfs.M
    base = os.path.join(ctx.tmp, f"prof-{cfg.name}-{rep}")
    cl = pfs.Cluster(ctx, cfg, a.servers, a.clients, size, 10, base)
    try:
        cl.start(rep + 1)
        cl.prepared(300)
        tmo = 120 + size * a.clients / (5 * pfs.M)
        w = profile_phase(cl, "write", tmo, outdir, f"{cfg.name}-{rep}", not a.no_perf)
        cl.all("poison", tmo)
        r = profile_phase(cl, "read", tmo, outdir, f"{cfg.name}-{rep}", not a.no_perf)
        v = cl.all("verify", tmo)
        if not all(x["ok"] for x in v):
            raise RuntimeError("data check failed")
        return {"write": w, "read": r}
    finally:
        cl.stop()


def _med_tree(runs: list[dict]) -> dict:
    """Median of every numeric leaf over the repetitions."""
    if not runs:
        return {}
    out = {}
    for k, v in runs[0].items():
        if isinstance(v, dict):
            out[k] = _med_tree([r.get(k, {}) for r in runs])
        elif isinstance(v, (int, float)):
            out[k] = median([r.get(k) for r in runs])
    return out


def table(res: dict) -> str:
    L = []
    for phase in ("write", "read"):
        cfgs = list(res)
        L.append(f"### {phase}")
        L.append("")
        L.append("| CPU-s per GB | " + " | ".join(f"`{c}`" for c in cfgs) + " |")
        L.append("|---|" + "---|" * len(cfgs))
        L.append("| bandwidth (MB/s) | " + " | ".join(
            f"{res[c][phase]['MBps']:.0f}" for c in cfgs) + " |")
        for role in pfs.ROLES:
            L.append(f"| {role} (from /proc) | " + " | ".join(
                f"{res[c][phase]['cpu_s_per_gb'][role]:.2f}" for c in cfgs) + " |")
        L.append("| **all processes of the run** | " + " | ".join(
            f"**{res[c][phase]['cpu_total_s_per_gb']:.2f}**" for c in cfgs) + " |")
        if all("perf_s_per_gb" in res[c][phase] for c in cfgs):
            for b in BUCKETS:
                L.append(f"| perf: {b} | " + " | ".join(
                    f"{res[c][phase]['perf_s_per_gb'].get(b, 0):.2f}" for c in cfgs) + " |")
        L.append("| other processes on the machine (CPU-s/s) | " + " | ".join(
            f"{res[c][phase]['machine_other_cpu_per_s']:.2f}" for c in cfgs) + " |")
        L.append("")
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default="tcp,sdp-bcopy")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--env", action="append", default=[],
                    help="NAME=VALUE for every process of the SDP configurations")
    ap.add_argument("--daemon-env", action="append", default=[],
                    help="NAME=VALUE for the daemons of every configuration")
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-perf", action="store_true")
    a = ap.parse_args(argv)
    root = os.path.dirname(HERE)
    outdir = os.path.abspath(a.out or tempfile.mkdtemp(prefix="pfs-profile-"))
    os.makedirs(outdir, exist_ok=True)
    ctx = Ctx(root=root, bindir=os.path.join(root, "build", "bin"), mode="full",
              tmp=tempfile.mkdtemp(prefix="pfs-profile-tmp-"))
    ctx.netns = Netns()
    byname = {c.name: c for c in cfgmod.all_configs()}
    cfgs = []
    for spec in a.configs.split(","):
        # NAME@VAR=VALUE@...: the configuration with more environment
        base, *sets = spec.split("@")
        c = copy.deepcopy(byname[base])
        c.name = spec
        c.env = dict(c.env, **dict(x.split("=", 1) for x in sets))
        cfgs.append(c)
    extra_env = dict(e.split("=", 1) for e in a.env)
    all_env = dict(e.split("=", 1) for e in a.daemon_env)
    for c in cfgs:
        if c.kind == "veth":
            ok, why = ctx.netns.status()
            if not ok:
                raise SystemExit(why)
            c.server_ns, c.client_ns = ctx.netns.names(c.offload)
        c.env = dict(c.env, **all_env)
        if c.kind == "sdp":
            c.env = dict(c.env, **extra_env)
    runs: dict[str, list] = {c.name: [] for c in cfgs}
    try:
        for rep in range(a.reps):             # interleaved: A B A B ...
            for c in cfgs:
                r = run_one(ctx, c, a, outdir, rep)
                runs[c.name].append(r)
                print(f"rep {rep + 1} {c.name}: write {r['write']['MBps']:.0f} MB/s, "
                      f"read {r['read']['MBps']:.0f} MB/s", flush=True)
    finally:
        ctx.netns.teardown()
    res = {n: _med_tree(v) for n, v in runs.items()}
    doc = {"command": " ".join(sys.argv), "servers": a.servers, "clients": a.clients,
           "size_mib": a.size_mib, "reps": a.reps, "env": extra_env, "daemon_env": all_env,
           "median": res,
           "runs": runs}
    with open(os.path.join(outdir, "breakdown.json"), "w") as fh:
        json.dump(doc, fh, indent=1)
    md = table(res)
    with open(os.path.join(outdir, "breakdown.md"), "w") as fh:
        fh.write(md + "\n")
    print(md)
    print(f"-> {outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
