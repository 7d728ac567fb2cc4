"""Serving-engine logs: vLLM (V0 and V1), SGLang and TGI scheduler and request lines.

A pure, streaming parser: ``EngineLogParser.feed(line)`` takes one cleaned log line (see
``diagnose.collectors.logtext``) and keeps running aggregates only, so a multi-GB log is read in bounded
memory. ``EngineLogParser.summary()`` returns a frozen ``EngineLogSummary``.

Recognised lines (one example each; numbers vary, extra fields are ignored):

* vLLM V0 stats: ``Avg prompt throughput: 209.6 tokens/s, Avg generation throughput: 567.4
  tokens/s, Running: 36 reqs, Swapped: 0 reqs, Pending: 78 reqs, GPU KV cache usage: 99.1%, CPU KV
  cache usage: 0.0%``
* vLLM V1 stats: ``Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput:
  45.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.3%, Prefix cache hit
  rate: 0.0%``; V1 names the pool by its device (``CPU KV cache usage`` on the CPU backend, which
  V0 used for its swap space beside the GPU's) and adds ``Preemptions: N`` (this interval) when any
* vLLM preemption: ``Sequence group 12 is preempted by PreemptionMode.RECOMPUTE mode because there
  is not enough KV cache space. … total_num_cumulative_preemption=51``
* configuration: ``max_num_seqs=256``, ``'max_num_seqs': 256``, ``--max-num-seqs 256`` (and the
  same for max_num_batched_tokens); ``Maximum concurrency for 4096 tokens per request: 12.34x``;
  ``# GPU blocks: 7281``; ``GPU KV cache size: 116,496 tokens`` (``CPU KV cache size`` on the CPU backend)
* vLLM ``benchmark_serving`` / ``vllm bench serve`` result block (``==== Serving Benchmark Result
  ====`` … ``Mean TTFT (ms): …`` … ``=====``) and ``benchmark_throughput`` (``Throughput: 10.5
  requests/s, 4313.4 total tokens/s, 2105.5 output tokens/s``)
* SGLang: ``Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00,
  #running-req: 0, #queue-req: 0`` and ``Decode batch. #running-req: 233, #token: 370959, token
  usage: 0.82, gen throughput (token/s): 4594.01, #queue-req: 317`` (token usage is a fraction of
  the KV pool); ``KV cache pool is full. Retract requests. #retracted_reqs: 2``
* grouped stats fields, a label with its keys in parentheses and their values in order (LMDeploy's stats line,
  ``lmdeploy/metrics/loggers.py`` from 2026): ``Avg thr (in/out): 4618.5 / 2756.3 tokens/s, API server
  (completed/routed/waiting): 1 / 50 / 50, Engine (running/waiting): 45 / 5, KV cache: 21.6%``; requests the
  API server holds for a free engine instance wait too, so they add to the engine's waiting ones
* LMDeploy's vLLM-layout stats line (``lmdeploy/metrics/loggers.py``, adapted from vLLM's): the same fields,
  named LMDeploy's by what stands before them (``stats_engine_of``): the ``[2025-07-01 12:00:00 DP0] `` its
  releases print there (v0.9.2 to the grouped line), or, in its development commits of May 2025, its logging
  layout's logger name (``2025-07-01 12:00:00,017 - lmdeploy - INFO - loggers.py:78 - …``) or a ``DP: 0, `` field
* TGI request spans: ``total_time="4.1s" validation_time="1.2ms" queue_time="3.2s"
  inference_time="900ms" time_per_token="45ms"`` and ``Model is overloaded`` rejections; TEI's (text-embeddings-
  inference, the same router design): ``openai_embed{total_time="1.06s" tokenization_time="13.3ms"
  queue_time="626.352µs" inference_time="1.05s"}: text_embeddings_router::http::server: …``
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import operator
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from diagnose.collectors.logtext import clean_lines, split_glued, strip_prefixes
from diagnose.collectors.units import to_ms

MAX_SAMPLES = 100_000  # per-request values kept for percentiles; beyond, a fixed-seed reservoir
BULK_MIN = 32  # fewer lines than this in a block: feed them one by one

# -- vLLM stats lines ----------------------------------------------------------------------------
# "label: value unit" fields, split on ", "; a field is known by how its (lower-cased) label ends.
# V1 "Prefix cache hit rate: 12.0%", V0 "GPU prefix cache hit rate: 12.00%" or
# "Prefix cache hit rate: GPU: 12.00%, CPU: 0.00%"; "External prefix cache hit rate" is not ours.
_V_LABELS: dict[str, str] = {
    "avg prompt throughput": "prompt_tps",
    "avg generation throughput": "gen_tps",
    "running": "running",
    "swapped": "swapped",
    "pending": "waiting",
    "waiting": "waiting",
    "gpu kv cache usage": "kv_pct",
    # V1 names the KV pool by its device ("GPU", "CPU" on the CPU backend, "XPU", "TPU", "HPU"); V0 printed
    # "CPU KV cache usage" beside the GPU's for its swap space: CPU is the pool itself when it is alone
    "cpu kv cache usage": "cpu_kv_pct",
    "xpu kv cache usage": "kv_pct",
    "tpu kv cache usage": "kv_pct",
    "hpu kv cache usage": "kv_pct",
    "npu kv cache usage": "kv_pct",
    "preemptions": "preempted",  # V1: requests preempted in this stats interval (printed when > 0)
    # V1 (0.32): of the waiting ones, those held for something other than room (grammar compilation, remote
    # KV transfer, streaming input, the LoRA budget); printed when > 0, and counted in "Waiting" too
    "deferred": "deferred",
    "prefix cache hit rate": "prefix_pct",
    "gpu prefix cache hit rate": "prefix_pct",
}
_PREEMPT = re.compile(r"is preempted by PreemptionMode\.(\w+)|\bpreempted\b", re.IGNORECASE)
_PREEMPT_CUM = re.compile(r"total_num_cumulative_preemption=(\d+)")
# what starts a metrics comment, an echoed or prompted command, or a JSON record: no preemption event (a
# string test, not the line typer: a log of millions of preemption warnings passes through here)
_NOT_EVENTS = ("#", "+ ", "$ ", "{")

# -- configuration -------------------------------------------------------------------------------
_CONF = re.compile(
    r"(?:--)?\b(max[_-]num[_-]seqs|max[_-]num[_-]batched[_-]tokens|max[_-]running[_-]requests)\b['\"]?"
    r"\s*(?:[=:]\s*|\s+)(\d+)\b"
)
# LMDeploy logs its engine's configuration as a repr: "PytorchEngineConfig(..., max_batch_size=256, ...)" (and
# TurbomindEngineConfig): the most requests it runs at once, like vLLM's max_num_seqs
_LMD_BATCH = re.compile(r"\bmax_batch_size=(\d+)\b")
_MAX_CONC = re.compile(r"Maximum concurrency for\s*([\d,]+)\s*tokens per request:\s*([\d.]+)x")
_GPU_BLOCKS = re.compile(r"#\s*GPU blocks:\s*([\d,]+)")
_KV_TOKENS = re.compile(r"(?:[GCXTHN]PU )?KV cache size:\s*([\d,]+)\s*tokens")  # V1 names its device

# -- vLLM benchmark blocks -----------------------------------------------------------------------
_BENCH_START = re.compile(r"=+\s*Serving Benchmark Result\s*=+")
_BENCH_END = re.compile(r"^=+\s*$")
_BENCH_ROW = re.compile(r"^\s*([A-Za-z][^:]*?)\s*:\s+(-?[\d.,]+|inf)\s*$")
# vLLM names end-to-end latency "E2EL", SGLang's bench_serving "E2E Latency"
_LAT_ROW = re.compile(r"^(Mean|Median|Std|P\d+(?:\.\d+)?)\s+(TTFT|TPOT|ITL|E2EL|E2E Latency)\s*\(ms\)$")
# the load a serving benchmark offered: vLLM's benchmark_serving prints "Traffic request rate: 4.0" (or "inf", every
# request at once) before its result block, SGLang's bench_serving a row of its block
_RATE = r"(inf|\d+(?:\.\d+)?|\.\d+)"
_OFFERED = re.compile(rf"^\s*Traffic request rate:\s*{_RATE}(?![\d.])")
# the cap on requests in flight: vLLM 0.6-0.8 print "Maximum request concurrency: 8" (or None) before the block,
# "--max-concurrency 8" on the command line
_CAP = re.compile(r"^\s*Max(?:imum)? request concurrency:\s*(\d+)\s*$")
_CAP_FLAG = re.compile(r"--max[-_]concurrency(?:=|\s+)(\d+)\b")
# the same asked on the benchmark's command line ("vllm bench serve … --request-rate inf"): the printed rate wins
_OFFERED_FLAG = re.compile(rf"--request[-_]rate(?:=|\s+){_RATE}(?![\d.])")
_BACKEND = re.compile(r"^\s*Backend:\s*([\w.-]+)\s*$")
_THROUGHPUT = re.compile(
    r"^Throughput:\s*([\d.]+)\s*requests/s,\s*([\d.]+)\s*total tokens/s(?:,\s*([\d.]+)\s*output tokens/s)?"
)

# -- SGLang --------------------------------------------------------------------------------------
_SG_BATCH = re.compile(r"\b(Prefill|Decode) batch[.,]")
_SG_FIELD = re.compile(r"#([\w-]+):\s*([\d.]+)")
_SG_USAGE = re.compile(r"\btoken usage:\s*([\d.]+)")
_SG_GEN = re.compile(r"gen throughput \(token/s\):\s*([\d.]+)")
_SG_IN = re.compile(r"input throughput \(token/s\):\s*([\d.]+)")
_SG_RETRACT = re.compile(r"#retracted[_-]reqs?:\s*(\d+)")
# "Label (key/key/...): v / v / ...": one field per key, named "label key" (lower case)
# (a label is a few words: bounded, so a long run of prose before a parenthesis is not scanned back and forth)
_GROUPED = re.compile(r"(?P<label>[A-Za-z][A-Za-z ]{0,40}?)\s*\((?P<keys>[A-Za-z_]+(?:/[A-Za-z_]+)+)\):\s*"
                      r"(?P<vals>-?[\d.]+(?:\s*/\s*-?[\d.]+)+)")
_GROUPED_KV = re.compile(r"\bKV cache(?: usage)?:\s*([\d.]+)\s*%")

# -- TGI -----------------------------------------------------------------------------------------
_TGI_DUR = re.compile(
    r"\b(total|validation|tokenization|queue|inference|time_per_token)(?:_time)?=\"?([\d.]+)\s*(ns|µs|us|ms|s|m)\"?"
)
_TGI_OVERLOADED = re.compile(r"Model is overloaded")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def kv_free_sequences(running: float, kv: float) -> float | None:
    """How many more sequences of the running ones' mean size the free KV cache holds at one sample:
    (1 − usage) × running / usage; None without a running sequence or KV usage (nothing to size by)."""
    if running <= 0 or kv <= 0:
        return None
    return (1.0 - kv) * running / kv


class Series:
    """Running aggregate of one numeric series: count, sum, min, max, first, last.

    ``add`` appends to a buffer that is folded (in C: ``sum``/``min``/``max``) every ``FOLD``
    values and before any read, so a multi-GB log costs one list append per value, in bounded memory.
    """

    FOLD = 4096
    __slots__ = ("_buf", "_count", "_first", "_high", "_last", "_low", "_total")

    def __init__(self) -> None:
        self._buf: list[float] = []
        self._count = 0
        self._total = 0.0
        self._low = math.inf
        self._high = -math.inf
        self._first: float | None = None
        self._last: float | None = None

    def add(self, x: float) -> None:
        buf = self._buf
        buf.append(x)
        if len(buf) >= self.FOLD:
            self._fold()

    def extend(self, xs: list[float]) -> None:
        self._buf.extend(xs)
        if len(self._buf) >= self.FOLD:
            self._fold()

    def add_array(self, values: np.ndarray) -> None:
        """Many values at once, in order (the bulk reader's columns): folded in numpy."""
        self._fold()
        finite = np.isfinite(values)
        if not finite.all():
            values = values[finite]
        if not values.size:
            return
        self._count += int(values.size)
        self._total += float(values.sum())
        self._low = min(self._low, float(values.min()))
        self._high = max(self._high, float(values.max()))
        if self._first is None:
            self._first = float(values[0])
        self._last = float(values[-1])

    def _fold(self) -> None:
        buf = self._buf
        if not buf:
            return
        if not all(map(math.isfinite, buf)):
            buf = [x for x in buf if math.isfinite(x)]
        self._buf = []
        if not buf:
            return
        self._count += len(buf)
        self._total += sum(buf)
        self._low = min(self._low, min(buf))
        self._high = max(self._high, max(buf))
        if self._first is None:
            self._first = buf[0]
        self._last = buf[-1]

    @property
    def count(self) -> int:
        self._fold()
        return self._count

    @property
    def total(self) -> float:
        self._fold()
        return self._total

    @property
    def low(self) -> float:
        self._fold()
        return self._low

    @property
    def high(self) -> float:
        self._fold()
        return self._high

    @property
    def first(self) -> float | None:
        self._fold()
        return self._first

    @property
    def last(self) -> float | None:
        self._fold()
        return self._last

    @property
    def mean(self) -> float | None:
        self._fold()
        return self._total / self._count if self._count else None

    @property
    def max(self) -> float | None:
        self._fold()
        return self._high if self._count else None

    def __repr__(self) -> str:
        return f"Series(count={self.count}, mean={self.mean}, max={self.max})"


@dataclass
class Reservoir:
    """Values for percentiles in bounded memory: all of them up to ``limit``, then a sample."""

    limit: int = MAX_SAMPLES
    values: list[float] = field(default_factory=list)
    seen: int = 0
    _rng: random.Random = field(default_factory=lambda: random.Random(0))

    def add(self, x: float) -> None:
        self.seen += 1
        if len(self.values) < self.limit:
            self.values.append(x)
            return
        j = self._rng.randrange(self.seen)
        if j < self.limit:
            self.values[j] = x


class StatsSample(NamedTuple):
    """One scheduler stats line (vLLM or SGLang). Fractions are 0..1, not percent.

    A NamedTuple (built in C): one is made for every stats line of a multi-GB log."""

    engine: str
    running: int | None = None
    waiting: int | None = None
    swapped: int | None = None
    kv_usage_ratio: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    prefix_hit_ratio: float | None = None
    new_tokens: int | None = None
    cached_tokens: int | None = None
    limit: int | None = None  # the requests the engine runs at once at most, where the line shows it


# one field of a stats line: "Label: 12.3 unit" (V0 "Prefix cache hit rate: GPU: 12.00%, CPU: 0.00%" too);
# a label never holds a digit, so the log prefix ("…] Engine 000: ") is never read as one
_V_FIELD = re.compile(r"([A-Za-z][A-Za-z ]*):\s*(?:GPU:\s*)?(-?[\d.]+)")


def _label_name(label: str) -> str | None:
    return _V_LABELS.get(label.strip().lower())


def _field_name(label: str, cpu_pool: bool) -> str | None:
    """``_label_name``, where "CPU KV cache usage" is the KV pool itself when no GPU pool is on the line."""
    name = _label_name(label)
    return "kv_pct" if name == "cpu_kv_pct" and cpu_pool else name


_NUMBER = re.compile(r"-?[\d.]+")
_DIGITS = b"0123456789."  # digits and the decimal point: what varies between the lines of one layout


class _Layout(NamedTuple):
    """A stats-line layout learned from a line: the label its known fields start at, and which of
    the whitespace-separated tokens after it (commas and % signs as spaces) carry which field.

    Lines of one layout differ only in their digits, so the line with its digits removed (from the
    anchor on) is the layout's key: a log repeats one layout millions of times, and each repeat is
    read with a few C-level string operations instead of a regex per field."""

    anchor: str
    names: tuple[str, ...]
    pick: Callable[[list[str]], tuple[str, ...]]
    idx: tuple[int, ...]  # the token index of each field
    ntokens: int  # tokens from the anchor to the end of the line


_LAYOUTS: dict[bytes, _Layout | None] = {}  # digit-free bytes from the anchor on → layout (None: unusable)
_ANCHORS: list[str] = []
MAX_LAYOUTS = 64  # a log with ever-new shapes (free text after the fields) reads them the slow way


def _key(tail: str) -> bytes:
    return tail.encode("utf-8", "replace").translate(None, _DIGITS)


def _picker(idx: tuple[int, ...]) -> Callable[[list[str]], tuple[str, ...]]:
    """The tokens at ``idx``, as a tuple (itemgetter returns a bare item for one index)."""
    if len(idx) == 1:
        only = idx[0]
        return lambda tokens: (tokens[only],)
    return operator.itemgetter(*idx)


def _learn(line: str) -> dict[str, float]:
    """Read ``line`` field by field (the general path) and remember its layout."""
    got: dict[str, float] = {}
    fields = [m for m in _V_FIELD.finditer(line) if _label_name(m.group(1)) is not None]
    alone = not any(_label_name(m.group(1)) == "kv_pct" for m in fields)  # the CPU's KV pool is the only one
    for m in fields:
        name = _field_name(m.group(1), alone)
        if name is None or name in got:
            continue
        try:
            got[name] = float(m.group(2).rstrip("."))
        except ValueError:
            return got
    if fields and len(_LAYOUTS) < MAX_LAYOUTS:
        pos = fields[0].start(1)
        tail = line[pos:]
        layout: _Layout | None = None
        tokens = _tokens(tail)
        # a field's value is the token equal to it (the first such token after its label)
        idx: list[int] = []
        names: list[str] = []
        cursor = 0
        for m in fields:
            name = _field_name(m.group(1), alone)
            if name is None or name in names:
                continue
            want = m.group(2)
            at = next((i for i in range(cursor, len(tokens)) if tokens[i] == want), None)
            if at is None:
                break
            idx.append(at)
            names.append(name)
            cursor = at + 1
        else:
            if idx:
                layout = _Layout(fields[0].group(1), tuple(names), _picker(tuple(idx)), tuple(idx), len(tokens))
        key = _key(tail)
        # a line that keys alike but reads otherwise (a value left empty: "GPU: %") never replaces what was
        # learned: every later line of the key would lose the field, and the bulk reader's shapes hold it
        if _LAYOUTS.get(key) is None:
            _LAYOUTS[key] = layout
        if layout is not None and layout.anchor not in _ANCHORS:
            _ANCHORS.append(layout.anchor)
    return got


class _Shape(NamedTuple):
    """A whole stats line's shape, read from the line's numbers only (``_numbers``): which of those
    tokens carry which of its layout's fields, and how many there are."""

    layout: _Layout
    idx: tuple[int, ...]
    ntokens: int


MAX_SHAPES = 256  # digit-free stats lines a parser keeps the shape of (a log has a handful)
# a line's numbers: commas, % signs and white space other than the newline as spaces (commas and % as in a
# layout's tokens), every other byte but digits, dots and minus signs deleted, so a word's token vanishes and
# a number's stays as it is
_NUMERIC_TABLE = bytes.maketrans(b",%\t\r\x0b\x0c", b"      ")
_NON_NUMERIC = bytes(b for b in range(256) if b not in b"0123456789.- \t\n\r\x0b\x0c,%")


# What stands before a vLLM-layout stats line's fields when LMDeploy printed it (its stat logger is adapted from
# vLLM's, InternLM/lmdeploy lmdeploy/metrics/loggers.py): its own print's "[%Y-%m-%d %H:%M:%S DP0] " (its releases
# from v0.9.2 until the grouped line), or, in development commits of May 2025, the record's logger name in its
# logging layout ("%(asctime)s - %(name)s - %(levelname)s - %(filename)s:%(lineno)d - ", lmdeploy/utils.py; a
# terminal's colour codes around the level are not stripped) or a "DP: 0, " field. vLLM's own lines carry
# "INFO 05-04 14:43:16 [loggers.py:123]" and "Engine 000: " there; SGLang's "[… DP0 TP0]" records never hold
# these fields.
_LMDEPLOY_BEFORE = re.compile(
    r"(?:^|\s)-\s+lmdeploy(?:\.[\w.]+)?\s+-\s+(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+-\s"
    r"|\bDP:\s*\d+,\s*$"
    r"|\[\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}\s+DP\d+\]\s*$")
_FIRST_FIELDS = ("Avg prompt throughput", "Running:", "Waiting:", "Pending:")


def stats_engine_of(line: str) -> str:
    """Whose vLLM-layout stats line ``line`` is, by what stands before its fields: ``lmdeploy`` or ``vllm``."""
    at = min((i for i in map(line.find, _FIRST_FIELDS) if i >= 0), default=len(line))
    return "lmdeploy" if _LMDEPLOY_BEFORE.search(line, 0, at) else "vllm"


def _looks_cut(line: str) -> bool:
    """Whether a stats line ends before its last field does: on a comma, or in a label (``… GPU KV cache u``, a
    paste or a terminal wrapping the line at its width)."""
    tail = line.rstrip()
    # on a comma, inside a label, or on a bare number (its unit or its other digits on the next line: "usage: 9" /
    # "8.7%"); every field of a whole line ends in its unit ("reqs", "%", "tokens/s")
    return tail.endswith(",") or ":" not in tail.rsplit(", ", 1)[-1] or tail[-1:].isdigit()


def _rejoin(held: str, line: str) -> str | None:
    """``held`` (a stats line that looks cut) and ``line`` as one, when ``line`` is its rest: the whole reads more
    fields than ``held`` alone and ``line`` is no stats line of its own. A wrap keeps the text's own spaces (``u`` +
    ``sage: 98.7%``); a comma at the cut gets back the space the wrap ate."""
    if not line.strip() or _vllm_stats_gate(line):
        return None
    joined = held + (" " if held.endswith(",") and not line.startswith(" ") else "") + line
    before, after = vllm_fields(held), vllm_fields(joined)
    return joined if after is not None and len(after) > len(before or {}) else None


def _vllm_stats_gate(line: str) -> bool:
    """Whether ``feed`` reads ``line`` as a vLLM stats line, if it parses (its anchors)."""
    return "Running:" in line or "Waiting:" in line or "Pending:" in line


def _other_stats_gate(line: str) -> bool:
    """Whether ``feed`` reads ``line`` as another engine's scheduler line, if it parses (SGLang's batches, grouped
    fields): those add to the same series as vLLM's, so the bulk reader keeps them in line order."""
    return " batch" in line or "running/" in line


def parse_other_stats(line: str) -> StatsSample | None:
    """Another engine's scheduler line than vLLM's: SGLang's batch lines, or grouped fields."""
    return parse_sglang_batch(line) if " batch" in line else parse_grouped_stats(line)


def _tokens(text: str) -> list[str]:
    return text.replace(",", " ").replace("%", " ").split()


def _numbers(text: bytes) -> bytes:
    return text.translate(_NUMERIC_TABLE, _NON_NUMERIC)


def _shape_of(line: str) -> _Shape | None:
    """The shape of a stats line whose layout is learned; None when its layout is not learned (yet), the
    line holds its anchor twice (two glued records), a record of its own is glued before the stats
    record (a preemption warning, a progress bar: the bulk read keeps only the stats record), or its
    tail does not read as its layout reads (a value left empty shifts the tokens after it): such a
    line is read the general way, which splits it into its records.

    The layout's tail is the end of the line, so its fields are the same tokens counted from the
    line's end (only the anchor's own token can differ, glued to what comes before it). Lines that
    share the digit-free key but not the count of tokens before the anchor are caught where they are
    read, line by line (``EngineLogParser._add_bulk``)."""
    found = layout_of(line)
    if found is None:
        return None
    tail, layout = found
    if line.count(layout.anchor) != 1 or _glued_before(line):
        return None
    tail_tokens = _tokens(tail)
    if len(tail_tokens) != layout.ntokens or any(_numbers(tail_tokens[i].encode("utf-8", "replace")).decode()
                                                 != tail_tokens[i] for i in layout.idx):
        return None
    whole = _tokens(line)
    before = len(whole) - layout.ntokens
    # each token's place among the numbers' tokens: a token whose bytes are all deleted has none
    at: list[int] = []
    kept = 0
    for token in whole:
        at.append(kept)
        kept += bool(_numbers(token.encode("utf-8", "replace")))
    return _Shape(layout, tuple(at[before + i] for i in layout.idx), kept)


def _glued_before(line: str) -> bool:
    """True when a record stands before the line's last record once its container, process, rank and
    timestamp prefixes are stripped (``clean_lines`` would split it into records).

    Lines that key alike (``_key``: their digits removed) answer alike but for digits at a record's
    boundary (``7INFO …`` against ``INFO …``): a glued record of words changes the key, so it never
    takes the shape learned from a clean line; one of bare digits says nothing."""
    return len(split_glued(strip_prefixes(line))) > 1


def _tail_of(line: str) -> str | None:
    """The line from the first learned anchor it holds on (its first known field, where ``_learn`` keyed it), or
    None. The first in the line, not the first learned: a layout learned from a line whose first known field was
    "Waiting:" must not key a later line at its "Waiting:" when that line's fields start earlier."""
    if len(_ANCHORS) == 1:
        pos = line.find(_ANCHORS[0])
    else:
        pos = min((at for at in map(line.find, _ANCHORS) if at >= 0), default=-1)
    return line[pos:] if pos >= 0 else None


def layout_of(line: str) -> tuple[str, _Layout] | None:
    """(the line from its anchor on, its learned layout), or None when no learned layout fits."""
    tail = _tail_of(line)
    if tail is None:
        return None
    layout = _LAYOUTS.get(_key(tail))
    return (tail, layout) if layout is not None else None


def vllm_values(line: str) -> tuple[tuple[str, ...], tuple[float, ...]] | None:
    """(field names, values) of a stats line of an already learned layout, or None."""
    found = layout_of(line)
    if found is None:
        return None
    tail, layout = found
    try:
        return layout.names, tuple(map(float, layout.pick(_tokens(tail))))
    except (ValueError, IndexError):
        return None


def vllm_fields(line: str) -> dict[str, float] | None:
    """The known fields of a vLLM V0/V1 stats line (any subset, in any order), or None."""
    if "Running:" not in line and "Waiting:" not in line and "Pending:" not in line:
        return None
    fast = vllm_values(line)
    got = dict(zip(*fast, strict=True)) if fast is not None else _learn(line)
    if ("running" not in got and "waiting" not in got) or len(got) < 2:
        return None
    return got


def _ignore(_: float) -> None:
    """The adder of a field the aggregates do not keep (CPU KV cache usage)."""


def parse_vllm_stats(line: str) -> StatsSample | None:
    """A vLLM V0/V1 periodic stats line (any subset of its fields, in any order), or None."""
    got = vllm_fields(line)
    if got is None:
        return None
    return StatsSample(
        engine="vllm",
        running=int(got["running"]) if "running" in got else None,
        waiting=int(got["waiting"]) if "waiting" in got else None,
        swapped=int(got["swapped"]) if "swapped" in got else None,
        kv_usage_ratio=got["kv_pct"] / 100.0 if "kv_pct" in got else None,
        prompt_tokens_per_s=got.get("prompt_tps"),
        generation_tokens_per_s=got.get("gen_tps"),
        prefix_hit_ratio=got["prefix_pct"] / 100.0 if "prefix_pct" in got else None,
    )


def parse_sglang_batch(line: str) -> StatsSample | None:
    """An SGLang ``Prefill batch.`` / ``Decode batch.`` scheduler line, or None."""
    m = _SG_BATCH.search(line)
    if not m:
        return None
    fields: dict[str, float] = {}
    for fm in _SG_FIELD.finditer(line):
        try:
            fields[fm.group(1).replace("_", "-")] = float(fm.group(2))
        except ValueError:
            continue
    if "running-req" not in fields and "queue-req" not in fields:
        return None
    usage = _SG_USAGE.search(line)
    gen = _SG_GEN.search(line)
    inp = _SG_IN.search(line)
    kv: float | None = None
    if usage:
        kv = float(usage.group(1))
        if kv > 1.0:  # some builds print percent; a fraction never exceeds 1
            kv /= 100.0
    new = fields.get("new-token")
    cached = fields.get("cached-token")
    return StatsSample(
        engine="sglang",
        running=int(fields["running-req"]) if "running-req" in fields else None,
        waiting=int(fields["queue-req"]) if "queue-req" in fields else None,
        kv_usage_ratio=kv,
        generation_tokens_per_s=float(gen.group(1)) if gen else None,
        prompt_tokens_per_s=float(inp.group(1)) if inp else None,
        new_tokens=int(new) if new is not None else None,
        cached_tokens=int(cached) if cached is not None else None,
    )


def parse_grouped_stats(line: str) -> StatsSample | None:
    """A stats line of grouped fields (``Engine (running/waiting): 45 / 5``: LMDeploy's), or None.

    The first group whose keys name both running and waiting is the engine's batch and queue; any other group's
    waiting requests (the API server's, held for a free engine instance) wait too. A group with ``in``/``out`` is
    prompt and generated tokens per second; ``KV cache: N%`` the pool's usage; a line with neither is no
    engine's stats line ("Pods (running/waiting): 3 / 1"). When requests wait at the API server, every engine
    instance is taken, so the requests it has routed are its limit (LMDeploy sizes that pool --max-batch-size:
    ``lmdeploy/serve/core/async_engine.py``), where the group counts failed requests apart (0.12.3+)."""
    groups: dict[str, dict[str, float]] = {}  # label -> its keys' values, in the line's order
    for m in _GROUPED.finditer(line):
        keys = m.group("keys").lower().split("/")
        vals = m.group("vals").split("/")
        if len(keys) != len(vals):
            continue
        try:
            values = [float(v) for v in vals]
        except ValueError:
            continue
        groups.setdefault(m.group("label").strip().lower(), dict(zip(keys, values, strict=True)))
    engine = next((g for g in groups.values() if "running" in g and "waiting" in g), None)
    rates = next((g for g in groups.values() if "in" in g and "out" in g), None)
    kv = _GROUPED_KV.search(line)
    if engine is None or (rates is None and kv is None):
        return None
    # only where that group counts the requests that failed too (LMDeploy 0.12.3+, InternLM/lmdeploy#4410: before,
    # a cancelled stream stayed "waiting" for good, and the routed ones were the load, not a limit)
    front = next((g for g in groups.values() if g is not engine and g.get("waiting", 0.0) > 0 and "routed" in g
                  and "failed" in g), None)
    return StatsSample(
        engine="lmdeploy",
        running=round(engine["running"]),
        waiting=round(sum(g.get("waiting", 0.0) for g in groups.values())),
        kv_usage_ratio=float(kv.group(1)) / 100.0 if kv else None,
        prompt_tokens_per_s=rates["in"] if rates else None,
        generation_tokens_per_s=rates["out"] if rates else None,
        limit=round(front["routed"]) if front else None,
    )


def parse_tgi_request(line: str) -> dict[str, float] | None:
    """A TGI request span with ``total_time="…" queue_time="…" …``, as milliseconds, or None."""
    if "queue_time" not in line and "inference_time" not in line:
        return None
    out: dict[str, float] = {}
    for m in _TGI_DUR.finditer(line):
        try:
            out[m.group(1)] = to_ms(float(m.group(2)), m.group(3))
        except ValueError:
            continue
    return out if ("queue" in out or "inference" in out) else None


@dataclass(frozen=True)
class BenchmarkResult:
    """One ``Serving Benchmark Result`` block: row label → value (latencies in ms as printed)."""

    rows: Mapping[str, float]
    complete: bool  # the closing ===== line was seen

    def latency(self, metric: str) -> dict[str, float]:
        """``{"mean": …, "p50": …, "p99": …}`` for TTFT, TPOT, ITL or E2EL."""
        out: dict[str, float] = {}
        for label, value in self.rows.items():
            m = _LAT_ROW.match(label)
            if not m or m.group(2).replace("E2E Latency", "E2EL") != metric:
                continue
            stat = m.group(1)
            if stat == "Mean":
                out["mean"] = value
            elif stat == "Median":
                out.setdefault("p50", value)
            elif stat == "Std":
                out["std"] = value
            else:
                q = stat[1:].rstrip("0").rstrip(".") if "." in stat else stat[1:]
                out[f"p{q}"] = value
        return out


@dataclass(frozen=True)
class EngineLogSummary:
    """Everything the parser aggregated from one log."""

    engines: tuple[str, ...]
    samples: int
    running: Series
    waiting: Series
    swapped: Series
    kv_usage: Series
    prompt_tps: Series
    gen_tps: Series
    prefix_hit: Series
    queued_samples: int  # stats samples with at least one waiting request
    running_when_queued: Series
    running_when_queued_busy: Series  # the same where a batch ran: a sample between steps (0 running) is not one
    kv_when_queued: Series
    kv_free_seqs_when_queued: Series  # per sample with requests waiting: kv_free_sequences
    new_tokens: int
    cached_tokens: int
    preemption_lines: int
    preempted_in_stats: int  # the sum of V1 stats lines' per-interval "Preemptions: N"
    deferred_max: float  # the most V1 stats lines' "Deferred: N reqs" said (0 when never printed)
    preemptions_cumulative: int | None
    preempt_modes: Mapping[str, int]
    retracted: int
    config: Mapping[str, int]
    kv_max_concurrency: float | None
    kv_max_concurrency_tokens: int | None
    gpu_blocks: int | None
    kv_capacity_tokens: int | None
    benchmark: BenchmarkResult | None
    benchmark_blocks: int
    offered_rps: float | None  # the request rate a serving benchmark offered (inf: all at once)
    bench_cap: int | None  # its cap on requests in flight, from the line before its block or its command line
    bench_backend: str  # the engine a serving benchmark's block names ("Backend: sglang"), lower case
    offline_throughput: Mapping[str, float]
    tgi: Mapping[str, list[float]]
    tgi_requests: int
    overloaded: int

    @property
    def preemptions(self) -> int:
        return max(self.preemption_lines + self.retracted, self.preemptions_cumulative or 0, self.preempted_in_stats)


class EngineLogParser:
    """Stream cleaned lines in; aggregates out. Never raises on odd input."""

    def __init__(self) -> None:
        self.engines: dict[str, None] = {}
        # whose vLLM-layout stats lines these are (``stats_engine_of``), named by the first one: a log is one engine's
        self._stats_engine: str | None = None
        self.samples = 0
        self._plans: dict[tuple[str, ...], tuple[list[tuple[Callable[[float], None], float]], int, int, int]] = {}
        # each digit-free stats line (the log's prefix repeats with the line, so one digit-free copy of a
        # block keys each line in C) → its shape, for the bulk reader
        self._shapes: dict[bytes, _Shape] = {}
        self._shape_ids: dict[bytes, int] = {}  # the same keys → their shape's place in _shape_list
        self._shape_list: list[_Shape] = []
        self._sid_by_shape: dict[_Shape, int] = {}  # keys that differ in a prefix only share a shape, and its id
        self.running = Series()
        self.waiting = Series()
        self.swapped = Series()
        self.kv_usage = Series()
        self.prompt_tps = Series()
        self.gen_tps = Series()
        self.prefix_hit = Series()
        self.queued_samples = 0
        self.running_when_queued = Series()
        self.running_when_queued_busy = Series()
        self.kv_when_queued = Series()
        self.kv_free_seqs_when_queued = Series()
        self.new_tokens = 0
        self.cached_tokens = 0
        self.preemption_lines = 0
        self.preempted = Series()  # V1 stats lines' "Preemptions: N" (per interval)
        self.deferred = Series()  # V1 stats lines' "Deferred: N reqs" (printed when > 0)
        self.preemptions_cumulative: int | None = None
        self.preempt_modes: dict[str, int] = {}
        self.retracted = 0
        self.config: dict[str, int] = {}
        self.kv_max_concurrency: float | None = None
        self.kv_max_concurrency_tokens: int | None = None
        self.gpu_blocks: int | None = None
        self.kv_capacity_tokens: int | None = None
        self._bench_rows: dict[str, float] | None = None
        self.benchmark: BenchmarkResult | None = None
        self.benchmark_blocks = 0
        self.offered_rps: float | None = None
        self.bench_cap: int | None = None  # a serving benchmark's cap on requests in flight, stated outside its block
        self._offered_printed = False  # the benchmark printed its rate: a command line's flag does not replace it
        self.bench_backend = ""
        self.offline_throughput: dict[str, float] = {}
        self.tgi: dict[str, Reservoir] = {}
        self.tgi_requests = 0
        self.overloaded = 0
        self.recognised = 0
        self._held: str | None = None  # a stats line that ends cut off, until the next line says whether it goes on

    # ------------------------------------------------------------------------------------------
    def feed(self, line: str) -> bool:
        """Offer one line; True when it was recognised."""
        if self._bench_rows is not None:
            return self._feed_bench(line)
        if self._held is not None:
            held, self._held = self._held, None
            joined = _rejoin(held, line)
            if joined is not None:  # the rest of a stats line a paste wrapped: read the whole
                return self._feed_line(joined)
            self._feed_line(held)
        if _vllm_stats_gate(line) and _looks_cut(line):
            self._held = line  # it may go on on the next line: read it then (counted when it is read)
            return True
        return self._feed_line(line)

    def _feed_line(self, line: str) -> bool:
        hit = False
        if _vllm_stats_gate(line):
            fast = vllm_values(line)
            if fast is not None:
                if self._add_values(*fast) and self._stats_engine is None:
                    self._name_stats(line)
                self.recognised += 1
                return True  # a stats line is nothing else
            got = vllm_fields(line)
            if got is not None:
                if self._stats_engine is None:
                    self._name_stats(line)
                self._add_vllm(got)
                self.recognised += 1
                return True
        if not hit and _other_stats_gate(line):
            s = parse_other_stats(line)
            if s is not None:
                self._add_sample(s)
                if s.limit is not None:  # a limit the line shows: the most routed at once (never above a stated one)
                    self.config["max_num_seqs"] = max(self.config.get("max_num_seqs", 0), s.limit)
                hit = True
        if "preempt" in line or "Preempt" in line:
            hit = self._feed_preempt(line) or hit
        if "EngineConfig(" in line and "max_batch_size=" in line:  # LMDeploy's engine config, logged at start-up
            bm = _LMD_BATCH.search(line)
            if bm:
                self.config["max_num_seqs"] = max(self.config.get("max_num_seqs", 0), int(bm.group(1)))
                hit = True
        if "max" in line and ("num_seqs" in line or "num-seqs" in line or "batched" in line or "running" in line):
            for m in _CONF.finditer(line):
                key = m.group(1).replace("-", "_")
                # SGLang's max_running_requests is the same limit as vLLM's max_num_seqs
                self.config["max_num_seqs" if key == "max_running_requests" else key] = int(m.group(2))
                hit = True
        if "Maximum concurrency" in line or "GPU blocks" in line or "KV cache size" in line:
            hit = self._feed_capacity(line) or hit
        if "retracted" in line:
            rm = _SG_RETRACT.search(line)
            if rm:
                self.retracted += int(rm.group(1))
                self.engines.setdefault("sglang")
                hit = True
        if "_time" in line:
            tgi = parse_tgi_request(line)
            if tgi is not None:
                self.tgi_requests += 1
                for k, v in tgi.items():
                    self.tgi.setdefault(k, Reservoir()).add(v)
                # TEI's router is TGI's design for embeddings: its target (or its tokenization stage) names it
                self.engines.setdefault("tei" if "text_embeddings_router" in line or "tokenization" in tgi else "tgi")
                hit = True
        if "overloaded" in line and _TGI_OVERLOADED.search(line):
            self.overloaded += 1
            hit = True
        if "Benchmark Result" in line and _BENCH_START.search(line):
            self._bench_rows = {}
            self.benchmark_blocks += 1
            hit = True
        if "request rate" in line:
            om = _OFFERED.match(line)
            if om:
                self.offered_rps, self._offered_printed = float(om.group(1)), True
                hit = True
        elif ("request-rate" in line or "request_rate" in line) and not self._offered_printed:
            om = _OFFERED_FLAG.search(line)
            if om:
                self.offered_rps = float(om.group(1))
        if "concurrency" in line:
            cm = _CAP.match(line) or _CAP_FLAG.search(line)
            if cm:
                self.bench_cap = int(cm.group(1))
        if line.startswith("Throughput:"):
            tm = _THROUGHPUT.match(line)
            if tm:
                self.offline_throughput = {"rps": float(tm.group(1)), "total_tokens_per_s": float(tm.group(2))}
                if tm.group(3):
                    self.offline_throughput["output_tokens_per_s"] = float(tm.group(3))
                hit = True
        if hit:
            self.recognised += 1
        return hit

    def feed_raw(self, lines: list[str]) -> None:
        """Physical lines as they stand in the log (not cleaned), many at once: the tail of a big log.

        Stats lines of a learned layout are read in bulk, with no per-line string work in Python:
        one copy of the block without its digits keys each line to its shape (the layout and the log
        prefix repeat with every stats line), one copy with only its numbers (``_numbers``) feeds
        numpy's C reader, which parses the fields' columns of each shape at once. The recogniser
        reads from a layout's anchor on, so the log prefixes ``clean_lines`` strips do not matter to
        it; a line holding its anchor twice (two glued records) is cleaned like any other. The
        aggregates keep the order of the lines: shapes are folded in the order of their last line,
        and a stats line of an unknown layout (read one by one, which learns its layout) closes the
        run of lines before it. Every other line is cleaned and fed one by one.
        """
        if self._bench_rows is not None or len(lines) < BULK_MIN:
            for line in clean_lines(lines):
                self.feed(line)
            return
        self._flush_held()  # the bulk reader adds lines without feed: what was held is read alone, in order
        blob = "\n".join(lines).encode("utf-8", "replace")
        keys = blob.translate(None, _DIGITS).split(b"\n")
        # a line holding a newline (cannot come from a split), or a benchmark's result block (the lines after
        # its title are its rows, line by line, not stats lines): read one by one, to stay exact
        if len(keys) != len(lines) or b"Benchmark Result" in blob:
            for line in clean_lines(lines):
                self.feed(line)
            return
        numbers = _numbers(blob).split(b"\n")
        # each line's shape, by its key, in one pass in C: a block whose lines are all of learned layouts (or no
        # stats line at all) is grouped by shape in numpy; one that holds a stats line of a layout not learned
        # yet (the first blocks of a log) is read line by line below, which learns it
        ids = np.fromiter(map(self._shape_ids.get, keys, itertools.repeat(-1)), np.int64, len(keys))
        unknown = np.flatnonzero(ids < 0).tolist()
        # another engine's scheduler lines among them add to the same series: the block is read in line order
        # (one parse decides: a line that only mentions a batch keeps the bulk read)
        if any(_other_stats_gate(lines[k]) and parse_other_stats(lines[k]) is not None for k in unknown):
            for line in clean_lines(lines):
                self.feed(line)
            return
        if not any(_vllm_stats_gate(lines[k]) for k in unknown):
            known = ids[ids >= 0]
            if known.size:
                present = np.unique(known)
                wheres = [np.flatnonzero(ids == sid) for sid in present.tolist()]
                for sid, at in sorted(zip(present.tolist(), wheres, strict=True), key=lambda pair: int(pair[1][-1])):
                    idx = at.tolist()
                    mine = operator.itemgetter(*idx)(numbers) if len(idx) > 1 else (numbers[idx[0]],)
                    self._add_bulk(self._shape_list[sid], mine, lines, idx)
            for line in clean_lines([lines[k] for k in unknown]):
                self.feed(line)
            return
        groups: dict[_Shape, list[int]] = {}  # each shape's lines, by their place in the block
        last_at: dict[_Shape, int] = {}
        rest: list[str] = []
        shapes = self._shapes
        for k, line in enumerate(lines):
            shape = shapes.get(keys[k])
            if shape is None:
                if not _vllm_stats_gate(line):
                    rest.append(line)
                    continue
                shape = _shape_of(line)
                if shape is not None and len(shapes) < MAX_SHAPES:
                    shapes[keys[k]] = shape
                    sid = self._sid_by_shape.setdefault(shape, len(self._shape_list))
                    if sid == len(self._shape_list):
                        self._shape_list.append(shape)
                    self._shape_ids[keys[k]] = sid
                if shape is None:  # an unknown layout (read one by one, which learns it), or an odd line
                    self._flush(groups, last_at, lines, numbers)
                    for clean in clean_lines((line,)):
                        self.feed(clean)
                    continue
            group = groups.get(shape)
            if group is None:
                groups[shape] = group = []
            group.append(k)
            last_at[shape] = k
        self._flush(groups, last_at, lines, numbers)
        for line in clean_lines(rest):
            self.feed(line)

    def _flush(self, groups: dict[_Shape, list[int]], last_at: dict[_Shape, int], lines: list[str],
               numbers: list[bytes]) -> None:
        for shape in sorted(groups, key=last_at.__getitem__):
            at = groups[shape]
            self._add_bulk(shape, [numbers[k] for k in at], lines, at)
        groups.clear()
        last_at.clear()

    def _add_bulk(self, shape: _Shape, numbers: Sequence[bytes], lines: list[str], at: list[int]) -> None:
        """Many stats lines of one shape (``numbers``: each line's numbers, ``_numbers``): columns of
        values, aggregated in bulk. ``lines[k]`` for ``k`` in ``at`` are the lines themselves, read one
        by one when the bulk read cannot be exact."""
        data = b"\n".join(numbers)
        # every line must hold the shape's count of tokens (lines that key alike may not: a prefix with a
        # number where another has a blank): each line's count of token starts (a byte above the space
        # after one that is not), from how many start before each newline (a binary search of the
        # token starts, cheaper than a running count of every byte), in numpy
        raw = np.frombuffer(data, np.uint8)
        solid = raw > 0x20
        starts = solid.copy()
        starts[1:] &= ~solid[:-1]
        token_at = np.flatnonzero(starts)
        per_line = np.diff(np.searchsorted(token_at, np.flatnonzero(raw == 0x0A)), prepend=0, append=token_at.size)
        try:
            if (per_line != shape.ntokens).any():
                raise ValueError
            # numpy's C reader parses the fields' columns only (white space between tokens, as split does)
            table = np.loadtxt(io.BytesIO(data), dtype=np.float64, comments=None, usecols=shape.idx, ndmin=2,
                               encoding="latin-1")
        except ValueError:
            for line in clean_lines(lines[k] for k in at):
                self.feed(line)
            return
        cols = {name: table[:, j] for j, name in enumerate(shape.layout.names)}
        if ("running" not in cols and "waiting" not in cols) or len(cols) < 2:
            return
        if self._stats_engine is None:
            self._name_stats(lines[at[0]])
        self.samples += len(numbers)
        for name, series, scale in (("running", self.running, 1.0), ("waiting", self.waiting, 1.0),
                                    ("swapped", self.swapped, 1.0), ("kv_pct", self.kv_usage, 0.01),
                                    ("prefix_pct", self.prefix_hit, 0.01), ("prompt_tps", self.prompt_tps, 1.0),
                                    ("gen_tps", self.gen_tps, 1.0), ("preempted", self.preempted, 1.0),
                                    ("deferred", self.deferred, 1.0)):
            col = cols.get(name)
            if col is not None:
                series.add_array(col if scale == 1.0 else col * scale)
        waiting = cols.get("waiting")
        if waiting is not None:
            queued = waiting != 0  # a NaN counts as queued, as a truthy float does line by line
            count = int(queued.sum())
            self.queued_samples += count
            if count and "running" in cols:
                run = cols["running"][queued]
                self.running_when_queued.add_array(run)
                self.running_when_queued_busy.add_array(run[run > 0])
            if count and "kv_pct" in cols:
                kv = cols["kv_pct"][queued]
                self.kv_when_queued.add_array(kv / 100.0)  # as _add_values does (times 0.01 rounds otherwise)
                if "running" in cols:
                    run = cols["running"][queued]
                    sized = (run > 0) & (kv > 0)
                    self.kv_free_seqs_when_queued.add_array((100.0 - kv[sized]) * run[sized] / kv[sized])

    def _plan(self, names: tuple[str, ...]) -> tuple[list[tuple[Callable[[float], None], float]], int, int, int]:
        """For a layout's fields: (each field's adder and scale), and where running/waiting/kv sit (-1: absent)."""
        target = {"running": (self.running, 1.0), "waiting": (self.waiting, 1.0), "swapped": (self.swapped, 1.0),
                  "kv_pct": (self.kv_usage, 0.01), "prefix_pct": (self.prefix_hit, 0.01),
                  "prompt_tps": (self.prompt_tps, 1.0), "gen_tps": (self.gen_tps, 1.0),
                  "preempted": (self.preempted, 1.0), "deferred": (self.deferred, 1.0)}
        adders: list[tuple[Callable[[float], None], float]] = [
            (target[n][0].add, target[n][1]) if n in target else (_ignore, 1.0) for n in names]
        r, w, k = (names.index(n) if n in names else -1 for n in ("running", "waiting", "kv_pct"))
        plan = (adders, r, w, k)
        self._plans[names] = plan
        return plan

    def _name_stats(self, line: str) -> None:
        """Name the engine of the vLLM-layout stats lines by the first one (``stats_engine_of``)."""
        self._stats_engine = stats_engine_of(line)
        self.engines.setdefault(self._stats_engine)

    def _add_values(self, names: tuple[str, ...], values: tuple[float, ...]) -> bool:
        """A vLLM stats line of a learned layout: the hot path of a multi-GB log. Whether it was one (running or
        waiting, and another field), counted as a sample."""
        plan = self._plans.get(names) or self._plan(names)
        adders, r, w, k = plan
        if not (("running" in names or "waiting" in names) and len(names) >= 2):
            return False
        self.samples += 1
        for (add, scale), v in zip(adders, values, strict=True):
            add(v * scale)
        if w >= 0 and values[w]:
            self.queued_samples += 1
            if r >= 0:
                self.running_when_queued.add(values[r])
                if values[r] > 0:
                    self.running_when_queued_busy.add(values[r])
            if k >= 0:
                self.kv_when_queued.add(values[k] / 100.0)
                if r >= 0 and values[r] > 0 and values[k] > 0:  # kv_free_sequences, inline: the hot path
                    self.kv_free_seqs_when_queued.add((100.0 - values[k]) * values[r] / values[k])
        return True

    def _add_vllm(self, got: dict[str, float]) -> None:
        """``_add_sample`` for a vLLM stats line's fields, without building a sample (the hot path)."""
        self.samples += 1
        running = got.get("running")
        waiting = got.get("waiting")
        kv = got.get("kv_pct")
        if running is not None:
            self.running.add(running)
        if waiting is not None:
            self.waiting.add(waiting)
        if "swapped" in got:
            self.swapped.add(got["swapped"])
        if kv is not None:
            kv /= 100.0
            self.kv_usage.add(kv)
        if "prefix_pct" in got:
            self.prefix_hit.add(got["prefix_pct"] / 100.0)
        if "prompt_tps" in got:
            self.prompt_tps.add(got["prompt_tps"])
        if "gen_tps" in got:
            self.gen_tps.add(got["gen_tps"])
        if "preempted" in got:
            self.preempted.add(got["preempted"])
        if "deferred" in got:
            self.deferred.add(got["deferred"])
        if waiting:
            self.queued_samples += 1
            if running is not None:
                self.running_when_queued.add(running)
                if running > 0:
                    self.running_when_queued_busy.add(running)
            if kv is not None:
                self.kv_when_queued.add(kv)
                if running is not None and running > 0 and kv > 0:
                    self.kv_free_seqs_when_queued.add((1.0 - kv) * running / kv)

    def _add_sample(self, s: StatsSample) -> None:
        self.engines.setdefault(s.engine)
        self.samples += 1
        for series, value in (
            (self.running, s.running),
            (self.waiting, s.waiting),
            (self.swapped, s.swapped),
            (self.kv_usage, s.kv_usage_ratio),
            (self.prefix_hit, s.prefix_hit_ratio),
        ):
            if value is not None:
                series.add(float(value))
        # throughput of 0 on an idle SGLang prefill line is "not reported", not "zero"
        if s.prompt_tokens_per_s is not None and (s.engine == "vllm" or s.prompt_tokens_per_s > 0):
            self.prompt_tps.add(s.prompt_tokens_per_s)
        if s.generation_tokens_per_s is not None:
            self.gen_tps.add(s.generation_tokens_per_s)
        if s.waiting:
            self.queued_samples += 1
            if s.running is not None:
                self.running_when_queued.add(float(s.running))
                if s.running > 0:
                    self.running_when_queued_busy.add(float(s.running))
            if s.kv_usage_ratio is not None:
                self.kv_when_queued.add(s.kv_usage_ratio)
                room = kv_free_sequences(float(s.running), s.kv_usage_ratio) if s.running is not None else None
                if room is not None:
                    self.kv_free_seqs_when_queued.add(room)
        if s.new_tokens is not None:
            self.new_tokens += s.new_tokens
        if s.cached_tokens is not None:
            self.cached_tokens += s.cached_tokens

    def _feed_preempt(self, line: str) -> bool:
        m = _PREEMPT.search(line)
        if not m or line.lstrip().startswith(_NOT_EVENTS) or " --" in line:
            return False  # a metric's HELP text ("times a request was preempted"), a command or its flags
        if "PreemptionMode" not in line and "Sequence group" not in line and "request" not in line.lower():
            return False  # "preempted" in an unrelated sentence
        self.preemption_lines += 1
        mode = (m.group(1) or "unknown").upper()
        self.preempt_modes[mode] = self.preempt_modes.get(mode, 0) + 1
        c = _PREEMPT_CUM.search(line)
        if c:
            self.preemptions_cumulative = max(self.preemptions_cumulative or 0, int(c.group(1)))
        self.engines.setdefault("vllm")
        return True

    def _feed_capacity(self, line: str) -> bool:
        hit = False
        m = _MAX_CONC.search(line)
        if m:
            self.kv_max_concurrency_tokens = int(_num(m.group(1)))
            self.kv_max_concurrency = float(m.group(2))
            hit = True
        m = _GPU_BLOCKS.search(line)
        if m:
            self.gpu_blocks = int(_num(m.group(1)))
            hit = True
        m = _KV_TOKENS.search(line)
        if m:
            self.kv_capacity_tokens = int(_num(m.group(1)))
            hit = True
        return hit

    def _feed_bench(self, line: str) -> bool:
        rows = self._bench_rows
        assert rows is not None
        if _BENCH_END.match(line.strip()) and rows:
            self.benchmark = BenchmarkResult(dict(rows), complete=True)
            self._bench_rows = None
            return True
        if line.strip().startswith("-") or not line.strip():
            return True  # a section rule such as ----Time to First Token----
        om = _OFFERED.match(line)
        if om:  # SGLang's block holds the offered rate, "inf" included
            self.offered_rps, self._offered_printed = float(om.group(1)), True
        m = _BENCH_ROW.match(line)
        if not m:
            bm = _BACKEND.match(line)
            if bm:
                self.bench_backend = bm.group(1).lower()
            if ":" in line and len(line) < 120:
                return True  # a row with a text value ("Backend: sglang", "…concurrency: not set")
            # the block ended without its closing rule (a pasted excerpt): keep what we have
            self._close_bench()
            return self.feed(line)
        value = m.group(2)
        if value != "inf":
            with contextlib.suppress(ValueError):
                rows[m.group(1).strip()] = _num(value)
        self.recognised += 1
        return True

    def _close_bench(self) -> None:
        if self._bench_rows:
            self.benchmark = BenchmarkResult(dict(self._bench_rows), complete=False)
        self._bench_rows = None

    # ------------------------------------------------------------------------------------------
    def matched(self) -> bool:
        self._flush_held()  # a line held for its continuation is read by now
        return self.recognised > 0 or self._bench_rows is not None

    def _flush_held(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._feed_line(held)

    def summary(self) -> EngineLogSummary:
        self._flush_held()
        if self._bench_rows is not None:
            self._close_bench()
        if self.benchmark is not None:
            self.engines.setdefault("vllm-benchmark")
        return EngineLogSummary(
            engines=tuple(self.engines),
            samples=self.samples,
            running=self.running,
            waiting=self.waiting,
            swapped=self.swapped,
            kv_usage=self.kv_usage,
            prompt_tps=self.prompt_tps,
            gen_tps=self.gen_tps,
            prefix_hit=self.prefix_hit,
            queued_samples=self.queued_samples,
            running_when_queued=self.running_when_queued,
            running_when_queued_busy=self.running_when_queued_busy,
            kv_when_queued=self.kv_when_queued,
            kv_free_seqs_when_queued=self.kv_free_seqs_when_queued,
            new_tokens=self.new_tokens,
            cached_tokens=self.cached_tokens,
            preemption_lines=self.preemption_lines,
            preempted_in_stats=round(self.preempted.total),
            deferred_max=self.deferred.high if self.deferred.count else 0.0,
            preemptions_cumulative=self.preemptions_cumulative,
            preempt_modes=dict(self.preempt_modes),
            retracted=self.retracted,
            config=dict(self.config),
            kv_max_concurrency=self.kv_max_concurrency,
            kv_max_concurrency_tokens=self.kv_max_concurrency_tokens,
            gpu_blocks=self.gpu_blocks,
            kv_capacity_tokens=self.kv_capacity_tokens,
            benchmark=self.benchmark,
            benchmark_blocks=self.benchmark_blocks,
            offered_rps=self.offered_rps,
            bench_cap=self.bench_cap,
            bench_backend=self.bench_backend,
            offline_throughput=dict(self.offline_throughput),
            tgi={k: list(r.values) for k, r in self.tgi.items()},
            tgi_requests=self.tgi_requests,
            overloaded=self.overloaded,
        )
