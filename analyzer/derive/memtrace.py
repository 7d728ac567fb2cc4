"""A series of allocator readings (``collectors.memtrace``) → how reserved and allocated memory moved over the run.

Evidence (at least ``MIN_READINGS`` readings): ``mem.readings_count``, ``mem.readings_rises`` (readings whose reserve
rose from the one before); ``mem.readings_reserved_first_bytes`` (of the second reading: the first may come before the
first step, whose peak the cache then keeps),
``mem.readings_reserved_last_bytes`` and ``mem.readings_allocated_first_bytes``, ``mem.readings_allocated_last_bytes``;
``mem.readings_reserved_growth_bytes`` and ``mem.readings_allocated_growth_bytes`` (the last reading less the second,
the most the allocated reading reached counted for allocated: a peak in between is what the reserve served); the
last reading's
``mem.readings_free_last_bytes`` when printed. MEM015 judges them.
"""

from __future__ import annotations

from diagnose.collectors.memtrace import MemTraceParser
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality
from diagnose.units import size

KIND = "memory-trace"
MIN_READINGS = 3  # two readings are a before and after; three show a trend


class MemTraceSource:
    """TextSource for a program's printed allocated/reserved readings (kind ``memory-trace``)."""

    kind = KIND
    triggers = ("allocated", "reserved")  # past the head: a reading names both, a table row one of them

    def __init__(self) -> None:
        self._p = MemTraceParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return self._p.result().count >= MIN_READINGS

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        t = self._p.result()
        if t.count < MIN_READINGS or t.first is None or t.second is None or t.last is None:
            return []
        # the growth from the second reading: the first may be taken before the first step, and the cache that
        # step's peak leaves behind is warm-up, not growth
        base, last = t.second, t.last
        what = (f"{t.count:,} allocator readings printed by the program: reserved {size(t.first.reserved)} → "
                f"{size(last.reserved)}, allocated {size(t.first.allocated)} → {size(last.allocated)} "
                f"(at most {size(t.peak_allocated)}), the reserve rising {t.rises:,} times")
        ev = Emit(source, quality=Quality.GOOD)
        ev.add("mem.readings_count", t.count, "readings", what)
        ev.add("mem.readings_rises", t.rises, "readings", what)
        ev.add("mem.readings_reserved_first_bytes", base.reserved, "bytes", f"{what}: the second reading's")
        ev.add("mem.readings_reserved_last_bytes", last.reserved, "bytes", what)
        ev.add("mem.readings_allocated_first_bytes", base.allocated, "bytes", f"{what}: the second reading's")
        ev.add("mem.readings_allocated_last_bytes", last.allocated, "bytes", what)
        ev.add("mem.readings_reserved_growth_bytes", last.reserved - base.reserved, "bytes", what)
        ev.add("mem.readings_allocated_growth_bytes", t.peak_allocated - base.allocated, "bytes", what)
        if last.free is not None:
            ev.add("mem.readings_free_last_bytes", last.free, "bytes", what)
        return ev.items


def sources() -> list[MemTraceSource]:
    return [MemTraceSource()]
