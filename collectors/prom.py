"""Prometheus text exposition from serving engines: one scrape, or two (start and end of a window).

``ALIASES`` maps the metric names of vLLM (V0 and V1, old and renamed), SGLang, TGI, Triton, llama.cpp's
llama-server, TensorRT-LLM's trtllm-serve and LMDeploy onto ONE vocabulary of canonical series (``running``,
``waiting``, ``kv_usage``, ``ttft``, ``queue``, …) in one unit each, so everything downstream is engine- and
version-agnostic. To support another engine or a renamed metric, add its name to the ``names`` of the right
``Alias`` (or a new ``Alias``); nothing else changes.

Streaming and bounded: ``PromBuffer.feed(line)`` keeps only the lines of known metric families
(samples, ``# HELP``/``# TYPE``), at most ``MAX_LINES_PER_SCRAPE`` per scrape, and only the first
and the latest scrape. A new scrape starts at a ``# scrape at …`` comment, at a ``# HELP``/``# TYPE``
line for a family already seen, or at a series that repeats. ``PromBuffer.result()`` parses the kept
lines with ``prometheus_client.parser.text_string_to_metric_families`` and returns a ``PromResult``:
gauges per scrape, counter totals and deltas, and histograms (bucket deltas when two scrapes were
given) with p50/p90/p99 interpolated linearly within buckets, as ``histogram_quantile`` does.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from prometheus_client.parser import text_string_to_metric_families

MAX_LINES_PER_SCRAPE = 50_000  # a real engine exposes a few thousand lines; beyond this is not one scrape
QUANTILES = (0.5, 0.9, 0.99)


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"  # cumulative total; `_total` suffix optional in the exposition
    HISTOGRAM = "histogram"  # `_bucket{le=…}`, `_sum`, `_count` (a summary's `{quantile=…}` also accepted)


@dataclass(frozen=True)
class Alias:
    """One canonical series and the exposition names that mean it.

    ``names`` are metric base names (without ``_total``/``_bucket``/``_sum``/``_count``);
    ``scale`` converts the exposed unit to ``unit`` (seconds → ms is 1000); ``combine`` says how
    several label sets (models, engines, DP ranks) add up: ``sum`` or ``max``.
    """

    canonical: str
    names: tuple[str, ...]
    kind: Kind
    unit: str
    scale: float = 1.0
    combine: str = "sum"
    doc: str = ""


ALIASES: tuple[Alias, ...] = (
    # -- engine state (gauges) ---------------------------------------------------------------
    # llama.cpp's llama-server (--metrics): slots processing a request, and requests deferred for a free slot
    # TensorRT-LLM's trtllm-serve (tensorrt_llm/metrics/collector.py; its Prometheus exposition, beside the JSON
    # iteration stats of its /metrics, the gauges with enable_iter_perf_stats): its scheduler's numActiveRequests /
    # numQueuedRequests, and used over max KV-cache blocks (a fraction)
    Alias("running", ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size",
                      "llamacpp:requests_processing", "trtllm_num_requests_running",
                      "lmdeploy:num_requests_running"),
          Kind.GAUGE, "requests", doc="requests being served (in the running batch)"),
    Alias("waiting", ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size",
                      "nv_inference_pending_request_count", "llamacpp:requests_deferred",
                      "trtllm_num_requests_waiting", "lmdeploy:num_requests_waiting",
                      # LMDeploy's server holds requests for a free engine instance: they wait too (added up)
                      "lmdeploy:num_api_requests_waiting"),
          Kind.GAUGE, "requests", doc="requests waiting in the scheduler queue"),
    Alias("swapped", ("vllm:num_requests_swapped",), Kind.GAUGE, "requests"),
    # the engine's own limit on requests running at once (TensorRT-LLM: its scheduler's maxNumActiveRequests,
    # --max_batch_size times the pipeline-parallel size)
    Alias("running_limit", ("trtllm_max_num_active_requests",), Kind.GAUGE, "requests", combine="max",
          doc="the most requests the scheduler runs at once"),
    # vLLM names these "perc" but they are 0..1 fractions; SGLang token_usage is a fraction too
    Alias("kv_usage", ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc", "sglang:token_usage",
                       "trtllm_kv_cache_utilization", "lmdeploy:gpu_cache_usage_perc"),
          Kind.GAUGE, "ratio", combine="max", doc="KV-cache usage, fraction of the pool"),
    Alias("prefix_hit_rate", ("vllm:gpu_prefix_cache_hit_rate", "sglang:cache_hit_rate"),
          Kind.GAUGE, "ratio", combine="max", doc="prefix-cache hit rate (V0 / SGLang gauge)"),
    # -- counters ------------------------------------------------------------------------------
    Alias("preemptions", ("vllm:num_preemptions",), Kind.COUNTER, "count"),
    Alias("prompt_tokens", ("vllm:prompt_tokens", "sglang:prompt_tokens", "llamacpp:prompt_tokens",
                            "trtllm_prompt_tokens", "lmdeploy:prompt_tokens"), Kind.COUNTER, "tokens"),
    Alias("generation_tokens", ("vllm:generation_tokens", "sglang:generation_tokens", "llamacpp:tokens_predicted",
                                "trtllm_generation_tokens", "lmdeploy:generation_tokens"), Kind.COUNTER, "tokens"),
    # vLLM speculative decoding: draft tokens accepted (a step yields 1 + the accepted drafts per sequence)
    Alias("spec_accepted", ("vllm:spec_decode_num_accepted_tokens",), Kind.COUNTER, "tokens"),
    # llama-server: seconds spent processing prompts / generating, summed over requests
    Alias("prompt_seconds", ("llamacpp:prompt_seconds",), Kind.COUNTER, "s"),
    Alias("generation_seconds", ("llamacpp:tokens_predicted_seconds",), Kind.COUNTER, "s"),
    Alias("prefix_queries", ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"), Kind.COUNTER, "tokens"),
    Alias("prefix_hits", ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"), Kind.COUNTER, "tokens"),
    Alias("requests_success", ("vllm:request_success", "sglang:num_requests", "tgi_request_success",
                               "nv_inference_request_success", "trtllm_request_success"), Kind.COUNTER, "requests"),
    # Triton: cumulative durations over all requests → per-request means from deltas
    Alias("triton_queue_ms", ("nv_inference_queue_duration_us",), Kind.COUNTER, "ms", 1e-3),
    Alias("triton_compute_input_ms", ("nv_inference_compute_input_duration_us",), Kind.COUNTER, "ms", 1e-3),
    Alias("triton_compute_infer_ms", ("nv_inference_compute_infer_duration_us",), Kind.COUNTER, "ms", 1e-3),
    Alias("triton_compute_output_ms", ("nv_inference_compute_output_duration_us",), Kind.COUNTER, "ms", 1e-3),
    Alias("triton_request_ms", ("nv_inference_request_duration_us",), Kind.COUNTER, "ms", 1e-3),
    Alias("triton_inferences", ("nv_inference_count",), Kind.COUNTER, "inferences"),
    Alias("triton_executions", ("nv_inference_exec_count",), Kind.COUNTER, "executions"),
    # -- latency histograms (canonical unit ms) ---------------------------------------------------
    Alias("ttft", ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds",
                   "tgi_request_time_to_first_token_seconds", "trtllm_time_to_first_token_seconds",
                   "lmdeploy:time_to_first_token_seconds"),
          Kind.HISTOGRAM, "ms", 1000.0),
    Alias("ttft", ("nv_inference_first_response_histogram_ms",), Kind.HISTOGRAM, "ms", 1.0),
    Alias("itl", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds",
                  "sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds",
                  "tgi_request_mean_time_per_token_duration", "trtllm_time_per_output_token_seconds",
                  "lmdeploy:time_per_output_token_seconds"),
          Kind.HISTOGRAM, "ms", 1000.0),
    Alias("e2e", ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds",
                  "tgi_request_duration", "trtllm_e2e_request_latency_seconds", "lmdeploy:e2e_request_latency_seconds"),
          Kind.HISTOGRAM, "ms", 1000.0),
    Alias("queue", ("vllm:request_queue_time_seconds", "sglang:queue_time_seconds",
                    "tgi_request_queue_duration", "trtllm_request_queue_time_seconds",
                    "lmdeploy:request_queue_time_seconds"), Kind.HISTOGRAM, "ms", 1000.0),
    Alias("prefill", ("vllm:request_prefill_time_seconds", "trtllm_request_prefill_time_seconds",
                      "lmdeploy:request_prefill_time_seconds"),
          Kind.HISTOGRAM, "ms", 1000.0),
    Alias("decode", ("vllm:request_decode_time_seconds", "trtllm_request_decode_time_seconds",
                     "lmdeploy:request_decode_time_seconds"),
          Kind.HISTOGRAM, "ms", 1000.0),
    # TGI "inference" is prefill + decode of a continuously batched request, not one execution
    Alias("inference", ("tgi_request_inference_duration",), Kind.HISTOGRAM, "ms", 1000.0),
    Alias("preprocess", ("tgi_request_validation_duration",), Kind.HISTOGRAM, "ms", 1000.0),
    # Triton summaries (quantile labels), µs
    Alias("queue", ("nv_inference_queue_summary_us",), Kind.HISTOGRAM, "ms", 1e-3),
    Alias("compute_infer", ("nv_inference_compute_infer_summary_us",), Kind.HISTOGRAM, "ms", 1e-3),
    Alias("e2e", ("nv_inference_request_summary_us",), Kind.HISTOGRAM, "ms", 1e-3),
    # -- request size histograms (tokens) ------------------------------------------------------
    Alias("prompt_len", ("vllm:request_prompt_tokens", "sglang:prompt_tokens_histogram",
                         "tgi_request_input_length", "lmdeploy:request_prompt_tokens"), Kind.HISTOGRAM, "tokens"),
    Alias("output_len", ("vllm:request_generation_tokens", "tgi_request_generated_tokens",
                         "lmdeploy:request_generation_tokens"),
          Kind.HISTOGRAM, "tokens"),
    # vLLM (V0 and V1): tokens scheduled per engine step; its count is the engine's steps, so generated tokens
    # (less accepted speculative drafts: a sequence yields 1 + its accepted drafts a step) over steps is the mean
    # running batch
    Alias("step_tokens", ("vllm:iteration_tokens_total",), Kind.HISTOGRAM, "tokens",
          doc="tokens per engine step (its count: the steps)"),
)

BY_NAME: dict[str, Alias] = {}
for _a in ALIASES:
    for _n in _a.names:
        if _n in BY_NAME:
            raise RuntimeError(f"prometheus alias {_n} is listed twice")
        BY_NAME[_n] = _a

_ENGINE_OF = (("vllm:", "vllm"), ("sglang:", "sglang"), ("tgi_", "tgi"), ("nv_", "triton"), ("llamacpp:", "llama.cpp"),
              ("trtllm_", "tensorrt-llm"), ("lmdeploy:", "lmdeploy"))
_NAME = re.compile(r"^(?:#\s*(HELP|TYPE)\s+)?([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?")
# "# scrape at T" between concatenated scrapes (T: Unix seconds or ISO time); the DCGM reader shares it
SCRAPE_COMMENT = re.compile(r"^#\s*scrape\b(?:\s+(?:at|@))?\s*(.*)$", re.IGNORECASE)
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")


def _family_prefix(name: str) -> str:
    """``vllm:num_requests_running`` → ``vllm:``; ``tgi_batch_current_size`` → ``tgi_``."""
    cut = name.find(":")
    return name[: cut + 1] if cut >= 0 else name[: name.find("_") + 1] or name


# literal anchors of every line ``PromBuffer`` keeps: a known family's name prefix, or a comment
TRIGGERS: tuple[str, ...] = (*sorted({_family_prefix(n) for a in ALIASES for n in a.names}),
                              "# HELP", "# TYPE", "# scrape")


def lookup(sample_name: str) -> tuple[Alias, str] | None:
    """The alias of an exposed sample name and which part it is (value/total/bucket/sum/count)."""
    a = BY_NAME.get(sample_name)
    if a is not None:
        return a, "value" if a.kind is Kind.GAUGE else "total"
    for suffix in _SUFFIXES:
        if sample_name.endswith(suffix):
            a = BY_NAME.get(sample_name[: -len(suffix)])
            if a is not None:
                return a, suffix[1:]
    return None


def scrape_time(text: str) -> float | None:
    """The time of a ``# scrape at …`` comment: Unix seconds or an ISO time; None when neither."""
    text = text.strip().rstrip(":").strip()
    if not text:
        return None
    try:
        return float(text.split()[0])
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass
class _Scrape:
    lines: list[str] = field(default_factory=list)
    series: set[str] = field(default_factory=set)
    helps: set[str] = field(default_factory=set)
    types: set[str] = field(default_factory=set)
    at: float | None = None
    truncated: bool = False

    @property
    def empty(self) -> bool:
        return not self.series


@dataclass(frozen=True)
class Histogram:
    """A latency (or size) distribution in the alias's canonical unit."""

    count: float
    total: float
    quantiles: Mapping[float, float]
    windowed: bool  # from the delta of two scrapes (else: since the process started)
    summed: bool = True  # its ``_sum`` was exposed: a paste of the buckets alone has no total, so no mean

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 and self.summed else None


@dataclass(frozen=True)
class Counter:
    first: float
    last: float
    windowed: bool  # two scrapes: ``delta`` covers the window; else it is the lifetime total

    @property
    def delta(self) -> float:
        if not self.windowed:
            return self.last
        return self.last - self.first if self.last >= self.first else self.last  # a reset: count anew


@dataclass(frozen=True)
class PromResult:
    scrapes: int  # scrapes seen (only the first and the last are kept)
    window_s: float | None  # seconds between the first and the last kept scrape, when known
    engines: tuple[str, ...]
    gauges: Mapping[str, tuple[float, ...]]  # canonical → value per kept scrape
    counters: Mapping[str, Counter]
    histograms: Mapping[str, Histogram]
    truncated: bool
    bad_lines: int
    # the served model's name(s): the ``model_name`` label vLLM and SGLang put on every series
    models: tuple[str, ...] = ()


def interpolate_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """``histogram_quantile``: q in 0..1 over (upper bound, cumulative count) pairs."""
    bs = sorted(buckets)
    if not bs:
        return None
    total = bs[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_cum = 0.0, 0.0
    for le, cum in bs:
        if cum >= rank:
            if math.isinf(le):
                return prev_le  # the answer lies above the highest finite bound: report that bound
            if cum == prev_cum:
                return le
            lower = prev_le if prev_le <= le else 0.0
            return lower + (le - lower) * (rank - prev_cum) / (cum - prev_cum)
        prev_le, prev_cum = le, cum
    return bs[-1][0] if not math.isinf(bs[-1][0]) else prev_le


def _le(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class PromBuffer:
    """Keep the known-metric lines of the first and the latest scrape; parse them at the end."""

    def __init__(self, max_lines: int = MAX_LINES_PER_SCRAPE) -> None:
        self.max_lines = max_lines
        self.first: _Scrape | None = None
        self.current = _Scrape()
        self.scrapes_seen = 0
        self.recognised = 0
        self._pending_at: float | None = None

    def _new_scrape(self, at: float | None = None) -> None:
        if not self.current.empty:
            self.scrapes_seen += 1
            if self.first is None:
                self.first = self.current
            self.current = _Scrape(at=at)
        elif at is not None:
            self.current.at = at

    def feed(self, line: str) -> bool:
        """Offer one line; True when it belongs to a known metric family."""
        if not line:
            return False
        c = line[0]
        if c == "#":
            m = SCRAPE_COMMENT.match(line)
            if m:
                self._new_scrape(scrape_time(m.group(1)))
                return False
        elif not (c.isalpha() or c in "_:"):
            return False
        m = _NAME.match(line)
        if not m:
            return False
        directive, name = m.group(1), m.group(2)
        if lookup(name) is None:
            return False
        scrape = self.current
        if directive == "HELP":
            if name in scrape.helps:
                self._new_scrape()
                scrape = self.current
            scrape.helps.add(name)
        elif directive == "TYPE":
            if name in scrape.types:
                self._new_scrape()
                scrape = self.current
            scrape.types.add(name)
        else:
            if len(line) == m.end() or not line[m.end()].isspace():
                return False  # "name{…}" must be followed by the value
            key = name + (m.group(3) or "")
            if key in scrape.series:
                self._new_scrape()
                scrape = self.current
            scrape.series.add(key)
        if len(scrape.lines) >= self.max_lines:
            scrape.truncated = True
            return True
        scrape.lines.append(line)
        self.recognised += 1
        return True

    def matched(self) -> bool:
        return self.recognised > 0

    def result(self) -> PromResult:
        scrapes = [s for s in (self.first, self.current) if s is not None and not s.empty]
        bad = 0
        engines: dict[str, None] = {}
        parsed: list[dict[tuple[str, str], list[tuple[dict[str, str], float, float | None]]]] = []
        for s in scrapes:
            samples, nbad = _parse_lines(s.lines)
            bad += nbad
            parsed.append(samples)
            for line in s.lines:
                m = _NAME.match(line)
                if m:
                    for prefix, eng in _ENGINE_OF:
                        if m.group(2).startswith(prefix):
                            engines.setdefault(eng)
        times: list[float | None] = []
        for s, samples in zip(scrapes, parsed, strict=True):
            t = s.at
            if t is None:
                stamps = [ts for vals in samples.values() for _, _, ts in vals if ts is not None]
                t = max(stamps) if stamps else None
            times.append(t)
        window = None
        if len(scrapes) == 2 and times[0] is not None and times[1] is not None and times[1] > times[0]:
            window = times[1] - times[0]
        return PromResult(
            scrapes=self.scrapes_seen + (0 if self.current.empty else 1),
            window_s=window,
            engines=tuple(engines),
            gauges=_gauges(parsed),
            counters=_counters(parsed),
            histograms=_histograms(parsed),
            truncated=any(s.truncated for s in scrapes),
            bad_lines=bad,
            models=tuple(sorted({served for samples in parsed for vals in samples.values() for labels, _, _ in vals
                                 if (served := labels.get("model_name"))})),
        )


# (canonical, part) → [(labels, value scaled to the canonical unit, timestamp)]
_Samples = dict[tuple[str, str], list[tuple[dict[str, str], float, float | None]]]


def _parse_lines(lines: list[str]) -> tuple[_Samples, int]:
    out: _Samples = {}
    bad = 0

    def take(text: str) -> None:
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                hit = lookup(smp.name)
                if hit is None:
                    continue
                alias, part = hit
                if part == "created":
                    continue
                value = float(smp.value)
                if math.isnan(value):
                    continue
                labels = dict(smp.labels)
                if part == "bucket":
                    le = _le(labels.get("le", ""))
                    if le is None:
                        continue
                    labels["le"] = repr(le * alias.scale)  # bounds in the canonical unit
                elif "quantile" in labels and alias.kind is Kind.HISTOGRAM and part == "total":
                    part = "quantile"
                    value *= alias.scale
                elif part != "count":
                    value *= alias.scale
                ts = float(smp.timestamp) if smp.timestamp is not None else None
                out.setdefault((alias.canonical, part), []).append((labels, value, ts))

    try:
        take("\n".join(lines) + "\n")
    except Exception:  # the library raises ValueError/IndexError/… on a bad line: go line by line
        out.clear()
        for line in lines:
            if line.startswith("#"):
                continue
            try:
                take(line + "\n")
            except Exception:
                bad += 1
    return out, bad


def _combine(alias_combine: str, values: list[float]) -> float:
    return max(values) if alias_combine == "max" else sum(values)


_COMBINE = {a.canonical: a.combine for a in ALIASES}
_KIND = {a.canonical: a.kind for a in ALIASES}


def _gauges(parsed: list[_Samples]) -> dict[str, tuple[float, ...]]:
    names = {c for samples in parsed for (c, part) in samples if part == "value" and _KIND[c] is Kind.GAUGE}
    out: dict[str, tuple[float, ...]] = {}
    for c in sorted(names):
        vals: list[float] = []
        for samples in parsed:
            got = [v for _, v, _ in samples.get((c, "value"), [])]
            if got:
                vals.append(_combine(_COMBINE[c], got))
        out[c] = tuple(vals)
    return out


def _counters(parsed: list[_Samples]) -> dict[str, Counter]:
    names = {c for samples in parsed for (c, part) in samples if part == "total" and _KIND[c] is Kind.COUNTER}
    out: dict[str, Counter] = {}
    for c in sorted(names):
        per = [sum(v for _, v, _ in samples.get((c, "total"), [])) for samples in parsed
               if (c, "total") in samples]
        if not per:
            continue
        out[c] = Counter(first=per[0], last=per[-1], windowed=len(per) == 2)
    return out


def _buckets(samples: _Samples, c: str) -> dict[float, float]:
    acc: dict[float, float] = {}
    for labels, v, _ in samples.get((c, "bucket"), []):
        le = _le(labels.get("le", ""))
        if le is None:
            continue
        acc[le] = acc.get(le, 0.0) + v
    return acc


def _histograms(parsed: list[_Samples]) -> dict[str, Histogram]:
    names = {c for samples in parsed for (c, part) in samples if _KIND[c] is Kind.HISTOGRAM}
    out: dict[str, Histogram] = {}
    for c in sorted(names):
        present = [s for s in parsed if any(k[0] == c for k in s)]
        if not present:
            continue
        last = present[-1]
        windowed = len(present) == 2
        b_last = _buckets(last, c)
        s_last = sum(v for _, v, _ in last.get((c, "sum"), []))
        n_last = sum(v for _, v, _ in last.get((c, "count"), []))
        if windowed:
            first = present[0]
            b_first = _buckets(first, c)
            s_first = sum(v for _, v, _ in first.get((c, "sum"), []))
            n_first = sum(v for _, v, _ in first.get((c, "count"), []))
            if n_last >= n_first:  # else the process restarted between scrapes: keep the last as is
                b_last = {le: v - b_first.get(le, 0.0) for le, v in b_last.items()}
                s_last -= s_first
                n_last -= n_first
        if n_last <= 0 and b_last:
            n_last = max(b_last.values())
        qs: dict[float, float] = {}
        if b_last:
            # a quantile inside the lowest bucket is only known to lie below its bound: interpolating from 0
            # invents a spread (every request under 0.3 s reads as p50 150 ms, p99 297 ms), so it is left out
            lowest = min((le for le in b_last if not math.isinf(le) and le > 0), default=None)
            for q in QUANTILES:
                got = interpolate_quantile(q, b_last.items())
                if got is not None and not (lowest is not None and got <= lowest):
                    qs[q] = got
        else:
            for labels, v, _ in last.get((c, "quantile"), []):
                lq = _le(labels.get("quantile", ""))
                if lq is not None and lq in QUANTILES:
                    qs[lq] = v
        summed = bool(last.get((c, "sum")))
        out[c] = Histogram(count=n_last, total=s_last, quantiles=qs, windowed=windowed, summed=summed)
    return out


# -- a PromQL view of ALIASES: what ``diagnose fleet`` asks a Prometheus server for ------------------
# Prometheus stores a counter under its exposed name (``vllm:request_success_total``; some clients
# expose it without the suffix) and a histogram as ``_bucket``/``_sum``/``_count`` series, so each
# alias's stored names follow from the table above; no second table of names exists.


def stored_names(alias: Alias) -> dict[str, tuple[str, ...]]:
    """The series names a Prometheus server holds for ``alias``, by part.

    Gauges: ``value``; counters: ``total`` (with and without the ``_total`` suffix); histograms:
    ``bucket``, ``sum``, ``count`` (a Triton summary's ``{quantile=…}`` samples are ``quantile``).
    """
    names = alias.names
    if alias.kind is Kind.GAUGE:
        return {"value": names}
    if alias.kind is Kind.COUNTER:
        return {"total": tuple(sorted({*names, *(n + "_total" for n in names)}))}
    return {"bucket": tuple(n + "_bucket" for n in names), "sum": tuple(n + "_sum" for n in names),
            "count": tuple(n + "_count" for n in names), "quantile": names}


def name_matcher(names: Iterable[str]) -> str:
    """A ``__name__`` regex matcher for ``names`` (metric names need no escaping: ``[a-zA-Z0-9_:]``)."""
    return '__name__=~"' + "|".join(sorted(set(names))) + '"'


def all_stored_names() -> tuple[str, ...]:
    """Every stored series name of every alias (for one discovery query)."""
    out: set[str] = set()
    for a in ALIASES:
        for part, names in stored_names(a).items():
            if part != "quantile":  # summaries (Triton's ``*_summary_us{quantile=…}``) are not read by the fleet
                out.update(names)
    return tuple(sorted(out))


def engine_of(name: str) -> str:
    """The engine a stored series name belongs to (``vllm``, ``sglang``, ``tgi``, ``triton``) or ``""``."""
    for prefix, eng in _ENGINE_OF:
        if name.startswith(prefix):
            return eng
    return ""
