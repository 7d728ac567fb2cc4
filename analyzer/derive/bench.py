"""Load-generator output → client latency, throughput, in-flight requests and the server's breakdown.

Of several measured load levels (a perf_analyzer ``--concurrency-range`` sweep), the last one, the
highest load, is reported: that is the one whose latency an incident is about. The others are
counted in ``bench.levels``.

An ensemble's time is split by its composing models (``_ensemble``): a model named as a stage (a DALI or
pre-processing model, a tokenizer, a post-processing model) is that stage, any other is the model's
compute; a processing model's queue is its own (requests wait for that model), any other's is queue.

trtexec's performance summary (the engine timed alone) gives each inference's host-to-device copy, GPU
compute and device-to-host copy as stages (``_device_parts``), beside a server's load level when both
were pasted.
"""

from __future__ import annotations

from diagnose.collectors.bench import BenchLevel, BenchParser
from diagnose.collectors.timing import known_stage
from diagnose.derive.emit import Emit
from diagnose.derive.timing_tables import LoadLevel, sweep_evidence
from diagnose.model import Evidence, Quality

KIND = "benchmark"


class BenchSource:
    """TextSource for perf_analyzer / wrk / ab output (kind ``benchmark``)."""

    kind = KIND
    triggers = ()  # load-test output is pasted or saved on its own: read from the head

    def __init__(self) -> None:
        self._parser = BenchParser()

    def feed(self, line: str) -> None:
        self._parser.feed(line)

    def matched(self) -> bool:
        return self._parser.matched()

    def problems(self) -> list[str]:
        levels = self._parser.results()
        lvl = _pick(levels)
        if lvl is not None and lvl.server_latency is not None and not lvl.server_breakdown_complete:
            return ["the server latency breakdown is cut short (a part of compute is missing)"]
        return []

    def evidence(self, source: str) -> list[Evidence]:
        return derive(self._parser.results(), source, self._parser.delayed_warnings)


def sources() -> list[BenchSource]:
    return [BenchSource()]


def _pick(levels: list[BenchLevel]) -> BenchLevel | None:
    served = [lvl for lvl in levels if lvl.tool != "trtexec"]
    levels = served or levels  # a load level of a server outranks the engine timed alone
    with_tput = [lvl for lvl in levels if lvl.throughput is not None]
    if with_tput:
        return with_tput[-1]
    return levels[-1] if levels else None


# a composing model's stage, by its name: a pre- or post-processing model (DALI, a tokenizer, "preprocessing" in
# TensorRT-LLM's ensemble); any other model is the model itself (compute)
_MODEL_STAGES = ("preprocess", "postprocess")  # a model is never a copy, whatever its name ("image_download")


def _ensemble(ev: Emit, lvl: BenchLevel, where: str) -> None:
    """An ensemble's time by its composing models: a processing model's whole time is its stage's; a model's
    queue is queue, the rest compute.

    The ensemble's own line sums its models' queue and compute, so it says the request computes without
    saying what: a pre-processing model (DALI decoding images) taking most of it is not the model's compute.
    Models that run side by side can sum past the ensemble's latency: the shares are then of their sum."""
    leaves = lvl.composing_leaves
    latency = lvl.server_latency or 0.0
    whole = max(latency, sum(m.latency or 0.0 for m in leaves))
    by_stage: dict[str, float] = {}
    queue = 0.0
    for m in leaves:
        stage = known_stage(m.name)
        stage = stage if stage in _MODEL_STAGES else "compute"
        # requests queued at a pre- or post-processing model wait for that model: its time, not the server's
        # capacity (triton server#3245's requests queued at DALI)
        q = 0.0 if stage in _MODEL_STAGES else min(m.parts.get("queue", 0.0), m.latency or 0.0)
        queue += q
        by_stage[stage] = by_stage.get(stage, 0.0) + (m.latency or 0.0) - q
    names = ", ".join(f"{m.name} {m.latency:.1f} ms" for m in leaves)
    ev.add("bench.composing_models", len(leaves), "models",
           f"{where}: {names} of the ensemble's {latency:.1f} ms")
    for stage, ms in sorted(by_stage.items()):
        ev.add(f"stage.{stage}_ms.mean", ms, "ms", f"{where}: composing models' {stage} time"
               + (", their queues apart" if stage == "compute" else ", queued at them included"))
        ev.add(f"stage.{stage}.share", ms / whole, "ratio",
               f"{stage} models' time / the ensemble's request latency")
    ev.add("stage.queue.share", queue / whole, "ratio", "composing models' queue time / the ensemble's request latency")


ACCOUNTED_MIN = 0.5  # an ensemble's own parts that cover less than this of its request time leave its queues out


def _ensemble_totals(ev: Emit, lvl: BenchLevel, parts: dict[str, float], where: str) -> dict[str, float]:
    """An old perf_analyzer's ensemble parts ("Total avg … time" lines): its composing models' blocks, when
    pasted, say more (``_ensemble``) and these are left out; else its compute stands, but its queue never does: it
    is the ensemble's own, not its models' (triton server#2455 made it their sum, after #2429's 0 usec queue at
    1.9 s), so it cannot say requests did not wait. Where compute covers under ``ACCOUNTED_MIN`` of the request
    time, the share it leaves out (the models' queues among it) is stated."""
    if lvl.composing_leaves:
        return {}
    latency = lvl.server_latency or 0.0
    compute = sum(v for k, v in parts.items() if k != "queue")
    if latency > 0 and compute < ACCOUNTED_MIN * latency:
        ev.add("bench.ensemble_unaccounted_share", 1.0 - compute / latency, "ratio",
               f"{where}: the ensemble's request time its own compute lines leave out (its composing models' "
               "queues among it, which perf_analyzer before triton server#2455 did not add to the ensemble's)")
    return {k: v for k, v in parts.items() if k != "queue"}


def _device_parts(ev: Emit, lvl: BenchLevel) -> None:
    """trtexec: the input's copy, the engine's compute and the output's copy, each inference (its Latency is
    their sum); the host's enqueue time; the GPU's compute over the run's wall time."""
    parts = lvl.device_parts
    for part, what in (("h2d", "host-to-device copy (H2D Latency)"), ("compute", "engine compute (GPU Compute Time)"),
                       ("d2h", "device-to-host copy (D2H Latency)")):
        if part in parts:
            ev.add(f"stage.{part}_ms.mean", parts[part], "ms", f"trtexec: mean {what} per inference")
    inference = sum(parts.get(k, 0.0) for k in ("h2d", "compute", "d2h"))
    if "compute" in parts and inference > 0:
        for part in ("h2d", "compute", "d2h"):
            if part in parts:
                ev.add(f"stage.{part}.share", parts[part] / inference, "ratio",
                       "trtexec: share of H2D + GPU compute + D2H per inference")
    ev.add("bench.engine_alone", 1, "flag", "trtexec timed the engine alone, its copies from pinned host buffers, "
           "asynchronous")
    if "enqueue" in parts:
        ev.add("bench.enqueue_ms.mean", parts["enqueue"], "ms", "trtexec: the host's time to enqueue one inference")
    if lvl.gpu_busy is not None:
        ev.add("bench.gpu_compute_walltime_share", min(1.0, lvl.gpu_busy), "ratio",
               "trtexec: total GPU compute time / total host walltime")


def derive(levels: list[BenchLevel], source: str, delayed_warnings: int = 0) -> list[Evidence]:
    lvl = _pick(levels)
    if lvl is None:
        return []
    tool = lvl.tool
    load = (f"concurrency {lvl.concurrency}" if lvl.concurrency is not None
            else f"request rate {lvl.request_rate:g}/s" if lvl.request_rate is not None else "one level")
    where = f"{tool}, {load}"
    partial = Quality.PARTIAL if not lvl.server_breakdown_complete else Quality.GOOD
    ev = Emit(source)
    ev.add("bench.levels", sum(x.tool == tool for x in levels), "count",
           f"{tool} load levels measured (the last one is reported)")
    if lvl.concurrency is not None:
        ev.add("bench.concurrency", lvl.concurrency, "requests",
               f"{tool}: requests the closed-loop client keeps in flight")
    if lvl.request_rate is not None:
        ev.add("bench.request_rate", lvl.request_rate, "requests/s", f"{tool}: offered open-loop request rate")
    if lvl.batch_size != 1:
        ev.add("bench.batch_size", lvl.batch_size, "inferences", f"{tool}: batch size of each request")
    rps = lvl.requests_per_s
    if rps is not None:
        ev.add("throughput.rps", rps, "requests/s", f"{where}: client-measured throughput")
    if lvl.request_count is not None:
        ev.add("requests.count", lvl.request_count, "requests", f"{where}: requests measured")
    if lvl.latency_mean is not None:
        ev.add("latency.e2e_ms.mean", lvl.latency_mean, "ms", f"{where}: client average latency")
    if lvl.latency_std is not None:
        ev.add("latency.e2e_ms.std", lvl.latency_std, "ms", f"{where}: client latency standard deviation")
    for name, value in sorted(lvl.percentiles.items()):
        ev.add(f"latency.e2e_ms.{name}", value, "ms", f"{where}: client latency percentile")
    if lvl.transport_ms is not None:
        ev.add("latency.transport_ms.mean", lvl.transport_ms, "ms", f"{where}: client HTTP/gRPC time")
    if lvl.transport_io_ms is not None:
        ev.add("latency.client_io_ms.mean", lvl.transport_io_ms, "ms",
               f"{where}: client sending and receiving (serialising) the request and response")
        whole = lvl.latency_mean or lvl.transport_ms
        if whole:
            ev.add("latency.client_io.share", min(1.0, lvl.transport_io_ms / whole), "ratio",
                   "client send/receive / client latency")
    if lvl.delayed or delayed_warnings:
        ev.add("bench.client_delayed", 1, "flag",
               f"{tool} warned that it could not keep up with the desired load (results less reliable)")
    if lvl.server_latency is not None:
        ev.add("latency.server_ms.mean", lvl.server_latency, "ms", f"{where}: server-side average request latency")
        parts = _ensemble_totals(ev, lvl, lvl.server_parts, where) if lvl.ensemble_totals else lvl.server_parts
        for part, value in sorted(parts.items()):
            if part != "compute":  # one undivided compute time (older perf_client) is the sum below
                ev.add(f"stage.{part}_ms.mean", value, "ms", f"{where}: server {part.replace('_', ' ')}")
        compute = [parts[k] for k in ("compute_input", "compute_infer", "compute_output", "compute") if k in parts]
        if lvl.composing_leaves and lvl.server_latency > 0:
            _ensemble(ev, lvl, where)
        elif compute:
            total = sum(compute)
            what = "compute" if "compute" in parts else "compute input + infer + output"
            ev.add("stage.compute_ms.mean", total, "ms", f"{where}: server {what}", partial)
            if lvl.server_latency > 0:
                ev.add("stage.compute.share", total / lvl.server_latency, "ratio",
                       "server compute / server request latency", partial)
        if "queue" in parts and lvl.server_latency > 0 and not lvl.composing_leaves:
            ev.add("stage.queue.share", parts["queue"] / lvl.server_latency, "ratio",
                   "server queue / server request latency")
    # trtexec times the engine alone, apart from any server's load levels: its parts are the stages unless the
    # server's level has a breakdown of its own (one request's stages, not two runs' mixed)
    trt = next((x for x in reversed(levels) if x.device_parts), None)
    if trt is not None and (trt is lvl or not (lvl.server_parts or lvl.composing_leaves)):
        _device_parts(ev, trt)
    closed = [x for x in levels if x.tool == lvl.tool and x.concurrency is not None and x.latency_mean is not None]
    if len(closed) >= 2:
        base = min(closed, key=lambda x: x.concurrency or 0)
        if base is not lvl and base.concurrency == 1 and base.latency_mean is not None:
            ev.add("bench.unloaded_latency_ms", base.latency_mean, "ms",
                   f"{tool}: mean latency at concurrency 1 (no request waits for another)")
    sweep = [LoadLevel(float(x.concurrency), x.requests_per_s, x.latency_mean) for x in closed
             if x.concurrency and x.requests_per_s]
    for key, value, unit, said in sweep_evidence(sweep, f"{tool}'s concurrency sweep"):
        ev.add(key, value, unit, said)
    if lvl.server_inferences and lvl.server_executions:
        ev.add("bench.server_batch_mean", lvl.server_inferences / lvl.server_executions, "inferences",
               f"{where}: inferences per model execution (the batch the server formed)")
    return ev.items
