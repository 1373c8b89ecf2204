"""The parallel file I/O study of paper 002 §6 (PVFS over SDP and over
IPoIB) with a real parallel file system: MooseFS from Debian, whose
architecture is PVFS's (a metadata server, I/O servers holding the file
data, clients that move the data straight to and from the I/O servers).

One run of the experiment starts a cluster of its own under the
configuration: one mfsmaster, S mfschunkservers and C mfsmount FUSE
clients, every one of them under `sdp run` for an SDP configuration and
plain for the others, with all storage (metadata and chunks) on a tmpfs of
its own, so that the network path and not a disk decides. C client
processes (pfs_worker.py, one per mount) then, all at the same moment:

  1. write one file each, sequentially (1 MiB calls, fsync before close);
  2. read it back through a re-opened descriptor (mfsmount with
     mfscachemode=DIRECT keeps no page cache, and the chunk servers' own
     byte counters are checked to have sent at least what was read);
  3. create small (empty) files, then stat them (attribute caches off, so
     every call reaches the metadata server).

Bandwidth is the bytes of all clients over the span from the first
client's start to the last client's end, as in pvfs-test. Every byte is
checked: sha256 of the buffer written equals sha256 of the buffer read
back, per client. Goal 1 (one copy per chunk): the servers do not
replicate, like PVFS I/O servers.

Network: MooseFS chunk servers refuse 127.0.0.0/8 for the master
connection (their address is what clients are told to connect to), so the
loopback configurations run the whole cluster in a network namespace of
its own whose loopback device also carries 10.200.1.1 (Netns.local());
`tcp-veth-*` run master and chunk servers in the server namespace and the
mfsmount clients in the client namespace, the papers' two nodes.
Processes enter a namespace with `nsenter --net` (not `ip netns exec`,
which also gives the program a mount namespace of its own, where a FUSE
mount would be invisible to everyone else)."""
from __future__ import annotations

import json
import os
import pwd
import grp
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

from . import cpu as cpumod
from .configs import NET_LOCAL
from .core import Ctx, Experiment, Metric, Sample, fail
from .procs import Proc, wait_listening

K = 1024
M = 1024 * 1024
G = 1024 * M

MASTER_ML, MASTER_CS, MASTER_CL, CS_BASE = 9419, 9420, 9421, 9422
EMPTY_METADATA = "/var/lib/mfs/metadata.mfs.empty"
STORE_TAG = "sdp-pfs-"          # + pid of the suite: source name of the storage tmpfs
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pfs_worker.py")
ROLES = ("master", "chunkserver", "mfsmount", "worker")
PHASES = ("write", "read", "create", "stat")


def _pick(mode, full, quick, tiny):
    return {"full": full, "quick": quick, "tiny": tiny}[mode]


def _tail(text, n=300):
    return (text or "").strip().replace("\n", " | ")[-n:]


def _run(argv, timeout=30.0, env=None) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                           errors="replace")
    except (OSError, subprocess.TimeoutExpired) as e:
        return 1, "", str(e)
    return p.returncode, p.stdout, p.stderr


def mounted(path: str) -> bool:
    """path is a mount point (read from mountinfo: no call into FUSE)."""
    path = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) > 4 and parts[4].replace("\\040", " ") == path:
                    return True
    except OSError:
        pass
    return False


def proc_io(pid: int) -> dict:
    """/proc/<pid>/io: rchar and wchar count socket calls too (kernel TCP)."""
    out = {}
    try:
        with open(f"/proc/{pid}/io") as fh:
            for line in fh:
                k, _, v = line.partition(":")
                out[k.strip()] = int(v)
    except (OSError, ValueError):
        pass
    return out


def machine_busy() -> float:
    """CPU-seconds all CPUs spent not idle since boot (/proc/stat)."""
    try:
        with open("/proc/stat") as fh:
            f = [int(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = f[3] + (f[4] if len(f) > 4 else 0)
    return (sum(f[:8]) - idle) / cpumod.CLK_TCK


class Worker:
    """A pfs_worker.py process, driven line by line."""

    def __init__(self, argv: list[str]):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, errors="replace",
                                  start_new_session=True)
        self.pid = self.p.pid
        self.q: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self):
        for line in self.p.stdout:
            line = line.strip()
            if line.startswith("{"):
                try:
                    self.q.put(json.loads(line))
                except ValueError:
                    pass
        self.q.put(None)

    def _pump_err(self):
        for line in self.p.stderr:
            self.err.append(line.rstrip())

    def send(self, cmd: str) -> None:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def recv(self, timeout: float) -> dict:
        try:
            j = self.q.get(timeout=max(timeout, 0.1))
        except queue.Empty:
            raise RuntimeError(f"client {self.pid}: no answer within {timeout:.0f} s")
        if j is None:
            raise RuntimeError(f"client {self.pid} exited: {_tail(chr(10).join(self.err))}")
        if j.get("error"):
            raise RuntimeError(f"client {self.pid} {j.get('phase')}: {j['error']}")
        return j

    def kill(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.p.wait(5)
        except subprocess.TimeoutExpired:
            pass


class Cluster:
    """One MooseFS cluster: storage, daemons, mounts and client processes."""

    def __init__(self, ctx: Ctx, cfg, servers: int, clients: int, size: int, files: int,
                 base: str):
        self.ctx, self.cfg = ctx, cfg
        self.S, self.C, self.size, self.files = servers, clients, size, files
        self.base = base
        self.store = os.path.join(base, "store")
        self.etc = os.path.join(base, "etc")
        self.stats_dir = os.path.join(base, "sdpstats")
        self.mnts = [os.path.join(base, f"mnt{i}") for i in range(clients)]
        self.master: Proc | None = None
        self.chunkservers: list[Proc] = []
        self.mounts: list[Proc] = []
        self.workers: list[Worker] = []
        self.store_mounted = False
        if cfg.kind == "veth":
            self.ns_srv, self.ns_cli, self.addr = cfg.server_ns, cfg.client_ns, cfg.server_addr
        else:
            ns, why = ctx.netns.local()
            if not ns:
                raise RuntimeError(why)
            self.ns_srv = self.ns_cli = ns
            self.addr = NET_LOCAL
        self.env = cfg.environ()
        if cfg.kind == "sdp":
            self.env["SDP_STATS_DIR"] = self.stats_dir

    # ---- processes -------------------------------------------------------

    def wrap(self, argv: list[str], role: str, sdp: bool = True) -> list[str]:
        cmd = list(argv)
        if sdp and self.cfg.kind == "sdp":
            cmd = [self.ctx.sdp, "run", "--"] + cmd
        ns = self.ns_srv if role == "server" else self.ns_cli
        cmd = ["nsenter", f"--net=/run/netns/{ns}"] + cmd
        if self.ctx.pin and self.ctx.cpus:
            cpu = self.ctx.cpus[0] if role == "server" else self.ctx.cpus[-1]
            cmd = ["taskset", "-c", str(cpu)] + cmd
        return cmd

    def _write(self, name: str, text: str) -> str:
        path = os.path.join(self.etc, name)
        with open(path, "w") as fh:
            fh.write(text)
        return path

    def _common_cfg(self) -> str:
        user = pwd.getpwuid(os.geteuid()).pw_name
        group = grp.getgrgid(os.getegid()).gr_name
        # run as ourselves (SDP only between processes of one user), at
        # normal priority, killable: the defaults renice to -19 and
        # protect themselves from the OOM killer
        return (f"WORKING_USER = {user}\nWORKING_GROUP = {group}\nNICE_LEVEL = 0\n"
                f"DISABLE_OOM_KILLER = 0\nLOCK_MEMORY = 0\n")

    def start_storage(self) -> None:
        for d in (self.base, self.etc, self.stats_dir, self.store, *self.mnts):
            os.makedirs(d, exist_ok=True)
        # the files, plus room the chunk servers keep free (64 MiB each,
        # HDD_LEAVE_SPACE_DEFAULT) and the master's space accounting needs:
        # with 10 % and 256 MiB a single server sometimes said ENOSPC
        mb = (self.C * self.size * 5 // 4 + self.S * 128 * M + 512 * M) // M
        rc, out, err = _run(["mount", "-t", "tmpfs", "-o", f"size={mb}m,mode=0755",
                             f"{STORE_TAG}{os.getpid()}", self.store])
        if rc != 0:
            raise RuntimeError(f"tmpfs for the storage: {_tail(err or out)}")
        self.store_mounted = True

    def start_master(self) -> None:
        data = os.path.join(self.store, "master")
        os.makedirs(data)
        shutil.copyfile(EMPTY_METADATA, os.path.join(data, "metadata.mfs"))
        exports = self._write("mfsexports.cfg", "*\t/\trw,alldirs,maproot=0:0\n")
        topo = self._write("mfstopology.cfg", "")
        cfg = self._write("mfsmaster.cfg", self._common_cfg() + f"""DATA_PATH = {data}
EXPORTS_FILENAME = {exports}
TOPOLOGY_FILENAME = {topo}
MATOML_LISTEN_HOST = {self.addr}
MATOML_LISTEN_PORT = {MASTER_ML}
MATOCS_LISTEN_HOST = {self.addr}
MATOCS_LISTEN_PORT = {MASTER_CS}
MATOCL_LISTEN_HOST = {self.addr}
MATOCL_LISTEN_PORT = {MASTER_CL}
""")
        self.master = Proc(self.wrap(["mfsmaster", "-f", "-c", cfg], "server"), env=self.env,
                           name="mfsmaster")
        if not wait_listening(self.master.pid, MASTER_CL, 20):
            raise RuntimeError("mfsmaster did not listen: " + _tail(self.master.stderr()))

    def start_chunkservers(self) -> None:
        for i in range(self.S):
            data = os.path.join(self.store, f"cs{i}")
            os.makedirs(os.path.join(data, "hdd"))
            hdd = self._write(f"mfshdd{i}.cfg", os.path.join(data, "hdd") + "\n")
            cfg = self._write(f"mfschunkserver{i}.cfg", self._common_cfg() + f"""DATA_PATH = {data}
HDD_CONF_FILENAME = {hdd}
HDD_LEAVE_SPACE_DEFAULT = 64MiB
MASTER_HOST = {self.addr}
MASTER_PORT = {MASTER_CS}
BIND_HOST = {self.addr}
CSSERV_LISTEN_HOST = {self.addr}
CSSERV_LISTEN_PORT = {CS_BASE + i}
""")
            p = Proc(self.wrap(["mfschunkserver", "-f", "-c", cfg], "server"), env=self.env,
                     name=f"mfschunkserver{i}")
            self.chunkservers.append(p)
        for i, p in enumerate(self.chunkservers):
            if not wait_listening(p.pid, CS_BASE + i, 20):
                raise RuntimeError(f"mfschunkserver {i} did not listen: " + _tail(p.stderr()))
        # every chunk server registered with the master and its space known
        end = time.monotonic() + 30
        last = ""
        while time.monotonic() < end:
            rc, out, err = _run(self.wrap(["mfscli", "-H", self.addr, "-P", str(MASTER_CL),
                                           "-SCS"], "server"), env=self.env, timeout=15)
            rows = [ln.split("\t") for ln in out.splitlines() if ln.startswith("chunk servers:")]
            ready = [r for r in rows if len(r) > 10 and r[10].isdigit() and int(r[10]) > 0]
            if len(ready) >= self.S:
                return
            last = _tail(err or out)
            time.sleep(0.2)
        raise RuntimeError(f"only some of {self.S} chunk servers registered: {last}")

    def start_mounts(self) -> None:
        opts = ",".join([f"mfsmaster={self.addr}", f"mfsport={MASTER_CL}", "mfsnice=0",
                         "mfsallowoomkiller", "mfscachemode=DIRECT", "mfsattrcacheto=0",
                         "mfsentrycacheto=0", "mfsdirentrycacheto=0", "mfsnegentrycacheto=0",
                         "mfsioretries=10"])
        for i, mnt in enumerate(self.mnts):
            p = Proc(self.wrap(["mfsmount", mnt, "-f", "-o", opts], "client"), env=self.env,
                     name=f"mfsmount{i}")
            self.mounts.append(p)
        end = time.monotonic() + 20
        for i, (p, mnt) in enumerate(zip(self.mounts, self.mnts)):
            while not mounted(mnt):
                if not p.running() or time.monotonic() > end:
                    raise RuntimeError(f"mfsmount {i} did not mount: " + _tail(p.stderr()))
                time.sleep(0.05)
        # one copy of each chunk (the default goal is 2): I/O servers, not
        # replicas, as in PVFS
        rc, out, err = _run(self.wrap(["mfssetgoal", "-r", "1", self.mnts[0]], "client"),
                            env=self.env, timeout=20)
        if rc != 0:
            raise RuntimeError("mfssetgoal: " + _tail(err or out))

    def start_workers(self, nonce: int) -> None:
        for i, mnt in enumerate(self.mnts):
            self.workers.append(Worker([sys.executable, WORKER, "--dir", mnt, "--client", str(i),
                                        "--size", str(self.size), "--files", str(self.files),
                                        "--nonce", str(nonce)]))
        for w in self.workers:
            w.recv(30)                      # started
            w.send("prepare")

    def prepared(self, timeout: float) -> list[dict]:
        return [w.recv(timeout) for w in self.workers]

    def start(self, nonce: int) -> None:
        self.start_storage()
        # the clients build their data while the servers start
        self.start_workers(nonce)
        self.start_master()
        self.start_chunkservers()
        self.start_mounts()

    def stop(self) -> dict:
        """Stop everything, remove the files; returns the SDP_STATS_DIR
        totals the daemons wrote at exit, per program name. An interrupt
        (SIGINT, or SIGTERM to the suite) in the middle still finishes it."""
        try:
            return self._stop()
        except KeyboardInterrupt:
            self._stop()
            raise

    def _stop(self) -> dict:
        for w in self.workers:
            w.kill()
        for mnt in self.mnts:
            if mounted(mnt):
                rc, _, _ = _run(["umount", mnt], timeout=20)
                if rc != 0:
                    _run(["umount", "-l", mnt], timeout=20)
        stop_all(self.mounts + self.chunkservers + ([self.master] if self.master else []),
                 grace=5)
        if self.store_mounted:
            rc, _, _ = _run(["umount", self.store], timeout=20)
            if rc != 0:
                _run(["umount", "-l", self.store], timeout=20)
            self.store_mounted = False
        totals: dict = {}
        try:
            names = sorted(os.listdir(self.stats_dir))
        except OSError:
            names = []
        for n in names:
            try:
                with open(os.path.join(self.stats_dir, n)) as fh:
                    j = json.load(fh)
            except (OSError, ValueError):
                continue
            t = totals.setdefault(str(j.get("comm")), {"processes": 0, "sdp_conns": 0,
                                                       "tcp_conns": 0, "tx_bytes": 0})
            t["processes"] += 1
            for k in ("sdp_conns", "tcp_conns", "tx_bytes"):
                t[k] += int(j.get(k, 0))
        shutil.rmtree(self.base, ignore_errors=True)
        return totals

    # ---- observation -----------------------------------------------------

    def role_pids(self) -> dict[str, list[int]]:
        return {"master": [self.master.pid] if self.master else [],
                "chunkserver": [p.pid for p in self.chunkservers],
                "mfsmount": [p.pid for p in self.mounts],
                "worker": [w.pid for w in self.workers]}

    def sdp_procs(self) -> dict[int, dict]:
        """`sdp stat --procs --json` per pid (empty without libsdp)."""
        if self.cfg.kind != "sdp":
            return {}
        rc, out, err = _run([self.ctx.sdp, "stat", "--procs", "--json"], timeout=20)
        try:
            return {int(r["pid"]): r for r in json.loads(out)}
        except (ValueError, KeyError, TypeError):
            return {}

    def sdp_conns(self) -> list[dict]:
        if self.cfg.kind != "sdp":
            return []
        rc, out, err = _run([self.ctx.sdp, "stat", "--json"], timeout=20)
        try:
            return [c for c in json.loads(out) if isinstance(c, dict)]
        except ValueError:
            return []

    def snapshot(self) -> dict:
        """CPU per role, the chunk servers' byte counters, machine CPU."""
        stats = cpumod.all_stats()
        cpu = {}
        for role, pids in self.role_pids().items():
            tot = {}
            for r in pids:
                for pid in cpumod.descendants(r, stats):
                    st = stats.get(pid)
                    if st:
                        tot[(pid, st["starttime"])] = (st["utime"] + st["stime"]
                                                      + st["cutime"] + st["cstime"])
            cpu[role] = tot
        cs = [p.pid for p in self.chunkservers]
        sdp = self.sdp_procs()
        io = {pid: proc_io(pid) for pid in cs}
        return {"t": time.monotonic(), "cpu": cpu, "machine": machine_busy(),
                "cs_sock_tx": sum(sdp.get(p, {}).get("tx_bytes", 0) for p in cs),
                "cs_sock_rx": sum(sdp.get(p, {}).get("rx_bytes", 0) for p in cs),
                "cs_wchar": sum(io[p].get("wchar", 0) for p in cs),
                "cs_rchar": sum(io[p].get("rchar", 0) for p in cs),
                "sdp": sdp}

    def all(self, cmd: str, timeout: float) -> list[dict]:
        """A command that is not measured (poison, verify)."""
        for w in self.workers:
            w.send(cmd)
        return [w.recv(timeout) for w in self.workers]

    def phase(self, name: str, timeout: float) -> tuple[list[dict], dict, dict]:
        s0 = self.snapshot()
        for w in self.workers:
            w.send(name)
        res = [w.recv(timeout) for w in self.workers]
        s1 = self.snapshot()
        return res, s0, s1


def _mounts() -> list[tuple[str, str]]:
    """(source, mount point) of every mount."""
    out = []
    try:
        with open("/proc/self/mountinfo") as fh:
            for line in fh:
                pre, _, post = line.partition(" - ")
                a, b = pre.split(), post.split()
                if len(a) > 4 and len(b) > 1:
                    out.append((b[1], a[4].replace("\\040", " ")))
    except OSError:
        pass
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def cleanup_stale() -> list[str]:
    """Clusters left by a run of this suite that was killed (its storage
    tmpfs is named after its pid, which is gone): kill the daemons started
    with its configuration files or mount points, unmount, remove. Returns
    the directories cleaned."""
    done = []
    for src, mnt in _mounts():
        if not src.startswith(STORE_TAG) or not src[len(STORE_TAG):].isdigit():
            continue
        if _alive(int(src[len(STORE_TAG):])):
            continue
        base = os.path.dirname(mnt)
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    argv = fh.read().split(b"\0")
            except OSError:
                continue
            if any(a.startswith(base.encode() + b"/") for a in argv):
                try:
                    os.kill(int(name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        for _, m in _mounts():
            if m.startswith(base + "/"):
                _run(["umount", "-l", m], timeout=20)
        shutil.rmtree(base, ignore_errors=True)
        done.append(base)
    return done


def stop_all(procs: list[Proc], grace: float) -> None:
    """SIGTERM to every process group at once (each daemon takes about a
    second to stop), SIGKILL to what is left after grace seconds."""
    for p in procs:
        if p.running():
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + grace
    for p in procs:
        p.wait(max(end - time.monotonic(), 0.01))
    for p in procs:
        p.stop(grace=0.01)       # SIGKILL to a group still there, reap, join


def _cpu_delta(s0: dict, s1: dict) -> dict[str, float]:
    out = {}
    for role in ROLES:
        a, b = s0["cpu"].get(role, {}), s1["cpu"].get(role, {})
        out[role] = max(sum(v - a.get(k, 0.0) for k, v in b.items()), 0.0)
    return out


def _span(res: list[dict]) -> float:
    return max(r["t1"] for r in res) - min(r["t0"] for r in res)


class Pfs(Experiment):
    name = "pfs"
    title = "Parallel file system (MooseFS): concurrent write and read"
    reproduces = "002 §6 (PVFS on ramfs, Figs 8/9)"
    description = ("MooseFS from Debian (the PVFS architecture: mfsmaster for metadata, S "
                   "mfschunkserver I/O servers, C mfsmount FUSE clients), every daemon and "
                   "client under the configuration, storage on tmpfs. C clients at once write "
                   "one file each sequentially (1 MiB calls, fsync), read it back (no page "
                   "cache; the chunk servers' byte counters must show it was sent), then "
                   "create and stat empty files. Aggregate bandwidth over the span from the "
                   "first client's start to the last one's end; sha256 of every client's data "
                   "checked; SDP rows valid only if every connection of every daemon was SDP.")
    kind = "app"
    metrics = [Metric("read_MBps", "MB/s", "read bandwidth", "higher"),
               Metric("write_MBps", "MB/s", "write bandwidth", "higher"),
               Metric("create_per_s", "files/s", "file creates per second", "higher"),
               Metric("stat_per_s", "files/s", "stats per second", "higher"),
               Metric("read_cpu_s_per_gb", "CPU-s/GB", "CPU per GB read (all processes)",
                      "lower"),
               Metric("write_cpu_s_per_gb", "CPU-s/GB", "CPU per GB written (all processes)",
                      "lower")]
    primary = "read_MBps"
    xparam = "servers"
    panel_param = "clients"
    logx = False
    needs = ("mfsmaster", "mfschunkserver", "mfsmount", "mfscli", "mfssetgoal", "nsenter",
             "ip", "mount", "umount")
    # per-role CPU per GB, summarised over the repetitions (runner.aggregate)
    extra_stats = tuple(f"{ph}_cpu_{role}_s_per_gb" for ph in ("write", "read")
                        for role in ROLES) + ("read_traveled", "write_traveled",
                                              "machine_other_cpu")

    def params(self, mode):
        return [{"servers": s, "clients": c}
                for c in _pick(mode, [1, 2, 4], [4], [2])
                for s in _pick(mode, [1, 2, 4], [4], [2])]

    def file_size(self, ctx) -> int:
        return _pick(ctx.mode, G, 64 * M, 16 * M)

    def nfiles(self, ctx) -> int:
        return _pick(ctx.mode, 1000, 200, 50)

    def est_run_s(self, ctx):
        # start and stop of the cluster, plus writing and reading the
        # clients' files (about 2.3 clients per point) at ~300 MB/s
        c = _pick(ctx.mode, 7 / 3, 4, 2)
        return 7 + 2 * c * self.file_size(ctx) / 300e6

    def reps_for(self, ctx):
        return 1 if ctx.mode != "full" else min(ctx.reps, 3)

    def warmup_for(self, ctx):
        return ctx.mode == "full"

    def wants(self, cfg) -> bool:
        return cfg.kind != "raw"

    def skip_reason(self, cfg) -> str | None:
        if cfg.name == "sdp-zcopy-all":
            return ("not run: MooseFS's sockets are all non-blocking, so no send uses zero "
                    "copy whatever the threshold (zero-copy share 0 % in sdp-zcopy): the same "
                    "path as sdp-zcopy")
        return None

    def unavailable_reason(self, ctx) -> str | None:
        if os.geteuid() != 0:
            return "needs root (FUSE and tmpfs mounts, network namespaces)"
        if not os.path.exists("/dev/fuse"):
            return "/dev/fuse missing"
        if not os.path.exists(EMPTY_METADATA):
            return f"{EMPTY_METADATA} missing (package moosefs-master)"
        return None

    def setup(self, ctx):
        for base in cleanup_stale():
            print(f"pfs: removed a cluster left by an earlier run: {base}", file=sys.stderr)

    def run(self, ctx, cfg, p):
        self.runs = getattr(self, "runs", 0) + 1
        size, files = self.file_size(ctx), self.nfiles(ctx)
        base = os.path.join(ctx.tmp, f"pfs-{cfg.name}-{self.runs}")
        cl = Cluster(ctx, cfg, p["servers"], p["clients"], size, files, base)
        nonce = (os.getpid() << 16) ^ self.runs
        s = None
        try:
            cl.start(nonce)
            prep = cl.prepared(60 + size * p["clients"] / (50 * M))
            loaded = self._libsdp(cl)
            tmo = 60 + size * p["clients"] / (10 * M)
            wres, w0, w1 = cl.phase("write", tmo)
            conns = cl.sdp_conns()
            cl.all("poison", tmo)
            rres, r0, r1 = cl.phase("read", tmo)
            vres = cl.all("verify", tmo)
            cres, c0, c1 = cl.phase("create", 60 + files * p["clients"] / 20)
            sres, t0_, t1_ = cl.phase("stat", 60 + files * p["clients"] / 20)
            s = self._sample(cl, cfg, p, prep, wres, rres, vres, cres, sres,
                             (w0, w1), (r0, r1), (c0, c1), (t0_, t1_), conns, loaded)
            return s
        finally:
            exits = cl.stop()
            if s is not None and exits:
                # what the daemons wrote into SDP_STATS_DIR at exit
                s.extra["exit_stats"] = exits

    @staticmethod
    def _libsdp(cl: Cluster) -> dict[str, bool]:
        out = {}
        for role, pids in cl.role_pids().items():
            if role == "worker":
                continue
            for pid in pids:
                try:
                    with open(f"/proc/{pid}/maps") as fh:
                        out[f"{role}:{pid}"] = "libsdp" in fh.read()
                except OSError:
                    out[f"{role}:{pid}"] = False
        return out

    def _sample(self, cl, cfg, p, prep, wres, rres, vres, cres, sres, wsn, rsn, csn, ssn,
                conns, loaded) -> Sample:
        size = cl.size
        bad = [r for r in vres if not r.get("ok")]
        if bad:
            r = bad[0]
            return fail(f"data check failed: client read {r['bytes']} of {size} bytes, "
                        f"sha256 {r['sha256'][:16]}... written {r['sha256_written'][:16]}...")
        if not all(r.get("ok") for r in sres):
            return fail("stat: a created file is missing or not empty")
        wbytes = sum(r["bytes"] for r in wres)
        rbytes = sum(r["bytes"] for r in rres)
        wspan, rspan = _span(wres), _span(rres)
        cspan, sspan = _span(cres), _span(sres)
        wcpu, rcpu = _cpu_delta(*wsn), _cpu_delta(*rsn)
        m = {"write_MBps": wbytes / wspan / 1e6, "read_MBps": rbytes / rspan / 1e6,
             "create_per_s": sum(r["files"] for r in cres) / cspan,
             "stat_per_s": sum(r["files"] for r in sres) / sspan,
             "write_cpu_s_per_gb": sum(wcpu.values()) / (wbytes / 1e9),
             "read_cpu_s_per_gb": sum(rcpu.values()) / (rbytes / 1e9)}
        extra = {}
        for ph, cpu, nb in (("write", wcpu, wbytes), ("read", rcpu, rbytes)):
            for role in ROLES:
                extra[f"{ph}_cpu_{role}_s_per_gb"] = cpu[role] / (nb / 1e9)
        # did the bytes travel? what the chunk servers received / sent on
        # their sockets (SDP counters, or read()/write() bytes for TCP)
        w0, w1 = wsn
        r0, r1 = rsn
        wtrav = (w1["cs_sock_rx"] - w0["cs_sock_rx"]) + (w1["cs_rchar"] - w0["cs_rchar"])
        rtrav = (r1["cs_sock_tx"] - r0["cs_sock_tx"]) + (r1["cs_wchar"] - r0["cs_wchar"])
        extra["write_traveled"] = wtrav / wbytes
        extra["read_traveled"] = rtrav / rbytes
        ours = sum(wcpu.values()) + sum(rcpu.values())
        secs = (w1["t"] - w0["t"]) + (r1["t"] - r0["t"])
        mach = (w1["machine"] - w0["machine"]) + (r1["machine"] - r0["machine"])
        extra["machine_other_cpu"] = max(mach - ours, 0.0) / secs
        extra["sha256"] = {f"client{i}": r["sha256"] for i, r in enumerate(vres)}
        extra["file_size"] = size
        extra["small_files_per_client"] = cl.files
        s = Sample(ok=True, metrics=m,
                   cpu_client=(wcpu["mfsmount"] + wcpu["worker"] + rcpu["mfsmount"]
                               + rcpu["worker"]) / (wspan + rspan),
                   cpu_server=(wcpu["master"] + wcpu["chunkserver"] + rcpu["master"]
                               + rcpu["chunkserver"]) / (wspan + rspan),
                   bytes=wbytes + rbytes, seconds=wspan + rspan, extra=extra)
        daemons = [pid for role, pids in cl.role_pids().items() if role != "worker"
                   for pid in pids]
        s.transport, s.transport_ok, s.reason, info = transport_verdict(
            cfg.kind == "sdp", loaded, ssn[1]["sdp"], daemons, conns,
            extra["read_traveled"], extra["write_traveled"])
        extra.update(info)
        # the share of the bytes the daemons sent by zero copy (MooseFS's
        # sockets are non-blocking: Buffer Copy only is expected)
        mine = [c for c in conns if c.get("pid") in daemons]
        tx = sum(c.get("tx_bytes", 0) for c in mine)
        if cfg.kind == "sdp" and tx:
            extra["zcopy_fraction"] = sum(c.get("tx_rzcopy_bytes", 0) + c.get("tx_wzcopy_bytes", 0)
                                          for c in mine) / tx
        return s

    report_note = ("Bandwidth in MB/s (10^6 bytes). CPU per GB counts every process of the "
                   "run (master, chunk servers, mfsmount clients, the client programs) for the "
                   "bytes of its phase; `extra` of each row in results.json splits it per "
                   "role, and `read_traveled` / `write_traveled` give the chunk servers' "
                   "socket bytes over the file bytes. MooseFS stores a file in 64 MiB chunks, "
                   "each on one chunk server: a client writes and reads one chunk (one server) "
                   "at a time, unlike PVFS's 64 KiB stripes over all servers, so more servers "
                   "help only with more clients.")

    def report_extra(self, rows: list[dict]) -> list[str]:
        """Ratios to kernel TCP per point, the CPU per GB split by role,
        and the evidence for the SDP path and the data check."""
        from .report import _fmt
        use = [r for r in rows if r.get("available") and r.get("metrics")]
        if not use:
            return []
        cfgs = []
        for r in use:
            if r["config"] not in cfgs:
                cfgs.append(r["config"])
        pts = []
        for r in use:
            if r["params"] not in pts:
                pts.append(r["params"])

        def get(cfg, p, metric):
            for r in use:
                if r["config"] == cfg and r["params"] == p and metric in r["metrics"]:
                    return r["metrics"][metric]["median"]
            return None

        others = [c for c in cfgs if c != "tcp"]
        L = ["### Ratio to `tcp` (medians), read / write", "",
             "| servers | clients | " + " | ".join(f"`{c}`" for c in others) + " |",
             "|---|---|" + "---|" * len(others)]
        for p in pts:
            cells = []
            for c in others:
                rr = [get(c, p, m) / get("tcp", p, m) if get(c, p, m) and get("tcp", p, m)
                      else None for m in ("read_MBps", "write_MBps")]
                cells.append(" / ".join(_fmt(x, 3) if x is not None else "–" for x in rr))
            L.append(f"| {p['servers']} | {p['clients']} | " + " | ".join(cells) + " |")
        big = max(pts, key=lambda p: (p["clients"], p["servers"]))
        L += ["", f"### CPU-seconds per GB by process, {big['servers']} servers × "
              f"{big['clients']} clients (medians)", "",
              "| config | phase | " + " | ".join(ROLES) + " | all | other processes on the "
              "machine (CPU-s/s) |", "|---|---|" + "---|" * (len(ROLES) + 2)]
        for c in cfgs:
            r = next((r for r in use if r["config"] == c and r["params"] == big), None)
            if not r:
                continue
            e = r.get("extra", {})
            for ph in ("write", "read"):
                vals = [(e.get(f"{ph}_cpu_{role}_s_per_gb") or {}).get("median") for role in ROLES]
                tot = (r["metrics"].get(f"{ph}_cpu_s_per_gb") or {}).get("median")
                oth = (e.get("machine_other_cpu") or {}).get("median")
                L.append(f"| `{c}` | {ph} | " + " | ".join(_fmt(v) for v in vals)
                         + f" | {_fmt(tot)} | {_fmt(oth)} |")
        L += ["", "### Evidence", "",
              "| config | servers | clients | live connections (SDP / TCP) | exit totals "
              "(SDP / TCP connections) | bytes travelled read / write | sha256 client0 |",
              "|---|---|---|---|---|---|---|"]
        for r in use:
            e = r.get("extra", {})
            conns = e.get("connections")
            ctxt = ", ".join(f"{k} {v['sdp']}/{v['tcp']}" for k, v in conns.items()) if conns \
                else "kernel TCP (no libsdp)"
            ex = e.get("exit_stats")
            etxt = ", ".join(f"{k} {v['sdp_conns']}/{v['tcp_conns']}" for k, v in ex.items()
                             if k.startswith("mfs")) if ex else "–"
            tr = " / ".join(f"{v:.4f}" if isinstance(v, (int, float)) else "–" for v in
                            ((e.get("read_traveled") or {}).get("min"),
                             (e.get("write_traveled") or {}).get("min")))
            sha = (e.get("sha256") or {}).get("client0", "–")[:16]
            L.append(f"| `{r['config']}` | {r['params']['servers']} | {r['params']['clients']} | "
                     f"{ctxt} | {etxt} | {tr} | `{sha}…` |")
        L += ["", "Live connections: `sdp stat --json` after the write phase, each connection "
              "once; exit totals: what every daemon wrote into `SDP_STATS_DIR` when it stopped "
              "(first repetition); bytes travelled: the chunk servers' socket bytes over the file "
              "bytes, lowest of the repetitions; every row's clients all read back data whose "
              "sha256 equals what they wrote (a mismatch fails the run).", ""]
        return L

    def plot(self, rows, plt):
        """Paper 002 Figs 8 (read) and 9 (write): bandwidth against the
        number of I/O servers, one panel per number of clients; a third row
        with the CPU per GB of every process of the run."""
        from .plots import COLORS, MARKERS
        use = [r for r in rows if r.get("available") and r.get("metrics")]
        clients = sorted({r["params"]["clients"] for r in rows}) or [0]
        servers = sorted({r["params"]["servers"] for r in rows})
        fig, axes = plt.subplots(3, len(clients), figsize=(4.6 * len(clients) + 1, 11),
                                 squeeze=False)
        cfgs = []
        for r in use:
            if r["config"] not in cfgs:
                cfgs.append(r["config"])
        for row, metric, label in ((0, "read_MBps", "read"), (1, "write_MBps", "write")):
            for col, c in enumerate(clients):
                ax = axes[row][col]
                for cfg in cfgs:
                    pts = sorted((r["params"]["servers"], r["metrics"][metric])
                                 for r in use if r["config"] == cfg
                                 and r["params"]["clients"] == c and metric in r["metrics"])
                    if not pts:
                        continue
                    xs = [x for x, _ in pts]
                    ys = [v["median"] for _, v in pts]
                    lo = [max(v["median"] - v["min"], 0) for _, v in pts]
                    hi = [max(v["max"] - v["median"], 0) for _, v in pts]
                    ax.errorbar(xs, ys, yerr=[lo, hi], label=cfg, color=COLORS.get(cfg),
                                marker=MARKERS.get(cfg, "o"), capsize=2, linewidth=1.5,
                                linestyle="-" if cfg.startswith("sdp") else "--")
                ax.set_xticks(servers)
                ax.set_xlabel("number of I/O servers (chunk servers)")
                ax.set_ylabel(f"{label} bandwidth (MB/s)")
                ax.set_title(f"{label}, {c} client{'s' if c > 1 else ''}", fontsize=10)
                ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
                if use:
                    ax.legend(fontsize=7)
                else:
                    ax.text(0.5, 0.5, "no results", ha="center", transform=ax.transAxes)
        # CPU per GB: bars per server count, read solid and write hatched
        n = max(len(cfgs), 1)
        w = 0.8 / n
        for col, c in enumerate(clients):
            ax = axes[2][col]
            for i, cfg in enumerate(cfgs):
                for metric, hatch, off in (("read_cpu_s_per_gb", None, -w / 4),
                                           ("write_cpu_s_per_gb", "//", w / 4)):
                    xs, ys = [], []
                    for si, sv in enumerate(servers):
                        for r in use:
                            if (r["config"] == cfg and r["params"] == {"servers": sv, "clients": c}
                                    and metric in r["metrics"]):
                                xs.append(si + (i - (n - 1) / 2) * w + off)
                                ys.append(r["metrics"][metric]["median"])
                    ax.bar(xs, ys, width=w / 2, color=COLORS.get(cfg), hatch=hatch,
                           edgecolor="white" if hatch else COLORS.get(cfg),
                           label=cfg if metric.startswith("read") else None)
            ax.set_xticks(range(len(servers)))
            ax.set_xticklabels([str(s) for s in servers])
            ax.set_xlabel("number of I/O servers (chunk servers)")
            ax.set_ylabel("CPU-s per GB, all processes")
            ax.set_title(f"CPU per GB, {c} client{'s' if c > 1 else ''} "
                         "(solid: read, hatched: write)", fontsize=10)
            ax.grid(True, axis="y", alpha=0.3)
            if use:
                ax.legend(fontsize=7)
        fig.text(0.01, 0.01, "median of repetitions, error bars min-max; read: paper 002 Fig 8, "
                 "write: Fig 9", fontsize=7)
        fig.suptitle(f"{self.name} — reproduces {self.reproduces}", fontsize=9)
        fig.tight_layout(rect=(0, 0.03, 1, 0.97))
        return fig


def transport_verdict(sdp_cfg: bool, loaded: dict[str, bool], procs: dict[int, dict],
                      daemons: list[int], conns: list[dict], read_traveled: float,
                      write_traveled: float) -> tuple[str, bool, str | None, dict]:
    """(transport, valid, reason, details) of one run.

    An SDP configuration needs libsdp in every daemon (loaded: "role:pid" ->
    mapped), no connection of any daemon ever kept on TCP and at least one
    SDP connection each (procs: `sdp stat --procs --json` per pid, counts
    since the process started), and every live connection between them on
    SDP (conns: `sdp stat --json`), the three kinds of MooseFS connection
    all present. A TCP configuration must not have libsdp anywhere. Both
    need the chunk servers' sockets to have moved at least 98 % of the
    bytes written and read (the data really travelled)."""
    info: dict = {}
    if sdp_cfg:
        tcp = sum(procs.get(pid, {}).get("tcp_conns", 0) for pid in daemons)
        nsdp = [procs.get(pid, {}).get("sdp_conns", 0) for pid in daemons]
        # live connections, each counted once (both ends are our daemons)
        kinds: dict = {}
        seen = set()
        for c in conns:
            ends = tuple(sorted((str(c.get("local")), str(c.get("remote")))))
            if c.get("pid") not in daemons or ends in seen:
                continue
            seen.add(ends)
            k = kinds.setdefault(_conn_kind(c), {"sdp": 0, "tcp": 0})
            k["sdp" if c.get("transport") == "sdp" else "tcp"] += 1
        info = {"connections": kinds, "sdp_conns_per_daemon": sorted(nsdp)}
        need = ("chunkserver-master", "client-master", "client-chunkserver")
        if not loaded or not all(loaded.values()):
            return "tcp", False, "libsdp.so not mapped in every daemon", info
        if tcp or not all(nsdp):
            return "sdp+tcp", False, (f"{tcp} daemon connection(s) kept on TCP; SDP "
                                      f"connections per daemon {sorted(nsdp)}"), info
        live_tcp = sum(k["tcp"] for k in kinds.values())
        missing = [n for n in need if not kinds.get(n, {}).get("sdp")]
        if live_tcp or missing:
            return "sdp+tcp", False, (f"live connections: {kinds} (TCP ones or no SDP "
                                      f"{', '.join(missing)})"), info
        transport = "sdp"
    else:
        if any(loaded.values()):
            return "sdp-preloaded", False, "libsdp.so mapped in a kernel-TCP configuration", info
        transport = "tcp"
    if read_traveled < 0.98 or write_traveled < 0.98:
        return transport, False, (f"the chunk servers' sockets moved only {read_traveled:.2f} "
                                  f"of the bytes read and {write_traveled:.2f} of the bytes "
                                  f"written: not every byte travelled"), info
    return transport, True, None, info


def _conn_kind(c: dict) -> str:
    ports = set()
    for k in ("local", "remote"):
        try:
            ports.add(int(str(c.get(k, "")).rsplit(":", 1)[1]))
        except (IndexError, ValueError):
            pass
    if MASTER_CS in ports:
        return "chunkserver-master"
    if MASTER_CL in ports:
        return "client-master"
    if any(CS_BASE <= p < CS_BASE + 64 for p in ports):
        return "client-chunkserver"
    return "other"


def experiments() -> list[Experiment]:
    return [Pfs()]
