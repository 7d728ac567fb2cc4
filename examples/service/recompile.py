"""``recompile``: ``torch.compile(dynamic=False)`` fed a never-seen batch size on every request.

The model is wrapped in ``torch.compile(dynamic=False)`` and every request is served with a batch
size the service has not seen before, so dynamo/inductor recompile on every call.

``--fixed`` (CMP001's fix): ``torch.compile(dynamic=True)``: the batch dimension is symbolic, and
its two graphs (batch 1 and batch N) are compiled before READY and one request at a time runs the
compiled model (dynamo's guard check is not thread-safe); the batcher's new sizes no longer
recompile.
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import torch

from diagnose.examples.service.base import BadRequest, InferenceResult, Pathology, parse_json
from diagnose.examples.service.model import FeatureMLP, summarize_logits


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
        doc = parse_json(body)
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
        # One request at a time runs the compiled model, as a batcher's single model thread does.
        # Dynamo's guard check is not safe to run from several threads at once: with concurrent
        # callers (torch 2.13, CPU) a guard fails spuriously now and then and dynamo compiles a
        # graph it already has ("Unexpected recompilation: runtime guards failed even though they
        # passed during recompilation-reason analysis"), which is the very recompile the fix removes.
        self._model_lock = threading.Lock()

    def _forward(self, batch_size: int) -> tuple[torch.Tensor, bool]:
        with self._model_lock:
            return super()._forward(batch_size)

    def _next_batch_size(self) -> int:
        # The same counter-driven batcher, bounded as a real one is: served fast, the unbounded
        # counter would grow the batches (and the work per request) without limit.
        return (super()._next_batch_size() - 1) % self.max_batch + 1

    def warmup(self) -> None:
        # every size the batcher makes, once: batch 1 (specialised) and the symbolic batch, plus the
        # size that equals another dimension (dynamo's duck sizing gives that one its own graph)
        for _ in range(self.max_batch):
            self._forward(self._next_batch_size())


def make(fixed: bool = False) -> Pathology:
    """The recompile service, or with ``fixed`` its fix (dynamic shapes compiled before READY)."""
    return DynamicShapePathology() if fixed else RecompilePathology()
