"""``diagnose watch``: a cheap rolling record of a service, and a diagnosed session when trouble starts.

The watcher keeps a ring (``Ring``, default the last 5 minutes) of cheap evidence — the engine's
``/metrics`` every ``--interval`` seconds (only the lines of the families ``diagnose.collectors.prom``
knows), the new lines of each ``--log``, and one sample of the process (CPU seconds, resident memory,
threads) and of its GPUs (NVML, where a driver answers: utilisation, memory, clocks, power) per tick —
and evaluates its trigger rules (``diagnose.watch_rules``) at every tick. When a
rule turns true it runs a full attach window (py-spy included, ``--window`` seconds) into
``DIR/watch-<UTC time>-<rule>/``; the session also holds the ring from before the trigger
(``watch-ring.prom``, ``watch-ring.log``, ``watch-process.jsonl``) and ``watch.json`` (the rule, its
value, what rose over the ring, an alert's labels), so its analysis has both. A rule that stays true
writes no second session until it has cleared — false for ``--clear`` seconds (default ``CLEAR_S``) and at
``CLEAR_TICKS`` ticks in a row, as Prometheus's ``keep_firing_for`` keeps an alert: an engine's queue gauge
flaps (vLLM's read 0 waiting for 20-30 s in the middle of a steady admission-cap load while a capture ran),
and a gauge that dips is still the same incident (one session per incident); a rule that turns true
while a capture runs, or while a rule the newest session recorded has not cleared (the incident goes on: a
light verdict that names the queue after ``queue>N`` already captured it), is recorded in that session's
``watch.json``; ``oom`` and Alertmanager pages are always captured. ``--max-sessions``
keeps the newest N sessions.

Idle costs little: a tick is one scrape, a ``stat`` of each log and one ``/proc`` read of the target;
the rule engine (``bottleneck``) runs at most every ``JUDGE_EVERY_S`` and only while the service does
something (its request counters move, requests run or wait, its log grows). ``benchmarks/watch_idle.py``
measures it. ``--listen`` serves ``/metrics`` and ``POST /alert`` on loopback (``diagnose.watch_http``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import math
import os
import queue
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import FrameType
from typing import Any

import psutil

from diagnose.collectors import nvml as nvml_collector
from diagnose.collectors.prom import lookup
from diagnose.config import Config
from diagnose.errors import DiagnoseError, InputError
from diagnose.model import (
    RING_LOG,
    RING_METRICS,
    RING_PROCESS,
    WATCH_FILE,
    Capture,
    CaptureStatus,
    Diagnosis,
    Severity,
    Window,
)
from diagnose.redact import redact_text
from diagnose.sources import scrape, write_json_atomic, write_text_atomic
from diagnose.watch_rules import METRIC_RULES, SPAN_S, Rule, log_event, metric_value, reading

RING_S = 300.0
INTERVAL_S = 5.0
WINDOW_S = 20.0
CLEAR_TICKS = 3  # a rule that fired fires again only after it was false at this many ticks in a row
CLEAR_S = 60.0  # ... and for this many seconds (--clear)
JUDGE_EVERY_S = 15.0  # the light verdict, at most this often, and only while the service is active
LOG_READ_MAX = 1 << 20  # bytes of a log read per tick at most (a log that grows faster: its tail)
PARTIAL_MAX = 64 << 10  # a line longer than this (no newline: a progress bar, binary) is cut here
RING_SCRAPES_MAX = 32 << 20  # bytes of kept scrape lines the ring holds at most, whatever --ring says
FIRED_MAX = 16  # captures waiting their turn at most (an alert flood is not a backlog of sessions)
RING_LOG_MAX = 4 << 20  # bytes of log lines the ring keeps at most
SCRAPE_TIMEOUT_S = 3.0
COLLECTOR = "watch"
# what the ring keeps of each of the target's GPUs per tick (NVML, where a driver answers)
GPU_KEYS = ("index", "name", "util_gpu_pct", "util_mem_pct", "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz",
            "power_mw", "temp_c", "reasons")


def slug(rule_text: str) -> str:
    """A rule's text as a folder name's part: ``ttft_p99>2s`` → ``ttft_p99-gt-2s``."""
    return re.sub(r"[^A-Za-z0-9_.]+", "-", rule_text.replace(">=", "-ge-").replace(">", "-gt-")).strip("-")


def known_lines(text: str) -> str:
    """The lines of an exposition that belong to families diagnose reads (the ring keeps only these)."""
    keep = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            if line.startswith(("# HELP ", "# TYPE ")) and lookup(line.split()[2]) is not None:
                keep.append(line)
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if lookup(name) is not None:
            keep.append(line)
    return "\n".join(keep)


class Ring:
    """The last ``span_s`` seconds of scrapes, log lines and process samples (thread-safe, bounded)."""

    def __init__(self, span_s: float = RING_S, max_log_bytes: int = RING_LOG_MAX) -> None:
        self.span_s = span_s
        self.max_log_bytes = max_log_bytes
        self.scrapes: deque[tuple[float, str]] = deque()
        self._scrape_bytes = 0
        self.log: deque[tuple[float, str]] = deque()
        self.samples: deque[dict[str, Any]] = deque()
        self._log_bytes = 0
        self._lock = threading.Lock()

    def add_scrape(self, at: float, text: str) -> None:
        kept = known_lines(text)
        with self._lock:
            self.scrapes.append((at, kept))
            self._scrape_bytes += len(kept)
            while self._scrape_bytes > RING_SCRAPES_MAX and len(self.scrapes) > 2:
                self._scrape_bytes -= len(self.scrapes.popleft()[1])

    def add_log(self, at: float, lines: Iterable[str]) -> None:
        with self._lock:
            for line in lines:
                self.log.append((at, line))
                self._log_bytes += len(line)
            while self._log_bytes > self.max_log_bytes and self.log:
                self._log_bytes -= len(self.log.popleft()[1])

    def add_sample(self, sample: dict[str, Any]) -> None:
        with self._lock:
            self.samples.append(sample)

    def prune(self, now: float) -> None:
        cut = now - self.span_s
        with self._lock:
            while self.scrapes and self.scrapes[0][0] < cut:
                self._scrape_bytes -= len(self.scrapes.popleft()[1])
            while self.log and self.log[0][0] < cut:
                self._log_bytes -= len(self.log.popleft()[1])
            while self.samples and self.samples[0]["t"] < cut:
                self.samples.popleft()

    def since(self, t: float) -> list[tuple[float, str]]:
        """The scrapes from the last one at or before ``t`` to the newest (an increase over ``t``..now)."""
        with self._lock:
            got = list(self.scrapes)
        first = max((i for i, (at, _) in enumerate(got) if at <= t), default=0)
        return got[first:]

    def last_log_at(self) -> float | None:
        """When the newest log line kept arrived (None: none kept)."""
        with self._lock:
            return self.log[-1][0] if self.log else None

    def snapshot(self) -> tuple[list[tuple[float, str]], list[tuple[float, str]], list[dict[str, Any]]]:
        with self._lock:
            return list(self.scrapes), list(self.log), list(self.samples)


class LogFollower:
    """New whole lines of a log since the last read, from its end when the watch started; a log that
    was truncated or replaced (rotation) is read again from its start."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = os.path.getsize(path)
        self._ino = os.stat(path).st_ino
        self._partial = b""

    def read(self) -> list[str]:
        try:
            st = os.stat(self.path)
        except OSError:
            return []
        if st.st_ino != self._ino or st.st_size < self.offset:
            self._ino, self.offset, self._partial = st.st_ino, 0, b""
        if st.st_size == self.offset:
            return []
        start = max(self.offset, st.st_size - LOG_READ_MAX)
        skipped = start > self.offset  # more than a tick's worth was written: only its tail is read
        with open(self.path, "rb") as fh:
            if skipped:  # whether the tail begins a line: the byte before it is a newline
                fh.seek(start - 1)
                skipped = fh.read(1) != b"\n"
            fh.seek(start)
            data = fh.read(st.st_size - start)
        self.offset = start + len(data)
        *whole, rest = data.split(b"\n")
        if skipped:
            whole = whole[1:]  # the first line read is the end of one not read
        elif whole:
            whole[0] = self._partial + whole[0]
        self._partial = (rest if (whole or skipped) else self._partial + rest)[:PARTIAL_MAX]
        return [redact_text(b.decode("utf-8", errors="replace")) for b in whole]


@dataclass
class Fired:
    """A trigger that fired: which rule, when, the value or event that made it true."""

    rule: str
    at: float
    value: float | None = None
    detail: str = ""
    alert: dict[str, Any] | None = None  # an Alertmanager payload's status and labels (``POST /alert``)
    joins: bool = False  # part of the incident the newest session captured, which goes on: recorded there

    @property
    def slug(self) -> str:
        """For the session folder's name: ``queue-gt-8``, ``oom``, ``alert``."""
        return slug(self.rule)


@dataclass
class WatchOptions:
    pid: int
    logs: list[str] = field(default_factory=list)
    metrics: list[str] = field(default_factory=list)
    rules: tuple[Rule, ...] = ()
    output: str = "."
    max_sessions: int = 20
    window_s: float = WINDOW_S
    ring_s: float = RING_S
    interval_s: float = INTERVAL_S
    judge_every_s: float = JUDGE_EVERY_S
    clear_s: float = CLEAR_S
    config: Config = field(default_factory=Config)
    rate_hz: int = 50


@dataclass
class State:
    """What ``/metrics`` reports (``diagnose.watch_http``); read and written under ``lock``."""

    up: bool = True
    triggers: Counter[str] = field(default_factory=Counter)
    bottleneck: str | None = None  # the light verdict's critical category, while it holds
    last_session_at: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


def before_summary(scrapes: Sequence[tuple[float, str]], fired_at: float) -> dict[str, Any]:
    """What rose over the ring before the trigger, per series the rules read: the lowest value and when,
    the value at the trigger, e.g. ``queue depth rose from 0 to 14 over the 90 s before``."""
    out: dict[str, Any] = {"ring_s": round(fired_at - scrapes[0][0], 1) if scrapes else 0.0,
                           "scrapes": len(scrapes)}
    # (what it is, its unit, the scale to it, the least rise worth a sentence)
    names = {"waiting": ("queue depth", "requests", 1.0, 1.0), "kv_usage": ("KV-cache usage", "%", 100.0, 5.0),
             "running": ("requests running", "requests", 1.0, 1.0)}
    for canonical, (label, unit, scale, least) in names.items():
        series: list[tuple[float, float]] = []
        for at, text in scrapes:
            r = reading([(at, text)])
            values = r.gauges.get(canonical) if r else None
            if values:
                series.append((at, values[-1] * scale))
        if len(series) < 2:
            continue
        last_at, last = series[-1]
        low = min(v for _, v in series)
        low_at = max(at for at, v in series if v == low)
        entry = {"from": round(low, 3), "to": round(last, 3), "over_s": round(last_at - low_at, 1), "unit": unit}
        if last - low >= least:
            shown = (f"{low:.0f} %", f"{last:.0f} %") if unit == "%" else (f"{low:g}", f"{last:g}")
            entry["text"] = f"{label} rose from {shown[0]} to {shown[1]} over the {last_at - low_at:.0f} s before"
        out[canonical] = entry
    return out


class RingSource:
    """The ring before the trigger, into the session (a ``Source`` of ``diagnose.sources``): written when
    the window's captures are, so the session's analysis reads it with the window's evidence."""

    collector = COLLECTOR

    def __init__(self, folder: str, ring: Ring, fired: Fired, also: Callable[[], list[dict[str, Any]]]) -> None:
        self.folder = folder
        self.snapshot = ring.snapshot()  # taken when the trigger fired: the ring from before it
        self.fired = fired
        self.also = also

    def start(self) -> None:
        """Nothing: the ring was taken when the trigger fired."""

    def stop(self, by: float) -> None:
        """Nothing: the ring is written with the captures."""

    def capture(self, window: Window, cut: str) -> Capture:
        return write_ring(self.folder, self.snapshot, self.fired, self.also(), window)


def write_ring(folder: str, snapshot: tuple[list[tuple[float, str]], list[tuple[float, str]], list[dict[str, Any]]],
               fired: Fired, also: list[dict[str, Any]], window: Window | None) -> Capture:
    scrapes, log, samples = snapshot
    files = [WATCH_FILE]
    if scrapes:
        with open(os.path.join(folder, RING_METRICS), "w", encoding="utf-8") as fh:
            fh.writelines(f"# scrape at {at:.3f}\n{text}\n" for at, text in scrapes)
        files.append(RING_METRICS)
    if log:
        with open(os.path.join(folder, RING_LOG), "w", encoding="utf-8") as fh:
            fh.writelines(f"{line}\n" for _, line in log)
        files.append(RING_LOG)
    if samples:
        with open(os.path.join(folder, RING_PROCESS), "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(s) + "\n" for s in samples)
        files.append(RING_PROCESS)
    doc: dict[str, Any] = {"trigger": {"rule": fired.rule, "at": fired.at, "value": fired.value,
                                       "detail": fired.detail},
                           "before": before_summary(scrapes, fired.at), "also": also}
    if fired.alert is not None:
        doc["alert"] = fired.alert
    write_json_atomic(os.path.join(folder, WATCH_FILE), doc)
    return Capture(COLLECTOR, CaptureStatus.OK, "", "", window, tuple(files),
                   notes=tuple(e["text"] for e in doc["before"].values() if isinstance(e, dict) and "text" in e))


def _entry(fired: Fired) -> dict[str, Any]:
    entry: dict[str, Any] = {"rule": fired.rule, "at": fired.at, "value": fired.value, "detail": fired.detail}
    if fired.alert is not None:
        entry["alert"] = fired.alert
    return entry


def verdict_line(diagnosis: Diagnosis) -> str:
    """One line for a session: the primary with its probability, else undetermined with the answer withheld
    (its probability) and, when another candidate outranks it, what the differential leads with."""
    p = f", p {diagnosis.probability:.2f}" if diagnosis.probability is not None else ""
    first = next((f for f in diagnosis.findings if f.category is not None), None)
    if diagnosis.primary is not None and first is not None:
        return f"{diagnosis.primary.value} ({first.severity.value}{p}) — {first.title}"
    if diagnosis.leading is not None:
        top = diagnosis.candidates[0] if diagnosis.candidates else None
        leads = ("" if top is None or top.category == diagnosis.leading.value
                 else f"; the differential leads with {top.category}, p {top.probability:.2f}")
        return f"undetermined (withheld: {diagnosis.leading.value}{p}{leads})"
    verdict = diagnosis.verdict.value if diagnosis.verdict is not None else "undetermined"
    return f"{verdict}{p}"


class Watcher:
    """The ring thread (``tick`` every ``interval_s``), the trigger state, and the captures (``run``)."""

    def __init__(self, opts: WatchOptions, out: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time, nvml: nvml_collector.NvmlApi | None = None) -> None:
        self.opts = opts
        self.ring = Ring(opts.ring_s)
        self.state = State()
        self.clock = clock
        self.out = out or (lambda line: print(line, flush=True))
        self.fired: queue.Queue[Fired] = queue.Queue(maxsize=FIRED_MAX)
        self.stop = threading.Event()
        self.followers = [LogFollower(p) for p in opts.logs]
        self.capturing: Fired | None = None
        self._also: list[dict[str, Any]] = []
        self._capture_lock = threading.Lock()  # capturing and _also: the ring and HTTP threads add, main reads
        self._alert_groups: set[str] = set()  # Alertmanager groups captured and not resolved since
        self.listening = False  # --listen: the light verdict is kept for /metrics even without its rule
        self._holding: set[str] = set()  # rules that fired and have not cleared since: the incident under way
        self._last_session = ""  # the newest session written (main thread; read under _capture_lock)
        self._incident_rules: set[str] = set()  # the rules of the newest capture: while one holds, its incident goes on
        self._false_ticks: dict[str, int] = {}
        self._false_since: dict[str, float] = {}  # when each rule's current run of false ticks began
        self._events: list[str] = []  # log events (oom rule) since the last tick
        self._judged_at = 0.0
        self._scrape_errors: dict[str, str] = {}
        self._said: set[str] = set()
        self._proc = psutil.Process(opts.pid)
        self._nvml = nvml  # None: the live NVML, opened at the first tick
        self._nvml_col: nvml_collector.Collector | None = None
        self._nvml_off = ""  # why the ring has no GPU samples (no driver, no GPU, NVML failed)
        self._scratch = ""  # made at the first light verdict
        self.gone = False
        self.reading_ok = True  # the last tick read the target (and its metrics): diagnose_up

    # -- the ring thread ---------------------------------------------------------------------------------

    def tick(self) -> None:
        """One tick: each step on its own, so one that fails (an endpoint that answers garbage, a log that
        became unreadable) never stops the others; each failure is said once, until it changes."""
        now = self.clock()
        scraped = True
        for url in self.opts.metrics:
            try:
                self.ring.add_scrape(now, scrape(url, SCRAPE_TIMEOUT_S))
                self._scrape_errors.pop(url, None)
            except (OSError, ValueError, http.client.HTTPException) as exc:
                scraped = False
                why = str(getattr(exc, "reason", exc)) or type(exc).__name__
                if self._scrape_errors.get(url) != why:
                    self.say(f"watch: could not scrape {url}: {why}")
                self._scrape_errors[url] = why
        for f in self.followers:
            try:
                lines = f.read()
            except OSError as exc:
                self.say_once(f"log:{f.path}:{exc.strerror}", f"watch: could not read {f.path}: {exc.strerror}")
                continue
            self.ring.add_log(now, lines)
            self._events.extend(e for e in map(log_event, lines) if e)
        sampled = self._sample(now)
        self.reading_ok = scraped and sampled and not self.gone
        self.ring.prune(now)
        self.evaluate(now)

    def _sample(self, now: float) -> bool:
        """The target's CPU, memory and threads (and the GPUs) into the ring; False when it could not be read
        (``gone`` when it no longer exists)."""
        try:
            with self._proc.oneshot():
                if self._proc.status() == psutil.STATUS_ZOMBIE:  # exited, its parent has not reaped it yet
                    raise psutil.ZombieProcess(self._proc.pid)
                cpu = self._proc.cpu_times()
                sample: dict[str, Any] = {"t": round(now, 3), "cpu_s": round(cpu.user + cpu.system, 3),
                                          "rss_bytes": float(self._proc.memory_info().rss),
                                          "threads": float(self._proc.num_threads())}
        except psutil.NoSuchProcess:  # a zombie too
            self.gone = True
            return False
        except psutil.Error as exc:  # refused (AccessDenied) or the like: it runs, this read failed
            self.say_once(f"sample:{type(exc).__name__}", f"watch: could not read pid {self.opts.pid} "
                          f"({type(exc).__name__}); the ring goes on without its process and GPU samples, "
                          f"and diagnose_up reads 0 meanwhile")
            return False
        gpus = self.gpu_sample()
        if gpus is not None:
            sample["gpus"] = gpus
        self.ring.add_sample(sample)
        return True

    def gpu_sample(self) -> list[dict[str, Any]] | None:
        """The target's GPUs now (``GPU_KEYS`` of each, ``diagnose.collectors.nvml``'s sampler), or None where
        NVML cannot answer; why is said once on stderr and the ring goes on without GPU samples."""
        if self._nvml_off:
            return None
        try:
            if self._nvml_col is None:
                api = self._nvml or nvml_collector.LiveNvml()
                api.init()
                self._nvml, self._nvml_col = api, nvml_collector.Collector(self.opts.pid)
            assert self._nvml is not None
            sample = self._nvml_col.collect(self._nvml)
        except nvml_collector.NvmlCallError as exc:
            self._nvml_off = nvml_collector.explain(exc).reason
        except Exception as exc:  # the live path must never stop the ring
            self._nvml_off = f"NVML failed: {type(exc).__name__}: {exc}"
        if self._nvml_off:
            self.say(f"watch: no GPU samples in the ring: {self._nvml_off}")
            return None
        return [{k: d.get(k) for k in GPU_KEYS} for d in sample.get("devices", []) if d.get("target")]

    def evaluate(self, now: float) -> None:
        """Each rule's truth at this tick; a rule that turns true fires once until it has been false."""
        recent = reading(self.ring.since(now - SPAN_S))
        events, self._events = self._events, []
        if self.listening and not any(r.name == "bottleneck" for r in self.opts.rules):
            self._light_verdict(now, recent)  # diagnose_bottleneck in /metrics, with no trigger of its own
        for rule in self.opts.rules:
            value: float | None = None
            detail = ""
            if rule.name in METRIC_RULES:
                value = metric_value(rule, recent)
                if value is None:  # not measured at this tick: neither true nor a tick that clears it
                    if recent is not None:
                        self.say_once(rule.text, f"watch: {rule.text} cannot be read yet: the engine's metrics "
                                      f"have no {METRIC_RULES[rule.name][0]} series with requests in the last "
                                      f"{SPAN_S:.0f} s")
                    continue
                true = rule.holds(value)
                if true:
                    unit = METRIC_RULES[rule.name][1]
                    detail = f"{rule.name} {value / 1000:.2f} s" if unit == "ms" else f"{rule.name} {value:g}"
            elif rule.name == "oom":
                true = bool(events)
                detail = f"the log shows {events[0]}" if events else ""
            else:
                category = self._light_verdict(now, recent)
                true = category is not None
                detail = f"the light verdict names {category} (critical)" if category else ""
            self._step(rule, true, now, value, detail)

    def _step(self, rule: Rule, true: bool, now: float, value: float | None, detail: str) -> None:
        if not true:  # cleared once false for clear_s and CLEAR_TICKS ticks in a row: a flapping gauge is one incident
            ticks = self._false_ticks[rule.text] = self._false_ticks.get(rule.text, 0) + 1
            since = self._false_since.setdefault(rule.text, now)
            if ticks >= CLEAR_TICKS and now - since >= self.opts.clear_s:
                self._holding.discard(rule.text)
            return
        self._false_ticks[rule.text] = 0
        self._false_since.pop(rule.text, None)
        if rule.text in self._holding:
            return
        with self._capture_lock:
            ongoing = rule.name != "oom" and any(r != rule.text and r in self._holding for r in self._incident_rules)
        self._holding.add(rule.text)
        with self.state.lock:
            self.state.triggers[rule.text] += 1
        self._queue(Fired(rule.text, now, value, detail, joins=ongoing))

    def _queue(self, fired: Fired) -> None:
        """A capture for ``fired``, unless one runs (then it is the same incident: recorded in that session);
        one that ``joins`` the incident of the newest session is recorded there by the main thread."""
        with self._capture_lock:
            if self.capturing is not None and fired.rule != "exited":
                self._also.append(_entry(fired))
                if fired.alert is None:
                    self._incident_rules.add(fired.rule)
                return
        try:
            self.fired.put_nowait(fired)
        except queue.Full:
            self.say(f"watch: {FIRED_MAX} captures already wait their turn; {fired.rule} is not captured")

    def _active(self, recent: Any) -> bool:
        """Whether the service did anything over the last span: its request counters moved, requests run
        or wait, or its log grew (an idle service is not judged: nothing to judge, and it costs nothing)."""
        if recent is not None:
            if any(c.windowed and c.delta > 0 for c in recent.counters.values()):
                return True
            if any(v and v[-1] > 0 for k, v in recent.gauges.items() if k in ("running", "waiting")):
                return True
        last = self.ring.last_log_at()
        return last is not None and last >= self.clock() - SPAN_S

    def _light_verdict(self, now: float, recent: Any) -> str | None:
        if now - self._judged_at < self.opts.judge_every_s:
            with self.state.lock:
                return self.state.bottleneck
        self._judged_at = now
        category = self.judge_ring(now) if self._active(recent) else None
        with self.state.lock:
            self.state.bottleneck = category
        return category

    def judge_ring(self, now: float) -> str | None:
        """The light verdict: the last ``SPAN_S`` of the ring's scrapes and log through the rule engine;
        the leading finding's category when it is critical, else None."""
        from diagnose import pipeline

        scrapes, log, _ = self.ring.snapshot()
        if not self._scratch:
            self._scratch = tempfile.mkdtemp(prefix="diagnose-watch-")
        paths: list[str] = []
        scraped: list[str] = []
        span = [s for s in scrapes if s[0] >= now - 2 * SPAN_S]
        if len(span) >= 2:
            path = os.path.join(self._scratch, "ring.prom")
            with open(path, "w", encoding="utf-8") as fh:
                fh.writelines(f"# scrape at {at:.3f}\n{text}\n" for at, text in (span[0], span[-1]))
            paths.append(path)
            scraped.append(path)
        lines = [line for at, line in log if at >= now - 2 * SPAN_S]
        if lines:
            path = os.path.join(self._scratch, "ring.log")
            with open(path, "w", encoding="utf-8") as fh:
                fh.writelines(f"{line}\n" for line in lines)
            paths.append(path)
        if not paths:
            return None
        try:
            # the scrapes are diagnose's own: Prometheus text, read by the exposition readers alone
            d = pipeline.analyze(paths, config=self.opts.config, expositions=scraped)
        except DiagnoseError:
            return None
        first = next((f for f in d.findings if f.category is not None), None)
        if first is None or first.severity is not Severity.CRITICAL:
            return None
        return first.category.value if first.category else None

    def _ring_loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # the ring must outlive one bad tick; say it once per kind
                self.say(f"watch: a tick failed ({type(exc).__name__}: {exc})")
            if self.gone:
                self.fired.put(Fired("exited", self.clock(), None, "the target process exited"))  # waits for room
                return
            self.stop.wait(self.opts.interval_s)

    # -- the main thread -----------------------------------------------------------------------------

    def say(self, line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def say_once(self, key: str, line: str) -> None:
        if key not in self._said:
            self._said.add(key)
            self.say(line)

    def alert(self, payload: Mapping[str, Any], firing: bool = True) -> str:
        """An Alertmanager webhook: firing alerts start one capture with their labels in the session (while
        one runs, they are recorded in it); Alertmanager's repeats of a group already captured start none
        until the group resolves. What was done, for the HTTP answer."""
        from diagnose.watch_http import alert_record

        record = alert_record(payload)
        group = str(payload.get("groupKey", ""))[:1000]
        if not firing:
            self._alert_groups.discard(group)
            return "resolved: nothing to capture."
        if group and group in self._alert_groups:
            return "this alert group was captured already; it is captured again after it resolves."
        if group:
            self._alert_groups.add(group)
        with self.state.lock:
            self.state.triggers["alert"] += 1
        name = record["labels"].get("alertname", "alert")
        self._queue(Fired("alert", self.clock(), None, f"Alertmanager alert {name}", alert=record))
        return "capturing."

    def run(self) -> int:
        """Watch until ``stop`` (SIGINT/SIGTERM in the CLI) or the target exits; 0 when stopped cleanly."""
        ring = threading.Thread(target=self._ring_loop, name="diagnose-watch-ring", daemon=True)
        ring.start()
        try:
            while not self.stop.is_set():
                try:
                    fired = self.fired.get(timeout=0.5)
                except queue.Empty:
                    continue
                try:
                    if fired.rule == "exited":
                        self.capture_gone(fired)
                        return 0
                    if fired.joins and self.join(fired):
                        continue
                    self.capture(fired)
                except Exception as exc:  # one failed capture never ends the watch
                    self.capture_failed(fired, exc)
                    if fired.rule == "exited":
                        return 0
        finally:
            self.stop.set()
            ring.join(timeout=self.opts.interval_s + SCRAPE_TIMEOUT_S * max(1, len(self.opts.metrics)) + 1)
            with self.state.lock:
                self.state.up = False
            if self._nvml_col is not None and self._nvml is not None:
                with contextlib.suppress(Exception):
                    self._nvml.shutdown()
            if self._scratch:
                shutil.rmtree(self._scratch, ignore_errors=True)
        return 0

    def _folder(self, fired: Fired) -> str:
        stamp = datetime.fromtimestamp(fired.at, UTC).strftime("%Y%m%dT%H%M%SZ")
        base = os.path.join(self.opts.output, f"watch-{stamp}-{fired.slug}")
        folder, n = base, 1
        while os.path.exists(folder):
            n += 1
            folder = f"{base}-{n}"
        return folder

    def capture(self, fired: Fired) -> str | None:
        """A full attach window after the trigger, with the ring from before it; its verdict line."""
        from diagnose.attach import AttachOptions, attach

        folder = self._folder(fired)
        same = self._same_incident()
        with self._capture_lock:
            self.capturing, self._also = fired, same
            self._incident_rules = {e["rule"] for e in same} | ({fired.rule} if fired.alert is None else set())
        self.say(f"watch: {fired.rule} fired ({fired.detail or 'no detail'}); capturing {self.opts.window_s:g} s "
                 f"into {folder}")

        def also() -> list[dict[str, Any]]:
            with self._capture_lock:
                return list(self._also)

        diagnosis: Diagnosis | None = None
        failure: Exception = RuntimeError("the capture returned no diagnosis")
        try:
            opts = AttachOptions(pid=self.opts.pid, duration_s=self.opts.window_s, output=folder,
                                 rate_hz=self.opts.rate_hz, logs=[p for p in self.opts.logs if os.path.isfile(p)],
                                 metrics=list(self.opts.metrics), config=self.opts.config)
            ring = RingSource(folder, self.ring, fired, also)
            _, diagnosis = attach(opts, self.stop, extra=[ring])
        except Exception as exc:  # one failed capture never ends the watch
            failure = exc
        finally:
            with self._capture_lock:  # one block: a rule queued in between finds no capture and no incident
                self.capturing = None
                late = list(self._also)
                if diagnosis is None:
                    self._incident_rules = set()  # no session holds this incident: what fires next is captured
        if diagnosis is None:
            self._abandon(folder, fired, failure, late)
            return None
        try:
            # rules that fired while the analysis ran, after the ring was written
            self._rewrite_also(folder, lambda _: late)
            self._write_diagnosis(folder, diagnosis)
        except Exception as exc:
            self._abandon(folder, fired, exc, late)
            return None
        self._announce(folder, fired, diagnosis)  # the session is whole: a failure from here on keeps it
        return folder

    def _abandon(self, folder: str, fired: Fired, exc: Exception, late: Sequence[Mapping[str, Any]] = ()) -> None:
        """A capture that failed: said (``capture_failed``), with the rules that fired during it (they stay
        held until they clear, as the trigger does), and its folder removed: nothing half-written is left to
        look like a session."""
        with self._capture_lock:
            # no session holds this incident: a rule still held from it, or one queued to join it before the
            # capture ended, is captured on its own rather than joined to an older session
            self._incident_rules = set()
            self._last_session = ""
        self.capture_failed(fired, exc)
        joined = sorted({str(e.get("rule")) for e in late})
        if joined:
            self.say(f"watch: {', '.join(joined)} fired during that capture and {'is' if len(joined) == 1 else 'are'}"
                     f" not captured either")
        shutil.rmtree(folder, ignore_errors=True)

    def capture_failed(self, fired: Fired, exc: Exception) -> None:
        """Say why a capture failed: one sentence for a known cause (the target went away, a file could not
        be written); for anything else, a defect of diagnose's own, the traceback too, so that it can be
        reported. Either way the watch goes on: one capture's failure must not leave the service unwatched."""
        if isinstance(exc, DiagnoseError | OSError):
            self.say(f"watch: the capture for {fired.rule} failed: {exc}")
            return
        self.say(redact_text(f"watch: the capture for {fired.rule} failed unexpectedly ({type(exc).__name__}: "
                             f"{exc}); the watch goes on. Please report this traceback:\n"
                             + "".join(traceback.format_exception(exc))).rstrip())

    def join(self, fired: Fired) -> bool:
        """Record ``fired`` in the newest session (its ``also``), whose incident goes on; False when there is
        none or it is gone (rotated away, deleted): then it is captured as its own."""
        with self._capture_lock:
            folder = self._last_session
        if not folder or not self._rewrite_also(folder, lambda also: [*also, _entry(fired)]):
            return False
        with self._capture_lock:
            self._incident_rules.add(fired.rule)
        self.say(f"watch: {fired.rule} fired ({fired.detail or 'no detail'}) while the incident of "
                 f"{os.path.basename(folder)} goes on: recorded in its watch.json")
        return True

    def _rewrite_also(self, folder: str,
                      change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]) -> bool:
        """The session's ``also`` replaced by ``change(also)``, read and written once; False when its
        ``watch.json`` cannot be read (the session is gone)."""
        path = os.path.join(folder, WATCH_FILE)
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
            also = list(doc.get("also") or [])
        except (OSError, ValueError, AttributeError):
            return False
        new = change(also)
        if new != also:
            doc["also"] = new
            write_json_atomic(path, doc)
        return True

    def _same_incident(self) -> list[dict[str, Any]]:
        """Rules that fired at the same tick as the one being captured (still queued): the same incident,
        recorded in its session rather than captured again. Alerts and the target's exit stay queued."""
        same: list[dict[str, Any]] = []
        keep: list[Fired] = []
        while True:
            try:
                f = self.fired.get_nowait()
            except queue.Empty:
                break
            if f.alert is None and f.rule != "exited":
                same.append({"rule": f.rule, "at": f.at, "value": f.value, "detail": f.detail})
            else:
                keep.append(f)
        for f in keep:
            self.fired.put(f)
        return same

    def capture_gone(self, fired: Fired) -> str:
        """The target exited: a session from the ring alone (no window can be taken of a process that is
        gone), so an OOM kill or a crash still leaves its last minutes diagnosed."""
        from diagnose import pipeline
        from diagnose.model import Session, Target

        folder = self._folder(fired)
        os.makedirs(folder)
        try:
            now = self.clock()
            scrapes, log, samples = self.ring.snapshot()
            start = min([s[0] for s in scrapes] + [s["t"] for s in samples] + [now])
            window = Window(start, now)
            cap = write_ring(folder, (scrapes, log, samples), fired, [], window)
            session = Session(path=folder, target=Target(pid=self.opts.pid, cmdline=(), python="", user=""),
                              window=window, captures=(cap,))
            write_json_atomic(os.path.join(folder, pipeline.MANIFEST), session.manifest())
            diagnosis = pipeline.analyze([folder], config=self.opts.config)
            self._write_diagnosis(folder, diagnosis)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)  # nothing half-written is left to look like a session
            raise
        self._announce(folder, fired, diagnosis)
        self.say(f"watch: pid {self.opts.pid} exited; stopped")
        return folder

    @staticmethod
    def _write_diagnosis(folder: str, diagnosis: Diagnosis) -> None:
        """diagnosis.json, serialised first and renamed into place: the file is whole or absent."""
        write_text_atomic(os.path.join(folder, "diagnosis.json"), diagnosis.to_json_text())

    def _announce(self, folder: str, fired: Fired, diagnosis: Diagnosis) -> None:
        """A session written: the newest (what a rule of the same incident joins), its verdict line, rotation."""
        with self._capture_lock:
            self._last_session = folder
        with self.state.lock:
            self.state.last_session_at = self.clock()
        self.out(f"{datetime.fromtimestamp(fired.at, UTC):%Y-%m-%dT%H:%M:%SZ} {fired.rule}: "
                 f"{verdict_line(diagnosis)} — {folder}")
        self.rotate()

    def rotate(self) -> None:
        """Keep the newest ``max_sessions`` watch sessions of the output folder (by their UTC names)."""
        try:
            names = sorted(n for n in os.listdir(self.opts.output) if n.startswith("watch-")
                           and os.path.isfile(os.path.join(self.opts.output, n, WATCH_FILE)))
        except OSError:
            return
        for name in names[: max(0, len(names) - self.opts.max_sessions)]:
            shutil.rmtree(os.path.join(self.opts.output, name), ignore_errors=True)


def _between(value: float, low: float, high: float) -> bool:
    return math.isfinite(value) and low <= value <= high


def check_options(opts: WatchOptions, explicit_rules: bool = True) -> None:
    """Everything ``watch`` can check before it starts, each with one sentence and the remedy. A rule that
    can never be true for lack of its input is refused when asked for; of the default rules (``bottleneck``,
    ``oom``) those without their input are dropped, with a line on stderr."""
    from diagnose.attach import check_target

    check_target(opts.pid)
    for path in opts.logs:
        if not os.path.isfile(path):
            raise InputError(f"the log {path} does not exist.", "Pass the service's log file with --log.")
    for url in opts.metrics:
        if not url.startswith(("http://", "https://")):
            raise InputError(f"--metrics {url!r} is not an http(s) URL.", "E.g. --metrics http://127.0.0.1:8000/metrics.")
    if opts.max_sessions < 1:
        raise InputError("--max-sessions must be at least 1.", "Give how many sessions to keep, e.g. 20.")
    if not (_between(opts.window_s, 1.0, 600.0) and _between(opts.interval_s, 0.5, 300.0)
            and _between(opts.ring_s, opts.interval_s, 3600.0) and _between(opts.clear_s, 0.0, 3600.0)):
        raise InputError("--window must be 1-600 s, --interval 0.5-300 s, --ring from one interval to 3600 s "
                         "and --clear 0-3600 s.", "E.g. --window 20 --interval 5 --ring 300 --clear 60.")
    if not 1 <= opts.rate_hz <= 1000:
        raise InputError("--rate must be between 1 and 1000 samples per second.", "Use e.g. --rate 50.")
    needs = {"oom": bool(opts.logs), "bottleneck": bool(opts.logs or opts.metrics),
             **{name: bool(opts.metrics) for name in METRIC_RULES}}
    what = {"oom": "--log FILE", "bottleneck": "--metrics URL or --log FILE"}
    blind = [r for r in opts.rules if not needs[r.name]]
    if blind and explicit_rules:
        r = blind[0]
        raise InputError(f"--when {r.text} can never fire: it reads {what.get(r.name, '--metrics URL')}, "
                         "which was not given.", f"Pass {what.get(r.name, '--metrics URL')}.")
    opts.rules = tuple(r for r in opts.rules if needs[r.name])
    if not opts.rules:
        raise InputError("there is nothing to watch: the default rules read the service's log and metrics.",
                         "Pass --metrics URL (its /metrics) and/or --log FILE, or --when RULE.")
    for r in blind:
        print(f"watch: {r.text} is off: it reads {what[r.name]}, which was not given", file=sys.stderr)
    os.makedirs(opts.output, exist_ok=True)


def watch_cli(opts: WatchOptions, listen: str | None, explicit_rules: bool = True) -> int:
    """Run the watcher in the foreground; SIGINT and SIGTERM stop it cleanly (a capture under way ends
    its window early and is still written)."""
    check_options(opts, explicit_rules)
    if listen:
        from diagnose.watch_http import parse_listen

        parse_listen(listen)  # a bad address is refused before anything starts
    watcher = Watcher(opts)
    server = None
    if listen:
        from diagnose.watch_http import serve

        watcher.listening = True
        server = serve(listen, watcher)
        host, port = str(server.server_address[0]), int(server.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        watcher.say(f"watch: serving /metrics and POST /alert on http://{shown}:{port}")

    def on_signal(signum: int, frame: FrameType | None) -> None:
        watcher.stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    rules = ", ".join(r.text for r in opts.rules)
    watcher.say(f"watch: pid {opts.pid}, ring {opts.ring_s:g} s, every {opts.interval_s:g} s, when {rules}; "
                f"sessions into {opts.output}")
    try:
        return watcher.run()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if server is not None:
            with contextlib.suppress(Exception):
                server.shutdown()
                server.server_close()
