"""The one evidence builder of the derive step (diagnose.derive.emit)."""

from __future__ import annotations

import math

from diagnose.derive.emit import Emit, FirstWins
from diagnose.model import Evidence, Quality, Window


def test_emit_shares_source_window_and_quality_and_keeps_the_order() -> None:
    w = Window(1.0, 2.0)
    ev = Emit("src", window=w, quality=Quality.PARTIAL)
    ev.add("a.ratio", 0.5, "ratio", "half")
    ev.add("b.count", 3, "count", quality=Quality.LOW)
    assert ev.items == [Evidence("a.ratio", 0.5, "ratio", "src", w, Quality.PARTIAL, "half"),
                        Evidence("b.count", 3, "count", "src", w, Quality.LOW, "")]


def test_emit_quality_lowered_half_way_applies_to_the_keys_still_to_come() -> None:
    ev = Emit("src")
    ev.add("first", 1, "count")
    ev.quality = Quality.LOW
    ev.add("second", 2, "count")
    assert [e.quality for e in ev.items] == [Quality.GOOD, Quality.LOW]


def test_first_wins_keeps_the_first_value_and_drops_non_finite_floats() -> None:
    ev = FirstWins("src")
    ev.add("x", math.inf, "ratio")  # no figure: dropped, and a later finite one still lands
    ev.add("x", 1.0, "ratio", "best source")
    ev.add("x", 2.0, "ratio", "a worse source")
    ev.add("y", math.nan, "ratio")
    assert [(e.key, e.value, e.detail) for e in ev.items] == [("x", 1.0, "best source")]
