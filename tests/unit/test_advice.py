"""Version-aware advice: the engine's generation is read from its own log lines, and the advice follows it."""

from __future__ import annotations

import io

import pytest

from diagnose import loose, pipeline
from diagnose.derive.oom import HintsSource
from diagnose.model import Evidence, EvidenceSet, Quality
from diagnose.rules import advice


def _hints(*lines: str) -> EvidenceSet:
    src = HintsSource()
    for line in lines:
        src.feed(line)
    return EvidenceSet(src.evidence("test"))


@pytest.mark.parametrize(("line", "version", "generation"), [
    ("INFO 05-06 [core.py:61] Initializing a V1 LLM engine (v0.8.5) with config: model='Qwen/Qwen3-8B'", "0.8.5", "V1"),
    ("INFO 06-20 llm_engine.py:161] Initializing an LLM engine (v0.5.0.post1) with config: model=", "0.5.0", "V0"),
    ("INFO 04-02 [api_server.py:1043] vLLM API server version 0.9.1", "0.9.1", "V1"),
    ("pip list says vllm==0.6.4 and torch 2.5.1", "0.6.4", "V0"),
])
def test_generation_from_the_engine_banner(line: str, version: str, generation: str) -> None:
    ev = _hints(line)
    assert ev.get("serving.engine_version").value == version  # type: ignore[union-attr]
    assert advice.vllm_generation(ev) == generation


def test_v1_markers_outrank_an_unknown_version() -> None:
    ev = _hints("(EngineCore_0 pid=2412) INFO 07-01 [gpu_model_runner.py:1329] Model loading took 14.99 GiB")
    assert advice.vllm_generation(ev) == "V1"
    v0 = _hints("INFO 03-01 metrics.py:341] Avg prompt throughput: 0.0 tokens/s, Running: 4 reqs, Swapped: 0 reqs, "
                "Pending: 12 reqs, GPU KV cache usage: 99.1%, CPU KV cache usage: 0.0%.")
    assert advice.vllm_generation(v0) == "V0"


def test_advice_names_what_the_version_defaults_to() -> None:
    v1 = _hints("Initializing a V1 LLM engine (v0.10.1) with config")
    v0 = _hints("Initializing an LLM engine (v0.6.3) with config")
    unknown = EvidenceSet([])
    assert advice.chunked_prefill(v1).startswith("vLLM V1 chunks prefills by default")
    assert "--enable-chunked-prefill" in advice.chunked_prefill(v0)
    assert "V1" in advice.chunked_prefill(unknown) and "V0" in advice.chunked_prefill(unknown)
    assert "--enable-prefix-caching" not in advice.prefix_caching(v1)
    assert "256" in advice.max_num_seqs(v0) and "1024" not in advice.max_num_seqs(v0)


def test_the_engine_in_use_comes_first() -> None:
    tgi = EvidenceSet([Evidence("serving.engine", "tgi", "name", "test")])
    assert advice.serving_capacity(tgi)[0].startswith("TGI: --max-concurrent-requests")
    assert advice.serving_capacity(EvidenceSet([]))[0].startswith("vLLM")


def test_a_queue_bound_by_compute_names_the_engines_own_budget_and_gauge() -> None:
    """LMDeploy's stats lines (vLLM's fields after its "[date DP0]") queue with the KV cache a third used: the
    engine's per-step token budget and its waiting gauge are LMDeploy's, not vLLM's max_num_batched_tokens and
    vllm:num_requests_waiting; with no engine known both of the common ones are named."""
    lines = [f"[2025-07-01 12:00:{i:02d} DP0] Avg prompt throughput: 120.5 tokens/s, Avg generation throughput: "
             f"300.1 tokens/s, Running: 4 reqs, Waiting: {12 + i % 3} reqs, GPU KV cache usage: 35.0%"
             for i in range(6)]
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO("\n".join(lines).encode())))  # type: ignore[arg-type]
    d = pipeline.judge(EvidenceSet(res.evidence), inputs=res.inputs)
    top = d.findings[0]
    assert top.code == "QUE002" and "(LMDeploy --max-prefill-token-num)" in top.message
    steps = [step for fix in top.fixes for step in fix.steps]
    assert "Autoscale on the queue depth (lmdeploy:num_requests_waiting)" in steps
    assert "vllm:" not in " ".join(steps) and "max_num_batched_tokens" not in top.message
    assert advice.step_budget(EvidenceSet([])) == "vLLM --max-num-batched-tokens, SGLang --chunked-prefill-size / " \
                                                  "--max-prefill-tokens"
    sglang = EvidenceSet([Evidence("serving.engine", "sglang", "name", "test")])
    assert advice.queue_gauge(sglang) == "sglang:num_queue_reqs"


def test_gpu_named_without_its_size_is_an_assumption() -> None:
    ev = _hints("OOM on an A100 while serving Llama-2-13b")
    got = ev.get("gpu.spec_memory_bytes")
    assert isinstance(got, Evidence) and "assumed" in got.detail and "40 or 80" in got.detail
    sized = _hints("OOM on an A100 80GB while serving Llama-2-13b").get("gpu.spec_memory_bytes")
    assert isinstance(sized, Evidence) and "assumed" not in sized.detail


def test_a_ti_or_super_part_is_not_the_plain_number() -> None:
    """A Ti or Super part differs in memory from its number's plain part ("2080 Ti" 11 GB, "2080" 8 GB; "3060 Ti"
    8 GB, "3060" 12 GB), written with a space, a hyphen or glued (mozilla/DeepSpeech#3226's "2080ti GPU")."""
    from diagnose.collectors.oom import gpu_named
    cases = [("on an RTX 2080 Ti with cuda 10.2", "2080 TI", 11), ("same server with 2080ti GPU", "2080 TI", 11),
             ("RTX 2080-Ti", "2080 TI", 11), ("an RTX 2080 card", "2080", 8), ("RTX 3060 Ti", "3060 TI", 8),
             ("RTX 3060", "3060", 12), ("RTX 4070 Ti Super", "4070 TI SUPER", 16),
             ("NVIDIA A100-SXM4-80GB", "A100", 80), ("MI300X GPUs", "MI300X", 192)]
    for text, model, gib in cases:
        got = gpu_named(text)
        assert got is not None and got.model == model and got.memory_bytes == gib * 2**30, (text, got)
    ti = gpu_named("a 4060 Ti GPU")
    assert ti is not None and ti.assumed == (8, 16)  # sold with 8 and 16 GB
    assert gpu_named("tinyllama-L4-H256.gguf") is None
    # a case-blind match of other letters (Turkish "Tİ") is no crash (a review's repro): the plain part is read
    turkish = gpu_named("Ollama slow on my RTX 3060 Tİ")
    assert turkish is not None and turkish.model == "3060"


def test_a_gpu_named_by_its_brand_or_its_models_own_word() -> None:
    """ollama#1236's "nvida 1660 ti" (a Ti names a GPU, whatever precedes it), GTX and Radeon prefixes, "NVIDIA"
    before a number; a bare number stays none ("took 4090 ms")."""
    from diagnose.collectors.oom import gpu_named
    for text, model in [("with nvida 1660 ti", "1660 TI"), ("GTX 1080", "1080"), ("GeForce GTX 1070 with 8GB", "1070"),
                        ("NVIDIA 4090", "4090"), ("Radeon RX 7900 XTX", "7900 XTX")]:
        got = gpu_named(text)
        assert got is not None and got.model == model, (text, got)
    assert gpu_named("the request took 4090 ms") is None and gpu_named("the 1080 build") is None
    assert gpu_named("-rw-r--r-- 1 me staff 910B Mar 3 10:02 config.json") is None  # a file's size, no Ascend


def test_a_bare_model_number_a_person_owns_is_a_gpu() -> None:
    """"I have a 3060 and a core i9-12900kf" (a whisper front-end's report), "my 3090 to slow down", "why is the A100
    as fast as the 3090?": a determiner before the number and a clause going on after it name the GPU; "the 1080
    build", "a 4090 tokens run" and "took 4090 ms" stay none."""
    from diagnose.collectors.oom import gpu_named
    for text, model in [("I have a 3060 and a core i9-12900kf", "3060"), ("caused my 3090 to slow down", "3090"),
                        ("I have a 3090 and get 20 fps on 1080p video", "3090"),  # a picture word further on
                        ("about the same speed as the 3090?", "3090"), ("the 5090's VRAM fills up", "5090"),
                        ("I use a 4090 on a Runpod server", "4090")]:
        got = gpu_named(text)
        assert got is not None and got.model == model, (text, got)
    for text in ("the 1080 build", "a 4090 tokens run", "the request took 4090 ms", "page 2080 of the log",
                 "decoding a 1080 and a 4K stream at once", "each frame is a 1080 with 3 channels",
                 "set width to the 2080 and height"):  # a picture's size beside it (a review's repros)
        assert gpu_named(text) is None, text


def test_an_ollama_tag_without_a_quantisation_is_ollamas_4_bit_default() -> None:
    """ollama#1236: deepseek-coder:6.7b pulled through ollama is a 4-bit GGUF (about 4 GB), not 13.4 GB of fp16."""
    ev = _hints("ollama falls back to CPU for deepseek-coder:6.7b on a 1660 Ti")
    got = ev.get("mem.weights_estimate_bytes")
    assert isinstance(got, Evidence) and got.value == int(6.7e9 * 0.6) and "ollama's default" in got.detail
    assert got.quality is Quality.LOW and "assumed" in got.detail  # an assumption, as 16-bit's is
    tagged = _hints("ollama runs llama2:13b-chat-q8_0 slowly").get("mem.weights_estimate_bytes")
    assert isinstance(tagged, Evidence) and "8-bit" in tagged.detail  # the tag names its quantisation
    f16 = _hints("ollama run llama3:8b-instruct-f16 is slow").get("mem.weights_estimate_bytes")
    assert isinstance(f16, Evidence) and f16.value == int(8e9 * 2) and f16.quality is Quality.GOOD
    moe = _hints("ollama run mixtral:8x7b runs out of memory").get("mem.weights_estimate_bytes")
    assert isinstance(moe, Evidence) and moe.value == int(56e9 * 0.6)
    hf = _hints("vllm serve deepseek-ai/deepseek-coder-6.7b-instruct").get("mem.weights_estimate_bytes")
    assert isinstance(hf, Evidence) and hf.value == int(6.7e9 * 2)  # no ollama, no ollama default
