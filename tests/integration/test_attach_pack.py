"""`diagnose attach -o X.tar.gz` packs through diagnose.pack: a real process, py-spy, a log with prompts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.cli import main
from tests.unit.test_pack import SECRETS, _members

pytestmark = pytest.mark.integration


def test_attach_to_a_tar_gz_packs_the_same_way(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`diagnose attach -o X.tar.gz` writes the cleaned pack (a real process, py-spy)."""
    log = tmp_path / "service.log"
    log.write_text("")
    code = ("import sys, time\n"
            "log = open(sys.argv[1], 'a', buffering=1)\n"
            "while True:\n"
            "    log.write(\"INFO logger.py:39] Received request r: prompt: 'TOP SECRET PROMPT x', params: "
            f"SamplingParams(n=1), prompt_token_ids: [1, 2], token={SECRETS[2]}\\n\")\n"
            "    time.sleep(0.05)\n")
    script = tmp_path / "service.py"  # not -c: the command line would carry the prompt text itself
    script.write_text(code)
    proc = subprocess.Popen([sys.executable, str(script), str(log)])
    try:
        out = tmp_path / "s.tar.gz"
        assert main(["attach", "--pid", str(proc.pid), "--duration", "1", "--log", str(log), "-o", str(out),
                     "--format", "json"]) == 0
        files = _members(out)
        blob = b"".join(files.values())
        assert b"TOP SECRET PROMPT" not in blob and SECRETS[2].encode() not in blob
        assert "s/pack.json" in files and "s/manifest.json" in files
        assert os.path.isdir(tmp_path / "s")  # the folder stays for local use
        capsys.readouterr()
        assert main(["attach", "--pid", str(proc.pid), "--duration", "1", "-o", str(out)]) == 2
        err = capsys.readouterr().err
        assert "already exists" in err and str(out) in err and "--force" in err
        # --force: the session folder and its pack are replaced by the new window's
        old = (tmp_path / "s" / "manifest.json").read_text()
        assert main(["attach", "--pid", str(proc.pid), "--duration", "1", "-o", str(tmp_path / "s")]) == 2
        assert "already holds a session" in capsys.readouterr().err
        assert main(["attach", "--pid", str(proc.pid), "--duration", "1", "--log", str(log), "-o", str(out),
                     "--format", "json", "--force"]) == 0
        assert (tmp_path / "s" / "manifest.json").read_text() != old
        assert "s/manifest.json" in _members(out)
    finally:
        proc.kill()
        proc.wait()
