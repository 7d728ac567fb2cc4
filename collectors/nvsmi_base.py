"""What every ``nvidia-smi`` form reads into: frozen records and the value parsing they share.

A *reading* is one GPU at one instant (a row of ``--query-gpu`` CSV or ``dmon``, a GPU of a table
or of a ``-q`` / ``-q -x`` document); a *snapshot* is what one document says at once about the
devices' memory and the processes holding it (a table with its processes section, a ``-q``
document, an XML document). Readings and snapshots are handed to a sink one at a time, so a day of
``-l 1`` output is aggregated in bounded memory.

Values are read the way nvidia-smi prints them: ``MiB`` (its ``MB`` is MiB too), ``%``, ``W``,
``MHz``, ``C``, ``16x``, ``KB/s`` (KiB, as NVML's), ``N/A`` / ``[N/A]`` / ``[Not Supported]`` /
``ERR!`` / ``-`` for a value the driver could not give (kept as the reason, never as a number).
"""

from __future__ import annotations

import calendar
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from diagnose.collectors.nvml import REASONS
from diagnose.units import unit_bytes

# nvidia-smi's names of clock-event (formerly clock-throttle) reasons → NVML's names
_REASON_NAMES: dict[str, str] = {
    "idle": "GpuIdle", "gpuidle": "GpuIdle",
    "applicationsclockssetting": "ApplicationsClocksSetting", "applicationclockssetting": "ApplicationsClocksSetting",
    "swpowercap": "SwPowerCap", "hwslowdown": "HwSlowdown", "syncboost": "SyncBoost",
    "swthermalslowdown": "SwThermalSlowdown", "hwthermalslowdown": "HwThermalSlowdown",
    "hwpowerbrakeslowdown": "HwPowerBrakeSlowdown",
    "displayclocksetting": "DisplayClockSetting", "displayclockssetting": "DisplayClockSetting",
}
REASON_BITS: dict[str, int] = {name: bit for bit, name in REASONS.items()}


def reason_name(label: str) -> str | None:
    """NVML's name for a reason as nvidia-smi labels it (``SW Power Cap``, ``clocks_event_reason_sw_power_cap``)."""
    key = re.sub(r"[^a-z]", "", label.lower())
    for prefix in ("clockseventreason", "clocksthrottlereason", "clockseventreasons", "clocksthrottlereasons"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return _REASON_NAMES.get(key)


def reasons_from_mask(mask: int) -> frozenset[str]:
    return frozenset(name for bit, name in REASONS.items() if mask & bit)


@dataclass(frozen=True)
class Reading:
    """One GPU at one instant, in the units of the evidence (bytes, bytes/s, W, MHz, °C, %)."""

    gpu: int
    form: str  # table | csv | q | xml | dmon | pmon
    ts: float | None = None  # seconds (the clock of the machine that printed it; only differences are used)
    name: str = ""
    bus_id: str = ""
    uuid: str = ""
    util_pct: float | None = None
    mem_util_pct: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_default_limit_w: float | None = None
    temp_c: float | None = None
    temp_slowdown_c: float | None = None
    sm_clock_mhz: float | None = None
    sm_clock_max_mhz: float | None = None
    mem_clock_mhz: float | None = None
    pstate: str = ""
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_gen_gpu_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    tx_bytes_per_s: float | None = None  # device → host
    rx_bytes_per_s: float | None = None  # host → device
    replays: int | None = None
    reasons: frozenset[str] | None = None  # active clock-event reasons (NVML names); None: not reported
    power_violation_pct: float | None = None  # dmon pviol
    thermal_violation_pct: float | None = None  # dmon tviol (0/1 on most drivers: "bool")
    mig: bool = False
    na: tuple[str, ...] = ()  # "field: what nvidia-smi printed" for values it could not give


@dataclass(frozen=True)
class GpuProcess:
    gpu: int | None
    pid: int | None
    name: str
    used: int | None  # bytes; None where the driver cannot say (Windows WDDM prints N/A)
    type: str = ""
    gi: str = ""  # MIG GPU instance id
    ci: str = ""  # MIG compute instance id
    sm_pct: float | None = None  # pmon
    used_na: str = ""  # what was printed instead of a size


@dataclass(frozen=True)
class MigDevice:
    gpu: int
    gi: str
    ci: str
    dev: str
    used: int | None
    total: int | None
    sm_count: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """What one document says at one instant about each device's memory and who holds it."""

    form: str
    ts: float | None
    memory: tuple[tuple[int, int | None, int | None], ...]  # (gpu, used, total) per device
    processes: tuple[GpuProcess, ...]
    listed: bool  # the document had a process list (possibly empty); False: processes unknown
    mig: tuple[MigDevice, ...] = ()


@dataclass
class Sink:
    """Where a parser hands what it reads; ``problem`` collects why a part could not be read."""

    reading: Callable[[Reading], None]
    snapshot: Callable[[Snapshot], None]
    problem: Callable[[str], None]
    note: Callable[[str], None]  # what the reader had to assume (a guessed column layout), said in the evidence


# -- values ----------------------------------------------------------------------------------------

NA_WORDS = ("n/a", "[n/a]", "not supported", "[not supported]", "err!", "-", "", "unknown error", "[unknown error]",
            "not available", "insufficient permissions", "[insufficient permissions]", "requested functionality "
            "has been deprecated", "gpu is lost", "[gpu is lost]", "none")
_NUM = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z/%]*)")


def is_na(text: str) -> bool:
    t = text.strip().lower()
    return t in NA_WORDS or t.startswith(("not available", "[not available", "n/a"))


def number(text: str) -> float | None:
    """The leading number of a cell (``87 %``, ``29W``, ``1410 MHz``), None for N/A and the like."""
    try:  # most cells of a long recording are bare numbers: the fast path
        v = float(text)
    except ValueError:
        pass
    else:
        return v if math.isfinite(v) else None
    if is_na(text):
        return None
    m = _NUM.match(text)
    return float(m.group(1)) if m else None


def size_bytes(text: str, default_unit: str = "mib") -> int | None:
    """``1583MiB``, ``22686 MiB``, ``12 MB`` (nvidia-smi's MB is MiB), a bare number in ``default_unit``."""
    if is_na(text):
        return None
    m = _NUM.match(text)
    if not m:
        return None
    mult = unit_bytes(m.group(2) or default_unit)
    if mult is None:
        return None
    return int(float(m.group(1)) * mult)


def rate_bytes(text: str, default_unit: str = "kb/s") -> float | None:
    """``1066699 KB/s`` (NVML's KB is KiB), ``1732 MB/s`` (dmon: MiB/s)."""
    if is_na(text):
        return None
    m = _NUM.match(text)
    if not m:
        return None
    unit = (m.group(2) or default_unit).lower()
    mult = unit_bytes(unit[:-2]) if unit.endswith("/s") else None
    return float(m.group(1)) * mult if mult else None


def lanes(text: str) -> int | None:
    v = number(text)
    return int(v) if v is not None else None


def integer(text: str) -> int | None:
    v = number(text)
    return int(v) if v is not None else None


def na_reason(field: str, text: str) -> str:
    return f"{field}: {text.strip() or 'empty'}"


# -- time ------------------------------------------------------------------------------------------

_CTIME = re.compile(
    r"\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\s+([A-Z][a-z]{2})\s+(\d{1,2})\s+(\d{2}):(\d{2}):(\d{2})\s+(\d{4})\b")
_MONTHS = {m: i for i, m in enumerate(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
                                       "Dec"), start=1)}
CSV_TS = re.compile(r"^\s*(\d{4})/(\d{2})/(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?\s*$")
DMON_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})$")
CLOCK = re.compile(r"^(\d{2}):(\d{2}):(\d{2})$")


def _epoch(y: int, mo: int, d: int, h: int, mi: int, s: int, frac: float = 0.0) -> float | None:
    try:
        return calendar.timegm(time.struct_time((y, mo, d, h, mi, s, 0, 0, 0))) + frac
    except (OverflowError, ValueError):
        return None


def ctime_ts(text: str) -> float | None:
    """``Sat Jan 31 14:36:05 2026`` anywhere in a line (the table's date line, ``-q``'s Timestamp)."""
    m = _CTIME.search(text)
    if not m or m.group(1) not in _MONTHS:
        return None
    mon, day, h, mi, s, y = _MONTHS[m.group(1)], *(int(x) for x in m.group(2, 3, 4, 5, 6))
    if not (1 <= day <= 31 and h < 24 and mi < 60 and s < 61):
        return None
    return _epoch(y, mon, day, h, mi, s)


def csv_ts(text: str) -> float | None:
    """``2025/09/08 14:14:37.120``, the ``timestamp`` field of ``--query-gpu``."""
    m = CSV_TS.match(text)
    if not m:
        return None
    y, mo, d, h, mi, s = (int(x) for x in m.group(1, 2, 3, 4, 5, 6))
    if not (1 <= mo <= 12 and 1 <= d <= 31 and h < 24 and mi < 60 and s < 61):
        return None
    frac = float("0." + m.group(7)) if m.group(7) else 0.0
    return _epoch(y, mo, d, h, mi, s, frac)


def dmon_ts(date: str | None, clock: str | None) -> float | None:
    """``dmon -o DT``'s ``20250602`` and ``12:34:56`` (either may be absent)."""
    secs = 0.0
    if clock is not None:
        c = CLOCK.match(clock)
        if not c:
            return None
        h, mi, s = (int(x) for x in c.groups())
        if h >= 24 or mi >= 60 or s >= 61:
            return None
        secs = h * 3600 + mi * 60 + s
    if date is None:
        return secs if clock is not None else None
    d = DMON_DATE.match(date)
    if not d:
        return None
    y, mo, dd = (int(x) for x in d.groups())
    if not (1 <= mo <= 12 and 1 <= dd <= 31):
        return None
    day = _epoch(y, mo, dd, 0, 0, 0)
    return None if day is None else day + secs
