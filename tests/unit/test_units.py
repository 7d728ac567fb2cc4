"""One table of size units (binary, as torch, vLLM and nvidia-smi print them), one size and one
percentage formatter (diagnose.units)."""

from __future__ import annotations

import pytest

from diagnose.collectors.nsys_stats import NsysStatsParser
from diagnose.collectors.nvsmi_base import rate_bytes, size_bytes
from diagnose.collectors.oom import parse_allocator_message
from diagnose.units import GIB, KIB, MIB, SIZE_UNITS, parse_size, pct, size, unit_bytes


def test_every_spelling_is_binary() -> None:
    for unit, scale in (("k", KIB), ("m", MIB), ("g", GIB), ("t", 1 << 40)):
        assert SIZE_UNITS[unit] == SIZE_UNITS[unit + "b"] == SIZE_UNITS[unit + "ib"] == scale
    assert unit_bytes("MB") == unit_bytes("mib") == MIB
    assert unit_bytes("furlongs") is None


def test_decimal_only_where_the_tool_says_so() -> None:
    assert unit_bytes("MB", decimal=True) == 10**6 and unit_bytes("GB", decimal=True) == 10**9
    assert unit_bytes("MiB", decimal=True) == MIB  # an explicit binary unit stays binary


def test_torch_1x_allocator_message() -> None:
    ev = parse_allocator_message(
        "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.79 GiB total capacity; "
        "6.71 GiB already allocated; 3.44 MiB free; 6.86 GiB reserved in total by PyTorch)")
    assert ev.requested == 20 * MIB
    assert ev.total == int(7.79 * GIB) and ev.free == int(3.44 * MIB)
    assert ev.allocated == int(6.71 * GIB) and ev.reserved == int(6.86 * GIB)


def test_gb_spelling_reads_as_gib() -> None:
    """torch 1.x's memory_summary and vLLM's "Loading model weights took 14.99 GB" divide by 1024."""
    ev = parse_allocator_message(
        "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GB (GPU 0; 7.79 GB total capacity; "
        "5.12 GB already allocated; 512.00 MB free; 5.50 GB reserved in total by PyTorch)")
    assert ev.requested == 2 * GIB and ev.free == 512 * MIB
    assert ev.total == int(7.79 * GIB)
    assert parse_size("2.00 GB") == parse_size("2.00 GiB") == 2 * GIB


def test_oom_and_nvidia_smi_read_a_size_alike() -> None:
    for text in ("1583 MB", "1583 MiB", "16 GB", "512 KB"):
        assert size_bytes(text) == parse_size(text), text
    assert rate_bytes("1066699 KB/s") == 1066699 * KIB and rate_bytes("1732 MB/s") == 1732 * MIB
    assert rate_bytes("12 MB") is None  # a size is no rate


def test_nsys_stats_mb_columns_stay_decimal() -> None:
    p = NsysStatsParser()
    for line in (" ** CUDA GPU MemOps Summary (by Size) (cuda_gpu_mem_size_sum):", "",
                 " Total (MB)  Count  Avg (MB)  Med (MB)  Min (MB)  Max (MB)  StdDev (MB)      Operation",
                 " ----------  -----  --------  --------  --------  --------  -----------  ------------------",
                 "    100.000     10    10.000    10.000    10.000    10.000        0.000  [CUDA memcpy HtoD]",
                 ""):
        p.feed(line)
    assert p.stats().copy_bytes == {"h2d": pytest.approx(100e6)}


@pytest.mark.parametrize(("n", "digits", "text"), [
    (8.36e9, 1, "7.8 GiB"), (20 * MIB, 2, "20.00 MiB"), (80 * GIB, 1, "80.0 GiB"), (1536, 1, "1.5 KiB"),
    (512, 1, "512 B"), (-3 * GIB, 2, "-3.00 GiB"),
])
def test_size(n: float, digits: int, text: str) -> None:
    assert size(n, digits) == text


def test_pct() -> None:
    assert pct(0.452) == "45 %" and pct(0.4567, 1) == "45.7 %" and pct(1.0) == "100 %"
    assert pct(-0.2, signed=True) == "-20 %" and pct(0.05, signed=True) == "+5 %"
