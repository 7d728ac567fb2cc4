"""The table of pathologies: a name, and the service that shows it (or its fix)."""

from __future__ import annotations

import diagnose.examples.service.cpu_preprocess as cpu_preprocess
import diagnose.examples.service.healthy as healthy
import diagnose.examples.service.prefill as prefill
import diagnose.examples.service.queueing as queueing
import diagnose.examples.service.recompile as recompile
from diagnose.examples.service.base import Pathology

PATHOLOGY_NAMES: tuple[str, ...] = ("cpu-preprocess", "recompile", "queueing", "healthy", "prefill")


def make_pathology(name: str, fixed: bool = False, preprocess_workers: int = 0) -> Pathology:
    """The pathology ``name``; ``fixed``: the same service with the fix diagnose recommends for it
    (``healthy`` has nothing to fix and is the same either way)."""
    if name == "cpu-preprocess":
        return cpu_preprocess.make(fixed, preprocess_workers)
    if name == "recompile":
        return recompile.make(fixed)
    if name == "queueing":
        return queueing.make(fixed)
    if name == "healthy":
        return healthy.make(fixed)
    if name == "prefill":
        return prefill.make(fixed)
    raise ValueError(f"unknown pathology {name!r}; choose one of {', '.join(PATHOLOGY_NAMES)}")
