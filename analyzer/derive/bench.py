"""Text source: bench (to be written)."""

from __future__ import annotations

from typing import Any


def sources() -> list[Any]:
    return []
