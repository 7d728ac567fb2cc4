"""Load-generator output: perf_analyzer (full blocks, sweeps, summary lines), wrk, ab."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.collectors.bench import BenchParser
from diagnose.collectors.logtext import clean_lines
from diagnose.derive.bench import BenchSource
from tests.conftest import DATA

BENCH = os.path.join(DATA, "bench")


def _f(x: object) -> float:
    assert isinstance(x, int | float)
    return float(x)


def _source(lines: list[str]) -> BenchSource:
    src = BenchSource()
    for line in clean_lines(lines):
        src.feed(line)
    return src


def _read(name: str) -> list[str]:
    with open(os.path.join(BENCH, name), encoding="utf-8") as fh:
        return fh.readlines()


def _ev(name: str) -> dict[str, object]:
    src = _source(_read(name))
    assert src.matched()
    return {e.key: e.value for e in src.evidence(name)}


def test_perf_analyzer_queue_dominates_triton_7986() -> None:
    ev = _ev("perf_analyzer_concurrency1000_queue_dominates.txt")
    assert ev["bench.concurrency"] == 1000
    assert ev["throughput.rps"] == 4005.66
    assert ev["latency.e2e_ms.mean"] == 247.602 and ev["latency.e2e_ms.p99"] == 345.187
    assert ev["stage.queue_ms.mean"] == 242.704
    assert abs(_f(ev["stage.compute_ms.mean"]) - (2.241 + 1.613)) < 1e-9
    assert abs(_f(ev["bench.server_batch_mean"]) - 72262 / 4518) < 1e-9
    assert ev["requests.count"] == 72262


def test_cut_breakdown_is_reported_as_partial() -> None:
    src = _source(_read("perf_analyzer_concurrency1000_queue_dominates.txt"))
    assert any("cut short" in p for p in src.problems())
    src = _source(_read("perf_analyzer_slow_compute_modest_concurrency.txt"))
    assert src.problems() == []


def test_perf_analyzer_slow_compute_triton_3386() -> None:
    ev = _ev("perf_analyzer_slow_compute_modest_concurrency.txt")
    assert ev["bench.concurrency"] == 5 and ev["throughput.rps"] == 4.8
    assert ev["stage.compute_infer_ms.mean"] == 209.423
    assert abs(_f(ev["stage.queue.share"]) - 838434 / 1047931) < 1e-9


def test_summary_only_sweep_reports_the_highest_level_and_unloaded_latency() -> None:
    ev = _ev("perf_analyzer_sweep_summary_only.txt")
    assert ev["bench.levels"] == 4
    assert ev["bench.concurrency"] == 8 and ev["throughput.rps"] == 403.5
    assert ev["latency.e2e_ms.mean"] == 19.822
    assert ev["bench.unloaded_latency_ms"] == 4.751


def test_sweep_with_blocks_and_composing_models() -> None:
    lines = [
        "*** Measurement Settings ***", "  Batch size: 2",
        "Request concurrency: 1", "  Client: ", "    Request count: 100", "    Throughput: 40 infer/sec",
        "    Avg latency: 50000 usec (standard deviation 100 usec)",
        "  Server: ", "    Inference count: 200", "    Execution count: 100",
        "    Avg request latency: 49000 usec (overhead 10 usec + queue 1000 usec + compute input 10 usec + "
        "compute infer 47000 usec + compute output 10 usec)",
        "  Composing models: ", "  preprocess, version: 1",
        "      Avg request latency: 9000 usec (overhead 1 usec + queue 99999 usec + compute input 1 usec + "
        "compute infer 1 usec + compute output 1 usec)",
        "Request concurrency: 16", "  Client: ", "    Request count: 900", "    Throughput: 180 infer/sec",
        "    Avg latency: 180000 usec (standard deviation 100 usec)", "    p99 latency: 250 ms",
        "  Server: ",
        "    Avg request latency: 179000 usec (overhead 10 usec + queue 131000 usec + compute input 10 usec + "
        "compute infer 47000 usec + compute output 10 usec)",
    ]
    ev = {e.key: e.value for e in _source(lines).evidence("x")}
    assert ev["bench.levels"] == 2 and ev["bench.concurrency"] == 16
    assert ev["bench.batch_size"] == 2 and ev["throughput.rps"] == 90.0  # 180 inferences/s of batch 2
    assert ev["stage.queue_ms.mean"] == 131.0  # the top-level model, not the composing one
    assert ev["latency.e2e_ms.p99"] == 250.0
    assert ev["bench.unloaded_latency_ms"] == 50.0


def test_client_transport_split_in_every_generation() -> None:
    # perf_client's "send/recv + response wait" (triton server#1: 32 × 608×608×3 FP32 inputs over HTTP)
    ev = _ev("perf_client_http_send_recv_large_tensors.txt")
    assert ev["latency.transport_ms.mean"] == 4524.2 and ev["latency.client_io_ms.mean"] == 3499.134
    assert abs(_f(ev["latency.client_io.share"]) - 3499.134 / 4532.481) < 1e-9
    assert ev["stage.compute_ms.mean"] == 370.348  # one undivided compute, older perf_client
    assert ev["stage.queue_ms.mean"] == 651.073
    keys = [e.key for e in _source(_read("perf_client_http_send_recv_large_tensors.txt")).evidence("x")]
    assert keys.count("stage.compute_ms.mean") == 1  # the undivided part is the sum, not a second key
    # perf_analyzer 2.x bullets every line; HTTP "send + response wait + receive"
    ev = _ev("perf_analyzer_bulleted_http.txt")
    assert ev["bench.concurrency"] == 60 and ev["requests.count"] == 19347
    assert ev["latency.e2e_ms.p99"] == 425.55 and ev["latency.client_io_ms.mean"] == 0.047
    assert ev["stage.queue_ms.mean"] == 30.328  # the ensemble's own line, not its composing model's
    # gRPC "marshal + response wait + unmarshal"
    ev = _ev("perf_analyzer_bulleted_grpc.txt")
    assert ev["latency.transport_ms.mean"] == 50.705 and ev["latency.client_io_ms.mean"] == 0.002
    src = _source(["Request concurrency: 1", "  Client:", "    Request count: 8452", "    Throughput: 2608.5 infer/sec",
                   "    Avg gRPC time: 3798 usec ((un)marshal request/response 7 usec + response wait 3791 usec)"])
    assert {e.key: e.value for e in src.evidence("x")}.get("latency.client_io_ms.mean") == 0.007


def test_wrk_and_ab() -> None:
    ev = _ev("wrk_latency_400_connections.txt")
    assert ev["bench.concurrency"] == 400 and ev["throughput.rps"] == 491.52
    assert ev["latency.e2e_ms.mean"] == 812.44 and ev["latency.e2e_ms.p99"] == 1120.0
    assert ev["requests.count"] == 14770
    ev = _ev("ab_concurrency_10.txt")
    assert ev["bench.concurrency"] == 10 and ev["throughput.rps"] == 81.04
    assert ev["latency.e2e_ms.mean"] == 123.4 and ev["latency.e2e_ms.p99"] == 156.0


def test_delayed_warning() -> None:
    lines = ["Request concurrency: 4", "Client:", "Throughput: 10 infer/sec", "Avg latency: 400 ms",
             "[WARNING] Perf Analyzer is not able to keep up with the desired load. The results may not be accurate."]
    ev = {e.key: e.value for e in _source(lines).evidence("x")}
    assert ev["bench.client_delayed"] == 1


def test_unrelated_text_not_matched() -> None:
    p = BenchParser()
    for line in ["Throughput: 4 infer/sec", "50%  12", "Client:", "Latency 3ms 2ms 1ms"]:
        p.feed(line)
    assert not p.matched()


REAL_LINES = (_read("perf_analyzer_concurrency1000_queue_dominates.txt") + _read("wrk_latency_400_connections.txt")
              + _read("ab_concurrency_10.txt"))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=60), st.sampled_from(REAL_LINES)), max_size=60))
def test_fuzz_shuffled_and_random_lines(lines: list[str]) -> None:
    src = _source(lines)
    src.evidence("fuzz")
    src.problems()


def test_huge_line_and_mixed_encoding() -> None:
    import io

    from diagnose.collectors.logtext import iter_text_lines

    raw = b"Request concurrency: 4\n  Client:\n    Throughput: " + b"9" * 1_000_000 + b" infer/sec\n\xff\xfe\n"
    src = _source(list(iter_text_lines(io.BytesIO(raw))))
    src.evidence("huge")
    src.problems()
