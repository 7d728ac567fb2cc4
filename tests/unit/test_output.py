"""The output registry (format → writer and suffix), no output overwritten without --force, no import cycle."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
from pathlib import Path
from typing import Any

import pytest

from diagnose import attach, output
from diagnose.cli import build_parser
from diagnose.errors import InputError
from diagnose.fleet import summarise
from tests.cli import Ran, run_cli
from tests.conftest import DATA, ROOT
from tests.unit.test_fleet import _data, _replica
from tests.unit.test_sweep import ONE_WORKER, _doc

SESSION = os.path.join(DATA, "sessions", "healthy_light_load_demo")
OTHER = os.path.join(DATA, "sessions", "queueing_one_worker_demo")


def _refused(r: Ran, path: Path | str) -> None:
    """Exit 2 and one sentence that names the path and the remedy, no traceback, nothing on stdout."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert len(lines) == 1 and lines[0].startswith("diagnose: ") and "Traceback" not in r.stderr, r.stderr
    assert str(path) in lines[0] and "--force" in lines[0], lines[0]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fleet_doc() -> dict[str, Any]:
    return summarise(_data([_replica("a:1", waiting=0, running=2, rps=5, queue_ms=5, e2e_ms=400),
                            _replica("b:1", waiting=9, running=8, rps=5, queue_ms=900, e2e_ms=3000)]))


def _choices(command: str, option: str = "--format") -> tuple[str, ...]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    parser = sub.choices[command]  # type: ignore[index]
    return tuple(next(a for a in parser._actions if option in a.option_strings).choices)


# --- the registry ---------------------------------------------------------------------------------


def test_each_command_offers_the_formats_of_its_table() -> None:
    assert _choices("analyze") == _choices("attach") == _choices("demo") == output.DIAGNOSIS.names == ("text", "json")
    assert _choices("report") == output.SESSION_REPORT.names == ("md", "html", "json")
    assert _choices("compare") == output.COMPARISON.names == output.SWEEP_COMPARISON.names
    assert set(_choices("fleet")) == set(_choices("sweep")) == set(output.DOCUMENT.names)
    assert set(output.DOCUMENT.names) == {"text", "json", "md", "html"}
    for table in (output.DIAGNOSIS, output.SESSION_REPORT, output.DOCUMENT, output.COMPARISON):
        suffixes = [s for f in table.table.values() for s in (f.suffix, *f.aliases)]
        assert len(suffixes) == len(set(suffixes)) and all(s.startswith(".") for s in suffixes)


@pytest.mark.parametrize("fmt", output.SESSION_REPORT.names)
def test_report_writes_each_format_named_by_its_suffix(fmt: str, tmp_path: Path) -> None:
    out = tmp_path / f"r{output.SESSION_REPORT.suffix(fmt)}"
    r = run_cli("report", SESSION, "-o", str(out))
    assert r.returncode == 0 and r.stderr.strip() == f"{fmt} report written to {out}", r.stderr
    text = out.read_text()
    assert text == run_cli("report", SESSION, "--format", fmt).stdout  # the same writer to stdout
    if fmt == "md":
        assert text.startswith("# Diagnosis")
    elif fmt == "html":
        assert text.lstrip().lower().startswith("<!doctype html>") and 'id="diagnosis"' in text
    else:
        assert json.loads(text)["schema"].startswith("diagnose/diagnosis/")


@pytest.mark.parametrize("fmt", output.DOCUMENT.names)
@pytest.mark.parametrize("kind", ["fleet", "sweep"])
def test_each_document_format_renders_fleets_and_sweeps(fmt: str, kind: str, tmp_path: Path) -> None:
    doc = _fleet_doc() if kind == "fleet" else _doc(ONE_WORKER)
    text = output.DOCUMENT.render(fmt, doc)
    assert text.strip()
    if fmt == "json":
        assert json.loads(text) == json.loads(json.dumps(doc))
    if fmt == "html":
        assert "<html" in text.lower()
    if fmt != "text":  # `diagnose report` of a saved document writes the same
        saved = tmp_path / "doc.json"
        saved.write_text(json.dumps(doc))
        out = tmp_path / f"out{output.DOCUMENT.suffix(fmt)}"
        assert run_cli("report", str(saved), "-o", str(out)).returncode == 0
        assert out.read_text() == text


@pytest.mark.parametrize("fmt", output.DIAGNOSIS.names)
def test_analyze_prints_each_diagnosis_format(fmt: str) -> None:
    r = run_cli("analyze", SESSION, "--format", fmt)
    assert r.returncode == 0 and r.stdout.strip()
    if fmt == "json":
        assert json.loads(r.stdout)["schema"].startswith("diagnose/diagnosis/")
    else:
        assert "diagnose" in r.stdout.splitlines()[0]


@pytest.mark.parametrize("fmt", output.COMPARISON.names)
def test_compare_prints_each_format(fmt: str, tmp_path: Path) -> None:
    r = run_cli("compare", SESSION, OTHER, "--format", fmt)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc(ONE_WORKER)))
    b.write_text(json.dumps(_doc(ONE_WORKER[:3])))
    r = run_cli("compare", str(a), str(b), "--format", fmt)
    assert r.returncode == 0 and r.stdout.strip(), r.stderr
    if fmt == "json":
        assert json.loads(r.stdout)["schema"] == "diagnose/compare-sweep/v1"


def test_the_format_follows_the_suffix_then_the_default() -> None:
    pick = output.SESSION_REPORT.pick
    assert pick(None, None) == "md" and pick(None, "a.MARKDOWN") == "md" and pick(None, "x/a.htm") == "html"
    assert pick("json", "a.md") == "json"  # --format wins over the suffix
    assert output.DOCUMENT.pick(None, "fleet.txt") == "text" and output.DOCUMENT.pick(None, None) == "text"
    with pytest.raises(InputError, match=r"cannot tell the report format from the name a\.pdf") as err:
        pick(None, "a.pdf")
    assert ".md, .html, .json" in err.value.remedy
    with pytest.raises(InputError, match="there is no report format 'pdf'"):
        output.SESSION_REPORT.get("pdf")


@pytest.mark.parametrize("args", [["--format", "pdf"], ["-o", "report.pdf"]])
def test_an_unknown_format_is_one_sentence_and_exit_2(args: list[str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    r = run_cli("report", SESSION, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and r.stdout == "" and len(lines) == 1 and lines[0].startswith("diagnose: ")
    assert "pdf" in lines[0] and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())


# --- never overwriting ------------------------------------------------------------------------------


def test_report_refuses_an_existing_file_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "report.md"
    out.write_text("mine")
    _refused(run_cli("report", SESSION, "-o", str(out)), out)
    assert out.read_text() == "mine"
    assert run_cli("report", SESSION, "-o", str(out), "--force").returncode == 0
    assert out.read_text().startswith("# Diagnosis")
    saved = tmp_path / "sweep.json"
    saved.write_text(json.dumps(_doc(ONE_WORKER)))
    _refused(run_cli("report", str(saved), "-o", str(out)), out)  # a document's report: the same rule
    assert run_cli("report", str(saved), "-o", str(out), "--force").returncode == 0
    assert "knee" in out.read_text()


def test_report_still_refuses_a_folder_or_a_missing_folder(tmp_path: Path) -> None:
    r = run_cli("report", SESSION, "-o", str(tmp_path), "--force")
    assert r.returncode == 2 and "is a folder, not a file" in r.stderr
    r = run_cli("report", SESSION, "-o", str(tmp_path / "no" / "r.md"))
    assert r.returncode == 2 and "does not exist" in r.stderr


def test_fleet_and_sweep_refuse_an_existing_file_before_any_work(tmp_path: Path) -> None:
    out = tmp_path / "doc.json"
    out.write_text("mine")
    url = f"http://127.0.0.1:{_closed_port()}"
    _refused(run_cli("fleet", "--prometheus", url, "-o", str(out)), out)
    _refused(run_cli("sweep", f"{url}/infer", "--duration", "1", "-o", str(out)), out)
    assert out.read_text() == "mine"
    # --force: the work is tried (and fails on the closed port, leaving the file as it was)
    r = run_cli("fleet", "--prometheus", url, "--timeout", "5", "-o", str(out), "--force")
    assert r.returncode == 2 and "cannot reach Prometheus" in r.stderr
    r = run_cli("sweep", f"{url}/infer", "--duration", "1", "-o", str(out), "--force")
    assert r.returncode == 2 and "did not answer" in r.stderr
    assert out.read_text() == "mine"


def test_write_file_refuses_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "a.txt"
    output.write_file(str(out), "one")
    with pytest.raises(InputError, match="already exists") as err:
        output.write_file(str(out), "two")
    assert err.value.remedy == output.REMEDY and out.read_text() == "one"
    output.write_file(str(out), "two", force=True)
    assert out.read_text() == "two"


def _session_copy(where: Path) -> Path:
    shutil.copytree(SESSION, where)
    return where


def test_attach_refuses_an_existing_session_before_the_window(tmp_path: Path) -> None:
    old = _session_copy(tmp_path / "s")
    pid = str(os.getpid())  # a Python process: attach gets as far as the output check, and stops there
    _refused(run_cli("attach", "--pid", pid, "--duration", "1", "-o", str(old)), old)
    (tmp_path / "s.tar.gz").write_bytes(b"old")
    _refused(run_cli("attach", "--pid", pid, "--duration", "1", "-o", str(tmp_path / "s.tar.gz")),
             tmp_path / "s.tar.gz")
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    r = run_cli("attach", "--pid", pid, "--duration", "1", "-o", str(notes), "--force")
    assert r.returncode == 2 and "holds no diagnose session" in r.stderr and len(r.stderr.splitlines()) == 1
    assert (notes / "todo.txt").read_text() == "mine"
    assert sorted(os.listdir(old)) == sorted(os.listdir(SESSION))


def test_a_session_folder_is_new_empty_or_replaced_only_when_forced(tmp_path: Path) -> None:
    output.make_session_folder(str(tmp_path / "new"))
    output.make_session_folder(str(tmp_path / "new"))  # empty: written into
    old = _session_copy(tmp_path / "old")
    (old / "stale-evidence.txt").write_text("from the earlier window")
    with pytest.raises(InputError, match="already holds a session"):
        output.make_session_folder(str(old))
    output.make_session_folder(str(old), force=True)
    assert list(old.iterdir()) == []  # nothing of the earlier session stays to mix with the new one
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="is not a folder"):
        output.make_session_folder(str(tmp_path / "file"), force=True)


def test_forcing_the_session_folder_one_is_in_empties_it_and_keeps_it(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    old = _session_copy(tmp_path / "here")
    monkeypatch.chdir(old)
    output.make_session_folder(".", force=True)  # -o . inside the old session
    assert old.is_dir() and list(old.iterdir()) == []


def test_a_session_folder_that_cannot_be_made_is_one_sentence(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(InputError, match="could not be made ready"):
        output.make_session_folder(str(tmp_path / "file" / "session"))


def test_demo_refuses_an_existing_session_or_report_before_starting(tmp_path: Path) -> None:
    old = _session_copy(tmp_path / "before")
    _refused(run_cli("demo", "--pathology", "healthy", "-o", str(old)), old)
    md = tmp_path / "fresh.md"
    md.write_text("mine")
    _refused(run_cli("demo", "--pathology", "healthy", "-o", str(tmp_path / "fresh")), md)
    assert md.read_text() == "mine" and not (tmp_path / "fresh").exists()
    # -o X.tar.gz: the folder is X and the reports X.md / X.html, checked before anything starts
    packed_md = tmp_path / "packed.md"
    packed_md.write_text("mine")
    _refused(run_cli("demo", "--pathology", "healthy", "-o", str(tmp_path / "packed.tar.gz")), packed_md)
    assert not (tmp_path / "packed").exists() and not (tmp_path / "packed.tar.gz").exists()


def test_a_demo_without_o_writes_a_new_session_every_run() -> None:
    """`make demo` twice: the default session is named by the service's pid and the second, never reused."""
    name = attach.default_output(4242)
    assert re.fullmatch(r"diagnose-4242-\d{8}T\d{6}Z", name)


# --- the import graph -------------------------------------------------------------------------------


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The analyzer modules ``path`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


# the source folders and the package each is installed as (pyproject's package-dir)
PACKAGE_DIRS = {"analyzer": "diagnose", "collectors": "diagnose.collectors", "rules": "diagnose.rules",
                "reports": "diagnose.reports", "dashboard": "diagnose.dashboard", "examples": "diagnose.examples"}


def test_no_import_cycle_in_the_package() -> None:
    """No module of diagnose imports, at the top or inside a function, one that imports it back (the
    cli/demo, rules engine/verdict/report model, markdown/terminal and demo service package cycles gone)."""
    # analyzer/derive/nvml.py is diagnose.derive.nvml, rules/engine.py diagnose.rules.engine
    files = {".".join((pkg, *p.relative_to(ROOT, folder).with_suffix("").parts)).removesuffix(".__init__"): p
             for folder, pkg in PACKAGE_DIRS.items() for p in Path(ROOT, folder).rglob("*.py")}
    graph = {m: _imports(p, set(files)) - {m, "diagnose"} for m, p in files.items()}
    assert len(files) > 150 and "diagnose.rules.engine" in graph["diagnose.pipeline"]
    assert "diagnose.demo" in graph["diagnose.cli"] and "diagnose.cli" not in graph["diagnose.demo"]

    def path_back(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start:
                    return [*trail, start]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
        return None

    cycles = [c for m in sorted(graph) if (c := path_back(m))]
    assert cycles == [], "import cycles: " + "; ".join(" → ".join(c) for c in cycles)
