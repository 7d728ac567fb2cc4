"""Attach to services nobody here wrote: LitServe and FastAPI/uvicorn stacks, as users run them."""

from __future__ import annotations

import base64
import http.client
import io
import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from diagnose.attach import AttachOptions, attach

pytestmark = pytest.mark.integration
HERE = os.path.join(os.path.dirname(__file__), "foreign")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(port: int, path: str, body: dict, timeout: float = 120.0) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


@contextmanager
def service(script: str, ready: Callable[[int], bool],
            env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, script), str(port)], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, **env} if env else None)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{script} exited: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            try:
                if ready(port):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{script} did not become ready")
        yield proc, port
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def load(port: int, path: str, payload: Callable[[int], dict], clients: int, seconds: float) -> Iterator[list[int]]:
    stop = threading.Event()
    done: list[int] = []
    counter = itertools.count()
    end = time.monotonic() + seconds

    def client() -> None:
        while not stop.is_set() and time.monotonic() < end:
            try:
                done.append(_post(port, path, payload(next(counter))))
            except OSError:
                time.sleep(0.1)

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    try:
        yield done
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=130)


def _jpeg() -> str:
    from PIL import Image

    img = Image.effect_noise((1024, 768), 64).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return base64.b64encode(buf.getvalue()).decode()


def _wait_for(done: list[int], n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while len(done) < n and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(done) >= n, "the service served nothing"


def test_litserve_image_decoding_is_cpu_preprocessing(tmp_path) -> None:
    image = _jpeg()
    with service("litserve_image.py", lambda p: _post(p, "/predict", {"image": image}, 30) == 200) as (proc, port):
        with load(port, "/predict", lambda i: {"image": image}, clients=3, seconds=60) as done:
            _wait_for(done, 3, 30)
            _, diagnosis = attach(AttachOptions(pid=proc.pid, duration_s=6, output=str(tmp_path / "s")))
    assert diagnosis.primary is not None and diagnosis.primary.value == "cpu_preprocessing", diagnosis.findings
    assert diagnosis.target is not None and diagnosis.target.children  # LitServe's worker processes


def test_fastapi_single_worker_under_heavy_concurrency_is_queueing(tmp_path) -> None:
    with service("fastapi_single_worker.py", lambda p: _post(p, "/predict", {}, 10) == 200) as (proc, port):
        with load(port, "/predict", lambda i: {}, clients=24, seconds=60) as done:
            _wait_for(done, 10, 30)
            _, diagnosis = attach(AttachOptions(pid=proc.pid, duration_s=6, output=str(tmp_path / "s")))
    assert diagnosis.primary is not None and diagnosis.primary.value == "queueing", diagnosis.findings


def test_fastapi_compiled_model_with_changing_shapes_is_recompilation(tmp_path) -> None:
    """Each new batch size recompiles (limit raised, no warning); inductor's C++ build runs in g++/cc1plus
    children while the request thread waits: the wall-clock view and the children's CPU say so."""
    sizes = itertools.count(1)

    def payload(i: int) -> dict:
        return {"rows": [[0.5] * 64] * next(sizes)}

    # a cache of its own, as a fresh pod has: inductor's cache (shared by every run on this machine) would
    # hold the kernels of an earlier run's batch sizes, and no compiler would run in the window
    with service("fastapi_compiled_varying_shapes.py",
                 lambda p: socket.create_connection(("127.0.0.1", p), 1).close() is None,
                 env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor-cache")}) as (proc, port):
        with load(port, "/embed", payload, clients=2, seconds=120) as done:
            _wait_for(done, 1, 90)
            _, diagnosis = attach(AttachOptions(pid=proc.pid, duration_s=8, output=str(tmp_path / "s")))
    printed = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    assert "recompile_limit" not in printed, printed[-2000:]  # the user raised it: no warning gives it away
    assert diagnosis.primary is not None and diagnosis.primary.value == "recompilation", diagnosis.findings
    ev = {e.key: e.value for e in diagnosis.evidence}
    assert ev["compile.children_seen"] > 0 and ev["compile.children_cpu_s"] > 0  # cc1plus/g++/ld were seen
    assert ev["wall.compile_share"] > 0.5
    f = diagnosis.findings[0]
    assert f.code == "CMP001" and "compiler processes under the service" in f.message


def test_fastapi_model_behind_a_lock_held_by_a_background_thread_is_queueing(tmp_path) -> None:
    """Requests wait for a lock a refresher holds while it fetches: invisible on CPU, named by the wall clock."""
    with service("fastapi_lock_background_refresh.py",
                 lambda p: _post(p, "/embed", {"rows": [[0.5] * 64]}, 10) == 200) as (proc, port):
        with load(port, "/embed", lambda i: {"rows": [[0.5] * 64] * (i % 8 + 1)}, clients=2, seconds=60) as done:
            _wait_for(done, 2, 30)
            _, diagnosis = attach(AttachOptions(pid=proc.pid, duration_s=5, output=str(tmp_path / "s")))
    assert diagnosis.primary is not None and diagnosis.primary.value == "queueing", diagnosis.findings
    f = diagnosis.findings[0]
    assert f.code == "QUE010", diagnosis.findings
    assert "with MODEL_LOCK:" in f.message and "weights-refresher" in f.message


def test_worker_processes_with_full_width_thread_pools_are_oversubscribed(tmp_path) -> None:
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "oversubscribed_workers.py")],
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        import psutil

        while len(psutil.Process(proc.pid).children()) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)
        _, diagnosis = attach(AttachOptions(pid=proc.pid, duration_s=5, output=str(tmp_path / "s")))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert diagnosis.primary is not None and diagnosis.primary.value == "thread_oversubscription", \
        diagnosis.findings
    f = diagnosis.findings[0]
    assert f.code == "THR001" and "threads are busy on" in f.message
