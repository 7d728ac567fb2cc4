"""``diagnose fleet``: every replica's bottleneck from the metrics a Prometheus server already holds.

The fleet's data stays where it lives. This module sends PromQL that aggregates on the server —
``sum by (instance)`` of the engine gauges, ``increase()`` of the counters, ``histogram_quantile``
of ``increase()``-d buckets over the window, the DCGM fields per GPU — turns each replica's answers
into the evidence one service gets (``diagnose.derive.prom`` through a ``PromResult``,
``diagnose.derive.dcgm`` for its GPUs), runs the same rules per replica (``pipeline.judge``), and
summarises the fleet (``summarise``): which bottleneck how many replicas share, the outliers, load
imbalance and headroom. It never stores or re-scrapes the fleet.

The number of queries does not grow with the fleet: one query answers for every replica (``by
(instance)``); what grows is the size of each answer, linearly. Range queries use a step that gives
about ``TARGET_POINTS`` points per series (never over the server's 11,000).

Replicas are the distinct values of the ``--by`` labels (default ``instance``) among the engine
series. A replica Prometheus knows (``up``) whose engine series are missing, or one that was down for
the whole window, is listed with the reason and not judged; the others are judged on what they have.
A GPU is a replica's when the dcgm-exporter series name its pod (``pod``/``exported_pod`` and the
namespace), else when its ``Hostname`` is the replica's host; GPUs no replica claims are judged on
their own (``unclaimed_gpus``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from diagnose.collectors import dcgm as dcgm_fields
from diagnose.collectors.dcgm import DcgmResult, GpuSeries, Pod
from diagnose.collectors.prom import (
    ALIASES,
    Alias,
    Counter,
    Histogram,
    Kind,
    PromResult,
    all_stored_names,
    engine_of,
    name_matcher,
    stored_names,
)
from diagnose.collectors.promapi import Auth, PromApi, PromApiError, step_for
from diagnose.config import Config
from diagnose.derive import dcgm as derive_dcgm
from diagnose.derive import prom as derive_prom
from diagnose.errors import DiagnoseError, InputError
from diagnose.model import TOOL_VERSION, Category, Diagnosis, Evidence, EvidenceSet, Severity, Verdict
from diagnose.units import pct

SCHEMA = "diagnose/fleet/v1"
DEFAULT_WINDOW_S = 900.0
TARGET_POINTS = 120  # per range series: enough for means and percentiles of a window, cheap for 10k replicas
SERIES_POINTS = 60  # per series kept in the document for the drill-down charts
DEFAULT_SCRAPE_S = 15.0  # Prometheus's default scrape interval, when the data cannot tell
QUANTILES = (0.5, 0.9, 0.99)
# outliers and summaries (each threshold with its reason)
QUEUE_OUTLIER_FACTOR = 10.0  # a queue ten times the fleet's median is a replica problem, not load
QUEUE_OUTLIER_MIN = 1.0  # ... and at least one request waiting on average (10 × 0 is still 0)
THROTTLE_OUTLIER = 0.2  # GPU003's bar: throttled in a fifth of the readings
FOREIGN_MEMORY_SHARE = 0.25  # GPU005's bar: a quarter of the device held by someone else
IMBALANCE_FACTOR = 1.5  # the busiest replica takes 1.5 × the median's requests: the balancer is uneven
IMBALANCE_MIN_RPS = 0.1  # below this the fleet is idle and shares mean nothing
KV_NEAR_FULL = 0.9  # KV cache peaking above 90 %: little headroom before preemption/queueing
DCGM_SOURCE = "dcgm-exporter"
# the evidence a failed query would have given (its keys are then missing with the server's reason)
FAILED_PREFIXES: dict[str, tuple[str, ...]] = {
    "gauge running": ("serving.running",),
    "gauge waiting": ("serving.waiting", "serving.queued", "serving.stat_samples"),
    "gauge kv_usage": ("serving.kv_cache",),
    "gauge swapped": ("serving.swapped",),
    "counter requests_success": ("throughput.rps",),
    "counter preemptions": ("serving.preemptions",),
    "counter prompt_tokens": ("serving.prompt_tokens",),
    "counter generation_tokens": ("serving.generation_tokens",),
    "histogram ttft": ("latency.ttft_ms",),
    "histogram itl": ("latency.itl_ms",),
    "histogram e2e": ("latency.e2e_ms", "requests.count", "stage."),
    "histogram queue": ("stage.queue",),
    "histogram prefill": ("stage.prefill",),
    "histogram decode": ("stage.decode",),
    "finding DCGM series": ("gpu.", "gpm.", "pcie."),
}


@dataclass(frozen=True)
class FleetOptions:
    url: str
    window_s: float = DEFAULT_WINDOW_S
    at: float | None = None  # end of the window (default: now)
    selector: str = ""  # PromQL matchers for the engine series, e.g. '{job="vllm"}'
    gpu_selector: str = ""  # the same for the dcgm-exporter series
    by: tuple[str, ...] = ("instance",)
    timeout_s: float = 30.0
    auth: Auth = field(default_factory=Auth)
    ca_file: str | None = None
    insecure: bool = False
    step_s: float | None = None


@dataclass(eq=False)
class Replica:
    """One replica's answers, its evidence and its diagnosis."""

    key: tuple[str, ...]
    labels: dict[str, str]
    names: set[str] = field(default_factory=set)
    gauges: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, dict[str, Any]] = field(default_factory=dict)
    rps_series: list[tuple[float, float]] = field(default_factory=list)
    up_ratio: float | None = None
    memory_ratio: float | None = None  # vLLM gpu_memory_utilization
    gpus: list[GpuSeries] = field(default_factory=list)
    missing: str = ""
    diagnosis: Diagnosis | None = None
    evidence: EvidenceSet | None = None

    @property
    def name(self) -> str:
        return ",".join(v for v in self.key if v) or "(no label)"

    @property
    def engines(self) -> tuple[str, ...]:
        return tuple(sorted({e for n in self.names if (e := engine_of(n))}))

    @property
    def pod(self) -> Pod | None:
        pod = self.labels.get("pod") or self.labels.get("kubernetes_pod_name") or ""
        namespace = self.labels.get("namespace") or self.labels.get("kubernetes_namespace") or ""
        return Pod(namespace, pod) if pod else None

    @property
    def host(self) -> str:
        inst = self.labels.get("instance", "")
        host = inst.rsplit(":", 1)[0] if inst.count(":") == 1 or inst.startswith("[") else inst
        return self.labels.get("node") or self.labels.get("kubernetes_node") or host.strip("[]")


@dataclass
class FleetData:
    url: str
    start: float
    end: float
    step_s: float
    scrape_s: float
    by: tuple[str, ...]
    selector: str
    replicas: dict[tuple[str, ...], Replica]
    dcgm: DcgmResult | None
    problems: list[str]
    queries: int = 0
    bytes: int = 0
    unclaimed: list[tuple[GpuSeries, Diagnosis]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # queries the server could not answer: what → why


# -- parsing the command line's values --------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)?$")
_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``15m`` → 900.0; a plain number is seconds."""
    m = _DURATION.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"--window {text!r} is not a duration.", "Write it like 15m, 1h, 900s or 900.")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_time(text: str | None, now: Callable[[], float] = time.time) -> float:
    """``--at``: ``now``, Unix seconds, or an RFC 3339 / ISO time (``2025-06-02T10:00:00Z``)."""
    if text is None or text.strip().lower() in ("", "now"):
        return now()
    t = text.strip()
    try:
        return float(t)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InputError(f"--at {text!r} is not a time.", "Use now, Unix seconds, or 2025-06-02T10:00:00Z.") from exc
    if dt.tzinfo is None:
        raise InputError(f"--at {text!r} has no time zone.", "Add Z (UTC) or an offset: 2025-06-02T10:00:00Z.")
    return dt.timestamp()


_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def parse_selector(text: str, flag: str = "--selector") -> str:
    """``{job="vllm", namespace=~"llm-.*"}`` → the matchers inside the braces (checked), or ``""``."""
    t = (text or "").strip()
    if not t:
        return ""
    if not (t.startswith("{") and t.endswith("}")):
        raise InputError(f"{flag} {text!r} is not a PromQL label selector.",
                         f"Put label matchers in braces: {flag} '{{job=\"vllm\"}}'.")
    inner = t[1:-1].strip().rstrip(",")
    pos = 0
    while pos < len(inner):
        m = _MATCHER.match(inner, pos)
        if not m or m.end() == pos:
            raise InputError(f"{flag} {text!r} is not a PromQL label selector (at {inner[pos:pos + 30]!r}).",
                             f"Write matchers like label=\"value\" or label=~\"regex\": {flag} '{{job=\"vllm\"}}'.")
        if m.group(1) == "__name__":
            raise InputError(f"{flag} may not choose metric names (__name__).",
                             "diagnose picks the engine and DCGM metrics itself; select replicas by labels.")
        pos = m.end()
    return inner


def _sel(names: Iterable[str], matchers: str) -> str:
    return "{" + name_matcher(names) + (f", {matchers}" if matchers else "") + "}"


# -- asking the server ----------------------------------------------------------------------------------


class _Ask:
    """The API, counting queries, turning per-query failures into problems (a partial answer)."""

    def __init__(self, api: PromApi, problems: list[str], failed: dict[str, str]) -> None:
        self.api = api
        self.problems = problems
        self.failed = failed  # what → the server's reason, for the evidence those answers would have given

    def instant(self, expr: str, at: float, what: str) -> list[dict[str, Any]]:
        return self._ask(lambda: self.api.query(expr, at), what)

    def range(self, expr: str, start: float, end: float, step: float, what: str) -> list[dict[str, Any]]:
        return self._ask(lambda: self.api.query_range(expr, start, end, step), what)

    def _ask(self, query: Callable[[], list[dict[str, Any]]], what: str) -> list[dict[str, Any]]:
        """The answer, or (a query the server refused) nothing, with the reason kept as a problem."""
        try:
            return query()
        except PromApiError as exc:
            if exc.kind != "query":
                raise
            self.problems.append(f"{what}: {exc.detail}")
            self.failed.setdefault(what, exc.detail)
            return []


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


def _to_error(exc: PromApiError) -> DiagnoseError:
    return InputError(exc.message or "the Prometheus query failed.", exc.remedy)


def collect(opts: FleetOptions, *, now: Callable[[], float] = time.time) -> FleetData:
    """Ask the server (see the module docstring); raises ``DiagnoseError`` when it cannot be asked at all."""
    try:
        api = PromApi(opts.url, auth=opts.auth, timeout_s=opts.timeout_s, ca_file=opts.ca_file,
                      insecure=opts.insecure)
    except PromApiError as exc:
        raise _to_error(exc) from exc
    end = opts.at if opts.at is not None else now()
    start = end - opts.window_s
    problems: list[str] = []
    failed: dict[str, str] = {}
    ask = _Ask(api, problems, failed)
    by = opts.by
    by_list = ", ".join(by)
    w = f"{round(opts.window_s)}s"
    try:
        api.query("vector(1)", end)  # is this a query API at all, and may we ask it
        step = opts.step_s or step_for(opts.window_s, TARGET_POINTS)
        replicas: dict[tuple[str, ...], Replica] = {}

        def replica(metric: Mapping[str, str], create: bool = True) -> Replica | None:
            key = tuple(str(metric.get(b, "")) for b in by)
            if not any(key):
                return None
            rep = replicas.get(key)
            if rep is None and create:
                rep = replicas[key] = Replica(key, {b: str(metric.get(b, "")) for b in by})
            return rep

        # discovery: which engine families each replica exposes, and its pod/namespace/node labels
        ctx = ("pod", "namespace", "node", "kubernetes_pod_name", "kubernetes_namespace", "kubernetes_node",
               "instance", "job")
        group = ", ".join(dict.fromkeys(("__name__", *by, *ctx)))
        for item in ask.instant(f"count by ({group}) ({_sel(all_stored_names(), opts.selector)})", end,
                                "finding the engine series"):
            m = item.get("metric", {})
            rep = replica(m)
            if rep is None:
                continue
            rep.names.add(str(m.get("__name__", "")))
            for k in ctx:
                if m.get(k) and k not in rep.labels:
                    rep.labels[k] = str(m[k])
        # the targets Prometheus scraped in the window, and how often the scrape worked
        up_sel = "{" + ", ".join(p for p in ('__name__="up"', opts.selector) if p) + "}"
        engine_jobs = {r.labels.get("job", "") for r in replicas.values()}
        for item in ask.instant(f"avg_over_time({up_sel}[{w}])", end, "reading up"):
            m = item.get("metric", {})
            if not all(m.get(b) for b in by):
                continue  # `up` lacks a --by label (model_name …): replicas come from the engine series only
            if not opts.selector and str(m.get("job", "")) not in engine_jobs:
                continue  # with no selector, only the jobs that scrape engines (not node or DCGM exporters)
            rep = replica(m)
            if rep is not None:
                rep.up_ratio = _num(item.get("value", [0, None])[1])
                for k in ctx:
                    if m.get(k) and k not in rep.labels:
                        rep.labels[k] = str(m[k])
        present = {n for r in replicas.values() for n in r.names}
        scrape_s = _scrape_interval(ask, present, opts.selector, end, opts.window_s)
        rate_range = f"{int(max(4 * scrape_s, 2 * step))}s"
        _gauges(ask, replica, present, opts.selector, by_list, start, end, step)
        _counters(ask, replica, present, opts.selector, by_list, w, end, start, step, rate_range)
        _histograms(ask, replica, present, opts.selector, by_list, w, end)
        cache_info = _sel(["vllm:cache_config_info"], opts.selector)
        for item in ask.instant(f"max by ({by_list}, gpu_memory_utilization) ({cache_info})", end,
                                "reading vllm:cache_config_info"):
            m = item.get("metric", {})
            rep = replica(m, create=False)
            if rep is not None:
                rep.memory_ratio = _num(m.get("gpu_memory_utilization"))
        dcgm = _dcgm(ask, opts.gpu_selector, start, end, step)
    except PromApiError as exc:
        raise _to_error(exc) from exc
    return FleetData(url=api.shown, start=start, end=end, step_s=step, scrape_s=scrape_s, by=by,
                     selector=opts.selector, replicas=replicas, dcgm=dcgm, problems=problems,
                     queries=api.stats.requests, bytes=api.stats.bytes, failed=failed)


def _scrape_interval(ask: _Ask, present: set[str], selector: str, end: float, window_s: float) -> float:
    """The scrape interval, from how many samples one engine series holds in the window."""
    gauges = [n for a in ALIASES if a.kind is Kind.GAUGE for n in a.names if n in present]
    if not gauges:
        return DEFAULT_SCRAPE_S
    got = ask.instant(f"max(count_over_time({_sel(gauges[:1], selector)}[{int(window_s)}s]))", end,
                      "estimating the scrape interval")
    n = _num(got[0]["value"][1]) if got else None
    return window_s / n if n and n >= 2 else DEFAULT_SCRAPE_S


Find = Callable[[Mapping[str, str], bool], "Replica | None"]


def _present(a: Alias, part: str, present: set[str]) -> list[str]:
    return [n for n in stored_names(a).get(part, ()) if n in present]


def _gauges(ask: _Ask, replica: Find, present: set[str], sel: str, by: str, start: float, end: float,
            step: float) -> None:
    for a in ALIASES:
        if a.kind is not Kind.GAUGE:
            continue
        names = _present(a, "value", present)
        if not names:
            continue
        agg = "max" if a.combine == "max" else "sum"
        for item in ask.range(f"{agg} by ({by}) ({_sel(names, sel)})", start, end, step, f"gauge {a.canonical}"):
            rep = replica(item.get("metric", {}), False)
            if rep is None:
                continue
            pts = [(float(t), v) for t, raw in item.get("values", ()) if (v := _num(raw)) is not None]
            rep.gauges.setdefault(a.canonical, []).extend(pts)


def _counters(ask: _Ask, replica: Find, present: set[str], sel: str, by: str, w: str, end: float, start: float,
              step: float, rate_range: str) -> None:
    for a in ALIASES:
        if a.kind is not Kind.COUNTER:
            continue
        names = _present(a, "total", present)
        if not names:
            continue
        for item in ask.instant(f"sum by ({by}) (increase({_sel(names, sel)}[{w}]))", end, f"counter {a.canonical}"):
            rep = replica(item.get("metric", {}), False)
            v = _num(item.get("value", [0, None])[1])
            if rep is not None and v is not None:
                rep.counters[a.canonical] = rep.counters.get(a.canonical, 0.0) + v * a.scale
        if a.canonical == "requests_success":
            for item in ask.range(f"sum by ({by}) (rate({_sel(names, sel)}[{rate_range}]))", start, end, step,
                                  "request rate"):
                rep = replica(item.get("metric", {}), False)
                if rep is not None:
                    rep.rps_series = [(float(t), v) for t, raw in item.get("values", ())
                                      if (v := _num(raw)) is not None]


def _histograms(ask: _Ask, replica: Find, present: set[str], sel: str, by: str, w: str, end: float) -> None:
    for a in ALIASES:
        if a.kind is not Kind.HISTOGRAM:
            continue
        buckets = _present(a, "bucket", present)
        if not buckets:
            continue
        sums, counts = _present(a, "sum", present), _present(a, "count", present)
        parts: list[tuple[str, str]] = [
            (f"q{q}", f"histogram_quantile({q}, sum by ({by}, le) (increase({_sel(buckets, sel)}[{w}])))")
            for q in QUANTILES]
        if sums:
            parts.append(("sum", f"sum by ({by}) (increase({_sel(sums, sel)}[{w}]))"))
        if counts:
            parts.append(("count", f"sum by ({by}) (increase({_sel(counts, sel)}[{w}]))"))
        for part, expr in parts:
            for item in ask.instant(expr, end, f"histogram {a.canonical}"):
                rep = replica(item.get("metric", {}), False)
                v = _num(item.get("value", [0, None])[1])
                if rep is None or v is None:
                    continue
                h = rep.histograms.setdefault(a.canonical, {"quantiles": {}})
                if part.startswith("q"):
                    h["quantiles"][float(part[1:])] = v * a.scale
                elif part == "sum":
                    h["sum"] = h.get("sum", 0.0) + v * a.scale
                else:
                    h["count"] = h.get("count", 0.0) + v


def _dcgm(ask: _Ask, gpu_selector: str, start: float, end: float, step: float) -> DcgmResult | None:
    """Every DCGM series the server holds (per GPU, not aggregated: each GPU is judged), one field at a time."""
    names = [n for f in dcgm_fields.FIELDS for n in f.names]
    found = ask.instant(f"count by (__name__) ({_sel(names, gpu_selector)})", end, "finding DCGM series")
    have = {str(i.get("metric", {}).get("__name__", "")) for i in found}
    reader = dcgm_fields.QueryResultReader()
    for f in dcgm_fields.FIELDS:
        wanted = [n for n in f.names if n in have]
        if wanted:  # one field per query, parsed before the next: one answer's JSON in memory at a time
            reader.add("matrix", ask.range(_sel(wanted, gpu_selector), start, end, step, f"DCGM {f.canonical}"))
    got = reader.result()
    return got if got.gpus else None


# -- judging ------------------------------------------------------------------------------------------


def _prom_result(rep: Replica, window_s: float) -> PromResult:
    gauges = {c: tuple(v for _, v in sorted(pts)) for c, pts in rep.gauges.items() if pts}
    counters = {c: Counter(first=0.0, last=v, windowed=True) for c, v in rep.counters.items()}
    hists = {}
    for c, h in rep.histograms.items():
        count = float(h.get("count", 0.0))
        hists[c] = Histogram(count=count, total=float(h.get("sum", 0.0)), quantiles=dict(h["quantiles"]),
                             windowed=True)
    n = max((len(v) for v in gauges.values()), default=0)
    return PromResult(scrapes=max(2, n), window_s=window_s, engines=rep.engines, gauges=gauges, counters=counters,
                      histograms=hists, truncated=False, bad_lines=0)


def _match_gpus(data: FleetData) -> list[GpuSeries]:
    """Give each replica its GPUs; returns the GPUs no replica claims."""
    if data.dcgm is None:
        return []
    by_pod: dict[tuple[str, str], list[Replica]] = {}
    by_host: dict[str, list[Replica]] = {}
    for rep in data.replicas.values():
        if rep.pod is not None:
            by_pod.setdefault((rep.pod.namespace, rep.pod.pod), []).append(rep)
            by_pod.setdefault(("", rep.pod.pod), []).append(rep)
        if rep.host:
            by_host.setdefault(rep.host, []).append(rep)
    unclaimed = []
    for g in data.dcgm.gpus:
        owners: list[Replica] = []
        for p in g.pods:
            owners += by_pod.get((p.namespace, p.pod), []) or by_pod.get(("", p.pod), [])
        if not owners and g.gpu.hostname:
            owners = by_host.get(g.gpu.hostname, [])
        for rep in dict.fromkeys(owners):
            rep.gpus.append(g)
        if not owners:
            unclaimed.append(g)
    return unclaimed


def judge_fleet(data: FleetData, config: Config | Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Evidence and a diagnosis for every replica that has engine series (in place)."""
    from diagnose.pipeline import judge

    window_s = data.end - data.start
    span = f"over the {window_s:.0f} s window on the Prometheus server"
    source = f"prometheus {data.url}"
    unclaimed = _match_gpus(data)
    for rep in data.replicas.values():
        if not rep.names:
            rep.missing = ("Prometheus could not scrape it during the window (up = 0)" if rep.up_ratio == 0 else
                           "it exposes none of the engine metrics diagnose reads (vLLM, SGLang, TGI, Triton names)"
                           + (f"; its scrapes succeeded {pct(rep.up_ratio)} of the window" if rep.up_ratio else ""))
            continue
        items = derive_prom.derive(_prom_result(rep, window_s), source, span=span)
        if rep.up_ratio is not None and rep.up_ratio < 1.0:
            items.append(Evidence("serving.scrape_success_ratio", rep.up_ratio, "ratio", source,
                                  detail="share of the window Prometheus scraped it successfully (avg of up)"))
        if rep.gpus and data.dcgm is not None:
            items += derive_dcgm.derive(data.dcgm, DCGM_SOURCE, gpus=rep.gpus,
                                        target_pods=[rep.pod] if rep.pod else [],
                                        engine_memory_ratio=rep.memory_ratio)
        ev = EvidenceSet(items)
        for what, why in data.failed.items():
            for prefix in FAILED_PREFIXES.get(what, ("",)):
                if prefix:
                    ev.explain_missing(prefix, f"the server could not answer the query for {what} ({why})")
        if not rep.gpus:
            ev.explain_missing("gpu.", "no dcgm-exporter series name this replica's pod or host")
            ev.explain_missing("gpm.", "no dcgm-exporter series name this replica's pod or host")
            ev.explain_missing("pcie.", "no dcgm-exporter series name this replica's pod or host")
        for prefix in ("conn.", "workers.", "cpu.", "proc."):
            ev.explain_missing(prefix, "a fleet view has no per-process evidence: attach to one replica "
                               "(`diagnose attach --pid PID`) for it")
        rep.evidence = ev
        d = judge(ev, config=config)
        if data.failed and d.overall is Verdict.HEALTHY:
            # a partial answer cannot clear a replica: what the failed queries held was never judged
            d = dataclasses.replace(d, verdict=Verdict.UNDETERMINED, next_steps=(
                "Run diagnose fleet again when the server answers every query (" + "; ".join(data.failed) + " failed: "
                "raise --timeout, shorten --window, or narrow --selector)", *d.next_steps))
        rep.diagnosis = d
    data.unclaimed = []
    if data.dcgm is not None:
        for g in unclaimed:
            ev = EvidenceSet(derive_dcgm.derive(data.dcgm, DCGM_SOURCE, gpus=[g]))
            data.unclaimed.append((g, judge(ev, config=config)))


# -- the fleet summary -----------------------------------------------------------------------------


def _val(rep: Replica, key: str) -> float | None:
    return rep.evidence.value(key) if rep.evidence is not None else None


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


def _top(d: Diagnosis) -> Any:
    return next((f for f in d.findings if f.severity is not Severity.INFO), None)


def outliers(replicas: Sequence[Replica]) -> list[dict[str, Any]]:
    """Replicas whose problem is their own: throttling, XIDs, another tenant's memory, a queue ≫ the median."""
    judged = [r for r in replicas if r.diagnosis is not None]
    out: list[dict[str, Any]] = []
    waits = [w for r in judged if (w := _val(r, "serving.waiting_mean")) is not None]
    median_wait = _median(waits)
    throttled = [r for r in judged if (_val(r, "gpu.throttle_ratio") or 0.0) >= THROTTLE_OUTLIER
                 or any(f.code == "GPU003" for f in (r.diagnosis.findings if r.diagnosis else ()))]
    with_gpu = [r for r in judged if _val(r, "gpu.throttle_ratio") is not None]
    # throttling on most of three or more GPUs is the fleet's (a power policy, a hot row), not an outlier
    fleet_wide = len(with_gpu) >= 3 and len(throttled) >= len(with_gpu) / 2
    for r in judged:
        d = r.diagnosis
        assert d is not None
        codes = {f.code: f for f in d.findings}
        t = _val(r, "gpu.throttle_ratio")
        if r in throttled and not fleet_wide:
            f = codes.get("GPU003")
            out.append({"instance": r.name, "kind": "throttling", "value": t,
                        "median": _median([_val(x, "gpu.throttle_ratio") or 0.0 for x in with_gpu]),
                        "message": f.title + ": " + f.message if f else
                        f"throttled in {pct(t or 0)} of its GPU readings"})
        ev = r.evidence
        xids = ev.get("gpu.xid_events") if ev is not None else None
        if isinstance(xids, Evidence) and isinstance(xids.value, list) and xids.value:
            codes_ = sorted({int(x.get("xid", 0)) for x in xids.value if isinstance(x, dict)})
            out.append({"instance": r.name, "kind": "xid", "value": len(xids.value), "median": 0,
                        "message": f"GPU XID error(s) {', '.join(map(str, codes_))} reported by the driver "
                                   "(DCGM_FI_DEV_XID_ERRORS): check `dmesg` on the node; XID 79/48/63/64/94/95 need "
                                   "the GPU drained"})
        share = _val(r, "mem.other_processes_share_ratio")
        pods = ev.get("gpu.other_pods") if ev is not None else None
        if (share is not None and share >= FOREIGN_MEMORY_SHARE) or "GPU005" in codes:
            f = codes.get("GPU005")
            out.append({"instance": r.name, "kind": "foreign_memory", "value": share, "median": None,
                        "message": f.message if f else f"{pct(share or 0)} of its GPU's memory is held by others"})
        elif isinstance(pods, Evidence) and pods.value:
            out.append({"instance": r.name, "kind": "foreign_memory", "value": None, "median": None,
                        "message": f"its GPU is shared with {', '.join(map(str, pods.value))}: another tenant "
                                   "uses the same device's memory and compute"})
        w = _val(r, "serving.waiting_mean")
        if w is not None and w >= max(QUEUE_OUTLIER_MIN, QUEUE_OUTLIER_FACTOR * median_wait) and len(waits) >= 2:
            out.append({"instance": r.name, "kind": "queue", "value": w, "median": median_wait,
                        "message": f"{w:.1f} requests waiting on average, {QUEUE_OUTLIER_FACTOR:.0f}× or more the "
                                   f"fleet's median of {median_wait:.1f}: this replica, not the load, is the problem "
                                   "(a slow GPU, a stuck request, a balancer that favours it)"})
    return out


def imbalance(replicas: Sequence[Replica]) -> dict[str, Any]:
    """How evenly the balancer spreads requests: throughput per replica against the median."""
    rates = [(r.name, v) for r in replicas if r.diagnosis is not None and (v := _val(r, "throughput.rps")) is not None]
    if len(rates) < 2:
        return {"metric": "throughput.rps", "replicas": len(rates), "imbalanced": False,
                "message": "fewer than two replicas report a request rate: balance cannot be judged"}
    vals = [v for _, v in rates]
    med = _median(vals)
    mean = sum(vals) / len(vals)
    cv = statistics.pstdev(vals) / mean if mean > 0 else 0.0
    busiest = max(rates, key=lambda x: x[1])
    quietest = min(rates, key=lambda x: x[1])
    bad = med >= IMBALANCE_MIN_RPS and (busiest[1] >= IMBALANCE_FACTOR * med or quietest[1] <= med / IMBALANCE_FACTOR)
    msg = (f"requests per second per replica: median {med:.2f}, busiest {busiest[0]} {busiest[1]:.2f}, quietest "
           f"{quietest[0]} {quietest[1]:.2f} (coefficient of variation {pct(cv)})")
    msg += (": the load is uneven — check the balancer's policy (least-requests over round-robin for long LLM "
            "requests), session affinity and readiness" if bad else ": balanced")
    return {"metric": "throughput.rps", "replicas": len(rates), "median": med, "min": quietest[1], "max": busiest[1],
            "busiest": busiest[0], "quietest": quietest[0], "cv": cv, "imbalanced": bad, "message": msg}


def headroom(replicas: Sequence[Replica]) -> dict[str, Any]:
    """How much room is left before requests queue: KV-cache peaks, and who had requests waiting."""
    judged = [r for r in replicas if r.diagnosis is not None]
    kv = [(r.name, v) for r in judged if (v := _val(r, "serving.kv_cache_usage_max_ratio")) is not None]
    queued = [r.name for r in judged if (_val(r, "serving.waiting_max") or 0.0) > 0]
    out: dict[str, Any] = {"replicas": len(judged), "queued_replicas": queued}
    parts = []
    if kv:
        full = [n for n, v in kv if v >= KV_NEAR_FULL]
        worst = max(kv, key=lambda x: x[1])
        out["kv_cache"] = {"median_peak": _median([v for _, v in kv]), "max_peak": worst[1], "fullest": worst[0],
                           "near_full": full, "min_headroom": 1.0 - worst[1]}
        parts.append(f"KV cache peaked at {pct(worst[1])} on {worst[0]} (median peak "
                     f"{pct(_median([v for _, v in kv]))}); {len(full)} of {len(kv)} replicas ≥ {pct(KV_NEAR_FULL)}")
    parts.append(f"{len(queued)} of {len(judged)} replicas had requests waiting in the window")
    out["message"] = "; ".join(parts)
    return out


def summarise(data: FleetData) -> dict[str, Any]:
    """The fleet document (schema ``diagnose/fleet/v1``)."""
    reps = sorted(data.replicas.values(), key=_order)
    judged = [r for r in reps if r.diagnosis is not None]
    tally: Tally[str] = Tally()
    for r in judged:
        d = r.diagnosis
        assert d is not None
        tally[d.primary.value if d.primary else d.overall.value] += 1
    weight: dict[str, float] = {}
    for r in judged:
        top = _top(r.diagnosis) if r.diagnosis is not None else None
        if top is not None:
            weight[top.label] = weight.get(top.label, 0.0) + top.score
    # most replicas first; on a tie, the heavier findings (severity × impact × confidence) first
    bottlenecks = sorted(((c, n) for c, n in tally.items() if c in Category._value2member_map_),
                         key=lambda cn: (-cn[1], -weight.get(cn[0], 0.0), cn[0]))
    primary = bottlenecks[0][0] if bottlenecks else None
    if primary is not None:
        verdict = Verdict.BOTTLENECK
    elif judged and all(r.diagnosis is not None and r.diagnosis.overall is Verdict.HEALTHY for r in judged):
        verdict = Verdict.HEALTHY
    else:
        verdict = Verdict.UNDETERMINED
    out_list = outliers(judged)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "tool_version": TOOL_VERSION,
        "prometheus": data.url,
        "window": {"start": data.start, "end": data.end, "seconds": data.end - data.start},
        "step_s": data.step_s,
        "scrape_interval_s": data.scrape_s,
        "selector": data.selector,
        "by": list(data.by),
        "primary": primary,
        "verdict": verdict.value,
        "counts": dict(tally.most_common()),
        "summary": _headline(primary, tally, len(judged), len(reps)),
        "replicas": [_replica_doc(r) for r in reps],
        "outliers": out_list,
        "imbalance": imbalance(judged),
        "headroom": headroom(judged),
        "unclaimed_gpus": [_gpu_doc(g, d) for g, d in data.unclaimed],
        "where_to_look": [],
        "problems": list(data.problems),
        "queries": data.queries,
        "bytes": data.bytes,
    }
    doc["where_to_look"] = where_to_look(doc)
    return doc


def _order(r: Replica) -> tuple[int, float, str]:
    d = r.diagnosis
    if d is None:
        return (5, 0.0, r.name)
    top = _top(d)
    return (3 - top.severity.rank if top else 4, -(top.score if top else 0.0), r.name)


def _headline(primary: str | None, tally: Tally[str], judged: int, total: int) -> str:
    parts = [f"{n} {c}" for c, n in tally.most_common()]
    unjudged = total - judged
    shared = primary is not None and sum(1 for n in tally.values() if n == tally[primary]) == 1
    if primary is None:
        text = f"no bottleneck named on the {judged} judged replica(s)"
    elif shared:
        text = f"{primary} is the bottleneck most replicas share ({tally[primary]} of {judged} judged)"
    else:
        text = (f"no single bottleneck dominates; {primary} ranks first by severity ({tally[primary]} of "
                f"{judged} judged)")
    text += f": {', '.join(parts)}" if parts else ""
    if unjudged:
        text += f"; {unjudged} replica(s) could not be judged"
    return text


KEY_NUMBERS = ("throughput.rps", "latency.e2e_ms.p99", "latency.ttft_ms.p99", "stage.queue_ms.p99",
               "serving.running_mean", "serving.waiting_mean", "serving.kv_cache_usage_max_ratio",
               "gpu.util_ratio", "gpm.sm_activity_ratio", "gpu.throttle_ratio", "gpu.memory_used_bytes")


def _replica_doc(r: Replica) -> dict[str, Any]:
    d = r.diagnosis
    doc: dict[str, Any] = {"instance": r.name, "labels": dict(r.labels), "engines": list(r.engines),
                           "gpus": [g.gpu.label for g in r.gpus]}
    if d is None:
        doc.update({"primary": None, "verdict": None, "severity": None, "title": "", "missing": r.missing,
                    "evidence": {}, "findings": [], "series": {}})
        return doc
    top = _top(d)
    ev = r.evidence
    numbers = {}
    if ev is not None:
        for e in ev:
            if isinstance(e.value, int | float) and not isinstance(e.value, bool) and math.isfinite(float(e.value)):
                numbers[e.key] = round(float(e.value), 6)
    doc.update({
        "primary": d.primary.value if d.primary else None,
        "verdict": d.overall.value,
        "severity": top.severity.value if top else None,
        "title": top.title if top else "",
        "missing": "",
        "key_numbers": {k: numbers[k] for k in KEY_NUMBERS if k in numbers},
        "evidence": numbers,
        "findings": [{"code": f.code, "category": f.label, "severity": f.severity.value,
                      "title": f.title, "message": f.message, "impact": round(f.impact, 4)} for f in d.findings],
        "next_steps": list(d.next_steps),
        "skipped": len(d.skipped),
        "series": _series(r),
    })
    return doc


def _thin(pts: Sequence[tuple[float, float]], n: int = SERIES_POINTS) -> list[list[float]]:
    if len(pts) <= n:
        return [[t, v] for t, v in pts]
    stride = len(pts) / n
    return [[pts[int(i * stride)][0], pts[int(i * stride)][1]] for i in range(n)]


def _series(r: Replica) -> dict[str, list[list[float]]]:
    out = {f"serving.{c}": _thin(sorted(pts)) for c, pts in r.gauges.items() if pts}
    if r.rps_series:
        out["throughput.rps"] = _thin(r.rps_series)
    util: dict[float, list[float]] = {}
    for g in r.gpus:
        for ts, v in g.points.get("util", ()):
            if ts is not None:
                util.setdefault(ts, []).append(v)
    if util:
        out["gpu.util_ratio"] = _thin([(t, sum(v) / len(v)) for t, v in sorted(util.items())])
    return out


def _gpu_doc(g: GpuSeries, d: Diagnosis) -> dict[str, Any]:
    top = _top(d)
    return {"gpu": g.gpu.label, "uuid": g.gpu.uuid, "pods": [p.name for p in g.pods], "labels": dict(g.gpu.labels),
            "primary": d.primary.value if d.primary else None, "verdict": d.overall.value,
            "title": top.title if top else "", "findings": [f.code for f in d.findings]}


def where_to_look(doc: Mapping[str, Any]) -> list[str]:
    """The first things to open, most useful first."""
    tips: list[str] = []
    for o in doc.get("outliers", ())[:5]:
        tips.append(f"{o['instance']}: {o['kind'].replace('_', ' ')} — {o['message'].split('. ')[0]}")
    primary = doc.get("primary")
    if primary:
        worst = next((r for r in doc.get("replicas", ()) if r.get("primary") == primary), None)
        if worst is not None:
            tips.append(f"{worst['instance']}: the worst of the {doc['counts'].get(primary, 0)} replica(s) with "
                        f"{primary} — {worst['title']}; attach there for the process view: `diagnose attach --pid "
                        "PID` on that host")
    if doc.get("imbalance", {}).get("imbalanced"):
        tips.append(doc["imbalance"]["message"])
    missing = [r for r in doc.get("replicas", ()) if r.get("missing")]
    if missing:
        tips.append(f"{len(missing)} replica(s) not judged: " + "; ".join(f"{r['instance']} ({r['missing']})"
                                                                          for r in missing[:3]))
    return tips


def run(opts: FleetOptions, config: Config | Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Collect, judge and summarise: the fleet document."""
    data = collect(opts)
    if not data.replicas and "finding the engine series" in data.failed:
        raise InputError(f"Prometheus at {data.url} could not answer the query that finds the engine series "
                         f"({data.failed['finding the engine series']}).",
                         "Narrow --selector or shorten --window, or raise the server's query limits.")
    if not data.replicas:
        sel = f" matching {{{opts.selector}}}" if opts.selector else ""
        raise InputError(f"Prometheus at {data.url} holds no engine series{sel} in the "
                         f"{opts.window_s:.0f} s window ending {datetime.fromtimestamp(data.end).isoformat()}.",
                         "Check --selector, --window and --at, and that Prometheus scrapes the engines' /metrics "
                         "(vLLM, SGLang --enable-metrics, TGI, Triton :8002).")
    judge_fleet(data, config)
    doc = summarise(data)
    if isinstance(config, Config) and config:
        doc["config"] = config.to_json()
    return doc
