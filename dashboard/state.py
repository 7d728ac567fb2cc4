"""Which sessions the dashboard shows, which one is selected, and their cached loads.

Sessions come from the command line (``diagnose dashboard SESSION…`` runs ``streamlit run …/app.py --
SESSION…``) or, when it is set, from ``DIAGNOSE_SESSIONS`` (``os.pathsep``-separated; AppTest sets
it). Loading a session is ``diagnose.tables.load``, cached per path (and modification time) for the life of the server.
"""

from __future__ import annotations

import os
import sys

import streamlit as st

from diagnose import session_io, tables
from diagnose.errors import DiagnoseError
from diagnose.reports import data as report_data

ENV_SESSIONS = "DIAGNOSE_SESSIONS"


class StateKeys:
    """Every ``st.session_state`` key the dashboard uses, in one place."""

    SESSION = "diagnose.session"  # the selected session path (sidebar)
    BEFORE = "diagnose.compare.before"
    AFTER = "diagnose.compare.after"
    FLEET = "diagnose.fleet.document"  # the selected fleet document (diagnose fleet --format json)
    FLEET_REPLICA = "diagnose.fleet.replica"  # the replica drilled into
    SWEEP = "diagnose.sweep.document"


def _given() -> list[str]:
    env = os.environ.get(ENV_SESSIONS)
    raw = env.split(os.pathsep) if env is not None else sys.argv[1:]
    return [p for p in (s.strip() for s in raw) if p]


def session_paths() -> list[str]:
    """The session paths given to the dashboard, in order (empty when none); JSON documents (a fleet, a
    sweep) are not sessions: ``document_paths`` lists them."""
    return [p for p in _given() if not p.lower().endswith(".json")]


def document_paths() -> list[str]:
    """The fleet and sweep documents (``.json``) given to the dashboard, in order."""
    return [p for p in _given() if p.lower().endswith(".json")]


def labels(paths: list[str]) -> dict[str, str]:
    """A distinct short name for each path (``name``, ``name (2)`` … when folder names repeat)."""
    out: dict[str, str] = {}
    seen: dict[str, int] = {}
    for path in paths:
        base = session_io.label(path) or path
        seen[base] = seen.get(base, 0) + 1
        out[path] = base if seen[base] == 1 else f"{base} ({seen[base]})"
    return out


def _stamp(path: str) -> int:
    """Changes when the session on disk changes, so an edited session is read again."""
    manifest = os.path.join(path, "manifest.json")
    target = manifest if os.path.isfile(manifest) else path
    try:
        return os.stat(target).st_mtime_ns
    except OSError:
        return 0


@st.cache_resource(max_entries=16, show_spinner="Reading the session…")
def _load(path: str, stamp: int) -> report_data.SessionData:
    del stamp  # part of the cache key only
    return tables.load(path)


def load(path: str) -> tuple[report_data.SessionData | None, str]:
    """The session's data, or None and one sentence saying why it cannot be shown."""
    try:
        return _load(path, _stamp(path)), ""
    except DiagnoseError as exc:
        return None, str(exc)
    except Exception as exc:  # a session this version cannot read must not end in a traceback on the page
        return None, f"{path} could not be read ({type(exc).__name__}: {exc})."


def selected_path() -> str | None:
    """The session the sidebar selects (the first one when nothing was picked yet)."""
    paths = session_paths()
    if not paths:
        return None
    chosen = st.session_state.get(StateKeys.SESSION)
    return chosen if chosen in paths else paths[0]


def current() -> report_data.SessionData | None:
    """The selected session's data; shows the reason on the page and returns None when there is none."""
    path = selected_path()
    if path is None:
        st.error("No session was given to the dashboard. Start it with `diagnose dashboard SESSION…` "
                 "(a session folder or .tar.gz written by `diagnose attach`).")
        return None
    data, error = load(path)
    if data is None:
        st.error(error)
    return data
