"""Thread oversubscription: more busy threads than cores (or than the container's CPU quota), and CFS throttling."""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.model import Category, Confidence, EvidenceSet, Finding, Fix, Risk
from diagnose.rules.base import Rule, bar, present, ramp, severity_for
from diagnose.units import pct


class ThreadOversubscription(Rule):
    """More busy threads than cores: the threads wait for a CPU more than they should.

    What it detects: the target's process tree keeps many more threads busy than it has cores
    (typically torch intra-op threads × worker processes, or OpenMP/MKL pools per worker), and its
    threads spend a large part of their runnable time waiting in the kernel's run queue.

    Why it matters: every worker's intra-op pool assumes it owns all cores; N workers × N threads
    on N cores context-switch constantly, caches thrash and per-request latency rises while total
    throughput falls.

    How it decides: the CPU budget is ``host.cores`` (the CPUs the target may run on), or the
    container's CFS quota (``cgroup.cpu_quota_cores``) when that is smaller. ``threads.busy_count``
    (threads runnable — running or waiting in the run queue — for ≥ 10 % of the window: demand, since
    oversubscribed threads each *get* little CPU) is at least ``min_ratio`` × the budget (and at
    least 2), ``proc.runqueue_wait_ratio`` (run-queue wait / (run + wait), from
    /proc/PID/task/TID/schedstat) is at least ``min_wait`` (the impact ramps up over the next 0.05),
    and the target's own demand (``threads.runnable_mean``, threads wanting a CPU on average) exceeds
    ``min_demand`` × the budget: a service that wants less
    CPU than it has but waits anyway is waiting for *other* tenants of the host, which no thread pool
    setting of its own fixes. Involuntary context switches corroborate it.

    Polling is not demand: a thread that spins on a queue (vLLM's shared-memory ``MessageQueue``
    readers, in the EngineCore and each worker, call ``os.sched_yield`` in a loop for a second after
    every message) is runnable all the time but gives its CPU to any thread with work. When py-spy
    profiled the threads, the part of each one's runnable time spent in waiting frames is taken out
    (``threads.polling_runnable``: the larger of what its on-CPU samples and its wall-clock ticks
    show, at the cautious end of a 95 % interval), and the busy count and the demand are the work's
    (``threads.work_busy_count``, ``threads.work_runnable_mean``). Threads py-spy does not see
    (OpenMP/MKL pools) keep their whole demand, and so do threads computing in Python; a thread woken
    from a lock waits for a CPU in the lock's frame and is taken for polling too. Under a CPU quota
    nothing is taken out: polling spends the quota the work needs. The lab's vLLM CPU engine
    (``tests/engines``) on 2 cores spins its EngineCore and its worker: a CI run of it serving 2
    clients (4 threads busy, 2.9 runnable, 33 % wait) had been named oversubscribed; of the 2.3–2.6
    threads runnable in 10 recordings of it (2–16 clients, local and CI), 1.3–1.6 were work.

    Evidence: host.cores, threads.busy_count, proc.runqueue_wait_ratio; optionally
    cgroup.cpu_quota_cores, threads.runnable_mean, threads.polling_runnable, threads.work_runnable_mean,
    threads.work_busy_count, proc.involuntary_switches_per_s, proc.threads, proc.processes.

    Fix: size the pools: ``torch.set_num_threads(cores // workers)`` / ``OMP_NUM_THREADS`` and
    ``MKL_NUM_THREADS`` per worker, fewer worker processes, pin workers to cores.

    False positives: other tenants on the host also cause run-queue wait; the rule requires the
    busy threads, and a demand above the budget, to be the target's own.
    """

    code = "THR001"
    name = "thread-oversubscription"
    category = Category.THREAD_OVERSUBSCRIPTION
    requires = ("host.cores", "threads.busy_count", "proc.runqueue_wait_ratio")
    symptom_of = ("THR010",)  # a throttled group's threads wait in the run queue: the quota is the cause
    optional = ("cgroup.cpu_quota_cores", "threads.runnable_mean", "threads.polling_runnable",
                "threads.work_runnable_mean", "threads.work_busy_count", "proc.involuntary_switches_per_s",
                "proc.threads", "proc.processes")

    @dataclass(frozen=True)
    class Thresholds:
        min_ratio: float = 2.0  # twice as many busy threads as cores cannot all run
        min_wait: float = 0.3  # threads wait ≥ 30 % of their runnable time for a CPU
        min_demand: float = 1.0  # the target itself wants more CPU than its budget (else others make it wait)

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        host = ev.value("host.cores", 0.0) or 0.0
        quota = ev.value("cgroup.cpu_quota_cores")
        cores = min(host, quota) if quota else host
        busy = ev.value("threads.busy_count", 0.0) or 0.0
        wait = ev.value("proc.runqueue_wait_ratio", 0.0) or 0.0
        runnable = ev.value("threads.runnable_mean")
        # a thread polling a queue yields to any thread with work: its spinning is not demand for the host's
        # cores; under a CPU quota it is, as it spends the quota the work needs
        polling = 0.0
        if not (quota and quota < host):
            polling = ev.value("threads.polling_runnable", 0.0) or 0.0
            work_busy = ev.value("threads.work_busy_count")
            work = ev.value("threads.work_runnable_mean")
            if work_busy is not None:
                busy = min(busy, work_busy)
            if work is not None and runnable is not None:
                runnable = min(runnable, work)
        if cores <= 0 or busy < max(2.0, t.min_ratio * cores):  # one thread cannot oversubscribe anything
            return None
        if runnable is not None and runnable < t.min_demand * cores:
            return None
        weight = ramp(wait, t.min_wait, 0.05)
        if weight <= 0:
            return None
        invol = ev.value("proc.involuntary_switches_per_s")
        budget = (f"the container's CPU quota of {cores:.2g} cores" if quota and quota < host
                  else f"{cores:.0f} cores")
        demand = ""
        if runnable is not None:
            spun = f", not counting {polling:.1f} polling a queue" if polling >= 0.05 else ""
            demand = f" ({runnable:.1f} want a CPU at any moment{spun})"
        msg = (
            f"{busy:.0f} threads are busy on {budget}{demand}"
            + f"; they wait {pct(wait)} of their runnable time in the run queue"
            + (f", with {invol:.0f} involuntary context switches per second" if invol is not None else "")
            + "."
        )
        return self.finding(
            severity=severity_for(wait * weight),
            confidence=Confidence.CORRELATED if invol is not None else Confidence.MEASURED,
            title="More busy threads than cores",
            message=msg,
            impact=wait * weight,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"run-queue wait |{bar(wait)}| {pct(wait)}",
            fixes=[
                Fix(
                    "Size thread pools to the cores you have",
                    (
                        "Per worker process: torch.set_num_threads(max(1, cores // workers)); set "
                        "OMP_NUM_THREADS and MKL_NUM_THREADS to the same value",
                        "Run fewer worker processes, or pin each to its own cores (taskset / "
                        "cpuset in the container spec)",
                    ),
                    Risk.SAFE,
                )
            ],
        )


class CfsThrottling(Rule):
    """The container's CPU quota throttles the service.

    What it detects: the target's cgroup (its own or an ancestor's: the Kubernetes pod and container
    levels) has a CFS quota (``cpu.max``, v1 ``cpu.cfs_quota_us``) and ran out of it in a large share
    of the enforcement periods during the window, so the kernel stopped all its threads until the
    next period — however idle the host's other cores were.

    Why it matters: a quota is a budget per period (100 ms by default): a service whose threads burst
    past it (several torch intra-op threads, a tokenizer pool, a garbage collection) is stopped for
    the rest of the period, which adds up to tens of milliseconds per request and shows as p99
    latency with the host's CPU "idle". More threads make it worse: they use the quota up faster.

    How it decides: ``cgroup.throttled_ratio`` (throttled periods / periods in the window, from the
    group's ``cpu.stat`` at both ends) is at least ``min_ratio`` (the impact ramps up over the next
    0.05), with at least
    ``min_periods`` periods observed and a quota known (``cgroup.cpu_quota_cores``). The impact is the
    throttled share of periods, scaled by the ramp. The process's own demand
    (``threads.runnable_mean``, threads wanting a CPU) and CPU use (``proc.cpu_cores_used``) are shown
    against the quota.

    Evidence: cgroup.throttled_ratio, cgroup.cpu_quota_cores, cgroup.periods; optionally
    cgroup.throttled_periods, cgroup.throttled_s, cgroup.cpu_period_us, threads.runnable_mean,
    proc.cpu_cores_used, host.cores.

    Fix: raise the CPU limit (or remove it and keep the request, as many platforms now recommend),
    or make the service fit its quota: size thread pools to the quota (``torch.set_num_threads``,
    ``OMP_NUM_THREADS`` = the quota rounded down), fewer worker processes; a shorter CFS period is
    rarely the answer.

    False positives: a batch job sharing the group that is meant to be throttled; throttling in a
    window where the service was starting up (imports, weight loading).
    """

    code = "THR010"
    name = "cfs-throttled"
    category = Category.THREAD_OVERSUBSCRIPTION
    requires = ("cgroup.throttled_ratio", "cgroup.cpu_quota_cores", "cgroup.periods")
    optional = ("cgroup.throttled_periods", "cgroup.throttled_s", "cgroup.cpu_period_us", "threads.runnable_mean",
                "proc.cpu_cores_used", "host.cores")

    @dataclass(frozen=True)
    class Thresholds:
        min_ratio: float = 0.2  # throttled in a fifth of the periods: a stall every half second at 100 ms periods
        min_periods: float = 20  # fewer enforcement periods (2 s at 100 ms) say little

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        ratio = ev.value("cgroup.throttled_ratio", 0.0) or 0.0
        quota = ev.value("cgroup.cpu_quota_cores", 0.0) or 0.0
        periods = ev.value("cgroup.periods", 0.0) or 0.0
        weight = ramp(ratio, t.min_ratio, 0.05)
        if weight <= 0 or quota <= 0 or periods < t.min_periods:
            return None
        throttled = ev.value("cgroup.throttled_periods")
        secs = ev.value("cgroup.throttled_s")
        period = ev.value("cgroup.cpu_period_us")
        demand = ev.value("threads.runnable_mean")
        used = ev.value("proc.cpu_cores_used")
        msg = (f"The container's CPU quota is {quota:.2g} cores"
               + (f" ({quota * period:.0f} µs per {period:.0f} µs period)" if period else "")
               + f": in {throttled if throttled is not None else ratio * periods:.0f} of {periods:.0f} periods "
               f"({pct(ratio)}) the service used it up and the kernel stopped its threads until the next period"
               + (f", {secs:.1f} s of throttling in the window" if secs is not None else "")
               + "."
               + (f" The service used {used:.2f} cores" if used is not None else "")
               + (f" while {demand:.1f} threads wanted a CPU on average" if demand is not None else "")
               + ("." if used is not None or demand is not None else ""))
        return self.finding(
            severity=severity_for(ratio * weight),
            confidence=Confidence.MEASURED,
            title="CPU quota throttling stalls the service",
            message=msg,
            impact=ratio * weight,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"throttled periods |{bar(ratio)}| {pct(ratio)}",
            fixes=[
                Fix(
                    "Give the service the CPU it uses",
                    (
                        "Raise the container's CPU limit (Kubernetes resources.limits.cpu; docker --cpus) to "
                        "at least the demand shown, or drop the limit and keep a request",
                    ),
                    Risk.NEEDS_VALIDATION,
                ),
                Fix(
                    "Make the service fit its quota",
                    (
                        "Size thread pools to the quota, not the host: torch.set_num_threads(max(1, int(quota))) and "
                        "OMP_NUM_THREADS / MKL_NUM_THREADS the same, per worker process",
                        "Run fewer worker processes in the container",
                    ),
                    Risk.SAFE,
                ),
            ],
        )


class LlamaThreads(Rule):
    """A ggml engine (llama.cpp, and whisper.cpp, ollama's runner …) computes with more threads than the host has CPUs.

    What it detects: the start-up line of system information ggml's programs print (``system_info:
    n_threads = A (n_threads_batch = B) / C``, llama-server's ``system info: n_threads = A,
    n_threads_batch = B, total_threads = C`` and its older key=value and JSON records; ollama's runner
    printed the same) names the threads the CPU backend computes with (``-t``, ``-tb``; ollama's
    ``num_thread``) against the logical CPUs the host has (``std::thread::hardware_concurrency``).

    Why it matters: ggml splits every operation across its threads and makes them all wait for the
    slowest at each step (a spinning barrier). A thread the kernel cannot run at once stalls all the
    others: more threads than CPUs turn a fast run into a crawl (ollama#8074: 36 threads on 36 logical
    CPUs at 87 tokens/s, 37 at 0.03).

    How it decides: the larger of A and B above C, while the CPU computes layers. With layers left on
    the CPU or no GPU seen it is ``measured`` at ``over_impact`` (the engine printed both numbers); with
    a GPU seen (a buffer on it, or a GPU backend in the line) and no word of the layers it is a
    ``heuristic`` at ``gpu_impact``; with every layer on the GPU the threads barely run (ollama#9306) and
    nothing is said. A equal to C is not judged: llama.cpp's default is the physical cores, so A = C
    under it means a host without SMT, and ``-t`` set to every logical CPU on an SMT host costs far less
    than a thread too many (``lscpu``'s ``Thread(s) per core`` tells them apart).

    Evidence: llamacpp.threads, llamacpp.host_cpus; optionally llamacpp.threads_batch,
    llamacpp.gpu_layers, llamacpp.layers_total, llamacpp.gpu_backend, llamacpp.build_gpu.

    Fix: ``-t`` (and ``-tb``) at most the physical cores (``lscpu``: Core(s) per socket × sockets),
    fewer when layers are on the GPU; ollama's ``num_thread`` the same.

    False positives: a CPU count the program saw that is not the host's (a container's CPU set
    narrower than the online CPUs shows more, never fewer).
    """

    code = "THR003"
    name = "llamacpp-threads"
    category = Category.THREAD_OVERSUBSCRIPTION
    requires = ("llamacpp.threads", "llamacpp.host_cpus")
    optional = ("llamacpp.threads_batch", "llamacpp.gpu_layers", "llamacpp.layers_total", "llamacpp.gpu_backend",
                "llamacpp.build_gpu")

    @dataclass(frozen=True)
    class Thresholds:
        over_impact: float = 0.8  # a thread that cannot run stalls every barrier: the run crawls (ollama#8074)
        gpu_impact: float = 0.5  # a GPU in use and its share of the layers unknown: the CPU's part may be small

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        n = ev.value("llamacpp.threads", 0.0) or 0.0
        batch = ev.value("llamacpp.threads_batch")
        hw = ev.value("llamacpp.host_cpus", 0.0) or 0.0
        most = max(n, batch or 0.0)
        if hw <= 0 or most <= hw:
            return None
        on_gpu, layers = ev.value("llamacpp.gpu_layers"), ev.value("llamacpp.layers_total")
        if on_gpu is not None and layers is not None and on_gpu >= layers:
            return None  # every layer on the GPU: the CPU's threads barely run
        gpu_seen = "llamacpp.gpu_backend" in ev or bool(ev.value("llamacpp.build_gpu"))
        unsure = gpu_seen and on_gpu is None
        impact, conf = (t.gpu_impact, Confidence.HEURISTIC) if unsure else (t.over_impact, Confidence.MEASURED)
        which = "n_threads" if n >= (batch or 0.0) else "n_threads_batch"
        msg = (f"The ggml engine computes with {most:.0f} threads ({which}) on a host with {hw:.0f} logical CPUs: "
               f"{most - hw:.0f} of them cannot run at any moment, and ggml makes every thread wait for the slowest "
               "at each step."
               + (" A GPU is in use and how many layers it holds is not shown: the CPU's share of the work, and "
                  "so what the threads cost, is not known." if unsure else ""))
        return self.finding(
            severity=severity_for(impact),
            confidence=conf,
            title="More compute threads than the host's CPUs",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"threads / logical CPUs |{bar(min(1.0, most / hw))}| {most:.0f} / {hw:.0f}",
            fixes=[
                Fix(
                    "Compute with the physical cores, not more",
                    (
                        "llama.cpp: -t (and -tb) = the physical cores (lscpu: Core(s) per socket × Socket(s)), "
                        "fewer when layers are on the GPU; the default has been the physical cores since "
                        "llama.cpp#934",
                        "ollama: num_thread the same (a Modelfile's PARAMETER num_thread, or the request's options)",
                        "Containers and VMs: the CPUs it may really use (nproc, the cgroup's cpu.max), not the "
                        "host's",
                    ),
                    Risk.SAFE,
                )
            ],
        )


RULES: tuple[type[Rule], ...] = (ThreadOversubscription, CfsThrottling, LlamaThreads)
