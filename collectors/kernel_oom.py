"""The kernel's OOM killer, as its report reads in ``dmesg``, the journal or a container's status.

When a memory cgroup (a container's limit) or the whole host runs out of memory, the kernel picks
the process with the highest badness (most resident memory) and sends it SIGKILL: the service does
not raise an error, it vanishes (exit code 137). What says so is the kernel's own report, one
record per line (``mm/oom_kill.c``, ``mm/memcontrol.c``), each under a ring-buffer time stamp
(``[13059.917043]``, ``dmesg -T``'s ``[Tue Sep 16 03:14:22 2025]``) or a syslog prefix::

    python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
    memory: usage 204800kB, limit 204800kB, failcnt 226          (a memory cgroup's report)
    oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),…,oom_memcg=/x,task_memcg=/x,task=python3,pid=25088,uid=0
    Memory cgroup out of memory: Killed process 25088 (python3) total-vm:528568kB, anon-rss:204160kB, …
    Out of memory: Killed process 2481 (python3) total-vm:8123400kB, anon-rss:7981200kB, …   (the host's)

and Kubernetes reports the container's end as ``Reason: OOMKilled`` (``kubectl describe pod``) or
``"OOMKilled": true`` (``docker inspect``). Parsed by structure: the ``Killed process PID (name)``
record with its ``anon-rss:NkB`` field, the ``oom-kill:constraint=`` record, the memcg usage line.
A person's "the process was killed" is none of these.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

KB = 1024
NO_LIMIT_KB = 1 << 50  # the kernel prints an unlimited counter as 9007199254740988kB (PAGE_COUNTER_MAX)

_KILLED = re.compile(
    r"(?P<scope>Memory cgroup out of memory|Out of memory(?: \(oom_kill_allocating_task\))?)?:?\s*"
    r"Killed process (?P<pid>\d+) \((?P<name>[^)]{1,64})\)(?P<rest>.*)", re.IGNORECASE)
_FIELD = re.compile(r"\b(?P<key>total-vm|anon-rss|file-rss|shmem-rss):\s*(?P<kb>\d+)kB")
_CONSTRAINT = re.compile(r"\boom-kill:constraint=(?P<constraint>CONSTRAINT_\w+)(?P<rest>.*)")
_TASK = re.compile(r"\btask=(?P<name>[^,]*),pid=(?P<pid>\d+)")
_MEMCG = re.compile(r"\boom_memcg=(?P<memcg>[^,]*)")
_USAGE = re.compile(r"(?:^|\]\s*|kernel:\s*)memory: usage (?P<usage>\d+)kB, limit (?P<limit>\d+)kB, "
                    r"failcnt (?P<failcnt>\d+)")
_INVOKED = re.compile(r"(?P<name>\S+) invoked oom-killer: gfp_mask=")
_K8S = re.compile(r"^\s*(?:Reason:\s+OOMKilled\b|\"OOMKilled\":\s*true\b|reason:\s+OOMKilled\b)")

# a process that ended by SIGKILL, as its parent or supervisor prints it: vLLM's "Worker proc VllmWorker-0 died
# unexpectedly (exit code: -9)", multiprocessing's "exitcode=-9", torchrun's "exitcode  : -9", docker's "exited with
# code 137", Kubernetes' "Exit Code: 137", Python's "<Signals.SIGKILL: 9>", a shell's "line 28:  7 Killed  cmd".
# The kernel's OOM killer is the usual sender; its report (dmesg) says whether it was
_SIGKILLED = re.compile(
    r"(?:exit ?code|exitcode|exit status|return ?code)\s*[:=]?\s*(?:-9|137)\b"
    r"|exited with code 137\b|died with <Signals\.SIGKILL: 9>|\bSignal 9 \(SIGKILL\) received"
    r"|^(?:\S.*)?line \d+:\s+\d+ Killed\s+\S|^\s*Killed\s*$", re.IGNORECASE)

# few and short: each literal more costs the tail's scan of a multi-GB log a little ("Killed" covers "Killed process",
# "oom-kill" the killer's "invoked oom-killer")
TRIGGERS = ("Killed", "oom-kill", "memory: usage", "xit code", "xitcode", "xit status", "exited with code", "SIGKILL")


@dataclass(frozen=True)
class Kill:
    """One process the OOM killer killed."""

    pid: int | None
    name: str
    anon_rss_kb: int | None
    file_rss_kb: int | None
    total_vm_kb: int | None
    scope: str  # "memcg" (a cgroup's limit), "global" (the host), "" (not said)


@dataclass
class KernelOomResult:
    kills: list[Kill] = field(default_factory=list)
    constraint: str = ""  # CONSTRAINT_MEMCG, CONSTRAINT_NONE, … from the oom-kill record
    memcg: str = ""  # the cgroup that hit its limit (oom_memcg=)
    limit_kb: int | None = None  # the memory cgroup's limit at the kill
    usage_kb: int | None = None
    failcnt: int | None = None
    invoked_by: list[str] = field(default_factory=list)  # who allocated when the killer ran
    container_oomkilled: int = 0  # Kubernetes / Docker: the container ended OOMKilled
    sigkilled: list[str] = field(default_factory=list)  # lines saying a process ended by SIGKILL (-9 / 137)


class KernelOomParser:
    """Feed lines; ``result()`` gives the kills and the limit they hit."""

    def __init__(self) -> None:
        self.res = KernelOomResult()
        self._seen: set[tuple[int | None, str]] = set()

    def feed(self, line: str) -> None:
        if "illed process" in line:
            m = _KILLED.search(line)
            if m and (m.group("scope") or _FIELD.search(m.group("rest")) or line.lstrip().startswith("[")):
                self._kill(m)
                return
        if "oom-kill:constraint=" in line:
            m = _CONSTRAINT.search(line)
            if m:
                self.res.constraint = m.group("constraint")
                memcg = _MEMCG.search(m.group("rest"))
                if memcg:
                    self.res.memcg = memcg.group("memcg")
            return
        if "memory: usage" in line:
            m = _USAGE.search(line)
            if m:
                limit = int(m.group("limit"))
                self.res.usage_kb = int(m.group("usage"))
                self.res.limit_kb = limit if limit < NO_LIMIT_KB else None
                self.res.failcnt = int(m.group("failcnt"))
            return
        if "invoked oom-killer" in line:
            m = _INVOKED.search(line)
            if m:
                self.res.invoked_by.append(m.group("name"))
            return
        if "OOMKilled" in line and _K8S.search(line):
            self.res.container_oomkilled += 1
        elif (("9" in line or "137" in line or "Killed" in line) and len(self.res.sigkilled) < 20
              and _SIGKILLED.search(line)):
            self.res.sigkilled.append(line.strip()[:200])

    def _kill(self, m: re.Match[str]) -> None:
        pid = int(m.group("pid"))
        key = (pid, m.group("name"))
        if key in self._seen:  # the journal and dmesg both pasted: one kill
            return
        self._seen.add(key)
        fields = {f.group("key"): int(f.group("kb")) for f in _FIELD.finditer(m.group("rest"))}
        scope_text = (m.group("scope") or "").lower()
        scope = "memcg" if scope_text.startswith("memory cgroup") else "global" if scope_text else ""
        self.res.kills.append(Kill(pid, m.group("name"), fields.get("anon-rss"), fields.get("file-rss"),
                                   fields.get("total-vm"), scope))

    def result(self) -> KernelOomResult:
        return self.res

    def matched(self) -> bool:
        return bool(self.res.kills or self.res.container_oomkilled or self.res.constraint or self.res.sigkilled)
