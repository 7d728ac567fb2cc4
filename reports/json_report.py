"""JSON: the source of truth; every other format is derived from it."""

from __future__ import annotations

import json

from analyzer.model import Diagnosis


def render(diagnosis: Diagnosis) -> str:
    return json.dumps(diagnosis.to_json(), indent=2, ensure_ascii=False) + "\n"
