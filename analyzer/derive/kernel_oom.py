"""The kernel's OOM-killer report (dmesg, the journal, a container's OOMKilled status) → ``host.oom_*``.

``host.oom_kills``: processes the kernel killed for memory (``Killed process PID (name)``; a
container that ended ``OOMKilled``); ``host.oom_killed_anon_rss_bytes``: the anonymous memory the
largest of them held (what the limit ran out of); ``host.oom_scope``: ``memcg`` (a cgroup's limit:
the container's) or ``global`` (the host ran out); ``host.memory_limit_bytes`` and
``host.memory_usage_bytes``: the memory cgroup's limit and usage at the kill, as its report says;
``host.sigkilled``: lines saying a process ended by SIGKILL (exit code -9 or 137) without its own
error — the OOM killer's usual mark, which the kernel's report confirms or not.
"""

from __future__ import annotations

from diagnose.collectors.kernel_oom import KB, TRIGGERS, KernelOomParser
from diagnose.derive.emit import Emit
from diagnose.model import Evidence
from diagnose.units import size


class KernelOomSource:
    """Text source for the kernel's OOM-killer records."""

    kind = "kernel-oom"
    triggers = TRIGGERS

    def __init__(self) -> None:
        self._p = KernelOomParser()

    def feed(self, line: str) -> None:
        self._p.feed(line)

    def matched(self) -> bool:
        return self._p.matched()

    def problems(self) -> list[str]:
        return []

    def evidence(self, source: str) -> list[Evidence]:
        res = self._p.result()
        ev = Emit(source)
        if res.sigkilled:  # who sent it is the kernel's report's to say: a failure, and where to look
            # lines, not processes (a shell's "Killed" and a supervisor's "exited with code 137" may be one kill):
            # the same line repeated is counted once
            ev.add("host.sigkilled", len(dict.fromkeys(res.sigkilled)), "lines",
                   f"ended by SIGKILL with no error of its own: '{res.sigkilled[0]}'")
        kills = len(res.kills) or res.container_oomkilled
        if not kills:
            return ev.items
        scope = ("memcg" if res.constraint == "CONSTRAINT_MEMCG" or res.container_oomkilled
                 or any(k.scope == "memcg" for k in res.kills)
                 else "global" if res.constraint == "CONSTRAINT_NONE" or any(k.scope == "global" for k in res.kills)
                 else "")
        names = ", ".join(f"{k.name} (pid {k.pid})" for k in res.kills[:4])
        ev.add("host.oom_kills", kills, "processes",
               f"the kernel's OOM killer killed {names}" if names else "the container ended OOMKilled (exit 137)")
        if scope:
            where = f" {res.memcg}" if res.memcg else ""
            ev.add("host.oom_scope", scope, "text",
                   f"a memory cgroup{where} reached its limit" if scope == "memcg" else "the host ran out of memory")
        sized = [k for k in res.kills if k.anon_rss_kb is not None]
        if sized:
            big = max(sized, key=lambda k: k.anon_rss_kb or 0)
            ev.add("host.oom_killed_anon_rss_bytes", (big.anon_rss_kb or 0) * KB, "bytes",
                   f"{big.name} (pid {big.pid}) held {size((big.anon_rss_kb or 0) * KB)} of anonymous memory")
            ev.add("host.oom_killed_process", big.name, "text", f"pid {big.pid}")
        elif res.kills:
            ev.add("host.oom_killed_process", res.kills[0].name, "text", f"pid {res.kills[0].pid}")
        if res.limit_kb is not None:
            ev.add("host.memory_limit_bytes", res.limit_kb * KB, "bytes",
                   "the memory cgroup's limit at the kill (memory: usage …, limit …)")
        if res.usage_kb is not None:
            ev.add("host.memory_usage_bytes", res.usage_kb * KB, "bytes", "the memory cgroup's usage at the kill")
        return ev.items


def sources() -> list[KernelOomSource]:
    return [KernelOomSource()]
