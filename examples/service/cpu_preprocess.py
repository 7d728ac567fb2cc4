"""``cpu-preprocess``: serial, naive image pre-processing in the request thread, then a tiny CNN.

The body is a JPEG. Each request thread decodes it with PIL, blurs it, auto-contrasts it, resizes
and crops it to 224x224 and normalises it in numpy with several naive passes, then runs a tiny
CNN. Preprocessing dominates the CPU time of the request path.

``--fixed`` (CPU001/STG001's fix): cheap pre-processing (JPEG decoded at reduced scale, one
crop-and-resize to 224x224, one vectorised float32 normalisation); ``--preprocess-workers N`` runs
it in a process pool.
"""

from __future__ import annotations

import base64
import io
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFilter, ImageOps

from diagnose.examples.service.base import JOB_TIMEOUT_S, BadRequest, InferenceResult, Pathology, parse_json
from diagnose.examples.service.model import TinyCNN, summarize_logits

IMAGE_SIZE = 224
RESIZE_SHORT_SIDE = 256
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


# --------------------------------------------------------------------------------------------
# Preprocessing (cpu-preprocess): deliberately serial and naive, as found in many services
# --------------------------------------------------------------------------------------------


def decode_image(data: bytes) -> Image.Image:
    """Decode the JPEG at full resolution (no ``draft`` mode) and convert to RGB."""
    img: Image.Image = Image.open(io.BytesIO(data))
    img = ImageOps.exif_transpose(img)
    return img.convert("RGB")


def denoise(img: Image.Image) -> Image.Image:
    """Blur then stretch contrast, at full resolution, before resizing."""
    img = img.filter(ImageFilter.GaussianBlur(radius=1.5))
    return ImageOps.autocontrast(img, cutoff=1)


def resize(img: Image.Image, size: int = IMAGE_SIZE, short_side: int = RESIZE_SHORT_SIDE) -> Image.Image:
    """Resize the short side to ``short_side`` with Lanczos, then centre-crop ``size`` x ``size``."""
    w, h = img.size
    scale = short_side / min(w, h)
    img = img.resize((max(size, round(w * scale)), max(size, round(h * scale))), Image.Resampling.LANCZOS)
    w, h = img.size
    left, top = (w - size) // 2, (h - size) // 2
    return img.crop((left, top, left + size, top + size))


def normalize(img: Image.Image) -> np.ndarray:
    """HWC uint8 -> CHW float32, ImageNet mean/std, one channel at a time, in float64."""
    arr = np.asarray(img)
    channels = []
    for c in range(3):
        ch = arr[:, :, c].astype(np.float64)  # strided copy of one channel
        ch = ch / 255.0
        ch = (ch - IMAGENET_MEAN[c]) / IMAGENET_STD[c]
        channels.append(ch)
    chw = np.stack(channels, axis=0)
    chw = np.clip(chw, -3.0, 3.0)  # a second pass: clip outliers ...
    mean = chw.mean(axis=(1, 2), keepdims=True)  # ... then per-image standardisation, two more passes
    std = chw.std(axis=(1, 2), keepdims=True)
    chw = (chw - mean) / (std + 1e-6)
    return np.ascontiguousarray(chw.astype(np.float32))


def preprocess(data: bytes) -> np.ndarray:
    """JPEG bytes -> normalised 3x224x224 float32 array."""
    img = decode_image(data)
    img = denoise(img)
    img = resize(img)
    return normalize(img)


# Preprocessing, fixed (cpu-preprocess --fixed): what CPU001/STG001 recommend. Decode at reduced
# scale (libjpeg's DCT scaling, which also low-passes the image as the blur did), crop and resize
# ONCE to the model's input size, normalise in one vectorised float32 pass; run in a process pool,
# off the request threads and their GIL.
_NORM_SCALE = (1.0 / (255.0 * np.array(IMAGENET_STD))).astype(np.float32)
_NORM_OFFSET = (np.array(IMAGENET_MEAN) / np.array(IMAGENET_STD)).astype(np.float32)


def decode_resize_fast(data: bytes, size: int = IMAGE_SIZE, short_side: int = RESIZE_SHORT_SIDE) -> Image.Image:
    """The same centre crop as ``resize(decode_image(...))``, decoded at the smallest JPEG scale that
    still covers ``size`` pixels and resampled once (bilinear) straight to ``size`` x ``size``."""
    src = Image.open(io.BytesIO(data))
    src.draft("RGB", (size, size))  # JPEG: decode at 1/2, 1/4 or 1/8 scale when that is still >= size
    img = ImageOps.exif_transpose(src).convert("RGB")
    w, h = img.size
    side = min(w, h) * size / short_side  # the crop of the original pipeline, in decoded pixels
    left, top = (w - side) / 2, (h - side) / 2
    return img.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + side, top + side))


def normalize_fast(img: Image.Image) -> np.ndarray:
    """``normalize`` in float32 with whole-array operations over contiguous channel rows."""
    w, h = img.size
    chw = np.ascontiguousarray(np.asarray(img).transpose(2, 0, 1), dtype=np.float32).reshape(3, -1)
    chw *= _NORM_SCALE[:, None]  # ImageNet mean/std
    chw -= _NORM_OFFSET[:, None]
    np.clip(chw, -3.0, 3.0, out=chw)
    chw -= chw.mean(axis=1, keepdims=True)  # per-image standardisation
    chw /= chw.std(axis=1, keepdims=True) + 1e-6
    return chw.reshape(3, h, w)


def preprocess_fast(data: bytes) -> np.ndarray:
    """JPEG bytes -> normalised 3x224x224 float32 array, the cheap way (``preprocess``'s fix)."""
    return normalize_fast(decode_resize_fast(data))


class CpuPreprocessPathology(Pathology):
    """Serial JPEG decode/blur/resize/normalise in the request thread, then a tiny CNN."""

    name = "cpu-preprocess"

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = TinyCNN().eval()

    def warmup(self) -> None:
        from diagnose.examples.loadgen import make_jpeg

        for _ in range(2):
            self._run(make_jpeg())

    def _preprocess(self, jpeg: bytes) -> np.ndarray:
        return preprocess(jpeg)

    def _run(self, jpeg: bytes) -> InferenceResult:
        t0 = time.perf_counter()
        x = self._preprocess(jpeg)
        t1 = time.perf_counter()
        with torch.no_grad():
            logits = self.model(torch.from_numpy(x).unsqueeze(0))
        t2 = time.perf_counter()
        out = summarize_logits(logits)
        t3 = time.perf_counter()
        stages = {"preprocess": (t1 - t0) * 1e3, "forward": (t2 - t1) * 1e3, "postprocess": (t3 - t2) * 1e3}
        return InferenceResult(out, stages)

    def infer(self, body: bytes, content_type: str) -> InferenceResult:
        if content_type.startswith("application/json"):
            doc = parse_json(body)
            try:
                jpeg = base64.b64decode(doc["image_b64"], validate=True)
            except (KeyError, TypeError, ValueError) as exc:
                raise BadRequest("JSON body needs an 'image_b64' field with a base64 JPEG") from exc
        else:
            jpeg = body
        if not jpeg:
            raise BadRequest("empty image")
        try:
            return self._run(jpeg)
        except (OSError, Image.DecompressionBombError) as exc:
            raise BadRequest(f"cannot decode image: {exc}") from exc


class FastPreprocessPathology(CpuPreprocessPathology):
    """``cpu-preprocess --fixed``: the same service and model with CPU001/STG001's fix applied.

    The pre-processing is made cheap (``preprocess_fast``: reduced-scale JPEG decode, one resize
    to the model's input size, one vectorised float32 normalisation). With ``pool_workers`` > 0 it
    runs in a process pool, off the request threads and the GIL; by default it stays in the
    request thread: PIL and numpy release the GIL in their C loops, so on a 2-core host the pool's
    pickling and extra processes cost more than they save (measured: lower throughput, and the
    run queue holds more threads than cores).
    """

    def __init__(self, pool_workers: int = 0) -> None:
        super().__init__()
        n = max(0, pool_workers)
        # forkserver: a fork of this process (torch's thread pools started) is not safe
        self.pool = (ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("forkserver"))
                     if n > 0 else None)
        self.pool_workers = n

    def warmup(self) -> None:
        from diagnose.examples.loadgen import make_jpeg

        jpeg = make_jpeg()
        if self.pool is not None:  # start every worker (each imports this module) before READY
            for f in [self.pool.submit(preprocess_fast, jpeg) for _ in range(2 * self.pool_workers)]:
                f.result(timeout=JOB_TIMEOUT_S)
        for _ in range(2):
            self._run(jpeg)

    def _preprocess(self, jpeg: bytes) -> np.ndarray:
        if self.pool is None:
            return preprocess_fast(jpeg)
        return self.pool.submit(preprocess_fast, jpeg).result(timeout=JOB_TIMEOUT_S)

    def stats(self) -> dict[str, Any]:
        return {"preprocess_pool_workers": self.pool_workers}

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)


def make(fixed: bool = False, preprocess_workers: int = 0) -> Pathology:
    """The cpu-preprocess service, or with ``fixed`` its fix (cheap pre-processing, optionally in
    ``preprocess_workers`` processes)."""
    return FastPreprocessPathology(preprocess_workers) if fixed else CpuPreprocessPathology()
