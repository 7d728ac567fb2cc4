"""CUDA caching-allocator snapshots (``torch.cuda.memory._dump_snapshot``) → a memory breakdown.

No imports beyond the standard library. A snapshot is a pickle, and unpickling runs whatever
callable the file names, so this module never uses ``pickle.load``: ``SafeUnpickler.find_class``
refuses every global, which leaves only the opcodes that build plain containers and scalars
(dict, list, tuple, str, bytes, int, float, bool, None). That is all the documented format holds
(the ``Snapshot`` / ``Segment`` / ``Block`` / ``Frame`` / ``TraceEntry`` TypedDicts in the
docstring of ``torch.cuda.memory._snapshot``). On top of that the file size, the nesting depth and
the number of nodes walked are capped, so a hostile file cannot exhaust memory or time.

The breakdown: reserved (sum of segment sizes), allocated (active blocks), reserved but
unallocated (inactive blocks: the fragmentation), private pools (segments owned by a non-default
pool: CUDA graphs, ``MemPool``), the largest blocks with the stack that allocated them, per-segment
fragmentation, a weights-vs-activations split from the allocation stacks, and the OOM events of
``device_traces`` when memory history was recorded.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

PICKLE_PROTO_MARK = 0x80  # first byte of every pickle of protocol ≥ 2 (what _dump_snapshot writes)
MAX_FILE_BYTES = 1 << 30  # 1 GiB: a snapshot with max_entries=100000 and deep stacks is a few hundred MB
MAX_DEPTH = 12  # the format nests 7 levels (snapshot → traces → trace → entry → frames → frame → value)
MAX_NODES = 50_000_000  # containers and scalars walked; shared references are counted each time they are seen
TOP_BLOCKS = 10
STACK_FRAMES = 8

# Frames whose function allocates parameters and buffers (model loading, moving a module).
LOADING_FRAMES = frozenset({
    "load_state_dict", "_load_from_state_dict", "_apply", "to", "cuda", "from_pretrained", "load_model",
    "load_weights", "load_checkpoint", "_load_pretrained_model", "_load_state_dict_into_model",
    "load_sharded_checkpoint", "to_empty", "half", "bfloat16", "init_empty_weights",
})
# Frames of a forward pass or a serving step (activations, KV cache, workspaces).
FORWARD_FRAMES = frozenset({
    "forward", "_call_impl", "_wrapped_call_impl", "generate", "execute_model", "_dummy_run", "profile_run",
    "capture_model", "step", "decode", "prefill", "sample", "backward",
})

# A function named for loading or creating weights in any code base: init_weight, init_all_weights,
# load_weights_from_hf, weight_loader, load_params, load_checkpoint_shard
_LOADING_NAME = re.compile(r"(?:^|_)(?:init|load|create|alloc)\w*_weights?(?:_|$)|^weights?_(?:load|init)"
                           r"|(?:^|_)load_(?:params|parameters|checkpoint|state)", re.IGNORECASE)

# The phase an OOM raised under these frames is in (MEM002's vocabulary); other forward frames: serving.
PHASE_OF = {"profile_run": "profile_run", "_dummy_run": "profile_run", "capture_model": "warmup"}


class SnapshotError(Exception):
    """The file is not a readable snapshot, or it was refused as unsafe."""


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that builds only containers and scalars: every global lookup is refused.

    ``find_class`` is the only door to callables (GLOBAL, STACK_GLOBAL, INST, OBJ and the
    copyreg EXT opcodes all go through it; REDUCE, NEWOBJ and BUILD need a callable or class from
    it), and ``persistent_load`` is refused too.
    """

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"snapshot refused: the pickle asks for {module}.{name}, and a memory snapshot holds only "
            "dicts, lists, strings and numbers; it may be malicious and was not loaded"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError("snapshot refused: the pickle asks for a persistent object, which a snapshot never holds")


def safe_loads(data: bytes) -> Any:
    """Unpickle ``data`` with ``SafeUnpickler``; every failure is a ``SnapshotError``."""
    if len(data) > MAX_FILE_BYTES:
        raise SnapshotError(f"snapshot refused: {len(data)} bytes is over the {MAX_FILE_BYTES} byte limit")
    try:
        return SafeUnpickler(io.BytesIO(data)).load()
    except SnapshotError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            OverflowError, MemoryError, RecursionError, UnicodeDecodeError) as exc:
        raise SnapshotError(f"not a readable pickle: {type(exc).__name__}: {exc}") from None


def read_snapshot_file(path: str, max_bytes: int = MAX_FILE_BYTES) -> Any:
    """The unpickled object of a snapshot file, read safely and size-capped."""
    with open(path, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SnapshotError(f"snapshot refused: the file is larger than the {max_bytes} byte limit")
    if not data or data[0] != PICKLE_PROTO_MARK:
        raise SnapshotError("not a pickle of protocol 2 or later (torch.cuda.memory._dump_snapshot writes one)")
    return safe_loads(data)


def check_plain(obj: Any, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Walk ``obj`` iteratively: plain types only, bounded depth, bounded node count."""
    stack: list[tuple[Any, int]] = [(obj, 0)]
    nodes = 0
    while stack:
        x, depth = stack.pop()
        nodes += 1
        if nodes > max_nodes:
            raise SnapshotError(f"snapshot refused: more than {max_nodes} values (shared references count each time)")
        if depth > max_depth:
            raise SnapshotError(f"snapshot refused: nested deeper than {max_depth} levels, which the format never is")
        if x is None or isinstance(x, bool | int | float | str | bytes):
            continue
        if isinstance(x, dict):
            for k, v in x.items():
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        elif isinstance(x, list | tuple):
            stack.extend((v, depth + 1) for v in x)
        else:  # unreachable with SafeUnpickler; kept for callers that pass objects of their own
            raise SnapshotError(f"snapshot refused: unexpected {type(x).__name__} value")


# ---------------------------------------------------------------------------------------------
# breakdown
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockInfo:
    size: int
    requested: int
    state: str
    kind: str  # weights | activations | other
    stack: tuple[str, ...]
    segment_pool: str


@dataclass(frozen=True)
class SegmentFrag:
    address: int
    total_bytes: int
    free_bytes: int
    largest_free_bytes: int
    free_blocks: int

    @property
    def fragmentation_ratio(self) -> float:
        """1 − largest free block / total free: 0 when the free memory is one piece."""
        return 1.0 - self.largest_free_bytes / self.free_bytes if self.free_bytes else 0.0


@dataclass(frozen=True)
class OomEvent:
    device: int
    requested_bytes: int
    device_free_bytes: int | None
    stack: tuple[str, ...]
    phase: str  # loading | serving | unknown
    phase_frame: str  # the frame that decided the phase


@dataclass(frozen=True)
class TraceStats:
    """What the allocator did over the recorded events of one device."""

    actions: dict[str, int]  # alloc, free_completed, segment_alloc, segment_free, segment_map, oom, ...
    seconds: float | None  # from the first to the last event's time_us, when recorded
    peak_allocated_bytes: int  # live blocks at their highest, replayed back from the snapshot's state
    peak_reserved_bytes: int  # segments (or mapped pages) at their highest
    segment_free_bursts: int  # runs of ≥ 2 segment frees with nothing between: empty_cache() or an OOM retry

    @property
    def segment_churn(self) -> int:
        """Segments handed back to CUDA and asked for again: min(allocs, frees) of segments or mapped pages."""
        allocs = self.actions.get("segment_alloc", 0) + self.actions.get("segment_map", 0)
        frees = self.actions.get("segment_free", 0) + self.actions.get("segment_unmap", 0)
        return min(allocs, frees)


def trace_stats(entries: list[Any], allocated_end: int, reserved_end: int) -> TraceStats:
    """Replay one device's trace: counts, span, and the peaks (the trace ends where the snapshot was taken)."""
    actions: dict[str, int] = {}
    alloc = res = 0
    alloc_hi = res_hi = 0
    bursts = run = 0
    first = last = None
    for e in entries:
        if not isinstance(e, dict):
            continue
        act = str(e.get("action", ""))
        actions[act] = actions.get(act, 0) + 1
        size = _int(e.get("size"))
        t = e.get("time_us")
        if isinstance(t, int | float) and not isinstance(t, bool) and t > 0:
            first = t if first is None else first
            last = t
        if act == "alloc":
            alloc += size
        elif act == "free_completed":
            alloc -= size
        elif act in ("segment_alloc", "segment_map"):
            res += size
        elif act in ("segment_free", "segment_unmap"):
            res -= size
        alloc_hi, res_hi = max(alloc_hi, alloc), max(res_hi, res)
        if act in ("segment_free", "segment_unmap"):
            run += 1
        else:
            bursts += run >= 2
            run = 0
    bursts += run >= 2
    # the trace may start mid-run (a ring buffer): the state before it is what the snapshot holds minus the net
    alloc_start, res_start = allocated_end - alloc, reserved_end - res
    seconds = (last - first) / 1e6 if first is not None and last is not None and last > first else None
    peak_alloc = max(allocated_end, alloc_start + alloc_hi) if alloc_start >= 0 else allocated_end
    peak_res = max(reserved_end, res_start + res_hi) if res_start >= 0 else reserved_end
    return TraceStats(actions, seconds, peak_alloc, peak_res, bursts)


@dataclass
class Breakdown:
    device: int | None = None
    devices: tuple[int, ...] = ()
    segments: int = 0
    reserved_bytes: int = 0
    allocated_bytes: int = 0
    awaiting_free_bytes: int = 0
    inactive_bytes: int = 0
    inactive_blocks: int = 0
    largest_free_block_bytes: int = 0
    private_pools_bytes: int = 0
    private_pools: int = 0
    weights_bytes: int = 0
    activations_bytes: int = 0
    other_bytes: int = 0
    blocks_with_stack: int = 0
    top_blocks: list[BlockInfo] = field(default_factory=list)
    fragmented_segments: list[SegmentFrag] = field(default_factory=list)
    has_traces: bool = False
    trace_entries: int = 0
    ooms: list[OomEvent] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    layout: str = ""  # "2.1+" (frames, allocator_settings), "2.0" (block history), "legacy list"
    expandable_segments: bool | None = None  # from allocator_settings or the segments; None: not recorded
    alloc_conf: str = ""  # PYTORCH_CUDA_ALLOC_CONF as the allocator read it
    inactive_split_bytes: int = 0  # inactive blocks inside segments that also hold live blocks
    free_segments_bytes: int = 0  # segments with no live block: cache that empty_cache() would return
    free_segments: int = 0
    trace: TraceStats | None = None  # the device's allocator events, when memory history was recorded
    segment_rows: list[dict[str, Any]] = field(default_factory=list)  # per segment: size, live, free, pool, state


def _int(x: Any) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else 0


def block_frames(blk: dict[str, Any]) -> Any:
    """A block's allocation stack: ``frames`` (PyTorch ≥ 2.1) or its last ``history`` entry's (2.0)."""
    frames = blk.get("frames")
    if frames:
        return frames
    history = blk.get("history")
    if isinstance(history, list) and history and isinstance(history[-1], dict):
        return history[-1].get("frames") or []
    return []


def format_frames(frames: Any, limit: int = STACK_FRAMES) -> tuple[str, ...]:
    """``filename:line name`` for the first ``limit`` frames (innermost first, as torch records them)."""
    out: list[str] = []
    for f in frames if isinstance(frames, list | tuple) else ():
        if not isinstance(f, dict):
            continue
        out.append(f"{f.get('filename', '?')}:{_int(f.get('line'))} {f.get('name', '?')}")
        if len(out) >= limit:
            break
    return tuple(out)


def classify(frames: Any) -> str:
    """weights | activations | other, from the outermost frame that names loading or a forward pass.

    Outermost first, because a forward pass may call ``.to()`` (an activation) while loading calls
    ``_apply`` deep inside ``from_pretrained`` (a weight): the caller says what the memory is for.
    """
    names = [str(f.get("name", "")) for f in frames if isinstance(f, dict)] if isinstance(frames, list | tuple) else []
    for name in reversed(names):
        if name in FORWARD_FRAMES:
            return "activations"
        if name in LOADING_FRAMES or _LOADING_NAME.search(name):
            return "weights"
    return "other"


def _phase(frames: Any) -> tuple[str, str]:
    """The OOM's phase (loading | serving | unknown) and the frame that decided it."""
    for f in reversed(frames if isinstance(frames, list | tuple) else []):
        if not isinstance(f, dict):
            continue
        name = str(f.get("name", ""))
        if name in FORWARD_FRAMES or name in LOADING_FRAMES:
            phase = PHASE_OF.get(name, "serving") if name in FORWARD_FRAMES else "loading"
            return phase, f"{f.get('filename', '?')}:{_int(f.get('line'))} {name}"
    return "unknown", ""


def _pool(seg: dict[str, Any]) -> str:
    pid = seg.get("segment_pool_id")
    if isinstance(pid, list | tuple) and any(_int(p) for p in pid):
        return "/".join(str(_int(p)) for p in pid)
    return ""


def breakdown(snap: Any, device: int | None = None) -> Breakdown:
    """The memory breakdown of one device of an unpickled snapshot (the OOM's device by default)."""
    legacy = isinstance(snap, list)
    if legacy:  # very old snapshots (torch.cuda.memory_snapshot()) were a bare list of segments
        snap = {"segments": snap, "device_traces": []}
    if not isinstance(snap, dict) or not isinstance(snap.get("segments"), list):
        raise SnapshotError("not a CUDA memory snapshot: no 'segments' list (expected torch.cuda.memory._snapshot())")
    check_plain(snap)
    b = Breakdown()
    settings = snap.get("allocator_settings")
    if isinstance(settings, dict):
        b.layout = "2.1+"
        if isinstance(settings.get("expandable_segments"), bool):
            b.expandable_segments = settings["expandable_segments"]
        conf = settings.get("PYTORCH_CUDA_ALLOC_CONF")
        b.alloc_conf = conf if isinstance(conf, str) else ""
        if b.expandable_segments is None and "expandable_segments:true" in b.alloc_conf.lower().replace(" ", ""):
            b.expandable_segments = True
    else:
        b.layout = "legacy list" if legacy else "2.0"
    if any(isinstance(s, dict) and s.get("is_expandable") is True for s in snap["segments"]):
        b.expandable_segments = True
    segs = [s for s in snap["segments"] if isinstance(s, dict)]
    if len(segs) != len(snap["segments"]):
        b.problems.append(f"{len(snap['segments']) - len(segs)} segment(s) were not records and were skipped")
    traces = snap.get("device_traces")
    if isinstance(traces, list):
        b.has_traces = any(isinstance(t, list) and t for t in traces)
        for dev, entries in enumerate(traces):
            if not isinstance(entries, list):
                continue
            b.trace_entries += len(entries)
            for e in entries:
                if isinstance(e, dict) and e.get("action") == "oom":
                    free = e.get("device_free")
                    phase, where = _phase(e.get("frames"))
                    b.ooms.append(OomEvent(dev, _int(e.get("size")), _int(free) if free is not None else None,
                                           format_frames(e.get("frames")), phase, where))
    devices = sorted({_int(s.get("device")) for s in segs})
    b.devices = tuple(devices)
    if device is None and devices:
        oom_devs = [o.device for o in b.ooms if o.device in devices]
        device = oom_devs[-1] if oom_devs else max(
            devices, key=lambda d: sum(_int(s.get("total_size")) for s in segs if _int(s.get("device")) == d))
    b.device = device
    if len(devices) > 1:
        b.problems.append(f"the snapshot covers devices {devices}; the breakdown is for device {device}")
    b.ooms = [o for o in b.ooms if not devices or o.device == device]
    blocks: list[BlockInfo] = []
    for seg in segs:
        if devices and _int(seg.get("device")) != device:
            continue
        b.segments += 1
        total = _int(seg.get("total_size"))
        b.reserved_bytes += total
        pool = _pool(seg)
        if pool:
            b.private_pools_bytes += total
        free = largest = nfree = 0
        for blk in seg.get("blocks") or ():
            if not isinstance(blk, dict):
                continue
            size = _int(blk.get("size"))
            state = str(blk.get("state", ""))
            frames = block_frames(blk)
            if state == "inactive":
                free += size
                nfree += 1
                largest = max(largest, size)
                continue
            if state == "active_awaiting_free":
                b.awaiting_free_bytes += size
            b.allocated_bytes += size
            kind = classify(frames)
            if frames:
                b.blocks_with_stack += 1
            if kind == "weights":
                b.weights_bytes += size
            elif kind == "activations":
                b.activations_bytes += size
            else:
                b.other_bytes += size
            blocks.append(BlockInfo(size, _int(blk.get("requested_size")) or size, state, kind,
                                    format_frames(frames), pool))
        b.inactive_bytes += free
        b.inactive_blocks += nfree
        if free and free == total:
            b.free_segments_bytes += free
            b.free_segments += 1
        else:
            b.inactive_split_bytes += free
        state = ("expandable" if seg.get("is_expandable") is True else "free" if free and free == total
                 else "split" if free else "live")
        b.segment_rows.append({"device": _int(seg.get("device")), "segment": f"{_int(seg.get('address')):#x}",
                               "size_bytes": total, "live_bytes": total - free, "free_bytes": free,
                               "largest_free_bytes": largest, "pool": pool or "default", "state": state})
        b.largest_free_block_bytes = max(b.largest_free_block_bytes, largest)
        if free:
            b.fragmented_segments.append(SegmentFrag(_int(seg.get("address")), total, free, largest, nfree))
    b.private_pools = len({_pool(s) for s in segs if _pool(s)
                           and (not devices or _int(s.get("device")) == device)})
    b.top_blocks = sorted(blocks, key=lambda x: -x.size)[:TOP_BLOCKS]
    if isinstance(traces, list) and device is not None and device < len(traces) and isinstance(traces[device], list) \
            and traces[device]:
        b.trace = trace_stats(traces[device], b.allocated_bytes, b.reserved_bytes)
    b.fragmented_segments.sort(key=lambda s: (-s.free_bytes, s.address))
    # blocks missing from the segment list (a snapshot cut short) show as a gap
    seg_sum = b.allocated_bytes + b.inactive_bytes
    if seg_sum and seg_sum != b.reserved_bytes:
        b.problems.append(f"block sizes add up to {seg_sum} bytes but segments to {b.reserved_bytes}")
    return b


def load_breakdown(path: str) -> Breakdown:
    """Read a snapshot file safely and return its breakdown (``SnapshotError`` when it cannot)."""
    return breakdown(read_snapshot_file(path))


def top_block_records(blocks: Iterable[BlockInfo]) -> list[dict[str, Any]]:
    """JSON-ready records of the largest blocks."""
    return [{"size_bytes": b.size, "requested_bytes": b.requested, "state": b.state, "kind": b.kind,
             "pool": b.segment_pool or "default", "stack": list(b.stack)} for b in blocks]
