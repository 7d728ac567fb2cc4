"""PyTorch profiler summary tables (``prof.key_averages().table(...)``): how much host time goes into launching.

The table torch prints, whatever its sort key and row limit::

    ----------------------------  ------------  ------------  ...  ------------
                            Name    Self CPU %      Self CPU  ...    # of Calls
    ----------------------------  ------------  ------------  ...  ------------
                cudaLaunchKernel        24.80%        1.401s  ...        248583
             aten::empty_strided         9.36%     528.518ms  ...         75046
    ----------------------------  ------------  ------------  ...  ------------
    Self CPU time total: 5.651s
    Self CUDA time total: 1.234s

Columns are read by name from the header (``Self CPU %``, ``Self CPU``, ``CPU total``, ``Self CUDA`` /
``Self Device``, ``# of Calls``…; which ones appear depends on the torch version and the activities
profiled). A row's values carry no spaces, so a row is its name followed by as many values as the header has
columns after ``Name``: names with spaces (``Memcpy HtoD (Pageable -> Device)``) stay whole. The footer's
``Self CPU time total`` and ``Self CUDA time total`` (``Self Device``/``XPU``/``MPS`` on other devices) are the
host's and the device's time over the profile. Pure, stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from diagnose.collectors.nsys import LAUNCH_APIS
from diagnose.collectors.units import to_ms

_SEPARATOR = re.compile(r"^\s*-{3,}(?:\s+-{3,})+\s*$")
_COLUMNS = re.compile(r"\S+(?: \S+)*")  # the header's names: words joined by single spaces
_VALUE = re.compile(r"^(-?\d+(?:\.\d+)?)(%|us|ms|s|ns|b|kb|mb|gb|k|m)?$", re.IGNORECASE)
_FOOTER = re.compile(r"^\s*Self (CPU|CUDA|Device|XPU|MPS|PrivateUse1) time total:\s*(\d+(?:\.\d+)?)\s*(ns|us|ms|s)\b")


@dataclass
class ProfilerTable:
    columns: list[str] = field(default_factory=list)  # after "Name"
    rows: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    self_cpu_total_ms: float | None = None
    self_device_total_ms: float | None = None

    def launches(self) -> tuple[float, int, float] | None:
        """(host time in kernel-launch calls in ms, calls, their share of the host's self time) or None."""
        rows = [v for name, v in self.rows if name in LAUNCH_APIS]
        if not rows or "Self CPU" not in self.columns:
            return None
        ms = sum(_ms(v.get("Self CPU", "")) or 0.0 for v in rows)
        calls = sum(int(_num(v.get("# of Calls", "")) or 0) for v in rows)
        share = sum(_num(v.get("Self CPU %", "")) or 0.0 for v in rows) / 100.0
        if not share and self.self_cpu_total_ms:
            share = ms / self.self_cpu_total_ms
        return ms, calls, share


def _num(text: str) -> float | None:
    m = _VALUE.match(text.strip())
    return float(m.group(1)) if m else None


def _ms(text: str) -> float | None:
    m = _VALUE.match(text.strip())
    if not m or (m.group(2) or "").lower() not in ("us", "ms", "s", "ns"):
        return None
    return to_ms(float(m.group(1)), m.group(2))


class ProfilerTableParser:
    """Feed cleaned lines; ``table`` is the first profiler summary table read (None before one)."""

    def __init__(self) -> None:
        self.table: ProfilerTable | None = None
        self._state = "idle"  # idle → header (a separator seen) → rows (the header and its separator) → done
        self._pending: list[str] = []

    def feed(self, line: str) -> None:
        footer = _FOOTER.match(line)
        if footer and self.table is not None:
            ms = to_ms(float(footer.group(2)), footer.group(3))
            if footer.group(1) == "CPU":
                self.table.self_cpu_total_ms = ms
            else:
                self.table.self_device_total_ms = ms
            return
        if self._state == "done":
            return
        if _SEPARATOR.match(line):
            if self._state == "idle":
                self._state = "header"
            elif self._state == "rows" and self.table is not None and self.table.rows:
                self._state = "done"
            return
        if self._state == "header":
            names = _COLUMNS.findall(line.strip())
            if len(names) >= 3 and names[0] == "Name" and any(n.startswith("Self CPU") for n in names):
                self.table = ProfilerTable(columns=names[1:])
                self._state = "rows"
            else:
                self._state = "idle"
            return
        if self._state == "rows" and self.table is not None:
            k = len(self.table.columns)
            parts = line.rstrip().rsplit(None, k)
            if len(parts) == k + 1 and all(_VALUE.match(p) for p in parts[1:]):
                self.table.rows.append((parts[0].strip(), dict(zip(self.table.columns, parts[1:], strict=True))))

    def matched(self) -> bool:
        return self.table is not None and bool(self.table.rows)
