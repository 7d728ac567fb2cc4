"""The command line: ``diagnose attach|analyze|report|compare|pack|dashboard|rules|enable|demo``.

``main(argv) -> int`` never lets a traceback reach the user: every failure the user can act on is
a ``DiagnoseError`` printed as one sentence with its remedy, exit code 2.
Exit codes: 0 done, 1 findings at or above ``--fail-on``, 2 bad usage or input.

Output formats come from one registry (``diagnose.output``: format name → writer and file suffix);
no command overwrites an existing file or session folder unless it is given ``--force``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from diagnose import output
from diagnose.blas import import_numpy_without_blas_threads
from diagnose.errors import DiagnoseError, InputError
from diagnose.model import TOOL_VERSION, Diagnosis, Severity
from diagnose.output import emit


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise DiagnoseError(f"{message}.", f"See `{self.prog} --help`.")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=output.DIAGNOSIS.names, default=output.DIAGNOSIS.default,
                   help="text (default) or json")
    p.add_argument("--fail-on", choices=[s.value for s in Severity] + ["never"], default="never",
                   help="exit 1 when a finding is at or above this severity (default: never)")
    p.add_argument("-v", "--verbose", action="store_true", help="text output lists every rule that could not judge")
    _config_option(p)


def _config_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE",
                   help="rule settings (TOML: [rules.CODE] thresholds, disable = [...]); default $DIAGNOSE_CONFIG")


def force_option(p: argparse.ArgumentParser, what: str = "the output file") -> None:
    p.add_argument("--force", action="store_true", help=f"replace {what} if it exists (default: refuse)")


def _settings(args: argparse.Namespace) -> Any:
    """The ``diagnose.config.Config`` of ``--config`` / ``$DIAGNOSE_CONFIG`` (an ``InputError`` when bad)."""
    from diagnose import config

    return config.load(getattr(args, "config", None))


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="diagnose", description="Name the bottleneck of a slow, starved or out-of-memory "
                 "AI inference service, with numbers and the fix.")
    ap.add_argument("--version", action="version", version=f"diagnose {TOOL_VERSION}")
    sub = ap.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("attach", help="watch a running service for a short window and diagnose it")
    p.add_argument("--pid", type=int, required=True, help="the service's pid (a parent of workers is fine)")
    p.add_argument("--duration", type=float, default=10.0, help="window in seconds (default 10)")
    p.add_argument("-o", "--output", help="session folder (or .tar.gz) to write")
    force_option(p, "a session already at -o")
    p.add_argument("--rate", type=int, default=50,
                   help="py-spy samples per second at most (default 50; each process gets what its busy threads need)")
    p.add_argument("--light", action="store_true",
                   help="for a host at 100%% CPU: profile only the busiest process, at low rates, no dumps")
    p.add_argument("--cgroup-root", metavar="DIR",
                   help="where the target's cgroup hierarchy is mounted, when not the one this process sees")
    p.add_argument("--log", action="append", default=[], help="a log file of the service to read too")
    p.add_argument("--metrics", action="append", default=[], help="a Prometheus /metrics URL to scrape")
    p.add_argument("--nsys", action="store_true",
                   help="record an Nsight Systems window (the service must run under `nsys launch`)")
    _common(p)

    p = sub.add_parser("watch", help="keep a rolling record of a service; on trouble, capture and diagnose a session")
    p.add_argument("--pid", type=int, required=True, help="the service's pid (a parent of workers is fine)")
    p.add_argument("--log", action="append", default=[], help="a log file of the service to follow")
    p.add_argument("--metrics", help="the engine's Prometheus /metrics URL, scraped each tick")
    p.add_argument("--when", action="append", metavar="RULE",
                   help="a trigger: ttft_p99>2s, e2e_p99>5s, queue>N, kv>0.95, oom, bottleneck "
                        "(repeatable; default: bottleneck and oom)")
    p.add_argument("-o", "--output", default=".", help="folder for the watch-<UTC time>-<trigger>/ sessions")
    p.add_argument("--listen", metavar="[HOST:]PORT",
                   help="serve /metrics and POST /alert (Alertmanager) on this address (default host 127.0.0.1)")
    p.add_argument("--max-sessions", type=int, default=20, help="keep the newest N sessions (default 20)")
    p.add_argument("--window", type=float, default=20.0, help="capture window after a trigger, seconds (default 20)")
    p.add_argument("--ring", type=float, default=300.0, help="seconds of evidence kept from before (default 300)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between ring samples (default 5)")
    p.add_argument("--clear", type=float, default=60.0, metavar="SECONDS",
                   help="a rule that fired fires again only after it was false this long (default 60): one "
                        "session per incident, however its gauge flaps")
    p.add_argument("--rate", type=int, default=50, help="py-spy samples per second at most in a capture")
    p.add_argument("--config", metavar="FILE",
                   help="rule settings (TOML: [rules.CODE] thresholds, disable = [...]); default $DIAGNOSE_CONFIG")

    p = sub.add_parser("analyze", help="diagnose sessions or evidence files (logs, metrics, …); - is stdin")
    p.add_argument("paths", nargs="+", help="session folders or evidence files; - reads stdin")
    _common(p)

    p = sub.add_parser("report", help="a session as Markdown (for a ticket), one self-contained HTML file, or JSON")
    p.add_argument("session", help="session folder or packed .tar.gz")
    p.add_argument("--format", choices=output.SESSION_REPORT.names,
                   help="md, html or json (default: from the -o suffix, else md)")
    p.add_argument("-o", "--output", help="file to write (default: stdout)")
    force_option(p)
    _config_option(p)

    p = sub.add_parser("compare", help="two sessions before/after a change: metrics and findings side by side")
    p.add_argument("before", help="session folder or .tar.gz before the change")
    p.add_argument("after", help="session folder or .tar.gz after the change")
    p.add_argument("--format", choices=output.COMPARISON.names, default=output.COMPARISON.default)

    p = sub.add_parser("pack", help="pack a session into a .tar.gz for a ticket, secrets and payloads redacted")
    p.add_argument("session", help="session folder (or a .tar.gz to clean again)")
    p.add_argument("-o", "--output", help="the .tar.gz to write (default: SESSION.tar.gz beside the folder)")
    force_option(p, "the .tar.gz")
    p.add_argument("--keep-payloads", action="store_true",
                   help="keep prompts and outputs in logs (secrets are still redacted)")

    p = sub.add_parser("dashboard", help="the interactive report in the browser (127.0.0.1, a free port)")
    p.add_argument("sessions", nargs="+", help="session folders or .tar.gz (two or more: compare them)")
    p.add_argument("--port", type=int, help="port to listen on (default: a free one)")
    p.add_argument("--no-browser", action="store_true", help="print the URL only, do not open a browser")

    p = sub.add_parser("rules", help="the rule catalogue, or one rule's page")
    p.add_argument("code", nargs="?", help="a rule code (CPU001) or name")
    p.add_argument("--format", choices=("text", "json", "md"), default="text")

    p = sub.add_parser("enable", help="what to add at the next deploy to make the next incident diagnosable")
    p.add_argument("service", nargs="?", help="pytorch, vllm, sglang, tgi or triton (none: list them)")
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser("demo", help="start the bundled demo service, drive load, attach, diagnose")
    p.add_argument("--pathology", default="cpu-preprocess", help="which pathology to start (see --list)")
    p.add_argument("--fixed", action="store_true",
                   help="the same service and load with the fix diagnose recommends applied")
    p.add_argument("--list", action="store_true", help="list the pathologies and exit")
    p.add_argument("--duration", type=float, default=10.0, help="attach window in seconds (default 10)")
    p.add_argument("-o", "--output", help="session folder to write (SESSION.md and SESSION.html beside it)")
    force_option(p, "a session already at -o and its reports")
    p.add_argument("--fleet", action="store_true",
                   help="four demo replicas, a real Prometheus scraping them, then `diagnose fleet` on it")
    _common(p)
    from diagnose import cli_fleet

    cli_fleet.add_parsers(sub)
    return ap


def cmd_analyze(args: argparse.Namespace) -> int:
    from diagnose import pipeline

    return emit(pipeline.analyze(args.paths, config=_settings(args)), args.format, args.fail_on, args.verbose)


def cmd_rules(args: argparse.Namespace) -> int:
    from diagnose import rulesdoc

    return rulesdoc.print_rules(args.code, args.format)


def cmd_attach(args: argparse.Namespace) -> int:
    from diagnose import attach

    diagnosis = attach.attach_cli(args)
    return emit(diagnosis, args.format, args.fail_on, args.verbose)


def analyze_session(path: str, settings: Any = None) -> Diagnosis:
    from diagnose import pipeline, session_io

    session_io.require(path)
    return pipeline.analyze([path], config=settings)


def cmd_report(args: argparse.Namespace) -> int:
    if args.output:
        output.check_file(args.output, args.force)
    fmt = output.SESSION_REPORT.pick(args.format, args.output)
    from diagnose.cli_fleet import load_document

    doc = load_document(args.session)  # a fleet or sweep JSON document, not a session
    if doc is not None:
        output.DOCUMENT.write(fmt, doc, args.output, force=args.force)
    else:
        ref = output.SessionRef(args.session, _settings(args))
        output.SESSION_REPORT.write(fmt, ref, args.output, force=args.force)
    if args.output:
        print(f"{fmt} report written to {args.output}", file=sys.stderr)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from diagnose.cli_fleet import compare_documents
    from diagnose.reports import compare
    from diagnose.session_io import label

    if compare_documents(args.before, args.after, args.format):
        return 0
    before, after = analyze_session(args.before), analyze_session(args.after)
    lb, la = label(args.before), label(args.after)
    if lb == la:
        lb, la = f"before ({lb})", f"after ({la})"
    output.COMPARISON.write(args.format, compare.compare(before, after, lb, la))
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from diagnose import pack

    out = pack.pack(args.session, args.output, keep_payloads=args.keep_payloads, force=args.force)
    what = "secrets redacted, request payloads kept" if args.keep_payloads else \
        "secrets and request payloads redacted"
    print(f"packed to {out} ({what}; pack.json inside lists what was changed)", file=sys.stderr)
    print(out)
    return 0


def cmd_dashboard(args: argparse.Namespace) -> int:
    if args.port is not None and not 0 < args.port < 65536:
        raise InputError(f"--port {args.port} is not a TCP port.", "Pass a port between 1 and 65535, or none.")
    from diagnose.dashboard import launch

    # a browser only where one can show: on a headless host webbrowser may start a console browser that blocks
    has_display = bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY") or sys.platform == "darwin")
    return launch.run(list(args.sessions), port=args.port, open_browser=has_display and not args.no_browser)


def cmd_enable(args: argparse.Namespace) -> int:
    from diagnose import enable

    return enable.print_enable(args.service, args.format)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.fleet:
        from diagnose import fleet_demo

        return fleet_demo.run(args)
    from diagnose import demo

    return demo.run_demo(args)


def cmd_watch(args: argparse.Namespace) -> int:
    from diagnose import watch, watch_rules

    opts = watch.WatchOptions(pid=args.pid, logs=list(args.log), metrics=[args.metrics] if args.metrics else [],
                              rules=watch_rules.parse_rules(args.when), output=args.output,
                              max_sessions=args.max_sessions, window_s=args.window, ring_s=args.ring,
                              interval_s=args.interval, clear_s=args.clear, config=_settings(args), rate_hz=args.rate)
    return watch.watch_cli(opts, args.listen, explicit_rules=bool(args.when))


def cmd_fleet(args: argparse.Namespace) -> int:
    from diagnose import cli_fleet

    return cli_fleet.cmd_fleet(args)


def cmd_sweep(args: argparse.Namespace) -> int:
    from diagnose import cli_fleet

    return cli_fleet.cmd_sweep(args)


NUMPY_COMMANDS = ("analyze", "report", "compare")  # they read evidence with numpy (attach: after its window)


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    try:
        args = ap.parse_args(argv)
        if not args.command:
            ap.print_help(sys.stderr)
            return 2
        if args.command in NUMPY_COMMANDS:
            import_numpy_without_blas_threads()
        handler = {"analyze": cmd_analyze, "rules": cmd_rules, "attach": cmd_attach, "demo": cmd_demo,
                   "enable": cmd_enable, "report": cmd_report, "compare": cmd_compare, "pack": cmd_pack,
                   "dashboard": cmd_dashboard, "watch": cmd_watch, "fleet": cmd_fleet, "sweep": cmd_sweep}
        return handler[args.command](args)
    except DiagnoseError as exc:
        print(f"diagnose: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("diagnose: interrupted.", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
