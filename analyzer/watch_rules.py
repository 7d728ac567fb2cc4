"""``diagnose watch --when RULE``: the trigger rules, parsed once, and what the ring says about them.

A rule is one of

* ``ttft_p99>2s``, ``e2e_p99>5s`` — the p99 time to first token / end-to-end latency over the last
  ``SPAN_S`` seconds of scrapes (the histogram's increase, as ``histogram_quantile`` over ``increase()``),
  in ``s`` or ``ms`` (a unit is required: ``2`` could be either);
* ``queue>N`` — requests waiting in the engine's scheduler queue (the ``waiting`` gauge of
  ``diagnose.collectors.prom``: vLLM, SGLang, TGI, Triton, llama.cpp);
* ``kv>0.95`` — KV-cache usage, a fraction (``95%`` also reads);
* ``oom`` — an allocator out-of-memory message or a Python traceback in the log;
* ``bottleneck`` — the light verdict (the ring's metrics and log through the rule engine) names a
  critical bottleneck.

``>`` and ``>=`` compare; a rule is true, false or unknown at each tick: a value that is not measured
(the engine exposes no such series, nothing completed over the span) neither fires nor clears it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from diagnose.collectors import oom
from diagnose.collectors.prom import PromBuffer, PromResult
from diagnose.errors import InputError

SPAN_S = 30.0  # latency rules read the histograms' increase over this trailing span of scrapes
DEFAULT_RULES = ("bottleneck", "oom")
METRIC_RULES = {"ttft_p99": ("ttft", "ms"), "e2e_p99": ("e2e", "ms"), "queue": ("waiting", "requests"),
                "kv": ("kv_usage", "ratio")}
EVENT_RULES = ("oom", "bottleneck")
_RULE = re.compile(r"^\s*(?P<name>[a-z_0-9]+)\s*(?P<op>>=|>)\s*(?P<num>[0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*"
                   r"(?P<unit>ms|s|%)?\s*$", re.IGNORECASE)
_TRACEBACK = "Traceback (most recent call last):"


@dataclass(frozen=True)
class Rule:
    """One trigger: ``name`` (``ttft_p99``, ``e2e_p99``, ``queue``, ``kv``, ``oom``, ``bottleneck``),
    its comparison and threshold in the canonical unit (ms for latencies, requests, a fraction)."""

    name: str
    op: str = ""
    threshold: float = 0.0

    @property
    def text(self) -> str:
        """The rule as it reads (and labels ``diagnose_triggers_total``): ``ttft_p99>2s``."""
        if not self.op:
            return self.name
        if self.name in ("ttft_p99", "e2e_p99"):
            value = f"{self.threshold / 1000:g}s" if self.threshold >= 1000 else f"{self.threshold:g}ms"
        else:
            value = f"{self.threshold:g}"
        return f"{self.name}{self.op}{value}"

    def holds(self, value: float) -> bool:
        return value >= self.threshold if self.op == ">=" else value > self.threshold


def parse_rule(text: str) -> Rule:
    """One ``--when`` value; an ``InputError`` (one sentence, the remedy) for anything else."""
    word = text.strip().lower()
    if word in EVENT_RULES:
        return Rule(word)
    m = _RULE.match(text)
    known = ", ".join([*(f"{n}>X" for n in METRIC_RULES), *EVENT_RULES])
    if not m or m.group("name").lower() not in METRIC_RULES:
        raise InputError(f"--when {text!r} is not a trigger rule diagnose knows.",
                         f"Use one of {known}, e.g. --when 'ttft_p99>2s' --when 'queue>8'.")
    name, op, num, unit = m.group("name").lower(), m.group("op"), float(m.group("num")), (m.group("unit") or "").lower()
    if not math.isfinite(num) or num > 1e9:
        raise InputError(f"--when {text!r}: {m.group('num')} is not a threshold.",
                         "Give a finite number, e.g. queue>8.")
    if name in ("ttft_p99", "e2e_p99"):
        if unit not in ("s", "ms"):
            raise InputError(f"--when {text!r} gives a latency without its unit.",
                             f"Write seconds or milliseconds, e.g. {name}{op}2s or {name}{op}500ms.")
        return Rule(name, op, num * 1000.0 if unit == "s" else num)
    if name == "kv":
        value = num / 100.0 if unit == "%" else num
        if unit not in ("", "%") or not 0.0 <= value <= 1.0:
            raise InputError(f"--when {text!r}: KV-cache usage is a fraction of the pool.",
                             "Give it between 0 and 1 (kv>0.95) or as a percentage (kv>95%).")
        return Rule(name, op, value)
    if unit or num != math.floor(num):
        raise InputError(f"--when {text!r}: the queue is a number of waiting requests.",
                         "Give a whole number without a unit, e.g. queue>8.")
    return Rule(name, op, num)


def parse_rules(texts: Sequence[str] | None) -> tuple[Rule, ...]:
    """Every ``--when`` (default ``bottleneck`` and ``oom``), once each, in the order given."""
    rules: dict[str, Rule] = {}
    for t in texts or DEFAULT_RULES:
        r = parse_rule(t)
        rules.setdefault(r.text, r)
    return tuple(rules.values())


def reading(scrapes: Sequence[tuple[float, str]]) -> PromResult | None:
    """The engine's series over ``scrapes`` (time, exposition text), oldest first: gauges at each end,
    histograms and counters as increases from the first to the last (``diagnose.collectors.prom``)."""
    if not scrapes:
        return None
    buf = PromBuffer()
    for at, text in (scrapes[0], scrapes[-1]) if len(scrapes) > 1 else (scrapes[0],):
        buf.feed(f"# scrape at {at:.3f}")
        for line in text.splitlines():
            buf.feed(line)
    return buf.result() if buf.matched() else None


def metric_value(rule: Rule, result: PromResult | None) -> float | None:
    """The rule's value in ``result``: the last gauge, or a windowed p99; None when not measured (no such
    series, no request completed over the span, or the p99 only known to lie in the lowest bucket)."""
    if result is None or rule.name not in METRIC_RULES:
        return None
    canonical, _ = METRIC_RULES[rule.name]
    if rule.name in ("queue", "kv"):
        values = result.gauges.get(canonical)
        return values[-1] if values else None
    h = result.histograms.get(canonical)
    if h is None or not h.windowed or h.count <= 0:
        return None
    return h.quantiles.get(0.99)


def log_event(line: str) -> str | None:
    """What an ``oom`` rule fires on in one log line: an allocator's out-of-memory message, or the
    header of a Python traceback (an engine that dies prints one); None for anything else."""
    if oom.is_oom_message(line):
        return "an out-of-memory message"
    if _TRACEBACK in line:
        return "a Python traceback"
    return None
