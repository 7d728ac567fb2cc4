"""NVIDIA dcgm-exporter metrics → per-GPU series, from a scrape or a Prometheus query result.

Two forms are read, both pure (no network here):

* **text exposition** (``curl http://NODE:9400/metrics``): ``DCGM_FI_*`` samples with or without
  ``# HELP``/``# TYPE``, one scrape or several (split at ``# scrape at …`` comments, at a repeated
  ``# HELP``/``# TYPE`` or at a series that repeats, as ``diagnose.collectors.prom`` does), sample
  timestamps (ms) honoured; dcgm-exporter 1.x names (``dcgm_gpu_utilization`` …) too.
  ``DcgmBuffer.feed(line)`` keeps only DCGM lines, bounded.
* **Prometheus query JSON** (``/api/v1/query_range`` → ``"resultType": "matrix"``, or
  ``/api/v1/query`` → ``"vector"``): ``parse_query_json`` / ``parse_query_result``.

``FIELDS`` is the one table of DCGM fields diagnose reads, each with its canonical name and unit
(MiB → bytes, % → ratio, …). Labels identify the GPU (``UUID``, else ``Hostname`` + ``gpu``; a MIG
instance adds ``GPU_I_ID``) and who uses it: Kubernetes ``pod``/``namespace``/``container`` as
dcgm-exporter writes them, or ``exported_pod``/``exported_namespace``/``exported_container`` when
Prometheus renamed them (the scrape job's own ``pod`` label won, ``honor_labels: false``), or the
1.x ``pod_name``/``pod_namespace``/``container_name``. A GPU shared by several pods (time-slicing)
is reported once per pod: the device's values are kept once, the pods are listed.

Sources: field names and units from NVIDIA/dcgm-exporter ``etc/default-counters.csv``,
``etc/dcp-metrics-included.csv`` and ``etc/1.x-compatibility-metrics.csv``, and DCGM's
``dcgm_fields.h`` (https://github.com/NVIDIA/DCGM); the Kubernetes labels from dcgm-exporter issues
#58, #85 and #188 (https://github.com/NVIDIA/dcgm-exporter/issues/85: ``exported_pod``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from diagnose.collectors.prom import SCRAPE_COMMENT, scrape_time
from diagnose.units import KIB, MIB

MAX_SAMPLES = 500_000  # lines kept from one input: a node of 8 GPUs exposes ~200 per scrape
MAX_JSON_CHARS = 256 * 1024 * 1024  # a query result bigger than this is not read whole


@dataclass(frozen=True)
class Field:
    """One DCGM field: the exposed names that mean it, its canonical name and unit.

    ``scale`` converts the exposed value to ``unit``; ``counter`` fields are cumulative (deltas
    and rates are taken between points); ``ratio_or_pct``: a 0..1 ratio that some exporters
    (dcgm-exporter 1.x's ``dcgm_fi_prof_*``) expose in percent — a value above 1 is divided by 100.
    """

    canonical: str
    names: tuple[str, ...]
    unit: str
    scale: float = 1.0
    counter: bool = False
    ratio_or_pct: bool = False
    doc: str = ""


FIELDS: tuple[Field, ...] = (
    # utilisation
    Field("util", ("DCGM_FI_DEV_GPU_UTIL", "dcgm_gpu_utilization"), "ratio", 0.01,
          doc="share of the sample period in which a kernel ran (NVML utilization.gpu): not how much of the GPU"),
    Field("mem_copy_util", ("DCGM_FI_DEV_MEM_COPY_UTIL", "dcgm_mem_copy_utilization"), "ratio", 0.01,
          doc="share of the sample period device memory was read or written"),
    Field("enc_util", ("DCGM_FI_DEV_ENC_UTIL", "dcgm_enc_utilization"), "ratio", 0.01),
    Field("dec_util", ("DCGM_FI_DEV_DEC_UTIL", "dcgm_dec_utilization"), "ratio", 0.01),
    # profiling (DCP) metrics: measured over the sample period in hardware
    Field("gr_engine_active", ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "dcgm_fi_prof_gr_engine_active"), "ratio",
          ratio_or_pct=True, doc="share of time the graphics/compute engine was active"),
    Field("sm_active", ("DCGM_FI_PROF_SM_ACTIVE", "dcgm_fi_prof_sm_active"), "ratio", ratio_or_pct=True,
          doc="share of cycles an SM had at least one warp, averaged over all SMs"),
    Field("sm_occupancy", ("DCGM_FI_PROF_SM_OCCUPANCY", "dcgm_fi_prof_sm_occupancy"), "ratio", ratio_or_pct=True,
          doc="resident warps / the SMs' maximum"),
    Field("tensor_active", ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "dcgm_fi_prof_pipe_tensor_active"), "ratio",
          ratio_or_pct=True, doc="share of cycles the tensor (HMMA) pipe was active"),
    Field("dram_active", ("DCGM_FI_PROF_DRAM_ACTIVE", "dcgm_fi_prof_dram_active"), "ratio", ratio_or_pct=True,
          doc="share of cycles the device memory interface was sending or receiving"),
    Field("fp16_active", ("DCGM_FI_PROF_PIPE_FP16_ACTIVE",), "ratio", ratio_or_pct=True),
    Field("fp32_active", ("DCGM_FI_PROF_PIPE_FP32_ACTIVE",), "ratio", ratio_or_pct=True),
    # memory (framebuffer), MiB
    Field("fb_used", ("DCGM_FI_DEV_FB_USED", "dcgm_fb_used"), "bytes", MIB),
    Field("fb_free", ("DCGM_FI_DEV_FB_FREE", "dcgm_fb_free"), "bytes", MIB),
    Field("fb_reserved", ("DCGM_FI_DEV_FB_RESERVED",), "bytes", MIB),
    Field("fb_total", ("DCGM_FI_DEV_FB_TOTAL",), "bytes", MIB),
    # PCIe and NVLink
    Field("pcie_tx", ("DCGM_FI_PROF_PCIE_TX_BYTES",), "bytes/s", doc="device → host, bytes per second"),
    Field("pcie_rx", ("DCGM_FI_PROF_PCIE_RX_BYTES",), "bytes/s", doc="host → device, bytes per second"),
    Field("pcie_tx_total", ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "dcgm_pcie_tx_throughput"), "bytes", KIB, counter=True),
    Field("pcie_rx_total", ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "dcgm_pcie_rx_throughput"), "bytes", KIB, counter=True),
    Field("pcie_tx_bytes_total", ("dcgm_fi_prof_pcie_tx_bytes",), "bytes", counter=True),
    Field("pcie_rx_bytes_total", ("dcgm_fi_prof_pcie_rx_bytes",), "bytes", counter=True),
    Field("pcie_replay", ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "dcgm_pcie_replay_counter"), "count", counter=True),
    Field("pcie_gen", ("DCGM_FI_DEV_PCIE_LINK_GEN",), "gen"),
    Field("pcie_width", ("DCGM_FI_DEV_PCIE_LINK_WIDTH",), "lanes"),
    Field("pcie_gen_max", ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN",), "gen"),
    Field("pcie_width_max", ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",), "lanes"),
    Field("nvlink_tx", ("DCGM_FI_PROF_NVLINK_TX_BYTES",), "bytes/s"),
    Field("nvlink_rx", ("DCGM_FI_PROF_NVLINK_RX_BYTES",), "bytes/s"),
    Field("nvlink_total", ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "dcgm_nvlink_bandwidth_total"), "count",
          counter=True),
    # clocks, power, temperature
    Field("sm_clock", ("DCGM_FI_DEV_SM_CLOCK", "dcgm_sm_clock"), "MHz"),
    Field("mem_clock", ("DCGM_FI_DEV_MEM_CLOCK", "dcgm_memory_clock"), "MHz"),
    Field("sm_clock_max", ("DCGM_FI_DEV_MAX_SM_CLOCK",), "MHz"),
    Field("power", ("DCGM_FI_DEV_POWER_USAGE", "dcgm_power_usage"), "W"),
    Field("power_limit", ("DCGM_FI_DEV_POWER_MGMT_LIMIT",), "W"),
    Field("power_limit_enforced", ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT",), "W"),
    Field("power_limit_default", ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF",), "W"),
    Field("energy", ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "dcgm_total_energy_consumption"), "mJ", counter=True),
    Field("temp", ("DCGM_FI_DEV_GPU_TEMP", "dcgm_gpu_temp"), "°C"),
    Field("memory_temp", ("DCGM_FI_DEV_MEMORY_TEMP", "dcgm_memory_temp"), "°C"),
    Field("slowdown_temp", ("DCGM_FI_DEV_SLOWDOWN_TEMP",), "°C"),
    # throttling: the NVML clock-event bitmask (same bits), and violation counters (µs; ns in newer builds)
    Field("throttle_reasons", ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"), "bitmask"),
    Field("power_violation", ("DCGM_FI_DEV_POWER_VIOLATION", "dcgm_power_violation"), "us", counter=True),
    Field("thermal_violation", ("DCGM_FI_DEV_THERMAL_VIOLATION", "dcgm_thermal_violation"), "us", counter=True),
    Field("board_limit_violation", ("DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",), "us", counter=True),
    # errors
    Field("xid", ("DCGM_FI_DEV_XID_ERRORS", "dcgm_xid_errors"), "xid",
          doc="the last XID error the driver reported (kept until the next one); 0: none"),
    Field("ecc_dbe", ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",), "count", counter=True),
    Field("row_remap_failure", ("DCGM_FI_DEV_ROW_REMAP_FAILURE",), "flag"),
    Field("uncorrectable_remapped_rows", ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",), "count", counter=True),
    # virtualisation
    Field("vgpu_license_status", ("DCGM_FI_DEV_VGPU_LICENSE_STATUS",), "status"),
)

BY_NAME: dict[str, Field] = {}
for _f in FIELDS:
    for _n in _f.names:
        if _n in BY_NAME:
            raise RuntimeError(f"DCGM field {_n} is listed twice")
        BY_NAME[_n] = _f
BY_CANONICAL: dict[str, Field] = {f.canonical: f for f in FIELDS}

# literal anchors of every exposition line ``DcgmBuffer.feed`` acts on
TRIGGERS: tuple[str, ...] = ("DCGM_FI_", "dcgm_")

# labels naming who uses the GPU, in order of preference (Prometheus renames a clash to exported_*)
POD_LABELS = ("pod", "exported_pod", "pod_name")
NAMESPACE_LABELS = ("namespace", "exported_namespace", "pod_namespace")
CONTAINER_LABELS = ("container", "exported_container", "container_name")
# labels describing the device itself (not who uses it, not the scrape)
DEVICE_LABELS = frozenset({"gpu", "UUID", "uuid", "device", "modelName", "Hostname", "hostname", "pci_bus_id",
                           "DCGM_FI_DRIVER_VERSION", "GPU_I_ID", "GPU_I_PROFILE", "DCGM_FI_DEV_UUID"})


@dataclass(frozen=True)
class Gpu:
    """One GPU (or MIG instance) as dcgm-exporter labels it."""

    key: str  # unique within an input: UUID[/MIG instance], else host/gpu index
    index: str = ""
    uuid: str = ""
    model: str = ""
    hostname: str = ""
    driver: str = ""
    mig_profile: str = ""
    mig_instance: str = ""
    labels: tuple[tuple[str, str], ...] = ()  # every other label (Prometheus job/instance, node …)

    @property
    def label(self) -> str:
        name = f"GPU {self.index or '?'}" + (f" ({self.model})" if self.model else "")
        if self.mig_profile or self.mig_instance:
            name += f" MIG {self.mig_profile or ''} #{self.mig_instance or '?'}".replace("  ", " ")
        return name + (f" on {self.hostname}" if self.hostname else "")

    def get(self, name: str) -> str:
        return dict(self.labels).get(name, "")


@dataclass(frozen=True)
class Pod:
    namespace: str
    pod: str
    container: str = ""

    @property
    def name(self) -> str:
        return f"{self.namespace}/{self.pod}" if self.namespace else self.pod


@dataclass
class GpuSeries:
    """Everything read about one GPU: its points per canonical field, and the pods seen on it."""

    gpu: Gpu
    points: dict[str, list[tuple[float | None, float]]] = field(default_factory=dict)
    pods: list[Pod] = field(default_factory=list)

    def values(self, canonical: str) -> list[float]:
        return [v for _, v in self.points.get(canonical, ())]


@dataclass(frozen=True)
class DcgmResult:
    """A parsed input: its GPUs, how many scrapes (or points), and what could not be read."""

    gpus: tuple[GpuSeries, ...]
    form: str  # "exposition" | "query-json"
    scrapes: int  # scrapes (exposition) or the most points of one series (query JSON)
    window_s: float | None  # first to last timestamp, when known
    problems: tuple[str, ...] = ()
    unknown_fields: tuple[str, ...] = ()  # DCGM_FI_* names seen that FIELDS does not list

    @property
    def fields(self) -> set[str]:
        return {c for g in self.gpus for c in g.points}


_LINE = re.compile(r"^(?:#\s*(HELP|TYPE)\s+)?([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*?\})?(?=\s|$)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def _is_dcgm_name(name: str) -> bool:
    return name.startswith("DCGM_FI_") or name.startswith("dcgm_")


def parse_labels(text: str) -> dict[str, str]:
    """``{a="1",b="x\\"y"}`` → ``{"a": "1", "b": 'x"y'}``."""
    return {k: v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\") for k, v in _LABEL.findall(text)}


def _first(labels: Mapping[str, str], names: Iterable[str]) -> str:
    for n in names:
        v = labels.get(n, "")
        if v:
            return v
    return ""


def gpu_of(labels: Mapping[str, str]) -> tuple[Gpu, Pod | None]:
    """The GPU a series' labels describe, and the pod using it (None when no pod label is set)."""
    uuid = labels.get("UUID") or labels.get("uuid") or labels.get("DCGM_FI_DEV_UUID") or ""
    host = labels.get("Hostname") or labels.get("hostname") or ""
    index = labels.get("gpu", "")
    mig = labels.get("GPU_I_ID", "")
    key = (uuid or f"{host or labels.get('instance', '')}/{index or labels.get('device', '?')}") + (
        f"/mig{mig}" if mig else "")
    pod_labels = set(POD_LABELS) | set(NAMESPACE_LABELS) | set(CONTAINER_LABELS)
    extra = tuple(sorted((k, v) for k, v in labels.items()
                         if k not in DEVICE_LABELS and k not in pod_labels and k != "__name__"))
    gpu = Gpu(key=key, index=index, uuid=uuid, model=labels.get("modelName", ""), hostname=host,
              driver=labels.get("DCGM_FI_DRIVER_VERSION", ""), mig_profile=labels.get("GPU_I_PROFILE", ""),
              mig_instance=mig, labels=extra)
    pod = _first(labels, POD_LABELS)
    return gpu, (Pod(_first(labels, NAMESPACE_LABELS), pod, _first(labels, CONTAINER_LABELS)) if pod else None)


def _value(f: Field, raw: float) -> float:
    if f.ratio_or_pct and raw > 1.0:
        raw /= 100.0
    return raw * f.scale


class _Collect:
    """Points per GPU and field, deduplicated per scrape (a shared GPU is listed once per pod)."""

    def __init__(self) -> None:
        self.by_key: dict[str, GpuSeries] = {}
        self.unknown: dict[str, None] = {}
        self.seen: set[tuple[str, str, int]] = set()

    def add(self, name: str, labels: Mapping[str, str], points: Iterable[tuple[float | None, float]],
            scrape: int = 0) -> None:
        f = BY_NAME.get(name)
        if f is None:
            if name.startswith("DCGM_FI_"):
                self.unknown.setdefault(name)
            return
        gpu, pod = gpu_of(labels)
        series = self.by_key.get(gpu.key)
        if series is None:
            series = self.by_key[gpu.key] = GpuSeries(gpu)
        if pod is not None and pod not in series.pods:
            series.pods.append(pod)
        mark = (gpu.key, f.canonical, scrape)
        if mark in self.seen:
            return  # the same device value again, labelled with another pod sharing the GPU
        self.seen.add(mark)
        got = series.points.setdefault(f.canonical, [])
        for ts, raw in points:
            if not math.isnan(raw) and not math.isinf(raw):
                got.append((ts, _value(f, raw)))

    def result(self, form: str, scrapes: int, problems: Sequence[str]) -> DcgmResult:
        gpus = tuple(s for s in self.by_key.values() if s.points)
        for s in gpus:
            for pts in s.points.values():
                if all(ts is not None for ts, _ in pts):
                    pts.sort(key=lambda p: p[0] or 0.0)
        stamps = [ts for s in gpus for pts in s.points.values() for ts, _ in pts if ts is not None]
        window = (max(stamps) - min(stamps)) if len(stamps) >= 2 and max(stamps) > min(stamps) else None
        return DcgmResult(gpus=gpus, form=form, scrapes=scrapes, window_s=window, problems=tuple(problems),
                          unknown_fields=tuple(self.unknown))


@dataclass
class _Scrape:
    series: set[str] = field(default_factory=set)
    helps: set[str] = field(default_factory=set)
    types: set[str] = field(default_factory=set)
    at: float | None = None
    samples: int = 0


class DcgmBuffer:
    """Streaming reader of dcgm-exporter text exposition: feed lines, then ``result()``."""

    def __init__(self, max_samples: int = MAX_SAMPLES) -> None:
        self.max_samples = max_samples
        self._c = _Collect()
        self._scrape = _Scrape()
        self._index = 0
        self._samples = 0
        self._truncated = False
        self._bad = 0
        self.recognised = 0

    def _new_scrape(self, at: float | None = None) -> None:
        if self._scrape.samples:
            self._index += 1
            self._scrape = _Scrape(at=at)
        elif at is not None:
            self._scrape.at = at

    def feed(self, line: str) -> bool:
        """Offer one line; True when it is a DCGM sample or its HELP/TYPE."""
        if not line:
            return False
        if line[0] == "#":
            m = SCRAPE_COMMENT.match(line)
            if m:
                self._new_scrape(scrape_time(m.group(1)))
                return False
        elif line[0] not in "Dd":
            return False
        m = _LINE.match(line)
        if not m or not _is_dcgm_name(m.group(2)):
            return False
        directive, name = m.group(1), m.group(2)
        s = self._scrape
        if directive:
            seen = s.helps if directive == "HELP" else s.types
            if name in seen:
                self._new_scrape()
                s = self._scrape
            (s.helps if directive == "HELP" else s.types).add(name)
            self.recognised += 1
            return True
        rest = line[m.end():].split()
        if not rest:
            return False
        try:
            raw = float(rest[0])
        except ValueError:
            self._bad += 1
            return False
        ts: float | None = None
        if len(rest) > 1:
            try:
                ts = float(rest[1]) / 1000.0  # exposition timestamps are milliseconds
            except ValueError:
                ts = None
        key = name + (m.group(3) or "")
        if key in s.series:
            self._new_scrape()
            s = self._scrape
        s.series.add(key)
        s.samples += 1
        self.recognised += 1
        if self._samples >= self.max_samples:
            self._truncated = True
            return True
        self._samples += 1
        labels = parse_labels(m.group(3) or "")
        self._c.add(name, labels, [(ts if ts is not None else s.at, raw)], self._index)
        return True

    def matched(self) -> bool:
        return self.recognised > 0

    def result(self) -> DcgmResult:
        problems: list[str] = []
        if self._truncated:
            problems.append(f"more than {self.max_samples} DCGM samples: the rest was not read")
        if self._bad:
            problems.append(f"{self._bad} DCGM line(s) had no numeric value")
        scrapes = self._index + (1 if self._scrape.samples else 0)
        res = self._c.result("exposition", scrapes, problems)
        # scrapes without times are ordered only: count them, never invent a window
        return res


# -- Prometheus query JSON ---------------------------------------------------------------------


class QueryResultReader:
    """Reads query answers one at a time into one result, so that a caller asking field by field never
    holds more than one answer's JSON (``diagnose fleet`` over hundreds of GPUs)."""

    def __init__(self) -> None:
        self._c = _Collect()
        self._most = 0
        self._bad = 0

    def add(self, result_type: str, result: Sequence[Mapping[str, Any]]) -> None:
        most, bad = _read_result(self._c, result_type, result)
        self._most = max(self._most, most)
        self._bad += bad

    def result(self) -> DcgmResult:
        problems = [f"{self._bad} series or point(s) of the query result could not be read"] if self._bad else []
        return self._c.result("query-json", self._most, problems)


def parse_query_result(result_type: str, result: Sequence[Mapping[str, Any]]) -> DcgmResult:
    """The ``data.result`` of a Prometheus ``query`` (vector) or ``query_range`` (matrix) answer."""
    reader = QueryResultReader()
    reader.add(result_type, result)
    return reader.result()


def _read_result(c: _Collect, result_type: str, result: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    most = 0
    bad = 0
    for item in result:
        if not isinstance(item, Mapping):
            bad += 1
            continue
        metric = item.get("metric") or {}
        if not isinstance(metric, Mapping):
            bad += 1
            continue
        name = str(metric.get("__name__", ""))
        labels = {str(k): str(v) for k, v in metric.items()}
        raw_points: list[Any] = list(item.get("values") or ()) if result_type == "matrix" else [item.get("value")]
        points: list[tuple[float | None, float]] = []
        for p in raw_points or ():
            try:
                points.append((float(p[0]), float(p[1])))
            except (TypeError, ValueError, IndexError):
                bad += 1
        most = max(most, len(points))
        if not name:
            bad += 1
            continue
        c.add(name, labels, points)
    return most, bad


def parse_query_json(doc: Any) -> DcgmResult | None:
    """A whole API answer (``{"status": "success", "data": {...}}``, or its ``data``); None if not one."""
    if isinstance(doc, Mapping) and "data" in doc and isinstance(doc["data"], Mapping):
        doc = doc["data"]
    if not isinstance(doc, Mapping):
        return None
    rtype, result = doc.get("resultType"), doc.get("result")
    if rtype not in ("matrix", "vector") or not isinstance(result, list):
        return None
    return parse_query_result(str(rtype), result)


SNIFF_CHARS = 1 << 20  # a query answer names its resultType within its first MiB


def _complete_other_json(line: str) -> bool:
    """A first line that is a whole JSON object but no query answer (a JSON-lines log)."""
    if not line.rstrip().endswith("}"):
        return False
    try:
        doc = json.loads(line)
    except ValueError:
        return False
    return parse_query_json(doc) is None


# a complete {"metric": {...}, "values"|"value": [...]} object: recovers the series of a result cut short
_SERIES_OBJ = re.compile(r'\{\s*"metric"\s*:\s*\{[^{}]*\}\s*,\s*"values?"\s*:\s*\[(?:[^\[\]]|\[[^\[\]]*\])*\]\s*\}')


class QueryJsonBuffer:
    """Collects the lines of a JSON document (a pasted query result) and parses it at the end.

    Only an input whose first non-blank character is ``{`` is kept, up to ``MAX_JSON_CHARS``.
    When the text is cut (a paste, a line longer than the reader takes), the complete series
    objects in it are still read, and the result says it is partial.
    """

    def __init__(self, max_chars: int = MAX_JSON_CHARS) -> None:
        self.max_chars = max_chars
        self._parts: list[str] = []
        self._chars = 0
        self._state = "start"  # start → collecting → (rejected)
        self._result: DcgmResult | None = None
        self._done = False
        self._sniffed = False

    def feed(self, line: str) -> None:
        if self._state == "rejected":
            return
        if self._state == "start":
            stripped = line.lstrip()
            if not stripped:
                return
            if not stripped.startswith("{") or _complete_other_json(stripped):
                self._state = "rejected"  # not JSON, or JSON lines (a stage log): never a query answer
                return
            self._state = "collecting"
        elif self._chars > SNIFF_CHARS and not self._sniffed:
            if '"resultType"' not in "\n".join(self._parts):
                self._state = "rejected"
                self._parts.clear()
                return
            self._sniffed = True
        if self._chars + len(line) > self.max_chars:
            self._state = "rejected"
            self._parts.clear()
            return
        self._parts.append(line)
        self._chars += len(line) + 1

    def result(self) -> DcgmResult | None:
        if self._done:
            return self._result
        self._done = True
        if self._state != "collecting":
            return None
        text = "\n".join(self._parts)
        self._parts = []
        if "DCGM_FI_" not in text and "dcgm_" not in text:
            return None
        try:
            self._result = parse_query_json(json.loads(text))
            return self._result
        except ValueError:
            pass
        if '"resultType"' not in text:
            return None
        rtype = "matrix" if '"matrix"' in text else "vector"
        items = []
        for m in _SERIES_OBJ.finditer(text):
            try:
                items.append(json.loads(m.group(0)))
            except ValueError:
                continue
        if not items:
            return None
        res = parse_query_result(rtype, items)
        why = ("the query result is not complete JSON (cut short, or a line longer than the reader takes): "
               f"the {len(items)} complete series in it were read")
        self._result = DcgmResult(res.gpus, res.form, res.scrapes, res.window_s, (*res.problems, why),
                                  res.unknown_fields)
        return self._result


# -- datasheet values, for scrapes that lack the limit fields ---------------------------------------
# (board power W, max SM boost clock MHz). Only models whose figures were checked against public spec
# pages (https://topcpu.net/en/gpu-c/l4-vs-tesla-t4): T4 70 W / 1590 MHz, L4 72 W / 2040 MHz.
SPECS: dict[str, tuple[float, float]] = {
    "Tesla T4": (70.0, 1590.0),
    "NVIDIA T4": (70.0, 1590.0),
    "NVIDIA L4": (72.0, 2040.0),
}


def spec_of(model: str) -> tuple[float, float] | None:
    return SPECS.get(model.strip())
