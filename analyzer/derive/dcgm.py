"""dcgm-exporter series → the same ``gpu.*``, ``gpm.*``, ``pcie.*`` (and ``mem.*``) keys NVML gives.

The GPU rules (GPU001–GPU005) read these keys whatever the source, so a Grafana board's DCGM data
is judged exactly as a live NVML recording is. Aggregation follows ``diagnose.derive.nvml``:

- ``gpu.util_ratio`` is ``DCGM_FI_DEV_GPU_UTIL``, the same NVML counter: the share of the sample
  period in which *a* kernel ran, pooled over the GPUs and the readings (mean, p10, p90). It does
  not say how much of the GPU the kernels filled. When the profiling fields disagree (the graphics
  engine or the SMs active far less than ``GPU_UTIL`` says: ``DISAGREE`` apart), the evidence says
  so, and ``gpm.sm_activity_ratio`` carries the activity: ``DCGM_FI_PROF_SM_ACTIVE``, else
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (time the engine was active: an upper bound of SM activity,
  marked as such). GPU002 reads it first, so a "91 % busy" GPU with 16 % engine activity is
  judged under-filled, never saturated.
- Memory is taken at its peak on one focus device (the fullest, or the one where others hold the
  largest share); the total is ``FB_TOTAL``, else used + free + reserved.
- Clocks are averaged over busy readings (``gpu.util_ratio`` ≥ ``BUSY``); throttling comes from
  ``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` (NVML's bits), else from the violation counters, else
  it is *inferred* — power draw within ``POWER_CAP_SHARE`` of the limit while the SM clock is
  ``CLOCK_DEFICIT`` or more below its maximum — and marked low quality with the reason. A limit or
  maximum clock the scrape lacks is taken from the model's datasheet (``diagnose.collectors.dcgm.SPECS``)
  and said so.
- Memory held by others needs to know what the service itself holds: DCGM reports the device, not
  processes. With ``engine_memory_ratio`` (vLLM's ``gpu_memory_utilization``: it pre-allocates that
  share of the device) ``mem.process_used_bytes`` is that share and ``mem.other_processes_bytes``
  the rest of what is used; the pods sharing the GPU are named from the Kubernetes labels.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

from diagnose.collectors.dcgm import (
    TRIGGERS,
    DcgmBuffer,
    DcgmResult,
    GpuSeries,
    Pod,
    QueryJsonBuffer,
    spec_of,
)
from diagnose.collectors.oom import gpu_named
from diagnose.derive.emit import Emit
from diagnose.derive.nvml import (
    LOADED_LINK_BYTES_PER_S,
    REASON_SHARE,
    emit_reason_bits,
    link_bytes_per_s,
)
from diagnose.derive.nvml import mean as _mean
from diagnose.model import Evidence, Quality, Window
from diagnose.stats import quantile
from diagnose.units import GIB, pct, size

KIND = "dcgm"
BUSY = 0.5  # a reading this busy runs at working clocks (P0), as diagnose.derive.nvml's BUSY_UTIL_PCT
FEW_SAMPLES = 10  # fewer readings: the figures are marked low quality (one scrape is one reading)
DISAGREE = 0.3  # GPU_UTIL this far above engine/SM activity: "a kernel ran" overstates the work
POWER_CAP_SHARE = 0.95  # drawing ≥ 95 % of the power limit: the power cap is what holds the clock
CLOCK_DEFICIT = 0.10  # SM clock ≥ 10 % below its maximum: GPU Boost's normal range is within it
THERMAL_MARGIN_C = 2.0  # within 2 °C of the slowdown temperature counts as at it
NS_VIOLATION = 1.5  # a violation "µs" delta above 1.5 × the elapsed µs can only be nanoseconds


def _rows(g: GpuSeries) -> list[dict[str, float]]:
    """The GPU's readings, one dict per timestamp (or per position when the input has no times)."""
    rows: dict[float, dict[str, float]] = {}
    for name, pts in g.points.items():
        for i, (ts, v) in enumerate(pts):
            rows.setdefault(ts if ts is not None else float(i), {})[name] = v
    return [rows[k] for k in sorted(rows)]


def _times(g: GpuSeries, name: str) -> list[tuple[float, float]]:
    return [(ts, v) for ts, v in g.points.get(name, ()) if ts is not None]


def _counter_rate(pts: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """(increase, elapsed seconds) of a cumulative counter, resets counted anew."""
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    inc = 0.0
    for (_, a), (_, b) in itertools.pairwise(pts):
        inc += b - a if b >= a else b
    return inc, pts[-1][0] - pts[0][0]


def _same_pod(a: Pod, b: Pod) -> bool:
    """The same pod, whatever the container; a missing namespace matches any."""
    return a.pod == b.pod and (not a.namespace or not b.namespace or a.namespace == b.namespace)


def _pods(pods: Iterable[Pod]) -> str:
    return ", ".join(p.name for p in pods)


class DcgmSource:
    """TextSource for dcgm-exporter scrapes and Prometheus query JSON holding DCGM series (kind ``dcgm``).

    ``free_text``: a query answer is JSON whose value lines carry no ``DCGM_FI_`` literal, so it is
    read from the head of an input (what a paste is); past the head only exposition lines are read.
    """

    kind = KIND
    triggers = TRIGGERS
    free_text = True

    def __init__(self) -> None:
        self._text = DcgmBuffer()
        self._json = QueryJsonBuffer()
        self._result: DcgmResult | None = None
        self._decided = False

    def feed(self, line: str) -> None:
        self._text.feed(line)
        self._json.feed(line)

    def _get(self) -> DcgmResult | None:
        if not self._decided:
            self._decided = True
            if self._text.matched():
                self._result = self._text.result()
            else:
                got = self._json.result()
                self._result = got if got is not None and got.gpus else None
        return self._result

    def matched(self) -> bool:
        return self._get() is not None

    def problems(self) -> list[str]:
        r = self._get()
        return list(r.problems) if r is not None else []

    def evidence(self, source: str) -> list[Evidence]:
        r = self._get()
        return derive(r, source) if r is not None else []


def sources() -> list[DcgmSource]:
    return [DcgmSource()]


def derive(
    result: DcgmResult,
    source: str,
    *,
    gpus: Sequence[GpuSeries] | None = None,
    window: Window | None = None,
    target_pods: Iterable[Pod] = (),
    engine_memory_ratio: float | None = None,
) -> list[Evidence]:
    """Evidence about ``gpus`` (default: every GPU of ``result``); see the module docstring.

    ``target_pods``: the service's own pods (others seen on the same GPU are co-tenants);
    ``engine_memory_ratio``: the share of device memory the service pre-allocates, when known.
    """
    chosen = list(result.gpus if gpus is None else gpus)
    if not chosen:
        return []
    per_gpu = [(g, _rows(g)) for g in chosen]
    readings = [r for _, rows in per_gpu for r in rows]
    n_util = sum(1 for r in readings if "util" in r)
    few = max(n_util, max((len(rows) for _, rows in per_gpu), default=0)) < FEW_SAMPLES
    quality = Quality.LOW if few else Quality.GOOD
    form = ("a Prometheus query result" if result.form == "query-json"
            else f"{result.scrapes} scrape(s)" if result.scrapes > 1 else "one scrape")
    ev = Emit(source, window=window, quality=quality)
    ev.add("gpu.count", len(chosen), "gpus", f"GPUs in the DCGM data ({form})")

    # -- utilisation, and what the profiling fields say about it ----------------------------------
    util = [r["util"] for r in readings if "util" in r]
    engine = [r["gr_engine_active"] for r in readings if "gr_engine_active" in r]
    sm = [r["sm_active"] for r in readings if "sm_active" in r]
    activity, activity_name = (sm, "SMs were active (DCGM_FI_PROF_SM_ACTIVE)") if sm else (
        engine, "the graphics engine was active (DCGM_FI_PROF_GR_ENGINE_ACTIVE)")
    act = _mean(activity)
    if util:
        mean = sum(util) / len(util)
        where = f"{len(util)} reading(s) over {len(chosen)} GPU(s), {form}"
        note = ""
        if act is not None and mean - act >= DISAGREE:
            note = (f"; GPU_UTIL overstates the work: it counts the time *a* kernel ran, while {activity_name} "
                    f"{pct(act)} of the time — the rules read SM activity (gpm.sm_activity_ratio) first")
        ev.add("gpu.util_ratio", mean, "ratio", f"mean DCGM_FI_DEV_GPU_UTIL, {where}{note}")
        ev.add("gpu.busy_ratio", mean, "ratio", "share of time a kernel was running (DCGM_FI_DEV_GPU_UTIL)" + note)
        ev.add("gpu.util_p10_ratio", quantile(util, 0.10), "ratio", where)
        ev.add("gpu.util_p90_ratio", quantile(util, 0.90), "ratio", where)
        ev.add("gpu.util_samples", len(util), "samples", f"DCGM_FI_DEV_GPU_UTIL readings ({form})")
    copy = [r["mem_copy_util"] for r in readings if "mem_copy_util" in r]
    if copy:
        ev.add("gpu.mem_util_ratio", sum(copy) / len(copy), "ratio",
               "share of time device memory was read or written (DCGM_FI_DEV_MEM_COPY_UTIL)")
    if engine:
        ev.add("gpu.engine_active_ratio", sum(engine) / len(engine), "ratio",
               "share of time the graphics/compute engine was active (DCGM_FI_PROF_GR_ENGINE_ACTIVE)")
    if sm:
        ev.add("gpm.sm_activity_ratio", sum(sm) / len(sm), "ratio",
               f"share of cycles an SM had a warp, mean of {len(sm)} DCGM_FI_PROF_SM_ACTIVE reading(s)")
    elif engine:
        ev.add("gpm.sm_activity_ratio", sum(engine) / len(engine), "ratio",
               "DCGM_FI_PROF_GR_ENGINE_ACTIVE (time the engine was active), an upper bound of SM activity: the "
               "exporter does not export DCGM_FI_PROF_SM_ACTIVE", Quality.LOW)
    for name, key, what in (
        ("sm_occupancy", "gpm.sm_occupancy_ratio", "resident warps / the maximum (DCGM_FI_PROF_SM_OCCUPANCY)"),
        ("tensor_active", "gpm.tensor_activity_ratio", "tensor pipe active (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)"),
        ("dram_active", "gpm.dram_bw_ratio", "device memory interface active (DCGM_FI_PROF_DRAM_ACTIVE)"),
    ):
        vals = [r[name] for r in readings if name in r]
        if vals:
            ev.add(key, sum(vals) / len(vals), "ratio", f"{what}, mean of {len(vals)} reading(s)")

    # -- memory, on the focus device ------------------------------------------------------------------
    mems = []
    for g, rows in per_gpu:
        used = [r["fb_used"] for r in rows if "fb_used" in r]
        totals = [r["fb_total"] if "fb_total" in r else
                  r["fb_used"] + r["fb_free"] + r.get("fb_reserved", 0.0) for r in rows
                  if "fb_total" in r or ("fb_used" in r and "fb_free" in r)]
        if used and totals:
            mems.append((g, max(used), max(totals)))
    focus = max(mems, key=lambda m: m[1] / m[2] if m[2] else 0.0) if mems else None
    if focus is not None:
        g, used_b, total_b = focus
        ev.add("gpu.memory_used_bytes", int(used_b), "bytes", f"{g.gpu.label}, peak (DCGM_FI_DEV_FB_USED)")
        ev.add("gpu.memory_total_bytes", int(total_b), "bytes", f"{g.gpu.label} (FB used + free + reserved)")
        mine = list(target_pods)
        others = [p for p in g.pods if not any(_same_pod(p, m) for m in mine)] if mine else []
        if others:
            ev.add("gpu.other_pods", [p.name for p in others], "list",
                   f"other pods sharing {g.gpu.label}: {_pods(others)}")
        if engine_memory_ratio is not None and 0 < engine_memory_ratio <= 1:
            own = engine_memory_ratio * total_b
            rest = max(0.0, used_b - own)
            who = f"; pods on it: {_pods(others)}" if others else ""
            ev.add("mem.process_used_bytes", int(min(own, used_b)), "bytes",
                   f"the engine pre-allocates gpu_memory_utilization {engine_memory_ratio:.2f} of {g.gpu.label}")
            ev.add("mem.other_processes_bytes", int(rest), "bytes",
                   f"used on {g.gpu.label} beyond the engine's pre-allocated share{who}")
            ev.add("mem.other_processes_share_ratio", rest / total_b, "ratio",
                   f"memory used beyond the engine's share / {g.gpu.label}'s total")
    devices = []
    for g, rows in per_gpu:
        last = rows[-1] if rows else {}
        u = [r["util"] for r in rows if "util" in r]
        devices.append({"gpu": g.gpu.index, "name": g.gpu.model, "host": g.gpu.hostname, "uuid": g.gpu.uuid,
                        "used_bytes": int(last["fb_used"]) if "fb_used" in last else None,
                        "util": (sum(u) / len(u)) if u else None, "pods": [p.name for p in g.pods],
                        **({"mig": f"{g.gpu.mig_profile} #{g.gpu.mig_instance}"}
                           if g.gpu.mig_profile or g.gpu.mig_instance else {})})
    ev.add("gpu.devices", devices, "list", f"{len(devices)} GPU(s) in the DCGM data")
    _named(per_gpu, ev, focus)
    migs = [d for d in devices if "mig" in d]
    if migs:
        ev.add("gpu.mig_instances", len(migs), "instances",
               "MIG instances (GPU_I_PROFILE / GPU_I_ID labels): utilisation and memory are per instance")

    _pcie(per_gpu, ev)
    _clocks_power(per_gpu, readings, ev)
    _errors(per_gpu, ev)
    return ev.items


def _named(per_gpu: Sequence[tuple[GpuSeries, list[dict[str, float]]]], ev: Emit,
           focus: tuple[GpuSeries, float, float] | None) -> None:
    """The GPU's model from the exporter's ``modelName`` label, read as a GPU name (the model and the device
    memory it is sold with), as the same name in a log line or on a command line is: the focus device's (the
    one ``gpu.memory_total_bytes`` is of) where it is known. A model sold with several sizes takes the one
    nearest the measured total; GPUs of different sizes in one scrape give no ``gpu.spec_memory_bytes``.
    ``focus``: that device, its used and total memory."""
    models = sorted({g.gpu.model for g, _ in per_gpu if g.gpu.model})
    if not models:
        return
    named = {m: n for m in models if (n := gpu_named(m)) is not None}
    device, total_b = (focus[0], focus[2]) if focus is not None else (None, None)
    label = device.gpu.model if device is not None and device.gpu.model in named else next(iter(named), models[0])
    others = [m for m in models if m != label]
    gpu = named.get(label)
    ev.add("gpu.name", gpu.model if gpu else label, "name",
           f"DCGM's modelName label {label!r}" + (f" (also {', '.join(others)})" if others else ""))
    if gpu is None or len({n.memory_bytes for n in named.values()}) > 1:
        return
    if gpu.assumed and total_b:
        gib = min(gpu.assumed, key=lambda v: abs(v * GIB - total_b))
        ev.add("gpu.spec_memory_bytes", int(gib * GIB), "bytes",
               f"{gpu.model}: the {gib:g} GB model, the size nearest the {size(total_b, 0)} DCGM measured")
        return
    sizes = " or ".join(f"{g:g}" for g in gpu.assumed)
    said = (f"{gpu.model}: {size(gpu.memory_bytes, 0)} assumed — the {gpu.model} comes with {sizes} GB and the label "
            "does not say which") if gpu.assumed else f"{gpu.model}: device memory from the GPU's name (modelName)"
    ev.add("gpu.spec_memory_bytes", gpu.memory_bytes, "bytes", said)


def _pcie(per_gpu: Sequence[tuple[GpuSeries, list[dict[str, float]]]], ev: Emit) -> None:
    tx = [r["pcie_tx"] for _, rows in per_gpu for r in rows if "pcie_tx" in r]
    rx = [r["pcie_rx"] for _, rows in per_gpu for r in rows if "pcie_rx" in r]
    how = "DCGM_FI_PROF_PCIE_TX/RX_BYTES"
    if not tx and not rx:  # the deprecated cumulative KB counters: rate over the window
        for name, acc in (("pcie_tx_total", tx), ("pcie_rx_total", rx)):
            for g, _ in per_gpu:
                got = _counter_rate(_times(g, name))
                if got is not None and got[1] > 0:
                    acc.append(got[0] / got[1])
        how = "rate of DCGM_FI_DEV_PCIE_TX/RX_THROUGHPUT"
    if tx:
        ev.add("pcie.tx_bytes_per_s", sum(tx) / len(tx), "bytes/s", f"device → host, mean ({how})")
    if rx:
        ev.add("pcie.rx_bytes_per_s", sum(rx) / len(rx), "bytes/s", f"host → device, mean ({how})")
    peaks = [max(r.get("pcie_tx", 0.0), r.get("pcie_rx", 0.0)) for _, rows in per_gpu for r in rows
             if "pcie_tx" in r or "pcie_rx" in r]
    if peaks:
        ev.add("pcie.peak_bytes_per_s", max(peaks), "bytes/s", "busiest reading, either direction")
    links = []
    for g, rows in per_gpu:
        with_link = [r for r in rows if "pcie_gen" in r and "pcie_width" in r]
        maxes = [r for r in rows if "pcie_gen_max" in r and "pcie_width_max" in r]
        if not with_link or not maxes:
            continue
        loaded = [r for r in with_link if r.get("util", 0.0) >= BUSY
                  or max(r.get("pcie_tx", 0.0), r.get("pcie_rx", 0.0)) >= LOADED_LINK_BYTES_PER_S]
        pool = loaded or with_link
        gen, width = max(r["pcie_gen"] for r in pool), max(r["pcie_width"] for r in pool)
        gmax, wmax = max(r["pcie_gen_max"] for r in maxes), max(r["pcie_width_max"] for r in maxes)
        cap, cap_max = link_bytes_per_s(int(gen), int(width)), link_bytes_per_s(int(gmax), int(wmax))
        links.append((g, gen, width, gmax, wmax, len(loaded), cap, cap_max))
    if links:
        g, gen, width, gmax, wmax, n_loaded, cap, cap_max = min(
            links, key=lambda x: (x[6] / x[7]) if x[6] and x[7] else 1.0)
        where = g.gpu.label + (f", {n_loaded} readings under load" if n_loaded else ", never under load")
        ev.add("pcie.link_gen", int(gen), "gen", where)
        ev.add("pcie.link_gen_max", int(gmax), "gen", "DCGM_FI_DEV_PCIE_MAX_LINK_GEN")
        ev.add("pcie.link_width", int(width), "lanes", where)
        ev.add("pcie.link_width_max", int(wmax), "lanes", "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH")
        ev.add("pcie.loaded_samples", n_loaded, "samples", f"readings with the GPU ≥ {pct(BUSY)} busy or "
               f"≥ {LOADED_LINK_BYTES_PER_S >> 20} MiB/s of traffic")
        if cap is not None:
            ev.add("pcie.link_capacity_bytes_per_s", cap, "bytes/s", f"gen{int(gen)} x{int(width)}, per direction")
        if cap_max is not None:
            ev.add("pcie.link_capacity_max_bytes_per_s", cap_max, "bytes/s", f"gen{int(gmax)} x{int(wmax)}")
    replays = [got[0] for g, _ in per_gpu if (got := _counter_rate(_times(g, "pcie_replay"))) is not None]
    if replays:
        ev.add("pcie.replay_count_delta", int(sum(replays)), "count", "PCIe replays during the window "
               "(DCGM_FI_DEV_PCIE_REPLAY_COUNTER)")
    for name, key, what in (("nvlink_tx", "nvlink.tx_bytes_per_s", "NVLink transmit"),
                            ("nvlink_rx", "nvlink.rx_bytes_per_s", "NVLink receive")):
        vals = [r[name] for _, rows in per_gpu for r in rows if name in r]
        if vals:
            ev.add(key, sum(vals) / len(vals), "bytes/s", f"{what}, mean (DCGM_FI_PROF_NVLINK_*_BYTES)")


def _clocks_power(per_gpu: Sequence[tuple[GpuSeries, list[dict[str, float]]]],
                  readings: Sequence[Mapping[str, float]], ev: Emit) -> None:
    busy = [r for r in readings if r.get("util", 0.0) >= BUSY]
    pool = busy or list(readings)
    sm = [r["sm_clock"] for r in pool if "sm_clock" in r]
    if sm:
        ev.add("gpu.sm_clock_mhz", sum(sm) / len(sm), "MHz", f"mean over {len(sm)} {'busy ' if busy else ''}reading(s)")
    memclk = [r["mem_clock"] for r in pool if "mem_clock" in r]
    if memclk:
        ev.add("gpu.mem_clock_mhz", sum(memclk) / len(memclk), "MHz")
    models = {g.gpu.model for g, _ in per_gpu if g.gpu.model}
    spec = next((s for m in sorted(models) if (s := spec_of(m)) is not None), None)
    model = next((m for m in sorted(models) if spec_of(m) is not None), "")
    sm_max_vals = [r["sm_clock_max"] for r in readings if "sm_clock_max" in r]
    sm_max: float | None = max(sm_max_vals) if sm_max_vals else None
    if sm_max is not None:
        ev.add("gpu.sm_clock_max_mhz", sm_max, "MHz", "DCGM_FI_DEV_MAX_SM_CLOCK")
    elif spec is not None and len(models) == 1:
        sm_max = spec[1]
        ev.add("gpu.sm_clock_max_mhz", sm_max, "MHz", f"the {model}'s datasheet boost clock (the data has no "
               "DCGM_FI_DEV_MAX_SM_CLOCK)")

    power = [r["power"] for r in readings if "power" in r]
    if power:
        ev.add("gpu.power_w", sum(power) / len(power), "W", "mean board power draw (DCGM_FI_DEV_POWER_USAGE)")
    limits = [r[k] for r in readings for k in ("power_limit_enforced", "power_limit") if k in r]
    limit: float | None = min(limits) if limits else None
    limit_from_spec = False
    if limit is not None:
        ev.add("gpu.power_limit_w", limit, "W", "enforced power limit (DCGM_FI_DEV_ENFORCED_POWER_LIMIT / "
               "POWER_MGMT_LIMIT)")
    elif spec is not None and len(models) == 1:
        limit, limit_from_spec = spec[0], True
        ev.add("gpu.power_limit_w", limit, "W", f"the {model}'s datasheet board power (the data has no "
               "DCGM_FI_DEV_POWER_MGMT_LIMIT)", Quality.LOW)
    defaults = [r["power_limit_default"] for r in readings if "power_limit_default" in r]
    if defaults:
        ev.add("gpu.power_default_limit_w", max(defaults), "W", "DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF")
    elif spec is not None and len(models) == 1 and not limit_from_spec:
        ev.add("gpu.power_default_limit_w", spec[0], "W", f"the {model}'s datasheet board power", Quality.LOW)
    temp = [r["temp"] for r in readings if "temp" in r]
    if temp:
        ev.add("gpu.temp_c", max(temp), "°C", "peak GPU temperature (DCGM_FI_DEV_GPU_TEMP)")
    slow = [r["slowdown_temp"] for r in readings if "slowdown_temp" in r]
    if slow:
        ev.add("gpu.temp_slowdown_c", min(slow), "°C", "DCGM_FI_DEV_SLOWDOWN_TEMP")

    # -- throttling: the bitmask, else violation counters, else inferred from power and clock ------------
    reasons = [int(r["throttle_reasons"]) for r in readings if "throttle_reasons" in r]
    violations: dict[str, float] = {}
    for name in ("power_violation", "thermal_violation"):
        ratios = []
        for g, _ in per_gpu:
            got = _counter_rate(_times(g, name))
            if got is not None and got[1] > 0:
                r = got[0] / (got[1] * 1e6)
                ratios.append(min(1.0, r / 1000.0 if r > NS_VIOLATION else r))
        if ratios:
            violations[name] = max(ratios)
            key = "gpu.power_violation_ratio" if name == "power_violation" else "gpu.thermal_violation_ratio"
            ev.add(key, violations[name], "ratio", f"share of the window clocks were held down by the "
                   f"{name.split('_')[0]} policy (DCGM_FI_DEV_{name.upper()})")
    if reasons:
        emit_reason_bits(ev, reasons, " (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS)")
        return
    if violations:
        p, t = violations.get("power_violation", 0.0), violations.get("thermal_violation", 0.0)
        ev.add("gpu.throttle_ratio", max(p, t), "ratio", "share of the window under a power or thermal violation "
               "(DCGM violation counters)")
        ev.add("gpu.power_cap_ratio", p, "ratio", "share of the window under the power policy")
        ev.add("gpu.thermal_throttle_ratio", t, "ratio", "share of the window under the thermal policy")
        names = [n for n, v in (("SwPowerCap", p), ("SwThermalSlowdown", t)) if v >= REASON_SHARE]
        ev.add("gpu.throttle_reasons", names, "list", "from the DCGM violation counters")
        return
    if sm_max is None:
        return
    judged = [r for r in readings if "sm_clock" in r and "power" in r and limit is not None]
    if not judged or limit is None:
        return
    slowdown = min(slow) if slow else None

    def low_clock(r: Mapping[str, float]) -> bool:
        return r["sm_clock"] <= (1.0 - CLOCK_DEFICIT) * float(sm_max or 0.0) and r.get("util", 1.0) >= BUSY

    capped = [r for r in judged if low_clock(r) and r["power"] >= POWER_CAP_SHARE * limit]
    hot = [r for r in judged if low_clock(r) and slowdown is not None and "temp" in r
           and r["temp"] >= slowdown - THERMAL_MARGIN_C]
    n = len(judged)
    why = (f"inferred: power draw ≥ {pct(POWER_CAP_SHARE)} of the {limit:.0f} W limit"
           + (" (datasheet)" if limit_from_spec else "") + f" while the SM clock is ≥ {pct(CLOCK_DEFICIT)} "
           f"below {sm_max:.0f} MHz, in {len(capped)} of {n} reading(s); the data has no "
           "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
    names = (["SwPowerCap"] if len(capped) / n >= REASON_SHARE else []) + (
        ["SwThermalSlowdown"] if len(hot) / n >= REASON_SHARE else [])
    ev.add("gpu.throttle_reasons", names, "list", why, Quality.LOW)
    ev.add("gpu.throttle_ratio", len({id(r) for r in (*capped, *hot)}) / n, "ratio", why, Quality.LOW)
    ev.add("gpu.power_cap_ratio", len(capped) / n, "ratio", why, Quality.LOW)
    ev.add("gpu.thermal_throttle_ratio", len(hot) / n, "ratio", "inferred: at the slowdown temperature with the clock "
           "lowered", Quality.LOW)


def _errors(per_gpu: Sequence[tuple[GpuSeries, list[dict[str, float]]]], ev: Emit) -> None:
    if not any("xid" in g.points for g, _ in per_gpu):
        return
    events = []
    for g, _ in per_gpu:
        last = 0.0
        for ts, v in g.points.get("xid", ()):
            if v and v != last:
                events.append({"gpu": g.gpu.index, "host": g.gpu.hostname, "xid": int(v), "ts": ts})
            last = v
    ev.add("gpu.xid_events", events, "list",
           f"{len(events)} XID error(s): DCGM_FI_DEV_XID_ERRORS holds the last XID the driver reported, kept until "
           "the next one (a value already there when the window opened may be older)")
