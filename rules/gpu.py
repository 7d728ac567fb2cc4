"""The GPU as NVML sees it while attached: starved, saturated, throttled, on a degraded link, or full
of someone else's memory."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Risk, Severity
from diagnose.rules.base import Rule, bar, present, severity_for
from diagnose.units import pct, size


def _gbps(n: float) -> str:
    return f"{n / 1e9:.1f} GB/s" if n >= 1e8 else f"{n / 1e6:.0f} MB/s"


def _list(ev: EvidenceSet, key: str) -> list[Any]:
    got = ev.get(key)
    return list(got.value) if isinstance(got, Evidence) and isinstance(got.value, list) else []


def _detail(ev: EvidenceSet, key: str) -> str:
    got = ev.get(key)
    return got.detail if isinstance(got, Evidence) else ""


_IDLE_CAUSES = Fix(
    "Find what holds requests back before the GPU",
    (
        "Check the batcher's delay: Triton max_queue_delay_microseconds, TorchServe max_batch_delay, a custom "
        "batch timeout; under steady load a batch should fill before it expires",
        "Look for one lock or one event loop serialising requests: py-spy dump --pid PID shows threads waiting "
        "on it; blocking calls inside async handlers stall every request",
        "Time the input path: images or files fetched from object storage per request, tokenisation in the "
        "handler; a client that sends the next request only after the last reply (closed loop, concurrency 1)",
    ),
    Risk.SAFE,
)

_BATCH = Fix(
    "Give the GPU more work per step",
    (
        "Batch requests before the model (dynamic batching: Triton max_queue_delay_microseconds, "
        "TorchServe batch_size/max_batch_delay, a vLLM/TGI max batch size that the load can fill)",
        "Overlap host work with the GPU: prepare batch N+1 while batch N runs (DataLoader workers with "
        "prefetch, a producer thread, pinned buffers and non_blocking copies on a side stream)",
    ),
    Risk.NEEDS_VALIDATION,
)


class GpuStarved(Rule):
    """The GPU sits idle while the service has work: the host does not feed it fast enough.

    What it detects: NVML utilisation of the target's GPUs is low (a kernel runs only part of the
    time) while requests are in flight, and names the host-side cause from the same window's
    py-spy evidence: pre/post-processing or serialisation. When the host's time goes to the model's
    own Python code issuing kernels one by one, GPU120 (launch overhead) reports it instead.

    Why it matters: a starved GPU caps throughput at whatever the host can prepare; adding GPUs or
    faster kernels changes nothing, and the bursts of utilisation (busy for a batch, idle while the
    next one is prepared) hide behind a "50 % utilised" dashboard.

    How it decides: ``gpu.util_ratio`` is below ``max_util`` and the service has real load: the
    engine counts ``serving.running_mean`` ≥ ``min_running`` requests, or connections in flight
    (``conn.inflight_mean``, accepted connections plus the accept queue) average at least
    ``min_inflight`` (one idle keep-alive connection is not load) while py-spy, when it ran, shows
    the Python threads busy (``workers.active_mean`` ≥ ``min_active``), or the accept queue held
    requests (``conn.accept_queue_max`` > 0); with neither count measured, busy Python threads
    (``workers.active_mean`` ≥ ``min_active``) stand for load. An idle GPU without load has nothing
    to do: no finding. When py-spy shows the Python threads idle as well (``workers.active_mean`` <
    ``idle_host``), neither the GPU nor the host CPU is what requests wait for: no finding. The cause
    is attributed, in this order, to pre/post-processing (``cpu.preprocess_share`` ≥
    ``preprocess_share``) or serialisation (``cpu.serialize_share`` ≥ ``serialize_share``):
    confidence *correlated* (NVML and py-spy agree); the model's Python-side forward
    (``cpu.forward_share`` ≥ ``forward_share``) belongs to GPU120. The rule steps aside for causes
    other rules own: compilation (``cpu.compile_share`` ≥ ``compile_share``, CMP rules), host
    threads blocked in copies and synchronisation (``cpu.copy_sync_share`` ≥ ``copy_sync_share``),
    and a PCIe link carrying at least ``link_busy`` of its capacity (the transfer rules). With load
    and no measured cause the finding stands with *heuristic* confidence and names what else idles a
    GPU under load: a batcher waiting to fill a batch, a lock or a single event loop serialising
    requests, slow input fetches, a client that waits for each reply. Impact is the GPU's idle share,
    1 − util.

    Evidence: gpu.util_ratio and one of conn.inflight_mean, workers.active_mean,
    serving.running_mean; optionally conn.accept_queue_max, gpu.util_p10_ratio, gpu.util_p90_ratio,
    gpu.util_samples, cpu.preprocess_share, cpu.serialize_share, cpu.forward_share,
    cpu.compile_share, cpu.copy_sync_share, cpu.top.preprocess, pcie.rx_bytes_per_s,
    pcie.tx_bytes_per_s, pcie.link_capacity_bytes_per_s, gpm.sm_activity_ratio.

    Fix: take the named work off the request path (process pool, GPU decode, faster encoders),
    batch so that each GPU step does more, overlap preparation of the next batch with the current
    one; without a named cause, check the batcher's delay, locks and the input path first.

    False positives: a service whose load is below one request at a time is simply idle (hence
    the load check); a utilisation figure from a single nvidia-smi snapshot (``gpu.util_samples``
    absent or below ``min_samples``) is thin; GPU work the request path does not wait for
    (another tenant's kernels) raises utilisation and hides starvation, never the reverse.
    """

    code = "GPU001"
    name = "gpu-starved"
    category = Category.CPU_PREPROCESSING
    requires: ClassVar[tuple[str, ...]] = ("gpu.util_ratio",)
    requires_any = (("conn.inflight_mean",), ("workers.active_mean",), ("serving.running_mean",))
    optional = (
        "conn.inflight_mean", "conn.accept_queue_max", "serving.running_mean", "workers.active_mean",
        "gpu.util_p10_ratio", "gpu.util_p90_ratio", "gpu.util_samples", "cpu.preprocess_share",
        "cpu.serialize_share", "cpu.forward_share", "cpu.compile_share", "cpu.copy_sync_share",
        "cpu.top.preprocess", "pcie.rx_bytes_per_s", "pcie.tx_bytes_per_s", "pcie.link_capacity_bytes_per_s",
        "gpm.sm_activity_ratio",
    )

    @dataclass(frozen=True)
    class Thresholds:
        max_util: float = 0.6  # a GPU idle ≥ 40 % of the time under load has room a host-side fix can fill
        min_inflight: float = 2.0  # one connection may be an idle keep-alive: at least two in flight is load
        min_running: float = 1.0  # the engine counts requests it is serving, not connections
        min_active: float = 0.5  # Python threads busy half the time: the connections carry work
        idle_host: float = 0.2  # Python threads busy under a fifth of the time: the host is not the cause either
        preprocess_share: float = 0.3  # CPU001's bar: a third of active CPU time in pre/post-processing
        serialize_share: float = 0.2  # CPU002's bar for serialisation
        forward_share: float = 0.5  # half the active time issuing the model's ops: launch-bound (GPU120)
        compile_share: float = 0.3  # compiling a third of the time: the recompilation rules own it
        copy_sync_share: float = 0.3  # a third of the time blocked in copies/sync: the transfer rules own it
        link_busy: float = 0.5  # a link half full: copies, not the CPU, keep the GPU waiting
        min_samples: float = 10  # fewer utilisation readings (1 s at 10 Hz) is a thin measurement

    def _load(self, ev: EvidenceSet, t: Thresholds) -> str | None:
        """The load that should keep the GPU busy, in words, or None when there is none to speak of."""
        inflight = ev.value("conn.inflight_mean")
        running = ev.value("serving.running_mean")
        active = ev.value("workers.active_mean")
        if active is not None and active < t.idle_host:
            return None
        if running is not None and running >= t.min_running:
            return f"{running:.1f} requests running in the engine"
        if inflight is not None:
            queued = (ev.value("conn.accept_queue_max") or 0.0) > 0
            busy = active is None or active >= t.min_active
            if (inflight >= t.min_inflight and busy) or queued:
                return f"{inflight:.1f} requests in flight on average"
            return None
        if running is None and active is not None and active >= t.min_active:
            return f"{active:.1f} Python threads busy"
        return None

    def _starved(self, ev: EvidenceSet, t: Thresholds) -> tuple[float, str] | None:
        """``(util, load)`` when the GPU idles under load for a reason no other rule owns."""
        util = ev.value("gpu.util_ratio", 1.0) or 0.0
        if util >= t.max_util:
            return None
        load = self._load(ev, t)
        if load is None:
            return None
        for key, bar_ in (("cpu.compile_share", t.compile_share), ("cpu.copy_sync_share", t.copy_sync_share)):
            if (ev.value(key, 0.0) or 0.0) >= bar_:
                return None
        cap = ev.value("pcie.link_capacity_bytes_per_s")
        traffic = max(ev.value("pcie.rx_bytes_per_s", 0.0) or 0.0, ev.value("pcie.tx_bytes_per_s", 0.0) or 0.0)
        if cap and traffic / cap >= t.link_busy:
            return None
        return util, load

    @staticmethod
    def _cause(ev: EvidenceSet, t: Thresholds) -> tuple[str, str, float]:
        """``(key, label, share)`` of the first host cause over its bar, or ``("", "", 0.0)``."""
        for key, bar_, label in (
            ("cpu.preprocess_share", t.preprocess_share, "pre/post-processing (decode, resize, tokenise)"),
            ("cpu.serialize_share", t.serialize_share, "serialising requests and responses"),
            ("cpu.forward_share", t.forward_share, "Python-side model code issuing kernels one at a time"),
        ):
            v = ev.value(key, 0.0) or 0.0
            if v >= bar_:
                return key, label, v
        return "", "", 0.0

    def _report(self, ev: EvidenceSet, t: Thresholds, util: float, load: str, cause: str, share: float,
                fixes: list[Fix], title: str) -> Finding:
        samples = ev.value("gpu.util_samples")
        if samples is None or samples < t.min_samples:
            confidence = Confidence.THIN  # one nvidia-smi snapshot may fall between two batches
        else:
            confidence = Confidence.CORRELATED if cause else Confidence.HEURISTIC
        idle = 1.0 - util
        p10, p90 = ev.value("gpu.util_p10_ratio"), ev.value("gpu.util_p90_ratio")
        msg = f"The GPU ran kernels only {pct(util)} of the window while the service had {load}"
        if p10 is not None and p90 is not None and p90 - p10 >= 0.5:
            msg += (f"; it works in bursts (p10 {pct(p10)}, p90 {pct(p90)}): busy for a batch, idle while the next "
                    "is prepared")
        msg += "."
        if cause:
            top = _top(ev)
            msg += (f" The host is the bottleneck: {pct(share)} of its active CPU time is {cause}"
                    + (f" (hottest: {top})" if top else "") + ".")
        else:
            msg += (" No host-side cause was measured. Besides CPU work on the request path, a GPU idles under load "
                    "when a batcher waits to fill a batch (max_queue_delay, batch timeout), a lock or a single "
                    "event loop serialises requests, inputs are fetched slowly (images or files from object "
                    "storage), or the client sends the next request only after the last reply. Attach with py-spy "
                    "(`diagnose attach` does) and the service's log to tell them apart.")
        why = f"GPU busy |{bar(util)}| {pct(util)}\nGPU idle |{bar(idle)}| {pct(idle)}"
        if cause:
            why += f"\nhost cause |{bar(share)}| {pct(share)}"
        return self.finding(
            severity=severity_for(idle),
            confidence=confidence,
            title=title,
            message=msg,
            impact=idle,
            evidence=present(ev, *self.requires, *self.optional),
            why=why,
            fixes=fixes,
        )

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        got = self._starved(ev, t)
        if got is None:
            return None
        key, label, share = self._cause(ev, t)
        if key == "cpu.forward_share":
            return None  # launch overhead: GPU120
        fixes = [_cause_fix(key), _BATCH] if key else [_IDLE_CAUSES, _BATCH]
        return self._report(ev, t, *got, label, share, fixes, "The GPU is starved by the host")


class GpuLaunchBound(GpuStarved):
    """The GPU idles under load while the host spends its time launching the model's kernels.

    What it detects: the same starved GPU as GPU001 (low NVML utilisation under real load), where
    py-spy shows the host's active time in the model's own forward: Python and the framework issuing
    small kernels one at a time, so the GPU finishes each before the next arrives.

    Why it matters: launch overhead does not shrink with faster GPUs (it gets worse: kernels end
    sooner); decode steps of small batches and small models are the typical case. Taking work off the
    request path changes nothing; fewer, larger launches do.

    How it decides: GPU001's load and step-aside checks hold (``gpu.util_ratio`` < ``max_util``,
    requests in flight or running, no compile, copy or link cause), pre/post-processing and
    serialisation are under their bars, and ``cpu.forward_share`` ≥ ``forward_share``: confidence
    *correlated*, *thin* when utilisation was read fewer than ``min_samples`` times. Impact is the
    GPU's idle share.

    Evidence: gpu.util_ratio, cpu.forward_share and one of conn.inflight_mean,
    workers.active_mean, serving.running_mean; optionally the rest of GPU001's evidence.

    Fix: capture the step in CUDA graphs (``torch.compile(mode="reduce-overhead")``,
    ``torch.cuda.CUDAGraph``; serving engines do for decode by default: check it was not disabled,
    e.g. vLLM ``--enforce-eager``), fuse small ops, batch more requests per forward.

    False positives: a model whose forward runs CPU kernels (CPU inference, a CPU-side sampler) shows
    the same profile: check that the device is the GPU; a kernel trace (GPU106, GPU108) measures
    launch gaps directly.
    """

    code = "GPU120"
    name = "gpu-launch-bound"
    category = Category.LAUNCH_OVERHEAD
    requires = ("gpu.util_ratio", "cpu.forward_share")

    def check(self, ev: EvidenceSet, t: GpuStarved.Thresholds) -> Finding | None:
        got = self._starved(ev, t)
        if got is None:
            return None
        key, label, share = self._cause(ev, t)
        if key != "cpu.forward_share":
            return None
        return self._report(ev, t, *got, label + " (launch overhead)", share, [_cause_fix(key), _BATCH],
                            "The GPU waits on kernel launches")


def _top(ev: EvidenceSet) -> str:
    items = _list(ev, "cpu.top.preprocess")[:2]
    return "; ".join(f"{i.get('function', '?')} {pct(float(i.get('share', 0.0)))}" if isinstance(i, dict) else str(i)
                     for i in items)


def _cause_fix(key: str) -> Fix:
    if key == "cpu.preprocess_share":
        return Fix(
            "Take pre-processing off the request thread, or onto the GPU",
            ("Run decode/resize/normalise in a process pool or DataLoader workers so it escapes the GIL",
             "Decode on the GPU (torchvision.io.decode_jpeg(device='cuda'), NVIDIA DALI) and resize/normalise "
             "as tensor ops on the device"),
            Risk.SAFE,
        )
    if key == "cpu.serialize_share":
        return Fix(
            "Make serialisation cheap",
            ("Return binary payloads (raw bytes, numpy tobytes, safetensors) instead of JSON lists",
             "Use orjson or msgspec; pydantic v2 model_validate_json"),
            Risk.NEEDS_VALIDATION,
        )
    return Fix(
        "Cut the per-kernel launch overhead",
        ("Capture the model in CUDA graphs: torch.compile(model, mode='reduce-overhead'), or "
         "torch.cuda.CUDAGraph for a static-shape step; vLLM/TensorRT-LLM use CUDA graphs for decode by default",
         "Fuse small ops (torch.compile, TensorRT) and batch more requests per forward so each launch does more"),
        Risk.NEEDS_VALIDATION,
    )


class GpuSaturated(Rule):
    """The GPU runs kernels all the time: it is the bottleneck (or busy but badly filled).

    What it detects: the target's GPUs run a kernel nearly all the time, steadily; with GPM
    (Hopper and newer) it tells healthy saturation (most SMs busy) from a GPU that is busy in time
    but runs kernels too small to fill it.

    Why it matters: NVML utilisation only says that *a* kernel was running; a batch-1 model can
    show 100 % with most SMs idle. Healthy saturation means the service needs more GPU or cheaper
    kernels; an under-filled GPU needs bigger batches or fused kernels, not more GPUs.

    How it decides: ``gpu.util_ratio`` ≥ ``min_util`` and, when known, ``gpu.util_p10_ratio`` ≥
    ``min_p10`` (steady, not bursts). With ``gpm.sm_activity_ratio`` below ``min_sm_activity``:
    under-filled, impact 1 − SM activity. With it at or above: healthy saturation, severity major
    and impact ``saturated_impact`` (the capacity limit, not a fault; scaled by the clock left when
    the GPU is also throttled, ``gpu.throttle_ratio`` ≥ ``throttled`` with the SM clock at least
    ``min_clock_deficit`` below its maximum, so that GPU003 ranks first), characterised by
    ``gpm.dram_bw_ratio`` ≥ ``dram_bound`` (memory-bandwidth bound, decode-like) or
    ``gpm.tensor_activity_ratio`` ≥ ``tensor_heavy`` (tensor-core bound). Without GPM the same
    finding with heuristic confidence; thin when fewer than ``min_samples`` utilisation readings
    are known (``gpu.util_samples``; a pasted nvidia-smi snapshot has none).

    Evidence: gpu.util_ratio; optionally gpu.util_p10_ratio, gpu.util_samples,
    gpm.sm_activity_ratio, gpm.tensor_activity_ratio, gpm.dram_bw_ratio, gpm.sm_occupancy_ratio,
    gpu.count, gpu.sm_clock_mhz, gpu.sm_clock_max_mhz, gpu.throttle_ratio.

    Fix: saturated: scale out (replicas, tensor parallelism), cheaper arithmetic (FP8/INT8,
    weight-only quantisation for decode), better kernels (FlashAttention, TensorRT, fused ops).
    Under-filled: larger batches, fused kernels, CUDA graphs.

    False positives: another tenant's kernels on the same GPU count in device utilisation
    (``gpu.processes`` shows who is there); a throttled GPU is also "busy" (GPU003 says so).
    """

    code = "GPU002"
    name = "gpu-saturated"
    category = Category.GPU_COMPUTE
    requires: ClassVar[tuple[str, ...]] = ("gpu.util_ratio",)
    optional = (
        "gpu.util_p10_ratio", "gpu.util_samples", "gpm.sm_activity_ratio", "gpm.tensor_activity_ratio",
        "gpm.dram_bw_ratio", "gpm.sm_occupancy_ratio", "gpu.count", "gpu.sm_clock_mhz", "gpu.sm_clock_max_mhz",
        "gpu.throttle_ratio",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_util: float = 0.9  # a kernel runs ≥ 90 % of the time: no room left for the GPU to take more
        min_p10: float = 0.7  # even the quietest tenth of the window is busy: saturation, not bursts
        min_sm_activity: float = 0.5  # under half the SMs busy: the kernels are too small to fill the GPU
        dram_bound: float = 0.6  # ≥ 60 % of peak DRAM bandwidth: memory-bound (LLM decode reads all weights)
        tensor_heavy: float = 0.4  # tensor cores busy ≥ 40 % of the time: math-bound on tensor cores
        saturated_impact: float = 0.5  # healthy saturation is a capacity limit: rank it below fixable faults
        min_samples: float = 10  # fewer utilisation readings than this is a thin measurement
        throttled: float = 0.2  # GPU003's bar: throttled in a fifth of readings, the clocks explain part of it
        min_clock_deficit: float = 0.1  # GPU003's bar: clocks ≥ 10 % below max

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        util = ev.value("gpu.util_ratio", 0.0) or 0.0
        p10 = ev.value("gpu.util_p10_ratio")
        if util < t.min_util or (p10 is not None and p10 < t.min_p10):
            return None
        sm = ev.value("gpm.sm_activity_ratio")
        tensor = ev.value("gpm.tensor_activity_ratio")
        dram = ev.value("gpm.dram_bw_ratio")
        samples = ev.value("gpu.util_samples")
        thin = samples is None or samples < t.min_samples  # an unknown count: a snapshot, not a window
        evidence = present(ev, *self.requires, *self.optional)
        if sm is not None and sm < t.min_sm_activity:
            impact = 1.0 - sm
            return self.finding(
                severity=severity_for(impact),
                confidence=Confidence.THIN if thin else Confidence.MEASURED,
                title="The GPU is busy, but most of its SMs are idle",
                message=(f"A kernel ran {pct(util)} of the window, yet only {pct(sm)} of the SMs were busy on "
                         "average (GPM, or DCGM profiling): the kernels are too small to fill the GPU (small batches, "
                         "many tiny ops). "
                         "More GPUs will not help; more work per kernel will."),
                impact=impact,
                evidence=evidence,
                why=f"time busy |{bar(util)}| {pct(util)}\nSMs busy  |{bar(sm)}| {pct(sm)}",
                fixes=[
                    Fix("Put more work in each kernel",
                        ("Raise the batch size the server forms (dynamic batching; vLLM max_num_seqs / "
                         "max_num_batched_tokens; Triton preferred_batch_size)",
                         "Fuse small ops (torch.compile, TensorRT) and capture the step in CUDA graphs",
                         "Check kernel grid sizes in Nsight Systems/Compute: kernels of a few blocks on a GPU "
                         "with 100+ SMs leave most of it idle"),
                        Risk.NEEDS_VALIDATION),
                ],
            )
        if dram is not None and dram >= t.dram_bound:
            kind = (f"memory-bandwidth bound ({pct(dram)} of peak DRAM bandwidth): typical of LLM decode, "
                    "which reads every weight for each token")
        elif tensor is not None and tensor >= t.tensor_heavy:
            kind = f"tensor-core bound (tensor cores busy {pct(tensor)} of the time)"
        elif sm is not None:
            kind = (f"SM bound with little tensor-core use ({pct(tensor or 0.0)}): check that the model runs in "
                    "FP16/BF16/FP8, not FP32")
        else:
            kind = ""
        if sm is not None:
            msg = (f"A kernel ran {pct(util)} of the window with {pct(sm)} of the SMs busy (GPM or DCGM profiling): "
                   f"the GPU is the bottleneck and it is well used; {kind}.")
            confidence = Confidence.THIN if thin else Confidence.MEASURED
        else:
            msg = (f"A kernel ran {pct(util)} of the window"
                   + (f" (p10 {pct(p10)})" if p10 is not None else "")
                   + ": the GPU is the bottleneck. NVML utilisation counts time a kernel runs, not how much of the "
                   "GPU it fills; this GPU has no GPM metrics to tell.")
            confidence = Confidence.THIN if thin else Confidence.HEURISTIC
        impact = t.saturated_impact
        clock, clock_max = ev.value("gpu.sm_clock_mhz"), ev.value("gpu.sm_clock_max_mhz")
        deficit = (1.0 - clock / clock_max) if clock is not None and clock_max else 0.0
        if (ev.value("gpu.throttle_ratio", 0.0) or 0.0) >= t.throttled and deficit >= t.min_clock_deficit:
            # part of the saturation is lost clock: the throttling finding (GPU003) is the fix to try first
            impact *= 1.0 - deficit
            msg += f" Its clocks run {pct(deficit)} below maximum, though: fix the throttling first (GPU003)."
        why = f"GPU busy |{bar(util)}| {pct(util)}"
        if sm is not None:
            why += f"\nSMs busy |{bar(sm)}| {pct(sm)}"
        return self.finding(
            severity=Severity.MAJOR,
            confidence=confidence,
            title="The GPU is saturated",
            message=msg,
            impact=impact,
            evidence=evidence,
            why=why,
            fixes=[
                Fix("Add GPU capacity",
                    ("Add replicas behind the load balancer, or shard the model (tensor parallelism) across GPUs",
                     "Move to a faster GPU generation if the model is compute-bound"),
                    Risk.SAFE),
                Fix("Make each request cheaper on the GPU",
                    ("Lower precision: FP8 (H100+) or INT8; for decode-heavy LLMs weight-only quantisation "
                     "(AWQ/GPTQ) and an FP8 KV cache cut the bytes read per token",
                     "Use optimised kernels: FlashAttention, TensorRT / TensorRT-LLM engines, fused ops "
                     "(torch.compile)"),
                    Risk.NEEDS_VALIDATION),
            ],
        )


class GpuThrottling(Rule):
    """The GPU lowers its clocks for power or heat while it works.

    What it detects: NVML's clock-event reasons show thermal slowdown, hardware slowdown (power
    brake, an external signal) or the software power cap for a large share of the window while the
    GPU is busy, with the SM clock well below its maximum.

    Why it matters: compute-bound work slows in proportion to the clock; a GPU at 1.1 GHz instead
    of 1.75 takes about 60 % longer per kernel. Thermal and hardware slowdowns are faults of the
    machine (cooling, airflow, power delivery); a power limit set below the board's default is a
    configuration someone chose.

    How it decides: ``gpu.throttle_ratio`` (readings with a power-cap, thermal or hardware reason;
    GpuIdle, ApplicationsClocksSetting and SyncBoost do not count) ≥ ``min_ratio``, the GPU busy
    (``gpu.util_ratio`` ≥ ``min_util``: clocks of an idle GPU cost nothing; with no utilisation
    measured, as in ``nvidia-smi -q -d PERFORMANCE``, the reasons themselves must show the GPU not
    idle, GpuIdle off, and the confidence is heuristic) and, when known, the SM
    clock at least ``min_clock_deficit`` below its maximum. Thermal or hardware reasons in ≥
    ``min_ratio`` of readings: major (critical when the clock deficit reaches ``critical_deficit``
    for at least half the window). The power cap alone: major when the enforced limit is below
    ``lowered_limit`` × the default, otherwise minor (a busy GPU at its rated power is expected to
    trade clock for power). Impact is the throttled share × the clock deficit: the share of
    compute time lost.

    Evidence: gpu.throttle_ratio and gpu.util_ratio or gpu.throttle_reasons; optionally
    gpu.thermal_throttle_ratio, gpu.hw_slowdown_ratio, gpu.power_cap_ratio, gpu.sm_clock_mhz,
    gpu.sm_clock_max_mhz, gpu.power_w, gpu.power_limit_w, gpu.power_default_limit_w, gpu.temp_c,
    gpu.temp_slowdown_c, gpu.thermal_violation_ratio, gpu.power_violation_ratio.

    Fix: thermal: airflow, fan curves, inlet temperature, dust, failed fans, data-centre cooling;
    hardware slowdown: PSU and power-cable health, the BMC's event log; a lowered power limit:
    ``nvidia-smi -pl <default W>``; at the rated limit: more efficient kernels or lower precision.

    False positives: reasons flagged for an instant at each sample (hence the busy and clock
    checks); a power-capped GPU running memory-bound work loses little (the clock deficit overstates
    it); deliberate power capping for energy efficiency (then the finding is right and the choice
    is the operator's).
    """

    code = "GPU003"
    name = "gpu-throttling"
    category = Category.GPU_COMPUTE
    requires = ("gpu.throttle_ratio",)
    requires_any = (("gpu.util_ratio",), ("gpu.throttle_reasons",))
    optional = (
        "gpu.util_ratio", "gpu.throttle_reasons", "gpu.thermal_throttle_ratio", "gpu.hw_slowdown_ratio",
        "gpu.power_cap_ratio",
        "gpu.sm_clock_mhz", "gpu.sm_clock_max_mhz", "gpu.power_w", "gpu.power_limit_w", "gpu.power_default_limit_w",
        "gpu.temp_c", "gpu.temp_slowdown_c", "gpu.thermal_violation_ratio", "gpu.power_violation_ratio",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_ratio: float = 0.2  # a fifth of the readings throttled: sustained, not a transient
        min_util: float = 0.3  # a GPU busy under 30 % of the time loses little to lower clocks
        min_clock_deficit: float = 0.1  # clocks within 10 % of max: GPU Boost's normal range, not throttling
        critical_deficit: float = 0.3  # clocks ≥ 30 % down: kernels take ≥ 40 % longer
        lowered_limit: float = 0.95  # an enforced limit under 95 % of the default was lowered on purpose

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        ratio = ev.value("gpu.throttle_ratio", 0.0) or 0.0
        measured = ev.value("gpu.util_ratio")
        if measured is None:  # no utilisation (nvidia-smi -q -d PERFORMANCE): the driver's own Idle reason
            reasons = ev.get("gpu.throttle_reasons")
            if not isinstance(reasons, Evidence) or not isinstance(reasons.value, list) or "GpuIdle" in reasons.value:
                return None
        util = measured if measured is not None else 1.0
        if ratio < t.min_ratio or util < t.min_util:
            return None
        busy = f"{pct(util)} busy" if measured is not None else "not idle (the driver's Idle reason was off)"
        clock, clock_max = ev.value("gpu.sm_clock_mhz"), ev.value("gpu.sm_clock_max_mhz")
        deficit = (1.0 - clock / clock_max) if clock is not None and clock_max else None
        if deficit is not None and deficit < t.min_clock_deficit:
            return None
        thermal = ev.value("gpu.thermal_throttle_ratio", 0.0) or 0.0
        hw = ev.value("gpu.hw_slowdown_ratio", 0.0) or 0.0
        power = ev.value("gpu.power_cap_ratio", 0.0) or 0.0
        limit, default = ev.value("gpu.power_limit_w"), ev.value("gpu.power_default_limit_w")
        lowered = limit is not None and default is not None and limit < t.lowered_limit * default
        temp, slowdown = ev.value("gpu.temp_c"), ev.value("gpu.temp_slowdown_c")
        clocks = (f"the SM clock averaged {clock:.0f} MHz of {clock_max:.0f} MHz ({pct(deficit)} down)"
                  if clock is not None and clock_max and deficit is not None else "clocks were lowered")
        parts: list[str] = []
        fixes: list[Fix] = []
        if max(thermal, hw) >= t.min_ratio:
            heat = thermal >= hw
            severity = (Severity.CRITICAL if deficit is not None and deficit >= t.critical_deficit
                        and max(thermal, hw) >= 0.5 else Severity.MAJOR)
            title = "The GPU throttles: thermal slowdown" if heat else "The GPU throttles: hardware slowdown"
            parts.append(f"{'Thermal' if heat else 'Hardware'} slowdown held the clocks down in "
                         f"{pct(max(thermal, hw))} of readings while the GPU was {busy}; {clocks}.")
            if temp is not None:
                parts.append(f"It reached {temp:.0f} °C" + (f" (slowdown at {slowdown:.0f} °C)." if slowdown else "."))
            fixes.append(Fix("Fix the cooling or power delivery",
                             ("Check fans, airflow and inlet temperature (nvidia-smi -q -d TEMPERATURE,PERFORMANCE); "
                              "clear dust, fix blanking panels, check the rack's cooling",
                              "Hardware slowdown without heat: check PSUs and GPU power cables, and the BMC/IPMI "
                              "event log (power brake is asserted by the system)",
                              "Move the service to another node while the machine is repaired"),
                             Risk.SAFE))
        else:
            severity = Severity.MAJOR if lowered else Severity.MINOR
            title = "The GPU is held at its power limit"
            parts.append(f"The software power cap held the clocks down in {pct(power)} of readings while the GPU "
                         f"was {busy}; {clocks}.")
        if limit is not None:
            draw = ev.value("gpu.power_w")
            parts.append((f"Drawing {draw:.0f} W " if draw is not None else "")
                         + f"against an enforced limit of {limit:.0f} W"
                         + (f", lowered from the board's default {default:.0f} W." if lowered and default else "."))
        if lowered and default is not None:
            fixes.append(Fix("Restore the default power limit",
                             (f"nvidia-smi -i <gpu> -pl {default:.0f} (as root; persists until reboot, set it in the "
                              "node's provisioning to keep it)",),
                             Risk.NEEDS_VALIDATION))
        fixes.append(Fix("Do the same work with less power",
                         ("Lower precision (BF16/FP8, INT8) and fused kernels do more per joule",
                          "Spread load across more GPUs so each runs below its limit"),
                         Risk.NEEDS_VALIDATION))
        impact = ratio * (deficit if deficit is not None else 0.15)
        why = f"throttled |{bar(ratio)}| {pct(ratio)} of readings"
        if deficit is not None:
            why += f"\nclock     |{bar(1 - deficit)}| {pct(1 - deficit)} of max"
        return self.finding(
            severity=severity,
            confidence=Confidence.MEASURED if measured is not None else Confidence.HEURISTIC,
            title=title,
            message=" ".join(parts),
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=why,
            fixes=fixes,
        )


class PcieLinkDegraded(Rule):
    """The GPU's PCIe link trained below its rated generation or width, and it carries real traffic.

    What it detects: the link's current generation or width, read while the link is loaded, is
    below the maximum the GPU and slot support (e.g. gen3 x8 on a gen4 x16 device), while
    host↔device traffic is substantial.

    Why it matters: every halving of generation or width halves the copy bandwidth: gen3 x8 moves
    about 7.9 GB/s per direction where gen4 x16 moves 31.5. Copies that fit in the shadow of
    compute on a healthy link become the bottleneck. Causes are physical or firmware: a card in an
    x8-wired slot, a riser, dirty contacts, BIOS link settings.

    How it decides: ``pcie.link_gen`` < ``pcie.link_gen_max`` or ``pcie.link_width`` <
    ``pcie.link_width_max``. An idle GPU drops its link to gen1 to save power and raises it within
    microseconds under load, so a low generation only counts when read under load
    (``pcie.loaded_samples`` ≥ ``min_loaded_samples``); width does not change with power states. With
    the busiest 20 ms reading (``pcie.peak_bytes_per_s``, else the mean) below
    ``min_traffic_bytes_per_s`` the link is degraded but not the bottleneck: an informational
    finding. Otherwise impact is the degraded link's mean utilisation × the bandwidth lost
    (1 − current / rated capacity), at least ``min_impact``. PCIe replays
    (``pcie.replay_count_delta``) are reported as a sign of a marginal link.

    Evidence: pcie.link_gen, pcie.link_gen_max, pcie.link_width, pcie.link_width_max; optionally
    pcie.loaded_samples, pcie.tx_bytes_per_s, pcie.rx_bytes_per_s, pcie.peak_bytes_per_s,
    pcie.link_capacity_bytes_per_s, pcie.link_capacity_max_bytes_per_s, pcie.replay_count_delta,
    pcie.link_gen_gpu_max.

    Fix: reseat the card, move it to a slot wired x16 to the CPU (not through a switch or the
    chipset), check risers and cables, set the slot to Auto/GenN in the BIOS; compare ``lspci -vv``
    LnkCap with LnkSta. Meanwhile cut the traffic: pinned memory, fewer and larger copies, keep
    tensors on the device.

    False positives: a generation read at idle (excluded); platforms that deliberately bifurcate a
    slot (then x8 is the design, and the maximum NVML reports is usually x8 too).
    """

    code = "GPU004"
    name = "pcie-link-degraded"
    category = Category.PCIE_TRANSFER
    requires = ("pcie.link_gen", "pcie.link_gen_max", "pcie.link_width", "pcie.link_width_max")
    optional = (
        "pcie.loaded_samples", "pcie.tx_bytes_per_s", "pcie.rx_bytes_per_s", "pcie.peak_bytes_per_s",
        "pcie.link_capacity_bytes_per_s", "pcie.link_capacity_max_bytes_per_s", "pcie.replay_count_delta",
        "pcie.link_gen_gpu_max",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_loaded_samples: float = 3  # three readings under load: the link had time to train up
        min_traffic_bytes_per_s: float = 1e9  # 1 GB/s in a 20 ms reading is real copying, not driver chatter
        min_impact: float = 0.1  # a degraded link under real traffic costs something even when not full

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        gen, gen_max = ev.value("pcie.link_gen", 0.0) or 0.0, ev.value("pcie.link_gen_max", 0.0) or 0.0
        width, width_max = ev.value("pcie.link_width", 0.0) or 0.0, ev.value("pcie.link_width_max", 0.0) or 0.0
        gen_low, width_low = gen < gen_max, width < width_max
        loaded_n = ev.value("pcie.loaded_samples")
        loaded = loaded_n is None or loaded_n >= t.min_loaded_samples
        if gen_low and not loaded:
            gen_low = False  # read at idle: power saving, not a fault
        if not gen_low and not width_low:
            return None
        tx, rx = ev.value("pcie.tx_bytes_per_s"), ev.value("pcie.rx_bytes_per_s")
        mean = max(tx or 0.0, rx or 0.0)
        peak = ev.value("pcie.peak_bytes_per_s", mean) or mean
        cap = ev.value("pcie.link_capacity_bytes_per_s")
        cap_max = ev.value("pcie.link_capacity_max_bytes_per_s")
        replays = ev.value("pcie.replay_count_delta")
        now = f"gen{gen:.0f} x{width:.0f}" + (f" ({_gbps(cap)} per direction)" if cap else "")
        rated = f"gen{gen_max:.0f} x{width_max:.0f}" + (f" ({_gbps(cap_max)})" if cap_max else "")
        msg = f"The GPU's PCIe link runs at {now} instead of {rated}"
        evidence = present(ev, *self.requires, *self.optional)
        replay_note = (f" {replays:.0f} PCIe replays (retransmitted packets) in the window point at a marginal "
                       "connection: riser, slot or contacts." if replays else "")
        fixes = [
            Fix("Restore the full link",
                ("Compare `sudo lspci -vv -s <bus id>` LnkCap with LnkSta, and `nvidia-smi -q -d PCI` "
                 "(Link Width / Generation, Max vs Current) under load",
                 "Reseat the card; use a slot wired x16 to the CPU; check risers and cables; set the slot's link "
                 "speed to Auto or the card's generation in the BIOS"),
                Risk.SAFE),
            Fix("Move fewer bytes until then",
                ("Copy from pinned memory with non_blocking=True, in few large copies; keep tensors on the device "
                 "between steps",),
                Risk.SAFE),
        ]
        if (tx is None and rx is None) or peak < t.min_traffic_bytes_per_s:
            return self.finding(
                severity=Severity.INFO, confidence=Confidence.MEASURED,
                title="PCIe link below its rating (not loaded now)",
                message=msg + (f"; traffic peaked at {_gbps(peak)}, so it costs nothing at this load."
                               if tx is not None or rx is not None else "; no traffic was measured.") + replay_note,
                impact=0.05, evidence=evidence, fixes=fixes,
            )
        direction = "host → device" if (rx or 0.0) >= (tx or 0.0) else "device → host"
        used = min(1.0, mean / cap) if cap else None
        lost = 1.0 - cap / cap_max if cap and cap_max else 0.5
        impact = max(t.min_impact, (used if used is not None else 0.5) * lost)
        msg += (f" while carrying {_gbps(mean)} {direction} on average (peak {_gbps(peak)})"
                + (f": {pct(used)} of what the degraded link can move" if used is not None else "")
                + f". At the rated link the same copies would take {pct(1 - lost)} of the time." + replay_note)
        why = (f"link now  |{bar(cap / cap_max if cap and cap_max else 0.5)}| {now}\n"
               + (f"traffic   |{bar((mean / cap_max) if cap_max else 0.0)}| {_gbps(mean)}" if cap_max else ""))
        return self.finding(
            severity=severity_for(impact),
            confidence=Confidence.MEASURED,
            title="The GPU's PCIe link is degraded",
            message=msg,
            impact=impact,
            evidence=evidence,
            why=why,
            fixes=fixes,
        )


class MemoryHeldByOtherProcess(Rule):
    """Processes outside the service hold a large part of its GPU's memory.

    What it detects: while attached, NVML lists processes that are not in the target's process
    tree holding a large share of the memory of the target's GPU.

    Why it matters: that memory is not available to the service: vLLM sizes its KV cache from
    what is free at start-up (fewer concurrent sequences, more preemption), PyTorch services OOM on
    the next spike, and a restart may not even start. A stale process from an earlier run, a
    notebook, or another team's job on a shared GPU is the usual holder.

    How it decides: ``mem.other_processes_share_ratio`` (else ``mem.other_processes_bytes`` /
    ``gpu.memory_total_bytes``) ≥ ``min_share``. Major when the device is nearly full
    (``gpu.memory_used_bytes`` ≥ ``full_share`` of it) or others hold ≥ ``major_share``; minor
    otherwise. Impact is the share held by others. When an out-of-memory error was seen
    (``mem.oom_count`` ≥ 1), MEM004 owns the incident and reads the same key: no second finding.

    Evidence: mem.other_processes_bytes and mem.other_processes_share_ratio or
    gpu.memory_total_bytes; optionally gpu.memory_used_bytes, mem.process_used_bytes, gpu.processes,
    mem.oom_count.

    Fix: find and stop the holder, give each service its own GPU (CUDA_VISIBLE_DEVICES, MIG, a
    device plugin without time-slicing); when sharing is intended, cap each tenant
    (``--gpu-memory-utilization``, ``torch.cuda.set_per_process_memory_fraction``).

    False positives: processes of the same service that are not its children (Ray workers of a
    vLLM deployment, a separate tokeniser or embedding server), the MPS control daemon, and a pid
    mapping NVML could not resolve (then the key is not produced at all).
    """

    code = "GPU005"
    name = "memory-held-by-other-process"
    category = Category.OOM_EXTERNAL
    requires = ("mem.other_processes_bytes",)
    requires_any = (("mem.other_processes_share_ratio",), ("gpu.memory_total_bytes",))
    optional = (
        "mem.other_processes_share_ratio", "gpu.memory_total_bytes", "gpu.memory_used_bytes",
        "mem.process_used_bytes", "gpu.processes", "mem.oom_count",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.25  # a quarter of the device held elsewhere changes what the service can do (as MEM004)
        major_share: float = 0.5  # others hold most of the device
        full_share: float = 0.9  # the device ≥ 90 % used: the service has no room to grow

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        if (ev.value("mem.oom_count", 0.0) or 0.0) >= 1:
            return None
        others = ev.value("mem.other_processes_bytes", 0.0) or 0.0
        total = ev.value("gpu.memory_total_bytes")
        share = ev.value("mem.other_processes_share_ratio")
        if share is None:
            if not total:
                return None
            share = others / total
        if share < t.min_share:
            return None
        used = ev.value("gpu.memory_used_bytes")
        mine = ev.value("mem.process_used_bytes")
        full = used is not None and bool(total) and used / float(total or 1.0) >= t.full_share
        severity = Severity.MAJOR if full or share >= t.major_share else Severity.MINOR
        holders = [p for p in _list(ev, "gpu.processes") if isinstance(p, dict) and p.get("is_target") is False]
        named = ", ".join(f"pid {p.get('pid')}" + (f" ({p['name']})" if p.get("name") else "")
                          + (f" {size(float(p['used_bytes']), 1)}" if p.get("used_bytes") is not None else "")
                          for p in holders[:4])
        where = _detail(ev, "gpu.memory_total_bytes").split(",")[0] or "the GPU"
        msg = (f"Processes outside the service hold {size(others, 1)} ({pct(share)}) of {where}"
               + (f"'s {size(total, 1)}" if total else "")
               + (f": {named}" if named else "") + "."
               + (f" The service itself holds {size(mine, 1)}." if mine is not None else ""))
        if full and used is not None and total:
            msg += (f" The device is {pct(used / total)} full: the service cannot grow its batches or KV cache, "
                    "and its next allocation spike will fail.")
        return self.finding(
            severity=severity,
            confidence=Confidence.MEASURED,
            title="Another process holds the GPU's memory",
            message=msg,
            impact=share,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"others |{bar(share)}| {pct(share)}"
                + (f"\nservice |{bar(mine / total)}| {pct(mine / total)}" if mine is not None and total else ""),
            fixes=[
                Fix("Find and stop the holder",
                    ("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
                     "Kill stale processes from earlier runs (fuser -v /dev/nvidia*); in Kubernetes check for "
                     "time-sliced or shared GPUs on the node",
                     "Give each service its own GPU (CUDA_VISIBLE_DEVICES) or a MIG slice"),
                    Risk.SAFE),
                Fix("If the GPU is shared on purpose, cap each tenant",
                    ("vLLM: --gpu-memory-utilization sized to this service's share",
                     "PyTorch: torch.cuda.set_per_process_memory_fraction(share) in each process"),
                    Risk.NEEDS_VALIDATION),
            ],
        )


class DecodeAtBandwidthRoofline(Rule):
    """One stream generates tokens as fast as the GPU's memory can deliver the weights: expected.

    What it detects: a single stream's generation speed (tokens per second the report or a llama.cpp /
    engine log states) for a model of known size on a named GPU, at half or more of the speed the
    GPU's memory bandwidth allows: each generated token reads every weight once.

    Why it matters: "only 65 tokens/s on a 4090 for a 7B model" is the hardware's limit, not a fault
    (13.5 GB of fp16 weights at 1,008 GB/s is 75 tokens/s at best). Looking for a bottleneck there
    wastes the on-call engineer's time; what helps is fewer bytes per token or more tokens per read.

    How it decides: ``report.decode_tokens_per_s`` (else ``serving.generation_tokens_per_s`` with at
    most one running request) over the roofline ``bandwidth / (model.params × bytes per parameter)``
    (bytes from ``mem.weights_estimate_bytes``, else 2 for 16-bit) is between ``min_share`` and
    ``max_share`` (above it the numbers do not describe one dense stream: a batch, a mixture of
    experts, speculative decoding), with no concurrency above one stated. Bandwidth from
    ``diagnose.rules.hardware.MEMORY_GBPS`` for ``gpu.name``. A note (info, no category).

    Evidence: model.params, gpu.name and one of report.decode_tokens_per_s,
    serving.generation_tokens_per_s; optionally mem.weights_estimate_bytes, report.concurrency_max,
    serving.running_max, mem.tensor_parallel.

    Fix: nothing is wrong. Faster single streams: quantise the weights (4-bit reads a quarter of the
    bytes), speculative decoding; more total throughput: batch concurrent requests (the same weight
    read serves every sequence in the batch).

    False positives: a mixture-of-experts model reads only its active experts: the roofline is higher
    and the note stays silent unless its active size is given; KV-cache reads at long context add to
    the bytes per token (the roofline is then lower, and the share higher).
    """

    code = "GPU121"
    name = "decode-at-bandwidth-roofline"
    category = None
    requires = ("model.params", "gpu.name")
    requires_any = (("report.decode_tokens_per_s",), ("serving.generation_tokens_per_s",))
    optional = ("report.decode_tokens_per_s", "serving.generation_tokens_per_s", "mem.weights_estimate_bytes",
                "report.concurrency_max", "serving.running_max", "mem.tensor_parallel")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.5  # half the roofline: a single stream rarely gets more than 60-80 % of it
        max_share: float = 1.3  # above the roofline the rate is not one dense stream's (batch, MoE, speculation)

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        from diagnose.rules import hardware

        spec = hardware.memory_gbps(hardware.gpu_name(ev))
        params = ev.value("model.params")
        if spec is None or not params:
            return None
        rate = ev.value("report.decode_tokens_per_s")
        if rate is None:
            running = ev.value("serving.running_max")
            if running is not None and running > 1.5:
                return None
            rate = ev.value("serving.generation_tokens_per_s")
        if not rate or (ev.value("report.concurrency_max") or 1.0) > 1.0:
            return None
        gpu, gbps = spec
        devices = max(1, int(ev.value("mem.tensor_parallel") or 1))
        weights = ev.value("mem.weights_estimate_bytes") or 2.0 * params
        roof = gbps * 1e9 * devices / weights
        share = rate / roof
        if not t.min_share <= share <= t.max_share:
            return None
        on = f"{devices} × {gpu}" if devices > 1 else f"the {gpu}"
        msg = (f"{rate:,.1f} tokens/s is {pct(share)} of what {on}'s memory allows one stream: every token reads the "
               f"{weights / 1e9:,.1f} GB of weights of a {params / 1e9:,.3g}B-parameter model, and at "
               f"{gbps * devices:,.0f} GB/s that is at most {roof:,.0f} tokens/s. Generation is bound by memory "
               "bandwidth, as it should be for a single stream: this speed is expected.")
        return self.finding(
            severity=Severity.INFO,
            confidence=Confidence.HEURISTIC,
            title="Generation runs at the memory-bandwidth limit: expected",
            message=msg,
            impact=0.0,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"of the roofline |{bar(min(1.0, share))}| {pct(share)}",
            fixes=[Fix("Only if one stream must be faster", (
                "Quantise the weights (AWQ/GPTQ 4-bit, fp8): fewer bytes read per token",
                "Speculative decoding (a small draft model; vLLM --speculative-config, llama.cpp -md)",
                "For more total throughput, serve concurrent requests in one batch: one weight read serves them all",
            ), Risk.NEEDS_VALIDATION)],
        )


class PowerLimitSetsPace(Rule):
    """A sweep of the GPU's power limit shows the work's speed following the limit: the GPU's clock sets the pace.

    What it detects: a table of one workload run at several power limits (a first column of caps in watts, "cap",
    "Cap (W)", "power limit"; ``nvidia-smi -pl`` sweeps) with the work's rate or time per run beside each
    (``scaling.power_cap_speedup`` from the lowest cap to the highest, ``scaling.power_cap_range`` their ratio).

    Why it matters: under a power limit the GPU lowers its SM clock until its draw fits; work whose speed follows the
    limit is bound by the GPU's arithmetic at that clock (GPU003's power-cap throttling, measured end to end). More
    power (or a more efficient kernel, a lower precision) makes it faster; nothing on the host does.

    How it decides: the cap spans at least ``min_range`` × and the work runs at least ``min_speedup`` × faster at the
    highest cap; the speed follows the cap at least ``min_elasticity`` (log speedup / log range: 1 is proportional).
    Confidence measured (a controlled sweep); impact is the share of the time the highest cap saves, 1 − 1 / speedup.

    Evidence: scaling.power_cap_speedup, scaling.power_cap_range.

    Fix: raise the limit toward the board's default (``nvidia-smi -pl``) where power and cooling allow; otherwise less
    arithmetic per result: lower precision (fp8/int4 weights), fused kernels, a smaller model.

    False positives: a sweep run once per cap in a noisy environment (a gain of a few per cent may be noise: hence
    ``min_speedup``); the first cap's run paying a warm-up the others do not.
    """

    code = "GPU006"
    name = "power-limit-sets-pace"
    category = Category.GPU_COMPUTE
    requires = ("scaling.power_cap_speedup", "scaling.power_cap_range")

    @dataclass(frozen=True)
    class Thresholds:
        min_range: float = 1.04  # caps at least 4 % apart
        min_speedup: float = 1.03  # 3 % faster at the highest cap: more than a run's noise
        min_elasticity: float = 0.25  # the speed gains at least a quarter of the cap's growth (in log terms)

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        speedup = ev.value("scaling.power_cap_speedup") or 0.0
        span = ev.value("scaling.power_cap_range") or 0.0
        if span < t.min_range or speedup < t.min_speedup:
            return None
        elasticity = math.log(speedup) / math.log(span)
        if elasticity < t.min_elasticity:
            return None
        saved = 1.0 - 1.0 / speedup
        return self.finding(
            severity=Severity.MAJOR if saved >= 0.1 else Severity.MINOR,
            confidence=Confidence.MEASURED,
            title="The GPU's power limit sets the pace",
            message=(f"Across the power-limit sweep the work runs {speedup:.2f}× faster at the highest cap than at the "
                     f"lowest ({span:.2f}× the watts): its speed follows the GPU's clock under the limit "
                     f"({elasticity:.0%} as fast as the cap grows), so the GPU's arithmetic sets the pace."),
            impact=saved,
            evidence=present(ev, *self.requires),
            why=f"power    |{bar(min(1.0, span - 1.0))}| ×{span:.2f}\nspeed    |{bar(min(1.0, speedup - 1.0))}| "
                f"×{speedup:.2f}",
            fixes=[
                Fix("Give the GPU its power", (
                    "nvidia-smi -q -d POWER: the enforced limit against the default; raise it with nvidia-smi -pl "
                    "<W> where the PSU and cooling allow",), Risk.NEEDS_VALIDATION),
                Fix("Do less arithmetic per result", (
                    "Lower precision (fp8 / int4 weights), fused kernels (flash attention, torch.compile), a smaller "
                    "model or fewer diffusion steps",), Risk.NEEDS_VALIDATION),
            ],
        )


RULES: tuple[type[Rule], ...] = (GpuStarved, GpuLaunchBound, GpuSaturated, GpuThrottling, PcieLinkDegraded,
                                  MemoryHeldByOtherProcess, DecodeAtBandwidthRoofline, PowerLimitSetsPace)
