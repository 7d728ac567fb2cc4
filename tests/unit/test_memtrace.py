"""A program's printed allocator readings over a run: the reserve growing while the tensors do not (MEM015)."""

from __future__ import annotations

import io

from diagnose import loose
from diagnose.collectors.memtrace import MemTraceParser
from diagnose.model import Category, Confidence, EvidenceSet, Finding
from diagnose.rules.engine import run_rules
from diagnose.rules.registry import RULES
from diagnose.units import MIB

# triton-lang/triton#11661, the fused-softmax tutorial's benchmark on a 6 GiB card, as pasted
SOFTMAX = """Instrumentation shows that active allocated memory remains around 16 MiB between benchmark cases:

```text
N=256 provider=triton allocated=16 MiB reserved=42 MiB free=5060 MiB
N=256 provider=torch allocated=16 MiB reserved=318 MiB free=4772 MiB
N=256 provider=naive_softmax allocated=16 MiB reserved=594 MiB free=4496 MiB
...
N=3584 provider=naive_softmax allocated=16 MiB reserved=12278 MiB free=0 MiB
N=3712 provider=triton allocated=16 MiB reserved=12448 MiB free=0 MiB
N=3712 provider=torch allocated=16 MiB reserved=12506 MiB free=0 MiB
N=3712 provider=naive_softmax allocated=16 MiB reserved=12564 MiB free=0 MiB
```
torch.OutOfMemoryError: CUDA out of memory.
"""

# pytorch/pytorch#193400, max_split_size_mb with expandable_segments, a table of the cycles
CYCLES = """| cycle | 0 | 20 | 40 | 60 | 80 | 100 |
|---|---|---|---|---|---|---|
| `allocated` (MiB) | 66 | 106 | 146 | 186 | 226 | 266 |
| `reserved` (MiB) | 220 | 2,980 | 5,760 | 8,520 | 11,300 | 14,060 |
"""


def _findings(text: str) -> list[Finding]:
    res = loose.analyze_stream("t", io.BufferedReader(io.BytesIO(text.encode())))  # type: ignore[arg-type]
    return run_rules(EvidenceSet(res.evidence), rules=RULES)[0]


def test_readings_on_a_line_or_in_a_tables_rows_are_read() -> None:
    p = MemTraceParser()
    for line in SOFTMAX.splitlines():
        p.feed(line)
    t = p.trace
    assert t.count == 7 and t.rises == 6
    assert t.first is not None and t.first.allocated == 16 * MIB
    assert t.last is not None and t.last.reserved == 12564 * MIB
    assert t.last.free == 0
    p = MemTraceParser()
    for line in CYCLES.splitlines():
        p.feed(line)
    assert p.trace.count == 6 and p.trace.last is not None and p.trace.last.reserved == 14060 * MIB
    # the allocator's own sentence, peaks and one quantity alone are no readings
    p = MemTraceParser()
    for line in ("Of the allocated memory 20.1 GiB is allocated by PyTorch, and 1.2 GiB is reserved by PyTorch",
                 "max_reserved=12 GiB allocated=3 GiB", "Max memory allocated: 3.10 GB, Max memory reserved: 12.00 GB",
                 "peak allocated: 3 GiB peak reserved: 9 GiB", "allocated=3 GiB"):
        p.feed(line)
    assert p.trace.count == 0


def test_a_reserve_that_grows_while_the_tensors_do_not_is_named() -> None:
    (f,) = [x for x in _findings(SOFTMAX) if x.code == "MEM015"]
    assert f.category is Category.OOM_FRAGMENTATION and f.confidence is Confidence.MEASURED
    assert "318.00 MiB (its second reading) to 12.27 GiB" in f.message and "out-of-memory error ran into" in f.message
    (g,) = [x for x in _findings(CYCLES) if x.code == "MEM015"]
    assert g.impact < f.impact and g.confidence is Confidence.CORRELATED  # no OOM, no free figure: not failed yet


def test_a_reserve_that_grows_with_the_tensors_or_barely_is_no_finding() -> None:
    with_tensors = "\n".join(f"step {i} allocated: {1 + 2 * i} GiB reserved: {2 + 2 * i} GiB" for i in range(5))
    assert not [x for x in _findings(with_tensors) if x.code == "MEM015"]
    warm = "\n".join(f"step {i} allocated: 4 GiB reserved: {5 + 0.1 * i:.1f} GiB" for i in range(5))
    assert not [x for x in _findings(warm) if x.code == "MEM015"]
    two = "allocated=16 MiB reserved=42 MiB\nallocated=16 MiB reserved=12564 MiB"
    assert not [x for x in _findings(two) if x.code == "MEM015"]


def test_the_cache_warming_up_and_a_long_trace() -> None:
    """A review's repros: the first reading before the first batch, the cache then kept at that batch's peak, is
    warm-up (no finding); a trace of 12,000 readings keeps its end (the growth in its last 2,000 is read)."""
    warm = "batch 0 allocated: 1.05 GB reserved: 1.20 GB\n" + "".join(
        f"batch {i} allocated: 1.05 GB reserved: 5.12 GB\n" for i in range(1, 5))
    assert not [x for x in _findings(warm) if x.code == "MEM015"]
    flat = "".join(f"step {i} allocated=16 MiB reserved=42 MiB free=5060 MiB\n" for i in range(10_000))
    grow = "".join(f"step {i} allocated=16 MiB reserved={42 + 6 * i} MiB free={max(0, 5060 - 6 * i)} MiB\n"
                   for i in range(2_000))
    p = MemTraceParser()
    for line in (flat + grow).splitlines():
        p.feed(line)
    t = p.result()
    assert 1024 < t.count < 12_000 and t.last is not None and t.last.free == 0
    assert t.last.reserved == (42 + 6 * 1999) * MIB
    assert t.rises >= 300  # the growth's readings, read at a stride, still rise
