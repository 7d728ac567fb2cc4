"""QUE002/QUE003/QUE004/QUE011 on evidence from real incident excerpts and constructed edge cases."""

from __future__ import annotations

import os

import pytest

from diagnose import pipeline
from diagnose.collectors.logtext import clean_lines
from diagnose.derive.bench import BenchSource
from diagnose.derive.engine_log import EngineLogSource
from diagnose.derive.prom import PromSource
from diagnose.derive.timing import TimingSource
from diagnose.loose import analyze_lines
from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Mechanism, Severity, Verdict
from diagnose.reports.wording import undetermined_text
from diagnose.rules.engine import run_rules
from diagnose.rules.report import wording_only
from diagnose.rules.serving import (
    ClientPayloadIO,
    EngineQueueSaturated,
    LittlesLawQueueing,
    QueueShareOfLatency,
    SweepPlateau,
)
from tests.conftest import DATA

MINE = (EngineQueueSaturated, LittlesLawQueueing, QueueShareOfLatency, ClientPayloadIO, SweepPlateau)
SOURCES = {"logs": EngineLogSource, "metrics": PromSource, "bench": BenchSource, "engines": EngineLogSource,
           "timing": TimingSource}


def _evidence(rel: str) -> EvidenceSet:
    folder = rel.split("/")[0]
    src = SOURCES[folder]()
    with open(os.path.join(DATA, rel), encoding="utf-8") as fh:
        for line in clean_lines(fh.readlines()):
            src.feed(line)
    return EvidenceSet(src.evidence(rel))


def _findings(ev: EvidenceSet) -> dict[str, Finding]:
    findings, _ = run_rules(ev, rules=MINE)
    return {f.code: f for f in findings}


def _set(**values: float) -> EvidenceSet:
    return EvidenceSet(Evidence(k.replace("__", "."), v, "", "test") for k, v in values.items())


@pytest.mark.parametrize(
    ("rel", "codes"),
    [
        ("logs/vllm_v0_pending_kv_cache_full.txt", {"QUE002"}),  # vllm-3561
        ("logs/vllm_benchmark_running_capped_low_kv.txt", {"QUE002"}),  # vllm-pr8804
        ("bench/perf_analyzer_concurrency1000_queue_dominates.txt", {"QUE003", "QUE004"}),  # triton-7986
        # an old ensemble's own queue (0 µs) leaves its models' out: compute 7.8 of 1,886 ms at 500 in flight
        ("bench/perf_analyzer_ensemble_totals_queue_unreported.txt", {"QUE003"}),  # triton server#2429
        # throughput flat from 6 to 32 in flight while the TTFT grows 30x (gittensor#1720); still scaling (ninfer#14)
        ("timing/sweep_plateau_aggregate_decode_flat.md", {"QUE011"}),
        ("timing/sweep_scaling_healthy_concurrency_table.md", set()),
        ("logs/vllm_v1_docker_waiting_kv_full.txt", {"QUE002"}),
        ("logs/vllm_v0_preemption_recompute.txt", {"QUE002"}),
        ("logs/sglang_queue_retract.txt", {"QUE002"}),
        ("logs/tgi_request_spans_queue.txt", {"QUE004"}),
        ("metrics/vllm_v1_two_scrapes_queue_kv_full.txt", {"QUE002", "QUE004"}),
        ("metrics/triton_two_scrapes_concatenated.txt", {"QUE004"}),
        ("logs/vllm_v0_healthy_short_burst.txt", set()),
        ("metrics/vllm_v0_single_scrape_healthy.txt", set()),
        ("bench/wrk_latency_400_connections.txt", set()),  # no server breakdown: QUE003 cannot judge
        # the client's send/recv is 77 % of its latency (triton server#1); the queue findings from the same latency
        ("bench/perf_client_http_send_recv_large_tensors.txt", {"CPU004", "QUE003"}),
        ("bench/perf_analyzer_bulleted_http.txt", set()),  # send 47 µs of 223 ms
        ("bench/perf_analyzer_bulleted_grpc.txt", set()),
        # one request in flight, the server's own queue 57 µs of 235.8 ms: its overhead is no queue (triton#4250)
        ("bench/perf_analyzer_overhead_dominant_concurrency1.txt", set()),
        # 22 pending, nothing running, an empty KV cache, no token generated: a stall, no queue for capacity
        ("logs/vllm_v0_multistep_stall_pending.txt", set()),
    ],
)
def test_queueing_findings_on_samples(rel: str, codes: set[str]) -> None:
    found = {c for c, f in _findings(_evidence(rel)).items() if f.severity is not Severity.INFO}
    assert found == codes


def test_a_stalled_scheduler_is_no_queue_for_capacity_and_no_health() -> None:
    """vLLM's multi-step scheduling in development (vllm-project/vllm#8378): after three completions requests stack
    up in pending (12, then 22) while no stats line shows one running, the KV cache is empty and the last interval
    generated nothing. Nothing is full, so no limit or capacity holds them: the scheduler stopped. A note with
    where to look (py-spy on the engine), never a committed queueing bottleneck (it read "queueing, 92 %") and
    never "healthy" (a note otherwise explains a healthy pattern)."""
    ev = _evidence("logs/vllm_v0_multistep_stall_pending.txt")
    f = _findings(ev)["QUE002"]
    assert f.severity is Severity.INFO and f.mechanism is Mechanism.STALLED
    assert "Up to 22 requests wait" in f.message and "py-spy dump" in f.fixes[0].steps[0]
    d = pipeline.judge(ev)
    assert d.overall is Verdict.UNDETERMINED and d.next_steps[0].startswith("py-spy dump")
    assert "the engine stopped scheduling" in undetermined_text(d)
    # a burst that arrives between two steps and runs at the next one is no stall: it does not last
    burst = EvidenceSet([e for e in ev if e.key not in ("serving.waiting_last", "serving.queued_samples")]
                        + [Evidence("serving.waiting_last", 0.0, "", "t"),
                           Evidence("serving.queued_samples", 1.0, "", "t")])
    assert _findings(burst).get("QUE002") is None or _findings(burst)["QUE002"].mechanism is not Mechanism.STALLED
    # one running batch among the samples with requests waiting, or a KV cache in use, is no stall
    for key, value in (("serving.running_when_queued_max", 2.0), ("serving.kv_cache_usage_when_queued_max_ratio",
                                                                   0.4)):
        busy = EvidenceSet([e for e in ev if e.key != key] + [Evidence(key, value, "", "t")])
        g = _findings(busy).get("QUE002")
        assert g is None or g.mechanism is not Mechanism.STALLED, key


def test_kv_bound_cause_and_fix() -> None:
    f = _findings(_evidence("logs/vllm_v0_pending_kv_cache_full.txt"))["QUE002"]
    assert "99 % full" in f.message and "78 requests wait" in f.message
    assert any("kv-cache-dtype fp8" in s for fx in f.fixes for s in fx.steps)
    assert f.confidence is Confidence.HEURISTIC  # one stats line


def test_default_sequence_cap_cause() -> None:
    f = _findings(_evidence("logs/vllm_benchmark_running_capped_low_kv.txt"))["QUE002"]
    assert "sits at 255, where the default sequence limit would hold it" in f.message
    assert "7 % used" in f.message and "256 in V0" in f.message  # version unknown: both generations named
    assert "--max-num-seqs" in f.fixes[0].steps[0]


def _h100_v1(running: float) -> EvidenceSet:
    ev = _set(serving__waiting_max=2 * running, serving__waiting_mean=running, serving__queued_sample_ratio=1.0,
              serving__stat_samples=10, serving__running_max=running, serving__running_when_queued_mean=running,
              serving__running_when_queued_max=running, serving__kv_cache_usage_when_queued_mean_ratio=0.2)
    return EvidenceSet([*ev, Evidence("serving.engine", "vllm", "", "test"),
                        Evidence("serving.vllm_v1", True, "", "test"),
                        Evidence("gpu.spec_memory_bytes", 80 * 2**30, "NVIDIA H100 80GB HBM3", "test")])


def test_v1_default_sequence_cap_depends_on_the_gpu() -> None:
    # vLLM V1 on an 80 GiB H100 defaults to 1024 sequences: a batch at 255 is not at the default cap
    assert "compute" in _findings(_h100_v1(255))["QUE002"].message
    f = _findings(_h100_v1(1020))["QUE002"]
    assert "sits at 1020" in f.message and "vLLM V1's default --max-num-seqs is 256, or 1024" in f.message
    assert f.fixes[0].steps[0].startswith("vLLM: --max-num-seqs")  # the engine in use comes first


def test_vllms_default_limit_is_not_another_engines() -> None:
    """A batch at 255 is at vLLM's default limit only on vLLM (or an engine not named): SGLang's own limit is
    sized from memory, so there it names no limit it was not told."""
    ev = _h100_v1(255)
    vllm_v0 = EvidenceSet([e for e in ev if e.key not in ("serving.vllm_v1", "gpu.spec_memory_bytes")])
    assert "default sequence limit" in _findings(vllm_v0)["QUE002"].message
    sglang = EvidenceSet([Evidence("serving.engine", "sglang", "", "test") if e.key == "serving.engine" else e
                          for e in vllm_v0])
    f = _findings(sglang)["QUE002"]
    assert "default sequence limit" not in f.message and f.mechanism is not Mechanism.ADMISSION_CAP
    # the same from SGLang's own stats lines, which name the engine by their layout
    src = EngineLogSource()
    for i in range(60):
        src.feed(f"[2025-01-10 08:12:{i:02d} TP0] Decode batch. #running-req: 255, #token: 198432, token usage: 0.30, "
                 "gen throughput (token/s): 3120.55, #queue-req: 262")
    ev = EvidenceSet(src.evidence("sglang.log"))
    got = ev.get("serving.log_engine")
    assert got is not None and got.value == "sglang"
    f = _findings(ev)["QUE002"]
    assert "default sequence limit" not in f.message and f.mechanism is not Mechanism.ADMISSION_CAP


def test_lmdeploy_requests_held_at_its_api_server_are_its_batch_limit() -> None:
    """LMDeploy's stats line (0.12.3+, InternLM/lmdeploy#4410): with requests waiting at the API server every engine
    instance is taken, so the 50 it routed are its limit; a batch of 50 there with the KV cache 22 % used is held
    by that limit, and the fix names LMDeploy's --max-batch-size first."""
    line = ("[2026-08-01 10:00:{s:02d} Engine 000] Avg thr (in/out): 4618.5 / 2756.3 tokens/s, Server "
            "(succeeded/failed/routed/waiting): {c} / 0 / 50 / {w}, Engine (running/waiting): 50 / 0, "
            "KV cache: 21.6%, ")
    src = EngineLogSource()
    for i in range(40):
        src.feed(line.format(s=i % 60, c=i, w=10 + i % 5))
    ev = EvidenceSet(src.evidence("lmdeploy.log"))
    assert ev.value("serving.max_num_seqs") == 50 and ev.value("serving.waiting_max") == 14
    f = _findings(ev)["QUE002"]
    assert f.mechanism is Mechanism.ADMISSION_CAP and "max_num_seqs=50" in f.message
    assert f.fixes[0].steps[0].startswith("LMDeploy: --max-batch-size")


def test_a_vllm_log_naming_another_engine_is_still_vllms() -> None:
    """The engine of a log's stats lines outranks one the text names: vLLM prints 'Using TRTLLM attention' and
    its default sequence limit still applies to its own stats lines."""
    src = EngineLogSource()
    src.feed("INFO 08-14 09:12:00 [flashinfer.py:759] Using TRTLLM attention (required for attention sinks).")
    for i in range(60):
        src.feed(f"INFO 08-14 09:12:{i:02d} llm_engine.py:706] Avg prompt throughput: 209.6 tokens/s, Avg "
                 "generation throughput: 567.4 tokens/s, Running: 255 reqs, Swapped: 0 reqs, Pending: 80 reqs, GPU KV "
                 "cache usage: 30.0%, CPU KV cache usage: 0.0%")
    ev = EvidenceSet([*src.evidence("vllm.log"), Evidence("serving.engine", "tensorrt-llm", "", "named in the text")])
    f = _findings(ev)["QUE002"]
    assert f.mechanism is Mechanism.ADMISSION_CAP and "default sequence limit" in f.message


def test_an_engine_that_states_its_own_limit_by_gauge() -> None:
    """TensorRT-LLM's scheduler limit comes from its own gauge (trtllm_max_num_active_requests): a batch
    pinned there with the KV cache 42 % used is the limit, and the fix names trtllm-serve's flag first."""
    f = _findings(_evidence("metrics/trtllm_two_scrapes_queue.txt"))["QUE002"]
    assert f.mechanism is Mechanism.ADMISSION_CAP and "max_num_seqs=64" in f.message
    assert f.fixes[0].steps[0].startswith("TensorRT-LLM (trtllm-serve): --max_batch_size")


def test_stated_sequence_cap() -> None:
    ev = _set(serving__waiting_max=40, serving__waiting_mean=30, serving__queued_sample_ratio=1.0,
              serving__stat_samples=10, serving__running_max=64, serving__running_when_queued_mean=64,
              serving__running_when_queued_max=64, serving__max_num_seqs=64,
              serving__kv_cache_usage_when_queued_mean_ratio=0.4)
    f = _findings(ev)["QUE002"]
    assert "max_num_seqs=64" in f.message and f.confidence is Confidence.MEASURED


def _v1_stats_log(*samples: tuple[int, int, float]) -> EvidenceSet:
    """vLLM V1 (0.32) stats lines, as its CPU build prints them, for (running, waiting, KV %) samples."""
    src = EngineLogSource()
    for k, (running, waiting, kv) in enumerate(samples):
        src.feed(f"(APIServer pid=5755) INFO 12-02 04:4{k}:41 [loggers.py:335] Engine 000: Avg prompt throughput: "
                 f"455.9 tokens/s, Avg generation throughput: 131.2 tokens/s, Running: {running} reqs, Waiting: "
                 f"{waiting} reqs, CPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: 0.0%")
    return EvidenceSet(src.evidence("vllm.log"))


def test_kv_with_no_room_for_one_more_sequence() -> None:
    # the engine lab's KV-pressure run as CI saw it: never 95 % full, but at 77 % with 3 running the free quarter
    # holds less than one running sequence (0.9), so none of the 12 waiting fits: KV capacity, not compute
    ev = _v1_stats_log((3, 13, 77.4), (2, 12, 51.6), (3, 12, 71.0), (3, 6, 71.0))
    assert ev.value("serving.kv_free_sequences_when_queued_min") == pytest.approx(0.876, abs=0.001)
    f = _findings(ev)["QUE002"]
    assert f.mechanism is Mechanism.KV_CAPACITY and "held 0.9 of a running sequence" in f.message
    assert any("kv-cache-dtype fp8" in s for fx in f.fixes for s in fx.steps)
    # the same queue with the cache half empty at every sample has room for a waiting request: not KV
    roomy = _findings(_v1_stats_log((3, 13, 50.0), (2, 12, 40.0), (3, 12, 55.0), (3, 6, 52.0)))["QUE002"]
    assert roomy.mechanism is not Mechanism.KV_CAPACITY
    # a stated sequence limit the batch is pinned at holds requests first, however full the cache
    capped = EvidenceSet([*ev, Evidence("serving.max_num_seqs", 3, "", "test")])
    assert _findings(capped)["QUE002"].mechanism is Mechanism.ADMISSION_CAP


def test_compute_bound_engine_cause() -> None:
    ev = _set(serving__waiting_max=40, serving__waiting_mean=30, serving__queued_sample_ratio=1.0,
              serving__stat_samples=10, serving__running_max=20, serving__running_when_queued_mean=18,
              serving__kv_cache_usage_when_queued_mean_ratio=0.5)
    assert "compute" in _findings(ev)["QUE002"].message


def test_passing_burst_is_not_saturation() -> None:
    ev = _set(serving__waiting_max=50, serving__waiting_mean=5, serving__queued_sample_ratio=0.1,
              serving__stat_samples=20, serving__running_max=100)
    assert "QUE002" not in _findings(ev)


def test_slow_compute_is_not_queueing_triton_3386() -> None:
    findings = _findings(_evidence("bench/perf_analyzer_slow_compute_modest_concurrency.txt"))
    assert "QUE003" not in findings
    note = findings["QUE004"]
    assert note.severity is Severity.INFO and note.category is Category.QUEUEING
    assert "209.5 ms of compute" in note.message


def test_littles_law_numbers_triton_7986() -> None:
    f = _findings(_evidence("bench/perf_analyzer_concurrency1000_queue_dominates.txt"))["QUE003"]
    assert f.confidence is Confidence.CORRELATED
    assert "1000 requests in flight" in f.message and "15.4 in service" in f.message
    assert f.impact > 0.95


def test_littles_law_from_queue_share_and_from_sweep() -> None:
    ev = _set(bench__concurrency=200, throughput__rps=100, latency__e2e_ms__mean=2000, stage__queue_ms__mean=1950,
              latency__server_ms__mean=1990)
    assert "QUE003" in _findings(ev)
    ev = _set(bench__concurrency=64, throughput__rps=403.5, latency__e2e_ms__mean=158.6,
              bench__unloaded_latency_ms=4.75)
    assert "QUE003" in _findings(ev)
    ev = _set(bench__concurrency=4, throughput__rps=402.1, latency__e2e_ms__mean=9.9, bench__unloaded_latency_ms=4.75)
    assert "QUE003" not in _findings(ev)


def test_open_loop_lowers_confidence() -> None:
    ev = _set(bench__concurrency=1000, throughput__rps=4000, latency__e2e_ms__mean=90, stage__compute_ms__mean=1.0)
    assert _findings(ev)["QUE003"].confidence is Confidence.HEURISTIC


def test_dev_incidents_end_to_end() -> None:
    from diagnose import pipeline

    for rel in ("logs/vllm_v0_pending_kv_cache_full.txt", "logs/vllm_benchmark_running_capped_low_kv.txt",
                "bench/perf_analyzer_concurrency1000_queue_dominates.txt"):
        assert pipeline.analyze([os.path.join(DATA, rel)]).primary is Category.QUEUEING, rel
    d = pipeline.analyze([os.path.join(DATA, "bench/perf_analyzer_slow_compute_modest_concurrency.txt")])
    assert d.primary in (None, Category.GPU_COMPUTE, Category.CPU_PREPROCESSING)


def test_a_sample_between_two_steps_measures_no_batch() -> None:
    """No sequence limit stated, the KV cache nearly empty: a batch held at 2 while 12-14 wait is held by a limit.
    A stats line or scrape caught between two steps (0 running, 14 waiting) does not make it unsteady; a batch
    that really varies while requests wait (a token budget admitting long prompts a few at a time) still does."""
    held = _v1_stats_log((0, 14, 0.0), (2, 14, 0.8), (2, 12, 0.8))
    assert held.value("serving.running_when_queued_mean") == pytest.approx(4 / 3)
    assert held.value("serving.running_when_queued_busy_mean") == pytest.approx(2.0)
    f = _findings(held)["QUE002"]
    assert f.mechanism is Mechanism.ADMISSION_CAP and "stays at 2 or fewer" in f.message
    varying = _v1_stats_log((1, 14, 0.8), (4, 12, 2.0), (1, 13, 0.8), (2, 12, 1.0))
    assert _findings(varying)["QUE002"].mechanism is Mechanism.SATURATED_WORKERS
    # nothing ran at any sample: no batch was measured, so no limit is inferred from its size
    stalled = _v1_stats_log((0, 14, 0.0), (0, 14, 0.0), (0, 15, 0.0))
    assert "serving.running_when_queued_busy_mean" not in {e.key for e in stalled}
    assert _findings(stalled)["QUE002"].mechanism is not Mechanism.ADMISSION_CAP


def test_client_payload_io_leads_the_queue_it_inflates() -> None:
    findings, _ = run_rules(_evidence("bench/perf_client_http_send_recv_large_tensors.txt"), rules=MINE)
    ranked = [f.code for f in findings if f.severity is not Severity.INFO]
    assert ranked[0] == "CPU004" and ranked.index("QUE003") == 1
    top = findings[0]
    assert top.category is Category.CPU_PREPROCESSING and top.confidence is Confidence.MEASURED
    assert "3499.1 ms" in top.message and "77 %" in top.message
    assert any("shared memory" in step for fix in top.fixes for step in fix.steps)


@pytest.mark.parametrize(("share", "io_ms", "fires"), [(0.5, 2.0, True), (0.49, 2.0, False), (0.9, 0.5, False)])
def test_client_payload_io_bars(share: float, io_ms: float, fires: bool) -> None:
    ev = _set(latency__client_io__share=share, latency__client_io_ms__mean=io_ms)
    assert ("CPU004" in _findings(ev)) is fires


def _scrapes(text: str) -> EvidenceSet:
    src = PromSource()
    for line in clean_lines(text.splitlines(keepends=True)):
        src.feed(line)
    return EvidenceSet(src.evidence("metrics.txt"))


def test_a_scrape_between_two_steps_falls_back_on_the_windows_batch() -> None:
    """The engine lab's admission_cap scrapes (--max-num-seqs 2, 16 clients) as CI 2026-12-04 saw them: the
    first scrape fell between two steps (0 running, 14 waiting), the second found the queue gone. No scrape with
    requests waiting caught a batch; the window's generated tokens per engine step (9,690 in 4,897 steps) say
    the batch was 2 while requests spent most of their time queued: the sequence limit, not compute. Without the
    step counts nothing shows the batch, and no mechanism is named."""
    with open(os.path.join(DATA, "engines", "vllm", "admission_cap", "metrics.txt"), encoding="utf-8") as fh:
        real = fh.read()
    first, second = real.split("# scrape at")[1:]
    assert 'vllm:num_requests_running{engine="0",model_name="lab"} 2.0' in first
    caught = "# scrape at" + first.replace('num_requests_running{engine="0",model_name="lab"} 2.0',
                                           'num_requests_running{engine="0",model_name="lab"} 0.0')
    ev = _scrapes(caught + "# scrape at" + second)
    assert ev.value("serving.batch_step_mean") == pytest.approx(9690 / 4897)
    assert "serving.running_when_queued_busy_mean" not in {e.key for e in ev}
    assert ev.value("stage.queue.share") >= 0.3
    f = _findings(ev)["QUE002"]
    assert f.mechanism is Mechanism.ADMISSION_CAP, f.message
    assert "2.0 sequences per engine step" in f.message and "--max-num-seqs" in f.message
    blind = "".join(line for line in (caught + "# scrape at" + second).splitlines(keepends=True)
                    if "iteration_tokens" not in line)
    f = _findings(_scrapes(blind))["QUE002"]
    assert f.mechanism is None and "not known" in f.message
    # a window whose requests barely queued: the one scrape's queue was a burst, and the batch names no limit
    brief = _set(serving__waiting_max=14, serving__running_max=0, serving__stat_samples=2,
                 serving__queued_sample_ratio=0.5, serving__running_when_queued_mean=0,
                 serving__running_when_queued_max=0, serving__kv_cache_usage_when_queued_mean_ratio=0.002,
                 serving__batch_step_mean=2.0, stage__queue__share=0.05)
    assert _findings(brief)["QUE002"].mechanism is None
    # speculative decoding: a sequence yields 1 + its accepted drafts a step, and the drafts are taken off
    spec = "".join(part + (
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="lab"}} {n:.1f}\n')
        for part, n in ((caught, 0.0), ("# scrape at" + second, 4000.0)))
    assert _scrapes(spec).value("serving.batch_step_mean") == pytest.approx((9690 - 4000) / 4897)


def test_one_short_of_a_small_limit_is_the_limit() -> None:
    """The engine lab's attach window (tests/data/engines/stale_stats/admission_cap): its four stats lines read
    'Running: 1 reqs, Waiting: 13-14 reqs' at a stated max_num_seqs=2, the KV cache 0.4 % used. A line written
    after a step where a sequence finished reads one short of the limit: the log alone names the limit. Two
    short is not the limit, and a cache with no room for one more sequence is the cache's."""
    ev = _evidence("engines/stale_stats/admission_cap/attach/log-0-vllm.log")
    assert ev.value("serving.max_num_seqs") == 2 and ev.value("serving.running_when_queued_max") == 1
    f = _findings(ev)["QUE002"]
    assert f.mechanism is Mechanism.ADMISSION_CAP and "1 of max_num_seqs=2" in f.message
    base = {"serving__waiting_max": 14, "serving__running_max": 6, "serving__running_when_queued_mean": 6,
            "serving__running_when_queued_max": 6, "serving__running_when_queued_busy_mean": 6,
            "serving__kv_cache_usage_when_queued_mean_ratio": 0.2}
    assert _findings(_set(**base, serving__max_num_seqs=7))["QUE002"].mechanism is Mechanism.ADMISSION_CAP
    assert _findings(_set(**base, serving__max_num_seqs=8))["QUE002"].mechanism is not Mechanism.ADMISSION_CAP
    full = _set(**base, serving__max_num_seqs=7, serving__kv_free_sequences_when_queued_min=0.5)
    assert _findings(full)["QUE002"].mechanism is Mechanism.KV_CAPACITY


def test_the_window_batch_and_the_samples_keep_to_what_they_measured() -> None:
    """Where the window's batch is known it, not the one-short slack of the samples, says whether the limit was
    reached; the slack needs the KV cache's room and a sample with requests waiting; a window mean above the
    stated limit is no batch (a count the reader does not know inflated the tokens)."""
    queued = {"serving__waiting_max": 14, "serving__stat_samples": 4, "serving__queued_sample_ratio": 1.0,
              "stage__queue__share": 0.6}
    # a stated limit of 2, the samples at 1, the window's steps at 1.0: the limit was not reached
    low = _set(**queued, serving__running_max=1, serving__running_when_queued_mean=1,
               serving__running_when_queued_max=1, serving__running_when_queued_busy_mean=1,
               serving__max_num_seqs=2, serving__kv_cache_usage_when_queued_mean_ratio=0.01,
               serving__batch_step_mean=1.0)
    assert _findings(low)["QUE002"].mechanism is not Mechanism.ADMISSION_CAP
    # 9 of 10 with the cache 90 % used: no room said, so not the limit by the slack
    busy = _set(**queued, serving__running_max=9, serving__running_when_queued_mean=9,
                serving__running_when_queued_max=9, serving__running_when_queued_busy_mean=9,
                serving__max_num_seqs=10, serving__kv_cache_usage_when_queued_mean_ratio=0.9)
    assert _findings(busy)["QUE002"].mechanism is not Mechanism.ADMISSION_CAP
    # the samples with requests waiting read 0 running, one without them read 1: no batch seen while queued
    blind = _set(**queued, serving__running_max=1, serving__running_when_queued_mean=0,
                 serving__running_when_queued_max=0, serving__max_num_seqs=2,
                 serving__kv_cache_usage_when_queued_mean_ratio=0.0)
    assert _findings(blind)["QUE002"].mechanism is None
    # a window mean of 10 at a limit of 8 is no batch: the samples' 4 of 8 decide (not the limit)
    inflated = _set(**queued, serving__running_max=4, serving__running_when_queued_mean=4,
                    serving__running_when_queued_max=4, serving__running_when_queued_busy_mean=4,
                    serving__max_num_seqs=8, serving__kv_cache_usage_when_queued_mean_ratio=0.1,
                    serving__batch_step_mean=10.0)
    f = _findings(inflated)["QUE002"]
    assert f.mechanism is not Mechanism.ADMISSION_CAP and "10.0" not in f.message


def test_no_batch_seen_under_a_small_stated_limit_is_the_limit() -> None:
    """Every sample with requests waiting read 0 running while the engine generated tokens between them: each was
    written on a step where the whole batch finished. Under a small stated limit with the KV cache nearly empty
    that is a batch admitted and finished together at the limit; a large limit, a full cache, or an engine that
    generated nothing leave the mechanism unnamed."""
    base = {"serving__waiting_max": 14, "serving__stat_samples": 5, "serving__queued_sample_ratio": 1.0,
            "serving__running_max": 0, "serving__running_when_queued_mean": 0, "serving__running_when_queued_max": 0,
            "serving__vllm_v1": 1, "serving__max_num_seqs": 2, "serving__kv_cache_usage_when_queued_mean_ratio": 0.0,
            "serving__generation_tokens_per_s_min": 49.0}
    at = _findings(_set(**base))["QUE002"]
    assert at.mechanism is Mechanism.ADMISSION_CAP and "49 tokens/s" in at.message and "likely" in at.message
    for other in ({"serving__max_num_seqs": 17},  # a large limit: a whole batch finishing together is unlikely
                  {"serving__generation_tokens_per_s_min": 0.0},  # a line with no tokens: a stall, perhaps
                  {"serving__kv_cache_usage_when_queued_mean_ratio": 0.5},  # the cache's room not said
                  {"serving__queued_sample_ratio": 0.8},  # lines without a queue: their tokens say nothing here
                  {"serving__vllm_v1": 0},  # V0's lines are not written that way
                  {"serving__deferred_max": 3}):  # held for grammar compilation, remote KV or the LoRA budget
        assert _findings(_set(**{**base, **other}))["QUE002"].mechanism is None, other
    assert _findings(_set(**{**base, "serving__max_num_seqs": 16}))["QUE002"].mechanism is Mechanism.ADMISSION_CAP


def test_deferred_requests_are_read_from_v1_stats_lines() -> None:
    """vLLM V1 (0.32) prints 'Deferred: N reqs' after 'Waiting' when some of the waiting requests are held for
    something other than room (grammar compilation, remote KV, the LoRA budget): read, it keeps the lines that
    caught no batch from naming the sequence limit."""
    def log(deferred: str) -> EvidenceSet:  # every text source, as `diagnose analyze` reads a log
        lines = ["(APIServer pid=5755) INFO 12-05 17:06:29 [api_utils.py:286] non-default args: {'max_num_seqs': 2}"]
        lines += [f"(APIServer pid=5755) INFO 12-05 17:0{k}:41 [loggers.py:335] Engine 000: Avg prompt throughput: "
                  f"35.0 tokens/s, Avg generation throughput: 49.0 tokens/s, Running: 0 reqs, Waiting: 14 reqs, "
                  f"{deferred}CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%" for k in range(5)]
        return EvidenceSet(analyze_lines("vllm.log", lines).evidence)

    plain, held = log(""), log("Deferred: 3 reqs, ")
    assert "serving.deferred_max" not in {e.key for e in plain} and held.value("serving.deferred_max") == 3
    assert _findings(plain)["QUE002"].mechanism is Mechanism.ADMISSION_CAP
    assert _findings(held)["QUE002"].mechanism is None


def test_a_queue_caught_in_few_samples_stands_when_the_engine_evicted_requests_with_its_kv_cache_full() -> None:
    """The engine lab's KV pressure on vLLM 0.32 (CI 2026-12-06: no finding at all): the waiting gauge caught in 2
    of 7 samples, under the third that tells a standing queue from a burst, while the engine preempted 34 requests
    with its KV cache 97 % full where requests waited. Without the evictions it stays a passing burst."""
    base = dict(serving__waiting_max=10, serving__running_max=4, serving__waiting_mean=2.0,
                serving__queued_sample_ratio=2 / 7, serving__stat_samples=7, serving__queued_samples=2,
                serving__running_when_queued_mean=3.5, serving__running_when_queued_max=4,
                serving__kv_cache_usage_when_queued_max_ratio=0.968, serving__kv_cache_usage_when_queued_mean_ratio=0.9,
                serving__kv_cache_usage_max_ratio=0.968, serving__kv_free_sequences_when_queued_min=0.13,
                serving__max_num_seqs=256)
    got = _findings(_set(**base, serving__preemptions=34))
    assert "QUE002" in got and got["QUE002"].mechanism is Mechanism.KV_CAPACITY, got
    assert "QUE002" not in _findings(_set(**base))
    assert "QUE002" not in _findings(_set(**{**base, "serving__kv_cache_usage_when_queued_max_ratio": 0.5},
                                          serving__preemptions=34))


def test_a_few_waiting_count_only_behind_an_engine_that_keeps_preempting() -> None:
    """Under four waiting is arrival jitter, unless the engine preempted ten times or more in the window: its KV cache
    cannot hold the batch, and the few caught waiting wait for KV (the engine lab's CI scrape, tests/data/engines/
    few_waiting); a handful of preemptions does not make three waiting a queue."""
    base = dict(serving__waiting_max=3.0, serving__waiting_mean=1.5, serving__queued_sample_ratio=0.5,
                serving__stat_samples=2.0, serving__running_mean=2.0, serving__running_max=2.0,
                serving__kv_cache_usage_max_ratio=0.52)
    f = _findings(_set(**base, serving__preemptions=133.0)).get("QUE002")
    assert f is not None and f.mechanism is Mechanism.KV_CAPACITY and "133 requests were preempted" in f.message
    assert _findings(_set(**base, serving__preemptions=3.0)).get("QUE002") is None
    assert _findings(_set(**{**base, "serving__waiting_max": 0.0}, serving__preemptions=133.0)).get("QUE002") is None


def test_a_sweep_plateau_is_requests_waiting_for_capacity() -> None:
    """A load sweep whose throughput is flat past one load: the extra requests wait (Little's law: latency grows as
    the load while nothing more is served). From one in flight the server serves one at a time (the Triton tutorial's
    falcon7b: 23.2 → 23.8 infer/s at concurrency 1 → 4, 43 → 168 ms)."""
    lines = ["Concurrency: 1, throughput: 23.2174 infer/sec, latency 43041 usec",
             "Concurrency: 2, throughput: 23.3284 infer/sec, latency 85590 usec",
             "Concurrency: 3, throughput: 23.94 infer/sec, latency 125085 usec",
             "Concurrency: 4, throughput: 23.773 infer/sec, latency 167879 usec"]
    src = BenchSource()
    for line in lines:
        src.feed(line)
    ev = EvidenceSet(src.evidence("x"))
    assert ev.value("scaling.plateau_concurrency") == 1.0 and ev.value("scaling.plateau_span") == 4.0
    f = _findings(ev)["QUE011"]
    assert f.category is Category.QUEUEING and f.confidence is Confidence.CORRELATED
    assert "serves no more than one request at a time" in f.message and "dynamic_batching" in f.fixes[0].steps[0]
    # the same plateau untimed: heuristic, the waiting share from the load's growth alone
    f = _findings(_set(scaling__plateau_concurrency=8, scaling__plateau_span=4, scaling__plateau_throughput_gain=1.03))[
        "QUE011"]
    assert f.confidence is Confidence.HEURISTIC and abs(f.impact - 0.75) < 1e-9
    # more load served no more and waited no longer: the load never reached the server; a short span is no plateau
    found = _findings(_set(scaling__plateau_concurrency=8, scaling__plateau_span=4, scaling__plateau_throughput_gain=1,
                           scaling__plateau_latency_ratio=1.2))
    assert "QUE011" not in found
    assert "QUE011" not in _findings(_set(scaling__plateau_concurrency=8, scaling__plateau_span=2,
                                          scaling__plateau_throughput_gain=1))
    # plow#31: the throughput doubled up to 8 in flight, then flat; nothing measured the GPU: its own limit as likely
    # as a cap on requests, so the finding is thin and says what tells them apart
    rose = dict(scaling__plateau_concurrency=8, scaling__plateau_span=4, scaling__plateau_throughput_gain=1.03,
                scaling__plateau_latency_ratio=3.9, scaling__throughput__concurrency_ratio=1.95)
    f = _findings(_set(**rose))["QUE011"]
    assert f.confidence is Confidence.THIN and "the GPU's own limit" in f.message
    f = _findings(_set(**rose, gpu__util_ratio=0.55))["QUE011"]  # a GPU half idle at the plateau: a cap on requests
    assert f.confidence is Confidence.CORRELATED and "GPU's own limit" not in f.message
    # the rise up to the plateau, where the sweep gives it, outranks the overall gain over the plateau's (review: a
    # sweep that falls past its plateau hides the rise from that ratio)
    falls = {**rose, "scaling__throughput__concurrency_ratio": 1.0, "scaling__plateau_rise": 1.88}
    assert _findings(_set(**falls))["QUE011"].confidence is Confidence.THIN


def test_a_measured_sweep_that_still_scales_silences_a_title_about_concurrency() -> None:
    # ninfer-5060ti#14 "Max concurrency support": its table scales 2.68x at C=8, so the title's word is no queue
    d = pipeline.analyze([os.path.join(DATA, "timing", "sweep_scaling_healthy_concurrency_table.md")])
    assert not any(f.code == "QUE011" for f in d.findings)
    assert all(wording_only(f) for f in d.findings if f.code == "QUE005")  # its words may lean, never commit
    assert d.primary is None
    # ... but what the text states beside such a sweep still speaks: a queue time, preemptions (review of QUE005)
    text = ("vLLM requests wait in the queue for a long time, many preempted\n\n| Concurrency | Throughput (req/s) |\n"
            "|---|---|\n| 1 | 1.2 |\n| 4 | 4.1 |\n| 16 | 12.5 |\n\nWARNING 05-01 10:00:00 scheduler.py:1089] Sequence "
            "group cmpl-1 is preempted by PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
            "total_num_cumulative_preemption=51\nRequests wait about 8 seconds in the queue before they start.\n")
    d = pipeline.judge(EvidenceSet(analyze_lines("report.md", text.splitlines()).evidence))
    assert any(f.code == "QUE005" and not wording_only(f) for f in d.findings)
