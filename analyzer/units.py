"""Sizes and shares: the one table of size units diagnose reads, and the one way it writes them.

Reading. ``SIZE_UNITS`` maps every spelling of a size unit to bytes, and it is binary throughout:
``KB``/``MB``/``GB``/``TB`` are 1024-based like ``KiB``/``MiB``/``GiB``/``TiB``, as the tools whose
text diagnose reads mean them:

* PyTorch's CUDA allocator divides by 1024 and says so (``Tried to allocate 20.00 MiB (GPU 0;
  7.79 GiB total capacity; ...)``); torch 1.x's ``memory_summary`` divided by 1024 too and printed
  ``KB``/``MB``/``GB``;
* vLLM's ``Loading model weights took 14.99 GB`` is bytes / 2**30, and so are its KV-cache sizes;
* nvidia-smi prints ``MiB`` (older drivers and some of its CSV headers ``MB``, the same MiB), and
  NVML's ``KB/s`` is KiB/s;
* the one-letter shorthand of nvidia-smi and torch (``12K``, ``3.5G``) is binary;
* a person's "24 GB GPU" is the card's 24 GiB.

Until issue 14 the OOM reader took ``KB``/``MB``/``GB`` as decimal while the nvidia-smi reader took
them as binary; a vLLM weights line of "14.99 GB" read 7 % short.

The one tool known to print decimal units is Nsight Systems: ``nsys stats``' ``(MB)`` columns are
10**6 bytes. Its reader asks ``unit_bytes(unit, decimal=True)``, which takes ``KB``/``MB``/``GB``/``TB``
as powers of 1000 and every other spelling from the same table.

Writing. ``size`` writes bytes in the largest binary unit they reach (``7.79 GiB``, ``145.2 MiB``)
and ``pct`` a ratio as a percentage (``45 %``): every report, rule message and evidence detail
uses these two, so one figure reads the same wherever it is shown.

Like ``diagnose.model`` this module imports nothing of diagnose's: every layer may use it.
"""

from __future__ import annotations

import re

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40

SIZE_UNITS: dict[str, int] = {
    "b": 1, "byte": 1, "bytes": 1,
    "k": KIB, "kb": KIB, "kib": KIB,
    "m": MIB, "mb": MIB, "mib": MIB,
    "g": GIB, "gb": GIB, "gib": GIB,
    "t": TIB, "tb": TIB, "tib": TIB,
}
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}

SIZE = r"(?<![\d.])(?:\d+(?:\.\d+)?|\.\d+)\s?(?:[KMGT]i?B|bytes?|B)"  # a size with its unit, for a larger regex
_SIZE_RX = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?|\.\d+)\s?([KMGT]i?B|bytes?|B|[KMGT])\b", re.IGNORECASE)


def unit_bytes(unit: str, *, decimal: bool = False) -> int | None:
    """Bytes in one ``unit`` (any case), None for a spelling that is no size unit. ``decimal``: the
    tool prints SI units (``nsys stats``), so ``KB``..``TB`` are powers of 1000."""
    u = unit.strip().lower()
    if decimal and u in _DECIMAL:
        return _DECIMAL[u]
    return SIZE_UNITS.get(u)


def parse_size(text: str) -> int | None:
    """The first size in ``text`` in bytes: ``"79.35 GiB"``, ``"2.00 GB"``, ``"12K"``, ``"4096 bytes"``."""
    m = _SIZE_RX.search(text)
    if not m:
        return None
    unit = unit_bytes(m.group(2))
    return None if unit is None else int(float(m.group(1)) * unit)


def size(n: float, digits: int = 2) -> str:
    """Bytes in the largest binary unit they reach, with ``digits`` decimals (whole bytes below a KiB):
    ``size(20 * MIB) == "20.00 MiB"`` as torch's allocator prints it, ``size(8.36e9, 1) == "7.8 GiB"`` for a
    reading whose last digits are noise."""
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if abs(n) >= scale:
            return f"{n / scale:,.{digits}f} {unit}"
    return f"{n:,.0f} B"


def pct(ratio: float, digits: int = 0, *, signed: bool = False) -> str:
    """A ratio as a percentage with a space before the sign: ``pct(0.452) == "45 %"``; ``signed`` for a
    change (``pct(-0.2, signed=True) == "-20 %"``, ``"+5 %"``)."""
    return f"{100 * ratio:{'+' if signed else ''}.{digits}f} %"
