"""What an incident report says: quantities bound to concepts by structure, framework messages, cues."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from diagnose import loose, pipeline
from diagnose.collectors.claims import ClaimParser, quantities
from diagnose.derive import claims as derive_claims
from diagnose.model import EvidenceSet, Verdict
from diagnose.rules import calibration, report_model
from diagnose.rules.engine import run_rules
from diagnose.rules.report import claims_only

INCIDENTS = Path(__file__).resolve().parents[1] / "data" / "incidents"


def _claims(text: str) -> ClaimParser:
    p = ClaimParser()
    for line in text.splitlines():
        p.feed(line)
    return p


def _report(text: str) -> dict[str, object]:
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    return {e.key: e.value for e in res.evidence}


def _diagnose(text: str):  # type: ignore[no-untyped-def]
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    return pipeline.judge(EvidenceSet(res.evidence), inputs=res.inputs)


@pytest.mark.parametrize(("text", "dim", "value"), [
    ("takes 60 seconds", "time", 60_000.0), ("首个token 3.32s", "time", 3320.0), ("1.5 GiB", "size", 1.5 * 2**30),
    ("at 95%", "pct", 95.0), ("6.56t/s", "rate", 6.56), ("16 threads", "count:threads", 16.0),
    ("8000 input tokens", "count:tokens", 8000.0), ("40x longer", "factor", 40.0), ("2 分钟", "time", 120_000.0),
])
def test_quantities_are_read_with_their_dimension(text: str, dim: str, value: float) -> None:
    qs = quantities(text)
    assert any(q.dim == dim and q.value == pytest.approx(value) for q in qs), qs


def test_a_quantity_binds_to_the_nearest_concept_that_accepts_its_kind() -> None:
    # the tokens belong to the prompt, the seconds to the first token, though "input tokens" is nearer
    c = _claims("I'm confused why 8000 input tokens takes 60 seconds before first token.").claims
    assert [q.value for q in c.bound["ttft"]] == [60_000.0]
    assert [q.value for q in c.bound["prompt_len"]] == [8000.0]
    c = _claims("my CPU usage is 100% and the GPU is 0%.").claims
    assert [q.value for q in c.bound["cpu_util"]] == [100.0] and [q.value for q in c.bound["gpu_util"]] == [0.0]


@pytest.mark.parametrize(("text", "util"), [
    # text-generation-webui#2216's report: 80-90% of VRAM was read as the GPU's utilisation
    ("Checking my GPU usage, my dedicated GPU memory is set to about 80-90% of max, but when generating tokens "
     "my CUDA usage only goes up to max 35%....", [35.0]),
    ("GPU usage is low, GPU memory at 95%", []),
    ("GPU memory usage is 98% but GPU utilization is 20%", [20.0]),
    ("nvidia-smi shows GPU 100% and memory 45%", [100.0]),
    ("the GPU is at 99% while VRAM usage is 60%", [99.0]),
    ("GPU util 30%, VRAM 90%", [30.0]),
    # memory named after the percentage labels it too; the utilisation before keeps its own
    ("We get 95% GPU utilization at 50% memory usage.", [95.0]),
    ("Running at 100% GPU utilization at about 30% VRAM.", [100.0]),
    ("I see 99% GPU usage at 40% of memory.", [99.0]),
    ("5% GPU usage, 90% memory usage", [5.0]),
    ("GPU utilization 0% even though 95% of memory is allocated", [0.0]),
    # memory that labels nothing: qualified, negated, set off by a comma
    ("GPU utilization during memory-bound decode is only 30%.", [30.0]),
    ("GPU usage (not memory) is 5%.", [5.0]),
    ("GPU utilization, unlike memory, is at 100%.", [100.0]),
    ("GPU usage for the RAM-heavy preprocessing stage sits at 10%.", [10.0]),
    # a concept's own value after a copula is its own; "CUDA usage" (Task Manager's graph) is a utilisation,
    # "CUDA loading" is not
    ("At 100% load the GPU utilization is ~20%.", [20.0]),
    ("GPU utilization is only about 20%.", [20.0]),
    ("my CUDA usage in task manager is 5%", [5.0]),
    ("CUDA loading of the checkpoint hangs at 45%.", []),
    # a second review: memory after a value labels it only when memory's own value does not follow; memory
    # before a value competes by distance whatever the words between; Chinese memory words; tables
    ("GPU-Util: 12%  Memory-Util: 94%", [12.0]),
    ("GPU-Util 99% Mem 30%", [99.0]),
    ("GPU utilization: 45% VRAM: 20GB", [45.0]),
    ("GPU usage is 100% mem usage is 50%", [100.0]),
    ("The GPU usage is 100% memory-bound.", [100.0]),
    ("GPU utilization is 30% and memory is almost 100%", [30.0]),
    ("GPU utilization is 30% and memory occupancy is 90%", [30.0]),
    ("GPU-Util 30% and Memory-Util 90%", [30.0]),
    ("| GPU util | 35% | memory | 90% |", [35.0]),
    ("| VRAM | 90% | GPU util | 20% |", [20.0]),
    ("GPU utilization at 100% and memory-bandwidth bound at 80%.", [100.0]),
    ("GPU utilization drops to 20% memory-wise fine.", [20.0]),
    ("GPU 利用率 10% 显存 95%", [10.0]),
    ("显存占用 95%，GPU利用率只有 10%", [10.0]),
])
def test_a_percentage_memory_labels_is_not_the_utilisation(text: str, util: list[float]) -> None:
    """A percentage memory labels (named before it with no other value between and nearer than the utilisation,
    or right after it with no value of its own) is memory's, not the GPU's utilisation; memory that labels
    nothing (qualified, negated, set off) does not take a value from a utilisation."""
    c = _claims(text).claims
    assert [q.value for q in c.bound.get("gpu_util", [])] == util


@pytest.mark.parametrize(("text", "cpu"), [
    ("CPU 100%  MEM 40%", [100.0]), ("CPU 100% RAM 12GB", [100.0]),
    ("CPU usage 100% RAM usage 40% GPU usage 0%", [100.0]), ("CPU利用率 100% 内存 40%", [100.0]),
    ("top: %CPU 100.0 %MEM 40.0", [100.0]),
])
def test_a_cpu_percentage_before_memorys_own_is_the_cpus(text: str, cpu: list[float]) -> None:
    c = _claims(text).claims
    assert [q.value for q in c.bound.get("cpu_util", [])] == cpu


def test_in_a_list_of_labelled_values_each_label_owns_the_value_after_it() -> None:
    """A concept after a number owned it when no other concept was nearer: the server's whole latency
    (perf_analyzer's 521936 usec) was "the queue time" of its breakdown (queue 47 usec), and a TTFT of
    18.8 s the time of the "Queueing" named after it, past another quantity (138x)."""
    c = _claims("Avg request latency: 521936 usec (overhead 364 usec + queue 47 usec + compute input "
                "95572 usec + compute infer 425814 usec + compute output 139 usec)").claims
    assert [q.value for q in c.bound["queue"]] == [pytest.approx(0.047)]
    c = _claims("| Knee | 2.0 | P99 TTFT jumps from 136ms to 18.8s (138x). Queueing begins. |").claims
    assert "queue" not in c.bound
    # with nothing between them, a concept after its number still owns it; a value read past another with
    # no label of its own is still the concept's
    c = _claims("we measured 3 s of queue wait per request").claims
    assert [q.value for q in c.bound["queue"]] == [3000.0]
    c = _claims("the P99 TTFT jumps from 136ms to 18.8s under load").claims
    assert [q.value for q in c.bound["ttft"]] == [136.0, 18_800.0]
    # a connective or a qualifier after a separator goes on with the same concept; a full-width separator is one
    for text, ttft in (("TTFT median 120 ms, tail 3.2 s", [120.0, 3200.0]),
                       ("TTFT of 500 ms, and up to 18 s under load", [500.0, 18_000.0]),
                       ("TTFT was 800 ms; then 18 s", [800.0, 18_000.0]),
                       ("首个token 3.32s，其他token 20ms", [3320.0])):
        assert [q.value for q in _claims(text).claims.bound["ttft"]] == ttft, text
    # the concept's own value is one of a kind it takes: "3 times" is no queue time
    c = _claims("the request waited 2 s in the queue 3 times").claims
    assert [q.value for q in c.bound["queue"]] == [2000.0]


def test_in_a_list_of_values_each_named_after_it_each_value_is_its_own_items() -> None:
    """ultralytics prints "Speed: 0.3ms preprocess, 7.6ms inference, 0.0ms loss, 0.8ms postprocess per image" for
    every run: each value names its stage after it, so the 7.6 ms of inference (and the 0.0 ms of loss) were the
    pre-processing's, the concept before them. Such an item's value is its own label's, the model's where the list
    names pre- or post-processing beside it, or the list's heading's; one value before words after a comma is no
    list (the earlier concept keeps it)."""
    c = _claims("Speed: 0.3ms preprocess, 7.6ms inference, 0.0ms loss, 0.8ms postprocess per image at shape "
                "(1, 3, 640, 640)").claims
    assert [q.value for q in c.bound["preprocess"]] == [0.3]
    assert [q.value for q in c.bound["postprocess"]] == [0.8]
    assert [q.value for q in c.bound["model_time"]] == [7.6]
    c = _claims("300 ms preprocessing, 20 ms inference").claims
    assert [q.value for q in c.bound["preprocess"]] == [300.0] and [q.value for q in c.bound["model_time"]] == [20.0]
    # the heading owns the values its items do not name; "inference" alone names no stage outside such a list
    assert [q.value for q in _claims("TTFT: 120 ms median, 3.2 s tail").claims.bound["ttft"]] == [120.0, 3200.0]
    assert "model_time" not in _claims("Speed: 12 ms inference, 3 ms loss").claims.bound
    assert [q.value for q in _claims("GPU utilization is low, 40% most of the time").claims.bound["gpu_util"]] == [40.0]
    # an item's own label before its value is its own ("TPOT: 45 ms median"); a thousands separator cuts no item;
    # a label of an earlier item that is no value-first one is no heading; "model download" is no model stage
    for text, want in (("TTFT: 120 ms median, TPOT: 45 ms median", {"ttft": [120.0], "decode": [45.0]}),
                       ("queue time: 3 s avg, inference time: 200 ms avg", {"queue": [3000.0], "model_time": [200.0]}),
                       ("Speed: 0.3ms preprocess, 1,200ms inference, 0.8ms postprocess",
                        {"preprocess": [0.3], "model_time": [1200.0], "postprocess": [0.8]}),
                       ("preprocess 3 ms, 7.6ms inference, 0.8ms postprocess",
                        {"preprocess": [3.0], "model_time": [7.6], "postprocess": [0.8]}),
                       ("Startup: 2 s preprocess, 300 s model download, 40 s model compile",
                        {"preprocess": [2000.0], "download": [300_000.0]})):
        got = {k: [q.value for q in v] for k, v in _claims(text).claims.bound.items()}
        assert got == want, text


@pytest.mark.parametrize("text", [
    "使用49G的显卡运行Yi-34B-Chat时提示显存溢出OOM",  # the number, its unit and the word glued to Chinese
    "用34B模型, 49G显存的卡, 爆显存了",
])
def test_chinese_prose_glued_to_numbers_and_words_is_read(text: str) -> None:
    """Chinese writes "49G的显卡" and "溢出OOM" without spaces: Unicode's \\b sees no word boundary between
    a Chinese character and a Latin one, so the size, the GPU memory and the OOM were missed."""
    got = _report(text)
    assert got["model.params"] == 34e9 and got["gpu.spec_memory_bytes"] == 49 * 2**30
    assert got["mem.oom_count"] == 1 and "oom" in got["report.title_concepts"]


def test_the_report_statements_count_an_oom_glued_to_chinese() -> None:
    assert _claims("接着查看日志发现oom了").claims.concepts["oom"] == 1


@pytest.mark.parametrize(("text", "concept", "values"), [
    ("GPU利用率只有30%左右", "gpu_util", [30.0]),  # the percentage glued to the characters on both sides
    ("显卡利用率为40%，CPU占用100%", "cpu_util", [100.0]),
    ("第2次推理耗时3秒", "model_time", [3000.0]),
    ("第3秒开始卡顿，首token延迟5秒", "ttft", [5000.0]),  # the third second is no duration
])
def test_a_number_glued_to_chinese_is_read(text: str, concept: str, values: list[float]) -> None:
    """A number right after a Chinese character was no number: Unicode counts the character as a word's, and a
    quantity may not follow a word's character (so "x86" or "Qwen2.5" give none). Only an ASCII letter, digit or
    dot before it keeps a number from being read."""
    c = _claims(text).claims
    assert [q.value for q in c.bound[concept]] == values
    assert not _claims("Qwen2.5-7B显存").claims.bound


@pytest.mark.parametrize("text", ["Vulkan device detection overriding CUDA_VISIBLE_DEVICES",
                                  "ollama is not honouring CUDA_VISIBLE_DEVICES", "it ignores CUDA_VISIBLE_DEVICES"])
def test_a_device_mask_that_does_not_hold_is_a_statement_about_which_gpu(text: str) -> None:
    assert _report(text)["report.wrong_gpu_statements"] == 1


@pytest.mark.parametrize(("text", "key"), [
    ("The model is not loaded directly into `CUDA` with from_pretrained", "report.placement_statements"),
    ("the pipeline was not automatically moved to the GPU", "report.placement_statements"),
    ("with the fans set to full blast the long run got faster", "report.throttle_statements"),
    ("OOM for concurrent long requests", "report.input_size_statements"),
])
def test_general_phrasings_of_placement_heat_and_input_size(text: str, key: str) -> None:
    assert _report(text)[key] == 1


def test_a_sentence_wrapped_over_lines_is_read_as_one() -> None:
    """A hard-wrapped paragraph (a mail, a markdown source): the line that goes on starts lower-case after
    a line with no sentence's end, and the sentence is read whole; a title above a body, or a sentence
    that ended, stays its own."""
    wrapped = ("Slow OCR on the server\n"
               "With the default backend the recogniser always runs on\n"
               "the CPU, even with the GPU build installed and a device requested.\n")
    assert _report(wrapped)["report.placement_statements"] == 1
    assert "report.placement_statements" not in _report(wrapped.replace("runs on\n", "runs on.\n"))
    c = _claims("Runs slowly\nthe first request after start takes long").claims
    assert c.title == "Runs slowly"


def test_a_token_count_before_context_is_the_prompt_length() -> None:
    got = _report("When I provide an example 3000 token context, there is a 10-30 second overhead before the "
                  "first token is generated.")
    assert got["report.prompt_tokens_max"] == 3000 and got["report.ttft_ms_max"] == 30_000


def test_framework_messages_are_recognised_whatever_surrounds_them() -> None:
    got = _report("prefix noise load_tensors: offloaded 0/29 layers to GPU trailing\n"
                  "UserWarning: FP16 is not supported on CPU; using FP32 instead\n")
    assert got["report.gpu_layers_offloaded"] == 0 and got["report.gpu_layers_total"] == 29
    assert got["report.cpu_fallback_messages"] == 1
    # ONNX Runtime's warning when its CUDA provider cannot be created (onnxruntime#13414, #16931): the session
    # runs on the CPU
    ort = ("2023-07-31 14:22:06.483132863 [W:onnxruntime:Default, onnxruntime_pybind_state.cc:640 "
           "CreateExecutionProviderInstance] Failed to create CUDAExecutionProvider. Please reference "
           "https://onnxruntime.ai/docs/execution-providers/CUDA-ExecutionProvider.html#requirements to ensure all "
           "dependencies are met.\n")
    assert _report(ort)["report.cpu_fallback_messages"] == 1
    # TensorRT's or MIGraphX's provider missing leaves CUDA's or ROCm's: not a fall-back to the CPU
    for other in ("TensorrtExecutionProvider.", "MIGraphXExecutionProvider."):
        assert "report.cpu_fallback_messages" not in _report(ort.replace("CUDAExecutionProvider.", other))
    # the warning alone names the GPU it could not use: the placement rule finds the work on the CPU
    ev = EvidenceSet(loose.analyze_stream("paste", io.BufferedReader(io.BytesIO(ort.encode()))).evidence)
    found, _ = run_rules(ev, decide=False)
    assert any(f.code == "PLC001" and "falls back to the CPU" in f.message for f in found)
    # llama.cpp's loader choosing a plain host buffer over the pinned one for tensors that stay on the host
    # (ollama#8776): both are the CPU's memory, nothing fell back from the GPU
    ggml = ("llm_load_tensors: tensor 'token_embd.weight' (q4_K) (and 531 others) cannot be used with preferred "
            "buffer type ROCm_Host, using CPU instead\n")
    assert "report.cpu_fallback_messages" not in _report(ggml)
    assert _report("No compatible GPU found, using CPU instead\n")["report.cpu_fallback_messages"] == 1


def test_the_frameworks_own_advice_is_never_a_claim() -> None:
    # vLLM's and PyTorch's hints name "other processes" and fragmentation in every OOM message
    got = _report("ValueError: Free memory on device is less than desired. Decrease GPU memory utilization or "
                  "reduce GPU memory used by other processes.\n")
    assert "report.held_elsewhere_statements" not in got


def test_memory_held_elsewhere_said_in_chinese() -> None:
    """Another process, a second instance, a shared card, in a Chinese report: the same statement as in English,
    so a report of memory "used" on a shared card is not read as the engine's own reservation (vllm-ascend#14004)."""
    for said in ("已有进程：mindie_llm_back，占用 19313 MB\n", "同一张卡上启动两个vllm实例，第二个启动失败\n",
                 "共卡部署时 KV Cache 很小\n", "同一张卡上启动了两个推理实例\n", "部署了多个模型实例\n"):
        assert _report(said).get("report.held_elsewhere_statements") == 1, said
    # this process' own memory, one instance on several GPUs, Windows' shared GPU memory (host RAM): none of them
    for said in ("模型进程占用了大部分显存\n", "开启多GPU实例\n", "共享GPU内存被用满了\n"):
        assert "report.held_elsewhere_statements" not in _report(said), said


def test_fewer_threads_faster_is_measured_from_the_reporters_comparison() -> None:
    got = _report("Results:\n16 threads = 0.83t/s\n7 threads = 6.56t/s\n")
    assert got["report.fewer_threads_speedup"] == pytest.approx(6.56 / 0.83)
    assert got["report.threads_best"] == 7


@pytest.mark.parametrize(("text", "category"), [
    ("GPU is not used. My CPU usage is 100% and the GPU is 0%.", "device_placement"),
    ("When two requests arrive at once the second request waits until the first one finishes.", "queueing"),
    ("Startup takes 45 minutes: torch compile and cudagraph capture took too much time.", "recompilation"),
    ("With --enforce-eager decode is very slow: 11 tokens/s.", "launch_overhead"),
    ("the first inference takes 40 s while subsequent ones take 200 ms", "recompilation"),
])
def test_what_a_report_says_names_the_bottleneck(text: str, category: str) -> None:
    d = _diagnose(text)
    assert d.leading is not None and d.leading.value == category, [(f.code, f.message) for f in d.findings]
    assert d.findings[0].confidence.value == "heuristic"
    # the cause leads the differential; it is the verdict only when its calibrated probability clears the bar
    assert d.candidates[0].category == category and d.candidates[0].probability == d.probability
    assert "only the report's wording says so" in " ".join(d.candidates[0].against)
    cal = calibration.calibrator()
    assert cal is not None and d.probability is not None
    if d.probability >= cal.threshold:
        assert d.primary is not None and d.primary.value == category and not d.withheld
    else:
        assert d.withheld and d.primary is None and d.overall.value == "undetermined"


def test_a_structured_finding_outranks_what_the_prose_says() -> None:
    # the prose says "one at a time"; the engine's own stats say the KV cache is full with a queue
    text = ("Requests are served one at a time, it seems.\n"
            "INFO 03-18 12:34:52 llm_engine.py:706] Avg prompt throughput: 209.6 tokens/s, Avg generation "
            "throughput: 567.4 tokens/s, Running: 36 reqs, Swapped: 0 reqs, Pending: 78 reqs, GPU KV cache usage: "
            "99.1%, CPU KV cache usage: 0.0%\n")
    d = _diagnose(text)
    assert not claims_only(d.findings[0]) and d.primary is not None and d.primary.value == "queueing"
    assert not any(claims_only(f) and f.category.value == "queueing" for f in d.findings)  # no echo of it


def test_a_report_that_withdraws_itself_is_not_a_bottleneck() -> None:
    d = _diagnose("Update: false alarm on my end, this was a benchmark-methodology artifact, not a server issue. "
                  "The queue time grew because the client only sends 4 requests at a time.")
    assert d.primary is None and d.overall is Verdict.HEALTHY
    assert any(f.code == "HLT003" and "false alarm" in f.message for f in d.findings)


@pytest.mark.parametrize(("compiles", "cold_start"), [
    ("", False),  # the first request waits for a download, nothing of compiling: warm-up
    (" and then torch.compile compiles the model for 30 s", True),  # a download and a compile: both said
])
def test_a_first_request_explained_by_a_download_is_warm_up_not_compiling(compiles: str, cold_start: bool) -> None:
    """CMP004's own false positive (train pephub-136: a title naming the first request, a body naming the
    download): with nothing of compiling said or measured, it steps aside for HLT003's expected behaviour."""
    d = _diagnose("First request after deploy is slow\nAfter a fresh deploy the first request takes 40 s: the model "
                  f"weights are being downloaded from the hub{compiles}. Every later request answers in 200 ms.\n")
    codes = [f.code for f in d.findings]
    assert "HLT003" in codes and ("CMP004" in codes) is cold_start, codes
    assert d.candidates[0].category == ("recompilation" if cold_start else "none"), d.candidates


def test_where_a_model_was_downloaded_from_explains_no_slowdown() -> None:
    """Sweep R's onnxruntime#10273: a slowdown report that says where its model came from is no first run waiting
    for a download; the download explains the slowness only where one clause puts them together."""
    d = _diagnose("Multiple InferenceSession slowdown inference speed\nWith one session the average time is 31ms, "
                  "with two sessions it is 46ms.\nmodel is download from https://github.com/onnx/models/tree/master\n"
                  "cpu info: Intel Xeon Platinum 8255C, 10 cores for my docker container\n")
    ev = EvidenceSet(d.evidence)
    assert ev.value("report.download_statements") == 1 and "report.download_first_statements" not in ev
    assert "HLT003" not in {f.code for f in d.findings} and d.overall is not Verdict.HEALTHY
    d = _diagnose("Slow startup\nThe first request is slow because it downloads the weights from the hub.\n")
    assert EvidenceSet(d.evidence).value("report.download_first_statements") == 1
    assert any(f.code == "HLT003" and "downloads weights" in f.message for f in d.findings)
    # the next sentence puts it to the first request too; a download under way is one, wherever from
    for text in ("First request takes 40 seconds\nAfter starting the server, the first request takes 40 s. Meanwhile "
                 "the log shows it downloading model.safetensors from the Hub. Later requests take 300 ms.\n",
                 "The first request takes 40 s: the weights are being downloaded from the hub.\n"):
        assert EvidenceSet(_diagnose(text).evidence).value("report.download_first_statements") == 1, text
    # where the slow model came from, in the clause that says it is slow, is no download
    ev = EvidenceSet(_diagnose("ONNX model slow on GPU\nThe resnet50 model downloaded from the ONNX model zoo is "
                               "slow: 80 ms per image on a T4, while PyTorch does it in 8 ms.\n").evidence)
    assert "report.download_first_statements" not in ev


ASYNC_READ = ("Copying the output to the CPU with .cpu() is very slow\nOn an RTX 3090, after the forward pass, "
              ".cpu() takes about 170 ms for a batch of 512.\n")


def test_a_read_of_a_cuda_tensor_timed_without_synchronising_is_the_models_time() -> None:
    """Sweep Q's Paddle#35614 and pytorch#24318: CUDA runs the model asynchronously, so a .cpu() after the forward
    waits for every kernel queued before it. Unsynchronised, its time is the model's (GPU009), not a copy's: no
    copy time, no copy statement, no copy in the title; XFR003 keeps only the wording's lean."""
    d = _diagnose(ASYNC_READ)
    ev = EvidenceSet(d.evidence)
    assert ev.value("report.sync_read_ms_max") == 170.0 and "report.copy_ms_max" not in ev
    assert "report.copy_statements" not in ev and "copy" not in ev.get("report.title_concepts").value
    gpu = next(f for f in d.findings if f.code == "GPU009")
    assert "charges 170 ms to reading a CUDA tensor on the host" in gpu.message
    assert "synchronises nowhere" in gpu.message
    assert gpu.fixes[0].summary == "Time the model, not the read that waits for it"
    assert d.primary is None or d.primary.value != "pcie_transfer"
    # synchronised before timing (in its prose or its code), the read's time is the copy's own
    for synced in ("I call torch.cuda.synchronize() before the timer starts.\n",
                   "```\ntorch.cuda.synchronize()\nt0 = time.time()\nout = y.cpu()\n```\n"):
        ev = EvidenceSet(_diagnose(ASYNC_READ + synced).evidence)
        assert ev.value("report.copy_ms_max") == 170.0 and "report.sync_read_ms_max" not in ev
        assert "copy" in ev.get("report.title_concepts").value
    # a person saying they never synchronise, or asking whether .cpu() does, has not synchronised
    for unsynced in ("I never call torch.cuda.synchronize().\n", "Does .cpu() synchronize with the GPU?\n"):
        ev = EvidenceSet(_diagnose(ASYNC_READ + unsynced).evidence)
        assert ev.value("report.sync_read_ms_max") == 170.0 and "report.copy_ms_max" not in ev, unsynced
    # a copy the clause sizes or rates was measured as a copy
    ev = EvidenceSet(_diagnose("Slow device to host copy\nWe copy a 2 GB result back with out.cpu() and it takes "
                               "420 ms, about 5 GB/s, on a PCIe 4.0 x16 slot.\n").evidence)
    assert ev.value("report.copy_ms_max") == 420.0 and "report.sync_read_ms_max" not in ev
    assert ev.value("report.copy_statements") == 2  # its title and its clause both name a copy
    # a size away from the read is another thing's: the read still waited
    ev = EvidenceSet(_diagnose("Slow output\nWith a 7 GB model loaded on an RTX 3090, the forward returns in 3 ms and "
                               "then preds.cpu() takes 800 ms.\n").evidence)
    assert ev.value("report.sync_read_ms_max") == 800.0 and "report.copy_ms_max" not in ev
    # a copy named otherwise is a copy: "the D2H memcpy takes 40 ms"
    ev = EvidenceSet(_diagnose("Slow output copies\nThe D2H memcpy takes 40 ms per batch.\n").evidence)
    assert ev.value("report.copy_ms_max") == 40.0 and "report.sync_read_ms_max" not in ev


def test_a_cpu_run_beside_a_gpu_run_is_a_comparison_not_a_fallback() -> None:
    """ultralytics/yolov3#212: the program announces "Using CPU" in one run (0.214 s) and "Using CUDA device0 …" in
    the next (0.970 s): the reporter ran both, nothing fell back. A CPU announcement alone still counts, and so does
    a fall-back message that is no announcement beside a GPU's."""
    gpu = "> Using CUDA device0 _CudaDeviceProperties(name='GeForce GTX 1050 Ti', total_memory=4096MB)\n"
    runs = ("Inference Time\nfirst i use CPU, I get that time is 0.214s in CPU\n> Using CPU\n"
            "> image 1/1 data/samples/zidane.jpg: Done. (0.214s)\n"
            "but when i use the GPU(GTX 1050Ti), the time is slow\n" + gpu
            + "> image 1/1 data/samples/zidane.jpg: Done. (0.970s)\n")
    ev = EvidenceSet(_diagnose(runs).evidence)
    assert "report.cpu_fallback_messages" not in ev
    alone = runs.replace(gpu, "")
    assert EvidenceSet(_diagnose(alone).evidence).value("report.cpu_fallback_messages") == 1
    other = runs + "UserWarning: FP16 is not supported on CPU; using FP32 instead\n"
    assert EvidenceSet(_diagnose(other).evidence).value("report.cpu_fallback_messages") == 1
    # the GPU run on the host and the CPU run in a container: a fall-back there (the review's counter-example)
    docker = runs + "Inside the docker container nvidia-smi is not found.\n"
    assert EvidenceSet(_diagnose(docker).evidence).value("report.cpu_fallback_messages") == 1


def test_a_synchronisation_in_the_reads_own_span_or_timed_alone_is_the_models_wait() -> None:
    """pytorch#24318: the code synchronises, but right before the read it times (no timer between them), so that
    span holds the wait for the unsynchronised forward's kernels: the 3 s is the model's, not a copy's. pytorch#72511
    (libtorch): the synchronisation timed on its own line, "cudaDeviceSynchronize(); // About 80 milliseconds", is
    that wait. A synchronisation before a timer read closes a timing, and CUDA events time the GPU: synced."""
    spans = ("```\nt0 = time.time()\nout = model(x) # 0.002s\nt1 = time.time()\n\nt0 = time.time()\n"
             "torch.cuda.synchronize()\ny = out.data.cpu().numpy() # 3s!!!\nt1 = time.time()\n```\n")
    ev = EvidenceSet(_diagnose("When I apply tensor.cpu(), it spent 3 seconds ! Why is it so slow???\n"
                               + spans).evidence)
    assert ev.value("report.sync_read_ms_max") == 3000.0 and "report.copy_ms_max" not in ev
    assert "copy" not in ev.get("report.title_concepts").value
    assert not any(k in ev.get("report.cues").value for k in ("t:copy", "c:copy"))
    timed = ("libtorch cudaDeviceSynchronize() operation is VERY SLOW?\n```\n"
             "  auto pred = module->forward(inputs);      // About 12 milliseconds\n"
             "  cudaDeviceSynchronize();           // About 80 milliseconds\n"
             "  auto logits = pred.toTensor().to(at::kCPU);        // About 0 milliseconds\n```\n")
    d = _diagnose(timed)
    ev = EvidenceSet(d.evidence)
    assert ev.value("report.sync_read_ms_max") == 80.0
    assert "charges 80 ms" in next(f for f in d.findings if f.code == "GPU009").message
    # the same read after a synchronisation that closed the forward's timing: the read's time is its own
    closed = ("```\nout = model(x)\ntorch.cuda.synchronize()\nt1 = time.perf_counter()\ny = out.cpu()\n```\n")
    ev = EvidenceSet(_diagnose(ASYNC_READ + closed).evidence)
    assert ev.value("report.copy_ms_max") == 170.0 and "report.sync_read_ms_max" not in ev
    events = "```\nstart = torch.cuda.Event(enable_timing=True)\ntorch.cuda.synchronize(); y = out.cpu()\n```\n"
    ev = EvidenceSet(_diagnose(ASYNC_READ + events).evidence)
    assert ev.value("report.copy_ms_max") == 170.0 and "report.sync_read_ms_max" not in ev
    # a synchronisation nothing follows closes the pasted timing too
    ev = EvidenceSet(_diagnose(ASYNC_READ + "```\nout = model(x)\ntorch.cuda.synchronize()\n```\n").evidence)
    assert ev.value("report.copy_ms_max") == 170.0
    # a timer read on the synchronisation's own line closes the timing; a remark holding a time is no timed wait
    for code in ("~~~\nout = model(x)\ntorch.cuda.synchronize(); t1 = time.time()\n"
                 "print(out.cpu().shape, t1 - t0)\n~~~\n",
                 "```\nout = model(x)\ntorch.cuda.synchronize()  # make sure the 2 ms forward has finished\n"
                 "t1 = time.time()\ny = out.cpu()\n```\n"):
        ev = EvidenceSet(_diagnose(ASYNC_READ + code).evidence)
        assert ev.value("report.copy_ms_max") == 170.0 and "report.sync_read_ms_max" not in ev, code
    # a fence opened and closed on one line leaves what follows prose: a person saying they synchronised
    ev = EvidenceSet(_diagnose(ASYNC_READ + "```torch.cuda.synchronize()```\nI call torch.cuda.synchronize() first.\n")
                     .evidence)
    assert ev.value("report.copy_ms_max") == 170.0


@pytest.mark.parametrize("record", [
    # the CUDA provider's GetCapability warning (onnxruntime#3221, ORT 1.2), its RNN/Conv checks' own form, and the
    # verbose form of newer releases (the webgpu provider's the same)
    "2020-03-15 12:34:54.824837445 [W:onnxruntime:Default, cuda_execution_provider.cc:1400 GetCapability] CUDA "
    "kernel not supported. Fallback to CPU execution provider for Op type: Conv node name: FeatureExtractor/dw",
    "[W:onnxruntime:, cuda_execution_provider.cc:2401 GetCapability] Fallback to CPU execution provider for Op type: "
    "LSTM node name: lstm_1",
    "[I:onnxruntime:, cuda_execution_provider.cc:2532 GetCapability] CUDA kernel not found in registries for Op "
    "type: GridSample node name: /grid_sample/GridSample",
])
def test_onnx_runtime_leaving_ops_to_the_cpu_provider_is_placement(record: str) -> None:
    d = _diagnose("Inference is slower with the CUDA provider than expected\nI run the model with onnxruntime-gpu "
                  "on a T4 and it is slow. The log says:\n" + record + "\n")
    ev = EvidenceSet(d.evidence)
    assert ev.value("report.ep_cpu_node_messages") == 1
    plc = next(f for f in d.findings if f.code == "PLC001")
    assert "leaving ops to its CPU provider for want of a GPU kernel" in plc.message
    assert plc.fixes[0].summary == "Give ONNX Runtime's GPU provider every op"
    assert "m:cpu_fallback" in ev.get("report.cues").value  # the report model reads it as the fall-back it is


def test_ort_placing_shape_ops_on_the_cpu_on_purpose_is_no_fallback() -> None:
    ev = EvidenceSet(_diagnose("[W:onnxruntime:, session_state.cc:1162 VerifyEachNodeIsAssignedToAnEp] Some nodes "
                               "were not assigned to the preferred execution providers which may or may not have an "
                               "negative impact on performance. e.g. ORT explicitly assigns shape related ops to CPU "
                               "to improve perf.\n").evidence)
    assert "report.ep_cpu_node_messages" not in ev


def test_a_title_naming_a_servers_slot_names_no_queue() -> None:
    """llama.cpp#10427 (sweep V): "Why server slot's cache_prompt is false by default?" names the server's unit of
    parallelism, a setting; QUE005 took it for a title naming queueing and committed at 0.92."""
    d = _diagnose("Why server slot's cache_prompt is false by default?\nIt makes prompt processing very slow.\n")
    ev = EvidenceSet(d.evidence)
    assert "concurrency" not in ev.get("report.title_concepts").value
    assert not any(f.code == "QUE005" and "in its title" in f.message for f in d.findings)
    # the server's parallel slots named in the plural, or beside concurrency, still name concurrency
    for title in ("Only 6 slots serve concurrent requests", "Slots: second request only starts after the first"):
        ev = EvidenceSet(_diagnose(title + "\nThe rest wait.\n").evidence)
        assert "concurrency" in ev.get("report.title_concepts").value, title


@pytest.mark.parametrize(("gpu", "slow"), [
    # FP16 no faster than FP32: Pascal but GP100 (1/64 rate), Maxwell/Kepler desktop parts, Turing's GTX 16xx
    ("a Quadro P6000", True), ("a GTX 1080 Ti", True), ("a Tesla P40", True), ("a Titan Xp", True),
    ("a Tesla K40m", True), ("a Tesla K80", True), ("a GRID K520", True),
    # Turing onwards: FP16 at twice FP32's rate, tensor cores or not (GTX 16xx); a "top-k40" or a phone is no GPU
    ("a GTX 1650", False), ("an RTX 4090 with top-k40 sampling", False), ("a Huawei P40 phone", False),
    # fast FP16: the P100 and the Jetsons at twice FP32's rate, tensor cores from Volta on (sweep X: an AGX Xavier
    # was read as a GPU without fast FP16)
    ("a Tesla P100", False), ("a Jetson AGX Xavier", False), ("a T4", False), ("a Jetson Nano", False),
    ("an RTX 3090", False),
])
def test_fp16_on_a_gpu_without_fast_half_precision(gpu: str, slow: bool) -> None:
    ev = EvidenceSet(_diagnose(f"FP16 is slower than FP32\nOn {gpu}, the FP16 engine takes 40 ms per image and the "
                               "FP32 one 35 ms.\n").evidence)
    assert ("report.fp16_on_slow_fp16_gpu" in ev) is slow
    # "half" as an amount is no precision
    ev = EvidenceSet(_diagnose(f"Slow inference\nOn {gpu} in fp32, inference takes half a second.\n").evidence)
    assert "report.fp16_on_slow_fp16_gpu" not in ev


def test_a_paste_with_nothing_to_go_on_is_undetermined_with_next_steps() -> None:
    d = _diagnose("Hi, it does not work for me. Any idea? Thanks!")
    assert d.primary is None and d.overall is Verdict.UNDETERMINED
    assert d.next_steps and any("diagnose attach --pid" in s for s in d.next_steps)


def test_cues_use_only_the_models_vocabulary() -> None:
    c = _claims("The prompt processing is slow, zzqqxx is not a word anybody else uses.").claims
    cues = derive_claims.cues(c)
    words = {k[2:] for k in cues if k.startswith("w:")}
    assert words <= derive_claims.vocabulary() and "zzqqxx" not in words
    assert cues["c:prefill"] > 0


def test_the_report_model_is_fitted_on_the_train_split_and_weighs_cues() -> None:
    m = report_model.model()
    assert m is not None
    assert m.meta["fitted_on"].endswith("train.jsonl") and m.meta["cases"] >= 300
    # its vocabulary comes from at least MIN_DOCS incidents: no single incident's phrase
    assert len(derive_claims.vocabulary()) > 500
    text = ("Multiple requests are processed sequentially\nWhen I send two requests at once, the second request "
            "is queued and waits until the first one finishes. Is there a way to serve them concurrently?")
    res = loose.analyze_stream("x", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    probs = m.predict(report_model.features(EvidenceSet(res.evidence)))
    assert max(probs, key=probs.__getitem__) == "queueing"


def test_fitting_is_deterministic_and_learns_separable_cues() -> None:
    xs = [{"c:queue": 1.0}, {"c:queue": 1.0, "c:slow": 1.0}, {"c:oom": 1.0}, {"c:oom": 1.0, "c:slow": 1.0}] * 3
    ys = ["queueing", "queueing", "oom_peak", "oom_peak"] * 3
    a = report_model.fit(xs, ys, [1.0] * len(xs), l2=0.01, iterations=300)
    b = report_model.fit(xs, ys, [1.0] * len(xs), l2=0.01, iterations=300)
    assert a.weights == b.weights
    p = a.predict({"c:oom": 1.0})
    assert max(p, key=p.__getitem__) == "oom_peak"


def test_prose_findings_without_a_measurement_carry_next_steps_only_when_undetermined() -> None:
    d = _diagnose("the second request waits until the first one finishes")
    findings, _ = run_rules(EvidenceSet(d.evidence))
    assert findings and findings[0].code == "QUE005"


@pytest.mark.parametrize("split", ["train", "validation"])
def test_the_prefilter_keeps_what_every_trigger_source_reads_on_real_incidents(split: str) -> None:
    """Every corpus incident read as a big log's tail (no head): each trigger source derives what it
    derives from every line (the trigger lists cover real reports, not only fixtures)."""
    from diagnose.collectors.logtext import clean_lines

    for line in (INCIDENTS / f"{split}.jsonl").read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        data = case["evidence"].encode()
        tail_sources = loose.new_sources()
        loose.read_into(tail_sources, io.BufferedReader(io.BytesIO(data)), head_bytes=0)  # type: ignore[arg-type]
        for tail_src, full_src in zip(tail_sources, loose.new_sources(), strict=True):
            if not getattr(tail_src, "triggers", ()):
                continue
            for ln in clean_lines(case["evidence"].splitlines()):
                full_src.feed(ln)
            full = {e.key: e.value for e in full_src.evidence("x")} if full_src.matched() else {}
            tail = {e.key: e.value for e in tail_src.evidence("x")} if tail_src.matched() else {}
            if getattr(tail_src, "free_text", False):
                assert tail.keys() <= full.keys(), (case["id"], tail_src.kind)
            else:
                assert tail.keys() == full.keys(), (case["id"], tail_src.kind, sorted(tail.keys() ^ full.keys()))


def test_ollama_ps_placement_is_its_column_not_a_persons_cpu_usage() -> None:
    """`ollama ps` prints where a model sits ('100% CPU' in its PROCESSOR column); a reporter's '100% CPU usage (so
    single core)' is a utilisation (private-gpt#1598: every layer on the GPU, a UI loop spinning one core), and
    committed device_placement at 0.91 before."""
    from diagnose.collectors.claims import MESSAGES

    rx = MESSAGES["ollama_cpu"]
    assert rx.search("llama3:8b    365c0bd3c000    5.1 GB    100% CPU     4 minutes from now")
    for said in ("I am seeing 100% CPU usage (so single core)", "100% CPU utilization on one core", "100% cpu",
                 "The API server process sits at 100% CPU (one core) during tokenization"):
        assert not rx.search(said), said
    assert MESSAGES["engine_build"].search("Building a new TensorRT engine for TRTEngineOp_0 with input shapes")


def test_a_queue_stated_empty_is_no_queue_statement() -> None:
    for text in ("vLLM waiting stays ~0 while the client has 72 requests in flight", "Waiting: 0 reqs",
                 "queue depth = 0",
                 # SGLang's stats line quoted in a sentence's backticks (sglang#22984): its empty queue field
                 "`Prefill batch, #new-seq: 1, #new-token: 2816, #running-req: 0, #queue-req: 0, #prealloc-req: 0,`"):
        assert _claims(text).claims.concepts["queue"] == 0, text
    for text in ("14 requests waiting", "requests spend 0.5 s waiting in the queue", "the queue is 0.8 s long",
                 # a queue that grows from 0 is a queue (a reviewer's cases)
                 "waiting: 0 → 14 under the ramp", "the queue: 0 -> 64 requests", "queue length 0–120 over the run",
                 "waiting 0 s at idle and 30 s at peak", "queue 0 ms then 300 ms", "the waiting time 0:45"):
        assert _claims(text).claims.concepts["queue"] == 1, text
    assert _claims("[Bug]: vLLM waiting stays ~0 but TTFT is 20 s").claims.title_concepts == {"ttft"}


def test_a_link_width_is_no_copy_named() -> None:
    """'PCIe x8' in a title says which slot the card sits in (club-3090#104, a power-cap sweep): no copies."""
    c = _claims("Dual 3090 (PCIe x8, power-capped) — 67 TPS").claims
    assert c.concepts["copy"] == 0 and c.concepts["pcie_link"] == 1
    for text in ("PCIe transfers are slow", "the copy over PCIe takes 30 ms", "PCIe bandwidth bound",
                 "Gen4 PCIe transfers dominate the step time", "PCIe 4.0 transfers are slow",
                 "the PCIe lanes are saturated"):
        assert _claims(text).claims.concepts["copy"] == 1, text
    assert _claims("Measured PCIe 3.2 GB/s during the upload").claims.concepts["pcie_link"] == 0  # a rate, no Gen 3
    assert _claims("Dual 3090 (PCIe x8, power-capped) — 67 TPS").claims.title_concepts == {"pcie_link"}


def test_a_bottleneck_said_to_appear_to_be_something_names_its_cause() -> None:
    got = _report("After profiling the render endpoint, the bottleneck appears to be the multimodal "
                  "preprocessing pipeline.\nIt is best explained by frontend preprocessing, not by GPU decode.")
    assert got["report.cause.preprocess"] == 2
    # a hypothesis set aside names no cause: "at first the bottleneck appeared to be the queue"
    got = _report("Slow responses from our vLLM server\nAt first the bottleneck appeared to be the request queue, but "
                  "it turned out to be the tokenizer.\n")
    assert "report.cause.queue" not in got


def test_weights_kept_in_host_memory_by_the_command_are_placement() -> None:
    """vllm#22692: `--cpu-offload-gb 16` in a multi-line `vllm serve` command and "6.4 Tokens/s": the offloaded
    weights cross PCIe at every forward pass (PLC001 leads the findings, withheld); an offload of 0 GB offloads
    nothing."""
    for cmd, n in (("vllm serve m --cpu-offload-gb 16", 1), ("vllm serve m --cpu-offload-gb 0", 0),
                   ("python -m sglang.launch_server --model-path x --cpu-offload-gb=8", 1),
                   ("llama-server -m x.gguf -ngl 99 --n-cpu-moe 20", 1),
                   ('llama-server -m x.gguf -ngl 99 -ot "blk\\.(1[0-9])\\.ffn_.*=CPU"', 1),
                   ("llm = LLM(model=m, cpu_offload_gb=10)", 1), ("llama-server -m x.gguf -ncmoe 30", 1),
                   ("llama-server -m x.gguf --cpu-moe", 1), ("llama-server -m x.gguf -ot exps=CUDA0", 0),
                   ('llama-server: command: ["-m", "x.gguf", "--override-tensor", ".ffn_.*_exps.=CPU"]', 1)):
        msgs = _claims(cmd).claims.messages
        assert msgs["weights_offloaded"] + msgs["tensors_on_cpu"] == n, cmd
        assert msgs["tensors_on_cpu"] == (n if "llama-server" in cmd else 0), cmd
    text = ("[Bug]: GLM4.5 infer speed slow\n\nvllm 0.10.0\n\nCLI:\nvllm serve /GLM-4.5-FP8 \\\n"
            "    --tensor-parallel-size 8 \\\n    --cpu-offload-gb 16 \\\n    --served-model-name glm-4.5-fp8\n\n"
            "Infer speed is: 6.4 Tokens/s\nIs this normal?\n")
    d = _diagnose(text)
    f = d.findings[0]
    assert f.code == "PLC001" and "--cpu-offload-gb 16" in f.message
    # withheld, a near tie with what the words weigh (0.36 each at the refit of 2026-12-07): the finding in the top two
    assert "device_placement" in [c.category for c in d.candidates[:2]]
    oom = _diagnose(text + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                           "capacity of 79.19 GiB of which 1.02 GiB is free.\n")
    assert not any("weights kept in host memory" in g.message for g in oom.findings)


def test_tensors_llama_cpp_keeps_on_the_cpu_are_computed_there_not_streamed() -> None:
    """llama.cpp#13735: `-ot exps=CPU` keeps the MoE experts on the CPU, where its threads compute them at every
    token; the message said they were copied to the GPU at every forward pass (vLLM's --cpu-offload-gb does that)."""
    text = ("llama-server token per second slow down\n\nllama-server.exe -m Qwen3-30B-A3B.gguf -ngl 99 -fa -c 40960 "
            "-ot \".ffn_.*_exps.=CPU\"\n\nIt went from 26 t/s to 16 t/s.\n")
    f = next(g for g in _diagnose(text).findings if g.code == "PLC001")
    assert "tensors kept on the CPU, computed there by its threads" in f.message
    assert "copied to the GPU" not in f.message
    # the setting on a line of its own in a multi-line command, the quote then not naming it (a reviewer's repro)
    f = next(g for g in _diagnose("llama-server slow after update\n\nllama-server -m Qwen3-30B-A3B.gguf -ngl 99 \\\n"
                                  "  --threads 16 \\\n  --n-cpu-moe 30\n\nIt went from 26 t/s to 16 t/s.\n").findings
             if g.code == "PLC001")
    assert "tensors kept on the CPU" in f.message


def test_a_model_split_over_gpus_is_judged_by_its_part_on_each() -> None:
    """A 70B model (about 130 GiB at 16 bits) with --tensor-parallel-size 8 on H100s holds about 16 GiB on each: no
    layer is left to the CPU (vllm#7604's benchmark command read as 'the layers that do not fit run on the CPU');
    without the split the same model does not fit one GPU."""
    body = ("TTFT is slow on H100\n\npython benchmarks/benchmark_throughput.py --model meta-llama/Llama-2-70b-hf "
            "--input-len 40000 --output-len 256 {tp}\n\nThe first token is very slow with 8 H100 GPUs.\n")
    split = _diagnose(body.format(tp="--tensor-parallel-size 8"))
    assert not any(f.code == "PLC001" for f in split.findings), [(f.code, f.message) for f in split.findings]
    whole = _diagnose(body.format(tp=""))
    assert any(f.code == "PLC001" and "the layers that do not fit run on the CPU" in f.message
               for f in whole.findings), [(f.code, f.message) for f in whole.findings]


def test_a_step_said_to_have_gone_well_is_no_complaint_about_it() -> None:
    """ollama#10814: "download and load a model fine" beside "Extremely slow" read as a first run that downloads
    (HLT003: expected behaviour, healthy committed at 0.97) where the reporter's complaint was a hang."""
    for text in ("I can download and load a model fine using `ollama run qwen2.5-coder:3b`.",
                 "successfully downloaded the weights", "the download went without any issues"):
        assert _claims(text).claims.concepts["download"] == 0, text
    # what follows a contrast, or a step that merely ran, is still named
    for text in ("the model is fine but the download takes 20 minutes", "downloading the model takes 20 minutes",
                 "the download is slow, the rest is fine", "fine-tuned weights download slowly"):
        assert _claims(text).claims.concepts["download"] == 1, text
    assert _claims("prefill is fine, decode is slow").claims.concepts["prefill"] == 0
    # a "fine" about another subject, a success denied or a step after it keeps the complaint (a reviewer's cases)
    for text, concept in (("decode is slow and everything else works fine", "decode"),
                          ("Prefill takes forever and the rest runs fine", "prefill"),
                          ("the tokenizer is the bottleneck and the model itself is fine", "preprocess"),
                          ("prefill is slow — decode is fine", "prefill"),
                          ("the scheduler queue grows - GPU looks fine", "queue"),
                          ("requests queue up as the GPU looks fine", "queue"),
                          ("the first request never completes successfully", "first"),
                          ("decode is not fine", "decode"),
                          ("the model loaded successfully and the first request hangs", "first"),
                          ("decode of our fine tuned model is slow", "decode")):
        assert _claims(text).claims.concepts[concept] == 1, text


def test_pinned_is_a_copy_term_only_where_it_is_memory() -> None:
    for text in ("use pinned memory for the copies", "pageable→pinned, then pinned→GPU", "| pinned, 1 call | 2.8 µs |",
                 "buffers pinned on the host", "memory pinned by cudaHostRegister",
                 "with pinned memory results improved by 2x"):
        assert _claims(text).claims.concepts["copy"] >= 1, text
    for text in ("32 cores of CPU are pinned at 100% while the GPU idles", "py-spy showed every process pinned in "
                 "forward", "The pinned prefill values predate #1061 and read high.", "with pinned versions of torch",
                 "the worker is pinned to core 0"):
        assert _claims(text).claims.concepts["copy"] == 0, text


def test_a_first_completion_waiting_for_a_trace_capture_is_a_cold_start() -> None:
    """tt-inference-server#56: the first completions at a new padded prefill length trigger a trace capture."""
    c = _claims("the first few completions will trigger tt-metal trace capture and take unexpectedly long").claims
    assert c.concepts["first"] == 1 and c.concepts["compile"] == 1
    assert _claims("the first completion at a new length waits 30 s").claims.concepts["first"] == 1
    # a profiler's trace is no compile
    for text in ("the nsys trace capture shows long gaps between kernels",
                 "the captured traces show the GPU idle 60% of the time"):
        assert _claims(text).claims.concepts["compile"] == 0, text


def test_a_gpu_utilisation_above_100_percent_is_another_quantity() -> None:
    """diart#222: "cpu utilization reaches 1000% according to htop, and sometimes 18000%. the gpu usage is relatively
    low at 515 MiB": the 18000 % continues the CPU's sentence; it was the GPU's utilisation (report.gpu_util_pct_max
    18000), a GPU busier than busy."""
    got = _report("High CPU usage\ncpu utilization reaches 1000% according to htop, and sometimes 18000%. the gpu "
                  "usage is relatively low at 515 MiB\n")
    assert "report.gpu_util_pct_max" not in got and got["report.cpu_util_pct_max"] == 1000.0
    got = _report("Slow inference\nGPU utilization is 35% while the CPU is at 100%.\n")
    assert got["report.gpu_util_pct_max"] == 35.0


def test_cuda_graphs_said_to_be_captured_are_no_sign_of_eager_launches() -> None:
    """A report saying its server captured CUDA graphs and answers slowly after idle (model-serving-minefield#37)
    read "discusses CUDA graphs" as launch overhead (GPU110); graphs said to be off still count."""
    on = _diagnose("Slow after idle\nThe server reports startup complete, CUDA graphs are captured, and it answers "
                   "correctly, but the first requests after idle are slow.\n")
    assert not any(f.code == "GPU110" for f in on.findings)
    off = _diagnose("Slow decode\nWith --enforce-eager decoding is slow; CUDA graphs are not captured.\n")
    assert any(f.code == "GPU110" for f in off.findings)
    # "CUDA graphs are one thing…" and a capture that fails say nothing of graphs being on (a second reviewer's)
    from diagnose.collectors.claims import CONCEPTS
    on_rx = re.compile(CONCEPTS["cuda_graph_on"], re.I)
    assert not on_rx.search("CUDA graphs are one thing, kernel fusion another")
    assert not on_rx.search("Capturing CUDA graphs fails, so we run it in eager mode")
    assert on_rx.search("cuda graphs are enabled but decode is slow")


def test_the_oom_messages_private_pools_are_no_word_about_cuda_graphs() -> None:
    """PyTorch's OOM message says what CUDA graphs' private pools hold whatever ran out ("with 19.40 MiB allocated in
    private pools (e.g., CUDA Graphs)"), as a paste wraps it too (local-inference-lab/rtx6kpro#103): no CUDA-graph
    statement of the reporter's, and no launch-overhead finding from it."""
    head = ("Delayed production CUDA OOM: long-context prefill exceeds profiled peak by ~3 GiB\n\n"
            "It is not fragmentation: at the moment of death only ~100 MiB was reserved-but-unallocated.\n"
            "RuntimeError: Worker failed with error 'CUDA out of memory. Tried to allocate 128.00 MiB.\n"
            "GPU 0 has a total capacity of 94.97 GiB of which 100.19 MiB is free.\n"
            "Including non-PyTorch memory, this process has 94.86 GiB memory in use.\n")
    for tail in ("Of the allocated memory 93.46 GiB is allocated by PyTorch, with 19.40 MiB allocated in\n"
                 "private pools (e.g., CUDA Graphs), and 100.28 MiB is reserved by PyTorch but unallocated.'\n",
                 "Of the allocated memory 93.46 GiB is allocated by PyTorch, with 19.40 MiB allocated in private pools "
                 "(e.g.,\nCUDA Graphs), and 100.28 MiB is reserved by PyTorch but unallocated.'\n",
                 "Of the allocated memory 93.46 GiB is allocated by PyTorch, with 19.40 MiB allocated in private\n"
                 "pools (e.g., CUDA Graphs), and 100.28 MiB is reserved by PyTorch but unallocated.'\n",
                 "Of the allocated memory 93.46 GiB is allocated by PyTorch, with 19.40 MiB allocated in private "
                 "pools\n(e.g., CUDA Graphs), and 100.28 MiB is reserved by PyTorch but unallocated.'\n"):
        assert "report.cuda_graph_statements" not in _report(head + tail)
        assert "GPU110" not in {f.code for f in _diagnose(head + tail).findings}
    # a person's own words about CUDA graphs still count, wrapped where PyTorch's template wraps too (a review's repro)
    said = _report(head + "Decoding got slow after we turned off CUDA graphs for the new model.\n")
    assert said.get("report.cuda_graph_statements")
    said = _report("Decode is slow on our H100 service.\nWe run the fast path (torch.compile with\nCUDA graphs), and "
                   "decode still takes 80 ms per token, 10x slower than eager.\n")
    assert said.get("report.cuda_graph_statements") and said.get("report.decode_ms_max") == 80.0


@pytest.mark.parametrize(("text", "held"), [
    ("We confirmed this by testing two models on b9933:", False),  # ggml-org/llama.cpp#26024: tried in turn
    ("I tried several models and all of them are slow.", False),
    ("Comparing two engines on the same card, vLLM is faster.", False),
    ("The OOM only happens with two models loaded on the GPU.", True),  # held at once
    ("Another process holds 6 GB of the card.", True),
    ("Memory is split between two models on one GPU.", True),
    ("When testing two models at the same time on one GPU, the second one OOMs.", True),  # a review's repro
])
def test_models_tried_in_turn_are_not_memory_held_elsewhere(text: str, held: bool) -> None:
    assert bool(_report("CUDA out of memory on an 8 GB card\n\n" + text + "\n").get(
        "report.held_elsewhere_statements")) is held, text


def test_tensorflow_without_its_cuda_libraries_runs_on_the_cpu() -> None:
    """TensorFlow's dso_loader could not load a CUDA runtime library its GPU device needs (mozilla/DeepSpeech#3226:
    libcudart.so.10.1 on a CUDA 10.2 host with a 2080 Ti, inference 2x slower): a CPU fall-back message; TensorRT's
    libnvinfer is optional and is not one. "Not a bug per se" after finding the cause withdraws nothing."""
    tf = ("2020-08-05 09:21:33.447482: W tensorflow/stream_executor/platform/default/dso_loader.cc:55] Could not load "
          "dynamic library '{lib}'; dlerror: {lib}: cannot open shared object file: No such file or directory")
    text = ("DeepSpeech inference runs 2x slower with 0.8 vs 0.7.4\n\nI'm using both on the same server with "
            "2080ti GPU and cuda 10.2.\n" + tf.format(lib="libcudart.so.10.1")
            + "\nInference took 1.577s for 4.821s audio file.\n"
            "The issue seems due to cuda version 10.2 vs 10.1. You can close the issue, as its not a bug per-se.\n")
    rep = _report(text)
    assert rep.get("report.tf_gpu_libs_messages") == 1 and "report.retraction_statements" not in rep
    d = _diagnose(text)
    assert d.verdict is not Verdict.HEALTHY and d.findings and d.findings[0].code == "PLC001"
    assert "report.tf_gpu_libs_messages" not in _report(tf.format(lib="libnvinfer.so.7") + "\n")
    assert _report("Cannot dlopen some GPU libraries. Please make sure the missing libraries mentioned above are "
                   "installed properly if you would like to use GPU. Skipping registering GPU devices...\n").get(
        "report.tf_gpu_libs_messages")
    # a PyTorch engine's log carries the same lines where transformers imported TensorFlow (a review's repro): its
    # GPU works, no placement finding from them
    vllm = ("vLLM serving slow on an A100\nINFO 05-01 10:00:00 llm_engine.py:100] Avg prompt throughput: 10 tokens/s, "
            "GPU KV cache usage: 45.0%\n" + tf.format(lib="libcudart.so.11.0") + "\n")
    assert "PLC001" not in {f.code for f in _diagnose(vllm).findings}
    assert _report("It was a false alarm: not a bug.\n").get("report.retraction_statements")


def test_a_cuda_graph_capture_timed_at_start_up_is_no_eager_launch_path() -> None:
    """vllm-project/vllm#16716 ("CUDA Graph Capturing time is too long", 65 s at launch with LoRA): CUDA graphs are
    on, their capture is timed at start-up; no launch-overhead commitment from the title. Extending capture to more
    of the step still speaks of launches outside the graphs."""
    text = ("[Bug]: vllm 0.8.3 v1 engine CUDA Graph Capturing time is too long\n\nWhen I launch vllm 0.8.3 server, the "
            "capture time of cuda graph is always 65s, is this normal? I think it is too long.\n")
    rep = _report(text)
    assert "cuda_graph" not in rep["report.title_concepts"]  # type: ignore[operator]
    d = _diagnose(text)
    assert d.verdict is not Verdict.BOTTLENECK or d.primary != "launch_overhead"
    said = _report("The decode loop is dominated by kernel-launch cost; extending CUDA Graph capture to the sampling "
                   "chain is next.\n")
    assert said.get("report.cuda_graph_statements") and not said.get("report.cuda_graph_on_statements")


@pytest.mark.parametrize(("text", "key", "said"), [
    ("The PCIe is also not doing much. The 3090s are both at PCIe x16 3.0.", "report.copy_statements", False),
    ("PCIe transfers are not the bottleneck here.", "report.copy_statements", False),  # turboderp-org/exllamav3#326
    ("Tokenization isn't the issue, it takes 2 ms.", "report.preprocess_statements", False),
    ("The copies are slow and PCIe is the bottleneck.", "report.copy_statements", True),
    ("Tokenization is the bottleneck, not the GPU.", "report.preprocess_statements", True),
    ("The PCIe copies take 40 ms but the GPU is not the bottleneck.", "report.copy_statements", True),  # a review
])
def test_a_thing_denied_as_the_cause_right_after_its_name_is_not_claimed(text: str, key: str, said: bool) -> None:
    assert bool(_report("Generation is slow on two 3090s\n\n" + text + "\n").get(key)) is said, text


def test_a_gpu_the_reporter_names_puts_one_in_view() -> None:
    # OpenAI-Whisper-GUI#13: whisper's own warning that it runs on the CPU, from a reporter who set the device to
    # the GPU; the GPU is named only in prose (the report's cues), which must count, or the placement is dropped
    # as "no GPU in view" and only the wording's lean is left
    from diagnose.rules.base import gpu_in_view

    text = ('GPU is not used even if you have set GPU.\n'
            'First of all i get this warning " UserWarning: FP16 is not supported on CPU; using FP32 instead\n'
            '  warnings.warn("FP16 is not supported on CPU; using FP32 instead")" \n'
            '  \n'
            '  And when i set the device to GPU and transcribe , My CPU usage spikes up to 100% and the process '
            'becomes painfully slow. GPU is not used at all.\n')
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    assert gpu_in_view(EvidenceSet(res.evidence))
    d = _diagnose(text)
    lead = d.findings[0]
    assert lead.code == "PLC001" and "report.cpu_fallback_messages" in {e.key for e in lead.evidence}
    # a text naming no GPU at all has none in view
    plain = "Transcription is slow.\nMy CPU usage spikes up to 100% and the process becomes painfully slow.\n"
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO(plain.encode())))  # type: ignore[arg-type]
    assert not gpu_in_view(EvidenceSet(res.evidence))


def test_a_cpu_torch_wheel_is_a_fallback_and_a_cpu_asked_for_is_none() -> None:
    # ultralytics#1495: the environment banner names a CPU-only torch wheel where the earlier one named CUDA
    c = _claims("Ultralytics YOLOv8.0.53 Python-3.9.1 torch-1.8.1+cu111 CUDA:0 (NVIDIA GeForce RTX 3070, 8192MiB)\n"
                "Ultralytics YOLOv8.0.54 Python-3.10.6 torch-2.0.0+cpu CPU\n").claims
    assert c.messages["cpu_fallback"] == 1
    gpu = _claims("YOLOv5 🚀 v6.1 torch 1.10.0+cu113 CUDA:0 (Tesla T4, 15110MiB)\n").claims
    assert gpu.messages["cpu_fallback"] == 0
    # whispering#76: started with --device cpu, the program's FP16 warning is what was asked for, no fall-back
    text = ("FP16-fp32 argument for using --device cpu\n## Description\n\nGot error :\n"
            "transcriber._set_dtype:35 WARNING -> FP16 is not supported on CPU; using FP32 instead\n\n"
            "when running :\nwhispering --language fr --model tiny --device cpu\n")
    assert _claims(text).claims.messages["cpu_fallback"] == 0
    assert "report.cpu_fallback_messages" not in _report(text)
    # ... and without the command the same warning is one
    assert _claims(text.replace("--device cpu\n", "\n")).claims.messages["cpu_fallback"] == 1


def test_a_gpu_used_less_than_another_is_no_placement_on_the_cpu() -> None:
    # ray#6962: "not utilizing the GPU nearly as much as the tensorflow version" compares how busy the GPU is
    for text in ("Perhaps the torch PPO implementation is not utilizing the GPU nearly as much as the tensorflow "
                 "version as on my systems torch is using 1394MB of GPU memory.",
                 "The GPU is not utilized fully during inference."):
        assert _claims(text).claims.concepts["placement_cpu"] == 0, text
    for text in ("It is not using the GPU at all.", "The GPU is not used, the CPU is at 100%.",
                 "whisper is not utilizing the GPU."):
        assert _claims(text).claims.concepts["placement_cpu"] == 1, text


def test_eager_mode_is_no_cause_of_a_first_token_regression() -> None:
    # vllm#39790: a TTFT regression with speculative decoding, the server run with --enforce-eager; CUDA graphs
    # replay the decode step, and "speculative decoding" names a method, not the decode phase
    text = ("[Performance]: Significant TTFT Regression with Speculative Decoding (EAGLE3)\n"
            "When enabling speculative decoding, I observe a substantial increase in Time-To-First-Token (TTFT), "
            "particularly at the P99 percentile.\n"
            "```bash\nvllm serve /path/to/Qwen3-8B \\\n    --port 8188 \\\n    --enforce-eager \\\n"
            "    --speculative-config '{\"method\": \"eagle3\", \"num_speculative_tokens\": 15}'\n```\n")
    assert "decode" not in _claims(text).claims.title_concepts
    assert not any(f.code == "GPU110" for f in _diagnose(text).findings)
    # the same flags under a report of slow decoding are eager mode's cost
    slow = text.replace("Significant TTFT Regression with Speculative Decoding (EAGLE3)", "Slow decode speed, 9 tok/s")
    assert any(f.code == "GPU110" for f in _diagnose(slow).findings)


def test_a_links_markdown_label_names_the_slot_not_a_copy() -> None:
    # club-3090#585: a rig report's bullet describes the link; it names no copy, so no "copies over the PCIe link"
    line = ("- **PCIe:** x4 lanes negotiated (GPU max x16, Gen up to 4) | bus 00000000:05:00.0 ⚠ slot is narrower than "
            "GPU capability — affects load + all-reduce bandwidth")
    c = _claims("[bug] degrading tps beyond 100k context\n\n" + line + "\n").claims
    assert c.concepts["pcie_link"] == 1 and c.concepts["copy"] == 0
    assert _claims("The PCIe transfers dominate the step.\n").claims.concepts["copy"] == 1


def test_memory_said_to_grow_run_after_run_weighs_against_one_inputs_peak() -> None:
    # llama.cpp#23446: "vram usage gradually increasing each run until OOM", beside a bigger context allocating more
    text = ("Misc. bug: llama-server vram usage gradually increasing each run until OOM\n"
            "this has the same behavior of allocating more vram when getting to a chat with a bigger context\n")
    assert _claims(text).claims.concepts["memory_grows"] >= 1
    found = {f.code: f for f in _diagnose(text).findings}
    assert "MEM009" in found and found["MEM007"].impact <= found["MEM009"].impact
    # one input's size alone with the error stays the peak's
    one = "CUDA out of memory with a bigger context\nIt fails when the prompt is longer than 8k tokens.\n"
    assert {f.code: f for f in _diagnose(one).findings}["MEM007"].impact >= 0.55


def test_ollamas_processor_split_is_the_share_of_the_model_on_the_cpu() -> None:
    # ollama#4668: `ollama ps` shows 43 % of a 6.8 GB model kept in system memory; those layers decode on the CPU
    text = ("Is this a normal behavior?  The overall performance is not satisfying, like 1-token-per-second.\n"
            "<pre>ollama ps\nNAME        \tID          \tSIZE  \tPROCESSOR      \tUNTIL               \n"
            "codellama:7b\t8fdf8f752f6e\t6.8 GB\t43%/57% CPU/GPU\t25 minutes from now</pre>\n")
    assert _claims(text).claims.ollama_cpu_share == 0.43
    lead = _diagnose(text).findings[0]
    assert lead.code == "PLC001" and "43%/57% CPU/GPU" in lead.message
    # all of it on the GPU (or a split that does not add up to the whole) is no such share
    assert _claims("llama3:8b  365c0bd3c000  6.7 GB  100% GPU  4 minutes from now\n").claims.ollama_cpu_share is None
    assert _claims("it used 43%/20% CPU/GPU over the run\n").claims.ollama_cpu_share is None


def test_an_images_input_size_is_no_prompts_length() -> None:
    # pytorch#2759 / keras-retinanet#91: "input size" in a vision report is the image's, not a prompt's length
    assert "prompt_len" not in _claims("Slow first inference for each new input size\n").claims.title_concepts
    assert "prompt_len" in _claims("TTFT grows with the input length\n").claims.title_concepts


def test_the_reviews_counter_examples_of_the_placement_and_growth_readers() -> None:
    # a person naming both wheels compares or replaces them: no fall-back message
    assert _claims("I had torch 2.0.1+cpu installed by mistake, so I reinstalled torch 2.0.1+cu118\n").claims \
        .messages["cpu_fallback"] == 0
    # a CPU run's command beside a GPU run's: a comparison, and which run printed a CPU message is not known; the
    # CPU run prints them as asked (second review: "--device cuda" anywhere had kept the CPU run's own warning)
    both = ("$ whispering --language fr --device cuda\n$ whispering --language fr --device cpu\n"
            "The CPU run prints: FP16 is not supported on CPU; using FP32 instead\n")
    assert _claims(both).claims.messages["cpu_fallback"] == 0
    # a CUDA wheel that still runs on the CPU is a fall-back; only the two wheels named together compare them
    assert _claims("torch 2.3.0+cu121 | CUDA available: False | Using device: cpu\n").claims \
        .messages["cpu_fallback"] == 1
    # a comma ends the clause: "not using the GPU, much slower" is placement
    assert _claims("It's not using the GPU, much slower than on colab\n").claims.concepts["placement_cpu"] == 1
    # latency or TTFT rising per turn is no memory growth; memory rising with the batch is a peak
    for text in ("TTFT increases with each turn of the conversation", "memory usage increases linearly with batch size",
                 "latency increases every run", "VRAM usage increases with larger batch sizes",
                 "GPU memory grows with the number of tokens"):
        assert _claims(text + "\n").claims.concepts["memory_grows"] == 0, text
    # a time after "PCIe:" is a copy's time, not a link generation
    assert _claims("per step: compute 12 ms, PCIe: 4 ms, sync 1 ms\n").claims.concepts["copy"] == 1


def test_a_gpu_asked_about_once_puts_none_in_view() -> None:
    from diagnose.rules.base import gpu_in_view

    text = ("Transcription is slow on my i5 laptop (no NVIDIA card).\nWould a GPU speed this up a lot?\n"
            "UserWarning: FP16 is not supported on CPU; using FP32 instead\n")
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    assert not gpu_in_view(EvidenceSet(res.evidence))
    # a GPU's use or state is no statement that the machine has none
    for said in ("Task manager shows no GPU usage at all and the CPU at 100%", "no GPU memory left",
                 "we don't have any GPUs free on the cluster", "no GPU found by the runner"):
        assert _claims(said + "\n").claims.concepts["no_gpu"] == 0, said
    assert _claims("My laptop has no NVIDIA card.\n").claims.concepts["no_gpu"] == 1


def test_a_titles_output_rate_is_decodes() -> None:
    # review: "TTFT and output tokens/s both regressed" names the decode too: eager mode may be its cost
    text = ("[Performance]: TTFT and output tokens/s both regressed after upgrading to 0.8.4\n"
            "```bash\nvllm serve /m \\\n    --enforce-eager \\\n    --port 8000\n```\n")
    assert any(f.code == "GPU110" for f in _diagnose(text).findings)


def test_transformers_pipeline_on_the_cpu_beside_a_gpu_is_a_fallback() -> None:
    # ComfyUI-Background-Replacement#8: transformers' own warning that a GPU is there and the model goes to the CPU
    line = ("Hardware accelerator e.g. GPU is available in the environment, but no `device` argument is passed to the "
            "`Pipeline` object. Model will be on CPU.")
    assert _claims(line + "\n").claims.messages["cpu_fallback"] == 1


def test_ollamas_scheduler_serving_one_request_at_a_time_is_queueing() -> None:
    # ollama#14638: the scheduler's own warning that the model takes no parallel requests, whatever OLLAMA_NUM_PARALLEL
    text = ("No parallel requests for qwen35moe\nI tried to send multiple requests to Ollama with python script "
            "manually, and it realized it doesn't work.\n"
            'time=2026-03-05T06:40:37.818-05:00 level=WARN source=sched.go:450 msg="model architecture does not '
            'currently support parallel requests" architecture=qwen35moe\n')
    d = _diagnose(text)
    assert d.findings[0].code == "QUE005" and "one request at a time" in d.findings[0].message
    assert "report.one_at_a_time_messages" in {e.key for e in d.findings[0].evidence}
    # ollama prints it at every load of such a model: with one request and nothing else running it is no queue
    alone = ("qwen3-vl is slow on my machine\nI send a single request with one image, nothing else running.\n"
             'time=2026-03-05T06:40:37.818-05:00 level=WARN source=sched.go:450 msg="model architecture does not '
             'currently support parallel requests" architecture=qwen3vl\n')
    assert not any("one request at a time" in f.message for f in _diagnose(alone).findings)


def test_a_first_runs_time_pairs_with_a_later_runs_a_clause_or_two_on() -> None:
    # onnxruntime#18272: "First Run call: 9 seconds. Cache files written." then "Second Run call: 25 ms."
    text = ("TensorRT provider does not use the cache it created\nFirst Run call: 9 seconds. Cache files written.\n\n"
            "Second Run call: 25 ms. (Same Ort::Session object).\n")
    assert _claims(text).claims.first_steady == [(9000.0, 25.0)]
    # "following" the docs, a warning "after 5 s" or a warm-up's time is no later run's
    for later in ("Following the docs I exported it, and the export took 90 ms per layer.",
                  "Then I get the following warning after 5 s.", "Warmup takes 35 s."):
        assert _claims("The first inference takes 12 seconds.\n" + later + "\n").claims.first_steady == [], later
    # a first run's time with no later one near it pairs with nothing
    far = ("First Run call: 9 seconds.\nThe machine has 8 cores.\nIt uses CUDA 12.\nThe model is small.\n"
           "Memory is fine.\nSecond Run call: 25 ms.\n")
    assert _claims(far).claims.first_steady == []


def test_a_ranges_first_end_shares_the_percent_of_its_second() -> None:
    # NVIDIA/DALI#2896: "GPU util switching between 0 and 100% in a pulse manner" is an oscillating GPU, not a saturated
    # one: both ends are utilisations, so the least stated is 0 %
    qs = quantities("GPU util switching between 0 and 100% in a pulse manner")
    assert [(q.dim, q.value) for q in qs if q.dim == "pct"] == [("pct", 0.0), ("pct", 100.0)]
    assert [(q.dim, q.value) for q in quantities("GPU util from 20 to 40%")] == [("pct", 20.0), ("pct", 40.0)]
    assert [q.value for q in quantities("batch 8 and 100% GPU") if q.dim == "pct"] == [100.0]  # no range: "and" alone
    assert [q.value for q in quantities("util 80-90% of max") if q.dim == "pct"] == [90.0]


def test_a_pasted_picture_is_no_words() -> None:
    """triton-inference-server/server#7318 pasted its Prometheus graphs as pictures ('![image](https://github.com/…
    /assets/…)'): GitHub's default alt text 'image' read as the workload's images, the report's lean to
    cpu_preprocessing. A picture's words are none; the sentences around it stay."""
    text = ("Uneven QPS leads to low throughput and high latency\n"
            "(3) nv_gpu_utilization\n"
            "![image](https://github.com/triton-inference-server/server/assets/49564050/67268089-b0a6-44fa-8569)\n"
            'see the graph <img width="600" alt="Screenshot image" src="https://user-images.githubusercontent.com/1/2.png">'
            " of the throughput\n"
            "There is a significant difference in the 99th percentile between the two.\n")
    words = _claims(text).claims.words
    assert not any("image" in w or "assets" in w or "screenshot" in w for w in words), sorted(words)
    assert "percentile" in words and "uneven" in words and "throughput" in words


def test_a_cold_requests_ttft_beside_its_compile_is_the_compiles() -> None:
    """sgl-project/sglang#36050 (sweep BM 10): "the first C4 request triggered a 1.07-second serving-time compile of
    `…extend_attention._fwd_kernel`; the first-batch maximum TTFT was 10.820 seconds". A short name between "first" and
    "request", and a compile as a noun, are read; the TTFT is the cold request's (CMP004), not prefill's (TTF002
    committed at 0.84 before). A TTFT with prefill named and nothing of compiling stays TTF002's."""
    text = ("[Spec] Warm multi-request extend attention before serving\n"
            "The built-in server warmup submits a single request. A concurrent prefill uses the generic runtime-batch "
            "specialization.\n"
            "For Qwen3.8-27B on one H20, the first C4 request triggered a 1.07-second serving-time compile of "
            "`sglang.kernels.ops.attention.extend_attention._fwd_kernel`; the first-batch maximum TTFT was 10.820 "
            "seconds.\n")
    d = _diagnose(text)
    assert d.primary != "prefill_ttft"
    assert any(f.code == "CMP004" for f in d.findings) and not any(f.code == "TTF002" for f in d.findings)
    plain = ("Slow time to first token with long prompts\n"
             "The prefill of each request takes long: the maximum TTFT was 10.820 seconds.\n")
    assert any(f.code == "TTF002" for f in _diagnose(plain).findings)
    # the first request and a compile in different sentences tie nothing; "the first token", a build "from source",
    # are neither (a review's repros)
    apart = ("Slow TTFT\nThe server starts fine and the warm-up finishes in 30 s.\nFrom the first request on, every "
             "request has a TTFT of 12 seconds. Prompt processing is the slow part.\n")
    assert any(f.code == "TTF002" and "12.00 s" in f.message for f in _diagnose(apart).findings)
    built = ("TTFT regression\nAfter a fresh compile of llama.cpp from source, TTFT is 12 seconds on the first token "
             "generation; prompt processing seems to be the slow part.\n")
    got = _report(built)
    assert not got.get("report.first_statements") and not got.get("report.compile_statements")


def test_pytorchs_eager_mode_alone_is_no_cuda_graph_talk() -> None:
    """pytorch/serve#1120 (sweep BL 05): 'TorchServe slower … than Eager inference', 'I ended up using Eager mode behind
    a Flask server': PyTorch's default execution set against a model server, not an engine's CUDA graphs turned off
    (GPU110 committed launch_overhead at 0.86). vLLM's 'enforcing eager mode' and --enforce-eager still are."""
    text = ("TorchServe slower (and lower GPU utilization) than Eager inference\n"
            "In my project I ended up using Eager mode behind a Flask server, which worked fine.\n")
    assert "report.cuda_graph_statements" not in _report(text)
    vllm = ("If you are running out of memory, consider decreasing `gpu_memory_utilization` or enforcing eager "
            "mode.\n")
    assert "report.cuda_graph_statements" in _report("vLLM runs slowly\n" + vllm)


def test_a_persons_using_cpu_is_no_frameworks_fall_back_message() -> None:
    """ultralytics/ultralytics#17799 (sweep AG 04): 'And i test that inference using cpu as below:' compares a CPU run
    the person made; read as a framework's fall-back message it committed device_placement at 0.85 beside a GPU run.
    A program's 'Using CPU. Note: …' opens its line, capitalised; 'No compatible GPU found, using CPU instead' stays."""
    assert "report.cpu_fallback_messages" not in _report("And  i test that inference using cpu as below:\n")
    for line in ("Using CPU. Note: This module is much faster with a GPU.\n", "[easyocr] Using CPU. Note\n",
                 "No compatible GPU found, using CPU instead\n", "> Using CPU\n",
                 "2024-05-01 10:00:00,123 - INFO - Using CPU\n", "WARNING: Running on CPU\n"):
        assert _report(line)["report.cpu_fallback_messages"] == 1, line
    # a person's sentence opening its line capitalised, or after their own "Result:", is still theirs (reviews' repros)
    assert "report.cpu_fallback_messages" not in _report("Running on CPU, each image takes 400 ms on my RTX 4090 box\n")
    assert "report.cpu_fallback_messages" not in _report("Result: Running on CPU takes 2 s per image\n")


def test_a_running_decode_stalled_by_anothers_prefill_is_the_prefills() -> None:
    """A long prompt's prefill holding the engine's steps while a stream decodes: local-inference-lab/vllm#541 (sweep
    BJ 07, 'A standalone/recovered decode: ~272.6 tok/s', 'A while B is prefilling: 6.62 tok/s'), FlashML FreeToken#484
    (BM 02, a table: 'victim alone … 59.4 tok/s', 'victim + one 200K-token prefill … 7.7 tok/s'), and one sentence
    'collapses the active lane from ~51–55 tok/s to 5.00 tok/s' beside 'the peer prefill' (BJ 06). QUE005 read the
    two requests as a queue; TTF002 names the prefill, with the ratio. A prefill's own rate ('B standalone 64K
    prefill: 7,009 tok/s') is no decode alone."""
    text = ("[Bug]: large chunked prefill starves concurrent decode\n"
            " * A standalone/recovered decode: ~272.6 tok/s\n"
            " * A while B is prefilling: **6.62 tok/s**\n"
            " * B standalone 64K prefill: **7,009 tok/s**\n")
    assert _report(text)["report.prefill_stall_ratio"] == round(272.6 / 6.62, 2)
    d = _diagnose(text)
    assert any(f.code == "TTF002" and "41× slower" in f.message for f in d.findings)
    table = ("Two requests, no other traffic:\n\n| run | victim wall | decode rate |\n|---|---|---|\n"
             "| victim **alone** | 11.8 s | **59.4 tok/s** |\n"
             "| victim **+ one 200K-token prefill** | 90.4 s | **7.7 tok/s** |\n")
    assert _report(table)["report.prefill_stall_ratio"] == round(59.4 / 7.7, 2)
    one = ("A cold 100K-token prefill admitted while another request is decoding collapses the active lane from "
           "~51–55 tok/s to 5.00 tok/s. Once the peer prefill finishes, it returns to ~55 tok/s.\n")
    assert _report(one)["report.prefill_stall_ratio"] == 11.0
    # two rates of one stream with no prefill beside the slow one: no stall; nor a contrast, nor batching (a review's
    # repros)
    assert "report.prefill_stall_ratio" not in _report("decode alone: 60 tok/s\nwith 8 users: 20 tok/s each\n")
    assert "report.prefill_stall_ratio" not in _report(
        "llama.cpp on CPU is slow\nBaseline with Q4_K_M: 20 tok/s generation.\nPrompt processing is 35 tok/s while "
        "generation is 4 tok/s with the Q8 model.\n")
    assert "report.prefill_stall_ratio" not in _report(
        "Batching\nSingle request alone: 60 tok/s\nPrefill: 9000 tok/s, decode: 12 tok/s per request with 32 "
        "concurrent requests\n")
    assert _report("Decode alone: 60 tok/s.\nWhile a long prefill runs, decode drops to 5 tok/s.\n")[
        "report.prefill_stall_ratio"] == 12.0


def test_several_engines_started_on_one_gpu_hold_memory_beside_each_other() -> None:
    """vllm-project/vllm#9198: 'initializing multiple LLM classes simultaneously on the same GPU' before vLLM's 'No
    available memory for the cache blocks': each instance's weights and cache sit beside the others' (memory held
    elsewhere). Several inputs or batch sizes tried on one GPU are none."""
    said = _report("[Bug]: initializing multiple LLM classes simultaneously on the same GPU get an error\n"
                   "When initializing multiple LLM classes simultaneously on the same GPU results in an error.\n")
    assert said.get("report.held_elsewhere_statements")
    for text in ("I run two models on one GPU and it fails.\n", "We serve several replicas on a single GPU.\n"):
        assert _report(text).get("report.held_elsewhere_statements"), text
    for text in ("It fails with multiple images on the same GPU.\n", "I tested 3 batch sizes on one GPU.\n",
                 "My model runs on a single GPU.\n", "I evaluated 3 models on a single GPU, one after the other.\n",
                 "How to fit Llama 2 models on a single GPU?\n"):
        assert not _report(text).get("report.held_elsewhere_statements"), text


def test_an_engines_size_limit_raised_before_an_oom_is_the_inputs_size() -> None:
    """NVIDIA/TensorRT-LLM#210 (sweep BN 03): 'I added max_input_len to 3500 (the default value is 2048) … After
    changing it to 3500, OOM will occur': the build-time limit sizes the activations, a runtime peak (MEM007), as
    vLLM's max_num_seqs / max_num_batched_tokens and TGI's max_total_tokens do."""
    text = ("build engine add max_input_len param\nI have two 3090 gpus, each has 24G memory.\n"
            "When using build.py, I added max_input_len to 3500 (the default value is 2048). After changing it to "
            "3500, OOM will occur.\n")
    assert _report(text).get("report.input_size_statements")
    assert any(f.code == "MEM007" for f in _diagnose(text).findings)
    for said in ("we set max_num_seqs to 512", "after raising max-num-batched-tokens", "we raised max_total_tokens",
                 "TGI's max_batch_total_tokens was raised"):
        assert _report(said + "\n").get("report.input_size_statements"), said
    for said in ("the max temperature was high", "we set --max-batch-delay to 10", "we set --max-total-time to 5"):
        assert not _report(said + "\n").get("report.input_size_statements"), said


def test_an_oom_a_fix_avoids_is_the_oom_it_fixed() -> None:
    """vllm-project/speculators#800 (sweep BQ 08), 'fix(test): reduce vLLM gpu_memory_utilization to avoid CUDA OOM in
    MTP regression': the OOM the fix avoids is the one that happened. A review proposed reading 'avoid OOM' as no OOM
    ('Avoiding OOM makes prefill very slow'); with it this fix PR read as healthy pre-allocation at 0.97."""
    text = ("fix(test): reduce vLLM gpu_memory_utilization to avoid CUDA OOM in MTP regression\n"
            "The test runs a vLLM server and training concurrently on the same GPU.\n")
    assert _report(text).get("mem.oom_count") == 1
    assert _diagnose(text).verdict is not Verdict.HEALTHY


def test_a_fixs_title_about_a_memory_setting_is_no_expected_preallocation() -> None:
    """sgl-project/sglang#5893 (sweep BQ 07), '[fix] relax mem_fraction_static for h200' over CUDA-graph capture logs
    ('mem usage=6.22 GB. avail mem=5.61 GB'): HLT003 read the title's memory fraction as expected pre-allocation and
    committed healthy at 0.97; a fix's title says something failed. A question about the same setting stays HLT003's."""
    logs = ("```\n[2025-04-29 16:19:34 TP7] Capture cuda graph end. Time elapsed: 56.90 s. mem usage=6.22 GB. avail "
            "mem=5.61 GB.\n```\n")
    fix = _diagnose("[fix] relax mem_fraction_static for h200\n" + logs)
    assert fix.verdict is not Verdict.HEALTHY and not any(f.code == "HLT003" for f in fix.findings)
    asked = _diagnose("Why does mem_fraction_static reserve most of the GPU memory at startup?\n" + logs)
    assert any(f.code == "HLT003" for f in asked.findings)
    from diagnose.rules.report import _FIX_TITLE
    assert _FIX_TITLE.match("fix(test): reduce vLLM gpu_memory_utilization") and _FIX_TITLE.match("[Bugfix] x")
    for title in ("Fix vLLM using 90% of GPU memory when idle?", "Fixed-size batches are slow", "Fixed size KV cache",
                  "Hotfix release 0.6.3.post1 uses 90%"):  # a question, an adjective, a release (a review's repros)
        assert not _FIX_TITLE.match(title), title


def test_a_cuda_graph_capture_timed_at_start_up_is_a_cold_start() -> None:
    """sgl-project/sglang#3902 (sweep BR 07): 'service restart … requires about 10-minute CUDA Graph capture process
    before becoming operational', titled 'Allow Serving Requests During CUDA Graph Capture': a time written as an
    adjective ('10-minute', '1.07-second') is a time, the capture is graphs being made (no eager mode), and GPU110's
    title signal no longer committed launch_overhead (0.89) on it: CMP004 states the 600 s."""
    assert [q.value for q in quantities("requires about 10-minute CUDA Graph capture process")] == [600_000.0]
    assert [q.value for q in quantities("a 1.07-second serving-time compile")] == [1070.0]
    assert quantities("a x86-64 build of Llama-3-8B") == []
    # a flag's letter after a number, and a GPU's model after a count, are no times (a review's repros)
    assert [q.dim for q in quantities("With -n 128 -s 42 decoding runs at 3 tok/s")] == ["rate"]
    assert [q.value for q in quantities("TTFT with an 8-H100 node is 900 ms")] == [900.0]
    assert quantities("on 8 H100 GPUs") == []
    text = ("[Feature] Allow Serving Requests During CUDA Graph Capture\n"
            "When `--enable-cuda-graph`, service restart currently requires about 10-minute CUDA Graph capture process "
            "before becoming operational (longer with torch.compile enabled).\n")
    d = _diagnose(text)
    assert d.primary != "launch_overhead"
    assert any(f.code == "CMP004" and "600.00 s" in f.message for f in d.findings)


def test_a_core_spinning_on_the_gpus_completion_is_the_host_waiting() -> None:
    """ninfer#301: a worker that spin-waits in cudaStreamSynchronize holds a core at 100 % while the GPU works: no
    launch overhead, no threads contending. A spin with no device in its clause (OpenMP's threads spinning on each
    other) and a core pegged by launches keep their readings."""
    from diagnose.collectors.claims import _concepts_in

    def names(clause: str) -> set[str]:
        return {n for _, _, n in _concepts_in(clause)}

    title = ("Engine worker spin-waits on CUDA synchronization, holding one CPU core at 100% while the GPU is busy")
    assert not names(title) & {"launch", "contention", "cores", "threads"}, names(title)
    assert "contention" not in names("When the host has more CPU cores than active CUDA contexts, Auto resolves to "
                                     "spin-waiting")
    assert "contention" in names("the OpenMP threads spin-wait on each other")
    assert "launch" in names("one CPU core at 100% launching small kernels")


def test_the_os_and_cpp_runtimes_words_for_memory_run_out_are_an_oom() -> None:
    """PsycherosAI/Psycheros#47: "the host reached its Windows commit limit, causing `bad allocation`" (std::bad_alloc
    on MSVC) and "exhaust system commit" are the host's memory running out; its title's "tokenizer config" is a
    setting the tokenizer lacks, not tokenising work."""
    from diagnose.collectors.claims import _concepts_in

    for clause in ("the host reached its Windows commit limit, causing `bad allocation`",
                   "terminate called after throwing an instance of 'std::bad_alloc'",
                   "can then cause an extreme ONNX/native allocation and exhaust system commit",
                   "OSError: [Errno 12] Cannot allocate memory"):
        assert "oom" in {n for _, _, n in _concepts_in(clause)}, clause
    for clause in ("Bound local embedding inputs when tokenizer config omits model_max_length",
                   "the tokenizer.json has no chat template", "the tokenizer's chat template adds a BOS"):
        assert "preprocess" not in {n for _, _, n in _concepts_in(clause)}, clause
    assert "preprocess" in {n for _, _, n in _concepts_in("the tokenizer takes 80 % of the request time")}


def test_an_engine_that_cannot_save_what_it_built_builds_it_at_every_start() -> None:
    """dusty-nv/jetson-inference#1644: TensorRT's engine could not be written to the read-only model folder, so each
    start profiled and built it again: CMP004 names it from the machine's line alone."""
    text = ("ssd-mobilenetv2 takes some time.\n"
            "Every time I run detectnet it takes forever to start running\n"
            "[TRT]    network profiling complete, saving engine cache to /usr/local/bin/networks/SSD-Mobilenet-v2/"
            "ssd_mobilenet_v2_coco.uff.1.1.8201.GPU.FP16.engine\n\n"
            "[TRT]    failed to open engine cache file for writing /usr/local/bin/networks/SSD-Mobilenet-v2/"
            "ssd_mobilenet_v2_coco.uff.1.1.8201.GPU.FP16.engine\n")
    assert _report(text).get("report.engine_cache_unsaved_messages") == 1
    v = _diagnose(text)
    assert v.primary is not None and v.primary.value == "recompilation" and v.findings[0].code == "CMP004", v
    assert "report.engine_cache_unsaved_messages" not in _report(text.replace("failed to open", "opened"))


def test_a_numbered_prompt_is_an_item_of_a_run_not_its_prefill() -> None:
    """transformers#34692: a script's "Finished processing prompt 0 at … - 553.68 seconds elapsed in total for this
    prompt" times a whole generation; "processing the prompt" and llama.cpp's "prompt processing" stay the prefill."""
    from diagnose.collectors.claims import _concepts_in

    def names(clause: str) -> set[str]:
        return {n for _, _, n in _concepts_in(clause)}

    assert "prefill" not in names("Finished processing prompt 0 at 2024-11-11T13:25:36 - 553.680202 seconds elapsed")
    assert "prefill" not in names("processing prompt #12 took 40 s")
    assert "prefill" in names("processing the prompt takes 40 s before the first token")
    assert "prefill" in names("prompt processing is slow: 1186 tokens per second")


def test_what_a_review_found_in_the_host_spin_and_tokenizer_vetoes() -> None:
    """The spin must wait on the device right after it, and a concept named outright stays; the tokenizer's config as
    one word is a setting, and a tokenizer's work timed in its own sentence stays pre-processing."""
    from diagnose.collectors.claims import _concepts_in

    def names(clause: str) -> set[str]:
        return {n for _, _, n in _concepts_in(clause)}

    spin2 = ("Throughput is bad: nvidia-smi shows the GPU at 15% and htop shows 32 torch threads busy-waiting on all "
             "cores, heavy CPU contention")
    assert {"contention", "threads"} <= names(spin2)
    assert "launch" in names("each decode step launches hundreds of tiny kernels and the Python thread is polling the "
                             "CUDA stream, launch overhead dominates")
    assert "preprocess" not in names("I edited tokenizer_config.json to set model_max_length")
    for timed in ("the tokenizer's chat template rendering takes 800 ms per request on the API server's CPU",
                  "Tokenizer files are re-read from disk for every request, about 600 ms each"):
        assert "preprocess" in names(timed), timed
    # a title that is a paragraph: the time in another sentence does not keep the tokenizer's config
    assert "preprocess" not in names("Responses are cut off. I edited tokenizer_config.json and the chat_template, "
                                     "still the same. Latency is 9 s per request.")


def test_what_a_second_review_found_in_the_prompt_number_and_load_flag_readings() -> None:
    """A prompt's length after "processing prompt" is no item number; a load generator's cap bounds its rate of inf,
    and a concurrency range is read at its upper end."""
    from diagnose.collectors.claims import _concepts_in

    assert "prefill" in {n for _, _, n in _concepts_in("processing prompt 8192 tokens takes 12 seconds")}
    assert "prefill" in {n for _, _, n in _concepts_in("processing prompts 8k tokens long takes 12 seconds")}
    assert "prefill" not in {n for _, _, n in _concepts_in("Finished processing prompt 2 at 13:44:00")}
    for command, load in (("$ python benchmarks/benchmark_serving.py --request-rate inf --max-concurrency 1", 1.0),
                          ("$ perf_analyzer -m model --concurrency-range 1:8", 8.0),
                          ("$ vllm bench serve --request-rate inf --num-prompts 100", float("inf"))):
        assert _report(command).get("report.load_concurrency") == load, command
