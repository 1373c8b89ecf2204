"""Starting, watching and stopping the processes of one measurement.

Every process is started in a session of its own, so that stopping it
reaches exactly the processes this suite started (the program and whatever
it forked), and nothing else on the machine."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

from . import cpu as cpumod


class Proc:
    """A background process whose stdout/stderr lines are collected."""

    def __init__(self, argv: list[str], env: dict | None = None, cwd: str | None = None,
                 name: str = ""):
        self.argv = argv
        self.name = name or os.path.basename(argv[0])
        self.lines: list[str] = []
        self.err_lines: list[str] = []
        self._cv = threading.Condition()
        self._eofs = 0
        self.p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, cwd=cwd,
                                  start_new_session=True, text=True, errors="replace")
        self.pid = self.p.pid
        self._threads = [threading.Thread(target=self._pump, args=(self.p.stdout, self.lines), daemon=True),
                         threading.Thread(target=self._pump, args=(self.p.stderr, self.err_lines), daemon=True)]
        for t in self._threads:
            t.start()

    def _pump(self, fh, sink: list[str]) -> None:
        for line in fh:
            with self._cv:
                sink.append(line.rstrip("\n"))
                self._cv.notify_all()
        with self._cv:
            self._eofs += 1
            self._cv.notify_all()

    def running(self) -> bool:
        return self.p.poll() is None

    def wait_for(self, pred, timeout: float) -> str | None:
        """First stdout or stderr line for which pred(line) is true."""
        end = time.monotonic() + timeout
        idx_o = idx_e = 0
        with self._cv:
            while True:
                while idx_o < len(self.lines):
                    line = self.lines[idx_o]
                    idx_o += 1
                    if pred(line):
                        return line
                while idx_e < len(self.err_lines):
                    line = self.err_lines[idx_e]
                    idx_e += 1
                    if pred(line):
                        return line
                left = end - time.monotonic()
                # finished: both pipes at EOF (the process and its children
                # closed them) and every line looked at
                if left <= 0 or (self._eofs >= 2 and idx_o >= len(self.lines)
                                 and idx_e >= len(self.err_lines)):
                    return None
                self._cv.wait(min(left, 0.05))

    def wait_json(self, pred, timeout: float) -> dict | None:
        def ok(line: str) -> bool:
            j = parse_json_line(line)
            return j is not None and pred(j)
        line = self.wait_for(ok, timeout)
        return parse_json_line(line) if line else None

    def wait(self, timeout: float) -> int | None:
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 3.0) -> int:
        """SIGTERM to the process group this process leads, then SIGKILL."""
        if self.p.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait(5)
        else:
            # the leader is gone; its group may still hold forked children
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for t in self._threads:
            t.join(1.0)
        return self.p.returncode

    def stdout(self) -> str:
        with self._cv:
            return "\n".join(self.lines)

    def stderr(self) -> str:
        with self._cv:
            return "\n".join(self.err_lines)


def parse_json_line(line: str | None) -> dict | None:
    if not line:
        return None
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        v = json.loads(line)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def last_json(text: str, pred=None) -> dict | None:
    for line in reversed(text.splitlines()):
        j = parse_json_line(line)
        if j is not None and (pred is None or pred(j)):
            return j
    return None


class ClientResult:
    def __init__(self, rc, stdout, stderr, cpu, wall, timed_out):
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.cpu = cpu          # CPU seconds of the client and its children
        self.wall = wall
        self.timed_out = timed_out


def run_client(argv: list[str], env: dict | None, timeout: float, cwd: str | None = None,
               stdin_text: str | None = None) -> ClientResult:
    """Run a foreground program to completion (bounded by timeout) and
    account its CPU through RUSAGE_CHILDREN."""
    c0 = cpumod.children_cpu()
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=cwd,
                         start_new_session=True, text=True, errors="replace")
    timed_out = False
    try:
        out, err = p.communicate(stdin_text, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = p.communicate()
    wall = time.monotonic() - t0
    return ClientResult(p.returncode, out, err, cpumod.children_cpu() - c0, wall, timed_out)


def wait_listening(pid: int, port: int, timeout: float) -> bool:
    """True once a TCP socket of the network namespace of pid listens on
    port (read from /proc/<pid>/net/tcp, which is per namespace)."""
    end = time.monotonic() + timeout
    hexport = f"{port:04X}"
    while time.monotonic() < end:
        for f in ("tcp", "tcp6"):
            try:
                with open(f"/proc/{pid}/net/{f}") as fh:
                    next(fh, None)
                    for line in fh:
                        parts = line.split()
                        if len(parts) > 3 and parts[3] == "0A" and parts[1].endswith(":" + hexport):
                            return True
            except OSError:
                pass
        time.sleep(0.02)
    return False


def free_port() -> int:
    """A port that is free on this host's loopback right now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
