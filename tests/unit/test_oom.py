"""OOM messages in every historical form, framework OOMs, phases and model hints → mem.* evidence."""

from __future__ import annotations

import io
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose import loose
from diagnose.collectors.logtext import clean_lines
from diagnose.collectors.oom import (
    Frame,
    HintsParser,
    OomParser,
    frame_phase,
    parse_allocator_message,
    parse_size,
    phase_of,
)
from diagnose.derive.oom import HintsSource, OomSource
from diagnose.model import EvidenceSet, Quality
from diagnose.rules.engine import run_rules
from diagnose.rules.registry import RULES
from tests.conftest import DATA

GiB = 1 << 30
MiB = 1 << 20
OOM = os.path.join(DATA, "oom")


def _lines(name: str) -> list[str]:
    with open(os.path.join(OOM, name), encoding="utf-8") as fh:
        return list(clean_lines(fh.readlines()))


def _evidence(name: str) -> dict[str, object]:
    srcs = [OomSource(), HintsSource()]
    for line in _lines(name):
        for s in srcs:
            s.feed(line)
    return {e.key: e.value for s in srcs if s.matched() for e in s.evidence(name)}


def _near(x: object, want: float, tol: float = 0.01) -> bool:
    assert isinstance(x, int | float)
    return abs(float(x) - want) <= tol * abs(want)


def test_sizes_in_every_unit() -> None:
    assert parse_size("79.35 GiB") == int(79.35 * GiB)
    assert parse_size("145.19 MiB") == int(145.19 * MiB)
    assert parse_size("512.00 KiB") == 512 * 1024
    assert parse_size("2 GB") == 2 * GiB  # torch 1.x and vLLM print GB meaning GiB (diagnose.units)
    assert parse_size("300 MB") == 300 * MiB
    assert parse_size("4096 bytes") == 4096
    assert parse_size("no size here") is None


def test_legacy_message() -> None:
    ev = parse_allocator_message(
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 160.00 MiB (GPU 0; 79.35 GiB total "
        "capacity; 78.58 GiB already allocated; 145.19 MiB free; 78.58 GiB reserved in total by PyTorch) If reserved "
        "memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation."
    )
    assert (ev.device, ev.device_index) == ("GPU", 0)
    assert ev.requested == 160 * MiB
    assert ev.total == int(79.35 * GiB) and ev.free == int(145.19 * MiB)
    assert ev.allocated == ev.reserved == int(78.58 * GiB)
    assert ev.reserved_unallocated == 0
    assert not ev.truncated


def test_oldest_message_counts_cached_as_reserved_but_unallocated() -> None:
    """PyTorch 1.0-1.3 ended its message with "X cached": its cached blocks less the allocated bytes (the
    allocator's ``amount_cached - amount_allocated``), so allocated + cached + free stays within the device."""
    ev = parse_allocator_message(
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.75 GiB total capacity; 9.12 GiB "
        "already allocated; 1.10 GiB free; 4.96 GiB cached)")
    assert ev.allocated == int(9.12 * GiB) and ev.reserved_unallocated == int(4.96 * GiB)
    assert ev.reserved == ev.allocated + ev.reserved_unallocated and not ev.truncated
    src = OomSource()
    src.feed("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.75 GiB total capacity; 9.12 GiB "
             "already allocated; 1.10 GiB free; 4.96 GiB cached)")
    assert {e.key: e.value for e in src.evidence("t")}["mem.reserved_minus_allocated_bytes"] == int(4.96 * GiB)


def test_legacy_message_with_allowed_limit() -> None:
    ev = parse_allocator_message(
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 1; 23.69 GiB total capacity; 10.1 GiB "
        "already allocated; 11.2 GiB free; 12.0 GiB allowed; 10.5 GiB reserved in total by PyTorch)"
    )
    assert ev.device_index == 1 and ev.limit == 12 * GiB and ev.reserved_unallocated == int(10.5 * GiB) - int(
        10.1 * GiB)


def test_modern_message_with_typo_and_private_pools() -> None:
    ev = parse_allocator_message(
        "OutOfMemoryError('CUDA out of memory. Tried to allocate 138.00 MiB. GPU 0 has a total capacty of 79.15 GiB "
        "of which 2.19 MiB is free. Including non-PyTorch memory, this process has 79.12 GiB memory in use. Of the "
        "allocated memory 71.57 GiB is allocated by PyTorch, with 39.77 MiB allocated in private pools (e.g., CUDA "
        "Graphs), and 611.60 MiB is reserved by PyTorch but unallocated.')"
    )
    assert ev.total == int(79.15 * GiB) and ev.free == int(2.19 * MiB)
    assert ev.process_used == int(79.12 * GiB)
    assert ev.allocated == int(71.57 * GiB)
    assert ev.private_pools == int(39.77 * MiB)
    assert ev.reserved_unallocated == int(611.60 * MiB)
    assert ev.reserved == ev.allocated + ev.reserved_unallocated
    assert not ev.truncated


def test_modern_message_lists_other_processes() -> None:
    ev = parse_allocator_message(
        "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.06 GiB is "
        "free. Process 31337 has 14.20 GiB memory in use. Process 4242 has 512.00 MiB memory in use. Including "
        "non-PyTorch memory, this process has 8.37 GiB memory in use. Of the allocated memory 7.80 GiB is allocated "
        "by PyTorch, and 120.51 MiB is reserved by PyTorch but unallocated."
    )
    assert ev.other_processes == [(31337, int(14.20 * GiB)), (4242, 512 * MiB)]
    assert ev.process_used == int(8.37 * GiB)


def test_npu_variant() -> None:
    ev = parse_allocator_message(
        "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity; 56.37 GiB "
        "already allocated; 56.37 GiB current active; 1.25 GiB free; 58.49 GiB reserved in total by PyTorch)"
    )
    assert ev.device == "NPU" and ev.total == int(60.97 * GiB) and ev.reserved == int(58.49 * GiB)


def test_truncated_message_is_partial_and_says_so() -> None:
    src = OomSource()
    for line in _lines("oom_truncated_wrapped_legacy.txt"):
        src.feed(line)
    assert src.matched()
    assert any("cut short" in p and "reserved" in p for p in src.problems())
    ev = {e.key: e for e in src.evidence("t")}
    assert ev["mem.device_total_bytes"].quality is Quality.PARTIAL
    assert "mem.reserved_bytes" not in ev


def test_message_wrapped_over_lines_is_joined() -> None:
    p = OomParser()
    for line in [
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total capacity;",
        "6.32 GiB already allocated; 9.94 MiB free; 6.50 GiB reserved in total by PyTorch)",
        "next unrelated line",
    ]:
        p.feed(line)
    r = p.result()
    assert len(r.events) == 1
    e = r.events[0]
    assert e.allocated == int(6.32 * GiB) and e.reserved == int(6.5 * GiB) and not e.truncated


def test_duplicate_message_counts_once() -> None:
    msg = ("CUDA out of memory. Tried to allocate 138.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 2.19 "
           "MiB is free. Including non-PyTorch memory, this process has 79.12 GiB memory in use. Of the allocated "
           "memory 71.57 GiB is allocated by PyTorch, and 611.60 MiB is reserved by PyTorch but unallocated.")
    p = OomParser()
    p.feed(f"ERROR 10-11 12:27:29 engine.py:157] OutOfMemoryError('{msg}')")
    p.feed("Traceback (most recent call last):")
    p.feed(f"torch.OutOfMemoryError: {msg}")
    assert len(p.result().events) == 1


def _phase(fr: Frame) -> str:
    got = frame_phase(fr)
    return got[0] if got else ""


def test_frame_phases() -> None:
    assert frame_phase(Frame("vllm/model_executor/model_loader/loader.py", "load_model")) == (
        "loading", "load_model")
    assert _phase(Frame("x/vllm/model_executor/models/llama.py", "__init__")) == "loading"
    assert _phase(Frame("layers.py", "__init__", "self.weight = Parameter(torch.empty(")) == "loading"
    assert _phase(Frame("train.py", "main", "model = model.to(device)")) == "loading"
    assert _phase(Frame("vllm/worker/worker.py", "determine_num_available_blocks")) == "profile_run"
    assert _phase(Frame("vllm/worker/model_runner.py", "capture_model")) == "warmup"
    got = frame_phase(Frame("vllm/engine/multiprocessing/engine.py", "start", "self.run_engine_loop()"))
    assert got == ("serving", "start → run_engine_loop()")
    assert frame_phase(Frame("utils.py", "helper")) is None
    # TensorFlow and Keras create a layer's variables on its first call (sweep T's DeepLabCut#22: apply → __call__ →
    # build → get_variable): loading, though __call__ alone reads as serving; a "build" outside them is not
    tf = "site-packages/tensorflow/python/"
    assert phase_of([Frame(tf + "layers/base.py", "apply"), Frame(tf + "layers/base.py", "__call__"),
                     Frame(tf + "layers/convolutional.py", "build"),
                     Frame(tf + "ops/variable_scope.py", "get_variable")]) == ("loading", "build in convolutional.py")
    assert _phase(Frame("site-packages/keras/src/layers/layer.py", "add_weight")) == "loading"
    assert _phase(Frame("site-packages/tensorflow/python/layers/base.py", "__call__")) == "serving"
    assert _phase(Frame("tensorrt_llm/builder.py", "build")) == ""


def test_real_legacy_oom_while_constructing_layers_is_loading() -> None:
    ev = _evidence("oom_weights_legacy_message_layer_init_llama70b.txt")
    assert ev["mem.oom_phase"] == "loading"
    assert ev["mem.oom_count"] == 1
    assert _near(ev["mem.device_total_bytes"], 79.35 * GiB)
    assert ev["mem.reserved_minus_allocated_bytes"] == 0


def test_real_modern_oom_in_engine_loop_is_serving() -> None:
    ev = _evidence("oom_peak_serving_engine_loop_high_gpu_util.txt")
    assert ev["mem.oom_phase"] == "serving"
    assert _near(ev["mem.allocated_bytes"], 71.57 * GiB)
    assert _near(ev["mem.reserved_minus_allocated_bytes"], 611.6 * MiB)
    assert _near(ev["mem.private_pools_bytes"], 39.77 * MiB)
    assert ev["mem.gpu_memory_utilization_ratio"] == 0.941


def test_prose_oom_with_profile_run_traceback() -> None:
    src = OomSource()
    for line in _lines("oom_peak_profile_run_prose_no_message.txt"):
        src.feed(line)
    ev = {e.key: e for e in src.evidence("t")}
    assert ev["mem.oom_phase"].value == "profile_run"
    assert ev["mem.oom_count"].quality is Quality.LOW
    assert any("no allocator message" in p for p in src.problems())


def test_pytorch_hint_alone_is_not_an_oom() -> None:
    p = OomParser()
    p.feed("If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    assert p.result().events == []


def test_framework_messages() -> None:
    tgi = _evidence("oom_framework_tgi_prefill_warmup.txt")
    assert tgi["mem.oom_phase"] == "warmup" and tgi["mem.prefill_tokens_failed"] == 4096
    kv = _evidence("oom_framework_vllm_kv_cache_too_small.txt")
    assert kv["mem.oom_phase"] == "profile_run"
    assert kv["mem.max_model_len"] == 32768 and kv["mem.kv_cache_max_tokens"] == 21936
    assert _near(kv["mem.weights_bytes"], 14.9888 * GiB)  # vLLM's "GB" here is bytes / 2**30
    startup = _evidence("oom_external_vllm_startup_check.txt")
    assert _near(startup["mem.other_processes_bytes"], (79.19 - 30.12) * GiB)
    p = OomParser()
    p.feed("RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests. Please try "
           "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine.")
    assert p.result().events[0].phase == "warmup"


def test_vllm_memory_profiling_lines_of_each_version() -> None:
    """vLLM's start-up accounting, by its fields: 0.6.x's ``key=valueGiB`` line (spaces, or commas and a duration
    in a later form), 0.7's sentence, V1's ``weights memory:``; the device's size from it stops a size being read from
    the line's other numbers."""
    h = HintsParser()
    h.feed("INFO 12-06 11:39:36 worker.py:232] Memory profiling results: total_gpu_memory=7.92GiB "
           "initial_memory_usage=3.09GiB peak_torch_memory=3.12GiB memory_usage_post_profile=3.12GiB "
           "non_torch_memory=0.47GiB kv_cache_size=3.54GiB gpu_memory_utilization=0.90")
    hints = h.hints
    assert hints.device_total == int(7.92 * GiB) and hints.gpu_memory_bytes == int(7.92 * GiB)
    assert hints.profile_used == int(3.09 * GiB) and hints.profile_non_torch == int(0.47 * GiB)
    assert hints.gpu_memory_utilization == 0.9
    h = HintsParser()
    h.feed("INFO 11-22 09:14:34 worker.py:262] Memory profiling results: duration=1.52 seconds, "
           "total_gpu_memory=79.15GiB, initial_memory_usage=68.01GiB, peak_torch_memory=10.2GiB, "
           "memory_usage_post_profile=68.3GiB, non_torch_memory=58.1GiB, kv_cache_size=-52.1GiB, "
           "gpu_memory_utilization=0.20.")
    assert h.hints.device_total == int(79.15 * GiB) and h.hints.profile_used == int(68.01 * GiB)
    assert h.hints.gpu_memory_utilization == 0.2
    h = HintsParser()
    for line in ["INFO 02-18 10:01:04 worker.py:267] Memory profiling takes 4.21 seconds",
                 "INFO 02-18 10:01:04 worker.py:267] the current vLLM instance can use total_gpu_memory (44.35GiB) x "
                 "gpu_memory_utilization (0.42) = 18.63GiB",
                 "INFO 02-18 10:01:04 worker.py:267] model weights take 8.32GiB; non_torch_memory takes 0.34GiB; "
                 "PyTorch activation peak memory takes 1.20GiB; the rest of the memory reserved for KV Cache is "
                 "8.77GiB."]:
        h.feed(line)
    assert h.hints.device_total == int(44.35 * GiB) and h.hints.gpu_memory_utilization == 0.42
    assert h.hints.weights_measured == int(8.32 * GiB) and h.hints.profile_used is None
    h = HintsParser()
    h.feed("INFO 06-01 12:00:03 [gpu_worker.py:227] Memory profiling takes 5.20 seconds. Total non KV cache memory: "
           "16.46GiB; torch peak memory increase: 1.24GiB; non-torch forward increase memory: 0.23GiB; "
           "weights memory: 14.99GiB.")
    assert h.hints.weights_measured == int(14.99 * GiB)
    ev = _evidence("oom_external_vllm_profiling_second_instance.txt")
    assert _near(ev["mem.profile_device_used_bytes"], 46.37 * GiB)
    assert _near(ev["mem.device_total_bytes"], 79.15 * GiB) and _near(ev["gpu.spec_memory_bytes"], 79.15 * GiB)


def test_engine_start_up_kv_failures_of_each_form() -> None:
    """What engines print when nothing is left for the KV cache, each an OOM at sizing: vLLM V1's negative
    ``Available KV cache memory`` (a positive one is not), SGLang's pool error and its newer sentence, vLLM's
    max-seq-len error wrapped by a paste before its number; V1's ``Model loading took`` is the weights' size."""
    def events(lines: list[str]) -> list[object]:
        p = OomParser()
        for line in lines:
            p.feed(line)
        return list(p.result().events)

    (ev,) = events(["(EngineCore_0 pid=5839) INFO 08-20 18:04:22 [gpu_worker.py:276] Available KV cache memory: "
                    "-2.14 GiB",
                    "(EngineCore_0 pid=5839) ERROR 08-20 18:04:22 [core.py:700] EngineCore failed to start."])
    assert ev.phase == "profile_run" and ev.kv_cache_available == 0
    assert events(["INFO 06-01 12:00:04 [gpu_worker.py:276] Available KV cache memory: 51.38 GiB"]) == []
    (ev,) = events(["RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."])
    assert "mem-fraction-static" in ev.reason and ev.kv_cache_available == 0
    (ev,) = events(["ValueError: Loaded weights leave no GPU memory for the KV cache under "
                    "--mem-fraction-static=0.88."])
    assert ev.kv_cache_available == 0
    (ev,) = events(["ValueError: The model's max seq len (30000) is larger than the maximum number of tokens that can "
                    "be stored in KV cache (", "3984). Try increasing `gpu_memory_utilization` or decreasing "
                    "`max_model_len` when initializing the engine."])
    assert (ev.max_model_len, ev.kv_cache_max_tokens) == (30000, 3984)
    # the cut message: a blank line between its halves is skipped; at the input's end it stands alone
    (ev,) = events(["ValueError: The model's max seq len (30000) is larger than the maximum number of tokens that can "
                    "be stored in KV cache (", "", "3984). Try increasing `gpu_memory_utilization`"])
    assert (ev.max_model_len, ev.kv_cache_max_tokens) == (30000, 3984)
    (ev,) = events(["ValueError: The model's max seq len (30000) is larger than the maximum number of tokens that can "
                    "be stored in KV cache ("])
    assert (ev.max_model_len, ev.kv_cache_max_tokens) == (30000, None)
    # the available-memory line comes just before the error it raises: one failure, counted once
    (ev,) = events(["(EngineCore_0 pid=5839) INFO 08-20 18:04:22 [gpu_worker.py:276] Available KV cache memory: "
                    "0.00 GiB",
                    "(EngineCore_0 pid=5839) ERROR 08-20 18:04:22 [core.py:700] ValueError: To serve at least one "
                    "request with the models's max seq len (32768), (4.00 GiB KV cache is needed, which is larger than "
                    "the available KV cache memory (0.00 GiB)."])
    assert ev.kv_cache_needed == 4 * GiB
    # a question or a doc line about the KV cache's memory is not an error
    for prose in ("Question: why is there no memory for the KV cache when I set gpu-memory-utilization 0.9?",
                  "Our docs say: if there is not enough memory for the KV cache, lower max_model_len."):
        assert events([prose]) == [], prose
    h = HintsParser()
    h.feed("(EngineCore_0 pid=5839) INFO 08-20 18:04:10 [gpu_model_runner.py:2007] Model loading took 65.9651 GiB "
           "and 12.799889 seconds")
    assert h.hints.weights_measured == int(65.9651 * GiB)


def _oom_events(lines: list[str]) -> list[object]:
    p = OomParser()
    for line in lines:
        p.feed(line)
    return list(p.result().events)


def test_sglang_token_pool_exhaustion_of_each_form() -> None:
    """SGLang's KV token pool running out while it serves (``alloc_token_slots``): the forward mode's name before
    0.5, a bare "Out of memory." after; its numbers on the lines under it, or run together on one line; "Avaliable"
    (0.4's spelling); a hybrid pool's full and sliding-window pools, the smaller of them what it had."""
    ev = _evidence("oom_peak_sglang_jax_decode_token_pool.txt")
    assert ev["mem.oom_phase"] == "serving" and ev["mem.oom_count"] == 1
    assert (ev["mem.kv_tokens_requested"], ev["mem.kv_tokens_free"]) == (168, 3200)
    ev = _evidence("oom_peak_sglang_decode_token_pool_page_size.txt")
    assert (ev["mem.kv_tokens_requested"], ev["mem.kv_tokens_free"]) == (148, 2048)
    (one,) = _oom_events(["[2025-10-14 02:11:31 TP0] Out of memory. Try to lower your batch size. Try to allocate 4 "
                          "tokens. Available tokens: 3 (available_size=3 + evictable_size=0)"])
    assert (one.phase, one.kv_tokens_requested, one.kv_tokens_free) == ("serving", 4, 3)
    (hyb,) = _oom_events(["Prefill out of memory. Try to lower your batch size.", "Try to allocate 8192 tokens.",
                          "Available full tokens: 899840 (full_available_size=11776 + full_evictable_size_=888064)",
                          "Available swa tokens: 3840 (swa_available_size=3840 + swa_evictable_size=0)",
                          "Full LRU list evictable size: 888064"])
    assert (hyb.kv_tokens_requested, hyb.kv_tokens_free) == (8192, 3840)
    assert "KV token pool at prefill" in hyb.phase_from and hyb.phase_by_message
    # the exception's copy of the logged message is the same failure
    assert len(_oom_events(["[TP0] Decode out of memory. Try to lower your batch size.", "Try to allocate 6 tokens.",
                            "Scheduler hit an exception: Traceback (most recent call last):",
                            "RuntimeError: Decode out of memory. Try to lower your batch size."])) == 1
    (slots,) = _oom_events(["RuntimeError: alloc_req_slots runs out of memory. Please set a smaller number for "
                            "`--max-running-requests`. "])
    assert slots.phase == "serving" and "request-slot pool" in slots.reason
    # a number on a later line that is none of the message's ends it: the next line is read as any other
    (cut,) = _oom_events(["Decode out of memory. Try to lower your batch size.", "Try to allocate 6 tokens.",
                          "INFO: 127.0.0.1 - \"POST /generate\" 200 OK", "Available tokens: 99"])
    assert (cut.kv_tokens_requested, cut.kv_tokens_free) == (6, None)


def test_sglang_retraction_warnings_are_no_oom() -> None:
    """Before 0.4.4 SGLang logged each retraction as "Decode out of memory happened. #retracted_reqs: 1": requests
    put back in the queue for KV room, no failure (sgl-project/sglang#4184)."""
    assert _evidence("sglang_retraction_warnings_no_oom.txt").get("mem.oom_count") is None


def test_sglang_scheduler_frames_are_serving() -> None:
    for func in ("event_loop_overlap", "event_loop_normal", "get_next_batch_to_run", "update_running_batch",
                 "forward_batch_generation"):
        got = frame_phase(Frame("sglang/srt/managers/scheduler.py", func))
        assert got is not None and got[0] == "serving", func


def test_alloc_retries_from_memory_summary() -> None:
    src = OomSource()
    src.feed("|  cudaMalloc retries: 37                    |  cudaMalloc OOMs: 2                          |")
    assert src.matched()
    assert {e.key: e.value for e in src.evidence("t")}["mem.alloc_retries"] == 37


def test_model_hints_from_launch_line_and_gpus() -> None:
    ev = _evidence("oom_weights_qwen72b_eight_gpus_no_tp.txt")
    assert ev["model.params"] == 72_000_000_000
    assert ev["mem.weights_estimate_bytes"] == 144_000_000_000
    assert ev["mem.tensor_parallel"] == 1
    assert ev["gpu.count_stated"] == 8
    assert ev["gpu.spec_memory_bytes"] == 80 * GiB


def test_model_hints_dtype_parallelism_and_moe() -> None:
    h = HintsParser()
    for line in [
        "vllm serve Qwen/Qwen3-30B-A3B-AWQ --tensor-parallel-size 2 --gpu-memory-utilization 0.85",
        "Also tried Llama-2-13b-chat-hf on one RTX 4090",
    ]:
        h.feed(line)
    hints = h.hints
    assert hints.params == 30e9 and hints.bytes_per_param == 0.5  # A3B is the active count, not the size
    assert hints.tensor_parallel == 2 and hints.gpu_memory_utilization == 0.85
    assert hints.gpu_model == "4090" and hints.gpu_memory_bytes == 24 * GiB


def test_quantised_weights_are_sized_by_their_format() -> None:
    """The bytes per parameter a model name or its line states: GGUF's quantisations by their bits per
    weight (with their variant: "Q2 2024" is a quarter), NVIDIA's FP4, 4- and 8-bit schemes."""
    want = {"Qwen3.8-27B NVFP4": 0.5, "Meta-Llama-3-8B-Instruct.Q4_K_M.gguf": 0.6, "gemma-2-9b-it-Q8_0.gguf": 1.06,
            "Mistral-7B-Instruct-v0.3-IQ3_XXS.gguf": 0.45, "qwen2.5-coder-7b-q5_k_s.gguf": 0.7,
            "Qwen2.5-7B-Instruct-AWQ": 0.5, "Llama-3.1-8B-Instruct-FP8": 1.0}
    for name, nbytes in want.items():
        h = HintsParser()
        h.feed(f"vllm serve {name} --max-model-len 8192")
        assert h.hints.bytes_per_param == nbytes, name
    h = HintsParser()
    h.feed("The 13B model got slower in Q2 2024")
    assert h.hints.params == 13e9 and h.hints.bytes_per_param is None


def test_model_hints_ignore_numbers_that_are_not_model_sizes() -> None:
    h = HintsParser()
    for line in ["Mean TTFT (ms): 4090.94", "alignment of 16B", "took 4 bit flips"]:
        h.feed(line)
    assert h.hints.params is None and h.hints.gpu_model == ""


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(max_size=300), max_size=30))
def test_fuzz_text_never_raises(lines: list[str]) -> None:
    srcs = [OomSource(), HintsSource()]
    for line in clean_lines(lines):
        for s in srcs:
            s.feed(line)
    for s in srcs:
        if s.matched():
            s.evidence("fuzz")
        s.problems()


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=1, max_value=400), st.binary(max_size=200))
def test_fuzz_truncated_binary_and_huge(cut: int, junk: bytes) -> None:
    msg = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 384.00 MiB. GPU 0 has a total capacty of "
           "79.33 GiB of which 351.81 MiB is free. Including non-PyTorch memory, this process has 78.97 GiB memory in "
           "use. Of the allocated memory 78.33 GiB is allocated by PyTorch, and 12.36 MiB is reserved by PyTorch but "
           "unallocated.")
    lines = [msg[:cut], junk.decode("latin-1"), "x" * 100_000 + msg, msg.encode().decode("utf-8", "replace")]
    src = OomSource()
    for line in clean_lines(lines):
        src.feed(line)
    assert src.matched()
    src.evidence("fuzz")
    src.problems()


def test_fragmentation_blamed_by_the_report_but_not_by_pytorchs_hint() -> None:
    ev = _evidence("oom_fragmentation_reported_in_prose_npu.txt")
    assert ev["mem.fragmentation_reported"] == 2
    hint_only = _evidence("oom_peak_serving_engine_loop_high_gpu_util.txt")
    assert "mem.fragmentation_reported" not in hint_only
    p = OomParser()
    for line in ["We hit OOM. It is not due to fragmentation: expandable_segments:True did not help."]:
        p.feed(line)
    assert p.result().fragmentation_statements == []


def test_quantised_moe_on_two_gpus_fits_so_the_reported_cause_stands() -> None:
    ev = _evidence("oom_fragmentation_reported_startup_mxfp4.txt")
    assert ev["mem.weights_estimate_bytes"] == 60_000_000_000  # 120B × 0.5 byte (mxfp4)
    assert ev["mem.tensor_parallel"] == 2 and ev["gpu.count_stated"] == 2
    assert ev["mem.fragmentation_reported"] >= 1  # type: ignore[operator]


def test_a_log_prefixs_tensor_parallel_rank_is_no_size() -> None:
    """SGLang's records carry their rank ("[2025-03-07 21:49:33 TP13]", sgl-project/sglang#4184) and vLLM's workers
    theirs ("(VllmWorker TP1 pid=…)"): a rank, not the size (TP0 read as "tensor parallelism 0"); the highest
    rank seen bounds the size from below. A size stated beside a rank still counts."""
    def hints(*lines: str) -> tuple[int | None, int | None]:
        h = HintsParser()
        for line in lines:
            h.feed(line)
        return h.hints.tensor_parallel, h.hints.tp_rank_max

    assert hints("[2025-03-07 21:49:33 TP0] Prefill batch. #new-seq: 1") == (None, 0)
    assert hints("[2025-03-07 21:49:33 TP13] Decode out of memory happened. #retracted_reqs: 1",
                 "[2025-03-07 21:49:45 TP9] Decode out of memory happened.") == (None, 13)
    assert hints("(VllmWorker TP1 pid=4242) INFO 06-01 12:00:04 [gpu_model_runner.py:1595] Loading model") == (None, 1)
    assert hints("[2025-03-07 21:49:33 DP0 TP3] server_args=ServerArgs(tp_size=8)") == (8, 3)
    assert hints("Llama 70B served with TP4 on 4xA100") == (4, None)
    src = HintsSource()
    for line in _lines("sglang_retraction_warnings_no_oom.txt"):  # ranks TP9 to TP13: a size of 14 at least, not 14
        src.feed(line)
    assert not [e for e in src.evidence("t") if e.key == "mem.tensor_parallel"]


def test_rocm_and_xpu_messages_are_whole_without_the_clauses_they_never_print() -> None:
    """ROCm's message never says what this process uses, XPU's neither that nor what is free (ROCm/TheRock#2118,
    intel-extension-for-pytorch#846): complete as printed, not "cut short"."""
    ev = _evidence("oom_hip_per_process_fraction_cap.txt")
    assert ev["mem.allocation_limit_bytes"] == int(1.05 * GiB) and ev["mem.device_free_bytes"] == int(244.65 * GiB)
    (hip,) = _oom_events(_lines("oom_hip_per_process_fraction_cap.txt"))
    assert not hip.truncated, hip.missing
    xpu = _oom_events(_lines("oom_xpu_nothing_held_allocation_cap.txt"))
    assert xpu and all(not e.truncated for e in xpu), [e.missing for e in xpu]
    assert {e.requested for e in xpu} == {8 * GiB, 4 * GiB} and all(e.allocated == 0 for e in xpu)


def test_a_free_larger_than_the_device_is_left_out_and_a_requote_is_the_same_failure() -> None:
    """ROCm on an APU (ROCm/TheRock#4598): "a total capacity of 15.49 GiB of which 84.98 GiB is free" cannot be, so
    free is not used and the input says why; the reporter's back-quoted first sentence of the same message below it
    is that failure again, not a second one cut short."""
    src = OomSource()
    for line in _lines("oom_hip_free_exceeds_total_apu.txt"):
        src.feed(line)
    ev = {e.key: e.value for e in src.evidence("t")}
    assert ev["mem.oom_count"] == 1 and "mem.device_free_bytes" not in ev
    assert ev["mem.allocated_bytes"] == int(1.67 * GiB)
    (why,) = src.problems()
    assert "84.98 GiB free of a 15.49 GiB device" in why


def test_an_nvidia_smi_rows_index_is_no_gpu_count() -> None:
    """nvidia-smi's table row leads with the GPU's index (zai-org/GLM-130B#32: "|   1  Tesla V100-SXM2…" read as
    one GPU, "|   7  NVIDIA A100…" as seven); a count in prose still counts."""
    for line, count in (("|   1  Tesla V100-SXM2...  On   | 00000000:00:05.0 Off |                    0 |", None),
                        ("|   7  NVIDIA A100-SXM4-80GB      On   | 00000000:CB:00.0 Off |            0 |", None),
                        ("We serve it on 2x A100 80GB", 2)):
        h = HintsParser()
        h.feed(line)
        assert h.hints.gpu_count == count and h.hints.gpu_model in ("V100", "A100"), line


def test_two_sglang_pool_failures_keep_their_own_numbers() -> None:
    """A Decode failure, then a Prefill one within the same traceback's reach: two failures, each with the slots it
    asked for and had (the second's numbers were written into the first)."""
    events = _oom_events(["[TP0] Decode out of memory. Try to lower your batch size.", "Try to allocate 4000 tokens.",
                          "Available tokens: 100 (available_size=100 + evictable_size=0)",
                          "RuntimeError: Prefill out of memory. Try to lower your batch size.",
                          "Try to allocate 50 tokens.",
                          "Available tokens: 9000 (available_size=9000 + evictable_size=0)"])
    assert [(e.kv_tokens_requested, e.kv_tokens_free) for e in events] == [(4000, 100), (50, 9000)]


def test_tensorrt_llms_executor_report_names_the_component_and_the_devices_memory() -> None:
    """TensorRT-LLM's executor creation failing (NVIDIA/TensorRT-LLM#5872): the component it could not create tells
    the phase (the KV cache: its sizing), and the device's total and its free memory before the attempt are read."""
    ev = _evidence("oom_trtllm_executor_kv_cache_component.txt")
    assert ev["mem.oom_count"] == 1 and ev["mem.oom_phase"] == "profile_run"
    assert ev["mem.oom_reason"] == "TensorRT-LLM could not create its KV cache"
    assert _near(ev["mem.device_total_bytes"], 140.06 * GiB) and _near(ev["mem.device_free_bytes"], 108.86 * GiB)
    for component, phase in (("Model", "loading"), ("Initial KV Cache (temporary for KV cache size estimation)",
                                                     "profile_run"), ("Sampler", "warmup"),
                             ("Model resources created during usage", "warmup")):
        (e,) = _oom_events(["RuntimeError: Executor creation failed due to insufficient GPU memory.", "",
                            f"The following component could not be created: {component}"])
        assert e.phase == phase, (component, e.phase)


def test_mps_xla_and_the_host_allocators_messages_are_read() -> None:
    """Apple's MPS (lllyasviel/Fooocus#1139): what the process holds against the high-watermark cap; XLA's BFC
    allocator (jax-ml/jax#27354) and its async allocator; PyTorch's host allocator (Fooocus#237), host memory."""
    ev = _evidence("oom_mps_high_watermark.txt")
    # (its "GB" is 2^30 bytes: MPSAllocator's format_size divides by 1024)
    assert ev["mem.oom_device"] == "MPS" and _near(ev["mem.allocation_limit_bytes"], 9.07 * GiB)
    assert _near(ev["mem.process_used_bytes"], 8.89 * GiB + 172.98 * MiB)
    assert _near(ev["mem.requested_bytes"], 6.25 * MiB)
    (mps,) = _oom_events(_lines("oom_mps_high_watermark.txt"))
    assert not mps.truncated, mps.missing
    assert _near(_evidence("oom_xla_bfc_ran_out_tib.txt")["mem.requested_bytes"], 1.25 * 1024 * GiB)
    (xla,) = _oom_events(["E1103 18:23:55.103160 3413767 gpu_cudamallocasync_allocator.cc:361] gpu_async_1 "
                          "cuMemAllocAsync failed to allocate 1225195446464 bytes: RESOURCE_EXHAUSTED: out of memory"])
    assert xla.requested == 1225195446464 and xla.device == "GPU"
    host = _evidence("oom_host_defaultcpuallocator_windows.txt")
    assert host["mem.oom_device"] == "CPU" and host["host.alloc_failed_bytes"] == 26214400
    (drv,) = _oom_events(["jcuda.CudaException: CUDA_ERROR_OUT_OF_MEMORY"])
    assert drv.kind == "allocator"


def test_vllms_kv_error_wrapped_without_its_parenthesis_is_read() -> None:
    ev = _evidence("oom_vllm_kv_bytes_wrapped_no_paren.txt")  # kaito-project/kaito#2132
    assert _near(ev["mem.kv_cache_needed_bytes"], 22.5 * GiB) and _near(ev["mem.kv_cache_available_bytes"], 17.39 * GiB)


def test_a_listed_process_with_nothing_reserved_is_nobodys() -> None:
    """PyTorch reserved nothing and lists one process holding the device (NVIDIA/TensorRT-LLM#2398): this process
    seen from a container's pid namespace, or another; neither is said, so neither number is given."""
    ev = _evidence("oom_listed_process_nothing_reserved.txt")
    assert "mem.process_used_bytes" not in ev and "mem.other_processes_bytes" not in ev
    assert _near(ev["mem.unattributed_process_bytes"], 22.18 * GiB)


def test_vllms_kv_error_wrapped_inside_a_word_is_joined() -> None:
    """V1's KV-cache error as a paste wrapped it, inside 'cache' (SergiioB/intel-arc-pro-b70-inference-cookbook#4)."""
    (ev,) = _oom_events(list(clean_lines([
        "(EngineCore pid=316) ValueError: To serve at least one request with the model's max seq len (100000), "
        "(4.26 GiB KV cach",
        "(EngineCore pid=316) e is needed, which is larger than the available KV cache memory (4.25 GiB). Based on the "
        "avai"])))
    assert _near(ev.kv_cache_needed, 4.26 * GiB) and _near(ev.kv_cache_available, 4.25 * GiB)


def test_vllms_kv_error_cut_in_its_numbers_or_in_its_other_spelling_or_at_the_end() -> None:
    start = "ValueError: To serve at least one request with the models's max seq len (100000), (4"
    (ev,) = _oom_events([start, "0.50 GiB KV cache is needed, which is larger than the available KV cache memory "
                                "(4.25 GiB)."])
    assert _near(ev.kv_cache_needed, 40.5 * GiB)  # one number split by the wrap, not "0.50 GiB"
    (ev,) = _oom_events([start + ".26 GiB KV cach"])  # the input ends inside the message
    assert ev.max_model_len == 100000 and ev.kv_cache_needed is None


def test_paddles_allocator_message_in_both_forms() -> None:
    """PaddlePaddle's ResourceExhaustedError (cuda_allocator.cc): the request, what its allocator holds (newer releases)
    and the free memory, sizes printed by HumanReadableSize without a space; its device and index."""
    new = parse_allocator_message(
        "Out of memory error on GPU 0. Cannot allocate 128.000000MB memory on GPU 0, 23.431824GB memory has been "
        "allocated and available memory is only 97.625000MB.")
    assert (new.device, new.device_index, new.truncated) == ("GPU", 0, False)
    assert new.requested == 128 * MiB and _near(new.reserved, 23.431824 * GiB) and _near(new.free, 97.625 * MiB)
    old = parse_allocator_message(
        "Out of memory error on GPU 3. Cannot allocate 25.002197MB memory on GPU 3, available memory is only "
        "15.187500MB.")
    assert (old.device_index, old.reserved) == (3, None) and _near(old.requested, 25.002197 * MiB)
    npu = parse_allocator_message("Cannot allocate 39.250000kB memory on NPU 7, available memory is only 0.000000B.")
    assert (npu.device, npu.requested, npu.free) == ("NPU", int(39.25 * 1024), 0)


def test_paddles_message_is_read_from_its_error_summary_and_its_hints_are_no_claims() -> None:
    """The Error Message Summary block: one allocator event, and the template under it ('check whether there is any
    other process… start PaddlePaddle on another GPU… decrease the batch size') is the framework's, not the reporter's
    (it named oom_peak, oom_external and device_placement from the template; the first led at 0.85)."""
    text = ("----------------------\nError Message Summary:\n----------------------\nResourceExhaustedError: \n\n"
            "Out of memory error on GPU 0. Cannot allocate 25.002197MB memory on GPU 0, available memory is only "
            "15.187500MB.\n\nPlease check whether there is any other process using GPU 0.\n1. If yes, please stop "
            "them, or start PaddlePaddle on another GPU.\n2. If no, please decrease the batch size of your model. \n\n"
            " (at /paddle/paddle/fluid/memory/allocation/cuda_allocator.cc:69)\n")
    res = loose.analyze_stream("p", io.BufferedReader(io.BytesIO(text.encode())))
    ev = {e.key: e.value for e in res.evidence}
    assert ev["mem.oom_count"] == 1 and ev["mem.oom_device"] == "GPU"
    assert _near(ev["mem.requested_bytes"], 25.002197 * MiB) and _near(ev["mem.device_free_bytes"], 15.1875 * MiB)
    said = [k for k in ev if k.startswith("report.") and k.endswith(("_statements", "_messages"))]
    assert not [k for k in said if any(w in k for w in ("external", "placement", "input_size", "batch"))], said


def test_tensorflows_device_creation_says_what_others_held_before_it_allocated() -> None:
    """TensorFlow 1.x logs each GPU's total and free memory as it creates the device, before it allocates anything
    (1.0-1.4 on two lines, 1.5 on one): the rest is another process'. With its CUDA_ERROR_OUT_OF_MEMORY that is
    MEM004, measured (tensorflow#8170's form: 190 MiB free of 7.92 GiB, read only from the reporter's words before)."""
    two = ("I tensorflow/core/common_runtime/gpu/gpu_device.cc:885] Found device 0 with properties: \nname: GeForce "
           "GTX 1080\nmajor: 6 minor: 1 memoryClockRate (GHz) 1.7335\npciBusID 0000:01:00.0\nTotal memory: 7.92GiB\n"
           "Free memory: 190.31MiB\nE tensorflow/stream_executor/cuda/cuda_driver.cc:1002] failed to allocate 190.31M "
           "(199557120 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY\n")
    one = ("2018-03-01 10:00:00.1: I tensorflow/core/common_runtime/gpu/gpu_device.cc:1212] Found device 0 with "
           "properties: \nname: GeForce GTX 1080 Ti major: 6 minor: 1 memoryClockRate(GHz): 1.582\npciBusID: "
           "0000:01:00.0\ntotalMemory: 10.92GiB freeMemory: 1.02GiB\nE tensorflow/stream_executor/cuda/"
           "cuda_driver.cc:936] failed to allocate 939.59M (985219072 bytes) from device: CUDA_ERROR_OUT_OF_MEMORY\n")
    for text, held in ((two, 7.92 * GiB - 190.31 * MiB), (one, (10.92 - 1.02) * GiB)):
        res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode())))
        ev = {e.key: e.value for e in res.evidence}
        assert _near(ev["mem.other_processes_bytes"], held), ev
        findings, _ = run_rules(EvidenceSet(res.evidence), rules=RULES)
        assert findings[0].code == "MEM004" and findings[0].confidence.value == "measured", findings
    # a total with no free line after it, or a free line alone, is no reading
    lone = "Total memory: 7.92GiB\nsomething else\nFree memory: 190.31MiB\n"
    res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(lone.encode())))
    assert "mem.other_processes_bytes" not in {e.key for e in res.evidence}


def _parsed(*lines: str) -> list:  # type: ignore[type-arg]
    p = OomParser()
    for line in clean_lines(list(lines)):
        p.feed(line)
    return p.result().events


def test_tensorflows_exception_heading_its_traceback_is_an_oom() -> None:
    # IPython's form (colabtools#56: the paste was cut after the traceback's first frames), and with its message
    (ev,) = _parsed("Epoch 1/150", "ResourceExhaustedError                    Traceback (most recent call last)",
                    "/usr/local/lib/python3.6/dist-packages/tensorflow/python/client/session.py in _do_call(self, fn)")
    assert ev.requested is None and not ev.truncated
    (ev,) = _parsed("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor "
                    "with shape[3,3,512,512]")
    assert not ev.truncated
    # its wrapper of several errors says nothing by itself (the errors under it do), and TensorFlow raises the class
    # for a full disk or a quota too (keras-team/keras-tuner#390): no OOM
    assert _parsed("tensorflow.python.framework.errors_impl.ResourceExhaustedError: 2 root error(s) found.") == []
    assert _parsed("ResourceExhaustedError: /tmp/ckpt/tempstate123; No space left on device [Op:SaveV2]") == []
    assert _parsed("ResourceExhaustedError                    Traceback (most recent call last)", "...",
                   "ResourceExhaustedError: /ckpt/x.data-00000-of-00001.tempstate; No space left on device "
                   "[Op:SaveV2]") == []
    assert _parsed("ResourceExhaustedError                    Traceback (most recent call last)", "...",
                   "Resource exhausted: disk quota exceeded") == []
    # with the allocator's message near it, one failure: the message's
    (ev,) = _parsed("ResourceExhaustedError                    Traceback (most recent call last)",
                    "<ipython-input-3-1> in <module>()", "ResourceExhaustedError: OOM when allocating tensor with "
                    "shape[64,256,56,56] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator "
                    "GPU_0_bfc")
    assert "OOM when allocating" in ev.message
    # the class named in a sentence or a title is no event
    assert _parsed("Running into a ResourceExhaustedError", "I keep getting ResourceExhaustedError when training") == []


def test_tensorflows_allocator_message_is_whole_with_its_request_alone() -> None:
    """TensorFlow's BFC allocator says only what it asked for ("ran out of memory trying to allocate 9.00MiB"): not a
    PyTorch message cut short before its device numbers (sweep T's DeepLabCut#22 said "missing: total, free")."""
    (ev,) = _parsed("W tensorflow/core/common_runtime/bfc_allocator.cc:275] Ran out of memory trying to allocate "
                    "9.00MiB.  See logs for memory state.")
    assert ev.requested == 9 * MiB and not ev.truncated and ev.missing == ()
    (ev,) = _parsed("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert ev.truncated and "total" in ev.missing  # PyTorch's, cut: still said so


def test_tensorflows_loading_oom_without_device_figures_is_thin_weights() -> None:
    """TensorFlow's allocator takes the memory free when it starts: a variable it cannot create while building layers
    says memory ran out while loading, not whose it was (DeepLabCut#22: another process held the GPU)."""
    tf = "/opt/conda/lib/python3.6/site-packages/tensorflow/python/"
    text = "\n".join([
        "W tensorflow/core/common_runtime/bfc_allocator.cc:275] Ran out of memory trying to allocate 9.00MiB.  See "
        "logs for memory state.",
        "Traceback (most recent call last):",
        f'  File "{tf}layers/base.py", line 269, in __call__',
        "    self.build(input_shapes[0])",
        f'  File "{tf}layers/convolutional.py", line 138, in build',
        "    dtype=self.dtype)",
        f'  File "{tf}ops/variable_scope.py", line 988, in get_variable',
        "    custom_getter=custom_getter)",
        "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with "
        "shape[3,3,512,512]",
    ]) + "\n"
    res = loose.analyze_stream("x", io.BufferedReader(io.BytesIO(text.encode())))
    ev = EvidenceSet(res.evidence)
    assert ev.value("mem.oom_tensorflow") == 1 and ev.get("mem.oom_phase").value == "loading"
    findings, _ = run_rules(ev)
    (f,) = [f for f in findings if f.code == "MEM001"]
    assert f.confidence.value == "thin" and f.impact == 0.6 and "another process holding the GPU" in f.message
    # with the device's figures in view (TensorFlow's device creation line), MEM004 judges what others held instead
    text2 = ("I tensorflow/core/common_runtime/gpu/gpu_device.cc:1030] Found device 0 with properties: \nname: TITAN X "
             "(Pascal) major: 6 minor: 1 memoryClockRate(GHz): 1.531\npciBusID: 0000:02:00.0\ntotalMemory: 11.90GiB "
             "freeMemory: 11.75GiB\n" + text)
    res = loose.analyze_stream("x", io.BufferedReader(io.BytesIO(text2.encode())))
    findings, _ = run_rules(EvidenceSet(res.evidence))
    assert all(f.confidence.value != "thin" for f in findings if f.code == "MEM001")


def _evidence_of(lines: list[str]) -> dict[str, object]:
    srcs = [OomSource(), HintsSource()]
    for line in clean_lines(lines):
        for s in srcs:
            s.feed(line)
    return {e.key: e.value for s in srcs if s.matched() for e in s.evidence("paste")}


def test_a_whole_process_list_without_this_process_holds_it_among_its_pids() -> None:
    """PyTorch writes "this process" only where NVML's pid is its own (c10/cuda/CUDACachingAllocator.cpp,
    reportProcessMemoryInfo: ``self_pid == proc.pid``); in a container NVML gives the host's pids. The message says
    the failing process has its context there (the allocator read cudaMemGetInfo), so it is listed. A message cut
    after the list (vllm-project/vllm#1949: "… Process 2722 has 22.22 GiB memory in use. Of the allocate"): the one
    process listed is this one, not another tenant."""
    head = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 3.50 GiB. GPU 0 has a total capacty of "
            "23.64 GiB of which 1.42 GiB is free. ")
    ev = _evidence_of([head + "Process 2722 has 22.22 GiB memory in use. Of the allocate"])
    assert _near(ev["mem.process_used_bytes"], 22.22 * GiB) and ev["mem.other_processes_bytes"] == 0
    low = head.replace("1.42 GiB is free", "19.50 MiB is free")  # as most OOMs: the same
    ev = _evidence_of([low + "Process 2722 has 22.22 GiB memory in use. Of the"])
    assert _near(ev["mem.process_used_bytes"], 22.22 * GiB) and ev["mem.other_processes_bytes"] == 0
    # two listed and nothing of PyTorch's own figures: one of them is this one, so the smaller is another's at least
    ev = _evidence_of([head + "Process 2722 has 18.00 GiB memory in use. Process 90 has 4.22 GiB memory in use. "
                              "Of the allocated memory"])
    assert "mem.process_used_bytes" not in ev and _near(ev["mem.other_processes_bytes"], 4.22 * GiB)
    # cut after what PyTorch allocated: only an entry holding at least that can be this process (a review's repro)
    cut = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
           "79.19 GiB of which 1.50 GiB is free. Process 99 has 30.00 GiB memory in use. Of the allocated memory "
           "47.00 GiB is allocated by PyTorch, and 50")
    ev = _evidence_of([cut])
    assert "mem.process_used_bytes" not in ev and _near(ev["mem.other_processes_bytes"], 30 * GiB)
    ev = _evidence_of([cut.replace("Process 99 has 30.00 GiB memory in use.", "Process 99 has 30.00 GiB memory in "
                                   "use. Process 7 has 77.60 GiB memory in use.")])
    assert _near(ev["mem.process_used_bytes"], 77.6 * GiB) and _near(ev["mem.other_processes_bytes"], 30 * GiB)
    # a person's words after a list cut at its end are no part of the message: the entry stays another's
    ev = _evidence_of([head + "Process 99 has 20.00 GiB memory in use. Of the", "",
                       "Of the two jobs on this GPU, pid 99 is the training run."])
    assert _near(ev["mem.other_processes_bytes"], 20 * GiB) and "mem.process_used_bytes" not in ev
    ev = _evidence_of([head + "Process 99 has 20.00 GiB memory in use.",
                       "Of the two jobs on this GPU, pid 99 is the training run."])
    assert _near(ev["mem.other_processes_bytes"], 20 * GiB) and "mem.process_used_bytes" not in ev
    # the list cut inside itself: the entries after the cut are not known, the one read stays another's
    ev = _evidence_of([head + "Process 2722 has 22.22 GiB memory in use. Process 9"])
    assert _near(ev["mem.other_processes_bytes"], 22.22 * GiB) and "mem.process_used_bytes" not in ev


def test_ggml_buffer_failures_say_which_buffer_and_device() -> None:
    # llama.cpp#20431: the weights' tensors on CUDA0 while loading (the backend's cudaMalloc line, then the caller's)
    ev = _evidence("llamacpp_weights_alloc_tensor_range_cuda0.txt")
    assert ev["mem.oom_count"] == 1 and ev["mem.oom_device"] == "GPU"
    assert ev["mem.oom_phase"] == "loading" and _near(ev["mem.requested_bytes"], 144817.04 * MiB)
    # llama.cpp#16725: the compute graph's buffer on ROCm0, after the weights: the message says the phase
    ev = _evidence("llamacpp_compute_buffer_gallocr_rocm0.txt")
    assert ev["mem.oom_count"] == 1 and ev["mem.oom_phase"] == "warmup"
    assert _near(ev["mem.requested_bytes"], 14136.04 * MiB)
    # llama.cpp#10251: the CPU backend's compute buffer: the host's memory, no device's
    ev = _evidence("llamacpp_cpu_compute_buffer_ubatch.txt")
    assert ev["mem.oom_device"] == "CPU" and ev["mem.oom_phase"] == "warmup"
    assert ev["host.alloc_failures"] == 1 and ev["host.alloc_failed_bytes"] == 139183763104
    # llama.cpp#11476: one reservation retried three times, each on two or three lines: three failures, not eight
    ev = _evidence("llamacpp_gallocr_repeated_docker_cuda1.txt")
    assert ev["mem.oom_count"] == 3 and ev["mem.oom_phase"] == "warmup"
    assert _near(ev["mem.requested_bytes"], 10345253120)


def test_ggml_buffer_failure_phases_by_function() -> None:
    p = OomParser()
    for line in ["llama_kv_cache_init: failed to allocate buffer for kv cache",
                 "llama_new_context_with_model: llama_kv_cache_init() failed for self-attention cache"]:
        p.feed(line)
    (ev,) = p.result().events
    assert ev.phase == "profile_run" and ev.requested is None and ev.device == ""
    # a tensor range alone says neither weights nor cache: the phase stays the log's to tell
    p = OomParser()
    p.feed("alloc_tensor_range: failed to allocate Metal buffer of size 8589934592")
    (ev,) = p.result().events
    assert ev.phase == "unknown" and ev.device == "GPU" and ev.requested == 8589934592
    # a person's sentence with the words is no ggml line, nor is the context's summary line alone a buffer's
    for line in ("I think it failed to allocate buffer memory somewhere",
                 "llama_new_context_with_model: failed to allocate compute buffers"):
        p = OomParser()
        p.feed(line)
        assert p.result().events == [], line
    # a backend's pinned host buffer is the host's memory, not the GPU's (the review's counter-example)
    p = OomParser()
    for line in ["ggml_backend_cuda_host_buffer_type_alloc_buffer: failed to allocate 8192.00 MiB of pinned memory: "
                 "out of memory", "alloc_tensor_range: failed to allocate CUDA_Host buffer of size 8589934592"]:
        p.feed(line)
    (ev,) = p.result().events
    assert ev.device == "CPU" and ev.requested == 8192 * MiB
    # failures on two devices next to each other are two failures
    p = OomParser()
    for line in ["ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 1073741824",
                 "ggml_gallocr_reserve_n: failed to allocate CUDA1 buffer of size 2147483648"]:
        p.feed(line)
    assert [e.device_index for e in p.result().events] == [0, 1]


def test_engine_named_in_any_case_as_a_word() -> None:
    # text-generation-inference#926: "I deploy meta-llama/Llama-2-13b-chat-hf with tgi and get almost ~80GB allocated"
    for line, want in [("I deploy meta-llama/Llama-2-13b-chat-hf with tgi and get almost ~80GB allocated", "tgi"),
                       ("TGI reserves the memory", "tgi"), ("ghcr.io/huggingface/text-generation-inference:1.0", "tgi"),
                       ("the tgis library was imported", ""), ("see huggingface/tgi-docs", ""),
                       ("served by HF-TGI 2.0", "tgi")]:
        h = HintsParser()
        h.feed(line)
        assert h.hints.engine == want, line


def test_prose_hints_read_the_device_not_the_models_need() -> None:
    # FastChat#1312: "Vicuna_13b model runs out of memory on 2 3070 (8GB) GPUs" … "the Vicuna_13b model requires 13GB of
    # GPU memory, but I only have two NVIDIA GeForce RTX3070 GPUs, each with 8GB"
    h = HintsParser()
    h.feed("Vicuna_13b model runs out of memory on 2 3070 (8GB) GPUs")
    h.feed("I understand that the Vicuna_13b model requires 13GB of GPU memory, but I only have two NVIDIA GeForce "
           "RTX3070 GPUs, each with 8GB.")
    hints = h.hints
    assert hints.params == 13e9 and hints.model == "Vicuna_13b"
    assert hints.gpu_memory_bytes == 8 * GiB  # the cards' 8 GB, not the 13 GB the model needs
    assert hints.gpu_count != 3070  # "RTX3070 GPUs" names a model, counts nothing
    h = HintsParser()
    h.feed("the model needs about 20 GB of VRAM")
    assert h.hints.gpu_memory_bytes is None
    h = HintsParser()  # another program's share (sglang#4840): "taking" is what it holds, not the card
    h.feed("*FYI, Windows (the OS) was taking around 1GB of VRAM when I was running this test.*")
    assert h.hints.gpu_memory_bytes is None
    h = HintsParser()
    h.feed("My card has 24 GB of VRAM and 4 GPUs")
    assert h.hints.gpu_memory_bytes == 24 * GiB and h.hints.gpu_count == 4


def test_ggmls_older_cuda_error_line_is_an_oom() -> None:
    # ollama#1236 (ollama 2023's bundled llama.cpp): "CUDA error 2 at …/ggml-cuda.cu:7358: out of memory"
    p = OomParser()
    p.feed("CUDA error 2 at /go/src/github.com/jmorganca/ollama/llm/llama.cpp/gguf/ggml-cuda.cu:7358: out of memory")
    (ev,) = p.result().events
    assert ev.kind != "prose"
    p = OomParser()
    p.feed("a CUDA error 2 at first, then it ran out of memory later")
    assert all(e.kind == "prose" for e in p.result().events)


def test_a_gpus_model_number_before_cards_is_no_count() -> None:
    # vllm#16968: "four 4090 cards" is four cards of the 4090, never 4,090 GPUs; "8x 3090" is eight (the GPU named)
    from diagnose.collectors.oom import ModelHints, parse_hints_line

    for line, count in [("I have four 4090 cards in this machine", None), ("8x 3090 GPUs on a rack", 8),
                        ("RTX 4090 GPUs are fast", None), ("running on 8 GPUs", 8), ("we use 2 cards", 2)]:
        h = ModelHints()
        parse_hints_line(line, h)
        assert h.gpu_count == count, line


def test_a_version_before_a_gpu_count_is_no_model_number() -> None:
    # review: "vLLM 0.6.3 8 GPUs" is eight GPUs; only a number of three digits or more can be a GPU's model
    from diagnose.collectors.oom import ModelHints, parse_hints_line

    for line, count in [("vLLM 0.6.3 8 GPUs", 8), ("CUDA 12.1 4 GPUs", 4), ("Ubuntu 22.04 2 GPUs", 2)]:
        h = ModelHints()
        parse_hints_line(line, h)
        assert h.gpu_count == count, line


def test_vllms_float_dtype_is_float32() -> None:
    # vllm#2140: "--dtype=float" loads a 7B model in float32, 28 GB of weights
    from diagnose.collectors.oom import ModelHints, parse_hints_line

    h = ModelHints()
    parse_hints_line("python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2-7B --dtype=float", h)
    assert h.dtype == "fp32" and h.bytes_per_param == 4.0
    h = ModelHints()
    parse_hints_line("python -m vllm.entrypoints.openai.api_server --model Qwen/Qwen2-7B --dtype float16", h)
    assert h.dtype == "16-bit"
    # numpy's dtype=float in a call is float64 data, not the model's dtype (second review); torch's float is float32
    from diagnose.collectors.oom import _dtype_of

    assert _dtype_of("scores = np.asarray(raw_scores, dtype=float)") is None
    assert _dtype_of("model = AutoModel.from_pretrained(p, torch_dtype=torch.float)") == ("fp32", 4.0)
    assert _dtype_of('{"dtype": "float", "max_model_len": 4096}') == ("fp32", 4.0)


def test_an_oom_with_room_for_the_request_is_not_the_weights() -> None:
    # FastChat#2429: 86 MiB refused with 7.19 GiB free while loading a 7B model on a 16 GB GPU (a reboot fixed it):
    # the device had room, so neither MEM001 nor the report's "fails while loading" names the weights
    from diagnose.model import EvidenceSet
    from diagnose.rules.engine import run_rules

    text = ("out of memory - vicuna-7b-v1.5 when loading model_worker on 16GB GPU\n"
            "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 86.00 MiB (GPU 0; 16.00 GiB total "
            "capacity; 7.36 GiB already allocated; 7.19 GiB free; 7.36 GiB reserved in total by PyTorch)\n")
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    codes = {f.code for f in run_rules(EvidenceSet(res.evidence), decide=False)[0]}
    assert not codes & {"MEM001", "MEM008"}
    # the same load with the device full is the weights'
    full = text.replace("7.36 GiB", "15.70 GiB").replace("7.19 GiB free", "20.00 MiB free")
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO(full.encode())))  # type: ignore[arg-type]
    assert {"MEM001", "MEM008"} & {f.code for f in run_rules(EvidenceSet(res.evidence), decide=False)[0]}


def test_tensorrts_out_of_memory_error_is_an_oom_and_a_possibility_is_none() -> None:
    """NVIDIA/TensorRT-LLM#1609: the builder's "Error Code 2: OutOfMemory" building a bf16 Llama-3-8B on a 12 GB
    card is an out-of-memory error (MEM001: the weights do not fit). nvprof's "This can happen if device ran out of
    memory" offers a cause, it reports none; TensorRT's "Device memory is insufficient to use tactic" is a warning."""
    text = ("I have an RTX 4070super (12 GB of VRAM, ~9GB free)\n"
            "trtllm-build --checkpoint_dir ./tllm_checkpoint_1gpu_bf16 --output_dir ./tmp/llama/8B/trt_engines/bf16/"
            "1-gpu --gpt_attention_plugin bfloat16 --gemm_plugin bfloat16\n"
            "I'm trying to build llama3:8b-instruct\n"
            "[05/15/2024-14:03:05] [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::155] Error Code 2: "
            "OutOfMemory (no further information)\n")
    res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    ev = EvidenceSet(res.evidence)
    assert ev.value("mem.oom_count") == 1
    assert "MEM001" in {f.code for f in run_rules(ev, rules=RULES)[0]}
    for line in ("[E] 2: Requested amount of GPU memory (1073741824 bytes) could not be allocated. There may not be "
                 "enough free memory for allocation to succeed.",):
        got = EvidenceSet(loose.analyze_stream("t", io.BufferedReader(io.BytesIO(line.encode()))).evidence)  # type: ignore[arg-type]
        assert got.value("mem.oom_count") == 1, line
    for line in ("==21941== Warning: This can happen if device ran out of memory or if a device kernel was stopped",
                 "[01/17/2024-22:14:09] [TRT] [W] Tactic Device request: 16512MB Available: 12281MB. Device memory "
                 "is insufficient to use tactic."):
        got = EvidenceSet(loose.analyze_stream("t", io.BufferedReader(io.BytesIO(line.encode()))).evidence)  # type: ignore[arg-type]
        assert "mem.oom_count" not in got and "report.oom_statements" not in got, line


def test_sglangs_weight_load_line_measures_the_weights() -> None:
    """sgl-project/sglang#4895 (sweep CO 03): SGLang's "Load weight end. … avail mem=3.64 GB, mem usage=18.82 GB." is
    the device memory the weights took (GiB, as SGLang prints them), as vLLM's "Loading model weights took"."""
    line = ("[2025-03-29 18:18:34 TP0] Load weight end. type=Gemma3ForConditionalGeneration, dtype=torch.bfloat16, "
            "avail mem=3.64 GB, mem usage=18.82 GB.\n")
    ev = EvidenceSet(loose.analyze_stream("t", io.BufferedReader(io.BytesIO(line.encode()))).evidence)  # type: ignore[arg-type]
    assert ev.value("mem.weights_bytes") == int(18.82 * 2**30)


def test_what_a_second_review_found_in_the_oom_readings() -> None:
    """An OOM stated before a hedge is stated ("ends in out of memory, which could happen because of the weights");
    TensorRT's warning-level refusal and a build that skipped the tactic and went on are no OOM."""
    said = ("Loading Llama-2-70B in fp16 on one RTX 4090 (24 GB) ends in out of memory, which could happen because "
            "of the weights.")
    ev = EvidenceSet(loose.analyze_stream("t", io.BufferedReader(io.BytesIO(said.encode()))).evidence)  # type: ignore[arg-type]
    assert ev.value("mem.oom_count") == 1
    for text in ("[05/15/2024-14:03:05] [TRT] [W] Requested amount of GPU memory (17179869184 bytes) could not be "
                 "allocated. There may not be enough free memory for allocation to succeed.",
                 "[05/15/2024-14:03:05] [TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: "
                 "OutOfMemory (no further information)\n[05/15/2024-14:03:05] [TRT] [W] Skipping tactic 3 due to "
                 "insufficient memory on requested size of 17179869184 detected for tactic 0x0000000000000004.\n"
                 "[05/15/2024-14:05:40] [TRT] [I] Engine generation completed in 155.2 seconds."):
        ev = EvidenceSet(loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode()))).evidence)  # type: ignore[arg-type]
        assert "mem.oom_count" not in ev, text
    # a model named a DeepSeek-R1 distill is published in BF16: its launch loads it as published
    from diagnose.collectors.oom import _PUBLISHED_QUANTISED
    assert _PUBLISHED_QUANTISED.search("deepseek-ai/DeepSeek-R1") and not _PUBLISHED_QUANTISED.search(
        "deepseek-ai/DeepSeek-R1-Distill-Llama-70B")
