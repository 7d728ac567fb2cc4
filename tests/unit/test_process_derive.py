from __future__ import annotations

import pytest

from diagnose.derive.process import derive, polling


def _sample(ts: float, cpu: float, threads: list[list], inflight: int, invol: int = 0) -> dict:
    return {"ts": ts, "loadavg": [0, 0, 0],
            "conn": {"listen_ports": [8000], "established": inflight, "accept_queue": 0, "inflight": inflight},
            "processes": [{"pid": 10, "ppid": 1, "name": "python", "cpu_user": cpu, "cpu_system": 0.0,
                           "rss": 100 << 20, "num_threads": len(threads), "ctx_voluntary": 0,
                           "ctx_involuntary": invol, "threads": threads}]}


def test_oversubscribed_threads_and_runqueue_wait() -> None:
    # 8 threads each running 1 s and waiting 1 s in the run queue over 2 s
    a = _sample(0.0, 0.0, [[t, 0.0, 0.0, 0, 0] for t in range(8)], 2)
    b = _sample(2.0, 4.0, [[t, 0.5, 0.0, 10**9, 10**9] for t in range(8)], 6, invol=4000)
    ev = {e.key: e.value for e in derive([a, b], {"cores": 2})}
    assert ev["host.cores"] == 2
    assert ev["threads.busy_count"] == 8
    assert ev["proc.runqueue_wait_ratio"] == 0.5
    assert ev["proc.cpu_cores_used"] == 2.0
    assert ev["proc.involuntary_switches_per_s"] == 2000
    assert ev["conn.inflight_mean"] == 4.0 and ev["conn.inflight_max"] == 6


def test_no_listening_socket_means_no_inflight_evidence() -> None:
    a = _sample(0.0, 0.0, [], 0)
    a["conn"] = {"listen_ports": [], "established": 0, "accept_queue": 0, "inflight": 0}
    ev = {e.key for e in derive([a], {"cores": 4})}
    assert "conn.inflight_mean" not in ev and "host.cores" in ev


def test_compile_evidence_from_info() -> None:
    ev = {e.key: e.value for e in derive([], {"cores": 1, "compiled_modules_loaded": 3},
                                         cache_files=(10, 25))}
    assert ev["compile.modules_loaded"] == 3
    assert ev["compile.cache_files_added"] == 15


def _proc(pid: int, name: str, cpu: float, ppid: int = 10, children: float = 0.0, start: int = 1, **extra) -> dict:
    return {"pid": pid, "ppid": ppid, "name": name, "cpu_user": cpu, "cpu_system": 0.0, "children_user": children,
            "children_system": 0.0, "rss": 1 << 20, "num_threads": 1, "start_ticks": start, **extra}


def _rec(ts: float, procs: list[dict], full: bool = False) -> dict:
    rec = {"ts": ts, "loadavg": [0, 0, 0], "conn": {"listen_ports": [], "inflight": 0}, "processes": procs}
    if full:
        rec["full"] = True
        for p in procs:
            p.setdefault("threads", [[p["pid"], p["cpu_user"], 0.0, int(p["cpu_user"] * 1e9), 0]])
            p.setdefault("ctx_voluntary", 0)
            p.setdefault("ctx_involuntary", 0)
    return rec


def test_light_samples_carry_cpu_and_full_ones_the_threads() -> None:
    samples = [_rec(0.0, [_proc(10, "python", 0.0)], full=True), _rec(1.0, [_proc(10, "python", 0.9)]),
               _rec(2.0, [_proc(10, "python", 1.8)], full=True)]
    ev = {e.key: e.value for e in derive(samples, {"cores": 2})}
    assert ev["proc.cpu_cores_used"] == 0.9 and ev["threads.busy_count"] == 1
    assert "proc.involuntary_switches_per_s" in ev


def test_compiler_children_count_as_compilation_once() -> None:
    """g++ 1 exits mid-window (its CPU and its cc1plus's reach the service's children_* when reaped);
    g++ 2 still runs at the end (its own and its reaped children's CPU since it began count); a
    compile worker that ran before the window counts only what it used in it."""
    svc = 10
    samples = [
        _rec(0.0, [_proc(svc, "python", 1.0), _proc(20, "g++", 0.1, ppid=svc, start=5),
                   _proc(21, "cc1plus", 0.4, ppid=20, start=5),
                   _proc(30, "python", 5.0, ppid=svc, start=2, hint="python -m torch._inductor.compile_worker")],
             full=True),
        _rec(1.0, [_proc(svc, "python", 1.2, children=0.0), _proc(20, "g++", 0.1, ppid=svc, start=5),
                   _proc(21, "cc1plus", 1.1, ppid=20, start=5), _proc(30, "python", 5.5, ppid=svc, start=2)]),
        _rec(2.0, [_proc(svc, "python", 1.4, children=1.3),  # g++ reaped: 0.1 own + 1.2 of its cc1plus
                   _proc(22, "g++", 0.05, ppid=svc, start=9, children=0.5),
                   _proc(30, "python", 6.0, ppid=svc, start=2)], full=True),
    ]
    ev = {e.key: e.value for e in derive(samples, {"cores": 2})}
    assert ev["compile.children_seen"] == 4
    assert ev["compile.children_cpu_s"] == pytest.approx(1.3 + 0.55 + 1.0)
    assert ev["compile.children_cores"] == pytest.approx(2.85 / 2.0)


def test_a_compile_still_running_counts_the_cc1plus_under_its_driver() -> None:
    """The window ends while inductor builds: the g++ driver has used next to nothing itself and reaped
    nothing yet; the cc1plus under it did the work (the CI failure of this stop: 4 compilers seen,
    0.0 s counted, as only the top compiler's own CPU was read)."""
    svc = 10
    samples = [
        _rec(0.0, [_proc(svc, "python", 1.0)], full=True),
        _rec(1.0, [_proc(svc, "python", 1.1), _proc(20, "g++", 0.0, ppid=svc, start=7),
                   _proc(21, "cc1plus", 0.6, ppid=20, start=7)]),
        _rec(2.0, [_proc(svc, "python", 1.2), _proc(20, "g++", 0.01, ppid=svc, start=7),
                   _proc(21, "cc1plus", 1.5, ppid=20, start=7), _proc(23, "as", 0.0, ppid=20, start=8)],
             full=True),
    ]
    ev = {e.key: e.value for e in derive(samples, {"cores": 2})}
    assert ev["compile.children_seen"] == 3
    assert ev["compile.children_cpu_s"] == pytest.approx(0.01 + 1.5)


def test_in_flight_uncertainty_grows_with_the_spread_between_sub_windows() -> None:
    steady = [_rec(float(i), [_proc(10, "python", 0.0)]) for i in range(16)]
    for s in steady:
        s["conn"] = {"listen_ports": [8000], "inflight": 4, "accept_queue": 0}
    wobbly = [dict(s, conn={"listen_ports": [8000], "inflight": 2 if i < 8 else 6, "accept_queue": 0})
              for i, s in enumerate(steady)]
    a = {e.key: e.value for e in derive(steady, {"cores": 2})}
    b = {e.key: e.value for e in derive(wobbly, {"cores": 2})}
    assert a["conn.inflight_mean"] == b["conn.inflight_mean"] == 4.0
    assert a["conn.inflight_mean.stderr"] == 0.0 < b["conn.inflight_mean.stderr"]


def _profile(tid: int, samples: int, waiting: float, name: str = "MainThread", pid: int | None = None) -> dict:
    rest = round(1.0 - waiting, 4)
    return {"pid": tid if pid is None else pid, "tid": tid, "name": name, "samples": samples,
            "shares": {"waiting": waiting, **({"forward": rest} if rest else {})}}


def test_polling_is_split_from_work_by_the_threads_own_samples() -> None:
    """A spinner (runnable all the time, 90 % of 200 on-CPU samples in waiting frames), a compute thread (no
    waiting) and a thread py-spy does not see (an OpenMP pool thread): only the spinner's polling is left out,
    at the lower bound of its share's interval."""
    demand = [{"pid": 1, "tid": 1, "run": 0.6, "wait": 0.4}, {"pid": 2, "tid": 2, "run": 0.7, "wait": 0.3},
              {"pid": 2, "tid": 3, "run": 0.5, "wait": 0.2}]
    ev = {e.key: e for e in polling(demand, [_profile(1, 200, 0.9), _profile(2, 200, 0.0)], 2.7, 3)}
    spun = ev["threads.polling_runnable"].value
    assert 0.84 < spun < 0.9  # the Wilson lower bound of 90 % of 200 is 85 %
    assert ev["threads.work_runnable_mean"].value == pytest.approx(2.7 - spun, abs=1e-4)
    assert ev["threads.work_busy_count"].value == 3  # the spinner still has ~0.15 of work
    assert [(r["pid"], r["tid"], r["name"]) for r in ev["threads.polling"].value] == [(1, 1, "MainThread")]
    # the same thread id in another process is another thread: nothing joins
    other = {e.key: e.value for e in polling(demand, [_profile(1, 200, 0.9, pid=7)], 2.7, 3)}
    assert other["threads.polling_runnable"] == 0 and other["threads.polling"] == []


def test_busy_threads_beyond_the_tables_rows_keep_counting() -> None:
    """192 busy pool threads (4 workers × 48 OpenMP threads) with 64 rows in the table: the work's busy count
    is the raw count less the threads busy only by polling, never capped at the rows."""
    demand = [{"pid": 1, "tid": 1, "run": 0.05, "wait": 0.9}] + [
        {"pid": 1, "tid": t, "run": 0.2, "wait": 0.7} for t in range(2, 65)]
    ev = {e.key: e.value for e in polling(demand, [_profile(1, 400, 1.0)], 180.0, 192)}
    assert ev["threads.work_busy_count"] == 191


def test_a_thin_on_cpu_profile_discounts_nothing_and_the_wall_clock_view_bounds_the_work() -> None:
    """3 on-CPU samples say nothing; 35 wall-clock ticks over the whole window, all in waiting frames, say the
    thread's work is at most ~10 % of it (the interval's upper bound), so the rest of its 0.86 runnable is
    polling. Ticks that saw only half the window bound nothing in the other half."""
    demand = [{"pid": 1, "tid": 1, "run": 0.64, "wait": 0.22}]
    alone = {e.key: e.value for e in polling(demand, [_profile(1, 3, 1.0)], 0.86, 1, window_s=30.0)}
    assert alone["threads.polling_runnable"] == 0 and alone["threads.work_busy_count"] == 1
    ticks = [{"pid": 1, "tid": 1, "samples": 35, "seconds": 30.0, "waiting": 1.0}]
    both = {e.key: e.value for e in polling(demand, [_profile(1, 3, 1.0)], 0.86, 1, ticks, window_s=30.0)}
    assert 0.75 < both["threads.polling_runnable"] < 0.78
    assert both["threads.work_busy_count"] == 0
    half = [{"pid": 1, "tid": 1, "samples": 35, "seconds": 15.0, "waiting": 1.0}]
    part = {e.key: e.value for e in polling(demand, [_profile(1, 3, 1.0)], 0.86, 1, half, window_s=30.0)}
    assert 0.25 < part["threads.polling_runnable"] < 0.32  # work ≤ 0.099 × 15 s + 15 s unseen = 0.55 of 30 s
    # a thread blocked half the time that computes when it runs: its runnable half is all work
    worker = [{"pid": 1, "tid": 1, "run": 0.4, "wait": 0.1}]
    blocked = [{"pid": 1, "tid": 1, "samples": 400, "seconds": 30.0, "waiting": 0.5}]
    assert {e.key: e.value for e in polling(worker, [], 0.5, 1, blocked, window_s=30.0)}[
        "threads.polling_runnable"] == 0
