"""The one evidence builder of the derive step.

Every deriver turns records into ``Evidence`` the same way: one source, usually one window and one
quality for all its keys, a detail per key. ``Emit`` holds what the keys share and the list they go
into, so a deriver says only what differs::

    ev = Emit(SOURCE, window=window, quality=Quality.PARTIAL if partial else Quality.GOOD)
    ev.add("cpu.active_samples", total, "samples")
    ev.add("cpu.compile_share", share, "ratio", "share of active samples", Quality.LOW)
    return ev.items
"""

from __future__ import annotations

import math

from diagnose.model import Evidence, Quality, Window


class Emit:
    """Evidence of one source, built key by key, in the order added.

    ``quality`` is the default of every ``add`` that names none; a deriver that learns half-way
    that its data is thin may lower it for the keys still to come.
    """

    def __init__(self, source: str, *, window: Window | None = None, quality: Quality = Quality.GOOD) -> None:
        self.source = source
        self.window = window
        self.quality = quality
        self.items: list[Evidence] = []

    def add(self, key: str, value: object, unit: str, detail: str = "", quality: Quality | None = None) -> None:
        self.items.append(Evidence(key, value, unit, self.source, self.window,
                                   self.quality if quality is None else quality, detail))


class FirstWins(Emit):
    """An ``Emit`` for a deriver that reads several sources of the same keys best first: the first
    value of a key stands, and a value that is not a finite number where a float is due is dropped
    (an infinite ratio of a table with a zero in it is no figure)."""

    def __init__(self, source: str, *, window: Window | None = None, quality: Quality = Quality.GOOD) -> None:
        super().__init__(source, window=window, quality=quality)
        self._keys: set[str] = set()

    def add(self, key: str, value: object, unit: str, detail: str = "", quality: Quality | None = None) -> None:
        if key in self._keys or (isinstance(value, float) and not math.isfinite(value)):
            return
        self._keys.add(key)
        super().add(key, value, unit, detail, quality)
