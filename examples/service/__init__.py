"""The demo inference service: a real HTTP service around a small real PyTorch model (CPU).

Run one pathology at a time::

    python -m diagnose.examples.service --pathology cpu-preprocess [--port 0] [--host 127.0.0.1]

Once it serves it prints exactly one line to stdout, ``READY port=<N> pid=<PID>``; everything
else goes to stderr. The endpoints (``/healthz``, ``/infer``, ``/stats``, ``/metrics``,
``/v1/completions``) are described in ``server``.

Pathologies (what a profiler attached to this process should see), one module each with its
``--fixed`` variant, the fix ``diagnose`` recommends applied (``/healthz`` and ``/stats`` then
carry ``"fixed": true``):

``cpu_preprocess``
    serial JPEG decode, blur, resize and naive numpy normalisation in the request thread;
    fixed: cheap vectorised pre-processing, optionally in a process pool.
``recompile``
    ``torch.compile(dynamic=False)`` fed a new batch size per request; fixed: ``dynamic=True``,
    compiled before READY.
``queueing``
    one model-worker thread behind a threaded HTTP front; fixed: a worker per core, each batching
    the waiting requests into one forward.
``healthy``
    the queueing design with a small fast model under light load; nothing to fix.
``prefill``
    streaming generation, continuous batching without chunked prefill; fixed: chunked prefill.

The rest: ``model`` (the PyTorch models), ``engine`` (the serving loops: the worker pool and the
generation engine), ``metrics`` (vLLM-named metrics, and the demo's own ``demo_engine_step_tokens``),
``server`` (HTTP), ``pathologies`` (name → service), ``cli`` (the command line), ``base`` (the
``Pathology`` interface).

The names below were importable from the single module ``examples/service.py`` this package
replaced, and still are.
"""

from __future__ import annotations

from diagnose.examples.service.base import (
    JOB_TIMEOUT_S,
    STOP_TIMEOUT_S,
    BadRequest,
    InferenceResult,
    Pathology,
    parse_json,
)
from diagnose.examples.service.cli import main, parse_args
from diagnose.examples.service.cpu_preprocess import (
    IMAGE_SIZE,
    IMAGENET_MEAN,
    IMAGENET_STD,
    RESIZE_SHORT_SIDE,
    CpuPreprocessPathology,
    FastPreprocessPathology,
    decode_image,
    decode_resize_fast,
    denoise,
    normalize,
    normalize_fast,
    preprocess,
    preprocess_fast,
    resize,
)
from diagnose.examples.service.engine import (
    KV_BLOCK_SIZE,
    KV_CACHE_BLOCKS,
    GenerationEngine,
    GenRequest,
    Job,
    WorkerPool,
)
from diagnose.examples.service.healthy import HEALTHY_MODEL
from diagnose.examples.service.metrics import (
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
    GenerationTimings,
    Metrics,
    build_1_2_5_buckets,
)
from diagnose.examples.service.model import (
    DecoderConfig,
    DecoderLayer,
    FeatureMLP,
    KVCache,
    MLPBlock,
    ResidualLinear,
    TinyCNN,
    TinyDecoderLM,
    TokenClassifier,
    TokenModelConfig,
    summarize_logits,
)
from diagnose.examples.service.pathologies import PATHOLOGY_NAMES, make_pathology
from diagnose.examples.service.prefill import (
    CHUNKED_PREFILL_TOKENS,
    DEFAULT_MAX_TOKENS,
    LONG_PREFILL_TOKENS,
    MAX_MAX_TOKENS,
    PREFILL_MODEL,
    PrefillPathology,
    detokenize,
    tokenize,
)
from diagnose.examples.service.queueing import (
    BATCH_WAIT_S,
    MAX_BATCH,
    QUEUEING_MODEL,
    BatchingQueuePathology,
    WorkerQueuePathology,
    default_pool_workers,
)
from diagnose.examples.service.recompile import DynamicShapePathology, RecompilePathology, configure_recompile_storm
from diagnose.examples.service.server import MAX_BODY_BYTES, InferenceHandler, InferenceServer

__all__ = [
    "BATCH_WAIT_S",
    "CHUNKED_PREFILL_TOKENS",
    "DEFAULT_MAX_TOKENS",
    "HEALTHY_MODEL",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "IMAGE_SIZE",
    "ITL_BUCKETS",
    "JOB_TIMEOUT_S",
    "KV_BLOCK_SIZE",
    "KV_CACHE_BLOCKS",
    "LONG_PREFILL_TOKENS",
    "MAX_BATCH",
    "MAX_BODY_BYTES",
    "MAX_MAX_TOKENS",
    "PATHOLOGY_NAMES",
    "PREFILL_MODEL",
    "QUEUEING_MODEL",
    "REQUEST_LATENCY_BUCKETS",
    "RESIZE_SHORT_SIDE",
    "STOP_TIMEOUT_S",
    "TTFT_BUCKETS",
    "BadRequest",
    "BatchingQueuePathology",
    "CpuPreprocessPathology",
    "DecoderConfig",
    "DecoderLayer",
    "DynamicShapePathology",
    "FastPreprocessPathology",
    "FeatureMLP",
    "GenRequest",
    "GenerationEngine",
    "GenerationTimings",
    "InferenceHandler",
    "InferenceResult",
    "InferenceServer",
    "Job",
    "KVCache",
    "MLPBlock",
    "Metrics",
    "Pathology",
    "PrefillPathology",
    "RecompilePathology",
    "ResidualLinear",
    "TinyCNN",
    "TinyDecoderLM",
    "TokenClassifier",
    "TokenModelConfig",
    "WorkerPool",
    "WorkerQueuePathology",
    "build_1_2_5_buckets",
    "configure_recompile_storm",
    "decode_image",
    "decode_resize_fast",
    "default_pool_workers",
    "denoise",
    "detokenize",
    "main",
    "make_pathology",
    "normalize",
    "normalize_fast",
    "parse_args",
    "parse_json",
    "preprocess",
    "preprocess_fast",
    "resize",
    "summarize_logits",
    "tokenize",
]
