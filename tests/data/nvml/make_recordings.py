"""Writes the synthetic NVML recordings in this folder (deterministic: run it again, get the same bytes).

Each scenario is a small model of one GPU answering NVML calls in NVML's documented types and
units (bytes, KB/s, MHz, mW, °C, percent, clock-event bitmasks, ns/µs counters). The model is
driven through the real ``NvmlSampler``, which wraps it in the real ``Recorder``: the files are
exactly what a live recorder would have written had a GPU behaved like this. They are synthetic
to the spec, not recordings of real hardware (see README.md).

    .venv/bin/python tests/data/nvml/make_recordings.py
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))

from diagnose.collectors.nvml import (  # noqa: E402
    CLOCK_MEM,
    CLOCK_SM,
    PCIE_TX_BYTES,
    PERF_POLICY_POWER,
    NvmlCallError,
    NvmlSampler,
    _Dispatch,
)

MiB = 1 << 20
GiB = 1 << 30
T0 = 1764470000.0  # 2025-11-30T02:33:20Z
TICK_S = 0.1
TICKS = 60
TARGET_PID = 4242

# clock-event reason bits
IDLE, POWER_CAP, HW_SLOW, SW_THERMAL, HW_THERMAL = 0x1, 0x4, 0x8, 0x20, 0x40


@dataclass
class Board:
    """What does not change during a window: the product's documented limits."""

    name: str
    memory_total: int
    sm_max_mhz: int
    mem_max_mhz: int
    gen_max: int
    width_max: int
    power_limit_mw: int
    power_default_mw: int
    slowdown_c: int
    gpm: bool


H100_SXM = Board("NVIDIA H100 80GB HBM3", 81559 * MiB, 1980, 2619, 5, 16, 700_000, 700_000, 90, True)
H100_PCIE = Board("NVIDIA H100 PCIe", 81559 * MiB, 1755, 1593, 5, 16, 350_000, 350_000, 87, True)
A100_PCIE = Board("NVIDIA A100 80GB PCIe", 81920 * MiB, 1410, 1512, 4, 16, 300_000, 300_000, 92, False)
A10G = Board("NVIDIA A10G", 23028 * MiB, 1710, 6251, 4, 16, 300_000, 300_000, 95, False)


@dataclass
class Tick:
    """One tick's readings."""

    util: int
    mem_util: int
    sm_mhz: int
    mem_mhz: int
    reasons: int
    power_mw: int
    temp_c: int
    gen: int
    width: int
    tx_kbps: int
    rx_kbps: int
    processes: list[tuple[int, int]]  # (host pid, used bytes)
    gpm: dict[int, float] = field(default_factory=dict)


@dataclass
class Scenario:
    name: str
    board: Board
    tick: Callable[[int, random.Random], Tick]
    tree: list[dict[str, Any]]
    names: dict[int, str]
    unsupported: set[str] = field(default_factory=set)
    violation_share: dict[int, float] = field(default_factory=dict)  # policy → share of time held down
    replays_per_tick: int = 0


class SyntheticNvml(_Dispatch):
    """One synthetic GPU (index 0, minor 0), answering like NVML would for ``scenario``."""

    def __init__(self, sc: Scenario) -> None:
        self.sc = sc
        self.rng = random.Random(sc.name)  # deterministic per scenario
        self.n = -1
        self.cur: Tick | None = None
        self.violation_ns = {0: 9_000_000_000, 1: 4_000_000_000}
        self.replays = 12
        self.gpm_calls = 0

    def _now_tick(self) -> Tick:
        assert self.cur is not None
        return self.cur

    def _call(self, fn: str, *args: Any) -> Any:
        sc, b = self.sc, self.sc.board
        if fn in sc.unsupported:
            raise NvmlCallError("NotSupported", 3, "Not Supported")
        if fn in ("init", "shutdown", "register_xid_events"):
            return None
        if fn == "now":
            self.n += 1
            self.cur = sc.tick(self.n, self.rng)
            for policy, share in sc.violation_share.items():
                self.violation_ns[policy] += int(share * TICK_S * 1e9)
            self.replays += sc.replays_per_tick
            return round(T0 + self.n * TICK_S, 3)
        t = self._now_tick()
        fixed: dict[str, Any] = {
            "driver_version": "550.90.07",
            "device_count": 1,
            "device_name": b.name,
            "device_uuid": f"GPU-{zlib.crc32(b.name.encode()):08x}-0000-4000-8000-{zlib.crc32(sc.name.encode()):012x}",
            "device_minor_number": 0,
            "device_max_pcie_link_generation": b.gen_max,
            "device_gpu_max_pcie_link_generation": b.gen_max,
            "device_max_pcie_link_width": b.width_max,
            "device_enforced_power_limit": b.power_limit_mw,
            "device_power_management_default_limit": b.power_default_mw,
            "device_temperature_threshold": b.slowdown_c,
            "gpm_supported": b.gpm,
            "device_utilization_rates": {"gpu": t.util, "memory": t.mem_util},
            "device_compute_processes": [{"pid": pid, "used_bytes": used} for pid, used in t.processes],
            "device_graphics_processes": [],
            "device_clocks_event_reasons": t.reasons,
            "device_power_usage": t.power_mw,
            "device_temperature": t.temp_c,
            "device_curr_pcie_link_generation": t.gen,
            "device_curr_pcie_link_width": t.width,
            "device_pcie_replay_counter": self.replays,
            "wait_xid_event": None,
            "process_tree": sc.tree,
            "open_device_minors": [0],
        }
        if fn in fixed:
            return fixed[fn]
        if fn == "device_memory_info":
            used = sum(u for _, u in t.processes) + 512 * MiB  # + the driver's own reservation
            return {"total": b.memory_total, "used": used, "free": b.memory_total - used}
        if fn == "device_max_clock_info":
            return b.sm_max_mhz if args[1] == CLOCK_SM else b.mem_max_mhz
        if fn == "device_clock_info":
            return t.sm_mhz if args[1] == CLOCK_SM else t.mem_mhz if args[1] == CLOCK_MEM else 0
        if fn == "device_pcie_throughput":
            return t.tx_kbps if args[1] == PCIE_TX_BYTES else t.rx_kbps
        if fn == "device_violation_status":
            policy = int(args[1])
            return {"reference_time_us": int((T0 + self.n * TICK_S) * 1e6),
                    "violation_time_ns": self.violation_ns.get(policy, 0)}
        if fn == "gpm_metrics":
            self.gpm_calls += 1
            if self.gpm_calls == 1:
                return {}  # the first GPM sample only sets the baseline
            return {str(k): round(v, 2) for k, v in t.gpm.items()}
        if fn == "process_name":
            return sc.names.get(int(args[0]), "")
        raise NvmlCallError("NotRecorded", -2, f"the synthetic model has no answer for {fn}")


def _jit(rng: random.Random, x: float, spread: float) -> float:
    return x + rng.uniform(-spread, spread)


def saturated(n: int, rng: random.Random) -> Tick:
    return Tick(util=rng.choice((97, 98, 99, 100, 100, 100)), mem_util=round(_jit(rng, 62, 6)),
                sm_mhz=1980, mem_mhz=2619, reasons=0, power_mw=round(_jit(rng, 610_000, 30_000)),
                temp_c=round(_jit(rng, 66, 2)), gen=5, width=16,
                tx_kbps=round(_jit(rng, 180_000, 40_000)), rx_kbps=round(_jit(rng, 420_000, 80_000)),
                processes=[(TARGET_PID, 71 * GiB)],
                gpm={2: _jit(rng, 86, 4), 3: _jit(rng, 41, 3), 5: _jit(rng, 58, 5), 10: _jit(rng, 47, 5)})


def starved(n: int, rng: random.Random) -> Tick:
    # batches arrive in bursts: three busy readings, then seven idle ones (utilisation ~30 %)
    busy = n % 10 < 3
    util = round(_jit(rng, 96, 3)) if busy else rng.choice((0, 0, 0, 2, 4))
    return Tick(util=util, mem_util=round(util * 0.4), sm_mhz=1710 if busy else rng.choice((1710, 1425)),
                mem_mhz=6251, reasons=0 if busy else IDLE, power_mw=round(_jit(rng, 210_000 if busy else 95_000, 8000)),
                temp_c=round(_jit(rng, 58, 2)), gen=4, width=16,
                tx_kbps=round(_jit(rng, 8_000, 2_000)), rx_kbps=round(_jit(rng, 310_000 if busy else 40_000, 20_000)),
                processes=[(TARGET_PID, 14 * GiB + 310 * MiB)])


def throttled(n: int, rng: random.Random) -> Tick:
    # a hot box: thermal slowdown most of the time, the power cap the rest; clocks far below 1755
    hot = rng.random() < 0.7
    reasons = (SW_THERMAL | HW_THERMAL | HW_SLOW) if hot else POWER_CAP
    return Tick(util=rng.choice((96, 98, 99, 100)), mem_util=round(_jit(rng, 55, 5)),
                sm_mhz=round(_jit(rng, 1095 if hot else 1380, 40)), mem_mhz=1593, reasons=reasons,
                power_mw=round(_jit(rng, 338_000, 8_000)), temp_c=round(_jit(rng, 89, 2)), gen=5, width=16,
                tx_kbps=round(_jit(rng, 90_000, 20_000)), rx_kbps=round(_jit(rng, 250_000, 50_000)),
                processes=[(TARGET_PID, 52 * GiB)],
                gpm={2: _jit(rng, 83, 4), 3: _jit(rng, 38, 3), 5: _jit(rng, 51, 5), 10: _jit(rng, 40, 5)})


def pcie_downgraded(n: int, rng: random.Random) -> Tick:
    # the link trained at gen3 x8 in a gen4 x16 slot; the first readings are idle (gen1: power saving)
    if n < 5:
        return Tick(util=0, mem_util=0, sm_mhz=210, mem_mhz=1512, reasons=IDLE, power_mw=62_000, temp_c=41,
                    gen=1, width=8, tx_kbps=120, rx_kbps=350, processes=[(TARGET_PID, 18 * GiB)])
    return Tick(util=round(_jit(rng, 44, 8)), mem_util=round(_jit(rng, 20, 4)), sm_mhz=1410, mem_mhz=1512,
                reasons=0, power_mw=round(_jit(rng, 160_000, 10_000)), temp_c=round(_jit(rng, 55, 2)), gen=3, width=8,
                tx_kbps=round(_jit(rng, 1_450_000, 150_000)), rx_kbps=round(_jit(rng, 6_600_000, 350_000)),
                processes=[(TARGET_PID, 18 * GiB)])


CONTAINER_HOST_PID = 918_374  # the target runs in a container: pid 7 inside, 918374 on the host
OTHER_PID = 877_102


def filled_by_other(n: int, rng: random.Random) -> Tick:
    return Tick(util=round(_jit(rng, 62, 10)), mem_util=round(_jit(rng, 30, 5)), sm_mhz=1980, mem_mhz=2619,
                reasons=0, power_mw=round(_jit(rng, 390_000, 20_000)), temp_c=round(_jit(rng, 60, 2)), gen=5, width=16,
                tx_kbps=round(_jit(rng, 50_000, 10_000)), rx_kbps=round(_jit(rng, 120_000, 20_000)),
                processes=[(OTHER_PID, 70 * GiB), (CONTAINER_HOST_PID, 2 * GiB)],
                gpm={2: _jit(rng, 55, 5), 3: _jit(rng, 25, 3), 5: _jit(rng, 20, 4), 10: _jit(rng, 35, 5)})


def idle_no_load(n: int, rng: random.Random) -> Tick:
    return Tick(util=0, mem_util=0, sm_mhz=345, mem_mhz=2619, reasons=IDLE, power_mw=round(_jit(rng, 72_000, 2000)),
                temp_c=34, gen=1, width=16, tx_kbps=rng.choice((0, 40, 90)), rx_kbps=rng.choice((0, 60, 120)),
                processes=[(TARGET_PID, 17 * GiB)],
                gpm={2: 0.0, 3: 0.0, 5: 0.0, 10: 0.3})


_TREE = [{"pid": TARGET_PID, "nspid": [TARGET_PID]}, {"pid": TARGET_PID + 1, "nspid": [TARGET_PID + 1]}]
SCENARIOS = [
    Scenario("saturated_h100", H100_SXM, saturated, _TREE, {TARGET_PID: "python3"}),
    Scenario("starved_a10g_bursty", A10G, starved, _TREE, {TARGET_PID: "python3"},
             unsupported={"device_violation_status"}),
    Scenario("throttled_thermal_h100_pcie", H100_PCIE, throttled, _TREE, {TARGET_PID: "python3"},
             violation_share={PERF_POLICY_POWER: 0.3, 1: 0.7}),
    Scenario("pcie_gen3_x8_on_gen4_x16_a100", A100_PCIE, pcie_downgraded, _TREE, {TARGET_PID: "python3"},
             replays_per_tick=2),
    # the target is pid 7 in its container; NVML lists host pids, matched through NSpid
    Scenario("filled_by_other_process_h100", H100_SXM, filled_by_other,
             [{"pid": CONTAINER_HOST_PID, "nspid": [CONTAINER_HOST_PID, 7]}],
             {CONTAINER_HOST_PID: "python3", OTHER_PID: "python3"}),
    Scenario("idle_no_load_h100", H100_SXM, idle_no_load, _TREE, {TARGET_PID: "python3"}),
]


def write(sc: Scenario, out_dir: str) -> str:
    pid = sc.tree[0]["pid"]
    with tempfile.TemporaryDirectory() as tmp:
        sampler = NvmlSampler(pid, tmp, api=SyntheticNvml(sc), interval_s=TICK_S)
        for _ in range(TICKS):
            sampler.tick()
        cap = sampler.close()
        assert cap.files and not sampler.failed, (sc.name, cap)
        dest = os.path.join(out_dir, f"{sc.name}.jsonl")
        shutil.copyfile(os.path.join(tmp, "nvml.jsonl"), dest)
    return dest


def main() -> None:
    for sc in SCENARIOS:
        print(write(sc, HERE))


if __name__ == "__main__":
    main()
