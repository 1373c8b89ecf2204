"""SDP between two hosts: the ofi provider (libfabric's tcp provider) across
two network namespaces joined by a veth pair, which stand for two hosts.

The namespaces are made here and removed at the end (also when a test
fails); the module is skipped, with the reason, where namespaces cannot be
made (not root, no `ip`) or libfabric has no usable provider.

What is proven:
* a subset of the C feature programs (tests/c) with every connection's
  client in the other namespace (testlib.h: TL_NET_CLIENT_NS), first on
  kernel TCP, then under `sdp run`, where each connection must say
  "SDP over ofi:" in the log;
* a checksummed stream, with `sdp stat --json` showing "fabric": "ofi:tcp"
  on both ends and the bytes, and zero copy over ofi: Read Zero Copy moved
  registered memory, the registration cache hit;
* a client with the library to a server without it and the reverse: TCP,
  working;
* two processes of one namespace still use shm;
* kill -9 of either end: the survivor's blocked recv ends (EOF or
  ECONNRESET, as TCP), never hangs; a cut link (veth down) with keepalive
  and TCP_USER_TIMEOUT gives ETIMEDOUT, as TCP does;
* applications: iperf3, redis, the checksummed stress test.
"""
import json
import atexit
import os
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from buildpaths import SDP_BIN as SDP
from buildpaths import TESTS_C

HERE = Path(__file__).resolve().parent
PEER = HERE / "peer.py"
STRESS = HERE.parent / "apps" / "helpers" / "stress.py"
SRV4, CLI4 = "10.203.0.1", "10.203.0.2"
SRV6, CLI6 = "fd03::1", "fd03::2"

# The C programs run across the namespaces: every one whose connections are
# made by testlib's tl_connect / tl_pair (the others connect to an address
# of their own namespace, which is shm's), and that pass there. Left out:
# t_fork, t_zc_fork (a connection inherited across fork goes back to TCP
# first: libfabric endpoints belong to one process), t_prefork and t_idle
# (they count on the client's library acting without being called: see
# ARCHITECTURE "Set-up across hosts"), t_order (epoll order across
# providers), t_sigpartial, t_zc_signal, t_zc_kill, t_handback (their
# timing), t_kill (over veth even kernel TCP lets its blocked send
# finish), t_errno, t_sockopt, t_bindany, t_accept4, t_connect (they check
# loopback addresses or bind the client themselves).
C_SUBSET = ["t_stream", "t_duplex", "t_poll", "t_epoll", "t_epoll_et", "t_nonblock",
            "t_peek", "t_waitall", "t_shutdown", "t_reset", "t_timeo", "t_iocalls",
            "t_sendfile", "t_sigpipe", "t_exec", "t_scm", "t_threads", "t_zc_basic",
            "t_accept_refuse", "t_dup"]


def _run(argv, timeout=20):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


class Hosts:
    """Two namespaces, a veth pair, IPv4 and IPv6 addresses."""

    def __init__(self):
        tag = str(os.getpid())
        self.a, self.b = f"sdpo{tag}a", f"sdpo{tag}b"
        self.va, self.vb = f"so{tag[-7:]}a", f"so{tag[-7:]}b"

    def make(self):
        steps = [["ip", "netns", "add", self.a], ["ip", "netns", "add", self.b],
                 ["ip", "link", "add", self.va, "type", "veth", "peer", "name", self.vb],
                 ["ip", "link", "set", self.va, "netns", self.a],
                 ["ip", "link", "set", self.vb, "netns", self.b],
                 ["ip", "-n", self.a, "addr", "add", f"{SRV4}/24", "dev", self.va],
                 ["ip", "-n", self.b, "addr", "add", f"{CLI4}/24", "dev", self.vb],
                 ["ip", "-n", self.a, "addr", "add", f"{SRV6}/64", "dev", self.va, "nodad"],
                 ["ip", "-n", self.b, "addr", "add", f"{CLI6}/64", "dev", self.vb, "nodad"]]
        for ns, dev in ((self.a, self.va), (self.b, self.vb)):
            steps += [["ip", "-n", ns, "link", "set", "lo", "up"],
                      ["ip", "-n", ns, "link", "set", dev, "up"]]
        for st in steps:
            r = _run(st)
            if r.returncode:
                return f"`{' '.join(st)}`: {r.stderr.strip()}"
        return None

    def remove(self):
        for ns in (self.a, self.b):
            _run(["ip", "netns", "del", ns])

    def link(self, up):
        _run(["ip", "-n", self.a, "link", "set", self.va, "up" if up else "down"])

    def cmd(self, ns, argv, sdp=True):
        pre = ["ip", "netns", "exec", ns]
        return pre + ([str(SDP), "run", "--"] if sdp else []) + [str(a) for a in argv]


@pytest.fixture(scope="module")
def hosts():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not shutil.which("ip"):
        pytest.skip("`ip` (iproute2) is not installed")
    check = json.loads(_run([str(SDP), "check", "--json"], timeout=60).stdout)
    ofi = check.get("ofi", {})
    if not any(p["usable"] and p["name"] == "tcp" for p in ofi.get("providers", [])):
        pytest.skip("no usable libfabric tcp provider (sdp check: %s)" %
                    json.dumps(ofi)[:300])
    # Namespaces of an earlier run of this module that was killed.
    for line in _run(["ip", "netns", "list"]).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith("sdpo") and name[4:-1].isdigit() and \
                not os.path.exists(f"/proc/{int(name[4:-1])}"):
            _run(["ip", "netns", "del", name])
    h = Hosts()
    atexit.register(h.remove)
    err = h.make()
    if err:
        h.remove()
        pytest.skip(f"network namespaces not possible here: {err}")
    yield h
    h.remove()


def _env(**extra):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Bg:
    """A background process; killed (by its pid) at the end of the test."""
    live = []

    def __init__(self, argv, env, stdin=None):
        self.p = subprocess.Popen(argv, env=env, stdin=stdin, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.seen = ""
        Bg.live.append(self)

    def wait_line(self, text, timeout=20):
        """Wait (bounded) for text on stdout; what was read is kept."""
        end = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while text not in self.seen and time.monotonic() < end:
            r, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
            if not r:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            self.seen += chunk.decode(errors="replace")
        if text in self.seen:
            return self.seen
        self.p.kill()
        out, err = self.p.communicate()
        pytest.fail(f"no {text!r} from {self.p.args}: {self.seen}{out}{err[-3000:]}")

    def finish(self, timeout=30, fail=True):
        try:
            out, err = self.p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            out, err = self.p.communicate()
            if not fail:                # the caller says what it means
                return None, self.seen + out, err
            pytest.fail(f"{self.p.args} did not end in {timeout} s: {err[-3000:]}")
        return self.p.returncode, self.seen + out, err


@pytest.fixture(autouse=True)
def _reap():
    yield
    for b in Bg.live:
        if b.p.poll() is None:
            b.p.kill()
            b.p.communicate()
    Bg.live.clear()


_port = [int(os.environ.get("SDP_NETNS_PORT0", 23000 + os.getpid() % 2000))]


def port():
    _port[0] += 1
    return _port[0]


# ---- the C feature programs across hosts ------------------------------------------

@pytest.mark.parametrize("mode", ["tcp", "sdp"])
@pytest.mark.parametrize("prog", C_SUBSET)
def test_c_across_hosts(hosts, prog, mode):
    env = _env(SDP_EXPECT=mode, TL_NET_CLIENT_NS=f"/run/netns/{hosts.b}",
               TL_NET_SERVER4=SRV4, TL_NET_SERVER6=SRV6, SDP_LOG=2)
    argv = hosts.cmd(hosts.a, [TESTS_C / prog], sdp=mode == "sdp")
    res = subprocess.run(argv, env=env, cwd=str(TESTS_C), capture_output=True, text=True,
                         timeout=90)
    if res.returncode == 77:
        pytest.skip(res.stderr.strip()[-300:])
    assert res.returncode == 0, f"{prog} ({mode}): exit {res.returncode}\n{res.stderr[-4000:]}"
    if mode == "sdp":
        assert "SDP over ofi:" in res.stderr, f"{prog}: no connection over ofi\n" \
                                              f"{res.stderr[-3000:]}"


# ---- streams, stat, zero copy ---------------------------------------------------------

def _stat(ns):
    r = _run(["ip", "netns", "exec", ns, str(SDP), "stat", "--json"], timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _conns(stat, port_):
    out = []
    for c in stat:
        if c["local"].endswith(f":{port_}") or c["remote"].endswith(f":{port_}"):
            out.append(c)
    return out


@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_stream_over_ofi(hosts, tmp_path, family):
    p = port()
    srv_addr = SRV4 if family == "ipv4" else SRV6
    env = _env(SDP_LOG=2, SDP_ZCOPY_THRESH=65536)
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", srv_addr, p, "sink"]), env)
    srv.wait_line("listening")
    hold = tmp_path / "hold"
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, PEER, "client", srv_addr, p, "send",
                                 64 << 20]), _env(SDP_LOG=2, SDP_ZCOPY_THRESH=65536,
                                                  PEER_HOLD=hold))
    cli.wait_line("sent", timeout=60)
    st = _stat(hosts.a)
    both = _conns(st, p)
    hold.touch()
    rc, out, err = cli.finish()
    assert rc == 0 and "match" in out, f"{out}\n{err[-3000:]}"
    rc, sout, serr = srv.finish()
    assert rc == 0, serr[-3000:]
    assert "SDP over ofi:tcp" in err and "SDP over ofi:tcp" in serr, err[-2000:] + serr[-2000:]
    # One namespace's `sdp stat` sees both processes (one pid namespace).
    sides = {c["role"]: c for c in both}
    assert set(sides) == {"client", "server"}, json.dumps(both)
    for c in sides.values():
        assert c["fabric"] == "ofi:tcp" and c["transport"] == "sdp", json.dumps(c)
        # No SDP_SLOT_SIZE/SDP_NSLOTS given: the ofi provider's own
        # geometry, the library's ring bytes (64 x 32 KiB) in 64 KiB
        # buffers (ofi.h OFI_SLOT_DEFAULT).
        assert (c["slot_size"], c["nslots"]) == (65536, 32), json.dumps(c)
    assert sides["client"]["tx_bytes"] == 64 << 20
    assert sides["server"]["rx_bytes"] == 64 << 20
    # 1 MiB blocking sends over 64 KiB: Read Zero Copy from registered
    # memory, found in the registration cache after the first time.
    assert sides["server"]["rx_rzcopy_bytes"] > 0, json.dumps(sides)
    assert sides["client"]["mr_cache_hits"] > 0, json.dumps(sides["client"])
    print("registration cache (client): %d hits, %d misses" %
          (sides["client"]["mr_cache_hits"], sides["client"]["mr_cache_misses"]))


def test_ofi_geometry_given(hosts, tmp_path):
    """SDP_SLOT_SIZE given by the user: the ofi connection keeps it (the
    provider's own geometry is only for the library's defaults)."""
    p = port()
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, "sink"]),
             _env(SDP_LOG=2))
    srv.wait_line("listening")
    hold = tmp_path / "hold"
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, PEER, "client", SRV4, p, "send", 4 << 20]),
             _env(SDP_LOG=2, SDP_SLOT_SIZE=16384, SDP_NSLOTS=16, PEER_HOLD=hold))
    cli.wait_line("sent", timeout=60)
    both = _conns(_stat(hosts.a), p)
    hold.touch()
    rc, out, err = cli.finish()
    assert rc == 0 and "match" in out, f"{out}\n{err[-3000:]}"
    rc, _, serr = srv.finish()
    assert rc == 0, serr[-3000:]
    assert len(both) == 2, json.dumps(both)
    for c in both:
        assert c["fabric"] == "ofi:tcp", json.dumps(c)
        assert (c["slot_size"], c["nslots"]) == (16384, 16), json.dumps(c)


def test_same_host_still_shm(hosts):
    p = port()
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, "sink"]),
             _env(SDP_LOG=2))
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "client", SRV4, p, "send", 1 << 20]),
             _env(SDP_LOG=2))
    rc, out, err = cli.finish()
    assert rc == 0 and "match" in out, err[-3000:]
    assert "SDP over shm" in err, err[-2000:]


@pytest.mark.parametrize("who", ["server", "client"])
def test_one_end_without_the_library(hosts, who):
    """Only one end runs the library: plain TCP, and it works."""
    p = port()
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, "sink"],
                       sdp=who != "server"), _env(SDP_LOG=2))
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, PEER, "client", SRV4, p, "send", 4 << 20],
                       sdp=who != "client"), _env(SDP_LOG=2))
    rc, out, err = cli.finish()
    assert rc == 0 and "match" in out, out + err[-3000:]
    rc, sout, serr = srv.finish()
    assert rc == 0
    assert "SDP over" not in err + serr
    if who == "server":
        # the client asked the server's rendezvous port: refused at once
        assert "TCP (no network rendezvous" in err, err[-2000:]
    print(out.splitlines()[0])


PROBE = r"""
import socket, sys
dst, port = sys.argv[1], int(sys.argv[2])
s = socket.socket()
s.settimeout(10)
try:
    s.connect((dst, port))
    s.sendall(b"hello")
    print("connected")
except OSError as e:
    print("error", e.errno)
print("libfabric", "libfabric" in open("/proc/self/maps").read())
"""


def test_tcp_peers_do_not_load_libfabric(hosts):
    """A connect to a host behind a router, or to a server of our network
    without the library, stays TCP without loading libfabric (whose
    start-up costs each process about 0.3 s): the client loads it only
    once a network rendezvous answered."""
    # behind a router: a default route through the other namespace
    r = _run(["ip", "-n", hosts.b, "route", "add", "default", "via", SRV4])
    assert r.returncode == 0, r.stderr
    try:
        cli = Bg(hosts.cmd(hosts.b, [sys.executable, "-c", PROBE, "198.51.100.7", 9]),
                 _env(SDP_LOG=2))
        rc, out, err = cli.finish()
        assert "libfabric False" in out, out + err[-2000:]
        assert "SDP over" not in err, err[-2000:]
    finally:
        _run(["ip", "-n", hosts.b, "route", "del", "default"])
    # on our network, a server without the library
    p = port()
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, "sink"], sdp=False),
             _env())
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, "-c", PROBE, SRV4, p]), _env(SDP_LOG=2))
    rc, out, err = cli.finish()
    assert rc == 0 and "connected" in out and "libfabric False" in out, out + err[-2000:]
    assert "TCP (no network rendezvous" in err, err[-2000:]
    srv.finish(timeout=10, fail=False)


# ---- failures -------------------------------------------------------------------------

def _blocked_pair(hosts, server_mode, client_mode, env_extra=None):
    p = port()
    env = _env(SDP_LOG=2, **(env_extra or {}))
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, server_mode]), env)
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, PEER, "client", SRV4, p, client_mode]), env)
    cli.wait_line("connected")
    if server_mode == "wait":
        srv.wait_line("accepted")
    return srv, cli


def _python_pid(bg):
    """The python process under `ip netns exec` / `sdp run` (they exec)."""
    return bg.p.pid


@pytest.mark.parametrize("mode", ["sdp", "tcp"])
def test_kill_server(hosts, mode):
    p = port()
    env = _env(SDP_LOG=2)
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, "wait"],
                       sdp=mode == "sdp"), env)
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, PEER, "client", SRV4, p, "recv"],
                       sdp=mode == "sdp"), env)
    cli.wait_line("connected")
    srv.wait_line("accepted")
    time.sleep(0.2)          # let the client block in recv (not a sync: either way ends)
    srv.p.kill()
    rc, out, err = cli.finish(timeout=20)
    # nothing unread on either side: the killed end's kernel sends FIN,
    # the survivor reads EOF, as over TCP
    assert "recv returned 0 bytes" in out, out + err[-2000:]


@pytest.mark.parametrize("mode", ["sdp", "tcp"])
def test_kill_client(hosts, mode):
    p = port()
    env = _env(SDP_LOG=2)
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, "wait"],
                       sdp=mode == "sdp"), env)
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, PEER, "client", SRV4, p, "recv"],
                       sdp=mode == "sdp"), env)
    cli.wait_line("connected")
    srv.wait_line("accepted")
    time.sleep(0.2)
    cli.p.kill()
    rc, out, err = srv.finish(timeout=20)
    assert "recv returned 0 bytes" in out, out + err[-2000:]


@pytest.mark.parametrize("mode", [
    pytest.param("sdp", marks=pytest.mark.xfail(strict=False, reason=(
        "known: killed before the client's library completed the fabric "
        "connection, the server's kernel closes the idle TCP socket with FIN; "
        "the client hands its ring back to TCP after that FIN and reads EOF, "
        "not TCP's ECONNRESET (ARCHITECTURE.md, known limitations); when the "
        "client completed it first, it passes"))),
    "tcp"])
def test_kill_server_with_unread_data(hosts, mode):
    """kill -9 of a server that left 64 KiB of the client's unread: TCP's
    kernel answers with a reset, the client's blocked recv gets
    ECONNRESET - over ofi too (the data was on the fabric, not on the
    application's socket, whose kernel sends FIN: the library judges)."""
    p = port()
    env = _env(SDP_LOG=2)
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, "hold"],
                       sdp=mode == "sdp"), env)
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, PEER, "client", SRV4, p, "sendrecv"],
                       sdp=mode == "sdp"), env)
    cli.wait_line("connected")
    srv.wait_line("accepted")
    srv.p.kill()
    rc, out, err = cli.finish(timeout=20)
    assert "recv error ConnectionResetError" in out, out + err[-2000:]


@pytest.mark.parametrize("mode", ["sdp", "tcp"])
def test_cut_link(hosts, mode):
    """veth down under a blocked recv with keepalive and TCP_USER_TIMEOUT:
    ETIMEDOUT (TimeoutError) as TCP gives, within seconds."""
    p = port()
    env = _env(SDP_LOG=2)
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, "wait"],
                       sdp=mode == "sdp"), env)
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, PEER, "client", SRV4, p, "keepalive"],
                       sdp=mode == "sdp"), env)
    cli.wait_line("connected")
    srv.wait_line("accepted")
    hosts.link(False)
    try:
        rc, out, err = cli.finish(timeout=30)
    finally:
        hosts.link(True)
    assert "recv error TimeoutError" in out, out + err[-2000:]


@pytest.mark.parametrize("mode", ["sdp", "tcp"])
def test_cut_link_under_send(hosts, mode):
    """veth down under a sender that keeps sending (TCP_USER_TIMEOUT 3 s,
    no keepalive; the receiver reads all): its send fails with ETIMEDOUT
    (TimeoutError) as TCP's, never hangs."""
    p = port()
    env = _env(SDP_LOG=2)
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, PEER, "server", SRV4, p, "sink"],
                       sdp=mode == "sdp"), env)
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, PEER, "client", SRV4, p, "flood"],
                       sdp=mode == "sdp"), env)
    cli.wait_line("sending", timeout=30)
    hosts.link(False)
    try:
        rc, out, err = cli.finish(timeout=40)
    finally:
        hosts.link(True)
    # TCP says ETIMEDOUT, or EHOSTUNREACH when the link's neighbour
    # resolution failed meanwhile (its soft error): either, not EPIPE
    assert "send error TimeoutError" in out or "(EHOSTUNREACH)" in out, out + err[-2000:]
    if mode == "sdp":
        assert "SDP over ofi:tcp" in err, err[-2000:]


# ---- applications ------------------------------------------------------------------------

def _exit_totals(d, comm):
    """Sum of the SDP_STATS_DIR files (libsdp(7)) the processes named comm
    wrote at exit into directory d."""
    tot, n = {}, 0
    for f in sorted(Path(d).glob(f"{comm}.*.json")):
        j = json.loads(f.read_text())
        n += 1
        for k, v in j.items():
            if isinstance(v, int) and k != "pid":
                tot[k] = tot.get(k, 0) + v
    assert n, f"no SDP_STATS_DIR file of {comm} in {d}: {sorted(os.listdir(d))}"
    return tot


def _assert_net(tot, who, conns, tx=0, rx=0):
    """The counters prove the ofi path: connections and bytes a network
    fabric carried, no connection left on TCP."""
    assert tot["net_conns"] >= conns and tot["tcp_conns"] == 0, f"{who}: {tot}"
    assert tot["net_tx_bytes"] >= tx and tot["net_rx_bytes"] >= rx, f"{who}: {tot}"


def _wait_fabric(ns, p, want, timeout=20, role=None):
    """`sdp stat --json` in namespace ns until `want` connections on port
    p (of that role, if given) show "fabric": "ofi:tcp" (bounded); returns
    them. (`sdp stat` lists every process of the machine: the client's end
    may show before the server has accepted.)"""
    end = time.monotonic() + timeout
    got = []
    while time.monotonic() < end:
        got = [c for c in _conns(_stat(ns), p) if c.get("fabric") == "ofi:tcp" and
               (role is None or c.get("role") == role)]
        if len(got) >= want:
            return got
        time.sleep(0.05)
    pytest.fail(f"`sdp stat` shows {len(got)} of {want} connections on port {p} over "
                f"ofi:tcp: {json.dumps(_conns(_stat(ns), p))[:2000]}")


def _wait_listen(ns, p, timeout=20):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        out = _run(["ip", "netns", "exec", ns, "ss", "-Hltn", f"sport = :{p}"]).stdout
        if out.strip():
            return
        time.sleep(0.05)
    pytest.fail(f"nothing listens on port {p} after {timeout} s")

def test_iperf3_across_hosts(hosts, tmp_path):
    if not shutil.which("iperf3"):
        pytest.skip("iperf3 not installed")
    p = port()
    sdir, cdir = tmp_path / "srv", tmp_path / "cli"
    sdir.mkdir()
    cdir.mkdir()
    srv = Bg(hosts.cmd(hosts.a, ["iperf3", "-s", "-1", "-B", SRV4, "-p", p]),
             _env(SDP_LOG=2, SDP_STATS_DIR=sdir))
    _wait_listen(hosts.a, p)
    res = subprocess.run(hosts.cmd(hosts.b, ["iperf3", "-c", SRV4, "-p", p, "-n", 64 << 20,
                                             "-l", 128 << 10, "-J"]),
                         env=_env(SDP_LOG=2, SDP_STATS_DIR=cdir), capture_output=True,
                         text=True, timeout=120)
    rep = json.loads(res.stdout)
    assert "error" not in rep, rep.get("error")
    sent = rep["end"]["sum_sent"]["bytes"]
    assert sent >= 64 << 20
    assert res.stderr.count("SDP over ofi:tcp") >= 2, res.stderr[-2000:]   # control + data
    rc, out, err = srv.finish()
    assert err.count("SDP over ofi:tcp") >= 2, err[-2000:]
    _assert_net(_exit_totals(cdir, "iperf3"), "iperf3 -c", 2, tx=64 << 20)
    _assert_net(_exit_totals(sdir, "iperf3"), "iperf3 -s", 2,
                rx=rep["end"]["sum_received"]["bytes"])


def test_redis_across_hosts(hosts, tmp_path):
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        pytest.skip("redis not installed")
    p = port()
    env = _env(SDP_LOG=2)
    sdir = tmp_path / "srv"
    sdir.mkdir()
    srv = Bg(hosts.cmd(hosts.a, ["redis-server", "--port", p, "--bind", SRV4, "--save", "",
                                 "--protected-mode", "no",
                                 "--appendonly", "no", "--dir", tmp_path]),
             _env(SDP_LOG=2, SDP_STATS_DIR=sdir))
    _wait_listen(hosts.a, p)
    # A client blocked in BLPOP holds its connection: `sdp stat` on the
    # server's host shows it over ofi:tcp, then a push releases it.
    blk = Bg(hosts.cmd(hosts.b, ["redis-cli", "-h", SRV4, "-p", p, "blpop", "q", "60"]), env)
    seen = _wait_fabric(hosts.a, p, 1, role="server")
    assert any(c["role"] == "server" for c in seen), json.dumps(seen)
    r = subprocess.run(hosts.cmd(hosts.b, ["redis-cli", "-h", SRV4, "-p", p, "rpush", "q", "x"]),
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "1", r.stdout + r.stderr[-2000:]
    rc, out, err = blk.finish()
    assert rc == 0 and out.split() == ["q", "x"], out + err[-2000:]
    value = os.urandom(3 << 20).hex()      # 6 MiB through the stream both ways
    r = subprocess.run(hosts.cmd(hosts.b, ["redis-cli", "-h", SRV4, "-p", p, "-x", "set", "k"]),
                       input=value, env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "OK", r.stdout + r.stderr[-2000:]
    assert "SDP over ofi:tcp" in r.stderr, r.stderr[-2000:]
    r = subprocess.run(hosts.cmd(hosts.b, ["redis-cli", "-h", SRV4, "-p", p, "get", "k"]),
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == value.strip()
    r = subprocess.run(hosts.cmd(hosts.b, ["redis-benchmark", "-h", SRV4, "-p", p, "-n", 2000,
                                           "-c", 8, "-t", "set,get", "-q"]),
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "requests per second" in r.stdout, r.stdout + r.stderr[-2000:]
    srv.p.terminate()
    rc, out, err = srv.finish()
    assert "SDP over ofi:tcp" in err, err[-2000:]
    # every client connection (cli, blpop, push, get, 8 benchmark clients)
    _assert_net(_exit_totals(sdir, "redis-server"), "redis-server", 12,
                tx=len(value), rx=len(value))


def test_redis_600_clients_across_hosts(hosts, tmp_path):
    """redis-benchmark with 600 clients over ofi (sdp bench's redis point):
    every request answered, every connection over the fabric. A server
    whose clients each wait for an answer keeps them all on the list of
    connections whose sends the fabric may hold (an injected answer not yet
    consumed); reading that whole list at every progress call with nothing
    of its own left redis nothing else to do: 6,000 requests did not end
    in 60 s (kernel TCP on this veth: about 5 s on a loaded 2-CPU host)."""
    if not shutil.which("redis-server") or not shutil.which("redis-benchmark"):
        pytest.skip("redis not installed")
    p = port()
    sdir = tmp_path / "srv"
    sdir.mkdir()
    srv = Bg(hosts.cmd(hosts.a, ["redis-server", "--port", p, "--bind", SRV4, "--save", "",
                                 "--protected-mode", "no", "--appendonly", "no",
                                 "--dir", tmp_path]), _env(SDP_LOG=1, SDP_STATS_DIR=sdir))
    _wait_listen(hosts.a, p)
    try:
        r = subprocess.run(hosts.cmd(hosts.b, ["redis-benchmark", "-h", SRV4, "-p", p,
                                               "-c", 600, "-n", 6000, "-d", 64,
                                               "-t", "set,get", "--csv"]),
                           env=_env(SDP_LOG=1), capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("redis-benchmark with 600 clients over ofi did not end in 90 s")
    tests = {ln.split(",")[0].strip('"') for ln in r.stdout.splitlines()}
    assert r.returncode == 0 and {"SET", "GET"} <= tests, r.stdout + r.stderr[-2000:]
    srv.p.terminate()
    srv.finish()
    _assert_net(_exit_totals(sdir, "redis-server"), "redis-server", 600)


def test_stress_across_hosts(hosts, tmp_path):
    p = port()
    cdir = tmp_path / "cli"
    cdir.mkdir()
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, STRESS, "server", p, "blocking"]),
             _env(SDP_LOG=2, STRESS_BIND=SRV4))
    _wait_listen(hosts.a, p)
    go = tmp_path / "go"
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, STRESS, "client", p, "blocking",
                                 8, 1 << 10, 8 << 20, 7, go]),
             _env(SDP_LOG=2, STRESS_HOST=SRV4, SDP_STATS_DIR=cdir))
    cli.wait_line("connected 8", timeout=60)
    # all 8 connections, both ends, over the fabric before a byte moves
    seen = _wait_fabric(hosts.a, p, 16)
    assert {c["role"] for c in seen} == {"client", "server"}, json.dumps(seen)[:2000]
    go.touch()
    rc, out, err = cli.finish(timeout=180)
    assert rc == 0, out[-3000:] + err[-3000:]
    assert "SDP over ofi:tcp" in err, err[-2000:]
    rep = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    tot = _exit_totals(cdir, "python3")
    _assert_net(tot, "stress client", 8)
    # every byte of the client went over the fabric
    assert tot["net_tx_bytes"] == tot["tx_bytes"] > 0, f"{tot} {rep}"
    assert tot["net_rx_bytes"] == tot["rx_bytes"] > 0, f"{tot} {rep}"
    srv.p.terminate()
    srv.finish()


NGINX_SIZES = {"1k": 1 << 10, "1m": 1 << 20, "16m": 16 << 20}


@pytest.mark.parametrize("sendfile", ["off", "on"])
def test_nginx_across_hosts(hosts, tmp_path, sendfile):
    """nginx (master + 2 workers) in one namespace, curl in the other, both
    under `sdp run`: files of random bytes downloaded whole (SHA-256), with
    sendfile off and on; curl's counters and nginx's log say ofi."""
    if not shutil.which("nginx") or not shutil.which("curl"):
        pytest.skip("nginx or curl not installed")
    import hashlib
    root = tmp_path / "www"
    root.mkdir()
    digests = {}
    for name, size in NGINX_SIZES.items():
        data = os.urandom(size)
        (root / f"{name}.bin").write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    p = port()
    pre = tmp_path / "nginx"
    (pre / "tmp").mkdir(parents=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    (pre / "nginx.conf").write_text(f"""{user}worker_processes 2;
daemon off;
master_process on;
pid {pre}/nginx.pid;
error_log stderr info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {pre}/tmp/body;
    proxy_temp_path {pre}/tmp/proxy;
    fastcgi_temp_path {pre}/tmp/fastcgi;
    uwsgi_temp_path {pre}/tmp/uwsgi;
    scgi_temp_path {pre}/tmp/scgi;
    default_type application/octet-stream;
    sendfile {sendfile};
    server {{ listen {SRV4}:{p}; root {root}; location / {{ }} }}
}}
""")
    srv = Bg(hosts.cmd(hosts.a, ["nginx", "-p", pre, "-c", pre / "nginx.conf",
                                 "-e", "stderr"]), _env(SDP_LOG=2))
    _wait_listen(hosts.a, p)
    for name, size in NGINX_SIZES.items():
        cdir = tmp_path / f"curl-{name}"
        cdir.mkdir()
        out = tmp_path / f"{name}.out"
        r = subprocess.run(hosts.cmd(hosts.b, ["curl", "-sS", "--fail", "--max-time", "45",
                                               "-o", out, "-w", "%{http_code} %{size_download}",
                                               f"http://{SRV4}:{p}/{name}.bin"]),
                           env=_env(SDP_LOG=2, SDP_STATS_DIR=cdir), capture_output=True,
                           text=True, timeout=60)
        assert r.stdout.split() == ["200", str(size)], r.stdout + r.stderr[-2000:]
        assert hashlib.sha256(out.read_bytes()).hexdigest() == digests[name], \
            f"{name}.bin: downloaded bytes differ (sendfile {sendfile})"
        assert "SDP over ofi:tcp" in r.stderr, r.stderr[-2000:]
        _assert_net(_exit_totals(cdir, "curl"), "curl", 1, tx=40, rx=size)
    srv.p.terminate()
    rc, sout, serr = srv.finish()
    assert serr.count("SDP over ofi:tcp") >= len(NGINX_SIZES), serr[-3000:]


# ---- many connections ----------------------------------------------------------------------

MANY = HERE / "many.py"


def test_many_connections(hosts, tmp_path):
    """600 connections across the namespaces, each served by one epoll loop
    per side (as redis serves its clients): every one carries 64 KiB each
    way, SHA-256 verified, all on ofi:tcp, in bounded time; then a
    ping-pong on one connection while the other 599 sit idle in the same
    epoll set: epoll reports none of them (a completion wakes only its own
    connection - with one completion queue per domain each completion
    made every connection's descriptor readable)."""
    n, rounds = 600, 300
    p = port()
    sdir, cdir = tmp_path / "srv", tmp_path / "cli"
    sdir.mkdir()
    cdir.mkdir()
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, MANY, "server", SRV4, p]),
             _env(SDP_LOG=1, SDP_STATS_DIR=sdir))
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, MANY, "client", SRV4, p, n, 64 << 10,
                                 rounds]), _env(SDP_LOG=1, SDP_STATS_DIR=cdir))
    rc, out, err = cli.finish(timeout=120)
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    assert lines, f"exit {rc}: {out[-2000:]}\n{err[-3000:]}"
    rep = json.loads(lines[-1])
    print(rep)
    assert rep.get("verified") == n, f"{rep}\n{err[-3000:]}"
    assert rep["idle_readable"] == 0, rep
    # at most one stale wake-up per idle connection, not one per round
    assert rep["idle_events"] <= n - 1, rep
    assert rc == 0, f"{rep}\n{err[-3000:]}"
    srv.p.terminate()
    srv.finish()
    tot = _exit_totals(cdir, "python3")
    _assert_net(tot, "many.py client", n, tx=n * (64 << 10) + rounds * 64,
                rx=n * (64 << 10) + rounds * 64)


# ---- sends the fabric holds while the sender sleeps elsewhere ------------------------------

HELD = HERE / "held.py"


def _cpu_s(pid):
    """utime + stime of a process, in seconds."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize("how", ["recv", "poll", "epoll", "poll-tcp", "epoll-tcp"])
def test_held_sends_pushed_while_asleep(hosts, tmp_path, how):
    """A client sends on connection A without blocking until it stops
    taking bytes, then sleeps on connection B only (blocking recv, poll,
    epoll_wait); the server reads all of A only then, and answers on B
    after checking A's SHA-256. Over the tcp provider (manual progress)
    bytes the kernel socket could not take wait in libfabric until the
    process calls it: the sleep on B must push them, as TCP's kernel does,
    else both ends wait for ever. While the server does not read A yet
    (recv case: it waits for a line on stdin) the client's sleep must not
    spin. "-tcp": B stays on plain TCP (policy), so the sleep calls the
    library for no SDP connection at all."""
    p = port()
    port()                              # B's: p + 1
    # 512 x 32 KiB in flight (16 MiB): far more than the kernel sockets
    # take while the server does not read (some 2-3 MiB across the veth).
    NSL = 512
    sdir, cdir = tmp_path / "srv", tmp_path / "cli"
    sdir.mkdir()
    cdir.mkdir()
    gate = "stdin" if how == "recv" else "go"
    conf = tmp_path / "sdp.conf"
    conf.write_text((f"use tcp * * *:{p + 1}\n" if how.endswith("-tcp") else "") +
                    "use sdp * * *:*\n")
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, HELD, "server", SRV4, p, gate]),
             _env(SDP_LOG=2, SDP_STATS_DIR=sdir, SDP_NSLOTS=NSL, SDP_CONFIG=conf),
             stdin=subprocess.PIPE)
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, HELD, "client", SRV4, p,
                                 how.split("-")[0]]),
             _env(SDP_LOG=2, SDP_STATS_DIR=cdir, SDP_NSLOTS=NSL, SDP_CONFIG=conf))
    cli.wait_line("waiting", timeout=60)
    srv.wait_line("go", timeout=30)
    if gate == "stdin":
        # A is not read: the client sleeps in recv on B with bytes held.
        pid = _python_pid(cli)
        c0, t0 = _cpu_s(pid), time.monotonic()
        select.select([], [], [], 2.0)
        c1, t1 = _cpu_s(pid), time.monotonic()
        used = (c1 - c0) / (t1 - t0)
        print(f"client CPU while its peer does not read: {used * 100:.2f}% of a CPU")
        assert used < 0.05, f"the client spins while asleep: {used * 100:.1f}% of a CPU"
        srv.p.stdin.write("read\n")
        srv.p.stdin.flush()
    rc, out, err = cli.finish(timeout=60, fail=False)
    print(out.strip())
    assert "answer ok" in out, \
        f"no answer on B in 60 s ({how}): A's bytes held by the fabric were not pushed " \
        f"while the client slept on B\nclient: {out}{err[-2000:]}\nserver: {srv.seen}"
    assert rc == 0, f"{out}\n{err[-2000:]}"
    rc, sout, serr = srv.finish()
    assert rc == 0 and "match" in sout, f"{sout}\n{serr[-2000:]}"
    assert "stopped True" in out, f"the client's socket took every byte: {out}"
    tot = _exit_totals(cdir, "python3")
    assert tot["net_conns"] >= 1 and tot["net_tx_bytes"] >= int(out.split()[3]), tot
    if not how.endswith("-tcp"):
        _assert_net(tot, "held.py client", 2)
    assert "SDP over ofi:tcp" in err and "SDP over ofi:tcp" in serr, \
        err[-2000:] + serr[-2000:]


# ---- the application's descriptor numbers ---------------------------------------------------

FDNUM = HERE / "fdnum.py"


def _fdnum_run(hosts, tmp_path, n, sdp):
    """fdnum.py server and client across the namespaces; their JSON lines
    and, under SDP, the client's SDP_STATS_DIR totals."""
    p = port()
    cdir = tmp_path / f"cli-{'sdp' if sdp else 'tcp'}"
    cdir.mkdir()
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, FDNUM, "server", SRV4, p, n], sdp=sdp),
             _env(SDP_LOG=1))
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, FDNUM, "client", SRV4, p, n], sdp=sdp),
             _env(SDP_LOG=1, SDP_STATS_DIR=cdir))
    rc, out, err = cli.finish(timeout=60)
    assert rc == 0, f"client ({'sdp' if sdp else 'tcp'}): {out}\n{err[-3000:]}"
    src, sout, serr = srv.finish(timeout=30)
    assert src == 0, f"server: {sout}\n{serr[-3000:]}"
    c = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    s = json.loads([ln for ln in sout.splitlines() if ln.startswith("{")][-1])
    return c, s, (_exit_totals(cdir, "python3") if sdp else None)


def test_descriptor_numbers_as_tcp(hosts, tmp_path):
    """The application's sockets get the numbers kernel TCP gives them,
    on both ends, although each connection over ofi holds descriptors of
    the library's and of libfabric's (its endpoint's socket, its completion
    queue's epoll and signal pair, our epoll and eventfd). Those live in
    the upper half of the descriptor space: kept among the application's,
    40 connections gave the client descriptors up to ~200 where TCP gives
    up to ~45, and wrk, whose event loop holds 3 x connections + 10
    descriptors, failed its connects (sdp bench datacenter over sdp-ofi)."""
    n = 40
    ct, st, _ = _fdnum_run(hosts, tmp_path, n, sdp=False)
    cs, ss, tot = _fdnum_run(hosts, tmp_path, n, sdp=True)
    _assert_net(tot, "fdnum.py client", n)
    assert cs["fds"] == ct["fds"], f"client: SDP {cs['fds']}\n TCP {ct['fds']}"
    assert ss["fds"] == st["fds"], f"server: SDP {ss['fds']}\n TCP {st['fds']}"


def test_wrk_across_hosts(hosts, tmp_path):
    """wrk (one thread, 150 keep-alive connections: its event loop takes
    descriptors below 460) against nginx across the namespaces, both under
    `sdp run`: no error of any kind, every connection over ofi."""
    if not shutil.which("nginx") or not shutil.which("wrk"):
        pytest.skip("nginx or wrk not installed")
    conns = 150
    root = tmp_path / "www"
    root.mkdir()
    (root / "f").write_bytes(os.urandom(1024))
    p = port()
    pre = tmp_path / "nginx"
    (pre / "tmp").mkdir(parents=True)
    user = "user root;\n" if os.geteuid() == 0 else ""
    (pre / "nginx.conf").write_text(f"""{user}worker_processes 1;
daemon off;
master_process on;
pid {pre}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {pre}/tmp/body;
    proxy_temp_path {pre}/tmp/proxy;
    fastcgi_temp_path {pre}/tmp/fastcgi;
    uwsgi_temp_path {pre}/tmp/uwsgi;
    scgi_temp_path {pre}/tmp/scgi;
    default_type application/octet-stream;
    server {{ listen {SRV4}:{p}; root {root}; location / {{ }} }}
}}
""")
    srv = Bg(hosts.cmd(hosts.a, ["nginx", "-p", pre, "-c", pre / "nginx.conf",
                                 "-e", "stderr"]), _env(SDP_LOG=1))
    _wait_listen(hosts.a, p)
    lua = tmp_path / "errs.lua"
    lua.write_text('done = function(s, l, r) local e = s.errors\n'
                   '  io.write(string.format("WRKERR %d %d %d %d %d %d\\n", s.requests, '
                   'e.connect, e.read, e.write, e.status, e.timeout)) end\n')
    cdir = tmp_path / "wrk"
    cdir.mkdir()
    r = subprocess.run(hosts.cmd(hosts.b, ["wrk", "-t", "1", "-c", conns, "-d", "1s",
                                           "--timeout", "10s", "-s", lua,
                                           f"http://{SRV4}:{p}/f"]),
                       env=_env(SDP_LOG=1, SDP_STATS_DIR=cdir), capture_output=True,
                       text=True, timeout=90)
    srv.p.terminate()
    srv.finish()
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("WRKERR ")]
    assert r.returncode == 0 and line, r.stdout + r.stderr[-3000:]
    req, *errs = (int(x) for x in line[0].split()[1:])
    kinds = dict(zip(("connect", "read", "write", "status", "timeout"), errs))
    assert req > 0 and not any(errs), f"{req} requests, errors {kinds}\n{r.stderr[-3000:]}"
    tot = _exit_totals(cdir, "wrk")
    _assert_net(tot, "wrk", conns)
    assert tot["sdp_conns"] >= conns, tot   # wrk connects once more first


ARMOUT = HERE / "armout.py"


def test_writable_arm_needs_no_peer(hosts, tmp_path):
    """An event loop that registers EPOLLOUT on a writable connection
    (nginx registers EPOLLIN | EPOLLOUT | EPOLLET on every one) arms it
    before each sleep. Writable already, the arm must not ask the peer for
    anything: it sent a wake-up each time, and once the peer's few wake-up
    buffers were full (the peer not calling the library) the next arm
    waited up to 100 ms for it - epoll_wait(0) took 100 ms (sdp bench
    datacenter over sdp-ofi: nginx and wrk waiting for each other's
    acknowledgements, 700 requests/s with 50 connections)."""
    p = port()
    env = _env(SDP_LOG=1)
    srv = Bg(hosts.cmd(hosts.a, [sys.executable, ARMOUT, "server", SRV4, p]), env,
             stdin=subprocess.PIPE)
    srv.wait_line("listening")
    cli = Bg(hosts.cmd(hosts.b, [sys.executable, ARMOUT, "client", SRV4, p, 40]),
             _env(SDP_LOG=1, SDP_STATS_DIR=tmp_path))
    srv.wait_line("echoed")
    rc, out, err = cli.finish(timeout=60)
    srv.p.stdin.write("done\n")
    srv.p.stdin.flush()
    srv.finish()
    assert rc == 0, out + err[-3000:]
    rep = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    _assert_net(_exit_totals(tmp_path, "python3"), "armout.py client", 1)
    # kernel TCP: none; before the fix: 36 of 40 (every call after the 4th)
    assert rep["slow"] <= 2, rep
