"""One quantile for every reader that summarises a list of numbers (NVML and DCGM readings, engine-log
series, the load client's latencies, the stage log's running stats, the demo's load generator), and one
Wilson interval for every share estimated from a count (a thread's share of py-spy samples, the committed
answers' precision)."""

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


def wilson(share: float, n: float, z: float) -> tuple[float, float]:
    """The Wilson score interval of a share of ``n`` observations (a pooled count may be fractional) at ``z``
    standard errors; (0, 1) when there is none."""
    if n <= 0:
        return 0.0, 1.0
    centre = share + z * z / (2 * n)
    spread = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n))
    scale = 1 + z * z / n
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)
