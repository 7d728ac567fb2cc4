"""The watch scenario's measure of the time the host held the watcher back (tests/watch_scenario.py), which its
deadlines forgive: only a thread that waited for a CPU, or paged from the disk, across a whole interval counts;
and its request of the watcher's /metrics, which fails with what the watcher's threads were doing."""

from __future__ import annotations

import http.server
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests import attach_cost, watch_scenario


def test_a_thread_queued_or_paging_at_both_readings_that_did_not_run_was_held_back() -> None:
    before = {11: ("R", 5_000, 0), 12: ("S", 900, 0)}
    assert watch_scenario.held_between(before, {11: ("R", 5_000, 0), 12: ("S", 900, 0)})  # queued all along
    assert not watch_scenario.held_between(before, {11: ("R", 9_000, 0), 12: ("S", 900, 0)})  # it ran in between
    assert not watch_scenario.held_between(before, {11: ("S", 5_000, 0), 12: ("S", 900, 0)})  # asleep: its own
    assert watch_scenario.held_between({11: ("D", 1, 3)}, {11: ("D", 1, 9)})  # reading its pages back
    assert not watch_scenario.held_between({11: ("D", 1, 3)}, {11: ("D", 1, 3)})  # a write, a /proc read: no fault
    assert not watch_scenario.held_between({11: ("D", 1, 3)}, {11: ("D", 7, 9)})  # it ran in between
    assert not watch_scenario.held_between({11: ("D", 1, 3)}, {12: ("D", 1, 9)})  # a thread born since
    assert not watch_scenario.held_between({}, {})


def test_the_thread_states_are_read_from_proc() -> None:
    """This process's threads: a sleeping one reads S with a run time that does not move."""
    sleeper = threading.Thread(target=time.sleep, args=(2.0,), daemon=True)
    sleeper.start()
    time.sleep(0.1)
    states = watch_scenario._thread_states(os.getpid())
    assert states[threading.get_native_id()][0] == "R"  # the reader itself runs
    assert sleeper.native_id is not None and states[sleeper.native_id][0] == "S"
    again = watch_scenario._thread_states(os.getpid())
    assert again[sleeper.native_id] == states[sleeper.native_id]
    assert watch_scenario._thread_states(None) == {}
    assert watch_scenario.host_lost_s(None)[0] == 0.0 and watch_scenario.host_lost_s(None, None)[1] is None


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    yield sock.getsockname()[1]
    sock.close()


def test_a_watcher_that_does_not_answer_fails_with_its_threads(silent_port: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch_scenario, "ANSWER_WITHIN_S", 1.0)
    asked: list[tuple[int, bool]] = []

    def threads_of(pid: int, blocking: bool = True) -> str:  # its /proc part and py-spy's dump (a process)
        asked.append((pid, blocking))
        return "tid 1 (python): state R\n"

    monkeypatch.setattr(attach_cost, "threads_of", threads_of)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"timed out after 1\.\d s, 0\.0 s of it the host's .*\ntid 1 \(python"):
        watch_scenario.metrics_held(silent_port, os.getpid())  # this process plays the watcher
    assert asked == [(os.getpid(), False)]  # read as it runs: the watcher is not paused
    assert time.monotonic() - start < 10.0


class _Truncated(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b"diagnose_up 1\n")  # 14 of the 100 bytes said, then the connection closes

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


def test_an_answer_that_breaks_off_fails_as_a_request_that_failed() -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _Truncated)
    threading.Thread(target=server.handle_request, daemon=True).start()
    try:
        with pytest.raises(OSError, match="the answer broke off: IncompleteRead"):
            watch_scenario.metrics_held(server.server_address[1], None)
    finally:
        server.server_close()


def test_an_answer_is_parsed_with_the_time_the_host_held_the_watcher() -> None:
    class Whole(_Truncated):
        def do_GET(self) -> None:
            body = b"# TYPE diagnose_up gauge\ndiagnose_up 1.0\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.HTTPServer(("127.0.0.1", 0), Whole)
    threading.Thread(target=server.handle_request, daemon=True).start()
    try:
        answer, lost = watch_scenario.metrics_held(server.server_address[1], os.getpid())
    finally:
        server.server_close()
    assert answer["diagnose_up"][()] == 1.0 and 0.0 <= lost < 5.0
