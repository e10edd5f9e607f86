"""A Phi-4-mini-shaped GGUF for speed comparisons: random bf16 weights of Phi-4-mini-instruct's shapes
(hidden 3072, 24 heads / 8 KV heads of 128, 3/4 of each head rotated, FFN 8192, vocabulary 200,064, tied
embeddings, LongRoPE with made-up factor lists) cut to ``--layers`` layers, with the demo model's tokenizer
(its token list padded to the vocabulary), written by transformers, exported by gguf_export.py (llama.cpp's
phi3 layout) and quantized by llama.cpp's own quantizer.

    .venv/bin/python benchmarks/phi_gguf.py OUT_DIR [--layers 4] [--ftype Q4_0]   # prints the .gguf path
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_export import export_gguf  # noqa: E402
from moe_gguf import quantize_gguf  # noqa: E402

from glassbox.models.sources import DEMO_MODEL_DIR  # noqa: E402


def phi4_mini_dir(out: Path, layers: int) -> Path:
    """The random checkpoint (kept when already written)."""
    import transformers as tf

    if (out / "config.json").is_file():
        return out
    factors = 48  # rotary frequencies: 0.75 * 128 / 2
    cfg = tf.Phi3Config(
        hidden_size=3072, intermediate_size=8192, num_hidden_layers=layers, num_attention_heads=24,
        num_key_value_heads=8, vocab_size=200064, max_position_embeddings=131072,
        original_max_position_embeddings=4096, partial_rotary_factor=0.75, rms_norm_eps=1e-5,
        rope_scaling={"rope_type": "longrope", "short_factor": [1.0 + 0.01 * i for i in range(factors)],
                      "long_factor": [1.0 + 0.5 * i for i in range(factors)]},
        tie_word_embeddings=True, pad_token_id=0, bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    model = tf.Phi3ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    for f in DEMO_MODEL_DIR.iterdir():
        if f.name.startswith("tokenizer"):
            shutil.copy(f, out / f.name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--ftype", default="Q4_0", help="llama.cpp file type (Q4_0, Q8_0, Q4_K_M, ...)")
    args = ap.parse_args()
    hf = phi4_mini_dir(args.out / f"phi4-mini-{args.layers}l", args.layers)
    bf16 = args.out / f"phi4-mini-{args.layers}l-bf16.gguf"
    if not bf16.is_file():
        export_gguf(hf, bf16, "bf16")
    print(quantize_gguf(bf16, args.out / f"phi4-mini-{args.layers}l-{args.ftype}.gguf", args.ftype))


if __name__ == "__main__":
    main()
