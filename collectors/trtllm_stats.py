"""TensorRT-LLM's per-iteration statistics: the executor's ``getLatestIterationStats()`` as JSON, what
``trtllm-serve``'s ``/metrics`` endpoint returns (a JSON list, one object per engine iteration)::

    {"iter":0, "numActiveRequests":1, "numQueuedRequests":7, "maxNumActiveRequests":16,
     "kvCacheStats":{"usedNumBlocks":5495, "maxNumBlocks":7240, "freeNumBlocks":1745, …},
     "inflightBatchingStats":{"numContextRequests":1, "numGenRequests":0, "numCtxTokens":16000, …}, …}

Each object is one scheduler sample, as a vLLM stats line is: the requests running (``numActiveRequests``),
waiting (``numQueuedRequests``), the limit on running ones (``maxNumActiveRequests``), the KV cache's blocks in use.
Objects are found in a line as JSON (a list of them, one per line, or pasted inside a sentence); a repeated
``iter`` counts once. Pure, stdlib only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

MARKERS = ('"numQueuedRequests"', '"numActiveRequests"')
MAX_SAMPLES = 100_000


@dataclass(frozen=True)
class IterSample:
    it: int | None
    running: int
    waiting: int
    cap: int | None  # maxNumActiveRequests
    kv_used: int | None  # blocks
    kv_max: int | None
    token_budget: int | None  # maxNumTokensRuntime

    @property
    def kv_ratio(self) -> float | None:
        return self.kv_used / self.kv_max if self.kv_used is not None and self.kv_max else None


@dataclass
class IterStats:
    samples: list[IterSample] = field(default_factory=list)


def _int(doc: dict[str, object], key: str) -> int | None:
    v = doc.get(key)
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


_DECODER = json.JSONDecoder()


def _objects(line: str) -> list[dict[str, object]]:
    """The JSON objects in ``line``, wherever they stand in it ("[TensorRT-LLM][INFO] stats: {…} [rank 0]"): each
    '{' or '[' is tried in turn and what decodes from it is taken, the search going on after it."""
    out: list[dict[str, object]] = []
    i = 0
    while True:
        starts = [j for j in (line.find("{", i), line.find("[", i)) if j >= 0]
        if not starts:
            return out
        j = min(starts)
        try:
            doc, end = _DECODER.raw_decode(line, j)
        except ValueError:
            i = j + 1
            continue
        items = doc if isinstance(doc, list) else [doc]
        out.extend(d for d in items if isinstance(d, dict))
        i = end


class IterStatsParser:
    """Feed lines; ``stats`` holds the iterations read."""

    def __init__(self) -> None:
        self.stats = IterStats()
        self._seen: set[str] = set()  # the iterations read, whole: one polled twice is one sample

    def feed(self, line: str) -> None:
        if MARKERS[0] not in line or MARKERS[1] not in line:
            return
        for doc in _objects(line):
            running, waiting = _int(doc, "numActiveRequests"), _int(doc, "numQueuedRequests")
            if running is None or waiting is None or len(self.stats.samples) >= MAX_SAMPLES:
                continue
            it = _int(doc, "iter")
            # the same object twice is one iteration; the same iter number in another object is another one (a
            # restart counts from 0 again; attention-DP ranks share their iter numbers)
            key = json.dumps(doc, sort_keys=True)
            if key in self._seen:
                continue
            self._seen.add(key)
            kv = doc.get("kvCacheStats")
            kv = kv if isinstance(kv, dict) else {}
            self.stats.samples.append(IterSample(
                it, running, waiting, _int(doc, "maxNumActiveRequests"), _int(kv, "usedNumBlocks"),
                _int(kv, "maxNumBlocks"), _int(doc, "maxNumTokensRuntime")))

    def result(self) -> IterStats:
        return self.stats
