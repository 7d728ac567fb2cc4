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
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from examples.fleet import PrometheusServer, find_prometheus  # noqa: E402

STEP_S = 15  # the generated scrape interval (Prometheus's default)
TIERS = ((50, "a"), (100, "b"), (250, "c"), (500, "d"))  # cumulative sizes and the tier that completes them
MAX_WALL_S = 60.0
MAX_RSS_MIB = 500.0
MAX_PER_REPLICA_GROWTH = 1.25
LE = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HISTS = (("vllm:e2e_request_latency_seconds", 1.2), ("vllm:time_to_first_token_seconds", 0.2),
         ("vllm:request_queue_time_seconds", 0.05), ("vllm:inter_token_latency_seconds", 0.02))
COUNTERS = (("vllm:request_success", 1.0), ("vllm:prompt_tokens", 500.0), ("vllm:generation_tokens", 120.0),
            ("vllm:num_preemptions", 0.0))
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
DCGM = (("DCGM_FI_DEV_GPU_UTIL", 80.0), ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.7), ("DCGM_FI_PROF_SM_ACTIVE", 0.6),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.3), ("DCGM_FI_PROF_DRAM_ACTIVE", 0.5), ("DCGM_FI_DEV_FB_USED", 70000.0),
        ("DCGM_FI_DEV_FB_FREE", 11000.0), ("DCGM_FI_DEV_SM_CLOCK", 1755.0), ("DCGM_FI_DEV_MAX_SM_CLOCK", 1980.0),
        ("DCGM_FI_DEV_POWER_USAGE", 600.0), ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 700.0), ("DCGM_FI_DEV_GPU_TEMP", 65.0))

# runs argv[1:] as one child and prints {"wall_s", "rss_mib", "rc", "err"} for that child alone
WRAPPER = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "rss_mib": ru.ru_maxrss / 1024, "rc": p.returncode, "err": p.stderr[-800:]}))
"""


def tier_of(i: int) -> str:
    for size, tier in TIERS:
        if i < size:
            return tier
    return "z"


def generate(path: str, replicas: int, minutes: int, end: int, seed: int = 1) -> int:
    """Write the OpenMetrics file; returns the number of series."""
    rng = random.Random(seed)
    times = [end - minutes * 60 + k * STEP_S for k in range(minutes * 60 // STEP_S + 1)]
    reps = []
    for i in range(replicas):
        load = rng.uniform(0.5, 1.5) * (8.0 if i % 97 == 0 else 1.0)  # a few replicas take far more
        labels = (f'instance="10.{i // 250}.{i % 250}.1:8000",job="vllm",pod="vllm-{i}",namespace="llm",'
                  f'model_name="m",tier="{tier_of(i)}"')
        reps.append((i, load, labels))
    series = 0
    with open(path, "w", encoding="utf-8", buffering=1 << 22) as out:
        w = out.write
        for name in GAUGES:
            w(f"# TYPE {name} gauge\n")
            for _i, load, labels in reps:
                series += 1
                for t in times:
                    v = {"vllm:num_requests_running": 8 * load,
                         "vllm:num_requests_waiting": max(0.0, 20 * (load - 1.2)),
                         "vllm:kv_cache_usage_perc": min(0.99, 0.6 * load)}[name]
                    w(f"{name}{{{labels}}} {v + rng.random() * 0.1:.3f} {t}\n")
        for name, per_req in COUNTERS:
            w(f"# TYPE {name} counter\n")
            for _i, load, labels in reps:
                series += 1
                total = 0.0
                for t in times:
                    total += per_req * 5 * load * STEP_S
                    w(f"{name}_total{{{labels}}} {total:.0f} {t}\n")
        for name, typical in HISTS:
            w(f"# TYPE {name} histogram\n")
            for _i, load, labels in reps:
                series += len(LE) + 3
                scale = typical * load
                cum = [0.0] * (len(LE) + 1)
                s = n = 0.0
                for t in times:
                    k = 5 * load * STEP_S
                    for j, le in enumerate(LE):
                        cum[j] += k * (1 - math.exp(-le / scale))
                    cum[-1] += k
                    n += k
                    s += k * scale
                    for j, le in enumerate(LE):
                        w(f'{name}_bucket{{{labels},le="{le}"}} {cum[j]:.1f} {t}\n')
                    w(f'{name}_bucket{{{labels},le="+Inf"}} {cum[-1]:.1f} {t}\n')
                    w(f"{name}_count{{{labels}}} {n:.1f} {t}\n{name}_sum{{{labels}}} {s:.3f} {t}\n")
        for name, base in DCGM:
            w(f"# TYPE {name} gauge\n")
            for i, _load, _ in reps:
                series += 1
                gl = (f'gpu="0",UUID="GPU-{i:08d}",modelName="NVIDIA H100 80GB HBM3",Hostname="node-{i}",'
                      f'pod="vllm-{i}",namespace="llm",container="engine",job="dcgm-exporter",'
                      f'instance="10.9.{i // 250}.{i % 250}:9400",tier="{tier_of(i)}"')
                for t in times:
                    w(f"{name}{{{gl}}} {base * (0.95 + 0.1 * rng.random()):.3f} {t}\n")
        w("# EOF\n")
    return series


def measure(url: str, at: int, tiers: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "analyzer.cli", "fleet", "--prometheus", url, "--window", "15m", "--at", str(at),
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
        series = generate(om, args.replicas, args.minutes, end)
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
    code = "import analyzer.cli, analyzer.fleet, analyzer.pipeline, reports.fleet"
    got = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True)
    return float(json.loads(got.stdout)["rss_mib"])


if __name__ == "__main__":
    sys.exit(main())
