#!/usr/bin/env python3
"""Buffer Copy with plain and with streaming stores, as the host's state
changes (ARCHITECTURE.md section 5, "Streaming stores when the reader is
far").

Each round reads what `sdp check --json` measures between two CPUs at that
moment (plain and streaming end-to-end GB/s), then runs one 64 KiB stream
(`sdp-perf`) and nginx serving a 16 KiB file to wrk (10 connections, as
`sdp bench`'s nginx experiment) under SDP_COPY_STREAM=auto, off and on,
and kernel TCP, interleaved. On a VM whose vCPUs the host moves between
caches, rounds fall in both states; the table shows each configuration in
each.

    bench/stream_state.py [--rounds N] [--secs S]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "build", "bin")
SDP = os.path.join(BIN, "sdp")
PERF = os.path.join(BIN, "sdp-perf")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from sdpbench.apps import _nginx_conf  # noqa: E402
from sdpbench.procs import free_port  # noqa: E402


def wait_port(port, secs=10):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            time.sleep(0.02)
    return False


def env_for(mode):
    e = dict(os.environ)
    e.pop("SDP_COPY_STREAM", None)
    if mode not in ("tcp", "auto"):
        e["SDP_COPY_STREAM"] = mode
    return e


def wrap(mode, argv):
    return argv if mode == "tcp" else [SDP, "run", "--"] + argv


def state():
    out = subprocess.run([SDP, "check", "--json"], capture_output=True, text=True).stdout
    st = json.loads(out)["host"]["copy"].get("stream", {})
    return st.get("plain_gbps"), st.get("stream_gbps")


def stream(mode, secs):
    port = free_port()
    srv = subprocess.Popen(wrap(mode, [PERF, "server", "--port", str(port), "--timeout", "60"]),
                           env=env_for(mode), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        out = subprocess.run(wrap(mode, [PERF, "stream", "--host", "127.0.0.1", "--port",
                                         str(port), "--size", "65536", "--time", str(secs)]),
                             env=env_for(mode), capture_output=True, text=True).stdout
        j = json.loads(out.strip().splitlines()[-1])
        st = j.get("sdp_stats") or {}
        share = (st.get("tx_stream_bytes", 0) / st["tx_bcopy_bytes"]
                 if st.get("tx_bcopy_bytes") else None)
        return j["gbps"], share
    finally:
        srv.kill()
        srv.wait()


def nginx(mode, secs, tmp):
    port = free_port()
    run = os.path.join(tmp, f"ng-{mode}-{port}")
    os.makedirs(run)
    conf = _nginx_conf(run, f"127.0.0.1:{port}", "").replace(
        "LOCATIONS", f"location / {{ root {tmp}; }}")
    with open(os.path.join(run, "nginx.conf"), "w") as fh:
        fh.write(conf)
    srv = subprocess.Popen(wrap(mode, ["nginx", "-c", os.path.join(run, "nginx.conf"), "-p", run,
                                       "-e", os.path.join(run, "error.log")]),
                           env=env_for(mode), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_port(port)
        out = subprocess.run(wrap(mode, ["wrk", "-t1", "-c10", f"-d{secs}s",
                                         f"http://127.0.0.1:{port}/f16384"]),
                             env=env_for(mode), capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Requests/sec:"):
                return float(line.split()[1])
        return None
    finally:
        srv.terminate()
        srv.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--secs", type=int, default=2)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "f16384"), "wb") as fh:
            fh.write(bytes((i * 7) & 0xFF for i in range(16384)))
        print("| round | between CPUs: plain / streaming GB/s | stream 64 KiB Gbit/s: "
              "TCP / auto (share streamed) / off / on | nginx 16 KiB req/s: TCP / auto / off / on |")
        print("|---|---|---|---|")
        for r in range(a.rounds):
            pl, sm = state()
            s = {m: stream(m, a.secs) for m in ("tcp", "auto", "off", "on")}
            n = {m: nginx(m, a.secs, tmp) for m in ("tcp", "auto", "off", "on")}
            sh = s["auto"][1]
            print(f"| {r + 1} | {pl:.1f} / {sm:.1f} | {s['tcp'][0]:.1f} / {s['auto'][0]:.1f} "
                  f"({'-' if sh is None else f'{sh * 100:.0f} %'}) / {s['off'][0]:.1f} / "
                  f"{s['on'][0]:.1f} | " + " / ".join(f"{n[m]:,.0f}" if n[m] else "-"
                                                     for m in ("tcp", "auto", "off", "on")) + " |",
                  flush=True)


if __name__ == "__main__":
    main()
