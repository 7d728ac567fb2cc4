"""The request stages of a diagnosis, read from its evidence: one row per stage, largest share first.

Derivation put each stage's percentiles and share in the evidence (``stage.<name>_ms.p50``,
``stage.<name>_ms.p99``, ``stage.<name>.share``); this turns them into the rows every presenter shows
(the terminal and Markdown tables, the HTML report, the ``stage_stats`` table of ``SessionData``).
"""

from __future__ import annotations

from diagnose.model import Diagnosis


def stage_rows(diagnosis: Diagnosis) -> list[tuple[str, float | None, float | None, float | None]]:
    """(stage, p50 ms, p99 ms, share of end-to-end) for every stage with timings, by share."""
    ev = {e.key: e.value for e in diagnosis.evidence}
    stages = sorted({k[len("stage."):].split("_ms.")[0] for k in ev if k.startswith("stage.") and "_ms." in k})

    def num(key: str) -> float | None:
        v = ev.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    rows = [(s, num(f"stage.{s}_ms.p50"), num(f"stage.{s}_ms.p99"), num(f"stage.{s}.share")) for s in stages]
    return sorted(rows, key=lambda r: -(r[3] or 0.0))
