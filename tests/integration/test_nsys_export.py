"""A ``.nsys-rep`` is exported with the ``nsys`` on PATH (here a script standing for it), a real process
(moved from the unit tests, which start none).
"""

from __future__ import annotations

import os

import pytest

from diagnose import loose
from diagnose.derive import nsys as derive
from tests.unit.test_nsys_reader import overlap_export

pytestmark = pytest.mark.integration


def test_nsys_rep_is_exported_with_nsys_when_present(tmp_path, monkeypatch) -> None:
    ready = overlap_export().write(str(tmp_path / "ready.sqlite"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"  # stands for `nsys export --type sqlite ... --output OUT REP`: copies a prepared export
    fake.write_text(f"#!/bin/sh\nwhile [ \"$1\" != \"--output\" ]; do shift; done\ncp {ready} \"$2\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    rep = tmp_path / "report1.nsys-rep"
    rep.write_bytes(b"binary report")
    res = loose.analyze_path(str(rep))
    assert res.inputs[0].status == "ok" and res.inputs[0].kind == derive.KIND
    assert any(e.key == "trace.gpu_busy_ratio" for e in res.evidence)

