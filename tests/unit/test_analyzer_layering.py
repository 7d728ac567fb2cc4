"""The analyzer never imports a presenter: derivation produces the evidence and the time series
(``diagnose.session_data``, filled by ``diagnose.tables``), and ``reports`` / ``dashboard`` read them.

Only the command line renders, so only its modules (the ``diagnose`` commands that print or write a
report) may import ``reports``; every other module of ``analyzer/`` (``analyzer/derive`` included),
at its top or inside a function, may not.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRESENTERS = ("diagnose.reports", "diagnose.dashboard")
# the command line: each renders what its command asked for (--format, -o); output.py is its
# registry of formats, the one table that names each format's presenter
COMMANDS = {"analyzer/cli.py", "analyzer/cli_fleet.py", "analyzer/demo.py", "analyzer/fleet_demo.py",
            "analyzer/output.py"}


def _imported(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, anywhere in the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)  # `from diagnose import reports`
    return out


def _presenters(path: Path) -> list[str]:
    return sorted(m for m in _imported(path) if any(m == p or m.startswith(p + ".") for p in PRESENTERS))


def test_no_analyzer_module_imports_a_presenter() -> None:
    files = sorted(ROOT.glob("analyzer/**/*.py"))
    assert len(files) > 40 and ROOT / "analyzer" / "tables.py" in files and ROOT / "analyzer" / "attach.py" in files
    offenders = {rel: found for path in files
                 if (rel := path.relative_to(ROOT).as_posix()) not in COMMANDS and (found := _presenters(path))}
    assert offenders == {}


def test_the_commands_listed_exist() -> None:
    assert all((ROOT / rel).is_file() for rel in COMMANDS)


def test_the_check_sees_every_kind_of_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import diagnose.reports.html\nfrom diagnose.reports.data import SessionData\n\n"
                   "def f():\n    from diagnose.dashboard import state\n    from diagnose import reports\n"
                   "    from . import reports as r\n    from diagnose import model\n", encoding="utf-8")
    assert _presenters(bad) == ["diagnose.dashboard", "diagnose.dashboard.state", "diagnose.reports",
                                "diagnose.reports.data", "diagnose.reports.data.SessionData", "diagnose.reports.html"]


def test_the_tables_read_each_text_capture_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stage logs, probe lines and scrapes are read by the derivation, in one pass that gives both their
    evidence and their time series; ``diagnose.tables`` opens none of them again."""
    from diagnose import loose, tables
    from tests import sessions

    folder = sessions.demo_session()
    manifest = json.loads((Path(folder) / "manifest.json").read_text(encoding="utf-8"))
    text = {f for c in manifest["captures"] if c["collector"] in ("log", "metrics", "probe") for f in c["files"]}
    assert text  # the demo session has a stage log and metrics scrapes
    passes: Counter[str] = Counter()
    real_pass = loose.analyze_path
    monkeypatch.setattr(loose, "analyze_path", lambda path, extra=(), modules=loose.SOURCE_MODULES: (
        passes.update([os.path.basename(path)]), real_pass(path, extra, modules))[1])
    by_tables: list[str] = []
    real_open = builtins.open

    def watched(file: Any, *args: Any, **kwargs: Any) -> Any:
        code = sys._getframe(1).f_code
        if code.co_filename == tables.__file__ and code.co_name != "_is_file_kind":  # that one reads a magic number
            by_tables.append(os.path.basename(str(file)))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", watched)
    data = tables.load(folder)
    assert data.has("requests") and data.has("metrics")
    assert {f: passes[f] for f in text} == dict.fromkeys(text, 1)
    assert text.isdisjoint(by_tables)
