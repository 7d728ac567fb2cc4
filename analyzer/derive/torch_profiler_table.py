"""PyTorch profiler summary tables → the host's time in kernel launches against the device's time.

``api.launch_time_ms``, ``api.launch_count``, ``api.launch_mean_us`` (the launch calls' rows),
``api.launch_host_share`` (their share of the host's self time, from the ``Self CPU %`` column),
``profile.self_cpu_total_ms`` and ``profile.self_device_total_ms`` (the footer), and with both
``api.launch_to_device_ratio``: host time launching over device time. GPU112 judges them.
"""

from __future__ import annotations

from diagnose.collectors.torch_profiler_table import ProfilerTableParser
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality

KIND = "torch-profiler-table"


class ProfilerTableSource:
    """TextSource for ``key_averages().table()`` output (kind ``torch-profiler-table``)."""

    kind = KIND
    triggers = ()  # a summary table is pasted or saved on its own: read from the head

    def __init__(self) -> None:
        self._p = ProfilerTableParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return self._p.matched()

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        t = self._p.table
        if t is None:
            return []
        ev = Emit(source, quality=Quality.GOOD)
        what = f"PyTorch profiler table ({len(t.rows)} rows)"
        if t.self_cpu_total_ms is not None:
            ev.add("profile.self_cpu_total_ms", t.self_cpu_total_ms, "ms", f"{what}: Self CPU time total")
        if t.self_device_total_ms is not None:
            ev.add("profile.self_device_total_ms", t.self_device_total_ms, "ms", f"{what}: Self CUDA time total")
        got = t.launches()
        if got is not None:
            ms, calls, share = got
            ev.add("api.launch_time_ms", ms, "ms", f"{what}: Self CPU of the kernel-launch calls")
            ev.add("api.launch_count", calls, "count", f"{what}: kernel-launch calls")
            if calls:
                ev.add("api.launch_mean_us", ms * 1000.0 / calls, "us", "host time per launch call")
            if share:
                ev.add("api.launch_host_share", share, "ratio", "kernel-launch calls' share of the host's self time")
            if t.self_device_total_ms:
                ev.add("api.launch_to_device_ratio", ms / t.self_device_total_ms, "ratio",
                       "host time launching kernels / device time (Self CUDA time total)")
        return ev.items


def sources() -> list[ProfilerTableSource]:
    return [ProfilerTableSource()]
