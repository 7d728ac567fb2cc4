"""Pasted ``py-spy top`` views: rows read by their columns, each activity's share of the thread-seconds shown."""

from __future__ import annotations

import io
import os

from diagnose import loose
from diagnose.collectors.pyspy_top import PyspyTopParser, parse_function
from diagnose.derive.activities import Activity
from diagnose.derive.pstats_table import shares
from diagnose.model import Confidence, EvidenceSet
from diagnose.rules.engine import run_rules
from diagnose.rules.registry import RULES
from tests.conftest import DATA

# vllm-project/vllm#19036, "100% CPU usage when idle. While loop in `acquire_read` pegging the CPU." (as pasted)
IDLE_POLL = """`py-spy top` output of one of the offending processes

```
GIL: 49.00%, Active: 100.00%, Threads: 5

  %Own   %Total  OwnTime  TotalTime  Function (filename)
 54.00%  54.00%    5.03s     5.03s   sched_yield (vllm/distributed/utils.py)
 14.00% 100.00%    1.09s     8.95s   acquire_read (vllm/distributed/device_communicators/shm_broadcast.py)
 12.00%  13.00%    1.04s     1.09s   get_metadata (vllm/distributed/device_communicators/shm_broadcast.py)
  5.00%   5.00%   0.590s    0.670s   __init__ (contextlib.py)
  6.00% 100.00%   0.410s     8.95s   __enter__ (contextlib.py)
  0.00% 100.00%   0.000s     8.95s   worker_busy_loop (vllm/v1/executor/multiproc_executor.py)
  0.00% 100.00%   0.000s     8.95s   <module> (<string>)
```
"""

# older py-spy prints one row per line of a function (``Function (filename:line)``)
PER_LINE = """  %Own   %Total  OwnTime  TotalTime  Function (filename:line)
 53.00%  53.00%    5.30s     5.30s   parse_contents_index (packstats/packstats.py:111)
  0.00%   0.00%    2.10s     2.10s   decode (codecs.py:321)
 14.00%  14.00%    1.80s     1.80s   parse_contents_index (packstats/packstats.py:114)
"""


def _read(name: str) -> str:
    with open(os.path.join(DATA, "pyspy", name), encoding="utf-8") as fh:
        return fh.read()


def _parser(text: str) -> PyspyTopParser:
    p = PyspyTopParser()
    for line in text.splitlines():
        p.feed(line)
    return p


def _evidence(text: str) -> EvidenceSet:
    res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    return EvidenceSet(res.evidence)


def test_a_rows_last_field_names_a_function_and_its_file_even_cut_at_the_terminals_width() -> None:
    assert parse_function("preprocess (spytarget.py)") == ("spytarget.py", "preprocess")
    assert parse_function("Conv2d._conv_forward (torch/nn/modules/conv") == ("torch/nn/modules/conv",
                                                                             "Conv2d._conv_forward")
    assert parse_function("parse_contents_index (packstats/packstats.py:111)") == ("packstats/packstats.py",
                                                                                  "parse_contents_index")
    assert parse_function("<module> (<string>)") == ("<string>", "<module>")
    assert parse_function("resize (PIL\\Image.py)") == ("PIL\\Image.py", "resize")
    assert parse_function("wait (C:\\Program Files (x86)\\Python\\lib\\threading.py:324)") == (
        "C:\\Program Files (x86)\\Python\\lib\\threading.py", "wait")
    cut = "PreTrainedTokenizerFast._batch_encode_plus"
    assert parse_function(cut) == ("", cut)


def test_the_header_and_the_last_refresh_are_read() -> None:
    p = _parser(_read("top_cpu_preprocess_demo.txt"))
    t = p.result()
    assert t is not None
    assert (t.samples, t.active_pct) == (1500, 308.0)
    assert t.rows[0].function == "GaussianBlur.filter" and t.rows[0].tottime == 12.66
    # the visible rows' own 42.44 thread-seconds over 15 s of samples at 100 Hz: 2.83 threads running on average
    # (the header's Active 308 % is of the last second only)
    assert abs(t.span_s - 42.44) < 0.01 and t.threads_mean is not None and abs(t.threads_mean - 2.829) < 0.01
    twice = _parser(IDLE_POLL + "\n" + IDLE_POLL.replace("8.95s", "17.90s"))
    last = twice.result()
    assert last is not None and max(r.cumtime for r in last.rows) == 17.90


def test_one_row_per_line_of_a_function_adds_up() -> None:
    t = _parser(PER_LINE).result()
    assert t is not None
    rows = {r.function: r for r in t.rows}
    assert set(rows) == {"parse_contents_index", "decode"}
    assert abs(rows["parse_contents_index"].tottime - 7.10) < 1e-9
    assert abs(rows["parse_contents_index"].cumtime - 7.10) < 1e-9


def test_a_person_s_percentages_and_seconds_are_no_table() -> None:
    assert not _parser("The GPU sits at 40.00% and 12.0s per request 3.0s 4.0s\n").matched()
    assert not _parser(" 54.00%  54.00%    5.03s     5.03s   sched_yield (vllm/distributed/utils.py)\n").matched()


def test_the_demo_services_preprocessing_is_named_from_its_pasted_view() -> None:
    ev = _evidence(_read("top_cpu_preprocess_demo.txt"))
    assert 0.55 < (ev.value("cpu.preprocess_share") or 0) < 0.65  # PIL's blur, resize, load and the normalise rows
    assert 0.15 < (ev.value("cpu.forward_share") or 0) < 0.25
    assert ev.value("workers.active_mean") == 2.829
    findings = {f.code: f for f in run_rules(ev, rules=RULES)[0]}
    assert "CPU001" in findings and findings["CPU001"].confidence is Confidence.MEASURED
    # a class named *Preprocess*'s _run holds the model's forward too: its total is not shown as the hottest
    assert "CpuPreprocessPathology" not in findings["CPU001"].message
    assert "GaussianBlur.filter" in findings["CPU001"].message


def test_the_healthy_services_view_names_no_preprocessing() -> None:
    ev = _evidence(_read("top_healthy_demo.txt"))
    assert (ev.value("cpu.forward_share") or 0) > 0.4
    assert (ev.value("cpu.preprocess_share") or 0) < 0.1
    rules = {f.code for f in run_rules(ev, rules=RULES)[0]}
    assert not rules & {"CPU001", "CPU002", "CMP001"}


def test_an_idle_engine_polling_its_queue_is_waiting_not_work() -> None:
    t = _parser(IDLE_POLL).result()
    assert t is not None
    got, _ = shares(t)
    assert got.get(Activity.WAITING, 0) > 0.9
    assert got.get(Activity.PREPROCESS, 0) == 0 and got.get(Activity.FORWARD, 0) == 0
    ev = _evidence(IDLE_POLL)
    assert ev.value("cpu.active_samples") == 895  # 8.95 thread-s at py-spy's default 100 Hz
    assert not {f.code for f in run_rules(ev, rules=RULES)[0]} & {"CPU001", "CPU002", "CMP001"}


def test_what_a_review_found_in_the_py_spy_top_reader() -> None:
    """py-spy's header with failed samples ("Total Samples 3000, Error Rate 2.40% …") is read; a row whose name the
    terminal cut before its file is kept (the rows under it too); the Active of a refresh that caught no thread
    running (0.00 %) is no measure of the run."""
    view = ("Total Samples 3000, Error Rate 2.40% (most likely due to the process exiting)\n"
            "GIL: 0.00%, Active: 0.00%, Threads: 4\n"
            "  %Own   %Total  OwnTime  TotalTime  Function (filename)\n"
            " 70.00%  70.00%   22.40s    22.40s   PreTrainedTokenizerFast._batch_encode_plus\n"
            " 20.00%  20.00%    6.10s     6.10s   Linear.forward (torch/nn/modules/linear.py)\n"
            "  0.00% 100.00%    0.000s    29.90s   <module> (serve.py)\n")
    t = _parser(view).result()
    assert t is not None and t.samples == 3000 and len(t.rows) == 3
    assert t.threads_mean is not None and abs(t.threads_mean - 0.95) < 0.01
    ev = _evidence(view)
    assert (ev.value("workers.active_mean") or 0) > 0.9
    assert "CPU001" in {f.code for f in run_rules(ev, rules=RULES)[0]}
