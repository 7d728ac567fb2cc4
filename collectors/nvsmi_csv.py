"""``nvidia-smi --query-gpu=… --format=csv`` and ``--query-compute-apps=… --format=csv``.

With a header (``index, name, memory.used [MiB], utilization.gpu [%]``), with or without units in
the values, ``-l``/``-lms`` time series (a ``timestamp`` column), several GPUs' rows interleaved per
tick, and the headers people write themselves for a monitor script's CSV
(``timestamp,gpu_name,gpu_util%,mem_used_MB``). The command line pasted above the output
(``nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits``)
names the columns of headerless rows exactly.

Headerless rows with no command line (``GuessedCsvParser``) are read by their values: each
column's kind (nvidia-smi's timestamp, a GPU name, a UUID, a bus id, a P-state, ``%``/``MiB``/
``W``/``MHz`` units, plain numbers and their ranges) is matched against the query orders scripts
use most; the layout chosen is always said to be a guess (``Sink.note``).

Which GPU a row is: its ``index`` (or UUID / bus id) column; else, when rows carry timestamps, the
rows of one tick (nvidia-smi writes the GPUs of a tick a few ms apart, ticks an interval apart) are
GPUs 0..k-1 in order; else the rows are one series and said to be.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from diagnose.collectors.nvsmi_base import (
    CSV_TS,
    GpuProcess,
    Reading,
    Sink,
    Snapshot,
    csv_ts,
    is_na,
    lanes,
    na_reason,
    number,
    reason_name,
    reasons_from_mask,
    size_bytes,
)

MAX_ROWS = 2_000_000  # rows read after one header or command line (a day of -l 1 on 16 GPUs is 1.4 M)
LEARN_ROWS = 64  # rows looked at before the tick size (GPUs per tick) is fixed
RECENT_ROWS = 100  # a row within this many lines: the series goes on (past a big file's head: read every line)
MAX_GPUS_PER_TICK = 16

# literal anchors of a header or command line (also the source's triggers: each brings MAX_ROWS lines after it)
HEADER_LITERALS = (
    "utilization.gpu", "utilization.memory", "memory.used", "memory.total", "memory.free", "power.draw",
    "temperature.gpu", "clocks.sm", "clocks.current", "clocks.max", "clocks.mem", "clocks.gr", "pcie.link",
    "clocks_throttle_reasons", "clocks_event_reasons", "gpu_util", "util_gpu", "mem_used", "used_gpu_memory",
    "used_memory", "--query-gpu", "--query-compute-apps",
)

# --query-gpu field → Reading attribute (or a pseudo attribute handled below)
GPU_FIELDS: dict[str, str] = {
    "timestamp": "ts", "index": "gpu", "name": "name", "gpu_name": "name", "pci.bus_id": "bus_id",
    "gpu_bus_id": "bus_id", "uuid": "uuid", "gpu_uuid": "uuid",
    "utilization.gpu": "util_pct", "utilization.memory": "mem_util_pct",
    "memory.used": "mem_used", "memory.total": "mem_total", "memory.free": "mem_free", "memory.reserved": "-",
    "power.draw": "power_w", "power.draw.average": "power_w", "power.draw.instant": "power_w",
    "power.limit": "power_limit_w", "enforced.power.limit": "power_limit_w",
    "power.default_limit": "power_default_limit_w", "temperature.gpu": "temp_c",
    "clocks.sm": "sm_clock_mhz", "clocks.current.sm": "sm_clock_mhz", "clocks.gr": "gr_clock",
    "clocks.current.graphics": "gr_clock", "clocks.max.sm": "sm_clock_max_mhz", "clocks.max.gr": "gr_clock_max",
    "clocks.max.graphics": "gr_clock_max", "clocks.mem": "mem_clock_mhz", "clocks.current.memory": "mem_clock_mhz",
    "pstate": "pstate", "pcie.link.gen.current": "pcie_gen", "pcie.link.gen.gpucurrent": "pcie_gen",
    "pcie.link.gen.max": "pcie_gen_max", "pcie.link.gen.gpumax": "pcie_gen_gpu_max",
    "pcie.link.width.current": "pcie_width", "pcie.link.width.max": "pcie_width_max",
    "clocks_throttle_reasons.active": "reasons_mask", "clocks_event_reasons.active": "reasons_mask",
    "mig.mode.current": "mig",
}
APP_FIELDS: dict[str, str] = {
    "pid": "pid", "process_name": "name", "name": "name", "used_gpu_memory": "used", "used_memory": "used",
    "gpu_uuid": "uuid", "gpu_bus_id": "bus_id", "gpu_name": "gpu_name", "gpu_serial": "-",
}
# headers people write for their own monitor scripts, normalised (lower case, units dropped)
_ALIASES: tuple[tuple[re.Pattern[str], str], ...] = tuple((re.compile(p), f) for p, f in (
    (r"^(date_?)?time(stamp)?$|^datetime$", "timestamp"),
    (r"^(gpu_?)?(index|idx|id)$", "index"),
    (r"^(gpu_?)?util(ization|isation)?(_?gpu)?$", "utilization.gpu"),
    (r"^(gpu_?)?mem(ory)?_?util(ization|isation)?$", "utilization.memory"),
    (r"^(gpu_?)?mem(ory)?_?used$|^used_?mem(ory)?$|^vram_?used$", "memory.used"),
    (r"^(gpu_?)?mem(ory)?_?total$|^total_?mem(ory)?$|^vram_?total$", "memory.total"),
    (r"^(gpu_?)?mem(ory)?_?free$|^free_?mem(ory)?$", "memory.free"),
    (r"^(gpu_?)?temp(erature)?(_?gpu)?$", "temperature.gpu"),
    (r"^(gpu_?)?power(_?draw)?$", "power.draw"),
    (r"^(gpu_?)?power_?limit$", "power.limit"),
    (r"^(gpu_?)?(sm_?)?clock(s)?(_?sm)?$", "clocks.sm"),
))
_UNIT_SUFFIX = re.compile(r"(?:_|\s|\()?(%|pct|percent|mib|mb|gib|gb|c|w|mhz)\)?$")
_METRICS = {"util_pct", "mem_util_pct", "mem_used", "mem_total", "mem_free", "power_w", "temp_c", "sm_clock_mhz",
            "gr_clock", "pcie_gen", "pcie_width", "reasons_mask", "reason"}
_COMMAND = re.compile(r"--query-(gpu|compute-apps)[= ]\s*([\w.,]+)")
_FORMAT = re.compile(r"--format[= ]\s*([\w,]+)")


@dataclass(frozen=True)
class Column:
    field: str  # the --query-gpu name (or "clocks_event_reasons.<x>")
    attr: str  # Reading attribute, or "reason", "gpu", "ts", "mem_free", "gr_clock", "-", "?"
    unit: str = ""  # the unit named in the header ("mib", "gib", …), for values printed without one
    reason: str = ""  # NVML reason name for a per-reason column


def normalise(col: str, apps: bool = False) -> Column:
    """A header cell (``memory.used [MiB]``, ``gpu_util%``, ``mem_used_MB``) as a column."""
    text = col.strip().strip('"').strip()
    unit = ""
    if "[" in text:
        text, _, rest = text.partition("[")
        unit = rest.rstrip("]").strip().lower()
        text = text.strip()
    name = text.lower().replace(" ", "_")
    table = APP_FIELDS if apps else GPU_FIELDS
    if name in table:
        return Column(name, table[name], unit)
    if not apps and name.startswith(("clocks_throttle_reasons.", "clocks_event_reasons.")):
        r = reason_name(name.split(".", 1)[1])
        return Column(name, "reason" if r else "-", unit, r or "")
    if apps:
        return Column(name, "-", unit)
    m = _UNIT_SUFFIX.search(name)
    if m and m.start() > 0:
        unit = unit or {"pct": "%", "percent": "%", "c": "", "w": "w"}.get(m.group(1), m.group(1))
        name = name[: m.start()].rstrip("_")
    name = name.rstrip("%").rstrip("_")
    for pat, fld in _ALIASES:
        if pat.match(name):
            return Column(fld, GPU_FIELDS[fld], unit)
    return Column(name, "-", unit)


def _header(line: str) -> tuple[list[Column], bool] | None:
    """Columns of a --query-gpu / --query-compute-apps header line, and whether it is the apps query."""
    if "," not in line or "--query" in line or not any(lit in line for lit in HEADER_LITERALS):
        return None
    cells = line.split(",")
    lower = line.lower()
    apps = ("used_gpu_memory" in lower or "used_memory" in lower) and "pid" in lower
    cols = [normalise(c, apps) for c in cells]
    if apps:
        return (cols, True) if any(c.attr == "used" for c in cols) else None
    if sum(1 for c in cols if c.attr in _METRICS) < 1 or sum(1 for c in cols if c.attr != "-") < 2:
        return None
    return cols, False


def _value(col: Column, text: str, row: dict[str, Any], na: list[str]) -> None:
    attr = col.attr
    if attr in ("-", "?"):
        return
    raw = text.strip()
    if is_na(raw):
        if attr not in ("name", "bus_id", "uuid", "pstate"):
            na.append(na_reason(col.field, raw))
        return
    if attr == "ts":
        row["ts"] = csv_ts(raw)
    elif attr == "gpu":
        v = number(raw)
        if v is not None and v == int(v) and 0 <= v < 4096:
            row["gpu"] = int(v)
    elif attr in ("name", "bus_id", "uuid", "pstate"):
        row[attr] = raw
    elif attr in ("mem_used", "mem_total", "mem_free"):
        row[attr] = size_bytes(raw, col.unit if col.unit in ("mib", "gib", "mb", "gb") else "mib")
    elif attr in ("pcie_gen", "pcie_gen_max", "pcie_gen_gpu_max", "pcie_width", "pcie_width_max"):
        row[attr] = lanes(raw)
    elif attr == "reasons_mask":
        try:
            row["reasons"] = reasons_from_mask(int(raw, 16) if raw.lower().startswith("0x") else int(raw))
        except ValueError:
            na.append(na_reason(col.field, raw))
    elif attr == "reason":
        reasons = set(row.get("reasons") or ())
        if raw.lower() == "active":
            reasons.add(col.reason)
        row["reasons"] = frozenset(reasons)
    elif attr == "mig":
        row["mig"] = raw.lower() == "enabled"
    else:
        v = number(raw)
        if v is not None:
            row[attr] = v


def _reading(row: dict[str, Any], gpu: int) -> Reading:
    if row.get("mem_total") is None and row.get("mem_used") is not None and row.get("mem_free") is not None:
        row["mem_total"] = row["mem_used"] + row["mem_free"]  # total − reserved: close enough for shares
    if row.get("mem_used") is None and row.get("mem_total") is not None and row.get("mem_free") is not None:
        row["mem_used"] = max(0, row["mem_total"] - row["mem_free"])
    if row.get("sm_clock_mhz") is None and row.get("gr_clock") is not None:
        row["sm_clock_mhz"] = row["gr_clock"]  # graphics and SM clocks are one domain on these GPUs
    if row.get("sm_clock_max_mhz") is None and row.get("gr_clock_max") is not None:
        row["sm_clock_max_mhz"] = row["gr_clock_max"]
    keep = {k: v for k, v in row.items() if k in Reading.__dataclass_fields__ and k not in ("gpu", "form")}
    return Reading(gpu=gpu, form="csv", **keep)


class Ticker:
    """Which GPU each row is when no column names it: the rows of one timestamp tick, in order."""

    def __init__(self, sink: Sink, what: str) -> None:
        self.sink = sink
        self.what = what
        self.buffer: list[tuple[dict[str, Any], list[str]]] = []
        self.k: int | None = None
        self.threshold = 0.0
        self.pos = 0
        self.last_ts: float | None = None
        self.by_id: dict[str, int] = {}

    def add(self, row: dict[str, Any], na: list[str]) -> None:
        if "gpu" in row:
            self._emit(row, int(row["gpu"]), na)
            return
        ident = row.get("uuid") or row.get("bus_id")
        if ident:
            self._emit(row, self.by_id.setdefault(str(ident), len(self.by_id)), na)
            return
        if self.k is None:
            self.buffer.append((row, na))
            if len(self.buffer) >= LEARN_ROWS:
                self._learn()
            return
        self._place(row, na)

    def _emit(self, row: dict[str, Any], gpu: int, na: list[str]) -> None:
        row = dict(row)
        row["na"] = tuple(na)
        self.sink.reading(_reading(row, gpu))

    def _place(self, row: dict[str, Any], na: list[str]) -> None:
        assert self.k is not None
        ts = row.get("ts")
        new_tick = self.pos >= self.k or (ts is not None and self.last_ts is not None
                                          and ts - self.last_ts > self.threshold)
        if new_tick:
            self.pos = 0
        self._emit(row, self.pos, na)
        self.pos += 1
        if ts is not None:
            self.last_ts = ts

    def _learn(self) -> None:
        rows = self.buffer
        self.buffer = []
        ts = [r.get("ts") for r, _ in rows]
        self.k, self.threshold = 1, math.inf
        if len(rows) >= 4 and all(t is not None for t in ts):
            times = [float(t) for t in ts if t is not None]
            k, threshold = _tick_size(times)
            self.k, self.threshold = k, threshold
            if k > 1:
                self.sink.note(f"{self.what}: no GPU index column; the rows of one timestamp tick "
                               f"({k} rows a few ms apart, ticks {_interval(times, threshold):.3g} s apart) "
                               f"are taken as GPUs 0-{k - 1} in order")
        elif len(rows) > 1 and not all(t is not None for t in ts):
            self.sink.note(f"{self.what}: no GPU index and no timestamp column; the rows are read as one GPU's "
                           "series (several GPUs' rows would be pooled)")
        for row, na in rows:
            self._place(row, na)

    def finish(self) -> None:
        if self.k is None and self.buffer:
            self._learn()


def _interval(times: list[float], threshold: float) -> float:
    gaps = [b - a for a, b in itertools.pairwise(times) if b - a > threshold]
    gaps.sort()
    return gaps[len(gaps) // 2] if gaps else 0.0


def _tick_size(times: list[float]) -> tuple[int, float]:
    """(GPUs per tick, the gap that separates ticks): the rows of a tick are written ms apart."""
    gaps = [max(b - a, 1e-4) for a, b in itertools.pairwise(times)]
    if not gaps:
        return 1, math.inf
    s = sorted(gaps)
    best, cut = 1.0, None
    for a, b in itertools.pairwise(s):
        if b / a > best:
            best, cut = b / a, (a, b)
    if cut is None or best < 5.0:
        return 1, math.inf
    threshold = math.sqrt(cut[0] * cut[1])
    sizes: list[int] = []
    n = 1
    for g in gaps:
        if g > threshold:
            sizes.append(n)
            n = 1
        else:
            n += 1
    full = sizes[1:] if len(sizes) > 2 else sizes  # the first tick may be cut by the paste
    if not full:
        return 1, math.inf
    k, count = Counter(full).most_common(1)[0]
    if k < 2 or k > MAX_GPUS_PER_TICK or count < 0.75 * len(full):
        return 1, math.inf
    return k, threshold


class CsvParser:
    """Header-led (or command-line-led) CSV blocks of --query-gpu and --query-compute-apps."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.matched = False
        self.rows = 0
        self._cols: list[Column] | None = None
        self._apps = False
        self._left = 0
        self._ticker: Ticker | None = None
        self._procs: dict[tuple[str, int | None, str], GpuProcess] = {}
        self._last_mem: dict[int, tuple[int | None, int | None]] = {}
        self._last_ts: float | None = None
        self._gpu_of: dict[str, int] = {}  # pci.bus_id / uuid → index, to place --query-compute-apps rows
        self._since_row = RECENT_ROWS
        self.saw_apps = False

    def mid_series(self) -> bool:
        return self._cols is not None and self._left > 0 and self._since_row < RECENT_ROWS

    def feed(self, line: str) -> bool:
        self._since_row += 1
        if self._cols is not None and self._left > 0:
            self._left -= 1
        command = "--query-gpu" in line or "--query-compute-apps" in line
        head = self._command(line) if command else _header(line) if "," in line else None
        if command and head is None:
            return False  # a command with a header below it: the header names the columns
        if head is not None:
            self._close_block()
            self._cols, self._apps = head
            self._left = MAX_ROWS
            self._ticker = Ticker(self.sink, "--query-gpu CSV")
            self.matched = True
            return True
        if self._cols is None or self._left <= 0 or ("," not in line and len(self._cols) > 1):
            return False
        cells = line.split(",")
        if len(cells) != len(self._cols):
            return False
        return self._app_row(cells) if self._apps else self._gpu_row(cells)

    def _command(self, line: str) -> tuple[list[Column], bool] | None:
        """A pasted command line with ``noheader``: it names the columns of the rows below it."""
        m, f = _COMMAND.search(line), _FORMAT.search(line)
        if not m or not f or "csv" not in f.group(1) or "noheader" not in f.group(1):
            return None
        apps = m.group(1) == "compute-apps"
        cols = [normalise(c, apps) for c in m.group(2).split(",") if c]
        if apps and not any(c.attr == "used" for c in cols):
            return None
        if not apps and not any(c.attr in _METRICS for c in cols):
            return None
        return cols, apps

    def _gpu_row(self, cells: list[str]) -> bool:
        assert self._cols is not None and self._ticker is not None
        row: dict[str, Any] = {}
        na: list[str] = []
        for col, text in zip(self._cols, cells, strict=True):
            _value(col, text, row, na)
        if not any(k in row for k in ("util_pct", "mem_used", "mem_total", "power_w", "sm_clock_mhz", "pcie_gen",
                                      "reasons", "temp_c", "mem_util_pct")) and not na:
            return False
        if any(c.attr == "ts" for c in self._cols) and row.get("ts") is None:
            return False  # a row of another CSV with as many columns
        self.rows += 1
        self._since_row = 0
        if row.get("ts") is not None:
            self._last_ts = row["ts"]
        self._ticker.add(row, na)
        if "gpu" in row:
            self._last_mem[int(row["gpu"])] = (row.get("mem_used"), row.get("mem_total"))
            for ident in (row.get("bus_id"), row.get("uuid")):
                if ident:
                    self._gpu_of[str(ident).strip().lower()] = int(row["gpu"])
        return True

    def _app_row(self, cells: list[str]) -> bool:
        assert self._cols is not None
        row: dict[str, str] = {}
        for col, text in zip(self._cols, cells, strict=True):
            if col.attr != "-":
                row[col.attr] = text.strip()
        pid_text = row.get("pid", "")
        if not pid_text.isdigit():
            return False
        used_text = row.get("used", "")
        used = None if is_na(used_text) else size_bytes(used_text, next(
            (c.unit for c in self._cols if c.attr == "used" and c.unit), "mib"))
        if used is None and not is_na(used_text):
            return False
        where = (row.get("bus_id") or row.get("uuid") or "").strip().lower()
        proc = GpuProcess(self._gpu_of.get(where), int(pid_text), row.get("name", ""), used, "C",
                          used_na=used_text if used is None else "")
        self._procs[(where, proc.pid, proc.name)] = proc
        self.rows += 1
        self._since_row = 0
        self.saw_apps = True
        return True

    def _close_block(self) -> None:
        if self._ticker is not None:
            self._ticker.finish()
        self._ticker = None

    def finish(self) -> None:
        self._close_block()
        if self._procs:
            memory = tuple((g, u, t) for g, (u, t) in sorted(self._last_mem.items()))
            self.sink.snapshot(Snapshot("csv", self._last_ts, memory, tuple(self._procs.values()), listed=True))
            self._procs = {}


# -- headerless rows, read by their values ---------------------------------------------------------

_GPU_NAME = re.compile(r"NVIDIA|Tesla|GeForce|Quadro|TITAN|RTX|GTX|\b[AHLTVBP]\d{1,3}[a-zA-Z]?\b")
_UUID = re.compile(r"^(?:GPU|MIG)-[0-9a-fA-F-]{8,}")
_BUSID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_PSTATE = re.compile(r"^P\d{1,2}$")
_DRIVER = re.compile(r"^\d{3}\.\d{1,3}(?:\.\d{1,3})?$")
_HEX = re.compile(r"^0x[0-9a-fA-F]+$")
_UNIT_VALUE = re.compile(r"^[-+]?\d+(?:\.\d+)?\s*(%|MiB|GiB|MB|W|MHz)$")
_PLAIN = re.compile(r"^[-+]?\d+(?:\.\d+)?$")

# the orders scripts query most (nvidia-smi's own documentation example first); fields only
KNOWN_ORDERS: tuple[tuple[str, ...], ...] = (
    ("timestamp", "name", "pci.bus_id", "driver_version", "pstate", "pcie.link.gen.max", "pcie.link.gen.current",
     "temperature.gpu", "utilization.gpu", "utilization.memory", "memory.total", "memory.free", "memory.used"),
    ("timestamp", "utilization.gpu", "memory.used"),
    ("timestamp", "utilization.gpu", "memory.used", "memory.total"),
    ("timestamp", "index", "utilization.gpu", "memory.used", "memory.total"),
    ("timestamp", "index", "name", "utilization.gpu", "memory.used", "memory.total"),
    ("timestamp", "name", "utilization.gpu", "utilization.memory", "memory.used", "memory.total", "temperature.gpu"),
    ("timestamp", "name", "utilization.gpu", "memory.used", "memory.total"),
    ("timestamp", "name", "pstate", "temperature.gpu", "utilization.gpu", "utilization.memory", "memory.total",
     "memory.free", "memory.used"),
    ("timestamp", "utilization.gpu", "utilization.memory", "memory.used", "memory.total"),
    ("timestamp", "utilization.gpu", "memory.used", "power.draw"),
    ("timestamp", "utilization.gpu", "memory.used", "temperature.gpu", "power.draw"),
    ("index", "name", "utilization.gpu", "memory.used", "memory.total"),
    ("index", "utilization.gpu", "memory.used", "memory.total"),
    ("index", "name", "memory.used", "memory.total", "utilization.gpu"),
    ("name", "utilization.gpu", "temperature.gpu", "power.draw", "power.limit", "memory.used", "memory.total"),
    ("utilization.gpu", "memory.used", "memory.total"),
    ("utilization.gpu", "utilization.memory", "memory.used", "memory.total"),
    ("utilization.gpu", "memory.used", "memory.free"),
    ("utilization.gpu", "memory.total", "memory.used"),
    ("memory.used", "memory.total", "utilization.gpu"),
    ("timestamp", "memory.used", "utilization.gpu"),
)
_FIELD_KIND: dict[str, tuple[str, str]] = {  # field → (kind with units, kind without)
    "timestamp": ("ts", "ts"), "name": ("name", "name"), "pci.bus_id": ("bus", "bus"), "uuid": ("uuid", "uuid"),
    "driver_version": ("driver", "driver"), "pstate": ("pstate", "pstate"), "index": ("num", "num"),
    "pcie.link.gen.max": ("num", "num"), "pcie.link.gen.current": ("num", "num"), "temperature.gpu": ("num", "num"),
    "utilization.gpu": ("%", "num"), "utilization.memory": ("%", "num"), "memory.total": ("MiB", "num"),
    "memory.free": ("MiB", "num"), "memory.used": ("MiB", "num"), "power.draw": ("W", "num"),
    "power.limit": ("W", "num"),
}
_RANGES: dict[str, tuple[float, float]] = {  # plausible values: a column outside them is not that field
    "index": (0, 63), "pcie.link.gen.max": (1, 6), "pcie.link.gen.current": (1, 6), "temperature.gpu": (0, 130),
    "utilization.gpu": (0, 100), "utilization.memory": (0, 100), "memory.total": (256, 1 << 21),
    "memory.free": (0, 1 << 21), "memory.used": (0, 1 << 21), "power.draw": (0, 2000), "power.limit": (5, 2000),
}


def _kind(cells: list[str]) -> str:
    """The kind of a column from its values: ts, name, uuid, bus, pstate, driver, hex, a unit, num, na, ?."""
    vals = [c.strip() for c in cells if not is_na(c)]
    if not vals:
        return "na"
    if all(CSV_TS.match(v) for v in vals):
        return "ts"
    if all(_UUID.match(v) for v in vals):
        return "uuid"
    if all(_BUSID.match(v) for v in vals):
        return "bus"
    if all(_PSTATE.match(v) for v in vals):
        return "pstate"
    if all(_HEX.match(v) for v in vals):
        return "hex"
    if all(_DRIVER.match(v) for v in vals) and len(set(vals)) == 1 and "." in vals[0]:
        return "driver"
    units = {m.group(1) if m else None for m in (_UNIT_VALUE.match(v) for v in vals)}
    if len(units) == 1 and None not in units:
        u = units.pop()
        return "MiB" if u in ("MiB", "MB", "GiB") else str(u)
    if all(_PLAIN.match(v) for v in vals):
        return "num"
    if all(_GPU_NAME.search(v) for v in vals):
        return "name"
    return "?"


def guess_layout(rows: list[list[str]]) -> tuple[list[str], str] | None:
    """Field names for headerless rows, and how they were chosen; None when nothing fits well enough."""
    n = len(rows[0])
    kinds = [_kind([r[i] for r in rows]) for i in range(n)]
    units = any(k in ("%", "MiB", "W", "MHz") for k in kinds)
    nums: list[list[float]] = [[v for v in (number(r[i]) for r in rows) if v is not None] for i in range(n)]
    for order in KNOWN_ORDERS:
        if len(order) != n:
            continue
        ok = True
        for i, fld in enumerate(order):
            want = _FIELD_KIND.get(fld, ("?", "?"))[0 if units else 1]
            if kinds[i] == "na":
                continue
            if kinds[i] != want and not (want == "num" and kinds[i] in ("num",)):
                ok = False
                break
            lo, hi = _RANGES.get(fld, (-math.inf, math.inf))
            if nums[i] and (min(nums[i]) < lo or max(nums[i]) > hi):
                ok = False
                break
        if ok and _memory_consistent(order, nums):
            return list(order), f"matches the common query order --query-gpu={','.join(order)}"
    return _by_kinds(kinds, nums)


def _memory_consistent(order: tuple[str, ...], nums: list[list[float]]) -> bool:
    """memory.total is never below memory.used in the same row (checked on the column maxima/minima)."""
    if "memory.total" in order and "memory.used" in order:
        t, u = nums[order.index("memory.total")], nums[order.index("memory.used")]
        if t and u and min(t) < max(u) * 0.999 and len(set(t)) > len(set(u)):
            return False
    return True


def _by_kinds(kinds: list[str], nums: list[list[float]]) -> tuple[list[str], str] | None:
    """No known order fits: name what the kinds themselves say (units make it safe, plain numbers do not)."""
    fields = ["-"] * len(kinds)
    simple = {"ts": "timestamp", "name": "name", "uuid": "uuid", "bus": "pci.bus_id", "pstate": "pstate",
              "hex": "clocks_throttle_reasons.active"}
    for i, k in enumerate(kinds):
        if k in simple and simple[k] not in fields:
            fields[i] = simple[k]
    pct = [i for i, k in enumerate(kinds) if k == "%"]
    for i, fld in zip(pct, ("utilization.gpu", "utilization.memory"), strict=False):
        fields[i] = fld
    mib = [i for i, k in enumerate(kinds) if k == "MiB"]
    if mib:
        total = max(mib, key=lambda i: (max(nums[i] or [0]), -len(set(nums[i]))))
        if len(mib) == 1:
            fields[mib[0]] = "memory.used"
        else:
            fields[total] = "memory.total"
            rest = [i for i in mib if i != total]
            fields[rest[0]] = "memory.used"
            if len(rest) > 1:
                fields[rest[0]], fields[rest[1]] = "memory.free", "memory.used"  # nvidia-smi docs order: free, used
    watts = [i for i, k in enumerate(kinds) if k == "W"]
    for i, fld in zip(watts, ("power.draw", "power.limit"), strict=False):
        fields[i] = fld
    mhz = [i for i, k in enumerate(kinds) if k == "MHz"]
    for i, fld in zip(mhz, ("clocks.sm", "clocks.mem"), strict=False):
        fields[i] = fld
    if not any(f in ("utilization.gpu", "memory.used") for f in fields):
        return None
    return fields, "read from the values' units (" + ", ".join(f for f in fields if f != "-") + ")"


@dataclass
class _Run:
    rows: list[list[str]] = field(default_factory=list)


class GuessedCsvParser:
    """Headerless --query-gpu rows with no command line above them: the layout is guessed and said so.

    A run of at least ``MIN_RUN`` rows with the same number of cells, one of them an nvidia-smi
    timestamp, a GPU name or a value with a unit, is read; plain numbers alone are too ambiguous
    (any CSV has them) and are left alone.
    """

    MIN_RUN = 3

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.matched = False
        self.rows = 0
        self.stood_down = False
        self._run = _Run()
        self._fields: list[Column] | None = None
        self._ticker: Ticker | None = None
        self._since_row = RECENT_ROWS

    def feed(self, line: str) -> bool:
        self._since_row += 1
        if self.stood_down or "," not in line:
            return False
        if "\x00" in line:
            line = line.replace("\x00", "")
        if _header(line) is not None or "--query-gpu" in line or "--query-compute-apps" in line:
            self.stood_down = True  # a header or a command names the columns: the exact reader has them
            return False
        cells = line.split(",")
        if len(cells) < 2:
            return False
        if self._fields is not None:
            if len(cells) != len(self._fields):
                return False
            return self._row(cells)
        if self._run.rows and len(cells) != len(self._run.rows[0]):
            self._run = _Run()
        self._run.rows.append(cells)
        self._since_row = 0
        if len(self._run.rows) >= LEARN_ROWS:
            self._decide()
        return True

    def _decide(self) -> None:
        rows, self._run = self._run.rows, _Run()
        if len(rows) < self.MIN_RUN:
            return
        strong = any(_kind([r[i] for r in rows]) in ("ts", "name", "%", "MiB", "W", "MHz", "uuid", "bus")
                     for i in range(len(rows[0])))
        layout = guess_layout(rows) if strong else None
        if layout is None:
            return
        fields, how = layout
        self._fields = [Column(f, GPU_FIELDS.get(f, "-")) for f in fields]
        units = any(c.strip().endswith(("%", "MiB", "W", "MHz")) for c in rows[0])
        self.sink.note(f"headerless --query-gpu CSV: columns guessed as {', '.join(fields)} ({how}; "
                       f"{'with' if units else 'without'} units); pass the command line or the header to be sure")
        self._ticker = Ticker(self.sink, "headerless --query-gpu CSV")
        self.matched = True
        for r in rows:
            self._row(r)

    def _row(self, cells: list[str]) -> bool:
        assert self._fields is not None and self._ticker is not None
        row: dict[str, Any] = {}
        na: list[str] = []
        for col, text in zip(self._fields, cells, strict=True):
            _value(col, text, row, na)
        if any(c.attr == "ts" for c in self._fields) and row.get("ts") is None:
            return False
        self.rows += 1
        self._since_row = 0
        self._ticker.add(row, na)
        return True

    def finish(self) -> None:
        if self._fields is None and len(self._run.rows) >= self.MIN_RUN:
            self._decide()
        if self._ticker is not None:
            self._ticker.finish()

    def mid_series(self) -> bool:
        """Whether its rows run up to the lines just read (then the rest of the input is more of them)."""
        return (self._fields is not None or len(self._run.rows) >= self.MIN_RUN) and self._since_row < RECENT_ROWS
