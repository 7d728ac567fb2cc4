"""Pack a session into one ``.tar.gz`` for a ticket, with secrets and request payloads redacted.

``pack(session, out)`` copies the session (a folder, or an already packed ``.tar.gz``) file by file
into a staging folder, cleaning each file on the way, and writes ``OUT.tar.gz`` (by default
``SESSION.tar.gz`` beside the folder). An existing output is never overwritten. The archive holds
one folder named like the session, so ``diagnose analyze``/``report``/``dashboard`` open it as
they open the folder (``analyzer.session_io.opened``).

What is done to each kind of file (and listed, file by file, in ``pack.json`` inside the archive):

* **Secrets, always** (``analyzer.redact``): command lines (``target.cmdline`` in
  ``manifest.json``, ``cmdline`` in ``process-info.json``, the ``process N:"…"`` prefixes of
  ``pyspy.raw``) through ``redact_argv``; every other string of a JSON document, every line of a
  text file through ``redact_text``; JSON fields named like a secret (``api_key``, ``password``,
  ``authorization``…) replaced by ``***``. ``pyspy.raw`` frames are left as they are: they hold
  only function and file names, and ``redact_text`` would mangle ``auth.py:12``.
* **Request payloads, unless ``keep_payloads``**: in JSON lines (stage logs, probe output, any
  JSONL log) the fields that carry prompts or outputs (``prompt``, ``messages``, ``input``,
  ``text``, ``output``, ``completion``, ``content``, ``images``, …) become ``"<redacted N chars>"``;
  in text logs vLLM's ``Received request …: prompt: '…'`` and ``prompt_token_ids: [...]`` and the
  same ``key: '…'`` / ``key="…"`` forms of those field names are replaced likewise; py-spy dumps
  lose their ``locals`` (the values of live variables; with ``keep_payloads`` they stay, but
  variables named like a key, token, secret or password show ``***``). Files written by diagnose itself
  (manifest, process samples, NVML samples, the diagnosis) hold no payloads and keep their fields.
* **Nsight Systems SQLite exports** are *sanitised, not dropped*, so that a packed session keeps
  its GPU evidence: the captured process environment (``META_DATA_CAPTURE`` rows
  ``…ENVIRONMENT_VARIABLE``, where tokens usually live) is deleted, the target's captured
  stdout/stderr (``ProcessStreams`` contents) is replaced unless ``keep_payloads`` (it can hold
  prompts), the recorded command lines go through ``redact_command`` and every other text cell
  through ``redact_text`` (NVTX names, diagnostics),
  and the database is ``VACUUM``-ed so that deleted rows do not survive in free pages. An export
  that cannot be opened as SQLite is left out (and said so).
* ``.nsys-rep``/``.qdrep`` reports are left out: a binary format that cannot be cleaned and holds
  the same environment (the SQLite export next to it carries the evidence).
* CUDA memory snapshots (pickles) are copied as they are: they hold allocator state and stack
  frames (file, line, function), no environment, arguments or tensor contents.
* Any other binary file is left out, and named in ``pack.json``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from analyzer import session_io
from analyzer.errors import InputError
from analyzer.model import TOOL_VERSION
from analyzer.redact import REDACTED, redact_argv, redact_command, redact_text

PACK_NOTE = "pack.json"
PACK_SCHEMA = "diagnose/pack/v1"
SQLITE_MAGIC = b"SQLite format 3\x00"
PICKLE_MAGIC = b"\x80"
NSYS_REPORTS = (".nsys-rep", ".qdrep")

# Written by diagnose itself: secrets are redacted, but their fields are not request payloads.
OWN_FILES = frozenset({"manifest.json", "diagnosis.json", "process-info.json", "pyspy-meta.json", "process.jsonl",
                       "nvml.jsonl", "pyspy.log"})
PYSPY_RAW = "pyspy.raw"
PYSPY_DUMPS = "pyspy-dumps.jsonl"

# JSON fields whose values are what users sent or the model returned.
PAYLOAD_FIELDS = frozenset({
    "prompt", "prompts", "messages", "message_content", "input", "inputs", "text", "texts", "output", "outputs",
    "completion", "completions", "content", "contents", "images", "image", "image_url", "audio", "video",
    "generated_text", "response", "responses", "query", "queries", "documents", "document", "instruction",
    "system_prompt", "prompt_token_ids", "input_ids", "token_ids", "output_ids", "multi_modal_data",
})
_SECRET_FIELD = re.compile(
    r"(?i)^(?:.*(?:api[_-]?key|secret|password|passwd|credential|access[_-]?key|private[_-]?key|authorization)"
    r".*|token|auth|access_token|refresh_token|id_token|bearer|cookie|set-cookie)$")

_QUOTED = r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\""
_PAYLOAD_NAMES = "|".join(sorted((re.escape(n) for n in PAYLOAD_FIELDS if not n.endswith("_ids")), key=len,
                                 reverse=True))
# `prompt: '…'` (vLLM), `text='…'` (SGLang's GenerateReqInput), `'content': '…'` (a logged messages list)
_LOG_PAYLOAD = re.compile(rf"(?P<k>(?P<q>['\"]?)\b(?:{_PAYLOAD_NAMES})(?P=q)\s*[=:]\s*)(?P<v>{_QUOTED})")
_LOG_IDS = re.compile(r"(?P<k>\b(?:prompt_token_ids|input_ids|token_ids|output_ids|output_token_ids)"
                      r"(?P<q>['\"]?)\s*[=:]\s*)\[(?P<v>[^\]]*)\]")


@dataclass
class Note:
    """What was done to the files, by name; written to ``pack.json``."""

    keep_payloads: bool
    files: dict[str, list[str]] = field(default_factory=dict)
    left_out: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, action: str) -> None:
        self.files.setdefault(name, []).append(action)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": PACK_SCHEMA,
            "tool_version": TOOL_VERSION,
            "payloads": "kept" if self.keep_payloads else "redacted",
            "secrets": "redacted",
            "files": {k: self.files[k] for k in sorted(self.files)},
            "left_out": {k: self.left_out[k] for k in sorted(self.left_out)},
        }


def redacted_marker(value: Any) -> str:
    n = len(value) if isinstance(value, str) else len(json.dumps(value, ensure_ascii=False))
    return f"<redacted {n} chars>"


@dataclass
class _Counter:
    secrets: int = 0
    payloads: int = 0


def _clean_json(value: Any, payloads: bool, count: _Counter, key: str = "") -> Any:
    """A JSON value with secrets (and, when ``payloads``, request payloads) redacted."""
    if key and _SECRET_FIELD.match(key) and isinstance(value, str) and value not in ("", REDACTED):
        count.secrets += 1
        return REDACTED
    if payloads and key in PAYLOAD_FIELDS and isinstance(value, str | list | dict) and value:
        count.payloads += 1
        return redacted_marker(value)
    if key == "cmdline" and isinstance(value, list) and all(isinstance(a, str) for a in value):
        out = list(redact_argv(value))
        count.secrets += out != value
        return out
    if isinstance(value, dict):
        return {k: _clean_json(v, payloads, count, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean_json(v, payloads, count) for v in value]
    if isinstance(value, str):
        out_s = redact_text(value)
        count.secrets += out_s != value
        return out_s
    return value


_MARKER = re.compile(r"(<redacted \d+ chars>|\[<redacted \d+ token ids>\])")


def clean_log_line(line: str, payloads: bool, count: _Counter) -> str:
    """One text log line: prompts/outputs removed when ``payloads``, then secrets redacted (always).

    Payloads go first so that ``redact_text`` (which treats ``…token…: value`` as a secret) does not
    take ``prompt_token_ids: [`` apart; the markers themselves are not passed through it.
    """
    if payloads:
        def value(m: re.Match[str]) -> str:
            count.payloads += 1
            v = m.group("v")
            return f"{m.group('k')}{v[0]}{redacted_marker(v[1:-1])}{v[0]}"

        def ids(m: re.Match[str]) -> str:
            count.payloads += 1
            n = len([x for x in m.group("v").split(",") if x.strip()])
            return f"{m.group('k')}[<redacted {n} token ids>]"

        line = _LOG_PAYLOAD.sub(value, _LOG_IDS.sub(ids, line))
    parts = _MARKER.split(line) if payloads else [line]
    out = "".join(p if i % 2 else redact_text(p) for i, p in enumerate(parts))
    count.secrets += out != line
    return out


def _clean_jsonl_line(line: str, payloads: bool, count: _Counter, dumps: str = "") -> str:
    """A JSON line cleaned like a JSON document; ``dumps`` ("drop"/"keep") for py-spy dump locals."""
    body = line.rstrip("\r\n")
    end = line[len(body):]
    try:
        doc = json.loads(body)
    except ValueError:
        return clean_log_line(line, payloads, count)
    if dumps:
        _locals(doc, count, drop=dumps == "drop")
    return json.dumps(_clean_json(doc, payloads, count), ensure_ascii=False) + (end or "")


_SECRET_LOCAL = re.compile(r"(?i)key|token|secret|passw|auth|credential|cookie")


def _locals(doc: Any, count: _Counter, drop: bool) -> None:
    """py-spy dump frames: drop ``locals`` (live values), or keep them but hide secret-named ones."""
    if isinstance(doc, dict):
        found = doc.get("locals")
        if found and drop:
            doc["locals"] = None
            count.payloads += 1
        elif isinstance(found, list):
            for var in found:
                if isinstance(var, dict) and _SECRET_LOCAL.search(str(var.get("name", ""))) and var.get("repr"):
                    var["repr"] = REDACTED
                    count.secrets += 1
        for v in doc.values():
            _locals(v, count, drop)
    elif isinstance(doc, list):
        for v in doc:
            _locals(v, count, drop)


def _summary(count: _Counter, what_payload: str = "payload fields") -> list[str]:
    out = []
    if count.secrets:
        out.append(f"secrets redacted ({count.secrets} values)")
    if count.payloads:
        out.append(f"{what_payload} redacted ({count.payloads})")
    return out or ["no secret or payload found"]


def _map_lines(src: str, dst: str, fn: Callable[[str], str]) -> None:
    with open(src, encoding="utf-8", errors="replace", newline="") as fin, \
            open(dst, "w", encoding="utf-8", newline="") as fout:
        for line in fin:
            fout.write(fn(line))


def _clean_text_file(name: str, src: str, dst: str, keep_payloads: bool, note: Note) -> None:
    count = _Counter()
    base = os.path.basename(name)
    payloads = not keep_payloads and base not in OWN_FILES
    if base == PYSPY_RAW:
        rx = re.compile(r'^(process \d+:")(.*?)(";)')

        def raw(line: str) -> str:
            m = rx.match(line)
            if not m:
                return line
            cmd = redact_command(m.group(2))
            count.secrets += cmd != m.group(2)
            return m.group(1) + cmd + m.group(3) + line[m.end():]

        _map_lines(src, dst, raw)
        done = f"command lines redacted ({count.secrets} lines)" if count.secrets else "no secret in the command lines"
        note.add(name, done)
        return
    if base.endswith(".json"):
        with open(src, encoding="utf-8", errors="replace") as fh:
            raw_text = fh.read()
        try:
            doc = json.loads(raw_text)
        except ValueError:
            _map_lines(src, dst, lambda line: clean_log_line(line, payloads, count))
        else:
            with open(dst, "w", encoding="utf-8") as fh:
                json.dump(_clean_json(doc, payloads, count), fh, indent=2, ensure_ascii=False)
                fh.write("\n")
        note.files.setdefault(name, []).extend(_summary(count))
        return
    dumps = "" if base != PYSPY_DUMPS else "keep" if keep_payloads else "drop"
    _map_lines(src, dst, lambda line: _clean_jsonl_line(line, payloads, count, dumps)
               if line.lstrip().startswith("{") else clean_log_line(line, payloads, count))
    note.files.setdefault(name, []).extend(
        _summary(count, "local variables dropped" if dumps == "drop" else "prompts/outputs"))


def _sanitize_sqlite(name: str, src: str, dst: str, keep_payloads: bool, note: Note) -> None:
    shutil.copyfile(src, dst)
    count = _Counter()
    try:
        con = sqlite3.connect(dst)
        try:
            con.create_function("diagnose_redact", 1, lambda s: redact_text(s) if isinstance(s, str) else s,
                                deterministic=True)
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")
                      if not str(r[0]).startswith("sqlite_")]
            con.create_function("diagnose_redact_command", 1,
                                lambda s: redact_command(s) if isinstance(s, str) else s, deterministic=True)
            env = 0
            if "META_DATA_CAPTURE" in tables:
                env = con.execute("DELETE FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE%'").rowcount
                # command lines: `--api-key VALUE` is a secret that redact_text alone does not see
                count.secrets += con.execute(
                    "UPDATE META_DATA_CAPTURE SET value = diagnose_redact_command(value) "
                    "WHERE (name LIKE '%COMMAND%' OR name LIKE '%ARGUMENT%') "
                    "AND value != diagnose_redact_command(value)").rowcount
            streams = 0
            if not keep_payloads and "ProcessStreams" in tables and "StringIds" in tables:
                streams = con.execute(
                    "UPDATE StringIds SET value = '<redacted ' || length(value) || ' chars>' "
                    "WHERE id IN (SELECT contentId FROM ProcessStreams)").rowcount
            for table in tables:
                if table.startswith("ENUM_"):
                    continue
                cols = [r[1] for r in con.execute(f'PRAGMA table_info("{table}")') if "TEXT" in str(r[2]).upper()]
                for col in cols:
                    count.secrets += con.execute(
                        f'UPDATE "{table}" SET "{col}" = diagnose_redact("{col}") '
                        f'WHERE "{col}" IS NOT NULL AND "{col}" != diagnose_redact("{col}")').rowcount
            con.commit()
            con.execute("VACUUM")  # deleted and overwritten values must not survive in free pages
        finally:
            con.close()
    except sqlite3.Error as exc:
        os.unlink(dst)
        note.left_out[name] = (f"an Nsight export that could not be cleaned ({exc}); it may hold the environment "
                               "of the profiled process")
        return
    for leftover in (dst + "-journal", dst + "-wal", dst + "-shm"):
        if os.path.exists(leftover):
            os.unlink(leftover)
    actions = [f"environment variables deleted ({env})"] if env else []
    if streams:
        actions.append(f"captured stdout/stderr of the process redacted ({streams})")
    actions += [f"secrets redacted ({count.secrets} cells)"] if count.secrets else []
    note.files.setdefault(name, []).extend(actions or ["no environment, secret or process output found"])


def _is_binary(path: str) -> bytes | None:
    """The head of a binary file, or None for text."""
    with open(path, "rb") as fh:
        head = fh.read(8192)
    return head if b"\x00" in head or head.startswith(PICKLE_MAGIC) else None


def _clean_file(name: str, src: str, dst: str, keep_payloads: bool, note: Note) -> None:
    head = _is_binary(src)
    if head is None:
        _clean_text_file(name, src, dst, keep_payloads, note)
    elif head.startswith(SQLITE_MAGIC):
        _sanitize_sqlite(name, src, dst, keep_payloads, note)
    elif name.endswith(NSYS_REPORTS):
        note.left_out[name] = ("an Nsight Systems report: binary, cannot be cleaned, holds the profiled process's "
                               "environment (its SQLite export carries the evidence)")
    elif head.startswith(PICKLE_MAGIC):
        shutil.copyfile(src, dst)
        note.add(name, "copied as is (a CUDA memory snapshot: allocator state and stack frames only)")
    else:
        note.left_out[name] = "a binary file of unknown format, which cannot be checked for secrets"


def default_output(session: str) -> str:
    return os.path.normpath(session) + ".tar.gz"


def _check_output(out: str) -> None:
    if not out.endswith(session_io.PACK_SUFFIXES):
        raise InputError(f"{out} does not end in .tar.gz, the format a packed session has.",
                         "Pass an output name like incident.tar.gz.")
    if os.path.lexists(out):
        raise InputError(f"{out} already exists and diagnose pack does not overwrite files.",
                         "Remove it first or pass another name with -o.")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise InputError(f"the folder {parent} for {os.path.basename(out)} does not exist.",
                         "Create it first or pass -o with an existing folder.")


def _reset_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack(session: str, out: str | None = None, keep_payloads: bool = False) -> str:
    """Write the cleaned ``.tar.gz`` of ``session``; returns its path. See the module docstring."""
    if not os.path.exists(session):
        raise InputError(f"{session} does not exist.", "Pass the session folder `diagnose attach -o` wrote.")
    if out is None and not os.path.isdir(session):
        raise InputError(f"{session} is already packed, so there is no default output name.",
                         "Pass -o NEW.tar.gz to write a cleaned copy.")
    out = out or default_output(session)
    _check_output(out)
    note = Note(keep_payloads)
    with session_io.opened(session) as folder, tempfile.TemporaryDirectory(prefix="diagnose-pack-") as tmp:
        name = os.path.basename(os.path.normpath(session))
        for suffix in session_io.PACK_SUFFIXES:
            name = name.removesuffix(suffix)
        stage = os.path.join(tmp, name or "session")
        os.makedirs(stage)
        for root, dirs, files in os.walk(folder):
            dirs.sort()
            rel_root = os.path.relpath(root, folder)
            for d in dirs:
                if os.path.islink(os.path.join(root, d)):
                    note.left_out[os.path.normpath(os.path.join(rel_root, d))] = "a symbolic link"
                else:
                    os.makedirs(os.path.join(stage, rel_root, d), exist_ok=True)
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
            for f in sorted(files):
                rel = os.path.normpath(os.path.join(rel_root, f))
                src = os.path.join(root, f)
                if rel == PACK_NOTE:
                    continue  # a repack writes a new note
                if os.path.islink(src) or not os.path.isfile(src):
                    note.left_out[rel] = "a symbolic link" if os.path.islink(src) else "not a regular file"
                    continue
                _clean_file(rel, src, os.path.join(stage, rel), keep_payloads, note)
        with open(os.path.join(stage, PACK_NOTE), "w", encoding="utf-8") as fh:
            json.dump(note.to_json(), fh, indent=2)
            fh.write("\n")
        fd, partial = tempfile.mkstemp(prefix=".pack-", suffix=".tar.gz", dir=os.path.dirname(os.path.abspath(out)))
        os.close(fd)
        try:
            with tarfile.open(partial, "w:gz") as tar:
                tar.add(stage, arcname=os.path.basename(stage), filter=_reset_owner)
            if os.path.lexists(out):
                raise InputError(f"{out} appeared while packing and diagnose pack does not overwrite files.",
                                 "Remove it first or pass another name with -o.")
            os.replace(partial, out)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return out
