"""Line hygiene for real-world logs: split glued lines, strip container prefixes, stream.

Logs pasted from incidents are messy: progress bars glue several records onto one line,
``docker compose`` prefixes every line with ``vllm  | ``, vLLM V1 adds ``(APIServer pid=…)`` or
``(EngineCore_DP0 pid=…)``, torchrun adds ``[rank0]:``. Every parser reads the lines this module
yields, so each one sees clean records. Reading is streamed in bounded chunks: a multi-GB log is
never held in memory.
"""

from __future__ import annotations

import bz2
import functools
import gzip
import importlib
import io
import lzma
import re
import string
import zlib
from collections.abc import Iterable, Iterator
from typing import BinaryIO, cast

CHUNK_BYTES = 1 << 20
MAX_LINE_CHARS = 64 * 1024  # a longer "line" (binary junk, minified JSON) is cut, not buffered forever

# A log-level token that starts a new record when glued after other text, e.g.
# "...100%|██████| INFO 03-18 12:34:52 llm_engine.py:706] ..." or "...]WARNING 2024-…".
_GLUED = re.compile(
    r"(?<=\S)(?<!\[)\s*(?=(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}\b)"
    r"|(?<=\S)\s+(?=\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}[^\]]*\]\s)"
    r"|\r"
)
# One anchored alternation, tried repeatedly (prefixes nest: "vllm-1  | (APIServer pid=7) …").
_PREFIX = re.compile(
    r"[\w.-]{1,64}\s{1,32}\|\s?"  # docker compose: "vllm-1  | "
    r"|\((?:APIServer|EngineCore[\w-]*|VllmWorker[\w-]*|Worker[\w-]*|RayWorkerWrapper)\s+pid=\d+\)\s*"
    r"|\[rank\d+\]:\s*"
    # llama.cpp's common log: a process id, then minutes.seconds.milliseconds.microseconds since start and a level
    # letter ("[42027] 1.35.716.244 I slot print_timing: …"; the pid tags the record's continuation lines too)
    r"|\[\d{2,7}\]\s+"
    r"|\d{1,5}\.\d\d\.\d{3}\.\d{3}\s+[IWEDT]\s+"
    r"|\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+"  # ISO 8601
    r"|[A-Z][a-z]{2}\s+\d{1,2}\s\d{2}:\d{2}:\d{2}\s+\S+\s+[\w./-]+(?:\[\d+\])?:\s"  # syslog
    # a Markdown quote ("> ") around a log record, as issue threads quote a log: only before a record's own start
    # (a syslog or ISO date, a bracket, key=value time, a level), never before a command or a person's words
    # (a REPL's ">>> " prompt is no quote; a bracket only as a record's: a date, a rank, a tag in capitals)
    r"|>(?!>>)[ \t]?(?=(?:>[ \t]?)*(?:[A-Z][a-z]{2}\s+\d{1,2}\s\d{2}:\d{2}:\d{2}\s|\d{4}-\d{2}-\d{2}[T ]\d{2}:"
    r"|\[(?:\d|rank|[A-Z]{3,}\b)|time=\d"
    r"|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\b))"
)
# a second record may start past the first character: one C-level search instead of six finds
# terminal colour and cursor codes: ESC [ … letter; and the same SGR codes with the ESC lost, as a paste into an
# issue keeps them ("[32mINFO[0m:"), taken only when glued to text on one side (a " [2m 30s]" duration stays)
_SGR = r"\[(?:\d{1,3};){0,4}\d{1,3}m(?!\])"  # "[5m]" is a duration (PromQL's rate(x[5m])), not a code
_ANSI = re.compile(rf"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Za-z0-9]|(?<=\S){_SGR}|{_SGR}(?=\S)")
_GLUE_HINT = re.compile(r"INFO |WARNING |WARN |ERROR |DEBUG |CRITICAL |\r|\[20")


MIN_KEY_CHARS = 3  # a shorter literal is in too many lines to be worth checking first


def required_literals(rx: re.Pattern[str]) -> tuple[str, ...] | None:
    """Literals one of which every match of ``rx`` contains, lower-cased where ``rx`` ignores case: for
    each top-level alternative, its longest run of plain characters. None where an alternative has no run
    of ``MIN_KEY_CHARS`` (or the pattern changes its flags inside): then only the search can tell.

    A match of an alternative contains that alternative's run, so a line holding none of the literals has
    no match: ``Keyed.search`` skips the regex there, exactly (the runs come from the pattern itself, so a
    new alternative cannot be forgotten, as a hand-kept keyword list can)."""
    try:
        sre_c = importlib.import_module("re._constants")
        sre_p = importlib.import_module("re._parser")  # the standard library's own reading of the pattern

        items = list(sre_p.parse(rx.pattern, rx.flags))
    except Exception:
        return None
    while len(items) == 1 and items[0][0] is sre_c.SUBPATTERN:
        _group, add, remove, sub = items[0][1]
        if add or remove:
            return None
        items = list(sub)
    branches = items[0][1][1] if len(items) == 1 and items[0][0] is sre_c.BRANCH else [items]
    fold = bool(rx.flags & re.IGNORECASE)
    keys: list[str] = []
    for branch in branches:
        best, run = "", ""
        for op, av in branch:
            if op is sre_c.SUBPATTERN and (av[1] or av[2]):
                return None
            plain = op is sre_c.LITERAL and not (fold and _folds_to_ascii(chr(av)))
            run = run + chr(av) if plain else ""
            best = run if len(run) > len(best) else best
        if len(best) < MIN_KEY_CHARS:
            return None
        keys.append(best.lower() if fold else best)
    return tuple(dict.fromkeys(keys))


@functools.cache
def _folds_to_ascii(c: str) -> bool:
    """A character other than ASCII that an ignore-case regex matches to an ASCII letter (``ſ`` to s, ``ı`` and
    ``İ`` to i, the Kelvin sign to k): its lower case is not what the line's lower case holds, so it ends a run."""
    return not c.isascii() and any(re.fullmatch(re.escape(c), a, re.IGNORECASE) for a in string.ascii_letters)


class Keyed:
    """A regex searched only in lines that hold one of its ``required_literals``: the same answers, and
    a line without them costs a few substring tests instead of a regex's scan. Where the regex ignores
    case, the test is on the lower-cased line, which is exact for ASCII; a line with other characters
    (whose case the regex engine folds its own way) is always searched."""

    __slots__ = ("fold", "keys", "rx")

    def __init__(self, rx: re.Pattern[str]) -> None:
        self.rx = rx
        self.keys = required_literals(rx)
        self.fold = bool(rx.flags & re.IGNORECASE)

    def search(self, line: str, low: str | None = None) -> re.Match[str] | None:
        """``rx.search(line)``; ``low``: ``line.lower()``, when the caller has it already."""
        keys = self.keys
        if keys is not None:
            if not self.fold:
                hay = line
            elif line.isascii():
                hay = line.lower() if low is None else low
            else:
                return self.rx.search(line)
            for k in keys:  # a loop: a third cheaper than any() over a generator
                if k in hay:
                    return self.rx.search(line)
            return None
        return self.rx.search(line)


def strip_prefixes(line: str) -> str:
    """Remove container, process and rank prefixes (repeatedly: they nest)."""
    for _ in range(4):
        m = _PREFIX.match(line)
        if m is None or not m.end():
            break
        line = line[m.end():]
    return line


def glue_hint_at(line: str) -> int | None:
    """Where a second record may start in ``line`` (past its first character), or None: one record."""
    m = _GLUE_HINT.search(line, 1)
    return None if m is None else m.start()


def split_glued(line: str) -> list[str]:
    """Split a physical line into records at glued log-level tokens and carriage returns."""
    # A cheap search first: the splitting regex only runs on lines that may hold a second record.
    if _GLUE_HINT.search(line, 1) is None and "\r" not in line[:1]:
        return [line]
    parts = [p for p in _GLUED.split(line) if p and p.strip()]
    return parts or [line]


def strip_ansi(line: str) -> str:
    """``line`` without terminal colour codes (with their ESC, or with it lost in a paste: ``[32mINFO[0m``)."""
    return _ANSI.sub("", line)


def clean_lines(raw_lines: Iterable[str]) -> Iterator[str]:
    """Yield cleaned records from raw physical lines."""
    for raw in raw_lines:
        if len(raw) > MAX_LINE_CHARS:
            raw = raw[:MAX_LINE_CHARS]
        raw = raw.rstrip("\n")
        if "\x1b" in raw or ("m" in raw and "[" in raw):
            raw = strip_ansi(raw)
        for part in split_glued(raw):
            yield strip_prefixes(part).rstrip()


def iter_text_lines(stream: BinaryIO) -> Iterator[str]:
    """Decode a byte stream line by line (UTF-8, bad bytes replaced) in bounded memory."""
    pending = b""
    while True:
        chunk = stream.read(CHUNK_BYTES)
        if not chunk:
            break
        pending += chunk
        lines = pending.split(b"\n")
        pending = lines.pop()
        if len(pending) > MAX_LINE_CHARS * 4:  # a line with no end: cut it
            lines.append(pending[: MAX_LINE_CHARS])
            pending = b""
        for ln in lines:
            yield ln[: MAX_LINE_CHARS * 4].decode("utf-8", errors="replace")
    if pending:
        yield pending[: MAX_LINE_CHARS * 4].decode("utf-8", errors="replace")


def looks_binary(head: bytes) -> bool:
    """True for content that is not text (NUL bytes or mostly control characters)."""
    if not head:
        return False
    if b"\x00" in head[:8192]:
        return True
    sample = head[:8192]
    ctrl = sum(1 for b in sample if b < 9 or 13 < b < 32)
    return ctrl / len(sample) > 0.1


# -- compressed logs: rotated logs arrive as service.log.1.gz, .bz2, .xz or .zst ---------------------
COMPRESSION_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip"),
    (b"BZh", "bzip2"),
    (b"\xfd7zXZ\x00", "xz"),
    (b"\x28\xb5\x2f\xfd", "zstd"),
)


class CompressionError(Exception):
    """A compressed stream that cannot be read (damaged, or zstd without ``zstandard``)."""


def compression_of(head: bytes) -> str | None:
    """The compression a stream starting with ``head`` uses (by its magic bytes), or None."""
    for magic, name in COMPRESSION_MAGIC:
        if head.startswith(magic):
            return name
    return None


def decompressed(stream: BinaryIO, kind: str) -> BinaryIO:
    """A streaming reader of ``stream``'s decompressed bytes (never the whole file in memory)."""
    if kind == "gzip":
        return cast(BinaryIO, gzip.GzipFile(fileobj=stream, mode="rb"))
    if kind == "bzip2":
        return cast(BinaryIO, bz2.BZ2File(stream, mode="rb"))
    if kind == "xz":
        return cast(BinaryIO, lzma.LZMAFile(stream, mode="rb"))
    if kind == "zstd":
        try:
            import zstandard
        except ImportError as exc:
            raise CompressionError("a zstd-compressed log needs the `zstandard` package "
                                   "(pip install zstandard), or decompress it first with `zstd -d`") from exc
        return cast(BinaryIO, io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(stream)))
    raise CompressionError(f"unknown compression {kind}")


DECOMPRESS_ERRORS: tuple[type[BaseException], ...] = (
    OSError, EOFError, lzma.LZMAError, ValueError, CompressionError,
    zlib.error,  # a gzip whose header reads and whose deflate data does not ("invalid distance too far back")
)
