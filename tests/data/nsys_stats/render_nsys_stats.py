"""Render `nsys stats`-style summaries from a real Nsight Systems SQLite export (test-data helper).

`nsys` itself is not installed where these fixtures were made, so the numbers are aggregated with
SQL from the export's CUPTI tables and printed in the layout of nsys 2023's cuda_api_sum,
cuda_gpu_kern_sum, cuda_gpu_mem_time_sum and cuda_gpu_mem_size_sum reports (table or CSV).

usage: python render_nsys_stats.py EXPORT.sqlite [--csv] > out.txt
"""

from __future__ import annotations

import csv
import io
import sqlite3
import statistics
import sys


def _stats(vals: list[float]) -> tuple[float, float, float, float, float, float]:
    sd = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return sum(vals), statistics.mean(vals), statistics.median(vals), min(vals), max(vals), sd


def _emit(title: str, report: str, header: list[str], rows: list[list[str]], as_csv: bool, path: str) -> None:
    print(f"Processing [{path}] with [/opt/nvidia/nsight-systems/2023.3.1/host-linux-x64/reports/{report}.py]... ")
    print()
    print(f" ** {title} ({report}):")
    print()
    if as_csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
        print(buf.getvalue(), end="")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        last = len(header) - 1
        cols = enumerate(zip(header, widths, strict=True))
        print(" " + "  ".join(h.rjust(w) if i < last else h.center(w) for i, (h, w) in cols))
        print(" " + "  ".join("-" * w for w in widths))
        for r in rows:
            cells = enumerate(zip(r, widths, strict=True))
            print(" " + "  ".join(c.rjust(w) if i < last else c.ljust(w) for i, (c, w) in cells))
    print()


def _n(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def _time_row(pct: float, s: float, n: int, avg: float, med: float, lo: float, hi: float, sd: float,
              name: str) -> list[str]:
    return [_n(pct), _n(s, 0), _n(n, 0), _n(avg), _n(med), _n(lo, 0), _n(hi, 0), _n(sd), name]


def main() -> int:
    path = sys.argv[1]
    as_csv = "--csv" in sys.argv
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    names = dict(db.execute("SELECT id, value FROM StringIds"))
    # CUDA API
    api: dict[str, list[float]] = {}
    for nid, dur in db.execute("SELECT nameId, end - start FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
        api.setdefault(names.get(nid, str(nid)), []).append(float(dur))
    total = sum(sum(v) for v in api.values()) or 1.0
    rows = []
    for name, v in sorted(api.items(), key=lambda kv: -sum(kv[1])):
        s, avg, med, lo, hi, sd = _stats(v)
        rows.append(_time_row(100 * s / total, s, len(v), avg, med, lo, hi, sd, name))
    _emit("CUDA API Summary", "cuda_api_sum", ["Time (%)", "Total Time (ns)", "Num Calls", "Avg (ns)", "Med (ns)",
          "Min (ns)", "Max (ns)", "StdDev (ns)", "Name"], rows, as_csv, path)
    # kernels
    kern: dict[str, list[float]] = {}
    for nid, dur in db.execute("SELECT demangledName, end - start FROM CUPTI_ACTIVITY_KIND_KERNEL"):
        kern.setdefault(names.get(nid, str(nid)), []).append(float(dur))
    total = sum(sum(v) for v in kern.values()) or 1.0
    rows = []
    for name, v in sorted(kern.items(), key=lambda kv: -sum(kv[1])):
        s, avg, med, lo, hi, sd = _stats(v)
        rows.append(_time_row(100 * s / total, s, len(v), avg, med, lo, hi, sd, name))
    _emit("CUDA GPU Kernel Summary", "cuda_gpu_kern_sum", ["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)",
          "Med (ns)", "Min (ns)", "Max (ns)", "StdDev (ns)", "Name"], rows, as_csv, path)
    # memory operations
    kinds = dict(db.execute("SELECT id, label FROM ENUM_CUDA_MEMCPY_OPER"))
    ops: dict[str, list[tuple[float, float]]] = {}
    for kind, dur, size in db.execute("SELECT copyKind, end - start, bytes FROM CUPTI_ACTIVITY_KIND_MEMCPY"):
        ops.setdefault(f"[CUDA memcpy {kinds.get(kind, kind)}]", []).append((float(dur), float(size)))
    total = sum(d for v in ops.values() for d, _ in v) or 1.0
    rows = []
    for name, v in sorted(ops.items(), key=lambda kv: -sum(d for d, _ in kv[1])):
        s, avg, med, lo, hi, sd = _stats([d for d, _ in v])
        rows.append(_time_row(100 * s / total, s, len(v), avg, med, lo, hi, sd, name))
    _emit("CUDA GPU MemOps Summary (by Time)", "cuda_gpu_mem_time_sum", ["Time (%)", "Total Time (ns)", "Count",
          "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)", "StdDev (ns)", "Operation"], rows, as_csv, path)
    rows = []
    for name, v in sorted(ops.items(), key=lambda kv: -sum(b for _, b in kv[1])):
        s, avg, med, lo, hi, sd = _stats([b / 1e6 for _, b in v])
        rows.append([_n(s, 3), _n(len(v), 0), _n(avg, 3), _n(med, 3), _n(lo, 3), _n(hi, 3), _n(sd, 3), name])
    _emit("CUDA GPU MemOps Summary (by Size)", "cuda_gpu_mem_size_sum", ["Total (MB)", "Count", "Avg (MB)",
          "Med (MB)", "Min (MB)", "Max (MB)", "StdDev (MB)", "Operation"], rows, as_csv, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
