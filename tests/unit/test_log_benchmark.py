"""The log benchmark (benchmarks/log_throughput.py) runs end to end on a small log and says the analysis's
throughput beside its floor pass of the same file, in the same run."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest


def _bench() -> ModuleType:
    """The benchmark script as a module, fresh (a test may replace one of its names)."""
    return importlib.reload(importlib.import_module("benchmarks.log_throughput"))


def test_the_benchmark_prints_the_analysis_over_its_floor(capsys: pytest.CaptureFixture[str]) -> None:
    assert _bench().main(["--size-mb", "2"]) == 0
    out = capsys.readouterr().out
    mbs = float(re.search(r"-> ([\d.]+) MB/s\n", out).group(1))  # type: ignore[union-attr]
    floor = re.search(r"floor \(read \+ count lines, before and after\): ([\d.]+) s -> (\d+) MB/s; "
                      r"analyze / floor: ([\d.]+)x", out)
    assert floor is not None, out
    assert mbs > 0 and float(floor.group(3)) > 0
    assert "stats lines: " in out and "stats lines: None" not in out


def test_the_floor_reads_the_whole_file(tmp_path: Path) -> None:
    """A file of several blocks and a partial last one: read to its end (each block counted)."""
    path = tmp_path / "log"
    path.write_bytes(b"line\n" * 50_000)
    calls: list[int] = []

    class Counting(bytearray):
        def count(self, sub, start=0, end=None):  # type: ignore[no-untyped-def]
            calls.append(end - start)
            return super().count(sub, start, end)

    bench = _bench()
    assert bench.floor_pass(str(path), block=64 << 10) > 0
    setattr(bench, "bytearray", Counting)  # noqa: B010 - the module's own name for the buffer type
    bench.floor_pass(str(path), block=64 << 10)
    assert sum(calls) == path.stat().st_size and len(calls) == 4
