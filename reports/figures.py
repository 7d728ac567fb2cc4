"""Plotly figures of a session: pure functions of ``SessionData`` (no streamlit, no I/O).

Each function returns a ``Chart``: a title, a figure, and ``missing``: when the evidence for the
chart is absent, ``figure`` is None and ``missing`` says what is absent and how to get it (the
sentence comes from ``SessionData.missing``). A chart that shows only part of what it could (the
timeline without GPU rows) has a figure and names the omitted part in ``missing``. The HTML report
and the dashboard call these same functions, through ``PAGES`` for the per-topic pages. Labels come
from the already-redacted tables, so a figure's JSON carries no secret.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from diagnose.reports.data import FIRST_REQUESTS, MEMORY_PARTS, SessionData
from diagnose.units import GIB, pct, size

TEMPLATE = "plotly_white"
MB = 1e6
SEVERITY_COLOURS = {"critical": "#b2182b", "major": "#ef8a62", "minor": "#fddbc7", "info": "#67a9cf"}
EVENT_COLOURS = {"oom": "#b2182b", "recompile": "#e08214", "preemption": "#8073ac", "compile": "#999999"}
EVENT_NOUNS = {"oom": ("OOM", "OOMs"), "recompile": ("recompile", "recompiles"),
               "preemption": ("preemption", "preemptions"), "compile": ("compile", "compiles")}
ICICLE_FRAMES = 12  # innermost frames shown per stack
ICICLE_NODES = 3_000


@dataclass(frozen=True)
class Chart:
    title: str
    figure: go.Figure | None
    missing: str = ""

    @property
    def ok(self) -> bool:
        return self.figure is not None


def _absent(title: str, why: str) -> Chart:
    return Chart(title, None, why or f"No data for “{title}” in this session.")


DEFAULT_HEIGHT = 420  # every figure carries a height: a responsive plot in a div without one collapses


def _layout(fig: go.Figure, title: str, height: int = DEFAULT_HEIGHT) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.01}, template=TEMPLATE, margin={"l": 60, "r": 20, "t": 50, "b": 40},
                      legend={"orientation": "h", "y": -0.15}, height=height)
    return fig


def _why(d: SessionData, *tables: str) -> str:
    return " ".join(dict.fromkeys(d.missing[t] for t in tables if t in d.missing))


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


# ---------------------------------------------------------------------------------------------
# overview
# ---------------------------------------------------------------------------------------------


def findings_impact(d: SessionData) -> Chart:
    title = "Findings by impact"
    findings = list(d.diagnosis.findings)
    if not findings:
        return _absent(title, "No findings: the rules found no bottleneck in the evidence of this session "
                              "(see the skipped rules for what could not be judged).")
    fig = go.Figure()
    order = [f"{f.code} {_short(f.title, 50)}" for f in findings]
    for sev in ("critical", "major", "minor", "info"):
        chosen = [f for f in findings if f.severity.value == sev]
        if not chosen:
            continue
        fig.add_trace(go.Bar(
            name=sev, orientation="h", marker_color=SEVERITY_COLOURS[sev],
            x=[round(100 * f.impact, 1) for f in chosen], y=[f"{f.code} {_short(f.title, 50)}" for f in chosen],
            customdata=[[f.label, f.confidence.value] for f in chosen],
            hovertemplate="%{y}<br>impact %{x:.0f} %<br>%{customdata[0]} · confidence %{customdata[1]}<extra>"
                          + sev + "</extra>"))
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(order)))
    fig.update_xaxes(title="estimated impact (% of the problem)", range=[0, 100])
    return Chart(title, _layout(fig, title, height=max(250, 60 + 40 * len(findings))))


# ---------------------------------------------------------------------------------------------
# timeline
# ---------------------------------------------------------------------------------------------


def timeline(d: SessionData) -> Chart:
    title = "Timeline"
    rows: list[tuple[str, list[go.Scatter]]] = []
    omitted: list[str] = []
    if d.has("gpu"):
        traces = [go.Scatter(x=g["t"], y=g["util_pct"], name=f"GPU {gpu} util %", mode="lines")
                  for gpu, g in d.gpu.groupby("gpu", sort=True)]
        rows.append(("GPU util %", traces))
        pcie: list[go.Scatter] = []
        for gpu, g in d.gpu.groupby("gpu", sort=True):
            if g["pcie_rx_bytes_s"].notna().any() or g["pcie_tx_bytes_s"].notna().any():
                pcie.append(go.Scatter(x=g["t"], y=g["pcie_rx_bytes_s"] / MB, name=f"GPU {gpu} PCIe host→GPU MB/s",
                                       mode="lines"))
                pcie.append(go.Scatter(x=g["t"], y=g["pcie_tx_bytes_s"] / MB, name=f"GPU {gpu} PCIe GPU→host MB/s",
                                       mode="lines"))
        if pcie:
            rows.append(("PCIe MB/s", pcie))
        else:
            omitted.append("PCIe: NVML gave no PCIe throughput reading.")
    else:
        omitted.append(f"GPU rows: {d.missing.get('gpu', '')}")
    proc = d.process.dropna(subset=["cpu_cores"]) if d.has("process") else d.process
    if not proc.empty:
        traces = [go.Scatter(x=g["t"], y=g["cpu_cores"], name=f"{name} ({pid}) CPU cores", mode="lines")
                  for (pid, name), g in proc.groupby(["pid", "name"], sort=True)]
        rows.append(("CPU cores", traces))
    else:
        omitted.append(f"CPU row: {d.missing.get('process', 'no CPU readings between two process samples.')}")
    if d.has("inflight"):
        rows.append(("requests", [
            go.Scatter(x=d.inflight["t"], y=d.inflight["inflight"], name="in-flight requests", mode="lines"),
            go.Scatter(x=d.inflight["t"], y=d.inflight["accept_queue"], name="accept queue", mode="lines"),
        ]))
    else:
        omitted.append(f"Request row: {d.missing.get('inflight', '')}")
    why = " ".join(omitted)
    if not rows:
        return _absent(title, "No timeline data: neither GPU, CPU nor request readings over time. " + why)
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[r[0] for r in rows])
    for i, (label, traces) in enumerate(rows, start=1):
        for tr in traces:
            fig.add_trace(tr, row=i, col=1)
        fig.update_yaxes(title_text=label, row=i, col=1)
    fig.update_xaxes(title_text="seconds since the window began", row=len(rows), col=1)
    fig.update_xaxes(range=[0, max(d.window_s, 1e-3)])
    bottom = fig.layout[f"yaxis{len(rows)}" if len(rows) > 1 else "yaxis"].domain[0]
    note = _event_markers(fig, d, span=(bottom, fig.layout.yaxis.domain[1]), row=1)
    return Chart(title, _layout(fig, title, height=220 * len(rows) + 80), " ".join(x for x in (why, note) if x))


# ---------------------------------------------------------------------------------------------
# requests
# ---------------------------------------------------------------------------------------------


def stage_percentiles(d: SessionData) -> Chart:
    title = "Stage latency p50 / p99"
    if not d.has("stage_stats"):
        return _absent(title, _why(d, "stage_stats"))
    s = d.stage_stats
    fig = go.Figure([
        go.Bar(name="p50", x=s["stage"], y=s["p50_ms"], hovertemplate="%{x}: p50 %{y:,.1f} ms<extra></extra>"),
        go.Bar(name="p99", x=s["stage"], y=s["p99_ms"], hovertemplate="%{x}: p99 %{y:,.1f} ms<extra></extra>"),
    ])
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="ms")
    return Chart(title, _layout(fig, title))


def slow_requests(d: SessionData, n: int = 10) -> Chart:
    title = f"The {n} slowest requests, by stage"
    if not d.has("requests") or not d.has("stages"):
        return _absent(title, _why(d, "requests", "stages"))
    slow = d.requests.nlargest(n, "e2e_ms")
    # keyed by ``seq`` (unique): two workers' logs both number their requests r-1, r-2, …
    seqs = list(slow["seq"])
    keys = [f"#{s}" for s in seqs]
    labels = [str(x) for x in slow["request_id"]]
    where = [[label, str(src)] for label, src in zip(labels, slow["source"], strict=True)]
    st = d.stages[d.stages["seq"].isin(seqs)]
    stage_order = list(st.sort_values("position")["stage"].drop_duplicates())
    fig = go.Figure()
    for stage in stage_order:
        part = st[st["stage"] == stage].groupby("seq")["ms"].sum()
        fig.add_trace(go.Bar(name=stage, orientation="h", y=keys, x=[float(part.get(s, 0.0)) for s in seqs],
                             customdata=where,
                             hovertemplate="%{customdata[0]} (%{customdata[1]}): " + stage
                                           + " %{x:,.1f} ms<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_yaxes(type="category", categoryorder="array", categoryarray=list(reversed(keys)), tickmode="array",
                     tickvals=keys, ticktext=labels, title="request")
    fig.update_xaxes(title="ms")
    return Chart(title, _layout(fig, title, height=max(300, 80 + 30 * len(keys))))


def latency_vs_input(d: SessionData) -> Chart:
    title = "Latency against input size"
    r = d.requests.dropna(subset=["input_tokens"]) if d.has("requests") else d.requests
    if r.empty:
        why = _why(d, "requests") or ("No input sizes: the stage log has no `input_tokens` field. Pass "
                                      "`input_tokens=` to `probe.request(...)` (or log it per request).")
        return _absent(title, why)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=r["input_tokens"], y=r["e2e_ms"], mode="markers", name="end-to-end",
                             text=r["request_id"],
                             hovertemplate="%{text}: %{x:,.0f} tokens, %{y:,.0f} ms<extra></extra>"))
    if r["ttft_ms"].notna().any():
        fig.add_trace(go.Scatter(x=r["input_tokens"], y=r["ttft_ms"], mode="markers", name="time to first token",
                                 text=r["request_id"],
                                 hovertemplate="%{text}: %{x:,.0f} tokens, TTFT %{y:,.0f} ms<extra></extra>"))
    fig.update_xaxes(title="input tokens")
    fig.update_yaxes(title="ms")
    return Chart(title, _layout(fig, title))


def cold_start(d: SessionData) -> Chart:
    title = "Latency by arrival order (cold start)"
    if not d.has("requests"):
        return _absent(title, _why(d, "requests"))
    r = d.requests.sort_values("order")
    first = r[r["order"] < FIRST_REQUESTS]
    rest = r[r["order"] >= FIRST_REQUESTS]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=first["order"], y=first["e2e_ms"], mode="markers", name=f"first {FIRST_REQUESTS}",
                             marker={"size": 10, "color": "#d6604d"}, text=first["request_id"],
                             hovertemplate="%{text}: #%{x}, %{y:,.0f} ms<extra></extra>"))
    fig.add_trace(go.Scatter(x=rest["order"], y=rest["e2e_ms"], mode="markers", name="after",
                             marker={"color": "#4393c3"}, text=rest["request_id"],
                             hovertemplate="%{text}: #%{x}, %{y:,.0f} ms<extra></extra>"))
    if not rest.empty:
        median = float(rest["e2e_ms"].median())
        fig.add_hline(y=median, line_dash="dot", annotation_text=f"steady-state median {median:,.0f} ms")
    fig.update_xaxes(title="request, in arrival order")
    fig.update_yaxes(title="end-to-end ms")
    return Chart(title, _layout(fig, title))


# ---------------------------------------------------------------------------------------------
# CPU profile
# ---------------------------------------------------------------------------------------------


def cpu_icicle(d: SessionData) -> Chart:
    title = "Where the Python threads spend their active time (py-spy)"
    if not d.has("profile"):
        return _absent(title, _why(d, "profile"))
    # node key (parent id, depth, label) → id; ids stay short so the figure's JSON stays small
    ids: dict[tuple[str, int, str], str] = {}
    labels: list[str] = [_stacks_label(d)]
    parents: list[str] = [""]
    values: list[int] = [int(d.profile["samples"].sum())]
    for row in d.profile.itertuples(index=False):
        samples = int(row.samples)
        frames = tuple(row.frames)
        path = [str(row.activity), f"{row.process} [{row.pid}]", str(row.thread)]
        if len(frames) > ICICLE_FRAMES:
            path.append("…")
            frames = frames[-ICICLE_FRAMES:]
        path.extend(frames)
        parent = "0"
        for depth, label in enumerate(path):
            key = (parent, depth, label)
            node = ids.get(key)
            if node is None:
                if len(labels) >= ICICLE_NODES:
                    break
                node = ids[key] = str(len(labels))
                labels.append(_short(label, 80))
                parents.append(parent)
                values.append(0)
            values[int(node)] += samples
            parent = node
    fig = go.Figure(go.Icicle(
        ids=[str(i) for i in range(len(labels))], labels=labels, parents=parents, values=values,
        branchvalues="total", maxdepth=5,
        hovertemplate="%{label}<br>%{value} samples (%{percentRoot:.1%})<extra></extra>"))
    return Chart(title, _layout(fig, title, height=600))


def _stacks_label(d: SessionData) -> str:
    """The icicle's root: the stacks it shows and their share of all samples (the table keeps the top ones)."""
    kept, kept_samples = len(d.profile), int(d.profile["samples"].sum())
    total = max(d.profile_samples, kept_samples)
    if d.profile_stacks <= kept or total <= kept_samples:
        return f"all {kept:,} stacks ({kept_samples:,} samples)"
    pct = 100.0 * kept_samples / total
    shown = f"{pct:.0f}" if pct < 99.5 else f"{min(pct, 99.9):.1f}"
    return f"top {kept:,} of {d.profile_stacks:,} stacks ({shown} % of {total:,} samples)"


# ---------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------


def gpu_busy(d: SessionData) -> Chart:
    title = "GPU busy vs idle"
    if d.has("gpu_busy"):
        b = d.gpu_busy
        labels = [f"GPU {r.device} {_short(str(r.name), 30)}" for r in b.itertuples(index=False)]
        kernel = b["kernel_busy_ms"]
        copy_only = (b["busy_ms"] - b["kernel_busy_ms"]).clip(lower=0)
        idle = (b["window_ms"] - b["busy_ms"]).clip(lower=0)
        fig = go.Figure([
            go.Bar(name="kernels", y=labels, x=kernel, orientation="h", marker_color="#1a9850"),
            go.Bar(name="copies / memsets only", y=labels, x=copy_only, orientation="h", marker_color="#fee08b"),
            go.Bar(name="idle", y=labels, x=idle, orientation="h", marker_color="#d73027"),
        ])
        fig.update_layout(barmode="stack")
        fig.update_xaxes(title="ms of the GPU-active window (Nsight Systems)")
        return Chart(title, _layout(fig, title, height=max(250, 120 + 50 * len(labels))))
    if d.has("gpu"):
        util = d.gpu.groupby("gpu")["util_pct"].mean()
        labels = [f"GPU {g}" for g in util.index]
        fig = go.Figure([
            go.Bar(name="busy (NVML utilisation)", y=labels, x=util.values, orientation="h", marker_color="#1a9850"),
            go.Bar(name="idle", y=labels, x=(100 - util).clip(lower=0).values, orientation="h",
                   marker_color="#d73027"),
        ])
        fig.update_layout(barmode="stack")
        fig.update_xaxes(title="% of the window (mean NVML utilisation: a kernel ran during the sample period)",
                         range=[0, 100])
        return Chart(title, _layout(fig, title, height=max(250, 120 + 50 * len(labels))),
                     f"From NVML utilisation, not a timeline: {d.missing.get('gpu_busy', '')}".strip())
    return _absent(title, _why(d, "gpu_busy", "gpu"))


TIMELINE_ROWS = 8  # devices (ranks) drawn one under the other; more are named in the note


def gpu_timeline(d: SessionData) -> Chart:
    title = "GPU busy over time (PyTorch-profiler trace)"
    if not d.has("gpu_timeline"):
        return _absent(title, _why(d, "gpu_timeline"))
    t = d.gpu_timeline
    groups = list(t.groupby(["rank", "device"], sort=True, dropna=False))
    shown = groups[:TIMELINE_ROWS]
    labels = []
    for (rank, device), g in shown:
        name = _short(str(g["name"].iloc[0]), 28)
        head = "" if pd.isna(rank) else f"rank {rank:.0f} · "
        labels.append(f"{head}GPU {device:.0f}" + (f" {name}" if name else ""))
    fig = make_subplots(rows=len(shown), cols=1, shared_xaxes=True, vertical_spacing=min(0.08, 0.3 / len(shown)),
                        subplot_titles=labels)
    for i, ((_rank, _device), g) in enumerate(shown, start=1):
        fig.add_trace(go.Scatter(x=g["t_ms"], y=100 * g["busy_ratio"], mode="lines", line_shape="hvh",
                                 fill="tozeroy", line={"width": 1, "color": "#1a9850"}, showlegend=False,
                                 name=labels[i - 1], hovertemplate="%{x:,.1f} ms: busy %{y:.0f} %<extra></extra>"),
                      row=i, col=1)
        fig.update_yaxes(range=[0, 100], title_text="busy %", row=i, col=1)
    fig.update_xaxes(title_text="ms from the device's first GPU operation (each bin: the share of it in which a "
                                "kernel, copy or memset runs)", row=len(shown), col=1)
    note = (f"{len(shown)} of {len(groups)} devices shown (the first by rank and device)."
            if len(groups) > len(shown) else "")
    return Chart(title, _layout(fig, title, height=max(260, 90 + 150 * len(shown))), note)


def idle_gaps(d: SessionData) -> Chart:
    title = "GPU idle gaps by length (Nsight Systems)"
    if not d.has("gap_hist") or not (d.gap_hist["count"] > 0).any():
        return _absent(title, _why(d, "gap_hist") or "No idle gap between GPU operations in the Nsight export.")
    fig = go.Figure()
    for dev, g in d.gap_hist.groupby("device", sort=True):
        fig.add_trace(go.Bar(name=f"GPU {dev}", x=g["bucket"], y=g["count"], customdata=g["total_ms"],
                             hovertemplate="%{x}: %{y} gaps, %{customdata:,.2f} ms idle<extra></extra>"))
    fig.update_xaxes(title="gap length")
    fig.update_yaxes(title="gaps")
    return Chart(title, _layout(fig, title))


def top_kernels(d: SessionData, n: int = 15) -> Chart:
    title = f"Top {n} CUDA kernels by GPU time"
    if not d.has("kernels"):
        return _absent(title, _why(d, "kernels"))
    k = d.kernels.nlargest(n, "total_ms")
    names = [_short(str(x), 70) for x in k["name"]]
    fig = go.Figure(go.Bar(
        orientation="h", y=names, x=k["total_ms"], text=[pct(s) for s in k["share"]],
        customdata=list(zip(k["count"], k["tiny_count"], strict=True)),
        hovertemplate="%{y}<br>%{x:,.2f} ms in %{customdata[0]} launches (%{customdata[1]} under 10 µs)"
                      "<extra></extra>"))
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(names)))
    fig.update_xaxes(title="total ms")
    return Chart(title, _layout(fig, title, height=max(250, 80 + 28 * len(names))))


def copies(d: SessionData) -> Chart:
    title = "Memory copies by direction and host memory"
    if not d.has("copies"):
        return _absent(title, _why(d, "copies"))
    c = d.copies.groupby(["direction", "host_kind"], as_index=False)[["count", "bytes", "ms"]].sum()
    fig = make_subplots(rows=1, cols=2, subplot_titles=["MB copied", "ms spent"])
    for i, (kind, g) in enumerate(c.groupby("host_kind", sort=True)):
        colour = ["#4393c3", "#d6604d", "#5aae61", "#9970ab", "#bf812d", "#35978f"][i % 6]
        fig.add_trace(go.Bar(name=str(kind), x=g["direction"], y=g["bytes"] / MB, marker_color=colour,
                             legendgroup=str(kind), customdata=g["count"],
                             hovertemplate="%{x} " + str(kind)
                             + ": %{y:,.1f} MB in %{customdata} copies<extra></extra>"),
                      row=1, col=1)
        fig.add_trace(go.Bar(name=str(kind), x=g["direction"], y=g["ms"], marker_color=colour, legendgroup=str(kind),
                             showlegend=False, hovertemplate="%{x} " + str(kind) + ": %{y:,.2f} ms<extra></extra>"),
                      row=1, col=2)
    fig.update_layout(barmode="group")
    return Chart(title, _layout(fig, title))


# ---------------------------------------------------------------------------------------------
# memory
# ---------------------------------------------------------------------------------------------


def memory_breakdown(d: SessionData) -> Chart:
    title = "GPU memory by use"
    if not d.has("memory_breakdown"):
        return _absent(title, _why(d, "memory_breakdown"))
    m = d.memory_breakdown
    fig = go.Figure()
    for part in MEMORY_PARTS:
        rows = m[m["part"] == part]
        if rows.empty:
            continue
        fig.add_trace(go.Bar(name=part, orientation="h", y=["memory"], x=[float(rows["bytes"].sum()) / GIB],
                             customdata=[str(rows["source"].iloc[0])],
                             hovertemplate=part + ": %{x:,.2f} GiB<br>%{customdata}<extra></extra>"))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="GiB")
    fig.update_yaxes(showticklabels=False)
    return Chart(title, _layout(fig, title, height=260))


MAX_SEGMENTS = 60


def memory_segments(d: SessionData) -> Chart:
    """The snapshot's segments, largest first: live memory, free blocks inside live segments, wholly free ones."""
    title = "Allocator segments (CUDA memory snapshot)"
    if not d.has("memory_segments"):
        return _absent(title, _why(d, "memory_segments"))
    m = d.memory_segments.sort_values("size_bytes", ascending=False, kind="stable")
    shown = m.head(MAX_SEGMENTS)
    labels = [f"{r.segment} ({r.pool})" if r.pool != "default" else str(r.segment) for r in shown.itertuples()]
    split_free = [float(r.free_bytes) if r.state in ("split", "expandable") else 0.0 for r in shown.itertuples()]
    whole_free = [float(r.free_bytes) if r.state == "free" else 0.0 for r in shown.itertuples()]
    fig = go.Figure()
    for name, values in (("live", [float(v) for v in shown["live_bytes"]]), ("free inside a live segment", split_free),
                         ("wholly free (cached)", whole_free)):
        fig.add_trace(go.Bar(name=name, orientation="h", y=labels, x=[v / GIB for v in values],
                             hovertemplate=name + ": %{x:,.3f} GiB<extra>%{y}</extra>"))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title="GiB")
    fig.update_yaxes(autorange="reversed", title="segment (address)")
    total, split, cached = (float(m["size_bytes"].sum()), float(m.loc[m["state"] == "split", "free_bytes"].sum()),
                            float(m.loc[m["state"] == "free", "free_bytes"].sum()))
    note = (f"{len(m):,} segments, {size(total)} reserved: {size(split)} free inside live segments "
            f"(fragmentation), {size(cached)} in wholly free segments (cache)"
            + (f"; the {MAX_SEGMENTS} largest are drawn" if len(m) > MAX_SEGMENTS else "") + ".")
    fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=1.0, yanchor="bottom", showarrow=False,
                       align="left", font={"size": 11})
    return Chart(title, _layout(fig, title, height=max(280, 14 * len(shown) + 140)))


def memory_over_time(d: SessionData) -> Chart:
    title = "GPU memory over time (CUDA caching allocator)"
    if d.has("memory") and d.memory["t"].notna().any():
        m = d.memory.dropna(subset=["t"])
        fig = go.Figure()
        for dev, g in m.groupby("device", sort=True):
            for col, label in (("allocated_bytes", "allocated"), ("reserved_bytes", "reserved"),
                               ("weights_bytes", "weights")):
                if g[col].notna().any() and (col != "weights_bytes" or (g[col] > 0).any()):
                    fig.add_trace(go.Scatter(x=g["t"], y=g[col] / GIB, mode="lines+markers",
                                             name=f"cuda:{dev} {label}"))
            total = g["total_bytes"].dropna()
            if not total.empty:
                fig.add_hline(y=float(total.iloc[-1]) / GIB, line_dash="dot",
                              annotation_text=f"cuda:{dev} capacity")
        fig.update_xaxes(title="seconds since the window began", range=[0, max(d.window_s, 1e-3)])
        fig.update_yaxes(title="GiB")
        note = _event_markers(fig, d, span=(0.0, 1.0))
        return Chart(title, _layout(fig, title), note)
    if d.has("process") and d.process["rss_bytes"].notna().any():
        host_title = "Host memory (RSS) over time: not GPU memory"
        fig = go.Figure()
        for (pid, name), g in d.process.groupby(["pid", "name"], sort=True):
            fig.add_trace(go.Scatter(x=g["t"], y=g["rss_bytes"] / GIB, mode="lines", name=f"{name} ({pid}) RSS"))
        fig.update_xaxes(title="seconds since the window began")
        fig.update_yaxes(title="GiB (host RSS)")
        return Chart(host_title, _layout(fig, host_title),
                     f"Showing host RSS, not GPU memory. {d.missing.get('memory', '')}".strip())
    return _absent(title, _why(d, "memory", "process"))


# ---------------------------------------------------------------------------------------------
# event markers (timeline, memory over time)
# ---------------------------------------------------------------------------------------------


def event_split(d: SessionData) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The events (drawn, untimed, outside): in the window, with no time, timed outside the window."""
    e = d.events
    if e.empty:
        return e, e, e
    t = pd.to_numeric(e["t"], errors="coerce")
    inside = t.between(0.0, max(float(d.window_s), 0.0))
    return e[inside], e[t.isna()], e[t.notna() & ~inside]


def _kinds(events: pd.DataFrame) -> str:
    """``3 recompiles and 2 preemptions``: the occurrences the rows stand for, by kind."""
    counts = pd.to_numeric(events["count"], errors="coerce").fillna(1).clip(lower=1)
    by_kind = counts.groupby(events["kind"].astype(str), sort=False).sum()
    order = [k for k in EVENT_NOUNS if k in by_kind.index] + [k for k in by_kind.index if k not in EVENT_NOUNS]
    parts = []
    for kind in order:
        n = int(by_kind[kind])
        one, many = EVENT_NOUNS.get(kind, (kind, kind + "s"))
        parts.append(f"{n:,} {one if n == 1 else many}")
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def event_note(d: SessionData) -> str:
    """The events a chart cannot place on its time axis, in one or two sentences (or "")."""
    _, untimed, outside = event_split(d)
    notes = []
    if not untimed.empty:
        notes.append(f"{_kinds(untimed)} without timestamps (not drawn).")
    if not outside.empty:
        notes.append(f"{_kinds(outside)} timed outside the window (not drawn).")
    return " ".join(notes)


def _event_markers(fig: go.Figure, d: SessionData, span: tuple[float, float], row: int | None = None) -> str:
    """One dashed line per event in the window, all added at once, with a hover marker per event
    (a trace per kind); the events that cannot be placed are named in a note. Returns the note.

    The lines are layout shapes from ``span[0]`` to ``span[1]`` of the plotting area (paper
    coordinates: across every row of a figure with shared x axes). They are set in one
    ``update_layout``: ``add_vline`` per event copies every shape each time (1,000 events never end).
    """
    if not d.has("events"):
        return ""
    drawn, untimed, _ = event_split(d)
    note = event_note(d)
    if note:
        details = "<br>".join(str(x) for x in untimed["detail"].head(10))
        fig.add_annotation(text=note.replace(". ", ".<br>"), xref="paper", yref="paper", x=1.0, y=1.0,
                           xanchor="right", yanchor="bottom", showarrow=False, align="right",
                           font={"size": 11, "color": "#5b6475"}, hovertext=details or None)
    if drawn.empty:
        return note
    shapes = [{"type": "line", "xref": "x", "yref": "paper", "x0": t, "x1": t, "y0": span[0], "y1": span[1],
               "line": {"dash": "dash", "width": 1, "color": EVENT_COLOURS.get(str(kind), "#444444")}}
              for t, kind in zip(drawn["t"].astype(float), drawn["kind"], strict=True)]
    fig.update_layout(shapes=[*fig.layout.shapes, *shapes])
    for kind, g in drawn.groupby("kind", sort=True):  # a legend entry per event kind, the details on hover
        trace = go.Scatter(x=g["t"], y=[0] * len(g), mode="markers", name=f"event: {kind}",
                           marker={"symbol": "x", "size": 10, "color": EVENT_COLOURS.get(str(kind), "#444")},
                           text=g["detail"], hovertemplate="%{text}<extra>" + str(kind) + "</extra>")
        if row is None:
            fig.add_trace(trace)
        else:
            fig.add_trace(trace, row=row, col=1)
    return note


# ---------------------------------------------------------------------------------------------
# pages
# ---------------------------------------------------------------------------------------------

ChartFn = Callable[[SessionData], Chart]

# the per-topic pages; the Overview page shows ``findings_impact`` (with the findings themselves)
PAGES: dict[str, list[ChartFn]] = {
    "Timeline": [timeline],
    "Requests": [stage_percentiles, slow_requests, latency_vs_input, cold_start],
    "CPU profile": [cpu_icicle],
    "GPU": [gpu_busy, gpu_timeline, idle_gaps, top_kernels, copies],
    "Memory": [memory_breakdown, memory_segments, memory_over_time],
}


def all_charts(d: SessionData) -> list[Chart]:
    """The overview chart and every chart of every page, in page order."""
    return [findings_impact(d), *(fn(d) for fns in PAGES.values() for fn in fns)]
