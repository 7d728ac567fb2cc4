"""Graph compilation seen from a live process (a recompilation storm) or in an engine's log (kernels its JIT
monitor saw compiled while serving)."""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Risk, Severity
from diagnose.rules.base import Rule, bar, present, ramp_for, severity_for, stderr
from diagnose.units import pct


class RecompilationStorm(Rule):
    """The service keeps compiling graphs while it serves.

    What it detects: a large share of the service's time inside torch.compile (dynamo tracing, AOT
    autograd, inductor lowering and codegen, triton compilation) or a TensorRT/ONNX Runtime engine
    build, during steady serving — in the request threads themselves or in the compiler processes
    they start and wait for (``cc1plus``/``g++``/``ld`` for inductor's C++ build on the CPU,
    ``nvcc``/``ptxas`` and Triton's compile workers on a GPU).

    Why it matters: each compile blocks the request that triggered it for seconds, so p99 latency
    explodes; a service fed varying shapes with ``dynamic=False`` recompiles for every new shape
    until it hits ``recompile_limit`` and silently falls back to eager.

    How it decides: the compile share is the larger of ``cpu.compile_share`` (share of active py-spy
    samples with a compiler frame on the stack) and ``wall.compile_share`` (share of the request
    threads' wall-clock time spent compiling, *waiting for compiler children included*: a thread
    waiting for ``cc1plus`` uses no CPU and is invisible to the on-CPU profile). It must reach
    ``min_share`` — the impact ramps up from nothing there to the full share ``share_band`` (or twice
    the share's uncertainty) above it —
    and the compile time in the window must reach ``min_seconds``: Python-side compile time
    (``cpu.compile_seconds``) plus the compiler children's CPU (``compile.children_cpu_s``, which counts
    as compilation of their parent), or the request-thread time spent compiling
    (``wall.compile_share`` × ``wall.request_seconds``). Compiled kernels newly loaded during the
    window (``compile.modules_loaded``), new files in the inductor cache (``compile.cache_files_added``)
    or compiler children seen (``compile.children_seen``) corroborate it.

    Evidence: cpu.compile_share or wall.compile_share; optionally cpu.compile_seconds,
    compile.children_cpu_s, compile.children_cores, compile.children_seen, wall.request_seconds,
    compile.modules_loaded, compile.cache_files_added, cpu.top.compile, wall.top.compile,
    cpu.active_samples, wall.samples, cpu.profile_total_s (a pasted cProfile's: its compiles may be one run's first
    call, and the message says how to tell).

    Fix: mark the varying dimension dynamic (``torch._dynamo.mark_dynamic`` or
    ``dynamic=True``), pad inputs to a few bucketed shapes, and warm every bucket up before taking
    traffic; for TensorRT, build optimisation profiles covering the served range.

    False positives: the first minutes after a deploy (warm-up compiles once per shape, then
    stops): attach again later or check that the compile share falls.
    """

    code = "CMP001"
    name = "recompilation-storm"
    category = Category.RECOMPILATION
    requires = ()
    requires_any = (("cpu.compile_share",), ("wall.compile_share",))
    optional = ("cpu.compile_share", "wall.compile_share", "cpu.compile_seconds", "compile.children_cpu_s",
                "compile.children_cores", "compile.children_seen", "wall.request_seconds", "compile.modules_loaded",
                "compile.cache_files_added", "cpu.top.compile", "wall.top.compile", "cpu.active_samples",
                "wall.samples", "cpu.profile_total_s")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.15  # steady-state serving compiles nothing; 15 % is a storm, not noise
        share_band: float = 0.05  # full impact 5 pp (or 2 standard errors) above min_share
        min_seconds: float = 0.5  # under half a second of compiling in the window is one stray compile
        min_samples: float = 100  # fewer active samples than this is a thin profile
        min_wall_samples: float = 30  # fewer wall-clock samples of request threads is a thin view

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        cpu_share = ev.value("cpu.compile_share", 0.0) or 0.0
        wall_share = ev.value("wall.compile_share", 0.0) or 0.0
        wall_ok = (ev.value("wall.samples", 0.0) or 0.0) >= t.min_wall_samples
        key = "wall.compile_share" if wall_ok and wall_share > cpu_share else "cpu.compile_share"
        share = wall_share if key == "wall.compile_share" else cpu_share
        weight = ramp_for(ev, key, t.min_share, t.share_band)
        if weight <= 0:
            return None
        py_s = ev.value("cpu.compile_seconds")
        child_s = ev.value("compile.children_cpu_s")
        wall_s = wall_share * (ev.value("wall.request_seconds", 0.0) or 0.0)
        seconds = max((py_s or 0.0) + (child_s or 0.0), wall_s)
        if (py_s is not None or child_s is not None or wall_s > 0) and seconds < t.min_seconds:
            return None
        added = ev.value("compile.cache_files_added")
        loaded = ev.value("compile.modules_loaded")
        children = ev.value("compile.children_seen")
        samples = ev.value("wall.samples" if key == "wall.compile_share" else "cpu.active_samples", 0.0) or 0.0
        enough = t.min_wall_samples if key == "wall.compile_share" else t.min_samples
        confidence = Confidence.MEASURED if samples >= enough else Confidence.THIN
        if any(x and x > 0 for x in (added, loaded, children)) and confidence is Confidence.MEASURED:
            confidence = Confidence.CORRELATED
        if key == "wall.compile_share":
            msg = f"Request threads spend {pct(share)} of their wall-clock time compiling graphs"
            if cpu_share:
                msg += f" ({pct(cpu_share)} of the service's active CPU time)"
        else:
            total = ev.value("cpu.profile_total_s")
            whose = (f"the profiled program's {total:g} s (cProfile)" if total is not None
                     else "the service's active CPU time")
            msg = f"{pct(share)} of {whose} is spent compiling graphs"
        if py_s is not None:
            msg += f"; {py_s:.1f} s of Python thread time compiling in the window"
        if child_s:
            msg += (f"; compiler processes under the service ({children or 0:.0f} seen: cc1plus, g++, ld, …) "
                    f"used {child_s:.1f} s of CPU")
        if loaded:
            msg += f"; {loaded:.0f} newly compiled kernel modules were loaded during the window"
        if added:
            msg += f"; the inductor cache grew by {added:.0f} files while serving"
        if "cpu.profile_total_s" in ev:  # a profile of one run: its compiles may be the first call's, once
            msg += (". A profiled run that compiles this much either compiled once at its first call (warm up "
                    "before timing) or recompiles as the input shape changes: TORCH_LOGS=recompiles tells them apart.")
        else:
            msg += ". Something (usually a changing input shape) triggers recompiles in steady state."
        if weight < 1:
            msg += f" Just above the threshold (±{stderr(ev, key):.2f}): impact scaled to {pct(weight)}."
        impact = share * weight
        return self.finding(
            severity=severity_for(impact, critical=0.4, major=0.15),
            confidence=confidence,
            title="Recompilation storm while serving",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"compile |{bar(share)}| {pct(share)}"
            + (f"\n(on CPU |{bar(cpu_share)}| {pct(cpu_share)})" if key == "wall.compile_share" else ""),
            fixes=[
                Fix(
                    "Stop shape-driven recompiles",
                    (
                        "Run with TORCH_LOGS=recompiles to see which guard fails (diagnose analyze reads it)",
                        "Mark the varying dimension dynamic: torch._dynamo.mark_dynamic(x, 0) "
                        "or torch.compile(model, dynamic=True)",
                        "Or pad inputs to a few bucketed shapes (e.g. batch 1, 2, 4, 8, 16) and warm "
                        "each bucket up before the service reports ready",
                    ),
                    Risk.NEEDS_VALIDATION,
                ),
                Fix(
                    "Keep compiled artefacts across restarts",
                    (
                        "Set TORCHINDUCTOR_CACHE_DIR to a persistent volume and enable "
                        "TORCHINDUCTOR_FX_GRAPH_CACHE=1 so a redeploy does not compile from scratch",
                    ),
                    Risk.SAFE,
                ),
            ],
        )


class KernelsCompiledWhileServing(Rule):
    """The engine compiled GPU kernels while it served, after its warm-up.

    What it detects: vLLM's kernel JIT monitor (on by default since vllm#40137, April 2026; CuTeDSL and
    TileLang kernels since #46167 and #46718) logging ``Triton kernel JIT compilation during inference:
    <kernel>`` — a kernel first compiled inside a served step, for a shape or configuration its warm-up did
    not cover (``compile.jit_while_serving``); with ``--jit-monitor-mode error`` each one is an error instead.

    Why it matters: the step that compiles stalls for the compile (tens of milliseconds to seconds per kernel,
    longer on a cold Triton cache), and every request in the batch waits: the first requests after a deploy,
    or the first at a new batch size or context length, see time-to-first-token and inter-token spikes that
    later ones do not. It recurs after every restart until the warm-up covers the shape.

    How it decides: any compile the monitor logged; the impact grows with the number of distinct kernels
    (``base`` + ``per_kernel`` each, at most ``max_impact``), major at most, so that a queue or a storm measured
    beside it leads. Raised as errors, the requests failed: critical.

    Evidence: compile.jit_while_serving; optionally compile.jit_kernels, compile.jit_errors.

    Fix: a vLLM release whose warm-up covers the kernel (the warm-up coverage series of July 2026, e.g.
    vllm#47546); warm the server up with
    requests at the batch sizes and prompt lengths it will serve before it takes traffic; keep Triton's
    cache (``TRITON_CACHE_DIR``) on a persistent volume so a restart loads rather than compiles.

    False positives: a burst right after start-up that stops is a one-off per shape (the finding says how many
    kernels, not how often); it matters when the complaint is the first requests or a latency spike.
    """

    code = "CMP005"
    name = "kernels-compiled-while-serving"
    category = Category.RECOMPILATION
    requires = ("compile.jit_while_serving",)
    optional = ("compile.jit_kernels", "compile.jit_errors")

    @dataclass(frozen=True)
    class Thresholds:
        base: float = 0.35  # one kernel compiled inside a served step is a spike someone felt
        per_kernel: float = 0.05  # each further kernel is another step that stalled
        max_impact: float = 0.55  # a one-off per shape: major at most, below a standing bottleneck (a queue, a storm)

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        n = ev.value("compile.jit_while_serving", 0.0) or 0.0
        if n <= 0:
            return None
        kernels = ev.value("compile.jit_kernels", 0.0) or n
        errors = ev.value("compile.jit_errors", 0.0) or 0.0
        got = ev.get("compile.jit_while_serving")
        names = got.detail.split(": ", 2)[-1] if isinstance(got, Evidence) else ""
        impact = min(t.max_impact, t.base + t.per_kernel * kernels)
        msg = (f"vLLM compiled {kernels:.0f} kernel(s) inside served steps, after its warm-up ({n:.0f} compile(s): "
               f"{names}). Each one stalls the step it falls in, and every request in that batch with it: the "
               "first requests after a start, or the first at a new batch size or length, get a latency spike the "
               "later ones do not, after every restart.")
        if errors:
            msg += (f" {errors:.0f} of them were raised as errors (--jit-monitor-mode error): those requests "
                    "failed.")
        return self.finding(
            # however many kernels, a one-off per shape is never critical beside a standing bottleneck; an error is
            severity=Severity.CRITICAL if errors else severity_for(impact, critical=1.01),
            confidence=Confidence.CORRELATED,
            title="Kernels compiled while serving",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            fixes=[
                Fix("Cover the shapes in the warm-up", (
                    "Upgrade vLLM: from July 2026 its warm-up covers more kernels and shapes (vllm#47546 and the "
                    "series it belongs to); name the kernel in a vLLM issue if the newest release still compiles it",
                    "Before the server takes traffic, send requests at the batch sizes (up to --max-num-seqs) and "
                    "prompt lengths it will serve",
                    "Keep Triton's cache on a persistent volume (TRITON_CACHE_DIR) so a restart loads the kernels "
                    "instead of compiling them",
                ), Risk.SAFE),
                Fix("Catch it before production", (
                    "Run a staging benchmark with --jit-monitor-mode error: a kernel the warm-up misses then fails "
                    "the benchmark instead of slowing production",
                ), Risk.NEEDS_VALIDATION),
            ],
        )


RULES: tuple[type[Rule], ...] = (RecompilationStorm, KernelsCompiledWhileServing)
