"""The loose-evidence reader: head to every source, the tail by trigger, compressed streams."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import random
import sys
from pathlib import Path

import pytest

from diagnose import loose
from diagnose.collectors import engine_log
from diagnose.collectors.logtext import clean_lines

DATA = Path(__file__).resolve().parents[1] / "data"
TEXT_FIXTURES = sorted(
    p for d in ("logs", "compile_logs", "oom", "metrics", "nvsmi", "timing", "bench", "nsys_stats")
    for p in (DATA / d).iterdir() if p.suffix in (".txt", ".md", ".jsonl")
    or (d == "nvsmi" and p.suffix in (".xml", ".csv", ".log"))  # real nvidia-smi captures keep their names
)


def _values(result: loose.LooseResult) -> dict[str, object]:
    return {e.key: e.value for e in result.evidence}


def _first(result: loose.LooseResult) -> dict[str, object]:
    """Each key's first value: the one a session's evidence keeps (``EvidenceSet.add``)."""
    out: dict[str, object] = {}
    for e in result.evidence:
        out.setdefault(e.key, e.value)
    return out


def _stream(data: bytes) -> io.BufferedReader:
    return io.BufferedReader(io.BytesIO(data))  # type: ignore[arg-type]


def _close(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))  # sums in another order
    return a == b


@pytest.mark.parametrize("path", TEXT_FIXTURES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_prefilter_never_changes_what_a_trigger_source_derives(path: Path) -> None:
    """Read as a big log's tail (no head at all), every source with triggers derives exactly what it
    derives when it is offered every line: the trigger lists cover what the parsers read."""
    _assert_tail_reads_like_every_line(path.read_bytes())


ENGINE_LOGS = sorted([*(DATA / "engines" / "vllm").glob("*/vllm.log"),
                      *(DATA / "engines" / "llamacpp").glob("*/server.log")])


@pytest.mark.parametrize("path", ENGINE_LOGS, ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_a_tail_read_in_small_blocks_derives_what_every_line_does(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real engine logs (vLLM's stats lines, llama.cpp's access lines and timing blocks) read as a tail
    of 4 KiB blocks, scanned a block ahead in the reader's thread and handed to the sources in bulk,
    with a non-ASCII line in the middle (its block goes the line-by-line way): the same evidence."""
    monkeypatch.setattr(loose, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(loose, "CARRY_BYTES", 2048)
    data = path.read_bytes()
    mid = data.index(b"\n", len(data) // 2) + 1
    _assert_tail_reads_like_every_line(data[:mid] + "réponse tronquée\n".encode() + data[mid:])


def _assert_tail_reads_like_every_line(data: bytes) -> None:
    tail_sources = loose.new_sources()
    loose.read_into(tail_sources, _stream(data), head_bytes=0)
    for tail_src, full_src in zip(tail_sources, loose.new_sources(), strict=True):
        if not getattr(tail_src, "triggers", ()):
            continue  # head-only sources: tables and prose are read from the head
        for line in clean_lines(data.decode("utf-8", "replace").splitlines()):
            full_src.feed(line)
        full = {e.key: e.value for e in full_src.evidence("x")} if full_src.matched() else {}
        tail = {e.key: e.value for e in tail_src.evidence("x")} if tail_src.matched() else {}
        if getattr(tail_src, "free_text", False):
            # tables and prose in the head, one machine format (its triggers) anywhere: past the head
            # it derives part of what it derives from the whole, never something else
            assert tail.keys() <= full.keys(), f"{tail_src.kind}: {sorted(tail.keys() - full.keys())}"
        else:
            assert full.keys() == tail.keys(), f"{tail_src.kind}: {sorted(full.keys() ^ tail.keys())}"
        assert all(_close(full[k], tail[k]) for k in tail), tail_src.kind


def _big_log(tmp_path: Path, tail: str, filler_mb: float = 3.0) -> Path:
    """Real-format vLLM request lines (no parser wants them) and then ``tail``."""
    filler = ('INFO:     172.18.0.1:{p} - "POST /v1/completions HTTP/1.1" 200 OK\n'
              "INFO 03-18 12:34:52 async_llm_engine.py:120] Finished request cmpl-{i:032x}.\n")
    lines, size, i = [], 0, 0
    while size < filler_mb * 1e6:
        i += 1
        s = filler.format(p=40000 + i % 20000, i=i)
        lines.append(s)
        size += len(s)
    path = tmp_path / "service.log"
    path.write_text("".join(lines) + tail, encoding="utf-8")
    return path


OOM_AT_THE_END = """\
ERROR 10-11 12:27:29 engine.py:157] Traceback (most recent call last):
ERROR 10-11 12:27:29 engine.py:157]   File "/opt/vllm/vllm/engine/multiprocessing/engine.py", line 155, in start
ERROR 10-11 12:27:29 engine.py:157]     self.run_engine_loop()
ERROR 10-11 12:27:29 engine.py:157]   File "/opt/vllm/vllm/worker/model_runner.py", line 1450, in execute_model
ERROR 10-11 12:27:29 engine.py:157]     hidden_or_intermediate_states = model_executable(
ERROR 10-11 12:27:29 engine.py:157] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 138.00 MiB. \
GPU 0 has a total capacity of 79.15 GiB of which 2.19 MiB is free. Including non-PyTorch memory, this process has \
79.12 GiB memory in use. Of the allocated memory 71.57 GiB is allocated by PyTorch, and 611.60 MiB is reserved by \
PyTorch but unallocated.
"""


def test_an_oom_at_the_end_of_a_big_log_is_found_with_its_traceback(tmp_path: Path) -> None:
    path = _big_log(tmp_path, OOM_AT_THE_END)
    got = _values(loose.analyze_path(str(path)))
    assert got["mem.oom_count"] == 1
    assert got["mem.requested_bytes"] == 138 * 2**20
    assert got["mem.oom_phase"] == "serving"  # the frames above the message came as its context


def test_context_lines_cross_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 4 KiB: the traceback above the message and the result rows below a benchmark title
    straddle chunk boundaries and still arrive."""
    monkeypatch.setattr(loose, "CHUNK_BYTES", 4096)
    monkeypatch.setattr(loose, "CARRY_BYTES", 2048)
    bench = ("============ Serving Benchmark Result ============\n"
             "Successful requests:                     1000\n"
             "Benchmark duration (s):                  97.41\n"
             "Request throughput (req/s):              10.27\n"
             "Mean TTFT (ms):                          2143.11\n"
             "P99 TTFT (ms):                           9876.54\n"
             "==================================================\n")
    path = _big_log(tmp_path, OOM_AT_THE_END + bench, filler_mb=0.7)
    got = _values(loose.analyze_path(str(path)))
    assert got["mem.oom_phase"] == "serving" and got["mem.requested_bytes"] == 138 * 2**20
    assert got["throughput.rps"] == pytest.approx(10.27)
    assert got["latency.ttft_ms.p99"] == pytest.approx(9876.54)


STATS = [
    "INFO 03-18 12:34:{s:02d} llm_engine.py:706] Avg prompt throughput: {a:.1f} tokens/s, Avg generation "
    "throughput: {b:.1f} tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: "
    "{kv:.1f}%, CPU KV cache usage: 0.0%",
    "vllm-1  | (APIServer pid=7) INFO 06-02 10:01:{s:02d} [loggers.py:111] Engine 000: Avg prompt throughput: "
    "{a:.1f} tokens/s, Avg generation throughput: {b:.1f} tokens/s, Running: {r} reqs, Waiting: {w} reqs, "
    "GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: {h:.1f}%",
    "INFO 05-01 10:00:{s:02d} metrics.py:341] Avg prompt throughput: {a:.1f} tokens/s, Avg generation throughput: "
    "{b:.1f} tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: {kv:.1f}%, CPU KV "
    "cache usage: 0.0%, Prefix cache hit rate: GPU: {h:.2f}%, CPU: 0.00%",
    "INFO 05-01 10:00:{s:02d} x.py:1] a request line that is not a stats line",
    "WARNING 03-18 12:35:{s:02d} scheduler.py:1089] Sequence group {r} is preempted by PreemptionMode.RECOMPUTE "
    "mode because there is not enough KV cache space. total_num_cumulative_preemption={w}",
]


def _read_both(lines: list[str], block: int) -> tuple[engine_log.EngineLogSummary, engine_log.EngineLogSummary,
                                                      engine_log.EngineLogParser]:
    """The summaries of ``lines`` read one by one and in bulk (``block`` lines at a time), and the bulk reader."""
    one, bulk = engine_log.EngineLogParser(), engine_log.EngineLogParser()
    for line in clean_lines(lines):
        one.feed(line)
    for k in range(0, len(lines), block):
        bulk.feed_raw(lines[k:k + block])
    return one.summary(), bulk.summary(), bulk


def test_bulk_stats_reading_equals_line_by_line() -> None:
    rng = random.Random(7)
    lines = [rng.choice(STATS).format(s=i % 60, a=rng.uniform(0, 9000), b=rng.uniform(0, 3000),
                                      r=rng.randrange(0, 300), w=rng.choice([0, 0, rng.randrange(1, 90)]),
                                      kv=rng.uniform(0, 100), h=rng.uniform(0, 100)) for i in range(3000)]
    a, b, _ = _read_both(lines, 700)
    assert a.samples == b.samples > 1500 and a.queued_samples == b.queued_samples
    assert a.preemptions == b.preemptions
    for name in ("running", "waiting", "swapped", "kv_usage", "prompt_tps", "gen_tps", "prefix_hit",
                 "running_when_queued", "kv_when_queued", "kv_free_seqs_when_queued"):
        sa, sb = getattr(a, name), getattr(b, name)
        assert sa.count == sb.count, name
        assert _close(sa.total, sb.total) and sa.max == sb.max, name
        if not name.endswith("_when_queued"):  # the last value read (waiting_last, the prefix hit rate)
            assert sa.last == sb.last, name


def _same_as_line_by_line(lines: list[str], block: int) -> engine_log.EngineLogSummary:
    a, b, _ = _read_both(lines, block)
    assert a.samples == b.samples and a.queued_samples == b.queued_samples
    for name in ("running", "waiting", "kv_usage", "prompt_tps", "gen_tps", "prefix_hit", "running_when_queued"):
        sa, sb = getattr(a, name), getattr(b, name)
        assert sa.count == sb.count, name
        assert _close(sa.total, sb.total) and sa.max == sb.max, name
    return a


def test_lines_that_share_a_digit_free_shape_but_not_their_tokens_are_read_exactly() -> None:
    """The bulk reader keys a line by its digits removed: a prefix with a number where another line
    has only a double space, an anchor glued to the token before it, each line's count of tokens
    checked (two prefixes whose errors would cancel in a block's total), a value left empty (its
    line keys as the others do, and must neither be read one token off nor unlearn the field)."""
    base = ("{pre}INFO 06-02 10:01:{s:02d}{pid}[loggers.py:111]{sep}Engine 000: Avg prompt throughput: {a:.1f} "
            "tokens/s, Avg generation throughput: 2.0 tokens/s, Running: {r} reqs, Waiting: {w} reqs, GPU KV cache "
            "usage: {kv}%, Prefix cache hit rate: {h}%, MM cache hit rate: 0.0%")
    rng = random.Random(11)

    def line(i: int, pre: str, pid: str, h: str = "5.0") -> str:
        return base.format(pre=pre, s=i % 60, pid=pid, sep=rng.choice([" ", " ", ""]), a=rng.uniform(0, 900),
                           r=rng.randrange(1, 300), w=rng.randrange(0, 9), kv=rng.choice(["41.5", "63.0"]), h=h)

    # the shorter of two colliding prefixes seen first, then the longer: read one token off if trusted
    lines = [line(i, "", (" ", " 7 ", "")[i % 3]) for i in range(600)]
    assert _same_as_line_by_line(lines, 200).samples == 600
    # two prefixes, each with the other's collision, in one block: a block's total count would balance
    lines = ([line(i, "", " 7 ") for i in range(16)] + [line(i, "vllm-1  | ", "  ") for i in range(16, 32)]
             + [line(i, "", "  ") for i in range(32, 48)] + [line(i, "vllm-1  | ", " 7 ") for i in range(48, 64)])
    assert _same_as_line_by_line(lines, 32).samples == 64
    # a value left empty, then the lines go on as before
    lines = [line(i, "", " ") for i in range(40)] + [line(40, "", " ", h="")] + [line(i, "", " ") for i in range(63)]
    assert _same_as_line_by_line(lines, 32).prefix_hit.count == 103


def test_a_record_glued_before_a_stats_line_is_read_in_bulk_as_line_by_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A preemption warning or a progress bar glued before a stats record on one physical line: the
    bulk reader keeps the stats record and reads the records before it too (it once dropped them, so
    the preemptions glued before stats lines went uncounted), while container and process prefixes
    before a stats line keep the line on the fast path."""
    monkeypatch.setattr(engine_log, "_LAYOUTS", {})  # other tests' layouts may have filled the table
    rng = random.Random(5)
    stats = ("INFO 03-18 12:34:{s:02d} llm_engine.py:706] Avg prompt throughput: {a:.1f} tokens/s, Avg generation "
             "throughput: 9.0 tokens/s, Running: {r} reqs, Swapped: 0 reqs, Pending: {w} reqs, GPU KV cache usage: "
             "99.0%, CPU KV cache usage: 0.0%")
    warn = ("WARNING 03-18 12:34:{s:02d} scheduler.py:1089] Sequence group {r} is preempted by "
            "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. "
            "total_num_cumulative_preemption={n}")
    lines: list[str] = []
    for i in range(400):
        line = stats.format(s=i % 60, a=rng.uniform(0, 900), r=rng.randrange(1, 9), w=rng.randrange(1, 40))
        if i % 4 == 1:  # glued straight after the warning's last digit, as a lost newline leaves it
            line = warn.format(s=i % 60, r=i, n=i) + line
        elif i % 4 == 2:
            line = f"Processed prompts:  {i % 100}%|███   | {i}/400 [00:{i % 60:02d}<00:07] " + line
        elif i % 4 == 3:  # prefixes clean_lines strips: not records of their own
            line = (f"vllm-1  | (APIServer pid={i}) ", f"2024-03-18T12:34:{i % 60:02d}.123456789Z ",
                    f"Mar 18 12:34:{i % 60:02d} host vllm[{i}]: ", f"[rank{i % 8}]: ")[i % 16 // 4] + line
        lines.append(line)
    a, b, bulk = _read_both(lines, 100)
    assert a.samples == b.samples == 400 and a.queued_samples == b.queued_samples == 400
    assert a.preemptions == b.preemptions == 397  # the last warning's cumulative count
    assert len(bulk._shapes) == 5  # the plain and the four prefixed shapes in bulk; the glued ones one by one
    for name in ("running", "waiting", "kv_usage", "prompt_tps"):
        sa, sb = getattr(a, name), getattr(b, name)
        assert sa.count == sb.count and _close(sa.total, sb.total) and sa.max == sb.max, name
    prefixed = stats.format(s=1, a=1.0, r=2, w=3)
    engine_log.vllm_fields(prefixed)  # learns the layout
    assert engine_log._shape_of("vllm-1  | (APIServer pid=7) " + prefixed) is not None
    assert engine_log._shape_of(warn.format(s=1, r=1, n=1) + prefixed) is None


def test_a_line_that_does_not_read_as_its_layout_gives_no_shape() -> None:
    """A value left empty keys as its layout's lines do; its shape would put every field one token off
    (and every later line of the key on the slow path), so it has none and is read the general way."""
    line = ("INFO 09-27 22:18:00 metrics.py:341] Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: "
            "2.0 tokens/s, Running: 5 reqs, Swapped: 0 reqs, Pending: 0 reqs, GPU KV cache usage: 50.0%, CPU KV "
            "cache usage: 0.0%, Prefix cache hit rate: GPU: {h}%, CPU: 0.00%")
    assert engine_log.vllm_fields(line.format(h="40.0"))["prefix_pct"] == 40.0  # learns the layout
    shape = engine_log._shape_of(line.format(h="40.0"))
    assert shape is not None and len(shape.idx) == len(shape.layout.names)
    assert engine_log._shape_of(line.format(h="")) is None


def test_a_stats_line_of_a_new_shape_is_learned_from_its_own_fields() -> None:
    line = ("INFO 11-02 09:00:00 [loggers.py:123] Engine 001: Running: 7 reqs, Waiting: 2 reqs, "
            "GPU KV cache usage: 88.5%")
    assert engine_log.vllm_fields(line) == {"running": 7.0, "waiting": 2.0, "kv_pct": 88.5}
    assert engine_log.vllm_fields(line.replace("7 reqs", "9 reqs")) == {"running": 9.0, "waiting": 2.0, "kv_pct": 88.5}
    assert engine_log.vllm_fields("Running: the tests") is None


PLAIN = (DATA / "logs" / "vllm_v0_pending_kv_cache_full.txt").read_bytes()


@pytest.mark.parametrize("compress", [gzip.compress, bz2.compress, lzma.compress], ids=["gzip", "bzip2", "xz"])
def test_rotated_logs_are_read_compressed_from_files_and_stdin(tmp_path: Path, compress) -> None:  # type: ignore[no-untyped-def]
    expected = _values(loose.analyze_stream("plain", _stream(PLAIN)))
    packed = compress(PLAIN)
    path = tmp_path / "service.log.1"
    path.write_bytes(packed)
    assert _values(loose.analyze_path(str(path))) == expected
    res = loose.analyze_stream("<stdin>", _stream(packed))
    assert _values(res) == expected and res.inputs[0].status == "ok"


def test_zstd_is_read_when_zstandard_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    zstandard = pytest.importorskip("zstandard")  # a dev dependency: present in CI
    packed = zstandard.ZstdCompressor().compress(PLAIN)
    assert _values(loose.analyze_stream("x.zst", _stream(packed))) == _values(loose.analyze_stream("p", _stream(PLAIN)))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # as on a machine without it
    rec = loose.analyze_stream("x.zst", _stream(packed)).inputs[0]
    assert rec.status == "unreadable" and "pip install zstandard" in rec.reason


def test_a_damaged_gzip_is_read_up_to_the_damage(tmp_path: Path) -> None:
    lines = "\n".join(STATS[0].format(s=i % 60, a=1.0, b=2.0, r=i % 50, w=i % 7, kv=50.0, h=1.0)
                      for i in range(8000))
    packed = gzip.compress(lines.encode())
    res = loose.analyze_stream("cut.gz", _stream(packed[: len(packed) // 2]))
    assert res.inputs[0].status == "partial" and "damaged or cut short" in res.inputs[0].reason
    assert _values(res)["serving.stat_samples"] > 0
    # gzip's magic then junk: a header that does not parse, and one that parses before a deflate stream that
    # does not (zlib.error at the first read, seen in CI with random junk: a traceback, not a record)
    header = bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 0, 0xFF])
    for bad in (b"\x1f\x8b" + bytes(200), header + b"\xff" * 200,
                *(b"\x1f\x8b" + random.Random(seed).randbytes(200) for seed in range(50))):
        junk = loose.analyze_stream("junk.gz", _stream(bad))
        assert junk.inputs[0].status == "unreadable" and junk.evidence == [], junk.inputs[0]
    assert "invalid block type" in loose.analyze_stream("junk.gz", _stream(header + b"\xff" * 200)).inputs[0].reason
    # damage in the middle of the deflate data: read up to it, then partial with the reason, not a traceback
    hurt = bytearray(packed)
    hurt[len(hurt) // 2: len(hurt) // 2 + 64] = bytes(64)
    res = loose.analyze_stream("hurt.gz", _stream(bytes(hurt)))
    assert res.inputs[0].status == "partial" and "damaged or cut short" in res.inputs[0].reason
    assert 0 < _values(res)["serving.stat_samples"] < 8000


def test_llama_access_lines_read_raw_count_as_the_cleaned_lines_do() -> None:
    """llama-cpp-python's access lines skip the cleaning in ``feed_raw`` only when that cannot change
    what they say: prefixed ones count, a line holding a second record (glued after a carriage
    return or a log level) is split first, and a timing block between arrivals keeps its place."""
    from diagnose.collectors.llamacpp import LlamaTimingParser

    access = 'INFO:     127.0.0.1:{p} - "POST /v1/completions HTTP/1.1" 200 OK'
    timing = ["llama_perf_context_print: prompt eval time =      12.50 ms /    40 tokens",
              "llama_perf_context_print:        eval time =     310.00 ms /    31 runs",
              "llama_perf_context_print:       total time =     330.00 ms /    71 tokens"]
    lines = [access.format(p=40000 + i) for i in range(5)]
    lines += ["llama-1  | " + access.format(p=1), access.format(p=2) + "\r" + timing[0], *timing[1:],
              access.format(p=3) + " INFO 03-18 12:34:52 x.py:1] Disconnected from client", *timing,
              'INFO:     127.0.0.1:9 - "POST /v1/embeddings HTTP/1.1" 200 OK']
    one, raw = LlamaTimingParser(), LlamaTimingParser()
    for line in clean_lines(lines):
        one.feed(line)
    raw.feed_raw(lines)
    a, b = one.result(), raw.result()
    assert a.arrivals == b.arrivals == 8
    assert a.disconnects == b.disconnects == 1
    assert a.in_flight == b.in_flight and len(a.generations) == len(b.generations) == 2


def test_a_series_folds_an_array_as_it_folds_the_values_one_by_one() -> None:
    import numpy as np

    values = [3.0, float("nan"), -1.5, float("inf"), 7.25, 0.0]
    one, bulk = engine_log.Series(), engine_log.Series()
    one.add(2.0)
    bulk.add(2.0)
    for v in values:
        one.add(v)
    bulk.add_array(np.array(values))
    for attr in ("count", "total", "low", "high", "first", "last"):
        assert getattr(one, attr) == getattr(bulk, attr), attr
    assert bulk.count == 5 and bulk.last == 0.0 and bulk.high == 7.25


# Real scrapes of Prometheus endpoints: engines' /metrics (vLLM, llama.cpp, SGLang, TGI, Triton), DCGM exporters,
# the windows and the watcher's ring that diagnose recorded on the engine lab's vLLM.
SCRAPES = sorted({*DATA.rglob("*.prom"), *(DATA / "engines").rglob("metrics.txt"),
                  *(p for p in (DATA / "metrics").iterdir() if p.suffix == ".txt")})


def test_the_exposition_sources_alone_find_everything_in_a_real_scrape() -> None:
    """A session's scrapes are read by the Prometheus and DCGM sources alone (``loose.EXPOSITION_MODULES``):
    on every real scrape here the other sources add nothing, so nothing is lost by not running them."""
    assert len(SCRAPES) >= 20
    for path in SCRAPES:
        every = loose.analyze_path(str(path))
        own = loose.analyze_path(str(path), modules=loose.EXPOSITION_MODULES)
        assert own.evidence and _first(own) == _first(every) and _values(own) == _values(every), path
        assert {r.kind for r in own.inputs} <= {"prometheus", "dcgm", "prometheus+dcgm"}, (path, own.inputs)


def test_prose_in_a_metrics_help_text_is_not_evidence_when_read_as_a_scrape() -> None:
    """A metric's HELP is text its author wrote once, not something that happened: an application counting its
    OOMs describes one there. Every source reads it as an OOM message; as a scrape it is a comment."""
    text = (b"# HELP app_oom_total Requests that failed with torch.OutOfMemoryError: CUDA out of memory. Tried to "
            b"allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.20 GiB is free.\n"
            b"# TYPE app_oom_total counter\napp_oom_total 3\n")
    assert "mem.oom_count" in _values(loose.read_text("m", _stream(text)))
    scrape = loose.read_text("metrics-0.prom", _stream(text), modules=loose.EXPOSITION_MODULES)
    assert not scrape.evidence and scrape.inputs[0].status == "unreadable"


def test_a_scrape_names_the_gpu_and_the_model_by_its_labels() -> None:
    """What the prose reader found in a scrape's labels, the exposition sources read from the labels themselves:
    DCGM's ``modelName`` (the GPU and the memory it is sold with), an engine's ``model_name`` (the parameters)."""
    dcgm = _values(loose.analyze_path(str(DATA / "dcgm" / "l4_idle_full_default_scrape_kops.prom"),
                                      modules=loose.EXPOSITION_MODULES))
    assert dcgm["gpu.name"] == "L4" and dcgm["gpu.spec_memory_bytes"] == 24 << 30
    sglang = loose.analyze_path(str(DATA / "metrics" / "sglang_single_scrape_queue.txt"),
                                modules=loose.EXPOSITION_MODULES)
    params = next(e for e in sglang.evidence if e.key == "model.params")
    assert params.value == 7e9 and "model_name label" in params.detail
    assert _values(sglang)["mem.weights_estimate_bytes"] == 14e9  # 16-bit: the name states no dtype
    lab = _values(loose.analyze_path(str(DATA / "engines" / "vllm" / "healthy" / "metrics.txt"),
                                     modules=loose.EXPOSITION_MODULES))
    assert "model.params" not in lab  # the engine lab serves its model as "lab": a name without a size


def _dcgm(*gpus: tuple[str, int]) -> bytes:
    """One scrape of dcgm-exporter's default fields for GPUs (modelName, framebuffer MiB), as it prints them."""
    out = []
    for i, (model, fb_mib) in enumerate(gpus):
        labels = f'gpu="{i}",UUID="GPU-{i:08d}",device="nvidia{i}",modelName="{model}",Hostname="node-1"'
        out += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} 50", f"DCGM_FI_DEV_FB_USED{{{labels}}} 1024",
                f"DCGM_FI_DEV_FB_FREE{{{labels}}} {fb_mib - 1024}"]
    return ("\n".join(out) + "\n").encode()


@pytest.mark.parametrize(("gpus", "name", "spec_gib"), [
    ((("NVIDIA A100-SXM4-80GB", 81920),), "A100", 80),  # the size in the name
    ((("NVIDIA A100-PCIE", 40960),), "A100", 40),  # sold as 40 or 80 GB: the one nearest the measured total
    ((("NVIDIA H100 NVL", 95830),), "H100", 94),
    ((("NVIDIA A100-SXM4-40GB", 40960), ("NVIDIA H100 80GB HBM3", 81920)), "A100", None),  # which one? none
])
def test_dcgm_names_the_gpu_of_its_focus_device_and_its_memory_only_when_one_size(
        gpus: tuple[tuple[str, int], ...], name: str, spec_gib: int | None) -> None:
    got = _first(loose.read_text("dcgm.prom", _stream(_dcgm(*gpus)), modules=loose.EXPOSITION_MODULES))
    assert got["gpu.name"] == name
    assert got.get("gpu.spec_memory_bytes") == (spec_gib << 30 if spec_gib else None)


def test_lines_of_one_layout_under_two_container_prefixes_are_read_as_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two replicas' lines (``vllm-a  |``, ``vllm-b  |``) differ only in a prefix: one shape, one run in line
    order, so the series' first and last values, and its percentages divided as line by line, are exact."""
    monkeypatch.setattr(engine_log, "_LAYOUTS", {})  # other tests' layouts may have filled the table
    rng = random.Random(11)
    layout = ("{c}  | INFO 11-02 09:00:{s:02d} [loggers.py:123] Engine 000: Running: {r} reqs, Waiting: {w} reqs, "
              "GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: {h:.1f}%")
    lines = [layout.format(c=rng.choice(["vllm-a", "vllm-b"]), s=i % 60, r=rng.randrange(1, 300),
                           w=rng.randrange(1, 90), kv=rng.uniform(0, 100), h=rng.uniform(0, 100)) for i in range(2400)]
    a, b, bulk = _read_both(lines, 600)
    assert len(bulk._shape_ids) == 2 and len(bulk._shape_list) == 1  # two keys, one shape
    for name in ("running", "waiting", "kv_usage", "prefix_hit", "running_when_queued", "kv_when_queued"):
        sa, sb = getattr(a, name), getattr(b, name)
        assert (sa.count, sa.first, sa.last, sa.high, sa.low) == (sb.count, sb.first, sb.last, sb.high, sb.low), name
        assert _close(sa.total, sb.total), name


def test_stats_lines_after_a_benchmarks_title_in_one_block_are_read_as_its_rows() -> None:
    """A benchmark's result block inside a block of the tail: line by line its rows follow its title, and the
    bulk reader reads that block the same way (it counted the stats lines among them as samples before)."""
    stats = ("INFO 11-02 09:00:{s:02d} [loggers.py:123] Engine 000: Running: {r} reqs, Waiting: 2 reqs, "
             "GPU KV cache usage: 5.0%")
    lines = [stats.format(s=i % 60, r=i) for i in range(400)] + [
        "============ Serving Benchmark Result ============", "Successful requests:                     1000",
        *(stats.format(s=i, r=i) for i in range(35)), "Mean TTFT (ms):                          12.5",
        "=================================================="]
    a, b, _ = _read_both(lines, len(lines))  # one block holding all of it
    assert a.samples == b.samples and a.benchmark == b.benchmark


def test_another_engines_stats_lines_among_vllms_are_read_in_line_order_in_bulk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's scheduler lines in the same log as vLLM's stats lines (two engines behind one collector): both
    add to the same series, so the bulk reader keeps them in line order (it fed them after the block's vLLM lines
    before), and records both engines whichever came first (a vLLM line read by its learned layout after
    SGLang's did not record vLLM)."""
    monkeypatch.setattr(engine_log, "_LAYOUTS", {})  # other tests' layouts may have filled the table
    rng = random.Random(5)
    vllm = ("INFO 11-02 09:00:{s:02d} [loggers.py:123] Engine 000: Running: {r} reqs, Waiting: {w} reqs, "
            "GPU KV cache usage: {kv:.1f}%, Prefix cache hit rate: {h:.1f}%")
    sglang = ("[2026-11-02 09:00:{s:02d} TP0] Decode batch. #running-req: {r}, #token: 3709, token usage: 0.{u:02d}, "
              "gen throughput (token/s): 459.01, #queue-req: {w}")
    lines = [sglang.format(s=0, r=7, w=3, u=50)]  # the SGLang lines come first: the vLLM layout is learned after
    for i in range(3000):
        if rng.random() < 0.2:
            lines.append(sglang.format(s=i % 60, r=rng.randrange(1, 300), w=rng.randrange(0, 90),
                                       u=rng.randrange(0, 99)))
        else:
            lines.append(vllm.format(s=i % 60, r=rng.randrange(1, 300), w=rng.randrange(0, 90),
                                     kv=rng.uniform(0, 100), h=rng.uniform(0, 100)))
    lines.append(sglang.format(s=1, r=11, w=19, u=10))
    lines.append(vllm.format(s=1, r=12, w=13, kv=50.0, h=1.0))  # the last line of all is vLLM's, after SGLang's
    lines[1500] = sglang.format(s=2, r=5, w=17, u=20)  # the first block's (1,501 lines) is SGLang's
    engine_log.EngineLogParser().feed(lines[1])  # the vLLM layout learned already (by an earlier log's parser)
    # the first block alone (read the general way: its layouts are new to the parser), then both blocks (the second
    # grouped by its known shapes)
    for part, last in ((lines[:1501], 17), (lines, 13)):
        a, b, _ = _read_both(part, 1502)
        assert set(a.engines) == set(b.engines) == {"vllm", "sglang"}
        assert a.samples == b.samples and a.queued_samples == b.queued_samples
        for name in ("running", "waiting", "kv_usage", "running_when_queued"):
            sa, sb = getattr(a, name), getattr(b, name)
            assert (sa.count, sa.first, sa.last, sa.high, sa.low) == (sb.count, sb.first, sb.last, sb.high,
                                                                      sb.low), name
            assert _close(sa.total, sb.total), name
        assert a.waiting.last == b.waiting.last == last


@pytest.mark.parametrize("esc", ["\x1b", ""], ids=["terminal", "pasted-without-esc"])
def test_a_coloured_log_reads_as_the_plain_one(tmp_path: Path, esc: str) -> None:
    """A log written to a terminal carries colour codes around its level and source (vLLM's and LMDeploy's
    formatters, uvicorn's); pasted into an issue the ESC is often lost and ``[32mINFO[0m`` is left. Either way
    the engine's recorded log (tests/data/engines/vllm/kv_pressure) gives the evidence its plain copy gives."""
    import re

    plain = (Path(DATA) / "engines" / "vllm" / "kv_pressure" / "vllm.log").read_text()
    level = re.compile(r"\b(INFO|WARNING|ERROR|DEBUG)\b( \d\d-\d\d \d\d:\d\d:\d\d)( \[[\w.]+:\d+\])")
    coloured = level.sub(lambda m: f"{esc}[32m{m[1]}{esc}[0m{m[2]}{esc}[90m{m[3]}{esc}[0m", plain)
    assert coloured != plain and coloured.count("[32m") > 10
    (tmp_path / "plain.log").write_text(plain)
    (tmp_path / "coloured.log").write_text(coloured)
    want = _values(loose.analyze_path(str(tmp_path / "plain.log")))
    assert want["serving.engine"] == "vllm" and want["serving.kv_cache_usage_max_ratio"] > 0.9
    assert _values(loose.analyze_path(str(tmp_path / "coloured.log"))) == want
