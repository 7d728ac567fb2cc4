"""The host's shares of an attach's cost record that the live tests forgive (tests/attach_cost.py): only what
the kernel measured for that interval, and a late end of the wait no more than it was late."""

from __future__ import annotations

import pytest

from tests import attach_cost


def test_the_stop_is_forgiven_the_most_one_thread_waited_the_steal_and_the_stalls() -> None:
    cost = {"stop_wait_s": 0.5, "stop_threads_wait_s": 11.0, "stop_steal_s": 0.25, "stop_stall_s": 1.0}
    assert attach_cost.window_share(cost) == pytest.approx(12.25)


def test_a_late_wait_is_forgiven_what_the_host_took_over_it_never_more_than_it_was_late() -> None:
    # CI of 6746426: the wait ended 8 s late; had the machine stalled 9 s on the disk meanwhile, 8 s is the host's
    assert attach_cost.window_share({"late_s": 8.0, "late_wait_s": 0.1, "late_stall_s": 9.0}) == pytest.approx(8.0)
    assert attach_cost.window_share({"late_s": 8.0, "late_threads_wait_s": 3.0, "late_steal_s": 1.0}) == 4.0
    # late, and the host took nothing from it: the attach's own (a source holding the GIL), not forgiven
    assert attach_cost.window_share({"late_s": 8.0, "late_wait_s": 0.0, "late_stall_s": 0.0}) == 0.0
    # a record from before the late readings: nothing forgiven
    assert attach_cost.window_share({"window_s": 38.0}) == 0.0


def test_outside_the_window_the_threads_waits_the_steal_and_the_stalls_of_each_phase_are_the_hosts() -> None:
    cost = {"started_wait_s": 1.0, "after_wait_s": 2.0, "setup_steal_s": 0.5, "after_steal_s": 0.25,
            "setup_stall_s": 3.0, "after_stall_s": 4.0, "stop_steal_s": 100.0, "after_cpu_s": 50.0}
    assert attach_cost.outside_share(cost) == pytest.approx(10.75)  # the stop's is the window's, CPU is the attach's
