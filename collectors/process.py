"""psutil and /proc: the target's process tree, threads, scheduling and in-flight requests.

Read-only: everything here reads /proc (directly or through psutil); nothing signals, pauses or
writes to the target. Samples are written as JSONL (one line per sample) so a session can be
replayed; ``read_samples`` is the pure parser.

In-flight requests are counted on the service's own listening sockets: accepted connections
(ESTABLISHED sockets owned by the tree whose local port is one the tree listens on) plus the
kernel's accept queue of each listening socket (``rx_queue`` of a LISTEN row in
/proc/PID/net/tcp), i.e. requests that have not even been accepted yet.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from analyzer.model import Availability

SAMPLES_FILE = "process.jsonl"
INFO_FILE = "process-info.json"
TCP_LISTEN = "0A"
TCP_ESTABLISHED = "01"


def probe(pid: int) -> Availability:
    if not psutil.pid_exists(pid):
        return Availability(False, f"no process with pid {pid}", "check the pid with `ps` or `pgrep -f`")
    try:
        psutil.Process(pid).cpu_times()
    except psutil.AccessDenied:
        return Availability(False, f"not permitted to read process {pid}", "run as the same user or as root")
    except psutil.NoSuchProcess:
        return Availability(False, f"process {pid} exited", "start the service again and attach while it runs")
    return Availability(True)


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped by its parent has exited)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def process_tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _socket_inodes(pid: int) -> set[str]:
    inodes: set[str] = set()
    for fd in glob.glob(f"/proc/{pid}/fd/*"):
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    return inodes


def _tcp_rows(pid: int) -> list[tuple[int, str, int, str]]:
    """(local port, state, rx_queue, inode) for every TCP socket in the pid's network namespace."""
    rows: list[tuple[int, str, int, str]] = []
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}", encoding="ascii", errors="replace") as fh:
                next(fh, None)
                for line in fh:
                    parts = line.split()
                    if len(parts) < 10:
                        continue
                    port = int(parts[1].rsplit(":", 1)[1], 16)
                    rx = int(parts[4].split(":")[1], 16)
                    rows.append((port, parts[3], rx, parts[9]))
        except (OSError, ValueError, IndexError):
            continue
    return rows


def connection_snapshot(pids: list[int]) -> dict[str, Any]:
    """Listening ports, accepted connections and the accept queue of the process tree."""
    inodes: set[str] = set()
    for p in pids:
        inodes |= _socket_inodes(p)
    rows = _tcp_rows(pids[0]) if pids else []
    mine = [r for r in rows if r[3] in inodes]
    listen_ports = sorted({r[0] for r in mine if r[1] == TCP_LISTEN})
    backlog = sum(r[2] for r in mine if r[1] == TCP_LISTEN)
    established = sum(1 for r in mine if r[1] == TCP_ESTABLISHED and r[0] in listen_ports)
    return {"listen_ports": listen_ports, "established": established, "accept_queue": backlog,
            "inflight": established + backlog}


def _schedstat(pid: int, tid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/task/{tid}/schedstat", encoding="ascii") as fh:
            run_ns, wait_ns, _ = fh.read().split()
        return int(run_ns), int(wait_ns)
    except (OSError, ValueError):
        return None


def sample(pids: list[int]) -> dict[str, Any]:
    """One sample of every process in the tree (read-only)."""
    procs: list[dict[str, Any]] = []
    for p in pids:
        try:
            proc = psutil.Process(p)
            with proc.oneshot():
                ct = proc.cpu_times()
                ctx = proc.num_ctx_switches()
                threads = []
                for th in proc.threads():
                    ss = _schedstat(p, th.id)
                    threads.append([th.id, th.user_time, th.system_time, *(ss or (None, None))])
                procs.append({
                    "pid": p,
                    "ppid": proc.ppid(),
                    "name": proc.name(),
                    "cpu_user": ct.user,
                    "cpu_system": ct.system,
                    "rss": proc.memory_info().rss,
                    "num_threads": proc.num_threads(),
                    "ctx_voluntary": ctx.voluntary,
                    "ctx_involuntary": ctx.involuntary,
                    "threads": threads,
                })
        except psutil.Error:
            continue
    return {"ts": time.time(), "processes": procs, "conn": connection_snapshot(pids),
            "loadavg": list(os.getloadavg())}


def inductor_cache_dir(pid: int) -> str:
    """Where the target's torch inductor cache lives (its env var, else torch's default)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(b"TORCHINDUCTOR_CACHE_DIR="):
                    return item.split(b"=", 1)[1].decode(errors="replace")
        uid = psutil.Process(pid).uids().real
        user = pwd.getpwuid(uid).pw_name
    except (OSError, KeyError, psutil.Error):
        user = "root"
    return os.path.join("/tmp", f"torchinductor_{user}")


def compiled_modules(pids: list[int]) -> set[str]:
    """Compiled-graph shared objects mapped into the tree (inductor's C++ kernels load as .so files).

    The process may set TORCHINDUCTOR_CACHE_DIR at run time (invisible in /proc/PID/environ),
    but every kernel it compiles and loads shows up in its memory maps, wherever the cache is.
    """
    found: set[str] = set()
    for p in pids:
        try:
            with open(f"/proc/{p}/maps", encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                    if path.endswith(".so") and "inductor" in path:
                        found.add(path)
        except OSError:
            continue
    return found


def count_files(root: str, limit: int = 200_000) -> int | None:
    if not os.path.isdir(root):
        return None
    n = 0
    for _, _, files in os.walk(root):
        n += len(files)
        if n >= limit:
            break
    return n


def target_info(pid: int) -> dict[str, Any]:
    proc = psutil.Process(pid)
    with proc.oneshot():
        cmdline = proc.cmdline()
        try:
            exe = proc.exe()
        except psutil.Error:
            exe = ""
        user = proc.username()
    try:
        cores = len(proc.cpu_affinity() or [])
    except (psutil.Error, AttributeError):
        cores = 0
    return {"pid": pid, "cmdline": cmdline, "exe": exe, "user": user,
            "cores": cores or psutil.cpu_count() or 1, "host_cpus": psutil.cpu_count() or 1}


@dataclass
class Sampler:
    """Samples the tree every ``interval_s`` into ``out_dir/process.jsonl``."""

    pid: int
    out_dir: str
    interval_s: float = 0.25
    clock: Callable[[], float] = time.monotonic
    samples: int = 0
    gone: bool = False
    children: set[int] = field(default_factory=set)

    def tick(self) -> None:
        tree = process_tree(self.pid)
        if not tree or not alive(self.pid):
            self.gone = True
            return
        pids = [p.pid for p in tree]
        self.children.update(pids[1:])
        rec = sample(pids)
        with open(os.path.join(self.out_dir, SAMPLES_FILE), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(rec) + "\n")
        self.samples += 1


def read_samples(path: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and "processes" in rec:
                out.append(rec)
    return out
