"""A closed-loop HTTP load client on asyncio (standard library only) for ``diagnose sweep``.

``concurrency`` workers each hold one keep-alive connection and send the next request as soon as
the previous answer is read; one event-loop thread drives them all, so the client's own cost is
small and measurable (``StepResult.client_cpu_s``: the process CPU time the step used; a value near
the step's duration means the client filled a core and may be what limits throughput).

HTTP/1.1 is spoken directly on ``asyncio`` streams: ``Content-Length``, chunked and
read-until-close bodies; ``https`` through ``ssl``. A streamed answer is timed as it arrives:
server-sent events (``text/event-stream``, OpenAI's ``data: {...}`` … ``data: [DONE]``) and JSON
lines (``application/x-ndjson``) give each request its time to first token, inter-token gaps and
token count (an event with non-empty ``choices[0].text``/``delta.content``, or a line with a
``token``, counts one; a final ``usage.completion_tokens`` wins when present).

Bounded: every step stops at its deadline and after ``max_requests`` (or earlier, once a caller's
``stop`` event is set: no new request starts, the window ends there); a request that does not finish
within ``timeout_s`` is an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_REQUESTS_PER_STEP = 1_000_000


class TargetError(Exception):
    """The endpoint cannot be used at all (bad URL, nothing listening, TLS failure)."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # with the query string

    @staticmethod
    def parse(url: str) -> Target:
        parts = urllib.parse.urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise TargetError(f"{url!r} is not an http(s) URL")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise TargetError(f"{url!r} has an invalid port") from exc
        if parts.username or parts.password:
            raise TargetError("the URL carries credentials (user:password@); pass an Authorization header instead")
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return Target(parts.scheme, parts.hostname, port, path)

    @property
    def shown(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = self.host if self.port == default else f"{self.host}:{self.port}"
        return f"{self.scheme}://{host}{self.path.split('?', 1)[0]}"


@dataclass(frozen=True)
class RequestSpec:
    target: Target
    method: str = "GET"
    headers: tuple[tuple[str, str], ...] = ()
    body: Callable[[int], bytes] | None = None  # request number → body (a varied prompt per request)
    timeout_s: float = 60.0
    insecure: bool = False


@dataclass
class Sample:
    start: float  # monotonic
    end: float
    ok: bool
    status: int = 0
    error: str = ""
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0

    @property
    def latency_s(self) -> float:
        return self.end - self.start


@dataclass
class StepResult:
    concurrency: int
    samples: list[Sample]  # requests started inside the measured window
    window_s: float
    completed_in_window: int  # answered OK inside the window: the throughput numerator
    client_cpu_s: float  # this process's CPU time over the whole step (warm-up included)
    elapsed_s: float  # the whole step's wall time
    status_codes: dict[str, int]

    @property
    def client_cpu_cores(self) -> float:
        return self.client_cpu_s / self.elapsed_s if self.elapsed_s > 0 else 0.0


class _Conn:
    def __init__(self, spec: RequestSpec, ctx: ssl.SSLContext | None) -> None:
        self.spec = spec
        self.ctx = ctx
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        t = self.spec.target
        self.reader, self.writer = await asyncio.open_connection(t.host, t.port, ssl=self.ctx,
                                                                 server_hostname=t.host if self.ctx else None)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.writer.wait_closed(), 1.0)
        self.reader = self.writer = None


def _request_bytes(spec: RequestSpec, body: bytes | None) -> bytes:
    t = spec.target
    lines = [f"{spec.method} {t.path} HTTP/1.1", f"Host: {t.host}" + ("" if t.port in (80, 443) else f":{t.port}"),
             "User-Agent: diagnose-sweep/0.1", "Accept: */*", "Connection: keep-alive"]
    names = {k.lower() for k, _ in spec.headers}
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
        if "content-type" not in names:
            lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in spec.headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


class _Stream:
    """Times the events of a streamed body (SSE or JSON lines) as its bytes arrive."""

    def __init__(self, kind: str, t0: float) -> None:
        self.kind = kind
        self.t0 = t0
        self.buf = b""
        self.first: float | None = None
        self.last: float | None = None
        self.gaps: list[float] = []
        self.tokens = 0
        self.usage_tokens: int | None = None
        self.error = ""

    def feed(self, data: bytes, now: float) -> None:
        self.buf += data
        sep = b"\n\n" if self.kind == "sse" else b"\n"
        while sep in self.buf:
            event, self.buf = self.buf.split(sep, 1)
            self._event(event.strip(), now)

    def _event(self, event: bytes, now: float) -> None:
        if not event:
            return
        payload = event
        if self.kind == "sse":
            data = [ln[5:].strip() for ln in event.split(b"\n") if ln.startswith(b"data:")]
            if not data:
                return
            payload = b"\n".join(data)
            if payload == b"[DONE]":
                return
        try:
            doc = json.loads(payload)
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        if "error" in doc:
            self.error = str(doc["error"])[:200]
            return
        usage = doc.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        if self._has_token(doc):
            if self.first is None:
                self.first = now
            elif self.last is not None:
                self.gaps.append(now - self.last)
            self.last = now
            self.tokens += 1

    @staticmethod
    def _has_token(doc: Mapping[str, object]) -> bool:
        if "token" in doc:
            return True
        choices = doc.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            c = choices[0]
            delta = c.get("delta")
            text = c.get("text")
            if isinstance(delta, dict):
                text = delta.get("content") or delta.get("reasoning_content")
            return isinstance(text, str) and text != ""
        return False


async def _read_headers(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    if len(raw) > MAX_HEADER_BYTES:
        raise ValueError("response headers too large")
    head = raw.decode("latin-1").split("\r\n")
    parts = head[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ValueError(f"not an HTTP response: {head[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in head[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _read_body(reader: asyncio.StreamReader, headers: Mapping[str, str], stream: _Stream | None) -> bool:
    """Read the body (feeding ``stream``); True when the connection can be reused."""
    total = 0

    def take(data: bytes) -> None:
        nonlocal total
        total += len(data)
        if total > MAX_BODY_BYTES:
            raise ValueError("response body too large")
        if stream is not None:
            stream.feed(data, time.monotonic())

    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass
                break
            take(await reader.readexactly(size))
            await reader.readexactly(2)
    elif "content-length" in headers:
        n = int(headers["content-length"])
        while n > 0:
            data = await reader.read(min(n, 65536))
            if not data:
                raise ConnectionError("the connection closed mid-body")
            n -= len(data)
            take(data)
    else:
        while data := await reader.read(65536):
            take(data)
        return False
    return headers.get("connection", "").lower() != "close"


async def _one(conn: _Conn, spec: RequestSpec, n: int) -> Sample:
    t0 = time.monotonic()
    body = spec.body(n) if spec.body is not None else None
    try:
        status, headers = await _send(conn, spec, body)
        assert conn.reader is not None
        ctype = headers.get("content-type", "").lower()
        kind = "sse" if "text/event-stream" in ctype else "lines" if "ndjson" in ctype or "jsonl" in ctype else ""
        stream = _Stream(kind, t0) if kind else None
        reuse = await _read_body(conn.reader, headers, stream)
        end = time.monotonic()
        if not reuse:
            await conn.close()
        ok = 200 <= status < 300 and not (stream is not None and stream.error)
        why = "" if ok else (stream.error if stream is not None and stream.error else f"HTTP {status}")
        sample = Sample(t0, end, ok, status, why)
        if stream is not None and stream.first is not None:
            sample.ttft_s = stream.first - t0
            sample.gaps_s = stream.gaps
            sample.tokens = stream.usage_tokens if stream.usage_tokens is not None else stream.tokens
        return sample
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError) as exc:
        await conn.close()
        return Sample(t0, time.monotonic(), False, 0, f"{type(exc).__name__}: {str(exc)[:120]}")


async def _send(conn: _Conn, spec: RequestSpec, body: bytes | None) -> tuple[int, dict[str, str]]:
    """Send the request and read the answer's headers. A kept-alive connection the server closed after its
    last answer (llama-server says ``Keep-Alive`` on a stream, then closes it) fails before any byte of an
    answer: that request never reached the server, so it goes once more on a fresh connection."""
    reused = conn.writer is not None
    for attempt in range(2):
        if conn.writer is None:
            await conn.open()
        assert conn.reader is not None and conn.writer is not None
        try:
            conn.writer.write(_request_bytes(spec, body))
            await conn.writer.drain()
            return await _read_headers(conn.reader)
        except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError) as exc:
            nothing = not isinstance(exc, asyncio.IncompleteReadError) or not exc.partial
            if not (reused and nothing and attempt == 0):
                raise
            await conn.close()
    raise AssertionError("unreachable")


def _ssl_context(spec: RequestSpec) -> ssl.SSLContext | None:
    if spec.target.scheme != "https":
        return None
    ctx = ssl.create_default_context()
    if spec.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


async def _step(spec: RequestSpec, concurrency: int, warmup_s: float, duration_s: float,
                max_requests: int, stop: threading.Event | None = None) -> StepResult:
    ctx = _ssl_context(spec)
    loop_start = time.monotonic()
    measure_from = loop_start + warmup_s
    measure_to = measure_from + duration_s
    samples: list[Sample] = []
    counter = 0
    stopped: float | None = None  # when the caller's stop was seen
    cpu0 = time.process_time()

    async def worker() -> None:
        nonlocal counter
        conn = _Conn(spec, ctx)
        try:
            while time.monotonic() < measure_to and counter < max_requests and stopped is None:
                counter += 1
                try:
                    s = await asyncio.wait_for(_one(conn, spec, counter), spec.timeout_s)
                except TimeoutError:
                    await conn.close()
                    now = time.monotonic()
                    s = Sample(now - spec.timeout_s, now, False, 0, f"no answer within {spec.timeout_s:g} s")
                samples.append(s)
                if not s.ok and s.status == 0:
                    await asyncio.sleep(0.05)  # a refused connection must not spin the loop
        finally:
            await conn.close()

    async def watch() -> None:  # the caller's stop, seen within 50 ms: the window ends when it was set
        nonlocal stopped
        while stop is not None and time.monotonic() < measure_to:
            if stop.is_set():
                stopped = time.monotonic()
                return
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    watcher.cancel()
    cpu = time.process_time() - cpu0
    if stopped is not None and stopped < measure_to:
        measure_to = max(measure_from, stopped)
        duration_s = measure_to - measure_from
    measured = [s for s in samples if measure_from <= s.start < measure_to]
    done = sum(1 for s in samples if s.ok and measure_from <= s.end <= measure_to)
    codes: dict[str, int] = {}
    for s in measured:
        key = str(s.status) if s.status else "error"
        codes[key] = codes.get(key, 0) + 1
    return StepResult(concurrency, measured, duration_s, done, cpu, time.monotonic() - loop_start, codes)


def run_step(spec: RequestSpec, concurrency: int, warmup_s: float, duration_s: float,
             max_requests: int = MAX_REQUESTS_PER_STEP, stop: threading.Event | None = None) -> StepResult:
    """One closed-loop step: ``warmup_s`` discarded, then ``duration_s`` measured, or less when ``stop``
    (set from another thread) ends it first: requests in flight finish, none start, the window ends there."""
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    return asyncio.run(_step(spec, concurrency, warmup_s, duration_s, max_requests, stop))


def probe(spec: RequestSpec) -> Sample:
    """One request, to tell an unusable endpoint before the ladder starts."""

    async def go() -> Sample:
        conn = _Conn(spec, _ssl_context(spec))
        try:
            return await asyncio.wait_for(_one(conn, spec, 0), spec.timeout_s)
        except TimeoutError:
            now = time.monotonic()
            return Sample(now - spec.timeout_s, now, False, 0, f"no answer within {spec.timeout_s:g} s")
        finally:
            await conn.close()

    return asyncio.run(go())
