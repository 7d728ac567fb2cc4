"""Start the dashboard: ``diagnose dashboard SESSION…`` (and ``python -m diagnose.dashboard.launch SESSION…``).

The Streamlit server runs as a child process bound to 127.0.0.1 on a free port; this process
prints the URL, waits, and stops the child on Ctrl-C or exit. Session paths are checked before
anything starts, so a typo is one sentence and exit code 2, not a dashboard full of errors.
This module does not import streamlit: it only starts it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import webbrowser
from collections.abc import Sequence
from typing import IO, Any

from diagnose import session_io
from diagnose.errors import DiagnoseError, InputError

APP = os.path.join(os.path.dirname(os.path.realpath(__file__)), "app.py")
HOST = "127.0.0.1"
ENV_SESSIONS = "DIAGNOSE_SESSIONS"  # read by the app when set (AppTest); the launcher passes argv instead
START_TIMEOUT_S = 60.0


def check_sessions(paths: Sequence[str]) -> list[str]:
    """The absolute session paths, or an ``InputError`` naming the first one that is not a session."""
    if not paths:
        raise InputError("No session given to show.", "Pass a session folder or .tar.gz: `diagnose dashboard SESSION`.")
    out: list[str] = []
    for path in paths:
        if path.lower().endswith(".json"):  # a fleet or sweep document: shown on the Fleet and Sweep pages
            from diagnose.cli_fleet import load_document

            if load_document(path) is None:
                raise InputError(f"{path} does not exist.", "Pass a document written by `diagnose fleet` or "
                                 "`diagnose sweep` with --format json.")
            out.append(os.path.abspath(path))
            continue
        if not session_io.is_session(path):
            # opened() raises the sentence that fits (no such path, folder without manifest, not a .tar.gz)
            with session_io.opened(path):
                pass
            raise InputError(f"{path} is not a diagnose session.",
                             "Pass the folder `diagnose attach -o` wrote, or its .tar.gz.")
        out.append(os.path.abspath(path))
    return out


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _check_port(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            raise DiagnoseError(f"Port {port} on {HOST} cannot be used ({exc.strerror}).",
                                "Pick another with --port, or leave it out to get a free one.") from exc


def command(paths: Sequence[str], port: int) -> list[str]:
    """The streamlit command line for ``paths`` on ``port``."""
    return [sys.executable, "-m", "streamlit", "run", APP,
            "--server.address", HOST, "--server.port", str(port), "--server.headless", "true",
            "--browser.gatherUsageStats", "false", "--global.developmentMode", "false",
            "--server.fileWatcherType", "none", "--server.runOnSave", "false", "--client.toolbarMode", "minimal",
            "--", *paths]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tail(log: IO[bytes], limit: int = 2000) -> str:
    log.flush()
    log.seek(0)
    text = log.read().decode("utf-8", "replace").strip()
    return text[-limit:]


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log: IO[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not _healthy(url):
        if proc.poll() is not None:
            raise DiagnoseError(f"The dashboard server exited with code {proc.returncode} before it answered "
                                f"on {url} ({_tail(log) or 'no output'}).",
                                "Check that streamlit is installed (`pip install streamlit`) and the port is free.")
        if time.monotonic() > deadline:
            raise DiagnoseError(f"The dashboard server did not answer on {url} within {timeout_s:.0f} s "
                                f"({_tail(log) or 'no output'}).", "Try again, or pick another port with --port.")
        time.sleep(0.2)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the dashboard server (terminate, then kill after 10 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    log = getattr(proc, "diagnose_log", None)
    if log is not None:
        log.close()


def start(paths: Sequence[str], port: int | None = None,
          timeout_s: float = START_TIMEOUT_S) -> tuple[subprocess.Popen[bytes], str]:
    """Start the server on ``paths`` and wait until it answers; returns the process and its URL.

    The caller stops it with ``stop(proc)``. Raises ``InputError`` for a bad session path and
    ``DiagnoseError`` when the server does not come up (with the end of its output).
    """
    sessions = check_sessions(paths)
    if port is None:
        port = free_port()
    else:
        _check_port(port)
    url = f"http://{HOST}:{port}"
    env = dict(os.environ)
    env.pop(ENV_SESSIONS, None)  # the sessions on the command line are the ones to show
    # the server's output, for the error message if it does not come up; closed by stop()
    log = tempfile.TemporaryFile(prefix="diagnose-dashboard-")  # noqa: SIM115
    proc = subprocess.Popen(command(sessions, port), stdin=subprocess.DEVNULL, stdout=log,
                            stderr=subprocess.STDOUT, env=env)
    proc.diagnose_log = log  # type: ignore[attr-defined]
    try:
        _wait_healthy(proc, url, log, timeout_s)
    except BaseException:  # a bad start, or Ctrl-C while waiting: never leave the server behind
        stop(proc)
        raise
    return proc, url


def run(paths: list[str], port: int | None = None, open_browser: bool = False) -> int:
    """``diagnose dashboard``: serve until Ctrl-C. 0 when stopped, 2 on bad input, 1 if the server died."""
    saved: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        # Ctrl-C, or a TERM from a supervisor, stops the server too (not only this process);
        # SIGINT is set explicitly because a shell's `cmd &` starts it ignored
        for sig in (signal.SIGINT, signal.SIGTERM):
            saved[sig] = signal.signal(sig, _interrupt)
    try:
        return _serve(paths, port, open_browser)
    except KeyboardInterrupt:
        return 0
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _serve(paths: list[str], port: int | None, open_browser: bool) -> int:
    try:
        proc, url = start(paths, port)
    except DiagnoseError as exc:
        print(f"diagnose: {exc}", file=sys.stderr)
        return exc.exit_code
    try:
        print(f"Dashboard: {url}  (Ctrl-C to stop)", flush=True)
        if open_browser:
            with contextlib.suppress(webbrowser.Error):
                webbrowser.open(url)
        code = proc.wait()
        if code != 0:
            print(f"diagnose: the dashboard server stopped with exit code {code}.", file=sys.stderr)
            return 1
        return 0
    finally:
        stop(proc)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m diagnose.dashboard.launch",
                                 description="Serve the diagnose dashboard.")
    ap.add_argument("paths", nargs="+", help="session folders or .tar.gz")
    ap.add_argument("--port", type=int, default=None, help="port on 127.0.0.1 (default: a free one)")
    ap.add_argument("--browser", action="store_true", help="open a browser on the dashboard")
    args = ap.parse_args(argv)
    return run(args.paths, args.port, args.browser)


if __name__ == "__main__":
    sys.exit(main())
