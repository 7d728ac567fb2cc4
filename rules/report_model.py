"""Which bottleneck a report's wording leans to, when no stronger signal decides.

A report's prose names concepts ("queue", "prompt processing", "offload", "warm-up") in its body,
its title and the sentence that names a cause; frameworks print fixed messages. Each is a *cue*
(``analyzer/derive/claims.cues``). How much each cue speaks for each category is not hand-set: a
multinomial logistic regression is fitted on the real-incident corpus's train split
(``tests/data/incidents/train.jsonl``), over cues and the presence of structured evidence families
(an allocator message and its phase, an engine's stats, a compile log, stage timings, a GPU sample),
never over words of one incident. The weights live in ``report_model.json`` beside this module with
how they were fitted; ``python -m diagnose.rules.report_fit`` refits them. Only the train split is used:
the validation split stays unseen.

At run time ``lean(ev)`` gives each category a probability; the report rules take the top one as
a weak signal (*heuristic*), below every explicit signal, and say which cues carried it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from diagnose.model import Category, Evidence, EvidenceSet, Finding, Severity

HERE = os.path.dirname(os.path.realpath(__file__))
MODEL_PATH = os.path.join(HERE, "report_model.json")
NONE = "none"  # the class of reports whose thread settled that nothing was wrong
CLASSES: tuple[str, ...] = (*(c.value for c in Category), NONE)

# structured evidence whose mere presence is a cue: the kind of evidence the report pasted
FAMILIES: tuple[tuple[str, str], ...] = (
    ("s:oom", "mem.oom_count"),
    ("s:engine_stats", "serving.stat_samples"),
    ("s:compile_log", "compile."),
    ("s:stages", "stage."),
    ("s:gpu_sampled", "gpu.util_ratio"),
    ("s:trace", "trace."),
    ("s:bench", "bench."),
    ("s:ttft", "latency.ttft_ms"),
    ("s:input_tokens", "tokens.input_mean"),
    ("s:copies", "copy."),
    ("s:model_size", "model.params"),
    ("s:weights_vs_gpu", "gpu.spec_memory_bytes"),
    ("s:allocator", "mem.allocated_bytes"),
    ("s:other_processes", "mem.other_processes_bytes"),
)
PHASES = ("loading", "profile_run", "warmup", "serving", "unknown")


def features(ev: EvidenceSet, words: bool = False) -> dict[str, float]:
    """The cues of one evidence set: the report's own, and which structured families are present. With
    ``words``, a report that names no counted concept brings its words (``report.words``) instead."""
    got = ev.get("report.cues") or (ev.get("report.words") if words else None)
    out: dict[str, float] = dict(got.value) if isinstance(got, Evidence) and isinstance(got.value, dict) else {}
    for name, key in FAMILIES:
        if ev.has_prefix(key) if key.endswith(".") else key in ev:
            out[name] = 1.0
    phase = ev.get("mem.oom_phase")
    if isinstance(phase, Evidence) and phase.value in PHASES:
        out[f"s:phase_{phase.value}"] = 1.0
    engine = ev.get("serving.engine")
    if isinstance(engine, Evidence):
        out[f"s:engine_{str(engine.value).lower()}"] = 1.0
    return out


def inputs(ev: EvidenceSet, findings: Iterable[Finding], words: bool = False) -> dict[str, float]:
    """What the model weighs for one evidence set: its cues and families, and the report rules' own signals
    (``findings``: the report rules' findings)."""
    return {**features(ev, words), **signal_features(findings)}


class Model:
    """Weights per (class, cue) and a bias per class; ``predict`` is a softmax over them."""

    def __init__(self, weights: Mapping[str, Mapping[str, float]], bias: Mapping[str, float],
                 meta: Mapping[str, Any] | None = None) -> None:
        self.weights = weights
        self.bias = bias
        self.meta = dict(meta or {})

    def scores(self, x: Mapping[str, float]) -> dict[str, float]:
        return {c: self.bias.get(c, 0.0) + sum(w.get(f, 0.0) * v for f, v in x.items())
                for c, w in self.weights.items()}

    def predict(self, x: Mapping[str, float]) -> dict[str, float]:
        s = self.scores(x)
        top = max(s.values())
        e = {c: math.exp(v - top) for c, v in s.items()}
        total = sum(e.values())
        return {c: v / total for c, v in e.items()}

    def why(self, x: Mapping[str, float], cls: str, n: int = 4) -> list[str]:
        """The cues that speak most for ``cls``."""
        w = self.weights.get(cls, {})
        ranked = sorted(((w.get(f, 0.0) * v, f) for f, v in x.items()), reverse=True)
        return [f for contrib, f in ranked[:n] if contrib > 0]


_MODEL: Model | None = None


def model() -> Model | None:
    """The fitted model, or None when no weights were shipped."""
    global _MODEL
    if _MODEL is None and os.path.exists(MODEL_PATH):
        with open(MODEL_PATH, encoding="utf-8") as fh:
            doc = json.load(fh)
        _MODEL = Model(doc["weights"], doc["bias"], doc.get("meta"))
    return _MODEL


def signal_features(findings: Iterable[Finding]) -> dict[str, float]:
    """What the report rules concluded on their own: per category, the strongest finding's impact."""
    out: dict[str, float] = {}
    for f in findings:
        key = f"r:{f.label if f.severity is not Severity.INFO else NONE}"
        out[key] = max(out.get(key, 0.0), f.impact)
    return out


def decide(ev: EvidenceSet, findings: Iterable[Finding]) -> tuple[str, float, list[str]] | None:
    """(the category the report points to, its probability, the cues that carried it), or None:
    the report's cues, the structured families present, and the report rules' own findings, weighed."""
    m = model()
    if m is None or "report.cues" not in ev:
        return None
    x = inputs(ev, findings)
    probs = m.predict(x)
    cls = max(probs, key=probs.__getitem__)
    return cls, probs[cls], [c for c in m.why(x, cls) if not c.startswith("r:")]


# -- fitting ------------------------------------------------------------------------------------

def fit(xs: Sequence[Mapping[str, float]], ys: Sequence[str], sample_weight: Sequence[float],
        l2: float, iterations: int = 1500, rate: float = 0.5) -> Model:
    """Multinomial logistic regression by full-batch gradient descent (deterministic, numpy)."""
    import numpy as np

    names = sorted({f for x in xs for f in x})
    index = {f: i for i, f in enumerate(names)}
    classes = [c for c in CLASSES if c in set(ys)]
    X = np.zeros((len(xs), len(names)))
    for r, x in enumerate(xs):
        for f, v in x.items():
            X[r, index[f]] = v
    Y = np.zeros((len(ys), len(classes)))
    for r, y in enumerate(ys):
        Y[r, classes.index(y)] = 1.0
    sw = np.asarray(sample_weight, dtype=float)[:, None]
    W = np.zeros((len(names), len(classes)))
    b = np.zeros(len(classes))
    n = sw.sum()
    for _ in range(iterations):
        z = X @ W + b
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        g = (p - Y) * sw / n
        W -= rate * (X.T @ g + l2 * W)
        b -= rate * g.sum(axis=0)
    weights = {c: {f: round(float(W[i, j]), 3) for f, i in index.items() if abs(W[i, j]) >= PRUNE}
               for j, c in enumerate(classes)}
    return Model(weights, {c: round(float(b[j]), 4) for j, c in enumerate(classes)})


PRUNE = 0.05  # weights smaller than this change no decision; dropping them keeps the table small
