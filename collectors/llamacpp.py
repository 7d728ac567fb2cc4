"""llama.cpp-family timing output: where a generation's time went, prompt processing vs generation.

Recognised (numbers vary; every field is read on its own, so a block pasted in part still counts):

* llama.cpp ``llama_print_timings:`` / ``llama_perf_context_print:`` / llama-server lines::

           sample time =     364.87 ms /   347 runs   (    1.05 ms per token,   951.03 tokens per second)
      prompt eval time =  551847.36 ms /  4235 tokens (  130.31 ms per token,     7.67 tokens per second)
             eval time =   62647.15 ms /   346 runs   (  181.06 ms per token,     5.52 tokens per second)
            total time =  615798.54 ms

* ollama ``--verbose`` statistics::

      prompt eval count:    1180 token(s)
      prompt eval duration: 15.833678s
      eval count:           114 token(s)
      eval duration:        2.391734s

* llama-server's progress while a long prompt is processed (after its first 3 s, every few seconds)::

      slot print_timing: id  3 | task 0 | prompt processing, n_tokens = 118810, progress = 0.99, t = 401.80 s / …

* koboldcpp: ``Processing Prompt [BLAS] (2048 / 14093 tokens)`` and
  ``Process:12.34s (8.8ms/T = 113.6T/s), Generate:4.56s (45.6ms/T = 21.9T/s), Total:16.90s`` (newer ones lead
  with ``Init:3.19s``, the host's preparation before the prompt is processed).

A *generation* is one block: a prompt-eval line followed by its eval line.

llama-cpp-python's server (``python -m llama_cpp.server``, uvicorn) also prints an access line when a
request's answer starts (``INFO:     127.0.0.1:52144 - "POST /v1/completions HTTP/1.1" 200 OK``; a
stream's, before its tokens) and one timing block when it ends; its one ``Llama`` serves one request at
a time. So at each timing block, the requests begun and not yet finished are the ones in flight: one
generating, the rest waiting for it (``in_flight``). A stream the server cuts (its default
``--interrupt_requests True`` cancels a running stream when another request arrives) prints
``Disconnected from client`` and no timing block (``disconnects``). Pure, stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from diagnose.collectors.logtext import clean_lines, glue_hint_at
from diagnose.collectors.units import to_ms
from diagnose.units import parse_size

_NUM = r"(\d+(?:\.\d+)?)"
# llama.cpp: "prompt eval time = 551847.36 ms / 4235 tokens"; "eval time = 62647.15 ms / 346 runs"; the sampler's
# time on the CPU, apart from eval ("sample time = 11775.43 ms / 151 runs", llama_perf_sampler_print's "sampling time")
_LLAMA = re.compile(
    rf"(?P<what>prompt eval|eval|total|load|sampling|sample)\s+time\s*=\s*{_NUM}\s*ms"
    r"(?:\s*/\s*(?P<n>\d+)\s*(?:tokens|runs))?",
    re.IGNORECASE,
)
# ollama --verbose: "prompt eval duration: 15.833678s", "prompt eval count: 1180 token(s)"
_OLLAMA_DUR = re.compile(
    rf"(?P<what>total|load|prompt eval|eval)\s+duration:\s*(?P<parts>(?:{_NUM}\s*(?:ms|µs|us|s|m|h)\s*)+)",
    re.IGNORECASE,
)
_OLLAMA_PART = re.compile(rf"{_NUM}\s*(ms|µs|us|s|m|h)", re.IGNORECASE)
_OLLAMA_COUNT = re.compile(r"(?P<what>prompt eval|eval)\s+count:\s*(?P<n>\d+)\s*token", re.IGNORECASE)
# uvicorn's access line of a generation request (llama-cpp-python's server)
_ACCESS = re.compile(r'"POST /v1/(?:chat/)?completions HTTP/[\d.]+" 200')
_DISCONNECT = re.compile(r"Disconnected from client")
# the model loader's placement (llama.cpp src/llama-model.cpp, "llm_load_tensors:"/"load_tensors:"; older
# "llama_model_load_internal:"). The line alone does not say a GPU was there: llama.cpp prints it whenever a GPU or
# an RPC backend is registered (the official CPU packages build RPC in), ollama on every load
_OFFLOADED = re.compile(r"offloaded\s+(\d+)\s*/\s*(\d+)\s+layers\s+to\s+GPU")
_DRAFT = re.compile(r"loading draft model|load_model: loading draft|draft model:", re.IGNORECASE)
# a paste's own label over each model's timings in speculative decoding ("draft:" … "target:"): the draft's are not
# the served model's generation
_DRAFT_LABEL = re.compile(r"^\W*(?:the\s+)?draft(?:\s+model)?\s*(?:\([^)]{0,40}\))?\s*:\W*$", re.IGNORECASE)
_TARGET_LABEL = re.compile(r"^\W*(?:the\s+)?(?:target|main)(?:\s+model)?\s*(?:\([^)]{0,40}\))?\s*:\W*$",
                           re.IGNORECASE)
# what does say it: a buffer the loader or the context allocated on a GPU device ("CUDA0 model buffer size",
# "ROCm0 KV buffer size", "Metal compute buffer size"; CUDA_Host is pinned host memory), or CUDA's device count
_GPU_BUFFER = re.compile(r"\b((?:CUDA|ROCm|Metal|MTL|Vulkan|SYCL|MUSA|CANN)\d*)\s+(?:model |KV |compute |output )?"
                         r"buffer size\s*=")
_CUDA_FOUND = re.compile(r"ggml_cuda_init: found ([1-9]\d*) \w+ devices?")
# Metal's running total of what it allocated against the GPU's recommended working set (ggml-metal: 2023's
# "ggml_metal_add_buffer: allocated 'data            ' buffer, size =  8967.25 MB, (30939.41 / 21845.34)", 2024's
# "ggml_backend_metal_log_allocated_size: allocated buffer, size =  2048.00 MiB, ( 2056.30 /  1536.00)" and
# "ggml_backend_metal_buffer_type_alloc_buffer: allocated buffer, size = …"), in MiB however the unit is written
_METAL_ALLOC = re.compile(r"\ballocated (?:'(?P<name>[^']*)' )?buffer, size\s*=\s*(?P<size>\d{1,9}(?:\.\d+)?)\s*Mi?B,"
                          r"\s*\(\s*(?P<total>\d{1,9}(?:\.\d+)?)\s*/\s*(?P<ws>\d{1,9}(?:\.\d+)?)\s*\)")
# the weights' share of it: the loader's Metal buffer ("llm_load_tensors: Metal buffer size = 4988.00 MiB", newer
# "Metal model buffer size"), or 2023's 'data' buffer
_METAL_MODEL = re.compile(r"\b(?:Metal|MTL\d*)(?:_Mapped)? (?:model )?buffer size\s*=\s*(?P<size>\d{1,9}(?:\.\d+)?)\s*"
                          r"Mi?B")
# ollama sizing the offload to the memory it found ("offload to cuda" … layers.requested=-1 … layers.offload=10)
_OLLAMA_REQUESTED = re.compile(r"layers\.requested=(-?\d+)")
# … and the rest of that record (llm/memory.go, server.go later; a slog record of key=value fields): the layers it
# put on the device it names of the model's layers, the device's free memory as a list per GPU, the weights' size
# (0.1-0.5: msg="offload to cuda"; 2025 on: msg=offload library=cuda, server.go)
_OLLAMA_TARGET = re.compile(r'msg="?offload(?: to (?P<to>\w+)|"?\s.*?\blibrary=(?P<lib>\w+))')
_OLLAMA_MODEL = re.compile(r"\blayers\.model=(\d+)")
_OLLAMA_OFFLOAD = re.compile(r"\blayers\.offload=(\d+)")
_OLLAMA_AVAILABLE = re.compile(r'\bmemory\.available="?\[(?P<v>[^\]]*)\]')
_OLLAMA_WEIGHTS = re.compile(r'\bmemory\.weights\.total="?(?P<v>\d+(?:\.\d+)?\s*[KMGT]i?B)\b')
# llama-server's prompt processing still running, every few seconds past its first 3 s (tools/server, print_timings_pp):
# "slot print_timing: id  3 | task 0 | prompt processing, n_tokens = 118810, progress = 0.99, t = 401.80 s / …"
# … and generation under way ("n_decoded = 700, tg = 10.00 t/s", newer "n_gen = …, tg = …"): the prompt was done
_TG_PROGRESS = re.compile(r"\b(?:n_decoded|n_gen)\s*=\s*\d+,\s*tg\s*=")
_PP_PROGRESS = re.compile(rf"(?:\btask (?P<task>\d+)\s*\|\s*)?prompt processing, n_tokens\s*=\s*(?P<n>\d+), "
                          rf"progress\s*=\s*(?P<p>[\d.]+), t\s*=\s*{_NUM}\s*s\b")
# the threads llama.cpp computes with against the CPUs it sees (std::thread::hardware_concurrency: every online
# logical CPU, not a container's quota). common's "system_info: n_threads = 16 (n_threads_batch = 16) / 32 | …" (the
# batch part from 2023-10), llama-server's "system info: n_threads = 16, n_threads_batch = 16, total_threads = 32",
# its older key=value and JSON records ("system info | n_threads=6 n_threads_batch=-1 … total_threads=6",
# "n_threads":4,…,"total_threads":8; -1 is "as n_threads")
_SYSINFO_SLASH = re.compile(r"system_info:\s*n_threads\s*=\s*(?P<n>\d+)"
                            r"(?:\s*\(\s*n_threads_batch\s*=\s*(?P<b>-?\d+)\s*\))?\s*/\s*(?P<hw>\d+)")
# a GPU backend the build has, in the line's backend list (newer llama.cpp: "| CUDA : ARCHS = 890 | USE_GRAPHS = 1 |")
_BUILD_GPU = re.compile(r"\|\s*(?:CUDA|ROCm|HIP|Metal|METAL|Vulkan|SYCL|MUSA|CANN|OpenCL)\s*:")
_SYSINFO_FIELD = re.compile(r"(?<![\w])\"?(?P<k>n_threads_batch|n_threads|total_threads)\b\"?\s*[=:]\s*\"?(?P<v>-?\d+)")
# koboldcpp
_KOBOLD_PROMPT = re.compile(r"Processing Prompt(?: \[BLAS\])? \((?P<done>\d+) / (?P<total>\d+) tokens\)", re.I)
# newer koboldcpp puts its preparation before them ("Init:3.19s, Process:0.02s (55.56T/s), Generate:0.81s"): the host's
# work before the prompt is processed (tokenising, fast-forwarding or shifting the context)
_KOBOLD_TIMES = re.compile(rf"(?:Init:\s*(?P<init>{_NUM})s,\s*)?Process:\s*{_NUM}s.*?Generate:\s*{_NUM}s",
                           re.IGNORECASE)


SERVED_SHARE = 0.75  # a load with three quarters of the largest's layers is the served model's size, no draft

@dataclass
class Generation:
    """One generation's timings (ms) and token counts, as far as they were printed."""

    prompt_ms: float | None = None
    prompt_tokens: int | None = None
    gen_ms: float | None = None
    gen_tokens: int | None = None
    total_ms: float | None = None
    load_ms: float | None = None
    sample_ms: float | None = None  # the sampler's time on the CPU (grammar, penalties, top-k over the vocabulary)
    init_ms: float | None = None  # koboldcpp's Init: the host's preparation before the prompt is processed

    @property
    def useful(self) -> bool:
        return self.prompt_ms is not None or self.gen_ms is not None


@dataclass
class MetalLoad:
    """One load on a Metal GPU, in MiB: the most Metal had allocated at once, the GPU's recommended working set it
    compared that with, and the model's weights among it where a line said."""

    allocated_mib: float
    working_set_mib: float
    model_mib: float | None = None


@dataclass
class LlamaTimings:
    generations: list[Generation] = field(default_factory=list)
    prompt_tokens_seen: list[int] = field(default_factory=list)  # koboldcpp's prompt sizes
    formats: set[str] = field(default_factory=set)
    arrivals: int = 0  # access lines of generation requests (llama-cpp-python's server)
    in_flight: list[int] = field(default_factory=list)  # at each timing block after an arrival: begun, not done
    disconnects: int = 0  # streams the server ended early ("Disconnected from client")
    loads: list[tuple[int, int]] = field(default_factory=list)  # (layers offloaded, layers) per model loaded
    # which of ``loads`` followed llama-server's "loading draft model"
    draft_loads: set[int] = field(default_factory=set)
    gpu_backend: str | None = None  # a GPU device the loader or the context allocated a buffer on ("CUDA0")
    auto_sized: bool = False  # ollama chose how many layers to offload from the memory it found
    weights_bytes: int | None = None  # ollama's estimate of the model's weights, on a whole load onto one GPU
    # (layers on the GPU, layers) per ollama offload record: its estimate, used only where no loader line says what
    # the runner did (the runner gets num_gpu when the user set it, whatever fits)
    ollama_loads: list[tuple[int, int]] = field(default_factory=list)
    ollama_backend: str | None = None  # the GPU library an ollama offload record names (a loader's buffer outranks it)
    # llama-server's prompt processing in progress, the last line of each task: (tokens processed, the share of the
    # prompt they are, seconds so far)
    prefill_progress: dict[str, tuple[int, float, float]] = field(default_factory=dict)
    generating: bool = False  # a generation's progress line: some prompt was processed whole
    # (compute threads, batch threads or None, logical CPUs the host has) per start-up's system info line
    threads: list[tuple[int, int | None, int]] = field(default_factory=list)
    build_gpu: bool = False  # the system info line lists a GPU backend ("CUDA : ARCHS = 890", "Metal : …")
    # per load on a Metal GPU: a log of several loads or machines keeps them apart
    metal_loads: list[MetalLoad] = field(default_factory=list)

    @property
    def metal_worst(self) -> MetalLoad | None:
        """The load furthest past its working set."""
        return max(self.metal_loads, key=lambda x: x.allocated_mib / x.working_set_mib, default=None)

    @property
    def offloaded(self) -> tuple[int, int] | None:
        """(layers offloaded, layers) of the served model, not a draft model beside it: a load llama-server named a
        draft ("loading draft model") is none, nor one with far fewer layers than the largest (under ``SERVED_SHARE``
        of them). Of the served model's loads the last counts: a paste of two runs reads in time, the one it ends
        with is the state now ("0.1.31: offloaded 33/33", then "0.1.32: offloaded 1/29", ollama#3938; "offloaded 0/33"
        forgetting -ngl, then "offloaded 33/33" with it). The loader's own lines, else ollama's offload records."""
        loads = self.load_list
        served = [load for i, load in enumerate(loads) if not (self.loads and i in self.draft_loads)] or loads
        if not served:
            return None
        most = max(layers for _, layers in served)
        return [load for load in served if load[1] >= SERVED_SHARE * most][-1]

    @property
    def load_list(self) -> list[tuple[int, int]]:
        """The loads the layer counts come from: the loader's own lines, else ollama's offload records."""
        return self.loads or self.ollama_loads

    @property
    def ollama_offload(self) -> bool:
        """The layers came from ollama's offload record, not the loader's line."""
        return not self.loads and bool(self.ollama_loads)


class LlamaTimingParser:
    """Feed cleaned lines; ``timings`` holds the generations read."""

    def __init__(self) -> None:
        self.timings = LlamaTimings()
        self._cur = Generation()
        self._draft_next = False  # llama-server announced a draft model: the next offload line is its load
        self._draft_timings = False  # under a paste's "draft:" label: the timings are the draft model's

    def _close(self) -> None:
        if self._cur.useful and self._draft_timings:
            self._cur = Generation()  # the draft model's timings, labelled so: not the served model's
            return
        if self._cur.useful:
            t = self.timings
            t.generations.append(self._cur)
            if t.arrivals:  # requests begun and not finished, this one included
                t.in_flight.append(max(0, t.arrivals - len(t.generations) - t.disconnects + 1))
        self._cur = Generation()

    def _ollama_offload(self, line: str) -> None:
        """Ollama's offload record: whether it sized the offload itself (``layers.requested=-1``), the layers it put
        on a GPU of the model's, and the weights' size when it loads onto one GPU (its weights total is the whole
        model's, split between the GPUs of a longer list)."""
        mr = _OLLAMA_REQUESTED.search(line)
        if mr is not None and int(mr.group(1)) < 0:
            self.timings.auto_sized = True
        target = _OLLAMA_TARGET.search(line)
        device = (target["to"] or target["lib"] or "") if target is not None else ""
        if not device or device.lower() == "cpu":
            return
        mm, mo = _OLLAMA_MODEL.search(line), _OLLAMA_OFFLOAD.search(line)
        if mm is None or mo is None or int(mm.group(1)) <= 0:
            return
        total, on = int(mm.group(1)), int(mo.group(1))
        if mr is not None and int(mr.group(1)) >= 0:
            on = min(int(mr.group(1)), total)  # num_gpu set: the runner is asked for that many, fitting or not
        self.timings.ollama_loads.append((on, total))
        self.timings.ollama_backend = self.timings.ollama_backend or device.upper()  # "CUDA", "ROCM", "METAL"
        avail, weights = _OLLAMA_AVAILABLE.search(line), _OLLAMA_WEIGHTS.search(line)
        # the weights' total is the whole model's: one device's only when every layer went onto the one GPU listed
        if avail is not None and weights is not None and on == total \
                and len(re.findall(r"\d+(?:\.\d+)?\s*[KMGT]i?B", avail["v"])) == 1:
            self.timings.weights_bytes = parse_size(weights["v"])

    def _metal(self, line: str) -> None:
        """Metal's allocations against the recommended working set; a paste may glue several onto one line."""
        t = self.timings
        for m in _METAL_ALLOC.finditer(line):
            total, ws = float(m.group("total")), float(m.group("ws"))
            if ws <= 0:
                continue
            load = t.metal_loads[-1] if t.metal_loads else None
            # a running total that falls, or another working set, is another load (or another machine)
            if load is None or load.working_set_mib != ws or total < load.allocated_mib:
                load = MetalLoad(total, ws)
                t.metal_loads.append(load)
            load.allocated_mib = max(load.allocated_mib, total)
            if (m.group("name") or "").strip() == "data":
                load.model_mib = (load.model_mib or 0.0) + float(m.group("size"))
            if t.gpu_backend is None:
                t.gpu_backend = "Metal"

    def feed(self, line: str) -> None:
        if "POST /v1/" in line and _ACCESS.search(line):
            self.timings.arrivals += 1
            return
        if "Disconnected from client" in line:
            self.timings.disconnects += 1
            return
        if "draft model" in line and _DRAFT.search(line):
            self._draft_next = True
            return
        if len(line) < 60 and ("raft" in line or "arget" in line or "ain" in line):
            if _DRAFT_LABEL.match(line):
                self._close()
                self._draft_timings = True
                return
            if _TARGET_LABEL.match(line):
                self._close()
                self._draft_timings = False
                return
        if "layers to GPU" in line:
            m0 = _OFFLOADED.search(line)
            if m0 and int(m0.group(2)) > 0:
                self.timings.loads.append((int(m0.group(1)), int(m0.group(2))))
                if self._draft_next:  # the speculative-decoding draft's load: not the served model's
                    self.timings.draft_loads.add(len(self.timings.loads) - 1)
                    self._draft_next = False
                return
        if "allocated" in line and "buffer, size" in line:
            self._metal(line)
        if "buffer size" in line and ("Metal" in line or "MTL" in line):
            mm = _METAL_MODEL.search(line)
            if mm and self.timings.metal_loads:
                load = self.timings.metal_loads[-1]
                load.model_mib = (load.model_mib or 0.0) + float(mm.group("size"))
        if "buffer size" in line and self.timings.gpu_backend is None:
            mb = _GPU_BUFFER.search(line)
            if mb:
                self.timings.gpu_backend = mb.group(1)
        if "ggml_cuda_init" in line and self.timings.gpu_backend is None:
            mc = _CUDA_FOUND.search(line)
            if mc:
                self.timings.gpu_backend = "CUDA"
        if "system" in line and "n_threads" in line:
            self._system_info(line)
        if "layers.requested=" in line:
            self._ollama_offload(line)
        if ", tg" in line and _TG_PROGRESS.search(line):
            self.timings.generating = True
            return
        if "prompt processing, n_tokens" in line:
            mp = _PP_PROGRESS.search(line)
            if mp:
                self.timings.prefill_progress[mp.group("task") or ""] = (
                    int(mp.group("n")), float(mp.group("p")), float(mp.group(4)))
                self.timings.formats.add("llama.cpp")
                return
        low = line.lower()
        if "time" in low and "=" in line and " ms" in line:
            for m in _LLAMA.finditer(line):
                self._llama(m)
        if "duration:" in low or "count:" in low:
            dur = _OLLAMA_DUR.search(line)
            if dur:
                ms = sum(to_ms(float(p.group(1)), p.group(2)) for p in _OLLAMA_PART.finditer(dur.group("parts")))
                self._set(dur.group("what").lower(), ms, None, "ollama")
            m2 = _OLLAMA_COUNT.search(line)
            if m2:
                what = m2.group("what").lower()
                if what == "prompt eval":
                    if self._cur.prompt_tokens is not None:
                        self._close()
                    self._cur.prompt_tokens = int(m2.group("n"))
                else:
                    self._cur.gen_tokens = int(m2.group("n"))
                self.timings.formats.add("ollama")
        if "processing prompt" in low:
            m3 = _KOBOLD_PROMPT.search(line)
            if m3:
                self.timings.prompt_tokens_seen.append(int(m3.group("total")))
                self.timings.formats.add("koboldcpp")
        if "process:" in low and "generate:" in low:
            m4 = _KOBOLD_TIMES.search(line)
            if m4:
                self._close()
                self._cur.prompt_ms = float(m4.group(3)) * 1000
                self._cur.gen_ms = float(m4.group(4)) * 1000
                if m4.group("init"):
                    self._cur.init_ms = float(m4.group("init")) * 1000
                if self.timings.prompt_tokens_seen:
                    self._cur.prompt_tokens = self.timings.prompt_tokens_seen[-1]
                self._close()
                self.timings.formats.add("koboldcpp")

    def feed_raw(self, lines: Iterable[str]) -> None:
        """Physical lines as they stand in the log (not cleaned), in order: the tail of a big log.

        An access line of a generation request that holds one record only counts an arrival, and
        neither its prefixes nor its trailing blanks change that, so it skips the cleaning (a server
        logs one per request: most of the lines a big log sends here); every other line is cleaned
        and fed as ``feed`` would see it.
        """
        timings = self.timings
        for raw in lines:
            if ("POST /v1/" in raw and "\r" not in raw and _ACCESS.search(raw)
                    and glue_hint_at(raw) is None):
                timings.arrivals += 1
                continue
            for line in clean_lines((raw,)):
                self.feed(line)

    def _system_info(self, line: str) -> None:
        m = _SYSINFO_SLASH.search(line)
        if m:
            n, b, hw = int(m.group("n")), m.group("b"), int(m.group("hw"))
        elif re.search(r"system[ _]info", line):
            fields = {f.group("k"): int(f.group("v")) for f in _SYSINFO_FIELD.finditer(line)}
            if "n_threads" not in fields or "total_threads" not in fields:
                return
            n, hw, b = fields["n_threads"], fields["total_threads"], fields.get("n_threads_batch")
        else:
            return
        if _BUILD_GPU.search(line):
            self.timings.build_gpu = True
        batch = int(b) if b is not None and int(b) > 0 else None
        if n > 0 and hw > 0:
            self.timings.threads.append((n, batch, hw))

    def _llama(self, m: re.Match[str]) -> None:
        n = int(m.group("n")) if m.group("n") else None
        self._set(m.group("what").lower(), float(m.group(2)), n, "llama.cpp")

    def _set(self, what: str, ms: float, n: int | None, fmt: str) -> None:
        cur = self._cur
        self.timings.formats.add(fmt)
        if what == "prompt eval":
            if cur.prompt_ms is not None or cur.gen_ms is not None:
                self._close()
                cur = self._cur
            cur.prompt_ms = ms
            if n is not None:
                cur.prompt_tokens = n
        elif what == "eval":
            if cur.gen_ms is not None:
                self._close()
                cur = self._cur
            cur.gen_ms = ms
            if n is not None:
                cur.gen_tokens = n
        elif what == "total":
            cur.total_ms = ms
            if cur.useful and fmt == "llama.cpp":
                self._close()
        elif what == "load":
            cur.load_ms = ms
        elif what in ("sample", "sampling"):
            if cur.gen_ms is not None or cur.sample_ms is not None:
                self._close()  # a block with no total line: the sampler's line opens the next one
                cur = self._cur
            cur.sample_ms = ms

    def result(self) -> LlamaTimings:
        self._close()
        return self.timings
