"""The parallel file system experiment's own checks, without MooseFS: the
client program's byte check (it must catch a changed, missing or extra
byte) and the verdict on the transport (SDP rows valid only when every
daemon connection was SDP and the bytes travelled). The experiment itself
runs in test_bench_quick.py (test_pfs_rows)."""
import copy
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "bench"))

from sdpbench import pfs  # noqa: E402

WORKER = os.path.join(REPO, "bench", "sdpbench", "pfs_worker.py")
SIZE = 3 * 1024 * 1024 + 12345


def _worker(d, client=1):
    return subprocess.Popen([sys.executable, WORKER, "--dir", str(d), "--client", str(client),
                             "--size", str(SIZE), "--files", "5", "--nonce", "77"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _ask(p, cmd):
    p.stdin.write(cmd + "\n")
    p.stdin.flush()
    return json.loads(p.stdout.readline())


def _roundtrip(tmp_path, damage=None):
    p = _worker(tmp_path)
    try:
        assert json.loads(p.stdout.readline())["phase"] == "started"
        prep = _ask(p, "prepare")
        w = _ask(p, "write")
        assert w["bytes"] == SIZE and w["sha256"] == prep["sha256"]
        if damage:
            damage(tmp_path / "client1.dat")
        _ask(p, "poison")
        r = _ask(p, "read")
        v = _ask(p, "verify")
        c = _ask(p, "create")
        s = _ask(p, "stat")
        assert c["files"] == 5 and s["ok"]
        assert len(os.listdir(tmp_path / "small1")) == 5
        return r, v
    finally:
        p.stdin.close()
        p.wait(10)


def test_worker_roundtrip(tmp_path):
    r, v = _roundtrip(tmp_path)
    assert r["bytes"] == SIZE and v["ok"] and v["sha256"] == v["sha256_written"]


def _flip(path):
    with open(path, "r+b") as fh:
        fh.seek(2 * 1024 * 1024 + 7)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 1]))


def _truncate(path):
    os.truncate(path, SIZE - 1)


def _append(path):
    with open(path, "ab") as fh:
        fh.write(b"x")


@pytest.mark.parametrize("damage", [_flip, _truncate, _append])
def test_worker_catches_damage(tmp_path, damage):
    r, v = _roundtrip(tmp_path, damage)
    assert not v["ok"]


def test_files_differ_per_client():
    from sdpbench import pfs_worker
    a = pfs_worker.build(SIZE, 0, 77)
    b = pfs_worker.build(SIZE, 1, 77)
    assert len(a) == len(b) == SIZE and a != b


DAEMONS = [10, 20, 30]
LOADED = {"master:10": True, "chunkserver:20": True, "mfsmount:30": True}
PROCS = {10: {"sdp_conns": 2, "tcp_conns": 0}, 20: {"sdp_conns": 2, "tcp_conns": 0},
         30: {"sdp_conns": 2, "tcp_conns": 0}}


def _c(pid, local, remote, transport="sdp"):
    return {"pid": pid, "local": local, "remote": remote, "transport": transport}


CONNS = [_c(10, "a:9420", "a:5000"), _c(20, "a:5000", "a:9420"),
         _c(10, "a:9421", "a:5001"), _c(30, "a:5001", "a:9421"),
         _c(20, "a:9422", "a:5002"), _c(30, "a:5002", "a:9422"),
         _c(99, "a:1", "a:2", "tcp")]          # not one of ours


def test_verdict_sdp_ok():
    t, ok, why, info = pfs.transport_verdict(True, LOADED, PROCS, DAEMONS, CONNS, 1.0, 1.0)
    assert (t, ok, why) == ("sdp", True, None)
    assert info["connections"] == {"chunkserver-master": {"sdp": 1, "tcp": 0},
                                   "client-master": {"sdp": 1, "tcp": 0},
                                   "client-chunkserver": {"sdp": 1, "tcp": 0}}


def test_verdict_sdp_failures():
    procs = copy.deepcopy(PROCS)
    procs[30]["tcp_conns"] = 1
    assert not pfs.transport_verdict(True, LOADED, procs, DAEMONS, CONNS, 1.0, 1.0)[1]
    assert not pfs.transport_verdict(True, dict(LOADED, **{"mfsmount:30": False}), PROCS,
                                     DAEMONS, CONNS, 1.0, 1.0)[1]
    live_tcp = CONNS[:4] + [_c(20, "a:9422", "a:5002", "tcp"), _c(30, "a:5002", "a:9422", "tcp")]
    assert not pfs.transport_verdict(True, LOADED, PROCS, DAEMONS, live_tcp, 1.0, 1.0)[1]
    no_data_conn = CONNS[:4]
    assert not pfs.transport_verdict(True, LOADED, PROCS, DAEMONS, no_data_conn, 1.0, 1.0)[1]
    assert not pfs.transport_verdict(True, LOADED, PROCS, DAEMONS, CONNS, 0.5, 1.0)[1]


def test_verdict_tcp():
    off = {k: False for k in LOADED}
    assert pfs.transport_verdict(False, off, {}, DAEMONS, [], 1.0, 1.0)[:2] == ("tcp", True)
    assert not pfs.transport_verdict(False, LOADED, {}, DAEMONS, [], 1.0, 1.0)[1]
    assert not pfs.transport_verdict(False, off, {}, DAEMONS, [], 1.0, 0.9)[1]


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_cleanup_stale(tmp_path):
    """A cluster left by a killed run (its storage tmpfs names a dead pid):
    its processes are killed, its mounts and files removed; a cluster of a
    live run is left alone."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    bases = {}
    for name, pid in (("dead", dead.pid), ("live", os.getpid())):
        base = tmp_path / name
        store = base / "store"
        store.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m",
                        f"{pfs.STORE_TAG}{pid}", str(store)], check=True)
        (base / "etc").mkdir()
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                              str(base / "etc" / "daemon.cfg")],
                             start_new_session=True)
        bases[name] = (base, store, p)
    try:
        cleaned = pfs.cleanup_stale()
        base, store, p = bases["dead"]
        assert str(base) in cleaned
        assert p.wait(10) == -9
        assert not pfs.mounted(str(store)) and not base.exists()
        base, store, p = bases["live"]
        assert str(base) not in cleaned
        assert p.poll() is None and pfs.mounted(str(store))
    finally:
        for base, store, p in bases.values():
            p.kill()
            p.wait()
            if pfs.mounted(str(store)):
                subprocess.run(["umount", "-l", str(store)])
