"""Start the demo service as a subprocess and drive load at it (used by `diagnose demo` and tests).

with DemoService("queueing") as svc:
    with background_load(svc.url, PATHOLOGIES["queueing"], duration_s=15) as load:
        ...  # attach to svc.pid
    print(load.result)

``DemoService("queueing", fixed=True)`` starts the same service with the fix diagnose recommends
for the pathology applied (``PathologySpec.fix`` says what changes); drive it with the same load.
"""

from __future__ import annotations

import collections
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import IO

from diagnose.examples.loadgen import LoadResult, run_load

READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 5.0
_TAIL_LINES = 60


@dataclass(frozen=True)
class PathologySpec:
    name: str
    description: str
    concurrency: int
    think_s: float
    expected_category: str | None
    fix: str = ""  # what ``--fixed`` changes: the fix diagnose recommends for the pathology, applied


PATHOLOGIES: dict[str, PathologySpec] = {
    "cpu-preprocess": PathologySpec(
        name="cpu-preprocess",
        description="Serial JPEG decode, blur, resize and naive numpy normalisation in the request "
        "thread dominate the CPU time; the CNN forward is small.",
        concurrency=3,
        think_s=0.0,
        expected_category="cpu_preprocessing",
        fix="CPU001/STG001's fix: JPEG decoded at reduced scale, one crop-and-resize, one vectorised float32 "
        "normalisation (~5x cheaper): p99 and throughput improve ~3-7x; pre-processing stays the largest CPU "
        "share (the CNN forward is ~2 ms).",
    ),
    "recompile": PathologySpec(
        name="recompile",
        description="torch.compile(dynamic=False) sees a new batch size on every request and "
        "recompiles each time (recompile limit raised so the storm never stops).",
        concurrency=2,
        think_s=0.0,
        expected_category="recompilation",
        fix="CMP001's fix: torch.compile(dynamic=True), both graphs (batch 1 and symbolic) compiled before "
        "READY: no recompiles while serving, p99 from seconds to milliseconds.",
    ),
    "queueing": PathologySpec(
        name="queueing",
        description="A threaded HTTP front feeds ONE model-worker thread (~40-80 ms per inference) "
        "through a queue; 16 concurrent clients pile up behind it.",
        concurrency=16,
        think_s=0.0,
        expected_category="queueing",
        fix="QUE001's fix: one model worker per core (2-4) on the shared queue, each batching the waiting "
        "requests into one forward (dynamic batching, up to 8): the queue drains at the same load.",
    ),
    "prefill": PathologySpec(
        name="prefill",
        description="Streaming text generation (a small decoder LM with a KV cache, one engine thread, "
        "continuous batching without chunked prefill): prompts of 64-4096 tokens, whose whole-prompt "
        "prefill (attention is quadratic in the prompt) dominates time to first token and stalls the "
        "other requests' decodes.",
        concurrency=4,
        think_s=0.0,
        expected_category="prefill_ttft",
        fix="TTF001's fix: chunked prefill, a 512-token budget per engine step (decodes first, then prompt "
        "chunks): inter-token p99 falls 2-5x, queue p99 3-10x; time to first token does not (one CPU thread).",
    ),
    "healthy": PathologySpec(
        name="healthy",
        description="The same one-worker design with a small fast model under light load; nothing is saturated.",
        concurrency=1,
        think_s=0.05,
        expected_category=None,
        fix="Nothing to fix: the same service as healthy.",
    ),
}


class ServiceStartError(RuntimeError):
    """The demo service died or did not become ready; the message carries its stderr tail."""


def _drain(stream: IO[str], tail: collections.deque[str], ready: queue.Queue[str] | None) -> None:
    for line in stream:
        tail.append(line.rstrip("\n"))
        if ready is not None and line.startswith("READY "):
            ready.put(line.strip())
            ready = None
    stream.close()


class DemoService:
    """Run ``python -m diagnose.examples.service --pathology NAME [--fixed]`` in its own process group.

    Entering starts the service and waits for its ``READY`` line; leaving terminates the whole
    process group (SIGTERM, then SIGKILL after a grace period) so that no process is left.
    """

    def __init__(
        self,
        pathology: str,
        *,
        python: str = sys.executable,
        env: Mapping[str, str] | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        extra_args: list[str] | None = None,
        fixed: bool = False,
    ) -> None:
        if pathology not in PATHOLOGIES:
            raise ValueError(f"unknown pathology {pathology!r}; choose one of {', '.join(PATHOLOGIES)}")
        self.pathology = pathology
        self.fixed = fixed
        self.python = python
        self.env = dict(env) if env is not None else None
        self.ready_timeout_s = ready_timeout_s
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[str] | None = None
        self.port: int = 0
        self._stdout_tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._drainers: list[threading.Thread] = []

    @property
    def spec(self) -> PathologySpec:
        return PATHOLOGIES[self.pathology]

    @property
    def label(self) -> str:
        return f"{self.pathology} --fixed" if self.fixed else self.pathology

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("the service is not running")
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stderr_tail(self) -> str:
        return "\n".join(self._stderr_tail)

    def start(self) -> DemoService:
        env = dict(os.environ)
        if self.env is not None:
            env.update(self.env)
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [self.python, "-m", "diagnose.examples.service", "--pathology", self.pathology, "--port", "0"]
        if self.fixed:
            cmd.append("--fixed")
        cmd += self.extra_args
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        ready: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._drainers = [
            threading.Thread(target=_drain, args=(self.proc.stdout, self._stdout_tail, ready), daemon=True),
            threading.Thread(target=_drain, args=(self.proc.stderr, self._stderr_tail, None), daemon=True),
        ]
        for t in self._drainers:
            t.start()
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            try:
                line = ready.get(timeout=0.2)
                break
            except queue.Empty:
                pass
            if self.proc.poll() is not None:
                self._join_drainers()
                rc = self.proc.returncode
                self.stop()
                raise ServiceStartError(
                    f"the demo service ({self.label}) exited with status {rc} before it was ready; "
                    f"stderr tail:\n{self.stderr_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise ServiceStartError(
                    f"the demo service ({self.label}) was not ready after {self.ready_timeout_s:.0f} s; "
                    f"stderr tail:\n{self.stderr_tail()}"
                )
        fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
        self.port = int(fields["port"])
        return self

    def _join_drainers(self, timeout: float = 2.0) -> None:
        for t in self._drainers:
            t.join(timeout)

    def stop(self) -> None:
        """Terminate the service's whole process group; idempotent."""
        proc = self.proc
        if proc is None:
            return
        pgid = proc.pid  # start_new_session: the service leads its own group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            proc.wait(timeout=STOP_GRACE_S)
        # Children that outlived the leader (a compiler, a worker) are still in the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        self._join_drainers()

    def __enter__(self) -> DemoService:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Load:
    """Run :func:`run_load` in a background thread; ``result`` is set when the context exits.

    Leaving the context stops the clients (unless ``stop_on_exit`` is false, in which case it waits
    for ``duration_s`` to finish) and joins the thread.
    """

    def __init__(
        self,
        url: str,
        spec: PathologySpec,
        duration_s: float,
        *,
        concurrency: int | None = None,
        think_s: float | None = None,
        max_requests: int | None = None,
        stop_on_exit: bool = True,
    ) -> None:
        self.url = url
        self.spec = spec
        self.duration_s = duration_s
        self.concurrency = spec.concurrency if concurrency is None else concurrency
        self.think_s = spec.think_s if think_s is None else think_s
        self.max_requests = max_requests
        self.stop_on_exit = stop_on_exit
        self.result: LoadResult | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{spec.name}", daemon=True)

    def _run(self) -> None:
        try:
            self.result = run_load(
                self.url,
                self.spec.name,
                self.concurrency,
                self.duration_s,
                self.think_s,
                max_requests=self.max_requests,
                stop=self._stop,
            )
        except BaseException as exc:
            self.error = exc

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> Load:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def wait(self, timeout: float | None = None) -> LoadResult | None:
        self._thread.join(timeout)
        if self.error is not None:
            raise self.error
        return self.result

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.stop_on_exit:
            self.stop()
        self._thread.join()
        if self.error is not None and exc_type is None:
            raise self.error


# ``with background_load(url, spec, duration_s) as handle: ...`` then ``handle.result``.
background_load = Load
