"""A recorded session → ``diagnose.session_data.SessionData``: the one place that turns a session into tables.

This is the analyzer side of the reports: like the pipeline, it reads the session's raw files with
the collectors' own parsers (no second parser for a format) and the analyzer's derivations, then
hands the presenters (``reports``, ``dashboard``) plain bounded tables. The text captures (stage
logs, the probe's JSON lines, compile and engine logs, metrics scrapes) are read once, by the
pipeline, which derives their time series in the same pass as their evidence
(``diagnose.derive.series``); this joins those rows. ``load(path)`` opens a folder or packed
``.tar.gz`` and runs the pipeline for the diagnosis and the series; ``build`` fills the tables of an
already opened session. Every empty table gets a sentence in ``missing`` saying why and how to
get it; a file the manifest lists but the session lacks is named there, not passed over.
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from diagnose import pipeline, session_io
from diagnose.collectors import nvml, process, pyspy
from diagnose.derive import activities
from diagnose.derive import nvml as nvml_derive
from diagnose.derive.series import MAX_REQUESTS, FileSeries
from diagnose.derive.series import num as _num
from diagnose.documents import PICKLE_MAGIC, SQLITE_MAGIC
from diagnose.errors import InputError
from diagnose.model import Capture, CaptureStatus, Diagnosis, Session
from diagnose.redact import redact_command, redact_text
from diagnose.session_data import COLUMNS as TABLE_COLUMNS
from diagnose.session_data import TABLES, SessionData, make_table
from diagnose.stage_stats import stage_rows
from diagnose.units import KIB

MAX_STACKS = 300  # the py-spy stacks with the most samples
MAX_FRAMES = 40  # frames kept per stack (the innermost ones: they say what the CPU was doing)
MAX_PROCESS_ROWS = 20_000  # process samples × processes
MAX_GPU_ROWS = 20_000
MAX_EVENTS = 1_000
MAX_MEMORY_ROWS = 10_000
MAX_KERNELS = 50
MAX_METRICS = 500
MAX_TIMELINE_ROWS = 20_000  # 200 bins per device and rank: 100 devices
TEXT_CAPTURES = ("log", "metrics", "probe")
OK = (CaptureStatus.OK, CaptureStatus.PARTIAL)

PROBE_HINT = ("Add the in-process probe to the service (`from diagnose.collectors import torch_probe; "
              "torch_probe.install(PATH)`) and attach again")
NSYS_HINT = ("Start the service under `nsys launch` and attach with `diagnose attach --nsys` to record "
             "an Nsight Systems timeline")
LOST_HINT = "Copy the whole session folder (or its .tar.gz) again, or record the session again"


def load(path: str, config: Any = None) -> SessionData:
    """Read a session folder or packed ``.tar.gz``; ``InputError`` when it is not one. ``config``: an
    ``diagnose.config.Config`` (else the one the session recorded, else the defaults)."""
    if not isinstance(path, str) or not path:
        raise InputError("No session path was given.", "Pass a session folder written by `diagnose attach`.")
    with session_io.opened(path) as folder:
        session, derived = pipeline.read_session(folder, label=path, series=True)  # sources named after the .tar.gz
        diagnosis = pipeline.judge_session(folder, session, derived, config)
        return build(path, session, diagnosis, derived.series)


def build(path: str, session: Session, diagnosis: Diagnosis, series: Mapping[str, FileSeries]) -> SessionData:
    """The tables of an opened session (``session.path`` must still exist) and of the time series its
    derivation gave (``pipeline.read_session(..., series=True)``)."""
    data = SessionData(path=path, label=session_io.label(path), diagnosis=diagnosis, t0=session.window.start,
                       window_s=session.window.seconds)
    reader = _Reader(session, data, series)
    steps: tuple[tuple[Callable[[], None], tuple[str, ...]], ...] = (
        (reader.process, ("process", "inflight")), (reader.gpu, ("gpu", "gpu_processes")),
        (reader.profile, ("profile",)), (reader.text_captures, ("requests", "stages", "events", "memory", "metrics")),
        (reader.nsys, ("kernels", "copies", "gpu_busy", "gap_hist")), (reader.trace, ("gpu_timeline", "trace_ranks")),
        (reader.memory_breakdown, ("memory_breakdown", "memory_segments")), (reader.stage_stats, ("stage_stats",)))
    for step, tables in steps:
        try:
            step()
        except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged file: its tables stay empty
            for name in tables:
                reader.why[name] = (f"No {name.replace('_', ' ')} data: a file of the session could not be read "
                                    f"({type(exc).__name__}: {redact_text(str(exc))[:200]}). Record the session again.")
    reader.explain()
    return data


def _is_file_kind(path: str, magic: bytes) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read(len(magic)) == magic
    except OSError:
        return False


def _short_file(file: str) -> str:
    parts = file.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:]) if len(parts) > 1 else file


def _names(files: list[str]) -> str:
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    return f"{shown} but the file is not" if len(files) == 1 else f"{shown} but the files are not"


class _Reader:
    """Fills one ``SessionData`` from the session's files, noting why each table is empty."""

    def __init__(self, session: Session, data: SessionData, series: Mapping[str, FileSeries]) -> None:
        self.s = session
        self.d = data
        self.series = series
        self.caps: dict[str, list[Capture]] = {}
        for c in session.captures:
            self.caps.setdefault(c.collector, []).append(c)
        self.why: dict[str, str] = {}

    # -- helpers --------------------------------------------------------------------------------

    def cap(self, name: str) -> Capture | None:
        caps = self.caps.get(name)
        return caps[0] if caps else None

    def listed(self, collectors: Iterable[str]) -> list[str]:
        """The files the manifest lists for the usable captures of ``collectors``, present or not."""
        out: list[str] = []
        for name in collectors:
            for c in self.caps.get(name, ()):
                if c.status in OK:
                    out.extend(c.files)
        return list(dict.fromkeys(out))

    def ok_files(self, collectors: Iterable[str]) -> list[str]:
        paths = (os.path.join(self.s.path, f) for f in self.listed(collectors))
        return [p for p in paths if os.path.isfile(p)]

    def lost(self, collectors: Iterable[str], keep: Callable[[str], bool] = lambda f: True) -> list[str]:
        """The files the manifest lists for ``collectors`` that are not in the session folder."""
        return [f for f in self.listed(collectors) if keep(f) and not os.path.isfile(os.path.join(self.s.path, f))]

    def lost_sentence(self, collectors: Iterable[str], keep: Callable[[str], bool] = lambda f: True) -> str:
        """``the session's manifest lists X but the file is not in the session``, or ""."""
        files = self.lost(collectors, keep)
        return f"the session's manifest lists {_names(files)} in the session folder" if files else ""

    def not_recorded(self, name: str, what: str, hint: str, needed: str = "") -> str:
        """Why collector ``name`` gave nothing: its own reason and remedy when it was skipped or failed,
        or the file ``needed`` that its capture lists but the session lacks."""
        c = self.cap(name)
        if c is None:
            return f"{what}: the session has no {name} capture. {hint}."
        if c.status not in OK:
            reason = redact_text(c.reason) or f"the {name} capture {c.status.value}"
            remedy = redact_text(c.remedy) or hint
            return f"{what}: {reason.rstrip('.')}. {remedy[:1].upper()}{remedy[1:].rstrip('.')}."
        if needed and needed in self.lost((name,)):
            return f"{what}: the session's manifest lists {_names([needed])} in the session folder. {LOST_HINT}."
        return ""

    def rel(self, t: float) -> float:
        return t - self.d.t0

    # -- psutil ---------------------------------------------------------------------------------

    def process(self) -> None:
        d = self.d
        why = self.not_recorded("process", "No process samples", "Attach with `diagnose attach --pid PID`",
                                needed=process.SAMPLES_FILE)
        if why:
            self.why["process"] = why
            self.why["inflight"] = why.replace("No process samples", "No in-flight request counts", 1)
            return
        folder = self.s.path
        samples = process.read_samples(os.path.join(folder, process.SAMPLES_FILE))
        info_path = os.path.join(folder, process.INFO_FILE)
        info: dict[str, Any] = {}
        if os.path.isfile(info_path):
            with open(info_path, encoding="utf-8") as fh:
                doc = json.load(fh)
            info = doc if isinstance(doc, dict) else {}
        cores = int(info.get("cores") or 0) or None
        host = int(info.get("host_cpus") or 0) or cores
        d.host_cores = cores or host
        rows: list[dict[str, Any]] = []
        conn_rows: list[dict[str, Any]] = []
        prev: dict[int, tuple[float, float]] = {}
        listened = False
        for rec in samples:
            ts = _num(rec.get("ts"))
            if math.isnan(ts):
                continue
            for p in rec.get("processes") or ():
                if not isinstance(p, dict) or "pid" not in p:
                    continue
                pid = int(p["pid"])
                cpu = _num(p.get("cpu_user")) + _num(p.get("cpu_system"))
                used = math.nan
                if pid in prev and ts > prev[pid][0] and not math.isnan(cpu):
                    used = max(0.0, (cpu - prev[pid][1]) / (ts - prev[pid][0]))
                    if host:
                        used = min(used, float(host))  # cpu_times tick at 10 ms: a short interval can overshoot
                if not math.isnan(cpu):
                    prev[pid] = (ts, cpu)
                rows.append({"t": self.rel(ts), "pid": pid, "name": redact_text(str(p.get("name") or "")),
                             "cpu_cores": used, "rss_bytes": _num(p.get("rss")),
                             "threads": _num(p.get("num_threads"))})
            conn = rec.get("conn")
            if isinstance(conn, dict) and conn.get("listen_ports"):
                listened = True
                conn_rows.append({"t": self.rel(ts), "inflight": _num(conn.get("inflight")),
                                  "accept_queue": _num(conn.get("accept_queue"))})
        d.process = make_table("process", rows[-MAX_PROCESS_ROWS:])
        d.inflight = make_table("inflight", conn_rows[-MAX_PROCESS_ROWS:])
        if not rows:
            self.why["process"] = ("No process samples: process.jsonl holds no readable sample (the target "
                                   "exited as the window began?). Attach again while the service runs.")
        if not conn_rows:
            self.why["inflight"] = (
                "No in-flight request counts: the target's process tree listens on no TCP port"
                if samples and not listened else "No in-flight request counts: there are no process samples"
            ) + ". Attach to the server process itself (the one that accepts the connections)."

    # -- NVML -----------------------------------------------------------------------------------

    def gpu(self) -> None:
        d = self.d
        why = self.not_recorded("nvml", "No NVML samples", "Run diagnose on the GPU host", needed=nvml.NVML_FILE)
        if why:
            self.why["gpu"] = self.why["gpu_processes"] = why
            return
        samples = nvml.read_samples(os.path.join(self.s.path, nvml.NVML_FILE))
        reason = nvml_derive.missing_reason(samples)
        rows: list[dict[str, Any]] = []
        for dev, series in sorted(nvml_derive.target_devices(samples).items()):
            for ts, r in series:
                tx, rx = _num(r.get("pcie_tx_kbps")), _num(r.get("pcie_rx_kbps"))
                rows.append({
                    "t": self.rel(ts), "gpu": dev, "name": redact_text(str(r.get("name") or "")),
                    "util_pct": _num(r.get("util_gpu_pct")), "mem_util_pct": _num(r.get("util_mem_pct")),
                    "mem_used_bytes": _num(r.get("mem_used_bytes")), "mem_total_bytes": _num(r.get("mem_total_bytes")),
                    "pcie_tx_bytes_s": tx * KIB, "pcie_rx_bytes_s": rx * KIB,
                    "power_w": _num(r.get("power_mw")) / 1000.0, "sm_clock_mhz": _num(r.get("sm_clock_mhz")),
                })
        rows.sort(key=lambda r: (r["t"], r["gpu"]))
        d.gpu = make_table("gpu", rows[-MAX_GPU_ROWS:])
        pids = {self.s.target.pid, *self.s.target.children}
        if samples:
            for s in samples:
                pids.update(int(p) for p in (*s.get("tree", ()), *s.get("tree_ids", ())))
        procs: list[dict[str, Any]] = []
        if samples:
            for dev in samples[-1].get("devices") or ():
                for p in dev.get("processes") or ():
                    pid = int(p.get("pid", -1))
                    procs.append({"gpu": int(dev.get("index", -1)), "pid": pid,
                                  "name": redact_text(str(p.get("name") or "")),
                                  "used_bytes": _num(p.get("used_bytes")),
                                  "is_target": bool(p.get("is_target")) or pid in pids})
        d.gpu_processes = make_table("gpu_processes", procs)
        if not rows:
            self.why["gpu"] = f"No NVML samples of the target's GPUs: {reason or 'NVML recorded no reading'}. " \
                              "Attach on the host (or container) where the service's GPUs are visible."
        if not procs:
            self.why["gpu_processes"] = (f"No GPU processes: {reason}." if reason else
                                         "No GPU processes: NVML listed no process holding GPU memory.") + \
                " Attach while the service holds its CUDA context, on the host where its GPUs are visible."

    # -- py-spy ---------------------------------------------------------------------------------

    def profile(self) -> None:
        why = self.not_recorded("py-spy", "No CPU profile", "pip install py-spy and attach again",
                                needed=pyspy.RAW_FILE)
        if why:
            self.why["profile"] = why
            return
        raw = os.path.join(self.s.path, pyspy.RAW_FILE)
        with open(raw, encoding="utf-8", errors="replace") as fh:
            samples = pyspy.parse_raw(fh)
        agg: Counter[tuple[int, str, int, str, str, tuple[str, ...]]] = Counter()
        commands: dict[str, str] = {}
        for s in samples:
            act = activities.classify([(f.function, f.file) for f in s.frames]).value
            frames = tuple(f"{f.function} ({_short_file(f.file)}:{f.line})" if f.file else f.function
                           for f in s.frames)[-MAX_FRAMES:]
            if s.process not in commands:
                cmd = redact_command(s.process)  # redacted first: a cut must not leave half a secret
                commands[s.process] = cmd if len(cmd) <= 120 else cmd[:119] + "…"
            thread = redact_text(s.thread) if s.thread else f"thread {s.tid}"
            agg[(s.pid, commands[s.process], s.tid, thread, act, tuple(redact_text(f) for f in frames))] += s.count
        rows = [{"pid": k[0], "process": k[1], "tid": k[2], "thread": k[3], "activity": k[4], "frames": k[5],
                 "samples": n} for k, n in agg.most_common(MAX_STACKS)]
        self.d.profile = make_table("profile", rows)
        self.d.profile_samples = sum(agg.values())
        self.d.profile_stacks = len(agg)
        if not rows:
            self.why["profile"] = ("No CPU profile: py-spy recorded no active Python sample in the window (the "
                                   "service was idle). Attach while it serves load.")

    # -- stage logs, probe lines, metrics scrapes, compile and engine logs ------------------------

    def text_captures(self) -> None:
        d = self.d
        requests: list[dict[str, Any]] = []
        stages: list[tuple[int, list[tuple[str, float]]]] = []
        memory: list[dict[str, Any]] = []
        events: list[dict[str, Any]] = []
        logged_recompiles: list[dict[str, Any]] = []  # from TORCH_LOGS: used when the probe logged none
        metrics_rows: list[dict[str, Any]] = []
        seq = 0  # the session's requests are numbered across its files
        for name in self.listed(TEXT_CAPTURES):
            got = self.series.get(name)
            if got is None:  # not in the session, or a document (an Nsight export, a snapshot), not text
                continue
            if got.error:
                raise ValueError(f"{got.name}: {got.error}")
            for req, parts in zip(got.requests, got.stages, strict=True):
                n = seq + int(req["seq"])
                rid = req["request_id"]
                requests.append({**req, "request_id": f"#{n}" if rid is None else rid, "order": n, "seq": n})
                stages.append((n, parts))
            seq += got.n_requests
            memory.extend(got.memory)
            events.extend(got.events)
            logged_recompiles.extend(got.logged_recompiles)
            metrics_rows.extend(got.metrics)
        if not any(e["kind"] == "recompile" for e in events):  # the probe's and TORCH_LOGS' are the same ones
            events.extend(logged_recompiles)
        pre = next((r for r in metrics_rows if r["name"] == "preemptions"), None)
        if pre is not None and _num(pre["delta"]) > 0 and not any(e["kind"] == "preemption" for e in events):
            events.append({"t": math.nan, "kind": "preemption", "count": int(pre["delta"]),
                           "detail": f"{pre['delta']:.0f} preemption(s) between the metrics scrapes"})
        requests = requests[-MAX_REQUESTS:]
        stages = stages[-MAX_REQUESTS:]
        # arrival order: completion time minus latency (the log is written at completion)
        arrival = sorted(range(len(requests)), key=lambda i: (_arrival(requests[i]), requests[i]["seq"]))
        for order, i in enumerate(arrival):
            requests[i]["order"] = order
        ids = {r["seq"]: r["request_id"] for r in requests}
        d.requests = make_table("requests", requests)
        d.stages = make_table("stages", [{"request_id": ids[s], "stage": st, "ms": ms, "position": pos, "seq": s}
                                         for s, parts in stages for pos, (st, ms) in enumerate(parts)])
        timed = sorted((e for e in events if not math.isnan(e["t"])), key=lambda e: e["t"])
        untimed_events = [e for e in events if math.isnan(e["t"])][:MAX_EVENTS]  # a few totals: always kept
        d.events = make_table("events", timed[:MAX_EVENTS - len(untimed_events)] + untimed_events)
        memory.sort(key=lambda r: (math.isnan(r["t"]), r["t"] if not math.isnan(r["t"]) else 0.0, r["device"]))
        d.memory = make_table("memory", memory[-MAX_MEMORY_ROWS:])
        d.metrics = make_table("metrics", metrics_rows[:MAX_METRICS])
        lost = self.lost_sentence(TEXT_CAPTURES)
        lost_note = f" ({lost})" if lost else ""
        if not requests:
            if lost:  # the likeliest cause: name the file, not "no stages_ms line"
                logs = lost
                remedy = ("Copy the whole session folder (or its .tar.gz) again, or pass the service's stage log "
                          "with `diagnose attach --log PATH`.")
            else:
                logs = ("no `stages_ms` line is in the session's logs" if self.caps.get("log") or self.caps.get("probe")
                        else "the session has no log of the service")
                remedy = f"{PROBE_HINT} (it writes one line per request), or pass the service's stage log " \
                         "with `diagnose attach --log PATH`."
            self.why["requests"] = self.why["stages"] = f"No per-request timings: {logs}. {remedy}"
        if not events:
            self.why["events"] = ("No recompile, OOM or preemption events were recorded in the window (none "
                                  f"happened, or nothing logged them){lost_note}. The probe logs compiles and OOMs; "
                                  "pass a `TORCH_LOGS=recompiles` or engine log with `--log PATH` to see them.")
        if not memory:
            self.why["memory"] = ("No CUDA allocator readings over time: they come from the in-process probe "
                                  f"of a service that uses CUDA{lost_note}. {PROBE_HINT} on the GPU host.")
        if not metrics_rows:
            lost_metrics = self.lost_sentence(("metrics",))
            failed = self.not_recorded("metrics", "No Prometheus metrics", "Check the metrics URL") \
                if self.caps.get("metrics") else ""
            self.why["metrics"] = failed or (
                f"No Prometheus metrics: {lost_metrics}. {LOST_HINT}." if lost_metrics else
                "No Prometheus metrics: the session holds no scrape of a known serving metric. "
                "Pass the service's endpoint with `diagnose attach --metrics URL/metrics`.")

    # -- Nsight Systems ---------------------------------------------------------------------------

    def nsys(self) -> None:
        d = self.d
        exports = [p for p in self.ok_files(("nsys", "probe", "log")) if _is_file_kind(p, SQLITE_MAGIC)]
        names = ("kernels", "copies", "gpu_busy", "gap_hist")
        if not exports:
            lost = self.lost_sentence(("nsys",))
            why = self.not_recorded("nsys", "No Nsight Systems timeline", NSYS_HINT) or (
                f"No Nsight Systems timeline: {lost}. {LOST_HINT}." if lost else
                "No Nsight Systems timeline: the nsys capture wrote no SQLite export. " + NSYS_HINT + ".")
            for n in names:
                self.why[n] = why
            return
        from diagnose.collectors import nsys  # sqlite3 + numpy: only for a session that has an export

        kernels: list[dict[str, Any]] = []
        copies: dict[tuple[str, str, str], list[float]] = {}
        busy: list[dict[str, Any]] = []
        hist: list[dict[str, Any]] = []
        problems: list[str] = []
        for path in exports:
            try:
                trace = nsys.read_export(path, top_kernels=MAX_KERNELS, name_filter=redact_text)
            except nsys.NsysError as exc:
                problems.append(f"{os.path.basename(path)}: {redact_text(str(exc))}")
                continue
            kernel_ns = sum(k.total_ns for k in trace.kernels) or 1
            all_kernel_ns = sum(dv.kernel_ns for dv in trace.devices) or kernel_ns
            for k in trace.kernels:
                kernels.append({"name": redact_text(k.name)[:120], "count": k.count, "total_ms": k.total_ns / 1e6,
                                "share": k.total_ns / all_kernel_ns, "tiny_count": k.tiny_count})
            for c in trace.copies:
                acc = copies.setdefault((c.direction, c.host_kind, c.api), [0.0, 0.0, 0.0])
                acc[0] += c.count
                acc[1] += c.bytes
                acc[2] += c.ns / 1e6
            for dv in trace.devices:
                busy.append({"device": dv.device, "name": redact_text(dv.name), "window_ms": dv.window_ns / 1e6,
                             "busy_ms": dv.busy_ns / 1e6, "kernel_busy_ms": dv.kernel_busy_ns / 1e6,
                             "idle_ms": dv.gaps.total_ns / 1e6, "gaps": dv.gaps.count,
                             "longest_gap_ms": dv.gaps.longest_ns / 1e6})
                for i, bucket in enumerate(nsys.GAP_BUCKETS):
                    hist.append({"device": dv.device, "bucket": bucket, "count": dv.gaps.hist_count[i],
                                 "total_ms": dv.gaps.hist_ns[i] / 1e6})
        kernels.sort(key=lambda r: -r["total_ms"])
        d.kernels = make_table("kernels", kernels[:MAX_KERNELS])
        d.copies = make_table("copies", sorted(
            ({"direction": k[0], "host_kind": k[1], "api": k[2], "count": int(v[0]), "bytes": int(v[1]), "ms": v[2]}
             for k, v in copies.items() if v[0] > 0), key=lambda r: -r["bytes"]))
        d.gpu_busy = make_table("gpu_busy", busy)
        d.gap_hist = make_table("gap_hist", hist)
        bad = f" ({'; '.join(problems)[:300]})" if problems else ""
        for n in names:
            if not self.d.has(n):
                what = {"kernels": "no CUDA kernel", "copies": "no memory copy", "gpu_busy": "no GPU activity",
                        "gap_hist": "no GPU activity"}[n]
                self.why[n] = (f"No {n.replace('_', ' ')} data: the Nsight Systems export holds {what}{bad}. "
                               "Trace CUDA (`nsys launch --trace=cuda,nvtx`) while the service serves load.")

    # -- PyTorch-profiler traces --------------------------------------------------------------------

    def trace(self) -> None:
        """The busy/idle timeline and the ranks of the session's traces, from the diagnosis's evidence
        (``kineto.timeline``: ``diagnose.derive.kineto`` bins each device's window; several ranks:
        ``kineto.ranks.table``, each rank's timeline with it)."""
        from diagnose.derive import ranks as rank_derive

        d = self.d
        ev = {e.key: e for e in d.diagnosis.evidence}
        several = ev.get("kineto.ranks.table")
        found: list[dict[str, Any]] = []
        if several is not None and isinstance(several.value, list):
            found = [r for r in several.value if isinstance(r, dict)]
        elif (one := rank_derive.row(ev)) is not None:  # one trace: its own row (only kineto.* keys are read)
            found = [one]
        d.trace_ranks = make_table("trace_ranks", [{k: r.get(k) for k in TABLE_COLUMNS["trace_ranks"]} for r in found])
        rows: list[dict[str, Any]] = []
        for r in found:
            rank, source = r.get("rank"), str(r.get("source") or "")
            for dev in r.get("devices") or []:
                bins = dev.get("busy_bins") if isinstance(dev, dict) else None
                window = _num(dev.get("window_ms")) if isinstance(dev, dict) else math.nan
                if not bins or not window > 0:
                    continue
                width = window / len(bins)
                rows.extend({"rank": rank, "device": dev.get("device"), "name": redact_text(str(dev.get("name") or "")),
                             "t_ms": (i + 0.5) * width, "busy_ratio": _num(b), "window_ms": window, "source": source}
                            for i, b in enumerate(bins))
        d.gpu_timeline = make_table("gpu_timeline", rows[:MAX_TIMELINE_ROWS])
        how = ("Take one with torch.profiler (activities=[CPU, CUDA], prof.export_chrome_trace(...)) or the "
               "serving engine's profiler (vLLM: VLLM_TORCH_PROFILER_DIR and /start_profile); `diagnose analyze "
               "TRACE` reads it on its own.")
        if not rows:
            self.why["gpu_timeline"] = (
                "No GPU busy/idle timeline: it is drawn from a PyTorch-profiler trace in the session (a trace file "
                "listed under its kineto or log capture) whose GPU timeline could be judged (not an excerpt or a "
                f"CUDA-graph capture). {how}")
        if not found:
            self.why["trace_ranks"] = ("No temporal breakdown per rank: it comes from a PyTorch-profiler trace with "
                                       f"GPU events in the session. {how}")

    # -- memory breakdown -------------------------------------------------------------------------

    def memory_breakdown(self) -> None:
        d = self.d
        rows: list[dict[str, Any]] = []
        snaps = [p for p in self.ok_files(("probe", "log", "snapshot", "nsys")) if _is_file_kind(p, PICKLE_MAGIC)]
        if snaps:
            from diagnose.collectors import snapshot  # restricted unpickler: loaded only for a session with a snapshot

            for path in snaps:
                try:
                    b = snapshot.load_breakdown(path)
                except snapshot.SnapshotError:
                    continue
                if not b.segments:
                    continue
                src = f"CUDA memory snapshot {os.path.basename(path)}"
                for part, v in (("weights", b.weights_bytes), ("activations", b.activations_bytes),
                                ("fragmentation", b.inactive_split_bytes), ("cached", b.free_segments_bytes),
                                ("other", b.other_bytes)):
                    rows.append({"part": part, "bytes": float(v), "source": src})
                d.memory_segments = make_table("memory_segments", b.segment_rows)
                rows.extend(_free_rows(d.diagnosis, float(b.reserved_bytes)))
                break
        if not rows:
            rows = _breakdown_from_evidence(d.diagnosis)
        d.memory_breakdown = make_table("memory_breakdown", [r for r in rows if r["bytes"] >= 0])
        if not d.has("memory_segments"):
            self.why["memory_segments"] = ("No allocator segments: the session holds no CUDA memory snapshot. "
                                           "Dump one with `torch.cuda.memory._dump_snapshot('snap.pickle')` (the "
                                           "probe writes one at an OOM) and pass it with `--log snap.pickle`.")
        if not rows:
            lost = self.lost_sentence(("probe", "log", "snapshot", "nsys"),
                                      keep=lambda f: f.endswith((".pickle", ".pkl")))
            self.why["memory_breakdown"] = (
                "No GPU memory breakdown: it needs a CUDA memory snapshot "
                "(`torch.cuda.memory._dump_snapshot`), the probe's allocator readings or an OOM message"
                + (f" ({lost})" if lost else "") +
                f". {PROBE_HINT}, or pass the snapshot or OOM log with `--log PATH`.")

    # -- stage statistics -------------------------------------------------------------------------

    def stage_stats(self) -> None:
        rows = [{"stage": s, "p50_ms": _nan(p50), "p99_ms": _nan(p99), "share": _nan(share)}
                for s, p50, p99, share in stage_rows(self.d.diagnosis)]
        self.d.stage_stats = make_table("stage_stats", rows)
        if not rows:
            self.why["stage_stats"] = ("No stage timings in the evidence: no stage log, span log or serving "
                                       f"histogram gave per-stage latencies. {PROBE_HINT}, or pass a stage log "
                                       "with `diagnose attach --log PATH`.")

    def explain(self) -> None:
        for name in TABLES:
            if self.d.has(name):
                self.d.missing.pop(name, None)
            else:
                self.d.missing.setdefault(name, self.why.get(name) or f"No {name.replace('_', ' ')} data in this "
                                          "session. Attach again with the collector that records it.")


# ---------------------------------------------------------------------------------------------
# row builders (pure)
# ---------------------------------------------------------------------------------------------


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _arrival(req: Mapping[str, Any]) -> float:
    t = req["t_end"]
    if isinstance(t, float) and math.isnan(t):
        return float(req["seq"])
    return float(t) - float(req["e2e_ms"]) / 1000.0


def _ev_num(diagnosis: Diagnosis, key: str) -> float | None:
    for e in diagnosis.evidence:
        if e.key == key and isinstance(e.value, int | float) and not isinstance(e.value, bool):
            return float(e.value)
    return None


def _ev_source(diagnosis: Diagnosis, key: str) -> str:
    for e in diagnosis.evidence:
        if e.key == key:
            return redact_text(os.path.basename(e.source) or e.source)
    return ""


def _free_rows(diagnosis: Diagnosis, reserved: float) -> list[dict[str, Any]]:
    """Free device memory, and what neither the allocator nor the free pool holds (CUDA context, others)."""
    total, free = _ev_num(diagnosis, "mem.device_total_bytes"), _ev_num(diagnosis, "mem.device_free_bytes")
    total_src = _ev_source(diagnosis, "mem.device_total_bytes")
    rows: list[dict[str, Any]] = []
    if free is None and total is not None and total >= reserved:
        free = total - reserved
        rows.append({"part": "free", "bytes": free, "source": f"device total ({total_src}) minus reserved"})
    elif free is not None:
        rows.append({"part": "free", "bytes": free, "source": _ev_source(diagnosis, "mem.device_free_bytes")})
        if total is not None and total - reserved - free > 0:
            rows.append({"part": "outside_pytorch", "bytes": total - reserved - free,
                         "source": f"device total ({total_src}) − reserved − free: the CUDA context, "
                                   "non-PyTorch allocations and other processes"})
    return rows


def _breakdown_from_evidence(diagnosis: Diagnosis) -> list[dict[str, Any]]:
    """Weights / activations / KV / fragmentation / free from the probe's or an OOM message's numbers."""
    get: Callable[[str], float | None] = lambda k: _ev_num(diagnosis, k)  # noqa: E731
    allocated, reserved = get("mem.allocated_bytes"), get("mem.reserved_bytes")
    if allocated is None and reserved is None:
        return []
    src = _ev_source(diagnosis, "mem.allocated_bytes" if allocated is not None else "mem.reserved_bytes")
    rows: list[dict[str, Any]] = []
    weights = get("mem.weights_bytes")
    kv = get("mem.kv_cache_available_bytes")
    rest = allocated
    if weights is not None and allocated is not None and weights <= allocated:
        rows.append({"part": "weights", "bytes": weights, "source": _ev_source(diagnosis, "mem.weights_bytes")})
        rest = allocated - weights
    if kv is not None and rest is not None and kv <= rest:
        rows.append({"part": "kv_cache", "bytes": kv, "source": _ev_source(diagnosis, "mem.kv_cache_available_bytes")})
        rest -= kv
    if rest is not None:
        rows.append({"part": "activations" if weights is not None else "other", "bytes": rest, "source": src})
    frag = get("mem.reserved_minus_allocated_bytes")
    if frag is None and allocated is not None and reserved is not None:
        frag = max(0.0, reserved - allocated)
    if frag is not None:
        rows.append({"part": "fragmentation", "bytes": frag, "source": src})
    if reserved is not None:
        rows.extend(_free_rows(diagnosis, reserved))
    return rows
