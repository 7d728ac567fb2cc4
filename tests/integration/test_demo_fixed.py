"""Each demo pathology against its ``--fixed`` variant: the same service and load with diagnose's fix applied.

Every comparison runs the pathology and then its fix through ``run_pathology`` (the code path of
``diagnose demo [--fixed]``) and checks what the fix changes in the diagnosis and in the numbers.
The host may be small and shared (2 cores, other work running), so the margins are wide: each
fix moves its figure several times further than the threshold asks (see the numbers in the
comments, measured on such a host).
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

from diagnose.demo import run_demo, run_pathology
from diagnose.derive.activities import Activity, classify
from diagnose.examples.demo import PATHOLOGIES, DemoService, background_load
from diagnose.examples.loadgen import LoadResult
from diagnose.examples.service import DecoderConfig, DynamicShapePathology, TinyDecoderLM
from diagnose.model import Diagnosis
from tests.vllm_metrics import buckets, families, split_scrapes

pytestmark = pytest.mark.integration


def _run(pathology: str, window_s: float, out: str, fixed: bool) -> tuple[Diagnosis, dict[str, Any], LoadResult]:
    _, diagnosis, load = run_pathology(pathology, window_s, out, fixed=fixed)
    assert isinstance(load, LoadResult) and load.requests > 0 and load.errors == 0, load
    return diagnosis, {e.key: e.value for e in diagnosis.evidence}, load


def _before_after(pathology: str, window_s: float, tmp_path: Path) -> tuple[Diagnosis, dict[str, Any], LoadResult,
                                                                       Diagnosis, dict[str, Any], LoadResult]:
    """The pathology (which must show), then its fix: (diagnosis, evidence, load) of each."""
    before = _run(pathology, window_s, str(tmp_path / "before"), fixed=False)
    after = _run(pathology, window_s, str(tmp_path / "after"), fixed=True)
    expected = PATHOLOGIES[pathology].expected_category
    got = before[0].primary.value if before[0].primary else None
    assert got == expected, f"the pathology itself did not show: {_findings(before[0])}"
    return (*before, *after)


def _findings(d: Diagnosis) -> list[tuple[str, str, float]]:
    return [(f.code, f.category.value, round(f.impact, 2)) for f in d.findings]


def _impact(d: Diagnosis, code: str) -> float:
    return max((f.impact for f in d.findings if f.code == code), default=0.0)


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        doc: dict[str, Any] = json.loads(resp.read())
    return doc


def test_fixed_queueing_drains_the_queue(tmp_path: Path) -> None:
    """More workers + dynamic batching: the queueing findings go, the queue and p99 shrink."""
    d0, e0, l0, d1, e1, l1 = _before_after("queueing", 6.0, tmp_path)
    detail = f"before {_findings(d0)} {l0}; after {_findings(d1)} {l1}"
    assert d1.primary is None or d1.primary.value != "queueing", detail
    codes = {f.code for f in d1.findings}
    assert not codes & {"QUE001", "QUE004"}, detail
    assert all(f.impact < 0.25 for f in d1.findings if f.category.value == "queueing"), detail
    # Measured (6 pairs): queue share 0.92 -> 0.02-0.06; queue p99 0.9-2.5 s -> 23-155 ms. End to end,
    # a closed loop's latency is clients / throughput, and the added capacity is a second core: with
    # one free (the fix used 1.2-1.6 cores) p50 0.46-0.53x, p99 0.47-0.87x, throughput 1.7-2.2x; on
    # a host busy with other work, once: p50 0.84x, p99 (client side) 0.87x, throughput 1.18x.
    assert e1["stage.queue.share"] < 0.3 < e0["stage.queue.share"], detail
    assert e1["stage.queue_ms.p99"] < 0.25 * e0["stage.queue_ms.p99"], detail
    # In a closed loop end-to-end latency is clients / throughput, so one figure says it; how much
    # better depends on a free second core, which a test host running other suites may not have.
    assert l1.throughput_rps > l0.throughput_rps, detail


def test_fixed_cpu_preprocess_is_cheaper_and_faster(tmp_path: Path) -> None:
    """Cheap pre-processing: its share and p99 fall; it stays the largest CPU share of a 2 ms CNN."""
    d0, e0, l0, d1, e1, l1 = _before_after("cpu-preprocess", 6.0, tmp_path)
    detail = f"before {_findings(d0)} {l0}; after {_findings(d1)} {l1}"
    # measured: preprocess stage p50 107-146 ms -> 10-13 ms, e2e p99 434-484 ms -> 61-152 ms,
    # 14-17 -> 66-102 rps, cpu.preprocess_share 0.71 -> 0.35-0.43. The CI of 54a8a8e ran the pathology in a fast
    # minute of its host (39 rps, e2e p99 113 ms) and the fix's p99 came out at 0.62x it (70 ms; the fix's p50
    # 0.42x and its throughput 2.2x): a 10 s closed loop's p99 on a shared 2-core host is a handful of requests
    # caught behind other work. The median says how much faster a request is; the tail only that it is shorter
    assert e1["stage.preprocess_ms.p50"] < 0.5 * e0["stage.preprocess_ms.p50"], detail
    assert e1["latency.e2e_ms.p50"] < 0.6 * e0["latency.e2e_ms.p50"], detail
    assert e1["latency.e2e_ms.p99"] < e0["latency.e2e_ms.p99"], detail
    assert l1.throughput_rps > 1.5 * l0.throughput_rps, detail
    assert e1["cpu.preprocess_share"] < e0["cpu.preprocess_share"] - 0.15, detail
    assert _impact(d1, "CPU001") < _impact(d0, "CPU001") - 0.15, detail
    assert _impact(d1, "STG001") < _impact(d0, "STG001"), detail


@pytest.mark.timeout(600)
def test_fixed_recompile_stops_compiling(tmp_path: Path) -> None:
    """Dynamic shapes compiled before READY: seconds-long requests become milliseconds."""
    d0, e0, l0, d1, e1, l1 = _before_after("recompile", 8.0, tmp_path)
    detail = f"before {_findings(d0)} {l0}; after {_findings(d1)} {l1}"
    # measured: e2e p99 9.7 s -> 9-140 ms, 0.2 -> 70-340 rps
    assert e1["latency.e2e_ms.p99"] < 0.1 * e0["latency.e2e_ms.p99"], detail
    assert l1.throughput_rps > 10 * l0.throughput_rps, detail
    for key in ("compile.modules_loaded", "compile.cache_files_added"):
        assert not e1.get(key), (key, detail)
    runs_compiled_graph = [  # the stack of a request running the compiled graph (no compiler on it)
        ("forward", "torch/_functorch/aot_autograd.py"),
        ("runtime_wrapper", "torch/_functorch/_aot_autograd/runtime_wrappers.py"),
        ("__call__", "torch/_inductor/output_code.py"),
        ("call", "c7oaupvbyknpvybk6jy44wa4opsmgodnivoksusxjvv7qdyr6gky.py"),
    ]
    assert classify(runs_compiled_graph) is Activity.FORWARD
    assert "CMP001" not in {f.code for f in d1.findings}, detail


@pytest.mark.timeout(600)
def test_fixed_recompile_compiles_nothing_after_ready() -> None:
    with DemoService("recompile", fixed=True) as svc:
        before = _get(f"{svc.url}/stats")
        with background_load(svc.url, PATHOLOGIES["recompile"], 3.0, stop_on_exit=False) as load:
            pass
        after = _get(f"{svc.url}/stats")
    assert after["fixed"] is True
    # warm-up ran every batch size once; the load then serves the whole cycle of sizes again
    assert load.result is not None and load.result.errors == 0, load.result
    assert load.result.requests > DynamicShapePathology.max_batch, load.result
    assert after["distinct_batch_sizes"] == DynamicShapePathology.max_batch, (before, after)
    assert after["compiles"] == before["compiles"], (before, after)


def _window_steps(session: Path, over: str) -> tuple[float, float]:
    """(engine steps, steps of more than ``over`` tokens) in the window: the difference of the two
    ``demo_engine_step_tokens`` scrapes the session took of the service's /metrics."""
    text = (session / "metrics-0.prom").read_text()
    scrapes = split_scrapes(text)
    assert len(scrapes) == 2, f"the session holds {len(scrapes)} scrape(s) of the service: {text[:300]}"
    first, last = (buckets(families(body), "demo_engine_step_tokens") for _, body in scrapes)
    steps = last["+Inf"] - first["+Inf"]
    return steps, steps - (last[over] - first[over])


def test_fixed_prefill_stops_stalling_the_streams(tmp_path: Path) -> None:
    """Chunked prefill: decode steps no longer wait for whole prompts, requests no longer queue behind them."""
    d0, e0, l0, d1, e1, l1 = _before_after("prefill", 8.0, tmp_path)
    detail = f"before {_findings(d0)} {l0}; after {_findings(d1)} {l1}"
    # The mechanism, counted by the engine: without the fix a whole prompt (64-4096 tokens) is one
    # step every running stream waits for; with it a step computes at most its 512-token budget. The
    # demo's histogram counts a step's prompt tokens plus the tokens it generated, a finishing prompt's
    # first token among them, so a full step reads a few tokens over 512, never over 1024. (vLLM's own
    # vllm:iteration_tokens_total cannot show this: it counts a prompt whole, at the step that finishes it.)
    steps0, big0 = _window_steps(tmp_path / "before", "1024.0")
    steps1, big1 = _window_steps(tmp_path / "after", "1024.0")
    detail += f"; steps > 1024 tokens: before {big0:.0f} of {steps0:.0f}, after {big1:.0f} of {steps1:.0f}"
    assert big0 > 0 and steps1 > 0 and big1 == 0, detail
    # What it does to the streams. Measured (5 pairs): inter-token p99 1.7-2.6 s -> 0.3-0.56 s, queue
    # p99 1.0-2.1 s -> 0.11-0.33 s; on a slower day (3 pairs) inter-token 1.1-2.1 s -> 0.47-0.66 s
    # (0.30-0.44x), queue 1.6-1.9 s -> 0.36-0.38 s (0.19-0.23x); once in CI 1.1 s -> 0.60 s (0.54x).
    # Time to first token does not fall (p50 ~1.4x, p99 ~1.5x): on one CPU thread the decode steps
    # between the chunks cost what they cost, so TTF001 stays, with prefill now all of the TTFT.
    assert e1["latency.itl_ms.p99"] < 0.75 * e0["latency.itl_ms.p99"], detail
    assert e1["stage.queue_ms.p99"] < 0.75 * e0["stage.queue_ms.p99"], detail
    print(detail, f"itl p99 {e0['latency.itl_ms.p99']:.0f} -> {e1['latency.itl_ms.p99']:.0f} ms,",
          f"queue p99 {e0['stage.queue_ms.p99']:.0f} -> {e1['stage.queue_ms.p99']:.0f} ms")


def test_chunked_prefill_matches_the_whole_prompt_prefill() -> None:
    torch.manual_seed(0)
    cfg = DecoderConfig(vocab=512, d_model=64, n_heads=4, d_hidden=128, n_layers=2, max_model_len=1024)
    model = TinyDecoderLM(cfg).eval()
    ids = torch.randint(1, cfg.vocab, (300,))
    whole, chunked = model.new_cache(310), model.new_cache(310)
    with torch.no_grad():
        expected = model.prefill(ids, whole)
        for start in range(0, 300, 64):
            got = model.prefill(ids[start:start + 64], chunked, start)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for (k0, v0), (k1, v1) in zip(whole, chunked, strict=True):
        torch.testing.assert_close(k1[:, :300], k0[:, :300])
        torch.testing.assert_close(v1[:, :300], v0[:, :300])


def test_fixed_service_says_so_and_list_shows_the_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    with DemoService("healthy", fixed=True) as svc:
        assert _get(f"{svc.url}/healthz") == {"status": "ok", "pathology": "healthy", "fixed": True}
    with DemoService("healthy") as svc:
        assert "fixed" not in _get(f"{svc.url}/healthz")
    assert run_demo(argparse.Namespace(list=True)) == 0
    out = capsys.readouterr().out
    assert out.count("--fixed") == len(PATHOLOGIES)
    for spec in PATHOLOGIES.values():
        assert spec.fix and spec.fix in out
