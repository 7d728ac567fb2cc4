"""``diagnose demo``: start the bundled demo service with one pathology, drive load, attach, diagnose.

``--fixed`` runs the same service and load with the fix diagnose recommends for the pathology
applied, for a before/after (``diagnose compare``) of a pathology and its fix.

Every process it starts (the service, its children, the load) is cleaned up on the way out,
including on Ctrl-C and errors.

It writes the session (``-o``, by default ``diagnose-PID-TIMESTAMP`` in the current folder, new on
every run) and its two reports beside it, ``SESSION.md`` and ``SESSION.html``; when ``-o`` names a
session or reports that already exist, the demo refuses before it starts anything, unless ``--force``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import threading

from diagnose.errors import DiagnoseError
from diagnose.model import Diagnosis
from diagnose.output import SESSION_REPORT, SessionRef, check_file, check_session_folder, emit

WARMUP_S = 3.0  # load runs this long before the window opens, so the window sees steady state


def require_demo_extra() -> None:
    missing = [m for m in ("torch", "PIL", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        raise DiagnoseError(f"the demo needs {', '.join(missing)}, which is not installed.",
                            "Install the demo extra: pip install 'diagnose[demo]' (or run `make demo`).")


def run_pathology(pathology: str, duration_s: float, output: str | None,
                  stop: threading.Event | None = None, *, fixed: bool = False,
                  force: bool = False) -> tuple[str, Diagnosis, object]:
    """Start the service, load it, attach for ``duration_s``; returns (session path, diagnosis, load).

    ``fixed``: the service with the pathology's fix applied (``PathologySpec.fix``), same load.
    ``force``: replace a session already at ``output``.
    """
    require_demo_extra()
    from diagnose.attach import AttachOptions, attach
    from diagnose.examples.demo import PATHOLOGIES, DemoService, ServiceStartError, background_load

    spec = PATHOLOGIES.get(pathology)
    if spec is None:
        raise DiagnoseError(f"there is no demo pathology {pathology!r}.",
                            f"Choose one of: {', '.join(PATHOLOGIES)}.")
    workdir = tempfile.mkdtemp(prefix="diagnose-demo-")
    stage_log = os.path.join(workdir, "stages.jsonl")
    open(stage_log, "w").close()  # attach reads the log from its current end
    try:
        with DemoService(pathology, extra_args=["--stage-log", stage_log], fixed=fixed) as svc:
            print(f"demo: started the '{svc.label}' service (pid {svc.pid}, {svc.url}); "
                  f"driving load with {spec.concurrency} client(s)", file=sys.stderr)
            with background_load(svc.url, spec, WARMUP_S + duration_s + 30) as load:
                threading.Event().wait(WARMUP_S)
                opts = AttachOptions(pid=svc.pid, duration_s=duration_s, output=output, logs=[stage_log],
                                     metrics=[f"{svc.url}/metrics"], force=force)
                session, diagnosis = attach(opts, stop)
            return session.path, diagnosis, load.result
    except ServiceStartError as exc:
        raise DiagnoseError(f"the demo service did not start: {exc}", "Run `make venv` to install it.") from exc
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_demo(args: argparse.Namespace) -> int:
    """``diagnose demo`` (``--fleet`` is ``diagnose.fleet_demo``)."""
    from diagnose.examples.demo import PATHOLOGIES

    fixed = bool(getattr(args, "fixed", False))
    force = bool(getattr(args, "force", False))
    if args.list:
        for spec in PATHOLOGIES.values():
            print(f"{spec.name:<16} expect {spec.expected_category or 'no bottleneck':<20} {spec.description}")
            if spec.fix:
                print(f"{'  --fixed':<44} {spec.fix}")
        return 0
    if args.output:  # refused before anything starts, not after the window
        # as attach: X.tar.gz is the folder X, packed; the reports go beside the folder (X.md, X.html)
        folder = args.output[: -len(".tar.gz")] if args.output.endswith(".tar.gz") else args.output
        if folder != args.output:
            check_file(args.output, force)
        check_session_folder(folder, force)
        for report in report_paths(folder):
            check_file(report, force)
    path, diagnosis, load = run_pathology(args.pathology, args.duration, args.output, fixed=fixed, force=force)
    code = emit(diagnosis, args.format, args.fail_on, args.verbose)
    if load is not None:
        print(f"demo: load during the run: {load}", file=sys.stderr)
    md, html_path = write_reports(path, force=force)
    print(f"demo: session written to {path}\n"
          f"demo: for the ticket {md}; to open anywhere {html_path}\n"
          f"demo: interactive: diagnose dashboard {path}\n"
          f"demo: before/after: diagnose demo --pathology {args.pathology}{'' if fixed else ' --fixed'} -o OTHER "
          f"&& diagnose compare {path} OTHER", file=sys.stderr)
    return code


REPORTS = ("md", "html")  # written beside the session, in these formats of output.SESSION_REPORT


def report_paths(session: str) -> tuple[str, ...]:
    """Where ``write_reports`` writes: SESSION.md and SESSION.html beside the session folder."""
    base = session.rstrip(os.sep)
    return tuple(base + SESSION_REPORT.suffix(fmt) for fmt in REPORTS)


def write_reports(session: str, force: bool = False) -> tuple[str, str]:
    """The Markdown and the single-file HTML report of a session, written beside it (SESSION.md, SESSION.html)."""
    md, html = report_paths(session)
    for fmt, path in zip(REPORTS, (md, html), strict=True):
        SESSION_REPORT.write(fmt, SessionRef(session), path, force=force)
    return md, html
