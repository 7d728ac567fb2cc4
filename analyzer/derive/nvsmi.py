"""``nvidia-smi`` text → ``gpu.*`` evidence: memory and utilisation per device, and who holds it.

``gpu.memory_used_bytes`` / ``gpu.memory_total_bytes`` describe the fullest device (the one an OOM
or a pre-allocation question is about); ``gpu.util_ratio`` is the mean over devices and snapshots;
``gpu.devices`` and ``gpu.processes`` carry the full lists.
"""

from __future__ import annotations

from typing import Any

from analyzer.model import Evidence
from collectors.nvsmi import NvsmiParser


class NvsmiSource:
    """Text source for nvidia-smi output."""

    kind = "nvidia-smi"
    # `nvidia-smi -l` logs repeat the table: the banner and every memory cell carry these
    triggers = ("NVIDIA-SMI", ("MiB", 1, 0))  # with the GPU name row above a usage row

    def __init__(self) -> None:
        self._p = NvsmiParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return self._p.matched()

    def problems(self) -> list[str]:
        if self._p.processes and not self._p.gpus:
            return ["nvidia-smi process lines without the GPU table: the device's total memory is unknown"]
        return []

    def evidence(self, source: str) -> list[Evidence]:
        out: list[Evidence] = []
        gpus = [g for g in self._p.gpus.values() if g.memory_total]
        if gpus:
            out.append(Evidence("gpu.count", len(self._p.gpus), "gpus", source, detail="devices in nvidia-smi"))
            full = max(gpus, key=lambda g: (g.memory_used or 0) / (g.memory_total or 1))
            label = f"GPU {full.index}" + (f" ({full.name})" if full.name else "")
            out.append(Evidence("gpu.memory_used_bytes", full.memory_used, "bytes", source,
                                detail=f"{label}, the fullest of {len(gpus)}"))
            out.append(Evidence("gpu.memory_total_bytes", full.memory_total, "bytes", source, detail=label))
            utils = [g.util for g in gpus if g.util is not None]
            if utils:
                snaps = self._p.snapshots or 1
                out.append(Evidence("gpu.util_ratio", sum(utils) / len(utils), "ratio", source,
                                    detail=f"mean over {len(utils)} device(s) and {snaps} snapshot(s)"))
            out.append(Evidence("gpu.devices", [
                {"index": g.index, "name": g.name, "memory_used_bytes": g.memory_used,
                 "memory_total_bytes": g.memory_total, "util_ratio": g.util} for g in gpus], "list", source))
        if self._p.processes:
            procs = sorted(self._p.processes.values(), key=lambda p: -p.used)
            out.append(Evidence("gpu.processes", [
                {"gpu": p.gpu, "pid": p.pid, "name": p.name, "used_bytes": p.used, "type": p.type}
                for p in procs], "list", source, detail=f"{len(procs)} process(es) holding GPU memory"))
        elif self._p.no_processes:
            out.append(Evidence("gpu.processes", [], "list", source, detail="No running processes found"))
        return out


def sources() -> list[Any]:
    return [NvsmiSource()]
