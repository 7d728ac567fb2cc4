"""Compile logs and timing samples end to end: recompilation, engine rebuilds, prefill, stage shares."""

from __future__ import annotations

import os

import pytest

from analyzer import loose
from analyzer.model import Category, EvidenceSet, Finding, Severity
from rules import stages
from rules.engine import run_rules
from rules.registry import RULES
from tests.conftest import DATA

ALL_RULES = RULES if any(r.code == "STG001" for r in RULES) else (*RULES, *stages.RULES)


def _findings(folder: str, name: str) -> list[Finding]:
    res = loose.analyze_path(os.path.join(DATA, folder, name))
    findings, _ = run_rules(EvidenceSet(res.evidence), rules=ALL_RULES)
    return [f for f in findings if f.severity is not Severity.INFO]


@pytest.mark.parametrize(("folder", "name", "code", "category"), [
    ("compile_logs", "recompile_limit_exceeded_fullgraph.txt", "CMP002", Category.RECOMPILATION),
    ("compile_logs", "recompiles_glog_batch_size_varies.txt", "CMP002", Category.RECOMPILATION),
    ("timing", "trt_rebuild_on_new_shape_extreme.txt", "CMP003", Category.RECOMPILATION),
    ("timing", "trt_rebuild_every_growing_step.txt", "CMP003", Category.RECOMPILATION),
    ("timing", "ttft_stage_table_prefill_89pct.md", "TTF001", Category.PREFILL_TTFT),
    ("timing", "queue_vs_prompt_length_table.md", "TTF001", Category.PREFILL_TTFT),
    ("timing", "long_context_ttft_prose.txt", "TTF001", Category.PREFILL_TTFT),
    ("timing", "spans_queue_prefill_decode.txt", "TTF001", Category.PREFILL_TTFT),
    ("timing", "fps_table_pil_preprocess_vs_gpu_kernel.md", "STG001", Category.CPU_PREPROCESSING),
    ("timing", "stage_log_preprocess_dominates.jsonl", "STG001", Category.CPU_PREPROCESSING),
])
def test_primary(folder: str, name: str, code: str, category: Category) -> None:
    findings = _findings(folder, name)
    assert findings and findings[0].code == code, [(f.code, f.message) for f in findings]
    assert findings[0].category is category


@pytest.mark.parametrize(("folder", "name"), [
    ("compile_logs", "recompiles_torch2_1_old_format.txt"),  # two recompiles: warm-up, not a storm
    ("compile_logs", "graph_breaks_only.txt"),
    ("timing", "stage_log_llm_healthy.jsonl"),
    ("timing", "ttft_vs_client_concurrency_table.md"),
])
def test_nothing_significant(folder: str, name: str) -> None:
    assert _findings(folder, name) == []


def test_recompile_message_names_the_varying_dimension() -> None:
    f = _findings("compile_logs", "recompiles_glog_batch_size_varies.txt")[0]
    assert "x size at dim 1" in f.message and "recompile limit (8) was hit" in f.message
    assert any("torch._dynamo.mark_dynamic(x, 1)" in s for fx in f.fixes for s in fx.steps)


def test_fullgraph_limit_is_a_hard_failure() -> None:
    f = _findings("compile_logs", "recompile_limit_exceeded_fullgraph.txt")[0]
    assert f.severity is Severity.CRITICAL and "hard failure" in f.message and "at least 8" in f.message


def test_rebuild_messages() -> None:
    f = _findings("timing", "trt_rebuild_on_new_shape_extreme.txt")[0]
    assert "100 % of the spikes" in f.message and "trt_profile_min_shapes" in " ".join(f.fixes[0].steps)
    thin = _findings("timing", "trt_rebuild_every_growing_step.txt")[0]
    assert thin.confidence.value == "thin" and "no call on an already-seen shape" in thin.message


def test_preprocess_lower_bound_is_said() -> None:
    f = _findings("timing", "fps_table_pil_preprocess_vs_gpu_kernel.md")[0]
    assert "at least 24 %" in f.message and "13.11 → 10.02 ms" in f.message


def test_prefill_scaling_message() -> None:
    f = _findings("timing", "queue_vs_prompt_length_table.md")[0]
    assert "with long prompts" in f.message and "461 ms" in f.message
