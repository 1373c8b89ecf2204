"""Two pairs of network namespaces joined by veth links, one with TSO, GSO
and GRO off and one with them on. The addresses 10.200.0.1 (server) and
10.200.0.2 (client) exist only inside these namespaces. On request
(local()) one more namespace whose loopback device also carries 10.200.1.1,
for servers that refuse 127.0.0.0/8. The namespaces are always deleted
again (atexit, signals, and any left over by an earlier run of this suite
that was killed)."""
from __future__ import annotations

import atexit
import os
import shutil
import subprocess

from .configs import NET_CLIENT, NET_LOCAL, NET_SERVER

PREFIX = "sdpb"


def _run(argv: list[str]) -> tuple[int, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 1, str(e)
    return p.returncode, (p.stderr or p.stdout).strip()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def stale_namespaces() -> list[str]:
    """Namespaces of this suite whose creating process is gone."""
    rc, _ = _run(["ip", "netns", "list"])
    if rc != 0:
        return []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    stale = []
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        if not name.startswith(PREFIX):
            continue
        rest = name[len(PREFIX):].split("-", 1)[0]
        if rest.isdigit() and not _pid_alive(int(rest)):
            stale.append(name)
    return stale


class Netns:
    def __init__(self):
        self.tag = f"{PREFIX}{os.getpid()}"
        self.created: list[str] = []
        self.ok: bool | None = None
        self.why: str | None = None
        self._registered = False
        self.local_name: str | None = None
        self.local_why: str | None = None

    def names(self, offload: bool) -> tuple[str, str]:
        k = "on" if offload else "off"
        return f"{self.tag}-{k}-s", f"{self.tag}-{k}-c"

    def _veth(self, offload: bool) -> tuple[str, str]:
        k = "n" if offload else "f"
        short = str(os.getpid())[-7:]
        return f"sb{short}{k}s", f"sb{short}{k}c"

    def status(self) -> tuple[bool, str | None]:
        if self.ok is None:
            self.setup()
        return bool(self.ok), self.why

    def setup(self) -> bool:
        for name in stale_namespaces():
            _run(["ip", "netns", "del", name])
        if os.geteuid() != 0:
            self.ok, self.why = False, "network namespaces need root"
            return False
        for tool in ("ip", "ethtool"):
            if not shutil.which(tool):
                self.ok, self.why = False, f"`{tool}` not installed"
                return False
        if not self._registered:
            atexit.register(self.teardown)
            self._registered = True
        for offload in (False, True):
            err = self._make_pair(offload)
            if err:
                self.teardown()
                self.ok, self.why = False, f"network namespaces not possible here: {err}"
                return False
        self.ok, self.why = True, None
        return True

    def _make_pair(self, offload: bool) -> str | None:
        srv, cli = self.names(offload)
        vs, vc = self._veth(offload)
        flag = "on" if offload else "off"
        steps = [
            ["ip", "netns", "add", srv],
            ["ip", "netns", "add", cli],
            ["ip", "link", "add", vs, "type", "veth", "peer", "name", vc],
            ["ip", "link", "set", vs, "netns", srv],
            ["ip", "link", "set", vc, "netns", cli],
            ["ip", "-n", srv, "addr", "add", f"{NET_SERVER}/24", "dev", vs],
            ["ip", "-n", cli, "addr", "add", f"{NET_CLIENT}/24", "dev", vc],
            ["ip", "-n", srv, "link", "set", "lo", "up"],
            ["ip", "-n", cli, "link", "set", "lo", "up"],
            ["ip", "-n", srv, "link", "set", vs, "up"],
            ["ip", "-n", cli, "link", "set", vc, "up"],
        ]
        for st in steps:
            rc, msg = _run(st)
            if rc != 0:
                if st[:3] == ["ip", "link", "add"]:
                    pass
                return f"`{' '.join(st)}`: {msg}"
            if st[:3] == ["ip", "netns", "add"]:
                self.created.append(st[3])
        for ns, dev in ((srv, vs), (cli, vc)):
            rc, msg = _run(["ip", "netns", "exec", ns, "ethtool", "-K", dev,
                            "tso", flag, "gso", flag, "gro", flag])
            if rc != 0:
                return f"ethtool -K {dev} ... {flag}: {msg}"
        return None

    def local(self) -> tuple[str | None, str | None]:
        """(name, None) of a namespace with lo up and NET_LOCAL on lo, made
        on first use, or (None, why not). Traffic to NET_LOCAL there is
        loopback traffic like 127.0.0.1's."""
        if self.local_name or self.local_why:
            return self.local_name, self.local_why
        for name in stale_namespaces():
            _run(["ip", "netns", "del", name])
        if os.geteuid() != 0:
            self.local_why = "network namespaces need root"
            return None, self.local_why
        if not shutil.which("ip"):
            self.local_why = "`ip` not installed"
            return None, self.local_why
        if not self._registered:
            atexit.register(self.teardown)
            self._registered = True
        name = f"{self.tag}-lo"
        for st in (["ip", "netns", "add", name],
                   ["ip", "-n", name, "link", "set", "lo", "up"],
                   ["ip", "-n", name, "addr", "add", f"{NET_LOCAL}/32", "dev", "lo"]):
            rc, msg = _run(st)
            if rc != 0:
                self.local_why = f"network namespaces not possible here: `{' '.join(st)}`: {msg}"
                if name in self.created:
                    _run(["ip", "netns", "del", name])
                    self.created.remove(name)
                return None, self.local_why
            if st[:3] == ["ip", "netns", "add"]:
                self.created.append(name)
        self.local_name = name
        return name, None

    def offload_state(self, offload: bool) -> dict:
        srv, _ = self.names(offload)
        vs, _ = self._veth(offload)
        rc, _ = _run(["true"])
        try:
            out = subprocess.run(["ip", "netns", "exec", srv, "ethtool", "-k", vs],
                                 capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.TimeoutExpired):
            return {}
        state = {}
        for line in out.splitlines():
            for key in ("tcp-segmentation-offload", "generic-segmentation-offload",
                        "generic-receive-offload"):
                if line.strip().startswith(key + ":"):
                    state[key] = line.split(":", 1)[1].strip()
        return state

    def teardown(self) -> None:
        for ns in reversed(self.created):
            _run(["ip", "netns", "del", ns])
        self.created = []
        self.local_name = self.local_why = None
        if self.ok:
            self.ok = None
