"""A session folder → evidence, by replaying each capture's raw files through its parser."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diagnose import loose
from diagnose.collectors import cgroup as cgroup_collector
from diagnose.collectors import nvml as nvml_collector
from diagnose.collectors import process as process_collector
from diagnose.collectors import pyspy
from diagnose.derive import cgroup, cpu_profile, nvml, process, ranks, wall
from diagnose.derive.series import FileSeries, SeriesSource
from diagnose.model import (
    ATTACH_COST,
    HOST_NO_GPU,
    PYSPY_META,
    RING_LOG,
    RING_METRICS,
    WATCH_FILE,
    Capture,
    CaptureStatus,
    Evidence,
    EvidenceSet,
    InputRecord,
    Quality,
    Session,
)

# captures whose files are loose evidence (logs, metrics scrapes, probe JSONL, Nsight exports, PyTorch traces)
TEXT_CAPTURES = ("log", "metrics", "probe", "nsys", "kineto")
SERIES_CAPTURES = ("log", "metrics", "probe")  # those whose text has time series (``diagnose.derive.series``)


@dataclass
class Derived:
    evidence: EvidenceSet = field(default_factory=EvidenceSet)
    inputs: list[InputRecord] = field(default_factory=list)
    series: dict[str, FileSeries] = field(default_factory=dict)  # by file name in the session (``series=True``)


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def _chunks(meta: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    got = meta.get("chunks")
    if not isinstance(got, list):
        return []
    return [c for c in got if isinstance(c, dict) and c.get("kind") == kind and isinstance(c.get("lines"), list)]


def _slice(lines: list[str], chunk: dict[str, Any]) -> list[pyspy.StackSample]:
    a, b = (int(x) for x in chunk["lines"][:2])
    return pyspy.parse_raw(lines[a:b], pid=int(chunk.get("pid", 0)))


def _pyspy(session: Session, cap: Capture) -> list[Evidence]:
    meta = _read_json(os.path.join(session.path, PYSPY_META))
    with open(os.path.join(session.path, pyspy.RAW_FILE), encoding="utf-8", errors="replace") as fh:
        lines = list(fh)
    window_s = float(meta.get("window_s") or (cap.window.seconds if cap.window else session.window.seconds))
    chunks = _chunks(meta, "cpu")
    coverage: dict[int, tuple[float, float]] | None = None
    per_chunk: list[list[pyspy.StackSample]] = []
    if chunks:  # recorded in chunks (version 2): each process at its own rate, for part of the window
        coverage = {}
        by_index: dict[int, list[pyspy.StackSample]] = {}
        for c in chunks:
            pid, rate, secs = int(c["pid"]), float(c["rate_hz"]), float(c.get("seconds") or 0.0)
            old = coverage.get(pid, (rate, 0.0))
            coverage[pid] = (old[0], old[1] + secs)
            by_index.setdefault(int(c.get("chunk", 0)), []).extend(_slice(lines, c))
        per_chunk = [by_index[k] for k in sorted(by_index)]
        samples = [smp for chunk in per_chunk for smp in chunk]
    else:
        samples = pyspy.parse_raw(lines)
    return list(cpu_profile.derive(
        samples,
        window_s=window_s,
        rate_hz=float(meta.get("rate_hz") or pyspy.DEFAULT_RATE_HZ),
        dumps=pyspy.read_dumps(os.path.join(session.path, pyspy.DUMPS_FILE)),
        window=cap.window,
        partial=cap.status is CaptureStatus.PARTIAL,
        coverage=coverage,
        chunks=per_chunk,
    ))


def _wall(session: Session, cap: Capture, compilers: bool) -> list[Evidence]:
    """The wall-clock view, when the session has one (``pyspy-wall.raw``, chunked meta)."""
    meta = _read_json(os.path.join(session.path, PYSPY_META))
    walls = _chunks(meta, "wall")
    if not walls or pyspy.WALL_FILE not in cap.files:
        return []
    with open(os.path.join(session.path, pyspy.WALL_FILE), encoding="utf-8", errors="replace") as fh:
        wall_lines = list(fh)
    with open(os.path.join(session.path, pyspy.RAW_FILE), encoding="utf-8", errors="replace") as fh:
        cpu_lines = list(fh)
    cpus = {(int(c.get("chunk", 0)), int(c["pid"])): c for c in _chunks(meta, "cpu")}
    source = _read_json(os.path.join(session.path, pyspy.SOURCE_FILE))
    chunks = []
    for c in walls:
        k, pid = int(c.get("chunk", 0)), int(c["pid"])
        cpu = cpus.get((k, pid))
        chunks.append(wall.Chunk(k, pid, _slice(wall_lines, c), float(c["rate_hz"]),
                                 _slice(cpu_lines, cpu) if cpu else (), float(cpu["rate_hz"]) if cpu else 0.0))
    return wall.derive(chunks, source={str(k): str(v) for k, v in source.items()}, compilers=compilers,
                       window=cap.window, partial=cap.status is CaptureStatus.PARTIAL)


def _cgroup(session: Session, cap: Capture) -> list[Evidence]:
    path = os.path.join(session.path, cgroup_collector.CGROUP_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return cgroup.derive(_read_json(path), window=cap.window, partial=cap.status is CaptureStatus.PARTIAL)


def _attach_cost(session: Session) -> list[Evidence]:
    doc = _read_json(os.path.join(session.path, ATTACH_COST))
    cores, steal, span = doc.get("cores"), doc.get("steal_s"), doc.get("window_s")
    out: list[Evidence] = []
    if isinstance(cores, int | float):
        out.append(Evidence("attach.cpu_cores", float(cores), "cores", "diagnose attach", session.window,
                            detail="CPU the attach itself (its process and every py-spy it ran) used over the window"))
    if isinstance(steal, int | float) and isinstance(span, int | float) and span > 0:
        out.append(Evidence("host.cpu_steal_share", min(1.0, max(0.0, float(steal) / float(span))), "ratio",
                            "diagnose attach (/proc/stat)", session.window,
                            detail="share of the window the hypervisor ran something else on this machine's most "
                                   "stolen CPU: CPU-bound work and timed wake-ups of the service and the attach "
                                   "were slowed by it (an oversubscribed host, or a burstable instance out of CPU "
                                   "credits)"))
    return out


def _process(session: Session, cap: Capture) -> list[Evidence]:
    path = os.path.join(session.path, process_collector.SAMPLES_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    info = _read_json(os.path.join(session.path, process_collector.INFO_FILE))
    cache = info.get("inductor_cache_files") or [None, None]
    return list(process.derive(
        process_collector.read_samples(path),
        info,
        window=cap.window,
        partial=cap.status is CaptureStatus.PARTIAL,
        cache_files=(cache[0], cache[1]),
    ))


def _nvml(session: Session, cap: Capture, out: Derived) -> list[Evidence]:
    path = os.path.join(session.path, nvml_collector.NVML_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    gpu_samples = nvml_collector.read_samples(path)
    pids = (session.target.pid, *session.target.children)
    evidence = list(nvml.derive(gpu_samples, pids, cap.window, partial=cap.status is CaptureStatus.PARTIAL))
    why = nvml.missing_reason(gpu_samples)
    if why:
        for prefix in nvml.PREFIXES:
            out.evidence.explain_missing(prefix, why)
    return evidence


def _polling(evidence: EvidenceSet, cap: Capture | None) -> list[Evidence]:
    """The threads' demand for CPU with their polling left out: schedstat per thread (process) joined
    with py-spy's per-thread profiles (on-CPU, and wall-clock when recorded); nothing when schedstat or
    the on-CPU profile is missing. Its evidence is as good as the worst of what it joined (a partial
    capture makes it partial)."""
    demand, profile, ticks = (evidence.get(k) for k in ("threads.demand", "cpu.threads", "wall.threads"))
    runnable, busy = evidence.value("threads.runnable_mean"), evidence.value("threads.busy_count")
    if not isinstance(demand, Evidence) or not isinstance(profile, Evidence) or runnable is None or busy is None:
        return []
    if not isinstance(demand.value, list) or not isinstance(profile.value, list):
        return []
    qualities = {demand.quality, profile.quality}
    per_tick: list[Any] = []
    if isinstance(ticks, Evidence) and isinstance(ticks.value, list):
        per_tick = ticks.value  # its LOW says few *request-thread* samples: each row has its own count
        qualities.add(Quality.PARTIAL if ticks.quality is Quality.PARTIAL else Quality.GOOD)
    quality = next((q for q in (Quality.LOW, Quality.PARTIAL) if q in qualities), Quality.GOOD)
    window = cap.window if cap else None
    return process.polling(demand.value, profile.value, runnable, busy, per_tick,
                           window_s=window.seconds if window else 0.0, window=window, quality=quality)


# collector → (its main file, input kind, evidence prefixes it provides)
_CAPTURES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "py-spy": (pyspy.RAW_FILE, "py-spy raw profile", ("cpu.", "workers.")),
    "process": (process_collector.SAMPLES_FILE, "psutil samples", ("proc.", "conn.")),
    "nvml": (nvml_collector.NVML_FILE, "NVML samples", ("gpu.", *nvml.PREFIXES)),
    "cgroup": (cgroup_collector.CGROUP_FILE, "cgroup CPU files", ("cgroup.",)),
}
# a damaged or missing file costs its own capture's evidence, never the whole diagnosis
_DAMAGE = (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError)


def derive(session: Session, series: bool = False) -> Derived:
    """The session's evidence; with ``series``, also the time series of its text captures, read in the
    same pass (``Derived.series``)."""
    out = Derived()
    by_name = {c.collector: c for c in session.captures}
    for cap in session.captures:
        if cap.status in (CaptureStatus.SKIPPED, CaptureStatus.FAILED):
            prefix = {"py-spy": "cpu.", "process": "proc.", "nvml": "gpu.", "cgroup": "cgroup."}.get(cap.collector)
            if prefix:
                out.evidence.explain_missing(prefix, f"{cap.collector} capture {cap.status.value}: {cap.reason}")
            if cap.collector == "py-spy":
                out.evidence.explain_missing("workers.", f"py-spy capture {cap.status.value}: {cap.reason}")
            if cap.collector == "nvml":
                for prefix in nvml.PREFIXES:
                    out.evidence.explain_missing(prefix, f"nvml capture {cap.status.value}: {cap.reason}")
                no_gpu = nvml_collector.no_gpu_reason(os.path.join(session.path, nvml_collector.NVML_FILE))
                if no_gpu:
                    out.evidence.add(Evidence(HOST_NO_GPU, 1, "flag", "diagnose attach (NVML)", cap.window,
                                              detail=no_gpu))

    steps: dict[str, Callable[[Capture], list[Evidence]]] = {
        "py-spy": lambda c: _pyspy(session, c),
        "process": lambda c: _process(session, c),
        "nvml": lambda c: _nvml(session, c, out),
        "cgroup": lambda c: _cgroup(session, c),
    }
    for collector, step in steps.items():
        found = by_name.get(collector)
        if not found or found.status not in (CaptureStatus.OK, CaptureStatus.PARTIAL):
            continue
        cap = found
        name, kind, prefixes = _CAPTURES[collector]
        path = os.path.join(session.path, name)
        try:
            evidence = step(found)
        except _DAMAGE as exc:
            why = (f"{name} is listed in the manifest but missing from the session"
                   if isinstance(exc, FileNotFoundError) else
                   f"{name} could not be read ({type(exc).__name__}: {str(exc)[:200]})")
            for prefix in prefixes:
                out.evidence.explain_missing(prefix, f"{collector} capture damaged: {why}")
            out.inputs.append(InputRecord(path, kind, "failed", why))
            continue
        for ev in evidence:
            out.evidence.add(ev)
        if collector == "process" and "conn.inflight_mean" not in out.evidence:
            out.evidence.explain_missing(
                "conn.", "the target's process tree listens on no TCP port, so in-flight requests cannot be counted")
        out.inputs.append(InputRecord(path, kind, cap.status.value, cap.reason))

    spy = by_name.get("py-spy")
    if spy is not None and spy.status in (CaptureStatus.OK, CaptureStatus.PARTIAL):
        try:
            for ev in _wall(session, spy, compilers="compile.children_seen" in out.evidence):
                out.evidence.add(ev)
        except _DAMAGE as exc:
            out.evidence.explain_missing("wall.", f"the wall-clock samples could not be read ({type(exc).__name__})")
            out.inputs.append(InputRecord(os.path.join(session.path, pyspy.WALL_FILE), "py-spy wall-clock samples",
                                          "failed", str(exc)[:200]))
    for ev in _polling(out.evidence, by_name.get("process")):
        out.evidence.add(ev)
    if "wall.samples" not in out.evidence:
        out.evidence.explain_missing("wall.", "the session has no wall-clock samples of request threads (recorded "
                                     "by `diagnose attach` from this version on)")
    for ev in _attach_cost(session):
        out.evidence.add(ev)

    loose_parts: list[list[Evidence]] = []
    traces: list[int] = []  # which of them are PyTorch-profiler traces (one per rank)
    for cap in session.captures:
        if cap.collector not in TEXT_CAPTURES or cap.status not in (CaptureStatus.OK, CaptureStatus.PARTIAL):
            continue
        for name in cap.files:
            rows = SeriesSource(os.path.basename(name), session.window) \
                if series and cap.collector in SERIES_CAPTURES and name not in out.series else None
            res = loose.analyze_path(os.path.join(session.path, name), extra=(rows,) if rows else (),
                                     modules=_modules(cap.collector, name))
            if rows is not None:
                out.series[name] = rows.finish()
            if any(r.kind == "kineto_trace" for r in res.inputs):
                traces.append(len(loose_parts))
            loose_parts.append(res.evidence)
            out.inputs.extend(res.inputs)
    if len(traces) >= 2:  # the rank that sets the pace first (its keys win), then the cross-rank evidence
        per_rank = [loose_parts[i] for i in traces]
        for slot, i in zip(traces, ranks.order(per_rank), strict=True):
            loose_parts[slot] = per_rank[i]
        loose_parts.append(ranks.derive(per_rank))
    for part in loose_parts:
        for ev in part:
            out.evidence.add(ev)
    watched = by_name.get("watch")
    if watched is not None and watched.status in (CaptureStatus.OK, CaptureStatus.PARTIAL):
        for ev in _watch(session, watched, out):
            out.evidence.add(ev)
    return out


# ``diagnose watch``'s ring (``diagnose.watch``): read after the window's evidence, so for any key the window's
# own measurement wins and the ring only fills what the window lacks (all of it for a target that exited)
RING_TEXT = (RING_METRICS, RING_LOG)


def _modules(collector: str, name: str) -> loose.Modules:
    """The text sources a captured file is read by: a scrape diagnose took of a Prometheus endpoint (the
    window's ``metrics-N.prom``, the watcher's ring of them) by those of that exposition format; the
    service's own text (its logs, a probe's output) by every source."""
    return loose.EXPOSITION_MODULES if collector == "metrics" or name == RING_METRICS else loose.SOURCE_MODULES


def _watch(session: Session, cap: Capture, out: Derived) -> list[Evidence]:
    found: list[Evidence] = []
    doc = _read_json(os.path.join(session.path, WATCH_FILE)) if WATCH_FILE in cap.files else {}
    trigger = doc.get("trigger") if isinstance(doc.get("trigger"), dict) else None
    if trigger:
        value = trigger.get("value")
        found.append(Evidence("watch.trigger", value if isinstance(value, int | float) else 1,
                              "ms" if str(trigger.get("rule", "")).startswith(("ttft", "e2e")) else "",
                              "diagnose watch", cap.window,
                              detail=f"{trigger.get('rule')} fired: {trigger.get('detail') or 'no detail'}"))
    before = doc.get("before")
    for canonical, entry in (before.items() if isinstance(before, dict) else ()):
        if isinstance(entry, dict) and "text" in entry and isinstance(entry.get("to"), int | float):
            found.append(Evidence(f"watch.before.{canonical}_rise", round(entry["to"] - entry.get("from", 0), 3),
                                  str(entry.get("unit", "")), "diagnose watch (the ring before the trigger)",
                                  cap.window, detail=str(entry["text"])))
    for name in RING_TEXT:
        if name not in cap.files:
            continue
        res = loose.analyze_path(os.path.join(session.path, name), modules=_modules(cap.collector, name))
        found.extend(res.evidence)
        out.inputs.extend(res.inputs)
    return found
