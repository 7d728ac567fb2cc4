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


def test_watch_stops_cleanly_on_sigterm_and_when_its_target_exits(tmp_path: Path) -> None:
    """SIGTERM (systemd, Kubernetes) ends it with exit 0; a target that exits leaves a session of the ring."""
    import signal
    import sys
    import time

    log = tmp_path / "service.log"
    log.write_text("")
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        watcher = subprocess.Popen([str(watch_scenario.DIAGNOSE), "watch", "--pid", str(target.pid), "--log", str(log),
                                    "--interval", "0.5", "-o", str(tmp_path / "a")], stderr=subprocess.PIPE, text=True)
        time.sleep(3.0)
        watcher.send_signal(signal.SIGTERM)
        assert watcher.wait(timeout=30) == 0
        assert not list((tmp_path / "a").glob("watch-*"))
        watcher = subprocess.Popen([str(watch_scenario.DIAGNOSE), "watch", "--pid", str(target.pid), "--log", str(log),
                                    "--interval", "0.5", "-o", str(tmp_path / "b")], stdout=subprocess.PIPE, text=True)
        time.sleep(3.0)
        with log.open("a") as fh:
            fh.write("Traceback (most recent call last):\n")
        time.sleep(1.0)
        target.kill()
        out, _ = watcher.communicate(timeout=120)
        assert watcher.returncode == 0
        names = sorted(p.name for p in (tmp_path / "b").glob("watch-*"))
        assert any(n.endswith("-exited") for n in names), names
        assert any(" exited: " in line for line in out.splitlines()), out  # its verdict line
    finally:
        target.kill()
        target.wait()
