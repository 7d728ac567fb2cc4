"""The engine: run every registered rule over an ``EvidenceSet``, rank findings, name the primary.

A rule whose required evidence is missing is *skipped with the reason*, never a silent negative.
Findings are ranked by ``Finding.score`` (estimated impact weighted by severity and confidence);
informational findings (healthy explanations) always rank after real bottlenecks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from analyzer.model import EvidenceSet, Finding, Severity, Skipped
from rules.base import Rule
from rules.registry import RULES
from rules.report import RULES as REPORT_RULES

REPORT_CODES = frozenset(r.code for r in REPORT_RULES)

def claims_only(f: Finding) -> bool:
    """A finding of the report rules (``rules/report.py``): it rests on what a report's prose says,
    not on anything parsed from a log, table, trace or measurement."""
    return f.code in REPORT_CODES


def rank(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Most important first: real bottlenecks by score, then informational notes. A finding read from
    structured evidence (a log's lines, a table, a profile, a measurement) ranks before one resting
    only on what the prose says, whatever their scores."""
    return tuple(
        sorted(findings, key=lambda f: (f.severity is Severity.INFO, claims_only(f), -f.score, f.code))
    )


def run_rules(
    evidence: EvidenceSet,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    rules: Iterable[type[Rule]] = RULES,
) -> tuple[tuple[Finding, ...], tuple[Skipped, ...]]:
    """Judge ``evidence`` with every rule; ``config`` maps a rule code to threshold overrides."""
    config = config or {}
    findings: list[Finding] = []
    skipped: list[Skipped] = []
    for rule_cls in rules:
        why = rule_cls.missing_reason(evidence)
        if why is not None:
            skipped.append(Skipped(rule_cls.code, why))
            continue
        rule = rule_cls()
        result = rule.check(evidence, rule_cls.thresholds(config.get(rule_cls.code)))
        if result is not None:
            findings.append(result)
    # what the prose says adds nothing where structured evidence already names the same bottleneck
    structured = {f.category for f in findings if not claims_only(f)}
    findings = [f for f in findings if not (claims_only(f) and f.category in structured)]
    return rank(findings), tuple(skipped)

