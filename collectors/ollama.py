"""Ollama's request log: gin's access line for every request, and how many requests Ollama runs at once.

Recognised::

    [GIN] 2025/02/18 - 12:24:58 | 200 |  2.458931806s |  10.248.155.225 | POST     "/api/chat"

(gin's default formatter: the time the request *finished*, to the second; its status; how long it took, as Go
prints a duration: ``158.82803ms``, ``2.458931806s``, ``1m2.5s``; the client; the method and the path), behind any
journald or container prefix. And the parallelism Ollama gave the model: its runner's command line
(``msg="starting llama server" cmd="… --parallel 4 …"``), the load request of its newer engine
(``Parallel:1``), or the server's configuration (``OLLAMA_NUM_PARALLEL:2``; 0 there is "chosen at load"). Pure,
stdlib only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

_GIN = re.compile(r"\[GIN\]\s+(?P<day>\d{4}/\d\d/\d\d)\s+-\s+(?P<time>\d\d:\d\d:\d\d)\s+\|\s+(?P<status>\d{3})\s+\|"
                  r"\s+(?P<took>(?:\d+(?:\.\d+)?(?:h|ms|µs|us|ns|m|s))+)\s+\|\s+(?P<client>\S+)\s+\|"
                  r"\s+(?P<method>[A-Z]+)\s+\"(?P<path>[^\"?]+)")
_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|µs|us|ns|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}
# the parallelism: the runner's flag (on Ollama's own start line only: a llama-server launch is not Ollama's), the new
# engine's load request, the server's configuration
_RUNNER = re.compile(r"msg=\"?starting (?:llama server|llama-server|runner)\"?.*?--parallel[ =](?P<n>\d+)")
_LOAD = re.compile(r"msg=\"?load\"?\s+request=.*?\bParallel:(?P<n>\d+)")
_CONFIG = re.compile(r"\bOLLAMA_NUM_PARALLEL:(?P<n>\d+)")
# what a request does: a model's work (generation, chat, embeddings), not a listing, a pull or a health check
WORK_PATHS = ("/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/v1/chat/completions",
              "/v1/completions", "/v1/embeddings", "/v1/responses")


def go_duration(text: str) -> float:
    """Seconds in a Go duration's text (``1m2.5s``, ``158.82803ms``)."""
    return sum(float(v) * _SECONDS[u] for v, u in _PART.findall(text))


@dataclass(frozen=True)
class Request:
    end: float  # when it finished, seconds since the epoch (to the second: gin prints no fraction)
    seconds: float  # how long the server took
    status: int
    path: str

    @property
    def start(self) -> float:
        return self.end - self.seconds


@dataclass
class OllamaLog:
    requests: list[Request] = field(default_factory=list)
    parallel: int | None = None  # requests the model runs at once, as Ollama set it
    parallel_from: str = ""


MAX_REQUESTS = 200_000


class OllamaParser:
    """Feed cleaned lines; ``log`` holds the requests and the parallelism read."""

    def __init__(self) -> None:
        self.log = OllamaLog()

    def feed(self, line: str) -> None:
        if "[GIN]" in line:
            m = _GIN.search(line)
            if m and len(self.log.requests) < MAX_REQUESTS:
                try:
                    end = datetime.strptime(f"{m['day']} {m['time']}", "%Y/%m/%d %H:%M:%S").timestamp()
                except ValueError:
                    return
                self.log.requests.append(Request(end, go_duration(m["took"]), int(m["status"]), m["path"]))
            return
        if "arallel" not in line:
            return
        for rx, what in ((_RUNNER, "Ollama's runner command line (--parallel)"),
                         (_LOAD, "Ollama's load request (Parallel)"),
                         (_CONFIG, "Ollama's server configuration (OLLAMA_NUM_PARALLEL)")):
            m = rx.search(line)
            if m and int(m["n"]) > 0:
                # the runner's and the load request's are what the model got; the configuration only when nothing
                # more exact was said
                if rx is not _CONFIG or self.log.parallel is None or self.log.parallel_from.endswith("PARALLEL)"):
                    self.log.parallel, self.log.parallel_from = int(m["n"]), what
                return

    def result(self) -> OllamaLog:
        return self.log


def in_flight(requests: list[Request]) -> list[int]:
    """At each request's end, the requests begun and not yet finished, itself included: those finishing in the
    same second count (gin's clock has no fraction). Sorted by end; O(n log n)."""
    import bisect

    reqs = sorted(requests, key=lambda r: r.end)
    starts = sorted(r.start for r in reqs)
    ends = [r.end for r in reqs]
    out = []
    for r in reqs:
        begun = bisect.bisect_left(starts, r.end)  # started before this one ended
        done = bisect.bisect_left(ends, r.end)  # finished in an earlier second
        out.append(max(1, begun - done))
    return out
