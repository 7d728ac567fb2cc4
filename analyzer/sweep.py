"""``diagnose sweep URL``: the playbook's concurrency ladder against a live endpoint, and its knee.

At each step (1, 2, 4, 8, …) ``concurrency`` closed-loop clients (``diagnose.collectors.loadclient``, one
asyncio thread) load the endpoint: a warm-up that is discarded, then ``duration`` seconds measured:
p50/p90/p99 latency, throughput, errors, and for streamed LLM answers time to first token, time per
output token, inter-token latency and tokens per second. The client reports its own CPU and warns
when it fills a core (then it, not the service, may be the limit).

The knee (``find_knee``): the lowest concurrency whose throughput is within ``KNEE_WITHIN`` (5 %) of
the best step's, provided p99 then grows past ``p99_bound`` × its value there at a higher step — the
point where adding clients only adds waiting. With ``--pid`` the service is attached at the knee's
concurrency and diagnosed (``diagnose.attach``), so the sweep names why it saturates.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from diagnose.collectors.loadclient import RequestSpec, StepResult, Target, TargetError, probe, run_step
from diagnose.errors import InputError
from diagnose.model import TOOL_VERSION, Capture, CaptureStatus, Window
from diagnose.stats import quantile
from diagnose.units import pct

SCHEMA = "diagnose/sweep/v1"
KNEE_WITHIN = 0.05  # throughput within 5 % of the best: the service gives no more
DEFAULT_P99_BOUND = 2.0  # p99 doubling past the saturating step: clients now only wait
CLIENT_CPU_WARN = 0.85  # the client used 85 % of a core: it may limit the step, not the service
MAX_CONCURRENCY = 4096
MAX_STEPS = 24
MAX_DURATION_S = 600.0
MAX_WARMUP_S = 5.0
_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
          "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor")


@dataclass(frozen=True)
class SweepOptions:
    url: str
    concurrency: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    duration_s: float = 20.0
    warmup_s: float | None = None
    method: str | None = None
    body: bytes | None = None
    headers: tuple[tuple[str, str], ...] = ()
    openai: bool = False
    model: str = ""
    prompt_tokens: int = 128
    max_tokens: int = 64
    timeout_s: float = 60.0
    p99_bound: float = DEFAULT_P99_BOUND
    pid: int | None = None
    attach_duration_s: float = 10.0
    insecure: bool = False  # https without verifying the certificate

    @property
    def warmup(self) -> float:
        return self.warmup_s if self.warmup_s is not None else min(MAX_WARMUP_S, self.duration_s / 4)


def parse_ladder(text: str) -> tuple[int, ...]:
    try:
        steps = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError as exc:
        raise InputError(f"--concurrency {text!r} is not a list of whole numbers.",
                         "Write it like --concurrency 1,2,4,8,16,32.") from exc
    if not steps or any(not 1 <= c <= MAX_CONCURRENCY for c in steps) or len(steps) > MAX_STEPS:
        raise InputError(f"--concurrency {text!r} must be 1 to {MAX_STEPS} numbers between 1 and {MAX_CONCURRENCY}.",
                         "Write it like --concurrency 1,2,4,8,16,32.")
    return tuple(sorted(set(steps)))


def _openai_body(opts: SweepOptions, chat: bool) -> Callable[[int], bytes]:
    """Completions (``prompt``) or chat completions (``messages``) bodies, streamed."""

    def body(n: int) -> bytes:
        rng = random.Random(n)  # a different prompt per request: no prefix cache turns the sweep into cache hits
        prompt = " ".join(rng.choice(_WORDS) for _ in range(opts.prompt_tokens))
        doc: dict[str, Any] = {"model": opts.model, "max_tokens": opts.max_tokens, "stream": True}
        if chat:
            doc["messages"] = [{"role": "user", "content": prompt}]
        else:
            doc["prompt"] = prompt
        return json.dumps(doc).encode()
    return body


def request_spec(opts: SweepOptions) -> RequestSpec:
    try:
        target = Target.parse(opts.url)
    except TargetError as exc:
        raise InputError(f"{exc}.", "Pass the endpoint's full URL, e.g. http://127.0.0.1:8000/v1/completions.") \
            from exc
    make: Callable[[int], bytes] | None
    if opts.openai:
        if target.path in ("", "/"):
            target = Target(target.scheme, target.host, target.port, "/v1/completions")
        make, method = _openai_body(opts, target.path.split("?", 1)[0].endswith("/chat/completions")), "POST"
    else:
        make = _fixed(opts.body) if opts.body is not None else None
        method = opts.method or ("POST" if opts.body is not None else "GET")
    return RequestSpec(target, method, opts.headers, make, opts.timeout_s, opts.insecure)


def _fixed(body: bytes) -> Callable[[int], bytes]:
    return lambda _n: body


def _ms(x: float | None) -> float | None:
    return None if x is None else round(1000.0 * x, 3)


def step_doc(res: StepResult) -> dict[str, Any]:
    """One step's numbers (the ``steps[]`` of the document)."""
    ok = [s for s in res.samples if s.ok]
    lat = [s.latency_s for s in ok]
    errors = len(res.samples) - len(ok)
    doc: dict[str, Any] = {
        "concurrency": res.concurrency,
        "requests": len(res.samples),
        "ok": len(ok),
        "errors": errors,
        "error_ratio": round(errors / len(res.samples), 4) if res.samples else 0.0,
        "throughput_rps": round(res.completed_in_window / res.window_s, 4),
        "p50_ms": _ms(quantile(lat, 0.5)),
        "p90_ms": _ms(quantile(lat, 0.9)),
        "p99_ms": _ms(quantile(lat, 0.99)),
        "mean_ms": _ms(sum(lat) / len(lat)) if lat else None,
        "max_ms": _ms(max(lat)) if lat else None,
        "duration_s": res.window_s,
        "client_cpu_cores": round(res.client_cpu_cores, 3),
        "status_codes": res.status_codes,
    }
    errs: dict[str, int] = {}
    for s in res.samples:
        if not s.ok:
            errs[s.error] = errs.get(s.error, 0) + 1
    if errs:
        doc["error_kinds"] = dict(sorted(errs.items(), key=lambda kv: -kv[1])[:5])
    streamed = [s for s in ok if s.ttft_s is not None]
    if streamed:
        ttft = [s.ttft_s for s in streamed if s.ttft_s is not None]
        gaps = [g for s in streamed for g in s.gaps_s]
        tpot = [(s.latency_s - (s.ttft_s or 0.0)) / (s.tokens - 1) for s in streamed if s.tokens > 1]
        tokens = sum(s.tokens for s in streamed)
        doc.update({
            "ttft_p50_ms": _ms(quantile(ttft, 0.5)), "ttft_p99_ms": _ms(quantile(ttft, 0.99)),
            "tpot_ms": _ms(sum(tpot) / len(tpot)) if tpot else None,
            "itl_p50_ms": _ms(quantile(gaps, 0.5)), "itl_p99_ms": _ms(quantile(gaps, 0.99)),
            "tokens_per_request": round(tokens / len(streamed), 2),
            "tokens_per_s": round(tokens / res.window_s, 3),  # tokens of the requests started in the window
        })
    return doc


def find_knee(steps: Sequence[Mapping[str, Any]], within: float = KNEE_WITHIN,
              p99_bound: float = DEFAULT_P99_BOUND) -> tuple[dict[str, Any] | None, str]:
    """The knee and a sentence saying why (or why there is none); see the module docstring."""
    usable = [s for s in steps if s.get("throughput_rps") and s.get("p99_ms") is not None]
    if len(usable) < 2:
        return None, "fewer than two steps answered: no knee can be read"
    best = max(usable, key=lambda s: s["throughput_rps"])
    sat = next(s for s in usable if s["throughput_rps"] >= (1.0 - within) * best["throughput_rps"])
    after = [s for s in usable if s["concurrency"] > sat["concurrency"]]
    first, top = usable[0], usable[-1]
    grown = [s for s in after if s["p99_ms"] >= p99_bound * sat["p99_ms"]]
    if not after:
        return None, (f"throughput still grows at the top step ({top['concurrency']} clients, "
                      f"{top['throughput_rps']:.1f} req/s): the service has not saturated; extend --concurrency")
    if not grown:
        return None, (f"throughput levels off at {sat['concurrency']} clients ({sat['throughput_rps']:.1f} req/s) but "
                      f"p99 never grew past {p99_bound:g}× its {sat['p99_ms']:.0f} ms there (top step "
                      f"{top['p99_ms']:.0f} ms): no knee yet; extend --concurrency")
    knee = {
        "concurrency": sat["concurrency"],
        "throughput_rps": sat["throughput_rps"],
        "p50_ms": sat["p50_ms"],
        "p99_ms": sat["p99_ms"],
        "best_throughput_rps": best["throughput_rps"],
        "best_concurrency": best["concurrency"],
        "p99_bound": p99_bound,
        "grown_at": grown[0]["concurrency"],
        "top_concurrency": top["concurrency"],
        "top_p99_ms": top["p99_ms"],
        "top_p99_vs_knee": round(top["p99_ms"] / sat["p99_ms"], 3) if sat["p99_ms"] else None,
        "top_p99_vs_first": round(top["p99_ms"] / first["p99_ms"], 3) if first["p99_ms"] else None,
    }
    little = sat["concurrency"] / sat["throughput_rps"] * 1000.0 if sat["throughput_rps"] else None
    clients = "client" if sat["concurrency"] == 1 else "clients"
    vs = f"{knee['top_p99_vs_knee']:.1f}× the knee's"
    if first is not sat:
        vs += f", {knee['top_p99_vs_first']:.1f}× the p99 at {first['concurrency']} client(s)"
    why = (f"the knee is at {sat['concurrency']} concurrent {clients}: {sat['throughput_rps']:.1f} req/s (within "
           f"{pct(within)} of the best, {best['throughput_rps']:.1f} req/s at {best['concurrency']}), p50 "
           f"{sat['p50_ms']:.0f} ms, p99 {sat['p99_ms']:.0f} ms; past it throughput stays flat while p99 grows to "
           f"{top['p99_ms']:.0f} ms at {top['concurrency']} ({vs}): extra clients only queue")
    if little is not None:
        knee["little_latency_ms"] = round(little, 3)
    knee["message"] = why
    return knee, why


def _progress(msg: str) -> None:
    print(f"sweep: {msg}", file=sys.stderr, flush=True)


def run(opts: SweepOptions, progress: Callable[[str], None] = _progress) -> dict[str, Any]:
    """The whole ladder, the knee, and (with ``pid``) the attach at the knee: the sweep document."""
    spec = request_spec(opts)
    first = probe(spec)
    if not first.ok and first.status == 0:
        raise InputError(f"{spec.target.shown} did not answer ({first.error}).",
                         "Check the URL and that the service listens there.")
    if not first.ok:
        progress(f"warning: the first request got {first.error}; the sweep goes on and counts errors")
    started = time.time()
    steps: list[dict[str, Any]] = []
    warnings: list[str] = []
    for c in opts.concurrency:
        progress(f"{c} client(s): {opts.warmup:.0f} s warm-up, {opts.duration_s:.0f} s measured")
        res = run_step(spec, c, opts.warmup, opts.duration_s)
        step = step_doc(res)
        steps.append(step)
        line = (f"{c:>4} clients  {step['throughput_rps']:8.2f} req/s  p50 {step['p50_ms'] or 0:8.1f} ms  "
                f"p99 {step['p99_ms'] or 0:8.1f} ms  errors {step['errors']}")
        if "ttft_p50_ms" in step:
            line += f"  TTFT p50 {step['ttft_p50_ms'] or 0:.0f} ms"
        progress(line)
        if step["client_cpu_cores"] >= CLIENT_CPU_WARN:
            warnings.append(f"at {c} clients the load generator used {step['client_cpu_cores']:.2f} of a core: it may "
                            "be what limits throughput; run diagnose sweep on another machine, or lower the top "
                            "concurrency")
        if step["requests"] and step["errors"] == step["requests"]:
            warnings.append(f"every request failed at {c} clients ({next(iter(step.get('error_kinds', {})), '')}); "
                            "the ladder stopped there")
            break
    knee, why = find_knee(steps, KNEE_WITHIN, opts.p99_bound)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "tool_version": TOOL_VERSION,
        "url": spec.target.shown,
        "method": spec.method,
        "openai": opts.openai,
        "model": opts.model or None,
        "duration_s": opts.duration_s,
        "warmup_s": opts.warmup,
        "started_at": started,
        "steps": steps,
        "knee": knee,
        "verdict": "knee" if knee else "no_knee",
        "summary": why,
        "client": {"max_cpu_cores": max((s["client_cpu_cores"] for s in steps), default=0.0),
                   "saturated": any(s["client_cpu_cores"] >= CLIENT_CPU_WARN for s in steps)},
        "warnings": warnings,
    }
    if opts.pid is not None:
        at = knee["concurrency"] if knee else max(s["concurrency"] for s in steps)
        attach_doc = attach_at(spec, opts, at, progress)
        attach_doc["at"] = "knee" if knee else "top step (no knee)"
        if knee is not None:
            knee["diagnosis"] = attach_doc
        else:
            doc["attach"] = attach_doc
    return doc


class LoadSource:
    """The sweep's closed-loop clients at one concurrency, as a source of the attach's window: they start
    (and warm up) before the window opens and run past its end, so the whole window is under load."""

    collector = "load"

    def __init__(self, spec: RequestSpec, concurrency: int, warmup_s: float, duration_s: float,
                 timeout_s: float) -> None:
        self.spec = spec
        self.concurrency = concurrency
        self.warmup_s = warmup_s
        self.duration_s = duration_s
        self.timeout_s = timeout_s
        self.step: StepResult | None = None
        self._thread: threading.Thread | None = None

    def _load(self) -> None:
        self.step = run_step(self.spec, self.concurrency, self.warmup_s, self.duration_s + 2.0)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._load, name="sweep-attach-load", daemon=True)
        self._thread.start()
        time.sleep(self.warmup_s)

    def stop(self, by: float) -> None:
        """Nothing here: the clients run their own bounded time, past the window's end."""

    def capture(self, window: Window, cut: str) -> Capture:
        if self._thread is not None:
            self._thread.join(timeout=self.duration_s + self.warmup_s + self.timeout_s + 10)
        what = f"{self.concurrency} closed-loop client(s) of diagnose sweep loaded {self.spec.target.shown}"
        if cut:  # the window ended early: the load covered only part of what was asked
            return Capture(self.collector, CaptureStatus.PARTIAL, f"{what}; {cut}", "", window)
        return Capture(self.collector, CaptureStatus.OK, what, "", window)


def attach_at(spec: RequestSpec, opts: SweepOptions, concurrency: int,
              progress: Callable[[str], None] = _progress) -> dict[str, Any]:
    """Load at ``concurrency`` while attaching to ``opts.pid``; the diagnosis in brief."""
    from diagnose.attach import AttachOptions, attach

    assert opts.pid is not None
    load = LoadSource(spec, concurrency, opts.warmup, opts.attach_duration_s, opts.timeout_s)
    progress(f"attaching to pid {opts.pid} for {opts.attach_duration_s:.0f} s at {concurrency} client(s)")
    session, diagnosis = attach(AttachOptions(pid=opts.pid, duration_s=opts.attach_duration_s), extra=[load])
    top = next((f for f in diagnosis.findings if f.severity.rank > 0), None)
    return {
        "concurrency": concurrency,
        "pid": opts.pid,
        "session": session.path,
        "primary": diagnosis.primary.value if diagnosis.primary else None,
        "verdict": diagnosis.overall.value,
        "title": top.title if top else "",
        "findings": [{"code": f.code, "category": f.label, "severity": f.severity.value, "title": f.title,
                      "message": f.message} for f in diagnosis.findings],
        "next_steps": list(diagnosis.next_steps),
    }


def run_cli(args: argparse.Namespace) -> dict[str, Any]:
    """``diagnose sweep`` arguments → options (each bad value is one sentence) → the document."""
    if not 0 < args.duration <= MAX_DURATION_S:
        raise InputError(f"--duration {args.duration:g} must be between 0 and {MAX_DURATION_S:.0f} seconds.",
                         "Use e.g. --duration 20.")
    if args.warmup is not None and not 0 <= args.warmup <= MAX_DURATION_S:
        raise InputError(f"--warmup {args.warmup:g} must be between 0 and {MAX_DURATION_S:.0f} seconds.",
                         "Use e.g. --warmup 5.")
    if args.timeout <= 0:
        raise InputError(f"--timeout {args.timeout:g} is not a number of seconds.", "Pass a positive number.")
    if args.p99_bound <= 1:
        raise InputError(f"--p99-bound {args.p99_bound:g} must be above 1.", "Use e.g. --p99-bound 2.")
    body: bytes | None = None
    if args.body is not None:
        try:
            json.loads(args.body)
        except json.JSONDecodeError as exc:
            raise InputError(f"--body is not valid JSON ({exc.msg} at character {exc.pos}).",
                             "Quote it for the shell: --body '{\"x\": 1}', or use --body-file.") from exc
        body = args.body.encode()
    elif args.body_file:
        try:
            with open(args.body_file, "rb") as fh:
                body = fh.read()
        except OSError as exc:
            raise InputError(f"cannot read --body-file {args.body_file} ({exc.strerror or exc}).",
                             "Pass a readable file.") from exc
    if args.openai and (args.body is not None or args.body_file):
        raise InputError("--openai builds its own body; --body and --body-file do not go with it.",
                         "Drop --body, or drop --openai to send your own.")
    if args.openai and not args.model:
        raise InputError("--openai needs --model (the name the server serves).", "Add --model NAME.")
    if args.openai and not (1 <= args.prompt_tokens <= 1_000_000 and 1 <= args.max_tokens <= 1_000_000):
        raise InputError("--prompt-tokens and --max-tokens must be positive.", "Use e.g. --prompt-tokens 128.")
    headers = []
    for h in args.header:
        name, sep, value = h.partition(":")
        if not sep or not name.strip() or any(c in h for c in "\r\n"):
            raise InputError(f"--header {h.split(':')[0]!r}… is not 'Name: value'.",
                             "Write it like --header 'Authorization: Bearer …'.")
        headers.append((name.strip(), value.strip()))
    if args.pid is not None and not 0 < args.attach_duration <= 600:
        raise InputError("--attach-duration must be between 0 and 600 seconds.", "Use e.g. --attach-duration 10.")
    if args.pid is not None and not os.path.exists(f"/proc/{args.pid}"):
        raise InputError(f"there is no process {args.pid}.", "Pass the service's pid with --pid (`pgrep -f serve`).")
    opts = SweepOptions(url=args.url, concurrency=parse_ladder(args.concurrency), duration_s=args.duration,
                        warmup_s=args.warmup, method=args.method, body=body, headers=tuple(headers),
                        openai=args.openai, model=args.model or "", prompt_tokens=args.prompt_tokens,
                        max_tokens=args.max_tokens, timeout_s=args.timeout, p99_bound=args.p99_bound,
                        pid=args.pid, attach_duration_s=args.attach_duration, insecure=args.insecure)
    return run(opts)
