"""Every real Nsight Systems export in ../shared/data/nsys through `diagnose analyze`, and the small
copies in tests/data/nsys checked value by value.

The verdicts are judged with the registered rules plus rules/gpu_trace.py (added here until the
registry lists it, so the test does not depend on that order of work).
"""

from __future__ import annotations

import glob
import json
import os
import sqlite3

import pytest

from diagnose import cli, loose
from diagnose.collectors.logtext import clean_lines
from diagnose.derive.nsys_stats import NsysStatsSource
from diagnose.model import EvidenceSet, Finding
from diagnose.rules import gpu_trace, registry
from diagnose.rules.engine import run_rules
from tests.conftest import DATA, SHARED

NSYS_DATA = os.path.join(SHARED, "data", "nsys")
EXPORTS = sorted(glob.glob(os.path.join(NSYS_DATA, "*.sqlite")))
LOCAL = os.path.join(DATA, "nsys")
PINNED_COPY_BOUND = os.path.join(LOCAL, "pinned_copy_bound_vector_add_rtx4060ti_nsys2026_1.sqlite")
NO_GPU_ACTIVITY = os.path.join(LOCAL, "no_gpu_activity_driver_unsupported_nsys2025_1.sqlite")
RULES = registry.RULES + tuple(r for r in gpu_trace.RULES if r not in registry.RULES)
needs_shared = pytest.mark.skipif(not EXPORTS, reason="../shared/data/nsys is absent")

# what each real export is (README.txt there) and what a GPU engineer would conclude from it:
# the GPU1xx findings expected, in rank order
VERDICTS = {
    "0x822a5b87__test-cuda__7e25f8547a__report1": ["GPU101"],  # 1.2 GB over PCIe around 0.5 ms of kernels
    "0x822a5b87__test-cuda__7e25f8547a__report2": ["GPU101"],
    "GindaChen__nsys-ai__125c3c22d9__h100_2gpu_1s": ["GPU101"],  # 47 GiB of pinned HtoD in one second
    "GindaChen__nsys-ai__387e5a5d7b__mfu_2gpu_before": ["GPU107"],  # flash attention fills the GPUs
    "GindaChen__nsys-ai__387e5a5d7b__mfu_2gpu_after": [],  # 80-85 % busy, idle scattered in short gaps
    "IllusiveAldebaran__nussinov-gpu__": ["GPU107"],  # one long kernel, tiny copies
    "JiangShanCode__CUDATutorial__eb8f697392__report1": ["GPU107"],  # a 1 s reduction kernel
    "JiangShanCode__CUDATutorial__eb8f697392__report2": ["GPU101"],  # 100 MB pageable copy, 1.7 ms kernel
    "Lianhang666__gpu4__346648098b__report": ["GPU102", "GPU101"],  # pageable cudaMemcpyAsync, 1-3 GB/s
    "Lianhang666__gpu4__799bf69001__report": ["GPU101"],  # the pinned variant: no pageable finding
    "Lianhang666__gpu4__": [],  # the other vector adds: a fraction of a millisecond on the GPU
    "SMcMann__cudaHW__": ["GPU107"],  # one kernel on unified memory
    "StellaWava__benchmarking-n-profiling-__74baf909d5__report1": [],
    "haroonsyed__NVIDIA_SGEMM_PRACTICE__51a630e0cd__report1": [],
    "hpcgroup__pipit__ad30bc8498__perlmutter-cloverleaf-cuda": ["GPU107"],  # busy 89 %: syncs are not the cause
    "hpcgroup__pipit__f76ee853f0__saxpy-mpi-cuda_nsys_perlmutter0": ["GPU105", "GPU101"],  # MPI between phases
    "lighttransport__gemm__f1e2717e41__profile": [],
    "nevakrien__python_c_nvidia__1c1237f3cf__report1": [],
    "p4arth__cuda-perf-sandbox__8aa5f2e920__report1": ["GPU101"],
    "wenscarl__cutlass_benchmark__8f17c660b9__report1": ["GPU101"],
}
PARTIAL = {  # no GPU activity in the export, and why
    "StellaWava__benchmarking-n-profiling-__74baf909d5__report1": "driver version (13.1) is not supported",
    "haroonsyed__NVIDIA_SGEMM_PRACTICE__51a630e0cd__report1": "192 of them kernel launches",
    "lighttransport__gemm__f1e2717e41__profile": "driver version (13.3) is not supported",
    "nevakrien__python_c_nvidia__1c1237f3cf__report1": "no CUDA activity was recorded",
}


def _stem(path: str) -> str:
    return os.path.basename(path).rsplit(".", 1)[0]


def _expected(path: str) -> list[str]:
    stem = _stem(path)
    for key in sorted(VERDICTS, key=len, reverse=True):  # the most specific entry wins
        if stem.startswith(key):
            return VERDICTS[key]
    raise AssertionError(f"no expected verdict for {stem}")


def _judge(path: str) -> tuple[list[Finding], dict[str, object]]:
    res = loose.analyze_path(path)
    findings, _ = run_rules(EvidenceSet(res.evidence), rules=RULES)
    return list(findings), {e.key: e.value for e in res.evidence}


def _private_values(path: str) -> list[str]:
    """Environment values, user, host and paths the export holds: none may reach the report."""
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    con.text_factory = lambda b: b.decode("utf-8", "replace")
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    out: list[str] = []
    if "TARGET_INFO_SYSTEM_ENV" in tables:
        out += [str(v) for (v,) in con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV")]
    for meta in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
        if meta in tables:
            out += [str(v) for n, v in con.execute(f"SELECT name, value FROM {meta}")
                    if n in ("EXPORT_USER", "EXPORT_HOST") or "PATH" in n]
    con.close()
    return [v for v in out if len(v) >= 8 and v not in ("<redacted>", "true", "false")]


@needs_shared
@pytest.mark.parametrize("path", EXPORTS, ids=_stem)
def test_every_real_export_is_analysed(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["analyze", path, "--format", "json"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    (inp,) = doc["inputs"]
    assert inp["kind"] == "nsys_sqlite"
    stem = _stem(path)
    if stem in PARTIAL:
        assert inp["status"] == "partial" and PARTIAL[stem] in inp["reason"]
        assert not any(e["key"].startswith("trace.gpu") for e in doc["evidence"])
    else:
        assert inp["status"] == "ok", inp["reason"]
        keys = {e["key"] for e in doc["evidence"]}
        assert {"trace.gpu_busy_ratio", "trace.idle_gaps.count", "trace.devices"} <= keys
    text = json.dumps(doc)
    leaked = [v for v in _private_values(path) if v in text and v not in path]  # the input's own name is fine
    assert not leaked


@needs_shared
@pytest.mark.parametrize("path", EXPORTS, ids=_stem)
def test_verdicts_a_gpu_engineer_would_sign(path: str) -> None:
    findings, _ = _judge(path)
    got = [f.code for f in findings if f.code.startswith("GPU1")]
    assert got == _expected(path)


@needs_shared
def test_pinned_and_pageable_variants_of_the_same_program() -> None:
    pageable = os.path.join(NSYS_DATA, "Lianhang666__gpu4__0fdc34dd6d__report_large_vector.sqlite")
    pinned = os.path.join(NSYS_DATA, "Lianhang666__gpu4__bc0bf4c92f__report_large_vector.sqlite")
    f_pg, ev_pg = _judge(pageable)
    f_pn, ev_pn = _judge(pinned)
    assert ev_pg["copy.pageable_ratio"] == 1.0 and ev_pn["copy.pageable_ratio"] == 0.0
    assert ev_pg["copy.pageable_async_count"] == 12 and ev_pn["copy.pageable_async_count"] == 0
    assert ev_pn["copy.pinned_count"] == 12
    # 0.1 ms of copies in a 0.6 ms program: a real difference, too small to be anyone's bottleneck
    assert not [f for f in f_pg + f_pn if f.code.startswith("GPU1")]
    # the big pageable program is judged, and the pinned one is not told to pin
    f_big, _ = _judge(os.path.join(NSYS_DATA, "Lianhang666__gpu4__346648098b__report.sqlite"))
    assert "pageable host memory" in next(f for f in f_big if f.code == "GPU101").message
    f_pinned, _ = _judge(os.path.join(NSYS_DATA, "Lianhang666__gpu4__799bf69001__report.sqlite"))
    gpu101 = next(f for f in f_pinned if f.code == "GPU101")
    assert "pinned memory" in gpu101.message and gpu101.fixes[0].summary == "Move fewer bytes over PCIe"


@needs_shared
def test_copy_bound_and_compute_bound_traces() -> None:
    f_copy, ev_copy = _judge(os.path.join(NSYS_DATA, "GindaChen__nsys-ai__125c3c22d9__h100_2gpu_1s.sqlite"))
    f_comp, ev_comp = _judge(os.path.join(NSYS_DATA, "GindaChen__nsys-ai__387e5a5d7b__mfu_2gpu_before.sqlite"))
    assert ev_copy["copy.exposed_share"] > 0.9 and ev_comp["copy.exposed_share"] < 0.05  # type: ignore[operator]
    assert ev_copy["trace.device_count"] == ev_comp["trace.device_count"] == 2
    assert f_copy[0].category.value == "pcie_transfer"
    assert [f.category.value for f in f_comp] == ["gpu_compute"]
    # the 4 pageable copies of 8 bytes in the copy-bound trace are not worth a finding of their own
    assert ev_copy["copy.pageable_async_count"] == 4 and "GPU102" not in {f.code for f in f_copy}
    # the host waits on cudaStreamSynchronize ~half its wall, but the GPU is busy: not the bottleneck
    assert ev_copy["api.sync_wall_share"] > 0.4 and "GPU104" not in {f.code for f in f_copy}  # type: ignore[operator]
    stages = {r["name"] for r in ev_comp["trace.nvtx_ranges"]}  # type: ignore[union-attr]
    assert "aten::copy_, op_id = #" in stages


@needs_shared
def test_union_of_busy_intervals_matches_a_plain_merge_on_a_real_export() -> None:
    path = os.path.join(NSYS_DATA, "GindaChen__nsys-ai__387e5a5d7b__mfu_2gpu_before.sqlite")
    con = sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)
    want = {}
    for dev in (0, 1):
        rows = con.execute(
            'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = ?1 UNION ALL '
            'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE deviceId = ?1 UNION ALL '
            'SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMSET WHERE deviceId = ?1 ORDER BY 1', (dev,)).fetchall()
        busy, cur = 0, None
        for s, e in rows:
            if cur is None or s > cur[1]:
                busy += 0 if cur is None else cur[1] - cur[0]
                cur = [s, e]
            else:
                cur[1] = max(cur[1], e)
        want[dev] = busy + (cur[1] - cur[0] if cur else 0)
    con.close()
    from diagnose.collectors import nsys

    got = {d.device: d.busy_ns for d in nsys.read_export(path).devices}
    assert got == want


def test_local_pinned_export_agrees_with_the_nsys_stats_summary_of_the_same_capture() -> None:
    _, ev = _judge(PINNED_COPY_BOUND)
    src = NsysStatsSource()
    with open(os.path.join(DATA, "nsys_stats", "copy_dominated_vector_add_table.txt"), encoding="utf-8") as fh:
        for line in clean_lines(fh.readlines()):
            src.feed(line)
    stats = {e.key: e.value for e in src.evidence("stats")}
    for key in ("gpu.kernel_time_ms", "copy.h2d_time_ms", "copy.d2h_time_ms", "api.sync_time_ms", "copy.time_ms"):
        assert ev[key] == pytest.approx(stats[key], abs=1e-3), key
    for key in ("copy.h2d_bytes", "copy.d2h_bytes", "copy.count", "api.memcpy_calls", "gpu.kernel_count"):
        assert ev[key] == stats[key], key
    assert ev["copy.pinned_bytes"] == 1_200_000_000 and ev["copy.pageable_ratio"] == 0.0
    assert ev["copy.h2d_gbps"] == pytest.approx(800_000_000 / 61_322_687)
    assert ev["trace.nsys_version"] == "2026.1.1.204"
    assert ev["trace.sync_events"] == {"event": {"count": 1, "time_ms": 77.005}}  # CUPTI numbering (2026)


def test_local_pinned_export_verdict() -> None:
    findings, ev = _judge(PINNED_COPY_BOUND)
    gpu101 = next(f for f in findings if f.code == "GPU101")
    assert gpu101.category.value == "pcie_transfer" and gpu101.confidence.value == "measured"
    assert "pinned memory" in gpu101.message and "13.0 GB/s" in gpu101.message
    assert ev["trace.devices"][0]["name"] == "NVIDIA GeForce RTX 4060 Ti"  # type: ignore[index]
    assert not [f for f in findings if f.code in ("GPU102", "GPU104", "GPU105", "GPU106", "GPU107")]


def test_local_export_without_gpu_activity_is_partial_with_the_reason() -> None:
    res = loose.analyze_path(NO_GPU_ACTIVITY)
    (inp,) = res.inputs
    assert inp.status == "partial" and inp.kind == "nsys_sqlite"
    assert "3 CUDA API calls were traced but the export holds no GPU activity" in inp.reason
    assert "driver version (13.3) is not supported" in inp.reason
    keys = {e.key for e in res.evidence}
    assert "trace.gpu_busy_ratio" not in keys and "api.launch_count" in keys
