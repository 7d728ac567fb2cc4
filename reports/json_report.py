"""JSON: the source of truth; every other format is derived from it."""

from __future__ import annotations

from diagnose.model import Diagnosis


def render(diagnosis: Diagnosis) -> str:
    return diagnosis.to_json_text()
