"""Fits the calibrator (``diagnose.rules.calibration``): ``python -m diagnose.rules.calibration_fit`` writes
``rules/calibration.json``.

1. Out-of-fold answers on the incident corpus's train split: the report model is refitted on four folds
   (its shipped regularisation) and the rules answer each case of the fifth with it, so no answer has seen
   its own case. Each scored case gives one row: what the answer rests on (``calibration.features``) and
   whether it was right. The folds are drawn from the case ids, ``SPLITS`` times over: each split is one
   draw of which cases the report model saw, and the threshold is chosen on them pooled.
2. A logistic regression on those rows, itself cross-validated (five folds, folds drawn from the case's id,
   each row's probability averaged over ``REPEATS`` such splits) for out-of-fold probabilities:
   the threshold is the lowest probability at which the committed rows are right at least
   ``PRECISION`` of the time with one standard error to spare (and every higher threshold that commits at
   least ``MIN_COMMITTED`` rows at ``PRECISION`` itself); the reliability
   table is stated against observed. The shipped weights are fitted on the splits' rows pooled too.
3. The covered regime: every real recording kept as test data whose measurements cover the service,
   answered by the rules, against the pathology its recipe induced; Laplace-smoothed.

The validation split is never read.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from diagnose import pipeline
from diagnose.model import EvidenceSet
from diagnose.rules import calibration, report_model
from diagnose.rules.engine import run_rules
from diagnose.rules.report_fit import FOLDS, case_inputs, fold_of
from diagnose.rules.verdict import decide
from diagnose.stats import wilson

ROOT = os.path.dirname(calibration.HERE)
TRAIN = os.path.join(ROOT, "tests", "data", "incidents", "train.jsonl")
PRECISION = 0.90
MARGIN_Z = 1.0  # the precision is held one standard error above PRECISION (``choose_threshold``)
REPEATS = 8  # the calibrator's cross-validation is repeated over this many splits (``cross_validated``)
SPLITS = 3  # the report model's out-of-fold answers are made over this many splits, pooled for the threshold
MIN_COMMITTED = 30  # a threshold must leave at least this many committed rows to be judged by
L2 = 1.0
GRID = [round(0.5 + 0.01 * i, 2) for i in range(50)]


@dataclass(frozen=True)
class Row:
    id: str
    x: dict[str, float]
    right: bool


def _cases(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _unwithheld() -> calibration.Calibrator:
    """A calibrator that commits everything: the rules' raw answers while fitting."""
    return calibration.Calibrator({}, 0.0, 1.0, {})


def oof_rows(path: str = TRAIN, splits: int = 1) -> tuple[list[list[Row]], int]:
    """The out-of-fold rows of the train split's scored cases, once per split of the report model's folds
    (``splits`` of them, drawn from the case ids: a case added moves no other to a new fold), and how many
    scored cases there are (those the rules left undetermined give no row: nothing was answered)."""
    cases = _cases(path)
    read = [case_inputs(c["evidence"]) for c in cases]
    evs, xs = [ev for ev, _ in read], [x for _, x in read]
    shipped = report_model.model()
    l2 = float(shipped.meta.get("l2", 0.01)) if shipped is not None else 0.01
    runs: list[list[Row]] = []
    try:
        for split in range(splits):
            folds = [fold_of(str(c["id"]), split) for c in cases]
            rows: list[Row] = []
            for k in range(FOLDS):
                tr = [i for i in range(len(cases))
                      if folds[i] != k and cases[i]["expected_class"] in report_model.CLASSES]
                report_model._MODEL = report_model.fit([xs[i] for i in tr], [cases[i]["expected_class"] for i in tr],
                                                       [1.0 if cases[i].get("scored", True) else 0.5 for i in tr], l2)
                for i in (i for i in range(len(cases)) if folds[i] == k):
                    if not cases[i].get("scored", True):
                        continue
                    findings, _ = run_rules(evs[i])
                    verdict, _ = decide(evs[i], findings, None)
                    answer, top = calibration.answer_of(findings, verdict)
                    if answer is None:
                        continue
                    x = calibration.features(answer, top, findings, calibration.lean(evs[i], findings))
                    rows.append(Row(cases[i]["id"], x, answer in cases[i]["accept"]))
            runs.append(sorted(rows, key=lambda r: r.id))
    finally:
        report_model._MODEL = None
    return runs, sum(1 for c in cases if c.get("scored", True))


def fit_logistic(rows: Sequence[Row], names: Sequence[str], l2: float = L2, iterations: int = 4000) -> dict[str, float]:
    """P(right | x) by full-batch gradient descent (deterministic, numpy); the bias is not regularised."""
    import numpy as np

    X = np.array([[r.x.get(n, 0.0) for n in names] for r in rows])
    y = np.array([1.0 if r.right else 0.0 for r in rows])
    w = np.zeros(len(names))
    reg = np.array([0.0 if n == "bias" else l2 for n in names])
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(X @ w)))
        w -= 0.5 * (X.T @ (p - y) + reg * w) / len(y)
    return {n: round(float(v), 4) for n, v in zip(names, w, strict=True)}


def _p(w: dict[str, float], x: dict[str, float]) -> float:
    return calibration.Calibrator(w, 0.0, 0.0, {}).excerpt(x)


def cross_validated(rows: Sequence[Row], names: Sequence[str], repeats: int = REPEATS) -> list[float]:
    """Each row's out-of-fold probability, averaged over ``repeats`` different splits into ``FOLDS`` folds.

    With one split, which rows share a fold moves the probabilities near the top by a few hundredths, and
    the threshold with them: one case more or less among the answers, a split by row order reshuffled, and
    the out-of-fold precision of the top thirty rows went from 0.95 to below the target's margin."""
    out = [0.0] * len(rows)
    for rep in range(repeats):
        folds = [fold_of(r.id, rep) for r in rows]
        for k in range(FOLDS):
            w = fit_logistic([r for r, f in zip(rows, folds, strict=True) if f != k], names)
            for i, (r, f) in enumerate(zip(rows, folds, strict=True)):
                if f == k:
                    out[i] += _p(w, r.x) / repeats
    return out


def choose_threshold(ps: Sequence[float], right: Sequence[bool], copies: int = 1) -> float:
    """The lowest grid probability whose committed rows are right at least ``PRECISION`` of the time with one
    standard error to spare (the Wilson bound at ``MARGIN_Z``), no higher threshold's rows falling below
    ``PRECISION`` itself (thresholds that commit fewer than ``MIN_COMMITTED`` rows are not judged).

    The out-of-fold precision is an estimate from a hundred-odd committed rows: where it hovers at the
    target over a wide band of thresholds, the band's lowest end commits at the target only on average,
    below it on new incidents as often as above. Keeping one standard error above the target (the
    one-standard-error rule of model selection) picks a threshold that holds out of sample. The margin is
    asked of the rows the threshold commits, not of every higher threshold's fewer rows: there two wrong
    answers among the top thirty-odd (94 % right) fail a one-standard-error bound that the hundred rows
    below them meet, and would forbid committing anything.

    ``copies``: ``ps`` and ``right`` hold that many out-of-fold runs of the same cases (``SPLITS``): their
    precision is pooled, their margin is that of one run's number of cases."""
    ok_from = None
    for t in reversed(GRID):
        n = sum(p >= t for p in ps)
        if n < MIN_COMMITTED * copies:
            continue
        k = sum(r for p, r in zip(ps, right, strict=True) if p >= t)
        if k / n < PRECISION:
            break
        if wilson_low(k / copies, n / copies, MARGIN_Z) >= PRECISION:
            ok_from = t
    return ok_from if ok_from is not None else 1.0


def wilson_low(k: float, n: float, z: float) -> float:
    """The lower end of the Wilson score interval of ``k`` right in ``n`` at ``z`` standard errors."""
    return wilson(k / n, n, z)[0] if n else 0.0


def reliability(ps: Sequence[float], right: Sequence[bool], bins: int = 10) -> tuple[list[dict[str, Any]], float]:
    """Stated probability against observed accuracy per bin, and the expected calibration error."""
    table, ece = [], 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        sel = [(p, r) for p, r in zip(ps, right, strict=True) if lo <= p < hi or (b == bins - 1 and p == 1.0)]
        if not sel:
            continue
        stated = sum(p for p, _ in sel) / len(sel)
        observed = sum(r for _, r in sel) / len(sel)
        ece += len(sel) / max(1, len(ps)) * abs(stated - observed)
        table.append({"bin": f"{lo:.1f}-{hi:.1f}", "n": len(sel), "stated": round(stated, 3),
                      "observed": round(observed, 3)})
    return table, round(ece, 4)


# -- the covered regime: real recordings kept as test data, with the pathology each recipe induced --------
LLAMACPP_TRUTH = {"healthy": "none", "model-name-L4": "none", "queueing": "queueing", "prefill": "prefill_ttft",
                  "detok-long-stream": "cpu_preprocessing"}
SESSION_TRUTH = {"cpu_preprocess": "cpu_preprocessing", "healthy": "none", "prefill": "prefill_ttft",
                 "queueing": "queueing", "recompile": "recompilation"}


def recordings() -> Iterator[tuple[str, list[str], str]]:
    """(name, the paths one leg gives ``diagnose analyze``, the induced truth) of every real recording."""
    vllm = os.path.join(ROOT, "tests", "data", "engines", "vllm")
    for name in sorted(os.listdir(vllm)):
        folder = os.path.join(vllm, name)
        with open(os.path.join(folder, "how.json"), encoding="utf-8") as fh:
            truth = json.load(fh)["recipe"]["truth"]
        truth = "none" if truth == "healthy" else truth
        for leg in ("attach", "vllm.log", "metrics.txt", "kernel.log"):
            if os.path.exists(os.path.join(folder, leg)):
                yield f"vllm/{name}/{leg}", [os.path.join(folder, leg)], truth
    llama = os.path.join(ROOT, "tests", "data", "engines", "llamacpp")
    for name in sorted(os.listdir(llama)):
        truth = next((t for k, t in LLAMACPP_TRUTH.items() if name.startswith(k)), None)
        if truth is None or not os.path.isdir(os.path.join(llama, name)):
            continue
        for leg in ("attach", "server.log", "metrics.txt"):
            if os.path.exists(os.path.join(llama, name, leg)):
                yield f"llamacpp/{name}/{leg}", [os.path.join(llama, name, leg)], truth
    sessions = os.path.join(ROOT, "tests", "data", "sessions")
    for name in sorted(os.listdir(sessions)):
        truth = next((t for k, t in SESSION_TRUTH.items() if name.startswith(k)), None)
        if truth is not None:
            yield f"sessions/{name}", [os.path.join(sessions, name)], truth


def covered_rows() -> list[dict[str, Any]]:
    out = []
    for name, paths, truth in recordings():
        d = pipeline.analyze(paths)
        ev = EvidenceSet(d.evidence)
        answer, top = calibration.answer_of(d.findings, d.overall)
        if answer is None or not calibration.covered_answer(ev, top):
            continue
        out.append({"recording": name, "answer": answer, "truth": truth, "right": answer == truth})
    return out


def train(path: str = TRAIN) -> dict[str, Any]:
    calibration._CAL = _unwithheld()
    try:
        runs, scored = oof_rows(path, SPLITS)
        names = list(runs[0][0].x)
        judged = [(cross_validated(rows, names), [r.right for r in rows]) for rows in runs]
        # one split of the report model's folds is one draw of which cases it saw for each answer: three
        # splits put the threshold at 0.88, 0.92 and nowhere (validation then committed at 88.9 % from the
        # first); the threshold is chosen on the splits pooled
        ps = [p for run, _ in judged for p in run]
        right = [r for _, run in judged for r in run]
        rows = [r for run in runs for r in run]
        # an answer that may not commit (the report's wording alone) is no row a threshold commits
        def able_of(run_ps: Sequence[float], run: Sequence[Row]) -> list[float]:
            return [0.0 if r.x.get("wording_only") else p for p, r in zip(run_ps, run, strict=True)]

        able = able_of(ps, rows)
        thresholds = [choose_threshold(able_of(run_ps, run), run_right)
                      for (run_ps, run_right), run in zip(judged, runs, strict=True)]
        threshold = choose_threshold(able, right, copies=len(judged))
        table, ece = reliability(ps, right)
        committed = [r for p, r in zip(able, right, strict=True) if p >= threshold]
        covered = covered_rows()
    finally:
        calibration._CAL = None
    k = sum(r["right"] for r in covered)
    return {
        "meta": {"fitted_on": os.path.relpath(path, ROOT), "scored_cases": scored, "answered_rows": len(runs[0]),
                 "l2": L2, "weights_l2": L2 * len(runs), "target_precision": PRECISION,
                 "oof_splits": SPLITS, "oof_thresholds": thresholds,
                 "oof_committed_precision": round(sum(committed) / max(1, len(committed)), 3),
                 "oof_coverage": round(len(committed) / max(1, scored * len(judged)), 3),
                 "oof_accuracy_of_answers": round(sum(right) / max(1, len(right)), 3),
                 "oof_calibration_error": ece, "oof_reliability": table},
        "threshold": threshold,
        # fitted on the splits pooled, as the threshold is chosen: a case's copies sum their losses, so the
        # regularisation is scaled by the number of splits to weigh against one case's worth of data
        "weights": fit_logistic(rows, names, L2 * len(runs)),
        "covered": {"n": len(covered), "right": k, "p": round((k + 1) / (len(covered) + 2), 3),
                    "recordings": covered},
    }


def save(doc: dict[str, Any], path: str = calibration.CALIBRATION_PATH) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.write("\n")


if __name__ == "__main__":
    fitted = train(sys.argv[1] if len(sys.argv) > 1 else TRAIN)
    save(fitted)
    print(json.dumps({**fitted["meta"], "threshold": fitted["threshold"],
                      "covered": {k: v for k, v in fitted["covered"].items() if k != "recordings"}}, indent=1))
