"""How fast `diagnose analyze` reads a large Nsight Systems SQLite export, against the floor.

Builds a scaled export with ``../shared/bench/scale_nsys.py`` (the H100 two-GPU slice repeated
``--copies`` times: 300 copies ≈ 1 M kernels, 1.7 M runtime calls, 5 M NVTX rows), then, in the
same run and alternating, times ``../shared/bench/nsys_floor.py`` (one aggregate pass over each
timed table: the least any analysis reading those rows can cost) and ``diagnose analyze FILE
--format json`` (a fresh process, start-up included). Each command runs in its own subprocess
under a small wrapper that reports the child's wall time and peak RSS
(``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss`` of that one child) and CPU time. Prints each
run, the medians, the ratio analysis / floor (wall time; CPU time too, steadier on a shared
machine) and whether the bounds hold (≤ 3× the floor, < 400 MB). Exit 0 when they hold.

usage: python benchmarks/nsys_speed.py [--copies 300] [--repeat 3] [--out /tmp/nsys_big.sqlite] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
SOURCE = os.path.join(SHARED, "data", "nsys", "GindaChen__nsys-ai__125c3c22d9__h100_2gpu_1s.sqlite")
SCALE = os.path.join(SHARED, "bench", "scale_nsys.py")
FLOOR = os.path.join(SHARED, "bench", "nsys_floor.py")
MAX_RATIO = 3.0
MAX_RSS_MB = 400.0

# runs argv[1:] as one child and prints {"wall_s", "cpu_s", "rss_mb", "rc"} for that child alone
WRAPPER = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mb": ru.ru_maxrss / 1024.0,
                  "rc": p.returncode, "err": p.stderr[-400:]}))
"""
DIAGNOSE = "import sys; from diagnose.cli import main; sys.exit(main())"


def measure(cmd: list[str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", WRAPPER, *cmd], capture_output=True, text=True, check=True, cwd=ROOT)
    doc = json.loads(out.stdout)
    return {k: doc[k] for k in ("wall_s", "cpu_s", "rss_mb", "rc")} | {"err": doc["err"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=SOURCE, help="the export to scale (default: the H100 two-GPU slice)")
    ap.add_argument("--copies", type=int, default=300, help="how many times to repeat its timed rows (300)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each command, alternating (3)")
    ap.add_argument("--out", help="where to write the scaled export (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="use --out as it is when it exists")
    ap.add_argument("--keep", action="store_true", help="keep the scaled export")
    args = ap.parse_args(argv)
    for path in (args.source, SCALE, FLOOR):
        if not os.path.exists(path):
            print(f"missing {path}: the benchmark needs ../shared (data/nsys and bench)", file=sys.stderr)
            return 2
    tmp = None
    out = args.out
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="nsys-speed-")
        out = os.path.join(tmp.name, "scaled.sqlite")
    try:
        if not (args.reuse and os.path.exists(out)):
            subprocess.run([sys.executable, SCALE, args.source, out, "--copies", str(args.copies)], check=True)
        size_mb = os.path.getsize(out) / 2**20
        floor_cmd = [sys.executable, FLOOR, out]
        diag_cmd = [sys.executable, "-c", DIAGNOSE, "analyze", out, "--format", "json"]
        measure(floor_cmd)  # warm the page cache for both: the first reader would pay the disk
        floors, runs = [], []
        for i in range(args.repeat):
            f = measure(floor_cmd)
            d = measure(diag_cmd)
            if d["rc"] not in (0, 1):
                print(f"diagnose analyze failed (exit {d['rc']}): {d['err']}", file=sys.stderr)
                return 2
            floors.append(f)
            runs.append(d)
            print(f"run {i + 1}: floor {f['wall_s']:.2f} s (cpu {f['cpu_s']:.2f} s, {f['rss_mb']:.0f} MB)   "
                  f"diagnose analyze {d['wall_s']:.2f} s (cpu {d['cpu_s']:.2f} s, {d['rss_mb']:.0f} MB)   "
                  f"ratio {d['wall_s'] / f['wall_s']:.2f}")
        floor_s = statistics.median(r["wall_s"] for r in floors)
        diag_s = statistics.median(r["wall_s"] for r in runs)
        rss = max(r["rss_mb"] for r in runs)
        ratio = diag_s / floor_s
        cpu_ratio = statistics.median(r["cpu_s"] for r in runs) / statistics.median(r["cpu_s"] for r in floors)
        print(f"export: {out} ({size_mb:.0f} MiB, {args.copies} copies of {os.path.basename(args.source)})")
        print(f"floor (nsys_floor.py):  {floor_s:.2f} s  median of {args.repeat}")
        print(f"diagnose analyze:       {diag_s:.2f} s  median of {args.repeat}, peak RSS {rss:.0f} MB")
        print(f"CPU time ratio (steadier on a shared machine): {cpu_ratio:.2f}×")
        ok = ratio <= MAX_RATIO and rss < MAX_RSS_MB
        print(f"ratio: {ratio:.2f}× the floor (bound {MAX_RATIO:.0f}×), peak RSS {rss:.0f} MB "
              f"(bound {MAX_RSS_MB:.0f} MB): {'OK' if ok else 'OVER'}")
        return 0 if ok else 1
    finally:
        if tmp is not None and not args.keep:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
