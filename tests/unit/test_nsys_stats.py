"""`nsys stats` text (table, CSV, 2021 layout, expert rules) and copy statements in prose."""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.collectors.logtext import clean_lines
from diagnose.collectors.nsys_stats import copy_direction, scan_transfer_statement
from diagnose.derive.nsys_stats import NsysStatsSource, TransferReportSource
from tests.conftest import DATA

NSYS = os.path.join(DATA, "nsys_stats")
REPORTS = os.path.join(DATA, "reports")


def _f(x: object) -> float:
    assert isinstance(x, int | float)
    return float(x)


def _read(path: str) -> list[str]:
    with open(path, encoding="utf-8") as fh:
        return fh.readlines()


def _ev(path: str, cls: type[NsysStatsSource] | type[TransferReportSource] = NsysStatsSource) -> dict[str, object]:
    src = cls()
    for line in clean_lines(_read(path)):
        src.feed(line)
    return {e.key: e.value for e in src.evidence(path)} if src.matched() else {}


def test_copy_direction_names() -> None:
    assert copy_direction("[CUDA memcpy Host-to-Device]") == "h2d"
    assert copy_direction("[CUDA memcpy HtoD]") == "h2d"
    assert copy_direction("[CUDA memcpy DtoH]") == "d2h"
    assert copy_direction("[CUDA memcpy Device-to-Device]") == "d2d"
    assert copy_direction("[CUDA memset]") == "memset"
    assert copy_direction("[CUDA memcpy Peer-to-Peer]") == "p2p"


def test_copy_dominated_table_layout() -> None:
    ev = _ev(os.path.join(NSYS, "copy_dominated_vector_add_table.txt"))
    assert abs(_f(ev["gpu.kernel_time_ms"]) - 0.536542) < 1e-9
    assert abs(_f(ev["copy.h2d_time_ms"]) - 61.322687) < 1e-9
    assert abs(_f(ev["copy.d2h_time_ms"]) - 30.323492) < 1e-9
    assert ev["copy.h2d_bytes"] == 800_000_000 and ev["copy.d2h_bytes"] == 400_000_000
    assert ev["copy.count"] == 12
    assert _f(ev["copy.time_share"]) > 0.99
    assert abs(_f(ev["api.sync_time_ms"]) - 77.010743) < 1e-9  # cudaEventSynchronize
    assert ev["api.memcpy_calls"] == 12  # cudaMemcpyAsync_v3020, version suffix stripped


def test_compute_bound_csv() -> None:
    ev = _ev(os.path.join(NSYS, "compute_bound_training_csv.txt"))
    assert abs(_f(ev["gpu.kernel_time_ms"]) - 535.20065) < 1e-6
    assert ev["gpu.kernel_count"] == 4010
    assert _f(ev["copy.time_share"]) < 0.02
    assert ev["copy.h2d_count"] == 34


def test_2021_layout_sizes_in_kib() -> None:
    ev = _ev(os.path.join(NSYS, "old_gpukernsum_2021_layout.txt"))
    assert ev["copy.h2d_bytes"] == 12_000 * 1024
    assert ev["copy.count"] == 6000 and ev["copy.mean_bytes"] == 4096.0
    assert abs(_f(ev["api.sync_time_ms"]) - 213.512301) < 1e-9


def test_pageable_rule_rows() -> None:
    ev = _ev(os.path.join(NSYS, "pageable_async_rule.txt"))
    assert ev == {"copy.pageable_async_count": 3}


def test_time_unit_in_header() -> None:
    lines = [" ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):", "",
             " Time (%)  Total Time (us)  Instances  Avg (us)  Name",
             " --------  ---------------  ---------  --------  ----",
             "    100.0        2,000.000         10   200.000  k(int)", ""]
    src = NsysStatsSource()
    for line in lines:
        src.feed(line)
    ev = {e.key: e.value for e in src.evidence("x")}
    assert ev["gpu.kernel_time_ms"] == 2.0


def test_repeated_report_uses_the_first() -> None:
    lines = _read(os.path.join(NSYS, "copy_dominated_vector_add_table.txt"))
    src = NsysStatsSource()
    for line in clean_lines(lines + lines):
        src.feed(line)
    ev = {e.key: e.value for e in src.evidence("x")}
    assert ev["copy.count"] == 12
    assert src.problems()


def test_transfer_statements_from_incidents() -> None:
    ev = _ev(os.path.join(REPORTS, "transfer_if_node_memcpy_nsight_3x.txt"), TransferReportSource)
    assert ev["copy.reported_latency_factor"] == 3.0 and ev["copy.reported_in_profile"] == 1
    ev = _ev(os.path.join(REPORTS, "transfer_if_node_d2h_h2d_round_trip.txt"), TransferReportSource)
    assert ev["copy.reported_round_trip"] == 1
    # a write-up that mentions transfers without a profile or a round trip is not a report of them
    assert _ev(os.path.join(REPORTS, "no_transfer_claim_preprocess_kernel.txt"), TransferReportSource) == {}


def test_transfer_statement_needs_prose() -> None:
    assert scan_transfer_statement("cudaMemcpy  12  trace") is None
    st_ = scan_transfer_statement("The nsys timeline shows HtoD memcpy before every kernel, 2.5x slower overall.")
    assert st_ is not None and st_.in_profile and st_.factor == 2.5


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=80),
                          st.sampled_from(_read(os.path.join(NSYS, "copy_dominated_vector_add_table.txt"))
                                          + _read(os.path.join(NSYS, "old_gpukernsum_2021_layout.txt")))),
                max_size=60))
def test_fuzz_shuffled_report_lines(lines: list[str]) -> None:
    for cls in (NsysStatsSource, TransferReportSource):
        src = cls()
        for line in clean_lines(lines):
            src.feed(line)
        src.evidence("fuzz")
        src.problems()


@settings(max_examples=30, deadline=None)
@given(st.integers(min_value=0, max_value=4000), st.binary(max_size=300))
def test_fuzz_truncated_and_binary(cut: int, junk: bytes) -> None:
    sample = "".join(_read(os.path.join(NSYS, "copy_dominated_vector_add_table.txt")))
    text = sample[:cut] + junk.decode("cp1252", "replace")
    src = NsysStatsSource()
    for line in clean_lines(text.splitlines()):
        src.feed(line)
    src.evidence("fuzz")


def test_huge_line_and_mixed_encoding() -> None:
    import io

    from diagnose.collectors.logtext import iter_text_lines

    raw = (b" ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):\n\n Time (%)  Total Time (ns)  Instances  Name\n"
           b" --------  ---------------  ---------  ----\n    100.0  " + b"1" * 500_000 + b"  3  k\xff\xfe(int)\n"
           + "Nsight zeigt Speicherübertragungen".encode("latin-1") * 10_000 + b"\n")
    for cls in (NsysStatsSource, TransferReportSource):
        src = cls()
        for line in clean_lines(iter_text_lines(io.BytesIO(raw))):
            src.feed(line)
        src.evidence("huge")


def test_the_executing_title_of_2022_to_2023() -> None:
    """nsys --stats=true from 2022.4 to 2023 titles each table "[4/7] Executing 'cudaapisum' stats report"
    (intel/llvm#8971): it was read by nothing, and the table's rows leaked to the report's prose."""
    ev = _ev(os.path.join(NSYS, "cudaapisum_executing_title_2023.txt"))
    assert abs(_f(ev["api.sync_time_ms"]) - 5317.895575) < 1e-6  # cudaStreamSynchronize
    assert abs(_f(ev["api.sync_share"]) - 0.812) < 0.01
    lines = ["[5/7] Executing 'osrt_sum' stats report", "", " Time (%)  Total Time (ns)  Num Calls  Name",
             " --------  ---------------  ---------  ----", "     90.0       5000000000        100  poll"]
    assert _ev_lines(lines) == {}  # another report's table is not read as ours


def _ev_lines(lines: list[str]) -> dict[str, object]:
    src = NsysStatsSource()
    for line in clean_lines(lines):
        src.feed(line)
    return {e.key: e.value for e in src.evidence("t")} if src.matched() else {}


def test_a_locales_decimal_commas_and_space_grouped_thousands() -> None:
    """pytorch#54324: nsys prints numbers in the locale's format; the groups of a number are one cell, the comma
    before one or two digits is its decimal point."""
    ev = _ev(os.path.join(NSYS, "locale_decimal_comma_kern_pytorch54324.txt"))
    assert abs(_f(ev["gpu.kernel_time_ms"]) - 456.854778) < 1e-6 and ev["gpu.kernel_count"] == 60
    # a three-digit count after a grouped number stays its own cell: the dashes row's columns cut the row
    ev = _ev(os.path.join(NSYS, "locale_three_digit_instances_constructed.txt"))
    assert abs(_f(ev["gpu.kernel_time_ms"]) - 235.183616) < 1e-6 and ev["gpu.kernel_count"] == 428


def test_nvprofs_summary_and_an_excerpt_of_its_rows() -> None:
    """pytorch-gpu-benchmark#6: nvprof's "Profiling result:" table, each value with its unit; the GPU rows pasted
    are 21 % of the GPU's time, so the kernels' total is scaled from their share; the API calls give the launches."""
    ev = _ev(os.path.join(NSYS, "nvprof_summary_excerpt_gpubench6.txt"))
    assert ev["api.launch_count"] == 2700057 and abs(_f(ev["api.launch_time_ms"]) - 28042.5) < 1e-6
    listed = 3390.89 + 2769.83 + 2747.33 + 1774.76 + 0.10838 + 0.065472  # ms, 6.64+5.43+5.38+3.48+0+0 = 20.93 %
    assert abs(_f(ev["gpu.kernel_time_ms"]) - listed * 100 / 20.93) < 1.0
    assert abs(_f(ev["api.launch_to_device_ratio"]) - 28042.5 / (listed * 100 / 20.93)) < 1e-3


def test_an_nvprof_table_pasted_from_its_column_header_with_markdown_bold() -> None:
    """pytorch/pytorch#45604 (sweep BT 07): the table starts at its "Type  Time(%)  Time …" header, no "Profiling
    result:" line above it, and the cells that matter are Markdown bold ("**17.031ms**"); nothing was read."""
    ev = _ev_lines([
        "            Type  Time(%)      Time     Calls       Avg       Min       Max  Name",
        " GPU activities:   63.49%  **17.031ms**         3  5.6771ms  1.5196ms  7.7599ms  **kernel_1**",
        "                   17.08%  4.5815ms        17  269.50us  1.3440us  4.5483ms  [CUDA memcpy HtoD]",
        "                   10.36%  2.7791ms         5  555.82us  2.5600us  1.3122ms  _ZN2at6native27unrolled",
    ])
    assert abs(_f(ev["copy.h2d_time_ms"]) - 4.5815) < 1e-6 and ev["copy.h2d_count"] == 17
    assert ev["gpu.kernel_count"] == 8  # kernel_1's 3 calls and the copy kernel's 5
    assert _ev_lines(["Type of the run: quick", "GPU activities were low"]) == {}


def test_a_kernel_name_wrapped_by_the_terminal_and_copies_within_the_device() -> None:
    """sonots/cumo#35 (sweep CR 01): a thrust kernel's name wraps over two more lines in the middle of nvprof's table;
    the rows after it are still read. Its 3,094,192 copies are device-to-device (1.43 µs each): no PCIe crossed, so
    XFR001 (host↔device copies) stands aside."""
    from diagnose.model import Evidence, EvidenceSet
    from diagnose.rules.engine import run_rules
    from diagnose.rules.registry import RULES

    lines = [
        "            Type  Time(%)      Time     Calls       Avg       Min       Max  Name",
        " GPU activities:   99.04%  4.42518s   3094192  1.4300us  1.1520us  11.616us  [CUDA memcpy DtoD]",
        "                    0.39%  17.498ms      2010  8.7050us  7.9040us  19.904us  void dfloat_sum_kernel<thrust::"
        "permutation_iterator<thrust::detail::normal_iterator<thrust::device_ptr<double>>, thrust::t",
        "ransform_iterator<thrust_strided_range<thrust::detail::normal_iterator<thrust::device_ptr<double>>>::stride_fu"
        "nctor, thrust::counting_iterator<long, thrust::use_default, thrust::use_default, thrust::",
        "use_default>, thrust::use_default, thrust::use_default>>>(double, double, double*)",
        "                    0.32%  14.102ms         8  1.7627ms  1.1336ms  2.2644ms  maxwell_dgemm_64x64_nn",
        "                    0.09%  3.8597ms       128  30.153us  1.5360us  2.8224ms  iter_dfloat_mul_stride_kernel",
    ]
    ev = _ev_lines(lines)
    assert ev["gpu.kernel_count"] == 2010 + 8 + 128  # the rows after the wrapped name are read
    assert abs(_f(ev["copy.d2d_time_ms"]) - 4425.18) < 1e-6
    got = EvidenceSet(Evidence(k, v, "", "t") for k, v in ev.items())
    assert "XFR001" not in {f.code for f in run_rules(got, rules=RULES)[0]}
    # the same time in host-to-device copies is PCIe's
    h2d = _ev_lines([line.replace("DtoD", "HtoD") for line in lines])
    got = EvidenceSet(Evidence(k, v, "", "t") for k, v in h2d.items())
    assert "XFR001" in {f.code for f in run_rules(got, rules=RULES)[0]}


def test_device_to_device_time_is_taken_off_the_host_device_share() -> None:
    """A second review's repro: kernels 700 ms, HtoD 160 ms, DtoD 140 ms: host↔device copies are 19 % of the GPU's
    busy time, under XFR001's bar, though all copies together are 30 %."""
    from diagnose.model import Evidence, EvidenceSet
    from diagnose.rules.engine import run_rules
    from diagnose.rules.registry import RULES

    ev = _ev_lines([
        "            Type  Time(%)      Time     Calls       Avg       Min       Max  Name",
        " GPU activities:   70.00%  700.00ms      1000  700.00us  600.00us  800.00us  gemm_kernel",
        "                   16.00%  160.00ms       100  1.6000ms  1.5000ms  1.7000ms  [CUDA memcpy HtoD]",
        "                   14.00%  140.00ms    100000  1.4000us  1.2000us  2.0000us  [CUDA memcpy DtoD]",
    ])
    got = EvidenceSet(Evidence(k, v, "", "t") for k, v in ev.items())
    assert "XFR001" not in {f.code for f in run_rules(got, rules=RULES)[0]}
