"""Queueing observed from outside: requests wait for busy workers."""

from __future__ import annotations

from dataclasses import dataclass

from analyzer.model import Category, Confidence, EvidenceSet, Finding, Fix, Risk
from rules.base import Rule, bar, pct, present, severity_for


class QueueingObserved(Rule):
    """Requests pile up in front of workers that are all busy.

    What it detects: many more requests in flight on the service's listening sockets (accepted
    connections plus the kernel's accept queue) than Python threads actually serving, with those
    threads saturated.

    Why it matters: by Little's law, with N requests in the system and S being served, a request
    spends about (N - S) / N of its latency waiting; p99 grows with load while the model's own
    time stays flat.

    How it decides: ``conn.inflight_mean`` is at least ``min_inflight`` and at least
    ``min_ratio`` × the number of serving threads (``workers.active_mean``, at least 1), and the
    busiest worker is saturated (``workers.busiest_active_ratio`` ≥ ``min_saturation``) when
    known. Impact is the waiting share (N - S) / N. Two better numbers replace the estimate when the
    service reports them: a batching engine serves ``serving.running_mean`` requests at once (S is at
    least that), and a measured queue share of latency (``stage.queue.share``, from the stage log or
    the engine's queue-time histogram) is the waiting share itself. When the busy workers spend most of their time
    pre-processing or compiling (``cpu.preprocess_share``, ``cpu.compile_share``), the queue is a
    symptom of that cause and the impact is discounted accordingly.

    Evidence: conn.inflight_mean, workers.active_mean; optionally workers.busiest_active_ratio,
    workers.busy_count, conn.inflight_max, cpu.preprocess_share, cpu.compile_share.

    Fix: add capacity (more workers or replicas, batching so one worker serves several requests),
    bound the queue and shed load (HTTP 429/503) instead of letting latency grow without limit.

    False positives: idle keep-alive connections count as in flight; a client that holds
    connections open without sending requests inflates N (hence the saturation check).
    """

    code = "QUE001"
    name = "queueing-observed"
    category = Category.QUEUEING
    requires = ("conn.inflight_mean", "workers.active_mean")
    optional = (
        "workers.busiest_active_ratio",
        "workers.busy_count",
        "conn.inflight_max",
        "cpu.preprocess_share",
        "cpu.compile_share",
        "serving.running_mean",
        "stage.queue.share",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_inflight: float = 4.0  # fewer than four waiting requests is ordinary concurrency
        min_ratio: float = 3.0  # three requests per serving thread: most of them are waiting
        min_saturation: float = 0.8  # the busiest worker runs ≥ 80 % of the window
        cause_share: float = 0.5  # workers busy ≥ half the time with one activity: that is the cause
        min_waiting: float = 0.2  # under a fifth of latency spent waiting, the queue is not the bottleneck

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        inflight = ev.value("conn.inflight_mean", 0.0) or 0.0
        serving = max(1.0, ev.value("workers.active_mean", 0.0) or 0.0, ev.value("serving.running_mean", 0.0) or 0.0)
        saturation = ev.value("workers.busiest_active_ratio")
        if inflight < t.min_inflight or inflight < t.min_ratio * serving:
            return None
        if saturation is not None and saturation < t.min_saturation:
            return None
        waiting = max(0.0, (inflight - serving) / inflight)
        measured = ev.value("stage.queue.share")
        if measured is not None:
            waiting = measured
        if waiting < t.min_waiting:
            return None
        impact = waiting
        cause = ""
        for key, label in (("cpu.preprocess_share", "pre-processing"), ("cpu.compile_share", "compiling")):
            share = ev.value(key, 0.0) or 0.0
            if share >= t.cause_share:
                impact = waiting * (1.0 - share)
                cause = f" The workers spend {pct(share)} of their time {label}: that is what to fix first."
        msg = (
            f"{inflight:.1f} requests are in flight on average but only {serving:.1f} thread(s) serve them"
            + (f" (busiest worker busy {pct(saturation)} of the window)" if saturation is not None else "")
            + (f": by Little's law about {pct(waiting)} of each request's latency is waiting in a queue."
               if measured is None else f"; the service measures {pct(waiting)} of latency spent queued.")
            + cause
        )
        return self.finding(
            severity=severity_for(impact),
            confidence=Confidence.CORRELATED if saturation is not None else Confidence.HEURISTIC,
            title="Requests queue behind saturated workers",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"waiting |{bar(waiting)}| {pct(waiting)}\nserving |{bar(1 - waiting)}| {pct(1 - waiting)}",
            fixes=[
                Fix(
                    "Add serving capacity",
                    (
                        "Run more model workers or replicas (uvicorn --workers, Triton instance_group "
                        "count, more pods behind the load balancer)",
                        "Batch requests (dynamic batching) so one forward serves several requests",
                    ),
                    Risk.NEEDS_VALIDATION,
                ),
                Fix(
                    "Bound the queue",
                    (
                        "Cap in-flight requests per worker and answer 429/503 beyond it so latency stays "
                        "bounded and the load balancer retries elsewhere",
                    ),
                    Risk.SAFE,
                ),
            ],
        )


RULES: tuple[type[Rule], ...] = (QueueingObserved,)
