"""``nvidia-smi -q`` text and ``nvidia-smi -q -x`` XML: every GPU's full state, one document at a time.

Both forms carry the same fields (the XML's ``fb_memory_usage/used`` is the text's ``FB Memory
Usage / Used``), so both are mapped onto one set of canonical keys and turned into readings, the
processes and the MIG devices of each GPU. Schema differences handled: ``clocks_throttle_reasons``
(≤ 530) and ``clocks_event_reasons`` (535+), ``power_readings`` (v11) and ``gpu_power_readings``
(v12+, with ``average_power_draw`` / ``instant_power_draw`` on newer drivers), PCIe ``device`` /
``host`` maxima (v12+), MIG devices with their own memory, process memory ``N/A`` / ``Not
available in WDDM driver model`` (Windows), ``Processes : None`` (older text).

XML is read with ``xml.etree``'s pull parser, from the root element ``<nvidia_smi_log>`` on: the
XML declaration and the ``DOCTYPE`` line above it are never given to the parser, so there is no
DTD, no entity can be declared and nothing external can be fetched; a document is bounded in size
(``MAX_DOC_BYTES``, ``MAX_DOC_LINES``) and each ``<gpu>`` is dropped once read. A document cut
short keeps the GPUs read before the cut and says where it was cut.

Documents begin at ``==============NVSMI LOG==============`` / ``Attached GPUs :`` (text) and
``<nvidia_smi_log>`` (XML); ``-l`` repeats them, each with its ``Timestamp``: a time series.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from diagnose.collectors.nvsmi_base import (
    GpuProcess,
    MigDevice,
    Reading,
    Sink,
    Snapshot,
    ctime_ts,
    integer,
    is_na,
    lanes,
    na_reason,
    number,
    rate_bytes,
    reason_name,
    size_bytes,
)

MAX_DOC_LINES = 100_000  # lines of one document read (8 GPUs with every clock listed are ~10 k)
MAX_DOC_BYTES = 16 << 20  # bytes of one XML document held while it is parsed

TRIGGERS: tuple[str | tuple[str, int, int], ...] = (
    ("NVSMI LOG", 0, MAX_DOC_LINES), ("Attached GPUs", 0, MAX_DOC_LINES), ("<nvidia_smi_log", 1, MAX_DOC_LINES),
)

# -q text: (section…, key) suffixes → canonical field (lower case; the last element is the key)
_Q_KEYS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("product name",), "name"), (("gpu uuid",), "uuid"), (("mig mode", "current"), "mig"),
    (("performance state",), "pstate"),
    (("pcie generation", "max"), "gen_max"), (("pcie generation", "current"), "gen_cur"),
    (("pcie generation", "device max"), "gen_devmax"), (("pcie generation", "device current"), "gen_devcur"),
    (("link width", "max"), "width_max"), (("link width", "current"), "width_cur"),
    (("tx throughput",), "tx"), (("rx throughput",), "rx"), (("replays since reset",), "replays"),
    (("fb memory usage", "total"), "fb_total"), (("fb memory usage", "reserved"), "fb_reserved"),
    (("fb memory usage", "used"), "fb_used"), (("fb memory usage", "free"), "fb_free"),
    (("utilization", "gpu"), "util_gpu"), (("utilization", "memory"), "util_mem"),
    (("temperature", "gpu current temp"), "temp_gpu"), (("temperature", "gpu slowdown temp"), "temp_slow"),
    (("power draw",), "power_draw"), (("average power draw",), "power_avg"), (("instant power draw",), "power_inst"),
    (("current power limit",), "power_limit"), (("power limit",), "power_limit"),
    (("enforced power limit",), "power_enforced"), (("default power limit",), "power_default"),
    (("max clocks", "sm"), "clockmax_sm"), (("max clocks", "graphics"), "clockmax_gr"),
    (("clocks", "sm"), "clock_sm"), (("clocks", "graphics"), "clock_gr"), (("clocks", "memory"), "clock_mem"),
)
# -q -x XML: tag paths under <gpu> → canonical field
_X_KEYS: dict[tuple[str, ...], str] = {
    ("product_name",): "name", ("uuid",): "uuid", ("pci", "pci_bus_id"): "bus_id", ("mig_mode", "current_mig"): "mig",
    ("performance_state",): "pstate",
    ("pci", "pci_gpu_link_info", "pcie_gen", "max_link_gen"): "gen_max",
    ("pci", "pci_gpu_link_info", "pcie_gen", "current_link_gen"): "gen_cur",
    ("pci", "pci_gpu_link_info", "pcie_gen", "max_device_link_gen"): "gen_devmax",
    ("pci", "pci_gpu_link_info", "pcie_gen", "device_current_link_gen"): "gen_devcur",
    ("pci", "pci_gpu_link_info", "link_widths", "max_link_width"): "width_max",
    ("pci", "pci_gpu_link_info", "link_widths", "current_link_width"): "width_cur",
    ("pci", "tx_util"): "tx", ("pci", "rx_util"): "rx", ("pci", "replay_counter"): "replays",
    ("fb_memory_usage", "total"): "fb_total", ("fb_memory_usage", "reserved"): "fb_reserved",
    ("fb_memory_usage", "used"): "fb_used", ("fb_memory_usage", "free"): "fb_free",
    ("utilization", "gpu_util"): "util_gpu", ("utilization", "memory_util"): "util_mem",
    ("temperature", "gpu_temp"): "temp_gpu", ("temperature", "gpu_temp_slow_threshold"): "temp_slow",
    ("clocks", "sm_clock"): "clock_sm", ("clocks", "graphics_clock"): "clock_gr", ("clocks", "mem_clock"): "clock_mem",
    ("max_clocks", "sm_clock"): "clockmax_sm", ("max_clocks", "graphics_clock"): "clockmax_gr",
}
_X_POWER = {"power_draw": "power_draw", "average_power_draw": "power_avg", "instant_power_draw": "power_inst",
            "power_limit": "power_limit", "current_power_limit": "power_limit",
            "enforced_power_limit": "power_enforced", "default_power_limit": "power_default"}

_GPU_LINE = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KV = re.compile(r"^(\s*)(\S.*?)\s+:\s?(.*)$")
_Q_START = re.compile(r"=+\s*NVSMI LOG\s*=+|^\s*Attached GPUs\s+:")


class _Gpu:
    """One GPU of a document while it is read: canonical fields, reasons, processes, MIG devices."""

    def __init__(self, index: int, bus: str = "") -> None:
        self.index = index
        self.f: dict[str, str] = {"bus_id": bus} if bus else {}
        self.reasons: dict[str, bool] = {}
        self.procs: list[GpuProcess] = []
        self.mig: list[MigDevice] = []

    def reading(self, form: str, ts: float | None) -> Reading:
        f = self.f
        na: list[str] = []

        def num(key: str, label: str) -> float | None:
            text = f.get(key)
            if text is None:
                return None
            v = number(text)
            if v is None:
                na.append(na_reason(label, text))
            return v

        def size(key: str, label: str) -> int | None:
            text = f.get(key)
            if text is None:
                return None
            v = size_bytes(text)
            if v is None:
                na.append(na_reason(label, text))
            return v

        util = num("util_gpu", "utilization.gpu")
        mig = f.get("mig", "").strip().lower() == "enabled"
        power = next((v for k in ("power_draw", "power_inst", "power_avg")
                      if f.get(k) is not None and (v := number(f[k])) is not None), None)
        if power is None and any(f.get(k) is not None for k in ("power_draw", "power_inst", "power_avg")):
            na.append(na_reason("power.draw", next(f[k] for k in ("power_draw", "power_inst", "power_avg") if k in f)))
        limit = next((v for k in ("power_enforced", "power_limit") if f.get(k) is not None
                      and (v := number(f[k])) is not None), None)
        gen_max = lanes(f.get("gen_max", "")) if f.get("gen_max") else None
        gen_devmax = lanes(f.get("gen_devmax", "")) if f.get("gen_devmax") else None
        return Reading(
            gpu=self.index, form=form, ts=ts, name=f.get("name", "").strip(), bus_id=f.get("bus_id", "").strip(),
            uuid=f.get("uuid", "").strip(), util_pct=util, mem_util_pct=num("util_mem", "utilization.memory"),
            mem_used=size("fb_used", "memory.used"), mem_total=size("fb_total", "memory.total"),
            power_w=power, power_limit_w=limit, power_default_limit_w=num("power_default", "power.default_limit"),
            temp_c=num("temp_gpu", "temperature.gpu"), temp_slowdown_c=num("temp_slow", "temperature.slowdown"),
            sm_clock_mhz=num("clock_sm", "clocks.sm") if "clock_sm" in f else num("clock_gr", "clocks.gr"),
            sm_clock_max_mhz=(num("clockmax_sm", "clocks.max.sm") if "clockmax_sm" in f
                              else num("clockmax_gr", "clocks.max.gr")),
            mem_clock_mhz=num("clock_mem", "clocks.mem"), pstate=f.get("pstate", "").strip() if not is_na(
                f.get("pstate", "")) else "",
            pcie_gen=lanes(f["gen_cur"]) if f.get("gen_cur") else None, pcie_gen_max=gen_max,
            pcie_gen_gpu_max=gen_devmax,
            pcie_width=lanes(f["width_cur"]) if f.get("width_cur") else None,
            pcie_width_max=lanes(f["width_max"]) if f.get("width_max") else None,
            tx_bytes_per_s=rate_bytes(f["tx"]) if f.get("tx") else None,
            rx_bytes_per_s=rate_bytes(f["rx"]) if f.get("rx") else None,
            replays=integer(f["replays"]) if f.get("replays") else None,
            reasons=frozenset(n for n, on in self.reasons.items() if on) if self.reasons else None,
            mig=mig, na=tuple(na))

    def memory(self) -> tuple[int, int | None, int | None]:
        used = size_bytes(self.f["fb_used"]) if self.f.get("fb_used") else None
        total = size_bytes(self.f["fb_total"]) if self.f.get("fb_total") else None
        return self.index, used, total


def _proc(gpu: int, d: dict[str, str]) -> GpuProcess | None:
    pid = integer(d.get("pid", ""))
    if pid is None:
        return None
    used_text = d.get("used", "").strip()
    used = size_bytes(used_text) if used_text and not is_na(used_text) else None
    gi, ci = d.get("gi", "").strip(), d.get("ci", "").strip()
    return GpuProcess(gpu, pid, d.get("name", "").strip(), used, d.get("type", "").strip(),
                      gi="" if is_na(gi) else gi, ci="" if is_na(ci) else ci,
                      used_na=used_text if used is None else "")


def _mig(gpu: int, d: dict[str, str]) -> MigDevice:
    return MigDevice(gpu, d.get("gi", "").strip(), d.get("ci", "").strip(), d.get("index", "").strip(),
                     size_bytes(d["used"]) if d.get("used") else None,
                     size_bytes(d["total"]) if d.get("total") else None, integer(d.get("sm", "")))


def _emit(sink: Sink, form: str, ts: float | None, gpus: list[_Gpu], listed: bool) -> None:
    for g in gpus:
        sink.reading(g.reading(form, ts))
    sink.snapshot(Snapshot(form, ts, tuple(g.memory() for g in gpus),
                           tuple(p for g in gpus for p in g.procs), listed, tuple(m for g in gpus for m in g.mig)))


class QueryTextParser:
    """``nvidia-smi -q`` (and ``-q -d …``, ``-q -l``) text documents."""

    RECENT = 50  # a document whose last field is this many lines back has ended (the text has no end marker)

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.documents = 0
        self.matched = False
        self._open = False
        self._left = 0
        self._ts: float | None = None
        self._stack: list[tuple[int, str]] = []
        self._gpus: list[_Gpu] = []
        self._proc: dict[str, str] | None = None
        self._pending_ids: dict[str, str] = {}
        self._mig: dict[str, str] | None = None
        self._listed = False
        self._since_field = 0

    @property
    def open(self) -> bool:
        return self._open and self._since_field < self.RECENT

    def feed(self, line: str) -> bool:
        self._since_field += 1
        if self._open:
            self._left -= 1
            if self._left <= 0:
                self._close(cut=True)
        if ("NVSMI LOG" in line or "Attached GPUs" in line) and _Q_START.search(line):
            if self._open and "Attached GPUs" in line and not self._gpus:
                return True  # the header line of the document already open
            self._close()
            self._open = True
            self._left = MAX_DOC_LINES
            self.documents += 1
            return True
        if not self._open:
            return False
        stripped = line.strip()
        if not stripped:
            return False
        m = _GPU_LINE.match(stripped)
        if m:
            self._end_records()
            self._gpus.append(_Gpu(len(self._gpus), m.group(1)))
            self._stack = []
            self.matched = True
            return True
        indent = len(line) - len(line.lstrip())
        kv = _KV.match(line)
        if kv is None:  # a section header
            self._pop(indent)
            name = stripped.lower()
            if name == "mig device":
                self._end_records()
                self._mig = {}
            self._stack.append((indent, name))
            return True
        key, value = kv.group(2).strip().lower(), kv.group(3).strip()
        self._since_field = 0
        self._pop(indent)
        path = (*(n for _, n in self._stack), key)
        if key == "timestamp" and not self._stack and not self._gpus:
            self._ts = ctime_ts(value)
            return True
        if not self._gpus:
            return True
        self._field(self._gpus[-1], path, key, value)
        return True

    def _pop(self, indent: int) -> None:
        while self._stack and self._stack[-1][0] >= indent:
            name = self._stack.pop()[1]
            if name == "mig device":
                self._end_records()

    def _field(self, g: _Gpu, path: tuple[str, ...], key: str, value: str) -> None:
        sections = path[:-1]
        if "processes" in sections or key == "processes":
            self._process_field(key, value)
            return
        if "mig device" in sections:
            if self._mig is not None:
                k = {"index": "index", "gpu instance id": "gi", "compute instance id": "ci",
                     "multiprocessor count": "sm"}.get(key)
                if k:
                    self._mig[k] = value
                elif sections[-1] == "fb memory usage" and key in ("used", "total"):
                    self._mig[key] = value
            return
        if (sections and sections[-1] in ("clocks throttle reasons", "clocks event reasons")) or (
                len(sections) > 1 and sections[-2] in ("clocks throttle reasons", "clocks event reasons")):
            name = reason_name(key)
            if name and value.lower() in ("active", "not active"):
                g.reasons[name] = value.lower() == "active"
            return
        for suffix, fld in _Q_KEYS:
            if path[-len(suffix):] == suffix:
                if fld not in g.f:
                    g.f[fld] = value
                return

    def _process_field(self, key: str, value: str) -> None:
        if key == "processes":
            self._listed = True
            return
        self._listed = True
        if key == "gpu instance id":
            self._end_records(keep_mig=True)
            self._pending_ids["gi"] = value
        elif key == "compute instance id":
            self._pending_ids["ci"] = value
        elif key == "process id":
            self._end_records(keep_mig=True)
            self._proc = {"pid": value, **self._pending_ids}
            self._pending_ids = {}
        elif self._proc is not None:
            k = {"type": "type", "name": "name", "process name": "name", "used gpu memory": "used"}.get(key)
            if k:
                self._proc[k] = value

    def _end_records(self, keep_mig: bool = False) -> None:
        if not self._gpus:
            self._proc, self._mig = None, None
            return
        g = self._gpus[-1]
        if self._proc is not None:
            p = _proc(g.index, self._proc)
            if p is not None:
                g.procs.append(p)
            self._proc = None
        if self._mig is not None and not keep_mig:
            if self._mig:
                g.mig.append(_mig(g.index, self._mig))
            self._mig = None

    def _close(self, cut: bool = False) -> None:
        if not self._open:
            return
        self._end_records()
        if self._gpus:
            _emit(self.sink, "q", self._ts, self._gpus, self._listed)
        if cut:
            self.sink.problem(f"an nvidia-smi -q document longer than {MAX_DOC_LINES} lines was cut there")
        self._open, self._ts, self._stack, self._gpus, self._listed = False, None, [], [], False
        self._pending_ids = {}

    def finish(self) -> None:
        self._close()


class QueryXmlParser:
    """``nvidia-smi -q -x`` documents (schema v11-v13), from ``<nvidia_smi_log>`` to its end."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.documents = 0
        self.matched = False
        self.schema = ""
        self._pp: ET.XMLPullParser[ET.Element] | None = None
        self._left = 0
        self._bytes = 0
        self._path: list[str] = []
        self._ts: float | None = None
        self._gpus: list[_Gpu] = []
        self._cur: _Gpu | None = None
        self._rec: dict[str, str] | None = None
        self._listed = False
        self._attached: int | None = None
        self._hist = ""

    @property
    def open(self) -> bool:
        return self._pp is not None

    def feed(self, line: str) -> bool:
        prev, self._hist = self._hist, line
        if self._pp is not None and "<nvidia_smi_log" in line:
            self._close(f"nvidia-smi -q -x document {self.documents} ends before </nvidia_smi_log>, where the next "
                        "one begins")
        if self._pp is None:
            if "<nvidia_smi_log" not in line:
                return False
            m = re.search(r"nvsmi_device_v(\d+)\.dtd", prev)
            self.schema = f"v{m.group(1)}" if m else self.schema
            self._start()
            line = line[line.index("<nvidia_smi_log"):]
        assert self._pp is not None
        self._left -= 1
        self._bytes += len(line) + 1
        if self._left < 0 or self._bytes > MAX_DOC_BYTES:
            self._close(f"an nvidia-smi -q -x document larger than {MAX_DOC_LINES} lines or "
                        f"{MAX_DOC_BYTES >> 20} MiB was cut there")
            return True
        try:
            self._pp.feed(line + "\n")
            self._events()
        except ET.ParseError as exc:
            self._close(f"nvidia-smi -q -x document {self.documents} is not well-formed XML ({exc}); "
                        "the GPUs before that point were read")
            return True
        if "</nvidia_smi_log>" in line:
            self._close()
        return True

    def _start(self) -> None:
        self._pp = ET.XMLPullParser(events=("start", "end"))
        self._left, self._bytes = MAX_DOC_LINES, 0
        self._path, self._gpus, self._cur, self._rec, self._ts = [], [], None, None, None
        self._listed, self._attached = False, None
        self.documents += 1

    def _events(self) -> None:
        assert self._pp is not None
        for item in self._pp.read_events():
            if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[1], ET.Element):
                continue  # only start/end events were asked for
            event, elem = item
            if event == "start":
                self._path.append(elem.tag)
                if len(self._path) == 2 and elem.tag == "gpu":
                    self._cur = _Gpu(len(self._gpus), elem.get("id", ""))
                elif self._cur is not None and len(self._path) == 4 and self._path[2:] in (
                        ["processes", "process_info"], ["mig_devices", "mig_device"]):
                    self._rec = {}
                elif self._cur is not None and len(self._path) == 3 and elem.tag == "processes":
                    self._listed = True
                continue
            self._end(elem)
            self._path.pop()

    def _end(self, elem: ET.Element) -> None:
        path = self._path
        text = (elem.text or "").strip()
        if len(path) == 2:
            if path[1] == "timestamp":
                self._ts = ctime_ts(text)
            elif path[1] == "attached_gpus":
                self._attached = integer(text)
            elif path[1] == "gpu" and self._cur is not None:
                self._gpus.append(self._cur)
                self._cur = None
                self.matched = True
                elem.clear()
            return
        g = self._cur
        if g is None or len(path) < 3:
            return
        rel = tuple(path[2:])
        if rel[:2] == ("processes", "process_info") and self._rec is not None:
            if len(rel) == 2:
                p = _proc(g.index, self._rec)
                if p is not None:
                    g.procs.append(p)
                self._rec = None
            elif len(rel) == 3:
                k = {"pid": "pid", "type": "type", "process_name": "name", "used_memory": "used",
                     "gpu_instance_id": "gi", "compute_instance_id": "ci"}.get(rel[2])
                if k:
                    self._rec[k] = text
            return
        if rel[:2] == ("mig_devices", "mig_device") and self._rec is not None:
            if len(rel) == 2:
                g.mig.append(_mig(g.index, self._rec))
                self._rec = None
            elif rel[2:] in (("index",), ("gpu_instance_id",), ("compute_instance_id",)):
                self._rec[{"index": "index", "gpu_instance_id": "gi", "compute_instance_id": "ci"}[rel[2]]] = text
            elif rel[2:] in (("fb_memory_usage", "used"), ("fb_memory_usage", "total")):
                self._rec[rel[3]] = text
            elif rel[-1] == "multiprocessor_count":
                self._rec["sm"] = text
            return
        if len(rel) == 2 and rel[0] in ("clocks_throttle_reasons", "clocks_event_reasons"):
            name = reason_name(rel[1])
            if name and text.lower() in ("active", "not active"):
                g.reasons[name] = text.lower() == "active"
            return
        if len(rel) == 2 and rel[0] in ("power_readings", "gpu_power_readings") and rel[1] in _X_POWER:
            g.f.setdefault(_X_POWER[rel[1]], text)
            return
        fld = _X_KEYS.get(rel)
        if fld is not None and text:
            g.f.setdefault(fld, text)

    def _close(self, problem: str = "") -> None:
        if self._pp is None:
            return
        if self._gpus:
            _emit(self.sink, "xml", self._ts, self._gpus, self._listed)
        if problem:
            self.sink.problem(problem)
        elif self._attached is not None and self._attached > len(self._gpus) and self._gpus:
            self.sink.note(f"the -q -x document says attached_gpus {self._attached} but holds {len(self._gpus)} "
                           "GPU element(s) (run with -i, or trimmed)")
        self._pp = None
        self._gpus = []

    def finish(self) -> None:
        if self._pp is not None:
            self._close(f"nvidia-smi -q -x document {self.documents} ends before </nvidia_smi_log>; "
                        f"{len(self._gpus)} GPU(s) read before the cut")

