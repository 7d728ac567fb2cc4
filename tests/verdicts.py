"""What the rules answered, before the calibrated probability decided whether the verdict commits.

A diagnosis whose leading answer did not clear the precision threshold is ``undetermined`` with the
answer among its candidates (``withheld``; a candidate the evidence speaks for may outrank it). Tests of a
rule's reading assert what the rules answered (``rules_verdict``, ``rules_primary``) and, separately, that
committing follows the probability (``committed_as_calibrated``).
"""

from __future__ import annotations

from diagnose.model import Diagnosis, EvidenceSet, Verdict
from diagnose.rules import calibration


def rules_primary(d: Diagnosis) -> str | None:
    """The first finding's category, committed or withheld."""
    lead = d.leading
    return lead.value if lead is not None else None


def rules_verdict(d: Diagnosis) -> str:
    """bottleneck / healthy / undetermined as the rules decided, before the calibration withheld any."""
    if not d.withheld:
        return d.overall.value
    return "bottleneck" if d.leading is not None else "healthy"


def committed_as_calibrated(d: Diagnosis) -> bool:
    """A verdict commits exactly when its probability clears the calibrator's bar for its regime: the
    threshold for an excerpt, the target precision for an answer resting on measurements that covered the
    service; an answer on the report's wording alone never commits (``calibration.may_not_commit``)."""
    cal = calibration.calibrator()
    if cal is None or d.probability is None:
        return not d.withheld
    _, top = calibration.answer_of(d.findings, Verdict(rules_verdict(d)))
    regime = "covered" if calibration.covered_answer(EvidenceSet(d.evidence), top) else "excerpt"
    commits = cal.commits(regime, d.probability) and not (
        regime == "excerpt" and calibration.may_not_commit(top, d.findings))
    return d.withheld == (not commits)
