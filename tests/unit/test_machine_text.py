"""Machine text is never prose: every line is typed before it is read (issue 17, item 5).

The lines here are real formats: vLLM V1's records and its c10 warnings, llama.cpp's C-style
prefixes, Python's warnings and tracebacks, Prometheus exposition, ``sh -x`` command echoes.
"""

from __future__ import annotations

import io
import os

import pytest

from diagnose import loose
from diagnose.collectors.claims import ClaimParser
from diagnose.collectors.engine_log import EngineLogParser
from diagnose.collectors.linekind import LineKind, inline_command, kind_of
from diagnose.collectors.oom import _GPU_SPEC
from diagnose.collectors.timing import TimingParser
from diagnose.model import (
    HOST_NO_GPU,
    Category,
    Confidence,
    Evidence,
    EvidenceSet,
    Finding,
    Mechanism,
    Severity,
    Verdict,
)
from diagnose.rules import verdict
from diagnose.rules.engine import run_rules
from diagnose.rules.serving import EngineQueueSaturated
from tests.conftest import DATA

K = LineKind
LINES: list[tuple[str, LineKind]] = [
    ("INFO 12-02 03:35:17 [loggers.py:335] Engine 000: Avg prompt throughput: 240.0 tokens/s", K.LOG),
    ("(VllmWorker-0 pid=17171)", K.LOG),
    ("[W1202 03:56:39.219913463 utils.cpp:68] Warning: NUMA binding: Using MEMBIND policy", K.LOG),
    ("load_tensors: layer   0 assigned to device CPU, is_swa = 0", K.LOG),
    ("llama_perf_context_print: prompt eval time =    3.21 ms /     7 tokens", K.LOG),
    ("slot launch_slot_: id  0 | task 0 | processing task", K.LOG),
    ("/x/vllm/entrypoints/openai/api_server.py:24: DeprecationWarning: use vllm.entrypoints.launchers", K.LOG),
    ("2024-05-01 10:00:00,123 - INFO - model loaded", K.LOG),
    ("~llama_context:        CPU compute buffer size is  43.0098 MiB, matches expectation of  43.0098 MiB", K.LOG),
    ("Llama.generate: 1 prefix-match hit, remaining 16 prompt tokens to eval", K.LOG),
    ("[13059.917043] Memory cgroup out of memory: Killed process 25088 (python3) total-vm:528568kB", K.LOG),
    ("Dec  1 09:14:22 node-3 kernel: Out of memory: Killed process 2481 (python3)", K.LOG),
    # Rust's tracing layout (TGI, TEI) once the time is stripped: a span with its fields, or a module path
    ('INFO openai_embed{total_time="1.064598176s" tokenization_time="13.304513ms" queue_time="626.352µs"}: '
     "text_embeddings_router::http::server: router/src/http/server.rs:1290: Success", K.LOG),
    ("INFO text_generation_launcher: Args { model_id: \"bigscience/bloom-560m\" }", K.LOG),
    ("ERROR something went wrong with the model", K.PROSE),
    # TensorRT's logger (trtexec, TensorRT-LLM): a bracketed date-time and a one-letter level
    ("[05/24/2024-15:02:09] [I] preprocess time = 7.47456; infer time = 1213.42; postprocess time = 3.12787", K.LOG),
    ("[01/17/2024-22:14:09] [TRT] [W] Tactic Device request: 16512MB Available: 12281MB.", K.LOG),
    # a one-letter tag alone, or a list of fields, may be a person's ("GPU usage: 2%, CPU usage: 100%")
    # nvprof's, cuda-memcheck's and valgrind's process id between double equals signs (apache/mxnet#14725)
    ("==21941== Warning: This can happen if device ran out of memory or if a device kernel was stopped due to an "
     "assertion.", K.LOG),
    ("== a person's heading ==", K.PROSE),
    ("[I] think the model runs on the CPU", K.PROSE),
    ("GPU usage: 2%, CPU usage: 100%", K.PROSE),
    # a benchmark's printed block: aligned key-value rows and its titled rules; a tqdm progress bar
    ("Successful requests:                     1000", K.TABLE),
    ("Mean TTFT (ms):                          100636.33", K.TABLE),
    ("============ Serving Benchmark Result ============", K.TABLE),
    ("---------------Time to First Token----------------", K.TABLE),
    ("100%|██████████████████████| 1000/1000 [07:53<00:00,  2.11it/s]", K.LOG),
    ("Processed prompts: 100%|██████████| 500/500 [00:21<00:00, 23.4it/s]", K.LOG),
    ("---", K.PROSE),  # a person's markdown separator
    # titled rules with a hyphen in the title (vllm bench serve), perf_analyzer's starred title; a person's bold
    ("---------------Inter-token Latency----------------", K.TABLE),
    ("*** Measurement Settings ***", K.TABLE),
    ("***bold***", K.PROSE),
    # llama.cpp's timings with their prefix gone (llama.cpp#12237): the value padded to a column after "="
    ("       eval time =    1075.76 ms /    19 tokens (   56.62 ms per token,    17.66 tokens per second)", K.TABLE),
    ("      total time =    9809.97 ms /   990 tokens", K.TABLE),
    ("time =  5 s is what I see", K.PROSE),
    ("TTFT =  4500 ms", K.PROSE),  # a person's measurement, padded or not
    ("prompt eval time = 1184334.08 ms / 120035 tokens (    9.87 ms per token,   101.35 tokens per second)", K.TABLE),
    # a person's starred or ruled heading has numbers and many words: it is read
    ("*** UPDATE: TTFT is 9 s for 16k-token prompts, prefill is the bottleneck ***", K.PROSE),
    ("----- TTFT is 4 s with batch-size 64 -----", K.PROSE),
    # a program's columns: nsys stats' header and rows (proteneer/timemachine PR 1225), the old memcpy rows
    (" Time (%)  Total Time (ns)  Num Calls    Avg (ns)     Med (ns)    Min (ns)    Max (ns)   StdDev (ns)   Name",
     K.TABLE),
    ("     48.7    1,575,151,965    411,939    3,823.8    3,545.0     2,915    1,268,397    2,684.8  cudaLaunchKernel",
     K.TABLE),
    ("    202.479     669     0.303     0.212     0.000     8.389        0.996  [CUDA memcpy HtoD]", K.TABLE),
    ("batch size 8 takes  3.2 s  and batch 16  takes  6 s", K.PROSE),
    ("Note:  the GPU is idle while the queue grows and nobody knows why", K.PROSE),
    ("Model metadata: {'tokenizer.ggml.add_eos_token': 'false', 'general.architecture': 'llama'}", K.JSON),
    ("+ python3 -m vllm.entrypoints.openai.api_server --model /m --tokenizer /m --max-num-seqs 2", K.COMMAND),
    ("CUDA_VISIBLE_DEVICES=0 python serve.py", K.COMMAND),
    ("$ nvidia-smi", K.COMMAND),
    ("    --max-model-len 4096 \\", K.COMMAND),
    ("docker run --gpus all -p 8000:8000 vllm/vllm-openai --model x", K.COMMAND),
    ("python -m pip install \"rembg[gpu,cli]\"", K.COMMAND),  # a flag right after the launcher
    ("python3 -m vllm.entrypoints.openai.api_server \\", K.COMMAND),
    # a program no list names, a command by its shape: a name, then only flags and their values (whispering#76)
    ("whispering --language fr --model tiny --device cpu", K.COMMAND),
    ("please use --fp16 instead", K.PROSE), ("I tried --device cpu and --threads 4 but", K.PROSE),
    ("i tried --no-mmap --mlock", K.PROSE), ("still slow --verbose --debug", K.PROSE),
    ("koboldcpp slow with --usecublas --gpulayers 99", K.PROSE),
    ("whisper works but --device cuda --fp16 False", K.PROSE),
    ("mytool serve --port 8000 --host 0.0.0.0", K.COMMAND),
    ("# HELP vllm:request_num_preemptions Histogram of the number of times a request was preempted.", K.METRICS),
    ('vllm:num_requests_waiting{engine="0",model_name="lab"} 14.0', K.METRICS),
    ('{"ts": 1764470000.12, "stages_ms": {"queue": 3.1}}', K.JSON),
    ("Traceback (most recent call last):", K.TRACEBACK),
    ('  File "/x/y.py", line 3, in f', K.TRACEBACK),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", K.TRACEBACK),
    ("    batch = self.get_next_batch_to_run()", K.CODE),
    ("  warnings.warn(", K.CODE),
    # a comment in a pasted function's body (pytorch/serve#1120's handler): what the code does, nobody's statement
    ("            # Resize to image format by also adding channel dimension", K.CODE),
    ("    #1 issue is this one", K.PROSE),  # a number after the hash: a person's list
    ("  # Steps to reproduce", K.PROSE),  # a Markdown heading may sit up to three spaces in
    ("| GPU | util | 40 % |", K.TABLE),
    ("vllm reserves 90% of the GPU memory", K.PROSE),
    ("make sure the tokenizer is fast", K.PROSE),
    ("# The GPU is idle while p99 explodes", K.PROSE),
    ("  if you set it to 2 it works", K.PROSE),
    ("GPU utilization is only 40% while p99 latency explodes", K.PROSE),
]


@pytest.mark.parametrize(("line", "kind"), LINES, ids=[f"{k.value}-{i}" for i, (_, k) in enumerate(LINES)])
def test_each_line_is_typed_by_its_structure(line: str, kind: LineKind) -> None:
    assert kind_of(line) is kind


def _claims(text: str) -> ClaimParser:
    p = ClaimParser()
    for line in text.split("\n"):
        p.feed(line)
    return p


def test_a_launch_command_states_nothing() -> None:
    c = _claims("python -m vllm.entrypoints.openai.api_server --model m --tokenizer t --max-num-seqs 2").claims
    assert not c.words and not c.title and not c.concepts


@pytest.mark.parametrize(("line", "command"), [
    # commands people quote in a sentence (the incident corpus' own forms)
    ("我在容器里面的启动命令如下：vllm serve /models/qwen3-80B --tensor-parallel-size 8 --max-model-len 32768 "
     "--enable-chunked-prefill --enforce-eager", "vllm serve /models/qwen3-80B"),
    ("Command used: `text-generation-launcher --model-id /models/llama --port 8080 --num-shard 2` and it fills memory",
     "text-generation-launcher --model-id /models/llama --port 8080 --num-shard 2"),
    ("(for example `docker run --cpus=2`)", "docker run --cpus=2"),
    ("ollama is slow when I raise --num-parallel on my laptop", None),  # a sentence that names a flag
    ("we run python on the box", None),
    ("I accelerate it with --fp16", None),  # no launcher
    ("But vllm with --enforce-eager is slow", None),  # a function word: a sentence, not a command
    ("The python -based client is slow", None),
    # unquoted, it ends where the sentence goes on
    ("I run vllm serve m --tp 8 --enforce-eager and the TTFT is 30 s on long prompts, prefill is slow",
     "vllm serve m --tp 8 --enforce-eager"),
    ("I'm using python -m vllm.entrypoints.openai.api_server --model m, and GPU memory is 95% full",
     "python -m vllm.entrypoints.openai.api_server --model m"),
    # a path before the launcher does not swallow the quote that opened it
    ("Run `./llama-server -m model.gguf -ngl 0` and the GPU sits idle at 2 tokens/s", "./llama-server -m model.gguf"),
])
def test_a_command_quoted_in_a_sentence_is_found_by_its_flags(line: str, command: str | None) -> None:
    span = inline_command(line)
    if command is None:
        assert span is None
    else:
        assert span is not None and line[span[0]:span[1]].startswith(command)
        assert "`" not in line[span[0]:span[1]] and "," not in line[span[0]:span[1]]
        assert " and " not in line[span[0]:span[1]]


def test_a_quoted_command_states_nothing_but_its_settings() -> None:
    c = _claims("我的服务器单次吞吐速度在6tokens/s。我在容器里面的启动命令如下：vllm serve /models/qwen3-80B "
                "--tensor-parallel-size 8 --max-model-len 32768 --enable-chunked-prefill --enforce-eager").claims
    assert c.messages["cuda_graphs_off"] == 1  # --enforce-eager: CUDA graphs off, as configured
    assert not {"prefill", "capacity_cap", "input_size"} & set(c.concepts)  # its flags are no statements
    assert "tensor_parallel_size" not in " ".join(c.words) and "enforce" not in " ".join(c.words)
    assert c.title.startswith("我的服务器")
    # a command line on its own line: the same settings, and still nobody's claim
    c = _claims("vllm serve m --enforce-eager --max-num-seqs 2").claims
    assert c.messages["cuda_graphs_off"] == 1 and not c.words and not c.concepts
    # an engine on its CPU backend has no CUDA graphs to turn off
    c = _claims("VLLM_CPU_KVCACHE_SPACE=40 vllm serve Qwen/Qwen2.5-7B --device cpu --enforce-eager").claims
    assert c.messages["cuda_graphs_off"] == 0
    # the sentence around an unquoted command is still read
    c = _claims("I run vllm serve m --tp 8 --enforce-eager and the time to first token is 30 s on long prompts").claims
    assert c.messages["cuda_graphs_off"] == 1 and "ttft" in c.concepts


def test_program_prose_between_records_is_the_programs_and_so_are_its_repeats() -> None:
    log = "\n".join([
        "+ python3 -m vllm.entrypoints.openai.api_server --model m",
        "Triton is installed, but doesn't include CPU backend. Disabling Triton.",
        "INFO 12-02 03:30:38 [api_utils.py:286] non-default args: {'host': '127.0.0.1'}",
        "INFO 12-02 03:30:39 [api_utils.py:286] starting",
        "",
        "Triton is installed, but doesn't include CPU backend. Disabling Triton.",  # again, after a blank line
        "INFO 12-02 03:30:40 [core.py:1] nanobind: leaked 4 instances!",
        "nanobind: leaked 64 types!",
        " - leaked type \"triton._C.libtriton.ir.location\"",
        "  warnings.warn('resource_tracker: There appear to be %d '",
    ])
    c = _claims(log).claims
    assert not c.title and not c.words


def test_program_prose_after_a_printed_structure_is_the_programs() -> None:
    # llama-cpp-python's start-up, as tests/data/engines/llamacpp/*-py/server.log has it: a table (CPU features),
    # a printed dict, a print() of its own, then uvicorn's records
    log = "\n".join([
        "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | OPENMP = 1 |",
        "Model metadata: {'tokenizer.ggml.add_eos_token': 'false', 'general.architecture': 'llama'}",
        "Using fallback chat format: llama-2",
        "INFO:     Started server process [29996]",
    ])
    c = _claims(log).claims
    assert not c.words and not c.title
    # a person's sentence after a pasted table, ended by a blank line, is still theirs
    c = _claims("| GPU | util |\n|---|---|\nthe fallback path runs on the CPU for every request\n").claims
    assert "fallback" in c.words


def test_a_persons_words_around_a_log_are_read() -> None:
    text = "\n".join([
        "vLLM slow: time to first token is 3 s under load",
        "I get this when 16 clients stream:",
        "INFO 12-02 03:35:17 [loggers.py:335] Engine 000: Running: 2 reqs, Waiting: 14 reqs",
        "INFO 12-02 03:35:27 [loggers.py:335] Engine 000: Running: 2 reqs, Waiting: 13 reqs",
        "",
        "The GPU is idle most of the time.",
    ])
    c = _claims(text).claims
    assert c.title == "vLLM slow: time to first token is 3 s under load"
    assert {"clients", "stream", "idle"} <= c.words


def _engine(*lines: str) -> EngineLogParser:
    p = EngineLogParser()
    for line in lines:
        p.feed(line)
    return p


def test_the_cpu_backends_kv_pool_and_its_preemptions_are_read() -> None:
    s = _engine(*[f"INFO 12-02 03:4{i}:00 [loggers.py:335] Engine 000: Avg prompt throughput: 1074.3 tokens/s, Avg "
                  f"generation throughput: 80.3 tokens/s, Running: 3 reqs, Waiting: 10 reqs, Preemptions: {i}, "
                  f"CPU KV cache usage: 9{i}.1%, Prefix cache hit rate: 4.7%" for i in range(1, 4)]).summary()
    assert s.kv_usage.max == pytest.approx(0.931) and s.preemptions == 6


def test_v0s_cpu_kv_usage_beside_the_gpus_is_swap_space() -> None:
    s = _engine("Avg prompt throughput: 209.6 tokens/s, Avg generation throughput: 567.4 tokens/s, Running: 36 reqs, "
                "Swapped: 0 reqs, Pending: 78 reqs, GPU KV cache usage: 99.1%, CPU KV cache usage: 0.0%").summary()
    assert s.kv_usage.max == pytest.approx(0.991)


def test_a_help_text_that_says_preempted_is_no_preemption() -> None:
    s = _engine("# HELP vllm:request_num_preemptions Histogram of the number of times a request was preempted.",
                "+ vllm serve m --preemption-mode recompute  # requests preempted are recomputed").summary()
    assert s.preemptions == 0


def _timing(*lines: str) -> TimingParser:
    p = TimingParser()
    for line in lines:
        p.feed(line)
    return p


def test_start_up_phases_are_no_call_latencies_but_repeated_timings_are() -> None:
    phases = _timing("INFO 12-02 03:33:59 [base_loader.py:82] Initializing model took 0.395087 seconds",
                     "INFO 12-02 03:35:03 [monitor.py:91] [backbone] Initial profiling/warmup run took 1.42 s",
                     "INFO 12-02 03:35:04 [core.py:402] init engine (profile, create kv cache, warmup model) "
                     "took 63.00 s")
    assert phases.records().untagged.n == 0
    calls = _timing(*[f"2024-05-01 10:00:0{i} inference took {0.5 + i / 10:.2f}s" for i in range(5)])
    got = calls.records().untagged
    assert got.n == 5 and got.max == pytest.approx(0.9 * 1000)


@pytest.mark.parametrize(("text", "gpu"), [
    ("--model /models/tinyllama-L4-H256.gguf", None), ("/models/t4_int8", None),
    ("on an NVIDIA L4", "L4"), ("2x A100-80GB", "A100"), ("H100-SXM5-80GB", "H100"), ("Tesla T4 GPU", "T4"),
])
def test_a_gpu_name_inside_a_file_name_names_no_gpu(text: str, gpu: str | None) -> None:
    m = _GPU_SPEC.search(text)
    assert (m.group("gpu") if m else None) == gpu


def _ev(**values: float) -> EvidenceSet:
    return EvidenceSet([Evidence(k.replace("__", "."), v, "x", "test") for k, v in values.items()])


def test_scheduler_stats_alone_never_make_a_service_healthy() -> None:
    stats = dict(serving__stat_samples=5, serving__waiting_max=0, serving__running_max=2)
    got, steps = verdict.decide(_ev(**stats), ())
    assert got is Verdict.UNDETERMINED and steps
    got, steps = verdict.decide(_ev(**stats, latency__ttft_ms__p99=40.0), ())
    assert got is Verdict.HEALTHY
    # the requests' own figures say nothing of a starved host: healthy in what they cover, the attach next
    assert len(steps) == 1 and steps[0].startswith("Attach while the problem happens")
    got, steps = verdict.decide(_ev(**stats, latency__ttft_ms__p99=40.0, proc__cpu_cores=0.4), ())
    assert got is Verdict.HEALTHY and steps == ()


def test_a_covered_service_without_latency_asks_for_the_latency_first() -> None:
    ev = _ev(workers__active_mean=1.0, conn__inflight_mean=1.0)
    got, steps = verdict.decide(ev, ())
    assert got is Verdict.UNDETERMINED and steps[0].startswith("Measure what requests feel")


def _gpu_finding() -> Finding:
    return Finding("GPU001", "x", Category.GPU_COMPUTE, Severity.CRITICAL, Confidence.MEASURED, "t", "m", 0.9)


def test_no_gpu_finding_on_a_host_without_a_gpu_unless_gpu_evidence_came_from_elsewhere() -> None:
    from diagnose.rules import engine

    no_gpu = EvidenceSet([Evidence(HOST_NO_GPU, 1, "flag", "attach", detail="no NVIDIA driver")])
    kept, skipped = engine._without_gpu(no_gpu, [_gpu_finding()], [])
    assert kept == [] and skipped[0].code == "GPU001" and "no GPU" in skipped[0].reason
    with_trace = EvidenceSet([*no_gpu, Evidence("trace.gpu_busy_ratio", 0.99, "ratio", "nsys")])
    kept, _ = engine._without_gpu(with_trace, [_gpu_finding()], [])
    assert kept == [_gpu_finding()]
    findings, _ = run_rules(no_gpu)
    assert not [f for f in findings if f.category is Category.GPU_COMPUTE]


def _queue(**extra: float) -> Finding | None:
    base = dict(serving__waiting_max=14, serving__waiting_mean=13.5, serving__queued_sample_ratio=1.0,
                serving__stat_samples=4, serving__running_max=2, serving__running_when_queued_mean=1.75,
                serving__running_when_queued_max=2)
    rule = EngineQueueSaturated()
    return rule.check(_ev(**{**base, **extra}), EngineQueueSaturated.Thresholds())


def test_queueing_names_its_mechanism() -> None:
    stated = _queue(serving__max_num_seqs=2, serving__kv_cache_usage_when_queued_mean_ratio=0.002)
    assert stated is not None and stated.mechanism is Mechanism.ADMISSION_CAP and "max_num_seqs=2" in stated.message
    inferred = _queue(serving__kv_cache_usage_when_queued_mean_ratio=0.002)  # a scrape: no limit stated
    assert inferred is not None and inferred.mechanism is Mechanism.ADMISSION_CAP
    kv = _queue(serving__kv_cache_usage_when_queued_mean_ratio=0.97, serving__preemptions=171)
    assert kv is not None and kv.mechanism is Mechanism.KV_CAPACITY and "171 requests were preempted" in kv.message
    busy = _queue(serving__kv_cache_usage_when_queued_mean_ratio=0.5, serving__running_max=40,
                  serving__running_when_queued_mean=38, serving__running_when_queued_max=40, serving__waiting_max=60,
                  serving__waiting_mean=50)
    assert busy is not None and busy.mechanism is Mechanism.SATURATED_WORKERS
    assert busy.to_json()["mechanism"] == "saturated_workers"
    assert Finding.from_json(busy.to_json()).mechanism is Mechanism.SATURATED_WORKERS


def test_a_benchmarks_printed_block_gives_no_words_and_no_title() -> None:
    """SGLang's bench_serving block (sgl-project/sglang#8285) is the program's: its aligned rows are a table (their
    numbers may be read as a table's), never the reporter's words; the title is the person's sentence above it."""
    with open(os.path.join(DATA, "logs", "sglang_bench_serving_concurrency_330.txt"), encoding="utf-8") as fh:
        text = fh.read()
    ev = {e.key: e.value for e in loose.analyze_stream("p", io.BufferedReader(io.BytesIO(text.encode()))).evidence}
    assert str(ev["report.title"]).startswith("The results are as follows")
    cues = ev.get("report.cues")
    assert isinstance(cues, dict)
    words = {k for k in cues if k.startswith("w:")}
    assert not {"w:successful", "w:throughput", "w:benchmark_duration", "w:backend"} & words, words


def test_a_programs_columns_are_no_statements_but_a_persons_table_is_read() -> None:
    """nsys stats' rows (a cudaLaunchKernel row read as "the report names launch overhead", memcpy rows as copy
    statements that led the differential: timemachine PR 1225, intel/llvm#8971) are the nsys reader's, never the
    report's; a table a person typed with pipes is still read for its numbers."""
    rows = ["CUDA API Statistics:", "",
            " Time (%)  Total Time (ns)  Num Calls  Avg (ns)   Med (ns)   Min (ns)   Max (ns)    StdDev (ns)   Name",
            " --------  ---------------  ---------  ---------  ---------  --------  -----------  -----------  --------",
            "     48.7    1,575,151,965    411,939    3,823.8    3,545.0     2,915    1,268,397      2,684.8  "
            "cudaLaunchKernel",
            "      7.1      228,595,522     53,663    4,259.8    3,526.0     2,241      492,149      8,515.4  "
            "cudaMemcpyAsync"]
    c = _claims("\n".join(rows)).claims
    assert not c.concepts["launch"] and not c.concepts["copy"], c.concepts
    person = _claims("| step | copy time |\n|---|---|\n| 1 | memcpy 80 ms |\n").claims
    assert person.concepts["copy"] >= 1, person.concepts


def test_llama_cpps_timings_without_their_prefix_are_no_statements() -> None:
    """llama-server's timings pasted without their ``slot print_timing`` prefix (llama.cpp#12237): 'total time'
    is prompt plus generation, and read as a person's words it became the generation time (report.decode_ms_max
    9809.97 ms against an eval of 1075.76 ms). They are the llama.cpp reader's, which reads each by its label."""
    text = ("prompt eval time =    8734.21 ms /   971 tokens (    9.00 ms per token,   111.17 tokens per second)\n"
            "       eval time =    1075.76 ms /    19 tokens (   56.62 ms per token,    17.66 tokens per second)\n"
            "      total time =    9809.97 ms /   990 tokens\n")
    ev = {e.key: e.value for e in loose.analyze_stream("p", io.BufferedReader(io.BytesIO(text.encode()))).evidence}
    assert "report.decode_ms_max" not in ev and "report.prefill_ms_max" not in ev, ev
    assert ev["stage.decode_ms.mean"] == pytest.approx(1075.76)
    assert ev["stage.prefill_ms.mean"] == pytest.approx(8734.21)


def test_a_benchmarks_key_value_summary_is_no_statement_even_across_blank_lines() -> None:
    """LMDeploy's profile_throughput summary (InternLM/lmdeploy PR 1515): 'number of completion tokens: 712850' is the
    run's total, and read as a person's words it became a prompt length that made TTF002 commit prefill_ttft; its
    'first token latency(s)(min, max, ave): …' became the report's title. Rows of numbers under a rule, across the
    blank lines between them, are the program's; a person's two lines of numbers are still read."""
    with open(os.path.join(DATA, "logs", "lmdeploy_profile_throughput_c256.txt"), encoding="utf-8") as fh:
        text = fh.read()
    ev = {e.key: e.value for e in loose.analyze_stream("p", io.BufferedReader(io.BytesIO(text.encode()))).evidence}
    assert "report.prompt_tokens_max" not in ev and "report.title" not in ev, ev
    assert "report.decode_tokens_per_s" not in ev
    person = _claims("The service is slow for us.\nTTFT: 4.5 s\nprompt tokens: 6000\n").claims
    assert person.concepts["ttft"] >= 1, person.concepts


def test_a_persons_short_lists_of_numbers_are_read_and_a_persons_table_opens_no_printout() -> None:
    three = _claims("Decode is slow on our A100.\nTTFT: 0.3 s\nTPOT: 120 ms\nbatch size: 8\n").claims
    assert three.concepts["ttft"] >= 1 and three.concepts["decode"] >= 1, three.concepts
    after_table = _claims("| run | tok/s |\n|---|---|\n| a | 12 |\n\nTTFT: 9 s\nprompt tokens: 6000\n").claims
    assert after_table.concepts["ttft"] >= 1, after_table.concepts
