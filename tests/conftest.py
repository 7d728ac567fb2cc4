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
