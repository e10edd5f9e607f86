"""Gemma 4 under tensor parallelism on the CPU (gloo, a spawned second rank): float32 greedy token-exact with
transformers (which TP=1 is too: tests/models/test_gemma4.py), logprobs within 1e-4 (the float32 bound derived
there; the all-reduces add partial sums of two halves, an ulp-level regrouping)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from gemma4_models import build_gemma4
from gguf_gemma4_factory import write_gemma4_gguf
from tiny_models import hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.engine import tp_runtime
from glassbox.models.config_reader import facts_from_gguf
from glassbox.models.gguf_reader import open_gguf
from glassbox.models.gguf_shards import check_gguf_tp
from glassbox.models.model_config import ModelConfig

LP_TOL = 1e-4
PROMPTS = [list(range(3, 63)), [1, 5, 9, 20, 33]]  # 60 tokens: past the 24-token window


@pytest.fixture(autouse=True)
def _leave_group() -> Iterator[None]:
    yield
    tp_runtime.shutdown()  # each test's engine leaves the group (and reaps its worker)


def _check(model: Path, ref_dir: Path) -> None:
    ref = hf_greedy(ref_dir, PROMPTS, 8)
    llm = LLM(str(model), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=1))
    for out, (toks, lps) in zip(outs, ref, strict=True):
        assert out.token_ids == toks
        assert out.logprobs is not None
        assert max(abs(out.logprobs[j][t] - lps[j]) for j, t in enumerate(toks)) < LP_TOL


def test_tp2_multimodal_dense_matches_transformers(tmp_path: Path) -> None:
    """The dense model (4 heads and 2 sliding KV heads split, the full layers' one KV head replicated, the
    KV-sharing layers reading their owners' heads, per-layer inputs whole) inside a multimodal checkpoint:
    each rank reads its text model's slices."""
    d = build_gemma4("dense", tmp_path, multimodal=True)
    _check(d, d)


def test_tp2_moe_matches_transformers(tmp_path: Path) -> None:
    """Each expert split by FFN width, the experts' partial sums all-reduced before their norm."""
    d = build_gemma4("moe", tmp_path)
    _check(d, d)


def test_tp2_gguf(tmp_path: Path) -> None:
    """A dense GGUF file splits like its safetensors; a MoE one's fused gate/up experts are refused."""
    dense, moe = build_gemma4("dense", tmp_path), build_gemma4("moe", tmp_path)
    write_gemma4_gguf(tmp_path / "dense.gguf", dense)
    write_gemma4_gguf(tmp_path / "moe.gguf", moe)
    checkpoint = open_gguf(tmp_path / "moe.gguf")
    with pytest.raises(
        ValueError, match="experts.gate_up_proj.weight \\(stacked experts of this layout\\) is not split"
    ):
        check_gguf_tp(checkpoint, ModelConfig.from_facts(facts_from_gguf(checkpoint, "moe")), 2)
    _check(tmp_path / "dense.gguf", dense)
