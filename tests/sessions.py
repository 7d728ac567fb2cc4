"""Session folders for report, dashboard and comparison tests.

``demo_session(name)``: a session recorded by ``diagnose demo`` (tests/data/sessions/NAME, CPU only).

``gpu_session(tmp_path)``: a session folder in the ``diagnose/session/v1`` format whose captures
carry GPU evidence in the formats the collectors write, copied from this repo's test data:

* the CPU files of a recorded demo session (py-spy, psutil, the service's stage log, two
  ``/metrics`` scrapes);
* ``nvml.jsonl``: an NVML recording (tests/data/nvml, synthetic but in the recorder's format),
  its clock moved onto the session's window so that the samples fall inside it;
* ``nsys-window.sqlite``: a real Nsight Systems export (tests/data/nsys, RTX 4060 Ti);
* ``probe-0-stages.jsonl``: the in-process probe's lines (``diagnose.collectors.torch_probe``): allocator
  state every second, compile counters with two recompiles, and an OOM with its allocator state;
* ``oom-snapshot.pickle``: a CUDA memory snapshot (tests/data/snapshots, fragmentation OOM);
* ``trace.pt.trace.json.gz``: a real PyTorch-profiler trace (tests/data/kineto: an SGLang decode step on
  MI300X, listed after the Nsight export, whose ``trace.*`` keys therefore stay the ones judged): the
  busy/idle timeline.

``demo_copy`` / ``add_log``: a writable demo session with more logs listed in its manifest (a second
worker's stage log reusing request ids, ``TORCH_LOGS`` recompiles with and without times, vLLM
preemption warnings: ``second_worker_lines``, ``torch_log_lines``, ``vllm_preemption_lines``).

The target's command line (in the manifest and in the py-spy profile's process lines) carries a
fake API key, ``SECRET``, so that tests can check that no report shows it.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
SESSIONS = os.path.join(DATA, "sessions")
DEMOS = ("cpu_preprocess_jpeg_demo", "healthy_light_load_demo", "prefill_long_prompts_demo",
         "queueing_one_worker_demo", "recompile_varying_batch_demo")

SECRET = "sk-diagnoseFAKEtestKEY0123456789abcdef"
NVML_RECORDING = os.path.join(DATA, "nvml", "starved_a10g_bursty.jsonl")
NSYS_EXPORT = os.path.join(DATA, "nsys", "pinned_copy_bound_vector_add_rtx4060ti_nsys2026_1.sqlite")
SNAPSHOT = os.path.join(DATA, "snapshots", "oom_fragmentation.pickle")
KINETO_TRACE = os.path.join(DATA, "kineto", "sync_stall_sglang_decode_hipgraph_mi300x.json.gz")
NVML_FILE = "nvml.jsonl"
NSYS_FILE = "nsys-window.sqlite"
PROBE_FILE = "probe-0-stages.jsonl"
SNAPSHOT_FILE = "oom-snapshot.pickle"
KINETO_FILE = "trace.pt.trace.json.gz"
CPU_FILES = ("process.jsonl", "process-info.json", "pyspy.raw", "pyspy.log", "pyspy-dumps.jsonl", "pyspy-meta.json")

GIB = 1 << 30
A10G_TOTAL = 24_146_608_128  # NVML's total for the A10G of the NVML recording
WEIGHTS = 2 * GIB  # the snapshot's parameter blocks
PROBE_STATES = 7  # allocator readings, one a second
OOM_FREE = 200 * (1 << 20)
OOM_MESSAGE = ("CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 22.49 GiB of which "
               "200.00 MiB is free. Including non-PyTorch memory, this process has 22.27 GiB memory in use. Of the "
               "allocated memory 5.91 GiB is allocated by PyTorch, and 6.09 GiB is "
               "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
               "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def demo_session(name: str = "prefill_long_prompts_demo") -> str:
    """The folder of a recorded demo session (read-only test data)."""
    path = os.path.join(SESSIONS, name)
    if not os.path.isfile(os.path.join(path, "manifest.json")):
        raise FileNotFoundError(f"no recorded session {name!r}; the demos are {', '.join(DEMOS)}")
    return path


def _read_manifest(folder: str) -> dict[str, Any]:
    with open(os.path.join(folder, "manifest.json"), encoding="utf-8") as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


def _shift_nvml(src: str, dst: str, start: float) -> None:
    """Copy an NVML recording, moving its clock (the ``now`` calls) so that it begins at ``start``."""
    with open(src, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    offset: float | None = None
    out: list[str] = []
    for line in lines:
        doc = json.loads(line)
        if doc.get("fn") == "now" and isinstance(doc.get("ok"), int | float):
            if offset is None:
                offset = start - float(doc["ok"])
            doc["ok"] = round(float(doc["ok"]) + offset, 4)
            line = json.dumps(doc, separators=(",", ":"))
        out.append(line)
    with open(dst, "w", encoding="utf-8") as fh:
        fh.write("\n".join(out) + "\n")


def _device_state(allocated: int, reserved: int, inactive: int, retries: int, ooms: int,
                  free: int | None = None) -> dict[str, Any]:
    """One device of ``torch_probe.cuda_memory_state()``: the allocator's counters and mem_get_info."""
    return {
        "allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": allocated,
        "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": reserved,
        "active_bytes.all.current": allocated, "inactive_split_bytes.all.current": inactive,
        "num_alloc_retries": retries, "num_ooms": ooms,
        # the CUDA context and other libraries hold about 1 GiB
        "free_bytes": A10G_TOTAL - reserved - 1 * GIB if free is None else free,
        "total_bytes": A10G_TOTAL, "weights_bytes": WEIGHTS,
    }


def probe_lines(start: float, end: float) -> list[dict[str, Any]]:
    """The probe's periodic and event lines over [start, end] (the formats of ``diagnose.collectors.torch_probe``)."""
    lines: list[dict[str, Any]] = []
    step = (end - start) / (PROBE_STATES + 1)
    recompiles = 0
    for i in range(PROBE_STATES):
        ts = round(start + step * (i + 0.5), 4)
        allocated = 4 * GIB + i * 300 * (1 << 20)
        reserved = 8 * GIB + i * 680 * (1 << 20)
        inactive = reserved - allocated - 256 * (1 << 20)
        state = {"devices": {"0": _device_state(allocated, reserved, inactive, i // 3, 0)},
                 "alloc_conf": "", "expandable_segments": False}
        lines.append({"ts": ts, "cuda_memory": state})
        if i in (2, 4):  # a new batch size: dynamo recompiles the forward
            recompiles += 1
            delta = {"stats.unique_graphs": 1, "recompiles.recompiles": 1}
            lines.append({"ts": round(ts + 0.01, 4), "compile": {
                "counters": {"stats.unique_graphs": 1 + recompiles, "recompiles.recompiles": recompiles},
                "delta": delta, "compiles": 1 + recompiles, "recompiles": recompiles, "recompile_limit_hits": 0,
                "recent_reasons": [f"tensor 'L['x']' size mismatch at index 0. expected {8 * recompiles}, "
                                   f"actual {8 * (recompiles + 1)}"]}})
    oom_ts = round(start + step * (PROBE_STATES + 0.5), 4)
    oom_state = {"devices": {"0": _device_state(6_341_787_648, 12_884_901_888, 6_543_114_240, 3, 1, OOM_FREE)},
                 "alloc_conf": "", "expandable_segments": False}
    lines.append({"ts": oom_ts, "oom": {"message": OOM_MESSAGE, "cuda_memory": oom_state, "snapshot": SNAPSHOT_FILE}})
    lines.append({"ts": round(oom_ts + 0.05, 4), "probe": {"version": "1", "written": 9, "dropped": 0, "queued": 0,
                                                            "queue_size": 10000, "recompiles": recompiles}})
    return lines


def gpu_session(tmp_path: Any, cpu_demo: str = "prefill_long_prompts_demo", name: str = "gpu_session") -> str:
    """Build the GPU-evidence session folder under ``tmp_path``; returns its path."""
    src = demo_session(cpu_demo)
    folder = os.path.join(str(tmp_path), name)
    os.makedirs(folder)
    base = _read_manifest(src)
    window = base["window"]
    start, end = float(window["start"]), float(window["end"])
    cmdline = [*base["target"]["cmdline"], "--api-key", SECRET]

    for f in CPU_FILES:
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(folder, f))
    with open(os.path.join(folder, "pyspy.raw"), encoding="utf-8") as fh:
        raw = fh.read()
    old = " ".join(base["target"]["cmdline"])
    with open(os.path.join(folder, "pyspy.raw"), "w", encoding="utf-8") as fh:
        fh.write(raw.replace(f'"{old}"', f'"{old} --api-key {SECRET}"'))
    captures: list[dict[str, Any]] = []
    for recorded in base["captures"]:
        if recorded["collector"] == "nvml":
            continue
        for f in recorded["files"]:
            if f not in CPU_FILES:
                shutil.copy(os.path.join(src, f), os.path.join(folder, f))
        captures.append(recorded)

    _shift_nvml(NVML_RECORDING, os.path.join(folder, NVML_FILE), start + 0.1)
    shutil.copy(NSYS_EXPORT, os.path.join(folder, NSYS_FILE))
    shutil.copy(SNAPSHOT, os.path.join(folder, SNAPSHOT_FILE))
    with open(os.path.join(folder, PROBE_FILE), "w", encoding="utf-8") as fh:
        for doc in probe_lines(start, end):
            fh.write(json.dumps(doc) + "\n")

    def cap(collector: str, *files: str) -> dict[str, Any]:
        return {"collector": collector, "status": "ok", "reason": "", "remedy": "",
                "window": {"start": start, "end": end}, "files": list(files)}

    shutil.copy(KINETO_TRACE, os.path.join(folder, KINETO_FILE))
    captures += [cap("nvml", NVML_FILE), cap("nsys", NSYS_FILE), cap("probe", PROBE_FILE, SNAPSHOT_FILE),
                 cap("kineto", KINETO_FILE)]
    target = dict(base["target"], cmdline=cmdline, gpus=["0"])
    files = sorted({f for c in captures for f in c["files"]})
    manifest = {"schema": "diagnose/session/v1", "tool_version": base.get("tool_version", "0.1.0"),
                "target": target, "window": window, "captures": captures, "files": files}
    with open(os.path.join(folder, "manifest.json"), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2)
    return folder


def pack(folder: str, dest_dir: str) -> str:
    """``folder`` as a ``.tar.gz`` (the session folder at its top) in ``dest_dir``; returns its path."""
    import tarfile

    out = os.path.join(dest_dir, os.path.basename(folder.rstrip("/")) + ".tar.gz")
    with tarfile.open(out, "w:gz") as tar:
        tar.add(folder, arcname=os.path.basename(folder.rstrip("/")))
    return out


def empty_session(tmp_path: Any, name: str = "empty_session") -> str:
    """A session whose every capture was skipped (no py-spy, no process samples, no GPU): all tables empty."""
    folder = os.path.join(str(tmp_path), name)
    os.makedirs(folder)
    window = {"start": 1796018609.0, "end": 1796018615.0}

    def skipped(collector: str, reason: str, remedy: str) -> dict[str, Any]:
        return {"collector": collector, "status": "skipped", "reason": reason, "remedy": remedy, "window": window,
                "files": []}

    captures = [
        skipped("py-spy", "py-spy is not installed", "pip install py-spy (it ships as a wheel)"),
        skipped("process", "not permitted to read process 4242", "run as the same user or as root"),
        skipped("nvml", "no NVIDIA driver on this machine (the NVML library libnvidia-ml.so.1 was not found)",
                "Run diagnose on the GPU host."),
    ]
    manifest = {"schema": "diagnose/session/v1", "tool_version": "0.1.0",
                "target": {"pid": 4242, "cmdline": ["python", "serve.py", "--api-key", SECRET], "python": "",
                           "user": "", "gpus": [], "children": []},
                "window": window, "captures": captures, "files": []}
    with open(os.path.join(folder, "manifest.json"), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2)
    return folder


def demo_copy(tmp_path: Any, name: str = "session", cpu_demo: str = "prefill_long_prompts_demo") -> str:
    """A writable copy of a recorded demo session under ``tmp_path``; returns its path."""
    folder = os.path.join(str(tmp_path), name)
    shutil.copytree(demo_session(cpu_demo), folder)
    return folder


def add_log(folder: str, filename: str, lines: list[str], collector: str = "log") -> str:
    """Write ``lines`` to ``folder/filename`` and list the file under the ``collector`` capture of the manifest."""
    with open(os.path.join(folder, filename), "w", encoding="utf-8") as fh:
        fh.write("".join(line + "\n" for line in lines))
    manifest = _read_manifest(folder)
    cap = next((c for c in manifest["captures"] if c["collector"] == collector), None)
    if cap is None:
        cap = {"collector": collector, "status": "ok", "reason": "", "remedy": "",
               "window": manifest["window"], "files": []}
        manifest["captures"].append(cap)
    cap["files"].append(filename)
    manifest["files"] = sorted({*manifest.get("files", ()), filename})
    with open(os.path.join(folder, "manifest.json"), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=2)
    return os.path.join(folder, filename)


def add_file(folder: str, filename: str, data: bytes, collector: str = "log") -> str:
    """Write ``data`` to ``folder/filename`` (a trace, an export) and list it under ``collector``."""
    path = add_log(folder, filename, [], collector)
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def window_of(folder: str) -> tuple[float, float]:
    w = _read_manifest(folder)["window"]
    return float(w["start"]), float(w["end"])


def second_worker_lines(folder: str, scale: float = 0.5) -> list[str]:
    """The stage log of a second worker that numbers its requests r-1, r-2, … too (the first worker's ids,
    every stage ``scale`` times as long)."""
    with open(os.path.join(folder, "log-0-stages.jsonl"), encoding="utf-8") as fh:
        docs = [json.loads(line) for line in fh if '"stages_ms"' in line]
    out = []
    for doc in docs:
        doc = dict(doc, stages_ms={k: round(v * scale, 3) for k, v in doc["stages_ms"].items()},
                   e2e_ms=round(doc["e2e_ms"] * scale, 3))
        out.append(json.dumps(doc))
    return out


def glog_time(ts: float) -> str:
    """``V1130 07:30:47.123456``: glog's prefix for epoch ``ts`` (local time, as TORCH_LOGS writes it)."""
    from datetime import datetime

    return datetime.fromtimestamp(ts).strftime("V%m%d %H:%M:%S.%f")


def torch_log_lines(timed: list[float], untimed: int = 0) -> list[str]:
    """``TORCH_LOGS=recompiles`` output: one glog-format recompile at each epoch time of ``timed`` (with
    its guard failure) and ``untimed`` recompiles in the old logging format, which carries no time."""
    lines: list[str] = []
    for i, ts in enumerate(timed, start=1):
        lines += [f"{glog_time(ts)} 140 torch/_dynamo/guards.py:2611] [0/{i}] [__recompiles] "
                  "Recompiling function forward in /app/model.py:12",
                  f"{glog_time(ts)} 140 torch/_dynamo/guards.py:2611] [0/{i}] [__recompiles]     "
                  "triggered by the following guard failure(s):",
                  f"{glog_time(ts)} 140 torch/_dynamo/guards.py:2611] [0/{i}] [__recompiles]     "
                  f"- 0/{i - 1}: tensor 'L['x']' size mismatch at index 0. expected {8 * i}, actual {8 * i + 8}"]
    lines += ["torch._dynamo.guards.__recompiles: [DEBUG] Recompiling function decode in /app/model.py:40"] * untimed
    return lines


def vllm_preemption_lines(n: int) -> list[str]:
    """vLLM scheduler warnings: ``n`` preemptions (the parser counts them; it reads no time from them)."""
    return [f"WARNING 11-30 07:30:{10 + i:02d} scheduler.py:1089] Sequence group {i} is preempted by "
            "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
            f"total_num_cumulative_preemption={i + 1}" for i in range(n)]
