"""The fleet document (``diagnose/fleet/v1``) as text, Markdown, one HTML file, and its charts.

Pure renderers of the JSON document ``diagnose.fleet.summarise`` returns (JSON is the source of
truth): the same functions serve ``diagnose fleet --format``, ``diagnose report fleet.json`` and the
dashboard's Fleet page. Strings from the server (labels, instance names) are escaped by each format.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go

from diagnose.reports import markdown as md
from diagnose.reports.figures import TEMPLATE, Chart
from diagnose.units import pct

SCHEMA = "diagnose/fleet/v1"
SEVERITY_RANK = {"critical": 3, "major": 2, "minor": 1, "info": 0}
_COLUMNS = (  # (key number, header, how to show it)
    ("throughput.rps", "req/s", lambda v: f"{v:.2f}"),
    ("latency.e2e_ms.p99", "e2e p99", md.format_number),
    ("latency.ttft_ms.p99", "TTFT p99", md.format_number),
    ("serving.waiting_mean", "waiting", lambda v: f"{v:.1f}"),
    ("serving.kv_cache_usage_max_ratio", "KV max", pct),
    ("gpu.util_ratio", "GPU util", pct),
)


def _when(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def replica_label(r: Mapping[str, Any]) -> str:
    pod = r.get("labels", {}).get("pod")
    return f"{r['instance']} ({pod})" if pod and pod != r["instance"] else str(r["instance"])


def _cell(r: Mapping[str, Any], key: str, fmt: Any) -> str:
    v = r.get("key_numbers", {}).get(key)
    if v is None:
        return "—"
    text = fmt(v)
    return f"{text} ms" if key.endswith("_ms.p99") else text


def header_line(doc: Mapping[str, Any]) -> str:
    w = doc["window"]
    n = len(doc["replicas"])
    return (f"{n} replica(s) on {doc['prometheus']}, the {w['seconds']:.0f} s ending {_when(w['end'])} "
            f"(step {doc['step_s']:g} s, {doc['queries']} queries"
            + (f", selector {{{doc['selector']}}}" if doc.get("selector") else "") + ")")


def verdict_line(doc: Mapping[str, Any]) -> str:
    return f"Fleet verdict: {doc['verdict']} — {doc['summary']}."


def rows(doc: Mapping[str, Any]) -> list[list[str]]:
    out = []
    for r in doc["replicas"]:
        what = r["primary"] or (r["verdict"] or "not judged")
        out.append([replica_label(r), what, r["severity"] or "", *(_cell(r, k, f) for k, _, f in _COLUMNS),
                    r["title"] or r.get("missing", "")])
    return out


HEADER = ["replica", "primary", "severity", *(h for _, h, _ in _COLUMNS), "why"]


def render_text(doc: Mapping[str, Any], width: int = 120) -> str:
    lines = [header_line(doc), verdict_line(doc), ""]
    table = [HEADER, *rows(doc)]
    widths = [min(max(len(row[i]) for row in table), 40 if i == 0 else 60) for i in range(len(HEADER))]
    for row in table:
        cells = [c if len(c) <= widths[i] else c[: widths[i] - 1] + "…" for i, c in enumerate(row)]
        lines.append("  ".join(c.ljust(widths[i]) for i, c in enumerate(cells)).rstrip()[:width * 2])
    lines.append("")
    lines += _sections_text(doc)
    return "\n".join(lines).rstrip() + "\n"


def _sections_text(doc: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    if doc["outliers"]:
        out.append("Outliers (a replica's own problem):")
        out += [f"  • {o['instance']} [{o['kind']}] {o['message']}" for o in doc["outliers"]]
    out.append(f"Load balance: {doc['imbalance']['message']}.")
    out.append(f"Headroom: {doc['headroom']['message']}.")
    if doc.get("unclaimed_gpus"):
        out.append("GPUs no replica claims (no pod or host label matched):")
        out += [f"  • {g['gpu']}: {g['primary'] or g['verdict']}" + (f" — {g['title']}" if g["title"] else "")
                for g in doc["unclaimed_gpus"]]
    if doc.get("problems"):
        out.append("Partial answer — some queries failed:")
        out += [f"  • {p}" for p in doc["problems"]]
    if doc.get("where_to_look"):
        out.append("Where to look:")
        out += [f"  {n}. {t}" for n, t in enumerate(doc["where_to_look"], 1)]
    return out


def render_markdown(doc: Mapping[str, Any]) -> str:
    out = ["# diagnose fleet", "", md.text(header_line(doc)), "", f"**{md.text(verdict_line(doc))}**", ""]
    out += md.table(HEADER, [[md.cell(c) for c in row] for row in rows(doc)])
    out.append("")
    if doc["outliers"]:
        out += ["## Outliers", ""] + [f"- **{md.text(o['instance'])}** ({o['kind']}): {md.text(o['message'])}"
                                      for o in doc["outliers"]] + [""]
    out += ["## Load and headroom", "", f"- Load balance: {md.text(doc['imbalance']['message'])}.",
            f"- Headroom: {md.text(doc['headroom']['message'])}.", ""]
    if doc.get("unclaimed_gpus"):
        out += ["## GPUs no replica claims", ""] + [
            f"- {md.text(g['gpu'])}: {g['primary'] or g['verdict']} {md.text(g['title'])}"
            for g in doc["unclaimed_gpus"]] + [""]
    if doc.get("where_to_look"):
        out += ["## Where to look", ""] + [f"{n}. {md.text(t)}" for n, t in enumerate(doc["where_to_look"], 1)] + [""]
    if doc.get("problems"):
        out += ["## Partial answer", ""] + [f"- {md.text(p)}" for p in doc["problems"]] + [""]
    return "\n".join(out)


# -- charts (the HTML report and the dashboard) ---------------------------------------------------------


def heatmap(doc: Mapping[str, Any]) -> Chart:
    """Replicas × findings, coloured by severity."""
    title = "Replicas × findings"
    reps = [r for r in doc.get("replicas", ()) if r.get("findings")]
    if not reps:
        return Chart(title, None, "No replica has a finding: nothing to place on the map "
                     "(see the verdicts in the table; replicas not judged say why).")
    codes = sorted({f["code"] for r in reps for f in r["findings"]})
    z, text = [], []
    for r in reps:
        by = {f["code"]: f for f in r["findings"]}
        z.append([SEVERITY_RANK[by[c]["severity"]] + 1 if c in by else 0 for c in codes])
        text.append([f"{by[c]['severity']}: {by[c]['title']}" if c in by else "" for c in codes])
    fig = go.Figure(go.Heatmap(
        z=z, x=codes, y=[replica_label(r) for r in reps], text=text,
        hovertemplate="%{y}<br>%{x}: %{text}<extra></extra>",
        zmin=0, zmax=4, showscale=False,
        colorscale=[[0.0, "#f4f5f7"], [0.25, "#f4f5f7"], [0.25, "#67a9cf"], [0.5, "#fddbc7"], [0.75, "#ef8a62"],
                    [1.0, "#b2182b"]]))
    fig.update_layout(title={"text": title, "x": 0.01}, template=TEMPLATE, height=max(260, 60 + 28 * len(reps)),
                      margin={"l": 200, "r": 20, "t": 50, "b": 60})
    return Chart(title, fig)


SERIES_TITLES = {"serving.running": "running", "serving.waiting": "waiting", "serving.kv_usage": "KV cache (0–1)",
                 "throughput.rps": "requests/s", "gpu.util_ratio": "GPU util (0–1)"}


def replica_chart(doc: Mapping[str, Any], instance: str) -> Chart:
    """One replica's series over the window (the drill-down)."""
    r = next((x for x in doc.get("replicas", ()) if x["instance"] == instance), None)
    title = f"{instance} over the window"
    if r is None:
        return Chart(title, None, f"No replica {instance} in this fleet document.")
    series = r.get("series") or {}
    if not series:
        return Chart(title, None, "No series for this replica: " + (r.get("missing") or "the server returned none."))
    fig = go.Figure()
    t0 = doc["window"]["start"]
    for name, pts in series.items():
        fig.add_trace(go.Scatter(x=[p[0] - t0 for p in pts], y=[p[1] for p in pts], mode="lines",
                                 name=SERIES_TITLES.get(name, name)))
    fig.update_layout(title={"text": title, "x": 0.01}, template=TEMPLATE, height=360,
                      xaxis_title="seconds into the window", legend={"orientation": "h", "y": -0.2},
                      margin={"l": 60, "r": 20, "t": 50, "b": 40})
    return Chart(title, fig)


def render_html(doc: Mapping[str, Any]) -> str:
    from diagnose.reports.document import html_page, table

    sections = [("replicas", "Replicas", table(HEADER, rows(doc)))]
    body_charts: list[Chart] = [heatmap(doc)]
    if doc["outliers"]:
        sections.append(("outliers", "Outliers", "<ul>" + "".join(
            f"<li><b>{_e(o['instance'])}</b> ({_e(o['kind'])}): {_e(o['message'])}</li>" for o in doc["outliers"])
            + "</ul>"))
    sections.append(("load", "Load and headroom", f"<p>Load balance: {_e(doc['imbalance']['message'])}.</p>"
                     f"<p>Headroom: {_e(doc['headroom']['message'])}.</p>"))
    if doc.get("where_to_look"):
        sections.append(("look", "Where to look", "<ol>" + "".join(f"<li>{_e(t)}</li>" for t in doc["where_to_look"])
                         + "</ol>"))
    drill = [replica_chart(doc, r["instance"]) for r in doc["replicas"][:12] if r.get("series")]
    if doc.get("problems"):
        sections.append(("partial", "Partial answer", "<ul>" + "".join(f"<li>{_e(p)}</li>" for p in doc["problems"])
                         + "</ul>"))
    return html_page(title=f"diagnose fleet — {doc['summary']}", heading="diagnose fleet", sub=header_line(doc),
                     verdict=verdict_line(doc), verdict_class="" if doc["verdict"] == "bottleneck" else
                     ("none" if doc["verdict"] == "healthy" else "thin"),
                     sections=sections, charts_first=body_charts, charts_last=("series", "Replica series", drill),
                     embedded=json.dumps(doc, ensure_ascii=False), embedded_id="fleet")


def _e(s: object) -> str:
    from diagnose.reports.html import e

    return e(s)
