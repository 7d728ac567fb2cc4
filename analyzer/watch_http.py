"""``diagnose watch --listen``: the watcher's state for Prometheus, and Alertmanager's webhook.

``GET /metrics`` (Prometheus text exposition, ``prometheus_client``):

* ``diagnose_up`` — 1 while the watcher runs and its last tick read the target (and its metrics);
* ``diagnose_triggers_total{rule}`` — triggers fired per rule (``alert`` for webhook posts);
* ``diagnose_bottleneck{category}`` — 1 for the light verdict's critical category while it holds, 0 for
  every other category (so an alert rule can match ``diagnose_bottleneck == 1``); kept whenever the
  watcher listens, whether or not ``bottleneck`` is one of its triggers;
* ``diagnose_last_session_timestamp_seconds`` — when the last session was written (absent before one).

``POST /alert`` takes an Alertmanager webhook payload (``version`` 4: ``status``, ``alerts`` with
``labels``, ``commonLabels``, ``groupKey``): firing alerts start one capture whose session records the
labels (while a capture runs they are recorded in it); Alertmanager's repeats of a group already
captured start none until a payload says the group resolved; a payload whose alerts are all
resolved is acknowledged and starts nothing. A body that is not such a
payload gets 400 and one sentence. Only loopback listens unless ``--listen`` names another address.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from diagnose.errors import InputError
from diagnose.model import Category
from diagnose.redact import REDACTED, is_secret_name, redact_text

MAX_BODY = 1 << 20  # an Alertmanager payload is a few KiB; a larger body is not one
MAX_LABELS = 64
MAX_ALERTS = 50  # the alerts of one payload whose labels a session records
MAX_CLIENTS = 8  # requests served at once; more get 503 (a scraper and Alertmanager need one each)
CLIENT_TIMEOUT_S = 10.0  # a client that stops sending is dropped


class BadAlert(ValueError):
    """A body that is not an Alertmanager webhook payload; the message is the one sentence the client gets."""


def parse_listen(text: str) -> tuple[str, int]:
    """``PORT``, ``HOST:PORT`` or ``[V6]:PORT``; the host defaults to 127.0.0.1."""
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip("[]") or "127.0.0.1"
    try:
        number = int(port)
        ipaddress.ip_address(host)
    except ValueError:
        raise InputError(f"--listen {text!r} is not an address and port.",
                         "Give a port (--listen 9464, on 127.0.0.1) or an IP and port (--listen 127.0.0.1:9464)."
                         ) from None
    if not 0 <= number <= 65535:
        raise InputError(f"--listen {text!r}: {number} is not a port number.", "Give a port from 1 to 65535.")
    return host, number


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


def _labels(labels: Any) -> dict[str, str]:
    """Labels as a session keeps them: strings, secrets redacted, bounded in count and length."""
    if not isinstance(labels, Mapping):
        return {}
    return {str(k)[:200]: REDACTED if is_secret_name(str(k)) else redact_text(str(v))[:1000]
            for k, v in list(labels.items())[:MAX_LABELS]}


def alert_labels(payload: Mapping[str, Any]) -> dict[str, str]:
    """The labels a capture records: the group's common labels, else the first alert's (redacted)."""
    labels = payload.get("commonLabels")
    if not isinstance(labels, Mapping) or not labels:
        first = next((a for a in payload.get("alerts", []) if isinstance(a, Mapping)), {})
        labels = first.get("labels")
    return _labels(labels)


def alert_record(payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a session records of a payload: its status, the labels (``alert_labels``) and each alert's
    labels (the first ``MAX_ALERTS``), all redacted."""
    status = payload.get("status")
    alerts = [a for a in payload.get("alerts", []) if isinstance(a, Mapping)]
    return {"status": status if status in ("firing", "resolved") else "", "labels": alert_labels(payload),
            "alerts": [_labels(a.get("labels")) for a in alerts[:MAX_ALERTS]],
            "group_key": redact_text(str(payload.get("groupKey", "")))[:1000]}


def check_alert(body: bytes) -> tuple[dict[str, Any], bool]:
    """The payload, and whether any of its alerts fires; ``BadAlert`` with one sentence otherwise."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise BadAlert("the body is not JSON: POST an Alertmanager webhook payload.") from None
    if not isinstance(doc, dict):
        raise BadAlert("the body is not a JSON object: POST an Alertmanager webhook payload.")
    alerts = doc.get("alerts")
    if not isinstance(alerts, list) or not alerts or not all(isinstance(a, dict) for a in alerts):
        raise BadAlert("the payload has no 'alerts' list: POST an Alertmanager webhook payload (version 4).")
    if not all(isinstance(a.get("labels", {}), dict) for a in alerts):
        raise BadAlert("an alert's 'labels' is not an object: POST an Alertmanager webhook payload.")
    firing = any(a.get("status", doc.get("status")) == "firing" for a in alerts)
    return doc, firing


class _StateCollector(Collector):
    def __init__(self, watcher: Any) -> None:
        self.watcher = watcher

    def collect(self) -> Iterator[Metric]:
        state = self.watcher.state
        with state.lock:
            up, triggers, bottleneck, last = state.up, dict(state.triggers), state.bottleneck, state.last_session_at
        up = up and bool(getattr(self.watcher, "reading_ok", True))
        yield GaugeMetricFamily("diagnose_up", "1 while diagnose watch runs and its last tick read the target "
                                "(and its metrics).", value=float(up))
        fired = CounterMetricFamily("diagnose_triggers", "Triggers fired, per rule (alert: Alertmanager posts).",
                                    labels=["rule"])
        for rule in (r.text for r in self.watcher.opts.rules):
            fired.add_metric([rule], float(triggers.get(rule, 0)))
        if "alert" in triggers:
            fired.add_metric(["alert"], float(triggers["alert"]))
        yield fired
        b = GaugeMetricFamily("diagnose_bottleneck", "1 for the light verdict's critical bottleneck category "
                              "while it holds, else 0.", labels=["category"])
        for c in Category:
            b.add_metric([c.value], 1.0 if c.value == bottleneck else 0.0)
        yield b
        if last is not None:
            yield GaugeMetricFamily("diagnose_last_session_timestamp_seconds",
                                    "Unix time the last watch session was written.", value=last)


def _handler(watcher: Any, registry: CollectorRegistry) -> type[BaseHTTPRequestHandler]:
    slots = threading.BoundedSemaphore(MAX_CLIENTS)

    class Handler(BaseHTTPRequestHandler):
        server_version = "diagnose-watch"
        timeout = CLIENT_TIMEOUT_S

        def handle_one_request(self) -> None:
            if not slots.acquire(blocking=False):
                self.raw_requestline = self.rfile.readline(65537)
                if self.parse_request():
                    self._send(503, b"diagnose watch is busy: try again.\n")
                return
            try:
                super().handle_one_request()
            finally:
                slots.release()

        def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self._send(404, b"diagnose watch serves GET /metrics and POST /alert.\n")
                return
            self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0] != "/alert":
                self._send(404, b"diagnose watch serves GET /metrics and POST /alert.\n")
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                self._send(411, b"send the payload with a Content-Length.\n")
                return
            if length < 0:
                self._send(400, b"the Content-Length is negative: send the payload's length in bytes.\n")
                return
            if length > MAX_BODY:
                self._send(413, b"the payload is larger than an Alertmanager webhook's (1 MiB at most).\n")
                return
            try:
                doc, firing = check_alert(self.rfile.read(length))
            except BadAlert as exc:
                self._send(400, (str(exc) + "\n").encode())
                return
            said = watcher.alert(doc, firing)
            self._send(202 if said == "capturing." else 200, f"{said}\n".encode())

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the watcher says what matters on stderr."""

    return Handler


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away mid-answer (a broken pipe, a timeout) is its own business: no traceback."""


class _V6Server(_Server):
    address_family = socket.AF_INET6


def serve(listen: str, watcher: Any) -> ThreadingHTTPServer:
    """Start serving on a daemon thread; the caller shuts it down."""
    host, port = parse_listen(listen)
    if not is_loopback(host):
        watcher.say(f"watch: --listen {host} is not loopback: /metrics and POST /alert are reachable from the "
                    "network (as asked)")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StateCollector(watcher))
    server_cls: type[_Server] = _V6Server if ":" in host else _Server
    try:
        server = server_cls((host, port), _handler(watcher, registry))
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror}.",
                         "Choose a free port, e.g. --listen 127.0.0.1:9464.") from None
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="diagnose-watch-http", daemon=True).start()
    return server
