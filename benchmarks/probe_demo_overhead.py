#!/usr/bin/env python3
"""What the in-process probe costs the demo service: with and without `--stage-log` (the probe).

Alternates (ABBA) runs of the same demo pathology with the probe installed and without, drives the
same closed-loop load, and compares the service's throughput and its CPU time per request (psutil,
the service process tree), which is far less noisy than throughput on a shared machine.

usage: benchmarks/probe_demo_overhead.py [--pathology healthy] [--window 10] [--pairs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diagnose.examples.demo import PATHOLOGIES, DemoService
from diagnose.examples.loadgen import run_load


def _cpu(pid: int) -> float:
    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    return sum(p.cpu_times().user + p.cpu_times().system for p in procs)


def one_run(pathology: str, window: float, probe: bool, tmp: str) -> tuple[float, float]:
    spec = PATHOLOGIES[pathology]
    extra = ["--stage-log", os.path.join(tmp, f"stages-{os.getpid()}.jsonl")] if probe else []
    with DemoService(pathology, extra_args=extra) as svc:
        run_load(svc.url, spec.name, spec.concurrency, 2.0, spec.think_s)  # warm-up
        before = _cpu(svc.pid)
        res = run_load(svc.url, spec.name, spec.concurrency, window, spec.think_s)
        cpu = _cpu(svc.pid) - before
    return res.throughput_rps, 1000.0 * cpu / max(1, res.requests)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pathology", default="queueing")
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    rps: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for probe in (False, True) if i % 2 == 0 else (True, False):
                r, c = one_run(args.pathology, args.window, probe, tmp)
                rps[probe].append(r)
                cpu[probe].append(c)
            print(f"pair {i + 1}: without {rps[False][-1]:.2f} req/s {cpu[False][-1]:.2f} CPU-ms/req, "
                  f"with probe {rps[True][-1]:.2f} req/s {cpu[True][-1]:.2f} CPU-ms/req", flush=True)
    ratio = statistics.mean(rps[True]) / statistics.mean(rps[False])
    cpu_ratio = statistics.mean(cpu[True]) / statistics.mean(cpu[False])
    print(f"pathology={args.pathology} window={args.window:.0f}s pairs={args.pairs}")
    print(f"throughput with / without probe = {ratio:.3f}; CPU per request with / without = {cpu_ratio:.3f} "
          f"(probe cost {100 * (cpu_ratio - 1):+.1f} % CPU per request)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
