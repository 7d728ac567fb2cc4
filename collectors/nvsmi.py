"""``nvidia-smi`` output in every form → per-GPU readings and per-document snapshots.

Pure parsing, streamed line by line (``NvsmiParser.feed``); each form has its reader:

* ``diagnose.collectors.nvsmi_table`` — the default table (410-era to 580+ layouts, Windows WDDM/TCC,
  MIG devices, the processes table with or without per-process memory), ``nvidia-smi -l`` /
  ``watch nvidia-smi`` pastes as a time series, process lines quoted in prose;
* ``diagnose.collectors.nvsmi_query`` — ``nvidia-smi -q`` text and ``nvidia-smi -q -x`` XML (v11-v13);
* ``diagnose.collectors.nvsmi_csv`` — ``--query-gpu`` / ``--query-compute-apps`` CSV with a header (or the
  command line above it), units or not, ``-l`` time series, GPUs interleaved; and
  ``GuessedCsvParser`` for headerless rows, whose layout is guessed from the values and said so;
* ``diagnose.collectors.nvsmi_monitor`` — ``nvidia-smi dmon`` and ``pmon``.

What is read goes to a ``Sink`` (readings, snapshots, problems, notes) one record at a time, so
the memory a long recording costs is the deriver's running aggregates, not the records.
"""

from __future__ import annotations

from diagnose.collectors.nvsmi_base import GpuProcess, MigDevice, Reading, Sink, Snapshot
from diagnose.collectors.nvsmi_csv import HEADER_LITERALS as _CSV_LITERALS
from diagnose.collectors.nvsmi_csv import MAX_ROWS as _CSV_ROWS
from diagnose.collectors.nvsmi_csv import CsvParser, GuessedCsvParser
from diagnose.collectors.nvsmi_monitor import TRIGGERS as _MONITOR_TRIGGERS
from diagnose.collectors.nvsmi_monitor import MonitorParser
from diagnose.collectors.nvsmi_query import TRIGGERS as _QUERY_TRIGGERS
from diagnose.collectors.nvsmi_query import QueryTextParser, QueryXmlParser
from diagnose.collectors.nvsmi_table import TRIGGERS as _TABLE_TRIGGERS
from diagnose.collectors.nvsmi_table import TableParser
from diagnose.units import MIB

__all__ = ["MIB", "TRIGGERS", "GpuProcess", "GuessedCsvParser", "MigDevice", "NvsmiParser", "Reading", "Sink",
           "Snapshot"]

# every line a reader acts on holds one of these (or lies within the lines after one): the loose
# reader's pre-filter past a big file's head
TRIGGERS: tuple[str | tuple[str, int, int], ...] = (
    *_TABLE_TRIGGERS, *_QUERY_TRIGGERS, *_MONITOR_TRIGGERS, *((lit, 0, _CSV_ROWS) for lit in _CSV_LITERALS),
)


class NvsmiParser:
    """Every form's reader, fed the same lines; an XML document's lines go to the XML reader alone."""

    def __init__(self, sink: Sink) -> None:
        self.table = TableParser(sink)
        self.query = QueryTextParser(sink)
        self.xml = QueryXmlParser(sink)
        self.csv = CsvParser(sink)
        self.monitor = MonitorParser(sink)
        self.lines = 0
        self._finished = False

    def feed(self, line: str) -> None:
        self.lines += 1
        if "\x00" in line:  # a log file rewritten while a writer held its offset: NULs, then the next record
            line = line.replace("\x00", "")
        if self.xml.feed(line):
            return
        self.query.feed(line)
        self.table.feed(line)
        self.csv.feed(line)
        self.monitor.feed(line)

    def finish(self) -> None:
        """Close what is still open (the last snapshot, a document cut short); idempotent."""
        if self._finished:
            return
        self._finished = True
        for p in (self.xml, self.query, self.table, self.csv, self.monitor):
            p.finish()

    def forms(self) -> list[str]:
        """The forms recognised, for the evidence's details."""
        out = []
        if self.table.matched:
            out.append("table")
        if self.query.matched:
            out.append("-q")
        if self.xml.matched:
            out.append(f"-q -x{' (schema ' + self.xml.schema + ')' if self.xml.schema else ''}")
        if self.csv.matched:
            out.append("--query CSV")
        if self.monitor.matched:
            out.append("pmon" if self.monitor.pmon_seen and self.monitor.kind == "pmon" else "dmon")
        return out

    def matched(self) -> bool:
        return bool(self.table.matched or self.query.matched or self.xml.documents or self.csv.rows
                    or self.monitor.rows)

    def mid_series(self) -> bool:
        """Whether the lines just read are inside a document or a series of rows that continues past them."""
        return self.xml.open or self.query.open or self.csv.mid_series() or self.monitor.mid_series()
