"""``python -m diagnose.examples.service``: the command line, warm-up, READY line and shutdown of the demo service."""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from diagnose.collectors import torch_probe
from diagnose.examples.service.base import Pathology, log
from diagnose.examples.service.pathologies import PATHOLOGY_NAMES, make_pathology
from diagnose.examples.service.server import InferenceServer

DESCRIPTION = "The demo inference service: a real HTTP service around a small real PyTorch model (CPU)."


def _private_inductor_cache() -> Callable[[], None]:
    """Give ``recompile`` a fresh inductor cache unless the caller chose one.

    A warm on-disk cache from an earlier run would turn most compiles into cache hits; a fresh
    cache behaves like a freshly deployed container.
    """
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return lambda: None
    path = tempfile.mkdtemp(prefix="diagnose-demo-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    return lambda: shutil.rmtree(path, ignore_errors=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m diagnose.examples.service", description=DESCRIPTION)
    p.add_argument("--pathology", required=True, choices=PATHOLOGY_NAMES)
    p.add_argument("--fixed", action="store_true",
                   help="serve the same load with the fix diagnose recommends for the pathology applied")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port")
    p.add_argument("--preprocess-workers", type=int, default=0,
                   help="cpu-preprocess --fixed: pre-process in N worker processes (default 0: in the request thread)")
    p.add_argument("--stage-log", default=None, help="append one JSON line of stage timings per request")
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (default 1)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(threadName)s %(name)s: %(message)s",
    )
    threading.current_thread().name = "main"
    torch.set_num_threads(max(1, args.torch_threads))
    cleanup_cache = _private_inductor_cache() if args.pathology == "recompile" else (lambda: None)
    # the in-process probe writes the stage log (also when started with DIAGNOSE_PROBE=PATH)
    service = f"demo-{args.pathology}" + ("-fixed" if args.fixed else "")
    stage_log = (torch_probe.install(args.stage_log, service=service) if args.stage_log
                 else torch_probe.get())
    pathology: Pathology | None = None
    server: InferenceServer | None = None
    try:
        pathology = make_pathology(args.pathology, fixed=args.fixed, preprocess_workers=args.preprocess_workers)
        t0 = time.perf_counter()
        pathology.warmup()
        log.info("pathology %s%s warmed up in %.1f s", args.pathology, " (fixed)" if args.fixed else "",
                 time.perf_counter() - t0)
        server = InferenceServer((args.host, args.port), pathology, stage_log, fixed=args.fixed)

        def _request_shutdown(signum: int, _frame: Any) -> None:
            log.info("signal %d: shutting down", signum)
            assert server is not None
            threading.Thread(target=server.shutdown, name="shutdown", daemon=True).start()

        signal.signal(signal.SIGTERM, _request_shutdown)
        signal.signal(signal.SIGINT, _request_shutdown)
        port = server.server_address[1]
        sys.stdout.write(f"READY port={port} pid={os.getpid()}\n")
        sys.stdout.flush()
        server.serve_forever(poll_interval=0.2)
    finally:
        if server is not None:
            server.server_close()
        if pathology is not None:
            pathology.close()
        if stage_log is not None:
            stage_log.close()
        cleanup_cache()
    log.info("stopped")
    return 0

