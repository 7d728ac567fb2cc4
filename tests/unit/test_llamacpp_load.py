"""llama.cpp's model loader says where the layers went: read as measured placement (PLC004), not as prose."""

from __future__ import annotations

import io
import os

from diagnose import loose, pipeline
from diagnose.collectors.llamacpp import LlamaTimingParser
from diagnose.model import Confidence, Evidence, EvidenceSet
from diagnose.rules.base import gpu_in_view
from diagnose.rules.engine import run_rules
from tests.conftest import DATA

LOGS = os.path.join(DATA, "logs")


def _analyze(name: str) -> pipeline.Diagnosis:
    return pipeline.analyze([os.path.join(LOGS, name)])


def test_the_loaders_offload_line_in_every_generation() -> None:
    for line, want in [
        ("load_tensors: offloaded 0/29 layers to GPU", (0, 29)),  # llama.cpp 2025
        ("llm_load_tensors: offloaded 6/33 layers to GPU", (6, 33)),  # llama.cpp 2024, ollama's runner
        ("llama_model_load_internal: offloaded 35/35 layers to GPU", (35, 35)),  # GGML-era llama.cpp
        ("Dec 01 10:00:00 host ollama[7395]: llm_load_tensors: offloaded 39/81 layers to GPU", (39, 81)),
    ]:
        p = LlamaTimingParser()
        p.feed(line)
        assert p.result().offloaded == want
    p = LlamaTimingParser()
    p.feed("load_tensors: offloading 0 repeating layers to GPU")  # the count without the total
    assert p.result().offloaded is None


def test_no_layer_offloaded_on_a_gpu_build_is_measured_placement() -> None:
    d = _analyze("llamacpp_load_offloaded_0_of_29.txt")  # llama.cpp#12614
    ev = EvidenceSet(d.evidence)
    assert ev.value("llamacpp.gpu_layers") == 0 and ev.value("llamacpp.layers_total") == 29
    backend = ev.get("llamacpp.gpu_backend")
    assert backend is not None and backend.value == "CUDA0" and gpu_in_view(ev)  # its CUDA0 compute buffer
    top = d.findings[0]
    assert top.code == "PLC004" and top.confidence is Confidence.MEASURED and top.impact == 1.0
    assert "offloaded 0 of the model's 29 layers" in top.message and "(CUDA0)" in top.message and "-ngl" in top.message
    assert "PLC001" not in {f.code for f in d.findings}  # the report rule steps aside for the measurement


def test_most_layers_on_the_gpu_or_an_oom_is_no_misplacement() -> None:
    d = _analyze("ollama_load_offloaded_31_of_33.txt")  # ollama#8393: 31 of 33 on the GPU
    assert EvidenceSet(d.evidence).value("llamacpp.gpu_layers") == 31
    assert "PLC004" not in {f.code for f in d.findings}
    d = _analyze("ollama_load_offloaded_6_of_33_oom.txt")  # ollama#2706: 6 of 33, then out of memory
    assert EvidenceSet(d.evidence).value("llamacpp.gpu_layers") == 6
    assert "PLC004" not in {f.code for f in d.findings}


def _judge(*lines: str) -> tuple[EvidenceSet, set[str]]:
    res = loose.analyze_stream("x", io.BufferedReader(io.BytesIO("\n".join(lines).encode())))
    ev = EvidenceSet(res.evidence)
    findings, _ = run_rules(ev)
    return ev, {f.code for f in findings}


def test_the_offload_line_alone_puts_no_gpu_in_view() -> None:
    # ollama logs it on every load, llama.cpp wherever an RPC backend is built in (its CPU release packages)
    ev, codes = _judge('time=2025-01-08T10:00:00.000Z level=INFO source=gpu.go:386 msg="no compatible GPUs were '
                       'discovered"', "llm_load_tensors: offloaded 0/35 layers to GPU",
                       "llm_load_tensors:   CPU_Mapped model buffer size =  4437.80 MiB")
    assert ev.value("llamacpp.gpu_layers") == 0 and "llamacpp.gpu_backend" not in ev
    assert "PLC004" not in codes  # the report rule may still read the line as a reporter's cue (PLC001)


def test_ollama_sizing_the_offload_to_memory_names_the_fit_not_a_forgotten_flag() -> None:
    """Ollama put what fits (10 of 33 layers in 3.7 GiB free, 9.4 GiB wanted): the layers on the CPU set the pace,
    and the fix is to make the model fit; never "a GPU to put them on" (the -ngl advice of a forgotten flag)."""
    ev, _ = _judge('time=2024-05-10T07:52:21.000Z level=INFO source=memory.go:133 msg="offload to gpu" '
                   'layers.requested=-1 layers.model=33 layers.offload=10 memory.available="3.7 GiB" '
                   'memory.required.full="9.4 GiB"', "llm_load_tensors: offloaded 10/33 layers to GPU",
                   "llm_load_tensors:      CUDA0 buffer size =  1100.00 MiB")
    (plc,) = [f for f in run_rules(ev)[0] if f.code == "PLC004"]
    assert "found room for" in plc.message and "had a GPU" not in plc.message


def test_the_served_model_counts_not_a_draft_beside_it() -> None:
    p = LlamaTimingParser()
    for line in ("load_tensors: offloaded 0/29 layers to GPU", "load_tensors: offloaded 81/81 layers to GPU",
                 "load_tensors: offloaded 0/25 layers to GPU"):  # the main model, then a draft kept on the CPU
        p.feed(line)
    assert p.result().offloaded == (81, 81)


def test_of_two_runs_of_the_served_model_the_one_left_on_the_cpu_counts() -> None:
    """ollama/ollama#3938 (sweep BO 01), 'Massive performance regression on 0.1.32': 0.1.31's load offloaded 33/33
    layers, 0.1.32's 1/29 (a Metal buffer of 148.53 MiB beside 4773.90 MiB on the CPU). The largest load's 33/33 hid
    the regression; of loads of the served model's size the last counts, and PLC004 names it, measured. A run fixed
    afterwards ("offloaded 0/33" forgetting -ngl, then "33/33") counts as fixed, and a draft llama-server announced
    is never the served model, whatever its layers (a review's repros)."""
    p = LlamaTimingParser()
    for line in ("llm_load_tensors: offloaded 33/33 layers to GPU", "llm_load_tensors: offloaded 1/29 layers to GPU"):
        p.feed(line)
    assert p.result().offloaded == (1, 29)
    for lines, want in [(("load_tensors: offloaded 0/33 layers to GPU", "load_tensors: offloaded 33/33 layers to GPU"),
                         (33, 33)),
                        (("load_tensors: offloaded 37/37 layers to GPU",
                          "srv    load_model: loading draft model 'Qwen3-0.6B-Q8_0.gguf'",
                          "load_tensors: offloaded 0/29 layers to GPU"), (37, 37))]:
        q = LlamaTimingParser()
        for line in lines:
            q.feed(line)
        assert q.result().offloaded == want, lines
    log = ("Massive performance regression on 0.1.32\nVersion 0.1.31\n```\n"
           "llm_load_tensors: offloaded 33/33 layers to GPU\n"
           "llm_load_tensors:      Metal buffer size =  3577.57 MiB\n```\nVersion0.1.32\n```\n"
           "llm_load_tensors: offloaded 1/29 layers to GPU\n"
           "llm_load_tensors:        CPU buffer size =  4773.90 MiB\n"
           "llm_load_tensors:      Metal buffer size =   148.53 MiB\n```\n")
    ev = EvidenceSet(loose.analyze_stream("t", io.BufferedReader(io.BytesIO(log.encode()))).evidence)  # type: ignore[arg-type]
    (plc,) = [f for f in run_rules(ev)[0] if f.code == "PLC004"]
    assert plc.confidence is Confidence.MEASURED and "1 of the model's 29" in plc.message


def test_a_cpu_only_build_prints_no_offload_line() -> None:
    log = os.path.join(DATA, "engines", "llamacpp", "model-name-L4-py", "server.log")  # the lab's CPU-only build
    ev = EvidenceSet(pipeline.analyze([log]).evidence)
    assert "llamacpp.gpu_layers" not in ev and not gpu_in_view(ev)


def test_ollamas_offload_record_says_the_layers_and_the_weights() -> None:
    """Ollama's offload record (llm/memory.go, a slog record, quoted in a thread as ollama/ollama#8143 has it): the
    layers it put on the GPU it names of the model's, and the weights' size on a load onto one GPU; sized by ollama
    (layers.requested=-1): the model does not fit, and the 23 layers left on the CPU set the pace (PLC004, its fix to
    make the model fit)."""
    rec = ('> Dec 26 13:59:52 DESKTOP-KO76CAD ollama[110]: time=2024-12-26T13:59:52.591+01:00 level=INFO '
           'source=memory.go:343 msg="offload to cuda" layers.requested=-1 layers.model=49 layers.offload=26 '
           'layers.split="" memory.available="[10.8 GiB]" memory.gpu_overhead="0 B" memory.required.full="19.1 GiB" '
           'memory.required.partial="10.8 GiB" memory.required.kv="384.0 MiB" memory.weights.total="17.8 GiB"')
    res = loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO(rec.encode())))
    ev = EvidenceSet(res.evidence)
    assert ev.value("llamacpp.gpu_layers") == 26 and ev.value("llamacpp.layers_total") == 49
    backend = ev.get("llamacpp.gpu_backend")
    assert isinstance(backend, Evidence) and backend.value == "CUDA" and ev.value("llamacpp.offload_auto_sized")
    assert "mem.weights_bytes" not in ev  # the weights' total is the whole model's, and 26 of 49 layers went to the GPU
    assert "report.offload_statements" not in ev  # the quoted record is a log record, not the reporter's words
    findings, _ = run_rules(ev)
    (plc,) = [f for f in findings if f.code == "PLC004"]
    assert "ollama offloaded what it found room for" in plc.message and "make the model and its context fit" \
        in plc.message
    # a tenth of the layers left on the CPU is no finding from the record alone (the output layer costs little)
    few = EvidenceSet(loose.analyze_stream("<stdin>", io.BufferedReader(io.BytesIO(
        rec.replace("layers.offload=26", "layers.offload=45").encode()))).evidence)
    assert "PLC004" not in {f.code for f in run_rules(few)[0]}
    # every layer on the one GPU listed: the weights' total is that device's
    whole = rec.replace("layers.offload=26", "layers.offload=49").removeprefix("> ")
    p = LlamaTimingParser()
    p.feed(whole)
    assert p.result().weights_bytes == int(17.8 * 2**30) and p.result().offloaded == (49, 49)
    # two GPUs: the weights are split between them, their total is no one device's
    p = LlamaTimingParser()
    p.feed(whole.replace('memory.available="[10.8 GiB]"', 'memory.available="[10.8 GiB 10.8 GiB]"'))
    assert p.result().weights_bytes is None and p.result().offloaded == (49, 49)
    # num_gpu set (layers.requested=49): the runner is asked for 49 whatever fits; the loader's own line outranks the
    # record's estimate (a review's repro: no PLC004 from the estimate's 20)
    p = LlamaTimingParser()
    p.feed(rec.replace("layers.requested=-1", "layers.requested=49").replace("layers.offload=26",
                                                                               "layers.offload=20").removeprefix("> "))
    assert p.result().offloaded == (49, 49)
    p.feed("llm_load_tensors: offloaded 30/49 layers to GPU")
    assert p.result().offloaded == (30, 49) and not p.result().ollama_offload
    # 2025's record: msg=offload library=cuda
    p = LlamaTimingParser()
    p.feed('time=2025-06-01T10:00:00.000Z level=INFO source=server.go:168 msg=offload library=cuda '
           'layers.requested=-1 layers.model=33 layers.offload=33 layers.split=[33] memory.available="[23.3 GiB]"')
    assert p.result().offloaded == (33, 33) and p.result().ollama_backend == "CUDA"
    # offload to the CPU (no GPU found) says nothing of a GPU
    p = LlamaTimingParser()
    p.feed(rec.replace('"offload to cuda"', '"offload to cpu"').removeprefix("> "))
    assert p.result().offloaded is None and p.result().gpu_backend is None


def test_a_partial_offload_with_the_gpu_measured_waiting_is_measured_placement() -> None:
    """ollama#3301: 23 of 33 layers on the GPU is more than half, but nvidia-smi shows the GPU 15 % busy: the CPU
    computes its 10 layers many times slower and the GPU waits for them. The same offload with the GPU busy, or not
    measured, is left to the report rules."""
    d = _analyze("llamacpp_partial_offload_23_of_33_gpu_15pct.txt")
    top = d.findings[0]
    assert top.code == "PLC004" and top.confidence is Confidence.MEASURED and abs(top.impact - 0.85) < 1e-9
    assert "offloaded 23 of the model's 33 layers" in top.message and "15 % busy" in top.message
    lines = ["llm_load_tensors: offloaded 23/33 layers to GPU",
             "llm_load_tensors:      CUDA0 buffer size = 17999.66 MiB"]
    assert "PLC004" not in _judge(*lines)[1]
    busy = "| 30%   44C    P2             350W / 370W |  22070MiB / 24576MiB |     97%      Default |"
    ev, codes = _judge(*lines, busy)
    assert ev.value("gpu.util_ratio") == 0.97 and "PLC004" not in codes
    ev, codes = _judge(*lines, busy.replace("97%", "12%"))
    assert ev.value("gpu.util_ratio") == 0.12 and "PLC004" in codes


def test_metal_allocations_against_the_recommended_working_set() -> None:
    """Metal's allocation lines in each generation give their running total against the GPU's recommended working
    set (MiB however the unit is written; glued to the warning, or several on one line): MEM014 reads a model that
    does not fit it. Where the weights fit (llama.cpp#3606: a 9 GB 'data' buffer under a 21 GB working set, the rest
    allocated before) or their share is unknown and the total only a little past (h2ogpt#1311), no finding."""
    for name, total, ws, model in [
        ("llamacpp_metal_working_set_26g_of_8g_intel_mac.txt", 26062.74, 8176.00, None),  # llama.cpp#5206
        ("llamacpp_metal_add_buffer_2023_data_over_working_set.txt", 31416.42, 21845.34, 8967.25),
        ("llamacpp_metal_kv_alloc_past_4g_working_set.txt", 5034.34, 4096.00, None),
        ("llamacpp_metal_2024_model_buffer_over_1536m.txt", 5895.25, 1536.00, 4988.00),  # llama.cpp#8886
    ]:
        d = _analyze(name)
        ev = EvidenceSet(d.evidence)
        assert ev.value("llamacpp.metal_allocated_bytes") == int(total * 2**20), name
        assert ev.value("llamacpp.metal_working_set_bytes") == int(ws * 2**20), name
        assert ev.value("llamacpp.metal_model_bytes") == (int(model * 2**20) if model else None), name
        mem014 = [f for f in d.findings if f.code == "MEM014"]
        if name.endswith(("intel_mac.txt", "1536m.txt")):
            assert mem014 and mem014[0].category.value == "oom_weights", name
            assert "recommended working set" in mem014[0].message
        else:
            assert not mem014, name


def test_a_partial_offload_is_not_judged_on_an_idle_snapshot_or_an_idle_second_gpu() -> None:
    """The review's counter-examples: one nvidia-smi reading in P8 taken before any request, and a busy GPU beside an
    idle second one (their mean 46 %), say nothing of the GPU waiting for the CPU's layers."""
    load = ["llm_load_tensors: offloaded 30/33 layers to GPU",
            "llm_load_tensors:      CUDA0 buffer size = 20095.05 MiB"]
    idle = "| 30%   44C    P8              25W / 370W |   5070MiB / 24576MiB |      0%      Default |"
    ev, codes = _judge(*load, idle)
    assert ev.value("gpu.util_ratio") == 0.0 and "PLC004" not in codes
    two = ["|   0  NVIDIA GeForce RTX 3090        Off | 00000000:08:00.0 Off |                  N/A |",
           "| 30%   64C    P2             340W / 370W |  22070MiB / 24576MiB |     92%      Default |",
           "|   1  NVIDIA GeForce RTX 3090        Off | 00000000:09:00.0 Off |                  N/A |",
           "| 30%   34C    P8              20W / 370W |      2MiB / 24576MiB |      0%      Default |"]
    ev, codes = _judge(*load, *two)
    assert ev.value("gpu.util_max_ratio") == 0.92 and "PLC004" not in codes


def test_metal_loads_are_judged_one_by_one() -> None:
    """The review's counter-examples: the same model run twice (past the working set once, by a 32k KV cache), and
    two Macs in one text (a 25 GiB model under a 48 GiB working set, a 2 GiB one under 5.3 GiB): no load's weights
    exceed its own working set, so no finding, and no figure mixes two loads."""
    runs = ["ggml_backend_metal_buffer_from_ptr: allocated buffer, size =  6290.00 MiB, ( 6290.07 / 10922.67)",
            "llm_load_tensors:      Metal buffer size =  6290.00 MiB",
            "ggml_backend_metal_log_allocated_size: allocated buffer, size =  5296.00 MiB, (11586.07 / 10922.67)",
            "ggml_backend_metal_buffer_from_ptr: allocated buffer, size =  6290.00 MiB, ( 6290.07 / 10922.67)",
            "llm_load_tensors:      Metal buffer size =  6290.00 MiB"]
    ev, codes = _judge(*runs)
    assert ev.value("llamacpp.metal_model_bytes") == (6290 * 2**20) and "MEM014" not in codes
    macs = ["ggml_backend_metal_buffer_from_ptr: allocated buffer, size = 26000.00 MiB, (26000.07 / 49152.00)",
            "llm_load_tensors:      Metal buffer size = 26000.00 MiB",
            "ggml_backend_metal_buffer_from_ptr: allocated buffer, size =  2000.00 MiB, ( 2000.07 /  5461.34)",
            "llm_load_tensors:      Metal buffer size =  2000.00 MiB"]
    ev, codes = _judge(*macs)
    assert "MEM014" not in codes
    # the load nearest its working set (the M2's, 53 %), with its own figures, none of the other's
    assert ev.value("llamacpp.metal_allocated_bytes") == int(26000.07 * 2**20)
    assert ev.value("llamacpp.metal_working_set_bytes") == (49152 * 2**20)
    assert ev.value("llamacpp.metal_model_bytes") == (26000 * 2**20)
    # an absurd number in an allocation line is no crash
    _judge("ggml_backend_metal_log_allocated_size: allocated buffer, size = 1 MiB, (" + "9" * 400 + " / 0.001)")


def test_a_guessed_weight_size_is_no_proof_the_model_does_not_fit() -> None:
    """A review's repro: llama-2-13b-chat (its GGUF's quantisation unsaid: 16-bit is a guess) with 30 of 41 layers
    on a 12 GB card is no 'does not fit' finding; where ollama sized the offload, making it fit is the first fix."""
    ev, codes = _judge("Running llama-2-13b-chat on my RTX 3060 12GB with llama.cpp, only 4 tokens/s.",
                       "llm_load_tensors: offloaded 30/41 layers to GPU",
                       "llm_load_tensors:        CPU buffer size =  1984.00 MiB",
                       "llm_load_tensors:      CUDA0 buffer size =  5355.00 MiB")
    assert "PLC004" not in codes
    ev, _ = _judge('time=2024-05-10T07:52:21.000Z level=INFO source=memory.go:133 msg="offload to gpu" '
                   'layers.requested=-1 layers.model=33 layers.offload=10 memory.available="3.7 GiB" '
                   'memory.required.full="9.4 GiB"', "llm_load_tensors: offloaded 10/33 layers to GPU",
                   "llm_load_tensors:      CUDA0 buffer size =  1100.00 MiB")
    (plc,) = [f for f in run_rules(ev)[0] if f.code == "PLC004"]
    assert plc.fixes[0].summary == "Make the layers fit"
