"""What the attach's cost record says about the host: the time its own work waited for a CPU.

``attach-cost.json``'s ``started_wait_s`` and ``after_wait_s`` are the kernel's run-queue delay of the
attach's main thread (``/proc/thread-self/schedstat``): on a saturated host the attach's work outside its
window takes longer in wall time, and this is how much of that was the host's. Proven here with a real
neighbour that never sleeps, on the same CPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from diagnose import attach

pytestmark = pytest.mark.integration


def test_the_wait_for_a_cpu_is_what_a_busy_neighbour_costs_the_thread() -> None:
    """``_waited`` reads the kernel's run-queue delay of the calling thread: sharing one CPU with a process
    that never sleeps, a thread that spins for 0.6 s of wall time waits for about half of it."""
    cpu = min(os.sched_getaffinity(0))
    before_affinity = os.sched_getaffinity(0)
    hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        os.sched_setaffinity(0, {cpu})  # this thread only (pid 0 is the calling thread)
        time.sleep(0.3)  # the hog is running on that CPU
        start = attach._waited()
        assert start is not None
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.6:
            pass
        waited = attach._waited()
        assert waited is not None
        assert 0.1 < waited - start < 0.6
    finally:
        os.sched_setaffinity(0, before_affinity)
        hog.kill()
        hog.wait()


def test_a_start_that_was_blocked_is_told_from_its_cpu_and_its_wait() -> None:
    """``imports_cost`` splits a process's life before the attach into its CPU, its run-queue wait and the rest,
    the time its main thread was blocked (an import blocks only on the disk): a process that sleeps 0.5 s before
    asking is blocked that long, and spends no CPU on it."""
    code = ("import json, time\nt0 = time.process_time()\nwhile time.process_time() - t0 < 0.2: pass\n"
            "time.sleep(0.5)\nfrom diagnose.attach import imports_cost\nprint(json.dumps(imports_cost()))")
    cost = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                     timeout=60).stdout)
    # (the start time is the kernel's, to its 10 ms tick; the spin is 0.2 s of CPU, however long a busy host
    # makes it wait for one: that wait is not blocked time)
    assert 0.5 - 0.02 <= cost["imports_blocked_s"] <= cost["imports_s"] - cost["imports_cpu_s"] + 0.002, cost
    assert cost["imports_cpu_s"] >= 0.2 and cost["imports_wait_s"] >= 0.0, cost
