"""``diagnose attach`` refuses bad options with one sentence and exit code 2, before touching the target."""

from __future__ import annotations

import os

import pytest

from diagnose.attach import AttachOptions, attach
from diagnose.cli import main
from diagnose.errors import DiagnoseError


@pytest.mark.parametrize("rate", [0, -5, 5000])
def test_rate_out_of_range(rate: int) -> None:
    with pytest.raises(DiagnoseError, match="--rate must be between 1 and 1000"):
        attach(AttachOptions(pid=os.getpid(), duration_s=1, rate_hz=rate))


def test_cgroup_root_must_exist(tmp_path, capsys) -> None:
    code = main(["attach", "--pid", str(os.getpid()), "--duration", "1", "-o", str(tmp_path / "s"),
                 "--cgroup-root", str(tmp_path / "nope")])
    err = capsys.readouterr().err
    assert code == 2 and "--cgroup-root" in err and "is not a directory" in err and "Traceback" not in err
    assert not (tmp_path / "s").exists()
