"""The terminal report (rich): the verdict first, then the other findings, then what was skipped."""

from __future__ import annotations

from typing import IO

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from diagnose.model import Diagnosis, Evidence, Finding, Severity, Verdict
from diagnose.reports.wording import (
    UNDETERMINED_TEXT,
    config_line,
    healthy_text,
    probability_text,
    undetermined_text,
    watch_lines,
)
from diagnose.rules.calibration import close
from diagnose.stage_stats import stage_rows
from diagnose.units import pct, size

_SEV_STYLE = {Severity.CRITICAL: "bold red", Severity.MAJOR: "red", Severity.MINOR: "yellow",
              Severity.INFO: "cyan"}


def _fmt_value(ev: Evidence) -> str:
    v = ev.value
    if isinstance(v, float):
        if ev.unit == "ratio":
            return pct(v, 1)
        return (f"{v:,.0f} {ev.unit}" if abs(v) >= 1000 else f"{v:,.3g} {ev.unit}").strip()
    if isinstance(v, int) and not isinstance(v, bool):
        if ev.unit == "bytes":
            return size(v)
        return f"{v:,} {ev.unit}".strip()
    if isinstance(v, list):
        return f"[{len(v)} rows]"
    return f"{v} {ev.unit}".strip()


def _finding_block(f: Finding, primary: bool) -> Panel:
    body = Text()
    body.append(f.message + "\n")
    if f.why:
        body.append("\n" + f.why + "\n", style="dim")
    scalar = [e for e in f.evidence if not isinstance(e.value, list | dict)]
    if scalar:
        body.append("\nEvidence\n", style="bold")
        for e in scalar:
            body.append(f"  {e.key} = {_fmt_value(e)}  ", style="")
            body.append(f"({e.source})\n", style="dim")
    if f.fixes:
        body.append("\nFix\n", style="bold")
        for fix in f.fixes:
            body.append(f"  • {fix.summary}", style="green")
            body.append(f"  [{fix.risk.value}]\n", style="dim")
            for step in fix.steps:
                body.append(f"      - {step}\n")
    head = f"{'PRIMARY: ' if primary else ''}{f.label} — {f.title}"
    sub = f"{f.code} {f.name} · {f.severity.value} · confidence {f.confidence.value} · impact {pct(f.impact)}"
    return Panel(body, title=head, subtitle=sub, border_style=_SEV_STYLE[f.severity], title_align="left")


def _stage_table(diagnosis: Diagnosis, console: Console) -> None:
    rows = stage_rows(diagnosis)
    if not rows:
        return
    table = Table(title="Request stages (ms)", title_justify="left")
    for col in ("stage", "p50", "p99", "share of latency"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    top = rows[0][0] if rows[0][3] else None
    for stage, p50, p99, share in rows:
        label = f"{stage}  ← largest share" if stage == top else stage
        table.add_row(label, "-" if p50 is None else f"{p50:,.1f}", "-" if p99 is None else f"{p99:,.1f}",
                      "-" if share is None else pct(share))
    console.print(table)


def _differential(diagnosis: Diagnosis, console: Console) -> None:
    """The candidates, best first: probability, what speaks for and against each, and the check that
    separates it from the next. Shown when the verdict is undetermined or the top two are close."""
    cands = diagnosis.candidates
    if not cands or (diagnosis.overall is not Verdict.UNDETERMINED and not close(cands)):
        return
    table = Table(title="Differential, most likely first", title_justify="left", show_lines=True)
    for col in ("candidate", "p", "for", "against", "check that separates it"):
        table.add_column(col, justify="right" if col == "p" else "left", overflow="fold")
    for c in cands:
        table.add_row(c.category, pct(c.probability), "\n".join(c.support) or "-", "\n".join(c.against) or "-",
                      c.check)
    console.print(table)


def _verdict(diagnosis: Diagnosis, console: Console) -> None:
    """The verdict line, and with it the first fix or the next steps: what the reader acts on."""
    if diagnosis.config:
        console.print("[dim]Rule settings:[/dim] " + escape(config_line(diagnosis.config)))
    verdict = diagnosis.overall
    primary = diagnosis.primary
    if verdict is Verdict.BOTTLENECK and primary is not None:
        console.print(f"[bold]Verdict:[/bold] the bottleneck is [bold red]{primary.value}[/bold red]"
                      + escape(probability_text(diagnosis)))
        lead = next((f for f in diagnosis.findings if f.severity is not Severity.INFO), None)
        if lead is not None and lead.fixes:
            console.print(f"[bold]Fix first:[/bold] {escape(lead.fixes[0].summary)} ({lead.code})")
        if diagnosis.next_steps:  # the verdict rests on the report's words: how to measure it
            console.print("[bold]To confirm it, measure:[/bold] " + escape(diagnosis.next_steps[0]))
        return
    if verdict is Verdict.HEALTHY:
        console.print(Panel(Text("healthy: " + healthy_text(diagnosis) + probability_text(diagnosis)),
                            title="Verdict", border_style="green", title_align="left"))
        return
    why = undetermined_text(diagnosis)  # the terminal's next steps follow at once: the short form of the plain case
    body = Text("undetermined: " + (why if why != UNDETERMINED_TEXT
                                    else "the evidence given is too thin to name a bottleneck.") + "\n")
    if diagnosis.next_steps:
        body.append("\nNext steps, most useful first\n", style="bold")
        for i, step in enumerate(diagnosis.next_steps, 1):
            body.append(f"  {i}. {step}\n")
    console.print(Panel(body, title="Verdict", border_style="yellow", title_align="left"))


def render(diagnosis: Diagnosis, file: IO[str] | None = None, width: int | None = None,
           verbose: bool = False) -> None:
    console = Console(file=file, width=width, highlight=False, soft_wrap=False)
    target = diagnosis.target
    if target:
        window = f", {diagnosis.window.seconds:.1f} s window" if diagnosis.window else ""
        cmd = " ".join(target.cmdline)
        cmd = cmd if len(cmd) <= 100 else cmd[:99] + "…"
        console.print(f"[bold]diagnose[/bold] pid {target.pid} ({escape(cmd)}){window}")
    _verdict(diagnosis, console)
    _differential(diagnosis, console)
    for line in watch_lines(diagnosis):
        console.print(escape(line))
    primary = diagnosis.primary
    first = True
    for f in diagnosis.findings:
        console.print(_finding_block(f, primary is not None and first and f.severity is not Severity.INFO))
        first = False
    _stage_table(diagnosis, console)
    partial = [c for c in diagnosis.captures if c.status.value != "ok"]
    if partial:
        table = Table(title="Captures not complete", title_justify="left", show_lines=False)
        table.add_column("collector")
        table.add_column("status")
        table.add_column("reason")
        table.add_column("remedy")
        for c in partial:
            table.add_row(c.collector, c.status.value, c.reason, c.remedy)
        console.print(table)
    bad_inputs = [i for i in diagnosis.inputs if i.status != "ok"]
    if bad_inputs:
        table = Table(title="Inputs", title_justify="left")
        table.add_column("input")
        table.add_column("status")
        table.add_column("reason")
        for i in bad_inputs:
            table.add_row(i.path, i.status, i.reason)
        console.print(table)
    if diagnosis.skipped and not verbose:
        console.print(f"[dim]{len(diagnosis.skipped)} rules could not judge: --verbose lists them[/dim]")
    elif diagnosis.skipped:
        by_reason: dict[str, list[str]] = {}
        for s in diagnosis.skipped:
            by_reason.setdefault(s.reason, []).append(s.code)
        table = Table(title="Rules skipped (not enough evidence)", title_justify="left")
        table.add_column("rules")
        table.add_column("why")
        for reason, codes in by_reason.items():
            table.add_row(", ".join(codes), reason)
        console.print(table)
