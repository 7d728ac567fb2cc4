"""The target's cgroup files at both ends of the window → its CPU budget and CFS throttling.

``cgroup.cpu_quota_cores``: the smallest quota / period of the group and its ancestors (the one that
binds). Throttling is taken at the level that throttled most in the window (usually the binding
one): ``cgroup.periods`` and ``cgroup.throttled_periods`` (deltas of ``nr_periods`` /
``nr_throttled``), ``cgroup.throttled_ratio`` (their ratio: the share of enforcement periods in which
the group ran out of quota), ``cgroup.throttled_s`` (delta of ``throttled_usec``, summed over the
CPUs the group's threads were stopped on, so it can exceed the window).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diagnose.collectors import cgroup
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality, Window

SOURCE = "cgroup"


def derive(doc: Mapping[str, Any], *, window: Window | None = None, partial: bool = False) -> list[Evidence]:
    version = int(doc.get("version") or 0)
    if version not in (1, 2):
        return []
    ev = Emit(SOURCE, window=window, quality=Quality.PARTIAL if partial else Quality.GOOD)
    start = [cgroup.parse(version, lv) for lv in doc.get("start") or ()]
    end = [cgroup.parse(version, lv) for lv in doc.get("end") or ()]
    limited = [lv for lv in end if lv.quota_cores is not None]
    files = "cpu.max" if version == 2 else "cpu.cfs_quota_us / cpu.cfs_period_us"
    if limited:
        bind = min(limited, key=lambda lv: lv.quota_cores or 0.0)
        ev.add("cgroup.cpu_quota_cores", bind.quota_cores, "cores",
               f"{files} = {bind.quota_us} / {bind.period_us} µs at {bind.path} (cgroup v{version})")
        ev.add("cgroup.cpu_period_us", bind.period_us, "us")
    ev.add("cgroup.limited", bool(limited), "flag",
           f"cgroup v{version} group {doc.get('path')}" + ("" if limited else ": no CPU quota on it or its "
                                                            "ancestors (the budget is the host's cores)"))
    before = {lv.path: lv for lv in start}
    best: tuple[int, int, float, str] | None = None
    for lv in end:
        old = before.get(lv.path)
        if old is None or "nr_periods" not in lv.stat:
            continue
        periods = lv.stat.get("nr_periods", 0) - old.stat.get("nr_periods", 0)
        throttled = lv.stat.get("nr_throttled", 0) - old.stat.get("nr_throttled", 0)
        usec = lv.stat.get("throttled_usec", 0) - old.stat.get("throttled_usec", 0)
        if best is None or throttled > best[1]:
            best = (max(0, periods), max(0, throttled), max(0, usec) / 1e6, lv.path)
    if best is not None:
        periods, throttled, secs, path = best
        ev.add("cgroup.periods", periods, "periods", f"CFS enforcement periods at {path} in the window")
        ev.add("cgroup.throttled_periods", throttled, "periods",
               f"periods in which {path} used its quota and its threads were stopped")
        ev.add("cgroup.throttled_ratio", throttled / periods if periods else 0.0, "ratio",
               f"nr_throttled / nr_periods over the window at {path}")
        ev.add("cgroup.throttled_s", secs, "s",
               "throttled time in the window, summed over the CPUs the group's threads were stopped on")
    memory = doc.get("memory")
    if isinstance(memory, Mapping):
        _memory(ev, memory)
    return ev.items


def _memory(ev: Emit, doc: Mapping[str, Any]) -> None:
    """The memory cgroup: the smallest limit of the group and its ancestors (``cgroup.memory_limit_bytes``),
    the group's peak (``cgroup.memory_peak_bytes``) and the OOM kills in the window (``cgroup.oom_kills``:
    the largest ``oom_kill`` delta of any level; the kill is counted where the limit was hit and above)."""
    version = int(doc.get("version") or 0)
    if version not in (1, 2):
        return
    start = {lv.path: lv for lv in (cgroup.parse_memory(version, raw) for raw in doc.get("start") or ())}
    end = [cgroup.parse_memory(version, raw) for raw in doc.get("end") or ()]
    limited = [lv for lv in end if lv.limit is not None]
    files = "memory.max" if version == 2 else "memory.limit_in_bytes"
    if limited:
        bind = min(limited, key=lambda lv: lv.limit or 0)
        ev.add("cgroup.memory_limit_bytes", bind.limit, "bytes", f"{files} at {bind.path} (cgroup v{version})")
    leaf = end[0] if end else None
    if leaf is not None and leaf.peak is not None:
        ev.add("cgroup.memory_peak_bytes", leaf.peak, "bytes",
               f"the most {leaf.path} held (memory.{'peak' if version == 2 else 'max_usage_in_bytes'})")
    kills = [((lv.oom_kills or 0) - (start[lv.path].oom_kills or 0), lv.path) for lv in end
             if lv.oom_kills is not None and lv.path in start and start[lv.path].oom_kills is not None]
    if kills:
        n, path = max(kills)
        ev.add("cgroup.oom_kills", max(0, n), "processes",
               f"processes the OOM killer killed in {path} during the window "
               f"({'memory.events' if version == 2 else 'memory.oom_control'} oom_kill)")
