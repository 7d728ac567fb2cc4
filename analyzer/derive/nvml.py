"""NVML samples → ``gpu.*``, ``pcie.*``, ``gpm.*`` and ``mem.*`` evidence for the target's GPUs.

Aggregation, and why:

- Utilisation (``utilization.gpu``: the share of NVML's sample period in which a kernel ran) is
  pooled over the target's devices and the window: mean, p10, p90. It says a kernel was running,
  not how much of the GPU it used: GPM's SM activity says that, where the device has GPM.
- Memory is taken at its peak, on one *focus* device: the one where other processes hold the
  largest share, else the fullest. ``gpu.memory_*``, ``mem.process_used_bytes`` and
  ``mem.other_processes_bytes`` all describe that device, so that they add up the way the
  OOM-message keys do. ``mem.other_processes_bytes`` is only given when NVML's pids could be matched
  to the target (otherwise nobody knows whose memory it is); a pid that was in the target's tree at
  any point of the window (or is in ``target_pids``) is the target's.
- The PCIe link is judged on samples where it is loaded (traffic ≥ 256 MiB/s, or the GPU busy):
  idle links drop to a low generation to save power. Link keys describe the device whose link is
  furthest below its maximum (else the busiest one). NVML's KB are KiB.
- Clocks are averaged over busy samples (idle clocks are low by design); clock-event reasons are
  shares of all samples. ``gpu.throttle_ratio`` counts power cap, thermal and hardware slowdowns,
  never GpuIdle, ApplicationsClocksSetting, SyncBoost or DisplayClockSetting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from diagnose.collectors.nvml import NO_TARGET_GPU, REASONS
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality, Window
from diagnose.stats import quantile
from diagnose.units import KIB, pct, size

SOURCE = "nvml"
PREFIXES = ("gpu.", "pcie.", "gpm.")

BUSY_UTIL_PCT = 50  # a sample this busy runs at P0: clocks and the link at their working level
LOADED_LINK_BYTES_PER_S = 256 * 1024 * 1024  # traffic that keeps a link out of its power-saving generation
REASON_SHARE = 0.10  # a clock-event reason active in ≥ 10 % of samples is listed
FEW_SAMPLES = 10  # fewer than this (1 s at 10 Hz): the figures are marked low quality

POWER_BITS = 0x4  # SwPowerCap
THERMAL_BITS = 0x20 | 0x40  # SwThermalSlowdown, HwThermalSlowdown
HW_BITS = 0x8 | 0x80 | 0x200  # HwSlowdown, HwPowerBrakeSlowdown, BoardLimit
THROTTLE_BITS = POWER_BITS | THERMAL_BITS | HW_BITS

# usable bandwidth per lane and direction after line encoding (8b/10b to gen2, 128b/130b after)
LANE_BYTES_PER_S: dict[int, float] = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}


def link_bytes_per_s(gen: int, width: int) -> float | None:
    """A PCIe link's usable bandwidth per direction, or None for an unknown generation."""
    lane = LANE_BYTES_PER_S.get(int(gen))
    return lane * int(width) if lane is not None and width > 0 else None


def emit_throttle(ev: Emit, k: int, active: list[str], share: Callable[[int], float], where: str = "") -> None:
    """The clock-event evidence of ``k`` readings: the reasons active in ≥ ``REASON_SHARE`` of them and the
    share of readings with each kind (``share(bits)``), for NVML, DCGM and nvidia-smi alike."""
    ev.add("gpu.throttle_reasons", active, "list",
           f"clock-event reasons active in ≥ {pct(REASON_SHARE)} of {k} reading(s){where}")
    ev.add("gpu.throttle_ratio", share(THROTTLE_BITS), "ratio",
           "readings with a power-cap, thermal or hardware slowdown reason")
    ev.add("gpu.power_cap_ratio", share(POWER_BITS), "ratio", "readings with SwPowerCap (nvidia-smi: SW Power Cap)")
    ev.add("gpu.thermal_throttle_ratio", share(THERMAL_BITS), "ratio", "readings with Sw/HwThermalSlowdown")
    ev.add("gpu.hw_slowdown_ratio", share(HW_BITS), "ratio", "readings with HwSlowdown, HwPowerBrakeSlowdown "
           "or BoardLimit")


def emit_reason_bits(ev: Emit, reasons: Sequence[int], where: str = "") -> None:
    """``emit_throttle`` from NVML's clock-event bitmasks, one per reading (NVML, DCGM's field 112)."""
    k = len(reasons)

    def share(bits: int) -> float:
        return sum(1 for r in reasons if r & bits) / k

    emit_throttle(ev, k, [name for bit, name in sorted(REASONS.items()) if share(bit) >= REASON_SHARE], share, where)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    return float(x)


def mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def target_devices(samples: Iterable[Mapping[str, Any]]) -> dict[int, list[tuple[float, Mapping[str, Any]]]]:
    """Per device index, its (ts, reading) pairs, for the devices the target used."""
    out: dict[int, list[tuple[float, Mapping[str, Any]]]] = {}
    for s in samples:
        ts = float(s.get("ts", 0.0))
        for d in s.get("devices", ()):
            if d.get("target", True):
                out.setdefault(int(d["index"]), []).append((ts, d))
    return out


def missing_reason(samples: Sequence[Mapping[str, Any]]) -> str | None:
    """Why there is no GPU evidence, for ``EvidenceSet.explain_missing``; None when there is some."""
    if not samples:
        return "NVML recorded no sample"
    if not target_devices(samples):
        return NO_TARGET_GPU
    return None


def _label(d: Mapping[str, Any]) -> str:
    name = d.get("name")
    return f"GPU {d.get('index')}" + (f" ({name})" if name else "")


def _is_target(p: Mapping[str, Any], pids: set[int]) -> bool:
    return bool(p.get("is_target")) or int(p.get("pid", -1)) in pids


def _memory(dev: int, series: list[tuple[float, Mapping[str, Any]]], pids: set[int]) -> dict[str, Any]:
    used = [v for _, d in series if (v := _num(d.get("mem_used_bytes"))) is not None]
    total = next((v for _, d in reversed(series) if (v := _num(d.get("mem_total_bytes")))), None)
    owner_known = any(d.get("owner_known") for _, d in series)
    procs: dict[int, dict[str, Any]] = {}
    mine_peak = others_peak = 0.0
    others_unknown = False
    for _, d in series:
        mine = others = 0.0
        for p in d.get("processes") or ():
            pid = int(p["pid"])
            b = _num(p.get("used_bytes"))
            row = procs.setdefault(pid, {"gpu": dev, "pid": pid, "name": p.get("name", ""), "used_bytes": None,
                                         "type": p.get("type", "C"), "is_target": _is_target(p, pids)})
            if b is not None:
                row["used_bytes"] = int(max(b, row["used_bytes"] or 0))
                if row["is_target"]:
                    mine += b
                else:
                    others += b
            elif not row["is_target"]:
                others_unknown = True
        mine_peak, others_peak = max(mine_peak, mine), max(others_peak, others)
    return {"dev": dev, "used": max(used) if used else None, "total": total, "owner_known": owner_known,
            "mine": mine_peak, "others": others_peak, "others_unknown": others_unknown,
            "procs": list(procs.values()), "label": _label(series[-1][1])}


def _link(series: list[tuple[float, Mapping[str, Any]]]) -> dict[str, Any] | None:
    last = series[-1][1]
    gen_max, width_max = _num(last.get("pcie_gen_max")), _num(last.get("pcie_width_max"))
    readings = [(d, _num(d.get("pcie_gen")), _num(d.get("pcie_width"))) for _, d in series]
    readings = [r for r in readings if r[1] is not None and r[2] is not None]
    if not readings or gen_max is None or width_max is None:
        return None

    def traffic(d: Mapping[str, Any]) -> float | None:
        tx, rx = _num(d.get("pcie_tx_kbps")), _num(d.get("pcie_rx_kbps"))
        if tx is None and rx is None:
            return None
        return max(tx or 0.0, rx or 0.0) * KIB

    def loaded(d: Mapping[str, Any]) -> bool:
        t = traffic(d)
        util = _num(d.get("util_gpu_pct"))
        return (t is not None and t >= LOADED_LINK_BYTES_PER_S) or (util is not None and util >= BUSY_UTIL_PCT)

    under_load = [r for r in readings if loaded(r[0])]
    pool = under_load or readings
    gen = max(r[1] for r in pool if r[1] is not None)
    width = max(r[2] for r in pool if r[2] is not None)
    tx = [v * KIB for _, d in series if (v := _num(d.get("pcie_tx_kbps"))) is not None]
    rx = [v * KIB for _, d in series if (v := _num(d.get("pcie_rx_kbps"))) is not None]
    peaks = [t for _, d in series if (t := traffic(d)) is not None]
    cap = link_bytes_per_s(int(gen), int(width))
    cap_max = link_bytes_per_s(int(gen_max), int(width_max))
    replays = [v for _, d in series if (v := _num(d.get("pcie_replay"))) is not None]
    return {
        "label": _label(last), "gen": int(gen), "width": int(width), "gen_max": int(gen_max),
        "width_max": int(width_max), "gen_gpu_max": _num(last.get("pcie_gen_gpu_max")),
        "loaded": len(under_load), "tx": mean(tx), "rx": mean(rx), "peak": max(peaks) if peaks else None,
        "cap": cap, "cap_max": cap_max, "ratio": (cap / cap_max) if cap and cap_max else 1.0,
        "replay_delta": (replays[-1] - replays[0]) if len(replays) >= 2 else None,
    }


def _violation_ratio(series: list[tuple[float, Mapping[str, Any]]], policy: str) -> float | None:
    pts = [(ts, d["violation"][policy]) for ts, d in series
           if isinstance(d.get("violation"), Mapping) and isinstance(d["violation"].get(policy), Mapping)]
    if len(pts) < 2:
        return None
    (t0, a), (t1, b) = pts[0], pts[-1]
    viol_ns = float(b.get("violation_time_ns", 0)) - float(a.get("violation_time_ns", 0))
    ref_ns = (float(b.get("reference_time_us", 0)) - float(a.get("reference_time_us", 0))) * 1000.0
    if ref_ns <= 0:
        ref_ns = (t1 - t0) * 1e9
    if ref_ns <= 0 or viol_ns < 0:
        return None
    return min(1.0, viol_ns / ref_ns)


def derive(
    samples: Sequence[Mapping[str, Any]],
    target_pids: Iterable[int] = (),
    window: Window | None = None,
    *,
    partial: bool = False,
) -> list[Evidence]:
    """Evidence about the target's GPUs from NVML samples (see the module docstring)."""
    pids = {int(p) for p in target_pids}
    # every pid the tree had at any point of the window: a worker spawned between two reads of the
    # tree is the target's own, not "another process"
    for s in samples:
        pids.update(int(p) for p in (*s.get("tree", ()), *s.get("tree_ids", ())))
    if window is not None:
        inside = [s for s in samples if window.start - 1.0 <= float(s.get("ts", 0.0)) <= window.end + 1.0]
        samples = inside or samples
    devices = target_devices(samples)
    if not devices:
        return []
    n = len(samples)
    quality = Quality.PARTIAL if partial else (Quality.LOW if n < FEW_SAMPLES else Quality.GOOD)
    ev = Emit(SOURCE, window=window, quality=quality)
    readings = [d for series in devices.values() for _, d in series]
    match = str(samples[-1].get("match", ""))
    ev.add("gpu.count", len(devices), "gpus", "GPUs the target's process tree holds a context on"
           + (" (found from the device files it holds open: NVML's pids did not match)" if match == "device-file"
              else ""))

    device_names = sorted({str(d["name"]) for d in readings if d.get("name")})
    if device_names:
        ev.add("gpu.name", device_names[0], "name",
               "NVML device name" + (f" (also {', '.join(device_names[1:])})" if device_names[1:] else ""))

    # utilisation
    util = [v / 100.0 for d in readings if (v := _num(d.get("util_gpu_pct"))) is not None]
    if util:
        mean = sum(util) / len(util)
        where = f"{len(util)} readings over {len(devices)} GPU(s)"
        ev.add("gpu.util_ratio", mean, "ratio", f"mean NVML utilization.gpu, {where}")
        ev.add("gpu.busy_ratio", mean, "ratio", "share of time a kernel was running (NVML utilization.gpu; "
               "copies alone do not count)")
        ev.add("gpu.util_p10_ratio", quantile(util, 0.10), "ratio", where)
        ev.add("gpu.util_p90_ratio", quantile(util, 0.90), "ratio", where)
        ev.add("gpu.util_max_ratio", max(util), "ratio", "the busiest single reading")
        ev.add("gpu.util_samples", len(util), "samples")
        times = [float(s.get("ts", 0.0)) for s in samples]
        if times[-1] > times[0]:
            ev.add("gpu.sampled_span_s", times[-1] - times[0], "s", "from the first sample to the last")
    mem_util = [v / 100.0 for d in readings if (v := _num(d.get("util_mem_pct"))) is not None]
    if mem_util:
        ev.add("gpu.mem_util_ratio", sum(mem_util) / len(mem_util), "ratio",
               "share of time device memory was being read or written (NVML utilization.memory)")

    # memory, on the focus device
    mems = [_memory(dev, series, pids) for dev, series in sorted(devices.items())]
    with_total = [m for m in mems if m["total"]]
    if with_total:
        focus = max(with_total, key=lambda m: ((m["others"] / m["total"]) if m["owner_known"] else 0.0,
                                               (m["used"] or 0.0) / m["total"]))
        label = f"{focus['label']}, peak over the window"
        if focus["used"] is not None:
            ev.add("gpu.memory_used_bytes", int(focus["used"]), "bytes", label)
        ev.add("gpu.memory_total_bytes", int(focus["total"]), "bytes", focus["label"])
        if focus["owner_known"]:
            ev.add("mem.process_used_bytes", int(focus["mine"]), "bytes",
                   f"the target's process tree on {focus['label']}, peak")
            others = [p for p in focus["procs"] if not p["is_target"]]
            names = ", ".join(f"pid {p['pid']}" + (f" ({p['name']})" if p["name"] else "")
                              + (f" {size(p['used_bytes'], 1)}" if p["used_bytes"] is not None else "")
                              for p in sorted(others, key=lambda p: -(p["used_bytes"] or 0))[:8])
            ev.add("mem.other_processes_bytes", int(focus["others"]), "bytes",
                   (names or "no other process") + f" on {focus['label']}"
                   + ("; some processes' usage is not reported" if focus["others_unknown"] else ""))
            ev.add("mem.other_processes_share_ratio", focus["others"] / focus["total"], "ratio",
                   f"memory held by processes outside the target's tree / {focus['label']}'s total")
    procs = sorted((p for m in mems for p in m["procs"]), key=lambda p: -(p["used_bytes"] or 0))
    ev.add("gpu.processes", procs, "list", f"{len(procs)} process(es) with a context on the target's GPU(s)"
           + ("" if all(m["owner_known"] for m in mems) else "; which ones are the target's is unknown"))

    # PCIe
    links = [(dev, lk) for dev, series in sorted(devices.items()) if (lk := _link(series)) is not None]
    if links:
        _, lk = min(links, key=lambda x: (x[1]["ratio"], -(x[1]["peak"] or 0.0)))
        where = lk["label"] + (f", {lk['loaded']} samples under load" if lk["loaded"] else
                               ", never under load (an idle link lowers its generation to save power)")
        if lk["tx"] is not None:
            ev.add("pcie.tx_bytes_per_s", lk["tx"], "bytes/s", f"device → host, mean, {lk['label']}")
        if lk["rx"] is not None:
            ev.add("pcie.rx_bytes_per_s", lk["rx"], "bytes/s", f"host → device, mean, {lk['label']}")
        if lk["peak"] is not None:
            ev.add("pcie.peak_bytes_per_s", lk["peak"], "bytes/s", f"busiest 20 ms reading, either direction, "
                   f"{lk['label']}")
        ev.add("pcie.link_gen", lk["gen"], "gen", where)
        ev.add("pcie.link_gen_max", lk["gen_max"], "gen", "the highest generation this GPU and slot support")
        if lk["gen_gpu_max"] is not None:
            ev.add("pcie.link_gen_gpu_max", int(lk["gen_gpu_max"]), "gen", "the GPU's own maximum")
        ev.add("pcie.link_width", lk["width"], "lanes", where)
        ev.add("pcie.link_width_max", lk["width_max"], "lanes")
        ev.add("pcie.loaded_samples", lk["loaded"], "samples",
               f"readings with ≥ {LOADED_LINK_BYTES_PER_S >> 20} MiB/s of traffic or the GPU ≥ {BUSY_UTIL_PCT} % busy")
        if lk["cap"] is not None:
            ev.add("pcie.link_capacity_bytes_per_s", lk["cap"], "bytes/s",
                   f"gen{lk['gen']} x{lk['width']}, per direction")
        if lk["cap_max"] is not None:
            ev.add("pcie.link_capacity_max_bytes_per_s", lk["cap_max"], "bytes/s",
                   f"gen{lk['gen_max']} x{lk['width_max']}, per direction")
        deltas = [x["replay_delta"] for _, x in links if x["replay_delta"] is not None]
        if deltas:
            ev.add("pcie.replay_count_delta", int(sum(deltas)), "count",
                   "PCIe replays (link-level retransmissions) during the window")

    # clocks and clock-event reasons
    busy = [d for d in readings if (_num(d.get("util_gpu_pct")) or 0) >= BUSY_UTIL_PCT]
    pool = busy or readings
    sm = [v for d in pool if (v := _num(d.get("sm_clock_mhz"))) is not None]
    if sm:
        ev.add("gpu.sm_clock_mhz", sum(sm) / len(sm), "MHz",
               f"mean over {len(sm)} {'busy ' if busy else ''}readings")
    sm_max = [v for d in readings if (v := _num(d.get("sm_clock_max_mhz"))) is not None]
    if sm_max:
        ev.add("gpu.sm_clock_max_mhz", max(sm_max), "MHz", "maximum boost clock")
    memclk = [v for d in pool if (v := _num(d.get("mem_clock_mhz"))) is not None]
    if memclk:
        ev.add("gpu.mem_clock_mhz", sum(memclk) / len(memclk), "MHz")
    reasons = [int(v) for d in readings if (v := _num(d.get("reasons"))) is not None]
    if reasons:
        emit_reason_bits(ev, reasons)
    for policy, key in (("power", "gpu.power_violation_ratio"), ("thermal", "gpu.thermal_violation_ratio")):
        ratios = [r for series in devices.values() if (r := _violation_ratio(series, policy)) is not None]
        if ratios:
            ev.add(key, max(ratios), "ratio", f"share of the window clocks were held down by the {policy} policy "
                   "(NVML violation counters)")

    # power and temperature
    power = [v / 1000.0 for d in readings if (v := _num(d.get("power_mw"))) is not None]
    if power:
        ev.add("gpu.power_w", sum(power) / len(power), "W", "mean board power draw")
    limit = [v / 1000.0 for d in readings if (v := _num(d.get("power_limit_mw"))) is not None]
    if limit:
        ev.add("gpu.power_limit_w", min(limit), "W", "enforced power limit")
    default = [v / 1000.0 for d in readings if (v := _num(d.get("power_default_limit_mw"))) is not None]
    if default:
        ev.add("gpu.power_default_limit_w", max(default), "W", "the board's default power limit")
    temp = [v for d in readings if (v := _num(d.get("temp_c"))) is not None]
    if temp:
        ev.add("gpu.temp_c", max(temp), "°C", "peak GPU temperature")
    slow = [v for d in readings if (v := _num(d.get("temp_slowdown_c"))) is not None]
    if slow:
        ev.add("gpu.temp_slowdown_c", min(slow), "°C", "temperature at which the GPU slows down")

    # XID events
    if any(s.get("xid_watched") for s in samples):
        xids = [{"gpu": int(x.get("device", -1)), "xid": int(x.get("xid", 0)), "ts": float(s.get("ts", 0.0))}
                for s in samples for x in s.get("xid", ())]
        ev.add("gpu.xid_events", xids, "list", f"{len(xids)} XID error(s) reported by the driver during the window")

    # GPM (Hopper and newer)
    for name, key, what in (
        ("sm_util", "gpm.sm_activity_ratio", "share of SMs busy"),
        ("any_tensor_util", "gpm.tensor_activity_ratio", "share of time SMs ran tensor-core instructions"),
        ("dram_bw_util", "gpm.dram_bw_ratio", "DRAM bandwidth used / peak"),
        ("sm_occupancy", "gpm.sm_occupancy_ratio", "active warps / the theoretical maximum"),
    ):
        vals = [v / 100.0 for d in readings if isinstance(d.get("gpm"), Mapping)
                and (v := _num(d["gpm"].get(name))) is not None]
        if vals:
            ev.add(key, sum(vals) / len(vals), "ratio", f"{what}, mean of {len(vals)} GPM interval(s)")

    # what NVML could not say
    na = sorted({f"{k}: {r}" for d in readings for k, r in (d.get("na") or {}).items()})
    if na:
        ev.add("gpu.nvml_unavailable", na, "list", "NVML fields not available on this driver/device, with the reason")
    return ev.items
