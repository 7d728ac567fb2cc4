"""A FastAPI service that torch.compiles its model and is fed sequences of any length.

``dynamic=False`` (chosen to get static-shape kernels) makes every new sequence length a
recompile, until dynamo's recompile limit (default 8) silently falls back to eager.
usage: python fastapi_compiled_varying_shapes.py PORT
"""

import sys

import torch
import uvicorn
from fastapi import FastAPI

torch.set_num_threads(1)
app = FastAPI()
layers = []
for _ in range(24):
    layers += [torch.nn.Linear(64, 64), torch.nn.GELU()]
model = torch.compile(torch.nn.Sequential(*layers).eval(), dynamic=False)


@app.post("/embed")
def embed(payload: dict) -> dict:
    tokens = payload["tokens"]
    x = torch.randn(1, len(tokens), 64)
    with torch.no_grad():
        y = model(x)
    return {"norm": float(y.norm())}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), workers=1, log_level="warning")
