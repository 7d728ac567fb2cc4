"""The wall-clock tables (docs/waits.md): which threads serve requests and what they wait on, case by case."""

from __future__ import annotations

import pytest

from diagnose.derive import waits
from diagnose.derive.activities import compiler_process
from diagnose.derive.waits import Wait

BOOT = [
    ("Thread._bootstrap", "threading.py"),
    ("Thread._bootstrap_inner", "threading.py"),
    ("Thread.run", "threading.py"),
]
HTTP = [
    *BOOT,
    ("ThreadingMixIn.process_request_thread", "socketserver.py"),
    ("BaseRequestHandler.__init__", "socketserver.py"),
    ("BaseHTTPRequestHandler.handle", "http/server.py"),
    ("BaseHTTPRequestHandler.handle_one_request", "http/server.py"),
]
ANYIO = [*BOOT, ("WorkerThread.run", "anyio/_backends/_asyncio.py")]
LITSERVE = [
    ("BaseProcess.run", "multiprocessing/process.py"),
    ("inference_worker", "litserve/loops/loops.py"),
    ("SingleLoop.run_single_loop", "litserve/loops/simple_loops.py"),
]
POOL = [*BOOT, ("_worker", "concurrent/futures/thread.py"), ("_WorkItem.run", "concurrent/futures/thread.py")]


@pytest.mark.parametrize(
    ("stack", "serving"),
    [
        ([*HTTP, ("InferenceHandler.do_POST", "examples/service.py"), ("infer", "examples/service.py")], True),
        ([*HTTP, ("SocketIO.readinto", "socket.py")], False),  # keep-alive: waiting for the client's next request
        ([*ANYIO, ("embed", "app.py")], True),  # a sync FastAPI endpoint in anyio's worker thread
        ([*ANYIO, ("Queue.get", "queue.py"), ("Condition.wait", "threading.py")], False),  # the idle pool
        ([*LITSERVE, ("ImageAPI.decode_request", "app.py")], True),
        ([*LITSERVE, ("Queue.get", "multiprocessing/queues.py")], False),  # the worker waiting for work
        ([*POOL, ("embed", "app.py")], True),
        ([*POOL, ("get", "<string>"), ("BaseProxy._callmethod", "multiprocessing/managers.py")], False),  # a consumer
        ([*BOOT, ("ModelWorker.run", "examples/service.py"), ("Queue.get", "queue.py")], False),  # a background worker
        (
            [
                ("Runner.run", "asyncio/runners.py"),
                ("BaseEventLoop._run_once", "asyncio/base_events.py"),
                ("Handle._run", "asyncio/events.py"),
                ("app", "starlette/routing.py"),
            ],
            True,
        ),
    ],
)
def test_serving(stack: list[tuple[str, str]], serving: bool) -> None:
    assert waits.serving(stack) is serving


@pytest.mark.parametrize(
    ("leaf", "wait"),
    [
        ([("Queue.get", "queue.py"), ("Condition.wait", "threading.py")], Wait.QUEUE),  # the outermost decides
        ([("Event.wait", "threading.py"), ("Condition.wait", "threading.py")], Wait.QUEUE),  # another thread's hand-off
        ([("Condition.wait", "threading.py")], Wait.LOCK),
        ([("Semaphore.acquire", "threading.py"), ("Condition.wait", "threading.py")], Wait.LOCK),
        ([("Future.result", "concurrent/futures/_base.py"), ("Condition.wait", "threading.py")], Wait.QUEUE),
        (
            [
                ("get", "requests/api.py"),
                ("Session.send", "requests/sessions.py"),
                ("HTTPResponse.begin", "http/client.py"),
                ("SocketIO.readinto", "socket.py"),
            ],
            Wait.IO,
        ),
        ([("Popen.communicate", "subprocess.py"), ("PollSelector.select", "selectors.py")], Wait.CHILD),
        ([("synchronize", "torch/cuda/__init__.py")], Wait.SYNC),
        ([("Runner.run", "asyncio/runners.py")], Wait.IO),  # uvloop's loop waits in C under this frame
        ([("embed", "app.py")], None),  # application code: the source line has to say
    ],
)
def test_machinery(leaf: list[tuple[str, str]], wait: Wait | None) -> None:
    assert waits.machinery([("handler", "app.py"), *leaf]) is wait


def test_machinery_depth_points_at_the_caller() -> None:
    stack = [("handler", "app.py"), ("Queue.get", "queue.py"), ("Condition.wait", "threading.py")]
    assert waits.machinery_depth(stack) == 2
    assert waits.machinery_depth([("handler", "app.py")]) == 0


@pytest.mark.parametrize(
    ("line", "wait"),
    [
        ("with MODEL_LOCK:", Wait.LOCK),
        ("with self._lock:  # guard the weights", Wait.LOCK),
        ("self.sem.acquire()", Wait.LOCK),
        ("time.sleep(FETCH_S)", Wait.SLEEP),
        ("return float(y.sum().item())", Wait.SYNC),
        ("out = logits.cpu()", Wait.SYNC),
        ("torch.cuda.synchronize()", Wait.SYNC),
        ("pid, status = os.waitpid(child, 0)", Wait.CHILD),
        ("data = sock.recv(65536)", Wait.IO),
        ("y = model(x)", None),
        ("with torch.no_grad():", None),  # a context manager that is not a lock
    ],
)
def test_from_source(line: str, wait: Wait | None) -> None:
    assert waits.from_source(line) is wait


@pytest.mark.parametrize(
    ("path", "short"),
    [
        ("/usr/lib/python3.11/threading.py", "threading.py"),
        ("/srv/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py", "torch/nn/modules/linear.py"),
        ("/usr/lib/python3/dist-packages/numpy/core/x.py", "numpy/core/x.py"),
        ("/srv/app/models/service.py", "models/service.py"),
        ("<string>", "<string>"),
    ],
)
def test_short_path(path: str, short: str) -> None:
    assert waits.short_path(path) == short


@pytest.mark.parametrize(
    ("name", "command", "compiler"),
    [
        ("cc1plus", "", True),
        ("g++", "", True),
        ("ld", "", True),
        ("collect2", "", True),
        ("as", "", True),
        ("nvcc", "", True),
        ("ptxas", "", True),
        ("python", "python -m torch._inductor.compile_worker", True),
        ("python3", "python3 compile_worker/__main__.py", True),
        ("python", "python app.py", False),
        ("openssl", "", False),
        ("tokenizers", "", False),
    ],
)
def test_compiler_processes(name: str, command: str, compiler: bool) -> None:
    assert compiler_process(name, command) is compiler
