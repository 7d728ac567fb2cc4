"""What ``diagnose attach`` records over its window: one small protocol, one class per kind of evidence.

A ``Source`` opens the window (``start``), closes it (``stop``) and hands back the ``Capture`` of
what it recorded (``capture``), its raw files written into the session folder. ``diagnose.attach``
composes a list of them (``window_sources``) and runs the window; ``diagnose.sweep`` adds its load
generator to that list as one more source. A new kind of evidence is one new class with these three
methods, listed where the attach composes its sources.

Order: a list of sources is innermost first — the window's recorder (py-spy) first, then the
samplers, then the brackets (a counter, an offset or a scrape read at both ends of the window). The
attach starts them from the last to the first and stops them from the first to the last, so every
bracket encloses the samplers; the window's clock runs from the last ``start`` to the last ``stop``.
``capture`` runs after that, in list order, which is the order of the session's manifest.

What every source keeps to (the attach's guarantees):

* **read-only, never pausing the target**: /proc, psutil, NVML, cgroup files, the service's logs,
  its metrics endpoint, py-spy with ``--nonblocking``;
* **bounded**: ``start`` returns within a bounded time and ``stop(by)`` by ``by`` (one deadline on the
  monotonic clock for the whole stop, ``STOP_BUDGET_S`` after the wait: a thread of the attach that a
  saturated host does not run is left to finish in ``capture``, never waited for past it); inside the
  window only the samplers run; slow finishing (copying a log, exporting an Nsight report, a last
  scrape, parsing py-spy's files) belongs to ``capture``, after the window's clock stopped;
* **loud when partial**: a capture cut short says so (``CaptureStatus.PARTIAL``) with the reason the
  attach passes to ``capture`` (the target exited, the user stopped early); one that could not run
  is SKIPPED or FAILED with a reason and a remedy, never an exception out of the window.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import psutil

from diagnose.collectors import budget, nsys_session, pyspy
from diagnose.collectors import cgroup as cgroup_collector
from diagnose.collectors import nvml as nvml_collector
from diagnose.collectors import process as process_collector
from diagnose.collectors import snapshot as snapshot_collector
from diagnose.model import ATTACH_COST, PYSPY_META, Availability, Capture, CaptureStatus, Window
from diagnose.redact import redact_argv, redact_command, redact_text

PROBE_S = 0.5  # before the window: two full process samples this far apart say what is busy
LOG_TAIL_BEFORE_BYTES = 256 * 1024  # how much of a log before the window is kept for context
LOG_MAX_BYTES = 64 * 1024 * 1024  # never copy more than this from one log
PROBE_SNAPSHOTS_KEPT = 2
JOIN_S = 5.0  # a sampler thread ends at its next tick; this only bounds a stuck read
# the whole stop, all sources together: py-spy's grace (its last chunk's records are written within it) and
# one join. CI 2026-12-04: sources stopped one after another, each with its own timeout, held a 30 s window
# open for 54 s (py-spy 10.0 s, the process sampler 13.9 s) on a host that ran the attach's threads little
STOP_BUDGET_S = pyspy.STOP_GRACE_S + JOIN_S


def left(by: float) -> float:
    """Seconds from now (``time.monotonic``) to the deadline ``by``, never negative."""
    return max(0.0, by - time.monotonic())


# thread id → seconds that thread of a source spent waiting for a CPU, read by the thread itself as it ends
# (``exited``): the stop's record (``attach.run_window``) counts the threads that ended during the stop too
EXIT_WAITS: dict[str, float] = {}


def exited() -> None:
    """Called by a source's thread as it ends: its run-queue wait (``/proc/thread-self/schedstat``)."""
    if (ss := process_collector.schedstat_at("/proc/thread-self/schedstat")) is not None:
        EXIT_WAITS[str(threading.get_native_id())] = ss[1] / 1e9


class Source(Protocol):
    """One kind of evidence recorded over the window (see the module docstring for the rules)."""

    collector: str  # the name its captures carry in the manifest

    def start(self) -> None:
        """Open the window: from now on, record."""

    def stop(self, by: float) -> None:
        """Close the window: stop recording (quick; the target is never paused), returning by ``by`` (a
        ``time.monotonic`` deadline shared by every source's stop) whatever its threads are doing."""

    def capture(self, window: Window, cut: str) -> Capture | None:
        """Write what was recorded into the session folder and say what it is; ``cut`` is why the
        window ended early ("" when it ran its course). None: there was nothing of this kind to
        record (e.g. no OOM snapshot was dumped), so the session lists no capture for it."""


def write_text_atomic(path: str, text: str) -> None:
    """Write, then rename: a crash never leaves a half-written file under ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_json_atomic(path: str, doc: Any) -> None:
    """``doc`` as indented JSON, serialised before the file is made and written by ``write_text_atomic``."""
    write_text_atomic(path, json.dumps(doc, indent=2) + "\n")


def is_python(proc: psutil.Process) -> bool:
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


# ---------------------------------------------------------------------------------------------
# psutil and /proc: the process tree (the budget's input, and the target's identity)
# ---------------------------------------------------------------------------------------------


class Periodic:
    """A source that samples on a thread of its own: ``_every`` starts it, ``stop`` ends and joins it."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _every(self, interval_s: float, name: str, step: Callable[[], bool], first_wait: bool = False) -> None:
        """Run ``step`` every ``interval_s`` until ``stop`` or until it returns False."""

        def loop() -> None:
            try:
                if first_wait and self._stop.wait(interval_s):
                    return
                while step() and not self._stop.wait(interval_s):
                    pass
            finally:
                exited()

        self._thread = threading.Thread(target=loop, name=name, daemon=True)
        self._thread.start()

    def stop(self, by: float) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=min(JOIN_S, left(by)))

    def _finish(self) -> bool:
        """In ``capture``: the thread the stop's deadline left running (in a step a host short of CPU ran
        late) gets ``JOIN_S`` to end, so that nothing it does overlaps the capture. Whether it ended."""
        if self._thread is not None:
            self._thread.join(timeout=JOIN_S)
        return self._thread is None or not self._thread.is_alive()


class ProcessSource(Periodic):
    """Samples the target's process tree (``diagnose.collectors.process``) and records its identity.

    ``probe()`` runs before the window: two full samples ``PROBE_S`` apart say which processes use
    CPU and serve requests, what the py-spy budget is planned from. ``gone`` says the target exited.
    """

    collector = "process"

    def __init__(self, pid: int, folder: str, light: bool = False) -> None:
        super().__init__()
        self.pid = pid
        self.folder = folder
        self.sampler = process_collector.Sampler(pid, folder, interval_s=1.0 if light else 0.25)
        self.lock = threading.Lock()  # the sampler thread and py-spy's chunks both take samples
        self.info: dict[str, Any] = {}
        self._cache_dir = ""
        self._cache_before: int | None = None
        self._modules_before: set[str] = set()
        self.last_skipped = False  # the stop's deadline came before the window's last full sample

    @property
    def gone(self) -> bool:
        return self.sampler.gone

    @property
    def children(self) -> tuple[int, ...]:
        return tuple(sorted(self.sampler.children))

    def tick(self, full: bool = False) -> None:
        with self.lock:
            self.sampler.tick(full=full)

    def probe(self) -> None:
        """Before the window: the target's identity and two full samples of what is busy."""
        self.info = process_collector.target_info(self.pid)
        self._cache_dir = process_collector.inductor_cache_dir(self.pid)
        self._cache_before = process_collector.count_files(self._cache_dir)
        self._modules_before = process_collector.compiled_modules(self._tree())
        self.tick(full=True)
        time.sleep(PROBE_S)
        self.tick(full=True)

    def _tree(self) -> list[int]:
        return [p.pid for p in process_collector.process_tree(self.pid)]

    def start(self) -> None:
        # the probe has just sampled: the first tick of the window is one interval in
        self._every(self.sampler.interval_s, "diagnose-sampler", self._step, first_wait=True)

    def _step(self) -> bool:
        with self.lock:  # a step that wakes once the stop began takes no sample: the stop's full one is the last
            if self._stop.is_set():
                return False
            self.sampler.tick()
        return not self.sampler.gone

    def stop(self, by: float) -> None:
        super().stop(by)
        # the last sample is a full one, taken as the window closes (past the deadline by one tick at most);
        # a sampler thread still in its tick at the deadline (a host that does not run it) holds the lock, and
        # its sample is the last one then, as when the sources before used the whole deadline
        if left(by) > 0 and self.lock.acquire(timeout=left(by)):
            try:
                self.sampler.tick(full=True)
            finally:
                self.lock.release()
        else:
            self.last_skipped = True

    def capture(self, window: Window, cut: str) -> Capture:
        ended = self._finish()
        info = self.info
        cache_after = process_collector.count_files(self._cache_dir)
        info["compiled_modules_loaded"] = len(process_collector.compiled_modules(self._tree()) - self._modules_before)
        info["inductor_cache_dir"] = self._cache_dir
        info["inductor_cache_files"] = [self._cache_before, cache_after]
        info["cmdline"] = list(redact_argv(info["cmdline"]))
        write_json_atomic(os.path.join(self.folder, process_collector.INFO_FILE), info)
        status = CaptureStatus.PARTIAL if cut else CaptureStatus.OK
        if self.sampler.samples == 0:
            status = CaptureStatus.FAILED
            cut = cut or "no sample could be taken"
        notes = ((("the window's last full sample was not taken: the stop's deadline came first (the host ran "
                   "the attach's threads little)",) if self.last_skipped else ())
                 + ((f"the sampler's thread was still in a step {JOIN_S:g} s after the window's stop: a sample it "
                     "ends may follow the window's last",) if not ended else ()))
        # attach-cost.json (the attach's own CPU over the window) is written by the attach beside these
        return Capture(self.collector, status, cut, "", window,
                       (process_collector.SAMPLES_FILE, process_collector.INFO_FILE, ATTACH_COST), notes)


class BusyProbe:
    """Not evidence but a step of the window: before it opens, ``ProcessSource.probe`` (the target's
    identity, and two full samples ``PROBE_S`` apart that say what is busy, which py-spy's budget is
    planned from). Listed outside the samplers and the cgroup, and inside the service's files and any
    load (``diagnose.sweep``), so it sees the service as the window will. It hands back no capture."""

    collector = "process"

    def __init__(self, process: ProcessSource) -> None:
        self.process = process

    def start(self) -> None:
        self.process.probe()

    def stop(self, by: float) -> None:
        """Nothing here."""

    def capture(self, window: Window, cut: str) -> None:
        return None


# ---------------------------------------------------------------------------------------------
# py-spy: the window's recorder
# ---------------------------------------------------------------------------------------------


NATIVE_NOTES = 3  # more processes without Python than this in the tree are said in one line, by name
NATIVE_REMEDY = ("Profile its native code with `perf top -p {pid}` (or `perf record -g -p {pid}`); the engine's own "
                 "metrics (--metrics URL) and log (--log FILE) time its work.")


class PySpySource:
    """The CPU and wall-clock profile (``diagnose.collectors.pyspy.record_chunked``), within the budget.

    Each chunk is planned from the process samples (``diagnose.collectors.budget``): which processes, at
    what rate. Recording runs on its own thread for the window's duration and ends by itself;
    ``should_stop`` (the user stopped, the target exited) ends the current chunk early.

    Every process of the target's tree is accounted for in the capture's notes, one line each: how many
    samples of each kind it got and why (or that it runs no Python interpreter). A tree without any
    Python process (a native server: llama.cpp's ``llama-server``, Triton, TGI's router) is not
    profiled at all: the capture is SKIPPED and says why, and the other sources make the verdict.

    Bounded: ``record_chunked`` ends within its grace after the window whatever py-spy does (its schedule
    anchored at the window's start, so a thread that began late ends with the window too); ``stop`` waits
    no longer than that plus ``JOIN_S``, or the stop's deadline, and leaves a recording still running (a
    thread a host short of CPU ran late) to end in ``capture``, which waits one more grace and join and
    reports what is missing.
    """

    collector = "py-spy"

    def __init__(self, pid: int, folder: str, process: ProcessSource, *, duration_s: float, rate_hz: int,
                 light: bool, should_stop: Callable[[], bool]) -> None:
        self.pid = pid
        self.folder = folder
        self.process = process
        self.duration_s = duration_s
        self.rate_hz = rate_hz
        self.light = light
        self.should_stop = should_stop
        self.avail: Availability = pyspy.probe()
        self.result: pyspy.ChunkedResult | None = None
        self.error = ""  # what the recording thread raised, if it did
        self.native = ""  # the target's "PID (name)" when no process of its tree runs Python
        self._pythons: dict[int, bool] = {}
        self._names: dict[int, str] = {}
        self._order: list[int] = []  # every pid of the tree seen, in tree order
        self._why: dict[int, str] = {}  # the latest plan's reason per pid
        self._rates: dict[int, tuple[int, int]] = {}
        self._thread: threading.Thread | None = None
        self._began = 0.0  # the window's start for the recording's schedule (``start``)
        self._ended_at = 0.0  # when the recording's thread ended
        self._abandoned = False
        self._late_at = 0.0  # when the stop's deadline found the recording still running (0: it had ended)
        self.late_s = 0.0  # how long after that it ended (in ``capture``)

    def _on_chunk(self, k: int) -> None:
        if k > 0:
            self.process.tick(full=True)

    def _see(self, pid: int) -> bool:
        """Whether ``pid`` (of the tree) runs Python; remembered, with its name, the first time."""
        if pid not in self._pythons:
            try:
                proc = psutil.Process(pid)
                self._pythons[pid] = is_python(proc)
                # collapsed: setproctitle pads a title with spaces (vLLM's "VLLM::EngineCore     …")
                cmd = redact_command(" ".join(" ".join(proc.cmdline()).split())) or proc.name()
            except psutil.Error:
                return False
            self._names[pid] = cmd if len(cmd) <= 80 else cmd[:79] + "…"
            self._order.append(pid)
        return self._pythons[pid]

    def _plan(self, k: int) -> list[pyspy.Plan]:
        sampler = self.process.sampler
        seen = []
        for pid in process_collector.tree_pids(self.pid):
            self._see(pid)
            if pid not in self._pythons:  # exited before it could be read
                continue
            seen.append(budget.Observation(pid, self._pythons[pid], sampler.cores(pid), sampler.busy_threads(pid),
                                           sampler.threads(pid), pid in sampler.serving))
        decisions = budget.plan(seen, self.duration_s, max_rate=self.rate_hz, light=self.light, fixed=self._rates)
        for d in decisions:
            old = self._rates.get(d.pid, (0, 0))
            if not d.coarse:  # a coverage view is a record of its own kind: it pins no rate
                self._rates[d.pid] = (old[0] or d.cpu_rate_hz, old[1] or d.wall_rate_hz)
            self._why[d.pid] = d.why
        return [pyspy.Plan(d.pid, d.cpu_rate_hz, d.wall_rate_hz, d.why, d.coarse) for d in decisions]

    def _record(self) -> None:
        try:
            self.result = pyspy.record_chunked(
                self.pid, self.duration_s, self.folder, self._plan,
                n_chunks=budget.chunks_for(self.duration_s, self.light),
                should_stop=self.should_stop, start=self._began,
                on_chunk=self._on_chunk, dumps=not self.light, redact=redact_argv)
        except Exception as exc:  # on its own thread: said in the capture, never lost
            self.error = f"py-spy recording failed: {type(exc).__name__}: {str(exc)[:200]}"
        finally:
            self._ended_at = time.monotonic()
            exited()

    def start(self) -> None:
        if not self.avail.ok:
            return
        tree = process_collector.tree_pids(self.pid)
        if tree and not any(self._see(p) for p in tree):
            self.native = f"{self.pid} ({self._process_name(self.pid)})"
            return
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._record, name="diagnose-py-spy", daemon=True)
        self._thread.start()

    def _process_name(self, pid: int) -> str:
        try:
            return str(psutil.Process(pid).name())
        except psutil.Error:
            return self._names.get(pid, "?")

    def stop(self, by: float) -> None:
        """``record_chunked`` ends by itself (at the window's end, or early when asked), its py-spys at most
        their grace late (each py-spy also ends by its own ``--duration``). Waited for until its grace and a
        join have passed, or ``by``; a recording still running then (a host that does not run its thread)
        is left to end in ``capture``, after the window (its schedule ends with the window's: what is left
        is its py-spys' grace and its own work on their files)."""
        if self._thread is None:
            return
        ends = self._began + self.duration_s + pyspy.STOP_GRACE_S  # record_chunked's own bound
        self._thread.join(timeout=min(left(ends) + JOIN_S, left(by)))
        if self._thread.is_alive():
            self._late_at = time.monotonic()

    def _finish(self) -> None:
        """After the window: a recording the stop left running gets one more grace and join to end; one
        that has not ended then is abandoned (its result, should it come later, is not read)."""
        if self._thread is None or not self._late_at:
            return
        self._thread.join(timeout=pyspy.STOP_GRACE_S + JOIN_S)
        if self._thread.is_alive():
            self._abandoned = True
            self.late_s = time.monotonic() - self._late_at
            self.error = (f"the py-spy recording was still running {self.late_s:.0f} s after the window closed "
                          "and was abandoned")
        else:
            self.late_s = max(0.0, self._ended_at - self._late_at)

    def notes(self) -> tuple[str, ...]:
        """One line per process of the tree: what py-spy recorded of it, and why."""
        res = self.result
        got: dict[tuple[int, str], int] = {}
        rates: dict[tuple[int, str], int] = {}
        killed: dict[int, int] = {}
        behind: dict[int, float] = {}
        for c in res.chunks if res is not None else ():
            pid, kind = int(str(c["pid"])), str(c["kind"])
            got[(pid, kind)] = got.get((pid, kind), 0) + int(str(c.get("samples") or 0))
            rates[(pid, kind)] = int(str(c["rate_hz"]))
            killed[pid] = killed.get(pid, 0) + bool(c.get("killed"))
            behind[pid] = max(behind.get(pid, 0.0), float(str(c.get("behind_s") or 0.0)))
        stood = self._stood()
        out: list[str] = []
        native = [pid for pid in self._order if not self._pythons.get(pid)]
        if len(native) > NATIVE_NOTES:  # compilers, shells, helpers come and go: one line for all of them
            names = Counter(os.path.basename(self._names.get(pid, "?").split(" ", 1)[0]) for pid in native)
            out.append(f"{len(native)} processes run no Python interpreter, not profiled: "
                       + ", ".join(f"{name} ×{n}" for name, n in names.most_common()))
        for pid in self._order:
            head = f"pid {pid} ({self._names.get(pid, '?')})"
            if not self._pythons.get(pid):
                if len(native) <= NATIVE_NOTES:
                    out.append(f"{head}: runs no Python interpreter, not profiled")
                continue
            parts = [f"{got[(pid, kind)]} {pyspy.KIND_WORDS[kind]} samples at {rates[(pid, kind)]} Hz"
                     for kind in ("cpu", "wall", "cover") if (pid, kind) in got]
            if pid in stood and parts:
                parts[-1] += f", mostly at {stood[pid]}"
            elif pid in stood:  # its coarse samples are on disk, their count was not (an abandoned recording)
                parts.append(f"coarse wall-clock samples, uncounted, mostly at {stood[pid]}")
            line = f"{head}: {', '.join(parts) if parts else 'not sampled'}"
            if pid in self._why:
                line += f" ({self._why[pid]})"
            if killed.get(pid):
                line += f"; {killed[pid]} record(s) killed past the grace, their samples lost"
            if behind.get(pid, 0.0) > 1.0:
                line += f"; py-spy fell {behind[pid]:.1f} s behind its rate (the host is short of CPU)"
            out.append(line)
        if self._late_at and not self.error:
            out.append(f"the recording was still running when the window closed (the host ran the attach's "
                       f"threads little); it ended {self.late_s:.1f} s later, after the window")
        return tuple(out)

    def _stood(self) -> dict[int, str]:
        """Where each covered process stood most (its coarse samples' innermost frame, with the share)."""
        path = os.path.join(self.folder, pyspy.COVER_FILE)
        leaves: dict[int, Counter[str]] = {}
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                samples = pyspy.parse_raw(fh)
        except OSError:
            return {}
        for smp in samples:
            if smp.frames:
                f = smp.frames[-1]
                where = "/".join(f.file.rsplit("/", 2)[-2:])
                leaves.setdefault(smp.pid, Counter())[f"{f.function} ({where}:{f.line})"] += smp.count
        out: dict[int, str] = {}
        for pid, got in leaves.items():
            site, n = got.most_common(1)[0]
            out[pid] = f"{site} ({100 * n / sum(got.values()):.0f} %)"
        return out

    def capture(self, window: Window, cut: str) -> Capture:
        self._finish()
        res = None if self._abandoned else self.result
        if not self.avail.ok:
            return Capture(self.collector, CaptureStatus.SKIPPED, self.avail.reason, self.avail.remedy, window)
        if self.native:
            return Capture(self.collector, CaptureStatus.SKIPPED,
                           f"process {self.native} runs no Python interpreter (nor does any process of its tree): "
                           "a Python profiler does not apply", NATIVE_REMEDY.format(pid=self.pid), window,
                           notes=self.notes())
        if res is None:
            return Capture(self.collector, CaptureStatus.FAILED, self.error or "py-spy recorded nothing",
                           pyspy_remedy(self.error), window, notes=self.notes())
        if not res.ok:
            return Capture(self.collector, CaptureStatus.FAILED, res.reason, pyspy_remedy(res.reason), window,
                           tuple(res.files), self.notes())
        files = list(res.files)
        if write_wall_source(self.folder):
            files.append(pyspy.SOURCE_FILE)
        status = CaptureStatus.PARTIAL if (res.partial or cut or self.error) else CaptureStatus.OK
        write_json_atomic(os.path.join(self.folder, PYSPY_META),
                          {"version": 2, "rate_hz": self.rate_hz, "window_s": window.end - window.start,
                           "light": self.light, "samples_reported": res.samples_reported, "chunks": res.chunks,
                           "plans": res.plans, "overruns": res.overruns})
        reasons = [cut or res.reason]
        if cut and res.overruns:  # the user's stop is said first; a py-spy killed past its grace too
            reasons.append(res.reason)
        reasons.append(self.error)
        reason = "; ".join(r for r in reasons if r)
        remedy = pyspy_remedy(reason) if res.overruns or self.error else ""
        return Capture(self.collector, status, reason, remedy, window, tuple(files), self.notes())


def write_wall_source(folder: str) -> bool:
    """The source lines the wall-clock samples' innermost frames stand on, secrets redacted."""
    path = os.path.join(folder, pyspy.WALL_FILE)
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            samples = pyspy.parse_raw(fh)
    except OSError:
        return False
    from diagnose.derive import waits

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


def pyspy_remedy(reason: str) -> str:
    if "killed" in reason or "abandoned" in reason or "start-up outlasted" in reason:
        return ("py-spy could not keep up: attach with a lower --rate, or with --light on a host at 100 % CPU "
                "(the other processes' samples are kept).")
    if "ptrace" in reason or "permitted" in reason:
        return ("Run as root or with CAP_SYS_PTRACE (docker --cap-add SYS_PTRACE; "
                "kubectl debug --profile=general).")
    if "exited" in reason:
        return "Start the service again and attach while it runs."
    if "no Python" in reason:
        return "Attach to the Python process itself."
    return "Run `py-spy dump --pid PID` by hand to see why it cannot read the process."


# ---------------------------------------------------------------------------------------------
# NVML, cgroup, Nsight Systems
# ---------------------------------------------------------------------------------------------


class NvmlSource(Periodic):
    """The target's GPUs through NVML (``diagnose.collectors.nvml.NvmlSampler``); SKIPPED where no driver answers."""

    collector = nvml_collector.COLLECTOR

    def __init__(self, pid: int, folder: str) -> None:
        super().__init__()
        self.sampler = nvml_collector.NvmlSampler(pid, folder)

    def start(self) -> None:
        self._every(self.sampler.interval_s, "diagnose-nvml", self._step)

    def _step(self) -> bool:
        if self._stop.is_set():
            return False
        self.sampler.tick()
        return not self.sampler.failed

    def capture(self, window: Window, cut: str) -> Capture:
        if not self._finish():  # NVML is not shut down under a thread still in a driver call
            files = (nvml_collector.NVML_FILE,) if os.path.exists(self.sampler.path) else ()
            return Capture(self.collector, CaptureStatus.PARTIAL if self.sampler.samples else CaptureStatus.FAILED,
                           f"the NVML sampler's thread was still in a driver call {JOIN_S:g} s after the window's "
                           "stop; NVML was left open", "Run `nvidia-smi` to check that the driver answers.", window,
                           files)
        return self.sampler.close(window)


CGROUP_REMEDY = "In a container, pass the cgroup hierarchy's mount with --cgroup-root (e.g. /sys/fs/cgroup)."


class CgroupSource:
    """The CPU and memory controller files of the target's cgroups, read at both ends of the window (quota,
    throttling; memory limit, peak, OOM kills)."""

    collector = "cgroup"

    def __init__(self, pid: int, folder: str, root: str | None = None) -> None:
        self.pid = pid
        self.folder = folder
        self.root = root
        self.group: cgroup_collector.Group | None = None
        self.memory: cgroup_collector.Group | None = None
        self._start: list[dict[str, Any]] = []
        self._end: list[dict[str, Any]] = []
        self._mem_start: list[dict[str, Any]] = []
        self._mem_end: list[dict[str, Any]] = []

    def start(self) -> None:
        self.group = cgroup_collector.locate(self.pid, self.root)
        self._start = cgroup_collector.snapshot(self.group) if self.group is not None else []
        self.memory = cgroup_collector.locate(self.pid, self.root, controller="memory")
        self._mem_start = cgroup_collector.snapshot(self.memory, memory=True) if self.memory is not None else []

    def stop(self, by: float) -> None:
        self._end = cgroup_collector.snapshot(self.group) if self.group is not None else []
        self._mem_end = cgroup_collector.snapshot(self.memory, memory=True) if self.memory is not None else []

    def capture(self, window: Window, cut: str) -> Capture:
        if self.group is None or not self._end:
            where = f" under {self.root}" if self.root else ""
            return Capture(self.collector, CaptureStatus.SKIPPED, f"no readable CPU cgroup for pid {self.pid}{where}",
                           CGROUP_REMEDY, window)
        memory = (cgroup_collector.memory_record(self.memory, self._mem_start, self._mem_end)
                  if self.memory is not None and self._mem_end else None)
        write_json_atomic(os.path.join(self.folder, cgroup_collector.CGROUP_FILE),
                          cgroup_collector.record(self.group, self._start, self._end, window.start, window.end,
                                                  memory))
        return Capture(self.collector, CaptureStatus.OK, "", "", window, (cgroup_collector.CGROUP_FILE,))


class NsysSource:
    """An Nsight Systems capture of a service started under ``nsys launch`` (``--nsys``)."""

    collector = "nsys"

    def __init__(self, pid: int, folder: str) -> None:
        self.folder = folder
        self.avail = nsys_session.probe(pid)
        self.window: nsys_session.NsysWindow | None = None

    def start(self) -> None:
        if self.avail.ok:
            self.window = nsys_session.NsysWindow(nsys_session.find_nsys() or "nsys")
            self.window.start(self.folder)

    def stop(self, by: float) -> None:
        """Nothing here: ``nsys stop`` writes and exports the report, which takes long (in ``capture``)."""

    def capture(self, window: Window, cut: str) -> Capture:
        if self.window is None:
            return Capture(self.collector, CaptureStatus.SKIPPED, self.avail.reason, self.avail.remedy, window)
        files = self.window.stop(self.folder)
        if not files:
            return Capture(self.collector, CaptureStatus.FAILED, self.window.error or "nsys capture failed",
                           "Run `nsys sessions list` to check the launch session.", window)
        return Capture(self.collector, CaptureStatus.OK, "", "", window, tuple(files))


# ---------------------------------------------------------------------------------------------
# the service's own files: logs, the in-process probe's outputs, its metrics endpoint
# ---------------------------------------------------------------------------------------------


@dataclass
class LogTail:
    """Copies the part of a log written during the window, plus a tail before it."""

    path: str
    start_offset: int = 0

    def begin(self) -> None:
        size = os.path.getsize(self.path)
        self.start_offset = max(0, size - LOG_TAIL_BEFORE_BYTES)

    def finish(self, dest: str) -> None:
        """Copy from the start offset to the end, secrets redacted line by line, bounded in size.

        A last line without its newline is one the service is writing now: only its finished part is
        kept — up to its last carriage return, as a progress bar (tqdm: CUDA-graph capture, weight
        loading) rewrites its line with ``\r`` until it is done — and the part after it, half written,
        is left out: half a field would defeat its redaction (a prompt whose closing quote is not
        written yet)."""
        left = LOG_MAX_BYTES
        with open(self.path, "rb") as src, open(dest, "w", encoding="utf-8") as out:
            src.seek(self.start_offset)
            if self.start_offset:
                src.readline()  # drop the partial first line
            for raw in src:
                left -= len(raw)
                if left < 0:
                    break
                if not raw.endswith(b"\n"):
                    raw = raw[:raw.rfind(b"\r") + 1]  # the finished updates of a line being written
                out.write(redact_text(raw.decode("utf-8", errors="replace")))


class LogSource:
    """A log the service writes (``--log``, or a file its probe announced: ``collector="probe"``): what
    it wrote during the window and a tail before it, secrets redacted, as ``COLLECTOR-INDEX-NAME``."""

    def __init__(self, path: str, folder: str, index: int, collector: str = "log") -> None:
        self.tail = LogTail(path)
        self.folder = folder
        self.name = f"{collector}-{index}-{os.path.basename(path)}"
        self.collector = collector

    def start(self) -> None:
        self.tail.begin()

    def stop(self, by: float) -> None:
        """Nothing here: the log is copied after the window (``capture``)."""

    def capture(self, window: Window, cut: str) -> Capture:
        try:
            self.tail.finish(os.path.join(self.folder, self.name))
        except OSError as exc:
            return Capture(self.collector, CaptureStatus.FAILED, f"could not read {self.tail.path}: {exc.strerror}",
                           "Check the path and permissions of the file.", window)
        return Capture(self.collector, CaptureStatus.OK, "", "", window, (self.name,))


def _announcements(pid: int) -> list[tuple[int, dict[str, Any]]]:
    """(pid, announcement) of every process of the tree whose probe announced itself since it started."""
    from diagnose.collectors import torch_probe

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


def copy_snapshots(paths: list[str], folder: str, window: Window) -> Capture | None:
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
        return None
    if not names:
        return Capture("probe", CaptureStatus.FAILED, f"could not copy the probe's OOM snapshot {paths[0]}",
                       "Check the permissions of the probe's output folder.", window)
    return Capture("probe", CaptureStatus.OK, "", "", window, tuple(names))


class ProbeSnapshotSource:
    """The CUDA memory snapshots the in-process probe dumped at an OOM (looked for after the window,
    so one dumped during it is taken); no capture when there is none."""

    collector = "probe"

    def __init__(self, pid: int, folder: str) -> None:
        self.pid = pid
        self.folder = folder

    def start(self) -> None:
        """Nothing here: a snapshot exists once an OOM happened."""

    def stop(self, by: float) -> None:
        """Nothing here."""

    def capture(self, window: Window, cut: str) -> Capture | None:
        return copy_snapshots(probe_snapshots(self.pid), self.folder, window)


def scrape(url: str, timeout_s: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        body: bytes = resp.read(16 * 1024 * 1024)
        return body.decode("utf-8", errors="replace")


Scrape = tuple[float, str | None, str]  # (time, body or None, error)


def _scrape(url: str) -> Scrape:
    try:
        return time.time(), scrape(url), ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return time.time(), None, str(getattr(exc, "reason", exc))


class MetricsSource:
    """A Prometheus endpoint (``--metrics URL``) scraped at both ends of the window, as ``metrics-INDEX.prom``."""

    collector = "metrics"

    def __init__(self, url: str, folder: str, index: int) -> None:
        self.url = url
        self.folder = folder
        self.name = f"metrics-{index}.prom"
        self._first: Scrape = (0.0, None, "not scraped")

    def start(self) -> None:
        self._first = _scrape(self.url)

    def stop(self, by: float) -> None:
        """Nothing here: the second scrape is taken after the window (``capture``)."""

    def capture(self, window: Window, cut: str) -> Capture:
        both = (self._first, _scrape(self.url))
        parts = [f"# scrape at {ts:.3f} from {self.url}\n{body.rstrip()}\n" for ts, body, _ in both if body is not None]
        errors = [e for _, b, e in both if b is None]
        if not parts:
            return Capture(self.collector, CaptureStatus.FAILED, f"could not scrape {self.url}: {errors[0]}",
                           "Check the URL (e.g. http://127.0.0.1:8000/metrics) is reachable from here.", window)
        with open(os.path.join(self.folder, self.name), "w", encoding="utf-8") as fh:
            fh.write("".join(parts))
        status = CaptureStatus.OK if len(parts) == 2 else CaptureStatus.PARTIAL
        return Capture(self.collector, status, "; ".join(errors), "", window, (self.name,))
