"""PyTorch-profiler (Kineto) traces: a streaming reader of Chrome trace-event JSON into compact columns.

``read_trace(stream)`` reads ``{"traceEvents": [...], ...}`` (already decompressed: the caller
undoes gzip) a chunk at a time and never holds the whole document: a 1 GB trace costs the chunk
(``CHUNK_BYTES``) plus the columns kept, a few dozen bytes per GPU operation and host call.

How the stream is cut: the top-level object is walked key by key; every key but ``traceEvents``
is small metadata (``schemaVersion``, ``deviceProperties``, ``distributedInfo``, versions, flags)
and is decoded whole. The events array is cut at the last ``}`` ``,`` ``{`` of each chunk and the
piece is decoded in one call by msgspec into typed structs that keep only the fields read here
(unknown fields are skipped inside the C decoder, no dict per event). A cut that falls inside a
string (a kernel name holding ``}, {``) cannot decode — the piece is an unterminated prefix of the
document — and the piece is then read event by event with the standard library's ``raw_decode``,
which finds the true boundaries. Text that cannot be read at all ends the reading: the events
before it are kept and the trace is reported partial, with where and why.

Schemas tolerated (Kineto 2020 … 2026, ROCm's roctracer, TraceLens/HTA test extracts):

* categories ``kernel``/``Kernel``, ``gpu_memcpy``/``Memcpy``, ``gpu_memset``/``Memset``,
  ``cuda_runtime``/``Runtime``, ``cuda_driver``; ROCm writes its ``hip*`` calls under
  ``cuda_runtime``; ``cuda_sync`` (CUPTI synchronisation records); flows (``ac2g``,
  ``async_gpu``, ``async_cpu_to_gpu``) are not needed: kernels carry the launch's correlation id;
* ``ts``/``dur`` in microseconds, integers or floats (ns-resolution traces write three decimals);
  ``displayTimeUnit`` is only the viewer's display unit (``"ns"`` traces still write µs) and is
  recorded, not applied;
* ``External id`` (current) or ``external id`` (2020-era); ``stream`` as an int or a string
  (ROCm writes ``"0x0"`` on runtime calls); the device from ``args.device``, else ``pid``;
* one rank per file: ``distributedInfo.rank`` (absent: no rank; HTA then assumes rank 0).

Memcpy kinds come from the Kineto name, ``Memcpy HtoD (Pageable -> Device)``: direction, then
the source and destination memory (Pageable, Pinned, Device, Host = not said).
"""

from __future__ import annotations

import json
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from typing import IO, Any

import msgspec
import numpy as np

CHUNK_BYTES = 8 << 20  # decompressed bytes read at a time
MAX_VALUE_BYTES = 256 << 20  # a top-level value (or one event) larger than this is damage, not data
VALUE_WINDOW_BYTES = 64 << 10  # first window decoded for one metadata value or fallback event

GPU_KERNEL, GPU_MEMCPY, GPU_MEMSET = 0, 1, 2
KERNEL_CATS = frozenset({"kernel", "Kernel"})
MEMCPY_CATS = frozenset({"gpu_memcpy", "Memcpy"})
MEMSET_CATS = frozenset({"gpu_memset", "Memset"})
RUNTIME_CATS = frozenset({"cuda_runtime", "Runtime", "cuda_driver", "Driver"})
FLOW_CATS = frozenset({"ac2g", "async_gpu", "async_cpu_to_gpu", "fwdbwd"})
PROFILER_STEP = "ProfilerStep"
HTA_SYNC_NAMES = frozenset({"Event Sync", "Context Sync"})  # device-level sync records HTA keeps as GPU events

_MEMCPY_NAME = re.compile(r"Memcpy (HtoD|DtoH|DtoD|PtoP|HtoH|DtoA|AtoD|HtoA|AtoH|AtoA)(?: \((\w+) -> (\w+)\))?")
_DIRECTION = {"HtoD": "h2d", "DtoH": "d2h", "DtoD": "d2d", "PtoP": "p2p", "HtoH": "h2h"}


class KinetoError(Exception):
    """The input is not a readable PyTorch-profiler trace (the message says why)."""


# -- the fields read, as msgspec structs (gc=False: no cycles, no GC tracking per event) -------------


class _Args(msgspec.Struct, gc=False):
    stream: Any = None
    correlation: Any = None
    device: Any = None
    bytes: Any = None
    ext: Any = msgspec.field(default=None, name="External id")
    ext_old: Any = msgspec.field(default=None, name="external id")
    name: Any = None  # process_name / thread_name metadata
    labels: Any = None  # process_labels metadata ("CUDA:0")


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: str | None = None  # any other type: not an event of ours
    name: Any = ""
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: _Args | None = None


_DECODE_EVENTS = msgspec.json.Decoder(list[_Event])


# -- what a trace holds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class TraceMeta:
    """The trace's top-level facts (never its host, user or environment metadata)."""

    schema_version: int | None = None
    rank: int | None = None
    world_size: int | None = None
    backend: str = ""
    display_time_unit: str = ""
    devices: tuple[str, ...] = ()  # deviceProperties names, by position
    platform: str = ""  # cuda | rocm | mtia | "" (from runtime call names, versions, device names)
    versions: tuple[tuple[str, str], ...] = ()  # cuda_runtime_version, hip_runtime_version, cupti_version, …
    flags: tuple[str, ...] = ()  # record_shapes, with_stack, profile_memory, with_flops, with_modules


@dataclass(frozen=True)
class GpuOps:
    """Kernels, memcpys and memsets as columns (µs on the trace's clock), in file order."""

    kind: np.ndarray  # int8: GPU_KERNEL | GPU_MEMCPY | GPU_MEMSET
    ts: np.ndarray  # float64 µs
    dur: np.ndarray  # float64 µs
    device: np.ndarray  # int64
    stream: np.ndarray  # int64 (-1 unknown)
    corr: np.ndarray  # int64 (-1 unknown)
    ext: np.ndarray  # int64 External id (-1 unknown)
    name: np.ndarray  # int32 index into KinetoTrace.names
    nbytes: np.ndarray  # int64 (-1 unknown): memcpy/memset bytes


@dataclass(frozen=True)
class HostCalls:
    """CUDA/HIP runtime and driver calls as columns."""

    ts: np.ndarray
    dur: np.ndarray
    corr: np.ndarray
    tid: np.ndarray  # int64 (hash of a non-numeric tid)
    name: np.ndarray  # int32 index into KinetoTrace.names
    ext: np.ndarray  # int64 External id of the operator that made the call (-1 unknown)


@dataclass(frozen=True)
class HtaEvents:
    """The events HTA's temporal breakdown counts as GPU work: every complete event whose
    ``args.stream`` converts to an int other than -1 (kernels, copies, memsets, and also CUPTI sync
    records, MTIA device events and the few CPU ops that carry a stream), with what HTA filters on."""

    ts: np.ndarray
    dur: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    name: np.ndarray


@dataclass(frozen=True)
class OpStat:
    name: str
    count: int
    total_us: float


@dataclass(frozen=True)
class KinetoTrace:
    meta: TraceMeta
    names: tuple[str, ...]
    gpu: GpuOps
    host: HostCalls
    hta: HtaEvents
    ops: tuple[OpStat, ...]  # cpu_op by name: count, inclusive time
    op_ext: np.ndarray  # (n, 2) int64: cpu_op External id → name index
    steps: np.ndarray  # (n, 2) float64: ProfilerStep# annotations (ts, end) on the CPU
    step_names: int  # distinct ProfilerStep names (HTA filters the last step only with 2 or more)
    cpu_nocorr_first_ts: float  # earliest CPU event without a correlation id (HTA's filter matches -1 to it)
    host_span: tuple[float, float] | None  # first and last host event (µs)
    events: int
    by_cat: tuple[tuple[str, int], ...]
    problems: tuple[str, ...] = ()
    has_trace_events: bool = True


# -- small pure helpers ---------------------------------------------------------------------------


def as_int(value: Any, default: int = -1) -> int:
    """``int(value)`` as HTA converts a stream number (``"7"`` → 7, ``"0x0"`` → default)."""
    if value is None or isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def memcpy_kind(name: str) -> tuple[str, str]:
    """(direction, host memory kind) from a Kineto memcpy name: ``("h2d", "pageable")``;
    ``("unknown", "unknown")`` when the name does not say."""
    m = _MEMCPY_NAME.match(name)
    if not m:
        return "unknown", "unknown"
    direction = _DIRECTION.get(m.group(1), m.group(1).lower())
    src, dst = (m.group(2) or "").lower(), (m.group(3) or "").lower()
    host = src if direction == "h2d" else dst if direction == "d2h" else ""
    if host in ("pageable", "pinned"):
        return direction, host
    return direction, "unknown" if direction in ("h2d", "d2h") else "device"


def is_gzip(head: bytes) -> bool:
    return head[:2] == b"\x1f\x8b"


TRACE_KEYS = frozenset({"traceEvents", "schemaVersion", "deviceProperties", "distributedInfo"})
_HEAD_KEY = re.compile(r'\s*"((?:[^"\\]|\\.)*)"\s*:\s*', re.S)
_CUT_KEY = re.compile(r'\s*(?:"(?:[^"\\]|\\.)*\\?(?:"\s*)?)?', re.S)  # nothing, or a key the head's end cuts


def trace_head(head: bytes) -> bool | None:
    """Whether decompressed ``head`` opens a Chrome trace object, read by structure: the JSON object's
    top-level keys are walked in order (each value decoded and passed over, however large: Kineto
    and benchmark harnesses write ``deviceProperties`` or a ``metadata`` object of tens of KiB
    first) until one is ``traceEvents`` or Kineto's own (True). False: not a JSON object, or it
    closes, or is not JSON, before such a key. None: ``head`` ends first; more of it decides.
    """
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if not text:
        return None
    if text[0] != "{":
        return False
    i, n = 1, len(text)
    while True:
        m = _HEAD_KEY.match(text, i)
        if m is None:
            if _CUT_KEY.fullmatch(text, i):
                return None  # the head ends before the key does
            return False  # "}" (the object closes) or not JSON
        if m.group(1) in TRACE_KEYS:
            return True
        if m.end() >= n:
            return None
        try:
            _, i = _STR_DECODER.raw_decode(text, m.end())
        except json.JSONDecodeError:
            return None  # a value cut by the head's end (damage is found by reading on)
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            return None
        if text[i] != ",":
            return False
        i += 1


def looks_like_trace(head: bytes) -> bool:
    """Whether decompressed ``head`` (the first bytes of a file) opens a Chrome trace object
    (``trace_head``); undecided within ``head`` is no."""
    return trace_head(head) is True


# -- the streaming cut ------------------------------------------------------------------------------


class _Reader:
    """Bytes of the decompressed document, pulled a chunk at a time."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self.buf = bytearray()  # mutable: a batch is decoded in place between temporary brackets
        self.pos = 0
        self.eof = False
        self.consumed = 0  # bytes dropped before ``buf``
        self.error = ""  # why the stream ended early (damaged compression), if it did

    def more(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.stream.read(CHUNK_BYTES)
        except (EOFError, OSError, zlib.error) as exc:  # a gzip stream cut short or damaged
            self.error = f"the compressed stream is damaged or cut short ({exc})"
            chunk = b""
        if not chunk:
            self.eof = True
            return False
        if self.pos > 1:  # keep the byte before ``pos``: a batch's opening bracket goes there
            drop = self.pos - 1
            self.consumed += drop
            del self.buf[:drop]
            self.pos = 1
        self.buf += chunk
        return True

    def skip_ws(self, extra: bytes = b"") -> bytes:
        """The next non-whitespace byte (``extra`` bytes skipped too), or b"" at the end."""
        skip = b" \t\r\n" + extra
        while True:
            n = len(self.buf)
            p = self.pos
            while p < n and self.buf[p] in skip:
                p += 1
            self.pos = p
            if p < n:
                return bytes(self.buf[p:p + 1])
            if not self.more():
                return b""

    def offset(self) -> int:
        return self.consumed + self.pos


_KEY = re.compile(rb'"((?:[^"\\]|\\.)*)"\s*:', re.S)
_STR_DECODER = json.JSONDecoder()


def _value(rd: _Reader) -> Any:
    """Decode one JSON value at the reader's position (stdlib; metadata and fallback events).

    Only a window of the buffer is decoded to text, doubled until it holds the value: decoding all
    that is buffered (megabytes) for each small value made the fallback quadratic. A value that
    reaches the window's end (a number cut in two reads as a smaller number) is tried again wider.
    """
    window = VALUE_WINDOW_BYTES
    while True:
        avail = len(rd.buf) - rd.pos
        whole = window >= avail
        text = rd.buf[rd.pos:rd.pos + window].decode("utf-8", errors="replace")
        error: json.JSONDecodeError | None = None
        try:
            value, end = _STR_DECODER.raw_decode(text)
        except json.JSONDecodeError as exc:
            error, end = exc, -1
        if error is None and (end < len(text) or (whole and rd.eof)):
            rd.pos += len(text[:end].encode("utf-8", errors="replace"))
            return value
        if whole and (avail > MAX_VALUE_BYTES or not rd.more()) and (error is not None or not rd.eof):
            pos = rd.offset() + (error.pos if error is not None else avail)
            raise KinetoError(f"unreadable JSON at byte {pos}: {error.msg if error is not None else 'too large'}")
        window *= 2


def _key(rd: _Reader) -> str:
    while True:
        m = _KEY.match(rd.buf, rd.pos)
        if m:
            rd.pos = m.end()
            return m.group(1).decode("utf-8", errors="replace")
        if len(rd.buf) - rd.pos > MAX_VALUE_BYTES or not rd.more():
            raise KinetoError(f"unreadable JSON at byte {rd.offset()}: expected an object key")


def _last_boundary(buf: bytes | bytearray, start: int) -> int:
    """Index of the ``}`` of the last ``}`` ws ``,`` ws ``{`` in ``buf[start:]``, or -1."""
    i = len(buf)
    while True:
        i = buf.rfind(b"{", start, i)
        if i <= start:
            return -1
        j = i - 1
        while j > start and buf[j] in b" \t\r\n":
            j -= 1
        if buf[j] == 0x2C:  # ","
            j -= 1
            while j > start and buf[j] in b" \t\r\n":
                j -= 1
            if buf[j] == 0x7D:  # "}"
                return j


def _decode_between(buf: bytearray, start: int, end: int) -> list[_Event]:
    """The events ``buf[start:end]`` (``{…}, …, {…}``) decoded as one array without copying it: the
    bytes just before and after (a separator or whitespace, already read past) become ``[`` and
    ``]`` for the call and are put back."""
    if start < 1 or end >= len(buf):
        return _DECODE_EVENTS.decode(b"[" + buf[start:end] + b"]")
    before, after = buf[start - 1], buf[end]
    buf[start - 1], buf[end] = 0x5B, 0x5D
    try:
        with memoryview(buf) as view, view[start - 1:end + 1] as piece:
            return _DECODE_EVENTS.decode(piece)
    finally:
        buf[start - 1], buf[end] = before, after


def _events(rd: _Reader, problems: list[str]) -> Iterator[list[_Event]]:
    """Batches of events of the ``traceEvents`` array; the reader ends past its ``]``."""
    if rd.skip_ws() != b"[":
        raise KinetoError("`traceEvents` is not a list")
    rd.pos += 1
    count = 0
    while True:
        c = rd.skip_ws(b",")
        if c == b"]":
            rd.pos += 1
            return
        if c == b"":
            problems.append(f"the trace ends inside `traceEvents` after {count} events (cut short)")
            return
        if c != b"{":
            problems.append(f"unreadable event at byte {rd.offset()} after {count} events; the rest was not read")
            rd.eof, rd.buf, rd.pos = True, bytearray(), 0
            return
        while not rd.eof and len(rd.buf) - rd.pos < CHUNK_BYTES // 2:
            rd.more()
        cut = _last_boundary(rd.buf, rd.pos)
        batch: list[_Event] | None = None
        if cut > rd.pos:
            try:
                batch = _decode_between(rd.buf, rd.pos, cut + 1)
                rd.pos = cut + 1
            except (msgspec.DecodeError, msgspec.ValidationError):
                batch = None
        if batch is None:
            batch = _slow_batch(rd, problems, count)
            if batch is None:
                return
        count += len(batch)
        yield batch


def _slow_batch(rd: _Reader, problems: list[str], count: int) -> list[_Event] | None:
    """Events one by one with the stdlib decoder, up to a chunk's worth; None after damage."""
    out: list[_Event] = []
    limit = rd.pos + CHUNK_BYTES // 2
    while rd.pos < limit:
        c = rd.skip_ws(b",")
        if c != b"{":
            break
        try:
            doc = _value(rd)
        except KinetoError as exc:
            cut = "the trace ends inside an event" if rd.eof else str(exc)
            problems.append(f"{cut} after {count + len(out)} events; the rest was not read")
            rd.eof, rd.buf, rd.pos = True, bytearray(), 0
            return out or None
        try:
            out.append(msgspec.convert(doc, _Event, strict=False))
        except msgspec.ValidationError:
            continue  # an event of another shape (a number, a list): not one of ours
    return out


# -- the fold -------------------------------------------------------------------------------------


@dataclass
class _Cols:
    """Growing columns, kept as Python lists per chunk and packed into numpy per chunk."""

    names: list[str] = field(default_factory=list)
    index: dict[str, int] = field(default_factory=dict)
    gpu: list[np.ndarray] = field(default_factory=list)
    host: list[np.ndarray] = field(default_factory=list)
    hta: list[np.ndarray] = field(default_factory=list)
    op_ext: list[np.ndarray] = field(default_factory=list)
    steps: list[tuple[float, float]] = field(default_factory=list)
    step_names: set[str] = field(default_factory=set)
    ops: dict[str, list[float]] = field(default_factory=dict)
    by_cat: dict[str | None, int] = field(default_factory=dict)
    cpu_nocorr_first: float = float("inf")
    host_first: float = float("inf")
    host_last: float = float("-inf")
    hip: bool = False
    mtia: bool = False
    process_labels: dict[int, str] = field(default_factory=dict)
    codes: dict[str | None, int] = field(default_factory=dict)  # what the fold does with each category
    events: int = 0

    def name_id(self, name: str) -> int:
        i = self.index.get(name)
        if i is None:
            i = self.index[name] = len(self.names)
            self.names.append(name)
        return i


_CAT = attrgetter("cat")
# what the fold does with an event, by its category (decided once per category string and read)
_SKIP, _RUNTIME, _CPU_OP, _ANNOTATION, _MTIA, _OTHER = range(10, 16)  # GPU kinds are GPU_KERNEL/MEMCPY/MEMSET
_KNOWN_CODES: dict[str | None, int] = {
    None: _SKIP, "Trace": _SKIP, **dict.fromkeys(KERNEL_CATS, GPU_KERNEL), **dict.fromkeys(MEMCPY_CATS, GPU_MEMCPY),
    **dict.fromkeys(MEMSET_CATS, GPU_MEMSET), **dict.fromkeys(RUNTIME_CATS, _RUNTIME), "cpu_op": _CPU_OP,
    "user_annotation": _ANNOTATION,
}


def _code(cat: str) -> int:
    return _KNOWN_CODES.get(cat, _MTIA if cat.startswith("mtia") else _OTHER)


def _tid(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return as_int(value, hash(str(value)) & 0x7FFFFFFF)


def _fold(cols: _Cols, batch: list[_Event]) -> None:
    # the hot loop of a big trace (a few hundred thousand events a second): each category is decided
    # once (``cols.codes``), integers are taken as they are before ``as_int`` is asked, ``name_id`` is
    # inlined, and events of other categories (Python functions, flows, annotations) leave the loop
    # after the few facts they give
    gpu: list[tuple[float, ...]] = []
    host: list[tuple[float, ...]] = []
    hta: list[tuple[float, ...]] = []
    op_ext: list[tuple[int, int]] = []
    codes = cols.codes
    for cat, k in Counter(map(_CAT, batch)).items():  # first appearance first, as event-by-event counting did
        cols.by_cat[cat] = cols.by_cat.get(cat, 0) + k
        if cat not in codes:
            codes[cat] = _KNOWN_CODES[None] if cat is None else _code(cat)
    index = cols.index
    names = cols.names
    host_first, host_last, nocorr_first = cols.host_first, cols.host_last, cols.cpu_nocorr_first
    ops = cols.ops
    mtia, hip = cols.mtia, cols.hip
    for e in batch:
        if e.ph == "M":
            if e.name == "process_labels" and e.args is not None and isinstance(e.args.labels, str):
                cols.process_labels[as_int(e.pid)] = e.args.labels
            continue
        dur = e.dur
        if dur is None:  # flows, instants, counters: no duration
            continue
        ts = e.ts
        tt, td = type(ts), type(dur)
        if ((tt is not float and tt is not int) or (td is not float and td is not int)) and (
                not isinstance(ts, int | float) or not isinstance(dur, int | float)):
            continue  # not a timed event (a bool still counts as a number, as isinstance has it)
        code = codes[e.cat]
        if code == _SKIP:
            continue
        name = e.name
        if type(name) is not str:
            name = str(name)
        a = e.args
        if a is None:
            stream = corr = -1
        else:
            stream = a.stream
            if stream is None:
                stream = -1
            elif type(stream) is not int:
                stream = as_int(stream)
            corr = a.correlation
            if corr is None:
                corr = -1
            elif type(corr) is not int:
                corr = as_int(corr)
        nid = -1
        if stream != -1:
            nid = index.get(name, -1)
            if nid < 0:
                nid = index[name] = len(names)
                names.append(name)
            hta.append((ts, dur, stream, corr, nid))
        if code <= GPU_MEMSET:
            if nid < 0:
                nid = index.get(name, -1)
                if nid < 0:
                    nid = index[name] = len(names)
                    names.append(name)
            if a is None:
                dev = as_int(e.pid, 0)
                ext = nbytes = -1
            else:
                dev = a.device if type(a.device) is int else as_int(a.device)
                if dev < 0:
                    dev = as_int(e.pid, 0)
                ext = a.ext if a.ext is not None else a.ext_old
                if type(ext) is not int:
                    ext = as_int(ext)
                nbytes = a.bytes if type(a.bytes) is int else as_int(a.bytes)
            gpu.append((code, ts, dur, dev, stream, corr, ext, nid, nbytes))
            continue
        if ts < host_first:
            host_first = ts
        if ts + dur > host_last:
            host_last = ts + dur
        if corr < 0 and ts < nocorr_first:
            nocorr_first = ts
        if PROFILER_STEP in name:
            cols.step_names.add(name)
            if code == _ANNOTATION and name.startswith(PROFILER_STEP):
                cols.steps.append((ts, ts + dur))
        if code == _RUNTIME:
            if not hip and name.startswith("hip"):
                hip = cols.hip = True
            if nid < 0:
                nid = index.get(name, -1)
                if nid < 0:
                    nid = index[name] = len(names)
                    names.append(name)
            if a is None:
                ext = -1
            else:
                ext = a.ext if a.ext is not None else a.ext_old
                if type(ext) is not int:
                    ext = as_int(ext)
            tid = e.tid
            host.append((ts, dur, corr, tid if type(tid) is int else _tid(tid), nid, ext))
        elif code == _CPU_OP:
            acc = ops.get(name)
            if acc is None:
                ops[name] = [1, dur]
            else:
                acc[0] += 1
                acc[1] += dur
            if a is not None and a.ext is not None:
                if nid < 0:
                    nid = index.get(name, -1)
                    if nid < 0:
                        nid = index[name] = len(names)
                        names.append(name)
                op_ext.append((a.ext if type(a.ext) is int else as_int(a.ext), nid))
        elif code == _MTIA and not mtia:
            mtia = cols.mtia = True
    cols.host_first, cols.host_last, cols.cpu_nocorr_first = host_first, host_last, nocorr_first
    cols.events += len(batch)
    if gpu:
        cols.gpu.append(np.array(gpu, dtype=np.float64))
    if host:
        cols.host.append(np.array(host, dtype=np.float64))
    if hta:
        cols.hta.append(np.array(hta, dtype=np.float64))
    if op_ext:
        cols.op_ext.append(np.array(op_ext, dtype=np.int64))


def _stack(parts: list[np.ndarray], width: int) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros((0, width), dtype=np.float64)


def _meta(doc: dict[str, Any], cols: _Cols) -> TraceMeta:
    dist = doc.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    rank = dist.get("rank")
    devs = doc.get("deviceProperties")
    names = tuple(str(d.get("name") or "") for d in devs if isinstance(d, dict)) if isinstance(devs, list) else ()
    versions = tuple((k, str(v)) for k, v in doc.items()
                     if k.endswith("_version") and isinstance(v, int | float | str))
    flags = tuple(k for k in ("record_shapes", "with_stack", "profile_memory", "with_flops", "with_modules")
                  if doc.get(k))
    joined = " ".join(names).lower()
    if cols.hip or any(k.startswith(("hip_", "roctracer")) for k, _ in versions) or "amd" in joined:
        platform = "rocm"
    elif cols.mtia or "artemis" in joined:
        platform = "mtia"
    elif cols.host or any(k.startswith(("cuda_", "cupti")) for k, _ in versions) or "nvidia" in joined:
        platform = "cuda"
    else:
        platform = ""
    sv = doc.get("schemaVersion")
    ws = dist.get("world_size")
    return TraceMeta(
        schema_version=sv if isinstance(sv, int) else None,
        rank=rank if isinstance(rank, int) and not isinstance(rank, bool) else None,
        world_size=ws if isinstance(ws, int) and not isinstance(ws, bool) else None,
        backend=str(dist.get("backend") or ""),
        display_time_unit=str(doc.get("displayTimeUnit") or ""),
        devices=names, platform=platform, versions=versions, flags=flags,
    )


META_KEYS = frozenset({"schemaVersion", "distributedInfo", "deviceProperties", "displayTimeUnit", "record_shapes",
                       "with_stack", "profile_memory", "with_flops", "with_modules"})


def read_trace(stream: IO[bytes]) -> KinetoTrace:
    """Read a decompressed trace stream; ``KinetoError`` when it is not a trace object at all."""
    rd = _Reader(stream)
    if rd.skip_ws() != b"{":
        raise KinetoError("not a JSON object (a PyTorch-profiler trace is an object with `traceEvents`)")
    rd.pos += 1
    doc: dict[str, Any] = {}
    cols = _Cols()
    problems: list[str] = []
    seen_events = False
    while True:
        c = rd.skip_ws(b",")
        if c == b"}" or c == b"":
            if c == b"" and not seen_events:
                raise KinetoError("the JSON object ends before `traceEvents` (cut short or not a trace)")
            if c == b"":
                problems.append("the trace's closing brace is missing (cut short after its events)")
            break
        try:
            key = _key(rd)
            if rd.skip_ws() == b"":
                raise KinetoError(f"the trace ends after the key `{key}`")
            if key == "traceEvents":
                if rd.skip_ws() != b"[":
                    raise KinetoError("`traceEvents` is not a list")
                seen_events = True
                for batch in _events(rd, problems):
                    _fold(cols, batch)
                if problems:
                    break
            else:
                value = _value(rd)
                if key in META_KEYS or key.endswith("_version"):
                    doc[key] = value
        except KinetoError as exc:
            if not seen_events:
                raise
            problems.append(f"after the events: {exc}")
            break
    if rd.error:
        problems.insert(0, rd.error)
    return _assemble(doc, cols, problems, seen_events)


def _assemble(doc: dict[str, Any], cols: _Cols, problems: list[str], seen_events: bool) -> KinetoTrace:
    g = _stack(cols.gpu, 9)
    h = _stack(cols.host, 6)
    t = _stack(cols.hta, 5)
    gpu = GpuOps(kind=g[:, 0].astype(np.int8), ts=g[:, 1].copy(), dur=g[:, 2].copy(), device=g[:, 3].astype(np.int64),
                 stream=g[:, 4].astype(np.int64), corr=g[:, 5].astype(np.int64), ext=g[:, 6].astype(np.int64),
                 name=g[:, 7].astype(np.int32), nbytes=g[:, 8].astype(np.int64))
    host = HostCalls(ts=h[:, 0].copy(), dur=h[:, 1].copy(), corr=h[:, 2].astype(np.int64), tid=h[:, 3].astype(np.int64),
                     name=h[:, 4].astype(np.int32), ext=h[:, 5].astype(np.int64))
    hta = HtaEvents(ts=t[:, 0].copy(), dur=t[:, 1].copy(), stream=t[:, 2].astype(np.int64),
                    corr=t[:, 3].astype(np.int64), name=t[:, 4].astype(np.int32))
    ops = tuple(sorted((OpStat(n, int(v[0]), float(v[1])) for n, v in cols.ops.items()),
                       key=lambda o: -o.total_us))
    op_ext = np.concatenate(cols.op_ext) if cols.op_ext else np.zeros((0, 2), dtype=np.int64)
    steps = np.array(cols.steps, dtype=np.float64).reshape(-1, 2)
    span = (cols.host_first, cols.host_last) if cols.host_first <= cols.host_last else None
    return KinetoTrace(
        meta=_meta(doc, cols), names=tuple(cols.names), gpu=gpu, host=host, hta=hta, ops=ops, op_ext=op_ext,
        steps=steps, step_names=len(cols.step_names), cpu_nocorr_first_ts=cols.cpu_nocorr_first, host_span=span,
        events=cols.events, by_cat=tuple(sorted(((str(k), v) for k, v in cols.by_cat.items()), key=lambda kv: -kv[1])),
        problems=tuple(problems), has_trace_events=seen_events,
    )


def open_decompressed(path: str) -> IO[bytes]:
    """The file's bytes, gunzipped when it starts with gzip's magic (whatever its name)."""
    import gzip

    fh = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    head = fh.read(2)
    fh.seek(0)
    if is_gzip(head):
        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    return fh


# -- torch.profiler's memory timeline (``export_memory_timeline_raw``) -------------------------------

# torch/profiler/_memory_profiler.py: _CATEGORY_TO_INDEX follows the order of _CATEGORY_TO_COLORS
MEMORY_CATEGORIES = ("parameter", "optimizer_state", "input", "temporary", "activation", "gradient",
                     "autograd_detail", "unknown")
_MEMORY_RECORD = re.compile(rb"\[\s*\[\s*-?\d+\s*,\s*[1-4]\s*,\s*-?\d+\s*,\s*\d+\s*\]")


@dataclass(frozen=True)
class MemoryTimeline:
    """``[[t_ns, action, bytes, category], …]``: action 1 pre-existing, 2 create, 3 new version
    (two rows: the old version's bytes negative, the new one's positive), 4 destroy (negative)."""

    records: int
    peak_bytes: int
    peak_t_ns: int  # -1: the peak is the memory that existed before the profile started
    peak_by_category: tuple[tuple[str, int], ...]
    span_ns: int


def looks_like_memory_timeline(head: bytes) -> bool:
    return _MEMORY_RECORD.match(head.lstrip()) is not None


def read_memory_timeline(stream: IO[bytes]) -> MemoryTimeline:
    """Replay the records in order; the peak of live bytes and its split by category."""
    try:
        rows = msgspec.json.decode(stream.read(), type=list[tuple[int, int, int, int]])
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise KinetoError(f"not a memory-timeline record list ({exc})") from None
    live = [0] * len(MEMORY_CATEGORIES)
    total = peak = 0
    peak_t = -1
    at_peak = tuple(live)
    times = [t for t, _, _, _ in rows if t >= 0]
    for t, _action, nbytes, cat in rows:
        c = cat if 0 <= cat < len(live) else len(live) - 1
        live[c] += nbytes
        total += nbytes
        if total > peak:
            peak, peak_t, at_peak = total, t, tuple(live)
    return MemoryTimeline(
        records=len(rows), peak_bytes=peak, peak_t_ns=peak_t,
        peak_by_category=tuple((n, b) for n, b in zip(MEMORY_CATEGORIES, at_peak, strict=True) if b > 0),
        span_ns=(max(times) - min(times)) if times else 0,
    )
