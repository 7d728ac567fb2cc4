"""The default ``nvidia-smi`` table, every driver generation, read line by line.

Per GPU a name row and a usage row::

    |   0  Tesla V100-SXM2...  On   | 00000000:00:1E.0 Off |                    0 |      (410-470)
    | N/A   41C    P0    39W / 300W |      0MiB / 16130MiB |      0%      Default |
    |   0  NVIDIA GeForce RTX 4090        Off |   00000000:01:00.0 Off |                  Off |   (580)
    |  0%   30C    P8             29W /  400W |    1583MiB /  24564MiB |      0%      Default |
    |   0  GeForce GTX 1650   WDDM  | 00000000:01:00.0 Off |                  N/A |      (Windows)

(a MIG-enabled GPU prints ``N/A`` for utilisation), the ``MIG devices:`` table, and the processes
table in its layouts (``GPU PID Type Process name`` before 450, ``GPU GI CI PID Type`` since, the
older ``Compute processes:`` without a type, Windows WDDM with ``N/A`` memory). Rows are also read
without the table's borders and as a single process line quoted in prose (``anaconda3/envs/vllm/
bin/python      15982MiB``). The date line nvidia-smi prints above the table times the snapshot,
so ``nvidia-smi -l`` and ``watch nvidia-smi`` pastes are time series.

What it acts on is covered by ``TRIGGERS`` (the loose reader's pre-filter past a big file's head):
the banner (with the two lines above it for the date), every line holding ``MiB``/``GiB``/``MB``
(with the line above: the name row of a usage row), ``N/A`` (Windows process rows), and the
section headers. Its
state changes only on those lines, so a big log's tail is read exactly as a paste is.
"""

from __future__ import annotations

import re

from diagnose.collectors.nvsmi_base import (
    GpuProcess,
    MigDevice,
    Reading,
    Sink,
    Snapshot,
    ctime_ts,
    is_na,
    na_reason,
    number,
    size_bytes,
)

# what nvidia-smi prints instead of a table when no GPU can be used, and what each means
FAILURES: tuple[tuple[str, str, str], ...] = (
    ("couldn't communicate with the NVIDIA driver", "driver_not_loaded",
     "the NVIDIA kernel driver is not loaded, or this container was started without the NVIDIA runtime"),
    ("No devices were found", "no_gpu_visible",
     "the driver is loaded but no GPU is visible here (a container without --gpus / a GPU request, "
     "NVIDIA_VISIBLE_DEVICES=void, or the GPU is missing from the PCI bus)"),
    ("Driver/library version mismatch", "driver_library_mismatch",
     "the user-space NVIDIA library and the loaded kernel driver differ (a driver upgrade without a reboot): "
     "CUDA cannot start"),
    ("Unable to determine the device handle for GPU", "gpu_lost",
     "the driver lost a GPU (it fell off the bus: Xid 79 in the kernel log)"),
    ("GPU is lost", "gpu_lost", "the driver lost a GPU (it fell off the bus: Xid 79 in the kernel log)"),
)
TRIGGERS: tuple[str | tuple[str, int, int], ...] = (
    ("NVIDIA-SMI", 2, 0), ("Driver Version:", 2, 0), ("MiB", 1, 0), ("GiB", 1, 0), ("MB", 1, 0), "N/A",
    "Processes:", "processes:", "Process name", "No running processes found", "MIG devices:",
    "--------------------+",  # the border that closes the processes block (an empty list, when no row came)
    "====================|",  # … right under the block's header rule
    *(literal for literal, _, _ in FAILURES),
)

_BANNER = re.compile(r"NVIDIA-SMI\s+\d|Driver Version:\s*\d")
_NAME_CELL = re.compile(r"^\s*(\d{1,2})\s+(\S.*?)\s+(On|Off|WDDM|TCC)\s*$")
_BUS = re.compile(r"\b([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\b")
_MEM_CELL = re.compile(r"^\s*(\d+)\s*(MiB|GiB|MB)\s*/\s*(\d+)\s*(MiB|GiB|MB)\s*$")
_UTIL_CELL = re.compile(r"^\s*(?:(\d+)\s*%|(N/A|ERR!))(?:\s+(\S.*?))?\s*$")
_TEMP = re.compile(r"(?<![\w.])(\d+)\s*C\b")
_PERF = re.compile(r"\b(P\d{1,2})\b")
_POWER = re.compile(r"(\d+(?:\.\d+)?\s*W|N/A|ERR!)\s*/\s*(\d+(?:\.\d+)?\s*W|N/A|ERR!)")
_PROC_HEAD = re.compile(r"Processes:|Compute processes:|Process name")
_PROC_ROW = re.compile(
    r"^(?P<gpu>\d{1,2})\s+(?:(?P<gi>N/A|\d+)\s+(?P<ci>N/A|\d+)\s+)?(?P<pid>\d+)\s+"
    r"(?:(?P<type>C\+G|C|G|M\+C|M)\s+)?(?P<name>\S.*?)\s+(?P<used>\d+\s*(?:MiB|GiB|MB)|N/A)$"
)
# a process line quoted on its own: "<executable path>   15982MiB"
_LOOSE_PROC = re.compile(
    r"^\s*(?:(?P<pid>\d+)\s+)?(?P<name>(?:[\w.~+-]*/)+[\w.+-]+|python\d?(?:\.\d+)?|tritonserver|"
    r"text-generation-launcher|ollama|java|Xorg)\s{2,}(?P<used>\d+)\s*(?P<unit>MiB|GiB)\s*$"
)
_MIG_IDS = re.compile(r"^\s*(\d+)\s+(\d+|N/A)\s+(\d+|N/A)\s+(\d+|N/A)\s*$")
_NO_PROCS = "No running processes found"
_CLOSING_BORDER = re.compile(r"\+-{20,}\+$")  # "+-----…-----+" under the last row (the header's rule is "|===…|")
_HEADER_RULE = re.compile(r"\|={20,}\|$")


def _cells(line: str) -> list[str]:
    """The cells between the outer borders; text before the first one (a quote's ``> ``) is dropped."""
    first, last = line.find("|"), line.rfind("|")
    if first < 0:
        return [line]
    body = line[first + 1:last] if last > first else line[first + 1:]
    return body.split("|")


class TableParser:
    """The default table; readings and snapshots go to ``sink``."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.snapshots = 0
        self.matched = False
        self.no_processes = False
        self._hist: list[str] = ["", ""]  # the two lines fed before the current one
        self._open = False
        self._ts: float | None = None
        self._memory: dict[int, tuple[int | None, int | None]] = {}
        self._procs: dict[tuple[int | None, int | None, str], GpuProcess] = {}
        self._listed = False
        self._mig: list[MigDevice] = []
        self._in_procs = False
        self._procs_ruled = False  # the processes block's header rule was seen: a border after it closes the block
        self._in_mig = False
        self._next_gpu = 0
        self.failures: dict[str, str] = {}  # kind → the line nvidia-smi printed

    def feed(self, line: str) -> bool:
        try:
            return self._feed(line)
        finally:
            self._hist = [self._hist[1], line]

    def _feed(self, line: str) -> bool:
        if ("NVIDIA-SMI" in line or "Driver Version:" in line) and _BANNER.search(line):
            self._flush()
            self._open = True
            self.snapshots += 1
            self.matched = True
            self._ts = next((t for t in (ctime_ts(h) for h in reversed(self._hist)) if t is not None), None)
            self._in_procs = self._in_mig = False
            self._next_gpu = 0
            return True
        if "MIG devices:" in line:
            self._in_mig, self._in_procs = True, False
            return True
        for literal, kind, _ in FAILURES:
            if literal in line:
                self.failures.setdefault(kind, line.strip()[:300])
                self.matched = True
                return True
        if _NO_PROCS in line:
            self._start()
            self._listed = True
            self.no_processes = True
            self.matched = True
            return True
        if _PROC_HEAD.search(line):
            # the list is known once a row, "No running processes found" or the block's closing border shows it:
            # a paste cut after the header (pytorch#4031) lists nothing, it does not say there is nothing
            self._start()
            self._in_procs, self._in_mig = True, False
            return True
        if self._in_procs and _CLOSING_BORDER.match(line.strip()):
            # the border right under the header's rule closes an empty block (rows list themselves); a border after a
            # gap or a header cut off before its rule is the next table's top, not this block's end
            self._listed = self._listed or (self._procs_ruled and bool(_HEADER_RULE.match(self._hist[1].strip())))
            self._in_procs = self._procs_ruled = False
            return True
        if self._in_procs and _HEADER_RULE.match(line.strip()):
            self._procs_ruled = True
            return True
        has_size = "MiB" in line or "GiB" in line or "MB" in line
        if "|" in line and has_size and self._usage_row(line):
            return True
        if self._in_mig and "|" in line and has_size and self._mig_row(line):
            return True
        if (self._in_procs or "|" in line) and self._proc_row(line):
            return True
        if has_size:
            m = _LOOSE_PROC.search(line)
            if m:
                self._start()
                pid = int(m.group("pid")) if m.group("pid") else None
                self._add(GpuProcess(None, pid, m.group("name"), size_bytes(m.group("used") + m.group("unit"))))
                return True
        return False

    # -- rows ----------------------------------------------------------------------------------------

    def _usage_row(self, line: str) -> bool:
        cells = _cells(line)
        if len(cells) < 3:
            return False
        mem = _MEM_CELL.match(cells[1])
        util = _UTIL_CELL.match(cells[2])
        if not mem or not util or not (_TEMP.search(cells[0]) or _PERF.search(cells[0]) or "N/A" in cells[0]
                                       or "ERR!" in cells[0]):
            return False
        self._start()
        idx, name, bus = self._name_above()
        if idx is None:
            idx = self._next_gpu
        used = size_bytes(mem.group(1) + mem.group(2))
        total = size_bytes(mem.group(3) + mem.group(4))
        na: list[str] = []
        util_pct = float(util.group(1)) if util.group(1) is not None else None
        if util_pct is None:
            na.append(na_reason("utilization.gpu", util.group(2) or ""))
        if util.group(2) == "ERR!" or "ERR!" in cells[0]:
            self.failures.setdefault("gpu_lost", line.strip()[:300])  # the driver cannot read the GPU
        temp = _TEMP.search(cells[0])
        perf = _PERF.search(cells[0])
        power = _POWER.search(cells[0])
        draw = number(power.group(1)) if power else None
        cap = number(power.group(2)) if power else None
        if power and draw is None:
            na.append(na_reason("power.draw", power.group(1)))
        self.sink.reading(Reading(
            gpu=idx, form="table", ts=self._ts, name=name, bus_id=bus, util_pct=util_pct, mem_used=used,
            mem_total=total, power_w=draw, power_limit_w=cap, temp_c=float(temp.group(1)) if temp else None,
            pstate=perf.group(1) if perf else "", mig=util_pct is None and util.group(2) == "N/A", na=tuple(na)))
        self._memory[idx] = (used, total)
        self._next_gpu = idx + 1
        self.matched = True
        return True

    def _name_above(self) -> tuple[int | None, str, str]:
        """The GPU's index, name and bus id from the name row right above the usage row."""
        cells = _cells(self._hist[1])
        m = _NAME_CELL.match(cells[0]) if "|" in self._hist[1] else None
        if not m:
            return None, "", ""
        bus = _BUS.search(cells[1]) if len(cells) > 1 else None
        return int(m.group(1)), m.group(2).strip(), bus.group(1) if bus else ""

    def _mig_row(self, line: str) -> bool:
        cells = _cells(line)
        if len(cells) < 2:
            return False
        ids = _MIG_IDS.match(cells[0])
        mem = _MEM_CELL.match(cells[1])
        if not ids or not mem:
            return False
        sm = cells[2].split() if len(cells) > 2 else []
        self._mig.append(MigDevice(
            gpu=int(ids.group(1)), gi=ids.group(2), ci=ids.group(3), dev=ids.group(4),
            used=size_bytes(mem.group(1) + mem.group(2)), total=size_bytes(mem.group(3) + mem.group(4)),
            sm_count=int(sm[0]) if sm and sm[0].isdigit() else None))
        self.matched = True
        return True

    def _proc_row(self, line: str) -> bool:
        cells = _cells(line) if "|" in line else [line]
        if len(cells) != 1:
            return False
        body = cells[0].strip()
        m = _PROC_ROW.match(body)
        if not m:
            return False
        used_text = m.group("used")
        used = None if is_na(used_text) else size_bytes(used_text)
        self._start()
        self._listed = True
        self._add(GpuProcess(
            int(m.group("gpu")), int(m.group("pid")), m.group("name").strip(), used, m.group("type") or "",
            gi="" if m.group("gi") in (None, "N/A") else m.group("gi"),
            ci="" if m.group("ci") in (None, "N/A") else m.group("ci"),
            used_na=used_text.strip() if used is None else ""))
        return True

    def _add(self, proc: GpuProcess) -> None:
        self._procs[(proc.gpu, proc.pid, proc.name)] = proc
        self.matched = True

    # -- snapshots -----------------------------------------------------------------------------------

    def _start(self) -> None:
        if not self._open:
            self._open = True
            self._ts = None

    def _flush(self) -> None:
        if self._open and (self._memory or self._procs or self._listed or self._mig):
            self.sink.snapshot(Snapshot(
                form="table", ts=self._ts,
                memory=tuple((g, u, t) for g, (u, t) in sorted(self._memory.items())),
                processes=tuple(self._procs.values()), listed=self._listed, mig=tuple(self._mig)))
        self._open = False
        self._memory, self._procs, self._listed, self._mig = {}, {}, False, []

    def finish(self) -> None:
        self._flush()
