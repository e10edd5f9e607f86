"""A Hugging Face checkpoint's quantized layers read in their own formats, as its ``quantization_config``
says (quant/config.py reads it): NVFP4 / MXFP4 (quant/fp4/checkpoint.py), GPTQ and AWQ and
compressed-tensors integer codes repacked into blocks (quant/blocks/), FP8 kept 8-bit (quant/fp8/)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from glassbox.quant.blocks.ct_int import read_ct_int
from glassbox.quant.blocks.ct_int_config import ct_int_spec
from glassbox.quant.blocks.gptq_awq import check_runs, read_group_quant
from glassbox.quant.config import group_quant
from glassbox.quant.fp4.checkpoint import read_fp4
from glassbox.quant.fp8.checkpoint import read_fp8
from glassbox.quant.fp8.config import fp8_spec
from glassbox.quant.kept import Kept

Tensors = Iterator[tuple[str, torch.Tensor]]  # (HF name, tensor), one at a time


def read_kept(
    path: Path, qc: dict[str, Any], device: torch.device, dtype: torch.dtype, cpu: bool
) -> tuple[Tensors, dict[str, Kept]] | None:
    """(the float tensors, the layers kept in their format by HF name) of a quantized checkpoint, or None
    for an unquantized one. GPTQ/AWQ, compressed-tensors integer, NVFP4 and MXFP4 layers always stay in
    their format (ValueError where no kernels run them on ``device`` in ``dtype``: gptq_awq.check_runs,
    fp4/checkpoint.py; or for settings the loader cannot run); FP8's stay 8-bit on any device and dtype.
    ``cpu``: laid out for the CPU's kernels (else for CUDA's)."""
    fp4 = read_fp4(path, qc, device, dtype)
    if fp4 is not None:
        return fp4[1], dict(fp4[0])
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
    fp8 = fp8_spec(qc)
    if fp8 is not None:
        fp8_layers, rest = read_fp8(path, fp8, cpu)
        return rest, dict(fp8_layers)
    return None
