"""Text source: the probe's allocator-state and OOM lines → the mem.* evidence the OOM rules read.

The probe (``diagnose.collectors.torch_probe``) writes ``{"ts": …, "cuda_memory": {"devices": {"0": {…}}}}``
every few seconds and ``{"ts": …, "oom": {…, "cuda_memory": {…}}}`` at an OOM, both into its stage
log. Numbers beat messages: the allocator's own counters at the moment of the OOM are taken over
whatever the exception text said, because this source is listed before the OOM-message parser's
keys are merged (the first source of a key wins).
"""

from __future__ import annotations

import json
from typing import Any

from diagnose.model import Evidence

_STAT = {
    "allocated_bytes.all.current": "mem.allocated_bytes",
    "reserved_bytes.all.current": "mem.reserved_bytes",
    "inactive_split_bytes.all.current": "mem.inactive_split_bytes",
    "num_alloc_retries": "mem.alloc_retries",
    "total_bytes": "mem.device_total_bytes",
    "free_bytes": "mem.device_free_bytes",
    "weights_bytes": "mem.weights_bytes",
}


class ProbeStateSource:
    kind = "probe-cuda-memory"
    triggers = ('"cuda_memory"', '"oom"')

    def __init__(self) -> None:
        self._last_state: dict[str, Any] | None = None
        self._oom_state: dict[str, Any] | None = None
        self._ooms = 0

    def feed(self, line: str) -> None:
        if not line.startswith("{") or ('"cuda_memory"' not in line and '"oom"' not in line):
            return
        try:
            doc = json.loads(line)
        except ValueError:
            return
        if not isinstance(doc, dict):
            return
        oom = doc.get("oom")
        if isinstance(oom, dict):
            self._ooms += 1
            state = oom.get("cuda_memory")
            if isinstance(state, dict):
                self._oom_state = state
        state = doc.get("cuda_memory")
        if isinstance(state, dict) and isinstance(state.get("devices"), dict):
            self._last_state = state

    def matched(self) -> bool:
        return self._ooms > 0 or self._last_state is not None

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        state = self._oom_state or self._last_state
        out: list[Evidence] = []
        when = "at the OOM" if self._oom_state else "latest periodic reading"
        if self._ooms:
            out.append(Evidence("mem.oom_count", self._ooms, "count", source, detail="OOMs the probe recorded"))
        devices = state.get("devices") if state else None
        if not isinstance(devices, dict) or not devices:
            return out
        # the device that holds the most: that is where an OOM happens
        dev = max((d for d in devices.values() if isinstance(d, dict)),
                  key=lambda d: d.get("reserved_bytes.all.current") or 0, default=None)
        if dev is None:
            return out
        for stat, key in _STAT.items():
            v = dev.get(stat)
            if isinstance(v, int | float) and not isinstance(v, bool) and (v > 0 or key != "mem.weights_bytes"):
                out.append(Evidence(key, v, "count" if key == "mem.alloc_retries" else "bytes", source,
                                    detail=f"CUDA caching allocator, {when} (diagnose probe)"))
        alloc, reserved = dev.get("allocated_bytes.all.current"), dev.get("reserved_bytes.all.current")
        if isinstance(alloc, int | float) and isinstance(reserved, int | float):
            out.append(Evidence("mem.reserved_minus_allocated_bytes", max(0, reserved - alloc), "bytes", source,
                                detail=f"reserved but unallocated, {when}"))
        if state and "expandable_segments" in state:
            out.append(Evidence("mem.expandable_segments", bool(state["expandable_segments"]), "flag", source))
        return out


def sources() -> list[ProbeStateSource]:
    return [ProbeStateSource()]
