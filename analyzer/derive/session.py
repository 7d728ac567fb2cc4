"""A session folder → evidence, by replaying each capture's raw files through its parser."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from analyzer import loose
from analyzer.derive import cpu_profile, nvml, process
from analyzer.model import CaptureStatus, EvidenceSet, InputRecord, Session
from collectors import nvml as nvml_collector
from collectors import process as process_collector
from collectors import pyspy

PYSPY_META = "pyspy-meta.json"
# captures whose files are loose evidence (logs, metrics scrapes, probe JSONL, Nsight exports)
TEXT_CAPTURES = ("log", "metrics", "probe", "nsys")


@dataclass
class Derived:
    evidence: EvidenceSet = field(default_factory=EvidenceSet)
    inputs: list[InputRecord] = field(default_factory=list)


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        return doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        return {}


def derive(session: Session) -> Derived:
    out = Derived()
    by_name = {c.collector: c for c in session.captures}
    for cap in session.captures:
        if cap.status in (CaptureStatus.SKIPPED, CaptureStatus.FAILED):
            prefix = {"py-spy": "cpu.", "process": "proc.", "nvml": "gpu."}.get(cap.collector)
            if prefix:
                out.evidence.explain_missing(prefix, f"{cap.collector} capture {cap.status.value}: {cap.reason}")
            if cap.collector == "py-spy":
                out.evidence.explain_missing("workers.", f"py-spy capture {cap.status.value}: {cap.reason}")
            if cap.collector == "nvml":
                for prefix in nvml.PREFIXES:
                    out.evidence.explain_missing(prefix, f"nvml capture {cap.status.value}: {cap.reason}")

    spy = by_name.get("py-spy")
    if spy and spy.status in (CaptureStatus.OK, CaptureStatus.PARTIAL):
        raw = os.path.join(session.path, pyspy.RAW_FILE)
        meta = _read_json(os.path.join(session.path, PYSPY_META))
        with open(raw, encoding="utf-8", errors="replace") as fh:
            samples = pyspy.parse_raw(list(fh))
        window_s = float(meta.get("window_s") or (spy.window.seconds if spy.window else session.window.seconds))
        for ev in cpu_profile.derive(
            samples,
            window_s=window_s,
            rate_hz=float(meta.get("rate_hz") or pyspy.DEFAULT_RATE_HZ),
            dumps=pyspy.read_dumps(os.path.join(session.path, pyspy.DUMPS_FILE)),
            window=spy.window,
            partial=spy.status is CaptureStatus.PARTIAL,
        ):
            out.evidence.add(ev)
        out.inputs.append(InputRecord(raw, "py-spy raw profile", spy.status.value, spy.reason))

    proc = by_name.get("process")
    if proc and proc.status in (CaptureStatus.OK, CaptureStatus.PARTIAL):
        path = os.path.join(session.path, process_collector.SAMPLES_FILE)
        info = _read_json(os.path.join(session.path, process_collector.INFO_FILE))
        cache = info.get("inductor_cache_files") or [None, None]
        for ev in process.derive(
            process_collector.read_samples(path),
            info,
            window=proc.window,
            partial=proc.status is CaptureStatus.PARTIAL,
            cache_files=(cache[0], cache[1]),
        ):
            out.evidence.add(ev)
        if "conn.inflight_mean" not in out.evidence:
            out.evidence.explain_missing(
                "conn.", "the target's process tree listens on no TCP port, so in-flight requests cannot be counted")
        out.inputs.append(InputRecord(path, "psutil samples", proc.status.value, proc.reason))

    gpu = by_name.get("nvml")
    if gpu and gpu.status in (CaptureStatus.OK, CaptureStatus.PARTIAL):
        path = os.path.join(session.path, nvml_collector.NVML_FILE)
        gpu_samples = nvml_collector.read_samples(path)
        pids = (session.target.pid, *session.target.children)
        for ev in nvml.derive(gpu_samples, pids, gpu.window, partial=gpu.status is CaptureStatus.PARTIAL):
            out.evidence.add(ev)
        why = nvml.missing_reason(gpu_samples)
        if why:
            for prefix in nvml.PREFIXES:
                out.evidence.explain_missing(prefix, why)
        out.inputs.append(InputRecord(path, "NVML samples", gpu.status.value, gpu.reason))

    for cap in session.captures:
        if cap.collector not in TEXT_CAPTURES or cap.status not in (CaptureStatus.OK, CaptureStatus.PARTIAL):
            continue
        for name in cap.files:
            res = loose.analyze_path(os.path.join(session.path, name))
            for ev in res.evidence:
                out.evidence.add(ev)
            out.inputs.extend(res.inputs)
    return out
