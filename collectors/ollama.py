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

import bisect
import re
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

_GIN = re.compile(r"\[GIN\]\s+(?P<day>\d{4}/\d\d/\d\d)\s+-\s+(?P<time>\d\d:\d\d:\d\d)\s+\|\s+(?P<status>\d{3})\s+\|"
                  r"\s+(?P<took>(?:\d+(?:\.\d+)?(?:h|ms|µs|us|ns|m|s))+)\s+\|\s*(?P<client>\S*)\s+\|"
                  r"\s+(?P<method>[A-Z]+)\s+\"(?P<path>[^\"?]+)")
_PART = re.compile(r"(\d+(?:\.\d+)?)(h|ms|µs|us|ns|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}
# the parallelism: the runner's flag (on Ollama's own start line only: a llama-server launch is not Ollama's), the new
# engine's load request, the server's configuration
_RUNNER = re.compile(r"msg=\"?starting (?:llama server|llama-server|runner)\"?.*?--parallel[ =](?P<n>\d+)")
_RUNNER_MODEL = re.compile(r"--model[ =](?P<m>\S+)")
_LOAD = re.compile(r"msg=\"?load\"?\s+request=.*?\bParallel:(?P<n>\d+)")
_CONFIG = re.compile(r"\bOLLAMA_NUM_PARALLEL:(?P<n>\d+)")
# what a request does: a model's work (generation, chat, embeddings), not a listing, a pull or a health check
WORK_PATHS = ("/api/generate", "/api/chat", "/api/embed", "/api/embeddings", "/v1/chat/completions",
              "/v1/completions", "/v1/embeddings", "/v1/responses")


# Ollama's GPU discovery turning the GPU off because the CPU lacks the vector extensions its GPU runners were built for
# (discover/gpu.go, a slog record: 0.1.x "CPU does not have AVX or AVX2, disabling GPU support.", later "CPU does not
# have minimum vector extensions, GPU inference disabled.  Required:avx  Detected:no vector extensions"), read in its
# record's msg field only (a person's "I disabled GPU support" is no record)
_GPU_OFF = re.compile(r"\bmsg=\"?(?P<m>CPU does not have (?:minimum vector extensions|AVX or AVX2)\W+"
                      r"(?:GPU inference disabled|disabling GPU support)[^\"]*)")


def gpu_turned_off(line: str) -> str | None:
    """The message of Ollama's record that it turned GPU inference off for the CPU's sake, else None."""
    m = _GPU_OFF.search(line) if "msg=" in line else None
    return " ".join(m["m"].split()) if m else None


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
    # each runner or load request seen: (the model, when its line names it, the parallelism); gin's lines do not say
    # which model served a request, so with more than one the parallelism of any one request is not known
    runners: set[tuple[str, int]] = field(default_factory=set)


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
                if rx is not _CONFIG:
                    model = _RUNNER_MODEL.search(line)
                    self.log.runners.add((model["m"] if model else "", int(m["n"])))
                # the runner's and the load request's are what the model got; the configuration only when nothing
                # more exact was said
                if rx is not _CONFIG or self.log.parallel is None or self.log.parallel_from.endswith("PARALLEL)"):
                    self.log.parallel, self.log.parallel_from = int(m["n"]), what
                return

    def result(self) -> OllamaLog:
        if len(self.log.runners) > 1:  # several models or settings: which one served a request is not said
            self.log.parallel, self.log.parallel_from = None, f"{len(self.log.runners)} runners with their own settings"
        return self.log


def in_flight(requests: list[Request]) -> list[int]:
    """At each request's end (sorted by end), the requests surely in flight, itself included: gin's clock has whole
    seconds, so a start (end less the time taken) is known to a second. Another request counts when it ended in a
    later second and began a second or more before this one's end: it was running then, whatever the rounding.
    Never more than were in flight. O(n log n)."""
    reqs = sorted(requests, key=lambda r: r.end)
    starts = sorted(r.start for r in reqs)
    ends = [r.end for r in reqs]
    # for each end second, how many of the requests ending then began a second or more before it
    early = Counter(r.end for r in reqs if r.start <= r.end - 1.0)
    out = []
    for r in reqs:
        began = bisect.bisect_right(starts, r.end - 1.0)  # began a second or more before this end
        ended_before = bisect.bisect_left(ends, r.end)  # ended in an earlier second: began before too
        out.append(1 + max(0, began - ended_before - early[r.end]))
    return out
