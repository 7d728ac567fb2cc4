"""A real fleet on one machine: demo replicas, a replayed dcgm-exporter, and a real Prometheus scraping them.

Used by ``diagnose demo --fleet``, the fleet integration test and the scale benchmark. Everything
listens on 127.0.0.1 only, on free ports; every process and thread started here is stopped on the way
out (``with`` blocks), and Prometheus's storage is a temporary folder removed afterwards.

    with DcgmReplay(T4_SCRAPE, pod="replica-4", namespace="demo") as gpu, \\
         PrometheusServer([Job("demo", [r.address ...]), Job("dcgm", [gpu.address])]) as prom:
        prom.wait_for_targets()
        ...  # diagnose fleet --prometheus prom.url

Prometheus is the Debian package's binary (``apt-get install prometheus``); ``find_prometheus`` says
where it is, or None.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
INSTALL_HINT = "Install it: sudo apt-get install prometheus (Debian/Ubuntu), or put the prometheus binary on PATH."
# a real dcgm-exporter scrape of a busy, power-capped Tesla T4 (examples/data/SOURCES.md), installed
# with the package so that `diagnose demo --fleet` runs from a wheel
T4_SCRAPE = Path(__file__).resolve().parent / "data" / "t4_busy_util91_engine16_power_capped_ericsson.prom"


def find_prometheus() -> str | None:
    """The prometheus binary: $DIAGNOSE_PROMETHEUS_BIN when set (and only it), else PATH or the Debian
    package's path; None when there is none."""
    override = os.environ.get("DIAGNOSE_PROMETHEUS_BIN")
    cands = (override,) if override else (shutil.which("prometheus"), "/usr/bin/prometheus")
    for cand in cands:
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Job:
    """One scrape job: its targets (``host:port``), target labels, and path."""

    name: str
    targets: Sequence[str]
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics_path: str = "/metrics"
    per_target_labels: Sequence[Mapping[str, str]] = ()  # one static_config per target when given


def config_yaml(jobs: Sequence[Job], scrape_interval: str = "1s") -> str:
    """A prometheus.yml for ``jobs`` (JSON is valid YAML: no YAML library needed)."""
    scrape_configs = []
    for job in jobs:
        if job.per_target_labels:
            statics = [{"targets": [t], "labels": {**job.labels, **extra}}
                       for t, extra in zip(job.targets, job.per_target_labels, strict=True)]
        else:
            statics = [{"targets": list(job.targets), "labels": dict(job.labels)}]
        scrape_configs.append({"job_name": job.name, "metrics_path": job.metrics_path, "static_configs": statics,
                               "scrape_interval": scrape_interval, "scrape_timeout": scrape_interval})
    doc = {"global": {"scrape_interval": scrape_interval, "evaluation_interval": "15s"},
           "scrape_configs": scrape_configs}
    return json.dumps(doc, indent=2) + "\n"


class PrometheusServer:
    """A real Prometheus on 127.0.0.1 (free port, generated config, a temporary storage folder)."""

    def __init__(self, jobs: Sequence[Job] = (), *, scrape_interval: str = "1s", binary: str | None = None,
                 storage: str | None = None, retention: str = "30d", extra_args: Sequence[str] = ()) -> None:
        self.jobs = list(jobs)
        self.scrape_interval = scrape_interval
        self.binary = binary or find_prometheus()
        self._own_storage = storage is None
        self.storage = storage
        self.retention = retention
        self.extra_args = list(extra_args)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._dir: str | None = None
        self._log: Any = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> PrometheusServer:
        if self.binary is None:
            raise FileNotFoundError(f"prometheus is not installed. {INSTALL_HINT}")
        self._dir = tempfile.mkdtemp(prefix="diagnose-prometheus-")
        if self.storage is None:
            self.storage = os.path.join(self._dir, "data")
        config = os.path.join(self._dir, "prometheus.yml")
        with open(config, "w", encoding="utf-8") as fh:
            fh.write(config_yaml(self.jobs, self.scrape_interval))
        self.port = free_port()
        self._log = open(os.path.join(self._dir, "prometheus.log"), "wb")  # noqa: SIM115 - closed in stop()
        cmd = [self.binary, f"--config.file={config}", f"--storage.tsdb.path={self.storage}",
               f"--web.listen-address={HOST}:{self.port}", f"--storage.tsdb.retention.time={self.retention}",
               "--log.level=warn", *self.extra_args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: {tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"prometheus was not ready after {READY_TIMEOUT_S:.0f} s: {tail}")
            time.sleep(0.2)

    def log_tail(self, n: int = 2000) -> str:
        if self._dir is None:
            return ""
        try:
            return Path(self._dir, "prometheus.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = urllib.parse.urlencode({"query": expr}).encode()
        with urllib.request.urlopen(f"{self.url}/api/v1/query", data=data, timeout=10) as resp:
            doc = json.loads(resp.read())
        return list(doc.get("data", {}).get("result", []))

    def wait_for_targets(self, min_samples: int = 3, timeout_s: float = 60.0) -> None:
        """Until every target has been scraped ``min_samples`` times, successfully or not (a target that is
        down is recorded as ``up == 0``); bounded by ``timeout_s``."""
        want = sum(len(j.targets) for j in self.jobs)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.query("count_over_time(up[10m])")
            ready = [r for r in got if float(r["value"][1]) >= min_samples]
            if len(ready) >= want:
                return
            time.sleep(0.5)
        raise RuntimeError(f"not every target was scraped {min_samples} times within {timeout_s:.0f} s")

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_GRACE_S)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def relabel(scrape: str, labels: Mapping[str, str]) -> str:
    """``scrape`` with ``labels`` added to every sample (as dcgm-exporter adds the pod using a GPU)."""
    extra = ",".join(f'{k}="{v}"' for k, v in labels.items())
    out = []
    for line in scrape.splitlines():
        if line and not line.startswith("#") and extra:
            if "{" in line.split(" ", 1)[0]:
                line = line.replace("}", f",{extra}}}", 1)
            else:
                name, rest = line.split(" ", 1)
                line = f"{name}{{{extra}}} {rest}"
        out.append(line)
    return "\n".join(out) + "\n"


class _Replay(BaseHTTPRequestHandler):
    server: _ReplayServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        body = self.server.body_for(self.path.split("?", 1)[0])
        if body is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _ReplayServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, pages: Mapping[str, bytes]) -> None:
        super().__init__((HOST, 0), _Replay)
        self.pages = dict(pages)

    def body_for(self, path: str) -> bytes | None:
        return self.pages.get(path)


class DcgmReplay:
    """A recorded dcgm-exporter scrape served at ``/metrics`` on 127.0.0.1, labelled with the pod using it."""

    def __init__(self, scrape_file: str | os.PathLike[str], **labels: str) -> None:
        self.text = relabel(Path(scrape_file).read_text(encoding="utf-8"), labels)
        self._srv: _ReplayServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        assert self._srv is not None
        return f"{HOST}:{self._srv.server_address[1]}"

    def __enter__(self) -> DcgmReplay:
        self._srv = _ReplayServer({"/metrics": self.text.encode()})
        self._thread = threading.Thread(target=self._srv.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="dcgm-replay", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._srv is not None:
            self._srv.shutdown()
            self._srv.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


# -- the demo fleet ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaSpec:
    pod: str
    pathology: str
    concurrency: int | None = None  # clients driving it (None: the pathology's default)
    gpu_scrape: str | None = None  # a recorded dcgm-exporter scrape replayed as this replica's GPU


DEMO_FLEET: tuple[ReplicaSpec, ...] = (
    ReplicaSpec("replica-1", "queueing", concurrency=8),
    ReplicaSpec("replica-2", "queueing", concurrency=8),
    ReplicaSpec("replica-3", "prefill"),
    ReplicaSpec("replica-4", "healthy", gpu_scrape=str(T4_SCRAPE)),
)
NAMESPACE = "demo"


class DemoFleet:
    """Start the replicas, their GPU replays and Prometheus; drive load; stop everything on exit."""

    def __init__(self, specs: Sequence[ReplicaSpec] = DEMO_FLEET, *, load_s: float = 600.0,
                 scrape_interval: str = "1s") -> None:
        self.specs = list(specs)
        self.load_s = load_s
        self.scrape_interval = scrape_interval
        self._stack = contextlib.ExitStack()
        self.services: list[Any] = []
        self.loads: list[Any] = []
        self.prometheus: PrometheusServer | None = None

    def __enter__(self) -> DemoFleet:
        from diagnose.examples.demo import PATHOLOGIES, DemoService, background_load

        try:
            binary = find_prometheus()
            if binary is None:
                raise FileNotFoundError(f"prometheus is not installed. {INSTALL_HINT}")
            gpus = []
            for spec in self.specs:
                svc = self._stack.enter_context(DemoService(spec.pathology))
                self.services.append(svc)
                if spec.gpu_scrape:
                    gpus.append(self._stack.enter_context(
                        DcgmReplay(spec.gpu_scrape, pod=spec.pod, namespace=NAMESPACE, container="engine")))
            jobs = [Job("demo", [f"{HOST}:{s.port}" for s in self.services],
                        per_target_labels=[{"pod": sp.pod, "namespace": NAMESPACE, "pathology": sp.pathology}
                                           for sp in self.specs])]
            if gpus:
                jobs.append(Job("dcgm-exporter", [g.address for g in gpus]))
            self.prometheus = self._stack.enter_context(
                PrometheusServer(jobs, scrape_interval=self.scrape_interval, binary=binary))
            for spec, svc in zip(self.specs, self.services, strict=True):
                load_spec = PATHOLOGIES[spec.pathology]
                if spec.concurrency is not None:
                    from dataclasses import replace

                    load_spec = replace(load_spec, concurrency=spec.concurrency)
                self.loads.append(self._stack.enter_context(background_load(svc.url, load_spec, self.load_s)))
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stack.close()


# -- a generated fleet, for backfilling (benchmarks/fleet_scale.py, tests) ---------------------------------
STEP_S = 15  # the generated scrape interval (Prometheus's default)
TIERS = ((50, "a"), (100, "b"), (250, "c"), (500, "d"))  # cumulative sizes and the tier label that completes them
LE = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HISTS = (("vllm:e2e_request_latency_seconds", 1.2), ("vllm:time_to_first_token_seconds", 0.2),
         ("vllm:request_queue_time_seconds", 0.05), ("vllm:inter_token_latency_seconds", 0.02))
COUNTERS = (("vllm:request_success", 1.0), ("vllm:prompt_tokens", 500.0), ("vllm:generation_tokens", 120.0),
            ("vllm:num_preemptions", 0.0))
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
DCGM = (("DCGM_FI_DEV_GPU_UTIL", 80.0), ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.7), ("DCGM_FI_PROF_SM_ACTIVE", 0.6),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.3), ("DCGM_FI_PROF_DRAM_ACTIVE", 0.5), ("DCGM_FI_DEV_FB_USED", 70000.0),
        ("DCGM_FI_DEV_FB_FREE", 11000.0), ("DCGM_FI_DEV_SM_CLOCK", 1755.0), ("DCGM_FI_DEV_MAX_SM_CLOCK", 1980.0),
        ("DCGM_FI_DEV_POWER_USAGE", 600.0), ("DCGM_FI_DEV_POWER_MGMT_LIMIT", 700.0), ("DCGM_FI_DEV_GPU_TEMP", 65.0))


def tier_of(i: int) -> str:
    for size, tier in TIERS:
        if i < size:
            return tier
    return "z"


def write_openmetrics(path: str, replicas: int, minutes: int, end: int, seed: int = 1) -> int:
    """OpenMetrics text (for ``promtool tsdb create-blocks-from openmetrics``) of ``replicas`` vLLM replicas and
    one GPU each, sampled every ``STEP_S`` over ``minutes`` ending at ``end``; returns the number of series.

    Replica i carries load 0.5-1.5 (seeded), ×8 for every 97th (replica 0 among them): those queue."""
    rng = random.Random(seed)
    times = [end - minutes * 60 + k * STEP_S for k in range(minutes * 60 // STEP_S + 1)]
    reps = []
    for i in range(replicas):
        load = rng.uniform(0.5, 1.5) * (8.0 if i % 97 == 0 else 1.0)  # a few replicas take far more
        labels = (f'instance="10.{i // 250}.{i % 250}.1:8000",job="vllm",pod="vllm-{i}",namespace="llm",'
                  f'model_name="m",tier="{tier_of(i)}"')
        reps.append((i, load, labels))
    series = 0
    with open(path, "w", encoding="utf-8", buffering=1 << 22) as out:
        w = out.write
        for name in GAUGES:
            w(f"# TYPE {name} gauge\n")
            for _i, load, labels in reps:
                series += 1
                for t in times:
                    v = {"vllm:num_requests_running": 8 * load,
                         "vllm:num_requests_waiting": max(0.0, 20 * (load - 1.2)),
                         "vllm:kv_cache_usage_perc": min(0.99, 0.6 * load)}[name]
                    w(f"{name}{{{labels}}} {v + rng.random() * 0.1:.3f} {t}\n")
        for name, per_req in COUNTERS:
            w(f"# TYPE {name} counter\n")
            for _i, load, labels in reps:
                series += 1
                total = 0.0
                for t in times:
                    total += per_req * 5 * load * STEP_S
                    w(f"{name}_total{{{labels}}} {total:.0f} {t}\n")
        for name, typical in HISTS:
            w(f"# TYPE {name} histogram\n")
            for _i, load, labels in reps:
                series += len(LE) + 3
                scale = typical * load
                cum = [0.0] * (len(LE) + 1)
                s = n = 0.0
                for t in times:
                    k = 5 * load * STEP_S
                    for j, le in enumerate(LE):
                        cum[j] += k * (1 - math.exp(-le / scale))
                    cum[-1] += k
                    n += k
                    s += k * scale
                    for j, le in enumerate(LE):
                        w(f'{name}_bucket{{{labels},le="{le}"}} {cum[j]:.1f} {t}\n')
                    w(f'{name}_bucket{{{labels},le="+Inf"}} {cum[-1]:.1f} {t}\n')
                    w(f"{name}_count{{{labels}}} {n:.1f} {t}\n{name}_sum{{{labels}}} {s:.3f} {t}\n")
        for name, base in DCGM:
            w(f"# TYPE {name} gauge\n")
            for i, _load, _ in reps:
                series += 1
                gl = (f'gpu="0",UUID="GPU-{i:08d}",modelName="NVIDIA H100 80GB HBM3",Hostname="node-{i}",'
                      f'pod="vllm-{i}",namespace="llm",container="engine",job="dcgm-exporter",'
                      f'instance="10.9.{i // 250}.{i % 250}:9400",tier="{tier_of(i)}"')
                for t in times:
                    w(f"{name}{{{gl}}} {base * (0.95 + 0.1 * rng.random()):.3f} {t}\n")
        w("# EOF\n")
    return series


