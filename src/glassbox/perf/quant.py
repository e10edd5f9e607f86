"""Weight formats (bits per weight, scales included) and how a model's weights map onto them.

A *format* is one storage type (``q4_k_m``, ``nvfp4``). A *scheme* says which format each parameter
group of a model uses: a uniform ``--quant fp8`` keeps embeddings and ``lm_head`` at 16 bits (as FP8 /
NVFP4 / INT4 checkpoints do), a GGUF format covers every tensor, and a model's native mix (gpt-oss:
routed experts MXFP4, the rest BF16) is read from its ``quantization_config``.
"""

from __future__ import annotations

from dataclasses import dataclass

from glassbox.dtypes import canonical
from glassbox.quant.config import NativeQuant

# Parameter groups of a model (see models/facts.py ModelFacts.params).
GROUPS = ("embed", "lm_head", "attention", "mlp", "experts", "moe_shared", "mamba", "norms")


@dataclass(frozen=True)
class QuantFormat:
    """One weight storage format.

    ``bits_per_weight`` averages everything stored per weight (values + block scales + zero points).
    ``compute`` is the matmul dtype an engine uses when it has a native kernel for the format
    ("fp4" for NVFP4/MXFP4 only where the engine and chip support it; otherwise weights are widened).
    ``decode_kernel_factor`` is the share of an engine's weight-streaming bandwidth a decode kernel keeps
    for this format (1.0 = plain loads; k-quants spend ALU time unpacking 6-bit scales per super-block).
    """

    name: str
    bits_per_weight: float
    compute: str  # "bf16" | "fp16" | "fp32" | "fp8" | "int8" | "fp4" | "int4"
    gguf: bool  # a llama.cpp (GGUF) tensor type
    decode_kernel_factor: float
    note: str

    @property
    def bytes_per_weight(self) -> float:
        return self.bits_per_weight / 8.0

    @property
    def is_16bit(self) -> bool:
        return self.bits_per_weight >= 16.0


FORMATS: dict[str, QuantFormat] = {
    f.name: f
    for f in (
        QuantFormat("fp32", 32.0, "fp32", False, 1.0, "IEEE float32"),
        QuantFormat("bf16", 16.0, "bf16", False, 1.0, "bfloat16"),
        QuantFormat("fp16", 16.0, "fp16", False, 1.0, "float16"),
        QuantFormat("fp8", 8.0, "fp8", False, 1.0, "E4M3 with per-channel/block scales (<0.01 bit/weight)"),
        QuantFormat("int8", 8.0, "int8", False, 1.0, "W8A8 int8, per-channel scales"),
        QuantFormat("q8_0", 8.5, "int8", True, 1.0, "GGUF: 32 int8 + one fp16 scale = 34 bytes / 32 weights"),
        QuantFormat(
            "q4_0", 4.5, "int8", True, 1.0, "GGUF: 32 4-bit + one fp16 scale = 18 bytes / 32 weights"
        ),
        QuantFormat(
            "q4_1", 5.0, "int8", True, 1.0, "GGUF: 32 4-bit + fp16 scale and min = 20 bytes / 32 weights"
        ),
        QuantFormat(
            "q4_k_m",
            4.85,
            "int8",
            True,
            0.8,
            "GGUF Q4_K (4.5 bpw) with Q6_K (6.56 bpw) for output, half of attn_v/ffn_down: ~4.85 bpw overall",
        ),
        QuantFormat(
            "int4", 4.0 + (16 + 4) / 128, "int4", False, 1.0, "AWQ/GPTQ 4-bit, fp16 scale + 4-bit zero / 128"
        ),
        QuantFormat(
            "nvfp4", 4.0 + 8 / 16, "fp4", False, 1.0, "E2M1 + FP8 scale per 16 values (+ tensor scale)"
        ),
        QuantFormat("mxfp4", 4.0 + 8 / 32, "fp4", False, 1.0, "OCP MX: E2M1 + E8M0 scale per 32 values"),
    )
}

QUANT_CHOICES = ("native", *FORMATS)


def get_format(name: str) -> QuantFormat:
    """Look up a format by name; raises ValueError naming ``--quant`` and the allowed values."""
    key = canonical(name.replace("-", "_"))
    key = {"awq": "int4", "gptq": "int4"}.get(key, key)
    if key not in FORMATS:
        raise ValueError(f"--quant must be one of {', '.join(QUANT_CHOICES)}, got {name!r}")
    return FORMATS[key]


def file_format(types: str, bits: float) -> QuantFormat:
    """The format of a group of GGUF tensors: named by their GGML types ("Q4_K+Q6_K"), sized by the bits
    per weight the file stores them in; float types are the float formats."""
    floats = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}
    if types in floats:
        return FORMATS[floats[types]]
    k_quant = "_K" in types  # k-quants unpack 6-bit sub-block scales per super-block (see q4_k_m)
    return QuantFormat(
        types.lower(), bits, "int8", True, 0.8 if k_quant else 1.0, "as stored in the GGUF file"
    )


@dataclass(frozen=True)
class QuantScheme:
    """Which format each parameter group is stored in."""

    label: str
    embed: QuantFormat
    lm_head: QuantFormat
    main: QuantFormat  # attention, dense MLP, shared experts, Mamba mixers, norms
    experts: QuantFormat

    def format_for(self, group: str) -> QuantFormat:
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
