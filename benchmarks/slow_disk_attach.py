#!/usr/bin/env python3
"""An attach whose code must come back from a slow disk: how long it takes, and how the live tests' wall bound
accounts for it (``tests/attach_cost.py``).

A host that sheds its page cache makes ``diagnose attach`` read its interpreter, its libraries and its own
modules back from the disk: at its start (``imports_*`` in ``attach-cost.json``) and after its window, when the
analysis imports what the window did not need. The live engine tests bound the attach's wall time less the
host's share; this benchmark makes a run that fails that bound on its wall time alone, and prints each share
the bound forgives, so a reader sees whether the allowances hold and which one carries it.

Each run: a target (``sleep``: the attach's own cost is what is measured) and ``diagnose attach --pid PID
--duration D``, the attach started in a block-I/O cgroup whose reads of the disk holding the venv are
throttled to ``--rate`` MB/s (cgroup v1 ``blkio.throttle.read_bps_device``, or v2 ``io.max``), after the files
it reads (the interpreter's standard library and binaries, the venv's site-packages, this repository) were
dropped from the page cache (``posix_fadvise(DONTNEED)``, file by file: no other process's cache is touched).
``--rate 0`` runs it warm and unthrottled (the baseline). Needs root (the cgroup).

It prints, per run: the wall time, the window, the bound (``--duration`` + the live tests' ``WALL_SLACK_S``), the
wall less every share the bound forgives, and the same less all but the start's disk allowance
(``attach_cost._disk_bound``: the start's blocked time as far as its reads at 1 MB/s explain it) and less
nothing at all, each against the bound.

usage: sudo benchmarks/slow_disk_attach.py [--rate 1.25 --rate 0] [--duration 5]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.cgroups import remove_cgroup  # noqa: E402  (standard library only; the repository's root on the path first)


def wall_slack() -> float:
    """The live tests' slack over the window (``WALL_SLACK_S`` of ``tests/engines/test_vllm_live.py``), read from
    its source: neither it nor ``tests/attach_cost`` is imported until every run is done, so that this process maps
    none of the libraries the attach must read back (pages a live process maps stay cached whatever
    ``posix_fadvise`` asks)."""
    tree = ast.parse((ROOT / "tests" / "engines" / "test_vllm_live.py").read_text())
    for node in tree.body:
        named = isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "WALL_SLACK_S"
                                                     for t in node.targets)
        if named and isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            if isinstance(value, int | float):
                return float(value)
    raise SystemExit("tests/engines/test_vllm_live.py no longer sets WALL_SLACK_S: update this benchmark")
BLKIO_V1 = Path("/sys/fs/cgroup/blkio")
UNIFIED = Path("/sys/fs/cgroup")


def disk_of(path: Path) -> str:
    """``MAJ:MIN`` of the whole disk holding ``path`` (a partition's parent), as the I/O controllers want it."""
    dev = os.stat(path).st_dev
    node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if (node / "partition").exists():
        return (node.resolve().parent / "dev").read_text().strip()
    return f"{os.major(dev)}:{os.minor(dev)}"


def throttled_group(disk: str, rate_bps: int) -> Path:
    """A new cgroup whose reads of ``disk`` are throttled to ``rate_bps``."""
    if (BLKIO_V1 / "blkio.throttle.read_bps_device").exists():
        group = BLKIO_V1 / f"diagnose-slowdisk-{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "blkio.throttle.read_bps_device").write_text(f"{disk} {rate_bps}")
        return group
    if "io" in (UNIFIED / "cgroup.controllers").read_text().split():
        group = UNIFIED / f"diagnose-slowdisk-{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "io.max").write_text(f"{disk} rbps={rate_bps}")
        return group
    raise SystemExit("no block-I/O cgroup controller to throttle reads with (cgroup v1 blkio or v2 io)")


def evict(roots: list[Path]) -> tuple[int, int]:
    """Ask the kernel to drop every regular file under ``roots`` from the page cache; (files, bytes asked). Pages a
    live process maps stay: this one's own interpreter library (libpython) among them, so the attach's start is
    a little warmer than a host that shed everything."""
    files = size = 0
    seen: set[tuple[int, int]] = set()
    for root in roots:
        walked = [(str(root.parent), [], [root.name])] if root.is_file() else os.walk(root)
        for folder, dirs, names in walked:
            dirs[:] = [d for d in dirs if d not in (".git", ".engines")]
            for name in names:
                try:
                    fd = os.open(os.path.join(folder, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                except OSError:
                    continue
                try:
                    st = os.fstat(fd)
                    if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:  # a file walked twice once
                        seen.add((st.st_dev, st.st_ino))
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        files, size = files + 1, size + st.st_size
                finally:
                    os.close(fd)
    return files, size


def run(rate_mb: float, duration: float) -> dict[str, float]:
    """One attach at ``rate_mb`` MB/s from a cold cache (0: warm, unthrottled); its figures."""
    paths = sysconfig.get_paths()
    # the standard library, the venv's packages, this repository, the interpreter's binary and shared library (not
    # the rest of a system /usr/bin)
    libpython = Path(str(sysconfig.get_config_var("LIBDIR") or "")) / str(sysconfig.get_config_var("LDLIBRARY") or "")
    roots = [Path(paths["stdlib"]), Path(paths["purelib"]), ROOT, Path(sys.executable).resolve(), libpython]
    target = subprocess.Popen(["sleep", str(duration + 600)])
    out = Path(tempfile.mkdtemp(prefix="slowdisk-"))
    group: Path | None = None
    try:
        group = throttled_group(disk_of(Path(paths["purelib"])), int(rate_mb * 1e6)) if rate_mb > 0 else None
        evicted = evict(roots) if group is not None else (0, 0)
        enter = f"echo $$ > {group / 'cgroup.procs'}; " if group is not None else ""
        argv = [sys.executable, "-m", "diagnose", "attach", "--pid", str(target.pid), "--duration", f"{duration:g}",
                "--output", str(out / "session"), "--format", "json"]
        t0 = time.monotonic()
        done = subprocess.run(["sh", "-c", enter + 'exec "$@"', "sh", *argv], capture_output=True, text=True,
                              check=False)
        wall = time.monotonic() - t0
        if done.returncode not in (0, 1):
            raise SystemExit(f"the attach failed ({done.returncode}): {done.stderr[-2000:]}")
        cost = json.loads((out / "session" / "attach-cost.json").read_text())
    finally:
        target.kill()
        target.wait()
        shutil.rmtree(out, ignore_errors=True)
        if group is not None:
            remove_cgroup(group)  # a py-spy the attach left is moved out first
    return {"rate_mb_s": rate_mb, "evicted_mb": evicted[1] / 1e6, "wall_s": wall, "duration_s": duration,
            "cost": cost}


def judge(r: dict) -> dict[str, float]:  # type: ignore[type-arg]
    """The bound's accounting of one run (``tests/attach_cost``)."""
    from tests import attach_cost

    cost, wall, duration = r["cost"], r["wall_s"], r["duration_s"]
    hosts = attach_cost.window_share(cost)
    outside = attach_cost.outside_share(cost)
    disk = attach_cost._disk_bound(cost)
    return {"rate_mb_s": r["rate_mb_s"], "evicted_mb": r["evicted_mb"], "wall_s": wall, "window_s": cost["window_s"],
            "imports_s": cost.get("imports_s", 0.0), "imports_read_mb": cost.get("imports_inblock", 0) * 512 / 1e6,
            "imports_blocked_s": cost.get("imports_blocked_s", 0.0), "start_disk_allowance_s": disk,
            "after_s": cost.get("after_s", 0.0), "after_stall_s": cost.get("after_stall_s", 0.0),
            "forgiven_s": outside + hosts, "bound_s": duration + wall_slack(),
            "judged_s": wall - outside - hosts,
            "judged_without_start_allowance_s":
                wall - attach_cost.outside_share({**cost, "imports_blocked_s": 0.0}) - hosts,
            "judged_without_any_s": wall}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, action="append", help="MB/s the attach reads the disk at (0: warm)")
    ap.add_argument("--duration", type=float, default=5.0)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("error: needs root to make a block-I/O cgroup. Run it with sudo.", file=sys.stderr)
        return 2
    runs = [run(rate, args.duration) for rate in args.rate or [0.0, 1.25]]
    for rate, r in zip(args.rate or [0.0, 1.25], map(judge, runs), strict=True):
        label = f"{rate:g} MB/s, cold" if rate > 0 else "warm, unthrottled"
        print(f"{label}: wall {r['wall_s']:.1f} s for a {r['window_s']:.1f} s window (bound {r['bound_s']:.0f} s); "
              f"start {r['imports_s']:.1f} s ({r['imports_read_mb']:.1f} MB read, blocked "
              f"{r['imports_blocked_s']:.1f} s, "
              f"allowance {r['start_disk_allowance_s']:.1f} s); after the window {r['after_s']:.1f} s (stalled "
              f"{r['after_stall_s']:.1f} s)")
        for what, key in (("less every share forgiven", "judged_s"),
                          ("less all but the start's disk allowance", "judged_without_start_allowance_s"),
                          ("less nothing", "judged_without_any_s")):
            verdict = "holds" if r[key] <= r["bound_s"] else "FAILS"
            print(f"  wall {what}: {r[key]:.1f} s -> the bound {verdict}")
        print("  " + json.dumps({k: round(v, 3) for k, v in r.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
