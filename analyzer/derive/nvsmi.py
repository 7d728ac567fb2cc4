"""``nvidia-smi`` output, every form → the ``gpu.*`` and ``pcie.*`` keys NVML gives, so the same rules judge it.

Readings (one GPU at one instant) are folded into running aggregates per device as they are
parsed, so a day of ``--query-gpu … -l 1`` costs a few hundred bytes per GPU. Aggregation follows
``diagnose.derive.nvml``, and why:

- Utilisation (nvidia-smi's ``utilization.gpu``, dmon's ``sm``: the share of the sample period a
  kernel ran) is pooled over devices and readings: mean, p10, p90 and the largest reading.
  ``gpu.util_samples`` counts readings *per device* (the most any device has): two snapshots of
  eight GPUs are two instants, not sixteen. ``gpu.sampled_span_s`` is the time the readings cover,
  when they carry times.
- Memory is taken at its peak on one *focus* device: the one where memory outside the listed
  processes is the largest share, else the fullest.
- Memory outside the listed processes: in a document that lists processes (a table with its
  processes section, ``-q``, ``-q -x``, ``--query-compute-apps`` with ``--query-gpu``), a
  device's used memory minus what its listed processes hold; the largest share over the documents
  (``gpu.memory_unlisted_bytes``, ``gpu.memory_unlisted_share_ratio``). Not given when a process's
  memory is ``N/A`` (Windows WDDM): nobody can say then.
- The PCIe link is judged on readings where it is loaded (traffic ≥ 256 MiB/s or the GPU ≥ 50 %
  busy): idle links drop to a low generation to save power. Link keys describe the device whose
  link is furthest below its maximum.
- Clocks are averaged over busy readings; clock-event reasons are shares of the readings that
  report them (``gpu.throttle_ratio``: power cap, thermal and hardware slowdowns only). With
  several GPUs and one of them throttled (≥ 10 % of its readings), clock, reason and power keys
  describe that GPU (``gpu.throttled_device``): pooled, its throttling would vanish in the others'.
  ``dmon`` has no reasons but its violation columns (``pviol``, ``tviol``) answer the same question.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from diagnose.collectors.nvsmi import TRIGGERS, GpuProcess, GuessedCsvParser, NvsmiParser, Reading, Sink, Snapshot
from diagnose.collectors.nvsmi_base import REASON_BITS
from diagnose.collectors.nvsmi_table import FAILURES
from diagnose.derive.emit import Emit
from diagnose.derive.nvml import (
    BUSY_UTIL_PCT,
    FEW_SAMPLES,
    HW_BITS,
    LOADED_LINK_BYTES_PER_S,
    POWER_BITS,
    REASON_SHARE,
    THERMAL_BITS,
    THROTTLE_BITS,
    emit_throttle,
    link_bytes_per_s,
)
from diagnose.model import Evidence, Quality
from diagnose.units import pct, size

KIND = "nvidia-smi"
MAX_NA = 40  # distinct "field: N/A" notes kept


FORM_NAMES = {"table": "table", "q": "-q", "xml": "-q -x", "csv": "--query CSV", "dmon": "dmon", "pmon": "pmon"}


@dataclass
class Device:
    """Running aggregates of one GPU's readings."""

    index: int
    name: str = ""
    bus_id: str = ""
    forms: set[str] = field(default_factory=set)
    readings: int = 0
    util_hist: list[int] = field(default_factory=lambda: [0] * 101)
    util_n: int = 0
    util_sum: float = 0.0
    util_max: float = 0.0
    mem_util_n: int = 0
    mem_util_sum: float = 0.0
    mem_used_max: int | None = None
    mem_total: int | None = None
    ts_first: float | None = None
    ts_last: float | None = None
    sm_busy: list[float] = field(default_factory=lambda: [0.0, 0.0])  # sum, n over busy readings
    sm_all: list[float] = field(default_factory=lambda: [0.0, 0.0])
    sm_max: float | None = None
    memclk_busy: list[float] = field(default_factory=lambda: [0.0, 0.0])
    memclk_all: list[float] = field(default_factory=lambda: [0.0, 0.0])
    reasons_n: int = 0
    reason_counts: dict[str, int] = field(default_factory=dict)
    bits_counts: dict[int, int] = field(default_factory=dict)  # POWER/THERMAL/HW/THROTTLE → readings
    power: list[float] = field(default_factory=lambda: [0.0, 0.0])
    power_limit: float | None = None
    power_default: float | None = None
    temp_max: float | None = None
    temp_slow: float | None = None
    pviol: list[float] = field(default_factory=lambda: [0.0, 0.0])
    tviol: list[float] = field(default_factory=lambda: [0.0, 0.0])
    gen_loaded: int | None = None
    width_loaded: int | None = None
    gen_any: int | None = None
    width_any: int | None = None
    gen_max: int | None = None
    gen_gpu_max: int | None = None
    width_max: int | None = None
    loaded: int = 0
    link_readings: int = 0
    tx: list[float] = field(default_factory=lambda: [0.0, 0.0])
    rx: list[float] = field(default_factory=lambda: [0.0, 0.0])
    traffic_peak: float | None = None
    replays_first: int | None = None
    replays_last: int | None = None
    pstate: str = ""
    mig: bool = False

    def add(self, r: Reading) -> None:
        self.readings += 1
        self.forms.add(r.form)
        self.name = r.name or self.name
        self.bus_id = r.bus_id or self.bus_id
        self.pstate = r.pstate or self.pstate
        self.mig = self.mig or r.mig
        if r.ts is not None:
            self.ts_first = r.ts if self.ts_first is None else min(self.ts_first, r.ts)
            self.ts_last = r.ts if self.ts_last is None else max(self.ts_last, r.ts)
        if r.util_pct is not None and 0 <= r.util_pct <= 100:
            self.util_hist[round(r.util_pct)] += 1
            self.util_n += 1
            self.util_sum += r.util_pct
            self.util_max = max(self.util_max, r.util_pct)
        if r.mem_util_pct is not None:
            self.mem_util_n += 1
            self.mem_util_sum += r.mem_util_pct
        if r.mem_used is not None:
            self.mem_used_max = r.mem_used if self.mem_used_max is None else max(self.mem_used_max, r.mem_used)
        if r.mem_total:
            self.mem_total = r.mem_total
        busy = r.util_pct is not None and r.util_pct >= BUSY_UTIL_PCT
        for value, busy_acc, all_acc in ((r.sm_clock_mhz, self.sm_busy, self.sm_all),
                                         (r.mem_clock_mhz, self.memclk_busy, self.memclk_all)):
            if value is not None:
                all_acc[0] += value
                all_acc[1] += 1
                if busy:
                    busy_acc[0] += value
                    busy_acc[1] += 1
        if r.sm_clock_max_mhz:
            self.sm_max = max(self.sm_max or 0.0, r.sm_clock_max_mhz)
        if r.reasons is not None:
            self.reasons_n += 1
            mask = 0
            for name in r.reasons:
                self.reason_counts[name] = self.reason_counts.get(name, 0) + 1
                mask |= REASON_BITS.get(name, 0)
            for bits in (THROTTLE_BITS, POWER_BITS, THERMAL_BITS, HW_BITS):
                if mask & bits:
                    self.bits_counts[bits] = self.bits_counts.get(bits, 0) + 1
        if r.power_w is not None:
            self.power[0] += r.power_w
            self.power[1] += 1
        if r.power_limit_w:
            self.power_limit = r.power_limit_w if self.power_limit is None else min(self.power_limit, r.power_limit_w)
        if r.power_default_limit_w:
            self.power_default = max(self.power_default or 0.0, r.power_default_limit_w)
        if r.temp_c is not None:
            self.temp_max = r.temp_c if self.temp_max is None else max(self.temp_max, r.temp_c)
        if r.temp_slowdown_c:
            self.temp_slow = r.temp_slowdown_c if self.temp_slow is None else min(self.temp_slow, r.temp_slowdown_c)
        for value, acc in ((r.power_violation_pct, self.pviol), (r.thermal_violation_pct, self.tviol)):
            if value is not None:
                acc[0] += value
                acc[1] += 1
        self._link(r, busy)

    def _link(self, r: Reading, busy: bool) -> None:
        traffic = None
        if r.tx_bytes_per_s is not None or r.rx_bytes_per_s is not None:
            traffic = max(r.tx_bytes_per_s or 0.0, r.rx_bytes_per_s or 0.0)
            self.traffic_peak = max(self.traffic_peak or 0.0, traffic)
        for value, acc in ((r.tx_bytes_per_s, self.tx), (r.rx_bytes_per_s, self.rx)):
            if value is not None:
                acc[0] += value
                acc[1] += 1
        if r.replays is not None:
            self.replays_first = r.replays if self.replays_first is None else self.replays_first
            self.replays_last = r.replays
        self.gen_max = r.pcie_gen_max or self.gen_max
        self.gen_gpu_max = r.pcie_gen_gpu_max or self.gen_gpu_max
        self.width_max = r.pcie_width_max or self.width_max
        if r.pcie_gen is None or r.pcie_width is None:
            return
        self.link_readings += 1
        loaded = (traffic is not None and traffic >= LOADED_LINK_BYTES_PER_S) or busy
        self.gen_any = max(self.gen_any or 0, r.pcie_gen)
        self.width_any = max(self.width_any or 0, r.pcie_width)
        if loaded:
            self.loaded += 1
            self.gen_loaded = max(self.gen_loaded or 0, r.pcie_gen)
            self.width_loaded = max(self.width_loaded or 0, r.pcie_width)

    @property
    def label(self) -> str:
        return f"GPU {self.index}" + (f" ({self.name})" if self.name else "")

    def util_quantile(self, q: float) -> float | None:
        return _hist_quantile(self.util_hist, q)


def _hist_quantile(hist: Sequence[int], q: float) -> float | None:
    """The q-quantile of integer percentages from their histogram, interpolated as ``nvml.quantile``."""
    n = sum(hist)
    if not n:
        return None
    pos = q * (n - 1)
    lo, hi = math.floor(pos), math.ceil(pos)

    def at(k: int) -> float:
        acc = 0
        for v, c in enumerate(hist):
            acc += c
            if acc > k:
                return float(v)
        return 100.0

    a, b = at(lo), at(hi)
    return a + (b - a) * (pos - lo)


@dataclass
class _Unlisted:
    share: float
    bytes: int
    device: int
    used: int
    total: int
    listed: int
    n_procs: int
    form: str


class Collected:
    """What the parsers hand over, folded as it comes: devices, processes, memory outside them."""

    def __init__(self) -> None:
        self.devices: dict[int, Device] = {}
        self.processes: dict[tuple[int | None, int | None, str], GpuProcess] = {}
        self.listed = False
        self.snapshots = 0
        self.unlisted: _Unlisted | None = None
        self.unlisted_seen = False  # a document allowed the computation at all
        self.na_process_memory = 0
        self.mig: dict[tuple[int, str, str, str], Any] = {}
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.na: set[str] = set()

    def sink(self) -> Sink:
        return Sink(self.reading, self.snapshot, self._problem, self._note)

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def reading(self, r: Reading) -> None:
        self.devices.setdefault(r.gpu, Device(r.gpu)).add(r)
        for item in r.na:
            if len(self.na) < MAX_NA:
                self.na.add(item)

    def snapshot(self, s: Snapshot) -> None:
        self.snapshots += 1
        for p in s.processes:
            self.processes[(p.gpu, p.pid, p.name)] = p  # a later document replaces an earlier one
            if p.used is None and p.used_na:
                self.na_process_memory += 1
        for m in s.mig:
            self.mig[(m.gpu, m.gi, m.ci, m.dev)] = m
        for gpu, _used, total in s.memory:
            d = self.devices.get(gpu)
            if d is not None and total and not d.mem_total:
                d.mem_total = total
        if not s.listed:
            return
        self.listed = True
        by_gpu: dict[int | None, list[GpuProcess]] = {}
        for p in s.processes:
            by_gpu.setdefault(p.gpu, []).append(p)
        single = s.memory[0][0] if len(s.memory) == 1 else None
        for gpu, used, total in s.memory:
            if used is None or not total:
                continue
            procs = by_gpu.get(gpu, []) + (by_gpu.get(None, []) if gpu == single else [])
            if None in by_gpu and single is None:
                continue  # processes with no GPU named on a several-GPU machine: nobody can split them
            if any(p.used is None for p in procs):
                continue
            self.unlisted_seen = True
            held = sum(p.used or 0 for p in procs)
            outside = max(0, used - held)
            share = outside / total
            if self.unlisted is None or share > self.unlisted.share:
                self.unlisted = _Unlisted(share, outside, gpu, used, total, held, len(procs), s.form)


SAMPLED = ("gpu.util_ratio", "gpu.busy_ratio", "gpu.util_p10_ratio", "gpu.util_p90_ratio", "gpu.util_max_ratio",
           "gpu.mem_util_ratio", "gpu.sm_clock_mhz", "gpu.throttle_ratio", "gpu.power_cap_ratio",
           "gpu.thermal_throttle_ratio", "gpu.hw_slowdown_ratio", "gpu.power_w")


def evidence_of(c: Collected, source: str, forms: str) -> list[Evidence]:
    """The evidence for what was collected (see the module docstring for the aggregation)."""
    devs = [d for _, d in sorted(c.devices.items())]
    per_device = max((d.util_n for d in devs), default=0)
    ev = Emit(source)
    where = f"nvidia-smi {forms}" if forms else "nvidia-smi"
    if devs:
        count_detail = f"devices in {where}"
        if c.notes:
            count_detail += "; " + "; ".join(n for n in c.notes if "GPU" in n or "rows" in n)
        ev.add("gpu.count", len(devs), "gpus", count_detail)

    # utilisation
    hist = [sum(d.util_hist[v] for d in devs) for v in range(101)]
    util_n = sum(d.util_n for d in devs)
    if util_n:
        mean = sum(d.util_sum for d in devs) / util_n
        span = f"{per_device} reading(s) per GPU over {sum(1 for d in devs if d.util_n)} GPU(s)"
        ev.add("gpu.util_ratio", mean / 100.0, "ratio", f"mean utilization.gpu, {span} ({where})")
        ev.add("gpu.busy_ratio", mean / 100.0, "ratio", "share of time a kernel was running (utilization.gpu; copies "
               "alone do not count)")
        ev.add("gpu.util_p10_ratio", (_hist_quantile(hist, 0.10) or 0.0) / 100.0, "ratio", span)
        ev.add("gpu.util_p90_ratio", (_hist_quantile(hist, 0.90) or 0.0) / 100.0, "ratio", span)
        ev.add("gpu.util_max_ratio", max(d.util_max for d in devs) / 100.0, "ratio", "the busiest single reading")
        ev.add("gpu.util_samples", per_device, "samples", "utilisation readings per GPU (the most of any GPU)")
    mem_util_n = sum(d.mem_util_n for d in devs)
    if mem_util_n:
        ev.add("gpu.mem_util_ratio", sum(d.mem_util_sum for d in devs) / mem_util_n / 100.0, "ratio",
               "share of time device memory was read or written (utilization.memory)")
    firsts = [d.ts_first for d in devs if d.ts_first is not None]
    lasts = [d.ts_last for d in devs if d.ts_last is not None]
    if firsts and lasts and max(lasts) > min(firsts):
        ev.add("gpu.sampled_span_s", max(lasts) - min(firsts), "s", "from the first reading's time to the last one's")

    # memory, on the focus device
    with_total = [d for d in devs if d.mem_total]
    unl = c.unlisted
    if with_total:
        focus = next((d for d in with_total if unl is not None and unl.share > 0.0 and d.index == unl.device), None)
        if focus is None:
            focus = max(with_total, key=lambda d: (d.mem_used_max or 0) / (d.mem_total or 1))
        if focus.mem_used_max is not None:
            ev.add("gpu.memory_used_bytes", int(focus.mem_used_max), "bytes",
                   f"{focus.label}, the fullest of {len(with_total)}" if len(with_total) > 1
                   else f"{focus.label}, peak")
        ev.add("gpu.memory_total_bytes", int(focus.mem_total or 0), "bytes", focus.label)
    elif any(d.mem_used_max is not None for d in devs):
        fullest = max((d for d in devs if d.mem_used_max is not None), key=lambda d: d.mem_used_max or 0)
        ev.add("gpu.memory_used_bytes", int(fullest.mem_used_max or 0), "bytes",
               f"{fullest.label}, peak; the device's total is not in the input")
    if devs:
        ev.add("gpu.devices", [{
                "index": d.index, "name": d.name, "bus_id": d.bus_id, "memory_used_bytes": d.mem_used_max,
                "memory_total_bytes": d.mem_total, "util_ratio": (d.util_sum / d.util_n / 100.0) if d.util_n else None,
                "util_max_ratio": d.util_max / 100.0 if d.util_n else None, "samples": d.util_n, "pstate": d.pstate,
                "mig": d.mig} for d in devs], "list", where)

    # processes, and memory no listed process holds
    if c.processes:
        procs = sorted(c.processes.values(), key=lambda p: (-(p.used or 0), p.gpu or 0, p.pid or 0))
        rows: list[dict[str, Any]] = []
        for p in procs:
            row: dict[str, Any] = {"gpu": p.gpu, "pid": p.pid, "name": p.name, "used_bytes": p.used, "type": p.type}
            if p.gi or p.ci:
                row["gpu_instance"], row["compute_instance"] = p.gi, p.ci
            if p.sm_pct is not None:
                row["sm_ratio"] = p.sm_pct / 100.0
            rows.append(row)
        detail = f"{len(procs)} process(es) holding GPU memory ({where})"
        if c.na_process_memory:
            detail += (f"; the memory of {c.na_process_memory} is not reported (Windows WDDM prints N/A): memory "
                       "outside the listed processes cannot be computed")
        ev.add("gpu.processes", rows, "list", detail)
    elif c.listed:
        ev.add("gpu.processes", [], "list", "no process listed (`No running processes found` / an empty process list)")
    if unl is not None and c.unlisted_seen:
        d = c.devices.get(unl.device)
        label = d.label if d is not None else f"GPU {unl.device}"
        held = (f"its {unl.n_procs} listed process(es) hold {size(unl.listed, 1)}" if unl.n_procs
                else "no process is listed")
        ev.add("gpu.memory_unlisted_bytes", unl.bytes, "bytes",
               f"{label}: {size(unl.used, 1)} used of {size(unl.total, 1)}, {held} (nvidia-smi "
               f"{FORM_NAMES.get(unl.form, unl.form)})")
        ev.add("gpu.memory_unlisted_share_ratio", unl.share, "ratio",
               f"memory no listed process holds / {label}'s total")
    if c.mig:
        ev.add("gpu.mig_devices", [{"gpu": m.gpu, "gpu_instance": m.gi, "compute_instance": m.ci, "device": m.dev,
                                    "memory_used_bytes": m.used, "memory_total_bytes": m.total, "sm_count": m.sm_count}
                                   for m in c.mig.values()], "list", "MIG devices: each is a GPU of its own to CUDA")

    _link(devs, ev)
    _clocks(devs, ev)

    # temperature
    temps = [d.temp_max for d in devs if d.temp_max is not None]
    if temps:
        ev.add("gpu.temp_c", max(temps), "°C", "peak GPU temperature")
    slows = [d.temp_slow for d in devs if d.temp_slow]
    if slows:
        ev.add("gpu.temp_slowdown_c", min(slows), "°C", "temperature at which the GPU slows down")
    if c.na:
        ev.add("gpu.fields_unavailable", sorted(c.na), "list", "values nvidia-smi printed as N/A or not supported")
    # few samples per device make the sampled figures thin, not the device's facts (count, memory, names)
    thin = per_device < FEW_SAMPLES
    return [replace(e, quality=Quality.LOW) if thin and e.key in SAMPLED else e for e in ev.items]


def _link(devs: list[Device], ev: Emit) -> None:
    links = [d for d in devs if d.link_readings and d.gen_max and d.width_max]
    if not links:
        busiest = max((d for d in devs if d.tx[1] or d.rx[1]), key=lambda d: d.traffic_peak or 0.0, default=None)
        if busiest is not None:  # traffic without the link's state (dmon -s t): the copy rates still count
            _traffic(busiest, ev)
        return

    def ratio(d: Device) -> float:
        gen = d.gen_loaded if d.loaded else d.gen_any
        width = d.width_loaded if d.loaded else d.width_any
        cap = link_bytes_per_s(int(gen or 0), int(width or 0))
        cap_max = link_bytes_per_s(int(d.gen_max or 0), int(d.width_max or 0))
        return cap / cap_max if cap and cap_max else 1.0

    d = min(links, key=lambda x: (ratio(x), -(x.traffic_peak or 0.0)))
    gen = int((d.gen_loaded if d.loaded else d.gen_any) or 0)
    width = int((d.width_loaded if d.loaded else d.width_any) or 0)
    where = d.label + (f", {d.loaded} reading(s) under load" if d.loaded else
                       ", never under load (an idle link lowers its generation to save power)")
    _traffic(d, ev)
    ev.add("pcie.link_gen", gen, "gen", where)
    ev.add("pcie.link_gen_max", int(d.gen_max or 0), "gen", "the highest generation this GPU and slot support")
    if d.gen_gpu_max:
        ev.add("pcie.link_gen_gpu_max", int(d.gen_gpu_max), "gen", "the GPU's own maximum")
    ev.add("pcie.link_width", width, "lanes", where)
    ev.add("pcie.link_width_max", int(d.width_max or 0), "lanes")
    ev.add("pcie.loaded_samples", d.loaded, "samples",
           f"readings with ≥ {LOADED_LINK_BYTES_PER_S >> 20} MiB/s of traffic or the GPU ≥ {BUSY_UTIL_PCT} % busy")
    cap = link_bytes_per_s(gen, width)
    if cap is not None:
        ev.add("pcie.link_capacity_bytes_per_s", cap, "bytes/s", f"gen{gen} x{width}, per direction")
    cap_max = link_bytes_per_s(int(d.gen_max or 0), int(d.width_max or 0))
    if cap_max is not None:
        ev.add("pcie.link_capacity_max_bytes_per_s", cap_max, "bytes/s",
               f"gen{d.gen_max} x{d.width_max}, per direction")
    deltas = [x.replays_last - x.replays_first for x in devs
              if x.replays_first is not None and x.replays_last is not None and x.readings > 1]
    if deltas:
        ev.add("pcie.replay_count_delta", int(sum(deltas)), "count", "PCIe replays between the first and last reading")


def _traffic(d: Device, ev: Emit) -> None:
    if d.tx[1]:
        ev.add("pcie.tx_bytes_per_s", d.tx[0] / d.tx[1], "bytes/s", f"device → host, mean, {d.label}")
    if d.rx[1]:
        ev.add("pcie.rx_bytes_per_s", d.rx[0] / d.rx[1], "bytes/s", f"host → device, mean, {d.label}")
    if d.traffic_peak is not None:
        ev.add("pcie.peak_bytes_per_s", d.traffic_peak, "bytes/s", f"busiest reading, either direction, {d.label}")


def _throttled_share(d: Device) -> float:
    if d.reasons_n:
        return d.bits_counts.get(THROTTLE_BITS, 0) / d.reasons_n
    p = d.pviol[0] / d.pviol[1] / 100.0 if d.pviol[1] else 0.0
    t_mean = d.tviol[0] / d.tviol[1] if d.tviol[1] else 0.0
    return max(p, t_mean / 100.0 if t_mean > 1.0 else t_mean)


def _clocks(all_devs: list[Device], ev: Emit) -> None:
    """Clocks, clock-event reasons and power: of the most throttled GPU when one is, else pooled.

    Pooled over eight GPUs, one GPU throttling all the time reads as 12 %, under GPU003's bar, and
    its clock deficit disappears in the others' full clocks: the GPU that throttles is the finding.
    """
    worst = max(all_devs, key=_throttled_share, default=None)
    devs = [worst] if worst is not None and len(all_devs) > 1 and _throttled_share(worst) >= REASON_SHARE \
        else all_devs
    if devs is not all_devs and worst is not None:
        ev.add("gpu.throttled_device", worst.label, "gpu", f"the clock, reason and power keys describe {worst.label}, "
               f"throttled in {pct(_throttled_share(worst))} of its readings")
    pw = sum(d.power[1] for d in devs)
    if pw:
        ev.add("gpu.power_w", sum(d.power[0] for d in devs) / pw, "W", "mean board power draw")
    limits = [d.power_limit for d in devs if d.power_limit]
    if limits:
        ev.add("gpu.power_limit_w", min(limits), "W", "enforced power limit")
    defaults = [d.power_default for d in devs if d.power_default]
    if defaults:
        ev.add("gpu.power_default_limit_w", max(defaults), "W", "the board's default power limit")
    busy_n = sum(d.sm_busy[1] for d in devs)
    all_n = sum(d.sm_all[1] for d in devs)
    if busy_n or all_n:
        total = sum(d.sm_busy[0] for d in devs) if busy_n else sum(d.sm_all[0] for d in devs)
        n = busy_n or all_n
        ev.add("gpu.sm_clock_mhz", total / n, "MHz", f"mean over {int(n)} {'busy ' if busy_n else ''}reading(s)")
    maxes = [d.sm_max for d in devs if d.sm_max]
    if maxes:
        ev.add("gpu.sm_clock_max_mhz", max(maxes), "MHz", "maximum boost clock")
    mb = sum(d.memclk_busy[1] for d in devs)
    ma = sum(d.memclk_all[1] for d in devs)
    if mb or ma:
        total = sum(d.memclk_busy[0] for d in devs) if mb else sum(d.memclk_all[0] for d in devs)
        ev.add("gpu.mem_clock_mhz", total / (mb or ma), "MHz")
    k = sum(d.reasons_n for d in devs)
    if k:
        counts: dict[str, int] = {}
        for d in devs:
            for name, n_ in d.reason_counts.items():
                counts[name] = counts.get(name, 0) + n_
        active = sorted(name for name, n_ in counts.items() if n_ / k >= REASON_SHARE)

        def share(bits: int) -> float:
            return sum(d.bits_counts.get(bits, 0) for d in devs) / k

        emit_throttle(ev, k, active, share)
    for acc, key, what in (("pviol", "gpu.power_violation_ratio", "power"),
                           ("tviol", "gpu.thermal_violation_ratio", "thermal")):
        n = sum(getattr(d, acc)[1] for d in devs)
        if n:
            mean = sum(getattr(d, acc)[0] for d in devs) / n
            scale = 100.0 if acc == "pviol" or mean > 1.0 else 1.0
            ev.add(key, min(1.0, mean / scale), "ratio",
                   f"share of the time clocks were held down by the {what} policy "
                   "(dmon)")
    if not k:
        _throttle_from_violations(devs, ev)


def _throttle_from_violations(devs: list[Device], ev: Emit) -> None:
    """dmon gives no clock-event reasons but the power and thermal violation shares: the same question."""
    n_p, n_t = sum(d.pviol[1] for d in devs), sum(d.tviol[1] for d in devs)
    if not n_p and not n_t:
        return
    power = min(1.0, sum(d.pviol[0] for d in devs) / n_p / 100.0) if n_p else 0.0
    t_mean = sum(d.tviol[0] for d in devs) / n_t if n_t else 0.0
    thermal = min(1.0, t_mean / 100.0 if t_mean > 1.0 else t_mean)
    names = [name for name, share in (("SwPowerCap", power), ("HwThermalSlowdown", thermal)) if share >= REASON_SHARE]
    ev.add("gpu.throttle_reasons", names, "list", "from dmon's power (pviol) and thermal (tviol) violation columns")
    ev.add("gpu.throttle_ratio", max(power, thermal), "ratio", "share of the time held by the power or thermal policy "
           "(dmon pviol/tviol)")
    ev.add("gpu.power_cap_ratio", power, "ratio", "dmon pviol: share of the time the power policy held the clocks")
    ev.add("gpu.thermal_throttle_ratio", thermal, "ratio", "dmon tviol: thermal violation")


EVERY_LINE = "\n"  # a trigger every line holds: past a big file's head, the rest of a series that runs into it


class NvsmiSource:
    """Text source for nvidia-smi output (every form but headerless CSV rows; see ``NvsmiGuessedCsvSource``).

    ``triggers``: the literals every line a reader acts on holds, or follows within a document's or a
    header's context (``diagnose.collectors.nvsmi.TRIGGERS``). The loose reader asks for them once the head
    of a big input has been read: when that head ends inside a series (``--query-gpu -l`` rows,
    ``dmon``, a ``-q`` or XML document still open), its rows carry no literal and their header lies
    behind, so the trigger becomes every line (a newline): the rest of a long recording is read, not
    only its first 512 KiB.
    """

    kind = KIND

    def __init__(self) -> None:
        self.collected = Collected()
        self._p = NvsmiParser(self.collected.sink())

    @property
    def triggers(self) -> tuple[str | tuple[str, int, int], ...]:
        return (*TRIGGERS, EVERY_LINE) if self._p.mid_series() else TRIGGERS

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return self._p.matched()

    def problems(self) -> list[str]:
        self._p.finish()
        c = self.collected
        out = list(c.problems)
        if c.processes and not c.devices:
            out.append("nvidia-smi process lines without the GPU table: the device's total memory is unknown")
        devs = list(c.devices.values())
        if devs and all(d.util_n == 0 for d in devs) and any(d.mig for d in devs):
            out.append("MIG mode: nvidia-smi reports no utilisation for a MIG-enabled GPU (per-instance activity "
                       "is in DCGM's profiling metrics)")
        if c.na_process_memory and not c.unlisted_seen:
            out.append("per-process memory is N/A (Windows WDDM): memory outside the listed processes cannot be "
                       "computed")
        return out

    def evidence(self, source: str) -> list[Evidence]:
        self._p.finish()
        out = evidence_of(self.collected, source, "+".join(self._p.forms()))
        failures = self._p.table.failures
        if failures:
            meaning = {kind: what for _, kind, what in FAILURES}
            ev = Emit(source)
            ev.add("gpu.unusable", sorted(failures), "list", "; ".join(
                f"{meaning[k]} (nvidia-smi: \"{line}\")" for k, line in sorted(failures.items())))
            if not self.collected.devices and "gpu_lost" not in failures:
                ev.add("gpu.count", 0, "gpus", "nvidia-smi sees no usable GPU")
            out.extend(ev.items)
        return out


class NvsmiGuessedCsvSource:
    """``--query-gpu`` rows with neither header nor command line: columns guessed from the values.

    ``free_text``: its rows carry no literal to find them by, so the head of an input (what a paste
    or a monitor script's file mostly is) is read; when the head ends among such rows, the trigger
    becomes every line, and the rest of the recording is read too.
    """

    kind = KIND
    free_text = True

    def __init__(self) -> None:
        self.collected = Collected()
        self._p = GuessedCsvParser(self.collected.sink())
        self._finished = False

    @property
    def triggers(self) -> tuple[str, ...]:
        return (EVERY_LINE,) if self._p.mid_series() else ()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def _finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._p.finish()

    def matched(self) -> bool:
        self._finish()
        return self._p.matched and bool(self._p.rows)

    def problems(self) -> list[str]:
        self._finish()
        return [n for n in self.collected.notes if n.startswith("headerless")]

    def evidence(self, source: str) -> list[Evidence]:
        self._finish()
        return evidence_of(self.collected, source, "--query-gpu CSV (headerless, columns guessed)")


def sources() -> list[Any]:
    return [NvsmiSource(), NvsmiGuessedCsvSource()]
