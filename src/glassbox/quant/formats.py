"""The one table of weight formats (torch-free): a row per format, read by the engine, the loader, the
planner and ``trace`` alike.

A row names a format once (``name``: the engine's ``--quantization``, the planner's ``--quant``, trace and
docs all say it so; ``aliases`` are other spellings accepted at the edges, as glassbox.dtypes does for
dtypes), says what it reads (a GGUF file's GGML ``ggml_types``, a checkpoint's ``quant_methods``), what it
stores (``bits_per_weight``, scales and zeros included) and where its code lives (``family``: the folder
quant/<family>/, and ``at_load``: the function that quantizes a built model into it, as "module:function",
imported only when used). Like llama.cpp's ``type_traits``: a new format is a row here and its folder.
"""

from __future__ import annotations

from dataclasses import dataclass

from glassbox.dtypes import canonical


@dataclass(frozen=True)
class WeightFormat:
    """One weight storage format."""

    name: str
    family: str  # its code: quant/<family>/ ("dense", "blocks", "fp8", "fp4")
    bits_per_weight: float  # everything stored per weight: values, block scales, zero points, mins
    # the matmul dtype of an engine with a native kernel for it (planner: "fp4" only where the engine and
    # chip have FP4 GEMMs; otherwise weights are widened)
    compute: str
    note: str
    aliases: tuple[str, ...] = ()  # other spellings accepted at the edges (flags)
    ggml_types: tuple[str, ...] = ()  # a GGUF file's tensors of these types stay in this format's blocks
    quant_methods: tuple[str, ...] = ()  # checkpoints whose quantization_config says this (quant/config.py)
    at_load: str | None = None  # "module:function" quantizing a built model into it (quant/at_load.py)
    # "module:function" reading a checkpoint of these quant_methods (quant/checkpoint.py; None for the
    # method, tried in the table's order), or None
    reader: str | None = None
    bits: int = 0  # integer blocks: the code bits (4, 8)
    asymmetric: bool = False  # integer blocks with a min per block (Q4_1's layout)
    gguf: bool = False  # a llama.cpp tensor type (the planner's GGUF engines store every tensor in it)
    # the share of an engine's weight-streaming bandwidth a decode kernel keeps for this format (1.0: plain
    # loads; K-quants spend ALU time unpacking 6-bit scales per super-block)
    decode_kernel_factor: float = 1.0
    triton: bool = True  # its GGUF tensors run CUDA's Triton kernels (else CUDA dequantizes them at load)

    @property
    def bytes_per_weight(self) -> float:
        return self.bits_per_weight / 8.0

    @property
    def is_16bit(self) -> bool:
        return self.bits_per_weight >= 16.0


_BLOCKS_AT_LOAD = "glassbox.quant.blocks.at_load:quantize_blocks"
_INT_READER = "glassbox.quant.blocks.checkpoint:read_checkpoint"  # GPTQ, AWQ, compressed-tensors integer
_FP4_READER = "glassbox.quant.fp4.checkpoint:read_checkpoint"  # ModelOpt NVFP4, gpt-oss MXFP4
_FP8_READER = "glassbox.quant.fp8.checkpoint:read_checkpoint"  # HF fp8, compressed-tensors float8

FORMATS: dict[str, WeightFormat] = {
    f.name: f
    for f in (
        WeightFormat("fp32", "dense", 32.0, "fp32", "IEEE float32", aliases=("float32", "f32")),
        WeightFormat("bf16", "dense", 16.0, "bf16", "bfloat16", aliases=("bfloat16",)),
        WeightFormat("fp16", "dense", 16.0, "fp16", "float16", aliases=("float16", "half", "f16")),
        WeightFormat(
            "q8_0", "blocks", 8.5, "int8", "GGUF Q8_0: 32 int8 + one fp16 scale = 34 bytes / 32 weights",
            aliases=("int8",), ggml_types=("Q8_0",), at_load=_BLOCKS_AT_LOAD, bits=8, gguf=True,
        ),
        WeightFormat(
            "q4_0", "blocks", 4.5, "int8", "GGUF Q4_0: 32 4-bit + one fp16 scale = 18 bytes / 32 weights",
            aliases=("int4",), ggml_types=("Q4_0",), at_load=_BLOCKS_AT_LOAD, bits=4, gguf=True,
        ),
        WeightFormat(
            "q4_1", "blocks", 5.0, "int8",
            "GGUF Q4_1: 32 4-bit + fp16 scale and min = 20 bytes / 32 weights (at load: token tables in q8_0)",
            aliases=("int4-asym",), ggml_types=("Q4_1",), at_load=_BLOCKS_AT_LOAD, bits=4, asymmetric=True,
            gguf=True,
        ),
        WeightFormat(
            "q5_0", "blocks", 5.5, "int8",
            "GGUF Q5_0: 32 5-bit + one fp16 scale = 22 bytes / 32 weights (Q4_K's fallback for rows not of 256)",
            ggml_types=("Q5_0",), bits=5, gguf=True, triton=False,
        ),
        WeightFormat(
            "q5_1", "blocks", 6.0, "int8",
            "GGUF Q5_1: 32 5-bit + fp16 scale and min = 24 bytes / 32 weights (Q5_K's fallback)",
            ggml_types=("Q5_1",), bits=5, asymmetric=True, gguf=True, triton=False,
        ),
        WeightFormat(
            "iq4_nl", "blocks", 4.5, "int8",
            "GGUF IQ4_NL: 32 4-bit indices into 16 non-linear int8 values + one fp16 scale = 18 bytes / 32",
            ggml_types=("IQ4_NL",), bits=4, gguf=True, triton=False,
        ),
        WeightFormat(
            "q4_k", "blocks", 4.5, "int8", "GGUF Q4_K: 256-value super-blocks of 8 x 32, 6-bit sub-scales",
            ggml_types=("Q4_K",), gguf=True, decode_kernel_factor=0.8,
        ),
        WeightFormat(
            "q5_k", "blocks", 5.5, "int8", "GGUF Q5_K: Q4_K's layout with a fifth bit per value",
            ggml_types=("Q5_K",), gguf=True, decode_kernel_factor=0.8,
        ),
        WeightFormat(
            "q6_k", "blocks", 6.5625, "int8", "GGUF Q6_K: 256-value super-blocks of 16 x 16, 8-bit sub-scales",
            ggml_types=("Q6_K",), gguf=True, decode_kernel_factor=0.8,
        ),
        WeightFormat(
            "iq4_xs", "blocks", 4.25, "int8",
            "GGUF IQ4_XS: 256-value super-blocks of 8 x 32 IQ4_NL indices, 6-bit sub-block scales",
            ggml_types=("IQ4_XS",), gguf=True, decode_kernel_factor=0.8, triton=False,
        ),
        WeightFormat(
            "q3_k", "blocks", 3.4375, "int8", "GGUF Q3_K: 256-value super-blocks of 16 x 16 3-bit, 6-bit scales",
            ggml_types=("Q3_K",), gguf=True, decode_kernel_factor=0.8, triton=False,
        ),
        WeightFormat(
            "q2_k", "blocks", 2.625, "int8",
            "GGUF Q2_K: 256-value super-blocks of 16 x 16 2-bit, 4-bit scales and mins",
            ggml_types=("Q2_K",), gguf=True, decode_kernel_factor=0.8, triton=False,
        ),
        WeightFormat(
            "q4_k_m", "blocks", 4.85, "int8",
            "GGUF's Q4_K_M file mix: Q4_K, with Q6_K for the output and half of attn_v/ffn_down (~4.85 bpw)",
            gguf=True, decode_kernel_factor=0.8,
        ),
        WeightFormat(
            "w4a16", "blocks", 4.0 + (16 + 4) / 128, "int4",
            "GPTQ / AWQ / compressed-tensors 4-bit: fp16 scale + 4-bit zero per 128 input channels",
            aliases=("awq", "gptq", "int4-g128"), quant_methods=("gptq", "awq", "compressed-tensors"), reader=_INT_READER,
        ),
        WeightFormat(
            "w8a16", "blocks", 8.0 + (16 + 8) / 128, "int8",
            "GPTQ / compressed-tensors 8-bit: fp16 scale + 8-bit zero per 128 input channels",
            quant_methods=("gptq", "compressed-tensors"), reader=_INT_READER,
        ),
        WeightFormat(
            "w8a8", "blocks", 8.0, "int8", "W8A8 int8 (compressed-tensors int-quantized): per-channel scales",
            quant_methods=("compressed-tensors",), reader=_INT_READER,
        ),
        WeightFormat(
            "nvfp4", "fp4", 4.0 + 8 / 16, "fp4", "E2M1 + FP8 scale per 16 values (+ a float32 tensor scale)",
            quant_methods=("modelopt", "compressed-tensors"), reader=_FP4_READER,
            at_load="glassbox.quant.fp4.linear:quantize_model_fp4",
        ),
        WeightFormat(
            "mxfp4", "fp4", 4.0 + 8 / 32, "fp4", "OCP MX: E2M1 + E8M0 scale per 32 values",
            ggml_types=("MXFP4",), quant_methods=("mxfp4",), reader=_FP4_READER,
            at_load="glassbox.quant.fp4.linear:quantize_model_fp4",
        ),
        WeightFormat(
            "fp8", "fp8", 8.0, "fp8", "E4M3 with per-channel or 128x128-block float32 scales (<0.01 bit/weight)",
            quant_methods=("fp8", "fbgemm_fp8", "modelopt", "compressed-tensors"),
            at_load="glassbox.quant.fp8.quantize:quantize_model_fp8", reader=_FP8_READER,
        ),
    )
}  # fmt: skip

_SPELLINGS = {alias: f.name for f in FORMATS.values() for alias in (f.name, *f.aliases)}


def find_format(name: str) -> WeightFormat | None:
    """The row a name or alias spells (case, "-" and "_" as the user likes), or None."""
    key = name.strip().lower()
    for candidate in (key, key.replace("-", "_"), key.replace("_", "-"), canonical(key)):
        if candidate in _SPELLINGS:
            return FORMATS[_SPELLINGS[candidate]]
    return None


def parse_format(name: str, flag: str, choices: tuple[str, ...]) -> WeightFormat:
    """The row ``name`` spells, one of ``choices`` (canonical names); ValueError naming ``flag`` otherwise."""
    fmt = find_format(name)
    if fmt is None or fmt.name not in choices:
        raise ValueError(f"{flag} must be one of {', '.join(choices)}, got {name!r}")
    return fmt


def at_load_formats() -> tuple[str, ...]:
    """The formats ``--quantization`` applies to a built model."""
    return tuple(f.name for f in FORMATS.values() if f.at_load is not None)


def kept_ggml_types(family: str | None = None, triton: bool = False) -> frozenset[str]:
    """The GGML types a GGUF file's tensors stay in (of one format family, or all; with ``triton``, only
    those CUDA's Triton kernels run)."""
    return frozenset(
        t
        for f in FORMATS.values()
        if family in (None, f.family) and (f.triton or not triton)
        for t in f.ggml_types
    )


def format_of_ggml(ggml_type: str) -> WeightFormat | None:
    """The row whose blocks a GGML type stays in, or None (dequantized at load)."""
    return next((f for f in FORMATS.values() if ggml_type in f.ggml_types), None)
