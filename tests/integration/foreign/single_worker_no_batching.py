"""A uvicorn service with one model worker and no batching: each request holds the worker ~20 ms.

The shape of many first deployments: an ASGI app whose inference is serialised behind one lock (one
GPU context, one model instance, no dynamic batching), so it serves at most ~50 requests/s however
many clients wait. The 20 ms are a sleep standing in for the model (so that the test machine's two
cores are left to the load generator). usage: python single_worker_no_batching.py PORT
"""

import asyncio
import json
import sys

import uvicorn

WORK_S = 0.020
lock = asyncio.Lock()


async def app(scope, receive, send):  # a plain ASGI app: no framework between uvicorn and the handler
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/healthz":
        payload, status = b'{"status": "ok"}', 200
    else:
        async with lock:  # one worker: requests wait here
            await asyncio.sleep(WORK_S)
        payload, status = json.dumps({"ok": True, "bytes": len(body)}).encode(), 200
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), workers=1, log_level="warning")
