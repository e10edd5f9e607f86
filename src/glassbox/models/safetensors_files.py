"""A Hugging Face checkpoint's safetensors files: which they are (an index's shards, one file, or every
``*.safetensors``) and their tensors one at a time. The readers of every format start here."""

from __future__ import annotations

import json
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from pathlib import Path

import torch
from safetensors import safe_open


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files of a checkpoint: the index's shards, or the single model.safetensors."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [model_dir / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"weight shards missing in {model_dir}: {', '.join(missing)}")
        return files
    single = model_dir / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(model_dir.glob("*.safetensors"))
    if found:
        return found
    raise FileNotFoundError(f"no *.safetensors weights found in model directory {model_dir}")


def safetensors_tensors(
    model_dir: Path, skip: AbstractSet[str] = frozenset()
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in a directory's safetensors files but those in ``skip`` (the ones
    a quantized checkpoint's reader took), one at a time."""
    for path in weight_files(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name not in skip:
                    yield name, f.get_tensor(name)
