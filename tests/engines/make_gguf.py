"""Write a tiny random-weight Llama-architecture GGUF that llama.cpp loads and generates from.

    python tests/engines/make_gguf.py OUT.gguf            # small: 4 layers, hidden 256, vocab 4096
    python tests/engines/make_gguf.py OUT.gguf --big      # 8 layers, hidden 1024, ff 2816, vocab 8192

No model hub: the tokenizer is a SentencePiece-style ("llama") vocabulary built here — the three
special tokens, the 256 byte-fallback tokens ``<0xXX>``, the printable ASCII characters, and the
``▁``-prefixed words (with every prefix, so the SPM merge walk reaches each word) of the prompts
``diagnose sweep`` sends, filled up with generated syllable words. The prompt words then cost one
token each, so a prompt of N words is about N+1 tokens (BOS).

The weights are random (normal, std 0.02) except one steering trick so that streamed token counts are
exact: dimension 0 of every token embedding is a large constant, so the final normed hidden state
always has a big positive component there, and ``output.weight`` has a large negative value in
column 0 for the tokens that would stream no text (``<unk>``, ``<s>``, ``</s>``, the bytes
0x80-0xFF that are parts of a UTF-8 character). Those are never sampled: generation never stops
early on EOS and every generated token is one SSE event with text.

Needs only numpy and ``gguf`` (PyPI).
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys

import numpy as np

try:
    import gguf
except ImportError:  # pragma: no cover - the lab venv has it
    sys.exit("needs the gguf package: pip install gguf (tests/engines/llamacpp_lab.sh installs it)")

# the words of diagnose sweep's prompts (analyzer/sweep.py _WORDS)
SWEEP_WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
               "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
               "whiskey", "xray", "yankee", "zulu")
SPACE = "\u2581"  # ▁
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_BYTE = 1, 2, 3, 6

SHAPES = {
    # name: (n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, n_ctx)
    "small": (4, 256, 768, 4, 2, 4096, 4096),
    "big": (8, 1024, 2816, 16, 4, 8192, 8192),
}


def build_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"]
    types = [TT_UNKNOWN, TT_CONTROL, TT_CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [TT_BYTE] * 256
    seen = set(tokens)

    def add(tok: str) -> None:
        if tok not in seen and len(tokens) < n_vocab:
            seen.add(tok)
            tokens.append(tok)
            types.append(TT_NORMAL)

    add(SPACE)
    for c in range(33, 127):
        add(chr(c))
    for w in (*SWEEP_WORDS, "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "on"):
        for i in range(1, len(w) + 1):
            add(SPACE + w[:i])
    rng = random.Random(1234)
    cons, vows = "bcdfghjklmnprstvwz", "aeiou"
    syll = [c + v for c, v in itertools.product(cons, vows)]
    while len(tokens) < n_vocab:
        word = "".join(rng.choice(syll) for _ in range(rng.randint(1, 3)))
        for i in range(1, len(word) + 1):
            add(SPACE + word[:i])
    n_special = 3 + 256
    scores = [0.0] * n_special + [-float(i) for i in range(len(tokens) - n_special)]
    return tokens, scores, types


def write(path: str, shape: str, seed: int) -> None:
    n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab, n_ctx = SHAPES[shape]
    head_dim = n_embd // n_head
    n_embd_kv = head_dim * n_head_kv
    tokens, scores, types = build_vocab(n_vocab)
    rng = np.random.default_rng(seed)

    def rand(*shp: int) -> np.ndarray:  # numpy (rows, cols) = ggml ne [cols, rows]
        return (rng.standard_normal(shp, dtype=np.float32) * 0.02).astype(np.float32)

    w = gguf.GGUFWriter(path, "llama")
    w.add_name(f"lab-random-llama-{shape}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)

    embd = rand(n_vocab, n_embd)
    embd[:, 0] = 4.0  # the steering dimension (see the module docstring)
    w.add_tensor("token_embd.weight", embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    out = rand(n_vocab, n_embd)
    out[:, 0] = 0.0
    silent = [0, 1, 2] + [3 + b for b in range(0x80, 0x100)]
    out[silent, 0] = -10.0
    w.add_tensor("output.weight", out)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(n_embd, n_embd))
        w.add_tensor(p + "attn_k.weight", rand(n_embd_kv, n_embd))
        w.add_tensor(p + "attn_v.weight", rand(n_embd_kv, n_embd))
        w.add_tensor(p + "attn_output.weight", rand(n_embd, n_embd))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", rand(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", rand(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    n_params = n_vocab * n_embd * 2 + n_layer * (2 * n_embd * n_embd + 2 * n_embd_kv * n_embd + 3 * n_ff * n_embd)
    print(f"{path}: llama, {shape}: {n_layer} layers, hidden {n_embd}, ff {n_ff}, heads {n_head}/{n_head_kv} kv, "
          f"vocab {n_vocab}, ctx {n_ctx}, {n_params / 1e6:.1f} M params (f32)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="the .gguf file to write")
    ap.add_argument("--big", action="store_true", help="the bigger shape, for prompt-processing-bound runs")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    write(args.out, "big" if args.big else "small", args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
