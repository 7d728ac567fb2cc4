"""Several PyTorch-profiler traces, one per rank of a job → which rank sets the pace, and by how much.

``analyzer/derive/kineto.py`` reads each trace on its own (a trace is one rank). When a run gives
several, this module sets them side by side from their evidence, pure and small:

* ``kineto.ranks.table``: one row per trace: rank, file, HTA's breakdown (idle / compute /
  non-compute of the kernel span), GPU busy ratio, collective share and its exposed part, kernel
  time, and each device's busy/idle timeline (``busy_bins``) for the reports;
* when the traces cover the same window (their kernel spans overlap on the trace clock by at least
  ``MIN_OVERLAP`` and differ in length by at most ``MAX_SPAN_DIFF``: ranks profiled together, not
  two runs side by side) and name distinct ranks: the slowest rank (the most computation kernel
  time, HTA's compute), ``kineto.ranks.compute_imbalance_ratio`` (its compute over the median
  rank's), ``kineto.ranks.wait_share`` (the difference over the window: what the median rank waits
  for it at every collective), the largest exposed-communication share (where that wait shows),
  and ``kineto.ranks.excess_kernels`` (the kernels both ranks list among their top ones, by how much
  longer they take on the slowest rank: concentrated in a few kernels is uneven work, spread evenly
  is a slower GPU).

``order`` puts the rank that sets the pace first: the evidence of several traces is merged first
one wins, so the ``trace.*`` and ``kineto.*`` keys the rules read are that rank's, not whichever
file came first on the command line. Every rank stays in the table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median
from typing import Any

from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality
from diagnose.units import pct

MIN_OVERLAP = 0.5  # kernel spans sharing under half of the shorter one were not profiled together
MAX_SPAN_DIFF = 0.25  # spans differing by more than a quarter cover different work (steps)
TOP_EXCESS = 5
UNCHANGED = 0.05  # a kernel within 5 % of the median rank's time runs alike on both (run-to-run noise)


@dataclass(frozen=True)
class _Rank:
    index: int  # position among the traces given
    rank: int
    source: str
    row: Mapping[str, Any]  # kineto.rank_breakdown
    ev: Mapping[str, Evidence]
    low: bool  # an excerpt or short window: its figures are thin

    def value(self, key: str) -> Any:
        got = self.ev.get(key)
        return got.value if got is not None else None

    @property
    def compute_us(self) -> float:
        return float(self.row["compute_us"])

    @property
    def span_us(self) -> float:
        return float(self.row["span_us"])

    @property
    def start_us(self) -> float | None:
        start = self.row.get("start_us")
        return float(start) if isinstance(start, int | float) else None


def _ranks(traces: Sequence[Sequence[Evidence]]) -> list[_Rank]:
    out = []
    for i, evidence in enumerate(traces):
        by_key: dict[str, Evidence] = {}
        for e in evidence:
            by_key.setdefault(e.key, e)
        got = by_key.get("kineto.rank_breakdown")
        if got is None or not isinstance(got.value, Mapping) or not float(got.value.get("span_us") or 0) > 0:
            continue
        low = any(e.quality is Quality.LOW for k, e in by_key.items() if k.startswith(("trace.", "kineto.")))
        out.append(_Rank(i, int(got.value.get("rank") or 0), got.source, got.value, by_key, low))
    return out


def _same_window(ranks: Sequence[_Rank]) -> str:
    """Why the ranks cannot be compared step for step, or "" when they can."""
    spans = [r.span_us for r in ranks]
    mid = median(spans)
    if max(abs(s - mid) for s in spans) > MAX_SPAN_DIFF * mid:
        return (f"their kernel spans differ ({min(spans) / 1000:.1f} to {max(spans) / 1000:.1f} ms): they cover "
                "different steps")
    starts = [r.start_us for r in ranks]
    if any(s is None for s in starts):
        return "a trace does not give where its kernel span starts"
    lo = max(s for s in starts if s is not None)
    hi = min(s + r.span_us for s, r in zip(starts, ranks, strict=True) if s is not None)
    if hi - lo < MIN_OVERLAP * min(spans):
        return "their kernel spans do not overlap on the trace clock: they were not profiled together"
    return ""


def order(traces: Sequence[Sequence[Evidence]]) -> list[int]:
    """Indices of ``traces`` in the order their evidence should be merged: for ranks profiled together,
    the slowest rank first (it sets every collective's pace); otherwise as given."""
    ranks = _ranks(traces)
    if len(ranks) < 2 or _same_window(ranks) or len({r.rank for r in ranks}) < len(ranks):
        return list(range(len(traces)))
    slowest = max(ranks, key=lambda r: r.compute_us).index
    return [slowest, *(i for i in range(len(traces)) if i != slowest)]


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


def row(by_key: Mapping[str, Evidence]) -> dict[str, Any] | None:
    """One trace's row of ``kineto.ranks.table`` from its evidence by key, None without a breakdown.

    Only ``kineto.*`` keys are read: in a session an Nsight export may give the ``trace.*`` ones.
    """
    got = by_key.get("kineto.rank_breakdown")
    b = got.value if got is not None else None
    if not isinstance(b, Mapping) or not float(b.get("span_us") or 0) > 0:
        return None
    span = float(b["span_us"])
    tl = by_key.get("kineto.timeline")
    devices = [{k: d.get(k) for k in ("device", "name", "window_ms", "busy_ratio", "busy_bins")}
               for d in (tl.value if tl is not None and isinstance(tl.value, list) else []) if isinstance(d, Mapping)]
    window = sum(float(d["window_ms"] or 0) for d in devices)
    busy = sum(float(d["busy_ratio"] or 0) * float(d["window_ms"] or 0) for d in devices)

    def value(key: str) -> Any:
        e = by_key.get(key)
        return e.value if e is not None else None

    return {
        "rank": int(b.get("rank") or 0), "source": os.path.basename(got.source) if got is not None else "",
        "span_ms": _ms(span), "compute_ms": _ms(float(b["compute_us"])),
        "idle_share": round(float(b["idle_us"]) / span, 4), "compute_share": round(float(b["compute_us"]) / span, 4),
        "non_compute_share": round(float(b["non_compute_us"]) / span, 4),
        "gpu_busy_ratio": round(busy / window, 4) if window > 0 else None,
        "comm_share": value("kineto.comm_share"), "comm_exposed_share": value("kineto.comm_exposed_share"),
        "devices": devices,
    }


def _kernels(r: _Rank) -> dict[str, float]:
    """The rank's top computation kernels (communication kernels take longer on the ranks that wait)."""
    from diagnose.derive.kineto import hta_kernel_type

    rows = r.value("trace.top_kernels") or []
    return {str(k["name"]): float(k["time_ms"]) for k in rows if isinstance(k, Mapping) and "time_ms" in k
            and hta_kernel_type(str(k["name"])) == "computation"}


def derive(traces: Sequence[Sequence[Evidence]]) -> list[Evidence]:
    """Cross-rank evidence of several traces' evidence (each the list one trace gave); empty for fewer
    than two traces with a temporal breakdown."""
    ranks = _ranks(traces)
    if len(ranks) < 2:
        return []
    source = " + ".join(dict.fromkeys(r.source for r in ranks))
    thin = any(r.low for r in ranks)
    ev = Emit(source, quality=Quality.LOW if thin else Quality.GOOD)
    distinct = len({r.rank for r in ranks})
    ev.add("kineto.ranks.count", distinct, "ranks", f"distinct ranks among the {len(ranks)} traces with GPU events")
    ev.add("kineto.ranks.table", [row(r.ev) for r in sorted(ranks, key=lambda r: (r.rank, r.index))], "table",
           "per trace: rank, HTA's temporal breakdown, GPU busy, collective share and its exposed part, and each "
           "device's busy/idle timeline")
    why = _same_window(ranks) or ("" if distinct == len(ranks) else "several traces give the same rank")
    if why:
        ev.add("kineto.ranks.not_compared", why, "reason", "why the ranks' compute is not compared step for step")
        return ev.items
    by_compute = sorted(ranks, key=lambda r: r.compute_us)
    slow = by_compute[-1]
    mid = by_compute[(len(by_compute) - 1) // 2]  # the median rank (of an even count, the lower middle one)
    med_us = mid.compute_us
    span = median(r.span_us for r in ranks)
    ev.add("kineto.ranks.slowest", slow.rank, "rank",
           f"the rank with the most computation-kernel time in the shared window ({_ms(slow.compute_us)} ms; the "
           f"median rank, {mid.rank}: {_ms(med_us)} ms): every collective waits for it; its trace.* keys are the ones "
           "the rules read")
    ev.add("kineto.ranks.compute_imbalance_ratio", slow.compute_us / med_us if med_us > 0 else 0.0, "ratio",
           "the slowest rank's computation time / the median rank's (HTA's compute: the union of computation "
           "kernels; of an even count of ranks, the median rank is the lower middle one)")
    ev.add("kineto.ranks.compute_spread_ms", _ms(slow.compute_us - med_us), "ms", "slowest − median rank's computation")
    ev.add("kineto.ranks.wait_share", max(0.0, slow.compute_us - med_us) / span, "ratio",
           f"that difference / the shared kernel span ({_ms(span)} ms): the share of the window the median rank waits "
           "for the slowest at collectives (idle, or spinning in communication kernels)")
    exposed = [(float(r.value("kineto.comm_exposed_share")), r.rank) for r in ranks
               if isinstance(r.value("kineto.comm_exposed_share"), int | float)]
    if exposed:
        share, rank = max(exposed)
        ev.add("kineto.ranks.comm_exposed_share_max", share, "ratio",
               f"the largest exposed-communication share over the ranks (rank {rank}): collective kernels with no "
               "other kernel running, where waiting for a slower rank shows")
    a, b = _kernels(slow), _kernels(mid)
    excess = sorted(((n, a[n] - b[n]) for n in a.keys() & b.keys()), key=lambda nx: -nx[1])
    if excess:
        ev.add("kineto.ranks.excess_kernels",
               [{"name": n, "slowest_ms": a[n], "median_rank_ms": b[n], "excess_ms": round(x, 3),
                 "ratio": round(a[n] / b[n], 3) if b[n] > 0 else None} for n, x in excess[:TOP_EXCESS]], "table",
               f"computation kernels both rank {slow.rank} (slowest) and rank {mid.rank} (median) list among their top "
               "ones, most extra time on the slowest first")
        base = sum(b[n] for n, _ in excess)
        same = sum(b[n] for n, x in excess if x <= UNCHANGED * b[n])
        if base > 0:
            ev.add("kineto.ranks.kernels_unchanged_share", same / base, "ratio",
                   f"share of those kernels' time (on the median rank) in kernels no more than {pct(UNCHANGED)} slower "
                   "on the slowest: some kernels as fast while others take longer is more work on that rank (uneven "
                   "sharding, expert load); none as fast is a slower GPU, or more of every kind of work")
    return ev.items
