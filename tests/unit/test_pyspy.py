from __future__ import annotations

import os

import pytest

from diagnose.collectors.pyspy import explain_failure, parse_dump, parse_raw, parse_raw_line
from diagnose.derive import cpu_profile
from diagnose.sources import pyspy_remedy
from tests.conftest import DATA


def _read(name: str) -> list[str]:
    with open(os.path.join(DATA, "pyspy", name), encoding="utf-8") as fh:
        return fh.readlines()


def test_parse_plain_thread_line() -> None:
    s = parse_raw_line("thread (2282): busyworker;Thread.run (threading.py:982);busy (t.py:4) 39")
    assert s is not None
    assert (s.tid, s.thread, s.count, s.pid) == (2282, "busyworker", 39, 0)
    assert [f.function for f in s.frames] == ["Thread.run", "busy"]
    assert s.frames[-1].file == "t.py" and s.frames[-1].line == 4


def test_parse_subprocess_prefix_takes_innermost_process() -> None:
    samples = parse_raw(_read("subprocesses_parent_child.raw"))
    assert samples and all(s.pid == 2526 for s in samples)
    assert all(s.process.endswith("t2.py") for s in samples)
    assert samples[0].thread == "MainThread"


def test_parse_frozen_module_frames_and_garbage() -> None:
    s = parse_raw_line('process 1:"python -m x; y";thread (0x1f): main;_run_code (<frozen runpy>:88) 2')
    assert s is not None and s.tid == 0x1F and s.process == "python -m x; y"
    assert s.frames[0].file == "<frozen runpy>" and s.frames[0].line == 88
    assert parse_raw_line("py-spy> Sampling process 100 times a second") is None
    assert parse_raw_line("") is None


def test_queueing_profile_has_one_saturated_worker() -> None:
    samples = parse_raw(_read("queueing_one_worker_demo.raw"))
    ev = {e.key: e for e in cpu_profile.derive(samples, window_s=5.0, rate_hz=100)}
    assert ev["workers.busy_count"].value == 1
    assert ev["workers.busiest_active_ratio"].value > 0.9
    assert "model-worker" in ev["workers.busiest_active_ratio"].detail
    assert ev["cpu.forward_share"].value > 0.6
    shares = sum(ev[k].value for k in ev if k.startswith("cpu.") and k.endswith("_share"))
    assert abs(shares - 1.0) < 1e-6


def test_empty_profile_gives_zero_activity_not_missing() -> None:
    ev = {e.key: e for e in cpu_profile.derive([], window_s=5.0, rate_hz=100)}
    assert ev["cpu.active_samples"].value == 0
    assert ev["workers.active_mean"].value == 0.0
    assert "cpu.preprocess_share" not in ev


def test_parse_dump_reads_activity_and_gil() -> None:
    doc = [{"pid": 7, "thread_id": 1, "os_thread_id": 11, "thread_name": "w", "active": True, "owns_gil": True,
            "frames": [{"name": "busy", "short_filename": "t.py"}]},
           {"pid": 7, "thread_id": 2, "os_thread_id": 12, "thread_name": "idle", "active": False,
            "owns_gil": False, "frames": []}, "junk"]
    states = parse_dump(doc, 7)
    assert [(t.tid, t.active, t.owns_gil) for t in states] == [(11, True, True), (12, False, False)]
    assert states[0].leaf == "busy (t.py)"
    assert parse_dump({"not": "a list"}, 1) == []


def test_explain_failure_names_the_cause() -> None:
    assert "ptrace" in explain_failure("Error: Permission denied (os error 13)", 1)
    assert "exited" in explain_failure("Error: No such process (os error 3)", 1)
    assert "no Python" in explain_failure("Error: Failed to find python version from target process", 1)
    # stopped by the chunk's own SIGINT before its first sample: no fault of py-spy's, a starved start-up
    assert "start-up outlasted the chunk" in explain_failure("", -2)
    assert explain_failure("", 1) == "py-spy failed: exit code 1"
    assert "--light" in pyspy_remedy(explain_failure("", -2))  # the remedy for a starved host, not a by-hand dump


def test_command_line_with_newlines_spans_physical_lines() -> None:
    lines = ['process 5:"python -c \n', "import time\n",
             'while True: pass";thread (5): MainThread;<module> (<string>:3) 7\n',
             "thread (6): other;run (x.py:1) 2\n"]
    samples = parse_raw(lines)
    assert [(s.pid, s.tid, s.count) for s in samples] == [(5, 5, 7), (0, 6, 2)]
    assert "import time" in samples[0].process


def test_a_single_process_record_gets_its_pid_and_a_process_prefix(tmp_path) -> None:
    from diagnose.collectors.pyspy import _prefixed

    raw = tmp_path / "cpu-0-7.raw"
    raw.write_text("thread (11): MainThread;<module> (app.py:3);work (app.py:9) 5\n")
    assert parse_raw(raw.read_text().splitlines(True), pid=7)[0].pid == 7
    lines = _prefixed(str(raw), 7, 'python app.py --name "x"')
    assert lines == ["process 7:\"python app.py --name 'x'\";thread (11): MainThread;<module> (app.py:3);"
                     "work (app.py:9) 5"]
    s = parse_raw_line(lines[0])
    assert s is not None and (s.pid, s.tid, s.count, s.process) == (7, 11, 5, "python app.py --name 'x'")


def test_source_lines_are_read_as_the_target_sees_its_files(tmp_path) -> None:
    from diagnose.collectors.pyspy import read_source_lines

    src = tmp_path / "app.py"
    src.write_text("import threading\nLOCK = threading.Lock()\n    with LOCK:  \n")
    wanted = [(str(src), 3), (str(src), 99), ("relative.py", 1), (str(tmp_path / "x.txt"), 1)]
    got = read_source_lines(os.getpid(), wanted)
    assert got == {f"{src}:3": "with LOCK:"}


def test_how_far_behind_py_spy_fell_is_read_from_its_log() -> None:
    from diagnose.collectors.pyspy import behind_s

    log = ("py-spy> Sampling process 10 times a second for 5 seconds. Press Control-C to exit.\n"
           "py-spy> 1.23s behind in sampling, results may be inaccurate. Try reducing the sampling rate\n"
           "py-spy> 250.50ms behind in sampling, results may be inaccurate. Try reducing the sampling rate\n")
    assert behind_s(log) == 1.23
    assert behind_s("py-spy> 900.00µs behind in sampling") == pytest.approx(0.0009)
    assert behind_s("py-spy> Wrote raw flamegraph data. Samples: 5 Errors: 0") == 0.0


def test_merged_records_count_their_samples() -> None:
    from diagnose.collectors.pyspy import _count

    assert _count(['process 7:"python app.py";thread (11): MainThread;work (app.py:9) 5',
                   'process 7:"python x 3";thread (12): w;run (a.py:1) 12']) == 17


def test_the_records_process_prefix_never_holds_a_secret_of_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line is redacted as it is read for the raw records' ``process N:"…"`` prefix: a recording
    abandoned after the window (it may still write its records once the capture has redacted the files) leaves
    no secret behind."""
    import io

    from diagnose.collectors import pyspy
    from diagnose.redact import redact_argv

    argv = b"\0".join([b"python", b"-m", b"vllm.entrypoints.openai.api_server", b"--api-key", b"s3cr3t-value",
                        b"--port", b"8000"]) + b"\0"
    opened: list[str] = []

    def fake_open(path: str, mode: str = "r", *args: object, **kwargs: object) -> io.BytesIO:
        opened.append(path)
        return io.BytesIO(argv)

    monkeypatch.setattr(pyspy, "open", fake_open, raising=False)
    cmd = pyspy._cmdline(4242, redact_argv)  # what the attach's source passes record_chunked
    assert opened == ["/proc/4242/cmdline"]
    assert cmd == "python -m vllm.entrypoints.openai.api_server --api-key *** --port 8000", cmd
