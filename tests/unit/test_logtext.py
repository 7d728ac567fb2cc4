from __future__ import annotations

import io
import json
import re
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.collectors.logtext import (
    MAX_LINE_CHARS,
    Keyed,
    clean_lines,
    iter_text_lines,
    looks_binary,
    required_literals,
    split_glued,
    strip_prefixes,
)
from tests.conftest import DATA

DATA_DIR = Path(DATA)


def test_container_process_and_rank_prefixes_are_stripped_even_nested() -> None:
    assert strip_prefixes("vllm-1  | (APIServer pid=7) INFO 06-02 10:01:02 x") == "INFO 06-02 10:01:02 x"
    assert strip_prefixes("(EngineCore_DP0 pid=123) WARNING 01-01 00:00:00 y") == "WARNING 01-01 00:00:00 y"
    assert strip_prefixes("[rank0]: torch.OutOfMemoryError: CUDA out of memory.") == (
        "torch.OutOfMemoryError: CUDA out of memory.")
    assert strip_prefixes("2024-06-02T10:01:02.123Z INFO started") == "INFO started"
    assert strip_prefixes("Jun  2 10:01:02 host vllm[42]: INFO ready") == "INFO ready"
    assert strip_prefixes("plain line") == "plain line"
    # llama.cpp's common log (llama-server): a process id, then minutes.seconds.ms.µs and a level letter
    assert strip_prefixes("[42027] 1.35.716.244 I slot print_timing: id  0 | task 388 |") == (
        "slot print_timing: id  0 | task 388 |")
    assert strip_prefixes("2.02.846.974 I slot print_timing: id  3 | task 0 | n_decoded =   1081") == (
        "slot print_timing: id  3 | task 0 | n_decoded =   1081")
    assert strip_prefixes("[42027] prompt eval time =     789.03 ms /    27 tokens") == (
        "prompt eval time =     789.03 ms /    27 tokens")
    assert strip_prefixes("[13059.917043] Memory cgroup out of memory") == "[13059.917043] Memory cgroup out of memory"


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


# --- Keyed: a regex searched only where its required literals are ------------------------------------------

def _keyed_patterns() -> list[re.Pattern[str]]:
    from diagnose.collectors import claims, oom

    return [*claims.MESSAGES.values(), *(rx for _, rx in oom._PHASE_LINES)]


def test_required_literals_are_each_alternatives_longest_plain_run() -> None:
    assert required_literals(re.compile(r"\bLoading (?:the )?model|load_model\b", re.I)) == ("loading ", "load_model")
    assert required_literals(re.compile(r"Capturing CUDA|Capturing batches")) == ("Capturing ",)  # a shared prefix
    assert required_literals(re.compile(r"OutOfMemoryError\s*[:(]")) == ("OutOfMemoryError",)  # case kept
    assert required_literals(re.compile(r"out of memory|OM")) is None  # an alternative with no run of 3
    assert required_literals(re.compile(r"(?i:abc)def")) is None  # a flag changed inside: only the search tells
    assert required_literals(re.compile(r"\d+ reqs?")) == (" req",)
    # a character an ignore-case search matches to an ASCII letter ends a run (the line's lower case is ASCII)
    for pattern, line in (("ſtop", "stop"), ("lıne", "LINE"), ("İnfo", "info"), ("abcİ", "abci")):
        rx = re.compile(pattern, re.I)
        assert rx.search(line) and Keyed(rx).search(line), (pattern, required_literals(rx))
    assert required_literals(re.compile("加载模型|模型加载", re.I)) == ("加载模型", "模型加载")  # no ASCII partner


def test_keyed_search_gives_the_regexs_own_answers_on_real_log_lines() -> None:
    lines: list[str] = []
    for case in (DATA_DIR / "incidents" / "train.jsonl").read_text().splitlines():
        lines.extend(json.loads(case)["evidence"].splitlines())
    for path in sorted([*(DATA_DIR / "logs").glob("*.txt"), *DATA_DIR.rglob("*.log")]):
        lines.extend(path.read_text(errors="replace").splitlines()[:3000])
    assert len(lines) > 20_000
    skipped = 0
    for rx in _keyed_patterns():
        keyed = Keyed(rx)
        for line in lines:
            want = rx.search(line)
            got = keyed.search(line, line.lower())
            assert (got and got.span()) == (want and want.span()), (rx.pattern[:60], line[:200])
            skipped += keyed.keys is not None and got is None
    assert skipped > len(lines)  # it does skip: most lines hold none of most patterns' literals


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["CUDA", "cuda", "Cuda", "not available", "NOT AVAILABLE", "falling back to CPU",
                                 "İ", "ſ", "K", "é", " ", ":", "=", "False", "preempted", "Warming up", "x",
                                 "Received request", "load_tensors:", "加载模型", "CUDA not avaİlable",
                                 "Received requeſt", "bacK to CPU"]), max_size=12))
def test_keyed_search_agrees_with_the_regex_on_any_case_and_any_script(parts: list[str]) -> None:
    line = "".join(parts)
    for rx in _keyed_patterns():
        want = rx.search(line)
        got = Keyed(rx).search(line)
        assert (got and got.span()) == (want and want.span()), (rx.pattern[:60], line)


def test_colour_codes_are_dropped_with_or_without_their_escape() -> None:
    assert list(clean_lines(["\x1b[32mINFO\x1b[0m 12-01 10:00:00 [engine.py:100] Avg prompt throughput"])) == [
        "INFO 12-01 10:00:00 [engine.py:100] Avg prompt throughput"]
    # pasted into an issue, the ESC is lost: the codes glued to the text are still codes
    assert list(clean_lines(["[32mINFO[0m 12-01 10:00:00[90m [engine.py:100][0m x"])) == [
        "INFO 12-01 10:00:00 [engine.py:100] x"]
    # a bracketed duration standing alone is text
    assert list(clean_lines(["took [2m 30s] to load"])) == ["took [2m 30s] to load"]
    assert list(clean_lines(["rate(vllm:num_preemptions_total[5m]) took [2m]"])) == [
        "rate(vllm:num_preemptions_total[5m]) took [2m]"]  # PromQL's range, a bracketed duration


def test_a_markdown_quote_around_a_log_record_is_a_prefix() -> None:
    """Issue threads quote a log with "> " (ollama/ollama#8143): the record behind the quote is the log's; a quoted
    command, a quoted person or a REPL prompt keep their marks."""
    for quoted, record in [
        ("> Dec 26 13:59:52 DESKTOP-KO76CAD ollama[110]: time=2024-12-26T13:59:52.591+01:00 level=INFO msg=x",
         "time=2024-12-26T13:59:52.591+01:00 level=INFO msg=x"),
        ("> INFO 05-01 10:00:00 llm_engine.py:100] Avg prompt throughput", "INFO 05-01 10:00:00 llm_engine.py:100] "
                                                                            "Avg prompt throughput"),
        ("> > 2024-05-01 10:00:00,123 WARNING slow", "2024-05-01 10:00:00,123 WARNING slow"),
        ("> [GIN] 2025/02/18 - 12:24:58 | 200 |", "[GIN] 2025/02/18 - 12:24:58 | 200 |"),
    ]:
        # (a level glued after the quote mark is split off it first: the mark stays a line of its own)
        assert [ln for ln in clean_lines([quoted]) if ln.strip(">").strip()] == [record], quoted
    for kept in ("> I think the GPU is not used", "> python -m vllm.entrypoints.openai.api_server", ">>> import torch"):
        assert list(clean_lines([kept])) == [kept]
