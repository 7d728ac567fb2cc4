"""The kernel's OOM killer: its report in dmesg / the journal / a container's status, and a memory
cgroup's OOM-kill counter read by attach, named MEM013 (host memory ran out: oom_peak)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from diagnose.collectors import cgroup
from diagnose.collectors.kernel_oom import KernelOomParser
from diagnose.derive import cgroup as derive_cgroup
from diagnose.derive.kernel_oom import KernelOomSource
from diagnose.model import Category, EvidenceSet
from diagnose.rules.engine import run_rules
from diagnose.rules.memory import HostOomKill
from tests.cli import run_cli
from tests.conftest import DATA

REPORT = os.path.join(DATA, "logs", "kernel_memcg_oom_kill_dmesg.txt")
# the real report's decisive record (tests/data/logs/kernel_memcg_oom_kill_dmesg.txt), as it is printed elsewhere
KILLED = ("Memory cgroup out of memory: Killed process 25088 (python3) total-vm:528568kB, anon-rss:204160kB, "
          "file-rss:6572kB, shmem-rss:0kB, UID:0 pgtables:480kB oom_score_adj:0")


def _evidence(lines: list[str]) -> dict[str, object]:
    src = KernelOomSource()
    for line in lines:
        src.feed(line)
    return {e.key: e.value for e in src.evidence("test")}


def test_the_recorded_memcg_report_names_the_process_what_it_held_and_the_limit() -> None:
    with open(REPORT, encoding="utf-8") as fh:
        ev = _evidence(fh.read().splitlines())
    assert ev["host.oom_kills"] == 1 and ev["host.oom_scope"] == "memcg"
    assert ev["host.oom_killed_process"] == "python3"
    assert ev["host.oom_killed_anon_rss_bytes"] == 204160 * 1024
    assert ev["host.memory_limit_bytes"] == 204800 * 1024  # "memory: usage 204800kB, limit 204800kB"
    assert "memory+swap" not in str(ev)  # its unlimited 9007199254740988kB is not the limit


def test_the_report_end_to_end_is_host_memory_and_no_ones_prose() -> None:
    ran = run_cli("analyze", REPORT, "--format", "json")
    doc = json.loads(ran.stdout)
    assert doc["findings"][0]["code"] == "MEM013" and doc["candidates"][0]["category"] == "oom_peak"
    # the kill is certain; weights against the runtime peak is what the differential's check separates
    assert [c["category"] for c in doc["candidates"][:2]] == ["oom_peak", "oom_weights"]
    assert doc["primary"] in ("oom_peak", None)
    assert "python3" in doc["findings"][0]["message"] and "200.00 MiB" in doc["findings"][0]["message"]
    keys = {e["key"] for e in doc["evidence"]}
    assert not {k for k in keys if k.startswith("report.")}  # the kernel's records are log lines, not statements
    assert "mem.oom_count" not in keys  # nor a CUDA out-of-memory error


def test_the_record_under_each_prefix_is_one_kill() -> None:
    prefixes = ("[13059.917043] ", "[Tue Dec  1 09:14:22 2026] ", "Dec  1 09:14:22 node-3 kernel: ", "")
    ev = _evidence([p + KILLED for p in prefixes])  # dmesg, dmesg -T, the journal, bare: the same kill
    assert ev["host.oom_kills"] == 1 and ev["host.oom_scope"] == "memcg"


def test_the_host_running_out_is_global() -> None:
    line = KILLED.replace("Memory cgroup out of memory", "Out of memory").replace("25088", "2481")
    ev = _evidence(["[ 1171.795551] " + line,
                    "[ 1171.795000] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,"
                    "global_oom,task_memcg=/user.slice,task=python3,pid=2481,uid=1000"])
    assert ev["host.oom_kills"] == 1 and ev["host.oom_scope"] == "global"
    f = run_rules(EvidenceSet(_kernel_evidence(line)), rules=(HostOomKill,))[0][0]
    assert "the host ran out of memory" in f.message


def _kernel_evidence(line: str) -> list:
    src = KernelOomSource()
    src.feed(line)
    return src.evidence("test")


def test_a_kubernetes_container_that_ended_oomkilled() -> None:
    ev = _evidence(["    Last State:     Terminated", "      Reason:       OOMKilled", "      Exit Code:    137"])
    assert ev["host.oom_kills"] == 1 and ev["host.oom_scope"] == "memcg"


def test_words_about_a_kill_and_a_cuda_oom_are_no_kernel_kill() -> None:
    p = KernelOomParser()
    for line in ("I think the process was killed because it ran out of memory?",
                 "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                 "We killed the server with SIGKILL and the exit code was 0"):
        p.feed(line)
    assert not p.matched()


def test_a_process_ended_by_sigkill_is_a_failure_that_sends_to_the_kernels_report(tmp_path: Path) -> None:
    # how parents and supervisors print a SIGKILLed child: vLLM's executor (the engine lab's host_oom log), a
    # shell, Kubernetes, multiprocessing, docker compose. None names the OOM killer; the kernel's report would
    lines = ["(EngineCore pid=27497) ERROR 12-02 07:08:42 [multiproc_executor.py:315] Worker proc VllmWorker-0 died "
             "unexpectedly (exit code: -9), shutting down executor.",
             "./entrypoint.sh: line 28:     7 Killed                  /app/bin/scalellm $ARGS",
             "Killed",
             "      Exit Code:    137",
             "Process SpawnProcess-1 exitcode=-9",
             "scalellm exited with code 137"]
    ev = _evidence(lines)
    assert ev["host.sigkilled"] == len(lines) and "host.oom_kills" not in ev
    log = tmp_path / "engine.log"
    log.write_text(lines[0] + "\n")
    doc = json.loads(run_cli("analyze", str(log), "--format", "json").stdout)
    assert doc["verdict"] == "undetermined" and "dmesg" in doc["next_steps"][0]


def _cgroup_doc() -> dict:
    with open(os.path.join(DATA, "cgroup", "v1_memory_oom_kill", "cgroup.json"), encoding="utf-8") as fh:
        return json.load(fh)


def test_attach_reads_the_memory_cgroups_limit_peak_and_kills() -> None:
    ev = {e.key: e.value for e in derive_cgroup.derive(_cgroup_doc())}
    assert ev["cgroup.memory_limit_bytes"] == 200 << 20  # the root's "no limit" (9223372036854771712) is none
    assert ev["cgroup.memory_peak_bytes"] == 200 << 20
    assert ev["cgroup.oom_kills"] == 1
    findings, _ = run_rules(EvidenceSet(derive_cgroup.derive(_cgroup_doc())), rules=(HostOomKill,))
    assert findings[0].category is Category.OOM_PEAK
    assert "memory cgroup (the container) reached its limit of 200.00 MiB" in findings[0].message


def test_no_kill_in_the_window_is_no_finding() -> None:
    doc = _cgroup_doc()
    doc["memory"]["end"] = doc["memory"]["start"]
    ev = EvidenceSet(derive_cgroup.derive(doc))
    assert ev.value("cgroup.oom_kills") == 0
    assert not run_rules(ev, rules=(HostOomKill,))[0]


def test_v2_memory_files() -> None:
    lv = cgroup.parse_memory(2, {"path": "/kubepods/pod1/c1", "files": {
        "memory.max": "4294967296\n", "memory.current": "4290000000\n", "memory.peak": "4294967296\n",
        "memory.events": "low 0\nhigh 0\nmax 212\noom 3\noom_kill 2\noom_group_kill 0\n"}})
    assert (lv.limit, lv.peak, lv.oom_kills) == (4 << 30, 4 << 30, 2)
    assert cgroup.parse_memory(2, {"path": "/", "files": {"memory.max": "max\n"}}).limit is None
