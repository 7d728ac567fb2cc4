"""What every pathology of the demo service is: the ``Pathology`` interface, its result, a bad request.

Each pathology module (``cpu_preprocess``, ``recompile``, ``queueing``, ``healthy``, ``prefill``)
holds one way of serving ``/infer`` and its ``--fixed`` variant; ``server`` serves whichever
``pathologies.make_pathology`` built.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diagnose.examples.service.metrics import Metrics


log = logging.getLogger("diagnose.examples.service")  # one logger for every module: the log lines name it

JOB_TIMEOUT_S = 300.0  # the longest a request waits for the model (a job, a pre-processing task, a token)
STOP_TIMEOUT_S = 30.0  # the longest prefill takes a few seconds


class BadRequest(ValueError):
    """The request cannot be served (answered with HTTP 400)."""


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


def parse_json(body: bytes) -> dict[str, Any]:
    """A request body as a JSON object (empty: ``{}``); raises BadRequest."""
    if not body:
        return {}
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise BadRequest("body must be a JSON object")
    return doc
