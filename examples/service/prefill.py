"""``prefill``: streaming generation where the whole-prompt prefill of long prompts dominates TTFT.

Streaming text generation with a small GPT-style decoder (8 layers, KV cache) run by ONE
``model-worker`` engine thread (``engine.GenerationEngine``) that does continuous batching WITHOUT
chunked prefill and without a prefix cache: each step decodes one token for every running request
and prefills each new prompt it admits in a single forward (causal attention over the whole
prompt, so the cost grows faster than the prompt length). The body is ``{"prompt": "text",
"max_tokens": 64, "stream": true}`` (or ``"prompt_tokens": [ids]``); the word-level tokeniser makes
one token per word. The reply is chunked NDJSON, one line ``{"index", "token", "text"}`` per token
as it is generated, then a summary line with ``"done": true`` and the request's
ttft/queue/prefill/decode times (``"stream": false``: one JSON reply). Prompts of thousands of
tokens take seconds to prefill, dominate time to first token, and stall the other requests' token
streams.

``--fixed`` (TTF001's fix): chunked prefill. Each engine step has a 512-token budget (decodes
first, then prompt chunks, 256 tokens kept for admitting waiting prompts), so a long prompt no
longer stalls the token streams or the prompts behind it. Time to first token does not fall: on
one CPU thread the decode steps interleaved with the chunks are not free, as they are on a GPU.
"""

from __future__ import annotations

import itertools
import queue
import re
import time
import zlib
from collections.abc import Iterator
from typing import Any

import torch

from diagnose.examples.service.base import (
    JOB_TIMEOUT_S,
    STOP_TIMEOUT_S,
    BadRequest,
    InferenceResult,
    Pathology,
    parse_json,
)
from diagnose.examples.service.engine import GenerationEngine, GenRequest
from diagnose.examples.service.metrics import Metrics
from diagnose.examples.service.model import DecoderConfig, TinyDecoderLM

# ~15 M parameters. On one CPU thread a 4k-token prompt takes ~1.5-2.5 s to prefill (a 512-token one
# ~0.2 s: attention is quadratic in the prompt), one decode step of 4 sequences ~10-40 ms.
PREFILL_MODEL = DecoderConfig(vocab=8192, d_model=320, n_heads=5, d_hidden=1280, n_layers=8, max_model_len=8192)

_WORD = re.compile(r"\w+|[^\w\s]")
DEFAULT_MAX_TOKENS = 128
MAX_MAX_TOKENS = 1024
CHUNKED_PREFILL_TOKENS = 512  # prefill --fixed: the step's token budget (vLLM --max-num-batched-tokens)
LONG_PREFILL_TOKENS = 256  # ... of which this many are kept for admitting waiting requests


def tokenize(text: str, vocab: int) -> list[int]:
    """A word-level tokeniser: each word or punctuation mark hashes (CRC-32) to an id in [1, vocab)."""
    return [1 + zlib.crc32(w.lower().encode()) % (vocab - 1) for w in _WORD.findall(text)]


def detokenize(token: int) -> str:
    return f" t{token}"


class PrefillPathology(Pathology):
    """Streaming generation where the prefill of long prompts dominates time to first token."""

    name = "prefill"

    def __init__(self, cfg: DecoderConfig = PREFILL_MODEL, *, chunked: bool = False) -> None:
        torch.manual_seed(0)
        self.cfg = cfg
        self.model = TinyDecoderLM(cfg).eval()
        if chunked:  # the fix: vLLM's --enable-chunked-prefill --max-num-batched-tokens 512
            self.engine = GenerationEngine(self.model, chunked_prefill=True,
                                           max_num_batched_tokens=CHUNKED_PREFILL_TOKENS,
                                           long_prefill_token_threshold=LONG_PREFILL_TOKENS)
        else:
            self.engine = GenerationEngine(self.model)
        self.engine.start()
        self._ids = itertools.count(1)

    def bind_metrics(self, metrics: Metrics) -> None:
        self.engine.on_tokens = metrics.engine_step

    def warmup(self) -> None:
        for n in (64, 1024):
            req = self.make_request(list(range(1, n + 1)), 8, time.perf_counter())
            self.engine.submit(req)
            for _ in self.tokens(req):
                pass

    def make_request(self, prompt: list[int], max_tokens: int, arrival: float, stream: bool = True) -> GenRequest:
        n = next(self._ids)
        return GenRequest(f"gen-{n}", prompt, max_tokens, arrival, stream=stream, seed=n)

    def submit(self, body: bytes, arrival: float) -> GenRequest:
        """Parse and tokenise a request, hand it to the engine; raises BadRequest."""
        doc = parse_json(body)
        if isinstance(doc.get("prompt"), str) and doc["prompt"].strip():
            prompt = tokenize(doc["prompt"], self.cfg.vocab)
        elif isinstance(doc.get("prompt_tokens"), list) and doc["prompt_tokens"] and all(
            isinstance(t, int) for t in doc["prompt_tokens"]
        ):
            prompt = [t % self.cfg.vocab for t in doc["prompt_tokens"]]
        else:
            raise BadRequest("body needs 'prompt' (non-empty text) or 'prompt_tokens' (a list of integers)")
        if not prompt:
            raise BadRequest("the prompt has no tokens")
        max_tokens = doc.get("max_tokens", DEFAULT_MAX_TOKENS)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_MAX_TOKENS:
            raise BadRequest(f"'max_tokens' must be an integer in [1, {MAX_MAX_TOKENS}]")
        stream = doc.get("stream", True)
        if not isinstance(stream, bool):
            raise BadRequest("'stream' must be true or false")
        if len(prompt) + max_tokens > self.cfg.max_model_len:
            raise BadRequest(
                f"this model's maximum context length is {self.cfg.max_model_len} tokens; the prompt has "
                f"{len(prompt)} and max_tokens is {max_tokens}"
            )
        req = self.make_request(prompt, max_tokens, arrival, stream)
        try:
            self.engine.submit(req)
        except RuntimeError as exc:
            raise BadRequest(str(exc)) from exc
        return req

    def tokens(self, req: GenRequest) -> Iterator[tuple[int, float]]:
        """The request's tokens as the engine produces them: (token id, perf_counter time)."""
        while True:
            try:
                item = req.events.get(timeout=JOB_TIMEOUT_S)
            except queue.Empty:
                raise TimeoutError("the model worker did not produce a token in time") from None
            if item is None:
                if req.error is not None:
                    raise req.error
                if req.cancelled.is_set():
                    raise RuntimeError("the request was cancelled")
                return
            yield item

    def cancel(self, req: GenRequest) -> None:
        self.engine.cancel(req)

    def infer(self, body: bytes, content_type: str) -> InferenceResult:
        raise NotImplementedError("prefill streams its replies; the HTTP handler calls submit() and tokens()")

    def running_waiting(self, in_flight: int) -> tuple[int, int]:
        return self.engine.counts()

    def kv_cache_usage(self) -> float:
        return self.engine.kv_cache_usage()

    def stats(self) -> dict[str, Any]:
        running, waiting = self.engine.counts()
        return {
            "queue_depth": waiting,
            "running": running,
            "kv_cache_usage": round(self.engine.kv_cache_usage(), 4),
            "kv_cache_tokens": self.engine.kv_blocks * self.engine.block_size,
            "engine_steps": self.engine.steps,
            "prefills": self.engine.prefills,
        }

    def close(self) -> None:
        # Wait for the step in progress: a daemon thread still inside a torch kernel when the
        # interpreter exits aborts the process.
        self.engine.stop()
        self.engine.join(timeout=STOP_TIMEOUT_S)


def make(fixed: bool = False) -> Pathology:
    """The prefill service, or with ``fixed`` its fix (chunked prefill)."""
    return PrefillPathology(chunked=fixed)
