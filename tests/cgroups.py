"""Removing a cgroup the tests or a benchmark made (the engine lab's CPU-quota and memory groups, the slow-disk
benchmark's block-I/O group). Standard library only: the slow-disk benchmark imports it before every run and must
map none of the libraries the attach it measures reads back from the disk."""

from __future__ import annotations

import contextlib
from pathlib import Path


def remove_cgroup(group: Path) -> None:
    """Hand any process left in ``group`` back to its hierarchy's root group and remove it."""
    with contextlib.suppress(OSError):
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (group.parent / "cgroup.procs").write_text(pid)
        group.rmdir()
