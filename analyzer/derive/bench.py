"""Load-generator output → client latency, throughput, in-flight requests and the server's breakdown.

Of several measured load levels (a perf_analyzer ``--concurrency-range`` sweep), the last one, the
highest load, is reported: that is the one whose latency an incident is about. The others are
counted in ``bench.levels``.
"""

from __future__ import annotations

from diagnose.collectors.bench import BenchLevel, BenchParser
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality

KIND = "benchmark"


class BenchSource:
    """TextSource for perf_analyzer / wrk / ab output (kind ``benchmark``)."""

    kind = KIND
    triggers = ()  # load-test output is pasted or saved on its own: read from the head

    def __init__(self) -> None:
        self._parser = BenchParser()

    def feed(self, line: str) -> None:
        self._parser.feed(line)

    def matched(self) -> bool:
        return self._parser.matched()

    def problems(self) -> list[str]:
        levels = self._parser.results()
        lvl = _pick(levels)
        if lvl is not None and lvl.server_latency is not None and not lvl.server_breakdown_complete:
            return ["the server latency breakdown is cut short (a part of compute is missing)"]
        return []

    def evidence(self, source: str) -> list[Evidence]:
        return derive(self._parser.results(), source, self._parser.delayed_warnings)


def sources() -> list[BenchSource]:
    return [BenchSource()]


def _pick(levels: list[BenchLevel]) -> BenchLevel | None:
    with_tput = [lvl for lvl in levels if lvl.throughput is not None]
    if with_tput:
        return with_tput[-1]
    return levels[-1] if levels else None


def derive(levels: list[BenchLevel], source: str, delayed_warnings: int = 0) -> list[Evidence]:
    lvl = _pick(levels)
    if lvl is None:
        return []
    tool = lvl.tool
    load = (f"concurrency {lvl.concurrency}" if lvl.concurrency is not None
            else f"request rate {lvl.request_rate:g}/s" if lvl.request_rate is not None else "one level")
    where = f"{tool}, {load}"
    partial = Quality.PARTIAL if not lvl.server_breakdown_complete else Quality.GOOD
    ev = Emit(source)
    ev.add("bench.levels", len(levels), "count", f"{tool} load levels measured (the last one is reported)")
    if lvl.concurrency is not None:
        ev.add("bench.concurrency", lvl.concurrency, "requests",
               f"{tool}: requests the closed-loop client keeps in flight")
    if lvl.request_rate is not None:
        ev.add("bench.request_rate", lvl.request_rate, "requests/s", f"{tool}: offered open-loop request rate")
    if lvl.batch_size != 1:
        ev.add("bench.batch_size", lvl.batch_size, "inferences", f"{tool}: batch size of each request")
    rps = lvl.requests_per_s
    if rps is not None:
        ev.add("throughput.rps", rps, "requests/s", f"{where}: client-measured throughput")
    if lvl.request_count is not None:
        ev.add("requests.count", lvl.request_count, "requests", f"{where}: requests measured")
    if lvl.latency_mean is not None:
        ev.add("latency.e2e_ms.mean", lvl.latency_mean, "ms", f"{where}: client average latency")
    if lvl.latency_std is not None:
        ev.add("latency.e2e_ms.std", lvl.latency_std, "ms", f"{where}: client latency standard deviation")
    for name, value in sorted(lvl.percentiles.items()):
        ev.add(f"latency.e2e_ms.{name}", value, "ms", f"{where}: client latency percentile")
    if lvl.transport_ms is not None:
        ev.add("latency.transport_ms.mean", lvl.transport_ms, "ms", f"{where}: client HTTP/gRPC time")
    if lvl.transport_io_ms is not None:
        ev.add("latency.client_io_ms.mean", lvl.transport_io_ms, "ms",
               f"{where}: client sending and receiving (serialising) the request and response")
        whole = lvl.latency_mean or lvl.transport_ms
        if whole:
            ev.add("latency.client_io.share", min(1.0, lvl.transport_io_ms / whole), "ratio",
                   "client send/receive / client latency")
    if lvl.delayed or delayed_warnings:
        ev.add("bench.client_delayed", 1, "flag",
               f"{tool} warned that it could not keep up with the desired load (results less reliable)")
    if lvl.server_latency is not None:
        ev.add("latency.server_ms.mean", lvl.server_latency, "ms", f"{where}: server-side average request latency")
        parts = lvl.server_parts
        for part, value in sorted(parts.items()):
            if part != "compute":  # one undivided compute time (older perf_client) is the sum below
                ev.add(f"stage.{part}_ms.mean", value, "ms", f"{where}: server {part.replace('_', ' ')}")
        compute = [parts[k] for k in ("compute_input", "compute_infer", "compute_output", "compute") if k in parts]
        if compute:
            total = sum(compute)
            what = "compute" if "compute" in parts else "compute input + infer + output"
            ev.add("stage.compute_ms.mean", total, "ms", f"{where}: server {what}", partial)
            if lvl.server_latency > 0:
                ev.add("stage.compute.share", total / lvl.server_latency, "ratio",
                       "server compute / server request latency", partial)
        if "queue" in parts and lvl.server_latency > 0:
            ev.add("stage.queue.share", parts["queue"] / lvl.server_latency, "ratio",
                   "server queue / server request latency")
    closed = [x for x in levels if x.tool == lvl.tool and x.concurrency is not None and x.latency_mean is not None]
    if len(closed) >= 2:
        base = min(closed, key=lambda x: x.concurrency or 0)
        if base is not lvl and base.concurrency == 1 and base.latency_mean is not None:
            ev.add("bench.unloaded_latency_ms", base.latency_mean, "ms",
                   f"{tool}: mean latency at concurrency 1 (no request waits for another)")
    if lvl.server_inferences and lvl.server_executions:
        ev.add("bench.server_batch_mean", lvl.server_inferences / lvl.server_executions, "inferences",
               f"{where}: inferences per model execution (the batch the server formed)")
    return ev.items
