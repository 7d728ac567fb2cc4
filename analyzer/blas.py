"""numpy without OpenBLAS's thread pool: diagnose does no linear algebra that one would speed up."""

from __future__ import annotations

import os
import sys


def import_numpy_without_blas_threads() -> None:
    """Import numpy with OpenBLAS on one thread, the user's setting kept if there is one.

    OpenBLAS starts one thread per core when numpy is imported: ~40 ms of CPU, and ~80 ms of wall time on
    a busy 2-core machine, in every ``diagnose analyze`` (a third of the start-up for one trace). In an
    attach (its analysis runs after the window) those threads also live until the process ends, and its
    exit waits for them: on a host that the target keeps busy, a thread that is rarely run is a slow exit.
    The variable is read once, when the library loads, and removed again so that no program started later
    sees it. A no-op once numpy is imported.
    """
    if "numpy" in sys.modules or "OPENBLAS_NUM_THREADS" in os.environ:
        return
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    try:
        import numpy  # noqa: F401
    except ImportError:  # pragma: no cover - a declared dependency
        pass
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"]
