"""The in-process probe: request context across threads and tasks, the bounded queue, torch absent,
the output read back by the existing parsers, the announcement, compile events on the CPU."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from diagnose.collectors import torch_probe
from diagnose.collectors.torch_probe import Probe

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def make_probe(tmp_path: Path) -> Iterator[Any]:
    made: list[Probe] = []

    def make(name: str = "stages.jsonl", **kw: Any) -> Probe:
        kw.setdefault("announce", False)
        p = Probe(str(tmp_path / name), **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def _lines(path: str | None) -> list[dict[str, Any]]:
    assert path is not None
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _requests(path: str | None) -> list[dict[str, Any]]:
    return [r for r in _lines(path) if "stages_ms" in r]


def test_request_stages_fields_and_exclusive_nesting(make_probe: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]  # an injected clock: stage times are exact, whatever the machine's load
    monkeypatch.setattr(torch_probe, "_perf", lambda: now[0])

    def spend(seconds: float) -> None:
        now[0] += seconds

    probe = make_probe()
    with probe.request(input_tokens=7) as req:
        with probe.stage("preprocess"):
            spend(0.01)
            with probe.stage("h2d"):
                spend(0.02)
        req.set(output_tokens=3, ttft_ms=1.5, batch_size=2)
    probe.close()
    (rec,) = _requests(probe.path)
    assert rec["status"] == "ok" and rec["request_id"] == "r-1"
    assert rec["input_tokens"] == 7 and rec["output_tokens"] == 3 and rec["batch_size"] == 2
    assert rec["stages_ms"]["preprocess"] == pytest.approx(10.0)  # exclusive of the nested h2d
    assert rec["stages_ms"]["h2d"] == pytest.approx(20.0)
    assert rec["e2e_ms"] >= sum(rec["stages_ms"].values())
    assert isinstance(rec["ts"], float) and abs(rec["ts"] - time.time()) < 60


def test_exception_sets_error_status_and_still_emits(make_probe: Any) -> None:
    probe = make_probe()
    with pytest.raises(ValueError), probe.request(request_id="x-1"), probe.stage("decode"):
        raise ValueError("boom")
    with probe.stage("outside"):  # no request: a no-op
        pass
    probe.close()
    (rec,) = _requests(probe.path)
    assert rec["request_id"] == "x-1" and rec["status"] == "error" and rec["error"] == "ValueError"
    assert "decode" in rec["stages_ms"]


def test_threads_each_with_own_request_are_not_mixed(make_probe: Any) -> None:
    probe = make_probe()
    n = 32
    barrier = threading.Barrier(n)

    def worker(i: int) -> None:
        with probe.request(request_id=f"t-{i}") as req:
            barrier.wait()
            for _ in range(20):
                with probe.stage(f"s{i}"):
                    time.sleep(0)
            req.set(worker=i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    probe.close()
    recs = _requests(probe.path)
    assert len(recs) == n
    for rec in recs:
        i = rec["worker"]
        assert rec["request_id"] == f"t-{i}" and list(rec["stages_ms"]) == [f"s{i}"]


def test_wrap_carries_the_request_into_a_pool_thread(make_probe: Any) -> None:
    probe = make_probe()
    took: list[float] = []  # each call's own time, in ms, as the call itself measured it

    @probe.timed("preprocess")
    def work() -> int:
        t0 = time.perf_counter()
        time.sleep(0.005)
        took.append((time.perf_counter() - t0) * 1e3)
        return 1

    with probe.request(), ThreadPoolExecutor(2) as pool:
        assert pool.submit(probe.wrap(work)).result() == 1
        pool.submit(work).result()  # not wrapped: no request in that thread, not counted
    probe.close()
    (rec,) = _requests(probe.path)
    wrapped, unwrapped = took
    # the wrapped call's time and not the other's (a fixed 4-9 ms failed on a host busy enough to stretch a 5 ms
    # sleep: each call's own measure stretches with it)
    assert wrapped - 0.01 <= rec["stages_ms"]["preprocess"] < wrapped + unwrapped


def test_asyncio_tasks_interleave_with_separate_contexts(make_probe: Any) -> None:
    probe = make_probe()

    @probe.timed("decode")
    async def decode(i: int) -> int:
        await asyncio.sleep(0.01 * (i % 3))
        return i

    @probe.timed("tokenize")
    def tokenize(i: int) -> int:
        return i

    outer_ms: dict[int, float] = {}

    async def handle(i: int) -> None:
        with probe.request(request_id=f"a-{i}") as req:
            tokenize(i)
            await asyncio.sleep(0)
            for _ in range(3):
                t0 = time.perf_counter()
                await decode(i)
                outer_ms[i] = outer_ms.get(i, 0.0) + (time.perf_counter() - t0) * 1000
            with probe.stage("io"):
                await asyncio.to_thread(time.sleep, 0.002)
            req.set(task=i)

    async def main() -> None:
        await asyncio.gather(*(handle(i) for i in range(20)))

    asyncio.run(main())
    probe.close()
    recs = _requests(probe.path)
    assert sorted(r["task"] for r in recs) == list(range(20))
    for rec in recs:
        i = rec["task"]
        assert rec["request_id"] == f"a-{i}"
        assert set(rec["stages_ms"]) == {"tokenize", "decode", "io"}
        assert rec["stages_ms"]["decode"] >= 30 * (i % 3) - 1  # this task's own sleeps
        # The probe times each call inside this task's own timing of it: a context shared with the
        # other tasks would add their decodes (≥ 600 ms in all) and exceed it, however loaded the host.
        assert rec["stages_ms"]["decode"] <= outer_ms[i] + 0.01


class _NeverWaits(queue.Queue):  # type: ignore[type-arg]
    """The probe's queue, failing any put that would wait for room."""

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        if block:
            raise AssertionError("a put that waits for the writer")
        super().put(item, block, timeout)


def test_burst_on_a_tiny_queue_drops_and_never_blocks(make_probe: Any) -> None:
    probe = make_probe(queue_size=4, stats_interval_s=0.05)
    probe._q = _NeverWaits(maxsize=4)
    slow_write = probe._write_record
    gate, holding = threading.Event(), threading.Event()

    def stuck(item: Any) -> None:
        holding.set()
        gate.wait()  # the writer is held until the burst is over: a put that waited for it would never return
        slow_write(item)

    probe._write_record = stuck  # type: ignore[method-assign]
    with probe.request(), probe.stage("x"):  # one record the writer takes and is held on
        pass
    assert holding.wait(30)
    n = 2000
    errors: list[BaseException] = []

    def burst() -> None:
        try:
            for _ in range(n):
                with probe.request(), probe.stage("x"):
                    pass
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=burst, daemon=True)
    t.start()
    t.join(timeout=60)
    burst_done = not t.is_alive()
    stats = probe.stats()
    gate.set()
    assert burst_done and not errors, errors  # every put returned, none of them waiting for room
    assert stats["dropped"] == n - 4  # the queue's four kept, the rest dropped while the writer was held
    time.sleep(0.3)
    probe.close()
    final = probe.stats()
    assert final["dropped"] + final["requests"] == n + 1
    lines = _lines(probe.path)
    reports = [r["probe"] for r in lines if "probe" in r]
    assert reports and reports[-1]["dropped"] == final["dropped"]
    assert len([r for r in lines if "stages_ms" in r]) == final["requests"]


def test_output_is_read_by_the_existing_timing_parser(make_probe: Any) -> None:
    from diagnose.loose import analyze_path

    probe = make_probe(stats_interval_s=0.0)
    for i in range(40):
        with probe.request(input_tokens=100 + i) as req:
            with probe.stage("queue"):
                time.sleep(0.0005)
            with probe.stage("preprocess"):
                time.sleep(0.002)
            with probe.stage("decode"):
                time.sleep(0.0005)
            req.set(output_tokens=10)
    probe.emit({"prefill": 1.0}, status="ok")
    time.sleep(0.15)  # a probe stats line is written
    probe.close()
    text = Path(probe.path).read_text()
    assert '"probe": {"dropped": 0' in text
    result = analyze_path(probe.path)
    keys = {e.key: e for e in result.evidence}
    for stage in ("queue", "preprocess", "decode"):
        assert f"stage.{stage}_ms.p50" in keys and f"stage.{stage}_ms.p99" in keys, sorted(keys)
    assert keys["requests.count"].value == 41
    assert not any(k.startswith("mem.") for k in keys)  # the probe's own lines mean nothing else
    # the non-request lines are ignored by the timing parser: 41 requests counted, not more
    from diagnose.collectors.timing import TimingParser

    parser = TimingParser()
    for line in text.splitlines():
        parser.feed(line)
    log = parser.records().stage_log
    assert log.requests == 41 and log.bad_lines == 0


def test_cuda_state_is_off_without_cuda(make_probe: Any) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    probe = make_probe(cuda_interval_s=0.01)
    model = probe.watch_model(torch.nn.Linear(4, 4))
    assert probe.weights_bytes() == {"cpu": (16 + 4) * 4}
    assert torch_probe.cuda_memory_state() is None
    time.sleep(0.1)
    with pytest.raises(torch.OutOfMemoryError), probe.oom_guard():
        model(torch.ones(1, 4))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    probe.close()
    lines = _lines(probe.path)
    assert not any("cuda_memory" in r for r in lines)
    (oom,) = [r["oom"] for r in lines if "oom" in r]
    assert "Tried to allocate" in oom["message"] and oom["cuda_memory"] is None


def test_compile_events_on_cpu(make_probe: Any, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    dynamo = pytest.importorskip("torch._dynamo")

    from diagnose.collectors.compile_log import CompileLogParser

    dynamo.reset()
    probe = make_probe(compile_events=True, cuda_interval_s=0.05)
    try:
        f = torch.compile(lambda x: x * 2, backend="eager", dynamic=False)
        for n in range(1, 5):
            f(torch.ones(n))
        time.sleep(0.2)
    finally:
        probe.close()
        torch._logging.set_logs()
        dynamo.reset()
    comp = [r["compile"] for r in _lines(probe.path) if "compile" in r]
    assert comp and comp[-1]["recompiles"] >= 3 and comp[-1]["compiles"] >= 4
    parser = CompileLogParser()
    assert probe.compile_log_path is not None
    for line in Path(probe.compile_log_path).read_text().splitlines():
        parser.feed(line)
    assert parser.log.recompile_count >= 3
    assert any(g.kind == "size" and g.input == "x" for g in parser.log.grouped())


def test_announcement_written_found_removed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setattr(torch_probe, "_PROBE", None)
    probe = torch_probe.install(str(tmp_path / "s.jsonl"), service="demo")
    try:
        assert torch_probe.install() is probe  # idempotent
        path = torch_probe.announcement_path(os.getpid())
        assert path == str(tmp_path / f"diagnose-probe-{os.getpid()}.json") and os.path.exists(path)
        doc = torch_probe.find_announcement(os.getpid())
        assert doc is not None and doc["stages_path"] == str(tmp_path / "s.jsonl")
        assert doc["pid"] == os.getpid() and doc["version"] == torch_probe.VERSION and doc["service"] == "demo"
    finally:
        probe.close()
    assert not os.path.exists(path)
    assert torch_probe.find_announcement(os.getpid()) is None
    assert torch_probe.get() is None


