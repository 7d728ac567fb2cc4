"""What the host took from an attach, read from its cost record (``attach-cost.json``, written by
``diagnose.attach``): the live tests bound the attach's window and its wall time less these, so that a host short
of CPU, or one that pages the attach's code back in from a slow disk, is told apart from the attach's own work.

Each share is a measurement the kernel gave for that interval (``attach.HostMark.since``): a thread's run-queue
delay, the most any thread of the attach waited, the hypervisor's steal, and the machine's stalls on the disk or
memory (PSI) when the attach had major faults of its own meanwhile; each phase's share is at most the phase's
length. Where the kernel gave none, nothing is forgiven."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from diagnose.collectors import process as process_collector


def _phase(cost: Mapping[str, float], phase: str, length: float, steal: float | None = None) -> float:
    """The host's share of one phase the attach's thread waited through, never more than the phase lasted
    (``length``): the most its thread, or a thread whose GIL it needed, waited for a CPU, plus the steal
    (``steal``: the phase's own where it has none), plus the machine's stalls on the disk or memory when the
    attach itself had major faults meanwhile (PSI counts any task's stalls: without a fault of its own, the
    attach did not wait on the disk)."""
    waited = max(cost.get(f"{phase}_wait_s", 0.0), cost.get(f"{phase}_threads_wait_s", 0.0))
    stolen = cost.get(f"{phase}_steal_s", 0.0) if steal is None else steal
    stalled = cost.get(f"{phase}_stall_s", 0.0) if cost.get(f"{phase}_majflt", 0) > 0 else 0.0
    return min(max(0.0, length), waited + stolen + stalled)


def window_share(cost: Mapping[str, float]) -> float:
    """Seconds of the window that were the host's: its share of the stop (at most the stop's length), and of
    the wait's late end (at most how late it ended, ``late_s``; its steal is bounded by the whole window's, not
    read per wait). The wait itself is on the clock: a host that took time from it earlier ends it no later."""
    late = _phase(cost, "late", cost.get("late_s", 0.0), steal=cost.get("steal_s", 0.0))
    return _phase(cost, "stop", cost.get("stop_s", 0.0)) + late


SLOWEST_DISK_BPS = 1e6  # a start's blocked time is forgiven as long as its reads would take at this rate


def _disk_bound(cost: Mapping[str, float]) -> float:
    """The blocked time of the attach's start that its reads from storage explain: at most what the bytes it
    read (``imports_inblock``, 512-byte blocks, readahead included) take at ``SLOWEST_DISK_BPS``. A start
    blocked on anything else (a sleep, a lock, a subprocess) reads nothing and is the attach's own."""
    return min(cost.get("imports_blocked_s", 0.0), cost.get("imports_inblock", 0) * 512 / SLOWEST_DISK_BPS)


def outside_share(cost: Mapping[str, float]) -> float:
    """Seconds of the attach's wall time outside its window that were the host's, each phase's at most its
    length: from its start to the window (its thread's run-queue wait since it started; the time its imports
    were blocked, as far as their reads from storage explain it, ``_disk_bound``; the steal and the stalls of
    its setup)
    and after the window (the same readings over the captures and the analysis). CI 2026-12-05: a kv-pressure
    attach took 37.4 s from its start to its window, 34.7 s of it before ``attach()`` was called, of which
    6.6 s were a wait for a CPU; the rest was not measured then."""
    before = cost.get("started_wait_s", 0.0) + cost.get("setup_steal_s", 0.0) + (
        cost.get("setup_stall_s", 0.0) if cost.get("setup_majflt", 0) > 0 else 0.0) + _disk_bound(cost)
    return min(max(0.0, cost.get("started_s", 0.0)), before) + _phase(cost, "after", cost.get("after_s", 0.0))


def threads_of(pid: int, blocking: bool = True) -> str:
    """What a process's threads are doing, for a test that waited on it too long: each thread's state (R runnable,
    S asleep, D waiting for the disk), kernel wait channel, run-queue wait and major page faults from /proc, then
    py-spy's dump of their Python stacks (``blocking``: the process is paused for it; else read as it runs)."""
    parts = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        stat = process_collector.read_stat(pid, int(task.name))
        if stat is None:  # a thread that ended meanwhile
            continue
        line = f"tid {task.name} ({stat['name']}): state {stat['state']}"
        with contextlib.suppress(OSError):
            line += f", wchan {(task / 'wchan').read_text() or '-'}"
        if (sched := process_collector.schedstat_at(str(task / "schedstat"))) is not None:
            line += f", ran {sched[0] / 1e9:.2f} s, waited {sched[1] / 1e9:.2f} s"
        parts.append(f"{line}, {stat['majflt']} major faults")
    argv = [str(Path(sys.executable).with_name("py-spy")), "dump", "--pid", str(pid)]
    try:
        dump = subprocess.run(argv + ([] if blocking else ["--nonblocking"]), capture_output=True, text=True,
                              timeout=30, check=False)
        parts.append(dump.stdout + dump.stderr)
    except (OSError, subprocess.TimeoutExpired) as exc:
        parts.append(f"py-spy dump failed: {exc}")
    return "\n".join(parts) + "\n"
