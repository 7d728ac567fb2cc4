from __future__ import annotations

import pytest

from diagnose.collectors.pyspy import parse_raw, rewrite_commands
from diagnose.redact import REDACTED, is_secret_name, redact_argv, redact_command, redact_text


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


@pytest.mark.parametrize("text", [
    "prompt_tokens: 12, input_tokens=4096, max_tokens=256",
    "Received request r-1: prompt_token_ids: [1, 2, 3], num_tokens=3",
    "tokenizer='meta-llama/Llama-3-8B' tokenizer_mode=auto",
    "generation throughput: 41.2 tokens/s, time_per_output_token_ms=12",
    "Prefill batch. #new-seq: 1, #new-token: 8192, #cached-token: 1024, token usage: 0.42",
    "Decode batch. #token: 198432, #retracted_reqs: 3, #new_token_ratio: 0.4000 -> 0.7000",
])
def test_counts_and_settings_named_like_secrets_are_kept(text: str) -> None:
    assert redact_text(text) == text


@pytest.mark.parametrize(("text", "secret"), [
    ("HF_TOKEN=abcdef123456", "abcdef123456"),
    ("auth_token: 'zzz-very-secret'", "zzz-very-secret"),
    ("access_token=tok123 max_tokens=5", "tok123"),
])
def test_real_secret_names_are_still_redacted(text: str, secret: str) -> None:
    assert secret not in redact_text(text)


def test_count_flags_keep_their_value_but_token_flags_do_not() -> None:
    assert redact_argv(["serve", "--max-tokens", "256", "--hf-token", "abc123"]) == (
        "serve", "--max-tokens", "256", "--hf-token", "***")


@pytest.mark.parametrize("name", ["HF_TOKEN", "GITHUB_TOKEN", "auth_token", "DB_PASS", "api-key", "apiKey", "password",
                                  "Authorization", "Set-Cookie", "client_secret", "AWS_SECRET_ACCESS_KEY", "pass",
                                  "smtp.pass", "private_key", "refresh_token", "passphrase"])
def test_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["prompt_tokens", "max_tokens", "input_tokens", "output_tokens", "token_ids",
                                  "tokenizer", "num_tokens", "time_per_output_token_ms", "model", "passes",
                                  "bypass", "compass_dir", "status", "request_id"])
def test_names_that_are_not_secrets(name: str) -> None:
    assert not is_secret_name(name)
