"""A client of the Prometheus HTTP query API (Prometheus, Thanos, Mimir, VictoriaMetrics, Cortex).

Only reads: ``/api/v1/query`` (instant) and ``/api/v1/query_range`` (range), sent as form-encoded
POSTs (long PromQL regexes do not fit a URL). Standard library only (``urllib``, ``ssl``).

Credentials never travel on the command line: a bearer token or basic-auth pair comes from the
environment or a file (``Auth``); a URL with ``user:password@`` is refused, and nothing this module
raises or returns contains a credential. TLS: a CA bundle (``ca_file``) or, when asked, no
verification (``insecure``). Every request has a timeout, also passed to the server so that it stops
evaluating when the client gives up.

Errors are ``PromApiError`` with one sentence and a remedy, classified by what the user can do:
``unreachable`` (connection refused, DNS, timeout), ``tls``, ``auth`` (HTTP 401/403), ``not_api``
(an answer that is not the query API: a 404, an HTML login page), ``query`` (the server rejected or
could not evaluate a query: bad selector, too many points, a server-side timeout).

Reference: https://prometheus.io/docs/prometheus/latest/querying/api/ (the 11,000-points-per-series
limit of ``query_range`` is in prometheus/web/api/v1/api.go).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_POINTS = 11_000  # Prometheus refuses a range query whose series would have more points than this
ENV_TOKEN = "DIAGNOSE_PROMETHEUS_TOKEN"
ENV_USER = "DIAGNOSE_PROMETHEUS_USER"
ENV_PASSWORD = "DIAGNOSE_PROMETHEUS_PASSWORD"
MAX_BODY_BYTES = 512 * 1024 * 1024  # an answer bigger than this is refused, not read into memory


class PromApiError(Exception):
    """A query API failure the user can act on: ``kind``, one sentence, a remedy."""

    def __init__(self, kind: str, message: str, remedy: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.remedy = remedy
        self.detail = detail or message  # the server's own words, for a partial answer's list of problems


@dataclass(frozen=True)
class Auth:
    """How to authenticate; ``describe()`` says which, never the secret."""

    token: str = ""
    user: str = ""
    password: str = ""
    origin: str = ""  # where it came from, for messages ("$DIAGNOSE_PROMETHEUS_TOKEN", "token file x")

    def header(self) -> str | None:
        if self.token:
            return f"Bearer {self.token}"
        if self.user:
            pair = f"{self.user}:{self.password}".encode()
            return "Basic " + base64.b64encode(pair).decode("ascii")
        return None

    def describe(self) -> str:
        if self.token:
            return f"a bearer token from {self.origin}"
        if self.user:
            return f"basic auth from {self.origin}"
        return "no credentials"

    def __repr__(self) -> str:  # a traceback or a debug print must not show the secret
        return f"Auth({self.describe()})"


def _read_secret(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read().strip()
    except OSError as exc:
        raise PromApiError("auth", f"cannot read the {what} file {path} ({exc.strerror or exc}).",
                           "Pass a readable file that holds only the secret.") from exc
    if not text:
        raise PromApiError("auth", f"the {what} file {path} is empty.", "Put the secret in it, on one line.")
    return text


def load_auth(token_file: str | None = None, basic_auth_file: str | None = None,
              env: Mapping[str, str] | None = None) -> Auth:
    """Credentials from a file (first) or the environment; ``Auth()`` when none is configured."""
    env = os.environ if env is None else env
    if token_file:
        return Auth(token=_read_secret(token_file, "bearer token"), origin=f"the token file {token_file}")
    if basic_auth_file:
        text = _read_secret(basic_auth_file, "basic auth")
        user, sep, password = text.partition(":")
        if not sep or not user:
            raise PromApiError("auth", f"the basic auth file {basic_auth_file} does not hold USER:PASSWORD.",
                               "Write one line USER:PASSWORD in it.")
        return Auth(user=user, password=password, origin=f"the basic auth file {basic_auth_file}")
    if env.get(ENV_TOKEN):
        return Auth(token=env[ENV_TOKEN].strip(), origin=f"${ENV_TOKEN}")
    if env.get(ENV_USER):
        return Auth(user=env[ENV_USER], password=env.get(ENV_PASSWORD, ""), origin=f"${ENV_USER}/${ENV_PASSWORD}")
    return Auth()


def check_url(url: str) -> str:
    """The base URL without a trailing slash, or a ``PromApiError`` saying what is wrong with it."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PromApiError("url", f"{redact_url(url)} is not an http(s) URL of a Prometheus server.",
                           "Pass the server's base URL, e.g. --prometheus http://prometheus:9090.")
    if parts.username or parts.password:
        raise PromApiError("url", "the Prometheus URL carries credentials (user:password@), which would show in "
                           "the process list and shell history.",
                           f"Drop them from the URL and set {ENV_USER}/{ENV_PASSWORD} or --basic-auth-file.")
    try:
        _ = parts.port
    except ValueError as exc:
        raise PromApiError("url", f"{redact_url(url)} has an invalid port.", "Check the URL.") from exc
    path = parts.path.rstrip("/")
    for suffix in ("/api/v1/query_range", "/api/v1/query", "/graph", "/api/v1"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` and query string removed (for messages and reports)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    if not host:
        return url.split("@")[-1][:200]
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


@dataclass
class Stats:
    requests: int = 0
    bytes: int = 0
    seconds: float = 0.0


class PromApi:
    """Instant and range queries against one server; raises ``PromApiError``."""

    def __init__(self, url: str, *, auth: Auth | None = None, timeout_s: float = 30.0, ca_file: str | None = None,
                 insecure: bool = False) -> None:
        self.base = check_url(url)
        self.shown = redact_url(self.base)
        self.auth = auth or Auth()
        self.timeout_s = timeout_s
        self.stats = Stats()
        self._ctx: ssl.SSLContext | None = None
        if self.base.startswith("https"):
            if insecure:
                self._ctx = ssl.create_default_context()
                self._ctx.check_hostname = False
                self._ctx.verify_mode = ssl.CERT_NONE
            else:
                try:
                    self._ctx = ssl.create_default_context(cafile=ca_file)
                except (OSError, ssl.SSLError) as exc:
                    raise PromApiError("tls", f"cannot load the CA file {ca_file} ({exc}).",
                                       "Pass a PEM bundle with --ca-file.") from exc
        self._opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=self._ctx))

    def _post(self, path: str, params: Mapping[str, str]) -> Any:
        data = urllib.parse.urlencode(params).encode()
        req = urllib.request.Request(self.base + path, data=data, method="POST")
        req.add_header("Content-Type", "application/x-www-form-urlencoded")
        req.add_header("Accept", "application/json")
        req.add_header("User-Agent", "diagnose-fleet/0.1")
        header = self.auth.header()
        if header:
            req.add_header("Authorization", header)
        t0 = time.perf_counter()
        where = f"Prometheus at {self.shown}"
        try:
            with self._opener.open(req, timeout=self.timeout_s) as resp:
                body = resp.read(MAX_BODY_BYTES + 1)
                status = resp.status
                ctype = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status = exc.code
            ctype = exc.headers.get("Content-Type", "") if exc.headers else ""
            try:
                body = exc.read(1 << 20)
            except OSError:
                body = b""
            finally:
                exc.close()
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLError) or "CERTIFICATE" in str(reason).upper():
                raise PromApiError("tls", f"the TLS handshake with {where} failed ({_short(reason)}).",
                                   "Pass the server's CA with --ca-file, or --insecure to skip verification "
                                   "(only on a network you trust).") from exc
            raise PromApiError("unreachable", f"cannot reach {where} ({_short(reason)}).",
                               "Check the URL and that the server is up; in a cluster, `kubectl port-forward "
                               "svc/prometheus 9090` and pass http://127.0.0.1:9090.") from exc
        except TimeoutError as exc:
            raise PromApiError("unreachable", f"{where} did not answer within {self.timeout_s:.0f} s.",
                               "Raise --timeout, shorten --window, or narrow --selector.") from exc
        except (ConnectionError, OSError) as exc:
            raise PromApiError("unreachable", f"cannot reach {where} ({_short(exc)}).",
                               "Check the URL and that the server is up.") from exc
        finally:
            self.stats.requests += 1
            self.stats.seconds += time.perf_counter() - t0
        self.stats.bytes += len(body)
        if len(body) > MAX_BODY_BYTES:
            raise PromApiError("query", f"an answer of {where} is larger than {MAX_BODY_BYTES >> 20} MiB.",
                               "Narrow --selector or shorten --window.")
        if status in (401, 403):
            how = self.auth.describe()
            raise PromApiError("auth", f"{where} refused the request (HTTP {status}) with {how}.",
                               f"Set ${ENV_TOKEN} or --bearer-token-file (or basic auth: ${ENV_USER} and "
                               f"${ENV_PASSWORD}, or --basic-auth-file) with credentials it accepts.")
        doc = _json(body)
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            what = "HTML" if b"<html" in body[:2048].lower() else (ctype.split(";")[0] or "a body that is not JSON")
            raise PromApiError("not_api", f"{self.shown} does not answer the Prometheus query API (POST {path} "
                               f"returned HTTP {status}, {what}).",
                               "Pass the server's base URL, the one whose /api/v1/query answers (for Thanos or "
                               "Mimir include the path prefix, e.g. http://mimir:8080/prometheus).")
        if doc["status"] == "error":
            err = str(doc.get("error", "unknown error"))[:300]
            detail = f"{doc.get('errorType', 'error')}: {err}"
            raise PromApiError("query", f"{where} could not evaluate a query ({detail}).",
                               "Check --selector (a PromQL selector in braces, e.g. '{job=\"vllm\"}'); "
                               "on a timeout raise --timeout or shorten --window.", detail)
        return doc.get("data")

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """An instant query's ``result`` (a vector: ``[{"metric": {...}, "value": [t, "v"]}]``)."""
        data = self._post("/api/v1/query", {"query": expr, "time": f"{at:.3f}",
                                            "timeout": f"{max(1, int(self.timeout_s))}s"})
        return _result(data, ("vector", "scalar"), self.shown)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's ``result`` (a matrix). ``step`` must keep every series under ``MAX_POINTS``."""
        if (end - start) / step + 1 > MAX_POINTS:
            raise ValueError(f"step {step} s gives more than {MAX_POINTS} points over {end - start:.0f} s")
        data = self._post("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                  "step": f"{step:g}", "timeout": f"{max(1, int(self.timeout_s))}s"})
        return _result(data, ("matrix",), self.shown)


def _result(data: Any, types: tuple[str, ...], shown: str) -> list[dict[str, Any]]:
    if not isinstance(data, dict) or data.get("resultType") not in types:
        raise PromApiError("not_api", f"{shown} answered a query with an unexpected result shape.",
                           "Check that the URL is a Prometheus-compatible query API.")
    result = data.get("result")
    if data.get("resultType") == "scalar":
        return [{"metric": {}, "value": result}]
    return [r for r in result if isinstance(r, dict)] if isinstance(result, list) else []


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return None


def _short(x: object) -> str:
    text = str(x).strip() or type(x).__name__
    return text[:160]


def step_for(window_s: float, target_points: int, min_step_s: float = 1.0) -> float:
    """A step that gives about ``target_points`` per series and never more than ``MAX_POINTS``."""
    step = max(min_step_s, window_s / max(1, target_points - 1))
    step = float(int(step)) if step >= 1 else step
    while window_s / step + 1 > MAX_POINTS:
        step += 1.0
    return step
