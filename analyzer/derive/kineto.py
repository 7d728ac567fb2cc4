"""PyTorch-profiler (Kineto) trace → evidence: the GPU timeline the Nsight rules read, plus what a
trace says beyond it (HTA's temporal breakdown, idle-time attribution, launch delay, CUDA graphs,
communication, operators, cold start).

Keys, measured on the trace's own clock (``diagnose.collectors.kineto`` reads it):

* ``kineto.idle_share`` / ``kineto.compute_share`` / ``kineto.non_compute_share``: HTA's temporal
  breakdown of the rank (HolisticTraceAnalysis 0.5, ``BreakdownAnalysis.get_temporal_breakdown``,
  github.com/facebookresearch/HolisticTraceAnalysis, hta/analyzers/breakdown_analysis.py): over
  the kernel span (first start to last end of the events it counts), idle = no event running on
  any stream, compute = the union of computation kernels, non-compute = the rest (communication
  ``^nccl.*Kernel``, memory ``Memcpy``/``Memset``/``dma``, and names holding ``Sync``). It is
  computed HTA's way so the numbers agree: the events are those whose ``args.stream`` converts to
  an int other than -1; timestamps are rounded inward to whole µs (``ceil(ts)``, ``floor(ts+dur)``,
  as HTA does for ns-resolution traces); with two or more ``ProfilerStep`` names the last step is
  left out (only GPU events launched by a host call before it count).
* ``trace.*``, ``copy.*``, ``api.*``: the keys ``analyzer/derive/nsys.py`` gives, with the same
  meaning, from kernels, memcpys and memsets only (exact float timestamps, per device), so the
  GPU1xx rules judge a PyTorch trace as they judge an Nsight export.
* ``kineto.idle.*``: each idle gap of the device attributed to what the host was doing when the
  GPU went idle: blocked in a synchronising call (sync wait), the next operation's launch already
  issued (launch gap: launch latency, graph or queue dependencies), or the next launch not yet
  issued (host wait: the host was busy elsewhere).
* ``kineto.launch_delay_us.*``, ``kineto.graph_*``, ``kineto.comm_*``, ``kineto.top_operators``,
  ``kineto.slowest_call_*``: launch-to-start delay by correlation id, CUDA-graph replays,
  collective kernels (NCCL/RCCL and custom all-reduce), GPU time per operator (by External id),
  the longest host call (a cold start: lazy module loading, autotuning, a first launch of seconds).

Names pass through ``redact_text``; nothing of the trace's host, user or environment metadata is read.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

import numpy as np

from diagnose.collectors import kineto
from diagnose.collectors.kineto import GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET, KinetoTrace
from diagnose.collectors.nsys import GRAPH_LAUNCH_APIS, LAUNCH_APIS
from diagnose.derive.emit import Emit
from diagnose.derive.gpu_timeline import GAP_BUCKETS, GAP_EDGES_US, TINY_KERNEL_US, emit_busy, emit_gaps, emit_kernels
from diagnose.model import Evidence, InputRecord, Quality
from diagnose.redact import redact_text

KIND = "kineto_trace"
MEMORY_KIND = "torch_memory_timeline"
US_PER_MS = 1000.0
MIN_WINDOW_US = 10_000.0  # under 10 ms of GPU activity (less than one model step) a timeline is too short to judge
SMALL_COPY_BYTES = 64 * 1024  # under 64 KiB a copy is latency-bound (diagnose.collectors.nsys)
TOP = 10
TIMELINE_BINS = 200  # busy/idle timeline: bins over each device's window (bounded table for the reports)
SNIFF_BYTES = 1 << 20  # Kineto writes deviceProperties and large metadata before traceEvents
DISPATCH_GAP_US = 1000.0  # a host-wait gap under 1 ms is op-to-op dispatch inside a step, not host work between steps
MIN_GPU_OPS = 100  # fewer GPU operations than this is an excerpt, not a pattern: evidence quality LOW
CAPTURE_CALLS = frozenset({"cudaStreamBeginCapture", "cudaStreamEndCapture", "cudaGraphInstantiate",
                           "cudaGraphInstantiateWithFlags", "hipStreamBeginCapture", "hipStreamEndCapture",
                           "hipGraphInstantiate", "hipGraphInstantiateWithFlags", "cuStreamBeginCapture",
                           "cuGraphInstantiate", "cuGraphInstantiateWithFlags"})

LAUNCH_CALLS = LAUNCH_APIS  # one list of launch calls for every reader (CUDA runtime and driver, ROCm)
GRAPH_LAUNCH_CALLS = GRAPH_LAUNCH_APIS
SYNC_CALLS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
    "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize",
    "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipCtxSynchronize",
})
# synchronous copies (the host waits for each): cudaMemcpy, hipMemcpy, and PyTorch's blocking ROCm copy
_SYNC_COPY = re.compile(r"^(cu(da)?|hip)Memcpy(?!.*Async)")
_ASYNC_COPY = re.compile(r"^(cu(da)?|hip)Memcpy.*Async")
# HTA's kernel types (hta/utils/utils.py): communication, memory, else computation unless the name
# matches its non-compute pattern
_HTA_COMM = re.compile(r"^nccl.*Kernel")
_HTA_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_HTA_NON_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
# collective kernels for ``kineto.comm_*``: NCCL/RCCL and the custom all-reduce kernels of serving
# engines (vLLM's cross_device_reduce, multimem all-reduce on Hopper/Blackwell)
_COMM = re.compile(r"^(nccl|rccl)|all_?reduce|all_?gather|reduce_?scatter|cross_device_reduce|alltoall|multimem",
                   re.I)


# -- reading ---------------------------------------------------------------------------------------


def sniff(head: bytes) -> str | None:
    """``kineto_trace`` / ``torch_memory_timeline`` when decompressed ``head`` opens one, else None."""
    if kineto.looks_like_trace(head):
        return KIND
    if kineto.looks_like_memory_timeline(head):
        return MEMORY_KIND
    return None


def analyze_stream(stream: IO[bytes], name: str, kind: str = KIND) -> tuple[list[Evidence], InputRecord]:
    """Read a decompressed trace (or memory timeline) from ``stream``: its evidence and input record."""
    if kind == MEMORY_KIND:
        return _memory_timeline(stream, name)
    try:
        trace = kineto.read_trace(stream)
    except kineto.KinetoError as exc:
        return [], InputRecord(name, KIND, "unreadable", redact_text(str(exc)))
    except (OSError, EOFError, ValueError) as exc:  # a damaged gzip stream before any event
        return [], InputRecord(name, KIND, "unreadable", f"the stream is damaged ({type(exc).__name__}: {exc})")
    evidence = derive(trace, name)
    return evidence, InputRecord(name, KIND, *_status(trace))


def analyze_path(path: str, name: str | None = None, kind: str | None = None) -> tuple[list[Evidence], InputRecord]:
    """A trace file (plain or gzipped, whatever its name); ``kind`` when the caller sniffed it already."""
    source = name or path
    kind = kind or sniff(_head(path)) or KIND
    fh = kineto.open_decompressed(path)
    try:
        try:
            return analyze_stream(fh, source, kind)
        except (OSError, EOFError) as exc:  # damaged gzip mid-stream: read_trace stops at a chunk boundary
            return [], InputRecord(source, KIND, "unreadable", f"the gzip stream is damaged ({exc})")
    finally:
        fh.close()


def _head(path: str) -> bytes:
    """The first decompressed bytes of a file (a damaged gzip gives what it can)."""
    with open(path, "rb") as fh:
        head = fh.read(SNIFF_BYTES)
    if kineto.is_gzip(head):
        try:
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, SNIFF_BYTES)
        except zlib.error:
            return b""
    return head


def _status(trace: KinetoTrace) -> tuple[str, str]:
    problems = [redact_text(p) for p in trace.problems]
    if len(trace.gpu.ts) == 0:
        problems.append(_no_gpu_reason(trace))
    else:
        why = timeline_judged(trace)
        if why:
            problems.append(why)
    return ("partial" if problems else "ok"), "; ".join(problems)


def capture_calls(trace: KinetoTrace) -> int:
    """CUDA/HIP graph capture and instantiate calls in the trace."""
    flags = _name_flags(trace.names, CAPTURE_CALLS.__contains__)
    return int(flags[trace.host.name].sum()) if flags.size and trace.host.ts.size else 0


def timeline_judged(trace: KinetoTrace) -> str | None:
    """None when the GPU timeline is worth judging; else why not (a graph-capture phase, an excerpt)."""
    n = int(trace.gpu.ts.size)
    if n == 0:
        return "no GPU activity"
    captures = capture_calls(trace)
    graph = int(_call_mask(trace, GRAPH_LAUNCH_CALLS).sum())
    if captures and not graph:
        return (f"the trace records CUDA-graph capture ({captures} capture/instantiate calls, no graph replay): "
                "kernels are recorded into graphs, not served; profile the steps after capture (steady state)")
    if n < MIN_GPU_OPS:
        return (f"only {n} GPU operations: an excerpt too small to judge the GPU timeline (HTA's breakdown is "
                "given with low quality); profile a few whole steps")
    return None


def _no_gpu_reason(trace: KinetoTrace) -> str:
    cats = dict(trace.by_cat)
    if trace.meta.platform == "mtia" or any(str(c).startswith("mtia") for c in cats):
        return (f"a Meta MTIA accelerator trace ({cats.get('mtia_ccp_events', 0)} device events, no CUDA/ROCm "
                "kernels): the HTA breakdown is given, the GPU timeline rules do not apply")
    if cats.get("cuda_profiler_range"):
        return (f"CUPTI range-profiler mode: {cats['cuda_profiler_range']} counter ranges and "
                f"{len(trace.host.ts)} runtime calls but no kernel timeline; profile with "
                "ProfilerActivity.CUDA (activities=[CPU, CUDA]) for kernels")
    if len(trace.host.ts):
        return (f"{len(trace.host.ts)} CUDA runtime calls were traced but no kernel, memcpy or memset: "
                "add ProfilerActivity.CUDA to the profiler's activities")
    return (f"a CPU-only trace ({trace.events} events, no GPU activity): the profiler ran without "
            "ProfilerActivity.CUDA, or the work ran on the CPU")


def _memory_timeline(stream: IO[bytes], name: str) -> tuple[list[Evidence], InputRecord]:
    try:
        tl = kineto.read_memory_timeline(stream)
    except kineto.KinetoError as exc:
        return [], InputRecord(name, MEMORY_KIND, "unreadable", str(exc))
    ev = Emit(name)
    ev.add("mem.timeline_peak_bytes", tl.peak_bytes, "bytes",
           "peak of live tensor bytes in torch.profiler's memory timeline (export_memory_timeline_raw)")
    ev.add("mem.timeline_peak_by_category", dict(tl.peak_by_category), "table",
           "live bytes by category at that peak (parameter, optimizer_state, activation, gradient, …)")
    why = (f"a torch.profiler memory timeline ({tl.records} allocation records over {tl.span_ns / 1e9:.2f} s), "
           "not a Chrome trace: its peak and categories are read, no GPU timeline; the allocator's reserved "
           "memory and any OOM need a CUDA memory snapshot (torch.cuda.memory._dump_snapshot)")
    return ev.items, InputRecord(name, MEMORY_KIND, "partial", why)


# -- folds (pure numpy) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Union:
    """The union of intervals: busy time, first start, last end, idle gaps (start, length)."""

    busy: float
    first: float
    last: float
    gap_start: np.ndarray
    gap_len: np.ndarray
    next_index: np.ndarray  # index (in the input arrays) of the interval that ends each gap

    @property
    def span(self) -> float:
        return max(0.0, self.last - self.first)


def union(ts: np.ndarray, end: np.ndarray) -> Union:
    """Union of [ts, end) intervals (any order) and the gaps between them."""
    if ts.size == 0:
        empty = np.zeros(0)
        return Union(0.0, 0.0, 0.0, empty, empty, np.zeros(0, dtype=np.int64))
    order = np.argsort(ts, kind="stable")
    s, e = ts[order], end[order]
    run = np.maximum.accumulate(e)
    prev = np.concatenate(([s[0]], run[:-1]))
    seg = np.maximum(e, prev) - np.maximum(s, prev)
    busy = float(np.clip(seg, 0, None).sum())
    gap = s[1:] - run[:-1]
    idx = np.flatnonzero(gap > 0)
    return Union(busy, float(s[0]), float(run[-1]), run[:-1][idx], gap[idx], order[1:][idx])


@dataclass(frozen=True)
class Breakdown:
    """HTA's temporal breakdown of one rank, in µs."""

    idle_us: float
    compute_us: float
    non_compute_us: float
    span_us: float
    events: int
    start_us: float = 0.0  # where the kernel span starts, on the trace's clock

    def share(self, part: float) -> float:
        return part / self.span_us if self.span_us > 0 else 0.0


def hta_kernel_type(name: str) -> str:
    """communication | memory | computation | other, as HTA's ``get_kernel_type``."""
    if _HTA_COMM.match(name):
        return "communication"
    if _HTA_MEMORY.match(name):
        return "memory"
    if not _HTA_NON_COMPUTE.match(name):
        return "computation"
    return "other"


def _hta_union(ts: np.ndarray, end: np.ndarray) -> tuple[float, float]:
    """HTA's ``merge_kernel_intervals``: (sum of merged lengths, last end − first start)."""
    order = np.argsort(ts, kind="stable")
    s, e = ts[order], end[order]
    prev = np.concatenate(([-np.inf], np.maximum.accumulate(e)[:-1]))
    group = np.cumsum(s > prev)
    starts = np.flatnonzero(np.diff(np.concatenate(([0], group))) != 0)
    g_ts = s[starts]
    g_end = np.maximum.reduceat(e, starts)
    return float(g_end.sum() - g_ts.sum()), float(g_end[-1] - g_ts[0])


def hta_breakdown(trace: KinetoTrace) -> Breakdown | None:
    """The temporal breakdown as HTA 0.5 computes it (see the module docstring); None without events."""
    h = trace.hta
    if h.ts.size == 0:
        return None
    ts = np.ceil(h.ts)
    end = np.floor(h.ts + h.dur)
    keep = np.ones(ts.size, dtype=bool)
    steps = trace.steps
    if trace.step_names >= 2 and steps.size:
        last_start = float(np.ceil(steps[:, 0].max()))
        sync_ids = [i for i, n in enumerate(trace.names) if n in kineto.HTA_SYNC_NAMES]
        gpu_side = ((h.stream >= 0) & (h.corr >= 0)) | np.isin(h.name, sync_ids)
        host_ts = np.ceil(trace.host.ts)
        launched = _distinct(trace.host.corr[host_ts < last_start])
        if trace.cpu_nocorr_first_ts < last_start:
            launched = _distinct(np.append(launched, -1))
        keep = np.where(gpu_side, _member(h.corr, launched), ts < last_start)
    if not keep.any():
        return None
    ts, end, names = ts[keep], end[keep], h.name[keep]
    run, span = _hta_union(ts, end)
    idle = span - run
    compute_ids = np.array([hta_kernel_type(n) == "computation" for n in trace.names], dtype=bool)
    comp = compute_ids[names]
    compute = _hta_union(ts[comp], end[comp])[0] if comp.any() else 0.0
    return Breakdown(idle, compute, span - compute - idle, span, int(keep.sum()), float(ts.min()))


# -- evidence ------------------------------------------------------------------------------------


def _ms(us: float) -> float:
    return round(us / US_PER_MS, 3)


def _pct(values: np.ndarray, q: float) -> float:
    """``np.percentile(values, q)`` (its linear method, its interpolation to the bit) without the
    masked-array check that imports ``numpy.ma``."""
    if not values.size:
        return 0.0
    s = np.sort(values)
    at = (s.size - 1) * (q / 100)
    lo = int(np.floor(at))
    a, b = float(s[lo]), float(s[min(lo + 1, s.size - 1)])
    t = at - lo
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def _distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of an integer array: ``np.unique`` without its masked-array check, whose
    import of ``numpy.ma`` (5-14 ms) was a twentieth of reading a small trace."""
    s = np.sort(values)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if s.size else s


def _member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``np.isin(values, pool)`` for a sorted, distinct ``pool`` (``_distinct``), by binary search."""
    pos = np.minimum(np.searchsorted(pool, values), max(pool.size - 1, 0))
    return (pool[pos] == values) if pool.size else np.zeros(values.shape, dtype=bool)


def _name_flags(names: tuple[str, ...], test: Callable[[str], bool]) -> np.ndarray:
    return np.array([test(n) for n in names], dtype=bool) if names else np.zeros(0, dtype=bool)


def derive(trace: KinetoTrace, source: str) -> list[Evidence]:
    g = trace.gpu
    devices = _distinct(g.device) if g.ts.size else np.zeros(0, dtype=np.int64)
    windows: dict[int, Union] = {int(d): union(g.ts[g.device == d], (g.ts + g.dur)[g.device == d]) for d in devices}
    longest = max((u.span for u in windows.values()), default=0.0)
    ev = Emit(source, quality=Quality.LOW if longest < MIN_WINDOW_US else Quality.GOOD)
    _meta(trace, ev)
    judged = timeline_judged(trace) is None
    if not judged:
        ev.quality = Quality.LOW
    bd = hta_breakdown(trace)
    if bd is not None and bd.span_us > 0:
        _breakdown(trace, bd, ev)
    if trace.host.ts.size:
        _cold_start(trace, windows, ev)
    if not judged:
        return ev.items
    if g.ts.size:
        _timeline(trace, windows, ev)
        _idle_attribution(trace, windows, ev)
        _launches(trace, ev)
        _comm(trace, windows, ev)
        _operators(trace, ev)
    if np.any(g.kind == GPU_MEMCPY):
        _copies(trace, windows, ev)
    if trace.host.ts.size:
        _api(trace, ev)
    return ev.items


def _meta(trace: KinetoTrace, ev: Emit) -> None:
    m = trace.meta
    if m.rank is not None:
        ev.add("kineto.rank", m.rank, "rank", "distributedInfo.rank of the trace" + (
                f" (of {m.world_size}, {m.backend})" if m.world_size else ""), Quality.GOOD)
    ev.add("kineto.platform", m.platform or "cpu-only", "platform",
           "from the runtime call names, versions and device names: cuda, rocm (hip* calls) or mtia", Quality.GOOD)
    ev.add("kineto.events", trace.events, "events", "trace events read (all categories)", Quality.GOOD)
    if m.devices:
        ev.add("kineto.device_names", sorted({redact_text(d) for d in m.devices if d}) or ["(unnamed)"], "table",
               "deviceProperties names", Quality.GOOD)


def _breakdown(trace: KinetoTrace, bd: Breakdown, ev: Emit) -> None:
    rank = trace.meta.rank if trace.meta.rank is not None else 0
    detail = (f"HTA temporal breakdown of rank {rank} over its kernel span ({_ms(bd.span_us)} ms, {bd.events} GPU "
              "events): share of the span in which")
    ev.add("kineto.idle_share", bd.share(bd.idle_us), "ratio", detail + " no GPU event runs on any stream")
    ev.add("kineto.compute_share", bd.share(bd.compute_us), "ratio", detail + " a computation kernel runs")
    ev.add("kineto.non_compute_share", bd.share(bd.non_compute_us), "ratio",
           detail + " only communication, memory (memcpy/memset) or sync events run")
    ev.add("kineto.kernel_span_ms", _ms(bd.span_us), "ms", "HTA's kernel span: first GPU event start to last end")
    ev.add("kineto.rank_breakdown", {"rank": rank, "idle_us": round(bd.idle_us, 3),
                                     "compute_us": round(bd.compute_us, 3),
                                     "non_compute_us": round(bd.non_compute_us, 3), "span_us": round(bd.span_us, 3),
                                     "start_us": round(bd.start_us, 3)},
           "table", "HTA temporal breakdown in µs, and where the kernel span starts on the trace's clock (several "
           "trace files, one per rank, are set side by side in kineto.ranks.*)")


def _timeline(trace: KinetoTrace, windows: dict[int, Union], ev: Emit) -> None:
    g = trace.gpu
    end = g.ts + g.dur
    kern = g.kind == GPU_KERNEL
    window = sum(u.span for u in windows.values())
    busy = sum(u.busy for u in windows.values())
    kbusy = 0.0
    rows = []
    timeline: list[dict[str, object]] = []
    for d, u in windows.items():
        sel = g.device == d
        ku = union(g.ts[sel & kern], end[sel & kern])
        kbusy += ku.busy
        rows.append({
            "device": d, "name": _device_name(trace, d), "window_ms": _ms(u.span),
            "busy_ratio": round(u.busy / u.span, 4) if u.span else None,
            "kernel_busy_ratio": round(ku.busy / u.span, 4) if u.span else None,
            "kernels": int((sel & kern).sum()), "kernel_ms": _ms(float(g.dur[sel & kern].sum())),
            "tiny_kernels": int((sel & kern & (g.dur < TINY_KERNEL_US)).sum()),
            "copies": int((sel & (g.kind == GPU_MEMCPY)).sum()), "memsets": int((sel & (g.kind == GPU_MEMSET)).sum()),
            "idle_gaps": int(u.gap_len.size), "idle_ms": _ms(float(u.gap_len.sum())),
            "longest_gap_ms": _ms(float(u.gap_len.max()) if u.gap_len.size else 0.0),
        })
        timeline.append({"device": d, "name": _device_name(trace, d), "window_ms": _ms(u.span),
                         "busy_ratio": round(u.busy / u.span, 4) if u.span else None, "busy_bins": _bins(u)})
    kernels = int(kern.sum())
    kernel_us = float(g.dur[kern].sum())
    emit_busy(ev, len(windows), _ms(max(u.span for u in windows.values())), busy, kbusy, window, _ms(busy))
    gaps = np.concatenate([u.gap_len for u in windows.values()]) if windows else np.zeros(0)
    bucket = np.searchsorted(np.array(GAP_EDGES_US), gaps, side="right")
    emit_gaps(ev, int(gaps.size), _ms(float(gaps.sum())), _ms(float(gaps.max()) if gaps.size else 0.0),
              {b: {"count": int((bucket == i).sum()), "time_ms": _ms(float(gaps[bucket == i].sum()))}
               for i, b in enumerate(GAP_BUCKETS)})
    emit_kernels(ev, kernels, kernel_us, int((kern & (g.dur < TINY_KERNEL_US)).sum()), "the PyTorch-profiler trace")
    if kernels:
        ev.add("trace.top_kernels", _top_kernels(trace, kern, kernel_us), "table", "kernels by total GPU time")
        launch_us = _host_time(trace, LAUNCH_CALLS | GRAPH_LAUNCH_CALLS)
        if launch_us > 0 and kernel_us > 0:
            ev.add("trace.launch_overhead_ratio", launch_us / kernel_us, "ratio",
                   "host time in kernel-launch and graph-launch calls / GPU time of the kernels (≥ 1: the host cannot "
                   "issue work as fast as the GPU finishes it)")
    ev.add("trace.devices", rows, "table", "per GPU: window, busy ratios, kernels, copies, gaps")
    ev.add("kineto.timeline", timeline, "table",
           f"per GPU: busy_bins, the busy share of each of {TIMELINE_BINS} equal bins of its window (the busy/idle "
           "timeline the reports draw)")


def _device_name(trace: KinetoTrace, d: int) -> str:
    names = trace.meta.devices
    return redact_text(names[d]) if 0 <= d < len(names) and names[d] else ""


def _bins(u: Union, n: int = TIMELINE_BINS) -> list[float]:
    """Busy share of each of ``n`` equal bins of the device window (overlaps counted once): the window
    minus its idle gaps, integrated per bin from the cumulative idle time at each bin edge."""
    if u.span <= 0:
        return []
    edges = np.linspace(u.first, u.last, n + 1)
    width = edges[1] - edges[0]
    if not u.gap_len.size:
        return [1.0] * n
    g0 = u.gap_start  # sorted, disjoint (gaps of a union)
    g1 = g0 + u.gap_len
    done = np.concatenate(([0.0], np.cumsum(u.gap_len)))  # idle time of the gaps before each one
    k = np.searchsorted(g0, edges, side="right")  # gaps that start at or before each edge
    before = done[np.maximum(k - 1, 0)]  # every gap before the last one that started
    last = np.where(k > 0, np.clip(edges - g0[np.maximum(k - 1, 0)], 0, None), 0.0)
    last = np.minimum(last, np.where(k > 0, g1[np.maximum(k - 1, 0)] - g0[np.maximum(k - 1, 0)], 0.0))
    idle_at = np.where(k > 0, before + last, 0.0)  # idle time from the window's start to each edge
    idle = np.diff(idle_at)
    return [round(float(max(0.0, 1.0 - x / width)), 4) for x in idle]


def _top_kernels(trace: KinetoTrace, kern: np.ndarray, kernel_us: float) -> list[dict[str, object]]:
    g = trace.gpu
    names = g.name[kern]
    dur = g.dur[kern]
    totals = np.bincount(names, weights=dur, minlength=len(trace.names))
    counts = np.bincount(names, minlength=len(trace.names))
    tiny = np.bincount(names[dur < TINY_KERNEL_US], minlength=len(trace.names))
    rows = []
    for i in np.argsort(-totals)[:TOP]:
        if counts[i] == 0:
            break
        rows.append({"name": redact_text(trace.names[i])[:120], "count": int(counts[i]), "time_ms": _ms(totals[i]),
                     "mean_us": round(float(totals[i] / counts[i]), 2),
                     "share": round(float(totals[i] / kernel_us), 4) if kernel_us else 0.0, "tiny": int(tiny[i])})
    return rows


def _call_mask(trace: KinetoTrace, calls: frozenset[str] | Callable[[str], bool]) -> np.ndarray:
    test = calls.__contains__ if isinstance(calls, frozenset) else calls
    flags = _name_flags(trace.names, lambda n: bool(test(n)))
    return flags[trace.host.name] if flags.size else np.zeros(trace.host.ts.size, dtype=bool)


def _host_time(trace: KinetoTrace, calls: frozenset[str]) -> float:
    return float(trace.host.dur[_call_mask(trace, calls)].sum())


def _launcher(trace: KinetoTrace) -> np.ndarray:
    """For each GPU op, the index of the host call with its correlation id (-1 when none)."""
    h = trace.host
    out = np.full(trace.gpu.ts.size, -1, dtype=np.int64)
    if h.ts.size == 0:
        return out
    order = np.argsort(h.corr, kind="stable")
    sc = h.corr[order]
    pos = np.searchsorted(sc, trace.gpu.corr)
    pos = np.clip(pos, 0, sc.size - 1)
    hit = (sc[pos] == trace.gpu.corr) & (trace.gpu.corr >= 0)
    out[hit] = order[pos[hit]]
    return out


def _idle_attribution(trace: KinetoTrace, windows: dict[int, Union], ev: Emit) -> None:
    h = trace.host
    launcher = _launcher(trace)
    sync = _call_mask(trace, SYNC_CALLS) | _call_mask(trace, lambda n: bool(_SYNC_COPY.match(n)))
    order = np.argsort(h.ts[sync], kind="stable")
    sync_s = h.ts[sync][order]
    sync_e = np.maximum.accumulate((h.ts + h.dur)[sync][order]) if sync.any() else sync_s
    totals = {"sync_wait": 0.0, "launch_gap": 0.0, "host_wait": 0.0, "unattributed": 0.0}
    dispatch = 0.0
    for d, u in windows.items():
        if not u.gap_len.size:
            continue
        idx = np.flatnonzero(trace.gpu.device == d)[u.next_index]
        g0, glen = u.gap_start, u.gap_len
        call = launcher[idx]
        known = call >= 0
        issued = np.zeros(g0.size, dtype=bool)
        issued[known] = h.ts[call[known]] <= g0[known]
        in_sync = np.zeros(g0.size, dtype=bool)
        if sync_s.size:
            k = np.searchsorted(sync_s, g0, side="right") - 1
            ok = k >= 0
            in_sync[ok] = sync_e[k[ok]] >= g0[ok]
        totals["sync_wait"] += float(glen[in_sync].sum())
        totals["launch_gap"] += float(glen[~in_sync & known & issued].sum())
        host_wait = ~in_sync & known & ~issued
        totals["host_wait"] += float(glen[host_wait].sum())
        dispatch += float(glen[host_wait & (glen < DISPATCH_GAP_US)].sum())
        totals["unattributed"] += float(glen[~in_sync & ~known].sum())
    idle = sum(totals.values())
    if idle <= 0:
        return
    for part, v in totals.items():
        ev.add(f"kineto.idle.{part}_ms", _ms(v), "ms", _IDLE_DETAIL[part])
        ev.add(f"kineto.idle.{part}_share", v / idle, "ratio", "share of the GPU's idle time: " + _IDLE_DETAIL[part])
    window = sum(u.span for u in windows.values())
    ev.add("kineto.idle.dispatch_ms", _ms(dispatch), "ms",
           f"host-wait gaps shorter than {DISPATCH_GAP_US / 1000:.0f} ms: the GPU waits for the next op of the same "
           "step (Python and framework dispatch between kernels, not host work between steps)")
    if window > 0:
        ev.add("kineto.idle.dispatch_share", dispatch / window, "ratio",
               "those dispatch gaps / the GPU-active window (summed over devices)")


_IDLE_DETAIL = {
    "sync_wait": "idle gaps that begin while a host thread is blocked in a synchronising call "
                 "(cudaDeviceSynchronize/cudaStreamSynchronize/cudaEventSynchronize, a synchronous memcpy)",
    "launch_gap": "idle gaps whose next operation had already been launched when the GPU went idle "
                  "(launch latency, CUDA-graph or cross-stream dependencies)",
    "host_wait": "idle gaps whose next operation was launched only after the GPU went idle "
                 "(the host was busy elsewhere: Python, data preparation, waiting for work)",
    "unattributed": "idle gaps before an operation whose launch call is not in the trace",
}


def _launches(trace: KinetoTrace, ev: Emit) -> None:
    g, h = trace.gpu, trace.host
    launcher = _launcher(trace)
    kern = g.kind == GPU_KERNEL
    direct = _call_mask(trace, LAUNCH_CALLS)
    graph = _call_mask(trace, GRAPH_LAUNCH_CALLS)
    known = kern & (launcher >= 0)
    by_direct = known.copy()
    by_direct[known] = direct[launcher[known]]
    if by_direct.any():
        delay = g.ts[by_direct] - h.ts[launcher[by_direct]]
        ev.add("kineto.launch_delay_us.p50", _pct(delay, 50), "us",
               "kernel start − start of the launch call that issued it (by correlation id): launch latency plus "
               "queueing")
        ev.add("kineto.launch_delay_us.p99", _pct(delay, 99), "us", "99th percentile of that delay")
        ev.add("kineto.launch_delay_us.max", float(delay.max()), "us", "longest launch-to-start delay")
    if graph.any():
        by_graph = known.copy()
        by_graph[known] = graph[launcher[known]]
        ev.add("api.graph_launches", int(graph.sum()), "count",
               "cudaGraphLaunch/hipGraphLaunch calls (CUDA graphs in use)", Quality.GOOD)
        if kern.any():
            ev.add("kineto.graph_kernel_share", float(by_graph.sum() / kern.sum()), "ratio",
                   "share of kernels replayed from a CUDA/HIP graph (their correlation id is a graph launch's)")


def _comm(trace: KinetoTrace, windows: dict[int, Union], ev: Emit) -> None:
    g = trace.gpu
    flags = _name_flags(trace.names, lambda n: bool(_COMM.search(n)))
    comm = (g.kind == GPU_KERNEL) & flags[g.name]
    if not comm.any():
        return
    cu = union(g.ts[comm], (g.ts + g.dur)[comm])
    span = sum(u.span for u in windows.values())
    kern_other = (g.kind == GPU_KERNEL) & ~flags[g.name]
    ou = union(g.ts[kern_other], (g.ts + g.dur)[kern_other])
    overlap = cu.busy + ou.busy - union(g.ts[g.kind == GPU_KERNEL], (g.ts + g.dur)[g.kind == GPU_KERNEL]).busy
    ev.add("kineto.comm_kernel_count", int(comm.sum()), "kernels", "collective kernels (NCCL/RCCL, custom all-reduce)")
    ev.add("kineto.comm_time_ms", _ms(cu.busy), "ms", "union of collective-kernel intervals")
    if span > 0:
        ev.add("kineto.comm_share", cu.busy / span, "ratio", "collective-kernel time (union) / the GPU-active window")
        ev.add("kineto.comm_exposed_share", max(0.0, cu.busy - overlap) / span, "ratio",
               "collective-kernel time with no other kernel running / the GPU-active window (communication not "
               "hidden behind compute)")


def _operators(trace: KinetoTrace, ev: Emit) -> None:
    g = trace.gpu
    if trace.op_ext.size and g.ts.size:
        ext, names = trace.op_ext[:, 0], trace.op_ext[:, 1]
        order = np.argsort(ext, kind="stable")
        se, sn = ext[order], names[order]
        # the operator of a GPU op: the External id of the host call that launched it (older traces give
        # kernels their correlation id there), else the kernel's own
        launcher = _launcher(trace)
        gext = np.where(launcher >= 0, trace.host.ext[np.maximum(launcher, 0)], g.ext)
        pos = np.clip(np.searchsorted(se, gext), 0, max(0, se.size - 1))
        hit = (se[pos] == gext) & (gext >= 0)
        if hit.any():
            op = sn[pos[hit]]
            totals = np.bincount(op, weights=g.dur[hit], minlength=len(trace.names))
            counts = np.bincount(op, minlength=len(trace.names))
            total = float(g.dur.sum())
            rows = [{"name": redact_text(trace.names[i])[:120], "gpu_ms": _ms(totals[i]), "gpu_ops": int(counts[i]),
                     "share": round(float(totals[i] / total), 4) if total else 0.0}
                    for i in np.argsort(-totals)[:TOP] if counts[i]]
            ev.add("kineto.top_operators", rows, "table",
                   "operators (cpu_op) by the GPU time of the kernels and copies they launched (External id)")
    if trace.ops:
        ev.add("kineto.top_cpu_operators",
               [{"name": redact_text(o.name)[:120], "count": o.count, "cpu_ms": _ms(o.total_us)}
                for o in trace.ops[:TOP]],
               "table", "operators by inclusive host time (nested operators counted in each level)")


def _copies(trace: KinetoTrace, windows: dict[int, Union], ev: Emit) -> None:
    g, h = trace.gpu, trace.host
    cp = np.flatnonzero(g.kind == GPU_MEMCPY)
    kinds = {i: kineto.memcpy_kind(trace.names[i]) for i in _distinct(g.name[cp])}
    direction = np.array([kinds[i][0] for i in g.name[cp]])
    host_kind = np.array([kinds[i][1] for i in g.name[cp]])
    nbytes = np.clip(g.nbytes[cp], 0, None)
    dur = g.dur[cp]
    launcher = _launcher(trace)[cp]
    call = np.array([trace.names[h.name[c]] if c >= 0 else "" for c in launcher])
    is_async = np.array([bool(_ASYNC_COPY.match(c)) for c in call], dtype=bool)
    is_sync = np.array([bool(_SYNC_COPY.match(c)) for c in call], dtype=bool)
    kernel_us = float(g.dur[g.kind == GPU_KERNEL].sum())
    copy_us = float(dur.sum())
    ev.add("copy.count", int(cp.size), "count", "memcpy operations (memsets excluded)")
    ev.add("copy.time_ms", _ms(copy_us), "ms", "all memcpy GPU time")
    ev.add("copy.mean_bytes", float(nbytes.mean()), "bytes", "bytes per memcpy on average")
    if copy_us + kernel_us > 0:
        ev.add("copy.time_share", copy_us / (copy_us + kernel_us), "ratio", "memcpy time / (memcpy + kernel time)")
    for d in ("h2d", "d2h", "d2d", "p2p"):
        sel = direction == d
        if not sel.any():
            continue
        b, t = int(nbytes[sel].sum()), float(dur[sel].sum())
        ev.add(f"copy.{d}_count", int(sel.sum()), "count", f"memcpy {d} operations")
        ev.add(f"copy.{d}_bytes", b, "bytes", f"memcpy {d} bytes")
        ev.add(f"copy.{d}_time_ms", _ms(t), "ms", f"memcpy {d} GPU time")
        if t > 0:
            ev.add(f"copy.{d}_gbps", b / t / 1000.0, "GB/s", f"achieved {d} bandwidth: bytes / copy time")
    host = np.isin(direction, ("h2d", "d2h"))
    host_bytes = int(nbytes[host].sum())
    for k in ("pageable", "pinned"):
        sel = host & (host_kind == k)
        if not sel.any():
            continue
        b, t = int(nbytes[sel].sum()), float(dur[sel].sum())
        ev.add(f"copy.{k}_bytes", b, "bytes", f"host↔device bytes on {k} host memory")
        ev.add(f"copy.{k}_count", int(sel.sum()), "count", f"host↔device copies on {k} host memory")
        ev.add(f"copy.{k}_time_ms", _ms(t), "ms", f"GPU time of copies on {k} host memory")
        if t > 0:
            ev.add(f"copy.{k}_gbps", b / t / 1000.0, "GB/s", f"achieved bandwidth of copies on {k} host memory")
        if k == "pageable":
            for d in ("h2d", "d2h"):
                sub = sel & (direction == d)
                if sub.any():
                    ev.add(f"copy.{d}_pageable_bytes", int(nbytes[sub].sum()), "bytes", f"{d} bytes on pageable memory")
    known_kind = host & np.isin(host_kind, ("pageable", "pinned"))
    if host_bytes and known_kind.any():
        pageable = int(nbytes[host & (host_kind == "pageable")].sum())
        ev.add("copy.pageable_ratio", pageable / host_bytes, "ratio", "pageable share of host↔device bytes")
        pa = host & (host_kind == "pageable") & is_async
        ev.add("copy.pageable_async_count", int(pa.sum()), "count",
               "async memcpy calls on pageable host memory: the host blocks and the copy cannot overlap compute")
        ev.add("copy.pageable_async_time_ms", _ms(float(dur[pa].sum())), "ms", "GPU time of those copies")
    small = (nbytes < SMALL_COPY_BYTES) & (g.nbytes[cp] >= 0)
    ev.add("copy.small_count", int(small.sum()), "count",
           f"copies under {SMALL_COPY_BYTES // 1024} KiB (latency-bound)")
    ev.add("copy.small_time_ms", _ms(float(dur[small].sum())), "ms", "GPU time of those small copies")
    if (launcher >= 0).any():
        ev.add("copy.sync_count", int(is_sync.sum()), "count",
               "copies issued by a synchronous memcpy call (cudaMemcpy, hipMemcpy, hipMemcpyWithStream)")
        ev.add("copy.sync_time_ms", _ms(float(dur[is_sync].sum())), "ms", "GPU time of those copies")
    if host.any():
        ev.add("copy.host_share", float(dur[host].sum()) / copy_us if copy_us else 0.0, "ratio",
               "host↔device (H2D + D2H) share of memcpy time; the rest is device-to-device")


def _api(trace: KinetoTrace, ev: Emit) -> None:
    h = trace.host
    sync = _call_mask(trace, SYNC_CALLS) | _call_mask(trace, lambda n: bool(_SYNC_COPY.match(n)))
    launch = _call_mask(trace, LAUNCH_CALLS)
    graph = _call_mask(trace, GRAPH_LAUNCH_CALLS)
    memcpy = _call_mask(trace, lambda n: bool(_SYNC_COPY.match(n) or _ASYNC_COPY.match(n)))
    ev.add("api.sync_time_ms", _ms(float(h.dur[sync].sum())), "ms",
           "host time blocked in cudaStreamSynchronize/cudaDeviceSynchronize/cudaEventSynchronize (hip*) and "
           "synchronous memcpy calls", Quality.GOOD)
    ev.add("api.memcpy_calls", int(memcpy.sum()), "count", "memcpy calls (cuda*/hip*)", Quality.GOOD)
    n_launch = int(launch.sum() + graph.sum())
    ev.add("api.launch_count", n_launch, "count", "kernel and graph launch calls", Quality.GOOD)
    if n_launch:
        t = float(h.dur[launch | graph].sum())
        ev.add("api.launch_time_ms", _ms(t), "ms", "host time in launch calls", Quality.GOOD)
        ev.add("api.launch_mean_us", t / n_launch, "us", "mean host time per launch call", Quality.GOOD)
    if sync.any():
        by: dict[int, list[float]] = {}
        for i in np.flatnonzero(sync):
            acc = by.setdefault(int(h.name[i]), [0, 0.0])
            acc[0] += 1
            acc[1] += float(h.dur[i])
        ev.add("api.sync_by_call", [{"name": trace.names[n], "calls": int(c), "time_ms": _ms(t)}
                                    for n, (c, t) in sorted(by.items(), key=lambda kv: -kv[1][1])],
               "table", "synchronising calls by name", Quality.GOOD)
        best: tuple[float, int, float] | None = None
        for tid in _distinct(h.tid):
            sel = h.tid == tid
            wall = float((h.ts[sel] + h.dur[sel]).max() - h.ts[sel].min())
            st = float(h.dur[sel & sync].sum())
            if wall > 0 and (best is None or st > best[2]):
                best = (wall, int(tid), st)
        if best is not None:
            wall, tid, st = best
            ev.add("api.sync_wall_share", min(1.0, st / wall), "ratio",
                   f"share of the most-blocked host thread's runtime wall (first to last runtime call, {_ms(wall)} ms) "
                   f"spent in synchronising calls (tid {tid})", Quality.GOOD)
            ev.add("api.sync_thread_wall_ms", _ms(wall), "ms", "that thread's runtime wall", Quality.GOOD)


def _cold_start(trace: KinetoTrace, windows: dict[int, Union], ev: Emit) -> None:
    h = trace.host
    i = int(np.argmax(h.dur))
    name = trace.names[h.name[i]]
    t0, t1 = float(h.ts[i]), float(h.ts[i] + h.dur[i])
    ev.add("kineto.slowest_call_ms", _ms(t1 - t0), "ms",
           f"the longest runtime call: {name} (CUDA context creation, lazy module loading or a first launch of seconds "
           "is a cold start)", Quality.GOOD)
    ev.add("kineto.slowest_call", name, "name", "the runtime call that took longest", Quality.GOOD)
    if trace.host_span is not None:
        ev.add("kineto.host_span_ms", _ms(trace.host_span[1] - trace.host_span[0]), "ms",
               "first to last host event of the trace", Quality.GOOD)
    if windows:
        inside = sum(max(0.0, min(t1, u.last) - max(t0, u.first)) for u in windows.values())
        span = sum(u.span for u in windows.values())
        if span > 0:
            ev.add("kineto.slowest_call_window_share", inside / span, "ratio",
                   "share of the GPU-active window that the longest runtime call covers (the GPU idles through it)",
                   Quality.GOOD)
