"""torch.compile logs → recompile, guard-failure, limit and graph-break records; TensorFlow's retracing warnings.

Pure parsing, streamed line by line (``CompileLogParser.feed``). It reads

* ``TORCH_LOGS=recompiles`` in the old logging format (``torch._dynamo.guards.__recompiles:
  [DEBUG] Recompiling function forward in file:line``) and the glog format of 2.2+
  (``V0601 12:00:00.123 140 torch/_dynamo/guards.py:2611] [0/1] [__recompiles] Recompiling …``),
  with the ``triggered by the following guard failure(s):`` list under it, old
  (``- tensor 'L['x']' size mismatch at index 0. expected 4, actual 8``) and new
  (``- 0/1: …``, ``- 0/0: L['x'].size()[0] == 4``) forms;
* frame/compile ids ``[0/3]`` (the fourth compile of frame 0);
* the recompile limit: ``torch._dynamo hit config.cache_size_limit (8)``,
  ``… hit config.recompile_limit (8)``, ``Dynamo recompile limit exceeded``,
  ``FailOnRecompileLimitHit`` (a hard failure under ``fullgraph=True``);
* graph breaks (``Graph break in user code at …``, ``Graph break: …``, explain's
  ``Graph Break Count: N``);
* vLLM's kernel JIT monitor (on by default since vllm#40137, 2026-04; CuTeDSL since #46167, TileLang since
  #46718): after its warm-up, every kernel compiled while serving is a WARNING ``Triton kernel JIT compilation
  during inference: _zero_kv_blocks_kernel. This causes a latency spike; …`` (``CuTeDSL …``, ``TileLang …``;
  ``--jit-monitor-verbose`` adds ``(key=…)``), or with ``--jit-monitor-mode error`` a ``RuntimeError`` with the
  same words.

* TensorFlow's ``WARNING:tensorflow:5 out of the last 5 calls to <function Model.make_predict_function.<locals>.
  predict_function at 0x…> triggered tf.function retracing. Tracing is expensive …`` (its tracing compiler
  traced the function again for most of its recent calls), the line wrapped or not.
* TF-TRT's ``trt_engine_op.cc:632] Building a new TensorRT engine for TRTEngineOp_29 input shapes:
  [[2,4,4,512]]`` (an engine built while the graph runs: not built at conversion, or a new input shape).

Guard failures are grouped by input, kind and dimension, with the values seen.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

MAX_VALUES = 64  # distinct values kept per reason group
MAX_GROUPS = 256


@dataclass
class ReasonGroup:
    """Guard failures of one kind on one input (and dimension)."""

    input: str
    kind: str  # size, stride, dtype, device, value, type, id, len, global_state, other
    dim: int | None = None
    count: int = 0
    values: list[str] = field(default_factory=list)
    example: str = ""

    def add(self, *vals: str) -> None:
        self.count += 1
        for v in vals:
            if v and v not in self.values and len(self.values) < MAX_VALUES:
                self.values.append(v)

    def describe(self) -> str:
        if self.kind == "spurious":
            return f"guards failed at run time and passed on re-check {self.count}× (no input changed)"
        where = f" at dim {self.dim}" if self.dim is not None else ""
        seen = ", ".join(self.values[:8]) + (", …" if len(self.values) > 8 else "")
        return f"{self.input} {self.kind}{where} changed {self.count}× (seen: {seen})" if seen else \
            f"{self.input} {self.kind}{where} changed {self.count}×"


@dataclass
class CompileLog:
    recompiles: int = 0  # "Recompiling function" records
    compile_ids: dict[int, int] = field(default_factory=dict)  # frame id → highest compile id
    functions: dict[str, int] = field(default_factory=dict)  # "forward (x.py:12)" → recompiles
    reasons: dict[tuple[str, str, int | None], ReasonGroup] = field(default_factory=dict)
    limit_hit: bool = False
    limit: int | None = None
    limit_kind: str = ""  # "cache_size_limit", "recompile_limit", "accumulated_…"
    fullgraph_failure: bool = False
    graph_breaks: int = 0
    graph_break_count_reported: int | None = None
    first_ts: float | None = None
    last_recompile_ts: float | None = None
    lines: int = 0
    jit_kernels: dict[str, int] = field(default_factory=dict)  # vLLM's JIT monitor: "Triton _x_kernel" → compiles
    jit_errors: set[str] = field(default_factory=set)  # … of them raised (--jit-monitor-mode error)
    # TensorFlow's retracing warning: "N out of the last M calls to <function F …> triggered tf.function retracing"
    tf_retrace_warnings: int = 0
    tf_retraces: int = 0  # the most calls of a window that retraced (the windows overlap: no sum)
    tf_retrace_window: int = 0  # … of the calls in that window
    tf_functions: dict[str, int] = field(default_factory=dict)  # "Model.make_predict_function" → warnings
    # TF-TRT's engine op building an engine while the graph runs (its first call with an input shape):
    # "Building a new TensorRT engine for TRTEngineOp_29 input shapes: [[2,4,4,512]]"
    tftrt_builds: int = 0
    tftrt_ops: dict[str, set[str]] = field(default_factory=dict)  # "TRTEngineOp_29" → the input shapes built for

    @property
    def retraced(self) -> bool:
        return self.tf_retrace_warnings > 0

    @property
    def recompile_count(self) -> int:
        by_ids = sum(self.compile_ids.values())
        return max(self.recompiles, by_ids)

    @property
    def graph_break_count(self) -> int:
        return max(self.graph_breaks, self.graph_break_count_reported or 0)

    def grouped(self) -> list[ReasonGroup]:
        return sorted(self.reasons.values(), key=lambda g: (-g.count, g.input, g.kind))


# vLLM's JIT monitor: the compiler's name ("Triton kernel", "CuTeDSL", "TileLang"), then the kernel's
_JIT_SERVING = re.compile(r"\b(?P<lang>[A-Z][\w-]*)(?: kernel)? JIT compilation during inference:\s*[`'\"‹<]?"
                          r"(?P<name>\w+(?:(?:\.|::)\w+)*(?:<[\w, ]*>)?)")
# ... as a log record prints it (the monitor's file, a level, or the error mode's exception), not a person's mention
_JIT_RECORD = re.compile(r"jit_monitor|\b(?:WARNING|WARN|ERROR)\b|RuntimeError")
# TensorFlow (2.x, tf.function's tracing compiler) warns when five or more of a function's recent calls traced
# it again; a paste may wrap the line before "triggered"
# (a paste may wrap it anywhere, even inside a word: the head is matched with optional whitespace between its words,
# over the warning's lines joined with and without a space)
_TF_RETRACE = re.compile(r"(?<![\d.])(?P<n>\d{1,7})\s*out\s*of\s*the\s*last\s*(?P<m>\d{1,7})\s*calls\s*to\s*"
                         r"<\s*(?:function|bound\s*method)\s*(?P<func>[\w.<>]{1,300})")
_TF_TRIGGERED = "triggeredtf.functionretracing"  # without its whitespace
# ... printed by TensorFlow's logger (python logging's "WARNING:tensorflow:", absl's "W1012 12:00:00.123 …]"), not
# quoted in a person's sentence
_TF_RECORD = re.compile(r"^[\s`>*-]*$|tensorflow:\s*$|\b(?:WARNING|WARN):?\s*$|\]\s*$")  # right before it
_TF_ADDRESS = re.compile(r"at0x[0-9a-fA-F]*>?$|>$")
# (TF 2.x names its input shapes; TF 1.x its batch size: "… for my_trt_op_0 with batch size 8")
_TFTRT_BUILD = re.compile(r"Building a new TensorRT engine for (?P<op>[\w/.-]+)(?: with)? (?:input shapes: "
                          r"(?P<shapes>\[\[[^\]]{0,200}\](?:,\s*\[[^\]]{0,200}\]){0,255}\])|batch size (?P<batch>\d+))")
_RECOMPILING = re.compile(r"Recompiling function\s+(?P<func>[\w<>.]+)\s+in\s+(?P<where>\S+)")
_TRIGGERED = re.compile(r"triggered by the following guard failure")
_GUARD_ITEM = re.compile(r"(?:^|\s|\])-\s+(?:\d+/\d+:\s+)?(?P<reason>\S.*)$")
_LAST_REASON = re.compile(r"(?:last reason|reasons?):\s+(?:\d+/\d+:\s+)?(?P<reason>\S.*)$")
_IDS = re.compile(r"\[(?P<frame>\d+)/(?P<compile>\d+)(?:_\d+)?\]")
_GLOG = re.compile(r"^[VIWEF](?P<md>\d{4})\s+(?P<t>\d{2}:\d{2}:\d{2}(?:\.\d+)?)\s+\d+\s+\S*torch/")
_BRACKET_TS = re.compile(r"^\[(?P<ts>\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2})(?:[,.](?P<frac>\d+))?\]")
_LIMIT = re.compile(
    r"hit config\.(?P<kind>(?:accumulated_)?(?:cache_size|recompile)_limit)\s*\((?P<n>\d+)\)"
    r"|(?P<exceeded>(?:Dynamo )?recompile limit exceeded|cache_size_limit reached|RecompileLimitExceeded)"
    r"|(?P<fail>FailOnRecompileLimitHit)",
    re.IGNORECASE,
)
_LIMIT_VALUE = re.compile(
    r"(?P<kind>(?:accumulated_)?(?:recompile|cache_size)_limit)[^()\n]{0,40}\((?:currently set to\s+)?(?P<n>\d+)\)"
)
_LIMIT_TYPE = re.compile(r"Limit type:\s*(?P<kind>\w+)")
_FULLGRAPH = re.compile(r"fullgraph=True|FailOnRecompileLimitHit|Hard failure")
_GRAPH_BREAK = re.compile(r"\bGraph break(?:\s+in user code|\s*:|\s+\(|\s+due to|\s+from)")
_GRAPH_BREAK_COUNT = re.compile(r"Graph Break Count:\s*(?P<n>\d+)", re.IGNORECASE)

_R_TENSOR = re.compile(
    r"tensor '(?P<in>.+?)' (?P<kind>size|stride|dtype|device|requires_grad|dispatch key set|rank|ndim|"
    r"dimensionality)(?: mismatch)?(?: at index (?P<dim>\d+))?\.?\s*expected (?P<exp>[^,]+?),\s*actual (?P<act>\S+)"
)
_R_SIZE_EQ = re.compile(
    r"(?P<in>L\[[^\]]+\](?:\.\w+|\[[^\]]+\])*?)\.(?P<kind>size|stride)\(\)\[(?P<dim>\d+)\]\s*(?:==|!=|<=|>=|<|>)\s*"
    r"(?P<v>-?\d+)"
)
_R_SYM = re.compile(
    r"(?:Eq|Ne|Le|Ge|Lt|Gt)\((?P<in>L\[[^\]]+\](?:\.\w+|\[[^\]]+\])*?)\.(?P<kind>size|stride)\(\)\[(?P<dim>\d+)\],\s*"
    r"(?P<v>-?\d+)\)"
)
_R_LEN = re.compile(r"len\((?P<in>[^)]+)\)\s*==\s*(?P<v>\d+)")
_R_VALUE = re.compile(r"^(?P<in>L\[[^\]]+\](?:\.\w+|\[[^\]]+\])*)\s*==\s*(?P<v>.+)$")
_R_CHECK = re.compile(r"___check_(?P<kind>obj_id|type_id|tensors)\((?P<in>[^,)]+)")
_R_GLOBAL = re.compile(r"GLOBAL_STATE changed:\s*(?P<what>.+)")
# dynamo's own word for a guard that failed at run time and passed when re-checked for the reason
# (torch 2.x: "Unexpected recompilation: runtime guards failed even though they passed during
# recompilation-reason analysis"): nothing in the inputs changed, the check itself raced
_R_SPURIOUS = re.compile(r"Unexpected recompilation\b.*\bguards? failed even though they passed", re.IGNORECASE)


def _input_name(raw: str) -> str:
    """``L['x']`` → ``x``; ``L['self'].layers[0]`` → ``self.layers[0]``."""
    return re.sub(r"^[LG]\['([^']+)'\]", r"\1", raw.strip())


def classify_reason(reason: str) -> tuple[str, str, int | None, tuple[str, ...]]:
    """A guard-failure line → (input, kind, dim, values)."""
    if _R_SPURIOUS.search(reason):
        return "(no input changed)", "spurious", None, ()
    m = _R_TENSOR.search(reason)
    if m:
        dim = int(m.group("dim")) if m.group("dim") else None
        return _input_name(m.group("in")), m.group("kind"), dim, (m.group("exp").strip(), m.group("act").strip(". "))
    m = _R_SIZE_EQ.search(reason) or _R_SYM.search(reason)
    if m:
        return _input_name(m.group("in")), m.group("kind"), int(m.group("dim")), (m.group("v"),)
    m = _R_LEN.search(reason)
    if m:
        return _input_name(m.group("in")), "len", None, (m.group("v"),)
    m = _R_CHECK.search(reason)
    if m:
        kind = {"obj_id": "id", "type_id": "type", "tensors": "tensor"}[m.group("kind")]
        return _input_name(m.group("in")), kind, None, ()
    m = _R_GLOBAL.search(reason)
    if m:
        return "global state", "global_state", None, (m.group("what").strip(),)
    m = _R_VALUE.search(reason.split("  #", 1)[0])
    if m:
        return _input_name(m.group("in")), "value", None, (m.group("v").strip()[:40],)
    return reason[:80], "other", None, ()


def _timestamp(line: str) -> float | None:
    m = _GLOG.search(line)
    if m:
        md, t = m.group("md"), m.group("t")
        hh, mm, ss = t.split(":")
        day = int(md[:2]) * 31 + int(md[2:])  # months as 31 days: good enough for a span within a run
        return day * 86400 + int(hh) * 3600 + int(mm) * 60 + float(ss)
    m = _BRACKET_TS.search(line)
    if m:
        try:
            ts = datetime.strptime(m.group("ts").replace("T", " "), "%Y-%m-%d %H:%M:%S").timestamp()
        except ValueError:
            return None
        return ts + (float("0." + m.group("frac")) if m.group("frac") else 0.0)
    return None


class CompileLogParser:
    """Feed cleaned lines; ``log`` holds what was recognised."""

    def __init__(self) -> None:
        self.log = CompileLog()
        self._in_list = False  # inside a "triggered by the following guard failure(s):" list
        self._tf_lines: list[str] = []  # the lines of a retracing warning read so far (it may be wrapped)

    def _reason(self, text: str) -> None:
        inp, kind, dim, vals = classify_reason(text)
        key = (inp, kind, dim)
        group = self.log.reasons.get(key)
        if group is None:
            if len(self.log.reasons) >= MAX_GROUPS:
                return
            group = self.log.reasons[key] = ReasonGroup(inp, kind, dim, example=text[:200])
        group.add(*vals)

    def _tf_warning(self, line: str) -> bool:
        """TensorFlow's retracing warning over up to six lines; True when this line closed one."""
        self._tf_lines.append(line)
        flat = re.sub(r"\s+", "", "".join(self._tf_lines))
        if _TF_TRIGGERED not in flat:
            del self._tf_lines[:-6]  # slide: a warning begins in one of the last six lines, or none does
            if not any("out of" in x or "calls to" in x for x in self._tf_lines):
                self._tf_lines = []
            return False
        lines, self._tf_lines = self._tf_lines, []
        for text in ("".join(lines), " ".join(lines)):  # a line cut anywhere, then one cut at a space
            m = _TF_RETRACE.search(text)
            if m and _TF_RECORD.search(text[:m.start()].rsplit("\n", 1)[-1][-60:]):
                func = _TF_ADDRESS.sub("", re.sub(r"\s+", "", m.group("func")))
                self._retrace(int(m.group("n")), int(m.group("m")), func)
                return True
        return False

    def _retrace(self, n: int, m: int, func: str) -> None:
        log = self.log
        log.tf_retrace_warnings += 1
        if n > log.tf_retraces:
            log.tf_retraces, log.tf_retrace_window = n, m
        name = func.split(".<locals>")[0]
        if name in log.tf_functions or len(log.tf_functions) < MAX_GROUPS:
            log.tf_functions[name] = log.tf_functions.get(name, 0) + 1
        log.lines += 1

    def feed(self, line: str) -> None:
        log = self.log
        if (self._tf_lines or "out of" in line or "calls to" in line) and self._tf_warning(line):
            return
        if "Building a new TensorRT engine" in line:
            m = _TFTRT_BUILD.search(line)
            if m:
                log.tftrt_builds += 1
                op = m.group("op").rsplit("/", 1)[-1]  # the op, whatever function scope names it
                if op in log.tftrt_ops or len(log.tftrt_ops) < MAX_GROUPS:
                    shapes = log.tftrt_ops.setdefault(op, set())
                    if len(shapes) < MAX_VALUES:
                        shapes.add(re.sub(r"\s+", "", m.group("shapes") or f"batch {m.group('batch')}"))
                log.lines += 1
                return
        torch_line = "torch" in line
        if torch_line and log.first_ts is None:
            log.first_ts = _timestamp(line)
        if "Recompiling" in line:
            m = _RECOMPILING.search(line)
            if m:
                log.recompiles += 1
                where = m.group("where").rsplit("/", 1)[-1]
                name = f"{m.group('func')} ({where})"
                log.functions[name] = log.functions.get(name, 0) + 1
                ts = _timestamp(line)
                if ts is not None:
                    log.last_recompile_ts = ts
                self._ids(line)
                self._in_list = False
                log.lines += 1
                return
        if "triggered by" in line and _TRIGGERED.search(line):
            self._in_list = True
            log.lines += 1
            return
        if self._in_list:
            item = _GUARD_ITEM.search(re.sub(r"^.*?\[__recompiles(?:_verbose)?\]", "", line))
            if item:
                self._reason(item.group("reason").strip())
                log.lines += 1
                return
            self._in_list = False
        if "JIT compilation during inference" in line:
            m = _JIT_SERVING.search(line)
            head = line[:m.start()] if m else ""
            if m and _JIT_RECORD.search(head):
                name = f"{m.group('lang')} {m.group('name')}"
                if "RuntimeError" in head or "ERROR" in head:
                    if name in log.jit_errors:  # the one error again, as another process logs it on its way up
                        return
                    log.jit_errors.add(name)
                log.jit_kernels[name] = log.jit_kernels.get(name, 0) + 1
                log.lines += 1
                return
        low = line.lower()
        if "limit" in low:
            self._limit(line)
        elif log.limit_hit and "fullgraph" in low:
            log.fullgraph_failure = True
        if log.limit_hit and "reason" in low:
            m = _LAST_REASON.search(line)
            if m:
                self._reason(m.group("reason").strip())
        if "graph break" in low:
            m = _GRAPH_BREAK_COUNT.search(line)
            if m:
                log.graph_break_count_reported = max(log.graph_break_count_reported or 0, int(m.group("n")))
                log.lines += 1
            elif _GRAPH_BREAK.search(line):
                log.graph_breaks += 1
                log.lines += 1
        if torch_line and _GLOG.search(line):
            self._ids(line)

    def _limit(self, line: str) -> None:
        log = self.log
        m = _LIMIT.search(line)
        if m:
            log.limit_hit = True
            if m.group("n"):
                log.limit, log.limit_kind = int(m.group("n")), m.group("kind")
            if m.group("fail"):
                log.fullgraph_failure = True
            log.lines += 1
        m = _LIMIT_VALUE.search(line)
        if m:
            log.limit = int(m.group("n"))
            log.limit_kind = log.limit_kind or m.group("kind")
            log.lines += 1
        m = _LIMIT_TYPE.search(line)
        if m and "limit" in m.group("kind"):
            log.limit_kind = m.group("kind")
        if log.limit_hit and _FULLGRAPH.search(line):
            log.fullgraph_failure = True

    def _ids(self, line: str) -> None:
        m = _IDS.search(line)
        if m:
            frame, compile_id = int(m.group("frame")), int(m.group("compile"))
            self.log.compile_ids[frame] = max(self.log.compile_ids.get(frame, 0), compile_id)

    def matched(self) -> bool:
        log = self.log
        return bool(log.recompiles or log.limit_hit or log.graph_break_count or log.reasons or log.jit_kernels
                    or log.retraced or log.tftrt_builds or (log.compile_ids and any(log.compile_ids.values())))
