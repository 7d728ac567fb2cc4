"""The one explicit table of rules. Codes are unique (checked at import) and never reused.

Each rules module exports ``RULES``, a tuple of its rule classes; this table lists the modules.
Retired codes go into ``RETIRED`` so that nobody gives them a new meaning.
"""

from __future__ import annotations

from diagnose.rules import cold_start as _cold_start
from diagnose.rules import compile as _compile
from diagnose.rules import cpu as _cpu
from diagnose.rules import gpu as _gpu
from diagnose.rules import gpu_kineto as _gpu_kineto
from diagnose.rules import gpu_state as _gpu_state
from diagnose.rules import gpu_trace as _gpu_trace
from diagnose.rules import healthy as _healthy
from diagnose.rules import memory as _memory
from diagnose.rules import prefill as _prefill
from diagnose.rules import queueing as _queueing
from diagnose.rules import report as _report
from diagnose.rules import serving as _serving
from diagnose.rules import shapes as _shapes
from diagnose.rules import stages as _stages
from diagnose.rules import threads as _threads
from diagnose.rules import transfer as _transfer
from diagnose.rules.base import Rule

RULES: tuple[type[Rule], ...] = (
    *_cpu.RULES,
    *_compile.RULES,
    *_queueing.RULES,
    *_threads.RULES,
    *_memory.RULES,
    *_shapes.RULES,
    *_serving.RULES,
    *_prefill.RULES,
    *_stages.RULES,
    *_cold_start.RULES,
    *_transfer.RULES,
    *_gpu.RULES,
    *_gpu_state.RULES,
    *_gpu_trace.RULES,
    *_gpu_kineto.RULES,
    *_healthy.RULES,
    *_report.RULES,  # last: what a report says, when nothing measured says more
)

RETIRED: frozenset[str] = frozenset()


def _check_unique(rules: tuple[type[Rule], ...]) -> dict[str, type[Rule]]:
    by_code: dict[str, type[Rule]] = {}
    names: set[str] = set()
    for r in rules:
        if r.code in by_code or r.code in RETIRED:
            raise RuntimeError(f"rule code {r.code} is used twice or was retired")
        if r.name in names:
            raise RuntimeError(f"rule name {r.name} is used twice")
        by_code[r.code] = r
        names.add(r.name)
    return by_code


BY_CODE: dict[str, type[Rule]] = _check_unique(RULES)


def lookup(code_or_name: str) -> type[Rule] | None:
    key = code_or_name.strip()
    if key.upper() in BY_CODE:
        return BY_CODE[key.upper()]
    for r in RULES:
        if r.name == key:
            return r
    return None
