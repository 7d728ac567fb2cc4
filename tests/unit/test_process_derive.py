from __future__ import annotations

from analyzer.derive.process import derive


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
