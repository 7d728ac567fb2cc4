"""Where diagnose's answers go: one registry of output formats, and outputs never overwritten unasked.

Formats: each kind of answer has one small table, format name → ``Format`` (the writer that renders
the answer onto a stream, and the file suffix that names the format):

* ``DIAGNOSIS``: ``analyze``, ``attach`` and ``demo`` print a diagnosis as text or JSON;
* ``SESSION_REPORT``: ``report`` writes a session as Markdown, one HTML file or JSON;
* ``DOCUMENT``: ``fleet``, ``sweep`` (and ``report`` of their JSON) write text, Markdown, HTML or JSON;
* ``COMPARISON`` / ``SWEEP_COMPARISON``: ``compare`` prints text, Markdown or JSON.

``Formats.pick`` chooses the format from ``--format``, else from the ``-o`` suffix, else the table's
default; ``Formats.write`` renders the whole answer first, then writes it to stdout or to the file.

Overwriting: no file that exists is replaced unless the command was given ``--force``
(``check_file``, ``write_file``). A session folder (``attach -o``, ``demo -o``) may be new or
empty; one that already holds a session is replaced only with ``--force`` (its contents are removed
first, so no evidence of the earlier window mixes with the new one; the folder itself stays, so
``-o .`` works); a non-empty folder that is not a session is never written into, ``--force`` or not:
diagnose empties only a folder that holds one of its sessions.
Each refusal is one ``InputError`` sentence naming the path and the remedy (exit code 2).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import IO, Any, Generic, TypeVar

from diagnose.errors import InputError
from diagnose.model import Diagnosis, Severity

T = TypeVar("T")
Writer = Callable[[T, IO[str]], object]  # what it returns is not used


@dataclass(frozen=True)
class Format(Generic[T]):
    write: Writer[T]  # renders the answer onto the stream
    suffix: str  # the file suffix that names this format (".md"); the default for a file written in it
    aliases: tuple[str, ...] = ()  # other suffixes read as this format (".markdown")


class Formats(Generic[T]):
    """The formats one kind of answer can be written in (see the module docstring)."""

    def __init__(self, what: str, default: str, table: Mapping[str, Format[T]]) -> None:
        assert default in table
        self.what, self.default, self.table = what, default, dict(table)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.table)

    def suffix(self, fmt: str) -> str:
        return self.get(fmt).suffix

    def get(self, fmt: str) -> Format[T]:
        found = self.table.get(fmt)
        if found is None:
            raise InputError(f"there is no {self.what} format {fmt!r}.", f"Pass --format {'|'.join(self.table)}.")
        return found

    def pick(self, fmt: str | None, output: str | None = None) -> str:
        """``--format`` if given, else the format the ``-o`` file's suffix names, else the default."""
        if fmt:
            self.get(fmt)
            return fmt
        if not output:
            return self.default
        suffix = os.path.splitext(output)[1].lower()
        for name, f in self.table.items():
            if suffix in (f.suffix, *f.aliases):
                return name
        names = ", ".join(f.suffix for f in self.table.values())
        raise InputError(f"cannot tell the {self.what} format from the name {output}.",
                         f"Name the file {names}, or pass --format {'|'.join(self.table)}.")

    def render(self, fmt: str, answer: T) -> str:
        buf = io.StringIO()
        self.get(fmt).write(answer, buf)
        return buf.getvalue()

    def write(self, fmt: str, answer: T, output: str | None = None, *, force: bool = False) -> None:
        """The whole answer to ``output`` (never over an existing file unless ``force``), or to stdout."""
        text = self.render(fmt, answer)  # whole before anything is written: a failure leaves no half file
        if output:
            write_file(output, text, force=force)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()


# --- the tables ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shown:
    """A diagnosis as ``analyze``/``attach``/``demo`` print it (``verbose``: every rule that could not judge)."""

    diagnosis: Diagnosis
    verbose: bool = False


def _diagnosis_text(shown: Shown, out: IO[str]) -> None:
    from diagnose.reports import terminal

    terminal.render(shown.diagnosis, file=out, verbose=shown.verbose)


def _diagnosis_json(shown: Shown, out: IO[str]) -> None:
    from diagnose.reports import json_report

    out.write(json_report.render(shown.diagnosis))


DIAGNOSIS: Formats[Shown] = Formats("diagnosis", "text", {
    "text": Format(_diagnosis_text, ".txt"),
    "json": Format(_diagnosis_json, ".json"),
})


@dataclass(frozen=True)
class SessionRef:
    """A session folder or .tar.gz to report on, with the rule settings to judge it by (None: its own)."""

    path: str
    settings: Any = None


def _session_diagnosis(ref: SessionRef) -> Diagnosis:
    from diagnose import pipeline, session_io

    session_io.require(ref.path)
    return pipeline.analyze([ref.path], config=ref.settings)


def _report_md(ref: SessionRef, out: IO[str]) -> None:
    from diagnose.reports import markdown

    out.write(markdown.render(_session_diagnosis(ref)))


def _report_html(ref: SessionRef, out: IO[str]) -> None:
    from diagnose import session_io, tables
    from diagnose.reports import html

    session_io.require(ref.path)
    out.write(html.render(tables.load(ref.path, config=ref.settings)))


def _report_json(ref: SessionRef, out: IO[str]) -> None:
    from diagnose.reports import json_report

    out.write(json_report.render(_session_diagnosis(ref)))


SESSION_REPORT: Formats[SessionRef] = Formats("report", "md", {
    "md": Format(_report_md, ".md", (".markdown",)),
    "html": Format(_report_html, ".html", (".htm",)),
    "json": Format(_report_json, ".json"),
})

Document = Mapping[str, Any]  # a `diagnose fleet` or `diagnose sweep` JSON document


def _renderer(doc: Document) -> Any:
    """The module that renders this document: ``diagnose.reports.fleet`` or ``diagnose.reports.sweep``."""
    if doc.get("schema") == "diagnose/fleet/v1":
        from diagnose.reports import fleet

        return fleet
    from diagnose.reports import sweep

    return sweep


def _json(doc: Any, out: IO[str]) -> None:
    out.write(json.dumps(doc, indent=2, ensure_ascii=False) + "\n")


DOCUMENT: Formats[Document] = Formats("document", "text", {
    "text": Format(lambda doc, out: out.write(_renderer(doc).render_text(doc)), ".txt"),
    "json": Format(_json, ".json"),
    "md": Format(lambda doc, out: out.write(_renderer(doc).render_markdown(doc)), ".md", (".markdown",)),
    "html": Format(lambda doc, out: out.write(_renderer(doc).render_html(doc)), ".html", (".htm",)),
})


def _compare() -> Any:
    from diagnose.reports import compare

    return compare


COMPARISON: Formats[Any] = Formats("comparison", "text", {  # a diagnose.reports.compare.Comparison of two sessions
    "text": Format(lambda c, out: out.write(_compare().render_text(c)), ".txt"),
    "md": Format(lambda c, out: out.write(_compare().render_markdown(c)), ".md", (".markdown",)),
    "json": Format(lambda c, out: _json(_compare().to_json(c), out), ".json"),
})

SWEEP_COMPARISON: Formats[dict[str, Any]] = Formats("comparison", "text", {  # compare.compare_sweeps(...)
    "text": Format(lambda c, out: out.write(_compare().render_sweeps_text(c)), ".txt"),
    "md": Format(lambda c, out: out.write(_compare().render_sweeps_markdown(c)), ".md", (".markdown",)),
    "json": Format(_json, ".json"),
})


def emit(diagnosis: Diagnosis, fmt: str, fail_on: str, verbose: bool = False) -> int:
    """Print the diagnosis in ``fmt`` on stdout; the exit code: 1 when a finding reaches ``fail_on``, else 0."""
    DIAGNOSIS.get(fmt).write(Shown(diagnosis, verbose), sys.stdout)
    sys.stdout.flush()  # the answer is whole now, not after the interpreter's teardown
    if fail_on != "never":
        floor = Severity(fail_on).rank
        if any(f.severity.rank >= floor for f in diagnosis.findings):
            return 1
    return 0


# --- never overwriting --------------------------------------------------------------------------

REMEDY = "Pass --force to replace it, or another name with -o."


def exists_error(path: str) -> InputError:
    return InputError(f"{path} already exists and diagnose does not overwrite it without --force.", REMEDY)


def check_file(path: str, force: bool = False) -> None:
    """Before the work: can ``path`` be written (its folder exists, it is not a folder, new or ``force``)?"""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputError(f"the folder {parent} for {os.path.basename(path)} does not exist.",
                         "Create it first or pass another -o.")
    if os.path.isdir(path):
        raise InputError(f"{path} is a folder, not a file to write to.", "Pass a file name with -o.")
    if os.path.lexists(path) and not force:
        raise exists_error(path)


def write_file(path: str, text: str, force: bool = False) -> None:
    """Write ``text`` to ``path``: created new (an existing file is refused) unless ``force``."""
    check_file(path, force)
    try:
        with open(path, "w" if force else "x", encoding="utf-8") as fh:
            fh.write(text)
    except FileExistsError:  # appeared since the check
        raise exists_error(path) from None
    except OSError as exc:
        raise InputError(f"could not write {path} ({exc.strerror or exc}).",
                         "Check that the folder is writable, or pass another -o.") from None


def _holds_session(folder: str) -> bool:
    from diagnose.session_io import MANIFEST

    return os.path.isfile(os.path.join(folder, MANIFEST))


def check_session_folder(path: str, force: bool = False) -> None:
    """Before the work: may a session be written into the folder ``path`` (see the module docstring)?"""
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        raise InputError(f"{path} exists and is not a folder to write a session into.", "Pass another name with -o.")
    if not os.listdir(path):
        return
    if not _holds_session(path):
        raise InputError(f"{path} is a folder that is not empty and holds no diagnose session, so diagnose does "
                         "not write into it.", "Pass a new or empty folder with -o (--force replaces only a session).")
    if not force:
        raise InputError(f"{path} already holds a session and diagnose does not overwrite it without --force.",
                         REMEDY)


def make_session_folder(path: str, force: bool = False) -> None:
    """Create the folder a session is written into: new, empty, or (``force``) an old session's, emptied."""
    check_session_folder(path, force)
    try:
        if os.path.isdir(path):  # an old session, and force: none of its files stay (the folder itself does)
            for name in os.listdir(path):
                entry = os.path.join(path, name)
                if os.path.isdir(entry) and not os.path.islink(entry):
                    shutil.rmtree(entry)
                else:
                    os.remove(entry)
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{path} could not be made ready for the session: {exc.strerror or exc}.",
                         "Pass a folder you can write to with -o.") from exc
