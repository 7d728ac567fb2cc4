"""``python -m diagnose.examples.service --pathology NAME [--fixed] ...``: run the demo service (see ``cli``)."""

from __future__ import annotations

import sys

from diagnose.examples.service.cli import main

if __name__ == "__main__":
    sys.exit(main())
