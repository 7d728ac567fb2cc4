"""What an incident report says (``diagnose.collectors.claims``) → ``report.*`` evidence, all of ``low`` quality.

Every key is a claim of the text, not a measurement: a count of statements naming a concept, or the
numbers the text ties to one (``report.gpu_util_pct_max`` is the largest GPU utilisation the text
states). The ``report`` rules (``rules/report.py``) judge from them with heuristic confidence, so a
measured source (a profile, a log's own stats lines, an allocator message) always outranks them.
Each item's ``detail`` quotes the clause it came from.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from diagnose.collectors.claims import ClaimParser, Claims
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality

KIND = "report"


def _values(c: Claims, concept: str, dim: str) -> list[float]:
    return [q.value for q in c.bound.get(concept, ()) if q.dim == dim]


def _first_quote(c: Claims, *names: str) -> str:
    for n in names:
        if n in c.quotes:
            return f"\"{c.quotes[n]}\""
    return ""


class ReportSource:
    """TextSource for what a pasted report says (kind ``report``): the head of an input only."""

    kind = KIND
    triggers = ()  # prose and pasted messages: an incident report fits in the head

    def __init__(self) -> None:
        self._p = ClaimParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return bool(self._evidence_items("x"))

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        return self._evidence_items(source)

    def _evidence_items(self, source: str) -> list[Evidence]:
        c = self._p.claims
        ev = Emit(source, quality=Quality.LOW)  # what a report says, not a measurement

        def count(key: str, n: int, what: str, *quote: str) -> None:
            if n:
                ev.add(key, n, "statements", f"{what}: {_first_quote(c, *quote)}".rstrip(": "))

        def top(key: str, values: Iterable[float], unit: str, what: str, *quote: str,
                pick: Callable[[Iterable[float]], float] = max) -> None:
            vals = list(values)
            if vals:
                ev.add(key, pick(vals), unit, f"{what}: {_first_quote(c, *quote)}".rstrip(": "))

        con, msg = c.concepts, c.messages
        # -- where the work runs ------------------------------------------------------------
        count("report.cpu_fallback_messages", msg["cpu_fallback"] + msg["ollama_cpu"],
              "framework messages saying the work runs on the CPU", "msg:cpu_fallback", "msg:ollama_cpu")
        if c.decode_alone and c.decode_beside_prefill:
            alone, low = max(c.decode_alone), min(c.decode_beside_prefill)
            if low > 0 and alone > low:
                ev.add("report.prefill_stall_ratio", round(alone / low, 2), "ratio",
                       f"a running request's decode alone and beside another request's prefill: {alone:g} tok/s "
                       f"against {low:g} tok/s")
        if c.ollama_cpu_share:
            ev.add("report.ollama_cpu_share", c.ollama_cpu_share, "ratio",
                   "the share of the model ollama keeps in system memory (`ollama ps` PROCESSOR, CPU/GPU)")
        count("report.exception_lines", c.exceptions, "exceptions a traceback ended with", "exception")
        count("report.one_at_a_time_messages", msg["one_at_a_time"], "an engine's messages that it serves one request "
              "at a time", "msg:one_at_a_time")
        count("report.tf_gpu_libs_messages", msg["tf_gpu_libs"],
              "TensorFlow could not load the CUDA libraries its GPU device needs", "msg:tf_gpu_libs")
        count("report.ep_cpu_node_messages", msg["ep_cpu_node"], "ONNX Runtime leaving ops to its CPU provider for "
              "want of a GPU kernel", "msg:ep_cpu_node")
        count("report.placement_statements", con["placement_cpu"], "statements that the work runs on the CPU",
              "placement_cpu")
        count("report.wrong_gpu_statements", con["wrong_gpu"], "statements about which GPU is used", "wrong_gpu")
        count("report.no_gpu_statements", con["no_gpu"], "statements that the machine has no GPU", "no_gpu")
        count("report.offload_statements", con["offload"], "statements about offloading layers", "offload")
        count("report.offload_settings", msg["weights_offloaded"] + msg["tensors_on_cpu"], "settings that keep "
              "weights in host memory (--cpu-offload-gb, --n-cpu-moe, -ot …=CPU)", "msg:weights_offloaded",
              "msg:tensors_on_cpu")
        count("report.cpu_tensor_settings", msg["tensors_on_cpu"], "llama.cpp settings computing tensors on the CPU "
              "(--n-cpu-moe, -ot …=CPU)", "msg:tensors_on_cpu")
        if c.layers is not None:
            off, total = c.layers
            ev.add("report.gpu_layers_offloaded", off, "layers", f"layers on the GPU (llama.cpp/ollama): "
                   f"{off}/{total if total >= 0 else '?'}")
            if total > 0:
                ev.add("report.gpu_layers_total", total, "layers", "the model's layers")
        # a GPU's utilisation is a share of its time, at most 100 %: a larger figure is another quantity's (top's CPU
        # percent of many cores, "sometimes 18000%" continuing the CPU's sentence)
        gpu_util = [v for v in _values(c, "gpu_util", "pct") if v <= 100.0]
        top("report.gpu_util_pct_max", gpu_util, "%", "GPU utilisation the text states", "gpu_util")
        top("report.gpu_util_pct_min", gpu_util, "%", "GPU utilisation the text states", "gpu_util", pick=min)
        top("report.cpu_util_pct_max", _values(c, "cpu_util", "pct"), "%", "CPU utilisation the text states",
            "cpu_util")
        # -- requests waiting ---------------------------------------------------------------
        count("report.sequential_statements", con["sequential"], "statements that requests are served one by one",
              "sequential")
        count("report.queue_statements", con["queue"], "statements about queued/waiting requests", "queue")
        count("report.rejection_messages", msg["slot_unavailable"], "requests rejected for lack of capacity",
              "msg:slot_unavailable")
        count("report.preemption_messages", msg["preempted"], "preemption / retraction messages", "msg:preempted")
        count("report.capacity_settings", con["capacity_cap"], "capacity settings named", "capacity_cap")
        count("report.concurrency_statements", con["concurrency"], "statements about concurrent requests",
              "concurrency")
        top("report.queue_ms_max", _values(c, "queue", "time"), "ms", "queue/wait time the text states", "queue")
        if c.load_concurrency:
            ev.add("report.load_concurrency", c.load_concurrency, "requests",
                   "requests a load generator's command keeps in flight (inf: --request-rate inf, all at once)")
        top("report.concurrency_max", [q.value for k in ("concurrency", "queue") for q in c.bound.get(k, ())
                                       if q.dim in ("count:concurrency", "count:requests")],
            "requests", "concurrency the text states", "concurrency")
        # -- prefill / first token ----------------------------------------------------------
        count("report.prefill_statements", con["prefill"], "statements about prompt processing (prefill)",
              "prefill")
        count("report.decode_statements", con["decode"], "statements about token generation (decode)", "decode")
        top("report.ttft_ms_max", _values(c, "ttft", "time"), "ms", "time to first token the text states", "ttft")
        top("report.prefill_ms_max", _values(c, "prefill", "time"), "ms", "prompt-processing time the text states",
            "prefill")
        top("report.prefill_tokens_per_s", _values(c, "prefill", "rate"), "tokens/s",
            "prompt-processing speed the text states", "prefill", pick=min)
        top("report.prompt_tokens_max", [q.value * (1000 if q.dim == "count:ktokens" else 1)
                                         for k in ("prompt_len", "prefill", "ttft") for q in c.bound.get(k, ())
                                         if q.dim in ("count:tokens", "count:ktokens", "bare")],
            "tokens", "prompt length the text states", "prompt_len", "prefill")
        top("report.decode_ms_max", _values(c, "decode", "time"), "ms", "generation time the text states", "decode")
        top("report.decode_tokens_per_s", [v for v, owner in c.token_rates if owner not in ("prefill", "ttft",
                                                                                           "prompt_len")],
            "tokens/s", "the slowest generation speed the text states", "decode", pick=min)
        count("report.prompt_reprocess_messages", msg["prompt_reprocess"], "the whole prompt processed again",
              "msg:prompt_reprocess")
        # -- compilation, warm-up and cold starts --------------------------------------------
        count("report.compile_statements", con["compile"], "statements about compiling / building / warm-up",
              "compile")
        count("report.recompile_statements", con["recompile"], "statements about recompiles or shape changes",
              "recompile")
        count("report.recompile_limit_messages", msg["recompile_limit"], "recompile-limit messages",
              "msg:recompile_limit")
        count("report.engine_build_messages", msg["engine_build"], "engine build / graph capture / warm-up messages",
              "msg:engine_build")
        count("report.engine_cache_unsaved_messages", msg["engine_cache_unsaved"],
              "messages that the engine built could not be saved to its cache", "msg:engine_cache_unsaved")
        top("report.compile_ms_max", _values(c, "compile", "time") + _values(c, "recompile", "time"), "ms",
            "compile / build / warm-up time the text states", "compile", "recompile")
        count("report.first_statements", con["first"], "statements about the first requests (cold start)", "first")
        if c.first_steady:
            first, steady = max(c.first_steady, key=lambda p: p[0] / max(p[1], 1e-9))
            ev.add("report.first_ms", first, "ms",
                   f"the first request's time the text states: {_first_quote(c, 'first')}")
            ev.add("report.steady_ms", steady, "ms", "the later requests' time stated in the same sentence")
        top("report.first_ms_stated", _values(c, "first", "time"), "ms", "time of the first request(s) stated",
            "first")
        top("report.first_factor", [q.value for k in ("first", "compile") for q in c.bound.get(k, ())
                                    if q.dim == "factor"], "x", "how much slower the first request is, as stated",
            "first")
        # -- the host's launch path ---------------------------------------------------------
        count("report.cuda_graph_statements", con["cuda_graph"], "statements about CUDA graphs / eager mode",
              "cuda_graph")
        count("report.cuda_graph_on_statements", con["cuda_graph_on"], "statements that CUDA graphs are captured / "
              "in use", "cuda_graph_on")
        count("report.cuda_graphs_off_messages", msg["cuda_graphs_off"], "settings that turn CUDA graphs off",
              "msg:cuda_graphs_off")
        count("report.launch_statements", con["launch"], "statements about kernel-launch / host overhead", "launch")
        count("report.cpu_bound_statements", con["cpu_bound"], "statements that the CPU is the limit", "cpu_bound")
        count("report.capped_statements", con["capped"], "statements that a figure stopped following the load",
              "capped")
        count("report.input_size_statements", con["input_size"], "statements about the input's size (resolution, "
              "length, batch)", "input_size")
        count("report.batch_statements", con["batch"], "statements about the batch size", "batch")
        for concept, key in (("preprocess", "preprocess"), ("postprocess", "preprocess"), ("queue", "queue"),
                             ("threads", "threads"), ("copy", "copy"), ("compile", "compile"),
                             ("recompile", "compile"), ("launch", "launch"), ("cuda_graph", "launch"),
                             ("placement_cpu", "placement"), ("offload", "placement"), ("prefill", "prefill"),
                             ("throttle", "gpu"), ("contention", "threads"), ("quota", "threads"),
                             ("serialize", "preprocess"), ("cpu_bound", "cpu")):
            if c.caused.get(concept):
                ev.add(f"report.cause.{key}", c.caused[concept], "statements",
                       f"the report names it as the cause: {_first_quote(c, 'causal')}")
        # -- threads and cores ----------------------------------------------------------------
        count("report.thread_statements", con["threads"], "statements about thread counts", "threads")
        count("report.quota_statements", con["quota"], "statements about a CPU quota / limit / throttling", "quota")
        count("report.contention_statements", con["contention"], "statements about contention", "contention")
        top("report.threads_max", [q.value for q in c.bound.get("threads", ()) if q.dim in ("count:threads", "bare")]
            + [q.value for k in ("cpu", "cores") for q in c.bound.get(k, ()) if q.dim == "count:threads"],
            "threads", "thread count the text states", "threads")
        top("report.cores_stated", [q.value for k in ("cores", "threads", "cpu") for q in c.bound.get(k, ())
                                    if q.dim == "count:cores"], "cores", "core count the text states", "cores",
            pick=min)
        if len(c.thread_rates) >= 2:
            best = max(c.thread_rates, key=lambda p: p[1])
            most = max(c.thread_rates, key=lambda p: p[0])
            if best[0] < most[0] and most[1] > 0:
                ev.add("report.fewer_threads_speedup", best[1] / most[1], "x",
                       f"{best[0]:.0f} threads give {best[1]:g}/s where {most[0]:.0f} give {most[1]:g}/s")
                ev.add("report.threads_best", best[0], "threads", "the thread count with the best rate stated")
        # -- pre/post-processing --------------------------------------------------------------
        count("report.preprocess_statements", con["preprocess"] + con["postprocess"],
              "statements about pre/post-processing", "preprocess", "postprocess")
        count("report.serialize_statements", con["serialize"], "statements about serialisation", "serialize")
        top("report.preprocess_ms_max", _values(c, "preprocess", "time"), "ms", "pre-processing time stated",
            "preprocess")
        top("report.postprocess_ms_max", _values(c, "postprocess", "time"), "ms", "post-processing time stated",
            "postprocess")
        top("report.model_ms", _values(c, "model_time", "time"), "ms", "model/inference time stated", "model_time",
            pick=min)
        # -- copies ---------------------------------------------------------------------------
        # a read of a CUDA tensor on the host in a text that synchronises nowhere waits for the GPU: no copy named
        count("report.copy_statements", con["copy"] - (0 if c.synced else c.sync_read_clauses),
              "statements about host↔device copies", "copy")
        count("report.pcie_link_statements", con["pcie_link"], "statements about the PCIe link", "pcie_link")
        count("report.ep_memcpy_messages", msg["ep_memcpy"], "ONNX Runtime copies between execution providers",
              "msg:ep_memcpy")
        if c.synced:  # it synchronised before timing: a time charged to .cpu() is the copy's own
            top("report.copy_ms_max", _values(c, "copy", "time") + c.sync_read_ms, "ms", "copy time stated", "copy")
        else:
            top("report.copy_ms_max", _values(c, "copy", "time"), "ms", "copy time stated", "copy")
            top("report.sync_read_ms_max", c.sync_read_ms, "ms", "time charged to a host read of a CUDA tensor "
                "(.cpu(), .item()), nothing synchronised", "sync_read")
        # -- the GPU itself ---------------------------------------------------------------------
        count("report.throttle_statements", con["throttle"], "statements about throttling / clocks / heat", "throttle")
        count("report.saturated_statements", con["saturated"], "statements that the GPU is fully used", "saturated")
        if con["slow_fp16_gpu"] and con["fp16"]:
            ev.add("report.fp16_on_slow_fp16_gpu", 1, "flag",
                   f"half precision on a GPU whose FP16 is no faster than FP32: {_first_quote(c, 'slow_fp16_gpu')}")
        count("report.slow_gpu_statements", con["slow_gpu_model"], "statements naming an older / embedded GPU",
              "slow_gpu_model")
        # -- behaviour by design -----------------------------------------------------------------
        count("report.preallocation_statements", con["preallocate"], "statements about memory taken up front",
              "preallocate")
        count("report.vram_statements", con["vram"], "statements about GPU memory use", "vram")
        count("report.download_statements", con["download"], "statements about downloading weights", "download")
        count("report.first_compile_statements", c.first_compile, "statements tying a first request to compiling",
              "first_compile")
        count("report.download_first_statements", c.first_download, "statements naming a download with the first "
              "run or slowness", "download_first")
        count("report.keep_alive_statements", con["keep_alive"], "statements that a model stays loaded", "keep_alive")
        count("report.retraction_statements", con["retracted"], "the report withdraws itself", "retracted")
        count("report.memory_growth_statements", con["memory_grows"], "statements that memory grows", "memory_grows")
        count("report.oom_statements", con["oom"], "statements about out-of-memory errors", "oom")
        count("report.loading_statements", con["loading"], "statements about loading the model", "loading")
        count("report.allocator_statements", con["empty_cache"], "statements about the caching allocator's "
              "settings (empty_cache, expandable_segments, fragmentation)", "empty_cache")
        count("report.held_elsewhere_statements", con["held_elsewhere"],
              "statements that memory is held outside the failing process", "held_elsewhere")
        count("report.context_oom_messages", msg["ctx_oom"], "the CUDA context could not be created: device full",
              "msg:ctx_oom")
        count("report.slow_statements", con["slow"], "statements that it is slow", "slow")
        if ev.items:
            ev.add("report.clauses", c.clauses, "clauses", "clauses read")
            ev.add("report.cues", cues(c), "",
                   "concepts the text names (c:), in its title (t:), as the cause (k:), and "
                   "framework messages (m:): what diagnose.rules.report_model weighs")
            if c.title:
                ev.add("report.title", c.title, "", "the report's first line")
                # (a title about CUDA graphs captured or on, their capture time, is no sign of eager mode's launches)
                named = c.title_concepts - ({"copy"} if c.title_sync_read and not c.synced else set()) \
                    - ({"concurrency"} if c.title_slot_only else set()) \
                    - ({"cuda_graph"} if c.title_graphs_on_only else set())
                ev.add("report.title_concepts", sorted(named), "", "concepts the first line names")
        elif c.clauses and (words := {k: v for k, v in cues(c).items() if k.startswith("w:")}):
            # a person's text that names no concept we count: too little for a report rule to judge on,
            # but its words still rank the differential (``diagnose.rules.calibration.lean``)
            ev.add("report.words", words, "", "the words of a report that names no counted concept: what "
                   "diagnose.rules.report_model weighs for the differential only")
        return ev.items


VOCABULARY_PATH = os.path.join(os.path.dirname(os.path.realpath(__file__)), "report_vocabulary.txt")
_VOCABULARY: frozenset[str] | None = None


def vocabulary() -> frozenset[str]:
    """The words the report model weighs (written by ``python -m diagnose.rules.report_fit`` from the train
    split: words and word pairs found in at least three incidents), empty when none was written."""
    global _VOCABULARY
    if _VOCABULARY is None:
        try:
            with open(VOCABULARY_PATH, encoding="utf-8") as fh:
                _VOCABULARY = frozenset(w.strip() for w in fh if w.strip() and not w.startswith("#"))
        except FileNotFoundError:
            _VOCABULARY = frozenset()
    return _VOCABULARY


def set_vocabulary(words: frozenset[str] | None) -> None:
    """Replace the vocabulary in use (the model's trainer; None re-reads the file)."""
    global _VOCABULARY
    _VOCABULARY = words


# what a rule reads more finely than the report model needs: a polarity of a concept it has (graphs said to be on), and
# one setting of two engines' kinds (llama.cpp's tensors on the CPU, a setting that keeps weights in host memory)
_RULE_ONLY = frozenset({"cuda_graph_on", "slow_fp16_gpu", "no_gpu"})
_SAME_CUE = {"tensors_on_cpu": "weights_offloaded", "ep_cpu_node": "cpu_fallback", "tf_gpu_libs": "cpu_fallback"}


def cues(c: Claims) -> dict[str, float]:
    """The report as a sparse vector of cues, each in 0..1: how often a concept is named (saturating
    at three), named in the title, named as the cause; how often a framework message appears; which
    words of the model's vocabulary it uses."""
    out: dict[str, float] = {f"w:{w}": 1.0 for w in c.words & vocabulary()}
    # a host read of a CUDA tensor (".cpu() takes 3 s") in a text that synchronises nowhere waits for the model: no
    # copy named, as the counts above have it
    reads = 0 if c.synced else c.sync_read_clauses
    for name, n in c.concepts.items():
        if name not in _RULE_ONLY and (n := n - reads if name == "copy" else n) > 0:
            out[f"c:{name}"] = min(n, 3) / 3
    for name in c.title_concepts - ({"copy"} if c.title_sync_read and not c.synced else set()):
        out[f"t:{name}"] = 1.0
    for name in c.caused:
        out[f"k:{name}"] = 1.0
    messages = dict(c.messages)
    for name, into in _SAME_CUE.items():
        messages[into] = messages.get(into, 0) + messages.pop(name, 0)
    for name, n in messages.items():
        out[f"m:{name}"] = min(n, 2) / 2
    return dict(sorted(out.items()))  # a stable order: reports and goldens must not depend on hashing


def sources() -> list[ReportSource]:
    return [ReportSource()]
