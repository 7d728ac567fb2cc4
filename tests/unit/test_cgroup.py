"""cgroup CPU budget and throttling: the readers against recorded real-format files, and the rules.

A real cgroup is used by tests/integration/test_attach_cgroup.py where one can be created; these
tests replay ``cgroup.json`` documents (tests/data/cgroup/SOURCES.md says where each comes from) and
drive ``locate``/``snapshot`` through a fake ``/proc`` and the ``--cgroup-root`` seam.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from diagnose.collectors import cgroup
from diagnose.derive import cgroup as derive_cgroup
from diagnose.model import Evidence, EvidenceSet
from diagnose.rules.engine import run_rules
from diagnose.rules.threads import CfsThrottling, ThreadOversubscription
from tests.conftest import DATA

HERE = os.path.join(DATA, "cgroup")


def _doc(name: str) -> dict:
    with open(os.path.join(HERE, name, "cgroup.json"), encoding="utf-8") as fh:
        return json.load(fh)


def _ev(name: str) -> dict[str, object]:
    return {e.key: e.value for e in derive_cgroup.derive(_doc(name))}


def test_v1_recorded_half_core_group_is_throttled_in_every_period() -> None:
    ev = _ev("v1_throttled_half_core")
    assert ev["cgroup.cpu_quota_cores"] == 0.5 and ev["cgroup.cpu_period_us"] == 100000
    assert ev["cgroup.periods"] == 30 and ev["cgroup.throttled_periods"] == 30
    assert ev["cgroup.throttled_ratio"] == 1.0
    assert ev["cgroup.throttled_s"] == pytest.approx((681798005 - 90736982) / 1e9, abs=1e-3)  # v1 counts ns


def test_v2_quota_binds_at_the_pod_and_throttling_is_read_where_it_happened() -> None:
    ev = _ev("v2_pod_quota_binds_at_ancestor")
    assert ev["cgroup.cpu_quota_cores"] == 1.5  # the pod's 150000/100000, below the container's 2 cores
    assert ev["cgroup.periods"] == 100 and ev["cgroup.throttled_periods"] == 80
    assert ev["cgroup.throttled_ratio"] == 0.8 and ev["cgroup.throttled_s"] == pytest.approx(4.8)


def test_v2_without_a_quota_says_so_and_has_no_budget() -> None:
    ev = _ev("v2_unified_no_cpu_controller")
    assert ev["cgroup.limited"] is False and "cgroup.cpu_quota_cores" not in ev
    assert "cgroup.throttled_ratio" not in ev  # a root without the cpu controller counts no periods


def test_parse_reads_max_and_minus_one_as_no_limit() -> None:
    assert cgroup.parse(2, {"path": "/", "files": {"cpu.max": "max 100000\n"}}).quota_cores is None
    assert cgroup.parse(1, {"path": "/", "files": {"cpu.cfs_quota_us": "-1\n", "cpu.cfs_period_us": "100000\n"}}
                        ).quota_cores is None
    lv = cgroup.parse(2, {"path": "/a", "files": {"cpu.max": "250000 100000\n", "cpu.stat": "nr_periods 7\n"}})
    assert lv.quota_cores == 2.5 and lv.stat["nr_periods"] == 7


def _fake_proc(tmp_path, name: str, pid: int = 4242) -> str:
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / "self").mkdir()
    shutil.copy(os.path.join(HERE, name, "proc_pid_cgroup"), proc / str(pid) / "cgroup")
    shutil.copy(os.path.join(HERE, name, "mountinfo"), proc / "self" / "mountinfo")
    return str(proc)


def _fake_hierarchy(root, doc: dict, which: str = "end") -> None:
    for level in doc[which]:
        folder = root / level["path"].lstrip("/")
        folder.mkdir(parents=True, exist_ok=True)
        for fname, text in level["files"].items():
            if text is not None:
                (folder / fname).write_text(text)


def test_locate_v1_from_proc_and_mountinfo(tmp_path) -> None:
    group = cgroup.locate(4242, proc=_fake_proc(tmp_path, "v1_throttled_half_core"))
    assert group == cgroup.Group(1, "/diagnose-record", "/sys/fs/cgroup/cpu")


def test_locate_v2_and_snapshot_through_the_cgroup_root_seam(tmp_path) -> None:
    doc = _doc("v2_pod_quota_binds_at_ancestor")
    root = tmp_path / "cg"
    _fake_hierarchy(root, doc)
    proc = _fake_proc(tmp_path, "v2_pod_quota_binds_at_ancestor")
    discovered = cgroup.locate(4242, proc=proc)
    assert discovered == cgroup.Group(2, doc["path"], "/sys/fs/cgroup")
    group = cgroup.locate(4242, root=str(root), proc=proc)
    assert group == cgroup.Group(2, doc["path"], str(root))
    levels = cgroup.snapshot(group)
    assert [lv["path"] for lv in levels] == [lv["path"] for lv in doc["end"]]  # leaf first, up to the slices
    assert levels[1]["files"]["cpu.max"] == "150000 100000\n"


def test_v1_cgroup_root_finds_the_cpu_controller_folder(tmp_path) -> None:
    doc = _doc("v1_throttled_half_core")
    _fake_hierarchy(tmp_path / "cg" / "cpu,cpuacct", doc)
    group = cgroup.locate(4242, root=str(tmp_path / "cg"), proc=_fake_proc(tmp_path, "v1_throttled_half_core"))
    assert group is not None and group.mount.endswith("cpu,cpuacct")
    assert cgroup.parse(1, cgroup.snapshot(group)[0]).quota_cores == 0.5


def test_container_mount_shows_only_its_subtree(tmp_path) -> None:
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "self").mkdir()
    (proc / "7" / "cgroup").write_text("0::/kubepods/pod1/c2\n")
    (proc / "self" / "mountinfo").write_text(
        "29 23 0:26 /kubepods/pod1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n")
    assert cgroup.locate(7, proc=str(proc)) == cgroup.Group(2, "/c2", "/sys/fs/cgroup")


def test_no_cgroup_is_none(tmp_path) -> None:
    (tmp_path / "proc" / "self").mkdir(parents=True)
    assert cgroup.locate(1, proc=str(tmp_path / "proc")) is None


def test_throttling_rule_names_the_numbers_and_leads_thread_oversubscription() -> None:
    ev = EvidenceSet([*derive_cgroup.derive(_doc("v1_throttled_half_core")),
                      Evidence("host.cores", 2, "cores", "t"), Evidence("threads.busy_count", 2, "threads", "t"),
                      Evidence("proc.runqueue_wait_ratio", 0.6, "ratio", "t"),
                      Evidence("threads.runnable_mean", 2.0, "threads", "t"),
                      Evidence("proc.cpu_cores_used", 0.5, "cores", "t")])
    findings, _ = run_rules(ev, rules=[ThreadOversubscription, CfsThrottling])
    assert [f.code for f in findings] == ["THR010", "THR001"]  # the quota is the cause, the run-queue wait its symptom
    msg = findings[0].message
    assert "0.5 cores" in msg and "30 of 30 periods (100 %)" in msg and "0.6 s of throttling" in msg
    assert "quota of 0.5 cores" in findings[1].message  # THR001 judges threads against the quota, not the 2 cores


def test_host_contention_is_not_oversubscription() -> None:
    """Threads wait for a CPU because other tenants use the host: the service wants less than it has."""
    ev = EvidenceSet([Evidence("host.cores", 2, "cores", "t"), Evidence("threads.busy_count", 4, "threads", "t"),
                      Evidence("proc.runqueue_wait_ratio", 0.5, "ratio", "t"),
                      Evidence("threads.runnable_mean", 1.3, "threads", "t")])
    findings, _ = run_rules(ev, rules=[ThreadOversubscription])
    assert findings == ()


def test_threads_polling_a_queue_are_not_demand() -> None:
    """The shape of a CI run of the lab's healthy vLLM engine (2 clients, 2 cores): 4 threads busy, 2.9 want a
    CPU, 33 % run-queue wait — but the EngineCore and the worker spin on vLLM's shared-memory queue. With their
    polling measured (1.5 of the 2.9), the work wants less than the 2 cores: no oversubscription. Without the
    py-spy view the same figures are still judged oversubscribed."""
    base = [Evidence("host.cores", 2, "cores", "t"), Evidence("threads.busy_count", 4, "threads", "t"),
            Evidence("proc.runqueue_wait_ratio", 0.33, "ratio", "t"),
            Evidence("threads.runnable_mean", 2.9, "threads", "t"),
            Evidence("proc.involuntary_switches_per_s", 3429, "1/s", "t")]
    findings, _ = run_rules(EvidenceSet(base), rules=[ThreadOversubscription])
    assert [f.code for f in findings] == ["THR001"]
    polled = [Evidence("threads.polling_runnable", 1.5, "threads", "t"),
              Evidence("threads.work_runnable_mean", 1.4, "threads", "t"),
              Evidence("threads.work_busy_count", 3, "threads", "t")]
    findings, _ = run_rules(EvidenceSet([*base, *polled]), rules=[ThreadOversubscription])
    assert findings == ()
    # under a CPU quota the polling spends the quota the work needs: the raw demand is judged
    quota = [Evidence("cgroup.cpu_quota_cores", 1.0, "cores", "t")]
    findings, _ = run_rules(EvidenceSet([*base, *polled, *quota]), rules=[ThreadOversubscription])
    assert [f.code for f in findings] == ["THR001"] and "quota of 1 cores" in findings[0].message
    # a pool that oversubscribes for work is still named, its polling said beside the demand
    pool = [Evidence("host.cores", 2, "cores", "t"), Evidence("threads.busy_count", 9, "threads", "t"),
            Evidence("proc.runqueue_wait_ratio", 0.7, "ratio", "t"),
            Evidence("threads.runnable_mean", 7.5, "threads", "t"),
            Evidence("threads.polling_runnable", 0.9, "threads", "t"),
            Evidence("threads.work_runnable_mean", 6.6, "threads", "t"),
            Evidence("threads.work_busy_count", 8, "threads", "t")]
    findings, _ = run_rules(EvidenceSet(pool), rules=[ThreadOversubscription])
    assert [f.code for f in findings] == ["THR001"]
    assert findings[0].message.startswith("8 threads are busy on 2 cores (6.6 want a CPU at any moment, not "
                                          "counting 0.9 polling a queue)")
