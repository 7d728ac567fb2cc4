"""``diagnose watch`` for real (issue 19): the CLI watching the demo's ``queueing`` service — a real
HTTP service around a real PyTorch model — through the scenario of ``tests/watch_scenario.py``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from diagnose.examples.demo import PATHOLOGIES, DemoService, background_load
from tests import watch_scenario
from tests.engines.lab import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_watch_captures_each_queueing_incident_and_an_alert(tmp_path: Path) -> None:
    stage_log = tmp_path / "stages.jsonl"
    stage_log.write_text("")
    spec = PATHOLOGIES["queueing"]
    with DemoService("queueing", extra_args=["--stage-log", str(stage_log)]) as svc:
        seen = watch_scenario.run(tmp_path, svc.pid, f"{svc.url}/metrics", stage_log,
                                  lambda: background_load(svc.url, spec, 45.0), free_port())
    watch_scenario.check(seen, "queueing")


def test_watch_refuses_bad_input_with_one_sentence(tmp_path: Path) -> None:
    for argv, says in ((["--pid", str(os.getpid()), "--when", "ttft_p99>2"], "without its unit"),
                       (["--pid", "4194000"], "4194000"),
                       (["--pid", str(os.getpid()), "--metrics", "http://127.0.0.1:9/metrics", "--listen", "host:1"],
                        "not an address"),
                       (["--pid", str(os.getpid())], "nothing to watch"),
                       (["--pid", str(os.getpid()), "--when", "queue>8"], "can never fire")):
        run = subprocess.run([str(watch_scenario.DIAGNOSE), "watch", *argv, "-o", str(tmp_path)],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr, run.stderr
