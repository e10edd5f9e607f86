"""How a model's weights map onto weight formats (the one table: quant/formats.py) for the planner.

A *format* is one storage type (``q4_k_m``, ``nvfp4``), a row of that table. A *scheme* says which format each parameter
group of a model uses: a uniform ``--quant fp8`` keeps embeddings and ``lm_head`` at 16 bits (as FP8 /
NVFP4 / INT4 checkpoints do), a GGUF format covers every tensor, and a model's native mix (gpt-oss:
routed experts MXFP4, the rest BF16) is read from its ``quantization_config``.
"""

from __future__ import annotations

from dataclasses import dataclass

from glassbox.quant.config import NativeQuant
from glassbox.quant.formats import FORMATS, WeightFormat, find_format

# Parameter groups of a model (see models/facts.py ModelFacts.params).
GROUPS = ("embed", "lm_head", "attention", "mlp", "experts", "moe_shared", "mamba", "norms")


QUANT_CHOICES = ("native", *FORMATS)


def get_format(name: str) -> WeightFormat:
    """Look up a format by its name or an alias (awq, int4, ...); ValueError naming ``--quant`` and the
    allowed values."""
    fmt = find_format(name)
    if fmt is None:
        raise ValueError(f"--quant must be one of {', '.join(QUANT_CHOICES)}, got {name!r}")
    return fmt


def file_format(types: str, bits: float) -> WeightFormat:
    """The format of a group of GGUF tensors: named by their GGML types ("Q4_K+Q6_K"), sized by the bits
    per weight the file stores them in; float types are the float formats."""
    floats = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}
    if types in floats:
        return FORMATS[floats[types]]
    k_quant = "_K" in types  # k-quants unpack 6-bit sub-block scales per super-block (see q4_k_m)
    return WeightFormat(
        types.lower(), "blocks", bits, "int8", "as stored in the GGUF file", gguf=True,
        decode_kernel_factor=0.8 if k_quant else 1.0,
    )  # fmt: skip


@dataclass(frozen=True)
class QuantScheme:
    """Which format each parameter group is stored in."""

    label: str
    embed: WeightFormat
    lm_head: WeightFormat
    main: WeightFormat  # attention, dense MLP, shared experts, Mamba mixers, norms
    experts: WeightFormat

    def format_for(self, group: str) -> WeightFormat:
        if group == "embed":
            return self.embed
        if group == "lm_head":
            return self.lm_head
        if group == "experts":
            return self.experts
        return self.main

    def describe(self) -> dict[str, str]:
        return {g: self.format_for(g).name for g in ("experts", "main", "embed", "lm_head")}


def resolve_scheme(
    quant: str, native: NativeQuant | None, dtype: str, gguf_engine: bool, mixed_rest_format: str | None
) -> QuantScheme:
    """Map ``--quant`` onto a model's parameter groups.

    - ``native``: the checkpoint as published (its quantization_config, else its dtype).
    - the native format's own name (``--quant mxfp4`` on gpt-oss): the native mix; a GGUF engine whose
      files store the 16-bit rest differently (``mixed_rest_format``, llama.cpp: q8_0) uses that.
    - a GGUF format: every tensor in it (its bits/weight already averages the Q6_K output layer).
    - any other format: linear layers in it; embeddings and lm_head stay at the model dtype.
    """
    base = FORMATS[dtype]
    fmt_name = "native" if quant.lower() == "native" else get_format(quant).name
    if native is not None and native.bits and fmt_name == "native":  # a GGUF file, as stored
        bits = dict(native.bits)
        f = {g: file_format(getattr(native, g), bits[g]) for g in ("embed", "lm_head", "main", "experts")}
        return QuantScheme(native.describe(), f["embed"], f["lm_head"], f["main"], f["experts"])
    if native is not None and fmt_name in ("native", native.experts):
        main = FORMATS[native.main]
        embed, lm_head = FORMATS[native.embed], FORMATS[native.lm_head]
        label = native.describe()
        if gguf_engine and mixed_rest_format and main.is_16bit:
            main = embed = lm_head = FORMATS[mixed_rest_format]
            label += f" (GGUF: rest {mixed_rest_format})"
        return QuantScheme(label, embed, lm_head, main, FORMATS[native.experts])
    if fmt_name == "native":
        return QuantScheme(f"{dtype} (checkpoint dtype)", base, base, base, base)
    fmt = FORMATS[fmt_name]
    if fmt.gguf or fmt.is_16bit:
        return QuantScheme(f"{fmt.name} (all tensors)", fmt, fmt, fmt, fmt)
    return QuantScheme(f"{fmt.name} (embed/lm_head {dtype})", base, base, fmt, fmt)
