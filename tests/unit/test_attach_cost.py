"""The host's shares of an attach's cost record that the live tests forgive (tests/attach_cost.py): only what
the kernel measured for that interval, each phase's at most its length, and the machine's disk stalls only when
the attach itself had major faults meanwhile."""

from __future__ import annotations

import pytest

from tests import attach_cost


def test_the_stop_is_forgiven_the_most_one_thread_waited_the_steal_and_the_stalls_up_to_its_length() -> None:
    cost = {"stop_s": 20.0, "stop_wait_s": 0.5, "stop_threads_wait_s": 11.0, "stop_steal_s": 0.25,
            "stop_stall_s": 1.0, "stop_majflt": 3}
    assert attach_cost.window_share(cost) == pytest.approx(12.25)
    # a stop of 20 s (sources stopping one after another) is not forgiven more than it lasted, whatever the
    # machine-wide readings say
    assert attach_cost.window_share({**cost, "stop_threads_wait_s": 30.0, "stop_s": 20.0}) == 20.0
    # the machine stalled on the disk, the attach had no fault of its own: not its wait
    assert attach_cost.window_share({**cost, "stop_majflt": 0}) == pytest.approx(11.25)


def test_a_late_wait_is_forgiven_what_the_host_took_over_it_never_more_than_it_was_late() -> None:
    # CI of 6746426: the wait ended 8 s late; had the attach faulted while the machine stalled 9 s, 8 s is the host's
    assert attach_cost.window_share({"late_s": 8.0, "late_wait_s": 0.1, "late_stall_s": 9.0,
                                     "late_majflt": 40}) == pytest.approx(8.0)
    # the steal is the whole window's (not read per wait)
    assert attach_cost.window_share({"late_s": 8.0, "late_threads_wait_s": 3.0, "steal_s": 1.0}) == 4.0
    # late, and the host took nothing from it: the attach's own (a source holding the GIL), not forgiven
    assert attach_cost.window_share({"late_s": 8.0, "late_wait_s": 0.0, "late_stall_s": 0.0}) == 0.0
    assert attach_cost.window_share({"late_s": 8.0, "late_stall_s": 9.0, "late_majflt": 0}) == 0.0
    # a record from before the late readings: nothing forgiven
    assert attach_cost.window_share({"window_s": 38.0}) == 0.0


def test_outside_the_window_each_phase_is_forgiven_its_waits_steal_and_stalls_up_to_its_length() -> None:
    cost = {"started_s": 10.0, "started_wait_s": 1.0, "setup_steal_s": 0.5, "setup_stall_s": 3.0, "setup_majflt": 1,
            "after_s": 30.0, "after_wait_s": 2.0, "after_steal_s": 0.25, "after_stall_s": 4.0, "after_majflt": 2,
            "stop_steal_s": 100.0, "after_cpu_s": 50.0}
    assert attach_cost.outside_share(cost) == pytest.approx(10.75)  # the stop's is the window's, CPU the attach's
    assert attach_cost.outside_share({**cost, "started_s": 2.0, "after_s": 3.0}) == pytest.approx(5.0)
    assert attach_cost.outside_share({**cost, "setup_majflt": 0, "after_majflt": 0}) == pytest.approx(3.75)


def test_a_start_blocked_on_the_disk_is_the_hosts_one_that_read_nothing_is_the_attachs() -> None:
    # CI 2026-12-05 (kv_pressure): 37.4 s from the attach's start to its window, 6.6 s of it a wait for a CPU
    cost = {"started_s": 37.4, "setup_s": 2.7, "started_wait_s": 6.6, "imports_s": 34.7, "imports_cpu_s": 3.0,
            "imports_wait_s": 6.5, "imports_blocked_s": 25.2, "imports_majflt": 310, "imports_inblock": 90000}
    assert attach_cost.outside_share(cost) == pytest.approx(31.8)  # 46 MB read: 46 s at the slowest disk
    # blocked without a read from storage (asleep, a lock, a subprocess): the attach's own
    assert attach_cost.outside_share({**cost, "imports_inblock": 0}) == pytest.approx(6.6)
    # a few reads explain a little of it, not all: 32 blocks (16 KiB) are 0.016 s at 1 MB/s
    assert attach_cost.outside_share({**cost, "imports_inblock": 32}) == pytest.approx(6.6 + 0.016384)
    # never more than the start took
    assert attach_cost.outside_share({**cost, "imports_blocked_s": 40.0}) == pytest.approx(37.4)
