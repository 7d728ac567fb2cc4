"""What a line of text *is*, before anything reads what it says.

An incident paste mixes kinds of text: a program's log records, the command that started the server,
a metrics exposition, JSON records, a traceback, a table, and the sentences a person wrote around
them. Each reader reads only its own kind; in particular the report-text cues
(``diagnose.collectors.claims``) read human prose only, so a server's command line (``--tokenizer``),
its log records and its metric names never count as "statements" of the reporter.

``kind_of(line)`` types one cleaned line (``diagnose.collectors.logtext.clean_lines``: container,
process and rank prefixes already stripped) by its structure alone, never by one program's wording:

* ``LOG`` — a record a program wrote: a timestamp or level prefix (glog ``I0726 13:03:07``, ISO or
  bracketed date-times, vLLM's ``INFO 05-01 10:00:00``, ``WARNING:``, key=value loggers' ``time=``,
  journald), or a C-style ``function_name:`` prefix (llama.cpp's ``load_tensors:``,
  ``llama_perf_context_print:``), or a ``[LEVEL]``/``LEVEL |`` tag;
* ``COMMAND`` — a shell or REPL command: a prompt (``$``, ``>>>``, ``user@host:~#``), ``set -x``'s
  ``+ ``, a launcher program (``python -m``, ``vllm serve``, ``docker run``, ``torchrun``…), or a
  line made of ``--flags`` (a command's continuation lines, ``\\`` at the end);
* ``METRICS`` — Prometheus exposition: ``# HELP``/``# TYPE`` comments and ``name{labels} value``;
* ``JSON`` — a record: a line that opens with ``{``, ``[{``, ``["`` or ``<`` (XML);
* ``TRACEBACK`` — Python's traceback frames, its header and the exception line;
* ``CODE`` — an indented line of source code (a traceback's source line, a pasted snippet):
  an assignment, a call, a keyword statement, a comment;
* ``TABLE`` — a row: ``|``-separated, tab-separated, a CSV row of short fields, box drawing;
* ``PROSE`` — everything else: what a person wrote;
* ``BLANK`` — nothing but spaces.

Pure, stdlib only, one compiled pattern per kind.
"""

from __future__ import annotations

import re
from enum import Enum


class LineKind(Enum):
    BLANK = "blank"
    LOG = "log"
    COMMAND = "command"
    METRICS = "metrics"
    JSON = "json"
    TRACEBACK = "traceback"
    TABLE = "table"
    CODE = "code"
    PROSE = "prose"


# a program's log record, by its prefix: glog (I0726 13:03:07.418), a bracketed or bare date-time,
# vLLM's "INFO 05-01 10:00:00", logging's "WARNING:", key=value loggers (ollama's time=…), journald
# ("Nov 20 09:20:22 host proc[123]:", "… host kernel:"), the kernel's ring buffer as dmesg prints it
# ("[13059.917043] ", "[Tue Sep 16 03:14:22 2025] "), a bare time ("12:03:01.123 "), "[INFO]"/"INFO |" tags, and
# C-style "function_name:" prefixes (llama.cpp's "load_tensors:", "llama_model_loader:"; an
# identifier with an underscore: a person's "Note:" is prose)
_LOG = re.compile(
    r"\s*(?:\(\w[\w-]* pid=\d+\)\s*)?(?:\(\w[\w-]* pid=\d+\)\s*$"  # a process tag alone: its record follows
    r"|\[?[IWEFV]\d{4} \d\d:\d\d:\d\d|\[?\d{4}[-/]\d\d[-/]\d\d[ T]\d\d:\d\d"
    r"|(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|TRACE|FATAL)\s+\d\d-\d\d \d\d:\d\d"
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):"
    r"|time=\d{4}-|[A-Za-z]{3} [ \d]\d \d\d:\d\d:\d\d \S+ (?:\S+\[\d+\]|kernel):"
    r"|\[\s*\d+\.\d{3,}\]\s"  # the kernel's ring buffer (dmesg): seconds since boot
    r"|\[[A-Z][a-z]{2} [A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d(?: \d{4})?\]\s"  # dmesg -T
    r"|\[?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?\s"
    r"|\[\s*(?:INFO|WARN|WARNING|ERROR|DEBUG|TRACE|FATAL|CRITICAL)\s*\]"
    # TensorRT's logger (trtexec, its samples and demos, TensorRT-LLM): "[05/24/2024-15:02:09] [I] …"
    r"|\[\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d\]\s"
    # the process id between double equals signs of nvprof, cuda-memcheck and valgrind: "==21941== Warning: …"
    r"|==\d+==\s"
    r"|(?:INFO|WARN|WARNING|ERROR|DEBUG|TRACE|FATAL)\s*\|"
    # Rust's tracing layout once its time is stripped: a level, then a span with its fields or a module path
    # ("INFO generate{total_time=…}: text_generation_router::server: …", "INFO text_generation_launcher: …")
    r"|(?:INFO|WARN|ERROR|DEBUG|TRACE)\s+[A-Za-z_][\w.-]*(?:\{|::|:\s)"
    r"|~?[a-z][a-z0-9]*(?:_[a-z0-9]+)+:\s"  # a C function's __func__ prefix (a destructor's "~llama_context:")
    r"|[A-Z]\w*\.[a-z_]\w*:\s"  # a Python method's qualified name as its prefix ("Llama.generate: ")
    r"|(?:srv|slot|que|main|init)\s+[\w:]+:\s"
    r"|\S+\.py:\d+: \w*(?:Warning|Error):"  # Python's warnings module: "path.py:24: DeprecationWarning: …"
    r"|(?:[\w ./-]{0,40}:\s*)?\d{1,3}%\|[^|]{0,120}\|\s*\d+/\d+"  # a tqdm progress bar: "100%|████| 1000/1000 [07:53<…"
    r")"
)
# (an indented "# …" is a comment in a function's body: what the code does, not what happened; indented four spaces
# or a tab, as a body is: Markdown allows a heading up to three spaces in, "  # Steps to reproduce")
_CODE = re.compile(r"(?:\s{2,}|\t)(?:(?:async\s+)?(?:if|elif|while|for|with|def|class|try|except)\b.*[:(,]\s*$"
                   r"|(?:(?<=    )|(?<=\t))#(?!#)\s*[A-Za-z]"
                   r"|(?:return|import|raise|yield|await|assert)\s|from\s+[\w.]+\s+import\s"
                   r"|[\w.\[\]'\"]+\s*(?:[-+*/]?=(?!=)|\()|[)\]}]+[,:)]*\s*$)")
# a shell or REPL prompt: whatever follows is a command
_PROMPT = r"(?:[$%]\s|>>>\s|PS [A-Za-z]:\\|[\w.-]+@[\w.-]+:[^\s]*[#$]\s)"
_ENV = r"(?:[A-Z_][A-Z0-9_]*=\S*\s+)"
# a program an incident's command line starts with; a command only with an argument that only a command
# has (a flag, a path, a .py file, an assignment): "vllm reserves 90 % of the memory" is a sentence
_LAUNCHER = (
    r"(?:sudo\s+)?(?:\S*/)?(?:python[\d.]*|pip[\d.]*|uv|conda|vllm|docker|podman|kubectl|helm|torchrun|deepspeed"
    r"|accelerate|llama-server|llama-cli|llama-bench|ollama|text-generation-launcher|trtllm-serve|trtllm-build"
    r"|tritonserver|perf_analyzer|genai-perf|uvicorn|gunicorn|nvidia-smi|nsys|ncu|py-spy|curl|wget|bash|sh"
    r"|export|cd|make|cmake|git|lmdeploy|sglang|mlc_llm|ray|serve|diagnose)\s"
)
_ARGUMENT = r".*?(?:(?<=\s)--?[A-Za-z]|\S/\S|\.py\b|\w=\S)"  # the launcher's \s is a flag's space too
_COMMAND = re.compile(rf"\s*(?:{_PROMPT}|```|(?:\+\s+)?{_ENV}*{_LAUNCHER}{_ARGUMENT}|(?:\+\s+)?{_ENV}+\S)")
# a program this list does not name, known as a command by its shape: a lower-case name (and a subcommand), then
# nothing but flags, two or more of them with a value ("whispering --language fr --model tiny --device cpu"); a
# person's "i tried --no-mmap --mlock" or "koboldcpp slow with --usecublas --gpulayers 99" is no such line
_BARE_COMMAND = re.compile(r"\s*(?!(?:i|we|tried|try|same|also|with|using|use|then|and|but|set|run|ran|when|if|even|"
                           r"still|just|only|so|or|without|adding|added|passing|passed)\s)"
                           r"[a-z][\w.-]*(?:\s+[a-z][\w.-]*)?(?:\s+--?[A-Za-z][\w.-]*(?:[= ](?!-)\S+)?)*"
                           r"(?:\s+--?[A-Za-z][\w.-]*[= ](?!-)\S+)(?:\s+--?[A-Za-z][\w.-]*(?:[= ](?!-)\S+)?)*\s*$")
_FLAG_VALUE = re.compile(r"(?<=\s)--?[A-Za-z][\w.-]*[= ](?!-)\S+")
_FLAGS_ONLY = re.compile(r"\s*--?[A-Za-z][\w.-]*(?:[= ]\S+)?(?:\s+--?[A-Za-z][\w.-]*(?:[= ]\S+)?)*\s*\\?\s*$")
_CONTINUED = re.compile(r"\s\\\s*$")
_METRICS = re.compile(r"\s*(?:# (?:HELP|TYPE|UNIT|EOF)\b|# scrape at "  # Prometheus comments, diagnose's header
                      r"|[A-Za-z_:][\w:]*(?:\{[^}]*\})?\s+[-+]?(?:\d[\d.eE+-]*|NaN|Inf|\+Inf|-Inf)(?:\s+\d+)?\s*$)")
_TRACEBACK = re.compile(r"\s*(?:Traceback \(most recent call last\):|File \"[^\"]+\", line \d+"
                        r"|\^[\^~]*\s*$|During handling of the above exception|The above exception was the direct)")
_EXCEPTION = re.compile(r"\s*(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)(?::\s|$)")
# a label and a printed structure: "Model metadata: {'tokenizer.ggml.model': 'llama', …}"
_LABELLED_STRUCTURE = re.compile(r"[A-Za-z][\w .-]{0,40}:\s*(?:\{\s*['\"]|\[\s*[{'\"])")
_BOX = re.compile(r"[│┃┆┊╎║├┼┤└┘┌┐─━═╔╗╚╝]")


# a command quoted inside a sentence ("I start it with: vllm serve /m --tensor-parallel-size 8"): a launcher that
# is no common English word, after the line's start, a space, a colon or an opening quote or bracket
_INLINE_LAUNCHER = re.compile(
    r"(?:^|(?<=[\s:：,，;；(（\"'`]))(?:[$%]\s+)?(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:sudo\s+)?(?:[^\s`'\"(（]*/)?"
    r"(?:python[\d.]*|vllm|docker|podman|kubectl|torchrun|deepspeed|llama-server|llama-cli|llama-bench|ollama"
    r"|text-generation-launcher|trtllm-serve|trtllm-build|tritonserver|perf_analyzer|genai-perf|uvicorn|gunicorn"
    r"|lmdeploy|mlc_llm|nsys|ncu|py-spy|nvidia-smi)\s")
_FLAG = re.compile(r"--?[A-Za-z][\w.-]*(?:=\S*)?$")
_CLOSERS = {"`": "`", "\"": "\"", "'": "'", "(": ")", "（": "）"}
# where an unquoted command ends and the sentence goes on: a clause's punctuation or a conjunction
_SENTENCE_GOES_ON = re.compile(r",\s|[，。；！？]|;\s|[.!?](?:\s|$)|\s(?:and|but|then|so|because|while|which|when)\s")
# words no command line is made of: a sentence that only names a program and a flag ("vllm with --enforce-eager
# is slow") stops at the first
_FUNCTION_WORDS = frozenset({
    "a", "an", "the", "is", "are", "was", "were", "be", "been", "it", "its", "this", "that", "these", "those", "with",
    "without", "and", "or", "but", "of", "for", "to", "in", "on", "at", "by", "from", "as", "if", "not", "no", "also",
    "when", "what", "which", "who", "how", "i", "we", "you", "they", "he", "she", "my", "our", "your", "their", "me",
    "us"})
_VALUE_LIKE = re.compile(r"[/.=:]|\d")
_TOKEN = re.compile(r"\S+")


def inline_command(line: str) -> tuple[int, int] | None:
    """The span of a command a person quoted inside a sentence, or None.

    Command-shaped by its flags, whatever the words around it: a launcher program (``_INLINE_LAUNCHER``)
    followed by a flag among its first four tokens, and either two flags or, with one, a path, value or
    assignment beside it (``docker run --cpus=2``, ``python app.py --fp16``). The span ends at the quote or
    bracket that opened it; unquoted, where the sentence goes on (a clause's punctuation, a conjunction) or at
    the first function word (``is``, ``with``, ``the``…), which no command line is made of."""
    for m in _INLINE_LAUNCHER.finditer(line):
        start = m.start()
        opener = line[start - 1] if start > 0 else ""
        end = len(line)
        close = line.find(_CLOSERS[opener], m.end()) if opener in _CLOSERS else -1
        if close != -1:
            end = close
        else:
            goes_on = _SENTENCE_GOES_ON.search(line, m.end())
            if goes_on:
                end = goes_on.start()
        spans = list(_TOKEN.finditer(line, m.end(), end))
        if close == -1:
            cut = next((i for i, t in enumerate(spans) if t.group().lower() in _FUNCTION_WORDS), None)
            if cut is not None:
                spans = spans[:cut]
                end = spans[-1].end() if spans else m.end()
        tokens = [t.group() for t in spans]
        flags = [i for i, t in enumerate(tokens) if _FLAG.match(t)]
        if not flags or flags[0] > 3:
            continue
        if len(flags) >= 2 or any(_VALUE_LIKE.search(t) for t in tokens):
            return start, end
    return None


# a program's aligned key-value row ("Successful requests:                     1000", "Mean TTFT (ms):   4090.94"):
# a label, its colon, then padding to a column (two spaces or more) and a short value; and a rule or a titled rule
# around a printed block ("====== Serving Benchmark Result ======", "-----Time to First Token-----")
_ALIGNED_COLUMN = 20  # the value starts at this column or further: the label was padded to a column
# (the title may hold a hyphen: "-----Inter-token Latency-----"; a starred title has its spaces, as perf_analyzer's
# "*** Measurement Settings ***": "---" and "***bold***" are a person's)
_TITLE = r"[^=\-~*\d\s](?:[^=~*\d]{0,58}[^=\-~*\d\s])?"  # a block's title: no digits (a person's heading has numbers)
_RULE = re.compile(rf"[=\-~]{{5,}}|[=\-~]{{4,}}\s?{_TITLE}\s?[=\-~]{{4,}}|\*{{3,}} {_TITLE} \*{{3,}}")
_TITLE_WORDS = 6  # a printed block's title is a few words ("Time to First Token"); a longer one is a person's
# llama.cpp's timing rows (its "%10.2f ms" padding: "prompt eval time =    8734.21 ms /   971 tokens (…)", "total
# time =    9809.97 ms /   990 tokens"), by their own labels and layout, with or without their prefix
_LLAMA_TIMING = re.compile(r"(?:\w+:\s+)?(?:prompt eval|eval|total|load|sampling|sample) time\s+=\s+\d+(?:\.\d+)? ms"
                           r"(?:\s*/\s*\d+\s+(?:tokens|runs))?"
                           r"(?:\s*\(\s*[\d.]+ ms per token,\s+[\d.]+ tokens per second\))?"
                           r"|(?:\w+:\s+)?graphs reused\s+=\s+\d+")


def _aligned(text: str) -> bool:
    """A key-value row a program printed: ``Label:`` padded to a column, a number or a short value after it."""
    m = _KEY_VALUE.fullmatch(text)
    if m is None:
        return False
    value = m.group("v")  # padded out to a column ("Expected:  100 tok/s" is a person's)
    return m.start("v") >= _ALIGNED_COLUMN and (bool(_NUMBER_VALUE.fullmatch(value)) or len(value.split()) <= 3)


_KEY_VALUE = re.compile(r"[A-Za-z(#][^:]{0,80}:\s{2,}(?P<v>\S.*?)")
_NUMBER_VALUE = re.compile(r"[-+]?[\d.,]+\s?(?:%|[A-Za-z/]{1,8})?|inf|None|N/A")
_COLUMNS = re.compile(r"\s{2,}")
_CELL_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?\s?(?:%|[munµ]?s|[KMG]i?B|x)?")


def printed_row(text: str) -> bool:
    """A row a program printed in columns, no rules between them: four cells or more apart by runs of spaces,
    three or more of them numbers (``nsys stats``, a profiler's table, ``[CUDA memcpy HtoD]`` rows), or its
    header (five short cells or more, ``Time (%)  Total Time (ns)  Num Calls  Avg (ns) …``), or a value padded to a
    column after its ``=`` (llama.cpp's timing rows: ``eval time =    1075.76 ms /    19 tokens``). Its cells are the
    program's: a collector reads them, and nothing in them is a person's statement."""
    if _LLAMA_TIMING.fullmatch(text.strip()):
        return True
    if "|" in text:  # a ruled table (nvidia-smi's, a person's markdown) is read as a table, cell by cell
        return False
    cells = _COLUMNS.split(text.strip())
    if len(cells) < 4:
        return False
    numbers = sum(1 for c in cells if _CELL_NUMBER.fullmatch(c))
    if numbers >= 3 and numbers * 2 >= len(cells):
        return True
    return numbers == 0 and len(cells) >= 5 and all(len(c.split()) <= 3 and len(c) <= 32 for c in cells)


def _tabular(text: str) -> bool:
    if text.startswith("|") or text.count("|") >= 3 or _BOX.search(text):
        return True
    if printed_row(text):
        return True
    if (_RULE.fullmatch(text) and len(text.strip("=-~* ").split()) <= _TITLE_WORDS) or _aligned(text):
        return True
    if text.count("\t") >= 2:
        return True
    fields = re.split(r"[,;]", text)
    return len(fields) >= 6 and all(len(f.split()) <= 4 for f in fields)  # a CSV header or row


def kind_of(line: str) -> LineKind:
    """The kind of one cleaned line (see the module docstring)."""
    text = line.strip()
    if not text:
        return LineKind.BLANK
    if _METRICS.match(text):
        return LineKind.METRICS
    if _TRACEBACK.match(text) or _EXCEPTION.match(text):
        return LineKind.TRACEBACK
    if _CODE.match(line):
        return LineKind.CODE
    if _LOG.match(line):
        return LineKind.LOG
    if _COMMAND.match(text) or _FLAGS_ONLY.match(text) or (_CONTINUED.search(text) and "--" in text) \
            or ("--" in text and _BARE_COMMAND.match(text) and len(_FLAG_VALUE.findall(text)) >= 2):
        return LineKind.COMMAND
    if text.startswith(("{", "[{", '["', "[[", "<?xml", "<")) or _LABELLED_STRUCTURE.match(text):
        return LineKind.JSON
    if _tabular(text):
        return LineKind.TABLE
    return LineKind.PROSE


def is_exception_line(line: str) -> bool:
    """``line`` is the exception a traceback ends with (``RuntimeError: Engine core initialization failed``), not a
    frame: something was raised."""
    return _EXCEPTION.match(line.strip()) is not None


# what a program (not a person) wrote: a prose-like line between two of these is the program's output too
MACHINE = frozenset({LineKind.LOG, LineKind.TRACEBACK, LineKind.CODE, LineKind.METRICS, LineKind.COMMAND})


def is_machine(line: str, kind: LineKind) -> bool:
    """``line`` (of ``kind``) is a program's text; a code fence (```) is a separator, not a program's."""
    return kind in MACHINE and not line.lstrip().startswith("```")
