"""Repeated attaches to one service under one load give one verdict (issue 13).

The LitServe image service of ``foreign/litserve_image_balanced.py`` under 4 clients sits on two of
QUE001's thresholds at once: about 4.0 requests in flight, and pre-processing about half of the
worker's busy time (measured 0.38-0.58 here). With cuts, six attaches gave two different primaries;
with ramps and the cause leading its symptom, ten short attaches must agree at least nine times.
"""

from __future__ import annotations

import base64
import io
from collections import Counter

import pytest

from diagnose.attach import AttachOptions, attach
from tests.integration.test_foreign_services import _post, _wait_for, load, service

pytestmark = pytest.mark.integration
ATTACHES = 10
WINDOW_S = 3.0  # short windows: the noisiest case, and the test stays bounded (about a minute)


def _jpeg() -> str:
    from PIL import Image

    img = Image.effect_noise((1024, 768), 64).convert("RGB")
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=90)
    return base64.b64encode(buf.getvalue()).decode()


def test_ten_attaches_near_the_thresholds_agree(tmp_path) -> None:
    image = _jpeg()
    primaries: list[str | None] = []
    measured: list[tuple[float, float]] = []
    with service("litserve_image_balanced.py", lambda p: _post(p, "/predict", {"image": image}, 30) == 200) \
            as (proc, port):
        with load(port, "/predict", lambda i: {"image": image}, clients=4, seconds=300) as done:
            _wait_for(done, 4, 60)
            for i in range(ATTACHES):
                _, diagnosis = attach(AttachOptions(pid=proc.pid, duration_s=WINDOW_S, output=str(tmp_path / f"s{i}")))
                primaries.append(diagnosis.primary.value if diagnosis.primary else None)
                ev = {e.key: e.value for e in diagnosis.evidence}
                measured.append((ev.get("conn.inflight_mean", -1.0), ev.get("cpu.preprocess_share", -1.0)))
    (top, n), = Counter(primaries).most_common(1)
    assert n >= 9, f"primaries {primaries}; (in flight, pre-processing share) per attach {measured}"
    assert top == "cpu_preprocessing", primaries  # the saturated cause leads; the queue is its symptom
