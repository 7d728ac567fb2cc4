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


def rank(findings: Iterable[Finding]) -> tuple[Finding, ...]:
    """Most important first: real bottlenecks by score, then informational notes."""
    return tuple(
        sorted(findings, key=lambda f: (f.severity is Severity.INFO, -f.score, f.code))
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
    return rank(findings), tuple(skipped)

