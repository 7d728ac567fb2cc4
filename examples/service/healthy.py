"""``healthy``: the queueing design with a small, fast model under light load; nothing is saturated.

The same threaded front and single model-worker thread as ``queueing`` with a model of ~5-10 ms
per inference: under one client with think time the worker is mostly idle and requests do not
wait. ``--fixed`` has nothing to fix and serves the same.
"""

from __future__ import annotations

from diagnose.examples.service.base import Pathology
from diagnose.examples.service.model import TokenModelConfig
from diagnose.examples.service.queueing import WorkerQueuePathology

HEALTHY_MODEL = TokenModelConfig(vocab=32000, d_model=512, d_hidden=2048, n_blocks=3, seq_len=64)


def make(fixed: bool = False) -> Pathology:
    """The healthy service; ``fixed`` changes nothing (there is nothing to fix)."""
    return WorkerQueuePathology("healthy", HEALTHY_MODEL)
