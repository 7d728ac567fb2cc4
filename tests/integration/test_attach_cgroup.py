"""A service in a CPU-limited cgroup, for real: attach reads the quota and the throttling (issue 13).

Needs a writable cgroup hierarchy with the cpu controller (cgroup v1 ``cpu`` or v2 with ``+cpu`` in
the parent's ``cgroup.subtree_control``), i.e. root on a host or a privileged container; skipped
with that reason otherwise. The readers are also tested against recorded files
(``tests/unit/test_cgroup.py``).
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator

import pytest

from diagnose.attach import AttachOptions, attach
from diagnose.collectors import cgroup
from tests.integration.test_foreign_services import _post, _wait_for, load, service

pytestmark = pytest.mark.integration
QUOTA_US, PERIOD_US = 50_000, 100_000  # half a core


def _text(path: str) -> str:
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read()
    except OSError:
        return ""


@contextlib.contextmanager
def limited_group() -> Iterator[tuple[int, str]]:
    """A fresh CPU group limited to half a core: (cgroup version, its folder); removed afterwards."""
    found = cgroup.mounts()
    name = f"diagnose-test-{uuid.uuid4().hex[:8]}"
    if "cpu" in found:
        folder = os.path.join(found["cpu"][0], name)
        version = 1
    elif "" in found and "cpu" in _text(os.path.join(found[""][0], "cgroup.subtree_control")).split():
        folder = os.path.join(found[""][0], name)
        version = 2
    else:
        pytest.skip("no cgroup hierarchy with the cpu controller is mounted here")
    try:
        os.mkdir(folder)
    except OSError as exc:
        pytest.skip(f"cannot create a cgroup here ({exc.strerror}): needs root or a delegated hierarchy")
    try:
        if version == 1:
            with open(os.path.join(folder, "cpu.cfs_period_us"), "w") as fh:
                fh.write(str(PERIOD_US))
            with open(os.path.join(folder, "cpu.cfs_quota_us"), "w") as fh:
                fh.write(str(QUOTA_US))
        else:
            with open(os.path.join(folder, "cpu.max"), "w") as fh:
                fh.write(f"{QUOTA_US} {PERIOD_US}")
        yield version, folder
    finally:
        for _ in range(50):  # the service's processes leave the group as they exit
            try:
                os.rmdir(folder)
                break
            except OSError:
                time.sleep(0.1)


def test_cfs_throttled_service_is_diagnosed_with_the_numbers(tmp_path) -> None:
    with limited_group() as (_, folder):
        # moved into the group as soon as it exists: every thread it starts later is limited too
        with service("fastapi_single_worker.py", lambda p: True) as (proc, port):
            with open(os.path.join(folder, "cgroup.procs"), "w") as fh:
                fh.write(str(proc.pid))
            _wait_for_ready(port)
            with load(port, "/predict", lambda i: {}, clients=2, seconds=60) as done:
                _wait_for(done, 4, 30)
                _, diagnosis = attach(AttachOptions(pid=proc.pid, duration_s=5, output=str(tmp_path / "s")))
    ev = {e.key: e.value for e in diagnosis.evidence}
    assert ev["cgroup.cpu_quota_cores"] == pytest.approx(0.5)
    assert ev["cgroup.throttled_ratio"] > 0.2 and ev["cgroup.throttled_periods"] > 0
    assert diagnosis.primary is not None and diagnosis.primary.value == "thread_oversubscription", diagnosis.findings
    f = diagnosis.findings[0]
    assert f.code == "THR010", diagnosis.findings
    assert "0.5 cores" in f.message and f"{ev['cgroup.throttled_periods']:.0f} of" in f.message


def _wait_for_ready(port: int) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if _post(port, "/predict", {}, 10) == 200:
                return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("the service did not answer")
