"""NVML: record and replay at the call boundary, GPU discovery, degrading, and the replayed scenarios.

The recordings under tests/data/nvml/ are synthetic to NVML's spec (see their README); each is
replayed through the sampler's own code (``read_samples``) and judged by the real rules.
"""

from __future__ import annotations

import filecmp
import importlib.util
import json
import os
import sys
from typing import Any

import pytest

from diagnose.collectors import nvml
from diagnose.collectors.nvml import (
    NO_TARGET_GPU,
    Collector,
    LiveNvml,
    NvmlCallError,
    NvmlSampler,
    ReplayNvml,
    _Dispatch,
    device_minors,
    nspids,
    probe,
    read_samples,
)
from diagnose.derive.nvml import derive, link_bytes_per_s, missing_reason
from diagnose.model import CaptureStatus, Evidence, EvidenceSet, Window
from diagnose.rules.engine import run_rules
from diagnose.rules.gpu import RULES as GPU_RULES
from tests.conftest import DATA

NVML_DATA = os.path.join(DATA, "nvml")
GiB = 1 << 30


def _real_nvml_present() -> bool:
    try:
        api = LiveNvml()
        api.init()
        api.shutdown()
        return True
    except NvmlCallError:
        return False


class FakeNvml(_Dispatch):
    """Answers from a table: a value, a callable(*args), or an NvmlCallError to raise. Counts calls."""

    def __init__(self, answers: dict[str, Any], ticks: int = 5) -> None:
        self.answers = answers
        self.calls: dict[str, int] = {}
        self.ticks = ticks
        self.n = 0

    def _call(self, fn: str, *args: Any) -> Any:
        self.calls[fn] = self.calls.get(fn, 0) + 1
        if fn == "now":
            self.n += 1
            return 1000.0 + self.n * 0.1
        if fn in ("init", "shutdown", "register_xid_events") and fn not in self.answers:
            return None
        got = self.answers.get(fn, NvmlCallError("NotSupported", 3, "Not Supported"))
        if isinstance(got, NvmlCallError):
            raise got
        return got(*args) if callable(got) else got


def _device(procs: dict[int, list[dict[str, Any]]], **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "device_count": len(procs),
        "driver_version": "550.90.07",
        "device_name": "NVIDIA L4",
        "device_minor_number": lambda i: i,
        "device_compute_processes": lambda i: procs.get(i, []),
        "device_graphics_processes": [],
        "device_utilization_rates": {"gpu": 40, "memory": 10},
        "device_memory_info": lambda i: {"total": 24 * GiB, "used": sum(p["used_bytes"] for p in procs.get(i, [])),
                                         "free": 0},
        "process_tree": [{"pid": 100, "nspid": [100]}],
        "process_name": "python3",
        "open_device_minors": [],
        "wait_xid_event": None,
    }
    base.update(extra)
    return base


def _run(api: FakeNvml, ticks: int, tmp_path: Any, pid: int = 100) -> tuple[list[dict[str, Any]], Any]:
    sampler = NvmlSampler(pid, str(tmp_path), api=api)
    for _ in range(ticks):
        sampler.tick()
    cap = sampler.close()
    return read_samples(os.path.join(str(tmp_path), nvml.NVML_FILE)), cap


def _keys(samples: list[dict[str, Any]], pids: tuple[int, ...] = ()) -> dict[str, Any]:
    return {e.key: e.value for e in derive(samples, pids)}


# -- no driver, no GPU -----------------------------------------------------------------------


def test_probe_here_says_there_is_no_driver_in_one_sentence() -> None:
    if _real_nvml_present():
        pytest.skip("this machine has an NVIDIA driver")
    avail = probe(os.getpid())
    assert not avail.ok
    assert avail.reason == "no NVIDIA driver on this machine (the NVML library libnvidia-ml.so.1 was not found)"
    assert "\n" not in avail.reason and "--gpus all" in avail.remedy


def test_live_sampler_without_a_driver_is_skipped_and_never_raises(tmp_path) -> None:
    if _real_nvml_present():
        pytest.skip("this machine has an NVIDIA driver")
    sampler = NvmlSampler(os.getpid(), str(tmp_path))
    for _ in range(3):
        sampler.tick()
    cap = sampler.close(Window(1.0, 2.0))
    assert cap.status is CaptureStatus.SKIPPED and cap.collector == "nvml"
    assert "no NVIDIA driver" in cap.reason and cap.remedy
    assert sampler.samples == 0


@pytest.mark.parametrize(("error", "words"), [
    ("DriverNotLoaded", "kernel driver is not loaded"),
    ("NotInstalled", "nvidia-ml-py"),
    ("LibRmVersionMismatch", "versions differ"),
    ("NoPermission", "not permitted"),
    ("Unknown", "NVML could not start: Unknown"),
])
def test_probe_explains_each_start_up_error(error: str, words: str) -> None:
    avail = probe(1, api=FakeNvml({"init": NvmlCallError(error, 9, "x")}))
    assert not avail.ok and words in avail.reason and avail.remedy


def test_probe_with_a_driver_but_no_gpu() -> None:
    avail = probe(1, api=FakeNvml({"device_count": 0}))
    assert not avail.ok and "sees no GPU" in avail.reason
    assert probe(1, api=FakeNvml({"device_count": 2})).ok


def test_live_errors_keep_nvmls_name() -> None:
    if _real_nvml_present():
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NvmlCallError) as info:
        LiveNvml().init()
    assert info.value.name == "LibraryNotFound" and info.value.code == 12
    with pytest.raises(NvmlCallError, match="Uninitialized"):
        LiveNvml().device_count()


# -- the replayed scenarios --------------------------------------------------------------------

# load and CPU evidence the same window's other collectors (psutil, py-spy) would add
LOAD = [Evidence("conn.inflight_mean", 6.0, "requests", "psutil"),
        Evidence("workers.active_mean", 1.3, "threads", "py-spy")]
SCENARIOS: dict[str, tuple[list[Evidence], list[str]]] = {
    "saturated_h100": (LOAD, ["GPU002"]),
    "starved_a10g_bursty": ([*LOAD, Evidence("cpu.preprocess_share", 0.64, "ratio", "py-spy")], ["GPU001"]),
    "throttled_thermal_h100_pcie": (LOAD, ["GPU003", "GPU002"]),
    "pcie_gen3_x8_on_gen4_x16_a100": (LOAD, ["GPU004"]),
    "filled_by_other_process_h100": ([], ["GPU005"]),
    # the false-alarm guard: an idle GPU, no requests, link at gen1 to save power
    "idle_no_load_h100": ([Evidence("conn.inflight_mean", 0.0, "requests", "psutil"),
                           Evidence("workers.active_mean", 0.02, "threads", "py-spy")], []),
}


def _verdict(name: str) -> tuple[list[str], EvidenceSet, list[Any]]:
    samples = read_samples(os.path.join(NVML_DATA, f"{name}.jsonl"))
    extra, _ = SCENARIOS[name]
    ev = EvidenceSet([*derive(samples, ()), *extra])
    findings, _ = run_rules(ev, rules=GPU_RULES)
    return [f.code for f in findings], ev, list(findings)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_replayed_recording_gives_the_right_finding(name: str) -> None:
    codes, _, _ = _verdict(name)
    assert codes == SCENARIOS[name][1]


def test_starved_scenario_numbers_and_cause() -> None:
    _, ev, findings = _verdict("starved_a10g_bursty")
    assert abs((ev.value("gpu.util_ratio") or 0) - 0.294) < 0.01
    assert ev.value("gpu.util_p10_ratio") == 0.0 and (ev.value("gpu.util_p90_ratio") or 0) > 0.9
    f = findings[0]
    assert f.category.value == "cpu_preprocessing" and f.confidence.value == "correlated"
    assert "works in bursts" in f.message and "pre/post-processing" in f.message
    # the synthetic A10G answers violation counters with NotSupported: degraded with the reason
    na = ev.get("gpu.nvml_unavailable")
    assert isinstance(na, Evidence) and "violation_power: NotSupported (Not Supported)" in na.value
    assert "gpu.power_violation_ratio" not in ev


def test_throttled_scenario_ranks_the_throttling_first() -> None:
    _, ev, findings = _verdict("throttled_thermal_h100_pcie")
    assert findings[0].code == "GPU003" and findings[0].severity.value == "critical"
    assert "Thermal slowdown" in findings[0].message and "91 °C" in findings[0].message
    assert "fix the throttling first" in findings[1].message
    assert abs((ev.value("gpu.thermal_violation_ratio") or 0) - 0.7) < 0.01
    reasons = ev.get("gpu.throttle_reasons")
    assert isinstance(reasons, Evidence) and "HwThermalSlowdown" in reasons.value and "GpuIdle" not in reasons.value


def test_pcie_scenario_judges_the_link_under_load_not_at_idle() -> None:
    _, ev, findings = _verdict("pcie_gen3_x8_on_gen4_x16_a100")
    assert ev.value("pcie.link_gen") == 3 and ev.value("pcie.link_width") == 8  # gen1 idle readings ignored
    assert ev.value("pcie.loaded_samples") == 55 and ev.value("pcie.replay_count_delta") == 100
    assert ev.value("pcie.link_capacity_bytes_per_s") == link_bytes_per_s(3, 8)
    f = findings[0]
    assert f.category.value == "pcie_transfer" and f.severity.value == "major"
    assert "gen3 x8" in f.message and "gen4 x16" in f.message and "100 PCIe replays" in f.message


def test_idle_scenario_keeps_idle_link_and_idle_clocks_out_of_the_verdict() -> None:
    _, ev, _ = _verdict("idle_no_load_h100")
    assert ev.value("pcie.link_gen") == 1 and ev.value("pcie.loaded_samples") == 0
    assert ev.value("gpu.throttle_ratio") == 0.0  # GpuIdle is not throttling
    findings, skipped = run_rules(ev, rules=GPU_RULES)
    assert findings == () and not {s.code for s in skipped} & {"GPU001", "GPU003", "GPU004"}


def test_filled_by_other_scenario_matches_the_container_pid_and_names_the_holder() -> None:
    samples = read_samples(os.path.join(NVML_DATA, "filled_by_other_process_h100.jsonl"))
    ev = _keys(samples)
    assert ev["mem.process_used_bytes"] == 2 * GiB and ev["mem.other_processes_bytes"] == 70 * GiB
    procs = {p["pid"]: p for p in ev["gpu.processes"]}
    assert procs[918374]["is_target"] and not procs[877102]["is_target"]
    _, _, findings = _verdict("filled_by_other_process_h100")
    f = findings[0]
    assert f.category.value == "oom_external" and f.severity.value == "major"
    assert "pid 877102 (python3) 70.0 GiB" in f.message and "2.0 GiB" in f.message and "91 % full" in f.message


def test_saturated_scenario_uses_gpm() -> None:
    _, ev, findings = _verdict("saturated_h100")
    assert (ev.value("gpm.sm_activity_ratio") or 0) > 0.8 and ev.value("gpm.tensor_activity_ratio")
    assert findings[0].confidence.value == "measured" and "tensor-core bound" in findings[0].message


def test_recordings_are_current_and_deterministic(tmp_path, monkeypatch) -> None:
    """Regenerating the synthetic recordings with today's sampler gives the checked-in bytes."""
    spec = importlib.util.spec_from_file_location("make_recordings", os.path.join(NVML_DATA, "make_recordings.py"))
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_recordings", mod)  # dataclasses look their module up
    spec.loader.exec_module(mod)
    for sc in mod.SCENARIOS:
        fresh = mod.write(sc, str(tmp_path))
        assert filecmp.cmp(fresh, os.path.join(NVML_DATA, os.path.basename(fresh)), shallow=False), (
            f"{sc.name}.jsonl is stale: run tests/data/nvml/make_recordings.py")


def test_every_recording_is_raw_calls_in_nvml_units() -> None:
    with open(os.path.join(NVML_DATA, "throttled_thermal_h100_pcie.jsonl"), encoding="utf-8") as fh:
        lines = [json.loads(x) for x in fh]
    assert lines[0]["schema"] == nvml.SCHEMA and lines[0]["pid"] == 4242
    by_fn = {d["fn"]: d for d in lines[1:]}
    assert by_fn["device_power_usage"]["ok"] > 100_000  # mW
    assert by_fn["device_memory_info"]["ok"]["total"] == 81559 * (1 << 20)  # bytes
    assert set(by_fn["device_violation_status"]["ok"]) == {"reference_time_us", "violation_time_ns"}
    assert isinstance(by_fn["device_clocks_event_reasons"]["ok"], int)  # the bitmask


# -- record / replay -------------------------------------------------------------------------


def test_replay_serves_answers_in_order_and_errors_as_recorded() -> None:
    lines = [json.dumps(x) for x in (
        {"schema": nvml.SCHEMA, "pid": 7},
        {"fn": "device_temperature", "args": [0], "ok": 60},
        {"fn": "device_temperature", "args": [0], "err": {"name": "GpuIsLost", "code": 15, "msg": "GPU is lost"}},
        {"fn": "device_temperature", "args": [1], "ok": 70},
    )] + ["{torn"]
    api = ReplayNvml(lines)
    assert api.meta["pid"] == 7
    assert api.device_temperature(1) == 70 and api.device_temperature(0) == 60
    with pytest.raises(NvmlCallError) as info:
        api.device_temperature(0)
    assert info.value.name == "GpuIsLost" and info.value.code == 15
    with pytest.raises(NvmlCallError, match="NotRecorded"):
        api.device_temperature(0)
    with pytest.raises(nvml.ReplayExhausted):
        api.now()


def test_record_then_replay_gives_the_same_samples(tmp_path) -> None:
    procs = {0: [{"pid": 100, "used_bytes": 3 * GiB}, {"pid": 555, "used_bytes": 9 * GiB}]}
    api = FakeNvml(_device(procs, device_clock_info=lambda i, c: 1500, device_clocks_event_reasons=0x4))
    col = Collector(100)
    live = [col.collect(api) for _ in range(12)]  # what the sampler saw live, without a recorder
    samples, cap = _run(FakeNvml(_device(procs, device_clock_info=lambda i, c: 1500,
                                         device_clocks_event_reasons=0x4)), 12, tmp_path)
    assert cap.status is CaptureStatus.OK and cap.files == ("nvml.jsonl",)

    def strip(s: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in s.items() if k != "ts"}

    assert [strip(s) for s in samples] == [strip(s) for s in live]


def test_unsupported_calls_degrade_with_the_reason_and_are_not_repeated(tmp_path) -> None:
    api = FakeNvml(_device({0: [{"pid": 100, "used_bytes": GiB}]},
                           device_utilization_rates=NvmlCallError("NotSupported", 3, "Not Supported")))
    samples, cap = _run(api, 15, tmp_path)
    assert cap.status is CaptureStatus.OK and len(samples) == 15
    assert api.calls["device_utilization_rates"] == 1  # sticky: asked once
    assert samples[-1]["devices"][0]["na"]["utilization"] == "NotSupported (Not Supported)"
    ev = _keys(samples)
    assert "gpu.util_ratio" not in ev and "utilization: NotSupported (Not Supported)" in ev["gpu.nvml_unavailable"]
    _findings, skipped = run_rules(EvidenceSet(derive(samples, ())), rules=GPU_RULES)
    assert any(s.code == "GPU001" and "gpu.util_ratio" in s.reason for s in skipped)


def test_transient_errors_are_retried(tmp_path) -> None:
    answers = iter([NvmlCallError("Unknown", 999, "boom")] + [{"gpu": 50, "memory": 5}] * 10)

    def util(i: int) -> dict[str, int]:
        got = next(answers)
        if isinstance(got, NvmlCallError):
            raise got
        return got

    api = FakeNvml(_device({0: [{"pid": 100, "used_bytes": GiB}]}, device_utilization_rates=util))
    samples, _ = _run(api, 4, tmp_path)
    assert "utilization" in samples[0]["devices"][0]["na"]
    assert samples[1]["devices"][0]["util_gpu_pct"] == 50 and "utilization" not in samples[1]["devices"][0]["na"]


def test_a_torn_last_tick_is_dropped(tmp_path) -> None:
    api = FakeNvml(_device({0: [{"pid": 100, "used_bytes": GiB}]}))
    _samples, _ = _run(api, 5, tmp_path)
    path = os.path.join(str(tmp_path), nvml.NVML_FILE)
    with open(path, encoding="utf-8") as fh:
        lines = fh.readlines()
    last_now = max(i for i, x in enumerate(lines) if '"fn":"now"' in x)
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(lines[: last_now + 4])
        fh.write('{"fn":"device_memory_info","ar')  # killed mid-write
    assert len(read_samples(path)) == 4
    assert read_samples(os.path.join(str(tmp_path), "absent.jsonl")) == []


# -- which GPUs, whose memory ----------------------------------------------------------------------


def test_nspid_and_device_files_from_proc(tmp_path) -> None:
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "status").write_text("Name:\tpython3\nPid:\t918374\nNSpid:\t918374\t7\n")
    assert nspids(7, str(proc)) == [918374, 7]
    assert nspids(8, str(proc)) == [8]
    fd = proc / "7" / "fd"
    fd.mkdir()
    for n, target in enumerate(("/dev/nvidia3", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/tmp/x")):
        os.symlink(target, fd / str(n))
    assert device_minors([7, 8], str(proc)) == [0, 3]
    assert os.getpid() in nspids(os.getpid())


def test_only_the_gpus_the_target_holds_a_context_on(tmp_path) -> None:
    # CUDA opened all four device nodes, but the target's context is on GPU 2 only
    procs = {0: [{"pid": 900, "used_bytes": GiB}], 1: [], 2: [{"pid": 100, "used_bytes": 5 * GiB}], 3: []}
    api = FakeNvml(_device(procs, open_device_minors=[0, 1, 2, 3]))
    samples, _ = _run(api, 3, tmp_path)
    assert [d["index"] for d in samples[-1]["devices"]] == [2] and samples[-1]["match"] == "pid"
    ev = _keys(samples)
    assert ev["gpu.count"] == 1 and ev["mem.other_processes_bytes"] == 0


def test_container_pid_mismatch_falls_back_to_device_files_and_owns_nothing(tmp_path) -> None:
    # NVML answers host pids the container cannot see: ownership is unknown, so no other-process claim
    procs = {0: [], 1: [{"pid": 918374, "used_bytes": 2 * GiB}, {"pid": 877102, "used_bytes": 20 * GiB}]}
    api = FakeNvml(_device(procs, process_tree=[{"pid": 7, "nspid": [7]}], open_device_minors=[0, 1]))
    samples, _ = _run(api, 3, tmp_path, pid=7)
    assert [d["index"] for d in samples[-1]["devices"]] == [1] and samples[-1]["match"] == "device-file"
    ev = derive(samples, ())
    keys = {e.key: e for e in ev}
    assert "mem.other_processes_bytes" not in keys and "mem.process_used_bytes" not in keys
    assert "device files" in keys["gpu.count"].detail and "unknown" in keys["gpu.processes"].detail


def test_target_pids_given_to_derive_count_as_the_target(tmp_path) -> None:
    procs = {0: [{"pid": 100, "used_bytes": GiB}, {"pid": 555, "used_bytes": 30 * GiB}]}
    samples, _ = _run(FakeNvml(_device(procs)), 3, tmp_path)
    assert _keys(samples)["mem.other_processes_bytes"] == 30 * GiB
    assert _keys(samples, (555,))["mem.other_processes_bytes"] == 0


def test_no_gpu_in_the_tree_is_said_and_explains_missing_keys(tmp_path) -> None:
    api = FakeNvml(_device({0: [{"pid": 900, "used_bytes": GiB}]}))
    samples, cap = _run(api, 3, tmp_path)
    assert cap.status is CaptureStatus.OK and cap.reason == NO_TARGET_GPU
    assert derive(samples, ()) == [] and missing_reason(samples) == NO_TARGET_GPU
    assert missing_reason([]) == "NVML recorded no sample"


def test_xid_events_are_drained_without_blocking(tmp_path) -> None:
    events = iter([{"device": 0, "event_type": 8, "xid": 79}, None, None, None])
    api = FakeNvml(_device({0: [{"pid": 100, "used_bytes": GiB}]}, wait_xid_event=lambda: next(events)))
    samples, _ = _run(api, 3, tmp_path)
    xids = _keys(samples)["gpu.xid_events"]
    assert [(x["gpu"], x["xid"]) for x in xids] == [(0, 79)]


def test_xid_registration_unsupported_is_reported(tmp_path) -> None:
    api = FakeNvml(_device({0: [{"pid": 100, "used_bytes": GiB}]},
                           register_xid_events=NvmlCallError("NotSupported", 3, "Not Supported")))
    samples, _ = _run(api, 2, tmp_path)
    ev = _keys(samples)
    assert "gpu.xid_events" not in ev and "xid: NotSupported (Not Supported)" in ev["gpu.nvml_unavailable"]


def test_sampler_failure_mid_window_is_partial(tmp_path) -> None:
    ticks = iter(range(100))
    api = FakeNvml(_device({0: [{"pid": 100, "used_bytes": GiB}]}))

    def boom(*_: Any) -> Any:
        if next(ticks) >= 2:
            raise RuntimeError("driver hiccup")
        return [{"pid": 100, "nspid": [100]}]

    api.answers["process_tree"] = boom
    sampler = NvmlSampler(100, str(tmp_path), api=api)
    for _ in range(25):  # the tree is re-read every 10th tick: the third read fails
        sampler.tick()
    cap = sampler.close()
    assert cap.status is CaptureStatus.PARTIAL and "driver hiccup" in cap.reason and sampler.samples >= 1


def test_link_capacity_table() -> None:
    assert link_bytes_per_s(4, 16) == pytest.approx(31.5e9, rel=0.01)
    assert link_bytes_per_s(3, 8) == pytest.approx(7.88e9, rel=0.01)
    assert link_bytes_per_s(9, 16) is None


# -- LiveNvml against a stand-in pynvml (no GPU here: the mapping of pynvml's types is still tested) --


def _fake_pynvml() -> Any:
    import types

    mod = types.ModuleType("pynvml")

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return {3: "Not Supported", 10: "Timeout", 13: "Function Not Found"}.get(self.value, "Unknown Error")

    def err(name: str, value: int) -> type:
        return type(f"NVMLError_{name}", (NVMLError,), {"__init__": lambda self, *a: NVMLError.__init__(self, value)})

    mod.NVMLError = NVMLError
    not_supported, timeout, not_found = err("NotSupported", 3), err("Timeout", 10), err("FunctionNotFound", 13)
    ns = types.SimpleNamespace
    state = {"gpm_samples": 0, "freed": 0}

    def raise_(exc: type) -> Any:
        def f(*_: Any) -> Any:
            raise exc()
        return f

    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetCount = lambda: 2
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("handle", i)
    mod.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    mod.nvmlDeviceGetMemoryInfo = lambda h: ns(total=80 * GiB, free=60 * GiB, used=20 * GiB)
    mod.nvmlDeviceGetUtilizationRates = lambda h: ns(gpu=87, memory=40)
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [ns(pid=10, usedGpuMemory=GiB), ns(pid=11, usedGpuMemory=None)]
    mod.nvmlDeviceGetCurrentClocksEventReasons = raise_(not_found)  # an old driver
    mod.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: 0x24
    mod.nvmlDeviceGetViolationStatus = lambda h, p: ns(referenceTime=5_000_000, violationTime=123)
    mod.nvmlDeviceGetPcieThroughput = lambda h, c: 1234 if c == 0 else 5678
    mod.nvmlDeviceGetPcieReplayCounter = raise_(not_supported)
    mod.nvmlEventSetCreate = lambda: "set"
    mod.nvmlDeviceRegisterEvents = lambda h, t, s: None
    events = [ns(device=("handle", 1), eventType=8, eventData=79)]
    mod.nvmlEventSetWait_v2 = lambda s, ms: events.pop() if events else raise_(timeout)()
    mod.nvmlDeviceGetIndex = lambda h: h[1]
    mod.nvmlEventSetFree = lambda s: None

    def sample_alloc() -> Any:
        state["gpm_samples"] += 1
        return ("gpm", state["gpm_samples"])

    def metrics_get(get: Any) -> Any:
        for k in range(get.numMetrics):
            get.metrics[k].value = {2: 81.5, 5: 40.0}.get(get.metrics[k].metricId, 0.0)
            get.metrics[k].nvmlReturn = 0 if get.metrics[k].metricId in (2, 5) else 3
        return get

    class MetricsGet:
        def __init__(self) -> None:
            self.metrics = [ns(metricId=0, value=0.0, nvmlReturn=0) for _ in range(8)]

    mod.nvmlGpmSampleAlloc = sample_alloc
    mod.nvmlGpmSampleGet = lambda h, s: s
    mod.nvmlGpmSampleFree = lambda s: state.__setitem__("freed", state["freed"] + 1)
    mod.nvmlGpmMetricsGet = metrics_get
    mod.c_nvmlGpmMetricsGet_t = MetricsGet
    mod.NVML_GPM_METRICS_GET_VERSION = 1
    mod.state = state
    return mod


def test_live_nvml_maps_pynvml_types_to_plain_values(monkeypatch) -> None:
    fake = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    api = LiveNvml()
    api.init()
    assert api.device_count() == 2 and api.device_name(0) == "NVIDIA H100 80GB HBM3"
    assert api.device_memory_info(1) == {"total": 80 * GiB, "free": 60 * GiB, "used": 20 * GiB}
    assert api.device_utilization_rates(0) == {"gpu": 87, "memory": 40}
    assert api.device_compute_processes(0) == [{"pid": 10, "used_bytes": GiB}, {"pid": 11, "used_bytes": None}]
    assert api.device_clocks_event_reasons(0) == 0x24  # fell back to the throttle-reasons name
    assert api.device_violation_status(0, 1) == {"reference_time_us": 5_000_000, "violation_time_ns": 123}
    assert api.device_pcie_throughput(0, 0) == 1234 and api.device_pcie_throughput(0, 1) == 5678
    with pytest.raises(NvmlCallError) as info:
        api.device_pcie_replay_counter(0)
    assert (info.value.name, info.value.code, info.value.message) == ("NotSupported", 3, "Not Supported")
    with pytest.raises(NvmlCallError, match="FunctionNotFound"):
        api.device_temperature(0)  # not in this stand-in: AttributeError → FunctionNotFound
    assert api.wait_xid_event() is None  # no event set yet
    api.register_xid_events(1)
    assert api.wait_xid_event() == {"device": 1, "event_type": 8, "xid": 79}
    assert api.wait_xid_event() is None  # Timeout with a 0 ms wait
    assert api.gpm_metrics(0, [2, 3, 5]) == {}  # the first GPM sample is the baseline
    assert api.gpm_metrics(0, [2, 3, 5]) == {"2": 81.5, "3": None, "5": 40.0}
    assert fake.state["freed"] == 1
    api.shutdown()
    assert fake.state["freed"] == 2


def test_a_worker_spawned_between_tree_reads_is_not_another_process(tmp_path) -> None:
    # the tree is read every 10th tick; the child 101 is on the GPU from tick 3, in the tree from tick 11
    api = FakeNvml({})

    def procs(i: int) -> list[dict[str, Any]]:
        return [{"pid": 100, "used_bytes": GiB}] + ([{"pid": 101, "used_bytes": 30 * GiB}] if api.n >= 3 else [])

    def tree(pid: int) -> list[dict[str, Any]]:
        return [{"pid": 100, "nspid": [100]}] + ([{"pid": 101, "nspid": [101]}] if api.n >= 11 else [])

    api.answers = _device({0: []}, device_compute_processes=procs, process_tree=tree,
                          device_memory_info={"total": 80 * GiB, "used": 31 * GiB, "free": 49 * GiB})
    samples, _ = _run(api, 12, tmp_path)
    assert not samples[5]["devices"][0]["processes"][1]["is_target"]  # what the sampler knew then
    ev = _keys(samples)
    assert ev["mem.other_processes_bytes"] == 0 and ev["mem.process_used_bytes"] == 31 * GiB
