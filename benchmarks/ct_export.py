"""A bf16 Hugging Face directory written as a compressed-tensors integer checkpoint (llm-compressor's
W4A16 / W8A8 layouts) by the compressed-tensors package: round-to-nearest scales (symmetric, max |w| over
the group or row), the package's own quantization and packing; lm_head and embeddings stay bf16.

    .venv/bin/python benchmarks/ct_export.py SRC OUT [--scheme w4a16|w8a8]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SCHEMES = {  # weights: (bits, strategy, group size); W8A8: int8 activations per token, dynamic
    "w4a16": (4, "group", 128, "pack-quantized"),
    "w8a8": (8, "channel", None, "int-quantized"),
}


def export_ct(src: Path, out: Path, scheme: str) -> Path:
    """Write ``src`` (a safetensors directory) to ``out`` with its linear layers in ``scheme``."""
    from compressed_tensors.compressors.naive_quantized.base import IntQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    bits, strategy, group, fmt = SCHEMES[scheme]
    weights = QuantizationArgs(num_bits=bits, type="int", symmetric=True, strategy=strategy, group_size=group)
    act = (
        QuantizationArgs(num_bits=8, type="int", strategy="token", dynamic=True) if scheme == "w8a8" else None
    )
    qs = QuantizationScheme(targets=["Linear"], weights=weights, input_activations=act)
    compressor = PackedQuantizationCompressor if fmt == "pack-quantized" else IntQuantizationCompressor
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(src.glob("*.safetensors")):
        for name, t in load_file(str(path)).items():
            if not (name.endswith("_proj.weight") and t.ndim == 2):
                tensors[name] = t
                continue
            n, k = t.shape
            rows = t.float().view(n, -1, group) if group else t.float().view(n, 1, k)
            scale = (rows.abs().amax(-1) / ((1 << (bits - 1)) - 1)).clamp(min=1e-8).to(t.dtype)
            stored = compressor.compress({"weight": t, "weight_scale": scale}, qs)
            prefix = name.removesuffix(".weight")
            tensors.update({f"{prefix}.{part}": v.contiguous() for part, v in stored.items()})
    save_file(tensors, str(out / "model.safetensors"))
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json" and f.is_file():
            shutil.copy(f, out / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {"group_0": qs.model_dump()},
        "ignore": ["lm_head"],
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--scheme", choices=list(SCHEMES), default="w4a16")
    args = ap.parse_args()
    print(export_ct(args.src, args.out, args.scheme))


if __name__ == "__main__":
    main()
