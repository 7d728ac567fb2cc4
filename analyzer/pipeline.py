"""record → derive → judge: turn sessions and loose files into one ``Diagnosis``."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from diagnose import documents, session_io
from diagnose.config import Config
from diagnose.errors import InputError
from diagnose.model import (
    Capture,
    Diagnosis,
    Evidence,
    EvidenceSet,
    InputRecord,
    Session,
    Target,
    Window,
)
from diagnose.redact import redact_argv
from diagnose.rules import calibration
from diagnose.rules.engine import run_rules
from diagnose.rules.verdict import decide

if TYPE_CHECKING:
    from diagnose.derive.session import Derived

MANIFEST = session_io.MANIFEST


def judge(
    evidence: EvidenceSet,
    *,
    inputs: Iterable[InputRecord] = (),
    captures: Iterable[Capture] = (),
    target: Target | None = None,
    window: Window | None = None,
    config: Config | Mapping[str, Mapping[str, Any]] | None = None,
) -> Diagnosis:
    """Judge ``evidence``: ``config`` is a ``Config`` (``--config``: overrides, disabled rules, recorded in
    the diagnosis) or a bare mapping of threshold overrides per rule code."""
    settings = config if isinstance(config, Config) else Config(rules=dict(config or {}))
    findings, skipped = run_rules(evidence, settings.rules, disabled=settings.disable)
    # not sure enough to act on (withheld): undetermined, the candidates' checks first
    verdict, steps, judged, withheld = calibration.settle(evidence, findings, *decide(evidence, findings, target))
    return Diagnosis(
        findings=findings,
        skipped=skipped,
        inputs=tuple(inputs),
        captures=tuple(captures),
        target=target,
        window=window,
        evidence=tuple(evidence),
        verdict=verdict,
        next_steps=steps,
        config=settings.to_json() if settings else None,
        probability=judged.probability,
        candidates=judged.candidates,
        withheld=withheld,
    )


def load_session(path: str, label: str | None = None) -> Session:
    """The session in folder ``path`` (``label``: what the user passed, e.g. the .tar.gz, for messages).

    The target's command line is redacted again: a session from another machine or an older tool
    may carry a secret in it, and every report and page shows it.
    """
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as fh:
            doc = json.load(fh)
        if not isinstance(doc, dict):
            raise ValueError("manifest.json is not a JSON object")
        session = Session.from_manifest(path, doc)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(
            f"{label or path} is not a readable diagnose session ({type(exc).__name__}: {str(exc)[:200]}).",
            "Pass the folder that `diagnose attach` wrote (it holds manifest.json), or its .tar.gz.",
        ) from exc
    target = dataclasses.replace(session.target, cmdline=redact_argv(session.target.cmdline))
    return dataclasses.replace(session, target=target)


CONFIG_FILE = "config.json"  # the rule settings an attach ran with (``diagnose.config``)


def recorded_config(folder: str) -> Config | None:
    """The settings a session was attached with, when it recorded any."""
    path = os.path.join(folder, CONFIG_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
        from diagnose.config import parse

        return parse({"rules": doc.get("rules", {}), "disable": doc.get("disable", [])}, str(doc.get("path", "")))
    except (OSError, ValueError, InputError, AttributeError) as exc:
        raise InputError(f"the session's {CONFIG_FILE} cannot be used ({exc}).",
                         "Delete it to judge with the defaults, or pass --config FILE.") from None


def analyze(
    paths: Sequence[str], config: Config | Mapping[str, Mapping[str, Any]] | None = None,
    expositions: Collection[str] = (),
) -> Diagnosis:
    """Diagnose sessions and loose evidence files (``-`` reads stdin) together.

    Evidence is merged in the order of ``paths`` (for a key, the first input that gives it wins),
    except that several PyTorch-profiler traces (one per rank) are put in the order
    ``diagnose.derive.ranks`` gives: the rank that sets the pace first; their cross-rank evidence
    comes after them.

    ``expositions``: those of ``paths`` that diagnose scraped itself (Prometheus text, as a session's
    ``metrics-N.prom``): read by the Prometheus and DCGM readers alone (``loose.EXPOSITION_MODULES``).
    """
    parts: list[EvidenceSet] = []
    traces: dict[int, list[Evidence]] = {}  # position in parts → a loose trace's evidence
    inputs: list[InputRecord] = []
    captures: list[Capture] = []
    target: Target | None = None
    window: Window | None = None
    for path in paths:
        if path != "-" and (os.path.isdir(path) or session_io.is_packed(path)):
            with session_io.opened(path) as folder:
                session, derived = read_session(folder, label=path)
                config = config or recorded_config(folder)
            target = target or session.target
            window = window or session.window
            captures.extend(session.captures)
            parts.append(derived.evidence)
            inputs.extend(derived.inputs)
            continue
        if path != "-" and not os.path.exists(path):
            raise InputError(f"{path} does not exist.", "Check the path; use - to read evidence from stdin.")
        found, records = _loose(path, exposition=path in expositions)
        if any(r.kind == documents.TRACE_KIND for r in records):
            traces[len(parts)] = found
        parts.append(EvidenceSet(found))
        inputs.extend(records)
    if len(traces) >= 2:
        parts.extend(_ranks(parts, traces))
    evidence = EvidenceSet()
    for part in parts:
        evidence = evidence.merged(part)
    return judge(evidence, inputs=inputs, captures=captures, target=target, window=window, config=config)


def _ranks(parts: list[EvidenceSet], traces: dict[int, list[Evidence]]) -> list[EvidenceSet]:
    """Put several traces' evidence in ``parts`` in rank order (in place); their cross-rank evidence."""
    from diagnose.derive import ranks

    slots = list(traces)
    found = list(traces.values())
    for slot, i in zip(slots, ranks.order(found), strict=True):
        parts[slot] = EvidenceSet(found[i])
    return [EvidenceSet(ranks.derive(found))]


def _loose(path: str, exposition: bool = False) -> documents.Found:
    """A loose input: a document (trace, snapshot, Nsight export) by ``diagnose.documents``, else text
    by ``diagnose.loose``, imported only then (its line parsers are most of a run's start-up).
    ``exposition``: a Prometheus scrape diagnose took, read by the exposition readers alone."""
    if path != "-":
        found = None if exposition else documents.read_path(path)
        if found is not None:
            return found
        from diagnose import loose

        text = loose.read_text_file(path, modules=loose.EXPOSITION_MODULES if exposition else loose.SOURCE_MODULES)
        return text.evidence, text.inputs
    found, stream, compression = documents.read_stream("<stdin>", sys.stdin.buffer)
    if found is not None:
        return found
    from diagnose import loose

    text = loose.read_text("<stdin>", stream, compression)
    return text.evidence, text.inputs


def read_session(folder: str, label: str | None = None, series: bool = False) -> tuple[Session, Derived]:
    """The session in ``folder`` and its evidence; ``label`` (what the user passed, e.g. the .tar.gz
    it was extracted from) names the sources, never the private extraction folder. ``series``: also
    the time series of its text captures, from the same pass (``diagnose.tables`` draws them)."""
    from diagnose.derive import session as session_derive  # the collectors' parsers: sessions only

    session = load_session(folder, label=label)
    derived = session_derive.derive(session, series=series)
    if label is None or label == folder:
        return session, derived
    prefix = folder.rstrip(os.sep) + os.sep

    def name(p: str) -> str:
        return os.path.join(label, p[len(prefix):]) if p.startswith(prefix) else p

    renamed = session_derive.Derived(derived.evidence.with_sources(name),
                                     [dataclasses.replace(i, path=name(i.path)) for i in derived.inputs],
                                     derived.series)
    return session, renamed


def judge_session(folder: str, session: Session, derived: Derived,
                  config: Config | Mapping[str, Mapping[str, Any]] | None = None) -> Diagnosis:
    """The diagnosis of a session read by ``read_session`` (with the session's recorded rule settings
    unless ``config`` gives others)."""
    config = config or recorded_config(folder)
    return judge(derived.evidence, inputs=derived.inputs, captures=session.captures, target=session.target,
                 window=session.window, config=config)


def analyze_session(folder: str, label: str | None = None,
                    config: Config | Mapping[str, Mapping[str, Any]] | None = None) -> tuple[Session, Diagnosis]:
    """One opened session (see ``read_session``) and its diagnosis (see ``judge_session``)."""
    session, derived = read_session(folder, label)
    return session, judge_session(folder, session, derived, config)
