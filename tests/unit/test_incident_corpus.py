"""The real-incident corpus's splits stay apart (``tests/data/incidents/corpus.py``): a thread is in one of
train, validation and the held-out set only, validation holds only what its id's hash sends there, and a
held-out thread is never merged into train or validation later."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HERE = Path(__file__).resolve().parents[1] / "data" / "incidents"
DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "incidents" / "dev.jsonl"
REQUIRED = ("id", "url", "evidence", "accept", "scored", "expected_class")


def _corpus() -> ModuleType:
    spec = importlib.util.spec_from_file_location("incident_corpus", HERE / "corpus.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cases(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_every_thread_is_in_one_set_and_validation_is_what_the_hash_sends_there() -> None:
    corpus = _corpus()
    sets = {name: _cases(HERE / f"{name}.jsonl") for name in ("train", "validation", "heldout")
            if (HERE / f"{name}.jsonl").exists()}
    assert {"train", "validation"} <= set(sets)
    seen: dict[str, str] = {}
    for name, cases in sets.items():
        for c in cases:
            assert all(k in c for k in REQUIRED), c.get("id")
            # the shared dev set names "nothing is wrong" other_or_healthy; the corpus' classes call it none
            named = "none" if c["expected_class"] == "other_or_healthy" else c["expected_class"]
            assert named in c["accept"] or not c["scored"], c["id"]
            thread = corpus._thread(c["url"])
            assert seen.setdefault(thread, name) == name, f"{c['id']}: its thread is in {seen[thread]} and {name}"
    assert len({c["id"] for cases in sets.values() for c in cases}) == sum(len(c) for c in sets.values())
    assert all(corpus.split_of(str(c["id"])) == "validation" for c in sets["validation"])
    dev = {c["id"] for c in _cases(DEV)} if DEV.exists() else set()
    assert all(corpus.split_of(str(c["id"])) == "train" or c["id"] in dev for c in sets["train"])


def test_a_held_out_thread_is_kept_out_of_the_splits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = _corpus()
    files = {"train": tmp_path / "train.jsonl", "validation": tmp_path / "validation.jsonl"}
    monkeypatch.setattr(corpus, "FILES", {k: str(v) for k, v in files.items()})
    monkeypatch.setattr(corpus, "HELDOUT", str(tmp_path / "heldout.jsonl"))

    def case(i: int, url: str) -> dict[str, object]:
        return {"id": f"case-{i}", "source_repo": "o/r", "url": url, "evidence": "x", "expected_class": "none",
                "accept": ["none"], "scored": True}

    new = tmp_path / "new.jsonl"
    new.write_text(json.dumps(case(1, "https://github.com/o/r/issues/1")) + "\n")
    corpus.add([str(new)], heldout=True)
    assert [c["id"] for c in _cases(tmp_path / "heldout.jsonl")] == ["case-1"]
    # the same thread under another id (as a pull request, upper case, a trailing slash) is not merged
    new.write_text(json.dumps(case(2, "https://github.com/O/r/pull/1/")) + "\n"
                   + json.dumps(case(3, "https://github.com/o/r/issues/3")) + "\n")
    corpus.add([str(new)])
    split = [c["id"] for name in files for c in (_cases(files[name]) if files[name].exists() else [])]
    assert split == ["case-3"] and len(_cases(tmp_path / "heldout.jsonl")) == 1
    assert os.path.exists(files[corpus.split_of("case-3")])
