"""A LitServe image classifier written the way its docs show: PIL decode/resize in decode_request.

Started by the integration tests as a service "nobody here wrote": LitServe runs the API server
and the inference worker in separate processes, so the pid the test knows is the parent.
usage: python litserve_image.py PORT
"""

import base64
import io
import sys

import litserve as ls
import numpy as np
import torch
from PIL import Image, ImageFilter


class ImageAPI(ls.LitAPI):
    def setup(self, device):
        torch.set_num_threads(1)
        self.model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, stride=4), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
            torch.nn.Flatten(), torch.nn.Linear(8, 10)).eval()

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
