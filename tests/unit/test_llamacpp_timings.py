"""llama.cpp's timing lines: a prompt still processing is the request's time so far, all of it prefill."""

from __future__ import annotations

import io
import os
from pathlib import Path

from diagnose import loose, pipeline
from diagnose.collectors.llamacpp import LlamaTimingParser
from diagnose.model import EvidenceSet
from diagnose.rules.engine import run_rules
from diagnose.rules.registry import RULES
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
    """A 120,035-token prompt's progress lines (ROCm/legacy-rocm-build#5926) with nothing after them: no prompt
    finished, no token generated, so the request's time so far is prefill and TTF001 names it (before: unreadable).
    The same paste with its 'prompt eval time' line is a request that ended (llama-server prints it with the eval
    time when a request ends, and the paste cut the rest): its prefill is read, no share is claimed."""
    lines = Path(DATA, "logs", "llamaserver_prompt_processing_progress_120k.txt").read_text().splitlines()
    progress = [ln for ln in lines if "prompt processing, n_tokens" in ln]
    res = loose.analyze_stream("p", io.BufferedReader(io.BytesIO("\n".join(progress).encode())))
    ev = EvidenceSet(res.evidence)
    assert ev.value("stage.prefill.share") == 1.0 and ev.value("stage.prefill_ms.mean") == 401800.0
    findings, _ = run_rules(ev, rules=RULES)
    assert findings[0].code == "TTF001", [f.code for f in findings]
    d = pipeline.analyze([os.path.join(DATA, "logs", "llamaserver_prompt_processing_progress_120k.txt")])
    whole = EvidenceSet(d.evidence)
    assert "stage.prefill.share" not in whole and whole.value("stage.prefill_ms.mean") == 412324.08


def test_a_generation_under_way_is_no_prompt_still_processing() -> None:
    """A prompt's progress lines, then its generation's ('n_decoded = …, tg = …'), then a prompt eval line cut
    before its eval time: decoding had begun, the prefill is not the request's whole time."""
    text = "\n".join([
        "slot print_timing: id  0 | task 12 | prompt processing, n_tokens = 4096, progress = 0.65, t = 4.10 s / "
        "999.02 tokens per second",
        "slot print_timing: id  0 | task 12 | n_decoded =    700, tg =  10.00 t/s",
    ])
    ev = EvidenceSet(loose.analyze_stream("p", io.BufferedReader(io.BytesIO(text.encode()))).evidence)
    assert "stage.prefill.share" not in ev


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


SAMPLED = """llama_print_timings:        load time =    1234.10 ms
llama_print_timings:      sample time =   {sample} ms /   151 runs   (   77.98 ms per token,    12.82 tokens per second)
llama_print_timings: prompt eval time =    1651.82 ms /   312 tokens (    5.29 ms per token,   188.88 tokens per second)
llama_print_timings:        eval time =    3479.97 ms /   150 runs   (   23.20 ms per token,    43.10 tokens per second)
llama_print_timings:       total time =   17029.76 ms
"""


def test_the_samplers_time_is_post_processing_beside_prefill_and_decode() -> None:
    """llama.cpp's 'sample time' is the sampler's work on the CPU, apart from eval (a grammar checked against the
    vocabulary at every token: 11.8 s of 17 s, llama-cpp-agent#36's form); it was dropped, and eval's 96 % of
    prompt eval + eval read as the model's own time. A small one changes nothing (localGPT's 365 ms of 616 s)."""
    res = loose.read_text("x", io.BytesIO(SAMPLED.format(sample="11775.43").encode()))
    ev = EvidenceSet(res.evidence)
    assert abs((ev.value("stage.postprocess.share") or 0) - 11775.43 / (11775.43 + 1651.82 + 3479.97)) < 1e-3
    assert abs((ev.value("stage.decode.share") or 0) - 3479.97 / (11775.43 + 1651.82 + 3479.97)) < 1e-3
    findings, _ = run_rules(ev, rules=RULES)
    assert findings[0].code == "STG001" and "sampler" in " ".join(findings[0].fixes[0].steps)
    small = EvidenceSet(loose.read_text("x", io.BytesIO(SAMPLED.format(sample="3.10").encode())).evidence)
    assert (small.value("stage.postprocess.share") or 1) < 0.01
    assert "STG001" not in [f.code for f in run_rules(small, rules=RULES)[0]]


def test_a_samplers_line_opens_the_next_block_when_no_total_closed_the_last() -> None:
    block = "\n".join(line for line in SAMPLED.format(sample="9000.00").splitlines() if "total time" not in line)
    ev = EvidenceSet(loose.read_text("x", io.BytesIO((block + "\n" + block + "\n").encode())).evidence)
    assert ev.value("requests.count") == 2
    assert abs((ev.value("stage.postprocess.share") or 0) - 9000 / (9000 + 1651.82 + 3479.97)) < 1e-3


def test_koboldcpps_init_is_the_hosts_work_before_the_prompt() -> None:
    """koboldcpp#1453: newer koboldcpp leads its summary with Init (tokenising, fast-forwarding the context: the host's
    work before prompt processing, outside its Total); a 3.19 s Init beside 0.02 s of prompt processing was dropped
    and the case read as prefill."""
    text = ("[00:22:17] CtxLimit:9342/49664, Amt:23/1024, Init:0.02s, Process:0.02s (52.63T/s), Generate:0.82s "
            "(28.08T/s),\n Total:0.84s\n"
            "[00:24:07] CtxLimit:8519/49664, Amt:23/1024, Init:3.19s, Process:0.02s (55.56T/s), Generate:0.81s "
            "(28.43T/s),\n Total:0.83s\n")
    p = LlamaTimingParser()
    for line in text.splitlines():
        p.feed(line)
    gens = p.result().generations
    assert [g.init_ms for g in gens] == [20.0, 3190.0] and [g.prompt_ms for g in gens] == [20.0, 20.0]
    res = loose.analyze_stream("k", io.BufferedReader(io.BytesIO(text.encode())))
    ev = EvidenceSet(res.evidence)
    share = ev.value("stage.preprocess.share")
    assert share is not None and abs(share - 3210.0 / (3210.0 + 40.0 + 1630.0)) < 1e-9
    findings, _ = run_rules(ev, rules=RULES)
    assert findings[0].code == "STG001"
    # an LLM server's preparation gets its own fix, not an image pipeline's (JPEG on the GPU, DALI, pillow-simd)
    assert [fx.summary for fx in findings[0].fixes] == ["Find what koboldcpp's Init spends its time on"]
    # an older summary without Init reads as before: no pre-processing stage
    old = "Process:12.34s (8.8ms/T = 113.6T/s), Generate:4.56s (45.6ms/T = 21.9T/s), Total:16.90s\n"
    res = loose.analyze_stream("k", io.BufferedReader(io.BytesIO(old.encode())))
    assert EvidenceSet(res.evidence).value("stage.preprocess.share") is None


def test_a_pastes_draft_label_keeps_the_draft_models_timings_out() -> None:
    """ggml-org/llama.cpp#3649 (sweep CS 06): speculative decoding's two models pasted under "draft:" and "target:";
    the draft's one 525 ms sample was read as the served model's post-processing (STG001 at 61 %). The draft's
    timings are not the served model's generation."""
    text = """draft:

llama_print_timings:        load time =      65.11 ms
llama_print_timings:      sample time =     524.95 ms /     1 runs   (  524.95 ms per token,     1.90 tokens per second)
llama_print_timings: prompt eval time =       8.59 ms /    94 tokens (    0.09 ms per token, 10946.78 tokens per second)
llama_print_timings:        eval time =     322.80 ms /   216 runs   (    1.49 ms per token,   669.15 tokens per second)
llama_print_timings:       total time =    2924.72 ms

target:

llama_print_timings:        load time =    1144.77 ms
llama_print_timings:      sample time =       4.02 ms /   259 runs   (    0.02 ms per token, 64411.84 tokens per second)
llama_print_timings: prompt eval time =    1939.02 ms /   351 tokens (    5.52 ms per token,   181.02 tokens per second)
"""
    p = LlamaTimingParser()
    for line in text.splitlines():
        p.feed(line)
    gens = p.result().generations
    assert len(gens) == 1 and gens[0].prompt_ms == 1939.02 and gens[0].sample_ms == 4.02
    res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    assert "STG001" not in {f.code for f in run_rules(EvidenceSet(res.evidence), rules=RULES)[0]}
    # no label: both blocks are the served model's runs, as before
    p = LlamaTimingParser()
    for line in text.replace("draft:", "").replace("target:", "").splitlines():
        p.feed(line)
    assert len(p.result().generations) == 2


def test_a_long_prompts_prefill_alone_is_the_floor_of_its_first_token() -> None:
    """FaqFirebase/pi-desktop#58 (sweep CF 05): llama.cpp's "prompt eval time = 22516.67 ms / 26708 tokens" with no
    eval line and no TTFT measured: the first token comes after that prefill, so TTF001 names the long prompt
    (heuristic: the rate cannot be judged without the model and the GPU). A short prompt's prefill is no finding."""
    line = "prompt eval time = 22516.67 ms / 26708 tokens (0.84 ms per token, 1186.14 tokens per second)\n"
    res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(line.encode())))  # type: ignore[arg-type]
    (f,) = [x for x in run_rules(EvidenceSet(res.evidence), rules=RULES)[0] if x.code == "TTF001"]
    assert "take 22.52 s to prefill" in f.message and "before their first token" in f.message
    short = "prompt eval time = 220.67 ms / 267 tokens (0.84 ms per token, 1186.14 tokens per second)\n"
    res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(short.encode())))  # type: ignore[arg-type]
    assert "TTF001" not in {x.code for x in run_rules(EvidenceSet(res.evidence), rules=RULES)[0]}


def test_a_sentence_that_starts_with_draft_is_no_label() -> None:
    p = LlamaTimingParser()
    for line in ("The draft model is not involved here",
                 "llama_print_timings:      sample time =    6200.00 ms /   300 runs   (   20.67 ms per token)",
                 "llama_print_timings: prompt eval time =     900.00 ms /    94 tokens",
                 "llama_print_timings:        eval time =    3000.00 ms /   300 runs",
                 "llama_print_timings:       total time =   10100.00 ms"):
        p.feed(line)
    assert len(p.result().generations) == 1
