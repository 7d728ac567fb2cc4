"""Attach for real: the demo service under load, py-spy and psutil against live processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from diagnose.attach import AttachOptions, attach
from diagnose.demo import run_pathology
from diagnose.examples.demo import PATHOLOGIES, DemoService, background_load
from diagnose.model import CaptureStatus

pytestmark = pytest.mark.integration

WINDOW_S = {"recompile": 10.0, "prefill": 12.0}  # prefill: streams of 8-14 s must end inside the window


def _no_leftovers(pid: int) -> None:
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.1)
    alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    assert not alive, f"demo service {pid} still running"


@pytest.mark.parametrize("pathology", ["cpu-preprocess", "recompile", "queueing", "prefill", "healthy"])
def test_demo_names_its_pathology(pathology: str, tmp_path) -> None:
    """`diagnose demo`'s own code path: service + load + attach (py-spy, psutil, stage log, /metrics)."""
    spec = PATHOLOGIES[pathology]
    path, diagnosis, load = run_pathology(pathology, WINDOW_S.get(pathology, 6.0), str(tmp_path / "s"))
    assert diagnosis.target is not None
    _no_leftovers(diagnosis.target.pid)
    expected = spec.expected_category
    got = diagnosis.primary.value if diagnosis.primary else None
    detail = [(f.code, round(f.impact, 2), f.message) for f in diagnosis.findings]
    assert got == expected, f"{pathology}: expected {expected}, got {got}: {detail}"
    caps = {c.collector: c.status for c in diagnosis.captures}
    assert caps["py-spy"] is CaptureStatus.OK and caps["metrics"] is CaptureStatus.OK
    assert os.path.exists(os.path.join(path, "manifest.json"))
    assert os.path.exists(os.path.join(path, "diagnosis.json"))
    assert load is not None


def _python_child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], start_new_session=True)


def test_target_exiting_mid_window_is_kept_as_partial(tmp_path) -> None:
    child = _python_child("""
        import time
        end = time.time() + 2.5
        while time.time() < end:
            sum(i * i for i in range(1000))
    """)
    time.sleep(0.5)
    t0 = time.monotonic()
    _, diagnosis = attach(AttachOptions(pid=child.pid, duration_s=20, output=str(tmp_path / "s")))
    child.wait()
    assert time.monotonic() - t0 < 15  # the window ends when the target does
    caps = {c.collector: c for c in diagnosis.captures}
    assert caps["process"].status is CaptureStatus.PARTIAL
    assert "target exited" in caps["process"].reason
    assert any(e.key == "cpu.active_samples" and e.value > 0 for e in diagnosis.evidence)


def test_ctrl_c_stops_early_and_still_writes_the_verdict(tmp_path) -> None:
    child = _python_child("""
        import time
        while True:
            sum(i * i for i in range(1000))
    """)
    try:
        out = tmp_path / "s"
        cli = subprocess.Popen([sys.executable, "-m", "diagnose", "attach", "--pid", str(child.pid),
                                "--duration", "60", "-o", str(out), "--format", "json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not (out / "process.jsonl").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)
        cli.send_signal(signal.SIGINT)
        stdout, stderr = cli.communicate(timeout=60)
    finally:
        child.kill()
        child.wait()
    assert cli.returncode == 0, stderr
    assert "Traceback" not in stderr
    from diagnose.collectors import nvml

    if not nvml.probe(child.pid).ok:  # no GPU here: one line says GPU evidence was skipped and why
        gpu_lines = [ln for ln in stderr.splitlines() if "GPU evidence skipped" in ln]
        assert len(gpu_lines) == 1 and ":" in gpu_lines[0]
    import json

    doc = json.loads(stdout)
    caps = {c["collector"]: c for c in doc["captures"]}
    assert caps["py-spy"]["status"] == "partial"
    assert "stopped early" in caps["py-spy"]["reason"]
    assert (out / "manifest.json").exists() and (out / "diagnosis.json").exists()
    assert not list(out.glob(".tmp-*"))


def test_attach_to_another_users_process_is_refused_with_the_remedy() -> None:
    """Drop to an unprivileged user in a forked child and attach to this (root-owned) process."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")  # pragma: no cover
    target = os.getpid()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(r)
        code = 99
        try:
            os.setgid(65534)
            os.setuid(65534)
            sys.stderr = open(w, "w", closefd=False)  # noqa: SIM115 - the child exits right after
            from diagnose.cli import main

            code = main(["attach", "--pid", str(target), "--duration", "1"])
            sys.stderr.flush()
        finally:
            os._exit(code)
    os.close(w)
    err = b""
    while chunk := os.read(r, 65536):
        err += chunk
    _, status = os.waitpid(pid, 0)
    text = err.decode()
    assert os.waitstatus_to_exitcode(status) == 2, text
    assert "another user" in text and "CAP_SYS_PTRACE" in text and "kubectl debug" in text
    assert "Traceback" not in text


def test_attach_follows_worker_processes(tmp_path) -> None:
    """The pid an engineer knows is often the parent: samples come from its busy child."""
    child = _python_child("""
        import multiprocessing as mp, time
        def work():
            while True:
                sum(i * i for i in range(1000))
        if __name__ == "__main__":
            mp.set_start_method("fork")
            p = mp.Process(target=work, name="worker")
            p.start()
            time.sleep(60)
    """)
    try:
        time.sleep(1.0)
        kids = psutil.Process(child.pid).children()
        assert kids
        _, diagnosis = attach(AttachOptions(pid=child.pid, duration_s=3, output=str(tmp_path / "s")))
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    threads = next(e.value for e in diagnosis.evidence if e.key == "cpu.threads")
    assert any(t["pid"] == kids[0].pid and t["active_ratio"] > 0.5 for t in threads), (threads, kids)
    assert diagnosis.target is not None and kids[0].pid in diagnosis.target.children
    assert threading.active_count() >= 1


def test_attach_copies_the_log_window_and_scrapes_metrics(tmp_path) -> None:
    stage_log = tmp_path / "stages.jsonl"
    stage_log.write_text('{"ts": 1, "note": "written before the window"}\n' * 10)
    spec = PATHOLOGIES["healthy"]
    with DemoService("healthy", extra_args=["--stage-log", str(stage_log)]) as svc, \
            background_load(svc.url, spec, 40):
        time.sleep(1.0)
        session, diagnosis = attach(AttachOptions(pid=svc.pid, duration_s=3, output=str(tmp_path / "s"),
                                                  logs=[str(stage_log)], metrics=[f"{svc.url}/metrics",
                                                                                  "http://127.0.0.1:9/metrics"]))
    caps = [(c.collector, c.status, c.files) for c in diagnosis.captures]
    logs = [c for c in caps if c[0] == "log"]
    assert logs and logs[0][1] is CaptureStatus.OK
    copied = (tmp_path / "s" / logs[0][2][0]).read_text()
    assert "stages_ms" in copied  # requests served during the window are in the copy
    metrics = [c for c in diagnosis.captures if c.collector == "metrics"]
    assert metrics[0].status is CaptureStatus.OK
    body = (tmp_path / "s" / metrics[0].files[0]).read_text()
    assert body.count("# scrape at") == 2 and "vllm:" in body
    assert metrics[1].status is CaptureStatus.FAILED and "could not scrape" in metrics[1].reason
    assert os.path.exists(os.path.join(session.path, "manifest.json"))


def test_attach_finds_the_probe_and_reports_stage_percentiles(tmp_path) -> None:
    """A service that installed the probe needs no flags: attach finds its stage log."""
    stage_log = tmp_path / "stages.jsonl"
    spec = PATHOLOGIES["queueing"]
    with DemoService("queueing", extra_args=["--stage-log", str(stage_log)]) as svc, \
            background_load(svc.url, spec, 40):
        time.sleep(2.0)
        _, diagnosis = attach(AttachOptions(pid=svc.pid, duration_s=4, output=str(tmp_path / "s")))
    probe = [c for c in diagnosis.captures if c.collector == "probe"]
    assert probe and probe[0].status is CaptureStatus.OK
    keys = {e.key: e.value for e in diagnosis.evidence}
    assert keys["stage.queue_ms.p50"] > 0 and "stage.queue_ms.p99" in keys and "stage.queue.share" in keys
    from diagnose.stage_stats import stage_rows

    rows = stage_rows(diagnosis)
    assert rows[0][0] == "queue"  # the queueing demo's requests spend most of their time waiting
    assert diagnosis.primary is not None and diagnosis.primary.value == "queueing"
