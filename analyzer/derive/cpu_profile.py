"""py-spy samples → evidence: where the active CPU time of the service's Python threads goes.

All shares are of *active* samples (idle threads are not recorded), so a pool of 64 idle
handler threads does not dilute the one thread that does the work.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from analyzer.derive.activities import Activity, classify
from analyzer.model import Evidence, Quality, Window
from collectors.pyspy import StackSample, ThreadState

SOURCE = "py-spy"
BUSY_THREAD_RATIO = 0.5  # a Python thread active half the window or more counts as a busy worker


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


def derive(
    samples: Sequence[StackSample],
    *,
    window_s: float,
    rate_hz: float,
    dumps: Sequence[Sequence[ThreadState]] = (),
    window: Window | None = None,
    partial: bool = False,
) -> list[Evidence]:
    quality = Quality.PARTIAL if partial else Quality.GOOD
    total = sum(s.count for s in samples)

    def ev(key: str, value: object, unit: str, detail: str = "") -> Evidence:
        return Evidence(key, value, unit, SOURCE, window, quality, detail)

    out = [ev("cpu.active_samples", total, "samples")]
    if total == 0:
        out.append(ev("workers.active_mean", 0.0, "threads", "no active Python samples in the window"))
        return out
    by_activity: Counter[Activity] = Counter()
    hot: dict[Activity, Counter[str]] = defaultdict(Counter)
    per_thread: dict[tuple[int, int], Counter[Activity]] = defaultdict(Counter)
    names: dict[tuple[int, int], str] = {}
    for s in samples:
        act = classify([(f.function, f.file) for f in s.frames])
        by_activity[act] += s.count
        hot[act][_leaf(s)] += s.count
        per_thread[(s.pid, s.tid)][act] += s.count
        names[(s.pid, s.tid)] = s.thread
    for act in Activity:
        out.append(ev(f"cpu.{act.value}_share", by_activity[act] / total, "ratio"))
        if hot[act]:
            top = [{"function": fn, "share": n / total} for fn, n in hot[act].most_common(5)]
            out.append(ev(f"cpu.top.{act.value}", top, "list"))
    out.append(ev("cpu.compile_seconds", by_activity[Activity.COMPILE] / max(rate_hz, 1e-9), "s"))

    # Ticks: how many samples a thread active for the whole window would have. py-spy may fall
    # behind its nominal rate on a loaded host; the busiest thread then bounds the tick count.
    expected = max(1.0, window_s * rate_hz)
    busiest = max(sum(c.values()) for c in per_thread.values())
    ticks = expected if busiest <= expected else float(busiest)
    threads: list[ThreadProfile] = []
    for key, counts in per_thread.items():
        n = sum(counts.values())
        threads.append(ThreadProfile(key[0], key[1], names[key], n, min(1.0, n / ticks),
                                     {a.value: c / n for a, c in counts.items()}))
    threads.sort(key=lambda t: -t.samples)
    out.append(ev("workers.active_mean", total / ticks, "threads",
                  "Python threads running on average (active samples / ticks)"))
    out.append(ev("workers.busy_count", sum(1 for t in threads if t.active_ratio >= BUSY_THREAD_RATIO), "threads"))
    out.append(ev("workers.busiest_active_ratio", threads[0].active_ratio, "ratio",
                  f"{threads[0].name or threads[0].tid} in pid {threads[0].pid}"))
    out.append(ev("cpu.processes_sampled", len({t.pid for t in threads}), "processes"))
    out.append(ev("cpu.threads", [
        {"pid": t.pid, "tid": t.tid, "name": t.name, "samples": t.samples,
         "active_ratio": round(t.active_ratio, 4), "top_activity": t.top_activity,
         "shares": {k: round(v, 4) for k, v in sorted(t.shares.items())}}
        for t in threads[:50]
    ], "table"))
    if dumps:
        gil = Counter(th.name or str(th.tid) for snap in dumps for th in snap if th.owns_gil)
        active = [sum(1 for th in snap if th.active) for snap in dumps]
        out.append(ev("gil.holders", [{"thread": k, "snapshots": v} for k, v in gil.most_common(5)], "list"))
        out.append(ev("dump.active_threads_mean", sum(active) / len(active), "threads"))
    return out
