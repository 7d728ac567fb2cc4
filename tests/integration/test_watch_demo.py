"""``diagnose watch`` for real (issue 19): the CLI watching the demo's ``queueing`` service — a real
HTTP service around a real PyTorch model — idle, then under the load that makes it queue, then quiet,
then loaded again, then paged by an Alertmanager webhook; and stopped with SIGINT."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diagnose.examples.demo import PATHOLOGIES, DemoService, background_load
from tests.engines.lab import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DIAGNOSE = Path(sys.executable).with_name("diagnose")
ALERT = Path(__file__).resolve().parents[1] / "data" / "alertmanager" / "v4-firing.json"
INTERVAL_S = 2.0
WINDOW_S = 10.0


def _metrics(port: int) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _sessions(out: Path) -> list[Path]:
    return sorted(p for p in out.glob("watch-*") if (p / "diagnosis.json").exists())


def _wait_for(out: Path, n: int, timeout_s: float, port: int, seen: set[str]) -> list[Path]:
    """Until the n-th session is whole; on the way, which bottleneck /metrics said."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = _sessions(out)
        for labels, v in _metrics(port).get("diagnose_bottleneck", {}).items():
            if v == 1.0:
                seen.add(dict(labels)["category"])
        if len(got) >= n:
            return got
        time.sleep(1.0)
    raise AssertionError(f"no session {n} within {timeout_s:.0f} s: {[p.name for p in _sessions(out)]}")


def test_watch_captures_each_queueing_incident_and_an_alert(tmp_path: Path) -> None:
    out = tmp_path / "sessions"
    stage_log = tmp_path / "stages.jsonl"
    stage_log.write_text("")
    port = free_port()
    spec = PATHOLOGIES["queueing"]
    with DemoService("queueing", extra_args=["--stage-log", str(stage_log)]) as svc:
        stderr = (tmp_path / "watch.stderr").open("w")
        watcher = subprocess.Popen(
            [str(DIAGNOSE), "watch", "--pid", str(svc.pid), "--metrics", f"{svc.url}/metrics",
             "--log", str(stage_log), "--when", "queue>4", "--when", "bottleneck", "-o", str(out),
             "--listen", f"127.0.0.1:{port}", "--interval", f"{INTERVAL_S:g}", "--window", f"{WINDOW_S:g}",
             "--ring", "120"], stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            deadline = time.monotonic() + 30
            while True:  # until it serves
                try:
                    up = _metrics(port)["diagnose_up"][()]
                    break
                except OSError:
                    assert time.monotonic() < deadline and watcher.poll() is None, \
                        (tmp_path / "watch.stderr").read_text()
                    time.sleep(0.5)
            assert up == 1.0
            time.sleep(4 * INTERVAL_S)  # idle: nothing fires
            assert not list(out.glob("watch-*"))
            assert _metrics(port)["diagnose_triggers_total"][(("rule", "queue>4"),)] == 0.0

            seen: set[str] = set()
            t0 = time.monotonic()
            with background_load(svc.url, spec, 45.0):
                first = _wait_for(out, 1, 60.0, port, seen)
            took = time.monotonic() - t0
            assert took < 60.0
            d = json.loads((first[0] / "diagnosis.json").read_text())
            detail = [(f["code"], f["severity"]) for f in d["findings"]]
            assert d["primary"] == "queueing", detail
            assert "queueing" in seen  # /metrics named it during the incident
            w = json.loads((first[0] / "watch.json").read_text())
            assert w["trigger"]["rule"] in ("queue>4", "bottleneck")
            assert w["before"]["scrapes"] >= 2  # the ring from before the trigger is in the session
            keys = {e["key"] for e in d["evidence"]}
            assert "watch.trigger" in keys and (first[0] / "watch-ring.prom").exists()
            manifest = json.loads((first[0] / "manifest.json").read_text())
            caps = {c["collector"]: c["status"] for c in manifest["captures"]}
            assert caps["py-spy"] == "ok" and caps["watch"] == "ok" and caps["metrics"] == "ok"

            time.sleep(4 * INTERVAL_S + 16.0)  # quiet: the queue drains and the light verdict clears
            assert len(_sessions(out)) == 1  # one session per incident, however long it lasted
            with background_load(svc.url, spec, 45.0):
                second = _wait_for(out, 2, 60.0, port, seen)
            assert len(second) == 2
            d2 = json.loads((second[1] / "diagnosis.json").read_text())
            assert d2["primary"] == "queueing", [(f["code"], f["severity"]) for f in d2["findings"]]

            req = urllib.request.Request(f"http://127.0.0.1:{port}/alert", data=ALERT.read_bytes(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            assert urllib.request.urlopen(req, timeout=5).status == 202
            bad = urllib.request.Request(f"http://127.0.0.1:{port}/alert", data=b"{}", method="POST")
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(bad, timeout=5)
            assert err.value.code == 400 and b"alerts" in err.value.read()
            third = _wait_for(out, 3, 60.0, port, seen)
            alerted = next(p for p in third if p.name.endswith("-alert"))
            labels = json.loads((alerted / "watch.json").read_text())["alert"]["labels"]
            assert labels["alertname"] == "ProbeFailure" and labels["severity"] == "critical"
            m = _metrics(port)
            assert m["diagnose_triggers_total"][(("rule", "alert"),)] == 1.0
            assert m["diagnose_last_session_timestamp_seconds"][()] > time.time() - 120
        finally:
            watcher.send_signal(signal.SIGINT)
            stdout, _ = watcher.communicate(timeout=60)
            stderr.close()
        assert watcher.returncode == 0, (tmp_path / "watch.stderr").read_text()
        lines = [ln for ln in stdout.splitlines() if ln.strip()]
        assert len(lines) == 3 and all(" — " in ln for ln in lines)  # each session printed its verdict line
        assert lines[0].split(": ", 1)[1].startswith("queueing"), lines


def test_watch_refuses_bad_input_with_one_sentence(tmp_path: Path) -> None:
    for argv, says in ((["--pid", str(os.getpid()), "--when", "ttft_p99>2"], "without its unit"),
                       (["--pid", "4194000"], "4194000"),
                       (["--pid", str(os.getpid()), "--listen", "host:1"], "not an address")):
        run = subprocess.run([str(DIAGNOSE), "watch", *argv, "-o", str(tmp_path)], capture_output=True, text=True,
                             timeout=60)
        assert run.returncode == 2 and says in run.stderr and "Traceback" not in run.stderr, run.stderr
