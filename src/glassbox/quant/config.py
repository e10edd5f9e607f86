"""A checkpoint's own weight formats, read from config.json's ``quantization_config`` (torch-free).

Format names are the rows of quant/formats.py ("fp8", "nvfp4", "mxfp4", "w4a16", ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NativeQuant:
    """A checkpoint's own weight formats, read from config.json's ``quantization_config``."""

    method: str
    experts: str  # format of routed experts (== main for dense models)
    main: str  # format of the other linear layers (attention, dense MLP, shared experts, Mamba)
    embed: str
    lm_head: str
    # GGUF: the bits per weight each group ("embed", "lm_head", "main", "experts") is stored in, measured
    # from the file's tensor types (its formats are then named by those types, e.g. "Q4_K+Q6_K")
    bits: tuple[tuple[str, float], ...] = ()

    def describe(self) -> str:
        if self.experts != self.main:
            return f"{self.method}: experts {self.experts}, rest {self.main}"
        return f"{self.method}: linear layers {self.main}, embed/lm_head {self.lm_head}"


def quant_method(qc: dict[str, Any] | None) -> str:
    """A ``quantization_config``'s method, lower-cased ("" for none): the one place it is read."""
    return str((qc or {}).get("quant_method", "")).lower()


def method_config(method: str, **settings: Any) -> dict[str, Any]:
    """A ``quantization_config`` of ``method`` with ``settings`` (a preset's, or a ModelOpt checkpoint's
    hf_quant_config.json "quantization" section: algorithm, group size, exclusions)."""
    return {"quant_method": method, **settings}


def unsupported_method(method: str, why: str) -> ValueError:
    """The error for a ``quant_method`` the loader does not read."""
    return ValueError(f"quantization_config quant_method={method!r}: {why}")


def _format_from_bits(bits: int, kind: str, activations: bool = False) -> str:
    """The format (quant/formats.py) of integer or float weights of ``bits`` (W8A8 where ``activations``
    are quantized too)."""
    if bits == 8:
        return "fp8" if kind == "float" else "w8a8" if activations else "w8a16"
    if bits == 4:
        return "nvfp4" if kind == "float" else "w4a16"
    return "bf16"


def native_quant_from_config(cfg: dict[str, Any], dtype: str) -> NativeQuant | None:
    """Parse ``quantization_config`` (HF, compressed-tensors, ModelOpt, AWQ/GPTQ); None when unquantized."""
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = quant_method(qc)
    if method == "mxfp4":  # gpt-oss: modules_to_not_convert = attention, router, embeddings, lm_head
        return NativeQuant("mxfp4", "mxfp4", dtype, dtype, dtype)
    if method in ("fp8", "fbgemm_fp8"):
        return NativeQuant(method, "fp8", "fp8", dtype, dtype)
    if method == "modelopt":
        algo = str(qc.get("quant_algo", "")).upper()
        fmt = "nvfp4" if "FP4" in algo else "fp8"
        return NativeQuant(f"modelopt {algo}", fmt, fmt, dtype, dtype)
    if method in ("awq", "gptq", "auto-round", "autoround"):
        fmt = _format_from_bits(int(qc.get("bits", 4)), "int")
        return NativeQuant(method, fmt, fmt, dtype, dtype)
    if method == "bitsandbytes":
        fmt = "w4a16" if qc.get("load_in_4bit") else "w8a16"
        return NativeQuant(method, fmt, fmt, dtype, dtype)
    if method == "compressed-tensors":
        fmt_name = str(qc.get("format", ""))
        if "nvfp4" in fmt_name:
            return NativeQuant(method, "nvfp4", "nvfp4", dtype, dtype)
        for group in (qc.get("config_groups") or {}).values():
            weights = group.get("weights") or {}
            kind, acts = str(weights.get("type", "int")), group.get("input_activations") is not None
            fmt = _format_from_bits(int(weights.get("num_bits", 16)), kind, acts)
            return NativeQuant(method, fmt, fmt, dtype, dtype)
    return None


@dataclass(frozen=True)
class GroupQuant:
    """GPTQ or AWQ weights as stored: ``bits``-bit integer codes, a float16 scale and an integer zero per
    group of ``group_size`` input channels (-1: one group over all of them)."""

    method: str  # "gptq" | "awq"
    bits: int
    group_size: int
    zero_minus_one: bool  # GPTQ's classic format (v1) stores each zero as z - 1

    @property
    def label(self) -> str:  # for logs and the trace: "GPTQ int4 g128"
        return f"{self.method.upper()} int{self.bits} g{self.group_size}"


def group_quant(qc: dict[str, Any]) -> GroupQuant | None:
    """The GPTQ/AWQ settings of a ``quantization_config`` (None for other methods); ValueError naming the
    key and value of a setting the loader cannot run."""
    method = quant_method(qc)
    if method not in ("gptq", "awq"):
        return None

    def unsupported(key: str, why: str) -> ValueError:
        return ValueError(f"quantization_config {key}={qc.get(key)!r}: {why}")

    bits_key = "bits" if "bits" in qc or "w_bit" not in qc else "w_bit"  # AutoAWQ's own names too
    group_key = "group_size" if "group_size" in qc or "q_group_size" not in qc else "q_group_size"
    bits, group = qc.get(bits_key, 4), qc.get(group_key, 128)
    if bits not in ((4, 8) if method == "gptq" else (4,)):
        raise unsupported(bits_key, f"{method.upper()} loads {'4 or 8' if method == 'gptq' else '4'} bits")
    if not isinstance(group, int) or not (group == -1 or (group > 0 and group % 32 == 0)):
        raise unsupported(group_key, "groups must be a multiple of 32 input channels (or -1: one group)")
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm":
            raise unsupported("version", "only AWQ's GEMM layout loads")
        if not qc.get("zero_point", True):
            raise unsupported("zero_point", "AWQ without zero points does not load")
        return GroupQuant("awq", bits, group, False)
    fmt = str(qc.get("checkpoint_format") or "gptq").lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise unsupported("checkpoint_format", "GPTQ loads the gptq and gptq_v2 formats")
    if qc.get("dynamic"):
        raise unsupported("dynamic", "per-module GPTQ settings do not load")
    return GroupQuant("gptq", bits, group, fmt == "gptq")


def gguf_group(name: str) -> str:
    """The parameter group ("embed", "lm_head", "experts", "main") of a Hugging Face tensor name."""
    if name.startswith("model.embed_tokens"):
        return "embed"
    if name.startswith("lm_head"):
        return "lm_head"
    if ".experts." in name:
        return "experts"
    return "main"


def gguf_native_quant(sizes: dict[str, tuple[int, int]], types: dict[str, str], tied: bool) -> NativeQuant:
    """A GGUF file's formats per group: named by its tensor types, sized by its stored bytes.

    ``sizes``: HF name -> (elements, stored bytes); ``types``: HF name -> GGML type. A tied lm_head is the
    embedding table."""
    elements: dict[str, int] = {}
    stored: dict[str, int] = {}
    kinds: dict[str, dict[str, int]] = {}
    for name, (n, nbytes) in sizes.items():
        if not name.endswith(".weight") or "norm" in name:
            continue  # norms and biases: a rounding error next to the matrices
        g = gguf_group(name)
        elements[g] = elements.get(g, 0) + n
        stored[g] = stored.get(g, 0) + nbytes
        kinds.setdefault(g, {})
        kinds[g][types[name]] = kinds[g].get(types[name], 0) + n
    # a tied (or absent) lm_head is the embedding table; a dense model's "experts" are its linear layers
    fallback = {"lm_head": "embed", "experts": "main"}
    for g, src in fallback.items():
        if g not in elements or (g == "lm_head" and tied):
            elements[g], stored[g], kinds[g] = elements[src], stored[src], kinds[src]

    def label(g: str) -> str:  # the group's types, most weights first
        return "+".join(sorted(kinds[g], key=lambda t: -kinds[g][t]))

    groups = ("embed", "lm_head", "main", "experts")
    bits = tuple((g, 8.0 * stored[g] / elements[g]) for g in groups)
    return NativeQuant("gguf", label("experts"), label("main"), label("embed"), label("lm_head"), bits)
