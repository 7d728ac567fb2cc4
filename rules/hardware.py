"""What a GPU can compute: dense FP16/BF16 tensor throughput by model name, to judge a measured rate against.

Figures are the vendors' datasheet numbers for dense (not sparse) FP16/BF16 tensor-core math with FP32
accumulation, in TFLOP/s (NVIDIA H100/H200/B200/A100/L40S/L4/A10/T4/V100 datasheets, GeForce Ada/Ampere
whitepapers, AMD Instinct MI300X/MI250/MI210 datasheets, Huawei Ascend 910B). The SXM part is listed where a
name covers both (an "H100" is taken as SXM unless "PCIe" is said). V100 and older have no BF16: their FP16
figure is used. They are peaks: a long prefill reaches 30–60 % of them, which is why rules compare against a
share of the peak (``PREFILL_MFU``) and report how far off a measurement is, not a pass/fail.
"""

from __future__ import annotations

import re

from diagnose.model import Evidence, EvidenceSet

DENSE_TFLOPS: dict[str, float] = {
    "b200": 2250, "gh200": 989, "h200": 989, "h100 pcie": 756, "h100": 989, "h800": 989, "h20": 148,
    "a100": 312, "a800": 312, "a30": 165, "l40s": 362, "l40": 181, "l20": 119.5, "l4": 121, "a10g": 70,
    "a10": 125, "a40": 150, "a6000": 155, "a5000": 111, "a4000": 77, "rtx 6000 ada": 364, "6000 ada": 364,
    "rtx pro 6000": 500, "t4": 65, "v100": 125, "p100": 19, "p40": 12, "5090": 210, "5080": 113, "4090": 165,
    "4080": 97, "4070": 58, "4060": 30, "3090": 71, "3080": 60, "3070": 40, "3060": 25, "2080": 40,
    "mi300x": 1307, "mi250": 362, "mi210": 181, "mi100": 185, "7900 xtx": 123, "910b": 320,
}
# device memory bandwidth, GB/s (datasheets; the 80 GB SXM part where a name covers several)
MEMORY_GBPS: dict[str, float] = {
    "b200": 8000, "gh200": 4000, "h200": 4800, "h100 pcie": 2000, "h100": 3350, "h800": 3350, "h20": 4000,
    "a100": 2039, "a800": 2039, "a30": 933, "l40s": 864, "l40": 864, "l20": 864, "l4": 300, "a10g": 600,
    "a10": 600, "a40": 696, "a6000": 768, "a5000": 768, "a4000": 448, "rtx 6000 ada": 960, "6000 ada": 960,
    "rtx pro 6000": 1792, "t4": 320, "v100": 900, "p100": 732, "p40": 346, "5090": 1792, "5080": 960, "4090": 1008,
    "4080": 717, "4070": 504, "4060": 272, "3090": 936, "3080": 760, "3070": 448, "3060": 360, "2080": 448,
    "mi300x": 5300, "mi250": 3277, "mi210": 1638, "mi100": 1229, "7900 xtx": 960, "910b": 1600,
}
_NAMES = sorted(DENSE_TFLOPS, key=len, reverse=True)
_PCIE = re.compile(r"pcie", re.IGNORECASE)

PREFILL_MFU = 0.4  # the share of peak a long prefill reaches in vLLM/SGLang/TGI (30-60 % measured); a lower bound


def dense_tflops(name: str) -> tuple[str, float] | None:
    """``(canonical name, TFLOP/s)`` for a GPU name such as "NVIDIA H100 80GB HBM3", or None if unknown."""
    low = " ".join(name.lower().replace("-", " ").split())
    if "h100" in low and _PCIE.search(low):
        return "H100 PCIe", DENSE_TFLOPS["h100 pcie"]
    for key in _NAMES:
        if re.search(rf"(?<![a-z0-9]){re.escape(key)}(?![0-9])", low):
            return key.upper(), DENSE_TFLOPS[key]
    return None


def memory_gbps(name: str) -> tuple[str, float] | None:
    """``(canonical name, GB/s)`` of a GPU's memory bandwidth, or None if unknown."""
    spec = dense_tflops(name)
    if spec is None:
        return None
    key = spec[0].lower()
    return (spec[0], MEMORY_GBPS[key]) if key in MEMORY_GBPS else None


def gpu_name(ev: EvidenceSet) -> str:
    got = ev.get("gpu.name")
    return str(got.value) if isinstance(got, Evidence) else ""


def prefill_ms(params: float, tokens: float, tflops: float, devices: int = 1, mfu: float = PREFILL_MFU) -> float:
    """Milliseconds the dense matmuls of a prefill take at ``mfu`` of the peak: 2 FLOPs per parameter per token.

    Attention's own FLOPs (quadratic in the prompt) come on top, so this is a lower bound for long prompts.
    """
    return 2.0 * params * tokens / (tflops * 1e12 * max(1, devices) * mfu) * 1000.0
