"""Where the attach spends its profiling budget (collectors/budget.py): pure decisions from observations."""

from __future__ import annotations

from diagnose.collectors import budget
from diagnose.collectors.budget import Observation


def _by_pid(decisions: list[budget.Decision]) -> dict[int, budget.Decision]:
    return {d.pid: d for d in decisions}


LITSERVE = [  # the embedding service as the sampler saw it: launcher, manager, tracker, worker, API server
    Observation(1, True, 0.0, 0, 2, False),
    Observation(2, True, 0.05, 0, 7, False),
    Observation(3, True, 0.0, 0, 1, False),
    Observation(4, True, 0.9, 1, 2, False),
    Observation(5, True, 0.2, 1, 4, True),
]


def test_idle_processes_are_not_sampled_and_busy_ones_get_a_profile() -> None:
    got = _by_pid(budget.plan(LITSERVE, 10.0))
    assert set(got) == {4, 5}  # the launcher, the manager and the resource tracker cost nothing
    assert got[4].cpu_rate_hz == 40 and got[4].wall_rate_hz == budget.WALL_RATE_HZ  # 400 samples / 1 thread / 10 s
    assert got[5].cpu_rate_hz > 0 and "serves requests" in got[5].why


def test_a_serving_process_that_uses_no_cpu_still_gets_the_wall_clock_view() -> None:
    """Requests waiting on a lock use no CPU: the process that holds their connections is watched anyway."""
    got = budget.plan([Observation(9, True, 0.01, 0, 6, True)], 10.0)
    assert [(d.pid, d.cpu_rate_hz > 0, d.wall_rate_hz) for d in got] == [(9, True, budget.WALL_RATE_HZ)]


def test_the_rate_falls_with_more_busy_threads_and_with_many_threads() -> None:
    assert budget.cpu_rate(1, 4, 10.0, 50) == 40
    assert budget.cpu_rate(4, 8, 10.0, 50) == budget.MIN_RATE_HZ
    assert budget.cpu_rate(1, 4, 2.0, 50) == 50  # a short window: the ceiling
    assert budget.cpu_rate(1, 4, 2.0, 20) == 20  # --rate is the ceiling
    assert budget.wall_rate(1000, light=False) == budget.MIN_WALL_RATE_HZ


def test_stack_reads_stay_within_the_budget() -> None:
    """Six busy workers of 40 threads: the busiest are watched, the rest left out, the budget kept."""
    many = [Observation(p, True, 0.8 - p / 100, 2, 40, True) for p in range(10, 16)]
    got = budget.plan(many, 10.0)
    reads = sum((d.cpu_rate_hz + d.wall_rate_hz) * 40 for d in got)
    assert reads <= budget.STACK_READS_PER_S + budget.MIN_RATE_HZ * 40  # the busiest one's minimum may overshoot
    assert got and got[0].pid == 10 and len(got) < len(many)


def test_light_mode_samples_only_the_busiest_and_the_main_server() -> None:
    got = _by_pid(budget.plan(LITSERVE, 10.0, light=True))
    assert set(got) == {4, 5}
    assert got[4].cpu_rate_hz <= budget.LIGHT_MAX_RATE_HZ and got[5].cpu_rate_hz == 0
    assert got[4].wall_rate_hz == budget.LIGHT_WALL_RATE_HZ
    assert budget.chunks_for(15.0, light=True) == 2


def test_a_process_keeps_its_rates_for_the_whole_window() -> None:
    got = _by_pid(budget.plan(LITSERVE, 10.0, fixed={4: (25, 5)}))
    assert (got[4].cpu_rate_hz, got[4].wall_rate_hz) == (25, 5)


def test_non_python_processes_are_never_sampled() -> None:
    assert budget.plan([Observation(3, False, 1.0, 1, 1, False)], 10.0) == []


def test_an_idle_service_is_still_sampled_so_its_profile_says_nothing_ran() -> None:
    got = budget.plan([Observation(1, True, 0.0, 0, 3, False), Observation(2, True, 0.0, 0, 2, False)], 10.0)
    assert [(d.pid, d.cpu_rate_hz > 0, d.wall_rate_hz > 0) for d in got] == [(1, True, True)]
