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


def test_idle_processes_get_only_a_coarse_view_and_busy_ones_a_profile() -> None:
    got = _by_pid(budget.plan(LITSERVE, 10.0))
    assert {d.pid for d in budget.sampled(list(got.values()))} == {1, 2, 3, 4, 5}  # every Python process is seen
    assert got[4].cpu_rate_hz == 40 and got[4].wall_rate_hz == budget.WALL_RATE_HZ  # 400 samples / 1 thread / 10 s
    assert got[5].cpu_rate_hz > 0 and "serves requests" in got[5].why
    for idle in (1, 2, 3):  # the launcher, the manager and the resource tracker: one stack a second, no profile
        assert (got[idle].cpu_rate_hz, got[idle].wall_rate_hz, got[idle].coarse) == (0, budget.COVER_RATE_HZ, True)
        assert "idle and serves no requests, a coarse wall-clock view at 4 Hz" in got[idle].why


def test_every_process_of_a_vllm_v1_tree_is_sampled() -> None:
    """vLLM V1 under load, as attached on the 2-core lab host (tests/data/engines/vllm/healthy): the API
    server (serves, 12 threads), the EngineCore (15) and the model worker (46) all busy, and the
    multiprocessing resource tracker idle. None is left out: the worker gets the budget's on-CPU profile,
    the EngineCore and the API server a floor, the API server's request threads the wall-clock view."""
    tree = [Observation(6203, True, 0.15, 1, 12, True), Observation(6316, True, 0.0, 0, 1, False),
            Observation(6317, True, 0.67, 1, 15, False), Observation(6346, True, 0.85, 1, 46, False)]
    got = _by_pid(budget.plan(tree, 30.0))
    assert {d.pid for d in budget.sampled(list(got.values()))} == {6203, 6316, 6317, 6346}
    assert got[6203].wall_rate_hz == budget.WALL_RATE_HZ  # request threads first for the wall clock
    assert got[6346].cpu_rate_hz >= budget.MIN_RATE_HZ
    for floor in (6203, 6317):
        assert budget.MIN_FLOOR_RATE_HZ <= got[floor].cpu_rate_hz <= budget.FLOOR_RATE_HZ
        assert "the floor: over the budget" in got[floor].why
    assert got[6316].wall_rate_hz == budget.COVER_RATE_HZ and got[6316].cpu_rate_hz == 0 and got[6316].coarse
    assert not any(got[p].coarse for p in (6203, 6317, 6346))  # their views are evidence
    reads = sum((got[o.pid].cpu_rate_hz + got[o.pid].wall_rate_hz) * o.threads for o in tree)
    assert reads <= budget.CEILING_READS_PER_S + budget.COVER_READS_PER_S


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
    """Twelve busy workers of 20 threads: the busiest is profiled at the budget's rate, the next ones at
    the floor, some get a coarse view, the rest are left out and say why; the ceilings are kept."""
    many = [Observation(p, True, 0.8 - p / 100, 2, 20, True) for p in range(10, 22)]
    got = budget.plan(many, 10.0)
    sampled = budget.sampled(got)
    assert sampled[0].pid == 10 and sampled[0].cpu_rate_hz >= budget.MIN_RATE_HZ
    floors = [d for d in sampled if "the floor" in d.why]
    assert len(floors) == budget.FLOOR_MAX_PROCESSES
    assert all(budget.MIN_FLOOR_RATE_HZ <= d.cpu_rate_hz <= budget.FLOOR_RATE_HZ for d in floors)
    coarse = [d for d in sampled if "coarse" in d.why]
    assert coarse and all(d.wall_rate_hz == budget.COVER_RATE_HZ and not d.cpu_rate_hz and d.coarse for d in coarse)
    left = [d for d in got if d not in sampled]
    assert left and all("not sampled (over the coverage limit" in d.why for d in left)
    reads = sum((d.cpu_rate_hz + d.wall_rate_hz) * 20 for d in got)
    assert reads <= (budget.STACK_READS_PER_S + budget.MIN_RATE_HZ * 20  # the busiest one's minimum may overshoot
                     + budget.FLOOR_MAX_PROCESSES * budget.FLOOR_RATE_HZ * 20 + budget.COVER_READS_PER_S)


def test_light_mode_samples_only_the_busiest_and_the_main_server() -> None:
    got = _by_pid(budget.sampled(budget.plan(LITSERVE, 10.0, light=True)))
    assert set(got) == {4, 5}
    assert all("--light samples the busiest" in d.why for d in budget.plan(LITSERVE, 10.0, light=True)
               if d.pid not in got)
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
    assert [(d.pid, d.cpu_rate_hz > 0, d.wall_rate_hz > 0) for d in got] == [(1, True, True), (2, False, True)]
