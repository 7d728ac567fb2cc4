"""Build the test snapshots to the documented format of ``torch.cuda.memory._snapshot()``.

They are NOT recorded on hardware: ``_snapshot()`` needs CUDA. Each file is a dict shaped like the
``Snapshot`` / ``Segment`` / ``Block`` / ``Frame`` / ``TraceEntry`` TypedDicts in the docstring of
``torch.cuda.memory._snapshot`` (torch 2.x), pickled with the standard pickler as
``_dump_snapshot`` does. Run ``python tests/data/snapshots/make_snapshots.py`` to rebuild them.

``malicious_os_system.pickle`` is a hostile pickle: loading it with ``pickle.load`` would run
``os.system("touch diagnose-snapshot-canary")`` in the current directory. The reader must refuse it.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

MIB = 1 << 20
GIB = 1 << 30
HERE = os.path.dirname(os.path.abspath(__file__))
TORCH = "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"
HF = "/opt/venv/lib/python3.11/site-packages/transformers/modeling_utils.py"

LOAD_STACK = [
    {"filename": TORCH, "line": 1341, "name": "convert"},
    {"filename": TORCH, "line": 942, "name": "_apply"},
    {"filename": TORCH, "line": 1355, "name": "to"},
    {"filename": HF, "line": 4180, "name": "from_pretrained"},
    {"filename": "/srv/app/server.py", "line": 31, "name": "load"},
    {"filename": "/srv/app/server.py", "line": 88, "name": "<module>"},
]
STATE_DICT_STACK = [
    {"filename": TORCH, "line": 2040, "name": "_load_from_state_dict"},
    {"filename": TORCH, "line": 2152, "name": "load"},
    {"filename": TORCH, "line": 2189, "name": "load_state_dict"},
    {"filename": HF, "line": 812, "name": "_load_state_dict_into_model"},
    {"filename": HF, "line": 4180, "name": "from_pretrained"},
    {"filename": "/srv/app/server.py", "line": 31, "name": "load"},
    {"filename": "/srv/app/server.py", "line": 88, "name": "<module>"},
]


def forward_stack(layer: str, line: int) -> list[dict[str, Any]]:
    return [
        {"filename": "/srv/app/model.py", "line": line, "name": layer},
        {"filename": "/srv/app/model.py", "line": 140, "name": "forward"},
        {"filename": TORCH, "line": 1762, "name": "_call_impl"},
        {"filename": TORCH, "line": 1751, "name": "_wrapped_call_impl"},
        {"filename": "/srv/app/server.py", "line": 61, "name": "handle_batch"},
        {"filename": "/srv/app/server.py", "line": 88, "name": "<module>"},
    ]


class _Addr:
    def __init__(self) -> None:
        self.next = 0x7F0000000000

    def take(self, size: int) -> int:
        a = self.next
        self.next += size
        return a


def block(addr: int, size: int, state: str, frames: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"size": size, "requested_size": size if state != "inactive" else 0, "address": addr, "state": state,
            "frames": frames or []}


def segment(addrs: _Addr, parts: list[tuple[int, str, list[dict[str, Any]] | None]],
            pool: tuple[int, int] = (0, 0)) -> dict[str, Any]:
    total = sum(p[0] for p in parts)
    base = addrs.take(total)
    blocks, off = [], 0
    for size, state, frames in parts:
        blocks.append(block(base + off, size, state, frames))
        off += size
    allocated = sum(p[0] for p in parts if p[1] != "inactive")
    return {"device": 0, "address": base, "total_size": total, "stream": 0,
            "segment_type": "large" if total > MIB else "small", "segment_pool_id": pool,
            "allocated_size": allocated, "active_size": allocated, "requested_size": allocated, "blocks": blocks}


def oom_entry(size: int, device_free: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": "oom", "size": size, "stream": 0, "device_free": device_free, "frames": frames,
            "pool_id": (0, 0), "time_us": 1764470000123456}


def alloc_entry(addr: int, size: int, frames: list[dict[str, Any]]) -> dict[str, Any]:
    return {"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": frames, "pool_id": (0, 0),
            "time_us": 1764470000000000}


def oom_fragmentation() -> dict[str, Any]:
    """Variable-length batches left 20 half-used 512 MiB segments: 6 GiB free in 100-120 MiB pieces,
    and a 1 GiB request fails although far more than 1 GiB sits inactive."""
    a = _Addr()
    segs = [segment(a, [(2 * GIB, "active_allocated", LOAD_STACK)])]
    for i in range(20):
        segs.append(segment(a, [
            (100 * MIB, "inactive", None),
            (100 * MIB, "active_allocated", forward_stack("attention", 77 + i)),
            (120 * MIB, "inactive", None),
            (100 * MIB, "active_allocated", forward_stack("mlp", 102)),
            (92 * MIB, "inactive", None),
        ]))
    traces = [[alloc_entry(segs[1]["address"] + 100 * MIB, 100 * MIB, forward_stack("attention", 77)),
               oom_entry(GIB, 200 * MIB, forward_stack("attention", 79))]]
    return {"segments": segs, "device_traces": traces}


def oom_weights() -> dict[str, Any]:
    """A 40 GiB checkpoint loaded onto a 40 GiB device: parameter blocks fill it, the next fails."""
    a = _Addr()
    segs = [segment(a, [(GIB, "active_allocated", STATE_DICT_STACK if i % 2 else LOAD_STACK)]) for i in range(37)]
    segs.append(segment(a, [(12 * MIB, "active_allocated", STATE_DICT_STACK), (8 * MIB, "inactive", None)]))
    traces = [[oom_entry(GIB, 480 * MIB, STATE_DICT_STACK)]]
    return {"segments": segs, "device_traces": traces}


def oom_peak() -> dict[str, Any]:
    """14 GiB of weights, then a large batch's activations take 60 GiB and a 4 GiB buffer fails;
    one CUDA-graph private pool; very little inactive memory."""
    a = _Addr()
    segs = [segment(a, [(2 * GIB, "active_allocated", LOAD_STACK)]) for _ in range(7)]
    for i in range(15):
        segs.append(segment(a, [(4 * GIB - 16 * MIB, "active_allocated", forward_stack("attention", 70 + i)),
                                (16 * MIB, "inactive", None)]))
    segs.append(segment(a, [(512 * MIB, "active_allocated", forward_stack("decode_step", 201))], pool=(1, 3)))
    traces = [[oom_entry(4 * GIB, GIB, forward_stack("mlp", 104))]]
    return {"segments": segs, "device_traces": traces}


class _Hostile:
    """A pickle payload that runs a shell command when unpickled with pickle.load."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (self.command,)


def malicious(command: str) -> bytes:
    return pickle.dumps({"segments": [], "device_traces": [], "x": _Hostile(command)}, protocol=4)


CASES = {"oom_fragmentation": oom_fragmentation, "oom_weights": oom_weights, "oom_peak": oom_peak}


def main() -> None:
    for name, build in CASES.items():
        with open(os.path.join(HERE, f"{name}.pickle"), "wb") as fh:
            pickle.dump(build(), fh)  # what torch.cuda.memory._dump_snapshot does
    with open(os.path.join(HERE, "malicious_os_system.pickle"), "wb") as fh:
        fh.write(malicious("touch diagnose-snapshot-canary"))


if __name__ == "__main__":
    main()
