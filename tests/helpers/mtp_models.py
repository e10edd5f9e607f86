"""Tiny Qwen3-Next / Qwen3.5 checkpoints with multi-token-prediction weights (``mtp.*``) written next to
transformers' own (transformers ignores them): ``mtp_num_hidden_layers: 1`` in config.json, and
``mtp.fc``, the pre-fc norms, ``mtp.layers.0.*`` (shaped as the model's full-attention layer 3, which has
the MLP or MoE of layer 0 in these configs) and ``mtp.norm``.

``copy_bias`` > 0 adds that multiple of [I | 0] to fc, so the head leans to proposing its input token
again (with the copying targets of tests/engine/test_spec_hybrid.py, drafts are then accepted often, not
always); 0: fully random."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

FULL_LAYER = 3  # the tiny configs' full-attention layer


def add_mtp(src: Path, dst: Path, seed: int = 1, copy_bias: float = 0.0) -> Path:
    """``src``'s checkpoint copied to ``dst`` with random MTP weights (see the module docstring)."""
    if (dst / "config.json").is_file():
        return dst
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg["mtp_num_hidden_layers"] = 1
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    w = load_file(dst / "model.safetensors")
    g = torch.Generator().manual_seed(seed)
    h = cfg["hidden_size"]

    def rand(shape: tuple[int, ...], norm: bool) -> torch.Tensor:
        if norm:
            return torch.rand(shape, generator=g) * 0.4 + 0.8 - 1.0  # (1 + w) norms: weights near 0
        return torch.randn(shape, generator=g) * 0.08

    layer = f"model.layers.{FULL_LAYER}."
    for name, t in list(w.items()):
        if name.startswith(layer):
            w["mtp.layers.0." + name[len(layer) :]] = rand(tuple(t.shape), "norm" in name)
    fc = rand((h, 2 * h), False)
    fc[:, :h] += copy_bias * torch.eye(h)
    w["mtp.fc.weight"] = fc
    for n in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        w[f"mtp.{n}.weight"] = rand((h,), True)
    save_file(w, dst / "model.safetensors", metadata={"format": "pt"})
    return dst
