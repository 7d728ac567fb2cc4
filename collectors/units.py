"""Time units, one table for every parser: log lines, benchmark output, engine spans."""

from __future__ import annotations

TO_MS: dict[str, float] = {
    "ns": 1e-6, "us": 1e-3, "µs": 1e-3, "μs": 1e-3, "usec": 1e-3, "ms": 1.0, "msec": 1.0, "millisecond": 1.0,
    "milliseconds": 1.0, "s": 1000.0, "sec": 1000.0, "secs": 1000.0, "second": 1000.0, "seconds": 1000.0,
    "m": 60_000.0, "min": 60_000.0, "mins": 60_000.0, "minute": 60_000.0, "minutes": 60_000.0,
}
TIME_UNIT = r"(?:ns|us|µs|μs|usec|ms|msec|milliseconds?|s|secs?|seconds?|mins?|minutes?)"


def to_ms(value: float, unit: str | None, default: str = "s") -> float:
    """``value`` in ``unit`` (``default`` when None; seconds when unknown) as milliseconds."""
    return value * TO_MS.get((unit or default).lower(), 1000.0)
