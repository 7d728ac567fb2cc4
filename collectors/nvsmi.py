"""``nvidia-smi`` text → per-GPU and per-process records.

Pure parsing, streamed line by line (``NvsmiParser.feed``). It reads

* the default table: per GPU a name row (``|   0  NVIDIA A100-SXM4-80GB  On | …``) and a usage row
  (``| N/A 33C P0 61W / 400W | 72530MiB / 81920MiB | 97% Default |``), old and new driver layouts;
* the processes table (``|    0   N/A  N/A   12345   C   python   72528MiB |``), also pasted
  without its borders, and single process lines quoted in prose
  (``anaconda3/envs/vllm/bin/python      15982MiB``);
* CSV from ``--query-gpu=index,name,memory.used,memory.total,utilization.gpu --format=csv`` and
  ``--query-compute-apps=pid,process_name,used_memory --format=csv``.

Several snapshots in one input (``watch nvidia-smi`` pasted) keep the last value per GPU and the
mean utilisation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MIB = 1 << 20


@dataclass
class Gpu:
    index: int
    name: str = ""
    memory_used: int | None = None  # bytes
    memory_total: int | None = None  # bytes
    util_samples: list[float] = field(default_factory=list)  # 0..1

    @property
    def util(self) -> float | None:
        return sum(self.util_samples) / len(self.util_samples) if self.util_samples else None


@dataclass(frozen=True)
class GpuProcess:
    gpu: int | None
    pid: int | None
    name: str
    used: int  # bytes
    type: str = ""


_SIZE_UNITS = {"kib": 1 << 10, "mib": MIB, "gib": 1 << 30, "kb": 1 << 10, "mb": MIB, "gb": 1 << 30, "b": 1}


def _bytes(num: str, unit: str) -> int:
    return int(float(num) * _SIZE_UNITS.get(unit.lower(), MIB))


_HEADER = re.compile(r"NVIDIA-SMI\s+[\d.]+|Driver Version:")
_NAME_ROW = re.compile(r"^\|\s+(?P<idx>\d+)\s+(?P<name>\S.{0,80}?)\s{2,}(?:On|Off)\s+\|")
_USAGE_ROW = re.compile(
    r"^\|.*?\|\s*(?P<used>\d+)\s*(?P<u1>MiB|GiB|MB)\s*/\s*(?P<total>\d+)\s*(?P<u2>MiB|GiB|MB)\s*\|"
    r"\s*(?P<util>\d+)\s*%"
)
_PROC_TABLE = re.compile(r"^\|?\s*Processes:|GPU\s+GI\s+CI\s+PID|GPU\s+PID\s+Type\s+Process name")
_PROC_ROW = re.compile(
    r"^\|?\s*(?P<gpu>\d+)\s+(?:(?:N/A|\d+)\s+(?:N/A|\d+)\s+)?(?P<pid>\d+)\s+(?P<type>C\+G|C|G|M\+C|M)\s+"
    r"(?P<name>\S.{0,200}?)\s+(?P<used>\d+|N/A)\s*(?P<unit>MiB|GiB|MB)?\s*\|?\s*$"
)
# a process line quoted on its own: "<executable path>   15982MiB"
_LOOSE_PROC = re.compile(
    r"^\s*(?:(?P<pid>\d+)\s+)?(?P<name>(?:[\w.~+-]*/)+[\w.+-]+|python\d?(?:\.\d+)?|tritonserver|"
    r"text-generation-launcher|ollama|java|Xorg)\s{2,}(?P<used>\d+)\s*(?P<unit>MiB|GiB)\s*$"
)
_CSV_GPU_HEAD = re.compile(r"memory\.used", re.IGNORECASE)
_CSV_APPS_HEAD = re.compile(r"used_gpu_memory|used_memory", re.IGNORECASE)
_NO_PROCS = re.compile(r"No running processes found")


class NvsmiParser:
    """Feed cleaned lines; ``gpus`` and ``processes`` hold what was recognised."""

    def __init__(self) -> None:
        self.gpus: dict[int, Gpu] = {}
        self.processes: dict[tuple[int | None, int | None, str], GpuProcess] = {}
        self.snapshots = 0
        self.lines = 0
        self._pending_idx: int | None = None
        self._pending_name = ""
        self._in_procs = False
        self._csv: list[str] | None = None
        self._csv_kind = ""
        self._next_gpu = 0
        self.no_processes = False

    def feed(self, line: str) -> None:
        if _HEADER.search(line):
            self.snapshots += 1
            self.lines += 1
            self._in_procs = False
            self._next_gpu = 0
            return
        if self._csv is not None:
            if self._feed_csv(line):
                return
            self._csv = None
        if "," in line and (_CSV_GPU_HEAD.search(line) or _CSV_APPS_HEAD.search(line)) and "MiB" in line:
            self._csv = [c.strip().split(" [", 1)[0].lower() for c in line.split(",")]
            self._csv_kind = "apps" if _CSV_APPS_HEAD.search(line) and "pid" in line.lower() else "gpu"
            self.lines += 1
            return
        m = _NAME_ROW.search(line)
        if m:
            self._pending_idx, self._pending_name = int(m.group("idx")), m.group("name").strip()
            self.lines += 1
            return
        m = _USAGE_ROW.search(line)
        if m:
            idx = self._pending_idx if self._pending_idx is not None else self._next_gpu
            gpu = self.gpus.setdefault(idx, Gpu(idx))
            gpu.name = self._pending_name or gpu.name
            gpu.memory_used = _bytes(m.group("used"), m.group("u1"))
            gpu.memory_total = _bytes(m.group("total"), m.group("u2"))
            gpu.util_samples.append(int(m.group("util")) / 100.0)
            self._pending_idx, self._pending_name = None, ""
            self._next_gpu = idx + 1
            self.lines += 1
            return
        if _PROC_TABLE.search(line):
            self._in_procs = True
            self.lines += 1
            return
        if _NO_PROCS.search(line):
            self.no_processes = True
            self.lines += 1
            return
        m = _PROC_ROW.search(line) if self._in_procs or "|" in line else None
        if m and m.group("used") != "N/A":
            self._add(GpuProcess(int(m.group("gpu")), int(m.group("pid")), m.group("name").strip(),
                                 _bytes(m.group("used"), m.group("unit") or "MiB"), m.group("type")))
            return
        m = _LOOSE_PROC.search(line)
        if m:
            pid = int(m.group("pid")) if m.group("pid") else None
            self._add(GpuProcess(None, pid, m.group("name"), _bytes(m.group("used"), m.group("unit"))))

    def _add(self, proc: GpuProcess) -> None:
        key = (proc.gpu, proc.pid, proc.name)
        self.processes[key] = proc  # a later snapshot replaces an earlier one
        self.lines += 1

    def _feed_csv(self, line: str) -> bool:
        assert self._csv is not None
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(self._csv):
            return False
        row = dict(zip(self._csv, cells, strict=True))
        num = re.compile(r"(\d+(?:\.\d+)?)\s*(MiB|GiB|MB|%)?")
        if self._csv_kind == "apps":
            m = num.match(row.get("used_gpu_memory", row.get("used_memory", "")))
            if not m:
                return False
            pid = row.get("pid", "")
            self._add(GpuProcess(None, int(pid) if pid.isdigit() else None,
                                 row.get("process_name", row.get("name", "")), _bytes(m.group(1), m.group(2) or "MiB")))
            return True
        idx_s = row.get("index", "")
        idx = int(idx_s) if idx_s.isdigit() else self._next_gpu
        gpu = self.gpus.setdefault(idx, Gpu(idx))
        gpu.name = row.get("name", gpu.name)
        used, total = num.match(row.get("memory.used", "")), num.match(row.get("memory.total", ""))
        if used:
            gpu.memory_used = _bytes(used.group(1), used.group(2) or "MiB")
        if total:
            gpu.memory_total = _bytes(total.group(1), total.group(2) or "MiB")
        util = num.match(row.get("utilization.gpu", ""))
        if util:
            gpu.util_samples.append(float(util.group(1)) / 100.0)
        self._next_gpu = idx + 1
        self.lines += 1
        return True

    def matched(self) -> bool:
        return bool(self.gpus or self.processes)
