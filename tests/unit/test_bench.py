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


def test_ensemble_time_is_split_by_its_composing_models_triton_3245() -> None:
    # the ensemble's own line says 99.6 % compute; its composing model dali (pre-processing) is 19.5 of its 30.0 ms
    ev = _ev("perf_analyzer_ensemble_dali_preprocess.txt")
    assert ev["bench.composing_models"] == 1
    assert ev["stage.preprocess_ms.mean"] == 19.488  # its queue too: requests waiting for DALI wait for DALI
    assert abs(_f(ev["stage.preprocess.share"]) - 19.488 / 30.025) < 1e-9
    assert ev["stage.queue.share"] == 0.0
    assert "stage.compute.share" not in ev  # the ensemble's "compute" is its models' time, not the model's
    assert ev["stage.queue_ms.mean"] == 0.069  # the ensemble's own parts are still reported


def test_nested_composing_models_count_their_leaves_once() -> None:
    # --bls-composing: e5_large_v2 (100.4 ms) is itself e5_large_v2_model (94.0 ms) and e5_large_v2_tokenize (6.8 ms)
    ev = _ev("perf_analyzer_bls_composing_nested.txt")
    assert ev["bench.composing_models"] == 2
    assert abs(_f(ev["stage.compute_ms.mean"]) - (93.983 - 22.009)) < 1e-9
    assert abs(_f(ev["stage.preprocess_ms.mean"]) - 6.802) < 1e-9
    assert abs(_f(ev["stage.queue.share"]) - 22.009 / 235.605) < 1e-9
    # models that ran side by side summing past the ensemble's latency: shares of their sum, never above 1
    lines = ["Request concurrency: 4", "Client:", "Throughput: 10 infer/sec", "Avg latency: 12000 usec", "Server:",
             "Avg request latency: 10000 usec (overhead 0 usec + queue 0 usec + compute 10000 usec)",
             "Composing models:", "detector, version: 1",
             "Avg request latency: 9000 usec (overhead 0 usec + queue 0 usec + compute infer 9000 usec)",
             "classifier, version: 2",
             "Avg request latency: 9000 usec (overhead 0 usec + queue 0 usec + compute infer 9000 usec)"]
    ev = {e.key: e.value for e in _source(lines).evidence("x")}
    assert ev["stage.compute.share"] == 1.0 and "stage.preprocess.share" not in ev


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


def test_hey_and_booms_summary() -> None:
    """NVIDIA/gpu-rest-engine#7's `boom -n 20000` summary (hey's earlier name): its average and slowest latency, the
    rate, the 2xx responses; the percentile list when printed. Its concurrency is not printed: none is read."""
    lines = ["Summary:", "  Total:\t169.0645 secs", "  Slowest:\t0.7978 secs", "  Fastest:\t0.0370 secs",
             "  Average:\t0.4214 secs", "  Requests/sec:\t118.2981", "", "Status code distribution:",
             "  [200]\t20000 responses", "", "Latency distribution:", "  10% in 0.0370 secs", "  50% in 0.4500 secs",
             "  99% in 0.7800 secs"]
    ev = {e.key: e.value for e in _source(lines).evidence("x")}
    assert ev["latency.e2e_ms.mean"] == 421.4 and ev["throughput.rps"] == 118.2981 and ev["requests.count"] == 20000
    assert ev["latency.e2e_ms.p50"] == 450.0 and ev["latency.e2e_ms.p99"] == 780.0 and "bench.concurrency" not in ev
    assert "latency.e2e_ms.mean" not in {e.key for e in _source(["Summary:", "Average time was fine"]).evidence("x")}


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


def test_an_ensemble_whose_preprocessing_model_takes_the_time_is_no_health() -> None:
    """triton server#3245: analysed alone, the ensemble's line (99.6 % compute) read as a covered, healthy
    service at 0.92; its composing DALI model is 65 % of the time, and the ensemble's fix leads."""
    from diagnose import pipeline
    from diagnose.loose import analyze_lines
    from diagnose.model import EvidenceSet, Verdict

    res = analyze_lines("triton-3245", _read("perf_analyzer_ensemble_dali_preprocess.txt"))
    d = pipeline.judge(EvidenceSet(res.evidence))
    top = d.findings[0]
    assert top.code == "STG001" and d.verdict is not Verdict.HEALTHY
    assert "By composing model: dali 19.5 ms of the ensemble's 30.0 ms" in top.message
    assert top.fixes[0].summary == "Let the ensemble's processing model keep pace with the main model"


def test_trtexec_summary_splits_copies_from_compute_triton_6243() -> None:
    ev = _ev("trtexec_summary_large_io_copies.txt")
    assert ev["throughput.rps"] == 16.7825
    assert ev["latency.e2e_ms.mean"] == 96.1359 and ev["latency.e2e_ms.p99"] == 102.108
    assert ev["stage.h2d_ms.mean"] == 6.22497 and ev["stage.d2h_ms.mean"] == 31.5505
    total = 6.22497 + 58.3605 + 31.5505
    assert abs(_f(ev["stage.d2h.share"]) - 31.5505 / total) < 1e-9
    assert abs(_f(ev["stage.compute.share"]) - 58.3605 / total) < 1e-9
    assert ev["bench.enqueue_ms.mean"] == 1.57058


def test_trtexec_beside_a_server_sweep_and_its_wall_time() -> None:
    # trtexec's lines as TensorRT 8.6 prints them (constructed values), then a perf_analyzer level: the server's
    # level is the one reported, the engine's parts are read too; the GPU's compute over the run's wall time
    lines = ["[04/01/2024-21:10:48] [I] === Performance summary ===",
             "[04/01/2024-21:10:48] [I] Throughput: 9.5 qps",
             "[04/01/2024-21:10:48] [I] Latency: min = 104.9 ms, max = 106.8 ms, mean = 105.6 ms, median = 105.5 ms, "
             "percentile(90%) = 106.5 ms, percentile(95%) = 106.7 ms, percentile(99%) = 106.8 ms",
             "[04/01/2024-21:10:48] [I] GPU Compute Time: min = 103.8 ms, max = 105.5 ms, mean = 104.4 ms, "
             "median = 104.3 ms, percentile(99%) = 105.5 ms",
             "[04/01/2024-21:10:48] [I] Total Host Walltime: 3.2 s",
             "[04/01/2024-21:10:48] [I] Total GPU Compute Time: 3.0 s",
             "Request concurrency: 4", "Client:", "Throughput: 30 infer/sec", "Avg latency: 130000 usec"]
    ev = {e.key: e.value for e in _source(lines).evidence("x")}
    assert ev["throughput.rps"] == 30.0 and ev["bench.levels"] == 1 and ev["latency.e2e_ms.mean"] == 130.0
    assert ev["stage.compute_ms.mean"] == 104.4 and ev["stage.compute.share"] == 1.0
    assert abs(_f(ev["bench.gpu_compute_walltime_share"]) - 3.0 / 3.2) < 1e-9
    # a "Latency: min = …" line with no summary before it is not trtexec's
    assert not _source(["Latency: min = 1 ms, max = 2 ms, mean = 1.5 ms"]).matched()


def test_review_fixes_trtexec_and_ensembles() -> None:
    """A reviewer's repros: trtexec's lines with only the [I] tag (NVIDIA/TensorRT#3364's paste) are read; a server
    level with its own breakdown keeps its stages (trtexec's run is another request's); a composing model is never a
    copy, whatever its name; a DALI model at 28 % of an ensemble is its share by design, no bottleneck."""
    from diagnose import pipeline
    from diagnose.loose import analyze_lines
    from diagnose.model import EvidenceSet

    tagged = [line.split("] ", 1)[1] for line in _read("trtexec_summary_large_io_copies.txt") if "] [I]" in line]
    assert tagged[0].startswith("[I] === Performance summary")
    ev = {e.key: e.value for e in _source(tagged).evidence("x")}
    assert ev["stage.d2h_ms.mean"] == 31.5505
    served = _read("perf_analyzer_slow_compute_modest_concurrency.txt") + _read("trtexec_summary_large_io_copies.txt")
    ev = {e.key: e.value for e in _source(served).evidence("x")}
    assert "stage.d2h.share" not in ev and ev["stage.compute_infer_ms.mean"] == 209.423
    download = ["Request concurrency: 4", "Client:", "Throughput: 80 infer/sec", "Avg latency: 50100 usec", "Server:",
                "Avg request latency: 49600 usec (overhead 300 usec + queue 200 usec + compute 49100 usec)",
                "Composing models:", "image_download, version: 1",
                "Avg request latency: 38500 usec (overhead 20 usec + queue 100 usec + compute infer 38380 usec)",
                "resnet50_trt, version: 1",
                "Avg request latency: 10900 usec (overhead 20 usec + queue 100 usec + compute infer 10780 usec)"]
    ev = {e.key: e.value for e in _source(download).evidence("x")}
    assert "stage.h2d.share" not in ev and abs(_f(ev["stage.compute_ms.mean"]) - (38.4 + 10.8)) < 1e-9
    dali = ["Request concurrency: 1", "Client:", "Throughput: 135.4 infer/sec", "Avg latency: 7380 usec", "Server:",
            "Avg request latency: 8348 usec (overhead 0 usec + queue 78 usec + compute 8270 usec)",
            "Composing models:", "dali, version: ",
            "Avg request latency: 2307 usec (overhead 3 usec + queue 42 usec + compute infer 2262 usec)",
            "resnet50_fp32_libtorch, version: ",
            "Avg request latency: 6000 usec (overhead 48 usec + queue 36 usec + compute infer 5916 usec)"]
    d = pipeline.judge(EvidenceSet(analyze_lines("dali", dali).evidence))
    assert not any(f.code == "STG001" for f in d.findings)
    # ... but one where requests queue at DALI (45 of its 65 ms) is DALI's bottleneck (a second reviewer's repro)
    queued = [*dali[:5],
              "Avg request latency: 80000 usec (overhead 100 usec + queue 45400 usec + compute 34500 usec)",
              "Composing models:", "dali_preprocess, version: 1",
              "Avg request latency: 65100 usec (overhead 50 usec + queue 45000 usec + compute infer 20050 usec)",
              "resnet50_trt, version: 1",
              "Avg request latency: 14900 usec (overhead 50 usec + queue 400 usec + compute infer 14450 usec)"]
    d = pipeline.judge(EvidenceSet(analyze_lines("dali", queued).evidence))
    top = d.findings[0]
    assert top.code == "STG001" and "of the ensemble's server-side time (65.1 ms of 80 ms" in top.message


def test_an_old_ensembles_total_lines_are_its_parts_and_an_unreported_queue_is_not_read_as_none() -> None:
    # triton server#2429: an old perf_analyzer's ensemble prints its parts one a line; its queue (0 µs) is its own,
    # not its composing models' (PR #2455), and compute is 7.8 of its 1,886 ms: the rest is not "no waiting"
    src = _source(_read("perf_analyzer_ensemble_totals_queue_unreported.txt"))
    assert src.problems() == []  # the breakdown follows the latency line, it is not cut short
    ev = {e.key: e.value for e in src.evidence("x")}
    assert abs(_f(ev["stage.compute_ms.mean"]) - (4.184 + 3.291 + 0.281)) < 1e-9
    assert "stage.queue_ms.mean" not in ev and "stage.queue.share" not in ev
    assert abs(_f(ev["bench.ensemble_unaccounted_share"]) - (1 - 7.756 / 1885.711)) < 1e-9
    # the same form where compute covers most of the request time: the queue is still the ensemble's own, never
    # read (a 0 µs queue beside 60 of 98 ms compute would say nothing waited), and nothing is left unaccounted
    lines = ["Request concurrency: 16", "Client:", "Throughput: 160 infer/sec", "Avg latency: 100000 usec", "Server:",
             "Avg request latency: 98000 usec", "Total avg compute input time : 1000 usec",
             "Total avg compute infer time : 58000 usec", "Total avg compute output time : 1000 usec",
             "Total avg queue time : 0 usec"]
    ev = {e.key: e.value for e in _source(lines).evidence("x")}
    assert "stage.queue_ms.mean" not in ev and "stage.queue.share" not in ev
    assert ev["stage.compute_ms.mean"] == 60.0 and "bench.ensemble_unaccounted_share" not in ev


def test_an_old_ensembles_total_lines_give_way_to_its_composing_models_triton_2455() -> None:
    # PR #2455's "Before": the ensemble's own lines (queue 0) then its models: dali's and resnet's times decide
    src = _source(["Request concurrency: 1", "Client:", "Throughput: 120 infer/sec", "Avg latency: 8300 usec",
                   *_read("perf_analyzer_ensemble_totals_before_2455.txt")])
    ev = {e.key: e.value for e in src.evidence("x")}
    assert ev["bench.composing_models"] == 2
    assert ev["stage.preprocess_ms.mean"] == 2.307
    assert "stage.queue_ms.mean" not in ev  # the ensemble's own 0 µs queue is not its models' 42 + 36 µs
    assert abs(_f(ev["stage.queue.share"]) - 0.036 / 8.348) < 1e-9
