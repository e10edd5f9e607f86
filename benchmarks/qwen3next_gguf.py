"""glassbox and llama.cpp on one Qwen3-Next-shaped GGUF (llama.cpp's ``qwen3next``), batch 1, in turns.

The file: Qwen3-Next-80B-A3B's widths (hidden 2048, vocabulary 151936, Gated DeltaNet 16 key / 32 value
heads of 128, conv 4; gated attention 16 heads / 2 KV heads of 256, a quarter rotated; experts of 512, top
10, a shared expert of 512), random weights (normal, std 0.02), cut to ``--layers`` layers (3 linear : 1 full)
and ``--experts`` routed experts (the published 512 do not fit this machine's memory; a token still reads
10 experts per layer, so decode reads the same bytes per layer). Written bf16 by this script under
llama.cpp's names and layouts (as its converter writes them: models/gguf_hybrid.py), then quantized to
Q8_0 / Q4_0 by llama.cpp's own quantizer (``llama_model_quantize``). A tiny vocabulary of placeholder
tokens (prompts are random ids).

Per file, ``--rounds`` rounds of: a fresh ``--prompt-tokens`` prompt of random ids prefilled at batch 1, then
``--decode-tokens`` greedy steps; glassbox first, then llama.cpp (benchmarks/gguf_compare.speed).

    .venv/bin/python benchmarks/qwen3next_gguf.py [--layers 4] [--experts 16] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_compare  # noqa: E402
from gguf_compare import speed  # noqa: E402
from llamacpp_peer import llamacpp_version  # noqa: E402
from moe_gguf import quantize_gguf  # noqa: E402

from glassbox.perf.hardware import cpu_name  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
H, VOCAB, HEADS, KV_HEADS, HEAD_DIM = 2048, 151936, 16, 2, 256
NK, NV, DK, DV, CONV = 16, 32, 128, 128, 4
EXPERT_FFN, SHARED_FFN, TOP_K = 512, 512, 10
BF16, F32 = gguf.GGMLQuantizationType.BF16, gguf.GGMLQuantizationType.F32
Planned = tuple[str, tuple[int, ...], Callable[[], np.ndarray]]


def _normal(*shape: int) -> Callable[[], np.ndarray]:
    return lambda: (torch.randn(*shape) * 0.02).to(torch.bfloat16).view(torch.int16).numpy()


def _f32(make: Callable[[], torch.Tensor]) -> Callable[[], np.ndarray]:
    return lambda: make().float().numpy()


def _plan(layers: int, experts: int) -> Iterator[Planned]:
    conv_dim, value_dim = 2 * NK * DK + NV * DV, NV * DV
    yield "token_embd.weight", (VOCAB, H), _normal(VOCAB, H)
    for i in range(layers):
        b = f"blk.{i}."
        yield b + "attn_norm.weight", (H,), _f32(lambda: 1 + 0.1 * torch.randn(H))
        yield b + "post_attention_norm.weight", (H,), _f32(lambda: 1 + 0.1 * torch.randn(H))
        if (i + 1) % 4:
            yield b + "attn_qkv.weight", (conv_dim, H), _normal(conv_dim, H)
            yield b + "attn_gate.weight", (value_dim, H), _normal(value_dim, H)
            yield b + "ssm_ba.weight", (2 * NV, H), _normal(2 * NV, H)
            yield b + "ssm_conv1d.weight", (conv_dim, CONV), _f32(lambda: 0.3 * torch.randn(conv_dim, CONV))
            yield b + "ssm_dt.bias", (NV,), _f32(lambda: torch.randn(NV))
            yield b + "ssm_a", (NV,), _f32(lambda: -torch.rand(NV).mul(15).add(1))  # -exp(A_log), A in 1..16
            yield b + "ssm_norm.weight", (DV,), _f32(lambda: 1 + 0.1 * torch.randn(DV))
            yield b + "ssm_out.weight", (H, value_dim), _normal(H, value_dim)
        else:
            yield b + "attn_q.weight", (2 * HEADS * HEAD_DIM, H), _normal(2 * HEADS * HEAD_DIM, H)
            yield b + "attn_k.weight", (KV_HEADS * HEAD_DIM, H), _normal(KV_HEADS * HEAD_DIM, H)
            yield b + "attn_v.weight", (KV_HEADS * HEAD_DIM, H), _normal(KV_HEADS * HEAD_DIM, H)
            yield b + "attn_output.weight", (H, HEADS * HEAD_DIM), _normal(H, HEADS * HEAD_DIM)
            yield b + "attn_q_norm.weight", (HEAD_DIM,), _f32(lambda: 1 + 0.1 * torch.randn(HEAD_DIM))
            yield b + "attn_k_norm.weight", (HEAD_DIM,), _f32(lambda: 1 + 0.1 * torch.randn(HEAD_DIM))
        yield b + "ffn_gate_inp.weight", (experts, H), _f32(lambda: 0.02 * torch.randn(experts, H))
        yield b + "ffn_gate_exps.weight", (experts, EXPERT_FFN, H), _normal(experts, EXPERT_FFN, H)
        yield b + "ffn_up_exps.weight", (experts, EXPERT_FFN, H), _normal(experts, EXPERT_FFN, H)
        yield b + "ffn_down_exps.weight", (experts, H, EXPERT_FFN), _normal(experts, H, EXPERT_FFN)
        yield b + "ffn_gate_inp_shexp.weight", (H,), _f32(lambda: 0.02 * torch.randn(H))
        yield b + "ffn_gate_shexp.weight", (SHARED_FFN, H), _normal(SHARED_FFN, H)
        yield b + "ffn_up_shexp.weight", (SHARED_FFN, H), _normal(SHARED_FFN, H)
        yield b + "ffn_down_shexp.weight", (H, SHARED_FFN), _normal(H, SHARED_FFN)
    yield "output_norm.weight", (H,), _f32(lambda: 1 + 0.1 * torch.randn(H))
    yield "output.weight", (VOCAB, H), _normal(VOCAB, H)


def _metadata(w: gguf.GGUFWriter, layers: int, experts: int) -> None:
    w.add_name("qwen3next-shaped-random")
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(H)
    w.add_feed_forward_length(5120)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_expert_count(experts)
    w.add_expert_used_count(TOP_K)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_expert_feed_forward_length(EXPERT_FFN)
    w.add_expert_shared_feed_forward_length(SHARED_FFN)
    w.add_ssm_conv_kernel(CONV)
    w.add_ssm_state_size(DK)
    w.add_ssm_group_count(NK)
    w.add_ssm_time_step_rank(NV)
    w.add_ssm_inner_size(NV * DV)
    w.add_full_attention_interval(4)
    w.add_rope_dimension_count(HEAD_DIM // 4)
    # placeholder vocabulary (llama.cpp's BPE loader needs one merge whose halves are tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(["a", "b", "ab", *(f"t{i}" for i in range(3, VOCAB))])
    w.add_token_types([1] * VOCAB)
    w.add_token_merges(["a b"])
    w.add_eos_token_id(0)


def write_shaped_gguf(out: Path, layers: int, experts: int) -> Path:
    """The bf16 Qwen3-Next-shaped file (kept when already there), written tensor by tensor."""
    if out.is_file():
        return out
    torch.manual_seed(0)
    plan = list(_plan(layers, experts))
    tmp = out.with_suffix(".partial")
    w = gguf.GGUFWriter(str(tmp), "qwen3next")
    _metadata(w, layers, experts)
    for name, shape, _ in plan:
        f32 = len(shape) == 1 or name.endswith(("ssm_conv1d.weight", "ffn_gate_inp.weight"))
        nbytes = int(np.prod(shape)) * (4 if f32 else 2)
        w.add_tensor_info(
            name, shape, np.dtype(np.float32 if f32 else np.int16), nbytes, F32 if f32 else BF16
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, shape, make in plan:
        data = make()
        assert data.shape == shape
        w.write_tensor_data(data)
    w.close()
    tmp.rename(out)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--types", default="BF16,Q8_0,Q4_0")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/qwen3next-bench"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--llamacpp-no-amx", action="store_true",
        help="llama.cpp in child processes with AMX denied (its AMX kernels crash on some VMs on Q8_0/Q4_0)",
    )  # fmt: skip
    if sys.argv[1:] == ["--peer-worker"]:
        return gguf_compare.peer_worker()
    args = ap.parse_args()
    gguf_compare._PEER["no_amx"] = args.llamacpp_no_amx
    args.dir.mkdir(parents=True, exist_ok=True)
    bf16 = write_shaped_gguf(
        args.dir / f"qwen3next-{args.layers}l-{args.experts}e-bf16.gguf", args.layers, args.experts
    )
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "peer": llamacpp_version(),
        "threads": 2,
        "shape": {"layers": args.layers, "experts": args.experts, "hidden": H, "vocab": VOCAB, "top_k": TOP_K},
        "files": {},
    }  # fmt: skip
    out = args.out or RESULTS / f"qwen3next-gguf-{time.strftime('%Y-%m-%d')}.json"
    if out.is_file():  # a run of other types adds to the day's file
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
        no_amx = args.llamacpp_no_amx
        result["files"][kind] = {
            "bytes": path.stat().st_size,
            "loadavg_before": load,
            "llama_cpp_amx_denied": no_amx,
            **r,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
