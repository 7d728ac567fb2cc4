"""The LitServe image classifier of ``litserve_image.py`` with a CNN that costs about as much as its pre-processing.

Its operating point under 4 clients sits on two thresholds at once: about 4 requests in flight
(QUE001's ``min_inflight``) and pre-processing about half of the busy time (QUE001's cause share):
the case where a verdict that cuts instead of ramping flips from one attach to the next. One
worker, PIL decode/blur/resize/normalise in ``decode_request`` (LitServe's docs' way).
usage: python litserve_image_balanced.py PORT
"""

import base64
import io
import sys

import litserve as ls
import numpy as np
import torch
from PIL import Image, ImageFilter

WIDTH = 112  # conv channels: a forward of about the pre-processing's 40 ms on one core


class ImageAPI(ls.LitAPI):
    def setup(self, device):
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, WIDTH, 3, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(WIDTH, WIDTH, 3, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(WIDTH, WIDTH, 3, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(WIDTH, WIDTH, 3, padding=1), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(WIDTH, 10)).eval()

    def decode_request(self, request):
        img = Image.open(io.BytesIO(base64.b64decode(request["image"]))).convert("RGB")
        img = img.filter(ImageFilter.GaussianBlur(2)).resize((320, 320), Image.LANCZOS)
        arr = np.asarray(img, dtype=np.float32) / 255.0
        arr = (arr - arr.mean(axis=(0, 1))) / (arr.std(axis=(0, 1)) + 1e-6)
        return torch.from_numpy(arr.transpose(2, 0, 1).copy()).unsqueeze(0)

    def predict(self, x):
        with torch.no_grad():
            return self.model(x)

    def encode_response(self, output):
        return {"class": int(output.argmax())}


if __name__ == "__main__":
    server = ls.LitServer(ImageAPI(), accelerator="cpu", workers_per_device=1, timeout=60)
    server.run(port=int(sys.argv[1]), generate_client_file=False)
