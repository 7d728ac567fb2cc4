"""One quantile for every reader that summarises a list of numbers (NVML and DCGM readings, engine-log
series, the load client's latencies, the stage log's running stats, the demo's load generator)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def quantile(xs: Iterable[float], q: float) -> float | None:
    """The q-quantile (q in 0..1), linear between the closest ranks as numpy's default method; None when
    there is no value."""
    s = sorted(xs)
    if not s:
        return None
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)
