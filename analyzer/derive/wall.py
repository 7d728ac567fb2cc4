"""Wall-clock samples of request threads → evidence: where a request's time goes, waits included.

Inputs: the ``wall`` records (py-spy ``--idle``: every thread, every sample) and the ``cpu`` records
(active samples only) of the same chunks and processes, the source lines blocked threads stood on,
and whether compiler processes ran as children (psutil). Each wall sample of a thread that serves a
request is classified by ``diagnose.derive.waits`` and weighted by 1 / its record's rate (seconds of
thread time), so processes sampled at different rates add up.

Evidence: ``wall.<class>_share`` for every class of ``waits.Wait`` (shares of request-thread time,
summing to 1), ``wall.<class>_share.stderr`` (the larger of the spread between chunks / √chunks and
the binomial error of the sample count), ``wall.top.<class>`` (where: function, file:line, source
line), ``wall.request_seconds`` and ``wall.samples``, ``wall.request_threads``.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from diagnose.collectors.pyspy import StackSample
from diagnose.derive import activities, waits
from diagnose.derive.emit import Emit
from diagnose.derive.waits import Wait
from diagnose.model import Evidence, Quality, Window

SOURCE = "py-spy (wall clock)"
MIN_SAMPLES = 30  # fewer serving samples than this: the shares are reported with LOW quality
MIN_CHUNK_SAMPLES = 10  # a chunk with fewer serving samples does not count towards the spread


@dataclass(frozen=True)
class Chunk:
    """One chunk of one process: its wall samples (rate ``wall_rate_hz``) and, when the process was
    busy enough to get an on-CPU profile, its active samples (rate ``cpu_rate_hz``)."""

    index: int
    pid: int
    wall: Sequence[StackSample]
    wall_rate_hz: float
    cpu: Sequence[StackSample] = ()
    cpu_rate_hz: float = 0.0


def _key(s: StackSample) -> tuple[int, tuple[tuple[str, int], ...]]:
    return s.tid, tuple((f.function, f.line) for f in s.frames)


def _site(s: StackSample, source: Mapping[str, str], caller: bool = False) -> str:
    """Where a sample stands: the leaf frame, or with ``caller`` the frame that called into the wait
    machinery (``Queue.get``'s caller says which queue), with the source line when it was read."""
    if not s.frames:
        return s.thread or "?"
    f = s.frames[-1]
    if caller:
        short = [(g.function, waits.short_path(g.file)) for g in s.frames]
        depth = waits.machinery_depth(short)
        if 0 < depth < len(s.frames):
            f = s.frames[-1 - depth]
    where = f"{f.function} ({waits.short_path(f.file)}:{f.line})"
    text = source.get(f"{f.file}:{f.line}")
    return f"{where} `{text}`" if text else where


Sites = dict[Wait, dict[str, float]]


def _sites() -> Sites:
    return defaultdict(lambda: defaultdict(float))


def _classify(s: StackSample, weight: float, running: float, source: Mapping[str, str],
              compilers: bool) -> list[tuple[Wait, float, str]]:
    """(class, seconds, site) parts of one sample; ``running``: the part the on-CPU profile also saw."""
    short = [(f.function, waits.short_path(f.file)) for f in s.frames]
    if activities.classify(short) is activities.Activity.COMPILE:
        return [(Wait.COMPILE, weight, _site(s, source))]
    wait = waits.machinery(short)
    if wait is not None:
        if wait is Wait.CHILD and compilers:
            wait = Wait.COMPILE  # the children it waits for are compilers (psutil saw them)
        return [(wait, weight, _site(s, source, caller=True))]
    out: list[tuple[Wait, float, str]] = []
    if running > 0:
        out.append((Wait.CPU, weight * running, _site(s, source)))
    if running < 1.0:
        f = s.frames[-1] if s.frames else None
        text = source.get(f"{f.file}:{f.line}", "") if f else ""
        blocked = (waits.from_source(text) if text else None) or Wait.OTHER
        if blocked is Wait.CHILD and compilers:
            blocked = Wait.COMPILE
        out.append((blocked, weight * (1.0 - running), _site(s, source)))
    return out


IDLE_CLASSES = frozenset({Wait.QUEUE, Wait.IO})  # a thread parked here is waiting for work, not doing any


def classify_chunk(chunk: Chunk, source: Mapping[str, str], compilers: bool) -> tuple[
        dict[Wait, float], Sites, set[int], int, dict[tuple[int, str], Sites]]:
    """Seconds of request-thread time per class in one chunk, the sites, the threads, the samples,
    and for every thread *not* serving a request, its time by class and site."""
    active: Counter[tuple[int, tuple[tuple[str, int], ...]]] = Counter()
    for s in chunk.cpu:
        active[_key(s)] += s.count
    walls: Counter[tuple[int, tuple[tuple[str, int], ...]]] = Counter()
    for s in chunk.wall:
        walls[_key(s)] += s.count
    secs: dict[Wait, float] = defaultdict(float)
    sites = _sites()
    others: dict[tuple[int, str], Sites] = defaultdict(_sites)
    threads: set[int] = set()
    n = 0
    for s in chunk.wall:
        weight = s.count / max(chunk.wall_rate_hz, 1e-9)
        key = _key(s)
        running = 0.0
        if chunk.cpu_rate_hz > 0 and walls[key]:
            running = min(1.0, (active[key] / chunk.cpu_rate_hz) / (walls[key] / chunk.wall_rate_hz))
        parts = _classify(s, weight, running, source, compilers)
        if not waits.serving([(f.function, waits.short_path(f.file)) for f in s.frames]):
            for w, v, site in parts:
                others[(s.tid, s.thread)][w][site] += v
            continue
        threads.add(s.tid)
        n += s.count
        for w, v, site in parts:
            secs[w] += v
            sites[w][site] += v
    return secs, sites, threads, n, others


THREAD_ROWS = 64  # ``wall.threads`` keeps the threads with the most samples


def thread_waiting(chunks: Sequence[Chunk]) -> list[dict[str, object]]:
    """Per thread (every one sampled, serving or not): its wall samples, the seconds of its time they stand
    for (samples / the chunk's rate: processes are sampled at their own rates, in some chunks only), and the
    share of them whose stack ``activities.classify`` calls waiting. Joined with schedstat by process and OS
    thread id, it bounds how much of a thread's runnable time can be work
    (``diagnose.derive.process.polling``)."""
    count: Counter[tuple[int, int]] = Counter()
    waiting: Counter[tuple[int, int]] = Counter()
    seconds: dict[tuple[int, int], float] = defaultdict(float)
    memo: dict[tuple[tuple[str, str], ...], bool] = {}  # one classification per distinct stack
    for c in chunks:
        for s in c.wall:
            stack = tuple((f.function, f.file) for f in s.frames)
            idle = memo.get(stack)
            if idle is None:
                idle = memo[stack] = activities.classify(list(stack)) is activities.Activity.WAITING
            count[(c.pid, s.tid)] += s.count
            seconds[(c.pid, s.tid)] += s.count / max(c.wall_rate_hz, 1e-9)
            if idle:
                waiting[(c.pid, s.tid)] += s.count
    return [{"pid": pid, "tid": tid, "samples": n, "seconds": round(seconds[(pid, tid)], 3),
             "waiting": round(waiting[(pid, tid)] / n, 4)}
            for (pid, tid), n in count.most_common(THREAD_ROWS) if n > 0]


def other_threads(others: Mapping[tuple[int, int, str], Sites], limit: int = 5) -> list[dict[str, object]]:
    """The threads that serve no request but do something (not parked in a queue or a selector):
    a background thread that holds the lock the request threads wait for shows up here."""
    rows: list[dict[str, object]] = []
    for (pid, tid, name), by_class in others.items():
        total = sum(sum(v.values()) for v in by_class.values())
        busy = {w: v for w, v in by_class.items() if w not in IDLE_CLASSES}
        busy_s = sum(sum(v.values()) for v in busy.values())
        if total <= 0 or busy_s / total < 0.2:
            continue
        site, secs = max(((k, v) for d in busy.values() for k, v in d.items()), key=lambda kv: kv[1])
        rows.append({"pid": pid, "thread": name or str(tid), "busy_share": round(busy_s / total, 3),
                     "site": site, "site_share": round(secs / total, 3)})
    rows.sort(key=lambda r: -float(r["busy_share"]))  # type: ignore[arg-type]
    return rows[:limit]


def derive(
    chunks: Sequence[Chunk],
    *,
    source: Mapping[str, str] | None = None,
    compilers: bool = False,
    window: Window | None = None,
    partial: bool = False,
) -> list[Evidence]:
    source = source or {}
    total: dict[Wait, float] = defaultdict(float)
    sites = _sites()
    threads: set[tuple[int, int]] = set()
    samples = 0
    by_index: dict[int, dict[Wait, float]] = defaultdict(lambda: defaultdict(float))
    by_index_n: Counter[int] = Counter()
    others: dict[tuple[int, int, str], Sites] = defaultdict(_sites)
    for c in chunks:
        secs, where, tids, n, other = classify_chunk(c, source, compilers)
        for (tid, name), by_class in other.items():
            for w, got in by_class.items():
                for site, v in got.items():
                    others[(c.pid, tid, name)][w][site] += v
        samples += n
        by_index_n[c.index] += n
        threads |= {(c.pid, t) for t in tids}
        for w, v in secs.items():
            total[w] += v
            by_index[c.index][w] += v
        for w, got in where.items():
            for site, v in got.items():
                sites[w][site] += v
    seconds = sum(total.values())
    quality = Quality.PARTIAL if partial else Quality.GOOD
    if samples < MIN_SAMPLES:
        quality = Quality.LOW
    ev = Emit(SOURCE, window=window, quality=quality)
    ev.add("wall.samples", samples, "samples", "wall-clock samples of threads serving a request")
    ev.add("wall.request_threads", len(threads), "threads")
    per_thread = thread_waiting(chunks)
    if per_thread:
        ev.add("wall.threads", per_thread, "table",
               "every sampled thread's wall-clock samples and the share of them in waiting frames (locks, queues, "
               "a runtime's queue: diagnose.derive.activities), blocked or spinning alike")
    busy_others = other_threads(others)
    if busy_others:
        ev.add("wall.other_threads", busy_others, "table",
               "threads serving no request that were busy (running, sleeping, blocked outside a queue)")
    if seconds <= 0:
        return ev.items
    ev.add("wall.request_seconds", seconds, "s", "request-thread time observed (samples / rate)")
    usable = [i for i in by_index if by_index_n[i] >= MIN_CHUNK_SAMPLES]
    for w in Wait:
        share = total[w] / seconds
        spread = 0.0
        if len(usable) >= 2:
            per = [by_index[i][w] / max(1e-12, sum(by_index[i].values())) for i in usable]
            spread = statistics.stdev(per) / math.sqrt(len(per))
        binomial = math.sqrt(max(share * (1 - share), 0.25 / max(samples, 1)) / max(samples, 1))
        ev.add(f"wall.{w.value}_share", share, "ratio",
               f"share of request-thread wall time; ±{max(spread, binomial):.2f} "
               f"({len(usable)} chunks, {samples} samples)")
        ev.add(f"wall.{w.value}_share.stderr", max(spread, binomial), "ratio")
        if sites[w]:
            best = sorted(sites[w].items(), key=lambda kv: -kv[1])[:3]
            top = [{"site": k, "share": v / seconds} for k, v in best]
            ev.add(f"wall.top.{w.value}", top, "list")
    return ev.items
