from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# Deterministic property tests: the same examples on every run and every machine (STYLE: habit 8).
from hypothesis import settings as _hyp_settings  # noqa: E402

_hyp_settings.register_profile("deterministic", derandomize=True, database=None)
_hyp_settings.load_profile("deterministic")


def pytest_collection_modifyitems(items: list) -> None:  # type: ignore[type-arg]
    """The live llama.cpp tests run last: `make engines` compiles their servers in the background (~9 min on 2
    cores) while the tests before them run, and they wait for that build (tests/engines/lab.py wait_llamacpp)."""
    last = [item for item in items if item.nodeid.startswith("tests/engines/test_llamacpp_live.py")]
    if last:
        items[:] = [item for item in items if item not in last] + last
