"""``diagnose demo``: start the bundled demo service with one pathology, drive load, attach, diagnose.

``--fixed`` runs the same service and load with the fix diagnose recommends for the pathology
applied, for a before/after (``diagnose compare``) of a pathology and its fix.

Every process it starts (the service, its children, the load) is cleaned up on the way out,
including on Ctrl-C and errors.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
import threading

from analyzer.errors import DiagnoseError
from analyzer.model import Diagnosis

WARMUP_S = 3.0  # load runs this long before the window opens, so the window sees steady state


def _require_demo_extra() -> None:
    missing = [m for m in ("torch", "PIL", "numpy") if importlib.util.find_spec(m) is None]
    if missing:
        raise DiagnoseError(f"the demo needs {', '.join(missing)}, which is not installed.",
                            "Install the demo extra: pip install 'diagnose[demo]' (or run `make demo`).")


def run_pathology(pathology: str, duration_s: float, output: str | None,
                  stop: threading.Event | None = None, *, fixed: bool = False) -> tuple[str, Diagnosis, object]:
    """Start the service, load it, attach for ``duration_s``; returns (session path, diagnosis, load).

    ``fixed``: the service with the pathology's fix applied (``PathologySpec.fix``), same load.
    """
    _require_demo_extra()
    from analyzer.attach import AttachOptions, attach
    from examples.demo import PATHOLOGIES, DemoService, ServiceStartError, background_load

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
                                     metrics=[f"{svc.url}/metrics"])
                session, diagnosis = attach(opts, stop)
            return session.path, diagnosis, load.result
    except ServiceStartError as exc:
        raise DiagnoseError(f"the demo service did not start: {exc}", "Run `make venv` to install it.") from exc
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_demo(args: argparse.Namespace) -> int:
    from analyzer.cli import emit
    from examples.demo import PATHOLOGIES

    if getattr(args, "fleet", False):
        from analyzer import fleet_demo

        return fleet_demo.run(args)
    fixed = bool(getattr(args, "fixed", False))
    if args.list:
        for spec in PATHOLOGIES.values():
            print(f"{spec.name:<16} expect {spec.expected_category or 'no bottleneck':<20} {spec.description}")
            if spec.fix:
                print(f"{'  --fixed':<44} {spec.fix}")
        return 0
    path, diagnosis, load = run_pathology(args.pathology, args.duration, args.output, fixed=fixed)
    code = emit(diagnosis, args.format, args.fail_on, args.verbose)
    if load is not None:
        print(f"demo: load during the run: {load}", file=sys.stderr)
    md, html_path = write_reports(path)
    print(f"demo: session written to {path}\n"
          f"demo: for the ticket {md}; to open anywhere {html_path}\n"
          f"demo: interactive: diagnose dashboard {path}\n"
          f"demo: before/after: diagnose demo --pathology {args.pathology}{'' if fixed else ' --fixed'} -o OTHER "
          f"&& diagnose compare {path} OTHER", file=sys.stderr)
    return code


def write_reports(session: str) -> tuple[str, str]:
    """The Markdown and the single-file HTML report of a session, written beside it (SESSION.md, SESSION.html)."""
    from analyzer import tables
    from reports import html, markdown

    data = tables.load(session)
    base = session.rstrip(os.sep)
    outputs = ((f"{base}.md", markdown.render(data.diagnosis)), (f"{base}.html", html.render(data)))
    for out, text in outputs:
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text)
    return outputs[0][0], outputs[1][0]
