"""A FastAPI service whose model is guarded by a lock that a background refresher holds while it fetches.

The pattern of many "hot reload" services: a thread refreshes the weights every few hundred
milliseconds and, to keep requests from seeing half-loaded weights, holds the model's lock for the
whole refresh — the fetch from the weight store included (a sleep stands in for it here). Requests
(sync endpoints, run in anyio's worker threads) spend most of their time waiting for that lock while
the CPU sits idle. usage: python fastapi_lock_background_refresh.py PORT
"""

import sys
import threading
import time

import torch
import uvicorn
from fastapi import FastAPI

torch.set_num_threads(1)
app = FastAPI()
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
MODEL_LOCK = threading.Lock()
REFRESH_EVERY_S = 0.05
FETCH_S = 0.25  # the weight store's latency, paid while holding the lock


def fetch_weights() -> dict:
    time.sleep(FETCH_S)  # stands in for an HTTP / object-store download
    return {k: v + 0.0 for k, v in model.state_dict().items()}


def refresh_forever() -> None:
    while True:
        with MODEL_LOCK:  # the bug: the fetch happens inside the critical section
            model.load_state_dict(fetch_weights())
        time.sleep(REFRESH_EVERY_S)


@app.post("/embed")
def embed(payload: dict) -> dict:
    x = torch.tensor(payload["rows"], dtype=torch.float32)
    with MODEL_LOCK:
        with torch.no_grad():
            y = model(x)
    return {"norms": y.norm(dim=1).tolist()}


if __name__ == "__main__":
    threading.Thread(target=refresh_forever, name="weights-refresher", daemon=True).start()
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), workers=1, log_level="warning")
