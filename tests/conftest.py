from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data")
SHARED = os.path.join(os.path.dirname(ROOT), "shared")
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
