"""The engine: run every registered rule over an ``EvidenceSet``, rank findings, name the primary.

A rule whose required evidence is missing is *skipped with the reason*, never a silent negative.
Findings are ranked by ``Finding.score`` (estimated impact weighted by severity and confidence);
informational findings (healthy explanations) always rank after real bottlenecks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from diagnose.model import GPU_ONLY_CATEGORIES, HOST_NO_GPU, Category, Evidence, EvidenceSet, Finding, Severity, Skipped
from diagnose.rules import report, report_model
from diagnose.rules.base import Rule, gpu_in_view
from diagnose.rules.registry import RULES
from diagnose.rules.report import claims_only
from diagnose.rules.verdict import covered_by


def rank(findings: Iterable[Finding], preferred: str = "") -> tuple[Finding, ...]:
    """Most important first: real bottlenecks by score, then informational notes. A finding read from
    structured evidence (a log's lines, a table, a profile, a measurement) ranks before one resting
    only on what the prose says, whatever their scores; among those, the one the report model chose
    (``preferred``) comes first."""
    return tuple(
        sorted(findings, key=lambda f: (f.severity is Severity.INFO, claims_only(f), f.code != preferred,
                                        -f.score, f.code))
    )


# a cause leads its symptom only when it weighs at least this much of the symptom's score: a cause
# whose own finding is barely there (its share at the bottom of its ramp) does not take the lead
CAUSE_MIN_SCORE = 0.5


def lead_with_causes(findings: tuple[Finding, ...]) -> tuple[Finding, ...]:
    """A symptom ranks right after the first of its causes that was found (``Rule.symptom_of``): when
    a queue is fed by saturated pre-processing, the pre-processing leads and the queue is named as
    its symptom, whichever of the two scores a little higher in this window (as long as the cause
    weighs ``CAUSE_MIN_SCORE`` of the symptom). Only moves a finding down, so informational notes and
    prose-only findings keep their places."""
    from diagnose.rules.registry import BY_CODE

    out = list(findings)
    for f in findings:
        rule = BY_CODE.get(f.code)
        causes = rule.symptom_of if rule is not None else ()
        found = [i for i, g in enumerate(out) if g.code in causes and g.severity is not Severity.INFO
                 and g.score >= CAUSE_MIN_SCORE * f.score]
        me = out.index(f)
        if found and me < min(found):
            first = min(found)
            out.pop(me)
            out.insert(first, f)
    return tuple(out)


OOM_CATEGORIES = frozenset({Category.OOM_WEIGHTS, Category.OOM_PEAK, Category.OOM_FRAGMENTATION,
                            Category.OOM_EXTERNAL})


# the corpus-fitted model must give a category this probability to decide between prose signals; chosen by
# scoring the whole pipeline out of fold on the train split (0.2: 71 %, 0.3: 68 %; fewer undetermined)
LEAN_MIN = 0.2
NONE_MIN = 0.6  # ... and this much to call a report a non-issue (a wrong "healthy" is the costlier mistake)


def arbitrate(evidence: EvidenceSet, findings: list[Finding]) -> tuple[list[Finding], str]:
    """When only prose speaks (no finding from structured evidence), let the corpus-fitted model
    (``diagnose.rules.report_model``) weigh the report's cues with the report rules' own signals and pick the
    category; its rule's finding leads (made from the wording alone if the rule had none)."""
    if any(not claims_only(f) and f.severity is not Severity.INFO for f in findings):
        return findings, ""
    if "report.retraction_statements" in evidence:
        return findings, ""  # the reporter withdrew it: nothing to weigh
    if covered_by(evidence):
        return findings, ""  # measurements cover the service and found nothing: that verdict stands
    explained = any(f.severity is Severity.INFO for f in findings)
    decided = report_model.decide(evidence, findings)
    if decided is None:
        return findings, ""
    cls, p, cues = decided
    if cls == report_model.NONE:
        # (a traceback's exception in the paste: something failed, whatever its words lean to)
        if p < NONE_MIN or any(f.severity is not Severity.INFO for f in findings) \
                or "report.exception_lines" in evidence:
            return findings, ""
        rule: report.ReportRule | report.ExpectedBehaviourReported = report.ExpectedBehaviourReported()
        if not any(f.code == rule.code for f in findings):
            findings = [*findings, rule.lean_finding(evidence, p, cues)]
        return findings, rule.code
    if p < LEAN_MIN or (explained and not any(f.severity is not Severity.INFO for f in findings)):
        return findings, ""  # an explanation of expected behaviour stands against a mere lean
    owner = next((r for r in report.RULES
                  if issubclass(r, report.ReportRule) and r.category is not None and r.category.value == cls), None)
    if owner is None:
        return findings, ""
    if not any(f.code == owner.code for f in findings):
        if any(evidence.has_prefix(k) if k.endswith(".") else k in evidence for k in owner.measured_by):
            return findings, ""  # a source measured this bottleneck and its rules found nothing
        findings = [*findings, owner().lean_finding(evidence, p, cues)]
    return findings, owner.code


def _without_gpu(evidence: EvidenceSet, findings: list[Finding],
                 skipped: list[Skipped]) -> tuple[list[Finding], list[Skipped]]:
    """No finding of a GPU-only category stands without a GPU in view (``gpu_in_view``): on a host without
    one (``HOST_NO_GPU``), or where nothing measured or named a GPU (an engine's metrics alone do not say
    which device decodes). Each such rule is listed as skipped with the reason."""
    if gpu_in_view(evidence):
        return findings, skipped
    got = evidence.get(HOST_NO_GPU)
    why = (f"the host has no GPU ({got.detail or HOST_NO_GPU})" if isinstance(got, Evidence)
           else "no GPU in the evidence (nothing measured or named one): the device is unknown")
    kept = []
    for f in findings:
        if f.category in GPU_ONLY_CATEGORIES:
            skipped.append(Skipped(f.code, why))
        else:
            kept.append(f)
    return kept, skipped


def run_rules(
    evidence: EvidenceSet,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    rules: Iterable[type[Rule]] = RULES,
    decide: bool = True,
    disabled: Collection[str] = (),
) -> tuple[tuple[Finding, ...], tuple[Skipped, ...]]:
    """Judge ``evidence`` with every rule; ``config`` maps a rule code to threshold overrides, and the
    codes in ``disabled`` are skipped (``diagnose.config``). ``decide``: with the full registry, let
    the report model arbitrate between prose findings."""
    config = config or {}
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    for rule_cls in rules:
        if rule_cls.code in disabled:
            skipped.append(Skipped(rule_cls.code, "disabled by the config"))
            continue
        why = rule_cls.missing_reason(evidence)
        if why is not None:
            skipped.append(Skipped(rule_cls.code, why))
            continue
        rule = rule_cls()
        rule.config = config
        result = rule.check(evidence, rule_cls.thresholds(config.get(rule_cls.code)))
        if result is not None:
            findings.append(result)
    findings, skipped = _without_gpu(evidence, findings, skipped)
    # what the prose says adds nothing where structured evidence already names the same bottleneck (for
    # an out-of-memory error: any of its causes; the allocator's numbers outrank the prose)
    same = {f.category for f in findings if not claims_only(f)}
    oom = any(f.category in OOM_CATEGORIES and f.severity is not Severity.INFO for f in findings
              if not claims_only(f))
    findings = [f for f in findings
                if not (claims_only(f) and (f.category in same or (oom and f.category in OOM_CATEGORIES)))]
    preferred = ""
    if decide and rules is RULES:
        findings, preferred = arbitrate(evidence, findings)
    return lead_with_causes(rank(findings, preferred)), tuple(skipped)

