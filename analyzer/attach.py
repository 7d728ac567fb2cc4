"""``diagnose attach``: watch a live service for a bounded window, read-only, then diagnose.

Safety: py-spy runs with ``--nonblocking`` (the target is never paused); psutil and /proc are
only read; the window is bounded (py-spy's own ``--duration`` plus a hard deadline). Ctrl-C ends
the window early and the session and verdict are still written from what was captured. If the
target exits during the window, what was captured is kept and marked partial.

Cost: the attach spends its budget where evidence comes from (``collectors.budget``): before the
window, two full process samples half a second apart say which processes use CPU and serve
requests; the window is then recorded in chunks, each re-planned from the latest samples. The
attach's own CPU over the window is measured and kept in the session (``attach-cost.json``).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import psutil

from analyzer import output, pipeline
from analyzer.config import Config
from analyzer.config import load as load_config
from analyzer.derive.session import ATTACH_COST as ATTACH_COST_FILE
from analyzer.derive.session import PYSPY_META
from analyzer.errors import AttachError, DiagnoseError
from analyzer.model import Availability, Capture, CaptureStatus, Diagnosis, Session, Target, Window
from analyzer.redact import redact_argv, redact_command, redact_text
from collectors import budget, nsys_session, pyspy
from collectors import cgroup as cgroup_collector
from collectors import nvml as nvml_collector
from collectors import process as process_collector
from collectors import snapshot as snapshot_collector
from reports import json_report

PROBE_S = 0.5  # before the window: two full process samples this far apart say what is busy
LOG_TAIL_BEFORE_BYTES = 256 * 1024  # how much of a log before the window is kept for context
LOG_MAX_BYTES = 64 * 1024 * 1024  # never copy more than this from one log


def _is_python(proc: psutil.Process) -> bool:
    try:
        names = [proc.name(), os.path.basename(proc.exe() or "")]
    except psutil.Error:
        names = []
    if any("python" in n.lower() for n in names):
        return True
    try:
        with open(f"/proc/{proc.pid}/maps", encoding="ascii", errors="replace") as fh:
            return any("libpython" in line for line in fh)
    except OSError:
        return False


def _ptrace_scope() -> int:
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope", encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return 0


def _has_cap_sys_ptrace() -> bool:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & (1 << 19))
    except (OSError, ValueError):
        pass
    return False


def check_target(pid: int) -> psutil.Process:
    """The target, or an ``AttachError`` naming the likely cause and what to do."""
    if pid <= 0 or not psutil.pid_exists(pid):
        raise AttachError(f"there is no process with pid {pid}.",
                          "Find the service's pid with `pgrep -f <name>` or `ps aux`.")
    try:
        proc = psutil.Process(pid)
        owner = proc.uids().real
    except psutil.NoSuchProcess as exc:
        raise AttachError(f"process {pid} exited before diagnose could attach.",
                          "Start the service again and attach while it runs.") from exc
    except psutil.AccessDenied as exc:
        raise AttachError(f"not permitted to read process {pid}.",
                          "Run diagnose as the service's user or as root.") from exc
    me = os.geteuid()
    privileged = me == 0 or _has_cap_sys_ptrace()
    if owner != me and not privileged:
        raise AttachError(
            f"process {pid} belongs to another user (uid {owner}) and attaching needs ptrace rights.",
            "Run as that user or with sudo; in a container add CAP_SYS_PTRACE "
            "(docker run --cap-add SYS_PTRACE, or `kubectl debug -it POD --profile=general "
            "--target=CONTAINER`).")
    if _ptrace_scope() >= 2 and not privileged:
        raise AttachError(
            f"ptrace is restricted on this host (kernel.yama.ptrace_scope={_ptrace_scope()}).",
            "Run as root or with CAP_SYS_PTRACE, or `sudo sysctl kernel.yama.ptrace_scope=1`.")
    tree = [proc, *proc.children(recursive=True)]
    if not any(_is_python(p) for p in tree):
        raise AttachError(
            f"process {pid} ({proc.name()}) is not a Python process and has no Python children.",
            "Attach to the Python service itself (e.g. the uvicorn/gunicorn master or a worker pid).")
    return proc


def default_output(pid: int) -> str:
    return f"diagnose-{pid}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"


def write_json_atomic(path: str, doc: Any) -> None:
    """Write, then rename: a crash never leaves a half-written file under ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


@dataclass
class LogTail:
    """Copies the part of a log written during the window, plus a tail before it."""

    path: str
    start_offset: int = 0

    def begin(self) -> None:
        size = os.path.getsize(self.path)
        self.start_offset = max(0, size - LOG_TAIL_BEFORE_BYTES)

    def finish(self, dest: str) -> None:
        """Copy from the start offset to the end, secrets redacted line by line, bounded in size."""
        left = LOG_MAX_BYTES
        with open(self.path, "rb") as src, open(dest, "w", encoding="utf-8") as out:
            src.seek(self.start_offset)
            if self.start_offset:
                src.readline()  # drop the partial first line
            for raw in src:
                left -= len(raw)
                if left < 0:
                    break
                out.write(redact_text(raw.decode("utf-8", errors="replace")))


def scrape(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        body: bytes = resp.read(16 * 1024 * 1024)
        return body.decode("utf-8", errors="replace")


@dataclass
class AttachOptions:
    pid: int
    duration_s: float = 10.0
    output: str | None = None
    rate_hz: int = budget.DEFAULT_MAX_RATE_HZ  # the ceiling; each process gets what its busy threads need
    light: bool = False  # for a host at 100 % CPU: the busiest process only, low rates, no dumps
    cgroup_root: str | None = None  # where the target's cgroup hierarchy is mounted, when not discovered
    logs: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    nsys: bool = False
    progress: Callable[[float, float], None] | None = None  # (elapsed, total)
    config: Config = field(default_factory=Config)  # rule settings (--config): recorded in the session
    force: bool = False  # --force: replace a session (or .tar.gz) already at output


def attach(opts: AttachOptions, stop: threading.Event | None = None) -> tuple[Session, Diagnosis]:
    """Record a session for ``opts.duration_s`` and diagnose it. Returns (session, diagnosis)."""
    if opts.duration_s <= 0 or opts.duration_s > 600:
        raise DiagnoseError("--duration must be between 0 and 600 seconds.", "Use e.g. --duration 10.")
    if not 1 <= opts.rate_hz <= 1000:
        raise DiagnoseError("--rate must be between 1 and 1000 samples per second.", "Use e.g. --rate 50.")
    for log in opts.logs:
        if not os.path.isfile(log):
            raise DiagnoseError(f"the log {log} does not exist.", "Pass the service's log file with --log.")
    check_target(opts.pid)
    if opts.cgroup_root is not None and not os.path.isdir(opts.cgroup_root):
        raise DiagnoseError(f"--cgroup-root {opts.cgroup_root} is not a directory.",
                            "Pass where the cgroup hierarchy is mounted, e.g. --cgroup-root /sys/fs/cgroup.")
    avail = pyspy.probe()
    stop = stop or threading.Event()
    out = opts.output or default_output(opts.pid)
    pack = out.endswith(".tar.gz")
    folder = out[: -len(".tar.gz")] if pack else out
    if pack:  # checked before the window: the pack step overwrites only with force
        output.check_file(out, opts.force)
    output.make_session_folder(folder, opts.force)  # new or empty; an old session only with force

    info = process_collector.target_info(opts.pid)
    cache_dir = process_collector.inductor_cache_dir(opts.pid)
    cache_before = process_collector.count_files(cache_dir)
    tree = [p.pid for p in process_collector.process_tree(opts.pid)]
    modules_before = process_collector.compiled_modules(tree)
    tails = [LogTail(p) for p in opts.logs]
    given = {os.path.realpath(p) for p in opts.logs}
    probe_tails = [LogTail(p) for p in probe_outputs(opts.pid) if os.path.realpath(p) not in given]
    for t in (*tails, *probe_tails):
        t.begin()
    scrapes_start = _scrape_all(opts.metrics)
    nsys_avail = nsys_session.probe(opts.pid) if opts.nsys else None
    nsys_window = None
    if nsys_avail is not None and nsys_avail.ok:
        nsys_window = nsys_session.NsysWindow(nsys_session.find_nsys() or "nsys")
        nsys_window.start(folder)

    sampler = process_collector.Sampler(opts.pid, folder, interval_s=1.0 if opts.light else 0.25)
    tick_lock = threading.Lock()
    sampler.tick(full=True)
    time.sleep(PROBE_S)
    sampler.tick(full=True)
    group = cgroup_collector.locate(opts.pid, opts.cgroup_root)
    group_start = cgroup_collector.snapshot(group) if group is not None else []
    cpu_before = _own_cpu()
    t0 = time.time()
    stop_sampling = threading.Event()

    def sample_loop() -> None:
        while not stop_sampling.wait(sampler.interval_s):
            with tick_lock:
                sampler.tick()
            if sampler.gone:
                return

    sampler_thread = threading.Thread(target=sample_loop, name="diagnose-sampler", daemon=True)
    sampler_thread.start()

    gpu_sampler = nvml_collector.NvmlSampler(opts.pid, folder)

    def gpu_loop() -> None:
        while not stop_sampling.is_set():
            gpu_sampler.tick()
            if gpu_sampler.failed:
                return
            stop_sampling.wait(gpu_sampler.interval_s)

    gpu_thread = threading.Thread(target=gpu_loop, name="diagnose-nvml", daemon=True)
    gpu_thread.start()

    def should_stop() -> bool:
        if opts.progress:
            opts.progress(min(time.time() - t0, opts.duration_s), opts.duration_s)
        return stop.is_set() or sampler.gone

    pythons: dict[int, bool] = {}
    rates: dict[int, tuple[int, int]] = {}

    def on_chunk(k: int) -> None:
        if k > 0:
            with tick_lock:
                sampler.tick(full=True)

    def planner(k: int) -> list[pyspy.Plan]:
        seen = []
        for pid in process_collector.tree_pids(opts.pid):
            if pid not in pythons:
                try:
                    pythons[pid] = _is_python(psutil.Process(pid))
                except psutil.Error:
                    continue
            seen.append(budget.Observation(pid, pythons[pid], sampler.cores(pid), sampler.busy_threads(pid),
                                           sampler.threads(pid), pid in sampler.serving))
        decisions = budget.plan(seen, opts.duration_s, max_rate=opts.rate_hz, light=opts.light, fixed=rates)
        for d in decisions:
            old = rates.get(d.pid, (0, 0))
            rates[d.pid] = (old[0] or d.cpu_rate_hz, old[1] or d.wall_rate_hz)
        return [pyspy.Plan(d.pid, d.cpu_rate_hz, d.wall_rate_hz, d.why) for d in decisions]

    captures: list[Capture] = []
    if avail.ok:
        res: pyspy.ChunkedResult | None = pyspy.record_chunked(
            opts.pid, opts.duration_s, folder, planner, n_chunks=budget.chunks_for(opts.duration_s, opts.light),
            should_stop=should_stop, on_chunk=on_chunk, dumps=not opts.light)
    else:
        res = None
        while time.time() - t0 < opts.duration_s and not should_stop():
            time.sleep(0.1)
    t1 = time.time()
    cpu_after = _own_cpu()
    cpu_self, cpu_kids = cpu_after[0] - cpu_before[0], cpu_after[1] - cpu_before[1]
    cpu_window = cpu_self + cpu_kids
    stop_sampling.set()
    sampler_thread.join(timeout=5)
    gpu_thread.join(timeout=5)
    group_end = cgroup_collector.snapshot(group) if group is not None else []
    with tick_lock:
        sampler.tick(full=True)
    window = Window(t0, t1)
    gone = sampler.gone or not process_collector.alive(opts.pid)
    early = stop.is_set()
    partial_reason = ""
    if gone:
        partial_reason = f"the target exited {t1 - t0:.1f} s into the window"
    elif early:
        partial_reason = f"stopped early by the user after {t1 - t0:.1f} s"

    if res is None:
        captures.append(Capture("py-spy", CaptureStatus.SKIPPED, avail.reason, avail.remedy, window))
    elif not res.ok:
        captures.append(Capture("py-spy", CaptureStatus.FAILED, res.reason, _pyspy_remedy(res.reason), window,
                                tuple(res.files)))
    else:
        for name in (pyspy.RAW_FILE, pyspy.WALL_FILE):
            pyspy.rewrite_commands(os.path.join(folder, name), redact_command)
        files = list(res.files)
        if _write_wall_source(folder):
            files.append(pyspy.SOURCE_FILE)
        status = CaptureStatus.PARTIAL if (res.partial or partial_reason) else CaptureStatus.OK
        captures.append(Capture("py-spy", status, partial_reason or res.reason, "", window, tuple(files)))
        write_json_atomic(os.path.join(folder, PYSPY_META),
                          {"version": 2, "rate_hz": opts.rate_hz, "window_s": t1 - t0, "light": opts.light,
                           "samples_reported": res.samples_reported, "chunks": res.chunks, "plans": res.plans})
    write_json_atomic(os.path.join(folder, ATTACH_COST_FILE),
                      {"window_s": t1 - t0, "cpu_s": round(cpu_window, 4), "self_cpu_s": round(cpu_self, 4),
                       "pyspy_cpu_s": round(cpu_kids, 4),
                       "cores": round(cpu_window / max(1e-9, t1 - t0), 4), "light": opts.light,
                       "max_rate_hz": opts.rate_hz})

    cache_after = process_collector.count_files(cache_dir)
    tree = [p.pid for p in process_collector.process_tree(opts.pid)]
    info["compiled_modules_loaded"] = len(process_collector.compiled_modules(tree) - modules_before)
    info["inductor_cache_dir"] = cache_dir
    info["inductor_cache_files"] = [cache_before, cache_after]
    info["cmdline"] = list(redact_argv(info["cmdline"]))
    write_json_atomic(os.path.join(folder, process_collector.INFO_FILE), info)
    pstatus = CaptureStatus.PARTIAL if partial_reason else CaptureStatus.OK
    if sampler.samples == 0:
        pstatus = CaptureStatus.FAILED
        partial_reason = partial_reason or "no sample could be taken"
    captures.append(Capture("process", pstatus, partial_reason, "", window,
                            (process_collector.SAMPLES_FILE, process_collector.INFO_FILE, ATTACH_COST_FILE)))
    captures.append(gpu_sampler.close(window))
    captures.append(_finish_cgroup(opts, group, group_start, group_end, folder, window))
    if nsys_avail is not None:
        captures.append(_finish_nsys(nsys_avail, nsys_window, folder, window))
    captures.extend(_finish_logs(tails, folder, window))
    captures.extend(_finish_logs(probe_tails, folder, window, collector="probe"))
    captures.extend(_copy_snapshots(probe_snapshots(opts.pid), folder, window))
    captures.extend(_finish_metrics(opts.metrics, scrapes_start, folder, window))

    target = Target(
        pid=opts.pid,
        cmdline=tuple(info["cmdline"]),
        python=str(info.get("exe", "")),
        user=str(info.get("user", "")),
        children=tuple(sorted(sampler.children)),
    )
    session = Session(path=folder, target=target, window=window, captures=tuple(captures))
    write_json_atomic(os.path.join(folder, pipeline.MANIFEST), session.manifest())
    if opts.config:  # the settings this session is judged with, also by `diagnose report` later
        write_json_atomic(os.path.join(folder, pipeline.CONFIG_FILE), opts.config.to_json())
    diagnosis = pipeline.analyze([folder])
    with open(os.path.join(folder, "diagnosis.json"), "w", encoding="utf-8") as fh:
        fh.write(json_report.render(diagnosis))
    if pack:  # for a ticket: secrets and request payloads redacted, like `diagnose pack`
        from analyzer.pack import pack as pack_session

        pack_session(folder, out, force=opts.force)
    return session, diagnosis


def _finish_cgroup(opts: AttachOptions, group: cgroup_collector.Group | None, start: list[dict[str, Any]],
                   end: list[dict[str, Any]], folder: str, window: Window) -> Capture:
    if group is None or not end:
        where = f" under {opts.cgroup_root}" if opts.cgroup_root else ""
        return Capture("cgroup", CaptureStatus.SKIPPED, f"no readable CPU cgroup for pid {opts.pid}{where}",
                       "In a container, pass the cgroup hierarchy's mount with --cgroup-root (e.g. /sys/fs/cgroup).",
                       window)
    write_json_atomic(os.path.join(folder, cgroup_collector.CGROUP_FILE),
                      cgroup_collector.record(group, start, end, window.start, window.end))
    return Capture("cgroup", CaptureStatus.OK, "", "", window, (cgroup_collector.CGROUP_FILE,))


def _own_cpu() -> tuple[float, float]:
    """CPU seconds of this process, and of its children that have exited (every py-spy it ran)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _write_wall_source(folder: str) -> bool:
    """The source lines the wall-clock samples' innermost frames stand on, secrets redacted."""
    path = os.path.join(folder, pyspy.WALL_FILE)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            samples = pyspy.parse_raw(fh)
    except OSError:
        return False
    from analyzer.derive import waits

    wanted: dict[int, set[tuple[str, int]]] = {}
    for smp in samples:
        frames = list(smp.frames[-2:])  # the leaf (a C call is made on its line) and its caller
        depth = waits.machinery_depth([(f.function, waits.short_path(f.file)) for f in smp.frames])
        if 0 < depth < len(smp.frames):
            frames.append(smp.frames[-1 - depth])  # the line that called into a queue, a lock, a socket
        for f in frames:
            wanted.setdefault(smp.pid, set()).add((f.file, f.line))
    lines: dict[str, str] = {}
    for pid, pairs in wanted.items():
        lines.update(pyspy.read_source_lines(pid, pairs))
    if not lines:
        return False
    write_json_atomic(os.path.join(folder, pyspy.SOURCE_FILE), {k: redact_text(v) for k, v in lines.items()})
    return True


def _pyspy_remedy(reason: str) -> str:
    if "ptrace" in reason or "permitted" in reason:
        return ("Run as root or with CAP_SYS_PTRACE (docker --cap-add SYS_PTRACE; "
                "kubectl debug --profile=general).")
    if "exited" in reason:
        return "Start the service again and attach while it runs."
    if "no Python" in reason:
        return "Attach to the Python process itself."
    return "Run `py-spy dump --pid PID` by hand to see why it cannot read the process."


def _scrape_all(urls: list[str]) -> dict[str, tuple[float, str | None, str]]:
    got: dict[str, tuple[float, str | None, str]] = {}
    for url in urls:
        try:
            got[url] = (time.time(), scrape(url), "")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            got[url] = (time.time(), None, str(getattr(exc, "reason", exc)))
    return got


def _finish_metrics(urls: list[str], start: dict[str, tuple[float, str | None, str]], folder: str,
                    window: Window) -> list[Capture]:
    caps: list[Capture] = []
    end = _scrape_all(urls)
    for i, url in enumerate(urls):
        name = f"metrics-{i}.prom"
        parts = []
        for ts, body, _ in (start[url], end[url]):
            if body is not None:
                parts.append(f"# scrape at {ts:.3f} from {url}\n{body.rstrip()}\n")
        errors = [e for _, b, e in (start[url], end[url]) if b is None]
        if not parts:
            caps.append(Capture("metrics", CaptureStatus.FAILED, f"could not scrape {url}: {errors[0]}",
                                "Check the URL (e.g. http://127.0.0.1:8000/metrics) is reachable from here.",
                                window))
            continue
        with open(os.path.join(folder, name), "w", encoding="utf-8") as fh:
            fh.write("".join(parts))
        status = CaptureStatus.OK if len(parts) == 2 else CaptureStatus.PARTIAL
        caps.append(Capture("metrics", status, "; ".join(errors), "", window, (name,)))
    return caps


def _finish_nsys(avail: Availability, win: nsys_session.NsysWindow | None, folder: str,
                 window: Window) -> Capture:
    if win is None:
        return Capture("nsys", CaptureStatus.SKIPPED, avail.reason, avail.remedy, window)
    files = win.stop(folder)
    if not files:
        return Capture("nsys", CaptureStatus.FAILED, win.error or "nsys capture failed",
                       "Run `nsys sessions list` to check the launch session.", window)
    return Capture("nsys", CaptureStatus.OK, "", "", window, tuple(files))


def _announcements(pid: int) -> list[tuple[int, dict[str, Any]]]:
    """(pid, announcement) of every process of the tree whose probe announced itself since it started."""
    from collectors import torch_probe

    out: list[tuple[int, dict[str, Any]]] = []
    for p in process_collector.process_tree(pid):
        doc = torch_probe.find_announcement(p.pid)
        try:
            stale = float(doc.get("started", 0)) < p.create_time() - 1.0 if doc else True
        except (TypeError, ValueError, psutil.Error):
            stale = True
        if doc and not stale:  # a killed service leaves its announcement behind; a new pid may reuse it
            out.append((p.pid, doc))
    return out


def _announced_path(pid: int, doc: dict[str, Any], key: str) -> str | None:
    path = doc.get(key)
    if not isinstance(path, str) or not path:
        return None
    return path if os.path.isabs(path) else os.path.join(f"/proc/{pid}/cwd", path)  # the target's cwd


def probe_outputs(pid: int) -> list[str]:
    """Files the in-process probe of the target's tree announced (stage log, compile log)."""
    found: list[str] = []
    for p, doc in _announcements(pid):
        for key in ("stages_path", "compile_log_path"):
            path = _announced_path(p, doc, key)
            if path and os.path.isfile(path) and path not in found:
                found.append(path)
    return found


PROBE_SNAPSHOTS_KEPT = 2


def probe_snapshots(pid: int) -> list[str]:
    """The newest CUDA memory snapshots the probe dumped at an OOM of this run of the service.

    The probe writes them beside its stage log as ``STAGES.oom-PID-N.pickle``; only the current
    processes' own (by pid in the name, written after the process started) are taken.
    """
    found: list[tuple[float, str]] = []
    for p, doc in _announcements(pid):
        stages = _announced_path(p, doc, "stages_path")
        if not stages:
            continue
        try:
            started = psutil.Process(p).create_time()
        except psutil.Error:
            continue
        for path in glob.glob(f"{glob.escape(stages)}.oom-{p}-*.pickle"):
            try:
                st = os.stat(path)
            except OSError:
                continue
            if st.st_mtime >= started and 0 < st.st_size <= snapshot_collector.MAX_FILE_BYTES:
                found.append((st.st_mtime, path))
    return [path for _, path in sorted(found, reverse=True)[:PROBE_SNAPSHOTS_KEPT]]


def _copy_snapshots(paths: list[str], folder: str, window: Window) -> list[Capture]:
    """Copy the probe's OOM snapshots as they are (allocator state and stack frames; read by a safe unpickler)."""
    names: list[str] = []
    for i, src in enumerate(paths):
        name = f"probe-snapshot-{i}.pickle"
        try:
            shutil.copyfile(src, os.path.join(folder, name))
            names.append(name)
        except OSError:
            continue
    if not paths:
        return []
    if not names:
        return [Capture("probe", CaptureStatus.FAILED, f"could not copy the probe's OOM snapshot {paths[0]}",
                        "Check the permissions of the probe's output folder.", window)]
    return [Capture("probe", CaptureStatus.OK, "", "", window, tuple(names))]


def _finish_logs(tails: list[LogTail], folder: str, window: Window, collector: str = "log") -> list[Capture]:
    caps: list[Capture] = []
    for i, t in enumerate(tails):
        name = f"{collector}-{i}-{os.path.basename(t.path)}"
        try:
            t.finish(os.path.join(folder, name))
            caps.append(Capture(collector, CaptureStatus.OK, "", "", window, (name,)))
        except OSError as exc:
            caps.append(Capture(collector, CaptureStatus.FAILED, f"could not read {t.path}: {exc.strerror}",
                                "Check the path and permissions of the file.", window))
    return caps


def attach_cli(args: argparse.Namespace) -> Diagnosis:
    """Attach with a progress bar on stderr; Ctrl-C ends the window early and keeps the data."""
    stop = threading.Event()

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    opts = AttachOptions(pid=args.pid, duration_s=args.duration, output=args.output, rate_hz=args.rate,
                         light=bool(getattr(args, "light", False)), logs=list(args.log), metrics=list(args.metrics),
                         nsys=args.nsys, cgroup_root=getattr(args, "cgroup_root", None),
                         config=load_config(getattr(args, "config", None)), force=bool(getattr(args, "force", False)))
    try:
        if sys.stderr.isatty() and args.format == "text":
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            with Progress(TextColumn(f"attached to pid {args.pid}"), BarColumn(), TimeRemainingColumn(),
                          transient=True, console=_stderr_console()) as bar:
                task = bar.add_task("window", total=opts.duration_s)
                opts.progress = lambda done, total: bar.update(task, completed=done)
                session, diagnosis = attach(opts, stop)
        else:
            session, diagnosis = attach(opts, stop)
    finally:
        signal.signal(signal.SIGINT, previous)
    for cap in session.captures:
        if cap.collector == nvml_collector.COLLECTOR and cap.status is CaptureStatus.SKIPPED:
            print(f"GPU evidence skipped: {cap.reason}.", file=sys.stderr)
    print(f"session written to {session.path}", file=sys.stderr)
    return diagnosis


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(file=sys.stderr)
