"""What the host took from an attach, read from its cost record (``attach-cost.json``, written by
``diagnose.attach``): the live tests bound the attach's window and its wall time less these, so that a host short
of CPU, or one that pages the attach's code back in from a slow disk, is told apart from the attach's own work.

Each share is a measurement the kernel gave for that interval (``attach.HostMark.since``): a thread's run-queue
delay, the most any thread of the attach waited, the hypervisor's steal, the machine's stalls on the disk and
memory (PSI). Where the kernel gave none, nothing is forgiven."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from diagnose.collectors import process as process_collector


def _phase(cost: Mapping[str, float], phase: str) -> float:
    """The host's share of one phase the attach's thread waited through: the most its thread, or a thread whose
    GIL it needed, waited for a CPU, plus the steal and the machine's stalls meanwhile."""
    waited = max(cost.get(f"{phase}_wait_s", 0.0), cost.get(f"{phase}_threads_wait_s", 0.0))
    return waited + cost.get(f"{phase}_steal_s", 0.0) + cost.get(f"{phase}_stall_s", 0.0)


def window_share(cost: Mapping[str, float]) -> float:
    """Seconds of the window that were the host's: its share of the stop, and of the wait's late end, never more
    than that end was late (``late_s``). The wait itself is on the clock: a host that took time from it earlier
    ends it no later."""
    return _phase(cost, "stop") + min(cost.get("late_s", 0.0), _phase(cost, "late"))


def outside_share(cost: Mapping[str, float]) -> float:
    """Seconds of the attach's wall time outside its window that were the host's: its thread's run-queue wait from
    its start to the window and after it, the steal and the machine's stalls in its setup and after the window."""
    keys = ("started_wait_s", "after_wait_s", "setup_steal_s", "after_steal_s", "setup_stall_s", "after_stall_s")
    return sum(cost.get(k, 0.0) for k in keys)


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
