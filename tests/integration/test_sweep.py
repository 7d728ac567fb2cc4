"""`diagnose sweep` against real services: a uvicorn app nobody here wrote with one worker and no batching
(its knee is where the single worker saturates; attached there with --pid), and the demo's OpenAI-style
streaming endpoint (time to first token, time per output token, tokens/s). Loopback only; each step is
bounded in time and in requests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from diagnose.examples.demo import DemoService
from diagnose.examples.fleet import free_port

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FOREIGN = ROOT / "tests" / "integration" / "foreign" / "single_worker_no_batching.py"


def _diagnose(*args: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "diagnose", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


@contextmanager
def single_worker() -> Iterator[tuple[int, int]]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(FOREIGN), str(port)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read() if proc.stderr else b""
                    raise RuntimeError(f"the service did not start: {err!r}") from None
                time.sleep(0.2)
        yield proc.pid, port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.timeout(600)
def test_sweep_finds_the_knee_of_a_single_worker_service_and_attaches_there(tmp_path: Path) -> None:
    out = tmp_path / "one-worker.json"
    with single_worker() as (pid, port):
        r = _diagnose("sweep", f"http://127.0.0.1:{port}/predict", "--body", '{"x": 1}', "--concurrency",
                      "1,2,4,8,16", "--duration", "5", "--warmup", "1", "--pid", str(pid), "--attach-duration", "4",
                      "-o", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    steps = {s["concurrency"]: s for s in doc["steps"]}
    knee = doc["knee"]
    # one worker holding each request ~20 ms serves ~50 req/s: saturated from one or two clients on
    assert knee is not None and knee["concurrency"] in (1, 2), doc["summary"]
    assert 35 <= knee["best_throughput_rps"] <= 55
    assert all(s["errors"] == 0 for s in doc["steps"])
    # past the knee only the queue grows: p99 at 16 clients several times p99 at 1
    assert steps[16]["p99_ms"] >= 4 * steps[1]["p99_ms"], (steps[1], steps[16])
    assert steps[16]["throughput_rps"] >= 0.9 * knee["throughput_rps"]
    assert knee["top_p99_vs_first"] >= 4
    # Little's law holds at every step: clients / throughput ≈ mean latency
    for s in doc["steps"]:
        assert s["mean_ms"] == pytest.approx(1000 * s["concurrency"] / s["throughput_rps"], rel=0.25)
    # attached at the knee's concurrency, and diagnosed
    d = knee["diagnosis"]
    assert d["concurrency"] == knee["concurrency"] and d["pid"] == pid and d["at"] == "knee"
    assert d["verdict"] in ("bottleneck", "healthy", "undetermined") and os.path.isdir(d["session"])
    assert doc["client"]["saturated"] is False  # the asyncio client did not limit the steps
    # the HTML report draws throughput and p99 against concurrency; compare reads two sweeps
    html = tmp_path / "sweep.html"
    rep = _diagnose("report", str(out), "-o", str(html))
    assert rep.returncode == 0 and "Throughput and p99 latency against concurrency" in html.read_text()
    cmp = _diagnose("compare", str(out), str(out), "--format", "json")
    assert cmp.returncode == 0 and all(row["verdict"] == "same" for row in json.loads(cmp.stdout)["rows"])


@pytest.mark.timeout(600)
def test_sweep_times_tokens_of_an_openai_streaming_endpoint(tmp_path: Path) -> None:
    out = tmp_path / "stream.json"
    with DemoService("prefill") as svc:
        r = _diagnose("sweep", f"{svc.url}/v1/completions", "--openai", "--model", "demo", "--prompt-tokens", "64",
                      "--max-tokens", "8", "--concurrency", "1,4", "--duration", "4", "--warmup", "1",
                      "--format", "json", "-o", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["openai"] is True and doc["url"].endswith("/v1/completions")
    for s in doc["steps"]:
        assert s["errors"] == 0 and s["ok"] > 0
        assert 0 < s["ttft_p50_ms"] <= s["p50_ms"]  # the first token comes before the answer ends
        assert s["tokens_per_request"] == 8  # the server's usage.completion_tokens
        assert s["tpot_ms"] > 0 and s["itl_p50_ms"] > 0 and s["tokens_per_s"] > 0
    one, four = doc["steps"]
    # the demo engine runs one prefill per step: with four clients each first token waits for others' prefills
    assert four["ttft_p50_ms"] > one["ttft_p50_ms"]
