"""How `diagnose fleet` scales with the number of replicas, against a real Prometheus holding 15 minutes.

A generator writes OpenMetrics text for ``--replicas`` vLLM replicas (3 gauges, 4 counters, 4 latency
histograms of 12 buckets, plus one GPU's 12 dcgm-exporter fields, labelled with the replica's pod:
79 series per replica) sampled every 15 s over ``--minutes`` (default 15), ending three hours ago;
``promtool tsdb create-blocks-from openmetrics`` backfills it into TSDB blocks, and the Debian
``prometheus`` serves them on 127.0.0.1 (nothing scrapes, nothing is written but the blocks; all in a
temporary folder, removed at the end). Each replica carries a ``tier`` label so that the first 50,
100, 250 and 500 are chosen by a selector on the same server.

For each size, ``diagnose fleet --window 15m --at END --selector '{tier=~…}' --format json`` runs in a
fresh process under a wrapper that reports its wall time (queries and judging included) and peak
RSS. Printed: one row per size, the per-replica cost, and whether the bounds hold — time and memory
growing no worse than linearly (the per-replica time at the largest size at most 1.25× that at the
smallest; memory above the interpreter's base likewise) and under 60 s / 500 MiB at 500 replicas.
Exit 0 when they hold.

usage: python benchmarks/fleet_scale.py [--replicas 500] [--minutes 15] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from diagnose.examples.fleet import STEP_S, TIERS, PrometheusServer, find_prometheus, write_openmetrics  # noqa: E402

MAX_WALL_S = 60.0
MAX_RSS_MIB = 500.0
MAX_PER_REPLICA_GROWTH = 1.25
# runs argv[1:] as one child and prints {"wall_s", "rss_mib", "rc", "err"} for that child alone
WRAPPER = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "rss_mib": ru.ru_maxrss / 1024, "rc": p.returncode, "err": p.stderr[-800:]}))
"""


def measure(url: str, at: int, tiers: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "diagnose", "fleet", "--prometheus", url, "--window", "15m", "--at", str(at),
           "--selector", f'{{tier=~"{tiers}"}}', "--gpu-selector", f'{{tier=~"{tiers}"}}', "--format", "json",
           "-o", os.devnull, "--timeout", "120"]
    got = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, cwd=ROOT, check=True)
    doc: dict[str, float] = json.loads(got.stdout)
    if doc["rc"] != 0:
        raise SystemExit(f"diagnose fleet failed: {doc['err']}")
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=500)
    ap.add_argument("--minutes", type=int, default=15)
    ap.add_argument("--keep", help="keep the generated file and blocks in this folder")
    args = ap.parse_args()
    if find_prometheus() is None or shutil.which("promtool") is None:
        print("prometheus and promtool are needed: sudo apt-get install prometheus", file=sys.stderr)
        return 2
    work = args.keep or tempfile.mkdtemp(prefix="diagnose-fleet-scale-")
    os.makedirs(work, exist_ok=True)
    try:
        end = int(time.time()) // 60 * 60 - 3 * 3600  # three hours back: clear of the head block's range
        om = os.path.join(work, "fleet.om")
        t0 = time.perf_counter()
        series = write_openmetrics(om, args.replicas, args.minutes, end)
        size = os.path.getsize(om)
        print(f"generated {args.replicas} replicas × {args.minutes} min: {series} series, "
              f"{series * (args.minutes * 60 // STEP_S + 1):,} samples, {size / 2**20:.0f} MiB of OpenMetrics "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
        blocks = os.path.join(work, "data")
        t0 = time.perf_counter()
        subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "--quiet", om, blocks], check=True)
        os.remove(om)
        print(f"promtool backfilled the blocks in {time.perf_counter() - t0:.0f} s", flush=True)
        rows = []
        with PrometheusServer([], storage=blocks, retention="3650d") as prom:
            measure(prom.url, end, "a")  # warm the server's caches once, so each size sees the same server
            for size, _tier in TIERS:
                if size > args.replicas:
                    break
                tiers = "|".join(t for s, t in TIERS if s <= size)
                got = measure(prom.url, end, tiers)
                rows.append((size, got["wall_s"], got["rss_mib"]))
                print(f"{size:>5} replicas  {got['wall_s']:6.2f} s  {got['rss_mib']:6.1f} MiB peak RSS  "
                      f"{1000 * got['wall_s'] / size:6.1f} ms/replica", flush=True)
        base = measure_base()
        (n0, t_0, r0), (n1, t_1, r1) = rows[0], rows[-1]
        time_growth = (t_1 / n1) / (t_0 / n0)
        mem_growth = ((r1 - base) / n1) / max(1e-9, (r0 - base) / n0)
        print(f"interpreter and imports alone: {base:.1f} MiB")
        print(f"per-replica time at {n1} / at {n0}: {time_growth:.2f}; per-replica memory above the base: "
              f"{mem_growth:.2f} (≤ {MAX_PER_REPLICA_GROWTH} is linear or better)")
        ok = time_growth <= MAX_PER_REPLICA_GROWTH and mem_growth <= MAX_PER_REPLICA_GROWTH
        if n1 >= 500:
            ok = ok and t_1 < MAX_WALL_S and r1 < MAX_RSS_MIB
            print(f"{n1} replicas × {args.minutes} min: {t_1:.1f} s (bound {MAX_WALL_S:.0f} s), {r1:.0f} MiB "
                  f"(bound {MAX_RSS_MIB:.0f} MiB)")
        print("bounds hold" if ok else "BOUNDS DO NOT HOLD")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def measure_base() -> float:
    """Peak RSS of the same interpreter importing what `diagnose fleet` imports, doing nothing."""
    code = "import diagnose.cli, diagnose.fleet, diagnose.pipeline, diagnose.reports.fleet"
    got = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return float(json.loads(got.stdout)["rss_mib"])


if __name__ == "__main__":
    sys.exit(main())
