"""The layers of DESIGN.md: record (collectors) → derive (diagnose.derive) → judge (rules).

Collectors parse text into records; turning records into evidence and statistics is the derive
step's. A collector that imports ``diagnose.derive`` (or rules, reports) has the layers backwards,
and the leaves every package may import (``diagnose.model``, the records' types, ``diagnose.units``, the
size units and the size and percentage formatters, and ``diagnose.stats``, the one quantile) import
nothing of ours.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from tests.conftest import ROOT

LEAVES = {"diagnose.model": "analyzer/model.py", "diagnose.units": "analyzer/units.py",
          "diagnose.stats": "analyzer/stats.py"}


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
            out.update(f"{node.module}.{a.name}" for a in node.names if node.module == "diagnose")
    return {m for m in out if m == "diagnose" or m.startswith("diagnose.")}


def _files(package: str) -> list[str]:
    folder = os.path.join(ROOT, package)
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".py"))


def test_collectors_import_only_collectors_and_the_model() -> None:
    wrong = {
        os.path.relpath(path, ROOT): sorted(m for m in _imports(path)
                                            if not m.startswith("diagnose.collectors") and m not in LEAVES)
        for path in _files("collectors")
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_leaves_import_nothing_of_ours() -> None:
    for leaf, path in LEAVES.items():
        assert _imports(os.path.join(ROOT, path)) == set(), leaf


def test_the_check_sees_a_backwards_import(tmp_path: Path) -> None:
    path = os.path.join(str(tmp_path), "bad.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("from diagnose.derive.timing import shape_spikes\n\ndef f():\n    from diagnose import rules\n"
                 "    import os\n")
    assert _imports(path) == {"diagnose.derive.timing", "diagnose", "diagnose.rules"}
