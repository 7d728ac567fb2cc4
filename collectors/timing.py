"""Per-request timing in its many shapes → plain records.

Pure parsing, streamed line by line (``TimingParser.feed``), bounded memory. It reads

* the stage-timing JSONL of DESIGN.md (``{"ts": …, "stages_ms": {"queue": 3.1, …}, "ttft_ms": …}``);
* span listings (``queue: 0.03 ms``, ``prefill=170ms``, ``span=decode … duration=60ms``);
* per-call timing lines (``cost:100.49``, ``took: 1.23s``, ``time: 45 ms``) and the input shapes
  printed with them or just before them (``logmel:(1444,80) cost:…``, ``input_ids (1, 10)``), for
  the engine-rebuild signature: slow calls exactly when the input size is a new minimum or maximum;
* Markdown/ASCII tables, kept as they stand (header, rows and the lines before them): what a table
  says (a stage breakdown, a variant comparison, load conditions) is ``diagnose.derive.timing_tables``'
  to decide;
* token usage fields (``cache_read_tokens``, ``cache_write_tokens``, ``prompt_tokens``,
  ``cached_tokens``) and prose figures of TTFT and prompt length.

A bare number with no unit is taken as seconds (what ``time.time() - t0`` prints), unless the key
says ``_ms``; every such assumption is reported by the derive step.
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
from collections import deque
from dataclasses import dataclass, field

from diagnose.collectors.units import TIME_UNIT, to_ms
from diagnose.model import FIRST_REQUESTS  # the cold-start window
from diagnose.stats import quantile

MAX_TEMPLATES = 1024  # distinct untagged-timing line templates kept (a log of ever-new lines stops adding)
MIN_REPEATS = 2  # a timing line's template printed this often is a call's timing, not a one-off phase
_NO_DIGITS = str.maketrans("", "", "0123456789")
RESERVOIR = 50_000  # values kept per series for percentiles (the mean and count stay exact)
MAX_CALLS = 100_000
MAX_TABLES = 64
CONTEXT_LINES = 14

# ---------------------------------------------------------------------------------------------
# series
# ---------------------------------------------------------------------------------------------


class Series:
    """A stream of numbers: exact count/sum/max, percentiles from a deterministic reservoir."""

    def __init__(self) -> None:
        self.n = 0
        self.total = 0.0
        self.max = -math.inf
        self.min = math.inf
        self._keep: list[float] = []
        self._rng: random.Random | None = None

    def add(self, x: float) -> None:
        if not math.isfinite(x):
            return
        self.n += 1
        self.total += x
        self.max = max(self.max, x)
        self.min = min(self.min, x)
        if len(self._keep) < RESERVOIR:
            self._keep.append(x)
        else:
            if self._rng is None:
                self._rng = random.Random(0)
            j = self._rng.randrange(self.n)
            if j < RESERVOIR:
                self._keep[j] = x

    def merge(self, other: Series) -> None:
        """Add ``other``'s values: count, sum, min and max exactly, its kept values to the reservoir."""
        n, total, low, high = self.n, self.total, self.min, self.max
        for x in other._keep:
            self.add(x)
        self.n, self.total = n + other.n, total + other.total
        self.min, self.max = min(low, other.min), max(high, other.max)

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    def quantile(self, q: float) -> float:
        return quantile(self._keep, q) or 0.0


# ---------------------------------------------------------------------------------------------
# units and stage names
# ---------------------------------------------------------------------------------------------

_STAGE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # (a program's names join words with "_" or ".": "gemm.out_d2h", "in_h2d")
    (re.compile(r"(?<![a-z0-9])d2h(?![a-z0-9])|device[- ]to[- ]host|copy[- ]?out|download", re.I), "d2h"),
    # (a stage named "copy" alone, of a GPU program's breakdown: "op time 38us, malloc time 7us, copy time 876us")
    (re.compile(r"(?<![a-z0-9])h2d(?![a-z0-9])|host[- ]to[- ]device|copy[- ]?in|upload|\bmemcpy\b|\btransfer|^copy$",
                re.I), "h2d"),
    (re.compile(r"prefill|prompt processing|first (?:model )?(?:event|token|byte|chunk)|\bttft\b|time to first", re.I),
     "prefill"),
    (re.compile(r"\bqueue|queueing|queuing|admission|\bwait(?:ing)?\b|scheduling delay", re.I), "queue"),
    (re.compile(r"post[- _]?process|detokeni[sz]|\bnms\b|serialize response|postproc", re.I), "postprocess"),
    (re.compile(r"pre[- _]?process|tokeni[sz]|image decode|decode image|jpeg decode|\bresize|normali[sz]|preproc"
                r"|\bparse\b|deserializ"
                # audio features computed from the samples before the model (filter banks, spectrograms, MFCCs)
                r"|\bfbank|\bfilter ?bank|spectrogram|\bmfccs?\b"
                # NVIDIA DALI, the data-loading library (decode, resize, augment): a stage or model named after it
                r"|(?<![a-z])dali(?![a-z])", re.I), "preprocess"),
    # (an embedding's generation is the encoder's forward: "Embeddings generation ..... done [6.08s]")
    (re.compile(r"\bdecode\b|decoding|(?<!embedding )(?<!embeddings )generation|token generation|\bgenerate\b",
                re.I), "decode"),
    (re.compile(r"network|\brpc\b|transport|\bhttp\b|round[- ]trip", re.I), "network"),
    (re.compile(r"inference|forward|\bmodel\b|compute|execute|\binfer\b|\bkernel", re.I), "compute"),
)


def _snake(text: str) -> str:
    words = re.findall(r"[A-Za-z0-9]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", text))
    return "_".join(w.lower() for w in words[:4]) or "other"


def clean_label(cell: str) -> str:
    """Strip Markdown emphasis, code ticks and parenthesised detail from a table label."""
    # (at a word's edges only: "out_d2h" keeps its underscore, "**`gemm.out_d2h`**" loses its marks)
    text = re.sub(r"(?<![A-Za-z0-9])[*_`~]{1,3}(?=\S)|(?<=\S)[*_`~]{1,3}(?![A-Za-z0-9])", "", cell).strip()
    text = " ".join(re.sub(r"\([^)]*\)", " ", text).split())
    return text.strip(" :-")


# a stage named by a whole short word a program abbreviates it to ("pre 0.013s |…|post 0.003s"); "net" is the model
# only beside both of them (CenterNet's breakdown), elsewhere as often the network (``_piped``)
_ABBREVIATED = {"pre": "preprocess", "post": "postprocess"}


@functools.lru_cache(maxsize=1024)
def normalize_stage(label: str) -> str:
    """A stage label → one of the convention's names, else lower_snake of the label."""
    text = clean_label(label) or label
    if text.strip().lower() in _ABBREVIATED:
        return _ABBREVIATED[text.strip().lower()]
    for rx, name in _STAGE_PATTERNS:
        if rx.search(text):
            return name
    return _snake(text)


def known_stage(label: str) -> str | None:
    text = clean_label(label) or label
    for rx, name in _STAGE_PATTERNS:
        if rx.search(text):
            return name
    return None


# ---------------------------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One timed call with the input size (elements of its largest input) it ran on."""

    size: int
    ms: float
    shapes: tuple[tuple[int, ...], ...]
    unit_assumed: bool


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    context: list[str]
    line_no: int


class Corr:
    """Streaming Pearson correlation and least-squares slope of y on x (exact, O(1) memory)."""

    def __init__(self) -> None:
        self.n = 0
        self.sx = self.sy = self.sxx = self.syy = self.sxy = 0.0

    def add(self, x: float, y: float) -> None:
        self.n += 1
        self.sx += x
        self.sy += y
        self.sxx += x * x
        self.syy += y * y
        self.sxy += x * y

    def _cov(self) -> tuple[float, float, float]:
        n = self.n
        return (self.sxy - self.sx * self.sy / n, self.sxx - self.sx**2 / n, self.syy - self.sy**2 / n)

    @property
    def r(self) -> float | None:
        if self.n < 3:
            return None
        cxy, cxx, cyy = self._cov()
        if cxx <= 0 or cyy <= 0:
            return None
        return cxy / math.sqrt(cxx * cyy)

    @property
    def slope(self) -> float | None:
        if self.n < 3:
            return None
        cxy, cxx, _ = self._cov()
        return cxy / cxx if cxx > 0 else None


MAX_SHAPES = 10_000  # distinct (batch size, input tokens) pairs remembered for "new shape"


@dataclass
class StageLog:
    requests: int = 0
    stages: dict[str, Series] = field(default_factory=dict)
    stage_totals: dict[str, float] = field(default_factory=dict)
    e2e: Series = field(default_factory=Series)
    e2e_total: float = 0.0
    ttft: Series = field(default_factory=Series)
    input_tokens: Series = field(default_factory=Series)
    output_tokens: Series = field(default_factory=Series)
    batch: Series = field(default_factory=Series)
    errors: int = 0
    ts_min: float = math.inf
    ts_max: float = -math.inf
    bad_lines: int = 0
    first_e2e: list[float] = field(default_factory=list)
    e2e_by_index: list[tuple[int, float]] = field(default_factory=list)
    shapes_seen: set[tuple[float, float]] = field(default_factory=set)
    new_shape: Series = field(default_factory=Series)
    ttft_vs_input: Corr = field(default_factory=Corr)
    e2e_vs_input: Corr = field(default_factory=Corr)
    ttft_vs_queue: Corr = field(default_factory=Corr)


@dataclass
class Usage:
    lines: int = 0
    cached: float = 0.0
    prompt: float = 0.0
    per_line_prompt: Series = field(default_factory=Series)


@dataclass
class TimingRecords:
    stage_log: StageLog
    spans: dict[str, Series]
    calls: list[Call]
    untagged: Series  # timing lines with no shape
    tables: list[Table]
    usage: Usage
    prose_ttft_ms: Series
    prose_prompt_tokens: Series
    unit_assumed: int
    unitless_stages: frozenset[str] = frozenset()  # stages whose times carried no unit: shares only


# ---------------------------------------------------------------------------------------------
# line patterns
# ---------------------------------------------------------------------------------------------

_SHAPE = re.compile(
    r"torch\.Size\(\[(?P<a>\d+(?:\s*,\s*\d+)*)\]\)"
    r"|shape\s*[=:]?\s*[\[(](?P<b>\d+(?:\s*,\s*\d+)*),?[\])]"
    r"|(?<![\w\]])\((?P<c>\d+(?:\s*,\s*\d+)+),?\)"
)
_SIZE_KV = re.compile(
    r"(?<![\w.])(?:batch_size|batch|bs|seq_len|seqlen|sequence_length|seq_length|input_len|input_length|prompt_len|"
    r"length|len|num_tokens|n_tokens)\s*[:=]\s*(?P<n>\d+)\b",
    re.IGNORECASE,
)
_PAREN_DIGIT = re.compile(r"\(\s*\d")
_SIZE_WORDS = ("batch", "bs", "len", "tokens")
_TIMING = re.compile(
    r"(?<![\w.])(?P<agg>(?:avg|mean|median|p\d{2,3}|min|max|total|std|average)[\s_.-]*)?"
    r"(?P<key>cost|took|time taken|elapsed(?:_time)?|latency|duration|runtime|run time|inference time|infer time|"
    r"time|time_ms|latency_ms|elapsed_ms|cost_ms|duration_ms)"
    rf"(?P<sep>\s*[:=]\s*|\s+)(?P<v>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*(?P<u>{TIME_UNIT})?(?![\w/:-])",
    re.IGNORECASE,
)
_SPAN = re.compile(
    r"(?:span[=:\s]+|\[)?(?P<stage>queue|queueing|pre-?process(?:ing)?|tokeni[sz](?:e|ation)|h2d|"
    r"prefill|decode|d2h|post-?process(?:ing)?|detokeni[sz](?:e|ation)|inference|forward|network)"
    # (its key's word after it: "Preprocess time: 151us", YOLOv8-TensorRT-CPP's breakdown, one stage a line)
    r"\]?(?:[ _-]?(?:time|cost|latency|duration))?(?P<ms_key>_ms)?\s*(?:[:=]\s*)?(?:[^\d\s]{1,3}\s*)?"
    r"(?P<v>\d+(?:\.\d+)?)\s*"
    # (a rate, not a stage's time: "Decode time: 22 ms per token", "Inference time: 2.3 s for 100 images")
    rf"(?P<u>{TIME_UNIT})?(?![\w/%])(?!\s+per\s)(?!\s+for\s+\d)",
    re.IGNORECASE,
)
# value first, as a list on one line: "Speed: 11.4ms preprocess, 62.3ms inference, 2442.7ms postprocess per image"
# (ultralytics YOLOv5/v8/11 print it for every run; YOLOv5's last stage is "NMS", its pre-processing "pre-process")
_SPAN_AFTER = re.compile(
    rf"(?P<v>\d+(?:\.\d+)?)\s*(?P<u>{TIME_UNIT})\s+(?P<stage>pre-?process(?:ing)?|inference|forward|"
    r"post-?process(?:ing)?|NMS|tokeni[sz](?:e|ation)|decode|prefill|queue)(?![\w-])",
    re.IGNORECASE,
)
# key first, as a list of fields on one line, each stage with its time: "preprocess time = 7.47456; infer time =
# 1213.42; postprocess time = 3.12787" (TensorRT demos), "pre-process: 9.67ms, inference: 1.0ms, post-process: 0.29ms";
# a list of two or more is a program's breakdown even where its numbers carry no unit
_SPAN_FIELD = re.compile(
    r"(?<![\w-])(?P<stage>pre-?process(?:ing)?|post-?process(?:ing)?|infer(?:ence)?|forward|tokeni[sz](?:e|ation)|"
    r"detokeni[sz](?:e|ation)|decode|prefill|queue|nms|h2d|d2h)(?:[ _-]?(?P<key>time|cost|latency|duration))?"
    # the key's unit as a suffix or in brackets ("preprocess_time(ms): 75.1885", PaddleSeg's benchmark log)
    rf"(?:(?P<ms_key>_ms)|\s?\((?P<ku>{TIME_UNIT})\))?\s*[:=]\s*(?P<v>\d+(?:\.\d+)?)(?:\s*(?P<u>{TIME_UNIT})(?![\w/%.])|(?![\w/%.]|\s*[A-Za-z]))",
    re.IGNORECASE,
)
# a program's stage breakdown, one stage a line, its name in brackets before the time (C++ demos print it after every
# inference: "[Preprocess   ] cost time: 19.340 ms" … "[Infer total  ] cost time: 198.171 ms"); the total is the sum's
_LABELLED = re.compile(
    r"^\s*\[\s*(?P<label>[A-Za-z][A-Za-z0-9 _./-]{0,38}?)\s*\]\s*(?:cost|took|time|elapsed|latency|duration)"
    rf"(?: time| cost)?\s*[:=]?\s*(?P<v>\d+(?:\.\d+)?)\s*(?P<u>{TIME_UNIT})(?![\w/])",
    re.IGNORECASE,
)
# ... or with dot leaders to its time, as a tree or a list (senko's diarization: "├── Fbank feature extraction .....
# done [36.74s]", then "Total diarization time: 51.89s"); the total closes it as a bracketed breakdown's does
_LEADER = re.compile(
    r"^[\s│├└─|`*•-]*(?P<label>[A-Za-z][A-Za-z0-9 _/()-]{0,40}?)\s*\.{4,}\s*(?:(?:done|ok|finished|took)\s*)?"
    rf"[\[(]?\s*(?P<v>\d+(?:\.\d+)?)\s*(?P<u>{TIME_UNIT})\s*[\])]?\s*$",
    re.IGNORECASE,
)
# a start-up's steps printed the same way: fetching, loading, building, warming up (not a request's path)
_STARTUP_LABEL = re.compile(r"\b(?:download\w*|load(?:ing|s)?|init\w*|start\w*|warm\w*|compil\w*|build\w*"
                            r"|install\w*|fetch\w*)\b", re.IGNORECASE)
_LEADER_TOTAL = re.compile(
    r"^[\s│├└─|`*•-]*(?P<label>(?:[A-Za-z][\w-]*\s+){0,3}?total(?:\s+[A-Za-z][\w-]*){0,3}?)\s*(?:[:=]|\.{4,})\s*"
    rf"(?P<v>\d+(?:\.\d+)?)\s*(?P<u>{TIME_UNIT})\s*$",
    re.IGNORECASE,
)
# a log record's level or tag in brackets, not a stage ("[INFO] time: 3 ms")
_NOT_STAGE = re.compile(r"(?:info|warn(?:ing)?|error|debug|trace|fatal|notice|[iwedv]|main|log)", re.IGNORECASE)
MAX_BLOCK = 32  # stage lines held before a total
SUM_SLACK = 0.1  # stages within 10 % of their total add up to it (rounding, untimed glue between stages)
_TOTAL_LABEL = re.compile(r"\b(?:total|overall|e2e|end[- ]?to[- ]?end)\b", re.IGNORECASE)
# a breakdown printed as one line of fields, each a short label and a time, split by "|" (CenterNet's demo after every
# image: "tot 0.044s |load 0.000s |pre 0.013s |net 0.026s |dec 0.002s |post 0.003s |merge 0.000s |"): a breakdown
# where one field is the total and the others add up to it, whatever the labels are
_PIPED_FIELD = re.compile(
    rf"^\s*(?P<label>[A-Za-z][A-Za-z0-9_.-]{{0,23}}?)(?:[ _](?:time|duration|latency))?\s*[:=]?\s*"
    rf"(?P<v>\d+(?:\.\d+)?)\s*(?P<u>{TIME_UNIT})\s*$",
    re.IGNORECASE,
)
# a training or evaluation loop's step time beside the part of it spent waiting for the next batch, on one line:
# pytorch/examples' ProgressMeter ("Time 1.599 (2.648)  Data 1.296 (2.388)", the value then its running mean),
# mmengine's and detectron2's loggers ("time: 0.5432  data_time: 0.0123"); seconds, as they print them. The wait is
# the input pipeline's (loading, decoding, augmenting on the host), the rest the step's own
_STEP_TIME = re.compile(r"(?<![\w.])time[:=]?\s+(?P<v>\d+(?:\.\d+)?)(?![\w.])", re.IGNORECASE)
_DATA_WAIT = re.compile(r"(?<![\w.])data(?:_time)?[:=]?\s+(?P<v>\d+(?:\.\d+)?)(?![\w.])", re.IGNORECASE)
_LOOP_LINE = re.compile(r"(?<![\w.])(?:loss|epoch|iter|eta|lr)\b|\[\s*\d+\s*/\s*\d+\s*\]", re.IGNORECASE)
_PIPED_TOTAL = re.compile(r"tot|total|overall|all|e2e|end[-_]?to[-_]?end", re.IGNORECASE)
# a run's or a request's label, numbered or ordinal: what a list of runs is made of, not a breakdown's stages
_RUN_LABEL = re.compile(r"(?:run|req(?:uest)?|iter(?:ation)?|trial|try|epoch|step|batch|round)?[_.-]?\d+"
                        r"|first|second|third|fourth|fifth|last|1st|2nd|3rd|\d+th", re.IGNORECASE)
_SPAN_NAMED = re.compile(
    r"(?:span|name)[=:\s]+['\"]?(?P<stage>\w[\w.-]*)['\"]?.{0,60}?(?:duration|dur|took|elapsed)(?P<ms_key>_ms)?"
    rf"[=:\s]+(?P<v>\d+(?:\.\d+)?)\s*(?P<u>{TIME_UNIT})?",
    re.IGNORECASE,
)
# substrings that gate the regexes (lower case): most lines of a big log contain none of them
_SPAN_WORDS = ("queue", "preprocess", "pre-process", "tokeni", "h2d", "prefill", "decode", "d2h", "postprocess",
               "post-process", "detokeni", "inference", "forward", "network", "span")
_TIMING_WORDS = ("cost", "took", "time", "elapsed", "latency", "duration")
_PROSE_WORDS = ("ttft", "first token", "context", "prompt", "input")
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
# an aligned table with no rules (``TimingParser._aligned_line``): cells apart by two spaces or a tab; a label is a
# few short words, no number alone; a row's cell a number with its unit or percent
_ALIGNED_SPLIT = re.compile(r"\s{2,}|\t")
_ALIGNED_LABEL = re.compile(r"(?=[^\d]*[A-Za-z])[A-Za-z#(][\w()/%#.:-]*(?: [\w()/%#.:-]+){0,2}")
_ALIGNED_NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*\s?(?:%|[A-Za-zµ/]{1,8})?")
_TABLE_BORDER = re.compile(r"^\s*[|+][-=:+| ]+[|+]\s*$")
_USAGE_FIELDS = re.compile(
    r"['\"`]?(?P<k>cache_read_(?:input_)?tokens|cache_(?:write|creation)_(?:input_)?tokens|cached_tokens|"
    r"prompt_tokens|input_tokens|completion_tokens|output_tokens)['\"`]?\s*[:=]\s*(?P<v>\d+)"
)
_PROSE_TTFT = re.compile(
    r"(?:\bTTFT\b|time to first token|time for first token|first[- ]token latency)[^.\d|]{0,40}?"
    rf"(?P<v>\d+(?:\.\d+)?)\s*(?P<u>{TIME_UNIT})\b",
    re.IGNORECASE,
)
_PROSE_PROMPT = re.compile(
    r"(?:(?:context|prompts?|input)[\s(:=~]{0,4}(?:length|len|of|size)?[\s(:=~]{0,4}(?P<a>\d+(?:\.\d+)?)\s*(?P<ak>[kK])?\b"
    r"|(?<![\d.])(?P<b>\d+(?:\.\d+)?)\s*(?P<bk>[kK])?[- ]?tokens?\s+(?:prompts?|context|inputs?))",
    re.IGNORECASE,
)
_AGG_LINE = re.compile(r"\busec\b|perf_analyzer|Avg request latency|Request concurrency", re.IGNORECASE)


def _ms(v: str, unit: str | None, ms_key: bool) -> tuple[float, bool]:
    """The value in ms and whether the unit was assumed."""
    if unit:
        return to_ms(float(v), unit), False
    if ms_key:
        return float(v), False
    return to_ms(float(v), "s"), True


class TimingParser:
    """Feed cleaned lines; ``records()`` gives everything recognised."""

    def __init__(self) -> None:
        self.stage_log = StageLog()
        self.spans: dict[str, Series] = {}
        self.unitless_stages: set[str] = set()  # stages of a field list with no unit: their shares only
        self.calls: list[Call] = []
        # untagged timings by the template of their line (the line without its digits): a per-call timing
        # repeats one template ("cost: 100.49" on every call), a start-up phase ("init engine took 63.00 s",
        # "Initializing model took 0.39 seconds") is printed once and is no call's latency
        self._untagged: dict[str, Series] = {}
        # bracket-labelled stage times of the breakdowns whose total they add up to, and the open block's lines
        self._labelled_spans: dict[str, Series] = {}
        self._block: list[tuple[str, float, str]] = []
        self._block_startup: list[bool] = []  # whether each held stage is a start-up's step
        self.tables: list[Table] = []
        self.usage = Usage()
        self.prose_ttft = Series()
        self.prose_prompt = Series()
        self.unit_assumed = 0
        self._pending_shapes: list[tuple[int, ...]] = []
        self._context: deque[str] = deque(maxlen=CONTEXT_LINES)
        self._table: Table | None = None
        self._aligned_head: list[str] | None = None  # an aligned table's labels, while its rows may follow
        self._aligned_rows: list[list[str]] = []
        self._n = 0
        self.lines = 0

    # -- feeding ----------------------------------------------------------------------------

    def feed(self, line: str) -> None:
        self._n += 1
        stripped = line.strip()
        head = stripped[:1]
        self._aligned_line(stripped)
        if head in ("|", "+"):
            if _TABLE_ROW.match(line) or (self._table is not None and _TABLE_BORDER.match(line)):
                self._table_line(stripped)
                return
            if head == "+" and _TABLE_BORDER.match(line):
                self._table = Table([], [], list(self._context), self._n)
                return
        self._end_table()
        if head == "{" and self._json(stripped):
            return
        if stripped:
            self._context.append(stripped)
        low = line.lower()
        if "_tokens" in low:
            self._usage(line)
        if ("usec" in low or "latency" in low or "concurrency" in low) and _AGG_LINE.search(line):
            return
        shapes = self._shapes(line) if ("(" in line or "shape" in low or "len" in low or "batch" in low
                                        or "bs" in low or "tokens" in low) else []
        if head == "[" and self._labelled(line):
            return
        if ("...." in line or (self._block and "total" in low)) and self._leader(line):
            return
        if (line.count("|") >= 2 and self._piped(line)) or (line.count(",") >= 2 and self._piped(line, ",")):
            return
        if "data" in low and "time" in low and self._data_wait(line):
            return
        spanned = any(w in low for w in _SPAN_WORDS) and self._spans(line)
        timed = spanned or (any(w in low for w in _TIMING_WORDS) and self._timing(line, shapes))
        if shapes and not timed:
            self._pending_shapes.extend(shapes)
            del self._pending_shapes[:-16]
        if any(w in low for w in _PROSE_WORDS):
            self._prose(line, low)

    def _shapes(self, line: str) -> list[tuple[int, ...]]:
        out = []
        low = line.lower()
        # cheap pre-checks: the shape regexes have no literal prefix and cost ~10 µs a line
        maybe = "size(" in low or "shape" in low or _PAREN_DIGIT.search(line)
        for m in _SHAPE.finditer(line) if maybe else ():
            dims = tuple(int(d) for d in re.findall(r"\d+", m.group("a") or m.group("b") or m.group("c")))
            if dims and all(d < 10**9 for d in dims) and len(dims) <= 8:
                out.append(dims)
        if ("=" not in line and ":" not in line) or not any(w in low for w in _SIZE_WORDS):
            return out
        kv = tuple(int(m.group("n")) for m in _SIZE_KV.finditer(line))[:8]
        if kv and all(d < 10**9 for d in kv):
            out.append(kv)  # batch=4 seq_len=128: one input of 4 × 128
        return out

    def _timing(self, line: str, shapes: list[tuple[int, ...]]) -> bool:
        for m in _TIMING.finditer(line):
            if m.group("agg"):
                continue
            if m.group("sep").isspace() and not m.group("u"):
                continue  # "took 3" without a unit or a colon is prose
            ms, assumed = _ms(m.group("v"), m.group("u"), m.group("key").lower().endswith("_ms"))
            if not math.isfinite(ms):
                continue
            call_shapes = shapes or self._pending_shapes
            self._pending_shapes = []
            if assumed:
                self.unit_assumed += 1
            if call_shapes and len(self.calls) < MAX_CALLS:
                size = max(math.prod(s) for s in call_shapes)
                self.calls.append(Call(size, ms, tuple(call_shapes), assumed))
            else:
                template = line.translate(_NO_DIGITS).strip()
                series = self._untagged.get(template)
                if series is None and len(self._untagged) < MAX_TEMPLATES:
                    series = self._untagged[template] = Series()
                if series is not None:
                    series.add(ms)
            self.lines += 1
            return True
        return False

    def _spans(self, line: str) -> bool:
        """Stage spans on the line; True when there was one (then it is not a per-call timing)."""
        m = _SPAN_NAMED.search(line)
        if m and known_stage(m.group("stage")):
            ms, assumed = _ms(m.group("v"), m.group("u"), bool(m.group("ms_key")))
            self._span(normalize_stage(m.group("stage")), ms, assumed)
            return True
        after = list(_SPAN_AFTER.finditer(line))
        if len(after) < 2:
            # each field a time by its unit or its key ("prefill: 2048, decode: 128" are token counts)
            fields = [m for m in _SPAN_FIELD.finditer(line)
                      if m.group("u") or m.group("key") or m.group("ms_key") or m.group("ku")]
            stages = [normalize_stage(m.group("stage")) for m in fields]
            if len(set(stages)) >= 2:
                if not any(m.group("u") or m.group("ms_key") or m.group("ku") for m in fields):
                    # no unit anywhere: seconds or milliseconds, the line does not say; only the stages' shares of
                    # their sum are known
                    for stage, m in zip(stages, fields, strict=True):
                        self._span(stage, float(m.group("v")), False)
                    self.unitless_stages.update(stages)
                    return True
                after = fields
        if len(after) >= 2:
            # a list of stages, each with its time: one request's (or image's) breakdown
            for m in after:
                stage = "postprocess" if m.group("stage").upper() == "NMS" else normalize_stage(m.group("stage"))
                unit = m.group("u") or m.groupdict().get("ku")  # the value's unit, or its key's
                ms, assumed = _ms(m.group("v"), unit, bool(m.groupdict().get("ms_key")))
                self._span(stage, ms, assumed)
            return True
        found = False
        for m in _SPAN.finditer(line):
            if not (m.group("u") or m.group("ms_key")):
                continue  # a stage word next to a bare number is prose, not a span
            ms, assumed = _ms(m.group("v"), m.group("u"), bool(m.group("ms_key")))
            self._span(normalize_stage(m.group("stage")), ms, assumed)
            found = True
        return found

    def _labelled(self, line: str) -> bool:
        """A stage of a bracket-labelled breakdown; its total line is the sum's, no stage of its own."""
        m = _LABELLED.match(line)
        if m is None:
            return False
        label = " ".join(m.group("label").split())
        if _NOT_STAGE.fullmatch(label):
            return False
        return self._block_line(label, to_ms(float(m.group("v")), m.group("u")), line)

    def _leader(self, line: str) -> bool:
        """A stage of a breakdown printed with dot leaders (``├── Fbank feature extraction ..... done [36.74s]``),
        or, while such stages are open, the ``Total …: 51.89s`` line that closes them."""
        m = _LEADER.match(line)
        if m is None and self._block:
            m = _LEADER_TOTAL.match(line)
        if m is None:
            return False
        label = " ".join(m.group("label").split())
        return self._block_line(label, to_ms(float(m.group("v")), m.group("u")), line,
                                startup=bool(_STARTUP_LABEL.search(label)))

    def _block_line(self, label: str, ms: float, line: str, startup: bool = False) -> bool:
        """One line of a breakdown printed a stage a line: a stage is held; the total closes the block where the
        stages held add up to it, unless every stage is a start-up's step (downloading, loading, building: a
        start-up's progress, "Download weights ........ done [120.4s]", no request's stages)."""
        if not _TOTAL_LABEL.search(label):
            self._block.append((normalize_stage(label), ms, line))
            self._block_startup.append(startup)
            if len(self._block) > MAX_BLOCK:
                self._replay(self._block.pop(0)[2])
                self._block_startup.pop(0)
            return True
        if self._block_startup and all(self._block_startup):
            block, self._block, self._block_startup = self._block, [], []
            for _, _, held in block:
                self._replay(held)
            return False
        # the total closes a breakdown only where its stages add up to it (bevdet's do exactly); lines that compare
        # things ("[PyTorch] … [TensorRT] … [Total] …", "[Rank 0] … [Rank 1] …") do not, and stay calls' timings
        block, self._block, self._block_startup = self._block, [], []
        parts = sum(v for _, v, _ in block)
        if len({stage for stage, _, _ in block}) >= 2 and ms > 0 and abs(parts - ms) <= SUM_SLACK * ms:
            for stage, v, _ in block:
                self._breakdown_stage(stage, v)
            return True
        for _, _, held in block:
            self._replay(held)
        return False  # the total, and the lines before it, are timed calls (read as before)

    def _data_wait(self, line: str) -> bool:
        """A loop's step time and its wait for data (``_STEP_TIME``, ``_DATA_WAIT``): the wait is the input
        pipeline's stage, the rest the step's compute. Read where the wait is within the step, as the loggers
        measure it."""
        t, d = _STEP_TIME.search(line), _DATA_WAIT.search(line)
        if t is None or d is None or not _LOOP_LINE.search(line):
            return False  # a loop's progress line names its epoch, iteration, loss or learning rate too
        step, wait = float(t.group("v")), float(d.group("v"))
        if wait > step or step <= 0:
            return False
        self._span("preprocess", to_ms(wait, "s"), True)
        self._span("compute", to_ms(step - wait, "s"), True)
        return True

    def _piped(self, line: str, sep: str = "|") -> bool:
        """A one-line breakdown of "|"-separated fields (``_PIPED_FIELD``), or comma-separated ones ("total time 930us,
        op time 38us,  malloc time 7us,  copy time 876us", ggml#463): read when three or more fields are times, one of
        them the total, and the rest add up to it (within ``SUM_SLACK``); then each other field is a stage."""
        cells = [c for c in line.split(sep) if c.strip()]
        fields = [_PIPED_FIELD.match(c) for c in cells]
        if len(fields) < 3 or any(m is None for m in fields):
            return False
        timed = [(m.group("label"), to_ms(float(m.group("v")), m.group("u"))) for m in fields if m is not None]
        if any(_RUN_LABEL.fullmatch(label) for label, _ in timed):
            return False  # runs or requests listed with their total ("total 93s, first 31s, second 31s"): no stages
        labels = {label.lower() for label, _ in timed}
        model = {"net": "compute"} if {"pre", "post"} <= labels else {}  # CenterNet's "net" between its pre and post
        totals = [ms for label, ms in timed if _PIPED_TOTAL.fullmatch(label)]
        parts: dict[str, float] = {}  # stage → its time in this line (two fields of one stage add up)
        for label, ms in timed:
            if not _PIPED_TOTAL.fullmatch(label):
                stage = model.get(label.lower()) or normalize_stage(label)
                parts[stage] = parts.get(stage, 0.0) + ms
        if len(totals) != 1 or len(parts) < 2 or totals[0] <= 0:
            return False
        if abs(sum(parts.values()) - totals[0]) > SUM_SLACK * totals[0]:
            return False  # the fields are no breakdown of the total (a comparison, several runs)
        for stage, ms in parts.items():
            self._breakdown_stage(stage, ms)
        return True

    def _breakdown_stage(self, stage: str, ms: float) -> None:
        """One stage's time in a breakdown whose total its stages were checked against."""
        series = self._labelled_spans.get(stage)
        if series is None:
            series = self._labelled_spans[stage] = Series()
        series.add(ms)
        self.lines += 1

    def _replay(self, line: str) -> None:
        """A held stage line that made no breakdown: a timed call, as it would have been read."""
        self._timing(line, [])

    def _span(self, stage: str, ms: float, assumed: bool) -> None:
        if not math.isfinite(ms):
            return
        if stage not in self.spans:
            self.spans[stage] = Series()
        self.spans[stage].add(ms)
        self.unit_assumed += assumed
        self.lines += 1

    def _usage(self, line: str) -> None:
        fields: dict[str, int] = {}
        for m in _USAGE_FIELDS.finditer(line):
            fields.setdefault(m.group("k").lower(), int(m.group("v")))
        if not fields:
            return
        read = next((v for k, v in fields.items() if k.startswith("cache_read")), None)
        write = next((v for k, v in fields.items() if k.startswith(("cache_write", "cache_creation"))), None)
        cached = fields.get("cached_tokens")
        if read is not None or write is not None:
            # Anthropic-style: input_tokens is the uncached, unwritten remainder
            prompt = (read or 0) + (write or 0) + fields.get("input_tokens", 0)
            hit = read or 0
        elif "prompt_tokens" in fields:
            prompt, hit = fields["prompt_tokens"], cached or 0
        elif "input_tokens" in fields:
            prompt, hit = fields["input_tokens"], cached or 0
        else:
            return
        if cached is None and read is None and write is None:
            # no cache field at all: the prompt length is known, the hit ratio is not
            self.usage.per_line_prompt.add(float(prompt))
            self.lines += 1
            return
        self.usage.lines += 1
        self.usage.cached += hit
        self.usage.prompt += prompt
        self.usage.per_line_prompt.add(float(prompt))
        self.lines += 1

    def _prose(self, line: str, low: str) -> None:
        if "ttft" in low or "first token" in low or "first-token" in low:
            m = _PROSE_TTFT.search(line)
            if m:
                self.prose_ttft.add(to_ms(float(m.group("v")), m.group("u")))
        if "token" in low or "k" in low:
            m = _PROSE_PROMPT.search(line)
            if m:
                v = float(m.group("a") or m.group("b"))
                k = m.group("ak") or m.group("bk")
                tokens = v * 1000 if k else v
                if 16 <= tokens <= 10_000_000:
                    self.prose_prompt.add(tokens)

    # -- JSON lines -------------------------------------------------------------------------

    def _json(self, text: str) -> bool:
        if "stages_ms" not in text and '"duration' not in text and "end_time" not in text:
            return False
        try:
            doc = json.loads(text)
        except ValueError:
            self.stage_log.bad_lines += 1
            return "stages_ms" in text
        if not isinstance(doc, dict):
            return False
        if isinstance(doc.get("stages_ms"), dict):
            self._stage_record(doc)
            return True
        name = doc.get("name")
        dur = _span_duration_ms(doc)
        if isinstance(name, str) and dur is not None and known_stage(name):
            self._span(normalize_stage(name), dur, False)
            return True
        return False

    @staticmethod
    def _per_request(log: StageLog, doc: dict[str, object], e2e: float, stages: dict[object, object]) -> None:
        """Order-dependent figures: cold start, new shapes, latency against input size."""
        index = log.requests  # requests are counted after this record
        if len(log.first_e2e) < FIRST_REQUESTS:
            log.first_e2e.append(e2e)
        # a bounded, evenly thinned list of (index, e2e): the second half is chosen at the end
        log.e2e_by_index.append((index, e2e))
        if len(log.e2e_by_index) > 2 * RESERVOIR:
            log.e2e_by_index = log.e2e_by_index[::2]
        tokens, batch = _num(doc.get("input_tokens")), _num(doc.get("batch_size"))
        if tokens is not None or batch is not None:
            shape = (batch or 0.0, tokens or 0.0)
            if shape not in log.shapes_seen:
                if index >= FIRST_REQUESTS:
                    log.new_shape.add(e2e)
                if len(log.shapes_seen) < MAX_SHAPES:
                    log.shapes_seen.add(shape)
        ttft = _num(doc.get("ttft_ms"))
        if tokens is not None:
            log.e2e_vs_input.add(tokens, e2e)
            if ttft is not None:
                log.ttft_vs_input.add(tokens, ttft)
        queue = _num(stages.get("queue"))
        if ttft is not None and queue is not None:
            log.ttft_vs_queue.add(queue, ttft)

    def _stage_record(self, doc: dict[str, object]) -> None:
        log = self.stage_log
        stages = doc["stages_ms"]
        assert isinstance(stages, dict)
        total = 0.0
        for name, raw in stages.items():
            v = _num(raw)
            if v is None or v < 0:
                continue
            stage = normalize_stage(str(name))
            series = log.stages.get(stage)
            if series is None:
                series = log.stages[stage] = Series()
            series.add(v)
            log.stage_totals[stage] = log.stage_totals.get(stage, 0.0) + v
            total += v
        e2e = _num(doc.get("e2e_ms"))
        e2e = e2e if e2e is not None and e2e >= total * 0.5 else total
        log.e2e.add(e2e)
        log.e2e_total += e2e
        self._per_request(log, doc, e2e, stages)
        for key, series in (("ttft_ms", log.ttft), ("input_tokens", log.input_tokens),
                            ("output_tokens", log.output_tokens), ("batch_size", log.batch)):
            v = _num(doc.get(key))
            if v is not None:
                series.add(v)
        ts = _num(doc.get("ts"))
        if ts is not None:
            log.ts_min, log.ts_max = min(log.ts_min, ts), max(log.ts_max, ts)
        status = doc.get("status")
        if isinstance(status, str) and status.lower() not in ("ok", "success", "200"):
            log.errors += 1
        log.requests += 1
        self.lines += 1

    # -- tables -----------------------------------------------------------------------------

    def _table_line(self, stripped: str) -> None:
        if self._table is None:
            self._table = Table([], [], list(self._context), self._n)
        if _TABLE_BORDER.match(stripped):
            return
        cells = [c.strip() for c in stripped.strip("|").split("|")]
        if not self._table.header:
            self._table.header = cells
        elif len(self._table.rows) < 200:
            self._table.rows.append(cells)

    def _aligned_line(self, stripped: str) -> None:
        """A table a program or a person printed in aligned columns with no rules: a header of short labels, then
        rows of numbers alone, as many as the labels (a sweep: "prompt_tok   ttft_s   tok/s" over "284  1.170
        242.7"). Only observed: the lines go on to every other reading."""
        cells = [c for c in _ALIGNED_SPLIT.split(stripped) if c]
        if len(cells) == 1 and self._aligned_head is None:
            cells = stripped.split()  # a header spaced by one: its labels are single words then
        if self._aligned_head is not None:
            for row in (cells, stripped.split()):  # apart by two spaces, or by one between numbers
                if len(row) == len(self._aligned_head) + 1 and row[0] == str(len(self._aligned_rows)):
                    row = row[1:]  # a pandas DataFrame's index column (0, 1, 2, …), which its header leaves blank
                if len(row) == len(self._aligned_head) and all(_ALIGNED_NUMBER.fullmatch(c) for c in row):
                    self._aligned_rows.append(row)
                    return
            self._close_aligned()
        if 2 <= len(cells) <= 12 and all(_ALIGNED_LABEL.fullmatch(c) for c in cells) \
                and not all(" " in c for c in cells):
            self._aligned_head, self._aligned_rows = cells, []

    def _close_aligned(self) -> None:
        head, rows = self._aligned_head, self._aligned_rows
        self._aligned_head, self._aligned_rows = None, []
        if head is not None and len(rows) >= 2 and len(self.tables) < MAX_TABLES:
            self.tables.append(Table(head, rows[:200], list(self._context)[:-1 - len(rows)], self._n))

    def _end_table(self) -> None:
        t = self._table
        if t is None:
            return
        self._table = None
        if t.header and t.rows and len(self.tables) < MAX_TABLES:
            self.tables.append(t)
            self.lines += 1 + len(t.rows)

    @property
    def untagged(self) -> Series:
        """The untagged timings of every template seen at least ``MIN_REPEATS`` times: the calls."""
        out = Series()
        for series in self._untagged.values():
            if series.n >= MIN_REPEATS:
                out.merge(series)
        return out

    def records(self) -> TimingRecords:
        self._end_table()
        self._close_aligned()
        block, self._block, self._block_startup = self._block, [], []
        for _, _, held in block:  # stage lines no total closed: timed calls
            self._replay(held)
        untagged, spans = self.untagged, self.spans
        if self._labelled_spans:  # breakdowns: their stages beside the spans read otherwise
            spans = dict(spans)
            for stage, series in self._labelled_spans.items():
                merged = Series()
                for part in (spans.get(stage), series):
                    if part is not None:
                        merged.merge(part)
                spans[stage] = merged
        return TimingRecords(self.stage_log, spans, self.calls, untagged, self.tables, self.usage,
                             self.prose_ttft, self.prose_prompt, self.unit_assumed, frozenset(self.unitless_stages))


def _num(raw: object) -> float | None:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        return None
    return float(raw) if math.isfinite(raw) else None


def _span_duration_ms(doc: dict[str, object]) -> float | None:
    for key, scale in (("duration_ms", 1.0), ("duration_us", 1e-3), ("duration_ns", 1e-6), ("duration", 1.0)):
        v = _num(doc.get(key))
        if v is not None:
            return v * scale
    start, end = _num(doc.get("start_time")), _num(doc.get("end_time"))
    if start is not None and end is not None and end >= start:
        span = end - start
        # OpenTelemetry exports nanoseconds since the epoch; others seconds
        return span * 1e-6 if start > 1e15 else span * 1000.0
    return None
