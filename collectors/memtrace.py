"""A program's own readings of its allocator, printed over a run: allocated against reserved, a line each.

What people add to a loop to watch memory (``torch.cuda.memory_allocated()`` / ``memory_reserved()``) and paste
when it grows (triton-lang/triton#11661)::

    N=256 provider=triton allocated=16 MiB reserved=42 MiB free=5060 MiB
    N=256 provider=torch allocated=16 MiB reserved=318 MiB free=4772 MiB
    N=3712 provider=naive_softmax allocated=16 MiB reserved=12564 MiB free=0 MiB

A reading is a line that names both, each as ``allocated`` / ``reserved`` (or ``memory_allocated``; a peak, "max"
or "peak" before it, is no reading) with ``=`` or ``:`` and a size with its unit; ``free`` beside them
is kept; or a table with a row of each, a column per step. The readings are kept as running values (``Trace``), a
long run's at a stride.
The allocator's own out-of-memory sentence ("20.1 GiB is allocated by PyTorch") is no reading of this kind (no
``=`` or ``:``). Pure, stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagnose.units import SIZE, parse_size

_ALLOCATED = re.compile(rf"(?<![\w.])(?:memory[_ ])?allocated(?:\(\))?\s*[=:]\s*(?P<v>{SIZE})", re.IGNORECASE)
_RESERVED = re.compile(rf"(?<![\w.])(?:memory[_ ])?(?:reserved|cached)(?:\(\))?\s*[=:]\s*(?P<v>{SIZE})",
                       re.IGNORECASE)
_FREE = re.compile(rf"(?<![\w.])free\s*[=:]\s*(?P<v>{SIZE})", re.IGNORECASE)
# the same readings as a table's rows, one per quantity, a column per step (pytorch/pytorch#193400):
# "| `allocated` (MiB) | 66 | 106 | 146 |" over "| `reserved` (MiB) | 220 | 2,980 | 5,760 |"
_ROW = re.compile(r"^\s*\|\s*[`*_]*(?:memory[_ ])?(?P<k>allocated|reserved)[`*_]*\s*\(\s*(?P<u>[KMGT]i?B)\s*\)\s*\|"
                  r"(?P<cells>(?:\s*[\d,.]+\s*\|){3,})\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Reading:
    allocated: int
    reserved: int
    free: int | None


@dataclass
class Trace:
    """What the readings add up to, kept as running values (a log of millions of steps holds a handful of numbers):
    the first two readings, the last, the most allocated, how often the reserve rose from one reading to the next."""

    count: int = 0
    first: Reading | None = None
    second: Reading | None = None
    last: Reading | None = None
    peak_allocated: int = 0
    rises: int = 0  # readings whose reserve is above the one before

    def add(self, r: Reading) -> None:
        if self.last is not None and r.reserved > self.last.reserved:
            self.rises += 1
        if self.first is None:
            self.first = r
        elif self.second is None:
            self.second = r
        self.last = r
        self.count += 1
        self.peak_allocated = max(self.peak_allocated, r.allocated)


# a peak or a limit, not a reading: "Max memory allocated: 3.10 GB", "peak reserved: 9 GiB", "max_reserved=12 GiB"
_PEAK = re.compile(r"\b(?:max|peak|maximum)[\s_]*(?:memory[\s_]*)?(?:allocated|reserved|cached)", re.IGNORECASE)


STRIDE_FROM = 1024  # readings read one by one; past them, every other, then every fourth… (a log of millions)


class MemTraceParser:
    """Feed lines; ``result()`` gives what the readings add up to (``Trace``). Past ``STRIDE_FROM`` readings the
    lines are read at a stride that doubles each time as many again were read (their trend is the same, read in
    logarithmic time), and the last line of all is always read."""

    def __init__(self) -> None:
        self.trace = Trace()
        self._rows: dict[str, list[float]] = {}  # a table's rows read so far, by quantity
        self._candidates = 0
        self._stride = 1
        self._unread: str | None = None  # the last candidate line, when the stride skipped it

    def feed(self, line: str) -> None:
        if line.lstrip().startswith("|"):
            self._row(line)
            return
        low = line.lower()
        if "allocated" not in low or not ("reserved" in low or "cached" in low) \
                or ("=" not in line and ":" not in line):
            return
        self._candidates += 1
        if self._candidates % self._stride:
            self._unread = line
            return
        self._unread = None
        self._read(line, low)
        if self.trace.count >= STRIDE_FROM * self._stride:
            self._stride *= 2

    def result(self) -> Trace:
        if self._unread is not None:
            line, self._unread = self._unread, None
            self._read(line, line.lower())
        return self.trace

    def _read(self, line: str, low: str) -> None:
        if ("max" in low or "peak" in low) and _PEAK.search(line):
            return
        a, r = _ALLOCATED.search(line), _RESERVED.search(line)
        if a is None or r is None:
            return
        allocated, reserved = parse_size(a.group("v")), parse_size(r.group("v"))
        if allocated is None or reserved is None:
            return
        f = _FREE.search(line)
        self.trace.add(Reading(allocated, reserved, parse_size(f.group("v")) if f else None))

    def _row(self, line: str) -> None:
        """A table's row of one quantity across the steps; the readings once both rows of a table are read."""
        m = _ROW.match(line)
        if m is None:
            return
        unit = parse_size("1 " + m.group("u")) or 1
        values = [float(c.replace(",", "")) * unit for c in m.group("cells").split("|") if c.strip()]
        self._rows[m.group("k").lower()] = values
        a, r = self._rows.get("allocated"), self._rows.get("reserved")
        if a is not None and r is not None and len(a) == len(r):
            for x, y in zip(a, r, strict=True):
                self.trace.add(Reading(int(x), int(y), None))
            self._rows = {}
