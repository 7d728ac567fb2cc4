"""Load-generator output: Triton ``perf_analyzer``, ``wrk``, ApacheBench (``ab``), ``hey`` (``boom``) and TensorRT
``trtexec`` summaries.

A pure, streaming parser: ``BenchParser.feed(line)`` per cleaned line, ``BenchParser.results()``
at the end. Each measured load level becomes one ``BenchLevel`` (times in milliseconds).

perf_analyzer (one block per concurrency level, or the closing summary lines only)::

    Request concurrency: 1000
      Client:
        Request count: 72262
        Throughput: 4005.66 infer/sec
        Avg latency: 247602 usec (standard deviation 9319 usec)
        p50 latency: 245439 usec
        …
      Server:
        Inference count: 72262
        Execution count: 4518
        Successful request count: 72262
        Avg request latency: 247496 usec (overhead 844 usec + queue 242704 usec + compute input
          2241 usec + compute infer 1613 usec + compute output 9 usec)
    Inferences/Second vs. Client Average Batch Latency
    Concurrency: 1000, throughput: 4005.66 infer/sec, latency 247602 usec

An ensemble's server line sums its models' queue and compute; the ``Composing models:`` list after it
gives each model's own (``dali, version: 1`` then its counts and ``Avg request latency``), and a
composing model that is itself an ensemble (``--bls-composing``) is followed by a list of its own.

wrk: ``12 threads and 400 connections``, ``Latency 635.91us 0.89ms 12.92ms 93.69%``, the
``Latency Distribution`` percent lines, ``Requests/sec: 748868.53``.
ab: ``Concurrency Level: 10``, ``Requests per second: 810.37 [#/sec] (mean)``, ``Time per request:
12.340 [ms] (mean)``, ``Complete requests: 1000`` and the ``50%  12`` percentile lines.
hey / boom: ``Summary:``, ``Average: 0.4214 secs``, ``Requests/sec: 118.2981``, ``50% in 0.4500 secs``,
``[200] 20000 responses`` (no concurrency printed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from diagnose.collectors.units import to_ms

_NUM = r"(-?[\d.]+(?:e[-+]?\d+)?)"
_PA_SETTINGS = re.compile(r"\*\*\*\s*Measurement Settings\s*\*\*\*")
_PA_BATCH = re.compile(r"^Batch size:\s*(\d+)")
_PA_CONC = re.compile(r"^Request concurrency:\s*(\d+)")
_PA_RATE = re.compile(r"^Request Rate:\s*" + _NUM)
_PA_COUNT = re.compile(r"^Request count:\s*(\d+)")
_PA_TPUT = re.compile(r"^Throughput:\s*" + _NUM + r"\s*infer/sec")
_PA_AVG = re.compile(r"^Avg latency:\s*" + _NUM + r"\s*(usec|ms|sec)(?:\s*\(standard deviation\s*" + _NUM + r")?")
_PA_PCT = re.compile(r"^p(\d+) latency:\s*" + _NUM + r"\s*(usec|ms|sec)")
_PA_TRANSPORT = re.compile(r"^Avg (HTTP|gRPC) time:\s*" + _NUM + r"\s*(usec|ms|sec)")
# what the client's transport time is made of: HTTP's "send/recv X usec + response wait Y usec" (older) or "send X
# + response wait Y + receive Z", gRPC's "(un)marshal request/response X + response wait Y" or "marshal X + response
# wait Y + unmarshal Z": all but the response wait is the client serialising and moving the payloads
_PA_TRANSPORT_PART = re.compile(r"(send/recv|\(un\)marshal request/response|unmarshal|marshal|send|receive"
                                r"|response wait)\s+" + _NUM + r"\s*(usec|ms|sec)")
_PA_INFER = re.compile(r"^Inference count:\s*(\d+)")
_PA_EXEC = re.compile(r"^Execution count:\s*(\d+)")
_PA_SUCCESS = re.compile(r"^Successful request count:\s*(\d+)")
_PA_SERVER = re.compile(r"^Avg request latency:\s*" + _NUM + r"\s*(usec|ms|sec)\s*(.*)$")
# perf_client before the input/infer/output split printed one "compute X usec"
_PA_PART = re.compile(r"(overhead|queue|compute input|compute infer|compute output|compute)\s+" + _NUM
                      + r"\s*(usec|ms|sec)")
# an ensemble's own parts, one a line, after its request latency (perf_analyzer before triton server#2455, 2021):
# "Total avg compute input time : 4184 usec" … "Total avg queue time : 0 usec". That queue is the ensemble's
# own, not its composing models' (#2455 made it their sum)
_PA_TOTAL = re.compile(r"^Total avg (compute input|compute infer|compute output|queue) time\s*:\s*" + _NUM
                       + r"\s*(usec|ms|sec)")
_PA_SUMMARY = re.compile(
    r"^Concurrency:\s*(\d+),\s*throughput:\s*" + _NUM + r"\s*infer/sec,\s*latency\s*" + _NUM + r"\s*(usec|ms|sec)"
)
# a composing model's head: "dali, version: " / "* siglip_text, version: 1" (perf_analyzer's ident, then the
# model's name and version, the version empty for the latest)
_PA_COMPOSING = re.compile(r"^([A-Za-z0-9_][\w.\-/]*), version:\s*(\S*)$")
_PA_DELAYED = re.compile(r"Delayed Request Count:\s*(\d+)|not able to keep up with the desired load", re.I)

_HEY_FIELD = re.compile(r"^(Total|Slowest|Fastest|Average|Requests/sec):\s*" + _NUM + r"(?:\s*secs)?$")
_HEY_DIST = re.compile(r"^(\d{1,2})%\s+in\s+" + _NUM + r"\s*secs$")
_HEY_STATUS = re.compile(r"^\[(\d{3})\]\s+(\d+)\s+responses$")
_WRK_CONNS = re.compile(r"^(\d+)\s+threads and\s+(\d+)\s+connections")
_WRK_LAT = re.compile(r"^Latency\s+" + _NUM + r"(us|ms|s|m)\s+" + _NUM + r"(us|ms|s|m)\s+" + _NUM + r"(us|ms|s|m)")
_WRK_DIST = re.compile(r"^(\d+(?:\.\d+)?)%\s+" + _NUM + r"(us|ms|s|m)$")
_WRK_REQS = re.compile(r"^(\d+)\s+requests in\s+" + _NUM + r"(us|ms|s|m)")
_WRK_RPS = re.compile(r"^Requests/sec:\s*" + _NUM)

_AB_CONC = re.compile(r"^Concurrency Level:\s*(\d+)")
_AB_DONE = re.compile(r"^Complete requests:\s*(\d+)")
_AB_RPS = re.compile(r"^Requests per second:\s*" + _NUM)
_AB_TPR = re.compile(r"^Time per request:\s*" + _NUM + r"\s*\[ms\]\s*\(mean\)\s*$")
_AB_PCT = re.compile(r"^(\d+)%\s+(\d+)(?:\s*\(longest request\))?$")


# trtexec (TensorRT 8.x-10.x) closes with a performance summary, each line behind TensorRT's logger prefix:
#   [08/09/2023-12:44:56] [I] === Performance summary ===
#   [08/09/2023-12:44:56] [I] Throughput: 16.7825 qps
#   [08/09/2023-12:44:56] [I] Latency: min = 95.4661 ms, max = 102.108 ms, mean = 96.1359 ms, median = 96.0366 ms, …
#   … Enqueue Time / H2D Latency / GPU Compute Time / D2H Latency: the same fields;
#   … Total Host Walltime: 3.00232 s / Total GPU Compute Time: 2.39284 s
# Latency is the host's per-inference time: the input's copy to the device, the engine's compute and the output's
# copy back (none of them with --noDataTransfers).
_TRT_PREFIX = re.compile(r"^(?:\[\d{2}/\d{2}/\d{4}-\d{2}:\d{2}:\d{2}\]\s*)?\[[IWEVF]\]\s*")  # its date may be cut
_TRT_SUMMARY = re.compile(r"^=+\s*Performance summary\s*=+$")
_TRT_QPS = re.compile(r"^Throughput:\s*" + _NUM + r"\s*qps\b")
_TRT_F = r"[\d.e+-]+"
_TRT_STAT = re.compile(rf"^(?P<what>Latency|Enqueue Time|H2D Latency|GPU Compute Time|D2H Latency):"
                       rf"\s*min = {_TRT_F} ms,\s*max = {_TRT_F} ms,\s*mean = (?P<mean>{_TRT_F}) ms"
                       rf"(?:,\s*median = (?P<median>{_TRT_F}) ms)?(?:.*?percentile\(99%\) = (?P<p99>{_TRT_F}) ms)?")
_TRT_PARTS = {"Enqueue Time": "enqueue", "H2D Latency": "h2d", "GPU Compute Time": "compute", "D2H Latency": "d2h"}
_TRT_TOTAL = re.compile(r"^Total (Host Walltime|GPU Compute Time):\s*" + _NUM + r"\s*s\b")


def _ms(value: str, unit: str) -> float:
    return to_ms(float(value), unit)


@dataclass
class ComposingModel:
    """One model of a Triton ensemble (perf_analyzer's ``Composing models:`` list): its server-side request
    latency and that latency's parts, in ms."""

    name: str
    latency: float | None = None
    parts: dict[str, float] = field(default_factory=dict)  # "queue", "compute_infer", … → ms
    ensemble: bool = False  # itself an ensemble: a "Composing models:" list of its own follows it


@dataclass
class BenchLevel:
    """One measured load level. Latencies in ms; throughput in inferences (requests × batch) per s."""

    tool: str
    concurrency: int | None = None
    request_rate: float | None = None  # open-loop mode (perf_analyzer --request-rate-range)
    batch_size: int = 1
    request_count: int | None = None
    throughput: float | None = None
    latency_mean: float | None = None
    latency_std: float | None = None
    percentiles: dict[str, float] = field(default_factory=dict)  # "p50" → ms
    transport_ms: float | None = None
    transport_io_ms: float | None = None  # of it, the client sending and receiving (serialising) the payloads
    server_inferences: int | None = None
    server_executions: int | None = None
    server_requests: int | None = None
    server_latency: float | None = None
    server_parts: dict[str, float] = field(default_factory=dict)  # "queue" → ms
    server_breakdown_complete: bool = True
    ensemble_totals: bool = False  # the parts are an old perf_analyzer's ensemble "Total avg … time" lines
    delayed: bool = False
    composing: list[ComposingModel] = field(default_factory=list)  # an ensemble's models, in report order
    device_parts: dict[str, float] = field(default_factory=dict)  # trtexec: "h2d", "compute", "d2h", "enqueue" → ms
    gpu_busy: float | None = None  # trtexec: total GPU compute time / total host walltime

    @property
    def composing_leaves(self) -> list[ComposingModel]:
        """The composing models that run work (a nested ensemble's own line sums its models: left out)."""
        return [m for m in self.composing if not m.ensemble and m.latency is not None]

    @property
    def requests_per_s(self) -> float | None:
        if self.throughput is None:
            return None
        return self.throughput / max(1, self.batch_size)


class BenchParser:
    """Stream cleaned lines in; measured levels out. Never raises on odd input."""

    def __init__(self) -> None:
        self.levels: list[BenchLevel] = []
        self.summaries: dict[int, tuple[float, float]] = {}  # concurrency → (throughput, latency ms)
        self.batch_size = 1
        self.recognised = 0
        self.delayed_warnings = 0
        self._section = ""  # "client" | "server" | "composing"
        self._cur: BenchLevel | None = None
        self._wrk: BenchLevel | None = None
        self._hey: BenchLevel | None = None
        self._ab: BenchLevel | None = None
        self._dist: str = ""  # "wrk" | "ab" while reading a percentile list
        self._trt: BenchLevel | None = None  # trtexec's performance summary, once its head was read
        self._trt_wall = 0.0

    def feed(self, line: str) -> bool:
        s = line.strip().removeprefix("* ")  # perf_analyzer 2.x bullets its report lines
        if not s:
            return False
        hit = (self._perf_analyzer(s) or self._hey_line(s) or self._wrk_line(s) or self._ab_line(s)
               or self._trtexec(s))
        if hit:
            self.recognised += 1
        return hit

    # -- perf_analyzer ------------------------------------------------------------------------
    def _level(self) -> BenchLevel:
        if self._cur is None:
            self._cur = BenchLevel("perf_analyzer", batch_size=self.batch_size)
            self.levels.append(self._cur)
        return self._cur

    def _perf_analyzer(self, s: str) -> bool:
        if "Measurement Settings" in s and _PA_SETTINGS.search(s):
            return True
        m = _PA_BATCH.match(s)
        if m:
            self.batch_size = int(m.group(1))
            return True
        m = _PA_CONC.match(s) or _PA_RATE.match(s)
        if m:
            lvl = BenchLevel("perf_analyzer", batch_size=self.batch_size)
            if s.startswith("Request concurrency"):
                lvl.concurrency = int(m.group(1))
            else:
                lvl.request_rate = float(m.group(1))
            self._cur = lvl
            self.levels.append(lvl)
            self._section = ""
            return True
        if s == "Client:":
            self._section = "client"
            return self._cur is not None
        if s == "Server:":
            self._section = "server"
            return self._cur is not None
        if s.startswith("Composing models"):
            self._section = "composing"
            if self._cur is not None and self._cur.composing and self._cur.composing[-1].latency is not None:
                self._cur.composing[-1].ensemble = True  # an ensemble inside the ensemble: its models follow
            return self._cur is not None
        if ("Delayed" in s or "keep up" in s) and _PA_DELAYED.search(s):
            self.delayed_warnings += 1
            if self._cur is not None:
                self._cur.delayed = True
            return True
        m = _PA_SUMMARY.match(s)
        if m:
            self.summaries[int(m.group(1))] = (float(m.group(2)), _ms(m.group(3), m.group(4)))
            return True
        if self._cur is None:
            return False
        lvl = self._cur
        if self._section == "composing":
            return self._composing(lvl, s)
        if self._section == "client":
            return self._client(lvl, s)
        if self._section == "server":
            return self._server(lvl, s)
        return False

    def _client(self, lvl: BenchLevel, s: str) -> bool:
        m = _PA_COUNT.match(s)
        if m:
            lvl.request_count = int(m.group(1))
            return True
        m = _PA_TPUT.match(s)
        if m:
            lvl.throughput = float(m.group(1))
            return True
        m = _PA_AVG.match(s)
        if m:
            lvl.latency_mean = _ms(m.group(1), m.group(2))
            if m.group(3):
                lvl.latency_std = _ms(m.group(3), m.group(2))
            return True
        m = _PA_PCT.match(s)
        if m:
            lvl.percentiles[f"p{m.group(1)}"] = _ms(m.group(2), m.group(3))
            return True
        m = _PA_TRANSPORT.match(s)
        if m:
            lvl.transport_ms = _ms(m.group(2), m.group(3))
            io = [_ms(v, u) for part, v, u in _PA_TRANSPORT_PART.findall(s[m.end():]) if part != "response wait"]
            lvl.transport_io_ms = sum(io) if io else None
            return True
        return False

    def _server(self, lvl: BenchLevel, s: str) -> bool:
        m = _PA_INFER.match(s)
        if m:
            lvl.server_inferences = int(m.group(1))
            return True
        m = _PA_EXEC.match(s)
        if m:
            lvl.server_executions = int(m.group(1))
            return True
        m = _PA_SUCCESS.match(s)
        if m:
            lvl.server_requests = int(m.group(1))
            return True
        m = _PA_SERVER.match(s)
        if m and lvl.server_latency is None:
            lvl.server_latency = _ms(m.group(1), m.group(2))
            rest = m.group(3)
            for pm in _PA_PART.finditer(rest):
                lvl.server_parts[pm.group(1).replace(" ", "_")] = _ms(pm.group(2), pm.group(3))
            lvl.server_breakdown_complete = rest.rstrip().endswith(")") and (
                "compute_output" in lvl.server_parts or "compute" in lvl.server_parts)
            return True
        m = _PA_TOTAL.match(s)
        if m and lvl.server_latency is not None:
            lvl.server_parts[m.group(1).replace(" ", "_")] = _ms(m.group(2), m.group(3))
            lvl.ensemble_totals = True
            lvl.server_breakdown_complete = all(
                k in lvl.server_parts for k in ("compute_input", "compute_infer", "compute_output", "queue"))
            return True
        return False

    def _composing(self, lvl: BenchLevel, s: str) -> bool:
        m = _PA_COMPOSING.match(s)
        if m:
            if len(lvl.composing) < 32:
                lvl.composing.append(ComposingModel(m.group(1)))
            return True
        if not lvl.composing:
            return False
        model = lvl.composing[-1]
        if _PA_INFER.match(s) or _PA_EXEC.match(s) or _PA_SUCCESS.match(s):
            return True
        m = _PA_SERVER.match(s)
        if m and model.latency is None:
            model.latency = _ms(m.group(1), m.group(2))
            for pm in _PA_PART.finditer(m.group(3)):
                model.parts[pm.group(1).replace(" ", "_")] = _ms(pm.group(2), pm.group(3))
            return True
        return False

    # -- hey / boom -----------------------------------------------------------------------------------
    def _hey_line(self, s: str) -> bool:
        """hey's (and boom's, its earlier name) summary: "Summary:", then "Total: 169.0645 secs", "Slowest:",
        "Fastest:", "Average: 0.4214 secs", "Requests/sec: 118.2981", a histogram, "Latency distribution:" with
        "50% in 0.4500 secs" lines, and "[200]\t20000 responses". Its concurrency (-c) is not printed."""
        if s == "Summary:":
            self._hey = BenchLevel("hey")
            self.levels.append(self._hey)
            self._dist = ""
            return True
        lvl = self._hey
        if lvl is None:
            return False
        m = _HEY_FIELD.match(s)
        if m:
            key, value = m.group(1).lower(), float(m.group(2))
            if key == "average":
                lvl.latency_mean = value * 1000.0
            elif key == "requests/sec":
                lvl.throughput = value
            elif key == "slowest":
                lvl.percentiles["p100"] = value * 1000.0
            return True
        if s == "Latency distribution:":
            self._dist = "hey"
            return True
        if self._dist == "hey":
            m = _HEY_DIST.match(s)
            if m:
                lvl.percentiles[f"p{m.group(1)}"] = float(m.group(2)) * 1000.0
                return True
            self._dist = ""
        m = _HEY_STATUS.match(s)
        if m:
            lvl.request_count = (lvl.request_count or 0) + int(m.group(2)) if m.group(1).startswith("2") \
                else lvl.request_count
            return True
        return False

    # -- wrk ----------------------------------------------------------------------------------------
    def _wrk_level(self) -> BenchLevel:
        if self._wrk is None:
            self._wrk = BenchLevel("wrk")
            self.levels.append(self._wrk)
        return self._wrk

    def _wrk_line(self, s: str) -> bool:
        if s.startswith("Running ") and " test @ " in s:
            self._wrk = BenchLevel("wrk")
            self.levels.append(self._wrk)
            self._dist = ""
            return True
        m = _WRK_CONNS.match(s)
        if m:
            self._wrk_level().concurrency = int(m.group(2))
            return True
        m = _WRK_LAT.match(s)
        if m and self._wrk is not None:
            self._wrk.latency_mean = _ms(m.group(1), m.group(2))
            self._wrk.latency_std = _ms(m.group(3), m.group(4))
            return True
        if s == "Latency Distribution" and self._wrk is not None:
            self._dist = "wrk"
            return True
        if self._dist == "wrk" and self._wrk is not None:
            m = _WRK_DIST.match(s)
            if m:
                q = m.group(1).rstrip("0").rstrip(".") if "." in m.group(1) else m.group(1)
                self._wrk.percentiles[f"p{q}"] = _ms(m.group(2), m.group(3))
                return True
            self._dist = ""
        m = _WRK_REQS.match(s)
        if m and self._wrk is not None:
            self._wrk.request_count = int(m.group(1))
            return True
        m = _WRK_RPS.match(s)
        if m and self._wrk is not None:
            self._wrk.throughput = float(m.group(1))
            return True
        return False

    # -- trtexec -------------------------------------------------------------------------------------
    def _trtexec(self, s: str) -> bool:
        s = _TRT_PREFIX.sub("", s)
        if "Performance summary" in s and _TRT_SUMMARY.search(s):
            self._trt = BenchLevel("trtexec")
            self.levels.append(self._trt)
            return True
        lvl = self._trt
        if lvl is None:
            return False
        m = _TRT_QPS.match(s)
        if m:
            lvl.throughput = float(m.group(1))
            return True
        m = _TRT_STAT.match(s)
        if m:
            what, mean = m.group("what"), float(m.group("mean"))
            part = _TRT_PARTS.get(what)
            if part is not None:
                lvl.device_parts[part] = mean
            elif what == "Latency":
                lvl.latency_mean = mean
                for name, value in (("p50", m.group("median")), ("p99", m.group("p99"))):
                    if value is not None:
                        lvl.percentiles[name] = float(value)
            return True
        m = _TRT_TOTAL.match(s)
        if m:
            seconds = float(m.group(2))
            if m.group(1) == "Host Walltime":
                self._trt_wall = seconds
            elif self._trt_wall:
                lvl.gpu_busy = seconds / self._trt_wall
            return True
        return False

    # -- ApacheBench --------------------------------------------------------------------------------
    def _ab_line(self, s: str) -> bool:
        m = _AB_CONC.match(s)
        if m:
            self._ab = BenchLevel("ab", concurrency=int(m.group(1)))
            self.levels.append(self._ab)
            return True
        if self._ab is None:
            return False
        m = _AB_DONE.match(s)
        if m:
            self._ab.request_count = int(m.group(1))
            return True
        m = _AB_RPS.match(s)
        if m:
            self._ab.throughput = float(m.group(1))
            return True
        m = _AB_TPR.match(s)
        if m and self._ab.latency_mean is None:  # the first one is per request; the second per concurrency
            self._ab.latency_mean = float(m.group(1))
            return True
        if s.startswith("Percentage of the requests served within"):
            self._dist = "ab"
            return True
        if self._dist == "ab":
            m = _AB_PCT.match(s)
            if m:
                self._ab.percentiles[f"p{m.group(1)}"] = float(m.group(2))
                return True
            self._dist = ""
        return False

    # ------------------------------------------------------------------------------------------
    def matched(self) -> bool:
        return any(_useful(lvl) for lvl in self.levels) or bool(self.summaries)

    def results(self) -> list[BenchLevel]:
        """Measured levels in the order they appear; summary-only levels filled in from the summary."""
        out = [lvl for lvl in self.levels if _useful(lvl)]
        have = {lvl.concurrency for lvl in out if lvl.tool == "perf_analyzer"}
        for conc, (tput, lat) in sorted(self.summaries.items()):
            if conc not in have:
                out.append(BenchLevel("perf_analyzer", concurrency=conc, batch_size=self.batch_size,
                                      throughput=tput, latency_mean=lat))
        return out


def _useful(lvl: BenchLevel) -> bool:
    return (lvl.throughput is not None or lvl.latency_mean is not None or lvl.server_latency is not None
            or bool(lvl.device_parts))
