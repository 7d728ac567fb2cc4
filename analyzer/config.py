"""Rule settings from a TOML file: ``--config FILE`` or ``$DIAGNOSE_CONFIG``.

```toml
disable = ["HLT002"]          # rules that never judge

[rules.QUE001]                # thresholds of one rule (its page lists them: docs/rules/QUE001.md)
min_inflight = 8
```

Every key is checked against the rule registry before anything is judged: an unknown rule, an unknown
threshold or a value that is not a number is one sentence naming the file, the key and what it may
be (exit 2). The settings in force are recorded in the diagnosis (``config`` in the JSON, a line of
the report), so a verdict can be traced to the thresholds that made it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diagnose.errors import InputError

ENV = "DIAGNOSE_CONFIG"
KEYS = ("rules", "disable")


@dataclass(frozen=True)
class Config:
    """Threshold overrides per rule code and the rules switched off, with the file they came from."""

    path: str = ""
    rules: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    disable: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.rules or self.disable)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "rules": {c: dict(v) for c, v in sorted(self.rules.items())},
                "disable": sorted(self.disable)}

    @staticmethod
    def from_json(doc: Mapping[str, Any]) -> Config:
        return Config(str(doc.get("path", "")), {str(c): {str(k): float(v) for k, v in t.items()}
                                                 for c, t in dict(doc.get("rules", {})).items()},
                      frozenset(str(c) for c in doc.get("disable", ())))

    def describe(self) -> str:
        """One line for a report: where the settings come from and what they change."""
        parts = [f"{code}.{k} = {v:g}" for code, t in sorted(self.rules.items()) for k, v in sorted(t.items())]
        if self.disable:
            parts.append("disabled: " + ", ".join(sorted(self.disable)))
        return f"{self.path or 'settings'}: " + ("; ".join(parts) or "no change")


def load(path: str | None = None) -> Config:
    """The config at ``path``, else at ``$DIAGNOSE_CONFIG``, else the defaults (an empty ``Config``)."""
    path = path or os.environ.get(ENV) or ""
    if not path:
        return Config()
    origin = "--config" if path != os.environ.get(ENV) else f"${ENV}"
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except FileNotFoundError:
        raise InputError(f"the config file {path} (from {origin}) does not exist; pass an existing TOML "
                         "file, or drop the option") from None
    except IsADirectoryError:
        raise InputError(f"the config {path} (from {origin}) is a folder; pass a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"the config file {path} is not valid TOML ({exc}); fix it or drop {origin}") from None
    return parse(doc, path)


def parse(doc: Mapping[str, Any], path: str = "") -> Config:
    """Validate a parsed TOML document against the rule registry (``InputError`` on the first problem)."""
    from diagnose.rules.registry import RULES

    where = path or "the config"
    by_code = {r.code: r for r in RULES}
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise InputError(f"{where}: unknown key {unknown[0]!r}; a config holds [rules.CODE] tables of "
                         'thresholds and disable = ["CODE", …]')
    tables = doc.get("rules", {})
    if not isinstance(tables, dict):
        raise InputError(f"{where}: rules must be a table of [rules.CODE] tables")
    rules: dict[str, dict[str, float]] = {}
    for code, values in tables.items():
        rule = by_code.get(code)
        if rule is None:
            raise InputError(f"{where}: [rules.{code}] names no rule; `diagnose rules` lists the codes")
        if not isinstance(values, dict):
            raise InputError(f"{where}: rules.{code} must be a table of thresholds, like [rules.{code}]")
        names = [f.name for f in dataclasses.fields(rule.Thresholds)]
        for name, value in values.items():
            if name not in names:
                raise InputError(f"{where}: {code} has no threshold {name!r}; its thresholds are "
                                 f"{', '.join(names)} (docs/rules/{code}.md)")
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InputError(f"{where}: rules.{code}.{name} must be a number, got {value!r}")
        rules[code] = {k: float(v) for k, v in values.items()}
    disable = doc.get("disable", [])
    if not isinstance(disable, list) or not all(isinstance(c, str) for c in disable):
        raise InputError(f'{where}: disable must be a list of rule codes, like disable = ["HLT002"]')
    for code in disable:
        if code not in by_code:
            raise InputError(f"{where}: disable names {code!r}, which is no rule; `diagnose rules` lists the codes")
    return Config(path, rules, frozenset(disable))
