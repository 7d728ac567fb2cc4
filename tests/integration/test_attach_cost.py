"""What the attach's cost record says about the host: the time its own work waited for a CPU.

``attach-cost.json``'s ``started_wait_s`` and ``after_wait_s`` are the kernel's run-queue delay of the
attach's main thread (``/proc/thread-self/schedstat``): on a saturated host the attach's work outside its
window takes longer in wall time, and this is how much of that was the host's. Proven here with a real
neighbour that never sleeps, on the same CPU.
"""

from __future__ import annotations

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
