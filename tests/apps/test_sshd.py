"""sshd (Debian's openssh-server) under `sdp run`, with ssh and scp under `sdp
run` as clients: key login for root on a high port of 127.0.0.1, with a host
key, configuration and authorized_keys of the test's own (the machine's sshd
configuration and port 22 are never touched).

sshd is the hard case for a socket switch: each connection is accepted by the
listener, and then either re-executed (stock: `sshd -R`, the exec hands the
connection back to TCP) or, with `-r`, kept in the forked child, whose
pre-authentication child chroots, drops privileges and installs a seccomp
filter that kills it on any system call outside a short list (the library
hands the connection back to TCP before the filter goes in).

Per mode (stock and -r): `ssh HOST sha256sum < 50 MB`, scp of 50 MB up and
down (SFTP protocol), and 50 short connections, 4 at a time, each echoing
64 KiB of its own through `cat`; every byte is checked, no command may hang,
and no sshd process of a finished connection may be left behind. The SDP
path: every ssh process reports one SDP connection (SDP_STATS_DIR), and the
listener accepted every client connection over SDP (its own exit-time
counters: sshd closes every descriptor it did not open itself, the pool's
included, so `sdp stat` cannot find it). With -r the client's version string
went over SDP before the hand-back, so its SDP byte counter is not zero.
"""

import concurrent.futures
import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

DATA_SIZE = 50 << 20
CONNS = 50
PARALLEL = 4
ECHO_SIZE = 64 << 10
SSHD = "/usr/sbin/sshd"          # sshd re-executes itself: needs an absolute path


@pytest.fixture(scope="module")
def sshkit(tmp_path_factory, kit):
    kit.require_bins("ssh", "scp", "ssh-keygen")
    if not Path(SSHD).exists():
        pytest.fail(f"{SSHD} not found; {kit.INSTALL_HINT}", pytrace=False)
    if os.geteuid() != 0:
        pytest.skip("sshd's privilege separation (chroot, setuid, seccomp sandbox) needs root")
    d = tmp_path_factory.mktemp("sshd")
    for name in ("host", "client"):
        kit.run_cmd(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"sdp-test-{name}",
                     "-f", d / name], timeout=30)
    (d / "authorized_keys").write_bytes((d / "client.pub").read_bytes())
    os.chmod(d / "authorized_keys", 0o600)
    data = os.urandom(DATA_SIZE)
    (d / "data.bin").write_bytes(data)
    # sshd's privilege separation directory, which the system's sshd service
    # creates at start-up (empty, root's, 0755); left in place
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    return d, hashlib.sha256(data).hexdigest()


def _config(d, port):
    return f"""Port {port}
ListenAddress 127.0.0.1
HostKey {d}/host
PidFile none
AuthorizedKeysFile {d}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
UseDNS no
PrintMotd no
PrintLastLog no
MaxStartups 100
Subsystem sftp internal-sftp
LogLevel VERBOSE
"""


def _ppid_map():
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        f = raw[raw.rfind(")") + 2:].split()
        if f[0] not in ("Z", "X"):
            out[int(name)] = int(f[1])
    return out


def _descendants(pid):
    """Live descendants of pid (sshd's per-connection processes call setsid,
    so they are not in the listener's session)."""
    ppid = _ppid_map()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in ppid.items() if pp == p]
        out += kids
        todo += kids
    return sorted(out)


class Sshd:
    def __init__(self, proc, port, stats_dir):
        self.proc, self.port, self.stats_dir = proc, port, stats_dir

    def children(self):
        return _descendants(self.proc.pid)


@pytest.fixture
def sshd_server(sdp, procs, kit, sshkit, tmp_path):
    """sshd_server(reexec) -> Sshd; its connection processes are stopped too."""
    started = []

    def start(reexec):
        d, _ = sshkit
        port = kit.free_port()
        conf = tmp_path / "sshd_config"
        conf.write_text(_config(d, port))
        stats = sdp.new_stats_dir("sshd")
        argv = [SSHD, "-D", "-e", "-f", conf] + ([] if reexec else ["-r"])
        proc = procs.start(sdp.wrap(argv), name="sshd" if reexec else "sshd-r",
                           env=sdp.env(stats))
        kit.wait_port(port, proc)
        srv = Sshd(proc, port, stats)
        started.append(srv)
        return srv

    yield start
    for srv in started:                   # before `procs` stops the listener
        left = srv.children() if srv.proc.poll() is None else []
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in left:
                try:
                    os.kill(p, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 5
            while left and time.monotonic() < deadline:
                alive = _ppid_map()
                left = [p for p in left if p in alive]
                time.sleep(0.05)


def _ssh_opts(d):
    return ["-F", "/dev/null", "-i", d / "client", "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=20"]


def _client_env(sdp, stats_dir):
    env = sdp.env(stats_dir)
    env.pop("SSH_AUTH_SOCK", None)
    return env


def _sha256_file(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@pytest.mark.parametrize("reexec", [False, True], ids=["no-reexec", "reexec"])
def test_sshd(reexec, sshd_server, sshkit, sdp, kit, tmp_path):
    d, digest = sshkit
    srv = sshd_server(reexec)
    opts = _ssh_opts(d)
    ssh = ["ssh", *opts, "-p", srv.port, "-T", "root@127.0.0.1"]
    stats = sdp.new_stats_dir("ssh")
    env = _client_env(sdp, stats)
    nconns = 0

    # 50 MB through the connection, checked on the far side
    res = kit.run_cmd(sdp.wrap(ssh + ["sha256sum"]), timeout=120, env=env,
                      input=(d / "data.bin").read_bytes())
    nconns += 1
    assert res.stdout.split()[:1] == [digest], f"remote sha256sum differs\n{res.describe()}"

    # scp both ways (SFTP)
    scp = ["scp", "-q", *opts, "-P", srv.port]
    up, down = tmp_path / "up.bin", tmp_path / "down.bin"
    kit.run_cmd(sdp.wrap(scp + [d / "data.bin", f"root@127.0.0.1:{up}"]), timeout=120, env=env)
    nconns += 1
    assert _sha256_file(up) == digest, "scp upload: bytes differ"
    kit.run_cmd(sdp.wrap(scp + [f"root@127.0.0.1:{d / 'data.bin'}", down]), timeout=120,
                env=env)
    nconns += 1
    assert _sha256_file(down) == digest, "scp download: bytes differ"

    # many connections, a few at a time; none may hang
    def one(i):
        data = os.urandom(ECHO_SIZE)
        r = kit.run_cmd(sdp.wrap(ssh + ["cat"]), timeout=60, env=env, input=data)
        return i, r.stdout_b == data, r

    with concurrent.futures.ThreadPoolExecutor(PARALLEL) as pool:
        results = list(pool.map(one, range(CONNS)))
    nconns += CONNS
    bad = [(i, r.describe(300)) for i, ok, r in results if not ok]
    assert not bad, f"{len(bad)} of {CONNS} connections echoed wrong bytes: {bad[:3]}"

    # every connection's sshd processes are gone (a hung one would stay)
    deadline = time.monotonic() + 15
    while srv.children() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = srv.children()
    assert not left, f"sshd processes of finished connections still running: " \
        f"{[(p, kit.comm_of(p)) for p in left]}\n{srv.proc.log_tail()}"

    if not sdp.enabled:
        return
    cl = sdp.read_stats_dir(stats)
    ssh_files = [o for o in cl if o.get("comm") == "ssh"]
    assert len(ssh_files) == nconns, \
        f"expected {nconns} ssh stats files, found {len(ssh_files)}: {cl[:3]}"
    not_sdp = [o for o in ssh_files if o["sdp_conns"] != 1 or o["tcp_conns"] != 0]
    assert not not_sdp, f"ssh processes not on SDP: {not_sdp[:3]}"
    if not reexec:
        # the version string went over SDP before the hand-back (the child
        # reads it before it forks the sandboxed one)
        silent = [o for o in ssh_files if o["tx_bytes"] < len("SSH-2.0-")]
        assert not silent, f"ssh sent nothing over SDP: {silent[:3]}"
    listener = srv.proc.pid
    srv.proc.stop()                       # exit-time counters
    mine = [o for o in sdp.read_stats_dir(srv.stats_dir) if o.get("pid") == listener]
    assert mine, f"the sshd listener (pid {listener}) wrote no SDP_STATS_DIR file: " \
        f"{sorted(p.name for p in srv.stats_dir.iterdir())}\n{srv.proc.log_tail()}"
    st = mine[0]
    assert st["sdp_conns"] == nconns, f"sshd accepted {st['sdp_conns']} of {nconns} " \
        f"connections over SDP: {st}"
    assert st["tcp_conns"] <= 1, f"sshd took client connections as TCP (one plain probe " \
        f"is the harness's): {st}"
