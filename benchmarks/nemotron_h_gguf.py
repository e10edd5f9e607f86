"""glassbox and llama.cpp on one Nemotron-H-shaped GGUF (llama.cpp's ``nemotron_h_moe``), batch 1, in turns.

The file: Nemotron 3 Nano 30B-A3B's widths (hidden 2688, vocabulary 131072; Mamba-2 64 heads of 64, 8
groups, state 128, conv 4, chunks of 128; attention 32 heads / 2 KV heads of 128; routed experts of 1856
(ReLU^2, no gate), top 6, a shared expert of 3712), random weights (normal, std 0.02), cut to the pattern
``--pattern`` (default ``MEMEM*E``: 3 Mamba-2, 3 MoE, 1 attention layer, as the published model begins) and
``--experts`` routed experts. The Hugging Face tensors (names and shapes from transformers' own
NemotronHForCausalLM, built on the meta device) go through the converter's transforms and llama.cpp's
names (tests/helpers/nemotron_gguf_factory.py, the house's copy of convert_hf_to_gguf.py's NemotronHModel),
written bf16 (F32 where the converter keeps F32); Q8_0 / Q4_0 by llama.cpp's own quantizer.

Per file, ``--rounds`` rounds of: a fresh ``--prompt-tokens`` prompt of random ids prefilled at batch 1, then
``--decode-tokens`` greedy steps; glassbox first, then llama.cpp (benchmarks/gguf_compare.speed).

    .venv/bin/python benchmarks/nemotron_h_gguf.py [--pattern MEMEM*E] [--experts 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "helpers"))
import gguf_compare  # noqa: E402
from gguf_compare import speed  # noqa: E402
from llamacpp_peer import llamacpp_version  # noqa: E402
from moe_gguf import quantize_gguf  # noqa: E402
from nemotron_gguf_factory import _add_metadata, converted_tensors, stored_type  # noqa: E402

from glassbox.perf.hardware import cpu_name  # noqa: E402

RESULTS = HERE / "results"
NANO = dict(
    hidden_size=2688, vocab_size=131072, num_attention_heads=32, num_key_value_heads=2, head_dim=128,
    mamba_num_heads=64, mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4, chunk_size=128,
    moe_intermediate_size=1856, moe_shared_expert_intermediate_size=3712, num_experts_per_tok=6,
    n_shared_experts=1, n_group=1, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
    intermediate_size=1856, layer_norm_epsilon=1e-5, mlp_hidden_act="relu2", max_position_embeddings=4096,
)  # fmt: skip


def _config(pattern: str, experts: int) -> dict[str, Any]:
    return NANO | {
        "hybrid_override_pattern": pattern,
        "num_hidden_layers": len(pattern),
        "n_routed_experts": experts,
    }


def _random(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """float32 values: 0.02-normal weights; near-1 norms; Nemotron-like A_log, dt_bias, D."""
    if name.endswith("A_log"):
        return np.log(rng.uniform(1, 16, shape)).astype(np.float32)
    if name.endswith(("dt_bias", ".D")):
        return rng.standard_normal(shape, dtype=np.float32)
    if len(shape) == 1:
        return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
    if "conv1d" in name:
        return (0.3 * rng.standard_normal(shape)).astype(np.float32)
    return (0.02 * rng.standard_normal(shape)).astype(np.float32)


def write_shaped_gguf(out: Path, pattern: str, experts: int) -> Path:
    """The bf16 Nemotron-H-shaped file (kept when already there)."""
    if out.is_file():
        return out
    import transformers as tf

    cfg = _config(pattern, experts)
    with torch.device("meta"):
        shapes = {
            k: tuple(v.shape)
            for k, v in tf.NemotronHForCausalLM(tf.NemotronHConfig(**cfg)).state_dict().items()
        }
    rng = np.random.default_rng(0)
    state: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():  # as a checkpoint names them: backbone.*, one tensor per expert
        saved = "backbone." + name[len("model.") :] if name.startswith("model.") else name
        if saved.endswith(("experts.up_proj", "experts.down_proj")):
            for e, values in enumerate(_random(saved, shape, rng)):  # (E, out, in)
                stem, proj = saved.rsplit(".", 1)
                state[f"{stem}.{e}.{proj}.weight"] = values
            continue
        state[saved] = _random(saved, shape, rng)
    arch = gguf.MODEL_ARCH.NEMOTRON_H_MOE
    tmp = out.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), gguf.MODEL_ARCH_NAMES[arch])
    w.add_name("nemotron-h-shaped-random")
    _add_metadata(w, cfg, pattern, True)
    # placeholder vocabulary (llama.cpp's BPE loader needs one merge whose halves are tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(["a", "b", "ab", *(f"t{i}" for i in range(3, cfg["vocab_size"]))])
    w.add_token_types([1] * cfg["vocab_size"])
    w.add_token_merges(["a b"])
    w.add_eos_token_id(0)
    names = gguf.get_tensor_name_map(arch, len(pattern))
    for hf, values in converted_tensors(state, cfg):
        mapped = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert mapped is not None, f"gguf has no name for {hf}"
        if stored_type(hf, values, gguf.GGMLQuantizationType.BF16) == gguf.GGMLQuantizationType.F32:
            w.add_tensor(mapped, np.ascontiguousarray(values))
        else:
            bf16 = torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16).view(torch.int16).numpy()
            w.add_tensor(mapped, bf16, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--pattern", default="MEMEM*E")
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--types", default="BF16,Q4_0")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/nemotron-h-bench"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--llamacpp-no-amx", action="store_true", help="llama.cpp in child processes, AMX denied")
    if sys.argv[1:] == ["--peer-worker"]:
        return gguf_compare.peer_worker()
    args = ap.parse_args()
    gguf_compare._PEER["no_amx"] = args.llamacpp_no_amx
    args.dir.mkdir(parents=True, exist_ok=True)
    tag = args.pattern.replace("*", "A")
    bf16 = write_shaped_gguf(
        args.dir / f"nemotron-h-{tag}-{args.experts}e-bf16.gguf", args.pattern, args.experts
    )
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "peer": llamacpp_version(),
        "threads": 2,
        "shape": {"pattern": args.pattern, "experts": args.experts, **_config(args.pattern, args.experts)},
        "files": {},
    }  # fmt: skip
    out = args.out or RESULTS / f"nemotron-h-gguf-{time.strftime('%Y-%m-%d')}.json"
    if out.is_file():  # a run of other types adds to the file
        result["files"] = json.loads(out.read_text())["files"]
    for kind in args.types.split(","):
        path = (
            bf16
            if kind == "BF16"
            else quantize_gguf(bf16, bf16.with_name(bf16.name.replace("bf16", kind)), kind)
        )
        load = open("/proc/loadavg").read().split()[:3]
        print(f"{kind}: {path} (load {load})", flush=True)
        r = speed(path, args.rounds, args.prompt_tokens, args.decode_tokens, 4096)
        result["files"][kind] = {
            "bytes": path.stat().st_size,
            "loadavg_before": load,
            "llama_cpp_amx_denied": args.llamacpp_no_amx,
            **r,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
