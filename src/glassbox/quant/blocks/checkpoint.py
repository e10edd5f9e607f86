"""Integer checkpoints read into blocks: GPTQ and AWQ (quant/blocks/gptq_awq.py) and compressed-tensors
integer weights (quant/blocks/ct_int.py), as their ``quantization_config`` says (quant/config.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from glassbox.quant.blocks.ct_int import read_ct_int
from glassbox.quant.blocks.ct_int_config import ct_int_spec
from glassbox.quant.blocks.gptq_awq import check_runs, read_group_quant
from glassbox.quant.config import group_quant
from glassbox.quant.kept import Kept, Tensors


def read_checkpoint(
    path: Path, qc: dict[str, Any], device: torch.device, dtype: torch.dtype, cpu: bool
) -> tuple[Tensors, dict[str, Kept]] | None:
    """(the float tensors, the layers repacked into blocks by HF name), or None for a checkpoint of
    another method; ValueError where no kernels run them on ``device`` in ``dtype``."""
    spec = group_quant(qc)
    if spec is not None:
        check_runs(spec.method.upper(), device, dtype)
        layers, rest = read_group_quant(path, spec, cpu)
        return rest, dict(layers)
    ct = ct_int_spec(qc)
    if ct is not None:
        check_runs("compressed-tensors integer", device, dtype)
        layers, rest = read_ct_int(path, ct, cpu)
        return rest, dict(layers)
    return None
