"""Recompilation seen in logs: torch.compile recompiles and engine rebuilds on new input shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Risk, Severity
from diagnose.rules import advice
from diagnose.rules.base import Rule, bar, fmt_ms, present, severity_for
from diagnose.units import pct


def _reasons(ev: EvidenceSet) -> list[dict[str, Any]]:
    got = ev.get("compile.recompile_reasons")
    if isinstance(got, Evidence) and isinstance(got.value, list):
        return [r for r in got.value if isinstance(r, dict)]
    return []


class RecompilesFromLog(Rule):
    """torch.compile keeps recompiling: the log says how often and which guard fails.

    What it detects: ``TORCH_LOGS=recompiles`` records (``Recompiling function … triggered by the
    following guard failure(s)``), compile ids ``[frame/compile]``, and the recompile limit being hit
    (``hit config.recompile_limit (8)``, ``Dynamo recompile limit exceeded``), after which the
    function silently runs eager, or fails outright under ``fullgraph=True``.
    TensorFlow's retracing warning (``5 out of the last 5 calls to <function …> triggered tf.function
    retracing``) is the same fault in tf.function: ``compile.framework`` = tensorflow gives its own message
    and fixes (trace once, an input signature or ``reduce_retracing``). TensorFlow warns only when five or
    more of its ten most recent calls traced, whatever the window it names ("5 out of the last 2012").
    TF-TRT's ``Building a new TensorRT engine for TRTEngineOp_N input shapes: [[…]]`` records
    (``compile.framework`` = tf-trt) are engines built while the graph serves: its own message and
    fixes (build them at conversion over every served shape, ``maximum_cached_engines``).

    Why it matters: every recompile blocks the request that triggered it for seconds; past the
    limit the model loses its compiled speed without a word, or (fullgraph) the service crashes or
    hangs. Each compiled variant also holds its own code and, with CUDA graphs, its own memory pool.

    How it decides: the recompile limit was hit (``compile.limit_hit`` = 1), or
    ``compile.recompiles`` is at least ``min_recompiles``. The guard failures are grouped by input
    and dimension (``compile.recompile_reasons``) to name what varies.

    Evidence: compile.recompiles or compile.limit_hit; optionally compile.recompile_reasons,
    compile.recompile_limit, compile.fullgraph_failure, compile.recompile_rate_per_min,
    compile.graph_breaks, compile.framework, compile.engine_rebuilds.

    Fix: mark the varying dimension dynamic (``torch._dynamo.mark_dynamic(x, dim)``) or compile with
    ``dynamic=True``; pad/bucket inputs to a few sizes and warm each up; only then consider raising
    ``torch._dynamo.config.recompile_limit`` (each extra variant costs compile time and memory).
    Guard failures dynamo calls "Unexpected recompilation" (they failed at run time and passed when
    re-checked: no input changed) come from several threads calling one compiled function at once:
    call it from one thread (a model thread, or a lock) first.

    False positives: a handful of recompiles during warm-up (automatic dynamic shapes recompile once
    per newly varying dimension), hence ``min_recompiles``.
    """

    code = "CMP002"
    name = "recompiles-from-log"
    category = Category.RECOMPILATION
    requires = ()
    requires_any = (("compile.recompiles",), ("compile.limit_hit",))
    optional = (
        "compile.recompiles", "compile.limit_hit", "compile.recompile_reasons", "compile.recompile_limit",
        "compile.fullgraph_failure", "compile.recompile_rate_per_min", "compile.graph_breaks", "compile.framework",
        "compile.engine_rebuilds",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_recompiles: float = 3  # automatic dynamic shapes recompile once per varying dim; 3+ is a pattern
        storm_rate_per_min: float = 2.0  # recompiling more than twice a minute in steady state is a storm

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        n = ev.value("compile.recompiles", 0.0) or 0.0
        limit_hit = (ev.value("compile.limit_hit", 0.0) or 0.0) > 0
        if not limit_hit and n < t.min_recompiles:
            return None
        framework = ev.get("compile.framework")
        if isinstance(framework, Evidence) and framework.value == "tensorflow":
            return self._retracing(ev, n)
        if isinstance(framework, Evidence) and framework.value == "tf-trt":
            return self._tftrt(ev, n)
        limit = ev.value("compile.recompile_limit")
        hard = (ev.value("compile.fullgraph_failure", 0.0) or 0.0) > 0
        rate = ev.value("compile.recompile_rate_per_min")
        reasons = _reasons(ev)
        n_ev = ev.get("compile.recompiles")
        at_least = isinstance(n_ev, Evidence) and n_ev.detail.startswith("at least")
        parts = []
        if n:
            parts.append(f"torch.compile recompiled {'at least ' if at_least else ''}{n:.0f} time(s)"
                         + (f" ({rate:.1f} per minute)" if rate is not None else "") + ".")
        if reasons:
            top = "; ".join(str(r.get("summary", "")) for r in reasons[:3])
            parts.append(f"Guard failures, most frequent first: {top}.")
        if limit_hit:
            lim = f" ({limit:.0f})" if limit is not None else ""
            parts.append(f"The recompile limit{lim} was hit: "
                         + ("under fullgraph=True that is a hard failure (the request errors or the worker hangs)."
                            if hard else "the function now runs eagerly, without its compiled speed-up, silently."))
        dyn = "torch._dynamo.mark_dynamic(x, 0)"
        size_reason = next((r for r in reasons if r.get("kind") in ("size", "stride") and r.get("dim") is not None),
                           None)
        if size_reason is not None:
            dyn = f"torch._dynamo.mark_dynamic({size_reason.get('input')}, {size_reason.get('dim')})"
        value_reason = next((r for r in reasons if r.get("kind") == "value"), None)
        spurious = next((r for r in reasons if r.get("kind") == "spurious"), None)
        steps = [f"Mark the varying dimension dynamic before the first call: {dyn}",
                 "Or compile with torch.compile(model, dynamic=True)"]
        if value_reason is not None:
            steps.append(f"{value_reason.get('input')} is a Python scalar that changes: pass it as a tensor, or "
                         "keep it constant")
        serialise = []
        if spurious is not None:
            parts.append(f"{spurious.get('count')} guard failure(s) had no changed input: the guards failed at run "
                         "time and passed when dynamo re-checked them, the mark of several threads calling one "
                         "compiled function at once (reproduced on torch 2.13 with 8 threads).")
            serialise = [Fix("Call the compiled model from one thread at a time",
                             ("One model thread fed by a queue, or a lock around the compiled call: dynamo's guard "
                              "check is not safe under concurrent callers, and each spurious failure compiles a "
                              "graph it already has",), Risk.SAFE)]
        impact = 0.8 if limit_hit else min(0.8, 0.25 + 0.03 * n + (0.2 if rate and rate >= t.storm_rate_per_min
                                                                      else 0.0))
        return self.finding(
            severity=Severity.CRITICAL if hard else severity_for(impact),
            confidence=Confidence.MEASURED,
            title="torch.compile recompiles" + (" past its limit" if limit_hit else " repeatedly"),
            message=" ".join(parts),
            impact=impact,
            evidence=present(ev, *self.optional),
            why="\n".join(f"{str(r.get('input'))[:24]:<24} |{bar(min(1.0, float(r.get('count', 0)) / max(1.0, n)))}| "
                          f"{r.get('count')}×" for r in reasons[:5]),
            fixes=[
                *serialise,
                Fix("Stop the shape from specialising", tuple(steps), Risk.SAFE),
                Fix(
                    "Bound the number of shapes",
                    ("Pad inputs to a few bucketed sizes (powers of two, or multiples of 64 tokens) and warm each "
                     "bucket up before taking traffic",),
                    Risk.SAFE,
                ),
                Fix(
                    "Raise the limit only when the variants are few and known",
                    (f"{advice.RECOMPILE_LIMIT} = 16: every extra "
                     "variant costs its compile time and its memory (code, and a CUDA-graph pool per variant with "
                     "mode='reduce-overhead')",),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )


    def _tftrt(self, ev: EvidenceSet, n: float) -> Finding:
        """TF-TRT builds TensorRT engines while the graph serves (none built at conversion, or new input shapes)."""
        got = ev.get("compile.recompiles")
        detail = got.detail if isinstance(got, Evidence) else f"TF-TRT built {n:.0f} TensorRT engines while running"
        again = ev.value("compile.engine_rebuilds", 0.0) or 0.0
        impact = min(0.8, 0.25 + 0.03 * n + (0.2 if again else 0.0))
        return self.finding(
            severity=severity_for(impact),
            confidence=Confidence.MEASURED,
            title="TF-TRT builds TensorRT engines at run time",
            message=f"{detail}. Serving, each build runs on the request that needs it (TensorRT builds take seconds "
                    "or more), and an input shape the op has no engine for builds another (up to "
                    "maximum_cached_engines); a log of converter.build() at conversion shows the same records, and "
                    "then nothing is built while serving.",
            impact=impact,
            evidence=present(ev, *self.optional),
            fixes=[
                Fix("Build the engines before serving",
                    ("At conversion, run converter.build(input_fn=...) over every input shape you serve, then "
                     "converter.save(): the engines are saved in the SavedModel",
                     "Set maximum_cached_engines to at least the number of shapes served"), Risk.SAFE),
                Fix("Cover the shapes with fewer engines",
                    ("use_dynamic_shape=True with a dynamic_shape_profile_strategy (TF 2.5 and later), or pad inputs "
                     "to a few fixed shapes",), Risk.NEEDS_VALIDATION),
            ],
        )

    def _retracing(self, ev: EvidenceSet, n: float) -> Finding:
        """TensorFlow's tf.function traced again for most of its recent calls (its retracing warning)."""
        got = ev.get("compile.recompiles")
        detail = got.detail.removeprefix("at least: ") if isinstance(got, Evidence) else ""
        impact = min(0.8, 0.25 + 0.03 * n)
        return self.finding(
            severity=severity_for(impact),
            confidence=Confidence.MEASURED,
            title="tf.function retraces repeatedly",
            message=(f"{detail[:1].upper() + detail[1:]}." if detail else f"tf.function retraced {n:.0f} times.")
                    + " Each trace runs the Python function again and builds a new graph, on the request's time; "
                      "a Keras predict function made again per call (model.predict in a loop, a model built per "
                      "request) or inputs of new shapes or Python values trace every time.",
            impact=impact,
            evidence=present(ev, *self.optional),
            fixes=[
                Fix("Trace once",
                    ("Build the model and any @tf.function once, outside the loop or request handler",
                     "For one batch at a time call model(x, training=False) or model.predict_on_batch(x), not "
                     "model.predict(x) in a loop",
                     "Pass tensors, not Python numbers or lists, to the traced function"), Risk.SAFE),
                Fix("Let shapes vary without a new trace",
                    ("@tf.function(input_signature=[tf.TensorSpec([None, ...], dtype)]) with None on the varying "
                     "dimension, or reduce_retracing=True (TF ≥ 2.9; experimental_relax_shapes=True before)",
                     "Or pad inputs to a few fixed shapes"), Risk.SAFE),
            ],
        )


class EngineRebuildOnNewShape(Rule):
    """Latency spikes land exactly on new input-shape extremes: the engine rebuilds for each.

    What it detects: calls timed with their input shapes, where the slow calls are the ones whose
    input size is a new minimum or maximum of everything seen so far, and calls within the seen
    range are fast: TensorRT (directly or as an ONNX Runtime execution provider) and similar
    engines build for a shape range and rebuild when an input falls outside it.

    Why it matters: each rebuild costs seconds to minutes; in autoregressive generation the
    sequence grows every step, so every step can pay a rebuild; p99 is the build time.

    How it decides: with in-range calls to compare against: at least ``min_extreme_spikes`` spikes
    (≥ 3× the median) on new extremes (``shape.new_extreme_spikes``), at least
    ``min_on_extreme_ratio`` of all spikes on new extremes, and new-extreme calls at least
    ``min_slowdown`` × slower than in-range calls. With no in-range call (every call a new
    extreme, e.g. a growing sequence): at least ``min_extreme_calls`` such calls each costing at
    least ``rebuild_floor_ms`` (thin evidence, said so).

    Evidence: shape.calls, shape.extreme_calls; optionally shape.new_extreme_spikes,
    shape.spike_calls, shape.spike_on_extreme_ratio, shape.extreme_latency_ms.median,
    shape.in_range_latency_ms.median, shape.first_call_ms, shape.extreme_time_share, shape.range.

    Fix: give the engine the full shape range up front: TensorRT optimisation profiles
    (ORT: ``trt_profile_min_shapes`` / ``trt_profile_opt_shapes`` / ``trt_profile_max_shapes``,
    trtexec ``--minShapes/--optShapes/--maxShapes``), enable the engine cache
    (``trt_engine_cache_enable``), or pad inputs to a few fixed shapes.

    False positives: a model whose cost truly grows with input size shows slower calls on new
    maxima, but not on new minima; the in-range comparison and the spike ratio guard it.
    """

    code = "CMP003"
    name = "engine-rebuild-on-new-shape-extreme"
    category = Category.RECOMPILATION
    requires = ("shape.calls", "shape.extreme_calls")
    optional = (
        "shape.new_extreme_spikes", "shape.spike_calls", "shape.spike_on_extreme_ratio",
        "shape.extreme_latency_ms.median", "shape.in_range_latency_ms.median", "shape.first_call_ms",
        "shape.extreme_time_share", "shape.range", "compile.recompiles",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_calls: float = 3  # fewer calls cannot show a pattern
        min_extreme_spikes: float = 2  # one slow call on a new shape may be noise; two is a pattern
        min_on_extreme_ratio: float = 0.7  # most spikes must land on new extremes, not anywhere
        min_slowdown: float = 3.0  # new-extreme calls at least 3× the in-range ones
        min_extreme_calls: float = 2  # with no in-range baseline: at least two rebuild-sized calls
        rebuild_floor_ms: float = 1000.0  # one inference call of ≥ 1 s on a barely larger input is a build

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        calls = ev.value("shape.calls", 0.0) or 0.0
        extremes = ev.value("shape.extreme_calls", 0.0) or 0.0
        if calls < t.min_calls or extremes <= 0:
            return None
        both = ev.value("shape.new_extreme_spikes", 0.0) or 0.0
        ratio = ev.value("shape.spike_on_extreme_ratio")
        ext_ms = ev.value("shape.extreme_latency_ms.median")
        in_ms = ev.value("shape.in_range_latency_ms.median")
        share = ev.value("shape.extreme_time_share", 0.0) or 0.0
        first = ev.value("shape.first_call_ms")
        if in_ms is not None:
            if both < t.min_extreme_spikes or ratio is None or ratio < t.min_on_extreme_ratio:
                return None
            if ext_ms is None or ext_ms < t.min_slowdown * max(in_ms, 1e-9):
                return None
            confidence = Confidence.MEASURED if calls >= 6 else Confidence.THIN
            msg = (f"{both:.0f} of {calls:.0f} calls were spikes and {pct(ratio)} of the spikes hit a new minimum or "
                   f"maximum of the input size: calls on a new extreme took {fmt_ms(ext_ms)} (median) against "
                   f"{fmt_ms(in_ms)} for sizes already seen, {ext_ms / max(in_ms, 1e-9):.0f}× slower.")
        else:
            if extremes < t.min_extreme_calls or ext_ms is None or ext_ms < t.rebuild_floor_ms:
                return None
            confidence = Confidence.THIN
            msg = (f"Each of the {calls:.0f} calls ran on an input larger (or smaller) than all before it, and those "
                   f"calls took {fmt_ms(ext_ms)} (median): no call on an already-seen shape exists to compare with, "
                   "but a per-call cost this large on an input barely larger than the last is an engine build.")
        if first is not None:
            msg += f" The first call took {fmt_ms(first)}."
        msg += f" {pct(share)} of all call time went to the first and new-extreme calls."
        rng = ev.get("shape.range")
        seen = str(rng.value) if isinstance(rng, Evidence) else ""
        if seen:
            msg += f" Input shapes ranged over {seen}."
        if ev.value("compile.recompiles") is None:
            msg += " No compiler log was given: the pattern itself is the evidence."
        return self.finding(
            severity=severity_for(share, critical=0.6, major=0.3),
            confidence=confidence,
            title="The engine rebuilds on every new input-shape extreme",
            message=msg,
            impact=min(0.95, share),
            evidence=present(ev, *self.requires, *self.optional),
            why=f"rebuild |{bar(share)}| {pct(share)} of call time",
            fixes=[
                Fix(
                    "Declare the whole shape range once",
                    ("ONNX Runtime TensorRT EP: set trt_profile_min_shapes, trt_profile_opt_shapes and "
                     "trt_profile_max_shapes to the served range"
                     + (f" (at least {seen.replace('..', ' to ')}, as 'input_name:' + shape)" if seen else
                        " (e.g. 'input:1x1x80', 'input:1x1000x80', 'input:1x3000x80')"),
                     "TensorRT: build with an optimisation profile (trtexec --minShapes/--optShapes/--maxShapes)",
                     "Enable the engine cache (trt_engine_cache_enable=True, trt_engine_cache_path) so a restart "
                     "does not rebuild"),
                    Risk.SAFE,
                ),
                Fix(
                    "Serve fixed shapes",
                    ("Pad inputs to a few bucketed lengths and warm each bucket up at start-up",
                     "For generation, pad to the maximum sequence length or use a runtime made for growing "
                     "sequences (KV cache, e.g. TensorRT-LLM / vLLM)"),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )


RULES: tuple[type[Rule], ...] = (RecompilesFromLog, EngineRebuildOnNewShape)
