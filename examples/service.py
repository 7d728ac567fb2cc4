"""The demo inference service: a real HTTP service around a small real PyTorch model (CPU).

Run one pathology at a time::

    python -m examples.service --pathology cpu-preprocess [--port 0] [--host 127.0.0.1]

Once it serves it prints exactly one line to stdout, ``READY port=<N> pid=<PID>``; everything
else goes to stderr. Endpoints:

* ``GET /healthz``  -> 200 ``{"status": "ok", ...}``
* ``POST /infer``   -> a real inference, JSON reply with a summary of the result (``prefill``:
  a streamed generation, see below)
* ``GET /stats``    -> JSON counters (in flight, queue depth, completed, compiles, ...)
* ``GET /metrics``  -> Prometheus text with vLLM's metric names and buckets, computed from the
  real request timings (see ``Metrics``)
* ``POST /v1/completions`` (``prefill`` only) -> OpenAI's completions API, streamed as server-sent
  events with ``"stream": true``

Pathologies (what a profiler attached to this process should see):

``cpu-preprocess``
    The body is a JPEG. Each request thread decodes it with PIL, blurs it, auto-contrasts it,
    resizes and crops it to 224x224 and normalises it in numpy with several naive passes, then
    runs a tiny CNN. Preprocessing dominates the CPU time of the request path.
``recompile``
    The model is wrapped in ``torch.compile(dynamic=False)`` and every request is served with a
    batch size the service has not seen before, so dynamo/inductor recompile on every call.
``queueing``
    A threaded HTTP front, but every inference goes through ONE ``model-worker`` thread fed by a
    ``queue.Queue``; each inference is ~40-80 ms of single-threaded matmuls. Under a dozen
    concurrent clients requests pile up waiting for the one busy worker.
``healthy``
    The same design as ``queueing`` with a small, fast model (~5-10 ms); under light load nothing
    is saturated.
``prefill``
    Streaming text generation with a small GPT-style decoder (8 layers, KV cache) run by ONE
    ``model-worker`` engine thread that does continuous batching WITHOUT chunked prefill and
    without a prefix cache: each step prefills at most one new prompt in a single forward
    (causal attention over the whole prompt, so the cost grows faster than the prompt length),
    then decodes one token for every running request. The body is
    ``{"prompt": "text", "max_tokens": 64, "stream": true}`` (or ``"prompt_tokens": [ids]``);
    the word-level tokeniser makes one token per word. The reply is chunked NDJSON, one line
    ``{"index", "token", "text"}`` per token as it is generated, then a summary line with
    ``"done": true`` and the request's ttft/queue/prefill/decode times (``"stream": false``: one
    JSON reply). Prompts of thousands of tokens take seconds to prefill, dominate time to first
    token, and stall the other requests' token streams.

``--fixed`` serves the same endpoints and the same load with the fix ``diagnose`` recommends for
the pathology applied (``/healthz`` and ``/stats`` then carry ``"fixed": true``):

``cpu-preprocess --fixed``
    Cheap pre-processing (JPEG decoded at reduced scale, one crop-and-resize to 224x224, one
    vectorised float32 normalisation); ``--preprocess-workers N`` runs it in a process pool.
``recompile --fixed``
    ``torch.compile(dynamic=True)``: the batch dimension is symbolic, and its two graphs (batch 1
    and batch N) are compiled before READY; the batcher's new sizes no longer recompile.
``queueing --fixed``
    One model-worker thread per core (2-4) on the shared queue, each batching the waiting requests
    into one forward (dynamic batching, up to 8).
``prefill --fixed``
    Chunked prefill: each engine step has a 512-token budget (decodes first, then prompt chunks,
    256 tokens kept for admitting waiting prompts), so a long prompt no longer stalls the token
    streams or the prompts behind it. Time to first token does not fall: on one CPU thread the
    decode steps interleaved with the chunks are not free, as they are on a GPU.
``healthy --fixed``
    Nothing to fix: the same as ``healthy``.
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import io
import itertools
import json
import logging
import multiprocessing
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import numpy as np
import torch
from PIL import Image, ImageFilter, ImageOps
from torch import nn
from torch.nn import functional as F

from collectors import torch_probe

log = logging.getLogger("examples.service")

PATHOLOGY_NAMES: tuple[str, ...] = ("cpu-preprocess", "recompile", "queueing", "healthy", "prefill")

IMAGE_SIZE = 224
RESIZE_SHORT_SIDE = 256
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
MAX_BODY_BYTES = 32 * 1024 * 1024
JOB_TIMEOUT_S = 300.0


class BadRequest(ValueError):
    """The request cannot be served (answered with HTTP 400)."""


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class TinyCNN(nn.Module):
    """A small image classifier: three strided convolutions, global pooling, a linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MLPBlock(nn.Module):
    """Pre-norm residual feed-forward block (the MLP half of a transformer layer)."""

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, d_hidden)
        self.down = nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(self.norm(x))))


class TokenClassifier(nn.Module):
    """Embedding -> stack of MLP blocks -> mean pool -> linear head (a text classifier)."""

    def __init__(self, vocab: int, d_model: int, d_hidden: int, n_blocks: int, num_classes: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.Sequential(*[MLPBlock(d_model, d_hidden) for _ in range(n_blocks)])
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.embed(tokens)).mean(dim=1))


class ResidualLinear(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


class FeatureMLP(nn.Module):
    """A deep, narrow residual MLP over feature rows; the model ``recompile`` wraps in torch.compile.

    Many small layers make each compile mostly Python-side work (dynamo tracing, AOT autograd,
    inductor lowering and scheduling) while the generated C++ kernels are few and identical, so
    the C++ compiler, which runs in a child process, is a minority of the compile time.
    """

    def __init__(self, in_features: int = 64, width: int = 128, depth: int = 32, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Linear(in_features, width)
        self.blocks = nn.Sequential(*[ResidualLinear(width) for _ in range(depth)])
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int
    d_model: int
    n_heads: int
    d_hidden: int
    n_layers: int
    max_model_len: int


# ~15 M parameters. On one CPU thread a 4k-token prompt takes ~1.5-2.5 s to prefill (a 512-token one
# ~0.2 s: attention is quadratic in the prompt), one decode step of 4 sequences ~10-40 ms.
PREFILL_MODEL = DecoderConfig(vocab=8192, d_model=320, n_heads=5, d_hidden=1280, n_layers=8, max_model_len=8192)

KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [heads, capacity, head_dim]


class DecoderLayer(nn.Module):
    """A pre-norm transformer decoder layer: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, d_model: int, n_heads: int, d_hidden: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, d_hidden)
        self.down = nn.Linear(d_hidden, d_model)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.norm2(x))))
        return out

    def prefill(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x ``[1, L, d]``: attention of every prompt position over all earlier ones (O(L²)); fills the cache."""
        _, length, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(1, length, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cache[0][:, :length] = k[0]
        cache[1][:, :length] = v[0]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(1, length, d))
        return self._mlp(x)

    def decode(
        self, x: torch.Tensor, positions: list[int], caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """x ``[B, d]``: one new token per sequence, attending over its own cached keys and values."""
        batch, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, 3, self.n_heads, self.head_dim).unbind(1)
        out = []
        for b, (pos, (kc, vc)) in enumerate(zip(positions, caches, strict=True)):
            kc[:, pos] = k[b]
            vc[:, pos] = v[b]
            a = F.scaled_dot_product_attention(q[b][None, :, None], kc[None, :, : pos + 1], vc[None, :, : pos + 1])
            out.append(a.reshape(d))
        x = x + self.proj(torch.stack(out))
        return self._mlp(x)

    def prefill_chunk(self, x: torch.Tensor, start: int, cache: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """x ``[1, C, d]``: prompt positions ``start .. start+C-1`` (chunked prefill, the ``--fixed`` prefill).

        Writes the chunk's keys and values into the cache, then lets every position attend over the
        cached prefix and the chunk's earlier positions; with ``start == 0`` this is ``prefill``.
        """
        _, length, d = x.shape
        end = start + length
        q, k, v = self.qkv(self.norm1(x)).view(1, length, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cache[0][:, start:end] = k[0]
        cache[1][:, start:end] = v[0]
        if start == 0:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(length, end, dtype=torch.bool).tril(diagonal=start)  # j <= start + i
            a = F.scaled_dot_product_attention(q, cache[0][None, :, :end], cache[1][None, :, :end], attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(1, length, d))
        return self._mlp(x)


class TinyDecoderLM(nn.Module):
    """A small GPT-style language model with a KV cache: ``prefill`` a prompt, then ``decode`` token by token."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_model_len, cfg.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg.d_model, cfg.n_heads, cfg.d_hidden) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def new_cache(self, capacity: int) -> KVCache:
        heads, head_dim = self.cfg.n_heads, self.cfg.d_model // self.cfg.n_heads
        return [
            (torch.empty(heads, capacity, head_dim), torch.empty(heads, capacity, head_dim))
            for _ in range(self.cfg.n_layers)
        ]

    def _decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, m) for m in self.layers]

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(h), self.embed.weight)  # the LM head is tied to the embedding

    def prefill(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """ids ``[L]`` → logits ``[vocab]`` of the next token; the whole prompt in one forward."""
        length = ids.shape[0]
        x = (self.embed(ids) + self.pos(torch.arange(length)))[None]
        for layer, layer_cache in zip(self._decoder_layers(), cache, strict=True):
            x = layer.prefill(x, layer_cache)
        return self._logits(x[0, -1])

    def prefill_chunk(self, ids: torch.Tensor, start: int, cache: KVCache) -> torch.Tensor:
        """ids ``[C]``, the prompt's tokens from position ``start`` → logits ``[vocab]`` after the chunk.

        Prefilling a prompt chunk by chunk fills the same cache and ends with the same logits as
        ``prefill`` (up to float rounding); the logits matter only after the last chunk.
        """
        length = ids.shape[0]
        x = (self.embed(ids) + self.pos(torch.arange(start, start + length)))[None]
        for layer, layer_cache in zip(self._decoder_layers(), cache, strict=True):
            x = layer.prefill_chunk(x, start, layer_cache)
        return self._logits(x[0, -1])

    def decode(self, tokens: list[int], positions: list[int], caches: list[KVCache]) -> torch.Tensor:
        """One decode step for a batch of sequences → logits ``[B, vocab]``."""
        x = self.embed(torch.tensor(tokens)) + self.pos(torch.tensor(positions))
        for i, layer in enumerate(self._decoder_layers()):
            x = layer.decode(x, positions, [c[i] for c in caches])
        return self._logits(x)


def summarize_logits(logits: torch.Tensor) -> dict[str, Any]:
    """The JSON result of an inference: top class and its probability per row."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_p, top_c = probs.max(dim=-1)
    return {
        "rows": int(probs.shape[0]),
        "top_class": [int(c) for c in top_c.tolist()[:8]],
        "top_prob": [round(float(p), 4) for p in top_p.tolist()[:8]],
    }


# --------------------------------------------------------------------------------------------
# Preprocessing (cpu-preprocess): deliberately serial and naive, as found in many services
# --------------------------------------------------------------------------------------------


def decode_image(data: bytes) -> Image.Image:
    """Decode the JPEG at full resolution (no ``draft`` mode) and convert to RGB."""
    img = Image.open(io.BytesIO(data))
    img = ImageOps.exif_transpose(img)
    return img.convert("RGB")


def denoise(img: Image.Image) -> Image.Image:
    """Blur then stretch contrast, at full resolution, before resizing."""
    img = img.filter(ImageFilter.GaussianBlur(radius=1.5))
    return ImageOps.autocontrast(img, cutoff=1)


def resize(img: Image.Image, size: int = IMAGE_SIZE, short_side: int = RESIZE_SHORT_SIDE) -> Image.Image:
    """Resize the short side to ``short_side`` with Lanczos, then centre-crop ``size`` x ``size``."""
    w, h = img.size
    scale = short_side / min(w, h)
    img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.Resampling.LANCZOS)
    w, h = img.size
    left, top = (w - size) // 2, (h - size) // 2
    return img.crop((left, top, left + size, top + size))


def normalize(img: Image.Image) -> np.ndarray:
    """HWC uint8 -> CHW float32, ImageNet mean/std, one channel at a time, in float64."""
    arr = np.asarray(img)
    channels = []
    for c in range(3):
        ch = arr[:, :, c].astype(np.float64)  # strided copy of one channel
        ch = ch / 255.0
        ch = (ch - IMAGENET_MEAN[c]) / IMAGENET_STD[c]
        channels.append(ch)
    chw = np.stack(channels, axis=0)
    chw = np.clip(chw, -3.0, 3.0)  # a second pass: clip outliers ...
    mean = chw.mean(axis=(1, 2), keepdims=True)  # ... then per-image standardisation, two more passes
    std = chw.std(axis=(1, 2), keepdims=True)
    chw = (chw - mean) / (std + 1e-6)
    return np.ascontiguousarray(chw.astype(np.float32))


def preprocess(data: bytes) -> np.ndarray:
    """JPEG bytes -> normalised 3x224x224 float32 array."""
    img = decode_image(data)
    img = denoise(img)
    img = resize(img)
    return normalize(img)


# Preprocessing, fixed (cpu-preprocess --fixed): what CPU001/STG001 recommend. Decode at reduced
# scale (libjpeg's DCT scaling, which also low-passes the image as the blur did), crop and resize
# ONCE to the model's input size, normalise in one vectorised float32 pass; run in a process pool,
# off the request threads and their GIL.
_NORM_SCALE = (1.0 / (255.0 * np.array(IMAGENET_STD))).astype(np.float32)
_NORM_OFFSET = (np.array(IMAGENET_MEAN) / np.array(IMAGENET_STD)).astype(np.float32)


def decode_resize_fast(data: bytes, size: int = IMAGE_SIZE, short_side: int = RESIZE_SHORT_SIDE) -> Image.Image:
    """The same centre crop as ``resize(decode_image(...))``, decoded at the smallest JPEG scale that
    still covers ``size`` pixels and resampled once (bilinear) straight to ``size`` x ``size``."""
    src = Image.open(io.BytesIO(data))
    src.draft("RGB", (size, size))  # JPEG: decode at 1/2, 1/4 or 1/8 scale when that is still >= size
    img = ImageOps.exif_transpose(src).convert("RGB")
    w, h = img.size
    side = min(w, h) * size / short_side  # the crop of the original pipeline, in decoded pixels
    left, top = (w - side) / 2, (h - side) / 2
    return img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side))


def normalize_fast(img: Image.Image) -> np.ndarray:
    """``normalize`` in float32 with whole-array operations over contiguous channel rows."""
    w, h = img.size
    chw = np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1), dtype=np.float32).reshape(3, -1)
    chw *= _NORM_SCALE[:, None]  # ImageNet mean/std
    chw -= _NORM_OFFSET[:, None]
    np.clip(chw, -3.0, 3.0, out=chw)
    chw -= chw.mean(axis=1, keepdims=True)  # per-image standardisation
    chw /= chw.std(axis=1, keepdims=True) + 1e-6
    return chw.reshape(3, h, w)


def preprocess_fast(data: bytes) -> np.ndarray:
    """JPEG bytes -> normalised 3x224x224 float32 array, the cheap way (``preprocess``'s fix)."""
    return normalize_fast(decode_resize_fast(data))


# --------------------------------------------------------------------------------------------
# Request bookkeeping and metrics (vLLM-compatible names)
# --------------------------------------------------------------------------------------------

# Bucket bounds follow vLLM's (vllm/v1/metrics/loggers.py). The request-latency families (e2e,
# queue, prefill, decode, inference) start at 0.3 s in vLLM; the fine bounds below 0.3 s are
# added here so that the millisecond-scale pathologies (healthy, queueing) keep usable quantiles.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0,
                           2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
                           1920.0, 7680.0)


def build_1_2_5_buckets(max_value: int) -> tuple[float, ...]:
    """vLLM's token-count buckets: 1, 2, 5, 10, 20, 50, ... up to ``max_value``."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            value = m * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(float(value))
        exponent += 1


class _Histogram:
    """A cumulative Prometheus histogram (``le`` buckets, ``_sum``, ``_count``); not locked itself."""

    def __init__(self, buckets: tuple[float, ...] = REQUEST_LATENCY_BUCKETS) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.total += value
        self.n += 1
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1

    def exposition(self, name: str, help_: str, label: str) -> list[str]:
        lines = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        for b, c in zip(self.buckets, self.counts, strict=True):
            lines.append(f'{name}_bucket{{{label},le="{float(b)!r}"}} {c}')
        lines.append(f'{name}_bucket{{{label},le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum{{{label}}} {self.total!r}")
        lines.append(f"{name}_count{{{label}}} {self.n}")
        return lines


@dataclass(frozen=True)
class GenerationTimings:
    """What a finished text-generation request measured, in seconds (vLLM's definitions).

    ``ttft_s``: arrival → first token; ``prefill_s``: scheduled → first token; ``decode_s``: first
    → last token; ``inference_s``: scheduled → last token; ``itl_s``: the gaps between tokens.
    """

    ttft_s: float
    prefill_s: float
    decode_s: float
    inference_s: float
    itl_s: tuple[float, ...]
    output_tokens: int


# (attribute, exposed name, help, buckets)
_HISTOGRAMS: tuple[tuple[str, str, str, tuple[float, ...]], ...] = (
    ("ttft", "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("itl", "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    ("e2e", "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
     REQUEST_LATENCY_BUCKETS),
    ("queue_time", "vllm:request_queue_time_seconds",
     "Histogram of time spent in WAITING phase for request.", REQUEST_LATENCY_BUCKETS),
    ("inference_time", "vllm:request_inference_time_seconds",
     "Histogram of time spent in RUNNING phase for request.", REQUEST_LATENCY_BUCKETS),
    ("prefill_time", "vllm:request_prefill_time_seconds",
     "Histogram of time spent in PREFILL phase for request.", REQUEST_LATENCY_BUCKETS),
    ("decode_time", "vllm:request_decode_time_seconds",
     "Histogram of time spent in DECODE phase for request.", REQUEST_LATENCY_BUCKETS),
    ("prompt_len", "vllm:request_prompt_tokens", "Number of prefill tokens processed.",
     build_1_2_5_buckets(8192)),
    ("generation_len", "vllm:request_generation_tokens", "Number of generation tokens processed.",
     build_1_2_5_buckets(8192)),
)

# (attribute, exposed name, help)
_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("completed", "vllm:request_success_total", "Count of successfully processed requests."),
    ("prompt_tokens", "vllm:prompt_tokens_total", "Number of prefill tokens processed."),
    ("generation_tokens", "vllm:generation_tokens_total", "Number of generation tokens processed."),
    ("preemptions", "vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
    ("prefix_cache_queries", "vllm:prefix_cache_queries_total",
     "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits", "vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
)


class Metrics:
    """Thread-safe counters and histograms of the service, exposed with vLLM's metric names.

    Every pathology exposes every family; a family that has no meaning for a pathology (time to
    first token for an image classifier, the KV cache of a model without one) stays at zero.
    As in vLLM, token counters are counted when the engine processes the tokens, time to first
    token and inter-token latency when each token is produced, and the other histograms when a
    request finishes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.completed = 0
        self.errors = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.ttft = _Histogram(TTFT_BUCKETS)
        self.itl = _Histogram(ITL_BUCKETS)
        self.e2e = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.queue_time = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.inference_time = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.prefill_time = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.decode_time = _Histogram(REQUEST_LATENCY_BUCKETS)
        self.prompt_len = _Histogram(build_1_2_5_buckets(8192))
        self.generation_len = _Histogram(build_1_2_5_buckets(8192))
        self.started = time.time()

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1

    def count_tokens(
        self,
        *,
        prompt: int = 0,
        generation: int = 0,
        prefix_queries: int = 0,
        prefix_hits: int = 0,
        preemptions: int = 0,
    ) -> None:
        """Add tokens the engine has just processed (called from the engine, once per step)."""
        with self._lock:
            self.prompt_tokens += prompt
            self.generation_tokens += generation
            self.prefix_cache_queries += prefix_queries
            self.prefix_cache_hits += prefix_hits
            self.preemptions += preemptions

    def observe_token(self, *, ttft_s: float | None = None, itl_s: float | None = None) -> None:
        """A generated token reached the client: its time to first token, or its gap to the previous one."""
        with self._lock:
            if ttft_s is not None:
                self.ttft.observe(ttft_s)
            if itl_s is not None:
                self.itl.observe(itl_s)

    def end(
        self,
        *,
        ok: bool,
        e2e_s: float,
        queue_s: float | None,
        prompt_tokens: int | None = None,
        generation: GenerationTimings | None = None,
    ) -> None:
        """Close one request: the histograms of a successful one, the error count otherwise.

        ``generation`` feeds the prefill, decode, inference and generation-length histograms; its
        time to first token and inter-token gaps were observed already, through ``observe_token``.
        """
        with self._lock:
            self.in_flight -= 1
            if not ok:
                self.errors += 1
                return
            self.completed += 1
            self.e2e.observe(e2e_s)
            if queue_s is not None:
                self.queue_time.observe(queue_s)
            if prompt_tokens is not None:
                self.prompt_len.observe(prompt_tokens)
            if generation is not None:
                g = generation
                self.prefill_time.observe(g.prefill_s)
                self.decode_time.observe(g.decode_s)
                self.inference_time.observe(g.inference_s)
                self.generation_len.observe(g.output_tokens)

    def prometheus(self, model_name: str, running: int, waiting: int, kv_cache_usage: float = 0.0) -> str:
        """The Prometheus text exposition (format 0.0.4) of every family."""
        label = f'model_name="{model_name}"'
        lines: list[str] = []
        with self._lock:
            for name, help_, value in (
                ("vllm:num_requests_running", "Number of requests in model execution batches.", running),
                ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
                ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", kv_cache_usage),
            ):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} gauge", f"{name}{{{label}}} {value!r}"]
            for attr, name, help_ in _COUNTERS:
                value = getattr(self, attr)
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} counter", f"{name}{{{label}}} {value}"]
            for attr, name, help_, _buckets in _HISTOGRAMS:
                lines += getattr(self, attr).exposition(name, help_, label)
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# Pathologies
# --------------------------------------------------------------------------------------------


@dataclass
class InferenceResult:
    body: dict[str, Any]
    stages_ms: dict[str, float]
    queue_s: float | None = None
    prompt_tokens: int | None = None  # tokens the model read, for models that read tokens


class Pathology:
    """One way of serving /infer. Subclasses implement ``warmup`` and ``infer``."""

    name: str = ""

    def bind_metrics(self, metrics: Metrics) -> None:
        """The server's metrics, for pathologies whose engine counts tokens as it processes them."""

    def kv_cache_usage(self) -> float:
        """Fraction 0..1 of the KV cache in use (0 for models without one)."""
        return 0.0

    def warmup(self) -> None:
        raise NotImplementedError

    def infer(self, body: bytes, content_type: str) -> InferenceResult:
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        return {}

    def running_waiting(self, in_flight: int) -> tuple[int, int]:
        return in_flight, 0

    def close(self) -> None:
        pass


def _parse_json(body: bytes) -> dict[str, Any]:
    if not body:
        return {}
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    return doc


class CpuPreprocessPathology(Pathology):
    """Serial JPEG decode/blur/resize/normalise in the request thread, then a tiny CNN."""

    name = "cpu-preprocess"

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = TinyCNN().eval()

    def warmup(self) -> None:
        from examples.loadgen import make_jpeg

        for _ in range(2):
            self._run(make_jpeg())

    def _preprocess(self, jpeg: bytes) -> np.ndarray:
        return preprocess(jpeg)

    def _run(self, jpeg: bytes) -> InferenceResult:
        t0 = time.perf_counter()
        x = self._preprocess(jpeg)
        t1 = time.perf_counter()
        with torch.no_grad():
            logits = self.model(torch.from_numpy(x).unsqueeze(0))
        t2 = time.perf_counter()
        out = summarize_logits(logits)
        t3 = time.perf_counter()
        stages = {"preprocess": (t1 - t0) * 1e3, "forward": (t2 - t1) * 1e3, "postprocess": (t3 - t2) * 1e3}
        return InferenceResult(out, stages)

    def infer(self, body: bytes, content_type: str) -> InferenceResult:
        if content_type.startswith("application/json"):
            doc = _parse_json(body)
            try:
                jpeg = base64.b64decode(doc["image_b64"], validate=True)
            except (KeyError, TypeError, ValueError) as exc:
                raise BadRequest("JSON body needs an 'image_b64' field with a base64 JPEG") from exc
        else:
            jpeg = body
        if not jpeg:
            raise BadRequest("empty image")
        try:
            return self._run(jpeg)
        except (OSError, Image.DecompressionBombError) as exc:
            raise BadRequest(f"cannot decode image: {exc}") from exc


class FastPreprocessPathology(CpuPreprocessPathology):
    """``cpu-preprocess --fixed``: the same service and model with CPU001/STG001's fix applied.

    The pre-processing is made cheap (``preprocess_fast``: reduced-scale JPEG decode, one resize
    to the model's input size, one vectorised float32 normalisation). With ``pool_workers`` > 0 it
    runs in a process pool, off the request threads and the GIL; by default it stays in the
    request thread: PIL and numpy release the GIL in their C loops, so on a 2-core host the pool's
    pickling and extra processes cost more than they save (measured: lower throughput, and the
    run queue holds more threads than cores).
    """

    def __init__(self, pool_workers: int = 0) -> None:
        super().__init__()
        n = max(0, pool_workers)
        # forkserver: a fork of this process (torch's thread pools started) is not safe
        self.pool = (ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("forkserver"))
                     if n > 0 else None)
        self.pool_workers = n

    def warmup(self) -> None:
        from examples.loadgen import make_jpeg

        jpeg = make_jpeg()
        if self.pool is not None:  # start every worker (each imports this module) before READY
            for f in [self.pool.submit(preprocess_fast, jpeg) for _ in range(2 * self.pool_workers)]:
                f.result(timeout=JOB_TIMEOUT_S)
        for _ in range(2):
            self._run(jpeg)

    def _preprocess(self, jpeg: bytes) -> np.ndarray:
        if self.pool is None:
            return preprocess_fast(jpeg)
        return self.pool.submit(preprocess_fast, jpeg).result(timeout=JOB_TIMEOUT_S)

    def stats(self) -> dict[str, Any]:
        return {"preprocess_pool_workers": self.pool_workers}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def default_pool_workers() -> int:
    """Worker processes or threads for a fixed variant: one per core, at least 2, at most 4."""
    return max(2, min(4, os.cpu_count() or 2))


def configure_recompile_storm(limit: int = 1000) -> None:
    """Let dynamo keep recompiling: raise its recompile limit and keep inductor in-process."""
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    # The default recompile limit is 8: after 8 distinct shapes dynamo stops compiling this frame
    # and the service *silently* falls back to eager, which hides the storm after a few seconds.
    # Raise it (and the accumulated limit) so the recompiles go on for the whole observation window.
    # (``recompile_limit`` is the current name; older torch calls it ``cache_size_limit``.)
    if hasattr(dynamo_config, "recompile_limit"):
        dynamo_config.recompile_limit = limit
    else:  # pragma: no cover - older torch
        dynamo_config.cache_size_limit = limit
    if hasattr(dynamo_config, "accumulated_recompile_limit"):
        dynamo_config.accumulated_recompile_limit = max(limit, dynamo_config.accumulated_recompile_limit)
    elif hasattr(dynamo_config, "accumulated_cache_size_limit"):  # pragma: no cover - older torch
        dynamo_config.accumulated_cache_size_limit = max(limit, dynamo_config.accumulated_cache_size_limit)
    # With compile_threads > 1 inductor compiles in a pool of worker *processes*; with 1 the
    # codegen and the C++ compiler calls stay in this process, where a profiler of the service
    # sees them (under torch/_inductor frames of the request thread).
    inductor_config.compile_threads = 1


class RecompilePathology(Pathology):
    """``torch.compile(dynamic=False)`` fed a never-seen batch size on every request."""

    name = "recompile"
    features = 64

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.eager = FeatureMLP(self.features).eval()
        self.model = torch.compile(self.eager, dynamic=False)
        # The "micro-batcher": the batch size follows the traffic. A counter makes every batch
        # size new, so every call specialises (recompiles) a fresh graph.
        self._batch_sizes = itertools.count(1)
        self._sizes_lock = threading.Lock()
        self._seen: set[int] = set()

    def _next_batch_size(self) -> int:
        with self._sizes_lock:
            return next(self._batch_sizes)

    def warmup(self) -> None:
        # One shape only, so the cold start (imports, first codegen) is behind READY; every later
        # request still brings a shape that has not been compiled.
        self._forward(self._next_batch_size())

    def _forward(self, batch_size: int) -> tuple[torch.Tensor, bool]:
        with self._sizes_lock:
            new_shape = batch_size not in self._seen
            self._seen.add(batch_size)
        # torch's config overrides are thread-local (ContextVar-backed in recent releases) and a
        # new thread starts with none of them: a limit raised once in the main thread does not
        # reach the per-connection handler threads, which would hit the default limit of 8 and
        # fall back to eager. So apply the settings in the thread that calls the model.
        configure_recompile_storm()
        x = torch.randn(batch_size, self.features)
        with torch.no_grad():
            return self.model(x), new_shape

    def infer(self, body: bytes, content_type: str) -> InferenceResult:
        doc = _parse_json(body)
        requested = doc.get("batch_size")
        if requested is None:
            batch_size = self._next_batch_size()
        elif isinstance(requested, int) and 1 <= requested <= 65536:
            batch_size = requested
        else:
            raise BadRequest("'batch_size' must be an integer in [1, 65536]")
        t0 = time.perf_counter()
        logits, new_shape = self._forward(batch_size)
        t1 = time.perf_counter()
        out = summarize_logits(logits)
        out["batch_size"] = batch_size
        out["new_shape"] = new_shape
        t2 = time.perf_counter()
        return InferenceResult(out, {"forward": (t1 - t0) * 1e3, "postprocess": (t2 - t1) * 1e3}, queue_s=None)

    def stats(self) -> dict[str, Any]:
        import torch._dynamo.config as dynamo_config
        from torch._dynamo.utils import counters

        configure_recompile_storm()
        return {
            "recompile_limit": int(dynamo_config.recompile_limit),
            "distinct_batch_sizes": len(self._seen),
            "compiles": int(counters["stats"]["unique_graphs"]),  # graphs dynamo compiled
        }


class DynamicShapePathology(RecompilePathology):
    """``recompile --fixed``: the same model and micro-batcher with CMP001's fix applied.

    The batch dimension is compiled dynamic (``torch.compile(dynamic=True)``) and every batch size
    the batcher makes is run once during warm-up, before READY (batch 1, which dynamo specialises,
    the symbolic batch, and a size equal to another dimension, which duck sizing separates): after
    that, no batch size the batcher produces triggers a recompile. The batcher
    cycles through sizes 1-64 (``max_batch``) instead of counting up without bound.
    """

    max_batch = 64  # the batcher's largest batch; the storm of the pathology never gets this far

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.compile(self.eager, dynamic=True)

    def _next_batch_size(self) -> int:
        # The same counter-driven batcher, bounded as a real one is: served fast, the unbounded
        # counter would grow the batches (and the work per request) without limit.
        return (super()._next_batch_size() - 1) % self.max_batch + 1

    def warmup(self) -> None:
        # every size the batcher makes, once: batch 1 (specialised) and the symbolic batch, plus the
        # size that equals another dimension (dynamo's duck sizing gives that one its own graph)
        for _ in range(self.max_batch):
            self._forward(self._next_batch_size())


@dataclass
class _Job:
    tokens: torch.Tensor
    enqueued: float
    started: float = 0.0
    finished: float = 0.0
    result: torch.Tensor | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class ModelWorker(threading.Thread):
    """The single thread that runs every inference, fed by a ``queue.Queue``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__(name="model-worker", daemon=True)
        self.model = model
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self.busy = False

    def submit(self, tokens: torch.Tensor) -> _Job:
        job = _Job(tokens=tokens, enqueued=time.perf_counter())
        self.jobs.put(job)
        return job

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            job.started = time.perf_counter()
            self.busy = True
            try:
                with torch.no_grad():
                    job.result = self.model(job.tokens)
            except BaseException as exc:
                job.error = exc
            finally:
                self.busy = False
                job.finished = time.perf_counter()
                job.done.set()

    def stop(self) -> None:
        self.jobs.put(None)


@dataclass(frozen=True)
class TokenModelConfig:
    vocab: int
    d_model: int
    d_hidden: int
    n_blocks: int
    seq_len: int


QUEUEING_MODEL = TokenModelConfig(vocab=32000, d_model=768, d_hidden=3072, n_blocks=4, seq_len=128)
HEALTHY_MODEL = TokenModelConfig(vocab=32000, d_model=512, d_hidden=2048, n_blocks=3, seq_len=64)


class WorkerQueuePathology(Pathology):
    """Threaded HTTP front, one model-worker thread behind a queue (``queueing`` and ``healthy``)."""

    def __init__(self, name: str, cfg: TokenModelConfig) -> None:
        self.name = name
        self.cfg = cfg
        torch.manual_seed(0)
        self.model = TokenClassifier(cfg.vocab, cfg.d_model, cfg.d_hidden, cfg.n_blocks).eval()
        self.worker = ModelWorker(self.model)
        self.worker.start()

    def _tokens(self, doc: dict[str, Any]) -> torch.Tensor:
        raw = doc.get("tokens")
        if not isinstance(raw, list) or not raw or not all(isinstance(t, int) for t in raw):
            raise BadRequest("body needs 'tokens': a non-empty list of integers")
        ids = [t % self.cfg.vocab for t in raw[: self.cfg.seq_len]]
        ids += [0] * (self.cfg.seq_len - len(ids))  # pad to the fixed sequence length
        return torch.tensor([ids], dtype=torch.long)

    def _run(self, tokens: torch.Tensor) -> _Job:
        job = self.worker.submit(tokens)
        if not job.done.wait(JOB_TIMEOUT_S):
            raise TimeoutError("the model worker did not answer in time")
        if job.error is not None:
            raise job.error
        return job

    def warmup(self) -> None:
        tokens = torch.randint(0, self.cfg.vocab, (1, self.cfg.seq_len))
        for _ in range(3):
            self._run(tokens)

    def infer(self, body: bytes, content_type: str) -> InferenceResult:
        t0 = time.perf_counter()
        tokens = self._tokens(_parse_json(body))
        job = self._run(tokens)
        t1 = time.perf_counter()
        assert job.result is not None
        out = summarize_logits(job.result)
        out["tokens"] = int(tokens.shape[1])
        t2 = time.perf_counter()
        queue_s = job.started - job.enqueued
        stages = {
            "parse": (job.enqueued - t0) * 1e3,
            "queue": queue_s * 1e3,
            "forward": (job.finished - job.started) * 1e3,
            "postprocess": (t2 - t1) * 1e3,
        }
        return InferenceResult(out, stages, queue_s=queue_s, prompt_tokens=int(tokens.shape[1]))

    def running_waiting(self, in_flight: int) -> tuple[int, int]:
        running = 1 if self.worker.busy else 0
        return running, self.worker.jobs.qsize()

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": self.worker.jobs.qsize(), "worker_busy": self.worker.busy}

    def close(self) -> None:
        # Join: a daemon thread still inside a torch kernel when the interpreter exits aborts
        # the process (SIGABRT) instead of the clean exit SIGTERM asks for.
        self.worker.stop()
        self.worker.join(timeout=STOP_TIMEOUT_S)


MAX_BATCH = 8  # queueing --fixed: requests one forward serves at most
BATCH_WAIT_S = 0.05  # how long a worker waits for more requests after the first (Triton's max_queue_delay)


class BatchingWorkerPool:
    """``workers`` model-worker threads on ONE shared queue; each serves up to ``max_batch``
    queued requests with a single forward (dynamic batching)."""

    def __init__(self, model: nn.Module, workers: int, max_batch: int = MAX_BATCH,
                 max_wait_s: float = BATCH_WAIT_S) -> None:
        self.model = model
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.jobs: queue.Queue[_Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self.running = 0  # requests inside a forward right now
        self.batches = 0
        self.threads = [threading.Thread(target=self._loop, name=f"model-worker-{i}", daemon=True)
                        for i in range(workers)]
        for t in self.threads:
            t.start()

    def submit(self, tokens: torch.Tensor) -> _Job:
        job = _Job(tokens=tokens, enqueued=time.perf_counter())
        self.jobs.put(job)
        return job

    def _collect(self, first: _Job) -> tuple[list[_Job], bool]:
        """The first job and whatever else arrives within ``max_wait_s``; (batch, stop requested)."""
        batch = [first]
        deadline = time.perf_counter() + self.max_wait_s
        while len(batch) < self.max_batch:
            try:
                nxt = self.jobs.get(timeout=max(0.0, deadline - time.perf_counter()))
            except queue.Empty:
                break
            if nxt is None:
                return batch, True
            batch.append(nxt)
        return batch, False

    def _loop(self) -> None:
        stop = False
        while not stop:
            first = self.jobs.get()
            if first is None:
                return
            batch, stop = self._collect(first)
            started = time.perf_counter()
            with self._lock:
                self.running += len(batch)
                self.batches += 1
            results: list[torch.Tensor] | None = None
            error: BaseException | None = None
            try:
                with torch.no_grad():
                    logits = self.model(torch.cat([j.tokens for j in batch]))
                results = list(logits.split([j.tokens.shape[0] for j in batch]))
            except BaseException as exc:
                error = exc
            finally:
                finished = time.perf_counter()
                with self._lock:
                    self.running -= len(batch)
                for i, job in enumerate(batch):
                    job.started, job.finished = started, finished
                    job.result = results[i] if results is not None else None
                    job.error = error
                    job.done.set()

    def stop(self) -> None:
        for _ in self.threads:
            self.jobs.put(None)
        for t in self.threads:
            t.join(timeout=STOP_TIMEOUT_S)


class BatchingQueuePathology(WorkerQueuePathology):
    """``queueing --fixed``: the same front and model with QUE001's fix applied.

    Serving capacity is added (one model-worker thread per core, 2 to 4) and each worker batches
    the requests waiting in the queue into one forward (dynamic batching, at most ``MAX_BATCH``),
    so the queue drains at the same offered load.
    """

    def __init__(self, name: str, cfg: TokenModelConfig, workers: int | None = None) -> None:
        # not WorkerQueuePathology.__init__: that starts the single worker this variant replaces
        self.name = name
        self.cfg = cfg
        torch.manual_seed(0)
        self.model = TokenClassifier(cfg.vocab, cfg.d_model, cfg.d_hidden, cfg.n_blocks).eval()
        self.pool = BatchingWorkerPool(self.model, default_pool_workers() if workers is None else workers)

    def _run(self, tokens: torch.Tensor) -> _Job:
        job = self.pool.submit(tokens)
        if not job.done.wait(JOB_TIMEOUT_S):
            raise TimeoutError("the model workers did not answer in time")
        if job.error is not None:
            raise job.error
        return job

    def running_waiting(self, in_flight: int) -> tuple[int, int]:
        return self.pool.running, self.pool.jobs.qsize()

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": self.pool.jobs.qsize(), "running": self.pool.running,
                "workers": len(self.pool.threads), "max_batch": self.pool.max_batch, "batches": self.pool.batches}

    def close(self) -> None:
        self.pool.stop()


# --------------------------------------------------------------------------------------------
# prefill: streaming text generation, continuous batching WITHOUT chunked prefill
# --------------------------------------------------------------------------------------------

_WORD = re.compile(r"\w+|[^\w\s]")
KV_BLOCK_SIZE = 16  # tokens per KV-cache block, as vLLM's default
KV_CACHE_BLOCKS = 2048  # the notional KV-cache pool: 32768 tokens
DEFAULT_MAX_TOKENS = 128
MAX_MAX_TOKENS = 1024
STOP_TIMEOUT_S = 30.0  # the longest prefill takes a few seconds


def tokenize(text: str, vocab: int) -> list[int]:
    """A word-level tokeniser: each word or punctuation mark hashes (CRC-32) to an id in [1, vocab)."""
    return [1 + zlib.crc32(w.lower().encode()) % (vocab - 1) for w in _WORD.findall(text)]


def detokenize(token: int) -> str:
    return f" t{token}"


@dataclass(eq=False)
class GenRequest:
    """One generation request as the engine sees it; times are ``time.perf_counter()`` values."""

    request_id: str
    prompt: list[int]
    max_tokens: int
    arrival: float  # the HTTP handler received it
    stream: bool = True
    seed: int = 0
    queued: float = 0.0  # tokenised and handed to the engine
    scheduled: float = 0.0  # the engine started its prefill
    output: list[int] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)
    cache: KVCache | None = None
    generator: torch.Generator | None = None
    error: BaseException | None = None
    finished: bool = False
    prefilled: int = 0  # prompt tokens already in the KV cache (chunked prefill)
    cancelled: threading.Event = field(default_factory=threading.Event)
    events: queue.Queue[tuple[int, float] | None] = field(default_factory=queue.Queue)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.output)

    def timings(self) -> GenerationTimings:
        first, last = self.token_times[0], self.token_times[-1]
        gaps = tuple(b - a for a, b in itertools.pairwise(self.token_times))
        return GenerationTimings(
            ttft_s=first - self.arrival,
            prefill_s=first - self.scheduled,
            decode_s=last - first,
            inference_s=last - self.scheduled,
            itl_s=gaps,
            output_tokens=len(self.output),
        )


class GenerationEngine(threading.Thread):
    """The one ``model-worker`` thread of a text-generation server: a step-wise scheduler.

    Continuous batching as vLLM does it with chunked prefill OFF and no prefix cache. Each step
    admits the waiting requests whose WHOLE prompts fit in the step's token budget
    (``max_num_batched_tokens``, by default the model's context length), prefills each prompt in
    one forward, decodes one token for every running request, and hands out all the step's
    tokens at its end. A long prompt's prefill therefore holds up the requests waiting behind it,
    the short prompts scheduled in the same step, and the token streams of the running requests.
    KV-cache blocks are accounted against a notional pool of ``kv_blocks`` × ``block_size``
    tokens; a request is admitted only when its prompt fits, so the engine never preempts.
    """

    def __init__(
        self,
        model: TinyDecoderLM,
        *,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int | None = None,
        kv_blocks: int = KV_CACHE_BLOCKS,
        block_size: int = KV_BLOCK_SIZE,
    ) -> None:
        super().__init__(name="model-worker", daemon=True)
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens or model.cfg.max_model_len
        self.kv_blocks = kv_blocks
        self.block_size = block_size
        self.on_tokens: Callable[..., None] | None = None
        self._cv = threading.Condition()
        self.waiting: collections.deque[GenRequest] = collections.deque()
        self.running: list[GenRequest] = []
        self.prefilling: list[GenRequest] = []
        self._stopping = False
        self.steps = 0
        self.prefills = 0

    # -- called from the HTTP handler threads ------------------------------------------------

    def submit(self, req: GenRequest) -> None:
        with self._cv:
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            req.queued = time.perf_counter()
            self.waiting.append(req)
            self._cv.notify()

    def cancel(self, req: GenRequest) -> None:
        req.cancelled.set()
        with self._cv:
            self._cv.notify()

    def blocks_needed(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def kv_cache_usage(self) -> float:
        with self._cv:
            used = sum(self.blocks_needed(r.num_tokens) for r in (*self.running, *self.prefilling))
        return min(1.0, used / self.kv_blocks)

    def counts(self) -> tuple[int, int]:
        """(running, waiting); the requests being prefilled count as running, as in vLLM."""
        with self._cv:
            return len(self.running) + len(self.prefilling), len(self.waiting)

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()

    # -- the engine thread ---------------------------------------------------------------------

    def _count(self, **tokens: int) -> None:
        if self.on_tokens is not None:
            self.on_tokens(**tokens)

    def _finish(self, req: GenRequest, error: BaseException | None = None) -> None:
        if req.finished:
            return
        req.error = error
        req.finished = True
        req.cache = None  # free the KV cache
        req.events.put(None)

    @staticmethod
    def _sample(req: GenRequest, logits: torch.Tensor) -> int:
        probs = torch.softmax(logits.float(), dim=-1)
        return int(torch.multinomial(probs, 1, generator=req.generator))

    def _deliver(self, req: GenRequest, token: int, now: float) -> None:
        req.output.append(token)
        req.token_times.append(now)
        req.events.put((token, now))
        if len(req.output) >= req.max_tokens:
            self._finish(req)

    def _admit(self) -> list[GenRequest]:
        """Under the lock: drop cancelled requests, then schedule the waiting ones that fit this step."""
        for r in [r for r in self.waiting if r.cancelled.is_set()]:
            self.waiting.remove(r)
            self._finish(r)
        for r in [r for r in self.running if r.cancelled.is_set() or r.finished]:
            self.running.remove(r)
            self._finish(r)
        admitted: list[GenRequest] = []
        budget = self.max_num_batched_tokens - len(self.running)  # one token per running decode
        blocks = sum(self.blocks_needed(r.num_tokens) for r in self.running)
        while self.waiting and len(self.running) + len(admitted) < self.max_num_seqs:
            nxt = self.waiting[0]
            n = len(nxt.prompt)
            busy = bool(self.running or admitted)
            if busy and (n > budget or blocks + self.blocks_needed(n + 1) > self.kv_blocks):
                break  # FIFO: the next prompt waits for a later step
            self.waiting.popleft()
            nxt.scheduled = time.perf_counter()
            admitted.append(nxt)
            budget -= n
            blocks += self.blocks_needed(n + 1)
        self.prefilling = admitted
        return admitted

    def _prefill(self, req: GenRequest) -> int | None:
        """The whole prompt in one forward; the first token, or None when it failed."""
        try:
            req.generator = torch.Generator().manual_seed(req.seed)
            req.cache = self.model.new_cache(len(req.prompt) + req.max_tokens)
            with torch.no_grad():
                logits = self.model.prefill(torch.tensor(req.prompt, dtype=torch.long), req.cache)
                token = self._sample(req, logits)
        except Exception as exc:
            log.exception("prefill failed")
            self._finish(req, exc)
            return None
        self.prefills += 1
        return token

    def _decode(self, batch: list[GenRequest]) -> list[int] | None:
        """One decode step for the running requests; their next tokens, or None when it failed."""
        try:
            caches: list[KVCache] = []
            for r in batch:
                assert r.cache is not None, "a running request has its KV cache"
                caches.append(r.cache)
            with torch.no_grad():
                logits = self.model.decode([r.output[-1] for r in batch], [r.num_tokens - 1 for r in batch], caches)
                return [self._sample(r, row) for r, row in zip(batch, logits, strict=True)]
        except Exception as exc:
            log.exception("decode step failed")
            for r in batch:
                self._finish(r, exc)
            return None

    def _step(self, admitted: list[GenRequest], batch: list[GenRequest]) -> None:
        out: list[tuple[GenRequest, int]] = []
        prompt_tokens = 0
        for req in admitted:  # every whole prompt first: the running requests wait for them all
            token = self._prefill(req)
            if token is not None:
                out.append((req, token))
                prompt_tokens += len(req.prompt)
        batch = [r for r in batch if not r.finished and not r.cancelled.is_set()]
        if batch:
            tokens = self._decode(batch)
            if tokens is not None:
                out += zip(batch, tokens, strict=True)
        # counted before the tokens go out, so a client holding its reply finds them counted
        self._count(prompt=prompt_tokens, generation=len(out), prefix_queries=prompt_tokens, prefix_hits=0)
        now = time.perf_counter()
        for req, token in out:
            self._deliver(req, token, now)

    def run(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self.waiting and not self.running:
                    self._cv.wait()
                if self._stopping:
                    break
                admitted = self._admit()
                batch = list(self.running)
            self._step(admitted, batch)
            with self._cv:
                self.steps += 1
                self.prefilling = []
                self.running = [r for r in (*self.running, *admitted) if not r.finished]
        with self._cv:
            pending = [*self.waiting, *self.running]
            self.waiting.clear()
            self.running.clear()
        for r in pending:
            self._finish(r, RuntimeError("the engine stopped"))


CHUNKED_PREFILL_TOKENS = 512  # prefill --fixed: the step's token budget (vLLM --max-num-batched-tokens)
LONG_PREFILL_TOKENS = 256  # ... of which this many are kept for admitting waiting requests


class ChunkedPrefillEngine(GenerationEngine):
    """The engine of ``prefill --fixed``: continuous batching WITH chunked prefill (TTF001's fix).

    Each step has a budget of ``max_num_batched_tokens`` tokens (vLLM's
    ``--enable-chunked-prefill --max-num-batched-tokens``): first one decode token for every running
    request, then the next chunk of each prompt being prefilled, then new prompts from the waiting
    queue while budget is left; while requests wait, ``long_prefill_token_threshold`` tokens of the
    budget are kept for admitting them, so a short prompt behind a long one is prefilled in the
    next step instead of after it. No step (so no running request's next token) waits for a
    whole long prompt. ``prefilling`` holds the requests whose prompt is partly in the cache.

    On a CPU the total work is unchanged and no cheaper, so this trades time to first token (each
    chunk step also runs a decode step, ~20 % more prefill compute in chunks) for inter-token latency
    and queueing: measured, inter-token p99 and queue p99 fall ~4x, TTFT p50/p99 rise ~1.3-1.5x.
    """

    def __init__(
        self,
        model: TinyDecoderLM,
        *,
        max_num_batched_tokens: int = CHUNKED_PREFILL_TOKENS,
        long_prefill_token_threshold: int = LONG_PREFILL_TOKENS,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, max_num_batched_tokens=max_num_batched_tokens, **kwargs)
        self.long_prefill_token_threshold = long_prefill_token_threshold

    def _schedule(self) -> tuple[list[tuple[GenRequest, int]], list[GenRequest]]:
        """Under the lock: this step's prefill chunks (request, tokens) and its decode batch."""
        for lst in (self.running, self.prefilling):
            for r in [r for r in lst if r.cancelled.is_set() or r.finished]:
                lst.remove(r)
                self._finish(r)
        for r in [r for r in self.waiting if r.cancelled.is_set()]:
            self.waiting.remove(r)
            self._finish(r)
        decodes = list(self.running)
        budget = self.max_num_batched_tokens - len(decodes)
        # Prompts being prefilled go first, oldest first; while requests wait, ``threshold`` tokens
        # of the budget are kept for admitting them, so a short prompt does not wait for a long one.
        reserve = min(self.long_prefill_token_threshold, budget) if self.waiting else 0
        chunks: list[tuple[GenRequest, int]] = []
        for r in self.prefilling:
            n = min(len(r.prompt) - r.prefilled, budget - reserve)
            if n <= 0:
                break
            chunks.append((r, n))
            budget -= n
        blocks = sum(self.blocks_needed(r.num_tokens) for r in self.running)
        blocks += sum(self.blocks_needed(len(r.prompt) + 1) for r in self.prefilling)
        while self.waiting and budget > 0 and len(self.running) + len(self.prefilling) < self.max_num_seqs:
            nxt = self.waiting[0]
            busy = bool(self.running or self.prefilling)
            if busy and blocks + self.blocks_needed(len(nxt.prompt) + 1) > self.kv_blocks:
                break  # FIFO: the next prompt waits for KV-cache room
            self.waiting.popleft()
            nxt.scheduled = time.perf_counter()
            self.prefilling.append(nxt)
            n = min(len(nxt.prompt), budget)
            chunks.append((nxt, n))
            budget -= n
            blocks += self.blocks_needed(len(nxt.prompt) + 1)
        return chunks, decodes

    def _prefill_chunk(self, req: GenRequest, n: int) -> int | None:
        """The next ``n`` prompt tokens into the cache; the first token after the last chunk, else None."""
        try:
            if req.cache is None:
                req.generator = torch.Generator().manual_seed(req.seed)
                req.cache = self.model.new_cache(len(req.prompt) + req.max_tokens)
            start = req.prefilled
            ids = torch.tensor(req.prompt[start:start + n], dtype=torch.long)
            with torch.no_grad():
                logits = self.model.prefill_chunk(ids, start, req.cache)
                req.prefilled = start + n
                if req.prefilled < len(req.prompt):
                    return None
                token = self._sample(req, logits)
        except Exception as exc:
            log.exception("prefill failed")
            self._finish(req, exc)
            return None
        self.prefills += 1
        return token

    def _chunked_step(self, chunks: list[tuple[GenRequest, int]], decodes: list[GenRequest]) -> None:
        out: list[tuple[GenRequest, int]] = []
        prompt_tokens = 0
        batch = [r for r in decodes if not r.finished and not r.cancelled.is_set()]
        if batch:
            tokens = self._decode(batch)
            if tokens is not None:
                out += zip(batch, tokens, strict=True)
        for req, n in chunks:
            token = self._prefill_chunk(req, n)
            if not req.finished:
                prompt_tokens += n
            if token is not None:
                out.append((req, token))
        self._count(prompt=prompt_tokens, generation=len(out), prefix_queries=prompt_tokens, prefix_hits=0)
        now = time.perf_counter()
        for req, token in out:
            self._deliver(req, token, now)

    def run(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self.waiting and not self.running and not self.prefilling:
                    self._cv.wait()
                if self._stopping:
                    break
                chunks, decodes = self._schedule()
            self._chunked_step(chunks, decodes)
            with self._cv:
                self.steps += 1
                done = [r for r in self.prefilling if r.finished or r.prefilled >= len(r.prompt)]
                self.prefilling = [r for r in self.prefilling if r not in done]
                self.running = [r for r in (*self.running, *done) if not r.finished]
        with self._cv:
            pending = [*self.waiting, *self.prefilling, *self.running]
            self.waiting.clear()
            self.prefilling.clear()
            self.running.clear()
        for r in pending:
            self._finish(r, RuntimeError("the engine stopped"))


class PrefillPathology(Pathology):
    """Streaming generation where the prefill of long prompts dominates time to first token."""

    name = "prefill"

    def __init__(self, cfg: DecoderConfig = PREFILL_MODEL, *, chunked: bool = False) -> None:
        torch.manual_seed(0)
        self.cfg = cfg
        self.model = TinyDecoderLM(cfg).eval()
        self.engine = ChunkedPrefillEngine(self.model) if chunked else GenerationEngine(self.model)
        self.engine.start()
        self._ids = itertools.count(1)

    def bind_metrics(self, metrics: Metrics) -> None:
        self.engine.on_tokens = metrics.count_tokens

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
        doc = _parse_json(body)
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


def make_pathology(name: str, fixed: bool = False, preprocess_workers: int = 0) -> Pathology:
    """The pathology ``name``; ``fixed``: the same service with the fix diagnose recommends for it
    (``healthy`` has nothing to fix and is the same either way)."""
    if name == "cpu-preprocess":
        return FastPreprocessPathology(preprocess_workers) if fixed else CpuPreprocessPathology()
    if name == "recompile":
        return DynamicShapePathology() if fixed else RecompilePathology()
    if name == "queueing":
        return BatchingQueuePathology("queueing", QUEUEING_MODEL) if fixed else WorkerQueuePathology(
            "queueing", QUEUEING_MODEL)
    if name == "healthy":
        return WorkerQueuePathology("healthy", HEALTHY_MODEL)
    if name == "prefill":
        return PrefillPathology(chunked=fixed)
    raise ValueError(f"unknown pathology {name!r}; choose one of {', '.join(PATHOLOGY_NAMES)}")


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


class InferenceServer(ThreadingHTTPServer):
    """ThreadingHTTPServer whose per-connection threads are named ``http-handler-N``."""

    daemon_threads = True
    block_on_close = True  # server_close() waits for handlers still inside the model (see close())
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], pathology: Pathology,
                 stage_log: torch_probe.Probe | None, fixed: bool = False) -> None:
        super().__init__(address, InferenceHandler)
        self.pathology = pathology
        self.fixed = fixed  # the --fixed variant: /healthz and /stats say so
        self.metrics = Metrics()
        pathology.bind_metrics(self.metrics)
        self.stage_log = stage_log
        self._handler_ids = itertools.count(1)

    def process_request(self, request: Any, client_address: Any) -> None:
        t = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"http-handler-{next(self._handler_ids)}",
            daemon=True,
        )
        t.start()


class InferenceHandler(BaseHTTPRequestHandler):
    server: InferenceServer
    server_version = "diagnose-demo/0.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - " + format, self.address_string(), *args)

    def _send_json(self, status: int, doc: dict[str, Any]) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json")

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        srv = self.server
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            health: dict[str, Any] = {"status": "ok", "pathology": srv.pathology.name}
            if srv.fixed:
                health["fixed"] = True
            self._send_json(HTTPStatus.OK, health)
        elif path == "/stats":
            m = srv.metrics
            doc = {
                "pathology": srv.pathology.name,
                "pid": os.getpid(),
                "in_flight": m.in_flight,
                "completed": m.completed,
                "errors": m.errors,
                "uptime_s": round(time.time() - m.started, 3),
                **srv.pathology.stats(),
            }
            if srv.fixed:
                doc["fixed"] = True
            self._send_json(HTTPStatus.OK, doc)
        elif path == "/metrics":
            running, waiting = srv.pathology.running_waiting(srv.metrics.in_flight)
            kv = srv.pathology.kv_cache_usage()
            text = srv.metrics.prometheus(srv.pathology.name, running, waiting, kv)
            self._send(HTTPStatus.OK, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such path {path}"})

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > MAX_BODY_BYTES:
            raise BadRequest(f"Content-Length must be in [0, {MAX_BODY_BYTES}]")
        return self.rfile.read(length)

    def _start_chunked(self, content_type: str) -> None:
        """Send the headers of a streamed (chunked, HTTP/1.1) reply; the connection closes after it."""
        self.protocol_version = "HTTP/1.1"
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%b\r\n" % (len(data), data))

    def _end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/v1/completions" and isinstance(self.server.pathology, PrefillPathology):
            self._generate(self.server.pathology, openai=True)
            return
        if path != "/infer":
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such path {path}"})
            return
        if isinstance(self.server.pathology, PrefillPathology):
            self._generate(self.server.pathology)
            return
        srv = self.server
        t0 = time.perf_counter()
        srv.metrics.begin()
        ended = False
        try:
            body = self._read_body()
            content_type = (self.headers.get("Content-Type") or "").lower()
            result = srv.pathology.infer(body, content_type)
            latency_ms = (time.perf_counter() - t0) * 1e3
            # Record the request before its reply goes out, so that a client holding the reply
            # finds it in /stats, /metrics and the stage log.
            if result.prompt_tokens is not None:
                srv.metrics.count_tokens(prompt=result.prompt_tokens)
            ended = True
            srv.metrics.end(ok=True, e2e_s=latency_ms / 1e3, queue_s=result.queue_s, prompt_tokens=result.prompt_tokens)
            if srv.stage_log is not None:
                srv.stage_log.emit(result.stages_ms, status="ok", e2e_ms=round(latency_ms, 3))
            reply = {"pathology": srv.pathology.name, "latency_ms": round(latency_ms, 3), **result.body}
            self._send_json(HTTPStatus.OK, reply)
        except BadRequest as exc:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:
            log.exception("inference failed")
            with contextlib.suppress(OSError):
                self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})
        finally:
            if not ended:
                srv.metrics.end(ok=False, e2e_s=time.perf_counter() - t0, queue_s=None)

    def _generate(self, pathology: PrefillPathology, openai: bool = False) -> None:
        """POST /infer of a text-generation pathology: one NDJSON line per token, then a summary line.

        ``openai``: POST /v1/completions, OpenAI's completions API: ``{"model", "prompt", "max_tokens",
        "stream"}``; streamed as server-sent events (one ``data: {...}`` per token, then ``data: [DONE]``),
        else one ``text_completion`` object.
        """
        srv = self.server
        t0 = time.perf_counter()
        srv.metrics.begin()
        streaming, ended = False, False
        req: GenRequest | None = None
        created = int(time.time())
        model = ""
        try:
            body = self._read_body()
            if openai:
                body, model = _openai_body(body)
            req = pathology.submit(body, arrival=t0)
            if req.stream:
                self._start_chunked("text/event-stream" if openai else "application/x-ndjson")
                streaming = True
            previous = 0.0
            for i, (token, at) in enumerate(pathology.tokens(req)):
                if i == 0:
                    srv.metrics.observe_token(ttft_s=at - req.arrival)
                else:
                    srv.metrics.observe_token(itl_s=at - previous)
                previous = at
                if streaming and openai:
                    event = {"id": f"cmpl-{req.request_id}", "object": "text_completion", "created": created,
                             "model": model, "choices": [{"index": 0, "text": detokenize(token), "logprobs": None,
                                                          "finish_reason": None}]}
                    self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
                elif streaming:
                    line = {"index": i, "token": token, "text": detokenize(token)}
                    self._chunk(json.dumps(line).encode() + b"\n")
            timings = req.timings()
            latency_ms = (time.perf_counter() - t0) * 1e3
            stages_ms = {
                "preprocess": (req.queued - req.arrival) * 1e3,  # read, parse, tokenise
                "queue": (req.scheduled - req.queued) * 1e3,
                "prefill": timings.prefill_s * 1e3,
                "decode": timings.decode_s * 1e3,
            }
            summary: dict[str, Any] = {
                "done": True,
                "pathology": pathology.name,
                "request_id": req.request_id,
                "prompt_tokens": len(req.prompt),
                "output_tokens": len(req.output),
                "ttft_ms": round(timings.ttft_s * 1e3, 3),
                "latency_ms": round(latency_ms, 3),
                **{f"{k}_ms": round(v, 3) for k, v in stages_ms.items()},
            }
            # The request is finished: record it before the last line goes out, so that a client
            # holding its complete reply finds it in /metrics and in the stage log.
            ended = True
            srv.metrics.end(
                ok=True,
                e2e_s=latency_ms / 1e3,
                queue_s=req.scheduled - req.queued,
                prompt_tokens=len(req.prompt),
                generation=timings,
            )
            if srv.stage_log is not None:
                srv.stage_log.emit(
                    stages_ms,
                    status="ok",
                    e2e_ms=round(latency_ms, 3),
                    ttft_ms=round(timings.ttft_s * 1e3, 3),
                    input_tokens=len(req.prompt),
                    output_tokens=len(req.output),
                )
            usage = {"prompt_tokens": len(req.prompt), "completion_tokens": len(req.output),
                     "total_tokens": len(req.prompt) + len(req.output)}
            if streaming and openai:
                last = {"id": f"cmpl-{req.request_id}", "object": "text_completion", "created": created, "model": model,
                        "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
                        "usage": usage}
                self._chunk(b"data: " + json.dumps(last).encode() + b"\n\n")
                self._chunk(b"data: [DONE]\n\n")
                self._end_chunked()
            elif streaming:
                self._chunk(json.dumps(summary).encode() + b"\n")
                self._end_chunked()
            elif openai:
                self._send_json(HTTPStatus.OK, {
                    "id": f"cmpl-{req.request_id}", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": "".join(detokenize(t) for t in req.output), "logprobs": None,
                                 "finish_reason": "length"}], "usage": usage})
            else:
                summary["tokens"] = req.output
                summary["text"] = "".join(detokenize(t) for t in req.output)
                self._send_json(HTTPStatus.OK, summary)
        except BadRequest as exc:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:
            log.exception("generation failed")
            error = {"error": f"{type(exc).__name__}: {exc}"}
            with contextlib.suppress(OSError):
                if streaming:
                    self._chunk(json.dumps(error).encode() + b"\n")
                    self._end_chunked()
                else:
                    self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, error)
        finally:
            if not ended:
                if req is not None:
                    pathology.cancel(req)
                srv.metrics.end(ok=False, e2e_s=time.perf_counter() - t0, queue_s=None)


def _openai_body(body: bytes) -> tuple[bytes, str]:
    """An OpenAI completions request as the engine's own body, and the model name it asked for."""
    doc = _parse_json(body)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # the API also takes a list of prompts; one is served
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string")
    inner = {"prompt": prompt, "max_tokens": doc.get("max_tokens", 16), "stream": doc.get("stream", False)}
    return json.dumps(inner).encode(), str(doc.get("model", ""))


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def _private_inductor_cache() -> Callable[[], None]:
    """Give ``recompile`` a fresh inductor cache unless the caller chose one.

    A warm on-disk cache from an earlier run would turn most compiles into cache hits; a fresh
    cache behaves like a freshly deployed container.
    """
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return lambda: None
    path = tempfile.mkdtemp(prefix="diagnose-demo-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return lambda: shutil.rmtree(path, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m examples.service", description=__doc__.splitlines()[0])
    p.add_argument("--pathology", required=True, choices=PATHOLOGY_NAMES)
    p.add_argument("--fixed", action="store_true",
                   help="serve the same load with the fix diagnose recommends for the pathology applied")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--preprocess-workers", type=int, default=0,
                   help="cpu-preprocess --fixed: pre-process in N worker processes (default 0: in the request thread)")
    p.add_argument("--stage-log", default=None, help="append one JSON line of stage timings per request")
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    threading.current_thread().name = "main"
    torch.set_num_threads(max(1, args.torch_threads))
    cleanup_cache = _private_inductor_cache() if args.pathology == "recompile" else (lambda: None)
    # the in-process probe writes the stage log (also when started with DIAGNOSE_PROBE=PATH)
    service = f"demo-{args.pathology}" + ("-fixed" if args.fixed else "")
    stage_log = (torch_probe.install(args.stage_log, service=service) if args.stage_log
                 else torch_probe.get())
    pathology: Pathology | None = None
    server: InferenceServer | None = None
    try:
        pathology = make_pathology(args.pathology, fixed=args.fixed, preprocess_workers=args.preprocess_workers)
        t0 = time.perf_counter()
        pathology.warmup()
        log.info("pathology %s%s warmed up in %.1f s", args.pathology, " (fixed)" if args.fixed else "",
                 time.perf_counter() - t0)
        server = InferenceServer((args.host, args.port), pathology, stage_log, fixed=args.fixed)

        def _request_shutdown(signum: int, _frame: Any) -> None:
            log.info("signal %d: shutting down", signum)
            assert server is not None
            threading.Thread(target=server.shutdown, name="shutdown", daemon=True).start()

        signal.signal(signal.SIGTERM, _request_shutdown)
        signal.signal(signal.SIGINT, _request_shutdown)
        port = server.server_address[1]
        sys.stdout.write(f"READY port={port} pid={os.getpid()}\n")
        sys.stdout.flush()
        server.serve_forever(poll_interval=0.2)
    finally:
        if server is not None:
            server.server_close()
        if pathology is not None:
            pathology.close()
        if stage_log is not None:
            stage_log.close()
        cleanup_cache()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
