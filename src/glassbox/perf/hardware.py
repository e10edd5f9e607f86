"""Hardware: datasheet presets, and ``local``: this machine as the probe measured it (perf/probe.py).

All FLOP/s figures are *dense* (sparse datasheet peaks are 2x); bandwidth is decimal GB/s (1e9 B/s).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

GIB = 1024**3

# Compute dtypes an engine may ask for, with the dtype to fall back to when a chip lacks the path.
_FALLBACK = {
    "fp4": "fp8",
    "int4": "bf16",
    "fp8": "bf16",
    "int8": "fp8",
    "fp16": "bf16",
    "bf16": "fp32",
    "fp32": "",
}
# A probe that measured only fp32 serves bf16 requests from fp32 (CPU); fp32 never falls further.


@dataclass(frozen=True)
class HardwareSpec:
    """One machine: memory (GiB), bandwidth (GB/s) and dense tensor TFLOP/s per dtype."""

    name: str
    memory_gib: float
    bandwidth_gbs: float
    tflops: dict[str, float]  # dense TFLOP/s: keys among bf16, fp16, fp32, fp8, int8, fp4
    unified_memory: bool
    fp4_engine_support: bool = False  # serving engines ship native FP4 GEMMs for this chip
    source: str = ""
    measured: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s for a compute dtype, falling back to the next wider dtype the chip has."""
        key, seen = dtype, set()
        while key and key not in seen:
            if key in self.tflops:
                return self.tflops[key] * 1e12
            seen.add(key)
            key = _FALLBACK.get(key, "bf16")
        raise ValueError(f"hardware {self.name!r} has no FLOP/s figure for {dtype!r}")

    def has(self, dtype: str) -> bool:
        return dtype in self.tflops

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.bandwidth_gbs * 1e9

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * GIB


PRESETS: dict[str, HardwareSpec] = {
    h.name: h
    for h in (
        HardwareSpec(
            "dgx-spark",
            119.7,
            273.0,
            {"fp4": 500.0, "fp8": 250.0, "int8": 250.0, "bf16": 125.0, "fp16": 125.0, "fp32": 31.0},
            True,
            True,
            "NVIDIA DGX Spark (GB10, sm_121): 128 GB LPDDR5X unified (CUDA sees 119.7 GiB), 273 GB/s; "
            "1 PFLOP FP4 is sparse -> 500 dense, halving per wider dtype; ~31 TFLOP/s FP32 (Hot Chips 2025). "
            "FP4 GEMMs ship for sm_121 (vLLM picks FlashInfer-CUTLASS for NVFP4 linears, "
            "github.com/NVIDIA/dgx-spark-playbooks/pull/91; TensorRT-LLM); MoE experts and GGUF engines "
            "widen 4-bit weights (Marlin, ggml MMQ): per engine profile.",
        ),
        HardwareSpec(
            "h100-sxm",
            79.6,
            3350.0,
            {"fp8": 1979.0, "int8": 1979.0, "bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
            False,
            False,
            "NVIDIA H100 SXM5 datasheet: 80 GB HBM3, 3.35 TB/s, 989 BF16 / 1979 FP8 dense",
        ),
        HardwareSpec(
            "h100-pcie",
            79.6,
            2000.0,
            {"fp8": 1513.0, "int8": 1513.0, "bf16": 756.0, "fp16": 756.0, "fp32": 51.0},
            False,
            False,
            "NVIDIA H100 PCIe datasheet: 80 GB HBM2e, 2.0 TB/s, 756 BF16 / 1513 FP8 dense",
        ),
        HardwareSpec(
            "h200",
            139.8,
            4800.0,
            {"fp8": 1979.0, "int8": 1979.0, "bf16": 989.0, "fp16": 989.0, "fp32": 67.0},
            False,
            False,
            "NVIDIA H200 SXM datasheet: 141 GB HBM3e, 4.8 TB/s, 989 BF16 / 1979 FP8 dense",
        ),
        HardwareSpec(
            "b200",
            178.0,
            8000.0,
            {"fp4": 9000.0, "fp8": 4500.0, "int8": 4500.0, "bf16": 2250.0, "fp16": 2250.0, "fp32": 80.0},
            False,
            True,
            "NVIDIA HGX B200 (per GPU): ~180 GB HBM3e, ~8 TB/s, 2.25 PF BF16 / 4.5 FP8 / 9 FP4 dense",
        ),
        HardwareSpec(
            "a100-80g",
            79.2,
            2039.0,
            {"int8": 624.0, "bf16": 312.0, "fp16": 312.0, "fp32": 19.5},
            False,
            False,
            "NVIDIA A100 80GB SXM datasheet: 2,039 GB/s, 312 BF16 / 624 INT8 dense; no FP8",
        ),
        HardwareSpec(
            "rtx-4090",
            23.99,
            1008.0,
            {"fp8": 330.3, "int8": 660.6, "bf16": 165.2, "fp16": 165.2, "fp32": 82.6},
            False,
            False,
            "NVIDIA Ada whitepaper (RTX 4090): 24 GB GDDR6X, 1,008 GB/s, 165 BF16 (FP32 accum) dense",
        ),
        HardwareSpec(
            "rtx-5090",
            31.8,
            1792.0,
            {"fp4": 1676.0, "fp8": 419.0, "int8": 838.0, "bf16": 209.5, "fp16": 209.5, "fp32": 104.8},
            False,
            False,
            "NVIDIA Blackwell whitepaper (RTX 5090): 32 GB GDDR7, 1,792 GB/s, ~210 BF16 (FP32 accum)",
        ),
        HardwareSpec(
            "m4-max",
            128.0,
            546.0,
            {"bf16": 17.0, "fp16": 17.0, "fp32": 17.0},
            True,
            False,
            "Apple M4 Max (40-core GPU): up to 128 GB unified, 546 GB/s; ~17 TFLOP/s FP32/FP16 GPU",
        ),
        HardwareSpec(
            "strix-halo",
            128.0,
            256.0,
            {"int8": 59.4, "bf16": 59.4, "fp16": 59.4, "fp32": 29.7},
            True,
            False,
            "AMD Ryzen AI Max+ 395: 128 GB LPDDR5X-8000 (256-bit) = 256 GB/s; Radeon 8060S 40 CU "
            "~59 TFLOP/s FP16/BF16 (WMMA), 29.7 FP32",
        ),
    )
}

HARDWARE_CHOICES = (*PRESETS, "local")


def cpu_name() -> str:
    """The CPU's model name as Linux reports it (the machine type elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def spec_to_dict(spec: HardwareSpec) -> dict[str, Any]:
    """JSON-ready dict of a spec."""
    return asdict(spec)
