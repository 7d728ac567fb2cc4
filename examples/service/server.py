"""The demo service's HTTP front: a threaded standard-library server, one thread per connection.

Endpoints:

* ``GET /healthz``  -> 200 ``{"status": "ok", ...}``
* ``POST /infer``   -> a real inference, JSON reply with a summary of the result (``prefill``:
  a streamed generation, see ``diagnose.examples.service.prefill``)
* ``GET /stats``    -> JSON counters (in flight, queue depth, completed, compiles, ...)
* ``GET /metrics``  -> Prometheus text with vLLM's metric names and buckets, computed from the
  real request timings (see ``diagnose.examples.service.metrics``)
* ``POST /v1/completions`` (``prefill`` only) -> OpenAI's completions API, streamed as server-sent
  events with ``"stream": true``
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from diagnose.collectors import torch_probe
from diagnose.examples.service.base import BadRequest, Pathology, log, parse_json
from diagnose.examples.service.engine import GenRequest
from diagnose.examples.service.metrics import Metrics
from diagnose.examples.service.prefill import PrefillPathology, detokenize

MAX_BODY_BYTES = 32 * 1024 * 1024


class InferenceServer(ThreadingHTTPServer):
    """ThreadingHTTPServer whose per-connection threads are named ``http-handler-N``."""

    daemon_threads = True
    block_on_close = True  # server_close() waits for handlers still inside the model (see close())
    request_queue_size = 256
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], pathology: Pathology,
                 stage_log: torch_probe.Probe | None, fixed: bool = False) -> None:
        super().__init__(address, InferenceHandler)
        self.pathology = pathology
        self.fixed = fixed  # the --fixed variant: /healthz and /stats say so
        self.metrics = Metrics()
        pathology.bind_metrics(self.metrics)
        self.stage_log = stage_log
        self._handler_ids = itertools.count(1)

    def process_request(self, request: Any, client_address: Any) -> None:
        t = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"http-handler-{next(self._handler_ids)}",
            daemon=True,
        )
        t.start()


class InferenceHandler(BaseHTTPRequestHandler):
    server: InferenceServer
    server_version = "diagnose-demo/0.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s - " + format, self.address_string(), *args)

    def _send_json(self, status: int, doc: dict[str, Any]) -> None:
        self._send(status, json.dumps(doc).encode(), "application/json")

    def _send(self, status: int, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_GET(self) -> None:
        srv = self.server
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            health: dict[str, Any] = {"status": "ok", "pathology": srv.pathology.name}
            if srv.fixed:
                health["fixed"] = True
            self._send_json(HTTPStatus.OK, health)
        elif path == "/stats":
            m = srv.metrics
            doc = {
                "pathology": srv.pathology.name,
                "pid": os.getpid(),
                "in_flight": m.in_flight,
                "completed": m.completed,
                "errors": m.errors,
                "uptime_s": round(time.time() - m.started, 3),
                **srv.pathology.stats(),
            }
            if srv.fixed:
                doc["fixed"] = True
            self._send_json(HTTPStatus.OK, doc)
        elif path == "/metrics":
            running, waiting = srv.pathology.running_waiting(srv.metrics.in_flight)
            kv = srv.pathology.kv_cache_usage()
            text = srv.metrics.prometheus(srv.pathology.name, running, waiting, kv)
            self._send(HTTPStatus.OK, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        else:
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such path {path}"})

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > MAX_BODY_BYTES:
            raise BadRequest(f"Content-Length must be in [0, {MAX_BODY_BYTES}]")
        return self.rfile.read(length)

    def _start_chunked(self, content_type: str) -> None:
        """Send the headers of a streamed (chunked, HTTP/1.1) reply; the connection closes after it."""
        self.protocol_version = "HTTP/1.1"
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%X\r\n%b\r\n" % (len(data), data))

    def _end_chunked(self) -> None:
        self.wfile.write(b"0\r\n\r\n")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/v1/completions" and isinstance(self.server.pathology, PrefillPathology):
            self._generate(self.server.pathology, openai=True)
            return
        if path != "/infer":
            self._send_json(HTTPStatus.NOT_FOUND, {"error": f"no such path {path}"})
            return
        if isinstance(self.server.pathology, PrefillPathology):
            self._generate(self.server.pathology)
            return
        srv = self.server
        t0 = time.perf_counter()
        srv.metrics.begin()
        ended = False

        def failed() -> None:  # a failed request leaves /stats before its reply goes out, as a served one does
            nonlocal ended
            if not ended:
                ended = True
                srv.metrics.end(ok=False, e2e_s=time.perf_counter() - t0, queue_s=None)

        try:
            body = self._read_body()
            content_type = (self.headers.get("Content-Type") or "").lower()
            result = srv.pathology.infer(body, content_type)
            latency_ms = (time.perf_counter() - t0) * 1e3
            # Record the request before its reply goes out, so that a client holding the reply
            # finds it in /stats, /metrics and the stage log.
            if result.prompt_tokens is not None:
                srv.metrics.count_tokens(prompt=result.prompt_tokens)
            ended = True
            srv.metrics.end(ok=True, e2e_s=latency_ms / 1e3, queue_s=result.queue_s, prompt_tokens=result.prompt_tokens)
            if srv.stage_log is not None:
                srv.stage_log.emit(result.stages_ms, status="ok", e2e_ms=round(latency_ms, 3))
            reply = {"pathology": srv.pathology.name, "latency_ms": round(latency_ms, 3), **result.body}
            self._send_json(HTTPStatus.OK, reply)
        except BadRequest as exc:
            failed()
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:
            log.exception("inference failed")
            failed()
            with contextlib.suppress(OSError):
                self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{type(exc).__name__}: {exc}"})
        finally:
            failed()

    def _generate(self, pathology: PrefillPathology, openai: bool = False) -> None:
        """POST /infer of a text-generation pathology: one NDJSON line per token, then a summary line.

        ``openai``: POST /v1/completions, OpenAI's completions API: ``{"model", "prompt", "max_tokens",
        "stream"}``; streamed as server-sent events (one ``data: {...}`` per token, then ``data: [DONE]``),
        else one ``text_completion`` object.
        """
        srv = self.server
        t0 = time.perf_counter()
        srv.metrics.begin()
        streaming, ended = False, False
        req: GenRequest | None = None
        created = int(time.time())
        model = ""

        def failed() -> None:  # a failed request leaves /stats before its reply goes out, as a served one does
            nonlocal ended
            if not ended:
                ended = True
                if req is not None:
                    pathology.cancel(req)
                srv.metrics.end(ok=False, e2e_s=time.perf_counter() - t0, queue_s=None)

        try:
            body = self._read_body()
            if openai:
                body, model = _openai_body(body)
            req = pathology.submit(body, arrival=t0)
            if req.stream:
                self._start_chunked("text/event-stream" if openai else "application/x-ndjson")
                streaming = True
            previous = 0.0
            for i, (token, at) in enumerate(pathology.tokens(req)):
                if i == 0:
                    srv.metrics.observe_token(ttft_s=at - req.arrival)
                else:
                    srv.metrics.observe_token(itl_s=at - previous)
                previous = at
                if streaming and openai:
                    event = {"id": f"cmpl-{req.request_id}", "object": "text_completion", "created": created,
                             "model": model, "choices": [{"index": 0, "text": detokenize(token), "logprobs": None,
                                                          "finish_reason": None}]}
                    self._chunk(b"data: " + json.dumps(event).encode() + b"\n\n")
                elif streaming:
                    line = {"index": i, "token": token, "text": detokenize(token)}
                    self._chunk(json.dumps(line).encode() + b"\n")
            timings = req.timings()
            latency_ms = (time.perf_counter() - t0) * 1e3
            stages_ms = {
                "preprocess": (req.queued - req.arrival) * 1e3,  # read, parse, tokenise
                "queue": (req.scheduled - req.queued) * 1e3,
                "prefill": timings.prefill_s * 1e3,
                "decode": timings.decode_s * 1e3,
            }
            summary: dict[str, Any] = {
                "done": True,
                "pathology": pathology.name,
                "request_id": req.request_id,
                "prompt_tokens": len(req.prompt),
                "output_tokens": len(req.output),
                "ttft_ms": round(timings.ttft_s * 1e3, 3),
                "latency_ms": round(latency_ms, 3),
                **{f"{k}_ms": round(v, 3) for k, v in stages_ms.items()},
            }
            # The request is finished: record it before the last line goes out, so that a client
            # holding its complete reply finds it in /metrics and in the stage log.
            ended = True
            srv.metrics.end(
                ok=True,
                e2e_s=latency_ms / 1e3,
                queue_s=req.scheduled - req.queued,
                prompt_tokens=len(req.prompt),
                generation=timings,
            )
            if srv.stage_log is not None:
                srv.stage_log.emit(
                    stages_ms,
                    status="ok",
                    e2e_ms=round(latency_ms, 3),
                    ttft_ms=round(timings.ttft_s * 1e3, 3),
                    input_tokens=len(req.prompt),
                    output_tokens=len(req.output),
                )
            usage = {"prompt_tokens": len(req.prompt), "completion_tokens": len(req.output),
                     "total_tokens": len(req.prompt) + len(req.output)}
            if streaming and openai:
                last = {"id": f"cmpl-{req.request_id}", "object": "text_completion", "created": created, "model": model,
                        "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}],
                        "usage": usage}
                self._chunk(b"data: " + json.dumps(last).encode() + b"\n\n")
                self._chunk(b"data: [DONE]\n\n")
                self._end_chunked()
            elif streaming:
                self._chunk(json.dumps(summary).encode() + b"\n")
                self._end_chunked()
            elif openai:
                self._send_json(HTTPStatus.OK, {
                    "id": f"cmpl-{req.request_id}", "object": "text_completion", "created": created, "model": model,
                    "choices": [{"index": 0, "text": "".join(detokenize(t) for t in req.output), "logprobs": None,
                                 "finish_reason": "length"}], "usage": usage})
            else:
                summary["tokens"] = req.output
                summary["text"] = "".join(detokenize(t) for t in req.output)
                self._send_json(HTTPStatus.OK, summary)
        except BadRequest as exc:
            failed()
            self._send_json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as exc:
            log.exception("generation failed")
            failed()
            error = {"error": f"{type(exc).__name__}: {exc}"}
            with contextlib.suppress(OSError):
                if streaming:
                    self._chunk(json.dumps(error).encode() + b"\n")
                    self._end_chunked()
                else:
                    self._send_json(HTTPStatus.INTERNAL_SERVER_ERROR, error)
        finally:
            failed()


def _openai_body(body: bytes) -> tuple[bytes, str]:
    """An OpenAI completions request as the engine's own body, and the model name it asked for."""
    doc = parse_json(body)
    prompt = doc.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]  # the API also takes a list of prompts; one is served
    if not isinstance(prompt, str):
        raise BadRequest("'prompt' must be a string")
    inner = {"prompt": prompt, "max_tokens": doc.get("max_tokens", 16), "stream": doc.get("stream", False)}
    return json.dumps(inner).encode(), str(doc.get("model", ""))


