"""A FastAPI service that torch.compiles its model and batches whatever arrives: the batch size follows the request.

``dynamic=False`` (chosen to get static-shape kernels) makes every new batch size a recompile. The
author saw dynamo's "hit config.recompile_limit (8)" warning, and raised the limit so that it goes
away (as many do), which keeps the service recompiling for every new size instead of silently
falling back to eager after eight. On the CPU, inductor builds each graph's C++ kernels with the
system compiler: ``g++``/``cc1plus``/``ld`` run as child processes (or as children of inductor's
compile workers) while the request thread waits for them.
usage: python fastapi_compiled_varying_shapes.py PORT
"""

import sys

import torch
import torch._dynamo.config
import uvicorn
from fastapi import FastAPI

torch.set_num_threads(1)
torch._dynamo.config.recompile_limit = 100_000  # "hit config.recompile_limit (8)": raised, warning gone
torch._dynamo.config.accumulated_recompile_limit = 100_000
app = FastAPI()
layers = []
for _ in range(6):
    layers += [torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64), torch.nn.LayerNorm(64)]
model = torch.compile(torch.nn.Sequential(*layers).eval(), dynamic=False)


@app.post("/embed")
def embed(payload: dict) -> dict:
    rows = payload["rows"]  # the batch the client sent: its size is whatever it is
    x = torch.tensor(rows, dtype=torch.float32)
    with torch.no_grad():
        y = model(x)
    return {"norms": y.norm(dim=1).tolist()}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), workers=1, log_level="warning")
