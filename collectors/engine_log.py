"""Serving-engine logs: vLLM (V0 and V1), SGLang and TGI scheduler and request lines.

A pure, streaming parser: ``EngineLogParser.feed(line)`` takes one cleaned log line (see
``collectors.logtext``) and keeps running aggregates only, so a multi-GB log is read in bounded
memory. ``EngineLogParser.summary()`` returns a frozen ``EngineLogSummary``.

Recognised lines (one example each; numbers vary, extra fields are ignored):

* vLLM V0 stats: ``Avg prompt throughput: 209.6 tokens/s, Avg generation throughput: 567.4
  tokens/s, Running: 36 reqs, Swapped: 0 reqs, Pending: 78 reqs, GPU KV cache usage: 99.1%, CPU KV
  cache usage: 0.0%``
* vLLM V1 stats: ``Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput:
  45.2 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 0.3%, Prefix cache hit
  rate: 0.0%``
* vLLM preemption: ``Sequence group 12 is preempted by PreemptionMode.RECOMPUTE mode because there
  is not enough KV cache space. … total_num_cumulative_preemption=51``
* configuration: ``max_num_seqs=256``, ``'max_num_seqs': 256``, ``--max-num-seqs 256`` (and the
  same for max_num_batched_tokens); ``Maximum concurrency for 4096 tokens per request: 12.34x``;
  ``# GPU blocks: 7281``; ``GPU KV cache size: 116,496 tokens``
* vLLM ``benchmark_serving`` / ``vllm bench serve`` result block (``==== Serving Benchmark Result
  ====`` … ``Mean TTFT (ms): …`` … ``=====``) and ``benchmark_throughput`` (``Throughput: 10.5
  requests/s, 4313.4 total tokens/s, 2105.5 output tokens/s``)
* SGLang: ``Prefill batch. #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00,
  #running-req: 0, #queue-req: 0`` and ``Decode batch. #running-req: 233, #token: 370959, token
  usage: 0.82, gen throughput (token/s): 4594.01, #queue-req: 317`` (token usage is a fraction of
  the KV pool); ``KV cache pool is full. Retract requests. #retracted_reqs: 2``
* TGI request spans: ``total_time="4.1s" validation_time="1.2ms" queue_time="3.2s"
  inference_time="900ms" time_per_token="45ms"`` and ``Model is overloaded`` rejections.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from collectors.units import to_ms

MAX_SAMPLES = 100_000  # per-request values kept for percentiles; beyond, a fixed-seed reservoir

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
    "cpu kv cache usage": "cpu_kv_pct",
    "prefix cache hit rate": "prefix_pct",
    "gpu prefix cache hit rate": "prefix_pct",
}
_V_UNITS = (" tokens/s", " reqs", "%")
_PREEMPT = re.compile(r"is preempted by PreemptionMode\.(\w+)|\bpreempted\b", re.IGNORECASE)
_PREEMPT_CUM = re.compile(r"total_num_cumulative_preemption=(\d+)")

# -- configuration -------------------------------------------------------------------------------
_CONF = re.compile(
    r"(?:--)?\b(max[_-]num[_-]seqs|max[_-]num[_-]batched[_-]tokens|max[_-]running[_-]requests)\b['\"]?"
    r"\s*(?:[=:]\s*|\s+)(\d+)\b"
)
_MAX_CONC = re.compile(r"Maximum concurrency for\s*([\d,]+)\s*tokens per request:\s*([\d.]+)x")
_GPU_BLOCKS = re.compile(r"#\s*GPU blocks:\s*([\d,]+)")
_KV_TOKENS = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")

# -- vLLM benchmark blocks -----------------------------------------------------------------------
_BENCH_START = re.compile(r"=+\s*Serving Benchmark Result\s*=+")
_BENCH_END = re.compile(r"^=+\s*$")
_BENCH_ROW = re.compile(r"^\s*([A-Za-z][^:]*?)\s*:\s+(-?[\d.,]+|inf)\s*$")
# vLLM names end-to-end latency "E2EL", SGLang's bench_serving "E2E Latency"
_LAT_ROW = re.compile(r"^(Mean|Median|Std|P\d+(?:\.\d+)?)\s+(TTFT|TPOT|ITL|E2EL|E2E Latency)\s*\(ms\)$")
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

# -- TGI -----------------------------------------------------------------------------------------
_TGI_DUR = re.compile(
    r"\b(total|validation|queue|inference|time_per_token)(?:_time)?=\"?([\d.]+)\s*(ns|µs|us|ms|s|m)\"?"
)
_TGI_OVERLOADED = re.compile(r"Model is overloaded")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass
class Series:
    """Running aggregate of one numeric series: count, sum, min, max, first, last."""

    count: int = 0
    total: float = 0.0
    low: float = math.inf
    high: float = -math.inf
    first: float | None = None
    last: float | None = None

    def add(self, x: float) -> None:
        if math.isnan(x) or math.isinf(x):
            return
        self.count += 1
        self.total += x
        self.low = min(self.low, x)
        self.high = max(self.high, x)
        if self.first is None:
            self.first = x
        self.last = x

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None

    @property
    def max(self) -> float | None:
        return self.high if self.count else None


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


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..1) of ``values``; None when empty."""
    if not values:
        return None
    s = sorted(values)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class StatsSample:
    """One scheduler stats line (vLLM or SGLang). Fractions are 0..1, not percent."""

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


def parse_vllm_stats(line: str) -> StatsSample | None:
    """A vLLM V0/V1 periodic stats line, or None."""
    if "Running:" not in line or ("Pending:" not in line and "Waiting:" not in line):
        return None
    got: dict[str, float] = {}
    for part in line.split(", "):
        label, sep, value = part.rpartition(": ")
        if not sep:
            continue
        # the first field carries the log prefix: "…] Engine 000: Avg prompt throughput"
        tail = label.rpartition("] ")[2].lower()
        name = _V_LABELS.get(tail) or _V_LABELS.get(tail.rpartition(": ")[2])
        if name is None and tail.endswith("prefix cache hit rate: gpu"):
            name = "prefix_pct"
        if name is None or name in got:
            continue
        value = value.strip().rstrip(".")
        for unit in _V_UNITS:
            if value.endswith(unit):
                value = value[: -len(unit)]
                break
        try:
            got[name] = float(value)
        except ValueError:
            continue
    if "running" not in got or "waiting" not in got:
        return None
    return StatsSample(
        engine="vllm",
        running=int(got["running"]),
        waiting=int(got["waiting"]),
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
    kv_when_queued: Series
    new_tokens: int
    cached_tokens: int
    preemption_lines: int
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
    offline_throughput: Mapping[str, float]
    tgi: Mapping[str, list[float]]
    tgi_requests: int
    overloaded: int

    @property
    def preemptions(self) -> int:
        return max(self.preemption_lines + self.retracted, self.preemptions_cumulative or 0)


class EngineLogParser:
    """Stream cleaned lines in; aggregates out. Never raises on odd input."""

    def __init__(self) -> None:
        self.engines: dict[str, None] = {}
        self.samples = 0
        self.running = Series()
        self.waiting = Series()
        self.swapped = Series()
        self.kv_usage = Series()
        self.prompt_tps = Series()
        self.gen_tps = Series()
        self.prefix_hit = Series()
        self.queued_samples = 0
        self.running_when_queued = Series()
        self.kv_when_queued = Series()
        self.new_tokens = 0
        self.cached_tokens = 0
        self.preemption_lines = 0
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
        self.offline_throughput: dict[str, float] = {}
        self.tgi: dict[str, Reservoir] = {}
        self.tgi_requests = 0
        self.overloaded = 0
        self.recognised = 0

    # ------------------------------------------------------------------------------------------
    def feed(self, line: str) -> bool:
        """Offer one line; True when it was recognised."""
        if self._bench_rows is not None:
            return self._feed_bench(line)
        hit = False
        if "Running:" in line:
            s = parse_vllm_stats(line)
            if s is not None:
                self._add_sample(s)
                hit = True
        if not hit and " batch" in line:
            s = parse_sglang_batch(line)
            if s is not None:
                self._add_sample(s)
                hit = True
        if "preempt" in line or "Preempt" in line:
            hit = self._feed_preempt(line) or hit
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
                self.engines.setdefault("tgi")
                hit = True
        if "overloaded" in line and _TGI_OVERLOADED.search(line):
            self.overloaded += 1
            hit = True
        if "Benchmark Result" in line and _BENCH_START.search(line):
            self._bench_rows = {}
            self.benchmark_blocks += 1
            hit = True
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
            if s.kv_usage_ratio is not None:
                self.kv_when_queued.add(s.kv_usage_ratio)
        if s.new_tokens is not None:
            self.new_tokens += s.new_tokens
        if s.cached_tokens is not None:
            self.cached_tokens += s.cached_tokens

    def _feed_preempt(self, line: str) -> bool:
        m = _PREEMPT.search(line)
        if not m:
            return False
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
        m = _BENCH_ROW.match(line)
        if not m:
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
        return self.recognised > 0 or self._bench_rows is not None

    def summary(self) -> EngineLogSummary:
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
            kv_when_queued=self.kv_when_queued,
            new_tokens=self.new_tokens,
            cached_tokens=self.cached_tokens,
            preemption_lines=self.preemption_lines,
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
            offline_throughput=dict(self.offline_throughput),
            tgi={k: list(r.values) for k, r in self.tgi.items()},
            tgi_requests=self.tgi_requests,
            overloaded=self.overloaded,
        )
