"""Drive an Nsight Systems capture window on a service started under ``nsys launch``.

``nsys launch`` starts the service with the profiler injected but idle; ``nsys start`` /
``nsys stop`` then record just the window, and ``nsys export --type sqlite`` turns the report into
the SQLite file ``diagnose analyze`` reads. Without nsys on PATH, or when the service was not
started under ``nsys launch``, the capture is skipped with the reason and how to set it up; the
rest of the diagnosis goes on.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass

import psutil

from diagnose.model import Availability

REPORT_BASENAME = "nsys-window"
LAUNCH_HINT = ("start the service as `nsys launch --trace=cuda,nvtx,osrt --session-new=diagnose "
               "python serve.py …` and pass --nsys again")


def find_nsys() -> str | None:
    return shutil.which("nsys")


def launched_under_nsys(pid: int) -> bool:
    """Whether an ancestor of ``pid`` (or the pid itself) is ``nsys launch``."""
    try:
        proc: psutil.Process | None = psutil.Process(pid)
        while proc is not None:
            cmd = proc.cmdline()
            # the nsys binary itself, or a wrapper script run by an interpreter (argv[1] is nsys)
            for i, arg in enumerate(cmd[:2]):
                if os.path.basename(arg) == "nsys" and "launch" in cmd[i + 1 : i + 3]:
                    return True
            proc = proc.parent()
    except psutil.Error:
        return False
    return False


def probe(pid: int) -> Availability:
    if find_nsys() is None:
        return Availability(False, "nsys (Nsight Systems) is not on PATH",
                            "install Nsight Systems on the host, then " + LAUNCH_HINT)
    if not launched_under_nsys(pid):
        return Availability(False, f"process {pid} was not started under `nsys launch`", LAUNCH_HINT)
    return Availability(True)


@dataclass
class NsysWindow:
    """``start()`` at the beginning of the window, ``stop(out_dir)`` at its end."""

    exe: str
    started: bool = False
    error: str = ""

    def _run(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.exe, *args], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def start(self, out_dir: str) -> None:
        try:
            res = self._run("start", "--output", os.path.join(out_dir, REPORT_BASENAME), "--force-overwrite",
                            "true", timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.error = f"nsys start failed: {exc}"
            return
        if res.returncode != 0:
            self.error = f"nsys start failed: {(res.stderr or res.stdout).strip()[-200:]}"
            return
        self.started = True

    def stop(self, out_dir: str) -> list[str]:
        """Stop the capture and export it; returns the session files written (the SQLite export)."""
        if not self.started:
            return []
        try:
            res = self._run("stop", timeout=300)
            if res.returncode != 0:
                self.error = f"nsys stop failed: {(res.stderr or res.stdout).strip()[-200:]}"
                return []
            reps = sorted(glob.glob(os.path.join(out_dir, REPORT_BASENAME + "*.nsys-rep")))
            if not reps:
                self.error = "nsys stop wrote no report"
                return []
            sqlite = os.path.join(out_dir, REPORT_BASENAME + ".sqlite")
            res = self._run("export", "--type", "sqlite", "--force-overwrite", "true", "--output", sqlite, reps[-1],
                            timeout=600)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.error = f"nsys failed: {exc}"
            return []
        if res.returncode != 0 or not os.path.exists(sqlite):
            self.error = f"nsys export failed: {(res.stderr or res.stdout).strip()[-200:]}"
            return []
        return [os.path.basename(sqlite)]
