"""A small Llama-architecture model folder for vLLM's CPU build, made here with no model hub.

vLLM needs a ``config.json`` (the architecture and its sizes) and a tokenizer; with
``--load-format dummy`` it fills the weights with random values, so no weights file is written.
The tokenizer is a byte-level BPE trained with ``tokenizers`` on text this machine already has
(the Python standard library's sources), so prompts tokenise as a real tokenizer would.

    python tests/engines/vllm_model.py OUT_DIR [--size tiny|prefill]

Sizes: ``tiny`` (2 layers, hidden 256: decode is cheap, the healthy and queueing runs) and
``prefill`` (8 layers, hidden 768, ~60M parameters: prompt processing is costly on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

SIZES: dict[str, dict[str, int]] = {
    "tiny": {"hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 4},
    "prefill": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8,
                "num_attention_heads": 12, "num_key_value_heads": 4},
}
VOCAB = 4096
MAX_POS = 4096


def _corpus(limit_bytes: int = 4_000_000) -> list[str]:
    """Text to train the BPE on: the standard library's Python sources (always on the machine)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    used = 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        used += len(text)
        if used >= limit_bytes:
            break
    return texts


def write_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "model_max_length": MAX_POS, "add_bos_token": True,
    }, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))


def write_config(out: Path, size: str) -> None:
    shape = SIZES[size]
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": VOCAB, "max_position_embeddings": MAX_POS,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", **shape,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    # no eos in generation: a random-weight model would stop at random; max_tokens bounds each answer
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if not (args.out / "tokenizer.json").exists():
        write_tokenizer(args.out)
    write_config(args.out, args.size)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
