"""A session as tables: the ``SessionData`` every report (HTML, the dashboard) draws from.

The tables themselves are the analyzer's (``diagnose.session_data``: ``SessionData``, ``COLUMNS``,
``make_table``), re-exported here for the presenters; ``diagnose.tables.load(path)`` fills them from a
session with the analyzer's derivations (presenters in ``reports`` and ``dashboard`` import no
collector, and the analyzer imports no presenter). This module adds the summary tables of a diagnosis.
"""

from __future__ import annotations

import pandas as pd

from diagnose.model import FIRST_REQUESTS as FIRST_REQUESTS  # re-exported for the figures (cold start)
from diagnose.redact import redact_text
from diagnose.session_data import COLUMNS as COLUMNS
from diagnose.session_data import MEMORY_PARTS as MEMORY_PARTS
from diagnose.session_data import TABLES as TABLES
from diagnose.session_data import SessionData as SessionData
from diagnose.session_data import empty_table as empty_table
from diagnose.session_data import make_table as make_table

# ---------------------------------------------------------------------------------------------
# summary tables
# ---------------------------------------------------------------------------------------------


def capture_table(data: SessionData) -> pd.DataFrame:
    """One row per capture: collector, status, reason, remedy, files."""
    rows = [{"collector": c.collector, "status": c.status.value, "reason": redact_text(c.reason),
             "remedy": redact_text(c.remedy), "files": ", ".join(c.files)} for c in data.diagnosis.captures]
    return pd.DataFrame(rows, columns=["collector", "status", "reason", "remedy", "files"])


def findings_table(data: SessionData) -> pd.DataFrame:
    """The ranked findings: rank, code, category, severity, confidence, impact, title."""
    rows = [{"rank": i + 1, "code": f.code, "category": f.label, "severity": f.severity.value,
             "confidence": f.confidence.value, "impact": float(f.impact), "title": redact_text(f.title)}
            for i, f in enumerate(data.diagnosis.findings)]
    return pd.DataFrame(rows, columns=["rank", "code", "category", "severity", "confidence", "impact", "title"])
