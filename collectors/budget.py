"""Where an attach spends its profiling budget: which processes py-spy samples, and how often.

Measured on a real LitServe service (``benchmarks/attach_overhead.py --collectors``; README,
Performance): py-spy's cost is per *process* sampled and per thread in it, whatever that process
does. Following the whole tree (``--subprocesses``) at 50 Hz cost 0.13 cores, 0.015 of which went
to the one process that did the work; the rest read the stacks of idle processes (a multiprocessing
manager, a resource tracker, an idle launcher). So the budget goes where evidence comes from:

* the **on-CPU profile** (``cpu`` records, active samples only) covers the Python processes that use
  CPU (``MIN_BUSY_CORES``); its rate gives about ``TARGET_ACTIVE_SAMPLES`` active samples per busy
  thread over the window (more busy threads: a lower rate, same evidence), within
  ``MIN_RATE_HZ``..``max_rate`` and ``THREAD_SAMPLES_PER_S`` stack reads per second;
* the **wall-clock view** (``wall`` records, ``--idle``: waiting threads too) covers the processes
  that hold the service's connections or use CPU, at ``WALL_RATE_HZ``: a request thread that waits
  (for a lock, a compiler, a queue) uses no CPU but is exactly where latency goes;
* all records together read about ``STACK_READS_PER_S`` thread stacks per second (py-spy reads
  every thread of a process at each sample, 0.15-0.2 ms each on the benchmark host): the wall
  views take at most half, the processes that serve requests first (their threads are where a
  request's time goes), then the busiest; the on-CPU profiles the rest, the busiest process first;
* every Python process of the tree is covered, because a multi-process engine splits one request
  over several (vLLM V1: the API server, the EngineCore, the model worker), and a verdict that
  missed the one doing the work is wrong. A busy process that no longer fits the budget still gets
  an on-CPU profile at ``FLOOR_RATE_HZ`` (``MIN_FLOOR_RATE_HZ`` once all records reach
  ``CEILING_READS_PER_S``), ``FLOOR_MAX_PROCESSES`` of them at most; every other Python process
  (idle launchers, managers, trackers, and the busy ones beyond the floors) gets a coarse
  wall-clock view at ``COVER_RATE_HZ``, ``COVER_MAX_PROCESSES`` of them at most within
  ``COVER_READS_PER_S``, so its samples say what it was doing (waiting, mostly) rather than
  nothing. Those coarse views are kept apart from the wall-clock evidence (``coarse``): they say
  where each process stood, in the capture's notes, and never dilute the request threads' shares.
  What is still left out says why in its decision (and the capture's notes).

``light`` (for a host at 100 % CPU) samples only the busiest process and the main serving one, at
``LIGHT_MAX_RATE_HZ`` / ``LIGHT_WALL_RATE_HZ``, and covers no other.

Pure: ``plan`` maps observations (from ``diagnose.collectors.process.Sampler``) to decisions with reasons.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MIN_BUSY_CORES = 0.10  # a process using less than a tenth of a core has no CPU profile worth its sampling cost
TARGET_ACTIVE_SAMPLES = 400  # active samples per busy thread per window: CPU001/CMP001 call < 200 thin
MIN_RATE_HZ = 10  # below 10 Hz a 10 s window holds too few samples of a short stage to see it
DEFAULT_MAX_RATE_HZ = 50  # --rate: the ceiling (100 Hz costs twice as much for no new finding)
THREAD_SAMPLES_PER_S = 1500  # stack reads per second per process at most (py-spy reads every thread)
STACK_READS_PER_S = 300  # all records together: about 0.05 cores of py-spy (0.15-0.2 ms per thread stack read)
WALL_RATE_HZ = 10  # 100 wall samples per request thread in 10 s: shares to about ±5 pp
MIN_WALL_RATE_HZ = 2  # a process with hundreds of threads still gets a coarse wall-clock view
LIGHT_MAX_RATE_HZ = 10
LIGHT_WALL_RATE_HZ = 4
FLOOR_RATE_HZ = 5  # a busy process over the budget: 50 active samples per busy thread in 10 s, enough to name
# what it runs (its shares carry their error), where nothing would hide the process that does the work
MIN_FLOOR_RATE_HZ = 2  # the floor once the ceiling is reached: 20 samples per busy thread in 10 s, thin but there
FLOOR_MAX_PROCESSES = 4  # busy processes beyond the budget that get a floor (vLLM V1: API server, EngineCore,
# worker; a tensor-parallel engine has one worker per rank); more, and the busiest are profiled, not all
CEILING_READS_PER_S = 2 * STACK_READS_PER_S  # floors above the minimum stop here: about 0.1 cores of py-spy
COVER_RATE_HZ = 4  # idle processes: four wall-clock samples per thread per second say what each waits on. Not
# fewer: py-spy takes up to about 4 sample intervals to exit after SIGINT (measured: 2 s at 2 Hz, 3.5 s at
# 1 Hz, 1 s at 4 Hz), and a slow one holds the chunk's end back
COVER_MAX_PROCESSES = 8  # each one costs a py-spy start per chunk (about 8 ms of CPU)
COVER_READS_PER_S = 100  # all coverage views together (a process of hundreds of idle threads is left out)
CHUNK_S = 3.5  # the window is recorded in chunks of about this length: the spread between them is the noise
MAX_CHUNKS = 4  # each chunk restarts every py-spy (about 8 ms of CPU each)


@dataclass(frozen=True)
class Observation:
    """What the sampler saw of one process just before a chunk."""

    pid: int
    python: bool
    cores: float
    busy_threads: int
    threads: int
    serves: bool  # holds a listening socket or an accepted connection of the service


@dataclass(frozen=True)
class Decision:
    pid: int
    cpu_rate_hz: int  # 0: no on-CPU profile
    wall_rate_hz: int  # 0: no wall-clock view
    why: str
    coarse: bool = False  # the wall-clock view is the coverage one: kept apart, not part of the evidence


def chunks_for(window_s: float, light: bool = False) -> int:
    """How many chunks a window is recorded in (each restarts py-spy: a few ms of CPU)."""
    n = round(window_s / CHUNK_S)
    return max(1, min(MAX_CHUNKS if not light else 2, n))


def cpu_rate(busy_threads: int, threads: int, window_s: float, max_rate: int) -> int:
    """Samples per second for the on-CPU profile of a process (see the module docstring)."""
    want = TARGET_ACTIVE_SAMPLES / (max(1, busy_threads) * max(1.0, window_s))
    cap = THREAD_SAMPLES_PER_S / max(1, threads)
    return int(max(1, min(max_rate, max(MIN_RATE_HZ, want), max(MIN_RATE_HZ, cap))))


def wall_rate(threads: int, light: bool) -> int:
    base = LIGHT_WALL_RATE_HZ if light else WALL_RATE_HZ
    cap = THREAD_SAMPLES_PER_S / max(1, threads)
    return int(max(MIN_WALL_RATE_HZ, min(base, cap)))


def plan(
    seen: Sequence[Observation],
    window_s: float,
    *,
    max_rate: int = DEFAULT_MAX_RATE_HZ,
    light: bool = False,
    fixed: dict[int, tuple[int, int]] | None = None,
) -> list[Decision]:
    """Which processes to sample in the next chunk, and at what rates: one decision per Python process
    seen, by pid; one with both rates 0 is not sampled, and its ``why`` says why.

    ``fixed``: the rates already given to a pid in an earlier chunk; a pid keeps its rates for the
    whole window so that its samples add up (a thread's share of the window is samples / rate).
    """
    fixed = fixed or {}
    py = [o for o in seen if o.python]
    if not py:
        return []
    max_rate = max(1, min(max_rate, LIGHT_MAX_RATE_HZ) if light else max_rate)
    busy = [o for o in py if o.cores >= MIN_BUSY_CORES]
    serving = [o for o in py if o.serves]
    if not busy:  # an idle or blocked service: its busiest Python process (the first one when all are
        # idle), so the profile says "nothing ran" instead of being missing
        top = max(py, key=lambda o: o.cores)
        busy = [top if top.cores > 0 or serving else py[0]]
    if light:
        busy = sorted(busy, key=lambda o: -o.cores)[:1]
        serving = sorted(serving, key=lambda o: (-o.cores, o.pid))[:1]
    chosen = sorted({o.pid: o for o in (*busy, *serving)}.values(), key=lambda o: (-o.cores, o.pid))
    budget = float(STACK_READS_PER_S if not light else STACK_READS_PER_S / 4)
    wall_left = budget / 2  # the wall-clock views take at most half: request threads first, then the busiest
    walls: dict[int, int] = {}
    for o in sorted(chosen, key=lambda o: (not o.serves, -o.cores, o.pid)):
        threads = max(1, o.threads)
        w = fixed.get(o.pid, (0, 0))[1] or int(min(wall_rate(o.threads, light), wall_left / threads))
        if w < MIN_WALL_RATE_HZ and walls:
            continue  # over the budget: this process gets no wall-clock view of its own here
        w = max(w, MIN_WALL_RATE_HZ)
        walls[o.pid] = w
        wall_left -= w * threads
    cpu_left = budget - sum(walls[o.pid] * max(1, o.threads) for o in chosen if o.pid in walls)
    cpus: dict[int, int] = {}
    for o in chosen:  # then the on-CPU profiles, the busiest process first
        if o not in busy:
            continue
        threads = max(1, o.threads)
        c = fixed.get(o.pid, (0, 0))[0]
        if not c:
            c = int(min(cpu_rate(o.busy_threads, o.threads, window_s, max_rate), cpu_left / threads))
            if c < MIN_RATE_HZ:
                if cpus:
                    continue  # over the budget: the floor below, or a coverage view, or left out
                c = min(max_rate, MIN_RATE_HZ)
        cpus[o.pid] = c
        cpu_left -= c * threads
    floors: set[int] = set()
    covers: set[int] = set()
    if not light:
        reads = sum(r * max(1, o.threads) for o in py for r in (walls.get(o.pid, 0), cpus.get(o.pid, 0)))
        for o in chosen:  # busy processes the budget left out: a floor, busiest first
            if o not in busy or o.pid in cpus or len(floors) >= FLOOR_MAX_PROCESSES:
                continue
            threads = max(1, o.threads)
            c = fixed.get(o.pid, (0, 0))[0]
            if not c:
                c = FLOOR_RATE_HZ if reads + FLOOR_RATE_HZ * threads <= CEILING_READS_PER_S else MIN_FLOOR_RATE_HZ
                c = min(max_rate, c)
                if c * threads > CEILING_READS_PER_S / 2:
                    continue  # hundreds of threads: even the floor would cost more than the whole budget
            cpus[o.pid] = c
            floors.add(o.pid)
            reads += c * threads
        cover_left = float(COVER_READS_PER_S)
        for o in sorted(py, key=lambda o: (-o.cores, o.pid)):  # every other Python process: a coarse view
            if o.pid in walls or o.pid in cpus or len(covers) >= COVER_MAX_PROCESSES:
                continue
            w = COVER_RATE_HZ  # a record of its own kind (``coarse``): no rate of an earlier chunk applies
            if w * max(1, o.threads) > cover_left:
                continue
            walls[o.pid] = w
            covers.add(o.pid)
            cover_left -= w * max(1, o.threads)
    out: list[Decision] = []
    for o in sorted(py, key=lambda o: o.pid):
        c, w = cpus.get(o.pid, 0), walls.get(o.pid, 0)
        seen_as = (f"{o.cores:.2f} cores, {o.busy_threads} busy of {o.threads} threads"
                   + (", serves requests" if o.serves else ""))
        if o.pid in covers:
            what = ("over the budget" if o in busy or o in serving else "idle and serves no requests")
            why = f"{seen_as}: {what}, a coarse wall-clock view at {w} Hz"
        elif c or w:
            why = (seen_as
                   + (f": on-CPU profile at {c} Hz" if c else
                      ": busy but over the budget, no on-CPU profile" if o in busy else ": not busy, no on-CPU profile")
                   + (" (the floor: over the budget)" if o.pid in floors else "")
                   + (f", wall-clock view at {w} Hz" if w else ", no wall-clock view (over the budget)"))
        elif light:
            why = f"{seen_as}: not sampled (--light samples the busiest process and the main server only)"
        else:
            why = (f"{seen_as}: not sampled (over the coverage limit of {COVER_MAX_PROCESSES} processes and "
                   f"{COVER_READS_PER_S} stack reads per second)")
        out.append(Decision(o.pid, c, w, why, coarse=o.pid in covers))
    return out


def sampled(decisions: Sequence[Decision]) -> list[Decision]:
    """The decisions that sample their process (at least one rate above 0)."""
    return [d for d in decisions if d.cpu_rate_hz or d.wall_rate_hz]
