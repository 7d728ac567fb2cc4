"""Queueing observed from outside: requests wait for busy workers, or for a lock one thread holds."""

from __future__ import annotations

from dataclasses import dataclass

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Risk
from diagnose.rules.base import Rule, bar, present, ramp, ramp_for, severity_for, stderr
from diagnose.units import pct


class QueueingObserved(Rule):
    """Requests pile up in front of workers that are all busy.

    What it detects: many more requests in flight on the service's listening sockets (accepted
    connections plus the kernel's accept queue) than Python threads actually serving, with those
    threads saturated.

    Why it matters: by Little's law, with N requests in the system and S being served, a request
    spends about (N - S) / N of its latency waiting; p99 grows with load while the model's own
    time stays flat.

    How it decides: ``conn.inflight_mean`` (N) against ``min_inflight``, N against ``min_ratio`` × the
    number of serving threads (S: ``workers.active_mean``, at least 1), and the busiest worker's
    saturation (``workers.busiest_active_ratio``) against ``min_saturation`` when known. None of these
    is a cut: from each threshold the weight *ramps* up to 1 over a band as wide as twice the
    measurement's own uncertainty (``conn.inflight_mean.stderr``: the spread of sub-window means; at
    least ``inflight_band`` requests; 0.1 of saturation), and the impact — the waiting share
    (N - S) / N — is scaled by each ramp, so an in-flight mean wobbling around 4.0 moves the impact a
    little instead of making a full-size finding appear and vanish. Two better numbers replace the
    estimate when the service reports them: a batching engine serves ``serving.running_mean``
    requests at once (S is at least that), and a measured
    queue share of latency (``stage.queue.share``, from the stage log or the engine's queue-time
    histogram) is the waiting share itself. When the saturated workers spend their time on a cause
    with its own rule — pre-processing (``cpu.preprocess_share``, CPU001), compiling
    (``cpu.compile_share``/``wall.compile_share``, CMP001), waiting for a lock (``wall.lock_wait_share``,
    QUE010) — the queue is that cause's symptom: the impact is discounted by the cause's share (ramped
    from ``cause_share`` - 0.25 to ``cause_share``) and, when the cause's own finding is found and
    weighs at least half as much, it leads and this one ranks right after it, naming the queue as its
    symptom.

    Evidence: conn.inflight_mean, workers.active_mean; optionally conn.inflight_mean.stderr,
    workers.busiest_active_ratio, workers.busy_count, conn.inflight_max, cpu.preprocess_share,
    cpu.compile_share, wall.compile_share, wall.lock_wait_share, serving.running_mean, stage.queue.share.

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
        "conn.inflight_mean.stderr",
        "workers.busiest_active_ratio",
        "workers.busy_count",
        "conn.inflight_max",
        "cpu.preprocess_share",
        "cpu.compile_share",
        "wall.compile_share",
        "wall.lock_wait_share",
        "serving.running_mean",
        "stage.queue.share",
    )
    symptom_of = ("CPU001", "CPU002", "CMP001", "QUE010")

    @dataclass(frozen=True)
    class Thresholds:
        min_inflight: float = 4.0  # fewer than four waiting requests is ordinary concurrency
        inflight_band: float = 1.0  # full weight at least one request above min_inflight
        min_ratio: float = 3.0  # three requests per serving thread: most of them are waiting
        min_saturation: float = 0.8  # the busiest worker runs ≥ 80 % of the window (full weight at 90 %)
        cause_share: float = 0.5  # workers busy ≥ half the time with one activity: that is the cause
        min_waiting: float = 0.2  # under a fifth of latency spent waiting, the queue is not the bottleneck

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        inflight = ev.value("conn.inflight_mean", 0.0) or 0.0
        serving = max(1.0, ev.value("workers.active_mean", 0.0) or 0.0, ev.value("serving.running_mean", 0.0) or 0.0)
        saturation = ev.value("workers.busiest_active_ratio")
        band = max(t.inflight_band, 2 * stderr(ev, "conn.inflight_mean"))
        weight = ramp(inflight, t.min_inflight, band) * ramp(inflight / serving, t.min_ratio, band / serving)
        if saturation is not None:
            weight *= ramp(saturation, t.min_saturation, 0.1)
        if weight <= 0 or inflight <= 0:
            return None
        waiting = max(0.0, (inflight - serving) / inflight)
        measured = ev.value("stage.queue.share")
        if measured is not None:
            waiting = measured
        weight *= ramp(waiting, t.min_waiting, 0.05)
        if weight <= 0:
            return None
        impact = waiting * weight
        cause = ""
        best = 0.0
        for key, label in (("cpu.preprocess_share", "pre-processing"), ("cpu.compile_share", "compiling"),
                           ("wall.compile_share", "compiling"), ("wall.lock_wait_share", "waiting for a lock")):
            share = ev.value(key, 0.0) or 0.0
            discount = share * ramp(share, t.cause_share - 0.25, 0.25)
            if discount > best:
                best = discount
                cause = (f" The workers spend {pct(share)} of their time {label}: the queue is its symptom, "
                         "fix that first.")
        impact *= 1.0 - best
        msg = (
            f"{inflight:.1f} requests are in flight on average but only {serving:.1f} thread(s) serve them"
            + (f" (busiest worker busy {pct(saturation)} of the window)" if saturation is not None else "")
            + (f": by Little's law about {pct(waiting)} of each request's latency is waiting in a queue."
               if measured is None else f"; the service measures {pct(waiting)} of latency spent queued.")
            + (f" Measured near the thresholds (in flight {inflight:.1f} ±{stderr(ev, 'conn.inflight_mean'):.1f} "
               f"against {t.min_inflight:.0f}): impact scaled to {pct(weight)}." if weight < 1 else "")
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


def _sites(ev: EvidenceSet, key: str, n: int = 2) -> str:
    got = ev.get(key)
    if not isinstance(got, Evidence) or not isinstance(got.value, list):
        return ""
    return "; ".join(f"{item.get('site', '?')} ({pct(float(item.get('share', 0.0)))})"
                     for item in got.value[:n] if isinstance(item, dict))


def _others(ev: EvidenceSet, n: int = 2) -> str:
    got = ev.get("wall.other_threads")
    if not isinstance(got, Evidence) or not isinstance(got.value, list):
        return ""
    return "; ".join(f"`{row.get('thread', '?')}` busy {pct(float(row.get('busy_share', 0.0)))} of the window, "
                     f"mostly at {row.get('site', '?')}" for row in got.value[:n] if isinstance(row, dict))


class LockContention(Rule):
    """Requests wait for a lock held by another thread.

    What it detects: the threads that serve requests spend a large share of their wall-clock time
    blocked on a lock, a semaphore or a condition variable (``with lock:``, ``lock.acquire()``,
    ``Condition.wait``) — typically one model instance, cache or client guarded by a lock that a
    background thread (a weight refresher, a metrics flusher, a batcher) or one slow request holds.

    Why it matters: a lock held by one thread serialises every request behind it: the requests wait
    in a queue that no metric shows (the in-flight count may be low, the CPU idle), and latency grows
    with the holder's critical section, not with the model.

    How it decides: ``wall.lock_wait_share`` (share of request-thread wall time blocked on a lock or
    condition, from py-spy ``--idle`` samples classified by docs/waits.md: a C lock has no Python
    frame, so the source line the blocked thread stands on says it is a ``with lock:``) is at least
    ``min_share``; the impact is the share, ramped up from nothing at ``min_share`` to full
    ``share_band`` (or twice the share's uncertainty, ``wall.lock_wait_share.stderr``) above it. The category is
    ``queueing``: requests wait for a resource one thread holds, i.e. too little capacity behind
    the lock. Threads serving no request that were busy meanwhile (``wall.other_threads``) are named
    as the likely holders.

    Evidence: wall.lock_wait_share, wall.samples; optionally wall.lock_wait_share.stderr,
    wall.top.lock_wait, wall.other_threads, wall.request_threads.

    Fix: shrink the critical section (copy what you need under the lock, work outside it); do the
    background work off to the side and swap the result in atomically (build new weights, then
    assign the reference); use a readers-writer scheme or one model instance per worker instead of
    a shared locked one.

    False positives: a lock that *is* the intended queue of a single-instance model (one GPU, one
    model, requests serialised on purpose): then the finding is a capacity question — add instances
    or batch — rather than a bug.
    """

    code = "QUE010"
    name = "requests-wait-on-lock"
    category = Category.QUEUEING
    requires = ("wall.lock_wait_share", "wall.samples")
    optional = ("wall.lock_wait_share.stderr", "wall.top.lock_wait", "wall.other_threads", "wall.request_threads")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.20  # a fifth of request time blocked on a lock is a serialisation point
        share_band: float = 0.05  # full impact 5 pp (or 2 standard errors) above min_share
        min_samples: float = 30  # fewer wall-clock samples of request threads is a thin view

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        share = ev.value("wall.lock_wait_share", 0.0) or 0.0
        samples = ev.value("wall.samples", 0.0) or 0.0
        weight = ramp_for(ev, "wall.lock_wait_share", t.min_share, t.share_band)
        if weight <= 0 or samples <= 0:
            return None
        where = _sites(ev, "wall.top.lock_wait")
        others = _others(ev)
        threads = ev.value("wall.request_threads")
        msg = (f"Request threads{f' ({threads:.0f})' if threads else ''} spend {pct(share)} of their "
               "wall-clock time blocked on a lock or condition"
               + (f", at {where}" if where else "") + "."
               + (f" Meanwhile, threads serving no request: {others}." if others else "")
               + (f" Just above the threshold (±{stderr(ev, 'wall.lock_wait_share'):.2f}): impact scaled to "
                  f"{pct(weight)}." if weight < 1 else ""))
        return self.finding(
            severity=severity_for(share * weight),
            confidence=Confidence.MEASURED if samples >= t.min_samples else Confidence.THIN,
            title="Requests wait for a lock held by another thread",
            message=msg,
            impact=share * weight,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"lock wait |{bar(share)}| {pct(share)}\nthe rest  |{bar(1 - share)}| {pct(1 - share)}",
            fixes=[
                Fix(
                    "Shrink what the lock guards",
                    (
                        "Hold the lock only to read or swap a reference: build new weights / caches outside it "
                        "and assign them under it in one statement",
                        "Move the holder's slow work (I/O, reloads, flushes) out of the critical section",
                    ),
                    Risk.NEEDS_VALIDATION,
                ),
                Fix(
                    "Stop sharing one locked instance",
                    (
                        "One model instance per worker process (uvicorn --workers N, LitServe workers_per_device)",
                        "Or batch the waiting requests behind the lock into one forward",
                    ),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )


RULES: tuple[type[Rule], ...] = (QueueingObserved, LockContention)
