"""PyTorch profiler summary tables and ``nsys stats``: the host's time launching kernels (GPU112)."""

from __future__ import annotations

import os

from diagnose import pipeline
from diagnose.collectors.torch_profiler_table import ProfilerTableParser
from diagnose.model import Confidence, EvidenceSet
from tests.conftest import DATA

TABLES = os.path.join(DATA, "torch_profiler")


def _table(name: str) -> ProfilerTableParser:
    p = ProfilerTableParser()
    with open(os.path.join(TABLES, name), encoding="utf-8") as fh:
        for line in fh:
            p.feed(line.rstrip("\n"))
    return p


def _judged(path: str) -> tuple[EvidenceSet, list[str], pipeline.Diagnosis]:
    d = pipeline.analyze([path])
    return EvidenceSet(d.evidence), [f.code for f in d.findings], d


def test_rows_are_read_by_the_headers_columns_names_with_spaces_included() -> None:
    t = _table("decode_step_cuda_columns.txt").table
    assert t is not None and len(t.rows) == 5
    assert t.columns[:2] == ["Self CPU %", "Self CPU"] and t.columns[-1] == "# of Calls"
    names = [n for n, _ in t.rows]
    assert "Memcpy HtoD (Pageable -> Device)" in names and names[2].endswith("...")
    assert t.self_cpu_total_ms == 200.0 and t.self_device_total_ms == 48.0
    assert t.launches() == (62.4, 8000, 0.312)


def test_launches_against_the_device_time_are_measured_launch_overhead() -> None:
    ev, codes, d = _judged(os.path.join(TABLES, "decode_step_cuda_columns.txt"))
    assert ev.value("api.launch_to_device_ratio") == 62.4 / 48.0
    assert codes[0] == "GPU112"
    top = d.findings[0]
    assert top.confidence is Confidence.MEASURED and "8000 kernel-launch calls (7.8 µs each)" in top.message
    assert abs(top.impact - (1.3 / 2.3)) < 1e-9


def test_a_host_only_table_says_only_what_the_host_did() -> None:
    ev, _, d = _judged(os.path.join(TABLES, "exllama_gptq_launch_host_only.txt"))  # exllama#19
    assert ev.value("api.launch_count") == 248583 and ev.value("api.launch_host_share") == 0.248
    assert "api.launch_to_device_ratio" not in ev
    top = d.findings[0]
    assert top.code == "GPU112" and top.confidence is Confidence.HEURISTIC and "no device time" in top.message


def test_nsys_stats_launch_time_against_kernel_time() -> None:
    stats = os.path.join(DATA, "nsys_stats")
    ev, codes, _ = _judged(os.path.join(stats, "old_gpukernsum_2021_layout.txt"))  # 3000 launches, 0.92 x kernels
    assert ev.value("api.launch_count") == 3000 and "GPU112" in codes
    assert codes.index("XFR001") < codes.index("GPU112")  # copies take 69 % of the GPU: they lead
    ev, codes, _ = _judged(os.path.join(stats, "compute_bound_training_csv.txt"))  # launches 6 % of kernel time
    assert (ev.value("api.launch_to_device_ratio") or 0) < 0.1 and "GPU112" not in codes
    ev, codes, _ = _judged(os.path.join(stats, "copy_dominated_vector_add_table.txt"))  # 4 launches, one with init
    assert (ev.value("api.launch_to_device_ratio") or 0) > 10 and "GPU112" not in codes


def test_a_table_of_other_columns_is_no_profiler_table() -> None:
    p = ProfilerTableParser()
    for line in ("-----  -----  -----", "Name   Size   Owner", "-----  -----  -----", "a.txt  12     me"):
        p.feed(line)
    assert not p.matched()
