"""Every real PyTorch-profiler (Kineto) trace in ../shared/data/kineto through `diagnose analyze`,
with the verdict a GPU engineer would give and why; the small copies in tests/data/kineto checked
value by value (so CI without ../shared still tests the reader).
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os

import pytest

from diagnose import cli, loose, pipeline
from diagnose.collectors import kineto
from diagnose.derive import kineto as derive_kineto
from tests.conftest import DATA, SHARED

KINETO = os.path.join(SHARED, "data", "kineto")
TRACES = sorted(glob.glob(os.path.join(KINETO, "*.gz")))
LOCAL = os.path.join(DATA, "kineto")
OLD_SCHEMA = os.path.join(LOCAL, "old_schema_inference_rank_1.json.gz")
ROCM = os.path.join(LOCAL, "rocm_mi250_minitoy_train.json.gz")
SYNC_STALL = os.path.join(LOCAL, "sync_stall_sglang_decode_hipgraph_mi300x.json.gz")
needs_shared = pytest.mark.skipif(not TRACES, reason="../shared/data/kineto is absent")

# (verdict, findings in rank order, HTA idle share, trace.gpu_busy_ratio) and why an engineer says so
VERDICTS: dict[str, tuple[str, list[str], float | None, float | None]] = {
    # eager vLLM-style step on B200: 768 kernels, 76 % under 10 µs, GPU busy 14 %, 75 % of the window in
    # sub-ms gaps before the next launch was even issued: Python dispatch sets the pace (launch_overhead)
    "b200__eager_trace": ("bottleneck", ["GPU108"], 0.872, 0.137),
    # HF Qwen forward, batch 16 × 2048 on H100 / MI300X: kernels fill ~92 % of a 50 ms window: the GPU works
    "h100__Qwen_Qwen1.5-0.5B-Chat": ("healthy", [], 0.115, 0.919),
    "mi300__Qwen_Qwen1.5-0.5B-Chat": ("healthy", [], 0.118, 0.915),
    # CUDA-graph capture phases (vLLM, SGLang): kernels are recorded, not served: nothing to judge
    "sglang_decode__capture_traces__bs_32": ("undetermined", [], 0.1, None),
    "vllm_decode_full__capture_traces": ("undetermined", [], 0.993, None),
    # SGLang decode on MI300X: one hipGraphLaunch (555 kernels, 9 ms), then the host blocks 463 ms in a
    # synchronous hipMemcpyWithStream while the GPU idles 98 %: host and GPU take turns
    "sglang_decode__sglang_Qwen3-8B_decode": ("bottleneck", ["GPU104"], 0.981, 0.021),
    # the prefill step: 0.49 s of kernels, then the same blocking copy for 0.49 s
    "sglang_prefilldecode": ("bottleneck", ["GPU104"], 0.501, 0.499),
    # vLLM FULL graph decode: one replay keeps the GPU ~100 % busy for 10.7 ms: healthy
    "vllm_decode_full__graph_execution": ("healthy", [], 0.043, 0.998),
    # PIECEWISE graphs over an 8192-token step: 156 ms of compute, busy 99.8 %: GPU-bound
    "vllm_prefilldecode_piecewise": ("bottleneck", ["GPU107"], 0.005, 0.998),
    # FLUX.1 diffusion on MI300X, torch.compile + graphs: busy 89 % over 227 ms: GPU-bound
    "xdit_flux.1_aiter_sage": ("bottleneck", ["GPU107"], 0.146, 0.889),
    # 6 ms of kernels only (no CPU ops): too short to judge
    "mi210__gpu_only_trace": ("undetermined", [], 0.201, 0.894),
    # excerpts of a handful of GPU operations: partial, nothing to judge
    "torch_compile_triton": ("undetermined", [], 0.002, None),
    "amd_trace__mi250": ("undetermined", [], 0.985, None),
    "cuda_event_sync__event_sync": ("undetermined", [], 0.787, None),
    "cuda_event_sync_multi_stream": ("undetermined", [], 0.981, None),
    "trace_compare__base": ("undetermined", [], 0.0, None),
    "trace_compare__test": ("undetermined", [], 0.0, None),
    "trace_file_list__inference_rank_1": ("undetermined", [], 0.982, None),
    "triton_example": ("undetermined", [], 0.0, None),
    # 140 GPU ops over 7.7 ms: a short step, judged with low quality only
    "with_gpu_user_annotation": ("undetermined", [], 0.963, 0.038),
    # AlexNet / simple_add benchmarks: the first CUDA call creates the context for 25-30 s; the
    # 13-16 s GPU window is start-up, not a workload (GPU109: a cold start, recompilation's category; committed
    # since the calibrator's refit of 2026-12-05, withheld at its old bar of 0.90)
    "critical_path__alexnet": ("bottleneck", ["GPU109"], 0.995, None),
    "critical_path__simple_add": ("bottleneck", ["GPU109"], 0.997, None),
    # no GPU timeline: CPU-only traces, CUPTI range-profiler mode, MTIA, a memory timeline
    "cpu_only__rank-34": ("undetermined", [], None, None),
    "cupti_profiler": ("undetermined", [], None, None),
    "distributed_info_unavailable": ("undetermined", [], None, None),
    "rank_non_gpu": ("undetermined", [], None, None),
    "rank_unavailable": ("undetermined", [], None, None),
    "memory_analysis__memory_timeline": ("undetermined", [], None, None),
    "mtia_inference_trace": ("undetermined", [], 0.043, None),
    # A100 rank 0/2 eager training: GPU busy 24 %, half the window in sub-ms gaps before each launch
    "nccl_parser_config": ("bottleneck", ["GPU108"], 0.778, 0.238),
    # A100 rank 0/16 with 70 graph launches: busy 36 %, idle in host-scale gaps between steps
    "negative_queue_length_values_check": ("bottleneck", ["GPU105"], 0.695, 0.356),
    # V100 ResNet training step, ns-resolution timestamps: kernels fill 98 % of 480 ms: GPU-bound
    "ns_resolution_trace": ("bottleneck", ["GPU107"], 0.026, 0.984),
    # the trace_diff pair: control busy 84 % (comm 35 %, mostly overlapped): no fault; test 96 %: GPU-bound
    "trace_diff__control": ("healthy", [], 0.161, 0.836),
    "trace_diff__test": ("bottleneck", ["GPU107"], 0.071, 0.963),
    # sampled ranks 0/1 of 128: busy ~46 %, the idle in gaps of a millisecond and more between steps
    "sampled_rank-0": ("bottleneck", ["GPU105"], 0.536, 0.448),
    "sampled_rank-1": ("bottleneck", ["GPU105"], 0.547, 0.471),
}
PARTIAL = {  # why the input is partial
    "sglang_decode__capture_traces": "CUDA-graph capture",
    "vllm_decode_full__capture_traces": "CUDA-graph capture",
    "torch_compile_triton": "only 12 GPU operations",
    "triton_example": "only 1 GPU operations",
    "cpu_only__rank-34": "a CPU-only trace",
    "cupti_profiler": "CUPTI range-profiler mode",
    "distributed_info_unavailable": "a CPU-only trace",
    "memory_analysis__memory_timeline": "a torch.profiler memory timeline",
    "mtia_inference_trace": "Meta MTIA",
    "critical_path__alexnet": "only 98 GPU operations",
}
# HTA 0.5.0's get_temporal_breakdown on the same files (benchmarks/kineto_vs_hta.py prints it live):
# idle %, compute %, non-compute %
HTA = {
    "trace_diff__control": (16.2, 61.23, 22.57),
    "trace_diff__test": (7.47, 68.31, 24.23),
    "ns_resolution_trace": (2.63, 96.75, 0.62),
    "negative_queue_length_values_check": (69.44, 14.15, 16.41),
    "b200__eager_trace": (87.2, 12.02, 0.79),
    "mtia_inference_trace": (4.34, 94.66, 1.0),
    "vllm_decode_full__graph_execution": (4.26, 95.42, 0.32),
    "sampled_rank-0": (53.56, 17.71, 28.74),
}


def _stem(path: str) -> str:
    return os.path.basename(path).split(".json")[0].split(".raw")[0]


def _entry(table: dict[str, object], path: str) -> object:
    hits = [k for k in table if k in _stem(path)]
    assert hits, f"no expectation for {_stem(path)}"
    return table[max(hits, key=len)]


def _bytes(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def _ev(path: str) -> tuple[pipeline.Diagnosis, dict[str, object]]:
    d = pipeline.analyze([path])
    return d, {e.key: e.value for e in d.evidence}


@needs_shared
def test_every_file_of_the_folder_has_an_expectation() -> None:
    assert len(TRACES) == 36
    for path in TRACES:
        _entry(VERDICTS, path)  # type: ignore[arg-type]


@needs_shared
@pytest.mark.parametrize("path", TRACES, ids=_stem)
def test_every_real_trace_is_read_and_judged(path: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["analyze", path, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    (inp,) = doc["inputs"]
    assert inp["kind"] in ("kineto_trace", "torch_memory_timeline")
    assert inp["status"] in ("ok", "partial")
    partial = [v for k, v in PARTIAL.items() if k in _stem(path)]
    if partial:
        assert inp["status"] == "partial" and partial[0] in inp["reason"], inp["reason"]
    elif inp["status"] == "partial":
        assert inp["reason"]
    verdict, codes, idle, busy = _entry(VERDICTS, path)  # type: ignore[misc]
    assert doc["verdict"] == verdict
    assert [f["code"] for f in doc["findings"]] == codes
    ev = {e["key"]: e["value"] for e in doc["evidence"]}
    if idle is None:
        assert "kineto.idle_share" not in ev
    else:
        assert ev["kineto.idle_share"] == pytest.approx(idle, abs=0.001)
    if busy is None:
        assert "trace.gpu_busy_ratio" not in ev
    else:
        assert ev["trace.gpu_busy_ratio"] == pytest.approx(busy, abs=0.001)


@needs_shared
@pytest.mark.parametrize("name", sorted(HTA))
def test_temporal_breakdown_agrees_with_hta_within_a_point(name: str) -> None:
    (path,) = [p for p in TRACES if name in _stem(p)]
    _, ev = _ev(path)
    got = tuple(100 * float(ev[k]) for k in  # type: ignore[arg-type]
                ("kineto.idle_share", "kineto.compute_share", "kineto.non_compute_share"))
    for mine, hta in zip(got, HTA[name], strict=True):
        assert abs(mine - hta) <= 1.0


@needs_shared
def test_ns_resolution_and_old_async_flow_schemas_read_alike() -> None:
    _, ns = _ev(next(p for p in TRACES if "ns_resolution" in p))
    assert ns["kineto.rank"] == 0 and ns["trace.kernel_count"] == 4350
    _, ctl = _ev(next(p for p in TRACES if "trace_diff__control" in p))  # async_cpu_to_gpu flows, int µs
    assert ctl["kineto.rank"] == 3 and ctl["trace.kernel_count"] == 8568
    assert 0.3 < ctl["kineto.comm_share"] < 0.4  # type: ignore[operator]
    # 2022-era External ids of kernels are correlation ids: no operator link, the host-time table only
    assert "kineto.top_operators" not in ctl and ctl["kineto.top_cpu_operators"]
    _, b200 = _ev(next(p for p in TRACES if "b200__eager" in p))  # current schema: kernels link to operators
    assert b200["kineto.top_operators"][0]["gpu_ms"] > 0  # type: ignore[index]


@needs_shared
def test_two_ranks_profiled_together_are_compared_and_the_slowest_rank_is_judged() -> None:
    # HTA's trace_filter pair: ranks 0 and 1 of a 128-rank DLRM-style job over the same two steps. Rank 1's
    # embedding kernels take 2.4-3.1x rank 0's (uneven table sharding): 136 ms of compute against 106 ms
    pair = sorted(p for p in TRACES if "sampled_rank-" in p)
    for paths in (pair, pair[::-1]):  # the verdict does not depend on the order of the files
        d = pipeline.analyze(paths)
        assert len(d.inputs) == 2 and {i.status for i in d.inputs} == {"ok"}
        ev = {e.key: e.value for e in d.evidence}
        assert ev["kineto.rank"] == 1 and ev["kineto.ranks.slowest"] == 1  # the pace-setter's keys are the ones judged
        assert ev["trace.gpu_busy_ratio"] == pytest.approx(0.471, abs=0.001)
        assert [r["rank"] for r in ev["kineto.ranks.table"]] == [0, 1]  # type: ignore[index]
        assert [len(r["devices"][0]["busy_bins"]) for r in ev["kineto.ranks.table"]] == [200, 200]  # type: ignore[index]
        assert ev["kineto.ranks.compute_imbalance_ratio"] == pytest.approx(135.68 / 106.368, abs=1e-3)
        assert ev["kineto.ranks.wait_share"] == pytest.approx((135.68 - 106.368) / 600.366, abs=1e-3)
        assert ev["kineto.ranks.comm_exposed_share_max"] == pytest.approx(0.276, abs=0.001)  # rank 0 waits in NCCL
        top = ev["kineto.ranks.excess_kernels"][0]  # type: ignore[index]
        assert top["name"].startswith("void split_embedding_backward") and top["ratio"] == pytest.approx(2.44, abs=0.01)
        assert [f.code for f in d.findings] == ["GPU105", "GPU111"]
        imbalance = d.findings[1]
        assert imbalance.category.value == "gpu_compute" and imbalance.severity.value == "minor"
        assert "Rank 1 runs 28 % more GPU computation" in imbalance.message
        assert "split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1" in imbalance.message
        assert "more work" in imbalance.message and "not a slower GPU" in imbalance.message


@needs_shared
def test_traces_not_profiled_together_are_listed_not_compared() -> None:
    # the trace_diff pair: rank 3 of one run and rank 1 of another, eight days apart on the trace clock
    pair = [next(p for p in TRACES if "trace_diff__control" in p), next(p for p in TRACES if "trace_diff__test" in p)]
    d = pipeline.analyze(pair)
    ev = {e.key: e.value for e in d.evidence}
    assert "not profiled together" in ev["kineto.ranks.not_compared"]  # type: ignore[operator]
    assert [r["rank"] for r in ev["kineto.ranks.table"]] == [1, 3]  # type: ignore[index]
    assert ev["kineto.rank"] == 3 and "kineto.ranks.slowest" not in ev  # as given: the first file's keys
    assert "GPU111" not in [f.code for f in d.findings]
    same = [p for p in TRACES if "trace_compare__" in p]  # two runs that both call themselves rank 1
    ev = {e.key: e.value for e in pipeline.analyze(same).evidence}
    assert ev["kineto.ranks.not_compared"] == "several traces give the same rank" and ev["kineto.ranks.count"] == 1


@needs_shared
def test_two_rank_traces_inside_a_session_are_compared(tmp_path) -> None:
    from tests.sessions import add_file, demo_copy

    folder = demo_copy(tmp_path)
    for path in sorted(p for p in TRACES if "sampled_rank-" in p):
        add_file(folder, os.path.basename(path), _bytes(path), collector="kineto")
    d = pipeline.analyze([folder])
    ev = {e.key: e.value for e in d.evidence}
    assert ev["kineto.ranks.slowest"] == 1 and ev["kineto.rank"] == 1
    assert "GPU111" in [f.code for f in d.findings]


def test_cross_rank_evidence_needs_two_breakdowns() -> None:
    from diagnose.derive import ranks

    one = loose.analyze_path(SYNC_STALL).evidence
    assert ranks.derive([one]) == [] and ranks.order([one]) == [0]
    cpu_only = [e for e in one if not e.key.startswith(("kineto.rank_breakdown",))]
    assert ranks.derive([one, cpu_only]) == [] and ranks.order([one, cpu_only]) == [0, 1]


@needs_shared
def test_graph_replays_are_recognised_on_cuda_and_rocm() -> None:
    _, rocm = _ev(next(p for p in TRACES if "vllm_prefilldecode_piecewise" in p))
    assert rocm["api.graph_launches"] == 25 and rocm["kineto.platform"] == "rocm"
    assert rocm["kineto.graph_kernel_share"] > 0.8  # type: ignore[operator]
    _, cuda = _ev(next(p for p in TRACES if "negative_queue" in p))
    assert cuda["api.graph_launches"] == 70 and cuda["kineto.platform"] == "cuda"


# -- the local copies (no ../shared needed) --------------------------------------------------------


def test_old_schema_kernel_runtime_and_async_gpu_flows() -> None:
    res = loose.analyze_path(OLD_SCHEMA)
    (inp,) = res.inputs
    assert inp.kind == "kineto_trace" and inp.status == "partial" and "only 4 GPU operations" in inp.reason
    ev = {e.key: e.value for e in res.evidence}
    assert ev["kineto.rank"] == 1 and ev["kineto.platform"] == "cuda"
    # HTA 0.5.0 on this file: idle 98.16 %, compute 1.84 %, kernel span 1629 µs
    assert ev["kineto.idle_share"] == pytest.approx(0.9816, abs=1e-4)
    assert ev["kineto.kernel_span_ms"] == 1.629


def test_rocm_trace_reads_hip_calls_and_string_streams() -> None:
    trace = kineto.read_trace(kineto.open_decompressed(ROCM))
    assert trace.meta.platform == "rocm" and trace.meta.devices[0] == "AMD Radeon Graphics"
    assert len(trace.gpu.ts) == 16 and len(trace.host.ts) == 21
    bd = derive_kineto.hta_breakdown(trace)
    assert bd is not None
    # HTA 0.5.0: idle 98.53 %, compute 1.08 %, non-compute 0.39 % ("0x0" streams on hip calls are not GPU events)
    assert (round(100 * bd.share(bd.idle_us), 2), round(100 * bd.share(bd.compute_us), 2)) == (98.53, 1.08)


def test_sync_stall_on_a_graph_replay_names_the_blocking_copy() -> None:
    d, ev = _ev(SYNC_STALL)
    assert d.primary is not None and d.primary.value == "pcie_transfer"
    top = d.findings[0]
    assert top.code == "GPU104" and "hipMemcpyWithStream" in top.message
    assert ev["api.graph_launches"] == 1 and ev["kineto.graph_kernel_share"] > 0.95  # type: ignore[operator]
    assert ev["kineto.idle.host_wait_share"] > 0.9  # type: ignore[operator]


def test_gzip_or_plain_and_stdin_read_the_same(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "trace.json"
    plain.write_bytes(gzip.decompress(_bytes(SYNC_STALL)))
    a = {e.key: e.value for e in loose.analyze_path(SYNC_STALL).evidence}
    b = {e.key: e.value for e in loose.analyze_path(str(plain)).evidence}
    assert a == b
    stream = io.BufferedReader(io.BytesIO(_bytes(SYNC_STALL)))  # type: ignore[arg-type]
    c = {e.key: e.value for e in loose.analyze_stream("<stdin>", stream).evidence}
    assert c == a


def test_small_chunks_cut_everywhere_and_read_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = kineto.read_trace(kineto.open_decompressed(SYNC_STALL))
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 4096)
    small = kineto.read_trace(kineto.open_decompressed(SYNC_STALL))
    assert small.events == whole.events and small.names == whole.names
    assert (small.gpu.ts == whole.gpu.ts).all() and (small.host.corr == whole.host.corr).all()


def test_a_cut_inside_a_string_falls_back_to_the_exact_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    text = gzip.decompress(_bytes(ROCM)).decode()
    doc = json.loads(text)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
    kernels[0]["name"] = 'kernel<{"a"}, {"b"}>},{' * 200  # boundary look-alikes inside a string
    data = json.dumps(doc).encode()
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 2048)
    trace = kineto.read_trace(io.BytesIO(data))
    assert trace.problems == () and trace.events == len(doc["traceEvents"])
    assert kernels[0]["name"] in trace.names


def test_a_truncated_trace_is_partial_with_the_reason(tmp_path) -> None:
    data = gzip.decompress(_bytes(SYNC_STALL))
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(gzip.compress(data[: len(data) // 2]))
    res = loose.analyze_path(str(cut))
    (inp,) = res.inputs
    assert inp.kind == "kineto_trace" and inp.status == "partial"
    assert "cut short" in inp.reason or "ends inside" in inp.reason
    ev = {e.key: e.value for e in res.evidence}
    assert ev["kineto.events"] > 500  # what came before the cut was read
    damaged = tmp_path / "damaged.json.gz"  # the gzip stream itself cut short
    damaged.write_bytes(_bytes(SYNC_STALL)[:20_000])
    (inp2,) = loose.analyze_path(str(damaged)).inputs
    assert inp2.status in ("partial", "unreadable") and inp2.reason


def test_a_json_object_that_is_not_a_trace_is_not_taken_for_one(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "config.json"
    other.write_text('{"model": "llama", "max_batch": 8}\n')
    rc = cli.main(["analyze", str(other), "--format", "json"])
    assert rc == 0
    (inp,) = json.loads(capsys.readouterr().out)["inputs"]
    assert inp["kind"] != "kineto_trace"
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": 7}')
    (inp,) = loose.analyze_path(str(bad)).inputs
    assert inp.status == "unreadable" and "not a list" in inp.reason


@pytest.mark.parametrize("collector", ["log", "kineto"])
def test_a_trace_inside_a_session_is_read(tmp_path, collector: str) -> None:
    from tests.sessions import add_file, demo_copy  # a recorded demo session, plus the trace

    folder = demo_copy(tmp_path)
    add_file(folder, "trace.pt.trace.json.gz", _bytes(SYNC_STALL), collector=collector)
    d = pipeline.analyze([folder])
    assert any(i.kind == "kineto_trace" and i.path.endswith("trace.pt.trace.json.gz") for i in d.inputs)
    assert "GPU104" in [f.code for f in d.findings]


def test_the_local_copies_are_the_shared_files() -> None:
    pairs = {"old_schema_inference_rank_1.json.gz": "trace_file_list__inference_rank_1",
             "rocm_mi250_minitoy_train.json.gz": "amd_trace__mi250",
             "sync_stall_sglang_decode_hipgraph_mi300x.json.gz": "sglang_decode__sglang_Qwen3-8B_decode"}
    with open(os.path.join(LOCAL, "SOURCES.md"), encoding="utf-8") as fh:
        sources = fh.read()
    for local, key in pairs.items():
        assert local in sources and key in sources
        shared = [p for p in TRACES if key in p]
        if shared:
            with open(shared[0], "rb") as a, open(os.path.join(LOCAL, local), "rb") as b:
                assert a.read() == b.read()


# -- recognised by structure, on stdin too; a trace imports no text parser ------------------------


class _Trickle(io.RawIOBase):
    """A pipe whose writer is slow: each read returns at most ``step`` bytes."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.pos, self.step = data, 0, step

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def, override]
        n = min(len(buffer), self.step, len(self.data) - self.pos)
        buffer[:n] = self.data[self.pos:self.pos + n]
        self.pos += n
        return n


def _with_metadata(path: str, kib: int) -> bytes:
    """The trace with a ``metadata`` object of ``kib`` KiB written before its events, as the TraceLens
    benchmark harness writes one (its run environment: profiler settings, versions, env)."""
    doc = json.loads(gzip.decompress(_bytes(path)))
    env = {f"VAR_{i:05d}": "x" * 40 for i in range(kib * 1024 // 52)}
    return json.dumps({"metadata": {"profiler": {"record_shapes": True}, "system": {"env": env}}, **doc}).encode()


@pytest.mark.parametrize("step", [65536, 300])
def test_a_metadata_block_beyond_the_peek_is_still_a_trace_on_stdin(step: int) -> None:
    data = _with_metadata(SYNC_STALL, 64)
    assert data.index(b'"traceEvents"') > 64 * 1024  # far past what a buffered stdin shows at once
    assert derive_kineto.kineto.trace_head(data[:8192]) is None  # undecided: more of it decides
    whole = {e.key: e.value for e in loose.analyze_path(SYNC_STALL).evidence}
    for payload in (data, gzip.compress(data)):
        stream = io.BufferedReader(_Trickle(payload, step))  # type: ignore[arg-type]
        res = loose.analyze_stream("<stdin>", stream)
        (inp,) = res.inputs
        assert inp.kind == "kineto_trace" and inp.status == "ok"
        assert {e.key: e.value for e in res.evidence} == whole


def test_a_file_with_megabytes_of_metadata_first_is_a_trace(tmp_path) -> None:
    data = _with_metadata(SYNC_STALL, 2048)  # past the 1 MiB head files were sniffed by; read on, to 16 MiB
    whole = {e.key: e.value for e in loose.analyze_path(SYNC_STALL).evidence}
    for name, payload in (("plain.json", data), ("packed.json.gz", gzip.compress(data))):
        path = tmp_path / name
        path.write_bytes(payload)
        res = loose.analyze_path(str(path))
        assert [(i.kind, i.status) for i in res.inputs] == [("kineto_trace", "ok")]
        assert {e.key: e.value for e in res.evidence} == whole


@needs_shared
def test_the_tracelens_traces_with_metadata_first_are_read_on_stdin(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    for path in (p for p in TRACES if "Qwen_Qwen1.5-0.5B-Chat" in p):  # a 23-26 KiB metadata object first
        assert derive_kineto.kineto.trace_head(gzip.decompress(_bytes(path))[:8192]) is None
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(_bytes(path)))))
        assert cli.main(["analyze", "-", "--format", "json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["inputs"][0]["kind"] == "kineto_trace" and doc["verdict"] == "healthy"


def test_json_that_is_not_a_trace_object_is_decided_early() -> None:
    head = kineto.trace_head
    assert head(b'{"ts": 1.5, "stages_ms": {"queue": 3}}\n{"ts": 2.0') is False  # a stage-timing JSONL log
    assert head(b'{"model": "llama", "max_batch": 8}') is False
    assert head(b"INFO 12-01 engine started") is False
    assert head(b'{"metadata": {"a": [1, 2') is None and head(b'{"metadata": {}, "traceEv') is None
    assert head(b'{"metadata": {}, "traceEvents": [') is True and head(b'\xef\xbb\xbf {"schemaVersion": 1') is True


