"""torch.compile logs → compile.* evidence: recompiles, grouped guard failures, the limit, graph breaks."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.collectors.compile_log import CompileLogParser, classify_reason
from diagnose.collectors.logtext import clean_lines
from diagnose.derive.compile_log import CompileLogSource
from tests.conftest import DATA


def _source(name: str) -> CompileLogSource:
    src = CompileLogSource()
    with open(os.path.join(DATA, "compile_logs", name), encoding="utf-8") as fh:
        for line in clean_lines(fh.readlines()):
            src.feed(line)
    return src


def _ev(name: str) -> dict[str, object]:
    return {e.key: e.value for e in _source(name).evidence(name)}


def test_guard_reasons_in_every_form() -> None:
    assert classify_reason("tensor 'L['x']' size mismatch at index 0. expected 4, actual 8") == (
        "x", "size", 0, ("4", "8"))
    assert classify_reason("tensor 'x' dtype mismatch. expected Float, actual Half") == (
        "x", "dtype", None, ("Float", "Half"))
    assert classify_reason("L['x'].size()[1] == 128") == ("x", "size", 1, ("128",))
    assert classify_reason("Ne(L['x'].size()[0], 1)") == ("x", "size", 0, ("1",))
    assert classify_reason("L['n_tokens'] == 128") == ("n_tokens", "value", None, ("128",))
    assert classify_reason("len(L['args']) == 2") == ("args", "len", None, ("2",))
    assert classify_reason("___check_obj_id(L['self'].training, 7636)")[1] == "id"
    assert classify_reason("GLOBAL_STATE changed: grad_mode ")[1] == "global_state"


def test_glog_recompiles_with_limit() -> None:
    ev = _ev("recompiles_glog_batch_size_varies.txt")
    assert ev["compile.recompiles"] == 8  # compile id [0/8] on the limit line
    assert ev["compile.limit_hit"] == 1 and ev["compile.recompile_limit"] == 8
    reasons = ev["compile.recompile_reasons"]
    assert isinstance(reasons, list)
    top = reasons[0]
    assert (top["input"], top["kind"], top["dim"]) == ("x", "size", 1)
    assert top["count"] == 4 and "1536" in top["values"] and "128" in top["values"]
    assert any(r["input"] == "n_tokens" and r["kind"] == "value" for r in reasons)
    rate = ev["compile.recompile_rate_per_min"]
    assert isinstance(rate, float) and rate > 1.0


def test_old_format() -> None:
    ev = _ev("recompiles_torch2_1_old_format.txt")
    assert ev["compile.recompiles"] == 2 and ev["compile.limit_hit"] == 0
    kinds = {(r["input"], r["kind"]) for r in ev["compile.recompile_reasons"]}  # type: ignore[attr-defined]
    assert kinds == {("input_ids", "size"), ("input_ids", "dtype")}


def test_recompile_limit_exceeded_under_fullgraph() -> None:
    src = _source("recompile_limit_exceeded_fullgraph.txt")
    ev = {e.key: e for e in src.evidence("t")}
    assert ev["compile.limit_hit"].value == 1
    assert ev["compile.recompile_limit"].value == 8
    assert ev["compile.fullgraph_failure"].value == 1
    assert ev["compile.recompiles"].detail.startswith("at least")
    assert src.problems()


def test_graph_breaks_counted_once_each() -> None:
    ev = _ev("graph_breaks_only.txt")
    assert ev["compile.graph_breaks"] == 2
    assert "compile.recompiles" not in ev


def test_progress_counters_are_not_compile_ids() -> None:
    p = CompileLogParser()
    for line in ["[1/3] Building CXX object", "[2/3] Linking", "step [5/10] loss=0.3"]:
        p.feed(line)
    assert not p.matched()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.text(max_size=200),
    st.sampled_from(["Recompiling function forward in /a.py:1", "    triggered by the following guard failure(s):",
                     "    - 0/0: tensor 'L['x']' size mismatch at index 0. expected 4, actual",
                     "torch._dynamo hit config.recompile_limit (", "Graph break in user code at"])), max_size=40))
def test_fuzz_never_raises(lines: list[str]) -> None:
    src = CompileLogSource()
    for line in clean_lines(lines):
        src.feed(line)
    if src.matched():
        src.evidence("fuzz")
    src.problems()


def test_guards_that_failed_with_no_input_changed_are_their_own_reason() -> None:
    """dynamo's "Unexpected recompilation" (runtime guards failed, re-check passed): threads raced."""
    assert classify_reason("Unexpected recompilation: runtime guards failed even though they passed during "
                           "recompilation-reason analysis. Please open an issue with a minimal repro: "
                           "https://github.com/pytorch/pytorch")[1] == "spurious"
    ev = _ev("recompiles_concurrent_callers_torch2_13.txt")
    assert ev["compile.recompiles"] == 3
    reasons = ev["compile.recompile_reasons"]
    assert isinstance(reasons, list)
    by_kind = {r["kind"]: r for r in reasons}
    assert by_kind["spurious"]["count"] == 3 and "no input changed" in by_kind["spurious"]["summary"]
    assert by_kind["size"]["input"] == "x" and by_kind["size"]["count"] == 2


def test_vllms_jit_monitor_counts_kernels_compiled_while_serving() -> None:
    """Every compiler's line (Triton with and without its key, TileLang, CuTeDSL), the error mode's too; the access
    line and the words around the kernel's name are not a kernel."""
    src = _source("vllm_jit_monitor_during_inference.txt")
    assert src.matched()
    log = src._p.log
    assert log.jit_kernels == {"Triton _zero_kv_blocks_kernel": 1, "Triton _compute_slot_mapping_kernel": 2,
                               "Triton expand_kernel": 1, "TileLang mhc_pre_big_fuse_with_norm_tilelang": 1,
                               "CuTeDSL FlashAttentionForwardSm100": 1, "Triton fused_moe_kernel": 1}
    ev = _ev("vllm_jit_monitor_during_inference.txt")
    assert (ev["compile.jit_while_serving"], ev["compile.jit_kernels"], ev["compile.jit_errors"]) == (7, 6, 1)
    assert "compile.recompiles" not in ev  # a kernel's first compile is no torch.compile recompile


def test_a_person_naming_the_jit_monitors_warning_is_no_compile_and_one_error_is_one() -> None:
    src = CompileLogSource()
    src.feed("After applying it there are no more `Triton kernel JIT compilation during inference: _topk_topp_kernel` "
             "warnings in our logs")
    assert not src.matched()
    for who in ("EngineCore pid=2308056", "APIServer pid=2307001"):  # the error, then the API server relaying it
        src.feed(f"({who}) ERROR 06-19 16:28:19 [core.py:1231] RuntimeError: Triton kernel JIT compilation during "
                 "inference: 'fused_moe_kernel' ...")
    src.feed("WARNING 06-19 16:30:00 [jit_monitor.py:124] CuTeDSL JIT compilation during inference: "
             "FlashAttnFwd::run<128>. This causes a latency spike; consider extending warmup to cover this "
             "shape/config.")
    assert src._p.log.jit_kernels == {"Triton fused_moe_kernel": 1, "CuTeDSL FlashAttnFwd::run<128>": 1}
    ev = {e.key: e.value for e in src.evidence("x")}
    assert (ev["compile.jit_while_serving"], ev["compile.jit_errors"]) == (2, 1)


def test_tensorflow_retracing_warning_wrapped_or_not() -> None:
    # megnet#161: wrapped before "0x7f…> triggered"; hls4ml#359: one line, 11 of the last 11 calls
    ev = _ev("tf_retracing_wrapped_megnet.txt")
    assert ev["compile.recompiles"] == 5 and ev["compile.framework"] == "tensorflow"
    ev = _ev("tf_retracing_predict_hls4ml.txt")
    assert ev["compile.recompiles"] == 11
    src = _source("tf_retracing_predict_hls4ml.txt")
    assert "Model.make_predict_function" in next(e.detail for e in src.evidence("x") if e.key == "compile.recompiles")
    # overlapping windows are not summed; a bound method counts; a head whose "triggered" never comes does not
    p = CompileLogParser()
    for line in ["W0101 tensorflow:5 out of the last 6 calls to <bound method GPT2CausalLM.generate_step of <x>> "
                 "triggered tf.function retracing. Tracing is expensive",
                 "WARNING:tensorflow:6 out of the last 7 calls to <function f at 0x1> triggered tf.function retracing.",
                 "5 out of the last 5 calls to <function g at 0x2>", "unrelated", "more", "and", "more", "lines",
                 "here", "triggered tf.function retracing"]:
        p.feed(line)
    assert p.log.tf_retrace_warnings == 2 and p.log.tf_retraces == 6 and p.log.tf_retrace_window == 7
    assert set(p.log.tf_functions) == {"GPT2CausalLM.generate_step", "f"}


def test_tensorflow_retracing_names_tensorflow_fixes() -> None:
    from diagnose.model import EvidenceSet
    from diagnose.rules.engine import run_rules
    from diagnose.rules.shapes import RecompilesFromLog

    findings, _ = run_rules(EvidenceSet(_source("tf_retracing_predict_hls4ml.txt").evidence("x")),
                            rules=(RecompilesFromLog,))
    (f,) = findings
    assert f.title == "tf.function retraces repeatedly" and "torch" not in f.message
    assert "11 of the last 11 calls" in f.message
    assert any("reduce_retracing=True" in s for fx in f.fixes for s in fx.steps)


def test_tftrt_engines_built_while_serving() -> None:
    """tensorflow/tensorrt#168: tensorflow_model_server's log of TF-TRT building an engine per TRTEngineOp at run
    time; an op built again for a new input shape is a rebuild; a person naming the message is not a record."""
    from diagnose.model import EvidenceSet
    from diagnose.rules.engine import run_rules
    from diagnose.rules.shapes import RecompilesFromLog

    src = _source("tftrt_engine_builds_serving.txt")
    ev = {e.key: e.value for e in src.evidence("x")}
    n = ev["compile.recompiles"]
    assert isinstance(n, int | float) and n >= 5 and ev["compile.framework"] == "tf-trt"
    assert ev["compile.engine_rebuilds"] == 0
    (f,) = run_rules(EvidenceSet(src.evidence("x")), rules=(RecompilesFromLog,))[0]
    assert f.title == "TF-TRT builds TensorRT engines at run time" and "torch" not in f.message
    assert any("converter.build(input_fn=...)" in s for fx in f.fixes for s in fx.steps)
    p = CompileLogParser()
    for shape in ("[[1,224,224,3]]", "[[8,224,224,3]]", "[[8,224,224,3]]"):
        p.feed(f"2020-01-07 07:47:05.815747: I tensorflow/compiler/tf2tensorrt/kernels/trt_engine_op.cc:632] Building "
               f"a new TensorRT engine for TRTEngineOp_0 input shapes: {shape}")
    p.feed("tensorflow_model_server always prints 'Building a new TensorRT engine', instead of serving")
    assert p.log.tftrt_builds == 3 and p.log.tftrt_ops == {"TRTEngineOp_0": {"[[1,224,224,3]]", "[[8,224,224,3]]"}}
    # the op under a function's scope is the same op; TF 1.x names its batch size; an op of many inputs
    p = CompileLogParser()
    p.feed("Building a new TensorRT engine for TRTEngineOp_0_0 with input shapes: [[1,3]]")
    p.feed("Building a new TensorRT engine for StatefulPartitionedCall/TRTEngineOp_0_0 with input shapes: [[2,3]]")
    p.feed("I0101 trt_engine_op.cc:367] Building a new TensorRT engine for my_trt_op_0 with batch size 8")
    p.feed("Building a new TensorRT engine for TRTEngineOp_1 input shapes: [" + ",".join(["[1,2]"] * 20) + "]")
    assert p.log.tftrt_builds == 4 and p.log.tftrt_ops["TRTEngineOp_0_0"] == {"[[1,3]]", "[[2,3]]"}
    assert p.log.tftrt_ops["my_trt_op_0"] == {"batch8"}


def test_tensorflow_retracing_read_however_a_paste_wraps_it_and_not_from_prose() -> None:
    """A reviewer's repros: the hls4ml#359 warning folded at any width (inside words too) is read with its counts;
    a person's sentence quoting the warning is not a record of it; five traces in 2,012 calls are no storm."""
    from diagnose.model import EvidenceSet
    from diagnose.rules.engine import run_rules
    from diagnose.rules.shapes import RecompilesFromLog

    with open(os.path.join(DATA, "compile_logs", "tf_retracing_predict_hls4ml.txt"), encoding="utf-8") as fh:
        text = fh.read().strip()
    for width in (40, 60, 70, 80, 90, 120, 140, 150):
        p = CompileLogParser()
        for line in clean_lines([text[i:i + width] for i in range(0, len(text), width)]):
            p.feed(line)
        assert (p.log.tf_retrace_warnings, p.log.tf_retraces, p.log.tf_retrace_window) == (1, 11, 11), width
        assert set(p.log.tf_functions) == {"Model.make_predict_function"}, width
    p = CompileLogParser()
    p.feed('Fixed: after moving model construction out of the request handler, the "5 out of the last 5 calls to '
           '<function Model.make_predict_function.<locals>.predict_function> triggered tf.function retracing" warning '
           "no longer appears.")
    assert p.log.tf_retrace_warnings == 0
    p = CompileLogParser()
    p.feed("WARNING:tensorflow:5 out of the last 2012 calls to <function Model.make_predict_function.<locals>."
           "predict_function at 0x7f> triggered tf.function retracing. Tracing is expensive")
    src = CompileLogSource()
    src._p = p
    # TensorFlow warns only when five of its ten latest calls traced, whatever window it names (a second reviewer's
    # reading of its counter): "5 out of the last 2012" is frequent retracing too
    assert [f.code for f in run_rules(EvidenceSet(src.evidence("x")), rules=(RecompilesFromLog,))[0]] == ["CMP002"]
    # a person's sentence naming tensorflow before the quote is still a person's
    p = CompileLogParser()
    p.feed('After upgrading tensorflow the "5 out of the last 5 calls to <function f at 0x1> triggered tf.function '
           'retracing" warning no longer appears.')
    assert p.log.tf_retrace_warnings == 0
    # an allocator's "ran out of memory" two lines before a wrapped warning does not lose it
    p = CompileLogParser()
    for line in ["W tensorflow/core/common_runtime/bfc_allocator.cc:245] Allocator ran out of memory trying to "
                 "allocate", "2.1GiB with freed_by_count=0.",
                 "WARNING:tensorflow:6 out of the last 6 calls to <function",
                 "predict_function at 0x7f> triggered tf.function", "retracing. Tracing is expensive"]:
        p.feed(line)
    assert (p.log.tf_retrace_warnings, p.log.tf_retraces) == (1, 6)
