"""``nsys stats`` text → GPU kernel vs copy time, copy sizes, synchronising API time.

Also the ``transfer_report`` kind: statements in an incident write-up that a profile showed
host↔device copies (with a stated latency factor, or a device→host→device round trip). Those are
what a person saw in Nsight rather than the numbers themselves, so they are kept apart under
``copy.reported_*`` keys and judged with low confidence.
"""

from __future__ import annotations

from diagnose.collectors.nsys_stats import NsysStats, NsysStatsParser, scan_transfer_statement
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality

KIND = "nsys_stats"
REPORT_KIND = "transfer_report"
NS_PER_MS = 1e6


class NsysStatsSource:
    """TextSource for ``nsys stats`` reports (kind ``nsys_stats``)."""

    kind = KIND
    triggers = ()  # `nsys stats` tables: pasted or saved on their own, read from the head

    def __init__(self) -> None:
        self._parser = NsysStatsParser()

    def feed(self, line: str) -> None:
        self._parser.feed(line)

    def matched(self) -> bool:
        return self._parser.matched()

    def problems(self) -> list[str]:
        st = self._parser.stats()
        out: list[str] = []
        if st.repeated_reports:
            out.append(f"{st.repeated_reports} report(s) appear more than once; the first of each is used")
        return out

    def evidence(self, source: str) -> list[Evidence]:
        return derive(self._parser.stats(), source)


class TransferReportSource:
    """TextSource for prose about host↔device copies seen in a profile (kind ``transfer_report``)."""

    kind = REPORT_KIND
    triggers = ()  # prose: the head

    def __init__(self) -> None:
        self.in_profile = 0
        self.round_trips = 0
        self.factor: float | None = None
        self.quote = ""

    def feed(self, line: str) -> None:
        st = scan_transfer_statement(line)
        if st is None:
            return
        self.in_profile += st.in_profile
        self.round_trips += st.round_trip
        if st.factor is not None and (self.factor is None or st.factor > self.factor):
            self.factor = st.factor
        if not self.quote:
            self.quote = line.strip()[:200]

    def matched(self) -> bool:
        return bool(self.in_profile or self.round_trips)

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        ev = Emit(source, quality=Quality.LOW)  # what a text says, not a measurement
        if self.in_profile:
            ev.add("copy.reported_in_profile", self.in_profile, "statements",
                   f"statements that a profile shows host/device copies, e.g. \"{self.quote}\"")
        if self.round_trips:
            ev.add("copy.reported_round_trip", self.round_trips, "statements",
                   "statements that data is copied device→host and back (or host→device and back)")
        if self.factor is not None:
            ev.add("copy.reported_latency_factor", self.factor, "x",
                   "latency factor stated together with the copies (before / after removing them)")
        return ev.items


def sources() -> list[NsysStatsSource | TransferReportSource]:
    return [NsysStatsSource(), TransferReportSource()]


def derive(st: NsysStats, source: str) -> list[Evidence]:
    reports = "+".join(st.reports)
    ev = Emit(source)
    copies = {d: ns for d, ns in st.copy_time_ns.items() if d != "memset"}
    copy_ns = sum(copies.values())
    n_copies = sum(n for d, n in st.copy_count.items() if d != "memset")
    if st.has_kernels:
        ev.add("gpu.kernel_time_ms", st.kernel_time_ns / NS_PER_MS, "ms", f"sum of kernel time (nsys {reports})")
        ev.add("gpu.kernel_count", st.kernel_instances, "count", "kernel launches")
    if st.copy_time_ns:
        for d in ("h2d", "d2h", "d2d", "p2p"):
            if d in st.copy_time_ns:
                ev.add(f"copy.{d}_time_ms", st.copy_time_ns[d] / NS_PER_MS, "ms", f"memcpy {d} GPU time (nsys)")
        ev.add("copy.time_ms", copy_ns / NS_PER_MS, "ms", "all memcpy GPU time (memset excluded)")
    if st.has_copies:
        ev.add("copy.count", n_copies, "count", "memcpy operations (memset excluded)")
        for d in ("h2d", "d2h"):
            if d in st.copy_count:
                ev.add(f"copy.{d}_count", st.copy_count[d], "count", f"memcpy {d} operations")
    for d in ("h2d", "d2h", "d2d"):
        if d in st.copy_bytes:
            ev.add(f"copy.{d}_bytes", round(st.copy_bytes[d]), "bytes", f"memcpy {d} bytes (nsys size summary)")
    moved = sum(b for d, b in st.copy_bytes.items() if d != "memset")
    if moved and n_copies:
        ev.add("copy.mean_bytes", moved / n_copies, "bytes", "bytes per memcpy on average")
    if st.has_kernels and st.copy_time_ns and copy_ns + st.kernel_time_ns > 0:
        ev.add("copy.time_share", copy_ns / (copy_ns + st.kernel_time_ns), "ratio",
               "memcpy time / (memcpy + kernel time) on the GPU")
    if "api" in st.reports:
        ev.add("api.total_time_ms", st.api_time_ns / NS_PER_MS, "ms", "CUDA API time on the host threads")
        ev.add("api.sync_time_ms", st.sync_time_ns / NS_PER_MS, "ms",
               "host time blocked in cudaStreamSynchronize/cudaDeviceSynchronize/cudaMemcpy (synchronous)")
        ev.add("api.memcpy_calls", st.memcpy_calls, "count", "cudaMemcpy* / cuMemcpy* calls")
        if st.api_time_ns > 0:
            ev.add("api.sync_share", st.sync_time_ns / st.api_time_ns, "ratio", "synchronising API time / all API time")
        if st.launch_calls:
            ev.add("api.launch_time_ms", st.launch_time_ns / NS_PER_MS, "ms", "host time in kernel-launch calls")
            ev.add("api.launch_count", st.launch_calls, "count", "kernel-launch calls")
            ev.add("api.launch_mean_us", st.launch_time_ns / 1000.0 / st.launch_calls, "us",
                   "host time per launch call")
            if st.has_kernels and st.kernel_time_ns > 0:
                ev.add("api.launch_to_device_ratio", st.launch_time_ns / st.kernel_time_ns, "ratio",
                       "host time launching kernels / kernel time on the GPU")
        if st.top_apis:
            ev.add("api.top", [{"name": n, "time_ms": round(t / NS_PER_MS, 3), "calls": c} for n, t, c in st.top_apis],
                   "table", "CUDA API calls by total time")
    if "pageable" in st.reports:
        ev.add("copy.pageable_async_count", st.pageable_async, "count",
               "async memcpys on pageable host memory (nsys cuda_memcpy_async rule): they run synchronously")
    if "syncmemcpy" in st.reports:
        ev.add("copy.sync_count", st.sync_memcpy_rows, "count", "synchronous memcpys (nsys cuda_memcpy_sync rule)")
    return ev.items
