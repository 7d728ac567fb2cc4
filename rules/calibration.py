"""How far to trust a verdict: its calibrated probability, whether it is committed, and the differential.

The rules name a primary (or "healthy"); the report model (``diagnose.rules.report_model``) gives every
category a probability from a report's wording and the kinds of evidence it holds. Neither number is a
probability of being *right*. This module turns them into one, in two regimes:

* **excerpts** (what people paste: a log, an OOM message, a table, a report): a logistic regression over
  what the answer rests on — structured evidence and its confidence (measured, correlated, heuristic,
  thin), prose alone, an explanation of expected behaviour, how strongly the answering rule's finding
  speaks (its impact) — and the report model's probability for the answer. It is fitted on *out-of-fold*
  answers of the incident corpus's train split (the report model refitted without each fold), so the
  probability is what the tool earns on reports it has not seen;
* **covered** services (measurements that watched the service do its work: a live attach, per-request
  timings, an engine's scheduler statistics, a GPU timeline — ``diagnose.rules.verdict.covered_by``) with a
  structured or healthy answer: the share of such answers that were right on the real recordings kept as
  test data (the engine lab's vLLM and llama.cpp runs, the demo service's sessions), each with the
  pathology its recipe induced, Laplace-smoothed.

An answer that rests on a report's wording alone (``report.wording_only``: the report model's lean, no cause,
title, number or message behind it) is never committed, whatever its probability: words that lean are a
differential's order, not evidence to act on. Otherwise an excerpt's primary is *committed* only when its
probability clears ``threshold``: the lowest at which the
train split's out-of-fold committed answers are right at least 90 % of the time, with a standard error to
spare. A covered answer's probability is one rate for all of them, nothing is picked from a ranking: it
commits when that rate reaches the target itself (``Calibrator.commits``). Below either the verdict is
``undetermined`` and the candidates lead, each with what speaks for and against it and the check that
separates it from the next (``diagnose.rules.differential``). ``python -m diagnose.rules.calibration_fit``
refits ``calibration.json``; the validation split is never used for it.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagnose.model import Candidate, Category, EvidenceSet, Finding, Severity, Verdict
from diagnose.rules import differential, memory, report_model
from diagnose.rules.report import REPORT_CODES, claims_only, title_only, wording_only
from diagnose.rules.verdict import covered_by

HERE = os.path.dirname(os.path.realpath(__file__))
CALIBRATION_PATH = os.path.join(HERE, "calibration.json")
NONE = differential.NONE
CATEGORIES: tuple[str, ...] = (*(c.value for c in Category), NONE)
MAX_CANDIDATES = 3
MIN_SHOWN = 0.03  # a candidate below this probability is not worth a line
CLOSE = 0.15  # the terminal shows the differential when the top two are within this
WORDS_MIN_SHIFT = 0.1  # a report's bare words rank a differential only when they move a category this far
SIBLING_FLOOR = 0.1  # the weight of an answer's first known confusion that nothing else named


@dataclass(frozen=True)
class Assessment:
    """The answer (a category, ``none`` for healthy, or None), its probability, and whether it stands."""

    answer: str | None
    probability: float | None
    committed: bool
    regime: str  # excerpt | covered | none (nothing to assess)
    candidates: tuple[Candidate, ...]


def _logit(p: float) -> float:
    p = min(max(p, 1e-3), 1 - 1e-3)
    return math.log(p / (1 - p))


def lean(evidence: EvidenceSet, findings: Sequence[Finding], words: bool = False) -> dict[str, float] | None:
    """The report model's probability per category (``none`` included), or None without a report's cues.
    With ``words``, a report that names no counted concept is weighed by its words (``report.words``):
    enough to rank a differential, not to judge an answer by (the calibrator was fitted without them)."""
    m = report_model.model()
    if m is None or ("report.cues" not in evidence and not (words and "report.words" in evidence)):
        return None
    said = [f for f in findings if f.code in REPORT_CODES]
    got = m.predict(report_model.inputs(evidence, said, words))
    if "report.cues" not in evidence:  # bare words: worth a differential only where they move the model
        without = m.predict(report_model.inputs(evidence, said))
        if max(abs(got[c] - without.get(c, 0.0)) for c in got) < WORDS_MIN_SHIFT:
            return None
    return got


def answer_of(findings: Sequence[Finding], verdict: Verdict) -> tuple[str | None, Finding | None]:
    """What the verdict answers: the primary's category and its finding, ``none`` when healthy, else None."""
    if verdict is Verdict.HEALTHY:
        return NONE, None
    if verdict is Verdict.BOTTLENECK:
        top = next((f for f in findings if f.severity is not Severity.INFO), None)
        if top is not None and top.category is not None:
            return top.category.value, top
    return None, None


def may_not_commit(top: Finding | None, findings: Sequence[Finding] = ()) -> bool:
    """Whether an answer stays withheld whatever its probability: one resting on the report's wording alone (a
    bottleneck's finding; for "healthy", with no finding of its own, every finding there is)."""
    if top is not None:
        return wording_only(top)
    return bool(findings) and all(wording_only(f) for f in findings)


def features(answer: str, top: Finding | None, findings: Sequence[Finding],
             leaning: Mapping[str, float] | None) -> dict[str, float]:
    """What an answer rests on, as the calibrator's inputs (names match ``calibration.json``)."""
    prose = top is not None and claims_only(top)
    struct = top is not None and not prose
    healthy = top is None
    known = leaning is not None
    lp = _logit(leaning.get(answer, 0.0)) if leaning is not None else 0.0
    agrees = leaning is not None and max(leaning, key=leaning.__getitem__) == answer
    rivals = {f.category.value for f in findings
              if f.severity is not Severity.INFO and f.category is not None and not claims_only(f)} - {answer}
    conf = top.confidence.value if struct and top is not None else ""
    x = {"bias": 1.0, "prose": prose, "healthy": healthy,
         "struct_measured": conf == "measured", "struct_correlated": conf == "correlated",
         "struct_heuristic": conf == "heuristic", "struct_thin": conf == "thin",
         # whether the report model spoke at all weighs only an answer that rests on prose or on nothing: a
         # structured answer's support is its own, and the model's view may add to it, never take from it
         "lean_known": known and not struct, "prose_logit": prose * lp,
         # measured and structured evidence outranks prose: the report's wording may add to a structured
         # answer's support, never take from it (an engine's own warnings read as prose must not sink it)
         "struct_logit": struct * max(0.0, lp), "healthy_logit": healthy * lp,
         "agrees": agrees, "rival": bool(rivals),
         # how strongly the answering rule's own evidence speaks (its finding's impact, 0..1)
         "impact": top.impact if top is not None else 0.0,
         # the report model's lean alone: never committed (``may_not_commit``), its probability still ranks it
         "wording_only": may_not_commit(top, findings),
         # the title alone names the answer: what a thread is about, not always its cause
         "title_only": top is not None and title_only(top)}
    # how reliably each category is read differs (an allocator's numbers against a reporter's "it is slow"):
    # one indicator per answer, its weight learned with the rest
    x.update({f"cat:{c}": c == answer for c in CATEGORIES})
    return {k: float(v) for k, v in x.items()}


@dataclass(frozen=True)
class Calibrator:
    weights: Mapping[str, float]
    threshold: float
    covered_p: float
    meta: Mapping[str, Any]

    def commits(self, regime: str, p: float) -> bool:
        """Whether an answer of ``regime`` at probability ``p`` is committed. An excerpt's threshold keeps a
        standard error to spare because it was picked from many along a ranking, which flatters the one
        picked; the covered regime's rate is one estimate for every covered answer, and committing them all
        is right at that rate: it commits at the target (``meta.target_precision``)."""
        if regime == "covered":
            return p >= float(self.meta.get("target_precision", self.threshold))
        return p >= self.threshold

    def excerpt(self, x: Mapping[str, float]) -> float:
        z = sum(self.weights.get(k, 0.0) * v for k, v in x.items())
        return 1.0 / (1.0 + math.exp(-z))


_CAL: Calibrator | None = None


def calibrator() -> Calibrator | None:
    """The fitted calibrator (``calibration.json``), or None when none was shipped."""
    global _CAL
    if _CAL is None and os.path.exists(CALIBRATION_PATH):
        with open(CALIBRATION_PATH, encoding="utf-8") as fh:
            doc = json.load(fh)
        _CAL = Calibrator(doc["weights"], float(doc["threshold"]), float(doc["covered"]["p"]), doc.get("meta", {}))
    return _CAL


def covered_answer(evidence: EvidenceSet, top: Finding | None) -> bool:
    """The covered regime: measurements watched the service, and the answer rests on them (a structured
    finding, or healthy), not on prose."""
    return bool(covered_by(evidence)) and (top is None or not claims_only(top))


def assess(evidence: EvidenceSet, findings: Sequence[Finding], verdict: Verdict) -> Assessment:
    """The calibrated probability of the verdict's answer, whether it is committed, and the differential."""
    cal = calibrator()
    leaning = lean(evidence, findings)
    answer, top = answer_of(findings, verdict)
    if answer is None or cal is None:
        p, committed, regime = None, answer is not None and not may_not_commit(top, findings), "none"
    elif covered_answer(evidence, top):
        p, committed, regime = cal.covered_p, cal.commits("covered", cal.covered_p), "covered"
    else:
        p = cal.excerpt(features(answer, top, findings, leaning))
        committed, regime = cal.commits("excerpt", p) and not may_not_commit(top, findings), "excerpt"
    ranking = leaning if leaning is not None else lean(evidence, findings, words=True)
    return Assessment(answer, None if p is None else round(p, 3), committed, regime,
                      candidates(evidence, findings, answer, p, ranking))


def _others(findings: Sequence[Finding], answer: str | None, leaning: Mapping[str, float] | None,
            numbers: Mapping[str, tuple[bool, str]] | None = None) -> list[tuple[str, float]]:
    """Every candidate but the answer, in the order an expert weighs them, with a weight: the categories of
    other findings (the report model's probability where it spoke, else the finding's score), then what the
    report model gives the rest. Without a report model's view (no report's cues, and no words that move it),
    the answer's known confusions (``differential.SIBLINGS``) stand in for it. Where the model speaks it has
    learned those confusions with the case's own cues: the fixed list forced in ahead of it put the truth among
    the top three less often (train, out of fold: 420 of 489 cases against 428).

    An out-of-memory answer's own family comes first (an OOM is an OOM: which of its four causes is the
    question, not whether requests queue): another cause a finding names, then another finding's category and
    the causes only the report's words weigh, by weight, then the rest. A finding of another category (the
    report's "one at a time") ahead of every other cause kept another process's memory out of a vLLM
    profiling OOM's differential (train, out of fold: the truth in the top three 440 of 489 against 439).
    Within them, the causes the allocator's numbers speak for (``numbers``: ``memory.oom_numbers``) come first,
    and those they rule out last: measured memory outranks the report's words."""
    found: dict[str, float] = {}
    for f in findings:
        if f.severity is Severity.INFO or f.category is None or f.category.value == answer:
            continue
        c = f.category.value
        w = leaning.get(c, 0.0) if leaning is not None else f.score
        found[c] = max(found.get(c, 0.0), w, 0.05 if not claims_only(f) else 0.0)
    ranked = sorted(found.items(), key=lambda kv: -kv[1])
    oom = answer in _OOM or (answer is None and bool(numbers))
    if leaning is None:
        for i, c in enumerate(differential.SIBLINGS.get(answer or "", ())):
            if c not in found:
                ranked.append((c, SIBLING_FLOOR / (i + 1)))
    else:
        rest = [(c, w) for c, w in leaning.items()
                if c != answer and c not in found and (w >= MIN_SHOWN or (oom and c in _OOM))]
        ranked += sorted(rest, key=lambda kv: -kv[1])
    if oom:
        # which of its four causes is the question: another cause a finding names first, then another finding's
        # category and the causes only the report's words weigh, by weight, then the rest of what they weigh
        said = numbers or {}

        def tier(kv: tuple[str, float]) -> tuple[int, int, float]:
            named, family = kv[0] in found, kv[0] in _OOM
            verdict = said.get(kv[0], (None, ""))[0]
            if named and family:
                return 0, 0, -kv[1]
            if verdict is False:
                return 3, 0, -kv[1]
            return (1 if named or family else 2), (0 if verdict else 1), -kv[1]
        return sorted(ranked, key=tier)
    return ranked


_OOM = frozenset(c.value for c in (Category.OOM_WEIGHTS, Category.OOM_PEAK, Category.OOM_FRAGMENTATION,
                                   Category.OOM_EXTERNAL))


def candidates(evidence: EvidenceSet, findings: Sequence[Finding], answer: str | None, p: float | None,
               leaning: Mapping[str, float] | None) -> tuple[Candidate, ...]:
    """At most ``MAX_CANDIDATES``, best first: the answer with its probability, the others (``_others``)
    sharing the rest in proportion to their weights, ranked by probability. A withheld answer that another
    candidate outweighs is not first (train, out of fold: 23 of 489 such differentials, the answer right in 4,
    the one ranked above it in 8), but only a candidate with something for it (a finding, the report's words)
    can pass it: a known confusion that nothing named is a check to run, not a likelier cause than a measured
    finding, and its share is capped at the answer's."""
    numbers = memory.oom_numbers(evidence) if answer in _OOM or answer is None else None
    others = _others(findings, answer, leaning, numbers)[: MAX_CANDIDATES - (answer is not None)]
    total = sum(w for _, w in others)
    ranked: list[tuple[str, float]] = []
    if answer is not None:
        top = p if p is not None else 1.0
        ranked.append((answer, top))
        ranked += [(c, (1.0 - top) * w / total) for c, w in others if total > 0]
    elif total > 0:  # nothing answered: the report model's own probabilities, else the findings' shares
        ranked += [(c, w if leaning is not None else w / total) for c, w in others]
    argued = [(c, q, *_for_against(evidence, findings, c, leaning, numbers)) for c, q in ranked]
    if answer is not None:
        argued = [(c, q if i == 0 or pro else min(q, argued[0][1]), pro, con)
                  for i, (c, q, pro, con) in enumerate(argued)]
    # stable: the answer leads a tie, and a candidate with nothing for it follows the answer it ties
    order = sorted(range(len(argued)), key=lambda i: (-argued[i][1], i > 0 and not argued[i][2]))
    argued = [argued[i] for i in order]
    shown = _rounded([q for _, q, _, _ in argued], keep=order.index(0) if answer is not None else None)
    out = []
    for i, (c, _, pro, con) in enumerate(argued):
        nxt = argued[i + 1][0] if i + 1 < len(argued) else (argued[i - 1][0] if i > 0 else None)
        out.append(Candidate(c, shown[i], pro, con, differential.check(c, nxt)))
    return tuple(out)


def _rounded(qs: Sequence[float], keep: int | None) -> list[float]:
    """``qs`` (best first, summing to at most one) to three decimals, still summing to at most one and still best
    first: what rounding up added is taken back from the smallest that can give it, never from ``keep`` (the
    answer, whose probability is the verdict's) and never below the next one's."""
    qs = list(qs)
    if sum(qs) > 1.0:  # the findings' floor can lift what the report model gave past one: shares of it then
        fixed = qs[keep] if keep is not None else 0.0
        rest = sum(qs) - fixed
        qs = [q if i == keep else q * max(0.0, 1.0 - fixed) / rest for i, q in enumerate(qs)]
    shown = [round(q, 3) for q in qs]
    excess = round(sum(shown) - 1.0, 3)
    for i in reversed(range(len(shown))):
        if excess <= 0:
            break
        if i == keep:
            continue
        take = min(excess, round(shown[i] - (shown[i + 1] if i + 1 < len(shown) else 0.0), 3))
        shown[i], excess = round(shown[i] - take, 3), round(excess - take, 3)
    return shown


def _for_against(evidence: EvidenceSet, findings: Sequence[Finding], category: str,
                 leaning: Mapping[str, float] | None,
                 numbers: Mapping[str, tuple[bool, str]] | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What speaks for a candidate (its findings, the report's cues) and against it (only prose says it;
    a source measured it and found nothing; a bottleneck was found, against "nothing is wrong")."""
    mine = [f for f in findings if (f.category.value if f.category else NONE) == category
            or (category == NONE and f.severity is Severity.INFO)]
    pro = [f"{f.code}: {f.title}" for f in mine[:2]]
    if leaning is not None and leaning.get(category, 0.0) >= MIN_SHOWN:
        m = report_model.model()
        cues = m.why(report_model.features(evidence, words=True), category, 3) if m is not None else []
        words = ", ".join(c.split(":", 1)[-1] for c in cues if not c.startswith("s:"))
        pro.append(f"the report's wording leans to it ({leaning[category]:.0%})" + (f": {words}" if words else ""))
    con: list[str] = []
    real = [f for f in mine if f.severity is not Severity.INFO]
    if real and all(claims_only(f) for f in real) and category != NONE:
        con.append("only the report's wording says so: nothing parsed from a log, table or measurement")
    if not mine and category != NONE:
        con.append("no rule found it in the parsed evidence")
    if category == NONE:
        bad = [f for f in findings if f.severity is not Severity.INFO]
        if bad:
            con.append(f"{bad[0].code}: {bad[0].title}")
    elif category in _measured_nothing(evidence, findings):
        con.append("a source that measures it was read and its rules found nothing")
    if numbers is None and category in _OOM:
        numbers = memory.oom_numbers(evidence)
    said = (numbers or {}).get(category) if category in _OOM else None
    if said is not None:  # what the allocator's numbers say of it
        (pro if said[0] else con).append(said[1])
    return tuple(pro), tuple(con)


def _measured_nothing(evidence: EvidenceSet, findings: Sequence[Finding]) -> set[str]:
    from diagnose.rules.report import RULES, ReportRule

    found = {f.category.value for f in findings if f.category is not None}
    out = set()
    for r in RULES:
        if (issubclass(r, ReportRule) and r.category is not None and r.category.value not in found
                and any(evidence.has_prefix(k) if k.endswith(".") else k in evidence for k in r.measured_by)):
            out.add(r.category.value)
    return out


def settle(evidence: EvidenceSet, findings: Sequence[Finding], verdict: Verdict,
           steps: Sequence[str]) -> tuple[Verdict, tuple[str, ...], Assessment, bool]:
    """The rules' verdict calibrated: (verdict, next steps, the assessment, withheld). An answer below the
    threshold is withheld: the verdict is undetermined and the candidates' checks lead the next steps."""
    judged = assess(evidence, findings, verdict)
    if judged.answer is not None and not judged.committed:
        return Verdict.UNDETERMINED, next_steps(judged, steps), judged, True
    return verdict, tuple(steps), judged, False


def next_steps(judged: Assessment, steps: Sequence[str]) -> tuple[str, ...]:
    """An answer that was withheld: the checks that separate its candidates, then the verdict's own steps."""
    cands = judged.candidates
    checks: dict[str, str] = {}  # check → the step that states it (a pair's check once)
    for i, c in enumerate(cands[:MAX_CANDIDATES]):
        if not c.check or c.check in checks:
            continue
        nxt = cands[i + 1].category if i + 1 < len(cands) else None
        paired = nxt is not None and differential.PAIRS.get(frozenset({c.category, nxt})) == c.check
        checks[c.check] = (f"To tell {c.category} from {nxt}: {c.check}" if paired
                           else f"To confirm {c.category}: {c.check}")
    return tuple(dict.fromkeys([*checks.values(), *steps]))


def close(cands: Sequence[Candidate]) -> bool:
    """The top two are close enough that the terminal shows the differential even when committed."""
    return len(cands) >= 2 and cands[0].probability - cands[1].probability < CLOSE

