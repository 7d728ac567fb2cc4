"""The command line: ``diagnose attach|analyze|rules|demo``.

``main(argv) -> int`` never lets a traceback reach the user: every failure the user can act on is
a ``DiagnoseError`` printed as one sentence with its remedy, exit code 2.
Exit codes: 0 done, 1 findings at or above ``--fail-on``, 2 bad usage or input.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from analyzer.errors import DiagnoseError
from analyzer.model import TOOL_VERSION, Diagnosis, Severity

FORMATS = ("text", "json")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise DiagnoseError(f"{message}.", f"See `{self.prog} --help`.")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", choices=FORMATS, default="text", help="text (default) or json")
    p.add_argument("--fail-on", choices=[s.value for s in Severity] + ["never"], default="never",
                   help="exit 1 when a finding is at or above this severity (default: never)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="diagnose", description="Name the bottleneck of a slow, starved or out-of-memory "
                 "AI inference service, with numbers and the fix.")
    ap.add_argument("--version", action="version", version=f"diagnose {TOOL_VERSION}")
    sub = ap.add_subparsers(dest="command", parser_class=_Parser)

    p = sub.add_parser("attach", help="watch a running service for a short window and diagnose it")
    p.add_argument("--pid", type=int, required=True, help="the service's pid (a parent of workers is fine)")
    p.add_argument("--duration", type=float, default=10.0, help="window in seconds (default 10)")
    p.add_argument("-o", "--output", help="session folder (or .tar.gz) to write")
    p.add_argument("--rate", type=int, default=50, help="py-spy samples per second (default 50)")
    p.add_argument("--log", action="append", default=[], help="a log file of the service to read too")
    p.add_argument("--metrics", action="append", default=[], help="a Prometheus /metrics URL to scrape")
    p.add_argument("--nsys", action="store_true",
                   help="record an Nsight Systems window (the service must run under `nsys launch`)")
    _common(p)

    p = sub.add_parser("analyze", help="diagnose sessions or evidence files (logs, metrics, …); - is stdin")
    p.add_argument("paths", nargs="+", help="session folders or evidence files; - reads stdin")
    _common(p)

    p = sub.add_parser("rules", help="the rule catalogue, or one rule's page")
    p.add_argument("code", nargs="?", help="a rule code (CPU001) or name")
    p.add_argument("--format", choices=("text", "json", "md"), default="text")

    p = sub.add_parser("enable", help="what to add at the next deploy to make the next incident diagnosable")
    p.add_argument("service", nargs="?", help="pytorch, vllm, sglang, tgi or triton (none: list them)")
    p.add_argument("--format", choices=("text", "json"), default="text")

    p = sub.add_parser("demo", help="start the bundled demo service, drive load, attach, diagnose")
    p.add_argument("--pathology", default="cpu-preprocess", help="which pathology to start (see --list)")
    p.add_argument("--list", action="store_true", help="list the pathologies and exit")
    p.add_argument("--duration", type=float, default=10.0, help="attach window in seconds (default 10)")
    p.add_argument("-o", "--output", help="session folder to write")
    _common(p)
    return ap


def emit(diagnosis: Diagnosis, fmt: str, fail_on: str) -> int:
    if fmt == "json":
        from reports import json_report

        sys.stdout.write(json_report.render(diagnosis))
    else:
        from reports import terminal

        terminal.render(diagnosis)
    if fail_on != "never":
        floor = Severity(fail_on).rank
        if any(f.severity.rank >= floor for f in diagnosis.findings):
            return 1
    return 0


def cmd_analyze(args: argparse.Namespace) -> int:
    from analyzer import pipeline

    return emit(pipeline.analyze(args.paths), args.format, args.fail_on)


def cmd_rules(args: argparse.Namespace) -> int:
    from analyzer import rulesdoc

    return rulesdoc.print_rules(args.code, args.format)


def cmd_attach(args: argparse.Namespace) -> int:
    from analyzer import attach

    diagnosis = attach.attach_cli(args)
    return emit(diagnosis, args.format, args.fail_on)


def cmd_enable(args: argparse.Namespace) -> int:
    from analyzer import enable

    return enable.print_enable(args.service, args.format)


def cmd_demo(args: argparse.Namespace) -> int:
    from analyzer import demo

    return demo.run_demo(args)


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    try:
        args = ap.parse_args(argv)
        if not args.command:
            ap.print_help(sys.stderr)
            return 2
        handler = {"analyze": cmd_analyze, "rules": cmd_rules, "attach": cmd_attach, "demo": cmd_demo,
                   "enable": cmd_enable}
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
