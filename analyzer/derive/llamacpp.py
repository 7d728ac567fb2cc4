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

KIND = "llama.cpp-timings"


class LlamaTimingSource:
    """TextSource for llama.cpp-family timing lines (kind ``llama.cpp-timings``)."""

    kind = KIND
    triggers = ("eval time", "eval duration", "eval count", "total time", "load time", "Processing Prompt",
                "Generate:")

    def __init__(self) -> None:
        self._p = LlamaTimingParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def _result(self) -> LlamaTimings:
        return self._p.result()

    def matched(self) -> bool:
        r = self._result()
        return bool(r.generations) or bool(r.prompt_tokens_seen)

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
            ev.add("stage.prefill_ms.mean", fmean(prompt), "ms",
                   f"{fmt} prompt eval time over {len(prompt)} generation(s)")
            ev.add("latency.ttft_ms.mean", fmean(prompt), "ms",
                   f"{fmt}: the prompt eval time is the wait for the first "
                   "token")
        if gen:
            ev.add("stage.decode_ms.mean", fmean(gen), "ms",
                   f"{fmt} eval (generation) time over {len(gen)} generation(s)")
        if both:
            total = sum(p + d for p, d in both)
            share = sum(p for p, _ in both) / total if total else 0.0
            ev.add("stage.prefill.share", share, "ratio", f"prompt eval time / (prompt eval + eval) over {len(both)} "
                   "generation(s)")
            ev.add("stage.decode.share", 1.0 - share, "ratio", "eval time / (prompt eval + eval)")
            ev.add("latency.e2e_ms.mean", total / len(both), "ms", f"{fmt} prompt eval + eval per generation")
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
        return ev.items


def sources() -> list[LlamaTimingSource]:
    return [LlamaTimingSource()]
