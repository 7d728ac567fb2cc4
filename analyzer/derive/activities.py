"""Classify a sampled Python stack into what the service was doing.

The table ``PATTERNS`` is the whole knowledge: each row names an activity, a regular expression
on the frame's file path and one on its function name. It is documented in docs/activities.md
and meant to be extended: add a row, add a test case.

How a stack is classified:
1. Walking from the leaf, if a graph-compilation frame (dynamo tracing, AOT autograd, inductor
   lowering/codegen, triton, TensorRT builders) comes before any frame that *runs* compiled code
   (inductor's runtime and generated modules, AOT autograd's runtime wrappers), the sample is
   ``compile``: compiling is on the stack of whatever triggered it, so no other frame may claim it.
   A compiler frame rootward of running compiled code is only the wrapper every call into an
   already-compiled graph passes through, and does not count.
2. Otherwise walk from the leaf (innermost frame) towards the root; the first frame that matches
   a row decides. Leaf first, because the innermost library call says what the CPU is doing: a
   user function ``decode_step`` that calls the model is ``forward`` (torch is innermost), while
   a user function ``preprocess`` that loops in pure Python is ``preprocess`` (its own name).
3. No row matched: ``other``.

A service's own files have no row: the library frames on its stacks and its function names (the
by-name rows) decide, so the same code is classified the same wherever it lives (the demo
service's stacks, recorded when it was the one file ``examples/service.py``, classify the same
under its package ``examples/service/``).

Model runtimes with a native core (``RUNTIMES``) are claimed by library and function, never by one
file: llama-cpp-python's ``Llama.eval``/``Llama.generate``/``LlamaContext.decode``, ctransformers'
``LLM.eval``, onnxruntime's ``InferenceSession.run``, OpenVINO's ``InferRequest.infer``, vLLM's model
runner ``execute_model``. Their Python frame is the last one on the stack while the C/C++ core runs
the model (it holds the thread, often with the GIL released), so that frame *is* the forward pass:
without these rows the sample fell through to whatever called it (an HTTP framework's thread pool:
"server"). A function of the library outside the row (``Llama.tokenize``, ``Llama.detokenize``) is
left to the other rows (pre/post-processing by name). The frames of a runtime's own shared-memory
queue (vLLM's ``MessageQueue``: the EngineCore spinning while a worker runs the model) are waiting.

py-spy names a method by its qualified name (``Llama.eval``): a runtime's row accepts a class prefix,
and so does the by-name ``forward`` (``Model.forward``); the by-name ``generate`` and ``__call__`` do
not (``AsyncLLM.generate`` is vLLM's API server awaiting its engine; every middleware has a ``__call__``).

Child processes are classified too (``COMPILER_PROCESSES``): a process in the service's tree whose
name (``/proc/PID/comm``) or command (``-m module`` / script) matches a row is a compiler, and its
CPU counts as compilation of the service (inductor's C++ build on the CPU runs ``g++``/``cc1plus``/
``ld`` children; Triton's and inductor's compile workers are Python processes of their own).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Activity(StrEnum):
    PREPROCESS = "preprocess"  # pre/post-processing: decode, resize, normalise, tokenise, audio
    FORWARD = "forward"  # the model's forward pass (framework ops, compiled graphs)
    COMPILE = "compile"  # graph compilation and engine builds
    COPY_SYNC = "copy_sync"  # host↔device copies and synchronisation
    SERIALIZE = "serialize"  # json, pydantic, protobuf, base64, msgpack, pickle
    SERVER = "server"  # HTTP server, framework routing, sockets, event loop
    WAITING = "waiting"  # locks, queues, sleeps, selectors (active while spinning)
    OTHER = "other"


@dataclass(frozen=True)
class Pattern:
    activity: Activity
    file: str  # regex searched in the frame's file path ("" = any)
    function: str  # regex searched in the function name ("" = any)
    note: str


_COMPILE_FILES = (
    r"torch/_dynamo/(convert_frame|symbolic_convert|output_graph|bytecode_transformation|variables/"
    r"|guards|backends/)"
    r"|torch/_inductor/(compile_fx|graph|lowering|scheduler|codegen/|codecache|select_algorithm"
    r"|async_compile|ir|fx_passes/|decomposition|pattern_matcher|compile_worker/|kernel/)"
    r"|torch/_functorch/(aot_autograd|_aot_autograd/|partitioners)"
    r"|torch/fx/experimental/(proxy_tensor|symbolic_shapes)"
    r"|torch/_subclasses/fake_tensor|torch/export/"
    r"|triton/(compiler|runtime/jit)|tensorrt/|torch_tensorrt/|onnxruntime/.*(build|session_options)"
)

COMPILE = Pattern(Activity.COMPILE, _COMPILE_FILES, "", "torch.compile / triton / TensorRT compilation")

@dataclass(frozen=True)
class Runtime:
    """A model runtime whose core is native: the functions of its Python package that run the model."""

    package: str  # the import package, as it appears in a frame's path (``llama_cpp``)
    functions: tuple[str, ...]  # method or function names (a qualified ``Class.name`` matches by its name)
    note: str

    def pattern(self, activity: Activity = Activity.FORWARD) -> Pattern:
        names = "|".join(re.escape(f) for f in self.functions)
        return Pattern(activity, rf"(^|/){re.escape(self.package)}/", rf"(^|\.)({names})$", self.note)


RUNTIMES: tuple[Runtime, ...] = (
    Runtime("llama_cpp", ("eval", "generate", "decode", "encode", "embed", "create_embedding", "sample",
                          "llama_decode", "llama_encode", "llama_eval"),
            "llama-cpp-python: Llama.eval/generate/embed/sample, LlamaContext.decode (llama.cpp runs the model)"),
    Runtime("ctransformers", ("eval", "generate", "sample", "embed"), "ctransformers: LLM.eval/generate (GGML)"),
    Runtime("onnxruntime", ("run", "run_with_iobinding", "run_with_ort_values", "run_async"),
            "onnxruntime: InferenceSession.run"),
    Runtime("openvino", ("infer", "start_async", "infer_new_request"), "OpenVINO: CompiledModel/InferRequest.infer"),
    Runtime("vllm", ("execute_model", "_model_forward", "sample_tokens", "execute_dummy_batch"),
            "vLLM: the model runner's execute_model (worker and executor)"),
)

# a runtime's own inter-process queue: the side that spins on it waits for the process running the model
RUNTIME_WAITS: tuple[Runtime, ...] = (
    Runtime("vllm/distributed", ("acquire_read", "acquire_write", "dequeue", "enqueue", "wait_until_ready",
                                 "sched_yield"),
            "vLLM's shared-memory MessageQueue (the EngineCore waiting for its workers)"),
)

# Order matters within one frame: the first row that matches the frame wins, so library files
# (PIL, torch) are claimed before the name patterns (torch's F.normalize is the model's).
PATTERNS: tuple[Pattern, ...] = (
    # host↔device copies and syncs
    Pattern(Activity.COPY_SYNC, r"torch/cuda/(__init__|streams)", r"synchronize|wait", "CUDA sync"),
    Pattern(Activity.COPY_SYNC, r"", r"^(cuda|cpu|to|item|tolist|pin_memory|numpy)$", "tensor moves"),
    # serialisation
    Pattern(Activity.SERIALIZE, r"(^|/)json/|orjson|ujson|simplejson|msgspec", r"", "JSON"),
    Pattern(Activity.SERIALIZE, r"pydantic|google/protobuf|/grpc/_|msgpack|(^|/)base64\.py|(^|/)pickle\.py"
            r"|safetensors", r"", "schemas, protobuf, base64, pickle"),
    # pre/post-processing libraries
    Pattern(Activity.PREPROCESS, r"(^|/)PIL/|cv2|torchvision/(transforms|io)|albumentations|skimage"
            r"|imageio|simplejpeg|turbojpeg", r"", "image decode/resize/transform"),
    Pattern(Activity.PREPROCESS, r"tokenizers|transformers/tokenization|sentencepiece|tiktoken|"
            r"transformers/(image_processing|feature_extraction|processing)_", r"", "tokenisers, processors"),
    Pattern(Activity.PREPROCESS, r"librosa|soundfile|torchaudio|audioread|scipy/signal", r"", "audio"),
    Pattern(Activity.PREPROCESS, r"(^|/)numpy/", r"", "numpy array work outside the model"),
    # a DataLoader fetching and collating a batch in this process (num_workers=0, or a worker's own loop): the
    # dataset's __getitem__ under it is the input pipeline, whatever its own files are (not dataloader.py's
    # __next__: with workers it waits on their queue)
    Pattern(Activity.PREPROCESS, r"torch/utils/data/_utils/(fetch|collate)\.py", r"",
            "DataLoader fetch and collate"),
    # the model
    Pattern(Activity.FORWARD, r"torch/(nn|_tensor|functional|_ops|_refs|_decomp|overrides|amp)|"
            r"torchinductor_|torch/_inductor/(output_code|runtime)|torch/_dynamo/eval_frame|"
            r"transformers/(models|modeling_)|vllm/(model_executor|attention|worker|v1/worker)|"
            r"sglang/srt/(models|layers|model_executor)|onnxruntime|tensorrt_llm|flash_attn|xformers|"
            r"timm/|ultralytics/nn|diffusers/models", r"", "framework ops and model code"),
    # native model runtimes, by library and function (before the by-name rows: a runtime's eval is not
    # anybody's eval); the queue a runtime's processes spin on first, as it is leafward of execute_model
    *(r.pattern(Activity.WAITING) for r in RUNTIME_WAITS),
    *(r.pattern() for r in RUNTIMES),
    Pattern(Activity.PREPROCESS, r"", r"(?i)pre_?process|post_?process|decode_(image|jpeg|audio)|resize|"
            r"normali[sz]e|tokeni[sz]e|detokeni[sz]e|transform|augment|letterbox|nms|to_tensor", "by name"),
    # a class prefix for forward (``Model.forward``), none for generate/__call__: ``AsyncLLM.generate`` is
    # vLLM's API server awaiting its engine, and every middleware has a ``__call__``
    Pattern(Activity.FORWARD, r"", r"(^|\.)(forward|_call_impl|_wrapped_call_impl)$|^(generate|__call__)$",
            "by name"),
    # server, network, event loop
    Pattern(Activity.SERVER, r"(^|/)(http/|socketserver|socket\.py|ssl\.py|asyncio/|selectors\.py)|"
            r"uvicorn|starlette|fastapi|aiohttp|gunicorn|uvloop|h11|httptools|flask|werkzeug|"
            r"tornado|litserve|ray/serve|grpc", r"", "HTTP server, routing, sockets"),
    # waiting (active samples: spinning, or a lock just released)
    Pattern(Activity.WAITING, r"(^|/)(threading|queue|multiprocessing/(connection|queues|synchronize))\.py|"
            r"concurrent/futures", r"wait|get|acquire|join|recv|poll|select|sleep|_wait_for", "locks, queues"),
    Pattern(Activity.WAITING, r"", r"^(sleep|select|poll|epoll|accept|recv|wait)$", "blocking calls by name"),
)

# frames that execute an already-compiled graph (not compile one)
RUNS_COMPILED = Pattern(Activity.FORWARD, r"torch/_inductor/(runtime/|output_code)|torchinductor_"
                        r"|torch/_functorch/_aot_autograd/(runtime_wrappers|subclass_codegen)", "",
                        "running a compiled graph")


@dataclass(frozen=True)
class ProcessPattern:
    name: str  # regex matched against the process name (/proc/PID/comm, 15 characters at most)
    command: str  # regex searched in the command hint (``python -m module`` / the script) ("" = any)
    note: str


COMPILER_PROCESSES: tuple[ProcessPattern, ...] = (
    ProcessPattern(r"^(cc1|cc1plus|cc1obj|g\+\+|gcc|c\+\+|cc|clang|clang\+\+|clang-\d+|ld|ld\.\w+|collect2|as"
                   r"|x86_64-linux-gnu-(g\+\+|gcc|ld|as)[\w.-]*|g\+\+-\d+|gcc-\d+)$", "",
                   "C/C++ compilers, assembler and linker (inductor's C++ build on the CPU)"),
    ProcessPattern(r"^(nvcc|ptxas|cicc|fatbinary|nvlink|cudafe\+\+|nvdisasm|hipcc|clang-offload\w*)$", "",
                   "CUDA/ROCm toolchain (nvcc, ptxas, …)"),
    ProcessPattern(r"", r"torch[._/]_inductor[._/]compile_worker|(^| )compile_worker/__main__\.py"
                   r"|triton[._/].*compil|torch_tensorrt|trtexec",
                   "inductor / Triton compile workers, TensorRT builders"),
)
_PROCESS_RX = [(re.compile(p.name) if p.name else None, re.compile(p.command) if p.command else None)
               for p in COMPILER_PROCESSES]


def compiler_process(name: str, command: str = "") -> bool:
    """Whether a child process (its comm ``name`` and command hint) is a compiler of the service's graphs."""
    for nrx, crx in _PROCESS_RX:
        if nrx is not None and not nrx.search(name):
            continue
        if crx is not None and not crx.search(command):
            continue
        return True
    return False


_COMPILED = [(p, re.compile(p.file) if p.file else None, re.compile(p.function) if p.function else None)
             for p in PATTERNS]
_COMPILE_RX = re.compile(COMPILE.file)
_RUNS_COMPILED_RX = re.compile(RUNS_COMPILED.file)


def classify(frames: Sequence[tuple[str, str]]) -> Activity:
    """Classify a stack given as (function, file) pairs, root first."""
    for _, file in reversed(frames):
        if _RUNS_COMPILED_RX.search(file):
            break  # executing a compiled graph: compiler frames rootward of it are call wrappers
        if _COMPILE_RX.search(file):
            return Activity.COMPILE
    for function, file in reversed(frames):
        for pat, frx, fnrx in _COMPILED:
            if frx is not None and not frx.search(file):
                continue
            if fnrx is not None and not fnrx.search(function):
                continue
            return pat.activity
    return Activity.OTHER


def classify_function(function: str, file: str) -> tuple[Activity, bool]:
    """One function alone (a deterministic profiler's row, no stack around it): its activity, and whether a library's
    file decided it (True) rather than its name alone (a by-name row: ``preprocess``, ``_tokenize``, ``forward``)."""
    if _RUNS_COMPILED_RX.search(file):
        return Activity.FORWARD, True
    if _COMPILE_RX.search(file):
        return Activity.COMPILE, True
    for pat, frx, fnrx in _COMPILED:
        if frx is not None and not frx.search(file):
            continue
        if fnrx is not None and not fnrx.search(function):
            continue
        return pat.activity, frx is not None
    return Activity.OTHER, False

