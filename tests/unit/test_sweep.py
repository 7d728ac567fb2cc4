"""`diagnose sweep`'s pure parts: the knee, the per-step numbers, streamed answers, the comparison of two
sweeps and the renderers; and bad input on the command line (one sentence, exit 2).

Real services under load: tests/integration/test_sweep.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from diagnose import sweep
from diagnose.collectors.loadclient import RequestSpec, Sample, StepResult, Target, TargetError, _Stream, run_step
from diagnose.errors import InputError
from diagnose.reports import compare
from diagnose.reports import sweep as render
from diagnose.stats import quantile
from tests.cli import run_cli
from tests.conftest import ROOT


def _step(c: int, rps: float, p50: float, p99: float) -> dict[str, Any]:
    return {"concurrency": c, "throughput_rps": rps, "p50_ms": p50, "p90_ms": p99 * 0.9, "p99_ms": p99,
            "errors": 0, "error_ratio": 0.0, "requests": int(rps * 10), "client_cpu_cores": 0.05}


# one client leaves the worker idle for each round trip: 44 req/s; from two on it never idles
ONE_WORKER = [_step(1, 44.0, 20.5, 21.0), _step(2, 49.5, 40.4, 41.0), _step(4, 49.4, 81.0, 84.0),
              _step(8, 49.6, 161.0, 164.0), _step(16, 49.5, 322.0, 327.0)]


def test_the_knee_of_a_single_worker_is_where_throughput_stops_growing() -> None:
    knee, why = sweep.find_knee(ONE_WORKER)
    assert knee is not None
    assert knee["concurrency"] == 2  # 44 req/s at 1 is 11 % short of the best; 49.5 at 2 is within 5 %
    assert knee["best_throughput_rps"] == 49.6 and knee["top_p99_ms"] == 327.0
    assert knee["top_p99_vs_first"] == pytest.approx(327 / 21, rel=1e-3)
    assert "the knee is at 2 concurrent clients" in why and "327 ms at 16" in why


def test_the_knee_is_the_lowest_step_within_five_percent_of_the_best() -> None:
    steps = [_step(1, 40.0, 25, 26), _step(2, 47.0, 42, 45), _step(4, 49.0, 80, 85), _step(8, 49.0, 160, 170)]
    knee, _ = sweep.find_knee(steps)
    assert knee is not None and knee["concurrency"] == 2  # 47 ≥ 0.95 × 49; 40 is not
    assert knee["grown_at"] == 8  # 170 ms is the first p99 ≥ 2 × 45 ms


def test_no_knee_while_throughput_still_grows_or_p99_stays_flat() -> None:
    scaling = [_step(1, 10, 100, 110), _step(2, 20, 100, 112), _step(4, 40, 101, 115)]
    knee, why = sweep.find_knee(scaling)
    assert knee is None and "still grows at the top step" in why
    flat = [_step(1, 10, 100, 110), _step(2, 19.8, 100, 112), _step(4, 20, 101, 130)]
    knee, why = sweep.find_knee(flat)
    assert knee is None and "never grew past 2×" in why
    assert sweep.find_knee([_step(1, 10, 100, 110)])[0] is None


def test_step_numbers_count_only_the_measured_window() -> None:
    samples = [Sample(start=float(i), end=float(i) + 0.1, ok=True, status=200) for i in range(10)]
    samples += [Sample(start=10.0, end=10.2, ok=False, status=503, error="HTTP 503")]
    res = StepResult(concurrency=2, samples=samples, window_s=10.0, completed_in_window=10, client_cpu_s=0.5,
                     elapsed_s=12.5, status_codes={"200": 10, "503": 1})
    doc = sweep.step_doc(res)
    assert doc["throughput_rps"] == 1.0 and doc["errors"] == 1 and doc["error_ratio"] == pytest.approx(1 / 11, 1e-3)
    assert doc["p50_ms"] == pytest.approx(100.0) and doc["client_cpu_cores"] == 0.04
    assert doc["error_kinds"] == {"HTTP 503": 1}
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5


def test_server_sent_events_and_json_lines_are_timed_per_token() -> None:
    s = _Stream("sse", t0=0.0)
    for i, t in enumerate((0.30, 0.35, 0.41)):
        event = {"choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]}
        s.feed(b"data: " + json.dumps(event).encode() + b"\n\n", t)
    s.feed(b'data: {"choices": [{"text": "", "finish_reason": "length"}], "usage": {"completion_tokens": 3}}\n\n'
           b"data: [DONE]\n\n", 0.42)
    assert s.first == 0.30 and s.tokens == 3 and s.usage_tokens == 3
    assert s.gaps == pytest.approx([0.05, 0.06])
    chat = _Stream("sse", 0.0)
    chat.feed(b'data: {"choices": [{"delta": {"role": "assistant"}}]}\n\n'
              b'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n', 0.2)
    assert chat.tokens == 1  # the role-only delta is not a token
    lines = _Stream("lines", 0.0)
    lines.feed(b'{"index": 0, "token": 5, "text": " a"}\n{"index": 1, "token": 7', 0.1)
    lines.feed(b', "text": " b"}\n{"done": true}\n', 0.2)
    assert lines.tokens == 2 and lines.first == 0.1
    bad = _Stream("sse", 0.0)
    bad.feed(b'data: {"error": "model overloaded"}\n\n', 0.1)
    assert bad.error == "model overloaded"


def test_targets_are_checked() -> None:
    assert Target.parse("http://127.0.0.1:8000/v1/completions?x=1").path == "/v1/completions?x=1"
    assert Target.parse("https://api.example.com").port == 443
    for bad in ("ftp://x", "127.0.0.1:8000", "http://u:p@h:1/"):
        with pytest.raises(TargetError):
            Target.parse(bad)
    with pytest.raises(InputError):
        sweep.parse_ladder("1,2,many")
    with pytest.raises(InputError):
        sweep.parse_ladder("0,1")
    assert sweep.parse_ladder("8, 1,2,2") == (1, 2, 8)


def _doc(steps: list[dict[str, Any]]) -> dict[str, Any]:
    knee, why = sweep.find_knee(steps)
    return {"schema": "diagnose/sweep/v1", "url": "http://127.0.0.1:8000/infer", "method": "POST", "openai": False,
            "model": None, "duration_s": 10.0, "warmup_s": 2.5, "started_at": 1_800_000_000.0, "steps": steps,
            "knee": knee, "verdict": "knee" if knee else "no_knee", "summary": why, "warnings": [],
            "client": {"max_cpu_cores": 0.05, "saturated": False}}


def test_two_sweeps_compare_step_by_step() -> None:
    before = _doc(ONE_WORKER)
    after = _doc([_step(1, 48.0, 20.6, 21.0), _step(2, 95.0, 21.0, 23.0), _step(4, 185.0, 22.0, 26.0),
                  _step(8, 190.0, 42.0, 48.0), _step(16, 191.0, 84.0, 95.0)])
    c = compare.compare_sweeps(before, after, "one-worker.json", "batched.json")
    rows = {(r["concurrency"], r["metric"]): r for r in c["rows"]}
    assert rows[(4, "throughput_rps")]["verdict"] == "better" and rows[(16, "p99_ms")]["verdict"] == "better"
    assert rows[(1, "p99_ms")]["verdict"] == "same"
    assert c["knee_before"]["concurrency"] == 2 and c["knee_after"]["concurrency"] == 4
    assert "best throughput 49.6 → 191.0 req/s" in c["headline"]
    text = compare.render_sweeps_text(c)
    assert "one-worker.json" in text and "+274 %" in text  # 49.4 → 185 req/s at 4 clients
    assert "| 16 | p99_ms |" in compare.render_sweeps_markdown(c)


def test_renderers_and_the_chart() -> None:
    doc = _doc(ONE_WORKER)
    assert "2 ← knee" in render.render_text(doc)
    fig = render.chart(doc).figure
    assert fig is not None and [t.name for t in fig.data] == ["throughput (req/s)", "p99 (ms)", "p50 (ms)"]
    assert render.chart(_doc([])).figure is None
    html = render.render_html(doc)
    assert '<script type="application/json" id="sweep">' in html and 'src="http' not in html
    assert "| 2 ← knee |" in render.render_markdown(doc)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("args,expected", [
    (["--concurrency", "1,x"], "is not a list of whole numbers"),
    (["--body", "{not json"], "--body is not valid JSON"),
    (["--openai"], "--openai needs --model"),
    (["--duration", "0"], "--duration 0 must be between"),
    (["--header", "NoColon"], "is not 'Name: value'"),
    ([], "did not answer"),
])
def test_sweep_bad_input_is_one_sentence_and_exit_2(args: list[str], expected: str) -> None:
    r = run_cli("sweep", f"http://127.0.0.1:{_closed_port()}/infer", "--duration", "1", *args)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diagnose: ") and expected in lines[0], r.stderr


def test_compare_refuses_a_sweep_against_a_session(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_text(json.dumps(_doc(ONE_WORKER)))
    r = run_cli("compare", str(f), str(Path(ROOT) / "tests" / "data" / "sessions" / "healthy_light_load_demo"))
    assert r.returncode == 2 and "not a mix" in r.stderr
    r = run_cli("compare", str(f), str(f), "--format", "json")
    assert r.returncode == 0 and json.loads(r.stdout)["schema"] == "diagnose/compare-sweep/v1"


def test_openai_bodies_for_completions_and_chat() -> None:
    opts = sweep.SweepOptions(url="http://127.0.0.1:8000", openai=True, model="m", prompt_tokens=5, max_tokens=3)
    spec = sweep.request_spec(opts)
    assert spec.target.path == "/v1/completions" and spec.method == "POST" and spec.body is not None
    doc = json.loads(spec.body(1))
    assert doc["stream"] is True and doc["max_tokens"] == 3 and len(doc["prompt"].split()) == 5
    assert spec.body(1) == spec.body(1) and spec.body(1) != spec.body(2)  # varied prompts, reproducible
    chat = sweep.request_spec(sweep.SweepOptions(url="https://h/v1/chat/completions", openai=True, model="m",
                                                 insecure=True))
    assert chat.body is not None and json.loads(chat.body(0))["messages"][0]["role"] == "user"
    assert chat.insecure is True


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.contextmanager
def _served(handler: Handler) -> Iterator[int]:
    """An asyncio HTTP server on 127.0.0.1 in its own thread (``handler`` answers each connection); its port."""
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(handler, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)


def test_a_kept_alive_connection_the_server_closed_is_retried_once_not_counted_as_an_error() -> None:
    """llama-server answers a stream with ``Keep-Alive`` and then closes the connection: the next request on
    it fails before any byte of an answer, never having reached the server. It goes again on a fresh
    connection; a server that fails a request it did receive is still an error."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n"
                     b"Connection: keep-alive\r\nKeep-Alive: timeout=5, max=100\r\n\r\nok")
        await writer.drain()
        writer.close()  # ... and closes anyway

    with _served(one) as port:
        step = run_step(RequestSpec(Target.parse(f"http://127.0.0.1:{port}/"), timeout_s=5.0), 1, 0.0, 0.5,
                        max_requests=20)
    assert len(step.samples) == 20 and all(s.ok for s in step.samples), step.status_codes


def test_a_step_ends_when_its_caller_stops_it_and_its_window_ends_there() -> None:
    """The engine lab keeps its load on until its last scrape is taken, then stops it: no request starts after
    the stop, the ones in flight finish, and the window (the throughput's denominator) ends at the stop."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                break
            await asyncio.sleep(0.02)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        writer.close()

    clients = 2
    stop = threading.Event()
    timer = threading.Timer(0.6, stop.set)
    with _served(one) as port:
        timer.start()
        try:
            step = run_step(RequestSpec(Target.parse(f"http://127.0.0.1:{port}/"), timeout_s=5.0), clients, 0.1,
                            600.0, stop=stop)
        finally:
            timer.cancel()
    assert step.elapsed_s < 60, step.elapsed_s  # not the 600 s asked for
    # the window is the 0.5 s from the warm-up's end to the stop, not 600 s: throughput is not diluted
    assert 0 < step.window_s < 30 and step.completed_in_window > 0, step
    assert step.completed_in_window / step.window_s > 2, (step.completed_in_window, step.window_s)
    # the samples are the requests begun in the window; the completions also count the one request per client
    # that began in the warm-up and ended inside the window
    assert all(s.ok for s in step.samples) and len(step.samples) >= step.completed_in_window - clients
