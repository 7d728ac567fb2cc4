#!/usr/bin/env python3
"""What `diagnose watch` costs while nothing happens (issue 19: ≤ 0.02 cores, memory flat).

Starts the demo's `healthy` service with its stage log and leaves it idle; starts `diagnose watch`
on it exactly as an operator would (`--metrics`, `--log`, `--listen`, the default rules
`bottleneck` and `oom`, the default 5 s interval and 5-minute ring); once the ring is full reads
the watcher's CPU seconds (user + system) and resident memory from /proc every 30 s for `--span`
seconds (default 600). Prints the cores used over the span, the resident memory at the start and the
end of it, its largest value, and whether any session was written (none should be: idle).

``--busy``: the same service under its light load (one client with think time: requests complete,
nothing queues, nothing fires), so the watcher also runs its light verdict (at most every 15 s):
what watching costs a busy, healthy service. No budget is asserted for it.

usage: benchmarks/watch_idle.py [--span 600] [--settle 330] [--every 30] [--busy]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from diagnose.examples.demo import PATHOLOGIES, DemoService, background_load
from tests.engines.lab import free_port

DIAGNOSE = os.path.join(os.path.dirname(sys.executable), "diagnose")
BUDGET_CORES = 0.02


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--span", type=float, default=600.0, help="seconds measured (default 600)")
    ap.add_argument("--settle", type=float, default=330.0,
                    help="seconds before measuring: the imports, and the 5-minute ring filling up (default 330)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between readings")
    ap.add_argument("--busy", action="store_true", help="the service under light load (the light verdict runs)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="watch-idle-")
    stage_log = os.path.join(tmp, "stages.jsonl")
    open(stage_log, "w").close()
    port = free_port()
    with DemoService("healthy", extra_args=["--stage-log", stage_log]) as svc, contextlib.ExitStack() as stack:
        if args.busy:
            stack.enter_context(background_load(svc.url, PATHOLOGIES["healthy"], args.settle + args.span + 120))
        watcher = subprocess.Popen([DIAGNOSE, "watch", "--pid", str(svc.pid), "--metrics", f"{svc.url}/metrics",
                                    "--log", stage_log, "-o", os.path.join(tmp, "sessions"),
                                    "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)
        try:
            time.sleep(args.settle)
            proc = psutil.Process(watcher.pid)
            readings: list[tuple[float, float, int]] = []
            end = time.monotonic() + args.span
            while True:
                cpu = proc.cpu_times()
                readings.append((time.monotonic(), cpu.user + cpu.system, proc.memory_info().rss))
                if time.monotonic() >= end:
                    break
                time.sleep(min(args.every, max(0.0, end - time.monotonic())))
            up = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        finally:
            watcher.send_signal(signal.SIGINT)
            out, _ = watcher.communicate(timeout=60)
    (t0, c0, m0), (t1, c1, m1) = readings[0], readings[-1]
    cores = (c1 - c0) / (t1 - t0)
    peak = max(m for _, _, m in readings)
    mid = readings[len(readings) // 2][2]
    sessions = [n for n in os.listdir(os.path.join(tmp, "sessions")) if n.startswith("watch-")] \
        if os.path.isdir(os.path.join(tmp, "sessions")) else []
    if args.busy:
        print(f"watching a busy service over {t1 - t0:.0f} s ({len(readings)} readings): {cores:.4f} cores")
    else:
        print(f"idle watch over {t1 - t0:.0f} s ({len(readings)} readings): {cores:.4f} cores "
              f"({'within' if cores <= BUDGET_CORES else 'OVER'} the {BUDGET_CORES} budget)")
    print(f"resident memory: {m0 / 2**20:.1f} MiB at the start, {m1 / 2**20:.1f} MiB at the end "
          f"({(m1 - m0) / 2**20:+.1f} MiB; {(m1 - mid) / 2**20:+.1f} MiB over the second half), "
          f"{peak / 2**20:.1f} MiB at most")
    print(f"sessions written: {len(sessions)}; diagnose_up in /metrics: {'diagnose_up 1.0' in up}; "
          f"watcher exit {watcher.returncode}{'; stdout: ' + out.strip() if out.strip() else ''}")
    within = args.busy or cores <= BUDGET_CORES
    return 0 if within and not sessions and watcher.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
