"""What an incident report says, judged: one rule per bottleneck the text can point at.

These rules read only ``report.*`` evidence (``analyzer/derive/claims.py``): what a pasted report
states — numbers tied to concepts ("GPU util 2 %", "first request 40 s, then 200 ms") and the fixed
messages frameworks print ("offloaded 0/29 layers to GPU"). Each rule lists its signals, strongest
first; the finding's impact is the strongest signal present, and its confidence is *heuristic*: a
measured source (a profile, an engine's own stats, an allocator message) outranks it. Every rule
says which sentence of the report it rests on.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from diagnose.model import (
    HOST_NO_GPU,
    Category,
    Confidence,
    Evidence,
    EvidenceSet,
    Finding,
    Fix,
    Quality,
    Risk,
    Severity,
)
from diagnose.rules import advice
from diagnose.rules.base import Rule, fmt_ms, gpu_in_view, present, severity_for
from diagnose.rules.memory import OomWeights, read_mem, room_for_request, weights_too_big
from diagnose.units import pct, size


@dataclass(frozen=True)
class Signal:
    """One reason to believe the rule's bottleneck: how strongly, and in words with its numbers."""

    impact: float
    says: str


def _n(ev: EvidenceSet, key: str) -> float:
    return ev.value(key, 0.0) or 0.0


def _quote(ev: EvidenceSet, key: str) -> str:
    got = ev.get(key)
    if isinstance(got, Evidence) and ":" in got.detail:
        return got.detail.split(":", 1)[1].strip()
    return ""


def _q(ev: EvidenceSet, key: str) -> str:
    """`` ("the sentence")`` the evidence at ``key`` quotes, or nothing."""
    quote = _quote(ev, key)
    return f" ({quote})" if quote else ""


_OOM_CATEGORIES = (Category.OOM_PEAK, Category.OOM_WEIGHTS, Category.OOM_FRAGMENTATION, Category.OOM_EXTERNAL)


def _oom_message(ev: EvidenceSet) -> bool:
    """An out-of-memory message (an allocator's or an engine's, not a mention in prose) is in the evidence."""
    got = ev.get("mem.oom_count")
    return isinstance(got, Evidence) and got.quality is not Quality.LOW


# a change's title that says it fixes something: "[fix] …", "[Bugfix] …", "fix: …", "fix(scope): …", an imperative
# "Fix …" that asks nothing ("Fix vLLM using 90% of GPU memory when idle?" is a question; "Fixed-size batches" no fix)
_FIX_TITLE = re.compile(r"\s*(?:\[(?:bug|hot)?fix\]|(?:bug|hot)?fix(?:\([^)]*\))?\s*!?:|fix\s(?!.*\?\s*$))",
                        re.IGNORECASE)


def _title_mentions(ev: EvidenceSet, *concepts: str) -> bool:
    got = ev.get("report.title_concepts")
    return isinstance(got, Evidence) and isinstance(got.value, list) and any(c in got.value for c in concepts)


class ReportRule(Rule):
    """Shared shape of the report rules: signals → the strongest one → a heuristic finding.

    Beyond its own signals every report rule takes two the reporter gives directly: a sentence that
    names the rule's bottleneck as the cause ("it's due to the preprocessor", ``report.cause.*``:
    ``CAUSE``) and an issue title naming it (``TITLE`` when nothing else is said, a ``TITLE_BONUS``
    on top of any other signal; a title alone names no other bottleneck beside an out-of-memory message the text
    shows, or where an out-of-memory error is the title's own subject: its words then say when or where the failure
    came). A rule steps aside when a source that measures its bottleneck is
    present (``measured_by``) or the report withdraws itself.
    """

    title_concepts: tuple[str, ...] = ()  # a title naming one of these concepts strengthens the case
    TITLE_BONUS = 0.1  # what an issue's title names is what its reporter is sure of
    # evidence keys (a trailing "." for a prefix) of a source that measures this bottleneck itself:
    # when one is present, its rules
    # judge and the prose steps aside (a compile log that shows two recompiles is not a storm, however
    # often the text says "recompile")
    measured_by: tuple[str, ...] = ()
    cause: str = ""  # the report.cause.* key naming this rule's bottleneck as the cause
    # evidence keys of a source that measured what the title names: a title alone then says nothing more
    title_measured_by: tuple[str, ...] = ()
    CAUSE = 0.6  # the reporter names it as the cause
    TITLE = 0.45  # the title names it, with nothing else said
    LEAN_BASE = 0.15  # what the wording alone is worth: less than any explicit signal ...
    LEAN_SPAN = 0.3  # ... growing with how clearly it leans, up to 0.45

    @classmethod
    def missing_reason(cls, ev: EvidenceSet) -> str | None:
        """Also judges when the report only names the cause, only its title names the bottleneck, or
        only its wording leans to it (``report.cues``)."""
        has_required = all(k in ev for k in cls.requires)
        if has_required and ((cls.cause and cls.cause in ev) or "report.cues" in ev
                             or (cls.title_concepts and _title_mentions(ev, *cls.title_concepts))):
            return None
        return super().missing_reason(ev)

    def signals(self, ev: EvidenceSet, t: object) -> list[Signal]:  # pragma: no cover - abstract
        raise NotImplementedError

    def lean_finding(self, ev: EvidenceSet, p: float, cues: Sequence[str]) -> Finding:
        """The finding when only the report's wording points here (``diagnose.rules.report_model`` decided)."""
        impact = self.LEAN_BASE + self.LEAN_SPAN * p
        return self.finding(
            severity=severity_for(impact),
            confidence=Confidence.HEURISTIC,
            title=self.headline,
            message=(f"The report's wording reads as {self.category} ({pct(p)} by cue weights fitted on the "
                     f"real-incident corpus; strongest cues: {', '.join(cues) or 'none single'}); nothing it "
                     "pasted measures it: confirm with the next steps."),
            impact=impact,
            evidence=present(ev, "report.cues"),
            fixes=self.fixes(ev),
        )

    def fixes(self, ev: EvidenceSet) -> list[Fix]:  # pragma: no cover - abstract
        raise NotImplementedError

    headline: str = ""

    def corroborated(self, ev: EvidenceSet, t: object = None) -> str:
        """What the measuring source shows of this bottleneck below its own rules' bar, in words, or "".

        A pasted log with one recompile does not make CMP002's pattern, but it shows the thing the
        report says recurs: the report rule then judges on the report, and says what was measured.
        """
        return ""

    def check(self, ev: EvidenceSet, t: object) -> Finding | None:
        measured = any(ev.has_prefix(k) if k.endswith(".") else k in ev for k in self.measured_by)
        seen = self.corroborated(ev, t) if measured else ""
        if (measured and not seen) or _n(ev, "report.retraction_statements"):
            return None  # measured elsewhere, or the reporter withdrew it (HLT003 says so)
        found = self.signals(ev, t)
        if self.cause and _n(ev, self.cause):
            found.append(Signal(self.CAUSE, f"names it as the cause{_q(ev, self.cause)}"))
        titled = bool(self.title_concepts) and _title_mentions(ev, *self.title_concepts)
        if titled and not found and self.category not in _OOM_CATEGORIES and (_oom_message(ev)
                                                                            or _title_mentions(ev, "oom")):
            # the failure is an out-of-memory error the text shows, or the title's own subject: the title's other
            # words say when or where it came ("CUDA out of memory during vLLM sampler warmup", "OOM with long
            # prompts", "Out of memory error running on a T4"), not another bottleneck
            titled = False
        title_only = titled and not found
        if title_only and any(k in ev for k in self.title_measured_by):
            return None  # what the title names was measured, and its rules judge it
        if title_only:
            found.append(Signal(self.TITLE, f"names it in its title{_q(ev, 'report.title_concepts')}"))
        found.sort(key=lambda s: -s.impact)
        if not found:
            return None
        impact = found[0].impact
        if titled:
            impact = min(0.95, impact + self.TITLE_BONUS)
        message = "The report " + "; it also ".join(s.says for s in found[:3]) + "." + (f" {seen}" if seen else "")
        return self.finding(
            severity=severity_for(impact),
            confidence=Confidence.HEURISTIC,
            title=self.headline,
            message=message,
            impact=impact,
            # a title alone shows the title: nothing else the rule reads spoke (``title_only``)
            evidence=(present(ev, *TITLE_KEYS) if title_only else
                      present(ev, *self.requires, *self.optional, *(k for g in self.requires_any for k in g))),
            fixes=self.fixes(ev),
        )


class PlacementReported(ReportRule):
    """The report shows the work running on the CPU (or the wrong GPU) while a GPU is meant to do it.

    What it detects: framework messages that mean the model runs on the CPU (``FP16 is not supported
    on CPU``, ONNX Runtime without ``CUDAExecutionProvider``, ``BLAS = 0``, ollama's ``runners=[cpu]``
    or ``100% CPU``), llama.cpp/ollama offloading few of the model's layers to the GPU, a device set
    to ``cpu`` in code, statements that the GPU is not used, the CPU stated busy while the GPU
    is stated idle, ollama keeping part of the model in system memory (``ollama ps``' PROCESSOR
    "42%/58% CPU/GPU"), or an engine started with part of its weights in host memory (vLLM's and SGLang's
    ``--cpu-offload-gb N``, llama.cpp's ``--n-cpu-moe N`` or ``-ot …=CPU``).

    Why it matters: a model on the CPU is 10-100× slower than on the GPU it was meant for; tuning
    anything else is wasted until the work is on the right device.

    How it decides: the strongest of: layers offloaded / total below ``max_offloaded_share``
    (impact 1 − that share, at least ``strong``); ollama's CPU share of the model at least ``min_cpu_split``
    with a GPU in view (``strong``); a CPU-fallback message (``strong``), TensorFlow's failure to load
    its CUDA libraries among them where no serving engine is named (``strong``); ONNX Runtime's
    GPU provider leaving ops to the CPU provider for want of a kernel ("CUDA kernel not supported.
    Fallback to CPU execution provider for Op type: …", verbose "… kernel not found in registries for
    Op type: …"; ``stated``: part of the graph, with copies around it); a statement
    that the work runs on the CPU (``stated``); the GPU stated at or below ``idle_gpu_pct`` % while
    the CPU is at or above ``busy_cpu_pct`` % (``stated``); a model ``oversize`` × larger than the
    GPU (its part on each GPU, split by tensor and pipeline parallelism) with no out-of-memory error
    (the rest runs on the CPU; ``stated``); a statement about the
    wrong GPU (``weak``); an offload setting in the engine's command with no out-of-memory message (``stated``: the
    offloaded weights cross PCIe at every step).

    Evidence: any of report.cpu_fallback_messages, report.ep_cpu_node_messages, report.ollama_cpu_share,
    report.tf_gpu_libs_messages (no
    serving engine named: a PyTorch engine's log carries TensorFlow's import noise while its GPU works),
    report.gpu_layers_offloaded (+ report.gpu_layers_total),
    report.placement_statements, report.gpu_util_pct_max + report.cpu_util_pct_max,
    report.wrong_gpu_statements, report.offload_settings, mem.weights_estimate_bytes + gpu.spec_memory_bytes.

    Fix: install the GPU build (llama.cpp with -DGGML_CUDA=ON, `onnxruntime-gpu`, a CUDA torch
    wheel), offload all layers (``-ngl 999`` / ``num_gpu``), put the model and inputs on ``cuda``,
    check ``CUDA_VISIBLE_DEVICES`` and the device index.

    False positives: a model too big for the GPU is offloaded partly on purpose (then the CPU part
    does set the pace, which is the finding); a CPU-only deployment by design. llama.cpp's loader notice that a
    tensor "cannot be used with preferred buffer type ROCm_Host, using CPU instead" is not counted: it picks a
    plain host buffer over the pinned one for tensors that stay on the host by design.
    """

    code = "PLC001"
    name = "placement-reported"
    category = Category.DEVICE_PLACEMENT
    requires = ()
    requires_any = (("report.cpu_fallback_messages",), ("report.ep_cpu_node_messages",), ("report.ollama_cpu_share",),
                    ("report.tf_gpu_libs_messages",), ("report.gpu_layers_offloaded",),
                    ("report.placement_statements",), ("report.gpu_util_pct_max", "report.cpu_util_pct_max"),
                    ("report.wrong_gpu_statements",), ("report.offload_settings",),
                    ("mem.weights_estimate_bytes", "gpu.spec_memory_bytes", "report.slow_statements"))
    optional = ("report.gpu_layers_total", "report.gpu_util_pct_min", "mem.weights_estimate_bytes",
                "gpu.spec_memory_bytes", "mem.tensor_parallel", "mem.pipeline_parallel")
    title_concepts = ("placement_cpu", "offload", "wrong_gpu")
    headline = "The work runs on the CPU, not the GPU"
    cause = "report.cause.placement"

    @dataclass(frozen=True)
    class Thresholds:
        max_offloaded_share: float = 0.5  # under half the layers on the GPU: the CPU runs most of the model
        min_cpu_split: float = 0.25  # a quarter of the model in system memory (ollama's split) takes most of a token
        strong: float = 0.8  # a framework saying so itself
        stated: float = 0.6  # the reporter saying so, or CPU busy with the GPU idle
        weak: float = 0.4  # a statement about which GPU is used
        idle_gpu_pct: float = 10.0  # a GPU at ≤ 10 % does none of the work
        busy_cpu_pct: float = 80.0  # a CPU at ≥ 80 % is doing it
        oversize: float = 1.2  # a model 20 % larger than the GPU cannot be all on it

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        off, total = ev.value("report.gpu_layers_offloaded"), ev.value("report.gpu_layers_total")
        if off is not None and (total or 0) > 0 and off / (total or 1) < t.max_offloaded_share:
            share = off / (total or 1)
            out.append(Signal(max(t.strong, 1 - share), f"shows {off:.0f} of {total:.0f} layers on the GPU: the "
                              f"other {pct(1 - share)} run on the CPU"))
        elif off == 0:
            out.append(Signal(t.strong, "shows no layer offloaded to the GPU"))
        split = ev.value("report.ollama_cpu_share")
        if split is not None and split >= t.min_cpu_split and gpu_in_view(ev):
            shown = f"{100 * split:.0f}%/{100 * (1 - split):.0f}% CPU/GPU"
            out.append(Signal(t.strong, f"shows ollama keeping {pct(split)} of the model in system memory "
                                        f"(`ollama ps`: {shown}): those layers run on the CPU at every token, at the "
                                        "host's memory bandwidth"))
        if _n(ev, "report.cpu_fallback_messages") and gpu_in_view(ev):
            out.append(Signal(t.strong, "prints that the work falls back to the CPU"
                              + _q(ev, "report.cpu_fallback_messages")))
        engine = ev.get("serving.engine")
        if _n(ev, "report.tf_gpu_libs_messages") and gpu_in_view(ev) and not isinstance(engine, Evidence):
            out.append(Signal(t.strong, "prints that TensorFlow could not load the CUDA libraries its GPU device "
                              "needs: it runs on the CPU" + _q(ev, "report.tf_gpu_libs_messages")))
        if _n(ev, "report.ep_cpu_node_messages"):
            out.append(Signal(t.stated, "shows ONNX Runtime leaving ops to its CPU provider for want of a GPU kernel: "
                                        "they run on the CPU, their inputs and outputs copied across at every run"
                              + _q(ev, "report.ep_cpu_node_messages")))
        if _n(ev, "report.placement_statements"):
            out.append(Signal(t.stated, f"says the work runs on the CPU{_q(ev, 'report.placement_statements')}"))
        gpu, cpu = ev.value("report.gpu_util_pct_max"), ev.value("report.cpu_util_pct_max")
        if gpu is not None and cpu is not None and gpu <= t.idle_gpu_pct and cpu >= t.busy_cpu_pct:
            out.append(Signal(t.stated, f"states the CPU at {cpu:.0f} % while the GPU is at {gpu:.0f} %"))
        if _n(ev, "report.wrong_gpu_statements"):
            out.append(Signal(t.weak, f"questions which GPU is used{_q(ev, 'report.wrong_gpu_statements')}"))
        if _n(ev, "report.offload_settings") and not _oom_message(ev):
            if _n(ev, "report.cpu_tensor_settings") >= _n(ev, "report.offload_settings"):
                # llama.cpp computes the tensors kept on the CPU there: its threads and memory bandwidth set the pace
                out.append(Signal(t.stated, "starts llama.cpp with tensors kept on the CPU, computed there by its "
                                            f"threads at every token{_q(ev, 'report.offload_settings')}"))
            else:
                out.append(Signal(t.stated, "starts the engine with weights kept in host memory, copied to the GPU "
                                            f"at every forward pass{_q(ev, 'report.offload_settings')}"))
        weights, gpu_mem = ev.value("mem.weights_estimate_bytes"), ev.value("gpu.spec_memory_bytes")
        # the model split over GPUs (tensor or pipeline parallelism) holds a part of it on each
        split = max(1.0, ev.value("mem.tensor_parallel") or 1.0) * max(1.0, ev.value("mem.pipeline_parallel") or 1.0)
        no_oom = not _n(ev, "report.oom_statements") and "mem.oom_count" not in ev
        if weights and gpu_mem and no_oom and weights / split >= t.oversize * gpu_mem and (
                _n(ev, "report.slow_statements") or _n(ev, "report.offload_statements")):
            out.append(Signal(t.stated, f"runs a model of about {size(weights, 0)} on a GPU of {size(gpu_mem, 0)}"
                                        + (f" ({size(weights / split, 0)} on each of {split:.0f})" if split > 1 else "")
                                        + ": the layers that do not fit run on the CPU"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        nodes = ([Fix("Give ONNX Runtime's GPU provider every op", (
            "The ops it names have no kernel in this provider and version: export the model with ops it supports "
            "(ONNX Runtime's per-provider operator kernel list; a different opset, or the op rewritten), or upgrade "
            "ONNX Runtime",
            "SessionOptions.log_severity_level = 0 lists each node's provider ('Node(s) placed on "
            "[CPUExecutionProvider]'): the ones left there, not ORT's shape ops, are what to fix",
        ), Risk.NEEDS_VALIDATION)] if _n(ev, "report.ep_cpu_node_messages") else [])
        return [
            *nodes,
            Fix("Run the model on the GPU", (
                "llama.cpp / llama-cpp-python: build with CUDA (CMAKE_ARGS='-DGGML_CUDA=on', formerly "
                "-DLLAMA_CUBLAS=on) and offload every layer: -ngl 999 / n_gpu_layers=-1; the load log must say "
                "'offloaded N/N layers to GPU'",
                "ollama: check `ollama ps` (PROCESSOR column) and the server log's runners/library line; a CPU "
                "runner means the GPU was not detected (driver, compute capability, container --gpus)",
                "ONNX Runtime: install onnxruntime-gpu (not onnxruntime) and pass "
                "providers=['CUDAExecutionProvider', 'CPUExecutionProvider']; session.get_providers() must list CUDA",
                "PyTorch: install a CUDA wheel (torch.cuda.is_available() must be True) and move model and inputs "
                "with .to('cuda')",
            ), Risk.SAFE),
            Fix("Use the GPU you meant", (
                "Set CUDA_VISIBLE_DEVICES (and CUDA_DEVICE_ORDER=PCI_BUS_ID so indices match nvidia-smi) before "
                "the process starts",
                "If the model does not fit, offload as many layers as fit and expect the CPU part to set the pace; "
                "a smaller quantisation keeps it all on the GPU",
            ), Risk.NEEDS_VALIDATION),
        ]


class QueueingReported(ReportRule):
    """The report shows requests waiting for one another: served one by one, queued, or turned away.

    What it detects: statements that concurrent requests are processed sequentially (one by one,
    one at a time, the second waits for the first), rejections for lack of a free slot, queue or
    waiting times stated with numbers, and preemption messages.

    Why it matters: a server that serves one request at a time makes latency grow linearly with the
    number of users while the GPU has room; the fix is capacity settings, not faster kernels.

    How it decides: the strongest of: sequential processing stated, or the engine's own message that it serves
    the model one request at a time (ollama's "model architecture does not currently support parallel requests";
    ``sequential``); rejections for
    lack of slots (``rejected``); a queue or wait time of at least ``min_queue_ms`` stated
    (``stated``); preemptions (``stated``); the served load capped (a batch size, a running count that
    stays fixed while more is offered; ``stated``); queueing named together with a concurrency of at
    least ``min_concurrency`` (``weak``).

    Evidence: any of report.sequential_statements, report.one_at_a_time_messages, report.rejection_messages,
    report.queue_ms_max, report.preemption_messages, report.queue_statements + report.concurrency_max.

    Fix: raise the engine's concurrency (llama.cpp ``--parallel``, ollama ``OLLAMA_NUM_PARALLEL``,
    vLLM ``--max-num-seqs``, TGI ``--max-concurrent-requests``, SGLang ``--max-running-requests``,
    Triton instance_group / dynamic batching, Ray Serve ``max_ongoing_requests``), add replicas,
    bound the queue.

    False positives: a single-user tool where one-at-a-time is intended.
    """

    code = "QUE005"
    name = "queueing-reported"
    category = Category.QUEUEING
    requires = ()
    requires_any = (("report.sequential_statements",), ("report.one_at_a_time_messages",),
                    ("report.rejection_messages",), ("report.queue_ms_max",),
                    ("report.preemption_messages",), ("report.queue_statements", "report.concurrency_max"),
                    ("report.capped_statements",))
    optional = ("report.capacity_settings", "report.concurrency_max")
    title_concepts = ("sequential", "queue", "concurrency")
    headline = "Requests wait for one another"
    cause = "report.cause.queue"
    measured_by = ("serving.stat_samples", "stage.queue_ms.mean", "stage.queue.share", "conn.inflight_mean",
                   "scaling.ttft_ms.concurrency_ratio", "scaling.e2e_ms.concurrency_ratio")
    # a load sweep measured the throughput by concurrency (QUE011 reads its plateau): the title's word alone is none
    title_measured_by = ("scaling.throughput.concurrency_ratio",)

    @dataclass(frozen=True)
    class Thresholds:
        sequential: float = 0.65  # one-at-a-time service stated outright
        rejected: float = 0.6  # requests turned away for lack of a slot
        stated: float = 0.55  # a queue time or preemption stated
        weak: float = 0.4  # queueing named with a concurrency figure
        min_queue_ms: float = 100.0  # a tenth of a second of waiting is felt
        min_concurrency: float = 4.0  # fewer concurrent requests than this rarely queue on a GPU engine

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        # (ollama prints it at every load of such a model: it is this report's answer only where requests came together)
        several = (_n(ev, "report.concurrency_statements") or _n(ev, "report.queue_statements")
                   or _n(ev, "report.sequential_statements") or _n(ev, "report.capped_statements")
                   or ev.value("report.concurrency_max") is not None)
        if _n(ev, "report.one_at_a_time_messages") and several:
            out.append(Signal(t.sequential, f"shows the engine serving one request at a time "
                                            f"({_quote(ev, 'report.one_at_a_time_messages')})"))
        if _n(ev, "report.sequential_statements"):
            out.append(Signal(t.sequential, f"says requests are served one at a time "
                                            f"({_quote(ev, 'report.sequential_statements')})"))
        if _n(ev, "report.rejection_messages"):
            out.append(Signal(t.rejected, f"shows requests turned away for lack of capacity "
                                          f"({_quote(ev, 'report.rejection_messages')})"))
        q = ev.value("report.queue_ms_max")
        if q is not None and q >= t.min_queue_ms:
            out.append(Signal(t.stated, f"states requests waiting {fmt_ms(q)} in a queue"))
        if _n(ev, "report.preemption_messages"):
            out.append(Signal(t.stated, "shows requests preempted for lack of KV-cache space"))
        conc = ev.value("report.concurrency_max")
        if _n(ev, "report.queue_statements") and conc is not None and conc >= t.min_concurrency:
            out.append(Signal(t.weak, f"names queued requests at a concurrency of {conc:.0f}"))
        if _n(ev, "report.capped_statements") and (_n(ev, "report.capacity_settings") or conc is not None
                                                   or _n(ev, "report.concurrency_statements")):
            out.append(Signal(t.stated, f"shows the served load capped while more is offered"
                                        f"{_q(ev, 'report.capped_statements')}"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            Fix("Serve requests concurrently", (
                "llama.cpp server: --parallel N (each slot gets ctx/N tokens: raise -c with it); ollama: "
                "OLLAMA_NUM_PARALLEL; llama-cpp-python's server serves one request at a time",
                *advice.serving_capacity(ev),
                "Triton: instance_group count > 1 or dynamic_batching; Ray Serve: max_ongoing_requests "
                "(max_concurrent_queries before 2.10) and autoscaling_config",
            ), Risk.NEEDS_VALIDATION),
            Fix("Add capacity and bound the queue", (
                "More replicas behind the load balancer for the offered load",
                "Reject beyond a queue bound (429/503) so latency stays bounded",
            ), Risk.SAFE),
        ]


class PrefillReported(ReportRule):
    """The report shows the time to first token going into processing a long prompt.

    What it detects: a time to first token (or a prompt-processing time) of seconds stated next to
    a long prompt, prompt processing named as slow, or its speed stated.

    Why it matters: prefill cost grows with the prompt (linearly to quadratically); a long system
    prompt, RAG context or chat history re-processed on every turn makes the first token slow no
    matter how fast tokens come afterwards.

    How it decides: the strongest of: a TTFT or prefill time of at least ``min_ms`` with a prompt of at
    least ``min_tokens`` tokens (``long_prompt``); a TTFT or prefill time of at least ``min_ms`` with
    prompt processing named (``stated``; not where one clause ties a first request to compiling: that TTFT is a cold
    request's, CMP004's); prompt processing named as slow with a prompt of at least
    ``min_tokens`` (``stated``); a server processing the whole prompt again instead of reusing its
    cache (llama.cpp ``forcing full prompt re-processing``; ``stated``); a running request's decode stated at least
    ``min_stall`` × slower beside another request's prefill than alone (``long_prompt``: the prefill holds the
    engine's steps; timed prefill spans beside it do not make it step aside, they time the prefill, not the stall).

    Evidence: report.ttft_ms_max, report.prefill_ms_max, report.prefill_statements,
    report.prompt_reprocess_messages or report.prefill_stall_ratio; optionally report.prompt_tokens_max,
    report.prefill_tokens_per_s.

    Fix: reuse the prefix (prefix caching, keep the stable part first), chunk long prefills (vLLM
    ``--max-num-batched-tokens``, SGLang ``--chunked-prefill-size``), trim prompts, faster prefill
    hardware or more tensor parallelism.

    False positives: a TTFT that is mostly queueing (the queueing rules own it).
    """

    code = "TTF002"
    name = "prefill-reported"
    category = Category.PREFILL_TTFT
    requires = ()
    requires_any = (("report.ttft_ms_max",), ("report.prefill_ms_max",), ("report.prefill_statements",),
                    ("report.prompt_reprocess_messages",), ("report.prefill_stall_ratio",))
    optional = ("report.prompt_tokens_max", "report.prefill_tokens_per_s", "report.prefill_stall_ratio",
                "report.first_compile_statements")
    title_concepts = ("ttft", "prefill", "prompt_len")
    headline = "Prompt processing (prefill) dominates the time to first token"
    cause = "report.cause.prefill"
    measured_by = ("stage.prefill.share", "stage.prefill_ms.mean")

    def corroborated(self, ev: EvidenceSet, t: object = None) -> str:
        # timed prefills say how long a prompt takes; that the running requests' decode stalls while one runs is the
        # report's own measurement beside them (TTF001 judges the prefill's share of a TTFT, not the stall)
        stall = ev.value("report.prefill_stall_ratio")
        bar = t.min_stall if isinstance(t, PrefillReported.Thresholds) else self.Thresholds.min_stall
        if stall is not None and stall >= bar:
            return "The pasted timings time the prefill itself; the stall of the running decode is the report's."
        return ""

    @dataclass(frozen=True)
    class Thresholds:
        long_prompt: float = 0.65  # seconds to first token with thousands of prompt tokens
        stated: float = 0.55  # prompt processing named as the slow part
        min_ms: float = 1000.0  # a first token after a second is felt in chat
        min_tokens: float = 1000.0  # a thousand prompt tokens is where prefill shows
        min_stall: float = 3.0  # decode at a third of its rate alone while a prompt prefills: more than batching costs

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        ms = max(_n(ev, "report.ttft_ms_max"), _n(ev, "report.prefill_ms_max"))
        tokens = _n(ev, "report.prompt_tokens_max")
        named = _n(ev, "report.prefill_statements")
        if ms >= t.min_ms and tokens >= t.min_tokens:
            out.append(Signal(t.long_prompt, f"states {fmt_ms(ms)} to the first token for a prompt of "
                                             f"{tokens:,.0f} tokens"))
        elif ms >= t.min_ms and named and not _n(ev, "report.first_compile_statements"):
            # (a report that ties a first request to compiling, in one clause, states a cold request's TTFT: CMP004's)
            out.append(Signal(t.stated, f"states {fmt_ms(ms)} before the first token, in prompt processing"))
        if named and tokens >= t.min_tokens and not out:
            out.append(Signal(t.stated, f"names prompt processing as slow with a {tokens:,.0f}-token prompt"))
        stall = ev.value("report.prefill_stall_ratio")
        if stall is not None and stall >= t.min_stall:
            out.append(Signal(t.long_prompt, f"states the running requests' decode {stall:.0f}× slower while another "
                                             "request's long prompt is prefilled: the prefill holds the engine's steps"
                              + _q(ev, "report.prefill_stall_ratio")))
        if _n(ev, "report.prompt_reprocess_messages"):
            out.append(Signal(t.stated, f"shows the whole prompt processed again instead of reused "
                                        f"({_quote(ev, 'report.prompt_reprocess_messages')})"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            Fix("Do not prefill the same prefix twice", (
                advice.prefix_caching(ev),
                "SGLang: RadixAttention (default); llama.cpp server: cache_prompt and one slot per conversation",
            ), Risk.SAFE),
            Fix("Bound what one prefill costs", (
                advice.chunked_prefill(ev),
                "SGLang: --chunked-prefill-size; llama.cpp: larger -b/-ub batch for prompt processing",
                "Trim the prompt (fewer retrieved chunks, summarised history); more tensor parallelism or a "
                "GPU with more FLOPS for prefill-heavy traffic",
            ), Risk.NEEDS_VALIDATION),
        ]


class ColdStartReported(ReportRule):
    """The report shows time going into compiling, building engines or warming up.

    What it detects: the first request(s) stated much slower than later ones, recompilation
    statements or recompile-limit messages, TensorRT engine builds, CUDA-graph capture and warm-up
    taking long, graphs regenerated for new shapes.

    Why it matters: compilation happens on the request path: the first user after a deploy (or
    after every new input shape) waits for it; a recompile limit falls back to slow eager code.

    How it decides: the strongest of: a recompile-limit message (``limit``); the first request at
    least ``min_factor`` × slower than later ones, from two times in one sentence or a stated factor
    (impact 1 − later/first, at least ``first_slow``); recompiles or shape changes named with
    compiling (``stated``); a compile/build/warm-up time of at least ``min_compile_ms`` (``stated``);
    an engine's message that what it built could not be written to its cache ("[TRT] failed to open engine cache
    file for writing …": every start builds it again; ``first_slow``);
    build or warm-up messages with first-request statements (``weak``).

    Evidence: any of report.recompile_limit_messages, report.first_ms + report.steady_ms,
    report.first_factor, report.recompile_statements, report.compile_ms_max,
    report.engine_build_messages, report.compile_statements + report.first_statements,
    report.engine_cache_unsaved_messages.

    Fix: warm up before taking traffic with every shape served, mark dimensions dynamic or pad to
    buckets, raise the recompile limit knowingly, cache compiled artefacts.

    A first request the report explains by a download (``report.download_statements``) with
    nothing of compiling said or measured steps aside: that is warm-up, not compilation (HLT003
    says so, and ``none`` leads).

    False positives: a first request that downloads weights and also compiles, said only as a
    download.
    """

    code = "CMP004"
    name = "cold-start-reported"
    category = Category.RECOMPILATION
    requires = ()
    requires_any = (("report.recompile_limit_messages",), ("report.first_ms", "report.steady_ms"),
                    ("report.first_factor",), ("report.recompile_statements",), ("report.compile_ms_max",),
                    ("report.engine_build_messages",), ("report.compile_statements", "report.first_statements"),
                    ("report.engine_cache_unsaved_messages",))
    optional = ("report.compile_statements", "report.first_statements", "report.download_statements")
    title_concepts = ("compile", "recompile", "first")
    headline = "Time goes into compiling, building or warming up"
    cause = "report.cause.compile"
    measured_by = ("compile.", "cpu.compile_share")  # a compile log or a live profile

    COMPILING = ("report.recompile_limit_messages", "report.recompile_statements", "report.compile_ms_max",
                 "report.engine_build_messages", "report.compile_statements", "report.engine_cache_unsaved_messages")

    def check(self, ev: EvidenceSet, t: object) -> Finding | None:
        if (_n(ev, "report.download_statements") and not any(_n(ev, k) for k in self.COMPILING)
                and not ev.has_prefix("compile.")):
            return None  # the first request waits for a download: warm-up (HLT003), not compiling
        return super().check(ev, t)

    def corroborated(self, ev: EvidenceSet, t: object = None) -> str:
        n = ev.value("compile.recompiles", 0.0) or 0.0
        if n >= 1 and _n(ev, "report.recompile_statements"):
            return (f"The pasted log shows {n:.0f} recompile{'s' if n != 1 else ''}, too few to call a pattern on "
                    "its own, of the kind the report says recurs.")
        return ""

    @dataclass(frozen=True)
    class Thresholds:
        limit: float = 0.8  # the recompile limit was hit: every further shape runs slow
        first_slow: float = 0.6  # the first request much slower than the rest
        stated: float = 0.55  # recompiles or long compiles stated
        weak: float = 0.4  # build / warm-up named around first requests
        min_factor: float = 3.0  # three times slower first: more than noise or cache misses
        min_compile_ms: float = 10_000.0  # ten seconds of compiling is felt by whoever waits

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        if _n(ev, "report.recompile_limit_messages"):
            out.append(Signal(t.limit, f"shows the recompile limit hit{_q(ev, 'report.recompile_limit_messages')}"))
        first, steady = ev.value("report.first_ms"), ev.value("report.steady_ms")
        if first is not None and steady and first / steady >= t.min_factor:
            out.append(Signal(max(t.first_slow, min(0.9, 1 - steady / first)),
                              f"states the first request at {fmt_ms(first)} and later ones at {fmt_ms(steady)}"))
        factor = ev.value("report.first_factor")
        if factor is not None and factor >= t.min_factor and (_n(ev, "report.first_statements")
                                                              or _n(ev, "report.compile_statements")):
            out.append(Signal(t.first_slow, f"states the first run {factor:g}× slower than later ones"))
        if _n(ev, "report.recompile_statements") and (_n(ev, "report.compile_statements")
                                                      or _n(ev, "report.slow_statements")):
            out.append(Signal(t.stated, f"names recompiles on changing shapes "
                                        f"({_quote(ev, 'report.recompile_statements')})"))
        ms = ev.value("report.compile_ms_max")
        if ms is not None and ms >= t.min_compile_ms:
            out.append(Signal(t.stated, f"states {fmt_ms(ms)} spent compiling, building or warming up"))
        if _n(ev, "report.engine_cache_unsaved_messages"):
            out.append(Signal(t.first_slow, "shows the engine it built could not be saved to its cache: every start "
                              f"builds it again{_q(ev, 'report.engine_cache_unsaved_messages')}"))
        if _n(ev, "report.engine_build_messages") and (_n(ev, "report.first_statements")
                                                       or _n(ev, "report.slow_statements")):
            out.append(Signal(t.weak, f"shows engine builds / warm-up{_q(ev, 'report.engine_build_messages')}"))
        if _n(ev, "report.compile_statements") and _n(ev, "report.first_statements"):
            out.append(Signal(t.weak, f"ties the first requests' time to compiling{_q(ev, 'report.first_statements')}"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            Fix("Compile before traffic, once per shape", (
                "Warm up with every batch size / sequence-length bucket you serve before marking the service "
                "ready (TGI and vLLM do it for their shapes; TEI and custom servers need an explicit warm-up "
                "request)",
                "torch.compile: dynamic=True or torch._dynamo.mark_dynamic on the varying dimension; pad inputs "
                "to a few bucket sizes; TORCH_LOGS=recompiles shows which guard fails",
                "TensorRT / ONNX Runtime TensorRT EP: build with optimization profiles covering every served "
                "shape (trt_profile_min/opt/max_shapes) and enable the engine cache (trt_engine_cache_enable)",
            ), Risk.NEEDS_VALIDATION),
            Fix("Keep what was compiled", (
                "Cache compiled artefacts across restarts (TORCHINDUCTOR_CACHE_DIR / VLLM_CACHE_ROOT on a "
                "persistent volume, TensorRT engine cache files)",
                f"Raise the recompile limit only knowingly: {advice.RECOMPILE_LIMIT}",
            ), Risk.SAFE),
        ]


# a title's output rate ("TTFT and output tokens/s both regressed"): the decode step's, graphs' own work
_TITLE_RATE = re.compile(r"tok(?:en)?s?\s*/\s*s\b|tokens? per second|throughput|\btps\b|\bt/s\b", re.IGNORECASE)


class LaunchOverheadReported(ReportRule):
    """The report shows the host's launch path setting the pace: eager mode, kernel launches, one busy core.

    What it detects: CUDA graphs turned off (``--enforce-eager``, ``enforce_eager=True``), kernel
    launch time named (a profiler table topped by ``cudaLaunchKernel``, "kernel launch" time),
    CPU-bound decoding, or one CPU core at 100 % while the GPU is partly idle.

    Why it matters: small-batch decode launches hundreds of tiny kernels per token; without CUDA
    graphs the Python/framework dispatch between them, not the GPU, sets tokens per second.

    How it decides: the strongest of: CUDA graphs turned off (``graphs_off``; not where the title is about the
    first token or the prefill alone: graphs replay the decode step); kernel launch /
    host overhead named (``stated``); the CPU named as the limit of generation or of a partly idle
    GPU, with no pre-processing named (``stated``); CUDA graphs or eager mode discussed with slow
    decoding or a GPU between ``min_gpu_pct`` and ``max_gpu_pct`` % (``weak``); the CPU stated at ≥
    ``busy_cpu_pct`` % with the GPU between ``min_gpu_pct`` and ``max_gpu_pct`` % (``weak``).

    Evidence: any of report.cuda_graphs_off_messages, report.launch_statements,
    report.cuda_graph_statements, report.cpu_util_pct_max + report.gpu_util_pct_max.

    Fix: keep CUDA graphs on (drop --enforce-eager), torch.compile(mode="reduce-overhead"), batch
    more requests per step, a faster single-core CPU for the decode loop.

    False positives: a GPU at 0 % with a busy CPU is the model on the CPU (PLC001).
    """

    code = "GPU110"
    name = "launch-overhead-reported"
    category = Category.LAUNCH_OVERHEAD
    requires = ()
    requires_any = (("report.cuda_graphs_off_messages",), ("report.launch_statements",),
                    ("report.cuda_graph_statements",), ("report.cpu_util_pct_max", "report.gpu_util_pct_max"),
                    ("report.cpu_bound_statements",))
    optional = ("report.slow_statements", "report.batch_statements", "report.cuda_graph_on_statements")
    title_concepts = ("cuda_graph", "launch")
    headline = "The host's launch path, not the GPU, sets the pace"
    cause = "report.cause.launch"
    measured_by = ("trace.kernel_count", "kineto.idle_share")

    @dataclass(frozen=True)
    class Thresholds:
        graphs_off: float = 0.6  # CUDA graphs explicitly off
        stated: float = 0.55  # launch / host overhead named
        weak: float = 0.45  # graphs discussed, or a busy core next to a half-idle GPU
        busy_cpu_pct: float = 90.0  # one core pegged
        min_gpu_pct: float = 15.0  # the GPU does run the model (below: placement, PLC001)
        max_gpu_pct: float = 90.0  # ... but is not saturated

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        # CUDA graphs replay the decode step (vLLM captures decode batches; its prefill runs piecewise or eager
        # either way): a report about the first token alone, its decode not in question, is no eager mode's cost
        # (vllm#39790: a TTFT regression with speculative decoding, served with --enforce-eager in both runs)
        title = ev.get("report.title")
        rate = isinstance(title, Evidence) and _TITLE_RATE.search(str(title.value)) is not None  # tok/s is decode's
        first_only = (_title_mentions(ev, "ttft", "prefill") and not rate
                      and not _title_mentions(ev, "decode", "cuda_graph", "launch"))
        if _n(ev, "report.cuda_graphs_off_messages") and not first_only:
            out.append(Signal(t.graphs_off, f"runs with CUDA graphs off{_q(ev, 'report.cuda_graphs_off_messages')}"))
        if _n(ev, "report.launch_statements"):
            out.append(Signal(t.stated, f"names kernel-launch / host overhead{_q(ev, 'report.launch_statements')}"))
        # graphs said to be captured or in use are no sign of eager mode's launch path
        graphs = _n(ev, "report.cuda_graph_statements") > _n(ev, "report.cuda_graph_on_statements")
        if graphs and (_n(ev, "report.slow_statements") or ev.value("report.decode_ms_max") is not None):
            out.append(Signal(t.weak, f"discusses CUDA graphs / eager mode "
                                      f"({_quote(ev, 'report.cuda_graph_statements')})"))
        cpu, gpu = ev.value("report.cpu_util_pct_max"), ev.value("report.gpu_util_pct_max")
        if cpu is not None and gpu is not None and cpu >= t.busy_cpu_pct and t.min_gpu_pct <= gpu < t.max_gpu_pct:
            out.append(Signal(t.weak, f"states a CPU at {cpu:.0f} % feeding a GPU at {gpu:.0f} %"))
        generating = (_n(ev, "report.batch_statements") or _n(ev, "report.decode_ms_max")
                      or _n(ev, "report.decode_statements"))
        if _n(ev, "report.cpu_bound_statements") and not _n(ev, "report.preprocess_statements") and (
                generating or (gpu is not None and gpu < t.max_gpu_pct)):
            out.append(Signal(t.stated, "names the CPU as the limit of the GPU's work"
                              + _q(ev, "report.cpu_bound_statements")))
        if graphs and gpu is not None and t.min_gpu_pct <= gpu < t.max_gpu_pct:
            out.append(Signal(t.weak, f"discusses CUDA graphs with the GPU at {gpu:.0f} %"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            Fix("Replay the decode step as CUDA graphs", (
                "vLLM / vllm-omni: drop --enforce-eager (enforce_eager: false) so decode runs in captured CUDA "
                "graphs; SGLang: keep CUDA graphs on and raise --cuda-graph-max-bs to the batch sizes you run",
                "PyTorch: torch.compile(model, mode='reduce-overhead') on a static-shape decode step; llama.cpp: "
                "CUDA graphs are on by default on supported GPUs (GGML_CUDA_DISABLE_GRAPHS unset)",
            ), Risk.NEEDS_VALIDATION),
            Fix("Do more work per launch", (
                "Batch more concurrent requests per step; fuse small ops (torch.compile, fused kernels)",
                "The decode loop runs on one core: a CPU with fast single-thread performance matters at batch 1",
            ), Risk.NEEDS_VALIDATION),
        ]


class ThreadsReported(ReportRule):
    """The report shows more busy threads than cores: fewer threads run faster, or a quota throttles them.

    What it detects: a thread-count comparison where fewer threads give more throughput, a thread
    count at or above the stated core count, a container CPU limit or throttling named with thread
    pools, or contention between processes.

    Why it matters: every process sizes its thread pools to the machine's cores; several processes,
    hyperthreads counted as cores, or a container quota below the visible cores make threads wait
    for a CPU and spin, and everything slows down together.

    How it decides: the strongest of: fewer threads at least ``min_speedup`` × faster (``measured``);
    threads ≥ cores stated (``stated``); a CPU quota/throttling named with threads or contention
    (``stated``); contention named with thread settings (``stated``); thread settings discussed with
    slowness (``weak``).

    Evidence: any of report.fewer_threads_speedup, report.threads_max + report.cores_stated,
    report.quota_statements + report.thread_statements, report.contention_statements.

    Fix: set the pool sizes to the cores really available (OMP_NUM_THREADS, torch.set_num_threads,
    ORT intra_op_num_threads, llama.cpp -t = physical cores), divide them among processes, match
    them to the container's quota.

    False positives: a GPU-bound service where thread counts do not matter.
    """

    code = "THR002"
    name = "threads-reported"
    category = Category.THREAD_OVERSUBSCRIPTION
    requires = ()
    requires_any = (("report.fewer_threads_speedup",), ("report.threads_max", "report.cores_stated"),
                    ("report.quota_statements", "report.thread_statements"), ("report.contention_statements",),
                    ("report.thread_statements", "report.slow_statements"))
    optional = ("report.threads_best",)
    title_concepts = ("threads", "cores", "quota", "contention")
    headline = "More busy threads than cores"
    cause = "report.cause.threads"
    measured_by = ("threads.busy_count",)

    @dataclass(frozen=True)
    class Thresholds:
        measured: float = 0.7  # the reporter measured fewer threads being faster
        stated: float = 0.55  # threads ≥ cores, or a quota named with thread pools
        weak: float = 0.35  # threads discussed around slowness
        min_speedup: float = 1.2  # 20 % faster with fewer threads is beyond noise

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        speedup = ev.value("report.fewer_threads_speedup")
        if speedup is not None and speedup >= t.min_speedup:
            out.append(Signal(t.measured, f"measures fewer threads {speedup:.1f}× faster "
                                          f"({_quote(ev, 'report.fewer_threads_speedup')})"))
        threads, cores = ev.value("report.threads_max"), ev.value("report.cores_stated")
        if threads is not None and cores and threads >= cores:
            out.append(Signal(t.stated, f"runs {threads:.0f} threads on {cores:.0f} cores"))
        if _n(ev, "report.quota_statements") and (_n(ev, "report.thread_statements")
                                                  or _n(ev, "report.contention_statements")):
            out.append(Signal(t.stated, f"names a CPU limit / throttling with its threads "
                                        f"({_quote(ev, 'report.quota_statements')})"))
        if _n(ev, "report.contention_statements") and _n(ev, "report.thread_statements"):
            out.append(Signal(t.stated, f"names contention between threads{_q(ev, 'report.contention_statements')}"))
        if _n(ev, "report.thread_statements") >= 2 and _n(ev, "report.slow_statements"):
            out.append(Signal(t.weak, f"discusses thread counts around the slowdown "
                                      f"({_quote(ev, 'report.thread_statements')})"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            Fix("Size thread pools to the cores you really have", (
                "llama.cpp / ollama: -t (num_thread) = physical cores, not hyperthreads; fewer when part of the "
                "model is on the GPU",
                "PyTorch: torch.set_num_threads(cores // processes) and OMP_NUM_THREADS; ONNX Runtime: "
                "intra_op_num_threads / inter_op_num_threads per session; Triton PyTorch backend: "
                "INTRA_OP_THREAD_COUNT",
                "Containers: the quota (docker --cpus, Kubernetes limits.cpu) is the budget, not the host's "
                "cores: set the pools to it; check /sys/fs/cgroup/cpu.stat nr_throttled",
            ), Risk.SAFE),
        ]


class ProcessingReported(ReportRule):
    """The report shows pre/post-processing (or serialisation) on the CPU taking the time.

    What it detects: pre- or post-processing times stated against the model's time, a tokenizer
    or image processor named as the slow part with the GPU idle, or serialisation named as slow.

    Why it matters: while the CPU decodes images, tokenises or serialises, the GPU waits; the model
    cannot be faster than what feeds it.

    How it decides: the strongest of: pre+post-processing at least ``min_share`` of the stated time
    (impact = that share); pre-processing time of at least ``min_ms`` stated (``stated``);
    pre/post-processing named with the GPU stated at or below ``idle_gpu_pct`` % (``stated``); the CPU
    named as the limit while pre-processing is named (``stated``); serialisation named as slow (``weak``).

    Evidence: any of report.preprocess_ms_max, report.postprocess_ms_max (+ report.model_ms),
    report.preprocess_statements + report.gpu_util_pct_max, report.serialize_statements.

    Fix: move the work off the request thread (process pool, DALI / GPU decode, fast tokenizers),
    overlap it with the model, vectorise post-processing, binary payloads instead of JSON.

    False positives: a first-call pre-processing time that includes loading a library.
    """

    code = "CPU003"
    name = "processing-reported"
    category = Category.CPU_PREPROCESSING
    requires = ()
    requires_any = (("report.preprocess_ms_max",), ("report.postprocess_ms_max",),
                    ("report.preprocess_statements", "report.gpu_util_pct_max"),
                    ("report.serialize_statements", "report.slow_statements"),
                    ("report.cpu_bound_statements", "report.preprocess_statements"))
    optional = ("report.model_ms", "report.preprocess_statements")
    title_concepts = ("preprocess", "postprocess", "serialize")
    headline = "CPU pre/post-processing takes the time"
    cause = "report.cause.preprocess"
    measured_by = ("stage.preprocess.share", "cpu.preprocess_share")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.3  # a third of the time outside the model is the bottleneck
        stated: float = 0.55  # a long pre-processing time or an idle GPU stated
        weak: float = 0.4  # serialisation named as slow
        min_ms: float = 50.0  # 50 ms per request of pre-processing caps a GPU model's rate
        idle_gpu_pct: float = 30.0  # a GPU mostly idle while the CPU prepares its input

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        pre, post, model = (ev.value("report.preprocess_ms_max"), ev.value("report.postprocess_ms_max"),
                            ev.value("report.model_ms"))
        cpu_side = (pre or 0.0) + (post or 0.0)
        if cpu_side and model:
            share = cpu_side / (cpu_side + model)
            if share >= t.min_share:
                out.append(Signal(share, f"states {fmt_ms(cpu_side)} of pre/post-processing against "
                                         f"{fmt_ms(model)} in the model"))
        elif pre is not None and pre >= t.min_ms:
            out.append(Signal(t.stated, f"states {fmt_ms(pre)} of pre-processing per request"))
        elif post is not None and post >= t.min_ms:
            out.append(Signal(t.stated, f"states {fmt_ms(post)} of post-processing per request"))
        gpu = ev.value("report.gpu_util_pct_max")
        if _n(ev, "report.preprocess_statements") and gpu is not None and gpu <= t.idle_gpu_pct:
            out.append(Signal(t.stated, f"names pre-processing while the GPU is at {gpu:.0f} %"))
        if _n(ev, "report.serialize_statements") and _n(ev, "report.slow_statements"):
            out.append(Signal(t.weak, f"names serialisation as slow{_q(ev, 'report.serialize_statements')}"))
        if _n(ev, "report.cpu_bound_statements") and _n(ev, "report.preprocess_statements"):
            out.append(Signal(t.stated, f"names the CPU as the limit while it prepares the input"
                                        f"{_q(ev, 'report.cpu_bound_statements')}"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            Fix("Take the CPU work off the request path", (
                "Run pre-processing in a process pool or a separate stage (Triton ensemble / BLS with several "
                "Python-backend instances, Ray Serve deployment graph) and overlap it with the model",
                "Decode and resize on the GPU (NVIDIA DALI, torchvision.io.decode_jpeg(device='cuda')); fast "
                "Rust tokenizers with batching; vectorised post-processing (NMS on the GPU)",
                "Send binary payloads (raw tensors, Arrow, shared memory) instead of JSON lists",
            ), Risk.NEEDS_VALIDATION),
        ]


class CopiesReported(ReportRule):
    """The report shows host↔device copies taking the time: copy times, pageable memory, a narrow link.

    What it detects: copy (memcpy / H2D / D2H / ``.cpu()``) times stated against the model's time,
    ONNX Runtime inserting Memcpy nodes between execution providers, copies named with the PCIe
    link (width, generation, a riser), or copies named as slow.

    Why it matters: a copy over PCIe moves ~25 GB/s at best (Gen4 x16), far less from pageable
    memory or on a x4 link; a synchronising copy per step stalls the GPU every time.

    How it decides: the strongest of: copy time at least ``min_share`` of the stated time (impact =
    that share); ORT Memcpy nodes (``stated``); copies named with the PCIe link (``stated``); copies
    named as slow (``weak``).

    Evidence: any of report.copy_ms_max (+ report.model_ms), report.ep_memcpy_messages,
    report.copy_statements + report.pcie_link_statements, report.copy_statements + report.slow_statements.

    Fix: pinned memory with non_blocking copies, fewer and larger copies, keep tensors on the
    device between steps, run the whole graph on one execution provider, a x16 slot.

    A time charged to a host read of a CUDA tensor (``.cpu()``, ``.item()``) in a text that
    synchronises nowhere is not a copy time: the read waits for the kernels queued before it
    (GPU009 reads it).

    False positives: a copy time that is really waiting for the kernel before it (synchronisation).
    """

    code = "XFR003"
    name = "copies-reported"
    category = Category.PCIE_TRANSFER
    requires = ()
    requires_any = (("report.copy_ms_max",), ("report.ep_memcpy_messages",),
                    ("report.copy_statements", "report.pcie_link_statements"),
                    ("report.copy_statements", "report.slow_statements"))
    optional = ("report.model_ms",)
    title_concepts = ("copy", "pcie_link")
    headline = "Host↔device copies take the time"
    cause = "report.cause.copy"
    measured_by = ("copy.time_share", "stage.h2d.share")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.3  # a third of the time in copies
        stated: float = 0.5  # copies between providers, or a narrow link named
        weak: float = 0.35  # copies named as slow
        min_ms: float = 5.0  # a stated copy time below this is not the bottleneck of a request

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        copy, model = ev.value("report.copy_ms_max"), ev.value("report.model_ms")
        if copy is not None and copy >= t.min_ms:
            if model:
                share = copy / (copy + model)
                if share >= t.min_share:
                    out.append(Signal(share, f"states {fmt_ms(copy)} of copies against {fmt_ms(model)} of compute"))
            else:
                out.append(Signal(t.stated, f"states {fmt_ms(copy)} spent copying"))
        if _n(ev, "report.ep_memcpy_messages"):
            out.append(Signal(t.stated, f"shows ONNX Runtime copying between execution providers "
                                        f"({_quote(ev, 'report.ep_memcpy_messages')})"))
        if _n(ev, "report.copy_statements") and _n(ev, "report.pcie_link_statements"):
            out.append(Signal(t.stated, f"names copies over the PCIe link{_q(ev, 'report.pcie_link_statements')}"))
        if _n(ev, "report.copy_statements") >= 2 and _n(ev, "report.slow_statements"):
            out.append(Signal(t.weak, f"names copies as slow{_q(ev, 'report.copy_statements')}"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            Fix("Copy less, and asynchronously", (
                "Pinned host buffers (pin_memory=True, torch.empty(..., pin_memory=True)) with "
                ".to('cuda', non_blocking=True); one large copy instead of many small ones",
                "Keep tensors on the device between steps; avoid .cpu() / .item() / .numpy() inside the loop "
                "(each one synchronises)",
                "ONNX Runtime: make every node run on the CUDA/TensorRT provider (check the Memcpy warning and "
                "session.get_providers()); use IO binding to keep inputs and outputs on the GPU",
            ), Risk.NEEDS_VALIDATION),
            Fix("Check the link", (
                "nvidia-smi -q | grep -A3 'Link' (or lspci -vv LnkSta): a x16 card trained at x4/x1 or Gen1 "
                "under load is a slot, riser or BIOS problem",
            ), Risk.SAFE),
        ]


class GpuLimitReported(ReportRule):
    """The report shows the GPU itself as the limit: throttled, saturated, or without fast FP16.

    What it detects: throttling named (power cap, thermal, low clocks, power mode), FP16 on a GPU
    whose half precision is no faster than FP32 (Pascal but the P100: GTX 10xx, Titan X/Xp, P4/P40,
    Quadro P-series at 1/64 rate; Kepler and Maxwell parts, without FP16 arithmetic; not the P100, the
    Jetsons, nor Turing onwards, GTX 16xx included), the GPU stated saturated, or
    the model's time charged to the read that waits for it.

    Why it matters: when the GPU is throttled or simply slower than assumed, no change elsewhere
    helps; the fix is cooling, power limits, precision or hardware. CUDA runs a model asynchronously:
    a forward "takes 2 ms" (the launches) and the ``.cpu()`` or ``.item()`` after it "takes 3 s"
    (the read waits for every kernel queued before it), so a report that times those calls without
    synchronising has timed the model in the copy (pytorch#24318, Paddle#35614).

    How it decides: the strongest of: throttling named (``stated``); FP16 on a GPU without fast
    FP16 (``stated``); the GPU stated at or above ``saturated_pct`` % (``weak``); an older or
    embedded GPU named with slowness (``weak``); at least ``min_wait_ms`` charged to a host read of a
    CUDA tensor (``.cpu()``, ``.item()``, ``.to('cpu')``; a copy named otherwise is XFR003's) by a
    text that synchronises nowhere (no ``torch.cuda.synchronize()``, ``CUDA_LAUNCH_BLOCKING=1`` or CUDA
    events in the code it pasted, nor a person saying they synchronised, not negated or asked), in a clause
    that gives the copy no size or rate (``report.sync_read_ms_max``; ``weak``).

    Evidence: any of report.throttle_statements, report.fp16_on_slow_fp16_gpu,
    report.gpu_util_pct_max, report.slow_gpu_statements + report.slow_statements,
    report.sync_read_ms_max.

    Fix: cooling and power limits (nvidia-smi -q -d PERFORMANCE shows the throttle reasons), the
    right precision for the hardware, a faster GPU or more of them; for a read that waited, time the
    model with ``torch.cuda.synchronize()`` first.

    False positives: a GPU at 100 % "utilisation" that only means a kernel was running (SM activity
    can be low); DCGM or a profile tells them apart.
    """

    code = "GPU009"
    name = "gpu-limit-reported"
    category = Category.GPU_COMPUTE
    requires = ()
    requires_any = (("report.throttle_statements",), ("report.fp16_on_slow_fp16_gpu",),
                    ("report.gpu_util_pct_max",), ("report.slow_gpu_statements", "report.slow_statements"),
                    ("report.sync_read_ms_max",))
    optional = ("report.saturated_statements",)
    title_concepts = ("throttle", "slow_gpu_model", "saturated")
    headline = "The GPU itself is the limit"
    cause = "report.cause.gpu"
    measured_by = ("gpu.throttle_ratio", "gpu.util_samples")

    @dataclass(frozen=True)
    class Thresholds:
        stated: float = 0.55  # throttling, or FP16 on hardware without it
        weak: float = 0.4  # the GPU at 100 %, or an older GPU named
        saturated_pct: float = 95.0  # a GPU at ≥ 95 % is busy all the time
        min_wait_ms: float = 5.0  # as XFR003's copy time: less is no request's bottleneck

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        if _n(ev, "report.throttle_statements"):
            out.append(Signal(t.stated, f"names throttling / clocks / power{_q(ev, 'report.throttle_statements')}"))
        if _n(ev, "report.fp16_on_slow_fp16_gpu"):
            out.append(Signal(t.stated, f"runs FP16 on a GPU whose half precision is no faster than FP32 "
                                        f"({_quote(ev, 'report.fp16_on_slow_fp16_gpu')})"))
        gpu = ev.value("report.gpu_util_pct_min")
        if gpu is not None and gpu >= t.saturated_pct:
            out.append(Signal(t.weak, f"states the GPU at {gpu:.0f} %"))
        if _n(ev, "report.slow_gpu_statements") and _n(ev, "report.slow_statements"):
            out.append(Signal(t.weak, f"runs on an older or embedded GPU{_q(ev, 'report.slow_gpu_statements')}"))
        waited = ev.value("report.sync_read_ms_max")
        if waited is not None and waited >= t.min_wait_ms:
            out.append(Signal(t.weak, f"charges {fmt_ms(waited)} to reading a CUDA tensor on the host "
                                      f"({_quote(ev, 'report.sync_read_ms_max')}) and synchronises nowhere: CUDA "
                                      "runs the model asynchronously, so the read waits for the GPU work queued "
                                      "before it, and the time is the model's"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            *([Fix("Time the model, not the read that waits for it", (
                "torch.cuda.synchronize() before each timer read (or torch.cuda.Event(enable_timing=True) pairs): "
                "the forward's time then shows, and .cpu() / .item() takes only the copy's",
                "torch.profiler or nsys: the kernels' time against the Memcpy DtoH's",
            ), Risk.SAFE)] if "report.sync_read_ms_max" in ev else []),
            Fix("Find out why the GPU is slow", (
                "nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,TEMPERATURE while it runs: 'SW Power Cap', 'HW "
                "Slowdown' or 'Thermal' active mean the clocks are held down; fix airflow / power limit "
                "(nvidia-smi -pl) / Jetson power mode (nvpmodel -m 0, jetson_clocks)",
                "Pascal (P40, P4, GTX 10xx, Quadro P) runs FP16 at 1/64 rate, Kepler and Maxwell have no FP16 "
                "arithmetic: use FP32 or INT8 there, or a GPU with tensor cores",
            ), Risk.SAFE),
            Fix("More GPU for the load", (
                "A saturated GPU serves what it serves: batch better, quantise, or add GPUs / replicas",
            ), Risk.NEEDS_VALIDATION),
        ]


class ExternalMemoryReported(ReportRule):
    """The report shows GPU memory held outside the failing process: leftovers, another tenant, a second instance.

    What it detects: an out-of-memory error together with statements that memory is held elsewhere
    (orphaned or zombie workers that survived a kill, memory not released after a process ended,
    another model / server / container on the same GPU), or the CUDA context failing to be created
    at all (``cuDevicePrimaryCtxRetain: CUDA_ERROR_OUT_OF_MEMORY``: the device was full before the
    process allocated anything).

    Why it matters: the process that fails is not the one to fix: the memory it lacks is held by
    something else, and only freeing or isolating that helps.

    How it decides: the strongest of: the context could not be created (``context``); an
    out-of-memory error named (or measured) with memory held elsewhere stated (``stated``); GPU
    memory named as held by leftovers with no error yet (``held``).

    Evidence: report.context_oom_messages, or report.held_elsewhere_statements with
    report.oom_statements, mem.oom_count or report.vram_statements.

    Fix: find and stop what holds the memory (nvidia-smi --query-compute-apps, fuser -v /dev/nvidia*),
    kill orphans with their process group, one model per GPU or MIG/MPS partitions with limits.

    False positives: a second instance that was meant to share the GPU with bounded memory
    (then lower each one's fraction).
    """

    code = "MEM006"
    name = "external-memory-reported"
    category = Category.OOM_EXTERNAL
    requires = ()
    requires_any = (("report.context_oom_messages",), ("report.held_elsewhere_statements", "report.oom_statements"),
                    ("report.held_elsewhere_statements", "mem.oom_count"),
                    ("report.held_elsewhere_statements", "report.vram_statements"))
    optional = ()
    title_concepts = ("held_elsewhere",)
    headline = "GPU memory is held outside the failing process"
    measured_by = ("mem.other_processes_bytes", "gpu.memory_unlisted_bytes")  # nvidia-smi's process list: MEM010

    @dataclass(frozen=True)
    class Thresholds:
        context: float = 0.75  # the device was full before the process started
        stated: float = 0.6  # an OOM with memory held elsewhere named
        held: float = 0.5  # memory held by leftovers named, before anything failed

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        if _n(ev, "report.context_oom_messages"):
            out.append(Signal(t.context, f"shows the CUDA context itself failing for lack of memory "
                                         f"({_quote(ev, 'report.context_oom_messages')})"))
        held = _n(ev, "report.held_elsewhere_statements")
        if held and (_n(ev, "report.oom_statements") or "mem.oom_count" in ev):
            out.append(Signal(t.stated, f"ties the out-of-memory error to memory held elsewhere "
                                        f"({_quote(ev, 'report.held_elsewhere_statements')})"))
        elif held and _n(ev, "report.vram_statements"):
            out.append(Signal(t.held, f"shows GPU memory held by processes that should not hold it "
                                      f"({_quote(ev, 'report.held_elsewhere_statements')})"))
        return out

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            Fix("Free or isolate the memory held elsewhere", (
                "nvidia-smi --query-compute-apps=pid,used_memory,name --format=csv (inside containers: fuser -v "
                "/dev/nvidia*) lists who holds memory; kill orphaned workers with their process group",
                "vLLM: stop the server with SIGTERM (not SIGKILL) so EngineCore and TP workers exit with it; "
                "in containers run an init (docker --init / tini) so children are reaped",
                "One model per GPU, or MIG / MPS partitions with memory limits; two engines on one GPU need each "
                "its own --gpu-memory-utilization adding up to < 1",
            ), Risk.NEEDS_VALIDATION),
        ]


class PeakReported(ReportRule):
    """The report ties an out-of-memory error to the size of the input: a runtime peak.

    What it detects: an out-of-memory error (named in the text or read from a message without
    numbers that decide) together with the input's size: a resolution, a long prompt / audio /
    video, the batch size, the context length, a VAE decode of a large image.

    Why it matters: activations and KV cache grow with the input (attention quadratically with the
    sequence, a VAE decode with the pixels); the weights fit, the working set of one large input
    does not, so the fix bounds the input or processes it in pieces.

    How it decides: an out-of-memory error with the input's size named (``stated``; ``grows`` where memory is
    also said to grow run after run until it fails: what is kept between inputs, MEM009's, is as likely), stronger
    when the report names the input as the cause (``CAUSE``).

    Evidence: report.input_size_statements with report.oom_statements or mem.oom_count.

    Fix: bound the input (max length, resolution, batch), process it in tiles / chunks (tiled VAE,
    chunked prefill, sliding windows), memory-efficient attention.

    False positives: an OOM at load time with a big input named in passing (the weights rules,
    measured, rank first).
    """

    code = "MEM007"
    name = "peak-reported"
    category = Category.OOM_PEAK
    requires = ("report.input_size_statements",)
    requires_any = (("report.oom_statements",), ("mem.oom_count",))
    optional = ()
    title_concepts = ()
    headline = "The input's size sets a runtime peak that does not fit"

    @dataclass(frozen=True)
    class Thresholds:
        stated: float = 0.55  # an OOM with the input's size named
        grows: float = 0.4  # ... beside memory said to grow over runs until it fails (MEM009's weak)

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        phase = ev.get("mem.oom_phase")
        if isinstance(phase, Evidence) and phase.value == "loading":
            return []  # failing while loading: the weights rules own it
        if not _n(ev, "report.oom_statements") and "mem.oom_count" not in ev:
            return []
        # memory said to grow run after run until it fails is what is kept between inputs (a leak, fragmentation)
        # as much as one input's peak: the input's size then speaks no louder than the growth (MEM009's weak)
        impact = t.grows if _n(ev, "report.memory_growth_statements") else t.stated
        return [Signal(impact, f"ties the out-of-memory error to the input's size"
                               f"{_q(ev, 'report.input_size_statements')}")]

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [
            Fix("Bound what one input costs", (
                "Cap the input: max sequence / context length (vLLM --max-model-len, llama.cpp -c), image "
                "resolution, audio/video length per call, batch size",
                "Process it in pieces: tiled VAE decode (diffusers pipe.enable_vae_tiling()), chunked prefill, "
                "sliding windows for long audio; memory-efficient attention (SDPA / xformers / flash-attention)",
            ), Risk.NEEDS_VALIDATION),
        ]


class WeightsReported(ReportRule):
    """The report reads as weights that do not fit the device: an out-of-memory error while loading.

    What it detects: an out-of-memory error named with the model being loaded (the wording of the
    report, weighed by the corpus-fitted cues of ``diagnose.rules.report_model``, leans to oom_weights) when
    no allocator numbers decide it (MEM001 decides with them).

    Why it matters: if the weights alone do not fit, no setting of batch or context helps: the fix
    is more devices (tensor parallelism, sharding), a smaller quantisation, or offloading.

    How it decides: an out-of-memory error named (or read without deciding numbers) while the
    report speaks of loading the model (``stated``), or a model estimated ``oversize`` × the GPU's
    memory with the error (``stated``); when only the wording leans to oom_weights, the report model
    picks this rule (``diagnose.rules.report_model``).

    Evidence: report.oom_statements or mem.oom_count, with report.loading_statements or
    mem.weights_estimate_bytes + gpu.spec_memory_bytes; report.cues for the lean.

    Fix: split the model across GPUs (vLLM --tensor-parallel-size, TGI --num-shard, device_map),
    quantise (AWQ/GPTQ/INT8/FP8, GGUF Q4), or offload part of it (llama.cpp -ngl N, accelerate).

    False positives: an OOM during the first request after loading (the peak rules).
    """

    code = "MEM008"
    name = "weights-reported"
    category = Category.OOM_WEIGHTS
    requires = ()
    requires_any = (("report.cues", "report.oom_statements"), ("report.cues", "mem.oom_count"))
    optional = ("report.loading_statements", "mem.weights_estimate_bytes", "gpu.spec_memory_bytes")
    headline = "The model's weights do not fit the device"

    @dataclass(frozen=True)
    class Thresholds:
        stated: float = 0.55  # an OOM while loading, or a model bigger than its GPU
        oversize: float = 1.0  # weights at least the GPU's memory cannot fit with anything else

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        if _n(ev, "report.loading_statements"):
            out.append(Signal(t.stated, f"fails while loading the model{_q(ev, 'report.loading_statements')}"))
        weights, gpu_mem = ev.value("mem.weights_estimate_bytes"), ev.value("gpu.spec_memory_bytes")
        if weights and gpu_mem and weights >= t.oversize * gpu_mem:
            out.append(Signal(t.stated, f"loads about {size(weights, 0)} of weights on a GPU of "
                                        f"{size(gpu_mem, 0)}"))
        return out

    def check(self, ev: EvidenceSet, t: object) -> Finding | None:
        if not _n(ev, "report.oom_statements") and "mem.oom_count" not in ev:
            return None
        weights = self.thresholds_of(OomWeights)
        m = read_mem(ev)
        if room_for_request(m, weights.free_factor) and not weights_too_big(m, weights.weights_share):
            return None  # the allocator's message shows room for what failed: not the weights (MEM001 yields too)
        return super().check(ev, t)

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [Fix("Make the weights fit", (
            "Split across GPUs: vLLM --tensor-parallel-size N, TGI --num-shard N, SGLang --tp N, transformers "
            "device_map='auto'",
            "Quantise: AWQ/GPTQ (4-bit), FP8 on Hopper/Ada, GGUF Q4_K_M for llama.cpp/ollama",
            "Offload what does not fit (llama.cpp -ngl to the layers that fit, accelerate cpu offload) and expect "
            "the offloaded part to be slow",
        ), Risk.NEEDS_VALIDATION)]


class FragmentationReported(ReportRule):
    """The report reads as allocator fragmentation: memory reserved but unusable, growing over runs.

    What it detects: an out-of-memory error (or memory that keeps growing) whose report leans to
    fragmentation by the corpus-fitted cues (cache clearing, expandable segments, memory growing over
    batches, OOMs that come and go) when no allocator numbers decide it (MEM003 decides with them).

    Why it matters: a fragmented caching allocator fails a request that would fit in the free total;
    the fix is the allocator's configuration, not less work.

    How it decides: an out-of-memory error named with the caching allocator's settings or
    fragmentation discussed (``stated``), or memory named as growing over runs with an error (``weak``);
    when only the wording leans to oom_fragmentation, the report model picks this rule.

    Evidence: report.cues with report.oom_statements, mem.oom_count or report.memory_growth_statements;
    optionally report.allocator_statements.

    Fix: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch ≥ 2.1; PYTORCH_ALLOC_CONF from
    2.9; not with vLLM sleep mode), fixed shapes or buckets, fewer empty_cache() calls.

    False positives: a real leak (memory referenced and never freed) grows the same way.
    """

    code = "MEM009"
    name = "fragmentation-reported"
    category = Category.OOM_FRAGMENTATION
    requires = ()
    requires_any = (("report.cues", "report.oom_statements"), ("report.cues", "mem.oom_count"),
                    ("report.cues", "report.memory_growth_statements"))
    optional = ("report.allocator_statements",)
    headline = "The allocator's memory is fragmented"

    @dataclass(frozen=True)
    class Thresholds:
        stated: float = 0.5  # the allocator's settings discussed with the error
        weak: float = 0.4  # memory growing over runs until it fails

    def signals(self, ev: EvidenceSet, t: Thresholds) -> list[Signal]:  # type: ignore[override]
        out: list[Signal] = []
        failed = _n(ev, "report.oom_statements") or "mem.oom_count" in ev
        if failed and _n(ev, "report.allocator_statements"):
            out.append(Signal(t.stated, f"discusses the caching allocator with the error"
                                        f"{_q(ev, 'report.allocator_statements')}"))
        if failed and _n(ev, "report.memory_growth_statements"):
            out.append(Signal(t.weak, "shows memory growing until it fails"
                              + _q(ev, "report.memory_growth_statements")))
        return out

    def check(self, ev: EvidenceSet, t: object) -> Finding | None:
        if not (_n(ev, "report.oom_statements") or "mem.oom_count" in ev or _n(ev, "report.memory_growth_statements")):
            return None
        return super().check(ev, t)

    def fixes(self, ev: EvidenceSet) -> list[Fix]:
        return [Fix("Let the allocator reuse what it holds", (
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch ≥ 2.1; the newer name is PYTORCH_ALLOC_CONF, "
            "PyTorch ≥ 2.9); not with vLLM's sleep mode (CuMemAllocator)",
            "Pad inputs to a few bucket sizes so blocks are reused; avoid torch.cuda.empty_cache() in the loop",
            "For a slow growth over requests, check for references kept across requests (a leak looks the same)",
        ), Risk.NEEDS_VALIDATION)]


class ExpectedBehaviourReported(Rule):
    """What the report describes is expected behaviour, not a fault: say so.

    What it detects: a serving engine taking most of the GPU's memory up front (vLLM, SGLang, TGI,
    lmdeploy reserve the KV cache at start-up) with no out-of-memory error; a first run slow because
    it downloads weights; a model that stays loaded after a client exits (keep-alive); a report that
    withdraws itself (a false alarm, the reporter's own mistake, a benchmark-methodology artefact).

    Why it matters: an on-call engineer should not chase a "leak" that is a KV-cache reservation, or
    a "slow first request" that is a one-off download.

    How it decides: memory taken up front named (``report.preallocation_statements``, or GPU memory
    statements with a serving engine named) and no out-of-memory statement, nor memory growing or held
    by leftovers, nor an exception a traceback ended with, nor a fix's title ("[fix] relax mem_fraction_static for
    h200": something failed that the setting's change fixes); downloading named with the first run or slowness
    in one clause or the next (``report.download_first_statements``: "the first request is slow: it
    downloads the weights"; a model "downloaded from <source>" is where it came from, not a download);
    staying loaded named; the report
    withdrawing itself (then every other report rule steps aside too). The finding is informational
    (severity info) and never the primary bottleneck.

    Evidence: any of report.preallocation_statements, report.vram_statements + serving.engine,
    report.download_statements, report.keep_alive_statements, report.retraction_statements;
    optionally report.oom_statements, report.exception_lines.

    Fix: nothing to fix; the knobs if the behaviour is unwanted (gpu_memory_utilization,
    --cuda-memory-fraction, pre-downloading weights, keep_alive).

    False positives: memory growing over requests (a real leak) — report.memory_growth_statements
    vetoes the preallocation explanation.
    """

    code = "HLT003"
    name = "expected-behaviour-reported"
    category = Category.OOM_EXTERNAL
    requires = ()
    requires_any = (("report.preallocation_statements",), ("report.vram_statements", "serving.engine"),
                    ("report.download_statements",), ("report.keep_alive_statements",),
                    ("report.retraction_statements",))
    optional = ("report.oom_statements", "report.memory_growth_statements", "report.download_first_statements",
                "report.held_elsewhere_statements", "report.exception_lines")

    @dataclass(frozen=True)
    class Thresholds:
        impact: float = 0.1  # informational: it explains, it is not a bottleneck

    _ENGINES = ("vllm", "sglang", "tgi", "lmdeploy", "text-generation-inference", "tensorrt-llm")

    def lean_finding(self, ev: EvidenceSet, p: float, cues: Sequence[str]) -> Finding:
        """The report's wording reads as a non-issue (a question about expected behaviour)."""
        return self.finding(
            severity=Severity.INFO,
            confidence=Confidence.HEURISTIC,
            title="Reads as expected behaviour, not a fault",
            message=(f"The report's wording reads as a question about expected behaviour ({pct(p)} by cue weights "
                     f"fitted on the real-incident corpus; strongest cues: {', '.join(cues) or 'none single'}), "
                     "and nothing it pasted shows a fault. If it is slow or failing, collect the next steps."),
            impact=0.1,
            evidence=present(ev, "report.cues"),
            fixes=[Fix("Confirm before changing anything", (
                "Compare with the engine's published numbers for the same GPU and model size",
                "Attach while it runs (diagnose attach --pid PID) to measure where the time or memory goes",
            ), Risk.SAFE)],
        )

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        says: list[str] = []
        engine = ev.get("serving.engine")
        engine_name = str(engine.value).lower() if isinstance(engine, Evidence) else ""
        no_oom = not _n(ev, "report.oom_statements") and "mem.oom_count" not in ev
        # memory growing over requests, or held by processes that should be gone, is not a reservation
        growing = _n(ev, "report.memory_growth_statements") or _n(ev, "report.held_elsewhere_statements")
        gpu_host = HOST_NO_GPU not in ev  # a reservation of GPU memory explains nothing where there is no GPU
        # a traceback's exception: something failed (a second instance that did not start), no reservation explains it
        raised = _n(ev, "report.exception_lines")
        # a fix's title ("[fix] relax mem_fraction_static for h200", "fix(test): reduce … gpu_memory_utilization"):
        # something failed that the setting's change fixes, whatever the words say of memory taken up front
        title = ev.get("report.title")
        fixed = isinstance(title, Evidence) and _FIX_TITLE.match(str(title.value)) is not None
        if gpu_host and no_oom and not growing and not raised and not fixed and (
                _n(ev, "report.preallocation_statements")
                or (_n(ev, "report.vram_statements") and engine_name in self._ENGINES)):
            says.append(f"{engine_name or 'the serving engine'} reserves most of the GPU's memory at start-up for "
                        "its KV cache (gpu_memory_utilization, 0.9 by default in vLLM; --mem-fraction-static in "
                        "SGLang; TGI sizes it to the free memory): memory 'used' is not a leak")
        if _n(ev, "report.download_first_statements"):  # a download the first run or the slowness is put to
            says.append("the first run downloads weights; later runs reuse the cache")
        if _n(ev, "report.retraction_statements"):
            says.append("the report itself calls it a false alarm or its own mistake"
                        + _q(ev, "report.retraction_statements"))
        if _n(ev, "report.keep_alive_statements"):
            says.append("the server keeps the model loaded between requests on purpose (ollama keep_alive, 5 "
                        "minutes by default)")
        if not says:
            return None
        return self.finding(
            severity=Severity.INFO,
            confidence=Confidence.HEURISTIC,
            title="Expected behaviour, not a fault",
            message="What the report describes is expected: " + "; ".join(says) + ".",
            impact=t.impact,
            evidence=present(ev, *(k for g in self.requires_any for k in g), *self.optional),
            fixes=[Fix("Nothing to fix; if the behaviour is unwanted", (
                "vLLM: --gpu-memory-utilization 0.5 (less KV cache, fewer concurrent sequences); SGLang: "
                "--mem-fraction-static; TGI: --cuda-memory-fraction",
                "Download weights at build time (huggingface-cli download / a baked image) and mount the cache",
                "ollama: keep_alive=0 in the request or OLLAMA_KEEP_ALIVE to unload sooner",
            ), Risk.SAFE)],
        )


RULES: tuple[type[Rule], ...] = (
    PlacementReported,
    QueueingReported,
    PrefillReported,
    ColdStartReported,
    LaunchOverheadReported,
    ThreadsReported,
    ProcessingReported,
    CopiesReported,
    GpuLimitReported,
    ExternalMemoryReported,
    PeakReported,
    WeightsReported,
    FragmentationReported,
    ExpectedBehaviourReported,
)
REPORT_CODES = frozenset(r.code for r in RULES)


def wording_only(f: Finding) -> bool:
    """A finding of the report model's lean alone (``ReportRule.lean_finding``): the report's words lean to its
    category, and nothing it states, shows or names does: no cause named, no title, no number, no message."""
    return claims_only(f) and bool(f.evidence) and all(e.key == "report.cues" for e in f.evidence)


TITLE_KEYS = ("report.title", "report.title_concepts")


def title_only(f: Finding) -> bool:
    """A report rule's finding on the issue's title alone: the title names its bottleneck and nothing the text
    states, shows or names beside it speaks for it (``ReportRule.check``). A title names what a thread is about,
    which is not always its cause ("Max concurrency support")."""
    return claims_only(f) and bool(f.evidence) and all(e.key in TITLE_KEYS for e in f.evidence)


def claims_only(f: Finding) -> bool:
    """A finding of the report rules: it rests on what a report's prose says, not on anything parsed
    from a log, table, trace or measurement."""
    return f.code in REPORT_CODES
