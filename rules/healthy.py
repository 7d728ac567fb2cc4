"""Healthy explanations: things that look like a problem and are not, so the tool does not cry wolf.

Every finding here has severity INFO: it never becomes the primary bottleneck, and it carries the
category it could be mistaken for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Risk, Severity
from diagnose.rules.base import Rule, bar, present
from diagnose.units import pct, size


def _vllm_process(ev: EvidenceSet) -> dict[str, Any] | None:
    """The GPU process that is vLLM: named so, or the largest one when the text says vLLM runs."""
    got = ev.get("gpu.processes")
    procs = [p for p in got.value if isinstance(p, dict)] if isinstance(got, Evidence) and isinstance(
        got.value, list) else []
    named = [p for p in procs if "vllm" in str(p.get("name", "")).lower()]
    if named:
        return max(named, key=lambda p: float(p.get("used_bytes") or 0))
    engine = ev.get("serving.engine")
    if procs and isinstance(engine, Evidence) and engine.value == "vllm":
        return max(procs, key=lambda p: float(p.get("used_bytes") or 0))
    return None


class VllmPreallocation(Rule):
    """vLLM holding ~90 % of the GPU is its KV-cache budget, not a leak.

    What it detects: nvidia-smi shows a vLLM process holding about ``gpu_memory_utilization`` of
    the device (0.9 by default), or many times the size of its model's weights, while nothing failed.

    Why it matters: vLLM pre-allocates that share of the GPU at start-up and fills whatever the
    weights leave with KV-cache blocks, so its footprint is the same for a 3B and a 7B model.
    Engineers read it as a leak or a memory hog and restart or resize for nothing.

    How it decides: a vLLM process (named so in the process list, or the largest process when the
    text says vLLM runs) holds between ``utilization − below`` and ``utilization + above`` of the
    device (utilization from ``mem.gpu_memory_utilization_ratio``, else vLLM's default), or at
    least ``weights_multiple`` × the model's weights; and no out-of-memory error nor any exception a
    traceback ended with was seen (a second instance that failed to start beside the first is no budget).

    Evidence: gpu.processes or gpu.memory_used_bytes + gpu.memory_total_bytes; optionally
    serving.engine, mem.gpu_memory_utilization_ratio, mem.weights_bytes, mem.weights_estimate_bytes,
    gpu.spec_memory_bytes, mem.oom_count, report.exception_lines.

    Fix: nothing is wrong. To share the GPU, lower ``--gpu-memory-utilization`` (fewer KV blocks,
    less concurrency); read real KV usage from ``vllm:gpu_cache_usage_perc``.

    False positives: a real leak in a vLLM process would also show high usage, but it grows over
    time past the budget (above ``utilization + above``) and ends in an OOM, which vetoes this note.
    """

    code = "HLT001"
    name = "vllm-preallocation-not-a-leak"
    category = Category.OOM_EXTERNAL
    requires = ()
    requires_any = (("gpu.processes",), ("gpu.memory_used_bytes", "gpu.memory_total_bytes"))
    optional = (
        "gpu.processes", "gpu.memory_used_bytes", "gpu.memory_total_bytes", "serving.engine",
        "mem.gpu_memory_utilization_ratio", "mem.weights_bytes", "mem.weights_estimate_bytes", "model.params",
        "gpu.spec_memory_bytes", "mem.oom_count", "report.exception_lines",
    )

    @dataclass(frozen=True)
    class Thresholds:
        default_utilization: float = 0.9  # vLLM's default gpu_memory_utilization
        below: float = 0.10  # the budget is an upper bound; a smaller model can leave part of it unclaimed
        above: float = 0.06  # nvidia-smi also counts the CUDA context and NCCL (~0.5-2 GiB) beyond the budget
        weights_multiple: float = 3.0  # holding ≥ 3× the weights: the rest is the KV-cache pool, not the model

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        if (ev.value("mem.oom_count", 0.0) or 0.0) > 0 or (ev.value("report.exception_lines", 0.0) or 0.0) > 0:
            return None  # something failed: an OOM, or a traceback's exception (a second instance that did not start)
        proc = _vllm_process(ev)
        engine = ev.get("serving.engine")
        is_vllm = proc is not None or (isinstance(engine, Evidence) and engine.value == "vllm")
        if not is_vllm:
            return None
        used = float(proc["used_bytes"]) if proc and proc.get("used_bytes") else ev.value("gpu.memory_used_bytes")
        if not used:
            return None
        total = ev.value("gpu.memory_total_bytes") or ev.value("gpu.spec_memory_bytes")
        util = ev.value("mem.gpu_memory_utilization_ratio") or t.default_utilization
        weights = ev.value("mem.weights_bytes") or ev.value("mem.weights_estimate_bytes")
        share = used / total if total else None
        on_budget = share is not None and util - t.below <= share <= util + t.above
        over_weights = weights is not None and weights > 0 and used >= t.weights_multiple * weights
        if not (on_budget or over_weights):
            return None
        who = f"The vLLM process{' (' + str(proc['name']) + ')' if proc else ''} holds {size(used, 1)}"
        if share is not None:
            who += f", {pct(share)} of the {size(total or 0.0, 1)} device"
        if weights:
            who += f", {used / weights:.0f}× its model's ~{size(weights, 1)} of weights"
        msg = (who + f". vLLM pre-allocates gpu_memory_utilization ({util:.2g}) of the GPU at start-up and "
               "fills what the weights leave with KV-cache blocks, so the footprint does not depend on the model "
               "size. This is a budget, not a leak, and nothing failed.")
        return self.finding(
            severity=Severity.INFO,
            confidence=Confidence.CORRELATED if (on_budget and over_weights) else Confidence.HEURISTIC,
            title="vLLM's memory pre-allocation, not a leak",
            message=msg,
            impact=share if share is not None else 0.5,
            evidence=present(ev, *self.optional),
            why=f"held |{bar(share)}| {pct(share)} (budget {pct(util)})" if share is not None else "",
            fixes=[
                Fix(
                    "Only if the GPU must be shared: shrink the budget",
                    ("vllm serve … --gpu-memory-utilization 0.5 (fewer KV-cache blocks, so fewer concurrent "
                     "sequences)",
                     "Watch real KV usage via the vllm:gpu_cache_usage_perc metric before lowering it"),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )


class CpuWhileLoading(Rule):
    """High CPU only while the weights load is expected.

    What it detects: CPU use reported high while the model's weights are read, and back to normal
    once the model is up.

    Why it matters: reading and deserialising tens of GB of safetensors, converting dtypes and
    copying to the GPU is CPU work; it ends when serving starts and does not affect requests.

    How it decides: ``cpu.loading_util_pct`` is at least ``min_pct`` and CPU use after loading is
    reported normal (``cpu.after_loading_normal``) or measured under ``max_serving_pct``.

    Evidence: cpu.loading_util_pct; optionally cpu.after_loading_normal, cpu.serving_util_pct,
    model.params, mem.weights_estimate_bytes.

    Fix: nothing is wrong. Faster start-up, if wanted: load from local NVMe, use safetensors, or a
    pre-sharded checkpoint; vLLM ``--load-format`` options.

    False positives: CPU that stays high after loading is a different problem (CPU001).
    """

    code = "HLT002"
    name = "cpu-only-while-loading"
    category = Category.CPU_PREPROCESSING
    requires = ("cpu.loading_util_pct",)
    optional = ("cpu.after_loading_normal", "cpu.serving_util_pct", "model.params", "mem.weights_estimate_bytes")

    @dataclass(frozen=True)
    class Thresholds:
        min_pct: float = 50.0  # below half a core-equivalent nobody asks about it
        max_serving_pct: float = 30.0  # CPU under this while serving is normal for a GPU-bound service

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        loading = ev.value("cpu.loading_util_pct", 0.0) or 0.0
        if loading < t.min_pct:
            return None
        serving = ev.value("cpu.serving_util_pct")
        normal = (ev.value("cpu.after_loading_normal", 0.0) or 0.0) > 0
        if serving is not None and serving >= t.max_serving_pct:
            return None
        if serving is None and not normal:
            return None
        after = f"{serving:.0f} % while serving" if serving is not None else "back to normal once the model is up"
        return self.finding(
            severity=Severity.INFO,
            confidence=Confidence.HEURISTIC,
            title="High CPU while loading weights is expected",
            message=(f"CPU use was {loading:.0f} % while the model's weights were loading and {after}: reading, "
                     "deserialising and converting the checkpoint is CPU work that ends when serving starts."),
            impact=0.1,
            evidence=present(ev, *self.requires, *self.optional),
            fixes=[
                Fix("Nothing to fix; for a faster start-up only",
                    ("Keep checkpoints on local NVMe in safetensors format",
                     "Pre-shard the checkpoint for the tensor-parallel size you serve with"),
                    Risk.SAFE),
            ],
        )


RULES: tuple[type[Rule], ...] = (VllmPreallocation, CpuWhileLoading)
