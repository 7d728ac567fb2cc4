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
* a process that neither uses CPU nor serves requests is not sampled at all;
* all records together read about ``STACK_READS_PER_S`` thread stacks per second (py-spy reads
  every thread of a process at each sample, 0.15-0.2 ms each on the benchmark host): the wall
  views take at most half, the on-CPU profiles the rest, the busiest process first; a process that
  no longer fits at the minimum rates is left out (the busiest one never is).

``light`` (for a host at 100 % CPU) samples only the busiest process and the main serving one, at
``LIGHT_MAX_RATE_HZ`` / ``LIGHT_WALL_RATE_HZ``.

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
    """Which processes to sample in the next chunk, and at what rates.

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
    wall_left = budget / 2  # the wall-clock views take at most half, the busiest process first
    walls: dict[int, int] = {}
    for o in chosen:
        threads = max(1, o.threads)
        w = fixed.get(o.pid, (0, 0))[1] or int(min(wall_rate(o.threads, light), wall_left / threads))
        if w < MIN_WALL_RATE_HZ and walls:
            continue  # over the budget: this process is not watched (the plan says so)
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
                    continue  # over the budget: the busiest processes are profiled, this one is not
                c = min(max_rate, MIN_RATE_HZ)
        cpus[o.pid] = c
        cpu_left -= c * threads
    chosen = [o for o in chosen if o.pid in walls or o.pid in cpus]
    out: list[Decision] = []
    for o in sorted(chosen, key=lambda o: o.pid):
        c, w = cpus.get(o.pid, 0), walls.get(o.pid, 0)
        why = (f"{o.cores:.2f} cores, {o.busy_threads} busy of {o.threads} threads"
               + (", serves requests" if o.serves else "")
               + (f": on-CPU profile at {c} Hz" if c else ": not busy, no on-CPU profile")
               + (f", wall-clock view at {w} Hz" if w else ", no wall-clock view (over the budget)"))
        out.append(Decision(o.pid, c, w, why))
    return out
