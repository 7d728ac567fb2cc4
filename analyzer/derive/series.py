"""The time series of a session's text captures, derived in the same pass that derives their evidence.

The session's stage logs, the in-process probe's JSON lines (CUDA allocator readings, OOMs, compile
counters), compile logs (``TORCH_LOGS=recompiles``), engine logs and metrics scrapes are read once,
by ``diagnose.loose``: besides the evidence sources, ``diagnose.derive.session`` hands it one
``SeriesSource`` per file (``derive(session, series=True)``), which keeps what the file says over
time — one row per request with its stages, allocator readings, events, metric values — as plain
rows (``FileSeries``). ``diagnose.tables`` joins the files' rows into the tables the presenters
draw; nothing reads these files a second time.

Times are seconds since the window's start (NaN when a line gave none); every label is redacted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from diagnose.collectors import engine_log as engine_log_parser
from diagnose.collectors import prom as prom_parser
from diagnose.collectors import timing
from diagnose.collectors.compile_log import CompileLogParser
from diagnose.derive import compile_log, engine_log, prom
from diagnose.model import Window
from diagnose.redact import redact_text

MAX_REQUESTS = 10_000  # the latest requests kept (by completion); percentiles come from the evidence
EPOCH_2001 = 1e9  # compile_log stamps below this are glog's month/day/time of day, above it epoch seconds
PROBE_KEYS = ('"stages_ms"', '"cuda_memory"', '"oom"', '"compile"')  # the JSON lines this reads


def num(x: Any) -> float:
    """A JSON number as a float, NaN for anything else (a bool, a string, an infinity)."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return math.nan
    v = float(x)
    return v if math.isfinite(v) else math.nan


@dataclass
class FileSeries:
    """What one text file of a session says over time (rows as ``diagnose.session_data.COLUMNS`` name them).

    ``requests[i]`` and ``stages[i]`` are one request: its ``seq`` counts from 0 in this file (the
    tables number the session's requests across its files) and its ``request_id`` is None when the
    line gave none. Only the last ``2 × MAX_REQUESTS`` are kept; ``n_requests`` counts them all.
    """

    name: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    stages: list[list[tuple[str, float]]] = field(default_factory=list)
    n_requests: int = 0
    memory: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)  # the probe's and the engine log's
    logged_recompiles: list[dict[str, Any]] = field(default_factory=list)  # TORCH_LOGS': when the probe logged none
    metrics: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""  # a line this could not read (the file's tables then say so)


class SeriesSource:
    """A ``diagnose.loose.TextSource`` that keeps one file's time series (``finish``); no evidence of its own."""

    kind = "series"

    def __init__(self, name: str, window: Window) -> None:
        self.out = FileSeries(name)
        self.window = window
        self._buf = prom_parser.PromBuffer()
        self._comp = CompileLogParser()
        self._eng = engine_log_parser.EngineLogParser()
        self._compile_prev: int | None = None
        self._timed_recompiles = 0

    @property
    def triggers(self) -> tuple[Any, ...]:
        """Its own JSON keys, and every line the compile-log, engine-log and Prometheus sources want."""
        found: list[Any] = list(PROBE_KEYS)
        for factory in (compile_log.sources, engine_log.sources, prom.sources):
            for src in factory():
                found.extend(t for t in src.triggers if t not in found)
        return tuple(found)

    def rel(self, t: float) -> float:
        return t - self.window.start

    def feed(self, line: str) -> None:
        if self.out.error:
            return
        try:
            self._feed(line)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            self.out.error = f"{type(exc).__name__}: {str(exc)[:200]}"

    def _feed(self, line: str) -> None:
        out = self.out
        self._buf.feed(line)
        self._eng.feed(line)
        if "Recompiling" in line:  # one event per recompile, at the line's time when it has one
            log = self._comp.log
            before, seen = log.recompiles, dict(log.functions)
            log.last_recompile_ts = None
            self._comp.feed(line)
            stamp = log.last_recompile_ts
            if log.recompiles > before and stamp is not None:
                t_abs = time_of_log(stamp, self.window.start, self.window.end)
                if not math.isnan(t_abs):
                    fn = next((f for f, n in log.functions.items() if n > seen.get(f, 0)), "a function")
                    self._timed_recompiles += 1
                    out.logged_recompiles.append({"t": self.rel(t_abs), "kind": "recompile", "count": 1,
                                                  "detail": redact_text(f"recompile of {fn} ({out.name})")})
        else:
            self._comp.feed(line)
        stripped = line.strip()
        if not stripped.startswith("{") or not any(k in stripped for k in PROBE_KEYS):
            return
        try:
            doc = json.loads(stripped)
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        ts = num(doc.get("ts"))
        t = self.rel(ts) if not math.isnan(ts) else math.nan
        if isinstance(doc.get("stages_ms"), dict):
            req, parts = request_row(doc, t, out.n_requests, out.name)
            out.n_requests += 1
            out.requests.append(req)
            out.stages.append(parts)
            if len(out.requests) > 2 * MAX_REQUESTS:
                del out.requests[:MAX_REQUESTS]
                del out.stages[:MAX_REQUESTS]
        state = doc.get("cuda_memory")
        if isinstance(state, dict):
            out.memory.extend(memory_rows(state, t))
        oom = doc.get("oom")
        if isinstance(oom, dict):
            msg = redact_text(str(oom.get("message") or "CUDA out of memory"))
            out.events.append({"t": t, "kind": "oom", "count": 1,
                               "detail": msg.splitlines()[0][:200] if msg else "OOM"})
            if isinstance(oom.get("cuda_memory"), dict):
                out.memory.extend(memory_rows(oom["cuda_memory"], t))
        comp_doc = doc.get("compile")
        if isinstance(comp_doc, dict):
            out.events.extend(compile_events(comp_doc, self._compile_prev, t))
            n = comp_doc.get("recompiles")
            if isinstance(n, int) and not isinstance(n, bool):
                self._compile_prev = n

    def finish(self) -> FileSeries:
        """The file's series, once every line was fed."""
        out = self.out
        if out.error:
            return out
        if self._buf.matched():
            out.metrics.extend(metric_rows(self._buf.result()))
        log = self._comp.log
        untimed = log.recompile_count - self._timed_recompiles
        if untimed > 0:
            top = ", ".join(f"{fn} ×{c}" for fn, c in sorted(log.functions.items(), key=lambda kv: -kv[1])[:3])
            out.logged_recompiles.append({"t": math.nan, "kind": "recompile", "count": untimed, "detail": redact_text(
                f"{untimed} recompile(s) in {out.name} without a timestamp" + (f": {top}" if top else ""))})
        if self._eng.matched():
            n_pre = self._eng.summary().preemptions
            if n_pre:  # engine_log gives a count, not the lines' times
                out.events.append({"t": math.nan, "kind": "preemption", "count": n_pre,
                                   "detail": f"{n_pre} preemption(s) in {out.name}"})
        return out

    # the rest of the TextSource protocol: this source gives rows, never evidence

    def matched(self) -> bool:
        return bool(self.out.requests or self.out.memory or self.out.events or self.out.logged_recompiles)

    def evidence(self, source: str) -> list[Any]:
        return []

    def problems(self) -> list[str]:
        return [self.out.error] if self.out.error else []


# ---------------------------------------------------------------------------------------------
# row builders (pure)
# ---------------------------------------------------------------------------------------------


def time_of_log(stamp: float, start: float, end: float) -> float:
    """A log line's time (``diagnose.collectors.compile_log`` stamps) as epoch seconds, or NaN.

    Bracketed ``[2024-11-30 07:30:47]`` stamps are epoch seconds already. glog stamps
    (``V1130 07:30:47.123``) carry month, day and time of day only (``day × 86400 + seconds``, with
    ``day = month × 31 + day of month``): they are put on the year that brings them nearest the
    session's window. Both are the local time of this machine, as the parser reads them.
    """
    if stamp >= EPOCH_2001:
        return stamp
    day = int(stamp // 86400)
    seconds = stamp - day * 86400
    month, dom = divmod(day, 31)
    if dom == 0:  # day 31 of month m is encoded as day 0 of month m + 1
        month, dom = month - 1, 31
    if not 1 <= month <= 12:
        return math.nan
    hh, rest = divmod(seconds, 3600)
    mm, ss = divmod(rest, 60)
    mid = (start + end) / 2
    best = math.nan
    for year in {datetime.fromtimestamp(x).year + k for x in (start, end) for k in (-1, 0, 1)}:
        try:
            t = datetime(year, month, dom, int(hh), int(mm), int(ss), min(round((ss % 1) * 1e6), 999_999))
        except ValueError:  # 30 February: not a date of that year
            continue
        epoch = t.timestamp()
        if math.isnan(best) or abs(epoch - mid) < abs(best - mid):
            best = epoch
    return best


def request_row(doc: Mapping[str, Any], t: float, seq: int,
                source: str) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """One stage-log record, read as the timing parser reads it (``diagnose.collectors.timing``)."""
    parts: list[tuple[str, float]] = []
    total = 0.0
    for name, raw in dict(doc["stages_ms"]).items():
        v = num(raw)
        if math.isnan(v) or v < 0:
            continue
        parts.append((timing.normalize_stage(str(name)), v))
        total += v
    e2e = num(doc.get("e2e_ms"))
    e2e = e2e if not math.isnan(e2e) and e2e >= total * 0.5 else total  # the rule timing.py applies
    rid = doc.get("request_id")
    status = doc.get("status")
    return ({"request_id": redact_text(str(rid)) if rid is not None else None, "t_end": t, "e2e_ms": e2e,
             "ttft_ms": num(doc.get("ttft_ms")), "input_tokens": num(doc.get("input_tokens")),
             "output_tokens": num(doc.get("output_tokens")),
             "status": redact_text(str(status)) if status is not None else "", "order": seq, "seq": seq,
             "source": redact_text(source)}, parts)


def compile_events(doc: Mapping[str, Any], prev: int | None, t: float) -> list[dict[str, Any]]:
    """A probe ``compile`` line → a recompile event (the count went up) or else a compile event."""
    delta = doc.get("delta") if isinstance(doc.get("delta"), dict) else {}
    assert isinstance(delta, dict)
    n = doc.get("recompiles")
    new = 0
    if isinstance(n, int) and not isinstance(n, bool):
        if prev is not None:
            new = n - prev
        else:  # the first line in the window: only what its delta says is new
            new = sum(v for k, v in delta.items() if str(k).startswith("recompiles.") and isinstance(v, int))
    if new > 0:
        reasons = doc.get("recent_reasons") or []
        why = redact_text(str(reasons[-1]))[:200] if isinstance(reasons, list) and reasons else "guard failure"
        return [{"t": t, "kind": "recompile", "count": new, "detail": f"{new} recompile(s), {n} in all: {why}"}]
    graphs = delta.get("stats.unique_graphs")
    if isinstance(graphs, int) and not isinstance(graphs, bool) and graphs > 0:
        return [{"t": t, "kind": "compile", "count": graphs, "detail": f"{graphs} graph(s) compiled"}]
    return []


def memory_rows(state: Mapping[str, Any], t: float) -> list[dict[str, Any]]:
    devices = state.get("devices")
    if not isinstance(devices, dict):
        return []
    rows = []
    for key, dev in devices.items():
        if not isinstance(dev, dict):
            continue
        rows.append({"t": t, "device": str(key), "allocated_bytes": num(dev.get("allocated_bytes.all.current")),
                     "reserved_bytes": num(dev.get("reserved_bytes.all.current")),
                     "inactive_split_bytes": num(dev.get("inactive_split_bytes.all.current")),
                     "weights_bytes": num(dev.get("weights_bytes")), "total_bytes": num(dev.get("total_bytes"))})
    return rows


def metric_rows(r: prom_parser.PromResult) -> list[dict[str, Any]]:
    labels = ",".join(r.engines)
    units = {a.canonical: a.unit for a in prom_parser.ALIASES}
    rows: list[dict[str, Any]] = []
    for name, values in sorted(r.gauges.items()):
        if values:
            rows.append({"name": name, "labels": labels, "unit": units.get(name, ""), "kind": "gauge",
                         "first": values[0], "last": values[-1], "delta": values[-1] - values[0]})
    for name, c in sorted(r.counters.items()):
        rows.append({"name": name, "labels": labels, "unit": units.get(name, ""), "kind": "counter",
                     "first": c.first if c.windowed else math.nan, "last": c.last, "delta": c.delta})
    for name, h in sorted(r.histograms.items()):
        for q, v in sorted(h.quantiles.items()):
            rows.append({"name": f"{name}.p{round(q * 100)}", "labels": labels, "unit": units.get(name, ""),
                         "kind": "histogram", "first": math.nan, "last": v, "delta": math.nan})
        rows.append({"name": f"{name}.count", "labels": labels, "unit": "count", "kind": "histogram",
                     "first": math.nan, "last": h.count, "delta": math.nan})
    return rows
