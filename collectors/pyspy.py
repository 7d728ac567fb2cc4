"""py-spy: sample the target's Python stacks without pausing it.

Recording (``record_chunked``, what ``diagnose attach`` runs): the window is cut into chunks of a
few seconds; before each, a planner (``diagnose.collectors.budget``) picks the processes worth sampling and
their rates, and for each one py-spy runs ``record --nonblocking --threads --format raw``:

* a ``cpu`` record (active samples only) for the processes that use CPU: the on-CPU profile. The
  raw format cannot mark a sample as idle, and idle threads must not dilute the CPU shares;
* a ``wall`` record (``--idle --full-filenames``) for the processes that serve requests or use CPU:
  every thread, waiting or not, so the time a request thread spends *waiting* (for a lock, a
  compiler child, a queue, a socket, a GPU) is seen. Full file names let the attach read the source
  line a blocked thread stands on (``read_source_lines``): ``with lock:`` and ``x.item()`` are C
  calls with no Python frame of their own;
* a ``cover`` record (``--idle``, ``budget.COVER_RATE_HZ``) of every other Python process of the tree,
  kept apart in ``pyspy-cover.raw``: where each idle process stood, never part of the evidence;
* one ``dump --json --nonblocking`` of each busy process in the middle chunk: per thread whether it
  is active and whether it owns the GIL.

Bounded whatever py-spy does: at a chunk's end its py-spys are told to stop (SIGINT: each writes its
file) and share one grace (``STOP_GRACE_S``); one still running then (it fell behind, or hangs) is
killed, its samples of that chunk are lost, and the result is partial and says which. How many samples
each record gave, and how far py-spy fell behind its rate, are kept per chunk (``pyspy-meta.json``).

The chunks' output is merged into ``pyspy.raw`` and ``pyspy-wall.raw``, each record prefixed with
``process PID:"command line"`` as ``--subprocesses`` would write it, and ``pyspy-meta.json`` (written
by the attach) says which lines came from which chunk, process and rate: the spread between chunks is
the measurement's noise. ``record`` (one ``--subprocesses`` run over the window) is the older way,
kept for comparison (``benchmarks/attach_overhead.py --collectors``).

Parsing is pure: ``parse_raw`` and ``parse_dump`` turn the raw files into records.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from diagnose.model import Availability

RAW_FILE = "pyspy.raw"
WALL_FILE = "pyspy-wall.raw"
COVER_FILE = "pyspy-cover.raw"  # coarse wall-clock views of the processes that neither work nor serve
SOURCE_FILE = "pyspy-wall-source.json"
LOG_FILE = "pyspy.log"
DUMPS_FILE = "pyspy-dumps.jsonl"
DEFAULT_RATE_HZ = 50  # 500 samples of a busy thread in a 10 s window; 100 Hz costs a 2-core box twice the CPU


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int


@dataclass(frozen=True)
class StackSample:
    """``count`` identical active samples of one thread's stack (root first)."""

    pid: int
    process: str
    tid: int
    thread: str
    frames: tuple[Frame, ...]
    count: int


def find_pyspy() -> str | None:
    """py-spy next to this interpreter (the venv it was installed into), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("py-spy")


def probe() -> Availability:
    exe = find_pyspy()
    if exe is None:
        return Availability(False, "py-spy is not installed", "pip install py-spy (it ships as a wheel)")
    return Availability(True)


_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_PROCESS = re.compile(r'^process (?P<pid>\d+):"(?P<cmd>.*)"$', re.DOTALL)
_THREAD = re.compile(r"^thread \((?P<tid>0x[0-9a-fA-F]+|\d+)\)(?::\s*(?P<name>.*))?$")


def _split_frames(stack: str) -> list[str]:
    # frames are separated by ";" but a process' command line (quoted) may contain ";"
    out: list[str] = []
    buf = ""
    in_quote = False
    for ch in stack:
        if ch == '"':
            in_quote = not in_quote
        if ch == ";" and not in_quote:
            out.append(buf)
            buf = ""
        else:
            buf += ch
    out.append(buf)
    return out


def parse_raw_line(line: str, pid: int = 0) -> StackSample | None:
    """One line of py-spy's raw (collapsed) format, or None if it is not one; ``pid`` is the process
    of a record without a ``process N:"…"`` prefix (a run without ``--subprocesses``)."""
    stack, _, count_s = line.rstrip("\n").rpartition(" ")
    if not stack or not count_s.isdigit():
        return None
    process, tid, thread = "", 0, ""
    frames: list[Frame] = []
    for part in _split_frames(stack):
        m = _PROCESS.match(part)
        if m:
            pid, process = int(m["pid"]), m["cmd"]  # the innermost process wins
            continue
        m = _THREAD.match(part)
        if m and not frames:
            tid_s = m["tid"]
            tid = int(tid_s, 16) if tid_s.startswith("0x") else int(tid_s)
            thread = (m["name"] or "").strip()
            continue
        m = _FRAME.match(part)
        if m:
            frames.append(Frame(m["func"], m["file"], int(m["line"] or 0)))
        elif part:
            frames.append(Frame(part, "", 0))
    if not frames and not thread:
        return None
    return StackSample(pid, process, tid, thread, tuple(frames), int(count_s))


def _records(lines: Iterable[str]) -> Iterator[str]:
    """Physical lines → records. A command line with newlines (``python -c "…"``) splits a record
    over several lines; every record starts with ``process `` or ``thread (``."""
    buf = ""
    for line in lines:
        line = line.rstrip("\n")
        if buf and (line.startswith("process ") or line.startswith("thread (")):
            yield buf
            buf = line
        else:
            buf = f"{buf}\n{line}" if buf else line
    if buf:
        yield buf


def parse_raw(lines: Iterable[str], pid: int = 0) -> list[StackSample]:
    return [s for s in (parse_raw_line(rec, pid) for rec in _records(lines)) if s is not None]


@dataclass(frozen=True)
class ThreadState:
    pid: int
    tid: int
    name: str
    active: bool
    owns_gil: bool
    leaf: str


def parse_dump(doc: object, pid: int) -> list[ThreadState]:
    """One ``py-spy dump --json`` document (a list of threads) into thread states."""
    out: list[ThreadState] = []
    if not isinstance(doc, list):
        return out
    for th in doc:
        if not isinstance(th, dict):
            continue
        frames = th.get("frames") or []
        leaf = ""
        if frames and isinstance(frames[0], dict):
            leaf = f"{frames[0].get('name', '?')} ({frames[0].get('short_filename') or frames[0].get('filename', '')})"
        out.append(
            ThreadState(
                pid=int(th.get("pid") or pid),
                tid=int(th.get("os_thread_id") or th.get("thread_id") or 0),
                name=str(th.get("thread_name") or ""),
                active=bool(th.get("active")),
                owns_gil=bool(th.get("owns_gil")),
                leaf=leaf,
            )
        )
    return out


def read_dumps(path: str) -> list[list[ThreadState]]:
    snaps: list[list[ThreadState]] = []
    if not os.path.exists(path):
        return snaps
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            snaps.append(parse_dump(rec.get("threads"), int(rec.get("pid", 0))))
    return snaps


@dataclass
class RecordResult:
    ok: bool
    partial: bool
    reason: str
    files: list[str]
    samples_reported: int | None = None


_SAMPLES = re.compile(r"Samples:\s*(\d+)\s+Errors:\s*(\d+)")


def record(
    pid: int,
    duration_s: float,
    out_dir: str,
    *,
    rate_hz: int = DEFAULT_RATE_HZ,
    subprocesses: bool = True,
    should_stop: Callable[[], bool] = lambda: False,
    dump_pids: Callable[[], list[int]] = lambda: [],
    n_dumps: int = 3,
) -> RecordResult:
    """Run py-spy record for the window; stop early (cleanly, keeping samples) if asked.

    py-spy writes its output when it receives SIGINT, so an early stop keeps what was sampled.
    """
    exe = find_pyspy()
    if exe is None:
        return RecordResult(False, False, "py-spy is not installed", [])
    raw_path = os.path.join(out_dir, RAW_FILE)
    log_path = os.path.join(out_dir, LOG_FILE)
    cmd = [exe, "record", "--nonblocking", "--threads", "--format", "raw", "--rate", str(rate_hz),
           "--duration", str(max(1, round(duration_s))), "--pid", str(pid), "--output", raw_path]
    if subprocesses:
        cmd.append("--subprocesses")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        start = time.monotonic()
        deadline = start + duration_s + 15.0  # py-spy's own duration plus time to write its file
        dump_at = [start + duration_s * (i + 1) / (n_dumps + 1) for i in range(n_dumps)]
        stopped_early = False
        dumps_path = os.path.join(out_dir, DUMPS_FILE)
        while proc.poll() is None:
            now = time.monotonic()
            if should_stop() and not stopped_early:
                proc.send_signal(signal.SIGINT)
                stopped_early = True
            if dump_at and now >= dump_at[0]:
                dump_at.pop(0)
                take_dumps(exe, [pid, *dump_pids()], dumps_path)
            if now > deadline:
                proc.kill()
                break
            time.sleep(0.05)
        proc.wait()
    files = [RAW_FILE, LOG_FILE]
    if os.path.exists(os.path.join(out_dir, DUMPS_FILE)):
        files.append(DUMPS_FILE)
    with open(log_path, encoding="utf-8", errors="replace") as fh:
        log_text = fh.read()
    m = _SAMPLES.search(log_text)
    reported = int(m.group(1)) if m else None
    if not os.path.exists(raw_path):
        return RecordResult(False, False, explain_failure(log_text, proc.returncode), [LOG_FILE])
    partial = stopped_early
    reason = "stopped early by the user" if stopped_early else ""
    if proc.returncode not in (0, None, -signal.SIGINT) and not stopped_early:
        partial = True
        reason = explain_failure(log_text, proc.returncode)
    return RecordResult(True, partial, reason, files, reported)


@dataclass
class Plan:
    """One process to sample in a chunk: ``cpu_rate_hz`` / ``wall_rate_hz`` 0 means not that record."""

    pid: int
    cpu_rate_hz: int
    wall_rate_hz: int
    why: str = ""
    coarse: bool = False  # the wall-clock view only covers the process: its records go to ``COVER_FILE``


@dataclass
class ChunkedResult:
    ok: bool
    partial: bool
    reason: str
    files: list[str]
    chunks: list[dict[str, object]]
    plans: list[dict[str, object]]
    samples_reported: int = 0
    overruns: list[str] = field(default_factory=list)  # each py-spy killed past its grace, in words


STOP_GRACE_S = 2.0  # py-spy writes its file within milliseconds of SIGINT; past this it is killed (its
# samples of that chunk are lost). One grace per chunk, shared by all its py-spys, so that whatever
# py-spy does the recording ends at most this long after the window does
MIN_CHUNK_S = 1.0  # a chunk left shorter than this (the one before overran) is not started
DUMP_TIMEOUT_S = 10.0
POLL_S = 0.1

_BEHIND = re.compile(r"([\d.]+)\s*(ns|µs|us|ms|s) behind in sampling")
_UNIT_S = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}


def behind_s(log_text: str) -> float:
    """How far py-spy fell behind its sampling rate (its own "… behind in sampling" lines), in seconds."""
    worst = 0.0
    for m in _BEHIND.finditer(log_text):
        try:
            worst = max(worst, float(m.group(1)) * _UNIT_S[m.group(2)])
        except ValueError:
            continue
    return worst


def _cmdline(pid: int, redact: Callable[[Sequence[str]], Sequence[str]] = tuple) -> str:
    """The process' command line for its records' ``process`` prefix, through ``redact`` as it is read (the
    attach passes its secret redaction: then the raw files never hold them, even from a recording abandoned
    after the window that still writes its records)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return " ".join(redact([a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]))
    except OSError:
        return ""


def _prefixed(raw_path: str, pid: int, cmd: str) -> list[str]:
    """A single-process raw file's records, each on one line with a ``process`` prefix."""
    if not os.path.exists(raw_path):
        return []
    with open(raw_path, encoding="utf-8", errors="replace") as fh:
        records = list(_records(fh))
    safe = cmd.replace('"', "'").replace("\n", " ")
    out: list[str] = []
    for rec in records:
        rec = rec.replace("\n", " ")
        if not rec.strip() or parse_raw_line(rec) is None:
            continue
        out.append(rec if rec.startswith("process ") else f'process {pid}:"{safe}";{rec}')
    return out


def _count(records: list[str]) -> int:
    """The samples of merged raw records (the count that ends each line)."""
    return sum(int(n) for r in records if (n := r.rpartition(" ")[2]).isdigit())


@dataclass
class _Running:
    """One py-spy of a chunk."""

    kind: str
    plan: Plan
    rate: int
    out: str
    log: str
    proc: subprocess.Popen[bytes]
    began: float
    stop_at: float  # when to send SIGINT: 2.5 sample intervals before the chunk's end
    signalled: bool = False
    ended: float = 0.0  # when it was told to stop: its samples cover ``began``..``ended``

    def interrupt(self, now: float) -> None:
        if not self.signalled:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
            self.signalled, self.ended = True, now


KIND_WORDS = {"cpu": "on-CPU", "wall": "wall-clock", "cover": "coarse wall-clock"}


def _stop_chunk(running: list[_Running], grace_until: float, clock: Callable[[], float]) -> set[int]:
    """SIGINT every py-spy still running (each writes its file), wait for all of them until
    ``grace_until``, kill those still running then. Returns the indexes of the killed ones."""
    now = clock()
    for r in running:
        r.interrupt(now)
    killed: set[int] = set()
    for i, r in enumerate(running):
        try:
            r.proc.wait(timeout=max(0.0, grace_until - clock()))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            killed.add(i)
            with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in the kernel: it cannot hold us
                r.proc.wait(timeout=1.0)
    return killed


def record_chunked(
    pid: int,
    duration_s: float,
    out_dir: str,
    planner: Callable[[int], list[Plan]],
    *,
    n_chunks: int = 1,
    should_stop: Callable[[], bool] = lambda: False,
    on_chunk: Callable[[int], None] = lambda k: None,
    dumps: bool = True,
    clock: Callable[[], float] = time.monotonic,
    grace_s: float = STOP_GRACE_S,
    start: float | None = None,
    redact: Callable[[Sequence[str]], Sequence[str]] = tuple,
) -> ChunkedResult:
    """Record the window in ``n_chunks`` chunks, each planned by ``planner(k)`` (see the module docstring).

    ``on_chunk(k)`` runs before chunk ``k`` is planned (the attach takes a full process sample there).
    Never pauses the target; an early stop (``should_stop``) ends the current chunk cleanly.

    Bounded whatever py-spy does: chunk ``k`` ends at ``start + duration_s * (k + 1) / n_chunks`` on one
    schedule; its py-spys get ``grace_s`` together to write their files after SIGINT and are killed
    past it (``overruns`` says which, and the result is partial), a chunk that overran shortens the
    next one (one left under ``MIN_CHUNK_S`` is not started), and a dump never outlasts its chunk. So
    this returns at most ``grace_s`` (plus a second for a kill) after ``duration_s``.

    ``start`` anchors the schedule (the window's start, on ``clock``; default: now): a thread that began
    late on a host short of CPU records what is left of the window, not a window of its own, and ends as
    the window does; the chunks it had too little time left for are not recorded, and the result is partial
    and says so.
    """
    exe = find_pyspy()
    if exe is None:
        return ChunkedResult(False, False, "py-spy is not installed", [], [], [])
    tmp = os.path.join(out_dir, ".pyspy-chunks")
    os.makedirs(tmp, exist_ok=True)
    files = {"cpu": os.path.join(out_dir, RAW_FILE), "wall": os.path.join(out_dir, WALL_FILE),
             "cover": os.path.join(out_dir, COVER_FILE)}
    lines_written = {"cpu": 0, "wall": 0, "cover": 0}
    for path in files.values():
        open(path, "w").close()
    chunks: list[dict[str, object]] = []
    plans: list[dict[str, object]] = []
    logs: list[str] = []
    cmds: dict[int, str] = {}
    stopped_early = False
    failures: list[str] = []
    overruns: list[str] = []
    cpu_reported: list[int] = []
    skipped: list[int] = []
    start = clock() if start is None else start
    for k in range(n_chunks):
        if should_stop():
            stopped_early = True
            break
        chunk_end = start + duration_s * (k + 1) / n_chunks
        if chunk_end - clock() < MIN_CHUNK_S:
            if not plans:  # no chunk ran yet: the thread began late (after one: it overran into this one's time)
                skipped.append(k)
            continue
        on_chunk(k)
        todo = planner(k)
        plans.append({"chunk": k, "processes": [{"pid": p.pid, "cpu_rate_hz": p.cpu_rate_hz,
                                                  "wall_rate_hz": p.wall_rate_hz, "why": p.why,
                                                  **({"coarse": True} if p.coarse else {})} for p in todo]})
        running: list[_Running] = []
        for p in todo:
            for kind, rate in (("cpu", p.cpu_rate_hz), ("cover" if p.coarse else "wall", p.wall_rate_hz)):
                if rate <= 0:
                    continue
                cmds.setdefault(p.pid, _cmdline(p.pid, redact))
                out = os.path.join(tmp, f"{kind}-{k}-{p.pid}.raw")
                log = os.path.join(tmp, f"{kind}-{k}-{p.pid}.log")
                left = max(1.0, chunk_end - clock())
                cmd = [exe, "record", "--nonblocking", "--threads", "--format", "raw", "--rate", str(rate),
                       "--duration", str(int(left) + 2), "--pid", str(p.pid), "--output", out]
                if kind == "wall":
                    cmd += ["--idle", "--full-filenames"]
                elif kind == "cover":
                    cmd.append("--idle")
                with open(log, "wb") as fh:
                    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                began = clock()
                # py-spy sees SIGINT only between samples and exits up to about 4 intervals later (measured
                # on an idle process: up to 0.35 s at 10 Hz, 0.8 s at 5 Hz, 2 s at 2 Hz, 3.5 s at 1 Hz): told
                # 2.5 intervals early, it stops about when the chunk ends instead of holding the next chunk
                # (or the attach) back; its record's seconds end at the signal, so its shares stay right
                lead = min(2.5 / rate, (chunk_end - began) / 3)
                running.append(_Running(kind, p, rate, out, log, proc, began, chunk_end - lead))
        dumped = not dumps or k != n_chunks // 2  # one dump of the busy processes, mid-window
        mid = (clock() + chunk_end) / 2
        while clock() < chunk_end and any(r.proc.poll() is None for r in running):
            if should_stop():
                stopped_early = True
                break
            if not dumped and clock() >= mid:
                dumped = True
                take_dumps(exe, [p.pid for p in todo if p.cpu_rate_hz > 0], os.path.join(out_dir, DUMPS_FILE),
                           budget_s=max(0.0, chunk_end - clock()))
            now = clock()
            for r in running:
                if now >= r.stop_at:
                    r.interrupt(now)
            time.sleep(POLL_S)
        stop_at = clock()
        killed = _stop_chunk(running, min(stop_at, start + duration_s) + grace_s, clock)
        for i, r in enumerate(running):
            with open(r.log, encoding="utf-8", errors="replace") as fh:
                log_text = fh.read()
            logs.append(f"== chunk {k} {r.kind} pid {r.plan.pid} at {r.rate} Hz\n{log_text}")
            m = _SAMPLES.search(log_text)
            recs = _prefixed(r.out, r.plan.pid, cmds.get(r.plan.pid, ""))
            got = os.path.exists(r.out) and i not in killed
            if i in killed:
                overruns.append(f"py-spy's {KIND_WORDS[r.kind]} record of pid {r.plan.pid} did not stop within "
                                f"{grace_s:g} s of the end of chunk {k} and was killed: its samples of that chunk "
                                "are lost")
                recs = []
            elif not os.path.exists(r.out):
                failures.append(explain_failure(log_text, r.proc.returncode))
            with open(files[r.kind], "a", encoding="utf-8") as fh:
                fh.writelines(rec + "\n" for rec in recs)
            a = lines_written[r.kind]
            lines_written[r.kind] += len(recs)
            if r.kind == "cpu" and m and got:
                cpu_reported.append(int(m.group(1)))
            chunks.append({"chunk": k, "kind": r.kind, "pid": r.plan.pid, "rate_hz": r.rate,
                           "seconds": round(max(0.0, min(stop_at, r.ended or stop_at) - r.began), 4),
                           "lines": [a, lines_written[r.kind]], "samples": _count(recs),
                           "samples_reported": int(m.group(1)) if m and got else None,
                           "behind_s": round(behind_s(log_text), 3), "killed": i in killed, "ok": got})
        if stopped_early:
            break
    with open(os.path.join(out_dir, LOG_FILE), "w", encoding="utf-8") as fh:
        fh.write("\n".join(logs))
    shutil.rmtree(tmp, ignore_errors=True)
    written = [RAW_FILE, WALL_FILE, LOG_FILE, *([COVER_FILE] if lines_written["cover"] else [])]
    if not lines_written["cover"]:
        os.unlink(files["cover"])
    if os.path.exists(os.path.join(out_dir, DUMPS_FILE)):
        written.append(DUMPS_FILE)
    reported = sum(cpu_reported)
    if chunks and not any(c["ok"] for c in chunks):
        why = overruns[0] if overruns else failures[0] if failures else "py-spy recorded nothing"
        return ChunkedResult(False, False, why, [LOG_FILE], chunks, plans, reported, overruns)
    lost = (f"{len(skipped)} of {n_chunks} chunks not recorded (chunk {', '.join(map(str, skipped))}): the "
            "recording's thread began too late for them (a host short of CPU)" if skipped else "")
    if not chunks and skipped and not stopped_early:
        return ChunkedResult(False, False, lost, [LOG_FILE], chunks, plans, reported, overruns)
    if not chunks and not stopped_early:
        return ChunkedResult(False, False, "no Python process of the tree could be sampled", [LOG_FILE],
                             chunks, plans, reported, overruns)
    reason = "stopped early by the user" if stopped_early else ""
    partial = stopped_early or bool(failures) or bool(overruns) or bool(skipped)
    if overruns and not reason:
        reason = overruns[0] + (f" (and {len(overruns) - 1} more)" if len(overruns) > 1 else "")
    elif failures and not reason:
        reason = f"some chunks failed: {failures[0]}"
    elif lost and not reason:
        reason = lost
    return ChunkedResult(True, partial, reason, written, chunks, plans, reported, overruns)


MAX_SOURCE_LINES = 500
MAX_SOURCE_BYTES = 4 * 1024 * 1024


def read_source_lines(pid: int, wanted: Iterable[tuple[str, int]]) -> dict[str, str]:
    """The source text of (absolute file, line) pairs as the target sees its files (``/proc/PID/root``):
    what a thread blocked in a C call (``with lock:``, ``x.item()``, ``time.sleep``) stands on.
    Read-only, bounded (``MAX_SOURCE_LINES`` lines, ``.py`` files up to ``MAX_SOURCE_BYTES``)."""
    by_file: dict[str, set[int]] = {}
    for path, line in wanted:
        if path.endswith(".py") and os.path.isabs(path) and line > 0:
            by_file.setdefault(path, set()).add(line)
    out: dict[str, str] = {}
    budget = MAX_SOURCE_LINES
    for path, lines in sorted(by_file.items()):
        if budget <= 0:
            break
        real = f"/proc/{pid}/root{path}"
        try:
            if os.path.getsize(real) > MAX_SOURCE_BYTES:
                continue
            with open(real, encoding="utf-8", errors="replace") as fh:
                text = fh.read().splitlines()
        except OSError:
            continue
        for n in sorted(lines):
            if 0 < n <= len(text) and budget > 0:
                out[f"{path}:{n}"] = text[n - 1].strip()[:200]
                budget -= 1
    return out


def rewrite_commands(path: str, redact: Callable[[str], str]) -> None:
    """Rewrite the ``process N:"cmdline"`` prefixes of a raw profile through ``redact`` (secrets)."""
    rx = re.compile(r'(process \d+:")(.*?)(";)', re.DOTALL)
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    text = rx.sub(lambda m: m.group(1) + redact(m.group(2)) + m.group(3), text)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def take_dumps(exe: str, pids: list[int], path: str, budget_s: float = DUMP_TIMEOUT_S) -> None:
    """Append one ``dump --json`` snapshot per pid; a failed dump is skipped (best effort). All of them
    together take at most ``budget_s``: one still running then is killed."""
    deadline = time.monotonic() + budget_s
    for p in dict.fromkeys(pids):
        left = min(DUMP_TIMEOUT_S, deadline - time.monotonic())
        if left <= 0.05:
            break
        try:
            out = subprocess.run([exe, "dump", "--json", "--nonblocking", "--pid", str(p)],
                                 capture_output=True, timeout=left, stdin=subprocess.DEVNULL)
        except (subprocess.TimeoutExpired, OSError):
            continue
        if out.returncode != 0:
            continue
        try:
            threads = json.loads(out.stdout)
        except ValueError:
            continue
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"ts": time.time(), "pid": p, "threads": threads}) + "\n")


def explain_failure(log_text: str, returncode: int | None) -> str:
    """py-spy's failure as one sentence naming the likely cause."""
    low = log_text.lower()
    if "permission denied" in low or "operation not permitted" in low:
        return "py-spy was not permitted to read the process (ptrace denied)"
    if "no such process" in low or "failed to find process" in low:
        return "the process exited before py-spy could attach"
    if "failed to find python version" in low or "not a python" in low or "failed to get python" in low:
        return "py-spy found no Python interpreter in the process"
    last = [ln for ln in log_text.strip().splitlines() if ln.strip()]
    if not last and returncode == -signal.SIGINT:
        # our own stop at the chunk's end reached a py-spy that had printed and sampled nothing yet: its
        # start-up (the target's memory maps and symbols) outlasted the chunk
        return ("py-spy had not taken its first sample when its chunk ended: its start-up outlasted the chunk "
                "on a host short of CPU")
    tail = last[-1][:200] if last else f"exit code {returncode}"
    return f"py-spy failed: {tail}"
