"""Gemma 4 GGUF files, written as llama.cpp's converter writes them (tests/helpers/gguf_gemma4_factory.py, names from
gguf-py's own map) from tiny random transformers models (tests/helpers/gemma4_models.py), read by glassbox.

References: transformers' Gemma4ForCausalLM on the checkpoint the file was written from (float32 files), or
on the file's weights dequantized by gguf.quants (a Q8_0 file); transformers 5.24 has no Gemma 4 GGUF reader.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gemma4_models import KINDS, build_gemma4
from gguf import GGMLQuantizationType as Q
from gguf_factory import write_vocab
from gguf_gemma4_factory import dequantized_state, write_gemma4_gguf
from tiny_models import greedy_continuation, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.kernels import native
from glassbox.models.config_reader import facts_from_dir, facts_from_gguf
from glassbox.models.gemma4_layers import Gemma4DecoderLayer
from glassbox.models.gguf_reader import open_gguf
from glassbox.quant.blocks.linear import BlockQuantLinear, block_kernel_rows
from glassbox.tokenizer.gguf_tokenizer import tokenizer_from_gguf_path

LP_TOL = 1e-4  # float32 on both sides, as tests/models/test_gemma4.py derives it
PROMPTS = [list(range(3, 90)), [9, 8, 7], [5]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Per kind: (the transformers checkpoint, its F32 GGUF); "moe-q8_0": the MoE one in Q8_0."""
    root = tmp_path_factory.mktemp("gguf-gemma4")
    out = {}
    for kind in KINDS:
        d = build_gemma4(kind, root)
        write_gemma4_gguf(root / f"{kind}.gguf", d)
        out[kind] = (d, root / f"{kind}.gguf")
    write_gemma4_gguf(root / "moe-q8_0.gguf", out["moe"][0], Q.Q8_0)
    out["moe-q8_0"] = (out["moe"][0], root / "moe-q8_0.gguf")
    return out


@pytest.mark.parametrize("kind", KINDS)
def test_tensors_and_facts_match_the_checkpoint(files: dict[str, tuple[Path, Path]], kind: str) -> None:
    """Every tensor under its transformers name, equal to the checkpoint's (norms as stored: Gemma 4's take
    no + 1); the file's metadata describes the same model (layer geometry, sharing, rope, experts)."""
    from safetensors.numpy import load_file

    d, path = files[kind]
    checkpoint = open_gguf(path)
    ours = {n: t.reshape(-1) for n, t in checkpoint.tensors()}
    theirs = {n: t.reshape(-1) for n, t in load_file(d / "model.safetensors").items()}
    renamed = {n.removesuffix(".weight") if ".experts." in n else n: t for n, t in ours.items()}
    assert set(renamed) == set(theirs)
    for name, values in renamed.items():
        np.testing.assert_array_equal(values, theirs[name], err_msg=name)
    a, b = facts_from_gguf(checkpoint, "f"), facts_from_dir(d, "f")
    for field in ("layer_mixers", "sliding_window", "layer_kv_heads", "layer_head_dims", "kv_source", "rope",
                  "rope_local", "attention_k_eq_v", "layer_intermediate", "per_layer_input_size",
                  "num_experts", "experts_per_token", "moe_intermediate_size", "final_logit_softcapping",
                  "params", "tie_word_embeddings"):  # fmt: skip
        assert getattr(a, field) == getattr(b, field), field


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_like_transformers(files: dict[str, tuple[Path, Path]], kind: str) -> None:
    d, path = files[kind]
    ref = hf_greedy(d, PROMPTS, 8)
    llm = LLM(str(path), dtype="float32", max_num_seqs=2)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1))
    for out, (toks, lps) in zip(outs, ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < LP_TOL
    llm.engine.check_integrity()


def _dequantized_reference(d: Path, path: Path) -> object:
    """transformers' model on ``d`` with every tensor replaced by the file's, dequantized by gguf.quants."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    state = model.state_dict()
    with torch.no_grad():
        for name, values in dequantized_state(path, d).items():
            state[name].copy_(torch.from_numpy(values.copy()).reshape(state[name].shape))
    return model


def test_q8_0_file_like_transformers_on_its_dequantized_weights(files: dict[str, tuple[Path, Path]]) -> None:
    """float32: each Q8_0 matrix (the experts' stacked ones too) dequantized as gguf.quants does, bit for bit,
    so the run is token-exact with transformers on those values."""
    d, path = files["moe-q8_0"]
    ref = _dequantized_reference(d, path)
    llm = LLM(str(path), dtype="float32")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        toks, lps = greedy_continuation(ref, prompt, 8)
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < LP_TOL


@pytest.mark.skipif(not native.compiler(), reason="the block kernels need a C compiler")
def test_bf16_holds_the_fused_experts_in_their_blocks(files: dict[str, tuple[Path, Path]]) -> None:
    """bf16 (the engine's packed mode): each layer's experts stay in their Q8_0 blocks, gate and up as the one
    (2I, H) matrix the file fuses, and each expert's decode row on the int8-activation kernels is near the
    float32 product of gguf's dequantized values (relative error < 0.03, what int8 activation blocks cost:
    tests/quant/test_gguf_kquant.py)."""
    d, path = files["moe-q8_0"]
    state = dequantized_state(path, d)
    llm = LLM(str(path), dtype="bfloat16")
    layers = [m for m in llm.engine.executor.model.modules() if isinstance(m, Gemma4DecoderLayer)]
    for i, layer in enumerate(layers):
        experts = layer.experts
        assert experts is not None and len(experts.linears) == experts.num_experts
        assert all(isinstance(m, BlockQuantLinear) for pair in experts.linears for m in pair)  # as stored
        gate_up = torch.from_numpy(state[f"model.layers.{i}.experts.gate_up_proj"])
        down = torch.from_numpy(state[f"model.layers.{i}.experts.down_proj"])
        for e in range(experts.num_experts):
            x = torch.randn(1, gate_up.shape[2], generator=torch.Generator().manual_seed(e)).bfloat16()
            exact = experts.glu(x.float() @ gate_up[e].t()) @ down[e].t()
            with torch.no_grad(), block_kernel_rows(True):
                y = experts._expert(e, x).float()
            assert ((y - exact).norm() / exact.norm()).item() < 0.03, (i, e)


def test_a_file_without_a_chat_template_is_prompted_in_gemma4_turns(tmp_path: Path) -> None:
    """llama.cpp's Gemma 4 vocabulary ("gemma4": BPE over U+2581-spaced text, merges in the file) with its
    turn tokens; no chat template in the file: Gemma 4's turn format, <turn|> ending generation."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>", "\n", "u", "s", "e", "r", "us", "er",
              "user", "m", "o", "d", "l", "H", "i", "Hi", "y", "t", "sy", "st", "em", "syst", "system"]  # fmt: skip
    merges = ["u s", "e r", "us er", "H i", "s y", "s t", "e m", "sy st", "syst em"]
    vocab = {
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3, 3, 3, 3, 1] + [1] * (len(tokens) - 7),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": False,
    }
    tok = tokenizer_from_gguf_path(write_vocab(tmp_path / "vocab.gguf", vocab, arch="gemma4"))
    chat = [{"role": "system", "content": "Hi "}, {"role": "user", "content": "Hi"}]
    text = tok.apply_chat_template(chat)
    assert text == "<bos><|turn>system\nHi<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[:3] == [2, 4, tokens.index("system")] and ids.count(5) == 2  # the turn tokens stay whole
    assert 5 in tok.eos_token_ids  # <turn|> ends generation
    with pytest.raises(Exception, match="optional first system message"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])
