"""The sweep document (``diagnose/sweep/v1``) as text, Markdown, one HTML file, and its chart.

Pure renderers of the JSON ``diagnose.sweep.run`` returns; ``chart`` (throughput and p99 against
concurrency, the knee marked) is shared by the HTML report and the dashboard's Sweep page.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from diagnose.reports import markdown as md
from diagnose.reports.figures import TEMPLATE, Chart
from diagnose.units import pct

SCHEMA = "diagnose/sweep/v1"


def _n(v: Any, fmt: str = "{:.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def header_line(doc: Mapping[str, Any]) -> str:
    when = datetime.fromtimestamp(doc["started_at"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    what = f"{doc['method']} {doc['url']}" + (f" (OpenAI streaming, model {doc['model']})" if doc.get("openai") else "")
    return (f"{what}, {len(doc['steps'])} step(s) of {doc['duration_s']:g} s measured after {doc['warmup_s']:g} s "
            f"warm-up, started {when}")


def verdict_line(doc: Mapping[str, Any]) -> str:
    return ("Knee: " if doc.get("knee") else "No knee: ") + str(doc["summary"]) + "."


def columns(doc: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    streamed = any("ttft_p50_ms" in s for s in doc["steps"])
    head = ["clients", "req/s", "p50 ms", "p90 ms", "p99 ms", "errors"]
    if streamed:
        head += ["TTFT p50", "TTFT p99", "TPOT ms", "ITL p99", "tok/s"]
    head.append("client CPU")
    knee = (doc.get("knee") or {}).get("concurrency")
    rows = []
    for s in doc["steps"]:
        row = [f"{s['concurrency']}" + (" ← knee" if s["concurrency"] == knee else ""),
               _n(s["throughput_rps"], "{:.2f}"), _n(s["p50_ms"]), _n(s["p90_ms"]), _n(s["p99_ms"]),
               f"{s['errors']}" + (f" ({pct(s['error_ratio'])})" if s["errors"] else "")]
        if streamed:
            row += [_n(s.get("ttft_p50_ms")), _n(s.get("ttft_p99_ms")), _n(s.get("tpot_ms")), _n(s.get("itl_p99_ms")),
                    _n(s.get("tokens_per_s"))]
        row.append(pct(s['client_cpu_cores']))
        rows.append(row)
    return head, rows


def _attach_lines(doc: Mapping[str, Any]) -> list[str]:
    a = (doc.get("knee") or {}).get("diagnosis") or doc.get("attach")
    if not a:
        return []
    what = a["primary"] or a["verdict"]
    out = [f"Attached to pid {a['pid']} at {a['concurrency']} client(s) ({a['at']}): {what}"
           + (f" — {a['title']}" if a["title"] else "") + f" (session {a['session']})"]
    out += [f"  {f['code']} {f['severity']}: {f['title']}" for f in a["findings"][:5]]
    return out


def render_text(doc: Mapping[str, Any]) -> str:
    head, rows = columns(doc)
    table = [head, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = [header_line(doc), verdict_line(doc), ""]
    lines += ["  ".join(c.rjust(widths[i]) for i, c in enumerate(r)) for r in table]
    lines.append("")
    lines += _attach_lines(doc)
    lines += [f"warning: {w}" for w in doc.get("warnings", ())]
    return "\n".join(lines).rstrip() + "\n"


def render_markdown(doc: Mapping[str, Any]) -> str:
    head, rows = columns(doc)
    out = ["# diagnose sweep", "", md.text(header_line(doc)), "", f"**{md.text(verdict_line(doc))}**", ""]
    out += md.table(head, [[md.cell(c) for c in r] for r in rows])
    out.append("")
    att = _attach_lines(doc)
    if att:
        out += ["## Diagnosis at the knee", "", *[md.text(x.strip()) for x in att], ""]
    if doc.get("warnings"):
        out += ["## Warnings", "", *[f"- {md.text(w)}" for w in doc["warnings"]], ""]
    return "\n".join(out)


def chart(doc: Mapping[str, Any]) -> Chart:
    """Throughput and p99 against concurrency, the knee marked."""
    title = "Throughput and p99 latency against concurrency"
    steps = [s for s in doc.get("steps", ()) if s.get("p99_ms") is not None]
    if not steps:
        return Chart(title, None, "No step of the sweep answered: nothing to draw.")
    x = [s["concurrency"] for s in steps]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=x, y=[s["throughput_rps"] for s in steps], name="throughput (req/s)",
                             mode="lines+markers", line={"color": "#2166ac"}), secondary_y=False)
    fig.add_trace(go.Scatter(x=x, y=[s["p99_ms"] for s in steps], name="p99 (ms)", mode="lines+markers",
                             line={"color": "#b2182b"}), secondary_y=True)
    fig.add_trace(go.Scatter(x=x, y=[s["p50_ms"] for s in steps], name="p50 (ms)", mode="lines+markers",
                             line={"color": "#ef8a62", "dash": "dot"}), secondary_y=True)
    knee = doc.get("knee")
    if knee:
        fig.add_vline(x=knee["concurrency"], line={"color": "#444", "dash": "dash"},
                      annotation_text=f"knee: {knee['concurrency']} clients", annotation_position="top left")
    fig.update_xaxes(type="log", title_text="concurrent clients", tickvals=x, ticktext=[str(v) for v in x])
    fig.update_yaxes(title_text="requests/s", secondary_y=False, rangemode="tozero")
    fig.update_yaxes(title_text="latency (ms)", secondary_y=True, rangemode="tozero")
    fig.update_layout(title={"text": title, "x": 0.01}, template=TEMPLATE, height=420,
                      legend={"orientation": "h", "y": -0.2}, margin={"l": 60, "r": 60, "t": 50, "b": 40})
    return Chart(title, fig)


def render_html(doc: Mapping[str, Any]) -> str:
    from diagnose.reports.document import html_page, table
    from diagnose.reports.html import e

    head, rows = columns(doc)
    sections = [("steps", "Steps", table(head, rows, set(range(1, len(head)))))]
    att = _attach_lines(doc)
    if att:
        sections.append(("knee", "Diagnosis at the knee", "<ul>" + "".join(f"<li>{e(x.strip())}</li>" for x in att)
                         + "</ul>"))
    if doc.get("warnings"):
        sections.append(("warnings", "Warnings", "<ul>" + "".join(f"<li>{e(w)}</li>" for w in doc["warnings"])
                         + "</ul>"))
    return html_page(title=f"diagnose sweep — {doc['url']}", heading="diagnose sweep", sub=header_line(doc),
                     verdict=verdict_line(doc), verdict_class="" if doc.get("knee") else "thin", sections=sections,
                     charts_first=[chart(doc)], embedded=json.dumps(doc, ensure_ascii=False), embedded_id="sweep")
