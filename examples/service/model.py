"""The demo service's models: small real PyTorch modules, run on the CPU.

``TinyCNN`` (cpu-preprocess), ``FeatureMLP`` (recompile, wrapped in ``torch.compile``),
``TokenClassifier`` (queueing, healthy) and ``TinyDecoderLM``, a GPT-style decoder with a KV
cache (prefill).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from torch.nn import functional as F


class TinyCNN(nn.Module):
    """A small image classifier: three strided convolutions, global pooling, a linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.features(x))
        return out


class MLPBlock(nn.Module):
    """Pre-norm residual feed-forward block (the MLP half of a transformer layer)."""

    def __init__(self, d_model: int, d_hidden: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, d_hidden)
        self.down = nn.Linear(d_hidden, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(torch.relu(self.up(self.norm(x))))
        return out


class TokenClassifier(nn.Module):
    """Embedding -> stack of MLP blocks -> mean pool -> linear head (a text classifier)."""

    def __init__(self, vocab: int, d_model: int, d_hidden: int, n_blocks: int, num_classes: int = 10):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.blocks = nn.Sequential(*[MLPBlock(d_model, d_hidden) for _ in range(n_blocks)])
        self.head = nn.Linear(d_model, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.embed(tokens)).mean(dim=1))
        return out


class ResidualLinear(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.linear(x))


class FeatureMLP(nn.Module):
    """A deep, narrow residual MLP over feature rows; the model ``recompile`` wraps in torch.compile.

    Many small layers make each compile mostly Python-side work (dynamo tracing, AOT autograd,
    inductor lowering and scheduling) while the generated C++ kernels are few and identical, so
    the C++ compiler, which runs in a child process, is a minority of the compile time.
    """

    def __init__(self, in_features: int = 64, width: int = 128, depth: int = 32, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Linear(in_features, width)
        self.blocks = nn.Sequential(*[ResidualLinear(width) for _ in range(depth)])
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(self.stem(x)))
        return out


@dataclass(frozen=True)
class TokenModelConfig:
    """A ``TokenClassifier``'s sizes and the fixed sequence length its requests are padded to."""

    vocab: int
    d_model: int
    d_hidden: int
    n_blocks: int
    seq_len: int


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int
    d_model: int
    n_heads: int
    d_hidden: int
    n_layers: int
    max_model_len: int


KVCache = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [heads, capacity, head_dim]


class DecoderLayer(nn.Module):
    """A pre-norm transformer decoder layer: causal multi-head self-attention, then a GELU MLP."""

    def __init__(self, d_model: int, n_heads: int, d_hidden: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.up = nn.Linear(d_model, d_hidden)
        self.down = nn.Linear(d_hidden, d_model)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.norm2(x))))
        return out

    def prefill(self, x: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor], start: int = 0) -> torch.Tensor:
        """x ``[1, C, d]``: prompt positions ``start .. start+C-1`` (a whole prompt, or a chunk of one).

        Writes the positions' keys and values into the cache, then lets every position attend over
        the cached prefix and the earlier positions given (O(C·(start+C))); from ``start == 0``,
        plain causal attention over the positions given.
        """
        _, length, d = x.shape
        end = start + length
        q, k, v = self.qkv(self.norm1(x)).view(1, length, 3, self.n_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        cache[0][:, start:end] = k[0]
        cache[1][:, start:end] = v[0]
        if start == 0:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(length, end, dtype=torch.bool).tril(diagonal=start)  # j <= start + i
            a = F.scaled_dot_product_attention(q, cache[0][None, :, :end], cache[1][None, :, :end], attn_mask=mask)
        x = x + self.proj(a.transpose(1, 2).reshape(1, length, d))
        return self._mlp(x)

    def decode(
        self, x: torch.Tensor, positions: list[int], caches: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """x ``[B, d]``: one new token per sequence, attending over its own cached keys and values."""
        batch, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, 3, self.n_heads, self.head_dim).unbind(1)
        out = []
        for b, (pos, (kc, vc)) in enumerate(zip(positions, caches, strict=True)):
            kc[:, pos] = k[b]
            vc[:, pos] = v[b]
            a = F.scaled_dot_product_attention(q[b][None, :, None], kc[None, :, : pos + 1], vc[None, :, : pos + 1])
            out.append(a.reshape(d))
        x = x + self.proj(torch.stack(out))
        return self._mlp(x)


class TinyDecoderLM(nn.Module):
    """A small GPT-style language model with a KV cache: ``prefill`` a prompt, then ``decode`` token by token."""

    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_model_len, cfg.d_model)
        self.layers = nn.ModuleList(DecoderLayer(cfg.d_model, cfg.n_heads, cfg.d_hidden) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model)

    def new_cache(self, capacity: int) -> KVCache:
        heads, head_dim = self.cfg.n_heads, self.cfg.d_model // self.cfg.n_heads
        return [
            (torch.empty(heads, capacity, head_dim), torch.empty(heads, capacity, head_dim))
            for _ in range(self.cfg.n_layers)
        ]

    def _decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, m) for m in self.layers]

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.norm(h), self.embed.weight)  # the LM head is tied to the embedding

    def prefill(self, ids: torch.Tensor, cache: KVCache, start: int = 0) -> torch.Tensor:
        """ids ``[C]``, prompt tokens from position ``start`` → logits ``[vocab]`` of the token after them.

        The whole prompt in one forward (``start == 0``), or chunk by chunk (chunked prefill):
        both fill the same cache and end with the same logits (up to float rounding); after a
        chunk that does not end the prompt the logits are not used.
        """
        length = ids.shape[0]
        x = (self.embed(ids) + self.pos(torch.arange(start, start + length)))[None]
        for layer, layer_cache in zip(self._decoder_layers(), cache, strict=True):
            x = layer.prefill(x, layer_cache, start)
        return self._logits(x[0, -1])

    def decode(self, tokens: list[int], positions: list[int], caches: list[KVCache]) -> torch.Tensor:
        """One decode step for a batch of sequences → logits ``[B, vocab]``."""
        x = self.embed(torch.tensor(tokens)) + self.pos(torch.tensor(positions))
        for i, layer in enumerate(self._decoder_layers()):
            x = layer.decode(x, positions, [c[i] for c in caches])
        return self._logits(x)


def summarize_logits(logits: torch.Tensor) -> dict[str, Any]:
    """The JSON result of an inference: top class and its probability per row."""
    probs = torch.softmax(logits.float(), dim=-1)
    top_p, top_c = probs.max(dim=-1)
    return {
        "rows": int(probs.shape[0]),
        "top_class": [int(c) for c in top_c.tolist()[:8]],
        "top_prob": [round(float(p), 4) for p in top_p.tolist()[:8]],
    }

