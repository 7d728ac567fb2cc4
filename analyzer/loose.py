"""Loose evidence: any text an incident leaves behind, its kind sniffed from content.

One streaming pass: every cleaned line is offered to every ``TextSource``; each source decides
for itself which lines are its own (a file may mix kinds: an OOM traceback inside an engine log).
A source that matched nothing contributes nothing; an input no source recognised is listed as
``unknown`` with the reason, never a crash.

To add a kind: write the parser in ``collectors/`` and a ``TextSource`` in ``analyzer/derive/``,
and list its module in ``SOURCE_MODULES``.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Protocol

from analyzer.derive import bench, compile_log, engine_log, nsys_stats, nvsmi, oom, probe_state, prom, timing
from analyzer.model import Evidence, InputRecord
from collectors.logtext import clean_lines, iter_text_lines, looks_binary


class TextSource(Protocol):
    """A consumer of cleaned log lines that turns the lines it recognises into evidence."""

    kind: str

    def feed(self, line: str) -> None:
        """Offer one cleaned line; ignore it if it is not this source's."""

    def matched(self) -> bool:
        """Whether any line was recognised."""

    def evidence(self, source: str) -> list[Evidence]:
        """The evidence derived from the recognised lines, each tagged with ``source``."""

    def problems(self) -> list[str]:
        """Why the recognised part is only partial (truncated message, …); empty when whole."""


# Each module exposes ``sources() -> list[TextSource]`` (fresh instances per input).
SOURCE_MODULES: tuple[Callable[[], Sequence[TextSource]], ...] = (
    probe_state.sources,  # first: the allocator's own numbers beat the numbers in an OOM message
    oom.sources,
    compile_log.sources,
    timing.sources,
    nvsmi.sources,
    engine_log.sources,
    prom.sources,
    bench.sources,
    nsys_stats.sources,
)


@dataclass
class LooseResult:
    evidence: list[Evidence] = field(default_factory=list)
    inputs: list[InputRecord] = field(default_factory=list)


def new_sources() -> list[TextSource]:
    out: list[TextSource] = []
    for factory in SOURCE_MODULES:
        out.extend(factory())
    return out


def analyze_lines(name: str, raw_lines: Iterable[str]) -> LooseResult:
    """Run every text source over ``raw_lines`` (physical lines, newline optional)."""
    sources = new_sources()
    n = 0
    for line in clean_lines(raw_lines):
        n += 1
        for src in sources:
            src.feed(line)
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


SQLITE_MAGIC = b"SQLite format 3\x00"
NSYS_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
PICKLE_MAGIC = b"\x80"  # pickle protocol >= 2: a torch.cuda.memory._dump_snapshot file


def analyze_stream(name: str, stream: BinaryIO) -> LooseResult:
    head = stream.peek(8192) if isinstance(stream, io.BufferedReader) else b""
    if head.startswith(SQLITE_MAGIC):
        why = "an SQLite database (an Nsight Systems export?) cannot be read from a stream; pass its path"
        return LooseResult(inputs=[InputRecord(name, "sqlite", "unreadable", why)])
    if head and looks_binary(head):
        return LooseResult(inputs=[InputRecord(name, "binary", "unreadable", "binary content, not a log")])
    return analyze_lines(name, iter_text_lines(stream))


def analyze_path(path: str) -> LooseResult:
    """A file (or ``-`` for stdin) of loose evidence."""
    if path == "-":
        return analyze_stream("<stdin>", sys.stdin.buffer)
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
        is_sqlite = head == SQLITE_MAGIC
        if head[:1] == PICKLE_MAGIC:
            from analyzer.derive import snapshot  # CUDA memory snapshot, read by a restricted unpickler

            evidence, record = snapshot.analyze_snapshot(path)
            return LooseResult(evidence, [record])
        if is_sqlite or path.endswith(NSYS_REPORT_SUFFIXES):
            from analyzer.derive import nsys  # sqlite3 + numpy, loaded only for an Nsight Systems export

            evidence, record = nsys.analyze_export(path)
            return LooseResult(evidence, [record])
        with open(path, "rb") as fh:
            return analyze_stream(path, fh)
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        why = exc.strerror or str(exc)
        return LooseResult(inputs=[InputRecord(path, "unknown", "unreadable", why)])

