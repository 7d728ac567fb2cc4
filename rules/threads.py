"""Thread oversubscription: more busy threads than cores."""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.model import Category, Confidence, EvidenceSet, Finding, Fix, Risk
from rules.base import Rule, bar, pct, present, severity_for


class ThreadOversubscription(Rule):
    """More busy threads than cores: the threads wait for a CPU more than they should.

    What it detects: the target's process tree keeps many more threads busy than it has cores
    (typically torch intra-op threads × worker processes, or OpenMP/MKL pools per worker), and its
    threads spend a large part of their runnable time waiting in the kernel's run queue.

    Why it matters: every worker's intra-op pool assumes it owns all cores; N workers × N threads
    on N cores context-switch constantly, caches thrash and per-request latency rises while total
    throughput falls.

    How it decides: ``threads.busy_count`` (threads runnable — running or waiting in the run
    queue — for ≥ 10 % of the window: demand, since oversubscribed threads each *get* little CPU) is at least
    ``min_ratio`` × ``host.cores`` and ``proc.runqueue_wait_ratio`` (run-queue wait / (run + wait),
    from /proc/PID/task/TID/schedstat) is at least ``min_wait``. Involuntary context switches
    corroborate it.

    Evidence: host.cores, threads.busy_count, proc.runqueue_wait_ratio; optionally
    proc.involuntary_switches_per_s, proc.threads, proc.processes.

    Fix: size the pools: ``torch.set_num_threads(cores // workers)`` / ``OMP_NUM_THREADS`` and
    ``MKL_NUM_THREADS`` per worker, fewer worker processes, pin workers to cores.

    False positives: other tenants on the host also cause run-queue wait; the rule requires the
    busy threads to be the target's own.
    """

    code = "THR001"
    name = "thread-oversubscription"
    category = Category.THREAD_OVERSUBSCRIPTION
    requires = ("host.cores", "threads.busy_count", "proc.runqueue_wait_ratio")
    optional = ("threads.runnable_mean", "proc.involuntary_switches_per_s", "proc.threads", "proc.processes")

    @dataclass(frozen=True)
    class Thresholds:
        min_ratio: float = 2.0  # twice as many busy threads as cores cannot all run
        min_wait: float = 0.3  # threads wait ≥ 30 % of their runnable time for a CPU

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        cores = ev.value("host.cores", 0.0) or 0.0
        busy = ev.value("threads.busy_count", 0.0) or 0.0
        wait = ev.value("proc.runqueue_wait_ratio", 0.0) or 0.0
        if cores <= 0 or busy < t.min_ratio * cores or wait < t.min_wait:
            return None
        invol = ev.value("proc.involuntary_switches_per_s")
        runnable = ev.value("threads.runnable_mean")
        msg = (
            f"{busy:.0f} threads are busy on {cores:.0f} cores"
            + (f" ({runnable:.1f} want a CPU at any moment)" if runnable is not None else "")
            + f"; they wait {pct(wait)} of their runnable time in the run queue"
            + (f", with {invol:.0f} involuntary context switches per second" if invol is not None else "")
            + "."
        )
        return self.finding(
            severity=severity_for(wait),
            confidence=Confidence.CORRELATED if invol is not None else Confidence.MEASURED,
            title="More busy threads than cores",
            message=msg,
            impact=wait,
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


RULES: tuple[type[Rule], ...] = (ThreadOversubscription,)
