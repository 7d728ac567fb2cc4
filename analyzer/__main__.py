"""``python -m diagnose``: the same command line as ``diagnose``."""

import sys

from diagnose.cli import main

sys.exit(main())
