"""A CUDA memory snapshot → the ``mem.*`` evidence the OOM rules (MEM001-MEM005) read.

Keys: ``mem.reserved_bytes``, ``mem.allocated_bytes``, ``mem.reserved_minus_allocated_bytes``
(inactive blocks), ``mem.private_pools_bytes``, ``mem.largest_free_block_bytes``,
``mem.weights_bytes`` / ``mem.activations_bytes`` (a heuristic split by allocation stack),
``mem.snapshot_top_blocks`` (a list of the largest blocks with their stacks),
``mem.free_fragmentation_ratio`` (1 − largest free block / all free); and, when the snapshot's
``device_traces`` hold an OOM event, ``mem.oom_count``, ``mem.requested_bytes``,
``mem.device_free_bytes`` and ``mem.oom_phase`` (from the OOM's stack). The snapshot does not say
how large the device is, so ``mem.device_total_bytes`` is never emitted here.

What the allocator was set to and did: ``mem.snapshot_layout`` ("2.1+", "2.0" block history, "legacy
list"), ``mem.expandable_segments`` and ``mem.alloc_conf`` (from ``allocator_settings`` or the
segments' ``is_expandable``), ``mem.inactive_split_bytes`` (free blocks inside segments that also hold
live ones: the fragmentation) vs ``mem.free_segments_bytes`` (wholly free segments: the cache
``empty_cache()`` would return); and from the recorded events (``device_traces``):
``mem.trace_events``, ``mem.trace_seconds``, ``mem.peak_allocated_bytes`` and
``mem.peak_reserved_bytes`` (replayed back from the snapshot's state), ``mem.segment_allocs``,
``mem.segment_frees`` and ``mem.segment_free_bursts`` (runs of segment frees: ``empty_cache()`` calls
or OOM retries).
"""

from __future__ import annotations

from diagnose.collectors.snapshot import Breakdown, SnapshotError, load_breakdown, top_block_records
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, InputRecord, Quality
from diagnose.units import size

KIND = "torch_memory_snapshot"


def analyze_snapshot(path: str, name: str | None = None) -> tuple[list[Evidence], InputRecord]:
    """Read a ``_dump_snapshot`` pickle safely: its evidence and its input record (never raises on content)."""
    source = name or path
    try:
        b = load_breakdown(path)
    except SnapshotError as exc:
        return [], InputRecord(source, KIND, "unreadable", str(exc))
    evidence = derive(b, source)
    return evidence, InputRecord(source, KIND, "partial" if b.problems else "ok", "; ".join(b.problems))


def derive(b: Breakdown, source: str) -> list[Evidence]:
    ev = Emit(source)
    dev = f"device {b.device}" if b.device is not None else "the snapshot"
    if not b.segments:
        return ev.items
    ev.add("mem.reserved_bytes", b.reserved_bytes, "bytes", f"memory snapshot of {dev}: {b.segments} segment(s)")
    awaiting = f", {size(b.awaiting_free_bytes, 1)} awaiting free" if b.awaiting_free_bytes else ""
    ev.add("mem.allocated_bytes", b.allocated_bytes, "bytes", f"memory snapshot: active blocks{awaiting}")
    ev.add("mem.reserved_minus_allocated_bytes", b.inactive_bytes, "bytes",
           f"memory snapshot: {b.inactive_blocks} inactive block(s) in {len(b.fragmented_segments)} segment(s)")
    ev.add("mem.largest_free_block_bytes", b.largest_free_block_bytes, "bytes",
           "memory snapshot: the largest inactive block; a larger request needs a new segment")
    if b.inactive_bytes:
        ev.add("mem.free_fragmentation_ratio", 1.0 - b.largest_free_block_bytes / b.inactive_bytes, "ratio",
               "1 − largest inactive block / all inactive memory: 0 when free memory is one piece")
    ev.add("mem.private_pools_bytes", b.private_pools_bytes, "bytes",
           f"memory snapshot: {b.private_pools} private pool(s) (CUDA graphs, MemPool)")
    if b.blocks_with_stack:
        how = ("heuristic: allocation stacks through model loading (from_pretrained, load_state_dict, "
               "_apply, .to/.cuda)")
        ev.add("mem.weights_bytes", b.weights_bytes, "bytes", how, Quality.PARTIAL if b.other_bytes else Quality.GOOD)
        ev.add("mem.activations_bytes", b.activations_bytes, "bytes",
               f"heuristic: allocation stacks through forward/serving frames; {size(b.other_bytes, 1)} unattributed")
    ev.add("mem.snapshot_layout", b.layout, "layout", "torch.cuda.memory._snapshot() format: 2.1+ (frames, "
           "allocator_settings), 2.0 (block history) or a legacy list of segments")
    if b.expandable_segments is not None:
        ev.add("mem.expandable_segments", b.expandable_segments, "flag",
               "the allocator's expandable_segments setting as the snapshot records it")
    if b.alloc_conf:
        ev.add("mem.alloc_conf", b.alloc_conf, "setting", "PYTORCH_CUDA_ALLOC_CONF as the allocator read it")
    ev.add("mem.inactive_split_bytes", b.inactive_split_bytes, "bytes",
           "memory snapshot: free blocks inside segments that also hold live blocks (fragmentation)")
    ev.add("mem.free_segments_bytes", b.free_segments_bytes, "bytes",
           f"memory snapshot: {b.free_segments} segment(s) with no live block (the allocator's cache)")
    tr = b.trace
    if tr is not None:
        events = sum(tr.actions.values())
        ev.add("mem.trace_events", events, "events", "allocator events recorded in device_traces: "
               + ", ".join(f"{k} {v:,}" for k, v in sorted(tr.actions.items(), key=lambda kv: -kv[1])))
        if tr.seconds is not None:
            ev.add("mem.trace_seconds", round(tr.seconds, 3), "s", "from the first to the last recorded event")
        if tr.actions.get("alloc"):
            ev.add("mem.peak_allocated_bytes", tr.peak_allocated_bytes, "bytes",
                   "live blocks at their highest over the recorded events")
            ev.add("mem.peak_reserved_bytes", tr.peak_reserved_bytes, "bytes",
                   "segments at their highest over the recorded events")
        ev.add("mem.segment_allocs", tr.actions.get("segment_alloc", 0) + tr.actions.get("segment_map", 0), "events",
               "segments (or expandable pages) requested from CUDA during the recording")
        ev.add("mem.segment_frees", tr.actions.get("segment_free", 0) + tr.actions.get("segment_unmap", 0), "events",
               "segments (or pages) handed back to CUDA during the recording")
        ev.add("mem.segment_free_bursts", tr.segment_free_bursts, "events",
               "runs of two or more segment frees with nothing between: empty_cache() calls or OOM retries")
    if b.top_blocks:
        ev.add("mem.snapshot_top_blocks", top_block_records(b.top_blocks), "blocks",
               f"the {len(b.top_blocks)} largest active blocks with the stacks that allocated them")
    if b.ooms:
        last = b.ooms[-1]
        ev.add("mem.oom_count", len(b.ooms), "events", "OOM events in the snapshot's device_traces")
        ev.add("mem.requested_bytes", last.requested_bytes, "bytes",
               f"the last OOM event's request; largest inactive block was {size(b.largest_free_block_bytes, 1)}")
        if last.device_free_bytes is not None:
            ev.add("mem.device_free_bytes", last.device_free_bytes, "bytes", "what CUDA reported free at the OOM")
        if last.phase != "unknown":
            ev.add("mem.oom_phase", last.phase, "phase", f"from the traceback: {last.phase_frame}")
    return ev.items
