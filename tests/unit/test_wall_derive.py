"""Wall-clock samples → ``wall.*`` evidence, and the rules that read it (CMP001 from compiler children, QUE010)."""

from __future__ import annotations

from diagnose.collectors.pyspy import Frame, StackSample
from diagnose.derive import wall
from diagnose.model import Evidence, EvidenceSet
from diagnose.rules.compile import RecompilationStorm
from diagnose.rules.engine import run_rules
from diagnose.rules.queueing import LockContention

SITE = "/srv/venv/lib/python3.11/site-packages"
STD = "/usr/lib/python3.11"
BOOT = [Frame("Thread._bootstrap", f"{STD}/threading.py", 1002), Frame("Thread.run", f"{STD}/threading.py", 982)]
ANYIO = [*BOOT, Frame("WorkerThread.run", f"{SITE}/anyio/_backends/_asyncio.py", 986)]


def _s(tid: int, frames: list[Frame], count: int, thread: str = "AnyIO worker thread", pid: int = 7) -> StackSample:
    return StackSample(pid, "", tid, thread, tuple(frames), count)


def _ev(chunks: list[wall.Chunk], source: dict[str, str] | None = None, compilers: bool = False) -> dict:
    return {e.key: e.value for e in wall.derive(chunks, source=source or {}, compilers=compilers)}


def test_a_request_blocked_on_a_c_lock_is_lock_wait_by_its_source_line() -> None:
    lock_line = Frame("embed", "/srv/app/app.py", 41)
    run_line = Frame("forward", f"{SITE}/torch/nn/modules/linear.py", 125)
    walls = [
        _s(1, [*ANYIO, lock_line], 90),
        _s(1, [*ANYIO, Frame("embed", "/srv/app/app.py", 42), run_line], 10),
        _s(9, [*BOOT, Frame("refresh", "/srv/app/app.py", 27)], 100, thread="weights-refresher"),
        _s(2, [*ANYIO, Frame("Queue.get", f"{STD}/queue.py", 180)], 100),
    ]  # an idle pool thread: left out
    cpu = [_s(1, [*ANYIO, Frame("embed", "/srv/app/app.py", 42), run_line], 40)]  # 40 at 40 Hz = the 10 at 10 Hz
    ev = _ev(
        [wall.Chunk(0, 7, walls, 10.0, cpu, 40.0)],
        {"/srv/app/app.py:41": "with MODEL_LOCK:", "/srv/app/app.py:27": "time.sleep(0.25)"},
    )
    assert ev["wall.request_threads"] == 1 and ev["wall.samples"] == 100
    assert ev["wall.lock_wait_share"] == 0.9 and ev["wall.cpu_share"] == 0.1
    assert "with MODEL_LOCK:" in ev["wall.top.lock_wait"][0]["site"]
    others = ev["wall.other_threads"]
    assert [o["thread"] for o in others] == ["weights-refresher"] and "time.sleep" in others[0]["site"]
    findings, _ = run_rules(EvidenceSet(Evidence(k, v, "", "t") for k, v in ev.items()), rules=[LockContention])
    assert [f.code for f in findings] == ["QUE010"]
    assert "with MODEL_LOCK:" in findings[0].message and "weights-refresher" in findings[0].message


def test_waiting_for_compiler_children_is_compilation() -> None:
    """The request thread waits in subprocess for g++ (no torch frame on the stack here): psutil saw
    compilers among the children, so the child wait is compilation of the service."""
    child = [*ANYIO, Frame("embed", "/srv/app/app.py", 30), Frame("Popen.communicate", f"{STD}/subprocess.py", 1196)]
    chunk = wall.Chunk(0, 7, [_s(1, child, 50)], 10.0)
    assert _ev([chunk], compilers=False)["wall.child_wait_share"] == 1.0
    assert _ev([chunk], compilers=True)["wall.compile_share"] == 1.0


def test_inductor_frames_make_it_compile_whatever_the_thread_waits_on() -> None:
    frames = [
        *ANYIO,
        Frame("embed", "/srv/app/app.py", 30),
        Frame("CatchErrorsWrapper.__call__", f"{SITE}/torch/_dynamo/convert_frame.py", 2626),
    ]
    ev = _ev([wall.Chunk(0, 7, [_s(1, frames, 30)], 10.0)])
    assert ev["wall.compile_share"] == 1.0


def test_spread_between_chunks_is_the_uncertainty() -> None:
    lock = [*ANYIO, Frame("embed", "/srv/app/app.py", 41)]
    run = [*ANYIO, Frame("embed", "/srv/app/app.py", 42)]
    src = {"/srv/app/app.py:41": "with lock:", "/srv/app/app.py:42": "y = model(x)"}
    steady = [wall.Chunk(k, 7, [_s(1, lock, 50), _s(1, run, 50)], 10.0, [_s(1, run, 50)], 10.0) for k in range(3)]
    wobbly = [
        wall.Chunk(k, 7, [_s(1, lock, n), _s(1, run, 100 - n)], 10.0, [_s(1, run, 100 - n)], 10.0)
        for k, n in enumerate((20, 50, 80))
    ]
    a, b = _ev(steady, src), _ev(wobbly, src)
    assert a["wall.lock_wait_share"] == b["wall.lock_wait_share"] == 0.5
    assert b["wall.lock_wait_share.stderr"] > a["wall.lock_wait_share.stderr"] > 0


def test_cmp001_fires_on_the_wall_clock_when_the_cpu_profile_is_thin() -> None:
    """Issue 13's blind spot: 28 active samples in 10 s, the request threads waiting for cc1plus."""
    ev = EvidenceSet(
        [
            Evidence("cpu.compile_share", 0.05, "ratio", "t"),
            Evidence("cpu.active_samples", 28, "samples", "t"),
            Evidence("cpu.compile_seconds", 0.03, "s", "t"),
            Evidence("wall.compile_share", 0.93, "ratio", "t"),
            Evidence("wall.samples", 190, "samples", "t"),
            Evidence("wall.request_seconds", 19.0, "s", "t"),
            Evidence("compile.children_cpu_s", 8.5, "s", "t"),
            Evidence("compile.children_seen", 41, "processes", "t"),
        ]
    )
    findings, _ = run_rules(ev, rules=[RecompilationStorm])
    assert [f.code for f in findings] == ["CMP001"]
    f = findings[0]
    assert f.impact > 0.9 and "93 % of their wall-clock time compiling" in f.message and "8.5 s of CPU" in f.message
