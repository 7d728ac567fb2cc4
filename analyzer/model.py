"""The shared vocabulary of diagnose: frozen values handed from stage to stage.

This module is a leaf: every package may import it and it imports nothing of ours. Everything
here is a frozen dataclass or an Enum, serialisable to the JSON of schema
``diagnose/diagnosis/v1`` (see ``to_json`` / ``from_json``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

SCHEMA = "diagnose/diagnosis/v1"
MANIFEST_SCHEMA = "diagnose/session/v1"
TOOL_VERSION = "0.1.0"
FIRST_REQUESTS = 5  # the cold-start window: the first requests after a log starts (timing parser, figures)


class Category(StrEnum):
    """Bottleneck categories: a stable vocabulary, part of the JSON contract. Never rename."""

    CPU_PREPROCESSING = "cpu_preprocessing"
    PCIE_TRANSFER = "pcie_transfer"
    RECOMPILATION = "recompilation"
    OOM_WEIGHTS = "oom_weights"
    OOM_PEAK = "oom_peak"
    OOM_FRAGMENTATION = "oom_fragmentation"
    OOM_EXTERNAL = "oom_external"
    PREFILL_TTFT = "prefill_ttft"
    QUEUEING = "queueing"
    GPU_COMPUTE = "gpu_compute"
    THREAD_OVERSUBSCRIPTION = "thread_oversubscription"
    LAUNCH_OVERHEAD = "launch_overhead"
    DEVICE_PLACEMENT = "device_placement"


class Mechanism(StrEnum):
    """What makes requests queue (a ``queueing`` finding's ``mechanism``): each has its own fix."""

    ADMISSION_CAP = "admission_cap"  # a sequence/slot limit (max_num_seqs, --parallel) holds them, memory has room
    KV_CAPACITY = "kv_capacity"  # the KV cache is full: preemption, swapping, no room to admit
    FRONT_END_LAG = "front_end_lag"  # the API server (HTTP, tokenising, streaming) lags the engine
    SATURATED_WORKERS = "saturated_workers"  # every worker is busy: too little capacity for the load
    # not a queue for capacity: requests wait while nothing runs and nothing is full (a hung or dead worker); a
    # note that explains nothing as healthy (``rules.verdict``)
    STALLED = "stalled"


# categories that only a GPU can have: on a host without one (``HOST_NO_GPU``) no rule may name them
GPU_ONLY_CATEGORIES = frozenset({Category.GPU_COMPUTE, Category.PCIE_TRANSFER, Category.LAUNCH_OVERHEAD,
                                 Category.DEVICE_PLACEMENT})
# the evidence key that says the host has no GPU (NVML finds no driver or no device; an engine's log
# says it runs on the CPU platform): its value is 1, its detail says how it is known
HOST_NO_GPU = "host.gpu_absent"
# files an attach writes into its session beside the collectors' own (read by ``diagnose.derive.session``)
PYSPY_META = "pyspy-meta.json"
ATTACH_COST = "attach-cost.json"
# ... and a ``diagnose watch`` session beside them: the trigger, and the ring from before it
WATCH_FILE = "watch.json"
RING_METRICS = "watch-ring.prom"
RING_LOG = "watch-ring.log"
RING_PROCESS = "watch-process.jsonl"


class Verdict(StrEnum):
    """What a diagnosis amounts to; says what a null ``primary`` means."""

    BOTTLENECK = "bottleneck"  # a finding names the primary bottleneck
    HEALTHY = "healthy"  # the evidence covers the service and nothing significant was found
    UNDETERMINED = "undetermined"  # too little evidence to judge: see ``next_steps``


class Severity(StrEnum):
    CRITICAL = "critical"
    MAJOR = "major"
    MINOR = "minor"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Higher is more severe; used for ``--fail-on`` and ranking."""
        return {"critical": 3, "major": 2, "minor": 1, "info": 0}[self.value]


class Confidence(StrEnum):
    """What a judgement rests on."""

    MEASURED = "measured"  # a direct measurement
    CORRELATED = "correlated"  # two independent sources agree
    HEURISTIC = "heuristic"  # one proxy signal
    THIN = "thin"  # too little data

    @property
    def weight(self) -> float:
        return {"measured": 1.0, "correlated": 0.9, "heuristic": 0.7, "thin": 0.4}[self.value]


class CaptureStatus(StrEnum):
    OK = "ok"
    PARTIAL = "partial"
    SKIPPED = "skipped"
    FAILED = "failed"


class Risk(StrEnum):
    SAFE = "safe"
    NEEDS_VALIDATION = "needs_validation"


class Quality(StrEnum):
    """How far an evidence value can be trusted."""

    GOOD = "good"
    PARTIAL = "partial"  # derived from a capture that was cut short
    LOW = "low"  # too few samples for a firm figure


JsonValue = Any  # a value json.dumps accepts


@dataclass(frozen=True)
class Availability:
    """Whether a collector can run here, and if not, why and what to do about it."""

    ok: bool
    reason: str = ""
    remedy: str = ""


@dataclass(frozen=True)
class Target:
    """The process being diagnosed."""

    pid: int
    cmdline: tuple[str, ...] = ()
    python: str = ""
    user: str = ""
    gpus: tuple[str, ...] = ()
    children: tuple[int, ...] = ()

    def to_json(self) -> dict[str, JsonValue]:
        return {
            "pid": self.pid,
            "cmdline": list(self.cmdline),
            "python": self.python,
            "user": self.user,
            "gpus": list(self.gpus),
            "children": list(self.children),
        }

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Target:
        return Target(
            pid=int(doc.get("pid", 0)),
            cmdline=tuple(str(x) for x in doc.get("cmdline", ())),
            python=str(doc.get("python", "")),
            user=str(doc.get("user", "")),
            gpus=tuple(str(x) for x in doc.get("gpus", ())),
            children=tuple(int(x) for x in doc.get("children", ())),
        )


@dataclass(frozen=True)
class Window:
    """A time window, in seconds since the epoch."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def to_json(self) -> dict[str, float]:
        return {"start": self.start, "end": self.end}


@dataclass(frozen=True)
class Capture:
    """What one collector recorded, or why it could not."""

    collector: str
    status: CaptureStatus
    reason: str = ""
    remedy: str = ""
    window: Window | None = None
    files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what it covered, one line per part (py-spy: each process of the tree)

    def to_json(self) -> dict[str, JsonValue]:
        doc: dict[str, JsonValue] = {
            "collector": self.collector,
            "status": self.status.value,
            "reason": self.reason,
            "remedy": self.remedy,
            "window": self.window.to_json() if self.window else None,
            "files": list(self.files),
        }
        if self.notes:
            doc["notes"] = list(self.notes)
        return doc

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Capture:
        w = doc.get("window")
        notes = doc.get("notes")
        return Capture(
            collector=str(doc["collector"]),
            status=CaptureStatus(doc["status"]),
            reason=str(doc.get("reason", "")),
            remedy=str(doc.get("remedy", "")),
            window=Window(float(w["start"]), float(w["end"])) if w else None,
            files=tuple(str(f) for f in doc.get("files", ())),
            notes=tuple(str(n) for n in notes) if isinstance(notes, list) else (),
        )


@dataclass(frozen=True)
class Evidence:
    """A keyed, unit-carrying fact with its source, e.g. ``cpu.preprocess_share = 0.62 ratio``."""

    key: str
    value: JsonValue
    unit: str
    source: str
    window: Window | None = None
    quality: Quality = Quality.GOOD
    detail: str = ""

    def to_json(self) -> dict[str, JsonValue]:
        doc: dict[str, JsonValue] = {
            "key": self.key,
            "value": _json_number(self.value),
            "unit": self.unit,
            "source": self.source,
        }
        if self.quality is not Quality.GOOD:
            doc["quality"] = self.quality.value
        if self.detail:
            doc["detail"] = self.detail
        return doc

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Evidence:
        return Evidence(
            key=str(doc["key"]),
            value=doc.get("value"),
            unit=str(doc.get("unit", "")),
            source=str(doc.get("source", "")),
            quality=Quality(doc.get("quality", "good")),
            detail=str(doc.get("detail", "")),
        )


def _json_number(value: JsonValue) -> JsonValue:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return None
        return round(value, 6)
    return value


@dataclass(frozen=True)
class Missing:
    """The answer of an ``EvidenceSet`` lookup for a key nobody measured, with the reason."""

    key: str
    reason: str

    def __bool__(self) -> bool:
        return False


class EvidenceSet:
    """Evidence by key. A lookup returns ``Evidence`` or ``Missing(reason)``, never None.

    When two sources give the same key the first one added wins; later ones are kept as
    alternatives (``all``) so that a rule can check whether independent sources agree.
    """

    def __init__(self, items: Iterable[Evidence] = (), missing: Mapping[str, str] | None = None) -> None:
        self._by_key: dict[str, list[Evidence]] = {}
        self._why_missing: dict[str, str] = dict(missing or {})
        for item in items:
            self.add(item)

    def add(self, item: Evidence) -> None:
        self._by_key.setdefault(item.key, []).append(item)

    def explain_missing(self, prefix: str, reason: str) -> None:
        """Say why keys starting with ``prefix`` are absent (e.g. a skipped collector)."""
        self._why_missing.setdefault(prefix, reason)

    def get(self, key: str) -> Evidence | Missing:
        found = self._by_key.get(key)
        if found:
            return found[0]
        for prefix, reason in self._why_missing.items():
            if key.startswith(prefix):
                return Missing(key, reason)
        return Missing(key, f"no input provided `{key}`")

    def value(self, key: str, default: float | None = None) -> float | None:
        """The numeric value of ``key``, or ``default`` when missing or not a number."""
        ev = self.get(key)
        if isinstance(ev, Evidence) and isinstance(ev.value, int | float) and not isinstance(ev.value, bool):
            return float(ev.value)
        return default

    def all(self, key: str) -> tuple[Evidence, ...]:
        return tuple(self._by_key.get(key, ()))

    def keys(self) -> list[str]:
        return sorted(self._by_key)

    def has_prefix(self, *prefixes: str) -> bool:
        """Whether any key starts with one of ``prefixes`` (``"mem."``, ``"stage."``)."""
        return any(k.startswith(prefixes) for k in self._by_key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self._by_key

    def __iter__(self) -> Iterator[Evidence]:
        for key in sorted(self._by_key):
            yield self._by_key[key][0]

    def __len__(self) -> int:
        return len(self._by_key)

    def with_sources(self, rename: Callable[[str], str]) -> EvidenceSet:
        """The same evidence (alternatives and missing reasons kept) with every source renamed."""
        out = EvidenceSet(missing=self._why_missing)
        for evs in self._by_key.values():
            for ev in evs:
                out.add(replace(ev, source=rename(ev.source)))
        return out

    def merged(self, other: EvidenceSet) -> EvidenceSet:
        out = EvidenceSet(missing=self._why_missing)
        for items in (self._by_key, other._by_key):
            for evs in items.values():
                for ev in evs:
                    out.add(ev)
        for prefix, reason in other._why_missing.items():
            out.explain_missing(prefix, reason)
        return out


@dataclass(frozen=True)
class Fix:
    summary: str
    steps: tuple[str, ...]
    risk: Risk = Risk.NEEDS_VALIDATION

    def to_json(self) -> dict[str, JsonValue]:
        return {"summary": self.summary, "steps": list(self.steps), "risk": self.risk.value}

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Fix:
        return Fix(str(doc["summary"]), tuple(str(s) for s in doc.get("steps", ())), Risk(doc["risk"]))


Recommendation = Fix  # DESIGN.md's name for the same thing


@dataclass(frozen=True)
class Finding:
    """A rule's judgement: which bottleneck, how sure, how much it matters, and the fix."""

    code: str
    name: str
    category: Category | None  # None only for an informational note that names no bottleneck
    severity: Severity
    confidence: Confidence
    title: str
    message: str
    impact: float  # estimated share of the problem this explains, 0..1
    evidence: tuple[Evidence, ...] = ()
    fixes: tuple[Fix, ...] = ()
    why: str = ""  # an optional ASCII picture of why (a timeline, a breakdown)
    mechanism: Mechanism | None = None  # for queueing: what makes requests wait

    @property
    def label(self) -> str:
        """The category's name, or "note" for an informational finding that names no bottleneck."""
        return self.category.value if self.category is not None else "note"

    @property
    def score(self) -> float:
        """Ranking key: impact weighted by severity and confidence."""
        return self.impact * (0.5 + 0.5 * self.severity.rank / 3) * self.confidence.weight

    def to_json(self) -> dict[str, JsonValue]:
        doc: dict[str, JsonValue] = {
            "code": self.code,
            "name": self.name,
            "category": self.category.value if self.category is not None else None,
            "severity": self.severity.value,
            "confidence": self.confidence.value,
            "title": self.title,
            "message": self.message,
            "impact": round(max(0.0, min(1.0, self.impact)), 4),
            "evidence": [e.to_json() for e in self.evidence],
            "fixes": [f.to_json() for f in self.fixes],
        }
        if self.why:
            doc["why"] = self.why
        if self.mechanism is not None:
            doc["mechanism"] = self.mechanism.value
        return doc

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Finding:
        return Finding(
            code=str(doc["code"]),
            name=str(doc["name"]),
            category=Category(doc["category"]) if doc.get("category") is not None else None,
            severity=Severity(doc["severity"]),
            confidence=Confidence(doc["confidence"]),
            title=str(doc.get("title", "")),
            message=str(doc.get("message", "")),
            impact=float(doc.get("impact", 0.0)),
            evidence=tuple(Evidence.from_json(e) for e in doc.get("evidence", ())),
            fixes=tuple(Fix.from_json(f) for f in doc.get("fixes", ())),
            why=str(doc.get("why", "")),
            mechanism=Mechanism(doc["mechanism"]) if doc.get("mechanism") in Mechanism._value2member_map_ else None,
        )


@dataclass(frozen=True)
class Skipped:
    """A rule that could not judge, and why (a missing key is never a silent negative)."""

    code: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "reason": self.reason}


@dataclass(frozen=True)
class InputRecord:
    """One input to ``analyze``: what it was taken for and whether it could be read."""

    path: str
    kind: str
    status: str  # ok | partial | unreadable
    reason: str = ""

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "kind": self.kind, "status": self.status, "reason": self.reason}


@dataclass(frozen=True)
class Candidate:
    """One cause of the differential (``candidates``): its probability, what speaks for and against it,
    and the one observation or command that separates it from the next candidate."""

    category: str  # a Category's value, or "none" (nothing is wrong: expected behaviour)
    probability: float
    support: tuple[str, ...] = ()  # "for" in JSON
    against: tuple[str, ...] = ()
    check: str = ""

    def to_json(self) -> dict[str, JsonValue]:
        return {"category": self.category, "probability": round(self.probability, 3), "for": list(self.support),
                "against": list(self.against), "check": self.check}

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Candidate:
        return Candidate(str(doc["category"]), float(doc.get("probability", 0.0)),
                         tuple(str(s) for s in doc.get("for", ())), tuple(str(s) for s in doc.get("against", ())),
                         str(doc.get("check", "")))


@dataclass(frozen=True)
class Diagnosis:
    """The verdict: ranked findings, the primary bottleneck, what was skipped, what was read."""

    findings: tuple[Finding, ...]
    skipped: tuple[Skipped, ...] = ()
    inputs: tuple[InputRecord, ...] = ()
    captures: tuple[Capture, ...] = ()
    target: Target | None = None
    window: Window | None = None
    evidence: tuple[Evidence, ...] = ()
    tool_version: str = TOOL_VERSION
    schema: str = SCHEMA
    # None: not judged yet (a document from an older tool); the pipeline always sets it
    verdict: Verdict | None = None
    next_steps: tuple[str, ...] = ()  # what to collect next, most useful first (the exact command)
    # the rule settings in force (``diagnose.config.Config.to_json``), when a --config changed any
    config: Mapping[str, Any] | None = None
    # the verdict's calibrated probability (``diagnose.rules.calibration``; None: nothing to assess) and the
    # differential, best first; ``withheld``: the findings' first category did not clear the precision
    # threshold, so it is not the primary (the verdict is undetermined and the candidates lead)
    probability: float | None = None
    candidates: tuple[Candidate, ...] = ()
    withheld: bool = False

    @property
    def primary(self) -> Category | None:
        """The first finding's category, or None when nothing significant was found or it was withheld."""
        if self.withheld:
            return None
        return self.leading

    @property
    def leading(self) -> Category | None:
        """The first finding's category (committed or not), or None when nothing significant was found."""
        for f in self.findings:
            if f.severity is not Severity.INFO:
                return f.category
        return None

    @property
    def answer(self) -> str | None:
        """The category ``probability`` is of: the first finding's (committed, or withheld when the verdict is
        undetermined), "none" for a healthy service, None when nothing was assessed."""
        if self.probability is None:
            return None
        leading = self.leading
        return leading.value if leading is not None else "none"

    def to_json(self) -> dict[str, JsonValue]:
        primary = self.primary
        doc: dict[str, JsonValue] = {
            "schema": self.schema,
            "tool_version": self.tool_version,
            "primary": primary.value if primary else None,
            "verdict": self.overall.value,
            "probability": self.probability,
            "answer": self.answer,
            "candidates": [c.to_json() for c in self.candidates],
            "next_steps": list(self.next_steps),
            "findings": [f.to_json() for f in self.findings],
            "skipped": [s.to_json() for s in self.skipped],
            "inputs": [i.to_json() for i in self.inputs],
            "target": self.target.to_json() if self.target else None,
            "window": self.window.to_json() if self.window else None,
            "captures": [c.to_json() for c in self.captures],
            "evidence": [e.to_json() for e in self.evidence],
        }
        if self.config:
            doc["config"] = json.loads(json.dumps(dict(self.config)))
        return doc

    @property
    def overall(self) -> Verdict:
        """The verdict; a document without one reads as ``bottleneck`` when a primary exists, else
        ``undetermined`` (never "healthy" by default: an old document did not say so)."""
        if self.verdict is not None:
            return self.verdict
        return Verdict.BOTTLENECK if self.primary is not None else Verdict.UNDETERMINED

    def to_json_text(self) -> str:
        """The diagnosis as its JSON document (``diagnosis.json``, ``--format json``): the source of truth."""
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Diagnosis:
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} document (schema={doc.get('schema')!r})")
        w = doc.get("window")
        return Diagnosis(
            findings=tuple(Finding.from_json(f) for f in doc.get("findings", ())),
            skipped=tuple(Skipped(str(s["code"]), str(s["reason"])) for s in doc.get("skipped", ())),
            inputs=tuple(
                InputRecord(str(i["path"]), str(i["kind"]), str(i["status"]), str(i.get("reason", "")))
                for i in doc.get("inputs", ())
            ),
            captures=tuple(Capture.from_json(c) for c in doc.get("captures", ())),
            target=Target.from_json(doc["target"]) if doc.get("target") else None,
            window=Window(float(w["start"]), float(w["end"])) if w else None,
            evidence=tuple(Evidence.from_json(e) for e in doc.get("evidence", ())),
            tool_version=str(doc.get("tool_version", "")),
            verdict=Verdict(doc["verdict"]) if doc.get("verdict") else None,
            next_steps=tuple(str(s) for s in doc.get("next_steps", ())),
            config=dict(doc["config"]) if isinstance(doc.get("config"), dict) else None,
            probability=float(doc["probability"]) if isinstance(doc.get("probability"), int | float) else None,
            candidates=tuple(Candidate.from_json(c) for c in doc.get("candidates", ()) if isinstance(c, dict)),
            # an undetermined verdict over a finding that names a bottleneck: its category was withheld
            withheld=doc.get("verdict") == "undetermined" and doc.get("primary") is None and any(
                f.get("severity") != "info" and f.get("category") for f in doc.get("findings", ())),
        )


@dataclass(frozen=True)
class Session:
    """A session folder: the manifest plus raw files, re-analysable offline."""

    path: str
    target: Target
    window: Window
    captures: tuple[Capture, ...] = field(default_factory=tuple)
    tool_version: str = TOOL_VERSION
    schema: str = MANIFEST_SCHEMA

    def manifest(self) -> dict[str, JsonValue]:
        files = sorted({f for c in self.captures for f in c.files})
        return {
            "schema": self.schema,
            "tool_version": self.tool_version,
            "target": self.target.to_json(),
            "window": self.window.to_json(),
            "captures": [c.to_json() for c in self.captures],
            "files": files,
        }

    @staticmethod
    def from_manifest(path: str, doc: Mapping[str, Any]) -> Session:
        if doc.get("schema") != MANIFEST_SCHEMA:
            raise ValueError(f"not a {MANIFEST_SCHEMA} manifest (schema={doc.get('schema')!r})")
        w = doc["window"]
        return Session(
            path=path,
            target=Target.from_json(doc["target"]),
            window=Window(float(w["start"]), float(w["end"])),
            captures=tuple(Capture.from_json(c) for c in doc.get("captures", ())),
            tool_version=str(doc.get("tool_version", "")),
        )
