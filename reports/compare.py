"""Before/after: two diagnoses side by side (a tuning change, a fix, a new release).

``compare`` lines up the evidence both diagnoses measured (latency percentiles, throughput,
utilisation, CPU, memory, per-stage p99, queue depth) — every metric present on either side gets
a row, ``None`` on the side that did not measure it — and sorts the findings by rule code into
gained (only after), lost (only before) and kept (both). Renderers: text (rich, no colour),
Markdown, JSON (schema ``diagnose/compare/v1``) and ``chart``, a plotly figure shared with the
dashboard's Compare page. Everything here is pure: no I/O, no printing.
"""

from __future__ import annotations

import fnmatch
import functools
import io
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from diagnose.model import Category, Diagnosis, Evidence, Finding
from diagnose.reports.markdown import cell, code_cell, format_value, table, text
from diagnose.units import pct

if TYPE_CHECKING:
    import plotly.graph_objects as go

SCHEMA = "diagnose/compare/v1"
SAME_WITHIN = 0.05  # a change smaller than 5 % of the larger value is noise between two short windows

# (evidence key or fnmatch pattern, which way is better: "lower", "higher", or "" when neither is)
METRICS: tuple[tuple[str, str], ...] = (
    ("latency.e2e_ms.p50", "lower"),
    ("latency.e2e_ms.p99", "lower"),
    ("latency.ttft_ms.p50", "lower"),
    ("latency.ttft_ms.p99", "lower"),
    ("latency.itl_ms.p50", "lower"),
    ("latency.itl_ms.p99", "lower"),
    ("latency.call_ms.max", "lower"),
    ("throughput.rps", "higher"),
    ("throughput.tokens_per_s", "higher"),
    ("throughput.total_tokens_per_s", "higher"),
    ("serving.prompt_tokens_per_s", "higher"),
    ("serving.generation_tokens_per_s", "higher"),
    ("requests.error_ratio", "lower"),
    ("gpu.util_ratio", "higher"),
    ("gpu.busy_ratio", "higher"),
    ("trace.gpu_busy_ratio", "higher"),
    ("gpu.mem_util_ratio", ""),
    ("pcie.rx_bytes_per_s", ""),
    ("pcie.tx_bytes_per_s", ""),
    ("proc.cpu_cores_used", ""),
    ("proc.runqueue_wait_ratio", "lower"),
    ("cpu.preprocess_share", "lower"),
    ("cpu.compile_share", "lower"),
    ("cpu.copy_sync_share", "lower"),
    ("compile.recompiles", "lower"),
    ("proc.rss_bytes", "lower"),
    ("gpu.memory_used_bytes", "lower"),
    ("mem.allocated_bytes", "lower"),
    ("mem.reserved_bytes", "lower"),
    ("mem.reserved_minus_allocated_bytes", "lower"),
    ("mem.weights_bytes", ""),
    ("mem.activations_bytes", "lower"),
    ("stage.*_ms.p99", "lower"),
    ("serving.waiting_mean", "lower"),
    ("serving.kv_cache_usage_max_ratio", ""),
    ("serving.prefix_cache_hit_ratio", "higher"),
    ("serving.preemptions", "lower"),
    ("conn.inflight_mean", "lower"),
    ("conn.accept_queue_max", "lower"),
)


@dataclass(frozen=True)
class Row:
    """One metric on both sides; ``None`` where that side did not measure it."""

    metric: str
    unit: str
    before: float | None
    after: float | None
    better: str  # "lower", "higher", or "" when neither direction is better

    @property
    def change(self) -> float | None:
        """after / before − 1, or None when a side is missing or before is 0."""
        if self.before is None or self.after is None or self.before == 0:
            return None
        return self.after / self.before - 1

    @property
    def verdict(self) -> str:
        """better | worse | same | changed (no better direction) | n/a (a side is missing)."""
        if self.before is None or self.after is None:
            return "n/a"
        scale = max(abs(self.before), abs(self.after))
        if scale == 0 or abs(self.after - self.before) / scale < SAME_WITHIN:
            return "same"
        if not self.better:
            return "changed"
        went_up = self.after > self.before
        return "better" if went_up == (self.better == "higher") else "worse"


@dataclass(frozen=True)
class Comparison:
    before: str
    after: str
    rows: list[Row]
    gained: list[Finding]
    lost: list[Finding]
    kept: list[tuple[Finding, Finding]]
    before_primary: Category | None = None
    after_primary: Category | None = None


def _numeric(ev: Evidence) -> float | None:
    v = ev.value
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


def _scalars(d: Diagnosis) -> dict[str, Evidence]:
    out: dict[str, Evidence] = {}
    for ev in d.evidence:  # the first source of a key wins, as in EvidenceSet
        if ev.key not in out and _numeric(ev) is not None:
            out[ev.key] = ev
    return out


def rows(before: Diagnosis, after: Diagnosis) -> list[Row]:
    b, a = _scalars(before), _scalars(after)
    keys = sorted(set(b) | set(a))
    out: list[Row] = []
    seen: set[str] = set()
    for pattern, better in METRICS:
        for key in keys:
            if key in seen or not fnmatch.fnmatchcase(key, pattern):
                continue
            seen.add(key)
            ev = b.get(key) or a[key]
            out.append(Row(key, ev.unit, _numeric(b[key]) if key in b else None,
                           _numeric(a[key]) if key in a else None, better))
    return out


def compare(before: Diagnosis, after: Diagnosis, before_label: str = "before",
            after_label: str = "after") -> Comparison:
    b = {f.code: f for f in before.findings}
    a = {f.code: f for f in after.findings}
    return Comparison(
        before=before_label,
        after=after_label,
        rows=rows(before, after),
        gained=[f for code, f in a.items() if code not in b],
        lost=[f for code, f in b.items() if code not in a],
        kept=[(b[code], f) for code, f in a.items() if code in b],
        before_primary=before.primary,
        after_primary=after.primary,
    )


def _val(v: float | None, unit: str) -> str:
    return "-" if v is None else format_value(v, unit)


def _change(r: Row) -> str:
    ch = r.change
    if ch is None:
        return "-"
    return pct(ch, signed=True)


def _primary(c: Category | None) -> str:
    return c.value if c else "none"


def headline(c: Comparison) -> str:
    """One sentence: what the primary bottleneck was and is, and the findings that went away or came."""
    if c.before_primary == c.after_primary:
        head = f"Primary bottleneck unchanged: {_primary(c.after_primary)}."
    else:
        head = f"Primary bottleneck {_primary(c.before_primary)} → {_primary(c.after_primary)}."
    verdicts = [r.verdict for r in c.rows]
    return (f"{head} {verdicts.count('better')} metric(s) better, {verdicts.count('worse')} worse; "
            f"{len(c.lost)} finding(s) gone, {len(c.gained)} new.")


def _finding_line(f: Finding) -> str:
    return f"{f.code} {f.label}: {f.title} ({f.severity.value}, impact {pct(f.impact)})"


def render_text(c: Comparison, width: int = 110) -> str:
    """Plain text (rich tables, no colour codes), for the terminal."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    buf = io.StringIO()
    # markup off: session labels and finding titles are data ("a[red]b", "[/x]" must print as written)
    console = Console(file=buf, width=width, color_system=None, highlight=False, soft_wrap=False)
    console.print = functools.partial(console.print, markup=False)  # type: ignore[method-assign]
    console.print(f"diagnose compare: {c.before} → {c.after}")
    console.print(headline(c))
    t = Table(title="Metrics", title_justify="left")
    for col in ("metric", c.before, c.after, "change", "verdict"):
        t.add_column(Text(col), justify="left" if col in ("metric", "verdict") else "right")
    for r in c.rows:
        t.add_row(*(Text(x) for x in (r.metric, _val(r.before, r.unit), _val(r.after, r.unit), _change(r), r.verdict)))
    if c.rows:
        console.print(t)
    else:
        console.print("No metric was measured in either session.")
    for title, items in (("Findings gone (only before)", c.lost), ("Findings new (only after)", c.gained)):
        console.print(f"{title}: {'none' if not items else ''}")
        for f in items:
            console.print(f"  - {_finding_line(f)}")
    console.print(f"Findings in both: {'none' if not c.kept else ''}")
    for fb, fa in c.kept:
        console.print(f"  - {fb.code} {fb.label}: impact {pct(fb.impact)} → {pct(fa.impact)}, "
                      f"{fb.severity.value} → {fa.severity.value}")
    return buf.getvalue()


def render_markdown(c: Comparison) -> str:
    out = [f"# Compare: {text(c.before)} → {text(c.after)}", "", f"**{text(headline(c))}**", ""]
    if c.rows:
        body = [[code_cell(r.metric), cell(_val(r.before, r.unit)), cell(_val(r.after, r.unit)), _change(r), r.verdict]
                for r in c.rows]
        out += ["## Metrics", "", *table(["metric", cell(c.before), cell(c.after), "change", "verdict"], body,
                                         ["l", "r", "r", "r", "l"]), ""]
    else:
        out += ["No metric was measured in either session.", ""]
    for title, items in (("Findings gone (only before)", c.lost), ("Findings new (only after)", c.gained)):
        out += [f"## {title}", ""]
        out += [f"- {text(_finding_line(f))}" for f in items] or ["None."]
        out.append("")
    out += ["## Findings in both", ""]
    out += [f"- {fb.code} `{fb.label}`: impact {pct(fb.impact)} → {pct(fa.impact)}, "
            f"{fb.severity.value} → {fa.severity.value}" for fb, fa in c.kept] or ["None."]
    return "\n".join(out) + "\n"


def to_json(c: Comparison) -> dict[str, Any]:
    def num(v: float | None) -> float | None:
        return None if v is None else round(v, 6)

    return {
        "schema": SCHEMA,
        "before": c.before,
        "after": c.after,
        "before_primary": c.before_primary.value if c.before_primary else None,
        "after_primary": c.after_primary.value if c.after_primary else None,
        "rows": [{"metric": r.metric, "unit": r.unit, "before": num(r.before), "after": num(r.after),
                  "change": num(r.change), "better": r.better, "verdict": r.verdict} for r in c.rows],
        "gained": [f.to_json() for f in c.gained],
        "lost": [f.to_json() for f in c.lost],
        "kept": [{"code": fb.code, "category": fb.label, "title": fa.title,
                  "before": {"severity": fb.severity.value, "impact": round(fb.impact, 4)},
                  "after": {"severity": fa.severity.value, "impact": round(fa.impact, 4)}} for fb, fa in c.kept],
    }


_VERDICT_COLOUR = {"better": "#2ca02c", "worse": "#d62728", "same": "#7f7f7f", "changed": "#1f77b4"}


def chart(c: Comparison) -> go.Figure:
    """Grouped bars: each metric measured on both sides, after as a ratio of before (before = 1)."""
    import plotly.graph_objects as go

    both = [r for r in c.rows if r.change is not None and r.after is not None and r.before is not None]
    fig = go.Figure()
    if not both:
        fig.add_annotation(text="No metric was measured in both sessions.", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
        fig.update_layout(title=f"{c.before} → {c.after}", xaxis={"visible": False}, yaxis={"visible": False},
                          height=200)
        return fig
    names = [r.metric for r in both]
    fig.add_bar(name=c.before, x=names, y=[1.0] * len(both), marker_color="#aec7e8",
                customdata=[_val(r.before, r.unit) for r in both],
                hovertemplate="%{x}<br>" + c.before + ": %{customdata}<extra></extra>")
    fig.add_bar(name=c.after, x=names, y=[1.0 + (r.change or 0.0) for r in both],
                marker_color=[_VERDICT_COLOUR.get(r.verdict, "#1f77b4") for r in both],
                customdata=[[_val(r.after, r.unit), _change(r), r.verdict] for r in both],
                hovertemplate="%{x}<br>" + c.after
                + ": %{customdata[0]} (%{customdata[1]}, %{customdata[2]})<extra></extra>")
    fig.add_hline(y=1.0, line_dash="dot", line_color="#555")
    fig.update_layout(barmode="group", title=f"{c.after} relative to {c.before} (before = 1)",
                      yaxis_title="after / before", legend_title_text="session", margin={"b": 140}, height=460)
    fig.update_xaxes(tickangle=-35)
    return fig


# -- two sweeps (``diagnose/sweep/v1``): the same ladder before and after a change ----------------------
SWEEP_SCHEMA = "diagnose/compare-sweep/v1"
# per-step metrics compared, and which way is better
SWEEP_METRICS: tuple[tuple[str, str, str], ...] = (
    ("throughput_rps", "req/s", "higher"), ("p50_ms", "ms", "lower"), ("p99_ms", "ms", "lower"),
    ("error_ratio", "ratio", "lower"), ("ttft_p99_ms", "ms", "lower"), ("tokens_per_s", "tokens/s", "higher"),
)


def _judge(before: float | None, after: float | None, better: str) -> tuple[float | None, str]:
    if before is None or after is None:
        return None, "changed" if before != after else "same"
    big = max(abs(before), abs(after))
    change = (after - before) / before if before else (0.0 if after == before else None)
    if big == 0 or abs(after - before) <= SAME_WITHIN * big:
        return change, "same"
    up = after > before
    return change, "better" if (up and better == "higher") or (not up and better == "lower") else "worse"


def compare_sweeps(before: dict[str, Any], after: dict[str, Any], before_label: str = "before",
                   after_label: str = "after") -> dict[str, Any]:
    """Step by step at the concurrencies both sweeps ran, plus the knees (schema ``diagnose/compare-sweep/v1``)."""
    a = {s["concurrency"]: s for s in before.get("steps", ())}
    b = {s["concurrency"]: s for s in after.get("steps", ())}
    rows = []
    for c in sorted(set(a) & set(b)):
        for key, unit, better in SWEEP_METRICS:
            va, vb = a[c].get(key), b[c].get(key)
            if va is None and vb is None:
                continue
            change, verdict = _judge(va, vb, better)
            rows.append({"concurrency": c, "metric": key, "unit": unit, "before": va, "after": vb,
                         "change": None if change is None else round(change, 4), "better": better,
                         "verdict": verdict})
    kb, ka = before.get("knee"), after.get("knee")

    def knee_text(k: dict[str, Any] | None) -> str:
        return (f"{k['concurrency']} clients, {k['throughput_rps']:.1f} req/s, p99 {k['p99_ms']:.0f} ms" if k
                else "none")

    best_b = max((s["throughput_rps"] for s in a.values()), default=0.0)
    best_a = max((s["throughput_rps"] for s in b.values()), default=0.0)
    verdicts = [r["verdict"] for r in rows]
    head = (f"Knee {knee_text(kb)} → {knee_text(ka)}; best throughput {best_b:.1f} → {best_a:.1f} req/s; "
            f"{verdicts.count('better')} step metric(s) better, {verdicts.count('worse')} worse")
    return {"schema": SWEEP_SCHEMA, "before": before_label, "after": after_label, "before_url": before.get("url"),
            "after_url": after.get("url"), "knee_before": kb, "knee_after": ka, "best_throughput_before": best_b,
            "best_throughput_after": best_a, "headline": head, "rows": rows,
            "only_before": sorted(set(a) - set(b)), "only_after": sorted(set(b) - set(a))}


def _sweep_rows(c: dict[str, Any]) -> list[list[str]]:
    def v(x: Any, unit: str) -> str:
        return "-" if x is None else format_value(x, unit)

    return [[str(r["concurrency"]), r["metric"], v(r["before"], r["unit"]), v(r["after"], r["unit"]),
             "-" if r["change"] is None else pct(r["change"], signed=True), r["verdict"]] for r in c["rows"]]


def render_sweeps_text(c: dict[str, Any]) -> str:
    head = ["clients", "metric", c["before"], c["after"], "change", "verdict"]
    body = _sweep_rows(c)
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = [f"diagnose compare (sweeps): {c['before']} → {c['after']}", c["headline"] + ".", ""]
    lines += ["  ".join(x.ljust(widths[i]) for i, x in enumerate(r)).rstrip() for r in [head, *body]]
    if c["only_before"] or c["only_after"]:
        lines.append(f"steps only before: {c['only_before'] or 'none'}; only after: {c['only_after'] or 'none'}")
    return "\n".join(lines) + "\n"


def render_sweeps_markdown(c: dict[str, Any]) -> str:
    out = [f"# Compare sweeps: {text(c['before'])} → {text(c['after'])}", "", f"**{text(c['headline'])}.**", ""]
    out += table(["clients", "metric", cell(c["before"]), cell(c["after"]), "change", "verdict"],
                 [[cell(x) for x in r] for r in _sweep_rows(c)], ["r", "l", "r", "r", "r", "l"])
    return "\n".join(out) + "\n"
