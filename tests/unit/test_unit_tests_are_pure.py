"""No unit test module starts a process: no import of subprocess or multiprocessing, no demo service.

Tests that start real processes (the demo service, py-spy, a fresh interpreter, openssl, …) live in
tests/integration. This reads the unit tests' source; tests/unit/conftest.py also refuses, while each
unit test runs, any process that the code under test would start.
"""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULES = ("subprocess", "multiprocessing", "concurrent.futures.process", "pty")
NAMES = {"Popen", "ProcessPoolExecutor", "DemoService", "DemoFleet", "PrometheusServer", "background_load"}
OS_CALLS = {"system", "fork", "forkpty", "posix_spawn", "posix_spawnp", "popen", "execv", "execvp", "spawnv",
            "spawnvp", "spawnl", "spawnlp"}


def _offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where} imports {a.name}" for a in node.names if a.name.startswith(MODULES)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(MODULES):
                found.append(f"{where} imports from {node.module}")
            found += [f"{where} imports {a.name}" for a in node.names if a.name in NAMES]
        elif isinstance(node, ast.Name) and node.id in NAMES:
            found.append(f"{where} uses {node.id}")
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
              and node.attr in OS_CALLS):
            found.append(f"{where} calls os.{node.attr}")
    return found


def test_unit_tests_start_no_process() -> None:
    # conftest.py imports subprocess to refuse it; this file names what it looks for
    offences = [o for path in sorted(HERE.glob("test_*.py")) if path.name != Path(__file__).name
                for o in _offences(path)]
    assert offences == [], "move these tests to tests/integration: " + "; ".join(offences)


def test_the_check_sees_what_it_is_for(tmp_path: Path) -> None:
    bad = tmp_path / "test_bad.py"
    bad.write_text("import os\nimport subprocess\nfrom multiprocessing import Pool\n"
                   "from diagnose.examples.demo import DemoService\nos.system('true')\n")
    assert [o.split(" ", 1)[1] for o in _offences(bad)] == [
        "imports subprocess", "imports from multiprocessing", "imports DemoService", "calls os.system"]
