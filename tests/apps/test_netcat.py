"""netcat-openbsd under `sdp run`: `nc -l` sets SO_REUSEPORT on its
listening socket, so before SO_REUSEPORT groups were supported every netcat
connection stayed on TCP.

A file of random bytes goes through `nc -N` (client) to `nc -l` (server)
and back the other way; the bytes are compared by SHA-256 and both ends
must have used SDP (their SDP_STATS_DIR counters: one SDP connection each,
no TCP connection, the file's bytes)."""

import hashlib
import os

import pytest

SIZE = 8 << 20


def _nc_pair(sdp, procs, kit, tmp_path, tag, server_sends):
    """One transfer: the server (nc -l) receives (or sends) SIZE bytes."""
    kit.require_bins("nc")
    data = os.urandom(SIZE)
    src = tmp_path / f"{tag}-src.bin"
    dst = tmp_path / f"{tag}-dst.bin"
    src.write_bytes(data)
    port = kit.free_port()
    srv_stats = sdp.new_stats_dir(f"nc-l-{tag}")
    cl_stats = sdp.new_stats_dir(f"nc-{tag}")
    if server_sends:
        srv_argv = ["nc", "-N", "-l", "127.0.0.1", str(port)]
        srv = procs.start(sdp.wrap(srv_argv), name=f"nc-l-{tag}", env=sdp.env(srv_stats),
                          stdin=open(src, "rb"))
    else:
        srv_argv = ["sh", "-c", f'exec nc -l 127.0.0.1 {port} > "{dst}"']
        srv = procs.start(sdp.wrap(srv_argv), name=f"nc-l-{tag}", env=sdp.env(srv_stats))
    _wait_listen(port, srv)
    if server_sends:
        res = kit.run_cmd(sdp.wrap(["sh", "-c", f'exec nc -d 127.0.0.1 {port} > "{dst}"']),
                          timeout=60, env=sdp.env(cl_stats))
    else:
        res = kit.run_cmd(sdp.wrap(["nc", "-N", "127.0.0.1", str(port)]), timeout=60,
                          env=sdp.env(cl_stats), input=data)
    assert res.returncode == 0, res.describe()
    rc = srv.wait(30)
    assert rc == 0, f"nc -l exited with {rc}\n{srv.log_tail()}"
    got = dst.read_bytes()
    assert len(got) == SIZE, f"{tag}: {len(got)} bytes arrived of {SIZE}"
    assert hashlib.sha256(got).hexdigest() == hashlib.sha256(data).hexdigest(), \
        f"{tag}: the bytes that arrived differ from those sent"
    if not sdp.enabled:
        return
    s = sdp.client_stats(srv_stats, "nc")
    c = sdp.client_stats(cl_stats, "nc")
    assert s["sdp_conns"] == 1 and s["tcp_conns"] == 0, f"nc -l: {s}"
    assert c["sdp_conns"] == 1 and c["tcp_conns"] == 0, f"nc: {c}"
    recv, sent = (c, s) if server_sends else (s, c)
    kit.assert_bytes_between("receiving nc's SDP rx_bytes", recv["rx_bytes"], SIZE, SIZE)
    kit.assert_bytes_between("sending nc's SDP tx_bytes", sent["tx_bytes"], SIZE, SIZE)


def _wait_listen(port, proc):
    """Wait until something listens on port without connecting to it (a
    probe connection would be the one connection nc -l serves)."""
    import time
    deadline = time.monotonic() + 20
    needle = f"{port:04X}"
    while time.monotonic() < deadline:
        for tbl in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = open(tbl).read().splitlines()[1:]
            except OSError:
                continue
            for ln in lines:
                f = ln.split()
                if f[1].endswith(":" + needle) and f[3] == "0A":
                    return
        if proc.poll() is not None:
            pytest.fail(f"nc -l exited early\n{proc.log_tail()}", pytrace=False)
        time.sleep(0.02)
    pytest.fail(f"nc -l did not listen on port {port}\n{proc.log_tail()}", pytrace=False)


def test_netcat_to_listener(sdp, procs, kit, tmp_path):
    _nc_pair(sdp, procs, kit, tmp_path, "up", server_sends=False)


def test_netcat_from_listener(sdp, procs, kit, tmp_path):
    _nc_pair(sdp, procs, kit, tmp_path, "down", server_sends=True)
