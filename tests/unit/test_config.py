"""--config / $DIAGNOSE_CONFIG: rule thresholds and disabled rules from TOML, checked, applied and recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from diagnose import config, pipeline
from diagnose.cli import main
from diagnose.errors import InputError
from diagnose.model import Evidence, EvidenceSet
from diagnose.rules.engine import run_rules
from tests.conftest import DATA

# the legacy OOM message: 5.09 GiB of a 23.65 GiB device in use outside PyTorch's 17.50 GiB reservation
OOM = ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 23.65 GiB total capacity; 17.20 GiB "
       "already allocated; 1.06 GiB free; 17.50 GiB reserved in total by PyTorch)\n")
LOWER_BAR = "[rules.MEM004]\nexternal_share = 0.1\nrough_share = 0.1\n"


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_a_config_changes_the_verdict_as_it_says_and_is_recorded(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "oom.txt"
    log.write_text(OOM)
    code, out, _ = _run(["analyze", str(log), "--format", "json"], capsys)
    # the config decides which rule fires (the verdict's calibrated probability decides whether it commits)
    lead = json.loads(out)["candidates"][0]["category"]
    assert code == 0 and lead != "oom_external" and "config" not in json.loads(out)
    cfg = tmp_path / "c.toml"
    cfg.write_text('disable = ["HLT002"]\n' + LOWER_BAR)  # top-level keys before the first table
    code, out, _ = _run(["analyze", str(log), "--format", "json", "--config", str(cfg)], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["candidates"][0]["category"] == "oom_external"  # 21 % held outside now passes the bar
    assert doc["config"] == {"path": str(cfg), "rules": {"MEM004": {"external_share": 0.1, "rough_share": 0.1}},
                             "disable": ["HLT002"]}
    assert {"code": "HLT002", "reason": "disabled by the config"} in doc["skipped"]
    _, text, _ = _run(["analyze", str(log), "--config", str(cfg)], capsys)
    assert "Rule settings:" in text and "MEM004.external_share = 0.1" in text


def test_the_environment_variable_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    log, cfg = tmp_path / "oom.txt", tmp_path / "c.toml"
    log.write_text(OOM)
    cfg.write_text(LOWER_BAR)
    monkeypatch.setenv(config.ENV, str(cfg))
    code, out, _ = _run(["analyze", str(log), "--format", "json"], capsys)
    assert code == 0 and json.loads(out)["candidates"][0]["category"] == "oom_external"


@pytest.mark.parametrize(("text", "says"), [
    ("[rules.QUE999]\nmin_inflight = 8\n", "[rules.QUE999] names no rule"),
    ("[rules.MEM004]\nexternal_shar = 0.1\n", "MEM004 has no threshold 'external_shar'; its thresholds are "
                                              "external_share, rough_share"),
    ('[rules.MEM004]\nexternal_share = "a lot"\n', "rules.MEM004.external_share must be a number, got 'a lot'"),
    ("threshold = 3\n", "unknown key 'threshold'"),
    ('disable = ["NOPE01"]\n', "disable names 'NOPE01', which is no rule"),
    ("disable = 'HLT002'\n", "disable must be a list of rule codes"),
    ("[rules.MEM004\n", "is not valid TOML"),
])
def test_a_bad_config_is_one_sentence_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 text: str, says: str) -> None:
    log, cfg = tmp_path / "oom.txt", tmp_path / "c.toml"
    log.write_text(OOM)
    cfg.write_text(text)
    code, out, err = _run(["analyze", str(log), "--config", str(cfg)], capsys)
    assert code == 2 and out == "" and says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2


def test_a_missing_config_file_names_where_it_came_from(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    log = tmp_path / "oom.txt"
    log.write_text(OOM)
    monkeypatch.setenv(config.ENV, str(tmp_path / "nope.toml"))
    code, _, err = _run(["analyze", str(log)], capsys)
    assert code == 2 and "does not exist" in err and "$DIAGNOSE_CONFIG" in err


def test_oom_rules_read_each_others_thresholds_so_one_override_moves_both() -> None:
    # a loading OOM with 2 GiB of a 10 GiB device held outside PyTorch, 10 % beyond one CUDA context: under
    # MEM004's default bar (25 % beyond a context, from a legacy message) MEM001 claims it; lower MEM004's bar
    # and MEM001 steps aside for MEM004
    ev = EvidenceSet(Evidence(k, v, "", "t") for k, v in {
        "mem.oom_count": 1, "mem.oom_phase": "loading", "mem.device_total_bytes": 10 * 2**30,
        "mem.device_free_bytes": 0.2 * 2**30, "mem.reserved_bytes": 7.8 * 2**30, "mem.allocated_bytes": 7.7 * 2**30,
        "mem.requested_bytes": 0.5 * 2**30}.items())
    codes = [f.code for f in run_rules(ev)[0]]
    assert codes[0] == "MEM001" and "MEM004" not in codes
    lowered = config.parse({"rules": {"MEM004": {"rough_share": 0.08}}})
    codes = [f.code for f in run_rules(ev, lowered.rules)[0]]
    assert codes[0] == "MEM004" and "MEM001" not in codes


def test_a_session_keeps_the_settings_it_was_judged_with(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    shutil.copytree(Path(DATA) / "sessions" / "prefill_long_prompts_demo", folder)
    default = pipeline.analyze([str(folder)])
    assert default.primary is not None and default.config is None
    (folder / pipeline.CONFIG_FILE).write_text(json.dumps(
        {"path": "team.toml", "rules": {}, "disable": [f.code for f in default.findings]}))
    recorded = pipeline.analyze([str(folder)])
    assert recorded.config is not None and recorded.config["path"] == "team.toml"
    assert not [f for f in recorded.findings if f.code in {g.code for g in default.findings}]
    (folder / pipeline.CONFIG_FILE).write_text('{"rules": {"NOPE01": {}}}')
    with pytest.raises(InputError, match="cannot be used"):
        pipeline.analyze([str(folder)])

