"""diagnose.tables → diagnose.reports.data: a session as tables, checked against the raw files through the repo's own
parsers; and the layering that keeps the presenters (reports, dashboard) off the collectors."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import os
import shutil
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from diagnose import tables
from diagnose.collectors import nsys, nvml, process, pyspy, snapshot
from diagnose.collectors.compile_log import CompileLogParser
from diagnose.derive import series
from diagnose.derive.activities import Activity, classify
from diagnose.errors import InputError
from diagnose.reports import data, figures
from diagnose.stage_stats import stage_rows
from tests import sessions

DEMO = sessions.demo_session()
GIB = 1 << 30


@pytest.fixture(scope="module")
def demo() -> data.SessionData:
    return tables.load(DEMO)


@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return sessions.gpu_session(tmp_path_factory.mktemp("gpu"))


@pytest.fixture(scope="module")
def gpu(gpu_dir: str) -> data.SessionData:
    return tables.load(gpu_dir)


def _stage_lines(path: str) -> list[dict[str, object]]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if '"stages_ms"' in line]


def _check_shape(d: data.SessionData) -> None:
    """Every table exists with its columns; ``missing`` names exactly the empty ones, with a remedy."""
    for name in data.TABLES:
        frame = d.table(name)
        assert list(frame.columns) == list(data.COLUMNS[name]), name
        if d.has(name):
            assert name not in d.missing, name
        else:
            assert frame.empty
            why = d.missing.get(name, "")
            assert why.startswith("No ") and why.endswith("."), (name, why)
            assert len(why.split(". ")) >= 2, (name, why)  # what is absent, then how to get it
    assert set(d.missing) <= set(data.TABLES)


# -- a recorded CPU-only demo session ----------------------------------------------------------


def test_demo_requests_are_the_stage_log_lines(demo: data.SessionData) -> None:
    lines = _stage_lines(os.path.join(DEMO, "log-0-stages.jsonl"))
    r = demo.requests.set_index("request_id")
    assert len(demo.requests) == len(lines) == 11
    assert sorted(demo.requests["order"]) == list(range(len(lines)))
    for doc in lines:
        row = r.loc[str(doc["request_id"])]
        assert row["e2e_ms"] == pytest.approx(doc["e2e_ms"])
        assert row["ttft_ms"] == pytest.approx(doc["ttft_ms"])
        assert row["input_tokens"] == doc["input_tokens"]
        assert row["t_end"] == pytest.approx(float(doc["ts"]) - demo.t0)
        stages = demo.stages[demo.stages["seq"] == row["seq"]].sort_values("position")
        assert set(stages["request_id"]) == {doc["request_id"]}
        assert list(stages["stage"]) == list(doc["stages_ms"])
        assert list(stages["ms"]) == pytest.approx(list(doc["stages_ms"].values()))
    # arrival order: the earliest start (completion − latency) is order 0
    start = demo.requests["t_end"] - demo.requests["e2e_ms"] / 1000
    assert demo.requests.loc[start.idxmin(), "order"] == 0
    assert demo.requests["seq"].is_unique and set(demo.requests["source"]) == {"log-0-stages.jsonl"}


def test_demo_stage_stats_are_the_terminal_rows(demo: data.SessionData) -> None:
    rows = stage_rows(demo.diagnosis)
    assert list(demo.stage_stats["stage"]) == [r[0] for r in rows] == ["decode", "prefill", "queue", "preprocess"]
    assert list(demo.stage_stats["p99_ms"]) == pytest.approx([r[2] for r in rows])
    assert demo.stage_stats["share"].sum() == pytest.approx(1.0, abs=0.01)


def test_demo_process_cores_are_bounded_and_match_cpu_times(demo: data.SessionData) -> None:
    samples = process.read_samples(os.path.join(DEMO, process.SAMPLES_FILE))
    p = demo.process
    assert len(p) == sum(len(s["processes"]) for s in samples)
    assert demo.host_cores == 2
    cores = p["cpu_cores"].dropna()
    assert len(cores) == len(p) - p["pid"].nunique()  # the first sample of each process has no interval
    assert ((cores >= 0) & (cores <= demo.host_cores)).all()
    assert cores.mean() > 0.5  # the demo's model worker is busy
    # the whole window: CPU seconds over wall seconds, as the process evidence reports it
    a, b = samples[0]["processes"][0], samples[-1]["processes"][0]
    wall = samples[-1]["ts"] - samples[0]["ts"]
    expected = (b["cpu_user"] + b["cpu_system"] - a["cpu_user"] - a["cpu_system"]) / wall
    dt = p["t"].diff().iloc[1:]
    assert float((cores * dt.values).sum() / dt.sum()) == pytest.approx(expected, rel=0.05)
    assert p["t"].between(-1, demo.window_s + 1).all()
    assert (p["rss_bytes"] > 100 * 2**20).all()
    assert set(p["pid"]) == {demo.diagnosis.target.pid if demo.diagnosis.target else -1}


def test_demo_inflight_is_the_connection_count(demo: data.SessionData) -> None:
    samples = process.read_samples(os.path.join(DEMO, process.SAMPLES_FILE))
    assert list(demo.inflight["inflight"]) == [s["conn"]["inflight"] for s in samples]
    assert list(demo.inflight["accept_queue"]) == [s["conn"]["accept_queue"] for s in samples]


def test_demo_profile_keeps_every_sample_and_classifies_it(demo: data.SessionData) -> None:
    with open(os.path.join(DEMO, pyspy.RAW_FILE), encoding="utf-8") as fh:
        raw = pyspy.parse_raw(fh)
    prof = demo.profile
    assert prof["samples"].sum() == sum(s.count for s in raw)
    assert set(prof["activity"]) <= {a.value for a in Activity}
    assert all(isinstance(f, tuple) and f for f in prof["frames"])
    top = max(raw, key=lambda s: s.count)
    assert prof.iloc[0]["samples"] == top.count
    assert prof.iloc[0]["activity"] == classify([(f.function, f.file) for f in top.frames]).value
    forward = prof.loc[prof["activity"] == "forward", "samples"].sum() / prof["samples"].sum()
    share = next(e.value for e in demo.diagnosis.evidence if e.key == "cpu.forward_share")
    assert forward == pytest.approx(share)


def test_demo_metrics_are_the_two_scrapes(demo: data.SessionData) -> None:
    with open(os.path.join(DEMO, "metrics-0.prom"), encoding="utf-8") as fh:
        values = [float(line.split()[-1]) for line in fh if line.startswith("vllm:request_success_total")]
    assert len(values) == 2
    row = demo.metrics.set_index("name").loc["requests_success"]
    assert (row["first"], row["last"], row["delta"]) == (values[0], values[1], values[1] - values[0])
    assert row["kind"] == "counter"


def test_demo_gpu_tables_are_empty_and_say_why(demo: data.SessionData) -> None:
    _check_shape(demo)
    for name in ("gpu", "gpu_processes"):
        assert "no NVIDIA driver" in demo.missing[name] and "GPU host" in demo.missing[name]
    for name in ("kernels", "copies", "gpu_busy", "gap_hist"):
        assert "nsys launch" in demo.missing[name]
    assert "torch_probe.install" in demo.missing["memory"]
    assert "_dump_snapshot" in demo.missing["memory_breakdown"]
    assert not any(demo.has(t) for t in ("gpu", "kernels", "memory", "memory_breakdown", "events"))


@pytest.mark.parametrize("name", sessions.DEMOS)
def test_every_demo_session_loads_with_consistent_tables(name: str) -> None:
    d = tables.load(sessions.demo_session(name))
    _check_shape(d)
    assert d.label == name
    assert d.has("process") and d.has("profile")
    cores = d.process["cpu_cores"].dropna()
    assert ((cores >= 0) & (cores <= (d.host_cores or 0))).all()
    with_log = os.path.exists(os.path.join(sessions.demo_session(name), "log-0-stages.jsonl"))
    assert d.has("requests") == with_log
    if not with_log:
        assert "no log of the service" in d.missing["requests"] and "--log PATH" in d.missing["requests"]


# -- the GPU session ---------------------------------------------------------------------------


def test_gpu_session_carries_the_gpu_findings(gpu: data.SessionData) -> None:
    codes = {f.code for f in gpu.diagnosis.findings}
    assert {"GPU001", "GPU101", "MEM003"} <= codes
    assert all(i.status == "ok" for i in gpu.diagnosis.inputs), gpu.diagnosis.inputs
    _check_shape(gpu)
    assert gpu.missing == {}


def test_gpu_session_nvml_table_is_the_recording(gpu: data.SessionData, gpu_dir: str) -> None:
    samples = nvml.read_samples(os.path.join(gpu_dir, sessions.NVML_FILE))
    g = gpu.gpu
    assert len(g) == len(samples) == 60
    assert list(g["util_pct"]) == [s["devices"][0]["util_gpu_pct"] for s in samples]
    assert list(g["pcie_rx_bytes_s"]) == [s["devices"][0]["pcie_rx_kbps"] * 1024 for s in samples]
    assert list(g["power_w"]) == pytest.approx([s["devices"][0]["power_mw"] / 1000 for s in samples])
    assert g["t"].between(0, gpu.window_s).all()
    assert set(g["name"]) == {"NVIDIA A10G"}
    assert (g["mem_total_bytes"] == sessions.A10G_TOTAL).all()
    procs = gpu.gpu_processes
    assert procs.to_dict("records") == [{"gpu": 0, "pid": 4242, "name": "python3", "used_bytes": 15357444096.0,
                                         "is_target": True}]


def test_gpu_session_nsight_tables_match_read_export(gpu: data.SessionData) -> None:
    trace = nsys.read_export(sessions.NSYS_EXPORT)
    top = trace.kernels[0]
    k = gpu.kernels.iloc[0]
    assert (k["name"], k["count"], k["tiny_count"]) == (top.name, top.count, top.tiny_count)
    assert k["total_ms"] == pytest.approx(top.total_ns / 1e6)
    assert gpu.kernels["share"].sum() == pytest.approx(1.0)
    assert gpu.copies["bytes"].sum() == sum(c.bytes for c in trace.copies) == 1_200_000_000
    assert set(zip(gpu.copies["direction"], gpu.copies["host_kind"], strict=True)) == {("h2d", "pinned"),
                                                                                       ("d2h", "pinned")}
    dev = trace.devices[0]
    b = gpu.gpu_busy.iloc[0]
    assert b["busy_ms"] == pytest.approx(dev.busy_ns / 1e6)
    assert b["window_ms"] == pytest.approx(dev.window_ns / 1e6)
    assert b["gaps"] == dev.gaps.count == gpu.gap_hist["count"].sum()
    assert list(gpu.gap_hist["bucket"]) == list(nsys.GAP_BUCKETS)


def test_gpu_session_memory_over_time_is_the_probe(gpu: data.SessionData) -> None:
    lines = sessions.probe_lines(gpu.t0, gpu.t0 + gpu.window_s)
    states = [ln for ln in lines if "cuda_memory" in ln] + [ln for ln in lines if "oom" in ln]
    m = gpu.memory
    assert len(m) == len(states) == sessions.PROBE_STATES + 1
    assert list(m["t"]) == pytest.approx([s["ts"] - gpu.t0 for s in states])
    assert m["reserved_bytes"].is_monotonic_increasing
    assert (m["weights_bytes"] == sessions.WEIGHTS).all()
    assert m["reserved_bytes"].iloc[-1] == 12_884_901_888


def test_gpu_session_memory_breakdown_is_the_snapshot(gpu: data.SessionData) -> None:
    b = snapshot.load_breakdown(sessions.SNAPSHOT)
    parts = gpu.memory_breakdown.groupby("part")["bytes"].sum()
    assert parts["weights"] == b.weights_bytes == sessions.WEIGHTS
    assert parts["activations"] == b.activations_bytes
    assert parts["fragmentation"] == b.inactive_bytes
    assert parts["free"] == sessions.OOM_FREE  # what CUDA reported free at the OOM (the probe)
    assert parts.sum() == pytest.approx(sessions.A10G_TOTAL)
    assert set(parts.index) <= set(data.MEMORY_PARTS)


def test_gpu_session_events_are_the_recompiles_and_the_oom(gpu: data.SessionData) -> None:
    e = gpu.events
    assert list(e["kind"]) == ["recompile", "recompile", "oom"]
    assert list(e["count"]) == [1, 1, 1]
    lines = sessions.probe_lines(gpu.t0, gpu.t0 + gpu.window_s)
    compile_ts = [ln["ts"] - gpu.t0 for ln in lines if "compile" in ln]
    assert list(e["t"][:2]) == pytest.approx(compile_ts)
    assert "size mismatch" in e["detail"].iloc[0]
    assert e["detail"].iloc[2].startswith("CUDA out of memory. Tried to allocate 1.00 GiB")
    assert e["t"].between(0, gpu.window_s).all()


def test_no_secret_reaches_a_table(gpu: data.SessionData, gpu_dir: str) -> None:
    with open(os.path.join(gpu_dir, "pyspy.raw"), encoding="utf-8") as fh:
        assert sessions.SECRET in fh.read()  # the fixture does carry it
    for name in data.TABLES:
        assert "sk-diagnose" not in gpu.table(name).to_csv(), name  # not even a cut-off piece of it
    assert all(p.startswith("/work/main/.venv/bin/python3 -m examples.service") for p in gpu.profile["process"])
    assert sessions.SECRET not in data.capture_table(gpu).to_csv()
    assert sessions.SECRET not in data.findings_table(gpu).to_csv()


def test_summary_tables(gpu: data.SessionData) -> None:
    caps = data.capture_table(gpu)
    assert list(caps.columns) == ["collector", "status", "reason", "remedy", "files"]
    assert list(caps["collector"]) == [c.collector for c in gpu.diagnosis.captures]
    assert "nsys-window.sqlite" in caps.set_index("collector").loc["nsys", "files"]
    f = data.findings_table(gpu)
    assert list(f.columns) == ["rank", "code", "category", "severity", "confidence", "impact", "title"]
    assert list(f["rank"]) == list(range(1, len(gpu.diagnosis.findings) + 1))
    assert list(f["code"]) == [x.code for x in gpu.diagnosis.findings]
    assert f["impact"].between(0, 1).all()


# -- inputs --------------------------------------------------------------------------------------


def test_packed_session_gives_the_same_tables(gpu: data.SessionData, gpu_dir: str, tmp_path: Path) -> None:
    packed = sessions.pack(gpu_dir, str(tmp_path))
    d = tables.load(packed)
    assert d.path == packed and d.label == "gpu_session"
    for name in data.TABLES:
        pd.testing.assert_frame_equal(d.table(name), gpu.table(name), obj=name)
    assert [f.code for f in d.diagnosis.findings] == [f.code for f in gpu.diagnosis.findings]
    # sources and inputs are named after the archive, never the private extraction that is gone now
    named = [e.source for e in d.diagnosis.evidence] + [i.path for i in d.diagnosis.inputs]
    assert any(n.startswith(packed + os.sep) for n in named)
    assert not any("diagnose-session-" in n for n in named)


@pytest.mark.parametrize("kind", ["absent", "no_manifest", "plain_file", "corrupt_tar", "bad_manifest"])
def test_bad_input_is_one_input_error(kind: str, tmp_path: Path) -> None:
    path = tmp_path / "x"
    if kind == "no_manifest":
        path.mkdir()
    elif kind == "plain_file":
        path = tmp_path / "notes.txt"
        path.write_text("hello")
    elif kind == "corrupt_tar":
        path = tmp_path / "s.tar.gz"
        path.write_bytes(b"\x1f\x8b not really gzip")
    elif kind == "bad_manifest":
        path.mkdir()
        (path / "manifest.json").write_text('{"schema": "something/else"}')
    with pytest.raises(InputError) as err:
        tables.load(str(path))
    assert err.value.message and err.value.remedy


def test_tar_without_a_session_is_an_input_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "notes.txt").write_text("x")
    out = tmp_path / "a.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(tmp_path / "a", arcname="a")
    with pytest.raises(InputError):
        tables.load(str(out))


def test_empty_session_has_every_table_empty_with_the_capture_reasons(tmp_path: Path) -> None:
    d = tables.load(sessions.empty_session(tmp_path))
    _check_shape(d)
    assert not any(d.has(t) for t in data.TABLES)
    assert d.missing["profile"] == "No CPU profile: py-spy is not installed. Pip install py-spy (it ships as a wheel)."
    assert "not permitted to read process 4242" in d.missing["process"]
    assert "Run diagnose on the GPU host" in d.missing["gpu"]


def test_damaged_process_file_empties_its_table_with_a_reason(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    shutil.copytree(DEMO, folder)
    (folder / "process.jsonl").write_text("not json\n{\"ts\": 1}\n")
    d = tables.load(str(folder))
    assert not d.has("process") and not d.has("inflight")
    assert "no readable sample" in d.missing["process"]
    assert d.has("profile") and d.has("requests")


def test_unreadable_file_empties_its_tables_and_names_the_error(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    shutil.copytree(DEMO, folder)
    (folder / "process-info.json").write_text("{not json")
    d = tables.load(str(folder))
    _check_shape(d)
    assert not d.has("process") and not d.has("inflight")
    assert "could not be read (JSONDecodeError" in d.missing["process"]
    assert "could not be read" in d.missing["inflight"]
    assert d.has("profile") and d.has("requests")


def test_requests_are_bounded_to_the_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "s"
    shutil.copytree(DEMO, folder)
    t0 = json.loads((folder / "manifest.json").read_text())["window"]["start"]
    with open(folder / "log-0-stages.jsonl", "w", encoding="utf-8") as fh:
        for i in range(130):
            fh.write(json.dumps({"ts": t0 + i * 0.05, "request_id": f"q-{i}", "status": "ok",
                                 "stages_ms": {"queue": 1.0, "prefill": 2.0 + i}, "e2e_ms": 3.0 + i}) + "\n")
    monkeypatch.setattr(tables, "MAX_REQUESTS", 50)
    d = tables.load(str(folder))
    assert list(d.requests["request_id"]) == [f"q-{i}" for i in range(80, 130)]
    assert sorted(d.requests["order"]) == list(range(50))
    assert len(d.stages) == 100 and set(d.stages["request_id"]) == set(d.requests["request_id"])
    assert math.isnan(d.requests["ttft_ms"].iloc[0])


def test_load_rejects_an_empty_path() -> None:
    with pytest.raises(InputError):
        tables.load("")


# -- two workers, lost files, events with and without a time, bounds ------------------------------


def _stage_total(doc: dict[str, object]) -> float:
    stages = doc["stages_ms"]
    assert isinstance(stages, dict)
    return float(sum(stages.values()))


def test_request_ids_repeated_across_two_stage_logs_stay_apart(tmp_path: Path) -> None:
    folder = sessions.demo_copy(tmp_path)
    sessions.add_log(folder, "log-1-stages.jsonl", sessions.second_worker_lines(folder))
    d = tables.load(folder)
    first, second = _stage_lines(os.path.join(folder, "log-0-stages.jsonl")), \
        _stage_lines(os.path.join(folder, "log-1-stages.jsonl"))
    assert len(d.requests) == len(first) + len(second) == 22
    assert d.requests["seq"].is_unique and d.requests["request_id"].value_counts().max() == 2
    assert set(d.stages["seq"]) == set(d.requests["seq"])
    by_seq = d.stages.groupby("seq")["ms"].sum()
    for source, docs in (("log-0-stages.jsonl", first), ("log-1-stages.jsonl", second)):
        rows = d.requests[d.requests["source"] == source].set_index("request_id")
        for doc in docs:
            assert by_seq[rows.loc[doc["request_id"], "seq"]] == pytest.approx(_stage_total(doc))
    # the slowest request's waterfall is its own stages (4,617 ms), not both workers' r-2 added up
    fig = figures.slow_requests(d, n=22).figure
    assert fig is not None
    r2 = next(doc for doc in first if doc["request_id"] == "r-2")
    totals = [sum(tr.x[i] for tr in fig.data) for i in range(22)]
    assert totals[0] == pytest.approx(_stage_total(r2))
    assert totals == pytest.approx([by_seq[s] for s in d.requests.nlargest(22, "e2e_ms")["seq"]])
    assert list(fig.layout.yaxis.ticktext).count("r-2") == 2  # the label stays the request id
    assert len(set(fig.data[0].y)) == 22  # the bars are keyed apart


@pytest.mark.parametrize("lost", ["log-0-stages.jsonl", "pyspy.raw", "process.jsonl", "metrics-0.prom"])
def test_a_file_the_manifest_lists_but_the_session_lacks_is_named(lost: str, tmp_path: Path) -> None:
    folder = sessions.demo_copy(tmp_path)
    os.remove(os.path.join(folder, lost))
    d = tables.load(folder)
    _check_shape(d)
    table = {"log-0-stages.jsonl": "requests", "pyspy.raw": "profile", "process.jsonl": "process",
             "metrics-0.prom": "metrics"}[lost]
    assert not d.has(table)
    why = d.missing[table]
    assert f"lists {lost} but the file is not in the session" in why, why
    assert "stages_ms" not in why and "Copy the whole session" in why
    if lost == "log-0-stages.jsonl":
        assert d.missing["stages"] == why and d.has("metrics") and d.has("profile")


def test_recompiles_from_torch_logs_are_placed_at_their_time(tmp_path: Path) -> None:
    folder = sessions.demo_copy(tmp_path)
    start, _ = sessions.window_of(folder)
    at = [start + 1.25, start + 2.5, start + 4.0]
    sessions.add_log(folder, "log-1-engine.log", [*sessions.torch_log_lines([*at, start - 3600], untimed=2),
                                                  *sessions.vllm_preemption_lines(2)])
    d = tables.load(folder)
    e = d.events
    timed = e.dropna(subset=["t"])
    assert list(timed["kind"]) == ["recompile"] * 4
    assert list(timed["t"]) == pytest.approx([-3600, 1.25, 2.5, 4.0], abs=1e-5)
    assert all("forward (model.py:12)" in x for x in timed["detail"])
    untimed = e[e["t"].isna()].set_index("kind")
    assert untimed.loc["recompile", "count"] == 2 and "decode (model.py:40)" in untimed.loc["recompile", "detail"]
    assert untimed.loc["preemption", "count"] == 2 and "log-1-engine.log" in untimed.loc["preemption", "detail"]
    chart = figures.timeline(d)
    assert chart.figure is not None
    lines = [s for s in chart.figure.layout.shapes if s.type == "line"]
    assert [s.x0 for s in lines] == pytest.approx([1.25, 2.5, 4.0], abs=1e-5)  # the one an hour early is not drawn
    note = "2 recompiles and 2 preemptions without timestamps (not drawn)."
    assert note in chart.missing and "1 recompile timed outside the window (not drawn)." in chart.missing
    assert any(note.rstrip(".") in str(a.text) for a in chart.figure.layout.annotations)


def test_probe_recompiles_are_not_counted_twice_with_torch_logs(gpu_dir: str, tmp_path: Path) -> None:
    folder = str(tmp_path / "gpu")
    shutil.copytree(gpu_dir, folder)
    start, _ = sessions.window_of(folder)
    sessions.add_log(folder, "log-1-torch.log", sessions.torch_log_lines([start + 1.0, start + 2.0]))
    assert list(tables.load(folder).events["kind"]) == ["recompile", "recompile", "oom"]  # the probe's


@pytest.mark.parametrize(("line_time", "window_start", "expected"), [
    ("V1130 07:30:47.250000", (2026, 11, 30, 7, 30, 40), (2026, 11, 30, 7, 30, 47.25)),
    ("V0131 23:59:59.000000", (2026, 1, 31, 23, 59, 50), (2026, 1, 31, 23, 59, 59)),  # day 31: the edge of the code
    ("V0101 00:00:05.000000", (2026, 12, 31, 23, 59, 50), (2027, 1, 1, 0, 0, 5)),  # across the new year
])
def test_glog_time_of_day_lands_on_the_window_date(line_time: str, window_start: tuple[int, ...],
                                                    expected: tuple[float, ...]) -> None:
    from datetime import datetime

    parser = CompileLogParser()
    parser.feed(f"{line_time} 140 torch/_dynamo/guards.py:2611] [0/1] [__recompiles] Recompiling function f in a.py:1")
    stamp = parser.log.last_recompile_ts
    assert stamp is not None
    start = datetime(*window_start).timestamp()  # type: ignore[arg-type]
    *ymdhm, sec = expected
    want = datetime(*(int(x) for x in ymdhm)).timestamp() + sec  # type: ignore[arg-type]
    assert series.time_of_log(stamp, start, start + 30) == pytest.approx(want)


def test_events_are_bounded_and_untimed_totals_kept(tmp_path: Path) -> None:
    folder = sessions.demo_copy(tmp_path)
    start, end = sessions.window_of(folder)
    n = tables.MAX_EVENTS + 200
    sessions.add_log(folder, "log-1-torch.log", sessions.torch_log_lines(
        [start + (end - start) * i / n for i in range(n)], untimed=3))
    e = tables.load(folder).events
    assert len(e) == tables.MAX_EVENTS
    assert e["t"].isna().sum() == 1 and e.loc[e["t"].isna(), "count"].iloc[0] == 3
    assert e["t"].dropna().is_monotonic_increasing


def test_icicle_names_the_share_of_samples_it_shows(monkeypatch: pytest.MonkeyPatch, demo: data.SessionData) -> None:
    assert demo.profile_samples == demo.profile["samples"].sum() and demo.profile_stacks == len(demo.profile)
    monkeypatch.setattr(tables, "MAX_STACKS", 10)
    d = tables.load(DEMO)
    assert len(d.profile) == 10 and d.profile_stacks == len(demo.profile) > 10
    fig = figures.cpu_icicle(d).figure
    assert fig is not None
    kept = int(d.profile["samples"].sum())
    share = round(100 * kept / demo.profile_samples)
    assert fig.data[0].labels[0] == f"top 10 of {d.profile_stacks} stacks ({share} % of {demo.profile_samples} samples)"
    assert fig.data[0].values[0] == kept


# -- layering ------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = ("diagnose.collectors", "diagnose.derive", "diagnose.pipeline", "diagnose.tables")
SESSION_LOADERS = {"dashboard/state.py"}  # the dashboard's entry point loads sessions, as the CLI does


def _imports(path: Path) -> list[str]:
    package = path.parent.name
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x / from .x import y
                base = ".".join(filter(None, (package, base)))
            out += [base, *(f"{base}.{a.name}" for a in node.names)]
    return out


def test_presenters_import_no_collector_nor_pipeline() -> None:
    files = sorted([*ROOT.glob("reports/*.py"), *ROOT.glob("dashboard/*.py")])
    assert len(files) > 10
    offenders = []
    for path in files:
        rel = path.relative_to(ROOT).as_posix()
        allowed = ("diagnose.tables",) if rel in SESSION_LOADERS else ()
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN if f not in allowed):
                offenders.append(f"{rel}: {name}")
    assert offenders == []


def test_report_tables_import_only_the_model_redaction_and_units() -> None:
    for rel, allowed in (("reports/data.py", {"diagnose.model", "diagnose.redact", "diagnose.session_data"}),
                         ("reports/figures.py", {"diagnose.reports.data", "diagnose.units"})):
        used = {n for n in _imports(ROOT / rel) if n.startswith("diagnose.")}
        modules = {n for n in used if not any(n.startswith(a + ".") for a in allowed)}
        assert modules <= allowed, (rel, modules - allowed)


def test_sessiondata_fields_are_the_tables() -> None:
    names = {f.name for f in dataclasses.fields(data.SessionData)}
    assert set(data.TABLES) <= names
