"""A pasted cProfile / pstats table → where the profiled thread's time went, by activity.

Each row's function is classified as a one-frame stack (``diagnose.derive.activities.classify_function``: the
library its file belongs to, else its name). A deterministic profile has no stacks, so an activity's share of the
profile's time (its header's seconds, else the root's cumulative time) is the largest of:

* the time spent in its rows themselves (the sum of ``tottime``: no row's self time is another's);
* the cumulative time of its outermost row that a library's file decides (``torch/utils/data/…/fetch.py``,
  ``PIL/Image.py``): everything under a DataLoader's fetch is the input pipeline;
* the cumulative time of its outermost row decided by its name alone (``_tokenize``, ``preprocess``) only where no
  row of the model's forward takes a tenth of the profile: a function named ``preprocess`` may call the model too,
  and its cumulative time would then be the model's.

A ``__call__`` or ``generate`` row of no known library counts for nothing (every pipeline, tokenizer and middleware
has one). A row printed after ``strip_dirs()`` (a base name), a C type's row, or a Windows path is given the path its
library's file patterns read (``ImageFile.py`` and ``ImagingDecoder`` are PIL's, ``_json`` json's, ``cv2`` OpenCV's).

Evidence: ``cpu.<activity>_share`` and ``cpu.top.<activity>`` as py-spy's CPU profile gives them (CPU001, CPU002,
CMP001 and GPU001 read them alike), ``workers.active_mean`` 1 (the profiled thread, busy for the profile's time:
a deterministic profile times what ran, not idle waiting between requests) and ``cpu.profile_total_s``. A paste with
several profiles (before and after a fix, one per worker count) is read by its longest: the one that shows the
problem.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Protocol

from diagnose.collectors.pstats_table import PstatsParser, Row
from diagnose.derive.activities import Activity, classify_function
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality

KIND = "pstats-table"
NAMED_FORWARD_SHARE = 0.1  # a model forward this large may sit under a by-name row: its cumulative time is not taken
TOP = 3  # functions named per activity


_ANYONES = frozenset({"__call__", "generate"})
# a library's own base names and C types, as strip_dirs() and C rows print them: PIL's image files and plugins and its
# C decoder, OpenCV's module, json's C scanner
_BASE_NAMES = ((re.compile(r"^(?:Image|ImageFile|ImageOps|ImageFilter|\w+ImagePlugin)\.py$|^Imaging\w*$|^PIL\b"),
                "PIL/"),
               (re.compile(r"^cv2\b"), "cv2/"), (re.compile(r"^_json$|^json\.(?:decoder|encoder|scanner)$"), "json/"))


def _library_of(file: str) -> str:
    """The path a library's row would have had before strip_dirs() (or on Windows' backslashes): what the activity
    table's file patterns read; the name unchanged when it names no known library."""
    file = file.replace("\\", "/")
    if "/" in file:
        return file
    for rx, prefix in _BASE_NAMES:
        if rx.search(file):
            return prefix + file
    return file


class _Table(Protocol):
    rows: list[Row]

    @property
    def span_s(self) -> float: ...


def shares(profile: _Table) -> tuple[dict[Activity, float], dict[Activity, list[dict[str, object]]]]:
    """Each activity's share of the profile's time, and its heaviest functions with theirs (py-spy's
    ``cpu.top.<activity>`` shape: ``{"function", "share"}``)."""
    span = profile.span_s
    if span <= 0:
        return {}, {}
    own: dict[Activity, float] = defaultdict(float)
    by_file: dict[Activity, float] = defaultdict(float)
    by_name: dict[Activity, float] = defaultdict(float)
    weight: dict[Activity, dict[str, float]] = defaultdict(dict)
    named: dict[Activity, dict[str, float]] = defaultdict(dict)  # a by-name row's own time: its total may be another's
    forward = 0.0
    for r in profile.rows:
        path = _library_of(r.file)
        act, library = classify_function(r.function, path)
        if not library and r.function in _ANYONES:
            continue  # every pipeline, tokenizer and middleware has a __call__: its name says nothing of the work
        if act is Activity.OTHER:
            continue
        own[act] += r.tottime
        outer = by_file if library else by_name
        outer[act] = max(outer[act], r.cumtime)
        if act is Activity.FORWARD:
            forward = max(forward, r.cumtime)
        name = f"{r.function} ({path.rsplit('/', 1)[-1]})" if r.file else r.function
        weight[act][name] = max(weight[act].get(name, 0.0), r.cumtime, r.tottime)
        named[act][name] = max(named[act].get(name, 0.0), r.tottime if not library else r.cumtime)
    named_ok = forward < NAMED_FORWARD_SHARE * span
    out = {act: min(1.0, max(own[act], by_file[act], by_name[act] if named_ok or act is Activity.FORWARD else 0.0)
                    / span) for act in own}
    if not named_ok:  # a by-name row's total is not counted (the forward may run under it): nor is it shown
        weight = {act: (w if act is Activity.FORWARD else named[act]) for act, w in weight.items()}
    tops = {act: [{"function": n, "share": round(min(1.0, v / span), 4)}
                  for n, v in sorted(w.items(), key=lambda kv: -kv[1])[:TOP]] for act, w in weight.items()}
    return out, tops


def emit_shares(ev: Emit, table: _Table, what: str) -> bool:
    """Add each activity's share of ``table``'s time and its heaviest functions (``cpu.<activity>_share``,
    ``cpu.top.<activity>``); False when no row is any activity's."""
    got, tops = shares(table)
    for act, share in sorted(got.items(), key=lambda kv: -kv[1]):
        ev.add(f"cpu.{act.value}_share", round(share, 4), "ratio",
               f"{what}: {act.value}'s share of {table.span_s:g} s")
        if tops.get(act):
            ev.add(f"cpu.top.{act.value}", tops[act], "list", f"{what}: the heaviest {act.value} functions")
    return bool(got)


class PstatsSource:
    """TextSource for cProfile / pstats ``print_stats()`` tables (kind ``pstats-table``)."""

    kind = KIND
    triggers = ()  # pasted on its own or inside a report: read from the head

    def __init__(self) -> None:
        self._p = PstatsParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return self._p.matched()

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        profiles = self._p.result()
        if not profiles:
            return []
        profile = max(profiles, key=lambda p: p.span_s)
        what = (f"cProfile table ({len(profile.rows)} rows"
                + (f" of {len(profiles)} profiles, the longest" if len(profiles) > 1 else "") + ")")
        ev = Emit(source, quality=Quality.GOOD)
        if not emit_shares(ev, profile, what):
            return []
        ev.add("cpu.profile_total_s", profile.span_s, "s",
               f"{what}: " + ("its total" if profile.total_s else "its root's cumulative time"))
        ev.add("workers.active_mean", 1.0, "threads", f"{what}: the profiled thread, running for the profile's time")
        return ev.items


def sources() -> list[PstatsSource]:
    return [PstatsSource()]
