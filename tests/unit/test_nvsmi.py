"""nvidia-smi text (tables, process lines, CSV queries) → gpu.* evidence."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.derive.nvsmi import NvsmiSource
from collectors.logtext import clean_lines
from collectors.nvsmi import NvsmiParser
from tests.conftest import DATA

MiB = 1 << 20


def _source(name: str) -> NvsmiSource:
    src = NvsmiSource()
    with open(os.path.join(DATA, "nvsmi", name), encoding="utf-8") as fh:
        for line in clean_lines(fh.readlines()):
            src.feed(line)
    return src


def _ev(name: str) -> dict[str, object]:
    return {e.key: e.value for e in _source(name).evidence(name)}


def test_table_with_one_process() -> None:
    ev = _ev("vllm_table_l4_ninety_percent.txt")
    assert ev["gpu.count"] == 1
    assert ev["gpu.memory_used_bytes"] == 20537 * MiB
    assert ev["gpu.memory_total_bytes"] == 23034 * MiB
    assert ev["gpu.util_ratio"] == 0.0
    assert ev["gpu.processes"] == [
        {"gpu": 0, "pid": 1234, "name": "/usr/bin/python3", "used_bytes": 20528 * MiB, "type": "C"}]


def test_old_driver_two_gpus_reports_the_fullest() -> None:
    ev = _ev("two_gpus_old_driver_busy.txt")
    assert ev["gpu.count"] == 2
    assert ev["gpu.memory_used_bytes"] == 30127 * MiB
    assert abs(float(ev["gpu.util_ratio"]) - 0.5) < 1e-9  # type: ignore[arg-type]
    devices = ev["gpu.devices"]
    assert isinstance(devices, list) and devices[0]["name"].startswith("Tesla V100")
    procs = ev["gpu.processes"]
    assert isinstance(procs, list) and len(procs) == 2 and procs[0]["name"] == "tritonserver"


def test_csv_queries() -> None:
    ev = _ev("query_csv_gpu_and_apps.txt")
    assert ev["gpu.count"] == 2 and ev["gpu.memory_used_bytes"] == 73412 * MiB
    assert abs(float(ev["gpu.util_ratio"]) - 0.435) < 1e-9  # type: ignore[arg-type]
    procs = ev["gpu.processes"]
    assert isinstance(procs, list) and procs[0]["pid"] == 5521 and "vllm" in procs[0]["name"]


def test_process_line_quoted_in_prose_is_partial() -> None:
    src = _source("vllm_preallocation_process_line_small_model.txt")
    assert src.matched()
    assert src.problems() and "total memory is unknown" in src.problems()[0]
    ev = {e.key: e.value for e in src.evidence("t")}
    assert ev["gpu.processes"] == [
        {"gpu": None, "pid": None, "name": "anaconda3/envs/vllm/bin/python", "used_bytes": 15982 * MiB, "type": ""}]


def test_no_running_processes_and_unrelated_pipes() -> None:
    p = NvsmiParser()
    for line in ["| No running processes found                                                 |",
                 "| stage | ms | share |", "| queue | 12 | 10% |", "memory usage     123MiB"]:
        p.feed(line)
    assert p.no_processes and not p.processes and not p.gpus


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list("| 0123456789MiB/%NACGxpython-_.")), max_size=120),
                max_size=30))
def test_fuzz_table_like_text_never_raises(lines: list[str]) -> None:
    src = NvsmiSource()
    for line in lines:
        src.feed(line)
    if src.matched():
        src.evidence("fuzz")
    src.problems()


@settings(max_examples=50, deadline=None)
@given(st.binary(max_size=500))
def test_fuzz_binary_never_raises(junk: bytes) -> None:
    src = NvsmiSource()
    for line in clean_lines([*junk.decode("utf-8", "replace").splitlines(), "|" * 70_000]):
        src.feed(line)
    src.evidence("fuzz")
