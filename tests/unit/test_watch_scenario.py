"""The watch scenario's measure of the time the host held the watcher back (tests/watch_scenario.py), which its
deadlines forgive: only a thread that waited for a CPU or the disk across a whole interval counts."""

from __future__ import annotations

import os
import threading
import time

from tests import watch_scenario


def test_a_thread_runnable_at_both_readings_that_did_not_run_was_held_back() -> None:
    before = {11: ("R", 5_000), 12: ("S", 900)}
    assert watch_scenario.held_between(before, {11: ("R", 5_000), 12: ("S", 900)})  # queued all along
    assert not watch_scenario.held_between(before, {11: ("R", 9_000), 12: ("S", 900)})  # it ran in between
    assert not watch_scenario.held_between(before, {11: ("S", 5_000), 12: ("S", 900)})  # asleep: its own wait
    assert watch_scenario.held_between({11: ("D", 1)}, {11: ("D", 7)})  # waiting for the disk at both
    assert not watch_scenario.held_between({11: ("D", 1)}, {12: ("D", 7)})  # a thread born since: not at both
    assert not watch_scenario.held_between({}, {})


def test_the_thread_states_are_read_from_proc() -> None:
    """This process's threads: a sleeping one reads S with a run time that does not move."""
    sleeper = threading.Thread(target=time.sleep, args=(2.0,), daemon=True)
    sleeper.start()
    time.sleep(0.1)
    states = watch_scenario._thread_states(os.getpid())
    assert states[threading.get_native_id()][0] == "R"  # the reader itself runs
    assert sleeper.native_id is not None and states[sleeper.native_id][0] == "S"
    again = watch_scenario._thread_states(os.getpid())
    assert again[sleeper.native_id] == states[sleeper.native_id]
    assert watch_scenario._thread_states(None) == {}
