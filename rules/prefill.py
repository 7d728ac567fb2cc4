"""Rules of this family are added by a later issue."""

from __future__ import annotations

from rules.base import Rule

RULES: tuple[type[Rule], ...] = ()
