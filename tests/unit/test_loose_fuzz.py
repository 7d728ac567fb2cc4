"""`analyze` never crashes on any input: real evidence lines mixed, cut, re-encoded and corrupted."""

from __future__ import annotations

import glob
import io
import json
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diagnose import loose
from diagnose.model import EvidenceSet
from diagnose.pipeline import judge
from tests.conftest import DATA, ROOT

TEXT_DIRS = ("logs", "oom", "compile_logs", "timing", "nvsmi", "metrics", "bench", "nsys_stats", "reports")


def _real_lines() -> list[str]:
    lines: list[str] = []
    for d in TEXT_DIRS:
        for path in sorted(glob.glob(os.path.join(DATA, d, "*"))):
            if path.endswith((".md", ".py")) or not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8", errors="replace") as fh:
                lines.extend(fh.read().splitlines()[:400])
    return lines


REAL = _real_lines()
with open(os.path.join(ROOT, "analyzer", "diagnosis.schema.json"), encoding="utf-8") as _fh:
    SCHEMA = json.load(_fh)


def _diagnose(data: bytes) -> dict:
    result = loose.analyze_stream("<fuzz>", io.BufferedReader(io.BytesIO(data)))  # type: ignore[arg-type]
    diagnosis = judge(EvidenceSet(result.evidence), inputs=result.inputs)
    return diagnosis.to_json()


def test_real_fixture_lines_are_plenty() -> None:
    assert len(REAL) > 300


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    picks=st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=60),
    cut=st.integers(min_value=0, max_value=400),
    junk=st.binary(max_size=300),
    encoding=st.sampled_from(["utf-8", "latin-1", "utf-16", "cp1252"]),
    glue=st.sampled_from(["\n", "\r\n", " ", "\r", ""]),
)
def test_mixed_truncated_reencoded_evidence_never_crashes(picks, cut, junk, encoding, glue) -> None:
    import jsonschema

    text = glue.join(REAL[i % len(REAL)] for i in picks)
    text = text[: max(1, len(text) - cut)]  # truncated mid-record
    data = text.encode(encoding, errors="replace") + junk
    doc = _diagnose(data)
    jsonschema.validate(doc, SCHEMA)


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=4096))
def test_random_bytes_never_crash(data: bytes) -> None:
    doc = _diagnose(data)
    assert doc["schema"] == "diagnose/diagnosis/v1"


def test_huge_line_and_many_numbers_finish() -> None:
    data = (b"CUDA out of memory. Tried to allocate " + b"9" * 200_000 + b" GiB\n"
            + b"Running: " + b"1, " * 100_000 + b"\n" + b"| a | " * 50_000 + b"\n")
    doc = _diagnose(data)
    assert doc["schema"] == "diagnose/diagnosis/v1"
