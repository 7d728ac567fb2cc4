"""The demo inference service: a real HTTP service around a small real PyTorch model (CPU).

Run one pathology at a time::

    python -m examples.service --pathology cpu-preprocess [--port 0] [--host 127.0.0.1]

Once it serves it prints exactly one line to stdout, ``READY port=<N> pid=<PID>``; everything
else goes to stderr. Endpoints:

* ``GET /healthz``  -> 200 ``{"status": "ok", ...}``
* ``POST /infer``   -> a real inference, JSON reply with a summary of the result
* ``GET /stats``    -> JSON counters (in flight, queue depth, completed, compiles, ...)
* ``GET /metrics``  -> Prometheus text with vLLM-compatible names

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
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import itertools
import json
import logging
import os
import queue
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFilter, ImageOps
from torch import nn

log = logging.getLogger("examples.service")

PATHOLOGY_NAMES: tuple[str, ...] = ("cpu-preprocess", "recompile", "queueing", "healthy")

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


# --------------------------------------------------------------------------------------------
# Request bookkeeping and metrics (vLLM-compatible names)
# --------------------------------------------------------------------------------------------

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class _Histogram:
    buckets: tuple[float, ...] = _LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * len(_LATENCY_BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.total += value
        self.n += 1
        for i, b in enumerate(self.buckets):
            if value <= b:
                self.counts[i] += 1


class Metrics:
    """Thread-safe counters and gauges of the service."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0
        self.completed = 0
        self.errors = 0
        self.e2e = _Histogram()
        self.queue_time = _Histogram()
        self.started = time.time()

    def begin(self) -> None:
        with self._lock:
            self.in_flight += 1

    def end(self, *, ok: bool, e2e_s: float, queue_s: float | None) -> None:
        with self._lock:
            self.in_flight -= 1
            if ok:
                self.completed += 1
                self.e2e.observe(e2e_s)
                if queue_s is not None:
                    self.queue_time.observe(queue_s)
            else:
                self.errors += 1

    def prometheus(self, model_name: str, running: int, waiting: int) -> str:
        label = f'model_name="{model_name}"'
        lines: list[str] = []
        with self._lock:
            lines += [
                "# HELP vllm:num_requests_running Number of requests currently being processed.",
                "# TYPE vllm:num_requests_running gauge",
                f"vllm:num_requests_running{{{label}}} {running}",
                "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
                "# TYPE vllm:num_requests_waiting gauge",
                f"vllm:num_requests_waiting{{{label}}} {waiting}",
                "# HELP vllm:request_success_total Count of successfully processed requests.",
                "# TYPE vllm:request_success_total counter",
                f"vllm:request_success_total{{{label}}} {self.completed}",
            ]
            for name, hist, help_ in (
                ("vllm:e2e_request_latency_seconds", self.e2e, "End to end request latency in seconds."),
                ("vllm:request_queue_time_seconds", self.queue_time, "Time spent waiting in the queue."),
            ):
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
                for b, c in zip(hist.buckets, hist.counts, strict=True):
                    lines.append(f'{name}_bucket{{{label},le="{b}"}} {c}')
                lines.append(f'{name}_bucket{{{label},le="+Inf"}} {hist.n}')
                lines.append(f"{name}_sum{{{label}}} {hist.total}")
                lines.append(f"{name}_count{{{label}}} {hist.n}")
        return "\n".join(lines) + "\n"


class StageLog:
    """Optional JSONL stage-timing log, one line per request (the format `diagnose` reads)."""

    def __init__(self, path: str | None) -> None:
        self._lock = threading.Lock()
        self._fh = open(path, "a", encoding="utf-8", buffering=1) if path else None  # noqa: SIM115
        self._ids = itertools.count(1)

    def write(self, status: str, stages_ms: dict[str, float], **extra: Any) -> None:
        if self._fh is None:
            return
        record = {
            "ts": round(time.time(), 4),
            "request_id": f"r-{next(self._ids)}",
            "status": status,
            "stages_ms": {k: round(v, 3) for k, v in stages_ms.items()},
            **extra,
        }
        with self._lock:
            self._fh.write(json.dumps(record) + "\n")

    def close(self) -> None:
        if self._fh is not None:
            with self._lock:
                self._fh.close()
                self._fh = None


# --------------------------------------------------------------------------------------------
# Pathologies
# --------------------------------------------------------------------------------------------


@dataclass
class InferenceResult:
    body: dict[str, Any]
    stages_ms: dict[str, float]
    queue_s: float | None = None


class Pathology:
    """One way of serving /infer. Subclasses implement ``warmup`` and ``infer``."""

    name: str = ""

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

    def _run(self, jpeg: bytes) -> InferenceResult:
        t0 = time.perf_counter()
        x = preprocess(jpeg)
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
        return InferenceResult(out, stages, queue_s=queue_s)

    def running_waiting(self, in_flight: int) -> tuple[int, int]:
        running = 1 if self.worker.busy else 0
        return running, self.worker.jobs.qsize()

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": self.worker.jobs.qsize(), "worker_busy": self.worker.busy}

    def close(self) -> None:
        self.worker.stop()


def make_pathology(name: str) -> Pathology:
    if name == "cpu-preprocess":
        return CpuPreprocessPathology()
    if name == "recompile":
        return RecompilePathology()
    if name == "queueing":
        return WorkerQueuePathology("queueing", QUEUEING_MODEL)
    if name == "healthy":
        return WorkerQueuePathology("healthy", HEALTHY_MODEL)
    raise ValueError(f"unknown pathology {name!r}; choose one of {', '.join(PATHOLOGY_NAMES)}")


# --------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------


class InferenceServer(ThreadingHTTPServer):
    """ThreadingHTTPServer whose per-connection threads are named ``http-handler-N``."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], pathology: Pathology, stage_log: StageLog) -> None:
        super().__init__(address, InferenceHandler)
        self.pathology = pathology
        self.metrics = Metrics()
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
            self._send_json(HTTPStatus.OK, {"status": "ok", "pathology": srv.pathology.name})
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
            self._send_json(HTTPStatus.OK, doc)
        elif path == "/metrics":
            running, waiting = srv.pathology.running_waiting(srv.metrics.in_flight)
            text = srv.metrics.prometheus(srv.pathology.name, running, waiting)
            self._send(HTTPStatus.OK, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such path {path}"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path != "/infer":
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such path {path}"})
            return
        srv = self.server
        t0 = time.perf_counter()
        srv.metrics.begin()
        ok, queue_s = False, None
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length < 0 or length > MAX_BODY_BYTES:
                raise BadRequest(f"Content-Length must be in [0, {MAX_BODY_BYTES}]")
            body = self.rfile.read(length)
            content_type = (self.headers.get("Content-Type") or "").lower()
            result = srv.pathology.infer(body, content_type)
            queue_s = result.queue_s
            latency_ms = (time.perf_counter() - t0) * 1e3
            reply = {"pathology": srv.pathology.name, "latency_ms": round(latency_ms, 3), **result.body}
            self._send_json(HTTPStatus.OK, reply)
            ok = True
            srv.stage_log.write("ok", result.stages_ms, e2e_ms=round(latency_ms, 3))
        except BadRequest as exc:
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:
            log.exception("inference failed")
            with contextlib.suppress(OSError):
                self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})
        finally:
            srv.metrics.end(ok=ok, e2e_s=time.perf_counter() - t0, queue_s=queue_s)


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
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
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
    stage_log = StageLog(args.stage_log)
    pathology: Pathology | None = None
    server: InferenceServer | None = None
    try:
        pathology = make_pathology(args.pathology)
        t0 = time.perf_counter()
        pathology.warmup()
        log.info("pathology %s warmed up in %.1f s", args.pathology, time.perf_counter() - t0)
        server = InferenceServer((args.host, args.port), pathology, stage_log)

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
        stage_log.close()
        cleanup_cache()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
