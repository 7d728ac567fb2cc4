"""The torch probe in a fresh interpreter where torch cannot be imported (moved from the unit tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: str | None) -> list[dict[str, Any]]:
    assert path is not None
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


_NO_TORCH_SCRIPT = r"""
import json, os, sys, time
assert sys.modules["torch"] is None
from diagnose.collectors import torch_probe
probe = torch_probe.get()
assert probe is not None, "DIAGNOSE_PROBE did not install"
with probe.request() as req:
    with probe.stage("preprocess"):
        pass
    with probe.oom_guard():
        pass
    req.set(input_tokens=3)
probe.watch_model(object())
print(json.dumps({"cuda": torch_probe.cuda_memory_state(), "compile": probe.compile_state(),
                  "announce": torch_probe.find_announcement(os.getpid()) is not None}))
"""


def test_works_with_torch_absent(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    out = tmp_path / "stages.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{ROOT}", "DIAGNOSE_PROBE": str(out),
           "XDG_RUNTIME_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH_SCRIPT], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip()) == {"cuda": None, "compile": None, "announce": True}
    (rec,) = [r for r in _lines(str(out)) if "stages_ms" in r]
    assert "preprocess" in rec["stages_ms"] and rec["input_tokens"] == 3
    assert not list(tmp_path.glob("diagnose-probe-*.json"))  # removed at exit

