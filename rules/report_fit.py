"""Fits the report model (``diagnose.rules.report_model``) on the incident corpus's train split:
``python -m diagnose.rules.report_fit [TRAIN.jsonl]`` writes the word vocabulary
(``derive/report_vocabulary.txt``) and the weights (``rules/report_model.json``), the regularisation chosen
by cross-validation on the train split alone; the validation split stays unseen.

Apart from the model so that the run-time path (the engine asks the model) and the fitting path (which
runs the engine over every incident) do not import each other.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
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
FOLDS = 5
CV_DRAWS = 3  # the regularisation's cross-validation is averaged over this many draws of the folds


def fold_of(case_id: str, repeat: int) -> int:
    """A case's fold in one draw (``repeat``), from its id: the regularisation's cross-validation here, the
    report model's out-of-fold answers and the calibrator's repeats (``calibration_fit``) all take it, so
    that a case added, answered or left undetermined after a change moves no other case to another fold."""
    return int(hashlib.sha256(f"{repeat}:{case_id}".encode()).hexdigest(), 16) % FOLDS


def _scores(model: Model, xs: Sequence[Mapping[str, float]], accepts: Sequence[Sequence[str]]) -> tuple[float, float]:
    """(accuracy, log-loss) of ``model`` on ``xs``, from one prediction per case: the top class is right when
    accepted; the loss is −log of the probability given the accepted classes (a case may accept two)."""
    ok, loss = 0, 0.0
    for x, acc in zip(xs, accepts, strict=True):
        probs = model.predict(x)
        ok += max(probs, key=probs.__getitem__) in acc
        loss -= math.log(max(1e-6, sum(probs.get(c, 0.0) for c in set(acc))))
    return ok / max(1, len(xs)), loss / max(1, len(xs))


def case_inputs(evidence: str) -> tuple[EvidenceSet, dict[str, float]]:
    """One incident's evidence read as ``diagnose analyze -`` reads it, and what the report model weighs of
    it (the report rules judged alone, before any model decides).

    The inputs are those of the deciding path: a report that names no counted concept brings no words here,
    though the differential asks the model with them (``report_model.inputs(words=True)``). Fitting with
    those words was tried on train, out of fold over three splits of the folds (2026-12-04): top-3 1,307
    against 1,306 of 1,467, the leading answer right 1,006 times either way: no gain, so the fit was kept."""
    res = loose.analyze_stream("case", io.BufferedReader(io.BytesIO(evidence.encode())))
    ev = EvidenceSet(res.evidence)
    found, _ = run_rules(ev, decide=False)
    return ev, inputs(ev, [f for f in found if f.code in REPORT_CODES])


def _corpus(path: str) -> tuple[list[str], list[dict[str, float]], list[str], list[float], list[list[str]]]:
    """Ids, features, labels, weights (stretch cases count half) and accept lists of a corpus split."""
    ids, xs, ys, ws, accepts = [], [], [], [], []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            case = json.loads(line)
            label = case["expected_class"]
            if label not in CLASSES:
                continue
            ids.append(str(case["id"]))
            xs.append(case_inputs(case["evidence"])[1])
            ys.append(label)
            ws.append(1.0 if case.get("scored", True) else 0.5)
            accepts.append(list(case["accept"]))
    return ids, xs, ys, ws, accepts


def build_vocabulary(path: str) -> frozenset[str]:
    """Words and word pairs used by at least ``MIN_DOCS`` incidents of the split at ``path``."""
    df: Counter[str] = Counter()
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            df.update(words_of(json.loads(line)["evidence"]))
    return frozenset(w for w, n in df.items() if n >= MIN_DOCS)


def train(path: str, l2s: Sequence[float] = (0.003, 0.01, 0.03)) -> Model:
    """Fit on ``path``; the regularisation is chosen by ``FOLDS``-fold cross-validation on it alone, the folds
    drawn from the case ids ``CV_DRAWS`` times over (one draw by row order moved with every case added).

    The choice is by log-loss, not accuracy: what the later stages take from the model is its probabilities
    (the calibrator weighs them, the differential ranks by them), and accuracy cannot tell the values apart
    (0.003 and 0.01: 0.6380 and 0.6384 cross-validated, log-loss 1.26 and 1.40, each split alike). Below
    the grid the log-loss goes on falling (0.001: 1.20, 0.0003: 1.18): the fixed number of gradient steps
    (``report_model.fit``) regularises as well, so the grid's lowest value is not a minimum found."""
    words = build_vocabulary(path)
    claims.set_vocabulary(words)
    with open(claims.VOCABULARY_PATH, "w", encoding="utf-8") as fh:
        fh.write(f"# words and word pairs in at least {MIN_DOCS} incidents of {os.path.basename(path)}; "
                 "written by python -m diagnose.rules.report_fit\n")
        fh.writelines(f"{w}\n" for w in sorted(words))
    ids, xs, ys, ws, accepts = _corpus(path)
    best: tuple[float, float, float] | None = None  # (log-loss, accuracy, l2)
    for l2 in l2s:
        losses, scores = [], []
        for split in range(CV_DRAWS):
            folds = [fold_of(i, split) for i in ids]
            for k in range(FOLDS):
                tr = [i for i in range(len(xs)) if folds[i] != k]
                te = [i for i in range(len(xs)) if folds[i] == k]
                m = fit([xs[i] for i in tr], [ys[i] for i in tr], [ws[i] for i in tr], l2)
                accuracy, loss = _scores(m, [xs[i] for i in te], [accepts[i] for i in te])
                scores.append(accuracy)
                losses.append(loss)
        mean_loss = sum(losses) / len(losses)
        if best is None or mean_loss < best[0]:
            best = (mean_loss, sum(scores) / len(scores), l2)
    assert best is not None
    m = fit(xs, ys, ws, best[2])
    m.meta = {"fitted_on": os.path.relpath(path, os.path.dirname(HERE)), "cases": len(xs), "l2": best[2],
              "cross_validated_log_loss": round(best[0], 3), "cross_validated_accuracy": round(best[1], 3),
              "train_accuracy": round(_scores(m, xs, accepts)[0], 3)}
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
