"""llama.cpp's model loader says where the layers went: read as measured placement (PLC004), not as prose."""

from __future__ import annotations

import os

from diagnose import pipeline
from diagnose.collectors.llamacpp import LlamaTimingParser
from diagnose.model import Confidence, EvidenceSet
from diagnose.rules.base import gpu_in_view
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
    assert gpu_in_view(ev)  # the loader prints the line only where a GPU backend can take layers
    top = d.findings[0]
    assert top.code == "PLC004" and top.confidence is Confidence.MEASURED and top.impact == 1.0
    assert "offloaded 0 of the model's 29 layers" in top.message and "-ngl" in top.message
    assert "PLC001" not in {f.code for f in d.findings}  # the report rule steps aside for the measurement


def test_most_layers_on_the_gpu_or_an_oom_is_no_misplacement() -> None:
    d = _analyze("ollama_load_offloaded_31_of_33.txt")  # ollama#8393: 31 of 33 on the GPU
    assert EvidenceSet(d.evidence).value("llamacpp.gpu_layers") == 31
    assert "PLC004" not in {f.code for f in d.findings}
    d = _analyze("ollama_load_offloaded_6_of_33_oom.txt")  # ollama#2706: 6 of 33, then out of memory
    assert EvidenceSet(d.evidence).value("llamacpp.gpu_layers") == 6
    assert "PLC004" not in {f.code for f in d.findings}


def test_a_cpu_only_build_prints_no_offload_line() -> None:
    log = os.path.join(DATA, "engines", "llamacpp", "model-name-L4-py", "server.log")  # the lab's CPU-only build
    ev = EvidenceSet(pipeline.analyze([log]).evidence)
    assert "llamacpp.gpu_layers" not in ev and not gpu_in_view(ev)
