"""NVML (nvidia-ml-py, imported as ``pynvml``): what the target's GPUs do during the window.

Record and replay at the NVML call boundary
-------------------------------------------
``NvmlApi`` is the handful of NVML calls the sampler makes, each returning plain values in
NVML's documented types and units (bytes, KB/s, MHz, mW, °C, percent, bitmask ints, ns), plus
three reads of /proc the sampler needs to tell the target's processes from the others. It has
three implementations:

- ``LiveNvml`` wraps pynvml: the only code here that touches the driver.
- ``Recorder`` wraps another ``NvmlApi`` and appends every call and its raw result (or its
  error) as one JSON line to the session's ``nvml.jsonl``.
- ``ReplayNvml`` serves a recorded file back, errors included.

``Collector.collect(api)`` takes one sample and is the same code live and in replay: during
``attach`` the ``NvmlSampler`` runs it against ``Recorder(LiveNvml())`` and keeps nothing but the
file; afterwards ``read_samples`` (the pure parser) runs it against ``ReplayNvml(file)`` and gets
the samples. A recording made on any GPU is therefore a test fixture as it is.

Degrading
---------
Every call a driver or device may not support degrades to "not available" with NVML's reason
(``NotSupported``, ``NoPermission``, ``FunctionNotFound``…): the field is left out of the sample
and the reason goes into the device's ``na`` map. A call that fails for such a reason is not made
again for that device. No driver, no GPU: ``probe`` says so in one sentence, and ``attach`` marks
the capture skipped and carries on.

Which GPUs
----------
NVML lists processes by host pid. Each pid of the target's tree is known under every pid it has
in nested pid namespaces (``NSpid`` in /proc/PID/status), so a service in a container matches from
the host. A device is the target's when one of those pids holds a context on it; when no pid
matches at all (diagnose inside a container whose pids NVML reports from the host), the device
files the tree holds open (``/dev/nvidiaN``, N = ``nvmlDeviceGetMinorNumber``) are used instead,
restricted to devices where some process holds a context (CUDA opens every visible device node,
not only the ones it uses); then who owns which process is unknown and the sample says so.

Cost
----
Everything is read-only. The per-tick calls are cheap driver queries, except the PCIe throughput
counter, which measures over 20 ms per direction: it is read on one target device per tick, in
turn. Slow-changing values (the process tree, violation counters, the replay counter, GPM
metrics) are read every ``slow_every`` ticks.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

from diagnose.model import Availability, Capture, CaptureStatus, Window

SCHEMA = "diagnose/nvml/v1"
NVML_FILE = "nvml.jsonl"
COLLECTOR = "nvml"

# NVML enums (nvml.h), repeated here so that replay needs no pynvml
CLOCK_SM = 1
CLOCK_MEM = 2
PCIE_TX_BYTES = 0  # from the GPU's point of view: device → host
PCIE_RX_BYTES = 1  # host → device
PERF_POLICY_POWER = 0
PERF_POLICY_THERMAL = 1
TEMPERATURE_GPU = 0
TEMPERATURE_THRESHOLD_SLOWDOWN = 1
EVENT_XID_CRITICAL = 0x8

# nvmlClocksEventReasons (formerly ClocksThrottleReasons) bits
REASONS: dict[int, str] = {
    0x1: "GpuIdle",
    0x2: "ApplicationsClocksSetting",
    0x4: "SwPowerCap",
    0x8: "HwSlowdown",
    0x10: "SyncBoost",
    0x20: "SwThermalSlowdown",
    0x40: "HwThermalSlowdown",
    0x80: "HwPowerBrakeSlowdown",
    0x100: "DisplayClockSetting",
    0x200: "BoardLimit",
    0x400: "Reliability",
}

# GPM metric ids (nvmlGpmMetricId_t): values are percent, 0-100
GPM_METRICS: dict[int, str] = {
    2: "sm_util",  # NVML_GPM_METRIC_SM_UTIL: share of SMs busy
    3: "sm_occupancy",  # NVML_GPM_METRIC_SM_OCCUPANCY: active warps vs the theoretical maximum
    5: "any_tensor_util",  # NVML_GPM_METRIC_ANY_TENSOR_UTIL: time SMs run any tensor-core op
    10: "dram_bw_util",  # NVML_GPM_METRIC_DRAM_BW_UTIL: DRAM bandwidth used vs the peak
}

# errors that mean "this device or driver will never answer this call": stop asking
STICKY_ERRORS = frozenset({
    "NotSupported", "NoPermission", "FunctionNotFound", "InvalidArgument", "NotRecorded", "NotInstalled",
    "ArgumentVersionMismatch", "Deprecated",
})
_DEV_NODE = re.compile(r"^/dev/nvidia(\d+)$")


class NvmlCallError(Exception):
    """An NVML call failed: ``name`` is NVML's error name without the prefix (``NotSupported``)."""

    def __init__(self, name: str, code: int = -1, message: str = "") -> None:
        super().__init__(f"{name}: {message}" if message else name)
        self.name = name
        self.code = code
        self.message = message or name

    def reason(self) -> str:
        return f"{self.name} ({self.message})" if self.message and self.message != self.name else self.name

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "code": self.code, "msg": self.message}


class ReplayExhausted(Exception):
    """The recording has no more ticks."""


class NvmlApi(Protocol):
    """The NVML calls the sampler makes, by device index, returning plain values.

    Units are NVML's: memory in bytes, PCIe throughput in KB/s, clocks in MHz, power in mW,
    temperature in °C, utilisation in percent, reasons as the nvmlClocksEventReasons bitmask,
    violation time in ns (its reference time in µs). Errors raise ``NvmlCallError``.
    """

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def now(self) -> float: ...
    def driver_version(self) -> str: ...
    def device_count(self) -> int: ...
    def device_name(self, index: int) -> str: ...
    def device_uuid(self, index: int) -> str: ...
    def device_minor_number(self, index: int) -> int: ...
    def device_memory_info(self, index: int) -> dict[str, int]: ...
    def device_utilization_rates(self, index: int) -> dict[str, int]: ...
    def device_compute_processes(self, index: int) -> list[dict[str, Any]]: ...
    def device_graphics_processes(self, index: int) -> list[dict[str, Any]]: ...
    def device_pcie_throughput(self, index: int, counter: int) -> int: ...
    def device_curr_pcie_link_generation(self, index: int) -> int: ...
    def device_max_pcie_link_generation(self, index: int) -> int: ...
    def device_gpu_max_pcie_link_generation(self, index: int) -> int: ...
    def device_curr_pcie_link_width(self, index: int) -> int: ...
    def device_max_pcie_link_width(self, index: int) -> int: ...
    def device_pcie_replay_counter(self, index: int) -> int: ...
    def device_clock_info(self, index: int, clock: int) -> int: ...
    def device_max_clock_info(self, index: int, clock: int) -> int: ...
    def device_clocks_event_reasons(self, index: int) -> int: ...
    def device_violation_status(self, index: int, policy: int) -> dict[str, int]: ...
    def device_power_usage(self, index: int) -> int: ...
    def device_enforced_power_limit(self, index: int) -> int: ...
    def device_power_management_default_limit(self, index: int) -> int: ...
    def device_temperature(self, index: int) -> int: ...
    def device_temperature_threshold(self, index: int, threshold: int) -> int: ...
    def register_xid_events(self, index: int) -> None: ...
    def wait_xid_event(self) -> dict[str, int] | None: ...
    def gpm_supported(self, index: int) -> bool: ...
    def gpm_metrics(self, index: int, metric_ids: list[int]) -> dict[str, float | None]: ...
    # host side, so that a recording is self-contained
    def process_tree(self, pid: int) -> list[dict[str, Any]]: ...
    def process_name(self, pid: int) -> str: ...
    def open_device_minors(self, pids: list[int]) -> list[int]: ...


# -- the host side (/proc) -----------------------------------------------------------------


def nspids(pid: int, proc_root: str = "/proc") -> list[int]:
    """Every pid ``pid`` has, outermost visible namespace first (``NSpid``), or ``[pid]``."""
    try:
        with open(os.path.join(proc_root, str(pid), "status"), encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("NSpid:"):
                    found = [int(x) for x in line.split()[1:]]
                    return found or [pid]
    except (OSError, ValueError):
        pass
    return [pid]


def device_minors(pids: Iterable[int], proc_root: str = "/proc") -> list[int]:
    """Minor numbers of the /dev/nvidiaN files the processes hold open."""
    found: set[int] = set()
    for pid in pids:
        fd_dir = os.path.join(proc_root, str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                m = _DEV_NODE.match(os.readlink(os.path.join(fd_dir, name)))
            except OSError:
                continue
            if m:
                found.add(int(m.group(1)))
    return sorted(found)


def _tree(pid: int) -> list[dict[str, Any]]:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return []
    return [{"pid": p.pid, "nspid": nspids(p.pid)} for p in procs]


def _name(pid: int) -> str:
    import psutil

    try:
        return str(psutil.Process(pid).name())
    except psutil.Error:
        return ""


# -- live ------------------------------------------------------------------------------------


class LiveNvml:
    """pynvml, by device index, returning plain values. The only code that touches the driver."""

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self._gpm_prev: dict[int, Any] = {}
        self._events: Any = None

    def _err(self, exc: BaseException) -> NvmlCallError:
        nv = self._nv
        if nv is not None and isinstance(exc, nv.NVMLError):
            try:
                msg = str(exc)
            except Exception:  # pynvml's __str__ calls into the library, which may be gone
                msg = ""
            return NvmlCallError(type(exc).__name__.removeprefix("NVMLError_"), int(getattr(exc, "value", -1)), msg)
        if isinstance(exc, AttributeError):
            return NvmlCallError("FunctionNotFound", 13, f"this nvidia-ml-py lacks it ({exc})")
        return NvmlCallError("Unknown", 999, f"{type(exc).__name__}: {exc}")

    def _run(self, fn: str, *args: Any) -> Any:
        if self._nv is None:
            raise NvmlCallError("Uninitialized", 1, "NVML is not initialised")
        try:
            return getattr(self._nv, fn)(*args)
        except Exception as exc:
            raise self._err(exc) from exc

    def _h(self, index: int) -> Any:
        if index not in self._handles:
            self._handles[index] = self._run("nvmlDeviceGetHandleByIndex", index)
        return self._handles[index]

    def init(self) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise NvmlCallError("NotInstalled", -1, "nvidia-ml-py (pynvml) is not installed") from exc
        self._nv = pynvml
        self._run("nvmlInit")

    def shutdown(self) -> None:
        if self._nv is None:
            return
        for sample in self._gpm_prev.values():
            with contextlib.suppress(Exception):
                self._nv.nvmlGpmSampleFree(sample)
        self._gpm_prev.clear()
        if self._events is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlEventSetFree(self._events)
            self._events = None
        with contextlib.suppress(Exception):
            self._nv.nvmlShutdown()
        self._handles.clear()

    def now(self) -> float:
        return time.time()

    def driver_version(self) -> str:
        return str(self._run("nvmlSystemGetDriverVersion"))

    def device_count(self) -> int:
        return int(self._run("nvmlDeviceGetCount"))

    def device_name(self, index: int) -> str:
        name = self._run("nvmlDeviceGetName", self._h(index))
        return name.decode(errors="replace") if isinstance(name, bytes) else str(name)

    def device_uuid(self, index: int) -> str:
        uuid = self._run("nvmlDeviceGetUUID", self._h(index))
        return uuid.decode(errors="replace") if isinstance(uuid, bytes) else str(uuid)

    def device_minor_number(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetMinorNumber", self._h(index)))

    def device_memory_info(self, index: int) -> dict[str, int]:
        m = self._run("nvmlDeviceGetMemoryInfo", self._h(index))
        return {"total": int(m.total), "free": int(m.free), "used": int(m.used)}

    def device_utilization_rates(self, index: int) -> dict[str, int]:
        u = self._run("nvmlDeviceGetUtilizationRates", self._h(index))
        return {"gpu": int(u.gpu), "memory": int(u.memory)}

    @staticmethod
    def _procs(raw: Any) -> list[dict[str, Any]]:
        return [{"pid": int(p.pid), "used_bytes": None if p.usedGpuMemory is None else int(p.usedGpuMemory)}
                for p in raw]

    def device_compute_processes(self, index: int) -> list[dict[str, Any]]:
        return self._procs(self._run("nvmlDeviceGetComputeRunningProcesses", self._h(index)))

    def device_graphics_processes(self, index: int) -> list[dict[str, Any]]:
        return self._procs(self._run("nvmlDeviceGetGraphicsRunningProcesses", self._h(index)))

    def device_pcie_throughput(self, index: int, counter: int) -> int:
        return int(self._run("nvmlDeviceGetPcieThroughput", self._h(index), counter))

    def device_curr_pcie_link_generation(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetCurrPcieLinkGeneration", self._h(index)))

    def device_max_pcie_link_generation(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetMaxPcieLinkGeneration", self._h(index)))

    def device_gpu_max_pcie_link_generation(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetGpuMaxPcieLinkGeneration", self._h(index)))

    def device_curr_pcie_link_width(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetCurrPcieLinkWidth", self._h(index)))

    def device_max_pcie_link_width(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetMaxPcieLinkWidth", self._h(index)))

    def device_pcie_replay_counter(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetPcieReplayCounter", self._h(index)))

    def device_clock_info(self, index: int, clock: int) -> int:
        return int(self._run("nvmlDeviceGetClockInfo", self._h(index), clock))

    def device_max_clock_info(self, index: int, clock: int) -> int:
        return int(self._run("nvmlDeviceGetMaxClockInfo", self._h(index), clock))

    def device_clocks_event_reasons(self, index: int) -> int:
        try:
            return int(self._run("nvmlDeviceGetCurrentClocksEventReasons", self._h(index)))
        except NvmlCallError as exc:  # drivers and bindings before 535 know the old name only
            if exc.name != "FunctionNotFound":
                raise
        return int(self._run("nvmlDeviceGetCurrentClocksThrottleReasons", self._h(index)))

    def device_violation_status(self, index: int, policy: int) -> dict[str, int]:
        v = self._run("nvmlDeviceGetViolationStatus", self._h(index), policy)
        return {"reference_time_us": int(v.referenceTime), "violation_time_ns": int(v.violationTime)}

    def device_power_usage(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetPowerUsage", self._h(index)))

    def device_enforced_power_limit(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetEnforcedPowerLimit", self._h(index)))

    def device_power_management_default_limit(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetPowerManagementDefaultLimit", self._h(index)))

    def device_temperature(self, index: int) -> int:
        return int(self._run("nvmlDeviceGetTemperature", self._h(index), TEMPERATURE_GPU))

    def device_temperature_threshold(self, index: int, threshold: int) -> int:
        return int(self._run("nvmlDeviceGetTemperatureThreshold", self._h(index), threshold))

    def register_xid_events(self, index: int) -> None:
        if self._events is None:
            self._events = self._run("nvmlEventSetCreate")
        self._run("nvmlDeviceRegisterEvents", self._h(index), EVENT_XID_CRITICAL, self._events)

    def wait_xid_event(self) -> dict[str, int] | None:
        """The next pending XID event, or None (a 0 ms wait: never blocks)."""
        if self._events is None:
            return None
        try:
            data = self._run("nvmlEventSetWait_v2", self._events, 0)
        except NvmlCallError as exc:
            if exc.name == "Timeout":
                return None
            raise
        return {"device": int(self._run("nvmlDeviceGetIndex", data.device)),
                "event_type": int(data.eventType), "xid": int(data.eventData)}

    def gpm_supported(self, index: int) -> bool:
        return bool(self._run("nvmlGpmQueryDeviceSupport", self._h(index)).isSupportedDevice)

    def gpm_metrics(self, index: int, metric_ids: list[int]) -> dict[str, float | None]:
        """GPM metrics (percent) between the previous call's GPM sample and now; {} on the first call."""
        nv = self._nv
        cur = self._run("nvmlGpmSampleAlloc")
        try:
            self._run("nvmlGpmSampleGet", self._h(index), cur)
        except NvmlCallError:
            self._run("nvmlGpmSampleFree", cur)
            raise
        prev = self._gpm_prev.get(index)
        self._gpm_prev[index] = cur
        if prev is None:
            return {}
        try:
            get = nv.c_nvmlGpmMetricsGet_t()
            get.version = nv.NVML_GPM_METRICS_GET_VERSION
            get.numMetrics = len(metric_ids)
            get.sample1 = prev
            get.sample2 = cur
            for k, mid in enumerate(metric_ids):
                get.metrics[k].metricId = mid
            self._run("nvmlGpmMetricsGet", get)
            return {str(mid): (float(get.metrics[k].value) if get.metrics[k].nvmlReturn == 0 else None)
                    for k, mid in enumerate(metric_ids)}
        finally:
            self._run("nvmlGpmSampleFree", prev)

    def process_tree(self, pid: int) -> list[dict[str, Any]]:
        return _tree(pid)

    def process_name(self, pid: int) -> str:
        return _name(pid)

    def open_device_minors(self, pids: list[int]) -> list[int]:
        return device_minors(pids)


# -- record / replay -------------------------------------------------------------------------


class _Dispatch:
    """Every ``NvmlApi`` method routed through ``_call(name, *args)``."""

    def _call(self, fn: str, *args: Any) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def init(self) -> None:
        self._call("init")

    def shutdown(self) -> None:
        self._call("shutdown")

    def now(self) -> float:
        return float(self._call("now"))

    def driver_version(self) -> str:
        return str(self._call("driver_version"))

    def device_count(self) -> int:
        return int(self._call("device_count"))

    def device_name(self, index: int) -> str:
        return str(self._call("device_name", index))

    def device_uuid(self, index: int) -> str:
        return str(self._call("device_uuid", index))

    def device_minor_number(self, index: int) -> int:
        return int(self._call("device_minor_number", index))

    def device_memory_info(self, index: int) -> dict[str, int]:
        return dict(self._call("device_memory_info", index))

    def device_utilization_rates(self, index: int) -> dict[str, int]:
        return dict(self._call("device_utilization_rates", index))

    def device_compute_processes(self, index: int) -> list[dict[str, Any]]:
        return list(self._call("device_compute_processes", index))

    def device_graphics_processes(self, index: int) -> list[dict[str, Any]]:
        return list(self._call("device_graphics_processes", index))

    def device_pcie_throughput(self, index: int, counter: int) -> int:
        return int(self._call("device_pcie_throughput", index, counter))

    def device_curr_pcie_link_generation(self, index: int) -> int:
        return int(self._call("device_curr_pcie_link_generation", index))

    def device_max_pcie_link_generation(self, index: int) -> int:
        return int(self._call("device_max_pcie_link_generation", index))

    def device_gpu_max_pcie_link_generation(self, index: int) -> int:
        return int(self._call("device_gpu_max_pcie_link_generation", index))

    def device_curr_pcie_link_width(self, index: int) -> int:
        return int(self._call("device_curr_pcie_link_width", index))

    def device_max_pcie_link_width(self, index: int) -> int:
        return int(self._call("device_max_pcie_link_width", index))

    def device_pcie_replay_counter(self, index: int) -> int:
        return int(self._call("device_pcie_replay_counter", index))

    def device_clock_info(self, index: int, clock: int) -> int:
        return int(self._call("device_clock_info", index, clock))

    def device_max_clock_info(self, index: int, clock: int) -> int:
        return int(self._call("device_max_clock_info", index, clock))

    def device_clocks_event_reasons(self, index: int) -> int:
        return int(self._call("device_clocks_event_reasons", index))

    def device_violation_status(self, index: int, policy: int) -> dict[str, int]:
        return dict(self._call("device_violation_status", index, policy))

    def device_power_usage(self, index: int) -> int:
        return int(self._call("device_power_usage", index))

    def device_enforced_power_limit(self, index: int) -> int:
        return int(self._call("device_enforced_power_limit", index))

    def device_power_management_default_limit(self, index: int) -> int:
        return int(self._call("device_power_management_default_limit", index))

    def device_temperature(self, index: int) -> int:
        return int(self._call("device_temperature", index))

    def device_temperature_threshold(self, index: int, threshold: int) -> int:
        return int(self._call("device_temperature_threshold", index, threshold))

    def register_xid_events(self, index: int) -> None:
        self._call("register_xid_events", index)

    def wait_xid_event(self) -> dict[str, int] | None:
        got = self._call("wait_xid_event")
        return dict(got) if got else None

    def gpm_supported(self, index: int) -> bool:
        return bool(self._call("gpm_supported", index))

    def gpm_metrics(self, index: int, metric_ids: list[int]) -> dict[str, float | None]:
        return dict(self._call("gpm_metrics", index, list(metric_ids)))

    def process_tree(self, pid: int) -> list[dict[str, Any]]:
        return list(self._call("process_tree", pid))

    def process_name(self, pid: int) -> str:
        return str(self._call("process_name", pid))

    def open_device_minors(self, pids: list[int]) -> list[int]:
        return [int(x) for x in self._call("open_device_minors", list(pids))]


class Recorder(_Dispatch):
    """Wraps an ``NvmlApi`` and appends each call with its raw result or error to a JSONL file.

    Line 1 is the meta record (schema, target pid, interval, origin); every other line is
    ``{"fn": NAME, "args": [...], "ok": RESULT}`` or ``{"fn", "args", "err": {"name", "code", "msg"}}``.
    """

    def __init__(self, inner: NvmlApi, path: str, meta: dict[str, Any]) -> None:
        self.inner = inner
        self.path = path
        self._fh: IO[str] | None = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._write({"schema": SCHEMA, **meta})

    def _write(self, doc: dict[str, Any]) -> None:
        if self._fh is not None:
            self._fh.write(json.dumps(doc, separators=(",", ":")) + "\n")

    def _call(self, fn: str, *args: Any) -> Any:
        try:
            result = getattr(self.inner, fn)(*args)
        except NvmlCallError as exc:
            self._write({"fn": fn, "args": list(args), "err": exc.to_json()})
            raise
        self._write({"fn": fn, "args": list(args), "ok": result})
        if fn == "now" and self._fh is not None:
            self._fh.flush()  # one tick at a time reaches the disk: a crash loses at most a tick
        return result

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _key(fn: str, args: Iterable[Any]) -> str:
    return fn + json.dumps(list(args), separators=(",", ":"))


class ReplayNvml(_Dispatch):
    """Serves a recording back: the n-th call of a function with given arguments gets the n-th
    recorded answer for it. A call never recorded raises ``NotRecorded`` (sticky: the sampler stops
    asking), so recordings stay replayable when the sampler learns new calls. ``now`` past the last
    recorded tick raises ``ReplayExhausted``."""

    def __init__(self, lines: Iterable[str]) -> None:
        self.meta: dict[str, Any] = {}
        self._answers: dict[str, deque[tuple[bool, Any]]] = {}
        for line in lines:
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a torn last line from a killed recorder
            if not isinstance(doc, dict):
                continue
            if "schema" in doc and "fn" not in doc:
                self.meta = doc
                continue
            fn = doc.get("fn")
            if not isinstance(fn, str):
                continue
            args = doc.get("args") or []
            q = self._answers.setdefault(_key(fn, args), deque())
            if "err" in doc and isinstance(doc["err"], dict):
                q.append((False, doc["err"]))
            else:
                q.append((True, doc.get("ok")))

    @classmethod
    def from_file(cls, path: str) -> ReplayNvml:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return cls(fh)

    def _call(self, fn: str, *args: Any) -> Any:
        q = self._answers.get(_key(fn, args))
        if not q:
            if fn == "now":
                raise ReplayExhausted()
            if fn in ("init", "shutdown"):
                return None
            raise NvmlCallError("NotRecorded", -2, "not in the recording")
        ok, value = q.popleft()
        if ok:
            return value
        raise NvmlCallError(str(value.get("name", "Unknown")), int(value.get("code", -1)), str(value.get("msg", "")))


# -- the sampler: the same code live and in replay ----------------------------------------------


@dataclass
class Collector:
    """Takes one sample per ``collect`` call; its state only ever depends on what the api answered,
    so replaying a recording through a fresh ``Collector`` gives back the same samples."""

    pid: int
    slow_every: int = 10
    tick: int = 0
    count: int | None = None
    identities: set[int] = field(default_factory=set)
    tree_pids: list[int] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    match: str = "none"
    minors: dict[int, int] = field(default_factory=dict)
    static: dict[int, dict[str, Any]] = field(default_factory=dict)
    disabled: dict[tuple[int, str], str] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    xid_ok: set[int] = field(default_factory=set)
    xid_na: dict[int, str] = field(default_factory=dict)
    pcie_turn: int = 0
    driver: str = ""

    def _get(self, dev: int, name: str, na: dict[str, str], fn: Any, *args: Any) -> Any:
        reason = self.disabled.get((dev, name))
        if reason is not None:
            na[name] = reason
            return None
        try:
            return fn(*args)
        except NvmlCallError as exc:
            na[name] = exc.reason()
            if exc.name in STICKY_ERRORS:
                self.disabled[(dev, name)] = exc.reason()
            return None

    def _refresh_tree(self, api: NvmlApi) -> None:
        try:
            tree = api.process_tree(self.pid)
        except NvmlCallError:
            return
        if tree:
            self.tree_pids = [int(p["pid"]) for p in tree]
            self.identities = {int(x) for p in tree for x in [p["pid"], *p.get("nspid", ())]}

    def _processes(self, api: NvmlApi, dev: int, na: dict[str, str]) -> list[dict[str, Any]] | None:
        got: list[dict[str, Any]] = []
        seen: set[int] = set()
        answered = False
        for kind, fn in (("C", api.device_compute_processes), ("G", api.device_graphics_processes)):
            procs = self._get(dev, f"processes_{kind}", na, fn, dev)
            if procs is None:
                continue
            answered = True
            for p in procs:
                pid = int(p["pid"])
                if pid in seen:  # a process with compute and graphics contexts is listed twice
                    for q in got:
                        if q["pid"] == pid:
                            q["type"] = "C+G"
                    continue
                seen.add(pid)
                got.append({"pid": pid, "used_bytes": p.get("used_bytes"), "type": kind,
                            "is_target": pid in self.identities})
        return got if answered else None

    def _discover(self, api: NvmlApi, procs: dict[int, list[dict[str, Any]] | None], scan_files: bool) -> None:
        by_pid = sorted(d for d, ps in procs.items() if ps and any(p["is_target"] for p in ps))
        if by_pid:
            # pids are the firm evidence: devices taken from device files before are dropped
            kept = set(self.targets) if self.match == "pid" else set()
            self.targets = sorted(kept | set(by_pid))
            self.match = "pid"
            return
        if (self.targets and self.match == "pid") or not scan_files:
            return
        try:
            opened = set(api.open_device_minors(self.tree_pids))
        except NvmlCallError:
            opened = set()
        if not opened:
            return
        for dev in procs:
            if dev not in self.minors:
                try:
                    self.minors[dev] = api.device_minor_number(dev)
                except NvmlCallError:
                    self.minors[dev] = dev  # the usual numbering; only a fallback
        # CUDA opens every visible device node: keep the ones where some process holds a context
        found = sorted(d for d, ps in procs.items() if self.minors.get(d) in opened and ps)
        if found:
            self.targets = sorted(set(self.targets) | set(found))
            self.match = "device-file"

    def _static(self, api: NvmlApi, dev: int) -> dict[str, Any]:
        if dev in self.static:
            return self.static[dev]
        na: dict[str, str] = {}
        s: dict[str, Any] = {"index": dev}
        for name, fn, args in (
            ("name", api.device_name, (dev,)),
            ("uuid", api.device_uuid, (dev,)),
            ("sm_clock_max_mhz", api.device_max_clock_info, (dev, CLOCK_SM)),
            ("mem_clock_max_mhz", api.device_max_clock_info, (dev, CLOCK_MEM)),
            ("pcie_gen_max", api.device_max_pcie_link_generation, (dev,)),
            ("pcie_gen_gpu_max", api.device_gpu_max_pcie_link_generation, (dev,)),
            ("pcie_width_max", api.device_max_pcie_link_width, (dev,)),
            ("power_limit_mw", api.device_enforced_power_limit, (dev,)),
            ("power_default_limit_mw", api.device_power_management_default_limit, (dev,)),
            ("temp_slowdown_c", api.device_temperature_threshold, (dev, TEMPERATURE_THRESHOLD_SLOWDOWN)),
            ("gpm_supported", api.gpm_supported, (dev,)),
        ):
            value = self._get(dev, name, na, fn, *args)
            if value is not None:
                s[name] = value
        if not s.get("gpm_supported"):
            na.setdefault("gpm", "not supported by this device (GPM needs Hopper or newer)")
            self.disabled[(dev, "gpm")] = na["gpm"]
        try:
            api.register_xid_events(dev)
            self.xid_ok.add(dev)
        except NvmlCallError as exc:
            self.xid_na[dev] = exc.reason()
        s["na"] = na
        self.static[dev] = s
        return s

    def _device(self, api: NvmlApi, dev: int, procs: list[dict[str, Any]] | None, slow: bool,
                pcie_turn: bool) -> dict[str, Any]:
        st = self._static(api, dev)
        na: dict[str, str] = dict(st["na"])
        d: dict[str, Any] = {k: v for k, v in st.items() if k != "na"}
        d["target"] = True
        if procs is not None:
            for p in procs:
                if p["pid"] not in self.names:
                    try:
                        self.names[p["pid"]] = api.process_name(p["pid"])
                    except NvmlCallError:
                        self.names[p["pid"]] = ""
                p["name"] = self.names[p["pid"]]
            d["processes"] = procs
        util = self._get(dev, "utilization", na, api.device_utilization_rates, dev)
        if util is not None:
            d["util_gpu_pct"] = util.get("gpu")
            d["util_mem_pct"] = util.get("memory")
        mem = self._get(dev, "memory", na, api.device_memory_info, dev)
        if mem is not None:
            d["mem_total_bytes"] = mem.get("total")
            d["mem_used_bytes"] = mem.get("used")
            d["mem_free_bytes"] = mem.get("free")
        for name, fn, args in (
            ("sm_clock_mhz", api.device_clock_info, (dev, CLOCK_SM)),
            ("mem_clock_mhz", api.device_clock_info, (dev, CLOCK_MEM)),
            ("reasons", api.device_clocks_event_reasons, (dev,)),
            ("power_mw", api.device_power_usage, (dev,)),
            ("temp_c", api.device_temperature, (dev,)),
            ("pcie_gen", api.device_curr_pcie_link_generation, (dev,)),
            ("pcie_width", api.device_curr_pcie_link_width, (dev,)),
        ):
            value = self._get(dev, name, na, fn, *args)
            if value is not None:
                d[name] = value
        if pcie_turn:
            tx = self._get(dev, "pcie_tx", na, api.device_pcie_throughput, dev, PCIE_TX_BYTES)
            rx = self._get(dev, "pcie_rx", na, api.device_pcie_throughput, dev, PCIE_RX_BYTES)
            if tx is not None:
                d["pcie_tx_kbps"] = tx
            if rx is not None:
                d["pcie_rx_kbps"] = rx
        if slow:
            replay = self._get(dev, "pcie_replay", na, api.device_pcie_replay_counter, dev)
            if replay is not None:
                d["pcie_replay"] = replay
            viol: dict[str, Any] = {}
            for label, policy in (("power", PERF_POLICY_POWER), ("thermal", PERF_POLICY_THERMAL)):
                v = self._get(dev, f"violation_{label}", na, api.device_violation_status, dev, policy)
                if v is not None:
                    viol[label] = v
            if viol:
                d["violation"] = viol
            gpm = self._get(dev, "gpm", na, api.gpm_metrics, dev, sorted(GPM_METRICS))
            if gpm:
                d["gpm"] = {GPM_METRICS[int(k)]: v for k, v in gpm.items() if int(k) in GPM_METRICS and v is not None}
        if dev in self.xid_na:
            na["xid"] = self.xid_na[dev]
        d["na"] = na
        return d

    def collect(self, api: NvmlApi) -> dict[str, Any]:
        """One sample: the target's devices, their processes, and any XID events since the last one."""
        ts = api.now()
        slow = self.tick % self.slow_every == 0
        if self.count is None:
            self.count = api.device_count()
            try:
                self.driver = api.driver_version()
            except NvmlCallError:
                self.driver = ""
        if slow or not self.tree_pids:
            self._refresh_tree(api)
        discovering = slow or not self.targets
        scope = range(self.count) if discovering else self.targets
        procs: dict[int, list[dict[str, Any]] | None] = {}
        na_procs: dict[int, dict[str, str]] = {}
        for dev in scope:
            na_procs[dev] = {}
            procs[dev] = self._processes(api, dev, na_procs[dev])
        if discovering:
            self._discover(api, procs, scan_files=slow)  # reading every fd of the tree: not at 10 Hz
        devices = []
        turn = self.targets[self.pcie_turn % len(self.targets)] if self.targets else None
        if self.targets:
            self.pcie_turn += 1
        for dev in self.targets:
            d = self._device(api, dev, procs.get(dev), slow, dev == turn)
            d["na"].update(na_procs.get(dev, {}))
            d["owner_known"] = self.match == "pid"
            devices.append(d)
        xids: list[dict[str, int]] = []
        if self.xid_ok:
            for _ in range(64):  # drain what is pending, bounded
                try:
                    ev = api.wait_xid_event()
                except NvmlCallError:
                    break
                if ev is None:
                    break
                xids.append(ev)
        self.tick += 1
        return {"ts": ts, "driver": self.driver, "tree": list(self.tree_pids), "tree_ids": sorted(self.identities),
                "match": self.match,
                "devices": devices,
                "xid": xids, "xid_watched": sorted(self.xid_ok)}


# -- probe, sampler, parser ----------------------------------------------------------------------

_NO_GPU_REMEDY = ("Run diagnose on the GPU host, or in a container started with the NVIDIA runtime "
                  "(docker run --gpus all; a pod that requests nvidia.com/gpu) so that libnvidia-ml.so.1 "
                  "and the /dev/nvidia* devices are present.")


def explain(exc: NvmlCallError) -> Availability:
    """NVML's start-up error as one sentence for the user, with the remedy."""
    reasons = {
        "NotInstalled": ("GPU evidence needs nvidia-ml-py, which is not installed",
                         "pip install nvidia-ml-py (imported as pynvml)."),
        "LibraryNotFound": ("no NVIDIA driver on this machine (the NVML library libnvidia-ml.so.1 was not found)",
                            _NO_GPU_REMEDY),
        "DriverNotLoaded": ("the NVIDIA kernel driver is not loaded on this machine",
                            "Check `nvidia-smi`; load the driver (modprobe nvidia) or reboot after a driver install."),
        "LibRmVersionMismatch": ("the NVIDIA library and kernel driver versions differ (a driver upgrade "
                                 "without a reboot)", "Reboot, or reload the nvidia kernel modules."),
        "NoPermission": ("not permitted to open the NVIDIA devices",
                         "Run as root or as a user allowed to open /dev/nvidia*."),
        "GpuIsLost": ("a GPU has fallen off the bus (NVML reports it lost)",
                      "Check `nvidia-smi` and the kernel log for XID 79; the node needs a GPU reset or reboot."),
    }
    reason, remedy = reasons.get(exc.name, (f"NVML could not start: {exc.reason()}",
                                            "Check that `nvidia-smi` works on this machine."))
    return Availability(False, reason, remedy)


def probe(pid: int, api: NvmlApi | None = None) -> Availability:
    """Whether NVML can run here (driver loaded, at least one GPU); the reason and remedy if not."""
    nv = api or LiveNvml()
    try:
        nv.init()
    except NvmlCallError as exc:
        return explain(exc)
    try:
        count = nv.device_count()
    except NvmlCallError as exc:
        return explain(exc)
    finally:
        with contextlib.suppress(NvmlCallError):
            nv.shutdown()
    if count <= 0:
        return Availability(False, "the NVIDIA driver is loaded but sees no GPU",
                            "Check `nvidia-smi -L`, and that the container was given GPUs.")
    return Availability(True)


@dataclass
class NvmlSampler:
    """Samples the target's GPUs every ``interval_s`` into ``out_dir/nvml.jsonl``.

    Like ``diagnose.collectors.process.Sampler``: call ``tick()`` from a loop, then ``close()``, which
    returns the ``Capture``. ``api`` defaults to ``LiveNvml``; any api is wrapped in a
    ``Recorder``, so the file is what a replay needs. ``tick`` never raises.
    """

    pid: int
    out_dir: str
    api: NvmlApi | None = None
    interval_s: float = 0.1
    samples: int = 0
    failed: str = ""
    _rec: Recorder | None = None
    _col: Collector | None = None
    _target_seen: bool = False
    _started: bool = False
    _skipped: bool = False
    _remedy: str = ""

    @property
    def path(self) -> str:
        return os.path.join(self.out_dir, NVML_FILE)

    def _start(self) -> None:
        self._started = True
        inner = self.api or LiveNvml()
        try:
            self._rec = Recorder(inner, self.path, {"pid": self.pid, "interval_s": self.interval_s,
                                                     "origin": "live" if self.api is None else type(inner).__name__})
            self._col = Collector(self.pid)
            self._rec.init()
        except NvmlCallError as exc:
            avail = explain(exc)
            self.failed, self._remedy, self._skipped = avail.reason, avail.remedy, True
        except Exception as exc:  # the live path must never break attach
            self.failed = f"NVML failed to start: {type(exc).__name__}: {exc}"

    def tick(self) -> None:
        if not self._started:
            self._start()
        if self.failed or self._rec is None or self._col is None:
            return
        try:
            sample = self._col.collect(self._rec)
        except Exception as exc:
            self.failed = f"NVML sampling stopped: {type(exc).__name__}: {exc}"
            return
        self.samples += 1
        self._target_seen = self._target_seen or bool(sample["devices"])

    def close(self, window: Window | None = None) -> Capture:
        """Shut NVML down and say what was captured (SKIPPED with the reason when NVML cannot run)."""
        if not self._started:
            self._start()
        if self._rec is not None:
            with contextlib.suppress(Exception):
                self._rec.shutdown()
            self._rec.close()
        files = (NVML_FILE,) if os.path.exists(self.path) else ()
        if self._skipped:
            return Capture(COLLECTOR, CaptureStatus.SKIPPED, self.failed, self._remedy, window, files)
        if self.samples == 0:
            return Capture(COLLECTOR, CaptureStatus.FAILED, self.failed or "no NVML sample could be taken",
                           "Run `nvidia-smi` to check that the driver answers.", window, files)
        if self.failed:
            return Capture(COLLECTOR, CaptureStatus.PARTIAL, self.failed, "", window, files)
        if not self._target_seen:
            return Capture(COLLECTOR, CaptureStatus.OK, NO_TARGET_GPU,
                           "Attach while the service runs work on the GPU (CUDA initialises lazily).", window, files)
        return Capture(COLLECTOR, CaptureStatus.OK, "", "", window, files)


NO_TARGET_GPU = "the target's process tree held no GPU context during the window"


def replay(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """Samples from recorded lines, by running the sampler's own code against ``ReplayNvml``."""
    api = ReplayNvml(lines)
    col = Collector(int(api.meta.get("pid", 0)))
    while True:
        try:
            sample = col.collect(api)
        except ReplayExhausted:
            return
        except NvmlCallError:
            return  # a tick torn before its first answers were written
        yield sample


def read_samples(path: str) -> list[dict[str, Any]]:
    """The pure parser: ``nvml.jsonl`` → samples (an absent file gives none)."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8", errors="replace") as fh:
        samples = list(replay(fh))
    if samples and any("NotRecorded" in r for d in samples[-1]["devices"] for r in d["na"].values()):
        samples.pop()  # the recorder was stopped in the middle of its last tick
    return samples


def read_meta(path: str) -> dict[str, Any]:
    """The recording's first line (schema, pid, interval, origin)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            doc = json.loads(fh.readline())
        return doc if isinstance(doc, dict) and "schema" in doc else {}
    except (OSError, ValueError):
        return {}


def record(pid: int, seconds: float, out_dir: str, interval_s: float = 0.1) -> Capture:
    """Record ``pid``'s GPUs for ``seconds`` into ``out_dir/nvml.jsonl`` (for new fixtures, on a GPU host)."""
    os.makedirs(out_dir, exist_ok=True)
    sampler = NvmlSampler(pid, out_dir, interval_s=interval_s)
    start = time.time()
    while time.time() - start < seconds:
        sampler.tick()
        if sampler.failed:
            break
        time.sleep(interval_s)
    return sampler.close(Window(start, time.time()))


if __name__ == "__main__":  # python -m diagnose.collectors.nvml PID [SECONDS] [OUT_DIR]
    import sys

    args = sys.argv[1:]
    if not args:
        sys.exit("usage: python -m diagnose.collectors.nvml PID [SECONDS=10] [OUT_DIR=nvml-recording]")
    cap = record(int(args[0]), float(args[1]) if len(args) > 1 else 10.0,
                 args[2] if len(args) > 2 else "nvml-recording")
    print(json.dumps(cap.to_json(), indent=2))


# NVML's start-up errors that mean the host has no NVIDIA GPU at all (not a fault of one that is there)
NO_GPU_ERRORS = frozenset({"LibraryNotFound"})


def no_gpu_reason(path: str) -> str | None:
    """Why the recording at ``path`` says this host has no NVIDIA GPU (no NVML library, or NVML up
    with no device), or None when it has one or cannot tell."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(doc, dict):
                    continue
                err = doc.get("err")
                if doc.get("fn") == "init" and isinstance(err, dict) and err.get("name") in NO_GPU_ERRORS:
                    return "no NVIDIA driver on this host (NVML's library libnvidia-ml.so.1 is absent)"
                if doc.get("fn") == "nvmlDeviceGetCount" and doc.get("ok") == 0:
                    return "NVML found no GPU on this host"
    except OSError:
        return None
    return None
