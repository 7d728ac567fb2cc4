"""Record one llama.cpp pathology: start a real server on loopback, drive it with diagnose's load
client, keep the server's log, its /metrics scrapes and the client's results.

    python3 tests/engines/llamacpp_record.py OUTDIR --engine cpp --model M.gguf --clients 8 \
        --prompt-words 32 --max-tokens 64 --duration 20 [--parallel 2] [--server-arg=--foo ...]

engines: ``py`` = ``python -m llama_cpp.server`` from the lab venv (llama-cpp-python), ``cpp`` = the C++
``llama-server`` built by tests/engines/llamacpp_lab.sh (started with ``--metrics``).

Writes into OUTDIR:
  server.log          the server's stdout+stderr (trimmed to < 300 KB, whole lines; a trimmed middle is
                      replaced by one line ``[... N lines trimmed by llamacpp_record.py ...]``)
  metrics.txt         /metrics at the measured window's start and just before its end, one after the other
                      (cpp only; load running; load.json keeps their times as metrics_start/end.prom)
  slots_mid.json      /slots in the middle of the window (cpp only, when the server answers it)
  load.json           the load client's options, summary and every request's sample
  command.txt         the exact server command line and this script's arguments
  attach/             with --attach N: `diagnose attach` on the server's pid for N s after the warm-up, with its
                      log (and the C++ server's /metrics); its stdout and stderr in attach.json / attach.stderr.txt

The load client is ``diagnose.collectors.loadclient`` (the one ``diagnose sweep`` uses): imported from
the project's venv when this runs there, else loaded from collectors/loadclient.py (standard library
only). Everything is bounded: the server must be ready within --ready-timeout, the load runs warm-up +
duration (stretched to 1.5 times the probe request's time when one request outlasts it, so that one request
starts inside the window whatever the host's speed), each request times out, the server is stopped (SIGINT,
then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]
ENGINES = Path(os.environ.get("DIAGNOSE_ENGINES", REPO / ".engines"))  # as tests/engines/llamacpp_lab.sh
VENV = ENGINES / "llamacpp"
LLAMA_SERVER = ENGINES / "bin" / "llama-server"
DIAGNOSE = REPO / ".venv" / "bin" / "diagnose"
LOG_LIMIT = 300_000
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor")


def loadclient() -> ModuleType:
    try:
        from diagnose.collectors import loadclient as lc
        return lc
    except ImportError:
        spec = importlib.util.spec_from_file_location("loadclient", REPO / "collectors" / "loadclient.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules["loadclient"] = mod
        spec.loader.exec_module(mod)
        return mod


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (OSError, ValueError):
        return 0, b""


def server_cmd(a: argparse.Namespace, port: int) -> list[str]:
    if a.engine == "py":
        cmd = [str(VENV / "bin" / "python"), "-m", "llama_cpp.server", "--model", a.model, "--host", "127.0.0.1",
               "--port", str(port), "--n_ctx", str(a.ctx), "--n_threads", str(a.threads)]
    else:
        cmd = [str(LLAMA_SERVER), "-m", a.model, "--host", "127.0.0.1", "--port", str(port), "--parallel",
               str(a.parallel), "--metrics", "-c", str(a.ctx), "-t", str(a.threads)]
    return cmd + list(a.server_arg)


def trim_log(raw: bytes) -> bytes:
    if len(raw) <= LOG_LIMIT:
        return raw
    lines = raw.splitlines(keepends=True)
    head, tail, hb, tb = [], [], 0, 0
    for ln in lines:  # the head: start-up (model load, tensors, threads)
        if hb + len(ln) > LOG_LIMIT * 0.4:
            break
        head.append(ln)
        hb += len(ln)
    for ln in reversed(lines[len(head):]):  # the tail: the load window and shutdown
        if hb + tb + len(ln) > LOG_LIMIT - 200:
            break
        tail.append(ln)
        tb += len(ln)
    tail.reverse()
    cut = len(lines) - len(head) - len(tail)
    return b"".join(head) + f"[... {cut} lines trimmed by llamacpp_record.py ...]\n".encode() + b"".join(tail)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--engine", choices=("py", "cpp"), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--prompt-words", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--timeout", type=float, default=120.0, help="per request")
    ap.add_argument("--max-requests", type=int, default=2000)
    ap.add_argument("--parallel", type=int, default=1, help="llama-server --parallel (slots)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chat", action="store_true", help="POST /v1/chat/completions instead of /v1/completions")
    ap.add_argument("--server-arg", action="append", default=[], help="one more server argument (repeatable)")
    ap.add_argument("--ready-timeout", type=float, default=120.0)
    ap.add_argument("--attach", type=float, default=0.0, metavar="SECONDS",
                    help="run `diagnose attach` on the server for SECONDS once the warm-up is over (OUT/attach)")
    a = ap.parse_args(argv)
    lc = loadclient()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = server_cmd(a, port)
    base = f"http://127.0.0.1:{port}"
    (out / "command.txt").write_text("server: " + shlex.join(cmd).replace(str(REPO) + "/", "") + "\n"
                                     + "recorder: tests/engines/llamacpp_record.py "
                                     + shlex.join(sys.argv[1:] if argv is None else argv).replace(str(REPO) + "/", "")
                                     + "\n")
    log_path = out / "server.log.raw"
    t_start = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        ready_path = "/health" if a.engine == "cpp" else "/v1/models"
        deadline = time.monotonic() + a.ready_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}; see {log_path}")
            if http_get(base + ready_path, 2.0)[0] == 200:
                break
            time.sleep(0.5)
        else:
            raise SystemExit("server not ready in time")
        ready_s = time.monotonic() - t_start
        path = "/v1/chat/completions" if a.chat else "/v1/completions"

        def body(n: int) -> bytes:
            rng = random.Random(n)
            prompt = " ".join(rng.choice(WORDS) for _ in range(a.prompt_words))
            doc: dict[str, object] = {"model": "lab", "max_tokens": a.max_tokens, "stream": True}
            if a.chat:
                doc["messages"] = [{"role": "user", "content": prompt}]
            else:
                doc["prompt"] = prompt
            return json.dumps(doc).encode()

        spec = lc.RequestSpec(lc.Target.parse(base + path), "POST", (), body, a.timeout)
        probe = lc.probe(spec)  # one warm request before the window
        # a window shorter than one request measures nothing: the request running through the warm-up ends
        # after the window and none starts in it (one 3,500-token stream took 21 s here, 27 s on a busier
        # host). The window is stretched to 1.5 requests as the probe timed one, so one starts inside it.
        asked_s = a.duration
        if probe.ok:
            a.duration = max(a.duration, round(1.5 * probe.latency_s, 1))
        scrapes: dict[str, float] = {}

        def scraper() -> None:
            if a.engine != "cpp":
                return
            t0 = time.monotonic()
            plan = [("metrics_start.prom", a.warmup), ("slots_mid.json", a.warmup + a.duration / 2),
                    ("metrics_end.prom", a.warmup + a.duration - 0.5)]
            for name, at in plan:
                time.sleep(max(0.0, t0 + at - time.monotonic()))
                url = base + ("/metrics" if name.endswith(".prom") else "/slots")
                code, data = http_get(url, 10.0)
                scrapes[name] = round(time.monotonic() - t0, 3)
                if code == 200 and name.endswith(".prom"):
                    # both scrapes in one file, one after the other, as `curl` twice would append them
                    with (out / "metrics.txt").open("ab") as fh:
                        fh.write(data)
                elif code == 200:
                    (out / name).write_bytes(data)
                else:
                    scrapes[name + " status"] = code

        def attacher() -> None:  # the live session, on the server's pid, with its log
            time.sleep(a.warmup)
            # the C++ server's /metrics too (--metrics), as the two scrapes of metrics.txt read it
            metrics = ["--metrics", base + "/metrics"] if a.engine == "cpp" else []
            with (out / "attach.json").open("wb") as so, (out / "attach.stderr.txt").open("wb") as se:
                subprocess.run([str(DIAGNOSE), "attach", "--pid", str(proc.pid), "--duration", f"{a.attach:g}",
                                "--log", str(log_path), *metrics, "-o", str(out / "attach"), "--format", "json",
                                "--force"], stdout=so, stderr=se, check=False)
            (out / "attach" / "attach.html").unlink(missing_ok=True)

        th = threading.Thread(target=scraper, daemon=True)
        th.start()
        live = threading.Thread(target=attacher, daemon=True)
        if a.attach:
            live.start()
        res = lc.run_step(spec, a.clients, a.warmup, a.duration, a.max_requests)
        th.join(15)
        if a.attach:
            live.join(a.attach + 60)
    finally:
        if proc.poll() is None:
            for sig, wait in ((signal.SIGINT, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
    raw = log_path.read_bytes()
    (out / "server.log").write_bytes(trim_log(raw))
    log_path.unlink()

    samples = res.samples
    ok = [s for s in samples if s.ok]

    def q(xs: list[float], p: float) -> float | None:
        if not xs:
            return None
        xs = sorted(xs)
        return round(1000 * xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))], 1)

    ttft = [s.ttft_s for s in ok if s.ttft_s is not None]
    lat = [s.latency_s for s in ok]
    tok_hist: dict[str, int] = {}
    for s in ok:
        tok_hist[str(s.tokens)] = tok_hist.get(str(s.tokens), 0) + 1
    t0 = min((s.start for s in samples), default=0.0)
    doc = {
        "engine": a.engine, "endpoint": path, "clients": a.clients, "prompt_words": a.prompt_words,
        "max_tokens": a.max_tokens, "warmup_s": a.warmup, "duration_s": a.duration, "duration_asked_s": asked_s,
        "stream": True,
        "server_ready_s": round(ready_s, 2), "raw_log_bytes": len(raw), "scrape_at_s": scrapes,
        "probe": {"ok": probe.ok, "status": probe.status, "ttft_ms": q([probe.ttft_s], 0.5) if probe.ttft_s else None,
                  "tokens": probe.tokens, "latency_ms": round(1000 * probe.latency_s, 1)},
        "summary": {
            "requests": len(samples), "ok": len(ok), "errors": len(samples) - len(ok),
            "status_codes": res.status_codes, "completed_in_window": res.completed_in_window,
            "throughput_rps": round(res.completed_in_window / a.duration, 3),
            "latency_p50_ms": q(lat, 0.5), "latency_p99_ms": q(lat, 0.99),
            "ttft_p50_ms": q(ttft, 0.5), "ttft_p99_ms": q(ttft, 0.99),
            "tokens_per_request_hist": dict(sorted(tok_hist.items(), key=lambda kv: int(kv[0]))),
            "tokens_mean": round(sum(s.tokens for s in ok) / len(ok), 2) if ok else None,
            "streams_short": sum(1 for s in ok if s.tokens < a.max_tokens),
            "client_cpu_cores": round(res.client_cpu_cores, 3),
        },
        "samples": [{"t_start_s": round(s.start - t0, 3), "latency_ms": round(1000 * s.latency_s, 1),
                     "ttft_ms": round(1000 * s.ttft_s, 1) if s.ttft_s is not None else None, "tokens": s.tokens,
                     "status": s.status, "ok": s.ok, **({"error": s.error} if s.error else {})} for s in samples],
    }
    (out / "load.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "samples"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
