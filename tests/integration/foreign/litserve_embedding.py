"""A LitServe text-embedding service written the way its docs show: one worker, no batching.

The service of issue 13's cost measurement: ``diagnose attach`` must cost it little (the attach
overhead benchmark drives it with 2 clients). Tokenising is a CRC of each word (the service is
about the model, not the tokeniser); the encoder is a small MLP stack run by one torch thread.
usage: python litserve_embedding.py PORT
"""

import sys
import zlib

import litserve as ls
import torch

VOCAB = 30522
DIM = 256


class EmbeddingAPI(ls.LitAPI):
    def setup(self, device):
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(VOCAB, DIM)
        self.encoder = torch.nn.Sequential(*[
            torch.nn.Sequential(torch.nn.Linear(DIM, 4 * DIM), torch.nn.GELU(), torch.nn.Linear(4 * DIM, DIM))
            for _ in range(4)]).eval()

    def decode_request(self, request):
        ids = [zlib.crc32(word.encode()) % VOCAB for word in str(request["text"]).split()][:128]
        return torch.tensor([ids or [0]])

    def predict(self, x):
        with torch.no_grad():
            return self.encoder(self.embed(x)).mean(dim=1)[0]

    def encode_response(self, output):
        return {"embedding": output.tolist()}


if __name__ == "__main__":
    server = ls.LitServer(EmbeddingAPI(), accelerator="cpu", workers_per_device=1, timeout=60)
    server.run(port=int(sys.argv[1]), generate_client_file=False)
