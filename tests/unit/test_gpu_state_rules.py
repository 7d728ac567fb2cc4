"""PLC002 (GPU idle for a whole recording) and MEM010 (memory outside the listed processes): each branch of the
decision, on evidence as the nvidia-smi reader gives it, and together with a service's own evidence."""

from __future__ import annotations

import os

from diagnose import loose, pipeline
from diagnose.model import Evidence, EvidenceSet
from diagnose.rules.engine import run_rules
from diagnose.rules.gpu_state import GpuIdleWholeRecording, MemoryOutsideListedProcesses
from tests.conftest import DATA

MiB = 1 << 20
GiB = 1 << 30


def _idle(**changes: float) -> EvidenceSet:
    """An idle recording (overrides by key, ``gpu__sampled_span_s`` for ``gpu.sampled_span_s``)."""
    values: dict[str, float] = {"gpu.util_ratio": 0.004, "gpu.util_max_ratio": 0.03, "gpu.util_samples": 120,
                                "gpu.sampled_span_s": 600.0, "gpu.memory_used_bytes": 9 * GiB, "gpu.count": 1}
    values.update({k.replace("__", "."): v for k, v in changes.items()})
    return EvidenceSet(Evidence(k, v, "", "t") for k, v in values.items())


def _plc(ev: EvidenceSet):  # type: ignore[no-untyped-def]
    findings, skipped = run_rules(ev, rules=[GpuIdleWholeRecording])
    assert not skipped
    return findings[0] if findings else None


def test_idle_recording_without_load_is_major_and_says_it_cannot_know_the_workload_ran() -> None:
    f = _plc(_idle())
    assert f is not None and f.severity.value == "major" and f.confidence.value == "measured"
    assert "9.0 GiB is held (a model is loaded)" in f.message and "If the workload ran" in f.message


def test_idle_recording_with_requests_in_flight_is_critical() -> None:
    f = _plc(_idle(conn__inflight_mean=6.2))
    assert f is not None and f.severity.value == "critical" and "6.2 requests in flight" in f.message
    assert f.impact > 0.99


def test_an_idle_service_on_an_idle_gpu_is_no_finding() -> None:
    assert _plc(_idle(serving__running_mean=0.0)) is None


def test_too_short_too_few_or_any_real_work_is_no_finding() -> None:
    assert _plc(_idle(gpu__sampled_span_s=20.0)) is None  # a recording shorter than a minute
    assert _plc(_idle(gpu__util_samples=12)) is None
    assert _plc(_idle(gpu__util_max_ratio=0.4)) is None  # a reading at 40 %: the GPU did run part of the work
    assert _plc(_idle(gpu__util_ratio=0.05)) is None


def test_without_times_the_span_is_unknown_and_the_confidence_heuristic() -> None:
    ev = EvidenceSet(e for e in _idle() if e.key != "gpu.sampled_span_s")
    f = _plc(ev)
    assert f is not None and f.confidence.value == "heuristic"


def test_the_a40_run_with_its_request_log_is_critical_placement() -> None:
    """The A40 recording analysed together with a stage log of the same run (requests served)."""
    d = pipeline.analyze([os.path.join(DATA, "nvsmi", "a40_zero_util_whole_llm_pipeline_run_custom_header.csv"),
                          os.path.join(DATA, "timing", "stage_log_preprocess_dominates.jsonl")])
    plc = next(f for f in d.findings if f.code == "PLC002")
    assert plc.severity.value == "critical" and "requests served" in plc.message
    assert d.findings[0].code == "PLC002"


def _mem(oom: bool = False, **extra: float) -> EvidenceSet:
    ev = EvidenceSet([
        Evidence("gpu.memory_unlisted_bytes", 18 * GiB, "bytes", "t", detail="GPU 0 (NVIDIA A10G): 18.0 GiB used"),
        Evidence("gpu.memory_unlisted_share_ratio", 0.8, "ratio", "t"),
        Evidence("gpu.memory_total_bytes", 22.5 * GiB, "bytes", "t"),
        Evidence("gpu.processes", [], "list", "t"),
    ])
    if oom:
        ev.add(Evidence("mem.oom_count", 1, "count", "t"))
    for key, value in extra.items():
        ev.add(Evidence(key.replace("__", "."), value, "", "t"))
    return ev


def _mem7(ev: EvidenceSet):  # type: ignore[no-untyped-def]
    findings, _ = run_rules(ev, rules=[MemoryOutsideListedProcesses])
    return findings[0] if findings else None


def test_unlisted_memory_without_an_oom_is_a_note() -> None:
    f = _mem7(_mem())
    assert f is not None and f.severity.value == "info" and "own PID namespace" in f.message


def test_unlisted_memory_with_an_oom_is_the_external_cause() -> None:
    f = _mem7(_mem(oom=True))
    assert f is not None and f.severity.value == "major" and f.category.value == "oom_external"
    assert f.confidence.value == "heuristic"


def test_an_oom_message_that_measured_other_processes_leaves_it_to_mem004() -> None:
    assert _mem7(_mem(oom=True, mem__other_processes_bytes=15.0 * GiB)) is None
    assert _mem7(_mem(oom=True, mem__process_used_bytes=6.4 * GiB, mem__device_total_bytes=22.0 * GiB,
                      mem__device_free_bytes=0.02 * GiB)) is None


def test_small_unlisted_memory_is_no_finding() -> None:
    ev = EvidenceSet([Evidence("gpu.memory_unlisted_bytes", 600 * MiB, "bytes", "t"),
                      Evidence("gpu.memory_unlisted_share_ratio", 0.026, "ratio", "t"),
                      Evidence("gpu.memory_total_bytes", 22.5 * GiB, "bytes", "t")])
    assert _mem7(ev) is None  # a bare context of a hidden process, or the old drivers' own reservation


def test_the_oom_and_the_table_in_one_paste() -> None:
    res = loose.analyze_path(os.path.join(DATA, "nvsmi",
                                          "table_oom_cuda_error_memory_held_no_process_listed_container.txt"))
    kinds = res.inputs[0].kind.split("+")
    assert "oom" in kinds and "nvidia-smi" in kinds
    ev = {e.key: e.value for e in res.evidence}
    assert ev["mem.oom_count"] == 1 and ev["gpu.processes"] == [] and ev["gpu.memory_unlisted_bytes"] == 18342 * MiB


def test_an_nvml_window_gives_the_same_keys_and_a_few_seconds_are_not_a_run() -> None:
    from diagnose.collectors.nvml import read_samples
    from diagnose.derive.nvml import derive

    samples = read_samples(os.path.join(DATA, "nvml", "idle_no_load_h100.jsonl"))
    ev = EvidenceSet([*derive(samples, ()), Evidence("conn.inflight_mean", 6.0, "requests", "psutil")])
    assert ev.value("gpu.util_max_ratio") == 0.0 and ev.value("gpu.util_samples") == 60
    assert abs((ev.value("gpu.sampled_span_s") or 0.0) - 5.9) < 0.01
    assert _plc(ev) is None  # a 6 s attach window at 0 % is GPU001's (starved) to judge, not a whole run
