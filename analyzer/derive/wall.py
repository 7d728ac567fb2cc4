"""Wall-clock samples of request threads → evidence: where a request's time goes, waits included.

Inputs: the ``wall`` records (py-spy ``--idle``: every thread, every sample) and the ``cpu`` records
(active samples only) of the same chunks and processes, the source lines blocked threads stood on,
and whether compiler processes ran as children (psutil). Each wall sample of a thread that serves a
request is classified by ``analyzer.derive.waits`` and weighted by 1 / its record's rate (seconds of
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

from analyzer.derive import activities, waits
from analyzer.derive.waits import Wait
from analyzer.model import Evidence, Quality, Window
from collectors.pyspy import StackSample

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


def _site(s: StackSample, source: Mapping[str, str]) -> str:
    if not s.frames:
        return s.thread or "?"
    f = s.frames[-1]
    where = f"{f.function} ({waits.short_path(f.file)}:{f.line})"
    text = source.get(f"{f.file}:{f.line}")
    return f"{where} `{text}`" if text else where


Sites = dict[Wait, dict[str, float]]


def _sites() -> Sites:
    return defaultdict(lambda: defaultdict(float))


def classify_chunk(chunk: Chunk, source: Mapping[str, str], compilers: bool) -> tuple[
        dict[Wait, float], Sites, set[int], int]:
    """Seconds of request-thread time per class in one chunk, the sites, the threads, the samples."""
    active: Counter[tuple[int, tuple[tuple[str, int], ...]]] = Counter()
    for s in chunk.cpu:
        active[_key(s)] += s.count
    walls: Counter[tuple[int, tuple[tuple[str, int], ...]]] = Counter()
    for s in chunk.wall:
        walls[_key(s)] += s.count
    secs: dict[Wait, float] = defaultdict(float)
    sites = _sites()
    threads: set[int] = set()
    n = 0
    for s in chunk.wall:
        short = [(f.function, waits.short_path(f.file)) for f in s.frames]
        if not waits.serving(short):
            continue
        threads.add(s.tid)
        n += s.count
        weight = s.count / max(chunk.wall_rate_hz, 1e-9)
        if activities.classify(short) is activities.Activity.COMPILE:
            secs[Wait.COMPILE] += weight
            sites[Wait.COMPILE][_site(s, source)] += weight
            continue
        wait = waits.machinery(short)
        if wait is not None:
            if wait is Wait.CHILD and compilers:
                wait = Wait.COMPILE  # the children it waits for are compilers (psutil saw them)
            secs[wait] += weight
            sites[wait][_site(s, source)] += weight
            continue
        key = _key(s)
        running = 0.0
        if chunk.cpu_rate_hz > 0 and walls[key]:
            running = min(1.0, (active[key] / chunk.cpu_rate_hz) / (walls[key] / chunk.wall_rate_hz))
        if running > 0:
            secs[Wait.CPU] += weight * running
            sites[Wait.CPU][_site(s, source)] += weight * running
        if running < 1.0:
            f = s.frames[-1] if s.frames else None
            text = source.get(f"{f.file}:{f.line}", "") if f else ""
            blocked = waits.from_source(text) if text else None
            blocked = blocked or Wait.OTHER
            if blocked is Wait.CHILD and compilers:
                blocked = Wait.COMPILE
            secs[blocked] += weight * (1.0 - running)
            sites[blocked][_site(s, source)] += weight * (1.0 - running)
    return secs, sites, threads, n


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
    for c in chunks:
        secs, where, tids, n = classify_chunk(c, source, compilers)
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

    def ev(key: str, value: object, unit: str, detail: str = "") -> Evidence:
        return Evidence(key, value, unit, SOURCE, window, quality, detail)

    out = [ev("wall.samples", samples, "samples", "wall-clock samples of threads serving a request"),
           ev("wall.request_threads", len(threads), "threads")]
    if seconds <= 0:
        return out
    out.append(ev("wall.request_seconds", seconds, "s", "request-thread time observed (samples / rate)"))
    usable = [i for i in by_index if by_index_n[i] >= MIN_CHUNK_SAMPLES]
    for w in Wait:
        share = total[w] / seconds
        spread = 0.0
        if len(usable) >= 2:
            per = [by_index[i][w] / max(1e-12, sum(by_index[i].values())) for i in usable]
            spread = statistics.stdev(per) / math.sqrt(len(per))
        binomial = math.sqrt(max(share * (1 - share), 0.25 / max(samples, 1)) / max(samples, 1))
        out.append(ev(f"wall.{w.value}_share", share, "ratio",
                      f"share of request-thread wall time; ±{max(spread, binomial):.2f} "
                      f"({len(usable)} chunks, {samples} samples)"))
        out.append(ev(f"wall.{w.value}_share.stderr", max(spread, binomial), "ratio"))
        if sites[w]:
            best = sorted(sites[w].items(), key=lambda kv: -kv[1])[:3]
            top = [{"site": k, "share": v / seconds} for k, v in best]
            out.append(ev(f"wall.top.{w.value}", top, "list"))
    return out
