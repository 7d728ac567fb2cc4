"""A pasted ``py-spy top`` view → where the sampled threads' CPU time went, by activity.

Its rows are read as a cProfile table's are (``diagnose.derive.pstats_table.shares``): each function classified
alone by the library its file belongs to (else its name), an activity's share the most of its rows' own times and
its outermost row's total, divided by the thread-seconds the view covers (``collectors.pyspy_top.TopTable.span_s``).
Both tools time functions without their stacks; py-spy's times are of samples where a thread was running (idle
threads are left out unless ``--idle`` asked for them), as the live profile's shares are.

Evidence: ``cpu.<activity>_share`` and ``cpu.top.<activity>``, as the live profile gives them (CPU001, CPU002,
CMP001 and GPU001 read them alike); ``cpu.active_samples``, the thread-seconds at py-spy's default 100 Hz (a short
view is a thin profile, as a short live window is); ``workers.active_mean``, the shown functions' thread-seconds
over the window's seconds (``Total Samples`` at 100 Hz; the header's ``Active`` is of the last second only), else 1
(the view shows the threads that ran).
"""

from __future__ import annotations

from diagnose.collectors.pyspy_top import DEFAULT_RATE_HZ, PyspyTopParser
from diagnose.derive.emit import Emit
from diagnose.derive.pstats_table import emit_shares
from diagnose.model import Evidence, Quality

KIND = "pyspy-top"


class PyspyTopSource:
    """TextSource for ``py-spy top`` views copied from the terminal (kind ``pyspy-top``)."""

    kind = KIND
    triggers = ()  # pasted on its own or inside a report: read from the head

    def __init__(self) -> None:
        self._p = PyspyTopParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return self._p.matched()

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        table = self._p.result()
        if table is None or table.span_s <= 0:
            return []
        what = f"py-spy top ({len(table.rows)} functions, {table.span_s:.3g} thread-s)"
        ev = Emit(source, quality=Quality.GOOD)
        if not emit_shares(ev, table, what):
            return []
        ev.add("cpu.active_samples", round(table.span_s * DEFAULT_RATE_HZ), "samples",
               f"{what}: its thread-seconds at py-spy's default rate")
        threads = table.threads_mean
        if threads is not None and table.samples:
            ev.add("workers.active_mean", round(threads, 3), "threads",
                   f"{what}: its functions' thread-seconds over the {table.samples:,} samples' "
                   f"{table.samples / DEFAULT_RATE_HZ:g} s")
        else:
            ev.add("workers.active_mean", 1.0, "threads", f"{what}: the threads it shows ran")
        return ev.items


def sources() -> list[PyspyTopSource]:
    return [PyspyTopSource()]
