"""The target's CPU budget when it runs in a container: its cgroup's CFS quota and throttling; and its
memory limit, the peak it reached and the OOM killer's kills in its memory cgroup.

A container's CPU budget is its quota, not the host's cores: ``cpu.max`` (cgroup v2: ``"QUOTA
PERIOD"`` in microseconds, ``max`` for none) or ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (v1,
``-1`` for none). A group that uses its quota before the period ends is *throttled*: its threads
stop until the next period, whatever the host's load. ``cpu.stat`` counts it: ``nr_periods``,
``nr_throttled`` and ``throttled_usec`` (v2) or ``throttled_time`` in nanoseconds (v1).

The quota may be set on any ancestor (Kubernetes sets it on the pod's and the container's group), so
every level from the target's group up to the hierarchy's root is read; the smallest quota binds.

Where the hierarchy is mounted comes from ``/proc/self/mountinfo`` (the v1 ``cpu`` controller
first, as a hybrid host has both and only v1 carries ``cpu`` then; else the v2 unified mount), and
which group the target is in from ``/proc/PID/cgroup``. ``root`` (``diagnose attach --cgroup-root``)
replaces the discovered mount: the directory holding the v2 hierarchy, or the one holding the v1
controller directories (``cpu``, ``cpu,cpuacct``), e.g. a container's view of the host's groups.

``snapshot`` reads the files as they are (text, for replay); ``parse`` is pure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CGROUP_FILE = "cgroup.json"
V2_FILES = ("cpu.max", "cpu.stat")
V1_FILES = ("cpu.cfs_quota_us", "cpu.cfs_period_us", "cpu.stat")
# the memory controller: its limit, the peak it reached, and how often the OOM killer ran in it
MEM_V2_FILES = ("memory.max", "memory.current", "memory.peak", "memory.events")
MEM_V1_FILES = ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes", "memory.oom_control",
                "memory.failcnt")
NO_MEMORY_LIMIT = 1 << 60  # v1 prints "no limit" as 9223372036854771712 (PAGE_COUNTER_MAX pages)
MAX_LEVELS = 16


@dataclass(frozen=True)
class Group:
    """Where the target's CPU group lives: cgroup ``version``, its path in the hierarchy, the mount."""

    version: int
    path: str  # the group's path in the hierarchy, e.g. /kubepods/pod1/c2
    mount: str  # where the hierarchy (v2) or the cpu controller (v1) is mounted here


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def membership(pid: int, proc: str = "/proc") -> dict[str, str]:
    """controllers → path from ``/proc/PID/cgroup`` ("" is the v2 unified hierarchy)."""
    out: dict[str, str] = {}
    text = _read(f"{proc}/{pid}/cgroup") or ""
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out[parts[1]] = parts[2]
    return out


def mounts(proc: str = "/proc", controller: str = "cpu") -> dict[str, tuple[str, str]]:
    """``controller`` (v1) and/or "" (v2) → (mount point, root of the hierarchy that the mount shows)."""
    out: dict[str, tuple[str, str]] = {}
    for line in (_read(f"{proc}/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) < 5 or len(r) < 3:
            continue
        fstype, options = r[0], r[2].split(",")
        if fstype == "cgroup2":
            out.setdefault("", (f[4], f[3]))
        elif fstype == "cgroup" and controller in options:
            out.setdefault(controller, (f[4], f[3]))
    return out


def locate(pid: int, root: str | None = None, proc: str = "/proc", controller: str = "cpu") -> Group | None:
    """The target's group of ``controller`` ("cpu" or "memory"), or None when it has none readable (not
    Linux, no cgroup fs)."""
    member = membership(pid, proc)
    v1 = next((path for ctrl, path in member.items() if controller in ctrl.split(",")), None)
    found = mounts(proc, controller) if root is None else {}
    if v1 is not None:
        if root is not None:
            names = [n for n in ((controller, "cpu,cpuacct", "cpuacct,cpu") if controller == "cpu" else (controller,))
                     if os.path.isdir(os.path.join(root, n))]
            mount = os.path.join(root, names[0]) if names else root
            return Group(1, v1, mount)
        if controller in found:
            return Group(1, _relative(v1, found[controller][1]), found[controller][0])
    if "" in member:
        if root is not None:
            return Group(2, member[""], root)
        if "" in found:
            return Group(2, _relative(member[""], found[""][1]), found[""][0])
    return None


def _relative(path: str, mount_root: str) -> str:
    """The group's path below what the mount shows (a container's mount shows only its subtree)."""
    if mount_root not in ("", "/") and (path == mount_root or path.startswith(mount_root + "/")):
        return path[len(mount_root):] or "/"
    return path


def snapshot(group: Group, memory: bool = False) -> list[dict[str, Any]]:
    """The raw CPU (or memory) files of the group and each ancestor, leaf first (text as read, None when absent)."""
    names: tuple[str, ...]
    if memory:
        names = MEM_V2_FILES if group.version == 2 else MEM_V1_FILES
    else:
        names = V2_FILES if group.version == 2 else V1_FILES
    levels: list[dict[str, Any]] = []
    path = "/" + group.path.strip("/")
    for _ in range(MAX_LEVELS):
        folder = os.path.join(group.mount, path.lstrip("/"))
        files = {n: _read(os.path.join(folder, n)) for n in names}
        if any(v is not None for v in files.values()):
            levels.append({"path": path, "files": files})
        if path == "/":
            break
        path = os.path.dirname(path) or "/"
    return levels


# -- pure parsing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Level:
    path: str
    quota_us: int | None  # None: no limit at this level
    period_us: int | None
    stat: Mapping[str, int]

    @property
    def quota_cores(self) -> float | None:
        if self.quota_us is None or not self.period_us:
            return None
        return self.quota_us / self.period_us


def _int(text: str | None) -> int | None:
    try:
        return int((text or "").strip())
    except ValueError:
        return None


def _stat(text: str | None, version: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        n = _int(v)
        if n is not None:
            out[k] = n
    if version == 1 and "throttled_time" in out:  # v1 counts nanoseconds
        out.setdefault("throttled_usec", out["throttled_time"] // 1000)
    return out


def parse(version: int, raw: Mapping[str, Any]) -> Level:
    """One level's raw files (as ``snapshot`` read them) → quota, period and counters."""
    files = raw.get("files") or {}
    quota: int | None
    period: int | None
    if version == 2:
        parts = str(files.get("cpu.max") or "").split()
        quota = _int(parts[0]) if parts and parts[0] != "max" else None
        period = _int(parts[1]) if len(parts) > 1 else None
    else:
        quota = _int(files.get("cpu.cfs_quota_us"))
        period = _int(files.get("cpu.cfs_period_us"))
        if quota is not None and quota < 0:
            quota = None
    return Level(str(raw.get("path", "")), quota, period, _stat(files.get("cpu.stat"), version))


@dataclass(frozen=True)
class MemoryLevel:
    path: str
    limit: int | None  # bytes; None: no limit at this level
    usage: int | None
    peak: int | None  # the most the group held (v1 max_usage_in_bytes, v2 memory.peak: kernel 5.19+)
    oom_kills: int | None  # processes the OOM killer killed in the group (v1 oom_control's oom_kill: 4.13+)


def parse_memory(version: int, raw: Mapping[str, Any]) -> MemoryLevel:
    """One level's raw memory files (as ``snapshot(memory=True)`` read them) → limit, usage, peak, kills."""
    files = raw.get("files") or {}
    if version == 2:
        limit_text = str(files.get("memory.max") or "").strip()
        limit = None if limit_text in ("", "max") else _int(limit_text)
        usage, peak = _int(files.get("memory.current")), _int(files.get("memory.peak"))
        kills = _stat(files.get("memory.events"), 2).get("oom_kill")
    else:
        limit = _int(files.get("memory.limit_in_bytes"))
        usage, peak = _int(files.get("memory.usage_in_bytes")), _int(files.get("memory.max_usage_in_bytes"))
        kills = _stat(files.get("memory.oom_control"), 1).get("oom_kill")
    if limit is not None and limit >= NO_MEMORY_LIMIT:
        limit = None
    return MemoryLevel(str(raw.get("path", "")), limit, usage, peak, kills)


def record(group: Group, start: list[dict[str, Any]], end: list[dict[str, Any]], t0: float,
           t1: float, memory: dict[str, Any] | None = None) -> dict[str, Any]:
    """The document written to ``cgroup.json``: where the group is and its files at both ends; ``memory``:
    the same for the memory controller's group (``memory_record``), when there is one."""
    doc = {"version": group.version, "path": group.path, "mount": group.mount, "window": [t0, t1],
           "start": start, "end": end}
    if memory:
        doc["memory"] = memory
    return doc


def memory_record(group: Group, start: list[dict[str, Any]], end: list[dict[str, Any]]) -> dict[str, Any]:
    """The memory controller's part of ``cgroup.json``."""
    return {"version": group.version, "path": group.path, "mount": group.mount, "start": start, "end": end}
