"""Inputs that are whole documents, not lines: which reader an input needs, decided by content.

``diagnose analyze`` asks this module first. A PyTorch-profiler trace (JSON, plain or compressed),
torch.profiler's memory timeline, a CUDA memory snapshot (pickle) and an Nsight Systems export
(SQLite, or a ``.nsys-rep``) each go to their own reader, imported only then; what is none of
these is text, for ``diagnose.loose`` and its line parsers. Nothing here imports those parsers: a
trace is read without paying for them (they are most of a text run's start-up).

A trace is recognised by the structure of its head (``diagnose.collectors.kineto.trace_head``): the top-level
keys of the JSON object are walked until one is Kineto's. When the head does not yet decide (a
``metadata`` object of tens of KiB written before ``traceEvents``), more is read, doubling, up to
``SNIFF_MAX_BYTES``; on a stream (stdin) the bytes read to decide are replayed to the reader.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import BinaryIO, cast

from diagnose.collectors.logtext import DECOMPRESS_ERRORS, compression_of, decompressed, looks_binary
from diagnose.model import Evidence, InputRecord

SQLITE_MAGIC = b"SQLite format 3\x00"
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
PICKLE_MAGIC = b"\x80"  # pickle protocol >= 2: a torch.cuda.memory._dump_snapshot file
PEEK_BYTES = 8192  # what a buffered stream shows without reading
SNIFF_BYTES = 64 << 10  # a file's first decompressed bytes read to decide whether it is a trace
SNIFF_MAX_BYTES = 16 << 20  # the most read to decide (a trace's metadata before its events is KiBs)
TRACE_KIND = "kineto_trace"  # diagnose.derive.kineto.KIND, named here so a text input imports nothing
MEMORY_KIND = "torch_memory_timeline"

Found = tuple[list[Evidence], list[InputRecord]]


def peek(stream: BinaryIO, n: int = PEEK_BYTES) -> bytes:
    """Up to ``n`` bytes at the stream's position, not consumed (a buffered reader's buffer)."""
    return stream.peek(n)[:n] if isinstance(stream, io.BufferedReader) else b""


def _json_like(head: bytes) -> bool:
    return head.lstrip().startswith((b"{", b"[[", b"\xef\xbb\xbf"))


def trace_kind(head: bytes, final: bool = True) -> str | None:
    """``kineto_trace`` / ``torch_memory_timeline`` when decompressed ``head`` opens one, else None
    (``diagnose.collectors.kineto`` is imported only for JSON-looking heads). ``final=False``: "undecided"
    is returned as ``"?"`` (more of the input decides)."""
    if not _json_like(head):
        return None
    from diagnose.collectors import kineto

    opens = kineto.trace_head(head)
    if opens:
        return TRACE_KIND
    if kineto.looks_like_memory_timeline(head):
        return MEMORY_KIND
    return "?" if opens is None and not final else None


def _decide(head: bytes, read: Callable[[int], bytes]) -> tuple[bytes, str | None]:
    """Grow ``head`` with ``read(n)`` (doubling, to ``SNIFF_MAX_BYTES``) until its kind is decided."""
    kind = trace_kind(head, final=False)
    while kind == "?" and len(head) < SNIFF_MAX_BYTES:
        try:
            more = read(max(len(head), SNIFF_BYTES))
        except DECOMPRESS_ERRORS:  # damaged compression: the reader says so when it gets there
            more = b""
        if not more:
            break
        head += more
        kind = trace_kind(head, final=False)
    return head, (None if kind == "?" else kind)


def file_trace_kind(path: str) -> str | None:
    """The trace kind of a plain or gzip file (``trace_kind``), read as far as needed to decide."""
    from diagnose.collectors import kineto

    with open(path, "rb") as raw:
        magic = raw.read(2)
    if compression_of(magic) not in (None, "gzip"):
        return None  # bz2/xz/zstd: recognised on the stream path (loose.analyze_stream)
    fh = kineto.open_decompressed(path)
    try:
        try:
            head = fh.read(SNIFF_BYTES)
        except DECOMPRESS_ERRORS:
            return None
        return _decide(head, fh.read)[1]
    finally:
        fh.close()


def read_path(path: str) -> Found | None:
    """Evidence and input record of a document file (snapshot, trace, memory timeline, Nsight export);
    None when the file is text (``diagnose.loose`` reads it)."""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(len(SQLITE_MAGIC))
        if magic[:1] == PICKLE_MAGIC:
            from diagnose.derive import snapshot  # CUDA memory snapshot, read by a restricted unpickler

            evidence, record = snapshot.analyze_snapshot(path)
            return evidence, [record]
        kind = file_trace_kind(path)
        if kind is not None:  # a PyTorch-profiler trace (.json / .json.gz), before the line-based sources
            from diagnose.derive import kineto

            evidence, record = kineto.analyze_path(path, kind=kind)
            return evidence, [record]
        if magic == SQLITE_MAGIC or path.endswith(NSYS_REPORT_SUFFIXES):
            from diagnose.derive import nsys  # sqlite3 + numpy, loaded only for an Nsight Systems export

            evidence, record = nsys.analyze_export(path)
            return evidence, [record]
        return None
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        return [], [InputRecord(path, "unknown", "unreadable", exc.strerror or str(exc))]


class _Replay(io.RawIOBase):
    """``prefix`` (bytes already read from ``rest`` to decide its kind), then the rest of ``rest``."""

    def __init__(self, prefix: bytes, rest: BinaryIO) -> None:
        self.prefix = memoryview(prefix)
        self.rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        if self.prefix.nbytes:
            n = min(len(buffer), self.prefix.nbytes)
            buffer[:n] = self.prefix[:n]
            self.prefix = self.prefix[n:]
            return n
        data = self.rest.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def read_stream(name: str, stream: BinaryIO) -> tuple[Found | None, BinaryIO, str | None]:
    """A stream's kind by content: (evidence and record of a document, or None for text; the stream
    to read the text from, decompressed, from its first byte; its compression or None)."""
    head = peek(stream)
    compression = compression_of(head)
    if compression is not None:
        try:
            stream = io.BufferedReader(cast(io.RawIOBase, decompressed(stream, compression)))
            head = peek(stream)
        except DECOMPRESS_ERRORS as exc:  # a header that reads, then a deflate stream that does not: zlib.error
            why = f"{compression} stream unreadable: {exc}"
            return ([], [InputRecord(name, compression, "unreadable", why)]), stream, compression
    kind = trace_kind(head, final=False)
    if kind == "?":  # a JSON object whose first keys do not decide yet: read on (bounded), then replay
        try:
            first = stream.read(SNIFF_BYTES)
        except DECOMPRESS_ERRORS:
            first = b""
        head, kind = _decide(first, stream.read)
        stream = io.BufferedReader(_Replay(head, stream))
    if kind is not None:  # a PyTorch-profiler trace: a JSON document, not lines (analyzer/derive/kineto.py)
        from diagnose.derive import kineto

        evidence, record = kineto.analyze_stream(stream, name, kind)
        return (evidence, [record]), stream, compression
    if head.startswith(SQLITE_MAGIC):
        why = "an SQLite database (an Nsight Systems export?) cannot be read from a stream; pass its path"
        return ([], [InputRecord(name, "sqlite", "unreadable", why)]), stream, compression
    if head and looks_binary(head):
        what = f"binary content inside the {compression} stream" if compression else "binary content"
        return ([], [InputRecord(name, "binary", "unreadable", f"{what}, not a log")]), stream, compression
    return None, stream, compression
