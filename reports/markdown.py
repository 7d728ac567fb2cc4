"""The Markdown report: a verdict an on-call engineer pastes into a ticket.

Layout: the verdict line first (primary category, the primary finding's first sentence, its
impact), then every finding (code, title, severity / confidence / impact, message, the key
evidence numbers, the fixes with their steps and risk), the request stage table, what was not
captured or not read and why, the rules that could not judge (grouped by reason) and the
environment.

Deterministic: the same diagnosis always gives the same bytes (no current time, no temporary
paths: evidence sources are shown by file name), so the output can be snapshot-tested.
Everything that comes from the session is escaped for Markdown (``<``/``>`` so that names such as
``tokenize.<locals>`` survive rendering, ``|`` inside tables, newlines inside table cells); the
command line is redacted again, in case the session was not written by ``diagnose attach``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from diagnose.model import Diagnosis, Evidence, Finding, Severity, Verdict
from diagnose.redact import redact_argv
from diagnose.reports.wording import (
    config_line,
    differential_rows,
    healthy_text,
    probability_text,
    undetermined_text,
    watch_lines,
)
from diagnose.stage_stats import stage_rows
from diagnose.units import pct, size

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


def first_sentence(text: str) -> str:
    """The first sentence of a rule's message (messages are written as short sentences)."""
    text = " ".join(text.split())
    return _SENTENCE_END.split(text, maxsplit=1)[0] if text else ""


def format_number(value: float) -> str:
    """A number at a sensible precision: 2,825.7 · 31.2 · 0.412 · 1.2e-05."""
    if math.isnan(value) or math.isinf(value):
        return "-"
    mag = abs(value)
    if mag >= 100:
        return f"{value:,.1f}".removesuffix(".0") if mag < 1e6 else f"{value:,.0f}"
    if mag >= 1 or mag == 0:
        return f"{value:,.2f}".rstrip("0").rstrip(".")
    if mag >= 1e-3:
        return f"{value:.3g}"
    return f"{value:.2g}"


def format_value(value: Any, unit: str) -> str:
    """An evidence value with its unit, for people (ratios as %, bytes as GiB/MiB)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int | float):
        if math.isnan(value) or math.isinf(value):
            return "-"
        if unit == "ratio":
            return f"{format_number(100 * float(value))} %"
        if unit == "bytes":
            return size(float(value))
        return f"{format_number(float(value))} {unit}".strip()
    if isinstance(value, list | tuple):
        return f"{len(value)} rows (in the JSON report)"
    if isinstance(value, dict):
        return f"{len(value)} fields (in the JSON report)"
    if value is None:
        return "-"
    return f"{value} {unit}".strip()


def source_name(source: str) -> str:
    """Where a value came from, without the folder (which differs between machines and unpacks)."""
    return source.replace("\\", "/").rsplit("/", 1)[-1] if "/" in source or "\\" in source else source


_EMPHASIS = re.compile(r"[\\<>*]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1")


def text(s: str) -> str:
    """Prose from a rule or the session, escaped so that it renders as written.

    Outside code spans ``\\``, ``<``/``>`` (``tokenize.<locals>`` is not an HTML tag), ``*`` and
    word-edge ``_`` (``__call__`` is not bold) are escaped; code spans are kept as they are: rule
    messages use backticks for code on purpose, and escapes inside a span would show literally.
    """
    out: list[str] = []
    pos = 0
    for m in _CODE_SPAN.finditer(s):
        out.append(_EMPHASIS.sub(lambda e: "\\" + e.group(0), s[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_EMPHASIS.sub(lambda e: "\\" + e.group(0), s[pos:]))
    return "".join(out)


def cell(s: str) -> str:
    """A table cell: one line, ``|`` escaped."""
    return " ".join(text(s).split()).replace("|", "\\|")


def code(s: str) -> str:
    """An inline code span that holds any text (the fence is longer than any backtick run inside)."""
    s = " ".join(s.split())
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def code_cell(s: str) -> str:
    return code(s).replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[str]], align: Sequence[str] | None = None) -> list[str]:
    """A pipe table; cells must already be escaped (``cell``/``code_cell``)."""
    align = align or ["l"] * len(header)
    marks = {"l": "---", "r": "---:", "c": ":---:"}
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(marks[a] for a in align) + "|"]
    out.extend("| " + " | ".join(r) + " |" for r in rows)
    return out


def _fence(body: str) -> list[str]:
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", *body.splitlines(), fence]


def primary_finding(diagnosis: Diagnosis) -> Finding | None:
    """The finding the verdict names (``Diagnosis.primary`` is its category)."""
    return next((f for f in diagnosis.findings if f.severity is not Severity.INFO), None)


def verdict_title(diagnosis: Diagnosis) -> str:
    """``queueing``, ``healthy`` or ``undetermined``: what a report's title names."""
    primary = diagnosis.primary
    return primary.value if primary is not None else diagnosis.overall.value


def verdict_line(diagnosis: Diagnosis) -> str:
    primary = diagnosis.primary
    f = primary_finding(diagnosis)
    if primary is None or f is None:
        if diagnosis.overall is Verdict.HEALTHY:
            return f"**Verdict: healthy**{probability_text(diagnosis)} — {text(healthy_text(diagnosis))}"
        return f"**Verdict: undetermined** — {text(undetermined_text(diagnosis))}"
    return (f"**Verdict: the bottleneck is `{primary.value}`**{probability_text(diagnosis)} — "
            f"{text(first_sentence(f.message))} "
            f"(impact {pct(f.impact)}, {f.severity.value}, confidence {f.confidence.value}; {f.code})")


def _evidence_rows(evidence: Sequence[Evidence]) -> list[list[str]]:
    rows = []
    for e in evidence:
        if isinstance(e.value, list | dict):
            continue
        value = format_value(e.value, e.unit)
        if e.quality.value != "good":
            value += f" ({e.quality.value})"
        rows.append([code_cell(e.key), cell(value), cell(source_name(e.source))])
    return rows


def _finding(n: int, f: Finding, primary: bool) -> list[str]:
    tag = " (primary)" if primary else ""
    out = [f"### {n}. {f.code} {text(f.name)} — {text(f.title)}{tag}", ""]
    out += [f"**{f.severity.value}** · confidence **{f.confidence.value}** · impact **{pct(f.impact)}** · "
            f"category `{f.label}`", ""]
    out += [text(" ".join(f.message.split())), ""]
    if f.why:
        out += [*_fence(f.why), ""]
    rows = _evidence_rows(f.evidence)
    if rows:
        out += ["Evidence:", "", *table(["key", "value", "source"], rows, ["l", "r", "l"]), ""]
    if f.fixes:
        out += ["Fixes:", ""]
        for i, fix in enumerate(f.fixes, 1):
            out.append(f"{i}. **{text(fix.summary)}** (risk: {fix.risk.value.replace('_', ' ')})")
            out.extend(f"   - {text(' '.join(step.split()))}" for step in fix.steps)
        out.append("")
    return out


def _stages(diagnosis: Diagnosis) -> list[str]:
    rows = stage_rows(diagnosis)
    if not rows:
        return []

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    body = [[cell(s), ms(p50), ms(p99), "-" if share is None else pct(share)] for s, p50, p99, share in rows]
    return ["## Request stages", "", *table(["stage", "p50 (ms)", "p99 (ms)", "share of latency"], body,
                                             ["l", "r", "r", "r"]), ""]


def utc_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def environment(diagnosis: Diagnosis) -> list[tuple[str, str, bool]]:
    """(label, plain value, shown as code) rows of the environment, shared by the Markdown and HTML reports."""
    rows: list[tuple[str, str, bool]] = []
    t = diagnosis.target
    if t is not None:
        rows.append(("target pid", str(t.pid), False))
        if t.children:
            rows.append(("child pids", ", ".join(str(c) for c in t.children), False))
        if t.cmdline:
            rows.append(("command line (redacted)", " ".join(redact_argv(t.cmdline)), True))
        if t.python:
            rows.append(("python", t.python, True))
        if t.user:
            rows.append(("user", t.user, False))
        rows.append(("GPUs", ", ".join(t.gpus) if t.gpus else "none recorded", False))
    w = diagnosis.window
    if w is not None:
        rows.append(("window", f"{utc_time(w.start)} → {utc_time(w.end)} ({w.seconds:.1f} s)", False))
    rows.append(("tool version", f"diagnose {diagnosis.tool_version}", False))
    if diagnosis.config:
        rows.append(("rule settings", config_line(diagnosis.config), True))
    return rows


def _environment(diagnosis: Diagnosis) -> list[str]:
    rows = [[label, code_cell(value) if as_code else cell(value)] for label, value, as_code in environment(diagnosis)]
    return ["## Environment", "", *table(["", ""], rows), ""]


def render(diagnosis: Diagnosis) -> str:
    """The whole report as Markdown text (ends with one newline)."""
    out = [f"# Diagnosis: `{verdict_title(diagnosis)}`", "", verdict_line(diagnosis), ""]
    if diagnosis.next_steps:
        out += ["## Next steps", "", *[f"{n}. {text(step)}" for n, step in enumerate(diagnosis.next_steps, 1)], ""]
    if diagnosis.candidates:
        out += ["## Differential", "", *table(["candidate", "probability", "for", "against", "check that separates it"],
                                              [[cell(v) for v in row] for row in differential_rows(diagnosis)]), ""]

    watched = watch_lines(diagnosis)
    if watched:
        out += ["## Before the trigger (diagnose watch)", "", *[f"- {text(line)}" for line in watched], ""]

    out += ["## Findings", ""]
    if not diagnosis.findings:
        out += ["No rule found a problem in the evidence given.", ""]
    lead = primary_finding(diagnosis)
    for n, f in enumerate(diagnosis.findings, 1):
        out += _finding(n, f, f is lead)

    out += _stages(diagnosis)

    partial = [c for c in diagnosis.captures if c.status.value != "ok"]
    if partial:
        body = [[cell(c.collector), c.status.value, cell(c.reason or "-"), cell(c.remedy or "-")] for c in partial]
        out += ["## Captures not complete", "", *table(["collector", "status", "reason", "remedy"], body), ""]

    bad = [i for i in diagnosis.inputs if i.status != "ok"]
    if bad:
        body = [[cell(source_name(i.path)), cell(i.kind), cell(i.status), cell(i.reason or "-")] for i in bad]
        out += ["## Inputs not fully read", "", *table(["input", "kind", "status", "reason"], body), ""]

    if diagnosis.skipped:
        by_reason: dict[str, list[str]] = {}
        for s in diagnosis.skipped:
            by_reason.setdefault(s.reason, []).append(s.code)
        out += [f"## Rules skipped ({len(diagnosis.skipped)}, not enough evidence)", ""]
        out += [f"- {', '.join(codes)}: {text(' '.join(reason.split()))}" for reason, codes in by_reason.items()]
        out.append("")

    out += _environment(diagnosis)
    return "\n".join(out).rstrip("\n") + "\n"
