"""llama.cpp / ollama / koboldcpp timing output → ``stage.*``, ``tokens.*`` and ``latency.*`` evidence.

A generation's time splits into prompt processing (prefill: ``stage.prefill_ms``) and token
generation (``stage.decode_ms``); their shares of the two (``stage.prefill.share``,
``stage.decode.share``) are what TTF001 judges, and the prompt eval time is the time to first
token (``latency.ttft_ms``) of these single-stream servers.
"""

from __future__ import annotations

from statistics import fmean

from diagnose.collectors.llamacpp import LlamaTimingParser, LlamaTimings
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality
from diagnose.units import MIB

KIND = "llama.cpp-timings"


class LlamaTimingSource:
    """TextSource for llama.cpp-family timing lines (kind ``llama.cpp-timings``)."""

    kind = KIND
    triggers = ("eval time", "eval duration", "eval count", "total time", "load time", "sample time", "sampling time",
                "Processing Prompt",
                "Generate:", "POST /v1/", "Disconnected from client", "layers to GPU", "buffer size",
                "ggml_cuda_init", "layers.requested=", "prompt processing, n_tokens", "n_decoded =", "n_gen =",
                "n_threads", "buffer, size")

    def __init__(self) -> None:
        self._p = LlamaTimingParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def feed_raw(self, lines: list[str]) -> None:
        self._p.feed_raw(lines)

    def _result(self) -> LlamaTimings:
        return self._p.result()

    def matched(self) -> bool:
        r = self._result()
        return (bool(r.generations) or bool(r.prompt_tokens_seen) or r.offloaded is not None
                or r.gpu_backend is not None or bool(r.prefill_progress) or bool(r.threads))

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        r = self._result()
        gens = r.generations
        fmt = "/".join(sorted(r.formats)) or "llama.cpp"
        ev = Emit(source, quality=Quality.LOW if len(gens) < 3 else Quality.GOOD)
        prompt = [g.prompt_ms for g in gens if g.prompt_ms is not None]
        gen = [g.gen_ms for g in gens if g.gen_ms is not None]
        both = [(g.prompt_ms, g.gen_ms) for g in gens if g.prompt_ms is not None and g.gen_ms is not None]
        ptok = [g.prompt_tokens for g in gens if g.prompt_tokens] or r.prompt_tokens_seen
        gtok = [g.gen_tokens for g in gens if g.gen_tokens]
        n = len(gens)
        if prompt:
            # the prompt eval time is the engine's prefill, not the time to first token: a request that waited
            # for another to finish waited before its prompt eval began
            ev.add("stage.prefill_ms.mean", fmean(prompt), "ms",
                   f"{fmt} prompt eval time over {len(prompt)} generation(s)")
        if gen:
            ev.add("stage.decode_ms.mean", fmean(gen), "ms",
                   f"{fmt} eval (generation) time over {len(gen)} generation(s)")
        if both:
            # the sampler's time (llama.cpp's "sample time", on the CPU apart from eval) where every such
            # generation printed it: the third part of the generation's time, post-processing the logits
            sampled = [g.sample_ms for g in gens if g.prompt_ms is not None and g.gen_ms is not None]
            sample = sum(x for x in sampled if x is not None) if sampled and None not in sampled else 0.0
            # koboldcpp's Init (the host's preparation before the prompt: tokenising, the context's fast-forward
            # or shift) where every such generation printed it: a part before prefill
            inits = [g.init_ms for g in gens if g.prompt_ms is not None and g.gen_ms is not None]
            init = sum(x for x in inits if x is not None) if inits and None not in inits else 0.0
            parts = ("init + " if init else "") + "prompt eval + eval" + (" + sample" if sample else "")
            total = sum(p + d for p, d in both) + sample + init
            share = sum(p for p, _ in both) / total if total else 0.0
            ev.add("stage.prefill.share", share, "ratio", f"prompt eval time / ({parts}) over {len(both)} "
                   "generation(s)")
            ev.add("stage.decode.share", sum(d for _, d in both) / total if total else 0.0, "ratio",
                   f"eval time / ({parts})")
            if sample:
                ev.add("stage.postprocess.share", sample / total, "ratio", f"{fmt} sample time / ({parts}): the "
                       "sampler's work on the CPU (grammar, penalties, top-k over the vocabulary) per token")
                ev.add("stage.postprocess_ms.mean", sample / len(both), "ms", f"{fmt} sample time per generation")
            if init:
                ev.add("stage.preprocess.share", init / total, "ratio", f"{fmt} Init / ({parts}): the host's "
                       "preparation before the prompt is processed (tokenising, fast-forwarding the context)")
                ev.add("stage.preprocess_ms.mean", init / len(both), "ms", f"{fmt} Init per generation")
            ev.add("latency.e2e_ms.mean", total / len(both), "ms", f"{fmt} {parts} per generation")
        running = list(r.prefill_progress.values())
        if running and not gens and not r.generating:
            # a prompt still in processing when the log ends (llama-server's progress lines), no prompt finished
            # (llama-server prints "prompt eval time" only when a request ends, with its eval time) and no token
            # generated: the request's time in the engine so far is all prefill, and its first token comes after
            so_far = [t_s * 1000.0 for _, _, t_s in running]
            ev.add("stage.prefill_ms.mean", fmean(so_far), "ms",
                   f"llama-server's prompt processing progress: seconds so far, {len(so_far)} prompt(s)")
            ev.add("stage.prefill.share", 1.0, "ratio", "llama-server was still processing the prompt at its last "
                   f"progress line ({max(so_far) / 1000.0:.1f} s in, no token generated yet): all the time so far")
            rate = sum(n for n, _, _ in running) / (sum(so_far) / 1000.0) if sum(so_far) else 0.0
            ev.add("serving.prompt_tokens_per_s", rate, "tokens/s", "llama-server's prompt processing progress")
        if ptok:
            ev.add("tokens.input_mean", fmean(ptok), "tokens", f"{fmt} prompt tokens per generation")
        if gtok:
            ev.add("tokens.output_mean", fmean(gtok), "tokens", f"{fmt} generated tokens per generation")
        if prompt and ptok and len(prompt) == len(ptok):
            rate = sum(ptok) / (sum(prompt) / 1000.0) if sum(prompt) else 0.0
            ev.add("serving.prompt_tokens_per_s", rate, "tokens/s", f"{fmt} prompt processing speed")
        if gen and gtok and len(gen) == len(gtok):
            rate = sum(gtok) / (sum(gen) / 1000.0) if sum(gen) else 0.0
            ev.add("serving.generation_tokens_per_s", rate, "tokens/s", f"{fmt} generation speed")
        if n:
            ev.add("requests.count", n, "requests", f"{fmt} generations with timings")
        _one_at_a_time(r, ev)
        if r.offloaded is not None:
            on_gpu, layers = r.offloaded
            what = ("ollama's offload record (layers.offload of layers.model)" if r.ollama_offload else
                    "the model loader's 'offloaded N/M layers to GPU' line") + (
                f" (of {len(r.load_list)} loads, the served model's last)"
                if len(r.load_list) > 1 else "")
            ev.add("llamacpp.gpu_layers", on_gpu, "layers", what, Quality.GOOD)
            ev.add("llamacpp.layers_total", layers, "layers", what, Quality.GOOD)
        if r.weights_bytes is not None:
            ev.add("mem.weights_bytes", r.weights_bytes, "bytes", "ollama's offload record (memory.weights.total), "
                   "a load onto one GPU", Quality.GOOD)
        worst = r.metal_worst
        if worst is not None:
            allocated, ws, model = worst.allocated_mib, worst.working_set_mib, worst.model_mib
            of = f" (the furthest past it of {len(r.metal_loads)} loads)" if len(r.metal_loads) > 1 else ""
            ev.add("llamacpp.metal_allocated_bytes", int(allocated * MIB), "bytes",
                   "the most Metal allocated at once (its allocation lines' running total)" + of, Quality.GOOD)
            ev.add("llamacpp.metal_working_set_bytes", int(ws * MIB), "bytes",
                   "the GPU's recommended max working set, as Metal's allocation lines give it" + of, Quality.GOOD)
            if model and model <= allocated:  # (more weights than allocated in all: lines of two loads mixed)
                ev.add("llamacpp.metal_model_bytes", int(model * MIB), "bytes",
                       "the model's weights on the Metal device (the loader's Metal buffer) of that load", Quality.GOOD)
        if r.gpu_backend is not None or r.ollama_backend is not None:
            ev.add("llamacpp.gpu_backend", r.gpu_backend or r.ollama_backend, "",
                   "a buffer llama.cpp allocated on this GPU device (or CUDA's device count at start-up)"
                   if r.gpu_backend else "the GPU library ollama's offload record names", Quality.GOOD)
        if r.threads:
            # the start-up that runs the most threads per CPU it sees (a log of several starts: the worst one)
            n, batch, hw = max(r.threads, key=lambda x: max(x[0], x[1] or 0) / x[2])
            what = "ggml's system info line at start-up (n_threads" + (", n_threads_batch" if batch else "") + \
                " / the logical CPUs the host has)"
            ev.add("llamacpp.threads", n, "threads", what, Quality.GOOD)
            if batch is not None:
                ev.add("llamacpp.threads_batch", batch, "threads", what, Quality.GOOD)
            ev.add("llamacpp.host_cpus", hw, "cpus", what, Quality.GOOD)
            if r.build_gpu:
                ev.add("llamacpp.build_gpu", 1, "flag", "the system info line lists a GPU backend of the build",
                       Quality.GOOD)
        if r.auto_sized:
            ev.add("llamacpp.offload_auto_sized", 1, "flag", "ollama chose the layers to offload from the memory it "
                   "found (layers.requested=-1)", Quality.GOOD)
        return ev.items


MIN_COMPLETIONS = 5  # timing blocks with arrivals before them: fewer say nothing of a queue


def _one_at_a_time(r: LlamaTimings, ev: Emit) -> None:
    """llama-cpp-python's server serves one request at a time: the requests in flight at each finished
    generation beyond that one were waiting (the engine's queue, as its scheduler statistics)."""
    if len(r.in_flight) >= MIN_COMPLETIONS:
        waiting = [max(0, n - 1) for n in r.in_flight]
        what = (f"llama-cpp-python access lines begun and not yet finished at each of {len(waiting)} timing blocks; "
                "its server runs one request at a time")
        ev.add("serving.engine", "llama.cpp", "", "llama-cpp-python server log (uvicorn access lines, timing blocks)")
        ev.add("serving.stat_samples", len(waiting), "count", what)
        ev.add("serving.running_max", 1, "requests", what)
        ev.add("serving.waiting_max", max(waiting), "requests", what)
        ev.add("serving.waiting_mean", fmean(waiting), "requests", what)
        queued = [w for w in waiting if w > 0]
        ev.add("serving.queued_samples", len(queued), "count", "timing blocks with a request waiting")
        ev.add("serving.queued_sample_ratio", len(queued) / len(waiting), "ratio",
               "share of timing blocks with a request waiting")
        if queued:
            ev.add("serving.running_when_queued_mean", 1, "requests", what)
            ev.add("serving.running_when_queued_max", 1, "requests", what)
        ev.add("serving.max_num_seqs", 1, "requests", "llama-cpp-python's server: one request at a time")
    if r.disconnects and r.arrivals:
        ev.add("serving.streams_cut", r.disconnects, "requests",
               f"requests the server ended early ('Disconnected from client'), of {r.arrivals} begun; "
               f"{len(r.generations)} finished with timings")


def sources() -> list[LlamaTimingSource]:
    return [LlamaTimingSource()]
