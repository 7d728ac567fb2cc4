"""Ollama's request log (gin's access lines) → ``latency.e2e_ms.*`` and, with its parallelism, the queue.

Each access line is a request's end and how long the server took over it, so its start is known too. With the
parallelism Ollama gave the model (``--parallel N`` on its runner's command line, ``Parallel:N`` in a load
request, ``OLLAMA_NUM_PARALLEL``), the requests in flight at each request's end beyond those N were waiting:
the engine's queue, read as a scheduler's statistics are (``serving.waiting_*``, QUE002). Without it the requests
in flight say nothing of a queue (a batch of N streams of unequal length looks the same), so only the latencies
are given, and the parallelism is named as what is missing.
"""

from __future__ import annotations

from statistics import fmean

from diagnose.collectors.ollama import WORK_PATHS, OllamaLog, OllamaParser, Request, gpu_turned_off, in_flight
from diagnose.derive.emit import Emit
from diagnose.model import Evidence, Quality
from diagnose.stats import quantile

MIN_REQUESTS = 5  # fewer requests say nothing of a latency's spread nor of a queue


class OllamaSource:
    """TextSource for Ollama's gin access lines and its parallelism (kind ``ollama-requests``)."""

    kind = "ollama-requests"
    triggers = ("[GIN]", "--parallel", "Parallel:", "OLLAMA_NUM_PARALLEL")

    def __init__(self) -> None:
        self._p = OllamaParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def _work(self) -> OllamaLog:
        return self._p.result()

    def matched(self) -> bool:
        return len(_done(self._work())) >= MIN_REQUESTS

    def problems(self) -> list[str]:
        log = self._work()
        if len(_done(log)) >= MIN_REQUESTS and log.parallel is None:
            if len(log.runners) > 1:
                return [f"Ollama's access lines give each request's time, but the log starts {len(log.runners)} "
                        "runners with their own settings and gin does not say which served a request: the requests "
                        "in flight say nothing of a queue"]
            return ["Ollama's access lines give each request's time, but not how many it runs at once: without the "
                    "runner's '--parallel N' (its 'starting llama server' line) or OLLAMA_NUM_PARALLEL, the requests "
                    "in flight say nothing of a queue"]
        return []

    def evidence(self, source: str) -> list[Evidence]:
        log = self._work()
        done = _done(log)
        if len(done) < MIN_REQUESTS:
            return []
        ev = Emit(source, quality=Quality.GOOD)
        what = f"Ollama's access lines ([GIN]): {len(done)} requests to a model, server-side time"
        ev.add("serving.engine", "ollama", "", "Ollama's access lines ([GIN] … POST \"/api/…\")")
        ev.add("requests.count", len(done), "requests", what)
        ms = sorted(r.seconds * 1000.0 for r in done)
        ev.add("latency.e2e_ms.mean", fmean(ms), "ms", what)
        ev.add("latency.e2e_ms.p50", quantile(ms, 0.5), "ms", what)
        ev.add("latency.e2e_ms.p99", quantile(ms, 0.99), "ms", what)
        ev.add("latency.e2e_ms.max", ms[-1], "ms", what)
        flight = in_flight(done)
        if log.parallel is not None:
            p = log.parallel
            waiting = [max(0, n - p) for n in flight]
            running = [min(n, p) for n in flight]
            how = (f"requests begun and not finished at each of {len(flight)} request ends (gin's access lines) beyond "
                   f"the {p} Ollama runs at once ({log.parallel_from})")
            ev.add("serving.stat_samples", len(flight), "count", how)
            ev.add("serving.running_max", max(running), "requests", how)
            ev.add("serving.running_mean", fmean(running), "requests", how)
            ev.add("serving.waiting_max", max(waiting), "requests", how)
            ev.add("serving.waiting_mean", fmean(waiting), "requests", how)
            ev.add("serving.waiting_last", waiting[-1], "requests", "at the last request's end")
            queued = [(w, r) for w, r in zip(waiting, running, strict=True) if w > 0]
            ev.add("serving.queued_samples", len(queued), "count", "request ends with a request waiting")
            ev.add("serving.queued_sample_ratio", len(queued) / len(flight), "ratio",
                   "share of request ends with a request waiting")
            if queued:
                ev.add("serving.running_when_queued_mean", fmean(r for _, r in queued), "requests", how)
                ev.add("serving.running_when_queued_max", max(r for _, r in queued), "requests", how)
            ev.add("serving.max_num_seqs", p, "requests", log.parallel_from)
        return ev.items


def _done(log: OllamaLog) -> list[Request]:
    """The requests that did a model's work and succeeded."""
    return [r for r in log.requests if r.status < 400 and r.path.rstrip("/") in WORK_PATHS]


class OllamaGpuOffSource:
    """TextSource for Ollama's record that it turned GPU inference off because the CPU lacks AVX (kind ``ollama-gpu``):
    ``gpu.unusable`` as nvidia-smi's failures are, the work then runs on the CPU."""

    kind = "ollama-gpu"
    triggers = ("GPU inference disabled", "disabling GPU support")

    def __init__(self) -> None:
        self._said: str | None = None

    def feed(self, line: str) -> None:
        if self._said is None:
            self._said = gpu_turned_off(line)

    def matched(self) -> bool:
        return self._said is not None

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        if self._said is None:
            return []
        ev = Emit(source, quality=Quality.GOOD)
        ev.add("gpu.unusable", ["cpu_lacks_vector_extensions"], "list", f'Ollama\'s GPU discovery: "{self._said}"')
        return ev.items


def sources() -> list[OllamaSource | OllamaGpuOffSource]:
    return [OllamaSource(), OllamaGpuOffSource()]
