"""compressed-tensors integer weight checkpoints: their ``quantization_config`` read and checked (torch-free;
quant/blocks/ct_int.py reads the tensors and says what the formats are)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glassbox.quant.config import quant_method

FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")


@dataclass(frozen=True)
class CtIntSpec:
    """A compressed-tensors integer checkpoint's settings: the widths and group sizes its layers may take
    (each layer's own are read from its shapes) and what weight-only execution leaves aside."""

    bits: tuple[int, ...]
    group_sizes: tuple[int, ...]  # of "group" strategies
    left_aside: tuple[str, ...] = ()


def _unsupported(key: str, value: Any, why: str) -> ValueError:
    return ValueError(f"quantization_config {key}={value!r}: {why}")


def is_int_config(qc: dict[str, Any]) -> bool:
    """Whether a compressed-tensors ``quantization_config`` quantizes weights to integers in every group (the
    checkpoints this module reads; float groups are FP8's, quant/fp8/config.py, or FP4's)."""
    if quant_method(qc) != "compressed-tensors":
        return False
    groups = qc.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        return False
    kinds = [str(((g or {}).get("weights") or {}).get("type", "")) for g in groups.values()]
    return all(k == "int" for k in kinds)


def ct_int_spec(qc: dict[str, Any]) -> CtIntSpec | None:
    """The settings of a compressed-tensors integer ``quantization_config`` (None for other methods and
    float formats); ValueError naming the key and value of a setting the loader cannot run."""
    if not is_int_config(qc):
        return None
    if qc.get("transform_config"):
        raise _unsupported(
            "transform_config", qc["transform_config"], "transforms (rotations) are not applied"
        )
    sparsity = qc.get("sparsity_config") or {}
    if sparsity and str(sparsity.get("format", "dense")) != "dense":
        raise _unsupported("sparsity_config.format", sparsity.get("format"), "sparse weights do not load")
    fmt = str(qc.get("format") or "")
    bits: set[int] = set()
    sizes: set[int] = set()
    aside: list[str] = []
    for name, group in qc["config_groups"].items():
        key = f"config_groups.{name}"
        gfmt = str(group.get("format") or fmt)
        if gfmt not in FORMATS:
            where = f"{key}.format" if group.get("format") else "format"
            raise _unsupported(
                where, gfmt or None, f"integer weights load from the {', '.join(FORMATS)} formats"
            )
        w = group["weights"]
        nb = w.get("num_bits")
        if nb not in ((4, 8) if gfmt == "pack-quantized" else (8,)):
            raise _unsupported(f"{key}.weights.num_bits", nb, "integer weights load in 4 bits (packed) or 8")
        if w.get("dynamic"):
            raise _unsupported(f"{key}.weights.dynamic", w.get("dynamic"), "weights quantized at run time "
                               "do not load")  # fmt: skip
        strategy = str(w.get("strategy"))
        if strategy not in ("group", "channel", "tensor"):
            raise _unsupported(f"{key}.weights.strategy", w.get("strategy"), "integer weights load per "
                               "group, channel or tensor")  # fmt: skip
        if strategy == "group":
            size = w.get("group_size")
            if not isinstance(size, int) or size <= 0 or size % 32:
                raise _unsupported(f"{key}.weights.group_size", size, "groups must be a multiple of 32 "
                                   "input channels")  # fmt: skip
            sizes.add(size)
        if group.get("output_activations"):
            raise _unsupported(f"{key}.output_activations", group["output_activations"], "output "
                               "quantization does not load")  # fmt: skip
        act = group.get("input_activations")
        if act:
            kind = "dynamic" if act.get("dynamic") else "static"
            aside.append(f"{kind} int{act.get('num_bits')} activation quantization ({key}.input_activations)")
        bits.add(int(nb))
    if qc.get("kv_cache_scheme"):
        aside.append("the KV-cache scheme (kv_cache_scheme; --kv-cache-dtype chooses the cache)")
    return CtIntSpec(tuple(sorted(bits)), tuple(sorted(sizes)), tuple(aside))
