"""Per-request timing → ``stage.*``, ``latency.*``, ``tokens.*``, ``shape.*`` and ``scaling.*`` evidence.

Sources inside one input are ranked: a stage-timing JSONL (one record per request) beats span
listings, which beat tables, which beat figures quoted in prose; the first to give a key keeps it.

Keys beyond the shared convention:

* ``shape.calls``, ``shape.extreme_calls``, ``shape.spike_calls``, ``shape.new_extreme_spikes``,
  ``shape.spike_on_extreme_ratio``, ``shape.extreme_latency_ms.median``,
  ``shape.in_range_latency_ms.median``, ``shape.first_call_ms``, ``shape.extreme_time_share``:
  calls timed with their input shapes, against new minima/maxima of the input size;
* ``scaling.<metric>_ms.prompt_length_ratio`` / ``.concurrency_ratio`` (and ``.long_prompt_p50``,
  ``.long_prompt_max``, ``.short_prompt_max``): how a latency metric moves with prompt length and
  with concurrency across the rows of a load-condition table;
* ``scaling.ttft_prompt_share`` (the part of the longest prompt's TTFT that grows with the prompt), ``.ttft_prompt_r2``,
  ``.ttft_prompt_longest_ms``, ``.ttft_prompt_longest_tokens`` and ``scaling.prefill_rate_tps``: a table of TTFT
  against prompt length, one request at a time, fitted as a line;
* ``latency.call_ms.*``: per-call timings with no shape; ``compare.speedup_ratio``: a variant
  table's slow/fast ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import Any

from diagnose.collectors.timing import Call, Series, StageLog, TimingParser, TimingRecords
from diagnose.derive.emit import FirstWins
from diagnose.derive.timing_tables import (
    ConditionTable,
    PowerSweep,
    PromptSweep,
    StageTable,
    VariantTable,
    analyze_table,
    sweep_evidence,
)
from diagnose.model import Evidence, Quality

# -- the engine-rebuild signature: latency spikes on new input-size extremes ---------------------


@dataclass(frozen=True)
class SpikeStats:
    calls: int
    extreme_calls: int  # after the first call: a new minimum or maximum of the input size
    spike_calls: int  # after the first call: ≥ spike_factor × the median latency
    new_extreme_spikes: int
    first_ms: float
    median_ms: float
    extreme_median_ms: float | None
    in_range_median_ms: float | None
    extreme_time_share: float  # share of all call time spent in the first call and new-extreme calls
    unit_assumed: bool
    sizes_seen: tuple[int, int]
    min_shape: tuple[int, ...] = ()  # the largest input of the smallest call
    max_shape: tuple[int, ...] = ()  # the largest input of the largest call

    @property
    def spike_on_extreme_ratio(self) -> float | None:
        return self.new_extreme_spikes / self.spike_calls if self.spike_calls else None


def shape_spikes(calls: list[Call], spike_factor: float = 3.0) -> SpikeStats | None:
    """Latency spikes against new input-size extremes (the first call is the initial build)."""
    if len(calls) < 3:
        return None
    lo = hi = calls[0].size
    mid = median([c.ms for c in calls])
    extreme_ms: list[float] = []
    in_range_ms: list[float] = []
    spikes = both = 0
    for c in calls[1:]:
        extreme = c.size < lo or c.size > hi
        lo, hi = min(lo, c.size), max(hi, c.size)
        spike = mid > 0 and c.ms >= spike_factor * mid
        spikes += spike
        both += spike and extreme
        (extreme_ms if extreme else in_range_ms).append(c.ms)
    total = sum(c.ms for c in calls)
    share = (calls[0].ms + sum(extreme_ms)) / total if total > 0 else 0.0
    return SpikeStats(
        calls=len(calls),
        extreme_calls=len(extreme_ms),
        spike_calls=spikes,
        new_extreme_spikes=both,
        first_ms=calls[0].ms,
        median_ms=mid,
        extreme_median_ms=median(extreme_ms) if extreme_ms else None,
        in_range_median_ms=median(in_range_ms) if in_range_ms else None,
        extreme_time_share=share,
        unit_assumed=any(c.unit_assumed for c in calls),
        sizes_seen=(lo, hi),
        min_shape=_largest(min(calls, key=lambda c: c.size)),
        max_shape=_largest(max(calls, key=lambda c: c.size)),
    )


def _largest(c: Call) -> tuple[int, ...]:
    return max(c.shapes, key=math.prod) if c.shapes else ()


class _Out(FirstWins):
    """Evidence by key, first writer wins (sources are added best first)."""

    def series(self, prefix: str, s: Series, detail: str, quality: Quality = Quality.GOOD) -> None:
        if not s.n:
            return
        self.add(f"{prefix}.p50", s.quantile(0.5), "ms", detail, quality)
        if s.n >= 2:
            self.add(f"{prefix}.p99", s.quantile(0.99), "ms", detail, quality)
        self.add(f"{prefix}.mean", s.mean, "ms", detail, quality)


def _low(n: int) -> Quality:
    return Quality.LOW if n < 10 else Quality.GOOD


class TimingSource:
    """Text source for stage timings, spans, per-call timing lines and timing tables."""

    kind = "timing"
    # tables, spans and prose are pasted (the head); a stage-timing JSONL log can be any size
    triggers = ('"stages_ms"',)
    free_text = True

    def __init__(self) -> None:
        self._p = TimingParser()
        self._rec: TimingRecords | None = None
        self._tables: list[StageTable | VariantTable | ConditionTable | PowerSweep | PromptSweep] | None = None

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def _records(self) -> TimingRecords:
        if self._rec is None:
            self._rec = self._p.records()
        return self._rec

    def _analyzed(self) -> list[StageTable | VariantTable | ConditionTable | PowerSweep | PromptSweep]:
        if self._tables is None:
            self._tables = [a for t in self._records().tables if (a := analyze_table(t)) is not None]
        return self._tables

    def matched(self) -> bool:
        r = self._records()
        return bool(
            r.stage_log.requests
            or sum(s.n for s in r.spans.values()) >= 2
            or len(r.calls) >= 3
            or r.untagged.n >= 3
            or self._analyzed()
            or r.usage.lines
            or r.prose_ttft_ms.n
        )

    def problems(self) -> list[str]:
        r = self._records()
        out = []
        if r.unit_assumed:
            out.append(f"{r.unit_assumed} timing value(s) had no unit and were read as seconds")
        if r.unitless_stages:
            out.append(f"the stage times of {', '.join(sorted(r.unitless_stages))} had no unit: only their shares of "
                       "the listed stages' sum are used")
        if r.stage_log.bad_lines:
            out.append(f"{r.stage_log.bad_lines} stage-timing line(s) were not valid JSON")
        return out

    def evidence(self, source: str) -> list[Evidence]:
        r = self._records()
        out = _Out(source)
        self._stage_log(r, out)
        self._spans(r, out)
        self._calls(r, out)
        for t in self._analyzed():
            if isinstance(t, StageTable):
                self._stage_table(t, out)
            elif isinstance(t, VariantTable):
                self._variant_table(t, out)
            elif isinstance(t, PowerSweep):
                detail = (f"a table's power-limit sweep: {t.rows} caps from {t.low_w:g} W to {t.high_w:g} W, "
                          f"'{t.measure}'")
                out.add("scaling.power_cap_range", t.high_w / t.low_w, "ratio", detail)
                out.add("scaling.power_cap_speedup", t.speedup, "ratio", detail)
            elif isinstance(t, PromptSweep):
                detail = (f"a table's prompt-length sweep: {t.rows} prompts of {t.shortest_tokens:g} to "
                          f"{t.longest_tokens:g} tokens, '{t.measure}' fitted as {t.intercept_ms:.0f} ms + "
                          f"{t.slope_ms_per_token:.3g} ms a token (R² {t.r2:.2f})")
                out.add("scaling.ttft_prompt_share", round(t.prompt_share, 4), "ratio", detail)
                out.add("scaling.ttft_prompt_r2", round(t.r2, 4), "ratio", detail)
                out.add("scaling.ttft_prompt_longest_ms", t.longest_ttft_ms, "ms", detail)
                out.add("scaling.ttft_prompt_longest_tokens", t.longest_tokens, "tokens", detail)
                if t.slope_ms_per_token > 0:
                    out.add("scaling.prefill_rate_tps", 1000.0 / t.slope_ms_per_token, "tokens/s",
                            f"{detail}: the added prompt's tokens per second")
            else:
                self._condition_table(t, out)
        self._usage(r, out)
        if r.prose_ttft_ms.n:
            out.add("latency.ttft_ms.mean", r.prose_ttft_ms.mean, "ms", "quoted in prose", Quality.LOW)
        if r.prose_prompt_tokens.n:
            out.add("tokens.input_mean", r.prose_prompt_tokens.mean, "tokens", "prompt length quoted in prose",
                    Quality.LOW)
        return out.items

    # -- per source ---------------------------------------------------------------------------

    @staticmethod
    def _stage_log(r: TimingRecords, out: _Out) -> None:
        log = r.stage_log
        if not log.requests:
            return
        q = _low(log.requests)
        detail = f"stage-timing log, {log.requests} request(s)"
        out.add("requests.count", log.requests, "requests", detail)
        for stage, s in sorted(log.stages.items()):
            out.series(f"stage.{stage}_ms", s, detail, q)
            if log.e2e_total > 0:
                out.add(f"stage.{stage}.share", log.stage_totals.get(stage, 0.0) / log.e2e_total, "ratio",
                        "share of end-to-end time summed over requests", q)
        out.series("latency.e2e_ms", log.e2e, detail, q)
        out.series("latency.ttft_ms", log.ttft, detail, q)
        if log.input_tokens.n:
            out.add("tokens.input_mean", log.input_tokens.mean, "tokens", detail, q)
        if log.output_tokens.n:
            out.add("tokens.output_mean", log.output_tokens.mean, "tokens", detail, q)
        if log.batch.n:
            out.add("batch.size_mean", log.batch.mean, "requests", detail, q)
        span = log.ts_max - log.ts_min
        if log.requests >= 2 and span > 0:
            out.add("throughput.rps", (log.requests - 1) / span, "rps", f"over {span:.1f} s of log", q)
        if log.errors:
            out.add("requests.error_ratio", log.errors / log.requests, "ratio", detail, q)
        TimingSource._order_figures(log, out, q)

    @staticmethod
    def _order_figures(log: StageLog, out: _Out, q: Quality) -> None:
        """Cold start, new shapes and latency against input size (STG004, STG005)."""
        if log.requests >= 20:
            first = log.first_e2e
            out.add("latency.first_requests_ms.mean", sum(first) / len(first), "ms",
                    f"the first {len(first)} requests of the log", q)
            out.add("latency.first_requests_ms.max", max(first), "ms", "", q)
            out.add("latency.first_requests.count", len(first), "requests", "", q)
            late = sorted(v for i, v in log.e2e_by_index if i >= log.requests / 2)
            if late:
                out.add("latency.steady_ms.p50", late[len(late) // 2], "ms",
                        "end-to-end p50, second half of the log", q)
        if 3 <= log.new_shape.n < log.requests / 2:
            out.add("latency.new_shape_ms.mean", log.new_shape.mean, "ms",
                    "requests with a (batch size, input tokens) pair not seen before", q)
            out.add("latency.new_shape.count", log.new_shape.n, "requests", "", q)
        c = log.e2e_vs_input
        if c.n >= 3:
            cq = _low(c.n)
            out.add("scaling.input_size.requests", c.n, "requests", "requests with an input size and a latency", cq)
            if log.input_tokens.min > 0:
                out.add("scaling.input_size.range_ratio", log.input_tokens.max / log.input_tokens.min, "ratio", "", cq)
            for name, corr in (("e2e", c), ("ttft", log.ttft_vs_input)):
                if corr.r is not None:
                    out.add(f"scaling.{name}_ms.input_size_corr", corr.r, "ratio",
                            f"Pearson r of {name} against input tokens over {corr.n} requests", cq)
                if corr.slope is not None:
                    out.add(f"scaling.{name}_ms.per_1k_input_ms", 1000 * corr.slope, "ms",
                            "least-squares slope per 1,000 input tokens", cq)
            if log.ttft_vs_queue.r is not None:
                out.add("scaling.ttft_ms.queue_corr", log.ttft_vs_queue.r, "ratio",
                        "Pearson r of each request's TTFT against its own queue time", _low(log.ttft_vs_queue.n))

    @staticmethod
    def _spans(r: TimingRecords, out: _Out) -> None:
        if not r.spans or sum(s.n for s in r.spans.values()) < 2:
            return
        total = sum(s.total for s in r.spans.values())
        for stage, s in sorted(r.spans.items()):
            detail = f"{s.n} span(s) named {stage}"
            if stage not in r.unitless_stages:  # a time with no unit has a share of the sum, no size
                out.series(f"stage.{stage}_ms", s, detail, _low(s.n))
            if len(r.spans) >= 2 and total > 0:
                out.add(f"stage.{stage}.share", s.total / total, "ratio", "share of the listed spans' total time",
                        _low(s.n))

    @staticmethod
    def _calls(r: TimingRecords, out: _Out) -> None:
        every = Series()
        for c in r.calls:
            every.add(c.ms)
        src = every if every.n >= r.untagged.n else r.untagged
        if src.n >= 3:
            out.series("latency.call_ms", src, f"{src.n} timed call(s)", _low(src.n))
            out.add("latency.call_ms.max", src.max, "ms", f"{src.n} timed call(s)")
        st = shape_spikes(r.calls)
        if st is None:
            return
        q = Quality.LOW if st.calls < 6 else Quality.GOOD
        unit = " (bare numbers read as seconds)" if st.unit_assumed else ""
        lo, hi = st.sizes_seen
        detail = f"{st.calls} calls timed with their input shapes, sizes {lo}..{hi} elements{unit}"
        out.add("shape.calls", st.calls, "calls", detail, q)
        out.add("shape.extreme_calls", st.extreme_calls, "calls",
                "calls after the first whose input size was a new minimum or maximum", q)
        out.add("shape.spike_calls", st.spike_calls, "calls",
                f"calls after the first at ≥ 3× the median latency ({st.median_ms:.4g} ms)", q)
        out.add("shape.new_extreme_spikes", st.new_extreme_spikes, "calls", "spikes on a new size extreme", q)
        ratio = st.spike_on_extreme_ratio
        if ratio is not None:
            out.add("shape.spike_on_extreme_ratio", ratio, "ratio", "share of spikes that hit a new size extreme", q)
        out.add("shape.first_call_ms", st.first_ms, "ms", "the first call (initial build)" + unit, q)
        if st.extreme_median_ms is not None:
            out.add("shape.extreme_latency_ms.median", st.extreme_median_ms, "ms", "calls on a new size extreme" + unit,
                    q)
        if st.in_range_median_ms is not None:
            out.add("shape.in_range_latency_ms.median", st.in_range_median_ms, "ms",
                    "calls within the size range already seen" + unit, q)
        if st.min_shape and st.max_shape:
            out.add("shape.range", "x".join(map(str, st.min_shape)) + ".." + "x".join(map(str, st.max_shape)), "shape",
                    "smallest and largest input shape seen", q)
        out.add("shape.extreme_time_share", st.extreme_time_share, "ratio",
                "share of all call time spent in the first call and new-extreme calls", q)

    @staticmethod
    def _stage_table(t: StageTable, out: _Out) -> None:
        total = t.total_ms or sum(r.ms for r in t.rows if r.ms is not None)
        of = (f"the table's total ({t.total_label})" if t.total_label else "the table's summed stages")
        for row in t.rows:
            detail = f"table row '{row.label}'"
            if row.ms is not None:
                out.add(f"stage.{row.stage}_ms.mean", row.ms, "ms", detail)
            share = row.share if row.share is not None else (row.ms / total if total and row.ms is not None
                                                             else None)
            if share is not None:
                out.add(f"stage.{row.stage}.share", share, "ratio", f"{detail}: share of {of}")
        if t.total_ms is not None:
            key = "latency.ttft_ms.mean" if t.total_is_ttft else "latency.e2e_ms.mean"
            out.add(key, t.total_ms, "ms", f"table total '{t.total_label}'")

    @staticmethod
    def _variant_table(t: VariantTable, out: _Out) -> None:
        how = "from fps" if t.from_fps else "per item"
        detail = (f"lower bound: changing only the {t.stage} path ({', '.join(t.evidence_words[:4])}) cut "
                  f"{t.slow_ms:.4g} → {t.fast_ms:.4g} ms {how} ('{t.slow_label}' → '{t.fast_label}')")
        out.add(f"stage.{t.stage}.share", t.delta_share, "ratio", detail)
        out.add(f"stage.{t.stage}_ms.mean", t.slow_ms - t.fast_ms, "ms", detail)
        out.add("latency.e2e_ms.mean", t.slow_ms, "ms", f"per item on the slow variant '{t.slow_label}'")
        out.add("compare.speedup_ratio", t.slow_ms / t.fast_ms if t.fast_ms > 0 else math.inf, "ratio",
                f"'{t.slow_label}' vs '{t.fast_label}'")

    @staticmethod
    def _condition_table(t: ConditionTable, out: _Out) -> None:
        for key, value, unit, said in sweep_evidence(list(t.levels), "a table's load sweep"):
            out.add(key, value, unit, said)
        if not t.metric:
            return
        base = f"scaling.{t.metric}_ms"
        detail = f"across {t.rows} load conditions of a table"
        if t.prompt_length_ratio is not None:
            out.add(f"{base}.prompt_length_ratio", t.prompt_length_ratio, "ratio",
                    f"{t.metric} with long prompts over short prompts, {detail}")
        if t.concurrency_ratio is not None:
            out.add(f"{base}.concurrency_ratio", t.concurrency_ratio, "ratio",
                    f"{t.metric} at the highest over the lowest concurrency, same prompt class, {detail}")
        if t.long_value_ms is not None:
            out.add(f"{base}.long_prompt_p50", t.long_value_ms, "ms", detail)
        if t.long_max_ms is not None:
            out.add(f"{base}.long_prompt_max", t.long_max_ms, "ms", detail)
        if t.short_max_ms is not None:
            out.add(f"{base}.short_prompt_max", t.short_max_ms, "ms", detail)

    @staticmethod
    def _usage(r: TimingRecords, out: _Out) -> None:
        u = r.usage
        if u.lines and u.prompt > 0:
            out.add("serving.prefix_cache_hit_ratio", u.cached / u.prompt, "ratio",
                    f"cached prompt tokens over all prompt tokens in {u.lines} usage record(s)", _low(u.lines))
        if u.per_line_prompt.n:
            out.add("tokens.input_mean", u.per_line_prompt.mean, "tokens",
                    f"prompt tokens in {u.per_line_prompt.n} usage record(s)", _low(u.per_line_prompt.n))


def sources() -> list[Any]:
    return [TimingSource()]
