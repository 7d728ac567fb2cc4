"""Out-of-memory messages and model hints → ``mem.*`` evidence.

Two text sources:

* ``oom``: PyTorch allocator messages (every historical form), framework OOMs (vLLM, TGI),
  prose mentions, with the phase read from the traceback around them. The numbers come from the
  *decisive* event: the last one that carries allocator numbers (the crash that ended the run).
* ``model-hints``: what the text says about the model and the hardware: the parameter count in a
  model name with its dtype (→ ``mem.weights_estimate_bytes``), tensor/pipeline parallelism, the GPU
  count and model, vLLM's ``gpu_memory_utilization``, measured weight sizes, the serving engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from diagnose.collectors.oom import (
    CONTEXT_LINES,
    STARTUP_CHECK_REASON,
    HintsParser,
    ModelHints,
    OomEvent,
    OomParser,
    OomResult,
    ollama_tag_default,
)
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality
from diagnose.units import size


def _decisive(events: list[OomEvent]) -> OomEvent:
    """The event whose numbers speak for the incident: the last one with the most fields."""

    def weight(ev: OomEvent) -> int:
        fields = (ev.requested, ev.total, ev.free, ev.allocated, ev.reserved, ev.process_used)
        return sum(v is not None for v in fields) + (ev.kind != "prose")

    best = events[-1]
    for ev in reversed(events):
        if weight(ev) > weight(best):
            best = ev
    return best


RELAY_LINES = 40  # an engine's own message this near the allocator's is the same failure, relayed up its stack


def _phase_told(oom: OomEvent, events: list[OomEvent]) -> OomEvent:
    """The decisive event, with the phase an engine's own message told of the same failure where its traceback told
    none: vLLM's allocator OOM inside the sampler's warm-up (frames cut from the paste) is relayed as "CUDA out of
    memory occurred when warming up sampler with 1024 dummy requests" (vllm#15105)."""
    if oom.phase != "unknown":
        return oom
    told = [e for e in events if e.phase_by_message and e.phase != "unknown" and abs(e.line_no - oom.line_no)
            <= RELAY_LINES]
    if not told:
        return oom
    near = min(told, key=lambda e: abs(e.line_no - oom.line_no))
    return dataclasses.replace(oom, phase=near.phase, phase_from=near.phase_from, phase_by_message=True)


def _split_processes(ev: OomEvent) -> tuple[int | None, int | None]:
    """(this process' bytes, other processes' bytes) from the message's process list."""
    used = ev.process_used
    others = [b for _, b in ev.other_processes]
    if used is None and others and ev.reserved is not None:
        # some releases list the failing process among "Process N has …": it is the one holding
        # at least what PyTorch reserved, and the closest to it
        # (PyTorch reserved nothing: the one process listed could be this one seen from a container's pid namespace,
        # or another: neither is said; of several, all but one are others at least, and the test below takes the
        # one closest to what PyTorch reserved as this one)
        if ev.reserved == 0 and len(others) == 1:
            return None, None
        mine = [b for b in others if b >= ev.reserved]
        if mine:
            own = min(mine)
            others.remove(own)
            used = own
    if used is None and others and ev.reserved is None and ev.process_list_whole:
        # PyTorch writes "this process" only for the entry whose pid is its own (getpid()); in a container NVML gives
        # the host's pids. The message itself says the failing process has its context on the device (the allocator
        # read the free memory with cudaMemGetInfo, which needs one), so NVML lists it: it is one of the "Process N"
        # entries of a whole list without "this process", one holding at least what PyTorch had allocated where the
        # message got that far. One such entry is this process; of several, all but the largest are others at least
        # (the message cut before PyTorch's reservation says no more); none such: every entry is another's
        floor = ev.allocated or 0
        mine = [b for b in others if b >= floor]
        if len(mine) == 1:
            others.remove(mine[0])
            return mine[0], sum(others)
        if mine:
            return None, sum(others) - max(mine)
    if (ev.kind == "framework" and ev.total is not None and ev.free is not None and ev.phase == "loading"
            and ev.reason == STARTUP_CHECK_REASON):
        return None, max(0, ev.total - ev.free)  # in use before this process allocated anything
    return used, (sum(others) if ev.other_processes else None)


class OomSource:
    """Text source for out-of-memory events."""

    kind = "oom"
    # past an input's head: the anchors of every message form (and of the report's own words on
    # fragmentation); the traceback around an event (its phase) comes as context
    triggers = (*((t, CONTEXT_LINES, CONTEXT_LINES) for t in (
        "out of memory", "Out of memory", "Out Of Memory", "OUT OF MEMORY", "out-of-memory", "OutOfMemory", "OOM",
        "oom",
        "ALLOC_FAILED", "MemoryAllocation", "RESOURCE_EXHAUSTED", "to allocate", "prefill tokens", "cache blocks",
        "larger than the maximum number of tokens", "KV cache is needed", "less than desired GPU memory", "显存",
        "KV cache memory:", "mem-fraction-static", "memory for the KV", "memory for KV", "memory left for",
        "内存", "OUT_OF_MEMORY", "Executor creation failed", "max seq len", "DefaultCPUAllocator", "cuMemAllocAsync",
        "memory capacity is unbalanced", "ResourceExhausted", "Resource exhausted")),
        "retries", "fragment", "expandable_segments")

    def __init__(self) -> None:
        self._parser = OomParser()
        self._result: OomResult | None = None

    def feed(self, line: str) -> None:
        self._parser.feed(line)

    def _done(self) -> OomResult:
        if self._result is None:
            self._result = self._parser.result()
        return self._result

    def matched(self) -> bool:
        res = self._done()
        return bool(res.events) or res.alloc_retries is not None or bool(res.fragmentation_statements)

    def problems(self) -> list[str]:
        res = self._done()
        return [*res.problems, *dict.fromkeys(e.implausible for e in res.events if e.implausible)]

    def evidence(self, source: str) -> list[Evidence]:
        res = self._done()
        ev = Emit(source)
        if res.alloc_retries is not None:
            ev.add("mem.alloc_retries", res.alloc_retries, "retries",
                   "cudaMalloc retries (the allocator freed its cache and tried again)")
        if res.fragmentation_statements:
            ev.add("mem.fragmentation_reported", len(res.fragmentation_statements), "statements",
                   f"the text itself blames fragmentation: '{res.fragmentation_statements[0]}'", Quality.LOW)
        if not res.events:
            return ev.items
        # a device's OOM is the incident's when there is one: a host allocation failing beside it is its own
        # evidence (host.alloc_failed_bytes), not the device's numbers
        device = [e for e in res.events if e.device != "CPU"]
        host = [e for e in res.events if e.device == "CPU"]
        oom = _phase_told(_decisive(device or res.events), device or res.events)
        # the decisive event's keys are as good as its message: cut short, or only prose
        ev.quality = Quality.LOW if oom.kind == "prose" else Quality.PARTIAL if oom.truncated else Quality.GOOD
        where = f"{oom.device} {oom.device_index}" if oom.device and oom.device_index is not None else oom.device

        kinds = {e.kind for e in res.events}
        count_detail = (
            "mentioned in prose; no allocator message" if kinds == {"prose"}
            else f"{len(res.events)} out-of-memory event(s)" + (f" on {where}" if where else "")
        )
        ev.add("mem.oom_count", len(device or res.events), "events", count_detail)
        told = ("no traceback frame or log line told the phase" if not oom.phase_from
                else f"from {oom.phase_from}" if oom.phase_from.startswith("the log line")
                else f"from the engine's message: {oom.phase_from}" if oom.phase_by_message
                else f"from the traceback: {oom.phase_from}")
        ev.add("mem.oom_phase", oom.phase, "phase", told)
        if oom.device:
            ev.add("mem.oom_device", oom.device, "", "the device the message names")
        if any(e.tensorflow for e in res.events):
            ev.add("mem.oom_tensorflow", 1, "flag", "TensorFlow's allocator raised it (its BFC allocator takes the "
                   "device's free memory when it starts, unless allow_growth)")
        if host:
            ev.add("host.alloc_failures", len(host), "events", "the host's allocator (PyTorch's DefaultCPUAllocator, "
                   "TensorFlow's cpu allocator) could not get memory from the system")
            asked = [e.requested for e in host if e.requested is not None]
            if asked:
                ev.add("host.alloc_failed_bytes", max(asked), "bytes", "the largest of them")
        for key, value in (
            ("mem.requested_bytes", oom.requested),
            ("mem.device_total_bytes", oom.total),
            ("mem.device_free_bytes", oom.free),
            ("mem.allocated_bytes", oom.allocated),
            ("mem.reserved_bytes", oom.reserved),
            ("mem.reserved_minus_allocated_bytes", oom.reserved_unallocated),
            ("mem.private_pools_bytes", oom.private_pools),
            ("mem.allocation_limit_bytes", oom.limit),
            ("mem.kv_cache_needed_bytes", oom.kv_cache_needed),
            ("mem.kv_cache_available_bytes", oom.kv_cache_available),
        ):
            if value is not None:
                ev.add(key, int(value), "bytes")
        used, others = _split_processes(oom)
        if used is None and others is None and len(oom.other_processes) == 1 and oom.reserved == 0:
            pids = ", ".join(f"pid {pid} {size(b)}" for pid, b in oom.other_processes[:8])
            ev.add("mem.unattributed_process_bytes", sum(b for _, b in oom.other_processes), "bytes",
                   f"{pids}: this process seen from a container, or another (PyTorch reserved nothing)")
        if used is not None:
            ev.add("mem.process_used_bytes", int(used), "bytes", "this process, including non-PyTorch memory")
        if others is not None:
            pids = ", ".join(f"pid {pid} {size(b)}" for pid, b in oom.other_processes[:8])
            if pids and used is None and oom.process_used is None and oom.reserved is None \
                    and oom.process_list_whole and others < sum(b for _, b in oom.other_processes):
                pids += (": no entry is this process's own pid (a container's pid namespace), so it is one of them; "
                         "the largest that could be is not counted")
            elif pids and used is not None and oom.process_used is None and oom.reserved is None:
                pids += ": the entry holding what PyTorch allocated is this process (a container's pid namespace)"
            ev.add("mem.other_processes_bytes", int(others), "bytes",
                   pids or "in use before this process allocated (start-up check)")
        if oom.kv_cache_max_tokens is not None:
            ev.add("mem.kv_cache_max_tokens", oom.kv_cache_max_tokens, "tokens")
        if oom.max_model_len is not None:
            ev.add("mem.max_model_len", oom.max_model_len, "tokens")
        if oom.prefill_tokens is not None:
            ev.add("mem.prefill_tokens_failed", oom.prefill_tokens, "tokens")
        if oom.kv_tokens_requested is not None:
            ev.add("mem.kv_tokens_requested", oom.kv_tokens_requested, "tokens",
                   "the KV slots the failed allocation asked the engine's token pool for")
        if oom.kv_tokens_free is not None:
            ev.add("mem.kv_tokens_free", oom.kv_tokens_free, "tokens",
                   "the token pool's free and evictable slots when the allocation failed")
        if oom.startup_wanted is not None:
            ev.add("mem.startup_wanted_bytes", oom.startup_wanted, "bytes",
                   "what gpu_memory_utilization asked of the device at start-up (vLLM's check)")
        if oom.local_free is not None and oom.free is not None:
            ev.add("mem.tp_free_gap_bytes", max(0, oom.local_free - oom.free), "bytes",
                   f"free before the weights load: {size(oom.free)} on the group's emptiest GPU against "
                   f"{size(oom.local_free)} on this rank")
        if oom.reason:
            ev.add("mem.oom_reason", oom.reason, "text", oom.message[:300])
        return ev.items


def emit_model_size(h: ModelHints, ev: Emit, named: str) -> None:
    """``model.params`` and the weights' size it implies (``mem.weights_estimate_bytes``) from ``h``, whose
    ``params`` is known; ``named`` says where the model's name was read."""
    assert h.params is not None
    ev.add("model.params", int(h.params), "params", named)
    assumed = ollama_tag_default(h)
    nbytes = assumed[1] if assumed else (h.bytes_per_param or 2.0)
    dtype = assumed[0] if assumed else (h.dtype or ("16-bit, as published: the engine's command line names no "
                                                    "quantisation" if h.launch_unquantised
                                                    else "16-bit assumed, no dtype stated"))
    ev.add("mem.weights_estimate_bytes", int(h.params * nbytes), "bytes",
           f"{h.params / 1e9:g}B parameters × {nbytes:g} bytes, {dtype}, for {h.model}",
           Quality.GOOD if h.dtype or (h.launch_unquantised and not assumed) else Quality.LOW)


class HintsSource:
    """Text source for model-size and hardware hints."""

    kind = "model-hints"
    triggers = ()  # model names, GPUs and settings: a start-up banner or a pasted report, in the head

    def __init__(self) -> None:
        self._parser = HintsParser()

    def feed(self, line: str) -> None:
        self._parser.feed(line)

    def matched(self) -> bool:
        h = self._parser.hints
        return any(v is not None for v in (h.params, h.weights_measured, h.gpu_memory_utilization,
                                           h.tensor_parallel, h.gpu_count, h.gpu_memory_bytes,
                                           h.cpu_loading_pct, h.vllm_v1, h.device_total, h.profile_used)) \
            or bool(h.engine_version) or bool(h.tf_devices)

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        h = self._parser.hints
        ev = Emit(source)
        if h.params is not None:
            emit_model_size(h, ev, f"from the model name {h.model}")
        if h.weights_measured is not None:
            ev.add("mem.weights_bytes", h.weights_measured, "bytes", "as the serving engine reported it")
        if h.tf_devices:
            # the device most in use when TensorFlow created it: what others held before it allocated anything
            total, free = max(h.tf_devices, key=lambda d: (d[0] - d[1]) / d[0])
            where = f"{len(h.tf_devices)} devices, the fullest" if len(h.tf_devices) > 1 else "its device"
            ev.add("mem.device_total_bytes", total, "bytes", f"TensorFlow's device creation ({where})")
            ev.add("mem.other_processes_bytes", total - free, "bytes",
                   f"in use before TensorFlow allocated anything: {size(free)} of {size(total)} free when it created "
                   f"{where} (its 'Free memory')")
        if h.device_total is not None:  # after an OOM message's own total (its source is read first)
            ev.add("mem.device_total_bytes", h.device_total, "bytes", "vLLM's memory profiling (total_gpu_memory)")
        if h.profile_used is not None:
            ev.add("mem.profile_device_used_bytes", h.profile_used, "bytes",
                   "vLLM's memory profiling (initial_memory_usage): the device's use by every process once this "
                   "instance's weights were loaded")
        if h.profile_non_torch is not None:
            ev.add("mem.profile_non_torch_bytes", h.profile_non_torch, "bytes",
                   "vLLM 0.6's memory profiling (non_torch_memory): the device's use beyond this process' PyTorch "
                   "tensors, other processes' included")
        if h.tensor_parallel is not None:
            ev.add("mem.tensor_parallel", h.tensor_parallel, "gpus", "as stated")
        elif h.launch_seen and h.tp_rank_max is None:  # ranks in the records say parallelism is on, not its size
            ev.add("mem.tensor_parallel", 1, "gpus", "not set on the launch command line (defaults to 1)")
        if h.pipeline_parallel is not None:
            ev.add("mem.pipeline_parallel", h.pipeline_parallel, "gpus", "as stated")
        if h.gpu_count is not None:
            ev.add("gpu.count_stated", h.gpu_count, "gpus", "as stated (visible devices or a GPU count in the text)")
        if h.gpu_memory_bytes is not None:
            sizes = " or ".join(f"{g:g}" for g in h.gpu_memory_assumed)
            detail = (f"{h.gpu_model}: {size(h.gpu_memory_bytes, 0)} assumed — the {h.gpu_model} comes with {sizes} "
                      "GB and the text does not say which" if h.gpu_memory_assumed
                      else f"{h.gpu_model}: device memory from the GPU's name" if h.gpu_model
                      else "the GPU's memory as the text states it")
            ev.add("gpu.spec_memory_bytes", h.gpu_memory_bytes, "bytes", detail)
        if h.gpu_model:
            ev.add("gpu.name", h.gpu_model, "name", "named in the text")
        if h.gpu_memory_utilization is not None:
            ev.add("mem.gpu_memory_utilization_ratio", h.gpu_memory_utilization, "ratio", "as configured")
        if h.engine:
            ev.add("serving.engine", h.engine, "name", "named in the text")
        if h.engine_version:
            ev.add("serving.engine_version", h.engine_version, "version", "the engine's version the text gives")
        if h.vllm_v1 is not None:
            ev.add("serving.vllm_v1", int(h.vllm_v1), "flag", "vLLM's V1 engine (1) or V0 (0), from the log's markers")
        if h.cpu_loading_pct is not None:
            ev.add("cpu.loading_util_pct", h.cpu_loading_pct, "pct", "CPU use reported while the model loads",
                   Quality.LOW)
            if h.cpu_after_loading_normal:
                ev.add("cpu.after_loading_normal", 1, "flag", "CPU use reported back to normal once the model is up",
                       Quality.LOW)
        return ev.items


def sources() -> list[Any]:
    return [OomSource(), HintsSource()]
