"""``diagnose attach``: watch a live service for a bounded window, read-only, then diagnose.

The attach composes a list of sources (``diagnose.sources``: py-spy, the process tree, NVML, the
cgroup, Nsight Systems, the service's logs, its probe's outputs, its metrics endpoint), opens the
window on all of them, waits, closes it and writes what each captured into the session folder.

Safety: py-spy runs with ``--nonblocking`` (the target is never paused); psutil and /proc are
only read; the window is bounded: on a host that runs the attach, py-spy's recording ends at most
``pyspy.STOP_GRACE_S`` after it, whatever py-spy does (one that does not stop is killed and its capture is
partial, with the reason); on any host every source stops by one deadline (``sources.STOP_BUDGET_S`` after
the wait), and a thread of the attach that a host short of CPU ran late is left to end after the window, in
its capture (a bounded join), which says so.
Ctrl-C ends the window early and the session and verdict are still written from what was captured.
If the target exits during the window, what was captured is kept and marked partial.

Coverage: every process of the target's tree is accounted for (vLLM V1's API server, EngineCore and
model worker are three): the py-spy capture's notes say, per process, what was sampled and why. A
target with no Python process in its tree (a native server) is attached too, without the profiler.

Cost: the attach spends its budget where evidence comes from (``diagnose.collectors.budget``): before the
window, two full process samples half a second apart say which processes use CPU and serve
requests; the window is then recorded in chunks, each re-planned from the latest samples. The
attach's own CPU over the window is measured and kept in the session (``attach-cost.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import psutil

from diagnose import output
from diagnose.blas import import_numpy_without_blas_threads
from diagnose.collectors import budget
from diagnose.collectors import nvml as nvml_collector
from diagnose.collectors import process as process_collector
from diagnose.config import Config
from diagnose.config import load as load_config
from diagnose.errors import AttachError, DiagnoseError
from diagnose.model import ATTACH_COST as ATTACH_COST_FILE
from diagnose.model import Capture, CaptureStatus, Diagnosis, Session, Target, Window
from diagnose.redact import redact_argv, redact_secrets
from diagnose.sources import (
    EXIT_WAITS,
    STOP_BUDGET_S,
    BusyProbe,
    CgroupSource,
    LogSource,
    MetricsSource,
    NsysSource,
    NvmlSource,
    ProbeSnapshotSource,
    ProcessSource,
    PySpySource,
    Source,
    probe_outputs,
    write_json_atomic,
    write_text_atomic,
)


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
    # a native server (llama.cpp's llama-server, Triton, TGI's router) is attached too: every source but the
    # Python profiler applies, and that one says why it does not (``PySpySource``)
    return proc


def default_output(pid: int) -> str:
    return f"diagnose-{pid}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"


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


def _collector(source: Source) -> str:
    """The name a source's captures carry (its class's name for one that does not say)."""
    return str(getattr(source, "collector", type(source).__name__))


CAPTURE_ERROR = "{collector}-{index}-error.txt"  # the traceback of a source that failed, for the bug report


def capture_of(source: Source, index: int, window: Window, cut: str, folder: str,
               stop_failed: str | None = None) -> Capture | None:
    """A source's capture. One whose stop (``stop_failed``: its traceback) or capture raised failed on a defect
    of diagnose's, not the target's: it becomes a failed capture with the reason and its traceback (secrets
    redacted) in the session, and the other sources' evidence and the verdict still come (an attach never ends
    in a traceback). ``index``: the source's place in the window (two sources may share a collector name)."""
    if stop_failed is not None:
        what, trace = "stop", stop_failed
    else:
        try:
            return source.capture(window, cut)
        except Exception:
            what, trace = "capture", traceback.format_exc()
    collector = _collector(source)
    name = CAPTURE_ERROR.format(collector=re.sub(r"[^\w.-]", "_", collector), index=index)
    with contextlib.suppress(OSError):
        write_text_atomic(os.path.join(folder, name), redact_secrets(trace))
    last = redact_secrets(trace.strip().splitlines()[-1]) if trace.strip() else "an error"
    return Capture(collector, CaptureStatus.FAILED,
                   f"diagnose's {collector} {what} failed on a defect of its own ({last[:200]}); what it recorded "
                   "is not read", f"report it with `diagnose pack` of the session ({name} holds the traceback)",
                   window)


def attach(opts: AttachOptions, stop: threading.Event | None = None,
           extra: Sequence[Source] = (), imports: Mapping[str, float] | None = None) -> tuple[Session, Diagnosis]:
    """Record a session for ``opts.duration_s`` and diagnose it. Returns (session, diagnosis).

    ``extra``: more sources recorded over the same window (``diagnose.sweep`` drives its load with one),
    started first (before the busy probe) and stopped last, their captures listed after the attach's own.
    ``imports``: what the process's start cost before the attach was asked for (``imports_cost``), written
    into its cost record.
    """
    age_entered, entered, cpu_entered, host_entered = _age(), time.time(), sum(_own_cpu()), HostMark.read()
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
    stop = stop or threading.Event()
    out = opts.output or default_output(opts.pid)
    pack = out.endswith(".tar.gz")
    folder = out[: -len(".tar.gz")] if pack else out
    if pack:  # checked before the window: the pack step overwrites only with force
        output.check_file(out, opts.force)
    output.make_session_folder(folder, opts.force)  # new or empty; an old session only with force

    process = ProcessSource(opts.pid, folder, light=opts.light)

    def should_stop() -> bool:
        return stop.is_set() or process.gone

    sources = [*window_sources(opts, folder, process, should_stop), *extra]
    ran = run_window(sources, opts.duration_s, stop, should_stop, opts.progress)
    window = ran.window
    cut = ""
    if process.gone or not process_collector.alive(opts.pid):
        cut = f"the target exited {window.seconds:.1f} s into the window"
    elif stop.is_set():
        cut = f"stopped early by the user after {window.seconds:.1f} s"
    cost = {**ran.cost, "light": opts.light, "max_rate_hz": opts.rate_hz,
            **_before_window(entered, cpu_entered, ran, host_entered, age_entered), **(imports or {}),
            "stop_each_s": ran.stops}
    write_json_atomic(os.path.join(folder, ATTACH_COST_FILE), cost)
    captures = [c for i, s in enumerate(sources)
                if (c := capture_of(s, i, window, cut, folder, ran.stop_failed.get(i))) is not None]

    info = process.info
    target = Target(
        pid=opts.pid,
        cmdline=redact_argv(info.get("cmdline") or ()),  # also when the process capture failed before it did
        python=str(info.get("exe", "")),
        user=str(info.get("user", "")),
        children=process.children,
    )
    session = Session(path=folder, target=target, window=window, captures=tuple(captures))
    import_numpy_without_blas_threads()  # no OpenBLAS pool for the rest of the process's life (and its exit)
    from diagnose import pipeline  # the analysis, after the window: the window opens without importing it

    write_json_atomic(os.path.join(folder, pipeline.MANIFEST), session.manifest())
    if opts.config:  # the settings this session is judged with, also by `diagnose report` later
        write_json_atomic(os.path.join(folder, pipeline.CONFIG_FILE), opts.config.to_json())
    diagnosis = pipeline.analyze([folder])
    # renamed into place: whoever waits for a session (diagnose watch, a script) never reads half of one
    write_text_atomic(os.path.join(folder, "diagnosis.json"), diagnosis.to_json_text())
    # what the attach spent after the window (capture files, analysis): its wall time beyond the window
    # is this and the setup, never the target's (the window is bounded by py-spy's grace)
    write_json_atomic(os.path.join(folder, ATTACH_COST_FILE), {**cost, **_after_window(ran)})
    if pack:  # for a ticket: secrets and request payloads redacted, like `diagnose pack`
        from diagnose.pack import pack as pack_session

        pack_session(folder, out, force=opts.force)
    return session, diagnosis


def window_sources(opts: AttachOptions, folder: str, process: ProcessSource,
                   should_stop: Callable[[], bool]) -> list[Source]:
    """The sources of an attach, innermost first (see ``diagnose.sources``): the manifest's order."""
    given = {os.path.realpath(p) for p in opts.logs}
    announced = [p for p in probe_outputs(opts.pid) if os.path.realpath(p) not in given]
    return [
        PySpySource(opts.pid, folder, process, duration_s=opts.duration_s, rate_hz=opts.rate_hz, light=opts.light,
                    should_stop=should_stop),
        process,
        NvmlSource(opts.pid, folder),
        CgroupSource(opts.pid, folder, opts.cgroup_root),
        BusyProbe(process),  # before the window opens: what is busy, for py-spy's budget
        *([NsysSource(opts.pid, folder)] if opts.nsys else []),
        *(LogSource(p, folder, i) for i, p in enumerate(opts.logs)),
        *(LogSource(p, folder, i, collector="probe") for i, p in enumerate(announced)),
        ProbeSnapshotSource(opts.pid, folder),
        *(MetricsSource(url, folder, i) for i, url in enumerate(opts.metrics)),
    ]


Stolen = dict[str, float]  # CPU name (cpu0, cpu1, ...) -> seconds stolen from it since boot


@dataclass(frozen=True)
class Ran:
    """A window that ran: its span, and what the attach itself spent over it."""

    window: Window
    # window_s, cpu_s, self_cpu_s, pyspy_cpu_s, cores, stop_s, first_stop_s, steal_s, stop_ and late_ (the host's
    # share of the stop and of the wait's late end: HostMark.since), late_s (attach-cost.json)
    cost: dict[str, float]
    cpu_opened: float = 0.0  # the attach's own CPU seconds (process and waited children) when the window opened
    cpu_closed: float = 0.0  # ... and when it closed
    host_opened: HostMark | None = None  # what the host had taken from the calling thread when the window opened
    host_closed: HostMark | None = None  # ... and when it closed
    stops: dict[str, float] = field(default_factory=dict)  # seconds each kind of source took to stop
    closed_at: float = 0.0  # when the window closed, on run_window's clock (time.monotonic unless a test's)
    stop_failed: dict[int, str] = field(default_factory=dict)  # source index → the traceback of a stop that raised


# how often the window checks whether the target exited (the sampler notices at its ticks) and moves the
# progress bar; Ctrl-C (``stop``) wakes it at once. Each wake-up costs the attach CPU: keep it rare.
POLL_S = 0.25


def run_window(sources: Sequence[Source], duration_s: float, stop: threading.Event, should_stop: Callable[[], bool],
               progress: Callable[[float, float], None] | None = None,
               clock: Callable[[], float] = time.monotonic, epoch: Callable[[], float] = time.time) -> Ran:
    """Start ``sources`` (last to first), wait ``duration_s`` or until ``should_stop()`` (``stop``: the
    user's, which ends the wait at once), stop them (first to last) by one deadline, ``STOP_BUDGET_S`` after
    the wait. The attach's own CPU (its process and every child it waited for: each py-spy) is measured from
    the last start to the last stop.

    Durations are on ``clock`` (monotonic: a wall clock stepped while the window runs, as NTP does after a
    virtual machine is paused or moved, neither ends the wait early nor stretches it); the window starts at
    ``epoch()`` (the time its evidence is stamped with) and lasts what ``clock`` measured."""
    started: list[Source] = []
    try:
        for s in reversed(sources):
            s.start()
            started.append(s)
    except BaseException:  # a source that cannot start: stop (and join) those already running, then say why
        by = time.monotonic() + STOP_BUDGET_S
        for s in reversed(started):
            with contextlib.suppress(Exception):
                s.stop(by)
        raise
    cpu_before, host_before = _own_cpu(), HostMark.read()
    EXIT_WAITS.clear()  # the threads of an earlier window in this process (diagnose watch) are not this one's
    opened, t0 = epoch(), clock()
    # each wait's mark, read before its timeout is: a wait that ends late (its thread, or one holding the GIL it
    # needs back, not run; its code paged back in from the disk) ends the window late, and the host's part of
    # that is in the readings since the last wait's mark (the steal over the window bounds this one's)
    polled = HostMark.read(threads=True, steal=False)
    while not should_stop():
        marked = HostMark.read(threads=True, steal=False)
        elapsed = clock() - t0
        if progress:
            progress(min(elapsed, duration_s), duration_s)
        if elapsed >= duration_s:
            break
        polled = marked
        stop.wait(min(POLL_S, duration_s - elapsed))
    late_s = round(max(0.0, clock() - t0 - duration_s), 3)
    late = {"late_s": late_s, **HostMark.read(threads=True, steal=False).since(polled, "late")}
    # the stop, timed: the profiler's (sources[0], what the target sees end), each kind of source's and all of
    # them, with the time the stopping thread waited for a CPU and the host's steal meanwhile (a saturated or
    # oversubscribed host stretches the stop, not the attach's work). The wait above is on the clock: a host
    # that stole time from it ends it no later than it would have
    # one deadline for every source's stop (the sources' own threads are waited for until then, never past it)
    by = time.monotonic() + STOP_BUDGET_S
    # (a source's thread that ended in the window is in both readings: its wait is not the stop's)
    stopping, host_stopping = clock(), HostMark.read(threads=True)
    stopped_first = stopping
    stops: dict[str, float] = {}
    stop_failed: dict[int, str] = {}
    for i, s in enumerate(sources):
        began = clock()
        try:  # one source's defect neither stops the others' stop nor ends the attach in a traceback
            s.stop(by)
        except Exception:
            stop_failed[i] = traceback.format_exc()
        ended = clock()
        kind = _collector(s)
        stops[kind] = round(stops.get(kind, 0.0) + ended - began, 3)
        if i == 0:
            stopped_first = ended
    t1 = clock()
    cpu_after, host_after = _own_cpu(), HostMark.read(threads=True)
    cpu_self, cpu_kids = cpu_after[0] - cpu_before[0], cpu_after[1] - cpu_before[1]
    cpu_window = cpu_self + cpu_kids
    cost = {"window_s": t1 - t0, "cpu_s": round(cpu_window, 4), "self_cpu_s": round(cpu_self, 4),
            "pyspy_cpu_s": round(cpu_kids, 4), "cores": round(cpu_window / max(1e-9, t1 - t0), 4),
            "stop_s": round(t1 - stopping, 3), "first_stop_s": round(stopped_first - stopping, 3),
            **host_after.since(host_stopping, "stop"), **late}
    if (steal := stolen_between(host_before.stolen, host_after.stolen)) is not None:
        cost["steal_s"] = steal
    return Ran(Window(opened, opened + (t1 - t0)), cost, sum(cpu_before), sum(cpu_after), host_before, host_after,
               stops, t1, stop_failed)


def _before_window(entered: float, cpu_entered: float, ran: Ran,
                   host_entered: HostMark | None = None, age_entered: float | None = None) -> dict[str, float]:
    """What the attach spent before its window opened: since its process started (the interpreter and its
    imports: ``started_s``; ``age_entered``: how old the process was when ``attach()`` was called) and since
    ``attach()`` was called (checks, the busy probe: ``setup_s``, and its CPU, ``setup_cpu_s``; the host's CPU
    time stolen meanwhile, ``setup_steal_s``, and the machine's stalls on the disk and memory, ``setup_stall_s``)."""
    born = entered - (age_entered or 0.0)
    before: dict[str, float] = {"started_s": round(ran.window.start - born, 3),
                                "setup_s": round(ran.window.start - entered, 3),
                                "setup_cpu_s": round(ran.cpu_opened - cpu_entered, 4)}
    opened = ran.host_opened
    if opened is not None and opened.waited is not None:
        before["started_wait_s"] = round(opened.waited, 3)
    if opened is not None and host_entered is not None:
        shares = opened.since(host_entered, "setup")
        before.update({k: shares[k] for k in ("setup_steal_s", "setup_stall_s", "setup_majflt") if k in shares})
    return before


def _started_to_attach() -> bool:
    """Whether this process was started as diagnose's command (the ``diagnose`` script, ``python -m diagnose``):
    then its life before the attach is the interpreter's start and imports, not another program's (a test
    runner, a notebook calling the CLI's ``main``)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return os.path.basename(sys.argv[0]) == "diagnose" or (spec is not None and spec.name.startswith("diagnose."))


def imports_cost() -> dict[str, float]:
    """The interpreter's start and its imports, from this process's birth to now, for a process that was
    started to attach once (``diagnose attach``; read as its command begins): their length (``imports_s``), the
    process's CPU meanwhile (``imports_cpu_s``), its major faults and the bytes it had read from storage
    (``imports_majflt``; ``imports_inblock``, in 512-byte blocks, readahead included), and the time the main
    thread was neither run nor waiting for a CPU (``imports_blocked_s``: the length less the CPU less its
    run-queue delay). An import rarely sleeps, so that is mostly its reads' time: a virtual machine that sheds
    its page cache has the attach read its libraries back at the disk's pace (what else blocked it, a lock or
    a subprocess, reads nothing: ``tests/attach_cost.py`` forgives only what the bytes read explain). The CPU
    is every thread's; the start time is the kernel's, to its clock tick. Empty where /proc does not say."""
    age, mark = _age(), HostMark.read(steal=False)
    if age is None:
        return {}
    cpu = sum(_own_cpu())
    out: dict[str, float] = {"imports_s": round(age, 3), "imports_cpu_s": round(cpu, 4)}
    if mark.majflt is not None:
        out["imports_majflt"] = mark.majflt
    if mark.inblock is not None:
        out["imports_inblock"] = mark.inblock
    if mark.waited is not None:
        out["imports_wait_s"] = round(mark.waited, 3)
        out["imports_blocked_s"] = round(max(0.0, age - cpu - mark.waited), 3)
    return out


def _after_window(ran: Ran) -> dict[str, float]:
    """What the attach spent after its window closed (the captures, the analysis): wall, CPU and, where the
    kernel says, the time it waited for a CPU (``after_wait_s``), the steal and the machine's stalls meanwhile."""
    after = {"after_s": round(time.monotonic() - ran.closed_at, 3),
             "after_cpu_s": round(sum(_own_cpu()) - ran.cpu_closed, 4)}
    if ran.host_closed is not None:
        shares = HostMark.read().since(ran.host_closed, "after")
        after.update({k: shares[k] for k in ("after_wait_s", "after_steal_s", "after_stall_s", "after_majflt")
                      if k in shares})
    return after


def _age() -> float | None:
    """Seconds since this process started: its start time (``/proc/self/stat``, clock ticks since boot) against
    the boot clock. (psutil's create_time adds /proc/stat's boot time, which is whole seconds: up to a second
    off.) None where /proc does not say."""
    stat = process_collector.read_stat(os.getpid())
    if stat is None:
        return None
    return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - float(stat["start_ticks"]) / process_collector.CLK_TCK)


def _waited() -> float | None:
    """Seconds the calling thread has spent runnable but waiting for a CPU since it started (the kernel's
    run-queue delay, ``/proc/thread-self/schedstat``'s second field); None where the kernel does not say.
    The attach does its work outside the window on its main thread, so on a saturated host this is what
    stretches that work's wall time, and it is the host's, not the attach's."""
    ss = process_collector.schedstat_at("/proc/thread-self/schedstat")
    return ss[1] / 1e9 if ss is not None else None


def _thread_waits(task: str = "/proc/self/task") -> dict[str, float] | None:
    """Seconds each thread of this process has spent runnable but waiting for a CPU since it started (each
    ``TID/schedstat``'s second field), by thread id; None where the kernel does not say. The stop waits for
    the sources' own threads (py-spy's recording, the samplers) until its deadline: on a host that does not
    run them, this is where the stop's time went."""
    try:
        tids = os.listdir(task)
    except OSError:
        return None
    read = {tid: process_collector.schedstat_at(os.path.join(task, tid, "schedstat")) for tid in tids}
    return {tid: ss[1] / 1e9 for tid, ss in read.items() if ss is not None} or None  # None: a thread that ended


def _source_thread_waits() -> dict[str, float] | None:
    """``_thread_waits`` of this process, with the sources' threads that have ended, each as it read itself
    (``sources.EXIT_WAITS``)."""
    live = _thread_waits()
    return None if live is None else {**EXIT_WAITS, **live}


def waited_most(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    """The most any one thread waited for a CPU between two ``_thread_waits`` readings (a thread that started
    in between: all of its wait); None where either is unknown."""
    if before is None or after is None:
        return None
    return round(max((w - before.get(tid, 0.0) for tid, w in after.items()), default=0.0), 3)


def _stolen(path: str = "/proc/stat") -> Stolen | None:
    """Seconds each CPU of this machine has had stolen since boot (``/proc/stat``'s steal column): on a
    virtual machine, the time a virtual CPU had work while the hypervisor ran something else. A thread that
    was running on that CPU then did not run, and its run-queue delay does not count it (a queued thread's
    does): CPU-bound work and timed wake-ups stretch by it in wall time. None where the kernel does not say
    (a container's view of ``/proc/stat`` may also show zeros)."""
    try:
        with open(path, encoding="ascii") as fh:
            rows = [line.split() for line in fh if line.startswith("cpu") and line[3:4].isdigit()]
        tick = os.sysconf("SC_CLK_TCK")
        return {r[0]: int(r[8]) / tick for r in rows} if rows else None
    except (OSError, ValueError, IndexError):
        return None


def stolen_between(before: Stolen | None, after: Stolen | None) -> float | None:
    """The most any one CPU (present at both readings) had stolen between two ``_stolen`` readings: what a
    paused machine (every CPU alike) took from the interval, and the most it took from a thread that kept to
    one CPU through it."""
    if before is None or after is None:
        return None
    both = before.keys() & after.keys()
    return round(max((after[c] - before[c] for c in both), default=0.0), 3) if both else None


Stalled = tuple[float, float]  # seconds this machine has stalled on the disk, and on memory, since boot


def _stalled(root: str = "/proc/pressure") -> Stalled | None:
    """Seconds since boot during which at least one task of this machine stalled on the disk, and on memory
    (the kernel's pressure stall information: ``io`` and ``memory``'s ``some total=``, in microseconds); None
    where the kernel does not say (before Linux 4.20, or PSI off). A thread that touches a page the host evicted
    (its code, a library's: a virtual machine may shed its page cache with memory free) waits for the disk off
    the run queue: neither its CPU time nor its run-queue delay nor the steal counts that wait. These are the
    whole machine's stalls, any task's, so they bound a thread's from above: the attach's own major faults
    (``HostMark.majflt``) say whether it took part."""
    totals = []
    try:
        for kind in ("io", "memory"):
            with open(os.path.join(root, kind), encoding="ascii") as fh:
                some = next((line for line in fh if line.startswith("some ")), "")
            totals.append(int(some.rsplit("total=", 1)[1]) / 1e6)
    except (OSError, ValueError, IndexError):
        return None
    return totals[0], totals[1]


@dataclass(frozen=True)
class HostMark:
    """What the host had taken from the attach by one instant, each a total since boot or since the thread
    began: the calling thread's run-queue delay (``_waited``), every CPU's steal (``_stolen``; left out of the
    wait's marks, 4 a second: /proc/stat costs a big host's kernel a millisecond), the machine's stalls on the
    disk and on memory (``_stalled``), the attach process's major faults (all its threads', ended ones
    included: each a wait for the disk), and (``threads``) each of the attach's threads' run-queue delay
    (``_source_thread_waits``). Two marks say how much of an interval's wall time was the host's (``since``)."""

    waited: float | None
    stolen: Stolen | None
    stalled: Stalled | None
    majflt: int | None
    threads: dict[str, float] | None = None
    inblock: int | None = None  # the bytes the attach's process read from storage, in 512-byte blocks

    @classmethod
    def read(cls, threads: bool = False, steal: bool = True) -> HostMark:
        use = resource.getrusage(resource.RUSAGE_SELF)
        return cls(_waited(), _stolen() if steal else None, _stalled(), use.ru_majflt,
                   _source_thread_waits() if threads else None, use.ru_inblock)

    def since(self, before: HostMark, phase: str) -> dict[str, float]:
        """``{phase}_wait_s`` (the calling thread's run-queue delay), ``_steal_s`` (the most one CPU lost),
        ``_threads_wait_s`` (the most any thread of the attach waited, where both marks read the threads),
        ``_stall_s`` (the most the machine stalled on the disk or on memory: a page read back after it was
        evicted counts in both) and ``_majflt`` (the attach's major faults) from ``before`` to this mark, each
        where the kernel says."""
        out: dict[str, float] = {}
        if self.waited is not None and before.waited is not None:
            out[f"{phase}_wait_s"] = round(self.waited - before.waited, 3)
        if (steal := stolen_between(before.stolen, self.stolen)) is not None:
            out[f"{phase}_steal_s"] = steal
        if (most := waited_most(before.threads, self.threads)) is not None:
            out[f"{phase}_threads_wait_s"] = most
        if self.stalled is not None and before.stalled is not None:
            out[f"{phase}_stall_s"] = round(max(a - b for a, b in zip(self.stalled, before.stalled, strict=True)), 3)
        if self.majflt is not None and before.majflt is not None:
            out[f"{phase}_majflt"] = self.majflt - before.majflt
        return out


def _own_cpu() -> tuple[float, float]:
    """CPU seconds of this process, and of its children that have exited (every py-spy it ran)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def attach_cli(args: argparse.Namespace) -> Diagnosis:
    """Attach with a progress bar on stderr; Ctrl-C ends the window early and keeps the data."""
    imports = imports_cost() if _started_to_attach() else {}  # its start is the attach's
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
                session, diagnosis = attach(opts, stop, imports=imports)
        else:
            session, diagnosis = attach(opts, stop, imports=imports)
    finally:
        signal.signal(signal.SIGINT, previous)
    for cap in session.captures:
        if cap.collector == nvml_collector.COLLECTOR and cap.status is CaptureStatus.SKIPPED:
            print(f"GPU evidence skipped: {cap.reason}.", file=sys.stderr)
        if cap.collector == PySpySource.collector and len(cap.notes) > 1:  # a tree: what each process gave
            print("py-spy, per process of the tree:", *(f"  {n}" for n in cap.notes), sep="\n", file=sys.stderr)
    print(f"session written to {session.path}", file=sys.stderr)
    return diagnosis


def _stderr_console() -> Any:
    from rich.console import Console

    return Console(file=sys.stderr)
