"""Out of memory: which of the four causes it is, told apart with the allocator's own numbers.

The four rules read the same ``mem.*`` keys and are built to be mutually exclusive on clear
evidence: weights that cannot fit (MEM001), a runtime peak on top of weights that fit (MEM002),
memory the caching allocator holds but cannot use (MEM003), memory held by someone else (MEM004).
Each one checks the others' decisive signal before claiming the incident, so one OOM gets one
cause. The fragmentation hint PyTorch prints with *every* OOM (``If reserved but unallocated memory
is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``) is never evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from diagnose.collectors.oom import BALANCE_CHECK_REASON, STARTUP_CHECK_REASON
from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Quality, Risk, Severity
from diagnose.rules import advice
from diagnose.rules.base import Rule, bar, present
from diagnose.units import GIB, MIB, pct, size

# a CUDA context with cuBLAS/cuDNN workspaces and the engine's own small buffers: what a process holds on the device
# beyond its weights before any request (vLLM's profiling logs show 0.45-0.8 GiB)
CONTEXT_BYTES = float(GIB)
EXTERNAL_PLAUSIBLE = 1.02  # memory held elsewhere beyond the device's size (a rounding's worth) is no reading of it
CAP_SLACK_BYTES = 20.0 * MIB  # PyTorch's caching allocator maps large requests in 20 MiB segments
CAP_WHOLE = 0.98  # a per-process cap this close to the whole device caps nothing the device does not


@dataclass(frozen=True)
class MemView:
    """The numbers every memory rule reads, with the fallbacks between sources resolved."""

    total: float | None
    total_key: str
    free: float | None
    allocated: float | None
    reserved: float | None
    unallocated: float | None
    requested: float | None
    used: float | None
    others: float | None
    weights: float | None
    weights_key: str
    parallel: int
    phase: str
    oom: bool
    total_note: str = ""  # how the device's size is known when a name implied it ("80 GiB assumed — …")
    profile_used: float | None = None  # vLLM's initial_memory_usage: every process's use once the weights loaded
    profile_non_torch: float | None = None  # vLLM 0.6's non_torch_memory: use beyond this process' tensors
    limit: float | None = None  # the message's "X allowed": a per-process memory fraction caps PyTorch at X

    @property
    def capped(self) -> bool:
        """PyTorch ran into its own cap ("1.05 GiB allowed": ``set_per_process_memory_fraction``), not the device's
        size: what it held and the request pass the cap while the device had the request free (or free unknown)."""
        held = self.reserved if self.reserved is not None else self.allocated
        if self.limit is None or held is None or self.requested is None:
            return False
        if self.total and self.limit >= CAP_WHOLE * self.total:
            return False  # a fraction of about 1 (TGI's default, many scripts'): the device's size is the cap
        # the message rounds its sizes and the allocator rounds a request up to its block (up to a 20 MiB segment)
        slack = max(CAP_SLACK_BYTES, 0.01 * self.limit)
        return held + self.requested >= self.limit - slack and (self.free is None or self.free >= self.requested)

    @property
    def held_nothing(self) -> bool:
        """PyTorch held nothing on a device the request fits in, and it still failed: no working set overflowed
        (the platform refused that one allocation, or another process took the memory)."""
        return (self.allocated == 0 and not self.reserved and self.requested is not None and self.total is not None
                and self.requested < self.total)

    @property
    def weights_per_device(self) -> float | None:
        return None if self.weights is None else self.weights / max(1, self.parallel)

    def share(self, n: float | None) -> float | None:
        if n is None or not self.total:
            return None
        return n / self.total

    def external(self) -> tuple[float | None, bool]:
        """Bytes held outside this process' PyTorch allocator, and whether that is exact.

        Exact when the message names other processes or this process' total use; otherwise
        (the legacy message) device use minus PyTorch's reservation, which also counts this
        process' own CUDA context and non-PyTorch allocations. With no allocator numbers, vLLM's
        memory profiling: the device's use once the weights were loaded less the weights and a
        context (``CONTEXT_BYTES``), else (0.6.x) its use beyond this process' tensors less a context.
        """
        allocator = self._allocator_external()
        return allocator if allocator is not None else (self._profiled_external(), False)

    def external_share(self) -> tuple[float | None, bool]:
        """The share of the device ``external`` puts outside this process, for a bar, and whether it is exact.
        The legacy message's reading (device use less PyTorch's reservation) also counts this process' own CUDA
        context, a size, not a share (0.3-1 GiB on a 4 GiB card as on an 80 GiB one): one context
        (``CONTEXT_BYTES``) is taken off it first, as the profiling readings already take it off."""
        held, exact = self.external()
        if held is None or not self.total:
            return None, exact
        if not exact and not self.profiled():
            held = max(0.0, held - CONTEXT_BYTES)
        return held / self.total, exact

    def profiled(self) -> bool:
        """Whether ``external`` reads vLLM's memory profiling (no allocator numbers)."""
        return self._allocator_external() is None and self._profiled_external() is not None

    def _allocator_external(self) -> tuple[float, bool] | None:
        if self.others is not None:
            return self.others, True
        if self.used is not None and self.total is not None and self.free is not None:
            return max(0.0, self.total - self.free - self.used), True
        if self.reserved is not None and self.total is not None and self.free is not None:
            return max(0.0, self.total - self.free - self.reserved), False
        return None

    def _profiled_external(self) -> float | None:
        by_weights = (None if self.profile_used is None or self.weights_per_device is None
                      else max(0.0, self.profile_used - self.weights_per_device - CONTEXT_BYTES))
        # non_torch_memory bounds what other processes hold (it is the device's use less this process' tensors):
        # a weights size from the wrong load (a speculative-decoding draft logged last) cannot exceed it
        by_non_torch = (None if self.profile_non_torch is None
                        else max(0.0, self.profile_non_torch - CONTEXT_BYTES))
        held = [h for h in (by_weights, by_non_torch) if h is not None]
        return min(held) if held else None


def _host_oom(ev: EvidenceSet) -> bool:
    """The out-of-memory error was the host allocator's (PyTorch's DefaultCPUAllocator), not a device's."""
    device = ev.get("mem.oom_device")
    return isinstance(device, Evidence) and device.value == "CPU"


def room_for_request(m: MemView, factor: float) -> bool:
    """Whether the allocator's message shows the device with ``factor`` × the failed request free (and 1 GiB or more):
    what failed had room, so the memory its process holds did not run out."""
    return m.free is not None and bool(m.requested) and m.free >= max(factor * (m.requested or 0.0), GIB)


def read_mem(ev: EvidenceSet) -> MemView:
    total_key = next((k for k in ("mem.device_total_bytes", "gpu.memory_total_bytes", "gpu.spec_memory_bytes")
                      if ev.value(k) is not None), "")
    allocated = ev.value("mem.allocated_bytes")
    reserved = ev.value("mem.reserved_bytes")
    unalloc = ev.value("mem.reserved_minus_allocated_bytes")
    if unalloc is None and allocated is not None and reserved is not None:
        unalloc = max(0.0, reserved - allocated)
    weights_key = next((k for k in ("mem.weights_bytes", "mem.weights_estimate_bytes") if ev.value(k) is not None), "")
    tp = int(ev.value("mem.tensor_parallel", 1.0) or 1)
    pp = int(ev.value("mem.pipeline_parallel", 1.0) or 1)
    phase_ev = ev.get("mem.oom_phase")
    phase = str(phase_ev.value) if isinstance(phase_ev, Evidence) else "unknown"
    # a measured weight size from the engine is already per device
    parallel = 1 if weights_key == "mem.weights_bytes" else max(1, tp) * max(1, pp)
    total_ev = ev.get(total_key) if total_key else None
    note = ""
    if isinstance(total_ev, Evidence) and "assumed" in total_ev.detail:
        note = total_ev.detail.split(": ", 1)[-1]
    return MemView(
        total_note=note,
        total=ev.value(total_key) if total_key else None,
        total_key=total_key,
        free=ev.value("mem.device_free_bytes"),
        allocated=allocated,
        reserved=reserved,
        unallocated=unalloc,
        requested=ev.value("mem.requested_bytes"),
        used=ev.value("mem.process_used_bytes"),
        others=ev.value("mem.other_processes_bytes"),
        weights=ev.value(weights_key) if weights_key else None,
        weights_key=weights_key,
        parallel=parallel,
        phase=phase,
        # an OOM of the host's allocator (PyTorch's DefaultCPUAllocator) is no device's: MEM013 reads it
        oom=(ev.value("mem.oom_count", 0.0) or 0.0) > 0 and not _host_oom(ev),
        profile_used=ev.value("mem.profile_device_used_bytes"),
        limit=ev.value("mem.allocation_limit_bytes"),
        # with tensor or pipeline parallelism NCCL's buffers count there too: not read then
        profile_non_torch=ev.value("mem.profile_non_torch_bytes") if tp * pp == 1 else None,
    )


# what the allocator's numbers say of each cause of an OOM that no rule named, for the differential's order: a share
# of the device held outside this process this large speaks for another process; this small (and exact), against
OUTSIDE_FOR = 0.03
OUTSIDE_AGAINST = 0.01
WEIGHTS_AGAINST = 0.5  # weights under half the device do not fill it


def oom_numbers(ev: EvidenceSet) -> dict[str, tuple[bool, str]]:
    """For each cause of an OOM its numbers speak to: (for it, why). Only what the allocator's message, the
    engine's own readings or a model's size measured; nothing for the runtime peak, the cause when none other is."""
    m = read_mem(ev)
    out: dict[str, tuple[bool, str]] = {}
    if not m.oom or not m.total:
        return out
    held, exact = m.external()
    share, _ = m.external_share()
    if held is not None and share is not None:
        where = f"{size(held)} ({_share(held / m.total)}) of the {size(m.total)} device"
        if share >= OUTSIDE_FOR:
            out[Category.OOM_EXTERNAL.value] = (True, f"{where} was held outside this process"
                                                + ("" if exact else " (with its own CUDA context)"))
        elif exact and share < OUTSIDE_AGAINST:
            out[Category.OOM_EXTERNAL.value] = (False, f"only {where} was held outside this process")
    u = m.unallocated
    if u is not None and m.requested:
        if u < m.requested:
            out[Category.OOM_FRAGMENTATION.value] = (
                False, f"the allocator held only {size(u)} reserved but unallocated, less than the "
                       f"{size(m.requested)} it tried to allocate")
        elif is_fragmented(m, (frag := OomFragmentation.Thresholds()).share_total, frag.share_reserved,
                           frag.min_bytes):  # MEM003's own bars
            out[Category.OOM_FRAGMENTATION.value] = (
                True, f"{size(u)} was reserved but unallocated, more than the {size(m.requested)} asked for")
    per = m.weights_per_device
    if per is not None:
        # an engine that takes a share of the device (vLLM --gpu-memory-utilization) must fit the weights in it
        util = ev.value("mem.gpu_memory_utilization_ratio")
        budget = m.total * util if util is not None and 0 < util <= 1 else m.total
        what = f"the {size(budget)} gpu_memory_utilization={util:g} gives the engine" if budget < m.total else \
            "the device"
        if per >= budget:
            out[Category.OOM_WEIGHTS.value] = (True, f"the weights take about {size(per)} per device, more than {what}")
        elif per < WEIGHTS_AGAINST * budget:
            out[Category.OOM_WEIGHTS.value] = (False, f"the weights take about {size(per)} per device, "
                                                      f"{_share(per / budget)} of {what}")
    return out


def weights_too_big(m: MemView, share: float) -> bool:
    ws = m.share(m.weights_per_device)
    return ws is not None and ws >= share


def _weights_known_beyond(ev: EvidenceSet, m: MemView) -> bool:
    """The weights per device exceed the whole device, as measured or from a model whose dtype was stated (a 16-bit
    guess could be a 4-bit load that fits: BitsAndBytesConfig in code, a quantisation the name does not carry)."""
    per = m.weights_per_device
    if per is None or not m.total or per < m.total:
        return False
    if m.weights_key == "mem.weights_bytes":
        return True
    est = ev.get("mem.weights_estimate_bytes")
    return isinstance(est, Evidence) and est.quality is Quality.GOOD


def is_external(m: MemView, exact_share: float, rough_share: float) -> bool:
    if m.capped:  # the process ran into its own cap: what others hold did not fail it
        return False
    s, exact = m.external_share()
    return s is not None and s >= (exact_share if exact else rough_share)


def kv_sized(ev: EvidenceSet) -> bool:
    """The engine sized its KV cache, which it does once the weights are in: its capacity in tokens, or vLLM's "…
    larger than the available KV cache memory (48.66 GiB)", what the weights and the profiling run left (a negative
    figure: they left nothing)."""
    return (ev.value("serving.kv_capacity_tokens") or 0.0) > 0 or (ev.value("mem.kv_cache_available_bytes") or 0.0) > 0


def is_fragmented(m: MemView, share_total: float, share_reserved: float, min_bytes: float) -> bool:
    """Reserved-but-unallocated is large and the failed request would have fit in it."""
    u = m.unallocated
    if u is None or u < min_bytes:
        return False
    large = (m.total is not None and u >= share_total * m.total) or (
        m.reserved is not None and m.reserved > 0 and u >= share_reserved * m.reserved)
    fits = m.requested is None or m.requested <= u + (m.free or 0.0)
    return bool(large and fits)


def _share(x: float) -> str:
    return pct(x, 1 if x < 0.01 else 0)


def _numbers(m: MemView) -> str:
    """The allocator's picture in one sentence (only the numbers that were reported)."""
    parts = []
    if m.requested is not None:
        parts.append(f"a request for {size(m.requested)} failed")
    if m.allocated is not None and m.total is not None:
        parts.append(f"PyTorch had {size(m.allocated)} allocated of {size(m.total)} ({pct(m.allocated / m.total)})")
    elif m.total is not None:
        parts.append(f"the device has {size(m.total)}" + (f" ({m.total_note}; say which if the verdict hinges on it)"
                                                          if m.total_note else ""))
    if m.free is not None:
        parts.append(f"{size(m.free)} free")
    return ", ".join(parts)


_MEM_KEYS = (
    "mem.oom_phase", "mem.requested_bytes", "mem.device_total_bytes", "mem.device_free_bytes",
    "mem.allocated_bytes", "mem.reserved_bytes", "mem.reserved_minus_allocated_bytes",
    "mem.process_used_bytes", "mem.other_processes_bytes",
)


class OomWeights(Rule):
    """The model's weights alone do not fit on one device.

    What it detects: an out-of-memory error raised while the weights are loaded or the model is
    constructed (``load_model``, ``load_weights``, ``from_pretrained``, ``torch.empty`` in a layer's
    ``__init__``, ``.to(device)`` at start-up), or a model whose weights per device (parameters ×
    bytes per parameter ÷ tensor×pipeline parallelism) reach the device's capacity.

    Why it matters: no batch size, cache or allocator setting helps; the model must be sharded,
    quantised or put on a bigger device. Serving frameworks do not shard on their own: vLLM with
    eight visible GPUs and no ``--tensor-parallel-size`` loads everything onto GPU 0.

    How it decides: the OOM phase is ``loading``, or the weights per device are at least
    ``weights_share`` of the device (``mem.weights_bytes`` as the engine reported it, else
    ``mem.weights_estimate_bytes`` from a parameter count in the model name). A loading-phase OOM
    is not claimed when another process holds at least MEM004's ``external_share`` of the device
    (MEM004, or nvidia-smi's memory outside the listed processes, ``gpu.memory_unlisted_share_ratio``:
    MEM010), when the allocator holds a large reserved-but-unallocated pool the request would have fit
    in (MEM003's bars), when the weights are known to be under ``fits_share`` of the device, or when the message
    shows ``free_factor`` × the failed request free (and 1 GiB or more: the device had room for it). The
    other rules' thresholds are read as configured, so one override moves both rules. Weights estimated
    from a name are not claimed too big when the engine's log sized its KV cache
    (``serving.kv_capacity_tokens``): vLLM and SGLang size it once the weights are loaded, so they fit.

    Evidence: mem.oom_count; optionally mem.oom_phase, mem.weights_bytes, mem.weights_estimate_bytes,
    model.params, mem.tensor_parallel, mem.pipeline_parallel, gpu.count (or gpu.count_stated), the
    allocator numbers, serving.kv_capacity_tokens.

    Fix: shard across GPUs (``--tensor-parallel-size N``, ``device_map="auto"``), quantise (AWQ,
    GPTQ, FP8), offload part of the weights to CPU, or use a larger device.

    False positives: a parameter count in prose about another model; a start-up OOM caused by a
    previous run still holding the GPU (checked: MEM004 evidence vetoes it). TensorFlow's allocator takes
    the memory free when it starts (unless ``allow_growth``), so its loading OOM with no device figure
    (``mem.oom_tensorflow``, no total or free) is only ``thin`` at ``tf_unsized_impact``: another process
    holding the GPU then explains it as well (DeepLabCut#22). vLLM's start-up check (``Free memory on
    device … on startup is less than desired GPU memory utilization``) runs before the weights load: its phase alone
    is no evidence of them.
    """

    code = "MEM001"
    name = "oom-weights"
    category = Category.OOM_WEIGHTS
    requires = ("mem.oom_count",)
    optional = (
        *_MEM_KEYS, "mem.weights_bytes", "mem.weights_estimate_bytes", "model.params", "mem.tensor_parallel",
        "mem.pipeline_parallel", "gpu.count", "gpu.count_stated", "gpu.spec_memory_bytes",
        "gpu.memory_unlisted_share_ratio", "serving.kv_capacity_tokens",
    )

    @dataclass(frozen=True)
    class Thresholds:
        weights_share: float = 0.9  # weights filling 90 % of a device leave no room for activations or KV cache
        fits_share: float = 0.5  # weights under half the device fit: a loading OOM then has another cause
        tf_unsized_impact: float = 0.6  # TensorFlow's loading OOM, no device figure: the weights or another holder
        free_factor: float = 8.0  # free memory this many times the failed request (and 1 GiB): the device had room

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        m = read_mem(ev)
        if not m.oom:
            return None
        by_size = weights_too_big(m, t.weights_share)
        # vLLM's start-up check runs before any weight is loaded: its phase says nothing of the weights
        reason = ev.get("mem.oom_reason")
        startup = isinstance(reason, Evidence) and reason.value in (STARTUP_CHECK_REASON, BALANCE_CHECK_REASON)
        by_phase = m.phase == "loading" and not startup
        if not (by_size or by_phase):
            return None
        if not by_size and room_for_request(m, t.free_factor):
            # the device had room for what failed (FastChat#2429: 86 MiB refused with 7.19 GiB free while loading):
            # the weights loaded so far did not fill it; what took the memory, or refused it, was not them
            return None
        if not by_phase and m.weights_key != "mem.weights_bytes" and kv_sized(ev):
            return None  # the engine sized its KV cache, which it does once the weights are in: they fit
        if not by_size:
            ws = m.share(m.weights_per_device)
            if ws is not None and ws < t.fits_share:
                return None
            ext, frag = self.thresholds_of(OomExternal), self.thresholds_of(OomFragmentation)
            if is_external(m, ext.external_share, ext.rough_share):
                return None
            if (ev.value("gpu.memory_unlisted_share_ratio", 0.0) or 0.0) >= ext.external_share:
                return None  # nvidia-smi shows that much in use by no listed process: MEM010 (oom_external)
            if is_fragmented(m, frag.share_total, frag.share_reserved, frag.min_bytes):
                return None
        phase_ev = ev.get("mem.oom_phase")
        where = phase_ev.detail if isinstance(phase_ev, Evidence) and phase_ev.detail else ""
        msg = []
        if by_phase:
            msg.append("The out-of-memory error was raised while the model's weights were being loaded"
                       + (f" ({where.removeprefix('from the traceback: ').removeprefix('from ')})" if where else "")
                       + ".")
        else:
            msg.append("An out-of-memory error was raised and the model's weights do not fit the device.")
        nums = _numbers(m)
        if nums:
            msg.append(nums[0].upper() + nums[1:] + ".")
        per = m.weights_per_device
        if per is not None:
            what = "as the engine reported" if m.weights_key == "mem.weights_bytes" else "estimated from the model name"
            w_ev = ev.get(m.weights_key)
            detail = w_ev.detail if isinstance(w_ev, Evidence) and m.weights_key != "mem.weights_bytes" else ""
            line = f"The weights take about {size(per)} per device ({what}"
            line += f": {detail}" if detail else ""
            line += f", split over {m.parallel} device(s)" if m.parallel > 1 else ""
            line += ")"
            if m.total:
                line += f", {per / m.total:.1f}× the {size(m.total)} device"
            msg.append(line + ".")
        gpus = ev.value("gpu.count") or ev.value("gpu.count_stated")
        tp = ev.value("mem.tensor_parallel")
        if gpus is not None and gpus > 1 and (tp is None or tp < gpus):
            msg.append(f"{gpus:.0f} GPUs are available but tensor parallelism is {tp or 1:.0f}: "
                       "the engine does not spread the model by itself.")
        need = _shards_needed(m, t.weights_share)
        steps = [f"Shard the model: vLLM --tensor-parallel-size {need}" if need else
                 "Shard the model: vLLM --tensor-parallel-size N (N GPUs), SGLang --tp N, TGI --num-shard N",
                 "With transformers: from_pretrained(..., device_map='auto') to spread layers over GPUs"]
        confidence = Confidence.CORRELATED if (by_size and by_phase) else Confidence.HEURISTIC
        if m.weights_key == "mem.weights_bytes" and by_size:
            confidence = Confidence.MEASURED
        impact = 0.9
        if not by_size and ev.value("mem.oom_tensorflow") and m.total is None and m.free is None:
            # TensorFlow's allocator took the device's free memory when it started: a variable it cannot create says
            # that memory ran out, not whose it was (another process holding the GPU then is as likely)
            confidence, impact = Confidence.THIN, t.tf_unsized_impact
            msg.append("TensorFlow's allocator takes the memory free when it starts (unless allow_growth): with no "
                       "device figure in view, another process holding the GPU at that moment explains it as well "
                       "(its log's 'Found device … freeMemory' line, or nvidia-smi before it starts, tells them "
                       "apart).")
        why = ""
        if per is not None and m.total:
            why = f"weights |{bar(per / m.total)}| {size(per)} of {size(m.total)}"
        return self.finding(
            severity=Severity.CRITICAL,
            confidence=confidence,
            title="The weights do not fit on the device",
            message=" ".join(msg),
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=why,
            fixes=[
                Fix("Spread the weights over more GPUs", tuple(steps), Risk.SAFE),
                Fix(
                    "Shrink the weights",
                    ("Serve a quantised checkpoint (AWQ/GPTQ 4-bit ≈ 0.5 byte per parameter, FP8 ≈ 1 byte): "
                     "vLLM --quantization awq|gptq|fp8",
                     "Or offload part of the weights: vLLM --cpu-offload-gb N (slower)"),
                    Risk.NEEDS_VALIDATION,
                ),
                Fix("Use a device with more memory",
                    ("Pick a GPU whose memory exceeds the per-device weights by at least 20 % for KV cache "
                     "and activations",), Risk.SAFE),
            ],
        )


def _shards_needed(m: MemView, share: float) -> int | None:
    """The power-of-two tensor-parallel size that brings the weights under ``share`` of one device."""
    if m.weights is None or not m.total or m.weights_key == "mem.weights_bytes":
        return None
    n = max(1, math.ceil(m.weights / (share * 0.8 * m.total)))
    return 1 << (n - 1).bit_length()


class OomRuntimePeak(Rule):
    """The runtime peak (activations, KV cache, batch × sequence length) exceeds the memory left.

    What it detects: an out-of-memory error after the weights were loaded: in vLLM's profiling
    run (``profile_run``, ``determine_num_available_blocks``, ``_dummy_run``), in warm-up or
    CUDA-graph capture (``capture_model``, sampler warm-up, TGI's prefill warm-up), or while serving
    (``execute_model``, ``run_engine_loop``, ``generate``, SGLang's scheduler loop); a KV cache too small
    for one max-length sequence; an engine's KV pool running out while it serves (SGLang's ``Decode out of
    memory. Try to lower your batch size.`` with the slots it asked for and had); PyTorch running into its own
    per-process cap (the message's ``X allowed``: ``set_per_process_memory_fraction``) while the device had the
    request free; or, with no traceback, PyTorch holding most of the device while the weights are known to fit. A
    request refused while PyTorch held nothing on a device it fits in is no working set overflowing (a platform's
    single-allocation limit, or another process).

    Why it matters: the weights fit, so the fix is to bound the working set: fewer concurrent
    sequences, shorter maximum length, smaller prefill chunks, or less memory promised to the KV
    cache, not a bigger GPU.

    How it decides: ``mem.oom_phase`` is ``profile_run``, ``warmup`` or ``serving``; or the phase is
    unknown, PyTorch had at least ``busy_share`` of the device allocated and the weights per device
    are known to be under MEM001's ``weights_share`` (or are unknown: then with thin confidence, since a
    runtime peak is the most common way a process fills its device). Outside loading, a single
    request for at least ``huge_request_share`` of the device (or more than it has) is one
    activation, whatever else is known: weights load tensor by tensor. Vetoed when the weights alone
    reach MEM001's ``weights_share``, another process holds MEM004's ``external_share``, or the
    request would have fit in a large reserved-but-unallocated pool (MEM003's bars); those rules'
    thresholds are read as configured, so one override moves both. Where the device was full (less free than
    asked, or under ``full_share`` of it)
    while PyTorch's tensors held under ``unaccounted_share`` of it and the message names no reservation (the
    cudaMallocAsync backend's), the rest is in no tensor and the finding says so at ``unaccounted_impact``.

    Evidence: mem.oom_count, mem.oom_phase; optionally the allocator numbers,
    mem.gpu_memory_utilization_ratio, mem.kv_cache_*, mem.max_model_len, mem.prefill_tokens_failed,
    mem.oom_reason, mem.weights_bytes, mem.weights_estimate_bytes, mem.kv_tokens_requested, mem.kv_tokens_free.

    Fix: lower ``--max-num-seqs`` / ``--max-num-batched-tokens`` / ``--max-model-len`` (TGI:
    ``--max-batch-prefill-tokens``), enable chunked prefill, leave headroom
    (``--gpu-memory-utilization`` 0.85-0.9), skip CUDA graphs (``--enforce-eager``) when capture OOMs. When
    the engine's own KV pool ran out: bound the running batch (SGLang ``--max-running-requests``,
    ``--schedule-conservativeness``) or give the pool more room (``--mem-fraction-static`` up, an FP8 KV cache);
    a pool that had the slots in number (free ≥ asked) points at its page accounting: ``--page-size 1``.

    False positives: a serving-time OOM that is really fragmentation with modest numbers (MEM003
    catches the clear cases); a leak that grows until it fails (the phase says serving, the fix is
    the leak).
    """

    code = "MEM002"
    name = "oom-runtime-peak"
    category = Category.OOM_PEAK
    requires = ("mem.oom_count", "mem.oom_phase")
    optional = (
        *_MEM_KEYS[1:], "mem.gpu_memory_utilization_ratio", "mem.kv_cache_needed_bytes",
        "mem.kv_cache_available_bytes", "mem.kv_cache_max_tokens", "mem.max_model_len",
        "mem.prefill_tokens_failed", "mem.oom_reason", "mem.private_pools_bytes", "mem.weights_bytes",
        "mem.weights_estimate_bytes", "mem.kv_tokens_requested", "mem.kv_tokens_free",
    )

    @dataclass(frozen=True)
    class Thresholds:
        busy_share: float = 0.8  # PyTorch holding 80 % of the device with weights that fit: the rest is runtime
        high_utilization: float = 0.9  # vLLM gpu_memory_utilization above this leaves little outside KV cache
        huge_request_share: float = 0.25  # one allocation of a quarter of the device is no weight tensor
        unaccounted_share: float = 0.5  # tensors under half of a full device, nothing said of the rest: not sure
        full_share: float = 0.02  # a device with under 2 % free (or less than asked) is full: its free is scraps
        unaccounted_impact: float = 0.55  # ... then the peak is one candidate among the holders of the rest

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        m = read_mem(ev)
        if not m.oom:
            return None
        by_phase = m.phase in ("profile_run", "warmup", "serving")
        ws = m.share(m.weights_per_device)
        alloc_share = m.share(m.allocated)
        busy = m.phase == "unknown" and alloc_share is not None and alloc_share >= t.busy_share
        weights_bar = self.thresholds_of(OomWeights).weights_share  # MEM001's: weights this large are the cause
        by_numbers = busy and ws is not None and ws < weights_bar
        # nothing says where it failed nor how big the model is: runtime peaks are by far the
        # most common cause of a process filling its device, so say so, thinly
        by_default = busy and ws is None
        # weights load tensor by tensor; one request for a large part of the device (or more than it
        # has) is an activation: attention over a long sequence, a big image, a huge batch
        req_share = m.share(m.requested)
        # a request on a device that held nothing of PyTorch's and had room for it is no working set overflowing
        by_request = (m.phase != "loading" and req_share is not None and req_share >= t.huge_request_share
                      and not m.held_nothing)
        by_cap = m.capped  # PyTorch ran into its per-process memory fraction: the cap is its peak's limit
        if not (by_phase or by_numbers or by_default or by_request or by_cap):
            return None
        ext, frag = self.thresholds_of(OomExternal), self.thresholds_of(OomFragmentation)
        # (an estimate from the model's name that the engine's KV sizing contradicts is no weights finding: MEM001's)
        if weights_too_big(m, weights_bar) and not (m.weights_key != "mem.weights_bytes" and kv_sized(ev)):
            return None
        if is_external(m, ext.external_share, ext.rough_share):
            return None
        if is_fragmented(m, frag.share_total, frag.share_reserved, frag.min_bytes):
            return None
        phase_ev = ev.get("mem.oom_phase")
        where = ""
        told_by_message = isinstance(phase_ev, Evidence) and phase_ev.detail.startswith("from the engine's message: ")
        if isinstance(phase_ev, Evidence) and phase_ev.detail.startswith("from "):
            where = (phase_ev.detail.removeprefix("from the traceback: ").removeprefix("from the engine's message: ")
                     .removeprefix("from "))
        reason_ev = ev.get("mem.oom_reason")
        reason = str(reason_ev.value) if isinstance(reason_ev, Evidence) else ""
        util = ev.value("mem.gpu_memory_utilization_ratio")
        msg = {
            "profile_run": "The out-of-memory error was raised in the engine's profiling run, which pushes the "
                           "largest configured batch (max_num_seqs dummy sequences × max length) through the model "
                           "to size the KV cache: that peak does not fit next to the weights.",
            "warmup": "The out-of-memory error was raised during warm-up (dummy batches or CUDA-graph capture "
                      "at the largest configured batch): the configured peak does not fit next to the weights.",
            "serving": "The out-of-memory error was raised while serving, after the weights were loaded: the "
                       "working set of a batch (activations, sampler buffers, KV blocks) exceeded what was left.",
            "unknown": "PyTorch held most of the device when the out-of-memory error was raised, while the "
                       "weights alone fit: the runtime working set is what overflowed.",
            "default": "PyTorch held most of the device when the out-of-memory error was raised: most likely the "
                       "runtime working set (batch × sequence length, activations, KV cache) overflowed.",
            "request": ("A single allocation asked for more than the device has"
                        if req_share is not None and req_share > 1 else
                        "A single allocation was asked for a large part of the device")
                       + ": no weight tensor is that big, so it is one activation (attention over a long sequence, a "
                         "large image or video, a huge batch) that does not fit.",
        }[m.phase if m.phase in ("profile_run", "warmup", "serving")
          else ("request" if by_request else "unknown" if by_numbers else "default")]
        if by_cap and m.limit is not None:
            held = m.reserved if m.reserved is not None else m.allocated
            msg = (f"PyTorch is capped at {size(m.limit)} for this process (a per-process memory fraction: "
                   f"torch.cuda.set_per_process_memory_fraction) and held {size(held or 0.0)} when it asked for "
                   f"{size(m.requested or 0.0)} more"
                   + (f", with {size(m.free)} of the device free" if m.free is not None else "")
                   + ": the cap ran out, not the device.")
        ask, free = ev.value("mem.kv_tokens_requested"), ev.value("mem.kv_tokens_free")
        pool = ask is not None or free is not None or "token pool ran out" in reason
        slots = "request-slot pool" in reason  # more requests than slots: the running batch's bound, nothing else
        paged = ask is not None and free is not None and free >= ask
        if slots:
            msg = ("The engine's request-slot pool ran out while serving: more requests ran at once than it has slots "
                   "for (SGLang sizes them from --max-running-requests).")
        elif pool and m.phase == "serving" and paged:
            msg = "The engine's KV-cache pool refused an allocation while serving."
        elif pool and m.phase == "serving":
            msg = ("The engine's KV-cache pool ran out of slots while serving: the running requests' sequences "
                   "outgrew the pool it sized at start-up.")
        parts = [msg]
        if where:
            parts.append(f"(Told by {where}.)" if told_by_message else f"(Traceback: {where}.)")
        if reason:
            parts.append(f"The framework said: {reason}.")
        if ask is not None and free is not None:
            parts.append(f"It asked its token pool for {ask:,.0f} KV slots and had {free:,.0f} free or evictable.")
            if paged:
                parts.append("The pool had that many slots: a pool allocated in pages (SGLang --page-size above 1) "
                             "with its free slots spread over partly used pages, or slots that leaked, fails this "
                             "way (sgl-project/sglang#4602, #11581, #14972): try --page-size 1, or a newer release.")
        nums = _numbers(m)
        if nums:
            parts.append(nums[0].upper() + nums[1:] + ".")
        if m.unallocated is not None and m.reserved and m.unallocated < frag.share_reserved * m.reserved:
            parts.append(f"Only {size(m.unallocated)} ({_share(m.unallocated / m.reserved)} of PyTorch's reservation) "
                         "was reserved but unallocated, so this is not fragmentation.")
        if util is not None and util >= t.high_utilization:
            parts.append(f"gpu_memory_utilization is {util:.3g}: the KV cache takes nearly everything, leaving "
                         f"{pct(1 - util)} of the device for activations and other processes.")
        kv_need, kv_have = ev.value("mem.kv_cache_needed_bytes"), ev.value("mem.kv_cache_available_bytes")
        if kv_need is not None and kv_have is not None:
            parts.append(f"One max-length sequence needs {size(kv_need)} of KV cache; {size(kv_have)} is available.")
        max_len, kv_tokens = ev.value("mem.max_model_len"), ev.value("mem.kv_cache_max_tokens")
        if max_len is not None and kv_tokens is not None:
            parts.append(f"max_model_len is {max_len:.0f} tokens but the KV cache holds {kv_tokens:.0f}.")
        fixes = [
            Fix(
                "Bound the peak batch",
                (f"vLLM: lower --max-num-seqs ({advice.max_num_seqs(ev)}; e.g. 64) and --max-num-batched-tokens; "
                 "multimodal models: also --limit-mm-per-prompt",
                 "vLLM: cap --max-model-len to what requests need; " + advice.chunked_prefill(ev),
                 "TGI: lower --max-batch-prefill-tokens / --max-batch-total-tokens; SGLang: --chunked-prefill-size, "
                 "--max-running-requests"),
                Risk.SAFE,
            ),
            Fix(
                "Leave headroom outside the KV cache",
                ("vLLM: lower --gpu-memory-utilization (e.g. 0.85) so activations, sampler and CUDA graphs fit; "
                 "SGLang: lower --mem-fraction-static",
                 "If CUDA-graph capture is what fails: --enforce-eager, or fewer capture sizes"),
                Risk.NEEDS_VALIDATION,
            ),
        ]
        if slots:
            fixes = [Fix("Bound the running batch", ("SGLang: set --max-running-requests below the slots the pool has "
                                                     "(the message's own advice)",), Risk.SAFE)]
        if by_cap:
            fixes.insert(0, Fix("Raise or remove the process's memory cap", (
                "Find the torch.cuda.set_per_process_memory_fraction(F) call (a test, a framework's setting) and "
                "raise F, or drop it where one process owns the device",), Risk.SAFE))
        if pool:  # the engine's own KV pool ran out: its running batch and its pool's size, not activations
            fixes = [
                Fix("Bound the running batch",
                    ("SGLang: lower --max-running-requests, and --chunked-prefill-size for long prompts",
                     "SGLang: retractions before the failure ('KV cache pool is full. Retract requests.') mean the "
                     "scheduler admitted more than the pool held: raise --schedule-conservativeness (e.g. 1.3)"),
                    Risk.SAFE),
                Fix("Give the KV pool more room",
                    ("SGLang: raise --mem-fraction-static when activations have headroom (an OOM in a forward pass "
                     "after it means too far)",
                     "Quantise the KV cache: SGLang --kv-cache-dtype fp8_e5m2; or serve on more GPUs (--tp N)"),
                    Risk.NEEDS_VALIDATION),
            ]
            if paged:
                fixes.insert(0, Fix("Rule out the pool's page accounting",
                                    ("SGLang: restart with --page-size 1; if the failures stop, the paged pool "
                                     "(or a slot leak) is the cause: upgrade SGLang",), Risk.NEEDS_VALIDATION))
        conf = Confidence.MEASURED if (by_phase and m.total is not None) else Confidence.HEURISTIC
        impact = 0.85
        # the device full while PyTorch's tensors held a small part of it and nothing says who held the rest (no
        # reservation in the message: cudaMallocAsync's "Allocation on device 0 would exceed allowed memory"): the
        # batch's working set is one reading of it; the allocator's cached pool or another holder are others
        unaccounted = (m.total and m.allocated is not None and m.reserved is None and m.free is not None
                       and alloc_share is not None and alloc_share < t.unaccounted_share
                       and m.free < max(m.requested or 0.0, t.full_share * m.total)
                       and not (pool or slots or by_cap or by_request))
        if unaccounted:
            impact, conf = t.unaccounted_impact, Confidence.THIN  # one reading of three: too little to tell
            parts.append(f"PyTorch's tensors held only {pct(alloc_share or 0.0)} of the device when it was full: the "
                         f"other {size((m.total or 0.0) - (m.allocated or 0.0) - (m.free or 0.0))} is in no tensor "
                         "of this process (its allocator's cached pool, another process, NCCL or CUDA-graph buffers). "
                         "torch.cuda.memory_reserved() and nvidia-smi --query-compute-apps tell them apart.")
        count_ev = ev.get("mem.oom_count")
        if isinstance(count_ev, Evidence) and count_ev.quality is Quality.LOW:
            conf = Confidence.THIN  # an OOM mentioned in prose: no allocator numbers
        if by_default and not by_phase:
            conf = Confidence.THIN
            parts.append("Neither the phase nor the model's size is known: if the weights alone come close to the "
                         "device's size, it is MEM001 (oom-weights) instead.")
        why = ""
        if alloc_share is not None:
            why = f"allocated |{bar(alloc_share)}| {pct(alloc_share)} of the device"
        return self.finding(
            severity=Severity.CRITICAL,
            confidence=conf,
            title="The runtime peak does not fit in memory",
            message=" ".join(parts),
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=why,
            fixes=fixes,
        )


class OomFragmentation(Rule):
    """The caching allocator holds memory it cannot use: fragmentation.

    What it detects: PyTorch's caching allocator has reserved far more than it has allocated
    (``reserved − allocated`` large), and the failed request would have fit in that gap plus the
    free memory; or the allocator retried ``cudaMalloc`` after flushing its cache many times.

    Why it matters: memory is not short, it is cut into blocks of the wrong sizes, typically by
    allocations whose sizes vary from request to request (variable sequence lengths, multimodal
    inputs); more memory only delays the next failure.

    How it decides: at an out-of-memory error, ``mem.reserved_bytes − mem.allocated_bytes`` is at
    least ``min_bytes`` and at least ``share_total`` of the device or ``share_reserved`` of the
    reservation, and the request (``mem.requested_bytes``, when known) is no larger than it plus
    ``mem.device_free_bytes``; or the largest free block (``mem.largest_free_block_bytes``, from a
    snapshot or the probe) was smaller than the request although enough was free in total; or split
    blocks (``mem.inactive_split_bytes``, free blocks inside segments that hold live ones) were at
    least ``share_reserved`` of the reservation at the OOM. Without an OOM, a reading of reserved −
    allocated or of split blocks is a state, not a failure (MEM011 notes it): only
    ``mem.alloc_retries`` ≥ ``min_retries`` counts, each one a ``cudaMalloc`` that failed and was
    retried after flushing the cache. Never with ``mem.expandable_segments`` on (the allocator maps
    pages instead of splitting). PyTorch's generic hint about ``expandable_segments`` is printed with
    every OOM and is not evidence.

    Where memory held outside this process' allocator (MEM004's reading) is at least ``external_share`` of the
    device and ``external_multiple`` × the stranded gap, the gap only decided how close to the edge the request
    failed: the finding stays, at impact ``beside_external``, behind MEM004.

    Evidence: mem.reserved_bytes, mem.allocated_bytes; optionally mem.alloc_retries,
    mem.reserved_minus_allocated_bytes, mem.requested_bytes, mem.device_free_bytes,
    mem.device_total_bytes, mem.oom_count, mem.oom_phase, mem.largest_free_block_bytes,
    mem.inactive_split_bytes, mem.expandable_segments.

    Fix: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (``PYTORCH_ALLOC_CONF`` from PyTorch
    2.9; not with vLLM's sleep mode), or ``max_split_size_mb``, lower ``gpu_memory_utilization``, cap
    sequence length so block sizes vary less, restart policy.

    False positives: a snapshot taken right after a large batch freed its activations (the cache
    is reused by the next one); check the numbers at the moment of an OOM.
    """

    code = "MEM003"
    name = "oom-fragmentation"
    category = Category.OOM_FRAGMENTATION
    requires = ("mem.reserved_bytes", "mem.allocated_bytes")
    optional = (
        "mem.alloc_retries", "mem.reserved_minus_allocated_bytes", "mem.requested_bytes", "mem.device_free_bytes",
        "mem.device_total_bytes", "mem.oom_count", "mem.oom_phase", "mem.largest_free_block_bytes",
        "mem.inactive_split_bytes", "mem.expandable_segments",
    )

    @dataclass(frozen=True)
    class Thresholds:
        share_total: float = 0.10  # a tenth of the device stranded in cached blocks is more than noise
        share_reserved: float = 0.20  # a fifth of PyTorch's own reservation unusable is fragmentation
        min_bytes: float = 256 * MIB  # below this the stranded memory could not hold a typical block anyway
        min_retries: float = 10  # each retry flushes the whole cache; a few at start-up are normal
        external_share: float = 0.25  # a quarter of the device held elsewhere (MEM004's bar) …
        external_multiple: float = 2.0  # … and twice the stranded gap: memory held elsewhere is the larger cause
        beside_external: float = 0.5  # the gap's impact then: in the differential, behind MEM004

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        m = read_mem(ev)
        expandable = ev.get("mem.expandable_segments")
        if isinstance(expandable, Evidence) and expandable.value is True:
            return None  # expandable segments map more pages instead of splitting blocks: not fragmentation
        retries = ev.value("mem.alloc_retries")
        split = ev.value("mem.inactive_split_bytes")
        largest = ev.value("mem.largest_free_block_bytes")
        gap = is_fragmented(m, t.share_total, t.share_reserved, t.min_bytes) and not m.capped
        thrashing = retries is not None and retries >= t.min_retries
        # the free memory was there but in pieces smaller than the failed request
        pieces = (m.oom and m.requested is not None and largest is not None and largest < m.requested
                  <= (m.unallocated or 0.0) + (m.free or 0.0))
        split_heavy = (split is not None and split >= t.min_bytes and m.reserved is not None and m.reserved > 0
                       and split >= t.share_reserved * m.reserved)
        # without an OOM, reserved − allocated or split blocks are a state (MEM011's note), not a failure:
        # only the allocator's retries (cudaMalloc failed, cache flushed) say fragmentation costs something
        fragmented = (gap or pieces or split_heavy) if m.oom else False
        if not (fragmented or thrashing):
            return None
        u = m.unallocated or 0.0
        parts = []
        if m.reserved:
            parts.append(f"PyTorch reserved {size(m.reserved)} but had only {size(m.allocated or 0.0)} allocated: "
                         f"{size(u)} ({pct(u / m.reserved)} of the reservation) sat in cached blocks it could not use.")
        if pieces and m.requested is not None and largest is not None:
            parts.append(f"The largest free block was {size(largest)}, smaller than the {size(m.requested)} asked for, "
                         "although that much was free in total.")
        elif m.requested is not None and gap:
            parts.append(f"The failed request ({size(m.requested)}) would have fit in that gap"
                         + (f" plus the {size(m.free)} free" if m.free else "") + ".")
        if split_heavy and split is not None and m.oom:
            parts.append(f"{size(split)} sat in split blocks that no request of another size can reuse.")
        if thrashing:
            parts.append(f"The allocator retried cudaMalloc {retries:.0f} times after flushing its cache.")
        if not m.oom:
            parts.append("No out-of-memory error was seen yet.")
        impact = 0.9 if m.oom else min(0.9, max(m.share(u) or 0.0, 0.3))
        # memory held outside this process, a large share of the device and several times the stranded gap, is what
        # the request lacked (MEM004): the gap only decided how close to the edge it failed (a 0.8 GiB gap beside
        # 37 GiB held elsewhere on a 40 GiB card, DenseCLIP#52; four processes on one card, trl#4237)
        share, _ = m.external_share()
        held, exact = m.external()
        if held is not None and not exact and not m.profiled():
            held = max(0.0, held - CONTEXT_BYTES)  # the legacy reading counts this process' own CUDA context
        if m.oom and gap and share is not None and held is not None and share >= t.external_share \
                and held >= t.external_multiple * u:
            impact = t.beside_external
            parts.append(f"{size(held)} ({pct(share)} of the device) was held outside this process' allocator, "
                         f"{held / u:.0f}× the stranded gap: that is the larger cause.")
        why = f"unusable |{bar(u / m.reserved)}| {pct(u / m.reserved)} of reserved" if m.reserved else ""
        return self.finding(
            severity=Severity.CRITICAL if m.oom else Severity.MAJOR,
            confidence=Confidence.MEASURED,
            title="Allocator fragmentation",
            message=" ".join(parts),
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=why,
            fixes=[
                Fix(
                    "Let the allocator grow segments instead of splitting them",
                    (advice.expandable_segments(),
                     "On PyTorch before 2.1: PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:512"),
                    Risk.SAFE,
                ),
                Fix(
                    "Make block sizes vary less and keep headroom",
                    ("Cap --max-model-len / pad inputs to a few bucketed lengths so allocation sizes repeat",
                     "Lower --gpu-memory-utilization a little (e.g. 0.9 → 0.85) to leave unreserved headroom"),
                    Risk.NEEDS_VALIDATION,
                ),
                Fix("Restart before it fails",
                    ("If fragmentation grows with uptime, restart workers on a schedule or after N requests "
                     "until the cause is fixed",), Risk.SAFE),
            ],
        )


class OomExternal(Rule):
    """Memory on the device is held by another process or a leaked context.

    What it detects: at the moment of the OOM this process held little of the device while it was
    full: the message lists other processes holding memory, or device use minus this process' use
    (or, in the legacy message, minus PyTorch's reservation) is a large share of the device; vLLM's
    start-up check that free memory is below ``gpu_memory_utilization``; SGLang's start-up check that
    one GPU of the tensor-parallel group has under 90 % of this rank's free memory ("The memory
    capacity is unbalanced").

    Why it matters: nothing in this service's configuration will fix it; another service, a
    zombie from a previous run, a notebook, or extra CUDA contexts of this service's own workers on
    the same GPU take the memory.

    How it decides: ``mem.other_processes_bytes`` (or total − free − this process' use) is at least
    ``external_share`` of the device; from the legacy message, total − free − reserved less one CUDA
    context (``CONTEXT_BYTES``, 1 GiB: it includes this process' own, a size whatever the device's) is
    at least ``rough_share``. With no
    allocator numbers (vLLM 0.6's "No available memory for the cache blocks"), its memory profiling
    line: the device's use once the weights were loaded (``initial_memory_usage``) less the weights
    (measured, else estimated) and a CUDA context, or else the use beyond this process' tensors
    (``non_torch_memory``, single-GPU only: NCCL's buffers count there) less a context, the smaller
    of the two when both are there (``non_torch_memory`` bounds what others hold: a weights size
    from the wrong load, a speculative-decoding draft logged last, cannot inflate it), against
    ``rough_share``. At vLLM's start-up check: what was in use before the instance allocated anything is what it
    lacked whenever gpu_memory_utilization asked for no more than the device less a CUDA context (the shortfall,
    asked less free, is then at most that use less a context); named when that use is at least ``startup_share``
    of the device, whatever its share otherwise. SGLang's balance check is
    its own statement that memory is held elsewhere before anything loaded: a finding of heuristic
    confidence (GPUs of different sizes in one group fail it too), with the gap between the two free
    figures when the message gives them.

    Evidence: mem.oom_count and one of mem.other_processes_bytes or mem.process_used_bytes with
    mem.device_total_bytes, or mem.reserved_bytes with mem.device_total_bytes and
    mem.device_free_bytes, or mem.profile_device_used_bytes (with a weights size) or
    mem.profile_non_torch_bytes with mem.device_total_bytes; optionally mem.device_free_bytes,
    mem.allocated_bytes, gpu.processes.

    Fix: find and stop the holder (``nvidia-smi --query-compute-apps=pid,process_name,used_memory
    --format=csv``), kill zombies, pin each worker to its own GPU (``CUDA_VISIBLE_DEVICES``), set
    ``torch.cuda.set_device`` before any CUDA call so workers do not open contexts on GPU 0.

    Not when the weights per device (measured, or estimated from the model's name with its dtype stated)
    exceed the whole device: then no other tenant gone would make them fit, and MEM001 names the weights; nor
    when what is held elsewhere exceeds the device (readings of two devices: a host's memory, another GPU).

    False positives: a process whose own non-PyTorch memory (NCCL buffers, cuBLAS workspaces,
    another framework in the same process) is large; the message cannot tell them apart.
    """

    code = "MEM004"
    name = "oom-external"
    category = Category.OOM_EXTERNAL
    requires = ("mem.oom_count",)
    requires_any = (
        ("mem.other_processes_bytes",),
        ("mem.process_used_bytes", "mem.device_total_bytes", "mem.device_free_bytes"),
        ("mem.reserved_bytes", "mem.device_total_bytes", "mem.device_free_bytes"),
        ("mem.profile_device_used_bytes", "mem.device_total_bytes", "mem.weights_bytes"),
        ("mem.profile_device_used_bytes", "mem.device_total_bytes", "mem.weights_estimate_bytes"),
        ("mem.profile_non_torch_bytes", "mem.device_total_bytes"),
        ("mem.oom_reason",),
    )
    optional = (*_MEM_KEYS, "gpu.processes", "mem.profile_device_used_bytes", "mem.profile_non_torch_bytes",
                "mem.unattributed_process_bytes", "mem.tp_free_gap_bytes", "mem.startup_wanted_bytes")

    @dataclass(frozen=True)
    class Thresholds:
        external_share: float = 0.25  # a quarter of the device held elsewhere is what tipped it over
        rough_share: float = 0.25  # a reading that counts this process' own context, one context taken off
        free_multiple: float = 10.0  # CUDA reported ten times the failed request free: capacity was not short
        free_share: float = 0.1  # ... and a tenth of the device, while this process had reserved little
        startup_share: float = 0.05  # at vLLM's start-up check, others' memory that covers the shortfall and is
        # more than a desktop's or a monitor's context (a twentieth of the device) is what it lacked

    def _moved(self, ev: EvidenceSet, m: MemView, held: float) -> Finding:
        """The allocation failed while CUDA reported far more free than it asked for: not this process' use."""
        assert m.free is not None and m.requested is not None and m.total
        msg = (f"A request for {size(m.requested)} failed while CUDA reported {size(m.free)} of the {size(m.total)} "
               f"device free and this process' PyTorch held only {size(m.reserved or 0.0)}: the memory was not short "
               f"for this process. {size(held)} was in use outside PyTorch at the error; memory that another process "
               "takes between the reading and the allocation (or a device this process shares) is what fails it.")
        return self.finding(
            severity=Severity.MAJOR,
            confidence=Confidence.HEURISTIC,
            title="The allocation failed with the memory free: someone else takes it",
            message=msg,
            impact=0.6,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"free |{bar(m.free / m.total)}| {pct(m.free / m.total)} at the error",
            fixes=_moved_fixes(),
        )

    def _unbalanced(self, ev: EvidenceSet) -> Finding:
        """SGLang's tensor-parallel balance check: one GPU of the group had much less free than this rank."""
        gap = ev.get("mem.tp_free_gap_bytes")
        msg = ("SGLang's start-up check found one GPU of the tensor-parallel group with under 90 % of the free "
               "memory this rank has, before any weight loaded")
        msg += f" ({gap.detail}: {size(float(gap.value))} less)." if isinstance(gap, Evidence) else "."
        msg += (" Another process (a previous run's worker, another service) holding that GPU is the usual cause; "
                "GPUs of different sizes in one group fail the same check.")
        return self.finding(
            severity=Severity.CRITICAL,
            confidence=Confidence.HEURISTIC,
            title="Another process holds memory on a GPU of the group",
            message=msg,
            impact=0.8,
            evidence=present(ev, *self.requires, *self.optional),
            fixes=[
                Fix("Find and stop the holder, or use GPUs that are free", (
                    "nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv and nvidia-smi "
                    "--query-compute-apps=pid,process_name,used_memory --format=csv: the GPU with less free, and "
                    "what holds it",
                    "Kill stale workers from an earlier run (fuser -v /dev/nvidia*), or give the group GPUs with "
                    "the same free memory (CUDA_VISIBLE_DEVICES)",
                ), Risk.SAFE),
                Fix("Mixed GPU sizes on purpose: let SGLang size the cache by the smallest", (
                    "SGLang releases since April 2025 (sglang#5426) only warn with SGL_DISABLE_TP_MEMORY_INBALANCE_"
                    "CHECK=true (SGLANG_DISABLE_… in later ones; earlier releases always refuse): the group's KV "
                    "cache is then sized by the GPU with the least free memory",
                ), Risk.NEEDS_VALIDATION),
            ],
        )

    @staticmethod
    def _startup_short(ev: EvidenceSet, m: MemView, held: float, t: Thresholds) -> tuple[float, float] | None:
        """vLLM's start-up check: (what it asked for, how much it lacked) when what was in use before it allocated,
        less this process' own CUDA context, covers the shortfall (the others' memory is what it lacked, whatever
        its share of the device), else None."""
        reason = ev.get("mem.oom_reason")
        wanted = ev.value("mem.startup_wanted_bytes")
        if not (isinstance(reason, Evidence) and reason.value == STARTUP_CHECK_REASON) or wanted is None \
                or m.free is None or not m.total:
            return None
        short = wanted - m.free
        # what was in use before the instance allocated (total − free) exceeds the shortfall (wanted − free) by what
        # the device has beyond what it asked for: with a context's worth of room, freeing the others' memory would
        # have passed the check; they held a share worth naming (a desktop's context is not)
        if short <= 0 or held - CONTEXT_BYTES < short or held < t.startup_share * m.total:
            return None
        return wanted, short

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        m = read_mem(ev)
        if not m.oom or m.capped:  # a process that ran into its own cap was not failed by others' memory
            return None
        reason = ev.get("mem.oom_reason")
        if isinstance(reason, Evidence) and reason.value == BALANCE_CHECK_REASON:
            return self._unbalanced(ev)
        held, exact = m.external()
        if held is None:
            return None
        if m.total and held > EXTERNAL_PLAUSIBLE * m.total:
            return None  # more than the device holds: two readings of different devices (a host's memory, another GPU)
        if _weights_known_beyond(ev, m):
            return None  # the weights alone exceed the whole device: no tenant gone would make them fit (MEM001)
        if not exact and "mem.unattributed_process_bytes" in ev:
            return None  # the message listed the holder, and it may be this process: which, it does not say
        if (m.free is not None and m.requested is not None and m.total and m.requested > 0
                and m.free >= t.free_multiple * m.requested and m.free >= t.free_share * m.total
                and (m.reserved is None or m.reserved <= t.free_share * m.total)):
            return self._moved(ev, m, held)
        if not m.total:
            if not (m.others and m.used is not None and m.others > m.used):
                return None
            share = 0.0
        else:
            share = held / m.total
            beyond, _ = m.external_share()
            short = self._startup_short(ev, m, held, t)
            if short is None and (beyond is None or beyond < (t.external_share if exact else t.rough_share)):
                return None
        if m.total and short is not None:
            parts = [f"vLLM's start-up check asked for {size(short[0])} of the {size(m.total)} device "
                     f"(gpu_memory_utilization) and found {size(m.free or 0.0)} free: {size(short[1])} short, while "
                     f"{size(held)} ({pct(share)}) was in use before this instance allocated anything (about "
                     f"{size(CONTEXT_BYTES)} of it this process' own CUDA context): what others hold is what it lacks"]
        else:
            parts = [f"{size(held)}"
                     + (f" ({pct(share)} of the {size(m.total)} device)" if m.total else "")
                     + (" was held by other processes" if exact else " was in use outside PyTorch's reservation")
                     + " when the out-of-memory error was raised"]
        if m.profiled() and m.total:
            said = []
            if m.profile_used is not None and m.weights_per_device is not None:
                said.append(f"the device held {size(m.profile_used)} once this instance's weights "
                            f"({size(m.weights_per_device)}) were loaded (initial_memory_usage)")
            if m.profile_non_torch is not None:
                said.append(f"{size(m.profile_non_torch)}{' of it' if said else ''} lay outside this process' tensors "
                            "(non_torch_memory)")
            parts = [f"{size(held)} ({pct(share)} of the {size(m.total)} device) was in use outside this instance "
                     f"when vLLM profiled its memory: {'; '.join(said)}, less a CUDA context of about 1 GiB. vLLM 0.6 "
                     "counts other processes' memory against this instance's gpu_memory_utilization"]
        elif m.used is not None:
            parts[0] += f", while this process used {size(m.used)}"
        elif m.reserved is not None:
            parts[0] += f", while this process' PyTorch reservation was {size(m.reserved)}"
        parts[0] += "."
        others_ev = ev.get("mem.other_processes_bytes")
        if isinstance(others_ev, Evidence) and others_ev.detail and short is None:
            parts.append(f"({others_ev.detail}.)")
        return self.finding(
            severity=Severity.CRITICAL,
            confidence=Confidence.MEASURED if exact else Confidence.HEURISTIC,
            title="Another process holds the device's memory",
            message=" ".join(parts),
            impact=0.85,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"elsewhere |{bar(share)}| {pct(share)}" if m.total else "",
            fixes=[
                Fix(
                    "Find and stop the holder",
                    ("nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv",
                     "Kill stale or zombie processes from earlier runs (fuser -v /dev/nvidia*)",
                     "Give each service its own GPU (CUDA_VISIBLE_DEVICES) or a MIG slice"),
                    Risk.SAFE,
                ),
                Fix(
                    "Stop this service's workers from opening extra contexts",
                    ("Call torch.cuda.set_device(local_rank) before any CUDA work in each worker",
                     "Do not touch CUDA in the parent before forking workers"),
                    Risk.SAFE,
                ),
            ],
        )


def _moved_fixes() -> list[Fix]:
    return [
        Fix("Find what takes the memory while this process runs", (
            "Watch the device during the failing step: nvidia-smi --query-compute-apps=pid,process_name,used_memory "
            "--format=csv -l 1 (another service, a notebook, a second worker starting)",
            "Give the service its own GPU (CUDA_VISIBLE_DEVICES) or a MIG slice",
            "On Windows/WSL, other applications (browsers, games, the desktop compositor) share the GPU: close them "
            "or use the other GPU for the display",
        ), Risk.SAFE),
    ]


class OomFragmentationReported(Rule):
    """The incident report itself blames allocator fragmentation for the OOM (no numbers to check).

    What it detects: an out-of-memory error reported together with the author's own analysis that
    fragmentation caused it ("due to memory fragmentation", "fragmentation … leading to OOMs",
    "resolved by setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"), when no allocator
    numbers were pasted to check it against.

    Why it matters: when the only evidence is the report's analysis, the tool should still point at
    the fix it implies and say how to confirm it, rather than stay silent.

    How it decides: ``mem.fragmentation_reported`` (causal statements about fragmentation, never
    PyTorch's standard hint, vetoed by any "not fragmentation" / "did not help") is at least
    ``min_statements`` and an OOM was reported, and the allocator's reserved/allocated numbers are
    absent (with numbers, MEM003 decides). Confidence is always thin.

    Evidence: mem.fragmentation_reported, mem.oom_count; optionally mem.oom_phase, mem.reserved_bytes,
    mem.allocated_bytes.

    Fix: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (``PYTORCH_NPU_ALLOC_CONF`` on Ascend);
    confirm with ``torch.cuda.memory_stats()`` (reserved vs allocated, ``num_alloc_retries``) or a
    memory snapshot (``torch.cuda.memory._record_memory_history``).

    False positives: a report whose author guessed wrong; the confirmation step is part of the fix.
    """

    code = "MEM005"
    name = "oom-fragmentation-reported"
    category = Category.OOM_FRAGMENTATION
    requires = ("mem.fragmentation_reported", "mem.oom_count")
    optional = ("mem.oom_phase", "mem.reserved_bytes", "mem.allocated_bytes")

    @dataclass(frozen=True)
    class Thresholds:
        min_statements: float = 1  # one causal statement by the reporter; the thin confidence says how little that is

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        n = ev.value("mem.fragmentation_reported", 0.0) or 0.0
        if n < t.min_statements or (ev.value("mem.oom_count", 0.0) or 0.0) <= 0:
            return None
        if ev.value("mem.reserved_bytes") is not None and ev.value("mem.allocated_bytes") is not None:
            return None  # the allocator's numbers are there: MEM003 judges them
        got = ev.get("mem.fragmentation_reported")
        said = got.detail.removeprefix("the text itself blames fragmentation: ") if isinstance(got, Evidence) else ""
        return self.finding(
            severity=Severity.MAJOR,
            confidence=Confidence.THIN,
            title="Fragmentation, as the report says",
            message=(f"An out-of-memory error is reported and the report attributes it to allocator fragmentation "
                     f"({n:.0f} statement(s), e.g. {said}); no allocator numbers were given to confirm it."),
            impact=0.5,
            evidence=present(ev, *self.requires, *self.optional),
            fixes=[
                Fix(
                    "Let the allocator grow segments instead of splitting them",
                    (advice.expandable_segments(),),
                    Risk.SAFE,
                ),
                Fix(
                    "Confirm with numbers",
                    ("Log torch.cuda.memory_stats(): reserved_bytes.all.current vs allocated_bytes.all.current and "
                     "num_alloc_retries; a large, growing gap is fragmentation",
                     "Record a snapshot: torch.cuda.memory._record_memory_history(), then _dump_snapshot() and view "
                     "it at pytorch.org/memory_viz"),
                    Risk.SAFE,
                ),
            ],
        )


class MemoryHeadroom(Rule):
    """Allocator state without an out-of-memory error: what it holds, its peak, its cache, its splits.

    What it detects: a CUDA memory snapshot (or the probe's allocator statistics) in which no
    out-of-memory error was recorded and the allocator never had to retry ``cudaMalloc``.

    Why it matters: reserved ≫ allocated in such a recording is read as a leak or as fragmentation,
    and people restart, call ``empty_cache()`` in the loop, or switch allocators for nothing. What the
    recording can tell is how high the live memory went, how much the caching allocator keeps for
    reuse (nvidia-smi counts it as used), how much sits in split blocks (the fragmentation that would
    matter near the device's limit), and whether expandable segments were on. It names no
    bottleneck, so it is a note (severity info, no category), and the verdict can be *healthy* on it.

    How it decides: ``mem.reserved_bytes`` and ``mem.allocated_bytes`` are known, ``mem.oom_count``
    is absent or zero and ``mem.alloc_retries`` is below MEM003's ``min_retries``; split blocks at
    least MEM003's ``share_reserved`` of the reservation are called out (MEM003's thresholds are read,
    so one override moves both).

    Evidence: mem.reserved_bytes, mem.allocated_bytes; optionally mem.peak_allocated_bytes,
    mem.peak_reserved_bytes, mem.free_segments_bytes, mem.inactive_split_bytes,
    mem.largest_free_block_bytes, mem.private_pools_bytes, mem.expandable_segments,
    mem.trace_events, mem.trace_seconds, mem.weights_bytes, mem.activations_bytes,
    mem.snapshot_layout, mem.oom_count, mem.alloc_retries, mem.device_total_bytes.

    Fix: nothing is wrong in the recording. For the headroom, compare the peak reserved with the
    GPU's memory (nvidia-smi); to learn what an OOM would be, dump a snapshot at the OOM.

    False positives: a snapshot taken before the heaviest request ran shows a lower peak than the
    service reaches; the peak is only over the recorded events.
    """

    code = "MEM011"
    name = "memory-headroom"
    category = None
    requires = ("mem.reserved_bytes", "mem.allocated_bytes")
    optional = (
        "mem.peak_allocated_bytes", "mem.peak_reserved_bytes", "mem.free_segments_bytes", "mem.inactive_split_bytes",
        "mem.largest_free_block_bytes", "mem.private_pools_bytes", "mem.expandable_segments", "mem.trace_events",
        "mem.trace_seconds", "mem.weights_bytes", "mem.activations_bytes", "mem.snapshot_layout", "mem.oom_count",
        "mem.alloc_retries", "mem.device_total_bytes",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_events: float = 10  # fewer recorded events is no history: a 2.0-era snapshot keeps one marker
        full: float = 0.98  # live memory this close to the reservation: nothing cached, nothing stranded

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        m = read_mem(ev)
        frag = self.thresholds_of(OomFragmentation)  # MEM003's bars: its retries and split share
        if m.oom or (ev.value("mem.alloc_retries", 0.0) or 0.0) >= frag.min_retries:
            return None
        reserved, allocated = m.reserved or 0.0, m.allocated or 0.0
        if reserved <= 0:
            return None
        events, seconds = ev.value("mem.trace_events"), ev.value("mem.trace_seconds")
        peak, peak_res = ev.value("mem.peak_allocated_bytes"), ev.value("mem.peak_reserved_bytes")
        cache, split = ev.value("mem.free_segments_bytes"), ev.value("mem.inactive_split_bytes")
        if events and events >= t.min_events:
            parts = [f"No out-of-memory error in {events:,.0f} recorded allocator events"
                     + (f" over {seconds:,.1f} s" if seconds else "") + "."]
        else:
            parts = ["No out-of-memory error was recorded (memory history was off or kept almost no events, so the "
                     "peak before this moment is unknown)."]
        if peak is not None:
            parts.append(f"Live memory peaked at {size(peak)} (now {size(allocated)}); segments at "
                         f"{size(peak_res or reserved)}.")
        else:
            parts.append(f"{size(allocated)} live in {size(reserved)} reserved.")
        if m.total:
            top = max(peak_res or 0.0, reserved)
            parts.append(f"That is {pct(top / m.total)} of the {size(m.total)} device: "
                         f"{size(m.total - top)} of headroom.")
        if cache is not None and cache > 0:
            parts.append(f"{size(cache)} sits in wholly free segments: the caching allocator keeps it for the next "
                         "batch (nvidia-smi counts it as used; torch.cuda.empty_cache() would return it).")
        elif reserved - allocated > 0 and cache is None:
            parts.append(f"{size(reserved - allocated)} reserved is not live: cached for reuse.")
        if split is not None and split >= frag.share_reserved * reserved:
            parts.append(f"{size(split)} ({pct(split / reserved)} of the reservation) is in split blocks inside live "
                         "segments: fragmentation that would matter near the device's limit.")
        if allocated >= t.full * reserved:
            parts.append("Nothing reserved is free: if this was taken at an out-of-memory error, the live memory "
                         "itself (not fragmentation, not the cache) filled what PyTorch could get.")
        weights, acts = ev.value("mem.weights_bytes"), ev.value("mem.activations_bytes")
        if weights and allocated and weights >= 0.5 * allocated:
            parts.append(f"By allocation stack, {size(weights)} of the live memory is weights.")
        elif acts and allocated and acts >= 0.5 * allocated:
            parts.append(f"By allocation stack, {size(acts)} of the live memory is activations.")
        expandable = ev.get("mem.expandable_segments")
        if isinstance(expandable, Evidence) and expandable.value is True:
            parts.append("Expandable segments are on: free memory is not split into stranded blocks.")
        if m.total is None:
            parts.append("The recording does not say how large the device is: compare the peak with nvidia-smi's "
                         "total for the headroom.")
        return self.finding(
            severity=Severity.INFO,
            confidence=Confidence.MEASURED,
            title="Allocator state: no out-of-memory error",
            message=" ".join(parts),
            impact=0.0,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"live |{bar(allocated / reserved)}| {pct(allocated / reserved)} of reserved",
            fixes=[
                Fix("Nothing to fix in this recording", (
                    "For the headroom: compare the peak reserved with the GPU's memory (nvidia-smi --query-gpu="
                    "memory.total --format=csv)",
                    "To see an out-of-memory error's cause: torch.cuda.memory._record_memory_history("
                    "max_entries=100000) at start-up and torch.cuda.memory._dump_snapshot('oom.pickle') when it "
                    "happens, then `diagnose analyze oom.pickle`",
                ), Risk.SAFE),
            ],
        )


class AllocatorChurn(Rule):
    """The allocator hands segments back to CUDA and asks for them again, over and over.

    What it detects: in a memory snapshot's recorded events, many segments freed and allocated
    again (``segment_free`` followed by ``segment_alloc``), often in bursts: ``torch.cuda.empty_cache()``
    called in the request loop, or a cache flushed on every OOM retry.

    Why it matters: ``cudaFree`` synchronises the device and ``cudaMalloc`` is a slow driver call; a
    loop that empties the cache and then re-allocates the same memory stalls the host between GPU
    work on every iteration, and nothing is saved: the next batch needs the memory again.

    How it decides: the segments freed and allocated again (min of ``mem.segment_allocs`` and
    ``mem.segment_frees``) number at least ``min_churn``, at a rate of at least ``min_rate`` per
    second when the recording's span (``mem.trace_seconds``) is known; or there were at least
    ``min_bursts`` bursts of segment frees (``mem.segment_free_bursts``). Not after an OOM (the OOM
    rules own that recording). Category ``launch_overhead``: the cost is synchronous runtime calls on
    the host's launch path.

    Evidence: mem.segment_allocs, mem.segment_frees; optionally mem.segment_free_bursts,
    mem.trace_seconds, mem.trace_events, mem.oom_count, mem.expandable_segments.

    Fix: remove ``torch.cuda.empty_cache()`` from the loop (call it only before handing memory to
    another process); keep the cache; with expandable segments, pages are mapped instead of segments
    allocated.

    False positives: start-up, where segments are allocated once and a few are freed while the model
    loads; the thresholds ask for repetition.
    """

    code = "MEM012"
    name = "allocator-churn"
    category = Category.LAUNCH_OVERHEAD
    requires = ("mem.segment_allocs", "mem.segment_frees")
    optional = ("mem.segment_free_bursts", "mem.trace_seconds", "mem.trace_events", "mem.oom_count",
                "mem.expandable_segments")

    @dataclass(frozen=True)
    class Thresholds:
        min_churn: float = 20  # segments returned and re-requested twenty times is a pattern, not start-up
        min_rate: float = 1.0  # at least once a second: a cost on the serving path
        min_bursts: float = 3  # three or more empty_cache()-like bursts in one recording

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        if (ev.value("mem.oom_count", 0.0) or 0.0) > 0:
            return None
        allocs, frees = ev.value("mem.segment_allocs") or 0.0, ev.value("mem.segment_frees") or 0.0
        churn = min(allocs, frees)
        bursts = ev.value("mem.segment_free_bursts") or 0.0
        seconds = ev.value("mem.trace_seconds")
        rate = churn / seconds if seconds else None
        repeated = churn >= t.min_churn and (rate is None or rate >= t.min_rate)
        if not (repeated or (bursts >= t.min_bursts and churn > 0)):
            return None
        msg = (f"The allocator freed {frees:,.0f} segments back to CUDA and requested {allocs:,.0f}"
               + (f" over {seconds:,.1f} s ({rate:,.1f} a second)" if seconds and rate is not None else "")
               + (f", in {bursts:,.0f} bursts of frees: torch.cuda.empty_cache() (or a flush on a failed allocation) "
                  "in the loop" if bursts else "")
               + ". Each cudaFree synchronises the device and each cudaMalloc is a driver call: the host stalls "
               "between GPU work to give back memory the next step asks for again.")
        impact = min(0.6, 0.2 + 0.05 * bursts + (0.2 if rate is not None and rate >= 10 * t.min_rate else 0.0))
        return self.finding(
            severity=Severity.MINOR if impact < 0.4 else Severity.MAJOR,
            confidence=Confidence.MEASURED,
            title="Allocator churn: segments freed and re-allocated",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"re-allocated |{bar(min(1.0, churn / max(allocs, 1.0)))}| {churn:,.0f} of {allocs:,.0f} segments",
            fixes=[
                Fix("Keep the cache", (
                    "Remove torch.cuda.empty_cache() from the request or step loop; call it only before handing the "
                    "memory to another process",
                    advice.expandable_segments() + ": pages are mapped and unmapped instead of whole segments",
                ), Risk.SAFE),
            ],
        )


class ReservedGrowsAllocatedFlat(Rule):
    """The allocator's reserve grows over the run while the tensors it holds do not.

    What it detects: readings the program printed over its run (``allocated=16 MiB reserved=12564 MiB``, a line each;
    ``diagnose.collectors.memtrace``) where reserved memory rose by at least ``min_growth`` and to ``min_multiple`` ×
    its second reading, while allocated memory rose by at most ``max_allocated_share`` of that: each new block
    size (a benchmark's next shape, a request's new length) took a fresh segment and the cached ones could not
    serve it.

    Why it matters: the reserve is this process' memory on the device; grown past what the tensors need, it runs
    the device out (triton-lang/triton#11661: 16 MiB allocated, 12.3 GiB reserved, 0 free on a 6 GiB card, then
    an OOM the largest shape alone never hit).

    How it decides: the growths above, from the second reading (the first may come before the first step, whose peak
    the cache then keeps: warm-up), with the reserve rising in at least ``min_rise_share`` of the readings after it;
    impact ``impact_oom`` with an out-of-memory error in the evidence (the reserve is why it failed), else ``impact``
    (it will fail, or starve a neighbour). Measured where it ran the device out (an OOM, or at most ``full_free``
    left free at the last reading), else correlated.

    Evidence: mem.readings_count, mem.readings_rises, mem.readings_reserved_growth_bytes,
    mem.readings_allocated_growth_bytes,
    mem.readings_reserved_first_bytes, mem.readings_reserved_last_bytes; optionally mem.readings_allocated_last_bytes,
    mem.readings_free_last_bytes, mem.oom_count.

    Fix: ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (segments grow in place instead of new ones per size);
    fewer distinct sizes (pad to buckets); ``torch.cuda.empty_cache()`` between phases that use different sizes (not
    in the hot loop: MEM012).

    False positives: a program whose readings are of several devices or processes mixed in one paste.
    """

    code = "MEM015"
    name = "reserve-grows-allocated-flat"
    category = Category.OOM_FRAGMENTATION
    requires = ("mem.readings_count", "mem.readings_rises", "mem.readings_reserved_growth_bytes",
                "mem.readings_allocated_growth_bytes", "mem.readings_reserved_first_bytes",
                "mem.readings_reserved_last_bytes")
    optional = ("mem.readings_allocated_last_bytes", "mem.readings_free_last_bytes", "mem.oom_count")

    @dataclass(frozen=True)
    class Thresholds:
        min_growth: float = float(GIB)  # a gibibyte of reserve gained: felt on any card
        min_multiple: float = 3.0  # ... and three times where it started: growth, not the cache warming up
        max_allocated_share: float = 0.1  # the tensors grew by a tenth of that at most: the reserve, not the work
        impact: float = 0.6  # growth that has not failed yet: it will, or starves another process
        impact_oom: float = 0.85  # with an OOM in the evidence: the reserve is why it failed
        min_rise_share: float = 0.5  # the reserve rose in half the readings or more: it keeps growing, not one step
        full_free: float = 256 * MIB  # a quarter GiB or less free at the last reading: the device ran out

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        grew = float(ev.value("mem.readings_reserved_growth_bytes") or 0.0)
        tensors = float(ev.value("mem.readings_allocated_growth_bytes") or 0.0)
        first = float(ev.value("mem.readings_reserved_first_bytes") or 0.0)
        last = float(ev.value("mem.readings_reserved_last_bytes") or 0.0)
        n = ev.value("mem.readings_count") or 0.0
        rises = ev.value("mem.readings_rises") or 0.0
        if grew < t.min_growth or last < t.min_multiple * max(first, 1.0) or tensors > t.max_allocated_share * grew \
                or rises < t.min_rise_share * max(n - 2, 1):
            return None
        allocated = ev.value("mem.readings_allocated_last_bytes")
        free = ev.value("mem.readings_free_last_bytes")
        oom = (ev.value("mem.oom_count", 0.0) or 0.0) > 0
        full = oom or (isinstance(free, int | float) and free <= t.full_free)
        msg = (f"Over {n:,.0f} readings the program printed, reserved memory grew from {size(first)} (its second "
               f"reading) to {size(last)}, rising in {rises:,.0f} of them, "
               f"while allocated memory grew by {size(tensors)}"
               + (f" (last {size(float(allocated))})" if isinstance(allocated, int | float) else "")
               + (f", {size(float(free))} left free" if isinstance(free, int | float) else "")
               + ": the allocator took new segments for new block sizes and kept the old ones, which could not serve "
               "them." + (" That reserve is what the out-of-memory error ran into." if oom else ""))
        return self.finding(
            severity=Severity.CRITICAL if oom else Severity.MAJOR,
            confidence=Confidence.MEASURED if full else Confidence.CORRELATED,
            title="The allocator's reserve grows while the tensors do not",
            message=msg,
            impact=t.impact_oom if oom else t.impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"reserved  |{bar(min(1.0, tensors / grew if grew else 0.0))}| tensors' share of the growth",
            fixes=[
                Fix("Let segments grow instead of multiplying", (
                    advice.expandable_segments(),
                    "Pad inputs to a few bucket sizes so blocks of the same sizes are reused",
                    "torch.cuda.empty_cache() between phases that use different sizes (never in the hot loop)",
                ), Risk.SAFE),
            ],
        )


class HostOomKill(Rule):
    """The kernel's OOM killer killed the service: host memory (a container's limit, or the host's) ran out.

    What it detects: the kernel's own report of an OOM kill — ``Killed process PID (name)
    … anon-rss:NkB`` in ``dmesg`` or the journal, with ``oom-kill:constraint=CONSTRAINT_MEMCG`` and
    ``memory: usage …, limit …`` when a memory cgroup hit its limit — or a container that ended
    ``OOMKilled``, or (attach) the target's memory cgroup counting OOM kills during the window
    (``memory.events``' ``oom_kill``, v1 ``memory.oom_control``).

    Why it matters: there is no Python error and no CUDA message: the process is SIGKILLed (exit
    code 137), its log just stops, and a supervisor restarts it into the same limit. GPU memory
    settings do not help; what ran out is host RAM: the process's resident memory (weights staged
    in RAM while loading, a CPU KV cache or swap space, a prompt cache, per-worker copies) plus its
    page cache against the container's limit.

    Also the host's allocator refusing an allocation (PyTorch's ``DefaultCPUAllocator: not enough memory: you tried to
    allocate N bytes``, TensorFlow's ``… device:CPU:0 by allocator cpu``; ``host.alloc_failures``,
    ``host.alloc_failed_bytes``): host RAM ran out and the process raised instead of being killed.

    How it decides: ``host.oom_kills`` or ``cgroup.oom_kills`` ≥ 1, or ``host.alloc_failures``. The message names
    the process,
    what it held (``host.oom_killed_anon_rss_bytes``) and the limit (``host.memory_limit_bytes`` /
    ``cgroup.memory_limit_bytes``; ``host.oom_scope``: a cgroup's limit or the whole host).
    Category ``oom_peak``: the memory the service reached, not a device's capacity, ran out.

    Evidence: host.oom_kills, cgroup.oom_kills or host.alloc_failures; optionally host.alloc_failed_bytes,
    host.oom_scope,
    host.oom_killed_process, host.oom_killed_anon_rss_bytes, host.memory_limit_bytes, host.memory_usage_bytes,
    cgroup.memory_limit_bytes, cgroup.memory_peak_bytes.

    Fix: raise the container's memory limit above the peak (Kubernetes ``resources.limits.memory``,
    ``docker run --memory``), or hold less in RAM: vLLM's CPU backend a smaller KV pool
    (``--kv-cache-memory-bytes`` / ``VLLM_CPU_KVCACHE_SPACE``); llama.cpp a
    bounded prompt cache (``--cache-ram``); fewer workers per pod; load checkpoints without
    materialising them twice (transformers ``low_cpu_mem_usage=True`` or a ``device_map``).

    False positives: a kill of another process on the same host (its name is in the message: check
    it is the service); a report pasted from an earlier incident.
    """

    code = "MEM013"
    name = "host-oom-kill"
    category = Category.OOM_PEAK
    requires = ()
    requires_any = (("host.oom_kills",), ("cgroup.oom_kills",), ("host.alloc_failures",))
    optional = ("host.oom_kills", "cgroup.oom_kills", "host.alloc_failures", "host.alloc_failed_bytes",
                "host.oom_scope", "host.oom_killed_process",
                "host.oom_killed_anon_rss_bytes", "host.memory_limit_bytes", "host.memory_usage_bytes",
                "cgroup.memory_limit_bytes", "cgroup.memory_peak_bytes")

    @dataclass(frozen=True)
    class Thresholds:
        min_kills: float = 1  # one kill is the incident: the kernel killed the service

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        kills = max(ev.value("host.oom_kills", 0.0) or 0.0, ev.value("cgroup.oom_kills", 0.0) or 0.0)
        if kills < t.min_kills:
            if (ev.value("host.alloc_failures", 0.0) or 0.0) < 1:
                return None
            return self._refused(ev, ev.value("host.alloc_failed_bytes"))
        who = ev.get("host.oom_killed_process")
        rss = ev.value("host.oom_killed_anon_rss_bytes")
        limit = ev.value("host.memory_limit_bytes") or ev.value("cgroup.memory_limit_bytes")
        peak = ev.value("cgroup.memory_peak_bytes") or ev.value("host.memory_usage_bytes")
        scope = ev.get("host.oom_scope")
        in_group = (ev.value("cgroup.oom_kills", 0.0) or 0.0) > 0
        memcg = (isinstance(scope, Evidence) and scope.value == "memcg") or in_group
        name = f"{who.value} ({who.detail})" if isinstance(who, Evidence) else "the service's process"
        where = ("its memory cgroup (the container) reached its limit" + (f" of {size(limit)}" if limit else "")
                 if memcg or limit else
                 "the host ran out of memory" if isinstance(scope, Evidence) and scope.value == "global"
                 else "memory ran out")
        msg = (f"The kernel's OOM killer killed {name}" + (f" holding {size(rss)} of anonymous memory" if rss else "")
               + f" ({kills:.0f} kill{'s' if kills != 1 else ''}): {where}"
               + (f", {size(peak)} in use" if peak else "")
               + ". No Python or CUDA error is raised: the process is SIGKILLed (exit code 137) and its log just "
               "stops. Host RAM ran out, not GPU memory: what the process holds in RAM (weights staged while loading, "
               "a CPU KV cache or swap space, caches, per-worker copies) plus page cache, against the limit.")
        why = f"killed |{bar(1.0)}| {kills:.0f}"
        if rss and limit:
            why = f"held   |{bar(min(1.0, rss / limit))}| {size(rss)} of {size(limit)}"
        return self.finding(
            severity=Severity.CRITICAL,
            confidence=Confidence.MEASURED,
            title="Killed by the kernel's OOM killer: host memory ran out",
            message=msg,
            impact=0.9,
            evidence=present(ev, *self.optional),
            why=why,
            fixes=[
                Fix("Give the container more memory, or hold less in RAM", (
                    "Raise the memory limit above the peak: Kubernetes resources.limits.memory, docker run --memory",
                    "vLLM's CPU backend: a smaller KV pool (--kv-cache-memory-bytes, or VLLM_CPU_KVCACHE_SPACE in GiB)",
                    "llama.cpp: bound the prompt cache (--cache-ram N MiB; LLAMA_ARG_CACHE_RAM)",
                    "Fewer workers or model copies per container; load checkpoints without a second copy in RAM "
                    "(transformers: low_cpu_mem_usage=True or device_map=...)",
                ), Risk.NEEDS_VALIDATION),
            ],
        )


    def _refused(self, ev: EvidenceSet, failed: float | None) -> Finding:
        """The host's allocator was refused the memory: the process raises instead of being killed."""
        return self.finding(
            severity=Severity.CRITICAL,
            confidence=Confidence.MEASURED,
            title="Host memory ran out: the host's allocator was refused",
            message=("The host's allocator (PyTorch's DefaultCPUAllocator, TensorFlow's cpu allocator) could not get "
                     + (f"{size(failed)}" if failed else "the memory") + " from the system: host RAM ran out (the "
                     "machine's, a container's limit, or on Windows the page file that backs it), not GPU memory. "
                     "What the process holds in RAM (weights staged while loading, tensors kept on the CPU, a "
                     "CPU-offloaded model or optimizer, batches of decoded inputs) plus this request did not fit."),
            impact=0.9,
            evidence=present(ev, *self.optional),
            why=f"refused |{bar(1.0)}| {size(failed)}" if failed else "",
            fixes=[
                Fix("Hold less in RAM, or give the process more", (
                    "Load checkpoints without a second copy in RAM (transformers: low_cpu_mem_usage=True or "
                    "device_map=...; safetensors instead of .bin)",
                    "Move the tensors that grow (outputs, caches, accumulated results) to the GPU or to disk, and "
                    "smaller batches",
                    "Raise the container's memory limit, or on Windows the page file's size",
                ), Risk.NEEDS_VALIDATION),
            ],
        )


class MetalWorkingSetExceeded(Rule):
    """llama.cpp allocated more on a Metal GPU than its recommended working set: macOS pages it instead of failing.

    What it detects: Metal's allocation lines give their running total against the GPU's recommended max working set
    (``(26062.74 / 8176.00)``, in MiB; with the warning "current allocated size is greater than the recommended max
    working set size"), ``llamacpp.metal_allocated_bytes`` above ``llamacpp.metal_working_set_bytes``.

    Why it matters: Metal does not refuse an allocation past the working set the way CUDA does; the pages beyond it
    are swapped, so every token waits for memory (a Mac's integrated or small discrete GPU runs a model many times
    its size at a crawl, and ``--mlock`` only keeps the host side resident) or a later buffer comes back nil.

    How it decides: allocated ≥ ``min_over`` × the working set, and the weights alone (the loader's Metal buffer,
    ``llamacpp.metal_model_bytes``) above the working set; the weights' share unknown, the total at least
    ``weights_over`` × the working set (the cache and compute buffers are a fraction of a model that size). Where the
    weights fit, what took it past (a KV cache, a second model or context loaded before) is not in the lines: no
    finding. Impact: the share of what was allocated that lies past the working set.

    Evidence: llamacpp.metal_allocated_bytes, llamacpp.metal_working_set_bytes; optionally llamacpp.metal_model_bytes.

    Fix: a smaller model or quantisation (Q4_K_M against Q8_0), a shorter context (-c), fewer layers on the GPU
    (-ngl) so the rest runs on the CPU without paging, or a Mac with more unified memory (the working set is about
    two thirds to three quarters of it on Apple silicon; ``sudo sysctl iogpu.wired_limit_mb`` raises it, knowingly).

    False positives: none from Metal's own figures; a machine whose working set was raised after the log was taken.
    """

    code = "MEM014"
    name = "metal-working-set-exceeded"
    category = Category.OOM_WEIGHTS
    requires = ("llamacpp.metal_allocated_bytes", "llamacpp.metal_working_set_bytes")
    optional = ("llamacpp.metal_model_bytes",)

    @dataclass(frozen=True)
    class Thresholds:
        min_over: float = 1.05  # 5 % past the working set: Metal's own warning, not rounding
        weights_over: float = 1.5  # half again past it with the weights' share unknown: the weights are most of it

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        allocated = float(ev.value("llamacpp.metal_allocated_bytes") or 0.0)
        ws = float(ev.value("llamacpp.metal_working_set_bytes") or 0.0)
        model = ev.value("llamacpp.metal_model_bytes")
        if ws <= 0 or allocated < t.min_over * ws:
            return None
        known = isinstance(model, int | float) and model > 0
        if (known and float(model or 0.0) <= ws) or (not known and allocated < t.weights_over * ws):
            return None
        over = 1.0 - ws / allocated
        what = (f"the model's weights alone ({size(float(model or 0.0))}) exceed it" if known else
                "a total this far past it is mostly the model's weights")
        msg = (f"Metal allocated {size(allocated)} on a GPU whose recommended working set is {size(ws)} "
               f"({allocated / ws:.1f}×): {what}. Past the working set macOS pages the GPU's memory instead of "
               "failing, so every token waits for it.")
        return self.finding(
            severity=Severity.CRITICAL if over >= 0.5 else Severity.MAJOR,
            confidence=Confidence.MEASURED if known else Confidence.CORRELATED,
            title="The model does not fit the Metal GPU's working set",
            message=msg,
            impact=over,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"working set |{bar(ws / allocated)}| {size(ws)}\nallocated   |{bar(1.0)}| {size(allocated)}",
            fixes=[
                Fix("Make it fit the working set", (
                    "A smaller model or quantisation (Q4_K_M rather than Q8_0); a shorter context (-c) for the KV "
                    "cache",
                    "Fewer layers on the GPU (-ngl N): those left run on the CPU, slower but without paging",
                ), Risk.NEEDS_VALIDATION),
                Fix("Give the GPU more memory", (
                    "A Mac with more unified memory; on Apple silicon `sudo sysctl iogpu.wired_limit_mb=N` raises the "
                    "working set (leave the OS a few GB)",
                ), Risk.NEEDS_VALIDATION),
            ],
        )


RULES: tuple[type[Rule], ...] = (OomWeights, OomRuntimePeak, OomFragmentation, OomExternal, OomFragmentationReported,
                                  MemoryHeadroom, AllocatorChurn, HostOomKill, MetalWorkingSetExceeded,
                                  ReservedGrowsAllocatedFlat)

