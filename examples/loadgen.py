"""A closed-loop load generator for the demo service (threads + http.client, 127.0.0.1 only).

Each of ``concurrency`` client threads sends one request, waits for the reply, optionally thinks
for ``think_s``, and sends the next, until ``duration_s`` is over, ``max_requests`` were sent, or a
``stop`` event is set.

    python -m diagnose.examples.loadgen --url http://127.0.0.1:8000 --pathology queueing --concurrency 16 --duration 10

For ``prefill`` each request is a prompt of 64-4096 words with a streamed reply; the client reads
it line by line and records its time to first token (``LoadResult.ttft_p50_ms``/``ttft_p99_ms``).
"""

from __future__ import annotations

import argparse
import functools
import http.client
import io
import json
import random
import sys
import threading
import time
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from diagnose.stats import quantile

ALLOWED_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
NDJSON = "application/x-ndjson"  # the content type of streamed (one JSON line per token) replies
MAX_DURATION_S = 3600.0
DEFAULT_MAX_REQUESTS = 1_000_000
JPEG_SIZE = (640, 480)
TOKENS_PER_REQUEST = {"queueing": 128, "healthy": 64}
PROMPT_WORDS_RANGE = (64, 4096)  # prefill: prompt lengths (one token per word), uniformly drawn
PREFILL_MAX_TOKENS_RANGE = (16, 48)  # prefill: tokens generated per request, uniformly drawn
# Client i sends its first request after i x this many seconds, so that the clients do not all
# arrive at once (a synchronised start would keep them in lock-step, each behind another's prefill).
START_STAGGER_S = {"prefill": 1.0}
_SYLLABLES = ("ka", "lo", "mi", "nu", "pe", "ra", "si", "to", "vu", "ze", "an", "el", "or", "ut", "ix", "ba")
_WORDS = tuple(a + b + c for a in _SYLLABLES for b in _SYLLABLES for c in _SYLLABLES[:8])  # 2048 words


@dataclass(frozen=True)
class LoadResult:
    requests: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    duration_s: float
    # time to first token, measured by the client on streamed replies (None when nothing streamed)
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None

    def to_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


@functools.lru_cache(maxsize=4)
def make_jpeg(width: int = JPEG_SIZE[0], height: int = JPEG_SIZE[1], seed: int = 0) -> bytes:
    """A ``width`` x ``height`` RGB JPEG (colour gradient plus noise), generated once."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([x * 255 / width, y * 255 / height, (x + y) * 255 / (width + height)], axis=-1)
    rgb += rng.normal(0.0, 25.0, size=rgb.shape).astype(np.float32)
    img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), mode="RGB")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def make_prompt(rng: random.Random, words: int) -> str:
    """A prompt of ``words`` words (the demo tokeniser makes one token of each)."""
    return " ".join(rng.choices(_WORDS, k=words))


def make_payload(pathology: str, rng: random.Random) -> tuple[bytes, str]:
    """The body and content type of one /infer request for ``pathology``."""
    if pathology == "cpu-preprocess":
        return make_jpeg(), "image/jpeg"
    if pathology == "prefill":
        words = rng.randint(*PROMPT_WORDS_RANGE)
        max_tokens = rng.randint(*PREFILL_MAX_TOKENS_RANGE)
        doc = {"prompt": make_prompt(rng, words), "max_tokens": max_tokens, "stream": True}
        return json.dumps(doc).encode(), "application/json"
    if pathology == "recompile":
        # No batch size: the service's batcher picks a new one for every request.
        return json.dumps({"request": rng.randrange(1 << 30)}).encode(), "application/json"
    n = TOKENS_PER_REQUEST.get(pathology, 64)
    doc = {"tokens": [rng.randrange(32000) for _ in range(n)]}
    return json.dumps(doc).encode(), "application/json"


def _read_stream(resp: http.client.HTTPResponse, t0: float) -> tuple[bool, float | None]:
    """Read a streamed NDJSON reply line by line: (completed without error, ms to the first token)."""
    ttft_ms: float | None = None
    done = False
    for raw in resp:
        line = raw.strip()
        if not line:
            continue
        doc = json.loads(line)
        if "token" in doc and ttft_ms is None:
            ttft_ms = (time.perf_counter() - t0) * 1e3
        if "error" in doc:
            return False, ttft_ms
        done = done or bool(doc.get("done"))
    return done, ttft_ms


def _check_target(base_url: str) -> tuple[str, int]:
    parts = urlsplit(base_url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"expected an http://127.0.0.1:PORT URL, got {base_url!r}")
    if parts.hostname not in ALLOWED_HOSTS:
        raise ValueError(f"the load generator only targets the local host, not {parts.hostname!r}")
    if parts.port is None:
        raise ValueError(f"the URL needs an explicit port: {base_url!r}")
    return parts.hostname, parts.port


def run_load(
    base_url: str,
    pathology: str,
    concurrency: int,
    duration_s: float,
    think_s: float = 0.0,
    *,
    max_requests: int | None = None,
    timeout_s: float = 120.0,
    stop: threading.Event | None = None,
) -> LoadResult:
    """Drive ``concurrency`` closed-loop clients against ``base_url``/infer for ``duration_s``."""
    host, port = _check_target(base_url)
    if concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    if not 0 < duration_s <= MAX_DURATION_S:
        raise ValueError(f"duration_s must be in (0, {MAX_DURATION_S}]")
    budget = DEFAULT_MAX_REQUESTS if max_requests is None else max_requests
    stop_event = stop if stop is not None else threading.Event()
    lock = threading.Lock()
    latencies_ms: list[float] = []
    ttfts_ms: list[float] = []
    errors = 0
    sent = 0

    def take_ticket() -> bool:
        nonlocal sent
        with lock:
            if sent >= budget:
                return False
            sent += 1
            return True

    start = time.perf_counter()
    deadline = start + duration_s

    def client(idx: int) -> None:
        nonlocal errors
        rng = random.Random(idx)
        stop_event.wait(idx * START_STAGGER_S.get(pathology, 0.0))
        while time.perf_counter() < deadline and not stop_event.is_set() and take_ticket():
            body, content_type = make_payload(pathology, rng)
            t0 = time.perf_counter()
            ok = False
            ttft_ms: float | None = None
            conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
            try:
                conn.request("POST", "/infer", body=body, headers={"Content-Type": content_type})
                resp = conn.getresponse()
                if resp.status == 200 and (resp.getheader("Content-Type") or "").startswith(NDJSON):
                    ok, ttft_ms = _read_stream(resp, t0)
                else:
                    resp.read()
                    ok = resp.status == 200
            except (OSError, ValueError, http.client.HTTPException):
                ok = False
            finally:
                conn.close()
            elapsed_ms = (time.perf_counter() - t0) * 1e3
            with lock:
                if ok:
                    latencies_ms.append(elapsed_ms)
                    if ttft_ms is not None:
                        ttfts_ms.append(ttft_ms)
                else:
                    errors += 1
            if not ok:
                stop_event.wait(0.05)  # do not spin on a dead service
            if think_s > 0:
                stop_event.wait(think_s)

    threads = [threading.Thread(target=client, args=(i,), name=f"loadgen-{i}", daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    lat = sorted(latencies_ms)
    ttft = sorted(ttfts_ms)
    return LoadResult(
        requests=len(lat) + errors,
        errors=errors,
        throughput_rps=round(len(lat) / elapsed, 3) if elapsed > 0 else 0.0,
        p50_ms=round(quantile(lat, 0.50) or 0.0, 3),
        p99_ms=round(quantile(lat, 0.99) or 0.0, 3),
        duration_s=round(elapsed, 3),
        ttft_p50_ms=round(quantile(ttft, 0.50) or 0.0, 3) if ttft else None,
        ttft_p99_ms=round(quantile(ttft, 0.99) or 0.0, 3) if ttft else None,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diagnose.examples.loadgen", description="Closed-loop load generator.")
    p.add_argument("--url", required=True, help="base URL of the service, e.g. http://127.0.0.1:8000")
    p.add_argument("--pathology", required=True, help="the service's pathology (chooses the payload)")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--duration", type=float, default=10.0, help="seconds")
    p.add_argument("--think", type=float, default=0.0, help="seconds each client waits between requests")
    p.add_argument("--max-requests", type=int, default=None)
    args = p.parse_args(argv)
    try:
        result = run_load(
            args.url,
            args.pathology,
            args.concurrency,
            args.duration,
            args.think,
            max_requests=args.max_requests,
        )
    except ValueError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
