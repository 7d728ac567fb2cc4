"""A FastAPI + uvicorn service with one worker whose endpoint runs the model inline.

The common mistake: a sync model call inside an ``async def`` endpoint blocks the event loop, so
one request is served at a time whatever the concurrency. usage: python fastapi_single_worker.py PORT
"""

import sys

import torch
import uvicorn
from fastapi import FastAPI

torch.set_num_threads(1)
app = FastAPI()
model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).eval()


@app.post("/predict")
async def predict(payload: dict) -> dict:
    x = torch.randn(16, 1024)
    with torch.no_grad():
        y = model(x)
    return {"score": float(y.mean())}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), workers=1, log_level="warning")
