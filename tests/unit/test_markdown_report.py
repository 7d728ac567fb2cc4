"""The Markdown report for a ticket, and the golden (snapshot) Markdown and JSON of a recorded session.

Regenerate the golden files after an intended change: ``UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q
tests/unit/test_markdown_report.py`` (see tests/data/golden/README.md), then review the diff.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from diagnose import pipeline
from diagnose.cli import main
from diagnose.model import (
    Capture,
    CaptureStatus,
    Category,
    Confidence,
    Diagnosis,
    Evidence,
    Finding,
    Fix,
    InputRecord,
    Risk,
    Severity,
    Skipped,
    Target,
    Verdict,
    Window,
)
from diagnose.reports import json_report, markdown
from tests.conftest import DATA, ROOT

GOLDEN = Path(DATA) / "golden"
REL_SESSION = "tests/data/sessions/prefill_long_prompts_demo"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def _report(fmt: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["report", REL_SESSION, "--format", fmt]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


def _check_golden(name: str, got: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(got, encoding="utf-8")
    expected = path.read_text(encoding="utf-8")
    assert got == expected, (f"{name} differs from the golden file; if the change is intended run "
                             "UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/unit/test_markdown_report.py")


@pytest.mark.parametrize(("fmt", "golden"), [("md", "prefill.md"), ("json", "prefill.json")])
def test_golden_report(fmt: str, golden: str, capsys: pytest.CaptureFixture[str],
                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    got = _report(fmt, capsys)
    _check_golden(golden, got)
    assert _report(fmt, capsys) == got  # deterministic run to run


def test_golden_markdown_says_what_a_ticket_needs() -> None:
    md = (GOLDEN / "prefill.md").read_text(encoding="utf-8")
    lines = md.splitlines()
    assert lines[0] == "# Diagnosis: `prefill_ttft`"
    verdict = lines[2]
    assert verdict.startswith("**Verdict: the bottleneck is `prefill_ttft`**")
    assert "Prefill is 68 % of time to first token (671 ms of 984 ms)." in verdict and "impact 68 %" in verdict
    assert "### 1. TTF001 prefill-bound-ttft — Time to first token is prefill-bound (primary)" in md
    assert "| `latency.ttft_ms.mean` | 984.4 ms | log-0-stages.jsonl |" in md
    assert "1. **Stop long prefills from blocking** (risk: safe)" in md
    assert "   - SGLang: --chunked-prefill-size; TGI: --max-batch-prefill-tokens" in md
    assert "| decode | 1,552.8 | 4,138.6 | 65 % |" in md  # the stage table
    assert "| nvml | skipped | no NVIDIA driver on this machine" in md  # the capture that is missing
    # skipped rules grouped by reason: one line for every rule that needs NVML's utilisation
    assert re.search(r"^- GPU001, (GPU\d+, )*GPU002: needs `gpu.util_ratio`: nvml capture skipped", md, re.M)
    assert "| target pid | 31743 |" in md
    assert "| window | 2026-11-30 06:03:29 UTC → 2026-11-30 06:03:37 UTC (8.1 s) |" in md
    sections = [ln for ln in lines if ln.startswith("## ")]
    skipped = len([ln for ln in md.split("## Rules skipped", 1)[1].split("## Environment")[0].splitlines()
                   if ln.startswith("- ")])
    assert skipped >= 20 and sections[4].startswith("## Rules skipped (")  # one line per reason, not per rule
    assert sections == ["## Differential", "## Findings", "## Request stages", "## Captures not complete", sections[4],
                        "## Environment"]
    assert "(probability 92 %)" in verdict  # the covered regime: measurements watched the service
    assert "| prefill_ttft | 92 % | TTF001: Time to first token is prefill-bound |" in md


def test_golden_json_is_the_diagnosis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    doc = json.loads((GOLDEN / "prefill.json").read_text(encoding="utf-8"))
    assert doc == json.loads(json_report.render(pipeline.analyze([REL_SESSION])))
    assert doc["primary"] == "prefill_ttft"
    assert not any(os.path.isabs(e["source"]) for e in doc["evidence"])


def test_markdown_does_not_depend_on_where_the_session_lies(tmp_path: Path) -> None:
    copy = tmp_path / "elsewhere" / "prefill_long_prompts_demo"
    shutil.copytree(Path(ROOT) / REL_SESSION, copy)
    md = markdown.render(pipeline.analyze([str(copy)]))
    assert str(tmp_path) not in md
    assert md == (GOLDEN / "prefill.md").read_text(encoding="utf-8")


def _hostile() -> Diagnosis:
    ev = (Evidence("stage.pre|process_ms.p99", 1234.5678, "ms", "/tmp/x/log-0-a|b.jsonl"),
          Evidence("cpu.top.other", [{"function": "f"}], "list", "py-spy"),
          Evidence("mem.reserved_bytes", 3 * 2**30, "bytes", "probe"),
          Evidence("cpu.preprocess_share", 0.625, "ratio", "py-spy"))
    f = Finding(code="CPU001", name="cpu-bound-preprocess", category=Category.CPU_PREPROCESSING,
                severity=Severity.CRITICAL, confidence=Confidence.MEASURED,
                title="Pre-processing <b>is</b> | slow", message="Decode takes 62 % of the CPU. Move it to `__init__` "
                "workers. tokenize.<locals> and __call__ and a|b.", impact=0.62, evidence=ev,
                fixes=(Fix("Use more workers", ("set --workers 4", "a | b"), Risk.SAFE),),
                why="pre |###| 62 %\n```")
    info = Finding(code="HLT001", name="healthy", category=Category.GPU_COMPUTE, severity=Severity.INFO,
                   confidence=Confidence.THIN, title="Info", message="Nothing else.", impact=0.0)
    return Diagnosis(
        findings=(f, info),
        skipped=(Skipped("GPU001", "needs `gpu.util_ratio`"), Skipped("GPU002", "needs `gpu.util_ratio`"),
                 Skipped("MEM003", "needs `mem.reserved_bytes`: no <input>")),
        inputs=(InputRecord("/tmp/x/y.log", "vllm log", "unreadable", "bad | bytes"),),
        captures=(Capture("nvml", CaptureStatus.SKIPPED, "no driver", "Run on the GPU host."),
                  Capture("py-spy", CaptureStatus.OK)),
        target=Target(pid=7, cmdline=("python", "serve.py", "--api-key", "s3cr3t-value",
                                      "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz"),
                      python="/usr/bin/python3", user="svc", gpus=("NVIDIA H100",)),
        window=Window(0.0, 10.0),
    )


def _table_rows(md: str) -> list[str]:
    return [ln for ln in md.splitlines() if ln.startswith("|")]


def test_everything_from_the_session_is_escaped_and_tables_keep_their_shape() -> None:
    md = markdown.render(_hostile())
    assert "s3cr3t-value" not in md and "hf_abcdefghij" not in md  # command line redacted again
    assert "`python serve.py --api-key *** HF_TOKEN=***`" in md
    assert "<b>" not in md and "\\<b\\>" in md
    assert "tokenize.\\<locals\\>" in md and "\\_\\_call\\_\\_" in md
    assert "`__init__`" in md  # code spans are left as written
    for row in _table_rows(md):  # every row of a table has as many unescaped pipes as its header
        cells = len(re.findall(r"(?<!\\)\|", row))
        assert cells in (3, 4, 5, 6), row
    assert "| `stage.pre\\|process_ms.p99` | 1,234.6 ms | log-0-a\\|b.jsonl |" in md
    assert "| `mem.reserved_bytes` | 3.00 GiB | probe |" in md
    assert "| `cpu.preprocess_share` | 62.5 % | py-spy |" in md
    assert "cpu.top.other" not in md  # tables of rows stay in the JSON
    assert "````text\npre |###| 62 %\n```\n````" in md  # the picture's fence is longer than its backticks
    assert "   - a \\| b" not in md and "   - a | b" in md  # list items are not table cells
    assert "- GPU001, GPU002: needs `gpu.util_ratio`" in md
    assert "| y.log | vllm log | unreadable | bad \\| bytes |" in md
    assert "### 1. CPU001 cpu-bound-preprocess — Pre-processing \\<b\\>is\\</b\\> | slow (primary)" in md
    assert "### 2. HLT001 healthy — Info\n" in md  # an info finding is not the primary one
    assert "| GPUs | NVIDIA H100 |" in md


def test_no_findings_says_so() -> None:
    # no verdict given: never "healthy" by default
    md = markdown.render(Diagnosis(findings=()))
    assert md.startswith("# Diagnosis: `undetermined`\n\n**Verdict: undetermined** — the evidence given is too thin")
    assert "No rule found a problem in the evidence given." in md
    assert "## Request stages" not in md and "## Captures not complete" not in md
    assert md.endswith("| tool version | diagnose 0.1.0 |\n")


def test_verdicts_without_a_bottleneck_say_which_they_are() -> None:
    healthy = markdown.render(Diagnosis(findings=(), verdict=Verdict.HEALTHY))
    assert healthy.startswith("# Diagnosis: `healthy`\n\n**Verdict: healthy** — the evidence covers the service")
    assert "## Next steps" not in healthy
    thin = markdown.render(Diagnosis(findings=(), verdict=Verdict.UNDETERMINED,
                                     next_steps=("Run `diagnose attach --pid 42 --duration 30`",)))
    assert "## Next steps\n\n1. Run `diagnose attach --pid 42 --duration 30`\n" in thin


@pytest.mark.parametrize(("value", "unit", "shown"), [
    (0.5, "ratio", "50 %"), (2825.698, "ms", "2,825.7 ms"), (31.18, "ms", "31.18 ms"), (0.00412, "s", "0.00412 s"),
    (5 * 2**20, "bytes", "5.00 MiB"), (4, "requests", "4 requests"), (True, "", "yes"), (None, "ms", "-"),
    (float("nan"), "ms", "-"), ("vllm", "", "vllm"),
])
def test_values_are_formatted_for_people(value: object, unit: str, shown: str) -> None:
    assert markdown.format_value(value, unit) == shown
