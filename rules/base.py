"""What a rule is: a code, a category, the evidence keys it reads, thresholds, and a pure check.

A rule never prints, plots or touches a process. ``check`` receives an ``EvidenceSet`` in which
every key of ``requires`` is present (the engine skips the rule with the reason otherwise) and
returns a ``Finding`` or None.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from diagnose.model import (
    HOST_NO_GPU,
    Category,
    Confidence,
    Evidence,
    EvidenceSet,
    Finding,
    Fix,
    Mechanism,
    Missing,
    Quality,
    Severity,
)


class Rule:
    """Base class of every rule; subclasses set the class attributes and implement ``check``."""

    code: ClassVar[str]
    name: ClassVar[str]
    category: ClassVar[Category | None]  # None: the rule only writes informational notes (severity info)
    requires: ClassVar[tuple[str, ...]]
    optional: ClassVar[tuple[str, ...]] = ()
    # any one of these groups is enough (for rules that can decide from several sources);
    # when set, ``requires`` lists the keys every group needs in common (may be empty).
    requires_any: ClassVar[tuple[tuple[str, ...], ...]] = ()
    Thresholds: ClassVar[type[Any]]  # a frozen dataclass of numbers, each field with a `# why` comment
    # codes of findings this one is a symptom of: when one of them is found too, it leads and this
    # finding ranks right after it (a queue fed by saturated pre-processing is the pre-processing's)
    symptom_of: ClassVar[tuple[str, ...]] = ()

    # every rule's overrides (set by the engine before ``check``): a rule that shares another rule's
    # bar reads it with ``thresholds_of`` so one override moves both
    config: Mapping[str, Mapping[str, Any]] = {}

    def thresholds_of(self, other: type[Rule]) -> Any:
        """``other``'s thresholds as configured for this run."""
        return other.thresholds(self.config.get(other.code))

    def check(self, ev: EvidenceSet, t: Any) -> Finding | None:  # pragma: no cover - abstract
        raise NotImplementedError

    # -- helpers shared by the rules -------------------------------------------------------

    @classmethod
    def thresholds(cls, overrides: Mapping[str, Any] | None = None) -> Any:
        """Default thresholds, with fields overridden by a config's ``[rules.CODE]`` (``diagnose.config``)."""
        base = cls.Thresholds()
        if not overrides:
            return base
        names = {f.name for f in dataclasses.fields(base)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"{cls.code}: unknown threshold(s) {', '.join(unknown)}")
        return dataclasses.replace(base, **{k: type(getattr(base, k))(v) for k, v in overrides.items()})

    @classmethod
    def missing_reason(cls, ev: EvidenceSet) -> str | None:
        """Why this rule cannot judge, or None when its required evidence is present."""
        for key in cls.requires:
            got = ev.get(key)
            if not isinstance(got, Evidence):
                return f"needs `{key}`: {got.reason}"
        if cls.requires_any:
            for group in cls.requires_any:
                if all(isinstance(ev.get(k), Evidence) for k in group):
                    return None
            wanted = " or ".join("+".join(f"`{k}`" for k in g) for g in cls.requires_any)
            # a capture that was skipped or failed says why; "no input provided" says nothing more
            why = next((got.reason for g in cls.requires_any for k in g
                        if isinstance(got := ev.get(k), Missing) and not got.reason.startswith("no input provided")),
                       "none was measured")
            return f"needs {wanted}: {why}"
        return None

    def finding(
        self,
        *,
        severity: Severity,
        confidence: Confidence,
        title: str,
        message: str,
        impact: float,
        evidence: list[Evidence],
        fixes: list[Fix],
        why: str = "",
        mechanism: Mechanism | None = None,
    ) -> Finding:
        return Finding(
            code=self.code,
            name=self.name,
            category=self.category,
            severity=severity,
            confidence=confidence,
            title=title,
            message=message,
            impact=max(0.0, min(1.0, impact)),
            evidence=tuple(evidence),
            fixes=tuple(fixes),
            why=why,
            mechanism=mechanism,
        )


def severity_for(impact: float, critical: float = 0.6, major: float = 0.3) -> Severity:
    """Severity from the estimated share of the problem a finding explains."""
    if impact >= critical:
        return Severity.CRITICAL
    if impact >= major:
        return Severity.MAJOR
    return Severity.MINOR


def present(ev: EvidenceSet, *keys: str) -> list[Evidence]:
    """The evidence items among ``keys`` that exist, in order (for a finding's evidence list)."""
    out: list[Evidence] = []
    for k in keys:
        got = ev.get(k)
        if isinstance(got, Evidence):
            out.append(got)
    return out


def bar(share: float, width: int = 30) -> str:
    """An ASCII bar for a 0..1 share, for the 'why' pictures."""
    share = max(0.0, min(1.0, share))
    n = round(share * width)
    return "#" * n + "." * (width - n)


def fmt_ms(x: float) -> str:
    """A duration for a message: seconds from 1 s up, else milliseconds with 3 significant digits."""
    return f"{x / 1000:.2f} s" if x >= 1000 else f"{x:.3g} ms"


def stderr(ev: EvidenceSet, key: str) -> float:
    """The measured uncertainty of ``key`` (its ``<key>.stderr`` evidence), 0 when none was given."""
    return ev.value(f"{key}.stderr", 0.0) or 0.0


def ramp(value: float, threshold: float, width: float) -> float:
    """0 at or below ``threshold``, 1 at ``threshold + width`` and above, linear between.

    A threshold that ramps instead of cutting: a finding appears where the rule's documented threshold
    says, but with no weight, and grows to its full impact over ``width``; a measurement wobbling
    around the threshold moves the impact a little instead of making a full-size finding appear and
    vanish (and the primary flip with it).
    """
    if width <= 0:
        return 1.0 if value >= threshold else 0.0
    return max(0.0, min(1.0, (value - threshold) / width))


def ramp_for(ev: EvidenceSet, key: str, threshold: float, min_width: float) -> float:
    """``ramp`` of ``key``'s value from ``threshold`` over twice the value's own uncertainty
    (``<key>.stderr``: the spread between the window's chunks, the sample count), or ``min_width``."""
    value = ev.value(key, 0.0) or 0.0
    return ramp(value, threshold, max(min_width, 2 * stderr(ev, key)))


def any_low_quality(ev: EvidenceSet, *keys: str) -> bool:
    """Whether any of ``keys`` that is present was derived from too little or partial data."""
    for k in keys:
        got = ev.get(k)
        if isinstance(got, Evidence) and got.quality is not Quality.GOOD:
            return True
    return False


# the words that name a GPU or its software, in a framework's message or a reporter's sentence
GPU_WORDS = re.compile(r"\b(?:CUDA|GPU|ROCm|HIP|Metal|Vulkan|cuBLAS|NVIDIA)\b", re.IGNORECASE)
# a GPU named inside a framework's identifier, where GPU_WORDS' word boundaries do not see it
GPU_IDENTIFIER = re.compile(r"(?:CUDA|ROCM|DML)ExecutionProvider|ggml_cuda", re.IGNORECASE)
# evidence only a GPU produces: its samples (NVML, DCGM, nvidia-smi), a GPU timeline (Nsight, Kineto, CUDA
# API calls), copies to and from a device (measured, or a request stage), the CUDA caching allocator's state
# (memory stats, snapshots, an allocator's OOM message), llama.cpp's GPU buffers — not an engine's memory
# settings (tensor parallel degree, max_model_len, gpu_memory_utilization), which a CPU backend has too
GPU_EVIDENCE = ("gpu.", "trace.", "kineto.", "nsys.", "copy.", "pcie.", "api.", "stage.h2d", "stage.d2h",
                "mem.reserved", "mem.allocated", "mem.segment", "mem.snapshot", "mem.peak", "mem.timeline",
                "mem.device_free", "mem.inactive_split", "mem.alloc_retries", "mem.free_", "mem.largest_free",
                "mem.private_pools", "mem.requested", "mem.activations", "mem.process_used", "mem.other_processes",
                "mem.oom_count",
                "llamacpp.gpu_backend")  # a buffer llama.cpp allocated on a GPU device
_GPU_STATEMENTS = ("report.vram_statements", "report.gpu_util_pct_max", "report.wrong_gpu_statements",
                   "report.offload_statements", "report.gpu_layers_offloaded", "report.cuda_graph_statements",
                   "report.cuda_graphs_off_messages", "report.slow_gpu_statements", "report.throttle_statements",
                   "report.copy_statements", "report.copy_ms_max", "report.pcie_link_statements",
                   "report.ep_memcpy_messages", "report.offload_settings", "report.ep_cpu_node_messages",
                   "report.sync_read_ms_max",  # a host read (.cpu(), .item()) waits for a device: it has one
                   "report.ollama_cpu_share")  # ollama's "42%/58% CPU/GPU": the GPU holds the rest
_GPU_CUES = ("c:gpu", "t:gpu", "c:vram", "t:vram", "c:wrong_gpu", "c:offload")


def gpu_in_view(ev: EvidenceSet) -> bool:
    """A GPU is part of the picture: measured (``GPU_EVIDENCE``), or named by the reporter (a GPU, its
    memory, layers to offload to it). Without one, no rule may say the GPU is the bottleneck, idles, or is
    misused: an engine on the CPU backend decodes on the CPU, and llama.cpp on a CPU-only host places its
    layers on the CPU by design."""
    if HOST_NO_GPU in ev:
        return ev.has_prefix(*GPU_EVIDENCE)  # a timeline recorded where the GPU is outranks the attach host
    if ev.has_prefix(*GPU_EVIDENCE) or any(k in ev for k in _GPU_STATEMENTS):
        return True
    got = ev.get("report.cues")  # a mapping of cue weights (``value`` reads numbers only)
    cues = got.value if isinstance(got, Evidence) else None
    # a GPU the reporter names, unless they say their machine has none ("(no NVIDIA card) … would a GPU speed this
    # up?": one asked about)
    if isinstance(cues, dict) and any(cues.get(c, 0.0) > 0 for c in _GPU_CUES) \
            and "report.no_gpu_statements" not in ev:
        return True
    # a framework's fall-back message names the GPU it could not use ("ggml_cuda_init: failed", "Failed to
    # create CUDAExecutionProvider")
    fallback = ev.get("report.cpu_fallback_messages")
    said = fallback.detail if isinstance(fallback, Evidence) else ""
    return GPU_WORDS.search(said) is not None or GPU_IDENTIFIER.search(said) is not None
