"""``nvidia-smi dmon`` (per-GPU metrics each interval) and ``nvidia-smi pmon`` (per process).

dmon prints a two-line header and a row per GPU per interval::

    # gpu   pwr gtemp mtemp    sm   mem   enc   dec  mclk  pclk pviol tviol    fb  bar1 sbecc dbecc   pci rxpci txpci
    # Idx     W     C     C     %     %     %     %   MHz   MHz     %  bool    MB    MB  errs  errs  errs  MB/s  MB/s
        0    70    48     -    75    46     0     0  7000  1740     0     0  3945     2     -     -     0  1732   535

whatever ``-s`` chose (older drivers print ``temp`` for ``gtemp``, newer add ``jpg ofa ccpm``),
``-o DT`` adds ``#Date Time`` columns (``20250602 12:34:56``), ``--format csv`` separates by commas.
``sm`` is NVML's utilization.gpu; ``fb`` is memory used (MiB); ``rxpci``/``txpci`` MiB/s;
``pviol`` the share of the interval held by the power policy, ``tviol`` thermal (0/1). pmon::

    # gpu        pid  type    sm   mem   enc   dec   command
        0      22010     C    98    56     -     -   python3

is per process (``-`` rows: no process on that GPU); the SM % of a GPU's processes in one interval
add up to an upper bound of the GPU's utilisation (0 when none ran a kernel).

Rows are read only under a header (within ``MAX_ROWS`` lines of it): dmon rows carry no text of
their own for the loose reader's pre-filter, the header brings them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnose.collectors.nvsmi_base import (
    GpuProcess,
    Reading,
    Sink,
    Snapshot,
    dmon_ts,
    is_na,
    number,
    size_bytes,
)
from diagnose.units import MIB

MAX_ROWS = 2_000_000  # rows read under one header (a day of dmon -d 1 on 16 GPUs is 1.4 M)
RECENT_ROWS = 100  # a row within this many lines: the series goes on
TRIGGERS: tuple[str | tuple[str, int, int], ...] = (
    ("# gpu", 0, MAX_ROWS), ("#gpu", 0, MAX_ROWS), ("#Date", 0, MAX_ROWS), ("#Time", 0, MAX_ROWS),
)
_DMON_COLS = {"pwr", "gtemp", "mtemp", "temp", "sm", "mem", "enc", "dec", "jpg", "ofa", "mclk", "pclk", "pviol",
              "tviol", "fb", "bar1", "ccpm", "sbecc", "dbecc", "pci", "rxpci", "txpci"}


def _header(line: str) -> list[str] | None:
    s = line.strip()
    if not s.startswith("#"):
        return None
    cols = [c.strip().lower() for c in (s[1:].split(",") if "," in s else s[1:].split())]
    cols = [c for c in cols if c]
    if "gpu" not in cols:
        return None
    if "pid" in cols and ("command" in cols or "sm" in cols):
        return cols
    if sum(1 for c in cols if c in _DMON_COLS) >= 2:
        return cols
    return None


@dataclass
class _ProcStats:
    gpu: int
    pid: int
    type: str
    name: str
    n: int = 0
    sm_sum: float = 0.0
    fb_max: int | None = None


@dataclass
class _Tick:
    key: object = None
    sm: dict[int, float] = field(default_factory=dict)
    fb: dict[int, int] = field(default_factory=dict)
    seen: set[tuple[int, int]] = field(default_factory=set)
    ts: float | None = None


class MonitorParser:
    """dmon and pmon blocks; readings (and pmon's processes, at the end) go to ``sink``."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.matched = False
        self.rows = 0
        self.kind = ""
        self._cols: list[str] | None = None
        self._left = 0
        self._day = 0.0
        self._last_clock: float | None = None
        self._procs: dict[tuple[int, int], _ProcStats] = {}
        self._tick = _Tick()
        self._ticks = 0
        self._last_ts: float | None = None
        self.pmon_seen = False
        self._since_row = RECENT_ROWS

    def mid_series(self) -> bool:
        return self._cols is not None and self._left > 0 and self._since_row < RECENT_ROWS

    def feed(self, line: str) -> bool:
        self._since_row += 1
        if self._cols is not None:
            self._left -= 1
        if "#" in line:
            cols = _header(line)
            if cols is not None:
                self._end_tick()
                self._cols = cols
                self._left = MAX_ROWS
                self.kind = "pmon" if "pid" in cols else "dmon"
                self.pmon_seen = self.pmon_seen or self.kind == "pmon"
                self.matched = True
                return True
            if self._cols is not None and line.lstrip().startswith("#"):
                return True  # the units line, or a comment
        if self._cols is None or self._left <= 0:
            return False
        cells = [c.strip() for c in line.split(",")] if "," in line else line.split()
        if self.kind == "pmon":
            return self._pmon(cells)
        if len(cells) != len(self._cols):
            return False
        return self._dmon(cells)

    def _time(self, row: dict[str, str]) -> float | None:
        date, clock = row.get("date"), row.get("time")
        if date is None and clock is None:
            return None
        ts = dmon_ts(date, clock)
        if ts is not None and date is None:
            if self._last_clock is not None and ts + self._day < self._last_clock - 43200:
                self._day += 86400.0  # -o T only: the clock passed midnight
            ts += self._day
            self._last_clock = ts
        return ts

    def _dmon(self, cells: list[str]) -> bool:
        assert self._cols is not None
        row = dict(zip(self._cols, cells, strict=True))
        idx = row.get("gpu", "")
        if not idx.isdigit():
            return False
        na: list[str] = []

        def num(col: str) -> float | None:
            text = row.get(col)
            if text is None:
                return None
            v = number(text)
            if v is None and not is_na(text):
                raise ValueError(col)
            if v is None and col in ("sm", "pwr"):
                na.append(f"dmon {col}: {text}")
            return v

        try:
            ts = self._time(row)
            if ("date" in row or "time" in row) and ts is None:
                return False
            rx, tx = num("rxpci"), num("txpci")
            fb = row.get("fb")
            reading = Reading(
                gpu=int(idx), form="dmon", ts=ts, util_pct=num("sm"), mem_util_pct=num("mem"), power_w=num("pwr"),
                temp_c=num("gtemp") if "gtemp" in row else num("temp"), mem_clock_mhz=num("mclk"),
                sm_clock_mhz=num("pclk"), power_violation_pct=num("pviol"), thermal_violation_pct=num("tviol"),
                mem_used=size_bytes(fb) if fb is not None and not is_na(fb) else None,
                rx_bytes_per_s=rx * MIB if rx is not None else None,
                tx_bytes_per_s=tx * MIB if tx is not None else None, na=tuple(na))
        except ValueError:
            return False
        self.rows += 1
        self._since_row = 0
        self._last_ts = ts if ts is not None else self._last_ts
        self.sink.reading(reading)
        return True

    def _pmon(self, cells: list[str]) -> bool:
        assert self._cols is not None
        n = len(self._cols)
        if len(cells) < n - 1:
            return False
        if "command" in self._cols and len(cells) > n:  # a command with spaces
            k = self._cols.index("command")
            cells = [*cells[:k], " ".join(cells[k:])]
        row = dict(zip(self._cols, cells, strict=False))
        idx = row.get("gpu", "")
        if not idx.isdigit():
            return False
        ts = self._time(row)
        if ("date" in row or "time" in row) and ts is None:
            return False
        gpu, pid_text = int(idx), row.get("pid", "-")
        pid = int(pid_text) if pid_text.isdigit() else None
        ident = (gpu, pid if pid is not None else -1)
        # an interval ends where the time changes, or (no time column) where a (gpu, pid) comes again
        if (self._tick.key != ts) if ts is not None else (ident in self._tick.seen):
            self._end_tick()
            self._tick.key = ts
        self._tick.ts = ts
        sm = number(row.get("sm", "-"))
        self._tick.sm[gpu] = self._tick.sm.get(gpu, 0.0) + (sm or 0.0)
        self._tick.seen.add(ident)
        if pid is not None:
            st = self._procs.setdefault((gpu, pid), _ProcStats(gpu, pid, row.get("type", ""), row.get("command", "")))
            st.n += 1
            st.sm_sum += sm or 0.0
            fb = row.get("fb")
            if fb is not None and not is_na(fb):
                b = size_bytes(fb)
                if b is not None:
                    st.fb_max = max(st.fb_max or 0, b)
                    self._tick.fb[gpu] = self._tick.fb.get(gpu, 0) + b
        self.rows += 1
        self._since_row = 0
        self.matched = True
        return True

    def _end_tick(self) -> None:
        t = self._tick
        if t.sm:
            self._ticks += 1
            for gpu, sm in sorted(t.sm.items()):
                # the listed processes' memory: a lower bound of what the GPU has in use
                self.sink.reading(Reading(gpu=gpu, form="pmon", ts=t.ts, util_pct=min(100.0, sm),
                                          mem_used=t.fb.get(gpu)))
            self._last_ts = t.ts if t.ts is not None else self._last_ts
        self._tick = _Tick()

    def finish(self) -> None:
        self._end_tick()
        if self._procs:
            procs = tuple(GpuProcess(s.gpu, s.pid, s.name, s.fb_max, s.type, sm_pct=s.sm_sum / s.n if s.n else None)
                          for s in self._procs.values())
            self.sink.snapshot(Snapshot("pmon", self._last_ts, (), procs, listed=False))
            self._procs = {}
