"""``diagnose.stats.quantile``: numpy's default (linear) method, None on nothing."""

from __future__ import annotations

import random

import numpy as np
import pytest

from diagnose.stats import quantile


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_quantile_is_numpys_linear_method(n: int) -> None:
    rng = random.Random(n)
    xs = [rng.uniform(-5, 50) for _ in range(n)]
    for q in (0.0, 0.1, 0.5, 0.9, 0.99, 1.0):
        assert quantile(xs, q) == pytest.approx(float(np.percentile(xs, q * 100)), rel=1e-12, abs=1e-12)


def test_quantile_of_nothing_is_none_and_input_order_does_not_matter() -> None:
    assert quantile([], 0.5) is None
    assert quantile(iter([3.0, 1.0, 2.0]), 0.5) == 2.0
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == 2.5
