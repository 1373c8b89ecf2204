"""A small validator for results.json (the schema is documented in
docs/BENCHMARKS.md). Returns a list of problems; empty means valid."""
from __future__ import annotations

from . import SCHEMA_VERSION

NUM = (int, float)
STAT_KEYS = ("median", "min", "max", "n")
CPU_KEYS = ("client_s_per_s", "server_s_per_s", "total_s_per_s", "s_per_gb")


def _type(errs, where, v, types, nullable=False):
    if v is None and nullable:
        return True
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        errs.append(f"{where}: expected {types}, got bool")
        return False
    if not isinstance(v, types):
        errs.append(f"{where}: expected {getattr(types, '__name__', types)}, got {type(v).__name__}")
        return False
    return True


def _stat(errs, where, st, need_unit=False):
    if not _type(errs, where, st, dict):
        return
    for k in STAT_KEYS:
        if k not in st:
            errs.append(f"{where}: missing '{k}'")
        elif not isinstance(st[k], NUM) or isinstance(st[k], bool):
            errs.append(f"{where}.{k}: not a number")
    if all(isinstance(st.get(k), NUM) for k in ("median", "min", "max")):
        if not st["min"] <= st["median"] <= st["max"]:
            errs.append(f"{where}: min <= median <= max does not hold")
    if need_unit and not isinstance(st.get("unit"), str):
        errs.append(f"{where}: missing unit")


def validate(doc) -> list[str]:
    errs: list[str] = []
    if not _type(errs, "$", doc, dict):
        return errs
    if doc.get("schema") != SCHEMA_VERSION:
        errs.append(f"$.schema: expected {SCHEMA_VERSION!r}")
    for k, t in (("created", str), ("command", str), ("options", dict), ("machine", dict),
                 ("configs", list), ("experiments", list), ("rows", list), ("derived", dict),
                 ("duration_s", NUM)):
        if k not in doc:
            errs.append(f"$: missing '{k}'")
        else:
            _type(errs, f"$.{k}", doc[k], t)
    if errs:
        return errs
    m = doc["machine"]
    for k in ("hostname", "cpu_model", "cores", "kernel", "date"):
        if k not in m:
            errs.append(f"$.machine: missing '{k}'")
    opts = doc["options"]
    for k, t in (("quick", bool), ("pin", bool), ("reps", int)):
        if k not in opts:
            errs.append(f"$.options: missing '{k}'")
        else:
            _type(errs, f"$.options.{k}", opts[k], t)
    cfg_names = set()
    for i, c in enumerate(doc["configs"]):
        w = f"$.configs[{i}]"
        if not _type(errs, w, c, dict):
            continue
        for k, t, nul in (("name", str, False), ("kind", str, False), ("description", str, False),
                          ("available", bool, False), ("reason", str, True)):
            if k not in c:
                errs.append(f"{w}: missing '{k}'")
            else:
                _type(errs, f"{w}.{k}", c[k], t, nul)
        if c.get("available") is False and not c.get("reason"):
            errs.append(f"{w}: unavailable without a reason")
        cfg_names.add(c.get("name"))
    exp_names = set()
    for i, e in enumerate(doc["experiments"]):
        w = f"$.experiments[{i}]"
        if not _type(errs, w, e, dict):
            continue
        for k, t in (("name", str), ("title", str), ("reproduces", str), ("primary", str),
                     ("metrics", list)):
            if k not in e:
                errs.append(f"{w}: missing '{k}'")
            else:
                _type(errs, f"{w}.{k}", e[k], t)
        exp_names.add(e.get("name"))
    for i, r in enumerate(doc["rows"]):
        w = f"$.rows[{i}]"
        if not _type(errs, w, r, dict):
            continue
        for k, t, nul in (("experiment", str, False), ("config", str, False),
                          ("params", dict, False), ("available", bool, False),
                          ("valid", bool, False), ("reason", str, True),
                          ("transport", str, True), ("reps", int, False),
                          ("failures", int, False), ("metrics", dict, False),
                          ("cpu", dict, False)):
            if k not in r:
                errs.append(f"{w}: missing '{k}'")
            else:
                _type(errs, f"{w}.{k}", r[k], t, nul)
        if r.get("experiment") not in exp_names:
            errs.append(f"{w}: unknown experiment {r.get('experiment')!r}")
        if r.get("config") not in cfg_names:
            errs.append(f"{w}: unknown config {r.get('config')!r}")
        if r.get("available") is False and not r.get("reason"):
            errs.append(f"{w}: unavailable without a reason")
        if r.get("valid") is True and not r.get("metrics"):
            errs.append(f"{w}: valid without metrics")
        for mk, st in (r.get("metrics") or {}).items():
            _stat(errs, f"{w}.metrics.{mk}", st, need_unit=True)
        for ck, st in (r.get("cpu") or {}).items():
            if ck not in CPU_KEYS:
                errs.append(f"{w}.cpu: unknown key {ck!r}")
            _stat(errs, f"{w}.cpu.{ck}", st)
    return errs
