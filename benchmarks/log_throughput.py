"""How fast `diagnose analyze` reads a large serving log, and how much memory it needs.

Writes a synthetic vLLM-style log (real-format lines: V0 and V1 stats lines, request logs, a
preemption warning, a config dump, HTTP access lines) of the requested size into a temporary
folder, runs the loose-evidence analysis on it in-process (``diagnose.loose.analyze_path``, the
streaming path ``diagnose analyze FILE`` uses), deletes the file, and prints the throughput in
MB/s and the peak resident memory (``resource.getrusage(...).ru_maxrss``), and the analysis's time
over a floor pass of the same file in the same minutes (``floor_pass``: read it and count its lines).

With ``--per-source MB`` it also feeds the first MB of the log to each text source on its own and
prints each one's MB/s, to show which parser limits the whole.

usage: python benchmarks/log_throughput.py [--size-mb 1024] [--per-source 10] [--keep]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LINES = (
    "INFO 03-18 12:34:{s:02d} llm_engine.py:706] Avg prompt throughput: 209.6 tokens/s, Avg generation "
    "throughput: 567.4 tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: {p} reqs, GPU KV cache usage: "
    "{kv}%, CPU KV cache usage: 0.0%",
    "INFO 06-02 10:01:{s:02d} [loggers.py:111] Engine 000: Avg prompt throughput: 5120.3 tokens/s, Avg "
    "generation throughput: 1502.2 tokens/s, Running: {r} reqs, Waiting: {p} reqs, GPU KV cache usage: {kv}%, "
    "Prefix cache hit rate: 4.1%",
    "INFO 03-18 12:34:{s:02d} async_llm_engine.py:508] Received request cmpl-{i:032x}: prompt: 'Summarise the "
    "following support ticket in two sentences.', sampling_params: SamplingParams(n=1, temperature=0.7, "
    "top_p=1.0, max_tokens=256), prompt_token_ids: [1, 3439, 17632, 278, 1494, 2304, 23381].",
    "INFO 03-18 12:34:{s:02d} async_llm_engine.py:120] Finished request cmpl-{i:032x}.",
    'INFO:     172.18.0.1:{port} - "POST /v1/completions HTTP/1.1" 200 OK',
    "vllm-1  | INFO 06-02 10:01:{s:02d} [logger.py:43] Received request chatcmpl-{i:032x}: params: "
    "SamplingParams(n=1, presence_penalty=0.0, temperature=0.7, top_p=1.0, max_tokens=512), prompt_token_ids: None",
)
RARE = (
    "WARNING 03-18 12:35:{s:02d} scheduler.py:1089] Sequence group {i} is preempted by PreemptionMode.RECOMPUTE "
    "mode because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
    "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
    "total_num_cumulative_preemption={i}"
)
HEADER = (
    "INFO 06-02 10:00:03 [api_server.py:1044] args: Namespace(model_tag='meta-llama/Llama-3.1-8B-Instruct', "
    "max_model_len=8192, gpu_memory_utilization=0.9, max_num_seqs=256)\n"
)


def write_log(path: str, size_bytes: int) -> int:
    """Write about ``size_bytes`` of log lines; return the bytes written."""
    written = 0
    i = 0
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(HEADER)
        written += len(HEADER)
        while written < size_bytes:
            chunk = []
            for _ in range(2000):
                i += 1
                tpl = RARE if i % 5000 == 0 else LINES[i % len(LINES)]
                chunk.append(tpl.format(s=i % 60, r=200 + i % 56, p=i % 97, kv=f"{50 + i % 50}.0", i=i,
                                        port=40000 + i % 20000))
            block = "\n".join(chunk) + "\n"
            fh.write(block)
            written += len(block.encode("utf-8"))
        # on disk before the analysis starts: the kernel's write-back of a fresh GB would otherwise
        # compete with the analysis for the CPUs (and the disk) while it is timed
        fh.flush()
        os.fsync(fh.fileno())
    return written


def floor_pass(path: str, block: int = 8 << 20) -> float:
    """Seconds for the least any reader of the log must do: read it in 8 MiB blocks and count its lines (what
    ``wc -l`` does). Timed just before and just after the analysis, in the same minutes: on a host whose speed
    moves from minute to minute (this 2-vCPU VM's by 1.6x), the analysis over this floor is the figure that
    compares across runs, as ``bench/nsys_floor.py`` is for traces."""
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(block)
        while n := fh.readinto(buf):
            buf.count(b"\n", 0, n)
    return time.perf_counter() - t0


def per_source(path: str, limit: int) -> None:
    """Time each text source alone on the first ``limit`` bytes of the log (lines cleaned once)."""
    from diagnose import loose
    from diagnose.collectors.logtext import clean_lines

    lines: list[str] = []
    size = 0
    with open(path, encoding="utf-8") as fh:
        for raw in fh:
            size += len(raw)
            lines.append(raw)
            if size >= limit:
                break
    t0 = time.perf_counter()
    cleaned = list(clean_lines(lines))
    print(f"per source, on {size / 1e6:.0f} MB ({len(cleaned)} lines):")
    print(f"  {'line cleaning':44s} {size / 1e6 / (time.perf_counter() - t0):8.1f} MB/s")
    for factory in loose.SOURCE_MODULES:
        for src in factory():
            t0 = time.perf_counter()
            for line in cleaned:
                src.feed(line)
            src.evidence("bench")
            dt = time.perf_counter() - t0
            print(f"  {factory.__module__ + ' ' + src.kind:44s} {size / 1e6 / dt:8.1f} MB/s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=float, default=1024.0, help="log size in MB (default 1024 = 1 GB)")
    ap.add_argument("--keep", action="store_true", help="keep the generated log (prints its path)")
    ap.add_argument("--per-source", type=float, default=0.0, metavar="MB",
                    help="also time each text source alone on the first MB of the log")
    args = ap.parse_args(argv)

    from diagnose import loose  # imported after the path setup

    tmp = tempfile.mkdtemp(prefix="diagnose-logbench-")
    path = os.path.join(tmp, "vllm-synthetic.log")
    try:
        t0 = time.perf_counter()
        size = write_log(path, int(args.size_mb * 1e6))
        gen_s = time.perf_counter() - t0
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        floor_before = floor_pass(path)
        t0 = time.perf_counter()
        result = loose.analyze_path(path)
        elapsed = time.perf_counter() - t0
        floor_s = (floor_before + floor_pass(path)) / 2
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        keys = {e.key: e.value for e in result.evidence}
        mb = size / 1e6
        print(f"log: {mb:.0f} MB written in {gen_s:.1f} s ({path if args.keep else 'deleted afterwards'})")
        print(f"analyze: {elapsed:.1f} s -> {mb / elapsed:.1f} MB/s")
        print(f"floor (read + count lines, before and after): {floor_s:.2f} s -> {mb / floor_s:.0f} MB/s; "
              f"analyze / floor: {elapsed / floor_s:.1f}x")
        print(f"peak RSS: {peak_kib / 1024:.0f} MiB (before analysis: {rss_before / 1024:.0f} MiB)")
        print(f"inputs: {[(i.kind, i.status) for i in result.inputs]}")
        print(f"stats lines: {keys.get('serving.stat_samples')}, waiting max: {keys.get('serving.waiting_max')}, "
              f"preemptions: {keys.get('serving.preemptions')}")
        if args.per_source > 0:
            per_source(path, int(args.per_source * 1e6))
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
