"""The layers of DESIGN.md: record (collectors) → derive (analyzer.derive) → judge (rules).

Collectors parse text into records; turning records into evidence and statistics is the derive
step's. A collector that imports ``analyzer.derive`` (or rules, reports) has the layers backwards,
and the leaves every package may import (``analyzer.model``, the records' types, and ``analyzer.units``, the
size units and the size and percentage formatters) import nothing of ours.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from tests.conftest import ROOT

OURS = ("analyzer", "collectors", "rules", "reports", "dashboard", "examples")
LEAVES = ("analyzer.model", "analyzer.units")


def _imports(path: str) -> set[str]:
    """Every module of ours a file imports, at the top or inside a function."""
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names if node.module in OURS)
    return {m for m in out if m.split(".")[0] in OURS}


def _files(package: str) -> list[str]:
    folder = os.path.join(ROOT, package)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py"))


def test_collectors_import_only_collectors_and_the_model() -> None:
    wrong = {
        os.path.relpath(path, ROOT): sorted(m for m in _imports(path)
                                            if not m.startswith("collectors") and m not in LEAVES)
        for path in _files("collectors")
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_leaves_import_nothing_of_ours() -> None:
    for leaf in LEAVES:
        assert _imports(os.path.join(ROOT, *leaf.split(".")) + ".py") == set(), leaf


def test_the_check_sees_a_backwards_import(tmp_path: Path) -> None:
    path = os.path.join(str(tmp_path), "bad.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("from analyzer.derive.timing import shape_spikes\n\ndef f():\n    from rules import base\n")
    assert _imports(path) == {"analyzer.derive.timing", "rules", "rules.base"}
