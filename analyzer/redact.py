"""Redact secrets from command lines, environment-like text and logs before they are stored."""

from __future__ import annotations

import re
from collections.abc import Sequence

REDACTED = "***"
_SECRET_NAME = r"(?:api[_-]?key|token|secret|password|passwd|pwd|auth|credential|access[_-]?key|private[_-]?key)"
_FLAG = re.compile(rf"^--?[\w-]*{_SECRET_NAME}[\w-]*$", re.IGNORECASE)
_ASSIGN = re.compile(rf"(?P<k>\b[\w.-]*{_SECRET_NAME}[\w.-]*\s*[=:]\s*)(?P<v>\"[^\"]*\"|'[^']*'|[^\s,;&]+)",
                     re.IGNORECASE)
# names that contain a secret word but hold counts and settings, which are evidence, not secrets
_NOT_SECRET = re.compile(r"tokens|token_?ids?|tokeni[sz]|token_?count|per_\w*token"
                         r"|#\w*token|(?:new|cached|input|output|prompt|gen(?:eration)?|total|max)[-_]token\b",
                         re.IGNORECASE)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?%?")
_SECRET_KEY = re.compile(rf"{_SECRET_NAME}|cookie|bearer|passphrase|(?:^|[_.-])pass(?:$|[_.-])", re.IGNORECASE)
_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_KNOWN_TOKENS = re.compile(
    r"\b(hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|xox[abprs]-[A-Za-z0-9-]{10,}"
    r"|AKIA[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{20,})\b"
)
_URL_CRED = re.compile(r"(?P<s>\b[a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@", re.IGNORECASE)


def redact_text(text: str) -> str:
    text = _KNOWN_TOKENS.sub(REDACTED, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    text = _URL_CRED.sub(lambda m: f"{m.group('s')}{REDACTED}@", text)

    def assign(m: re.Match[str]) -> str:
        key = m.group("k")
        # counts and ratios named like a token (#token: 198432, token_ratio=0.4) are evidence: tokens are not numbers
        if _NOT_SECRET.search(key) or ("token" in key.lower() and _NUMBER.fullmatch(m.group("v"))):
            return m.group(0)
        return f"{key}{REDACTED}"

    return _ASSIGN.sub(assign, text)


def is_secret_name(name: str) -> bool:
    """Whether a field or variable called ``name`` holds a secret (``HF_TOKEN``, ``auth_token``, ``DB_PASS``,
    ``api-key``, ``Set-Cookie``…), not a count or setting named like one (``max_tokens``, ``tokenizer``)."""
    return bool(_SECRET_KEY.search(name)) and not _NOT_SECRET.search(name)


def redact_argv(argv: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        if _FLAG.match(arg) and not _NOT_SECRET.search(arg.split("=", 1)[0]):
            out.append(arg)
            hide_next = True
            continue
        out.append(redact_text(arg))
    return tuple(out)


def redact_command(cmd: str) -> str:
    """A command line as one string (py-spy's ``process N:"…"`` prefix)."""
    return " ".join(redact_argv(cmd.split(" ")))


# a quoted string (either quote, backslash escapes), for the patterns of this module and pack's
QUOTED = r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\""
# `'api_key': 'x'` / `"HF_TOKEN": "x"` (a logged dict or JSON text) and `'--api-key', 'x'` (a logged argv list):
# forms redact_text does not see, as the quote sits between the name and the colon or the value
_QUOTED_NAME = re.compile(rf"(?P<q>['\"])(?P<n>--?[\w.-]+|[\w.-]+)(?P=q)\s*(?P<sep>[:,])\s*"
                          rf"(?=(?P<v>{QUOTED}|\[[^\]]*\]|[^\s,;&}}\]]+))")
# a word in a command line that may be a secret flag (`--api-key VALUE`): a superset of redact_argv's test
# (a letter after the dashes: `-----Inter-token Latency---` is a ruler, not a flag)
_FLAG_HINT = re.compile(r"(?:^| )--?(?=[a-z])[\w-]*(?:key|token|secret|pass|pwd|auth|credential)", re.IGNORECASE)
_NO_VALUE = frozenset({"None", "null", "true", "false", "''", '""', "[]", REDACTED, f"'{REDACTED}'", f'"{REDACTED}"'})


def _quoted_secrets(text: str) -> str:
    if "'" not in text and '"' not in text:
        return text
    spans = []
    for m in _QUOTED_NAME.finditer(text):  # the value is looked ahead, not consumed: it may be the next name
        name, v = m.group("n"), m.group("v")
        flag = name.startswith("-")
        if (m.group("sep") == ",") == flag and v not in _NO_VALUE and is_secret_name(name.lstrip("-")):
            spans.append((m.start("v"), m.end("v"), f"{v[0]}{REDACTED}{v[0]}" if v[0] in "'\"" else REDACTED))
    for start, end, repl in reversed(spans):
        text = text[:start] + repl + text[end:]
    return text


def redact_secrets(text: str) -> str:
    """``redact_text``, plus secrets behind quoted names and command-line flags (``redact_command``)."""
    text = _quoted_secrets(redact_text(text))
    if not _FLAG_HINT.search(text):
        return text
    body = text.rstrip("\r\n")  # the word after a flag is hidden: never the line's end with it
    return redact_command(body) + text[len(body):]
