"""py-spy samples → evidence: where the active CPU time of the service's Python threads goes.

All shares are of *active* samples (idle threads are not recorded), so a pool of 64 idle
handler threads does not dilute the one thread that does the work.

A session recorded in chunks (``coverage`` and ``chunks``) may sample each process at its own rate
and only part of the window: a sample then weighs 1 / its process's rate (seconds of thread time),
a thread's share of the window is its samples / (rate × seconds its process was sampled), and each
share carries ``<key>.stderr``: the larger of the spread between chunks / √chunks and the binomial
error of the sample count.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from diagnose.collectors.pyspy import StackSample, ThreadState
from diagnose.derive.activities import Activity, classify
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality, Window

SOURCE = "py-spy"
BUSY_THREAD_RATIO = 0.5  # a Python thread active half the window or more counts as a busy worker
MIN_CHUNK_SAMPLES = 20  # a chunk with fewer active samples does not count towards the spread


@dataclass(frozen=True)
class ThreadProfile:
    pid: int
    tid: int
    name: str
    samples: int
    active_ratio: float
    shares: dict[str, float]

    @property
    def top_activity(self) -> str:
        return max(self.shares, key=lambda k: self.shares[k]) if self.shares else Activity.OTHER.value


def _leaf(sample: StackSample) -> str:
    """The function to blame in a 'hottest' list: the innermost frame of the stack."""
    if not sample.frames:
        return sample.thread or "?"
    f = sample.frames[-1]
    where = f.file.rsplit("/", 2)
    short = "/".join(where[-2:]) if len(where) > 1 else f.file
    return f"{f.function} ({short})" if short else f.function


def stderr(share: float, samples: float, chunk_shares: Sequence[float]) -> float:
    """The uncertainty of a share: spread between chunks / √chunks, or the binomial error, the larger."""
    binomial = math.sqrt(max(share * (1 - share), 0.25 / max(samples, 1.0)) / max(samples, 1.0))
    if len(chunk_shares) < 2:
        return binomial
    return max(binomial, statistics.stdev(chunk_shares) / math.sqrt(len(chunk_shares)))


def derive(
    samples: Sequence[StackSample],
    *,
    window_s: float,
    rate_hz: float,
    dumps: Sequence[Sequence[ThreadState]] = (),
    window: Window | None = None,
    partial: bool = False,
    coverage: Mapping[int, tuple[float, float]] | None = None,
    chunks: Sequence[Sequence[StackSample]] = (),
) -> list[Evidence]:
    """``coverage``: pid → (rate Hz, seconds sampled); without it every process was sampled at
    ``rate_hz`` for ``window_s``. ``chunks``: the same samples split by chunk, for the spread."""
    ev = Emit(SOURCE, window=window, quality=Quality.PARTIAL if partial else Quality.GOOD)
    total = sum(s.count for s in samples)

    def rate_of(pid: int) -> float:
        return max(1e-9, coverage[pid][0] if coverage and pid in coverage else rate_hz)

    ev.add("cpu.active_samples", total, "samples")
    if total == 0:
        ev.add("workers.active_mean", 0.0, "threads", "no active Python samples in the window")
        return ev.items
    by_activity: Counter[Activity] = Counter()
    seconds: dict[Activity, float] = defaultdict(float)
    hot: dict[Activity, Counter[str]] = defaultdict(Counter)
    per_thread: dict[tuple[int, int], Counter[Activity]] = defaultdict(Counter)
    names: dict[tuple[int, int], str] = {}
    for s in samples:
        act = classify([(f.function, f.file) for f in s.frames])
        by_activity[act] += s.count
        seconds[act] += s.count / rate_of(s.pid)
        hot[act][_leaf(s)] += s.count
        per_thread[(s.pid, s.tid)][act] += s.count
        names[(s.pid, s.tid)] = s.thread
    busy_s = sum(seconds.values())
    spreads: dict[Activity, list[float]] = defaultdict(list)
    for chunk in chunks:
        got: dict[Activity, float] = defaultdict(float)
        for s in chunk:
            got[classify([(f.function, f.file) for f in s.frames])] += s.count / rate_of(s.pid)
        if sum(s.count for s in chunk) >= MIN_CHUNK_SAMPLES:
            for act in Activity:
                spreads[act].append(got[act] / max(1e-12, sum(got.values())))
    for act in Activity:
        share = seconds[act] / busy_s
        ev.add(f"cpu.{act.value}_share", share, "ratio")
        if coverage is not None:
            ev.add(f"cpu.{act.value}_share.stderr", stderr(share, total, spreads[act]), "ratio",
                   f"{len(spreads[act])} chunks, {total} active samples")
        if hot[act]:
            top = [{"function": fn, "share": n / total} for fn, n in hot[act].most_common(5)]
            ev.add(f"cpu.top.{act.value}", top, "list")
    ev.add("cpu.compile_seconds", seconds[Activity.COMPILE], "s")

    # Ticks: how many samples a thread active for the whole window would have. py-spy may fall
    # behind its nominal rate on a loaded host; the busiest thread then bounds the tick count.
    if coverage is None:
        expected = max(1.0, window_s * rate_hz)
        busiest = max(sum(c.values()) for c in per_thread.values())
        ticks_of = dict.fromkeys({k[0] for k in per_thread}, expected if busiest <= expected else float(busiest))
    else:
        ticks_of = {}
        for pid in {k[0] for k in per_thread}:
            rate, secs = coverage.get(pid, (rate_hz, window_s))
            expected = max(1.0, rate * secs)
            busiest = max(sum(c.values()) for k, c in per_thread.items() if k[0] == pid)
            ticks_of[pid] = max(expected, float(busiest))
    threads: list[ThreadProfile] = []
    for key, counts in per_thread.items():
        n = sum(counts.values())
        threads.append(ThreadProfile(key[0], key[1], names[key], n, min(1.0, n / ticks_of[key[0]]),
                                     {a.value: c / n for a, c in counts.items()}))
    threads.sort(key=lambda t: (-t.active_ratio, -t.samples))
    ev.add("workers.active_mean", sum(t.active_ratio for t in threads), "threads",
           "Python threads running on average (active samples / ticks)")
    ev.add("workers.busy_count", sum(1 for t in threads if t.active_ratio >= BUSY_THREAD_RATIO), "threads")
    ev.add("workers.busiest_active_ratio", threads[0].active_ratio, "ratio",
           f"{threads[0].name or threads[0].tid} in pid {threads[0].pid}")
    ev.add("cpu.processes_sampled", len({t.pid for t in threads}), "processes")
    ev.add("cpu.threads", [
        {"pid": t.pid, "tid": t.tid, "name": t.name, "samples": t.samples,
         "active_ratio": round(t.active_ratio, 4), "top_activity": t.top_activity,
         "shares": {k: round(v, 4) for k, v in sorted(t.shares.items())}}
        for t in threads[:50]
    ], "table")
    if dumps:
        gil = Counter(th.name or str(th.tid) for snap in dumps for th in snap if th.owns_gil)
        active = [sum(1 for th in snap if th.active) for snap in dumps]
        ev.add("gil.holders", [{"thread": k, "snapshots": v} for k, v in gil.most_common(5)], "list")
        ev.add("dump.active_threads_mean", sum(active) / len(active), "threads")
    return ev.items
