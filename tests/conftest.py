"""Shared fixtures for the SDP test suites.

Everything an application test needs lives here:

* repository / build paths (``REPO``, ``BUILD``, ``SDP_BIN``, ``LIBSDP``),
* the run mode: ``SDP_APPS_MODE=sdp`` (default) runs applications under
  ``sdp run`` and checks the SDP counters; ``SDP_APPS_MODE=tcp`` runs the very
  same applications directly over kernel TCP and skips only the SDP-path
  assertions, so the test logic itself can be validated without libsdp,
* a free-port helper and a bounded "wait until the port accepts" poller,
* ``Proc``: a Popen wrapper that starts every program in its own session and
  always kills the whole session and reaps what it started,
* ``run_cmd``: a one-shot command with a mandatory timeout,
* ``sdp run`` command building and ``sdp stat`` queries (``SdpEnv``).

Optional environment:
  SDP_APPS_MODE    sdp | tcp                    (default sdp)
  SDP_BUILD_DIR    build directory              (default REPO/build)
  SDP_APPS_POLICY  policy file passed as ``sdp run --policy FILE``
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from buildpaths import BUILD, LIBSDP, REPO, SDP_BIN

TESTS = REPO / "tests"
APPS = TESTS / "apps"
HELPERS = APPS / "helpers"

INSTALL_HINT = "run `bash scripts/install-deps.sh`"


def apps_mode() -> str:
    mode = os.environ.get("SDP_APPS_MODE", "sdp").strip().lower()
    if mode not in ("sdp", "tcp"):
        raise pytest.UsageError(f"SDP_APPS_MODE must be 'sdp' or 'tcp', not {mode!r}")
    return mode


# --------------------------------------------------------------------------
# small utilities
# --------------------------------------------------------------------------

def require_bins(*names: str) -> dict[str, str]:
    """Return {name: path}; fail (never skip) when a program is missing."""
    found, missing = {}, []
    for n in names:
        p = shutil.which(n) or shutil.which(n, path="/usr/sbin:/sbin:/usr/local/sbin")
        if p:
            found[n] = p
        else:
            missing.append(n)
    if missing:
        pytest.fail(f"required program(s) not found: {', '.join(missing)}; {INSTALL_HINT}",
                    pytrace=False)
    return found


def _port_bindable(port: int) -> bool:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_port() -> int:
    """A currently free TCP port on 127.0.0.1.

    Picked below the kernel's ephemeral range so it cannot collide with the
    source port of some client connection made meanwhile."""
    lo_eph = 32768
    try:
        lo_eph = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    hi = max(min(lo_eph, 32768) - 1, 12000)
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(500):
        port = rng.randint(10000, hi)
        if _port_bindable(port):
            return port
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _proc_stat(pid: int):
    """(comm, state, ppid, pgid, sid) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError):
        return None
    lp, rp = raw.find("("), raw.rfind(")")
    comm = raw[lp + 1:rp]
    f = raw[rp + 2:].split()
    return comm, f[0], int(f[1]), int(f[2]), int(f[3])


def _all_pids():
    for name in os.listdir("/proc"):
        if name.isdigit():
            yield int(name)


def session_pids(sid: int, include_zombies: bool = False) -> list[int]:
    """Live processes of session `sid` (every Proc gets its own session)."""
    out = []
    for pid in _all_pids():
        st = _proc_stat(pid)
        if st and st[4] == sid and (include_zombies or st[1] not in ("Z", "X")):
            out.append(pid)
    return sorted(out)


def children_of(pid: int) -> list[int]:
    out = []
    for p in _all_pids():
        st = _proc_stat(p)
        if st and st[2] == pid and st[1] not in ("Z", "X"):
            out.append(p)
    return sorted(out)


def comm_of(pid: int) -> str | None:
    st = _proc_stat(pid)
    return st[0] if st else None


def has_libsdp(pid: int) -> bool:
    try:
        return "libsdp" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def listener_inodes(port: int) -> set[str]:
    """Socket inodes of TCP sockets listening on `port` (IPv4 and IPv6)."""
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                out.add(f[9])
    return out


def socket_inodes(pids) -> set[str]:
    out = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                out.add(link[8:-1])
    return out


def wait_port(port: int, proc: "Proc | None" = None, timeout: float = 20.0,
              host: str = "127.0.0.1") -> None:
    """Poll until a TCP connect to host:port succeeds (bounded deadline).

    With `proc`, fails early (with its log) if it died meanwhile, and also
    waits until the listening socket is really one of proc's, so a test never
    talks to some other program that happens to hold the port."""
    deadline = time.monotonic() + timeout
    last = None
    delay = 0.02
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{proc.name} exited with {proc.returncode} before listening on "
                        f"{host}:{port}\n{proc.log_tail()}", pytrace=False)
        try:
            with socket.create_connection((host, port), timeout=1.0):
                pass
            if proc is None or listener_inodes(port) & socket_inodes(proc.pids()):
                return
            last = f"port {port} is listened on by a process that is not {proc.name}"
        except OSError as e:
            last = e
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)
    extra = proc.log_tail() if proc is not None else ""
    pytest.fail(f"nothing of ours accepted on {host}:{port} within {timeout}s ({last})\n{extra}",
                pytrace=False)


# --------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------

class Proc:
    """A long-running program in its own session, output going to log files.

    stop() sends SIGTERM to everything in the session, waits (bounded), then
    SIGKILLs whatever is left and reaps the leader; it is idempotent and is
    always called by the `procs` fixture teardown."""

    def __init__(self, argv, name=None, env=None, cwd=None, logdir=None, stdin=None):
        self.argv = [str(a) for a in argv]
        self.name = name or Path(self.argv[0]).name
        logdir = Path(logdir or tempfile.mkdtemp(prefix="sdp-proc-"))
        logdir.mkdir(parents=True, exist_ok=True)
        tag = f"{self.name}.{time.monotonic_ns()}"
        self.out_path = logdir / f"{tag}.out"
        self.err_path = logdir / f"{tag}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.popen = subprocess.Popen(
            self.argv, env=env, cwd=cwd, stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=self._out, stderr=self._err, start_new_session=True)
        self.pid = self.popen.pid
        self.sid = self.pid
        self.stopped = False

    @property
    def returncode(self):
        return self.popen.returncode

    def poll(self):
        return self.popen.poll()

    def pids(self) -> list[int]:
        """All live processes this Proc started (its session)."""
        return session_pids(self.sid)

    def wait(self, timeout: float):
        return self.popen.wait(timeout=timeout)

    def stdout(self) -> str:
        self._out.flush()
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        self._err.flush()
        return self.err_path.read_text(errors="replace")

    def log_tail(self, n: int = 4000) -> str:
        return (f"--- {self.name} stdout ---\n{self.stdout()[-n:]}\n"
                f"--- {self.name} stderr ---\n{self.stderr()[-n:]}")

    def _signal_session(self, sig) -> None:
        try:
            os.killpg(self.sid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in session_pids(self.sid):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self.popen.poll()
            if self.popen.returncode is not None and not session_pids(self.sid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def stop(self, sig=signal.SIGTERM, grace: float = 5.0) -> int | None:
        if self.stopped:
            return self.popen.returncode
        try:
            if self.popen.poll() is None or session_pids(self.sid):
                self._signal_session(sig)
                if not self._wait_gone(grace):
                    self._signal_session(signal.SIGKILL)
                    self._wait_gone(10.0)
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        finally:
            self.stopped = True
            for f in (self._out, self._err):
                try:
                    f.close()
                except OSError:
                    pass
        return self.popen.returncode


class ProcSet:
    """Starts Procs and guarantees their teardown (reverse start order)."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        self.items: list[Proc] = []

    def start(self, argv, name=None, env=None, cwd=None, stdin=None) -> Proc:
        p = Proc(argv, name=name, env=env, cwd=cwd, logdir=self.logdir, stdin=stdin)
        self.items.append(p)
        return p

    def stop_all(self) -> None:
        for p in reversed(self.items):
            try:
                p.stop()
            except Exception:  # keep tearing down the rest
                pass


class CmdResult:
    def __init__(self, argv, returncode, stdout: bytes, stderr: bytes, elapsed: float):
        self.argv, self.returncode, self.elapsed = argv, returncode, elapsed
        self.stdout_b, self.stderr_b = stdout, stderr

    @property
    def stdout(self) -> str:
        return self.stdout_b.decode(errors="replace")

    @property
    def stderr(self) -> str:
        return self.stderr_b.decode(errors="replace")

    def describe(self, n: int = 3000) -> str:
        return (f"$ {' '.join(self.argv)}\n-> exit {self.returncode} after {self.elapsed:.1f}s\n"
                f"--- stdout ---\n{self.stdout[-n:]}\n--- stderr ---\n{self.stderr[-n:]}")


def run_cmd(argv, timeout: float, env=None, cwd=None, input: bytes | None = None,
            check: bool = True, stdout_path: Path | None = None) -> CmdResult:
    """Run a command in its own session with a hard timeout.

    On timeout the whole session is killed and the test fails with the output
    collected so far. With check=True a non-zero exit fails the test.
    stdout_path sends stdout to a file instead of memory (large downloads)."""
    argv = [str(a) for a in argv]
    t0 = time.monotonic()
    out_f = open(stdout_path, "wb") if stdout_path else None
    p = subprocess.Popen(argv, env=env, cwd=cwd,
                         stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                         stdout=out_f if out_f else subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    timed_out = False
    try:
        out, err = p.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            for pid in session_pids(p.pid):
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            try:
                out, err = p.communicate(timeout=5)
                break
            except subprocess.TimeoutExpired:
                out, err = b"", b""
    finally:
        if out_f:
            out_f.close()
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
    res = CmdResult(argv, p.returncode, out or b"", err or b"", time.monotonic() - t0)
    if timed_out:
        pytest.fail(f"command timed out after {timeout}s\n{res.describe()}", pytrace=False)
    if check and res.returncode != 0:
        pytest.fail(f"command failed\n{res.describe()}", pytrace=False)
    return res


# --------------------------------------------------------------------------
# SDP: `sdp run` and `sdp stat`
# --------------------------------------------------------------------------

STAT_KEYS = ("sdp_conns", "tcp_conns", "tx_bytes", "rx_bytes",
             "regions_created", "regions_reused", "regions_mapped", "mappings_reused",
             "net_conns", "net_tx_bytes", "net_rx_bytes")


def _sum_stats(objs) -> dict:
    tot = {k: 0 for k in STAT_KEYS}
    for o in objs:
        for k in STAT_KEYS:
            tot[k] += int(o.get(k, 0) or 0)
    return tot


class SdpEnv:
    """Mode-aware command building and SDP counter queries.

    In tcp mode wrap() returns the command unchanged and the counter helpers
    are never used by the tests (they check `sdp.enabled` first)."""

    def __init__(self, mode: str, tmp: Path):
        self.mode = mode
        self.enabled = mode == "sdp"
        self.tmp = tmp
        self.policy = os.environ.get("SDP_APPS_POLICY") or None
        self._n = 0

    # -- running programs ----------------------------------------------------
    def wrap(self, argv, sdp: bool = True) -> list[str]:
        """`sdp run [--policy F] -- argv` in sdp mode (and sdp=True), else argv."""
        argv = [str(a) for a in argv]
        if not (self.enabled and sdp):
            return argv
        cmd = [str(SDP_BIN), "run"]
        if self.policy:
            cmd += ["--policy", self.policy]
        return cmd + ["--"] + argv

    def env(self, stats_dir: Path | None = None, **extra) -> dict:
        e = dict(os.environ)
        e.pop("LD_PRELOAD", None)
        e.pop("SDP_STATS_DIR", None)
        if stats_dir is not None:
            e["SDP_STATS_DIR"] = str(stats_dir)
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def new_stats_dir(self, tag: str = "client") -> Path:
        self._n += 1
        d = self.tmp / f"stats-{tag}-{self._n}"
        d.mkdir(parents=True)
        return d

    # -- counters ------------------------------------------------------------
    def _stat(self, *args) -> list:
        res = run_cmd([SDP_BIN, "stat", *args, "--json"], timeout=30, check=False)
        if res.returncode != 0:
            pytest.fail(f"`sdp stat {' '.join(args)} --json` failed\n{res.describe()}",
                        pytrace=False)
        try:
            data = json.loads(res.stdout)
        except ValueError as e:
            pytest.fail(f"`sdp stat {' '.join(args)} --json` printed invalid JSON ({e})\n"
                        f"{res.describe()}", pytrace=False)
        if not isinstance(data, list):
            pytest.fail(f"`sdp stat {' '.join(args)} --json` did not print a JSON array\n"
                        f"{res.describe()}", pytrace=False)
        return data

    def stat_conns(self) -> list:
        """Live SDP-switched connections (`sdp stat --json`)."""
        return self._stat()

    def stat_procs(self) -> list:
        """Processes with libsdp loaded (`sdp stat --procs --json`)."""
        return self._stat("--procs")

    def procs_stats(self, pids) -> dict[int, dict]:
        """{pid: stats object} for those of `pids` that sdp stat lists."""
        pids = {int(p) for p in pids}
        return {int(o["pid"]): o for o in self.stat_procs() if int(o.get("pid", -1)) in pids}

    def server_stats(self, proc: Proc, expect_pids=None) -> dict:
        """Summed counters of the libsdp processes in `proc`'s session.

        Fails with a diagnosis when none of them is listed by sdp stat."""
        pids = list(expect_pids) if expect_pids is not None else proc.pids()
        found = self.procs_stats(pids)
        if not found:
            diag = {p: {"comm": comm_of(p), "libsdp_mapped": has_libsdp(p)} for p in pids}
            pytest.fail(f"`sdp stat --procs --json` lists none of {proc.name}'s processes "
                        f"{diag}", pytrace=False)
        tot = _sum_stats(found.values())
        tot["per_pid"] = found
        return tot

    def read_stats_dir(self, d: Path) -> list[dict]:
        out = []
        for f in sorted(Path(d).glob("*.json")):
            try:
                out.append(json.loads(f.read_text()))
            except ValueError as e:
                pytest.fail(f"stats file {f} is not valid JSON ({e}): {f.read_text()[:500]!r}",
                            pytrace=False)
        return out

    def client_stats(self, d: Path, comm: str | None = None) -> dict:
        """Summed exit-time counters written into SDP_STATS_DIR `d`.

        With `comm`, only files of processes with that command name count."""
        objs = self.read_stats_dir(d)
        files = sorted(p.name for p in Path(d).glob("*"))
        if comm is not None:
            # the kernel's comm is cut to 15 characters; compare that much
            objs = [o for o in objs if str(o.get("comm", ""))[:15] == comm[:15]]
        if not objs:
            pytest.fail(f"no SDP_STATS_DIR file{' for ' + comm if comm else ''} in {d} "
                        f"(present: {files}); the client did not report its SDP counters",
                        pytrace=False)
        tot = _sum_stats(objs)
        tot["objs"] = objs
        return tot


def delta(after: dict, before: dict) -> dict:
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in STAT_KEYS}


def assert_bytes_between(what: str, value: int, lo: int, hi: int | None = None) -> None:
    if value < lo or (hi is not None and value > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        pytest.fail(f"{what} = {value}, expected {rng}", pytrace=False)


def slack(n: int, frac: float = 0.05, extra: int = 1 << 20) -> int:
    """Upper bound for a byte counter that should carry about n payload bytes."""
    return int(n * (1 + frac)) + extra


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------

@pytest.fixture(scope="session")
def apps_run_mode() -> str:
    return apps_mode()


@pytest.fixture(scope="session")
def sdp(apps_run_mode, tmp_path_factory) -> SdpEnv:
    mode = apps_run_mode
    if mode == "sdp":
        missing = [str(p) for p in (SDP_BIN, LIBSDP) if not p.exists()]
        if missing:
            pytest.fail(f"SDP mode needs {', '.join(missing)}: build with `make` first "
                        f"(or set SDP_APPS_MODE=tcp to run the applications over plain TCP)",
                        pytrace=False)
    return SdpEnv(mode, tmp_path_factory.mktemp("sdp"))


@pytest.fixture
def procs(tmp_path):
    ps = ProcSet(tmp_path / "logs")
    (tmp_path / "logs").mkdir(exist_ok=True)
    try:
        yield ps
    finally:
        ps.stop_all()


@pytest.fixture(scope="module")
def module_procs(tmp_path_factory):
    d = tmp_path_factory.mktemp("modlogs")
    ps = ProcSet(d)
    try:
        yield ps
    finally:
        ps.stop_all()


@pytest.fixture(scope="session")
def helpers_dir() -> Path:
    return HELPERS


@pytest.fixture(scope="session")
def kit():
    """The helper functions above, for test modules (which should not import
    conftest directly)."""
    import types
    return types.SimpleNamespace(
        REPO=REPO, BUILD=BUILD, SDP_BIN=SDP_BIN, LIBSDP=LIBSDP, APPS=APPS, HELPERS=HELPERS,
        INSTALL_HINT=INSTALL_HINT, require_bins=require_bins, free_port=free_port,
        wait_port=wait_port, run_cmd=run_cmd, Proc=Proc, session_pids=session_pids,
        children_of=children_of, comm_of=comm_of, has_libsdp=has_libsdp, delta=delta,
        assert_bytes_between=assert_bytes_between, slack=slack)
