"""``diagnose watch`` without a process: its rules, its ring, its trigger states, its HTTP answers, and the
session evidence it leaves — on real scrapes of vLLM (the engine lab's recordings) and a real
Alertmanager payload. The watcher on live services: tests/integration/test_watch_demo.py and
tests/engines/test_vllm_watch.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from diagnose import pipeline, watch, watch_http, watch_rules
from diagnose.errors import InputError
from diagnose.model import CaptureStatus, Session, Target, Window
from diagnose.sources import write_json_atomic
from tests.vllm_metrics import split_scrapes

DATA = Path(__file__).resolve().parents[1] / "data"
VLLM = DATA / "engines" / "vllm"
ALERT = DATA / "alertmanager" / "v4-firing.json"
RECORDED = DATA / "engines" / "watch" / "vllm_admission_cap"  # a real watch session on vLLM (SOURCE.md)


def scrapes(name: str) -> list[tuple[float, str]]:
    """The recording's two scrapes of vLLM's /metrics (a window apart) as (time, text)."""
    return split_scrapes((VLLM / name / "metrics.txt").read_text())


# -- rules ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "name", "op", "threshold", "shown"), [
    ("ttft_p99>2s", "ttft_p99", ">", 2000.0, "ttft_p99>2s"),
    ("ttft_p99 > 500ms", "ttft_p99", ">", 500.0, "ttft_p99>500ms"),
    ("e2e_p99>=5s", "e2e_p99", ">=", 5000.0, "e2e_p99>=5s"),
    ("queue>8", "queue", ">", 8.0, "queue>8"),
    ("kv>0.95", "kv", ">", 0.95, "kv>0.95"),
    ("kv>95%", "kv", ">", 0.95, "kv>0.95"),
    ("OOM", "oom", "", 0.0, "oom"),
    ("bottleneck", "bottleneck", "", 0.0, "bottleneck"),
])
def test_rules_are_parsed_once_into_canonical_units(text: str, name: str, op: str, threshold: float,
                                                    shown: str) -> None:
    rule = watch_rules.parse_rule(text)
    assert (rule.name, rule.op, rule.threshold, rule.text) == (name, op, pytest.approx(threshold), shown)


@pytest.mark.parametrize(("text", "says"), [
    ("ttft_p99>2", "without its unit"),
    ("kv>1.5", "fraction of the pool"),
    ("queue>2.5", "number of waiting requests"),
    ("queue>4s", "number of waiting requests"),
    ("latency>2s", "not a trigger rule"),
    ("queue<3", "not a trigger rule"),
    ("", "not a trigger rule"),
])
def test_a_bad_rule_gets_one_sentence_and_the_remedy(text: str, says: str) -> None:
    with pytest.raises(InputError) as err:
        watch_rules.parse_rule(text)
    assert says in str(err.value) and err.value.remedy and err.value.exit_code == 2


def test_the_default_rules_are_bottleneck_and_oom_and_repeats_collapse() -> None:
    assert [r.text for r in watch_rules.parse_rules(None)] == ["bottleneck", "oom"]
    assert [r.text for r in watch_rules.parse_rules(["kv>95%", "kv>0.95", "oom"])] == ["kv>0.95", "oom"]


def test_metric_rules_read_a_real_vllm_scrape_pair() -> None:
    """admission_cap: 14 requests wait at the first scrape; the TTFT p99 over the window is seconds."""
    first, last = scrapes("admission_cap")
    at_start = watch_rules.reading([first])
    assert watch_rules.metric_value(watch_rules.parse_rule("queue>8"), at_start) == 14.0
    assert watch_rules.parse_rule("queue>8").holds(14.0) and not watch_rules.parse_rule("queue>14").holds(14.0)
    assert watch_rules.parse_rule("queue>=14").holds(14.0)
    windowed = watch_rules.reading([first, last])
    assert windowed is not None and windowed.window_s == pytest.approx(last[0] - first[0])
    ttft = watch_rules.metric_value(watch_rules.parse_rule("ttft_p99>2s"), windowed)
    assert ttft is not None and ttft > 2000.0  # 16 clients behind --max-num-seqs 2
    assert watch_rules.metric_value(watch_rules.parse_rule("kv>0.9"), windowed) == 0.0
    # one scrape has no increase: a latency rule is not measured from it (not "0 ms")
    assert watch_rules.metric_value(watch_rules.parse_rule("ttft_p99>2s"), at_start) is None


def test_the_oom_rule_reads_allocator_messages_and_tracebacks_not_prose() -> None:
    assert watch_rules.log_event("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
                                 "(GPU 0; 79.15 GiB total capacity)") == "an out-of-memory message"
    assert watch_rules.log_event("(EngineCore_DP0 pid=12) ERROR 10-02 Traceback (most recent call last):") \
        == "a Python traceback"
    assert watch_rules.log_event("INFO 10-02 12:00:01 [loggers.py:123] Avg prompt throughput: 12.0 tokens/s") is None
    assert watch_rules.log_event("we should talk about memory use at some point") is None


# -- the ring ------------------------------------------------------------------------------------------

def test_the_ring_keeps_its_span_and_only_the_families_diagnose_reads() -> None:
    first, _ = scrapes("admission_cap")
    ring = watch.Ring(span_s=60.0, max_log_bytes=100)
    for i in range(10):
        ring.add_scrape(1000.0 + 10 * i, first[1])
    ring.add_log(1050.0, ["x" * 40, "y" * 40])
    ring.add_log(1090.0, ["z" * 40])  # over 100 bytes: the oldest line goes
    ring.prune(1090.0)
    got, log, _ = ring.snapshot()
    assert [at for at, _ in got] == [1030.0 + 10 * i for i in range(7)]
    assert [line[0] for _, line in log] == ["y", "z"]
    kept = got[0][1]
    assert "vllm:num_requests_waiting{" in kept and len(kept) < len(first[1]) / 2
    assert not any(line.startswith("python_gc") or line.startswith("process_") for line in kept.splitlines())
    # an increase over the last 25 s starts from the last scrape at or before that
    assert [at for at, _ in ring.since(1065.0)] == [1060.0, 1070.0, 1080.0, 1090.0]


def test_the_log_follower_reads_whole_new_lines_and_survives_rotation(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("old line\n")
    f = watch.LogFollower(str(log))
    assert f.read() == []  # from the end when the watch started
    with log.open("a") as fh:
        fh.write("one\ntw")
    assert f.read() == ["one"]
    with log.open("a") as fh:
        fh.write("o\napi_key=sk-abcdefghijklmnopqrstuvwx\n")
    two, secret = f.read()
    assert two == "two" and "sk-abcdefghijklmnopqrstuvwx" not in secret
    log.write_text("rotated\n")  # truncated and rewritten: read again from its start
    assert f.read() == ["rotated"]
    with log.open("a") as fh:
        fh.write("a" * (watch.LOG_READ_MAX + 10) + "\ntail\n")
    assert f.read() == ["tail"]  # more than a tick's worth: its tail, never half a line


# -- triggers ------------------------------------------------------------------------------------------

def _watcher(tmp_path: Path, *rules: str) -> watch.Watcher:
    opts = watch.WatchOptions(pid=os.getpid(), rules=watch_rules.parse_rules(list(rules)), output=str(tmp_path))
    return watch.Watcher(opts, out=lambda line: None, clock=lambda: 2e9)


def test_a_trigger_fires_once_per_incident_and_again_after_it_cleared(tmp_path: Path) -> None:
    w = _watcher(tmp_path, "queue>8")
    first, last = scrapes("admission_cap")  # 14 waiting, then 0
    # (seconds, text): true, true, one dip, true — then false for more than CLEAR_TICKS ticks but less than
    # --clear (a real vLLM queue gauge read 0 for 20-30 s in the middle of one load), true: all one incident;
    # then false for --clear seconds (cleared), and true again: a second incident
    at, ticks = 100.0, []
    for text, n in ((first[1], 2), (last[1], 1), (first[1], 1), (last[1], watch.CLEAR_TICKS + 2), (first[1], 1)):
        for _ in range(n):
            ticks.append((at, text))
            at += 5.0
    quiet = int(watch.CLEAR_S // 5.0) + 1
    ticks += [(at + 5.0 * i, last[1]) for i in range(quiet)]
    again = at + 5.0 * quiet
    ticks.append((again, first[1]))
    assert (watch.CLEAR_TICKS + 2) * 5.0 < watch.CLEAR_S <= (quiet - 1) * 5.0
    for t, text in ticks:
        w.ring.add_scrape(t, text)
        w.evaluate(t)
    fired = [w.fired.get_nowait() for _ in range(w.fired.qsize())]
    assert [(f.rule, f.at, f.value) for f in fired] == [("queue>8", 100.0, 14.0), ("queue>8", again, 14.0)]
    assert w.state.triggers["queue>8"] == 2 and fired[0].detail == "queue 14"


def test_clear_zero_clears_after_clear_ticks_false_ticks(tmp_path: Path) -> None:
    w = _watcher(tmp_path, "queue>8")
    w.opts.clear_s = 0.0
    first, last = scrapes("admission_cap")
    texts = [first[1], *[last[1]] * watch.CLEAR_TICKS, first[1]]
    for i, text in enumerate(texts):
        w.ring.add_scrape(100.0 + 5 * i, text)
        w.evaluate(100.0 + 5 * i)
    assert w.fired.qsize() == 2


def test_a_rule_that_turns_true_while_the_incident_goes_on_is_recorded_in_its_session(tmp_path: Path) -> None:
    """queue>8 captured the incident; the light verdict naming the queue a minute later (after that capture
    was written, the queue still long) is the same incident: recorded in that session, no second capture.
    An OOM in the log meanwhile is captured: a new event, not a reading of the same one."""
    log = tmp_path / "engine.log"
    log.write_text("")
    opts = watch.WatchOptions(pid=os.getpid(), logs=[str(log)], output=str(tmp_path),
                              rules=watch_rules.parse_rules(["queue>8", "bottleneck", "oom"]))
    w = watch.Watcher(opts, out=lambda line: None)
    first, _ = scrapes("admission_cap")
    verdict: list[str | None] = [None]
    w._active = lambda recent: True  # type: ignore[method-assign]
    w.judge_ring = lambda now: verdict[0]  # type: ignore[method-assign]
    w.ring.add_scrape(100.0, first[1])
    w.evaluate(100.0)
    captured = w.fired.get_nowait()
    assert captured.rule == "queue>8" and not captured.joins
    session = tmp_path / "watch-20330518T033320Z-queue-gt-8"
    session.mkdir()
    (session / watch.WATCH_FILE).write_text(json.dumps({"trigger": watch._entry(captured), "also": []}))
    w._last_session, w._incident_rules = str(session), {"queue>8"}  # as capture and _written leave them
    verdict[0] = "queueing"
    w.ring.add_scrape(160.0, first[1])
    w.evaluate(160.0)
    joined = w.fired.get_nowait()
    assert joined.rule == "bottleneck" and joined.joins
    assert w.join(joined) and w.fired.empty() and w._incident_rules == {"queue>8", "bottleneck"}
    also = json.loads((session / watch.WATCH_FILE).read_text())["also"]
    assert [(a["rule"], a["detail"]) for a in also] == [("bottleneck", "the light verdict names queueing (critical)")]
    with log.open("a") as fh:
        fh.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB\n")
    w.tick()
    oom = w.fired.get_nowait()
    assert oom.rule == "oom" and not oom.joins
    shutil.rmtree(session)  # rotated away: the next one is captured as its own
    assert not w.join(watch.Fired("queue>8", 200.0, 9.0, "queue 9", joins=True))
    w._holding.discard("queue>8")  # queue>8 cleared while the bottleneck holds: its return is the same incident
    w.ring.add_scrape(230.0, first[1])
    w.evaluate(230.0)
    assert w.fired.get_nowait().joins


def test_a_trigger_during_a_capture_is_recorded_in_that_session(tmp_path: Path) -> None:
    w = _watcher(tmp_path, "queue>8", "kv>0.5")
    first, _ = scrapes("admission_cap")
    w.capturing = watch.Fired("kv>0.5", 99.0)
    w.ring.add_scrape(100.0, first[1])
    w.evaluate(100.0)
    assert w.fired.empty() and [a["rule"] for a in w._also] == ["queue>8"]


def test_rules_firing_at_the_same_tick_are_one_incident(tmp_path: Path) -> None:
    w = _watcher(tmp_path, "queue>8", "ttft_p99>2s")
    first, last = scrapes("admission_cap")
    w.ring.add_scrape(first[0], first[1])
    w.ring.add_scrape(first[0] + 20.0, first[1])
    w.ring.add_scrape(last[0], last[1].replace("num_requests_waiting{engine=\"0\",model_name=\"lab\"} 0.0",
                                               "num_requests_waiting{engine=\"0\",model_name=\"lab\"} 14.0"))
    w.evaluate(last[0])
    assert w.fired.qsize() == 2  # both hold at this tick
    w.alert(json.loads(ALERT.read_text()))
    head = w.fired.get_nowait()
    same = w._same_incident()
    assert [a["rule"] for a in same] == ["ttft_p99>2s"] and head.rule == "queue>8"
    assert w.fired.get_nowait().rule == "alert"  # a page is its own capture


def test_the_oom_rule_fires_on_the_logs_new_lines(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("")
    opts = watch.WatchOptions(pid=os.getpid(), logs=[str(log)], rules=watch_rules.parse_rules(["oom"]),
                              output=str(tmp_path), clear_s=0.0)  # ticks here follow one another at once
    w = watch.Watcher(opts, out=lambda line: None)
    w.tick()
    assert w.fired.empty()
    with log.open("a") as fh:
        fh.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB\n")
    w.tick()
    fired = w.fired.get_nowait()
    assert fired.rule == "oom" and fired.detail == "the log shows an out-of-memory message"
    for _ in range(watch.CLEAR_TICKS - 1):
        w.tick()  # no new line: not yet cleared
    assert w.fired.empty() and "oom" in w._holding
    w.tick()
    assert "oom" not in w._holding


def test_an_idle_service_is_not_judged(tmp_path: Path) -> None:
    """The light verdict costs a pass of the rule engine: a service whose counters do not move, with
    nothing running or waiting and a quiet log, is not judged at all."""
    w = _watcher(tmp_path, "bottleneck")
    _, last = scrapes("healthy")
    w.ring.add_scrape(100.0, last[1])
    w.ring.add_scrape(105.0, last[1])  # the same totals: nothing happened
    calls: list[float] = []
    w.judge_ring = lambda now: calls.append(now) or "queueing"  # type: ignore[method-assign]
    w.evaluate(105.0)
    assert calls == [] and w.fired.empty()


def test_the_light_verdict_of_a_busy_ring_names_the_bottleneck(tmp_path: Path) -> None:
    first, last = scrapes("admission_cap")
    w = _watcher(tmp_path, "bottleneck")
    w.ring.add_scrape(first[0], first[1])
    w.ring.add_scrape(last[0], last[1])
    assert w.judge_ring(last[0]) == "queueing"


def test_the_ring_samples_the_targets_gpus_through_the_nvml_sampler(tmp_path: Path) -> None:
    """The same sampler as attach's, replaying an NVML recording at the call boundary (a synthetic H100 one
    built to NVML's types: tests/data/nvml/README.md): the target's device, compacted to what the ring keeps."""
    from diagnose.collectors import nvml

    api = nvml.ReplayNvml.from_file(str(DATA / "nvml" / "saturated_h100.jsonl"))
    w = _watcher(tmp_path, "oom")
    api.init()
    w._nvml, w._nvml_col = api, nvml.Collector(int(api.meta["pid"]))
    w._sample(100.0)
    _, _, samples = w.ring.snapshot()
    (gpu,) = samples[-1]["gpus"]
    assert set(gpu) == set(watch.GPU_KEYS) and gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["util_gpu_pct"] == 97 and gpu["mem_used_bytes"] == 76772540416
    assert samples[-1]["threads"] >= 1  # the process sample is there too


def test_without_a_driver_the_ring_goes_on_without_gpu_samples(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from diagnose.collectors import nvml

    class NoDriver(nvml.ReplayNvml):
        def init(self) -> None:
            raise nvml.NvmlCallError("LibraryNotFound", 12, "NVML Shared Library Not Found")

    w = _watcher(tmp_path, "oom")
    w._nvml = NoDriver([])
    w._sample(100.0)
    w._sample(105.0)
    _, _, samples = w.ring.snapshot()
    assert len(samples) == 2 and all("gpus" not in s for s in samples)
    said = capsys.readouterr().err
    assert said.count("no GPU samples in the ring") == 1 and "driver" in said.lower()


# -- what a session keeps ------------------------------------------------------------------------------

def test_the_ring_before_the_trigger_is_summarised_from_real_scrapes() -> None:
    first, last = scrapes("admission_cap")
    before = watch.before_summary([(first[0], last[1]), (last[0], first[1])], last[0])
    assert before["waiting"]["text"] == f"queue depth rose from 0 to 14 over the {last[0] - first[0]:.0f} s before"
    assert "text" not in before["kv_usage"]  # nothing rose: nothing said


def test_a_watch_session_carries_the_trigger_and_the_ring_into_its_evidence(tmp_path: Path) -> None:
    first, last = scrapes("admission_cap")
    folder = tmp_path / "watch-x"
    folder.mkdir()
    fired = watch.Fired("queue>8", last[0], 14.0, "queue 14")
    window = Window(first[0], last[0])
    cap = watch.write_ring(str(folder), ([(first[0], last[1]), (last[0], first[1])], [], []), fired, [], window)
    session = Session(path=str(folder), target=Target(pid=1, cmdline=(), python="", user=""), window=window,
                      captures=(cap,))
    write_json_atomic(str(folder / pipeline.MANIFEST), session.manifest())
    d = pipeline.analyze([str(folder)])
    ev = {e.key: e for e in d.evidence}
    assert ev["watch.trigger"].value == 14.0 and "queue>8 fired" in ev["watch.trigger"].detail
    assert ev["watch.before.waiting_rise"].value == 14.0
    assert "queue depth rose from 0 to 14" in ev["watch.before.waiting_rise"].detail
    assert "serving.waiting_last" in ev and "latency.ttft_ms.p99" in ev  # the ring's scrapes, read as metrics
    assert cap.status is CaptureStatus.OK and cap.notes and cap.notes[0].startswith("queue depth rose")
    # every report says what fired and what rose before it
    from diagnose.reports import html, markdown

    md = markdown.render(d)
    assert "## Before the trigger (diagnose watch)" in md and "- Trigger: queue\\>8 fired: queue 14." in md
    assert "Before it, queue depth rose from 0 to 14 over the" in md
    assert 'id="watch-before"' in html.verdict_html(d)


def test_a_recorded_watch_session_on_vllm_is_judged_from_the_window_and_the_ring() -> None:
    d = pipeline.analyze([str(RECORDED)])
    assert d.primary is not None and d.primary.value == "queueing"
    ev = {e.key: e for e in d.evidence}
    assert ev["watch.trigger"].detail == "queue>4 fired: queue 14"
    assert ev["watch.before.waiting_rise"].value == 14.0
    assert {c.collector for c in d.captures} >= {"py-spy", "metrics", "log", "watch"}


OOM_HELP = ("# HELP app_oom_total Requests that failed with torch.OutOfMemoryError: CUDA out of memory. Tried to "
            "allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.20 GiB is free.\n"
            "# TYPE app_oom_total counter\napp_oom_total 3\n")


@pytest.mark.parametrize("where", ["metrics-0.prom", "watch-ring.prom", "log-0-vllm.log"])
def test_a_sessions_scrapes_are_read_as_prometheus_text_and_its_logs_by_every_reader(
        tmp_path: Path, where: str) -> None:
    """The OOM message an application's metric HELP quotes is no OOM in the window's scrape nor in the ring's;
    the same text in the service's log is one."""
    folder = tmp_path / "s"
    shutil.copytree(RECORDED, folder)
    with (folder / where).open("a", encoding="utf-8") as fh:
        fh.write(OOM_HELP)
    d = pipeline.analyze([str(folder)])
    assert ("mem.oom_count" in {e.key for e in d.evidence}) is where.endswith(".log")


@pytest.mark.parametrize("in_log", [False, True])
def test_the_light_verdict_reads_the_rings_scrapes_as_prometheus_text(tmp_path: Path, in_log: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The light verdict's ring scrapes are diagnose's own, read by the exposition readers alone, as a session's:
    an OOM message a metric's HELP quotes is no OOM there; the same text in the service's log is one."""
    first, last = scrapes("healthy")
    w = _watcher(tmp_path, "bottleneck")
    help_ = OOM_HELP.splitlines()[0].replace("app_oom_total", "vllm:num_requests_waiting")  # a family the ring keeps
    w.ring.add_scrape(first[0], f"{help_}\n{first[1]}")
    w.ring.add_scrape(last[0], f"{help_}\n{last[1]}")
    assert help_ in w.ring.snapshot()[0][-1][1]
    if in_log:
        w.ring.add_log(last[0], [help_.split(" ", 3)[3]])
    seen: list[list[str]] = []
    analyze = pipeline.analyze

    def spy(paths: list[str], **kw: object) -> object:
        d = analyze(paths, **kw)  # type: ignore[arg-type]
        seen.append([e.key for e in d.evidence if e.key == "mem.oom_count"])
        return d

    monkeypatch.setattr(pipeline, "analyze", spy)
    w.judge_ring(last[0])
    assert seen == [["mem.oom_count"] if in_log else []]


def test_a_target_that_exits_leaves_a_session_of_its_ring(tmp_path: Path) -> None:
    """No window can be taken of a process that is gone (an OOM kill, a crash): the session is the ring,
    judged like any other, and the watch stops."""
    first, last = scrapes("admission_cap")
    lines: list[str] = []
    w = watch.Watcher(watch.WatchOptions(pid=os.getpid(), rules=watch_rules.parse_rules(["oom"]),
                                         output=str(tmp_path)), out=lines.append, clock=lambda: last[0] + 1.0)
    w.ring.add_scrape(first[0], first[1])
    w.ring.add_scrape(last[0], last[1])
    w.ring.add_log(last[0], ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"])
    folder = Path(w.capture_gone(watch.Fired("exited", last[0] + 1.0, None, "the target process exited")))
    assert folder.name.endswith("-exited") and (folder / "watch-ring.log").exists()
    assert not [f for f in os.listdir(folder) if f.startswith(".tmp-")]  # diagnosis.json renamed into place
    d = json.loads((folder / "diagnosis.json").read_text())
    assert {c["collector"] for c in d["captures"]} == {"watch"}
    assert {"watch.trigger", "latency.ttft_ms.p99"} <= {e["key"] for e in d["evidence"]}
    assert lines and lines[0].split(": ", 1)[0].endswith("exited") and str(folder) in lines[0]


def test_rotation_keeps_the_newest_sessions(tmp_path: Path) -> None:
    w = _watcher(tmp_path, "oom")
    w.opts.max_sessions = 2
    for stamp in ("20261202T100000Z", "20261202T110000Z", "20261202T120000Z"):
        (tmp_path / f"watch-{stamp}-oom").mkdir()
        (tmp_path / f"watch-{stamp}-oom" / watch.WATCH_FILE).write_text("{}")
    (tmp_path / "watch-notes").mkdir()  # not a session of ours: left alone
    w.rotate()
    assert sorted(os.listdir(tmp_path)) == ["watch-20261202T110000Z-oom", "watch-20261202T120000Z-oom",
                                           "watch-notes"]


def test_a_capture_that_cannot_attach_says_why_and_writes_nothing(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    w = _watcher(tmp_path, "oom")
    w.opts.pid = 2**22 + 7  # the target is gone by the time the capture starts
    assert w.capture(watch.Fired("oom", 2e9)) is None
    assert "the capture for oom failed" in capsys.readouterr().err and os.listdir(tmp_path) == []



def test_only_a_process_that_is_gone_ends_the_watch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A read of the target refused (AccessDenied) is said once and the ring goes on; only a process that no
    longer exists (or a zombie) counts as exited, which ends the watch with a session from the ring."""
    import contextlib

    import psutil

    class Refusing:
        def __init__(self, exc: Exception) -> None:
            self.exc, self.pid = exc, os.getpid()

        def oneshot(self) -> contextlib.AbstractContextManager[None]:
            return contextlib.nullcontext()

        def status(self) -> str:
            raise self.exc

    w = _watcher(tmp_path, "oom")
    w.tick()
    assert w.reading_ok
    w._proc = Refusing(psutil.AccessDenied(os.getpid()))
    w.tick()
    w.tick()
    assert not w.gone and not w.reading_ok  # diagnose_up reads 0 while the target cannot be read
    assert capsys.readouterr().err.count("could not read pid") == 1
    for gone in (psutil.NoSuchProcess(os.getpid()), psutil.ZombieProcess(os.getpid())):
        w.gone = False
        w._proc = Refusing(gone)
        assert not w._sample(3.0) and w.gone


def test_a_capture_that_fails_unexpectedly_says_where_and_the_watch_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A defect of diagnose's own in one capture (not a known cause: the target gone, a file unwritable) is
    said with its traceback, nothing half-written is left, and the watcher goes on to the next trigger."""
    from diagnose import attach

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("no-such-column token=s3cr3t-value")

    monkeypatch.setattr(attach, "attach", broken)
    w = _watcher(tmp_path, "oom")
    assert w.capture(watch.Fired("oom", 2e9)) is None
    err = capsys.readouterr().err
    assert "the capture for oom failed unexpectedly (KeyError" in err and "the watch goes on" in err
    assert "Traceback" in err and "in broken" in err and "s3cr3t" not in err  # where, and redacted
    assert os.listdir(tmp_path) == []

    seen: list[str] = []

    def capture(fired: watch.Fired) -> None:  # the main loop: a capture that raises, then one that stops it
        seen.append(fired.rule)
        if len(seen) == 2:
            w.stop.set()
        raise RuntimeError(f"bug in capture {len(seen)}")

    monkeypatch.setattr(w, "capture", capture)
    monkeypatch.setattr(w, "tick", lambda: None)
    w.fired.put(watch.Fired("oom", 2e9))
    w.fired.put(watch.Fired("queue>4", 2e9))
    assert w.run() == 0
    assert seen == ["oom", "queue>4"]
    err = capsys.readouterr().err
    assert "bug in capture 1" in err and "bug in capture 2" in err


def test_a_capture_that_fails_after_its_window_leaves_no_session_and_no_incident(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Writing the session can fail too, after the window (a diagnosis that will not serialise): the folder is
    removed, not left as a session with a half-written diagnosis.json, the incident is forgotten (what fires
    next is captured, not joined to an older session) and the rules that fired during it are named."""
    from diagnose import attach

    w = _watcher(tmp_path, "oom", "queue>4")

    def window(opts: attach.AttachOptions, *args: object, **kwargs: object) -> tuple[None, object]:
        assert opts.output is not None
        os.makedirs(opts.output)
        Path(opts.output, "manifest.json").write_text("{}")
        w._queue(watch.Fired("queue>4", 2e9, 9.0, "queue>4 9"))  # fires while the window runs
        return None, object()

    def unwritable(folder: str, diagnosis: object) -> None:
        raise TypeError("Object of type Decimal is not JSON serializable")

    monkeypatch.setattr(attach, "attach", window)
    monkeypatch.setattr(w, "_write_diagnosis", unwritable)
    w._last_session = str(tmp_path / "watch-20261202T100000Z-oom")  # an older incident's session, gone since
    assert w.capture(watch.Fired("oom", 2e9)) is None
    err = capsys.readouterr().err
    assert "failed unexpectedly (TypeError" in err and "queue>4 fired during that capture" in err
    assert os.listdir(tmp_path) == [] and w._incident_rules == set() and w.capturing is None
    assert w._last_session == ""  # a rule queued to join this incident is captured, not joined to the older

    # once diagnosis.json is whole the session stands, even when saying so fails (stdout closed)
    monkeypatch.setattr(w, "_write_diagnosis", lambda folder, d: Path(folder, "diagnosis.json").write_text("{}"))
    monkeypatch.setattr(watch, "verdict_line", lambda d: "queueing")
    monkeypatch.setattr(w, "out", lambda line: (_ for _ in ()).throw(BrokenPipeError(32, "Broken pipe")))
    with pytest.raises(BrokenPipeError):  # the main loop says it and goes on
        w.capture(watch.Fired("oom", 2e9 + 60))
    kept = [p for p in os.listdir(tmp_path) if (tmp_path / p / "diagnosis.json").exists()]
    assert len(kept) == 1 and w._last_session == str(tmp_path / kept[0])
    shutil.rmtree(tmp_path / kept[0])

    monkeypatch.setattr(pipeline, "analyze", lambda *a, **k: (_ for _ in ()).throw(ValueError("bad ring")))
    with pytest.raises(ValueError, match="bad ring"):  # the main loop says it and stops (the target is gone)
        w.capture_gone(watch.Fired("exited", 2e9))
    assert os.listdir(tmp_path) == []

# -- the HTTP side -------------------------------------------------------------------------------------

def test_a_real_alertmanager_payload_is_accepted_with_its_labels() -> None:
    doc, firing = watch_http.check_alert(ALERT.read_bytes())
    assert firing
    labels = watch_http.alert_labels(doc)
    assert labels["alertname"] == "ProbeFailure" and labels["severity"] == "critical"
    resolved = json.loads(ALERT.read_text())
    resolved["status"] = "resolved"
    for a in resolved["alerts"]:
        a["status"] = "resolved"
    assert watch_http.check_alert(json.dumps(resolved).encode())[1] is False


@pytest.mark.parametrize(("body", "says"), [
    (b"not json", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (b'{"status": "firing"}', "no 'alerts' list"),
    (b'{"alerts": []}', "no 'alerts' list"),
    (b'{"alerts": [{"labels": "x"}]}', "'labels' is not an object"),
])
def test_a_bad_alert_payload_gets_one_sentence(body: bytes, says: str) -> None:
    with pytest.raises(watch_http.BadAlert) as err:
        watch_http.check_alert(body)
    assert says in str(err.value) and str(err.value).count(".") <= 2


@pytest.mark.parametrize(("text", "expected"), [
    ("9464", ("127.0.0.1", 9464)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9464", ("::1", 9464)),
    ("0.0.0.0:9464", ("0.0.0.0", 9464)),
])
def test_listen_addresses_default_to_loopback(text: str, expected: tuple[str, int]) -> None:
    assert watch_http.parse_listen(text) == expected
    assert watch_http.is_loopback(expected[0]) is (expected[0] != "0.0.0.0")


@pytest.mark.parametrize("text", ["localhost:x", "host:9464", "127.0.0.1:70000"])
def test_a_bad_listen_address_is_refused(text: str) -> None:
    with pytest.raises(InputError):
        watch_http.parse_listen(text)


def test_the_exposition_says_up_triggers_and_the_bottleneck(tmp_path: Path) -> None:
    w = _watcher(tmp_path, "queue>8", "bottleneck")
    with w.state.lock:
        w.state.triggers["queue>8"] += 2
        w.state.triggers["alert"] += 1
        w.state.bottleneck = "queueing"
        w.state.last_session_at = 1.8e9
    registry = CollectorRegistry(auto_describe=False)
    registry.register(watch_http._StateCollector(w))
    from prometheus_client.exposition import generate_latest

    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert families["diagnose_up"].samples[0].value == 1.0
    triggers = {s.labels["rule"]: s.value for s in families["diagnose_triggers"].samples if s.name.endswith("_total")}
    assert triggers == {"queue>8": 2.0, "bottleneck": 0.0, "alert": 1.0}
    bottleneck = {s.labels["category"]: s.value for s in families["diagnose_bottleneck"].samples}
    assert bottleneck["queueing"] == 1.0 and sum(bottleneck.values()) == 1.0 and len(bottleneck) >= 13
    assert families["diagnose_last_session_timestamp_seconds"].samples[0].value == 1.8e9


# -- what the review of the first version found -----------------------------------------------------------

@pytest.mark.parametrize("text", ["queue>1e999", "kv>nan"])
def test_a_threshold_that_is_not_a_number_is_refused(text: str) -> None:
    with pytest.raises(InputError):
        watch_rules.parse_rule(text)


def test_units_read_in_any_case() -> None:
    assert watch_rules.parse_rule("TTFT_P99>2S").threshold == 2000.0


def test_an_unmeasured_value_neither_fires_nor_clears(tmp_path: Path) -> None:
    """A stall where nothing completes leaves the latency histogram without an increase: that is not
    'below the threshold', so an incident under way does not clear and fire again."""
    w = _watcher(tmp_path, "ttft_p99>2s")
    first, last = scrapes("admission_cap")
    w.ring.add_scrape(first[0], first[1])
    w.ring.add_scrape(last[0], last[1])
    w.evaluate(last[0])
    assert w.fired.qsize() == 1 and "ttft_p99>2s" in w._holding
    for i in range(1, 2 * watch.CLEAR_TICKS):  # the same totals again: no request completed
        w.ring.add_scrape(last[0] + 40.0 * i, last[1])
        w.evaluate(last[0] + 40.0 * i)
    assert "ttft_p99>2s" in w._holding and w.fired.qsize() == 1


def test_the_log_follower_bounds_a_line_without_end_and_keeps_a_line_that_starts_the_tail(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("")
    f = watch.LogFollower(str(log))
    with log.open("a") as fh:
        for _ in range(4):
            fh.write("\r" + "#" * 50_000)  # a progress bar redrawn, no newline
            fh.flush()
            f.read()
    assert len(f._partial) <= watch.PARTIAL_MAX
    with log.open("a") as fh:
        fh.write("\n")
    f.read()
    burst = "x" * (watch.LOG_READ_MAX - 60) + "\n"  # the tail read next begins exactly at a line
    oom_line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n"
    with log.open("a") as fh:
        fh.write("y" * 200 + "\n" + burst[: -len(oom_line)] + "\n")
        start = log.stat().st_size
        fh.write(oom_line + "z" * (watch.LOG_READ_MAX - len(oom_line) - 1) + "\n")
    assert log.stat().st_size - start == watch.LOG_READ_MAX
    got = f.read()
    assert got[0].startswith("torch.OutOfMemoryError")


def test_alert_labels_are_redacted_and_bounded_and_repeats_of_a_group_are_one_capture(tmp_path: Path) -> None:
    w = _watcher(tmp_path, "oom")
    payload = json.loads(ALERT.read_text())
    payload["status"] = {"not": "a status"}
    payload["alerts"] = payload["alerts"] * 80
    payload["alerts"][0] = {**payload["alerts"][0], "labels": {"password": "hunter2", "url": "https://u:pw@h/?token="
                                                                "sk-abcdefghijklmnopqrstuvwx"}}
    assert w.alert(payload) == "capturing."
    record = w.fired.get_nowait().alert
    assert record is not None and record["status"] == "" and len(record["alerts"]) == 50
    text = json.dumps(record)
    assert "hunter2" not in text and "sk-abcdefghijklmnopqrstuvwx" not in text and "u:pw@" not in text
    assert w.alert(payload).startswith("this alert group was captured already") and w.fired.empty()
    assert w.alert(payload, firing=False).startswith("resolved")
    assert w.alert(payload) == "capturing."  # the group fires again after it resolved
    assert w.state.triggers["alert"] == 2


def test_an_alert_during_a_capture_is_recorded_in_it(tmp_path: Path) -> None:
    w = _watcher(tmp_path, "oom")
    w.capturing = watch.Fired("queue>8", 1.0)
    w.alert(json.loads(ALERT.read_text()))
    assert w.fired.empty() and w._also[0]["alert"]["labels"]["alertname"] == "ProbeFailure"


def test_an_endpoint_that_answers_garbage_does_not_stop_the_rest_of_the_tick(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def answer() -> None:
        for _ in range(2):
            conn, _ = srv.accept()
            conn.recv(1024)
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    log = tmp_path / "engine.log"
    log.write_text("")
    opts = watch.WatchOptions(pid=os.getpid(), logs=[str(log)], metrics=[f"http://127.0.0.1:{srv.getsockname()[1]}/"],
                              rules=watch_rules.parse_rules(["oom"]), output=str(tmp_path))
    w = watch.Watcher(opts, out=lambda line: None)
    with log.open("a") as fh:
        fh.write("Traceback (most recent call last):\n")
    w.tick()
    w.tick()
    srv.close()
    assert w.fired.get_nowait().rule == "oom"  # the log was read although the scrape failed
    _, log_lines, samples = w.ring.snapshot()
    assert log_lines and len(samples) == 2 and not w.reading_ok
    assert capsys.readouterr().err.count("could not scrape") == 1  # said once while it stays the same


def test_rules_that_cannot_fire_are_refused_when_asked_and_dropped_when_default(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def opts(rules: list[str] | None, **kw: object) -> watch.WatchOptions:
        return watch.WatchOptions(pid=os.getpid(), rules=watch_rules.parse_rules(rules), output=str(tmp_path),
                                  **kw)  # type: ignore[arg-type]

    with pytest.raises(InputError, match="can never fire"):
        watch.check_options(opts(["queue>8"]), explicit_rules=True)
    with pytest.raises(InputError, match="nothing to watch"):
        watch.check_options(opts(None), explicit_rules=False)
    only_metrics = opts(None, metrics=["http://127.0.0.1:8000/metrics"])
    watch.check_options(only_metrics, explicit_rules=False)
    assert [r.text for r in only_metrics.rules] == ["bottleneck"] and "oom is off" in capsys.readouterr().err
    for bad in ({"interval_s": float("nan")}, {"ring_s": float("inf")}, {"window_s": 700.0}, {"rate_hz": 0},
                {"clear_s": -1.0}, {"clear_s": float("nan")}, {"metrics": ["127.0.0.1:8000/metrics"]}):
        with pytest.raises(InputError):
            watch.check_options(opts(["bottleneck"], **{"metrics": ["http://x/metrics"], **bad}))


def test_the_http_side_refuses_a_negative_length_and_answers_a_real_payload(tmp_path: Path) -> None:
    import http.client

    w = _watcher(tmp_path, "oom")
    server = watch_http.serve("127.0.0.1:0", w)
    port = server.server_address[1]
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.putrequest("POST", "/alert")
        conn.putheader("Content-Length", "-1")
        conn.endheaders()
        resp = conn.getresponse()
        assert resp.status == 400 and b"negative" in resp.read()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", "/alert", body=ALERT.read_bytes(), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 202 and resp.read() == b"capturing.\n" and w.fired.qsize() == 1
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        assert resp.status == 200 and b'diagnose_triggers_total{rule="alert"} 1.0' in resp.read()
    finally:
        server.shutdown()
        server.server_close()
