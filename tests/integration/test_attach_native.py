"""Attach to a server with no Python in it (llama.cpp's ``llama-server``, Triton, TGI's router): every
source but the Python profiler works, the profiler is SKIPPED with its reason and a remedy, and the
verdict comes from what remains (issue 17: such a target used to be refused).

The targets are real native programs: a small C server-like busy loop (two threads) compiled with gcc
in the test's folder, and ``sleep``. Everything a user runs afterwards works on the session: the
terminal and JSON output, ``diagnose report`` (Markdown, HTML), ``diagnose analyze`` and the tables and
figures every dashboard page draws.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnose import tables
from diagnose.reports import figures
from tests import attach_cost

pytestmark = pytest.mark.integration

BUSY_C = r"""
#include <pthread.h>
#include <unistd.h>

static void *spin(void *arg) {
    volatile unsigned long x = 0;
    for (;;) x++;
    return arg;
}

int main(void) {  /* a native "server": one thread all CPU, the main thread working in bursts */
    pthread_t t;
    pthread_create(&t, 0, spin, 0);
    for (;;) {
        volatile unsigned long y = 0;
        for (long i = 0; i < 20000000L; i++) y++;
        usleep(20000);
    }
}
"""


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnose", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "400"})


@pytest.fixture
def native(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:  # pragma: no cover - every CI image here has gcc
        pytest.skip("no C compiler to build the native target")
    src = tmp_path / "busy.c"
    src.write_text(BUSY_C)
    subprocess.run([cc, "-O0", "-pthread", "-o", str(tmp_path / "busy"), str(src)], check=True)
    proc = subprocess.Popen([str(tmp_path / "busy")])
    time.sleep(0.5)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_native_program_is_attached_without_the_python_profiler(native: subprocess.Popen[bytes],
                                                                  tmp_path: Path) -> None:
    out = tmp_path / "s"
    window = 3.0
    run = _cli("attach", "--pid", str(native.pid), "--duration", str(window), "-o", str(out), "--format", "json")
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    cost = json.loads((out / "attach-cost.json").read_text())
    # nothing waits for a profiler that did not run; what the host took from the stop and from the wait's late end
    # (a thread's wait for a CPU, the steal, the machine's stalls on the disk: tests/attach_cost.py) is the host's
    assert cost["window_s"] - attach_cost.window_share(cost) <= window + 1.0, json.dumps(cost)
    # the command's process was started for this attach: its start before attach() was called is recorded,
    # within what it took to reach the window, and split into CPU, run-queue wait and the time it was blocked
    # (the same thread's run-queue wait, read at the window's opening too, only grew; its CPU is the interpreter's)
    assert cost["imports_s"] > 0.0, json.dumps(cost)
    assert cost["imports_s"] + cost["setup_s"] <= cost["started_s"] + 0.01, json.dumps(cost)  # read before attach()
    assert cost["imports_wait_s"] <= cost["started_wait_s"] and cost["imports_cpu_s"] > 0.05, json.dumps(cost)
    assert 0.0 <= cost["imports_blocked_s"] < cost["imports_s"], json.dumps(cost)
    doc = json.loads(run.stdout)
    caps = {c["collector"]: c for c in doc["captures"]}
    spy = caps["py-spy"]
    assert spy["status"] == "skipped"
    assert spy["reason"] == (f"process {native.pid} (busy) runs no Python interpreter (nor does any process of "
                             "its tree): a Python profiler does not apply")
    assert f"perf top -p {native.pid}" in spy["remedy"] and "--metrics" in spy["remedy"]
    assert spy["notes"] == [f"pid {native.pid} ({out.parent}/busy): runs no Python interpreter, not profiled"]
    assert caps["process"]["status"] == "ok" and caps["cgroup"]["status"] == "ok"
    assert doc["verdict"] in ("bottleneck", "healthy", "undetermined")
    ev = {e["key"]: e["value"] for e in doc["evidence"]}
    assert ev["proc.cpu_cores_used"] > 0.2 and ev["threads.busy_count"] >= 1  # the other sources measured it
    assert not (out / "pyspy.raw").exists()
    skipped = {s["code"]: s["reason"] for s in doc["skipped"]}
    assert any("runs no Python interpreter" in r for r in skipped.values())  # rules that needed py-spy say why

    # every reader of the session copes with no py-spy file
    for fmt in ("md", "html"):
        rep = _cli("report", str(out), "--format", fmt, "-o", str(tmp_path / f"report.{fmt}"))
        assert rep.returncode == 0, rep.stderr
    assert "runs no Python interpreter" in (tmp_path / "report.md").read_text()
    assert "perf top -p" in (tmp_path / "report.html").read_text()
    again = _cli("analyze", str(out), "--format", "json")
    assert again.returncode == 0 and json.loads(again.stdout)["verdict"] == doc["verdict"]
    data = tables.load(str(out))
    assert "runs no Python interpreter" in data.missing["profile"]
    for page, charts in figures.PAGES.items():
        for chart in charts:
            fig = chart(data)
            assert fig.figure is not None or fig.missing.strip(), (page, chart)


def test_the_terminal_says_why_py_spy_does_not_apply_to_sleep(tmp_path: Path) -> None:
    target = subprocess.Popen(["sleep", "60"])
    try:
        run = _cli("attach", "--pid", str(target.pid), "--duration", "1", "-o", str(tmp_path / "s"))
    finally:
        target.kill()
        target.wait()
    assert run.returncode == 0, run.stderr
    text = " ".join(run.stdout.split())
    assert "py-spy" in text and "skipped" in text
    assert f"process {target.pid} (sleep) runs no Python interpreter" in text
    assert f"perf top -p {target.pid}" in text
    assert os.path.exists(tmp_path / "s" / "diagnosis.json")
