"""Fits the report model (``diagnose.rules.report_model``) on the incident corpus's train split:
``python -m diagnose.rules.report_fit [TRAIN.jsonl]`` writes the word vocabulary
(``derive/report_vocabulary.txt``) and the weights (``rules/report_model.json``), the regularisation chosen
by cross-validation on the train split alone; the validation split stays unseen.

Apart from the model so that the run-time path (the engine asks the model) and the fitting path (which
runs the engine over every incident) do not import each other.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections import Counter
from collections.abc import Mapping, Sequence

from diagnose import loose
from diagnose.collectors.claims import words_of
from diagnose.derive import claims
from diagnose.model import EvidenceSet
from diagnose.rules.engine import run_rules
from diagnose.rules.report import REPORT_CODES
from diagnose.rules.report_model import CLASSES, HERE, MODEL_PATH, Model, fit, inputs

MIN_DOCS = 3  # a word counts only when three incidents of the train split use it: no single incident's phrase


def _accuracy(model: Model, xs: Sequence[Mapping[str, float]], accepts: Sequence[Sequence[str]]) -> float:
    ok = 0
    for x, acc in zip(xs, accepts, strict=True):
        probs = model.predict(x)
        ok += max(probs, key=probs.__getitem__) in acc
    return ok / max(1, len(xs))


def case_inputs(evidence: str) -> tuple[EvidenceSet, dict[str, float]]:
    """One incident's evidence read as ``diagnose analyze -`` reads it, and what the report model weighs of
    it (the report rules judged alone, before any model decides)."""
    res = loose.analyze_stream("case", io.BufferedReader(io.BytesIO(evidence.encode())))
    ev = EvidenceSet(res.evidence)
    found, _ = run_rules(ev, decide=False)
    return ev, inputs(ev, [f for f in found if f.code in REPORT_CODES])


def _corpus(path: str) -> tuple[list[dict[str, float]], list[str], list[float], list[list[str]]]:
    """Features, labels, weights (stretch cases count half) and accept lists of a corpus split."""
    xs, ys, ws, accepts = [], [], [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            case = json.loads(line)
            label = case["expected_class"]
            if label not in CLASSES:
                continue
            xs.append(case_inputs(case["evidence"])[1])
            ys.append(label)
            ws.append(1.0 if case.get("scored", True) else 0.5)
            accepts.append(list(case["accept"]))
    return xs, ys, ws, accepts


def build_vocabulary(path: str) -> frozenset[str]:
    """Words and word pairs used by at least ``MIN_DOCS`` incidents of the split at ``path``."""
    df: Counter[str] = Counter()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            df.update(words_of(json.loads(line)["evidence"]))
    return frozenset(w for w, n in df.items() if n >= MIN_DOCS)


def train(path: str, folds: int = 5, l2s: Sequence[float] = (0.003, 0.01, 0.03)) -> Model:
    """Fit on ``path``; the regularisation is chosen by ``folds``-fold cross-validation on it alone."""
    words = build_vocabulary(path)
    claims.set_vocabulary(words)
    with open(claims.VOCABULARY_PATH, "w", encoding="utf-8") as fh:
        fh.write(f"# words and word pairs in at least {MIN_DOCS} incidents of {os.path.basename(path)}; "
                 "written by python -m diagnose.rules.report_fit\n")
        fh.writelines(f"{w}\n" for w in sorted(words))
    xs, ys, ws, accepts = _corpus(path)
    best: tuple[float, float] | None = None
    for l2 in l2s:
        scores = []
        for k in range(folds):
            tr = [i for i in range(len(xs)) if i % folds != k]
            te = [i for i in range(len(xs)) if i % folds == k]
            m = fit([xs[i] for i in tr], [ys[i] for i in tr], [ws[i] for i in tr], l2)
            scores.append(_accuracy(m, [xs[i] for i in te], [accepts[i] for i in te]))
        mean = sum(scores) / len(scores)
        if best is None or mean > best[0]:
            best = (mean, l2)
    assert best is not None
    m = fit(xs, ys, ws, best[1])
    m.meta = {"fitted_on": os.path.relpath(path, os.path.dirname(HERE)), "cases": len(xs), "l2": best[1],
              "cross_validated_accuracy": round(best[0], 3), "train_accuracy": round(_accuracy(m, xs, accepts), 3)}
    return m


def save(m: Model, path: str = MODEL_PATH) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"meta": m.meta, "bias": m.bias, "weights": m.weights}, fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    corpus = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(HERE), "tests", "data",
                                                                "incidents", "train.jsonl")
    fitted = train(corpus)
    save(fitted)
    print(json.dumps(fitted.meta, indent=1))
