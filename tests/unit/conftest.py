"""Unit tests are pure: none of them starts a process (those live in tests/integration).

Every way Python starts one (subprocess, multiprocessing, os.fork, os.posix_spawn) is replaced, for
the duration of each unit test, by a stub that records the attempt and refuses it; a test that tried
fails with the command it tried to run, even if the code under test swallowed the refusal.
(``os.system`` is left alone: a test pickles it by reference; test_unit_tests_are_pure.py refuses it,
and the imports that start processes, in the unit tests' source.)
"""

from __future__ import annotations

import _posixsubprocess
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

MOVE = "a unit test started a process ({}); tests that start processes belong in tests/integration"


@pytest.fixture(autouse=True)
def no_process_is_started(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    tried: list[str] = []

    def refuse(what: str) -> Any:
        def stub(*args: Any, **kwargs: Any) -> Any:
            shown = " ".join(map(str, args[:2]))[:200]
            tried.append(f"{what} {shown}")
            raise PermissionError(MOVE.format(f"{what} {shown}"))

        return stub

    monkeypatch.setattr(subprocess, "_fork_exec", refuse("subprocess"))
    monkeypatch.setattr(_posixsubprocess, "fork_exec", refuse("fork_exec"))  # multiprocessing's spawn
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, refuse(f"os.{name}"))
    yield
    assert not tried, MOVE.format("; ".join(tried))
