"""The verdict's words, shared by every report format (terminal, markdown, HTML, dashboard)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from diagnose.model import Diagnosis, Mechanism, Severity
from diagnose.units import pct

HEALTHY_TEXT = "the evidence covers the service and shows no significant bottleneck."
# healthy from the requests' own figures (an engine's /metrics scrape) with nothing watching the host
HEALTHY_REQUESTS_ONLY_TEXT = ("the requests' latency and queue show no significant bottleneck; nothing given "
                              "watched the host (its CPU and CPU quota, the GPU): ")
UNDETERMINED_TEXT = "the evidence given is too thin to name a bottleneck; collect what the next steps say."


def undetermined_text(diagnosis: Diagnosis) -> str:
    """Why the verdict is undetermined: too little evidence, or an answer not sure enough to act on alone."""
    lead = diagnosis.leading
    if diagnosis.withheld and diagnosis.probability is not None:
        what = (f"the findings point to {lead.value}" if lead is not None
                else "nothing significant was found (healthy)")
        first = diagnosis.candidates[0] if diagnosis.candidates else None
        leads = ("" if first is None or first.category == (lead.value if lead is not None else "none")
                 else f" leads with {first.category} ({pct(first.probability)}) and")
        return (f"{what}, but at {pct(diagnosis.probability)} that is not sure enough to act on alone; the "
                f"differential{leads} says what separates the candidates.")
    stalled = next((f for f in diagnosis.findings if f.mechanism is Mechanism.STALLED), None)
    if stalled is not None:
        return f"{stalled.title[0].lower()}{stalled.title[1:]} ({stalled.code}); the next steps find where it is stuck."
    return UNDETERMINED_TEXT


def probability_text(diagnosis: Diagnosis) -> str:
    """`` (probability 92 %)`` for a verdict that has one, else empty."""
    return "" if diagnosis.probability is None else f" (probability {pct(diagnosis.probability)})"


def differential_rows(diagnosis: Diagnosis) -> list[tuple[str, str, str, str, str]]:
    """(candidate, probability, for, against, check) per candidate, best first: every format's differential."""
    return [(c.category, pct(c.probability), "; ".join(c.support) or "-", "; ".join(c.against) or "-", c.check)
            for c in diagnosis.candidates]


def healthy_text(diagnosis: Diagnosis) -> str:
    """Why the verdict is healthy: a note that explains what was seen, or evidence that covers the service."""
    note = next((f for f in diagnosis.findings if f.severity is Severity.INFO), None)
    if note is not None:
        return f"nothing significant in the evidence given; {note.title[:1].lower()}{note.title[1:]} ({note.code})."
    if diagnosis.next_steps:  # the host was not observed: the step that would see it
        step = diagnosis.next_steps[0]
        return HEALTHY_REQUESTS_ONLY_TEXT + step[:1].lower() + step[1:]
    return HEALTHY_TEXT


def config_line(config: Mapping[str, Any]) -> str:
    """The rule settings a diagnosis was judged with, in one line (``diagnose.config`` records them)."""
    parts = [f"{code}.{k} = {v:g}" for code, t in sorted(dict(config.get("rules", {})).items())
             for k, v in sorted(dict(t).items())]
    if config.get("disable"):
        parts.append("disabled: " + ", ".join(sorted(config["disable"])))
    return f"{config.get('path') or 'settings'}: " + ("; ".join(parts) or "no change")


def watch_lines(diagnosis: Diagnosis) -> list[str]:
    """A ``diagnose watch`` session's trigger and what rose over its ring before it, one sentence each
    (empty for any other session)."""
    by_key = {e.key: e for e in diagnosis.evidence}
    trigger = by_key.get("watch.trigger")
    if trigger is None:
        return []
    rises = [e.detail for k, e in sorted(by_key.items()) if k.startswith("watch.before.") and e.detail]
    return [f"Trigger: {trigger.detail}.", *(f"Before it, {r}." for r in rises)]
