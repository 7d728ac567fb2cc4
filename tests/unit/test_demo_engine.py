"""The demo service's serving loops (examples/service/engine.py).

The worker pool with a model that holds its first forward until the test lets it go: one worker
serves request by request, a batching one serves what queued meanwhile in one forward. The
generation engine stepped by hand (its thread never started): what each step prefills without and
with chunked prefill, and that a long prompt holds up a short one only without it."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch
from torch import nn

from diagnose.examples.service.engine import GenerationEngine, GenRequest, Job, WorkerPool
from diagnose.examples.service.model import DecoderConfig, TinyDecoderLM


class GatedModel(nn.Module):
    """Echoes its input as logits, recording each batch size; the first forward waits for ``gate``."""

    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.entered, self.gate = threading.Event(), threading.Event()
        self.batch_sizes: list[int] = []
        self.fail = fail

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(x.shape[0])
        if not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(30), "the test did not open the gate"
        if self.fail:
            raise RuntimeError("the model failed")
        return x.float()


def _serve_five(pool: WorkerPool, model: GatedModel) -> list[Job]:
    """One job that holds a worker, four more (queued behind it when it is the only worker), then all go through."""
    jobs = [pool.submit(torch.tensor([[1]]))]
    assert model.entered.wait(30)
    jobs += [pool.submit(torch.tensor([[i]])) for i in range(2, 6)]
    assert pool.busy
    if len(pool.threads) == 1:
        assert pool.jobs.qsize() == 4
    model.gate.set()
    for job in jobs:
        assert job.done.wait(30)
    pool.stop()
    assert not any(t.is_alive() for t in pool.threads)
    return jobs


def test_one_worker_serves_one_request_per_forward() -> None:
    model = GatedModel()
    pool = WorkerPool(model)
    assert [t.name for t in pool.threads] == ["model-worker"]
    jobs = _serve_five(pool, model)
    assert model.batch_sizes == [1, 1, 1, 1, 1] and pool.batches == 5
    assert [int(j.result.item()) for j in jobs if j.result is not None] == [1, 2, 3, 4, 5]
    assert all(a.finished <= b.started for a, b in itertools.pairwise(jobs))  # one after another


def test_a_batching_worker_serves_what_queued_in_one_forward() -> None:
    model = GatedModel()
    pool = WorkerPool(model, workers=1, max_batch=4, max_wait_s=0.0)
    jobs = _serve_five(pool, model)
    assert model.batch_sizes == [1, 4] and pool.batches == 2
    assert [int(j.result.item()) for j in jobs if j.result is not None] == [1, 2, 3, 4, 5]  # each its own row
    assert jobs[1].started == jobs[4].started and jobs[1].finished == jobs[4].finished


def test_several_workers_are_numbered_and_a_failed_forward_fails_its_jobs() -> None:
    model = GatedModel(fail=True)
    pool = WorkerPool(model, workers=2)
    assert [t.name for t in pool.threads] == ["model-worker-0", "model-worker-1"]
    jobs = _serve_five(pool, model)
    assert all(isinstance(j.error, RuntimeError) and j.result is None for j in jobs)
    assert not pool.busy


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
