"""In-process probe: per-request stage timings, CUDA allocator state, compile events, OOM state.

Imported by the *service* (not by ``diagnose``): it needs only the standard library, and uses torch
when, and only when, the service has already imported it. Two lines::

    from diagnose.collectors import torch_probe
    probe = torch_probe.install("/var/log/svc/stages.jsonl")

or, with no code change, ``DIAGNOSE_PROBE=/var/log/svc/stages.jsonl`` in the environment of a
process that imports this module (``install`` then returns the probe the import made).

Per request::

    with probe.request(input_tokens=512) as req:
        with probe.stage("preprocess"):
            ...
        req.set(output_tokens=128, ttft_ms=57.4)

Output: one JSONL file (the stage-timing log of DESIGN.md plus ``probe``, ``cuda_memory``,
``compile`` and ``oom`` lines that the timing parser ignores) and, with ``compile_events=True``,
``<path>.compile.log``: recompile and recompile-limit messages in the ``TORCH_LOGS=recompiles``
glog text format that ``diagnose.collectors.compile_log`` reads. All writing happens on one daemon thread fed
by a bounded queue; the request path never touches a file and never waits (a full queue drops the
record and counts it). The probe announces itself in ``diagnose-probe-<pid>.json`` (see
``announcement_path``) so ``diagnose attach --pid PID`` can find the files.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import inspect
import itertools
import json
import logging
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

VERSION = "1"
ENV_VAR = "DIAGNOSE_PROBE"
ANNOUNCE_PREFIX = "diagnose-probe-"
COMPILE_LOG_SUFFIX = ".compile.log"

CUDA_STAT_KEYS = (
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
)

_log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])

_request_cv: contextvars.ContextVar[Request | None] = contextvars.ContextVar("diagnose_probe_request", default=None)
_stage_cv: contextvars.ContextVar[_Stage | None] = contextvars.ContextVar("diagnose_probe_stage", default=None)

_perf = time.perf_counter
_now = time.time


# ---------------------------------------------------------------------------------------------
# request context
# ---------------------------------------------------------------------------------------------


class Request:
    """One request in flight: its stage times (ms) and fields. Use ``set`` to add fields."""

    __slots__ = ("fields", "request_id", "stages_ms", "status", "t0", "t1", "ts")

    def __init__(self, request_id: str, fields: dict[str, Any]) -> None:
        self.request_id = request_id
        self.status = "ok"
        self.stages_ms: dict[str, float] = {}
        self.fields = fields
        self.t0 = _perf()
        self.t1 = 0.0
        self.ts = 0.0

    def set(self, **fields: Any) -> None:
        """``input_tokens``, ``output_tokens``, ``ttft_ms``, ``batch_size``, ``status``, or any field."""
        status = fields.pop("status", None)
        if status is not None:
            self.status = str(status)
        self.fields.update(fields)

    def add_stage(self, name: str, ms: float) -> None:
        self.stages_ms[name] = self.stages_ms.get(name, 0.0) + ms

    def record(self) -> dict[str, Any]:
        """The JSONL record (built on the writer thread, not on the request path)."""
        fields = self.fields
        rec: dict[str, Any] = {"ts": round(self.ts, 4), "request_id": self.request_id, "status": self.status,
                               "stages_ms": {k: round(v, 3) for k, v in self.stages_ms.items()}}
        if "e2e_ms" not in fields:
            rec["e2e_ms"] = round((self.t1 - self.t0) * 1e3, 3)
        rec.update(fields)
        return rec


class _RequestScope:
    __slots__ = ("_probe", "_req", "_token")

    def __init__(self, probe: Probe, req: Request) -> None:
        self._probe = probe
        self._req = req

    def __enter__(self) -> Request:
        self._token = _request_cv.set(self._req)
        return self._req

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        req = self._req
        req.t1 = _perf()
        req.ts = _now()
        _request_cv.reset(self._token)
        if exc_type is not None:
            req.status = "error"
            req.fields.setdefault("error", exc_type.__name__)
        self._probe._put(req)  # the writer thread turns it into JSON


class _Stage:
    """Times one stage of the current request. Nested stages are exclusive: an outer stage's time
    excludes the time of the stages inside it, so ``stages_ms`` sums to at most ``e2e_ms``."""

    __slots__ = ("_child", "_req", "_t0", "_token", "name")

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> _Stage:
        self._req = _request_cv.get()
        if self._req is not None:
            self._child = 0.0
            self._token = _stage_cv.set(self)
            self._t0 = _perf()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        req = self._req
        if req is None:
            return
        elapsed = _perf() - self._t0
        _stage_cv.reset(self._token)
        parent = _stage_cv.get()
        if parent is not None and parent._req is req:
            parent._child += elapsed
        ms = (elapsed - self._child) * 1e3
        stages = req.stages_ms
        stages[self.name] = stages.get(self.name, 0.0) + ms
        self._req = None


def current_request() -> Request | None:
    """The request of the calling thread/task, if any."""
    return _request_cv.get()


# ---------------------------------------------------------------------------------------------
# announcement (pure, stdlib: also used by `diagnose attach`)
# ---------------------------------------------------------------------------------------------


def _announce_dir() -> str:
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg) and os.access(xdg, os.W_OK):
        return xdg
    return tempfile.gettempdir()


def announcement_path(pid: int | None = None) -> str:
    """Where the process ``pid`` (default: this one) writes its announcement."""
    return os.path.join(_announce_dir(), f"{ANNOUNCE_PREFIX}{pid if pid is not None else os.getpid()}.json")


def _candidates(pid: int) -> list[str]:
    name = f"{ANNOUNCE_PREFIX}{pid}.json"
    dirs = [_announce_dir(), "/tmp", tempfile.gettempdir()]
    try:  # the target's own XDG_RUNTIME_DIR / TMPDIR (readable by the same user or root)
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
        for key in (b"XDG_RUNTIME_DIR", b"TMPDIR"):
            if key in env:
                dirs.insert(0, env[key].decode(errors="replace"))
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dirs.append(f"/run/user/{os.stat(f'/proc/{pid}').st_uid}")
    out: list[str] = []
    for d in dirs:
        for p in (os.path.join(d, name), f"/proc/{pid}/root{d}/{name}"):  # the latter: another mount ns
            if p not in out:
                out.append(p)
    return out


def find_announcement(pid: int) -> dict[str, Any] | None:
    """The announcement of the probe in process ``pid``, or None. Adds ``announcement`` (its path)."""
    for path in _candidates(pid):
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("pid") == pid:
            doc["announcement"] = path
            return doc
    return None


# ---------------------------------------------------------------------------------------------
# torch (optional, never imported here)
# ---------------------------------------------------------------------------------------------


def _torch() -> Any:
    """torch if the service imported it, else None (the probe never imports torch itself)."""
    return sys.modules.get("torch")


def _cuda_ready(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available()) and bool(torch.cuda.is_initialized())
    except Exception:
        return False


def cuda_memory_state(weights: dict[str, int] | None = None) -> dict[str, Any] | None:
    """Allocator state per device, or None when CUDA is absent (or torch is not imported)."""
    torch = _torch()
    if torch is None or not _cuda_ready(torch):
        return None
    devices: dict[str, Any] = {}
    try:
        for i in range(torch.cuda.device_count()):
            stats = torch.cuda.memory_stats(i)
            dev = {k: stats.get(k) for k in CUDA_STAT_KEYS}
            with contextlib.suppress(Exception):
                free, total = torch.cuda.mem_get_info(i)
                dev["free_bytes"], dev["total_bytes"] = int(free), int(total)
            dev["weights_bytes"] = (weights or {}).get(f"cuda:{i}", 0)
            devices[str(i)] = dev
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF") or ""
    out: dict[str, Any] = {"devices": devices, "alloc_conf": conf, "expandable_segments": "expandable_segments:true"
                           in conf.replace(" ", "").lower()}
    with contextlib.suppress(Exception):
        out["expandable_segments"] = bool(torch._C._accelerator_getAllocatorSettings().get("expandable_segments"))
    return out


def _is_oom(exc: BaseException) -> bool:
    torch = _torch()
    if torch is None:
        return False
    types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None),
                              getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)) if isinstance(t, type))
    return bool(types) and isinstance(exc, types)


class _CompileLogHandler(logging.Handler):
    """Recompile / recompile-limit log records → the probe's queue (text lines + counts)."""

    def __init__(self, probe: Probe, recompiles: bool) -> None:
        super().__init__(logging.DEBUG if recompiles else logging.WARNING)
        self.probe = probe
        self.recompiles = recompiles  # attached to the recompiles artifact logger, else to torch._dynamo

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            recompile = record.name.endswith("__recompiles")
            if recompile != self.recompiles or (not recompile and "limit" not in msg):
                return  # a recompile record propagated to torch._dynamo, or an unrelated warning
            p = self.probe
            with p._lock:
                if recompile:
                    p._recompiles += 1
                    p._recent_reasons.append(msg.split("\n", 3)[:3])
                    del p._recent_reasons[:-8]
                else:
                    p._limit_hits += 1
            t = time.localtime(record.created)
            frac = f"{record.created % 1:.6f}"[1:]
            where = record.pathname[record.pathname.rfind("torch/"):] if "torch/" in record.pathname else \
                "torch/_dynamo/" + os.path.basename(record.pathname)
            trace = getattr(record, "traceid", "") or ""
            artifact = " [__recompiles]" if recompile else ""
            level = "V" if record.levelno < logging.INFO else record.levelname[0]
            prefix = f"{level}{time.strftime('%m%d %H:%M:%S', t)}{frac} {record.process} " \
                     f"{where}:{record.lineno}]{(' ' + trace.strip()) if trace.strip() else ''}{artifact} "
            text = "".join(prefix + line + "\n" for line in msg.split("\n"))
            p._put(("compile_text", text))
        except Exception:
            self.handleError(record)


# ---------------------------------------------------------------------------------------------
# the probe
# ---------------------------------------------------------------------------------------------


class Probe:
    """Returned by ``install``; see the module docstring."""

    def __init__(self, path: str | None, *, service: str | None = None, cuda_interval_s: float = 5.0,
                 queue_size: int = 10000, compile_events: bool = False, memory_history: bool = False,
                 stats_interval_s: float = 60.0, flush_interval_s: float = 0.05, announce: bool = True) -> None:
        self.path = os.path.abspath(path) if path else None
        self.compile_log_path = self.path + COMPILE_LOG_SUFFIX if self.path else None
        self.service = service
        self.cuda_interval_s = cuda_interval_s
        self.stats_interval_s = stats_interval_s
        self.flush_interval_s = flush_interval_s
        self.started = _now()
        self._q: queue.Queue[Any] = queue.Queue(maxsize=max(1, queue_size))
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._dropped = 0
        self._written = 0
        self._requests = 0
        self._recompiles = 0
        self._limit_hits = 0
        self._recent_reasons: list[list[str]] = []
        self._ooms = 0
        self._weights: list[Any] = []  # models registered with watch_model
        self._compile_prev: dict[str, int] = {}
        self._oom_observer = False
        self._handlers: list[tuple[logging.Logger, logging.Handler]] = []
        self._memory_history = memory_history
        self._closed = False
        self._wake = threading.Event()
        self._announce_path: str | None = None
        self._fh: Any = None
        self._compile_fh: Any = None
        if compile_events:
            self._enable_compile_events()
        if memory_history:
            self._start_memory_history()
        self._thread = threading.Thread(target=self._run, name="diagnose-probe-writer", daemon=True)
        self._thread.start()
        if announce and self.path:
            self._announce()

    # -- request path --------------------------------------------------------------------

    def request(self, request_id: str | None = None, **fields: Any) -> _RequestScope:
        """Context manager: one request. Its record is queued on exit (status "error" on exception)."""
        rid = request_id if request_id is not None else f"r-{next(self._ids)}"
        return _RequestScope(self, Request(rid, fields))

    def stage(self, name: str) -> _Stage:
        """Context manager timing one stage of the current request (a no-op outside a request)."""
        return _Stage(name)

    def timed(self, name: str) -> Callable[[F], F]:
        """Decorator: time a sync or async function as stage ``name``."""

        def deco(fn: F) -> F:
            if inspect.iscoroutinefunction(fn):
                @functools.wraps(fn)
                async def awrapper(*args: Any, **kwargs: Any) -> Any:
                    with _Stage(name):
                        return await fn(*args, **kwargs)
                return awrapper  # type: ignore[return-value]

            @functools.wraps(fn)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                with _Stage(name):
                    return fn(*args, **kwargs)
            return wrapper  # type: ignore[return-value]

        return deco

    @staticmethod
    def wrap(fn: F) -> F:
        """``fn`` bound to the caller's context (request and stage), for another thread or an executor:
        ``pool.submit(probe.wrap(work), x)``. (``asyncio.to_thread`` copies the context by itself.)"""
        ctx = contextvars.copy_context()

        @functools.wraps(fn)
        def bound(*args: Any, **kwargs: Any) -> Any:
            return ctx.run(fn, *args, **kwargs)
        return bound  # type: ignore[return-value]

    def emit(self, stages_ms: dict[str, float], *, status: str = "ok", request_id: str | None = None,
             **fields: Any) -> None:
        """Queue one request record whose stages the service timed itself."""
        record: dict[str, Any] = {
            "ts": round(_now(), 4),
            "request_id": request_id if request_id is not None else f"r-{next(self._ids)}",
            "status": status,
            "stages_ms": {k: round(v, 3) for k, v in stages_ms.items()},
        }
        record.update(fields)
        self._put(record)

    def _put(self, item: Any) -> None:
        if self._closed:
            return
        try:
            self._q.put_nowait(item)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    # -- torch hooks ---------------------------------------------------------------------

    def watch_model(self, model: Any) -> Any:
        """Count ``model``'s parameters and buffers as weights (per device) in ``cuda_memory`` lines."""
        self._weights.append(model)
        return model

    def weights_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for model in list(self._weights):
            try:
                tensors = itertools.chain(model.parameters(), model.buffers())
                for t in tensors:
                    dev = str(t.device)
                    out[dev] = out.get(dev, 0) + t.numel() * t.element_size()
            except Exception:
                continue
        return out

    @contextlib.contextmanager
    def oom_guard(self) -> Iterator[None]:
        """Record allocator state on ``torch.OutOfMemoryError``, then re-raise it."""
        try:
            yield
        except BaseException as exc:
            if _is_oom(exc):
                self.record_oom(message=str(exc)[:2000])
            raise

    def record_oom(self, **info: Any) -> None:
        """Write allocator state (and a snapshot when memory history is recorded) now, synchronously."""
        with self._lock:
            self._ooms += 1
            n = self._ooms
        doc: dict[str, Any] = dict(info)
        doc["cuda_memory"] = cuda_memory_state(self.weights_bytes())
        snap = self._dump_snapshot(n)
        if snap:
            doc["snapshot"] = snap
        with contextlib.suppress(queue.Full):
            self._q.put({"ts": round(_now(), 4), "oom": doc}, timeout=1.0)
        self.flush(timeout=2.0)

    def _dump_snapshot(self, n: int) -> str | None:
        torch = _torch()
        if torch is None or not self.path or not _cuda_ready(torch):
            return None
        try:
            mem = torch.cuda.memory
            if not self._memory_history and not any(mem._snapshot().get("device_traces") or []):
                return None
            path = f"{self.path}.oom-{os.getpid()}-{n}.pickle"
            mem._dump_snapshot(path)
            return path
        except Exception as exc:
            _log.debug("snapshot failed: %s", exc)
            return None

    def _start_memory_history(self) -> None:
        torch = _torch()
        if torch is not None and _cuda_ready(torch):
            with contextlib.suppress(Exception):
                torch.cuda.memory._record_memory_history(max_entries=100_000)

    def _attach_oom_observer(self) -> None:
        torch = _torch()
        if self._oom_observer or torch is None or not _cuda_ready(torch):
            return
        attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return

        def observer(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
            with contextlib.suppress(Exception):
                self.record_oom(device=device, alloc_bytes=alloc, device_allocated_bytes=device_allocated,
                                device_free_bytes=device_free)

        try:
            attach(observer)
            self._oom_observer = True
        except Exception as exc:
            _log.debug("OOM observer not attached: %s", exc)

    def _enable_compile_events(self) -> None:
        torch = _torch()
        if torch is None:
            return
        try:
            torch._logging.set_logs(recompiles=True)
        except Exception as exc:
            _log.debug("set_logs(recompiles=True) failed: %s", exc)
        for name, recompiles in (("torch._dynamo.guards.__recompiles", True), ("torch._dynamo", False)):
            lg, handler = logging.getLogger(name), _CompileLogHandler(self, recompiles)
            lg.addHandler(handler)
            self._handlers.append((lg, handler))

    def compile_state(self) -> dict[str, Any] | None:
        """torch.compile counters (totals and deltas since the last call), compile time, recompiles."""
        dynamo = sys.modules.get("torch._dynamo.utils")
        if dynamo is None:
            return None
        totals: dict[str, int] = {}
        limit_hits = 0
        try:
            for group, counter in list(dynamo.counters.items()):
                for key, value in list(counter.items()):
                    if group == "unimplemented":
                        if "recompile limit" in str(key).lower() or "cache_size_limit" in str(key):
                            limit_hits += int(value)
                        continue
                    if group in ("frames", "stats", "recompiles", "graph_break", "inductor") and \
                            isinstance(value, int):
                        totals[f"{group}.{key}"[:120]] = value
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"}
        delta = {k: v - self._compile_prev.get(k, 0) for k, v in totals.items() if v != self._compile_prev.get(k, 0)}
        self._compile_prev = totals
        with self._lock:
            recompiles, limit_logged, recent = self._recompiles, self._limit_hits, list(self._recent_reasons)
        out: dict[str, Any] = {"counters": totals, "delta": delta, "compiles": totals.get("stats.unique_graphs", 0),
                               "recompiles": recompiles, "recompile_limit_hits": max(limit_hits, limit_logged)}
        if recent:
            out["recent_reasons"] = [" | ".join(s.strip() for s in r) for r in recent]
        with contextlib.suppress(Exception):
            heads, values = dynamo.compile_times(repr="csv")
            secs = {h: round(sum(float(x) for x in v.split(",") if x.strip()), 4)
                    for h, v in zip(heads, values, strict=False)}
            out["compile_s"] = secs.get("_compile.compile_inner", max(secs.values(), default=0.0))
            out["compile_s_by_phase"] = secs
        return out

    # -- writer thread -------------------------------------------------------------------

    def _open(self) -> None:
        if self.path and self._fh is None:
            d = os.path.dirname(self.path)
            if d:
                os.makedirs(d, exist_ok=True)
            self._fh = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def _write_record(self, item: Any) -> None:
        if isinstance(item, Request):
            item = item.record()
        elif isinstance(item, tuple):  # ("compile_text", text)
            if self.compile_log_path:
                if self._compile_fh is None:
                    self._compile_fh = open(self.compile_log_path, "a", encoding="utf-8")  # noqa: SIM115
                self._compile_fh.write(item[1])
            return
        if self._fh is not None:
            self._fh.write(json.dumps(item, separators=(", ", ": "), default=str) + "\n")
        with self._lock:
            self._written += 1
            if "stages_ms" in item:
                self._requests += 1

    def _drain(self) -> None:
        events: list[threading.Event] = []
        q = self._q
        while True:
            with q.mutex:  # take everything queued at once: one lock round, not one per record
                items = list(q.queue)
                q.queue.clear()
                q.not_full.notify_all()
            if not items:
                break
            self._write_items(items, events)
        for fh in (self._fh, self._compile_fh):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.flush()
        for ev in events:
            ev.set()

    def _write_items(self, items: list[Any], events: list[threading.Event]) -> None:
        for i, item in enumerate(items):
            if i & 3 == 3:
                # let a request thread that is waiting for the GIL (back from a torch op) have it now
                # rather than after the 5 ms switch interval: the writer never holds it for long
                time.sleep(0)
            if isinstance(item, threading.Event):
                events.append(item)
                continue
            try:
                self._write_record(item)
            except Exception as exc:  # a bad record must not kill the writer
                _log.debug("probe write failed: %s", exc)

    def _periodic(self, now: float, due: dict[str, float], final: bool = False) -> None:
        if final or now >= due["cuda"]:
            due["cuda"] = now + self.cuda_interval_s
            self._attach_oom_observer()
            state = cuda_memory_state(self.weights_bytes())
            if state is not None:  # written directly: this is the writer thread
                self._write_record({"ts": round(_now(), 4), "cuda_memory": state})
            comp = self.compile_state()
            if comp is not None and (comp.get("delta") or final):
                self._write_record({"ts": round(_now(), 4), "compile": comp})
        with self._lock:
            dropped, changed = self._dropped, self._dropped != due.get("dropped_reported", 0)
        if changed or now >= due["stats"] or (final and dropped):
            due["stats"] = now + self.stats_interval_s
            due["dropped_reported"] = dropped
            if changed or self._written or final:
                self._write_record({"ts": round(_now(), 4), "probe": self.stats()})

    def _run(self) -> None:
        try:
            self._open()
        except OSError as exc:
            _log.warning("diagnose probe: cannot open %s: %s", self.path, exc)
        now = _perf()
        due = {"cuda": now + min(1.0, self.cuda_interval_s), "stats": now + self.stats_interval_s}
        while not self._closed:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            try:
                self._periodic(_perf(), due)
            except Exception as exc:
                _log.debug("probe periodic failed: %s", exc)
            self._drain()
        with contextlib.suppress(Exception):
            self._periodic(_perf(), due, final=True)
        self._drain()
        for fh in (self._fh, self._compile_fh):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()

    # -- control -------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {"dropped": self._dropped, "written": self._written, "requests": self._requests,
                    "queued": self._q.qsize(), "queue_size": self._q.maxsize, "recompiles": self._recompiles,
                    "oom_records": self._ooms, "pid": os.getpid(), "version": VERSION,
                    **({"service": self.service} if self.service else {})}

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is written (True) or ``timeout`` passes (False)."""
        if self._closed or not self._thread.is_alive():
            return False
        ev = threading.Event()
        try:
            self._q.put(ev, timeout=timeout)
        except queue.Full:
            return False
        self._wake.set()
        return ev.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Write what is queued, stop the writer, remove the announcement. Idempotent."""
        global _PROBE
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        for lg, h in self._handlers:
            lg.removeHandler(h)
        self._handlers.clear()
        if self._announce_path:
            with contextlib.suppress(OSError):
                os.unlink(self._announce_path)
            self._announce_path = None
        with _INSTALL_LOCK:
            if _PROBE is self:
                _PROBE = None

    def _announce(self) -> None:
        path = announcement_path()
        doc = {"pid": os.getpid(), "stages_path": self.path, "compile_log_path": self.compile_log_path,
               "started": self.started, "version": VERSION, "service": self.service}
        try:
            tmp = f"{path}.{threading.get_ident()}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(doc, fh)
            os.replace(tmp, path)
            self._announce_path = path
        except OSError as exc:
            _log.warning("diagnose probe: cannot announce at %s: %s", path, exc)


# ---------------------------------------------------------------------------------------------
# install
# ---------------------------------------------------------------------------------------------

_PROBE: Probe | None = None
_INSTALL_LOCK = threading.Lock()


def install(path: str | None = None, *, service: str | None = None, cuda_interval_s: float = 5.0,
            queue_size: int = 10000, compile_events: bool = False, memory_history: bool = False,
            stats_interval_s: float = 60.0) -> Probe:
    """Start the probe (once per process: later calls return the running probe, whatever they pass).

    ``path`` defaults to ``$DIAGNOSE_PROBE``; with neither, records are timed and counted but not
    written. ``compile_events`` turns on torch's ``recompiles`` log artifact and copies it to
    ``<path>.compile.log``; ``memory_history`` starts CUDA memory-history recording so an OOM also
    dumps a snapshot next to ``path``.
    """
    global _PROBE
    with _INSTALL_LOCK:
        if _PROBE is not None:
            return _PROBE
        probe = Probe(path or os.environ.get(ENV_VAR) or None, service=service, cuda_interval_s=cuda_interval_s,
                      queue_size=queue_size, compile_events=compile_events, memory_history=memory_history,
                      stats_interval_s=stats_interval_s)
        _PROBE = probe
    atexit.register(probe.close)
    return probe


def get() -> Probe | None:
    """The installed probe, if any."""
    return _PROBE


if os.environ.get(ENV_VAR):
    try:
        install()
    except Exception as _exc:  # never break the service's import
        _log.warning("diagnose probe: %s=%s not installed: %s", ENV_VAR, os.environ.get(ENV_VAR), _exc)
