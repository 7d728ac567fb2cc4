"""The verdict: what a diagnosis amounts to, and what to collect next when it cannot tell.

``primary`` alone cannot say whether "nothing found" means the service is healthy or the tool saw
too little. ``decide`` answers that from the evidence itself:

* ``bottleneck`` — a finding (not an informational note) names the primary bottleneck;
* ``healthy`` — no bottleneck, and either an informational finding explains what the user saw
  (vLLM's KV-cache pre-allocation is not a leak) or the evidence *covers* the service: at least one
  coverage family below was measured well enough for its rules to judge, the requests' latency was
  measured (``latency_covered``: an engine's stats lines alone never make a service healthy), and
  nothing in the evidence signals a failure (an OOM, recompiles, rejected requests) that no rule
  could classify;
* ``undetermined`` — everything else, with ``next_steps``: what to collect, the exact command,
  most useful first (the steps that match what the evidence hints at come before the general ones).

Pure: reads an ``EvidenceSet`` and findings, never touches a process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from diagnose.model import Evidence, EvidenceSet, Finding, Mechanism, Quality, Severity, Target, Verdict
from diagnose.rules import report_model
from diagnose.rules.report import claims_only

# -- coverage: evidence that watched the service doing its work -------------------------------------


def _num(ev: EvidenceSet, key: str) -> float:
    return ev.value(key, 0.0) or 0.0


def _good(ev: EvidenceSet, key: str) -> bool:
    got = ev.get(key)
    return isinstance(got, Evidence) and got.quality is Quality.GOOD


@dataclass(frozen=True)
class Coverage:
    """A family of evidence that, measured well, lets the rules judge a whole service."""

    name: str
    test: Callable[[EvidenceSet], bool]


MIN_REQUESTS = 20  # fewer timed requests say little about percentiles or shares
MIN_STATS = 3  # scheduler stats lines: at least three periodic samples
MIN_GPU_SAMPLES = 10  # utilisation readings: 1 s at 10 Hz
MIN_WALL_SAMPLES = 30  # wall-clock samples of request threads: 3 s of one thread at 10 Hz

COVERAGE: tuple[Coverage, ...] = (
    Coverage("a CPU profile of the live service (py-spy) with its load (psutil)",
             lambda ev: _good(ev, "workers.active_mean") and "conn.inflight_mean" in ev),
    Coverage("a wall-clock view of the threads serving requests (py-spy --idle)",
             lambda ev: _good(ev, "wall.samples") and _num(ev, "wall.samples") >= MIN_WALL_SAMPLES),
    Coverage("per-request timings",
             lambda ev: _num(ev, "requests.count") >= MIN_REQUESTS
             and ("latency.e2e_ms.p50" in ev or ev.has_prefix("stage."))),
    Coverage("the serving engine's scheduler statistics",
             lambda ev: _num(ev, "serving.stat_samples") >= MIN_STATS),
    Coverage("GPU utilisation sampled over the window",
             lambda ev: _num(ev, "gpu.util_samples") >= MIN_GPU_SAMPLES),
    Coverage("a GPU timeline (Nsight Systems or PyTorch profiler)",
             # a timeline too short or too sparse to judge (quality LOW: an excerpt, a capture phase) covers nothing
             lambda ev: _good(ev, "trace.gpu_busy_ratio") or _good(ev, "kineto.idle_share")),
    Coverage("a load test's latency and throughput",
             lambda ev: "throughput.rps" in ev and ev.has_prefix("latency.")),
)


# -- signals that something failed, which no rule may have classified ------------------------------
SIGNALS: tuple[tuple[str, str], ...] = (
    ("mem.oom_count", "an out-of-memory event"),
    ("compile.recompiles", "recompilations"),
    ("compile.limit_hit", "the recompile limit being hit"),
    ("serving.preemptions", "preempted requests"),
    ("serving.rejected_overloaded", "rejected requests"),
    ("requests.failed", "failed requests"),
    ("gpu.xid_events", "GPU XID errors"),
    ("serving.streams_cut", "streams the server ended early"),
    ("host.sigkilled", "a process killed by SIGKILL"),
)


def covered_by(ev: EvidenceSet) -> list[str]:
    """The coverage families present in ``ev``."""
    return [c.name for c in COVERAGE if c.test(ev)]


# what a user of the service feels: a "healthy" verdict must have seen the requests' latency (time to
# first token, end-to-end, or the time request threads spend, per stage or on the wall clock), or a GPU
# timeline that times each step end to end; an engine's scheduler statistics alone (a vLLM log's stats
# lines), a CPU profile or a GPU's utilisation say nothing of it
LATENCY_PREFIXES = ("latency.", "stage.", "wall.")
# ... and whether requests waited: an engine's queue gauge or stats, a queue stage, the requests in flight
# (a per-request timing log with nothing of the queue cannot tell a healthy server from a full one)
QUEUE_PREFIXES = ("serving.waiting", "serving.stat_samples", "stage.queue", "latency.queue", "conn.inflight",
                  "wall.")


def latency_covered(ev: EvidenceSet) -> bool:
    """The evidence measured the requests' latency and their queue, or timed the steps on a GPU timeline."""
    if _good(ev, "trace.gpu_busy_ratio") or _good(ev, "kineto.idle_share"):
        return True
    return ev.has_prefix(*LATENCY_PREFIXES) and ev.has_prefix(*QUEUE_PREFIXES)


# a median time to first token this long is what users feel as broken (a common TTFT objective is 1-2 s):
# when no rule explains it, the verdict cannot be healthy
SLOW_TTFT_MS = 2000.0


def signals(ev: EvidenceSet) -> list[str]:
    """Failure signals present in ``ev`` (a count above zero; a median time to first token of seconds)."""
    out = [what for key, what in SIGNALS if _num(ev, key) > 0]
    ttft = _num(ev, "latency.ttft_ms.p50")
    if ttft >= SLOW_TTFT_MS:
        out.append(f"a median time to first token of {ttft / 1000:.1f} s")
    return out


# -- next steps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One thing to collect; ``relevant`` says when the evidence hints that it is the one to take."""

    topic: str
    text: str
    relevant: Callable[[EvidenceSet], bool]
    urgent: bool = False  # when relevant, it explains a failure the evidence shows: it comes before any other


def _engine(ev: EvidenceSet) -> str:
    got = ev.get("serving.engine")
    return str(got.value).lower() if isinstance(got, Evidence) else ""


def _steps(pid: str, engine: str) -> tuple[Step, ...]:
    metrics = {
        "vllm": "vLLM serves /metrics on its API port",
        "sglang": "SGLang needs --enable-metrics",
        "tgi": "TGI serves /metrics on its port",
        "triton": "Triton serves /metrics on port 8002",
    }.get(engine, "vLLM, TGI and Triton serve it; SGLang with --enable-metrics")
    return (
        Step("memory",
             "A process ended by SIGKILL (exit code -9 or 137) with no error of its own: the kernel's OOM killer is "
             "the usual sender. Read the kernel's report: `dmesg -T | grep -iE -B30 'killed process'` (or "
             "`journalctl -k`; in Kubernetes `kubectl describe pod` shows Last State: OOMKilled) and `diagnose "
             "analyze` it with the log",
             lambda ev: ev.has_prefix("host.sigkilled") and not ev.has_prefix("host.oom_kills", "cgroup.oom_kills"),
             urgent=True),
        Step("memory",
             "Record the allocator at the OOM: call torch.cuda.memory._record_memory_history(max_entries=100000) "
             "at start-up and torch.cuda.memory._dump_snapshot('oom.pickle') in the OOM handler (or run `diagnose "
             "enable pytorch`), then `diagnose analyze oom.pickle`",
             lambda ev: ev.has_prefix("mem.", "model.")),
        Step("memory",
             "While the service runs (and right after the OOM), save `nvidia-smi -q -x > smi.xml` and `diagnose "
             "analyze smi.xml`: memory per process shows another tenant or a leaked context",
             lambda ev: ev.has_prefix("mem.", "gpu.")),
        Step("compile",
             f"Restart with TORCH_LOGS=recompiles,graph_breaks and attach with the log: `diagnose attach --pid {pid} "
             "--log service.log` (each recompile and the guard that failed is logged)",
             lambda ev: ev.has_prefix("compile.", "shape.")),
        Step("serving",
             f"Scrape the engine's Prometheus metrics during the slow period ({metrics}): `diagnose attach --pid "
             f"{pid} --metrics http://127.0.0.1:PORT/metrics`, or `curl -s http://127.0.0.1:PORT/metrics > "
             "metrics.txt` twice a minute apart and `diagnose analyze metrics.txt`",
             lambda ev: ev.has_prefix("serving.", "latency.ttft", "tokens.") or bool(_engine(ev))),
        Step("serving",
             "Keep the engine's log with its periodic stats lines (vLLM: do not pass --disable-log-stats; SGLang: "
             "--log-level info) over the slow period and `diagnose analyze engine.log`",
             lambda ev: ev.has_prefix("serving.", "latency.ttft") or bool(_engine(ev))),
        Step("live",
             f"Attach while the problem happens: `diagnose attach --pid {pid} --duration 30 --log LOGFILE --metrics "
             "http://127.0.0.1:PORT/metrics` (CPU profile, threads, requests in flight, GPU utilisation)",
             lambda ev: True),
        Step("gpu",
             "Sample the GPU over the slow period: `nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,"
             "memory.total,clocks.sm,power.draw,pcie.link.gen.current,pcie.link.width.current --format=csv -l 1 "
             "> gpu.csv` and `diagnose analyze gpu.csv`",
             lambda ev: ev.has_prefix("gpu.", "pcie.")),
        Step("requests",
             "Time each request's stages: `diagnose enable pytorch` shows the two probe lines that log queue, "
             "pre-processing, compute and post-processing per request",
             lambda ev: ev.has_prefix("latency.", "stage.", "requests.")),
        Step("gpu",
             "For GPU-side detail, record a few seconds with the PyTorch profiler (vLLM: VLLM_TORCH_PROFILER_DIR "
             "and /start_profile) or `nsys profile -t cuda,nvtx,osrt -o trace` + `nsys export --type sqlite`, "
             "then `diagnose analyze` the trace",
             lambda ev: ev.has_prefix("trace.", "copy.", "gpu.")),
    )


MAX_STEPS = 5
# the collections that measure each category, for confirming a verdict that rests on a report's words
CONFIRMED_BY: dict[str, tuple[str, ...]] = {
    "oom_weights": ("memory",), "oom_peak": ("memory",), "oom_fragmentation": ("memory",),
    "oom_external": ("memory",), "recompilation": ("compile", "live"), "queueing": ("serving", "requests"),
    "prefill_ttft": ("serving", "requests"), "gpu_compute": ("gpu",), "pcie_transfer": ("gpu", "live"),
    "launch_overhead": ("gpu", "live"), "cpu_preprocessing": ("live", "requests"),
    "thread_oversubscription": ("live",), "device_placement": ("gpu", "live"),
}
MAX_CONFIRM = 3


def confirm_steps(ev: EvidenceSet, category: str, target: Target | None = None) -> tuple[str, ...]:
    """What would measure ``category`` when only a report's words point to it: that category's steps."""
    pid = str(target.pid) if target is not None and target.pid else "PID"
    topics = CONFIRMED_BY.get(category, ("live",))
    steps = [s for s in _steps(pid, _engine(ev)) if s.topic in topics]
    steps.sort(key=lambda s: (topics.index(s.topic), not s.relevant(ev)))
    return tuple(s.text for s in steps[:MAX_CONFIRM])


def next_steps(ev: EvidenceSet, target: Target | None = None) -> tuple[str, ...]:
    """What to collect next, most useful first: the steps the evidence hints at, then the rest."""
    pid = str(target.pid) if target is not None and target.pid else "PID"
    steps = _steps(pid, _engine(ev))
    leaning = _leaning_topics(ev)
    hinted = [s for s in steps if s.relevant(ev) and s.topic != "live"]
    general = [s for s in steps if s.topic == "live"]
    # a step for a failure the evidence does not show (urgent when shown) is no general advice
    rest = [s for s in steps if s not in hinted and s not in general and not s.urgent]
    ordered = [*hinted, *general, *rest]
    if leaning:  # after attaching, what a report's words lean to (even too weakly to name it) comes next
        order = ("live", *(t for t in leaning if t != "live"))
        ordered.sort(key=lambda s: order.index(s.topic) if s.topic in order else len(order))
    ordered.sort(key=lambda s: not (s.urgent and s.relevant(ev)))  # a failure shown comes first (a stable sort)
    return tuple(s.text for s in ordered[:MAX_STEPS])


def _leaning_topics(ev: EvidenceSet) -> tuple[str, ...]:
    """The collection topics of the category a report's wording leans to, most likely first ("" none)."""
    if "report.cues" not in ev:
        return ()
    decided = report_model.decide(ev, ())
    if decided is None or decided[0] not in CONFIRMED_BY:
        return ()
    return CONFIRMED_BY[decided[0]]


def decide(
    ev: EvidenceSet, findings: Sequence[Finding], target: Target | None = None
) -> tuple[Verdict, tuple[str, ...]]:
    """The verdict for ``findings`` judged on ``ev``, and the next steps when it is undetermined or when
    the bottleneck rests only on what a report says (its prose), so the reader knows how to confirm it."""
    lead = next((f for f in findings if f.severity is not Severity.INFO), None)
    if lead is not None:
        return Verdict.BOTTLENECK, (confirm_steps(ev, lead.label, target) if claims_only(lead) else ())
    stalled = next((f for f in findings if f.mechanism is Mechanism.STALLED), None)
    if stalled is not None:  # requests wait and nothing runs: no bottleneck to name, and nothing healthy either
        return Verdict.UNDETERMINED, tuple(s for fx in stalled.fixes for s in fx.steps)[:MAX_STEPS]
    failing = signals(ev)
    covered = bool(covered_by(ev))
    if not failing and _explained(findings):
        return Verdict.HEALTHY, ()
    if not failing and covered and latency_covered(ev):
        # requests that look fine say nothing of a starved host: a healthy verdict from the engine's own figures
        # alone (a /metrics scrape) names the attach that would see the host's CPU, its quota and the GPU
        return Verdict.HEALTHY, (() if host_observed(ev) else (live_step(ev, target),))
    steps = next_steps(ev, target)
    if not failing and covered:  # the service was watched, but not what its requests felt: that first
        steps = (latency_step(ev, target), *steps[:MAX_STEPS - 1])
    return Verdict.UNDETERMINED, steps


# what sees the host that serves the requests: its processes and threads, their CPU (and its cgroup quota),
# the GPU, or a timeline of both
HOST_PREFIXES = ("proc.", "threads.", "cpu.", "cgroup.", "host.", "gpu.", "trace.", "kineto.", "wall.")


def host_observed(ev: EvidenceSet) -> bool:
    """Whether anything in ``ev`` watched the host (process, threads, CPU quota, GPU), not only the requests."""
    return ev.has_prefix(*HOST_PREFIXES)


def live_step(ev: EvidenceSet, target: Target | None = None) -> str:
    """The attach that watches the host while the service runs."""
    pid = str(target.pid) if target is not None and target.pid else "PID"
    return next(s.text for s in _steps(pid, _engine(ev)) if s.topic == "live")


def latency_step(ev: EvidenceSet, target: Target | None = None) -> str:
    """What measures the requests' latency, which a healthy verdict needs (``latency_covered``)."""
    pid = str(target.pid) if target is not None and target.pid else "PID"
    return ("Measure what requests feel before calling it healthy: attach with the engine's metrics (time to "
            f"first token, queue and end-to-end histograms): `diagnose attach --pid {pid} --metrics "
            "http://127.0.0.1:PORT/metrics`, or with the service's per-request stage log (`--log`), or load it "
            "with `diagnose sweep URL`")


def _explained(findings: Iterable[Finding]) -> bool:
    """An informational finding explains what the user saw (a healthy pattern mistaken for a fault); a stalled
    scheduler's note explains nothing away."""
    return any(f.severity is Severity.INFO and f.mechanism is not Mechanism.STALLED for f in findings)
