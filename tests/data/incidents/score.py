"""Score ``diagnose analyze`` on the incident corpus the way an on-call engineer meets it: how often a
committed verdict is right, how often it commits, whether the truth is among the candidates, and whether
the stated probability means what it says.

    python tests/data/incidents/score.py [--write-doc docs/calibration.md] [--out-of-fold TRAIN.jsonl] SPLIT.jsonl ...

Each case's evidence goes to ``diagnose analyze - --format json`` (in this process, as the CLI runs it).
Over the scored cases of each split it prints: **accuracy** (the verdict's answer is accepted; an
undetermined verdict is not an answer), **committed precision** (right among the verdicts that commit: a
bottleneck or healthy), **coverage** (the share that commits), **top-3** (an accepted category among the
candidates, or the committed answer), the **calibration error** (expected calibration error of the stated
probability of the leading answer, committed or withheld) and crashes. ``--write-doc`` writes the
reliability tables (stated probability against observed accuracy, by bin) to a Markdown page.
``--out-of-fold`` scores the train split as the tool meets reports it has not seen (the report model refitted
without each case's fold): train's in-sample figures flatter it, and validation is only looked at after a
change is done, so this is the figure a change is judged by while it is made.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from diagnose import cli
from diagnose.rules import calibration, calibration_fit, report_fit, report_model
from diagnose.units import pct


@dataclass
class Split:
    name: str
    cases: int = 0
    right: int = 0
    committed: int = 0
    committed_right: int = 0
    top3: int = 0
    crashes: int = 0
    stated: list[float] = field(default_factory=list)
    observed: list[bool] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    def line(self) -> str:
        n = max(1, self.cases)
        prec = self.committed_right / max(1, self.committed)
        _, ece = calibration_fit.reliability(self.stated, self.observed)
        return (f"{self.name}: accuracy {self.right}/{self.cases} ({self.right / n:.1%}), committed precision "
                f"{self.committed_right}/{self.committed} ({prec:.1%}), coverage {self.committed / n:.1%}, top-3 "
                f"{self.top3 / n:.1%}, calibration error {ece:.3f}, crashes {self.crashes}")


def diagnose_case(evidence: str) -> dict[str, Any] | None:
    """``diagnose analyze - --format json`` on ``evidence``, in this process; None when it fails."""
    saved = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(evidence.encode()), encoding="utf-8")
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["analyze", "-", "--format", "json"])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    finally:
        sys.stdin = saved
    if rc not in (0, 1):
        return None
    try:
        doc: dict[str, Any] = json.loads(out.getvalue())
    except ValueError:
        return None
    return doc


def leading(doc: dict[str, Any]) -> tuple[str, float] | None:
    """The answer the verdict leads with, committed or withheld, and its stated probability: the committed
    answer, else the differential's first (best first: a withheld answer the others outweigh is not it)."""
    p = doc.get("probability")
    if p is None:
        return None
    if doc["verdict"] == "healthy":
        return "none", float(p)
    if doc["primary"]:
        return str(doc["primary"]), float(p)
    cands = doc.get("candidates") or []
    return (str(cands[0]["category"]), float(cands[0]["probability"])) if cands else None


def score(path: str, show_failures: bool = False, out_of_fold: bool = False) -> Split:
    """The figures of one split. With ``out_of_fold`` each case is answered by a report model refitted without
    its fold (``report_fit``'s folds, the shipped regularisation): the train split as the tool meets a report it
    has not seen, so a change can be judged on train without looking at validation. (The calibrator, fitted on
    train's out-of-fold answers, the cue vocabulary and the regularisation, both chosen on all of train, are
    kept: the figure is a little kinder than validation's.)"""
    split = Split(os.path.basename(path) + (" (out of fold)" if out_of_fold else ""))
    with open(path, encoding="utf-8") as fh:
        cases = [json.loads(line) for line in fh if line.strip()]
    fold: list[int] = []
    if out_of_fold:
        xs = [report_fit.case_inputs(c["evidence"])[1] for c in cases]
        fold = [report_fit.fold_of(str(c["id"]), 0) for c in cases]
        shipped = report_model.model()
        l2 = float(shipped.meta.get("l2", 0.01)) if shipped is not None else 0.01
    try:
        for k in range(report_fit.FOLDS if out_of_fold else 1):
            if out_of_fold:
                tr = [i for i, c in enumerate(cases) if fold[i] != k and c["expected_class"] in report_model.CLASSES]
                report_model._MODEL = report_model.fit(
                    [xs[i] for i in tr], [cases[i]["expected_class"] for i in tr],
                    [1.0 if cases[i].get("scored", True) else 0.5 for i in tr], l2)
            _score_cases([c for i, c in enumerate(cases) if not out_of_fold or fold[i] == k], split)
    finally:
        report_model._MODEL = None
    if show_failures:
        print(*split.failures, sep="\n")
    return split


def _score_cases(cases: list[dict[str, Any]], split: Split) -> None:
    for case in cases:
        if not case.get("scored", True):
            continue
        split.cases += 1
        accept = set(case["accept"])
        doc = diagnose_case(case["evidence"])
        if doc is None:
            split.crashes += 1
            split.failures.append(f"CRASH {case['id']}")
            continue
        committed = doc["verdict"] in ("bottleneck", "healthy")
        answer = (doc["primary"] or "none") if committed else "undetermined"
        ok = answer in accept
        split.right += ok
        split.committed += committed
        split.committed_right += committed and ok
        cands = {c["category"] for c in doc.get("candidates") or []}
        split.top3 += bool((cands | ({answer} if committed else set())) & accept)
        lead = leading(doc)
        if lead is not None:
            split.stated.append(lead[1])
            split.observed.append(lead[0] in accept)
        if not ok:
            split.failures.append(f"FAIL {case['id']}: expected {'|'.join(sorted(accept))}, got {answer}"
                                  + (f" (leading {lead[0]} at {lead[1]})" if not committed and lead else ""))


def reliability_md(split: Split) -> list[str]:
    table, ece = calibration_fit.reliability(split.stated, split.observed)
    out = [f"### {split.name}", "", "| stated probability | answers | stated (mean) | observed accuracy |",
           "|---|---|---|---|"]
    out += [f"| {r['bin']} | {r['n']} | {r['stated']:.2f} | {r['observed']:.2f} |" for r in table]
    return [*out, "", f"Expected calibration error: {ece:.3f}.", ""]


def write_doc(path: str, splits: list[Split]) -> None:
    cal = calibration.calibrator()
    meta: dict[str, Any] = dict(cal.meta) if cal is not None else {}
    target = pct(float(meta.get("target_precision", calibration_fit.PRECISION)))
    lines = ["# How far to trust a verdict: calibration", "",
             "Generated by `make score` (`tests/data/incidents/score.py --write-doc`); do not edit by hand.", "",
             "Every verdict carries a probability (`diagnose.rules.calibration`): for excerpts, a logistic",
             "regression over what the answer rests on, fitted on the train split's *out-of-fold* answers",
             "(`python -m diagnose.rules.calibration_fit`); for services whose measurements cover them, the",
             "share of right answers on the real engine and demo recordings kept as test data. An excerpt's",
             f"primary is committed only at or above **{cal.threshold if cal else 'n/a'}**, the lowest probability "
             "at which",
             f"the train split's out-of-fold committed answers are right at least {target} of the time with one",
             "standard error to spare (the lower end of its Wilson interval; each answer's out-of-fold probability",
             f"averaged over {calibration_fit.REPEATS} splits, the report model's answers made over "
             f"{calibration_fit.SPLITS} splits and pooled); a covered answer commits when the recordings' rate "
             f"reaches {target}.",
             "Below either the verdict is `undetermined` and the candidates lead.", "",
             "## The figures", "", "| split | figures |", "|---|---|"]
    lines += [f"| {s.name} | {s.line().split(': ', 1)[1]} |" for s in splits]
    if meta:
        lines += ["", f"Train, out of fold (what the threshold was chosen on): committed precision "
                      f"{meta.get('oof_committed_precision')}, coverage {meta.get('oof_coverage')}, calibration "
                      f"error {meta.get('oof_calibration_error')}.", ""]
    lines += ["## Reliability: stated probability against observed accuracy", "",
              "The leading answer of every verdict that has one (committed or withheld), by stated probability.",
              "The train split's figures are in-sample for the report model (it was fitted on them); its out-of-fold",
              "line answers each case with the report model refitted without the case's fold; validation's are not",
              "in-sample.", ""]
    for s in splits:
        lines += reliability_md(s)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("splits", nargs="+")
    ap.add_argument("--show-failures", action="store_true")
    ap.add_argument("--write-doc", metavar="FILE")
    ap.add_argument("--out-of-fold", metavar="SPLIT", action="append", default=[],
                    help="also score SPLIT (the train split) out of fold: the report model refitted without each fold")
    args = ap.parse_args()
    splits = []
    for path, oof in [*((p, False) for p in args.splits), *((p, True) for p in args.out_of_fold)]:
        s = score(path, args.show_failures, out_of_fold=oof)
        print(s.line())
        splits.append(s)
    if args.write_doc:
        write_doc(args.write_doc, splits)
        print(f"reliability tables written to {args.write_doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
