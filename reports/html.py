"""The HTML report: ONE self-contained file that opens anywhere, offline.

* plotly.js is inlined once (``plotly.offline.get_plotlyjs()``); nothing is fetched from a CDN,
  the page has no external ``src``/``href`` at all (the plotly logo link is turned off).
* The diagnosis JSON (``diagnose.reports.json_report``, the source of truth) is embedded in
  ``<script type="application/json" id="diagnosis">`` so that tools can read it back from the file.
* The verdict, findings (evidence, fixes), request stages, capture health, skipped rules and the
  environment are plain HTML; the charts are the functions of ``diagnose.reports.figures`` (the dashboard's),
  each followed by its ``missing`` sentence when the session lacks the evidence for it.

Escaping: every string from the session or a rule goes through ``html.escape``; every JSON
document inside a ``<script>`` has ``<``, ``>`` and ``&`` written as ``\\u003c``/``\\u003e``/``\\u0026``
(still the same JSON), so a value such as ``</script><script>…`` can neither end the block nor
start markup. The command line is redacted again, in case the session was not written by
``diagnose attach``. Deterministic: no current time, no temporary paths (sources by file name).
"""

from __future__ import annotations

import dataclasses
import html
import json
from typing import TYPE_CHECKING

from diagnose.model import Diagnosis, Finding, Verdict
from diagnose.redact import redact_argv
from diagnose.reports import json_report, markdown
from diagnose.reports.markdown import (
    first_sentence,
    format_value,
    primary_finding,
    source_name,
    verdict_title,
)
from diagnose.reports.wording import differential_rows, healthy_text, probability_text, undetermined_text, watch_lines
from diagnose.stage_stats import stage_rows
from diagnose.units import pct

if TYPE_CHECKING:
    from diagnose.reports.data import SessionData
    from diagnose.reports.figures import Chart

PLOTLY_CONFIG = {"responsive": True, "displaylogo": False, "showLink": False, "showSendToCloud": False,
                 "showEditInChartStudio": False}

_CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#d9dde5; --bg:#fafbfc; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       background: var(--bg); margin: 0; }
main { max-width: 1200px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 26px; margin: 0 0 8px; } h2 { font-size: 20px; margin: 36px 0 12px;
  border-bottom: 1px solid var(--line); padding-bottom: 4px; } h3 { font-size: 16px; margin: 0 0 6px; }
nav { display: flex; flex-wrap: wrap; gap: 14px; margin: 12px 0 4px; font-size: 14px; }
nav a { color: #2453a6; text-decoration: none; }
.verdict { font-size: 18px; padding: 14px 18px; border-radius: 6px; background: #fff;
           border-left: 6px solid #b2182b; margin: 12px 0; }
.verdict.none { border-left-color: #2ca02c; }
.verdict.thin { border-left-color: #e0a800; }
.sub { color: var(--muted); font-size: 14px; }
.finding { background: #fff; border: 1px solid var(--line); border-left: 6px solid #999; border-radius: 6px;
           padding: 14px 18px; margin: 14px 0; }
.sev-critical { border-left-color: #b2182b; } .sev-major { border-left-color: #ef8a62; }
.sev-minor { border-left-color: #e6c36a; } .sev-info { border-left-color: #67a9cf; }
.badge { display: inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; background: #eef0f4;
         margin-right: 4px; }
pre { background: #f3f4f7; padding: 8px 12px; border-radius: 4px; overflow-x: auto; font-size: 13px; }
code { font-size: 13px; background: #f3f4f7; padding: 0 3px; border-radius: 3px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 14px; background: #fff; }
th, td { border: 1px solid var(--line); padding: 4px 10px; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
.chart { background: #fff; border: 1px solid var(--line); border-radius: 6px; margin: 14px 0; padding: 6px; }
.missing { color: var(--muted); font-style: italic; background: #fff; border: 1px dashed var(--line);
           border-radius: 6px; padding: 10px 14px; margin: 10px 0; }
.missing b { font-style: normal; color: var(--fg); }
footer { color: var(--muted); font-size: 13px; margin-top: 48px; }
"""

_BOOT = """
(function () {
  var blocks = document.querySelectorAll('script[type="application/json"][data-chart]');
  for (var i = 0; i < blocks.length; i++) {
    var fig = JSON.parse(blocks[i].textContent);
    var config = JSON.parse(document.getElementById('plotly-config').textContent);
    Plotly.newPlot(document.getElementById(blocks[i].getAttribute('data-chart')), fig.data, fig.layout, config);
  }
})();
"""


def e(s: object) -> str:
    """Escape for HTML text and attribute values."""
    return html.escape(str(s), quote=True)


def script_json(doc_text: str) -> str:
    """JSON text made safe inside a ``<script>`` block (``</script>``, ``<!--`` cannot appear)."""
    return doc_text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _table(header: list[str], rows: list[list[str]], num: set[int] | None = None) -> str:
    """Cells must already be escaped."""
    num = num or set()
    head = "".join(f'<th{" class=num" if i in num else ""}>{h}</th>' for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in num else ""}>{c}</td>' for i, c in enumerate(r))
                   + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def differential_html(d: Diagnosis) -> str:
    """The candidates, best first, with what speaks for and against each and the check that separates it."""
    if not d.candidates:
        return ""
    rows = [[e(v) for v in row] for row in differential_rows(d)]
    return ('<h3>Differential</h3><div id="differential">'
            + _table(["candidate", "probability", "for", "against", "check that separates it"], rows, {1}) + "</div>")


def watch_html(d: Diagnosis) -> str:
    """A ``diagnose watch`` session's trigger and what rose before it (``wording.watch_lines``)."""
    lines = watch_lines(d)
    if not lines:
        return ""
    return '<h3>Before the trigger</h3><ul id="watch-before">' + "".join(f"<li>{e(x)}</li>" for x in lines) + "</ul>"


def verdict_html(d: Diagnosis) -> str:
    primary = d.primary
    f = primary_finding(d)
    sure = e(probability_text(d))
    if primary is None or f is None:
        if d.overall is Verdict.HEALTHY:
            return (f'<p class="verdict none" id="verdict"><b>Verdict: healthy</b>{sure} — {e(healthy_text(d))}</p>'
                    + differential_html(d) + watch_html(d))
        steps = "".join(f"<li>{e(s)}</li>" for s in d.next_steps)
        return (f'<p class="verdict thin" id="verdict"><b>Verdict: undetermined</b> — {e(undetermined_text(d))}</p>'
                + (f'<h3>Next steps</h3><ol id="next-steps">{steps}</ol>' if steps else "") + differential_html(d)
                + watch_html(d))
    steps = "".join(f"<li>{e(s)}</li>" for s in d.next_steps)
    return (f'<p class="verdict" id="verdict"><b>Verdict: the bottleneck is <code>{e(primary.value)}</code></b>'
            f"{sure} — "
            f"{e(first_sentence(f.message))} <span class=sub>(impact {pct(f.impact)}, {e(f.severity.value)}, "
            f"confidence {e(f.confidence.value)}; {e(f.code)})</span></p>"
            + (f'<h3>To confirm it, measure</h3><ol id="next-steps">{steps}</ol>' if steps else "")
            + differential_html(d) + watch_html(d))


def finding_html(n: int, f: Finding, primary: bool) -> str:
    parts = [f'<article class="finding sev-{e(f.severity.value)}" id="finding-{e(f.code)}">',
             f"<h3>{n}. {e(f.code)} {e(f.name)} — {e(f.title)}{' (primary)' if primary else ''}</h3>",
             f"<p><span class=badge>{e(f.severity.value)}</span><span class=badge>confidence "
             f"{e(f.confidence.value)}</span><span class=badge>impact {pct(f.impact)}</span>"
             f"<span class=badge>{e(f.label)}</span></p>",
             f"<p>{e(' '.join(f.message.split()))}</p>"]
    if f.why:
        parts.append(f"<pre>{e(f.why)}</pre>")
    rows = [[f"<code>{e(ev.key)}</code>", e(format_value(ev.value, ev.unit)), e(source_name(ev.source))]
            for ev in f.evidence if not isinstance(ev.value, list | dict)]
    if rows:
        parts.append("<h4>Evidence</h4>" + _table(["key", "value", "source"], rows, {1}))
    if f.fixes:
        items = []
        for fix in f.fixes:
            steps = "".join(f"<li>{e(s)}</li>" for s in fix.steps)
            items.append(f"<li><b>{e(fix.summary)}</b> <span class=sub>(risk: {e(fix.risk.value.replace('_', ' '))})"
                         f"</span>{f'<ul>{steps}</ul>' if steps else ''}</li>")
        parts.append(f"<h4>Fixes</h4><ol>{''.join(items)}</ol>")
    parts.append("</article>")
    return "".join(parts)


class _Charts:
    """Numbers the chart blocks and holds their JSON for the boot script."""

    def __init__(self) -> None:
        self.n = 0

    def block(self, chart: Chart) -> str:
        out = []
        if chart.figure is not None:
            self.n += 1
            cid = f"chart-{self.n}"
            # plotly sizes the inner div itself; padding and borders live on the wrapper
            out.append(f'<div class="chart"><div id="{cid}" role="img" aria-label="{e(chart.title)}"></div></div>'
                       f'<script type="application/json" data-chart="{cid}">{script_json(chart.figure.to_json())}'
                       "</script>")
            if chart.missing:
                out.append(f'<p class="missing"><b>Not shown:</b> {e(chart.missing)}</p>')
        else:
            out.append(f'<p class="missing"><b>{e(chart.title)}:</b> {e(chart.missing)}</p>')
        return "".join(out)


def _health(d: Diagnosis) -> str:
    out = []
    if d.captures:
        rows = [[e(c.collector), e(c.status.value), e(c.reason or "-"), e(c.remedy or "-")] for c in d.captures]
        out.append("<h3>Captures</h3>" + _table(["collector", "status", "reason", "remedy"], rows))
    bad = [i for i in d.inputs if i.status != "ok"]
    if bad:
        rows = [[e(source_name(i.path)), e(i.kind), e(i.status), e(i.reason or "-")] for i in bad]
        out.append("<h3>Inputs not fully read</h3>" + _table(["input", "kind", "status", "reason"], rows))
    if d.skipped:
        by_reason: dict[str, list[str]] = {}
        for s in d.skipped:
            by_reason.setdefault(s.reason, []).append(s.code)
        rows = [[e(", ".join(codes)), e(reason)] for reason, codes in by_reason.items()]
        out.append(f"<h3>Rules skipped ({len(d.skipped)}, not enough evidence)</h3>" + _table(["rules", "why"], rows))
    return "".join(out) or "<p>Every capture completed.</p>"


def _environment(d: Diagnosis) -> str:
    rows = [[e(label), f"<code>{e(value)}</code>" if as_code else e(value)]
            for label, value, as_code in markdown.environment(d)]
    return _table(["", ""], rows)


def _stages(d: Diagnosis) -> str:
    rows = stage_rows(d)
    if not rows:
        return ""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:,.1f}"

    body = [[e(s), ms(p50), ms(p99), "-" if share is None else pct(share)] for s, p50, p99, share in rows]
    return "<h3>Request stages</h3>" + _table(["stage", "p50 (ms)", "p99 (ms)", "share of latency"], body, {1, 2, 3})


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")


def _redacted(d: Diagnosis) -> Diagnosis:
    if d.target is None or not d.target.cmdline:
        return d
    return dataclasses.replace(d, target=dataclasses.replace(d.target, cmdline=redact_argv(d.target.cmdline)))


def render(data: SessionData) -> str:
    """The whole report as one HTML document."""
    import plotly.offline

    from diagnose.reports import figures

    d = _redacted(data.diagnosis)
    charts = _Charts()
    sections: list[tuple[str, str, str]] = []  # (id, title, body)

    lead = primary_finding(d)
    findings = "".join(finding_html(n, f, f is lead) for n, f in enumerate(d.findings, 1))
    findings = findings or "<p>No rule found a problem in the evidence given.</p>"
    sections.append(("overview", "Findings", charts.block(figures.findings_impact(data)) + findings + _stages(d)))
    for page, fns in figures.PAGES.items():
        sections.append((_slug(page), page, "".join(charts.block(fn(data)) for fn in fns)))
    sections.append(("health", "Capture health", _health(d)))
    sections.append(("environment", "Environment", _environment(d)))

    nav = "".join(f'<a href="#{sid}">{e(title)}</a>' for sid, title, _ in sections)
    body = "".join(f'<section id="{sid}"><h2>{e(title)}</h2>{content}</section>' for sid, title, content in sections)
    head_title = f"diagnose: {data.label} — {verdict_title(d)}"
    window = f" · {data.window_s:.1f} s window" if data.window_s else ""
    pid = f" · pid {d.target.pid}" if d.target else ""
    return "".join([
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{e(head_title)}</title><style>{_CSS}</style>",
        f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>',
        f'<script type="application/json" id="diagnosis">{script_json(json_report.render(d).strip())}</script>',
        f'<script type="application/json" id="plotly-config">{script_json(json.dumps(PLOTLY_CONFIG))}</script>',
        "</head><body><main>",
        f"<h1>diagnose report: {e(data.label)}</h1>",
        f"<p class=sub>{e(f'diagnose {d.tool_version}{pid}{window}')}</p>",
        verdict_html(d),
        f"<nav>{nav}</nav>",
        body,
        f"<footer>Generated by diagnose {e(d.tool_version)}. The diagnosis JSON is embedded in this file "
        "(<code>script#diagnosis</code>).</footer>",
        f"</main><script>{_BOOT}</script></body></html>\n",
    ])
