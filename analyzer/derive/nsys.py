"""Nsight Systems SQLite export → evidence about the GPU timeline, copies, sync calls and NVTX stages.

Keys, all measured on the export's own timeline (``diagnose.collectors.nsys`` reads it):

* ``trace.*``: the GPU timeline per device, summed over devices: busy ratio (union of kernel,
  copy and memset intervals over each device's active window, not a sum of durations), idle
  gaps, kernels (count, tiny ones, launch overhead, top kernels), NVTX stages with their
  projected GPU time, per-device and per-process tables.
* ``copy.*``: host↔device copies by direction, host-memory kind (pageable vs pinned) and the
  CUDA call that issued them; names shared with the ``nsys stats`` reader mean the same thing
  (``copy.h2d_time_ms``, ``copy.time_share``, ``copy.count``, ``copy.sync_count``, …).
* ``api.*``: CUDA API time on the host: synchronising calls and kernel launches.

Nothing from the export's environment, command lines or paths becomes evidence; kernel and NVTX
names and nsys's own warnings pass through ``redact_text`` before they are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from diagnose.collectors import nsys
from diagnose.collectors.nsys import CopyGroup, DeviceStats, NsysTrace
from diagnose.derive.emit import Emit
from diagnose.derive.gpu_timeline import GAP_BUCKETS, emit_busy, emit_gaps, emit_kernels
from diagnose.model import Evidence, InputRecord, Quality
from diagnose.redact import redact_text

KIND = "nsys_sqlite"
NS_PER_MS = 1e6
NS_PER_US = 1e3
MIN_WINDOW_NS = 50_000_000  # under 50 ms of GPU activity a timeline is too short to judge firmly
HOST_DIRECTIONS = ("h2d", "d2h")


def analyze_export(path: str, name: str | None = None) -> tuple[list[Evidence], InputRecord]:
    """Read an export (or a ``.nsys-rep`` through ``nsys export``): its evidence and input record."""
    source = name or path
    tmp = None
    try:
        if path.endswith(nsys.REP_SUFFIXES) and not _is_sqlite(path):
            avail = nsys.probe_nsys()
            if not avail.ok:
                return [], InputRecord(source, "nsys_report", "unreadable", f"{avail.reason}; {avail.remedy}")
            path, tmp = nsys.with_exported(path)
        trace = nsys.read_export(path, name_filter=redact_text)
    except nsys.NsysError as exc:
        kind = "nsys_report" if source.endswith(nsys.REP_SUFFIXES) else "sqlite"
        return [], InputRecord(source, kind, "unreadable", redact_text(str(exc)))
    finally:
        if tmp is not None:
            tmp.cleanup()
    evidence = derive(trace, source)
    problems = [redact_text(p) for p in trace.problems]
    status = "partial" if problems else "ok"
    return evidence, InputRecord(source, KIND, status, "; ".join(problems))


def derive(trace: NsysTrace, source: str) -> list[Evidence]:
    devices = trace.devices
    window = sum(d.window_ns for d in devices)
    thin = max((d.window_ns for d in devices), default=0) < MIN_WINDOW_NS
    ev = Emit(source, quality=Quality.LOW if thin else Quality.GOOD)
    if trace.info.nsys_version:
        ev.add("trace.nsys_version", trace.info.nsys_version, "version",
               f"Nsight Systems that exported the file (schema {trace.info.schema_version or '?'})", Quality.GOOD)
    if devices:
        _timeline(trace, ev, window)
    if any(c.count for c in trace.copies):
        _copies(trace, ev)
    if trace.api is not None:
        _api(trace, ev)
    if trace.sync_events:
        ev.add("trace.sync_events", {k: {"count": n, "time_ms": _ms(ns)} for k, n, ns in trace.sync_events},
               "table", "CUPTI synchronisation records by kind (context/stream/event/stream-wait-event)")
    if trace.stages:
        _stages(trace, ev)
    return ev.items


def _ms(ns: float) -> float:
    return round(ns / NS_PER_MS, 3)


def _timeline(trace: NsysTrace, ev: Emit, window: int) -> None:
    devices = trace.devices
    busy = sum(d.busy_ns for d in devices)
    kbusy = sum(d.kernel_busy_ns for d in devices)
    kernels = sum(d.kernel_count for d in devices)
    kernel_ns = sum(d.kernel_ns for d in devices)
    tiny = sum(d.tiny_kernels for d in devices)
    emit_busy(ev, len(devices), _ms(max(d.window_ns for d in devices)), busy, kbusy, window, _ms(busy))
    gaps = [d.gaps for d in devices]
    emit_gaps(ev, sum(g.count for g in gaps), _ms(sum(g.total_ns for g in gaps)), _ms(max(g.longest_ns for g in gaps)),
              {b: {"count": sum(g.hist_count[i] for g in gaps), "time_ms": _ms(sum(g.hist_ns[i] for g in gaps))}
               for i, b in enumerate(GAP_BUCKETS)})
    emit_kernels(ev, kernels, kernel_ns / NS_PER_US, tiny, "the SQLite timeline")
    if kernels:
        top = []
        for k in trace.kernels:
            top.append({
                "name": redact_text(k.name)[:120], "count": k.count, "time_ms": _ms(k.total_ns),
                "mean_us": round(k.total_ns / max(1, k.count) / NS_PER_US, 2),
                "share": round(k.total_ns / kernel_ns, 4) if kernel_ns else 0.0, "tiny": k.tiny_count,
            })
        ev.add("trace.top_kernels", top, "table", f"kernels by total time (of {trace.kernel_names} distinct names)")
        api = trace.api
        if api is not None and api.launch_calls + api.graph_launches and kernel_ns > 0:
            ev.add("trace.launch_overhead_ratio", (api.launch_ns + api.graph_launch_ns) / kernel_ns, "ratio",
                   "host time in kernel-launch calls / GPU time of the kernels (≥ 1: the host cannot issue work as "
                   "fast as the GPU finishes it)")
    ev.add("trace.devices", [_device_row(d) for d in devices], "table",
           "per GPU: window, busy ratio, kernels, copies, gaps")
    ev.add("trace.processes", _process_rows(trace), "table", "per process: devices, kernels and copies it issued")


def _device_row(d: DeviceStats) -> dict[str, object]:
    w = d.window_ns
    return {
        "device": d.device, "name": d.name, "pids": list(d.pids), "window_ms": _ms(w),
        "busy_ratio": round(d.busy_ns / w, 4) if w else None,
        "kernel_busy_ratio": round(d.kernel_busy_ns / w, 4) if w else None,
        "kernels": d.kernel_count, "kernel_ms": _ms(d.kernel_ns), "tiny_kernels": d.tiny_kernels,
        "copies": d.copy_count, "copy_ms": _ms(d.copy_ns), "memsets": d.memset_count, "memset_ms": _ms(d.memset_ns),
        "idle_gaps": d.gaps.count, "idle_ms": _ms(d.gaps.total_ns), "longest_gap_ms": _ms(d.gaps.longest_ns),
    }


def _process_rows(trace: NsysTrace) -> list[dict[str, object]]:
    devices: dict[int, set[int]] = {}
    copy_bytes: dict[int, int] = {}
    copy_ns: dict[int, int] = {}
    for d in trace.devices:
        for pid in d.pids:
            devices.setdefault(pid, set()).add(d.device)
    for c in trace.copies:
        devices.setdefault(c.pid, set()).add(c.device)
        copy_bytes[c.pid] = copy_bytes.get(c.pid, 0) + c.bytes
        copy_ns[c.pid] = copy_ns.get(c.pid, 0) + c.ns
    return [
        {"pid": pid, "devices": sorted(devices[pid]), "copy_bytes": copy_bytes.get(pid, 0),
         "copy_ms": _ms(copy_ns.get(pid, 0))}
        for pid in sorted(devices)
    ]


def _sum(groups: Sequence[CopyGroup], attr: str) -> int:
    return sum(int(getattr(g, attr)) for g in groups)


def _gbps(nbytes: int, ns: int) -> float | None:
    return nbytes / ns if ns > 0 else None  # bytes per ns == GB/s


def _copies(trace: NsysTrace, ev: Emit) -> None:
    copies = [c for c in trace.copies if c.count]
    moves = [c for c in copies if not c.direction.startswith("uvm")]
    kernel_ns = sum(d.kernel_ns for d in trace.devices)
    copy_ns = _sum(moves, "ns")
    count = _sum(moves, "count")
    moved = _sum(moves, "bytes")
    ev.add("copy.count", count, "count", "memcpy operations (memset and unified-memory migrations excluded)")
    ev.add("copy.time_ms", _ms(copy_ns), "ms", "all memcpy GPU time (memset excluded)")
    if count:
        ev.add("copy.mean_bytes", moved / count, "bytes", "bytes per memcpy on average")
    if copy_ns + kernel_ns > 0:
        ev.add("copy.time_share", copy_ns / (copy_ns + kernel_ns), "ratio",
               "memcpy time / (memcpy + kernel time) on the GPU (the `nsys stats` reader's definition)")
    for d in ("h2d", "d2h", "d2d", "p2p"):
        group = [c for c in moves if c.direction == d]
        if not group:
            continue
        b, ns = _sum(group, "bytes"), _sum(group, "ns")
        ev.add(f"copy.{d}_count", _sum(group, "count"), "count", f"memcpy {d} operations")
        ev.add(f"copy.{d}_bytes", b, "bytes", f"memcpy {d} bytes")
        ev.add(f"copy.{d}_time_ms", _ms(ns), "ms", f"memcpy {d} GPU time")
        rate = _gbps(b, ns)
        if rate is not None:
            ev.add(f"copy.{d}_gbps", rate, "GB/s", f"achieved {d} bandwidth: bytes / copy time")
    host = [c for c in moves if c.direction in HOST_DIRECTIONS]
    host_bytes = _sum(host, "bytes")
    for kind in ("pageable", "pinned"):
        group = [c for c in host if c.host_kind == kind]
        if not group:
            continue
        b, ns = _sum(group, "bytes"), _sum(group, "ns")
        ev.add(f"copy.{kind}_bytes", b, "bytes", f"host↔device bytes copied from/to {kind} host memory")
        ev.add(f"copy.{kind}_count", _sum(group, "count"), "count", f"host↔device copies on {kind} host memory")
        ev.add(f"copy.{kind}_time_ms", _ms(ns), "ms", f"GPU time of copies on {kind} host memory")
        rate = _gbps(b, ns)
        if rate is not None:
            ev.add(f"copy.{kind}_gbps", rate, "GB/s", f"achieved bandwidth of copies on {kind} host memory")
        for d in HOST_DIRECTIONS:
            sub = [c for c in group if c.direction == d]
            if sub and kind == "pageable":
                ev.add(f"copy.{d}_pageable_bytes", _sum(sub, "bytes"), "bytes", f"{d} bytes on pageable host memory")
    if host_bytes:
        pageable = _sum([c for c in host if c.host_kind == "pageable"], "bytes")
        ev.add("copy.pageable_ratio", pageable / host_bytes, "ratio", "pageable share of host↔device bytes")
        pa = [c for c in host if c.host_kind == "pageable" and c.api == "async"]
        ev.add("copy.pageable_async_count", _sum(pa, "count"), "count",
               "cudaMemcpy*Async calls on pageable host memory: the host blocks and the copy cannot overlap compute")
        ev.add("copy.pageable_async_time_ms", _ms(_sum(pa, "ns")), "ms", "GPU time of those copies")
    small = _sum(moves, "small_count")
    ev.add("copy.small_count", small, "count", f"copies under {nsys.SMALL_COPY_BYTES // 1024} KiB (latency-bound)")
    ev.add("copy.small_time_ms", _ms(_sum(moves, "small_ns")), "ms", "GPU time of those small copies")
    known = [c for c in moves if c.api != "unknown"]
    if known:
        sync = [c for c in known if c.api == "sync"]
        ev.add("copy.sync_count", _sum(sync, "count"), "count",
               "copies issued by a synchronous cudaMemcpy* call: the host thread waits for each")
        ev.add("copy.sync_time_ms", _ms(_sum(sync, "ns")), "ms", "GPU time of those copies")
    uvm = [c for c in copies if c.direction.startswith("uvm")]
    if uvm:
        ev.add("copy.uvm_count", _sum(uvm, "count"), "count", "unified-memory page migrations")
        ev.add("copy.uvm_bytes", _sum(uvm, "bytes"), "bytes", "bytes migrated by unified memory")
        ev.add("copy.uvm_time_ms", _ms(_sum(uvm, "ns")), "ms", "GPU time of unified-memory migrations")


def _api(trace: NsysTrace, ev: Emit) -> None:
    api = trace.api
    assert api is not None
    ev.add("api.sync_time_ms", _ms(api.sync_ns), "ms",
           "host time blocked in cudaStreamSynchronize/cudaDeviceSynchronize/cudaEventSynchronize/synchronous "
           "cudaMemcpy", Quality.GOOD)
    ev.add("api.memcpy_calls", api.memcpy_calls, "count", "cudaMemcpy* / cuMemcpy* calls", Quality.GOOD)
    ev.add("api.launch_count", api.launch_calls + api.graph_launches, "count",
           "kernel and CUDA-graph launch calls", Quality.GOOD)
    if api.launch_calls + api.graph_launches:
        launch_ns = api.launch_ns + api.graph_launch_ns
        ev.add("api.launch_time_ms", _ms(launch_ns), "ms", "host time in launch calls", Quality.GOOD)
        ev.add("api.launch_mean_us", launch_ns / (api.launch_calls + api.graph_launches) / NS_PER_US, "us",
               "mean host time per launch call", Quality.GOOD)
    if api.graph_launches:
        ev.add("api.graph_launches", api.graph_launches, "count", "cudaGraphLaunch calls (CUDA graphs in use)",
               Quality.GOOD)
    if api.sync_by_call:
        ev.add("api.sync_by_call", [{"name": n, "calls": c, "time_ms": _ms(ns)} for n, c, ns in api.sync_by_call],
               "table", "synchronising CUDA calls by name", Quality.GOOD)
    if api.threads:
        t = api.threads[0]
        if t.wall_ns > 0:
            ev.add("api.sync_wall_share", min(1.0, t.sync_ns / t.wall_ns), "ratio",
                   f"share of the most-blocked host thread's CUDA wall (first to last CUDA call, {_ms(t.wall_ns)} ms) "
                   f"spent in synchronising calls (pid {t.pid}, tid {t.tid})", Quality.GOOD)
            ev.add("api.sync_thread_wall_ms", _ms(t.wall_ns), "ms", "that thread's CUDA wall", Quality.GOOD)


def _stages(trace: NsysTrace, ev: Emit) -> None:
    rows = []
    for s in trace.stages:
        rows.append({
            "name": redact_text(s.name)[:120], "ranges": s.ranges, "cpu_ms": _ms(s.covered_ns),
            "in_gpu_window_ms": _ms(s.in_window_ns), "range_sum_ms": _ms(s.range_ns),
            "gpu_busy_ms": _ms(s.gpu_busy_ns),
            "gpu_ratio": round(min(1.0, s.gpu_busy_ns / s.in_window_ns), 4) if s.in_window_ns else None,
            "pids": list(s.pids),
        })
    ev.add("trace.nvtx_ranges", rows, "table",
           f"NVTX ranges ≥ {trace.stage_min_ns / NS_PER_MS:.2f} ms grouped by name (digits folded), top by time: "
           "cpu_ms = time inside the ranges (union), in_gpu_window_ms = the part of it inside the GPU-active window, "
           "gpu_busy_ms = GPU busy time while they were open (a time projection, mean over devices), "
           "gpu_ratio = gpu_busy_ms / in_gpu_window_ms")


def _is_sqlite(path: str) -> bool:
    try:
        with open(path, "rb") as fh:
            return nsys.is_sqlite(fh.read(len(nsys.SQLITE_MAGIC)))
    except OSError:
        return False
