"""`diagnose report|compare|pack|dashboard`: formats, outputs, and one-sentence errors with exit code 2."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

from diagnose.cli import main
from diagnose.reports import markdown
from tests.cli import one_sentence, run
from tests.conftest import DATA

SESSIONS = os.path.join(DATA, "sessions")
PREFILL = os.path.join(SESSIONS, "prefill_long_prompts_demo")
QUEUEING = os.path.join(SESSIONS, "queueing_one_worker_demo")
HEALTHY = os.path.join(SESSIONS, "healthy_light_load_demo")  # py-spy and process samples only
VLLM_HEALTHY = os.path.join(DATA, "engines", "vllm", "healthy", "attach")  # real vLLM, with its log and /metrics


def test_report_defaults_to_markdown_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["report", PREFILL], capsys)
    assert code == 0 and err == ""
    assert out.startswith("# Diagnosis: `prefill_ttft`\n")


@pytest.mark.parametrize(("name", "starts"), [("r.md", "# Diagnosis: `prefill_ttft`"), ("r.markdown", "# Diagnosis"),
                                              ("r.json", "{"), ("R.HTML", "<!DOCTYPE html>"), ("r.htm", "<!DOCTYPE")])
def test_report_format_from_the_suffix(name: str, starts: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / name
    code, stdout, err = run(["report", PREFILL, "-o", str(out)], capsys)
    assert code == 0 and stdout == ""
    assert str(out) in err
    assert out.read_text(encoding="utf-8").startswith(starts)


def test_explicit_format_wins_over_the_suffix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.txt"
    code, _, _ = run(["report", PREFILL, "--format", "json", "-o", str(out)], capsys)
    assert code == 0 and json.loads(out.read_text())["primary"] == "prefill_ttft"
    code, stdout, _ = run(["report", PREFILL, "--format", "html"], capsys)
    assert code == 0 and stdout.startswith("<!DOCTYPE html>") and 'id="diagnosis"' in stdout


def test_report_errors_are_one_sentence_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["report", PREFILL, "-o", str(tmp_path / "r.txt")], capsys)
    assert code == 2 and "cannot tell the report format" in one_sentence(err) and "--format md|html|json" in err
    code, _, err = run(["report", PREFILL, "-o", str(tmp_path / "missing" / "r.md")], capsys)
    assert code == 2 and "does not exist" in one_sentence(err) and "Create it first" in err
    code, _, err = run(["report", str(tmp_path / "nope")], capsys)
    assert code == 2 and "does not exist" in one_sentence(err)
    code, _, err = run(["report", SESSIONS], capsys)
    assert code == 2 and "without a manifest.json" in one_sentence(err)
    code, _, err = run(["report", PREFILL, "-o", str(tmp_path)], capsys)
    assert code == 2 and "is a folder" in one_sentence(err)
    code, _, err = run(["report", PREFILL, "--format", "pdf"], capsys)
    assert code == 2 and "invalid choice" in one_sentence(err)
    assert not list(tmp_path.iterdir())


def test_report_of_a_packed_session_names_the_archive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = tmp_path / "ticket-123.tar.gz"
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(PREFILL, arcname="prefill_long_prompts_demo")
    code, out, _ = run(["report", str(packed), "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["primary"] == "prefill_ttft"
    sources = {e["source"] for e in doc["evidence"] if "/" in e["source"]}
    assert sources == {str(packed / "log-0-stages.jsonl"), str(packed / "metrics-0.prom")}  # not the temp folder
    assert all(i["path"].startswith(str(packed)) for i in doc["inputs"])
    code, out, _ = run(["report", str(packed)], capsys)
    golden = (Path(DATA) / "golden" / "prefill.md").read_text(encoding="utf-8")
    assert code == 0 and out == golden
    code, out, _ = run(["report", str(packed), "--format", "html"], capsys)
    assert code == 0 and "<h1>diagnose report: ticket-123</h1>" in out and "diagnose-session-" not in out


def test_compare_text_markdown_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["compare", QUEUEING, HEALTHY], capsys)
    assert code == 0 and err == ""
    assert out.startswith("diagnose compare: queueing_one_worker_demo → healthy_light_load_demo\n")
    assert "Primary bottleneck queueing → none." in out and "QUE001" in out
    code, out, _ = run(["compare", QUEUEING, HEALTHY, "--format", "md"], capsys)
    assert code == 0 and "| `conn.inflight_mean` | 16 requests | 0.24 requests | -98 % | better |" in out
    code, out, _ = run(["compare", QUEUEING, HEALTHY, "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and [f["code"] for f in doc["lost"]] == ["QUE001"] and doc["after_primary"] is None


def test_compare_of_two_sessions_with_the_same_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for side in ("a", "b"):
        shutil.copytree(PREFILL, tmp_path / side / "run")
    code, out, _ = run(["compare", str(tmp_path / "a" / "run"), str(tmp_path / "b" / "run"), "--format", "json"],
                       capsys)
    doc = json.loads(out)
    assert code == 0 and (doc["before"], doc["after"]) == ("before (run)", "after (run)")
    assert {r["verdict"] for r in doc["rows"]} == {"same"} and doc["gained"] == doc["lost"] == []


def test_compare_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["compare", PREFILL, str(tmp_path / "nope")], capsys)
    assert code == 2 and "does not exist" in one_sentence(err)
    code, _, err = run(["compare", PREFILL], capsys)
    assert code == 2 and "after" in one_sentence(err)


def test_dashboard_subcommand_calls_the_launcher(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from diagnose.dashboard import launch

    calls: list[tuple[list[str], int | None, bool]] = []

    def fake_run(paths: list[str], port: int | None = None, open_browser: bool = False) -> int:
        calls.append((paths, port, open_browser))
        return 0

    monkeypatch.setattr(launch, "run", fake_run)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("DISPLAY", ":0")
    assert main(["dashboard", PREFILL, HEALTHY, "--port", "8765", "--no-browser"]) == 0
    assert main(["dashboard", PREFILL]) == 0
    monkeypatch.delenv("DISPLAY")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert main(["dashboard", PREFILL]) == 0  # a headless host: print the URL, open nothing
    assert calls == [([PREFILL, HEALTHY], 8765, False), ([PREFILL], None, True), ([PREFILL], None, False)]
    code, _, err = run(["dashboard", PREFILL, "--port", "70000"], capsys)
    assert code == 2 and "not a TCP port" in one_sentence(err)
    code, _, err = run(["dashboard"], capsys)
    assert code == 2 and "sessions" in one_sentence(err)
    assert len(calls) == 3


def test_dashboard_with_a_missing_session_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(["dashboard", str(tmp_path / "nope"), "--no-browser"], capsys)
    assert code == 2 and "does not exist" in one_sentence(err) and out == ""


def test_markdown_report_matches_the_library(capsys: pytest.CaptureFixture[str]) -> None:
    from diagnose import pipeline

    code, out, _ = run(["report", VLLM_HEALTHY, "--format", "md"], capsys)
    assert code == 0 and out == markdown.render(pipeline.analyze([VLLM_HEALTHY]))
    assert "**Verdict: healthy**" in out
    # a CPU profile and process samples alone never saw what requests felt: not healthy, and measuring the
    # latency is the first next step
    code, out, _ = run(["report", HEALTHY, "--format", "md"], capsys)
    assert code == 0 and "**Verdict: undetermined**" in out
    assert "## Next steps\n\n1. Measure what requests feel before calling it healthy" in out
