"""The attach's sources (``diagnose.sources``): each starts, stops and hands back a ``Capture``; the attach
composes a list of them, and a new kind of evidence is one new class that shows up in the session.

This test process plays the service (a Python process that is never paused); py-spy is replaced by
its "not installed" answer so no profiler runs here (tests/integration attach real services with it).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import psutil
import pytest

from diagnose import attach, sources
from diagnose.attach import AttachOptions
from diagnose.collectors import process as process_collector
from diagnose.collectors import pyspy
from diagnose.model import Availability, Capture, CaptureStatus, Window

ME = os.getpid()
WINDOW = Window(1000.0, 1001.0)


@pytest.fixture
def no_pyspy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyspy, "probe", lambda: Availability(False, "py-spy is not installed", "pip install py-spy"))


def _by() -> float:
    """A stop's deadline, as the attach gives it."""
    return time.monotonic() + sources.STOP_BUDGET_S


def _run(src: sources.Source, cut: str = "") -> Capture | None:
    src.start()
    src.stop(_by())
    return src.capture(WINDOW, cut)


def test_process_source_samples_the_tree_and_says_partial_with_the_reason(tmp_path: Path) -> None:
    src = sources.ProcessSource(ME, str(tmp_path))
    src.probe()
    cap = _run(src, cut="the target exited 0.4 s into the window")
    assert cap is not None and cap.collector == "process" and cap.window == WINDOW
    assert cap.status is CaptureStatus.PARTIAL and cap.reason == "the target exited 0.4 s into the window"
    assert (tmp_path / "process.jsonl").read_text().count("\n") >= 3  # two probe samples and the last one
    info = json.loads((tmp_path / "process-info.json").read_text())
    assert info["pid"] == ME and "inductor_cache_files" in info
    assert not src.gone


def test_pyspy_source_not_installed_is_skipped_with_the_remedy(tmp_path: Path, no_pyspy: None) -> None:
    process = sources.ProcessSource(ME, str(tmp_path))
    src = sources.PySpySource(ME, str(tmp_path), process, duration_s=1.0, rate_hz=50, light=False,
                              should_stop=lambda: True)
    cap = _run(src)
    assert cap == Capture("py-spy", CaptureStatus.SKIPPED, "py-spy is not installed", "pip install py-spy", WINDOW)


def _log_window(tmp_path: Path, before: str, during: str) -> tuple[Capture | None, str]:
    """A log holding ``before`` when the window opens and ``during`` appended in it (bytes as written):
    the capture and the copy the source left in the session folder."""
    log = tmp_path / "service.log"
    log.write_text(before)
    src = sources.LogSource(str(log), str(tmp_path), 0)
    src.start()
    with log.open("a", newline="") as fh:
        fh.write(during)
    src.stop(_by())
    cap = src.capture(WINDOW, "")
    return cap, (tmp_path / "log-0-service.log").read_bytes().decode()


def test_log_source_copies_what_was_written_in_the_window_redacted(tmp_path: Path) -> None:
    cap, copied = _log_window(tmp_path, "before\n", "during api_key=sk-abcdefghijklmnopqrstuvwx\n")
    assert cap == Capture("log", CaptureStatus.OK, "", "", WINDOW, ("log-0-service.log",))
    assert "during" in copied and "sk-abcdefghijklmnopqrstuvwx" not in copied


def test_log_source_leaves_out_the_line_being_written(tmp_path: Path) -> None:
    """A last line without its newline is one the service is writing as the window closes: copying half of
    it would cut a prompt before its closing quote (the CI failure of stop 15: the pack kept the prompt)."""
    _, copied = _log_window(tmp_path, "", "INFO logger.py:39] Received request a: prompt: 'done', params: "
                            "SamplingParams(n=1)\nINFO logger.py:39] Received request b: prompt: 'HALF WRITT")
    assert copied == "INFO logger.py:39] Received request a: prompt: 'done', params: SamplingParams(n=1)\n"


def test_log_source_keeps_the_finished_updates_of_a_progress_bar(tmp_path: Path) -> None:
    """A progress bar rewrites its line with \\r until it is done (a service stuck capturing CUDA graphs
    shows nothing else): the updates it finished are kept, the one being written is not."""
    bar = "Capturing CUDA graphs:  {}%|###   | {}/67 [00:0{}<00:30]"
    _, copied = _log_window(tmp_path, "", "INFO loading weights took 14.9 GiB\n" + "".join(
        bar.format(p, n, n) + "\r" for p, n in ((1, 1), (3, 2))) + bar.format(4, 3, 3)[:20])
    assert copied == "INFO loading weights took 14.9 GiB\n" + bar.format(1, 1, 1) + "\r" + bar.format(3, 2, 2) + "\r"


def test_log_source_that_vanished_fails_with_the_reason(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    log.write_text("x\n")
    src = sources.LogSource(str(log), str(tmp_path), 1, collector="probe")
    src.start()
    log.unlink()
    cap = src.capture(WINDOW, "")
    assert cap is not None and cap.collector == "probe" and cap.status is CaptureStatus.FAILED
    assert str(log) in cap.reason and cap.remedy


def test_metrics_source_that_cannot_scrape_fails_with_the_reason(tmp_path: Path) -> None:
    cap = _run(sources.MetricsSource("http://127.0.0.1:9/metrics", str(tmp_path), 0))
    assert cap is not None and cap.collector == "metrics" and cap.status is CaptureStatus.FAILED
    assert cap.reason.startswith("could not scrape http://127.0.0.1:9/metrics") and cap.remedy


def test_cgroup_nvml_nsys_and_snapshot_sources_say_what_they_captured(tmp_path: Path) -> None:
    cgroup = _run(sources.CgroupSource(ME, str(tmp_path), str(tmp_path / "no-cgroup-here")))
    assert cgroup is not None and cgroup.status is CaptureStatus.SKIPPED and "--cgroup-root" in cgroup.remedy
    nvml = _run(sources.NvmlSource(ME, str(tmp_path)))
    assert nvml is not None and nvml.collector == "nvml" and nvml.window == WINDOW
    nsys = _run(sources.NsysSource(ME, str(tmp_path)))  # this process was not started under `nsys launch`
    assert nsys is not None and nsys.status is CaptureStatus.SKIPPED and nsys.reason
    assert _run(sources.ProbeSnapshotSource(ME, str(tmp_path))) is None  # no OOM snapshot: no capture


def test_attach_composes_its_sources_innermost_first(tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    log.write_text("")
    opts = AttachOptions(pid=ME, logs=[str(log)], metrics=["http://127.0.0.1:9/metrics"], nsys=True)
    process = sources.ProcessSource(ME, str(tmp_path))
    composed = attach.window_sources(opts, str(tmp_path), process, lambda: False)
    assert [type(s).__name__ for s in composed] == [
        "PySpySource", "ProcessSource", "NvmlSource", "CgroupSource", "BusyProbe", "NsysSource", "LogSource",
        "ProbeSnapshotSource", "MetricsSource"]
    assert composed[1] is process


class Recorder:
    """A source that notes when it is called: the order of the window."""

    def __init__(self, name: str, calls: list[str]) -> None:
        self.collector = name
        self.calls = calls

    def start(self) -> None:
        self.calls.append(f"start {self.collector}")

    def stop(self, by: float) -> None:
        self.calls.append(f"stop {self.collector}")

    def capture(self, window: Window, cut: str) -> Capture:
        self.calls.append(f"capture {self.collector}")
        return Capture(self.collector, CaptureStatus.OK, cut, "", window)


def test_the_window_nests_the_sources_and_ends_early_when_asked() -> None:
    calls: list[str] = []
    srcs = [Recorder("inner", calls), Recorder("outer", calls)]
    ran = attach.run_window(srcs, 30.0, threading.Event(), should_stop=lambda: len(calls) >= 2)
    assert calls == ["start outer", "start inner", "stop inner", "stop outer"]
    assert ran.window.seconds < 5.0 and ran.cost["window_s"] == pytest.approx(ran.window.seconds, abs=1e-5)
    # the host's shares of the stop and of the wait's late end, where the kernel says
    optional = {"steal_s"} | {f"{phase}_{what}" for phase in ("stop", "late")
                              for what in ("wait_s", "steal_s", "threads_wait_s", "stall_s", "majflt")}
    assert set(ran.cost) - optional == {"window_s", "cpu_s", "self_cpu_s", "pyspy_cpu_s", "cores", "stop_s",
                                        "first_stop_s", "late_s"}
    assert ran.cost["late_s"] == 0.0  # ended early: not late


# /proc/stat's first lines as this 2-vCPU virtual machine's kernel wrote them (2026-12-04), 10 s apart
PROC_STAT = ("cpu  16894 0 3584 32029 391 0 88 1941 0 0\ncpu0 1580 0 834 23884 171 0 12 943 0 0\n"
             "cpu1 15314 0 2750 8144 219 0 76 997 0 0\nintr 212415 0 0 0\nctxt 1234\n")
PROC_STAT_LATER = ("cpu  17883 0 3705 33085 436 0 90 1942 0 0\ncpu0 1601 0 850 24831 180 0 12 943 0 0\n"
                   "cpu1 16282 0 2855 8254 256 0 78 999 0 0\nintr 213000 0 0 0\nctxt 1300\n")


def test_the_steal_is_read_per_cpu_and_the_most_one_cpu_lost_is_the_hosts_time(tmp_path: Path) -> None:
    """``/proc/stat``'s eighth column (steal, in clock ticks) per CPU, the all-CPU line left out; between two
    readings, the most any one CPU lost."""
    before, after = tmp_path / "stat0", tmp_path / "stat1"
    before.write_text(PROC_STAT)
    after.write_text(PROC_STAT_LATER)
    tick = os.sysconf("SC_CLK_TCK")
    a, b = attach._stolen(str(before)), attach._stolen(str(after))
    assert a == {"cpu0": 943 / tick, "cpu1": 997 / tick} and b == {"cpu0": 943 / tick, "cpu1": 999 / tick}
    assert attach.stolen_between(a, b) == round(2 / tick, 3)
    assert attach.stolen_between(a, None) is None
    # a CPU that went offline in between is left out; one only in the later reading too
    assert attach.stolen_between(a, {"cpu1": 999 / tick, "cpu2": 5.0}) == round(2 / tick, 3)
    assert attach.stolen_between(a, {"cpu7": 1.0}) is None
    assert attach._stolen(str(tmp_path / "absent")) is None
    (tmp_path / "old").write_text("cpu  1 2 3 4\ncpu0 1 2 3 4\n")  # a kernel without the column
    assert attach._stolen(str(tmp_path / "old")) is None


def test_the_steal_over_the_window_is_evidence_of_the_host(tmp_path: Path) -> None:
    """attach-cost.json's steal over the window becomes ``host.cpu_steal_share`` (its share of the window);
    a session recorded before the attach measured it has the attach's own CPU only."""
    from types import SimpleNamespace

    from diagnose.derive import session as derive_session
    from diagnose.model import Window

    folder = SimpleNamespace(path=str(tmp_path), window=Window(100.0, 130.0))
    (tmp_path / "attach-cost.json").write_text(json.dumps({"window_s": 31.12, "cores": 0.05, "steal_s": 2.24}))
    got = {e.key: e for e in derive_session._attach_cost(folder)}  # type: ignore[arg-type]
    assert set(got) == {"attach.cpu_cores", "host.cpu_steal_share"}
    steal = got["host.cpu_steal_share"]
    assert steal.value == pytest.approx(2.24 / 31.12) and steal.unit == "ratio"
    (tmp_path / "attach-cost.json").write_text(json.dumps({"window_s": 31.12, "cores": 0.05}))
    assert [e.key for e in derive_session._attach_cost(folder)] == ["attach.cpu_cores"]  # type: ignore[arg-type]


def test_the_stop_is_timed_the_profilers_apart_from_the_rest() -> None:
    """attach-cost.json says how long the stop took: the first source's (the profiler: what the target sees
    end) and all of them (the last full process sample included), on the window's own clock."""
    now = [100.0]

    class Slow(Recorder):
        def __init__(self, name: str, calls: list[str], takes: float) -> None:
            super().__init__(name, calls)
            self.takes = takes

        def stop(self, by: float) -> None:
            super().stop(by)
            now[0] += self.takes

    calls: list[str] = []
    srcs = [Slow("profiler", calls, 1.5), Slow("process", calls, 4.0), Slow("log", calls, 0.25)]
    ran = attach.run_window(srcs, 10.0, threading.Event(), should_stop=lambda: len(calls) >= 3,
                            clock=lambda: now[0], epoch=lambda: 1000.0)
    assert ran.cost["first_stop_s"] == pytest.approx(1.5) and ran.cost["stop_s"] == pytest.approx(5.75)
    assert ran.cost["window_s"] == pytest.approx(5.75)  # no time passed in the wait: the fake clock stood still
    assert ran.stops == {"profiler": 1.5, "process": 4.0, "log": 0.25}  # which one held the window open
    assert (ran.window.start, ran.window.end) == (1000.0, 1005.75)  # stamped by the epoch, as long as the clock says


def test_every_source_stops_by_one_deadline_not_one_timeout_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two sources whose threads the host does not run, each waiting for them as long as it is let: the stop
    ends by one deadline for all of them (``STOP_BUDGET_S`` after the wait), not one timeout after another
    (CI 2026-12-04: 10.0 s for py-spy, then 13.9 s for the process sampler, in a 30 s window)."""
    monkeypatch.setattr(attach, "STOP_BUDGET_S", 0.4)
    never = threading.Event()
    calls: list[str] = []

    class Stuck(Recorder):
        def stop(self, by: float) -> None:
            super().stop(by)
            never.wait(sources.left(by))

    ran = attach.run_window([Stuck("profiler", calls), Stuck("process", calls)], 0.1, threading.Event(),
                            should_stop=lambda: False)
    assert 0.25 < ran.cost["stop_s"] < 0.75 and ran.stops["process"] < 0.2, ran.cost
    assert calls == ["start process", "start profiler", "stop profiler", "stop process"]


def test_the_threads_wait_for_a_cpu_is_read_per_thread(tmp_path: Path) -> None:
    """``TID/schedstat``'s second field (nanoseconds runnable but not running) per thread; between two
    readings, the most any one thread waited (one that started in between: all of its wait)."""
    for tid, line in (("11", "5000 2000000000 7\n"), ("12", "10 500000000 2\n")):
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "schedstat").write_text(line)
    before = attach._thread_waits(str(tmp_path))
    assert before == {"11": 2.0, "12": 0.5}
    (tmp_path / "11" / "schedstat").write_text("9000 2300000000 9\n")
    (tmp_path / "12" / "schedstat").write_text("20 4500000000 3\n")
    (tmp_path / "13").mkdir()  # a thread that started in between
    (tmp_path / "13" / "schedstat").write_text("1 1000000000 1\n")
    assert attach.waited_most(before, attach._thread_waits(str(tmp_path))) == 4.0
    assert attach.waited_most(before, None) is None
    assert attach._thread_waits(str(tmp_path / "absent")) is None
    me = attach._thread_waits()
    assert me is not None and str(threading.get_native_id()) in me


# /proc/pressure/io and /proc/pressure/memory as this 2-vCPU virtual machine's kernel (6.18) wrote them (2026-12-05)
PSI_IO = ("some avg10=0.01 avg60=2.56 avg300=3.19 total=311834908\n"
          "full avg10=0.01 avg60=2.40 avg300=2.41 total=256229646\n")
PSI_MEMORY = ("some avg10=0.00 avg60=0.00 avg300=0.00 total=245267\n"
              "full avg10=0.00 avg60=0.00 avg300=0.00 total=231336\n")


def test_the_machines_stalls_on_the_disk_and_memory_are_read_from_psi(tmp_path: Path) -> None:
    """``some total=`` (microseconds at least one task stalled) of ``io`` and of ``memory``; the ``full`` lines
    and the ``cpu`` file left out; None where the kernel does not say."""
    (tmp_path / "io").write_text(PSI_IO)
    (tmp_path / "memory").write_text(PSI_MEMORY)
    (tmp_path / "cpu").write_text("some avg10=0.00 avg60=0.31 avg300=3.01 total=4452899810\n")
    assert attach._stalled(str(tmp_path)) == pytest.approx((311834908 / 1e6, 245267 / 1e6))
    (tmp_path / "memory").write_text("full avg10=0.00 avg60=0.00 avg300=0.00 total=231336\n")  # no some line
    assert attach._stalled(str(tmp_path)) is None
    assert attach._stalled(str(tmp_path / "absent")) is None


def test_the_hosts_share_of_an_interval_is_each_reading_between_two_marks() -> None:
    """The calling thread's run-queue wait, the most one CPU lost to steal, the most one thread waited, the most
    the machine stalled on the disk or on memory (a refault counts in both: not summed) and the attach's major
    faults between two marks; what either mark lacks is left out."""
    before = attach.HostMark(10.0, {"cpu0": 1.0, "cpu1": 2.0}, (300.0, 50.0), 7, {"11": 1.0, "12": 5.0})
    after = attach.HostMark(10.4, {"cpu0": 1.5, "cpu1": 2.1}, (307.25, 56.0), 19, {"11": 9.0, "12": 5.5})
    assert after.since(before, "late") == {"late_wait_s": 0.4, "late_steal_s": 0.5, "late_threads_wait_s": 8.0,
                                           "late_stall_s": 7.25, "late_majflt": 12}
    bare = attach.HostMark(None, None, None, None)
    assert after.since(bare, "stop") == {} and bare.since(before, "stop") == {}
    assert set(after.since(attach.HostMark(10.0, None, (300.0, 1.0), None), "after")) == {"after_wait_s",
                                                                                          "after_stall_s"}
    me = attach.HostMark.read(threads=True, steal=False)  # this process's own readings, where this kernel gives them
    assert me.threads is None or str(threading.get_native_id()) in me.threads
    assert me.stolen is None and me.majflt is not None and me.majflt >= 0


def test_a_wait_that_ends_late_says_how_late_and_what_the_host_took_meanwhile() -> None:
    """A wait that the host ended 5 s past the window's duration (its thread not run, or paged back in): the
    window is 5 s longer, ``late_s`` says so, and the host's readings over that last wait are kept beside it
    (what the live tests forgive the window's bound)."""
    ticks = iter([0.0, 0.1])  # the window opens, one wait begins; it ends 5 s past the 0.2 s duration

    def clock() -> float:
        return next(ticks, 5.2)

    ran = attach.run_window([Recorder("profiler", [])], 0.2, threading.Event(), should_stop=lambda: False,
                            clock=clock)
    assert ran.cost["late_s"] == 5.0 and ran.cost["window_s"] == pytest.approx(5.2)
    shares = {k for k in ran.cost if k.startswith("late_") and k != "late_s"}
    assert shares <= {"late_wait_s", "late_threads_wait_s", "late_stall_s", "late_majflt"}  # no steal per wait
    if attach._waited() is not None:  # the kernel says: the last wait's own run-queue delay, not the thread's life
        assert 0.0 <= ran.cost["late_wait_s"] < 1.0


def test_the_late_share_is_read_from_the_last_waits_mark_not_the_windows_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each wait is marked before its timeout is computed; the late share is the last wait's mark to the end:
    marks whose readings grow by 1 s each give a share of 2 s (that mark, the one read at the loop's last
    check, the one after it), whatever the number of waits before."""
    reads = [0]

    def counting(threads: bool = False, steal: bool = True) -> attach.HostMark:
        reads[0] += 1
        n = float(reads[0])
        return attach.HostMark(n, None, (n, 0.0), reads[0], {"7": n} if threads else None)

    monkeypatch.setattr(attach.HostMark, "read", staticmethod(counting))
    ran = attach.run_window([Recorder("profiler", [])], 0.6, threading.Event(), should_stop=lambda: False)
    assert reads[0] >= 6  # a mark per wait (0.6 s of 0.25 s waits: three), and the window's own readings
    assert ran.cost["late_wait_s"] == ran.cost["late_stall_s"] == ran.cost["late_threads_wait_s"] == 2.0
    assert ran.cost["late_majflt"] == 2


def test_a_wall_clock_stepped_during_the_window_neither_ends_it_nor_stretches_it() -> None:
    """The wait and every duration are on the monotonic clock; only the window's start is the wall clock's.
    A wall clock stepped 30 s forward in the middle of a 0.6 s window (NTP after a virtual machine was
    paused) leaves a 0.6 s window."""
    wall = [5000.0]
    calls: list[str] = []

    class Stepper(Recorder):
        def start(self) -> None:
            super().start()
            threading.Timer(0.2, lambda: wall.__setitem__(0, wall[0] + 30.0)).start()

    ran = attach.run_window([Stepper("profiler", calls)], 0.6, threading.Event(), should_stop=lambda: False,
                            epoch=lambda: wall[0])
    assert ran.window.start == 5000.0 and 0.55 < ran.window.seconds < 3.0 and 0.55 < ran.cost["window_s"] < 3.0


class Heartbeat:
    """A new kind of evidence, as one class: the window's start and stop times, written to a file."""

    collector = "heartbeat"

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.times: list[float] = []

    def start(self) -> None:
        self.times.append(1.0)

    def stop(self, by: float) -> None:
        self.times.append(2.0)

    def capture(self, window: Window, cut: str) -> Capture:
        with open(os.path.join(self.folder, "heartbeat.json"), "w", encoding="utf-8") as fh:
            json.dump(self.times, fh)
        return Capture(self.collector, CaptureStatus.PARTIAL if cut else CaptureStatus.OK, cut, "", window,
                       ("heartbeat.json",))


def test_a_new_source_is_one_class_and_shows_up_in_the_session(tmp_path: Path, no_pyspy: None) -> None:
    out = tmp_path / "session"
    beat = Heartbeat(str(out))
    session, diagnosis = attach.attach(AttachOptions(pid=ME, duration_s=0.5, output=str(out)), extra=[beat])
    assert beat.times == [1.0, 2.0]
    names = [c.collector for c in session.captures]
    assert names[:4] == ["py-spy", "process", "nvml", "cgroup"] and names[-1] == "heartbeat"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["captures"][-1]["collector"] == "heartbeat" and "heartbeat.json" in manifest["files"]
    assert json.loads((out / "heartbeat.json").read_text()) == [1.0, 2.0]
    assert session.captures[0].status is CaptureStatus.SKIPPED  # py-spy: not installed here, said so
    assert [c.collector for c in diagnosis.captures] == names
    assert 0.4 < session.window.seconds < 5.0
    cost = json.loads((out / "attach-cost.json").read_text())
    assert cost["window_s"] == pytest.approx(session.window.seconds, abs=1e-5) and cost["max_rate_hz"] == 50
    # its phases outside the window: since the process started, since attach() was called, after the window
    assert cost["started_s"] >= cost["setup_s"] >= 0.0 and cost["setup_cpu_s"] >= 0.0
    # since the process started: this test's process is older than the attach, by its start time on the boot clock
    assert cost["started_s"] - cost["setup_s"] > 0.0

    assert cost["after_s"] > 0.0 and cost["after_cpu_s"] > 0.0  # the analysis ran after the window closed
    # and how much of each it waited for a CPU (the kernel's run-queue delay of the thread doing that work)
    assert 0.0 <= cost["started_wait_s"] <= cost["started_s"] and 0.0 <= cost["after_wait_s"] <= cost["after_s"]
    # and how much of each the hypervisor took from the machine, where the kernel says (a steal column in
    # /proc/stat), to its clock tick
    tick = 1.0 / os.sysconf("SC_CLK_TCK")
    if attach._stolen() is not None:
        assert 0.0 <= cost["setup_steal_s"] <= cost["setup_s"] + tick
        assert 0.0 <= cost["stop_steal_s"] <= cost["steal_s"] <= cost["window_s"] + tick
        assert 0.0 <= cost["after_steal_s"] <= cost["after_s"] + tick
    else:
        assert not {"setup_steal_s", "steal_s", "stop_steal_s", "after_steal_s"} & set(cost)
    # and how long each kind of source took to stop (which one held the window open, when one does)
    assert set(names) <= set(cost["stop_each_s"]) and sum(cost["stop_each_s"].values()) <= cost["stop_s"] + 1e-3


class Broken(Heartbeat):
    """A source with a defect: its capture raises, with secrets in the message (a token, a flag's value)."""

    collector = "metrics"

    def capture(self, window: Window, cut: str) -> Capture:
        raise IndexError("list index out of range near HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz123456 "
                         "in ['serve', '--api-key', 'sk-live-0123']")


class BrokenStop(Heartbeat):
    """A source whose stop raises (a full disk); its capture is never asked for."""

    collector = "metrics"

    def stop(self, by: float) -> None:
        raise OSError(28, "No space left on device")

    def capture(self, window: Window, cut: str) -> Capture:
        raise AssertionError("a source whose stop failed is not captured")


def test_a_source_whose_stop_or_capture_raises_fails_alone_and_the_attach_still_ends_in_a_verdict(
        tmp_path: Path, no_pyspy: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI 2026-12-04: one source's defect ended a live attach in a traceback, its verdict and every other
    source's evidence lost. Now each is that source's failed capture, with the reason, the remedy and its own
    traceback file (two sources may share a collector name), secrets redacted; the sources after a failed
    stop are still stopped, and the target's command line is redacted even when the process capture failed."""
    monkeypatch.setattr(sources.ProcessSource, "capture", Broken.capture)
    monkeypatch.setattr(process_collector, "target_info",
                        lambda pid: {"cmdline": ["vllm", "serve", "--api-key", "s3cr3t-value"], "exe": "", "user": ""})
    out = tmp_path / "session"
    beat = Heartbeat(str(out))
    session, diagnosis = attach.attach(AttachOptions(pid=ME, duration_s=0.5, output=str(out)),
                                       extra=[Broken(str(out)), BrokenStop(str(out)), beat])
    assert beat.times == [1.0, 2.0]  # stopped after a stop that raised
    got = [(c.collector, c.status, c.reason, c.remedy) for c in session.captures]
    failed = [g for g in got if g[1] is CaptureStatus.FAILED and "defect of its own" in g[2]]
    assert [(g[0], g[2].split(" failed")[0]) for g in failed] == [
        ("process", "diagnose's process capture"), ("metrics", "diagnose's metrics capture"),
        ("metrics", "diagnose's metrics stop")], got
    assert "IndexError: list index out of range" in failed[0][2] and "OSError" in failed[2][2]
    names = [g[3].split("(")[-1].split(" holds")[0] for g in failed]
    assert len(set(names)) == 3 and all(n.endswith("-error.txt") for n in names), names
    for g, name in zip(failed, names, strict=True):
        trace = (out / name).read_text()
        assert "Traceback" in trace and "diagnose pack" in g[3]
        assert not any(s in g[2] + trace for s in ("hf_abcdef", "sk-live-0123", "s3cr3t")), (g, trace)
    assert dict((c.collector, c.status) for c in session.captures)["heartbeat"] is CaptureStatus.OK
    assert "s3cr3t-value" not in " ".join(session.target.cmdline)
    assert "s3cr3t-value" not in (out / "manifest.json").read_text()
    assert diagnosis.verdict and [c.collector for c in diagnosis.captures] == [c.collector for c in session.captures]


def test_the_process_age_is_read_to_the_clock_tick_not_the_boot_times_second() -> None:
    first, t0 = attach._age(), time.monotonic()
    time.sleep(0.2)
    second, t1 = attach._age(), time.monotonic()
    assert first is not None and second is not None
    assert second - first == pytest.approx(t1 - t0, abs=0.011)  # one clock (the boot clock), no jumps
    assert abs(second - (time.time() - psutil.Process().create_time())) < 1.1  # psutil's, to the boot time's second



def test_a_stopped_window_is_partial_with_the_reason(tmp_path: Path, no_pyspy: None) -> None:
    stop = threading.Event()
    stop.set()  # Ctrl-C before the window even began
    session, _ = attach.attach(AttachOptions(pid=ME, duration_s=30.0, output=str(tmp_path / "s")), stop,
                               extra=[Heartbeat(str(tmp_path / "s"))])
    assert session.window.seconds < 5.0
    by_name = {c.collector: c for c in session.captures}
    for name in ("process", "heartbeat"):
        assert by_name[name].status is CaptureStatus.PARTIAL
        assert by_name[name].reason.startswith("stopped early by the user after")


def test_sweep_loads_the_service_through_the_whole_window(tmp_path: Path, no_pyspy: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``diagnose sweep --pid``: its clients are one more source, started before the busy probe sees the service."""
    from diagnose import sweep

    calls: list[str] = []
    monkeypatch.setattr(sweep, "run_step", lambda spec, c, warm, secs: calls.append(f"load {c} for {secs:.1f} s"))
    probe = sources.ProcessSource.probe
    monkeypatch.setattr(sources.ProcessSource, "probe", lambda self: (calls.append("probe"), probe(self))[1])
    monkeypatch.chdir(tmp_path)  # the session is written under the default name, here
    opts = sweep.SweepOptions(url="http://127.0.0.1:9/", pid=ME, attach_duration_s=0.5, warmup_s=0.0)
    doc = sweep.attach_at(sweep.request_spec(opts), opts, 4, progress=lambda msg: None)
    assert calls == ["load 4 for 2.5 s", "probe"]
    manifest = json.loads((Path(doc["session"]) / "manifest.json").read_text())
    load = manifest["captures"][-1]
    assert load["collector"] == "load" and load["status"] == "ok"
    assert load["reason"] == "4 closed-loop client(s) of diagnose sweep loaded http://127.0.0.1:9/"


@pytest.fixture
def pyspy_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pyspy, "probe", lambda: Availability(True))


def _pyspy_source(tmp_path: Path, duration_s: float = 1.0) -> sources.PySpySource:
    process = sources.ProcessSource(ME, str(tmp_path))
    return sources.PySpySource(ME, str(tmp_path), process, duration_s=duration_s, rate_hz=50, light=False,
                               should_stop=lambda: False)


def test_pyspy_source_of_a_tree_without_python_is_skipped_with_the_reason_and_a_remedy(
        tmp_path: Path, pyspy_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A native server (llama-server, Triton, TGI's router): the profiler does not apply, and says so."""
    monkeypatch.setattr(sources, "is_python", lambda proc: False)
    src = _pyspy_source(tmp_path)
    cap = _run(src)
    assert cap is not None and cap.status is CaptureStatus.SKIPPED
    assert cap.reason.startswith(f"process {ME} (")
    assert cap.reason.endswith(") runs no Python interpreter (nor does any process of its tree): "
                               "a Python profiler does not apply")
    assert f"`perf top -p {ME}`" in cap.remedy and "--metrics" in cap.remedy
    assert cap.notes and cap.notes[0].startswith(f"pid {ME} (") and cap.notes[0].endswith(
        "runs no Python interpreter, not profiled")
    assert not (tmp_path / pyspy.RAW_FILE).exists()


def _chunk(k: int, kind: str, pid: int, rate: int, samples: int, killed: bool = False,
           behind_s: float = 0.0) -> dict[str, object]:
    return {"chunk": k, "kind": kind, "pid": pid, "rate_hz": rate, "seconds": 3.0, "lines": [0, 0],
            "samples": 0 if killed else samples, "samples_reported": None, "behind_s": behind_s, "killed": killed,
            "ok": not killed}


def test_pyspy_capture_says_per_process_what_was_recorded_and_what_was_killed(
        tmp_path: Path, pyspy_here: None) -> None:
    """vLLM V1's three processes and a native helper: one line each, in tree order; a py-spy killed past
    its grace makes the capture partial, with the reason and a remedy."""
    src = _pyspy_source(tmp_path)
    src._order = [100, 101, 102, 103, 104]
    src._pythons = {100: True, 101: True, 102: True, 103: False, 104: True}
    src._names = {100: "python -m vllm.entrypoints.openai.api_server", 101: "VLLM::EngineCore",
                  102: "VLLM::Worker", 103: "nvidia-smi", 104: "python -c from multiprocessing.resource_tracker …"}
    src._why = {100: "0.15 cores, serves requests: wall-clock view at 10 Hz",
                101: "0.67 cores: on-CPU profile at 5 Hz (the floor: over the budget)",
                102: "0.85 cores: on-CPU profile at 10 Hz",
                104: "0.00 cores: idle and serves no requests, a coarse wall-clock view at 4 Hz"}
    killed = ("py-spy's on-CPU record of pid 102 did not stop within 2 s of the end of chunk 1 and was killed: "
              "its samples of that chunk are lost")
    src.result = pyspy.ChunkedResult(
        True, True, killed, [pyspy.RAW_FILE, pyspy.WALL_FILE, pyspy.LOG_FILE],
        [_chunk(0, "wall", 100, 10, 300), _chunk(0, "cpu", 101, 5, 40), _chunk(0, "cpu", 102, 10, 90, behind_s=1.5),
         _chunk(1, "wall", 100, 10, 310), _chunk(1, "cpu", 101, 5, 35), _chunk(1, "cpu", 102, 10, 0, killed=True),
         _chunk(0, "cover", 104, 4, 7), _chunk(1, "cover", 104, 4, 7)],
        [], 0, [killed])
    for name in (pyspy.RAW_FILE, pyspy.WALL_FILE):
        (tmp_path / name).write_text("")
    tracker = 'process 104:"python -c x";thread (104): MainThread;main (multiprocessing/resource_tracker.py:227)'
    (tmp_path / pyspy.COVER_FILE).write_text(f"{tracker} 12\n{tracker[:-5]}:230) 2\n")
    cap = src.capture(WINDOW, "")
    assert cap.status is CaptureStatus.PARTIAL and cap.reason == killed
    assert "--rate" in cap.remedy and "--light" in cap.remedy
    assert cap.notes == (
        "pid 100 (python -m vllm.entrypoints.openai.api_server): 610 wall-clock samples at 10 Hz "
        "(0.15 cores, serves requests: wall-clock view at 10 Hz)",
        "pid 101 (VLLM::EngineCore): 75 on-CPU samples at 5 Hz (0.67 cores: on-CPU profile at 5 Hz (the floor: "
        "over the budget))",
        "pid 102 (VLLM::Worker): 90 on-CPU samples at 10 Hz (0.85 cores: on-CPU profile at 10 Hz); 1 record(s) "
        "killed past the grace, their samples lost; py-spy fell 1.5 s behind its rate (the host is short of CPU)",
        "pid 103 (nvidia-smi): runs no Python interpreter, not profiled",
        "pid 104 (python -c from multiprocessing.resource_tracker …): 14 coarse wall-clock samples at 4 Hz, "
        "mostly at main (multiprocessing/resource_tracker.py:227) (86 %) (0.00 cores: idle and serves no "
        "requests, a coarse wall-clock view at 4 Hz)",
    )
    meta = json.loads((tmp_path / "pyspy-meta.json").read_text())
    assert meta["overruns"] == [killed]


def _held_recording(monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> None:
    """py-spy's recording, faked: it ends (whole, no files) only once ``release`` is set (its thread, on a
    host that does not run it); its schedule is anchored where the source began."""

    def held(*args: object, start: float, **kwargs: object) -> pyspy.ChunkedResult:
        assert 0 < time.monotonic() - start < 5.0
        release.wait(10.0)
        return pyspy.ChunkedResult(True, False, "", [], [], [])

    monkeypatch.setattr(pyspy, "record_chunked", held)
    monkeypatch.setattr(process_collector, "tree_pids", lambda pid: [pid])


def test_pyspy_source_stop_returns_by_its_deadline_and_the_capture_waits_for_the_rest(
        tmp_path: Path, pyspy_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording still running at the stop's deadline (a host that does not run its thread) is not waited
    for past it: the window closes, and the capture, after it, waits for the recording to end. The notes say
    it ended after the window, and how long after."""
    release = threading.Event()
    _held_recording(monkeypatch, release)
    src = _pyspy_source(tmp_path, duration_s=5.0)  # its own grace and join are far beyond the deadline
    src.start()
    t0 = time.monotonic()
    src.stop(t0 + 0.3)
    took = time.monotonic() - t0
    assert 0.25 < took < 1.5, took
    threading.Timer(0.4, release.set).start()
    cap = src.capture(WINDOW, "")
    assert cap.status is CaptureStatus.OK and not cap.reason, cap
    assert cap.notes[-1].startswith("the recording was still running when the window closed"), cap.notes
    assert 0.3 < src.late_s < 5.0, src.late_s


def test_pyspy_source_late_recording_that_ended_before_the_capture_says_how_late(
        tmp_path: Path, pyspy_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One that ended between the stop and the capture: the lateness is until it ended (0.3 s), not zero and
    not until the capture (0.9 s)."""
    release = threading.Event()
    _held_recording(monkeypatch, release)
    src = _pyspy_source(tmp_path, duration_s=5.0)
    src.start()
    src.stop(time.monotonic() + 0.2)
    time.sleep(0.3)
    release.set()
    time.sleep(0.6)  # it has ended by the capture
    cap = src.capture(WINDOW, "")
    assert cap.status is CaptureStatus.OK and 0.2 < src.late_s < 0.75, src.late_s


def test_pyspy_source_has_the_records_command_lines_redacted_as_they_are_read(
        tmp_path: Path, pyspy_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recording gets the attach's redaction for each process' command line (the raw records' prefix),
    so an abandoned recording that writes after the capture leaves no secret (collectors do not import it)."""
    from diagnose.redact import redact_argv

    got: dict[str, object] = {}

    def recorded(*args: object, **kwargs: object) -> pyspy.ChunkedResult:
        got.update(kwargs)
        return pyspy.ChunkedResult(True, False, "", [], [], [])

    monkeypatch.setattr(pyspy, "record_chunked", recorded)
    monkeypatch.setattr(process_collector, "tree_pids", lambda pid: [pid])
    src = _pyspy_source(tmp_path, duration_s=0.2)
    src.start()
    src.stop(time.monotonic() + 2.0)
    assert got.get("redact") is redact_argv, got


def _abandoned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[sources.PySpySource, threading.Event]:
    """A source whose recording has not ended a grace and a join after the window (it ends once the event is
    set), started and stopped."""
    monkeypatch.setattr(pyspy, "STOP_GRACE_S", 0.1)
    monkeypatch.setattr(sources, "JOIN_S", 0.1)
    release = threading.Event()
    _held_recording(monkeypatch, release)
    src = _pyspy_source(tmp_path, duration_s=0.2)
    src.start()
    src.stop(time.monotonic() + 0.3)
    return src, release


def test_pyspy_source_abandons_a_recording_that_never_ends(
        tmp_path: Path, pyspy_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """One that has not ended a grace and a join after the window either is abandoned, and the capture says
    so with the remedy; a result it hands back later is not read."""
    src, release = _abandoned(tmp_path, monkeypatch)
    cap = src.capture(WINDOW, "")
    release.set()
    assert cap.status is CaptureStatus.FAILED and "abandoned" in cap.reason and "--rate" in cap.remedy, cap
    assert "the recording was still running" not in " ".join(cap.notes)
    src._thread.join(2.0)  # type: ignore[union-attr]
    assert src.result is not None and src.capture(WINDOW, "").status is CaptureStatus.FAILED


def test_pyspy_source_abandoned_with_coarse_samples_on_disk_says_where_the_process_stood(
        tmp_path: Path, pyspy_here: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """An abandoned recording has no chunk counts, but its coarse record may already be on disk (CI 2026-12-04,
    a live vLLM attach: the note indexed a part that was not there and the attach died with a traceback): the
    note says where the process stood, uncounted, and the capture fails with the reason."""
    src, release = _abandoned(tmp_path, monkeypatch)
    frame = f'process {ME}:"python -m server";thread ({ME}): MainThread;serve (server.py:40)'
    (tmp_path / pyspy.COVER_FILE).write_text(f"{frame} 3\n")
    cap = src.capture(WINDOW, "")
    release.set()
    assert cap.status is CaptureStatus.FAILED and "abandoned" in cap.reason, cap
    mine = [n for n in cap.notes if n.startswith(f"pid {ME} ")]
    assert len(mine) == 1 and mine[0].split(": ", 1)[1].startswith(
        "coarse wall-clock samples, uncounted, mostly at serve (server.py:40) (100 %)"), cap.notes
    src._thread.join(2.0)  # type: ignore[union-attr]


def test_process_source_stop_skips_the_last_sample_when_its_thread_is_in_a_tick_at_the_deadline(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampler's thread in a tick the host does not let it finish (here: one that blocks) at the deadline
    is not waited for; the capture waits for it to end, and says the last full sample was not taken."""
    src = sources.ProcessSource(ME, str(tmp_path))
    src.probe()
    real, release, inside = src.sampler.tick, threading.Event(), threading.Event()

    def tick(full: bool = False) -> None:
        if threading.current_thread().name == "diagnose-sampler":
            inside.set()
            release.wait(10.0)
        real(full=full)

    monkeypatch.setattr(src.sampler, "tick", tick)
    src.start()
    assert inside.wait(5.0)
    t0 = time.monotonic()
    src.stop(t0 + 0.3)
    took = time.monotonic() - t0
    assert 0.25 < took < 1.5 and src.last_skipped, took
    threading.Timer(0.2, release.set).start()
    cap = src.capture(WINDOW, "")
    assert cap is not None and cap.status is CaptureStatus.OK
    assert cap.notes and cap.notes[0].startswith("the window's last full sample was not taken"), cap.notes
    assert src._thread is not None and not src._thread.is_alive()  # ended before the capture read anything


def test_process_source_stop_takes_the_last_full_sample_and_the_thread_takes_none_after(tmp_path: Path) -> None:
    """The sampler's thread waiting for the lock (py-spy's chunk holds it for a full sample) when the stop
    begins: once it gets the lock it takes no sample, and the stop's full one is the last of the window."""
    src = sources.ProcessSource(ME, str(tmp_path))
    src.probe()
    src.start()
    time.sleep(0.4)
    held = threading.Event()

    def chunk() -> None:  # as py-spy's on_chunk would, but holding the lock while the stop begins
        with src.lock:
            held.set()
            time.sleep(src.sampler.interval_s * 3)  # the sampler's thread wakes and waits for the lock

    threading.Thread(target=chunk).start()
    assert held.wait(5.0)
    before = src.sampler.samples
    time.sleep(src.sampler.interval_s * 1.5)
    src.stop(time.monotonic() + 5.0)
    src.capture(WINDOW, "")
    last = json.loads((tmp_path / "process.jsonl").read_text().splitlines()[-1])
    assert src.sampler.samples == before + 1 and last.get("full") is True and not src.last_skipped


def test_process_source_stop_past_its_deadline_takes_no_sample(tmp_path: Path) -> None:
    """Sources before it used the whole deadline: the last full sample is not taken (a tick past the deadline
    is what held CI's window open), and the capture says so."""
    src = sources.ProcessSource(ME, str(tmp_path))
    src.probe()
    src.start()
    before = src.sampler.samples
    src.stop(time.monotonic() - 1.0)
    cap = src.capture(WINDOW, "")
    assert src.last_skipped and src.sampler.samples <= before + 1  # at most the thread's own step in flight
    assert cap.notes[0].startswith("the window's last full sample was not taken"), cap.notes


def test_nvml_is_not_shut_down_under_a_thread_still_in_a_driver_call(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampler thread stuck in an NVML call past the stop and the capture's join: NVML is left open (shutting
    it down under a call in flight is not safe), and the capture says so (failed: not one sample was taken)."""
    monkeypatch.setattr(sources, "JOIN_S", 0.1)
    src = sources.NvmlSource(ME, str(tmp_path))
    release, inside, closed = threading.Event(), threading.Event(), []

    def stuck() -> None:
        inside.set()
        release.wait(10.0)

    monkeypatch.setattr(src.sampler, "tick", stuck)
    monkeypatch.setattr(src.sampler, "close", lambda window=None: closed.append(window))
    src.start()
    assert inside.wait(5.0)
    src.stop(time.monotonic() + 0.2)
    cap = src.capture(WINDOW, "")
    release.set()
    assert not closed and "left open" in cap.reason, cap
    assert cap.status is CaptureStatus.FAILED  # stuck in its first call: no sample at all
