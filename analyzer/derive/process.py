"""psutil samples → evidence: CPU per process, threads against cores, scheduling, in-flight requests.

Thread-level figures (busy threads, run-queue wait, context switches) come from the first and last
*full* samples; a light sample (per-process CPU, RSS, in-flight count) carries no thread list.

Compiler children (``diagnose.derive.activities.COMPILER_PROCESSES``: ``cc1plus``, ``g++``, ``ld``,
``nvcc``, ``ptxas``, inductor's compile workers, …) are compilation *of their parent*, with their CPU:
``compile.children_cpu_s`` is the CPU they used in the window, counted once: each compiler still running
at the end (a ``g++`` driver and the ``cc1plus`` under it alike) by its own and its reaped children's CPU
since it was first seen (or since the window began), one that exited by what its parent reaped (the
parent's ``children_user``/``children_system`` grow by a child's whole CPU, grandchildren included, when
it is waited for: a compiler parent still running counts it above, a non-compiler parent here).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from diagnose.derive.activities import compiler_process
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality, Window
from diagnose.stats import wilson
from diagnose.units import pct

SOURCE = "psutil"
BUSY_OS_THREAD = 0.10  # a thread runnable ≥ 10 % of the window is busy (torch/OpenMP pools included)
INFLIGHT_SUBWINDOWS = 4  # the in-flight mean's uncertainty: the spread of this many sub-window means
DEMAND_ROW = 0.01  # a thread runnable ≥ 1 % of the window gets a row in ``threads.demand``
DEMAND_ROWS = 64  # the busiest this many threads (py-spy's thread table holds 50)


def _index(rec: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(p["pid"]): p for p in rec.get("processes", ())}


def derive(
    samples: Sequence[Mapping[str, Any]],
    info: Mapping[str, Any],
    *,
    window: Window | None = None,
    partial: bool = False,
    cache_files: tuple[int | None, int | None] = (None, None),
) -> list[Evidence]:
    ev = Emit(SOURCE, window=window, quality=Quality.PARTIAL if partial else Quality.GOOD)
    cores = int(info.get("cores") or 0)
    if cores:
        ev.add("host.cores", cores, "cores", "CPUs the target may run on (affinity)")
    if cache_files[0] is not None and cache_files[1] is not None:
        ev.add("compile.cache_files_added", max(0, cache_files[1] - cache_files[0]), "files",
               "files added to the torch inductor cache during the window")
    loaded = info.get("compiled_modules_loaded")
    if isinstance(loaded, int):
        ev.add("compile.modules_loaded", loaded, "modules",
               "compiled-graph shared objects (inductor kernels) newly mapped during the window")
    if not samples:
        return ev.items
    loads = [float(s["loadavg"][0]) for s in samples if s.get("loadavg")]
    if loads:
        ev.add("host.load_1m", max(loads), "runnable", "the host's 1-minute load average (all processes)")
    inflight = [int(s.get("conn", {}).get("inflight", 0)) for s in samples]
    listen = sorted({p for s in samples for p in s.get("conn", {}).get("listen_ports", ())})
    if listen:
        mean = sum(inflight) / len(inflight)
        err = _stderr_of_mean(inflight)
        ev.add("conn.inflight_mean", mean, "requests",
               f"accepted connections + accept queue on port(s) {', '.join(map(str, listen))}; "
               f"±{err:.2f} ({len(inflight)} samples)")
        ev.add("conn.inflight_mean.stderr", err, "requests",
               f"spread of {INFLIGHT_SUBWINDOWS} sub-window means / √{INFLIGHT_SUBWINDOWS}, or the "
               "samples' standard error, the larger")
        ev.add("conn.inflight_max", max(inflight), "requests")
        ev.add("conn.accept_queue_max", max(int(s["conn"].get("accept_queue", 0)) for s in samples),
               "requests")
    ev.add("proc.processes", max(len(s.get("processes", ())) for s in samples), "processes")
    ev.add("proc.threads", max(sum(int(p.get("num_threads", 0)) for p in s.get("processes", ()))
                               for s in samples), "threads")
    ev.add("proc.rss_bytes", max(sum(int(p.get("rss", 0)) for p in s.get("processes", ()))
                                 for s in samples), "bytes")
    if len(samples) < 2:
        return ev.items
    first, last = samples[0], samples[-1]
    wall = float(last["ts"]) - float(first["ts"])
    if wall <= 0:
        return ev.items
    _compile_children(samples, wall, ev)
    full = [s for s in samples if _is_full(s)]
    if len(full) >= 2:
        first, last = full[0], full[-1]
        wall = float(last["ts"]) - float(first["ts"])
        if wall <= 0:
            return ev.items
    a, b = _index(first), _index(last)
    both = [pid for pid in b if pid in a]
    cpu_s = sum((b[p]["cpu_user"] + b[p]["cpu_system"]) - (a[p]["cpu_user"] + a[p]["cpu_system"]) for p in both)
    ev.add("proc.cpu_cores_used", max(0.0, cpu_s) / wall, "cores")
    per_proc = [
        {"pid": p, "name": b[p].get("name", ""),
         "cpu_cores": round(((b[p]["cpu_user"] + b[p]["cpu_system"]) - (a[p]["cpu_user"] + a[p]["cpu_system"]))
                            / wall, 3),
         "threads": b[p].get("num_threads", 0), "rss_bytes": b[p].get("rss", 0)}
        for p in both
    ]
    ev.add("proc.per_process", sorted(per_proc, key=lambda r: -r["cpu_cores"]), "table")
    ctx = [p for p in both if "ctx_involuntary" in a[p] and "ctx_involuntary" in b[p]]
    if ctx:
        invol = sum(b[p]["ctx_involuntary"] - a[p]["ctx_involuntary"] for p in ctx)
        vol = sum(b[p]["ctx_voluntary"] - a[p]["ctx_voluntary"] for p in ctx)
        ev.add("proc.involuntary_switches_per_s", max(0, invol) / wall, "1/s")
        ev.add("proc.voluntary_switches_per_s", max(0, vol) / wall, "1/s")

    busy = 0
    run_total = wait_total = 0
    have_sched = False
    demand: list[dict[str, Any]] = []
    for p in both:
        ta = {int(t[0]): t for t in a[p].get("threads", ())}
        for t in b[p].get("threads", ()):
            old = ta.get(int(t[0]))
            if old is None:
                continue
            if len(t) >= 5 and t[3] is not None and old[3] is not None:
                have_sched = True
                run = max(0, int(t[3]) - int(old[3]))
                wait = max(0, int(t[4]) - int(old[4]))
                run_total += run
                wait_total += wait
                # demand, not consumption: an oversubscribed thread runs little but is runnable long
                wanted = (run + wait) / 1e9
                if wanted / wall >= DEMAND_ROW:
                    demand.append({"pid": p, "tid": int(t[0]), "run": round(run / 1e9 / wall, 4),
                                   "wait": round(wait / 1e9 / wall, 4)})
            else:
                wanted = (t[1] + t[2]) - (old[1] + old[2])
            if wanted / wall >= BUSY_OS_THREAD:
                busy += 1
    ev.add("threads.busy_count", busy, "threads",
           f"OS threads runnable (running or waiting for a CPU) ≥ {pct(BUSY_OS_THREAD)} of the window")
    if have_sched and run_total + wait_total > 0:
        ev.add("threads.runnable_mean", (run_total + wait_total) / 1e9 / wall, "threads",
               "threads wanting a CPU on average (run + run-queue wait, from schedstat)")
        ev.add("proc.runqueue_wait_ratio", wait_total / (run_total + wait_total), "ratio",
               "time runnable threads waited for a CPU / (run + wait), from schedstat")
        demand.sort(key=lambda r: -(r["run"] + r["wait"]))
        ev.add("threads.demand", demand[:DEMAND_ROWS], "table",
               f"per OS thread runnable ≥ {pct(DEMAND_ROW)} of the window: the cores it ran on (run) and waited "
               "for in the run queue (wait), from schedstat")
    return ev.items


def _is_full(rec: Mapping[str, Any]) -> bool:
    """A sample with thread lists (every sample of an older session is one)."""
    if rec.get("full"):
        return True
    procs = rec.get("processes") or ()
    return bool(procs) and all("threads" in p for p in procs)


def _stderr_of_mean(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    plain = statistics.pstdev(values) / math.sqrt(n)
    k = min(INFLIGHT_SUBWINDOWS, n // 2)
    if k < 2:
        return plain
    means = [statistics.fmean(values[i * n // k:(i + 1) * n // k]) for i in range(k)]
    return max(plain, statistics.stdev(means) / math.sqrt(k))


def _cpu(p: Mapping[str, Any], children: bool = False) -> float:
    own = float(p.get("cpu_user", 0.0)) + float(p.get("cpu_system", 0.0))
    if not children:
        return own
    return own + float(p.get("children_user", 0.0)) + float(p.get("children_system", 0.0))


def _compile_children(samples: Sequence[Mapping[str, Any]], wall: float, ev: Emit) -> None:
    """CPU of compiler processes in the tree during the window (see the module docstring)."""
    names: dict[tuple[int, int], str] = {}
    hints: dict[tuple[int, int], str] = {}
    parent: dict[tuple[int, int], int] = {}
    seen: dict[tuple[int, int], list[Mapping[str, Any]]] = {}
    by_pid_first: dict[int, Mapping[str, Any]] = {}
    by_pid_last: dict[int, Mapping[str, Any]] = {}
    first_ids = {(int(p["pid"]), int(p.get("start_ticks", 0))) for p in samples[0].get("processes", ())}
    last_ids = {(int(p["pid"]), int(p.get("start_ticks", 0))) for p in samples[-1].get("processes", ())}
    for rec in samples:
        for p in rec.get("processes", ()):
            ident = (int(p["pid"]), int(p.get("start_ticks", 0)))
            names.setdefault(ident, str(p.get("name") or ""))
            if p.get("hint"):
                hints[ident] = str(p["hint"])
            parent[ident] = int(p.get("ppid", 0))
            seen.setdefault(ident, []).append(p)
            by_pid_first.setdefault(int(p["pid"]), p)
            by_pid_last[int(p["pid"])] = p
    compilers = {i for i in seen if compiler_process(names[i], hints.get(i, ""))}
    if not compilers:
        return
    compiler_pids = {i[0] for i in compilers}
    top = {i for i in compilers if parent[i] not in compiler_pids}
    cpu_s = 0.0
    reaping: set[int] = set()
    for ident in compilers:
        recs = seen[ident]
        if ident in last_ids:  # still running: its CPU since it was first seen, or since it began, and what
            # it reaped (a g++ driver uses little itself; the cc1plus under it, running, counts on its own)
            base = _cpu(recs[0], children=True) if ident in first_ids else 0.0
            cpu_s += max(0.0, _cpu(recs[-1], children=True) - base)
        elif ident in top:  # exited: its whole CPU reached its (non-compiler) parent when reaped
            reaping.add(parent[ident])
    for ppid in reaping:
        a, b = by_pid_first.get(ppid), by_pid_last.get(ppid)
        if a is not None and b is not None:
            cpu_s += max(0.0, (_cpu(b, True) - _cpu(b)) - (_cpu(a, True) - _cpu(a)))
    kinds = sorted({names[i] for i in compilers})
    ev.add("compile.children_cpu_s", cpu_s, "s",
           f"CPU of compiler processes under the service ({', '.join(kinds[:6])}) during the window")
    ev.add("compile.children_cores", cpu_s / wall, "cores")
    ev.add("compile.children_seen", len(compilers), "processes",
           "compiler processes seen (sampled every tick; a compiler shorter than a tick may be missed, "
           "its CPU is still counted when its parent reaps it)")


POLL_MIN_SAMPLES = 10  # fewer py-spy samples of a thread say nothing about what it spends its CPU on
POLL_Z = 1.96  # the shares' 95 % Wilson bounds: a thin profile discounts little


def polling(demand: Sequence[Mapping[str, Any]], profile: Sequence[Mapping[str, Any]], runnable_mean: float,
            busy_count: float, wall: Sequence[Mapping[str, Any]] = (), *, window_s: float = 0.0,
            window: Window | None = None, quality: Quality = Quality.GOOD) -> list[Evidence]:
    """How much of the target's demand for CPU is threads polling a queue: schedstat per thread joined by
    process and OS thread id with py-spy's samples of it.

    A thread that spins on a queue (vLLM's shared-memory ``MessageQueue`` readers call ``os.sched_yield``
    in a loop for a second after each message; a ``while not ready: pass`` loop) is runnable all the time
    and so looks like demand, but it gives the CPU up to any thread with work at every turn of its loop.
    py-spy samples it in waiting frames (``diagnose.derive.activities``: locks, queues, a runtime's queue).

    Two bounds, the larger is taken, each at the end of a 95 % Wilson interval that makes it smaller, so a
    thin profile discounts little (none with fewer than ``POLL_MIN_SAMPLES`` samples):

    - on-CPU samples (taken while the thread is runnable): its runnable time × its waiting share;
    - wall-clock samples (every tick, blocked or not; ``seconds`` of its time they stand for): its work is
      at most the time they saw outside waiting frames plus the part of ``window_s`` they did not see, so
      the rest of its runnable time polled. This one holds when the on-CPU profile is thin (on a saturated
      host py-spy runs mostly while the target blocks).

    What it cannot tell apart: a thread woken from a lock or a queue waits in the run queue with its stack
    still in the waiting frame, and that wait is taken for polling too. A pool that oversubscribes the
    cores runs its work in compute frames (or natively, where py-spy does not see it), so its demand stays;
    and under a CPU quota the rule reads the raw demand (polling spends the quota).

    Threads py-spy does not see (native OpenMP/MKL pools, compiler children) keep their whole demand, and so
    do the busy threads beyond ``threads.demand``'s rows (``busy_count`` is the raw count)."""
    ev = Emit(SOURCE + " + py-spy", window=window, quality=quality)
    by_thread = {(int(r.get("pid", 0)), int(r["tid"])): r for r in profile if isinstance(r, Mapping) and "tid" in r}
    wall_by_thread = {(int(r.get("pid", 0)), int(r["tid"])): r for r in wall if isinstance(r, Mapping) and "tid" in r}
    polled_total = 0.0
    unbusied = 0
    rows: list[dict[str, Any]] = []
    for row in demand:
        run, wait = float(row["run"]), float(row["wait"])
        key = (int(row["pid"]), int(row["tid"]))
        polled = 0.0
        how = ""
        prof = by_thread.get(key)
        if prof is not None and int(prof.get("samples", 0)) >= POLL_MIN_SAMPLES:
            share = float((prof.get("shares") or {}).get("waiting", 0.0))
            polled = (run + wait) * wilson(share, int(prof["samples"]), POLL_Z)[0]
            how = f"waiting in {pct(share)} of {prof['samples']} on-CPU samples"
        ticks = wall_by_thread.get(key)
        if ticks is not None and int(ticks.get("samples", 0)) >= POLL_MIN_SAMPLES and window_s > 0:
            share, seen = float(ticks.get("waiting", 0.0)), min(float(ticks.get("seconds", 0.0)), window_s)
            work_max = (wilson(1.0 - share, int(ticks["samples"]), POLL_Z)[1] * seen + (window_s - seen)) / window_s
            by_wall = max(0.0, run + wait - work_max)
            if by_wall > polled:
                polled = by_wall
                how = f"waiting in {pct(share)} of {ticks['samples']} wall-clock samples ({seen:.0f} s)"
        if polled < 0.005:
            continue
        if run + wait >= BUSY_OS_THREAD > run + wait - polled:
            unbusied += 1
        polled_total += polled
        rows.append({"pid": key[0], "tid": key[1], "name": str((prof or {}).get("name") or ""),
                     "runnable": round(run + wait, 4), "polling": round(polled, 4), "how": how})
    rows.sort(key=lambda r: -r["polling"])
    ev.add("threads.polling", rows, "table",
           "threads whose runnable time was partly polling a queue (py-spy: in waiting frames), the most first")
    ev.add("threads.polling_runnable", round(polled_total, 4), "threads",
           "threads' runnable time spent polling a queue"
           + (": " + "; ".join(f"{r['name'] or r['tid']} (pid {r['pid']}) {r['polling']:.2f} of {r['runnable']:.2f}"
                               for r in rows[:4]) if rows else ""))
    ev.add("threads.work_runnable_mean", round(max(0.0, runnable_mean - polled_total), 4), "threads",
           "threads wanting a CPU on average for work: threads.runnable_mean less the polling")
    ev.add("threads.work_busy_count", max(0, int(busy_count) - unbusied), "threads",
           f"OS threads runnable ≥ {pct(BUSY_OS_THREAD)} of the window for work (threads.busy_count less those "
           "busy only by polling)")
    return ev.items
