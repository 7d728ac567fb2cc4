"""Cost of the in-process probe on request throughput.

A tight in-process loop serves "requests" that each do a realistic small amount of work (a torch
matmul of about 1 ms on one thread, split into three stages), with and without the probe's
``request`` + three ``stage`` scopes writing the stage-timing JSONL. Runs alternate (plain, probed,
plain, …) so drift hits both equally; the figure is the ratio of the median throughputs.

    .venv/bin/python benchmarks/probe_overhead.py [--requests 2000] [--pairs 7] [--work-ms 1.0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

from diagnose.collectors.torch_probe import Probe


def _calibrate(work_ms: float) -> int:
    """Matrix size whose matmul takes about ``work_ms`` / 3 on this machine (one stage's work)."""
    n = 32
    while n < 2048:
        a = torch.randn(n, n)
        a @ a  # the first call of a size is slow
        per = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(20):
                a @ a
            per = min(per, (time.perf_counter() - t0) / 20 * 1e3)
        if per >= work_ms / 3:
            return n
        n = int(n * 1.15) + 1
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--work-ms", type=float, default=1.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    n = _calibrate(args.work_ms)
    a = torch.randn(n, n)

    def plain() -> None:
        a @ a
        a @ a
        a @ a

    with tempfile.TemporaryDirectory() as tmp:
        probe = Probe(os.path.join(tmp, "stages.jsonl"), announce=False)

        def probed() -> None:
            with probe.request() as req:
                with probe.stage("preprocess"):
                    a @ a
                with probe.stage("prefill"):
                    a @ a
                with probe.stage("decode"):
                    a @ a
                req.set(input_tokens=n, output_tokens=3)

        def run(fn: Callable[[], None]) -> float:
            t0 = time.perf_counter()
            for _ in range(args.requests):
                fn()
            return args.requests / (time.perf_counter() - t0)

        def empty() -> None:
            with probe.request() as req:
                with probe.stage("preprocess"):
                    pass
                with probe.stage("prefill"):
                    pass
                with probe.stage("decode"):
                    pass
                req.set(input_tokens=n, output_tokens=3)

        def cost_us(fn: Callable[[], None], k: int = 20_000) -> float:
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            return (time.perf_counter() - t0) / k * 1e6

        run(plain), run(probed)  # warm-up
        probe.flush()
        base: list[float] = []
        with_probe: list[float] = []
        for i in range(args.pairs):  # ABBA order, and the writer idle at the start of every run
            for fn, out in ((plain, base), (probed, with_probe))[:: 1 if i % 2 == 0 else -1]:
                out.append(run(fn))
                probe.flush()
        probe.close()
        stats = probe.stats()
        # the probe's own cost per request with no work: the least noisy figure on a shared machine
        micro = Probe(os.path.join(tmp, "micro.jsonl"), announce=False, queue_size=100_000)
        probe = micro
        bare: list[float] = []
        for _ in range(5):
            bare.append(cost_us(empty, 10_000) - cost_us(lambda: None, 10_000))
            micro.flush(30)  # the writer's share is counted as it drains (same GIL), not carried over
        bare_us = min(bare)
        micro.close()
    b, p = statistics.median(base), statistics.median(with_probe)
    per_req_us = (1 / p - 1 / b) * 1e6
    best_b, best_p = max(base), max(with_probe)
    print(f"work per request: 3 × {n}×{n} matmul ≈ {1e3 / b:.3f} ms; {args.pairs} alternating pairs of "
          f"{args.requests} requests")
    print(f"plain  {b:10.1f} req/s (runs: {', '.join(f'{x:.0f}' for x in base)})")
    print(f"probed {p:10.1f} req/s (runs: {', '.join(f'{x:.0f}' for x in with_probe)})")
    print(f"ratio probed/plain = {p / b:.4f}  → cost {100 * (1 - p / b):+.2f} % ({per_req_us:+.1f} µs/request); "
          f"probe records written {stats['requests']} (all runs), dropped {stats['dropped']}")
    print(f"best-of runs: ratio {best_p / best_b:.4f} → cost {100 * (1 - best_p / best_b):+.2f} %")
    print(f"probe alone (request + 3 stages + set, no work): {bare_us:.2f} µs/request "
          f"= {100 * bare_us / (1e6 / b):.2f} % of this request's {1e3 / b:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
