"""Classify what a request thread's wall-clock sample was doing: running, compiling, or waiting — on what.

Latency is wall time: a request thread that waits (for a lock, a compiler child, another worker's
result, a socket, the GPU) uses no CPU and is invisible to an on-CPU profile. The wall-clock view
samples every thread, waiting or not (py-spy ``--idle``), and these tables say what each sample is.
Like ``activities.PATTERNS`` they are the whole knowledge, documented in docs/waits.md and meant to
be extended: add a row, add a test case.

1. **Is the thread serving a request?** ``ENTRY_PATTERNS``: a frame that only a thread handling a
   request has on its stack (``do_POST`` of an ``http.server`` handler, a thread-pool task, an
   asyncio callback, a LitServe worker loop that is not fetching its next request, …). The innermost
   such frame decides; a row with ``parked`` set means "unless the next frame towards the leaf
   matches it" (an anyio worker thread or a LitServe loop waiting in ``get`` for work is idle
   capacity, not a request). Threads that serve nothing (idle pools, keep-alive connections waiting
   for the client's next request, background threads) are left out of the wall-clock shares.
2. **Compiling?** A sample the activity table calls ``compile`` (dynamo, inductor, triton, TensorRT
   frames on the stack) is compilation, whether the thread computes or waits for a compiler child
   or compile worker.
3. **Waiting in Python-level machinery?** Walking from the leaf over the frames that match
   ``WAIT_PATTERNS``, the outermost one (the API the application called) decides: ``Queue.get``
   (with ``Condition.wait`` under it) is a queue wait, ``requests.get`` (with ``socket.readinto``
   under it) an I/O wait.
4. **Otherwise** the leaf is application or library code. The part of its time the on-CPU profile
   also saw is ``cpu`` (running); the rest is blocked in a C call made on that line — ``with lock:``,
   ``time.sleep``, ``x.item()`` have no Python frame of their own — and ``SOURCE_PATTERNS`` on the
   line's source text says which (``other_wait`` when nothing matches: a C extension blocking, or
   waiting for the GIL).

What no stack shows: a coroutine that *awaits* (an ``async def`` handler waiting for an
``asyncio.Lock``, an HTTP client, a batcher's future) is not on any thread's stack while it waits, so
async frameworks' waits are seen only through their worker threads and processes; and a request
waiting in the kernel's accept queue is counted by ``conn.accept_queue_max``, not here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


class Wait(StrEnum):
    """What a request thread's time went to; the evidence keys are ``wall.<value>_share``."""

    CPU = "cpu"  # running Python or native code (on the CPU, or runnable)
    COMPILE = "compile"  # compiling graphs, itself or by waiting for compiler children / compile workers
    LOCK = "lock_wait"  # a lock, semaphore or condition variable
    QUEUE = "queue_wait"  # a queue, a future, another thread's hand-off (Event), a multiprocessing pipe
    IO = "io_wait"  # a socket read, an HTTP/gRPC/database call
    SYNC = "sync"  # a CUDA synchronisation (torch.cuda.synchronize, .item(), .cpu())
    SLEEP = "sleep"  # time.sleep
    CHILD = "child_wait"  # a child process that is not a compiler (a tokenizer worker, a subprocess)
    OTHER = "other_wait"  # blocked in native code the tables do not name (a C extension, the GIL)


@dataclass(frozen=True)
class Entry:
    file: str  # regex searched in the frame's (short) file path ("" = any)
    function: str  # regex searched in the function's (qualified) name ("" = any)
    note: str
    parked: str = ""  # regex on the next frame's function: when it matches, the thread is waiting for work


ENTRY_PATTERNS: tuple[Entry, ...] = (
    Entry("", r"(^|\.)do_[A-Z]+$", "http.server handler method (BaseHTTPRequestHandler.do_POST, …)"),
    Entry(r"(^|/)wsgiref/handlers\.py", r"(^|\.)run$", "wsgiref request"),
    Entry(r"werkzeug/serving\.py", r"run_wsgi", "werkzeug / Flask development server request"),
    Entry(r"gunicorn/workers/", r"handle_request", "gunicorn worker request"),
    Entry(r"concurrent/futures/thread\.py", r"(^|\.)run$", "a thread-pool task (_WorkItem.run); one that is "
          "itself a queue's `get` is a consumer waiting for its next item (LitServe's response reader)",
          parked=r"(^|\.)get$"),
    Entry(r"anyio/_backends/_asyncio\.py", r"(^|\.)run$", "an anyio worker thread running a sync endpoint "
          "(Starlette/FastAPI run_in_threadpool)", parked=r"(^|\.)get$"),
    Entry(r"(^|/)asyncio/events\.py", r"(^|\.)_run$", "an asyncio callback (Handle._run): the event loop at work"),
    Entry(r"starlette/|fastapi/|uvicorn/protocols/|aiohttp/web|sanic/|tornado/web", "",
          "an ASGI/HTTP framework handling a request"),
    Entry(r"litserve/loops/", "", "a LitServe inference worker loop", parked=r"(^|\.)get$"),
    Entry(r"grpc/_server\.py", r"_unary_response_in_pool|_stream_response_in_pool", "a gRPC handler"),
)


@dataclass(frozen=True)
class WaitPattern:
    wait: Wait
    file: str  # regex searched in the frame's (short) file path ("" = any)
    function: str  # regex searched in the function's (qualified) name ("" = any)
    note: str


WAIT_PATTERNS: tuple[WaitPattern, ...] = (
    WaitPattern(Wait.SYNC, r"torch/cuda/", r"synchroni[sz]e|wait|query", "CUDA synchronize / event / stream waits"),
    WaitPattern(Wait.CHILD, r"(^|/)subprocess\.py|multiprocessing/(popen_|pool\.py)", "",
                "waiting for a child process (subprocess, a multiprocessing pool)"),
    WaitPattern(Wait.QUEUE, r"(^|/)queue\.py", r"get|put|join", "queue.Queue"),
    WaitPattern(Wait.QUEUE, r"multiprocessing/(queues|connection|managers|synchronize)\.py", "",
                "a multiprocessing queue, pipe or manager"),
    WaitPattern(Wait.QUEUE, r"concurrent/futures/", r"result|wait|as_completed|__exit__|shutdown|map",
                "a future's result"),
    WaitPattern(Wait.QUEUE, r"(^|/)threading\.py", r"Event\.wait|Thread\.join|Barrier\.wait|_wait_for_tstate_lock"
                r"|^wait$|^join$", "another thread's hand-off (Event.wait, Thread.join)"),
    WaitPattern(Wait.LOCK, r"(^|/)threading\.py", r"Condition\.|Semaphore\.|RLock\.|acquire|wait_for|__enter__",
                "a lock, semaphore or condition variable"),
    WaitPattern(Wait.IO, r"(^|/)(socket|ssl|selectors|http/client|urllib/request)\.py|urllib3/|requests/|httpx/"
                r"|httpcore/|aiohttp/client|grpc/_channel|botocore/|redis/|psycopg|pymongo/", "",
                "a socket read or a remote call (HTTP, gRPC, a database)"),
    WaitPattern(Wait.IO, r"(^|/)asyncio/(runners|base_events)\.py|uvloop/", r"(^|\.)(run|run_forever|run_until_complete"
                r"|_run_once)$", "an event loop waiting for I/O (uvloop's wait is in C, under these frames)"),
    WaitPattern(Wait.SLEEP, r"(^|/)time\.py|asyncio/tasks\.py", r"(^|\.)sleep$", "a sleep"),
)


@dataclass(frozen=True)
class SourcePattern:
    wait: Wait
    line: str  # regex searched in the source text of the line a blocked thread stands on
    note: str


SOURCE_PATTERNS: tuple[SourcePattern, ...] = (
    SourcePattern(Wait.LOCK, r"(?i)\bwith\s+[\w.\[\]'\"()]*(lock|mutex|sem\w*|_lk)\w*\b[^:]*:\s*(#.*)?$"
                  r"|\.acquire\(", "`with lock:`, `lock.acquire()` (a C lock: no Python frame)"),
    SourcePattern(Wait.SLEEP, r"\bsleep\(", "`time.sleep(…)`"),
    SourcePattern(Wait.SYNC, r"\.(item|tolist|cpu|numpy|synchronize)\(\s*\)|\.to\(\s*['\"]cpu|cuda\.synchronize",
                  "`.item()`, `.cpu()`, `.tolist()` on a GPU tensor, `torch.cuda.synchronize()`"),
    SourcePattern(Wait.CHILD, r"\bwait(pid|4)?\(|\bcommunicate\(", "`os.waitpid`, `proc.communicate()`"),
    SourcePattern(Wait.IO, r"\.(recv\w*|read\w*|accept|connect|sendall|urlopen|request|fetch)\(",
                  "a socket or file read, a blocking client call"),
)

_ENTRY = [(e, re.compile(e.file) if e.file else None, re.compile(e.function) if e.function else None,
           re.compile(e.parked) if e.parked else None) for e in ENTRY_PATTERNS]
_WAIT = [(w, re.compile(w.file) if w.file else None, re.compile(w.function) if w.function else None)
         for w in WAIT_PATTERNS]
_SOURCE = [(p, re.compile(p.line)) for p in SOURCE_PATTERNS]
_LIBS = re.compile(r"^.*?/(?:site-packages|dist-packages)/|^.*?/lib/python\d+(?:\.\d+)?/")


def short_path(path: str) -> str:
    """A file path as py-spy shortens it: relative to site-packages or the standard library when it
    is there (``torch/nn/modules/linear.py``, ``threading.py``), else its last two parts."""
    m = _LIBS.match(path)
    if m:
        return path[m.end():]
    parts = path.split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else path


def serving(frames: Sequence[tuple[str, str]]) -> bool:
    """Whether a stack (function, short file) pairs, root first, is a thread serving a request."""
    for i in range(len(frames) - 1, -1, -1):
        function, file = frames[i]
        for _, frx, fnrx, parked in _ENTRY:
            if frx is not None and not frx.search(file):
                continue
            if fnrx is not None and not fnrx.search(function):
                continue
            # the innermost entry decides: a loop fetching its next request is waiting for work
            return not (parked is not None and i + 1 < len(frames) and parked.search(frames[i + 1][0]))
    return False


def machinery(frames: Sequence[tuple[str, str]]) -> Wait | None:
    """The wait class of the outermost wait-machinery frame of the run of them at the leaf, if any."""
    found: Wait | None = None
    for function, file in reversed(frames):
        hit = _machinery_frame(function, file)
        if hit is None:
            break
        found = hit
    return found


def machinery_depth(frames: Sequence[tuple[str, str]]) -> int:
    """How many frames at the leaf are wait machinery (the frame above them made the call)."""
    depth = 0
    for function, file in reversed(frames):
        if _machinery_frame(function, file) is None:
            break
        depth += 1
    return depth


def _machinery_frame(function: str, file: str) -> Wait | None:
    for w, frx, fnrx in _WAIT:
        if frx is not None and not frx.search(file):
            continue
        if fnrx is not None and not fnrx.search(function):
            continue
        return w.wait
    return None


def from_source(line: str) -> Wait | None:
    """What a thread blocked on this source line waits for, if the line says."""
    for p, rx in _SOURCE:
        if rx.search(line):
            return p.wait
    return None
