"""The command line against real processes: a target that is not Python, a fresh interpreter without
torch, a fresh interpreter reading a trace (moved from the unit tests, which start no process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.cli import run
from tests.conftest import DATA, ROOT

pytestmark = pytest.mark.integration

SESSIONS = os.path.join(DATA, "sessions")
SYNC_STALL = os.path.join(DATA, "kineto", "sync_stall_sglang_decode_hipgraph_mi300x.json.gz")


def test_attach_not_python_skips_only_the_python_profiler(capsys, tmp_path) -> None:
    """A native target (here `sleep`) is attached, no longer refused: py-spy says why it does not apply."""
    proc = subprocess.Popen(["sleep", "30"])
    try:
        code, out, err = run(["attach", "--pid", str(proc.pid), "--duration", "1", "-o", str(tmp_path / "s"),
                              "--format", "json"], capsys)
    finally:
        proc.kill()
        proc.wait()
    assert code == 0, err
    assert "Traceback" not in err
    spy = next(c for c in json.loads(out)["captures"] if c["collector"] == "py-spy")
    assert spy["status"] == "skipped" and f"process {proc.pid} (sleep) runs no Python interpreter" in spy["reason"]


def test_console_script_runs_without_torch(tmp_path) -> None:
    """The analyzer must import and run without torch: hide it and analyze a session."""
    shim = tmp_path / "sitecustomize.py"
    shim.write_text("import sys\nsys.modules['torch'] = None\n")
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    out = subprocess.run([sys.executable, "-c", "import torch"], env=env, capture_output=True, text=True)
    assert out.returncode != 0  # the shim really hides torch
    session = os.path.join(SESSIONS, "recompile_varying_batch_demo")
    out = subprocess.run([sys.executable, "-m", "diagnose", "analyze", session, "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["primary"] == "recompilation"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads are counted in /proc")
def test_reading_a_trace_imports_no_text_parser_and_leaves_the_environment_as_it_was() -> None:
    probe = ("import os, sys; from diagnose import cli; cli.main(['analyze', sys.argv[1], '--format', 'json']); "
             "print(sorted(m for m in sys.modules if m.startswith(('diagnose.loose', 'diagnose.derive.claims', "
             "'diagnose.derive.prom', 'diagnose.collectors.engine_log', 'diagnose.derive.session'))), "
             "os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')), file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    for blas in (None, "3"):  # numpy was loaded with one BLAS thread; the variable is gone again, or the user's
        out = subprocess.run([sys.executable, "-c", probe, SYNC_STALL], capture_output=True, text=True, check=True,
                             cwd=ROOT, env=env if blas is None else {**env, "OPENBLAS_NUM_THREADS": blas})
        modules, value, threads = out.stderr.strip().splitlines()[-1].rsplit(" ", 2)
        assert (modules, value) == ("[]", str(blas))
        if blas is None:
            assert threads == "1"  # no OpenBLAS worker threads (the process runs on its main thread alone)
        assert json.loads(out.stdout)["inputs"][0]["kind"] == "kineto_trace"



@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="threads are counted in /proc")
def test_an_attach_ends_with_its_main_thread_alone_and_the_environment_as_it_was(tmp_path) -> None:
    """Once the attach has answered, nothing of it runs on: its sources' threads have ended and its analysis
    loaded numpy without OpenBLAS's pool (whose threads the process's exit would wait for). CI 2026-12-05: an
    attach lived on long after its last record, on a host its target kept busy."""
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: sum(range(20000)); time.sleep(0.01)"])
    # a thread that Python has joined may be in /proc a moment longer, and a busy host runs it late: up to 10 s
    probe = ("import os, sys, threading, time; from diagnose import cli; code = cli.main(sys.argv[1:]); "
             "alone = lambda: sorted(os.listdir('/proc/self/task')) == [str(os.getpid())]; t = time.monotonic()\n"
             "while not alone() and time.monotonic() - t < 10: time.sleep(0.1)\n"
             "print(code, [t.name for t in threading.enumerate()], alone(), os.environ.get('OPENBLAS_NUM_THREADS'), "
             "'numpy' in sys.modules, file=sys.stderr)")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    try:
        out = subprocess.run([sys.executable, "-c", probe, "attach", "--pid", str(target.pid), "--duration", "2",
                              "-o", str(tmp_path / "s"), "--format", "json"], capture_output=True, text=True,
                             cwd=ROOT, env=env, timeout=120)
    finally:
        target.kill()
        target.wait()
    said = (out.stderr.strip().splitlines() or [""])[-1]
    assert said == "0 ['MainThread'] True None True", out.stderr[-3000:]
    spy = next(c for c in json.loads(out.stdout)["captures"] if c["collector"] == "py-spy")
    assert spy["status"] == "ok", spy  # the real recording ran (its thread is among those that ended)
