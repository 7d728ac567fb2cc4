"""``py-spy top`` as people paste it: the live view's header and its function table, copied from the terminal.

What ``py-spy top --pid PID`` shows (py-spy 0.3/0.4; older versions print ``Function (filename:line)``, one row
per line of a function, and some pastes print the percentages with one decimal or none)::

    Collecting samples from 'python -m app.server' (python v3.11.7)
    Total Samples 1500
    GIL: 27.00%, Active: 308.00%, Threads: 6

      %Own   %Total  OwnTime  TotalTime  Function (filename)
     85.00%  85.00%   12.66s    12.66s   GaussianBlur.filter (PIL/ImageFilter.py)
     51.00%  51.00%    7.47s     7.47s   Conv2d._conv_forward (torch/nn/modules/conv
      8.00% 243.00%   0.390s    37.88s   CpuPreprocessPathology._run (diagnose/examp

The percentages are of the last refresh (a second); ``OwnTime`` and ``TotalTime`` add up since py-spy started, one
thread-second per second a thread was on the CPU in that function (``Own``) or under it (``Total``). ``Active`` is
the threads running in the last refresh, as a percentage (308 %: three), zeroed at each; ``Total Samples`` the rounds
py-spy took since it started (100 a second unless ``--rate`` said otherwise). A terminal narrower than the row cuts
its file name (no closing parenthesis): the part kept is read, and a name cut before its file is kept without one.
The times are read; a paste of several refreshes keeps the last table (its times include the earlier ones'); a
function's rows, one per line, add up. Rows are ``pstats_table.Row``s (``calls`` 0: a sampler counts no calls).
Pure, stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from diagnose.collectors.pstats_table import Row

DEFAULT_RATE_HZ = 100.0  # py-spy's sampling rate unless --rate changed it: Total Samples / this is the window

_HEADER = re.compile(r"^\s*%Own\s+%Total\s+OwnTime\s+TotalTime\s+Function\b")
_PCT = r"(\d+(?:\.\d+)?)%?"
_TIME = r"(\d+(?:\.\d+)?)(s)"  # py-spy prints seconds ("5.03s", "0.360s")
_ROW = re.compile(rf"^\s*{_PCT}\s+{_PCT}\s+{_TIME}\s+{_TIME}\s+(\S.*?)\s*$")
# (py-spy adds the samples that failed when there were any: "Total Samples 3000, Error Rate 2.40% (…)")
_SAMPLES = re.compile(r"^\s*Total Samples\s+(\d+)\b")
_ACTIVE = re.compile(r"\bActive:\s*(\d+(?:\.\d+)?)\s*%.*?\bThreads:\s*(\d+)")
_LINE_NO = re.compile(r":\d+$")


@dataclass
class TopTable:
    """One refresh of the view: its header's figures (when pasted) and its rows, a function's lines merged."""

    samples: int | None = None
    active_pct: float | None = None
    threads: int | None = None
    rows: list[Row] = field(default_factory=list)

    @property
    def own_s(self) -> float:
        """What its rows' own times add up to: the thread-seconds of the functions shown."""
        return sum(r.tottime for r in self.rows)

    @property
    def span_s(self) -> float:
        """The thread-seconds the table divides: the most of its rows' own times added up and its largest total
        time (a thread's root). (``Active`` is of the last refresh only, zeroed at every one: no measure of the run.)"""
        return max(self.own_s, max((r.cumtime for r in self.rows), default=0.0))

    @property
    def threads_mean(self) -> float | None:
        """The threads running on average over the run: the shown functions' thread-seconds over the window's
        seconds (``Total Samples`` at the default rate); None without the header's samples."""
        if not self.samples:
            return None
        return self.own_s / (self.samples / DEFAULT_RATE_HZ)


def parse_function(text: str) -> tuple[str, str]:
    """(file, function) of a row's last field ``name (file[:line])``, split at its first " (" (a Windows path may hold
    one: "C:\\Program Files (x86)\\…"); a file cut by the terminal's width (no closing parenthesis) is kept as far as
    it goes, and a name cut before its file has none ("")."""
    name, sep, rest = text.partition(" (")
    file = _LINE_NO.sub("", rest.removesuffix(")").strip()) if sep else ""
    return file, name.strip()


def _seconds(value: str, unit: str) -> float:
    return float(value) / (1000.0 if unit == "ms" else 1.0)


class PyspyTopParser:
    """Feed lines; ``result`` gives the last table that had rows (the view's latest refresh)."""

    def __init__(self) -> None:
        self.tables: list[TopTable] = []
        self._head = TopTable()  # the header lines read since the last table
        self._open: TopTable | None = None
        self._merged: dict[tuple[str, str], int] = {}

    def feed(self, line: str) -> None:
        m = _SAMPLES.match(line)
        if m:
            self._open = None
            self._head = TopTable(samples=int(m.group(1)))
            return
        m = _ACTIVE.search(line)
        if m and self._open is None:
            self._head.active_pct, self._head.threads = float(m.group(1)), int(m.group(2))
            return
        if _HEADER.match(line):
            self._open = self._head
            self._head = TopTable()
            self._merged = {}
            self.tables.append(self._open)
            return
        if self._open is None:
            return
        r = _ROW.match(line)
        where = parse_function(r.group(7)) if r else None
        if r is None or where is None or not where[1]:
            if line.strip() and not line.lstrip().startswith("Press "):
                self._open = None  # the table ends at its first other line (blank lines sit between rows)
            return
        own, total = _seconds(r.group(3), r.group(4)), _seconds(r.group(5), r.group(6))
        i = self._merged.get(where)
        if i is None:
            self._merged[where] = len(self._open.rows)
            self._open.rows.append(Row(0, own, total, *where))
        else:  # one row per line of a function (older py-spy, --lines): a sample is at one line, so the times add
            old = self._open.rows[i]
            self._open.rows[i] = Row(0, old.tottime + own, old.cumtime + total, *where)

    def matched(self) -> bool:
        return any(t.rows for t in self.tables)

    def result(self) -> TopTable | None:
        full = [t for t in self.tables if t.rows]
        return full[-1] if full else None
