"""attach brings the probe's OOM snapshots of the running service into the session, and only those."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import psutil
import pytest

from diagnose import sources
from diagnose.collectors import torch_probe
from diagnose.model import CaptureStatus, Window

SNAPSHOT = Path(__file__).resolve().parent.parent / "data" / "snapshots" / "oom_fragmentation.pickle"


@pytest.fixture
def announced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test process plays the service: its probe announced a stage log in tmp_path."""
    stages = tmp_path / "stages.jsonl"
    stages.write_text("")
    me = os.getpid()
    started = psutil.Process(me).create_time()

    def find(pid: int) -> dict[str, object] | None:
        return {"pid": me, "started": started + 0.5, "stages_path": str(stages)} if pid == me else None

    monkeypatch.setattr(torch_probe, "find_announcement", find)
    return stages


def test_newest_own_snapshots_are_taken(announced: Path) -> None:
    me = os.getpid()
    own = [Path(f"{announced}.oom-{me}-{n}.pickle") for n in (1, 2, 3)]
    started, now = psutil.Process(me).create_time(), time.time()
    for i, p in enumerate(own):  # written one after another while this process ran
        shutil.copyfile(SNAPSHOT, p)
        t = started + (now - started) * (i + 1) / 4
        os.utime(p, (t, t))
    other = Path(f"{announced}.oom-{me + 1}-1.pickle")  # another process's (a pid reused later)
    shutil.copyfile(SNAPSHOT, other)
    stale = Path(f"{announced}.oom-{me}-0.pickle")  # from before this process started
    shutil.copyfile(SNAPSHOT, stale)
    os.utime(stale, (1_000_000.0, 1_000_000.0))
    assert sources.probe_snapshots(me) == [str(own[2]), str(own[1])]


def test_snapshots_are_copied_into_a_probe_capture(announced: Path, tmp_path: Path) -> None:
    snap = Path(f"{announced}.oom-{os.getpid()}-1.pickle")
    shutil.copyfile(SNAPSHOT, snap)
    folder = tmp_path / "session"
    folder.mkdir()
    cap = sources.ProbeSnapshotSource(os.getpid(), str(folder)).capture(Window(0.0, 1.0), "")
    assert cap is not None and cap.collector == "probe" and cap.status is CaptureStatus.OK
    assert cap.files == ("probe-snapshot-0.pickle",)
    assert (folder / "probe-snapshot-0.pickle").read_bytes() == SNAPSHOT.read_bytes()


def test_no_snapshot_no_capture(announced: Path, tmp_path: Path) -> None:
    assert sources.probe_snapshots(os.getpid()) == []
    assert sources.ProbeSnapshotSource(os.getpid(), str(tmp_path)).capture(Window(0.0, 1.0), "") is None
