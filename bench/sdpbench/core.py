"""Shared types: the run context, one measurement (Sample) and the
Experiment interface."""
from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Ctx:
    root: str
    bindir: str
    mode: str = "full"            # full | quick | tiny
    reps: int = 5
    dur: float = 0.5              # seconds per micro-benchmark measurement
    app_dur: int = 3              # seconds per application benchmark run
    pin: bool = False
    cpus: list = field(default_factory=list)
    tmp: str = "/tmp"
    sdp_features: list | None = None
    sdp_host: dict | None = None        # `sdp check --json` host choices
    netns: object = None

    @property
    def perf(self) -> str:
        return os.path.join(self.bindir, "sdp-perf")

    @property
    def raw(self) -> str:
        return os.path.join(self.bindir, "sdp-rawbench")

    @property
    def sdp(self) -> str:
        return os.path.join(self.bindir, "sdp")

    @property
    def libsdp(self) -> str:
        return os.path.join(os.path.dirname(self.bindir), "lib", "libsdp.so")

    @property
    def appserver(self) -> str:
        return os.path.join(self.bindir, "sdp-appserver")


@dataclass
class Sample:
    """One measurement of one configuration at one parameter point."""
    ok: bool
    reason: str | None = None
    metrics: dict = field(default_factory=dict)
    cpu_client: float | None = None     # CPU-seconds per second, client side
    cpu_server: float | None = None     # CPU-seconds per second, server side
    bytes: float | None = None          # payload bytes moved in the interval
    seconds: float | None = None
    transport: str | None = None        # sdp | tcp | raw | sdp-preloaded | ...
    transport_ok: bool = True
    extra: dict = field(default_factory=dict)

    @property
    def cpu_total(self) -> float | None:
        if self.cpu_client is None and self.cpu_server is None:
            return None
        return (self.cpu_client or 0.0) + (self.cpu_server or 0.0)

    @property
    def cpu_per_gb(self) -> float | None:
        t = self.cpu_total
        if t is None or not self.bytes or not self.seconds:
            return None
        return t * self.seconds / (self.bytes / 1e9)


def fail(reason: str, **kw) -> Sample:
    return Sample(ok=False, reason=reason, **kw)


@dataclass
class Metric:
    name: str
    unit: str
    label: str
    better: str = "higher"        # higher | lower


class Experiment:
    name = ""
    title = ""
    reproduces = ""               # paper and figure
    description = ""
    kind = "micro"                # micro | app
    metrics: list[Metric] = []
    primary = ""
    raw_configs: tuple = ()       # raw-* configurations this experiment includes
    xparam = "size"
    panel_param: str | None = None
    series_param: str | None = None
    logx = True
    logy = False
    cpu_bars = None               # "total" | "server" | None: CPU bars under lines
    needs: tuple = ()             # executables the experiment needs

    def params(self, mode: str) -> list[dict]:
        raise NotImplementedError

    def reps_for(self, ctx: "Ctx") -> int:
        return ctx.reps

    def warmup_for(self, ctx: "Ctx") -> bool:
        return True

    def wants(self, cfg) -> bool:
        if cfg.kind == "raw":
            return cfg.name in self.raw_configs
        return True

    def unavailable_reason(self, ctx: "Ctx") -> str | None:
        """Why this experiment cannot run on this host at all, or None."""
        return None

    def skip_reason(self, cfg) -> str | None:
        """Why this experiment leaves out an available configuration (it
        would measure nothing another one does not), or None."""
        return None

    def est_run_s(self, ctx: "Ctx") -> float | None:
        """Seconds one run takes, start-up included, if not the default."""
        return None

    def missing_tools(self) -> list[str]:
        import shutil
        return [t for t in self.needs if not shutil.which(t)]

    def run(self, ctx: Ctx, cfg, p: dict) -> Sample:
        raise NotImplementedError

    def metric(self, name: str) -> Metric:
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(name)

    def describe(self) -> dict:
        return {"name": self.name, "title": self.title, "reproduces": self.reproduces,
                "description": self.description, "kind": self.kind, "primary": self.primary,
                "metrics": [{"name": m.name, "unit": m.unit, "label": m.label,
                             "better": m.better} for m in self.metrics]}


def fmt_size(n: int | float) -> str:
    n = int(n)
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def size_tick(n: int | float) -> str:
    n = int(n)
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10}K"
    return str(n)
