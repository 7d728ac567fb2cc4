from __future__ import annotations

from analyzer.redact import REDACTED, redact_argv, redact_command, redact_text
from collectors.pyspy import parse_raw, rewrite_commands


def test_argv_flags_and_assignments_are_redacted() -> None:
    argv = ["vllm", "serve", "m", "--api-key", "s3cr3t", "--port", "8000", "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz",
            "--password=hunter2"]
    out = redact_argv(argv)
    assert out[:4] == ("vllm", "serve", "m", "--api-key") and out[4] == REDACTED
    assert "8000" in out and "s3cr3t" not in " ".join(out)
    assert "hf_abc" not in " ".join(out) and "hunter2" not in " ".join(out)


def test_text_tokens_bearer_and_url_credentials() -> None:
    text = ("Authorization: Bearer abcdefghijklmnop sk-ABCDEFGHIJKLMNOPQRSTUVWX "
            "postgres://user:pa55@db:5432/x AWS AKIAABCDEFGHIJKLMNOP api_key: 'xyz'")
    out = redact_text(text)
    for secret in ("abcdefghijklmnop", "sk-ABC", "pa55", "AKIAABCDEFGHIJKLMNOP", "'xyz'"):
        assert secret not in out
    assert "db:5432" in out


def test_pyspy_raw_command_lines_are_rewritten(tmp_path) -> None:
    raw = tmp_path / "p.raw"
    raw.write_text('process 9:"python serve.py --token abc123";thread (9): main;run (x.py:1) 3\n')
    rewrite_commands(str(raw), redact_command)
    assert "abc123" not in raw.read_text()
    assert parse_raw(raw.read_text().splitlines(True))[0].count == 3
