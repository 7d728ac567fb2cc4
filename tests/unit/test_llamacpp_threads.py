"""ggml's start-up system info line (llama.cpp, ollama's runner, whisper.cpp): compute threads against the host's
logical CPUs (THR003)."""

from __future__ import annotations

import io

from diagnose import loose
from diagnose.collectors.llamacpp import LlamaTimingParser
from diagnose.model import Confidence, EvidenceSet, Finding
from diagnose.rules.engine import run_rules

X86 = "| AVX = 1 | AVX2 = 1 | AVX512 = 0 | FMA = 1 | NEON = 0 | F16C = 1 | BLAS = 0 | SSE3 = 1 | VSX = 0 |"
ARM = "| AVX = 0 | AVX2 = 0 | AVX512 = 0 | FMA = 0 | NEON = 1 | ARM_FMA = 1 | F16C = 0 | BLAS = 0 | SSE3 = 0 |"


def _threads(*lines: str) -> tuple[list[tuple[int, int | None, int]], bool]:
    p = LlamaTimingParser()
    for line in lines:
        p.feed(line)
    r = p.result()
    return r.threads, r.build_gpu


def test_every_form_of_the_system_info_line() -> None:
    # llama.cpp 2023 (llama.cpp#932), common's line with the batch threads (2023-10 on), llama-server's own line,
    # the server's older key=value record (as ollama's runner printed it) and its JSON record
    assert _threads(f"system_info: n_threads = 16 / 16 {X86}") == ([(16, None, 16)], False)
    assert _threads("system_info: n_threads = 24 (n_threads_batch = 24) / 48 | CUDA : ARCHS = 610 | USE_GRAPHS = 1 "
                    "| CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 |") == ([(24, 24, 48)], True)
    assert _threads("system info: n_threads = 16, n_threads_batch = 16, total_threads = 32") == ([(16, 16, 32)],
                                                                                              False)
    assert _threads('INFO [main] system info | n_threads=6 n_threads_batch=-1 system_info="AVX = 1 | AVX2 = 1 | '
                    'NEON = 0 | SSE3 = 1 | " tid="128087718434688" timestamp=1721794640 total_threads=6') == (
        [(6, None, 6)], False)
    assert _threads('{"tid":"1","timestamp":1700000000,"level":"INFO","function":"main","line":2900,'
                    '"msg":"system info","n_threads":4,"n_threads_batch":-1,"total_threads":8,'
                    f'"system_info":"{ARM}"}}') == ([(4, None, 8)], False)
    # the HTTP server's pool is not the compute threads, and a line without the CPUs says nothing
    assert _threads("main: HTTP server is listening, hostname: 0.0.0.0, port: 8080, http threads: 47",
                    'INFO [main] HTTP server listening | n_threads_http="5" port="37349"',
                    "llama_new_context_with_model: n_threads = 8") == ([], False)


def _judge(*lines: str) -> tuple[EvidenceSet, list[Finding]]:
    res = loose.analyze_stream("x", io.BufferedReader(io.BytesIO("\n".join(lines).encode())))
    ev = EvidenceSet(res.evidence)
    findings, _ = run_rules(ev)
    return ev, [f for f in findings if f.code == "THR003"]


def test_more_threads_than_cpus_is_measured_oversubscription() -> None:
    ev, found = _judge(f"system_info: n_threads = 37 / 36 {X86}")  # ollama#8074's 37 threads on 36
    assert ev.value("llamacpp.threads") == 37 and ev.value("llamacpp.host_cpus") == 36
    (f,) = found
    assert f.confidence is Confidence.MEASURED and f.impact == 0.8
    assert "37 threads (n_threads) on a host with 36 logical CPUs: 1 of them cannot run" in f.message
    assert "physical cores" in f.fixes[0].summary
    # the batch threads count too, whatever the CPU
    ev, found = _judge(f"system_info: n_threads = 4 (n_threads_batch = 12) / 8 {ARM}")
    assert [f.confidence for f in found] == [Confidence.MEASURED] and "(n_threads_batch)" in found[0].message
    # several start-ups in one log: the worst one is judged
    ev, found = _judge(f"system_info: n_threads = 4 / 8 {X86}", f"system_info: n_threads = 12 / 8 {X86}",
                       f"system_info: n_threads = 6 / 8 {X86}")
    assert ev.value("llamacpp.threads") == 12 and len(found) == 1
    # some layers left on the CPU: its threads compute them
    _, found = _judge(f"system_info: n_threads = 37 / 36 {X86}", "llm_load_tensors: offloaded 20/33 layers to GPU",
                      "llm_load_tensors:      CUDA0 buffer size =  3577.56 MiB")
    assert [f.confidence for f in found] == [Confidence.MEASURED]


def test_the_gpu_doing_the_work_takes_the_threads_out_of_the_picture() -> None:
    # every layer on the GPU: the threads barely run (ollama#9306), nothing said
    assert _judge(f"system_info: n_threads = 37 / 36 {X86}", "llm_load_tensors: offloaded 33/33 layers to GPU",
                  "llm_load_tensors:      CUDA0 buffer size =  3577.56 MiB")[1] == []
    # a GPU seen (a buffer on it, or the build's GPU backend in the line) with no word of the layers: a heuristic
    buffer = "llm_load_tensors:      CUDA0 buffer size =  3577.56 MiB"
    for lines in ((f"system_info: n_threads = 37 / 36 {X86}", buffer),
                  ("system_info: n_threads = 37 (n_threads_batch = 37) / 36 | CUDA : ARCHS = 890 | USE_GRAPHS = 1 | "
                   "CPU : SSE3 = 1 | AVX = 1 |",)):
        (f,) = _judge(*lines)[1]
        assert f.confidence is Confidence.HEURISTIC and f.impact == 0.5 and "how many layers it holds" in f.message


def test_threads_at_or_below_the_cpus_are_not_judged() -> None:
    """llama.cpp's default is the physical cores: n_threads = the logical CPUs under it is a host without SMT, and
    -t set to every logical CPU costs far less than a thread too many (the reviewer's healthy 12.9 tok/s run)."""
    for line in (f"system_info: n_threads = 16 / 16 {X86}",
                 f"system_info: n_threads = 8 (n_threads_batch = 8) / 8 {X86}",
                 f"system_info: n_threads = 8 (n_threads_batch = 8) / 16 {X86}",
                 f"system_info: n_threads = 2 / 2 {ARM}"):
        assert _judge(line)[1] == []
