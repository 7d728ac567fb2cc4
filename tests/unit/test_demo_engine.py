"""The demo service's generation engine, stepped by hand (its thread never started): what each
step prefills without and with chunked prefill, and that a long prompt holds up a short one only
without it."""

from __future__ import annotations

import time

import pytest
import torch

from examples.service.engine import GenerationEngine, GenRequest
from examples.service.model import DecoderConfig, TinyDecoderLM

CFG = DecoderConfig(vocab=97, d_model=32, n_heads=4, d_hidden=64, n_layers=2, max_model_len=512)


@pytest.fixture(scope="module")
def model() -> TinyDecoderLM:
    torch.manual_seed(0)
    return TinyDecoderLM(CFG).eval()


def _request(name: str, prompt_len: int, max_tokens: int = 2) -> GenRequest:
    return GenRequest(name, [1 + i % 90 for i in range(prompt_len)], max_tokens, time.perf_counter(), seed=1)


def _run(engine: GenerationEngine, *reqs: GenRequest) -> tuple[list[int], dict[str, int]]:
    """Step until every request finished: the prompt tokens of each step, and the step of each first token."""
    prompt_per_step: list[int] = []
    engine.on_tokens = lambda prompt, **_: prompt_per_step.append(prompt)
    for r in reqs:
        engine.submit(r)
    first: dict[str, int] = {}
    while not all(r.finished for r in reqs):
        assert len(prompt_per_step) < 50, "the engine makes no progress"
        assert engine.step()
        for r in reqs:
            if r.output and r.request_id not in first:
                first[r.request_id] = len(prompt_per_step)
    for r in reqs:
        assert r.error is None and len(r.output) == r.max_tokens and r.prefilled == len(r.prompt)
    return prompt_per_step, first


def test_without_chunked_prefill_a_whole_prompt_fills_a_step_and_the_next_prompt_waits(model: TinyDecoderLM) -> None:
    engine = GenerationEngine(model, max_num_batched_tokens=128)
    long, short = _request("long", 300), _request("short", 20)
    prompt_per_step, first = _run(engine, long, short)
    # the long prompt is admitted whole although it is over the budget (nothing else is running);
    # the short one does not fit beside it and waits a step
    assert prompt_per_step[:2] == [300, 20]
    assert first == {"long": 1, "short": 2}
    assert engine.prefills == 2 and engine.steps == len(prompt_per_step)


def test_chunked_prefill_cuts_prompts_to_the_budget_and_keeps_room_for_waiting_ones(model: TinyDecoderLM) -> None:
    engine = GenerationEngine(model, max_num_batched_tokens=128, chunked_prefill=True, long_prefill_token_threshold=32)
    long, short = _request("long", 300), _request("short", 20)
    prompt_per_step, first = _run(engine, long, short)
    # step 1: the long prompt's first 128 tokens; step 2: 96 more of it (32 kept for the waiting
    # short prompt), the short prompt whole; step 3: the long prompt's last 76 beside two decodes
    assert prompt_per_step[:3] == [128, 96 + 20, 76]
    assert first == {"short": 2, "long": 3}
    assert engine.prefills == 2


def test_chunked_and_whole_prompt_prefill_sample_the_same_tokens(model: TinyDecoderLM) -> None:
    outputs = []
    for chunked in (False, True):
        req = _request("r", 300, max_tokens=4)
        _run(GenerationEngine(model, max_num_batched_tokens=64 if chunked else None, chunked_prefill=chunked), req)
        outputs.append(req.output)
    assert outputs[0] == outputs[1]


def test_a_stopped_engine_takes_no_step_and_refuses_requests(model: TinyDecoderLM) -> None:
    engine = GenerationEngine(model)
    engine.stop()
    assert engine.step() is False
    with pytest.raises(RuntimeError, match="shutting down"):
        engine.submit(_request("late", 4))
