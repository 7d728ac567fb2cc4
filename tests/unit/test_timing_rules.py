"""Compile logs and timing samples end to end: recompilation, engine rebuilds, prefill, stage shares."""

from __future__ import annotations

import io
import os

import pytest

from diagnose import loose
from diagnose.derive.compile_log import CompileLogSource
from diagnose.model import Category, Evidence, EvidenceSet, Finding, Severity
from diagnose.rules import stages
from diagnose.rules.engine import run_rules
from diagnose.rules.registry import RULES
from tests.conftest import DATA

ALL_RULES = RULES if any(r.code == "STG001" for r in RULES) else (*RULES, *stages.RULES)


def _findings(folder: str, name: str) -> list[Finding]:
    res = loose.analyze_path(os.path.join(DATA, folder, name))
    findings, _ = run_rules(EvidenceSet(res.evidence), rules=ALL_RULES)
    return [f for f in findings if f.severity is not Severity.INFO]


@pytest.mark.parametrize(("folder", "name", "code", "category"), [
    ("compile_logs", "recompile_limit_exceeded_fullgraph.txt", "CMP002", Category.RECOMPILATION),
    ("compile_logs", "recompiles_glog_batch_size_varies.txt", "CMP002", Category.RECOMPILATION),
    ("timing", "trt_rebuild_on_new_shape_extreme.txt", "CMP003", Category.RECOMPILATION),
    ("timing", "trt_rebuild_every_growing_step.txt", "CMP003", Category.RECOMPILATION),
    ("timing", "ttft_stage_table_prefill_89pct.md", "TTF001", Category.PREFILL_TTFT),
    ("timing", "queue_vs_prompt_length_table.md", "TTF001", Category.PREFILL_TTFT),
    ("timing", "long_context_ttft_prose.txt", "TTF001", Category.PREFILL_TTFT),
    ("timing", "spans_queue_prefill_decode.txt", "TTF001", Category.PREFILL_TTFT),
    ("timing", "fps_table_pil_preprocess_vs_gpu_kernel.md", "STG001", Category.CPU_PREPROCESSING),
    ("timing", "stage_log_preprocess_dominates.jsonl", "STG001", Category.CPU_PREPROCESSING),
])
def test_primary(folder: str, name: str, code: str, category: Category) -> None:
    findings = _findings(folder, name)
    assert findings and findings[0].code == code, [(f.code, f.message) for f in findings]
    assert findings[0].category is category


@pytest.mark.parametrize(("folder", "name"), [
    ("compile_logs", "recompiles_torch2_1_old_format.txt"),  # two recompiles: warm-up, not a storm
    ("compile_logs", "graph_breaks_only.txt"),
    ("timing", "stage_log_llm_healthy.jsonl"),
    ("timing", "ttft_vs_client_concurrency_table.md"),
])
def test_nothing_significant(folder: str, name: str) -> None:
    assert _findings(folder, name) == []


def test_recompile_message_names_the_varying_dimension() -> None:
    f = _findings("compile_logs", "recompiles_glog_batch_size_varies.txt")[0]
    assert "x size at dim 1" in f.message and "recompile limit (8) was hit" in f.message
    assert any("torch._dynamo.mark_dynamic(x, 1)" in s for fx in f.fixes for s in fx.steps)
    assert not any("one thread" in fx.summary for fx in f.fixes)  # every failure there names a changed input


def test_recompiles_with_no_changed_input_say_serialise_the_callers_first() -> None:
    f = _findings("compile_logs", "recompiles_concurrent_callers_torch2_13.txt")[0]
    assert f.code == "CMP002" and "3 guard failure(s) had no changed input" in f.message
    assert f.fixes[0].summary == "Call the compiled model from one thread at a time"
    assert any("mark_dynamic(x, 0)" in s for s in f.fixes[1].steps)


def test_fullgraph_limit_is_a_hard_failure() -> None:
    f = _findings("compile_logs", "recompile_limit_exceeded_fullgraph.txt")[0]
    assert f.severity is Severity.CRITICAL and "hard failure" in f.message and "at least 8" in f.message


def test_rebuild_messages() -> None:
    f = _findings("timing", "trt_rebuild_on_new_shape_extreme.txt")[0]
    assert "100 % of the spikes" in f.message and "trt_profile_min_shapes" in " ".join(f.fixes[0].steps)
    thin = _findings("timing", "trt_rebuild_every_growing_step.txt")[0]
    assert thin.confidence.value == "thin" and "no call on an already-seen shape" in thin.message


def test_preprocess_lower_bound_is_said() -> None:
    f = _findings("timing", "fps_table_pil_preprocess_vs_gpu_kernel.md")[0]
    assert "at least 24 %" in f.message and "13.11 → 10.02 ms" in f.message


def test_prefill_scaling_message() -> None:
    f = _findings("timing", "queue_vs_prompt_length_table.md")[0]
    assert "with long prompts" in f.message and "461 ms" in f.message


def _ttft(**values: object) -> Finding | None:
    ev = EvidenceSet(Evidence(k.replace("__", "."), v, "", "test") for k, v in values.items())
    findings, _ = run_rules(ev, rules=RULES)
    return next((f for f in findings if f.code == "TTF001"), None)


def test_a_long_prefill_is_judged_against_the_model_and_the_gpu() -> None:
    # 16K tokens through 70B on an A6000 is 2.2 PFLOP: 14 s at the card's full 155 TFLOP/s, so 15 s is compute
    f = _ttft(tokens__input_mean=16000, latency__ttft_ms__mean=15000, model__params=70e9, gpu__name="A6000")
    assert f is not None and "2.24 PFLOP: 14.45 s on an A6000" in f.message and "compute is the time" in f.message
    # 4K tokens through 8B on an H100 needs ~0.16 s: a 3 s TTFT is a slow prefill, not a long one
    f = _ttft(tokens__input_mean=4000, latency__ttft_ms__mean=3000, model__params=8e9,
              gpu__name="NVIDIA H100 80GB HBM3")
    assert f is not None and "19× slower than an 8B-parameter model prefills on an H100" in f.message
    assert "attention backend" in f.message


def test_a_long_prefill_without_model_or_gpu_says_it_cannot_judge_the_rate() -> None:
    f = _ttft(tokens__input_mean=6000, latency__ttft_ms__mean=4000)
    assert f is not None and "cannot be judged" in f.message and f.impact < 0.5
    f = _ttft(tokens__input_mean=6000, latency__ttft_ms__mean=4000, model__params=7e9)
    assert f is not None and "21 TFLOP/s of useful work" in f.message
    assert _ttft(tokens__input_mean=500, latency__ttft_ms__mean=4000) is None  # short prompts: not a prefill story


def test_a_benchmark_that_queues_its_requests_is_no_prefill_story() -> None:
    """A serving benchmark's TTFT of long prompts is the prefill only when no request waited for another: not when
    it sent every request at once (vllm-project/vllm#18136: 50 × 25,000 tokens at ``--request-rate inf``, "8 prompt
    tokens/s"), offered more than it served (vllm#12568: 4 requests/s against 2.11) or kept hundreds in flight
    (sgl-project/sglang#8285: 330). Each was committed as prefill-bound "with no request queue in evidence"."""
    base = dict(tokens__input_mean=25000, latency__ttft_ms__mean=2_945_425.0, requests__count=50)
    assert _ttft(**base) is not None
    assert _ttft(**base, bench__burst=1) is None
    assert _ttft(**base, bench__offered_rps=4.0, throughput__rps=2.11) is None
    assert _ttft(**base, bench__offered_rps=4.0, throughput__rps=3.9) is not None  # served what it was offered
    assert _ttft(**base, bench__concurrency=330, throughput__rps=11.91, latency__e2e_ms__mean=26530.0) is None
    assert _ttft(**base, bench__concurrency=1) is not None  # one at a time: nothing waits
    for name in ("vllm_bench_serve_burst_long_prompts.txt", "vllm_bench_serving_rate4_above_throughput.txt",
                 "sglang_bench_serving_concurrency_330.txt"):
        assert not [f for f in _findings("logs", name) if f.code == "TTF001"], name


def test_an_open_loop_benchmark_offered_above_its_throughput_is_queueing() -> None:
    """vLLM's ``benchmark_serving --request-rate 4`` against a server that completed 2.11 requests/s (vllm#12568): the
    backlog grew ~1.9 requests a second while it sent (473 of the 1000 waiting as the last was sent), and the 100 s
    mean TTFT is that queue (QUE006). Not with a
    concurrency cap (the client holds the excess), nor when it served what it was offered."""
    (f,) = [x for x in _findings("logs", "vllm_bench_serving_rate4_above_throughput.txt") if x.code == "QUE006"]
    assert f.category is Category.QUEUEING and f.severity is Severity.MAJOR
    assert "offered 4 requests/s and the server completed 2.11" in f.message
    assert "about 473 of its 1,000 requests waiting when the last was sent" in f.message
    assert "100.6 s is the backlog" in f.message

    def que6(**values: object) -> bool:
        ev = EvidenceSet(Evidence(k.replace("__", "."), v, "", "test") for k, v in values.items())
        return any(x.code == "QUE006" for x in run_rules(ev, rules=RULES)[0])

    assert que6(bench__offered_rps=4.0, throughput__rps=2.11, requests__count=1000)
    assert not que6(bench__offered_rps=4.0, throughput__rps=2.11, requests__count=1000, bench__concurrency=64)
    assert not que6(bench__offered_rps=4.0, throughput__rps=3.8, requests__count=1000)
    assert not que6(bench__offered_rps=4.0, throughput__rps=2.11, requests__count=10)  # a ramp, not a run
    # vLLM 0.6-0.8 state the cap on the line before the block: the client held the excess itself
    with open(os.path.join(DATA, "logs", "vllm_bench_serving_rate4_above_throughput.txt"), encoding="utf-8") as fh:
        capped = fh.read().replace("Maximum request concurrency: None", "Maximum request concurrency: 8")
    ev = EvidenceSet(loose.analyze_stream("p", io.BufferedReader(io.BytesIO(capped.encode()))).evidence)
    assert ev.value("bench.concurrency") == 8
    assert not any(x.code == "QUE006" for x in run_rules(ev, rules=RULES)[0])


def test_prefill_fixes_follow_the_vllm_generation() -> None:
    base = dict(tokens__input_mean=16000, latency__ttft_ms__mean=15000)
    v1 = _ttft(**base, serving__vllm_v1=1)
    v0 = _ttft(**base, serving__vllm_v1=0)
    assert v1 is not None and v0 is not None
    v1_steps = " ".join(s for fx in v1.fixes for s in fx.steps)
    v0_steps = " ".join(s for fx in v0.fixes for s in fx.steps)
    assert "--enable-chunked-prefill" not in v1_steps and "--enable-prefix-caching" not in v1_steps
    assert "chunks prefills by default" in v1_steps and "larger favours time to first token" in v1_steps
    assert "--enable-chunked-prefill" in v0_steps and "--enable-prefix-caching" in v0_steps


@pytest.mark.parametrize(("line", "post_ms"), [
    # ultralytics YOLOv8/11 and YOLOv5 (pre-process, NMS) print one such line per run
    ("Speed: 11.4ms preprocess, 62.3ms inference, 2442.7ms postprocess per image at shape (1, 3, 192, 320)", 2442.7),
    ("Speed: 0.6ms pre-process, 7.1ms inference, 310.2ms NMS per image at shape (1, 3, 640, 640)", 310.2),
])
def test_a_stage_list_with_times_first_is_read_and_post_processing_judged(line: str, post_ms: float) -> None:
    res = loose.read_text("x", io.BytesIO(line.encode() + b"\n"))
    ev = EvidenceSet(res.evidence)
    assert ev.value("stage.postprocess_ms.mean") == post_ms and ev.value("stage.compute_ms.mean") is not None
    findings, _ = run_rules(ev, rules=RULES)
    f = findings[0]
    assert f.code == "STG001" and f.category is Category.CPU_PREPROCESSING
    assert f.title == "Post-processing is a large share of latency" and "NMS" in f.fixes[0].steps[0]


def test_a_stage_list_of_fields_is_a_breakdown() -> None:
    """Two or more stage fields on a line, each a time by its unit or its key, are a program's breakdown; with no unit
    anywhere (a TensorRT demo's "preprocess time = 7.47456; infer time = 1213.42; …": milliseconds, or seconds in
    another program) only the stages' shares of their sum are used, and the input says so."""
    res = loose.read_text("x", io.BytesIO(b"pre-process: 9.67ms, inference: 1.0ms, post-process: 0.29ms\n"))
    ev = EvidenceSet(res.evidence)
    assert ev.value("stage.preprocess_ms.mean") == pytest.approx(9.67)
    assert ev.value("stage.preprocess.share") == pytest.approx(9.67 / 10.96, abs=1e-3)
    line = b"[05/24/2024-15:02:09] [I] preprocess time = 7.47456; infer time = 1213.42; postprocess time = 3.12787\n"
    res = loose.read_text("x", io.BytesIO(line))
    ev = EvidenceSet(res.evidence)
    assert ev.value("stage.compute.share") == pytest.approx(1213.42 / (7.47456 + 1213.42 + 3.12787), abs=1e-4)
    assert ev.value("stage.preprocess_ms.mean") is None and ev.value("stage.compute_ms.mean") is None
    assert any("only their shares" in (i.reason or "") for i in res.inputs), res.inputs


@pytest.mark.parametrize("text", [
    "Our benchmark config is prefill: 2048, decode: 128 tokens per request",  # token counts, not times
    "prefill=8192, decode=256",
    "queue: 12, prefill: 3, decode: 40",  # requests in each state
])
def test_counts_beside_stage_names_are_no_times(text: str) -> None:
    ev = EvidenceSet(loose.read_text("x", io.BytesIO(text.encode() + b"\n")).evidence)
    assert not [e.key for e in ev if e.key.startswith("stage.")], sorted(ev.keys())


def test_one_stage_field_is_no_breakdown() -> None:
    res = loose.read_text("x", io.BytesIO(b"preprocess time = 7.47\n"))
    assert EvidenceSet(res.evidence).value("stage.preprocess_ms.mean") is None


def test_one_stage_word_after_a_time_is_prose_not_a_breakdown() -> None:
    res = loose.read_text("x", io.BytesIO(b"it takes 300ms inference on my laptop\n"))
    assert EvidenceSet(res.evidence).value("stage.compute_ms.mean") is None


def test_kernels_compiled_while_serving_are_recompilation_and_an_error_is_critical() -> None:
    f = _findings("compile_logs", "vllm_jit_monitor_during_inference.txt")[0]
    assert (f.code, f.category, f.severity) == ("CMP005", Category.RECOMPILATION, Severity.CRITICAL)
    assert "6 kernel(s)" in f.message and "Triton _compute_slot_mapping_kernel ×2" in f.message
    assert "1 of them were raised as errors" in f.message
    one = "(EngineCore) WARNING 05-18 19:12:28 [jit_monitor.py:103] Triton kernel JIT compilation during " \
          "inference: expand_kernel. This causes a latency spike; consider extending warmup to cover this shape/config."
    src = CompileLogSource()
    src.feed(one)
    got = [f for f in run_rules(EvidenceSet(src.evidence("x")), rules=ALL_RULES)[0] if f.code == "CMP005"]
    assert got and got[0].severity is Severity.MAJOR and got[0].impact == pytest.approx(0.4)


def test_kernels_compiled_while_serving_never_outrank_a_measured_queue() -> None:
    """A vLLM log whose stats lines show a queue, with six kernels compiled while serving: the queue leads."""
    with open(os.path.join(DATA, "logs", "vllm_v0_preemption_recompute.txt"), encoding="utf-8") as fh:
        log = fh.read()
    with open(os.path.join(DATA, "compile_logs", "vllm_jit_monitor_during_inference.txt"), encoding="utf-8") as fh:
        jit = [ln for ln in fh.read().splitlines() if "WARNING" in ln]
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO((log + "\n".join(jit) + "\n").encode())))  # type: ignore[arg-type]
    findings, _ = run_rules(EvidenceSet(res.evidence), rules=ALL_RULES)
    codes = [f.code for f in findings if f.severity is not Severity.INFO]
    cmp5 = next(f for f in findings if f.code == "CMP005")
    assert cmp5.severity is Severity.MAJOR and "5 kernel(s)" in cmp5.message
    assert codes[0].startswith("QUE") and codes.index("CMP005") > 0, codes


def test_a_prompt_sweep_whose_ttft_grows_with_the_prompt_is_prefill_bound() -> None:
    """atlas#969's sweep (tests/unit/test_timing.py): TTF001 names the prefill from the fitted line, measured; the
    same table with a fixed 9-second cost under it (a queue or a load) is no prefill finding."""
    from tests.unit.test_timing import PROMPT_SWEEP

    def findings(text: str) -> list[Finding]:
        res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
        return run_rules(EvidenceSet(res.evidence), rules=RULES)[0]

    (f,) = [x for x in findings(PROMPT_SWEEP) if x.code == "TTF001"]
    assert f.category is Category.PREFILL_TTFT and f.impact > 0.85
    assert "grows in proportion to the prompt" in f.message and "385 prompt tokens a second" in f.message
    fixed = PROMPT_SWEEP
    for old, new in (("1.170", "10.170"), ("1.735", "10.735"), ("2.996", "11.996"), ("5.574", "14.574"),
                     ("10.872", "19.872"), ("21.745", "30.745")):
        fixed = fixed.replace(old, new)
    assert not [x for x in findings(fixed) if x.code == "TTF001"]


def test_a_prompt_sweep_under_concurrent_load_is_no_prefill_finding() -> None:
    """A review's repros: the same sweep run with 64 clients in flight (stated, or a load generator's
    --max-concurrency / --request-rate inf): each TTFT holds the others' prefills, a queue."""
    from tests.unit.test_timing import PROMPT_SWEEP

    def codes(text: str) -> set[str]:
        res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
        return {f.code for f in run_rules(EvidenceSet(res.evidence), rules=RULES)[0]}

    for before in ("Benchmark with 64 concurrent clients.", "$ python bench.py --max-concurrency 64 --num-prompts 640",
                   "$ vllm bench serve --request-rate inf --num-prompts 1000"):
        assert "TTF001" not in codes(before + "\n" + PROMPT_SWEEP), before


def test_a_serial_sweep_capped_at_one_in_flight_stays_a_prefill_sweep() -> None:
    """A second review's repro: "--request-rate inf --max-concurrency 1" runs the prompts one at a time."""
    from tests.unit.test_timing import PROMPT_SWEEP

    text = "$ python benchmarks/benchmark_serving.py --request-rate inf --max-concurrency 1\n" + PROMPT_SWEEP
    res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    assert "TTF001" in {f.code for f in run_rules(EvidenceSet(res.evidence), rules=RULES)[0]}
