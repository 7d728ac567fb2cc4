"""What an expert reads from each engine-lab pathology, leg by leg: the recordings' unit tests and the
live engine tests hold diagnose to the same table.

A leg is what diagnose is given: ``attach`` (the live session from the API server's pid, with the log
and /metrics), ``log`` (the engine's log alone), ``metrics`` (its /metrics scrapes alone) or ``kernel``
(the kernel's OOM report from ``dmesg``, where the kernel killed the engine). The verdict is a category,
``healthy``, ``undetermined``, or ``undetermined:CATEGORY`` (the rules named it, but its calibrated
probability did not clear the bar to commit: it leads the candidates). A vLLM log carries no time to
first token, so from the log alone a service can be judged a bottleneck but never healthy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from diagnose.model import GPU_ONLY_CATEGORIES, HOST_NO_GPU

EXPECTED: dict[str, dict[str, str]] = {
    "healthy": {"attach": "healthy", "log": "undetermined", "metrics": "healthy"},
    "admission_cap": {"attach": "queueing", "log": "queueing", "metrics": "queueing"},
    "kv_pressure": {"attach": "queueing", "log": "queueing", "metrics": "queueing"},
    "prefill_bound": {"attach": "prefill_ttft", "log": "undetermined", "metrics": "prefill_ttft"},
    # a CPU quota is the host's: only the attach (the cgroup's cpu.stat) sees it. The scrape's requests look fine,
    # so its verdict is healthy with the scope said (nothing watched the host) and the attach as the next step
    "cpu_quota": {"attach": "thread_oversubscription", "log": "undetermined", "metrics": "healthy"},
    # the engine's own refusal names the KV cache's room: the runtime peak (KV-cache sizing, MEM002), committed
    # since the calibrator's refit of 2026-12-05 (0.81 for 90 % precision; before it, at 0.90, withheld)
    "startup_refusal": {"log": "oom_peak"},
    # killed by the kernel's OOM killer at the memory cgroup's limit while it starts: attach reads the group's
    # oom_kill count, the kernel's report (dmesg) names the kill; the engine's log shows only a worker that died
    # by SIGKILL (exit code -9), so alone it is undetermined, and its first next step reads the kernel's report
    # (the kill itself is certain; whether the weights or the runtime peak outgrew the limit is what the
    # differential's check, the model's size against the limit, separates: oom_peak leads, not committed)
    "host_oom": {"attach": "undetermined:oom_peak", "log": "undetermined", "kernel": "undetermined:oom_peak"},
}
# the mechanism every queueing finding of that pathology must name (one per report)
MECHANISM: dict[str, str] = {"admission_cap": "admission_cap", "kv_pressure": "kv_capacity",
                             "queueing-py-one-at-a-time": "admission_cap", "queueing-cpp-parallel2": "admission_cap"}

# llama.cpp (tests/data/engines/llamacpp/, recorded by tests/engines/llamacpp_record.py): the Python server
# (``-py``: its log only) and the C++ llama-server (``-cpp``: log and /metrics). llama-server's log at its
# default verbosity says nothing of deferred requests, and its metrics carry no latency: those legs can
# only be undetermined when nothing is wrong.
LLAMACPP: dict[str, dict[str, str]] = {
    "healthy-py": {"log": "healthy"},
    "model-name-L4-py": {"log": "healthy"},
    "queueing-py-one-at-a-time": {"log": "queueing"},
    "truncated-streams-py": {"log": "undetermined"},
    "prefill-py": {"log": "prefill_ttft"},
    # attached (tests/engines/llamacpp_record.py --attach): 3,500-token streams spend most of their time in
    # llama-cpp-python's per-token detokenising of the whole answer; short streams are healthy
    "detok-long-stream-py": {"attach": "cpu_preprocessing", "log": "undetermined"},
    "healthy-attach-py": {"attach": "healthy", "log": "healthy"},
    "healthy-cpp": {"log": "undetermined", "metrics": "undetermined"},
    "model-name-L4-cpp": {"log": "undetermined", "metrics": "undetermined"},
    "queueing-cpp-parallel2": {"log": "undetermined", "metrics": "queueing"},
    # llama-server's own timings measure the prefill share (83 % recorded, 79-87 % in live runs): its probability
    # sits near the calibrator's bar (0.78 recorded against 0.87 since the second refit of 2026-12-06), so a run
    # commits it or withholds it with prefill leading; either is the expert's answer, anything else is not
    "prefill-cpp": {"log": "prefill_ttft|undetermined:prefill_ttft",
                    "metrics": "prefill_ttft|undetermined:prefill_ttft"},
}

# the live session on each llama.cpp pathology that no recording was attached to (tests/engines/test_llamacpp_live.py:
# `diagnose attach` on the server's pid, with its log and the C++ server's /metrics)
LLAMACPP_ATTACH: dict[str, str] = {
    "queueing-py-one-at-a-time": "queueing",
    # a stream cut to one token is the server's default (--interrupt_requests True), not a bottleneck: nothing is
    # slow, and the log's cut streams are what the next steps name
    "truncated-streams-py": "undetermined",
    # a native server: the log's per-request timings and the scrapes' queue together cover the latency, which
    # neither covers alone
    "healthy-cpp": "healthy",
    "queueing-cpp-parallel2": "queueing",
    "prefill-cpp": "prefill_ttft",
}


def want(pathology: str, leg: str) -> str:
    """The expert's verdict for one leg of one pathology ("a|b": either, where a measurement sits at the bar)."""
    legs = {**EXPECTED, **LLAMACPP}[pathology]
    if leg == "attach" and leg not in legs:  # a live session no recording has
        return LLAMACPP_ATTACH[pathology]
    return legs[leg]


def inputs(folder: Path, leg: str) -> list[str]:
    """The files one leg gives ``diagnose analyze``: the session, the log, or the two scrapes (one file)."""
    if leg == "attach":
        return [str(folder / "attach")]
    if leg == "log":
        return [str(folder / ("vllm.log" if (folder / "vllm.log").exists() else "server.log"))]
    if leg == "kernel":  # the kernel's OOM report, as `dmesg` printed it
        return [str(folder / "kernel.log")]
    return [str(folder / "metrics.txt")]


def analyze(folder: Path, leg: str) -> dict[str, Any]:
    """``diagnose analyze`` of one leg, in this process, as its JSON document."""
    from tests.cli import run_cli

    ran = run_cli("analyze", *inputs(folder, leg), "--format", "json")
    assert ran.returncode in (0, 1), ran.stderr
    doc: dict[str, Any] = json.loads(ran.stdout)
    return doc


def verdict(doc: dict[str, Any]) -> str:
    """The category, ``healthy``, ``undetermined``, or ``undetermined:CATEGORY`` where the rules named a
    bottleneck whose calibrated probability fell short of committing (among the candidates; only a candidate
    the evidence speaks for ranks above it)."""
    if doc["verdict"] == "bottleneck":
        return str(doc["primary"])
    lead = next((f["category"] for f in doc["findings"] if f["severity"] != "info" and f["category"]), None)
    if doc["verdict"] == "undetermined" and lead is not None:
        cats = [c["category"] for c in doc["candidates"]]
        assert lead in cats and all(c["for"] for c in doc["candidates"][:cats.index(lead)]), doc["candidates"]
        return f"undetermined:{lead}"
    return str(doc["verdict"])


def assert_leg(doc: dict[str, Any], pathology: str, leg: str) -> None:
    """The leg's verdict is the expert's, with next steps when undetermined and, for queueing, the
    pathology's mechanism and no other; no GPU finding (every lab host has none); no "expected
    behaviour" note beside a bottleneck."""
    findings = doc["findings"]
    assert verdict(doc) in want(pathology, leg).split("|"), [(f["code"], f["message"][:160]) for f in findings]
    if doc["verdict"] == "undetermined":
        assert doc["next_steps"], "an undetermined verdict names what to collect next"
    mechanism = MECHANISM.get(pathology)
    if mechanism and verdict(doc) == "queueing":
        mechanisms = {f.get("mechanism") for f in findings if f["category"] == "queueing"}
        assert mechanisms - {None} == {mechanism}, [(f["code"], f.get("mechanism"), f["message"][:200])
                                                    for f in findings]
    assert not {f["category"] for f in findings} & {c.value for c in GPU_ONLY_CATEGORIES}, "no GPU on the host"
    if doc["verdict"] == "bottleneck":
        assert not [f for f in findings if f["code"] == "HLT003"], "no 'expected behaviour' beside a bottleneck"
    if leg == "attach":
        assert HOST_NO_GPU in {e["key"] for e in doc["evidence"]}
