"""Graph compilation seen from a live process: a recompilation storm."""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.model import Category, Confidence, EvidenceSet, Finding, Fix, Risk
from rules.base import Rule, bar, pct, present, severity_for


class RecompilationStorm(Rule):
    """The service keeps compiling graphs while it serves.

    What it detects: a large share of the service's active CPU time inside torch.compile
    (dynamo tracing, AOT autograd, inductor lowering and codegen, triton compilation) or a
    TensorRT/ONNX Runtime engine build, during steady serving.

    Why it matters: each compile blocks the request that triggered it for seconds, so p99 latency
    explodes; a service fed varying shapes with ``dynamic=False`` recompiles for every new shape
    until it hits ``recompile_limit`` and silently falls back to eager.

    How it decides: ``cpu.compile_share`` (share of active py-spy samples with a compiler frame on
    the stack) is at least ``min_share`` and the compile time in the window
    (``cpu.compile_seconds``) is at least ``min_seconds``. Compiled kernels newly loaded into the
    process during the window (``compile.modules_loaded``, from its memory maps) or new files in
    the inductor cache (``compile.cache_files_added``) corroborate it.

    Evidence: cpu.compile_share; optionally cpu.compile_seconds, compile.cache_files_added,
    cpu.top.compile, cpu.active_samples.

    Fix: mark the varying dimension dynamic (``torch._dynamo.mark_dynamic`` or
    ``dynamic=True``), pad inputs to a few bucketed shapes, and warm every bucket up before taking
    traffic; for TensorRT, build optimisation profiles covering the served range.

    False positives: the first minutes after a deploy (warm-up compiles once per shape, then
    stops): attach again later or check that the compile share falls.
    """

    code = "CMP001"
    name = "recompilation-storm"
    category = Category.RECOMPILATION
    requires = ("cpu.compile_share",)
    optional = ("cpu.compile_seconds", "compile.modules_loaded", "compile.cache_files_added", "cpu.top.compile",
                "cpu.active_samples")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.15  # steady-state serving compiles nothing; 15 % is a storm, not noise
        min_seconds: float = 0.5  # under half a second of compiling in the window is one stray compile
        min_samples: float = 100  # fewer active samples than this is a thin profile

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        share = ev.value("cpu.compile_share", 0.0) or 0.0
        seconds = ev.value("cpu.compile_seconds")
        if share < t.min_share or (seconds is not None and seconds < t.min_seconds):
            return None
        added = ev.value("compile.cache_files_added")
        loaded = ev.value("compile.modules_loaded")
        samples = ev.value("cpu.active_samples", 0.0) or 0.0
        confidence = Confidence.MEASURED if samples >= t.min_samples else Confidence.THIN
        if ((added and added > 0) or (loaded and loaded > 0)) and confidence is Confidence.MEASURED:
            confidence = Confidence.CORRELATED
        msg = f"{pct(share)} of the service's active CPU time is spent compiling graphs"
        if seconds is not None:
            msg += f" ({seconds:.1f} s of thread time in the window)"
        if loaded:
            msg += f"; {loaded:.0f} newly compiled kernel modules were loaded during the window"
        if added:
            msg += f"; the inductor cache grew by {added:.0f} files while serving"
        msg += ". Something (usually a changing input shape) triggers recompiles in steady state."
        return self.finding(
            severity=severity_for(share, critical=0.4, major=0.15),
            confidence=confidence,
            title="Recompilation storm while serving",
            message=msg,
            impact=share,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"compile |{bar(share)}| {pct(share)}",
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


RULES: tuple[type[Rule], ...] = (RecompilationStorm,)
