"""What a PyTorch-profiler trace says beyond the GPU timeline the Nsight rules judge.

A Kineto trace links every kernel to the host call that launched it (correlation id) and keeps the
host's runtime calls, so it can tell *why* the GPU was idle: the next operation was not yet
launched (dispatch), a host thread was blocked in a synchronising call, or start-up was captured.
These rules read the ``kineto.*`` keys of ``analyzer/derive/kineto.py``; the timeline itself is
judged by ``rules/gpu_trace.py`` from the same ``trace.*`` keys an Nsight export gives.

What is left of a profile when only its summary table is pasted (``key_averages().table()``, ``nsys stats``):
the host's time in launch calls against the device's time, GPU112.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Quality, Risk
from diagnose.rules.base import Rule, bar, fmt_ms, present, severity_for
from diagnose.units import pct


def _thin(ev: EvidenceSet, *keys: str) -> bool:
    for k in keys:
        got = ev.get(k)
        if isinstance(got, Evidence) and got.quality is Quality.LOW:
            return True
    return False


class DispatchBound(Rule):
    """The GPU waits between the kernels of a step for the host to launch the next one.

    What it detects: in a PyTorch-profiler trace, idle gaps shorter than 1 ms after which the next
    kernel's launch call had not even started when the GPU went idle (the host was still in Python
    and the framework's dispatcher), adding up to a large share of the GPU window, with few or no
    kernels replayed from CUDA graphs.

    Why it matters: eager PyTorch spends ~10–50 µs of host time per operator (Python, dispatcher,
    launch); a small-batch step of tiny kernels then runs at the host's pace and the GPU waits.
    Faster kernels change nothing; fewer launches (CUDA graphs, fusion) do. This is the
    ``launch_overhead`` bottleneck, not input pre-processing: the gaps are inside the step.

    How it decides: ``kineto.idle.dispatch_share`` (host-wait gaps under 1 ms over the GPU window)
    ≥ ``min_dispatch``, ``trace.gpu_busy_ratio`` < ``max_busy`` over a window of at least
    ``min_window_ms``, and ``kineto.graph_kernel_share`` (absent: no graphs) below
    ``max_graph_share``. Impact is the dispatch share.

    Evidence: kineto.idle.dispatch_share, trace.gpu_busy_ratio, trace.window_ms; optionally
    kineto.idle.dispatch_ms, kineto.idle.host_wait_share, kineto.graph_kernel_share, trace.kernel_count,
    trace.tiny_kernel_ratio, trace.kernel_mean_us, api.launch_mean_us, kineto.launch_delay_us.p50.

    Fix: capture the step in CUDA graphs (``torch.compile(mode="reduce-overhead")``, the serving
    engine's CUDA-graph mode, ``torch.cuda.CUDAGraph``); fuse small operators; batch more work per step.

    False positives: a trace of a warm-up or a single request where the host does one-off work
    between operators; CPU-side hooks (``record_shapes``, ``with_stack``) inflate host time per
    operator while profiling — compare with a trace taken without ``with_stack``.
    """

    code = "GPU108"
    name = "dispatch-bound"
    category = Category.LAUNCH_OVERHEAD
    requires = ("kineto.idle.dispatch_share", "trace.gpu_busy_ratio", "trace.window_ms")
    optional = ("kineto.idle.dispatch_ms", "kineto.idle.host_wait_share", "kineto.graph_kernel_share",
                "trace.kernel_count", "trace.tiny_kernel_ratio", "trace.kernel_mean_us", "api.launch_mean_us",
                "kineto.launch_delay_us.p50")

    @dataclass(frozen=True)
    class Thresholds:
        min_dispatch: float = 0.25  # a quarter of the GPU window lost between ops of a step is worth a fix
        max_busy: float = 0.85  # a GPU busy ≥ 85 % is saturated; the host keeps up
        min_window_ms: float = 50.0  # a window under 50 ms is one burst, not a pattern
        max_graph_share: float = 0.5  # most kernels already replayed from graphs: dispatch is not the story

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        share = ev.value("kineto.idle.dispatch_share", 0.0) or 0.0
        busy = ev.value("trace.gpu_busy_ratio", 1.0) or 0.0
        window = ev.value("trace.window_ms", 0.0) or 0.0
        graphs = ev.value("kineto.graph_kernel_share", 0.0) or 0.0
        if share < t.min_dispatch or busy >= t.max_busy or window < t.min_window_ms or graphs >= t.max_graph_share:
            return None
        kernels = ev.value("trace.kernel_count")
        tiny = ev.value("trace.tiny_kernel_ratio")
        launch_us = ev.value("api.launch_mean_us")
        msg = (f"The GPU is busy {pct(busy)} of its {window:.0f} ms window and idles {pct(share)} of it in gaps under "
               "1 ms after which the next kernel had not yet been launched: the host's per-operator dispatch "
               "(Python, the framework, the launch call) sets the pace"
               + (f"; {pct(tiny)} of {kernels:.0f} kernels run under 10 µs" if tiny is not None and kernels else "")
               + (f", each launch call takes {launch_us:.1f} µs of host time" if launch_us is not None else "")
               + (". CUDA graphs replay only " + pct(graphs) + " of the kernels." if graphs else
                  ". No kernel is replayed from a CUDA graph."))
        return self.finding(
            severity=severity_for(share),
            confidence=Confidence.THIN if _thin(ev, *self.requires) else Confidence.MEASURED,
            title="Dispatch-bound: the GPU waits for each next launch",
            message=msg,
            impact=share,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"GPU busy      |{bar(busy)}| {pct(busy)}\ndispatch idle |{bar(share)}| {pct(share)}",
            fixes=[
                Fix("Replay the step from CUDA graphs",
                    ("PyTorch: torch.compile(model, mode='reduce-overhead') or torch.cuda.CUDAGraph around a "
                     "static-shape step (pad to a few batch sizes)",
                     "Serving engines: keep CUDA graphs on (vLLM without --enforce-eager, SGLang without "
                     "--disable-cuda-graph) and cover the batch sizes you serve (cudagraph capture sizes)"),
                    Risk.NEEDS_VALIDATION),
                Fix("Launch fewer, bigger kernels",
                    ("Fuse element-wise chains with torch.compile; use fused kernels (SDPA/FlashAttention, fused "
                     "norms and activations)",
                     "Batch more requests per step so each launch carries more work"),
                    Risk.NEEDS_VALIDATION),
            ],
        )


class ColdStartInTrace(Rule):
    """The trace captured start-up: one runtime call of seconds (context creation, module loading).

    What it detects: a single CUDA/HIP runtime call that lasts at least a second and fills a large
    share of the traced host time or of the GPU window — CUDA context creation (the first
    ``cudaFree(0)``, ``cudaGetDeviceCount``…), lazy loading of kernel modules on a first launch,
    cuDNN/cuBLAS autotuning.

    Why it matters: the GPU sits idle through it, so every other figure of the trace (busy ratio,
    idle gaps) describes start-up, not the service's steady state; and if the service pays it on
    its first requests, users see a latency spike of seconds (cold start without warm-up).

    How it decides: ``kineto.slowest_call_ms`` ≥ ``min_call_ms`` and the call is at least
    ``min_share`` of ``kineto.host_span_ms`` or of the GPU window
    (``kineto.slowest_call_window_share``). Impact is the larger of those shares. Category
    ``recompilation``: the table's home of "cold start without warm-up".

    Evidence: kineto.slowest_call_ms, kineto.host_span_ms; optionally kineto.slowest_call,
    kineto.slowest_call_window_share, trace.window_ms, trace.gpu_busy_ratio.

    Fix: warm up before serving (and before profiling: ``torch.profiler.schedule(wait=1, warmup=1,
    active=3)``); create the CUDA context at start-up; ``CUDA_MODULE_LOADING=EAGER`` when lazy
    loading costs the first request; cache autotuning results.

    False positives: a trace taken on purpose around start-up; a blocking call that waits for
    another process (the slowest call is then a synchronisation, which GPU104 judges).
    """

    code = "GPU109"
    name = "cold-start-in-trace"
    category = Category.RECOMPILATION
    requires = ("kineto.slowest_call_ms", "kineto.host_span_ms")
    optional = ("kineto.slowest_call", "kineto.slowest_call_window_share", "trace.window_ms", "trace.gpu_busy_ratio")

    SYNC_PREFIXES = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "hipDeviceSynchronize",
                     "hipStreamSynchronize", "hipEventSynchronize", "cudaMemcpy", "hipMemcpy")

    @dataclass(frozen=True)
    class Thresholds:
        min_call_ms: float = 1000.0  # a runtime call of a second or more is start-up work, not a step
        min_share: float = 0.2  # it fills a fifth of the traced host time or GPU window

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        call_ms = ev.value("kineto.slowest_call_ms", 0.0) or 0.0
        span_ms = ev.value("kineto.host_span_ms", 0.0) or 0.0
        got = ev.get("kineto.slowest_call")
        name = str(got.value) if isinstance(got, Evidence) else "a runtime call"
        if call_ms < t.min_call_ms or name.startswith(self.SYNC_PREFIXES):
            return None
        in_window = ev.value("kineto.slowest_call_window_share", 0.0) or 0.0
        impact = max(call_ms / span_ms if span_ms > 0 else 0.0, in_window)
        if impact < t.min_share:
            return None
        msg = (f"One runtime call, {name}, takes {fmt_ms(call_ms)}: {pct(call_ms / span_ms if span_ms else 1.0)} of "
               f"the {fmt_ms(span_ms)} the trace covers on the host"
               + (f", and the GPU idles through {pct(in_window)} of its active window" if in_window else "")
               + ". That is start-up (CUDA context creation, lazy module loading, autotuning), not steady state: the "
               "trace's busy and idle figures describe the cold start, and a service that pays it on its first "
               "requests answers them seconds late.")
        return self.finding(
            severity=severity_for(impact),
            confidence=Confidence.MEASURED,
            title="The trace captured a cold start",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"one call |{bar(min(1.0, impact))}| {pct(min(1.0, impact))} of the trace",
            fixes=[
                Fix("Warm up before serving and before profiling",
                    ("Run a few dummy requests (every batch size / shape you serve) at start-up before taking "
                     "traffic; mark the pod ready only after",
                     "Profile steady state: torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, "
                     "warmup=1, active=3)) and step the profiler each iteration"),
                    Risk.SAFE),
                Fix("Pay start-up costs once, early",
                    ("Create the CUDA context at start-up (torch.cuda.init() / a first small tensor on the device)",
                     "CUDA_MODULE_LOADING=EAGER when lazy kernel loading delays the first requests; keep autotuning "
                     "caches (TORCHINDUCTOR_CACHE_DIR, cuDNN benchmark off for variable shapes)"),
                    Risk.NEEDS_VALIDATION),
            ],
        )


def _kernel(name: str) -> str:
    """A kernel's name without its return type and template or call arguments (``void f<T>(…)`` → ``f``)."""
    base = name.removeprefix("void ")
    for cut in ("<", "("):
        base = base.split(cut, 1)[0]
    return base[:80] or name[:80]


class RankImbalance(Rule):
    """One rank computes longer than the others over the same steps, and every collective waits for it.

    What it detects: several PyTorch-profiler traces, one per rank, profiled together (their kernel
    spans overlap and have the same length), in which one rank's computation-kernel time (HTA's
    compute) is well above the median rank's; the others spend the difference waiting for it.

    Why it matters: with tensor, expert or data parallelism every step ends in a collective, so the
    step is as slow as its slowest rank: in an inference service each token (or batch) waits for it,
    and the faster ranks' GPUs idle or spin in communication kernels. Making the fast ranks faster
    changes nothing; evening out the work, or fixing the slow rank's GPU, does.

    How it decides: ``kineto.ranks.compute_imbalance_ratio`` (the slowest rank's compute over the
    median rank's) ≥ ``min_ratio`` and ``kineto.ranks.wait_share`` (the difference over the shared
    window: what the median rank waits per window) ≥ ``min_wait_share``. Impact is the wait share.
    ``kineto.ranks.kernels_unchanged_share`` says which kind: some kernels as fast on both ranks
    while others take much longer is more work on the slow rank; every kernel slower alike is a
    slower GPU, or more of every kind of work. Category ``gpu_compute``: the slow rank's GPU time is
    what the service waits for.

    Evidence: kineto.ranks.compute_imbalance_ratio, kineto.ranks.wait_share, kineto.ranks.slowest;
    optionally kineto.ranks.count, kineto.ranks.compute_spread_ms, kineto.ranks.comm_exposed_share_max,
    kineto.ranks.kernels_unchanged_share, kineto.ranks.excess_kernels, kineto.ranks.table.

    Fix: even out the work (re-plan embedding-table sharding with measured costs, expert-parallel load
    balancing, balance tokens rather than requests across data-parallel ranks); check the slow rank's
    GPU (clock-throttle reasons, power and thermal limits, a different SKU or MIG slice, NUMA placement).

    False positives: ranks that do different work by design (pipeline-parallel stages: compare ranks of
    one stage); a short trace of data-dependent steps (variable sequence lengths) where the heavy
    step fell on one rank by chance: profile several steps.
    """

    code = "GPU111"
    name = "rank-imbalance"
    category = Category.GPU_COMPUTE
    requires = ("kineto.ranks.compute_imbalance_ratio", "kineto.ranks.wait_share", "kineto.ranks.slowest")
    optional = ("kineto.ranks.count", "kineto.ranks.compute_spread_ms", "kineto.ranks.comm_exposed_share_max",
                "kineto.ranks.kernels_unchanged_share", "kineto.ranks.excess_kernels", "kineto.ranks.table")

    @dataclass(frozen=True)
    class Thresholds:
        min_ratio: float = 1.10  # a rank's kernel time varies by a few % from step to step; 10 % more is a pattern
        min_wait_share: float = 0.02  # under 2 % of the window spent waiting is not worth rebalancing
        uneven_share: float = 0.2  # a fifth of the kernel time running as fast on both: the extra is more work

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        ratio = ev.value("kineto.ranks.compute_imbalance_ratio", 0.0) or 0.0
        wait = ev.value("kineto.ranks.wait_share", 0.0) or 0.0
        if ratio < t.min_ratio or wait < t.min_wait_share:
            return None
        slow = ev.value("kineto.ranks.slowest")
        rank = f"Rank {slow:.0f}" if slow is not None else "One rank"
        spread = ev.value("kineto.ranks.compute_spread_ms")
        exposed = ev.value("kineto.ranks.comm_exposed_share_max")
        unchanged = ev.value("kineto.ranks.kernels_unchanged_share")
        got = ev.get("kineto.ranks.excess_kernels")
        kernels = got.value if isinstance(got, Evidence) and isinstance(got.value, list) else []
        slower = [k for k in kernels if isinstance(k, dict) and (k.get("excess_ms") or 0) > 0][:3]
        msg = (f"{rank} runs {pct(ratio - 1)} more GPU computation than the median rank over the same steps"
               + (f" (+{fmt_ms(spread)})" if spread is not None else "")
               + f": every collective waits for it, {pct(wait)} of the window for the median rank"
               + (f"; the faster ranks' wait shows as exposed communication (collectives running alone: up to "
                  f"{pct(exposed)} of a rank's window)" if exposed is not None else "") + ".")
        if unchanged is not None and unchanged >= t.uneven_share and slower:
            msg += (" The extra time is in " + ", ".join(
                f"{_kernel(str(k['name']))} (+{fmt_ms(float(k['excess_ms']))}, {float(k['ratio'] or 0):.1f}×)"
                for k in slower) + f"; {pct(unchanged)} of the kernel time runs as fast on both ranks: the slow "
                "rank has more work (uneven sharding of embedding tables or experts, more tokens routed to it), "
                "not a slower GPU.")
        elif unchanged is not None and unchanged < t.uneven_share:
            msg += (" Its kernels are slower alike: its GPU runs slower (clock throttling, power or thermal "
                    "limits, a different SKU or MIG slice), or it gets more of every kind of work.")
        return self.finding(
            severity=severity_for(wait),
            confidence=Confidence.THIN if _thin(ev, *self.requires) else Confidence.MEASURED,
            title=f"{rank} sets the pace: the other ranks wait for it",
            message=msg,
            impact=min(1.0, wait),
            evidence=present(ev, *self.requires, *self.optional),
            why=(f"slowest rank compute |{bar(min(1.0, ratio / 2))}| {ratio:.2f}× the median\n"
                 f"median rank waiting   |{bar(wait)}| {pct(wait)} of the window"),
            fixes=[
                Fix("Even out the work across ranks",
                    ("Embedding tables (TorchRec/FBGEMM): re-plan the sharding with measured pooling factors and "
                     "table sizes, splitting the hot tables row-wise over the ranks",
                     "Mixture of experts with expert parallelism: turn on expert load balancing (vLLM "
                     "--enable-eplb, SGLang --enable-eplb or redundant experts)",
                     "Data-parallel ranks: balance tokens per rank, not requests"),
                    Risk.NEEDS_VALIDATION),
                Fix("Check the slow rank's GPU",
                    ("nvidia-smi -q -d PERFORMANCE,CLOCK,POWER,TEMPERATURE on that rank's GPU: any clocks-throttle "
                     "reason (HW slowdown, power cap, thermal) while it runs",
                     "Compare the ranks' GPUs: SKU, MIG profile, nvidia-smi topo -m (link to its peers), and pin "
                     "each rank's process to the CPUs of its GPU's NUMA node"),
                    Risk.SAFE),
            ],
        )


class LaunchTimeInSummaryTable(Rule):
    """A profiler's summary table shows the host spending about as long launching kernels as the GPU runs them.

    What it detects: summary tables, not a timeline: ``nsys stats``' ``cuda_api_sum`` beside its kernel sum,
    or a PyTorch profiler table (``key_averages().table()``) with its ``Self CUDA time total``: the host
    time in kernel-launch calls (``cudaLaunchKernel``, ``cuLaunchKernel``, ``hipLaunchKernel``…) against the
    device's time (``api.launch_to_device_ratio``). A PyTorch table of the host's columns only gives the
    launch calls' share of the host's self time (``api.launch_host_share``) instead.

    Why it matters: each launch costs the host microseconds; when the kernels are as short as their
    launches, the GPU finishes each before the next arrives and waits: small batches, decode steps and
    small models, where faster GPUs do not help. Fewer, larger launches (CUDA graphs, fusion) do.

    How it decides: at least ``min_launches`` launch calls, and launch time ≥ ``min_ratio`` × device time:
    confidence *measured*, impact ratio / (1 + ratio) (the GPU's idle share if launches and kernels took
    turns), at most ``max_impact``. Without the device's time: the launch calls take ≥ ``min_host_share``
    of the host's self time, confidence *heuristic* (the GPU's side is not in the table), impact that share.

    Evidence: api.launch_count and one of api.launch_to_device_ratio, api.launch_host_share; optionally
    api.launch_time_ms, api.launch_mean_us, profile.self_device_total_ms, gpu.kernel_time_ms.

    Fix: capture the steady path in CUDA graphs (``torch.compile(mode="reduce-overhead")``, vLLM/SGLang
    without ``--enforce-eager``/``--disable-cuda-graph``, llama.cpp's CUDA graphs on), fuse small ops
    (``torch.compile``), batch more work per launch.

    False positives: a profile of the first iterations (warm-up launches, autotuning) or a table that
    profiled only part of the program; the ratio counts all kernels, so a few long ones hide many short
    ones (a timeline, GPU106, shows them).
    """

    code = "GPU112"
    name = "launch-time-in-summary-table"
    category = Category.LAUNCH_OVERHEAD
    requires = ("api.launch_count",)
    requires_any = (("api.launch_to_device_ratio",), ("api.launch_host_share",))
    optional = ("api.launch_time_ms", "api.launch_mean_us", "profile.self_device_total_ms", "gpu.kernel_time_ms")

    @dataclass(frozen=True)
    class Thresholds:
        min_launches: float = 1000.0  # fewer launches than this is not a steady pattern
        min_ratio: float = 0.5  # the host spends at least half as long launching as the GPU computing (GPU106's bar)
        min_host_share: float = 0.2  # a fifth of the host's own time issuing launches
        max_impact: float = 0.9  # a table cannot show the GPU entirely idle: some kernels do run

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        n = ev.value("api.launch_count") or 0.0
        if n < t.min_launches:
            return None
        ratio, share = ev.value("api.launch_to_device_ratio"), ev.value("api.launch_host_share")
        launch_ms, mean_us = ev.value("api.launch_time_ms"), ev.value("api.launch_mean_us")
        each = f" ({mean_us:.1f} µs each)" if mean_us is not None else ""
        if ratio is not None:
            if ratio < t.min_ratio:
                return None
            conf, impact = Confidence.MEASURED, min(t.max_impact, ratio / (1.0 + ratio))
            msg = (f"The host spent {launch_ms or 0.0:.0f} ms in {n:.0f} kernel-launch calls{each}, {ratio:.2g}× the "
                   "time the GPU spent running kernels: kernels end about as fast as they are launched, so the "
                   "GPU waits for the host between them.")
        elif share is not None and share >= t.min_host_share:
            conf, impact = Confidence.HEURISTIC, min(t.max_impact, share)
            msg = (f"Kernel-launch calls take {pct(share)} of the host's own time in the profile: {n:.0f} launches"
                   f"{each}. The table has no device time, so whether the GPU waits for them is not measured; many "
                   "short launches from one thread is the signature of launch overhead.")
        else:
            return None
        return self.finding(
            severity=severity_for(impact),
            confidence=conf,
            title="Kernel launches take as long as the kernels",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, "api.launch_to_device_ratio", "api.launch_host_share",
                             *self.optional),
            fixes=[
                Fix("Launch less often", (
                    "Capture the steady path in CUDA graphs: torch.compile(mode=\"reduce-overhead\") or "
                    "torch.cuda.graphs; serving engines: vLLM without --enforce-eager, SGLang without "
                    "--disable-cuda-graph",
                    "Fuse small ops (torch.compile) and batch more requests per forward",
                ), Risk.NEEDS_VALIDATION),
            ],
        )


RULES: tuple[type[Rule], ...] = (DispatchBound, ColdStartInTrace, RankImbalance, LaunchTimeInSummaryTable)
