"""``diagnose fleet`` and ``diagnose sweep``: their arguments and handlers (``diagnose.cli`` registers them).

Both print one document in the chosen format (``--format`` or the ``-o`` suffix; the formats are
``diagnose.output.DOCUMENT``): JSON is the source of truth, text/Markdown/HTML are rendered from it by
``diagnose.reports.fleet`` / ``diagnose.reports.sweep``. An existing ``-o`` file is refused before any
work, unless ``--force``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from diagnose.errors import InputError
from diagnose.model import Severity
from diagnose.output import DOCUMENT, SWEEP_COMPARISON, check_file


def add_parsers(sub: Any) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add the subcommands to ``sub``; returns their handlers by name."""
    p = sub.add_parser("fleet", help="every replica's bottleneck from a Prometheus server (never re-scraped)")
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="the query API's base URL (Prometheus, Thanos, Mimir, VictoriaMetrics)")
    p.add_argument("--window", default="15m", help="how far back from --at to look (default 15m)")
    p.add_argument("--at", default=None, help="end of the window: now (default), Unix seconds or RFC 3339")
    p.add_argument("--selector", default="", help="label matchers for the engine series, e.g. '{job=\"vllm\"}'")
    p.add_argument("--gpu-selector", default="", help="label matchers for the dcgm-exporter series")
    p.add_argument("--by", default="instance", help="labels that name a replica, comma-separated (default instance; "
                   "pod, or instance,model_name)")
    p.add_argument("--step", default=None, help="range-query step (default: ~120 points per series)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per request (default 30)")
    p.add_argument("--bearer-token-file", help="a file holding the bearer token (or $DIAGNOSE_PROMETHEUS_TOKEN)")
    p.add_argument("--basic-auth-file", help="a file holding USER:PASSWORD (or $DIAGNOSE_PROMETHEUS_USER and "
                   "$DIAGNOSE_PROMETHEUS_PASSWORD)")
    p.add_argument("--ca-file", help="CA bundle (PEM) to verify an https server")
    p.add_argument("--insecure", action="store_true", help="do not verify the https server's certificate")
    _doc_options(p)

    p.add_argument("--config", metavar="FILE",
                   help="rule settings (TOML: [rules.CODE] thresholds, disable = [...]); default $DIAGNOSE_CONFIG")
    p = sub.add_parser("sweep", help="a concurrency ladder against a live endpoint: latency, throughput, the knee")
    p.add_argument("url", help="the endpoint to load, e.g. http://127.0.0.1:8000/infer or .../v1/completions")
    p.add_argument("--concurrency", default="1,2,4,8,16,32", help="the ladder (default 1,2,4,8,16,32)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds measured per step (default 20)")
    p.add_argument("--warmup", type=float, default=None, help="seconds discarded before each step (default: "
                   "a quarter of --duration, at most 5)")
    body = p.add_mutually_exclusive_group()
    body.add_argument("--body", help="the JSON body to POST (default: GET when no body is given)")
    body.add_argument("--body-file", help="a file holding the body to POST")
    p.add_argument("--method", choices=("GET", "POST"), default=None, help="default: POST with a body, else GET")
    p.add_argument("--header", action="append", default=[], help="an extra request header 'Name: value'")
    p.add_argument("--openai", action="store_true",
                   help="an OpenAI-compatible endpoint (/v1/completions, or /v1/chat/completions), streamed (SSE)")
    p.add_argument("--model", help="--openai: the model name")
    p.add_argument("--prompt-tokens", type=int, default=128, help="--openai: prompt length in words (default 128)")
    p.add_argument("--max-tokens", type=int, default=64, help="--openai: tokens to generate (default 64)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default 60)")
    p.add_argument("--insecure", action="store_true", help="https: do not verify the server's certificate")
    p.add_argument("--p99-bound", type=float, default=2.0,
                   help="the knee: p99 this many times its value at the saturating step (default 2)")
    p.add_argument("--pid", type=int, help="attach to this pid at the knee's concurrency and diagnose it")
    p.add_argument("--attach-duration", type=float, default=10.0, help="--pid: the attach window (default 10 s)")
    _doc_options(p)
    return {"fleet": cmd_fleet, "sweep": cmd_sweep}


def _doc_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=DOCUMENT.names, default=None, help="text (default), json, md or html")
    p.add_argument("-o", "--output", help="write to this file (the format also follows its suffix)")
    p.add_argument("--force", action="store_true", help="replace the -o file if it exists (default: refuse)")
    p.add_argument("--fail-on", choices=[s.value for s in Severity] + ["never"], default="never",
                   help="exit 1 when a finding is at or above this severity (default: never)")


def _format(args: argparse.Namespace) -> str:
    """The format (``--format``, else the ``-o`` suffix), after refusing an ``-o`` that cannot be written."""
    if args.output:
        check_file(args.output, args.force)  # before the work: a long sweep is not run for nothing
    return DOCUMENT.pick(args.format, args.output)


def _emit(doc: dict[str, Any], fmt: str, args: argparse.Namespace) -> None:
    DOCUMENT.write(fmt, doc, args.output, force=args.force)
    if args.output:
        print(f"{fmt} written to {args.output}", file=sys.stderr)


def _fails(severities: list[str], fail_on: str) -> bool:
    if fail_on == "never":
        return False
    floor = Severity(fail_on).rank
    return any(Severity(s).rank >= floor for s in severities)


def cmd_fleet(args: argparse.Namespace) -> int:
    from diagnose import fleet
    from diagnose.collectors.promapi import PromApiError, load_auth

    fmt = _format(args)
    window = fleet.parse_duration(args.window)
    step = fleet.parse_duration(args.step) if args.step else None
    if args.timeout <= 0:
        raise InputError(f"--timeout {args.timeout:g} is not a number of seconds.", "Pass a positive number.")
    by = tuple(b.strip() for b in args.by.split(",") if b.strip())
    if not by or not all(b.replace("_", "").isalnum() for b in by):
        raise InputError(f"--by {args.by!r} is not a list of label names.", "Pass e.g. --by instance or --by pod.")
    try:
        auth = load_auth(args.bearer_token_file, args.basic_auth_file)
    except PromApiError as exc:
        raise InputError(exc.message, exc.remedy) from exc
    opts = fleet.FleetOptions(url=args.prometheus, window_s=window, at=fleet.parse_time(args.at),
                              selector=fleet.parse_selector(args.selector),
                              gpu_selector=fleet.parse_selector(args.gpu_selector, "--gpu-selector"),
                              by=by, timeout_s=args.timeout, auth=auth, ca_file=args.ca_file,
                              insecure=args.insecure, step_s=step)
    from diagnose import config

    doc = fleet.run(opts, config.load(args.config))
    _emit(doc, fmt, args)
    sev = [f["severity"] for r in doc["replicas"] for f in r.get("findings", ())]
    return 1 if _fails(sev, args.fail_on) else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from diagnose import sweep

    fmt = _format(args)
    doc = sweep.run_cli(args)
    _emit(doc, fmt, args)
    sev = [f["severity"] for f in (doc.get("knee") or {}).get("diagnosis", {}).get("findings", ())]
    return 1 if _fails(sev, args.fail_on) else 0


def load_document(path: str) -> dict[str, Any] | None:
    """A fleet or sweep JSON document at ``path``, or None when ``path`` is not one (a session, say)."""
    if not path.lower().endswith(".json") or not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InputError(f"{path} is not readable JSON ({type(exc).__name__}).",
                         "Pass a document written by `diagnose fleet` or `diagnose sweep` with --format json.") from exc
    if not isinstance(doc, dict) or doc.get("schema") not in ("diagnose/fleet/v1", "diagnose/sweep/v1"):
        raise InputError(f"{path} is not a diagnose fleet or sweep document (schema "
                         f"{doc.get('schema') if isinstance(doc, dict) else None!r}).",
                         "Pass a document written by `diagnose fleet` or `diagnose sweep` with --format json.")
    return doc


def compare_documents(before: str, after: str, fmt: str) -> bool:
    """``diagnose compare`` of two sweep documents (printed; True), or False when neither is a document."""
    a, b = load_document(before), load_document(after)
    if a is None and b is None:
        return False
    if a is None or b is None or a["schema"] != "diagnose/sweep/v1" or b["schema"] != "diagnose/sweep/v1":
        raise InputError("compare takes two sessions or two sweep documents, not a mix.",
                         "Pass two `diagnose sweep --format json` outputs, or two session folders.")
    from diagnose.reports import compare

    labels = (os.path.basename(before), os.path.basename(after))
    if labels[0] == labels[1]:
        labels = (f"before ({labels[0]})", f"after ({labels[1]})")
    SWEEP_COMPARISON.write(fmt, compare.compare_sweeps(a, b, *labels))
    return True
