"""The configurations every experiment is run under, and what makes each
one available or not on this machine."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field

NET_SERVER = "10.200.0.1"
NET_CLIENT = "10.200.0.2"
# On the loopback device of a namespace of its own (Netns.local()), for
# programs that refuse 127.0.0.0/8 (MooseFS chunk servers): still loopback.
NET_LOCAL = "10.200.1.1"


@dataclass
class Config:
    name: str
    kind: str                     # tcp | veth | sdp | raw
    description: str
    feature: str | None = None    # feature `sdp check --json` must list
    env: dict = field(default_factory=dict)
    unset: tuple = ()
    available: bool = True
    reason: str | None = None
    server_ns: str | None = None
    client_ns: str | None = None
    server_addr: str = "127.0.0.1"
    offload: bool | None = None

    @property
    def is_socket(self) -> bool:
        return self.kind != "raw"

    def environ(self) -> dict:
        e = dict(os.environ)
        for k in ("SDP_ZCOPY_THRESH", "SDP_AZCOPY") + tuple(self.unset):
            e.pop(k, None)
        if "libsdp" in e.get("LD_PRELOAD", ""):
            # only `sdp run` decides whether a program runs over SDP
            e["LD_PRELOAD"] = " ".join(x for x in e["LD_PRELOAD"].replace(":", " ").split()
                                       if "libsdp" not in x)
            if not e["LD_PRELOAD"]:
                del e["LD_PRELOAD"]
        e.update(self.env)
        return e

    def wrap(self, argv: list[str], role: str, ctx) -> list[str]:
        cmd = list(argv)
        if self.kind == "sdp":
            cmd = [str(ctx.sdp), "run", "--"] + cmd
        ns = self.server_ns if role == "server" else self.client_ns
        if ns:
            cmd = ["ip", "netns", "exec", ns] + cmd
        if ctx.pin and ctx.cpus:
            cpu = ctx.cpus[0] if role == "server" else ctx.cpus[-1]
            cmd = ["taskset", "-c", str(cpu)] + cmd
        return cmd

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "description": self.description,
                "feature": self.feature, "env": self.env, "available": self.available,
                "reason": self.reason, "server_addr": self.server_addr,
                "offload": self.offload}


def all_configs() -> list[Config]:
    return [
        Config("tcp", "tcp", "kernel TCP over loopback"),
        Config("tcp-veth-nooffload", "veth",
               "kernel TCP across a veth pair between two network namespaces, TSO/GSO/GRO off",
               server_addr=NET_SERVER, offload=False),
        Config("tcp-veth-offload", "veth",
               "kernel TCP across a veth pair between two network namespaces, TSO/GSO/GRO on",
               server_addr=NET_SERVER, offload=True),
        Config("sdp-bcopy", "sdp", "SDP, Buffer Copy only (SDP_ZCOPY_THRESH=0)",
               feature="bcopy", env={"SDP_ZCOPY_THRESH": "0"}),
        Config("sdp-zcopy", "sdp", "SDP, zero copy above the default threshold",
               feature="zcopy"),
        Config("sdp-zcopy-all", "sdp", "SDP, zero copy for every send (SDP_ZCOPY_THRESH=1)",
               feature="zcopy", env={"SDP_ZCOPY_THRESH": "1"}),
        Config("sdp-azcopy", "sdp", "SDP, asynchronous zero copy (SDP_AZCOPY=1)",
               feature="azcopy", env={"SDP_AZCOPY": "1"}),
        # Between hosts: the two namespaces of tcp-veth-offload, SDP over
        # the ofi provider. libfabric's tcp provider runs over kernel TCP
        # on that veth: it cannot beat tcp-veth-offload, only approach it.
        Config("sdp-ofi", "sdp",
               "SDP between two network namespaces (the veth pair of tcp-veth-offload) over "
               "the ofi provider on libfabric's tcp provider, itself kernel TCP",
               feature="bcopy", server_addr=NET_SERVER, offload=True),
        Config("raw-cma", "raw", "process_vm_readv between two processes, no socket layer"),
        Config("raw-shm", "raw", "shared-memory ring between two processes, no socket layer"),
    ]


def sdp_check(sdp: str, timeout: float = 60.0) -> tuple[dict | None, str | None]:
    """The document `sdp check --json` prints, or (None, why not)."""
    if not os.path.exists(sdp):
        return None, f"{sdp} not built"
    try:
        p = subprocess.run([sdp, "check", "--json"], capture_output=True, text=True,
                           timeout=timeout, errors="replace")
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"`sdp check --json` failed: {e}"
    for text in [ln.strip() for ln in reversed(p.stdout.splitlines())] + [p.stdout]:
        if not text.startswith("{"):
            continue
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        if isinstance(doc, dict) and isinstance(doc.get("features"), list):
            return doc, None
    msg = (p.stderr or p.stdout).strip().splitlines()
    return None, ("`sdp check --json` gave no feature list (exit %d%s)"
                  % (p.returncode, ": " + msg[-1][:160] if msg else ""))


def sdp_features(sdp: str, timeout: float = 60.0) -> tuple[list[str] | None, str | None]:
    """Features reported by `sdp check --json`, or (None, why not)."""
    doc, why = sdp_check(sdp, timeout)
    if doc is None:
        return None, why
    return [str(f) for f in doc["features"]], None


def resolve(configs: list[Config], ctx, netns) -> None:
    """Mark each configuration available or not, with the reason."""
    doc, why = sdp_check(str(ctx.sdp))
    feats = [str(f) for f in doc["features"]] if doc else None
    ctx.sdp_features = feats
    # What the library chose for this host (copy routine, zero-copy
    # threshold, page-aliased zero copy), shown in every report.
    ctx.sdp_host = doc.get("host") if doc else None
    az = ((doc or {}).get("checks") or {}).get("async_zero_copy")
    if ctx.sdp_host is not None and az:
        # how Asynchronous Zero Copy would protect pages here, measured
        ctx.sdp_host = dict(ctx.sdp_host, azcopy=az)
    for c in configs:
        if c.kind in ("tcp", "veth", "sdp") and not os.path.exists(ctx.perf):
            c.available, c.reason = False, f"{ctx.perf} not built"
            continue
        if c.kind == "sdp":
            if feats is None:
                c.available, c.reason = False, why
            elif not os.path.exists(ctx.libsdp):
                c.available, c.reason = False, f"{ctx.libsdp} not built"
            elif c.feature not in feats:
                c.available, c.reason = False, (f"feature '{c.feature}' not reported by "
                                                f"`sdp check` (features: {', '.join(feats) or 'none'})")
            elif c.offload is not None:
                # across namespaces: they and a libfabric provider must be there
                provs = (doc.get("ofi") or {}).get("providers") or []
                ok, why_ns = netns.status()
                if not any(pv.get("usable") for pv in provs):
                    c.available, c.reason = False, "no usable libfabric provider (sdp check)"
                elif not ok:
                    c.available, c.reason = False, why_ns
                else:
                    c.server_ns, c.client_ns = netns.names(c.offload)
        elif c.kind == "veth":
            ok, why_ns = netns.status()
            if not ok:
                c.available, c.reason = False, why_ns
            else:
                srv, cli = netns.names(c.offload)
                c.server_ns, c.client_ns = srv, cli
        elif c.kind == "raw":
            if not os.path.exists(ctx.raw):
                c.available, c.reason = False, f"{ctx.raw} not built"
        if ctx.pin and c.available and not shutil.which("taskset"):
            c.available, c.reason = False, "--pin needs taskset"
