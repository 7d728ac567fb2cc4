"""The differential: the candidates an expert would keep in mind, and the one check that separates each
from the next.

A check is an observation or a command an on-call engineer can run in minutes, named for the pair it
separates where a pair is a known confusion (weights against runtime peak: the model's size against the
device's memory; recompiles against warm-up: ``TORCH_LOGS=recompiles``), else for the candidate alone
(what would confirm it). Pure data and lookups: no evidence is read here.
"""

from __future__ import annotations

NONE = "none"  # the candidate "nothing is wrong": the behaviour is expected

# what confirms each candidate on its own
CONFIRM: dict[str, str] = {
    "cpu_preprocessing": "py-spy record --idle --pid PID for 30 s under load (or `diagnose attach --pid PID`): "
                         "request threads mostly in decode/resize/tokenise code, not in the model's forward",
    "pcie_transfer": "nsys profile --trace=cuda (or torch.profiler): Memcpy HtoD/DtoH time against kernel "
                     "time per step; pageable copies show as synchronous cudaMemcpy",
    "recompilation": "TORCH_LOGS=recompiles (and TORCH_LOGS=graph_breaks): each recompile prints its failed "
                     "guard; steady recompiles after warm-up are the fault",
    "oom_weights": "the model's parameter count × bytes per parameter (÷ tensor-parallel degree) against the "
                   "device's total memory (nvidia-smi --query-gpu=memory.total --format=csv)",
    "oom_peak": "torch.cuda.max_memory_allocated() after one step at the failing batch/sequence length, "
                "against the weights' size: the runtime peak is the difference",
    "oom_fragmentation": "the OOM message's 'reserved by PyTorch but unallocated' against the request: "
                         "large and above the request means fragmentation "
                         "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True confirms it)",
    "oom_external": "nvidia-smi --query-compute-apps=pid,used_memory --format=csv while it fails: memory held "
                    "by other processes",
    "prefill_ttft": "time to first token against prompt length (vllm:time_to_first_token_seconds with "
                    "vllm:request_prompt_tokens, or per-request timings): TTFT growing with the prompt",
    "queueing": "the engine's waiting-requests gauge (vllm:num_requests_waiting, tgi_queue_size) or queue "
                "time per request while latency is high; `diagnose sweep URL` finds the knee",
    "gpu_compute": "nvidia-smi dmon -s u (or DCGM SM activity) under load: the GPU busy ≥ 90 % with kernels "
                   "back to back in nsys",
    "thread_oversubscription": "threads per process against cores (ps -o nlwp PID; nproc; the cgroup's "
                               "cpu.max / cpu.stat nr_throttled); OMP_NUM_THREADS set to the cores",
    "launch_overhead": "nsys or torch.profiler: many short kernels with gaps between them and CPU launch time "
                       "≥ GPU time; whether CUDA graphs are on (vLLM: not --enforce-eager)",
    "device_placement": "which device the work runs on: torch.cuda.is_available(), the model's .device, "
                        "nvidia-smi showing the process, the engine's 'offloaded N/M layers to GPU' line",
    NONE: "the same measurement under steady load after warm-up: latency and utilisation flat, no errors",
}

# known confusions: the check that separates the pair (the order of the pair does not matter)
PAIRS: dict[frozenset[str], str] = {
    frozenset({"oom_weights", "oom_peak"}):
        "the model's parameter count × dtype bytes (÷ tensor-parallel degree) against the device's memory: "
        "weights above ~90 % of it is weights, else the runtime peak (batch, sequence, KV cache)",
    frozenset({"oom_peak", "oom_fragmentation"}):
        "the OOM message's 'reserved but unallocated' against the size it tried to allocate: larger is "
        "fragmentation (expandable_segments:True fixes it), smaller is a true peak",
    frozenset({"oom_peak", "oom_external"}):
        "nvidia-smi --query-compute-apps=pid,used_memory --format=csv at the failure: memory held by other "
        "processes, against what PyTorch had allocated",
    frozenset({"oom_weights", "oom_external"}):
        "nvidia-smi --query-compute-apps=pid,used_memory --format=csv before loading: other processes' memory "
        "against the weights' size (parameters × dtype bytes)",
    frozenset({"oom_fragmentation", "oom_external"}):
        "nvidia-smi --query-compute-apps at the failure against 'reserved by PyTorch' in the OOM message",
    frozenset({"recompilation", NONE}):
        "TORCH_LOGS=recompiles over the slow requests: no recompile after the first requests means warm-up, "
        "which ends by itself",
    frozenset({"recompilation", "launch_overhead"}):
        "TORCH_LOGS=recompiles against the engine's start-up lines: CUDA graphs or compilation turned off "
        "(--enforce-eager) is launch overhead, not recompiles",
    frozenset({"queueing", "prefill_ttft"}):
        "queue time against prefill time per request (vllm:request_queue_time_seconds against "
        "vllm:request_prefill_time_seconds): waiting is queueing, computing the prompt is prefill",
    frozenset({"queueing", "gpu_compute"}):
        "GPU utilisation while requests wait: near 100 % means the device is the limit (scale out), low "
        "means an admission cap or the scheduler (raise max_num_seqs)",
    frozenset({"queueing", "cpu_preprocessing"}):
        "py-spy record --idle on the server under load: request threads in tokenising/decoding code while "
        "the engine idles is pre-processing feeding the queue",
    frozenset({"cpu_preprocessing", "thread_oversubscription"}):
        "threads per process against cores and the cgroup's nr_throttled: more busy threads than cores is "
        "oversubscription; one hot thread in decode/resize code is pre-processing",
    frozenset({"cpu_preprocessing", "pcie_transfer"}):
        "nsys profile: Memcpy HtoD time against the CPU time before it (decode, resize, collate)",
    frozenset({"gpu_compute", "launch_overhead"}):
        "nsys: GPU busy share over the step; gaps between short kernels with the CPU launching is launch "
        "overhead, kernels back to back is compute",
    frozenset({"gpu_compute", "pcie_transfer"}):
        "nsys: Memcpy time against kernel time per step; timed by hand, torch.cuda.synchronize() before the "
        "copy's timer starts (a .cpu() or .item() waits for the kernels queued before it)",
    frozenset({"device_placement", "gpu_compute"}):
        "whether the GPU does the work at all: nvidia-smi shows the process and its memory, the engine's log "
        "says how many layers it offloaded",
    frozenset({"device_placement", "oom_weights"}):
        "the engine's load lines (offloaded N/M layers, buffer sizes) against the device's free memory",
    frozenset({"thread_oversubscription", "queueing"}):
        "the cgroup's cpu.stat nr_throttled and threads against cores while requests wait: a CPU limit "
        "starves the workers, an admission cap does not",
}


# the causes an expert keeps beside each answer even when nothing in the evidence named them: the known
# confusions, most confused first (an OOM's siblings; warm-up beside recompiles; prefill beside queueing)
SIBLINGS: dict[str, tuple[str, ...]] = {
    "oom_peak": ("oom_weights", "oom_fragmentation"),
    "oom_weights": ("oom_peak", "oom_external"),
    "oom_fragmentation": ("oom_peak",),
    "oom_external": ("oom_weights", "oom_peak"),
    "recompilation": (NONE,),
    "queueing": ("prefill_ttft",),
    "prefill_ttft": ("queueing",),
    "gpu_compute": ("launch_overhead",),
    "launch_overhead": ("gpu_compute",),
    "cpu_preprocessing": ("thread_oversubscription",),
    "thread_oversubscription": ("cpu_preprocessing",),
    "pcie_transfer": ("cpu_preprocessing",),
}


def check(category: str, nxt: str | None) -> str:
    """The one observation that separates ``category`` from ``nxt`` (the next candidate), or confirms it
    alone when there is no next one or the pair has no check of its own."""
    if nxt is not None:
        got = PAIRS.get(frozenset({category, nxt}))
        if got:
            return got
    return CONFIRM.get(category, CONFIRM[NONE])
