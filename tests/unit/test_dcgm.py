"""dcgm-exporter evidence: every real scrape in ../shared/data/gpu/dcgm (and its copy in tests/data/dcgm)
with the verdict a GPU engineer would give, and the forms people paste (two scrapes, Kubernetes pod
labels, Prometheus query JSON, 1.x names) generated from those real files by changing values or labels.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from diagnose import loose
from diagnose.collectors.dcgm import DcgmBuffer, Pod, QueryJsonBuffer, parse_labels, parse_query_json
from diagnose.derive import dcgm as derive_dcgm
from diagnose.model import Evidence, EvidenceSet, Quality
from diagnose.rules.engine import run_rules
from diagnose.rules.verdict import decide
from tests.conftest import DATA, SHARED

SHARED_DCGM = os.path.join(SHARED, "data", "gpu", "dcgm")
REAL = sorted(glob.glob(os.path.join(SHARED_DCGM, "*.prom")))
T4 = os.path.join(DATA, "dcgm", "t4_busy_util91_engine16_power_capped_ericsson.prom")
L4 = os.path.join(DATA, "dcgm", "l4_idle_full_default_scrape_kops.prom")
needs_shared = pytest.mark.skipif(not REAL, reason="../shared/data/gpu/dcgm is absent")


def _analyze(path: str) -> tuple[EvidenceSet, list[str], str, str]:
    res = loose.analyze_path(path)
    ev = EvidenceSet(res.evidence)
    findings, _ = run_rules(ev)
    verdict, _ = decide(ev, findings)
    return ev, [f.code for f in findings], res.inputs[0].kind, verdict.value


def _ev(ev: EvidenceSet, key: str) -> Evidence:
    got = ev.get(key)
    assert isinstance(got, Evidence), f"{key}: {got}"
    return got


# -- the real scrapes ----------------------------------------------------------------------------------


@needs_shared
@pytest.mark.parametrize("path", REAL, ids=lambda p: os.path.basename(p)[:60])
def test_every_real_scrape_is_read_as_dcgm(path: str) -> None:
    res = loose.analyze_path(path)
    assert res.inputs[0].status == "ok", res.inputs
    assert "dcgm" in res.inputs[0].kind.split("+")
    keys = {e.key for e in res.evidence}
    assert {"gpu.util_ratio", "gpu.memory_used_bytes", "gpu.memory_total_bytes", "gpu.sm_clock_mhz",
            "gpu.power_w", "pcie.tx_bytes_per_s", "pcie.rx_bytes_per_s"} <= keys


@needs_shared
def test_local_copies_are_the_real_files() -> None:
    for local in (T4, L4):
        digest = hashlib.sha256(Path(local).read_bytes()).hexdigest()
        src = next(p for p in REAL if hashlib.sha256(Path(p).read_bytes()).hexdigest() == digest)
        sidecar = Path(src + ".source.txt").read_text()
        assert digest in sidecar  # the sidecar's sha256 names this exact file


def test_t4_busy_by_gpu_util_is_power_capped_not_saturated() -> None:
    """GPU_UTIL says 91 % but the graphics engine is active 16 % of the time: a kernel is usually
    running, yet the GPU does little work; the SM clock sits at 660 of 1590 MHz while the board draws
    68.2 of its 70 W. A GPU engineer: not saturated, power-capped (and the work does not fill it)."""
    ev, codes, kind, verdict = _analyze(T4)
    assert "dcgm" in kind.split("+") and verdict == "bottleneck"
    assert codes[0] == "GPU003"  # held at the power limit, first
    assert "GPU002" in codes
    findings, _ = run_rules(ev)
    gpu002 = next(f for f in findings if f.code == "GPU002")
    assert gpu002.title == "The GPU is busy, but most of its SMs are idle"  # never "saturated"
    assert "16 %" in gpu002.message
    util = _ev(ev, "gpu.util_ratio")
    assert util.value == pytest.approx(0.91)
    assert "overstates" in util.detail and "16 %" in util.detail
    assert _ev(ev, "gpm.sm_activity_ratio").value == pytest.approx(0.156205)
    assert _ev(ev, "gpm.sm_activity_ratio").quality is Quality.LOW  # engine time: an upper bound only
    assert _ev(ev, "gpu.throttle_reasons").value == ["SwPowerCap"]
    assert "inferred" in _ev(ev, "gpu.throttle_ratio").detail
    assert _ev(ev, "gpu.power_limit_w").value == 70.0 and "datasheet" in _ev(ev, "gpu.power_limit_w").detail
    assert _ev(ev, "gpu.sm_clock_mhz").value == 660.0
    assert _ev(ev, "gpu.memory_used_bytes").value == 5120 << 20
    assert _ev(ev, "gpu.memory_total_bytes").value == (5120 + 9791 + 447) << 20
    gpu003 = findings[0]
    assert "660 MHz of 1590 MHz" in gpu003.message
    assert _ev(ev, "gpu.util_samples").value == 1 and util.quality is Quality.LOW  # one scrape


def test_l4_idle_scrape_names_no_bottleneck() -> None:
    """A complete default scrape of an idle L4: GPU_UTIL 0, nothing in memory, 16 W, 210 MHz. Nothing runs,
    so there is nothing to name; one scrape cannot say the service is healthy either."""
    ev, codes, _, verdict = _analyze(L4)
    assert codes == []
    assert verdict == "undetermined"
    assert _ev(ev, "gpu.util_ratio").value == 0.0
    assert _ev(ev, "gpu.memory_used_bytes").value == 0
    assert _ev(ev, "gpu.throttle_ratio").value == 0.0  # the low clock is idle, not throttling
    assert _ev(ev, "gpu.sm_clock_mhz").detail.startswith("mean over 1 reading")  # no busy reading


# -- forms generated from the real T4 scrape -------------------------------------------------------------


def _t4_lines() -> list[str]:
    return Path(T4).read_text().splitlines()


def _with_values(lines: list[str], values: dict[str, float]) -> list[str]:
    out = []
    for line in lines:
        name = line.split("{", 1)[0]
        if name in values:
            line = line.rsplit(" ", 1)[0] + f" {values[name]}"
        out.append(line)
    return out


def _with_labels(lines: list[str], extra: str) -> list[str]:
    return [line.replace("}", f",{extra}}}", 1) if line.startswith("DCGM_FI_") else line for line in lines]


def test_two_scrapes_give_counter_rates_and_violation_ratios(tmp_path: Path) -> None:
    # the T4 scrape twice, 60 s apart, with the violation and replay counters dcgm-exporter can add
    labels = '{gpu="0",UUID="GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"}'
    extra = ["DCGM_FI_DEV_POWER_VIOLATION" + labels + " %d", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" + labels + " %d"]
    lines = [ln for ln in _t4_lines() if "PCIE_REPLAY" not in ln]
    text = ["# scrape at 2025-06-02T10:00:00Z", *_with_labels(lines, ""), *(e % 1_000_000 for e in extra),
            "# scrape at 2025-06-02T10:01:00Z", *_with_values(lines, {"DCGM_FI_DEV_GPU_UTIL": 95.0}),
            extra[0] % (1_000_000 + 45_000_000), extra[1] % 12]  # 45 s of 60 under the power policy
    f = tmp_path / "two.prom"
    f.write_text("\n".join(text) + "\n")
    ev = EvidenceSet(loose.analyze_path(str(f)).evidence)
    assert _ev(ev, "gpu.util_samples").value == 2
    assert _ev(ev, "gpu.util_ratio").value == pytest.approx(0.93)
    assert _ev(ev, "gpu.power_violation_ratio").value == pytest.approx(0.75)
    assert _ev(ev, "gpu.throttle_ratio").value == pytest.approx(0.75)  # violation counters, not inferred
    assert "inferred" not in _ev(ev, "gpu.throttle_ratio").detail
    assert _ev(ev, "pcie.replay_count_delta").value == 12


def test_kubernetes_pods_sharing_a_gpu_and_memory_beyond_the_engines_share() -> None:
    # the T4 time-sliced between two pods: dcgm-exporter repeats the device's series once per pod;
    # Prometheus renamed the labels to exported_* (the scrape job had its own pod label)
    lines = _t4_lines()
    a = _with_labels(lines, 'exported_namespace="llm",exported_pod="vllm-0",exported_container="engine"')
    b = _with_labels(lines, 'exported_namespace="batch",exported_pod="trainer-7",exported_container="job"')
    buf = DcgmBuffer()
    for line in a + b:
        buf.feed(line)
    res = buf.result()
    assert len(res.gpus) == 1 and res.scrapes == 1  # one device, listed once per pod, read once
    assert [p.name for p in res.gpus[0].pods] == ["llm/vllm-0", "batch/trainer-7"]
    ev = EvidenceSet(derive_dcgm.derive(res, "t4", target_pods=[Pod("llm", "vllm-0", "engine")],
                                        engine_memory_ratio=0.2))
    assert _ev(ev, "gpu.other_pods").value == ["batch/trainer-7"]
    total = (5120 + 9791 + 447) << 20
    assert _ev(ev, "mem.process_used_bytes").value == int(0.2 * total)
    assert _ev(ev, "mem.other_processes_bytes").value == pytest.approx((5120 << 20) - 0.2 * total, abs=1)
    assert "batch/trainer-7" in _ev(ev, "mem.other_processes_bytes").detail
    findings, _ = run_rules(ev)
    assert "GPU005" not in [f.code for f in findings]  # 14 % of the device elsewhere: under GPU005's bar
    ev2 = EvidenceSet(derive_dcgm.derive(res, "t4", engine_memory_ratio=0.05))
    codes = [f.code for f in run_rules(ev2)[0]]
    assert "GPU005" in codes  # 28 % held beyond an engine that takes 5 %


def _matrix(lines: list[str], points: int, step: float = 15.0, t0: float = 1_750_000_000.0) -> dict[str, object]:
    result = []
    for line in lines:
        m = re.match(r"^(\w+)(\{.*\}) (\S+)$", line)
        if not m:
            continue
        metric = {"__name__": m.group(1), **parse_labels(m.group(2)), "instance": "10.0.0.7:9400",
                  "job": "dcgm-exporter"}
        result.append({"metric": metric, "values": [[t0 + i * step, m.group(3)] for i in range(points)]})
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def test_range_query_json_compact_and_pretty(tmp_path: Path) -> None:
    doc = _matrix(_t4_lines(), 20)
    for name, text in (("compact.json", json.dumps(doc)), ("pretty.json", json.dumps(doc, indent=2))):
        f = tmp_path / name
        f.write_text(text)
        res = loose.analyze_path(str(f))
        assert "dcgm" in res.inputs[0].kind.split("+") and res.inputs[0].status == "ok", res.inputs
        ev = EvidenceSet(res.evidence)
        assert _ev(ev, "gpu.util_samples").value == 20
        assert _ev(ev, "gpu.util_ratio").quality is Quality.GOOD  # 20 readings
        assert _ev(ev, "gpu.throttle_ratio").value == 1.0
        findings = run_rules(ev)[0]
        assert findings[0].category.value == "gpu_compute"
        assert {"GPU002", "GPU003"} <= {f.code for f in findings}
        assert all(f.title != "The GPU is saturated" for f in findings)


def test_query_json_cut_short_keeps_the_complete_series(tmp_path: Path) -> None:
    text = json.dumps(_matrix(_t4_lines(), 5), indent=1)
    cut = text[: int(len(text) * 0.6)]
    f = tmp_path / "cut.json"
    f.write_text(cut)
    res = loose.analyze_path(str(f))
    assert "dcgm" in res.inputs[0].kind.split("+")
    assert res.inputs[0].status == "partial" and "complete series" in res.inputs[0].reason
    assert any(e.key == "gpu.util_ratio" for e in res.evidence)  # GPU_UTIL comes early in the scrape


def test_a_json_lines_log_is_not_a_query_answer() -> None:
    buf = QueryJsonBuffer()
    buf.feed('{"ts": 1.0, "request_id": "r-1", "stages_ms": {"queue": 1.0}, "note": "DCGM_FI_DEV_GPU_UTIL"}')
    buf.feed('{"ts": 2.0, "request_id": "r-2", "stages_ms": {"queue": 1.0}}')
    assert buf.result() is None
    assert parse_query_json({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}) is None


def test_throttle_bitmask_xid_and_mig_labels() -> None:
    lines = [
        '# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).',
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",modelName="NVIDIA H100 80GB HBM3",GPU_I_PROFILE="3g.40gb",'
        'GPU_I_ID="2",Hostname="n1"} 97',
        'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-a",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="n1"} 1100',
        'DCGM_FI_DEV_MAX_SM_CLOCK{gpu="0",UUID="GPU-a",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="n1"} 1980',
        'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{gpu="0",UUID="GPU-a",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",'
        'Hostname="n1"} 96',  # 0x20 | 0x40: software and hardware thermal slowdown
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-a",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="n1"} 91',
        'DCGM_FI_DEV_XID_ERRORS{gpu="0",UUID="GPU-a",GPU_I_PROFILE="3g.40gb",GPU_I_ID="2",Hostname="n1"} 79',
    ]
    buf = DcgmBuffer()
    for line in lines:
        buf.feed(line)
    ev = EvidenceSet(derive_dcgm.derive(buf.result(), "h100"))
    assert _ev(ev, "gpu.throttle_reasons").value == ["SwThermalSlowdown", "HwThermalSlowdown"]
    assert _ev(ev, "gpu.thermal_throttle_ratio").value == 1.0
    assert _ev(ev, "gpu.xid_events").value == [{"gpu": "0", "host": "n1", "xid": 79, "ts": None}]
    assert _ev(ev, "gpu.mig_instances").value == 1
    findings = run_rules(ev)[0]
    gpu003 = next(f for f in findings if f.code == "GPU003")
    assert gpu003.title == "The GPU throttles: thermal slowdown" and "91 °C" in gpu003.message


def test_dcgm_exporter_1x_names() -> None:
    buf = DcgmBuffer()
    for line in ('dcgm_gpu_utilization{gpu="0",uuid="GPU-b"} 40', 'dcgm_fb_used{gpu="0",uuid="GPU-b"} 1024',
                 'dcgm_fb_free{gpu="0",uuid="GPU-b"} 1024', 'dcgm_fi_prof_gr_engine_active{gpu="0",uuid="GPU-b"} 35'):
        assert buf.feed(line)
    ev = EvidenceSet(derive_dcgm.derive(buf.result(), "old"))
    assert _ev(ev, "gpu.util_ratio").value == pytest.approx(0.40)
    assert _ev(ev, "gpu.engine_active_ratio").value == pytest.approx(0.35)  # 1.x exposed it in percent
    assert _ev(ev, "gpu.memory_total_bytes").value == 2048 << 20


def test_unrelated_text_is_not_dcgm() -> None:
    buf = DcgmBuffer()
    for line in ("vllm:num_requests_running 3", "# HELP vllm:num_requests_running x", "dcgm is great", "DCGM_FI"):
        assert not buf.feed(line)
    assert not buf.matched()


@pytest.mark.parametrize("path", [T4, L4], ids=lambda p: os.path.basename(p)[:30])
def test_a_scrape_past_the_head_of_a_big_input_derives_the_same(path: str) -> None:
    """The exposition form is read anywhere in an input (its lines hold the triggers): read as a big log's
    tail with no head at all, the DCGM source derives exactly what it derives from every line."""
    import io

    from diagnose.collectors.logtext import clean_lines

    data = Path(path).read_bytes()
    tail = derive_dcgm.DcgmSource()
    loose.read_into([tail], io.BufferedReader(io.BytesIO(data)), head_bytes=0)  # type: ignore[arg-type]
    full = derive_dcgm.DcgmSource()
    for line in clean_lines(data.decode().splitlines()):
        full.feed(line)
    assert tail.matched() and full.matched()
    got = {e.key: e.value for e in tail.evidence("x")}
    assert got == {e.key: e.value for e in full.evidence("x")} and "gpu.util_ratio" in got
