"""Ollama's gin access lines: each request's server-side time, and with Ollama's parallelism, its queue."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from diagnose import pipeline
from diagnose.collectors.ollama import OllamaParser, Request, go_duration, in_flight
from diagnose.model import EvidenceSet, Verdict
from tests.conftest import DATA

LOG = os.path.join(DATA, "logs", "ollama_gin_chat_backlog.txt")  # ollama/ollama#9192
# the runner's start line in Ollama 0.3's format (server.go:388, its --parallel flag), the count a parameter
RUNNER = ('time=2024-09-27T14:58:29.791Z level=INFO source=server.go:388 msg="starting llama server" '
          'cmd="/usr/lib/ollama/runners/cpu_avx2/ollama_llama_server --model /root/.ollama/models/blobs/sha256-dde5 '
          '--ctx-size 8192 --batch-size 512 --embedding --log-disable --no-mmap --parallel {n} --port 39377"')


def test_go_durations_and_gin_lines_are_read() -> None:
    assert go_duration("158.82803ms") == 0.15882803 and go_duration("1m2.5s") == 62.5
    assert abs(go_duration("12.3µs") - 12.3e-6) < 1e-12 and go_duration("2h0m1s") == 7201.0
    p = OllamaParser()
    p.feed('Feb 18 12:25:17 host ollama[812]: [GIN] 2025/02/18 - 12:25:17 | 200 | 21.704978834s |  10.248.155.225 | '
           'POST     "/api/chat"')
    p.feed('[GIN] 2025/02/18 - 12:25:18 | 200 |       31.2µs |       127.0.0.1 | HEAD     "/"')
    p.feed(RUNNER.format(n=4))
    log = p.result()
    assert [(r.status, r.path, round(r.seconds, 3)) for r in log.requests] == [(200, "/api/chat", 21.705),
                                                                                (200, "/", 0.0)]
    assert log.parallel == 4 and "--parallel" in log.parallel_from


def test_requests_in_flight_at_each_end() -> None:
    # three begun together, served one after another; a fourth alone later
    reqs = [Request(10.0, 2.0, 200, "/api/chat"), Request(12.0, 4.0, 200, "/api/chat"),
            Request(14.0, 6.0, 200, "/api/chat"), Request(30.0, 1.0, 200, "/api/chat")]
    assert in_flight(reqs) == [3, 2, 1, 1]


def test_the_latencies_alone_name_no_queue_and_say_what_is_missing() -> None:
    d = pipeline.analyze([LOG])
    ev = EvidenceSet(d.evidence)
    assert ev.get("serving.engine").value == "ollama" and ev.value("requests.count") == 14
    assert 21000 < (ev.value("latency.e2e_ms.max") or 0) < 22000 and "serving.waiting_max" not in ev
    assert d.verdict is Verdict.UNDETERMINED
    assert any("--parallel" in (i.reason or "") for i in d.inputs), d.inputs
    assert not any("SIGKILL" in s for s in d.next_steps), d.next_steps  # no failure shown: no advice for one


def test_with_ollamas_parallelism_the_backlog_is_its_queue(tmp_path: Path) -> None:
    text = Path(LOG).read_text(encoding="utf-8")
    one = os.path.join(tmp_path, "one.log")
    with open(one, "w", encoding="utf-8") as fh:
        fh.write(RUNNER.format(n=1) + "\n" + text)
    d = pipeline.analyze([one])
    assert d.verdict is Verdict.BOTTLENECK and d.findings[0].code == "QUE002", [f.code for f in d.findings]
    assert "OLLAMA_NUM_PARALLEL" in d.findings[0].fixes[0].steps[0]
    ev = EvidenceSet(d.evidence)
    assert ev.value("serving.waiting_max") == 12 and ev.value("serving.max_num_seqs") == 1
    wide = os.path.join(tmp_path, "wide.log")
    with open(wide, "w", encoding="utf-8") as fh:
        fh.write(RUNNER.format(n=16) + "\n" + text)
    d = pipeline.analyze([wide])
    assert EvidenceSet(d.evidence).value("serving.waiting_max") == 0
    assert "QUE002" not in [f.code for f in d.findings]


def test_requests_ending_in_one_second_are_not_a_queue_and_several_runners_leave_the_parallelism_unknown() -> None:
    # 100 serial 38 ms embeddings, 25 ending in each second: gin's whole-second clock must not make them overlap
    serial = [Request(100.0 + i // 25, 0.038, 200, "/api/embed") for i in range(100)]
    assert max(in_flight(serial)) == 1
    p = OllamaParser()
    p.feed(RUNNER.format(n=4))
    p.feed(RUNNER.format(n=1).replace("sha256-dde5", "sha256-e5bd"))  # an embedding model beside the chat one
    log = p.result()
    assert log.parallel is None and len(log.runners) == 2


@pytest.mark.parametrize("line", [
    # discover/gpu.go's record in both of its wordings, as journald prints it and as a paste quotes it
    'Nov 07 10:12:01 host ollama[812]: time=2024-11-07T10:12:01.100Z level=WARN source=gpu.go:252 msg="CPU does not '
    'have minimum vector extensions, GPU inference disabled.  Required:avx  Detected:no vector extensions"',
    '"level=WARN source=gpu.go:177 msg="CPU does not have AVX or AVX2, disabling GPU support."',
])
def test_ollama_turning_the_gpu_off_for_the_cpus_sake_is_a_gpu_not_usable(tmp_path: Path, line: str) -> None:
    log = tmp_path / "ollama.log"
    log.write_text("I have an RTX 3060 passed through to the VM and every answer is slow.\n" + line + "\n",
                   encoding="utf-8")
    d = pipeline.analyze([str(log)])
    top = d.findings[0]
    assert (top.code, top.title) == ("PLC003", "No usable GPU: Ollama turned GPU inference off"), d.findings
    assert "AVX" in top.message and "CPU type to host" in " ".join(top.fixes[0].steps)


def test_a_person_disabling_gpu_support_is_no_record(tmp_path: Path) -> None:
    log = tmp_path / "ollama.log"
    log.write_text("The CPU does not have AVX or AVX2, disabling GPU support made no difference for me.\n",
                   encoding="utf-8")
    d = pipeline.analyze([str(log)])
    assert "gpu.unusable" not in EvidenceSet(d.evidence)
