"""A Hugging Face checkpoint's quantized layers read in their own formats: the rows of quant/formats.py
whose ``quant_methods`` hold the checkpoint's method (quant/config.py reads it) name their readers
(``reader``), tried in the table's order until one takes the checkpoint."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from glassbox.quant.config import quant_method
from glassbox.quant.formats import FORMATS
from glassbox.quant.kept import Kept, Tensors

Reader = Callable[
    [Path, dict[str, Any], torch.device, torch.dtype, bool], tuple[Tensors, dict[str, Kept]] | None
]


def read_kept(
    path: Path, qc: dict[str, Any], device: torch.device, dtype: torch.dtype, cpu: bool
) -> tuple[Tensors, dict[str, Kept]] | None:
    """(the float tensors, the layers kept in their format by HF name) of a quantized checkpoint, or None
    for an unquantized one (or a method no row reads: its tensors then load as floats where they can).
    GPTQ/AWQ, compressed-tensors integer, NVFP4 and MXFP4 layers always stay in their format (ValueError
    where no kernels run them on ``device`` in ``dtype``, or for settings the loader cannot run); FP8's stay
    8-bit on any device and dtype. ``cpu``: laid out for the CPU's kernels (else for CUDA's)."""
    method = quant_method(qc)
    if not method:
        return None
    readers = dict.fromkeys(f.reader for f in FORMATS.values() if f.reader and method in f.quant_methods)
    for ref in readers:
        assert ref is not None
        module, _, function = ref.partition(":")
        read: Reader = getattr(importlib.import_module(module), function)
        result = read(path, qc, device, dtype, cpu)
        if result is not None:
            return result
    return None
