"""attach --config: the settings are recorded in the session and read back (a real process is attached to)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from diagnose import config, pipeline
from diagnose.attach import AttachOptions, attach


def test_attach_records_the_settings_in_the_session(tmp_path: Path) -> None:
    """Attach to a real process with --config: config.json beside the manifest, read back by the report."""
    cfg = config.parse({"disable": ["HLT002"], "rules": {"QUE001": {"min_inflight": 8}}}, "team.toml")
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.05)"])
    try:
        session, diagnosis = attach(AttachOptions(pid=proc.pid, duration_s=1.0, output=str(tmp_path / "s"),
                                                  config=cfg))
    finally:
        proc.kill()
        proc.wait()
    recorded = json.loads((Path(session.path) / pipeline.CONFIG_FILE).read_text())
    assert recorded == cfg.to_json()
    assert diagnosis.config == cfg.to_json()
    assert pipeline.analyze([session.path]).config == cfg.to_json()
