"""Nsight Systems SQLite exports (``nsys export --type sqlite``): a read-only reader and pure folds.

``read_export(path)`` opens the export read-only and immutable (``file:…?mode=ro&immutable=1``),
aggregates inside SQLite and returns one frozen ``NsysTrace``; nothing is written to the file,
scratch goes to SQLite's TEMP database. ``export_report(rep)`` turns a ``.nsys-rep`` into an
export with ``nsys export`` when nsys is on PATH.

Schema drift tolerated (nsys 2022.2 … 2026.2, export schema 2.9 … 3.25):

* lazy exports create a table only when something of its kind was recorded; non-lazy ones
  (``EXPORT_LAZY=false``) create every table, mostly empty. "Not traced" and "traced but empty"
  are told apart with the rows, the capture settings (``META_DATA_CAPTURE``) and nsys's own
  diagnostics (``DIAGNOSTIC_EVENT``).
* export metadata in ``EXPORT_META_DATA`` (≤ 2022.4) or ``META_DATA_EXPORT`` (later).
* ``ENUM_*`` tables exist from schema 3.0 only; the numbering they document (copy kinds
  1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP, 11-13 unified memory; memory kinds 0 pageable, 1 pinned,
  2 device, 3 array, 4 managed, 5/6 static, 7 unknown) is the one older exports use as well.
* ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION.syncType``: before the 2025 exports (no
  ``deprecatedSyncType`` column) 1 = context/device, 2 = event, 3 = stream sync; from then on
  CUPTI's numbering: 1 = event, 2 = stream-wait-event, 3 = stream, 4 = context sync.
* NVTX names inline (``NVTX_EVENTS.text``) or registered (``textId`` → ``StringIds``); marks,
  domain creations and thread names have ``end`` NULL and are not ranges.
* text that is not UTF-8 (seen in ``TARGET_INFO_SYSTEM_ENV`` of 2022 exports) is decoded with
  replacement characters instead of failing.
* ``globalTid``/``globalPid`` pack the ids: pid = (g >> 24) & 0xFFFFFF, tid = g & 0xFFFFFF.

Secrets: an export holds the profiled process's environment (``META_DATA_CAPTURE``,
``TARGET_INFO_SYSTEM_ENV``), command lines and paths (export metadata, ``StringIds``). This module
reads none of those values: only the names of trace settings, API names matched by prefix,
the kernel / NVTX names it reports, and nsys diagnostics about CUDA (returned for redaction).

Speed: every aggregate is pushed into SQLite. The GPU timeline (kernels, copies, memsets) is the
one pass that needs order: the union of busy intervals and the idle gaps are folded over rows
sorted by start. nsys writes those tables in start order, so the pass streams them in storage
order (no sort) and merges them chunk by chunk with numpy, checking the order as it goes; a table
found out of order is re-read with ``ORDER BY start``. Memory stays bounded by the chunk size.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from diagnose.model import Availability

SQLITE_MAGIC = b"SQLite format 3\x00"
REP_SUFFIXES = (".nsys-rep", ".qdrep")

NS_PER_US = 1_000
TINY_KERNEL_NS = 10_000  # a kernel under 10 µs is shorter than its own launch path on the host
SMALL_COPY_BYTES = 64 * 1024  # under 64 KiB a copy is latency-bound, not bandwidth-bound
# idle-gap histogram edges (ns): launch latency, short host work, a Python step, a real stall
GAP_EDGES_NS = (10_000, 100_000, 1_000_000, 10_000_000)
GAP_BUCKETS = ("<10us", "10us-100us", "100us-1ms", "1ms-10ms", ">=10ms")
CHUNK_ROWS = 65_536
MAX_STAGES = 10
MAX_STAGE_RANGES = 200_000

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
SYNC = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
NVTX = "NVTX_EVENTS"

# CUDA copy kinds (ENUM_CUDA_MEMCPY_OPER; CUPTI's numbering)
COPY_DIRECTION = {
    1: "h2d", 2: "d2h", 3: "h2a", 4: "a2h", 5: "a2a", 6: "a2d", 7: "d2a", 8: "d2d", 9: "h2h", 10: "p2p",
    11: "uvm_h2d", 12: "uvm_d2h", 13: "uvm_d2d",
}
# memory kinds (ENUM_CUDA_MEM_KIND)
MEM_KIND = {0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed", 5: "device_static",
            6: "managed_static", 7: "unknown"}
HOST_SIDE = {"h2d": "src", "h2a": "src", "d2h": "dst", "a2h": "dst"}  # which end of the copy is host memory

_API_SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")
LAUNCH_APIS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernelEx", "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernelMultiDevice", "cudaLaunch", "cuLaunchKernel", "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel", "cuLaunchGrid", "cuLaunchGridAsync",
    # ROCm's, as a PyTorch profiler (trace or table) on AMD names them
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
    "hipLaunchCooperativeKernel", "hipExtLaunchMultiKernelMultiDevice",
})
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
# host calls that block until the device catches up (the same set the `nsys stats` reader counts)
SYNC_APIS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
})
_SYNC_COPY = re.compile(r"^cu(da)?Memcpy(?!.*Async)")
_ASYNC_COPY = re.compile(r"^cu(da)?Memcpy.*Async")

# temp-table classes of the API calls kept for joins
CLS_SYNC, CLS_COPY_SYNC, CLS_COPY_ASYNC = 1, 2, 3
API_UNKNOWN, API_SYNC, API_ASYNC = 2, 0, 1

PID_BITS = 24
PID_MASK = (1 << PID_BITS) - 1


class NsysError(Exception):
    """The file is not a readable Nsight Systems export (the message says why)."""


# -- small pure helpers ------------------------------------------------------------------------


def pid_of(global_id: int) -> int:
    """The process id packed in an nsys ``globalTid``/``globalPid``."""
    return (int(global_id) >> PID_BITS) & PID_MASK


def tid_of(global_tid: int) -> int:
    """The thread id packed in an nsys ``globalTid``."""
    return int(global_tid) & PID_MASK


def api_base(name: str) -> str:
    """``cudaLaunchKernel_v7000`` → ``cudaLaunchKernel``; ``cudaMemcpyAsync_ptsz`` → ``cudaMemcpyAsync``."""
    return _API_SUFFIX.sub("", name, count=1)


def api_class(name: str) -> str:
    """launch | graph_launch | sync | copy_sync | copy_async | other, from a CUDA API name."""
    base = api_base(name)
    if base in LAUNCH_APIS:
        return "launch"
    if base in GRAPH_LAUNCH_APIS:
        return "graph_launch"
    if base in SYNC_APIS:
        return "sync"
    if _ASYNC_COPY.match(base):
        return "copy_async"
    if _SYNC_COPY.match(base):
        return "copy_sync"
    return "other"


def sync_type_name(value: int, cupti_numbering: bool) -> str:
    """The kind of a ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` row (see the module docstring)."""
    if cupti_numbering:
        return {1: "event", 2: "stream_wait_event", 3: "stream", 4: "context"}.get(value, "unknown")
    # before 2025 nsys wrote its own numbering (cudaDeviceSynchronize=1, cudaEventSynchronize=2,
    # cudaStreamSynchronize=3, checked against the calls they correlate with); 4 is inferred
    return {1: "context", 2: "event", 3: "stream", 4: "stream_wait_event"}.get(value, "unknown")


def copy_host_kind(copy_kind: int, src_kind: int, dst_kind: int) -> str:
    """pageable | pinned | managed | … : the kind of the host memory a copy reads or writes."""
    direction = COPY_DIRECTION.get(copy_kind, "other")
    side = HOST_SIDE.get(direction)
    if side is None:
        return "managed" if direction.startswith("uvm") else "device"
    return MEM_KIND.get(src_kind if side == "src" else dst_kind, "unknown")


_DIGITS = re.compile(r"\d+")


def stage_name(text: str, limit: int = 120) -> str:
    """An NVTX range name as a stage: digit runs folded (``layer.3``, ``op_id = 17`` → ``#``), capped."""
    name = _DIGITS.sub("#", " ".join(text.split()))
    return name if len(name) <= limit else name[: limit - 1] + "…"


def union_intervals(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted disjoint union of [start, end) intervals (used for the few NVTX stage ranges)."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


class StageCover:
    """Several stages' coverage (each a set of disjoint intervals) as one elementary partition.

    ``index(t)`` places times in the partition; ``overlaps`` turns per-slot counts and offsets
    accumulated over many segments into each stage's covered time of those segments. For a
    stage j, covered time up to t is ``P[i, j] + (t - B[i]) * A[i, j]`` with i = index(t); the
    sum over segments [a, b) is linear in per-slot counts and offsets, so chunks only bincount.
    """

    def __init__(self, stages: Sequence[Sequence[tuple[int, int]]]) -> None:
        self.n = len(stages)
        bounds = sorted({t for iv in stages for ab in iv for t in ab})
        self.bounds = np.array(bounds, dtype=np.int64)
        m = len(bounds)
        active = np.zeros((m + 1, self.n), dtype=np.int64)  # row i+1: segment [B[i], B[i+1])
        for j, iv in enumerate(stages):
            if not iv:
                continue
            lo = np.searchsorted(self.bounds, [a for a, _ in iv])
            hi = np.searchsorted(self.bounds, [b for _, b in iv])
            delta = np.zeros(m + 1, dtype=np.int64)
            np.add.at(delta, lo, 1)
            np.add.at(delta, hi, -1)
            active[1:, j] = (np.cumsum(delta)[:m] > 0).astype(np.int64)
        seg = np.zeros(m + 1, dtype=np.int64)
        if m > 1:
            seg[1:m] = np.diff(self.bounds)
        self.active = active
        self.prefix = np.vstack([np.zeros((1, self.n), dtype=np.int64), np.cumsum(active * seg[:, None], axis=0)])[:-1]
        self.left = np.concatenate(([0], self.bounds)) if m else np.zeros(1, dtype=np.int64)
        self.slots = m + 1

    def index(self, t: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.bounds, t, side="right")

    def accumulate(self, a: np.ndarray, b: np.ndarray, cnt: np.ndarray, off: np.ndarray) -> None:
        """Add segments [a, b) to the per-slot counts and offsets ``cnt``/``off`` (in place)."""
        ia, ib = self.index(a), self.index(b)
        cnt += np.bincount(ib, minlength=self.slots) - np.bincount(ia, minlength=self.slots)
        off += (np.bincount(ib, weights=b - self.left[ib], minlength=self.slots)
                - np.bincount(ia, weights=a - self.left[ia], minlength=self.slots))

    def overlaps(self, cnt: np.ndarray, off: np.ndarray) -> list[int]:
        if not self.n:
            return []
        return [round(v) for v in (cnt @ self.prefix + off @ self.active).tolist()]


# -- the timeline fold -----------------------------------------------------------------------


@dataclass
class TimelineFold:
    """Busy-interval union and idle gaps of one device, fed chunks of rows sorted by start.

    ``feed`` is pure numpy over the chunk plus a carried running maximum of ends: the union of
    [start, end) intervals sorted by start adds, for each row, the segment
    [max(start, prev_max_end), max(end, prev_max_end)); a gap precedes a row whose start is past
    every earlier end.
    """

    first_ns: int | None = None
    max_end: int | None = None
    busy_ns: int = 0
    kernel_max_end: int | None = None
    kernel_busy_ns: int = 0
    gap_count: int = 0
    gap_total_ns: int = 0
    gap_longest_ns: int = 0
    hist_count: list[int] = field(default_factory=lambda: [0] * len(GAP_BUCKETS))
    hist_ns: list[int] = field(default_factory=lambda: [0] * len(GAP_BUCKETS))
    stage_cnt: np.ndarray | None = None
    stage_off: np.ndarray | None = None

    def feed(self, s: np.ndarray, e: np.ndarray, is_kernel: np.ndarray, stages: StageCover | None = None) -> None:
        if not len(s):
            return
        e = np.maximum(e, s)  # a malformed row (end < start) covers nothing
        cm = np.maximum.accumulate(e)
        prev = np.empty_like(cm)
        if self.max_end is None:
            self.first_ns = int(s[0])
            prev[0] = s[0]
        else:
            cm = np.maximum(cm, self.max_end)
            prev[0] = self.max_end
        prev[1:] = cm[:-1]
        self.max_end = int(cm[-1])
        gap = s - prev
        g = gap[gap > 0]
        if len(g):
            self.gap_count += len(g)
            self.gap_total_ns += int(g.sum())
            self.gap_longest_ns = max(self.gap_longest_ns, int(g.max()))
            idx = np.searchsorted(np.asarray(GAP_EDGES_NS), g, side="right")
            counts = np.bincount(idx, minlength=len(GAP_BUCKETS))
            times = np.bincount(idx, weights=g, minlength=len(GAP_BUCKETS))
            for i in range(len(GAP_BUCKETS)):
                self.hist_count[i] += int(counts[i])
                self.hist_ns[i] += int(times[i])
        seg_a = np.maximum(s, prev)
        seg_b = np.maximum(e, prev)
        self.busy_ns += int((seg_b - seg_a).sum())
        if stages is not None and stages.n:
            if self.stage_cnt is None or self.stage_off is None:
                self.stage_cnt = np.zeros(stages.slots, dtype=np.int64)
                self.stage_off = np.zeros(stages.slots, dtype=np.float64)
            keep = seg_b > seg_a
            stages.accumulate(seg_a[keep], seg_b[keep], self.stage_cnt, self.stage_off)
        ks, ke = s[is_kernel], e[is_kernel]
        if len(ks):
            kcm = np.maximum.accumulate(ke)
            kprev = np.empty_like(kcm)
            if self.kernel_max_end is None:
                kprev[0] = ks[0]
            else:
                kcm = np.maximum(kcm, self.kernel_max_end)
                kprev[0] = self.kernel_max_end
            kprev[1:] = kcm[:-1]
            self.kernel_max_end = int(kcm[-1])
            self.kernel_busy_ns += int((np.maximum(ke, kprev) - np.maximum(ks, kprev)).sum())

    @property
    def window_ns(self) -> int:
        if self.first_ns is None or self.max_end is None:
            return 0
        return self.max_end - self.first_ns

    def stage_busy(self, stages: StageCover) -> list[int]:
        """Busy time of this device inside each stage's ranges."""
        if self.stage_cnt is None or self.stage_off is None:
            return [0] * stages.n
        return stages.overlaps(self.stage_cnt.astype(np.float64), self.stage_off)


# -- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportInfo:
    nsys_version: str = ""
    schema_version: str = ""
    lazy: bool | None = None  # None: not recorded
    tables: frozenset[str] = frozenset()
    capture_ns: int = 0  # ANALYSIS_DETAILS.duration (the whole capture, not the GPU window)


@dataclass(frozen=True)
class GapStats:
    count: int = 0
    total_ns: int = 0
    longest_ns: int = 0
    hist_count: tuple[int, ...] = (0,) * len(GAP_BUCKETS)
    hist_ns: tuple[int, ...] = (0,) * len(GAP_BUCKETS)


@dataclass(frozen=True)
class DeviceStats:
    device: int
    name: str
    pids: tuple[int, ...]
    first_ns: int
    last_ns: int
    busy_ns: int  # union of kernel, copy and memset intervals
    kernel_busy_ns: int  # union of kernel intervals only
    gaps: GapStats
    kernel_count: int
    kernel_ns: int  # sum of kernel durations
    tiny_kernels: int
    copy_count: int
    copy_ns: int
    memset_count: int
    memset_ns: int

    @property
    def window_ns(self) -> int:
        return max(0, self.last_ns - self.first_ns)


@dataclass(frozen=True)
class KernelStat:
    name: str
    count: int
    total_ns: int
    tiny_count: int
    devices: tuple[int, ...]


@dataclass(frozen=True)
class CopyGroup:
    """Copies of one device, process, direction, host-memory kind and API flavour."""

    device: int
    pid: int
    direction: str  # h2d, d2h, d2d, p2p, uvm_h2d, …
    host_kind: str  # pageable, pinned, managed, device, …
    api: str  # sync | async | unknown (the CUDA call that issued it)
    count: int
    bytes: int
    ns: int
    small_count: int
    small_ns: int


@dataclass(frozen=True)
class ThreadSync:
    pid: int
    tid: int
    sync_calls: int
    sync_ns: int
    wall_ns: int  # first to last CUDA call of the thread (measured for the most blocked thread only; 0 else)


@dataclass(frozen=True)
class ApiStats:
    calls: int = 0  # rows of the runtime table (by rowid span: counting them would cost a scan)
    first_ns: int = 0  # first and last call in storage order (nsys writes them in time order)
    last_ns: int = 0
    launch_calls: int = 0
    launch_ns: int = 0
    graph_launches: int = 0
    graph_launch_ns: int = 0
    sync_calls: int = 0
    sync_ns: int = 0  # sync APIs + synchronous memcpy calls
    memcpy_calls: int = 0
    memcpy_sync_calls: int = 0
    memcpy_sync_ns: int = 0
    sync_by_call: tuple[tuple[str, int, int], ...] = ()  # (api, calls, ns)
    threads: tuple[ThreadSync, ...] = ()  # threads that synchronise, most blocked first


@dataclass(frozen=True)
class NvtxStage:
    name: str
    ranges: int
    range_ns: int  # sum of range durations
    covered_ns: int  # union of the ranges (nested/overlapping ones counted once)
    in_window_ns: int  # the part of that union inside the GPU-active window (first to last GPU operation)
    gpu_busy_ns: int  # GPU busy time while a range of this stage was open (mean over devices)
    pids: tuple[int, ...]


@dataclass(frozen=True)
class NsysTrace:
    info: ExportInfo
    cuda_traced: bool | None  # None: cannot tell
    nvtx_traced: bool | None
    devices: tuple[DeviceStats, ...] = ()
    kernels: tuple[KernelStat, ...] = ()  # by total time, top first
    kernel_names: int = 0
    copies: tuple[CopyGroup, ...] = ()
    api: ApiStats | None = None
    sync_events: tuple[tuple[str, int, int], ...] = ()  # (type, count, ns) from SYNCHRONIZATION
    stages: tuple[NvtxStage, ...] = ()
    stage_min_ns: int = 0  # NVTX ranges shorter than this were not considered stages
    notes: tuple[str, ...] = ()  # nsys's own warnings about the CUDA/NVTX trace (unredacted)
    problems: tuple[str, ...] = ()  # why the evidence is partial

    @property
    def has_gpu_activity(self) -> bool:
        return any(d.kernel_count or d.copy_count or d.memset_count for d in self.devices)


# -- reading ---------------------------------------------------------------------------------


def is_sqlite(head: bytes) -> bool:
    return head.startswith(SQLITE_MAGIC)


def probe_nsys() -> Availability:
    """Whether ``nsys`` is on PATH (needed only to turn a ``.nsys-rep`` into SQLite)."""
    if shutil.which("nsys"):
        return Availability(True)
    return Availability(
        False,
        "nsys is not on PATH, so a .nsys-rep report cannot be exported to SQLite here",
        "run `nsys export --type sqlite -o report.sqlite report.nsys-rep` where Nsight Systems is "
        "installed and pass the .sqlite file",
    )


def export_report(rep_path: str, out_dir: str, timeout_s: float = 600.0) -> str:
    """``nsys export --type sqlite`` of a ``.nsys-rep`` into ``out_dir``; the SQLite path."""
    nsys = shutil.which("nsys")
    if not nsys:
        raise NsysError(probe_nsys().reason)
    out = os.path.join(out_dir, Path(rep_path).stem + ".sqlite")
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output", out, rep_path]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise NsysError(f"`nsys export` did not finish within {timeout_s:.0f} s") from exc
    if proc.returncode != 0 or not os.path.exists(out):
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise NsysError(f"`nsys export --type sqlite` failed (exit {proc.returncode}): {tail[0][:200]}")
    return out


def _connect(path: str) -> sqlite3.Connection:
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    try:
        con = sqlite3.connect(uri, uri=True)
        con.text_factory = lambda b: b.decode("utf-8", "replace")
        con.execute("SELECT name FROM sqlite_master LIMIT 1").fetchall()
    except sqlite3.Error as exc:
        raise NsysError(f"not a readable SQLite database ({exc})") from exc
    # scratch (the API-call join table) lives in TEMP; a modest cache bounds memory
    con.execute("PRAGMA temp_store = FILE")
    con.execute("PRAGMA cache_size = -8192")
    return con


class _Db:
    """The open export: which tables and columns exist, and small query helpers."""

    def __init__(self, con: sqlite3.Connection) -> None:
        self.con = con
        self.tables = frozenset(r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'"))
        self._cols: dict[str, frozenset[str]] = {}

    def cols(self, table: str) -> frozenset[str]:
        if table not in self._cols:
            self._cols[table] = (
                frozenset(r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")'))
                if table in self.tables else frozenset()
            )
        return self._cols[table]

    def has_rows(self, table: str) -> bool:
        return table in self.tables and self.con.execute(f'SELECT 1 FROM "{table}" LIMIT 1').fetchone() is not None

    def col(self, table: str, name: str, default: str = "NULL", alias: str = "") -> str:
        prefix = f"{alias}." if alias else ""
        return f'{prefix}"{name}"' if name in self.cols(table) else default

    def one(self, sql: str, params: Sequence[object] = ()) -> tuple[object, ...]:
        row = self.con.execute(sql, params).fetchone()
        return tuple(row) if row else ()


def _meta(db: _Db) -> ExportInfo:
    table = "META_DATA_EXPORT" if "META_DATA_EXPORT" in db.tables else "EXPORT_META_DATA"
    values: dict[str, str] = {}
    if table in db.tables:
        wanted = ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION", "EXPORT_LAZY", "EXPORT_PARAM_LAZY")
        marks = ",".join("?" * len(wanted))
        for name, value in db.con.execute(f"SELECT name, value FROM {table} WHERE name IN ({marks})", wanted):
            values[str(name)] = str(value or "")
    lazy_s = values.get("EXPORT_PARAM_LAZY") or values.get("EXPORT_LAZY")
    capture = 0
    if "ANALYSIS_DETAILS" in db.tables:
        row = db.one("SELECT MAX(duration) FROM ANALYSIS_DETAILS")
        capture = int(row[0]) if row and isinstance(row[0], int) else 0
    return ExportInfo(
        nsys_version=values.get("EXPORT_PRODUCT_VERSION", ""),
        schema_version=values.get("EXPORT_SCHEMA_VERSION", ""),
        lazy=None if lazy_s is None else lazy_s.lower() == "true",
        tables=db.tables,
        capture_ns=capture,
    )


def _capture_flag(db: _Db, setting: str) -> bool | None:
    """Whether any process of the capture had ``…COLLECT_<setting>`` on (None: not recorded)."""
    if "META_DATA_CAPTURE" not in db.tables:
        return None
    vals = [str(v).lower() for (v,) in db.con.execute(
        "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE ?", (f"%COLLECT_{setting}",))]
    if not vals:
        return None
    return "true" in vals


_DIAG_KEEP = re.compile(r"CUDA|CUPTI|NVTX|events? (were|was|might|may)|dropped|lost|buffer", re.IGNORECASE)


def _diagnostics(db: _Db) -> list[str]:
    """nsys's warnings and errors about what it could trace (severity ≥ 2), first line each."""
    if "DIAGNOSTIC_EVENT" not in db.tables or "text" not in db.cols("DIAGNOSTIC_EVENT"):
        return []
    out: list[str] = []
    for (text,) in db.con.execute("SELECT text FROM DIAGNOSTIC_EVENT WHERE severity >= 2 LIMIT 200"):
        line = str(text or "").strip().splitlines()[0] if text else ""
        if line and _DIAG_KEEP.search(line) and line not in out:
            out.append(line[:240])
    return out[:8]


def _diag_mentions(db: _Db, pattern: str) -> bool:
    if "DIAGNOSTIC_EVENT" not in db.tables or "text" not in db.cols("DIAGNOSTIC_EVENT"):
        return False
    return db.con.execute("SELECT 1 FROM DIAGNOSTIC_EVENT WHERE text LIKE ? LIMIT 1", (pattern,)).fetchone() is not None


def _api_names(db: _Db) -> dict[int, str]:
    """StringIds of CUDA API names (matched by prefix: no other string is read)."""
    if "StringIds" not in db.tables:
        return {}
    rows = db.con.execute("SELECT id, value FROM StringIds WHERE value GLOB 'cu[A-Z]*' OR value GLOB 'cuda[A-Z]*'")
    return {int(i): str(v) for i, v in rows if isinstance(i, int)}


def _ints(row: Sequence[object], n: int) -> list[int]:
    """The first ``n`` values of a result row as ints (NULL and missing → 0)."""
    vals = [int(x) if isinstance(x, int) else 0 for x in row[:n]]
    return vals + [0] * (n - len(vals))


def _in_list(ids: Iterable[int]) -> str:
    vals = sorted(set(ids))
    return ",".join(str(int(v)) for v in vals) if vals else "NULL"


def _read_api(db: _Db, names: dict[int, str]) -> ApiStats | None:
    if not db.has_rows(RUNTIME):
        return None
    classes: dict[str, set[int]] = {}
    for i, n in names.items():
        classes.setdefault(api_class(n), set()).add(i)
    launch = _in_list(classes.get("launch", ()))
    graph = _in_list(classes.get("graph_launch", ()))
    sync = _in_list(classes.get("sync", ()))
    copy_sync = _in_list(classes.get("copy_sync", ()))
    copy_async = _in_list(classes.get("copy_async", ()))
    con = db.con
    # scan 1: the calls the other passes join against (synchronising calls and every memcpy call)
    con.execute("DROP TABLE IF EXISTS temp.nsys_calls")
    con.execute(
        "CREATE TEMP TABLE nsys_calls (k INTEGER PRIMARY KEY, cls INTEGER, gtid INTEGER, name INTEGER, dur INTEGER)"
    )
    corr = db.col(RUNTIME, "correlationId", "0")
    gtid = db.col(RUNTIME, "globalTid", "0")
    con.execute(
        f"""INSERT OR IGNORE INTO temp.nsys_calls
            SELECT COALESCE({corr}, -1 - rowid) * {1 << PID_BITS} + (({gtid} >> {PID_BITS}) & {PID_MASK}),
                   CASE WHEN nameId IN ({sync}) THEN {CLS_SYNC}
                        WHEN nameId IN ({copy_sync}) THEN {CLS_COPY_SYNC} ELSE {CLS_COPY_ASYNC} END,
                   {gtid}, nameId, "end" - start
            FROM {RUNTIME} WHERE nameId IN ({sync},{copy_sync},{copy_async})"""
    )
    by_thread = con.execute(
        f"SELECT gtid, COUNT(*), SUM(dur) FROM temp.nsys_calls WHERE cls IN ({CLS_SYNC},{CLS_COPY_SYNC}) "
        "GROUP BY gtid ORDER BY 3 DESC LIMIT 4"
    ).fetchall()
    by_name: dict[str, list[int]] = {}
    for name_id, n, ns in con.execute(
        f"SELECT name, COUNT(*), SUM(dur) FROM temp.nsys_calls WHERE cls IN ({CLS_SYNC},{CLS_COPY_SYNC}) GROUP BY name"
    ):
        acc = by_name.setdefault(api_base(names.get(int(name_id), "?")), [0, 0])
        acc[0] += int(n)
        acc[1] += int(ns or 0)
    sums = db.one(
        "SELECT " + ", ".join(f"SUM(cls = {c}), SUM(CASE WHEN cls = {c} THEN dur END)"
                              for c in (CLS_SYNC, CLS_COPY_SYNC, CLS_COPY_ASYNC)) + " FROM temp.nsys_calls"
    )
    sv = [int(x) if isinstance(x, int) else 0 for x in sums]
    per_cls = {CLS_SYNC: sv[0:2], CLS_COPY_SYNC: sv[2:4], CLS_COPY_ASYNC: sv[4:6]}
    # scan 2: launch calls (the class tests run on the launch rows only). The wall of the thread that
    # blocks most is its first to last call; rows are stored in start order, so searching from either
    # end of the table finds them without a scan.
    graph_cols = (f', SUM(nameId IN ({graph})), SUM(CASE WHEN nameId IN ({graph}) THEN "end" - start END)'
                  if classes.get("graph_launch") else ", 0, 0")
    lau = _ints(db.one(f'SELECT COUNT(*), SUM("end" - start){graph_cols} FROM {RUNTIME} '
                       f"WHERE nameId IN ({launch},{graph})"), 4)
    top = int(by_thread[0][0]) if by_thread else None
    wall = [0, 0]
    if top is not None:
        wall[0] = _ints(db.one(f"SELECT start FROM {RUNTIME} WHERE {gtid} = ? ORDER BY rowid LIMIT 1", (top,)), 1)[0]
        wall[1] = _ints(db.one(f'SELECT "end" FROM {RUNTIME} WHERE {gtid} = ? ORDER BY rowid DESC LIMIT 1',
                               (top,)), 1)[0]
    first = _ints(db.one(f"SELECT rowid, start FROM {RUNTIME} ORDER BY rowid LIMIT 1"), 2)
    last = _ints(db.one(f'SELECT rowid, "end" FROM {RUNTIME} ORDER BY rowid DESC LIMIT 1'), 2)
    threads = [
        ThreadSync(pid_of(t), tid_of(t), int(n), int(ns or 0), max(0, wall[1] - wall[0]) if i == 0 else 0)
        for i, (t, n, ns) in enumerate(by_thread)
    ]
    sync_c, copy_sync_c, copy_async_c = (per_cls[k] for k in (CLS_SYNC, CLS_COPY_SYNC, CLS_COPY_ASYNC))
    return ApiStats(
        calls=max(0, last[0] - first[0] + 1), first_ns=first[1], last_ns=last[1],
        launch_calls=lau[0] - lau[2], launch_ns=lau[1] - lau[3],
        graph_launches=lau[2], graph_launch_ns=lau[3], sync_calls=sync_c[0] + copy_sync_c[0],
        sync_ns=sync_c[1] + copy_sync_c[1], memcpy_calls=copy_sync_c[0] + copy_async_c[0],
        memcpy_sync_calls=copy_sync_c[0], memcpy_sync_ns=copy_sync_c[1],
        sync_by_call=tuple(sorted(((k, a[0], a[1]) for k, a in by_name.items()), key=lambda x: -x[2])),
        threads=tuple(threads),
    )


def _read_sync_events(db: _Db) -> tuple[tuple[str, int, int], ...]:
    if not db.has_rows(SYNC) or "syncType" not in db.cols(SYNC):
        return ()
    cupti = "deprecatedSyncType" in db.cols(SYNC)
    acc: dict[str, list[int]] = {}
    for st, n, ns in db.con.execute(f'SELECT syncType, COUNT(*), SUM("end" - start) FROM {SYNC} GROUP BY syncType'):
        a = acc.setdefault(sync_type_name(int(st or 0), cupti), [0, 0])
        a[0] += int(n)
        a[1] += int(ns or 0)
    return tuple(sorted(((k, a[0], a[1]) for k, a in acc.items()), key=lambda x: -x[2]))


def _nvtx_range_types(db: _Db) -> tuple[int, ...]:
    if "ENUM_NSYS_EVENT_TYPE" in db.tables and {"id", "name"} <= db.cols("ENUM_NSYS_EVENT_TYPE"):
        ids = [int(i) for (i,) in db.con.execute(
            "SELECT id FROM ENUM_NSYS_EVENT_TYPE WHERE name IN ('NvtxPushPopRange','NvtxStartEndRange',"
            "'NVTX_PUSHPOP_RANGE','NVTX_STARTEND_RANGE')")]
        if ids:
            return tuple(ids)
    return (59, 60)  # NvtxPushPopRange, NvtxStartEndRange in every schema seen


def _read_stages(
    db: _Db, span_ns: int, name_filter: Callable[[str], str] = str
) -> tuple[list[tuple[str, list[tuple[int, int, int]]]], int, bool]:
    """NVTX ranges long enough to be stages, grouped by folded name: [(name, [(pid, s, e)])]."""
    if not db.has_rows(NVTX):
        return [], 0, False
    min_ns = max(100 * NS_PER_US, span_ns // 2000)
    cols = db.cols(NVTX)
    text = 'n."text"' if "text" in cols else "NULL"
    joined = "StringIds" in db.tables and "textId" in cols
    name = f"COALESCE({text}, s.value)" if joined else text
    join = "LEFT JOIN StringIds s ON s.id = n.textId" if joined else ""
    types = ",".join(str(t) for t in _nvtx_range_types(db))
    gtid = 'n."globalTid"' if "globalTid" in cols else "0"
    rows = db.con.execute(
        f"""SELECT {name}, {gtid}, n.start, n."end" FROM {NVTX} n {join}
            WHERE n."end" IS NOT NULL AND n."end" - n.start >= ? AND n.eventType IN ({types})
            LIMIT {MAX_STAGE_RANGES + 1}""",
        (min_ns,),
    )
    by_name: dict[str, list[tuple[int, int, int]]] = {}
    capped = False
    for i, (txt, g, s, e) in enumerate(rows):
        if i >= MAX_STAGE_RANGES:
            capped = True
            break
        name = stage_name(name_filter(str(txt or "(unnamed)")))
        by_name.setdefault(name, []).append((pid_of(g or 0), int(s), int(e)))
    ranked = sorted(by_name.items(), key=lambda kv: -sum(e - s for _, s, e in kv[1]))
    return ranked[:MAX_STAGES], min_ns, capped


class _Unsorted(Exception):
    pass


# columns of a GPU activity row once in numpy
C_DEV, C_START, C_END, C_CODE, C_BYTES, C_KIND = range(6)
K_KERNEL, K_COPY, K_MEMSET = 0, 1, 2


DEV_BITS = 8  # device ids are packed into the low bits of a row's code (nsys device ids are small)


@dataclass(frozen=True)
class _Spec:
    """How to read one GPU activity table: SQL for (start, duration, code << 8 | device[, bytes]).

    Durations and packed codes keep the transported text short; that text is most of the cost.
    """

    kind: int
    table: str
    alias: str
    exprs: tuple[str, ...]
    join: str = ""


class _Stream:
    """One GPU activity table read in chunks of rows, as numpy columns, checked to be in start order.

    In storage order (``ordered=False``) a chunk is one statement over a rowid range that returns
    each column as a ``group_concat`` string, parsed by numpy: no Python object per row. With
    ``ordered=True`` (the fallback for a table found out of order) rows come from
    ``ORDER BY start`` through a cursor.
    """

    def __init__(self, con: sqlite3.Connection, spec: _Spec, ordered: bool) -> None:
        self.con = con
        self.spec = spec
        self.ordered = ordered
        self.buf = np.zeros((0, 6), dtype=np.int64)
        self.pos = 0
        self.done = False
        self.last_rowid = -(1 << 62)
        self.last_start: int | None = None
        a = spec.alias
        self.ncols = len(spec.exprs)
        cols = ", ".join(f"COALESCE({e}, 0) AS c{i}" for i, e in enumerate(spec.exprs))
        base = f"FROM {spec.table} {a} {spec.join}"
        if ordered:
            self.cur: sqlite3.Cursor | None = con.execute(f"SELECT {cols} {base} ORDER BY {a}.start")
            self.sql = ""
        else:
            self.cur = None
            concat = ", ".join(f"group_concat(c{i})" for i in range(self.ncols))
            self.sql = (f"SELECT MAX(r), COUNT(*), {concat} FROM (SELECT {a}.rowid AS r, {cols} {base} "
                        f"WHERE {a}.rowid > ? ORDER BY {a}.rowid LIMIT {CHUNK_ROWS})")

    def _next_chunk(self) -> np.ndarray | None:
        """The next rows as an (n, ncols) array of the spec's columns."""
        k = self.ncols
        if self.cur is not None:
            rows = self.cur.fetchmany(CHUNK_ROWS)
            if not rows:
                return None
            return np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=k * len(rows)).reshape(-1, k)
        row = self.con.execute(self.sql, (self.last_rowid,)).fetchone()
        if not row or not row[1]:
            return None
        self.last_rowid = int(row[0])
        n = int(row[1])
        arr = np.empty((n, k), dtype=np.int64)
        for i in range(k):
            col = np.fromstring(row[2 + i], dtype=np.int64, sep=",")
            if len(col) != n:  # a value that is not an integer: read this table in order instead
                raise _Unsorted
            arr[:, i] = col
        return arr

    def ensure(self) -> None:
        if self.pos < len(self.buf) or self.done:
            return
        arr = self._next_chunk()
        if arr is None:
            self.done = True
            self.buf, self.pos = np.zeros((0, 6), dtype=np.int64), 0
            return
        starts = arr[:, 0]
        if (self.last_start is not None and starts[0] < self.last_start) or bool(np.any(starts[1:] < starts[:-1])):
            raise _Unsorted
        self.last_start = int(starts[-1])
        buf = np.zeros((len(arr), 6), dtype=np.int64)
        code = arr[:, 2]
        buf[:, C_DEV] = code & ((1 << DEV_BITS) - 1)
        buf[:, C_START] = starts
        buf[:, C_END] = starts + np.maximum(arr[:, 1], 0)
        buf[:, C_CODE] = code >> DEV_BITS
        if self.ncols > 3:
            buf[:, C_BYTES] = arr[:, 3]
        buf[:, C_KIND] = self.spec.kind
        self.buf, self.pos = buf, 0

    @property
    def live(self) -> bool:
        return self.pos < len(self.buf)


def _merged(streams: list[_Stream]) -> Iterator[np.ndarray]:
    """Batches of rows from all streams, each batch sorted by (device, start), batches in time order.

    Each batch takes every buffered row up to the earliest 'last start' among the streams'
    buffers: no row still to come from any stream can start before it.
    """
    while True:
        for st in streams:
            st.ensure()
        live = [st for st in streams if st.live]
        if not live:
            return
        frontier = min(int(st.buf[-1, C_START]) for st in live)
        parts = []
        for st in live:
            rest = st.buf[st.pos:]
            n = int(np.searchsorted(rest[:, C_START], frontier, side="right"))
            if n:
                parts.append(rest[:n])
                st.pos += n
        batch = np.concatenate(parts) if len(parts) > 1 else parts[0]
        if len(parts) > 1:  # sorted runs: a stable sort merges them in near-linear time
            batch = batch[np.argsort(batch[:, C_START], kind="stable")]
        yield batch[np.argsort(batch[:, C_DEV], kind="stable")]


class _CodeIndex:
    """``np.unique(codes, return_inverse=True)``, cheaper when a batch repeats codes already seen:
    a stream has few distinct codes (kernel names, copy kinds) over many rows."""

    def __init__(self) -> None:
        self.known = np.zeros(0, dtype=np.int64)

    def __call__(self, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if len(self.known):
            idx = np.clip(np.searchsorted(self.known, codes), 0, len(self.known) - 1)
            if bool(np.all(self.known[idx] == codes)):
                return self.known, idx
        uniq, inv = np.unique(codes, return_inverse=True)
        self.known = np.union1d(self.known, uniq) if len(self.known) < 4096 else uniq
        return uniq, inv


@dataclass
class _GpuAcc:
    folds: dict[int, TimelineFold] = field(default_factory=dict)
    kernels: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (dev, code) → [n, ns, tiny]
    copies: dict[tuple[int, int], list[int]] = field(default_factory=dict)  # (dev, code) → [n, bytes, ns, sn, sns]
    memsets: dict[int, list[int]] = field(default_factory=dict)  # dev → [n, ns]
    kernel_index: _CodeIndex = field(default_factory=_CodeIndex)
    copy_index: _CodeIndex = field(default_factory=_CodeIndex)


def _group_sum(acc: dict[tuple[int, int], list[int]], index: _CodeIndex, dev: int, codes: np.ndarray,
               cols: Sequence[np.ndarray]) -> None:
    """Add per-code row counts and column sums of one batch into ``acc``."""
    uniq, inv = index(codes)
    counts = np.bincount(inv, minlength=len(uniq))
    sums = [np.bincount(inv, weights=c, minlength=len(uniq)) for c in cols]
    for i in np.flatnonzero(counts).tolist():
        a = acc.setdefault((dev, int(uniq[i])), [0] * (1 + len(sums)))
        a[0] += int(counts[i])
        for j, arr in enumerate(sums):
            a[j + 1] += int(arr[i])


def _gpu_specs(db: _Db) -> list[_Spec]:
    out: list[_Spec] = []
    shift = 1 << PID_BITS
    dev_mask = (1 << DEV_BITS) - 1

    def packed(code: str, alias: str, table: str) -> str:
        return f"({code}) * {1 << DEV_BITS} + ({db.col(table, 'deviceId', '0', alias)} & {dev_mask})"

    if db.has_rows(KERNEL):
        name = db.col(KERNEL, "shortName", db.col(KERNEL, "demangledName", "0", "k"), "k")
        pid = f'((COALESCE({db.col(KERNEL, "globalPid", "0", "k")}, 0) >> {PID_BITS}) & {PID_MASK})'
        out.append(_Spec(K_KERNEL, KERNEL, "k", (
            "k.start", 'k."end" - k.start', packed(f"COALESCE({name}, 0) * {shift} + {pid}", "k", KERNEL))))
    if db.has_rows(MEMCPY):
        c = {n: db.col(MEMCPY, n, "NULL", "m")
             for n in ("copyKind", "srcKind", "dstKind", "correlationId", "globalPid")}
        pid = f"((COALESCE({c['globalPid']}, 0) >> {PID_BITS}) & {PID_MASK})"
        joined = "nsys_calls" in {r[0] for r in db.con.execute("SELECT name FROM sqlite_temp_master")}
        api = (f"CASE a.cls WHEN {CLS_COPY_SYNC} THEN {API_SYNC} WHEN {CLS_COPY_ASYNC} THEN {API_ASYNC} "
               f"ELSE {API_UNKNOWN} END") if joined else str(API_UNKNOWN)
        join = f"LEFT JOIN temp.nsys_calls a ON a.k = {c['correlationId']} * {shift} + {pid}" if joined else ""
        code = (f"((((COALESCE({c['copyKind']}, 0) & 15) * 16 + (COALESCE({c['srcKind']}, 15) & 15)) * 16 "
                f"+ (COALESCE({c['dstKind']}, 15) & 15)) * 4 + {api}) * {shift} + {pid}")
        out.append(_Spec(K_COPY, MEMCPY, "m", ("m.start", 'm."end" - m.start', packed(code, "m", MEMCPY),
                                               db.col(MEMCPY, "bytes", "0", "m")), join))
    if db.has_rows(MEMSET):
        out.append(_Spec(K_MEMSET, MEMSET, "s", ("s.start", 's."end" - s.start', packed("0", "s", MEMSET),
                                                 db.col(MEMSET, "bytes", "0", "s"))))
    return out


def _gpu_pass(db: _Db, stages: StageCover | None, ordered: bool) -> _GpuAcc:
    acc = _GpuAcc()
    streams = [_Stream(db.con, spec, ordered) for spec in _gpu_specs(db)]
    for batch in _merged(streams):
        devs = batch[:, C_DEV]
        cuts = np.flatnonzero(devs[1:] != devs[:-1]) + 1
        for rows in np.split(batch, cuts) if len(cuts) else (batch,):
            dev = int(rows[0, C_DEV])
            s, e, code = rows[:, C_START], rows[:, C_END], rows[:, C_CODE]
            nbytes, kind = rows[:, C_BYTES], rows[:, C_KIND]
            is_k = kind == K_KERNEL
            acc.folds.setdefault(dev, TimelineFold()).feed(s, e, is_k, stages)
            dur = np.maximum(e - s, 0)
            if is_k.any():
                kd = dur[is_k]
                _group_sum(acc.kernels, acc.kernel_index, dev, code[is_k], (kd, (kd < TINY_KERNEL_NS).astype(np.int64)))
            is_c = kind == K_COPY
            if is_c.any():
                cb, cd = nbytes[is_c], dur[is_c]
                small = cb < SMALL_COPY_BYTES
                _group_sum(acc.copies, acc.copy_index, dev, code[is_c],
                           (cb, cd, small.astype(np.int64), np.where(small, cd, 0)))
            is_m = kind == K_MEMSET
            if is_m.any():
                m = acc.memsets.setdefault(dev, [0, 0])
                m[0] += int(is_m.sum())
                m[1] += int(dur[is_m].sum())
    return acc


def _strings(db: _Db, ids: Iterable[int]) -> dict[int, str]:
    wanted = sorted({int(i) for i in ids})
    if not wanted or "StringIds" not in db.tables:
        return {}
    out: dict[int, str] = {}
    for i in range(0, len(wanted), 500):
        part = wanted[i:i + 500]
        marks = ",".join("?" * len(part))
        rows = db.con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part)
        out.update({int(k): str(v) for k, v in rows})
    return out


def _device_names(db: _Db) -> dict[int, str]:
    if "TARGET_INFO_GPU" not in db.tables or not {"id", "name"} <= db.cols("TARGET_INFO_GPU"):
        return {}
    rows = db.con.execute("SELECT id, name FROM TARGET_INFO_GPU")
    return {int(i): str(n or "") for i, n in rows if isinstance(i, int)}


def _span_hint(db: _Db, api: ApiStats | None) -> int:
    """The traced span for choosing the NVTX stage threshold, without scanning a table."""
    if api and api.last_ns > api.first_ns:
        return api.last_ns - api.first_ns
    lo, hi = None, None
    for t in (KERNEL, MEMCPY, NVTX):
        if t in db.tables:
            a = db.one(f'SELECT start FROM "{t}" ORDER BY rowid LIMIT 1')
            b = db.one(f'SELECT COALESCE("end", start) FROM "{t}" ORDER BY rowid DESC LIMIT 1')
            if a and b and isinstance(a[0], int) and isinstance(b[0], int):
                lo = a[0] if lo is None else min(lo, a[0])
                hi = b[0] if hi is None else max(hi, b[0])
    return (hi - lo) if lo is not None and hi is not None and hi > lo else 0


def read_export(path: str, top_kernels: int = 10, name_filter: Callable[[str], str] = str) -> NsysTrace:
    """Aggregate an Nsight Systems SQLite export; raises ``NsysError`` when it is not one.

    ``name_filter`` is applied to every kernel and NVTX name before it is grouped or kept (the
    caller passes its redaction, so that folding digits cannot break a secret's pattern first).
    """
    con = _connect(path)
    try:
        db = _Db(con)
        known = {"StringIds", "ANALYSIS_DETAILS", "META_DATA_EXPORT", "EXPORT_META_DATA", "TARGET_INFO_GPU",
                 "TARGET_INFO_SESSION_START_TIME"}
        if not (db.tables & known or any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in db.tables)):
            raise NsysError("an SQLite database, but not an Nsight Systems export (no StringIds, CUPTI or "
                            "export-metadata tables)")
        return _read(db, top_kernels, name_filter)
    except sqlite3.Error as exc:
        raise NsysError(f"the export could not be read ({exc})") from exc
    finally:
        con.close()


def _read(db: _Db, top_kernels: int, name_filter: Callable[[str], str]) -> NsysTrace:
    info = _meta(db)
    notes = _diagnostics(db)
    problems: list[str] = []
    api = _read_api(db, _api_names(db))
    gpu_tables = [t for t in (KERNEL, MEMCPY, MEMSET) if db.has_rows(t)]
    cuda_flag = _capture_flag(db, "CUDA_TRACE")
    if api is not None or gpu_tables:
        cuda_traced: bool | None = True
    elif cuda_flag or _diag_mentions(db, "%CUDA injection%") or _diag_mentions(db, "%CUPTI%"):
        cuda_traced = True  # tracing was on, nothing was recorded
    elif cuda_flag is False:
        cuda_traced = False
    else:
        cuda_traced = None
    nvtx_flag = _capture_flag(db, "NVTX_TRACE")
    nvtx_traced: bool | None = True if db.has_rows(NVTX) else (nvtx_flag if nvtx_flag is not None else None)

    ranked, stage_min, capped = _read_stages(db, _span_hint(db, api), name_filter)
    if capped:
        problems.append(
            f"more than {MAX_STAGE_RANGES} NVTX ranges ≥ {stage_min / 1e6:.2f} ms: stages use the first ones")
    stage_iv = [union_intervals((s, e) for _, s, e in rs) for _, rs in ranked]
    stage_cov = StageCover(stage_iv)

    try:
        acc = _gpu_pass(db, stage_cov, ordered=False)
    except (_Unsorted, sqlite3.OperationalError):  # out of start order, or no rowid to page by
        acc = _gpu_pass(db, stage_cov, ordered=True)

    devices, kernels, kernel_names, copies = _assemble_gpu(db, acc, top_kernels, name_filter)
    n_dev = max(1, len(devices))
    busy = {d: f.stage_busy(stage_cov) for d, f in acc.folds.items()}
    lo = min((d.first_ns for d in devices), default=0)
    hi = max((d.last_ns for d in devices), default=0)
    stages = []
    for j, (name, rs) in enumerate(ranked):
        gpu = sum(busy[d][j] for d in busy)
        stages.append(NvtxStage(
            name=name, ranges=len(rs), range_ns=sum(e - s for _, s, e in rs),
            covered_ns=sum(e - s for s, e in stage_iv[j]),
            in_window_ns=sum(max(0, min(e, hi) - max(s, lo)) for s, e in stage_iv[j]),
            gpu_busy_ns=gpu // n_dev, pids=tuple(sorted({p for p, _, _ in rs})),
        ))
    if cuda_traced and not devices:
        problems.append(_no_gpu_reason(api, notes))
    elif cuda_traced is False or cuda_traced is None:
        problems.append(_no_cuda_reason(cuda_traced, notes))
    return NsysTrace(
        info=info, cuda_traced=cuda_traced, nvtx_traced=nvtx_traced, devices=tuple(devices), kernels=kernels,
        kernel_names=kernel_names, copies=copies, api=api,
        sync_events=_read_sync_events(db), stages=tuple(stages), stage_min_ns=stage_min,
        notes=tuple(notes), problems=tuple(problems),
    )


def _assemble_gpu(
    db: _Db, acc: _GpuAcc, top_kernels: int, name_filter: Callable[[str], str]
) -> tuple[list[DeviceStats], tuple[KernelStat, ...], int, tuple[CopyGroup, ...]]:
    """Per-device statistics, the top kernels, the number of kernel names, and the copy groups."""
    names = _device_names(db)
    pids_by_dev: dict[int, set[int]] = {}
    kstats: dict[int, list[int]] = {}
    kdevs: dict[int, set[int]] = {}
    per_dev_k: dict[int, list[int]] = {}
    for (dev, code), (n, ns, tiny) in acc.kernels.items():
        name_id, pid = code >> PID_BITS, code & PID_MASK
        pids_by_dev.setdefault(dev, set()).add(pid)
        a = kstats.setdefault(name_id, [0, 0, 0])
        a[0] += n
        a[1] += ns
        a[2] += tiny
        kdevs.setdefault(name_id, set()).add(dev)
        d = per_dev_k.setdefault(dev, [0, 0, 0])
        d[0] += n
        d[1] += ns
        d[2] += tiny
    copies: list[CopyGroup] = []
    per_dev_c: dict[int, list[int]] = {}
    for (dev, code), (n, nbytes, ns, sn, sns) in acc.copies.items():
        pid, rest = code & PID_MASK, code >> PID_BITS
        api_flag, dst, src, ck = rest & 3, (rest >> 2) & 15, (rest >> 6) & 15, (rest >> 10) & 15
        pids_by_dev.setdefault(dev, set()).add(pid)
        copies.append(CopyGroup(
            device=dev, pid=pid, direction=COPY_DIRECTION.get(ck, "other"), host_kind=copy_host_kind(ck, src, dst),
            api={API_SYNC: "sync", API_ASYNC: "async"}.get(api_flag, "unknown"),
            count=n, bytes=nbytes, ns=ns, small_count=sn, small_ns=sns,
        ))
        c = per_dev_c.setdefault(dev, [0, 0])
        c[0] += n
        c[1] += ns
    devices = []
    for dev in sorted(acc.folds):
        f = acc.folds[dev]
        k = per_dev_k.get(dev, [0, 0, 0])
        c = per_dev_c.get(dev, [0, 0])
        m = acc.memsets.get(dev, [0, 0])
        devices.append(DeviceStats(
            device=dev, name=names.get(dev, ""), pids=tuple(sorted(pids_by_dev.get(dev, ()))),
            first_ns=f.first_ns or 0, last_ns=f.max_end or 0, busy_ns=f.busy_ns, kernel_busy_ns=f.kernel_busy_ns,
            gaps=GapStats(f.gap_count, f.gap_total_ns, f.gap_longest_ns, tuple(f.hist_count), tuple(f.hist_ns)),
            kernel_count=k[0], kernel_ns=k[1], tiny_kernels=k[2], copy_count=c[0], copy_ns=c[1],
            memset_count=m[0], memset_ns=m[1],
        ))
    top = sorted(kstats.items(), key=lambda kv: -kv[1][1])[:top_kernels]
    knames = _strings(db, [i for i, _ in top])
    kernels = tuple(
        KernelStat(name_filter(knames.get(i, f"kernel#{i}")), a[0], a[1], a[2], tuple(sorted(kdevs[i]))) for i, a in top
    )
    return devices, kernels, len(kstats), tuple(sorted(copies, key=lambda c: -c.ns))


def _driver_note(notes: Sequence[str]) -> str:
    for n in notes:
        if "not supported" in n or "driver" in n.lower():
            return f" (nsys: {n.rstrip('.')})"
    return ""


def _no_gpu_reason(api: ApiStats | None, notes: Sequence[str]) -> str:
    if api is not None and api.calls:
        launches = api.launch_calls + api.graph_launches
        what = f"{api.calls} CUDA API calls" + (f", {launches} of them kernel launches," if launches else "")
        return (f"{what} were traced but the export holds no GPU activity (no kernel, memcpy or memset rows)"
                f"{_driver_note(notes)}: GPU-side evidence is missing; profile again with `nsys profile -t cuda` "
                "using an nsys release that supports the installed driver")
    return (f"CUDA tracing was on but no CUDA activity was recorded{_driver_note(notes)}: either nothing ran on "
            "the GPU in the capture window or the CUDA trace failed; check the capture window "
            "(`nsys profile -t cuda --delay/--duration`) and that nsys supports the installed driver")


def _no_cuda_reason(traced: bool | None, notes: Sequence[str]) -> str:
    why = "CUDA was not traced" if traced is False else "the export holds no CUDA trace"
    return (f"{why}{_driver_note(notes)}, so it says nothing about the GPU; profile with "
            "`nsys profile -t cuda,nvtx,osrt` and export with `nsys export --type sqlite`")


def with_exported(rep_path: str) -> tuple[str, tempfile.TemporaryDirectory[str]]:
    """Export a ``.nsys-rep`` into a temporary folder; the caller keeps the folder until done."""
    tmp = tempfile.TemporaryDirectory(prefix="diagnose-nsys-")
    try:
        return export_report(rep_path, tmp.name), tmp
    except BaseException:
        tmp.cleanup()
        raise
