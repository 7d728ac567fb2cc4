"""The CLI's contract: exit codes, one-sentence errors without tracebacks, JSON on stdout."""

from __future__ import annotations

import io
import json
import os
import sys

import jsonschema

from tests.cli import one_sentence, run
from tests.conftest import DATA, ROOT

SESSIONS = os.path.join(DATA, "sessions")


def test_attach_no_such_pid(capsys) -> None:
    code, _, err = run(["attach", "--pid", "4194300", "--duration", "1"], capsys)
    assert code == 2
    one_sentence(err)
    assert "no process with pid 4194300" in err and "pgrep" in err


def test_attach_bad_duration(capsys) -> None:
    code, _, err = run(["attach", "--pid", str(os.getpid()), "--duration", "0"], capsys)
    assert code == 2 and "--duration" in err


def test_usage_errors_exit_2(capsys) -> None:
    code, _, err = run(["attach"], capsys)
    assert code == 2 and "--pid" in err and "--help" in err
    code, _, err = run(["frobnicate"], capsys)
    assert code == 2
    code, _, _ = run([], capsys)
    assert code == 2


def test_analyze_missing_file_and_non_session_folder(capsys, tmp_path) -> None:
    code, _, err = run(["analyze", str(tmp_path / "nope.log")], capsys)
    assert code == 2
    one_sentence(err)
    assert "does not exist" in err
    code, _, err = run(["analyze", str(tmp_path)], capsys)
    assert code == 2 and "manifest.json" in err


def test_analyze_corrupt_manifest(capsys, tmp_path) -> None:
    (tmp_path / "manifest.json").write_text("{not json")
    code, _, err = run(["analyze", str(tmp_path)], capsys)
    assert code == 2
    one_sentence(err)
    assert "not a readable diagnose session" in err


def test_analyze_session_json_follows_schema(capsys) -> None:
    code, out, _ = run(["analyze", os.path.join(SESSIONS, "queueing_one_worker_demo"), "--format", "json"],
                       capsys)
    assert code == 0
    doc = json.loads(out)
    with open(os.path.join(ROOT, "analyzer", "diagnosis.schema.json"), encoding="utf-8") as fh:
        jsonschema.validate(doc, json.load(fh))
    assert doc["primary"] == "queueing"


def test_fail_on_sets_exit_code(capsys) -> None:
    session = os.path.join(SESSIONS, "queueing_one_worker_demo")
    assert run(["analyze", session, "--format", "json", "--fail-on", "major"], capsys)[0] == 1
    assert run(["analyze", os.path.join(SESSIONS, "healthy_light_load_demo"), "--format", "json",
                "--fail-on", "minor"], capsys)[0] == 0


def test_analyze_stdin_binary_is_listed_not_fatal(capsys, monkeypatch) -> None:
    fake = io.TextIOWrapper(io.BufferedReader(io.BytesIO(b"\x00\x01\x02binary\xff" * 100)))
    monkeypatch.setattr(sys, "stdin", fake)
    code, out, _ = run(["analyze", "-", "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["primary"] is None
    assert doc["inputs"][0]["status"] == "unreadable"


def test_rules_catalogue_and_page(capsys) -> None:
    code, out, _ = run(["rules"], capsys)
    assert code == 0 and "CPU001" in out and "QUE001" in out
    code, out, _ = run(["rules", "CMP001"], capsys)
    assert code == 0 and "## How it decides" in out and "min_share" in out
    code, out, _ = run(["rules", "--format", "json"], capsys)
    assert {r["code"] for r in json.loads(out)} >= {"CPU001", "CMP001", "QUE001", "THR001"}
    code, _, err = run(["rules", "NOPE42"], capsys)
    assert code == 2 and "no rule" in err


def test_text_report_puts_verdict_first(capsys) -> None:
    code, out, _ = run(["analyze", os.path.join(SESSIONS, "cpu_preprocess_jpeg_demo")], capsys)
    assert code == 0
    first = out.index("Verdict")
    # the verdict, then the first fix to try, then the primary finding with its evidence and fixes
    assert first < out.index("Fix first:") < out.index("PRIMARY: cpu_preprocessing") < out.index("CPU001 cpu-")
    # the skipped rules are one line unless --verbose
    assert "rules could not judge: --verbose lists them" in out and "Rules skipped" not in out
    _, verbose, _ = run(["analyze", os.path.join(SESSIONS, "cpu_preprocess_jpeg_demo"), "--verbose"], capsys)
    assert "Rules skipped" in verbose and "could not judge" not in verbose


def test_enable_prints_each_recipe_with_costs(capsys) -> None:
    code, out, _ = run(["enable"], capsys)
    assert code == 0 and {"pytorch", "vllm", "sglang", "tgi", "triton"} <= set(out.split())
    code, out, _ = run(["enable", "pytorch"], capsys)
    assert code == 0 and "probe.install" in out and "TORCH_LOGS=recompiles" in out and "nsys launch" in out
    assert out.count("cost:") >= 5
    code, out, _ = run(["enable", "vllm", "--format", "json"], capsys)
    assert code == 0 and any("/metrics" in s["how"] or "metrics" in s["what"] for s in json.loads(out)["steps"])
    code, _, err = run(["enable", "tensorflow"], capsys)
    assert code == 2 and "no recipe" in err
