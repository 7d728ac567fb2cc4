"""llama.cpp's timing lines: a prompt still processing is the request's time so far, all of it prefill."""

from __future__ import annotations

import io
import os

from diagnose import loose, pipeline
from diagnose.collectors.llamacpp import LlamaTimingParser
from diagnose.model import EvidenceSet
from tests.conftest import DATA


def test_llama_servers_progress_lines_are_read_per_task() -> None:
    p = LlamaTimingParser()
    for line in [
        "slot print_timing: id  3 | task 0 | prompt processing, n_tokens =   2048, progress = 0.02, t =   5.10 s / "
        "401.57 tokens per second",
        "slot print_timing: id  3 | task 0 | prompt processing, n_tokens = 118810, progress = 0.99, t = 401.80 s / "
        "295.70 tokens per second",
        "slot print_timing: id  1 | task 7 | prompt processing, n_tokens =   4096, progress = 0.50, t =   4.00 s / "
        "1024.00 tokens per second",
    ]:
        p.feed(line)
    assert p.result().prefill_progress == {"0": (118810, 0.99, 401.8), "7": (4096, 0.5, 4.0)}


def test_a_prompt_still_processing_makes_the_time_so_far_prefill() -> None:
    """A 120,035-token prompt processed for 412 s with no token generated (ROCm/legacy-rocm-build#5926): before,
    the prompt eval line alone gave no share and no finding; the progress lines say the request's time so far is
    prefill, and TTF001 names it."""
    d = pipeline.analyze([os.path.join(DATA, "logs", "llamaserver_prompt_processing_progress_120k.txt")])
    ev = EvidenceSet(d.evidence)
    assert ev.value("stage.prefill.share") == 1.0
    assert ev.value("stage.prefill_ms.mean") == 412324.08  # the prompt eval line, not the last progress line
    assert ev.value("tokens.input_mean") == 120035
    assert d.findings[0].code == "TTF001", [f.code for f in d.findings]


def test_a_finished_generation_outweighs_progress_lines() -> None:
    """Progress lines of a prompt that then generated are no 'still processing': the whole block's share holds."""
    p_lines = [
        "slot print_timing: id  0 | task 2 | prompt processing, n_tokens = 8192, progress = 0.80, t = 6.00 s / "
        "1365.33 tokens per second",
        "prompt eval time =    7500.00 ms / 10240 tokens (    0.73 ms per token,  1365.33 tokens per second)",
        "       eval time =   30000.00 ms /   600 tokens (   50.00 ms per token,    20.00 tokens per second)",
        "      total time =   37500.00 ms / 10840 tokens",
    ]
    res = loose.analyze_stream("p", io.BufferedReader(io.BytesIO("\n".join(p_lines).encode())))
    ev = EvidenceSet(res.evidence)
    assert ev.value("stage.prefill.share") == 0.2
