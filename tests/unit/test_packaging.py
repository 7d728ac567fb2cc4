"""One installed name: the card's folders are the package ``diagnose`` and its subpackages.

``pyproject.toml`` maps analyzer/ to ``diagnose`` and collectors/, rules/, reports/, dashboard/ and
examples/ to ``diagnose.<folder>``. These tests hold the source to that: no module imports a folder
by its bare name (it would work only from a checkout, and never from the wheel), and every package
folder is listed, so none is left out of the wheel. tests/integration/test_wheel.py installs the wheel.
"""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

from tests.conftest import ROOT

FOLDERS = {"analyzer": "diagnose", "collectors": "diagnose.collectors", "rules": "diagnose.rules",
           "reports": "diagnose.reports", "dashboard": "diagnose.dashboard", "examples": "diagnose.examples"}
TREES = (*FOLDERS, "tests", "benchmarks", "docs")


def _python_files() -> list[str]:
    out = []
    for tree in TREES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, tree)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            out += [os.path.join(dirpath, f) for f in filenames if f.endswith(".py")]
    return out


def _bare_imports(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
        found += [n for n in names if n.split(".")[0] in FOLDERS]
    return found


def test_no_module_imports_a_folder_by_its_bare_name() -> None:
    files = _python_files()
    assert len(files) > 200  # the walk found the tree
    bare = {os.path.relpath(p, ROOT): names for p in files if (names := _bare_imports(p))}
    assert not bare, f"import these through the diagnose namespace (diagnose.…): {bare}"


def test_the_check_sees_a_bare_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom rules.base import Rule\nimport collectors.nvml as nvml\nfrom . import x\n")
    assert _bare_imports(str(bad)) == ["rules.base", "collectors.nvml"]


def test_every_package_folder_is_installed_under_diagnose() -> None:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        setuptools = tomllib.load(f)["tool"]["setuptools"]
    assert setuptools["package-dir"] == {name: folder for folder, name in FOLDERS.items()}
    listed = set(setuptools["packages"])
    on_disk = set()
    for folder, name in FOLDERS.items():
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, os.path.join(ROOT, folder))
                on_disk.add(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    assert listed == on_disk
    assert all(p == "diagnose" or p.startswith("diagnose.") for p in listed)


def test_the_demo_fleets_scrape_is_the_tested_one() -> None:
    """examples/data ships a copy of a tests/data/dcgm scrape (the wheel has no tests/): the same bytes."""
    name = "t4_busy_util91_engine16_power_capped_ericsson.prom"
    with open(os.path.join(ROOT, "examples", "data", name), "rb") as a, \
            open(os.path.join(ROOT, "tests", "data", "dcgm", name), "rb") as b:
        assert a.read() == b.read()
