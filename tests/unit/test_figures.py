"""diagnose.reports.figures: each chart shows the session's tables, or says what is missing and how to get it."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from pathlib import Path

import plotly.graph_objects as go
import pytest

from diagnose import tables
from diagnose.collectors.timing import FIRST_REQUESTS
from diagnose.reports import data, figures
from diagnose.reports.data import make_table
from tests import sessions

MIB = 1 << 20
GIB = float(1 << 30)
ALL: list[Callable[[data.SessionData], figures.Chart]] = [
    figures.findings_impact, *(fn for fns in figures.PAGES.values() for fn in fns)]


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> data.SessionData:
    return tables.load(sessions.gpu_session(tmp_path_factory.mktemp("gpu")))


@pytest.fixture(scope="module")
def demo() -> data.SessionData:
    return tables.load(sessions.demo_session())


@pytest.fixture(scope="module")
def empty(tmp_path_factory: pytest.TempPathFactory) -> data.SessionData:
    return tables.load(sessions.empty_session(tmp_path_factory.mktemp("empty")))


def _fig(chart: figures.Chart) -> go.Figure:
    assert chart.figure is not None, chart.missing
    return chart.figure


def test_pages_are_the_planned_ones() -> None:
    assert list(figures.PAGES) == ["Timeline", "Requests", "CPU profile", "GPU", "Memory"]
    assert len(ALL) == 15 and len(set(ALL)) == 15


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_every_chart_draws_the_gpu_session_and_serialises(fn: Callable[[data.SessionData], figures.Chart],
                                                          gpu: data.SessionData) -> None:
    chart = fn(gpu)
    fig = _fig(chart)
    assert chart.title and fig.data
    doc = json.loads(fig.to_json())
    assert doc["data"] and doc["layout"]["title"]["text"] == chart.title
    assert chart.missing == ""


@pytest.mark.parametrize("fn", ALL, ids=lambda f: f.__name__)
def test_every_chart_of_an_empty_session_says_what_is_missing(fn: Callable[[data.SessionData], figures.Chart],
                                                              empty: data.SessionData) -> None:
    chart = fn(empty)
    assert chart.figure is None and not chart.ok
    assert chart.missing.startswith("No ") and len(chart.missing) > 40


def test_no_secret_in_any_figure(gpu: data.SessionData, empty: data.SessionData) -> None:
    for d in (gpu, empty):
        for chart in figures.all_charts(d):
            text = (chart.figure.to_json() if chart.figure else "") + chart.title + chart.missing
            assert "sk-diagnose" not in text, chart.title


def test_findings_impact(gpu: data.SessionData) -> None:
    fig = _fig(figures.findings_impact(gpu))
    bars = {y: x for tr in fig.data for x, y in zip(tr.x, tr.y, strict=True)}
    assert len(bars) == len(gpu.diagnosis.findings)
    for f in gpu.diagnosis.findings:
        assert any(y.startswith(f.code) and x == pytest.approx(100 * f.impact, abs=0.05) for y, x in bars.items())
    assert {tr.name for tr in fig.data} <= set(figures.SEVERITY_COLOURS)


def test_timeline_rows_and_event_markers(gpu: data.SessionData) -> None:
    fig = _fig(figures.timeline(gpu))
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:4] == ["GPU util %", "PCIe MB/s", "CPU cores", "requests"]
    util = next(tr for tr in fig.data if tr.name == "GPU 0 util %")
    assert list(util.y) == list(gpu.gpu["util_pct"])
    rx = next(tr for tr in fig.data if "host→GPU" in str(tr.name))
    assert list(rx.y) == pytest.approx(list(gpu.gpu["pcie_rx_bytes_s"] / 1e6))
    # one dashed line per timed event, across every row (bottom of the last to top of the first)
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert [s.x0 for s in lines] == pytest.approx(list(gpu.events["t"]))
    assert len(lines) == len(gpu.events) == 3
    assert {(s.yref, s.y0, s.y1) for s in lines} == {("paper", fig.layout.yaxis4.domain[0], fig.layout.yaxis.domain[1])}
    marks = [tr for tr in fig.data if str(tr.name).startswith("event:")]
    assert {tr.name for tr in marks} == {"event: recompile", "event: oom"}
    assert sorted(x for tr in marks for x in tr.text) == sorted(gpu.events["detail"])  # hover: each event's detail


def test_timeline_without_gpu_names_the_missing_rows(demo: data.SessionData) -> None:
    chart = figures.timeline(demo)
    fig = _fig(chart)
    assert [a.text for a in fig.layout.annotations] == ["CPU cores", "requests"]
    assert "GPU rows" in chart.missing and "no NVIDIA driver" in chart.missing
    cores = next(tr for tr in fig.data if "CPU cores" in str(tr.name))
    assert list(cores.y) == pytest.approx(list(demo.process["cpu_cores"].dropna()))


def test_stage_percentiles(demo: data.SessionData) -> None:
    fig = _fig(figures.stage_percentiles(demo))
    p50, p99 = fig.data
    assert list(p50.x) == list(demo.stage_stats["stage"])
    assert list(p50.y) == pytest.approx(list(demo.stage_stats["p50_ms"]))
    assert list(p99.y) == pytest.approx(list(demo.stage_stats["p99_ms"]))


def test_slow_requests_waterfall(demo: data.SessionData) -> None:
    fig = _fig(figures.slow_requests(demo, n=5))
    slow = demo.requests.nlargest(5, "e2e_ms")
    assert list(fig.data[0].y) == [f"#{s}" for s in slow["seq"]]  # keyed by the unique seq
    assert list(fig.layout.yaxis.tickvals) == list(fig.data[0].y)
    assert list(fig.layout.yaxis.ticktext) == [str(x) for x in slow["request_id"]]  # labelled by the request id
    assert [tr.name for tr in fig.data] == ["preprocess", "queue", "prefill", "decode"]
    totals = [sum(tr.x[i] for tr in fig.data) for i in range(5)]
    by_request = demo.stages.groupby("seq")["ms"].sum()
    assert totals == pytest.approx([by_request[r] for r in slow["seq"]])
    assert fig.layout.barmode == "stack"


def test_latency_vs_input(demo: data.SessionData) -> None:
    fig = _fig(figures.latency_vs_input(demo))
    e2e, ttft = fig.data
    assert list(e2e.x) == list(demo.requests["input_tokens"])
    assert list(e2e.y) == list(demo.requests["e2e_ms"])
    assert list(ttft.y) == list(demo.requests["ttft_ms"])


def test_cold_start_marks_the_first_requests(demo: data.SessionData) -> None:
    fig = _fig(figures.cold_start(demo))
    first, rest = fig.data
    assert list(first.x) == list(range(FIRST_REQUESTS))
    assert len(rest.x) == len(demo.requests) - FIRST_REQUESTS
    assert "steady-state median" in fig.layout.annotations[0].text


def test_cpu_icicle_adds_up_to_the_samples(demo: data.SessionData) -> None:
    fig = _fig(figures.cpu_icicle(demo))
    ic = fig.data[0]
    values = dict(zip(ic.ids, ic.values, strict=True))
    assert ic.values[0] == demo.profile["samples"].sum()
    assert ic.labels[0] == f"all {len(demo.profile)} stacks ({ic.values[0]} samples)"  # the table kept every stack
    children = [i for i, p in zip(ic.ids, ic.parents, strict=True) if p == ic.ids[0]]
    assert {ic.labels[int(i)] for i in children} == set(demo.profile["activity"])
    assert sum(values[i] for i in children) == ic.values[0]
    assert len(json.dumps(fig.to_plotly_json(), default=str)) < 200_000


def test_gpu_busy_from_nsight_then_nvml(gpu: data.SessionData, demo: data.SessionData) -> None:
    fig = _fig(figures.gpu_busy(gpu))
    kernels, copy_only, idle = fig.data
    b = gpu.gpu_busy.iloc[0]
    assert kernels.x[0] == pytest.approx(b["kernel_busy_ms"])
    assert kernels.x[0] + copy_only.x[0] == pytest.approx(b["busy_ms"])
    assert kernels.x[0] + copy_only.x[0] + idle.x[0] == pytest.approx(b["window_ms"])
    nvml_only = data.SessionData(path="x", label="x", diagnosis=gpu.diagnosis, t0=gpu.t0, window_s=gpu.window_s,
                                 gpu=gpu.gpu, missing={"gpu_busy": "No Nsight Systems timeline: none. Record one."})
    chart = figures.gpu_busy(nvml_only)
    busy, _ = _fig(chart).data
    assert busy.x[0] == pytest.approx(gpu.gpu["util_pct"].mean())
    assert "NVML" in chart.missing
    assert figures.gpu_busy(demo).figure is None


def test_gpu_timeline_draws_the_trace_busy_share_of_each_device(gpu: data.SessionData,
                                                                 demo: data.SessionData) -> None:
    # the session's PyTorch trace: an SGLang decode step on MI300X: the GPU idles ~0.46 s while the host blocks in
    # a synchronous copy, then one graph replay fills the last bins
    t = gpu.gpu_timeline
    assert len(t) == 200 and set(t["device"]) == {9}
    line = _fig(figures.gpu_timeline(gpu)).data[0]
    assert list(line.x) == pytest.approx(list(t["t_ms"])) and list(line.y) == pytest.approx(list(100 * t["busy_ratio"]))
    assert max(line.y[:190]) < 1 and min(line.y[-3:]) > 99  # idle, then the replay fills whole bins
    busy = float(next(e.value for e in gpu.diagnosis.evidence if e.key == "kineto.timeline")[0]["busy_ratio"])
    assert t["busy_ratio"].mean() == pytest.approx(busy, abs=0.01)  # the bins integrate to the device's busy share
    absent = figures.gpu_timeline(demo)
    assert absent.figure is None and "PyTorch-profiler trace" in absent.missing and "torch.profiler" in absent.missing


def test_gpu_timeline_shows_eight_devices_and_names_the_rest(gpu: data.SessionData) -> None:
    rows = [{**r, "rank": rank, "device": rank} for rank in range(10) for r in gpu.gpu_timeline.to_dict("records")]
    many = data.SessionData(path="x", label="x", diagnosis=gpu.diagnosis, t0=gpu.t0, window_s=gpu.window_s,
                            gpu_timeline=make_table("gpu_timeline", rows))
    chart = figures.gpu_timeline(many)
    assert len(_fig(chart).data) == figures.TIMELINE_ROWS == 8
    assert chart.missing == "8 of 10 devices shown (the first by rank and device)."
    assert [a.text for a in _fig(chart).layout.annotations][:2] == ["rank 0 · GPU 0", "rank 1 · GPU 1"]


def test_idle_gaps_top_kernels_copies(gpu: data.SessionData) -> None:
    gaps = _fig(figures.idle_gaps(gpu)).data[0]
    assert list(gaps.y) == list(gpu.gap_hist["count"])
    kern = _fig(figures.top_kernels(gpu)).data[0]
    assert list(kern.y) == ["add_parallel"] and kern.x[0] == pytest.approx(gpu.kernels["total_ms"].iloc[0])
    fig = _fig(figures.copies(gpu))
    mb = [y for tr in fig.data if tr.showlegend is not False for y in tr.y]
    assert sum(mb) == pytest.approx(gpu.copies["bytes"].sum() / 1e6)


def test_memory_breakdown(gpu: data.SessionData) -> None:
    fig = _fig(figures.memory_breakdown(gpu))
    names = [tr.name for tr in fig.data]
    assert names == ["weights", "activations", "fragmentation", "cached", "other", "outside_pytorch", "free"]
    assert sum(tr.x[0] for tr in fig.data) == pytest.approx(gpu.memory_breakdown["bytes"].sum() / GIB)


def test_memory_segments_of_the_snapshot(gpu: data.SessionData) -> None:
    # the fragmentation OOM snapshot: 2 GiB of weights in one segment, 20 segments of 512 MiB each split
    seg = gpu.memory_segments
    assert len(seg) == 21 and set(seg["state"]) == {"live", "split"}
    assert float(seg["free_bytes"].sum()) == pytest.approx(20 * 312 * MIB)
    chart = figures.memory_segments(gpu)
    fig = _fig(chart)
    assert [tr.name for tr in fig.data] == ["live", "free inside a live segment", "wholly free (cached)"]
    drawn = sum(sum(tr.x) for tr in fig.data)
    assert drawn == pytest.approx(float(seg["size_bytes"].sum()) / GIB)
    (note,) = fig.layout.annotations
    assert "6.09 GiB free inside live segments (fragmentation), 0 B in wholly free segments" in note.text
    assert fig.data[0].y[0].startswith("0x")  # largest first, named by address


def test_memory_over_time_probe_then_host_rss(gpu: data.SessionData, demo: data.SessionData) -> None:
    fig = _fig(figures.memory_over_time(gpu))
    names = [tr.name for tr in fig.data]
    assert names == ["cuda:0 allocated", "cuda:0 reserved", "cuda:0 weights", "event: oom", "event: recompile"]
    events = [s for s in fig.layout.shapes if s.yref == "paper"]
    assert [s.x0 for s in events] == pytest.approx(list(gpu.events["t"]))
    assert list(fig.data[1].y) == pytest.approx(list(gpu.memory["reserved_bytes"] / GIB))
    chart = figures.memory_over_time(demo)
    host = _fig(chart)
    assert "not GPU memory" in chart.title and "host RSS" in chart.missing
    assert list(host.data[0].y) == pytest.approx(list(demo.process["rss_bytes"] / GIB))


def test_charts_of_a_demo_without_gpu_evidence(demo: data.SessionData) -> None:
    for fn in (figures.idle_gaps, figures.top_kernels, figures.copies, figures.memory_breakdown):
        chart = fn(demo)
        assert chart.figure is None and chart.missing == demo.missing[
            {"idle_gaps": "gap_hist", "top_kernels": "kernels", "copies": "copies",
             "memory_breakdown": "memory_breakdown"}[fn.__name__]]


def test_all_charts_order(tmp_path: Path, demo: data.SessionData) -> None:
    charts = figures.all_charts(demo)
    assert [c.title for c in charts][:2] == ["Findings by impact", "Timeline"]
    assert len(charts) == len(ALL)


def _with_events(d: data.SessionData, n: int) -> data.SessionData:
    kinds = ("recompile", "oom", "preemption", "compile")
    rows = [{"t": d.window_s * i / n, "kind": kinds[i % 4], "detail": f"event {i}", "count": 1} for i in range(n)]
    return dataclasses.replace(d, events=make_table("events", rows))


def test_max_events_draw_one_marker_each(gpu: data.SessionData) -> None:
    """1,000 events (the table's cap): one line and one hover point each, set at once (add_vline per event
    copies every shape each time: 100 events took over a minute, 1,000 never finished)."""
    d = _with_events(gpu, tables.MAX_EVENTS)
    for fn in (figures.timeline, figures.memory_over_time):
        chart = fn(d)
        fig = _fig(chart)
        lines = [s for s in fig.layout.shapes if s.yref == "paper"]
        assert len(lines) == tables.MAX_EVENTS, fn.__name__
        marks = [tr for tr in fig.data if str(tr.name).startswith("event:")]
        assert sum(len(tr.x) for tr in marks) == tables.MAX_EVENTS
        assert {x for tr in marks for x in tr.text} == {f"event {i}" for i in range(tables.MAX_EVENTS)}
        assert chart.missing == ""


def test_events_without_a_time_are_named_not_drawn(gpu: data.SessionData) -> None:
    rows = [{"t": 1.0, "kind": "oom", "detail": "CUDA out of memory", "count": 1},
            {"t": math.nan, "kind": "recompile", "detail": "3 recompile(s) in log-1.log", "count": 3},
            {"t": math.nan, "kind": "preemption", "detail": "2 preemption(s) in log-1.log", "count": 2},
            {"t": gpu.window_s + 60, "kind": "oom", "detail": "later", "count": 1}]
    d = dataclasses.replace(gpu, events=make_table("events", rows))
    note = "3 recompiles and 2 preemptions without timestamps (not drawn). 1 OOM timed outside the window (not drawn)."
    assert figures.event_note(d) == note
    for fn in (figures.timeline, figures.memory_over_time):
        chart = fn(d)
        fig = _fig(chart)
        assert chart.missing == note
        assert [s.x0 for s in fig.layout.shapes if s.yref == "paper"] == [1.0]
        notes = [a for a in fig.layout.annotations if "without timestamps" in str(a.text)]
        assert len(notes) == 1 and "3 recompile(s) in log-1.log" in notes[0].hovertext
