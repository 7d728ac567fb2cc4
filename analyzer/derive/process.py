"""psutil samples → evidence: CPU per process, threads against cores, scheduling, in-flight requests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from analyzer.model import Evidence, Quality, Window

SOURCE = "psutil"
BUSY_OS_THREAD = 0.10  # a thread runnable ≥ 10 % of the window is busy (torch/OpenMP pools included)


def _index(rec: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    return {int(p["pid"]): p for p in rec.get("processes", ())}


def derive(
    samples: Sequence[Mapping[str, Any]],
    info: Mapping[str, Any],
    *,
    window: Window | None = None,
    partial: bool = False,
    cache_files: tuple[int | None, int | None] = (None, None),
) -> list[Evidence]:
    quality = Quality.PARTIAL if partial else Quality.GOOD

    def ev(key: str, value: object, unit: str, detail: str = "") -> Evidence:
        return Evidence(key, value, unit, SOURCE, window, quality, detail)

    out: list[Evidence] = []
    cores = int(info.get("cores") or 0)
    if cores:
        out.append(ev("host.cores", cores, "cores", "CPUs the target may run on (affinity)"))
    if cache_files[0] is not None and cache_files[1] is not None:
        out.append(ev("compile.cache_files_added", max(0, cache_files[1] - cache_files[0]), "files",
                      "files added to the torch inductor cache during the window"))
    loaded = info.get("compiled_modules_loaded")
    if isinstance(loaded, int):
        out.append(ev("compile.modules_loaded", loaded, "modules",
                      "compiled-graph shared objects (inductor kernels) newly mapped during the window"))
    if not samples:
        return out
    loads = [float(s["loadavg"][0]) for s in samples if s.get("loadavg")]
    if loads:
        out.append(ev("host.load_1m", max(loads), "runnable", "the host's 1-minute load average (all processes)"))
    inflight = [int(s.get("conn", {}).get("inflight", 0)) for s in samples]
    listen = sorted({p for s in samples for p in s.get("conn", {}).get("listen_ports", ())})
    if listen:
        out.append(ev("conn.inflight_mean", sum(inflight) / len(inflight), "requests",
                      f"accepted connections + accept queue on port(s) {', '.join(map(str, listen))}"))
        out.append(ev("conn.inflight_max", max(inflight), "requests"))
        out.append(ev("conn.accept_queue_max", max(int(s["conn"].get("accept_queue", 0)) for s in samples),
                      "requests"))
    out.append(ev("proc.processes", max(len(s.get("processes", ())) for s in samples), "processes"))
    out.append(ev("proc.threads", max(sum(int(p.get("num_threads", 0)) for p in s.get("processes", ()))
                                      for s in samples), "threads"))
    out.append(ev("proc.rss_bytes", max(sum(int(p.get("rss", 0)) for p in s.get("processes", ()))
                                        for s in samples), "bytes"))
    if len(samples) < 2:
        return out
    first, last = samples[0], samples[-1]
    wall = float(last["ts"]) - float(first["ts"])
    if wall <= 0:
        return out
    a, b = _index(first), _index(last)
    both = [pid for pid in b if pid in a]
    cpu_s = sum((b[p]["cpu_user"] + b[p]["cpu_system"]) - (a[p]["cpu_user"] + a[p]["cpu_system"]) for p in both)
    out.append(ev("proc.cpu_cores_used", max(0.0, cpu_s) / wall, "cores"))
    per_proc = [
        {"pid": p, "name": b[p].get("name", ""),
         "cpu_cores": round(((b[p]["cpu_user"] + b[p]["cpu_system"]) - (a[p]["cpu_user"] + a[p]["cpu_system"]))
                            / wall, 3),
         "threads": b[p].get("num_threads", 0), "rss_bytes": b[p].get("rss", 0)}
        for p in both
    ]
    out.append(ev("proc.per_process", sorted(per_proc, key=lambda r: -r["cpu_cores"]), "table"))
    invol = sum(b[p]["ctx_involuntary"] - a[p]["ctx_involuntary"] for p in both)
    vol = sum(b[p]["ctx_voluntary"] - a[p]["ctx_voluntary"] for p in both)
    out.append(ev("proc.involuntary_switches_per_s", max(0, invol) / wall, "1/s"))
    out.append(ev("proc.voluntary_switches_per_s", max(0, vol) / wall, "1/s"))

    busy = 0
    run_total = wait_total = 0
    have_sched = False
    for p in both:
        ta = {int(t[0]): t for t in a[p].get("threads", ())}
        for t in b[p].get("threads", ()):
            old = ta.get(int(t[0]))
            if old is None:
                continue
            if len(t) >= 5 and t[3] is not None and old[3] is not None:
                have_sched = True
                run = max(0, int(t[3]) - int(old[3]))
                wait = max(0, int(t[4]) - int(old[4]))
                run_total += run
                wait_total += wait
                # demand, not consumption: an oversubscribed thread runs little but is runnable long
                wanted = (run + wait) / 1e9
            else:
                wanted = (t[1] + t[2]) - (old[1] + old[2])
            if wanted / wall >= BUSY_OS_THREAD:
                busy += 1
    out.append(ev("threads.busy_count", busy, "threads",
                  f"OS threads runnable (running or waiting for a CPU) ≥ {BUSY_OS_THREAD:.0%} of the window"))
    if have_sched and run_total + wait_total > 0:
        out.append(ev("threads.runnable_mean", (run_total + wait_total) / 1e9 / wall, "threads",
                      "threads wanting a CPU on average (run + run-queue wait, from schedstat)"))
        out.append(ev("proc.runqueue_wait_ratio", wait_total / (run_total + wait_total), "ratio",
                      "time runnable threads waited for a CPU / (run + wait), from schedstat"))
    return out
