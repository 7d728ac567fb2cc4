"""Text output of ``nsys stats`` (table layout or ``--format csv``), and copy statements in prose.

``NsysStatsParser.feed(line)`` streams cleaned lines; ``NsysStatsParser.stats()`` returns totals.
Recognised reports, by their current and older names:

=====================  ================================  ======================================
what                   nsys ≥ 2022 name                  older name / section title
=====================  ================================  ======================================
kernel time            ``cuda_gpu_kern_sum``             ``gpukernsum``, "CUDA Kernel Statistics"
memcpy/memset time     ``cuda_gpu_mem_time_sum``         ``gpumemtimesum``, "… (by time)"
memcpy/memset bytes    ``cuda_gpu_mem_size_sum``         ``gpumemsizesum``, "… (by size in KiB)"
kernels + memops       ``cuda_gpu_sum``                  —
CUDA API time          ``cuda_api_sum``                  ``cudaapisum``, "CUDA API Statistics"
pageable async copies  ``cuda_memcpy_async`` (rule)      —
synchronous copies     ``cuda_memcpy_sync`` (rule)       —
=====================  ================================  ======================================

A report starts at its title line (`` ** CUDA GPU Kernel Summary (cuda_gpu_kern_sum):``) or at
``Processing [x.sqlite] with [.../cuda_gpu_kern_sum.py]...``; its header row names the columns
(units in parentheses: ns/us/ms/s, B/KiB/MiB/MB/GB), a dashes row follows in the table layout,
and rows run until a blank line. The name column is last and may contain spaces.

``scan_transfer_statement`` recognises prose about host↔device copies seen in a profile (an
incident write-up: "Nsight shows memory transfers …, latency divided by 3").
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field

from diagnose.collectors.nsys import LAUNCH_APIS
from diagnose.units import unit_bytes

# report id → canonical report kind
_REPORTS = {
    "cuda_gpu_kern_sum": "kern", "gpukernsum": "kern",
    "cuda_gpu_mem_time_sum": "memtime", "gpumemtimesum": "memtime",
    "cuda_gpu_mem_size_sum": "memsize", "gpumemsizesum": "memsize",
    "cuda_gpu_sum": "gpusum",
    "cuda_api_sum": "api", "cudaapisum": "api",
    "cuda_memcpy_async": "pageable", "cuda_memcpy_sync": "syncmemcpy",
}
_OLD_TITLES = (
    (re.compile(r"^CUDA Kernel Statistics"), "kern"),
    (re.compile(r"^CUDA API Statistics"), "api"),
    (re.compile(r"^CUDA Memory Operation Statistics \(by time|^CUDA Memory Operation Statistics \(nanoseconds"),
     "memtime"),
    (re.compile(r"^CUDA Memory Operation Statistics \(by size|^CUDA Memory Operation Statistics \(KiB"), "memsize"),
)
_TITLE = re.compile(r"\*\*\s*.*\((\w+)\):?\s*$")
_PROCESSING = re.compile(r"^Processing \[.*\] with \[.*?([\w]+)(?:\.py)?\]")
# nsys --stats=true from 2022.4 to 2023 announces each report as "[4/7] Executing 'cudaapisum' stats report"
_EXECUTING = re.compile(r"^\[\d+/\d+\] Executing '(\w+)' stats report")
_UNIT = re.compile(r"\((ns|us|µs|ms|s|sec|B|KiB|MiB|GiB|KB|MB|GB|bytes)\)")
_TIME_NS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9, "sec": 1e9}
_SYNC_APIS = frozenset({
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
    "cudaMemcpy", "cudaMemcpy2D", "cudaMemcpy3D", "cudaMemcpyToSymbol", "cudaMemcpyFromSymbol",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyHtoD", "cuMemcpyDtoH",
    "cuMemcpyDtoD", "cuMemcpy",
})
_API_SUFFIX = re.compile(r"_v\d+$|_ptsz$|_ptds$")


def copy_direction(name: str) -> str:
    """``[CUDA memcpy Host-to-Device]`` → ``h2d``; also d2h, d2d, p2p, memset, other."""
    n = name.lower().replace(" ", "")
    if "memset" in n:
        return "memset"
    for keys, d in (
        (("htod", "host-to-device", "hosttodevice"), "h2d"),
        (("dtoh", "device-to-host", "devicetohost"), "d2h"),
        (("dtod", "device-to-device", "devicetodevice"), "d2d"),
        (("ptop", "peer-to-peer", "peertopeer"), "p2p"),
    ):
        if any(k in n for k in keys):
            return d
    return "other"


def _number(text: str) -> float | None:
    t = text.strip()
    if _DECIMAL_COMMA.match(t):
        t = t.replace(",", ".")  # a locale's decimal comma ("16,0", "7837943,0"); "1,234" groups thousands
    t = t.replace(",", "")
    if not t or t in ("-", "n/a", "N/A"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


# a number whose only comma is a decimal separator: one to two digits after it, or a space-grouped number's
# ("7 837 943,0" once joined): nsys prints the locale's format (pytorch#54324's "16,0  235 138 304  30  7 837 943,0")
_DECIMAL_COMMA = re.compile(r"^-?\d+,\d{1,2}$")
_GROUP = re.compile(r"^\d{3}(?:,\d+)?$")  # a space-separated thousands group, the last one with its decimals
_LEAD = re.compile(r"^\d{1,3}$")  # what a space-grouped number starts with


def _span_cells(row: str, spans: list[tuple[int, int]], n: int) -> list[str] | None:
    """The row cut at the dashes row's column spans (a number's groups, whatever their widths, stay one cell), or None
    when the layout gives no such spans or a numeric cell does not read as one number."""
    if len(spans) != n:
        return None
    cells = [row[a:spans[i + 1][0]].strip() if i + 1 < n else row[a:].strip() for i, (a, _) in enumerate(spans)]
    numbers = [c.replace(" ", "").replace("\u00a0", "") for c in cells[:-1]]
    if not cells[-1] or not all(re.match(r"^-?\d[\d,.]*$", c) for c in numbers):
        return None
    return [*numbers, cells[-1]]


def _locale_cells(toks: list[str], numeric: int) -> list[str] | None:
    """The leading ``numeric`` cells of a row whose numbers group their thousands with spaces ("235 138 304"), or
    None when joining the groups does not give exactly that many numbers."""
    cells: list[str] = []
    i = 0
    while i < len(toks) and len(cells) < numeric:
        tok = toks[i]
        if not re.match(r"^-?\d[\d,.]*$", tok):
            return None
        joined = tok
        while _LEAD.match(tok) and i + 1 < len(toks) and _GROUP.match(toks[i + 1]) and "," not in joined:
            i += 1
            joined += toks[i]
        cells.append(joined)
        i += 1
    if len(cells) != numeric or i >= len(toks) or re.match(r"^-?\d[\d,.]*$", toks[i]):
        return None  # too few numbers, no name after them, or a number left over
    return [*cells, " ".join(toks[i:])]


NVPROF_PARTIAL = (5.0, 95.0)  # listed rows' Time(%) in this range: an excerpt of the table, scaled to its whole
# nvprof's summary rows: "GPU activities:    6.64%  3.39089s    122293  27.727us  8.1600us  846.65us  void cudnn::…"
_NVPROF_PREFIX = re.compile(r"^==\d+==\s*")
_NVPROF_SECTION = re.compile(r"^(GPU activities|API calls):")
# its column header, which a paste may start from without the "Profiling result:" line above it
_NVPROF_HEADER = re.compile(r"^Type\s+Time\(%\)\s+Time\s+Calls\s+Avg\s+Min\s+Max\s+Name\s*$")
_NVPROF_ROW = re.compile(r"^(?P<pct>\d+(?:\.\d+)?)%\s+(?P<t>\d+(?:\.\d+)?)(?P<u>ns|us|ms|s)\s+(?P<n>\d+)\s+"
                         r"\S+\s+\S+\s+\S+\s+(?P<name>\S.*)$")


@dataclass
class NsysStats:
    """Totals over the recognised reports (times in ns, sizes in bytes)."""

    reports: list[str] = field(default_factory=list)
    layouts: set[str] = field(default_factory=set)
    kernel_time_ns: float = 0.0
    kernel_instances: int = 0
    copy_time_ns: dict[str, float] = field(default_factory=dict)  # direction → ns (memset included)
    copy_count: dict[str, int] = field(default_factory=dict)
    copy_bytes: dict[str, float] = field(default_factory=dict)
    api_time_ns: float = 0.0
    api_calls: int = 0
    sync_time_ns: float = 0.0
    launch_time_ns: float = 0.0  # host time in kernel-launch calls (cudaLaunchKernel and kin)
    launch_calls: int = 0
    memcpy_calls: int = 0
    top_apis: list[tuple[str, float, int]] = field(default_factory=list)  # (name, ns, calls)
    pageable_async: int = 0
    sync_memcpy_rows: int = 0
    repeated_reports: int = 0

    @property
    def has_kernels(self) -> bool:
        return "kern" in self.reports or "gpusum" in self.reports

    @property
    def has_copies(self) -> bool:
        return bool({"memtime", "memsize", "gpusum"} & set(self.reports))


@dataclass
class _Table:
    report: str
    columns: list[str] = field(default_factory=list)
    csv: bool = False
    rows: int = 0
    in_rows: bool = False
    size_unit: str = "MB"  # when the header gives none (the old "(by size in KiB)" titles say KiB)
    spans: list[tuple[int, int]] = field(default_factory=list)  # the dashes row's columns (start, end) in the layout


class NsysStatsParser:
    """Stream cleaned lines in; ``NsysStats`` out. Never raises on odd input."""

    def __init__(self) -> None:
        self._table: _Table | None = None
        self._seen: set[str] = set()
        self._skip = False  # a repeated report: parsed for shape, not added
        self._apis: dict[str, list[float]] = {}
        self.out = NsysStats()
        self.recognised = 0
        self._gpusum_kern = 0.0
        self._gpusum_kern_n = 0
        self._gpusum_copy: dict[str, list[float]] = {}
        self._nvprof: str | None = None  # inside nvprof's result table: the section ("gpu", "api"), "" before one
        self._nvprof_listed: dict[str, list[float]] = {}  # section → [its rows' Time(%) summed, their time in ns]
        self._wrapped = 0  # brackets a row's kernel name left open: the lines after it hold the rest of the name

    def _start(self, kind: str) -> None:
        self._table = _Table(kind)
        self._skip = kind in self._seen
        if self._skip:
            self.out.repeated_reports += 1
        else:
            self._seen.add(kind)
            self.out.reports.append(kind)

    def feed(self, line: str) -> bool:
        s = line.strip()
        if not s:
            if self._table is not None and self._table.in_rows:
                self._table = None
            self._nvprof = None
            return False
        if "Profiling result:" in s or "API calls:" in s or "GPU activities:" in s or self._nvprof is not None \
                or _NVPROF_HEADER.match(s):
            return self._nvprof_line(s)
        if s.startswith("Processing ["):
            m = _PROCESSING.match(s)
            if m and m.group(1) in _REPORTS:
                self._start(_REPORTS[m.group(1)])
                self.recognised += 1
                return True
            self._table = None
            return False
        if s.startswith("[") and "Executing" in s:
            m = _EXECUTING.match(s)
            if m and m.group(1) in _REPORTS:
                self._start(_REPORTS[m.group(1)])
                self.recognised += 1
                return True
            if m:  # another report (osrt_sum, nvtx_sum…): its table is not one of ours
                self._table = None
                return False
        if s.startswith("**"):
            m = _TITLE.search(s)
            if m and m.group(1) in _REPORTS:
                kind = _REPORTS[m.group(1)]
                if self._table is None or self._table.report != kind or self._table.columns:
                    self._start(kind)
                self.recognised += 1
                return True
            return False
        if s[0] == "C":
            for rx, kind in _OLD_TITLES:
                if rx.match(s):
                    self._start(kind)
                    if self._table is not None and "KiB" in s:
                        self._table.size_unit = "KiB"
                    self.recognised += 1
                    return True
        t = self._table
        if t is None:
            return False
        if not t.columns:
            return self._header(t, s)
        if not t.csv and not t.in_rows and set(s) <= {"-", " "}:
            t.in_rows = True
            t.spans = [(m.start(), m.end()) for m in re.finditer(r"-+", line.rstrip())]  # at the line's own columns
            return True
        if t.csv:
            t.in_rows = True
        if not t.in_rows:
            return False
        if self._row(t, s, line.rstrip()):
            self.recognised += 1
            return True
        self._table = None  # not a row: the table has ended
        return False

    def _nvprof_line(self, s: str) -> bool:
        """nvprof's (and ``nsys nvprof``'s) summary: "==36947== Profiling result:", a "Type  Time(%)  Time  Calls
        Avg  Min  Max  Name" header, then rows under "GPU activities:" (kernels, "[CUDA memcpy HtoD]" copies) and
        "API calls:" (CUDA API time), each value with its unit ("3.39089s", "27.727us"). Older releases print the
        API calls as a second result of their own ("==N== API calls:")."""
        body = _NVPROF_PREFIX.sub("", s).replace("**", "")  # (a Markdown paste's bold on the cells that matter)
        if body.startswith("Profiling result:") or (self._nvprof is None and _NVPROF_HEADER.match(body)):
            self._nvprof, self._table = "", None
            return True
        section = _NVPROF_SECTION.match(body)
        if section is not None:
            self._nvprof = "gpu" if section.group(1).startswith("GPU") else "api"
            body = body[section.end():].strip()
            if not body:
                return True
        elif self._nvprof is None:
            return False
        if body.startswith(("Type", "Time(%)")):
            if self._nvprof == "":
                self._nvprof = "gpu"  # a header without sections: the GPU's rows come first
            return True
        m = _NVPROF_ROW.match(body)
        if m is None and self._nvprof and self._wrapped > 0 and "  " not in body:
            # the rest of a kernel's name the terminal wrapped ("void dfloat_sum_kernel<thrust::…<…" goes on over two
            # lines): no row, and no end of the table
            self._wrapped += body.count("<") + body.count("(") - body.count(">") - body.count(")")
            return True
        if m is None or not self._nvprof:
            self._nvprof = None
            return False
        ns = float(m.group("t")) * _TIME_NS[m.group("u")]
        calls, name = int(m.group("n")), m.group("name").strip()
        self._wrapped = name.count("<") + name.count("(") - name.count(">") - name.count(")")  # brackets left open
        listed = self._nvprof_listed.setdefault(self._nvprof, [0.0, 0.0])
        listed[0] += float(m.group("pct"))
        listed[1] += ns
        out = self.out
        kind = "api" if self._nvprof == "api" else "memtime" if name.startswith("[CUDA mem") else "kern"
        if kind not in self._seen:
            self._seen.add(kind)
            out.reports.append(kind)
            out.layouts.add("nvprof")
        self.recognised += 1
        if kind == "kern":
            out.kernel_time_ns += ns
            out.kernel_instances += calls
        elif kind == "memtime":
            d = copy_direction(name)
            out.copy_time_ns[d] = out.copy_time_ns.get(d, 0.0) + ns
            out.copy_count[d] = out.copy_count.get(d, 0) + calls
        else:
            self._api(name, ns, calls)
        return True

    def _api(self, name: str, ns: float, count: int) -> None:
        """One CUDA API's row: its time and calls, and the synchronising, launch and copy calls among them."""
        out = self.out
        api = _API_SUFFIX.sub("", name)
        out.api_time_ns += ns
        out.api_calls += count
        acc = self._apis.setdefault(api, [0.0, 0.0])
        acc[0] += ns
        acc[1] += count
        if api in _SYNC_APIS:
            out.sync_time_ns += ns
        if api in LAUNCH_APIS:
            out.launch_time_ns += ns
            out.launch_calls += count
        if api.startswith(("cudaMemcpy", "cuMemcpy")):
            out.memcpy_calls += count

    def _header(self, t: _Table, s: str) -> bool:
        last = ("Name", "Operation", "API Name", "Operation Name")
        if t.report in ("pageable", "syncmemcpy"):
            if "Duration" in s or "Start" in s:
                t.csv = "," in s
                t.columns = next(csv.reader([s])) if t.csv else re.split(r"\s{2,}", s)
                return True
            return False
        if not any(s.rstrip('"').endswith(n) for n in last) or not ("Time" in s or "Total" in s):
            return False
        if "," in s:
            t.csv = True
            t.columns = [c.strip() for c in next(csv.reader([s]))]
            self.out.layouts.add("csv")
        else:
            t.columns = [c.strip() for c in re.split(r"\s{2,}", s) if c.strip()]
            self.out.layouts.add("table")
        return True

    def _row(self, t: _Table, s: str, raw: str = "") -> bool:
        if t.csv:
            try:
                cells = next(csv.reader([s]))
            except (csv.Error, StopIteration):
                return False
            if len(cells) != len(t.columns):
                return False
        else:
            toks = s.split()
            n = len(t.columns)
            if len(toks) < n:
                return False
            cells = [*toks[: n - 1], " ".join(toks[n - 1 :])]
            if n >= 3 and any(_GROUP.match(x) for x in toks[1:n]) and (
                    re.match(r"^-?\d[\d,.]*$", cells[-1].split()[0]) or any(_DECIMAL_COMMA.match(x) for x in toks[:n])):
                # numbers grouped by spaces push the name right: cut the row at the dashes row's columns (the
                # layout's own widths), else join the groups where that gives exactly the numeric columns
                grouped = _span_cells(raw, t.spans, n) or _locale_cells(toks, n - 1)
                if grouped is not None:
                    cells = grouped
        if t.report in ("pageable", "syncmemcpy"):
            if _number(cells[0]) is None:
                return False
            t.rows += 1
            if not self._skip:
                if t.report == "pageable":
                    self.out.pageable_async += 1
                else:
                    self.out.sync_memcpy_rows += 1
            return True
        row = dict(zip(t.columns, cells, strict=True))
        name = cells[-1].strip()
        if _number(cells[0]) is None:
            return False
        t.rows += 1
        if self._skip:
            return True
        self._add(t, row, name)
        return True

    def _col(self, row: dict[str, str], *prefixes: str) -> tuple[float | None, str]:
        for col, val in row.items():
            if any(col.startswith(p) for p in prefixes):
                m = _UNIT.search(col)
                return _number(val), (m.group(1) if m else "")
        return None, ""

    def _add(self, t: _Table, row: dict[str, str], name: str) -> None:
        out = self.out
        if t.report in ("kern", "memtime", "api", "gpusum"):
            total, unit = self._col(row, "Total Time", "Total")
            ns = (total or 0.0) * _TIME_NS.get(unit, 1.0)
            count_v, _ = self._col(row, "Instances", "Count", "Num Calls", "Calls", "Operations", "Num")
            count = int(count_v or 0)
            if t.report == "kern":
                out.kernel_time_ns += ns
                out.kernel_instances += count
            elif t.report == "memtime":
                d = copy_direction(name)
                out.copy_time_ns[d] = out.copy_time_ns.get(d, 0.0) + ns
                out.copy_count[d] = out.copy_count.get(d, 0) + count
            elif t.report == "gpusum":
                cat = row.get("Category", "")
                if "KERNEL" in cat.upper():
                    self._gpusum_kern += ns
                    self._gpusum_kern_n += count
                elif "MEM" in cat.upper():
                    acc = self._gpusum_copy.setdefault(copy_direction(name), [0.0, 0.0])
                    acc[0] += ns
                    acc[1] += count
            else:
                self._api(name, ns, count)
        elif t.report == "memsize":
            total, unit = self._col(row, "Total")
            scale = unit_bytes(unit or t.size_unit, decimal=True) or 10**6  # nsys's MB is 10**6 bytes
            d = copy_direction(name)
            out.copy_bytes[d] = out.copy_bytes.get(d, 0.0) + (total or 0.0) * scale
            if "memtime" not in self._seen:
                count_v, _ = self._col(row, "Count", "Operations")
                out.copy_count[d] = out.copy_count.get(d, 0) + int(count_v or 0)

    def matched(self) -> bool:
        return bool(self.out.reports) and self.recognised > len(self.out.reports)

    def stats(self) -> NsysStats:
        out = self.out
        gpu = self._nvprof_listed.get("gpu")
        if gpu is not None and NVPROF_PARTIAL[0] <= gpu[0] < NVPROF_PARTIAL[1]:
            # a pasted excerpt of nvprof's rows (their shares add up to less than the whole): the section's total is
            # what the listed rows' time is that share of; the kernels are that total less the copies listed
            whole = gpu[1] * 100.0 / gpu[0]
            out.kernel_time_ns = max(out.kernel_time_ns, whole - sum(out.copy_time_ns.values()))
        if "kern" not in self._seen and self._gpusum_kern_n:
            out.kernel_time_ns = self._gpusum_kern
            out.kernel_instances = self._gpusum_kern_n
        if "memtime" not in self._seen and self._gpusum_copy:
            for d, (ns, n) in self._gpusum_copy.items():
                out.copy_time_ns[d] = ns
                out.copy_count[d] = int(n)
        out.top_apis = sorted(((k, v[0], int(v[1])) for k, v in self._apis.items()), key=lambda x: -x[1])[:5]
        return out


# -- prose: copies reported in an incident write-up -----------------------------------------------
_TRANSFER = re.compile(
    r"\b(?:memory (?:transfers?|cop(?:y|ies))|mem\s*cop(?:y|ies)|memcpy\w*|copied (?:from|to|back|into)"
    r"|(?:host|device|cpu|gpu)\s*(?:<?->|→|to)\s*(?:host|device|cpu|gpu)\b|HtoD|DtoH|H2D|D2H"
    r"|(?:pcie|PCIe) (?:transfers?|traffic|bandwidth))",
    re.IGNORECASE,
)
_PROFILER = re.compile(r"\b(?:nsight|nsys|nvprof|profil(?:e|er|ing|ed)|timeline|trace)\b", re.IGNORECASE)
_ROUND_TRIP = re.compile(
    r"round[- ]?trip|\bcop(?:y|ied|ies|ying)\b[^.]{0,80}?\bback\b"
    r"|d(?:to|2)h[^.]{0,80}h(?:to|2)d|h(?:to|2)d[^.]{0,80}d(?:to|2)h"
    r"|device to (?:the )?host[^.]{0,120}?(?:host to (?:the )?device|into (?:the )?device)",
    re.IGNORECASE,
)
_SPEEDUP = (
    re.compile(r"(?:divided by|by a factor of|fell by|dropped by|decreased by|reduced by)\s*"
               r"(?:>|>=|≥|more than|over|about|~|almost|nearly)?\s*(\d+(?:\.\d+)?)\s*(?:x|×|times)?\b(?!\s*%)",
               re.IGNORECASE),
    re.compile(r"(\d+(?:\.\d+)?)\s*(?:x|×|-fold|\s+times)\s+(?:faster|slower|speed-?up|improvement)", re.IGNORECASE),
)
_WORD = re.compile(r"[A-Za-z]{2,}")
# every statement kept names a profile or a round trip: one of these words is in it (a cheap filter
# in front of the regexes, which would otherwise run on every line of a multi-GB log)
_PROSE_KEYS = ("nsight", "nsys", "nvprof", "profil", "timeline", "trace", "round", "back", "dtoh", "d2h",
               "htod", "h2d", "device to")


@dataclass(frozen=True)
class TransferStatement:
    """A prose statement about host↔device copies."""

    in_profile: bool  # the statement refers to a profile/trace (Nsight, nsys, profiling)
    round_trip: bool  # data copied to the host and back (or device→host→device)
    factor: float | None  # a latency factor stated with it ("divided by 3" → 3.0)


def scan_transfer_statement(line: str) -> TransferStatement | None:
    """A statement about memory transfers in a profile, or None (tables and code are not prose)."""
    if len(line) < 30:
        return None
    low = line.lower()
    if not any(k in low for k in _PROSE_KEYS) or not _TRANSFER.search(line):
        return None
    if len(_WORD.findall(line)) < 6:
        return None
    in_profile = bool(_PROFILER.search(line))
    round_trip = bool(_ROUND_TRIP.search(line))
    factor: float | None = None
    for rx in _SPEEDUP:
        m = rx.search(line)
        if m:
            try:
                f = float(m.group(1))
            except ValueError:
                continue
            if 1.0 < f < 1000.0:
                factor = f
                break
    if not in_profile and not round_trip:
        return None
    return TransferStatement(in_profile, round_trip, factor)
