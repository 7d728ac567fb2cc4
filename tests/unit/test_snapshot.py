"""The CUDA memory snapshot reader: safe unpickling, the breakdown, and the MEM rule each case yields."""

from __future__ import annotations

import os
import pickle
import sys

import pytest

from diagnose.collectors.snapshot import SnapshotError, breakdown, check_plain, load_breakdown, safe_loads
from diagnose.derive.snapshot import analyze_snapshot
from diagnose.loose import analyze_path
from diagnose.model import EvidenceSet
from diagnose.rules.engine import run_rules
from tests.conftest import DATA

SNAPS = os.path.join(DATA, "snapshots")
sys.path.insert(0, SNAPS)
import make_snapshots  # noqa: E402

GIB = 1 << 30
MIB = 1 << 20


def _path(name: str) -> str:
    return os.path.join(SNAPS, f"{name}.pickle")


@pytest.mark.parametrize("name", sorted(make_snapshots.CASES))
def test_checked_in_snapshots_match_the_generator(name: str) -> None:
    with open(_path(name), "rb") as fh:
        assert safe_loads(fh.read()) == make_snapshots.CASES[name]()


@pytest.mark.parametrize(("name", "code"), [("oom_fragmentation", "MEM003"), ("oom_weights", "MEM001"),
                                            ("oom_peak", "MEM002")])
def test_each_snapshot_alone_yields_its_memory_rule(name: str, code: str) -> None:
    result = analyze_path(_path(name))
    assert [i.status for i in result.inputs] == ["ok"]
    assert result.inputs[0].kind == "torch_memory_snapshot"
    findings, _ = run_rules(EvidenceSet(result.evidence))
    assert [f.code for f in findings] == [code]


def test_fragmentation_breakdown() -> None:
    b = load_breakdown(_path("oom_fragmentation"))
    assert b.reserved_bytes == 2 * GIB + 20 * 512 * MIB
    assert b.inactive_bytes == 20 * 312 * MIB
    assert b.allocated_bytes + b.inactive_bytes == b.reserved_bytes
    assert b.largest_free_block_bytes == 120 * MIB
    oom = b.ooms[-1]
    # the request is larger than any free block but smaller than all free memory together
    assert b.largest_free_block_bytes < oom.requested_bytes < b.inactive_bytes
    assert oom.phase == "serving"
    assert len(b.fragmented_segments) == 20
    assert b.fragmented_segments[0].fragmentation_ratio == pytest.approx(1 - 120 / 312)


def test_weights_activations_split_and_top_blocks() -> None:
    b = load_breakdown(_path("oom_peak"))
    assert b.weights_bytes == 14 * GIB
    assert b.activations_bytes == 15 * (4 * GIB - 16 * MIB) + 512 * MIB
    assert b.private_pools == 1 and b.private_pools_bytes == 512 * MIB
    top = b.top_blocks[0]
    assert top.kind == "activations" and top.size == 4 * GIB - 16 * MIB
    assert top.stack[0].startswith("/srv/app/model.py:70 attention")
    ev = EvidenceSet(analyze_snapshot(_path("oom_peak"))[0])
    assert ev.value("mem.oom_count") == 1 and ev.value("mem.requested_bytes") == 4 * GIB
    blocks = ev.get("mem.snapshot_top_blocks")
    assert blocks and blocks.value[0]["kind"] == "activations" and blocks.value[0]["stack"]
    weights = load_breakdown(_path("oom_weights"))
    assert weights.weights_bytes > 0.99 * weights.allocated_bytes
    assert weights.ooms[-1].phase == "loading"


def test_forward_calling_to_is_an_activation() -> None:
    frames = [{"filename": "m.py", "line": 1, "name": "to"}, {"filename": "m.py", "line": 2, "name": "forward"}]
    seg = {"address": 0, "total_size": 10, "segment_pool_id": (0, 0),
           "blocks": [{"size": 10, "state": "active_allocated", "frames": frames}]}
    assert breakdown({"segments": [seg], "device_traces": []}).activations_bytes == 10


def test_malicious_pickle_is_refused_without_running(tmp_path, monkeypatch) -> None:
    canary = tmp_path / "canary"
    bad = tmp_path / "evil.pickle"
    bad.write_bytes(make_snapshots.malicious(f"touch {canary}"))
    with pytest.raises(SnapshotError, match=r"refused: the pickle asks for (posix|os|nt)\.system"):
        load_breakdown(str(bad))
    evidence, record = analyze_snapshot(str(bad))
    assert evidence == [] and record.status == "unreadable" and "refused" in record.reason
    monkeypatch.chdir(tmp_path)  # the checked-in one would touch a file in the working directory
    result = analyze_path(_path("malicious_os_system"))
    assert result.inputs[0].status == "unreadable" and "system" in result.inputs[0].reason
    assert not canary.exists() and not (tmp_path / "diagnose-snapshot-canary").exists()


@pytest.mark.parametrize("payload", [
    pickle.dumps({"segments": [], "f": print}, protocol=2),  # GLOBAL builtins.print
    b"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x8c\x06getcwd\x93)R.",  # STACK_GLOBAL + REDUCE
    b"\x80\x02K\x01Q.",  # BINPERSID
])
def test_any_global_or_persistent_object_is_refused(payload: bytes) -> None:
    with pytest.raises(SnapshotError, match="refused"):
        safe_loads(payload)


def test_garbage_and_limits_are_clear_errors(tmp_path) -> None:
    with pytest.raises(SnapshotError, match="not a readable pickle"):
        safe_loads(b"\x80\x04garbage")
    with pytest.raises(SnapshotError, match="no 'segments'"):
        breakdown({"hello": 1})
    deep: list[object] = []
    for _ in range(50):
        deep = [deep]
    with pytest.raises(SnapshotError, match="nested deeper"):
        check_plain(deep)
    shared = [list(range(100))] * 100  # a small pickle, many references
    with pytest.raises(SnapshotError, match="more than 1000 values"):
        check_plain(shared, max_nodes=1000)
    not_pickle = tmp_path / "x.pickle"
    not_pickle.write_bytes(b"hello")
    with pytest.raises(SnapshotError, match="protocol 2"):
        load_breakdown(str(not_pickle))


def test_snapshot_without_traces_has_no_oom_keys() -> None:
    snap = make_snapshots.oom_fragmentation()
    snap["device_traces"] = []
    ev = EvidenceSet(__import__("diagnose.derive.snapshot", fromlist=["derive"]).derive(breakdown(snap), "t"))
    assert "mem.oom_count" not in ev and ev.value("mem.reserved_minus_allocated_bytes") == 20 * 312 * MIB
