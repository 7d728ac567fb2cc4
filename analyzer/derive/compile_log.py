"""torch.compile logs → ``compile.*`` evidence: recompiles, grouped guard failures, the limit, graph breaks; vLLM's
kernel JIT monitor → ``compile.jit_while_serving`` (kernels compiled after its warm-up); TensorFlow's retracing
warning → ``compile.recompiles`` (at least the most calls of a warned window that retraced) and
``compile.framework`` = tensorflow."""

from __future__ import annotations

from typing import Any

from diagnose.collectors.compile_log import CompileLogParser
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality


class CompileLogSource:
    """Text source for TORCH_LOGS=recompiles / graph_breaks output and recompile-limit errors."""

    kind = "torch-compile-log"
    triggers = ("torch", "Recompiling", "calls to <", "tf.function retracing", "Building a new TensorRT engine",
                "recompil", ("triggered by", 0, 30), "limit", "Limit", "LIMIT",
                "raph break", "raph Break", "GRAPH BREAK", "reason", "Reason", "fullgraph", "JIT compilation")

    def __init__(self) -> None:
        self._p = CompileLogParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return self._p.matched()

    def problems(self) -> list[str]:
        log = self._p.log
        if log.limit_hit and not log.recompile_count:
            return ["the recompile limit was hit but the individual recompiles were not logged "
                    "(run with TORCH_LOGS=recompiles to see each guard failure)"]
        return []

    def evidence(self, source: str) -> list[Evidence]:
        log = self._p.log
        ev = Emit(source)
        count = log.recompile_count
        if count:
            fns = ", ".join(f"{k} ×{v}" for k, v in sorted(log.functions.items(), key=lambda kv: -kv[1])[:5])
            ev.add("compile.recompiles", count, "recompiles", f"recompiled: {fns}" if fns else "from compile ids")
        elif log.limit_hit and log.limit:
            ev.add("compile.recompiles", log.limit, "recompiles",
                   f"at least: the {log.limit_kind or 'recompile limit'} ({log.limit}) was reached", Quality.PARTIAL)
        elif log.tftrt_builds:
            ops = len(log.tftrt_ops)
            again = sum(max(0, len(shapes) - 1) for shapes in log.tftrt_ops.values())
            ev.add("compile.recompiles", log.tftrt_builds, "recompiles",
                   f"TF-TRT built {log.tftrt_builds} TensorRT engine(s) at run time, for {ops} engine op(s)"
                   + (f", {again} of them again for a new input shape" if again else ""))
            ev.add("compile.framework", "tf-trt", "name", "TF-TRT's engine op building engines at run time")
            ev.add("compile.engine_rebuilds", again, "builds", "engines built again for an op's new input shape")
        elif log.retraced:
            fns = ", ".join(f"{k} ×{v}" if v > 1 else k
                            for k, v in sorted(log.tf_functions.items(), key=lambda kv: -kv[1])[:5])
            several = log.tf_retrace_warnings > 1
            ev.add("compile.recompiles", log.tf_retraces, "recompiles",
                   f"at least: TensorFlow warned that tf.function retraced {'up to ' if several else ''}"
                   f"{log.tf_retraces} of the last {log.tf_retrace_window} calls"
                   + (f" ({log.tf_retrace_warnings} warnings: {fns})" if several else f" to {fns}"), Quality.PARTIAL)
            ev.add("compile.framework", "tensorflow", "name", "tf.function's retracing warning")
        if log.recompiles or log.limit_hit:
            ev.add("compile.limit_hit", 1 if log.limit_hit else 0, "flag",
                   (f"{log.limit_kind or 'recompile limit'} ({log.limit})" if log.limit else "recompile limit")
                   + (": hard failure under fullgraph=True" if log.fullgraph_failure else
                      ": the function falls back to eager" if log.limit_hit else " not reached"))
        if log.limit is not None:
            ev.add("compile.recompile_limit", log.limit, "recompiles", log.limit_kind)
        if log.fullgraph_failure:
            ev.add("compile.fullgraph_failure", 1, "flag", "fullgraph=True turns the limit into an exception")
        groups = log.grouped()
        if groups:
            ev.add("compile.recompile_reasons", [
                {"input": g.input, "kind": g.kind, "dim": g.dim, "count": g.count, "values": g.values[:16],
                 "summary": g.describe()} for g in groups[:20]], "list",
                f"{len(groups)} distinct guard failure(s)")
        if log.jit_kernels:
            n = sum(log.jit_kernels.values())
            names = ", ".join(f"{k} ×{v}" if v > 1 else k
                              for k, v in sorted(log.jit_kernels.items(), key=lambda kv: -kv[1])[:6])
            ev.add("compile.jit_while_serving", n, "compiles",
                   f"vLLM's JIT monitor: {len(log.jit_kernels)} kernel(s) compiled after its warm-up: {names}"
                   + ("…" if len(log.jit_kernels) > 6 else ""))
            ev.add("compile.jit_kernels", len(log.jit_kernels), "kernels", "distinct kernels compiled while serving")
            if log.jit_errors:
                ev.add("compile.jit_errors", len(log.jit_errors), "errors",
                       "raised as errors (--jit-monitor-mode error): the request that hit them failed")
        breaks = log.graph_break_count
        if breaks:
            ev.add("compile.graph_breaks", breaks, "breaks")
        if count >= 2 and log.first_ts is not None and log.last_recompile_ts is not None:
            span_s = log.last_recompile_ts - log.first_ts
            if span_s >= 1.0:
                ev.add("compile.recompile_rate_per_min", count / (span_s / 60.0), "per_min",
                       f"{count} recompiles over {span_s:.0f} s of log")
        return ev.items


def sources() -> list[Any]:
    return [CompileLogSource()]
