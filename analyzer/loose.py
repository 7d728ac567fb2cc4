"""Loose evidence: any text an incident leaves behind, its kind sniffed from content.

Every cleaned line is offered to the ``TextSource`` objects that may want it; each source decides
for itself which lines are its own (a file may mix kinds: an OOM traceback inside an engine log).
A source that matched nothing contributes nothing; an input no source recognised is listed as
``unknown`` with the reason, never a crash.

Reading is one streaming pass in bounded memory, fast on multi-GB service logs:

* the **head** of an input (its first ``HEAD_BYTES``) is what people paste into a ticket: every
  line of it goes to every source, tables, prose and all;
* past the head, a service log is mostly lines no parser wants. One pre-filter decides which lines
  any source could want: a multi-pattern scan (Aho-Corasick, one pass over the bytes) for each
  source's ``triggers``, the literal anchors its line recognisers test for anyway. Only the lines
  holding one (with ``context`` lines before and after, for multi-line records such as a traceback
  above an OOM message) are decoded, cleaned and fed to that source. Sources without triggers
  (tables, prose, pasted benchmark output) read the head only.
* compressed inputs (rotated ``service.log.1.gz``, ``.bz2``, ``.xz``, ``.zst``) are recognised by
  their magic bytes and streamed, on stdin too.

To add a kind: write the parser in ``collectors/`` and a ``TextSource`` in ``analyzer/derive/``
(with its ``triggers``), and list its module in ``SOURCE_MODULES``.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import chain
from typing import BinaryIO, Protocol, cast

import numpy as np

from diagnose import documents
from diagnose.collectors.logtext import (
    DECOMPRESS_ERRORS,
    MAX_LINE_CHARS,
    clean_lines,
    compression_of,
    decompressed,
    iter_text_lines,
    split_glued,
    strip_prefixes,
)
from diagnose.derive import (
    bench,
    claims,
    compile_log,
    dcgm,
    engine_log,
    kernel_oom,
    llamacpp,
    memtrace,
    nsys_stats,
    nvsmi,
    ollama,
    oom,
    probe_state,
    prom,
    pstats_table,
    pyspy_top,
    timing,
    torch_profiler_table,
    trtllm_stats,
)
from diagnose.model import Evidence, InputRecord

Trigger = str | tuple[str, int, int]  # a literal, or (literal, context lines before, lines after)


class TextSource(Protocol):
    """A consumer of cleaned log lines that turns the lines it recognises into evidence.

    ``triggers``: past the head of an input, a line is offered only when it holds one of these
    literal substrings; a trigger given as ``(literal, before, after)`` also brings that many lines
    before and after (a traceback above an OOM message, the rows under a table's title). Empty: the
    source reads the head only. A trigger list must cover every line ``feed`` acts on, except in a
    source marked ``free_text = True``: it reads tables and prose in the head and, past it, only the
    machine format its triggers name (a stage-timing JSONL log). ``triggers`` is read once the head
    has been fed, so a source may ask for more then: the nvidia-smi sources ask for every line (a
    newline) when the head ends inside a series whose rows carry no literal (tests/unit/test_nvsmi.py).
    """

    kind: str

    @property
    def triggers(self) -> tuple[Trigger, ...]: ...

    def feed(self, line: str) -> None:
        """Offer one cleaned line; ignore it if it is not this source's."""

    def matched(self) -> bool:
        """Whether any line was recognised."""

    def evidence(self, source: str) -> list[Evidence]:
        """The evidence derived from the recognised lines, each tagged with ``source``."""

    def problems(self) -> list[str]:
        """Why the recognised part is only partial (truncated message, …); empty when whole."""


class RawLinesSource(TextSource, Protocol):
    """A source that takes the tail's wanted lines as they stand (not cleaned), a block at a time,
    because it can read many of them at once faster than one by one (``feed_raw``); it cleans
    whatever it reads line by line itself (``diagnose.collectors.logtext.clean_lines``)."""

    def feed_raw(self, lines: list[str]) -> None:
        """Physical lines, in order."""


# Each module exposes ``sources() -> list[TextSource]`` (fresh instances per input).
SOURCE_MODULES: tuple[Callable[[], Sequence[TextSource]], ...] = (
    probe_state.sources,  # first: the allocator's own numbers beat the numbers in an OOM message
    oom.sources,
    kernel_oom.sources,
    compile_log.sources,
    timing.sources,
    nvsmi.sources,
    dcgm.sources,
    engine_log.sources,
    llamacpp.sources,
    memtrace.sources,
    ollama.sources,
    trtllm_stats.sources,
    prom.sources,
    bench.sources,
    nsys_stats.sources,
    torch_profiler_table.sources,
    pstats_table.sources,
    pyspy_top.sources,
    claims.sources,  # last: what the text says, when no format above could measure it
)

# Prometheus text exposition (an engine's /metrics, a DCGM exporter's): the scrapes diagnose took itself
# (``metrics-N.prom``, the watcher's ring) are read by the sources of that format alone. Every other
# source reading them found nothing and cost 20 times the parse (the watcher's 120-s ring of vLLM scrapes,
# 750 KB: 1.06 CPU s, 0.05 s by these two), and on a host the engine saturates the session waits for it.
EXPOSITION_MODULES: tuple[Callable[[], Sequence[TextSource]], ...] = (dcgm.sources, prom.sources)

HEAD_BYTES = 512 * 1024  # pasted evidence (a ticket, an issue: ≤ 64 KiB a comment) fits; every source reads it all
CHUNK_BYTES = 1 << 20  # the tail is scanned a MiB at a time
CARRY_BYTES = 256 * 1024  # bytes kept from the previous chunk for context lines before a trigger


@dataclass
class LooseResult:
    evidence: list[Evidence] = field(default_factory=list)
    inputs: list[InputRecord] = field(default_factory=list)


Modules = Sequence[Callable[[], Sequence[TextSource]]]


def new_sources(modules: Modules = SOURCE_MODULES) -> list[TextSource]:
    out: list[TextSource] = []
    for factory in modules:
        out.extend(factory())
    return out


def _triggers(src: TextSource) -> list[tuple[str, int, int]]:
    """(literal, lines before, lines after) for each of a source's triggers."""
    return [(t, 0, 0) if isinstance(t, str) else t for t in getattr(src, "triggers", ())]


class _Scanner:
    """Finds every trigger of every source in a chunk of bytes in one pass."""

    def __init__(self, patterns: Sequence[bytes]) -> None:
        self.patterns = list(patterns)
        self._ac = None
        if self.patterns:
            try:
                import ahocorasick_rs

                # a DFA: about twice the default automaton's speed on a big log's bytes (log_throughput.py);
                # its size is bounded by the ~130 short trigger literals
                self._ac = ahocorasick_rs.BytesAhoCorasick(self.patterns,
                                                           implementation=ahocorasick_rs.Implementation.DFA)
            except ImportError:  # pragma: no cover - a declared dependency; the fallback keeps it working
                self._ac = None

    def find(self, data: bytes) -> np.ndarray:
        """(pattern index, start offset) of every occurrence, overlapping ones included: an (n, 2) array."""
        if not self.patterns:
            return _NO_HITS
        if self._ac is not None:
            raw = self._ac.find_matches_as_indexes(data, overlapping=True)  # (pattern, start, end) tuples
            # flattened straight into an array: a third of the time np.asarray takes on the tuples
            return np.fromiter(chain.from_iterable(raw), np.int64, 3 * len(raw)).reshape(-1, 3)[:, :2]
        return np.asarray(scan_with_find(self.patterns, data), dtype=np.int64).reshape(-1, 2)


_NO_HITS = np.zeros((0, 2), dtype=np.int64)


def scan_with_find(patterns: Sequence[bytes], data: bytes) -> list[tuple[int, int]]:
    """The scanner's plain-Python equivalent: one ``bytes.find`` pass per pattern."""
    out: list[tuple[int, int]] = []
    for p, pat in enumerate(patterns):
        i = data.find(pat)
        while i >= 0:
            out.append((p, i))
            i = data.find(pat, i + 1)
    return out


@dataclass
class _Hits:
    """What ``_Tail.scan`` found in a block: the lines wanted alone, source by source, and the context hits."""

    lo: np.ndarray  # start of each wanted line, grouped by source (source i: [bounds[i], bounds[i + 1]))
    hi: np.ndarray  # its end (past its newline)
    bounds: list[int]  # empty when no source wants a line alone
    context: list[list[int]]  # [pattern, start] of every hit whose line a source wants with context

    @classmethod
    def none(cls) -> _Hits:
        empty = np.zeros(0, dtype=np.int64)
        return cls(empty, empty, [], [])


class _Tail:
    """Feeds the sources the triggered lines (with context) of everything past the head."""

    def __init__(self, sources: Sequence[TextSource], scanner: type[_Scanner] = _Scanner) -> None:
        self.sources = sources
        # each distinct literal → the sources it serves, with the context each wants
        patterns: dict[bytes, list[tuple[int, int, int]]] = {}
        for i, src in enumerate(sources):
            for lit, before, after in _triggers(src):
                patterns.setdefault(lit.encode("utf-8"), []).append((i, before, after))
        self.owners = list(patterns.values())
        self.scanner = scanner(list(patterns))
        # which pattern wants its line alone for which source (mapped in bulk), and which want context
        self.plain = np.zeros((len(self.owners), len(sources)), dtype=bool)
        for p, owners in enumerate(self.owners):
            for i, before, after in owners:
                if not (before or after):
                    self.plain[p, i] = True
        self.with_context = np.array([any(b or a for _, b, a in owners) for owners in self.owners], dtype=bool)
        self.raw_feeds: list[Callable[[list[str]], None] | None] = [getattr(s, "feed_raw", None) for s in sources]
        self.fed_until = [0] * len(sources)  # global byte offset up to which each source has been fed
        self.after_pending = [0] * len(sources)  # context lines still owed from the previous chunk
        self.lines = 0

    def scan(self, new: bytes, hits: np.ndarray | None = None) -> _Hits:
        """The trigger hits in ``new`` (whole lines: it starts and ends at a line's end) and the line each
        source wants for them.

        ``hits``: the scanner's hits in ``new`` when the caller has them already."""
        if hits is None:
            hits = self.scanner.find(new)
        if not hits.size:
            return _Hits.none()
        # every line's end: line k runs from ends[k-1] + 1 to ends[k] (its newline) inclusive
        ends = np.flatnonzero(np.frombuffer(new, dtype=np.uint8) == 0x0A)
        line = np.searchsorted(ends, hits[:, 1])
        hit, src = np.nonzero(self.plain[hits[:, 0]])  # (hit, source) for every source a hit serves alone
        per = ends.size + 1
        key = np.unique(src * per + line[hit])  # each source's lines once, in order
        src, k = np.divmod(key, per)
        lo = np.where(k > 0, ends[np.maximum(k - 1, 0)] + 1, 0)
        hi = np.where(k < ends.size, ends[np.minimum(k, ends.size - 1)] + 1, len(new))
        bounds = np.searchsorted(src, np.arange(len(self.sources) + 1)).tolist()
        context = hits[self.with_context[hits[:, 0]]].tolist()
        return _Hits(lo, hi, bounds, context)

    def chunk(self, buf: bytes, base: int, new_from: int, found: np.ndarray | None = None) -> None:
        """``buf`` ends at a line end; ``base`` is its global offset; bytes from ``new_from`` are new.

        ``found``: the scanner's hits in the new bytes when the caller has scanned them already."""
        n = len(self.sources)
        spans: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for i, owed in enumerate(self.after_pending):
            if owed:
                end = _forward(buf, new_from, owed)
                spans[i].append((new_from, end))
                self.after_pending[i] = 0 if end < len(buf) else owed - buf.count(b"\n", new_from, end)
        hits = self.scan(buf[new_from:] if new_from else buf, found)
        for p, start in hits.context:
            self._context(buf, p, start + new_from, spans)
        text = buf.decode("ascii") if buf.isascii() else None  # byte offsets are str offsets then
        bounds = hits.bounds
        for i in range(n):
            a, b = (bounds[i], bounds[i + 1]) if bounds else (0, 0)
            if b > a:
                lo, hi = hits.lo[a:b] + new_from, hits.hi[a:b] + new_from
                feed_raw = self.raw_feeds[i]
                if not spans[i] and text is not None and feed_raw is not None and lo[0] >= self.fed_until[i] - base:
                    self._feed_lines(i, feed_raw, buf, text, base, lo, hi)
                    continue
                spans[i].extend(zip(lo.tolist(), hi.tolist(), strict=True))
            if spans[i]:
                self._feed(i, buf, text, base, spans[i])

    def _feed_lines(self, i: int, feed_raw: Callable[[list[str]], None], buf: bytes, text: str, base: int,
                    lo: np.ndarray, hi: np.ndarray) -> None:
        """``_feed`` for the common case, in bulk: whole lines (``lo``/``hi``: sorted, one line each,
        none fed yet) of ASCII text to a source that reads lines as they stand (``feed_raw``)."""
        ends = hi - (np.frombuffer(buf, dtype=np.uint8)[hi - 1] == 0x0A)  # without their newlines
        ends = np.minimum(ends, lo + MAX_LINE_CHARS)
        lines = [text[x:y] for x, y in zip(lo.tolist(), ends.tolist(), strict=True)]
        self.lines += len(lines)
        feed_raw(lines)
        self.fed_until[i] = base + int(hi[-1])

    def _context(self, buf: bytes, p: int, start: int, spans: list[list[tuple[int, int]]]) -> None:
        line_start = buf.rfind(b"\n", 0, start) + 1
        line_end = buf.find(b"\n", start)
        line_end = len(buf) if line_end < 0 else line_end + 1
        for i, before, after in self.owners[p]:
            if not (before or after):
                continue
            lo = _backward(buf, line_start, before) if before else line_start
            hi = _forward(buf, line_end, after) if after else line_end
            if after and hi >= len(buf):
                self.after_pending[i] = max(self.after_pending[i], after - buf.count(b"\n", line_end, len(buf)))
            spans[i].append((lo, hi))

    def _feed(self, i: int, buf: bytes, text: str | None, base: int, spans: list[tuple[int, int]]) -> None:
        src = self.sources[i]
        raw_feed = getattr(src, "feed_raw", None)
        feed = src.feed
        block: list[str] = []
        spans.sort()
        done = self.fed_until[i] - base  # bytes of `buf` before this were fed already
        for lo, hi in spans:
            lo = max(lo, done)
            if lo >= hi:
                continue
            done = hi
            if buf[hi - 1] == 0x0A:  # drop the last line's newline: no empty line after it
                hi -= 1
            chunk = text[lo:hi] if text is not None else buf[lo:hi].decode("utf-8", errors="replace")
            if raw_feed is not None:
                block.extend(chunk.split("\n"))
                continue
            # the same cleaning as clean_lines, inlined: this loop runs for every wanted line
            for raw in chunk.split("\n") if "\n" in chunk else (chunk,):
                for part in split_glued(raw[:MAX_LINE_CHARS]):
                    self.lines += 1
                    feed(strip_prefixes(part).rstrip())
        if block and raw_feed is not None:
            self.lines += len(block)
            raw_feed([ln[:MAX_LINE_CHARS] for ln in block])
        self.fed_until[i] = base + done


def _forward(buf: bytes, pos: int, lines: int) -> int:
    """The offset just past ``lines`` more lines from ``pos`` (bounded by the buffer)."""
    for _ in range(lines):
        nxt = buf.find(b"\n", pos)
        if nxt < 0:
            return len(buf)
        pos = nxt + 1
    return pos


def _backward(buf: bytes, line_start: int, lines: int) -> int:
    """The start of the line ``lines`` lines before the one starting at ``line_start``."""
    pos = line_start
    for _ in range(lines):
        if pos <= 0:
            return 0
        pos = buf.rfind(b"\n", 0, pos - 1) + 1
    return pos


class _TailReader:
    """The tail's blocks: whole lines of about ``CHUNK_BYTES``, each with the scanner's hits in it."""

    def __init__(self, stream: BinaryIO, pending: bytes, find: Callable[[bytes], np.ndarray]) -> None:
        self.stream = stream
        self.pending = pending  # bytes read past the last line end
        self.find = find

    def next_block(self) -> tuple[bytes, np.ndarray] | None:
        """The next block (ending at a line end, or the input's end) and its hits; None at the end."""
        while True:
            chunk = self.stream.read(CHUNK_BYTES)
            if not chunk:
                if not self.pending:
                    return None
                data, self.pending = self.pending + b"\n", b""
                return data, self.find(data)
            data = self.pending + chunk
            cut = data.rfind(b"\n") + 1
            if cut == 0 and len(data) < MAX_LINE_CHARS * 4:
                self.pending = data
                continue
            if cut == 0:  # a line with no end: take what there is
                cut = len(data)
            self.pending = data[cut:]
            new = data[:cut]
            return new, self.find(new)


def read_into(sources: Sequence[TextSource], stream: BinaryIO, head_bytes: int = HEAD_BYTES) -> int:
    """Stream ``stream`` into ``sources`` (head to all, tail by trigger); the number of lines read."""
    n = 0
    consumed = 0
    pending = b""
    # -- the head: every line to every source -----------------------------------------------------
    eof = False
    while consumed < head_bytes and not eof:
        chunk = stream.read(min(CHUNK_BYTES, head_bytes - consumed))
        eof = not chunk
        consumed += len(chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        if eof or len(pending) > MAX_LINE_CHARS * 4:
            lines.append(pending[: MAX_LINE_CHARS * 4])
            pending = b""
        for raw in lines:
            for line in clean_lines((raw[: MAX_LINE_CHARS * 4].decode("utf-8", errors="replace"),)):
                n += 1
                for src in sources:
                    src.feed(line)
    if eof:
        return n
    # -- the tail: triggered lines only -------------------------------------------------------------
    tail = _Tail(sources)
    base = consumed - len(pending)  # global offset of `pending`'s first byte
    for i in range(len(sources)):
        tail.fed_until[i] = base
    reader = _TailReader(stream, pending, tail.scanner.find)
    carry = b""
    # One block ahead: a worker thread reads and scans the next block (both release the GIL) while
    # this thread feeds the sources the current one; the blocks arrive in order. The worker does
    # nothing else: every step that holds the GIL there would stall on this busy thread (measured:
    # mapping the hits to lines there made the whole 40 % slower).
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="diagnose-scan") as pool:
        ahead = pool.submit(reader.next_block)
        while True:
            block = ahead.result()  # the worker's exception (a damaged compressed stream) is raised here
            if block is None:
                break
            ahead = pool.submit(reader.next_block)
            new, found = block
            buf = carry + new
            tail.chunk(buf, base - len(carry), len(carry), found)
            base += len(new)
            carry = buf[-CARRY_BYTES:] if len(buf) > CARRY_BYTES else buf
            carry = carry[carry.find(b"\n") + 1:] if len(buf) > CARRY_BYTES else carry
    return n + tail.lines


def _result(name: str, sources: Sequence[TextSource], n: int) -> LooseResult:
    matched = [s for s in sources if s.matched()]
    result = LooseResult()
    if not matched:
        why = "empty input" if n == 0 else "no known evidence format was recognised in it"
        result.inputs.append(InputRecord(name, "unknown", "unreadable", why))
        return result
    problems: list[str] = []
    for s in matched:
        result.evidence.extend(s.evidence(name))
        problems.extend(s.problems())
    kinds = "+".join(dict.fromkeys(s.kind for s in matched))
    status = "partial" if problems else "ok"
    result.inputs.append(InputRecord(name, kinds, status, "; ".join(problems)))
    return result


def analyze_lines(name: str, raw_lines: Iterable[str]) -> LooseResult:
    """Run every text source over ``raw_lines`` (physical lines, newline optional), all of them."""
    sources = new_sources()
    n = 0
    for line in clean_lines(raw_lines):
        n += 1
        for src in sources:
            src.feed(line)
    return _result(name, sources, n)


def analyze_stream(name: str, stream: BinaryIO, head_bytes: int = HEAD_BYTES,
                   extra: Sequence[TextSource] = (), modules: Modules = SOURCE_MODULES) -> LooseResult:
    """A stream of loose evidence: a document (trace, SQLite, binary) by ``diagnose.documents``, else text."""
    found, stream, kind = documents.read_stream(name, stream)
    if found is not None:
        return LooseResult(*found)
    return read_text(name, stream, kind, head_bytes, extra, modules)


def read_text(name: str, stream: BinaryIO, kind: str | None = None, head_bytes: int = HEAD_BYTES,
              extra: Sequence[TextSource] = (), modules: Modules = SOURCE_MODULES) -> LooseResult:
    """Text (already decompressed from ``kind``, which names the compression for messages) through every source
    (of ``modules``: ``EXPOSITION_MODULES`` for a file known to be Prometheus text).

    ``extra``: more sources fed in the same pass whose results the caller takes from them (the session's
    time series, ``diagnose.derive.series``); they add nothing to the result."""
    sources = new_sources(modules)
    try:
        n = read_into([*sources, *extra], stream, head_bytes)
    except DECOMPRESS_ERRORS as exc:
        if kind is None:
            raise
        res = _result(name, sources, 1)
        why = f"the {kind} stream is damaged or cut short ({exc}); what came before was read"
        return LooseResult(res.evidence, [InputRecord(name, res.inputs[0].kind if res.evidence else kind,
                                                      "partial" if res.evidence else "unreadable", why)])
    return _result(name, sources, n)


def analyze_path(path: str, extra: Sequence[TextSource] = (), modules: Modules = SOURCE_MODULES) -> LooseResult:
    """A file (or ``-`` for stdin) of loose evidence (``extra``, ``modules``: see ``read_text``; fed only when it
    is text)."""
    if path == "-":
        return analyze_stream("<stdin>", sys.stdin.buffer, extra=extra, modules=modules)
    found = documents.read_path(path)  # snapshots, traces and Nsight exports before the line-based sources
    if found is not None:
        return LooseResult(*found)
    return read_text_file(path, extra, modules)


def read_text_file(path: str, extra: Sequence[TextSource] = (), modules: Modules = SOURCE_MODULES) -> LooseResult:
    """A file ``documents.read_path`` found to be no document: text, possibly compressed."""
    try:
        with open(path, "rb") as fh:
            return analyze_stream(path, fh, extra=extra, modules=modules)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        why = exc.strerror or str(exc)
        return LooseResult(inputs=[InputRecord(path, "unknown", "unreadable", why)])


def iter_lines(stream: BinaryIO) -> Iterator[str]:
    """Physical lines of a (possibly compressed) stream, decoded; for callers that need them all."""
    head = documents.peek(stream)
    kind = compression_of(head)
    if kind is not None:
        stream = io.BufferedReader(cast(io.RawIOBase, decompressed(stream, kind)))
    return iter_text_lines(stream)
