"""The pages' presentation: how a session's tables and charts are laid out in Streamlit.

Data and figures come from ``reports`` (``diagnose.reports.data``, ``diagnose.reports.figures``,
``diagnose.reports.compare``);
nothing here computes a number of its own. Every page opens with the empty-state guard
(``state.current()``) and says plainly what is missing and how to get it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import streamlit as st

from diagnose.dashboard import state
from diagnose.model import Diagnosis, Evidence, Finding, Severity, Verdict
from diagnose.reports import compare as report_compare
from diagnose.reports import data as report_data
from diagnose.reports import figures, markdown, wording
from diagnose.units import pct

# Streamlit's coloured-text markdown (not emoji: a browser without an emoji font shows boxes)
_SEVERITY_MARK = {Severity.CRITICAL: ":red[**critical**]", Severity.MAJOR: ":orange[**major**]",
                  Severity.MINOR: ":violet[minor]", Severity.INFO: ":blue[info]"}


def column_config(frame: pd.DataFrame) -> dict[str, Any]:
    """Number formats by the column's unit suffix: ms to 0.1, shares and ratios as %, bytes as KB/MB/GB."""
    out: dict[str, Any] = {}
    for col in frame.columns:
        name = str(col)
        if name.endswith("_ms"):
            out[name] = st.column_config.NumberColumn(format="%.1f")
        elif name in ("share", "impact") or name.endswith("_ratio"):
            out[name] = st.column_config.NumberColumn(format="percent")
        elif name in ("bytes", "used_bytes") or name.endswith("_bytes"):
            out[name] = st.column_config.NumberColumn(format="bytes")
    return out


def table(frame: pd.DataFrame) -> None:
    st.dataframe(frame, hide_index=True, column_config=column_config(frame))


def format_value(ev: Evidence) -> str:
    """An evidence value for people, exactly as the Markdown and HTML reports write it."""
    return markdown.format_value(ev.value, ev.unit)


def _evidence_frame(evidence: Sequence[Evidence]) -> pd.DataFrame:
    return pd.DataFrame(
        [{"key": e.key, "value": format_value(e), "source": markdown.source_name(e.source), "quality": e.quality.value,
          "detail": e.detail} for e in evidence],
        columns=["key", "value", "source", "quality", "detail"])


def differential(diagnosis: Diagnosis) -> None:
    """The candidates, best first: probability, for, against, and the check that separates each."""
    if not diagnosis.candidates:
        return
    st.markdown("**Differential**")
    table(pd.DataFrame([dict(zip(("candidate", "probability", "for", "against", "check that separates it"), row,
                                 strict=True)) for row in wording.differential_rows(diagnosis)]))


def watched(diagnosis: Diagnosis) -> None:
    """A ``diagnose watch`` session: what fired, and what rose over the ring before it."""
    lines = wording.watch_lines(diagnosis)
    if lines:
        st.markdown("**Before the trigger (diagnose watch)**\n\n" + "\n".join(f"- {markdown.text(x)}" for x in lines))


def verdict(diagnosis: Diagnosis) -> None:
    """The verdict, its differential, and for a watch session what fired and what rose before it."""
    _verdict(diagnosis)
    watched(diagnosis)


def _verdict(diagnosis: Diagnosis) -> None:
    primary = diagnosis.primary
    sure = wording.probability_text(diagnosis)
    if primary is None:
        if diagnosis.overall is Verdict.HEALTHY:
            st.success(f"**Verdict: healthy**{sure} — {markdown.text(wording.healthy_text(diagnosis))}")
            differential(diagnosis)
            return
        steps = "\n".join(f"{n}. {markdown.text(s)}" for n, s in enumerate(diagnosis.next_steps, 1))
        st.warning(f"**Verdict: undetermined** — {markdown.text(wording.undetermined_text(diagnosis))}"
                   + (f"\n\n{steps}" if steps else ""))
        differential(diagnosis)
        return
    top = next(f for f in diagnosis.findings if f.severity is not Severity.INFO)
    st.error(f"**Verdict: the bottleneck is `{primary.value}`**{sure} — {markdown.text(top.title)}")
    if diagnosis.next_steps:  # the verdict rests on a report's words: how to measure it
        st.info("**To confirm it, measure:**\n\n" + "\n".join(
            f"{n}. {markdown.text(s)}" for n, s in enumerate(diagnosis.next_steps, 1)))
    differential(diagnosis)


def finding(rank: int, f: Finding, expanded: bool) -> None:
    head = f"{rank}. {_SEVERITY_MARK[f.severity]} {f.label} — {markdown.text(f.title)}"
    with st.expander(head, expanded=expanded):
        st.caption(f"{f.code} {f.name} · {f.severity.value} · confidence {f.confidence.value} · "
                   f"impact {pct(f.impact)}")
        st.markdown(markdown.text(f.message))  # session strings in a message must not render as markup
        if f.why:
            st.code(f.why, language=None)
        if f.evidence:
            st.markdown("**Evidence**")
            table(_evidence_frame(f.evidence))
        if f.fixes:
            st.markdown("**Fix**")
            for fix in f.fixes:
                steps = "".join(f"\n    - {markdown.text(step)}" for step in fix.steps)
                st.markdown(f"- **{markdown.text(fix.summary)}** `[{fix.risk.value}]`{steps}")


def overview() -> None:
    data = state.current()
    st.title("Overview")
    if data is None:
        return
    d = data.diagnosis
    target = d.target
    if target is not None:
        cmd = " ".join(target.cmdline)
        st.caption(markdown.text(f"{data.label}: pid {target.pid} ({cmd[:160]}), {data.window_s:.1f} s window"))
    verdict(d)
    show_chart(figures.findings_impact(data), key="overview-impact")

    st.header("Findings")
    if not d.findings:
        st.markdown("No rule found a bottleneck. The skipped rules below say what evidence would let more of them "
                    "judge.")
    for i, f in enumerate(d.findings, start=1):
        finding(i, f, expanded=i == 1)
    if d.skipped:
        by_reason: dict[str, list[str]] = {}
        for s in d.skipped:
            by_reason.setdefault(s.reason, []).append(s.code)
        with st.expander(f"Rules skipped for want of evidence ({len(d.skipped)})"):
            table(pd.DataFrame([{"rules": ", ".join(codes), "why": reason} for reason, codes in by_reason.items()]))

    st.header("Capture health")
    table(report_data.capture_table(data))
    if d.inputs:
        st.header("Inputs")
        table(pd.DataFrame([{**i.to_json(), "path": markdown.source_name(i.path)} for i in d.inputs]))


def show_chart(chart: figures.Chart, key: str) -> bool:
    """One chart (it carries its title); the title and the missing-evidence sentence when there is no figure."""
    if chart.figure is None:
        st.subheader(chart.title)
        st.info(chart.missing)
        return False
    st.plotly_chart(chart.figure, key=key, width="stretch")
    if chart.missing:
        st.caption(chart.missing)
    return True


def _draw(fn: Callable[[report_data.SessionData], figures.Chart],
          data: report_data.SessionData) -> figures.Chart | None:
    try:
        return fn(data)
    except Exception as exc:  # one broken chart must not take the page (and a traceback) with it
        st.error(f"The {fn.__name__.replace('_', ' ')} chart could not be drawn ({type(exc).__name__}: {exc}).")
        return None


def chart_page(name: str, tables: Sequence[tuple[str, str]] = ()) -> None:
    """A page of ``figures.PAGES[name]``, then the session tables ``(heading, table name)`` that have rows."""
    data = state.current()
    st.title(name)
    if data is None:
        return
    charts = [c for c in (_draw(fn, data) for fn in figures.PAGES[name]) if c is not None]
    shown = sum(c.figure is not None for c in charts)
    st.caption(f"{data.label}: {shown} of {len(charts)} charts have data.")
    for i, chart in enumerate(charts):
        show_chart(chart, key=f"{name}-{i}")
    for heading, name in tables:
        if data.has(name):
            st.subheader(heading)
            table(data.table(name))


def _finding_lines(found: Sequence[Finding]) -> str:
    return "\n".join(f"- {_SEVERITY_MARK[f.severity]} **{f.label}** — {f.code} {markdown.text(f.title)}"
                     for f in found)


def compare_page() -> None:
    st.title("Compare")
    paths = state.session_paths()
    if len(paths) < 2:
        st.info("Compare needs two sessions, one before and one after a change: start the dashboard with both, "
                "`diagnose dashboard BEFORE AFTER`, and pick them here (or run `diagnose compare BEFORE AFTER` "
                "in a terminal).")
        return
    names = state.labels(paths)
    left, right = st.columns(2)
    before_path = left.selectbox("Before", paths, index=0, format_func=names.__getitem__, key=state.StateKeys.BEFORE)
    after_path = right.selectbox("After", paths, index=len(paths) - 1, format_func=names.__getitem__,
                                 key=state.StateKeys.AFTER)
    if before_path == after_path:
        st.warning("Before and after are the same session: pick two different ones.")
        return
    before, before_error = state.load(before_path)
    after, after_error = state.load(after_path)
    for error in (before_error, after_error):
        if error:
            st.error(error)
    if before is None or after is None:
        return
    c = report_compare.compare(before.diagnosis, after.diagnosis, names[before_path], names[after_path])
    st.markdown(f"**{markdown.text(report_compare.headline(c))}**")

    st.header("Measurements")
    if c.rows:
        table(pd.DataFrame([{
            "metric": r.metric, "unit": r.unit, "before": r.before, "after": r.after,
            "change %": None if r.change is None else round(100 * r.change, 1),
            "better when": r.better, "verdict": r.verdict} for r in c.rows]))
        st.plotly_chart(report_compare.chart(c), key="compare-chart", width="stretch")
    else:
        st.info("The two sessions share no measurement to compare (latency, throughput, utilisation, memory). "
                "Attach with the same collectors on both sides, e.g. `diagnose attach --pid PID --log LOG`.")

    st.header("Findings")
    before_name, after_name = markdown.text(c.before), markdown.text(c.after)
    st.subheader(f"Gained ({len(c.gained)}): in {after_name}, not in {before_name}")
    st.markdown(_finding_lines(c.gained) or "None.")
    st.subheader(f"Lost ({len(c.lost)}): in {before_name}, gone from {after_name}")
    st.markdown(_finding_lines(c.lost) or "None.")
    st.subheader(f"Kept ({len(c.kept)})")
    st.markdown(_finding_lines([a for _, a in c.kept]) or "None.")
