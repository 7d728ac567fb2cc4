from __future__ import annotations

import pytest

from diagnose.derive.process import derive


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
