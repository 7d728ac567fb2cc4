"""diagnose against HolisticTraceAnalysis on every PyTorch-profiler trace HTA can read.

For each trace in ``--data`` (default ``../shared/data/kineto``), in a fresh process each, timed the
same way: wall clock from process start to its whole answer on stdout (and, printed too, to the
process's exit, which adds the interpreter's teardown):

* HTA: ``TraceAnalysis(trace_dir=…).get_temporal_breakdown(visualize=False)`` run by
  ``--hta-python`` (a venv with ``pip install holistictraceanalysis``; HTA pins its own pandas);
* diagnose: ``python -m diagnose analyze TRACE --format json`` (the whole diagnosis).

Each tool runs ``--repeat`` times per trace (default 5), the two taking turns, and its shortest run
counts: on a shared machine other work only ever adds time, and one run of a 0.1 s process varies by
half of it.

Both run as installed: ``pip install`` byte-compiles HTA's modules (and numpy's, pandas'), while an
editable checkout of diagnose under ``PYTHONDONTWRITEBYTECODE=1`` would recompile its ~100 source
files in every process (~0.1 s each run). diagnose's packages are therefore byte-compiled once
first (``compileall``, into the gitignored ``__pycache__`` folders); ``--no-compile`` skips that.

It prints both breakdowns (idle / compute / non-compute % of the kernel span per rank) side by side,
the largest difference in percentage points, both times and their ratio; then builds a ~1 GB trace
in a temporary folder by repeating a real trace's events with shifted timestamps and ids and reports
diagnose's time and peak RSS on it (HTA is not run on it: it loads the whole file into pandas).

    python benchmarks/kineto_vs_hta.py [--hta-python /work/hta-venv/bin/python] [--big-mb 1024] [--repeat 5]
                                       [--no-compile]
"""

from __future__ import annotations

import argparse
import glob
import gzip
import io
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DATA = os.path.join(os.path.dirname(ROOT), "shared", "data", "kineto")
PACKAGES = ("analyzer", "collectors", "rules", "reports")
BIG_SOURCE = "trace_diff__control__control"  # A100 rank 3/8, 109k events, 35 MB of JSON

HTA_SCRIPT = r"""
import json, logging, os, sys, tempfile
path = sys.argv[1]
from hta.trace_analysis import TraceAnalysis
import hta.configs.config as c
c.logger.setLevel(logging.CRITICAL)
d = tempfile.mkdtemp()
os.symlink(os.path.abspath(path), os.path.join(d, os.path.basename(path)))
try:
    df = TraceAnalysis(trace_dir=d).get_temporal_breakdown(visualize=False)
    print(json.dumps({"ok": True, "rows": df.to_dict(orient="records")}))
except Exception as e:
    print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:200]}))
"""


def _json_answer(out: bytes | bytearray) -> bool:
    """Whether ``out`` holds a whole answer: a JSON document (diagnose) or a JSON line (HTA's script)."""
    text = out.strip()
    if not text.endswith(b"}"):
        return False
    last = text.rsplit(b"\n", 1)[-1]
    for candidate in (last, text):
        try:
            json.loads(candidate)
            return True
        except ValueError:
            continue
    return False


def timed(cmd: list[str], cwd: str | None = None) -> tuple[float, float, float, str]:
    """(seconds to the answer, seconds to the process's exit, CPU seconds, stdout). The answer is in when
    stdout holds a whole JSON answer; the exit adds the interpreter's teardown (freeing every module),
    which is no part of the answer. CPU: user + system time of the process and of the children it
    waited for (HTA's worker processes), which the machine's other work changes far less than wall time."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=cwd)
    pipe = proc.stdout
    assert isinstance(pipe, io.BufferedReader)
    out = bytearray()
    answer = None
    while chunk := pipe.read1(1 << 16):
        out += chunk
        if answer is None and _json_answer(out):
            answer = time.perf_counter() - t0
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    end = time.perf_counter() - t0
    return (answer if answer is not None else end), end, usage.ru_utime + usage.ru_stime, out.decode(
        "utf-8", errors="replace")


def hta(python: str, path: str) -> tuple[tuple[float, float, float], dict[str, object]]:
    *times, out = timed([python, "-c", HTA_SCRIPT, path])
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    return (times[0], times[1], times[2]), json.loads(lines[-1]) if lines else {"ok": False, "error": "no answer"}


def diagnose(path: str) -> tuple[tuple[float, float, float], dict[str, object]]:
    *times, out = timed([sys.executable, "-m", "diagnose", "analyze", path, "--format", "json"], cwd=ROOT)
    return (times[0], times[1], times[2]), json.loads(out)


def shares(doc: dict[str, object]) -> tuple[float, float, float] | None:
    ev = {e["key"]: e["value"] for e in doc["evidence"]}  # type: ignore[index, union-attr]
    keys = ("kineto.idle_share", "kineto.compute_share", "kineto.non_compute_share")
    if not all(k in ev for k in keys):
        return None
    return tuple(100 * float(ev[k]) for k in keys)  # type: ignore[return-value]


def race(data: str, python: str, repeat: int = 1) -> None:
    print(f"{'trace':58} {'rank':>4}  {'HTA idle/comp/non %':>22}  {'diagnose idle/comp/non %':>24}  {'max Δpp':>7}"
          f"  {'HTA s':>6} {'diag s':>6} {'×':>5}")
    tot_h = [0.0, 0.0, 0.0]  # to the answer, to the exit, CPU
    tot_d = [0.0, 0.0, 0.0]
    worst = 0.0
    n = 0
    for path in sorted(glob.glob(os.path.join(data, "*.gz"))):
        h_t, h = hta(python, path)
        if not h.get("ok"):
            print(f"{os.path.basename(path)[:58]:58}  HTA cannot read it: {h.get('error')}")
            continue
        d_t, d = diagnose(path)
        for _ in range(repeat - 1):  # the tools take turns, so that a burst of other work falls on both alike
            h_t = tuple(map(min, h_t, hta(python, path)[0]))  # type: ignore[assignment]
            d_t = tuple(map(min, d_t, diagnose(path)[0]))  # type: ignore[assignment]
        mine = shares(d)
        row = h["rows"][0]  # type: ignore[index]
        theirs = (row["idle_time_pctg"], row["compute_time_pctg"], row["non_compute_time_pctg"])
        diff = max(abs(a - b) for a, b in zip(mine, theirs, strict=True)) if mine else float("nan")
        worst = max(worst, diff)
        for i in range(3):
            tot_h[i] += h_t[i]
            tot_d[i] += d_t[i]
        n += 1
        name = os.path.basename(path).split(".json")[0][-58:]
        fm = "/".join(f"{x:5.2f}" for x in mine) if mine else "-"
        print(f"{name:58} {row['rank']:>4}  {'/'.join(f'{x:5.2f}' for x in theirs):>22}  {fm:>24}  {diff:7.3f}"
              f"  {h_t[0]:6.2f} {d_t[0]:6.2f} {h_t[0] / d_t[0]:5.1f}")
    each = f", each the best of {repeat} runs" if repeat > 1 else ""
    print(f"\n{n} traces HTA reads: largest difference {worst:.3f} percentage points; from process start to the "
          f"answer{each}: HTA {tot_h[0]:.2f} s, diagnose {tot_d[0]:.2f} s in total: diagnose "
          f"{tot_h[0] / tot_d[0]:.1f}× faster end to end")
    print(f"to the processes' exit (teardown included): HTA {tot_h[1]:.2f} s, diagnose {tot_d[1]:.2f} s, "
          f"{tot_h[1] / tot_d[1]:.1f}×; CPU time (user + system, children included): HTA {tot_h[2]:.2f} s, diagnose "
          f"{tot_d[2]:.2f} s, {tot_h[2] / tot_d[2]:.1f}×")


def build_big(src: str, dest: str, target_bytes: int) -> tuple[int, int]:
    """Repeat ``src``'s events with shifted timestamps, correlation and External ids until ``dest`` holds
    about ``target_bytes``; returns (bytes, events)."""
    with gzip.open(src, "rb") as fh:
        doc = json.load(fh)
    events = doc.pop("traceEvents")
    xs = [e for e in events if e.get("ph") == "X" and isinstance(e.get("ts"), int | float)]
    t0 = min(e["ts"] for e in xs)
    span = max(e["ts"] + e.get("dur", 0) for e in xs) - t0 + 1000
    ids = max([int(e.get("args", {}).get("correlation", 0) or 0) for e in events]
              + [int(e.get("args", {}).get("External id", 0) or 0) for e in events]) + 1
    texts = [json.dumps(e) for e in events]
    one = sum(len(t) + 2 for t in texts)
    copies = max(1, target_bytes // one)
    written = n = 0
    with open(dest, "w", encoding="utf-8") as out:
        head = json.dumps(doc)[:-1]
        out.write(head + (", " if len(doc) else "") + '"traceEvents": [\n')
        first = True
        for k in range(copies):
            for e in events:
                if k:
                    e = dict(e)
                    if "ts" in e:
                        e["ts"] = e["ts"] + k * span
                    args = e.get("args")
                    if isinstance(args, dict) and ("correlation" in args or "External id" in args):
                        args = dict(args)
                        for key in ("correlation", "External id"):
                            if isinstance(args.get(key), int) and args[key] > 0:
                                args[key] += k * ids
                        e["args"] = args
                    if "id" in e and isinstance(e["id"], int):
                        e["id"] += k * ids
                text = json.dumps(e)
                out.write(("" if first else ",\n") + text)
                first = False
                written += len(text) + 2
                n += 1
        out.write("\n]}\n")
    return os.path.getsize(dest), n


def big(data: str, mb: int) -> None:
    (src,) = [p for p in glob.glob(os.path.join(data, "*.gz")) if BIG_SOURCE in p]
    with tempfile.TemporaryDirectory() as tmp:
        dest = os.path.join(tmp, "big.pt.trace.json")
        t0 = time.perf_counter()
        size, n = build_big(src, dest, mb << 20)
        print(f"\nbuilt {size / (1 << 20):.0f} MiB, {n} events from {os.path.basename(src)} "
              f"in {time.perf_counter() - t0:.0f} s")
        probe = ("import resource, subprocess, sys, time, json\n"
                 "t0 = time.perf_counter()\n"
                 "out = subprocess.run([sys.executable, '-m', 'diagnose', 'analyze', sys.argv[1], '--format', "
                 "'json'], capture_output=True, text=True).stdout\n"
                 "s = time.perf_counter() - t0\n"
                 "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
                 "doc = json.loads(out)\n"
                 "print(json.dumps({'s': s, 'rss_kib': rss, 'inputs': doc['inputs'], 'verdict': doc['verdict'], "
                 "'evidence': {e['key']: e['value'] for e in doc['evidence'] if e['key'] in "
                 "('kineto.events', 'trace.kernel_count', 'kineto.idle_share', 'trace.gpu_busy_ratio')}}))\n")
        out = subprocess.run([sys.executable, "-c", probe, dest], capture_output=True, text=True, cwd=ROOT,
                             check=True).stdout
        res = json.loads(out)
        print(f"diagnose analyze on it: {res['s']:.1f} s, peak RSS {res['rss_kib'] / 1024:.0f} MiB "
              f"({size / (1 << 20) / res['s']:.0f} MiB/s); input {res['inputs'][0]['status']}, "
              f"evidence {res['evidence']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=DEFAULT_DATA)
    p.add_argument("--hta-python", default="/work/hta-venv/bin/python")
    p.add_argument("--big-mb", type=int, default=1024, help="size of the synthetic trace (0: skip it)")
    p.add_argument("--repeat", type=int, default=5,
                   help="runs of each tool per trace, taking turns; the shortest counts, for both (default 5; 1: one "
                        "run each)")
    p.add_argument("--no-compile", dest="compile", action="store_false",
                   help="do not byte-compile diagnose's packages first (bytecode already in their __pycache__ "
                        "folders is still used; remove them to time a run that compiles its sources)")
    args = p.parse_args(argv)
    if not os.path.isdir(args.data):
        print(f"{args.data} does not exist: pass --data with the folder of traces.", file=sys.stderr)
        return 2
    if not os.path.exists(args.hta_python):
        print(f"{args.hta_python} does not exist: create a venv with `pip install holistictraceanalysis` and pass "
              "--hta-python.", file=sys.stderr)
        return 2
    if args.compile:
        subprocess.run([sys.executable, "-m", "compileall", "-q", *PACKAGES], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        print(f"diagnose's packages byte-compiled first ({', '.join(PACKAGES)}), as pip install does for HTA\n")
    race(args.data, args.hta_python, args.repeat)
    if args.big_mb:
        big(args.data, args.big_mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
