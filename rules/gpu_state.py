"""What a GPU's state over a recording says: idle from the first reading to the last, not usable at
all, or memory in use that no listed process holds.

These rules read the device-level keys every GPU source gives (``nvidia-smi`` in any form, NVML,
DCGM): ``gpu.util_*`` over the readings and ``gpu.memory_unlisted_*`` from documents that list the
processes holding memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Quality, Risk, Severity
from diagnose.rules.base import Rule, bar, present
from diagnose.units import GIB, MIB, pct, size


def _span(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


class GpuIdleWholeRecording(Rule):
    """The GPU ran no kernel for a whole recorded run: the work is not on this GPU.

    What it detects: a recording of GPU utilisation over a run (``nvidia-smi --query-gpu … -l``,
    ``nvidia-smi -l``, ``dmon``, a DCGM or NVML series) in which every reading of every GPU stays at
    about 0 %, from the first to the last. Unlike PLC001, which reads what a report says, this is
    measured: many readings over minutes.

    Why it matters: a model that was meant to run on the GPU and runs on the CPU instead is 10-100×
    slower, and nothing else is worth tuning until it moves. The usual causes are a CPU-only build
    (a torch wheel without CUDA, ``onnxruntime`` instead of ``onnxruntime-gpu``, llama.cpp built
    without CUDA or with no layers offloaded), a device never set (``.to("cuda")`` missing, a
    pipeline left on ``device=-1``), or the recording watching another GPU than the one the work
    was given (``CUDA_VISIBLE_DEVICES``, the index order).

    How it decides: at least ``min_samples`` readings per GPU (``gpu.util_samples``) over at least
    ``min_span_s`` seconds (``gpu.sampled_span_s``; without times the span is unknown and the
    confidence heuristic), mean utilisation ≤ ``max_mean`` and no single reading above
    ``max_peak`` (``gpu.util_max_ratio``). The memory held says which case it is: under
    ``no_model_bytes`` on the fullest GPU (``gpu.memory_used_bytes``), no process ever put a model
    on it; more, and a model is resident but no kernel ran (requests went elsewhere, or none
    reached it). When the same evidence shows the service had nothing to do
    (``conn.inflight_mean`` or ``serving.running_mean`` below ``idle_load``), an idle GPU is
    expected: no finding. With load measured (requests in flight, requests served) the finding is
    critical; without, major: the recording alone cannot say that the workload ran during it.

    Evidence: gpu.util_samples, gpu.util_ratio, gpu.util_max_ratio; optionally gpu.sampled_span_s,
    gpu.util_p90_ratio, gpu.memory_used_bytes, gpu.memory_total_bytes, gpu.count, gpu.processes,
    conn.inflight_mean, serving.running_mean, requests.count.

    Fix: put the work on the GPU: a CUDA build of the framework (``torch.cuda.is_available()``
    must be True; ``onnxruntime-gpu`` with ``CUDAExecutionProvider`` first; llama.cpp with
    ``-DGGML_CUDA=ON`` and ``-ngl 999``), the model and its inputs moved to ``cuda``; check that the
    recording watches the GPU the process uses (``CUDA_VISIBLE_DEVICES``,
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).

    False positives: a recording taken while the service was idle (no requests in the window:
    record while it serves, or give its load with it); a workload that does not use the GPU by
    design; a GPU used only by a compositor (a few %).
    """

    code = "PLC002"
    name = "gpu-idle-whole-recording"
    category = Category.DEVICE_PLACEMENT
    requires = ("gpu.util_samples", "gpu.util_ratio", "gpu.util_max_ratio")  # a recording is what is missing, say so
    optional = (
        "gpu.sampled_span_s", "gpu.util_p90_ratio", "gpu.memory_used_bytes", "gpu.memory_total_bytes", "gpu.count",
        "gpu.processes", "conn.inflight_mean", "serving.running_mean", "requests.count",
    )

    @dataclass(frozen=True)
    class Thresholds:
        max_mean: float = 0.02  # a GPU busy ≤ 2 % of the time did no meaningful part of the work
        max_peak: float = 0.10  # one reading at ≥ 10 % is real GPU work: the workload (or part of it) runs there
        min_samples: float = 30  # thirty readings per GPU: idle instants between batches cannot fill them all
        min_span_s: float = 60.0  # a minute covers more than one request or batch of a running workload
        no_model_bytes: float = 512 * MIB  # less on every GPU is at most a bare CUDA context: no model was loaded
        idle_load: float = 0.1  # under 0.1 requests in flight or running on average: the service had no work

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        mean = ev.value("gpu.util_ratio", 1.0) or 0.0
        peak = ev.value("gpu.util_max_ratio", 1.0) or 0.0
        samples = ev.value("gpu.util_samples", 0.0) or 0.0
        if mean > t.max_mean or peak > t.max_peak or samples < t.min_samples:
            return None
        span = ev.value("gpu.sampled_span_s")
        if span is not None and span < t.min_span_s:
            return None
        inflight, running = ev.value("conn.inflight_mean"), ev.value("serving.running_mean")
        measured_load = [v for v in (inflight, running) if v is not None]
        if measured_load and max(measured_load) < t.idle_load:
            return None  # the service had nothing to do: an idle GPU is expected
        requests = ev.value("requests.count")
        loaded = bool(measured_load) or (requests is not None and requests > 0)
        used = ev.value("gpu.memory_used_bytes")
        count = ev.value("gpu.count")
        gpus = f"{count:.0f} GPUs" if count and count > 1 else "the GPU"
        over = f" over {_span(span)}" if span is not None else ""
        msg = (f"{gpus[0].upper()}{gpus[1:]} ran no kernel worth counting for the whole recording: "
               f"{samples:.0f} readings per GPU{over}, {pct(mean)} busy on average and never above {pct(peak)}.")
        if used is not None and used < t.no_model_bytes:
            msg += (f" At most {size(used, 1)} was ever allocated: no process put a model on it, so the workload ran "
                    "on the CPU or on another device.")
        elif used is not None:
            msg += (f" {size(used, 1)} is held (a model is loaded), yet no kernel ran: the process holding it did no "
                    "GPU work while it was recorded, so requests were served elsewhere (the CPU, another GPU) or none "
                    "reached it.")
        if loaded:
            what = (f"{max(measured_load):.1f} requests in flight on average" if measured_load
                    else f"{requests:.0f} requests served")
            msg += f" Meanwhile the service had {what}: the work is not on " + (
                "these GPUs." if count and count > 1 else "this GPU.")
        else:
            msg += (" If the workload ran during this recording, it did not run on "
                    + ("these GPUs." if count and count > 1 else "this GPU."))
        return self.finding(
            severity=Severity.CRITICAL if loaded else Severity.MAJOR,
            confidence=Confidence.MEASURED if span is not None else Confidence.HEURISTIC,
            title="The GPU sat idle for the whole run: the work is not on it",
            message=msg,
            impact=(1.0 - mean) if loaded else 0.7 * (1.0 - mean),
            evidence=present(ev, *self.requires, *self.optional),
            why=f"GPU busy |{bar(mean)}| {pct(mean)} (peak {pct(peak)})\nGPU idle |{bar(1 - mean)}| {pct(1 - mean)}",
            fixes=[
                Fix("Put the model on the GPU", (
                    "PyTorch: a CUDA wheel (torch.cuda.is_available() must print True) and model.to('cuda') with "
                    "the inputs moved too; transformers pipelines: device=0 or device_map='auto'",
                    "ONNX Runtime: onnxruntime-gpu with providers=['CUDAExecutionProvider', 'CPUExecutionProvider'] "
                    "(session.get_providers() must list CUDA first)",
                    "llama.cpp / llama-cpp-python / ollama: a CUDA build (-DGGML_CUDA=ON) and every layer offloaded "
                    "(-ngl 999, n_gpu_layers=-1); the load log must say 'offloaded N/N layers to GPU'",
                ), Risk.SAFE),
                Fix("Make sure the recording watches the GPU the work was given", (
                    "Compare CUDA_VISIBLE_DEVICES and torch.cuda.current_device() with the nvidia-smi index; set "
                    "CUDA_DEVICE_ORDER=PCI_BUS_ID so both count GPUs the same way",
                    "Record while the service serves requests (nvidia-smi --query-gpu=timestamp,index,"
                    "utilization.gpu,memory.used --format=csv -l 1) and keep its request log with it",
                ), Risk.SAFE),
            ],
        )


_UNUSABLE = {
    "driver_not_loaded": "nvidia-smi cannot talk to the NVIDIA driver",
    "no_gpu_visible": "nvidia-smi finds no GPU",
    "driver_library_mismatch": "the NVIDIA library and kernel driver versions differ",
    "gpu_lost": "the driver has lost a GPU",
    "cpu_lacks_vector_extensions": "Ollama turned GPU inference off: the CPU lacks the vector extensions (AVX, AVX2) "
                                   "its GPU runners were built for",
}


class GpuNotUsable(Rule):
    """nvidia-smi (or the engine's own GPU discovery) says no GPU can be used here: the work cannot be on the GPU.

    What it detects: what nvidia-smi prints instead of its table when the GPU is out of reach:
    ``NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver``, ``No devices
    were found``, ``Failed to initialize NVML: Driver/library version mismatch``, and for a GPU the
    driver lost, ``Unable to determine the device handle for GPU…: Unknown Error`` or ``ERR!`` in its
    row. And Ollama's record that it turned GPU inference off because the CPU lacks AVX/AVX2
    (``msg="CPU does not have AVX or AVX2, disabling GPU support."``, later ``msg="CPU does not have
    minimum vector extensions, GPU inference disabled. Required:avx …"``).

    Why it matters: CUDA sees what nvidia-smi sees. A framework then either fails to start or, worse,
    runs the model on the CPU without a word (PyTorch ``device="cuda" if torch.cuda.is_available()
    else "cpu"``, ONNX Runtime falling back to ``CPUExecutionProvider``, llama.cpp loading no
    layers on the GPU): 10-100× slower, and nothing about the model or the server is the cause.

    How it decides: ``gpu.unusable`` names one of those states (no threshold: nvidia-smi said it).
    A GPU lost while others answer is critical for the work on it; every state has impact
    ``impact``.

    Evidence: gpu.unusable; optionally gpu.count, gpu.devices.

    Fix: a driver that is not loaded: load it (``modprobe nvidia``, install the driver) or, in a
    container, start it with the NVIDIA runtime (``docker run --gpus all``, the
    nvidia-container-toolkit; in Kubernetes request ``nvidia.com/gpu``); no device: check
    ``lspci | grep -i nvidia`` and the container's GPU request; a version mismatch: reboot (or
    unload and reload the kernel module) after a driver upgrade; a lost GPU: ``dmesg | grep -i xid``
    (79: fallen off the bus), drain the node, reset or reboot, and report the card if it recurs; Ollama's
    CPU check: a CPU (a VM's CPU type) that exposes AVX/AVX2.

    False positives: nvidia-smi run on a different machine or container than the service (the
    message is about where it ran); a CPU-only deployment by design.
    """

    code = "PLC003"
    name = "gpu-not-usable"
    category = Category.DEVICE_PLACEMENT
    requires = ("gpu.unusable",)
    optional = ("gpu.count", "gpu.devices")

    @dataclass(frozen=True)
    class Thresholds:
        impact: float = 0.9  # nothing on the GPU can run: as large as a placement fault gets

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        got = ev.get("gpu.unusable")
        kinds = [k for k in (got.value if isinstance(got, Evidence) and isinstance(got.value, list) else [])
                 if k in _UNUSABLE]
        if not kinds:
            return None
        detail = got.detail if isinstance(got, Evidence) else ""
        msg = "; ".join(_UNUSABLE[k] for k in kinds) + (f": {detail}." if detail else ".")
        msg += (" Whatever was meant to run on this GPU either failed to start or runs on the CPU: no setting of "
                "the model or the server will make it fast until the GPU is back.")
        by_ollama = kinds == ["cpu_lacks_vector_extensions"]
        fixes = [Fix("Give Ollama a CPU with AVX", (
            "A VM hides the host CPU's extensions behind a generic model (Proxmox/QEMU kvm64, qemu64): set the CPU "
            "type to host (or one with AVX/AVX2) and restart; grep -o -w 'avx2\\?' /proc/cpuinfo must list them",
            "On a CPU without AVX at all, Ollama's GPU runners cannot be used: a build of llama.cpp without AVX "
            "(-DGGML_AVX=OFF) with its GPU backend, or other hardware",
        ), Risk.SAFE)] if by_ollama else []
        return self.finding(
            severity=Severity.CRITICAL,
            confidence=Confidence.MEASURED,
            title="No usable GPU: Ollama turned GPU inference off" if by_ollama
            else "No usable GPU: nvidia-smi cannot reach it",
            message=msg,
            impact=t.impact,
            evidence=present(ev, *self.requires, *self.optional),
            fixes=fixes or [
                Fix("Make the GPU reachable", (
                    "Driver not loaded: install or load it (modprobe nvidia; nvidia-smi on the host must work); in "
                    "a container: docker run --gpus all with the nvidia-container-toolkit, or request nvidia.com/gpu "
                    "in the pod spec",
                    "Driver/library version mismatch: reboot the node (or unload and reload the nvidia kernel "
                    "modules) after the driver upgrade",
                    "No devices found: lspci | grep -i nvidia on the host; check NVIDIA_VISIBLE_DEVICES and the "
                    "container's GPU request",
                ), Risk.SAFE),
                Fix("A GPU the driver lost", (
                    "dmesg | grep -i xid (Xid 79: fallen off the bus; 48/63/64/94/95: memory errors)",
                    "Drain the node, reset the GPU (nvidia-smi --gpu-reset -i N) or reboot; replace the card if it "
                    "recurs",
                ), Risk.NEEDS_VALIDATION),
            ],
        )


def _active(ev: EvidenceSet) -> bool:
    """Every GPU of a single reading was in an active performance state (P0-P2: a context at work, not the idle
    P8 of a snapshot taken before any request)."""
    got = ev.get("gpu.devices")
    devices = got.value if isinstance(got, Evidence) else None
    states = [str(d.get("pstate") or "") for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []
    return bool(states) and all(p.upper() in ("P0", "P1", "P2") for p in states)


def _layer_fixes(fit_first: bool) -> list[Fix]:
    """Offload the layers, or make them fit; the fit first where the model does not fit (more layers asked of the
    GPU would run it out of memory)."""
    offload = Fix("Offload every layer that fits", (
        "llama.cpp / llama-server: -ngl 999 (--n-gpu-layers); llama-cpp-python: n_gpu_layers=-1; "
        "ollama: the num_gpu option (or let it size the offload: check `ollama ps`)",
        "The load log must then say 'offloaded M/M layers to GPU'; if the load then runs out of "
        "memory, the model and its KV cache do not fit at this size",
    ), Risk.NEEDS_VALIDATION)
    fit = Fix("Make the layers fit", (
        "A smaller quantisation (Q4_K_M instead of Q8_0) or a shorter context (-c) when the model and "
        "its KV cache do not fit the GPU's memory",
    ), Risk.NEEDS_VALIDATION)
    return [fit, offload] if fit_first else [offload, fit]


class LayersLeftOnTheCpu(Rule):
    """llama.cpp's model loader put most of the model's layers on the CPU although a GPU was there to take them.

    What it detects: the loader's own line ``offloaded N/M layers to GPU`` (``llm_load_tensors:`` /
    ``load_tensors:``; ``llama_model_load_internal:`` before GGUF; ollama's runner prints the same) with
    N/M below ``max_share``, in a log where llama.cpp also allocated a buffer on a GPU device (``CUDA0
    compute buffer size``, ``ROCm0 model buffer size``, ``Metal …``) or CUDA counted a device at start-up.
    The offload line alone says nothing of a GPU: llama.cpp prints it whenever a GPU or an RPC backend is
    registered (the official CPU packages build RPC in), ollama on every load. N is what the loader was
    asked to offload, capped at M.

    Why it matters: every layer left on the CPU is computed by the CPU for every token; with most of
    them there, the CPU sets the pace (10-100× slower than the GPU) and the GPU idles between its few
    layers.

    How it decides: N/M < ``max_share`` with a GPU buffer in the log; impact 1 − N/M, at least
    ``min_impact``. The served model counts, not a draft beside it (often kept on the CPU: the load after
    llama-server's "loading draft model", or one with far fewer layers); of its loads the last (a paste of two runs
    reads in time: the state it ends with).
    Not when an out-of-memory error is in the evidence or the report (a loader that offloads what fits
    and fails is an OOM for the memory rules); where ollama chose the layers from the memory it found
    (``layers.requested=-1``: the rest does not fit) or the weights are known to be larger than the GPU, only as
    the last paragraph says. Measured, it also fires for a larger share
    offloaded, whatever fits: at least ``min_cpu_share`` of the layers left on the CPU with every GPU measured at
    most ``max_busy`` busy over at least ``min_samples`` readings, or one reading in an active performance state
    (P0-P2; a single P8 reading may be an idle snapshot before any request); the CPU computes its layers many
    times slower, so even a third of them sets the pace and the GPU waits (ollama#3301: 23 of 33 layers offloaded,
    the GPU 15 % busy in P2); impact 1 − the GPU's busy share.
    Where the model does not fit (ollama sized the offload to the memory it found, or the weights are larger than the
    GPU) and at least ``unfit_cpu_share`` of the layers stayed on the CPU with some on the GPU, it fires too: the CPU
    computes those layers at every token and sets the pace (ollama#8850: 42 of 65 layers, 9 GiB of weights in
    7.6 GiB free); impact 1 − N/M, at least ``min_impact``; the fix is to make it fit.

    Evidence: llamacpp.gpu_layers, llamacpp.layers_total, llamacpp.gpu_backend; optionally
    llamacpp.offload_auto_sized, mem.weights_estimate_bytes, gpu.spec_memory_bytes, mem.oom_count,
    report.oom_statements.

    Fix: offload every layer (``-ngl 999`` / ``--n-gpu-layers``, llama-cpp-python ``n_gpu_layers=-1``,
    ollama ``num_gpu``) if they fit; if they do not, a smaller quantisation or a shorter context so they do.

    False positives: a partial offload chosen on purpose to share the GPU; a model that does not fit
    when the weights' size is not in the evidence (the loader's buffer sizes show it).
    """

    code = "PLC004"
    name = "layers-left-on-cpu"
    category = Category.DEVICE_PLACEMENT
    requires = ("llamacpp.gpu_layers", "llamacpp.layers_total", "llamacpp.gpu_backend")
    optional = ("llamacpp.offload_auto_sized", "mem.weights_estimate_bytes", "gpu.spec_memory_bytes",
                "mem.oom_count", "report.oom_statements", "gpu.util_ratio", "gpu.util_samples", "gpu.util_max_ratio",
                "gpu.devices")

    @dataclass(frozen=True)
    class Thresholds:
        max_share: float = 0.5  # under half the layers on the GPU: the CPU computes most of every token
        min_impact: float = 0.7  # the CPU part sets the pace even when it is only half
        max_busy: float = 0.5  # a GPU busy half the time or less while layers sit on the CPU waits for them
        min_samples: float = 2.0  # one reading may be an idle snapshot taken before any request
        min_cpu_share: float = 0.1  # a tenth of the layers or more on the CPU (the output layer alone costs little)
        unfit_cpu_share: float = 0.25  # a model that does not fit, a quarter of its layers on the CPU: system memory
        # (tens of GB/s) feeds them several times slower than VRAM (hundreds), so that quarter takes most of a token

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        on_gpu, layers = ev.value("llamacpp.gpu_layers"), ev.value("llamacpp.layers_total")
        if not isinstance(on_gpu, int | float) or not isinstance(layers, int | float) or layers <= 0:
            return None
        share = on_gpu / layers
        oom = (ev.value("mem.oom_count", 0.0) or 0.0) > 0 or (ev.value("report.oom_statements", 0.0) or 0.0) > 0
        if oom or share >= 1:
            return None
        # the GPU measured waiting for the CPU's layers: over several readings, every GPU at most half busy (the mean
        # alone hides a busy card beside an idle second one), with a tenth of the layers or more on the CPU
        busy, peak = ev.value("gpu.util_ratio"), ev.value("gpu.util_max_ratio")
        samples = ev.value("gpu.util_samples", 0.0) or 0.0
        waited = (isinstance(busy, int | float) and busy <= t.max_busy
                  and (samples >= t.min_samples or _active(ev))
                  and (not isinstance(peak, int | float) or peak <= t.max_busy) and 1 - share >= t.min_cpu_share)
        weights, gpu_mem = ev.value("mem.weights_estimate_bytes"), ev.value("gpu.spec_memory_bytes")
        w = float(weights) if isinstance(weights, int | float) else 0.0
        cap = float(gpu_mem) if isinstance(gpu_mem, int | float) else 0.0
        larger = bool(w and cap and w > cap)
        auto = bool(ev.value("llamacpp.offload_auto_sized"))
        # what does not fit stays on the CPU: a quarter of the layers or more there computes most of every token (the
        # weights known larger than the GPU, not a 16-bit guess: a GGUF is most often quantised)
        est = ev.get("mem.weights_estimate_bytes")
        known_larger = larger and isinstance(est, Evidence) and est.quality is Quality.GOOD
        unfit = (auto or known_larger) and 1 - share >= t.unfit_cpu_share and on_gpu > 0
        if not waited and not unfit and (share >= t.max_share or auto or larger):
            return None
        got = ev.get("llamacpp.gpu_backend")
        device = got.value if isinstance(got, Evidence) else "a GPU device"
        msg = (f"llama.cpp's loader offloaded {on_gpu:.0f} of the model's {layers:.0f} layers to the GPU: the other "
               f"{pct(1 - share)} run on the CPU for every token"
               + (f" (the weights, about {size(w)}, are larger than the GPU's {size(cap)}: "
                  "only a part fits)." if larger else
                  " (ollama offloaded what it found room for)." if ev.value("llamacpp.offload_auto_sized") else
                  f", while llama.cpp had a GPU ({device}) to put them on"
                  + (": nothing was offloaded (-ngl / n_gpu_layers left at 0)." if on_gpu == 0 else "."))
               + (f" The GPU was {pct(float(busy or 0.0))} busy: it waits for the CPU's layers, which set the pace."
                  if waited else ""))
        if unfit and not waited:
            msg += (f" With {pct(1 - share)} of the layers on the CPU, the CPU (reading its weights from system "
                    "memory, several times slower than the GPU reads its own) takes most of every token and the GPU "
                    "waits: make the model and its context fit the GPU.")
        return self.finding(
            severity=Severity.CRITICAL,
            confidence=Confidence.MEASURED,
            title=("Most of the model's layers run on the CPU" if share < t.max_share else
                   "The model's layers on the CPU set the pace"),
            message=msg,
            impact=(max(t.min_impact, 1 - share) if share < t.max_share else
                    max(1 - share, 1 - float(busy or 0.0)) if waited else max(t.min_impact, 1 - share)),
            evidence=present(ev, *self.requires, *self.optional),
            why=f"GPU layers |{bar(share)}| {pct(share)}\nCPU layers |{bar(1 - share)}| {pct(1 - share)}",
            fixes=_layer_fixes(fit_first=unfit and not waited),
        )


class MemoryOutsideListedProcesses(Rule):
    """GPU memory is in use that no listed process holds: processes nvidia-smi cannot see, or a leaked context.

    What it detects: a document that lists the processes holding GPU memory (the table's processes
    section, ``nvidia-smi -q`` / ``-q -x``, ``--query-compute-apps`` with ``--query-gpu``) shows a
    device using much more memory than its listed processes hold together, or none listed at all.

    Why it matters: that memory is not available to the service. nvidia-smi inside a container
    lists only the processes of its own PID namespace, so memory held by another container (another
    pod on a shared GPU) shows as used with no owner; a process that died without releasing its
    context (a zombie, a defunct worker) leaves memory held by nobody listed. Before an
    out-of-memory error it is the first thing to rule out; with one it is a likely cause.

    How it decides: ``gpu.memory_unlisted_bytes`` (used − what the listed processes hold, on the
    device where that share is largest) is at least ``min_bytes`` and ``min_share`` of the device.
    With an out-of-memory error (``mem.oom_count`` ≥ 1) it is an ``oom_external`` cause (major at
    ``major_share`` or more, else minor; heuristic: the snapshot and the error may be minutes
    apart), unless the OOM message itself measured the memory held outside the failing process
    (``mem.other_processes_bytes``, or its own use with the device's total and free: MEM004 owns
    that). Without one it is an informational note, since the memory may be the service's own
    processes seen from inside another container; minor when the same document does list processes
    (nvidia-smi then sees its own namespace: what it cannot attribute is someone else's or leaked)
    and the share reaches ``major_share``.

    Evidence: gpu.memory_unlisted_bytes, gpu.memory_total_bytes; optionally
    gpu.memory_unlisted_share_ratio, gpu.memory_used_bytes, gpu.processes, mem.oom_count,
    mem.other_processes_bytes, mem.process_used_bytes, mem.device_total_bytes, mem.device_free_bytes.

    Fix: look from where every process is visible: ``nvidia-smi`` on the host (or
    ``nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv`` there),
    ``fuser -v /dev/nvidia*``; in Kubernetes, the pods scheduled on the node's GPU (time-slicing or
    MPS share it); stop zombies (``ps -eo pid,stat,cmd | grep -w Z``) and, when nothing at all holds
    the memory any more, reset the GPU (``nvidia-smi --gpu-reset -i N``, with no process on it).

    False positives: nvidia-smi run in the service's own container without ``--pid=host``: the
    unlisted memory may be the service itself (hence informational without an OOM); the driver's
    own reservation on old drivers that count it as used (hundreds of MiB, under ``min_bytes``).
    """

    code = "MEM010"
    name = "gpu-memory-outside-listed-processes"
    category = Category.OOM_EXTERNAL
    requires = ("gpu.memory_unlisted_bytes", "gpu.memory_total_bytes")
    optional = ("gpu.memory_unlisted_share_ratio", "gpu.memory_used_bytes", "gpu.processes", "mem.oom_count",
                "mem.other_processes_bytes", "mem.process_used_bytes", "mem.device_total_bytes",
                "mem.device_free_bytes")

    @dataclass(frozen=True)
    class Thresholds:
        min_bytes: float = GIB  # a hidden process's bare CUDA context is 0.3-0.5 GiB: a GiB is more than that
        min_share: float = 0.05  # a twentieth of the device: enough to change what fits
        major_share: float = 0.25  # MEM004's bar: a quarter of the device held elsewhere tips an OOM

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        unlisted = ev.value("gpu.memory_unlisted_bytes", 0.0) or 0.0
        total = ev.value("gpu.memory_total_bytes", 0.0) or 0.0
        share = ev.value("gpu.memory_unlisted_share_ratio")
        if share is None:
            share = unlisted / total if total else 0.0
        if unlisted < t.min_bytes or share < t.min_share:
            return None
        oom = (ev.value("mem.oom_count", 0.0) or 0.0) >= 1
        if oom and ("mem.other_processes_bytes" in ev or all(
                k in ev for k in ("mem.process_used_bytes", "mem.device_total_bytes", "mem.device_free_bytes"))):
            return None  # the OOM message measured who held what: MEM004 judges it
        got = ev.get("gpu.memory_unlisted_bytes")
        where = getattr(got, "detail", "")
        procs = ev.get("gpu.processes")
        rows = procs.value if isinstance(procs, Evidence) and isinstance(procs.value, list) else []
        listed = sum(1 for p in rows if isinstance(p, dict) and p.get("pid") is not None)
        msg = (f"{size(unlisted, 1)} ({pct(share)}) of the device is in use but no listed process holds it"
               + (f" ({where})" if where else "") + ".")
        if oom:
            msg += (" With the out-of-memory error, this is memory the failing service could not get: processes "
                    "in another container (nvidia-smi lists only its own PID namespace) or a context leaked by a "
                    "process that exited uncleanly.")
            severity = Severity.MAJOR if share >= t.major_share else Severity.MINOR
            confidence = Confidence.HEURISTIC
        elif listed:
            msg += (f" nvidia-smi does list {listed} process(es), so it is not blind: what it cannot attribute is held "
                    "by processes outside its view (another container's) or by a context a dead process leaked. "
                    "Nothing failed yet, but that memory is not available to the service.")
            severity = Severity.MINOR if share >= t.major_share else Severity.INFO
            confidence = Confidence.MEASURED
        else:
            msg += (" nvidia-smi inside a container lists only the processes of its own PID namespace: the memory "
                    "belongs to processes it cannot see (another container, or this service itself seen from a "
                    "sidecar) or to a context leaked by a process that died. Nothing failed; it is memory the "
                    "service cannot count on.")
            severity = Severity.INFO
            confidence = Confidence.MEASURED
        return self.finding(
            severity=severity,
            confidence=confidence,
            title="GPU memory is held outside the listed processes",
            message=msg,
            impact=share,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"unlisted |{bar(share)}| {pct(share)} of the device",
            fixes=[
                Fix("Find who holds it, from where every process is visible", (
                    "On the host: nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv "
                    "(or run the container with --pid=host); fuser -v /dev/nvidia*",
                    "Kubernetes: list the pods on the node that request the GPU (time-slicing and MPS let several "
                    "share one) and their memory limits",
                ), Risk.SAFE),
                Fix("Free memory that nothing holds any more", (
                    "Stop zombie or orphaned workers (ps -eo pid,stat,cmd | grep -w Z; kill the parent or the "
                    "process group)",
                    "With no process left on it and memory still used: nvidia-smi --gpu-reset -i N",
                ), Risk.NEEDS_VALIDATION),
            ],
        )


RULES: tuple[type[Rule], ...] = (LayersLeftOnTheCpu, GpuIdleWholeRecording, GpuNotUsable, MemoryOutsideListedProcesses)
