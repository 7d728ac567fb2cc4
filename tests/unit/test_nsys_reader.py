"""The Nsight Systems SQLite reader on exports generated here to the documented schema.

``Export`` writes a small export with the tables and columns nsys writes (the subset the reader
touches plus their neighbours), in either metadata era, so that each schema-drift case and edge
case is exercised on purpose: marks with NULL ``end``, registered vs inline NVTX names, missing
tables, non-lazy empty tables, non-UTF-8 text, both ``syncType`` numberings, rows out of start
order, unattributable copies.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import sqlite3
import stat
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose import loose
from diagnose.collectors import nsys
from diagnose.derive import nsys as derive
from diagnose.model import Quality

MS = 1_000_000
US = 1_000
PID, TID = 4242, 4243
G_PID = (1 << 48) | (PID << 24)  # globalPid: vm/hw bits above the pid, tid bits zero
G_TID = G_PID | TID


def g_tid(pid: int, tid: int) -> int:
    return (1 << 48) | (pid << 24) | tid


DDL = {
    "StringIds": "CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)",
    "KERNEL": """CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
        deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
        globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER,
        launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL,
        gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL,
        blockZ INTEGER NOT NULL, staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL,
        localMemoryPerThread INTEGER NOT NULL, localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL,
        sharedMemoryExecuted INTEGER, graphNodeId INTEGER, sharedMemoryLimitConfig INTEGER)""",
    "MEMCPY": """CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
        deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
        globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, deprecatedSrcId INTEGER,
        srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER,
        dstContextId INTEGER, migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER)""",
    "MEMSET": """CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
        deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
        globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, graphNodeId INTEGER, memKind INTEGER)""",
    "RUNTIME": """CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
        eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL,
        returnValue INTEGER NOT NULL, callchainId INTEGER)""",
    "SYNC_OLD": """CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
        deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,
        globalPid INTEGER, syncType INTEGER NOT NULL, eventId INTEGER NOT NULL)""",
    "SYNC_NEW": """CREATE TABLE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION (start INTEGER NOT NULL, "end" INTEGER NOT NULL,
        deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
        correlationId INTEGER, globalPid INTEGER, deprecatedSyncType INTEGER, syncType INTEGER NOT NULL,
        eventId INTEGER NOT NULL, eventSyncId INTEGER)""",
    "NVTX": """CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, "end" INTEGER, eventType INTEGER NOT NULL,
        rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER,
        textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL,
        uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT)""",
    "ANALYSIS_DETAILS": """CREATE TABLE ANALYSIS_DETAILS (globalVid INTEGER NOT NULL, duration INTEGER NOT NULL,
        startTime INTEGER NOT NULL, stopTime INTEGER NOT NULL)""",
    "TARGET_INFO_GPU": """CREATE TABLE TARGET_INFO_GPU (vmId INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT,
        busLocation TEXT, isDiscrete INTEGER, totalMemory INTEGER)""",
    "TARGET_INFO_SYSTEM_ENV": """CREATE TABLE TARGET_INFO_SYSTEM_ENV (globalVid INTEGER NOT NULL,
        devStateName TEXT NOT NULL, name TEXT NOT NULL, nameEnum INTEGER NOT NULL, value TEXT NOT NULL)""",
    "META_DATA_CAPTURE": "CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT)",
    "DIAGNOSTIC_EVENT": """CREATE TABLE DIAGNOSTIC_EVENT (timestamp INTEGER NOT NULL, timestampType INTEGER NOT NULL,
        source INTEGER NOT NULL, severity INTEGER NOT NULL, text TEXT NOT NULL, globalPid INTEGER)""",
    "ENUM_CUDA_MEM_KIND": "CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER PRIMARY KEY, name TEXT, label TEXT)",
    "ENUM_CUDA_MEMCPY_OPER": "CREATE TABLE ENUM_CUDA_MEMCPY_OPER (id INTEGER PRIMARY KEY, name TEXT, label TEXT)",
}
TABLE = {"KERNEL": nsys.KERNEL, "MEMCPY": nsys.MEMCPY, "MEMSET": nsys.MEMSET, "RUNTIME": nsys.RUNTIME,
         "SYNC_OLD": nsys.SYNC, "SYNC_NEW": nsys.SYNC, "NVTX": nsys.NVTX}


@dataclass
class Export:
    """A generated export: fill the lists, then ``write(path)``."""

    schema: str = "3.25.0"
    old_meta: bool = False  # EXPORT_META_DATA (≤ 2022.4) instead of META_DATA_EXPORT
    lazy: bool = True  # non-lazy exports create every table, empty ones included
    enums: bool = True  # ENUM_* tables (schema ≥ 3.0)
    cupti_sync: bool = True  # syncType in CUPTI numbering with a deprecatedSyncType column (2025+)
    strings: dict[str, int] = field(default_factory=dict)
    # start, end, device, stream, kernel name, correlation id
    kernels: list[tuple[int, int, int, int, str, int]] = field(default_factory=list)
    memcpys: list[tuple[int, int, int, int, int, int, int, int]] = field(default_factory=list)
    memsets: list[tuple[int, int, int, int]] = field(default_factory=list)  # start, end, dev, bytes
    runtime: list[tuple[int, int, str, int, int]] = field(default_factory=list)  # start, end, api, corr, gtid
    sync: list[tuple[int, int, int, int]] = field(default_factory=list)  # start, end, syncType, corr
    nvtx: list[tuple[int, int | None, int, object, str | None, int]] = field(default_factory=list)
    env: dict[str, bytes | str] = field(default_factory=dict)
    capture: dict[str, str] = field(default_factory=dict)
    diagnostics: list[tuple[int, str]] = field(default_factory=list)
    kernel_pid: dict[int, int] = field(default_factory=dict)  # device → pid of its kernels
    shuffle: bool = False  # write the activity rows out of start order

    def sid(self, value: str) -> int:
        return self.strings.setdefault(value, len(self.strings) + 1)

    def kernel(self, start: int, end: int, name: str = "gemm", dev: int = 0, stream: int = 7, corr: int = 0) -> None:
        self.kernels.append((start, end, dev, stream, name, corr))

    def memcpy(self, start: int, end: int, nbytes: int, kind: int = 1, src: int = 1, dst: int = 2, dev: int = 0,
               corr: int = 0) -> None:
        self.memcpys.append((start, end, dev, nbytes, kind, src, dst, corr))

    def call(self, start: int, end: int, api: str, corr: int = 0, gtid: int = G_TID) -> None:
        self.runtime.append((start, end, api, corr, gtid))

    def write(self, path: str) -> str:
        con = sqlite3.connect(path)
        made: set[str] = set()

        def table(key: str) -> str:
            if key not in made:
                con.execute(DDL[key])
                made.add(key)
            return TABLE.get(key, key)

        table("StringIds")
        meta = "EXPORT_META_DATA" if self.old_meta else "META_DATA_EXPORT"
        con.execute(f"CREATE TABLE {meta} (name TEXT NOT NULL, value TEXT)")
        lazy_key = "EXPORT_LAZY" if self.old_meta else "EXPORT_PARAM_LAZY"
        con.executemany(f"INSERT INTO {meta} VALUES (?, ?)", [
            ("EXPORT_PRODUCT_VERSION", "2022.2.1.31" if self.old_meta else "2026.2.1.210"),
            ("EXPORT_SCHEMA_VERSION", self.schema), (lazy_key, "true" if self.lazy else "false"),
            ("EXPORT_INPUT_PATH_ABS", "/home/alice/secret-project/report.nsys-rep"), ("EXPORT_USER", "alice"),
        ])
        con.execute(DDL["ANALYSIS_DETAILS"])
        con.execute("INSERT INTO ANALYSIS_DETAILS VALUES (0, 5000000000, 0, 5000000000)")
        table("TARGET_INFO_GPU")
        con.executemany("INSERT INTO TARGET_INFO_GPU VALUES (0, ?, ?, '0000:01:00.0', 1, 0)",
                        [(0, "NVIDIA H100 80GB HBM3"), (1, "NVIDIA H100 80GB HBM3")])
        if self.enums:
            table("ENUM_CUDA_MEM_KIND")
            con.executemany("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (?, ?, ?)",
                            [(i, f"CUDA_MEMOPR_MEMORY_KIND_{n.upper()}", n) for i, n in nsys.MEM_KIND.items()])
            table("ENUM_CUDA_MEMCPY_OPER")
        table("TARGET_INFO_SYSTEM_ENV")
        for name, value in self.env.items():
            con.execute("INSERT INTO TARGET_INFO_SYSTEM_ENV VALUES (0, 'Pre', ?, 0, CAST(? AS TEXT))", (name, value))
        if self.capture:
            table("META_DATA_CAPTURE")
            con.executemany("INSERT INTO META_DATA_CAPTURE VALUES (?, ?)", list(self.capture.items()))
        if self.diagnostics:
            table("DIAGNOSTIC_EVENT")
            con.executemany("INSERT INTO DIAGNOSTIC_EVENT VALUES (0, 0, 1, ?, ?, NULL)", self.diagnostics)

        def rows(items: list) -> list:  # type: ignore[type-arg]
            items = sorted(items, key=lambda r: r[0])
            if self.shuffle:
                random.Random(7).shuffle(items)
            return items

        if self.kernels or not self.lazy:
            table("KERNEL")
        for s, e, dev, stream, name, corr in rows(self.kernels):
            n = self.sid(name)
            pid = self.kernel_pid.get(dev, PID)
            con.execute(f"INSERT INTO {nsys.KERNEL} (start, \"end\", deviceId, contextId, streamId, correlationId, "
                        "globalPid, demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, "
                        "blockZ, staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, "
                        "gridId) VALUES (?, ?, ?, 1, ?, ?, ?, ?, ?, 32, 1, 1, 1, 128, 1, 1, 0, 0, 0, 0, 1)",
                        (s, e, dev, stream, corr or None, (1 << 48) | (pid << 24), n, n))
        if self.memcpys or not self.lazy:
            table("MEMCPY")
        for s, e, dev, nbytes, kind, src, dst, corr in rows(self.memcpys):
            con.execute(f"INSERT INTO {nsys.MEMCPY} (start, \"end\", deviceId, contextId, streamId, correlationId, "
                        "globalPid, bytes, copyKind, srcKind, dstKind) VALUES (?, ?, ?, 1, 13, ?, ?, ?, ?, ?, ?)",
                        (s, e, dev, corr or None, G_PID, nbytes, kind, src, dst))
        if self.memsets or not self.lazy:
            table("MEMSET")
        for s, e, dev, nbytes in rows(self.memsets):
            con.execute(f"INSERT INTO {nsys.MEMSET} VALUES (?, ?, ?, 1, 7, NULL, ?, 0, ?, NULL, 2)",
                        (s, e, dev, G_PID, nbytes))
        if self.runtime or not self.lazy:
            table("RUNTIME")
        for s, e, api, corr, gtid in rows(self.runtime):
            con.execute(f"INSERT INTO {nsys.RUNTIME} VALUES (?, ?, 1, ?, ?, ?, 0, NULL)",
                        (s, e, gtid, corr or None, self.sid(api)))
        if self.sync or not self.lazy:
            table("SYNC_NEW" if self.cupti_sync else "SYNC_OLD")
        for s, e, kind, corr in rows(self.sync):
            if self.cupti_sync:
                con.execute(f"INSERT INTO {nsys.SYNC} VALUES (?, ?, 0, 1, NULL, 7, ?, ?, NULL, ?, 0, NULL)",
                            (s, e, corr, G_PID, kind))
            else:
                con.execute(f"INSERT INTO {nsys.SYNC} VALUES (?, ?, 0, 1, 7, ?, ?, ?, 0)", (s, e, corr, G_PID, kind))
        if self.nvtx or not self.lazy:
            table("NVTX")
        for s, e, etype, text, registered, gtid in self.nvtx:
            text_id = self.sid(registered) if registered else None
            con.execute(f"INSERT INTO {nsys.NVTX} (start, \"end\", eventType, text, globalTid, textId, domainId) "
                        "VALUES (?, ?, ?, CAST(? AS TEXT), ?, ?, 0)", (s, e, etype, text, gtid, text_id))
        con.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, v) for v, i in self.strings.items()])
        con.commit()
        con.close()
        return path


def read(path: str) -> nsys.NsysTrace:
    return nsys.read_export(path)


def evidence(path: str) -> dict[str, object]:
    res = loose.analyze_path(path)
    return {e.key: e.value for e in res.evidence}


# -- pure helpers ------------------------------------------------------------------------------


def test_global_ids_unpack_to_pid_and_tid() -> None:
    assert nsys.pid_of(281476838981743) == 111 and nsys.tid_of(281476838981743) == 111  # a real globalTid
    assert nsys.pid_of(G_TID) == PID and nsys.tid_of(G_TID) == TID
    assert nsys.pid_of(G_PID) == PID and nsys.tid_of(G_PID) == 0


def test_api_names_classify_across_versions() -> None:
    assert nsys.api_class("cudaLaunchKernel_v7000") == "launch"
    assert nsys.api_class("cudaLaunchKernelExC_v11060") == "launch"
    assert nsys.api_class("cuLaunchKernelEx") == "launch"
    assert nsys.api_class("cudaGraphLaunch_v10000") == "graph_launch"
    assert nsys.api_class("cudaStreamSynchronize_v3020") == "sync"
    assert nsys.api_class("cudaStreamSynchronize_ptsz") == "sync"
    assert nsys.api_class("cudaMemcpy_v3020") == "copy_sync"
    assert nsys.api_class("cudaMemcpy2D") == "copy_sync"
    assert nsys.api_class("cudaMemcpyAsync_v3020") == "copy_async"
    assert nsys.api_class("cuMemcpyHtoDAsync_v2") == "copy_async"
    assert nsys.api_class("cudaMalloc_v3020") == "other"
    assert nsys.api_class("cudaMemsetAsync_v3020") == "other"


def test_sync_type_numbering_changed_in_2025() -> None:
    # before: cudaDeviceSynchronize=1, cudaEventSynchronize=2, cudaStreamSynchronize=3 (checked on real exports)
    assert [nsys.sync_type_name(i, False) for i in (1, 2, 3)] == ["context", "event", "stream"]
    # 2025 and later: CUPTI's CUpti_ActivitySynchronizationType
    assert [nsys.sync_type_name(i, True) for i in (1, 2, 3, 4)] == ["event", "stream_wait_event", "stream", "context"]
    assert nsys.sync_type_name(0, True) == nsys.sync_type_name(9, False) == "unknown"


def test_copy_host_memory_kind() -> None:
    assert nsys.copy_host_kind(1, 0, 2) == "pageable"  # HtoD from pageable
    assert nsys.copy_host_kind(1, 1, 2) == "pinned"
    assert nsys.copy_host_kind(2, 2, 0) == "pageable"  # DtoH into pageable: the destination is the host side
    assert nsys.copy_host_kind(2, 2, 1) == "pinned"
    assert nsys.copy_host_kind(8, 2, 2) == "device"
    assert nsys.copy_host_kind(11, 7, 7) == "managed"


def test_stage_names_fold_digits_and_cap_length() -> None:
    assert nsys.stage_name("aten::linear, op_id = 314279") == "aten::linear, op_id = #"
    assert nsys.stage_name("FSDP::pre_forward (blocks.12.attn)") == "FSDP::pre_forward (blocks.#.attn)"
    assert len(nsys.stage_name("x" * 500)) == 120


def _brute_union(intervals: list[tuple[int, int]]) -> tuple[int, list[int]]:
    """Busy time and gap lengths of [s, e) intervals, by the textbook merge."""
    busy, gaps, cur = 0, [], None
    for s, e in sorted(intervals):
        if cur is None:
            cur = [s, e]
        elif s > cur[1]:
            busy += cur[1] - cur[0]
            gaps.append(s - cur[1])
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    if cur is not None:
        busy += cur[1] - cur[0]
    return busy, gaps


intervals_st = st.lists(
    st.tuples(st.integers(0, 5_000_000), st.integers(0, 2_000_000), st.booleans()), min_size=1, max_size=80)


@settings(max_examples=200, deadline=None)
@given(intervals_st, st.lists(st.integers(1, 20), min_size=1, max_size=8))
def test_timeline_fold_matches_a_brute_force_union(rows: list[tuple[int, int, bool]], cuts: list[int]) -> None:
    rows = sorted((s, s + d, k) for s, d, k in rows)
    fold = nsys.TimelineFold()
    i = 0
    for c in itertools.cycle(cuts):  # arbitrary chunk sizes: the carried state must make chunking invisible
        if i >= len(rows):
            break
        part = rows[i:i + c]
        i += c
        fold.feed(np.array([r[0] for r in part]), np.array([r[1] for r in part]), np.array([r[2] for r in part]))
    busy, gaps = _brute_union([(s, e) for s, e, _ in rows])
    kbusy, _ = _brute_union([(s, e) for s, e, k in rows if k])
    assert fold.busy_ns == busy
    assert fold.kernel_busy_ns == kbusy
    assert fold.gap_count == len(gaps) and fold.gap_total_ns == sum(gaps)
    assert fold.gap_longest_ns == max(gaps, default=0)
    assert sum(fold.hist_count) == len(gaps) and sum(fold.hist_ns) == sum(gaps)
    assert fold.window_ns == max(e for _, e, _ in rows) - rows[0][0]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 300)), max_size=6), min_size=1, max_size=4),
       intervals_st)
def test_stage_cover_overlap_matches_brute_force(stages: list[list[tuple[int, int]]],
                                                  rows: list[tuple[int, int, bool]]) -> None:
    ivs = [nsys.union_intervals((a * 1000, a * 1000 + d * 1000) for a, d in s) for s in stages]
    cover = nsys.StageCover(ivs)
    rows = sorted((s, s + d, k) for s, d, k in rows)
    fold = nsys.TimelineFold()
    fold.feed(np.array([r[0] for r in rows]), np.array([r[1] for r in rows]), np.array([r[2] for r in rows]), cover)
    # brute force: busy union ∩ each stage's intervals
    busy_iv = nsys.union_intervals((s, e) for s, e, _ in rows)
    for j, iv in enumerate(ivs):
        want = sum(max(0, min(b, d) - max(a, c)) for a, b in busy_iv for c, d in iv)
        assert fold.stage_busy(cover)[j] == want


# -- generated exports -------------------------------------------------------------------------


def overlap_export() -> Export:
    """Two streams of kernels overlapping a pinned copy, a pageable async copy, a sync copy, a gap."""
    x = Export()
    x.kernel(0, 10 * MS, "gemm", stream=7, corr=1)
    x.kernel(5 * MS, 12 * MS, "attention", stream=8, corr=2)  # overlaps the first: union, not sum
    x.memcpy(11 * MS, 20 * MS, 90_000_000, kind=1, src=1, corr=3)  # pinned HtoD, partly hidden by a kernel
    x.memcpy(30 * MS, 34 * MS, 8_000_000, kind=1, src=0, corr=4)  # pageable async HtoD after an 10 ms gap
    x.memcpy(34 * MS + 5 * US, 34 * MS + 7 * US, 4096, kind=2, src=2, dst=0, corr=5)  # small sync DtoH
    x.memcpy(40 * MS, 41 * MS, 100, kind=1, src=1, corr=99)  # no runtime call to attribute it to
    x.kernel(50 * MS, 50 * MS + 4 * US, "tiny", corr=6)
    for corr, api in ((1, "cudaLaunchKernel_v7000"), (2, "cudaLaunchKernel_v7000"), (3, "cudaMemcpyAsync_v3020"),
                      (4, "cudaMemcpyAsync_v3020"), (5, "cudaMemcpy_v3020"), (6, "cuLaunchKernel")):
        x.call(corr * US, corr * US + 20 * US, api, corr)
    x.call(35 * MS, 49 * MS, "cudaStreamSynchronize_v3020", 7)
    x.memsets.append((45 * MS, 46 * MS, 0, 1 << 20))
    return x


def test_union_gaps_copies_and_api_on_a_generated_export(tmp_path) -> None:
    tr = read(overlap_export().write(str(tmp_path / "overlap.sqlite")))
    assert tr.cuda_traced is True and not tr.problems
    (d,) = tr.devices
    assert d.name == "NVIDIA H100 80GB HBM3" and d.pids == (PID,)
    # busy: [0,20) ∪ [30,34) ∪ [34.005,34.007) ∪ [40,41) ∪ [45,46) ∪ [50,50.004) ms — overlaps counted once
    assert d.busy_ns == 20 * MS + 4 * MS + 2 * US + MS + MS + 4 * US
    assert d.kernel_busy_ns == 12 * MS + 4 * US
    assert d.kernel_ns == 10 * MS + 7 * MS + 4 * US  # the sum, for the `nsys stats`-style totals
    assert d.window_ns == 50 * MS + 4 * US and d.kernel_count == 3 and d.tiny_kernels == 1
    assert d.gaps.count == 5 and d.gaps.longest_ns == 10 * MS  # 20→30 ms
    groups = {(c.direction, c.host_kind, c.api): c for c in tr.copies}
    assert groups[("h2d", "pinned", "async")].bytes == 90_000_000
    assert groups[("h2d", "pageable", "async")].count == 1
    assert groups[("d2h", "pageable", "sync")].small_count == 1
    assert groups[("h2d", "pinned", "unknown")].count == 1  # correlation 99 has no call: unattributed
    api = tr.api
    assert api is not None
    assert api.launch_calls == 3 and api.memcpy_calls == 3 and api.memcpy_sync_calls == 1
    assert api.sync_ns == 14 * MS + 20 * US  # the stream sync + the synchronous memcpy call
    assert api.threads[0].pid == PID and api.threads[0].tid == TID and api.threads[0].wall_ns == 49 * MS - 1 * US
    assert [k.name for k in tr.kernels] == ["gemm", "attention", "tiny"]


def test_evidence_keys_and_values(tmp_path) -> None:
    ev = evidence(overlap_export().write(str(tmp_path / "overlap.sqlite")))
    window = 50 * MS + 4 * US
    assert ev["trace.gpu_busy_ratio"] == pytest.approx((26 * MS + 6 * US) / window)
    assert ev["trace.kernel_busy_ratio"] == pytest.approx((12 * MS + 4 * US) / window)
    assert ev["copy.exposed_share"] == pytest.approx(1 - (12 * MS + 4 * US) / (26 * MS + 6 * US))
    assert ev["copy.h2d_bytes"] == 98_000_100 and ev["copy.d2h_bytes"] == 4096
    assert ev["copy.h2d_gbps"] == pytest.approx(98_000_100 / (14 * MS))
    assert ev["copy.pageable_ratio"] == pytest.approx((8_000_000 + 4096) / (98_000_100 + 4096))
    assert ev["copy.h2d_pageable_bytes"] == 8_000_000 and ev["copy.d2h_pageable_bytes"] == 4096
    assert ev["copy.pageable_async_count"] == 1 and ev["copy.pageable_async_time_ms"] == 4.0
    assert ev["copy.sync_count"] == 1 and ev["copy.small_count"] == 2  # 4 KiB and 100 B
    assert ev["copy.time_share"] == pytest.approx((14 * MS + 2 * US) / (14 * MS + 2 * US + 17 * MS + 4 * US))
    assert ev["trace.idle_gaps.count"] == 5 and ev["trace.idle_gaps.longest_ms"] == 10.0
    hist = ev["trace.idle_gaps.histogram"]
    assert isinstance(hist, dict) and hist["<10us"]["count"] == 1 and hist[">=10ms"]["count"] == 1
    assert ev["trace.tiny_kernel_ratio"] == pytest.approx(1 / 3)
    assert ev["trace.launch_overhead_ratio"] == pytest.approx(60 * US / (17 * MS + 4 * US))
    assert ev["api.sync_time_ms"] == 14.02 and ev["api.memcpy_calls"] == 3
    assert ev["api.sync_wall_share"] == pytest.approx((14 * MS + 20 * US) / (49 * MS - 1 * US))
    assert ev["trace.devices"][0]["pids"] == [PID]  # type: ignore[index]
    assert ev["trace.processes"] == [{"pid": PID, "devices": [0], "copy_bytes": 98_004_196, "copy_ms": 14.002}]


def test_rows_out_of_start_order_give_the_same_answer(tmp_path) -> None:
    a = read(overlap_export().write(str(tmp_path / "sorted.sqlite")))
    x = overlap_export()
    x.shuffle = True
    b = read(x.write(str(tmp_path / "shuffled.sqlite")))
    assert a.devices == b.devices and set(a.copies) == set(b.copies) and a.kernels == b.kernels


def test_many_chunks_and_two_devices_two_processes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(nsys, "CHUNK_ROWS", 7)  # force many chunks and a real k-way merge
    x = Export(kernel_pid={0: 100, 1: 200})
    for i in range(60):
        x.kernel(i * 100 * US, i * 100 * US + 50 * US, f"k{i % 3}", dev=i % 2)
        x.memcpy(i * 100 * US + 60 * US, i * 100 * US + 70 * US, 1 << 20, dev=(i + 1) % 2)
    tr = read(x.write(str(tmp_path / "two.sqlite")))
    assert [d.device for d in tr.devices] == [0, 1]
    assert tr.devices[0].pids == (100, PID) and tr.devices[1].pids == (200, PID)  # kernels' pid, copies' pid
    for d in tr.devices:
        assert d.kernel_count == 30 and d.copy_count == 30 and d.busy_ns == 30 * 60 * US


def test_nvtx_ranges_marks_registered_names_and_non_utf8(tmp_path) -> None:
    x = Export()
    x.kernel(0, 2 * MS, "gemm")
    x.kernel(20 * MS, 30 * MS, "gemm")
    x.call(0, US, "cudaLaunchKernel_v7000")
    x.call(29 * MS, 30 * MS, "cudaLaunchKernel_v7000")
    x.nvtx += [
        (0, 10 * MS, 59, None, "preprocess batch 1", G_TID),  # registered string (textId → StringIds)
        (12 * MS, 19 * MS, 59, None, "preprocess batch 2", G_TID),
        (19 * MS, 31 * MS, 59, "forward", None, G_TID),  # inline text
        (15 * MS, None, 34, "a mark", None, G_TID),  # marks have no end: not a range
        (0, None, 75, "my-domain", None, G_TID),  # domain creation
        (1 * MS, 9 * MS, 59, b"caf\xe9 \xff step", None, G_TID),  # not UTF-8
    ]
    x.env = {"PATH": "/usr/bin", "LANG": b"\xff\xfe bad bytes"}
    tr = read(x.write(str(tmp_path / "nvtx.sqlite")))
    stages = {s.name: s for s in tr.stages}
    assert set(stages) == {"preprocess batch #", "forward", "caf\ufffd \ufffd step"}
    pre, fwd = stages["preprocess batch #"], stages["forward"]
    assert pre.ranges == 2 and pre.covered_ns == 17 * MS and pre.gpu_busy_ns == 2 * MS
    assert fwd.gpu_busy_ns == 10 * MS and fwd.in_window_ns == 11 * MS  # the window ends at 30 ms
    assert tr.nvtx_traced is True
    ev = evidence(str(tmp_path / "nvtx.sqlite"))
    rows = {r["name"]: r for r in ev["trace.nvtx_ranges"]}  # type: ignore[union-attr]
    assert rows["forward"]["gpu_ratio"] == pytest.approx(10 / 11, abs=1e-4)
    assert rows["preprocess batch #"]["gpu_ratio"] == pytest.approx(2 / 17, abs=1e-4)


def test_old_metadata_table_no_enums_old_sync_numbering(tmp_path) -> None:
    x = overlap_export()
    x.old_meta, x.enums, x.cupti_sync, x.schema = True, False, False, "2.9.1"
    x.sync = [(35 * MS, 49 * MS, 3, 7), (1, 2, 1, 8)]  # stream sync, device sync in the old numbering
    tr = read(x.write(str(tmp_path / "old.sqlite")))
    assert tr.info.nsys_version == "2022.2.1.31" and tr.info.schema_version == "2.9.1" and tr.info.lazy is True
    assert dict((k, n) for k, n, _ in tr.sync_events) == {"stream": 1, "context": 1}
    assert {c.host_kind for c in tr.copies} == {"pinned", "pageable"}  # the documented numbering, without ENUM tables
    y = overlap_export()
    y.sync = [(35 * MS, 49 * MS, 3, 7), (1, 2, 4, 8)]
    new = read(y.write(str(tmp_path / "new.sqlite")))
    assert dict((k, n) for k, n, _ in new.sync_events) == {"stream": 1, "context": 1}


def test_not_traced_versus_traced_but_empty(tmp_path) -> None:
    # lazy export, no CUDA tables, capture settings say CUDA tracing was off: not traced
    off = read(Export(capture={"PROCESS_0:COLLECT_CUDA_TRACE": "false"}).write(str(tmp_path / "off.sqlite")))
    assert off.cuda_traced is False and "CUDA was not traced" in off.problems[0]
    # tracing on, nothing recorded, and nsys says the driver is too new
    on = Export(capture={"PROCESS_0:COLLECT_CUDA_TRACE": "true"},
                diagnostics=[(2, "Installed CUDA driver version (13.3) is not supported by this build of Nsight "
                                 "Systems.")])
    empty = read(on.write(str(tmp_path / "empty.sqlite")))
    assert empty.cuda_traced is True and not empty.devices
    assert "no CUDA activity was recorded" in empty.problems[0] and "13.3" in empty.problems[0]
    # non-lazy export: every table exists, all empty, no capture settings: cannot tell
    nl = read(Export(lazy=False, old_meta=True).write(str(tmp_path / "nonlazy.sqlite")))
    assert nl.cuda_traced is None and nl.info.lazy is False and not nl.devices and nl.api is None
    # API calls but no GPU activity rows
    x = Export()
    x.call(0, 10, "cudaLaunchKernel_v7000", 1)
    calls = read(x.write(str(tmp_path / "calls.sqlite")))
    assert calls.cuda_traced is True and "1 of them kernel launches" in calls.problems[0]
    rec = loose.analyze_path(str(tmp_path / "calls.sqlite")).inputs[0]
    assert rec.kind == "nsys_sqlite" and rec.status == "partial" and "no GPU activity" in rec.reason


def test_thin_timeline_marks_its_evidence_low_quality(tmp_path) -> None:
    x = Export()
    x.kernel(0, 10 * US)
    x.memcpy(20 * US, 30 * US, 1000)
    x.call(0, 5 * US, "cudaLaunchKernel_v7000")
    res = loose.analyze_path(x.write(str(tmp_path / "thin.sqlite")))
    got = {e.key: e for e in res.evidence}
    assert got["trace.gpu_busy_ratio"].quality is Quality.LOW  # a 30 µs window is one burst
    assert got["copy.time_ms"].quality is Quality.LOW
    assert got["api.launch_count"].quality is Quality.GOOD  # host-side counts do not depend on the window


def _sha(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def test_reader_never_writes_to_the_export(tmp_path) -> None:
    path = overlap_export().write(str(tmp_path / "ro.sqlite"))
    os.chmod(path, stat.S_IRUSR)  # read-only file, as on a shared mount
    os.chmod(tmp_path, stat.S_IRUSR | stat.S_IXUSR)  # and a read-only folder: no journal could be created
    try:
        before = _sha(path)
        assert read(path).devices
        assert _sha(path) == before
        assert os.listdir(tmp_path) == ["ro.sqlite"]
    finally:
        os.chmod(tmp_path, stat.S_IRWXU)
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)


def test_secrets_in_the_export_never_reach_the_evidence(tmp_path) -> None:
    x = overlap_export()
    token = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2"
    x.env = {"HF_TOKEN": token, "DATABASE_URL": "postgres://svc:hunter2@db:5432/x"}
    x.capture = {"PROCESS_0:COLLECT_CUDA_TRACE": "true", "PROCESS_0:COMMAND_LINE": f"python serve.py --token {token}"}
    x.sid(f"python serve.py --api-key {token}")  # command text in StringIds
    x.nvtx.append((0, 15 * MS, 59, f"request api_key={token} user 17", None, G_TID))
    path = x.write(str(tmp_path / "secret.sqlite"))
    doc = json.dumps([e.to_json() for e in loose.analyze_path(path).evidence])
    for secret in (token, "hunter2", "serve.py", "alice", "secret-project"):
        assert secret not in doc
    assert "api_key=***" in doc  # the NVTX stage name is kept, redacted before digits are folded


def test_files_that_are_not_nsys_exports(tmp_path) -> None:
    plain = tmp_path / "app.sqlite"
    con = sqlite3.connect(plain)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    rec = loose.analyze_path(str(plain)).inputs[0]
    assert rec.status == "unreadable" and "not an Nsight Systems export" in rec.reason
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(nsys.SQLITE_MAGIC + b"\x00" * 50)
    rec = loose.analyze_path(str(broken)).inputs[0]
    assert rec.status == "unreadable" and rec.kind == "sqlite" and rec.reason


def test_sqlite_on_stdin_is_refused_with_the_remedy(tmp_path) -> None:
    path = overlap_export().write(str(tmp_path / "in.sqlite"))
    with open(path, "rb") as fh:
        rec = loose.analyze_stream("<stdin>", fh).inputs[0]
    assert rec.status == "unreadable" and "pass its path" in rec.reason


def test_nsys_rep_without_nsys_says_how_to_export(tmp_path, monkeypatch) -> None:
    rep = tmp_path / "report1.nsys-rep"
    rep.write_bytes(b"not really a report")
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    rec = loose.analyze_path(str(rep)).inputs[0]
    assert rec.status == "unreadable" and "nsys export --type sqlite" in rec.reason


def test_an_export_inside_a_session_is_read_like_a_loose_one(tmp_path) -> None:
    from diagnose import pipeline
    from diagnose.model import Capture, CaptureStatus, Session, Target, Window

    folder = tmp_path / "diagnose-4242-session"
    folder.mkdir()
    overlap_export().write(str(folder / "report.sqlite"))
    session = Session(str(folder), Target(PID), Window(0.0, 10.0),
                      (Capture("nsys", CaptureStatus.OK, files=("report.sqlite",)),))
    (folder / "manifest.json").write_text(json.dumps(session.manifest()))
    diagnosis = pipeline.analyze([str(folder)])
    assert [i.kind for i in diagnosis.inputs] == [derive.KIND]
    assert any(e.key == "trace.gpu_busy_ratio" for e in diagnosis.evidence)
