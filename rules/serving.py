"""Queueing seen by the serving engine and the load generator: waiting requests, Little's law."""

from __future__ import annotations

import math
from dataclasses import dataclass

from diagnose.model import Category, Confidence, Evidence, EvidenceSet, Finding, Fix, Mechanism, Risk, Severity
from diagnose.rules import advice
from diagnose.rules.base import Rule, any_low_quality, bar, present, severity_for
from diagnose.units import pct


def _capacity_fixes(ev: EvidenceSet) -> tuple[Fix, ...]:
    """More capacity, or admitting only what there is: the queue-depth gauge named as the engine in use names it."""
    return (
        Fix(
            "Add serving capacity",
            (
                "Run more replicas behind the load balancer (or more model instances: Triton "
                "instance_group count, vLLM data parallel --data-parallel-size)",
                "Shard a large model over more GPUs (--tensor-parallel-size) so each replica serves more requests",
            ),
            Risk.NEEDS_VALIDATION,
        ),
        Fix(
            "Admit only what the server can serve",
            (
                "Cap concurrent requests at the gateway (or the client's --max-concurrency) near the "
                "server's capacity and answer 429/503 beyond it, so waiting time stays bounded",
                f"Autoscale on the queue depth ({advice.queue_gauge(ev)})",
            ),
            Risk.SAFE,
        ),
    )


def _num(ev: EvidenceSet, key: str) -> float | None:
    return ev.value(key)


def _default_max_num_seqs(ev: EvidenceSet, v0_default: float) -> float:
    """vLLM's default sequence limit for the deployment at hand: 1024 for V1 on a GPU of 70 GiB or more
    other than the A100 (``diagnose.rules.advice``), else ``v0_default`` (256, V0's and V1's elsewhere)."""
    gpu_mem = ev.value("gpu.spec_memory_bytes") or ev.value("gpu.memory_total_bytes")
    model = ev.get("gpu.spec_memory_bytes")
    a100 = isinstance(model, Evidence) and "A100" in model.detail.upper()
    if advice.vllm_generation(ev) == "V1" and gpu_mem and gpu_mem >= 70 * 2**30 and not a100:
        return 1024.0
    return v0_default


class EngineQueueSaturated(Rule):
    """The serving engine's scheduler queue holds requests it cannot admit.

    What it detects: vLLM / SGLang / TGI report requests *waiting* (``Pending``/``Waiting``, ``#queue-req``,
    ``tgi_queue_size``) next to the running batch, in most of the stats lines or scrapes, and names what
    caps the running batch (the finding's ``mechanism``): the KV cache (``kv_capacity``: usage ≥ ``kv_full``
    on average or at any sample with requests waiting, preemptions, swapping; or, with no stated sequence
    limit reached, a sample with requests waiting where the free cache (1 − usage) × running / usage holds
    fewer than ``kv_no_room_seqs`` sequences of the running ones' mean size), the sequence limit
    (``admission_cap``: running pinned at the stated ``max_num_seqs``, or ``cap_slack_seqs`` short of it
    when the KV cache has room — a sample taken after a step where a sequence finished reads one fewer — or
    at vLLM's default when none is stated (on vLLM or an engine not named) while the KV cache has room — 256
    in V0, and in V1 except on GPUs
    of 70 GiB or more other than the A100, where it is 1024 — or a small batch held at one size while the KV
    cache is nearly empty, its size read at the samples where a batch ran: a scrape between two steps reads
    0 running; and, raising the peak and the steadiness the samples saw, the window's batch, vLLM's
    generated tokens per engine step between two scrapes, when the requests spent at least
    ``min_queue_time_share`` of their time queued), or neither (``saturated_workers``: compute or the
    per-step token budget). When no sample with requests waiting saw a batch and the window's batch is not
    known: from vLLM V1's stats lines, every one with requests waiting and tokens generated in its interval,
    nothing deferred, a small limit (≤ ``small_batch``) stated and the KV cache nearly empty, likely the
    sequence limit (each line was written as the whole batch finished); else the mechanism is left unnamed
    and the message says what shows it.

    Requests that wait while no sample with them saw a batch running, the KV cache held nothing (under
    ``stall_kv``) and a stats interval generated no token (with no preemption or swapping), in two samples or more
    and still at the last one, are no queue for capacity: the scheduler has stopped (a hang, a dead worker). The
    rule then returns a note (severity info) saying so, with how to find where it is stuck, and no bottleneck.

    Why it matters: a waiting request's time to first token is the time until a running one
    finishes; TTFT and end-to-end latency grow with the queue while the model's own speed is
    unchanged, so tuning kernels or prompts does not help.

    How it decides: ``serving.waiting_max`` ≥ ``min_waiting`` (or any request waiting where the engine
    preempted ``min_preemptions`` times or more: its KV cache keeps running out); the queue is present in at least
    ``min_queued_share`` of the samples (when there are ``min_samples`` or more), unless the engine preempted
    requests while its KV cache was full where requests waited (``kv_full``): an eviction is no passing burst,
    however few samples caught the queue; and the waiting
    requests are at least ``min_wait_ratio`` of the running ones. The waiting share
    W / (W + R), with W the mean waiting count where requests waited and R the running count
    then, is the part of the requests in the server that are not being served; the impact is that
    share times the share of samples with a queue.

    Evidence: serving.waiting_max, serving.running_max; optionally serving.waiting_mean,
    serving.queued_sample_ratio, serving.stat_samples, serving.running_when_queued_mean,
    serving.running_when_queued_busy_mean,
    serving.running_when_queued_max, serving.kv_cache_usage_when_queued_mean_ratio,
    serving.kv_cache_usage_when_queued_max_ratio, serving.kv_free_sequences_when_queued_min,
    serving.kv_cache_usage_max_ratio, serving.preemptions,
    serving.swapped_max, serving.max_num_seqs, serving.max_num_batched_tokens, serving.batch_step_mean,
    serving.generation_tokens_per_s_min, serving.vllm_v1, serving.deferred_max,
    latency.ttft_ms.p99, stage.queue_ms.mean, stage.queue.share.

    Fix: by cause: more KV-cache memory (``--gpu-memory-utilization``, tensor parallelism,
    ``--kv-cache-dtype fp8``, a shorter ``--max-model-len``); a higher ``--max-num-seqs`` when the
    cache has room; more replicas and admission control otherwise.

    False positives: the start of a burst (everything arrives at once and the queue drains within
    seconds) looks the same in a single stats line; with several lines the ``min_queued_share``
    check separates a passing burst from a standing queue.
    """

    code = "QUE002"
    name = "engine-queue-saturated"
    category = Category.QUEUEING
    requires = ("serving.waiting_max", "serving.running_max")
    optional = (
        "serving.waiting_mean",
        "serving.queued_sample_ratio",
        "serving.stat_samples",
        "serving.running_when_queued_mean",
        "serving.running_when_queued_busy_mean",
        "serving.running_when_queued_max",
        "serving.kv_cache_usage_when_queued_mean_ratio",
        "serving.kv_cache_usage_when_queued_max_ratio",
        "serving.kv_free_sequences_when_queued_min",
        "serving.kv_cache_usage_max_ratio",
        "serving.preemptions",
        "serving.swapped_max",
        "serving.max_num_seqs",
        "serving.max_num_batched_tokens",
        "serving.batch_step_mean",
        "serving.generation_tokens_per_s_min",
        "serving.vllm_v1",
        "serving.deferred_max",
        "serving.waiting_last",
        "serving.queued_samples",
        "latency.ttft_ms.p99",
        "stage.queue_ms.mean",
        "stage.queue.share",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_waiting: float = 4.0  # a few requests waiting for the next scheduler step is arrival jitter
        min_preemptions: float = 10  # preempted ten times or more in the window: the KV cache keeps running out
        min_queued_share: float = 0.3  # a queue in under a third of the samples is a passing burst
        min_samples: float = 3.0  # fewer stats lines than this cannot tell a burst from a standing queue
        min_wait_ratio: float = 0.1  # under 10 % of the running batch waiting barely delays anyone
        kv_full: float = 0.95  # vLLM keeps a few blocks free (watermark): ≥ 95 % means no room to admit
        cap_near: float = 0.95  # running within 5 % of max_num_seqs: the sequence limit holds admission
        cap_slack_seqs: float = 1.0  # a sample after a step where one finished reads one short of the limit
        default_max_num_seqs: float = 256.0  # vLLM's default sequence limit when the log does not say
        kv_room: float = 0.8  # below 80 % KV usage the cache could hold more sequences
        kv_no_room_seqs: float = 1.0  # free KV for less than one running-sized sequence: nothing waiting fits
        steady_running: float = 0.75  # mean running ≥ 75 % of its peak while queued: the batch is held at a size
        small_batch: float = 16.0  # a running batch this small leaves the per-step token budget mostly free
        kv_low: float = 0.3  # under 30 % KV usage neither memory nor long contexts hold the queue
        min_queue_time_share: float = 0.3  # requests queued ≥ 30 % of their time over the window: a standing queue
        stall_kv: float = 0.01  # an empty KV cache (under 1 %) while requests wait and nothing runs: nothing holds them

    def _stalled(self, ev: EvidenceSet, waiting_max: float, samples: float) -> Finding:
        """Requests wait while the engine runs nothing, holds nothing in its KV cache and generates nothing: no
        capacity holds them, the scheduler has stopped (a hang, a dead worker, a deadlock). A note, no bottleneck:
        more capacity would not move them."""
        return self.finding(
            severity=Severity.INFO,
            confidence=Confidence.CORRELATED,
            title="The engine stopped scheduling: requests wait while nothing runs",
            message=(f"Up to {waiting_max:.0f} requests wait while no stats line with requests waiting shows a "
                     f"running batch, the KV cache holds nothing (under 1 %) and an interval generated no token "
                     f"({samples:.0f} stats lines): nothing is full, so no limit or capacity holds them. The "
                     "scheduler has stopped: a hung or dead worker, a deadlock, an engine bug. More capacity or a "
                     "higher limit would not move them."),
            impact=0.0,
            evidence=present(ev, *self.requires, *self.optional),
            fixes=[Fix("Find where the engine is stuck", (
                "py-spy dump --pid PID of the engine process (vLLM V1: the EngineCore process, and its workers): "
                "the stack shows what it waits on",
                "Check that every worker process is alive and that the log has no error before the stall (NCCL "
                "timeouts, a worker's traceback)",
                "Restart the engine; if the stall comes back, try the previous release or turn off the feature "
                "the stall started with (multi-step scheduling, chunked prefill, speculative decoding)",
            ), Risk.SAFE)],
            mechanism=Mechanism.STALLED,
        )

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        waiting_max = _num(ev, "serving.waiting_max") or 0.0
        running_max = _num(ev, "serving.running_max") or 0.0
        # an engine that preempted again and again could not hold its running batch in the KV cache: requests the
        # gauges caught waiting wait for KV blocks, however few one reading caught (the lab's KV-pressure scrape:
        # 133 preemptions in 86 s, 3 waiting at one of its two scrapes)
        thrashing = (_num(ev, "serving.preemptions") or 0.0) >= t.min_preemptions and waiting_max >= 1
        if waiting_max < t.min_waiting and not thrashing:
            return None
        samples = _num(ev, "serving.stat_samples") or 1.0
        queued_share = _num(ev, "serving.queued_sample_ratio")
        if queued_share is None:
            queued_share = 1.0
        evicting = (_num(ev, "serving.preemptions") or 0.0) > 0 and (
            _num(ev, "serving.kv_cache_usage_when_queued_max_ratio") or 0.0) >= t.kv_full
        if samples >= t.min_samples and queued_share < t.min_queued_share and not evicting:
            return None
        waiting_mean = _num(ev, "serving.waiting_mean")
        waiting = waiting_mean / queued_share if waiting_mean is not None and queued_share > 0 else waiting_max
        running = _num(ev, "serving.running_when_queued_mean")
        if running is None:
            running = _num(ev, "serving.running_mean") or running_max
        if waiting < t.min_wait_ratio * max(running, 1.0):
            return None
        share = waiting / (waiting + running) if waiting + running > 0 else 0.0
        impact = share * queued_share

        kv = _num(ev, "serving.kv_cache_usage_when_queued_mean_ratio")
        if kv is None:
            kv = _num(ev, "serving.kv_cache_usage_max_ratio")
        preempt = _num(ev, "serving.preemptions") or 0.0
        swapped = _num(ev, "serving.swapped_max") or 0.0
        cap = _num(ev, "serving.max_num_seqs")
        # the most any sample with requests waiting saw (a sample without them says nothing of what held them)
        queued_peak = _num(ev, "serving.running_when_queued_max")
        running_peak = queued_peak if queued_peak is not None else running_max
        kv_peak = _num(ev, "serving.kv_cache_usage_when_queued_max_ratio")
        gen_min = _num(ev, "serving.generation_tokens_per_s_min")
        # a stall lasts: two samples with requests waiting at least, and still waiting at the last one (a burst that
        # arrives between two steps reads 0 running once, then runs)
        lasting = (_num(ev, "serving.queued_samples") or 0.0) >= 2 and (
            _num(ev, "serving.waiting_last") or 0.0) >= t.min_waiting
        if (queued_peak == 0 and kv_peak is not None and kv_peak <= t.stall_kv and gen_min == 0 and not preempt
                and not swapped and lasting):
            return self._stalled(ev, waiting_max, samples)
        cause, fixes, mechanism = self._cause(ev, t, kv, kv_peak, preempt, swapped, cap, running_peak, running)

        msg = (
            f"{waiting:.0f} requests wait in the engine queue while {running:.0f} run"
            + (f" (queue present in {pct(queued_share)} of {samples:.0f} samples)" if samples > 1 else "")
            + f": {pct(share)} of the requests in the server are waiting, not being served. "
            + cause
        )
        ttft = _num(ev, "latency.ttft_ms.p99")
        queue_ms = _num(ev, "stage.queue_ms.mean")
        if queue_ms is not None:
            msg += f" Requests spend {queue_ms:.0f} ms queued on average."
        elif ttft is not None:
            msg += f" p99 time to first token is {ttft:.0f} ms, most of it waiting for a slot."
        if samples < t.min_samples:
            confidence = Confidence.HEURISTIC
        elif ttft is not None or queue_ms is not None:
            confidence = Confidence.CORRELATED
        else:
            confidence = Confidence.MEASURED
        why = f"waiting |{bar(share)}| {waiting:.0f}\nrunning |{bar(1 - share)}| {running:.0f}"
        if kv is not None:
            why += f"\nKV used |{bar(kv)}| {pct(kv)}"
        return self.finding(
            severity=severity_for(impact),
            confidence=confidence,
            title="Requests wait in the serving engine's queue",
            message=msg,
            impact=impact,
            evidence=present(ev, *self.requires, *self.optional),
            why=why,
            fixes=[*fixes, *_capacity_fixes(ev)],
            mechanism=mechanism,
        )

    @staticmethod
    def _cause(
        ev: EvidenceSet,
        t: EngineQueueSaturated.Thresholds,
        kv: float | None,
        kv_peak: float | None,
        preempt: float,
        swapped: float,
        cap: float | None,
        running_peak: float,
        running: float,
    ) -> tuple[str, list[Fix], Mechanism | None]:
        kv_fix = Fix(
            "Give the KV cache more room",
            (
                "Raise --gpu-memory-utilization (e.g. 0.90 → 0.95) if nothing else shares the GPU",
                "Quantise the KV cache: --kv-cache-dtype fp8 (about twice the sequences per GB)",
                "Shard over more GPUs (--tensor-parallel-size 2) or cap --max-model-len to the lengths you serve",
            ),
            Risk.NEEDS_VALIDATION,
        )
        # full on average, or full at some sample while requests waited (V1's usage swings as sequences end)
        full_at_times = kv_peak is not None and kv_peak >= t.kv_full
        if (kv is not None and kv >= t.kv_full) or full_at_times or preempt > 0 or swapped > 0:
            parts = []
            if kv is not None:
                parts.append(f"the KV cache is {pct(kv)} full"
                             + (f" (up to {pct(kv_peak)})" if kv_peak is not None and kv_peak > kv + 0.01 else ""))
            if preempt > 0:
                parts.append(f"{preempt:.0f} requests were preempted")
            if swapped > 0:
                parts.append(f"{swapped:.0f} were swapped to CPU")
            return (
                "Admission is limited by KV-cache capacity: " + ", ".join(parts) + ", so no more sequences fit.",
                [kv_fix], Mechanism.KV_CAPACITY,
            )
        seq_fix = Fix(
            "Raise the sequence limit",
            (
                *advice.serving_capacity(ev),
                "Check TTFT and inter-token latency after each step: larger batches decode slower per token",
            ),
            Risk.NEEDS_VALIDATION,
        )
        room = f" while the KV cache is only {pct(kv)} used" if kv is not None else ""
        # the window's batch: vLLM's generated tokens per engine step between two scrapes, a mean over every step.
        # A gauge or a stats line reads one instant: between two steps it reads 0 running, and vLLM V1's stats
        # lines under load read 1 running where the steps ran 2 (engine lab, 2026-12-05). It stands for the batch
        # while the queue stood: requests spent at least min_queue_time_share of their time queued in that window.
        # A mean over steps is at most the batch's peak, so it raises the peak the samples saw, never lowers it
        # (a mean above the stated limit is no batch: a count this reader does not know inflates the tokens)
        batch = _num(ev, "serving.batch_step_mean")
        queued_time = _num(ev, "stage.queue.share") or 0.0
        if (batch is None or batch <= 0 or queued_time < t.min_queue_time_share
                or (cap is not None and batch > cap + 0.01)):
            batch = None
        seen = running_peak  # what the samples saw
        per_step = ""
        if batch is not None:
            running_peak = max(running_peak, batch)
            per_step = (f" ({batch:.1f} sequences per engine step over the window, generated tokens / steps, while "
                        f"requests spent {pct(queued_time)} of their time queued)")
        engine = ev.get("serving.engine")
        if isinstance(engine, Evidence) and str(engine.value) == "llama.cpp":
            # llama.cpp defers a request only when every slot is busy (llama-server --parallel N; the Python
            # server has one): the slot count is the admission limit
            return (f"Every slot is busy ({running_peak:.0f} running): llama.cpp admits a request only into a free "
                    "slot (llama-server --parallel N, llama-cpp-python's server one at a time), so the slot count, "
                    "not memory, holds requests back.", [Fix("Serve more requests at once", (
                        "llama-server: raise --parallel (each slot gets ctx-size / parallel tokens: raise --ctx-size "
                        "with it) and keep continuous batching on (--cont-batching, the default)",
                        "llama-cpp-python's server runs one request at a time: serve with llama-server --parallel N, "
                        "or run replicas behind a balancer",
                    ), Risk.NEEDS_VALIDATION)], Mechanism.ADMISSION_CAP)
        if cap is not None and running_peak >= t.cap_near * cap:
            return (f"The running batch is pinned at max_num_seqs={cap:.0f}{per_step}{room}: the sequence limit, "
                    "not memory, holds requests back.", [seq_fix], Mechanism.ADMISSION_CAP)
        # the free part of the cache is smaller than one running sequence: a waiting request's blocks do not fit
        # (a small batch far below any sequence limit and the per-step token budget is held by nothing else)
        free_seqs = _num(ev, "serving.kv_free_sequences_when_queued_min")
        if free_seqs is not None and free_seqs < t.kv_no_room_seqs:
            return (f"Admission is limited by KV-cache capacity: at one point with requests waiting the free KV "
                    f"cache held {free_seqs:.1f} of a running sequence"
                    + (f" (the cache {pct(kv)} used on average, up to {pct(kv_peak)})"
                       if kv is not None and kv_peak is not None else "")
                    + ", so no waiting request's blocks fit.", [kv_fix], Mechanism.KV_CAPACITY)
        # one sequence short of a stated limit, in the samples with requests waiting: a stats line or a gauge is
        # read after a step, and a step where a sequence finished reads one fewer than ran (its replacement is
        # admitted at the next step). The engine lab's vLLM V1 printed only such lines for whole windows,
        # 'Running: 1' at --max-num-seqs 2 while its steps ran 2.0 sequences each (2026-12-05). Only samples: the
        # window's batch, where known, measured the batch itself (it reached the limit above, or it did not);
        # and only with the KV cache's room (other holds, such as --max-loras or grammar compilation, are rarer)
        queued_peak = _num(ev, "serving.running_when_queued_max")
        if (cap is not None and batch is None and queued_peak is not None
                and queued_peak >= max(1.0, cap - t.cap_slack_seqs) and kv is not None and kv < t.kv_room):
            return (f"The running batch reaches {queued_peak:.0f} of max_num_seqs={cap:.0f} in the samples with "
                    f"requests waiting{room}: a sample taken just after a sequence finished reads one short of the "
                    "limit before the next step admits its replacement, so the sequence limit, not memory, holds "
                    "requests back.", [seq_fix], Mechanism.ADMISSION_CAP)
        # vLLM's default limit, where the engine is vLLM or not named (another engine's default is its own:
        # SGLang sizes max_running_requests from memory, trtllm-serve has its --max_batch_size)
        default = _default_max_num_seqs(ev, t.default_max_num_seqs) if advice.engine(ev) in ("", "vllm") else math.inf
        if (cap is None and t.cap_near * default <= running_peak <= default
                and (kv is None or kv < t.kv_room)):
            return (f"The running batch sits at {running_peak:.0f}, where the default sequence limit would hold it "
                    f"({advice.max_num_seqs(ev)}){per_step}{room}: the sequence limit, not memory, holds requests "
                    "back.", [seq_fix], Mechanism.ADMISSION_CAP)
        # no limit stated: a small batch that stays at one size while requests wait and the KV cache is nearly
        # empty is held by a limit: a batch that small leaves a continuous batcher's per-step budget free, so
        # it would admit whatever fits (a large batch may be held by that budget instead: compute, below).
        # Its size is read where a batch ran (a sample caught between steps, 0 running with requests waiting,
        # measures no batch) and over the window's steps
        busy = _num(ev, "serving.running_when_queued_busy_mean")
        if busy is None and batch is None and running <= 0:
            # no sample with requests waiting saw a batch, and the window's batch is not known. vLLM V1's stats
            # lines, every one with requests waiting and every one with tokens generated in its interval, under a
            # small stated limit with the KV cache nearly empty and nothing deferred (held for grammar compilation,
            # remote KV, the LoRA budget): each line was likely written on a step where the whole batch finished
            # (the lab's vLLM at --max-num-seqs 2 admitted its two sequences together and printed 'Running: 0 reqs,
            # Waiting: 14 reqs' on every line, 2026-12-05), which a batch far below its limit, admitting as
            # requests arrive, would not do. A stall would print lines with no tokens
            slowest = _num(ev, "serving.generation_tokens_per_s_min") or 0.0
            if (cap is not None and cap <= t.small_batch and kv is not None and kv < t.kv_low and slowest > 0
                    and (_num(ev, "serving.queued_sample_ratio") or 0.0) >= 1.0
                    and _num(ev, "serving.vllm_v1") == 1 and not _num(ev, "serving.deferred_max")):
                return (f"No stats line caught a batch running, yet the engine generated at least {slowest:.0f} "
                        "tokens/s in every line's interval: each line was likely written on a step where the "
                        f"running sequences had all finished together. With max_num_seqs={cap:.0f} stated{room} "
                        "and nothing deferred, the sequence limit, not memory, likely holds requests back (scrapes "
                        "with vllm:iteration_tokens_total, a window apart, measure the batch).",
                        [seq_fix], Mechanism.ADMISSION_CAP)
            return ("No sample with requests waiting caught a batch running (a gauge read between two engine "
                    "steps reads 0), so what holds admission (a sequence limit, the KV cache, compute) is not "
                    "known from these samples: the engine's stats lines, or scrapes a few seconds apart, "
                    "show the running batch while requests wait.", [], None)
        measured = [m for m in (busy, batch) if m is not None]
        steady = max(measured) if measured else running
        if (cap is None and kv is not None and kv < t.kv_low and 0 < running_peak <= t.small_batch
                and steady >= t.steady_running * running_peak):
            if batch is None:
                held = f"The running batch stays at {seen:.0f} or fewer in every sample with requests waiting"
            elif busy is None:
                held = "No sample with requests waiting caught a batch running, but the batch holds near its mean"
            else:
                held = (f"The running batch holds near its mean and reads {seen:.0f} or fewer in every sample with "
                        "requests waiting")
            return (f"{held}{per_step}{room}: a sequence or slot limit near {running_peak:.0f} (vLLM "
                    "--max-num-seqs, SGLang --max-running-requests, llama.cpp --parallel) holds requests back, not "
                    "memory.", [seq_fix], Mechanism.ADMISSION_CAP)
        return (
            "Neither the KV cache nor a sequence limit is full"
            + (f" (KV cache {pct(kv)} used)" if kv is not None else "")
            + f"{per_step}: the engine is bound by compute or its per-step token budget ({advice.step_budget(ev)}).",
            [], Mechanism.SATURATED_WORKERS,
        )


class LittlesLawQueueing(Rule):
    """A closed-loop load keeps far more requests in flight than the server can serve at once.

    What it detects: a benchmark (perf_analyzer, wrk, ab, vLLM bench) whose in-flight requests N
    (the client's concurrency; by Little's law throughput × latency) are many times the requests
    the server has in service S = throughput × per-request compute time: the rest wait.

    Why it matters: once N exceeds S, extra concurrency adds only waiting time: latency grows as
    N / throughput while throughput stays flat. The model is not slow; it is offered more than it
    can take.

    How it decides: N = ``bench.concurrency``; X = ``throughput.rps``; L = ``latency.e2e_ms.mean``.
    S = X × ``stage.compute_ms.mean`` (or, with only the server's queue time, N × (1 − queue/L);
    or, from a concurrency sweep, X × ``bench.unloaded_latency_ms``, the latency at concurrency 1,
    an upper bound of the service time).
    Fires when N / S ≥ ``min_oversubscription`` and the waiting share 1 − S/N ≥
    ``min_waiting_share``; never with one request in flight (it waits behind nothing), nor when the server timed
    its own queue (``stage.queue_ms.mean`` beside the compute time) under ``min_waiting_share`` of its request
    time (``latency.server_ms.mean``, else the latency): the rest of the time went to the server's overhead or
    the network (perf_analyzer's ``overhead``), not to a queue. When N / X is within ``closed_loop_tolerance`` of
    L the client is closed-loop and the figures are consistent (confidence correlated), else heuristic. Impact is
    the waiting share.

    Evidence: bench.concurrency, throughput.rps, latency.e2e_ms.mean and stage.compute_ms.mean,
    stage.queue_ms.mean or bench.unloaded_latency_ms; optionally latency.server_ms.mean, bench.server_batch_mean,
    latency.e2e_ms.p99, bench.client_delayed.

    Fix: lower the offered concurrency to about S (latency falls to the compute time at the same
    throughput) or add capacity: more model instances, larger dynamic batches, more replicas.

    False positives: a server whose per-request compute is itself slow, at modest concurrency
    (N a few times S), also queues; there the compute is what to fix and N / S stays below
    ``min_oversubscription`` (see QUE004's note). A client that sends requests with think time is
    not closed-loop; the consistency check lowers the confidence then.
    """

    code = "QUE003"
    name = "littles-law-queueing"
    category = Category.QUEUEING
    # a client that spends its latency sending and receiving payloads keeps them "in flight" without the server
    symptom_of = ("CPU004",)
    requires = ("bench.concurrency", "throughput.rps", "latency.e2e_ms.mean")
    requires_any = (("stage.compute_ms.mean",), ("stage.queue_ms.mean",), ("bench.unloaded_latency_ms",))
    optional = (
        "stage.compute_ms.mean",
        "stage.queue_ms.mean",
        "bench.unloaded_latency_ms",
        "latency.server_ms.mean",
        "bench.server_batch_mean",
        "latency.e2e_ms.p99",
        "bench.client_delayed",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_oversubscription: float = 8.0  # N ≥ 8 × S: the queue is many service times long, not a few
        min_waiting_share: float = 0.5  # at least half of each request's time is waiting
        closed_loop_tolerance: float = 0.35  # N / X within 35 % of the measured latency: Little's law holds

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        n = _num(ev, "bench.concurrency") or 0.0
        x = _num(ev, "throughput.rps") or 0.0
        lat = _num(ev, "latency.e2e_ms.mean") or 0.0
        if n <= 1 or x <= 0 or lat <= 0:
            return None  # one request in flight waits behind nothing
        compute = _num(ev, "stage.compute_ms.mean")
        queue = _num(ev, "stage.queue_ms.mean")
        server = _num(ev, "latency.server_ms.mean") or lat
        if compute is not None and queue is not None and queue < t.min_waiting_share * server:
            # the server timed its queue and it is short: the time outside compute went elsewhere (the server's
            # overhead of reading the inputs, the network), which Little's law cannot tell from waiting
            return None
        unloaded = _num(ev, "bench.unloaded_latency_ms")
        if compute is not None and compute > 0:
            in_service = x * compute / 1000.0
            basis = f"{x:.1f} req/s × {compute:.2f} ms compute"
        elif queue is not None and server > 0:
            in_service = n * max(0.0, 1.0 - queue / server)
            basis = f"{n:.0f} × (1 − {queue:.1f} ms queue / {server:.1f} ms)"
        elif unloaded is not None and unloaded > 0:
            in_service = x * unloaded / 1000.0
            basis = f"{x:.1f} req/s × {unloaded:.2f} ms latency at concurrency 1"
        else:
            return None
        in_service = max(in_service, 1e-9)
        over = n / in_service
        waiting = max(0.0, 1.0 - in_service / n)
        if over < t.min_oversubscription or waiting < t.min_waiting_share:
            return None
        little_ms = n / x * 1000.0
        consistent = abs(little_ms - lat) <= t.closed_loop_tolerance * lat
        msg = (
            f"The client keeps {n:.0f} requests in flight but the server has only about {in_service:.1f} in "
            f"service ({basis}): {over:.0f}× oversubscribed, so about {pct(waiting)} of each request's "
            f"{lat:.1f} ms is waiting."
            + (f" Little's law agrees: {n:.0f} / {x:.1f} req/s = {little_ms:.1f} ms." if consistent else
               f" (N / throughput = {little_ms:.1f} ms differs from the measured latency: not a closed loop.)")
            + (f" The server executes {_num(ev, 'bench.server_batch_mean'):.1f} requests per batch."
               if _num(ev, "bench.server_batch_mean") else "")
        )
        lo, hi = max(1.0, in_service), 2 * max(1.0, in_service)
        return self.finding(
            severity=severity_for(waiting),
            confidence=Confidence.CORRELATED if consistent else Confidence.HEURISTIC,
            title="Offered concurrency far above what the server serves at once",
            message=msg,
            impact=waiting,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"waiting |{bar(waiting)}| {pct(waiting)}\nserved  |{bar(1 - waiting)}| {pct(1 - waiting)}",
            fixes=[
                Fix(
                    "Offer the concurrency the server can serve",
                    (
                        f"Lower the client's concurrency towards {lo:.0f}-{hi:.0f} "
                        "in flight (perf_analyzer --concurrency-range, the gateway's limit): latency falls to "
                        "about the compute time at the same throughput",
                    ),
                    Risk.SAFE,
                ),
                Fix(
                    "Serve more at once",
                    (
                        "Triton: raise instance_group count or enable/enlarge dynamic_batching "
                        "(max_batch_size, preferred_batch_size, max_queue_delay_microseconds)",
                        "Add replicas behind the load balancer",
                    ),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )


class QueueShareOfLatency(Rule):
    """Most of the server-side request time is spent waiting in the queue.

    What it detects: a server-side breakdown (Triton's queue vs compute, from perf_analyzer or
    ``nv_inference_*`` counters; vLLM's ``request_queue_time`` vs end-to-end histograms; TGI's
    ``queue_time``) in which ``stage.queue.share`` of the request time is at least ``min_share``.

    Why it matters: the time is lost before the model sees the request; faster kernels shorten
    only the small compute part.

    How it decides: ``stage.queue.share`` ≥ ``min_share``. Guard: when the server's per-request
    execution time (``stage.compute_ms.mean``, Triton's compute input + infer + output) is known
    and the queue is shorter than ``min_queue_to_compute`` × that time, the queue is only the few
    requests ahead each taking that long: the server is compute-bound at modest concurrency, and
    the rule returns an informational note (category queueing, severity info) pointing at the
    compute time instead. LLM prefill/decode times are not used for the guard: under continuous
    batching a request's decode overlaps hundreds of others. Impact is the queue share.

    Evidence: stage.queue.share; optionally stage.queue_ms.mean, stage.compute_ms.mean,
    latency.server_ms.mean, latency.e2e_ms.mean, stage.compute.share, bench.concurrency.

    Fix: add capacity or batch more per execution (Triton instance_group, dynamic batching;
    vLLM --max-num-seqs / replicas); bound the queue (Triton ``default_queue_policy`` with
    ``max_queue_size``, a gateway limit) so latency stays bounded.

    False positives: a closed-loop benchmark at far more concurrency than production shows a queue
    that production never sees; compare with the production concurrency before adding capacity.
    """

    code = "QUE004"
    name = "queue-share-of-latency"
    category = Category.QUEUEING
    # how much of the time is queued is the symptom; the engine's queue (QUE002) says what holds it (its
    # mechanism) and so which fix applies: it leads when found
    symptom_of = ("QUE002",)
    requires = ("stage.queue.share",)
    optional = (
        "stage.queue_ms.mean",
        "stage.compute_ms.mean",
        "latency.server_ms.mean",
        "latency.e2e_ms.mean",
        "stage.compute.share",
        "bench.concurrency",
    )

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.5  # half of the request time in the queue: waiting is the larger part
        min_queue_to_compute: float = 8.0  # a queue under 8 executions long is a few requests ahead, each slow

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        share = _num(ev, "stage.queue.share") or 0.0
        if share < t.min_share:
            return None
        queue = _num(ev, "stage.queue_ms.mean")
        compute = _num(ev, "stage.compute_ms.mean")
        total = _num(ev, "latency.server_ms.mean") or _num(ev, "latency.e2e_ms.mean")
        evidence = present(ev, *self.requires, *self.optional)
        if queue is not None and compute is not None and compute > 0 and queue < t.min_queue_to_compute * compute:
            conc = _num(ev, "bench.concurrency")
            return self.finding(
                severity=Severity.INFO,
                confidence=Confidence.MEASURED,
                title="Queue time follows from slow compute, not from too little capacity",
                message=(
                    f"Requests queue {queue:.1f} ms ({pct(share)} of the server time) but each takes "
                    f"{compute:.1f} ms of compute: the queue is only {queue / compute:.1f} executions long"
                    + (f" at concurrency {conc:.0f}" if conc is not None else "")
                    + ". The server is compute-bound; shortening the compute time shortens the queue with it."
                ),
                impact=share,
                evidence=evidence,
                fixes=[
                    Fix(
                        "Make each execution faster, then re-measure the queue",
                        (
                            "Profile the model's execution (backend, CPU vs GPU placement, batch size 1 vs dynamic "
                            "batching); a slow backend or a CPU-placed model shows up as compute, not queue",
                        ),
                        Risk.NEEDS_VALIDATION,
                    )
                ],
            )
        msg = (
            f"{pct(share)} of the server-side request time is spent queued"
            + (f" ({queue:.1f} ms of {total:.1f} ms)" if queue is not None and total is not None else "")
            + (f", against {compute:.2f} ms of compute ({queue / compute:.0f}× as long)"
               if queue is not None and compute else "")
            + ": requests wait for a free model instance or batch slot."
        )
        low = any_low_quality(ev, "stage.queue.share", "stage.queue_ms.mean")
        return self.finding(
            severity=severity_for(share),
            confidence=Confidence.HEURISTIC if low else Confidence.MEASURED,
            title="Requests spend most of their time in the server's queue",
            message=msg,
            impact=share,
            evidence=evidence,
            why=f"queue   |{bar(share)}| {pct(share)}\nother   |{bar(1 - share)}| {pct(1 - share)}",
            fixes=[
                Fix(
                    "Serve more requests per unit of time",
                    (
                        "Triton: more instances (instance_group count) or dynamic batching with a larger "
                        "max_batch_size; vLLM/SGLang: a higher --max-num-seqs if the KV cache has room",
                        "Add replicas when one GPU is already busy",
                    ),
                    Risk.NEEDS_VALIDATION,
                ),
                Fix(
                    "Bound the queue",
                    (
                        "Triton: dynamic_batching { default_queue_policy { max_queue_size: N, "
                        "timeout_action: REJECT } }; a gateway limit with 429 for the rest",
                    ),
                    Risk.SAFE,
                ),
            ],
        )


class ClientPayloadIO(Rule):
    """The client spends most of each request sending and receiving the payloads.

    What it detects: perf_analyzer's (perf_client's) transport line splits the client's HTTP or gRPC
    time into sending and receiving (``send/recv``, or ``send`` + ``receive``; gRPC's ``(un)marshal``)
    and the wait for the server's answer. ``latency.client_io.share`` is the sending and receiving
    over the client's average latency.

    Why it matters: that time is serialising tensors into the request body and moving them through
    the network stack, before the server has the request and after it answered; no server
    setting (instances, batching, a faster GPU) shortens it. Large inputs (images as FP32 tensors,
    long batches) over HTTP/JSON show it first.

    How it decides: the share is at least ``min_share`` and the time at least ``min_ms`` per request.
    QUE003, which counts the requests in flight from the same client latency, ranks after it: they are
    mostly in the client's own sending and receiving. QUE004 (the server's queue over the server's time)
    is judged on its own.

    Evidence: latency.client_io.share, latency.client_io_ms.mean; optionally latency.e2e_ms.mean,
    latency.transport_ms.mean, latency.server_ms.mean, bench.batch_size.

    Fix: pass tensors through shared memory (Triton's system or CUDA shared-memory API;
    ``perf_analyzer --shared-memory system|cuda`` to measure it), gRPC or HTTP with binary tensor data
    instead of JSON, smaller payloads (uint8 images instead of FP32, resize before sending), or move
    the pre-processing into the server (an ensemble, DALI) so the raw input is sent once.

    False positives: a client host that is itself starved of CPU (perf_analyzer's "Avg client
    overhead" high, or the client on the server's cores) inflates send and receive; run the client on
    its own host first.
    """

    code = "CPU004"
    name = "client-payload-io"
    category = Category.CPU_PREPROCESSING
    requires = ("latency.client_io.share", "latency.client_io_ms.mean")
    optional = ("latency.e2e_ms.mean", "latency.transport_ms.mean", "latency.server_ms.mean", "bench.batch_size")

    @dataclass(frozen=True)
    class Thresholds:
        min_share: float = 0.5  # half of what the client waits is its own sending and receiving
        min_ms: float = 1.0  # below a millisecond per request nothing worth moving is moved

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        share = _num(ev, "latency.client_io.share")
        io = _num(ev, "latency.client_io_ms.mean")
        if share is None or io is None or share < t.min_share or io < t.min_ms:
            return None
        server = _num(ev, "latency.server_ms.mean")
        batch = _num(ev, "bench.batch_size")
        msg = (f"The client spends {io:.1f} ms per request sending and receiving the payloads, {pct(share)} of its "
               "latency" + (f", against {server:.1f} ms the server takes for the whole request" if server else "")
               + (f" (batches of {batch:.0f})" if batch else "")
               + ": serialising the tensors and moving them, not the model, sets the latency.")
        return self.finding(
            severity=severity_for(share),
            confidence=Confidence.MEASURED,
            title="The client's sending and receiving of the payloads dominates latency",
            message=msg,
            impact=share,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"send/recv |{bar(share)}| {pct(share)}\nthe rest  |{bar(1 - share)}| {pct(1 - share)}",
            fixes=[
                Fix(
                    "Stop copying tensors through the request body",
                    ("Triton: register system or CUDA shared memory for inputs and outputs (the client libraries' "
                     "shared-memory API); measure it with perf_analyzer --shared-memory system|cuda",
                     "Send binary tensor data (gRPC, or HTTP with binary data) instead of JSON"),
                    Risk.NEEDS_VALIDATION,
                ),
                Fix(
                    "Send less",
                    ("Send uint8 images and convert in the server instead of FP32 tensors; resize before sending",
                     "Move pre-processing into the server (an ensemble or DALI) so the raw input travels once"),
                    Risk.NEEDS_VALIDATION,
                ),
            ],
        )


class OfferedAboveThroughput(Rule):
    """A serving benchmark offered more requests per second than the server completed: the queue grew all run.

    What it detects: an open-loop benchmark (vLLM's ``benchmark_serving`` / ``vllm bench serve`` with
    ``--request-rate R`` and no ``--max-concurrency``; SGLang's ``bench_serving``) whose offered rate
    (``Traffic request rate``, ``bench.offered_rps``) is at least ``min_overload`` × the request throughput it
    measured (``throughput.rps``).

    Why it matters: arrivals above the service rate are no burst: the backlog grows by the difference every
    second, so the time to first token of the late requests is the queue, however fast prefill and decode are.
    The figures such a run prints describe an overloaded server, not the model's speed.

    How it decides: offered ≥ ``min_overload`` × served, no concurrency cap (``bench.concurrency``: a capped
    client holds the excess itself), at least ``min_requests`` requests. The impact is the share of the offered
    load left waiting, 1 − served / offered; with the run's request count, the queue it peaked at (as the last request
    was sent: n × (1 − served / offered)) is stated.

    Evidence: bench.offered_rps, throughput.rps; optionally requests.count, bench.concurrency,
    bench.duration_s, latency.ttft_ms.mean, latency.ttft_ms.p50.

    Fix: benchmark below the knee (a request rate under the measured throughput, or a concurrency cap;
    ``diagnose sweep URL`` finds the knee) before reading latency; or add capacity (replicas, tensor
    parallelism, a larger step budget) for that rate.

    False positives: a short run whose throughput includes the ramp at its start and end (``min_requests``).
    """

    code = "QUE006"
    name = "offered-above-throughput"
    category = Category.QUEUEING
    requires = ("bench.offered_rps", "throughput.rps")
    optional = ("requests.count", "bench.concurrency", "bench.duration_s", "latency.ttft_ms.mean",
                "latency.ttft_ms.p50")

    @dataclass(frozen=True)
    class Thresholds:
        min_overload: float = 1.2  # 20 % more offered than served: no rounding or ramp explains it
        min_requests: float = 20.0  # a shorter run's throughput is mostly its ramp

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        offered = _num(ev, "bench.offered_rps") or 0.0
        served = _num(ev, "throughput.rps") or 0.0
        n = _num(ev, "requests.count")
        if (offered <= 0 or served <= 0 or offered < t.min_overload * served or _num(ev, "bench.concurrency")
                is not None or (n is not None and n < t.min_requests)):
            return None
        waiting = 1.0 - served / offered
        ttft = _num(ev, "latency.ttft_ms.mean") or _num(ev, "latency.ttft_ms.p50")
        msg = (f"The benchmark offered {offered:g} requests/s and the server completed {served:g}: "
               f"{offered - served:.3g} more arrived every second than it served, so the queue grew while it sent"
               # the queue peaks as the last request is sent (n / offered seconds in), at n × (1 − served / offered)
               + (f" (about {n * waiting:,.0f} of its {n:,.0f} requests waiting when the last was sent)" if n else "")
               + ". Latency measured this way is mostly waiting"
               + (f": the mean time to first token of {ttft / 1000:,.1f} s is the backlog, not the prefill"
                  if ttft is not None and ttft >= 1000 else "")
               + ".")
        return self.finding(
            severity=severity_for(waiting),
            confidence=Confidence.CORRELATED,
            title="The benchmark offered more than the server serves",
            message=msg,
            impact=waiting,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"offered |{bar(1.0)}| {offered:g}/s\nserved  |{bar(served / offered)}| {served:g}/s",
            fixes=[
                Fix("Measure below the knee", (
                    f"Re-run at a request rate under {served:g}/s, or cap the requests in flight "
                    "(vLLM bench: --max-concurrency N): latency then shows the model, not the backlog",
                    "`diagnose sweep URL` raises the load step by step and finds the rate where latency turns up"),
                    Risk.SAFE),
                Fix("Serve the offered rate", (
                    "Add replicas behind the load balancer, or more tensor parallelism for each",
                    f"Raise the engine's per-step budget where the KV cache has room ({advice.step_budget(ev)})"),
                    Risk.NEEDS_VALIDATION),
            ],
        )


class SweepPlateau(Rule):
    """A load sweep's throughput stops rising while its concurrency keeps growing: past that load requests wait.

    What it detects: a benchmark run at several loads (perf_analyzer's ``--concurrency-range``, a table of
    concurrency against throughput and latency, genai-perf's or a serving benchmark's levels) whose throughput is
    flat from one load on (``scaling.plateau_*``, ``diagnose.derive.timing_tables.load_plateau``): from ``start``
    requests in flight to at least ``min_span`` × as many, it serves at most ``PLATEAU_MAX_GAIN`` × more.

    Why it matters: the server's capacity is reached at ``start``; every request added past it waits for one
    in service, so the latency grows with the load (Little's law: with the throughput flat, latency ∝ requests in
    flight) while nothing more gets done. At a plateau from one request in flight the server serves one at a time
    (no batching, one model instance, a lock).

    How it decides: span ≥ ``min_span``; where the sweep timed the latency, it grew at least ``min_latency_share``
    of the span (else the extra load did not wait: an open-loop client dropping requests, a rate limit before the
    server) and confidence is correlated; untimed, the throughput is flat within ``untimed_max_gain`` and confidence
    is heuristic. Never where the GPU was measured or stated busy ≥ ``gpu_busy`` (the plateau is then the device's
    own limit: GPU002/GPU009 judge it). Thin where the throughput rose ``rose_before`` × or more below the
    plateau and nothing measured the GPU: a limit reached after batching worked is the device's as likely as a cap.
    Impact is the waiting share at the highest load: 1 − 1 / latency growth
    (timed), else 1 − 1 / span.

    Evidence: scaling.plateau_concurrency, scaling.plateau_span, scaling.plateau_throughput_gain; optionally
    scaling.plateau_latency_ratio, scaling.concurrency_range, scaling.throughput.concurrency_ratio.

    Fix: serve more at once (dynamic batching, more model instances, a larger --max-num-seqs where memory allows),
    add replicas for the load, or hold the offered concurrency near the plateau's start.

    False positives: a plateau that is the GPU's own limit at full utilisation (healthy saturation: gpu_compute)
    looks the same from the client; the GPU's utilisation and SM activity at the plateau tell them apart.
    """

    code = "QUE011"
    name = "sweep-plateau"
    category = Category.QUEUEING
    requires = ("scaling.plateau_concurrency", "scaling.plateau_span", "scaling.plateau_throughput_gain")
    optional = ("scaling.plateau_latency_ratio", "scaling.concurrency_range", "scaling.throughput.concurrency_ratio",
                "scaling.plateau_rise", "gpu.util_ratio", "report.gpu_util_pct_min")

    @dataclass(frozen=True)
    class Thresholds:
        min_span: float = 3.0  # the load at least triples past the plateau's start: no single noisy step
        min_latency_share: float = 0.5  # the latency grows by at least half the load's growth: requests waited
        untimed_max_gain: float = 1.05  # with no latency timed, the throughput must be flat within 5 %
        gpu_busy: float = 0.9  # a GPU this busy at the plateau is the limit itself (healthy saturation)
        rose_before: float = 1.5  # the throughput rose this much below the plateau: batching worked up to a limit

    def check(self, ev: EvidenceSet, t: Thresholds) -> Finding | None:
        start = _num(ev, "scaling.plateau_concurrency") or 0.0
        span = _num(ev, "scaling.plateau_span") or 0.0
        gain = _num(ev, "scaling.plateau_throughput_gain") or 0.0
        grew = _num(ev, "scaling.plateau_latency_ratio")
        if start <= 0 or span < t.min_span or gain <= 0:
            return None
        if grew is not None and grew < t.min_latency_share * span:
            return None  # more load, no more throughput, and no more waiting: the load never reached the server
        if grew is None and gain > t.untimed_max_gain:
            return None  # untimed, only a flat line says the extra load waited
        util, stated = ev.value("gpu.util_ratio"), ev.value("report.gpu_util_pct_min")
        if (util is not None and util >= t.gpu_busy) or (stated is not None and stated >= 100 * t.gpu_busy):
            return None  # the device itself is full: its saturation, not a queue for capacity the server lacks
        end = start * span
        waiting = 1.0 - 1.0 / (grew if grew is not None else span)
        one = start <= 1.0
        # the throughput rose with the load up to the plateau (batching worked) and nothing measured the GPU there:
        # the plateau is the server's capacity, the device's own (gpu_compute) as likely as an admission cap
        # (plow#31: 4.2 → 7.9 req/s from 1 to 8 in flight, then flat; the GPU's prefill saturated)
        rose = _num(ev, "scaling.plateau_rise")
        if rose is None:  # (an older session's evidence: the overall gain over the plateau's, a lower bound)
            overall = _num(ev, "scaling.throughput.concurrency_ratio")
            rose = overall / gain if overall is not None and gain > 0 else 1.0
        device_unknown = rose >= t.rose_before and util is None and stated is None
        msg = (f"The sweep's throughput stops rising at {start:g} request{'s' if start != 1 else ''} in flight: "
               f"from {start:g} to {end:g} ({span:.1f}×) it serves only {gain:.2f}× as much"
               + (f" while the latency grows {grew:.1f}×" if grew is not None else "")
               + f". Past {start:g} every added request waits for capacity: about {pct(waiting)} of each request's "
               f"time at {end:g} in flight is waiting."
               + (" From the lowest load measured on, the server serves no more than one request at a time."
                  if one else "")
               + (f" The throughput rose {rose:.1f}× up to {start:g} in flight: the plateau may be the GPU's own "
                  "limit rather than a cap on requests; its utilisation at the plateau tells them apart."
                  if device_unknown else ""))
        return self.finding(
            severity=severity_for(waiting),
            confidence=(Confidence.THIN if device_unknown else
                        Confidence.CORRELATED if grew is not None else Confidence.HEURISTIC),
            title="Throughput flat across the load sweep: requests wait for capacity",
            message=msg,
            impact=waiting,
            evidence=present(ev, *self.requires, *self.optional),
            why=f"load       |{bar(1.0)}| ×{span:.1f}\nthroughput |{bar(min(1.0, gain / span))}| ×{gain:.2f}",
            fixes=[
                Fix("Serve more at once", (
                    ("Batch requests together: Triton dynamic_batching (max_batch_size, preferred_batch_size), "
                     "or more instance_group count; a Python backend or handler that takes one request at a time "
                     "is the cap" if one else
                     "Raise the engine's concurrent sequences where memory allows (vLLM --max-num-seqs, SGLang "
                     "--max-running-requests, TGI --max-batch-total-tokens), Triton instance_group / dynamic "
                     "batching"),
                    "Add replicas behind the load balancer for the offered load"), Risk.NEEDS_VALIDATION),
                Fix("Offer what it serves", (
                    f"Hold the requests in flight near {start:g} (the gateway's or client's limit): latency falls to "
                    "the unloaded figure at the same throughput",), Risk.SAFE),
            ],
        )


RULES: tuple[type[Rule], ...] = (EngineQueueSaturated, LittlesLawQueueing, QueueShareOfLatency, ClientPayloadIO,
                                 OfferedAboveThroughput, SweepPlateau)
