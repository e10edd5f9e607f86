"""Greedy parity with transformers, token-exact, under every scheduling regime the engine has."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from tiny_models import ARCHS, build_tiny_model, hf_greedy

from glassbox import LLM, SamplingParams
from glassbox.kernels import native
from glassbox.quant.dense.onednn import packing_available
from glassbox.tokenizer.hf_tokenizer import Tokenizer

MAX_NEW = 12
# "native" needs a C compiler; where there is none the engine falls back to "torch" (and says so).
CPU_KERNELS = ["native", "torch"] if native.compiler() else ["torch"]
# Families with no forward on the CPU kernels (models/families.py cpu_forward): "native" falls back to "torch".
NO_CPU_KERNELS = {"gemma3"}
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


def reference_runs(root: Path, archs: Sequence[str]) -> dict[str, tuple[Path, list[list[int]], list]]:
    """Per architecture: a tiny random model under ``root``, its test prompts, and transformers' greedy
    continuations of them (MAX_NEW tokens, with logprobs): what ``_check`` holds the engine to."""
    out = {}
    for arch in archs:
        d = build_tiny_model(arch, root)
        prompts = _prompts(Tokenizer.from_dir(d))
        out[arch] = (d, prompts, hf_greedy(d, prompts, MAX_NEW))
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[list[int]], list]]:
    return reference_runs(tmp_path_factory.mktemp("parity"), ARCHS)


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


def _backend(arch: str, kernels: str) -> str:
    return "torch" if arch in NO_CPU_KERNELS else kernels


@pytest.mark.parametrize("kernels", CPU_KERNELS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_parity_batched(
    models: dict, arch: str, kernels: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Both CPU paths: glassbox's C kernels (the default where a compiler exists) and the PyTorch ops; a
    family without kernels runs on the PyTorch ops, and the engine says so once."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, ref = models[arch]
    with caplog.at_level(logging.WARNING, logger="glassbox.engine.torch_executor"):
        llm = LLM(str(d), dtype="float32", max_num_seqs=3)
        _check(llm, prompts, ref)
    assert llm.engine.executor.attn_backend == _backend(arch, kernels)
    fallbacks = [r for r in caplog.records if "CPU kernels cannot run this model" in r.getMessage()]
    assert len(fallbacks) == (1 if _backend(arch, kernels) != kernels else 0)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3"])
def test_parity_under_preemption(models: dict, arch: str) -> None:
    d, prompts, ref = models[arch]
    # 24 blocks x 16 tokens: the longest request (312 tokens, 20 blocks) fits alone, not beside others
    llm = LLM(str(d), dtype="float32", max_num_seqs=4, num_kv_blocks=24)
    _check(llm, prompts, ref)
    assert llm.engine.scheduler.num_preemptions > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_parity_chunked_prefill(models: dict, arch: str) -> None:
    d, prompts, ref = models[arch]
    llm = LLM(str(d), dtype="float32", max_num_seqs=5, max_num_batched_tokens=37)
    _check(llm, prompts, ref)
    assert any(r.phase == "mixed" for r in llm.engine.step_records), "chunks never shared a step with decodes"


@pytest.mark.parametrize(("arch", "prefix_caching"), [("qwen3", True), ("qwen3", False), ("gemma3", True)])
def test_parity_prefix_caching(models: dict, arch: str, prefix_caching: bool) -> None:
    d, prompts, ref = models[arch]
    llm = LLM(str(d), dtype="float32", max_num_seqs=4, enable_prefix_caching=prefix_caching)
    _check(llm, prompts, ref)  # long prompts share their first 15..129 tokens
    _check(llm, prompts, ref)  # and the second round finds all of them cached
    stats = llm.engine.block_manager.stats
    if prefix_caching:
        assert stats.hits > 0
    else:
        assert stats.hits == 0


@pytest.mark.parametrize("kernels", CPU_KERNELS)
@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_sliding_window_shorter_than_prompt(
    models: dict, arch: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mistral: every layer slides; Gemma 3: local (sliding) layers between global ones."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, ref = models[arch]
    llm = LLM(str(d), dtype="float32", max_num_seqs=4, max_num_batched_tokens=50)
    windows = llm.engine.model_config.layer_windows
    slides = [w for w in windows if w is not None]
    assert slides and all(w < max(map(len, prompts)) for w in slides)
    assert (None in windows) == (arch == "gemma3")
    _check(llm, prompts, ref)


def _hf_logprobs(
    model_dir: Path, ids: list[int], n_prompt: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """transformers' log-probabilities of each next token after the prompt (teacher-forced), the model
    run in ``dtype``."""
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)[n_prompt - 1 : len(ids) - 1]  # (n_out, vocab)


# The reference each bf16 run is held to. Gemma 3's tiny model attends sharply (its (1 + w) q/k norms
# scale by ~2), so bf16 rounding moves its logprobs by up to ~0.45 in transformers' own bf16 run: it is
# held to that run, not to float32.
BF16_REFERENCE = {"llama": torch.float32, "qwen3": torch.float32, "gemma3": torch.bfloat16}


@pytest.mark.parametrize("kernels", CPU_KERNELS)
@pytest.mark.parametrize("arch", sorted(BF16_REFERENCE))
def test_bfloat16_path_stays_close_to_float32_reference(
    models: dict, arch: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bf16 on CPU (oneDNN-packed linears, batched decode attention): each greedy pick is a top choice
    of the reference (transformers in float32, or for gemma3 in bf16) and its logprob is within bf16
    rounding of the reference's."""
    monkeypatch.setenv("GLASSBOX_CPU_KERNELS", kernels)
    d, prompts, _ = models[arch]
    llm = LLM(str(d), dtype="bfloat16", max_num_seqs=4)
    assert llm.engine.executor.attn_backend == _backend(arch, kernels)
    assert llm.engine.executor.packed > 0 or not packing_available(torch.bfloat16)
    outs = llm.generate(prompts[:6], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0))
    for prompt, out in zip(prompts[:6], outs, strict=True):
        ref = _hf_logprobs(d, prompt + out.token_ids, len(prompt), BF16_REFERENCE[arch])
        assert out.logprobs is not None
        for j, t in enumerate(out.token_ids):
            assert ref[j, t] >= ref[j].max() - 0.15, f"token {j}: bf16 pick is not a top choice"
            assert abs(out.logprobs[j][t] - float(ref[j, t])) < 0.15
    llm.engine.check_integrity()
