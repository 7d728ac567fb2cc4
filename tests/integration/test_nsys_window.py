"""`attach --nsys`: the capture window is driven with nsys start/stop/export (a stand-in nsys here)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import time

import pytest

from diagnose.attach import AttachOptions, attach
from diagnose.collectors import nsys_session
from diagnose.model import CaptureStatus

pytestmark = pytest.mark.integration

# A stand-in for the nsys CLI with the same verbs and the files they leave: `launch` execs the
# service (so it is the service's ancestor), `start`/`stop` log their calls and write a report,
# `export --type sqlite` writes an SQLite file. It logs every call for the assertions.
FAKE_NSYS = textwrap.dedent("""\
    #!{python}
    import os, sqlite3, sys
    log = os.environ["FAKE_NSYS_LOG"]
    with open(log, "a") as fh:
        fh.write(" ".join(sys.argv[1:]) + "\\n")
    verb = sys.argv[1]
    if verb == "launch":
        import subprocess
        sys.exit(subprocess.call(sys.argv[2:]))
    if verb == "start":
        out = sys.argv[sys.argv.index("--output") + 1]
        open(os.environ["FAKE_NSYS_LOG"] + ".out", "w").write(out)
    if verb == "stop":
        out = open(os.environ["FAKE_NSYS_LOG"] + ".out").read()
        open(out + ".nsys-rep", "wb").write(b"report")
    if verb == "export":
        out = sys.argv[sys.argv.index("--output") + 1]
        con = sqlite3.connect(out)
        con.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT)")
        con.commit()
        con.close()
    """)


@pytest.fixture()
def fake_nsys(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nsys"
    exe.write_text(FAKE_NSYS.format(python=sys.executable))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "nsys-calls.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_NSYS_LOG", str(log))
    return exe, log


def _service(cmd_prefix: list[str]) -> subprocess.Popen[bytes]:
    code = "while True: sum(i * i for i in range(1000))"
    return subprocess.Popen([*cmd_prefix, sys.executable, "-c", code], start_new_session=True)


def test_window_is_recorded_and_exported_when_launched_under_nsys(fake_nsys, tmp_path) -> None:
    exe, log = fake_nsys
    launcher = _service([str(exe), "launch"])
    try:
        import psutil

        deadline = time.monotonic() + 20
        while not psutil.Process(launcher.pid).children() and time.monotonic() < deadline:
            time.sleep(0.2)
        service_pid = psutil.Process(launcher.pid).children()[0].pid
        assert nsys_session.probe(service_pid).ok
        _, diagnosis = attach(AttachOptions(pid=service_pid, duration_s=2, output=str(tmp_path / "s"), nsys=True))
    finally:
        os.killpg(launcher.pid, 9)
        launcher.wait()
    calls = log.read_text().splitlines()
    verbs = [c.split()[0] for c in calls]
    assert verbs == ["launch", "start", "stop", "export"]
    cap = next(c for c in diagnosis.captures if c.collector == "nsys")
    assert cap.status is CaptureStatus.OK and cap.files == ("nsys-window.sqlite",)
    assert (tmp_path / "s" / "nsys-window.sqlite").exists()


def test_not_launched_under_nsys_is_skipped_with_how_to(fake_nsys, tmp_path) -> None:
    proc = _service([])
    try:
        time.sleep(0.5)
        _, diagnosis = attach(AttachOptions(pid=proc.pid, duration_s=1, output=str(tmp_path / "s"), nsys=True))
    finally:
        proc.kill()
        proc.wait()
    cap = next(c for c in diagnosis.captures if c.collector == "nsys")
    assert cap.status is CaptureStatus.SKIPPED
    assert "not started under `nsys launch`" in cap.reason and "nsys launch" in cap.remedy


def test_no_nsys_on_path_is_skipped(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nsys_session.find_nsys() is None
    avail = nsys_session.probe(os.getpid())
    assert not avail.ok and "not on PATH" in avail.reason and "nsys launch" in avail.remedy
