"""Pack a session into one ``.tar.gz`` for a ticket, with secrets and request payloads redacted.

``pack(session, out)`` copies the session (a folder, or an already packed ``.tar.gz``) file by file
into a staging folder, cleaning each file on the way, and writes ``OUT.tar.gz`` (by default
``SESSION.tar.gz`` beside the folder). An existing output is replaced only with ``force``
(``--force``). The archive holds one folder named like the session, so ``diagnose
analyze``/``report``/``dashboard`` open it as they open the folder (``diagnose.session_io.opened``).

What is done to each kind of file (and listed, file by file, in ``pack.json`` inside the archive):

* **Secrets, always** (``diagnose.redact``): command lines (``target.cmdline`` in
  ``manifest.json``, ``cmdline`` in ``process-info.json``, every ``process N:"…"`` part of a
  ``pyspy.raw`` record, chains of them included, through ``diagnose.collectors.pyspy.rewrite_commands``)
  through ``redact_argv``, as is every JSON list of strings (``"--api-key", "VALUE"``); every other
  string of a JSON document or line, and every line of a text file, through ``redact_text`` plus
  the forms it does not see: a quoted name (``'api_key': '…'``, ``'--hf-token', '…'``) and a
  command-line flag (``--api-key VALUE``, ``redact_command``); JSON fields named like a secret
  (``diagnose.redact.is_secret_name``: ``api_key``, ``HF_TOKEN``, ``auth_token``, ``DB_PASS``,
  ``api-key``…, not counts such as ``max_tokens``) replaced by ``***``. ``pyspy.raw`` frames are left
  as they are: they hold only function and file names, and ``redact_text`` would mangle ``auth.py:12``.
* **Request payloads, unless ``keep_payloads``**, in every file diagnose did not write itself (logs
  copied by attach, the probe's output, anything unknown). In JSON (a document, a line, or an object
  after a prefix such as ``vllm-1  | ``) the fields that carry prompts or outputs (``prompt``,
  ``messages``, ``input``, ``text``, ``output``, ``completion``, ``content``, ``images``, …) become
  ``"<redacted N chars>"``, and so does *every other string longer than* ``LONG_STRING`` (32) characters,
  whatever its key, unless the key names a measurement, an identity or log text (``KEPT_STRING_KEYS``:
  ``ts``, ``request_id``, ``status``, ``name``, ``model``, ``level``…, any key ending in ``_ms``, ``_s``,
  ``_tokens``, ``_bytes``, ``_count``, ``_id``…); numbers, booleans and null stay. Log text (``log``,
  ``msg``, ``message``, ``error``…: Docker's json-file ``{"log": …}``, structured loggers) is cleaned
  like a text log line, since that is what the log parsers read. In text lines vLLM's ``Received
  request …: prompt: '…'`` and ``prompt_token_ids: [...]``, the same ``key: '…'`` / ``key="…"`` forms of
  the payload field names, and ``"key": "…`` fragments longer than 32 characters (a JSON line cut short)
  are replaced likewise. A line with nothing to clean is kept byte for byte, so the stage log and the
  probe's lines parse as before. py-spy dumps lose their ``locals`` (the values of live variables; with
  ``keep_payloads`` they stay, but variables named like a key, token, secret or password show ``***``).
  Files written by diagnose itself (manifest, process samples, NVML samples, py-spy output, the
  diagnosis) hold no payloads and keep their fields.
* **Nsight Systems SQLite exports** are *sanitised, not dropped*, so that a packed session keeps
  its GPU evidence: the captured process environment (``META_DATA_CAPTURE`` rows
  ``…ENVIRONMENT_VARIABLE``, where tokens usually live) is deleted, the target's captured
  stdout/stderr (``ProcessStreams`` contents) is replaced unless ``keep_payloads`` (it can hold
  prompts), the recorded command lines go through ``redact_command``, every other text cell loses
  its secrets as a log line does (NVTX names, diagnostics) whatever its column is declared as
  (SQLite keeps text in ``VARCHAR``, ``INTEGER`` and untyped columns alike), and so does every blob
  that is UTF-8 text; and the database is ``VACUUM``-ed so that deleted rows do not survive in free pages. An export
  that cannot be opened as SQLite is left out (and said so).
* ``.nsys-rep``/``.qdrep`` reports are left out: a binary format that cannot be cleaned and holds
  the same environment (the SQLite export next to it carries the evidence).
* CUDA memory snapshots (pickles) are read with the restricted unpickler
  (``diagnose.collectors.snapshot.read_snapshot_file``: plain containers only, no code) and written again from
  what it read, so nothing appended after the pickle comes along; they hold allocator state and stack
  frames (file, line, function), no environment, arguments or tensor contents. A pickle that it refuses,
  or that is not shaped like a snapshot (a list of segments), is left out.
* Any other binary file, and a file that cannot be read, is left out, and named in ``pack.json``.

The archive's folder and the default output are named after the session's absolute path, so
``diagnose pack .`` writes ``../NAME.tar.gz``. An output that cannot be written (no permission, a
read-only or full file system) is an ``InputError``, and no partial archive is left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import shutil
import sqlite3
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diagnose import output, session_io
from diagnose.collectors.pyspy import rewrite_commands
from diagnose.collectors.snapshot import SnapshotError, check_plain, read_snapshot_file
from diagnose.documents import PICKLE_MAGIC, SQLITE_MAGIC
from diagnose.errors import InputError
from diagnose.model import RING_PROCESS, TOOL_VERSION, WATCH_FILE
from diagnose.redact import QUOTED as _QUOTED
from diagnose.redact import REDACTED, is_secret_name, redact_argv, redact_command, redact_secrets

PACK_NOTE = "pack.json"
PACK_SCHEMA = "diagnose/pack/v1"
NSYS_REPORTS = (".nsys-rep", ".qdrep")

PYSPY_RAW = "pyspy.raw"
PYSPY_RAWS = frozenset({PYSPY_RAW, "pyspy-wall.raw", "pyspy-cover.raw"})  # on-CPU, wall-clock, coverage records
PYSPY_DUMPS = "pyspy-dumps.jsonl"
# Written by diagnose itself, at the top of the session: secrets are redacted, but their fields are not
# request payloads (py-spy dumps lose their locals instead).
OWN_FILES = frozenset({"manifest.json", "diagnosis.json", "process-info.json", "pyspy-meta.json", "process.jsonl",
                       "nvml.jsonl", "pyspy.log", PYSPY_DUMPS, "attach-cost.json", "pyspy-wall-source.json",
                       "cgroup.json", "config.json", WATCH_FILE, RING_PROCESS})

# JSON fields whose values are what users sent or the model returned.
PAYLOAD_FIELDS = frozenset({
    "prompt", "prompts", "messages", "message_content", "input", "inputs", "text", "texts", "output", "outputs",
    "completion", "completions", "content", "contents", "images", "image", "image_url", "audio", "video",
    "generated_text", "response", "responses", "query", "queries", "documents", "document", "instruction",
    "system_prompt", "prompt_token_ids", "input_ids", "token_ids", "output_ids", "multi_modal_data",
})
# In JSON from files diagnose did not write (logs copied by attach, probe output, anything unknown) a string
# longer than this is redacted unless its key says it is a measurement, an identity or log text.
LONG_STRING = 32
KEPT_STRING_KEYS = frozenset({
    # time and identity
    "ts", "time", "timestamp", "datetime", "date", "asctime", "created", "id", "uuid", "request_id", "req_id",
    "trace_id", "span_id", "parent_id", "seq", "pid", "tid", "host", "hostname", "service", "service_name",
    "node", "rank", "device", "gpu", "dtype", "unit", "method", "route", "endpoint", "version",
    # what the record is
    "status", "status_code", "state", "stage", "phase", "name", "kind", "type", "event_type", "category",
    "level", "levelname", "severity", "logger", "logger_name", "module", "func", "funcname", "function",
    "filename", "file", "path", "lineno", "line", "thread", "thread_name", "process", "process_name", "stream",
    "model", "model_name", "served_model_name", "engine", "backend", "finish_reason", "stop_reason",
    "alloc_conf", "expandable_segments", "snapshot", "stages_path", "compile_log_path",
    # log text: cleaned like a text log line (vLLM prompts, secrets), which is what the parsers read
    "log", "msg", "message", "event", "error", "err", "exception", "exc_info", "stack_info", "traceback",
    "reason", "recent_reasons", "warning",
})
KEPT_STRING_SUFFIXES = ("_ms", "_s", "_us", "_ns", "_sec", "_secs", "_seconds", "_tokens", "_bytes", "_count",
                        "_id", "_ts", "_at", "_time", "_name", "_type", "_kind", "_status", "_level")

_PAYLOAD_NAMES = "|".join(sorted((re.escape(n) for n in PAYLOAD_FIELDS if not n.endswith("_ids")), key=len,
                                 reverse=True))
# `prompt: '…'` (vLLM), `text='…'` (SGLang's GenerateReqInput), `'content': '…'` (a logged messages list)
# a value whose closing quote (or bracket) never came runs to its line's end, never past it: a line cut short
# (a log read while the service wrote it, a truncated paste) still loses its prompt, and the next line stays
_LINE_END = r"(?=\r?\n|\Z)"
_UNCLOSED = rf"'(?:[^'\\\r\n]|\\[^\r\n])*\\?{_LINE_END}|\"(?:[^\"\\\r\n]|\\[^\r\n])*\\?{_LINE_END}"
_LOG_PAYLOAD = re.compile(rf"(?P<k>(?P<q>['\"]?)\b(?:{_PAYLOAD_NAMES})(?P=q)\s*[=:]\s*)"
                          rf"(?:(?P<v>{_QUOTED})|(?P<open>{_UNCLOSED}))")
_LOG_IDS = re.compile(r"(?P<k>\b(?:prompt_token_ids|input_ids|token_ids|output_ids|output_token_ids)"
                      r"(?P<q>['\"]?)\s*[=:]\s*)\[(?:(?P<v>[^\]\n]*)\]|(?P<open>[^\]\r\n]*)" + _LINE_END + ")")


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


def _kept_string(key: str) -> bool:
    k = key.lower()
    return k in KEPT_STRING_KEYS or k.endswith(KEPT_STRING_SUFFIXES)


def _clean_json(value: Any, payloads: bool, count: _Counter, key: str = "") -> Any:
    """A JSON value with secrets (and, when ``payloads``, request payloads) redacted.

    ``payloads`` is set for files diagnose did not write: there every string longer than ``LONG_STRING``
    whose key is not a measurement, identity or log-text key (``KEPT_STRING_KEYS``) is redacted, whatever
    the key is called. The items of a list are judged by the list's key.
    """
    secret = bool(key) and is_secret_name(key)
    if secret and isinstance(value, str) and value not in ("", REDACTED):
        count.secrets += 1
        return REDACTED
    if payloads and key in PAYLOAD_FIELDS and isinstance(value, str | list | dict) and value:
        count.payloads += 1
        return redacted_marker(value)
    if isinstance(value, dict):  # inside a secret (`"credentials": {"user": …, "value": …}`) every string is one
        return {k: _clean_json(v, payloads, count, key if secret else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        if len(value) > 1 and all(isinstance(a, str) for a in value):
            argv = list(redact_argv(value))  # a command line as a list: `"--api-key", "VALUE"`
            count.secrets += argv != value
            value = argv
        return [_clean_json(v, payloads, count, key) for v in value]
    if isinstance(value, str):
        if payloads and len(value) > LONG_STRING and not _kept_string(key):
            count.payloads += 1
            return redacted_marker(value)
        return clean_log_line(value, payloads, count)
    return value


_MARKER = re.compile(r"(<redacted \d+ chars>|\[<redacted \d+ token ids>\])")
# `"key": "a long string` inside a text line, or a JSON line cut short (no closing quote): judged like a
# JSON field when payloads are redacted
_JSON_LONG = re.compile(rf'(?P<k>"(?P<n>[^"\\\n]{{1,64}})"\s*:\s*")'
                        rf'(?P<v>(?:[^"\\\n]|\\.){{{LONG_STRING + 1},}})(?="|$)')
def clean_log_line(line: str, payloads: bool, count: _Counter) -> str:
    """One text log line: prompts/outputs removed when ``payloads``, then secrets redacted (always).

    Payloads go first so that ``redact_text`` (which treats ``…token…: value`` as a secret) does not
    take ``prompt_token_ids: [`` apart; the markers themselves are not passed through it.
    """
    if payloads:
        def value(m: re.Match[str]) -> str:
            count.payloads += 1
            v = m.group("v")
            if v is None:  # cut short: no closing quote to put back
                v = m.group("open")
                return f"{m.group('k')}{v[0]}{redacted_marker(v[1:])}"
            return f"{m.group('k')}{v[0]}{redacted_marker(v[1:-1])}{v[0]}"

        def ids(m: re.Match[str]) -> str:
            count.payloads += 1
            n = len([x for x in (m.group("v") or m.group("open")).split(",") if x.strip()])
            return f"{m.group('k')}[<redacted {n} token ids>]"

        def long_json(m: re.Match[str]) -> str:
            if _kept_string(m.group("n")):
                return m.group(0)
            count.payloads += 1
            return m.group("k") + redacted_marker(m.group("v"))

        line = _LOG_PAYLOAD.sub(value, _LOG_IDS.sub(ids, line))
        line = _JSON_LONG.sub(long_json, line) if '"' in line else line
    parts = _MARKER.split(line) if payloads else [line]
    out = "".join(p if i % 2 else redact_secrets(p) for i, p in enumerate(parts))
    count.secrets += out != line
    return out


def _clean_line(line: str, payloads: bool, count: _Counter, dumps: str = "") -> str:
    """A log line that is (or, after a prefix such as ``vllm-1  | ``, holds) a JSON object, cleaned like a
    JSON document; ``dumps`` ("drop"/"keep") for py-spy dump locals. A line with nothing to clean is
    returned as it was, byte for byte."""
    body = line.rstrip("\r\n")
    end = line[len(body):]
    start = body.find("{")
    if start < 0:
        return clean_log_line(line, payloads, count)
    try:
        doc, stop = _DECODER.raw_decode(body, start)
    except ValueError:
        return clean_log_line(line, payloads, count)
    if not isinstance(doc, dict):
        return clean_log_line(line, payloads, count)
    before = count.secrets + count.payloads
    if dumps:
        _locals(doc, count, drop=dumps == "drop")
    cleaned = json.dumps(_clean_json(doc, payloads, count), ensure_ascii=False)
    if count.secrets + count.payloads == before:
        cleaned = body[start:stop]  # nothing to clean: the object stays as it was written
    head, tail = body[:start], body[stop:]
    return (clean_log_line(head, payloads, count) if head else "") + cleaned + \
        (clean_log_line(tail, payloads, count) if tail else "") + end


_DECODER = json.JSONDecoder()
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


def _summary(count: _Counter, what_payload: str = "payload fields redacted ({})") -> list[str]:
    out = []
    if count.secrets:
        out.append(f"secrets redacted ({count.secrets} values)")
    if count.payloads:
        out.append(what_payload.format(count.payloads))
    return out or ["no secret or payload found"]


def _map_lines(src: str, dst: str, fn: Callable[[str], str]) -> None:
    with open(src, encoding="utf-8", errors="replace", newline="") as fin, \
            open(dst, "w", encoding="utf-8", newline="") as fout:
        for line in fin:
            fout.write(fn(line))


def _clean_text_file(name: str, src: str, dst: str, keep_payloads: bool, note: Note) -> None:
    count = _Counter()
    base = os.path.basename(name)
    own = name in OWN_FILES
    payloads = not keep_payloads and not own
    if base in PYSPY_RAWS:
        def cmd(text: str) -> str:
            out = redact_command(text)
            count.secrets += out != text
            return out

        shutil.copyfile(src, dst)
        rewrite_commands(dst, cmd)  # every `process N:"…"` of a line (--subprocesses chains them)
        note.add(name, f"command lines redacted ({count.secrets})" if count.secrets
                 else "no secret in the command lines")
        return
    if base.endswith(".json"):
        with open(src, encoding="utf-8", errors="replace") as fh:
            raw_text = fh.read()
        try:
            doc = json.loads(raw_text)
        except ValueError:
            _map_lines(src, dst, lambda line: _clean_line(line, payloads, count))
        else:
            cleaned = _clean_json(doc, payloads, count)
            if not count.secrets + count.payloads:
                shutil.copyfile(src, dst)
            else:
                with open(dst, "w", encoding="utf-8") as fh:
                    one_line = "\n" not in raw_text.strip()  # a parser may read it line by line: keep it one line
                    json.dump(cleaned, fh, indent=None if one_line else 2, ensure_ascii=False)
                    fh.write("\n")
        note.files.setdefault(name, []).extend(_summary(count))
        return
    dumps = "" if name != PYSPY_DUMPS else "keep" if keep_payloads else "drop"
    _map_lines(src, dst, lambda line: _clean_line(line, payloads, count, dumps))
    note.files.setdefault(name, []).extend(
        _summary(count, "local variables dropped ({} frames)" if dumps == "drop" else "prompts/outputs redacted ({})"))


def _quote(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def _redact_blob(value: Any) -> Any:
    """A blob cell that is UTF-8 text, redacted like a text cell (kept a blob); any other value as it is."""
    if not isinstance(value, bytes):
        return value
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        return value
    out = redact_secrets(text)
    return out.encode("utf-8") if out != text else value


def _redact_cells(con: sqlite3.Connection, table: str) -> int:
    """Every text cell of ``table`` cleaned of secrets, whatever its column is declared as (SQLite keeps
    text in INTEGER, VARCHAR and untyped columns alike), and every blob cell that is UTF-8 text."""
    t = _quote(table)
    cols = [str(r[1]) for r in con.execute(f"PRAGMA table_info({t})")]
    if not cols:
        return 0
    # one scan to find the columns that hold any text or blob cell (most Nsight columns hold only numbers)
    has = con.execute("SELECT " + ", ".join(f"MAX(typeof({_quote(c)}) IN ('text', 'blob'))" for c in cols)
                      + f" FROM {t}").fetchone()
    changed = 0
    for col, found in zip(cols, has, strict=True):
        if not found:
            continue
        c = _quote(col)
        changed += con.execute(f"UPDATE {t} SET {c} = diagnose_redact({c}) "
                               f"WHERE typeof({c}) = 'text' AND {c} != diagnose_redact({c})").rowcount
        changed += con.execute(f"UPDATE {t} SET {c} = diagnose_redact_blob({c}) "
                               f"WHERE typeof({c}) = 'blob' AND {c} != diagnose_redact_blob({c})").rowcount
    return changed


def _sanitize_sqlite(name: str, src: str, dst: str, keep_payloads: bool, note: Note) -> None:
    shutil.copyfile(src, dst)
    count = _Counter()
    try:
        con = sqlite3.connect(dst)
        try:
            con.create_function("diagnose_redact", 1, lambda s: redact_secrets(s) if isinstance(s, str) else s,
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
            con.create_function("diagnose_redact_blob", 1, _redact_blob, deterministic=True)
            for table in tables:
                if table.startswith("ENUM_"):
                    continue
                count.secrets += _redact_cells(con, table)
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


def _copy_snapshot(name: str, src: str, dst: str, note: Note) -> None:
    """A CUDA memory snapshot, written again from what the restricted unpickler read (so nothing hidden
    after the pickle, and no code, comes along); any other pickle is left out."""
    try:
        snap = read_snapshot_file(src)
        if isinstance(snap, list):  # very old snapshots were a bare list of segments
            ok = all(isinstance(s, dict) and "total_size" in s for s in snap)
        else:
            ok = isinstance(snap, dict) and isinstance(snap.get("segments"), list)
        if not ok:
            raise SnapshotError("no list of segments")
        check_plain(snap)
    except SnapshotError as exc:
        note.left_out[name] = (f"starts like a pickle, but not a CUDA memory snapshot the restricted unpickler "
                               f"accepts ({exc}); a pickle can hold anything, so it was not copied")
        return
    with open(dst, "wb") as fh:
        pickle.dump(snap, fh, protocol=4)
    note.add(name, "copied (a CUDA memory snapshot, read with a restricted unpickler: allocator state and "
                   "stack frames only)")


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
        _copy_snapshot(name, src, dst, note)
    else:
        note.left_out[name] = "a binary file of unknown format, which cannot be checked for secrets"


def default_output(session: str) -> str:
    """``SESSION.tar.gz`` beside the session folder (``.`` and ``incident/`` name the folder itself)."""
    path = os.path.abspath(session)
    return os.path.join(os.path.dirname(path), (os.path.basename(path) or "session") + ".tar.gz")


def _check_output(out: str, force: bool) -> None:
    if not out.endswith(session_io.PACK_SUFFIXES):
        raise InputError(f"{out} does not end in .tar.gz, the format a packed session has.",
                         "Pass an output name like incident.tar.gz.")
    output.check_file(out, force)


def _reset_owner(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack(session: str, out: str | None = None, keep_payloads: bool = False, force: bool = False) -> str:
    """Write the cleaned ``.tar.gz`` of ``session``; returns its path. See the module docstring."""
    if not os.path.exists(session):
        raise InputError(f"{session} does not exist.", "Pass the session folder `diagnose attach -o` wrote.")
    if out is None and not os.path.isdir(session):
        raise InputError(f"{session} is already packed, so there is no default output name.",
                         "Pass -o NEW.tar.gz to write a cleaned copy.")
    out = out or default_output(session)
    _check_output(out, force)
    parent = os.path.dirname(os.path.abspath(out))
    try:  # before the cleaning, which can take a while: can the archive be written there at all?
        fd, partial = tempfile.mkstemp(prefix=".pack-", suffix=".tar.gz", dir=parent)
        os.close(fd)
    except OSError as exc:
        raise InputError(f"cannot write {os.path.basename(out)} in {parent} ({exc.strerror or exc}).",
                         "Pass -o with a folder you can write to.") from None
    try:
        _pack_into(session, out, partial, keep_payloads, force)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(partial)
    return out


def _pack_into(session: str, out: str, partial: str, keep_payloads: bool, force: bool) -> None:
    note = Note(keep_payloads)
    with session_io.opened(session) as folder, tempfile.TemporaryDirectory(prefix="diagnose-pack-") as tmp:
        name = session_io.label(session)  # `diagnose pack .` names the folder itself
        stage = os.path.join(tmp, name or "session")
        try:
            os.makedirs(stage)
            _stage_files(folder, stage, keep_payloads, note, skip=(os.path.realpath(partial), os.path.realpath(out)))
            with open(os.path.join(stage, PACK_NOTE), "w", encoding="utf-8") as fh:
                json.dump(note.to_json(), fh, indent=2)
                fh.write("\n")
        except OSError as exc:
            raise InputError(f"could not copy the session into a temporary folder ({exc.strerror or exc}).",
                             "Free some space in the temporary folder (or point TMPDIR elsewhere) and retry.") from None
        try:
            with tarfile.open(partial, "w:gz") as tar:
                tar.add(stage, arcname=os.path.basename(stage), filter=_reset_owner)
            if os.path.lexists(out) and not force:
                raise InputError(f"{out} appeared while packing and diagnose does not overwrite it without "
                                 "--force.", output.REMEDY)
            os.replace(partial, out)
        except OSError as exc:
            raise InputError(f"could not write {out} ({exc.strerror or exc}).",
                             "Check the free space and permissions there, or pass -o with another folder.") from None


def _stage_files(folder: str, stage: str, keep_payloads: bool, note: Note, skip: tuple[str, ...]) -> None:
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
            if rel == PACK_NOTE or os.path.realpath(src) in skip:
                continue  # a repack writes a new note; `-o` inside the session: not the archive being written
            if os.path.islink(src) or not os.path.isfile(src):
                note.left_out[rel] = "a symbolic link" if os.path.islink(src) else "not a regular file"
                continue
            dst = os.path.join(stage, rel)
            try:
                _clean_file(rel, src, dst, keep_payloads, note)
            except PermissionError as exc:  # unreadable: the rest of the session is still worth a ticket
                with contextlib.suppress(OSError):
                    os.unlink(dst)
                note.files.pop(rel, None)
                note.left_out[rel] = f"could not be read ({exc.strerror or exc})"
