"""Python's deterministic profiler as people paste it: ``cProfile`` / ``pstats`` ``print_stats()`` tables.

What ``python -m cProfile script.py`` or ``pstats.Stats(...).sort_stats(...).print_stats(N)`` prints::

             73791524 function calls (73791000 primitive calls) in 114.720 seconds

       Ordered by: cumulative time
       List reduced from 8601 to 10 due to restriction <10>

       ncalls  tottime  percall  cumtime  percall filename:lineno(function)
        27157   22.988    0.001  112.449    0.004 tokenization_gpt2.py:180(_tokenize)
         3800  179.361    0.047  179.361    0.047 {method 'item' of 'torch._C.TensorBase' objects}
           12    0.000    0.000  190.987   15.916 /venv/site-packages/torch/utils/data/_utils/fetch.py:46(fetch)
        2/1     0.083    0.000  208.382  208.382 {built-in method builtins.exec}

Each row is read by its columns' structure (``ncalls`` may be ``recursive/primitive``); its last field names a
Python function (``file:line(function)``, the file a full path or, after ``strip_dirs()``, its base name) or a C
function (``{built-in method cv2.imdecode}``, ``{method 'item' of 'torch._C.TensorBase' objects}``). The header's
``in T seconds`` is the profile's total (wall-clock time of the profiled thread, by default). A paste holding several
profiles (before and after a change, one per worker count) gives one ``Profile`` each. Pure, stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_TOTAL = re.compile(r"^\s*(\d+) function calls(?: \((\d+) primitive calls\))? in (\d+(?:\.\d+)?) (?:CPU )?seconds")
_HEADER = re.compile(r"^\s*ncalls\s+tottime\s+percall\s+cumtime\s+percall\s+filename:lineno\(function\)\s*$")
_SECONDS = r"\s+(\d+(?:\.\d+)?)"
_ROW = re.compile(rf"^\s*(\d+(?:/\d+)?){_SECONDS}{_SECONDS}{_SECONDS}{_SECONDS}\s+(\S.*?)\s*$")
_PYTHON = re.compile(r"^(?P<file>.+):(?P<line>\d+)\((?P<func>[^()]*(?:\([^()]*\))?[^()]*)\)$")
_BUILTIN = re.compile(r"^\{built-in method (?P<name>[^}]+)\}$")
_METHOD = re.compile(r"^\{method '(?P<name>[^']+)' of '(?P<owner>[^']+)' objects\}$")


@dataclass(frozen=True)
class Row:
    """One function's line: its calls, time in itself (``tottime``) and in it and its callees (``cumtime``), s."""

    calls: int
    tottime: float
    cumtime: float
    file: str  # the file's path as printed, or the C function's module ("cv2", "torch._C.TensorBase")
    function: str


@dataclass
class Profile:
    """One printed profile: its total (the header's seconds, when printed) and its rows in printed order."""

    total_s: float | None = None
    rows: list[Row] = field(default_factory=list)

    @property
    def span_s(self) -> float:
        """The profile's time: the header's total, else its largest cumulative time (the root's)."""
        return self.total_s if self.total_s else max((r.cumtime for r in self.rows), default=0.0)


def parse_location(text: str) -> tuple[str, str] | None:
    """(file, function) of a row's last field, or None when it names no function."""
    m = _PYTHON.match(text)
    if m:
        return m.group("file"), m.group("func")
    m = _BUILTIN.match(text)
    if m:
        module, _, name = m.group("name").rpartition(".")
        return module, name
    m = _METHOD.match(text)
    if m:
        return m.group("owner"), m.group("name")
    return None


class PstatsParser:
    """Feed lines; ``profiles`` holds every profile whose column header and at least one row were read."""

    def __init__(self) -> None:
        self.profiles: list[Profile] = []
        self._open: Profile | None = None  # a profile whose header was seen
        self._in_rows = False

    def feed(self, line: str) -> None:
        m = _TOTAL.match(line)
        if m:
            self._open = Profile(total_s=float(m.group(3)))
            self._in_rows = False
            return
        if _HEADER.match(line):
            if self._open is None or self._open.rows:  # a table printed without its total line
                self._open = Profile()
            self.profiles.append(self._open)
            self._in_rows = True
            return
        if not self._in_rows or self._open is None:
            return
        r = _ROW.match(line)
        where = parse_location(r.group(6)) if r else None
        if r is None or where is None:
            if line.strip():  # the table ends at its first other line (a blank line between rows is pstats')
                self._in_rows = False
            return
        calls = int(r.group(1).split("/")[0])
        self._open.rows.append(Row(calls, float(r.group(2)), float(r.group(4)), *where))

    def matched(self) -> bool:
        return any(p.rows for p in self.profiles)

    def result(self) -> list[Profile]:
        return [p for p in self.profiles if p.rows]
