#!/usr/bin/env python3
"""What the lab's vLLM engine's throughput does window to window, with nothing attached and with one reader.

``attach_overhead.py --service vllm`` compares windows with and without an attach. On a host the engine
itself oversubscribes, that ratio is only as good as the windows are alike. This script measures the
windows themselves: the engine lab's vLLM (CPU build: API server, EngineCore, worker) under 2 closed-loop
clients, rounds of short windows, one per condition, interleaved (order reversed every other round), and for
each window

* the requests completed per second;
* the CPU each of the engine's three processes used (cores), from psutil, and the context switches of each.

Conditions (``--conditions``, comma-separated): ``plain`` (nothing else runs), ``sleep`` (a process that
only sleeps: the cost of one more process), ``spin`` (a Python process waking twice a second to burn 5 ms:
about 1 % of a core), ``spy`` (one ``py-spy record --nonblocking -r 2`` of the worker: a reader at the
attach's lowest rate). Each is started a second before its window and stopped after it.

It prints every window, then per condition the median throughput and the median of its ratio to the same
round's ``plain`` window, and over the plain windows the spread and how throughput follows the API server's
CPU (Pearson r): what sets the engine's pace on this host.

usage: benchmarks/engine_windows.py [--rounds 8] [--window 6] [--conditions plain,sleep,spin,spy]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import attach_overhead as ao  # the same engine and clients as the attach benchmark

SPIN = "import time\nwhile True:\n    t = time.time()\n    while time.time() - t < 0.005: pass\n    time.sleep(0.5)\n"


def _command(cond: str, worker: int) -> list[str] | None:
    if cond == "plain":
        return None
    if cond == "sleep":
        return ["sleep", "100000"]
    if cond == "spin":
        return [sys.executable, "-c", SPIN]
    if cond == "spy":
        from diagnose.collectors.pyspy import find_pyspy

        exe = find_pyspy()
        if exe is None:
            raise SystemExit("py-spy is not installed in this venv")
        return [exe, "record", "--nonblocking", "-r", "2", "-p", str(worker), "-f", "raw",
                "-o", os.devnull]
    raise SystemExit(f"unknown condition {cond!r}: use plain, sleep, spin or spy")


def _cpu(procs: dict[str, psutil.Process]) -> dict[str, tuple[float, int, int]]:
    out = {}
    for name, p in procs.items():
        t, c = p.cpu_times(), p.num_ctx_switches()
        out[name] = (t.user + t.system, c.voluntary, c.involuntary)
    return out


def _pearson(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--window", type=float, default=6.0, help="seconds per window")
    ap.add_argument("--conditions", default="plain,sleep,spin,spy")
    ap.add_argument("--clients", type=int, default=2)
    a = ap.parse_args(argv)
    conds = [c.strip() for c in a.conditions.split(",") if c.strip()]
    if "plain" not in conds:
        conds.insert(0, "plain")
    with ao.vllm_engine() as svc:
        api = psutil.Process(svc.pid)
        kids = api.children(recursive=True)
        ec = next(p for p in kids if "EngineCore" in p.name())
        wk = next(p for p in kids if "Worker" in p.name() or p.ppid() == ec.pid)
        procs = {"api": api, "enginecore": ec, "worker": wk}
        rows: dict[str, list[dict[str, float]]] = {c: [] for c in conds}
        with ao.Clients(svc, a.clients) as cl:
            time.sleep(8)  # past the first requests
            for rnd in range(a.rounds):
                for cond in (conds if rnd % 2 == 0 else conds[::-1]):
                    cmd = _command(cond, wk.pid)
                    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if cmd else None
                    time.sleep(1.0)
                    s0, t0 = _cpu(procs), time.time()
                    time.sleep(a.window)
                    s1, t1 = _cpu(procs), time.time()
                    if proc is not None:
                        proc.kill()
                        proc.wait()
                    row = {"rps": cl.count(t0, t1) / (t1 - t0)}
                    for name in procs:
                        row[f"{name}_cores"] = (s1[name][0] - s0[name][0]) / (t1 - t0)
                        row[f"{name}_invol_per_s"] = (s1[name][2] - s0[name][2]) / (t1 - t0)
                    rows[cond].append(row)
                    print(f"round {rnd} {cond:6s} {row['rps']:6.1f} req/s  api {row['api_cores']:.2f}  "
                          f"enginecore {row['enginecore_cores']:.2f}  worker {row['worker_cores']:.2f} cores",
                          flush=True)
    plain = [r["rps"] for r in rows["plain"]]
    print(f"\nplain windows: median {statistics.median(plain):.1f} req/s, {min(plain):.1f}-{max(plain):.1f} "
          f"({(max(plain) - min(plain)) / statistics.median(plain):.0%} of the median)")
    r = _pearson([x["api_cores"] for x in rows["plain"]], plain)
    if r is not None:
        print(f"throughput against the API server's cores over the plain windows: r = {r:.2f}")
    r = _pearson([x["enginecore_cores"] for x in rows["plain"]], plain)
    if r is not None:
        print(f"throughput against the EngineCore's cores over the plain windows: r = {r:.2f}")
    for cond in conds:
        ratios = [x["rps"] / p["rps"] for x, p in zip(rows[cond], rows["plain"], strict=True) if p["rps"] > 0]
        print(f"{cond:6s} median {statistics.median(x['rps'] for x in rows[cond]):6.1f} req/s, "
              f"paired ratio to plain {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
