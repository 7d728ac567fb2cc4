"""The Fleet and Sweep pages: documents written by ``diagnose fleet`` / ``diagnose sweep --format json``.

Data and charts come from ``diagnose.reports.fleet`` and ``diagnose.reports.sweep`` (the same functions as the HTML
report); nothing here computes a number of its own. Each page opens with the empty-state guard: no
document of its kind given → what to run to get one.
"""

from __future__ import annotations

import os
from typing import Any

import pandas as pd
import streamlit as st

from diagnose.cli_fleet import load_document
from diagnose.dashboard import state
from diagnose.dashboard.views import show_chart, table
from diagnose.errors import DiagnoseError
from diagnose.reports import fleet as render_fleet
from diagnose.reports import markdown
from diagnose.reports import sweep as render_sweep

FLEET_SCHEMA = "diagnose/fleet/v1"
SWEEP_SCHEMA = "diagnose/sweep/v1"


@st.cache_data(max_entries=16, show_spinner="Reading the document…")
def _read(path: str, stamp: int) -> tuple[dict[str, Any] | None, str]:
    del stamp  # part of the cache key only
    try:
        doc = load_document(path)
    except DiagnoseError as exc:
        return None, str(exc)
    return (doc, "") if doc is not None else (None, f"{path} does not exist.")


def _documents(schema: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    docs, errors = [], []
    for path in state.document_paths():
        try:
            stamp = os.stat(path).st_mtime_ns
        except OSError:
            stamp = 0
        doc, error = _read(path, stamp)
        if doc is None:
            errors.append(error)
        elif doc.get("schema") == schema:
            docs.append((path, doc))
    return docs, errors


def _pick(docs: list[tuple[str, dict[str, Any]]], key: str) -> dict[str, Any]:
    if len(docs) == 1:
        st.caption(os.path.basename(docs[0][0]))
        return docs[0][1]
    names = {p: os.path.basename(p) for p, _ in docs}
    chosen = st.selectbox("Document", [p for p, _ in docs], format_func=names.__getitem__, key=key)
    return dict(docs)[chosen]


def _banner(verdict: str, text: str) -> None:
    if verdict in ("bottleneck", "knee"):
        st.error(markdown.text(text))
    elif verdict == "healthy":
        st.success(markdown.text(text))
    else:
        st.warning(markdown.text(text))


def fleet_page() -> None:
    st.title("Fleet")
    docs, errors = _documents(FLEET_SCHEMA)
    for e in errors:
        st.error(e)
    if not docs:
        st.info("No fleet document was given. Write one with `diagnose fleet --prometheus URL --format json -o "
                "fleet.json` and start `diagnose dashboard fleet.json` (sessions can be given alongside).")
        return
    doc = _pick(docs, state.StateKeys.FLEET)
    st.caption(markdown.text(render_fleet.header_line(doc)))
    _banner(doc["verdict"], render_fleet.verdict_line(doc))
    judged = [r for r in doc["replicas"] if r.get("verdict")]
    cols = st.columns(3)
    cols[0].metric("Replicas", len(doc["replicas"]))
    cols[1].metric("Judged", len(judged))
    cols[2].metric("Outliers", len(doc["outliers"]))
    show_chart(render_fleet.heatmap(doc), key="fleet-heatmap")

    st.header("Replicas")
    rows = render_fleet.rows(doc)
    table(pd.DataFrame(rows, columns=render_fleet.HEADER))
    st.header("Outliers")
    if doc["outliers"]:
        table(pd.DataFrame([{"replica": o["instance"], "kind": o["kind"], "why": o["message"]}
                            for o in doc["outliers"]]))
    else:
        st.markdown("No replica stands out: no queue ten times the median, no throttling, XID or other tenant.")
    st.header("Load and headroom")
    st.markdown(f"- Load balance: {markdown.text(doc['imbalance']['message'])}.\n"
                f"- Headroom: {markdown.text(doc['headroom']['message'])}.")
    if doc.get("where_to_look"):
        st.markdown("**Where to look**\n\n" + "\n".join(f"{n}. {markdown.text(t)}"
                                                          for n, t in enumerate(doc["where_to_look"], 1)))
    if doc.get("problems"):
        st.warning("Partial answer: " + "; ".join(markdown.text(p) for p in doc["problems"]))

    st.header("One replica")
    names = [r["instance"] for r in doc["replicas"]]
    labels = {r["instance"]: render_fleet.replica_label(r) for r in doc["replicas"]}
    chosen = st.selectbox("Replica", names, format_func=labels.__getitem__, key=state.StateKeys.FLEET_REPLICA)
    rep = next(r for r in doc["replicas"] if r["instance"] == chosen)
    if rep.get("missing"):
        st.info(f"Not judged: {markdown.text(rep['missing'])}.")
        return
    show_chart(render_fleet.replica_chart(doc, chosen), key="fleet-replica")
    if rep["findings"]:
        table(pd.DataFrame([{"code": f["code"], "category": f["category"], "severity": f["severity"],
                             "title": f["title"], "message": f["message"]} for f in rep["findings"]]))
    else:
        st.markdown(f"No finding: verdict **{rep['verdict']}**.")
    if rep.get("key_numbers"):
        table(pd.DataFrame([{"key": k, "value": v} for k, v in rep["key_numbers"].items()]))


def sweep_page() -> None:
    st.title("Sweep")
    docs, errors = _documents(SWEEP_SCHEMA)
    for e in errors:
        st.error(e)
    if not docs:
        st.info("No sweep document was given. Write one with `diagnose sweep URL --format json -o sweep.json` "
                "and start `diagnose dashboard sweep.json`.")
        return
    doc = _pick(docs, state.StateKeys.SWEEP)
    st.caption(markdown.text(render_sweep.header_line(doc)))
    _banner("knee" if doc.get("knee") else "no_knee", render_sweep.verdict_line(doc))
    show_chart(render_sweep.chart(doc), key="sweep-chart")
    st.header("Steps")
    head, rows = render_sweep.columns(doc)
    table(pd.DataFrame(rows, columns=head))
    att = (doc.get("knee") or {}).get("diagnosis") or doc.get("attach")
    if att:
        st.header("Diagnosis at the knee" if doc.get("knee") else "Diagnosis at the top step")
        what = att["primary"] or att["verdict"]
        title = f" — {att['title']}" if att["title"] else ""
        st.markdown(markdown.text(f"pid {att['pid']} at {att['concurrency']} client(s): {what}{title}"))
        if att["findings"]:
            table(pd.DataFrame([{"code": f["code"], "severity": f["severity"], "title": f["title"]}
                                for f in att["findings"]]))
    for w in doc.get("warnings", ()):
        st.warning(markdown.text(w))
