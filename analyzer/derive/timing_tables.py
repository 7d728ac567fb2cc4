"""Timing tables → what they say: a stage breakdown, a variant comparison or load conditions.

``diagnose.collectors.timing`` keeps each Markdown/ASCII table it reads as it stands (header, rows and the
lines just before it); this module interprets one: stage breakdowns (rows of stages with ms and
share columns), variant comparisons (``| PIL reference | 76.25 fps | 13.11 ms/frame |`` vs a faster
path) and load conditions (rows of concurrency / prompt length with a latency metric).
``diagnose.derive.timing`` turns the results into evidence.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from statistics import median

from diagnose.collectors.timing import Table, clean_label, known_stage, normalize_stage
from diagnose.collectors.units import TIME_UNIT, to_ms


@dataclass(frozen=True)
class CellValue:
    value: float  # the representative value (median if given, else mean of a range, else the number)
    low: float
    high: float
    unit: str  # "ms", "s", "%", "fps", "" …
    approx: bool = False


_NUM = r"(?<![\d.,])[-−]?\d+(?:[.,]\d+)?"
_CELL_MMM = re.compile(rf"min\s*(?P<lo>{_NUM}).{{0,40}}?med(?:ian)?\s*(?P<med>{_NUM}).{{0,40}}?max\s*(?P<hi>{_NUM})",
                       re.I)
_CELL_RANGE = re.compile(rf"(?P<lo>{_NUM})\s*(?:–|—|-|to|~)\s*(?P<hi>{_NUM})")
_CELL_ONE = re.compile(rf"(?P<approx>[~≈]\s*)?(?P<v>{_NUM})")
_CELL_UNIT = re.compile(rf"(?P<u>%|fps|it/s|req/s|rps|tok/s|tokens/s|{TIME_UNIT})$", re.I)


def _f(s: str) -> float:
    return float(s.replace("−", "-").replace(",", "."))


# a thousands separator: a comma, space or thin space before each group of three digits ("122,880", "16 467",
# "1,234.5"); a comma before one, two or four digits, or after a leading 0, is a decimal comma ("1,5", "0,930")
_THOUSANDS = re.compile(r"(?<![\d.,])([1-9]\d{0,2})((?:,\d{3})+|(?:[ \u00a0\u202f]\d{3})+)(?![\d,]|[ \u00a0\u202f]\d)")


def parse_cell(cell: str) -> CellValue | None:
    text = " ".join(_THOUSANDS.sub(lambda m: m.group(1) + re.sub(r"\D", "", m.group(2)),
                                   re.sub(r"[*_`]", "", cell)).split())
    if not text or not re.search(r"\d", text) or len(text) > 200:
        return None
    um = _CELL_UNIT.search(text)
    unit = um.group("u").lower() if um else ""
    m = _CELL_MMM.search(text)
    if m:
        return CellValue(_f(m.group("med")), _f(m.group("lo")), _f(m.group("hi")), unit)
    m = _CELL_RANGE.fullmatch(re.sub(rf"(?:{TIME_UNIT}|%)$", "", text, flags=re.I).rstrip())
    if m:
        lo, hi = _f(m.group("lo")), _f(m.group("hi"))
        return CellValue((lo + hi) / 2, lo, hi, unit)
    m = _CELL_ONE.search(text)
    if m and re.fullmatch(rf"[~≈]?\s*[+]?{_NUM}\s*(?:%|fps|it/s|req/s|rps|tok/s|tokens/s|x|×|{TIME_UNIT})?", text,
                          re.I):
        v = _f(m.group("v"))
        return CellValue(v, v, v, unit, bool(m.group("approx")))
    return None


@dataclass(frozen=True)
class StageRow:
    stage: str
    label: str
    ms: float | None  # None in a table of shares alone
    share: float | None


@dataclass(frozen=True)
class StageTable:
    rows: tuple[StageRow, ...]
    total_ms: float | None
    total_label: str
    total_is_ttft: bool


@dataclass(frozen=True)
class VariantTable:
    stage: str  # the stage the variants differ in
    slow_label: str
    fast_label: str
    slow_ms: float
    fast_ms: float
    from_fps: bool
    evidence_words: tuple[str, ...]

    @property
    def delta_share(self) -> float:
        return (self.slow_ms - self.fast_ms) / self.slow_ms if self.slow_ms > 0 else 0.0


@dataclass(frozen=True)
class LoadLevel:
    """One measured load of a sweep: the requests in flight, the throughput served, a latency (ms) if timed."""

    concurrency: float
    throughput: float
    latency_ms: float | None = None


@dataclass(frozen=True)
class Plateau:
    """Where a sweep's throughput stops rising: from ``start`` requests in flight to ``end`` the throughput grows by
    ``gain`` at most, while the latency (when timed) grows by ``latency_ratio``."""

    start: float
    end: float
    gain: float
    latency_ratio: float | None

    @property
    def span(self) -> float:
        return self.end / self.start


PLATEAU_MIN_SPAN = 2.0  # concurrency at least doubles past the plateau's start
PLATEAU_MAX_GAIN = 1.15  # ... while the throughput rises by 15 % at most


def load_plateau(levels: list[LoadLevel]) -> Plateau | None:
    """The sweep's plateau: the lowest load from which every higher load, up to one at least ``PLATEAU_MIN_SPAN``
    times its concurrency, serves within ``PLATEAU_MAX_GAIN`` × its throughput, up or down; None when the throughput
    still rises to the last level, or falls (a collapse under load is thrashing, not a full server)."""
    by_c: dict[float, LoadLevel] = {}
    for lv in levels:
        if lv.concurrency > 0 and lv.throughput > 0 and (
                lv.concurrency not in by_c or lv.throughput > by_c[lv.concurrency].throughput):
            by_c[lv.concurrency] = lv
    ordered = [by_c[c] for c in sorted(by_c)]
    if len(ordered) < 2:
        return None
    last = ordered[-1]
    for i, lv in enumerate(ordered[:-1]):
        later = ordered[i + 1:]
        if last.concurrency / lv.concurrency >= PLATEAU_MIN_SPAN and all(
                lv.throughput / PLATEAU_MAX_GAIN <= x.throughput <= PLATEAU_MAX_GAIN * lv.throughput for x in later):
            gain = max(x.throughput for x in later) / lv.throughput
            ratio = (last.latency_ms / lv.latency_ms if last.latency_ms is not None and lv.latency_ms
                     else None)
            return Plateau(lv.concurrency, last.concurrency, gain, ratio)
    return None


def sweep_evidence(levels: list[LoadLevel], where: str) -> list[tuple[str, float, str, str]]:
    """A load sweep as evidence (key, value, unit, detail): the concurrency it spans, the throughput's gain across
    it, and its plateau when the throughput stops rising."""
    ordered = sorted((lv for lv in levels if lv.concurrency > 0 and lv.throughput > 0), key=lambda lv: lv.concurrency)
    if len({lv.concurrency for lv in ordered}) < 2:
        return []
    lo, hi = ordered[0], ordered[-1]
    out = [("scaling.concurrency_range", hi.concurrency / lo.concurrency, "ratio",
            f"{where}: {len({lv.concurrency for lv in ordered})} load levels, {lo.concurrency:g} to "
            f"{hi.concurrency:g} requests in flight"),
           ("scaling.throughput.concurrency_ratio", hi.throughput / lo.throughput, "ratio",
            f"{where}: throughput at {hi.concurrency:g} in flight over at {lo.concurrency:g} "
            f"({lo.throughput:g} → {hi.throughput:g})")]
    flat = load_plateau(ordered)
    if flat is not None:
        out.append(("scaling.plateau_concurrency", flat.start, "requests",
                    f"{where}: the throughput stops rising at {flat.start:g} in flight (at most {flat.gain:.2f}× "
                    f"more up to {flat.end:g})"))
        out.append(("scaling.plateau_span", flat.span, "ratio",
                    f"{where}: the concurrency past the plateau's start, {flat.start:g} → {flat.end:g}"))
        out.append(("scaling.plateau_throughput_gain", flat.gain, "ratio",
                    f"{where}: the throughput's gain across the plateau"))
        start = next((lv for lv in ordered if lv.concurrency == flat.start), None)
        if start is not None and lo.throughput > 0:
            out.append(("scaling.plateau_rise", start.throughput / lo.throughput, "ratio",
                        f"{where}: the throughput's rise up to the plateau, {lo.concurrency:g} → {flat.start:g} in "
                        f"flight ({lo.throughput:g} → {start.throughput:g})"))
        if flat.latency_ratio is not None:
            out.append(("scaling.plateau_latency_ratio", flat.latency_ratio, "ratio",
                        f"{where}: the latency at {flat.end:g} in flight over at {flat.start:g}"))
    return out


@dataclass(frozen=True)
class ConditionTable:
    metric: str  # normalised stage/metric name of the timed column: queue, ttft, e2e, …
    prompt_length_ratio: float | None
    concurrency_ratio: float | None
    long_value_ms: float | None
    long_max_ms: float | None
    short_max_ms: float | None
    rows: int
    # a sweep's served throughput by concurrency (a rate column beside the loads), lowest load first
    levels: tuple[LoadLevel, ...] = ()


_STAGE_HEADERS = re.compile(r"^(?:stage|phase|step|component|span|segment|part|breakdown|where)s?$", re.I)
_MS_HEADER = re.compile(r"\bms\b|millisec|\btime\b|latency|duration|\(s\)|seconds|\bsec\b", re.I)
# a column that counts (calls, invocations, launches) is no time, however bare its numbers
_COUNT_HEADER = re.compile(r"\bcalls?\b|\bcounts?\b|^#|^n$|\bnum\b|number|\btimes\b|invocations?|occurrences?|"
                           r"\blaunch(?:es)?\b|\binstances\b", re.I)
_PER_HEADER = re.compile(r"\bper\b|\bavg\b|average|\bmean\b|median|\bp\d{2}\b", re.I)
_NOT_TIME_SHARE = re.compile(r"memory|\bmem\b|vram|\butil|\bMi?B\b|\bGi?B\b|\bcpu\b|\bgpu\b|power|energy|"
                             r"\bsize\b|bytes", re.I)
# a decimal comma: after a leading 0, or before one, two or four and more digits ("0,800", "12,5", "1,2345")
_DECIMAL_COMMA = re.compile(r"(?<![\d.,])0,\d|\d,\d{1,2}(?!\d)|\d,\d{4,}")
_SHARE_HEADER = re.compile(r"share|%|percent|fraction|of total|ratio", re.I)
_FPS_HEADER = re.compile(r"\bfps\b|frames?/s|it/s|throughput|img/s|images/s|req/s|rps", re.I)
_PER_ITEM_MS = re.compile(r"ms\s*/\s*(?:frame|image|img|item|request|req|batch|call|sample)|latency|\bms\b", re.I)
_DELTA_ROW = re.compile(r"^(?:Δ|delta|diff|difference|change|speed-?up|improvement|gain|ratio)\b", re.I)
_TOTAL_ROW = re.compile(r"^(?:total|sum|overall|e2e|end[- ]to[- ]end|all)\b", re.I)
_TTFT_LABEL = re.compile(r"first\w*(?:event|token|byte|chunk)|\bttft\b|time[- _]?to[- _]?first", re.I)
_CONDITION_WORDS = re.compile(
    r"\bload\b|concurren|\bc\s*=\s*\d|\bidle\b|sequential|prompts?\b|requests?\b|\bbatch|\bqps\b|\brps\b|"
    r"input len|context", re.I)
_METRIC_HEADERS = re.compile(r"queue|ttft|first token|latency|e2e|itl|tpot|prefill|decode|wait|首次|延迟|时延", re.I)
# a column of served rates (throughput, tokens or requests per second), not of times: "aggregate decode" in tok/s
_RATE_HEADER = re.compile(r"throughput|\btok(?:en)?s?\s*/\s*s\b|\breq(?:uest)?s?\s*/\s*s\b|\brps\b|\bqps\b|"
                          r"infer(?:ences?)?\s*/\s*s(?:ec)?\b|\bit/s\b|\bfps\b|speed|per\s+sec|吞吐", re.I)
_RATE_UNITS = ("tok/s", "tokens/s", "req/s", "rps", "it/s", "fps")
# ... of one request's or user's rate, not what the server serves in all
_PER_REQUEST = re.compile(r"per[- ](?:user|request|req|stream|seq\w*|query)|/\s*(?:user|req|request|stream)\b|"
                          r"\beach\b|single|scaling|vs\b|单", re.I)
# the column of the load: requests in flight
# (not a batch size, a tensor-parallel size or a server's parallel slots: those change the server, not its load)
_LOAD_HEADER = re.compile(r"concurren|并发|\bclients?\b|\busers\b|in[- ]flight|^c$", re.I)
# the served column says it is the whole server's: a throughput, a total, an aggregate, requests per second
_SERVED_HEADER = re.compile(r"throughput|\btotal\b|aggregate|\breq(?:uest)?s?\s*/\s*s\b|\brps\b|\bqps\b|"
                            r"infer(?:ences?)?\s*/\s*s(?:ec)?\b|吞吐", re.I)

_VARIANT_STAGE_WORDS: dict[str, re.Pattern[str]] = {
    "preprocess": re.compile(
        r"pre[- _]?process\w*|\bresiz\w*|normali[sz]\w*|\bPIL\b|pillow|opencv|\bcv2\b|torchvision\.transforms|"
        r"letterbox|image decod\w*|jpeg|tokeni[sz]\w*", re.I),
    "h2d": re.compile(r"\bh2d\b|host[- ]to[- ]device|pinned|pin_memory|memcpy|\bcopies\b|\bcopy\b|transfers?", re.I),
    "postprocess": re.compile(r"post[- _]?process\w*|\bnms\b|detokeni[sz]\w*", re.I),
}
_CPU_PATH = re.compile(r"\bPIL\b|pillow|\bcpu\b|numpy|opencv|\bcv2\b|reference|baseline|before|=\s*false|\boff\b", re.I)
_GPU_PATH = re.compile(r"\bgpu\b|cuda|triton|kernel|dali|nvjpeg|=\s*true|\bon\b|after|fast", re.I)


def _concurrency(text: str) -> float | None:
    m = re.search(r"\bc\s*=\s*(\d+)|(\d+)\s+concurren\w*|concurren\w*\s*[:=]?\s*(\d+)", text, re.I)
    if m:
        return float(next(g for g in m.groups() if g))
    if re.search(r"\bidle\b|sequential|single request|one at a time", text, re.I):
        return 1.0
    return None


def _prompt_class(text: str) -> tuple[str | None, float | None]:
    m = re.search(r"(\d+(?:\.\d+)?)\s*([kK])?[- ]?tokens?", text)
    tokens = None
    if m:
        tokens = float(m.group(1)) * (1000 if m.group(2) else 1)
    if tokens is not None and tokens >= 1000:
        return "long", tokens
    if tokens is not None and tokens <= 256:
        return "short", tokens
    if re.search(r"\blong(?:er)?\s+(?:prompts?|context|inputs?)", text, re.I):
        return "long", tokens
    if re.search(r"\bshort(?:er)?\s+(?:prompts?|inputs?)", text, re.I):
        return "short", tokens
    return None, tokens


def _cell_ms(cell: CellValue, header: str) -> float:
    # (a header's unit in brackets, in words, or as its suffix: "ttft_s", "TTFT s")
    seconds = re.search(r"\(s\)|seconds|\bsec\b|[_\s]s$", header, re.I)
    unit = cell.unit if cell.unit not in ("", "%") else ("s" if seconds else "ms")
    return to_ms(cell.value, unit, "ms")


@dataclass(frozen=True)
class PowerSweep:
    """A table of one workload run at several GPU power limits: the lowest and highest cap (W) and how much faster
    the work ran at the highest than at the lowest (its rate's ratio, or the inverse of its time's)."""

    low_w: float
    high_w: float
    speedup: float
    rows: int
    measure: str  # the column the speed was read from


# a power limit's column: "cap", "Cap (W)", "power limit", "power cap", "PL", "TDP" with watts in its cells
_POWER_HEADER = re.compile(r"^(?:power[- _]?)?(?:cap|limit)\b|power[- _]?(?:cap|limit)|^pl$|\btdp\b", re.I)
_WATTS = re.compile(r"^\s*[*_`]*\s*(?P<w>\d{2,4}(?:\.\d+)?)\s*W?\b", re.I)
_SWEEP_TIME_HEADER = re.compile(r"\bavg\b|\bmean\b|median|\btime\b|latency|duration|\(s\)|\bsec", re.I)


def power_sweep(header: list[str], rows: list[list[str]], raw_first: str = "") -> PowerSweep | None:
    """The table's power-limit sweep (``PowerSweep``): its first column a power cap in watts, at two caps or more,
    and a column of the work's rate (a throughput: tok/s, TPS, it/s) or time per run; None otherwise. Watts must be
    said: in the raw header ("Cap (W)", "power limit", "TDP") or on every cap ("175W"); a "cap" of sequences or a
    "limit (GB)" is no power limit."""
    if not header or not _POWER_HEADER.search(header[0]):
        return None
    other_unit = re.search(r"\((?!\s*(?:w|watts?)\s*\))[^)]*\)", raw_first, re.I)
    said = bool(re.search(r"power|watt|\(\s*w\s*\)|\btdp\b", raw_first, re.I)) and other_unit is None
    if not said and not all(re.match(r"^\s*[*_`]*\s*\d{2,4}(?:\.\d+)?\s*(?:W|watts?)\b", r[0], re.I)
                            for r in rows if r[0].strip()):
        return None
    caps = [(float(m.group("w")), r) for r in rows if (m := _WATTS.match(r[0])) is not None]
    if len({w for w, _ in caps}) < 2 or not all(30 <= w <= 2000 for w, _ in caps):
        return None
    for i, h in enumerate(header[1:], start=1):
        if re.search(r"°|temp|power \(|actual|clk|clock|throttle|%|p-?state|/w\b", h, re.I):
            continue  # what the cap does to the card (its draw, clocks, temperature), not how fast the work ran
        rate = _rate_column(h, rows, i) or bool(re.search(r"\btps\b|tok/s|it/s|fps", h, re.I))
        timed = not rate and bool(_SWEEP_TIME_HEADER.search(h))
        if not (rate or timed):
            continue
        vals = [(w, c) for w, r in caps if (c := parse_cell(r[i])) is not None and c.value > 0
                and (rate or c.unit in ("", "s", "ms", "sec", "secs", "seconds"))]
        if len({w for w, _ in vals}) < 2:
            continue
        lo = min(vals, key=lambda x: x[0])
        hi = max(vals, key=lambda x: x[0])
        speedup = hi[1].value / lo[1].value if rate else lo[1].value / hi[1].value
        return PowerSweep(lo[0], hi[0], speedup, len(vals), h)
    return None


@dataclass(frozen=True)
class PromptSweep:
    """A table of one request at a time run with prompts of several lengths: the time to first token against the
    prompt's tokens, fitted as ``ttft = intercept + slope × tokens`` (least squares)."""

    rows: int
    shortest_tokens: float
    longest_tokens: float
    longest_ttft_ms: float
    slope_ms_per_token: float
    intercept_ms: float
    r2: float
    measure: str  # the TTFT column's header

    @property
    def prompt_share(self) -> float:
        """The part of the longest prompt's TTFT that grows with the prompt (the slope's), 0 to 1."""
        if self.longest_ttft_ms <= 0:
            return 0.0
        return max(0.0, min(1.0, self.slope_ms_per_token * self.longest_tokens / self.longest_ttft_ms))


# the prompt's length in tokens: "prompt_tok", "Input tokens", "ISL", "context length", "prompt len"
_PROMPT_HEADER = re.compile(r"^(?:prompt|input|context|ctx|isl)(?![a-z])[\s_-]*(?:tok\w*|len\w*|size|\(tok\w*\))?$"
                            r"|^(?:#\s*)?(?:prompt|input) tokens?$|^isl$", re.I)
_TTFT_HEADER = re.compile(r"(?<![a-z])ttft(?![a-z])|first[\s_-]*token|time[\s_-]*to[\s_-]*first"
                          r"|\bprefill[\s_-]*(?:time|ms|s)\b", re.I)
_THOUSAND_TOKENS = re.compile(r"(\d+(?:\.\d+)?)\s?[kK]")
MIN_SWEEP_ROWS = 3  # three prompt lengths at least: two points always fit a line
MIN_SWEEP_SPAN = 4.0  # the longest prompt at least four times the shortest: a sweep, not noise around one length


def prompt_sweep(header: list[str], rows: list[list[str]]) -> PromptSweep | None:
    """The table's prompt-length sweep (``PromptSweep``): a column of prompt tokens and one of TTFT, at
    ``MIN_SWEEP_ROWS`` lengths or more spanning ``MIN_SWEEP_SPAN`` ×, and no column of concurrency (a load sweep
    mixes the queue into the TTFT); None otherwise."""
    tok = next((i for i, h in enumerate(header) if _PROMPT_HEADER.search(h.strip())), None)
    ttft = next((i for i, h in enumerate(header) if i != tok and _TTFT_HEADER.search(h)), None)
    if tok is None or ttft is None or any(_LOAD_HEADER.search(h) for h in header):
        return None
    points: list[tuple[float, float]] = []
    for r in rows:
        k = _THOUSAND_TOKENS.fullmatch(r[tok].strip())  # "1K", "16k": thousands of tokens
        n, v = parse_cell(r[tok]), parse_cell(r[ttft])
        tokens = float(k.group(1)) * 1000 if k else (n.value if n is not None and not n.unit else None)
        if tokens is None or v is None or tokens <= 0 or v.value < 0:
            continue
        points.append((tokens, _cell_ms(v, header[ttft])))
    if len({x for x, _ in points}) < MIN_SWEEP_ROWS:
        return None
    xs, ys = [x for x, _ in points], [y for _, y in points]
    if max(xs) < MIN_SWEEP_SPAN * min(xs):
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    intercept = my - slope * mx
    r2 = (slope * slope * sxx / syy) if syy > 0 else 0.0
    longest = max(points)
    return PromptSweep(len(points), min(xs), longest[0], longest[1], slope, intercept, r2, header[ttft])


def analyze_table(t: Table) -> StageTable | VariantTable | ConditionTable | PowerSweep | PromptSweep | None:
    """What one table says about timing, or None when it is not a timing table."""
    header = [clean_label(h) for h in t.header]
    if len(header) < 2 or not t.rows:
        return None
    rows = _decimal_commas([(r + [""] * len(header))[: len(header)] for r in t.rows])
    labels = [clean_label(r[0]) for r in rows]
    first = header[0]
    swept = power_sweep(header, rows, t.header[0])
    if swept is not None:
        return swept
    prompts = prompt_sweep(header, rows)
    if prompts is not None:
        return prompts
    if _STAGE_HEADERS.match(first):
        return _stage_table(header, rows, labels)
    fps_cols = [i for i, h in enumerate(header) if i and _FPS_HEADER.search(h)]
    ms_cols = [i for i, h in enumerate(header) if i and _PER_ITEM_MS.search(h)]
    body = [(lab, r) for lab, r in zip(labels, rows, strict=True) if not _DELTA_ROW.match(lab)]
    if (fps_cols or ms_cols) and not any(_CONDITION_WORDS.search(lab) for lab, _ in body) and len(body) >= 2:
        got = _variant_table(header, body, fps_cols, ms_cols, t.context)
        if got is not None:
            return got
    rate_cols = [i for i in range(1, len(header)) if _rate_column(header[i], rows, i)]
    metric_cols = [i for i, h in enumerate(header)
                   if i and i not in rate_cols and (_METRIC_HEADERS.search(h) or _MS_HEADER.search(h))]
    loads = bool(re.search(r"load|concurren|并发|condition|scenario|setup|workload", first, re.I)
                 or sum(bool(_CONDITION_WORDS.search(" ".join(r))) for r in rows) >= 2)
    if metric_cols and loads:
        return _condition_table(header, rows, metric_cols[-1], _served(header, rate_cols))
    if rate_cols and _LOAD_HEADER.search(first):
        return _condition_table(header, rows, metric_cols[-1] if metric_cols else None, _served(header, rate_cols))
    if sum(known_stage(lab) is not None for lab in labels) >= 2 and ms_cols:
        return _stage_table(header, rows, labels)
    return None


def _decimal_commas(rows: list[list[str]]) -> list[list[str]]:
    """The rows with every comma of a column that writes decimal commas ("12,5", "0,800") made a point, so that its
    "1,250" is 1.25 as its neighbours' numbers are: a separator is the column's convention, not each cell's."""
    cols = {i for r in rows for i, cell in enumerate(r) if i and _DECIMAL_COMMA.search(cell)}
    if not cols:
        return rows
    return [[cell.replace(",", ".") if i in cols else cell for i, cell in enumerate(r)] for r in rows]


def _count_column(header: str, rows: list[list[str]], i: int) -> bool:
    """A column that counts (calls, launches) rather than times: its header says so, not as a rate ("per call",
    "avg per launch"), and none of its cells carries a time unit."""
    if not _COUNT_HEADER.search(header) or _PER_HEADER.search(header):
        return False
    return not any((c := parse_cell(r[i])) is not None and c.unit not in ("", "%") for r in rows)


def _stage_table(header: list[str], rows: list[list[str]], labels: list[str]) -> StageTable | None:
    ms_col = next((i for i, h in enumerate(header) if i and _MS_HEADER.search(h) and not _SHARE_HEADER.search(h)),
                  None)
    # a share of the time: not of memory, of a device's utilisation or of the CPU
    share_col = next((i for i, h in enumerate(header) if i and _SHARE_HEADER.search(h)
                      and not _NOT_TIME_SHARE.search(h)), None)
    if ms_col is None:  # a column of bare numbers is the time, unless it counts something
        ms_col = next((i for i in range(1, len(header)) if not _count_column(header[i], rows, i) and i != share_col
                       and not _NOT_TIME_SHARE.search(header[i])
                       and any((c := parse_cell(r[i])) is not None and c.unit not in ("%",) for r in rows)), None)
    if ms_col is None and share_col is None:
        return None
    out: list[StageRow] = []
    total_ms: float | None = None
    total_label = ""
    has_shares = share_col is not None and any(parse_cell(x[share_col]) for x in rows)
    for lab, r in zip(labels, rows, strict=True):
        cell = parse_cell(r[ms_col]) if ms_col is not None else None
        if cell is None and (ms_col is not None or share_col is None or parse_cell(r[share_col]) is None):
            continue
        ms = _cell_ms(cell, header[ms_col]) if cell is not None and ms_col is not None else None
        share = None
        if share_col is not None:
            sc = parse_cell(r[share_col])
            if sc is not None:
                share = sc.value / 100.0 if (sc.unit == "%" or sc.value > 1.0) else sc.value
        if _TOTAL_ROW.match(lab) or (has_shares and share is None and _TTFT_LABEL.search(r[0])):
            total_ms, total_label = ms, lab
            continue
        out.append(StageRow(normalize_stage(lab), lab, ms, share))
    if len(out) < 2 and total_ms is None:
        return None
    return StageTable(tuple(out), total_ms, total_label, bool(total_label and _TTFT_LABEL.search(total_label)))


def _variant_table(header: list[str], body: list[tuple[str, list[str]]], fps_cols: list[int],
                   ms_cols: list[int], context: list[str]) -> VariantTable | None:
    variants: list[tuple[str, float, bool]] = []
    for lab, r in body:
        ms: float | None = None
        from_fps = False
        for i in ms_cols:
            c = parse_cell(r[i])
            if c is not None and c.value > 0:
                ms = _cell_ms(c, header[i])
                break
        if ms is None:
            for i in fps_cols:
                c = parse_cell(r[i])
                if c is not None and c.value > 0 and c.unit != "%":
                    ms, from_fps = 1000.0 / c.value, True
                    break
        if ms is not None:
            variants.append((lab, ms, from_fps))
    if len(variants) < 2:
        return None
    slow = max(variants, key=lambda v: v[1])
    fast = min(variants, key=lambda v: v[1])
    if slow[1] <= fast[1]:
        return None
    text = "\n".join([*context, slow[0], fast[0]])
    hits = {stage: rx.findall(text) for stage, rx in _VARIANT_STAGE_WORDS.items()}
    ranked = sorted(hits.items(), key=lambda kv: -len(kv[1]))
    stage, words = ranked[0]
    runner_up = len(ranked[1][1]) if len(ranked) > 1 else 0
    if len(words) < 2 or len(words) <= runner_up:
        return None
    if stage == "preprocess" and _GPU_PATH.search(slow[0]) and _CPU_PATH.search(fast[0]) \
            and not _CPU_PATH.search(slow[0]):
        return None  # the slow variant is the GPU path: nothing says the CPU is the problem
    return VariantTable(stage, slow[0], fast[0], slow[1], fast[1], slow[2] or fast[2],
                        tuple(dict.fromkeys(w.lower() for w in words)))


def _rate_column(header: str, rows: list[list[str]], i: int) -> bool:
    """A column of rates: its header names one, or its cells carry a rate's unit and no other (a unit written on the
    first row only: "~255 tok/s", then "280", "268")."""
    if _RATE_HEADER.search(header):
        return True
    units = {c.unit for r in rows if (c := parse_cell(r[i])) is not None} - {""}
    return bool(units) and units <= set(_RATE_UNITS)


def _served(header: list[str], rate_cols: list[int]) -> int | None:
    """The rate column of what the server serves in all: the first whose header says so (a throughput, a total,
    an aggregate, requests per second) and not of one request's or user's rate. A bare "speed" or "tok/s" may be
    each slot's ("Generation speed (tok/s)" per llama-server slot falls as slots are added while the whole rises)."""
    return next((i for i in rate_cols if _SERVED_HEADER.search(header[i]) and not _PER_REQUEST.search(header[i])),
                None)


def _row_concurrency(header: list[str], r: list[str], skip: set[int]) -> float | None:
    conc = _concurrency(" ".join(c for i, c in enumerate(r) if i not in skip))
    if conc is None:
        for i, h in enumerate(header):
            if i not in skip and (re.search(r"concurren|并发", h, re.I) or (i == 0 and _LOAD_HEADER.search(h))):
                m = re.match(r"\s*[*_`]*\s*(?:c\s*=\s*)?(\d{1,3}(?:[, \u00a0\u202f]\d{3})+(?!\d)|\d+)", r[i], re.I)
                conc = float(re.sub(r"\D", "", m.group(1))) if m else None
                break
    return conc


def _condition_table(header: list[str], rows: list[list[str]], col: int | None,
                     rate: int | None = None) -> ConditionTable | None:
    skip = {i for i in (col, rate) if i is not None}
    levels: list[LoadLevel] = []
    parsed = []
    metric = header[col] if col is not None else ""
    for r in rows:
        conc = _row_concurrency(header, r, skip)
        cell = parse_cell(r[col]) if col is not None else None
        served = parse_cell(r[rate]) if rate is not None else None
        if conc is not None and served is not None and served.value > 0:
            levels.append(LoadLevel(conc, served.value, _cell_ms(cell, metric) if cell is not None else None))
        if cell is None:
            continue
        desc_cols = " ".join(f"{header[i]} {c}" for i, c in enumerate(r) if i not in skip)
        pclass, _tokens = _prompt_class(desc_cols)
        high = CellValue(cell.high, cell.high, cell.high, cell.unit)
        parsed.append((pclass, conc, _cell_ms(cell, metric), _cell_ms(high, metric)))
    sweep = tuple(sorted(levels, key=lambda lv: lv.concurrency)) if len({lv.concurrency for lv in levels}) >= 2 \
        else ()
    if col is None:
        return ConditionTable("", None, None, None, None, None, len(levels), sweep) if sweep else None
    name = "ttft" if re.search(r"ttft|first token|首次", metric, re.I) else normalize_stage(metric)
    if re.search(r"\be2e\b|end[- ]to[- ]end|^latency$", metric, re.I):
        name = "e2e"
    if len(parsed) < 2:
        return ConditionTable(name, None, None, None, None, None, len(levels), sweep) if sweep else None
    longs = [p for p in parsed if p[0] == "long"]
    shorts = [p for p in parsed if p[0] != "long"] if longs else [p for p in parsed if p[0] == "short"]
    ratio = None
    long_v = long_max = short_max = None
    if longs and shorts:
        long_v = median([p[2] for p in longs])
        long_max = max(p[3] for p in longs)
        short_max = max(p[3] for p in shorts)
        base = max(p[2] for p in shorts)
        ratio = long_v / base if base > 0 else math.inf
    conc_ratio = None
    pool = shorts if shorts else parsed
    with_c = [p for p in pool if p[1] is not None]
    if len({p[1] for p in with_c}) >= 2:
        lo = min(with_c, key=lambda p: (p[1], p[2]))
        hi = max(with_c, key=lambda p: (p[1], p[2]))
        if lo[2] > 0:
            conc_ratio = hi[2] / lo[2]
    if ratio is None and conc_ratio is None and not sweep:
        return None
    return ConditionTable(name, ratio, conc_ratio, long_v, long_max, short_max, len(parsed), sweep)
