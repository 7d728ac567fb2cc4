"""The GPU-timeline evidence both trace readers give — Nsight Systems' SQLite export
(``diagnose.derive.nsys``) and the PyTorch profiler's Kineto JSON (``diagnose.derive.kineto``): busy
ratios, idle gaps and kernel counts under one set of names and one wording, whichever trace measured them.

Each reader measures in its own unit (ns, µs) and hands over milliseconds and unit-free ratios.
"""

from __future__ import annotations

from collections.abc import Mapping

from diagnose.collectors.nsys import GAP_BUCKETS, GAP_EDGES_NS, TINY_KERNEL_NS
from diagnose.derive.emit import Emit

__all__ = ["GAP_BUCKETS", "GAP_EDGES_US", "TINY_KERNEL_US", "emit_busy", "emit_gaps", "emit_kernels"]

GAP_EDGES_US = tuple(e / 1000.0 for e in GAP_EDGES_NS)  # idle gaps by length: the nsys reader's buckets
TINY_KERNEL_US = TINY_KERNEL_NS / 1000.0  # a kernel under 10 µs is shorter than its own launch path


def emit_busy(ev: Emit, devices: int, window_ms: float, busy: float, kernel_busy: float, window: float,
              busy_ms: float) -> None:
    """Busy ratios: ``busy`` (kernels, copies, memsets) and ``kernel_busy`` (kernels) are unions of
    intervals summed over devices, ``window`` the devices' active windows summed, all in one unit;
    ``window_ms`` is the longest device's window."""
    ev.add("trace.device_count", devices, "devices", "GPUs with kernel, copy or memset activity in the trace")
    ev.add("trace.window_ms", window_ms, "ms", "GPU-active window: first to last GPU operation (the longest over "
           "devices)")
    if window > 0:
        ev.add("trace.gpu_busy_ratio", busy / window, "ratio",
               "union of kernel, memcpy and memset intervals over each device's active window (overlaps counted once)")
        ev.add("trace.kernel_busy_ratio", kernel_busy / window, "ratio",
               "union of kernel intervals over the active window")
    ev.add("trace.gpu_busy_ms", busy_ms, "ms", "GPU busy time (union), summed over devices")
    if busy > 0:
        ev.add("copy.exposed_share", max(0.0, (busy - kernel_busy) / busy), "ratio",
               "share of GPU busy time in which copies or memsets run and no kernel does (copy time not hidden by "
               "compute)")


def emit_gaps(ev: Emit, count: int, total_ms: float, longest_ms: float,
              histogram: Mapping[str, Mapping[str, float]]) -> None:
    """Idle gaps between GPU operations over all devices; ``histogram`` by ``GAP_BUCKETS``: count, time_ms."""
    ev.add("trace.idle_gaps.count", count, "gaps", "idle gaps between GPU operations, all devices")
    ev.add("trace.idle_gaps.total_ms", total_ms, "ms", "GPU idle time inside the active window")
    ev.add("trace.idle_gaps.longest_ms", longest_ms, "ms", "longest idle gap")
    ev.add("trace.idle_gaps.histogram", dict(histogram), "table",
           "idle gaps by length: count and total time per bucket")


def emit_kernels(ev: Emit, kernels: int, kernel_us: float, tiny: int, source: str) -> None:
    """Kernel executions, their summed time, mean and the share shorter than ``TINY_KERNEL_US``."""
    ev.add("trace.kernel_count", kernels, "kernels", "kernel executions")
    ev.add("gpu.kernel_count", kernels, "count", f"kernel executions (from {source})")
    ev.add("gpu.kernel_time_ms", round(kernel_us / 1000.0, 3), "ms", "sum of kernel durations")
    if kernels:
        ev.add("trace.kernel_mean_us", kernel_us / kernels, "us", "mean kernel duration")
        ev.add("trace.tiny_kernel_ratio", tiny / kernels, "ratio",
               f"share of kernels shorter than {TINY_KERNEL_US:.0f} µs")
