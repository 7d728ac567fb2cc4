"""Prometheus exposition: the alias table, scrape splitting, deltas and bucket percentiles."""

from __future__ import annotations

import math
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.collectors.logtext import clean_lines
from diagnose.collectors.prom import ALIASES, BY_NAME, Kind, PromBuffer, interpolate_quantile, lookup
from diagnose.derive.prom import PromSource
from tests.conftest import DATA

METRICS = os.path.join(DATA, "metrics")


def _f(x: object) -> float:
    assert isinstance(x, int | float)
    return float(x)


def _source(lines: list[str], src: PromSource | None = None) -> PromSource:
    src = src or PromSource()
    for line in clean_lines(lines):
        src.feed(line)
    return src


def _ev(name: str) -> dict[str, object]:
    with open(os.path.join(METRICS, name), encoding="utf-8") as fh:
        src = _source(fh.readlines())
    assert src.matched()
    return {e.key: e.value for e in src.evidence(name)}


def _close(a: object, b: float, tol: float = 1e-6) -> bool:
    return isinstance(a, int | float) and math.isclose(float(a), b, rel_tol=tol, abs_tol=tol)


def test_alias_table_is_consistent() -> None:
    assert all(a.names and a.unit and a.combine in ("sum", "max") for a in ALIASES)
    assert len(BY_NAME) == sum(len(a.names) for a in ALIASES)
    # both vLLM names of the KV-cache gauge and the inter-token histogram map to one series
    assert BY_NAME["vllm:gpu_cache_usage_perc"].canonical == BY_NAME["vllm:kv_cache_usage_perc"].canonical
    assert (BY_NAME["vllm:time_per_output_token_seconds"].canonical
            == BY_NAME["vllm:inter_token_latency_seconds"].canonical)


def test_lookup_suffixes() -> None:
    hit = lookup("vllm:num_preemptions_total")
    assert hit is not None and hit[0].canonical == "preemptions" and hit[1] == "total"
    hit = lookup("vllm:time_to_first_token_seconds_bucket")
    assert hit is not None and hit[0].kind is Kind.HISTOGRAM and hit[1] == "bucket"
    # Triton's nv_inference_count is a counter, not the _count of a histogram
    hit = lookup("nv_inference_count")
    assert hit is not None and hit[0].canonical == "triton_inferences" and hit[1] == "total"
    assert lookup("python_gc_objects_collected_total") is None


def test_interpolate_quantile() -> None:
    buckets = [(0.1, 10.0), (1.0, 60.0), (10.0, 100.0), (math.inf, 100.0)]
    assert _close(interpolate_quantile(0.5, buckets), 0.1 + 0.9 * (50 - 10) / 50)
    assert _close(interpolate_quantile(0.05, buckets), 0.05)
    assert _close(interpolate_quantile(0.99, buckets), 1.0 + 9.0 * (99 - 60) / 40)
    # the answer lies in +Inf: report the highest finite bound
    assert interpolate_quantile(0.99, [(1.0, 1.0), (math.inf, 10.0)]) == 1.0
    assert interpolate_quantile(0.5, []) is None
    assert interpolate_quantile(0.5, [(1.0, 0.0), (math.inf, 0.0)]) is None


def test_quantiles_inside_the_lowest_bucket_are_not_invented() -> None:
    """Every request under vLLM's lowest queue bucket (0.3 s): its p50 and p99 are only "below 300 ms", so
    none is emitted (interpolating from 0 read as p50 150 ms, p99 297 ms on a healthy live run, and a tail
    rule named queueing); the mean, from _sum and _count, stays exact."""
    text = ["# scrape at 1000.0 from http://127.0.0.1:8000/metrics\n"]
    for t, n, total in ((1000.0, 0, 0.0), (1030.0, 200, 0.4)):
        if t > 1000.0:
            text.append(f"# scrape at {t} from http://127.0.0.1:8000/metrics\n")
        text += [f'vllm:request_queue_time_seconds_bucket{{le="{le}"}} {n}\n' for le in ("0.3", "0.5", "+Inf")]
        text += [f"vllm:request_queue_time_seconds_sum {total}\n", f"vllm:request_queue_time_seconds_count {n}\n",
                 f'vllm:e2e_request_latency_seconds_bucket{{le="0.3"}} {n // 2}\n',
                 f'vllm:e2e_request_latency_seconds_bucket{{le="0.5"}} {n}\n',
                 f'vllm:e2e_request_latency_seconds_bucket{{le="+Inf"}} {n}\n',
                 f"vllm:e2e_request_latency_seconds_sum {total * 150}\n",
                 f"vllm:e2e_request_latency_seconds_count {n}\n"]
    src = _source(text)
    ev = {e.key: e.value for e in src.evidence("two-scrapes.txt")}
    assert _close(ev["stage.queue_ms.mean"], 2.0)  # 0.4 s over 200 requests
    assert not {"stage.queue_ms.p50", "stage.queue_ms.p99"} & set(ev)
    # e2e: half the requests above 0.3 s: its p99 lies in the second bucket and is kept, its p50 is not
    assert "latency.e2e_ms.p99" in ev and "latency.e2e_ms.p50" not in ev


def test_vllm_v1_two_scrapes_use_the_window() -> None:
    ev = _ev("vllm_v1_two_scrapes_queue_kv_full.txt")
    assert ev["serving.metric_scrapes"] == 2
    assert ev["requests.count"] == 600  # finished between the scrapes, not since start
    assert ev["serving.preemptions"] == 57
    assert _close(ev["throughput.rps"], 10.0)  # 600 requests over 60 s
    assert _close(ev["serving.prefix_cache_hit_ratio"], 4e4 / 5e5)
    assert ev["serving.kv_cache_usage_max_ratio"] == 0.99
    assert ev["serving.waiting_max"] == 412 and ev["serving.running_max"] == 128
    assert 0.6 < _f(ev["stage.queue.share"]) < 0.7
    assert 4000 < _f(ev["stage.queue_ms.p50"]) < 12000
    assert 300 < _f(ev["tokens.input_mean"]) < 1800
    assert {"latency.ttft_ms.p99", "latency.itl_ms.p50", "stage.prefill_ms.mean", "stage.decode_ms.mean"} <= set(ev)


def test_vllm_v0_single_scrape_old_names() -> None:
    ev = _ev("vllm_v0_single_scrape_healthy.txt")
    assert ev["serving.metric_scrapes"] == 1
    assert ev["serving.kv_cache_usage_max_ratio"] == 0.21
    assert ev["serving.waiting_max"] == 0
    assert "latency.itl_ms.mean" in ev  # from the old time_per_output_token name
    assert "throughput.rps" not in ev  # one scrape: no rate


def test_triton_concatenated_scrapes_split_by_repetition() -> None:
    ev = _ev("triton_two_scrapes_concatenated.txt")
    assert ev["serving.metric_scrapes"] == 2
    assert ev["requests.count"] == 1440679 - 1200345
    assert 240 < _f(ev["stage.queue_ms.mean"]) < 245
    assert 3.5 < _f(ev["stage.compute_ms.mean"]) < 4.0
    assert 0.97 < _f(ev["stage.queue.share"]) < 0.99
    assert _close(ev["bench.server_batch_mean"], (1440679 - 1200345) / (90042 - 75021))
    assert ev["serving.waiting_max"] == 984


def test_sglang_and_tgi() -> None:
    ev = _ev("sglang_single_scrape_queue.txt")
    assert ev["serving.kv_cache_usage_max_ratio"] == 0.98 and ev["serving.waiting_max"] == 317
    ev = _ev("tgi_single_scrape.txt")
    assert ev["serving.waiting_max"] == 41 and ev["serving.running_max"] == 32
    assert _close(ev["stage.queue.share"], 2710.5 / 4035.1)
    assert "stage.inference_ms.mean" in ev


def test_tensorrt_llm_trtllm_serve_names() -> None:
    """trtllm-serve's /metrics (tensorrt_llm/metrics/collector.py): the queue gauges, the KV cache's used share
    of its blocks, the per-request histograms and the scheduler's own limit on active requests."""
    ev = _ev("trtllm_two_scrapes_queue.txt")
    assert ev["serving.engine"] == "tensorrt-llm" and ev["serving.metric_scrapes"] == 2
    assert ev["serving.waiting_max"] == 231 and ev["serving.running_max"] == 64
    assert ev["serving.kv_cache_usage_max_ratio"] == 0.42 and ev["serving.max_num_seqs"] == 64
    assert ev["requests.count"] == 450  # the window's requests, not the 5,450 since the start
    assert 5_000 < _f(ev["stage.queue_ms.mean"]) < 13_000 and "latency.ttft_ms.p50" in ev


def test_lmdeploy_names() -> None:
    """LMDeploy's PrometheusStatLogger (lmdeploy/metrics/loggers.py): vLLM's names under its own prefix, the KV
    usage a fraction, and its server's queue (lmdeploy:num_api_requests_waiting) beside the engine's."""
    lab = 'model_name="internlm2_5-7b-chat",engine="0"'
    lines = []
    for i, (run, wait, kv, gen, ok) in enumerate(((128, 40, 0.31, 1000, 50), (128, 96, 0.33, 61000, 250))):
        lines += [f"# scrape at {1770000000 + 60 * i}", f"lmdeploy:num_requests_running{{{lab}}} {run}",
                  f"lmdeploy:num_requests_waiting{{{lab}}} {wait}", f"lmdeploy:num_api_requests_waiting{{{lab}}} 30",
                  f"lmdeploy:gpu_cache_usage_perc{{{lab}}} {kv}",
                  f"lmdeploy:generation_tokens_total{{{lab}}} {gen}",
                  f'lmdeploy:e2e_request_latency_seconds_bucket{{{lab},le="5.0"}} {ok // 2}',
                  f'lmdeploy:e2e_request_latency_seconds_bucket{{{lab},le="+Inf"}} {ok}',
                  f"lmdeploy:e2e_request_latency_seconds_count{{{lab}}} {ok}",
                  f"lmdeploy:e2e_request_latency_seconds_sum{{{lab}}} {ok * 6.0}"]
    ev = {e.key: e.value for e in _source(lines).evidence("x")}
    # the engine's queue and the server's (requests held for a free engine instance) add up
    assert ev["serving.engine"] == "lmdeploy" and ev["serving.running_max"] == 128
    assert ev["serving.waiting_max"] == 96 + 30
    assert ev["serving.kv_cache_usage_max_ratio"] == 0.33 and ev["requests.count"] == 200
    assert ev["serving.generation_tokens_per_s"] == 1000.0  # 60,000 tokens in the 60 s between the scrapes


def test_scrape_comment_and_three_scrapes_keep_first_and_last() -> None:
    lines = []
    for i, (w, t) in enumerate(((5, 100), (50, 200), (9, 300))):
        lines += [f"# scrape at {1700000000 + 10 * i}", f'vllm:num_requests_waiting{{model_name="m"}} {w}',
                  f'vllm:request_success_total{{model_name="m"}} {t}']
    src = _source(lines)
    ev = {e.key: e.value for e in src.evidence("x")}
    assert ev["serving.metric_scrapes"] == 3
    assert ev["serving.waiting_max"] == 9  # the middle scrape is not kept
    assert _close(ev["throughput.rps"], 200 / 20)


def test_log_lines_and_unknown_metrics_are_ignored() -> None:
    buf = PromBuffer()
    for line in ["INFO 03-18 12:34:52 llm_engine.py:706] Running: 3 reqs", "took: 23.7",
                 "python_gc_objects_collected_total 1", "process_cpu_seconds_total 12.0", "vllm:num_requests_waiting"]:
        assert not buf.feed(line)
    assert not buf.matched()


def test_bad_line_is_counted_not_fatal() -> None:
    src = _source(['vllm:num_requests_waiting{model_name="m"} 4', 'vllm:num_requests_running{model_name=m} 2',
                   'vllm:num_requests_running{model_name="m"} 3'])
    ev = {e.key: e.value for e in src.evidence("x")}
    assert ev["serving.waiting_max"] == 4 and ev["serving.running_max"] == 3
    assert any("could not be parsed" in p for p in src.problems())


def test_buffer_is_bounded() -> None:
    src = PromSource()
    src._buf = PromBuffer(max_lines=5)
    _source([f'vllm:num_requests_waiting{{engine="{i}"}} 1' for i in range(50)], src)
    assert any("line limit" in p for p in src.problems())


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=80),
    st.sampled_from(sorted(BY_NAME)).map(lambda n: n + "_bucket{le=\"0.5\"} 3"),
    st.sampled_from(sorted(BY_NAME)).map(lambda n: n + " 1e3"),
    st.sampled_from(sorted(BY_NAME)).map(lambda n: "# TYPE " + n + " histogram"),
), max_size=40))
def test_fuzz_mixed_metric_lines(lines: list[str]) -> None:
    src = _source(lines)
    src.evidence("fuzz")
    src.problems()


@settings(max_examples=30, deadline=None)
@given(st.binary(max_size=500))
def test_fuzz_binary(junk: bytes) -> None:
    src = _source([*junk.decode("utf-8", "replace").splitlines(), 'vllm:num_requests_waiting{a="\xff"} 1'])
    src.evidence("fuzz")


def test_huge_line_and_mixed_encoding() -> None:
    import io

    from diagnose.collectors.logtext import iter_text_lines

    raw = b'vllm:num_requests_waiting{model_name="' + b"\xe9\xff" * 400_000 + b'"} 3\n' + "é".encode("latin-1") + b"\n"
    src = _source(list(iter_text_lines(io.BytesIO(raw))))
    src.evidence("huge")
    src.problems()


def test_a_histogram_pasted_without_its_sum_has_no_mean() -> None:
    """vLLM's inter-token histogram pasted as its buckets alone (vllm-project/production-stack#318): the
    quantiles come from the buckets, but with no ``_sum`` there is no total and so no mean (it read 0 ms); its
    count is of token gaps, not requests."""
    le = ("0.01", "0.025", "0.05", "0.075", "0.1", "0.15", "1.0")
    counts = ("0.0", "3328.0", "131575.0", "132336.0", "133907.0", "134962.0", "135001.0")
    lines = ["# TYPE vllm:time_per_output_token_seconds histogram"] + [
        f'vllm:time_per_output_token_seconds_bucket{{le="{b}",model_name="Qwen/Qwen2.5-Coder-32B-Instruct"}} {n}'
        for b, n in zip(le, counts, strict=True)]
    got = {e.key: e for e in _source(lines).evidence("t")}
    assert "latency.itl_ms.mean" not in got
    assert 30 < float(got["latency.itl_ms.p50"].value) < 50  # type: ignore[arg-type]
    assert "135001 token gaps" in got["latency.itl_ms.p50"].detail
    # with its sum and count the mean is there, as before
    full = {e.key: e.value for e in _source([*lines, "vllm:time_per_output_token_seconds_sum 5400.0",
                                             "vllm:time_per_output_token_seconds_count 135001.0"]).evidence("t")}
    assert _close(full["latency.itl_ms.mean"], 5400.0 / 135001 * 1000)
