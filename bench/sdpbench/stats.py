"""Order statistics used by the suite: medians, extremes, percentiles."""
from __future__ import annotations

import math
from typing import Iterable, Sequence


def _clean(xs: Iterable[float | None]) -> list[float]:
    out = []
    for x in xs:
        if x is None:
            continue
        x = float(x)
        if math.isnan(x):
            continue
        out.append(x)
    return out


def median(xs: Iterable[float | None]) -> float | None:
    v = sorted(_clean(xs))
    n = len(v)
    if n == 0:
        return None
    mid = n // 2
    if n % 2:
        return v[mid]
    return (v[mid - 1] + v[mid]) / 2.0


def percentile(xs: Iterable[float | None], p: float) -> float | None:
    """p-th percentile (0..100) with linear interpolation between closest
    ranks (the same rule as sdp-perf's C code and numpy's default)."""
    if not 0 <= p <= 100:
        raise ValueError("percentile must be within 0..100")
    v = sorted(_clean(xs))
    n = len(v)
    if n == 0:
        return None
    if n == 1:
        return v[0]
    rank = p / 100.0 * (n - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, n - 1)
    return v[lo] + (v[hi] - v[lo]) * (rank - lo)


def summarize(xs: Iterable[float | None]) -> dict | None:
    """{'median', 'min', 'max', 'n'} of the finite values, or None."""
    v = _clean(xs)
    if not v:
        return None
    return {"median": median(v), "min": min(v), "max": max(v), "n": len(v)}


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def cdf_points(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted values and their cumulative fraction, for CDF plots."""
    v = sorted(_clean(values))
    n = len(v)
    return v, [(i + 1) / n for i in range(n)]
