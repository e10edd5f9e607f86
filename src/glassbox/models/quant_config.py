"""A checkpoint's own weight formats, read from config.json's ``quantization_config`` (torch-free).

Format names are those of perf/quant.py's FORMATS ("fp8", "nvfp4", "mxfp4", "int4", ...).
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

    def describe(self) -> str:
        if self.experts != self.main:
            return f"{self.method}: experts {self.experts}, rest {self.main}"
        return f"{self.method}: linear layers {self.main}, embed/lm_head {self.lm_head}"


def _format_from_bits(bits: int, kind: str) -> str:
    if bits == 8:
        return "fp8" if kind == "float" else "int8"
    if bits == 4:
        return "nvfp4" if kind == "float" else "int4"
    return "bf16"


def native_quant_from_config(cfg: dict[str, Any], dtype: str) -> NativeQuant | None:
    """Parse ``quantization_config`` (HF, compressed-tensors, ModelOpt, AWQ/GPTQ); None when unquantized."""
    qc = cfg.get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method", "")).lower()
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
        fmt = "int4" if qc.get("load_in_4bit") else "int8"
        return NativeQuant(method, fmt, fmt, dtype, dtype)
    if method == "compressed-tensors":
        fmt_name = str(qc.get("format", ""))
        if "nvfp4" in fmt_name:
            return NativeQuant(method, "nvfp4", "nvfp4", dtype, dtype)
        for group in (qc.get("config_groups") or {}).values():
            weights = group.get("weights") or {}
            fmt = _format_from_bits(int(weights.get("num_bits", 16)), str(weights.get("type", "int")))
            return NativeQuant(method, fmt, fmt, dtype, dtype)
    return None
