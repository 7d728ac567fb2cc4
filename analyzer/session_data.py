"""A session as tables: ``SessionData``, what the analyzer hands every presenter (HTML, the dashboard).

``SessionData`` holds the diagnosis plus one pandas table per kind of evidence over time. Each
table always exists with its columns (``COLUMNS``), empty when the evidence is absent, and then
``missing[table]`` says in one sentence why, and how to get it. Every table is bounded, so a long
session still gives small frames, and its labels already went through the analyzer's redaction
(``diagnose.redact``): no secret reaches a table, so none reaches a figure.

This module only describes the tables; it reads no session. ``diagnose.tables.load(path)`` fills
a ``SessionData`` from a session folder or ``.tar.gz``; ``reports`` and ``dashboard`` draw from it
(``diagnose.reports.data`` re-exports these names for them) and the analyzer imports nothing of theirs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from diagnose.model import Diagnosis

COLUMNS: dict[str, tuple[str, ...]] = {
    "process": ("t", "pid", "name", "cpu_cores", "rss_bytes", "threads"),
    "inflight": ("t", "inflight", "accept_queue"),
    "gpu": ("t", "gpu", "name", "util_pct", "mem_util_pct", "mem_used_bytes", "mem_total_bytes", "pcie_tx_bytes_s",
            "pcie_rx_bytes_s", "power_w", "sm_clock_mhz"),
    "gpu_processes": ("gpu", "pid", "name", "used_bytes", "is_target"),
    # seq: unique per request in the session (ids repeat across workers' logs); source: the log's file name
    "requests": ("request_id", "t_end", "e2e_ms", "ttft_ms", "input_tokens", "output_tokens", "status", "order",
                 "seq", "source"),
    "stages": ("request_id", "stage", "ms", "position", "seq"),
    "stage_stats": ("stage", "p50_ms", "p99_ms", "share"),
    "profile": ("pid", "process", "tid", "thread", "activity", "frames", "samples"),
    # t: NaN when the source gave no time; count: the occurrences the row stands for (one line, or a total)
    "events": ("t", "kind", "detail", "count"),
    "memory": ("t", "device", "allocated_bytes", "reserved_bytes", "inactive_split_bytes", "weights_bytes",
               "total_bytes"),
    "memory_breakdown": ("part", "bytes", "source"),
    # one row per allocator segment of a CUDA memory snapshot (state: live, split, free, expandable)
    "memory_segments": ("device", "segment", "size_bytes", "live_bytes", "free_bytes", "largest_free_bytes", "pool",
                        "state"),
    "kernels": ("name", "count", "total_ms", "share", "tiny_count"),
    "copies": ("direction", "host_kind", "api", "count", "bytes", "ms"),
    "gpu_busy": ("device", "name", "window_ms", "busy_ms", "kernel_busy_ms", "idle_ms", "gaps", "longest_gap_ms"),
    "gap_hist": ("device", "bucket", "count", "total_ms"),
    # a PyTorch-profiler trace's busy/idle timeline: the busy share of each of its equal bins per device (and rank);
    # t_ms: the bin's middle, from the device's first GPU operation
    "gpu_timeline": ("rank", "device", "name", "t_ms", "busy_ratio", "window_ms", "source"),
    "trace_ranks": ("rank", "source", "span_ms", "compute_ms", "idle_share", "compute_share", "non_compute_share",
                    "gpu_busy_ratio", "comm_share", "comm_exposed_share"),
    "metrics": ("name", "labels", "unit", "kind", "first", "last", "delta"),
}
TABLES: tuple[str, ...] = tuple(COLUMNS)
MEMORY_PARTS = ("weights", "activations", "kv_cache", "fragmentation", "cached", "other", "outside_pytorch", "free")
# fragmentation: free blocks inside segments that hold live ones; cached: wholly free segments
# (empty_cache() returns them)
# outside_pytorch: device total − reserved − free (the CUDA context, non-PyTorch allocations, other processes)


def empty_table(table: str) -> pd.DataFrame:
    """Table ``table`` with its columns and no row."""
    return pd.DataFrame({c: pd.Series(dtype="object") for c in COLUMNS[table]})


def make_table(table: str, rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Table ``table`` from row dicts (keys outside its columns are dropped)."""
    if not rows:
        return empty_table(table)
    return pd.DataFrame(list(rows), columns=list(COLUMNS[table]))


@dataclass
class SessionData:
    """One session as tables (see ``COLUMNS``); ``missing`` explains each empty one."""

    path: str
    label: str
    diagnosis: Diagnosis
    t0: float
    window_s: float
    process: pd.DataFrame = field(default_factory=lambda: empty_table("process"))
    inflight: pd.DataFrame = field(default_factory=lambda: empty_table("inflight"))
    gpu: pd.DataFrame = field(default_factory=lambda: empty_table("gpu"))
    gpu_processes: pd.DataFrame = field(default_factory=lambda: empty_table("gpu_processes"))
    requests: pd.DataFrame = field(default_factory=lambda: empty_table("requests"))
    stages: pd.DataFrame = field(default_factory=lambda: empty_table("stages"))
    stage_stats: pd.DataFrame = field(default_factory=lambda: empty_table("stage_stats"))
    profile: pd.DataFrame = field(default_factory=lambda: empty_table("profile"))
    events: pd.DataFrame = field(default_factory=lambda: empty_table("events"))
    memory: pd.DataFrame = field(default_factory=lambda: empty_table("memory"))
    memory_breakdown: pd.DataFrame = field(default_factory=lambda: empty_table("memory_breakdown"))
    memory_segments: pd.DataFrame = field(default_factory=lambda: empty_table("memory_segments"))
    kernels: pd.DataFrame = field(default_factory=lambda: empty_table("kernels"))
    copies: pd.DataFrame = field(default_factory=lambda: empty_table("copies"))
    gpu_busy: pd.DataFrame = field(default_factory=lambda: empty_table("gpu_busy"))
    gap_hist: pd.DataFrame = field(default_factory=lambda: empty_table("gap_hist"))
    gpu_timeline: pd.DataFrame = field(default_factory=lambda: empty_table("gpu_timeline"))
    trace_ranks: pd.DataFrame = field(default_factory=lambda: empty_table("trace_ranks"))
    metrics: pd.DataFrame = field(default_factory=lambda: empty_table("metrics"))
    missing: dict[str, str] = field(default_factory=dict)
    host_cores: int | None = None  # CPUs the target may run on (process-info.json), when recorded
    # the whole py-spy profile, of which ``profile`` keeps the stacks with the most samples (0: not counted)
    profile_samples: int = 0
    profile_stacks: int = 0

    def has(self, table: str) -> bool:
        """Whether ``table`` holds at least one row."""
        frame = getattr(self, table, None)
        return isinstance(frame, pd.DataFrame) and not frame.empty

    def table(self, name: str) -> pd.DataFrame:
        if name not in COLUMNS:
            raise KeyError(f"no table {name!r}; the tables are {', '.join(TABLES)}")
        frame: pd.DataFrame = getattr(self, name)
        return frame
