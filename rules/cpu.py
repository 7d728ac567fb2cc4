"""CPU-side work in the request path: pre/post-processing and serialisation."""

from __future__ import annotations

import re
from dataclasses import dataclass

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Risk
from diagnose.rules.base import Rule, bar, present, ramp, ramp_for, severity_for, stderr
from diagnose.units import pct


def _top_list(ev: EvidenceSet, key: str, n: int = 3) -> str:
    got = ev.get(key)
    if not isinstance(got, Evidence) or not isinstance(got.value, list) or not got.value:
        return ""
    items = []
    for item in got.value[:n]:
        if isinstance(item, dict):
            items.append(f"{item.get('function', '?')} {pct(float(item.get('share', 0.0)))}")
        else:
            items.append(str(item))
    return "; ".join(items)


# a hot frame that tokenises or detokenises text (a tokenizer library, or a function named so)
_TEXT_WORK = re.compile(r"(?i)detokeni[sz]e|tokeni[sz]e|tokenizer|token_to_piece|sentencepiece|tiktoken|"
                        r"tokenizers|convert_ids_to_tokens|batch_decode")


def _text_work_share(ev: EvidenceSet) -> float:
    """The share of active CPU time in the hottest pre-processing frames that (de)tokenise text."""
    got = ev.get("cpu.top.preprocess")
    if not isinstance(got, Evidence) or not isinstance(got.value, list):
        return 0.0
    return sum(float(item.get("share", 0.0)) for item in got.value
               if isinstance(item, dict) and _TEXT_WORK.search(str(item.get("function", ""))))


def _text_cause(ev: EvidenceSet) -> str:
    """What the hot (de)tokenising frame is, and why it costs, in one sentence."""
    got = ev.get("cpu.top.preprocess")
    items = got.value if isinstance(got, Evidence) and isinstance(got.value, list) else []
    top = next((str(i.get("function", "")) for i in items
                if isinstance(i, dict) and _TEXT_WORK.search(str(i.get("function", "")))), "")
    if "llama_cpp" in top and "detokeni" in top.lower():
        return (f"{top} — llama-cpp-python detokenises the whole answer again for every streamed token, so the "
                "cost per token grows with the answer's length (long streams slow down as they go).")
    if "detokeni" in top.lower() or "decode" in top.lower():
        return f"{top} — turning tokens back into text; decoding the whole sequence per step grows with its length."
    return f"{top} — turning text into tokens on the request thread."


def _text_fixes(ev: EvidenceSet) -> tuple[str, ...]:
    """The (de)tokenising fixes, the library that is hot first."""
    steps = [
        "Own code: decode only the new token's piece (keep the text so far; transformers' TextStreamer and vLLM's "
        "incremental detokenizer do this), never the whole sequence per step",
        "Hugging Face tokenizers: the fast (Rust) tokenizer (use_fast=True), batched encode/decode calls; tokenise in "
        "a process pool when requests are large",
    ]
    got = ev.get("cpu.top.preprocess")
    if isinstance(got, Evidence) and "llama_cpp" in str(got.value):
        steps.insert(0, "llama-cpp-python (0.3.36, the version recorded): its completion loop detokenises the whole "
                     "answer for every streamed token (Llama._create_completion calls detokenize(completion_tokens) "
                     "per token), so each token costs more than the last: serve long answers with llama.cpp's C++ "
                     "llama-server (it detokenises each token once), or cap max_tokens")
    return tuple(steps)


def _confidence(ev: EvidenceSet, min_samples: float) -> Confidence:
    if "cpu.profile_total_s" in ev:  # a deterministic profile (cProfile) timed every call: no sampling error
        return Confidence.MEASURED
    samples = ev.value("cpu.active_samples", 0.0) or 0.0
    return Confidence.MEASURED if samples >= min_samples else Confidence.THIN


def _whose(ev: EvidenceSet) -> str:
    """Whose time the shares divide: a live service's active CPU time, or a pasted profile's."""
    total = ev.value("cpu.profile_total_s")
    return (f"the profiled program's {total:g} s (cProfile)" if total is not None
            else "the service's active CPU time")


class CpuPreprocessing(Rule):
    """CPU pre/post-processing dominates the busy request path.

    What it detects: the service's Python threads spend most of their *active* time decoding,
    resizing, normalising, tokenising or otherwise preparing inputs (or post-processing outputs)
    rather than running the model, while the service is busy.

    Why it matters: pre-processing on the CPU serialises behind the GIL and starves the model
    (on a GPU box, utilisation sits at 30-50 %); adding GPU capacity changes nothing.

    How it decides: ``cpu.preprocess_share`` (share of active py-spy samples classified as
    pre/post-processing, idle samples excluded) is at least ``min_share`` and the service is busy:
    ``workers.active_mean`` (Python threads running on average) is at least ``min_active``.
    The estimated impact is the share itself: the part of the busy time a fix can remove. Both
    thresholds ramp rather than cut: the impact grows from nothing at ``min_share`` to the full share
    ``share_band`` above it (or twice the share's own uncertainty, ``cpu.preprocess_share.stderr``,
    when larger), and from ``min_active`` to 0.1 threads above it.

    Evidence: cpu.preprocess_share, workers.active_mean; optionally cpu.top.preprocess,
    cpu.forward_share, proc.cpu_cores_used, cpu.active_samples, cpu.profile_total_s.

    A pasted cProfile / pstats table gives the same shares (``diagnose.derive.pstats_table``): the profiled
    thread's time by activity, a DataLoader's fetch or a tokenizer's cumulative time counted whole; so does a pasted
    ``py-spy top`` view (``diagnose.derive.pyspy_top``), its functions' own and total times.

    When the hottest pre-processing frames (``cpu.top.preprocess``) that tokenise or detokenise
    text are at least ``text_share`` of the pre-processing, the finding says so and gives the text
    fixes instead of the image ones.

    Fix: move decode/resize/normalise off the request thread (a process pool or DataLoader
    workers), onto the GPU (torchvision.io.decode_jpeg(device="cuda"), NVIDIA DALI), or
    into a faster library (pillow-simd, OpenCV, a fused Triton kernel); batch it; cache it.
    For text: detokenise incrementally (llama-cpp-python 0.3.36 detokenises the whole answer per
    streamed token), use fast tokenizers, batch them.

    False positives: a service that is idle most of the time (the share of a tiny active time is
    meaningless, hence ``min_active``); start-up work (weight loading) captured in the window.
    """

    code = "CPU001"
    name = "cpu-preprocessing-bound"
    category = Category.CPU_PREPROCESSING
    requires = ("cpu.preprocess_share", "workers.active_mean")
    optional = ("cpu.preprocess_share.stderr", "cpu.top.preprocess", "cpu.forward_share", "proc.cpu_cores_used",
                "cpu.active_samples", "cpu.profile_total_s")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.30  # below a third of active time, pre-processing is not what limits throughput
        share_band: float = 0.05  # full impact 5 pp (or 2 standard errors) above min_share
        min_active: float = 0.5  # Python threads busy under half the time: the service has headroom
        min_samples: float = 200  # fewer active samples than this (2 s at 100 Hz) is a thin profile
        text_share: float = 0.5  # (de)tokenising is half the pre-processing or more: the text fixes, not images'

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        share = ev.value("cpu.preprocess_share", 0.0) or 0.0
        active = ev.value("workers.active_mean", 0.0) or 0.0
        weight = ramp_for(ev, "cpu.preprocess_share", t.min_share, t.share_band) * ramp(active, t.min_active, 0.1)
        if weight <= 0:
            return None
        forward = ev.value("cpu.forward_share")
        top = _top_list(ev, "cpu.top.preprocess")
        msg = (
            f"{pct(share)} of {_whose(ev)} is pre/post-processing"
            + (f" (model forward: {pct(forward)})" if forward is not None else "")
            + f", with {active:.1f} Python threads busy on average."
            + (f" Hottest: {top}." if top else "")
            + (f" Just above the threshold (±{stderr(ev, 'cpu.preprocess_share'):.2f}): impact scaled to "
               f"{pct(weight)}." if weight < 1 else "")
        )
        why = f"preprocess |{bar(share)}| {pct(share)}"
        if forward is not None:
            why += f"\nforward    |{bar(forward)}| {pct(forward)}"
        text_work = _text_work_share(ev)
        if text_work >= t.text_share * share:  # the hot part is (de)tokenising text: image advice would mislead
            return self.finding(
                severity=severity_for(share * weight),
                confidence=_confidence(ev, t.min_samples),
                title="Tokenising or detokenising text starves the model",
                message=msg + (" Most of it is (de)tokenising text on the request thread: "
                               + _text_cause(ev)),
                impact=share * weight,
                evidence=present(ev, *self.requires, *self.optional),
                why=why,
                fixes=[Fix("Detokenise incrementally, tokenise fast", _text_fixes(ev), Risk.NEEDS_VALIDATION)],
            )
        return self.finding(
            severity=severity_for(share * weight),
            confidence=_confidence(ev, t.min_samples),
            title="CPU pre-processing starves the model",
            message=msg,
            impact=share * weight,
            evidence=present(ev, *self.requires, *self.optional),
            why=why,
            fixes=[
                Fix(
                    "Take pre-processing off the request thread",
                    (
                        "Run decode/resize/normalise in a process pool (concurrent.futures."
                        "ProcessPoolExecutor) or DataLoader workers so it escapes the GIL",
                        "Batch requests before the model so the per-request CPU work overlaps "
                        "the previous batch's forward",
                    ),
                    Risk.SAFE,
                ),
                Fix(
                    "Do the work on the GPU or in a faster library",
                    (
                        "Decode JPEG on the GPU: torchvision.io.decode_jpeg(data, device='cuda') or "
                        "NVIDIA DALI; resize/normalise as tensor ops on the device",
                        "Or swap PIL for pillow-simd / OpenCV (cv2.imdecode, cv2.resize)",
                    ),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )


class SerializationOverhead(Rule):
    """Serialising requests and responses eats the request path.

    What it detects: a large share of active CPU time in json, pydantic, protobuf, base64,
    msgpack or pickle encoding/decoding while the service is busy.

    Why it matters: returning tensors as JSON lists or base64 strings costs more CPU than the model
    for small models, and it holds the GIL.

    How it decides: ``cpu.serialize_share`` is at least ``min_share`` and
    ``workers.active_mean`` is at least ``min_active``; both ramp up as CPU001's do (over
    ``share_band`` or twice ``cpu.serialize_share.stderr``, and 0.1 threads), scaling the impact.

    Evidence: cpu.serialize_share, workers.active_mean; optionally cpu.top.serialize,
    cpu.active_samples, cpu.profile_total_s.

    Fix: return binary payloads (raw bytes, numpy ``tobytes``, Arrow) instead of JSON lists; use
    orjson or msgspec; pydantic v2 ``model_validate_json``; avoid base64 round trips.

    False positives: a service whose real work is small and whose clients require JSON; then
    the finding is right but the fix is in the API contract.
    """

    code = "CPU002"
    name = "serialization-overhead"
    category = Category.CPU_PREPROCESSING
    requires = ("cpu.serialize_share", "workers.active_mean")
    optional = ("cpu.top.serialize", "cpu.active_samples", "cpu.profile_total_s")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.20  # a fifth of active time in encoders is more than any API needs
        share_band: float = 0.05  # full impact 5 pp (or 2 standard errors) above min_share
        min_active: float = 0.5  # the service is busy enough for the cost to limit throughput
        min_samples: float = 200  # thin-profile limit, as for CPU001

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        share = ev.value("cpu.serialize_share", 0.0) or 0.0
        active = ev.value("workers.active_mean", 0.0) or 0.0
        weight = ramp_for(ev, "cpu.serialize_share", t.min_share, t.share_band) * ramp(active, t.min_active, 0.1)
        if weight <= 0:
            return None
        top = _top_list(ev, "cpu.top.serialize")
        return self.finding(
            severity=severity_for(share * weight),
            confidence=_confidence(ev, t.min_samples),
            title="Serialisation eats the request path",
            message=(
                f"{pct(share)} of {_whose(ev)} is spent serialising or parsing payloads"
                f" (json/pydantic/protobuf/base64) with {active:.1f} Python threads busy on average."
                + (f" Hottest: {top}." if top else "")
            ),
            impact=share * weight,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"serialize |{bar(share)}| {pct(share)}",
            fixes=[
                Fix(
                    "Use a binary payload or a faster encoder",
                    (
                        "Return tensors as bytes (numpy tobytes / safetensors) instead of JSON lists",
                        "Switch json to orjson or msgspec; in pydantic v2 use model_validate_json",
                    ),
                    Risk.NEEDS_VALIDATION,
                )
            ],
        )


RULES: tuple[type[Rule], ...] = (CpuPreprocessing, SerializationOverhead)
