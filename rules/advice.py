"""Advice that depends on the engine's version: one place, so every rule says it the same way.

Defaults and flag names move between releases; a fix that tells a vLLM V1 user to "enable" what V1
turns on by default, or calls 256 "the default cap" on an H100, is wrong advice. Each function here
reads what the evidence knows about the engine (``serving.engine``, ``serving.engine_version``,
``serving.vllm_v1``) and words the step for that version, or for every version when it is unknown.

Sources (vllm-project/vllm): ``vllm/engine/arg_utils.py`` ``get_batch_defaults`` — V1 defaults
``max_num_seqs`` 256 and ``max_num_batched_tokens`` 2048 (API server) / 8192 (``LLM`` class), raised to
1024 and 8192 / 16384 on GPUs with at least 70 GiB other than the A100; V0's default ``max_num_seqs`` is
256; V1 (default engine from 0.8) turns chunked prefill and prefix caching on by default. PyTorch:
``torch._dynamo.config.recompile_limit`` from 2.7 (``cache_size_limit`` before);
``PYTORCH_ALLOC_CONF`` replaces ``PYTORCH_CUDA_ALLOC_CONF`` from 2.9 (the old name still works with a
deprecation warning; on 2.9.1 the new name was ignored for ``expandable_segments`` on CUDA,
pytorch/pytorch#183387, so setting both is safe). Expandable segments do not work with vLLM's sleep mode
(its CuMemAllocator) nor SGLang's memory saver (torch_memory_saver#24).
"""

from __future__ import annotations

import functools

from diagnose.model import Evidence, EvidenceSet


def engine(ev: EvidenceSet) -> str:
    """The engine in use: its stats lines' (``serving.log_engine``: their layout says whose they are), else the one
    its metric names or the text name (``serving.engine``: a vLLM log may name another, "Using TRTLLM attention")."""
    got = ev.get("serving.log_engine") or ev.get("serving.engine")
    return str(got.value).lower() if isinstance(got, Evidence) else ""


def vllm_generation(ev: EvidenceSet) -> str:
    """``"V1"``, ``"V0"`` or ``""`` (unknown) for a vLLM deployment."""
    flag = ev.get("serving.vllm_v1")
    if isinstance(flag, Evidence):
        return "V1" if flag.value else "V0"
    version = ev.get("serving.engine_version")
    if isinstance(version, Evidence) and engine(ev) == "vllm":
        parts = str(version.value).lstrip("v").split(".")
        try:
            major, minor = int(parts[0]), int(parts[1])
        except (ValueError, IndexError):
            return ""
        return "V1" if (major, minor) >= (0, 8) else "V0"
    return ""


def max_num_seqs(ev: EvidenceSet) -> str:
    """What vLLM's --max-num-seqs default is, for the version at hand."""
    gen = vllm_generation(ev)
    if gen == "V0":
        return "vLLM V0's default --max-num-seqs is 256"
    if gen == "V1":
        return ("vLLM V1's default --max-num-seqs is 256, or 1024 on GPUs with 70 GiB or more other than the A100 "
                "(H100, H200, MI300X)")
    return ("vLLM's default --max-num-seqs is 256 in V0; in V1 (the default engine from 0.8) 256, or 1024 on "
            "GPUs with 70 GiB or more other than the A100")


def chunked_prefill(ev: EvidenceSet) -> str:
    """How to bound what one prefill costs in vLLM, for the version at hand."""
    tune = ("tune --max-num-batched-tokens: larger favours time to first token, smaller favours the "
            "inter-token latency of running requests")
    gen = vllm_generation(ev)
    if gen == "V1":
        return f"vLLM V1 chunks prefills by default: {tune}"
    if gen == "V0":
        return f"vLLM V0: --enable-chunked-prefill, then {tune}"
    return f"vLLM: chunked prefill is on by default in V1 (0.8+), --enable-chunked-prefill in V0; {tune}"


def prefix_caching(ev: EvidenceSet) -> str:
    gen = vllm_generation(ev)
    keep = "keep the shared prefix (system prompt, tools) byte-identical and first"
    if gen == "V1":
        return f"vLLM V1 caches prefixes by default: {keep}; check the prefix cache hit rate in the stats line"
    if gen == "V0":
        return f"vLLM V0: --enable-prefix-caching; {keep}"
    return f"vLLM: prefix caching is on by default in V1, --enable-prefix-caching in V0; {keep}"


RECOMPILE_LIMIT = ("torch._dynamo.config.recompile_limit (PyTorch ≥ 2.7; torch._dynamo.config.cache_size_limit "
                   "before)")


def expandable_segments() -> str:
    return ("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch ≥ 2.1; from 2.9 the name is "
            "PYTORCH_ALLOC_CONF and the old one still works with a warning — set both, 2.9.1 ignored the new name "
            "on CUDA; Ascend: PYTORCH_NPU_ALLOC_CONF). Not with vLLM's sleep mode (CuMemAllocator) or SGLang's "
            "memory saver, which expandable segments break")


def serving_capacity(ev: EvidenceSet) -> tuple[str, ...]:
    """The engine's knobs for how many requests run at once, the one in use first."""
    steps = {
        "vllm": f"vLLM: --max-num-seqs ({max_num_seqs(ev)}) while the KV cache has room; more KV cache from "
                "--gpu-memory-utilization, --kv-cache-dtype fp8 or a shorter --max-model-len",
        "sglang": "SGLang: --max-running-requests, and --schedule-conservativeness below 1.0 to admit more "
                  "requests when their outputs are short (above 1.0 when it retracts too often)",
        "tgi": "TGI: --max-concurrent-requests (requests beyond it get 429) and --max-batch-total-tokens; "
               "--cuda-memory-fraction to leave room for another process",
        "triton": "Triton: instance_group count and dynamic_batching (max_queue_delay_microseconds)",
        "lmdeploy": "LMDeploy: --max-batch-size (requests run at once) while the KV cache has room; more KV cache "
                    "from --cache-max-entry-count (the share of free memory after the weights)",
        # trtllm-serve's options; its scheduler admits up to max_batch_size requests (maxNumActiveRequests)
        "tensorrt-llm": "TensorRT-LLM (trtllm-serve): --max_batch_size (the scheduler's active-request limit, "
                        "trtllm_max_num_active_requests, is it times the pipeline-parallel size) and --max_num_tokens "
                        "while the KV cache has room; more KV cache from --kv_cache_free_gpu_memory_fraction",
        # llama.cpp's server README (--parallel, its context split among the slots); Ollama's FAQ (how it handles
        # concurrent requests: OLLAMA_NUM_PARALLEL, OLLAMA_MAX_QUEUE)
        "llama.cpp": "llama.cpp: llama-server --parallel N slots (--ctx-size is split among them: raise it with N); "
                     "llama-cpp-python's server runs one request at a time: more server processes behind a balancer",
        "ollama": "Ollama: OLLAMA_NUM_PARALLEL (requests each loaded model runs at once; its KV memory grows with it: "
                  "context × parallel) and OLLAMA_MAX_QUEUE (requests held beyond them before 503s)",
    }
    first = engine(ev)
    order = [first] if first in steps else []
    order += [k for k in steps if k not in order]
    return tuple(steps[k] for k in order)


# each engine's own names, the one in use first where it is known (``engine``): the tokens one engine step may
# schedule (its prefill budget). Sources: vLLM's engine arguments, SGLang's server arguments, TGI's launcher,
# LMDeploy's `lmdeploy serve api_server --help`, trtllm-serve's options, llama.cpp's server README.
_STEP_BUDGET = {
    "vllm": "vLLM --max-num-batched-tokens",
    "sglang": "SGLang --chunked-prefill-size / --max-prefill-tokens",
    "tgi": "TGI --max-batch-prefill-tokens",
    "lmdeploy": "LMDeploy --max-prefill-token-num",
    "tensorrt-llm": "TensorRT-LLM --max_num_tokens",
    "llama.cpp": "llama.cpp --batch-size / --ubatch-size",
    "ollama": "Ollama num_batch",
    "triton": "Triton: the model's max_batch_size and dynamic_batching (TensorRT-LLM backend: max_num_tokens)",
}
@functools.cache
def _queue_gauges() -> dict[str, str]:
    """Each engine's first gauge of waiting requests, as the Prometheus reader knows them (its "waiting" alias);
    read when first asked: a rule that never names one does not load the reader."""
    from diagnose.collectors import prom

    out: dict[str, str] = {}
    for name in next(a for a in prom.ALIASES if a.canonical == "waiting").names:
        out.setdefault(prom.engine_of(name), name)
    return out


def _engine_first(ev: EvidenceSet, names: dict[str, str], default: tuple[str, ...]) -> str:
    first = engine(ev)
    return names[first] if first in names else ", ".join(names[k] for k in default)


def step_budget(ev: EvidenceSet) -> str:
    """The engine's per-step token budget (its prefill batch), or vLLM's and SGLang's when the engine is not known."""
    return _engine_first(ev, _STEP_BUDGET, ("vllm", "sglang"))


def queue_gauge(ev: EvidenceSet) -> str:
    """The engine's gauge of waiting requests to autoscale on, or vLLM's and Triton's when it is not known."""
    return _engine_first(ev, _queue_gauges(), ("vllm", "triton"))
