#!/usr/bin/env python3
"""What attaching costs the service: demo throughput with and without `diagnose attach`.

Runs alternate windows of the same closed-loop load against one demo service: one window with
nobody attached, the next with a full attach (py-spy at its default rate, psutil sampling,
dumps), and so on, so that drift (thermal, other load) hits both sides alike. Prints each
window's throughput and the ratio of the means: attached / not attached.

usage: benchmarks/attach_overhead.py [--pathology queueing] [--window 10] [--pairs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.dirname(__file__)))

from analyzer.attach import AttachOptions, attach
from examples.demo import PATHOLOGIES, DemoService, Load
from examples.loadgen import run_load


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pathology", default="queueing")
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rate", type=int, default=50, help="py-spy sampling rate (diagnose attach default)")
    args = ap.parse_args()
    spec = PATHOLOGIES[args.pathology]
    plain: list[float] = []
    attached: list[float] = []
    with DemoService(args.pathology) as svc, tempfile.TemporaryDirectory() as tmp:
        run_load(svc.url, spec.name, spec.concurrency, 3.0, spec.think_s)  # warm-up
        for i in range(args.pairs):
            # ABBA order: a drifting machine biases neither side
            for with_attach in (False, True) if i % 2 == 0 else (True, False):
                with Load(svc.url, spec, args.window, stop_on_exit=False) as load:
                    if with_attach:
                        attach(AttachOptions(pid=svc.pid, duration_s=args.window, output=f"{tmp}/s{i}",
                                             rate_hz=args.rate))
                assert load.result is not None
                (attached if with_attach else plain).append(load.result.throughput_rps)
            print(f"pair {i + 1}: not attached {plain[-1]:.2f} req/s, attached {attached[-1]:.2f} req/s", flush=True)
    ratio = statistics.mean(attached) / statistics.mean(plain)
    print(f"pathology={args.pathology} window={args.window:.0f}s pairs={args.pairs} py-spy rate={args.rate} Hz")
    print(f"throughput attached / not attached = {ratio:.3f}  (cost {100 * (1 - ratio):.1f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
