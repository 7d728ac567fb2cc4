"""Rules over per-stage timings that are not about prefill: where the request's time goes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Quality, Risk
from diagnose.rules.base import Rule, bar, fmt_ms, present, severity_for
from diagnose.units import pct

# the category a stage's time belongs to
STAGE_CATEGORY: dict[str, Category] = {
    "queue": Category.QUEUEING,
    "preprocess": Category.CPU_PREPROCESSING,
    "postprocess": Category.CPU_PREPROCESSING,
    "h2d": Category.PCIE_TRANSFER,
    "d2h": Category.PCIE_TRANSFER,
    "prefill": Category.PREFILL_TTFT,
    "compute": Category.GPU_COMPUTE,
    "decode": Category.GPU_COMPUTE,
}


def _confidence(ev: EvidenceSet, key: str) -> Confidence:
    got = ev.get(key)
    if isinstance(got, Evidence) and got.quality is not Quality.GOOD:
        return Confidence.THIN
    return Confidence.MEASURED


_POST_FIXES = (
    Fix(
        "Make post-processing cheap",
        ("Detection models: run NMS on the GPU (torchvision.ops.batched_nms on CUDA tensors) and keep fewer candidates "
         "(a higher confidence threshold, a lower max_det / top-k before NMS); ultralytics: raise conf, lower max_det",
         "Move results to the CPU once, as one tensor (not per box or per token), and format them there",
         "LLMs: detokenise incrementally and stream; do not re-decode the whole sequence each step",
         "llama.cpp's sampler (its 'sample time'): a grammar (GBNF, a JSON schema) is checked against the vocabulary "
         "on the CPU at every token; simplify or drop it, and cut the sampler chain (repetition penalties over a long "
         "window, top-k over the whole vocabulary)"),
        Risk.NEEDS_VALIDATION,
    ),
    Fix(
        "Keep it off the request path",
        ("Run post-processing in a worker pool or on another thread so the model's next batch starts",),
        Risk.SAFE,
    ),
)


_PRE_FIXES = (
    Fix(
        "Take pre-processing off the CPU request path",
        ("Do resize/normalise as one fused GPU op (a Triton/CUDA kernel or torch ops on the device); "
         "decode JPEG on the GPU with torchvision.io.decode_jpeg(device='cuda') or NVIDIA DALI",
         "Or run it in a process pool / DataLoader workers so it overlaps the model"),
        Risk.NEEDS_VALIDATION,
    ),
    Fix(
        "Make the CPU path cheaper",
        ("Replace PIL with pillow-simd or OpenCV (cv2.resize with INTER_LINEAR)",
         "Resize once to the model's input size; avoid float64 and per-pixel Python loops"),
        Risk.SAFE,
    ),
)
_ENSEMBLE_FIX = Fix(
    "Let the ensemble's processing model keep pace with the main model",
    ("Triton: more instances of that pre- or post-processing model (instance_group count) and dynamic batching on "
     "it; measure it alone with perf_analyzer -m <that model>",
     "Make its work cheaper: on the GPU (DALI's mixed/GPU operators for image decoding and resizing) or in a "
     "compiled backend rather than a Python one"),
    Risk.NEEDS_VALIDATION,
)
_KOBOLD_INIT_FIX = Fix(
    "Find what koboldcpp's Init spends its time on",
    ("Init is its preparation before the prompt is processed: tokenising, scanning stop and banned-token lists "
     "over the vocabulary, loading a grammar, fast-forwarding or shifting the context, encoding images: send the "
     "same request without grammar, banned tokens or images and compare the Init",
     "Profile it (py-spy dump / perf top on the server while Init runs) and report the slow part upstream"),
    Risk.SAFE,
)


class PreprocessDominatesLatency(Rule):
    """Pre- or post-processing takes a large share of each request's latency.

    What it detects: the ``preprocess`` stage (decode, resize, normalise, tokenise, parse) and the
    ``postprocess`` stage (NMS, decoding boxes or masks, detokenising, formatting, llama.cpp's sampler: its
    ``sample time``, apart from eval; koboldcpp's ``Init`` before prompt processing counts as
    pre-processing) together are a
    large share of end-to-end time, from a stage-timing log, a stage table, spans (ultralytics'
    ``Speed: 1.2ms preprocess, 5.4ms inference, 240ms postprocess per image``), or a before/after
    comparison where only the pre-processing path changed (its delta is a measured lower bound).

    Why it matters: pre-processing usually runs on the CPU in the request path, serialised behind
    the GIL, while the accelerator waits; a faster GPU or model changes nothing.

    How it decides: ``stage.preprocess.share`` plus ``stage.postprocess.share`` is at least
    ``min_share``; the message and the fixes follow the larger of the two. Impact is their sum. In a
    Triton ensemble (``bench.composing_models``) every request passes its processing model, so it must
    take at least ``min_ensemble_share``, more than the models it feeds, and its fix is that model's.

    Evidence: stage.preprocess.share or stage.postprocess.share; optionally stage.postprocess_ms.*,
    stage.preprocess_ms.p50, stage.preprocess_ms.mean,
    stage.preprocess_ms.p99, latency.e2e_ms.mean, latency.e2e_ms.p50, compare.speedup_ratio,
    cpu.preprocess_share, bench.composing_models (a Triton ensemble's models: the message names them and
    the ensemble's fix, more instances of that model, leads).

    Fix: move the work to the GPU (a fused kernel, ``torchvision.io.decode_jpeg(device='cuda')``,
    DALI), a process pool, or a faster library; batch it; cache it.

    False positives: a pipeline whose pre-processing is already on the GPU shows up here when the
    stage is named ``preprocess``; the fix then is kernel fusion, not moving work off the CPU.
    """

    code = "STG001"
    name = "preprocess-dominates-latency"
    category = Category.CPU_PREPROCESSING
    requires = ()
    requires_any = (("stage.preprocess.share",), ("stage.postprocess.share",))
    optional = (
        "stage.preprocess.share", "stage.postprocess.share", "stage.preprocess_ms.p50", "stage.preprocess_ms.mean",
        "stage.preprocess_ms.p99", "stage.postprocess_ms.p50", "stage.postprocess_ms.mean", "latency.e2e_ms.p50",
        "latency.e2e_ms.mean", "compare.speedup_ratio", "cpu.preprocess_share", "bench.composing_models",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.2  # a fifth of every request spent preparing inputs is more than a GPU pipeline needs
        # a Triton ensemble's processing model: every request passes it, so a share of the time is its work by design
        min_ensemble_share: float = 0.5  # it is the bottleneck when it takes more of the time than the models it feeds

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        pre = ev.value("stage.preprocess.share", 0.0) or 0.0
        post = ev.value("stage.postprocess.share", 0.0) or 0.0
        if pre + post < t.min_share:
            return None
        if "bench.composing_models" in ev and pre + post < t.min_ensemble_share:
            return None
        if post > pre:
            return self._post(ev, pre, post)
        share = pre
        got = ev.get("stage.preprocess.share")
        detail = got.detail if isinstance(got, Evidence) else ""
        lower = detail.startswith("lower bound")
        ms = ev.value("stage.preprocess_ms.p50") or ev.value("stage.preprocess_ms.mean")
        e2e = ev.value("latency.e2e_ms.p50") or ev.value("latency.e2e_ms.mean")
        of = "end-to-end latency"
        if "bench.composing_models" in ev:  # shares of the ensemble's server-side time
            e2e, of = ev.value("latency.server_ms.mean") or e2e, "the ensemble's server-side time"
        msg = f"Pre-processing is {'at least ' if lower else ''}{pct(share)} of {of}"
        if ms is not None and e2e is not None:
            msg += f" ({'≥ ' if lower else ''}{fmt_ms(ms)} of {fmt_ms(e2e)} per item)"
        msg += "."
        if lower:
            msg += f" Measured as a before/after delta: {detail.removeprefix('lower bound: ')}."
        speed = ev.value("compare.speedup_ratio")
        if speed is not None and lower:
            msg += f" The faster path is {speed:.2f}× the throughput."
        fixes = list(_PRE_FIXES)
        ensemble = ev.get("bench.composing_models")
        if isinstance(ensemble, Evidence):  # a model of the ensemble: its own fix, not a library to move to
            msg += f" By composing model: {ensemble.detail.partition(': ')[2]}."
            fixes = [_ENSEMBLE_FIX]
        elif detail.startswith("koboldcpp"):  # an LLM server's preparation, not an image pipeline
            fixes = [_KOBOLD_INIT_FIX]
        return self.finding(
            severity=severity_for(share),
            confidence=_confidence(ev, "stage.preprocess.share"),
            title="Pre-processing is a large share of latency",
            message=msg,
            impact=share,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"preprocess |{bar(share)}| {pct(share)}{' (lower bound)' if lower else ''}",
            fixes=fixes,
        )

    def _post(self, ev: EvidenceSet, pre: float, post: float) -> Finding:
        ms = ev.value("stage.postprocess_ms.p50") or ev.value("stage.postprocess_ms.mean")
        e2e = ev.value("latency.e2e_ms.p50") or ev.value("latency.e2e_ms.mean")
        of = "end-to-end latency"
        if "bench.composing_models" in ev:
            e2e, of = ev.value("latency.server_ms.mean") or e2e, "the ensemble's server-side time"
        msg = f"Post-processing is {pct(post)} of the time" + (f" ({fmt_ms(ms)} per item)" if ms is not None else "")
        if e2e is not None and ms is not None:
            msg = f"Post-processing is {pct(post)} of {of} ({fmt_ms(ms)} of {fmt_ms(e2e)} per item)"
        if pre >= 0.01:
            msg += f"; pre-processing adds {pct(pre)}"
        msg += (". It runs on the CPU after the model (NMS over many candidate boxes, decoding masks, detokenising, an "
                "LLM's sampler), so the accelerator waits and a faster model changes nothing.")
        fixes = list(_POST_FIXES)
        ensemble = ev.get("bench.composing_models")
        if isinstance(ensemble, Evidence):
            msg += f" By composing model: {ensemble.detail.partition(': ')[2]}."
            fixes = [_ENSEMBLE_FIX]
        return self.finding(
            severity=severity_for(pre + post),
            confidence=_confidence(ev, "stage.postprocess.share"),
            title="Post-processing is a large share of latency",
            message=msg,
            impact=min(1.0, pre + post),
            evidence=present(ev, *self.optional),
            why=f"postprocess |{bar(post)}| {pct(post)}",
            fixes=fixes,
        )


_PINNED_FIX = Fix("Copy from pinned memory, asynchronously",
                  ("DataLoader(pin_memory=True) or tensor.pin_memory(); .to('cuda', non_blocking=True)",), Risk.SAFE)
_ON_DEVICE_FIX = Fix("Keep data on the device",
                     ("ONNX Runtime: bind inputs/outputs on the device (io_binding) so nothing round-trips",
                      "Triton: pass tensors in CUDA shared memory (perf_analyzer --shared-memory cuda; the client's "
                      "cudashm utilities) rather than over gRPC/HTTP",
                      "Do pre/post-processing on the GPU so only the final result is copied back"),
                     Risk.NEEDS_VALIDATION)
_SMALLER_FIX = Fix("Move fewer bytes",
                   ("Return FP16 or a reduced output (crop, top-k, argmax on the device) instead of the full tensor",
                    "Check the link: nvidia-smi -q -d PCI (the current generation and width against the maximum)"),
                   Risk.NEEDS_VALIDATION)


class TransferDominatesLatency(Rule):
    """Host↔device copies take a large share of each request's latency.

    What it detects: the ``h2d`` and ``d2h`` stages together are a large share of end-to-end time (a
    stage log, spans, a stage table, or trtexec's H2D and D2H Latency beside its GPU Compute Time).

    Why it matters: copies from pageable memory are slow and synchronous; redundant round trips
    (device → host → device) double them; the GPU idles while they run.

    How it decides: ``stage.h2d.share`` + ``stage.d2h.share`` is at least ``min_share``.

    Evidence: stage.h2d.share or stage.d2h.share; optionally stage.h2d_ms.p50, stage.d2h_ms.p50,
    latency.e2e_ms.p50.

    Fix: pinned memory (``pin_memory=True``, ``tensor.pin_memory()``) and ``non_blocking=True``;
    keep data on the device between stages (ONNX Runtime I/O binding); copy once, in bulk.

    False positives: large outputs that must come back to the host (images, embeddings) are real
    work; the fix then is to shrink them (fp16, compression) rather than to avoid the copy.
    """

    code = "STG002"
    name = "transfer-dominates-latency"
    category = Category.PCIE_TRANSFER
    requires = ()
    requires_any = (("stage.h2d.share",), ("stage.d2h.share",))
    optional = ("stage.h2d.share", "stage.d2h.share", "stage.h2d_ms.p50", "stage.d2h_ms.p50", "latency.e2e_ms.p50",
                "bench.engine_alone")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.2  # copies above a fifth of latency: the link, not the model, sets the pace

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        h2d = ev.value("stage.h2d.share", 0.0) or 0.0
        d2h = ev.value("stage.d2h.share", 0.0) or 0.0
        share = h2d + d2h
        if share < t.min_share:
            return None
        fixes = [_PINNED_FIX, _ON_DEVICE_FIX]
        message = (f"Copies take {pct(share)} of end-to-end latency (host→device {pct(h2d)}, device→host "
                   f"{pct(d2h)}).")
        if "bench.engine_alone" in ev:  # trtexec copies from pinned buffers already: what is left is the size
            message = (f"Copies take {pct(share)} of each inference of the engine timed alone (host→device "
                       f"{pct(h2d)}, device→host {pct(d2h)}), from pinned host buffers already: the tensors' size "
                       "over the link sets it.")
            fixes = [_SMALLER_FIX, _ON_DEVICE_FIX]
        return self.finding(
            severity=severity_for(share),
            confidence=_confidence(ev, "stage.h2d.share" if h2d >= d2h else "stage.d2h.share"),
            title="Host↔device copies are a large share of latency",
            message=message,
            impact=share,
            evidence=present(ev, *self.optional),
            why=f"h2d |{bar(h2d)}| {pct(h2d)}\nd2h |{bar(d2h)}| {pct(d2h)}",
            fixes=fixes,
        )


class StageDominatesTail(Rule):
    """One stage accounts for most of the gap between median and tail latency.

    What it detects: p99 latency well above p50, and one stage whose own p99 − p50 spread explains
    most of that gap.

    Why it matters: the tail is what users and SLOs see; it usually has one cause (queueing
    bursts, a slow pre-processing path for large inputs, recompiles), and per-stage percentiles name
    it directly.

    How it decides: ``latency.e2e_ms.p99`` is at least ``min_tail_ratio`` × ``latency.e2e_ms.p50``
    and at least ``min_tail_gap_ms`` above it (a 13 ms median with a 40 ms p99 on a busy host is
    jitter, not a bottleneck), and a stage's ``stage.<s>_ms.p99 − stage.<s>_ms.p50`` is at least
    ``min_explained`` of the end-to-end gap. The finding takes that stage's category (queue → queueing, preprocess →
    cpu_preprocessing, h2d/d2h → pcie_transfer, prefill → prefill_ttft, compute/decode →
    gpu_compute). Impact is the tail gap's share of p99 times the explained share.

    Evidence: latency.e2e_ms.p50, latency.e2e_ms.p99, stage.<s>_ms.p50 and stage.<s>_ms.p99 of the
    stages above.

    Fix: depends on the stage; the finding names it and the matching rule's fix applies.

    False positives: stage spreads do not add up exactly (the slowest requests of each stage need
    not be the same requests); with few requests p99 is one request.
    """

    code = "STG003"
    name = "stage-dominates-tail"
    category = Category.QUEUEING  # the actual category is the dominating stage's
    requires = ("latency.e2e_ms.p50", "latency.e2e_ms.p99")
    optional = ("requests.count",)

    @dataclass(frozen=True)
    class Thresholds:
        min_tail_ratio: float = 2.0  # p99 at least twice p50: the tail is a problem of its own
        min_explained: float = 0.5  # one stage explains at least half of the gap
        min_requests: float = 20  # fewer requests make p99 a single request
        min_tail_gap_ms: float = 100.0  # a p99 within 100 ms of the median is not what users page about

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        p50 = ev.value("latency.e2e_ms.p50", 0.0) or 0.0
        p99 = ev.value("latency.e2e_ms.p99", 0.0) or 0.0
        n = ev.value("requests.count")
        if p50 <= 0 or p99 < t.min_tail_ratio * p50 or (n is not None and n < t.min_requests):
            return None
        gap = p99 - p50
        if gap < t.min_tail_gap_ms:
            return None
        best: tuple[float, str] | None = None
        for stage in STAGE_CATEGORY:
            s50, s99 = ev.value(f"stage.{stage}_ms.p50"), ev.value(f"stage.{stage}_ms.p99")
            if s50 is None or s99 is None:
                continue
            explained = (s99 - s50) / gap
            if best is None or explained > best[0]:
                best = (explained, stage)
        if best is None or best[0] < t.min_explained:
            return None
        explained, stage = best
        explained = min(1.0, explained)
        impact = (gap / p99) * explained
        category = STAGE_CATEGORY[stage]
        s50, s99 = ev.value(f"stage.{stage}_ms.p50") or 0.0, ev.value(f"stage.{stage}_ms.p99") or 0.0
        finding = self.finding(
            severity=severity_for(impact),
            confidence=Confidence.MEASURED if n is None or n >= 100 else Confidence.THIN,
            title=f"The {stage} stage makes the latency tail",
            message=(f"p99 latency is {fmt_ms(p99)} against a median of {fmt_ms(p50)}; the {stage} stage goes from "
                     f"{fmt_ms(s50)} at p50 to {fmt_ms(s99)} at p99, {pct(explained)} of that gap."),
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional, f"stage.{stage}_ms.p50", f"stage.{stage}_ms.p99"),
            why=f"{stage} |{bar(explained)}| {pct(explained)} of the p99-p50 gap",
            fixes=[Fix(f"Fix the {stage} stage's slow cases first",
                       (f"See the findings of category {category.value} for the concrete change",
                        f"Compare the slowest requests' {stage} time with their inputs (size, length) to find the "
                        "trigger"), Risk.SAFE)],
        )
        return dataclasses.replace(finding, category=category)


RULES: tuple[type[Rule], ...] = (PreprocessDominatesLatency, TransferDominatesLatency, StageDominatesTail)
