"""psutil and /proc: the target's process tree, threads, scheduling and in-flight requests.

Read-only: everything here reads /proc (directly or through psutil) or asks the kernel's socket
diagnostics (netlink ``sock_diag``, the interface ``ss`` uses); nothing signals, pauses or writes to
the target. Samples are written as JSONL (one line per sample) so a session can be replayed;
``read_samples`` is the pure parser.

What a sample costs is chosen, not incidental (``benchmarks/attach_overhead.py --collectors``
measures each part against a real service):

* The tree comes from ``/proc/PID/task/TID/children`` (the tree only), not from psutil's scan of
  every process on the host.
* A *light* sample (every tick) reads one ``/proc/PID/stat`` per process: CPU (own and reaped
  children's), threads, RSS; plus the in-flight count. A *full* sample (at the start and end of the
  window and when the attach asks, e.g. at a profiling chunk's boundary) adds each thread's CPU and
  run-queue wait (``schedstat``) and the context switches; a thread-level re-read is skipped for a
  process whose CPU did not move since the last full sample (its threads are copied, marked
  ``"same": true``), so idle threads are not scanned again and again.
* In-flight requests are counted on the service's own listening sockets: accepted connections
  (ESTABLISHED sockets whose local port is one the tree listens on) plus the kernel's accept queue
  of each listening socket (``rx_queue`` of a LISTEN row), i.e. requests that have not even been
  accepted yet. Which ports the tree listens on is found from its file descriptors at full samples;
  in between, one ``sock_diag`` dump per address family the tree listens on gives the counts (about
  0.8 ms, against 4-10 ms for parsing ``/proc/PID/net/tcp``, which walks the same table once per
  page). When the target lives in another network namespace (a container seen from the host) the
  dump would see the wrong namespace, so its own ``/proc/PID/net/tcp`` is read instead.
"""

from __future__ import annotations

import glob
import json
import os
import pwd
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import psutil

from diagnose.model import Availability

SAMPLES_FILE = "process.jsonl"
INFO_FILE = "process-info.json"
TCP_LISTEN = "0A"
TCP_ESTABLISHED = "01"
CLK_TCK = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0
PAGE_BYTES = int(os.sysconf("SC_PAGE_SIZE")) if hasattr(os, "sysconf") else 4096


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


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants, root first, from ``/proc/PID/task/TID/children`` (the tree only).

    Falls back to psutil (a scan of every process on the host) when the kernel lacks the files.
    """
    if not os.path.isdir(f"/proc/{pid}"):
        return []
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        try:
            root = psutil.Process(pid)
            return [pid, *(c.pid for c in root.children(recursive=True))]
        except psutil.Error:
            return []
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop(0)
        if p in out:
            continue
        out.append(p)
        for f in glob.glob(f"/proc/{p}/task/*/children"):
            try:
                with open(f, encoding="ascii") as fh:
                    todo.extend(int(c) for c in fh.read().split())
            except (OSError, ValueError):
                continue
    return out


def process_tree(pid: int) -> list[psutil.Process]:
    procs: list[psutil.Process] = []
    for p in tree_pids(pid):
        try:
            procs.append(psutil.Process(p))
        except psutil.Error:
            continue
    return procs


def read_stat(pid: int, tid: int | None = None) -> dict[str, Any] | None:
    """One ``/proc/PID/stat`` (or a thread's) read: name, state, CPU (own and reaped children's), RSS, and the
    major faults (``majflt``: faults that waited for the disk, which is neither CPU time nor a run-queue delay; a
    process's counts all its threads'); None where the process or thread is gone."""
    path = f"/proc/{pid}/stat" if tid is None else f"/proc/{pid}/task/{tid}/stat"
    try:
        with open(path, "rb") as fh:
            raw = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    try:
        name = raw[raw.index("(") + 1: raw.rindex(")")]
        f = raw[raw.rindex(")") + 2:].split()
        return {"name": name, "state": f[0], "ppid": int(f[1]), "cpu_user": int(f[11]) / CLK_TCK,
                "cpu_system": int(f[12]) / CLK_TCK, "children_user": int(f[13]) / CLK_TCK,
                "children_system": int(f[14]) / CLK_TCK, "num_threads": int(f[17]),
                "start_ticks": int(f[19]), "rss": int(f[21]) * PAGE_BYTES, "majflt": int(f[9])}
    except (ValueError, IndexError):
        return None


def command_hint(pid: int) -> str:
    """What a child process runs, in a few words and without its arguments (which may hold secrets):
    the executable's name, and for an interpreter the ``-m`` module or the script's last two path parts."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            argv = [a.decode("utf-8", "replace") for a in fh.read().split(b"\0") if a]
    except OSError:
        return ""
    if not argv:
        return ""
    exe = os.path.basename(argv[0])
    rest = argv[1:]
    for i, a in enumerate(rest):
        if a == "-m" and i + 1 < len(rest):
            return f"{exe} -m {rest[i + 1]}"[:160]
        if a == "-c":
            return f"{exe} -c"
        if not a.startswith("-"):
            return f"{exe} {'/'.join(a.split('/')[-2:])}"[:160] if "python" in exe else exe[:160]
    return exe[:160]


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


NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST_DUMP = 0x1 | 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
TCP_STATES = (1 << 1) | (1 << 10)  # ESTABLISHED, LISTEN


def diag_rows(family: int) -> list[tuple[int, int, int, int]]:
    """(local port, state, receive queue, inode) of the TCP sockets of one address family, from one
    netlink ``sock_diag`` dump in *this* process's network namespace (ESTABLISHED and LISTEN only)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as s:
        req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, TCP_STATES) + b"\0" * 48
        s.sendto(struct.pack("=IHHII", 16 + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST_DUMP, 1, 0) + req, (0, 0))
        rows: list[tuple[int, int, int, int]] = []
        while True:
            data = s.recv(1 << 16)
            off = 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                if kind == NLMSG_DONE:
                    return rows
                if kind == NLMSG_ERROR or length < 16:
                    raise OSError("sock_diag answered an error")
                if length >= 16 + 72:
                    state = data[off + 17]
                    sport = struct.unpack_from(">H", data, off + 20)[0]
                    rqueue, _, _, inode = struct.unpack_from("=IIII", data, off + 16 + 56)
                    rows.append((sport, state, rqueue, inode))
                off += (length + 3) & ~3
            if not data:
                return rows


def _netns(pid: int | str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return ""


@dataclass
class ConnWatcher:
    """Counts in-flight requests on the tree's listening ports; see the module docstring for the cost."""

    pid: int
    listen_ports: list[int] = field(default_factory=list)
    families: tuple[int, ...] = ()
    fast: bool = False

    def refresh(self, pids: list[int]) -> dict[str, Any]:
        """A full look: the tree's sockets from its file descriptors, then the counts; also
        ``serving_pids``, the processes holding a listening socket or an accepted connection."""
        self.fast = False
        if _netns(self.pid) and _netns(self.pid) == _netns("self"):
            try:
                snap = self._diag_snapshot(pids)
            except OSError:
                snap = None
            if snap is not None:
                return snap
        snap = connection_snapshot(pids, with_owners=True)
        self.listen_ports = list(snap["listen_ports"])
        return snap

    def _diag_snapshot(self, pids: list[int]) -> dict[str, Any]:
        by_pid = {p: {int(i) for i in _socket_inodes(p)} for p in pids}
        inodes: set[int] = set().union(*by_pid.values()) if by_pid else set()
        rows = {fam: [r for r in diag_rows(fam) if r[3] in inodes] for fam in (socket.AF_INET, socket.AF_INET6)}
        listen = sorted({r[0] for rs in rows.values() for r in rs if r[1] == 10})
        mine = [r for rs in rows.values() for r in rs if r[0] in listen]
        self.listen_ports = listen
        self.families = tuple(fam for fam, rs in rows.items() if any(r[1] == 10 for r in rs))
        self.fast = bool(self.families)
        backlog = sum(r[2] for r in mine if r[1] == 10)
        established = sum(1 for r in mine if r[1] == 1)
        return {"listen_ports": listen, "established": established, "accept_queue": backlog,
                "inflight": established + backlog, "serving_pids": _serving(by_pid, mine, 1, 10)}

    def snapshot(self, pids: list[int]) -> dict[str, Any]:
        """The counts on the ports found at the last ``refresh`` (cheap when ``fast``)."""
        if not self.fast:
            return connection_snapshot(pids)
        ports = set(self.listen_ports)
        backlog = established = 0
        try:
            for fam in self.families:
                for port, state, rq, _ in diag_rows(fam):
                    if port in ports:
                        if state == 10:
                            backlog += rq
                        elif state == 1:
                            established += 1
        except OSError:
            self.fast = False
            return connection_snapshot(pids)
        return {"listen_ports": sorted(ports), "established": established, "accept_queue": backlog,
                "inflight": established + backlog}


def connection_snapshot(pids: list[int], with_owners: bool = False) -> dict[str, Any]:
    """Listening ports, accepted connections and the accept queue of the process tree; with
    ``with_owners``, also ``serving_pids``: the processes that hold a listening socket or an accepted
    connection (the ones that serve requests)."""
    by_pid = {p: _socket_inodes(p) for p in pids}
    inodes: set[str] = set().union(*by_pid.values()) if by_pid else set()
    rows = _tcp_rows(pids[0]) if pids else []
    mine = [r for r in rows if r[3] in inodes]
    listen_ports = sorted({r[0] for r in mine if r[1] == TCP_LISTEN})
    backlog = sum(r[2] for r in mine if r[1] == TCP_LISTEN)
    established = sum(1 for r in mine if r[1] == TCP_ESTABLISHED and r[0] in listen_ports)
    out: dict[str, Any] = {"listen_ports": listen_ports, "established": established, "accept_queue": backlog,
                           "inflight": established + backlog}
    if with_owners:
        owned: list[tuple[int, int, int, Any]] = [(r[0], int(r[1], 16), r[2], r[3]) for r in mine
                                                  if r[0] in listen_ports]
        out["serving_pids"] = _serving(by_pid, owned, int(TCP_ESTABLISHED, 16), int(TCP_LISTEN, 16))
    return out


def _serving(by_pid: Mapping[int, set[Any]], rows: Sequence[tuple[int, int, int, Any]], established: int,
             listen: int) -> list[int]:
    """The processes that hold accepted connections of the service; when none does right now, those
    holding its listening socket. (A listening socket is inherited by every process forked after it
    was opened — a multiprocessing manager, a resource tracker — so holding it says little.)"""
    for state in (established, listen):
        inodes = {r[3] for r in rows if r[1] == state}
        got = sorted(p for p, ino in by_pid.items() if ino & inodes)
        if got:
            return got
    return []


def schedstat_at(path: str) -> tuple[int, int] | None:
    """A ``schedstat`` file's (nanoseconds on a CPU, nanoseconds runnable but waiting for one); None where the
    kernel does not say or the thread is gone."""
    try:
        with open(path, encoding="ascii") as fh:
            run_ns, wait_ns, _ = fh.read().split()
        return int(run_ns), int(wait_ns)
    except (OSError, ValueError):
        return None


def _schedstat(pid: int, tid: int) -> tuple[int, int] | None:
    return schedstat_at(f"/proc/{pid}/task/{tid}/schedstat")


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


def _ctx_switches(pid: int) -> tuple[int, int] | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            vals = {k: v for k, _, v in (line.partition(":") for line in fh)}
        return int(vals["voluntary_ctxt_switches"]), int(vals["nonvoluntary_ctxt_switches"])
    except (OSError, KeyError, ValueError):
        return None


def thread_rows(pid: int) -> list[list[Any]]:
    """[tid, user s, system s, run ns, run-queue wait ns] of every thread of ``pid``."""
    rows: list[list[Any]] = []
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except (OSError, ValueError):
        return rows
    for tid in tids:
        st = read_stat(pid, tid)
        if st is None:
            continue
        ss = _schedstat(pid, tid)
        rows.append([tid, st["cpu_user"], st["cpu_system"], *(ss or (None, None))])
    return rows


FULL_EVERY_S = 5.0  # a full sample at least this often, so a long window still has thread-level points


@dataclass
class Sampler:
    """Samples the tree every ``interval_s`` into ``out_dir/process.jsonl`` (see the module docstring).

    ``tick()`` takes a light sample, ``tick(full=True)`` a full one; the first and the last are full
    (``close`` takes the last). ``cores(pid)`` and ``busy_threads(pid)`` say, from the samples so far,
    how much CPU a process used lately and how many of its threads were busy: what the attach spends
    its profiling budget on.
    """

    pid: int
    out_dir: str
    interval_s: float = 0.25
    clock: Callable[[], float] = time.monotonic
    samples: int = 0
    gone: bool = False
    children: set[int] = field(default_factory=set)
    conn: ConnWatcher | None = None
    serving: set[int] = field(default_factory=set)
    _history: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    _last_full: dict[int, dict[str, Any]] = field(default_factory=dict)
    _last_full_at: float = -1e9
    _threads_busy: dict[int, int] = field(default_factory=dict)
    _hinted: set[int] = field(default_factory=set)

    def tick(self, full: bool = False) -> None:
        pids = tree_pids(self.pid)
        if not pids or not alive(self.pid):
            self.gone = True
            return
        now = self.clock()
        full = full or self.samples == 0 or now - self._last_full_at >= FULL_EVERY_S
        self.children.update(pids[1:])
        if self.conn is None:
            self.conn = ConnWatcher(self.pid)
        procs: list[dict[str, Any]] = []
        for p in pids:
            st = read_stat(p)
            if st is None:
                continue
            rec: dict[str, Any] = {"pid": p, **{k: v for k, v in st.items() if k != "state"}}
            if p not in self._hinted:
                self._hinted.add(p)
                rec["hint"] = command_hint(p)
            cpu = st["cpu_user"] + st["cpu_system"]
            self._history.setdefault(p, []).append((now, cpu))
            del self._history[p][:-64]
            if full:
                self._full(p, rec, cpu)
            procs.append(rec)
        if full:
            self._last_full_at = now
            conn = self.conn.refresh(pids)
            self.serving = set(conn.pop("serving_pids", ()))
        else:
            conn = self.conn.snapshot(pids)
        out = {"ts": time.time(), "processes": procs, "conn": conn, "loadavg": list(os.getloadavg())}
        if full:
            out["full"] = True
        with open(os.path.join(self.out_dir, SAMPLES_FILE), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(out) + "\n")
        self.samples += 1

    def _full(self, p: int, rec: dict[str, Any], cpu: float) -> None:
        ctx = _ctx_switches(p)
        if ctx is not None:
            rec["ctx_voluntary"], rec["ctx_involuntary"] = ctx
        prev = self._last_full.get(p)
        if prev is not None and prev["cpu"] == cpu and prev["start"] == rec["start_ticks"]:
            rec["threads"] = prev["threads"]  # no CPU used since: every thread idle, nothing to re-read
            rec["same"] = True
            self._threads_busy[p] = 0
        else:
            rec["threads"] = thread_rows(p)
            if prev is not None and prev["start"] == rec["start_ticks"]:
                dt = max(1e-3, self.clock() - prev["at"])
                old = {int(t[0]): t for t in prev["threads"]}
                self._threads_busy[p] = sum(
                    1 for t in rec["threads"] if int(t[0]) in old
                    and (t[1] + t[2] - old[int(t[0])][1] - old[int(t[0])][2]) / dt >= BUSY_THREAD_CORES)
        self._last_full[p] = {"cpu": cpu, "start": rec["start_ticks"], "threads": rec["threads"], "at": self.clock()}

    def cores(self, pid: int, since_s: float = 2.0) -> float:
        """CPU cores ``pid`` used over about the last ``since_s`` seconds (0 when unknown)."""
        hist = self._history.get(pid) or []
        if len(hist) < 2:
            return 0.0
        end_t, end_c = hist[-1]
        first = next(((t, c) for t, c in hist if end_t - t <= since_s), hist[0])
        if first[0] >= end_t:
            first = hist[-2]
        return max(0.0, (end_c - first[1]) / max(1e-3, end_t - first[0]))

    def busy_threads(self, pid: int) -> int:
        """Threads of ``pid`` that used ≥ ``BUSY_THREAD_CORES`` between its last two full samples."""
        return self._threads_busy.get(pid, 0)

    def threads(self, pid: int) -> int:
        prev = self._last_full.get(pid)
        return len(prev["threads"]) if prev else 0


BUSY_THREAD_CORES = 0.10  # a thread using a tenth of a core or more is busy (as derive.process counts them)


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
