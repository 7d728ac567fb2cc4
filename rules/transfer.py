"""Host↔device copies: measured in an Nsight Systems summary, or reported from one."""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.model import Category, Confidence, EvidenceSet, Finding, Fix, Risk
from diagnose.rules.base import Rule, bar, present, severity_for
from diagnose.units import pct, size

_PINNED = Fix(
    "Copy from pinned memory, asynchronously",
    (
        "PyTorch: DataLoader(pin_memory=True) or tensor.pin_memory(), then .to('cuda', non_blocking=True) "
        "so the copy overlaps compute on its own stream",
        "CUDA: allocate host buffers with cudaHostAlloc / cudaMallocHost instead of malloc; use cudaMemcpyAsync",
    ),
    Risk.SAFE,
)
_KEEP_ON_DEVICE = Fix(
    "Keep tensors on the device; remove round trips",
    (
        "Avoid .cpu() / .item() / .numpy() inside the request path; post-process on the GPU and copy once",
        "ONNX Runtime: bind inputs and outputs on the device with session.io_binding() "
        "(bind_ortvalue_input / bind_output('out', 'cuda')), and check the verbose log for nodes placed "
        "on the CPU (Memcpy nodes inserted around them, e.g. around an If node); keep those on the CUDA EP",
    ),
    Risk.NEEDS_VALIDATION,
)
_BATCH = Fix(
    "Batch small copies",
    (
        "Pack many small tensors into one contiguous buffer and copy it once "
        "(torch.cat / a preallocated staging tensor), instead of one cudaMemcpy per tensor",
    ),
    Risk.SAFE,
)


class CopyDominatedGpuTime(Rule):
    """Host↔device copies take a large share of the GPU's busy time.

    What it detects: in an ``nsys stats`` (or nvprof) summary, host↔device memcpy time (HtoD + DtoH; memset,
    DtoD and peer-to-peer excluded) is a large share of memcpy + kernel time; notes many small copies, pageable-memory
    async copies and host time blocked in synchronising calls.

    Why it matters: a copy over PCIe (≈ 25 GB/s on gen4 x16, far less from pageable memory) often
    costs more than the kernels that use the data, and a synchronous copy stalls the host thread
    that should be queueing the next kernels.

    How it decides: ``copy.time_share`` ≥ ``min_share`` and the copies add up to at least
    ``min_copy_ms`` (a copy of a few microseconds in a compute-bound trace is not the bottleneck,
    however its share of a tiny capture looks), both counting host↔device copies alone: device-to-device and
    peer-to-peer time (``copy.d2d_time_ms``, ``copy.p2p_time_ms``) cross no host link and are taken off. "Many small
    copies" when ``copy.count`` ≥ ``many_copies`` and ``copy.mean_bytes`` < ``small_copy_bytes``. Impact is the
    copy share. When an Nsight timeline was read (``copy.exposed_share`` present) this rule stands aside:
    GPU101 judges the copies knowing their overlap with kernels and their memory kind.

    Evidence: copy.time_share, copy.time_ms; optionally copy.h2d_time_ms, copy.d2h_time_ms, copy.d2d_time_ms,
    copy.h2d_bytes, copy.d2h_bytes, copy.count, copy.mean_bytes, gpu.kernel_time_ms,
    copy.pageable_async_count, api.sync_time_ms, api.sync_share, api.memcpy_calls.

    Fix: pinned host memory and non_blocking copies; keep tensors on the device and remove
    device→host→device round trips (ONNX Runtime: IO binding, no CPU-placed nodes); batch small
    copies into one.

    False positives: a one-off load of weights captured in the window (a few large HtoD copies
    at start-up): look at ``copy.count`` and trim the capture to steady state
    (``nsys profile --delay``/``--duration`` or a capture range).
    """

    code = "XFR001"
    name = "copy-dominated-gpu-time"
    category = Category.PCIE_TRANSFER
    requires = ("copy.time_share", "copy.time_ms")
    optional = (
        "copy.h2d_time_ms",
        "copy.d2h_time_ms",
        "copy.d2d_time_ms",
        "copy.p2p_time_ms",
        "copy.h2d_bytes",
        "copy.d2h_bytes",
        "copy.count",
        "copy.mean_bytes",
        "gpu.kernel_time_ms",
        "copy.pageable_async_count",
        "api.sync_time_ms",
        "api.sync_share",
        "api.memcpy_calls",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.3  # copies at 30 % of GPU busy time cost as much as a third of the kernels' work
        min_copy_ms: float = 1.0  # under 1 ms of copies in a whole capture is not what limits a service
        many_copies: float = 100.0  # a hundred copies or more: per-copy latency (≈ 10 µs) adds up
        small_copy_bytes: float = 64 * 1024  # under 64 KiB a copy is latency-bound, not bandwidth-bound
        both_ways: float = 0.3  # DtoH and HtoD within ~3× of each other: the same data likely goes and returns

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        if "copy.exposed_share" in ev:
            return None  # a timeline was read: GPU101 judges the copies, knowing overlap and memory kind
        share = ev.value("copy.time_share", 0.0) or 0.0
        copy_ms = ev.value("copy.time_ms", 0.0) or 0.0
        # copies within the device's memory, or between GPUs, cross no host link (sonots/cumo#35: 3 M DtoD of 1.4 µs):
        # the host↔device part alone is judged, its share of the GPU's busy time as much as the whole copy time's
        inside = (ev.value("copy.d2d_time_ms", 0.0) or 0.0) + (ev.value("copy.p2p_time_ms", 0.0) or 0.0)
        if inside and copy_ms > 0:
            share *= max(0.0, copy_ms - inside) / copy_ms
            copy_ms = max(0.0, copy_ms - inside)
        if share < t.min_share or copy_ms < t.min_copy_ms:
            return None
        kern = ev.value("gpu.kernel_time_ms")
        h2d = ev.value("copy.h2d_time_ms")
        d2h = ev.value("copy.d2h_time_ms")
        count = ev.value("copy.count")
        mean_b = ev.value("copy.mean_bytes")
        pageable = ev.value("copy.pageable_async_count", 0.0) or 0.0
        sync_ms = ev.value("api.sync_time_ms")
        dirs = ", ".join(
            f"{name} {v:.1f} ms" for name, v in (("HtoD", h2d), ("DtoH", d2h)) if v is not None
        )
        msg = (
            f"Memory copies take {pct(share)} of the GPU's busy time: {copy_ms:.1f} ms"
            + (f" ({dirs})" if dirs else "")
            + (f" against {kern:.1f} ms of kernels" if kern is not None else "")
            + "."
        )
        small = count is not None and mean_b is not None and count >= t.many_copies and mean_b < t.small_copy_bytes
        if count is not None:
            msg += f" {count:.0f} copies" + (f" of {size(mean_b, 1)} on average" if mean_b is not None else "")
            msg += " — many small copies, each paying the per-copy latency." if small else "."
        both = h2d is not None and d2h is not None and min(h2d, d2h) > t.both_ways * max(h2d, d2h) > 0
        if both:
            msg += " Data moves both ways in similar amounts: look for a device→host→device round trip."
        if pageable:
            msg += f" {pageable:.0f} async copies use pageable host memory and run synchronously."
        if sync_ms is not None and sync_ms > 0:
            msg += f" The host spends {sync_ms:.1f} ms blocked in synchronising CUDA calls."
        fixes = [_KEEP_ON_DEVICE, _PINNED, _BATCH] if both else [_PINNED, _KEEP_ON_DEVICE, _BATCH]
        if small:
            fixes = [_BATCH, *[f for f in fixes if f is not _BATCH]]
        why = f"copies  |{bar(share)}| {pct(share)}\nkernels |{bar(1 - share)}| {pct(1 - share)}"
        return self.finding(
            severity=severity_for(share),
            confidence=Confidence.MEASURED,
            title="Host↔device copies dominate GPU time",
            message=msg,
            impact=share,
            evidence=present(ev, *self.requires, *self.optional),
            why=why,
            fixes=fixes,
        )


class CopyOverheadReported(Rule):
    """An incident write-up reports host↔device copies seen in a profile, with their cost.

    What it detects: prose (an issue, a ticket) saying a profiler (Nsight, nsys, "profiling")
    showed memory transfers and stating a latency factor tied to them ("latency divided by 3"
    once they were gone), or that data is copied from the device to the host and back.

    Why it matters: the person already looked at the timeline; the copies they saw are the
    bottleneck they describe, and the fix is the same as for measured copies.

    How it decides: ``copy.reported_latency_factor`` ≥ ``min_factor`` (impact 1 − 1/factor: the
    share of the old latency the copies cost), or ``copy.reported_round_trip`` ≥ 1 (impact
    ``round_trip_impact``, since no figure is given). Confidence is thin: it rests on words, not
    on a trace this tool read.

    Evidence: copy.reported_latency_factor or copy.reported_round_trip; optionally
    copy.reported_in_profile.

    Fix: keep data on the device (ONNX Runtime IO binding; keep nodes such as If on the CUDA EP,
    e.g. by feeding its inputs through Identity nodes), pinned memory, batched copies.

    False positives: prose that mentions copies in passing next to an unrelated speed-up; the
    statement must name copies and a profile or a round trip in the same sentence or paragraph.
    """

    code = "XFR002"
    name = "copy-overhead-reported"
    category = Category.PCIE_TRANSFER
    requires = ()
    requires_any = (("copy.reported_latency_factor",), ("copy.reported_round_trip",))
    optional = ("copy.reported_latency_factor", "copy.reported_round_trip", "copy.reported_in_profile")

    @dataclass(frozen=True)
    class Thresholds:
        min_factor: float = 1.5  # a stated speed-up under 1.5× is within the noise of an anecdote
        round_trip_impact: float = 0.4  # a device→host→device trip of the input costs two PCIe copies a call

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        factor = ev.value("copy.reported_latency_factor")
        trips = ev.value("copy.reported_round_trip", 0.0) or 0.0
        if factor is not None and factor >= t.min_factor:
            impact = 1.0 - 1.0 / factor
            msg = (f"The report ties host↔device memory transfers to a {factor:g}× latency difference: "
                   f"about {pct(impact)} of the latency was the copies.")
        elif trips >= 1:
            impact = t.round_trip_impact
            msg = ("The report says data is copied from the device to the host and back on every call: "
                   "two PCIe transfers that the computation does not need.")
        else:
            return None
        return self.finding(
            severity=severity_for(impact),
            confidence=Confidence.THIN,
            title="Reported: memory transfers cost the latency",
            message=msg + " (From the incident text, not from a trace diagnose read.)",
            impact=impact,
            evidence=present(ev, *self.optional),
            fixes=[_KEEP_ON_DEVICE, _PINNED],
        )


RULES: tuple[type[Rule], ...] = (CopyDominatedGpuTime, CopyOverheadReported)
