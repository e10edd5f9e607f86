"""GGUF mixture-of-experts files (qwen2moe, qwen3moe, gpt-oss, llama with experts = Mixtral), written as
llama.cpp's converter lays them out (tests/gguf_factory.write_moe_model) from tiny random transformers
models.

References: transformers reading the same GGUF for Qwen2-MoE / Qwen3-MoE (its GGUF reader dequantizes with
gguf.quants; its GGUF config mapping lacks the experts' width, so the model's config is handed to it).
transformers 5.24 cannot read llama.cpp's gpt-oss files (its YaRN metadata parse fails, its tensor map has
no ``ffn_*_exps`` / ``attn_sinks``) nor Mixtral ones (it builds a dense Llama): those are held to
transformers' GptOssForCausalLM / MixtralForCausalLM on the weights the file was written from (float
files), or on the file's experts dequantized by gguf.quants.dequantize (MXFP4).

Float32 files: greedy token-exact, logprobs within 1e-3, batched past max_num_seqs, chunked, prefix-cached.
Quantized experts (one Qwen3-MoE file mixing Q4_K, Q6_K, Q4_0, Q8_0 and F16 experts over its layers, as
llama.cpp's Q4_K_M mixes types; gpt-oss in MXFP4): held in the file's types (the bytes held are the file's),
each matrix dequantizing to gguf.quants' values bit for bit; run in float32 (held, each matrix dequantized
exactly) token-exact with the reference; in bf16 (the engine's packed mode) each expert's decode row on the
int8-activation kernels near the float32 product, greedy picks near the reference, a batch-1 decode step
reading k experts per layer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize
from gguf_factory import write_moe_model
from test_engine_parity import MAX_NEW, _check
from tiny_models import build_tiny_model, greedy_continuation

from glassbox import LLM, SamplingParams
from glassbox.engine.checkpoint import Checkpoint
from glassbox.kernels import native
from glassbox.models.config_reader import facts_from_gguf
from glassbox.models.gguf_reader import open_gguf
from glassbox.models.moe import MoEExperts
from glassbox.perf.memory_plan import weight_bytes
from glassbox.perf.model_presets import load_model_facts
from glassbox.perf.planner import PlanRequest, resolve
from glassbox.quant.blocks.linear import BlockQuantLinear, block_kernel_rows
from glassbox.quant.dense.onednn import ConcatLinear
from glassbox.quant.fp4.linear import FP4Linear

tf = pytest.importorskip("transformers")
needs_cc = pytest.mark.skipif(native.compiler() is None, reason="no C compiler to build the kernels")

# llama.cpp's files route every layer; gpt-oss's clamp (7) and YaRN ramp (truncated) are llama.cpp's
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "original_max_position_embeddings": 256, "truncate": True}  # fmt: skip
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2_moe": {"mlp_only_layers": []},
    "qwen3_moe": {"decoder_sparse_step": 1},
    "gpt_oss": {"swiglu_limit": 7.0, "rope_parameters": YARN},
    "mixtral": {},
}


def _prompts(vocab: int, lengths: tuple[int, ...] = (1, 7, 17, 40)) -> list[list[int]]:
    """Past one 16-token KV block and gpt-oss's 16-token window."""
    rng = np.random.default_rng(3)
    return [rng.integers(1, vocab, n).tolist() for n in lengths]


def _reference(arch: str, model_dir: Path, path: Path) -> Any:
    """transformers' model of the file: its own GGUF reader where it has one, else the source weights."""
    if arch in ("qwen2_moe", "qwen3_moe"):
        cfg = tf.AutoConfig.from_pretrained(model_dir)
        return tf.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, config=cfg, dtype=torch.float32
        ).eval()
    return tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, list[list[int]], list]]:
    """Per family: (model dir, F32 GGUF, prompts, the reference's greedy continuations)."""
    root = tmp_path_factory.mktemp("gguf_moe")
    out = {}
    for arch, shape in SHAPES.items():
        d = build_tiny_model(arch, root / arch, **shape)
        path = root / f"{arch}.gguf"
        write_moe_model(path, d)
        ref = _reference(arch, d, path)
        prompts = _prompts(ref.config.vocab_size)
        out[arch] = (d, path, prompts, [greedy_continuation(ref, p, MAX_NEW) for p in prompts])
    return out


# ---- reading ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(SHAPES))
def test_config_is_the_models(files: dict, arch: str) -> None:
    """The config read from the file builds the model transformers builds from its own config.json: the
    same parameter count, routed layers, routing rule and expert shapes."""
    d, path, _, _ = files[arch]
    hf = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    facts = facts_from_gguf(open_gguf(path), path.name)
    assert facts.total_params == sum(p.numel() for p in hf.parameters())
    assert facts.layer_moe == tuple(True for _ in hf.model.layers) and facts.num_experts == 8
    c = hf.config
    assert facts.moe_intermediate_size == (getattr(c, "moe_intermediate_size", None) or c.intermediate_size)
    assert facts.norm_topk_prob == (arch in ("qwen3_moe", "mixtral"))
    assert facts.shared_expert_intermediate_size == (getattr(c, "shared_expert_intermediate_size", 0) or 0)
    if arch == "gpt_oss":
        assert facts.layer_windows == (16, None) and facts.attention_sinks and facts.swiglu_limit == 7.0


def test_files_llama_cpp_would_not_run_are_refused(files: dict) -> None:
    """A layer without a router; llama.cpp's optional fused gate/up experts and its old layout."""
    from glassbox.models.gguf_config import build_config
    from glassbox.models.gguf_names import hf_tensor_name

    checkpoint = open_gguf(files["qwen3_moe"][1])
    shapes = {f"blk.{i}.ffn_gate_inp.weight": (8, 64) for i in (0, 2, 3)}  # layer 1 has no router
    with pytest.raises(ValueError, match=r"no router \(ffn_gate_inp\) in layers \[1\]"):
        build_config(checkpoint.metadata, {**shapes, "blk.0.attn_q.weight": (128, 64)}, ["F32"])
    with pytest.raises(ValueError, match="fused gate/up experts"):
        hf_tensor_name("blk.0.ffn_gate_up_exps.weight", "qwen3moe")
    with pytest.raises(ValueError, match="one tensor each"):
        hf_tensor_name("blk.0.ffn_gate.3.weight", "llama")


# ---- float32 files: token-exact -----------------------------------------------------------------------


@pytest.mark.parametrize("arch", list(SHAPES))
def test_float32_greedy_matches_transformers(files: dict, arch: str) -> None:
    """Four prompts through three sequence slots (batched past max_num_seqs)."""
    _, path, prompts, ref = files[arch]
    _check(LLM(str(path), dtype="float32", max_num_seqs=3), prompts, ref)


def test_float32_chunked_and_prefix_cached(files: dict) -> None:
    """gpt-oss (sliding layers and sinks): prompts in 37-token chunks beside decodes, then all cached."""
    _, path, prompts, ref = files["gpt_oss"]
    llm = LLM(
        str(path), dtype="float32", max_num_seqs=4, max_num_batched_tokens=37, enable_prefix_caching=True
    )
    _check(llm, prompts, ref)
    assert any(r.phase == "mixed" for r in llm.engine.step_records)
    _check(llm, prompts, ref)  # the second round finds the prompts cached
    assert llm.engine.block_manager.stats.hits > 0


# ---- quantized experts, kept packed -------------------------------------------------------------------

# per layer of a 4-layer Qwen3-MoE file: (gate, up, down); 256-wide so that K-quants' super-blocks fit
MIX = [(Q.Q4_K, Q.Q4_K, Q.Q4_K), (Q.Q4_K, Q.Q4_K, Q.Q6_K), (Q.Q4_0, Q.Q4_0, Q.Q4_0), (Q.Q8_0, Q.Q4_0, Q.F16)]
PROJ = {"gate_proj": 0, "up_proj": 1, "down_proj": 2}


def _mixed_type(name: str) -> Q:
    parts = name.split(".")  # model.layers.N.mlp.experts.<proj>.weight
    return MIX[int(parts[2])][PROJ[parts[-2]]]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    """Per family: (the GGUF file, its float32 reference model)."""
    root = tmp_path_factory.mktemp("gguf_moe_q")
    qwen = build_tiny_model("qwen3_moe", root / "qwen", decoder_sparse_step=1, hidden_size=256,
                            moe_intermediate_size=256, intermediate_size=256)  # fmt: skip
    write_moe_model(root / "qwen3-mix.gguf", qwen, expert_type=_mixed_type)
    oss = build_tiny_model("gpt_oss", root / "oss", **SHAPES["gpt_oss"])
    write_moe_model(root / "gpt-oss-mxfp4.gguf", oss, expert_type=Q.MXFP4)
    return {
        "qwen3_moe": (root / "qwen3-mix.gguf", _reference("qwen3_moe", qwen, root / "qwen3-mix.gguf")),
        "gpt_oss": (root / "gpt-oss-mxfp4.gguf", _dequantized_reference(oss, root / "gpt-oss-mxfp4.gguf")),
    }


def _stacked(path: Path) -> dict[str, np.ndarray]:
    """The file's expert tensors dequantized by gguf.quants, by GGUF name: (E, rows, cols) float32."""
    return {
        t.name: dequantize(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        for t in GGUFReader(path).tensors
        if "_exps.weight" in t.name
    }


def _dequantized_reference(model_dir: Path, path: Path) -> Any:
    """transformers' gpt-oss on ``model_dir`` with its experts replaced by the file's, dequantized by
    gguf.quants and put back in gpt-oss's layout (gate/up interleaved, both transposed)."""
    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    params, stacked = model.state_dict(), _stacked(path)
    with torch.no_grad():
        for i in range(model.config.num_hidden_layers):

            def get(proj: str, i: int = i) -> torch.Tensor:
                return torch.from_numpy(stacked[f"blk.{i}.ffn_{proj}_exps.weight"]).transpose(1, 2)

            gate_up = params[f"model.layers.{i}.mlp.experts.gate_up_proj"]
            gate_up[..., 0::2], gate_up[..., 1::2] = get("gate"), get("up")
            params[f"model.layers.{i}.mlp.experts.down_proj"].copy_(get("down"))
    return model


def _experts(llm: LLM) -> list[MoEExperts]:
    return [m for m in llm.engine.executor.model.modules() if isinstance(m, MoEExperts)]


def _parts(m: torch.nn.Module) -> list[Any]:
    """The stored matrices of a held linear (stacked ones as one)."""
    if isinstance(m, ConcatLinear):
        return [w for p in m.parts for w in _parts(p)]
    assert isinstance(m, BlockQuantLinear | FP4Linear), type(m)
    return [m.w]


def _held_llm(path: Path, monkeypatch: pytest.MonkeyPatch) -> LLM:
    """The engine on ``path`` in float32 with the experts kept as stored (the engine itself dequantizes
    every GGUF weight in float32: the test has the checkpoint's own ``weights`` called with keep_blocks)."""
    weights = Checkpoint.weights
    monkeypatch.setattr(
        Checkpoint, "weights", lambda self, keep, device, dt, **kw: weights(self, True, device, dt, **kw)
    )
    return LLM(str(path), dtype="float32", max_num_seqs=3)


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_held_experts_are_the_files_and_run_exactly_in_float32(
    quantized: dict, arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each expert's matrices are held in the file's types (the bytes held are the file's), dequantize to
    gguf.quants' values bit for bit, and run in float32 (each held matrix dequantized, exactly) token-exact
    with the float32 reference, logprobs within 1e-3."""
    path, ref = quantized[arch]
    llm = _held_llm(path, monkeypatch)
    stacked, tensors = _stacked(path), GGUFReader(path).tensors
    held = 0
    for i, m in enumerate(_experts(llm)):
        gate, up, down = (stacked[f"blk.{i}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))
        assert m.gate_up_proj.numel() == 0 and len(m.linears) == m.num_experts
        float_down = arch == "qwen3_moe" and MIX[i][2] == Q.F16  # dequantized into the float parameter
        for e, (gate_up, dn) in enumerate(m.linears):
            parts = _parts(gate_up)  # gate and up stacked into one matrix where their types match
            assert len(parts) == (2 if arch == "qwen3_moe" and MIX[i][0] != MIX[i][1] else 1)
            got = torch.cat([w.dequantize(torch.float32) for w in parts])
            assert torch.equal(got, torch.from_numpy(np.concatenate([gate[e], up[e]])))
            held += sum(w.nbytes for w in parts)
            if not float_down:
                assert torch.equal(_parts(dn)[0].dequantize(torch.float32), torch.from_numpy(down[e]))
                held += _parts(dn)[0].nbytes
    kept = {Q.Q4_0, Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.MXFP4}
    assert held == sum(int(t.n_bytes) for t in tensors if "_exps.weight" in t.name and t.tensor_type in kept)
    formats = {"qwen3_moe": {"Q4_0", "Q4_K", "Q6_K", "Q8_0"}, "gpt_oss": {"MXFP4"}}[arch]
    assert set(llm.engine.executor.block_formats) == formats
    prompts = _prompts(ref.config.vocab_size)  # four, through 3 slots
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        toks, lps = greedy_continuation(ref, prompt, 6)
        assert out.token_ids == toks and out.logprobs is not None
        assert [step[t] for step, t in zip(out.logprobs, toks, strict=True)] == pytest.approx(lps, abs=1e-3)


@needs_cc
@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_bf16_decode_runs_the_kernels_near_the_reference(quantized: dict, arch: str) -> None:
    """bf16 (the engine's packed mode): each expert's decode row (the int8-activation kernels) is near the
    float32 product of gguf's dequantized values (relative error < 0.03, what int8 activation blocks
    cost: tests/quant/test_gguf_kquant.py), and greedy runs stay near the float32 reference.

    End to end the median logprob error must stay under 0.05 and each pick within 1.5 of the reference's
    best: on these random models bf16 alone (the experts dequantized, no kernels) moves single logprobs by
    up to ~1.05 where a rounding difference flips a near-tied top-k routing choice (median ~0.02); a wrong
    layout, scale or gate/up order moves every token by nats."""
    path, ref = quantized[arch]
    llm = LLM(str(path), dtype="bfloat16", max_num_seqs=3)
    stacked = _stacked(path)
    for i, m in enumerate(_experts(llm)):
        gate, up, down = (stacked[f"blk.{i}.ffn_{p}_exps.weight"] for p in ("gate", "up", "down"))
        for e in range(m.num_experts):
            x = torch.randn(1, gate.shape[2], generator=torch.Generator().manual_seed(e)).bfloat16()
            exact = _expert_reference(m, x.float(), gate[e], up[e], down[e], e)
            with torch.no_grad(), block_kernel_rows(True):
                y = m._expert(e, x).float()
            assert ((y - exact).norm() / exact.norm()).item() < 0.03, (i, e)
    prompts = _prompts(ref.config.vocab_size)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0))
    diffs = []
    for prompt, out in zip(prompts, outs, strict=True):
        with torch.no_grad():
            logits = ref(torch.tensor([prompt + out.token_ids])).logits[0].float()
        lp = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1]
        assert out.logprobs is not None
        for j, t in enumerate(out.token_ids):
            assert lp[j, t] >= lp[j].max() - 1.5, f"token {j}: not a top choice"
            diffs.append(abs(out.logprobs[j][t] - float(lp[j, t])))
    assert float(np.median(diffs)) < 0.05


def _expert_reference(
    m: MoEExperts, x: torch.Tensor, gate: np.ndarray, up: np.ndarray, down: np.ndarray, e: int
) -> torch.Tensor:
    """One expert in float32 from gguf's dequantized values (the held linears' biases: gpt-oss's)."""
    g, u = x @ torch.from_numpy(gate).t(), x @ torch.from_numpy(up).t()
    bias = getattr(m.linears[e][0], "bias", None)
    if bias is not None:  # [gate | up]
        g, u = g + bias[: g.shape[1]].float(), u + bias[g.shape[1] :].float()
    y = m.linear_glu(torch.cat([g, u], dim=-1)) @ torch.from_numpy(down).t()
    down_bias = getattr(m.linears[e][1], "bias", None)
    return y if down_bias is None else y + down_bias.float()


@needs_cc
def test_a_decode_step_reads_k_experts_per_layer(quantized: dict) -> None:
    """A lone request's decode step runs k = 2 of 8 experts per layer and reads (``bytes_read``, what
    `glassbox trace` reports) their bytes as the file stores them (its F16 experts held in bf16: as many)."""
    path, _ = quantized["qwen3_moe"]
    tensors = GGUFReader(path).tensors
    llm = LLM(str(path), dtype="bfloat16", max_num_seqs=1)
    engine, experts = llm.engine, _experts(llm)
    engine.add_request("r", [5, 9, 13, 2, 40], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    engine.step()  # the prompt
    before = [(m.experts_read, m.bytes_read) for m in experts]
    engine.step()  # one decode row
    for i, (m, (reads, nbytes)) in enumerate(zip(experts, before, strict=True)):
        per_expert = sum(int(t.n_bytes) for t in tensors if t.name.startswith(f"blk.{i}.ffn_")
                         and "_exps.weight" in t.name) // m.num_experts  # fmt: skip
        assert m.expert_bytes() == per_expert
        assert m.experts_read - reads == 2 and m.bytes_read - nbytes == 2 * per_expert


def test_plan_costs_the_experts_as_stored(quantized: dict) -> None:
    """`glassbox plan FILE.gguf`: parameters from the metadata, each group's bits per weight as stored."""
    path, _ = quantized["qwen3_moe"]
    tensors = GGUFReader(path).tensors
    facts = load_model_facts(str(path))
    assert facts.total_params == sum(int(t.n_elements) for t in tensors)
    s = resolve(PlanRequest(model=str(path), hardware="dgx-spark"))
    experts = [t for t in tensors if "_exps.weight" in t.name]
    bits = 8 * sum(int(t.n_bytes) for t in experts) / sum(int(t.n_elements) for t in experts)
    assert s.scheme.experts.bits_per_weight == pytest.approx(bits)
    stored = sum(int(t.n_bytes) for t in tensors if "norm" not in t.name)
    assert weight_bytes(facts, s.scheme) == pytest.approx(stored, rel=0.002)
