"""The GPU timeline of an Nsight Systems export: what keeps the GPU busy, and what keeps it idle.

These rules read the ``trace.*``, ``copy.*`` and ``api.*`` evidence that ``analyzer/derive/nsys.py``
derives from an export's kernels, copies, CUDA calls and NVTX ranges. Unlike the ``nsys stats``
totals (XFR001), the timeline tells copies that run *alongside* kernels from copies the GPU waits
on, and host-scale idle gaps from launch-scale ones; the rules use that to avoid the classic false
alarms: a microsecond pageable copy in a compute-bound trace, host stalls while the GPU is busy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Quality, Risk, Severity
from diagnose.rules.base import Rule, bar, present, severity_for
from diagnose.units import pct, size

HOST_GAP_BUCKETS = ("100us-1ms", "1ms-10ms", ">=10ms")  # idle gaps the host's own work leaves
LAUNCH_GAP_BUCKETS = ("<10us", "10us-100us")  # idle gaps of launch latency


def _confidence(ev: EvidenceSet, keys: tuple[str, ...], default: Confidence = Confidence.MEASURED) -> Confidence:
    """Thin when the timeline is too short to judge (its evidence carries quality LOW)."""
    for k in keys:
        got = ev.get(k)
        if isinstance(got, Evidence) and got.quality is Quality.LOW:
            return Confidence.THIN
    return default


def _hist_ms(ev: EvidenceSet, buckets: tuple[str, ...]) -> float | None:
    """Idle time in the named gap buckets of ``trace.idle_gaps.histogram`` (ms)."""
    got = ev.get("trace.idle_gaps.histogram")
    if not isinstance(got, Evidence) or not isinstance(got.value, dict):
        return None
    total = 0.0
    for b in buckets:
        cell: Any = got.value.get(b)
        if isinstance(cell, dict) and isinstance(cell.get("time_ms"), int | float):
            total += float(cell["time_ms"])
    return total


def _table(ev: EvidenceSet, key: str) -> list[dict[str, Any]]:
    got = ev.get(key)
    if isinstance(got, Evidence) and isinstance(got.value, list):
        return [r for r in got.value if isinstance(r, dict)]
    return []


def _host_stage(ev: EvidenceSet, max_gpu_ratio: float) -> dict[str, Any] | None:
    """The NVTX stage with the most host time during which the GPU stayed mostly idle."""
    best: dict[str, Any] | None = None
    for row in _table(ev, "trace.nvtx_ranges"):
        ratio, cpu = row.get("gpu_ratio"), row.get("in_gpu_window_ms")
        if isinstance(ratio, int | float) and isinstance(cpu, int | float) and cpu > 0 and ratio <= max_gpu_ratio and (
                best is None or cpu > best["in_gpu_window_ms"]):
            best = row
    return best


_PIN = Fix(
    "Pin the host buffers the copies use",
    (
        "PyTorch: DataLoader(pin_memory=True), or allocate staging tensors once with .pin_memory() and copy into "
        "them; then .to('cuda', non_blocking=True)",
        "CUDA: cudaHostAlloc/cudaMallocHost for new buffers, cudaHostRegister for existing ones; pinned copies "
        "reach the link's bandwidth and can overlap kernels",
    ),
    Risk.SAFE,
)
_OVERLAP = Fix(
    "Overlap copies with compute",
    (
        "Issue the next batch's host→device copy on a side stream (torch.cuda.Stream + non_blocking=True, or "
        "cudaMemcpyAsync on its own stream) while the current batch computes; double-buffer the input",
        "Prefetch: start the copy of batch N+1 before launching batch N's kernels; record an event and make the "
        "compute stream wait on it instead of synchronising the host",
    ),
    Risk.NEEDS_VALIDATION,
)
_LESS_DATA = Fix(
    "Move fewer bytes over PCIe",
    (
        "Keep weights and reused tensors resident on the GPU; with FSDP/DeepSpeed CPU offload, disable it when "
        "the model fits (offload streams the parameters over PCIe every step)",
        "Send compact inputs and expand on the GPU: uint8 images instead of float32, token ids instead of "
        "embeddings, FP16/BF16 instead of FP32",
        "Copy results back once per batch, not per request or per step",
    ),
    Risk.NEEDS_VALIDATION,
)


_BATCH_SMALL = Fix(
    "Batch small copies into one",
    (
        "Gather the small tensors into one contiguous (pinned) staging buffer and copy it with a single "
        "non_blocking .to('cuda') / cudaMemcpyAsync, then split on the device",
        "Keep per-step scalars (step counters, masks, lengths) on the GPU instead of copying them every step",
    ),
    Risk.SAFE,
)


class CopyBoundGpu(Rule):
    """Host↔device copies occupy the GPU timeline while no kernel runs: the GPU waits on PCIe.

    What it detects: in an Nsight Systems timeline, the share of the GPU's busy time in which copies
    (or memsets) run and no kernel does, and says whether those copies come from pageable or
    pinned host memory and whether they are limited by bandwidth or by sheer volume.

    Why it matters: a GPU that spends its active window moving data is as slow as its PCIe link:
    about 12 GB/s on gen3 x16, 25 GB/s on gen4, 50 GB/s on gen5 from pinned memory, and a fraction
    of that from pageable memory (staged through a driver buffer, one chunk at a time). Faster
    kernels change nothing.

    How it decides: ``copy.exposed_share`` (busy time with copies but no kernel, over busy time) ≥
    ``min_exposed`` and the copies add up to at least ``min_copy_ms``. Impact is the exposed
    share of the GPU's whole active window (``copy.exposed_share`` × ``trace.gpu_busy_ratio``).
    Pageable when ``copy.pageable_ratio`` ≥ ``pageable_majority`` of host↔device bytes: pin first.
    Otherwise the copies are pinned: at ≥ ``good_gbps`` achieved they are volume-bound (move fewer
    bytes, overlap them); below it, mostly small copies (``copy.small_count``) point to per-copy
    latency, else to a slow link (GPU004 checks the link with NVML).

    Evidence: copy.exposed_share, trace.gpu_busy_ratio, copy.time_ms; optionally copy.h2d_bytes,
    copy.d2h_bytes, copy.h2d_gbps, copy.d2h_gbps, copy.pageable_ratio, copy.pageable_gbps,
    copy.pinned_gbps, copy.count, copy.small_count, gpu.kernel_time_ms, trace.window_ms,
    copy.time_share, copy.sync_count.

    Fix: pinned memory and non_blocking copies (pageable case); move fewer bytes (keep tensors
    resident, no parameter offload, compact inputs); overlap copies with compute on a side stream.

    False positives: a capture that starts with the weights being loaded (a few very large
    host→device copies before any kernel): trim the capture to steady state
    (``nsys profile --delay``, a capture range); copies that overlap kernels do not count (they
    cost nothing on the GPU timeline), so a well-pipelined input path never triggers this rule.
    """

    code = "GPU101"
    name = "copy-bound-gpu"
    category = Category.PCIE_TRANSFER
    requires = ("copy.exposed_share", "trace.gpu_busy_ratio", "copy.time_ms")
    optional = (
        "copy.h2d_bytes", "copy.d2h_bytes", "copy.h2d_gbps", "copy.d2h_gbps", "copy.pageable_ratio",
        "copy.pageable_gbps", "copy.pinned_gbps", "copy.count", "copy.small_count", "gpu.kernel_time_ms",
        "trace.window_ms", "copy.time_share", "copy.sync_count",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_exposed: float = 0.5  # copies alone fill at least half the GPU's busy time: they, not kernels, set the pace
        min_copy_ms: float = 1.0  # under 1 ms of copies in a capture is not what limits a service
        pageable_majority: float = 0.5  # most bytes from pageable memory: pinning is the first fix
        good_gbps: float = 10.0  # ≥ 10 GB/s achieved is near what PCIe gen3/gen4 deliver: volume, not path, is the cost
        small_majority: float = 0.5  # half the copies under 64 KiB: per-copy latency dominates
        minor_direction: float = 0.01  # a direction carrying under 1 % of the bytes is not worth a bandwidth figure

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        exposed = ev.value("copy.exposed_share", 0.0) or 0.0
        busy = ev.value("trace.gpu_busy_ratio", 0.0) or 0.0
        copy_ms = ev.value("copy.time_ms", 0.0) or 0.0
        if exposed < t.min_exposed or copy_ms < t.min_copy_ms:
            return None
        impact = exposed * busy
        h2d, d2h = ev.value("copy.h2d_bytes"), ev.value("copy.d2h_bytes")
        h2d_bw, d2h_bw = ev.value("copy.h2d_gbps"), ev.value("copy.d2h_gbps")
        pageable = ev.value("copy.pageable_ratio")
        kern = ev.value("gpu.kernel_time_ms")
        count = ev.value("copy.count")
        small = ev.value("copy.small_count")
        total = (h2d or 0.0) + (d2h or 0.0)
        moved = " and ".join(
            f"{size(b, 1)} {name}" + (f" at {bw:.1f} GB/s" if bw is not None else "")
            for name, b, bw in (("host→device", h2d, h2d_bw), ("device→host", d2h, d2h_bw))
            if b and b >= t.minor_direction * total
        )
        msg = (f"For {pct(exposed)} of the GPU's busy time a copy runs and no kernel does"
               f" ({copy_ms:.1f} ms of copies" + (f" against {kern:.1f} ms of kernels" if kern is not None else "")
               + ")" + (f": {moved}" if moved else "") + ".")
        rate = max((bw for b, bw in ((h2d, h2d_bw), (d2h, d2h_bw))
                    if bw is not None and b and b >= t.minor_direction * total), default=None)
        if pageable is not None and pageable >= t.pageable_majority:
            pg, pn = ev.value("copy.pageable_gbps"), ev.value("copy.pinned_gbps")
            msg += (f" {pct(pageable)} of those bytes come from pageable host memory"
                    + (f" (achieved {pg:.1f} GB/s" + (f" vs {pn:.1f} GB/s for the pinned ones" if pn else "") + ")"
                       if pg is not None else "")
                    + ": pinned memory is faster and lets the copies overlap compute.")
            fixes = [_PIN, _OVERLAP, _LESS_DATA]
            title = "Copies from pageable memory keep the GPU waiting"
        elif rate is not None and rate >= t.good_gbps:
            msg += (f" The copies come from pinned memory and reach {rate:.1f} GB/s (PCIe x16 peaks near 13 GB/s on "
                    f"gen3, 26 on gen4, 52 on gen5): the volume{f', {size(total, 1)},' if total else ''} is what "
                    "costs, not the copy path. Move fewer bytes, or hide them behind compute.")
            fixes = [_LESS_DATA, _OVERLAP]
            title = "The GPU waits on large host↔device transfers"
        elif count and small is not None and small / count >= t.small_majority:
            msg += (f" {small:.0f} of the {count:.0f} copies are under 64 KiB: each pays the fixed cost of a "
                    "copy, so bandwidth stays low; batch them.")
            fixes = [_BATCH_SMALL, _OVERLAP, _LESS_DATA]
            title = "Many small copies keep the GPU waiting"
        else:
            msg += (" The copies are pinned but slow"
                    + (f" ({rate:.1f} GB/s)" if rate is not None else "")
                    + ": check the PCIe link generation and width (`nvidia-smi -q | grep -A3 'Link'`; GPU004 "
                    "reports a degraded link when attached) and NUMA placement of the host buffers.")
            fixes = [_LESS_DATA, _OVERLAP]
            title = "Slow host↔device transfers keep the GPU waiting"
        why = (f"copies, no kernel |{bar(exposed)}| {pct(exposed)} of busy\n"
               f"GPU busy          |{bar(busy)}| {pct(busy)} of window")
        return self.finding(
            severity=severity_for(impact),
            confidence=_confidence(ev, self.requires),
            title=title,
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=why,
            fixes=fixes,
        )


class PageableAsyncCopies(Rule):
    """Asynchronous copies from pageable host memory: they block the host and never overlap.

    What it detects: cudaMemcpyAsync (or ``.to('cuda', non_blocking=True)``) on pageable host
    memory, matched in the timeline by correlation id, and their share of the GPU's busy time.

    Why it matters: the driver stages a pageable copy through a pinned bounce buffer, so the call
    returns only when the data has been staged: the "async" copy is synchronous for the host, it
    cannot overlap kernels, and it runs below the link's bandwidth. ``non_blocking=True`` without
    pinned memory silently buys nothing.

    How it decides: ``copy.pageable_async_count`` ≥ 1 and those copies take at least
    ``min_ms`` of GPU time and at least ``min_share`` of ``trace.gpu_busy_ms``: a pageable copy of
    a few microseconds in a compute-bound trace is not worth a finding. Impact is that share.

    Evidence: copy.pageable_async_count, copy.pageable_async_time_ms, trace.gpu_busy_ms;
    optionally copy.pageable_gbps, copy.pinned_gbps, copy.pageable_bytes, copy.pageable_ratio.

    Fix: pin the host side (``pin_memory()``, ``DataLoader(pin_memory=True)``, cudaHostAlloc /
    cudaHostRegister) so the asynchronous copies become asynchronous.

    False positives: a one-off upload at start-up captured in the window; copies the exporting
    nsys could not attribute to a call (they count as neither synchronous nor asynchronous).
    """

    code = "GPU102"
    name = "pageable-async-copies"
    category = Category.PCIE_TRANSFER
    requires = ("copy.pageable_async_count", "copy.pageable_async_time_ms", "trace.gpu_busy_ms")
    optional = ("copy.pageable_gbps", "copy.pinned_gbps", "copy.pageable_bytes", "copy.pageable_ratio")

    @dataclass(frozen=True)
    class Thresholds:
        min_ms: float = 1.0  # under 1 ms of such copies in a capture costs nothing worth fixing
        min_share: float = 0.05  # under 5 % of GPU busy time the copies are noise beside the kernels

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        n = ev.value("copy.pageable_async_count", 0.0) or 0.0
        ms = ev.value("copy.pageable_async_time_ms", 0.0) or 0.0
        busy = ev.value("trace.gpu_busy_ms", 0.0) or 0.0
        if n < 1 or ms < t.min_ms or busy <= 0:
            return None
        share = min(1.0, ms / busy)
        if share < t.min_share:
            return None
        pg, pn = ev.value("copy.pageable_gbps"), ev.value("copy.pinned_gbps")
        msg = (f"{n:.0f} asynchronous copies use pageable host memory ({ms:.1f} ms, {pct(share)} of the GPU's "
               "busy time): each blocks the calling thread while the driver stages it, and none can overlap a "
               "kernel" + (f"; they reach {pg:.1f} GB/s" if pg is not None else "")
               + (f" where pinned copies here reach {pn:.1f} GB/s" if pn is not None and pg is not None else "")
               + ".")
        return self.finding(
            severity=severity_for(share),
            confidence=_confidence(ev, self.requires),
            title="Asynchronous copies from pageable memory run synchronously",
            message=msg,
            impact=share,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"pageable async copies |{bar(share)}| {pct(share)} of GPU busy time",
            fixes=[_PIN, _OVERLAP],
        )


class ManySmallCopies(Rule):
    """Many copies under 64 KiB: each pays the fixed cost of a transfer.

    What it detects: a large number of host↔device copies smaller than 64 KiB in the timeline,
    making up most of the copies.

    Why it matters: a copy costs roughly 5–15 µs of driver and DMA setup whatever its size; a
    thousand 4 KiB copies cost ~10 ms for 4 MiB of data, and a synchronous one also blocks the
    host each time. Per-tensor or per-request copies are the usual source.

    How it decides: ``copy.small_count`` ≥ ``many`` and ≥ ``small_majority`` of ``copy.count``,
    and their estimated fixed cost (``copy.small_count`` × ``per_copy_us``) is at least
    ``min_share`` of the GPU window (``trace.window_ms`` × devices). Impact is that estimate.

    Evidence: copy.small_count, copy.count, trace.window_ms; optionally copy.small_time_ms,
    copy.sync_count, api.memcpy_calls, trace.device_count.

    Fix: gather small tensors into one staging buffer and copy once; keep scalars on the GPU.

    False positives: small copies issued from a background thread that overlap compute cost
    little; the per-copy cost is an estimate, not measured host time.
    """

    code = "GPU103"
    name = "many-small-copies"
    category = Category.PCIE_TRANSFER
    requires = ("copy.small_count", "copy.count", "trace.window_ms")
    optional = ("copy.small_time_ms", "copy.sync_count", "api.memcpy_calls", "trace.device_count")

    @dataclass(frozen=True)
    class Thresholds:
        many: float = 100.0  # a hundred copies or more: the fixed per-copy cost adds up
        small_majority: float = 0.5  # most copies are small: batching them is the fix, not bandwidth
        per_copy_us: float = 10.0  # driver + DMA setup per copy, whatever its size
        min_share: float = 0.05  # the fixed costs add up to ≥ 5 % of the GPU window

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        small = ev.value("copy.small_count", 0.0) or 0.0
        count = ev.value("copy.count", 0.0) or 0.0
        window_ms = (ev.value("trace.window_ms", 0.0) or 0.0) * max(1.0, ev.value("trace.device_count", 1.0) or 1.0)
        if small < t.many or count <= 0 or small / count < t.small_majority or window_ms <= 0:
            return None
        cost_ms = small * t.per_copy_us / 1000.0
        impact = min(1.0, cost_ms / window_ms)
        if impact < t.min_share:
            return None
        sync = ev.value("copy.sync_count")
        msg = (f"{small:.0f} of {count:.0f} copies move less than 64 KiB each: at ~{t.per_copy_us:.0f} µs of fixed "
               f"cost per copy that is ~{cost_ms:.1f} ms, {pct(impact)} of the GPU window"
               + (f"; {sync:.0f} of the copies are synchronous and block the host each time" if sync else "")
               + ".")
        return self.finding(
            severity=severity_for(impact),
            confidence=_confidence(ev, self.requires, Confidence.HEURISTIC),
            title="Many small copies",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"small copies |{bar(small / count)}| {pct(small / count)} of copies",
            fixes=[_BATCH_SMALL, _OVERLAP],
        )


class HostSyncStalls(Rule):
    """The host blocks on the GPU, then the GPU waits for the host: they take turns.

    What it detects: the most-blocked host thread spends a large share of its CUDA wall in
    synchronising calls (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize,
    synchronous cudaMemcpy — what ``.item()``, ``.cpu()`` and ``print(tensor)`` do) while the GPU
    sits idle in host-scale gaps (≥ 100 µs) between its operations.

    Why it matters: after every synchronisation the GPU's queue is empty; it idles until the host
    has prepared and launched the next work. The two never run at the same time, so the step
    costs host time + GPU time instead of the larger of the two.

    How it decides: ``api.sync_wall_share`` ≥ ``min_wall_share`` and ``trace.gpu_busy_ratio`` <
    ``max_busy`` (a GPU busy ≥ 85 % of its window is the bottleneck itself: the host waiting for
    it is healthy). Impact is the smaller of the blocked share and the share of the window the GPU
    spends in host-scale idle gaps (``trace.idle_gaps.histogram``); under ``min_impact`` no finding.

    Evidence: api.sync_wall_share, trace.gpu_busy_ratio, api.sync_time_ms, trace.window_ms;
    optionally trace.idle_gaps.histogram, api.sync_by_call, copy.sync_count, trace.device_count.

    Fix: remove synchronisation from the step loop (``.item()``, ``.cpu()``, ``.numpy()``,
    ``torch.cuda.synchronize()``); copy results with ``non_blocking=True`` into pinned buffers and
    wait on an event only when the value is needed; find hidden syncs with
    ``torch.cuda.set_sync_debug_mode("warn")``.

    False positives: a benchmark that synchronises once per iteration on purpose; a program whose
    GPU work is one long kernel the host simply waits for (the GPU is busy then: no finding).
    """

    code = "GPU104"
    name = "host-sync-stalls"
    category = Category.PCIE_TRANSFER
    requires = ("api.sync_wall_share", "trace.gpu_busy_ratio", "api.sync_time_ms", "trace.window_ms")
    optional = ("trace.idle_gaps.histogram", "api.sync_by_call", "copy.sync_count", "trace.device_count")

    @dataclass(frozen=True)
    class Thresholds:
        min_wall_share: float = 0.3  # the thread is blocked ≥ 30 % of its CUDA wall
        max_busy: float = 0.85  # a GPU busy ≥ 85 % is the bottleneck; the host waiting for it is healthy
        min_impact: float = 0.1  # under 10 % of the window lost to host-scale gaps is not worth a finding

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        share = ev.value("api.sync_wall_share", 0.0) or 0.0
        busy = ev.value("trace.gpu_busy_ratio", 1.0) or 0.0
        if share < t.min_wall_share or busy >= t.max_busy:
            return None
        window_ms = (ev.value("trace.window_ms", 0.0) or 0.0) * max(1.0, ev.value("trace.device_count", 1.0) or 1.0)
        host_idle = _hist_ms(ev, HOST_GAP_BUCKETS)
        idle_share = min(1.0 - busy, host_idle / window_ms) if host_idle is not None and window_ms > 0 else 1.0 - busy
        impact = min(share, idle_share)
        if impact < t.min_impact:
            return None
        calls = _table(ev, "api.sync_by_call")
        named = ", ".join(f"{r.get('name')} ×{r.get('calls')} ({r.get('time_ms')} ms)" for r in calls[:3])
        sync_ms = ev.value("api.sync_time_ms", 0.0) or 0.0
        msg = (f"The busiest host thread is blocked in synchronising CUDA calls {pct(share)} of its CUDA wall "
               f"({sync_ms:.1f} ms" + (f": {named}" if named else "") + f"), while the GPU is idle "
               f"{pct(1.0 - busy)} of its window, {pct(idle_share)} of it in gaps of 100 µs or more: host and GPU "
               "take turns instead of overlapping.")
        return self.finding(
            severity=severity_for(impact),
            confidence=_confidence(ev, self.requires, Confidence.CORRELATED),
            title="Host and GPU take turns: synchronisation stalls",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"host blocked |{bar(share)}| {pct(share)}\nGPU idle     |{bar(1 - busy)}| {pct(1 - busy)}",
            fixes=[
                Fix("Take synchronisation out of the step loop",
                    ("Remove .item(), .cpu(), .numpy(), print(tensor) and torch.cuda.synchronize() from the hot loop; "
                     "accumulate on the GPU and read back once per N steps",
                     "Copy results with .to('cpu', non_blocking=True) into a pinned buffer, record a "
                     "torch.cuda.Event and wait on it only when the value is needed",
                     "Find hidden syncs: torch.cuda.set_sync_debug_mode('warn') prints every synchronising call"),
                    Risk.NEEDS_VALIDATION),
                _OVERLAP,
            ],
        )


class GpuStarvedByHost(Rule):
    """The GPU timeline is mostly idle, in gaps far longer than a kernel launch: the host is slow to feed it.

    What it detects: a low GPU busy ratio over the GPU's active window with the idle time in
    host-scale gaps (≥ 100 µs), and names the host-side cause when the same window's evidence
    does: py-spy's pre/post-processing share, or an NVTX stage during which the GPU stayed idle.

    Why it matters: the GPU can only be as busy as the host keeps it; when the host spends
    milliseconds between GPU bursts (decoding inputs, Python glue, waiting for requests) adding GPU
    capacity or faster kernels changes nothing.

    How it decides: ``trace.gpu_busy_ratio`` ≤ ``max_busy`` over a window of at least
    ``min_window_ms``, and host-scale gaps hold at least ``min_host_idle`` of the window. With
    From a PyTorch trace, the idle time that ``kineto.idle.dispatch_share`` (op-to-op dispatch, GPU108)
    and ``kineto.slowest_call_window_share`` (a cold-start call, GPU109) explain is taken out first. With
    ``cpu.preprocess_share`` ≥ ``preprocess_share`` the cause is pre-processing, confidence
    *correlated*; with an NVTX stage (``trace.nvtx_ranges``) whose GPU ratio is ≤
    ``stage_gpu_ratio`` the stage is named, confidence *correlated*; otherwise the generic cause
    (host-side work between GPU bursts), confidence *heuristic*. Category ``cpu_preprocessing``:
    the host side of the pipeline. Impact is the host-scale idle share.

    Evidence: trace.gpu_busy_ratio, trace.idle_gaps.histogram, trace.window_ms; optionally
    cpu.preprocess_share, cpu.top.preprocess, trace.nvtx_ranges, api.sync_wall_share,
    trace.device_count, trace.idle_gaps.longest_ms.

    Fix: move pre-processing off the critical path (worker processes, prefetching the next batch,
    GPU decode), batch so each GPU burst does more, annotate stages with NVTX to find the slow one.

    False positives: a service with too little load is idle between requests, not starved: check
    the request rate in the same window; a capture that includes start-up or shutdown.
    """

    code = "GPU105"
    name = "gpu-starved-by-host"
    category = Category.CPU_PREPROCESSING
    requires = ("trace.gpu_busy_ratio", "trace.idle_gaps.histogram", "trace.window_ms")
    optional = ("cpu.preprocess_share", "cpu.top.preprocess", "trace.nvtx_ranges", "api.sync_wall_share",
                "trace.device_count", "trace.idle_gaps.longest_ms", "kineto.idle.dispatch_share",
                "kineto.slowest_call_window_share")

    @dataclass(frozen=True)
    class Thresholds:
        max_busy: float = 0.6  # a GPU idle ≥ 40 % of its active window has room a host-side fix can fill
        min_window_ms: float = 50.0  # a GPU window under 50 ms is one burst, not a pattern
        min_host_idle: float = 0.3  # ≥ 30 % of the window in gaps of 100 µs or more: host-scale idling
        preprocess_share: float = 0.3  # CPU001's bar: a third of active CPU time pre/post-processing
        stage_gpu_ratio: float = 0.2  # an NVTX stage with the GPU busy under a fifth of it is host work

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        busy = ev.value("trace.gpu_busy_ratio", 1.0) or 0.0
        window = ev.value("trace.window_ms", 0.0) or 0.0
        if busy > t.max_busy or window < t.min_window_ms:
            return None
        devices = max(1.0, ev.value("trace.device_count", 1.0) or 1.0)
        host_idle = _hist_ms(ev, HOST_GAP_BUCKETS) or 0.0
        share = min(1.0 - busy, host_idle / (window * devices))
        # a PyTorch trace tells idle time that other rules explain: op-to-op dispatch (GPU108) and a
        # cold-start call the GPU idles through (GPU109) are not host work between steps
        share -= (ev.value("kineto.idle.dispatch_share", 0.0) or 0.0) + (
            ev.value("kineto.slowest_call_window_share", 0.0) or 0.0)
        if share < t.min_host_idle:
            return None
        longest = ev.value("trace.idle_gaps.longest_ms")
        msg = (f"The GPU is busy only {pct(busy)} of its {window:.0f} ms active window; {pct(share)} of the window "
               "passes in idle gaps of 100 µs or more" + (f" (longest {longest:.1f} ms)" if longest else "")
               + ", far longer than a kernel launch: the host does not feed the GPU fast enough.")
        pre = ev.value("cpu.preprocess_share")
        stage = _host_stage(ev, t.stage_gpu_ratio)
        confidence = Confidence.HEURISTIC
        if pre is not None and pre >= t.preprocess_share:
            msg += f" In the same window py-spy shows {pct(pre)} of the host's active CPU time in pre/post-processing."
            confidence = Confidence.CORRELATED
        elif stage is not None:
            msg += (f" NVTX stage `{stage.get('name')}` holds {float(stage['in_gpu_window_ms']):.1f} ms of that "
                    f"window with the GPU busy only {pct(float(stage.get('gpu_ratio') or 0.0))} of it.")
            confidence = Confidence.CORRELATED
        elif pre is not None:
            msg += (f" Pre-processing is only {pct(pre)} of the host's CPU time: look at the rest of the host path "
                    "(Python glue, data loading, waiting for requests).")
        else:
            msg += " Profile the host (py-spy, or nsys with `--sample=cpu`) to name the work between GPU bursts."
        if _confidence(ev, self.requires) is Confidence.THIN:
            confidence = Confidence.THIN
        return self.finding(
            severity=severity_for(share),
            confidence=confidence,
            title="The GPU is starved by the host",
            message=msg,
            impact=share,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"GPU busy      |{bar(busy)}| {pct(busy)}\nhost-scale idle |{bar(share)}| {pct(share)}",
            fixes=[
                Fix("Take host work off the GPU's critical path",
                    ("Prepare batch N+1 while batch N runs: DataLoader(num_workers>0, prefetch_factor, "
                     "pin_memory=True), or a producer thread/process feeding a queue",
                     "Decode and resize on the GPU (torchvision.io.decode_jpeg(device='cuda'), NVIDIA DALI)",
                     "Annotate the host stages with NVTX (torch.cuda.nvtx.range) and profile again to see which "
                     "one the GPU waits for"),
                    Risk.NEEDS_VALIDATION),
                Fix("Give each GPU burst more work",
                    ("Batch requests (dynamic batching) so the host's fixed cost per step is shared",),
                    Risk.NEEDS_VALIDATION),
            ],
        )


class LaunchBound(Rule):
    """Tiny kernels back to back: the host's launch path, not the GPU, sets the pace.

    What it detects: most kernels run under 10 µs, the host spends about as long launching them
    as the GPU spends running them, and the GPU's idle time sits in launch-scale gaps (< 100 µs)
    between kernels.

    Why it matters: a kernel launch costs the host ~5–20 µs (Python, the framework's dispatcher,
    the driver); when kernels are shorter than that, the GPU drains its queue and waits for each
    next launch. Typical of small-batch decode, eager-mode PyTorch and unfused element-wise ops.

    How it decides: ``trace.kernel_count`` ≥ ``min_kernels``, ``trace.tiny_kernel_ratio`` ≥
    ``min_tiny``, ``trace.launch_overhead_ratio`` ≥ ``min_launch_ratio``, and the GPU not
    saturated (``trace.gpu_busy_ratio`` < ``max_busy``). Impact is the share of the window idle in
    launch-scale gaps (< 100 µs), at least ``min_impact``. Category ``cpu_preprocessing``: the
    closest of the fixed categories, since the bottleneck is host-side work (the launch path)
    starving the GPU, and ``gpu_compute`` would claim the GPU itself is the limit.

    Evidence: trace.kernel_count, trace.tiny_kernel_ratio, trace.launch_overhead_ratio,
    trace.gpu_busy_ratio, trace.window_ms; optionally trace.kernel_mean_us,
    trace.idle_gaps.histogram, api.launch_mean_us, api.graph_launches, trace.top_kernels,
    trace.device_count.

    Fix: capture the step in CUDA graphs (``torch.compile(mode="reduce-overhead")``,
    ``torch.cuda.CUDAGraph``, the serving engine's CUDA-graph mode), fuse small ops
    (``torch.compile``, TensorRT), batch more work per launch.

    False positives: a trace already using CUDA graphs (``api.graph_launches``) with a few eager
    kernels around them; a warm-up phase of a compiled model.
    """

    code = "GPU106"
    name = "launch-bound"
    category = Category.LAUNCH_OVERHEAD
    requires = ("trace.kernel_count", "trace.tiny_kernel_ratio", "trace.launch_overhead_ratio",
                "trace.gpu_busy_ratio", "trace.window_ms")
    optional = ("trace.kernel_mean_us", "trace.idle_gaps.histogram", "api.launch_mean_us", "api.graph_launches",
                "trace.top_kernels", "trace.device_count")

    @dataclass(frozen=True)
    class Thresholds:
        min_kernels: float = 1000.0  # fewer kernels than this is not a steady launch pattern
        min_tiny: float = 0.5  # half the kernels shorter than 10 µs: shorter than their own launch
        min_launch_ratio: float = 0.5  # the host spends at least half as long launching as the GPU computing
        max_busy: float = 0.85  # a GPU busy ≥ 85 % is saturated, not waiting for launches
        min_impact: float = 0.1  # ≥ 10 % of the window idle in launch-scale gaps

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        kernels = ev.value("trace.kernel_count", 0.0) or 0.0
        tiny = ev.value("trace.tiny_kernel_ratio", 0.0) or 0.0
        launch = ev.value("trace.launch_overhead_ratio", 0.0) or 0.0
        busy = ev.value("trace.gpu_busy_ratio", 1.0) or 0.0
        if kernels < t.min_kernels or tiny < t.min_tiny or launch < t.min_launch_ratio or busy >= t.max_busy:
            return None
        window_ms = (ev.value("trace.window_ms", 0.0) or 0.0) * max(1.0, ev.value("trace.device_count", 1.0) or 1.0)
        short_idle = _hist_ms(ev, LAUNCH_GAP_BUCKETS)
        impact = min(1.0 - busy, short_idle / window_ms) if short_idle is not None and window_ms > 0 else 1.0 - busy
        if impact < t.min_impact:
            return None
        mean_us = ev.value("trace.kernel_mean_us")
        launch_us = ev.value("api.launch_mean_us")
        msg = (f"{pct(tiny)} of {kernels:.0f} kernels run under 10 µs"
               + (f" (mean {mean_us:.1f} µs)" if mean_us is not None else "")
               + f"; the host spends {launch:.1f}× the kernels' GPU time in launch calls"
               + (f" ({launch_us:.1f} µs per launch)" if launch_us is not None else "")
               + f", and the GPU idles {pct(impact)} of its window in gaps under 100 µs between kernels: the launch "
               "path sets the pace.")
        if (ev.value("api.graph_launches", 0.0) or 0.0) > 0:
            msg += " CUDA graphs are already used for part of the work; capture the remaining eager kernels too."
        return self.finding(
            severity=severity_for(impact),
            confidence=_confidence(ev, self.requires),
            title="Launch-bound: tiny kernels back to back",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"tiny kernels   |{bar(tiny)}| {pct(tiny)}\nlaunch-gap idle |{bar(impact)}| {pct(impact)}",
            fixes=[
                Fix("Capture the step in CUDA graphs",
                    ("PyTorch: torch.compile(model, mode='reduce-overhead'), or torch.cuda.CUDAGraph around a "
                     "static-shape step (pad to a few fixed batch sizes)",
                     "Serving engines: keep CUDA graphs on (vLLM: do not pass --enforce-eager; TensorRT-LLM: "
                     "use_cuda_graph)"),
                    Risk.NEEDS_VALIDATION),
                Fix("Do more work per kernel",
                    ("Fuse element-wise chains (torch.compile, TensorRT, custom Triton kernels)",
                     "Batch more requests per step so each kernel has enough work to outlast its launch"),
                    Risk.NEEDS_VALIDATION),
            ],
        )


class GpuSaturatedTrace(Rule):
    """Kernels fill the GPU timeline: the GPU itself is the bottleneck.

    What it detects: over the GPU's active window, kernels run nearly all the time (copies and
    idle gaps are a small remainder): healthy saturation in time.

    Why it matters: with the GPU busy, host-side fixes (pinning, fewer syncs, faster
    pre-processing) cannot make the service faster; only cheaper kernels or more GPUs can.

    How it decides: ``trace.gpu_busy_ratio`` ≥ ``min_busy`` and ``trace.kernel_busy_ratio`` ≥
    ``min_kernel_busy`` over a window of at least ``min_window_ms``. Severity major, impact
    ``saturated_impact`` (a capacity limit, ranked below fixable faults); names the top kernels.
    Notes unified-memory migrations (``copy.uvm_count``), which stretch kernels with page faults.

    Evidence: trace.gpu_busy_ratio, trace.kernel_busy_ratio, trace.window_ms; optionally
    trace.top_kernels, trace.kernel_count, copy.uvm_count, copy.uvm_bytes, trace.device_count.

    Fix: cheaper arithmetic (BF16/FP16/TF32, FP8 on Hopper, quantised weights), better kernels
    (FlashAttention/SDPA, TensorRT, fused ops; profile the top kernel with Nsight Compute), more
    GPUs or replicas.

    False positives: "busy" means a kernel was resident, not that its SMs were full: one kernel of
    a few blocks keeps the timeline busy at a fraction of the GPU's capacity (NVML GPM metrics, GPU002,
    or Nsight Compute tell); a capture of a single long kernel says little about a service.
    """

    code = "GPU107"
    name = "gpu-saturated-trace"
    category = Category.GPU_COMPUTE
    requires = ("trace.gpu_busy_ratio", "trace.kernel_busy_ratio", "trace.window_ms")
    optional = ("trace.top_kernels", "trace.kernel_count", "copy.uvm_count", "copy.uvm_bytes", "trace.device_count")

    @dataclass(frozen=True)
    class Thresholds:
        min_busy: float = 0.85  # the GPU is busy ≥ 85 % of its active window: little room left
        min_kernel_busy: float = 0.7  # kernels (not copies) fill ≥ 70 % of it: compute dominates
        min_window_ms: float = 50.0  # a window under 50 ms is one burst, not a steady state
        saturated_impact: float = 0.5  # healthy saturation is a capacity limit: rank it below fixable faults

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        busy = ev.value("trace.gpu_busy_ratio", 0.0) or 0.0
        kbusy = ev.value("trace.kernel_busy_ratio", 0.0) or 0.0
        window = ev.value("trace.window_ms", 0.0) or 0.0
        if busy < t.min_busy or kbusy < t.min_kernel_busy or window < t.min_window_ms:
            return None
        top = _table(ev, "trace.top_kernels")[:3]
        named = "; ".join(f"{r.get('name')} {pct(float(r.get('share') or 0.0))} ({r.get('count')}×)" for r in top)
        kernels = ev.value("trace.kernel_count")
        msg = (f"Kernels run {pct(kbusy)} of the GPU's {window:.0f} ms active window (busy {pct(busy)} with copies): "
               "the GPU itself is the bottleneck; host-side fixes will not speed this up."
               + (f" Top kernels: {named}." if named else ""))
        uvm = ev.value("copy.uvm_count")
        if uvm:
            ub = ev.value("copy.uvm_bytes") or 0.0
            msg += (f" {uvm:.0f} unified-memory migrations ({size(ub, 1)}) run during the kernels: page faults stretch "
                    "them; prefetch with cudaMemPrefetchAsync or use device memory.")
        confidence = _confidence(ev, self.requires)
        if confidence is Confidence.MEASURED and kernels is not None and kernels < 10:
            confidence = Confidence.HEURISTIC  # a handful of kernels: busy in time, fill unknown
        return self.finding(
            severity=Severity.MAJOR,
            confidence=confidence,
            title="The GPU is saturated by its kernels",
            message=msg,
            impact=t.saturated_impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"kernels  |{bar(kbusy)}| {pct(kbusy)}\nGPU busy |{bar(busy)}| {pct(busy)}",
            fixes=[
                Fix("Make the kernels cheaper",
                    ("Run in BF16/FP16 (or allow TF32: torch.backends.cuda.matmul.allow_tf32 = True); FP8 on "
                     "Hopper; weight-only quantisation (AWQ/GPTQ) for memory-bound decode",
                     "Use fused, tuned kernels: scaled_dot_product_attention/FlashAttention, TensorRT, torch.compile",
                     "Profile the top kernel with Nsight Compute (ncu --set full) to see whether it is compute- or "
                     "memory-bound and how full its SMs are"),
                    Risk.NEEDS_VALIDATION),
                Fix("Add GPU capacity",
                    ("Add replicas behind the load balancer, or shard the model across GPUs (tensor parallelism)",),
                    Risk.SAFE),
            ],
        )


RULES: tuple[type[Rule], ...] = (
    CopyBoundGpu, PageableAsyncCopies, ManySmallCopies, HostSyncStalls, GpuStarvedByHost, LaunchBound,
    GpuSaturatedTrace,
)
