"""Greedy parity with transformers, token-exact, under every scheduling regime the engine has."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_models import ARCHS, build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.kernels import native
from glassbox.layers.linear import packing_available
from glassbox.tokenizer.hf_tokenizer import Tokenizer

MAX_NEW = 12
# "native" needs a C compiler; where there is none the engine falls back to "torch" (and says so).
CPU_KERNELS = ["native", "torch"] if native.compiler() else ["torch"]
TEXTS = [
    "def fibonacci(n):",
    "你好，世界！今天天气很好。",
    "Emoji 😀🚀🎉 and naïve café",
    "import os\nimport sys\n\nclass Foo:\n    def __init__(self):\n        self.x = 1\n",
]


def _prompts(tok: Tokenizer) -> list[list[int]]:
    """Mixed lengths from 1 to ~300 tokens, crossing block boundaries, with CJK and emoji."""
    base = [tok.encode(t) for t in TEXTS]
    long_text = "".join(TEXTS) * 12
    long_ids = tok.encode(long_text)
    prompts = [
        base[0][:1],
        base[1],
        base[2],
        base[3],
        long_ids[:15],
        long_ids[:16],
        long_ids[:17],
        long_ids[:64],
        long_ids[:129],
        long_ids[:300],
    ]
    assert min(map(len, prompts)) == 1 and max(map(len, prompts)) >= 290
    return prompts


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[list[int]], list]]:
    root = tmp_path_factory.mktemp("parity")
    out = {}
    for arch in ARCHS:
        d = build_tiny_model(arch, root)
        prompts = _prompts(Tokenizer.from_dir(d))
        out[arch] = (d, prompts, hf_greedy(d, prompts, MAX_NEW))
    return out


def _check(llm: LLM, prompts: list[list[int]], ref: list, lp_tol: float = 1e-3) -> None:
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=2)
    outs = llm.generate(prompts, params)
    for i, (out, (toks, lps)) in enumerate(zip(outs, ref, strict=True)):
        assert out.token_ids == toks, f"prompt {i} ({len(prompts[i])} tokens): {out.token_ids} != {toks}"
        assert out.logprobs is not None
        for j, t in enumerate(toks):
            assert abs(out.logprobs[j][t] - lps[j]) < lp_tol
            assert len(out.logprobs[j]) >= 2  # top-2 plus the chosen one (which is in the top-2 here)
        assert out.finish_reason == "length"
        assert out.metrics is not None and out.metrics.output_tokens == MAX_NEW
    llm.engine.check_integrity()
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks, "blocks still held when idle"


@pytest.mark.parametrize("kernels", CPU_KERNELS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_parity_batched(
    models: dict, arch: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both CPU paths: glassbox's C kernels (the default where a compiler exists) and the PyTorch ops."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, ref = models[arch]
    llm = LLM(str(d), dtype="float32", max_num_seqs=3)
    assert llm.engine.executor.attn_backend == kernels
    _check(llm, prompts, ref)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_parity_under_preemption(models: dict, arch: str) -> None:
    d, prompts, ref = models[arch]
    # 24 blocks x 16 tokens: the longest request (312 tokens, 20 blocks) fits alone, not beside others
    llm = LLM(str(d), dtype="float32", max_num_seqs=4, num_kv_blocks=24)
    _check(llm, prompts, ref)
    assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_parity_chunked_prefill(models: dict, arch: str) -> None:
    d, prompts, ref = models[arch]
    llm = LLM(str(d), dtype="float32", max_num_seqs=5, max_num_batched_tokens=37)
    _check(llm, prompts, ref)
    assert any(r.phase == "mixed" for r in llm.engine.step_records), "chunks never shared a step with decodes"


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_parity_prefix_caching(models: dict, prefix_caching: bool) -> None:
    d, prompts, ref = models["qwen3"]
    llm = LLM(str(d), dtype="float32", max_num_seqs=4, enable_prefix_caching=prefix_caching)
    _check(llm, prompts, ref)  # long prompts share their first 15..129 tokens
    _check(llm, prompts, ref)  # and the second round finds all of them cached
    stats = llm.engine.block_manager.stats
    if prefix_caching:
        assert stats.hits > 0
    else:
        assert stats.hits == 0


@pytest.mark.parametrize("kernels", CPU_KERNELS)
def test_mistral_sliding_window_shorter_than_prompt(
    models: dict, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, ref = models["mistral"]
    llm = LLM(str(d), dtype="float32", max_num_seqs=4, max_num_batched_tokens=50)
    windows = llm.engine.model_config.layer_windows
    assert all(w is not None and w < max(map(len, prompts)) for w in windows)
    _check(llm, prompts, ref)


def _hf_logprobs(model_dir: Path, ids: list[int], n_prompt: int) -> torch.Tensor:
    """transformers' float32 log-probabilities of each next token after the prompt (teacher-forced)."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)[n_prompt - 1 : len(ids) - 1]  # (n_out, vocab)


@pytest.mark.parametrize("kernels", CPU_KERNELS)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_bfloat16_path_stays_close_to_float32_reference(
    models: dict, arch: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 on CPU (oneDNN-packed linears, batched decode attention): each greedy pick is a top choice
    of the float32 reference and its logprob is within bf16 rounding of the reference's."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, _ = models[arch]
    llm = LLM(str(d), dtype="bfloat16", max_num_seqs=4)
    assert llm.engine.executor.attn_backend == kernels
    assert llm.engine.executor.packed > 0 or not packing_available(torch.bfloat16)
    outs = llm.generate(prompts[:6], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0))
    for prompt, out in zip(prompts[:6], outs, strict=True):
        ref = _hf_logprobs(d, prompt + out.token_ids, len(prompt))
        assert out.logprobs is not None
        for j, t in enumerate(out.token_ids):
            assert ref[j, t] >= ref[j].max() - 0.15, f"token {j}: bf16 pick is not a top choice"
            assert abs(out.logprobs[j][t] - float(ref[j, t])) < 0.15
    llm.engine.check_integrity()
