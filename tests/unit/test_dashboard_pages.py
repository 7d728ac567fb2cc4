"""Every dashboard page, run by ``streamlit.testing.v1.AppTest``: empty, and with a session's data.

Pages are reached the way a user reaches them: the app's ``st.navigation`` and ``AppTest.switch_page``
on the page script. Each chart page must show, for every chart of ``diagnose.reports.figures.PAGES[page]``,
either the plotly chart or the chart's missing-evidence sentence; the overview the verdict; compare
the findings gained and lost. Sessions are given through ``DIAGNOSE_SESSIONS`` as the launcher's
command line would give them.
"""

from __future__ import annotations

import ast
import json
import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from diagnose import tables
from diagnose.dashboard import launch, state
from diagnose.errors import DiagnoseError
from diagnose.reports import figures

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "dashboard" / "app.py"
SESSIONS = ROOT / "tests" / "data" / "sessions"
PREFILL = str(SESSIONS / "prefill_long_prompts_demo")  # CPU-only: py-spy, process, stage log, metrics; no NVML
# real vLLM under light load, attached with its log and /metrics: the latency is measured, nothing found
HEALTHY = str(ROOT / "tests" / "data" / "engines" / "vllm" / "healthy" / "attach")
QUEUEING = str(SESSIONS / "queueing_one_worker_demo")
WATCHED = str(ROOT / "tests" / "data" / "engines" / "watch" / "vllm_admission_cap")  # diagnose watch on vLLM

CHART_PAGES = {"Timeline": "page_timeline.py", "Requests": "page_requests.py", "CPU profile": "page_cpu.py",
               "GPU": "page_gpu.py", "Memory": "page_memory.py"}


def skipped_session(folder: Path) -> str:
    """A session whose every capture was skipped or failed: no evidence at all beyond the manifest."""
    folder.mkdir(parents=True)
    window = {"start": 1_800_000_000.0, "end": 1_800_000_010.0}
    captures = [
        {"collector": "py-spy", "status": "skipped", "reason": "ptrace is not permitted for this user",
         "remedy": "Run diagnose as the service's user or as root.", "window": window, "files": []},
        {"collector": "process", "status": "failed", "reason": "the process exited before the first sample",
         "remedy": "Attach while the service runs.", "window": window, "files": []},
    ]
    manifest = {"schema": "diagnose/session/v1", "tool_version": "0.1.0",
                "target": {"pid": 4242, "cmdline": ["python", "serve.py"], "python": "", "user": "svc",
                           "gpus": [], "children": []},
                "window": window, "captures": captures, "files": []}
    (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return str(folder)


@pytest.fixture
def empty(tmp_path: Path) -> str:
    return skipped_session(tmp_path / "all_captures_skipped")


def app(monkeypatch: pytest.MonkeyPatch, *paths: str) -> AppTest:
    monkeypatch.setenv("DIAGNOSE_SESSIONS", os.pathsep.join(paths))
    return AppTest.from_file(str(APP), default_timeout=120)


def open_page(at: AppTest, script: str = "page_overview.py") -> AppTest:
    at.run()
    if script != "page_overview.py":
        at.switch_page(script).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """Everything a reader sees as text on the page (titles, markdown, notes, errors, expander labels)."""
    parts: list[str] = []
    for kind in ("title", "header", "subheader", "markdown", "caption", "info", "success", "warning", "error",
                 "code"):
        parts.extend(str(e.value) for e in getattr(at, kind))
    parts.extend(str(e.label) for e in at.expander)
    return "\n".join(parts)


def charts(at: AppTest) -> list[Any]:
    return list(at.get("plotly_chart"))


def frames(at: AppTest) -> list[pd.DataFrame]:
    return [e.value for e in at.dataframe]


# --- Overview -----------------------------------------------------------------------------------


def test_overview_names_the_verdict_with_findings_evidence_and_fixes(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, PREFILL))
    shown = texts(at)
    assert at.title[0].value == "Overview"
    assert "the bottleneck is `prefill_ttft`" in at.error[0].value  # the verdict banner
    assert len(at.error) == 1, "only the verdict is shown as an alert; nothing failed"
    finding = tables.load(PREFILL).diagnosis.findings[0]
    expander = at.expander[0]
    assert "prefill_ttft" in expander.label and finding.title in expander.label
    inside = "\n".join(str(m.value) for m in expander.markdown)
    assert finding.message in inside
    assert all(fix.summary in inside for fix in finding.fixes)
    evidence = expander.dataframe[0].value
    assert {e.key for e in finding.evidence if not isinstance(e.value, list | dict)} <= set(evidence["key"])
    assert "Capture health" in shown
    health = next(f for f in frames(at) if "collector" in f.columns)
    assert set(health["collector"]) == {"py-spy", "process", "nvml", "log", "metrics"}
    assert "no NVIDIA driver" in " ".join(health["reason"].astype(str))
    assert len(charts(at)) == 1  # findings by impact


def test_overview_of_a_watch_session_says_what_fired_and_what_rose_before(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, WATCHED))
    assert "the bottleneck is `queueing`" in at.error[0].value
    shown = texts(at)
    assert "Before the trigger (diagnose watch)" in shown and "queue depth rose from 0 to 14" in shown


def test_overview_of_a_healthy_session_says_no_bottleneck(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, HEALTHY))
    assert "Verdict: healthy" in at.success[0].value and "covers the service" in at.success[0].value
    assert not at.error
    assert "No rule found a bottleneck" in texts(at)


def test_overview_of_an_empty_session_shows_why_captures_are_missing(monkeypatch: pytest.MonkeyPatch,
                                                                     empty: str) -> None:
    at = open_page(app(monkeypatch, empty))
    # every capture failed: too little to judge, and the page says what to collect
    assert "Verdict: undetermined" in at.warning[0].value and "diagnose attach --pid" in at.warning[0].value
    assert not at.success and not at.error
    health = next(f for f in frames(at) if "collector" in f.columns)
    rows = {r["collector"]: r for _, r in health.iterrows()}
    assert rows["py-spy"]["status"] == "skipped" and "ptrace is not permitted" in rows["py-spy"]["reason"]
    assert rows["process"]["status"] == "failed" and "Attach while the service runs" in rows["process"]["remedy"]
    assert any("Rules skipped" in e.label for e in at.expander)
    # no findings: the impact chart is replaced by its missing sentence
    assert not charts(at)
    assert figures.findings_impact(tables.load(empty)).missing in [i.value for i in at.info]


# --- Chart pages --------------------------------------------------------------------------------


def expect_page(at: AppTest, page: str, path: str) -> tuple[int, list[str]]:
    """Each chart of the page is drawn, or its missing sentence is shown; returns (charts, missing sentences)."""
    data = tables.load(path)
    expected = [fn(data) for fn in figures.PAGES[page]]
    drawn = [c for c in expected if c.figure is not None]
    missing = [c.missing for c in expected if c.figure is None]
    assert at.title[0].value == page
    assert not at.error, [e.value for e in at.error]
    assert len(charts(at)) == len(drawn)
    infos = [i.value for i in at.info]
    assert infos == missing
    assert all(m.strip() for m in missing), "a missing chart must say what is absent and how to get it"
    headings = [h.value for h in at.subheader]  # a drawn chart carries its own title; a missing one is headed
    assert [h for h in headings if h in {c.title for c in expected}] == [c.title for c in expected
                                                                          if c.figure is None]
    assert f"{len(drawn)} of {len(expected)} charts have data" in texts(at)
    return len(drawn), missing


@pytest.mark.parametrize("page", list(CHART_PAGES))
def test_chart_page_of_an_empty_session_says_what_is_missing(monkeypatch: pytest.MonkeyPatch, empty: str,
                                                              page: str) -> None:
    at = open_page(app(monkeypatch, empty), CHART_PAGES[page])
    drawn, missing = expect_page(at, page, empty)
    assert drawn == 0 and len(missing) == len(figures.PAGES[page])


@pytest.mark.parametrize("page", list(CHART_PAGES))
def test_chart_page_with_data(monkeypatch: pytest.MonkeyPatch, page: str) -> None:
    at = open_page(app(monkeypatch, PREFILL), CHART_PAGES[page])
    expect_page(at, page, PREFILL)


def test_timeline_and_requests_and_cpu_pages_draw_the_prefill_session(monkeypatch: pytest.MonkeyPatch) -> None:
    at = app(monkeypatch, PREFILL)
    drawn = {page: expect_page(open_page(at, CHART_PAGES[page]), page, PREFILL)[0]
             for page in ("Timeline", "Requests", "CPU profile")}
    assert drawn["Timeline"] >= 1  # CPU per process and in-flight requests were sampled
    assert drawn["Requests"] == len(figures.PAGES["Requests"])  # the stage log has every request
    assert drawn["CPU profile"] >= 1  # py-spy samples
    assert "Stage latency (ms)" in texts(at.switch_page("page_requests.py").run())


def test_gpu_page_of_a_cpu_only_session_says_how_to_get_gpu_evidence(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, PREFILL), "page_gpu.py")
    drawn, missing = expect_page(at, "GPU", PREFILL)
    assert drawn == 0
    assert missing and all(m in [i.value for i in at.info] for m in missing)
    joined = " ".join(missing)
    assert "NVML" in joined or "NVIDIA" in joined  # why there is nothing …
    assert "nsys" in joined.lower() or "Nsight" in joined  # … and how to get kernels and copies


def test_gpu_and_memory_pages_with_gpu_evidence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.sessions import gpu_session

    path = str(gpu_session(tmp_path))
    at = app(monkeypatch, path)
    gpu_drawn, _ = expect_page(open_page(at, "page_gpu.py"), "GPU", path)
    assert gpu_drawn == len(figures.PAGES["GPU"])  # NVML, Nsight, a PyTorch trace: busy, timeline, gaps, kernels…
    mem_drawn, _ = expect_page(open_page(at, "page_memory.py"), "Memory", path)
    assert mem_drawn == len(figures.PAGES["Memory"])  # snapshot breakdown and probe allocator state
    timeline_drawn, _ = expect_page(open_page(at, "page_timeline.py"), "Timeline", path)
    assert timeline_drawn == 1


def test_gpu_page_draws_the_busy_timeline_of_a_trace_in_the_session(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    from tests.sessions import KINETO_TRACE, add_file, demo_copy

    folder = demo_copy(tmp_path)  # a CPU-only demo session, plus a PyTorch-profiler trace under a kineto capture
    add_file(folder, "trace.pt.trace.json.gz", Path(KINETO_TRACE).read_bytes(), collector="kineto")
    at = open_page(app(monkeypatch, folder), "page_gpu.py")
    expect_page(at, "GPU", folder)
    (timeline,) = [c for c in charts(at) if "GPU busy over time" in c.proto.spec]
    spec = json.loads(timeline.proto.spec)
    assert len(spec["data"]) == 1 and [a["text"] for a in spec["layout"]["annotations"]] == ["rank 0 · GPU 9"]
    (ranks,) = [f for f in frames(at) if "compute_share" in f.columns]  # HTA's breakdown of the one rank
    assert list(ranks["rank"]) == [0] and ranks["idle_share"].iloc[0] == pytest.approx(0.981, abs=0.001)
    assert "Ranks side by side" in texts(at)


@pytest.mark.skipif(not list((ROOT.parent / "shared" / "data" / "kineto").glob("*sampled_rank-*")),
                    reason="../shared/data/kineto is absent")
def test_gpu_page_sets_the_ranks_side_by_side(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.sessions import add_file, demo_copy

    folder = demo_copy(tmp_path)
    for trace in sorted((ROOT.parent / "shared" / "data" / "kineto").glob("*sampled_rank-*")):  # ranks 0/1 of HTA
        add_file(folder, trace.name, trace.read_bytes(), collector="kineto")
    at = open_page(app(monkeypatch, folder), "page_gpu.py")
    expect_page(at, "GPU", folder)
    (timeline,) = [c for c in charts(at) if "GPU busy over time" in c.proto.spec]
    spec = json.loads(timeline.proto.spec)
    assert [a["text"] for a in spec["layout"]["annotations"]] == ["rank 0 · GPU 0", "rank 1 · GPU 1"]
    (ranks,) = [f for f in frames(at) if "compute_share" in f.columns]
    assert list(ranks["rank"]) == [0, 1] and list(ranks["compute_ms"]) == pytest.approx([106.368, 135.68])


# --- Compare ------------------------------------------------------------------------------------


def test_a_packed_session_shows_like_its_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tests.sessions import pack

    packed = pack(PREFILL, str(tmp_path))
    assert packed.endswith(".tar.gz")
    at = open_page(app(monkeypatch, packed))
    assert "the bottleneck is `prefill_ttft`" in at.error[0].value
    assert "prefill_long_prompts_demo:" in texts(at)
    expect_page(open_page(at, "page_requests.py"), "Requests", packed)


def test_compare_with_one_session_says_how_to_compare(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, PREFILL), "page_compare.py")
    assert "diagnose dashboard BEFORE AFTER" in at.info[0].value
    assert not charts(at) and not at.selectbox


def test_compare_shows_findings_gained_and_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, QUEUEING, PREFILL), "page_compare.py")
    before, after = at.selectbox(key="diagnose.compare.before"), at.selectbox(key="diagnose.compare.after")
    assert (before.value, after.value) == (QUEUEING, PREFILL)
    shown = texts(at)
    assert "queueing → prefill_ttft" in shown
    subheads = [h.value for h in at.subheader]
    gained = subheads.index(next(h for h in subheads if h.startswith("Gained (1)")))
    assert "queueing_one_worker_demo" in subheads[gained] and "prefill_long_prompts_demo" in subheads[gained]
    assert "TTF001" in shown and "QUE001" in shown
    assert any(h.startswith("Lost (1)") for h in subheads)
    table = next(f for f in frames(at) if "metric" in f.columns)
    assert "latency.e2e_ms.p99" in set(table["metric"])
    assert len(charts(at)) == 1

    # swap: what was gained is now lost
    before.set_value(PREFILL)
    after.set_value(QUEUEING)
    at.run()
    gained_md = [m.value for m in at.markdown if "QUE001" in m.value or "TTF001" in m.value]
    subheads = [h.value for h in at.subheader]
    order = [h.split(" ")[0] for h in subheads if h.split(" ")[0] in ("Gained", "Lost", "Kept")]
    assert order == ["Gained", "Lost", "Kept"]
    assert "QUE001" in gained_md[0] and "TTF001" in gained_md[1]
    assert "prefill_ttft → queueing" in texts(at)


def test_compare_of_a_session_with_itself_asks_for_two(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, HEALTHY, PREFILL), "page_compare.py")
    at.selectbox(key="diagnose.compare.before").set_value(PREFILL).run()
    assert "pick two different ones" in at.warning[0].value
    assert not charts(at)


# --- Session selection and bad input ------------------------------------------------------------


def test_sidebar_selects_the_session_every_page_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, PREFILL, QUEUEING))
    chooser = at.sidebar.selectbox(key="diagnose.session")
    assert chooser.value == PREFILL and "prefill_ttft" in at.error[0].value
    chooser.set_value(QUEUEING).run()
    assert "the bottleneck is `queueing`" in at.error[0].value
    at.switch_page("page_requests.py").run()
    assert not at.exception
    assert "queueing_one_worker_demo:" in texts(at)  # the chart page shows the selected session, too


def test_one_session_needs_no_selector(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch, PREFILL))
    assert not at.sidebar.selectbox
    assert "Session: prefill_long_prompts_demo" in [c.value for c in at.sidebar.caption]


@pytest.mark.parametrize("script", ["page_overview.py", "page_timeline.py", "page_gpu.py"])
def test_a_bad_session_path_is_one_sentence_on_the_page(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        script: str) -> None:
    at = open_page(app(monkeypatch, str(tmp_path / "no_such_session")), script)
    assert len(at.error) == 1
    message = at.error[0].value
    assert "no_such_session does not exist" in message
    assert "Traceback" not in message and not at.exception
    assert not charts(at)


def test_a_folder_without_manifest_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    at = open_page(app(monkeypatch, str(tmp_path)))
    assert "without a manifest.json" in at.error[0].value


def test_no_session_given_says_how_to_start(monkeypatch: pytest.MonkeyPatch) -> None:
    at = open_page(app(monkeypatch), "page_memory.py")
    assert "diagnose dashboard SESSION" in at.error[0].value


# --- launcher (no server started here; the browser test starts one) -----------------------------


def test_launcher_rejects_a_bad_path_with_one_sentence_and_exit_2(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert launch.run([PREFILL, str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("diagnose: ") and "missing does not exist" in err[0]


def test_launcher_command_binds_localhost_headless_and_passes_sessions() -> None:
    paths = launch.check_sessions([PREFILL, HEALTHY])
    assert all(os.path.isabs(p) for p in paths)
    cmd = launch.command(paths, 8765)
    assert cmd[:4] == [sys.executable, "-m", "streamlit", "run"] and cmd[4] == str(APP)
    opts = dict(zip(cmd[5:cmd.index("--"):2], cmd[6:cmd.index("--"):2], strict=True))
    assert opts["--server.address"] == "127.0.0.1" and opts["--server.port"] == "8765"
    assert opts["--server.headless"] == "true" and opts["--browser.gatherUsageStats"] == "false"
    assert cmd[cmd.index("--") + 1:] == paths
    port = launch.free_port()
    assert 0 < port < 65536


def test_launcher_refuses_a_busy_port() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(DiagnoseError, match=f"Port {port} on 127.0.0.1 cannot be used"):
            launch.start([PREFILL], port=port)


# --- the layering rule --------------------------------------------------------------------------


def test_only_the_dashboard_imports_streamlit() -> None:
    offenders = []
    for package in ("analyzer", "collectors", "rules", "reports"):
        for path in (ROOT / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if any(n.split(".")[0] == "streamlit" for n in names):
                    offenders.append(str(path.relative_to(ROOT)))
    assert not offenders


def test_importing_the_page_modules_reads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    calls: list[str] = []
    monkeypatch.setattr(tables, "load", lambda path: calls.append(path))
    monkeypatch.setenv("DIAGNOSE_SESSIONS", PREFILL)
    state._load.clear()  # a cached load would hide a page that reads at import
    for script in ("page_overview", *(Path(s).stem for s in CHART_PAGES.values()), "page_compare"):
        monkeypatch.delitem(sys.modules, f"diagnose.dashboard.{script}", raising=False)
        importlib.import_module(f"diagnose.dashboard.{script}")
    assert calls == []


def test_no_page_shows_the_secret_in_the_session(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The GPU fixture's command line carries a fake API key: the caption shows the command, never the key."""
    from tests import sessions

    path = sessions.gpu_session(tmp_path)
    assert sessions.SECRET in (Path(path) / "manifest.json").read_text()  # planted
    at = app(monkeypatch, path)
    for script in ("page_overview.py", *CHART_PAGES.values()):
        page = texts(open_page(at, script))
        assert sessions.SECRET[:12] not in page, script  # not even the start of it (the caption is cut)
        if script == "page_overview.py":
            assert "gpu_session: pid" in page


def test_session_strings_render_as_written_and_values_as_in_the_reports() -> None:
    from diagnose.dashboard import views
    from diagnose.model import Evidence
    from diagnose.reports import markdown

    for value, unit in ((100_000_000.0, "bytes"), (0, "bytes"), (0.1234, "ratio"), (12, "requests")):
        ev = Evidence(key="k", value=value, unit=unit, source="s")
        assert views.format_value(ev) == markdown.format_value(value, unit)
    assert markdown.text("slow in __init__ of *model*") == r"slow in \_\_init\_\_ of \*model\*"
