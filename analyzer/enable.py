"""``diagnose enable SERVICE_TYPE``: what to add at the next deploy so the next incident is diagnosable.

Each recipe names the change, where it goes, and what it costs, so the on-call engineer can
decide what to switch on permanently and what to switch on only while chasing a problem.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

from diagnose.errors import DiagnoseError


@dataclass(frozen=True)
class Step:
    what: str
    how: str
    cost: str
    gives: str


PROBE = Step(
    "the in-process probe (stage timings per request, CUDA allocator state, compile events, OOM state)",
    "import diagnose.collectors.torch_probe as probe\n"
    "probe.install('/var/log/svc/stages.jsonl')   # or env DIAGNOSE_PROBE=/var/log/svc/stages.jsonl\n"
    "# per request:\n"
    "with probe.request(request_id=rid):\n"
    "    with probe.stage('preprocess'): x = prepare(payload)\n"
    "    with probe.stage('forward'): y = model(x)",
    "under 1 % of throughput (benchmarks/probe_overhead.py); writing happens on a background thread",
    "per-stage p50/p99 and the bottleneck stage, cold starts, allocator state at an OOM",
)
RECOMPILES = Step(
    "recompile logging",
    "TORCH_LOGS=recompiles   (environment of the service)",
    "one log line per recompile: free in steady state, which is when it matters",
    "which guard failed, which input and dimension, whether the recompile limit was hit",
)
MEMORY_HISTORY = Step(
    "CUDA memory history, for OOM investigations only",
    "torch.cuda.memory._record_memory_history(max_entries=100_000)   # at start-up\n"
    "# the probe dumps a snapshot when an OOM happens; `diagnose analyze snapshot.pickle` reads it",
    "a few % of allocation speed and host memory for the ring buffer: switch on while chasing an OOM",
    "weights / activations / fragmentation split and the stacks of the largest blocks",
)
ALLOC_CONF = Step(
    "allocator settings that make OOM messages and fragmentation visible",
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    "none measurable on recent PyTorch; reduces fragmentation",
    "fewer fragmentation OOMs; the OOM message then reflects real shortage",
)
NSYS = Step(
    "an Nsight Systems launch, so `diagnose attach --nsys` can record a window on demand",
    "nsys launch --trace=cuda,nvtx,osrt --session-new=diagnose <the service's command>",
    "near zero while idle; tracing costs 1-10 % only during a recorded window",
    "GPU busy ratio, idle gaps, copies by kind (pageable/pinned), syncs, launch overhead",
)
PTRACE = Step(
    "permission to attach",
    "containers: securityContext.capabilities.add: [SYS_PTRACE] (Kubernetes) or docker run --cap-add SYS_PTRACE",
    "none",
    "`diagnose attach --pid` can read the Python stacks (py-spy) without restarting the service",
)


def _metrics(flag: str, url: str, extra: str = "") -> Step:
    return Step("the Prometheus metrics endpoint", flag, "negligible", "queue depth, KV-cache use, TTFT/queue/"
                f"prefill/decode histograms; `diagnose attach --metrics {url}` scrapes it at both ends{extra}")


RECIPES: dict[str, tuple[str, tuple[Step, ...]]] = {
    "pytorch": ("a plain PyTorch service (FastAPI, Flask, LitServe, Ray Serve, …)",
                (PROBE, RECOMPILES, MEMORY_HISTORY, ALLOC_CONF, NSYS, PTRACE)),
    "vllm": ("vLLM", (
        _metrics("on by default: http://HOST:8000/metrics (do not pass --disable-log-stats)",
                 "http://127.0.0.1:8000/metrics"),
        Step("engine statistics in the log", "keep the default logging (no --disable-log-stats); ship the log",
             "one line every 5-10 s", "Running/Waiting/KV-cache lines: `diagnose analyze vllm.log`"),
        RECOMPILES, ALLOC_CONF, NSYS, PTRACE)),
    "sglang": ("SGLang", (
        _metrics("--enable-metrics  (served on the HTTP port at /metrics)", "http://127.0.0.1:30000/metrics"),
        Step("batch statistics in the log", "keep --log-level info; ship the log", "one line per batch",
             "Prefill/Decode batch lines with #queue-req and token usage"),
        ALLOC_CONF, NSYS, PTRACE)),
    "tgi": ("Hugging Face Text Generation Inference", (
        _metrics("on by default at http://HOST:80/metrics", "http://127.0.0.1:80/metrics"),
        Step("request spans in the log", "RUST_LOG=info (default) and ship the log", "one line per request",
             "queue_time / inference_time per request"),
        NSYS, PTRACE)),
    "triton": ("NVIDIA Triton Inference Server", (
        _metrics("on by default at http://HOST:8002/metrics", "http://127.0.0.1:8002/metrics",
                 "; queue vs compute time per model"),
        Step("a perf_analyzer baseline", "perf_analyzer -m MODEL --concurrency-range 1:64:2 > baseline.txt",
             "runs against the server: do it off-peak", "Little's law check and queue/compute split: "
             "`diagnose analyze baseline.txt`"),
        NSYS, PTRACE)),
}


def print_enable(service: str | None, fmt: str) -> int:
    if service is None or service not in RECIPES:
        if service is not None:
            raise DiagnoseError(f"there is no recipe for {service!r}.", f"Choose one of: {', '.join(RECIPES)}.")
        for key, (title, _) in RECIPES.items():
            print(f"{key:<8} {title}")
        return 0
    title, steps = RECIPES[service]
    if fmt == "json":
        print(json.dumps({"service": service, "title": title,
                          "steps": [s.__dict__ for s in steps]}, indent=2))
        return 0
    out = sys.stdout
    out.write(f"To make the next incident of {title} fully diagnosable, add at the next deploy:\n")
    for i, s in enumerate(steps, 1):
        out.write(f"\n{i}. {s.what}\n")
        for line in s.how.splitlines():
            out.write(f"     {line}\n")
        out.write(f"   cost:  {s.cost}\n   gives: {s.gives}\n")
    return 0
