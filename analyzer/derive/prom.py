"""Prometheus scrapes → ``serving.*``, ``latency.*``, ``stage.*`` and ``tokens.*`` evidence.

The collector (``diagnose.collectors.prom``) maps every engine's metric names onto canonical series; this
module names those series with the shared evidence keys. With two scrapes, counters and histograms
cover the window between them; with one, they cover the process lifetime (said in ``detail``).
"""

from __future__ import annotations

from diagnose.collectors.engine_log import kv_free_sequences
from diagnose.collectors.oom import model_hints
from diagnose.collectors.prom import TRIGGERS as PROM_TRIGGERS
from diagnose.collectors.prom import PromBuffer, PromResult
from diagnose.derive.emit import Emit
from diagnose.derive.oom import emit_model_size
from diagnose.model import Evidence, Quality

KIND = "prometheus"

# canonical histogram → evidence key prefix
_HIST_KEYS = {
    "ttft": "latency.ttft_ms",
    "itl": "latency.itl_ms",
    "e2e": "latency.e2e_ms",
    "queue": "stage.queue_ms",
    "prefill": "stage.prefill_ms",
    "decode": "stage.decode_ms",
    "inference": "stage.inference_ms",
    "compute_infer": "stage.compute_infer_ms",
    "preprocess": "stage.preprocess_ms",
}
_STAGES = ("queue", "prefill", "decode", "inference", "preprocess")
_QNAMES = {0.5: "p50", 0.9: "p90", 0.99: "p99"}
MIN_STEPS = 50  # fewer engine steps than this in the window: a batch mean of a few steps is a rough one


class PromSource:
    """TextSource for Prometheus text exposition (kind ``prometheus``)."""

    kind = KIND
    triggers = PROM_TRIGGERS

    def __init__(self) -> None:
        self._buf = PromBuffer()
        self._result: PromResult | None = None

    def feed(self, line: str) -> None:
        self._buf.feed(line)

    def matched(self) -> bool:
        return self._buf.matched()

    def _get(self) -> PromResult:
        if self._result is None:
            self._result = self._buf.result()
        return self._result

    def problems(self) -> list[str]:
        r = self._get()
        out: list[str] = []
        if r.truncated:
            out.append("a scrape was longer than the line limit; the rest of it was not read")
        if r.bad_lines:
            out.append(f"{r.bad_lines} metric line(s) could not be parsed")
        return out

    def evidence(self, source: str) -> list[Evidence]:
        return derive(self._get(), source)


def sources() -> list[PromSource]:
    return [PromSource()]


def derive(r: PromResult, source: str, span: str | None = None) -> list[Evidence]:
    """Evidence from a parsed scrape pair; ``span`` says what the window is when it is not two scrapes
    (``diagnose fleet`` builds a ``PromResult`` from a Prometheus server's window)."""
    engines = "+".join(r.engines) or "prometheus"
    windowed = r.scrapes >= 2
    span = span or (
        f"over the {r.window_s:.0f} s between two scrapes" if r.window_s
        else "between the first and last scrape" if windowed
        else "since the server started (one scrape)"
    )

    ev = Emit(source)
    ev.add("serving.metric_scrapes", r.scrapes, "count", f"{engines} scrapes read (first and last used)")
    if len(r.engines) == 1:
        ev.add("serving.engine", r.engines[0], "", "the engine its metric names belong to")
    named = model_hints(r.models[0]) if len(r.models) == 1 else None
    if named is not None:
        emit_model_size(named, ev, f"from the served model's name {named.model} (the model_name label)")
    _gauges(r, ev, engines)
    _histograms(r, ev, engines, span)
    _counters(r, ev, engines, span)
    return ev.items


def _gauges(r: PromResult, ev: Emit, engines: str) -> None:
    g = r.gauges
    q = Quality.LOW if len(next(iter(g.values()), ())) < 2 else Quality.GOOD
    for canonical, key, unit in (
        ("running", "serving.running", "requests"),
        ("waiting", "serving.waiting", "requests"),
    ):
        vals = g.get(canonical)
        if vals:
            ev.add(f"{key}_max", max(vals), unit, f"{engines} gauge, largest of {len(vals)} scrape(s)", q)
            ev.add(f"{key}_mean", sum(vals) / len(vals), unit, f"{engines} gauge, mean of {len(vals)} scrape(s)", q)
    if g.get("swapped"):
        ev.add("serving.swapped_max", max(g["swapped"]), "requests", f"{engines} gauge", q)
    if g.get("running_limit"):  # the engine states its sequence limit itself (TensorRT-LLM)
        ev.add("serving.max_num_seqs", max(g["running_limit"]), "requests",
               f"{engines}: the scheduler's limit on requests running at once, its own gauge")
    kv = g.get("kv_usage")
    if kv:
        ev.add("serving.kv_cache_usage_max_ratio", max(kv), "ratio", f"{engines} KV-cache usage gauge (0..1)", q)
        ev.add("serving.kv_cache_usage_mean_ratio", sum(kv) / len(kv), "ratio", f"{engines} KV-cache usage gauge", q)
    waiting = g.get("waiting")
    if waiting:
        running = g.get("running", ())
        queued = [i for i, w in enumerate(waiting) if w > 0]
        ev.add("serving.stat_samples", len(waiting), "count", f"{engines} scrapes with the queue gauge")
        ev.add("serving.queued_samples", len(queued), "count", "scrapes with at least one request waiting")
        ev.add("serving.queued_sample_ratio", len(queued) / len(waiting), "ratio",
               "share of scrapes with at least one request waiting", q)
        ev.add("serving.waiting_last", waiting[-1], "requests", "waiting requests at the last scrape", q)
        aligned = len(running) == len(waiting)
        if queued and aligned:
            rq = [running[i] for i in queued]
            ev.add("serving.running_when_queued_mean", sum(rq) / len(rq), "requests",
                   "running requests at the scrapes where requests were waiting", q)
            ev.add("serving.running_when_queued_max", max(rq), "requests",
                   "most running requests at a scrape where requests were waiting", q)
            busy = [r for r in rq if r > 0]
            if busy:
                ev.add("serving.running_when_queued_busy_mean", sum(busy) / len(busy), "requests",
                       "mean running requests at the scrapes where requests were waiting and a batch ran", q)
        if queued and kv and len(kv) == len(waiting):
            kq = [kv[i] for i in queued]
            ev.add("serving.kv_cache_usage_when_queued_mean_ratio", sum(kq) / len(kq), "ratio",
                   "KV-cache usage at the scrapes where requests were waiting", q)
            ev.add("serving.kv_cache_usage_when_queued_max_ratio", max(kq), "ratio",
                   "largest KV-cache usage at a scrape where requests were waiting", q)
            if aligned:
                rooms = [room for i in queued if (room := kv_free_sequences(running[i], kv[i])) is not None]
                if rooms:
                    ev.add("serving.kv_free_sequences_when_queued_min", min(rooms), "sequences",
                           "fewest sequences of the running ones' mean size the free KV cache held at a scrape "
                           "where requests were waiting", q)
    if g.get("prefix_hit_rate") and "prefix_hits" not in r.counters:
        ev.add("serving.prefix_cache_hit_ratio", g["prefix_hit_rate"][-1], "ratio",
               f"{engines} prefix-cache hit-rate gauge")


def _histograms(r: PromResult, ev: Emit, engines: str, span: str) -> None:
    h = r.histograms
    means: dict[str, float] = {}
    for canonical, prefix in _HIST_KEYS.items():
        hist = h.get(canonical)
        if hist is None:
            continue
        q = Quality.LOW if hist.count < 10 else Quality.GOOD
        # the inter-token latency is observed once per token gap, the others once per request
        what = f"{engines} histogram {span}, {hist.count:.0f} {'token gaps' if canonical == 'itl' else 'requests'}"
        m = hist.mean
        if m is not None:
            means[canonical] = m
            ev.add(f"{prefix}.mean", m, "ms", what, q)
        for quant, name in _QNAMES.items():
            if quant in hist.quantiles:
                ev.add(f"{prefix}.{name}", hist.quantiles[quant], "ms", what + " (interpolated in buckets)", q)
    e2e = means.get("e2e")
    if e2e:
        for stage in _STAGES:
            if stage in means:
                ev.add(f"stage.{stage}.share", means[stage] / e2e, "ratio", f"mean {stage} time / mean end-to-end time")
        if "e2e" in h:
            ev.add("requests.count", round(h["e2e"].count), "requests", f"requests finished {span}")
    for canonical, key in (("prompt_len", "tokens.input"), ("output_len", "tokens.output")):
        hist = h.get(canonical)
        if hist is None or hist.mean is None:
            continue
        ev.add(f"{key}_mean", hist.mean, "tokens", f"{engines} histogram {span}")
        if 0.5 in hist.quantiles:
            ev.add(f"{key}_p50", hist.quantiles[0.5], "tokens", f"{engines} histogram {span}")
        if 0.99 in hist.quantiles:
            ev.add(f"{key}_p99", hist.quantiles[0.99], "tokens", f"{engines} histogram {span}")


def _counters(r: PromResult, ev: Emit, engines: str, span: str) -> None:
    c = r.counters
    if "preemptions" in c:
        ev.add("serving.preemptions", round(c["preemptions"].delta), "count", f"{engines} preemptions {span}")
    if r.window_s:
        for canonical, key in (("prompt_tokens", "serving.prompt_tokens_per_s"),
                               ("generation_tokens", "serving.generation_tokens_per_s")):
            if canonical in c and c[canonical].windowed:
                ev.add(key, c[canonical].delta / r.window_s, "tokens/s", f"{engines} counter rate {span}")
        if "requests_success" in c and c["requests_success"].windowed:
            ev.add("throughput.rps", c["requests_success"].delta / r.window_s, "requests/s",
                   f"finished requests {span}")
    # llama-server: seconds spent on prompts and on generation, summed over requests: the prefill share
    if ("prompt_seconds" in c and "generation_seconds" in c and c["prompt_seconds"].windowed
            and c["prompt_seconds"].delta + c["generation_seconds"].delta > 0):
        p, g = c["prompt_seconds"].delta, c["generation_seconds"].delta
        ev.add("stage.prefill.share", p / (p + g), "ratio",
               f"{engines} prompt seconds / (prompt + generation seconds) {span} ({p:.1f} s of {p + g:.1f} s)")
    # vLLM: generated tokens per engine step between two scrapes is the window's mean running batch, whatever
    # the gauges read at the two instants (a scrape between two steps reads 0 running with requests waiting).
    # A sequence yields one token a step, plus its accepted drafts under speculative decoding: those are taken
    # off. Data-parallel engines' counters add up, so it is the batch of one engine, weighted by its steps
    steps, gen = r.histograms.get("step_tokens"), c.get("generation_tokens")
    if steps is not None and gen is not None and steps.windowed and gen.windowed and steps.count > 0:
        spec = c.get("spec_accepted")
        drafts = spec.delta if spec is not None and spec.windowed else 0.0
        if spec is None or spec.windowed:  # accepted drafts known over the same window, or none were made
            ev.add("serving.batch_step_mean", (gen.delta - drafts) / steps.count, "sequences",
                   f"{engines} generated tokens per engine step {span} ({gen.delta:.0f} tokens"
                   + (f", less {drafts:.0f} accepted drafts," if drafts else "")
                   + f" in {steps.count:.0f} steps): the mean running batch of one engine",
                   Quality.LOW if steps.count < MIN_STEPS else Quality.GOOD)
    if "prefix_queries" in c and "prefix_hits" in c and c["prefix_queries"].delta > 0:
        ev.add("serving.prefix_cache_hit_ratio", c["prefix_hits"].delta / c["prefix_queries"].delta, "ratio",
               f"prefix-cache hits / queries (tokens) {span}")
    _triton(r, ev, span)


def _triton(r: PromResult, ev: Emit, span: str) -> None:
    c = r.counters
    req = c.get("requests_success")
    if req is None or req.delta <= 0 or not any(k.startswith("triton_") for k in c):
        return
    n = req.delta
    q = Quality.LOW if n < 10 else Quality.GOOD
    what = f"Triton cumulative durations / {n:.0f} successful requests {span}"
    queue = c["triton_queue_ms"].delta / n if "triton_queue_ms" in c else None
    parts = [c[k].delta for k in ("triton_compute_input_ms", "triton_compute_infer_ms", "triton_compute_output_ms")
             if k in c]
    compute = sum(parts) / n if parts else None
    request = c["triton_request_ms"].delta / n if "triton_request_ms" in c else None
    if queue is not None:
        ev.add("stage.queue_ms.mean", queue, "ms", what, q)
    if compute is not None:
        ev.add("stage.compute_ms.mean", compute, "ms", what + " (input + infer + output)", q)
    if "triton_compute_infer_ms" in c:
        ev.add("stage.compute_infer_ms.mean", c["triton_compute_infer_ms"].delta / n, "ms", what, q)
    if request is not None:
        ev.add("latency.server_ms.mean", request, "ms", what, q)
        ev.add("latency.e2e_ms.mean", request, "ms", what + " (server-side request duration)", q)
        if queue is not None and request > 0:
            ev.add("stage.queue.share", queue / request, "ratio", "mean queue time / mean server request time", q)
        if compute is not None and request > 0:
            ev.add("stage.compute.share", compute / request, "ratio", "mean compute time / mean server request time", q)
    ev.add("requests.count", round(n), "requests", f"Triton successful requests {span}")
    if "triton_inferences" in c and "triton_executions" in c and c["triton_executions"].delta > 0:
        ev.add("bench.server_batch_mean", c["triton_inferences"].delta / c["triton_executions"].delta, "inferences",
               "Triton inferences per model execution (dynamic batch size)", q)
