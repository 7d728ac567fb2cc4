"""Out-of-memory messages (PyTorch CUDA/NPU, frameworks) and model-size hints → plain records.

Pure parsing, streamed line by line: ``OomParser.feed(line)`` for each cleaned log line, then
``OomParser.result()``. It recognises

* every historical PyTorch allocator message: the legacy form
  ``CUDA out of memory. Tried to allocate X (GPU 0; T total capacity; A already allocated; F free;
  R reserved in total by PyTorch)``, the 2.1+ form (``GPU 0 has a total capacity of … of which …
  is free. Process N has … memory in use. Of the allocated memory … is allocated by PyTorch, with
  … allocated in private pools (e.g., CUDA Graphs), and … is reserved by PyTorch but
  unallocated``, including the ``capacty`` typo of some releases), the Ascend ``NPU out of
  memory`` variant, and messages cut short (each field is read on its own; missing ones are
  reported);
* framework messages that mean the same thing: vLLM's sampler warm-up OOM and KV-cache
  shortfalls, TGI's ``Not enough memory to handle N prefill tokens``, vLLM's start-up free-memory
  check, JAX/XLA ``RESOURCE_EXHAUSTED``;
* a prose mention of an OOM when no message was pasted (recorded as such);
* the traceback frames around each event, to tell the phase (loading / profile_run / warmup /
  serving);
* model-size hints: a parameter count in a model name (``Qwen1.5-72B-Chat``, ``llama3.1 70b
  awq``) with its dtype, tensor parallelism, the GPU count and model, vLLM's
  ``gpu_memory_utilization`` and measured weight sizes (``Loading model weights took 14.99 GB``).

Sizes are read with ``diagnose.units``: ``KB``/``MB``/``GB`` are binary, as torch and vLLM print them.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from diagnose.collectors.logtext import Keyed
from diagnose.units import GIB, SIZE, parse_size

# ---------------------------------------------------------------------------------------------
# records
# ---------------------------------------------------------------------------------------------

PHASES = ("loading", "profile_run", "warmup", "serving")  # in order of precedence


@dataclass(frozen=True)
class Frame:
    """One traceback frame: ``File "path", line N, in func`` plus the code line under it."""

    path: str
    func: str
    code: str = ""


@dataclass
class OomEvent:
    """One out-of-memory event and the allocator numbers its message gave (bytes)."""

    kind: str  # "allocator" (a PyTorch message), "framework", "prose"
    device: str = ""  # "GPU", "NPU", "XPU", … as the message names it
    device_index: int | None = None
    requested: int | None = None
    total: int | None = None
    free: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    reserved_unallocated: int | None = None
    private_pools: int | None = None
    process_used: int | None = None
    limit: int | None = None  # "X allowed" (per-process memory fraction)
    other_processes: list[tuple[int, int]] = field(default_factory=list)  # (pid, bytes)
    # NVML's list of the device's processes ended where the message goes on ("… memory in use. Of the allocated …"):
    # no entry of it was cut off
    process_list_whole: bool = False
    phase: str = "unknown"
    phase_from: str = ""  # the frame or message that told the phase
    phase_by_message: bool = False  # the framework's message itself told the phase (not a frame or a log line)
    truncated: bool = False
    missing: tuple[str, ...] = ()
    message: str = ""
    reason: str = ""  # framework messages: what the framework said ran out
    line_no: int = 0
    kv_cache_needed: int | None = None
    kv_cache_available: int | None = None
    kv_cache_max_tokens: int | None = None
    max_model_len: int | None = None
    prefill_tokens: int | None = None
    kv_tokens_requested: int | None = None  # SGLang's token pool: the slots the failed allocation asked for
    kv_tokens_free: int | None = None  # … and the slots it had, free and evictable (a hybrid pool: its full one)
    startup_wanted: int | None = None  # vLLM's start-up check: the memory gpu_memory_utilization asks for
    local_free: int | None = None  # SGLang's balance check: this rank's free memory (``free``: the group's least)
    implausible: str = ""  # a field the message gave that cannot be (more free than the device has): left out

    @property
    def tensorflow(self) -> bool:
        """TensorFlow's message (its BFC allocator's, its tensor allocation's, or its exception class)."""
        return _TF_MESSAGE.search(self.message) is not None

    def key(self) -> tuple[object, ...]:
        return (self.kind, self.requested, self.total, self.free, self.allocated, self.reserved, self.reason,
                self.phase_from if self.kind == "framework" else "")


@dataclass
class ModelHints:
    """What the text says about the model and the hardware (all optional)."""

    model: str = ""
    params: float | None = None  # parameter count
    bytes_per_param: float | None = None
    dtype: str = ""
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    parallel_stated: bool = False
    tp_rank_max: int | None = None  # the highest tensor-parallel rank a log prefix names ("[… TP7]"): at least that + 1
    launch_seen: bool = False  # a launch command line (vllm serve, api_server --model, …)
    # an engine's command line (``--model X``, ``vllm serve X``) whose model and flags name no quantisation and no
    # dtype: the engine loads the checkpoint as published, 16-bit for a model whose name states no quantisation
    launch_unquantised: bool = False
    gpu_count: int | None = None
    gpu_model: str = ""
    gpu_memory_bytes: int | None = None
    gpu_memory_assumed: tuple[float, ...] = ()  # the sizes a GPU name without a size could mean (GiB)
    gpu_memory_utilization: float | None = None
    weights_measured: int | None = None  # "Loading model weights took 14.99 GB"
    # vLLM's memory profiling at start-up (``_PROFILE_FIELD``): the device's size, and (0.6.x) the device's use
    # by every process once this instance's weights were loaded, and the use beyond this process' tensors
    device_total: int | None = None
    profile_used: int | None = None
    profile_non_torch: int | None = None
    # TensorFlow 1.x creating its GPU devices: each device's (total, free) as it found them, before it allocated
    tf_devices: list[tuple[int, int]] = field(default_factory=list)
    engine: str = ""
    engine_version: str = ""  # "0.6.4", from the engine's start-up banner or a version statement
    vllm_v1: bool | None = None  # vLLM's V1 engine (markers in the log), V0, or not said
    cpu_loading_pct: float | None = None  # "CPU usage goes to 95 % while loading the model"
    cpu_after_loading_pct: float | None = None
    cpu_after_loading_normal: bool = False  # "… and back to normal once the model is up"


@dataclass
class OomResult:
    events: list[OomEvent]
    problems: list[str]
    prose_mentions: int = 0
    alloc_retries: int | None = None  # torch.cuda.memory_stats()["num_alloc_retries"] / memory_summary()
    fragmentation_statements: list[str] = field(default_factory=list)  # the report says fragmentation caused it


# ---------------------------------------------------------------------------------------------
# the allocator message
# ---------------------------------------------------------------------------------------------

_TRT_OOM = re.compile(r"Error Code 2: OutOfMemory\b"
                      r"|Requested amount of GPU memory \(\d+ bytes\) could not be allocated", re.IGNORECASE)
_HEAD = re.compile(
    r"(?P<dev>CUDA|NPU|XPU|HIP|MPS|MUSA|MLU)\s+(?:backend\s+)?out of memory"
    r"|OutOfMemoryError\b"
    # TensorFlow's exception class heading its traceback, as IPython prints it ("ResourceExhaustedError      Traceback
    # (most recent call last)") or with its message after a colon: TensorFlow raises it when an allocator runs out
    r"|ResourceExhaustedError(?=\s{2,}Traceback|\s*:[^\n]*(?:OOM|out of memory|allocat|memory))"
    r"|CUDA error: out of memory"
    # ggml's CUDA backend before 2024: "CUDA error 2 at /…/ggml-cuda.cu:7358: out of memory"
    r"|CUDA error \d+ at \S+?:\d+: out of memory"
    r"|RESOURCE_EXHAUSTED: Out of memory"
    r"|cudaErrorMemoryAllocation|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED"
    # the allocator's sentence pasted without its first words: its own structure says what it is
    r"|(?:Tried|trying) to allocate\s+[\d.]+\s*[KMGT]i?B\b(?=.{0,16}(?:\((?:GPU|NPU|XPU) ?\d+;|GPU \d+ has a total))"
    r"|CUDA_ERROR_OUT_OF_MEMORY"
    # PaddlePaddle's allocators (memory/allocation/cuda_allocator.cc and its NPU/XPU/managed twins): "Out of memory
    # error on GPU 0. Cannot allocate 128.000000MB memory on GPU 0, 23.431824GB memory has been allocated and available
    # memory is only 97.625000MB." (sizes by HumanReadableSize: B, kB, MB, GB, TB; older releases give no allocated)
    r"|Cannot allocate\s+[\d.]+\s*[KMGT]?B\s+(?:CUDA managed\s+)?memory on (?:GPU|NPU|XPU|MLU)\b"
    # TensorFlow's and XLA's allocators: "Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.25TiB (rounded
    # to 1374521760000)", "cuMemAllocAsync failed to allocate 1225195446464 bytes", "OOM when allocating tensor with
    # shape[…]"; PyTorch's host allocator: "DefaultCPUAllocator: not enough memory: you tried to allocate N bytes",
    # "[enforce fail at alloc_cpu.cpp:72] . DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes"
    r"|ran out of memory trying to allocate|cuMemAllocAsync failed to allocate|OOM when allocating tensor"
    r"|DefaultCPUAllocator: (?:not enough memory|can't allocate memory)"
    # TensorRT's builder and runtime (its error code 2, kINTERNAL_ERROR, naming OutOfMemory): "[TRT] [E] 2:
    # [virtualMemoryBuffer.cpp::resizePhysical::155] Error Code 2: OutOfMemory (no further information)", "Requested
    # amount of GPU memory (1073741824 bytes) could not be allocated. There may not be enough free memory for
    # allocation to succeed." Not at its warning level ([W]), nor where the builder then skipped a tactic or finished
    # the engine (VoltaML#15, TensorRT-LLM#493: the tactic's memory was refused, the build went on)
    rf"|{_TRT_OOM.pattern}",
    re.IGNORECASE,
)
_TRT_WENT_ON = re.compile(r"Skipping tactic|Engine generation completed|Engine built in|Serialized engine|"
                          r"Total Host Persistent Memory|Build(?:ing)? engine (?:completed|finished|successfully)",
                          re.IGNORECASE)
_F_REQUESTED = re.compile(rf"(?:Tried|trying) to allocate\s+(?P<v>{SIZE})", re.IGNORECASE)
_F_TOTAL = re.compile(rf"(?P<v>{SIZE})\s+total capacity|total capac\w*\s+of\s+(?P<v2>{SIZE})", re.IGNORECASE)
_F_ALREADY = re.compile(rf"(?P<v>{SIZE})\s+already allocated", re.IGNORECASE)
_F_FREE = re.compile(rf"of which\s+(?P<v>{SIZE})\s+(?:is\s+)?free|;\s*(?P<v2>{SIZE})\s+free\b", re.IGNORECASE)
_F_ALLOWED = re.compile(rf"(?P<v>{SIZE})\s+allowed", re.IGNORECASE)
_F_RESERVED_TOTAL = re.compile(rf"(?P<v>{SIZE})\s+reserved in total", re.IGNORECASE)
# PyTorch 1.0-1.3's message ends "…; 7.38 MiB free; 5.08 GiB cached)": the allocator's cached blocks less what is
# allocated (amount_cached - amount_allocated), after it has returned every whole free block to the driver, so
# what is left is free space split off blocks still partly in use: reserved but unallocated
_F_CACHED = re.compile(rf";\s*(?P<v>{SIZE})\s+cached\s*\)", re.IGNORECASE)
# PaddlePaddle's fields: what it asked for, what its allocator holds on the device, what the device had free
_F_PADDLE_ASK = re.compile(rf"Cannot allocate\s+(?P<v>{SIZE})", re.IGNORECASE)
_F_PADDLE_HELD = re.compile(rf"(?P<v>{SIZE})\s+memory has been allocated", re.IGNORECASE)
_F_PADDLE_FREE = re.compile(rf"available memory is only\s+(?P<v>{SIZE})", re.IGNORECASE)
_PADDLE_DEVICE = re.compile(r"Cannot allocate\s+\S+\s+(?:CUDA managed\s+)?memory on (?P<dev>GPU|NPU|XPU|MLU)\s*"
                            r"(?P<i>\d+)")
_F_THIS_PROCESS = re.compile(rf"this process has\s+(?P<v>{SIZE})\s+memory in use", re.IGNORECASE)
_F_PROCESS = re.compile(rf"Process\s+(?P<pid>\d+)\s+has\s+(?P<v>{SIZE})\s+memory in use", re.IGNORECASE)
# the allocator's text after NVML's process list (c10/cuda/CUDACachingAllocator.cpp: proc_info, then "Of the allocated
# memory …"), cut anywhere after its first word: what follows "Of the" is the start of "allocated" or nothing (a
# person's "Of the two jobs on this GPU …" on the next line is no part of it)
_LIST_ENDS = re.compile(r"memory in use\.\s+Of\s+the\b(?:\s+(?P<w>[A-Za-z]+))?", re.IGNORECASE)
_F_BY_PYTORCH = re.compile(rf"(?P<v>{SIZE})\s+is allocated by PyTorch", re.IGNORECASE)
_F_POOLS = re.compile(rf"(?P<v>{SIZE})\s+allocated in private pools", re.IGNORECASE)
_F_UNALLOC = re.compile(rf"(?P<v>{SIZE})\s+is reserved by PyTorch but unallocated", re.IGNORECASE)
_JAX_BYTES = re.compile(r"Out of memory while trying to allocate\s+(?P<v>\d+)\s+bytes"
                        r"|(?:cuMemAllocAsync failed to|you tried to) allocate\s+(?P<v2>\d+)\s+bytes"
                        r"|ran out of memory trying to allocate\s+[\d.]+\s?[KMGT]i?B\s+\(rounded to (?P<v3>\d+)\)",
                        re.IGNORECASE)
_TF_SIZE = re.compile(rf"ran out of memory trying to allocate\s+(?P<v>{SIZE})", re.IGNORECASE)
# PyTorch on Apple silicon: "MPS backend out of memory (MPS allocated: 8.89 GB, other allocations: 172.98 MB, max
# allowed: 9.07 GB). Tried to allocate 6.25 MB on private pool." (aten/src/ATen/mps/MPSAllocator.mm): what this
# process holds, its tensors and its other allocations, against the high-watermark cap
_F_MPS_ALLOCATED = re.compile(rf"MPS allocated:\s*(?P<v>{SIZE})", re.IGNORECASE)
_F_MPS_OTHER = re.compile(rf"other allocations:\s*(?P<v>{SIZE})", re.IGNORECASE)
_F_MPS_CAP = re.compile(rf"max allowed:\s*(?P<v>{SIZE})", re.IGNORECASE)
# the host's allocator: PyTorch's, or TensorFlow's on its CPU device ("… on /job:localhost/replica:0/task:0/device:CPU:0
# by allocator cpu")
_HOST_ALLOCATOR = re.compile(r"DefaultCPUAllocator|device:CPU:\d+\b|\bby allocator cpu\b", re.IGNORECASE)
# TensorRT-LLM's PyTorch executor (tensorrt_llm/_torch/pyexecutor/py_executor_creator.py, _maybe_explain_if_oom): a head
# line, then the component it could not create and the device's memory, one field per line
_FW_TRT_HEAD = re.compile(r"Executor creation failed (?:due to insufficient GPU memory|with an error which might "
                          r"indicate insufficient GPU memory)", re.IGNORECASE)
_FW_TRT_FIELD = re.compile(r"^\s*(?:\[TRT-LLM\]\s*\[\w\]\s*)?(?P<k>The following component could not be created"
                           r"|Total GPU memory \(GiB\)|Free GPU memory before component creation attempt \(GiB\))"
                           r":\s*(?P<v>.+?)\s*$", re.IGNORECASE)
# the component that failed → the phase: the weights, the KV cache's sizing, or what is built after them
_TRT_PHASES = (("model resources", "warmup"), ("model", "loading"), ("kv cache", "profile_run"),
               ("temporary for kv cache size", "profile_run"), ("", "warmup"))

# framework messages that are OOMs in all but name
_FW_SAMPLER = re.compile(r"out of memory occurred when warming up sampler", re.IGNORECASE)
_FW_TGI = re.compile(r"Not enough memory to handle\s+(?P<n>\d+)\s+prefill tokens", re.IGNORECASE)
_FW_NO_CACHE = re.compile(r"No available memory for the cache blocks", re.IGNORECASE)
# vLLM V1 (gpu_worker.py, determine_available_memory) logs what is left for the KV cache before it raises "No
# available memory for the cache blocks": "Available KV cache memory: -2.14 GiB"; zero or below is that failure.
# SGLang's model runner: "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
_FW_KV_LEFT = re.compile(r"Available KV cache memory:\s*(?P<v>-\s*\d+(?:\.\d+)?|0(?:\.0+)?)\s*[KMGT]i?B", re.IGNORECASE)
# an engine's error that nothing is left for the KV cache, in the error's own words (an exception or an error
# record: a question or a doc line in prose is not one): SGLang's "ValueError: Loaded weights leave no GPU memory
# for the KV cache under --mem-fraction-static=0.88", "RuntimeError: not enough memory for the KV cache"
_FW_KV_NONE = re.compile(r"(?:\w(?:Error|Exception):|\bERROR\b).{0,200}?\b(?:no|not enough|insufficient)\s+"
                         r"(?:free\s+|available\s+)?(?:GPU\s+|device\s+)?memory\s+(?:left\s+)?for\s+"
                         r"(?:the\s+)?KV[- ]?cache")
_KV_LEFT_FROM = "vLLM KV-cache sizing (available memory at or below zero)"
_FW_SGL_POOL = re.compile(r"Not enough memory\.?\s+Please try to increase --mem-fraction-static", re.IGNORECASE)
# SGLang's KV token pool ran out while it served (``alloc_token_slots``, ``alloc_req_slots``): "Decode out of memory.
# Try to lower your batch size." (0.2 to 0.4 name the forward mode, "Prefill" or "Decode"; 0.5 on "Out of memory. Try
# to lower your batch size." in a RuntimeError), then "Try to allocate 363 tokens." and "Available tokens: 8064
# (available_size=8064 + evictable_size=0)" ("Avaliable tokens: N" in 0.2; a hybrid pool's "Available full tokens:
# N (…)" and "Available swa: N (…)"), each on its own line or run together; and the request-slot pool's "Out of
# memory. Please set a smaller number for `--max-running-requests`."
_FW_SGL_TOKENS = re.compile(r"\b(?:(?P<mode>Prefill|Decode) out|Out) of memory\.\s*Try to lower your batch size")
_FW_SGL_REQS = re.compile(r"\bout of memory\.\s*Please set a smaller number for\W{0,2}--max-running-requests",
                          re.IGNORECASE)
_SGL_ASK = re.compile(r"\bTry to allocate (?P<n>\d+) tokens\b")
# each pool's free and evictable slots: the plain pool's, a hybrid pool's full and sliding-window ones (0.5 on:
# "Available swa tokens: N", later "Available swa: N"); a mamba pool's line counts states, not tokens
_SGL_FREE = re.compile(r"\bAva(?:il|li)able (?:(?:full|swa) tokens|tokens|swa):\s*(?P<n>\d+)")
_FW_KV_TOKENS = re.compile(
    r"max seq len \((?P<need>\d+)\) is larger than the maximum number of tokens that can be stored in "
    r"KV cache \(\s*(?P<have>\d+)\s*\)",
    re.IGNORECASE,
)
# the same message wrapped by a paste before its number: joined with the next line that is not blank
_FW_KV_TOKENS_CUT = re.compile(r"max seq len \((?P<need>\d+)\) is larger than the maximum number of tokens that can "
                               r"be stored in KV cache\s*\(?\s*$", re.IGNORECASE)
# V1's form of it ("To serve at least one request with the model's max seq len (N), (X GiB KV cache is needed, …") cut
# anywhere by a paste's wrapping, a word split included: held and joined with the next line, with a space or without
# (vLLM spells it "the models's" in many releases)
_FW_KV_SERVE_CUT = re.compile(r"To serve at least one request with the models?'?s? max seq len \((?P<need>\d+)\)",
                              re.IGNORECASE)


def _kv_tokens_event(line: str, need: int, have: int | None) -> OomEvent:
    """vLLM's max-seq-len error: ``need`` tokens for one sequence, ``have`` in the KV cache (None: cut off)."""
    return OomEvent(kind="framework", phase="profile_run", phase_from="vLLM KV-cache sizing",
                    reason="KV cache cannot hold one max-length sequence", max_model_len=need,
                    kv_cache_max_tokens=have, message=line.strip())


def _kv_tokens_cut(line: str) -> OomEvent | None:
    """The max-seq-len error cut before its second number (either form), on its own: the KV cache's capacity
    unknown."""
    m = _FW_KV_TOKENS_CUT.search(line) or _FW_KV_SERVE_CUT.search(line)
    return None if m is None else _kv_tokens_event(line, int(m.group("need")), None)


_FW_KV_BYTES = re.compile(  # its "(" may be lost where a paste wrapped the message before it
    rf"\(?(?P<need>{SIZE})\s+KV cache is needed,\s+which is larger than the available KV cache memory "
    rf"\((?P<have>{SIZE})\)",
    re.IGNORECASE,
)
# the reason given vLLM's start-up check of free memory (it runs before any weight loads)
STARTUP_CHECK_REASON = "free memory at start-up below gpu_memory_utilization"
_FW_STARTUP_FREE = re.compile(
    r"Free memory on device(?:\s+[\w:]+)?\s*\((?P<free>[\d.]+)\s*/\s*(?P<total>[\d.]+)\s*(?P<unit>[KMGT]i?B)\)"
    r".{0,60}?less than desired GPU memory utilization\s*\((?P<util>[\d.]+)"
    r"(?:,\s*(?P<want>[\d.]+)\s*(?P<wunit>[KMGT]i?B))?",
    re.IGNORECASE,
)
# SGLang's tensor-parallel balance check (model_runner.py, before the weights load): the least free memory of the
# group's GPUs below 90 % of this rank's, "The memory capacity is unbalanced. Some GPUs may be occupied by other
# processes." and, in releases since early 2025, the two figures in GiB ("min_per_gpu_memory=61.2,
# local_gpu_memory=78.9, …", later "pre_model_load_memory=…"), run on or wrapped onto the lines after it. Raised as an
# error; a warning where a release lets an environment variable turn the refusal off
BALANCE_CHECK_REASON = "free memory unbalanced across the tensor-parallel group at start-up"
_FW_SGL_BALANCE = re.compile(r"\bThe memory capacity is unbalanced\.\s+Some GPUs\b")  # the engine's two sentences
_SGL_GROUP_FREE = re.compile(r"\b(?:pre_model_load_memory|min_per_gpu_memory)=(?P<v>\d+(?:\.\d+)?)")
_SGL_LOCAL_FREE = re.compile(r"\blocal_gpu_memory=(?P<v>\d+(?:\.\d+)?)")
# ONNX Runtime's arena: "BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer of size N"
_FW_ORT_ARENA = re.compile(r"Failed to allocate memory for requested buffer of size (?P<n>\d+)", re.IGNORECASE)
# ggml (llama.cpp, ollama): "allocating 46963.85 MiB on device 0: cudaMalloc failed: out of memory"
_FW_GGML = re.compile(rf"allocating\s+(?P<v>{SIZE})\s+on device (?P<dev>\d+):\s*cudaMalloc failed", re.IGNORECASE)
# ggml's own allocation failures (ggml-alloc.c, ggml-backend.c, llama.cpp): "ggml_gallocr_reserve_n: failed to allocate
# CUDA0 buffer of size 1293942784", "alloc_tensor_range: failed to allocate CPU buffer of size N",
# "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size N", "llama_kv_cache_init: failed to
# allocate buffer for kv cache": the function says which buffer, the buffer type which device
_FW_GGML_BUF = re.compile(r"\b(?P<fn>(?:ggml|llama|alloc)_\w+): failed to allocate (?:(?P<buft>[A-Za-z][\w-]*) )?"
                          r"buffer\b(?: of size (?P<n>\d+)| for (?P<kv>kv cache))?", re.IGNORECASE)
_GGML_DEVICE = re.compile(r"(?P<dev>CUDA|ROCm|HIP|Vulkan|SYCL|Metal|MUSA|CANN|OpenCL)(?P<i>\d*)", re.IGNORECASE)
GGML_COMPUTE_FROM = "ggml's compute-graph buffer (its size follows the batch, micro-batch and context)"
GGML_KV_FROM = "llama.cpp's KV-cache buffer (its size follows the context, -c)"
# PyTorch with a per-process memory fraction / ComfyUI: a head line, then one field per line
GGML_REASON = "a ggml backend buffer could not be allocated"
# the backend's own line opens a failure (a retry prints it again); its callers' lines follow it
_GGML_BACKEND = re.compile(r"cudaMalloc failed|_buffer_type_alloc_buffer:|of pinned memory", re.IGNORECASE)
# the backend's pinned host buffer: "ggml_backend_cuda_host_buffer_type_alloc_buffer: failed to allocate 8192.00 MiB of
# pinned memory: out of memory"
_FW_GGML_PINNED = re.compile(rf"_host_buffer_type_alloc_buffer: failed to allocate\s+(?P<v>{SIZE}) of pinned memory",
                             re.IGNORECASE)


def _ggml_buffer_event(m: re.Match[str], line: str) -> OomEvent:
    """ggml's failed buffer: the compute graph's (``ggml_gallocr_*``: what the batch and context need beside the
    weights), the KV cache's, or a tensor range's (the weights' or the cache's: the log's phase lines tell); on the
    host where the buffer type is the CPU's."""
    fn, buft = m.group("fn").lower(), m.group("buft") or ""
    dev = _GGML_DEVICE.match(buft)
    host = buft.upper().startswith("CPU") or buft.lower().endswith("_host") or "_cpu_" in fn or "_host_" in fn
    # (a backend's pinned host buffer, "CUDA_Host", is the host's memory)
    device, index = (("CPU", None) if host else ("GPU", int(dev.group("i")) if dev.group("i") else None) if dev
                     else ("", None))
    phase, said = ("warmup", GGML_COMPUTE_FROM) if "gallocr" in fn else (
        ("profile_run", GGML_KV_FROM) if m.group("kv") or "kv_cache" in fn else ("unknown", ""))
    return OomEvent(kind="framework", device=device, device_index=index, reason=GGML_REASON, phase=phase,
                    phase_from=said, requested=int(m.group("n")) if m.group("n") else None, message=line.strip())


_FW_FRACTION_HEAD = re.compile(r"would exceed allowed memory", re.IGNORECASE)
_FW_FIELD = re.compile(rf"^\s*(?P<k>Currently allocated|Requested|Device limit|Free \(according to CUDA\))\s*:\s*"
                       rf"(?P<v>{SIZE}|0 bytes)", re.IGNORECASE)
# the report's own analysis naming fragmentation as the cause (never PyTorch's standard hint)
_FRAG_CAUSAL = re.compile(
    r"(?:due to|caused by|because of|results? (?:from|of)|resulting from|comes? from)\s+(?:the\s+)?(?:\S+\s+){0,3}?"
    r"fragment\w*"
    r"|fragmentation\s+(?:\S+\s+){0,4}?(?:caus|lead|result|trigger|make|made)\w*"
    r"|(?:increas\w*|grow\w*|severe|heavy|significant\w*|substantial\w*|worse)\s+(?:\S+\s+){0,2}?fragmentation"
    r"|(?:resolv|fix|solv)\w*\s+(?:\S+\s+){0,6}?\S*expandable_segments"
    r"|expandable_segments:True\S*\s+(?:\S+\s+){0,4}?(?:fix|resolv|solv|help|work)\w*",
    re.IGNORECASE,
)
_FRAG_VETO = re.compile(
    r"\bnot\s+(?:\S+\s+){0,2}fragmentation|\bno\s+fragmentation|rules?\s+out\s+fragmentation|"
    r"(?:isn't|is not|wasn't|was not)\s+(?:\S+\s+){0,2}fragmentation|didn't help|did not help|no effect",
    re.IGNORECASE,
)
_STANDARD_HINT = re.compile(r"If reserved|try setting|See documentation for Memory Management", re.IGNORECASE)
# substrings one of which every line the OOM parser acts on contains (lower case)
_TRIGGERS = ("memory", "oom", "alloc", "resource_exhausted", "resourceexhausted", "resource exhausted",
             "prefill tokens", "cache blocks", "kv cache", "cudamalloc failed", "max seq len")
_RETRIES = re.compile(r"(?:cudaMalloc retries|num_alloc_retries['\"]?)\s*[:=|]\s*(?P<n>\d+)", re.IGNORECASE)
# a prose mention: "OOM occurs", "got an out of memory error", "显存不足"
_PROSE = re.compile(r"\bOOMs?\b|out[- ]of[- ]memory|显存不足|内存不足|显存溢出|内存溢出|爆显存",
                    re.IGNORECASE | re.ASCII)  # ASCII \b: "显存溢出OOM" (Chinese glued to the word)
def _stated_not_hedged(line: str) -> bool:
    """An OOM the line states before any hedge: "ends in out of memory, which could happen because of …" states one;
    "This can happen if device ran out of memory" only offers it."""
    hedge = _MAY_HAPPEN.search(line)
    return hedge is None or any(m.start() < hedge.start() for m in _PROSE.finditer(line))


# a cause offered as a possibility, as a tool's warning words it (nvprof's "==21941== Warning: This can happen if device
# ran out of memory or if a device kernel was stopped due to an assertion."): no OOM that happened
_MAY_HAPPEN = re.compile(r"\b(?:can|could|may|might) (?:happen|occur|be caused|result) (?:if|when|because|by)\b",
                         re.IGNORECASE)
# PyTorch's own hint, printed with every OOM: never evidence of anything by itself
_HINT = re.compile(r"expandable_segments|max_split_size_mb|See documentation for Memory Management", re.IGNORECASE)

_TRACE_FRAME = re.compile(r'\bFile\s+"(?P<path>[^"]+)",\s+line\s+\d+,\s+in\s+(?P<func>[\w<>.]+)')
_BARE_FRAME = re.compile(r"^\s*(?P<path>[\w./-]+\.py):\d+,?\s+in\s+(?P<func>[\w<>.]+)\s*$")
# a log-record prefix in front of traceback lines: "ERROR 10-11 12:27:29 engine.py:157] "
_RECORD_PREFIX = re.compile(
    r"^(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL)\s+\d{2}-\d{2}\s+[\d:.]+\s+(?:\[[^\]]*\]\s*)?[\w.]+:\d+\]\s?"
)


def is_oom_message(line: str) -> bool:
    """Whether one line carries an allocator's out-of-memory message (CUDA, ROCm, NPU, XPU, JAX, cuBLAS,
    cuDNN: the head ``parse_allocator_message`` reads), by its own wording, not a person's."""
    return _HEAD.search(line) is not None


def _size(rx: re.Pattern[str], text: str, *groups: str) -> int | None:
    m = rx.search(text)
    if not m:
        return None
    for g in groups or ("v",):
        val = m.groupdict().get(g)
        if val:
            return parse_size(val)
    return None


_DEVICE_HEAD = re.compile(r"\b(CUDA|NPU|XPU|HIP|MPS|MUSA|MLU)\s+(?:backend\s+)?out of memory", re.IGNORECASE)
_DEVICE_INDEX = re.compile(r"\((?:GPU|NPU|XPU|HIP|MLU)\s*(?P<i>\d+);|\b(?:GPU|NPU|XPU)\s+(?P<j>\d+)\s+has a total")
_LEGACY_OPEN = re.compile(r"\((?:GPU|NPU|XPU|HIP|MLU)\s*\d+;")


def _requoted(a: OomEvent, b: OomEvent) -> bool:
    """Whether ``b`` is ``a`` again, one of them cut short: the same request on a device of the same size, and no
    field both give that differs."""
    if a.kind != b.kind or a.kind != "allocator" or a.requested is None or a.requested != b.requested \
            or a.total is None or a.total != b.total:
        return False
    return all(x is None or y is None or x == y for x, y in ((a.free, b.free), (a.allocated, b.allocated),
                                                             (a.reserved, b.reserved), (a.limit, b.limit)))


def parse_allocator_message(text: str) -> OomEvent:
    """Read every field of one allocator message on its own, so a truncated one still yields some."""
    ev = OomEvent(kind="allocator", message=text.strip()[:2000])
    m = _DEVICE_HEAD.search(text)
    if m:
        ev.device = {"CUDA": "GPU", "HIP": "GPU"}.get(m.group(1).upper(), m.group(1).upper())
    m = _DEVICE_INDEX.search(text)
    if m:
        ev.device_index = int(m.group("i") or m.group("j"))
    if _HOST_ALLOCATOR.search(text):
        ev.device = "CPU"  # host memory: PyTorch's CPU allocator could not get the bytes from the system
    elif not ev.device and (_TF_SIZE.search(text) or "cuMemAllocAsync" in text):
        ev.device = "GPU"
    pm = _PADDLE_DEVICE.search(text)
    if pm:
        return _paddle_message(ev, text, pm)
    jm = _JAX_BYTES.search(text)  # the exact bytes where the message gives them, before its rounded size
    ev.requested = int(jm.group("v") or jm.group("v2") or jm.group("v3")) if jm else _size(_F_REQUESTED, text)
    ev.total = _size(_F_TOTAL, text, "v", "v2")
    ev.free = _size(_F_FREE, text, "v", "v2")
    if ev.free is not None and ev.total and ev.free > 1.01 * ev.total:
        # ROCm on an APU reports the system's memory as free beside the device's carve-out as its total
        # (ROCm/TheRock#4598: 84.98 GiB free of 15.49): neither can be trusted against the other, free is left out
        ev.implausible = (f"the message says {ev.free / 2**30:.2f} GiB free of a {ev.total / 2**30:.2f} GiB device, "
                          "more than the device has: its free memory is not used")
        ev.free = None
    ev.limit = _size(_F_ALLOWED, text)
    mps = ev.device == "MPS"
    if mps:
        ev.allocated = _size(_F_MPS_ALLOCATED, text)
        other = _size(_F_MPS_OTHER, text)
        ev.limit = _size(_F_MPS_CAP, text)
        if ev.allocated is not None:
            ev.process_used = ev.allocated + (other or 0)
    legacy = not mps and (_F_ALREADY.search(text) is not None or _F_RESERVED_TOTAL.search(text) is not None
                          or _LEGACY_OPEN.search(text) is not None)
    modern = re.search(r"has a total capac", text, re.IGNORECASE) is not None or _F_BY_PYTORCH.search(text)
    expected: dict[str, int | None]
    if mps:  # no device total (the memory is the system's) and no free: the cap is what the process hits
        expected = {"requested": ev.requested, "allocated": ev.allocated, "limit": ev.limit}
    elif legacy:
        ev.allocated = _size(_F_ALREADY, text)
        ev.reserved = _size(_F_RESERVED_TOTAL, text)
        if ev.allocated is not None and ev.reserved is not None:
            ev.reserved_unallocated = max(0, ev.reserved - ev.allocated)
        cached = _size(_F_CACHED, text) if ev.reserved is None else None
        if cached is not None:
            ev.reserved_unallocated = cached
            ev.reserved = None if ev.allocated is None else ev.allocated + cached
        expected = {"requested": ev.requested, "total": ev.total, "allocated": ev.allocated,
                    "free": ev.free, "reserved": ev.reserved}
    elif modern:
        ev.allocated = _size(_F_BY_PYTORCH, text)
        ev.reserved_unallocated = _size(_F_UNALLOC, text)
        ev.private_pools = _size(_F_POOLS, text)
        ev.process_used = _size(_F_THIS_PROCESS, text)
        if ev.allocated is not None and ev.reserved_unallocated is not None:
            ev.reserved = ev.allocated + ev.reserved_unallocated
        ev.other_processes = [(int(p.group("pid")), parse_size(p.group("v")) or 0)
                              for p in _F_PROCESS.finditer(text)]
        ends = _LIST_ENDS.search(text)
        ev.process_list_whole = ends is not None and (not ends["w"] or "allocated".startswith(ends["w"].lower()))
        expected = {"requested": ev.requested, "total": ev.total, "free": ev.free,
                    "allocated": ev.allocated, "reserved_unallocated": ev.reserved_unallocated}
        if not ev.other_processes:
            expected["process_used"] = ev.process_used
        head = (m.group(1).upper() if (m := _DEVICE_HEAD.search(text)) else "")
        if head in ("HIP", "XPU"):  # ROCm's message never says what this process uses, XPU's what is free either
            expected.pop("process_used", None)
        if head == "XPU" or ev.implausible:
            expected.pop("free", None)
    elif ev.requested is not None and _F_REQUESTED.search(text) and not _JAX_BYTES.search(text) \
            and not _TF_SIZE.search(text):
        # "Tried to allocate X" and nothing after it: the device numbers were cut off (TensorFlow's BFC allocator says
        # only what it asked for, "ran out of memory trying to allocate 9.00MiB", whole: its numbers are in its dump)
        expected = {"total": None, "free": None, "allocated": None}
    else:
        expected = {}
    ev.missing = tuple(k for k, v in expected.items() if v is None)
    ev.truncated = bool(ev.missing)
    return ev


def _paddle_message(ev: OomEvent, text: str, m: re.Match[str]) -> OomEvent:
    """PaddlePaddle's message: the request, what its allocator holds on the device (like PyTorch's reservation, the
    process' CUDA context aside), the device's free memory; no device total."""
    ev.device = m.group("dev").upper()
    ev.device_index = int(m.group("i"))
    ev.requested = _size(_F_PADDLE_ASK, text)
    ev.reserved = _size(_F_PADDLE_HELD, text)
    ev.free = _size(_F_PADDLE_FREE, text)
    expected = {"requested": ev.requested, "free": ev.free}
    ev.missing = tuple(k for k, v in expected.items() if v is None)
    ev.truncated = bool(ev.missing)
    return ev


# TensorFlow maps a full disk or a quota to RESOURCE_EXHAUSTED too ("ResourceExhaustedError: …; No space left on
# device [Op:SaveV2]", "Resource exhausted: disk quota exceeded"; keras-team/keras-tuner#390)
_NOT_MEMORY_EXHAUSTED = re.compile(r"Resource ?exhausted(?:Error)?\b[^\n]*(?:No space left on device|quota|SaveV2)",
                                   re.IGNORECASE)
_TF_MESSAGE = re.compile(r"bfc_allocator|_bfc\b|OOM when allocating tensor|ResourceExhaustedError|Resource exhausted:")
_CLASS_ONLY = re.compile(r"(?:[\w.]+\.)?ResourceExhaustedError\s{2,}Traceback \(most recent call last\)\s*")


def _class_only(ev: OomEvent) -> bool:
    """An event read from TensorFlow's exception class alone: nothing of the failure but that it happened."""
    return ev.kind == "allocator" and ev.requested is None and _CLASS_ONLY.fullmatch(ev.message.strip()) is not None


def _needs_more(text: str) -> bool:
    """Whether an allocator message looks cut at a line break (a wrapped paste), not finished."""
    m = _LEGACY_OPEN.search(text)
    if m:
        return ")" not in text[m.end():]
    if re.search(r"has a total capac", text, re.IGNORECASE):
        return "unallocated" not in text
    return bool(re.search(r"Tried to allocate\s*$|Tried to allocate [^.(]*$", text))


# ---------------------------------------------------------------------------------------------
# the phase, from traceback frames
# ---------------------------------------------------------------------------------------------

_LOADING_FUNCS = {
    "load_model", "load_weights", "_load_weights", "from_pretrained", "_from_pretrained",
    "load_state_dict", "_load_state_dict_into_model", "_load_state_dict_into_meta_model",
    "load_checkpoint", "load_checkpoint_and_dispatch", "_load_pretrained_model", "get_model",
    "initialize_model", "_initialize_model", "load_weights_and_postprocess", "weight_loader",
    "default_weight_loader", "process_weights_after_loading", "dispatch_model", "load_sharded_checkpoint",
    "init_model", "_init_model", "build_model", "load_model_weights", "load_pretrained",
}
_LOADING_PATHS = ("model_loader", "weight_utils", "modeling_utils.py", "safetensors", "accelerate/big_modeling")
# TensorFlow and Keras create a layer's weights the first time it is called: __call__ → build → add_weight /
# get_variable (tf.compat.v1's variable_scope.py) allocates variables, not a batch's activations
_TF_WEIGHT_FUNCS = {"build", "add_weight", "add_variable", "get_variable", "_add_variable_with_custom_getter",
                    "make_variable", "_true_getter", "_get_single_variable"}
_TF_PATHS = ("tensorflow", "keras", "tf_keras")
_PROFILE_FUNCS = {
    "profile_run", "determine_num_available_blocks", "_dummy_run", "determine_available_memory",
    "_initialize_kv_caches", "initialize_cache", "_init_cache", "_allocate_kv_cache", "allocate_kv_cache",
    "init_cache_engine", "_profile_run", "profile_memory", "initialize_kv_cache", "get_kv_cache_spec",
}
_WARMUP_FUNCS = {
    "capture_model", "capture", "_capture_cudagraphs", "warmup", "warm_up", "_warmup", "warmup_model",
    "compile_or_warm_up_model", "_dummy_sampler_run", "_dummy_pooler_run", "warmup_kernels",
    "graph_capture", "capture_cuda_graph",
}
_SERVING_FUNCS = {
    "execute_model", "step", "run_engine_loop", "engine_step", "run_busy_loop", "_process_engine_step",
    "generate", "_run_engine", "forward", "step_async", "engine_step_async", "run_batch", "predict",
    "infer", "handle_request", "_generate", "sample", "decode", "prefill", "execute",
    "process_input_queue", "run_model", "model_forward", "_model_forward", "__call__",
    # SGLang's scheduler loop and its steps (sglang/srt/managers/scheduler.py, tp_worker.py)
    "event_loop_normal", "event_loop_overlap", "event_loop_pp", "get_next_batch_to_run", "get_new_batch_prefill",
    "update_running_batch", "process_batch_result", "forward_batch_generation",
}
_MODEL_PATH = re.compile(r"/models?/|modeling_|/layers?[/.]|/nn/modules/|model_executor")
_TO_DEVICE = re.compile(
    r"\.(?:to|cuda|npu)\(\s*(?:['\"]?(?:cuda|npu|xpu)|device|self\.device|[a-z_]*device)|\.cuda\(\)"
)
_PARAM_CODE = re.compile(r"\bParameter\(|torch\.empty\(|torch\.zeros\(|torch\.randn\(")
_STARTUP_FUNCS = {"<module>", "main", "__init__", "setup", "init", "_init", "start", "launch"}


_CALLEE = re.compile(r"([A-Za-z_]\w*)\s*\(")


def frame_phase(fr: Frame) -> tuple[str, str] | None:
    """The phase one frame (or the call on its code line) says the process was in, and which name said it."""
    best: tuple[str, str] | None = None
    own = _own_phase(fr)
    if own is not None:
        best = (own, fr.func)
    for callee in _CALLEE.findall(fr.code):
        ph = _own_phase(Frame("", callee))
        if ph is not None and (best is None or PHASES.index(ph) < PHASES.index(best[0])):
            best = (ph, f"{fr.func} → {callee}()")
    return best


def _own_phase(fr: Frame) -> str | None:
    func = fr.func.rsplit(".", 1)[-1]
    path = fr.path.replace("\\", "/")
    if func in _LOADING_FUNCS or any(p in path for p in _LOADING_PATHS):
        return "loading"
    if func in _TF_WEIGHT_FUNCS and any(p in path for p in _TF_PATHS):
        return "loading"  # a layer creating its variables on its first call
    if func == "__init__" and _MODEL_PATH.search(path):
        return "loading"  # constructing the model allocates its parameters
    if _PARAM_CODE.search(fr.code) and func in {"__init__", "_init_weights", "create_weights", "reset_parameters"}:
        return "loading"
    if _TO_DEVICE.search(fr.code) and (func in _STARTUP_FUNCS or func.startswith(("load", "init", "setup"))):
        return "loading"
    if func in _PROFILE_FUNCS:
        return "profile_run"
    if func in _WARMUP_FUNCS:
        return "warmup"
    if func in _SERVING_FUNCS:
        return "serving"
    return None


def phase_of(frames: list[Frame]) -> tuple[str, str]:
    """The phase of a traceback (precedence loading > profile_run > warmup > serving) and what said it."""
    best: tuple[int, str, str] | None = None
    for fr in frames:
        got = frame_phase(fr)
        if got is None:
            continue
        rank = PHASES.index(got[0])
        if best is None or rank < best[0]:
            best = (rank, got[0], f"{got[1]} in {fr.path.replace(chr(92), '/').rsplit('/', 1)[-1]}")
    if best is None:
        return "unknown", ""
    return best[1], best[2]


# ---------------------------------------------------------------------------------------------
# model and hardware hints
# ---------------------------------------------------------------------------------------------

_FAMILIES = (
    "llama", "qwen", "mistral", "mixtral", "gemma", "phi", "falcon", "gpt", "opt", "bloom", "deepseek",
    "yi", "baichuan", "chatglm", "glm", "internlm", "intern", "vicuna", "starcoder", "command", "dbrx",
    "olmo", "granite", "nemotron", "jamba", "arctic", "grok", "minicpm", "aquila", "solar", "zephyr",
    "hermes", "wizard", "t5", "pythia", "stablelm", "mpt", "kimi", "ernie", "hunyuan", "exaone", "mamba",
    "codegen", "santacoder", "orion", "skywork", "xverse", "telechat", "minimax", "seed", "llava", "vl",
    "chat", "instruct", "coder",
)
# (after an underscore too: "Vicuna_13b", "llama_7b_hf")
_PARAMS = re.compile(r"(?<![A-Za-z0-9.])(?:(?P<n>\d+)x)?(?P<b>\d+(?:\.\d+)?)\s?(?P<u>[bBmM])(?![a-zA-Z0-9])",
                     re.ASCII)
_WORD = re.compile(r"[A-Za-z0-9_./:+-]+")
_LAUNCH = re.compile(
    r"vllm\s+serve\s+(?P<m1>\S+)|--model(?:[=\s]+)(?P<m2>\S+)|--model-id(?:[=\s]+)(?P<m3>\S+)"
    r"|--model-path(?:[=\s]+)(?P<m4>\S+)|\bLLM\(\s*(?:model\s*=\s*)?['\"](?P<m5>[^'\"]+)['\"]"
    r"|from_pretrained\(\s*['\"](?P<m6>[^'\"]+)['\"]"
)
# a command line's quantisation or dtype flag (``--quantization awq``, ``-q fp8``, ``--quantize bitsandbytes``,
# ``--load-format bitsandbytes``, ``--dtype``, ``--kv-cache-dtype`` aside): the checkpoint is not loaded as published
_QUANT_FLAG = re.compile(r"--quantiz\w*|(?<!\S)-q[= ]\S|--load[-_]format[= ]\S*bitsandbytes|--dtype\b|--load[-_]in"
                         # ... or the engine's configuration saying it ("quantization=awq_marlin" in vLLM's banner)
                         r"|\bquantization\s*[=:]\s*['\"]?(?!None\b)\w")
# models published quantised under a name that says no quantisation: gpt-oss (MXFP4), DeepSeek-V3/R1 and Kimi-K2
# (FP8; R1's distills are BF16): as published is not 16-bit
_PUBLISHED_QUANTISED = re.compile(r"gpt-oss|deepseek-(?:v3|r1)(?![\w.-]*distill)|kimi-k2", re.IGNORECASE)
_TP = re.compile(
    r"(?:--tensor[-_]parallel[-_]size|--tp[-_]size|--tp|-tp|tensor_parallel_size|--num[-_]shard|tp_size)"
    r"\s*[=\s]\s*(?P<n>\d+)|\bTP\s?(?P<m>\d+)\b"
)
# a rank, not a size: the rank in a log record's prefix (SGLang's "[2025-03-07 21:49:33 TP13]", "[… DP0 TP3]") or a
# worker's name (vLLM's "(VllmWorker TP1 pid=…)", "(Worker_TP1 pid=…)")
_TP_RANK = re.compile(r"\[[^\]\n]*\d:\d\d[^\]\n]*?\bTP(?P<r>\d+)\b[^\]\n]*\]|Worker[_ ]TP(?P<w>\d+)\b")
_PP = re.compile(r"(?:--pipeline[-_]parallel[-_]size|-pp|pipeline_parallel_size)\s*[=\s]\s*(?P<n>\d+)")
_UTIL = re.compile(r"gpu[-_]memory[-_]utilization\s*[=:\s]\s*\(?(?P<v>0?\.\d+|1(?:\.0+)?)\b", re.IGNORECASE)
_WEIGHTS_TOOK = re.compile(
    rf"(?:model weights|Loading model weights|weights)\s+(?:took|take|takes|use|used)\s+(?P<v>{SIZE})"
    rf"|\bweights memory:\s*(?P<v1>{SIZE})"  # vLLM V1's "Memory profiling takes …; weights memory: 14.99GiB."
    rf"|\bModel loading took\s+(?P<v2>{SIZE})"  # vLLM V1's gpu_model_runner: "Model loading took 65.97 GiB and …"
    # SGLang's model runner: "Load weight end. type=Gemma3ForConditionalGeneration, dtype=torch.bfloat16, avail
    # mem=3.64 GB, mem usage=18.82 GB." (the device's memory the load took; GB as it prints GiB)
    rf"|\bLoad weight end\b[^\n]*?\bmem usage\s*=\s*(?P<v3>{SIZE})",
    re.IGNORECASE,
)
_VISIBLE = re.compile(r"CUDA_VISIBLE_DEVICES\s*=\s*['\"]?(?P<ids>\d+(?:\s*,\s*\d+)*)")
_GPU_MODELS: dict[str, float] = {  # GiB of device memory of common accelerators (the usual variant)
    "h200": 141, "h100": 80, "h800": 80, "h20": 96, "a100": 80, "a800": 80, "l40s": 48, "l40": 48,
    "a6000": 48, "a40": 48, "a10g": 24, "a10": 24, "l4": 24, "t4": 16, "v100": 32, "4090": 24, "3090": 24,
    "a30": 24, "a5000": 24, "a4000": 16, "mi300x": 192, "mi250": 128, "910b": 64, "b200": 192, "gh200": 96,
    "rtx 6000 ada": 48, "6000 ada": 48, "4080": 16, "3080": 10, "2080": 8, "p100": 16, "k80": 12,
    "5090": 32, "5080": 16, "4070": 12, "4060": 8, "4050": 6, "3070": 8, "3060": 12, "2070": 8, "2060": 6,
    "1080 ti": 11, "1080": 8, "1070": 8, "1060": 6, "1660": 6, "p40": 24, "m60": 8,
    "l20": 48, "rtx pro 6000": 96, "mi210": 64, "mi100": 32, "7900 xtx": 24, "a5500": 24,
    # the Ti and Super parts of a number differ in memory from the plain one ("2080 Ti" 11 GB, "2080" 8 GB; "3060 Ti"
    # 8 GB, "3060" 12 GB): written with a space, a hyphen or glued ("2080ti")
    "2080 ti": 11, "2080 super": 8, "2070 super": 8, "2060 super": 8, "3090 ti": 24, "3080 ti": 12, "3070 ti": 8,
    "3060 ti": 8, "4080 super": 16, "4070 ti super": 16, "4070 ti": 12, "4070 super": 12, "4060 ti": 8,
    "1660 ti": 6, "1660 super": 6, "1070 ti": 8,
}
# GPUs sold with more than one memory size: a name without a size leaves the choice open
GPU_VARIANTS: dict[str, tuple[float, ...]] = {
    "a100": (40, 80), "a800": (40, 80), "v100": (16, 32), "h100": (80, 94), "p100": (12, 16), "mi250": (64, 128),
    "4060 ti": (8, 16),
}
# a name's words may be joined by a space, a hyphen or nothing ("2080 Ti", "2080-Ti", "2080ti")
_GPU_NAME = "|".join(sorted((re.escape(k).replace(r"\ ", r"[\s-]?") for k in _GPU_MODELS), key=len, reverse=True))


_GPU_KEYS = {re.sub(r"[\s-]", "", k): k for k in _GPU_MODELS}


def _gpu_key(name: str) -> str:
    """The table's key of a GPU name as ``_GPU_SPEC`` matched it ("2080-Ti", "2080ti" → "2080 ti"; the pattern is
    case-blind over ASCII letters only, so every match has a key)."""
    return _GPU_KEYS[re.sub(r"[\s-]", "", name.lower())]
_GPU_SPEC = re.compile(
    # a GPU's name stands alone: inside a file or model name ("tinyllama-L4-H256.gguf", "/models/t4_int8")
    # it names no device, so a name glued to "-", "_" or "/" before it, or to "_" or "-word" after it, is none
    rf"(?:(?<![A-Za-z0-9._/-])(?P<n>\d+)\s*(?:(?:x|×|\*|张|块|台|个)\s*)?|(?<![A-Za-z0-9._/-]))(?:NVIDIA\s+)?"
    rf"(?P<pre>Tesla\s+|GeForce\s+(?:RTX|GTX)\s+|RTX\s+|GTX\s+|GeForce\s+|Ascend\s+|Radeon\s+(?:RX\s+)?|RX\s+)?"
    rf"(?P<gpu>{_GPU_NAME})(?![a-zA-Z0-9_]|\.\d|-(?!SXM|PCIe|NVL)[A-Za-z])(?:[\s-]*(?:(?:SXM\d?|PCIe|NVL)[\s-]*)?(?P<mem>\d+)\s?G(?:i?B)?\b)?"
    rf"(?P<suf>\s*(?:GPUs?|cards?|显卡|卡))?",
    re.IGNORECASE | re.ASCII,  # ASCII: case-blind over ASCII letters only (a Turkish "Tİ" is no "ti")
)


@dataclass(frozen=True)
class NamedGpu:
    """A GPU a text names: its model (upper case), its device memory (the size in the name, else the model's
    usual one: ``assumed`` then lists the sizes it is sold with) and how many, where the text counts them."""

    model: str
    memory_bytes: int
    assumed: tuple[float, ...]
    count: int | None


# a bare model number is a GPU where a person owns or points at it and a clause goes on after it: "I have a 3060 and
# a core i9", "my 3090 to slow down", "why is the A100 as fast as the 3090?" (not "the 1080 build", "took 4090 ms")
_OWNED_BEFORE = re.compile(r"\b(?:a|an|my|our|the|his|her|their|your|one|single)\s+$", re.IGNORECASE)
_OWNED_AFTER = re.compile(r"(?:\s*(?:$|[,.;:!?)'’])|\s+(?:and|with|on|in|but|which|that|to|is|was|has|had|runs?"
                          r"|gets?|can|could|does|did|at|for|or|fills?|maxes|takes?|only)\b)", re.IGNORECASE)


# ... but not a picture's size beside it: "decoding a 1080 and a 4K stream", "each frame is a 1080 with 3 channels"
_PICTURE_WORDS = re.compile(r"\b(?:streams?|frames?|videos?|images?|resolution|width|height|pixels?|px|fps|channels?|4K"
                            r"|720p?|1440p?|2160p?)\b", re.IGNORECASE)


def gpu_named(text: str) -> NamedGpu | None:
    """The first GPU ``text`` names by a known model ("NVIDIA A100-SXM4-80GB", "2x H100", "RTX 4090"); None when
    it names none (a bare number counts only with a prefix, "NVIDIA" before it, a suffix, a word of its model's
    own, or a person's "a"/"my"/"the" before it with the clause going on after it: "4090" alone may be anything,
    "1660 ti" and "I have a 3060 and" are GPUs; "910B" alone is a file's size as often)."""
    m = next((g for g in _GPU_SPEC.finditer(text)
              if not g.group("gpu")[0].isdigit() or g.group("pre") or g.group("suf")
              or g.group(0).lstrip()[:6].lower() == "nvidia" or " " in _gpu_key(g.group("gpu"))
              or (_OWNED_BEFORE.search(text, 0, g.start("gpu")) and _OWNED_AFTER.match(text, g.end("gpu"))
                  and not _PICTURE_WORDS.search(text, max(0, g.start("gpu") - 13), g.end("gpu") + 10))), None)
    if m is None:
        return None
    mem = m.group("mem")
    key = _gpu_key(m.group("gpu"))
    gib = float(mem) if mem else _GPU_MODELS[key]
    count = int(m.group("n")) if m.group("n") and 1 <= int(m.group("n")) <= 1024 else None
    return NamedGpu(key.upper(), int(gib * GIB), () if mem else GPU_VARIANTS.get(key, ()), count)


_GPU_MEM_PROSE = re.compile(
    r"(?<![\w.])(?P<v>\d{1,3}(?:\.\d+)?)\s?(?:GB|GiB|G)\b\)?\s*(?:of\s+|的)?(?:\w+\s+)?(?:GPU|VRAM|video memory|显存"
    r"|显卡|graphics card|card)s?(?![A-Za-z])|(?:GPU memory|VRAM|显存)\s*(?:is|of|:|：|=|只有|有)?\s*~?"
    r"(?P<w>\d{1,3}(?:\.\d+)?)\s?(?:GB|GiB|G)\b",
    re.IGNORECASE | re.ASCII,  # ASCII \w and \b: "使用49G的显卡" (Chinese glued to the number and the unit)
)
# (a number glued to letters is a model's: "RTX3070 GPUs")
_GPU_COUNT = re.compile(r"(?<![\w.])(?P<n>\d+)\s*(?:x\s*)?(?:GPUs|gpus|张卡|块卡|cards)\b", re.ASCII)
# a count, or a GPU family's name, right before a number: that number is the GPU's model ("four 4090 cards", "8x 3090
# GPUs", "RTX 4090 GPUs"), not how many there are
_COUNTED_BEFORE = re.compile(r"(?:\b(?:rtx|gtx|rx|titan|quadro|tesla|radeon|geforce|two|three|four|five|six|seven|eight"
                             r"|nine|ten|twelve|sixteen|dual|quad)|\d\s*x|\d)\s+$", re.IGNORECASE)
# what a model, a run or another program needs or holds, not what the device has: "the model requires 13GB of GPU
# memory", "Windows (the OS) was taking around 1GB of VRAM" (sglang#4840)
_NEEDS_BEFORE = re.compile(r"\b(?:requir|need|take|taking|took|consum|occup|allocat|us(?:e|es|ing)\b|eat)\w*\s+"
                           r"(?:\w+\s+){0,2}"
                           r"(?:about\s+|around\s+|~\s*)?$", re.IGNORECASE)
_ENGINE_WORDS = ("vllm", "text-generation-", "tgi", "sglang", "tritonserver", "triton inference", "lmdeploy",
                 "tensorrt", "trtllm", "trt-llm", "llama.cpp", "llama-server", "llama_cpp", "llamacpp", "ollama")
_ENGINES = (
    ("vllm", re.compile(r"\bvllm\b|vLLM", re.IGNORECASE)),
    # (its name as a word in any case: "I deploy … with tgi", not after a path's slash; in capitals anywhere,
    # "HF-TGI", "…/TGI"; a word glued into another, "tgis", is none)
    ("tgi", re.compile(r"text-generation-(?:launcher|inference|router)|(?<![\w/.-])(?i:tgi)(?![\w-])|\bTGI\b")),
    ("sglang", re.compile(r"\bsglang\b", re.IGNORECASE)),
    ("triton", re.compile(r"\btritonserver\b|Triton Inference Server")),
    ("lmdeploy", re.compile(r"\blmdeploy\b", re.IGNORECASE)),
    ("tensorrt-llm", re.compile(r"tensorrt[-_ ]?llm|\btrtllm\b|\btrt-llm\b", re.IGNORECASE)),
    ("llama.cpp", re.compile(r"llama\.cpp|llama-server|llama_cpp|\bllamacpp\b", re.IGNORECASE)),
    ("ollama", re.compile(r"\bollama\b", re.IGNORECASE)),
)

_DTYPES: tuple[tuple[re.Pattern[str], str, float], ...] = (
    # llama.cpp's GGUF quantisations by their bits per weight (Q4_K_M ≈ 4.8, Q8_0 ≈ 8.5, IQ3_XXS ≈ 3.1), always
    # with their variant ("Q2 2024" is a quarter)
    (re.compile(r"\bi?q2(?:_[a-z0-9]+)+\b", re.IGNORECASE), "2-bit (GGUF)", 0.33),
    (re.compile(r"\bi?q3(?:_[a-z0-9]+)+\b", re.IGNORECASE), "3-bit (GGUF)", 0.45),
    (re.compile(r"\bi?q4(?:_[a-z0-9]+)+\b", re.IGNORECASE), "4-bit (GGUF)", 0.6),
    (re.compile(r"\bi?q5(?:_[a-z0-9]+)+\b", re.IGNORECASE), "5-bit (GGUF)", 0.7),
    (re.compile(r"\bi?q6(?:_[a-z0-9]+)+\b", re.IGNORECASE), "6-bit (GGUF)", 0.82),
    (re.compile(r"\bq8(?:_[a-z0-9]+)+\b", re.IGNORECASE), "8-bit (GGUF)", 1.06),
    # (as a word, or a part of a method's name: vLLM's "awq_marlin", "gptq_marlin", "fbgemm_fp8"; bitsandbytes loads
    # 4-bit unless told 8)
    (re.compile(r"(?<![A-Za-z])(?:awq|gptq|int4|nf4|fp4|mxfp4|nvfp4|w4a16|w4a8|q4|4[- ]?bits?|bnb[-_]4bit|exl2"
                r"|bitsandbytes)(?![A-Za-z])", re.IGNORECASE), "4-bit", 0.5),
    (re.compile(r"(?<![A-Za-z])(?:int8|fp8|w8a8|w8a16|8[- ]?bits?|q8|bnb[-_]8bit)(?![A-Za-z])", re.IGNORECASE),
     "8-bit", 1.0),
    # (vLLM's and transformers' "float" is float32: "--dtype=float", "dtype: float", vllm#2140)
    # (only an engine's flag, a config's key or torch's own name: numpy's "dtype=float" in a call is float64 data)
    (re.compile(r"\b(?:fp32|float32)\b|--dtype[= ]['\"]?float\b(?![\d_])"
                r"|(?:^|[\s{,])['\"]?(?:torch_)?dtype['\"]?\s*:\s*['\"]?float\b(?![\d_])"
                r"|\btorch_dtype\s*=\s*torch\.float\b(?![\d_])", re.IGNORECASE), "fp32", 4.0),
    (re.compile(r"\b(?:fp16|bf16|f16|float16|bfloat16|half)\b", re.IGNORECASE), "16-bit", 2.0),
)


def _dtype_of(text: str) -> tuple[str, float] | None:
    for rx, name, nbytes in _DTYPES:
        if rx.search(text):
            return name, nbytes
    return None


def _model_params(word: str, line: str) -> float | None:
    """A parameter count in a model-name-like word (``Qwen1.5-72B-Chat`` → 72e9), or None."""
    low = word.lower()
    for m in _PARAMS.finditer(word):
        start = m.start()
        if start > 0 and word[start - 1].isalpha() and word[start - 1] in "aA":
            continue  # "30B-A3B": the active-parameter count of a MoE, not its size
        scale = 1e9 if m.group("u") in "bB" else 1e6
        value = float(m.group("b")) * scale * (int(m.group("n")) if m.group("n") else 1)
        if not 1e8 <= value <= 3e12:
            continue
        named = any(f in low for f in _FAMILIES) or bool(re.search(r"[a-z][\w.]*[-_/]", low[:start]))
        if not named and start == 0:  # "Llama-2 7B", "Qwen2.5 72B": the family is the word before
            at = line.find(word)
            before = line[max(0, at - 24):at].lower() if at > 0 else ""
            named = bool(before.strip()) and any(f in before.split()[-1] for f in _FAMILIES)
        if named or re.search(r"\bmodels?\b|模型|参数|parameters?", line, re.IGNORECASE | re.ASCII):
            return value
    return None


# an ollama library tag: a name (a registry path before it), a colon, the size ("deepseek-coder:6.7b",
# "llama2:13b-chat", "qwen2.5:72b", "mixtral:8x7b", "registry.ollama.ai/library/llama3:8b")
_OLLAMA_TAG = re.compile(r"[\w./-]+:(?:[\w.]+-)?(?:\d+x)?\d+(?:\.\d+)?[bBmM](?:-[\w.-]+)?")
OLLAMA_DEFAULT_DTYPE = "4-bit assumed, ollama's default for a tag that names no quantisation"


def ollama_tag_default(h: ModelHints) -> tuple[str, float] | None:
    """An ollama tag that names no quantisation pulls a 4-bit GGUF (ollama's library default, Q4_0 then Q4_K_M): its
    weights are about 0.6 bytes a parameter, not 16-bit's 2, where the text names ollama and states no dtype. An
    assumption, as 16-bit's is: (the dtype's words, bytes a parameter), or None."""
    if h.engine == "ollama" and not h.dtype and _OLLAMA_TAG.fullmatch(h.model or ""):
        return OLLAMA_DEFAULT_DTYPE, 0.6
    return None


def model_hints(name: str) -> ModelHints | None:
    """What a model's name alone says (``Qwen/Qwen2.5-7B-Instruct``: 7e9 parameters; ``-AWQ``: 4-bit), read from
    a field that holds one (a metric's ``model_name`` label); None when the name states no size."""
    params = _model_params(name, name)
    if params is None:
        return None
    hints = ModelHints(model=name, params=params)
    dt = _dtype_of(name)
    if dt:
        hints.dtype, hints.bytes_per_param = dt
    return hints


_CPU_PCT = re.compile(r"(?<![A-Za-z])CPU(?![A-Za-z])[^%\d]{0,40}?(?P<pct>\d{1,4}(?:\.\d+)?)\s*%", re.IGNORECASE)
_LOADING_WORDS = re.compile(
    r"\bload(?:ing|s)?\b.{0,30}\b(?:model|weights?|checkpoints?|safetensors)|\b(?:model|weights?)\s+load(?:ing)?"
    r"|读取模型|加载模型|模型加载|读取权重|加载权重",
    re.IGNORECASE,
)
_AFTER_LOADING = re.compile(
    r"(?:after|once)\b.{0,60}\b(?:loaded|deployed|started|up|ready|serving)\b.{0,60}\b(?:normal|drops?|idle|low)"
    r"|部署好后.{0,20}正常|加载完.{0,20}正常|启动后.{0,20}正常|恢复正常|回复正常",
    re.IGNORECASE,
)


def _cpu_hints(line: str, hints: ModelHints) -> bool:
    """CPU load reported around weight loading (a common worry that is healthy)."""
    said = False
    m = _CPU_PCT.search(line)
    if m and _LOADING_WORDS.search(line):
        hints.cpu_loading_pct, said = float(m.group("pct")), True
    if _AFTER_LOADING.search(line) and (hints.cpu_loading_pct is not None or re.search(r"CPU", line)):
        hints.cpu_after_loading_normal, said = True, True
    return said


# vLLM's memory profiling at start-up, after the weights are loaded. 0.6.x (worker.py,
# determine_num_available_blocks): "Memory profiling results: duration=1.52 seconds, total_gpu_memory=79.15GiB,
# initial_memory_usage=68.01GiB, peak_torch_memory=…, memory_usage_post_profile=…, non_torch_memory=0.47GiB,
# kv_cache_size=…, gpu_memory_utilization=0.20." (space-separated in 0.6.3-0.6.4.post1, commas and a duration in
# a later form), where initial_memory_usage is
# total − free (every process's use, this instance's weights included) and non_torch_memory is the device's use less
# this process' PyTorch tensors (other processes' memory included); 0.7.x: "the current vLLM instance can use
# total_gpu_memory (44.35GiB) x gpu_memory_utilization (0.42) = 18.63GiB; model weights take 8.32GiB; …"
_PROFILE_FIELD = re.compile(
    r"\b(?P<k>total_gpu_memory|initial_memory_usage|non_torch_memory)(?:=|\s+\()(?P<v>\d+(?:\.\d+)?)(?P<u>[KMGT]i?B)\b")


def _profile(line: str, hints: ModelHints) -> bool:
    said = False
    for m in _PROFILE_FIELD.finditer(line):
        v = parse_size(f"{m.group('v')} {m.group('u')}")
        if not v:
            continue
        k = m.group("k")
        if k == "total_gpu_memory":
            hints.device_total = v
            if hints.gpu_memory_bytes is None:  # the device's size, measured: no size read from prose after it
                hints.gpu_memory_bytes = v
        elif k == "initial_memory_usage":
            hints.profile_used = v
        else:
            hints.profile_non_torch = v
        said = True
    return said


# TensorFlow 1.x's device creation (common_runtime/gpu/gpu_device.cc): "Found device 0 with properties:" and, a few
# lines on, "Total memory: 7.92GiB" / "Free memory: 190.31MiB" (1.0-1.4); one line from 1.5 on ("name: … major: 6
# minor: 1 … totalMemory: 10.92GiB freeMemory: 10.76GiB"). What the device had free before TensorFlow allocated
# anything: the rest was another process' (and this one's CUDA context)
_TF_FOUND = re.compile(r"\bFound device \d+ with properties")
TF_BLOCK_LINES = 8  # name, compute capability, clock, bus id, total, free: the block's lines after its head
_TF_TOTAL = re.compile(rf"^\s*Total memory:\s*(?P<v>{SIZE})\s*$", re.IGNORECASE)
_TF_FREE = re.compile(rf"^\s*Free memory:\s*(?P<v>{SIZE})\s*$", re.IGNORECASE)
_TF_ONE_LINE = re.compile(rf"\btotalMemory:\s*(?P<t>{SIZE})\s+freeMemory:\s*(?P<f>{SIZE})")


class _TfDeviceBlock:
    """TensorFlow's device block, line by line: each device's (total, free), read only a few lines after its "Found
    device N with properties:" (a host's "Total memory:" dump or a script's own printout is no device creation)."""

    def __init__(self) -> None:
        self._left = 0  # lines left of the block
        self._total: int | None = None  # a "Total memory:" line whose "Free memory:" comes next

    def feed(self, line: str, devices: list[tuple[int, int]]) -> bool:
        """Read ``line``; True when it completed a device's reading (appended to ``devices``)."""
        if "Found device" in line and _TF_FOUND.search(line):
            self._left = TF_BLOCK_LINES
            return False
        if self._left <= 0:
            return False
        self._left -= 1
        if self._left == 0 or "memory:" not in line.lower():
            self._total = None  # the free line must follow the total line, inside the block
            return False
        m = _TF_ONE_LINE.search(line)
        if m:
            total, free = parse_size(m.group("t")), parse_size(m.group("f"))
            if total and free is not None and free <= total:
                devices.append((total, free))
                return True
            return False
        m = _TF_TOTAL.match(line)
        if m:
            self._total = parse_size(m.group("v"))
            return False
        m = _TF_FREE.match(line)
        total, self._total = self._total, None
        if m and total:
            free = parse_size(m.group("v"))
            if free is not None and free <= total:
                devices.append((total, free))
                return True
        return False


_PARAMS_QUICK = re.compile(r"\d\s?[bBmM](?![a-zA-Z0-9])")
_GPU_QUICK = re.compile(rf"(?:{_GPU_NAME})(?![a-z0-9]|\.\d)")  # on the lower-cased line


def parse_hints_line(line: str, hints: ModelHints) -> bool:
    """Update ``hints`` from one line; True when the line said something about model or hardware.

    Cheap substring checks guard every regex: most lines of a big log mention none of this.
    """
    said = False
    low = line.lower()
    if hints.launch_unquantised and ("quantiz" in low or "-q" in low or "dtype" in low or "load" in low) \
            and _QUANT_FLAG.search(line):
        hints.launch_unquantised = False  # a continuation line of the command, or the engine's configuration
    if "--model" in low or "serve" in low or "llm(" in low or "from_pretrained" in low:
        launch = _LAUNCH.search(line)
        if launch:
            said = True
            name = next(g for g in launch.groups() if g)
            params = _model_params(name, line)
            if params is not None and not hints.launch_seen:
                # the model on a launch command line beats one named in prose
                hints.model, hints.params = name, params
                dt = _dtype_of(name) or _dtype_of(line)
                hints.dtype, hints.bytes_per_param = dt if dt else ("", None)
                hints.launch_unquantised = (dt is None and launch.group("m1", "m2", "m3", "m4") != (None,) * 4
                                            and not _QUANT_FLAG.search(line)
                                            and not _PUBLISHED_QUANTISED.search(name))
            hints.launch_seen = True
    if hints.params is None:
        if _PARAMS_QUICK.search(line):
            for w in _WORD.findall(line):
                params = _model_params(w, line)
                if params is not None:
                    hints.model, hints.params = w, params
                    dt = _dtype_of(w) or _dtype_of(line)
                    if dt:
                        hints.dtype, hints.bytes_per_param = dt
                    said = True
                    break
    elif not hints.dtype and any(w in low for w in ("dtype", "quantiz", "weight", "checkpoint", "precision")):
        dt = _dtype_of(line)
        if dt:
            hints.dtype, hints.bytes_per_param = dt
            said = True
    if "tensor" in low or "-tp" in low or "tp_size" in low or "shard" in low or "TP" in line or "pipeline" in low \
            or "-pp" in low:
        text = line
        if "TP" in line:
            for r in _TP_RANK.finditer(line):
                rank = int(r.group("r") or r.group("w"))
                hints.tp_rank_max = max(rank, hints.tp_rank_max or 0)
                text = text.replace(r.group(0), " ")
        m = _TP.search(text)
        if m:
            hints.tensor_parallel, hints.parallel_stated, said = int(m.group("n") or m.group("m")), True, True
        m = _PP.search(line)
        if m:
            hints.pipeline_parallel, hints.parallel_stated, said = int(m.group("n")), True, True
    if "utilization" in low:
        m = _UTIL.search(line)
        if m:
            hints.gpu_memory_utilization, said = float(m.group("v")), True
    if "weights" in low or "loading took" in low or "load weight end" in low:
        m = _WEIGHTS_TOOK.search(line)
        size = parse_size(m.group("v") or m.group("v1") or m.group("v2") or m.group("v3")) if m else None
        if size:
            hints.weights_measured, said = size, True
    if "total_gpu_memory" in line:
        said = _profile(line, hints) or said
    if "CUDA_VISIBLE_DEVICES" in line:
        m = _VISIBLE.search(line)
        if m:
            hints.gpu_count, said = len(m.group("ids").split(",")), True
    if _GPU_QUICK.search(low):
        gpu = gpu_named(line)
        if gpu is not None:
            hints.gpu_model, hints.gpu_memory_bytes, hints.gpu_memory_assumed = gpu.model, gpu.memory_bytes, gpu.assumed
            # nvidia-smi's table row leads with the GPU's index ("|   1  Tesla V100-SXM2…"), not a count
            if gpu.count is not None and not line.lstrip().startswith("|"):
                hints.gpu_count = gpu.count
            said = True
    if hints.gpu_memory_bytes is None and ("gpu" in low or "vram" in low or "显存" in line or "显卡" in line
                                           or "card" in low or "video memory" in low):
        for m in _GPU_MEM_PROSE.finditer(line):
            if _NEEDS_BEFORE.search(line, 0, m.start()):
                continue
            gib = float(m.group("v") or m.group("w"))
            if 1 <= gib <= 200:
                hints.gpu_memory_bytes, said = int(gib * GIB), True
            break
    if hints.gpu_count is None and ("gpus" in low or "卡" in line or "cards" in low):
        for m in _GPU_COUNT.finditer(line):
            if int(m.group("n")) >= 100 and _COUNTED_BEFORE.search(line, 0, m.start()):
                continue  # the number is the GPU's model, counted before it: "four 4090 cards", "8x 3090 GPUs"
            hints.gpu_count, said = int(m.group("n")), True
            break
    cpu_context = ("cpu" in low and ("load" in low or "读取" in line or "加载" in line)) or (
        hints.cpu_loading_pct is not None and not hints.cpu_after_loading_normal
        and ("normal" in low or "正常" in line or "after" in low or "once" in low))
    if cpu_context and _cpu_hints(line, hints):
        said = True
    if not hints.engine and any(w in low for w in _ENGINE_WORDS):
        for name, rx in _ENGINES:
            if rx.search(line):
                hints.engine = name
                break
    if "vllm" in low or "engine" in low or "v1" in low or "pending:" in low or "swapped:" in low:
        said = _vllm_version(line, hints) or said
    return said


# "Initializing an LLM engine (v0.5.0.post1)", "Initializing a V1 LLM engine (v0.9.1)", "vLLM API server
# version 0.8.5", "vllm==0.6.4", "vLLM v0.10.1"
_VLLM_VERSION = re.compile(
    r"LLM engine \(v(?P<a>\d+\.\d+(?:\.\d+)?)|vLLM API server version (?P<b>\d+\.\d+(?:\.\d+)?)"
    r"|vllm(?:==|\s+v|\s+version\s+|:v|/vllm-openai:v)(?P<c>\d+\.\d+(?:\.\d+)?)",
    re.IGNORECASE,
)
_V1_MARKERS = re.compile(r"V1 LLM engine|\(EngineCore\w*\s+pid=|Engine 0{3}:|VLLM_USE_V1=1|vllm/v1/")
_V0_MARKERS = re.compile(r"VLLM_USE_V1=0|\bPending: \d+ reqs|\bSwapped: \d+ reqs")


def _vllm_version(line: str, hints: ModelHints) -> bool:
    said = False
    if not hints.engine_version:
        m = _VLLM_VERSION.search(line)
        if m:
            hints.engine_version = m.group("a") or m.group("b") or m.group("c")
            hints.engine = hints.engine or "vllm"
            said = True
    if hints.vllm_v1 is None:
        if _V1_MARKERS.search(line):
            hints.vllm_v1, said = True, True
        elif _V0_MARKERS.search(line):
            hints.vllm_v1, said = False, True
    return said


# ---------------------------------------------------------------------------------------------
# the streaming parser
# ---------------------------------------------------------------------------------------------

CONTEXT_LINES = 120  # frames this many lines around an event belong to its traceback

# What a log line (not a traceback frame) says the process was doing: engines and loaders announce
# their phases. Used only when no frame tells the phase; the nearest such line before the event wins.
_PHASE_LINES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("loading", re.compile(
        r"\bLoading (?:the )?(?:model|weights|checkpoint|safetensors|draft model|model modules|pretrained)"
        r"|Loading checkpoint shards|could not be loaded|failed to load\b.{0,40}\bmodel|could not load|while loading"
        r"|load_model\b|error loading model|unable to allocate \w+ buffer"
        r"|Starting to load model|llm_load_tensors|load_tensors:|loading model from|model loading|加载模型|模型加载",
        re.IGNORECASE)),
    ("profile_run", re.compile(r"Memory profiling|profile_run|determine_num_available_blocks|profiling run",
                               re.IGNORECASE)),
    ("warmup", re.compile(r"Capturing (?:CUDA |cuda )?graphs?|Capturing batches|warming up|warm-?up\b|\[Warmup\]",
                          re.IGNORECASE)),
    ("serving", re.compile(r"Received request|POST /v1/|\bRunning: \d+ reqs|Processed prompts|Avg prompt throughput"
                           r"|/generate\b|Uvicorn running|Application startup complete|during inference"
                           r"|while (?:serving|generating|decoding)|generate\(|while running \w+ node", re.IGNORECASE)),
)
_PHASE_KEYED = tuple((phase, Keyed(rx)) for phase, rx in _PHASE_LINES)
MAX_FRAMES = 4000  # bounded memory on huge logs
MAX_EVENTS = 10_000


class OomParser:
    """Feed cleaned lines; ``result()`` gives the OOM events with their phases, and the hints."""

    def __init__(self) -> None:
        self._n = 0
        self._frames: deque[tuple[int, Frame]] = deque(maxlen=MAX_FRAMES)
        self._last_frame: tuple[int, Frame] | None = None
        self._events: list[OomEvent] = []
        self._open: OomEvent | None = None
        self._open_text = ""
        self._open_lines = 0
        self._prose: list[int] = []
        self._dropped = 0
        self._retries: int | None = None
        self.fragmentation_statements: list[str] = []
        self._fragmentation_vetoed = False
        self._phase_lines: deque[tuple[int, str, str]] = deque(maxlen=MAX_FRAMES)
        self._fields_left = 0  # field lines still expected under a multi-line framework message
        self._sgl_left = 0  # lines still expected to carry an SGLang token-pool message's numbers
        self._sgl_event: OomEvent | None = None  # … and the event they belong to
        self._bal_left = 0  # lines still expected to carry an SGLang balance check's figures
        self._bal_event: OomEvent | None = None
        self._disk_exhausted = False  # a ResourceExhaustedError for disk or quota, not memory
        self._trt_went_on = False  # TensorRT's builder skipped a tactic or finished its engine after a memory error
        self._wrapped = ""  # a framework message cut at a line break ("… stored in KV cache (" / "3984)."), held

    # -- feeding ----------------------------------------------------------------------------

    def feed(self, line: str) -> None:
        self._n += 1
        if "retries" in line:
            m = _RETRIES.search(line)
            if m:
                self._retries = max(self._retries or 0, int(m.group("n")))
        body = _RECORD_PREFIX.sub("", line, count=1) if line[:1] in "IWEDC" else line
        m = (_TRACE_FRAME.search(body) if 'File "' in body else None) or (
            _BARE_FRAME.search(body) if ".py:" in body else None)
        if m:
            fr = Frame(m.group("path"), m.group("func"))
            self._last_frame = (self._n, fr)
            self._frames.append(self._last_frame)
            self._continue(body, is_frame=True)
            return
        last = self._last_frame
        if last is not None and last[0] == self._n - 1 and body.strip() and self._frames \
                and self._frames[-1][0] == last[0]:
            # the code line printed under a frame
            self._frames[-1] = (last[0], Frame(last[1].path, last[1].func, body.strip()[:200]))
        if self._continue(line, is_frame=False):
            return
        if self._fields_left:
            self._fields_left -= 1
            if self._field(line):
                return
        if self._sgl_left and self._sgl_event is not None:
            self._sgl_left -= 1
            if self._sgl_fields(self._sgl_event, line):  # the message's own event, kept or merged
                return
            self._sgl_left = 0  # the numbers' lines are over
        if self._bal_left and self._bal_event is not None and not _FW_SGL_BALANCE.search(line):
            self._bal_left -= 1
            if self._balance_fields(self._bal_event, line):
                return
            self._bal_left = 0
        low = body.lower()
        for phase, rx in _PHASE_KEYED:
            if rx.search(body, low):
                self._phase_lines.append((self._n, phase, body.strip()[:120]))
                break
        self._scan(line)

    def _continue(self, line: str, *, is_frame: bool) -> bool:
        """Join a wrapped allocator message's next line; True when the line was consumed."""
        if self._open is None:
            return False
        if is_frame or _HEAD.search(line) or self._open_lines >= 4 or not _needs_more(self._open_text):
            self._close()
            return False
        self._open_text += " " + line.strip()
        self._open_lines += 1
        if not _needs_more(self._open_text):
            self._close()
        return True

    def _close(self) -> None:
        if self._open is None:
            return
        ev = parse_allocator_message(self._open_text)
        ev.line_no = self._open.line_no
        self._add(ev)
        self._open = None
        self._open_text = ""
        self._open_lines = 0

    def _add(self, ev: OomEvent) -> None:
        ev.phase_by_message = ev.kind == "framework" and ev.phase != "unknown"
        # vLLM V1's "Available KV cache memory: ≤ 0" comes just before the error it raises: the error replaces it
        last = self._events[-1] if self._events else None
        if (last is not None and last.phase_from == _KV_LEFT_FROM and ev.kind == "framework"
                and ev.phase == "profile_run" and ev.line_no - last.line_no <= CONTEXT_LINES):
            self._events[-1] = ev
            return
        # ggml reports one failed buffer on two or three lines (the backend's cudaMalloc, then the caller that asked,
        # then the context's): one failure, with the size of the first that gave one and the phase of the one that
        # knows it
        if (last is not None and ev.reason == GGML_REASON and last.reason == GGML_REASON
                and not _GGML_BACKEND.search(ev.message) and 0 <= ev.line_no - last.line_no <= 4
                and (not ev.device or not last.device or ev.device == last.device)
                and (ev.device_index is None or last.device_index is None or ev.device_index == last.device_index)):
            if last.phase == "unknown" and ev.phase != "unknown":
                last.phase, last.phase_from, last.phase_by_message = ev.phase, ev.phase_from, True
            if last.requested is None:
                last.requested = ev.requested
            if not last.device:
                last.device, last.device_index = ev.device, ev.device_index
            return
        # the same message is often printed twice (the log line, then the exception's last line), or quoted again
        # in part by the person who pasted it: one failure, kept in its most complete copy. TensorFlow's exception
        # class heading an IPython traceback says nothing of its own beside the allocator's message near it
        for prev in self._events[-3:]:
            if ev.line_no - prev.line_no <= CONTEXT_LINES and (_class_only(ev) or _class_only(prev)):
                if _class_only(prev) and not _class_only(ev):
                    self._events[self._events.index(prev)] = ev
                return
        for prev in self._events[-3:]:
            if (prev.key() == ev.key() or _requoted(prev, ev)) and ev.line_no - prev.line_no <= CONTEXT_LINES:
                if len(ev.missing) < len(prev.missing):
                    self._events[self._events.index(prev)] = ev
                return
        if len(self._events) >= MAX_EVENTS:
            self._dropped += 1
            return
        self._events.append(ev)

    def _scan(self, line: str) -> None:
        if self._wrapped:
            if not line.strip():
                return  # a blank line between the halves of a wrapped paste
            held, self._wrapped = self._wrapped, ""
            rest = line.strip()
            # a number split by the wrap ("(4." / "26 GiB …") is one number: joined without a space first
            glued = held[-1:].isdigit() or held.endswith(".") if rest[:1].isdigit() else False
            joined = (self._framework(f"{held}{rest}") or self._framework(f"{held} {rest}") if glued else
                      self._framework(f"{held} {rest}") or self._framework(f"{held}{rest}"))
            if joined is not None:  # this line was the message's rest
                joined.line_no = self._n
                self._add(joined)
                return
            alone = _kv_tokens_cut(held)  # it was not: the cut message stands alone, this line is read as any
            if alone is not None:
                alone.line_no = self._n - 1
                self._add(alone)
        low = line.lower()
        if ("fragment" in low or "expandable_segments" in low) and not _STANDARD_HINT.search(line):
            if _FRAG_VETO.search(line):
                self._fragmentation_vetoed = True
            else:
                m = _FRAG_CAUSAL.search(line)
                if m and len(self.fragmentation_statements) < 20:
                    self.fragmentation_statements.append(m.group(0)[:160])
        if not any(w in low for w in _TRIGGERS) and not any(w in line for w in ("显存", "内存")):
            return
        if ("tactic" in low or "engine" in low) and _TRT_WENT_ON.search(line):
            self._trt_went_on = True
            return
        if "[w]" in low and _TRT_OOM.search(line):
            return  # TensorRT's warning level: a tactic's allocation refused while it chooses among them
        if "exhausted" in low and _NOT_MEMORY_EXHAUSTED.search(line):
            self._disk_exhausted = True
            return
        if "killed process" in low or "oom-kill" in low or "invoked oom-killer" in low:
            return  # the kernel's OOM killer (host memory): diagnose.collectors.kernel_oom reads it
        if "this is not a failure" in low:
            return  # TensorFlow's BFC allocator retrying a smaller plan ("The caller indicates that this is not a
            # failure, but this may mean that there could be performance gains if more memory were available")
        if "#retracted" in low:
            return  # SGLang's retraction record ("Decode out of memory happened. #retracted_reqs: 1, …" before 0.4.4):
            # requests put back to wait for KV room, no failure (the engine-log reader counts them)
        fw = self._framework(line)
        if fw is None and (_FW_KV_TOKENS_CUT.search(line) or _FW_KV_SERVE_CUT.search(line)):
            self._wrapped = line.rstrip()
            return
        if fw is not None:
            fw.line_no = self._n
            self._add(fw)
            return
        head = _HEAD.search(line)
        if head and (re.search(r"out of memory|RESOURCE_EXHAUSTED|ALLOC_FAILED|MemoryAllocation|to allocate"
                               r"|Cannot allocate|OUT_OF_MEMORY|OOM when allocating", line, re.IGNORECASE)
                     or re.search(r"OutOfMemoryError\s*[:(]|ResourceExhaustedError", line) or _TRT_OOM.search(line)):
            self._open = OomEvent(kind="allocator", line_no=self._n)
            self._open_text = line
            self._open_lines = 0
            if not _needs_more(line):
                self._close()
            return
        if _PROSE.search(line) and not _HINT.search(line) and _stated_not_hedged(line):
            self._prose.append(self._n)

    def _field(self, line: str) -> bool:
        """A field line under a "would exceed allowed memory" head or TensorRT-LLM's executor message: fill the event
        it belongs to."""
        if not self._events:
            return False
        ev = self._events[-1]
        trt = _FW_TRT_FIELD.search(line)
        if trt:
            key, value = trt.group("k").lower(), trt.group("v")
            if key.startswith("the following"):
                low = value.lower()
                ev.phase = next(phase for name, phase in _TRT_PHASES if name in low)
                ev.phase_from = f"TensorRT-LLM's executor creation: its {value.strip()[:80]}"
                ev.reason = f"TensorRT-LLM could not create its {value.strip()[:80]}"
            else:
                num = re.match(r"[\d.]+", value)
                if num:
                    size_bytes = int(float(num.group(0)) * GIB)
                    if key.startswith("total"):
                        ev.total = size_bytes
                    else:
                        ev.free = size_bytes
            return True
        m = _FW_FIELD.search(line)
        if not m:
            return False
        size = 0 if m.group("v").lower().startswith("0 bytes") else parse_size(m.group("v"))
        key = m.group("k").lower()
        if key.startswith("currently"):
            ev.allocated = size
        elif key.startswith("requested"):
            ev.requested = size
        elif key.startswith("device"):
            ev.total = size
        else:
            ev.free = size
        return True

    @staticmethod
    def _balance_fields(ev: OomEvent, line: str) -> bool:
        """The GiB figures of SGLang's balance check on ``line``, put in ``ev``; True when it held one."""
        group, local = _SGL_GROUP_FREE.search(line), _SGL_LOCAL_FREE.search(line)
        if group and ev.free is None:
            ev.free = parse_size(f"{group.group('v')} GiB")
        if local and ev.local_free is None:
            ev.local_free = parse_size(f"{local.group('v')} GiB")
        return bool(group or local)

    @staticmethod
    def _sgl_fields(ev: OomEvent, line: str) -> bool:
        """The numbers an SGLang token-pool message carries on ``line``, put in ``ev``; True when it held one."""
        ask, free = _SGL_ASK.search(line), [int(m.group("n")) for m in _SGL_FREE.finditer(line)]
        if ask and ev.kv_tokens_requested is not None:
            return False  # another message's numbers: this one has its own already
        if ask:
            ev.kv_tokens_requested = int(ask.group("n"))
        if free:  # a hybrid pool fails when any of its pools is short: the smallest is what it had
            ev.kv_tokens_free = min(free if ev.kv_tokens_free is None else [*free, ev.kv_tokens_free])
        return bool(ask or free)

    def _framework(self, line: str) -> OomEvent | None:
        if _FW_SAMPLER.search(line):
            return OomEvent(kind="framework", phase="warmup", phase_from="vLLM sampler warm-up",
                            reason="sampler warm-up with max_num_seqs dummy requests", message=line.strip())
        m = _FW_TGI.search(line)
        if m:
            return OomEvent(kind="framework", phase="warmup", phase_from="TGI warm-up",
                            reason=f"{m.group('n')} prefill tokens", prefill_tokens=int(m.group("n")),
                            message=line.strip())
        m = _FW_SGL_TOKENS.search(line)
        if m:
            mode = (m.group("mode") or "").lower()
            ev = OomEvent(kind="framework", phase="serving",
                          phase_from=f"SGLang's KV token pool{f' at {mode}' if mode else ''}",
                          reason="the KV cache's token pool ran out while serving", message=line.strip())
            self._sgl_fields(ev, line)
            self._sgl_left = 4  # its numbers' lines follow (when it was not run together on one line)
            self._sgl_event = ev
            return ev
        if _FW_SGL_REQS.search(line):
            return OomEvent(kind="framework", phase="serving", phase_from="SGLang's request-slot pool",
                            reason="the request-slot pool ran out while serving (more requests than "
                                   "--max-running-requests' slots)", message=line.strip())
        m = _FW_KV_TOKENS.search(line)
        if m:
            return _kv_tokens_event(line, int(m.group("need")), int(m.group("have")))
        m = _FW_KV_BYTES.search(line)
        if m:
            return OomEvent(kind="framework", phase="profile_run", phase_from="vLLM KV-cache sizing",
                            reason="KV cache cannot hold one max-length sequence",
                            kv_cache_needed=parse_size(m.group("need")),
                            kv_cache_available=parse_size(m.group("have")), message=line.strip())
        no_cache, kv_left = _FW_NO_CACHE.search(line), _FW_KV_LEFT.search(line)
        if no_cache or kv_left:
            return OomEvent(kind="framework", phase="profile_run",
                            phase_from=_KV_LEFT_FROM if kv_left else "vLLM KV-cache sizing",
                            reason="no memory left for KV-cache blocks", kv_cache_available=0, message=line.strip())
        if _FW_SGL_POOL.search(line):
            return OomEvent(kind="framework", phase="profile_run", phase_from="SGLang KV-pool sizing",
                            reason="no memory left for the KV-cache pool (--mem-fraction-static)", kv_cache_available=0,
                            message=line.strip())
        if _FW_KV_NONE.search(line):
            return OomEvent(kind="framework", phase="profile_run", phase_from="the engine's KV-cache sizing",
                            reason="no memory left for KV-cache blocks", kv_cache_available=0, message=line.strip())
        m = _FW_ORT_ARENA.search(line)
        if m:
            return OomEvent(kind="framework", reason="ONNX Runtime's memory arena could not grow",
                            requested=int(m.group("n")), message=line.strip())
        m = _FW_GGML.search(line)
        if m:
            return OomEvent(kind="framework", device="GPU", device_index=int(m.group("dev")),
                            reason=GGML_REASON, requested=parse_size(m.group("v")), message=line.strip())
        m = _FW_GGML_PINNED.search(line)
        if m:
            return OomEvent(kind="framework", device="CPU", reason=GGML_REASON, requested=parse_size(m.group("v")),
                            message=line.strip())
        m = _FW_GGML_BUF.search(line)
        if m:
            return _ggml_buffer_event(m, line)
        if _FW_TRT_HEAD.search(line):
            self._fields_left = 6  # a blank line, then the component and the device's memory
            return OomEvent(kind="framework", device="GPU", reason="TensorRT-LLM could not create its executor",
                            message=line.strip())
        if _FW_FRACTION_HEAD.search(line):
            self._fields_left = 8
            return OomEvent(kind="framework", reason="allocation beyond the allowed device memory",
                            message=line.strip())
        if _FW_SGL_BALANCE.search(line):
            ev = OomEvent(kind="framework", phase="loading", phase_from="SGLang's tensor-parallel memory check",
                          reason=BALANCE_CHECK_REASON, message=line.strip())
            self._balance_fields(ev, line)
            self._bal_left, self._bal_event = 3, ev  # a paste may wrap its figures onto the lines after it
            return ev
        m = _FW_STARTUP_FREE.search(line)
        if m:
            unit = m.group("unit")
            free = parse_size(f"{m.group('free')} {unit}")
            total = parse_size(f"{m.group('total')} {unit}")
            # what it asked for: the message's own figure, else the utilisation's share of the device
            want = (parse_size(f"{m.group('want')} {m.group('wunit')}") if m.group("want")
                    else int(float(m.group("util")) * total) if total and 0 < float(m.group("util")) <= 1 else None)
            return OomEvent(kind="framework", phase="loading", phase_from="vLLM start-up memory check",
                            reason=STARTUP_CHECK_REASON, free=free,
                            total=total, startup_wanted=want, message=line.strip())
        return None

    # -- results ----------------------------------------------------------------------------

    def result(self) -> OomResult:
        self._close()
        if self._wrapped:  # the input ended inside a wrapped message: what it said stands
            fw, self._wrapped = _kv_tokens_cut(self._wrapped), ""
            if fw is not None:
                fw.line_no = self._n
                self._add(fw)
        events = list(self._events)
        if self._disk_exhausted:  # TensorFlow raised it for a full disk or a quota: its class alone says no OOM
            events = [e for e in events if not _class_only(e)]
        if self._trt_went_on:  # TensorRT's builder skipped a tactic for want of memory and went on: no failure
            events = [e for e in events if not _TRT_OOM.search(e.message or "")]
        problems: list[str] = []
        prose = 0
        if not events and self._prose:
            prose = len(self._prose)
            events.append(OomEvent(kind="prose", line_no=self._prose[0],
                                   message="an out-of-memory error is mentioned in prose"))
            problems.append("an out-of-memory error is mentioned but no allocator message was found, "
                            "so there are no memory numbers")
        frames = list(self._frames)
        for ev in events:
            if ev.phase != "unknown":
                continue
            near = [fr for idx, fr in frames if -CONTEXT_LINES <= idx - ev.line_no <= CONTEXT_LINES]
            ev.phase, ev.phase_from = phase_of(near)
            if ev.phase == "unknown":
                said = [(idx, ph, text) for idx, ph, text in self._phase_lines
                        if -CONTEXT_LINES <= idx - ev.line_no <= 0]
                if said:
                    _, ev.phase, text = said[-1]
                    ev.phase_from = f"the log line '{text}'"
        for ev in events:
            if ev.truncated:
                problems.append(f"the out-of-memory message at line {ev.line_no} is cut short "
                                f"(missing: {', '.join(ev.missing)})")
        if self._dropped:
            problems.append(f"{self._dropped} further out-of-memory events were not kept")
        frag = [] if self._fragmentation_vetoed else list(self.fragmentation_statements)
        return OomResult(events, problems, prose, self._retries, frag)


class HintsParser:
    """Feed cleaned lines; ``hints`` collects what the text says about the model and hardware."""

    def __init__(self) -> None:
        self.hints = ModelHints()
        self.lines = 0
        self._tf = _TfDeviceBlock()

    def feed(self, line: str) -> None:
        tf = self._tf.feed(line, self.hints.tf_devices)
        if parse_hints_line(line, self.hints) or tf:
            self.lines += 1
