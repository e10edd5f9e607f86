"""Prompt rows of block linears on the int8 GEMM (quant/blocks/prompt_gemm.py): the choice, and the engine on a
GGUF file with it against the same file dequantized in float32."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf_factory import Spec, write_model
from test_cpu_quant_gemm import needs_vnni
from test_gguf_blocks32 import assert_close_to

from glassbox import LLM, SamplingParams
from glassbox.quant.blocks import prompt_gemm
from glassbox.quant.blocks.linear import BlockQuantLinear, block_kernel_rows
from glassbox.quant.blocks.prompt_gemm import AMX_INT8_ROWS, int8_prompt_rows


@pytest.fixture
def fresh_choice() -> Iterator[None]:
    int8_prompt_rows.cache_clear()
    yield
    int8_prompt_rows.cache_clear()


@needs_vnni
def test_the_choice(monkeypatch: pytest.MonkeyPatch, fresh_choice: None) -> None:
    monkeypatch.delenv("GLASSBOX_BLOCK_PROMPTS", raising=False)
    assert int8_prompt_rows() == 0  # opt-in: the dequantized GEMM by default
    int8_prompt_rows.cache_clear()
    monkeypatch.setenv("GLASSBOX_BLOCK_PROMPTS", "dequant")
    assert int8_prompt_rows() == 0
    int8_prompt_rows.cache_clear()
    monkeypatch.setenv("GLASSBOX_BLOCK_PROMPTS", "int8")
    assert int8_prompt_rows() == sys.maxsize
    int8_prompt_rows.cache_clear()
    monkeypatch.setenv("GLASSBOX_BLOCK_PROMPTS", "auto")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")  # the Makefile's test-no-amx: all rows
    assert not prompt_gemm.amx_for_onednn() and int8_prompt_rows() == sys.maxsize
    int8_prompt_rows.cache_clear()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    expected = AMX_INT8_ROWS if prompt_gemm.amx_for_onednn() else sys.maxsize  # AMX: 0 (the reference)
    assert int8_prompt_rows() == expected
    int8_prompt_rows.cache_clear()
    monkeypatch.setenv("GLASSBOX_BLOCK_PROMPTS", "vnni")
    with pytest.raises(ValueError, match="GLASSBOX_BLOCK_PROMPTS must be one of auto, int8, dequant"):
        int8_prompt_rows()


# hidden 544 (a 16-block chunk, then a tail pair), FFN 1024 (two whole chunks): Q4_0, with Q8_0 v/down/head
MIX = {"v_proj": Q.Q8_0, "down_proj": Q.Q8_0, "lm_head": Q.Q8_0}
PROMPTS = [[(7 * i + 3) % 61 + 2 for i in range(70)], [(5 * i + 1) % 59 + 2 for i in range(33)]]
NEW = 6


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("prompt_gemm") / "tiny-q4_0.gguf"
    spec = Spec(hidden=544, ffn=1024, layers=2, heads=4, kv_heads=2, vocab=64, qtype=Q.Q4_0, types=MIX)
    write_model(path, spec, seed=11)
    return path


@needs_vnni
def test_engine_prompts_on_the_int8_gemm(
    model_file: Path, monkeypatch: pytest.MonkeyPatch, fresh_choice: None
) -> None:
    """bf16 as served, prompt rows on the int8 GEMM (every row: "int8"), decode steps on the GEMV; against the
    engine on the same file in float32 (the blocks dequantized exactly: transformers' arithmetic). Close as
    test_gguf_blocks32's bf16 engine is (int8 activations and bf16 roundings move logits ~1%: logprobs within
    0.25 while the tokens agree, a parting only at the reference's near tie)."""
    monkeypatch.setenv("GLASSBOX_BLOCK_PROMPTS", "int8")
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, logprobs=5)
    llm = LLM(str(model_file), dtype="bfloat16", device="cpu", max_model_len=128, enable_prefix_caching=False)
    linear = next(m for m in llm.engine.executor.model.modules() if isinstance(m, BlockQuantLinear))
    x = torch.randn(len(PROMPTS[0]), linear.in_features).bfloat16()
    with block_kernel_rows(False, prompt=True):  # a prompt step's rows take the int8 GEMM
        assert torch.equal(linear(x), prompt_gemm.int8_gemm(x, linear.w, linear.bias))
    ours = llm.generate(PROMPTS, params)
    ref = LLM(str(model_file), dtype="float32", device="cpu", max_model_len=128).generate(PROMPTS, params)
    assert_close_to(ours, ref)
