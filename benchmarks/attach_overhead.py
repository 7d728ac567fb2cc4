#!/usr/bin/env python3
"""What attaching costs: the attach process tree's CPU, and the service's throughput with and without it.

Default: a real LitServe embedding service (``tests/integration/foreign/litserve_embedding.py``, one
worker) under 2 closed-loop clients, in ABBA rounds: each round is one window with nobody attached and
one window with ``diagnose attach --pid PID --duration W`` run as a user runs it (the CLI, a separate
process), in the order A B in even rounds and B A in odd ones, so that drift (other load on a shared
host, thermal) hits both sides alike. For each attached window it measures

* the attach process tree's CPU *during its window*: what the attach measured of itself
  (``attach-cost.json``: ``getrusage`` of its own process and of every py-spy it ran and reaped in
  the window), in cores; ``--meter`` cross-checks it from outside (psutil on the tree at 10 Hz,
  interpolated at the window's start and end) — in the clients' process, so not while throughput
  is measured;
* the whole command's CPU (start-up, window, analysis, from ``wait4``) divided by the window;
* requests the service completed in the window, against the plain window of the same round.

It prints each round, then the medians with the spread (min-max) and the noise of the plain windows
themselves, so a ratio is never read closer than the machine allows.

``--null`` runs the same rounds with nothing attached in the B windows: the spread of that ratio is
the noise floor of the attached/plain ratio on the host at the time.

``--collectors`` instead measures what each collector costs on its own against the same loaded
service (py-spy at several rates, with and without ``--subprocesses`` and ``--idle``, one
``py-spy dump``, the psutil sampler's tick and its parts), each in cores (CPU seconds per second).

``--service vllm`` runs the same rounds against the real vLLM engine of the engine lab (its CPU build,
three processes: API server, EngineCore, worker), attaching to the API server's pid.

usage: benchmarks/attach_overhead.py [--service litserve-embedding|vllm|DEMO_PATHOLOGY] [--window 15]
                                     [--rounds 6] [--clients 2] [--attach-args=--light] [--null]
                                     [--meter] [--collectors] [--nice N] [--bare-pyspy HZ]
                                     [--vllm-model tiny|prefill] [--max-tokens 16] [--cpus LIST]
                                     [--engine-cpus LIST]

``--nice N`` runs the attach at that niceness, ``--cpus 1`` on those CPUs only (its py-spys inherit both);
``--bare-pyspy HZ`` replaces the attach in the B windows with one plain ``py-spy record --nonblocking`` of
the busiest process at HZ. ``--vllm-model prefill --max-tokens 64`` serves the lab's 60M-parameter model.
``--engine-cpus 0`` puts the service's whole process tree on CPU 0 (vLLM's worker binds its OpenMP threads
there too) and the clients and the attach on the other CPUs: the spare core a GPU host has, so the ratio
measures what attaching does to the engine, not two programs sharing two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import itertools
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
FOREIGN = os.path.join(ROOT, "tests", "integration", "foreign")
TEXT = " ".join(f"word{i % 97}" for i in range(96))  # 96 words: the embedding service's request


# -- the service and its load ----------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Service:
    pid: int
    port: int
    path: str
    body: bytes
    content_type: str


@contextlib.contextmanager
def litserve_embedding() -> Iterator[Service]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(FOREIGN, "litserve_embedding.py"), str(port)],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    body = json.dumps({"text": TEXT}).encode()
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError("the LitServe embedding service exited while starting")
            try:
                if _post(port, "/predict", body, "application/json", 10.0):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the LitServe embedding service did not become ready in 120 s")
            time.sleep(0.5)
        yield Service(proc.pid, port, "/predict", body, "application/json")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextlib.contextmanager
def demo(pathology: str) -> Iterator[Service]:
    import random

    from diagnose.examples.demo import DemoService
    from diagnose.examples.loadgen import make_payload

    with DemoService(pathology) as svc:
        body, ctype = make_payload(pathology, random.Random(0))
        yield Service(svc.pid, svc.port, "/infer", body, ctype)


@contextlib.contextmanager
def vllm_engine(model: str = "tiny", max_tokens: int = 16, cpus: str = "") -> Iterator[Service]:
    """Real vLLM (the engine lab's CPU build: ``bash tests/engines/install_vllm.sh``), one of the lab's
    random-weight Llamas (``tiny`` by default, ``prefill``: the 60M-parameter one), non-streaming completions
    of ``max_tokens`` tokens; attach goes to the API server's pid, as a user's would. ``cpus`` (e.g. "0"):
    the worker binds its OpenMP threads to those CPUs (``VLLM_CPU_OMP_THREADS_BIND``)."""
    from tests.engines import lab  # the engine lab: starts, waits for and stops the engine

    why = lab.vllm_available()
    if why:
        raise RuntimeError(why)
    work = tempfile.mkdtemp(prefix="bench-vllm-")
    env = {"VLLM_CPU_OMP_THREADS_BIND": cpus} if cpus else {}
    eng = lab.start_vllm(lab.VllmConfig(model, env=env), Path(work), Path(work) / "vllm.log")
    body = json.dumps({"model": "lab", "prompt": lab.prompt(20, 1), "max_tokens": max_tokens, "temperature": 0.0,
                       "ignore_eos": True}).encode()
    try:
        yield Service(eng.pid, eng.port, "/v1/completions", body, "application/json")
    finally:
        eng.stop()


def pin_tree(pid: int, cpus: set[int]) -> int:
    """Put every thread of ``pid``'s process tree on ``cpus`` (threads it starts later inherit it); the count."""
    import psutil

    root = psutil.Process(pid)
    n = 0
    for proc in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error, OSError):
            for th in proc.threads():
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(th.id, cpus)
                    n += 1
    return n


def _post(port: int, path: str, body: bytes, ctype: str, timeout: float) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, body, {"Content-Type": ctype})
        resp = conn.getresponse()
        resp.read()
        return resp.status == 200
    finally:
        conn.close()


class Clients:
    """Closed-loop clients on keep-alive connections; every completion's time is kept."""

    def __init__(self, svc: Service, n: int) -> None:
        self.svc = svc
        self.done: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(n)]

    def _client(self) -> None:
        conn: http.client.HTTPConnection | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.svc.port, timeout=60)
                conn.request("POST", self.svc.path, self.svc.body, {"Content-Type": self.svc.content_type})
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    self.done.append(time.time())
            except (OSError, http.client.HTTPException):
                conn = None
                time.sleep(0.05)

    def count(self, t0: float, t1: float) -> int:
        return sum(1 for t in list(self.done) if t0 <= t < t1)

    def __enter__(self) -> Clients:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=70)


# -- the attach process tree's CPU, from outside ---------------------------------------------------


class TreeMeter:
    """Samples the CPU seconds used so far by a process and all its descendants (live or reaped)."""

    def __init__(self, pid: int, interval_s: float = 0.1) -> None:
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.points: list[tuple[float, float]] = []
        self._seen: dict[int, float] = {}  # the last reading of each descendant, kept after it exits
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _read(self) -> float:
        try:
            t = self.root.cpu_times()
            own = t.user + t.system
            kids = self.root.children(recursive=True)
        except psutil.Error:
            return self.points[-1][1] if self.points else 0.0
        for k in kids:
            try:
                kt = k.cpu_times()
                self._seen[k.pid] = kt.user + kt.system + kt.children_user + kt.children_system
            except psutil.Error:
                continue
        return float(own + sum(self._seen.values()))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.points.append((time.time(), self._read()))
            self._stop.wait(self.interval_s)

    def at(self, ts: float) -> float:
        """CPU seconds used by ``ts``, interpolated between the two readings around it."""
        pts = self.points
        if not pts:
            return 0.0
        if ts <= pts[0][0]:
            return pts[0][1]
        for (t0, c0), (t1, c1) in itertools.pairwise(pts):
            if t0 <= ts <= t1:
                return c0 + (c1 - c0) * (ts - t0) / max(1e-9, t1 - t0)
        return pts[-1][1]

    def __enter__(self) -> TreeMeter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class Attached:
    start: float
    end: float
    cores_window: float
    cores_command: float
    primary: str | None


def attach_once(pid: int, window: float, out: str, extra: list[str], meter: bool = False,
                nice: int = 0, cpus: set[int] | None = None) -> Attached:
    """Run the CLI; its CPU in the window is what it measured of itself (``attach-cost.json``: its own
    process and every py-spy it ran and reaped in the window), the whole command's from ``wait4``.
    ``meter`` cross-checks the window's figure from outside (psutil on the tree, 10 Hz) — in this
    process, so it slows the clients a little and is off when throughput is measured."""
    cmd = [sys.executable, "-m", "diagnose", "attach", "--pid", str(pid), "--duration", str(window),
           "-o", out, "--format", "json", *extra]
    def place() -> None:
        if nice:
            os.nice(nice)
        if cpus:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            preexec_fn=place if nice or cpus else None)
    stdout = b""
    if meter:
        with TreeMeter(proc.pid) as m:
            stdout, _ = proc.communicate(timeout=window + 300)
    else:
        assert proc.stdout is not None
        stdout = proc.stdout.read()
    _, _, usage = os.wait4(proc.pid, 0) if proc.returncode is None else (0, 0, None)
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as fh:
        win = json.load(fh)["window"]
    with open(os.path.join(out, "attach-cost.json"), encoding="utf-8") as fh:
        cost = json.load(fh)
    seconds = max(1e-9, win["end"] - win["start"])
    if meter:
        outside = (m.at(win["end"]) - m.at(win["start"])) / seconds
        print(f"  cross-check: {cost['cores']:.3f} cores measured by the attach, {outside:.3f} from outside")
    total = (usage.ru_utime + usage.ru_stime) if usage is not None else float("nan")
    try:
        primary = json.loads(stdout).get("primary")
    except ValueError:
        primary = "?"
    return Attached(win["start"], win["end"], float(cost["cores"]), total / window, primary)


def bare_pyspy(pid: int, rate: int, window: float) -> float:
    """``py-spy record --nonblocking`` alone, as the attach runs it, on the busiest process of ``pid``'s tree
    (vLLM's worker), picked over the window's first second, for the rest of it; returns its CPU in cores.
    Separates what py-spy's presence costs the target from the rest of the attach."""
    from diagnose.collectors.pyspy import find_pyspy

    exe = find_pyspy()
    if exe is None:
        raise RuntimeError("py-spy is not installed in this venv")
    tree = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in tree:
        p.cpu_percent(None)
    time.sleep(1.0)
    busiest = max(tree, key=lambda p: p.cpu_percent(None))
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.Popen([exe, "record", "--nonblocking", "--threads", "--format", "raw", "--rate",
                                 str(rate), "--duration", f"{window - 1.0:g}", "--pid", str(busiest.pid),
                                 "--output", os.path.join(tmp, "x.raw")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, _, usage = os.wait4(proc.pid, 0)
    return (usage.ru_utime + usage.ru_stime) / window


# -- ABBA rounds -----------------------------------------------------------------------------------


def _spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):.3f} (min {min(xs):.3f}, max {max(xs):.3f}, n={len(xs)})"


def throughput(svc: Service, args: argparse.Namespace) -> int:
    extra = shlex.split(args.attach_args)
    ratios: list[float] = []
    plain_rps: list[float] = []
    cores_w: list[float] = []
    cores_c: list[float] = []
    with Clients(svc, args.clients) as clients, tempfile.TemporaryDirectory() as tmp:
        time.sleep(args.warmup)
        for i in range(args.rounds):
            got: dict[bool, float] = {}
            for with_attach in (False, True) if i % 2 == 0 else (True, False):
                if with_attach and args.null:  # the same procedure with nobody attached: the noise floor
                    t0 = time.time()
                    time.sleep(args.window)
                    got[True] = clients.count(t0, time.time()) / (time.time() - t0)
                    cores_w.append(0.0)
                    cores_c.append(0.0)
                    primary: str | None = "(null round: nothing attached)"
                elif with_attach and args.bare_pyspy:  # one plain py-spy on the busiest process, no attach
                    t0 = time.time()
                    cores_w.append(bare_pyspy(svc.pid, args.bare_pyspy, args.window))
                    got[True] = clients.count(t0, time.time()) / (time.time() - t0)
                    cores_c.append(cores_w[-1])
                    primary = f"(bare py-spy at {args.bare_pyspy} Hz)"
                elif with_attach:
                    a = attach_once(svc.pid, args.window, os.path.join(tmp, f"s{i}"), extra, args.meter,
                                    args.nice, {int(c) for c in args.cpus.split(",")} if args.cpus else None)
                    got[True] = clients.count(a.start, a.end) / (a.end - a.start)
                    cores_w.append(a.cores_window)
                    cores_c.append(a.cores_command)
                    primary = a.primary
                else:
                    t0 = time.time()
                    time.sleep(args.window)
                    got[False] = clients.count(t0, time.time()) / (time.time() - t0)
                time.sleep(args.gap)
            ratios.append(got[True] / got[False])
            plain_rps.append(got[False])
            print(f"round {i + 1} ({'AB' if i % 2 == 0 else 'BA'}): plain {got[False]:.1f} req/s, attached "
                  f"{got[True]:.1f} req/s, ratio {ratios[-1]:.3f}; attach tree {cores_w[-1]:.3f} cores in its "
                  f"window ({cores_c[-1]:.3f} with start-up and analysis); primary {primary}", flush=True)
    med = statistics.median(plain_rps)
    print(f"service={args.service} window={args.window:.0f}s rounds={args.rounds} clients={args.clients} "
          f"attach args={args.attach_args or '(defaults)'}")
    print(f"attach tree cores in the window: {_spread(cores_w)}")
    print(f"attach tree cores, whole command / window: {_spread(cores_c)}")
    print(f"throughput attached / plain: {_spread(ratios)}")
    print(f"noise: plain windows {min(plain_rps):.1f}-{max(plain_rps):.1f} req/s around a median of {med:.1f} "
          f"({100 * (max(plain_rps) - min(plain_rps)) / med:.0f} % of it)")
    return 0


# -- each collector on its own ---------------------------------------------------------------------


def _cores_of_command(cmd: list[str], seconds: float) -> float:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with TreeMeter(proc.pid, 0.2) as meter:
        proc.wait(timeout=seconds + 60)
    return (meter.points[-1][1] if meter.points else 0.0) / seconds


def _cores_in_process(fn: Callable[[], object], seconds: float, hz: float) -> float:
    """CPU of this thread only (the clients run in other threads of this process)."""
    c0 = time.thread_time()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        fn()
        time.sleep(1.0 / hz)
    return (time.thread_time() - c0) / seconds


def collectors(svc: Service, args: argparse.Namespace) -> int:
    from diagnose.collectors import process as pc
    from diagnose.collectors import pyspy

    exe = pyspy.find_pyspy() or "py-spy"
    w = args.window
    tree = [p.pid for p in pc.process_tree(svc.pid)]
    cpu = {}
    for p in tree:
        with contextlib.suppress(psutil.Error):
            cpu[p] = psutil.Process(p).cpu_percent(None)
    time.sleep(1.0)
    busy = max(tree, key=lambda p: psutil.Process(p).cpu_percent(None))
    rows: list[tuple[str, float]] = []
    with Clients(svc, args.clients), tempfile.TemporaryDirectory() as tmp:
        time.sleep(args.warmup)
        out = os.path.join(tmp, "o.raw")
        base = [exe, "record", "--nonblocking", "--threads", "--format", "raw", "--duration", str(round(w)),
                "-o", out]
        for rate in (100, 50, 20, 10):
            rows.append((f"py-spy record --subprocesses, {rate} Hz, whole tree ({len(tree)} processes)",
                         _cores_of_command([*base, "--rate", str(rate), "--pid", str(svc.pid), "--subprocesses"], w)))
        rows.append(("py-spy record --subprocesses --idle, 20 Hz, whole tree",
                     _cores_of_command([*base, "--rate", "20", "--idle", "--pid", str(svc.pid), "--subprocesses"], w)))
        for rate in (50, 20):
            rows.append((f"py-spy record, {rate} Hz, the busy process only",
                         _cores_of_command([*base, "--rate", str(rate), "--pid", str(busy)], w)))
        rows.append(("py-spy record --idle, 20 Hz, the busy process only",
                     _cores_of_command([*base, "--rate", "20", "--idle", "--pid", str(busy)], w)))
        n = 10
        r0 = os.times()
        for _ in range(n):
            subprocess.run([exe, "dump", "--json", "--nonblocking", "--pid", str(busy)], capture_output=True)
        r1 = os.times()
        per_dump = (r1.children_user + r1.children_system - r0.children_user - r0.children_system) / n
        rows.append(("py-spy dump --json (one process), per second at 2 Hz", 2 * per_dump))
        r0 = os.times()
        for _ in range(n):
            subprocess.run([exe, "record", "--nonblocking", "--rate", "1", "--duration", "1", "--format", "raw",
                            "-o", out, "--pid", str(busy)], capture_output=True)
        r1 = os.times()
        per_start = (r1.children_user + r1.children_system - r0.children_user - r0.children_system) / n
        rows.append(("py-spy record start + stop (one chunk of one record), per second at 1/3.5 s",
                     per_start / 3.5))
        folder = tempfile.mkdtemp(dir=tmp)
        extra = _extra_sampler_rows(svc.pid, folder, w)
        rows.extend(extra)
    width = max(len(r[0]) for r in rows)
    print(f"service={args.service} window={w:.0f}s clients={args.clients} (cores = CPU seconds per second)")
    for name, cores in rows:
        print(f"  {name:<{width}}  {cores:.4f} cores")
    return 0


def _extra_sampler_rows(pid: int, folder: str, w: float) -> list[tuple[str, float]]:
    from diagnose.collectors import process as pc

    pids = [p.pid for p in pc.process_tree(pid)]
    watcher = pc.ConnWatcher(pid)
    watcher.refresh(pids)
    rows = [
        ("before: psutil process tree (scans every process on the host) at 4 Hz",
         _cores_in_process(lambda: [p.children(recursive=True) for p in pc.process_tree(pid)[:1]], w, 4)),
        ("before: connection scan (/proc/PID/net/tcp + fds) at 4 Hz",
         _cores_in_process(lambda: pc.connection_snapshot(pids), w, 4)),
        ("before: per-process + per-thread psutil sample at 4 Hz", _cores_in_process(lambda: pc.sample(pids), w, 4)),
        ("now: the tree from /proc/PID/task/*/children at 4 Hz", _cores_in_process(lambda: pc.tree_pids(pid), w, 4)),
        ("now: connection counts from one sock_diag dump at 4 Hz",
         _cores_in_process(lambda: watcher.snapshot(pids), w, 4)),
    ]
    sampler = pc.Sampler(pid, folder)
    sampler.tick(full=True)
    rows.append(("now: the sampler's light tick at 4 Hz", _cores_in_process(sampler.tick, w, 4)))
    rows.append(("now: the sampler's full tick (threads, schedstat, fds) at 4 Hz",
                 _cores_in_process(lambda: sampler.tick(full=True), w, 4)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--service", default="litserve-embedding",
                    help="litserve-embedding (default), vllm (the engine lab's real vLLM), or a demo "
                         "pathology (queueing, cpu-preprocess, …)")
    ap.add_argument("--window", type=float, default=15.0, help="seconds per window (default 15)")
    ap.add_argument("--rounds", type=int, default=6, help="ABBA rounds (default 6)")
    ap.add_argument("--clients", type=int, default=2, help="closed-loop clients (default 2)")
    ap.add_argument("--warmup", type=float, default=5.0, help="seconds of load before the first window")
    ap.add_argument("--gap", type=float, default=1.0, help="seconds between windows")
    ap.add_argument("--attach-args", default="", help="extra arguments for diagnose attach, e.g. --attach-args=--light")
    ap.add_argument("--collectors", action="store_true", help="measure each collector on its own instead")
    ap.add_argument("--meter", action="store_true",
                    help="cross-check the attach's own CPU figure from outside (slows the clients a little)")
    ap.add_argument("--null", action="store_true",
                    help="A/A rounds: the B windows attach nothing (the ratio's noise floor on this host)")
    ap.add_argument("--nice", type=int, default=0, help="run the attach at this niceness (0-19)")
    ap.add_argument("--cpus", default="", help="run the attach on these CPUs only, e.g. 1 (its py-spys inherit it)")
    ap.add_argument("--engine-cpus", default="",
                    help="put the service's whole tree on these CPUs and this harness (clients, and the attach "
                         "it starts) on the others, e.g. 0: a spare core, as on a GPU host where the engine "
                         "leaves CPUs free")
    ap.add_argument("--bare-pyspy", type=int, default=0, metavar="HZ",
                    help="B windows run one plain py-spy (nonblocking) on the busiest process at HZ, no attach")
    ap.add_argument("--vllm-model", default="tiny", choices=("tiny", "prefill"),
                    help="with --service vllm: the lab's model (tiny: ~1 ms steps; prefill: 60M parameters)")
    ap.add_argument("--max-tokens", type=int, default=16, help="with --service vllm: tokens per completion")
    args = ap.parse_args()
    ctx = (litserve_embedding() if args.service == "litserve-embedding"
           else vllm_engine(args.vllm_model, args.max_tokens, args.engine_cpus) if args.service == "vllm"
           else demo(args.service))
    with ctx as svc:
        if args.engine_cpus:
            engine = {int(c) for c in args.engine_cpus.split(",")}
            rest = set(range(os.cpu_count() or 1)) - engine
            if not rest:
                raise SystemExit(f"--engine-cpus {args.engine_cpus} leaves no CPU for the clients and the attach")
            print(f"service tree: {pin_tree(svc.pid, engine)} threads on CPUs {sorted(engine)}; clients and "
                  f"attach on CPUs {sorted(rest)}", flush=True)
            os.sched_setaffinity(0, rest)  # this thread: the client threads and the attach inherit it
        return collectors(svc, args) if args.collectors else throughput(svc, args)


if __name__ == "__main__":
    sys.exit(main())
