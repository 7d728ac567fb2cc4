from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.collectors.logtext import (
    MAX_LINE_CHARS,
    clean_lines,
    iter_text_lines,
    looks_binary,
    split_glued,
    strip_prefixes,
)


def test_container_process_and_rank_prefixes_are_stripped_even_nested() -> None:
    assert strip_prefixes("vllm-1  | (APIServer pid=7) INFO 06-02 10:01:02 x") == "INFO 06-02 10:01:02 x"
    assert strip_prefixes("(EngineCore_DP0 pid=123) WARNING 01-01 00:00:00 y") == "WARNING 01-01 00:00:00 y"
    assert strip_prefixes("[rank0]: torch.OutOfMemoryError: CUDA out of memory.") == (
        "torch.OutOfMemoryError: CUDA out of memory.")
    assert strip_prefixes("2024-06-02T10:01:02.123Z INFO started") == "INFO started"
    assert strip_prefixes("Jun  2 10:01:02 host vllm[42]: INFO ready") == "INFO ready"
    assert strip_prefixes("plain line") == "plain line"


def test_glued_records_are_split_on_level_tokens_and_carriage_returns() -> None:
    glued = "Processed prompts: 100%|████| 8/8 INFO 03-18 12:34:52 llm_engine.py:706] Avg prompt throughput"
    assert split_glued(glued) == ["Processed prompts: 100%|████| 8/8",
                                  "INFO 03-18 12:34:52 llm_engine.py:706] Avg prompt throughput"]
    assert split_glued("a\rb") == ["a", "b"]
    assert split_glued("INFO 03-18 12:34:52 x.py:1] only one record") == ["INFO 03-18 12:34:52 x.py:1] only one record"]


def test_stream_decoding_is_bounded_and_replaces_bad_bytes() -> None:
    data = b"ok line\n" + b"\xff\xfe bad utf8\n" + b"x" * (MAX_LINE_CHARS * 5) + b"\nlast"
    lines = list(iter_text_lines(io.BytesIO(data)))
    assert lines[0] == "ok line" and "\ufffd" in lines[1] and lines[-1] == "last"
    assert all(len(ln) <= MAX_LINE_CHARS * 4 for ln in lines)
    assert all(len(ln) <= MAX_LINE_CHARS for ln in clean_lines(lines))


def test_binary_detection() -> None:
    assert looks_binary(b"SQLite format 3\x00\x10\x00")
    assert not looks_binary("INFO ready\n température 42 °C\n".encode())
    assert not looks_binary(b"")


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_clean_lines_never_raises(text: str) -> None:
    for line in clean_lines(text.splitlines()):
        assert isinstance(line, str)
