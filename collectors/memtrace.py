"""A program's own readings of its allocator, printed over a run: allocated against reserved, a line each.

What people add to a loop to watch memory (``torch.cuda.memory_allocated()`` / ``memory_reserved()``) and paste
when it grows (triton-lang/triton#11661)::

    N=256 provider=triton allocated=16 MiB reserved=42 MiB free=5060 MiB
    N=256 provider=torch allocated=16 MiB reserved=318 MiB free=4772 MiB
    N=3712 provider=naive_softmax allocated=16 MiB reserved=12564 MiB free=0 MiB

A reading is a line that names both, each as ``allocated`` / ``reserved`` (or ``memory_allocated``,
``max_reserved`` is no reading: a peak) with ``=`` or ``:`` and a size with its unit; ``free`` beside them is kept;
or a table with a row of each, a column per step.
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
MAX_POINTS = 10_000
# the same readings as a table's rows, one per quantity, a column per step (pytorch/pytorch#193400):
# "| `allocated` (MiB) | 66 | 106 | 146 |" over "| `reserved` (MiB) | 220 | 2,980 | 5,760 |"
_ROW = re.compile(r"^\s*\|\s*[`*_]*(?:memory[_ ])?(?P<k>allocated|reserved)[`*_]*\s*\(\s*(?P<u>[KMGT]i?B)\s*\)\s*\|"
                  r"(?P<cells>(?:\s*[\d,.]+\s*\|){3,})\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Reading:
    allocated: int
    reserved: int
    free: int | None


class MemTraceParser:
    """Feed lines; ``readings`` holds each line's (allocated, reserved, free) in order."""

    def __init__(self) -> None:
        self.readings: list[Reading] = []
        self._rows: dict[str, list[float]] = {}  # a table's rows read so far, by quantity

    def feed(self, line: str) -> None:
        if line.lstrip().startswith("|"):
            self._row(line)
            return
        if "=" not in line and ":" not in line:
            return
        a, r = _ALLOCATED.search(line), _RESERVED.search(line)
        if a is None or r is None or len(self.readings) >= MAX_POINTS:
            return
        allocated, reserved = parse_size(a.group("v")), parse_size(r.group("v"))
        if allocated is None or reserved is None:
            return
        f = _FREE.search(line)
        self.readings.append(Reading(allocated, reserved, parse_size(f.group("v")) if f else None))

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
            self.readings.extend(Reading(int(x), int(y), None) for x, y in zip(a, r, strict=True))
            self._rows = {}
