"""Serving-engine logs: vLLM V0/V1, SGLang, TGI, benchmark blocks → serving.* evidence."""

from __future__ import annotations

import io
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose import loose
from diagnose.collectors.engine_log import (
    EngineLogParser,
    parse_grouped_stats,
    parse_sglang_batch,
    parse_tgi_request,
    parse_vllm_stats,
)
from diagnose.collectors.logtext import clean_lines, iter_text_lines
from diagnose.derive.engine_log import EngineLogSource
from tests.conftest import DATA

LOGS = os.path.join(DATA, "logs")


def _f(x: object) -> float:
    assert isinstance(x, int | float)
    return float(x)


def _source(lines: list[str]) -> EngineLogSource:
    src = EngineLogSource()
    for line in clean_lines(lines):
        src.feed(line)
    return src


def _ev(name: str) -> dict[str, object]:
    with open(os.path.join(LOGS, name), encoding="utf-8") as fh:
        src = _source(fh.readlines())
    return {e.key: e.value for e in src.evidence(name)}


def test_vllm_v0_stats_line() -> None:
    s = parse_vllm_stats(
        "Avg prompt throughput: 209.6 tokens/s, Avg generation throughput: 567.4 tokens/s, Running: 36 reqs, "
        "Swapped: 0 reqs, Pending: 78 reqs, GPU KV cache usage: 99.1%, CPU KV cache usage: 0.0%"
    )
    assert s is not None
    assert (s.running, s.waiting, s.swapped) == (36, 78, 0)
    assert s.kv_usage_ratio is not None and abs(s.kv_usage_ratio - 0.991) < 1e-9
    assert s.prompt_tokens_per_s == 209.6 and s.generation_tokens_per_s == 567.4


def test_vllm_v1_stats_line_with_prefix_cache() -> None:
    s = parse_vllm_stats(
        "Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation throughput: 45.2 tokens/s, Running: 1 reqs, "
        "Waiting: 3 reqs, GPU KV cache usage: 0.3%, Prefix cache hit rate: 12.5%, External prefix cache hit rate: 1.0%"
    )
    assert s is not None and s.waiting == 3 and s.swapped is None
    assert s.prefix_hit_ratio == 0.125


def test_not_a_stats_line() -> None:
    assert parse_vllm_stats("Running: the model") is None
    assert parse_sglang_batch("a batch of cookies") is None
    assert parse_tgi_request("queue_time is a nice metric") is None


def test_kv_full_incident_vllm_3561() -> None:
    ev = _ev("vllm_v0_pending_kv_cache_full.txt")
    assert ev["serving.waiting_max"] == 78 and ev["serving.running_max"] == 36
    assert ev["serving.kv_cache_usage_max_ratio"] == 0.991
    assert ev["serving.queued_sample_ratio"] == 1.0


def test_benchmark_block_and_stats_line_vllm_pr8804() -> None:
    ev = _ev("vllm_benchmark_running_capped_low_kv.txt")
    assert ev["requests.count"] == 1000
    assert ev["throughput.rps"] == 49.18
    assert ev["latency.ttft_ms.mean"] == 4090.94
    assert ev["latency.ttft_ms.p50"] == 3477.49
    assert ev["latency.ttft_ms.p99"] == 12854.2
    assert ev["latency.tpot_ms.p99"] == 301.38
    assert ev["latency.itl_ms.mean"] == 188.7
    assert abs(_f(ev["tokens.input_mean"]) - 215.196) < 1e-9
    assert ev["serving.running_max"] == 255 and ev["serving.waiting_max"] == 624
    assert ev["serving.kv_cache_usage_max_ratio"] == 0.073


def test_benchmark_block_with_e2el_and_percentiles() -> None:
    lines = [
        "============ Serving Benchmark Result ============",
        "Successful requests:                     200",
        "Maximum request concurrency:             64",
        "Benchmark duration (s):                  30.00",
        "Request throughput (req/s):              6.67",
        "---------------Time to First Token----------------",
        "Mean TTFT (ms):                          900.10",
        "Median TTFT (ms):                        850.00",
        "P90 TTFT (ms):                           1500.00",
        "P99 TTFT (ms):                           2100.50",
        "----------------End-to-end Latency----------------",
        "Mean E2EL (ms):                          9000.00",
        "P99 E2EL (ms):                           15000.00",
        "==================================================",
    ]
    src = _source(lines)
    ev = {e.key: e.value for e in src.evidence("bench")}
    assert ev["bench.concurrency"] == 64
    assert ev["latency.ttft_ms.p90"] == 1500.0 and ev["latency.e2e_ms.p99"] == 15000.0
    assert src.problems() == []


def test_benchmark_block_cut_short_is_partial() -> None:
    lines = ["============ Serving Benchmark Result ============", "Successful requests:  10",
             "Mean TTFT (ms):   123.0"]
    src = _source(lines)
    assert src.problems()
    assert any(e.key == "latency.ttft_ms.mean" and e.value == 123.0 for e in src.evidence("cut"))


def test_v1_docker_log_config_and_capacity() -> None:
    ev = _ev("vllm_v1_docker_waiting_kv_full.txt")
    assert ev["serving.max_num_seqs"] == 128
    assert ev["serving.kv_capacity_tokens"] == 116496
    assert ev["serving.kv_max_concurrency"] == 14.22
    assert ev["serving.stat_samples"] == 4
    assert ev["serving.waiting_max"] == 263
    assert ev["serving.prefix_cache_hit_ratio"] == 0.042


def test_preemptions_use_the_cumulative_counter() -> None:
    ev = _ev("vllm_v0_preemption_recompute.txt")
    assert ev["serving.preemptions"] == 51  # vLLM warns only every 50th preemption
    assert ev["serving.kv_gpu_blocks"] == 7281


def test_sglang_batches_kv_fraction_and_prefix_ratio() -> None:
    ev = _ev("sglang_queue_retract.txt")
    assert ev["serving.kv_cache_usage_max_ratio"] == 0.99  # token usage is already a fraction
    assert ev["serving.waiting_max"] == 265 and ev["serving.running_max"] == 124
    assert ev["serving.preemptions"] == 3
    assert abs(_f(ev["serving.prefix_cache_hit_ratio"]) - 3072 / (11402 + 3072)) < 1e-9


# LMDeploy's stats line as its PR printed it (InternLM/lmdeploy#4297, lmdeploy/metrics/loggers.py, 2026-02-05)
LMDEPLOY = ("[2026-02-05 17:05:17 DP0] Avg thr (in/out): 4618.5 / 2756.3 tokens/s, API server "
            "(completed/routed/waiting): 1 / 50 / 50, Engine (running/waiting): 45 / 5, KV cache: 21.6%, ")


LMDEPLOY_NEW = ("[2026-08-01 10:00:00 Engine 000] Avg thr (in/out): 4618.5 / 2756.3 tokens/s, Server "
                "(succeeded/failed/routed/waiting): 120 / 2 / 50 / 12, Engine (running/waiting): 45 / 5, "
                "KV cache: 21.6%, ")


def test_lmdeploys_stated_batch_limit_is_read() -> None:
    """LMDeploy logs its engine's configuration as a repr at start-up: its max_batch_size is the sequence limit,
    and a routed count shown later never lowers it."""
    src = EngineLogSource()
    for line in ["2026-08-01 09:59:01,101 - lmdeploy - INFO - async_engine.py:165 - updated backend_config="
                 "PytorchEngineConfig(dtype='auto', tp=1, session_len=8192, max_batch_size=256, "
                 "cache_max_entry_count=0.8)",
                 LMDEPLOY_NEW]:
        src.feed(line)
    ev = {e.key: e.value for e in src.evidence("lmdeploy.log")}
    assert ev["serving.max_num_seqs"] == 256 and ev["serving.log_engine"] == "lmdeploy"


def test_grouped_stats_fields_are_read_key_by_key() -> None:
    """A label with its keys in parentheses and their values in order: the group naming running and waiting
    is the engine's batch and queue; the API server's requests held for a free engine instance wait too."""
    s = parse_grouped_stats(LMDEPLOY)
    assert s is not None and s.engine == "lmdeploy"
    assert (s.running, s.waiting) == (45, 55) and s.kv_usage_ratio is not None and abs(s.kv_usage_ratio - 0.216) < 1e-9
    assert (s.prompt_tokens_per_s, s.generation_tokens_per_s) == (4618.5, 2756.3)
    # 0.12.1-0.12.2 kept a cancelled stream "waiting" for good: the routed ones are no limit there
    assert s.limit is None
    # 0.12.3+ counts failed requests apart (InternLM/lmdeploy#4410, its loggers.py's layout): requests waiting at
    # the server mean every engine instance is taken, so the 50 routed are the limit
    new = parse_grouped_stats(LMDEPLOY_NEW)
    assert new is not None and (new.running, new.waiting, new.limit) == (45, 17, 50)
    idle = parse_grouped_stats(LMDEPLOY_NEW.replace("120 / 2 / 50 / 12", "120 / 2 / 12 / 0")
                               .replace("45 / 5", "12 / 0"))
    assert idle is not None and idle.limit is None and idle.waiting == 0
    # groups without a batch and a queue, or a line with no throughput and no KV cache, are no engine's stats
    # line; keys and values that do not pair are not read
    assert parse_grouped_stats("Avg thr (in/out): 4618.5 / 2756.3 tokens/s, KV cache: 21.6%") is None
    assert parse_grouped_stats("Pods (running/waiting): 3 / 1") is None
    assert parse_grouped_stats("Engine (running/waiting/swapped): 45 / 5, KV cache: 2%") is None
    # the first group naming both is the engine's, whatever the hash seed
    two = parse_grouped_stats("Engine (running/waiting): 45 / 5, Prefill (running/waiting): 3 / 9, KV cache: 2%")
    assert two is not None and (two.running, two.waiting) == (45, 14)


def test_grouped_stats_lines_in_bulk_read_as_one_by_one() -> None:
    """A log of them read in bulk (the tail of a big log) gives the aggregates of reading them one by one, in the
    lines' order where they are mixed with vLLM's stats lines (the bulk reader folds a learned layout's lines at
    once: another engine's line among them must keep its place, here the last waiting count)."""
    lines = [LMDEPLOY.replace("45 / 5", f"{40 + i % 6} / {i % 9}").replace("17:05:17", f"17:{i // 60:02d}:{i % 60:02d}")
             for i in range(200)]
    bulk, single = EngineLogParser(), EngineLogParser()
    bulk.feed_raw(lines)
    for line in clean_lines(lines):
        single.feed(line)
    a, b = bulk.summary(), single.summary()
    assert a.samples == b.samples == 200 and a.engines == b.engines == ("lmdeploy",)
    assert (a.running.high, a.waiting.high, a.queued_samples) == (b.running.high, b.waiting.high, b.queued_samples)
    assert a.waiting.high == 58  # 8 at the engine, 50 at the API server
    vllm = ("INFO 06-02 10:01:12 [loggers.py:111] Engine 000: Avg prompt throughput: 5120.3 tokens/s, Avg generation "
            "throughput: 1502.2 tokens/s, Running: 74 reqs, Waiting: {w} reqs, GPU KV cache usage: 47.6%, Prefix "
            "cache hit rate: 4.1%")
    learn = [vllm.format(w=3)]  # its layout learned first, as the head of a log is read
    mixed = [vllm.format(w=i % 7) for i in range(30)] + [LMDEPLOY] + [vllm.format(w=i % 7) for i in range(30, 61)]
    bulk, single = EngineLogParser(), EngineLogParser()
    for p in (bulk, single):
        p.feed(learn[0])
    bulk.feed_raw(mixed)
    for line in clean_lines(mixed):
        single.feed(line)
    assert bulk.summary().waiting.last == single.summary().waiting.last == 60 % 7  # the last line's, not LMDeploy's 55


# LMDeploy's vLLM-layout stats lines (its stat logger is adapted from vLLM's; InternLM/lmdeploy
# lmdeploy/metrics/loggers.py): printed after its own "[%Y-%m-%d %H:%M:%S DP0] " by its releases (one version adds
# "Finished: N reqs, Unfinished: N reqs"); through its logger ("%(asctime)s - %(name)s - %(levelname)s -
# %(filename)s:%(lineno)d - %(message)s", lmdeploy/utils.py) or with a "DP: 0, " field in development commits
LMDEPLOY_VLLM_LAYOUT = (
    "2025-07-01 12:00:{s:02d},017 - lmdeploy - INFO - loggers.py:78 - Avg prompt throughput: 120.5 tokens/s, Avg "
    "generation throughput: 300.1 tokens/s, Running: 4 reqs, Waiting: {w} reqs, GPU KV cache usage: 35.0%, ",
    "2025-07-01 12:00:{s:02d},017 - lmdeploy - INFO - loggers.py:71 - DP: 0, Avg prompt throughput: 120.5 tokens/s, "
    "Avg generation throughput: 300.1 tokens/s, Running: 4 reqs, Waiting: {w} reqs, GPU KV cache usage: 35.0%, ",
    "[2025-07-01 12:00:{s:02d} DP1] Avg prompt throughput: 120.5 tokens/s, Avg generation throughput: 300.1 tokens/s, "
    "Finished: 8 reqs, Unfinished: 20 reqs, Running: 4 reqs, Waiting: {w} reqs, GPU KV cache usage: 35.0%",
)
# vLLM's own: V0 through its logger, V1 with the engine's index, in docker compose
VLLM_LAYOUT = (
    "INFO 05-04 14:43:{s:02d} metrics.py:334] Avg prompt throughput: 120.5 tokens/s, Avg generation throughput: "
    "300.1 tokens/s, Running: 4 reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: 35.0%, CPU KV cache "
    "usage: 0.0%.",
    "vllm-1  | (APIServer pid=1) INFO 06-02 10:01:{s:02d} [loggers.py:111] Engine 000: Avg prompt throughput: 120.5 "
    "tokens/s, Avg generation throughput: 300.1 tokens/s, Running: 4 reqs, Waiting: {w} reqs, GPU KV cache usage: "
    "35.0%, Prefix cache hit rate: 4.1%",
)


def test_lmdeploys_vllm_layout_stats_lines_are_named_lmdeploys() -> None:
    """The fields are vLLM's; what stands before them says whose they are, read one by one and in bulk alike, so
    the advice names LMDeploy's knobs (--max-batch-size), not vLLM's."""
    for layout, engine in [*((x, "lmdeploy") for x in LMDEPLOY_VLLM_LAYOUT), *((x, "vllm") for x in VLLM_LAYOUT)]:
        lines = [layout.format(s=i % 60, w=i % 9) for i in range(40)]
        bulk, single = EngineLogParser(), EngineLogParser()
        bulk.feed_raw(lines)
        for line in clean_lines(lines):
            single.feed(line)
        a, b = bulk.summary(), single.summary()
        assert a.engines == b.engines == (engine,), layout
        assert a.samples == b.samples == 40 and a.waiting.high == b.waiting.high == 8
        ev = {e.key: e.value for e in _source(lines[:5]).evidence("engine.log")}
        assert ev["serving.log_engine"] == engine and ev["serving.running_max"] == 4
    # a logger whose name only begins like LMDeploy's, or a DP field after the stats fields, names nobody else
    other = VLLM_LAYOUT[1].format(s=1, w=2)
    for line in (other.replace("Engine 000: ", "x - lmdeployer - INFO - a.py:1 - "), other + ", DP: 0, "):
        p = EngineLogParser()
        p.feed(line)
        assert p.summary().engines == ("vllm",), line
    # a line of one known field is no stats line: it names no engine, and the stats line after it names its own
    p = EngineLogParser()
    for line in ("Waiting: 3 jobs", "Waiting: 4 jobs", LMDEPLOY_VLLM_LAYOUT[2].format(s=1, w=2)):
        p.feed(line)
    assert p.summary().engines == ("lmdeploy",) and p.summary().samples == 1


def test_a_stats_line_is_keyed_at_its_first_known_field_whatever_was_learned_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A line whose first known field is "Waiting:" taught the parser that anchor first; vLLM's lines, whose fields
    start at "Running:", were then keyed at their "Waiting:", never found, and read the slow way line after line
    (and never in bulk): the anchor a line is keyed at is the first of them in the line."""
    from diagnose.collectors import engine_log

    monkeypatch.setattr(engine_log, "_LAYOUTS", {})
    monkeypatch.setattr(engine_log, "_ANCHORS", [])
    stats = ("INFO 11-02 09:00:{s:02d} [loggers.py:123] Engine 000: Running: {r} reqs, Waiting: 2 reqs, GPU KV cache "
             "usage: 5.0%")
    p = EngineLogParser()
    for line in ("Waiting: 3 jobs", stats.format(s=1, r=4)):
        p.feed(line)
    got = engine_log.vllm_values(stats.format(s=2, r=7))
    assert got is not None and dict(zip(*got, strict=True))["running"] == 7.0


def test_tgi_spans_give_stage_breakdown() -> None:
    ev = _ev("tgi_request_spans_queue.txt")
    assert ev["requests.count"] == 3
    assert abs(_f(ev["stage.queue_ms.mean"]) - (4931.48 + 5201.12 + 5100.1) / 3) < 1e-6
    assert 0.7 < _f(ev["stage.queue.share"]) < 0.8
    assert ev["serving.rejected_overloaded"] == 1


def test_healthy_log_reports_a_rare_queue() -> None:
    ev = _ev("vllm_v0_healthy_short_burst.txt")
    assert ev["serving.waiting_max"] == 6
    assert abs(_f(ev["serving.queued_sample_ratio"]) - 1 / 6) < 1e-9


def test_unrelated_text_is_not_matched() -> None:
    p = EngineLogParser()
    for line in ["hello", "the preempted meeting", "Throughput: great", "max_num_seqs is a knob"]:
        p.feed(line)
    assert not p.matched()


def test_source_is_reusable_for_problems_and_evidence() -> None:
    with open(os.path.join(LOGS, "vllm_benchmark_running_capped_low_kv.txt"), encoding="utf-8") as fh:
        src = _source(fh.readlines())
    assert src.matched()
    assert src.problems() == []
    first = src.evidence("x")
    assert first == src.evidence("x")


with open(os.path.join(LOGS, "vllm_v1_docker_waiting_kv_full.txt"), encoding="utf-8") as _fh:
    SAMPLE = _fh.read()


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=2000))
def test_fuzz_random_text(text: str) -> None:
    src = _source(text.splitlines())
    src.evidence("fuzz")
    src.problems()


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=len(SAMPLE)), st.binary(max_size=200))
def test_fuzz_truncated_and_binary(cut: int, junk: bytes) -> None:
    text = SAMPLE[:cut] + junk.decode("latin-1") + SAMPLE[:cut].encode("utf-8").decode("utf-8", "replace")
    src = _source(text.splitlines())
    src.evidence("fuzz")
    src.problems()


def test_huge_line_and_mixed_encoding() -> None:
    raw = ("Running: 1 reqs, Pending: 2 reqs, " * 50_000).encode() + b"\xff\xfe caf\xe9 \n"
    src = _source(list(iter_text_lines(io.BytesIO(raw))))
    src.evidence("huge")


def test_sglang_bench_serving_block() -> None:
    lines = [
        "============ Serving Benchmark Result ============",
        "Backend:                                 sglang",
        "Traffic request rate:                    inf",
        "Max request concurrency:                 not set",
        "Successful requests:                     500",
        "Benchmark duration (s):                  60.10",
        "----------------End-to-End Latency----------------",
        "Mean E2E Latency (ms):                   20100.00",
        "Median E2E Latency (ms):                 19000.00",
        "---------------Time to First Token----------------",
        "Mean TTFT (ms):                          9000.00",
        "==================================================",
        "INFO 01-01 00:00:00 unrelated line",
    ]
    ev = {e.key: e.value for e in _source(lines).evidence("x")}
    assert ev["requests.count"] == 500
    assert ev["latency.e2e_ms.mean"] == 20100.0 and ev["latency.e2e_ms.p50"] == 19000.0
    assert ev["latency.ttft_ms.mean"] == 9000.0


def test_tei_spans_are_teis_with_their_tokenization_stage() -> None:
    """text-embeddings-inference's router spans (huggingface/text-embeddings-inference#305): TGI's design with a
    ``tokenization_time`` (the pre-processing stage) and µs queue times; named TEI, not TGI. Typed as log records,
    the report's prose reader never sees them (their total_time was read as 1.06 s of pre-processing)."""
    ev = _ev("tei_embed_spans_cpu.txt")
    assert ev["requests.count"] == 5
    tokenization = (13.304513, 22.741608, 11.313102, 21.854084, 13.317058)
    assert abs(_f(ev["stage.preprocess_ms.mean"]) - sum(tokenization) / 5) < 1e-6
    assert abs(_f(ev["stage.queue_ms.mean"]) - (0.626352 + 0.590231 + 0.66173 + 0.660538 + 0.797575) / 5) < 1e-6
    assert _f(ev["stage.inference.share"]) > 0.95
    p = EngineLogParser()
    with open(os.path.join(LOGS, "tei_embed_spans_cpu.txt"), encoding="utf-8") as fh:
        for line in clean_lines(fh.readlines()):
            p.feed(line)
    assert "tei" in p.engines and "tgi" not in p.engines
    with open(os.path.join(LOGS, "tei_embed_spans_cpu.txt"), encoding="utf-8") as fh:
        text = fh.read()
    res = loose.analyze_stream("paste", io.BufferedReader(io.BytesIO(text.encode())))
    keys = {e.key for e in res.evidence}
    assert not any(k.startswith("report.") for k in keys), sorted(k for k in keys if k.startswith("report."))


def test_a_stats_line_a_paste_wrapped_is_read_whole() -> None:
    """A stats line hard-wrapped at a terminal's or an editor's width: mid-label (vllm-project/vllm#1492: ``GPU KV
    cache u`` / ``sage: 98.7%``) or after a comma (``Waiting: 0 reqs,`` / `` GPU KV cache usage: 4.6%``, and ``…, G`` /
    ``PU KV cache usage: 9.2%``). The KV reading was lost, and with it the mechanism (a full KV cache read as
    "neither the KV cache nor a sequence limit is full"). A line that is no continuation is read on its own."""
    v0 = ("INFO 10-27 20:44:35 llm_engine.py:624] Avg prompt throughput: 642.0 tokens/s, Avg generation throughput: "
          "61.0 tokens/s, Running: 2 reqs, Swapped: 0 reqs, Pending: 20 reqs, GPU KV cache u",
          "sage: 98.7%, CPU KV cache usage: 0.0%\".")
    v1 = ("INFO 01-12 02:58:15 [loggers.py:123] Engine 000: Avg prompt throughput: 1646.8 tokens/s, Avg generation "
          "throughput: 154.3 tokens/s, Running: 128 reqs, Waiting: 0 reqs,",
          " GPU KV cache usage: 4.6%, Prefix cache hit rate: 0.0%",
          "INFO 01-12 02:58:25 [loggers.py:123] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
          "throughput: 3084.3 tokens/s, Running: 128 reqs, Waiting: 0 reqs, G",
          "PU KV cache usage: 9.2%, Prefix cache hit rate: 0.0%")
    for lines, kv, n in ((v0, (0.987,), 1), (v1, (0.046, 0.092), 2)):
        p = EngineLogParser()
        for line in clean_lines(list(lines)):
            p.feed(line)
        s = p.summary()
        assert s.samples == n and s.kv_usage.count == n, lines
        assert abs((s.kv_usage.max or 0) - max(kv)) < 1e-9
    # a cut line whose next line is something else is read alone, and that line on its own
    p = EngineLogParser()
    for line in (v0[0], "INFO 10-27 20:44:45 llm_engine.py:624] Avg prompt throughput: 1.0 tokens/s, Running: 3 reqs, "
                 "Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 10.0%"):
        p.feed(line)
    s = p.summary()
    assert s.samples == 2 and s.running.max == 3 and s.kv_usage.count == 1
    p = EngineLogParser()
    p.feed(v0[0])  # the input ends on the cut line: it is read at the end
    assert p.summary().waiting.max == 20


def test_a_serving_benchmarks_offered_load_and_backend() -> None:
    """The load a serving benchmark offered: vLLM's "Traffic request rate: 4.0" before its block, SGLang's row in its
    block, or ``--request-rate inf`` on the command line (every request at once: ``bench.burst``); SGLang's block is
    labelled SGLang's ("Backend: sglang"), not vLLM's."""
    ev = _ev("vllm_bench_serving_rate4_above_throughput.txt")
    assert ev["bench.offered_rps"] == 4.0 and ev["throughput.rps"] == 2.11 and "bench.burst" not in ev
    ev = _ev("vllm_bench_serve_burst_long_prompts.txt")
    assert ev["bench.burst"] == 1 and "bench.offered_rps" not in ev
    src = EngineLogSource()
    with open(os.path.join(LOGS, "sglang_bench_serving_concurrency_330.txt"), encoding="utf-8") as fh:
        for line in clean_lines(fh.readlines()):
            src.feed(line)
    got = {e.key: e for e in src.evidence("t")}
    assert got["bench.offered_rps"].value == 330.0 and got["bench.concurrency"].value == 330.0
    assert got["throughput.rps"].detail.startswith("SGLang serving benchmark")
    # the printed rate wins over a flag on a command line that came before it
    p = EngineLogParser()
    for line in ("vllm bench serve --model m --request-rate inf", "Traffic request rate: 8.0"):
        p.feed(line)
    assert p.summary().offered_rps == 8.0


def test_what_a_review_found_in_the_benchmark_and_wrap_readers() -> None:
    """A rate that is no number ends nothing ("--request-rate=..5" aborted the analysis); the cap vLLM 0.6-0.8 print
    before the block, and --max-concurrency, are read; a wrap inside a number is rejoined; a person's "Running: yes"
    held for a continuation is never a stats line."""
    p = EngineLogParser()
    for line in ("see --request-rate=..5 and --max-concurrency 8", "Maximum request concurrency: 16"):
        p.feed(line)
    s = p.summary()
    assert s.offered_rps is None and s.bench_cap == 16
    p = EngineLogParser()
    for line in clean_lines(["INFO 10-27 20:44:35 llm_engine.py:624] Avg prompt throughput: 642.0 tokens/s, Running: 2 "
                             "reqs, Swapped: 0 reqs, Pending: 20 reqs, GPU KV cache usage: 9",
                             "8.7%, CPU KV cache usage: 0.0%"]):
        p.feed(line)
    assert abs((p.summary().kv_usage.max or 0) - 0.987) < 1e-9
    p = EngineLogParser()
    p.feed("The pod status - Running: yes, but then it hangs forever")
    assert not p.matched()
