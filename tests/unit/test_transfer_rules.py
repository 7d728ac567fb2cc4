"""XFR001 on nsys stats from real exports; XFR002 on incident prose; the small-copy guard."""

from __future__ import annotations

import os

from diagnose.collectors.logtext import clean_lines
from diagnose.derive.nsys_stats import NsysStatsSource, TransferReportSource
from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding
from diagnose.rules.engine import run_rules
from diagnose.rules.transfer import CopyDominatedGpuTime, CopyOverheadReported
from tests.conftest import DATA

MINE = (CopyDominatedGpuTime, CopyOverheadReported)


def _evidence(rel: str) -> EvidenceSet:
    out: list[Evidence] = []
    with open(os.path.join(DATA, rel), encoding="utf-8") as fh:
        lines = list(clean_lines(fh.readlines()))
    for cls in (NsysStatsSource, TransferReportSource):
        src = cls()
        for line in lines:
            src.feed(line)
        if src.matched():
            out.extend(src.evidence(rel))
    return EvidenceSet(out)


def _findings(ev: EvidenceSet) -> dict[str, Finding]:
    findings, _ = run_rules(ev, rules=MINE)
    return {f.code: f for f in findings}


def test_copy_dominated_real_export() -> None:
    f = _findings(_evidence("nsys_stats/copy_dominated_vector_add_table.txt"))["XFR001"]
    assert f.category is Category.PCIE_TRANSFER and f.confidence is Confidence.MEASURED
    assert "99 %" in f.message and "HtoD 61.3 ms" in f.message
    assert "round trip" in f.message  # DtoH and HtoD of similar size


def test_compute_bound_real_export_is_not_copy_bound() -> None:
    assert _findings(_evidence("nsys_stats/compute_bound_training_csv.txt")) == {}


def test_many_small_copies_put_batching_first() -> None:
    f = _findings(_evidence("nsys_stats/old_gpukernsum_2021_layout.txt"))["XFR001"]
    assert "many small copies" in f.message
    assert f.fixes[0].summary.startswith("Batch")


def test_tiny_copies_in_a_tiny_trace_are_not_the_bottleneck() -> None:
    ev = EvidenceSet([Evidence("copy.time_share", 0.6, "ratio", "t"), Evidence("copy.time_ms", 0.004, "ms", "t")])
    assert _findings(ev) == {}


def test_reported_factor_ort_11367() -> None:
    f = _findings(_evidence("reports/transfer_if_node_memcpy_nsight_3x.txt"))["XFR002"]
    assert f.confidence is Confidence.THIN and abs(f.impact - 2 / 3) < 1e-9
    assert "3×" in f.message


def test_reported_round_trip_ort_11254() -> None:
    f = _findings(_evidence("reports/transfer_if_node_d2h_h2d_round_trip.txt"))["XFR002"]
    assert any("io_binding" in s for fx in f.fixes for s in fx.steps)


def test_prose_without_a_profile_claim_is_silent() -> None:
    assert _findings(_evidence("reports/no_transfer_claim_preprocess_kernel.txt")) == {}


def test_dev_incident_end_to_end() -> None:
    from diagnose import pipeline

    d = pipeline.analyze([os.path.join(DATA, "reports/transfer_if_node_memcpy_nsight_3x.txt")])
    assert d.primary is Category.PCIE_TRANSFER
