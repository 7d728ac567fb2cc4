"""py-spy: sample the target's Python stacks without pausing it.

Recording: ``py-spy record --nonblocking --threads --subprocesses --format raw`` for the window
(never pauses the target; follows uvicorn workers and engine processes), plus a few
``py-spy dump --json --nonblocking`` snapshots, which say per thread whether it is active and
whether it owns the GIL.

Only *active* samples are recorded by ``record`` (no ``--idle``): the raw format cannot mark a
sample as idle, and idle threads must not dilute the shares. Idle threads are seen in the dumps.

Parsing is pure: ``parse_raw`` and ``parse_dump`` turn the raw files into records.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from analyzer.model import Availability

RAW_FILE = "pyspy.raw"
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


def parse_raw_line(line: str) -> StackSample | None:
    """One line of py-spy's raw (collapsed) format, or None if it is not one."""
    stack, _, count_s = line.rstrip("\n").rpartition(" ")
    if not stack or not count_s.isdigit():
        return None
    pid, process, tid, thread = 0, "", 0, ""
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


def parse_raw(lines: Iterable[str]) -> list[StackSample]:
    return [s for s in (parse_raw_line(rec) for rec in _records(lines)) if s is not None]


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


def take_dumps(exe: str, pids: list[int], path: str) -> None:
    """Append one ``dump --json`` snapshot per pid; a failed dump is skipped (best effort)."""
    for p in dict.fromkeys(pids):
        try:
            out = subprocess.run([exe, "dump", "--json", "--nonblocking", "--pid", str(p)],
                                 capture_output=True, timeout=10, stdin=subprocess.DEVNULL)
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
    tail = last[-1][:200] if last else f"exit code {returncode}"
    return f"py-spy failed: {tail}"
