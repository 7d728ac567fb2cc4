"""``queueing``: a threaded HTTP front with ONE model-worker thread behind a queue.

Every inference goes through one ``model-worker`` thread fed by a ``queue.Queue``; each is
~40-80 ms of single-threaded matmuls. Under a dozen concurrent clients requests pile up waiting
for the one busy worker.

``--fixed`` (QUE001's fix): one model-worker thread per core (2-4) on the shared queue, each
batching the waiting requests into one forward (dynamic batching, up to 8).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from diagnose.examples.service.base import JOB_TIMEOUT_S, BadRequest, InferenceResult, Pathology, parse_json
from diagnose.examples.service.engine import Job, WorkerPool
from diagnose.examples.service.model import TokenClassifier, TokenModelConfig, summarize_logits

QUEUEING_MODEL = TokenModelConfig(vocab=32000, d_model=768, d_hidden=3072, n_blocks=4, seq_len=128)
MAX_BATCH = 8  # queueing --fixed: requests one forward serves at most
BATCH_WAIT_S = 0.05  # how long a worker waits for more requests after the first (Triton's max_queue_delay)


class WorkerQueuePathology(Pathology):
    """Threaded HTTP front, one model-worker thread behind a queue (``queueing`` and ``healthy``).

    ``workers``, ``max_batch`` and ``max_wait_s`` size the pool (``engine.WorkerPool``); the
    pathology is one worker that does not batch.
    """

    def __init__(self, name: str, cfg: TokenModelConfig, workers: int = 1, max_batch: int = 1,
                 max_wait_s: float = 0.0) -> None:
        self.name = name
        self.cfg = cfg
        torch.manual_seed(0)
        self.model = TokenClassifier(cfg.vocab, cfg.d_model, cfg.d_hidden, cfg.n_blocks).eval()
        self.pool = WorkerPool(self.model, workers, max_batch, max_wait_s)

    def _tokens(self, doc: dict[str, Any]) -> torch.Tensor:
        raw = doc.get("tokens")
        if not isinstance(raw, list) or not raw or not all(isinstance(t, int) for t in raw):
            raise BadRequest("body needs 'tokens': a non-empty list of integers")
        ids = [t % self.cfg.vocab for t in raw[: self.cfg.seq_len]]
        ids += [0] * (self.cfg.seq_len - len(ids))  # pad to the fixed sequence length
        return torch.tensor([ids], dtype=torch.long)

    def _run(self, tokens: torch.Tensor) -> Job:
        job = self.pool.submit(tokens)
        if not job.done.wait(JOB_TIMEOUT_S):
            who = "worker" if len(self.pool.threads) == 1 else "workers"
            raise TimeoutError(f"the model {who} did not answer in time")
        if job.error is not None:
            raise job.error
        return job

    def warmup(self) -> None:
        tokens = torch.randint(0, self.cfg.vocab, (1, self.cfg.seq_len))
        for _ in range(3):
            self._run(tokens)

    def infer(self, body: bytes, content_type: str) -> InferenceResult:
        t0 = time.perf_counter()
        tokens = self._tokens(parse_json(body))
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
        return self.pool.running, self.pool.jobs.qsize()

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": self.pool.jobs.qsize(), "worker_busy": self.pool.busy}

    def close(self) -> None:
        # stop() joins: a daemon thread still inside a torch kernel when the interpreter exits
        # aborts the process (SIGABRT) instead of the clean exit SIGTERM asks for.
        self.pool.stop()


def default_pool_workers() -> int:
    """Model-worker threads for the fix: one per core, at least 2, at most 4."""
    return max(2, min(4, os.cpu_count() or 2))


class BatchingQueuePathology(WorkerQueuePathology):
    """``queueing --fixed``: the same front and model with QUE001's fix applied.

    Serving capacity is added (one model-worker thread per core, 2 to 4) and each worker batches
    the requests waiting in the queue into one forward (dynamic batching, at most ``MAX_BATCH``),
    so the queue drains at the same offered load.
    """

    def __init__(self, name: str, cfg: TokenModelConfig, workers: int | None = None) -> None:
        super().__init__(name, cfg, default_pool_workers() if workers is None else workers, MAX_BATCH, BATCH_WAIT_S)

    def stats(self) -> dict[str, Any]:
        return {"queue_depth": self.pool.jobs.qsize(), "running": self.pool.running,
                "workers": len(self.pool.threads), "max_batch": self.pool.max_batch, "batches": self.pool.batches}


def make(fixed: bool = False) -> Pathology:
    """The queueing service, or with ``fixed`` its fix (more workers, dynamic batching)."""
    return BatchingQueuePathology("queueing", QUEUEING_MODEL) if fixed else WorkerQueuePathology(
        "queueing", QUEUEING_MODEL)
