"""Prompt logprobs (vLLM's SamplingParams.prompt_logprobs; OpenAI's completions echo with logprobs) against
transformers' log_softmax of the prompt's logits (the float32 tiny random Llama, save_pretrained), through
chunked prefill, a second identical request (which the prefix cache would serve), n > 1 and preemption in
the middle of a prefill; then the HTTP shapes on a real `glassbox serve` (the server test_server.py shares:
a 32-token step budget, so the 70-token prompt is prefilled in three chunks)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch
from server_harness import (  # noqa: F401  (fixtures)
    MODEL_NAME,
    ServerProcess,
    sse_events,
    tiny_model,
)

from glassbox.llm import LLM
from glassbox.outputs import RequestOutput
from glassbox.sampling_params import SamplingParams

LONG_PROMPT = [
    (11 * i) % 400 + 30 for i in range(70)
]  # token ids (not test_server_api.py's: its cache counts)
TOL = 1e-4


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> Any:  # noqa: F811
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()


def _ref(reference: Any, prompt: list[int]) -> torch.Tensor:
    """(len(prompt), vocab): row i is the log-distribution of token i + 1."""
    with torch.no_grad():
        return reference(torch.tensor([prompt])).logits[0].float().log_softmax(dim=-1)


def _check(out: RequestOutput, prompt: list[int], ref: torch.Tensor, k: int) -> None:
    lps, ranks = out.prompt_logprobs, out.prompt_ranks
    assert lps is not None and ranks is not None
    assert len(lps) == len(ranks) == len(prompt) and lps[0] is None and ranks[0] is None
    for i in range(1, len(prompt)):
        row, entry, token = ref[i - 1], lps[i], prompt[i]
        assert entry is not None
        assert entry[token] == pytest.approx(row[token].item(), abs=TOL), i
        assert ranks[i] == int((row >= row[token]).sum()), i
        top = row.topk(k).indices.tolist() if k else []
        assert set(top) <= set(entry) and set(entry) <= {*top, token}, i
        for t, v in entry.items():
            assert v == pytest.approx(row[t].item(), abs=TOL)


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(5, 500, (length,), generator=g).tolist() for _ in range(n)]


def test_prompt_logprobs_match_transformers_through_chunks_and_the_prefix_cache(
    tiny_model: Path,  # noqa: F811
    reference: Any,
) -> None:
    llm = LLM(str(tiny_model), dtype="float32", device="cpu", max_num_batched_tokens=16, block_size=8)
    a, b = _prompts(2, 45, seed=0)
    b = b[:30]
    sp = SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=3)
    plain_sp = SamplingParams(max_tokens=2, temperature=0)
    first = llm.generate([a, b, a[:20]], [sp, sp, plain_sp])  # chunks of 16 shared with a plain prompt
    assert first[2].prompt_logprobs is None
    again = llm.generate([a], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=0))[0]
    plain = llm.generate([a], plain_sp)[0]  # the same prompt without prompt logprobs: served from the cache
    assert again.metrics is not None and again.metrics.cached_prompt_tokens == 0
    assert plain.metrics is not None and plain.metrics.cached_prompt_tokens == 40
    ref_a, ref_b = _ref(reference, a), _ref(reference, b)
    _check(first[0], a, ref_a, 3)
    _check(first[1], b, ref_b, 3)
    _check(again, a, ref_a, 0)
    assert again.token_ids == first[0].token_ids == plain.token_ids
    two = llm.generate([b], SamplingParams(n=2, max_tokens=3, temperature=1.0, seed=5, prompt_logprobs=1))[0]
    _check(two, b, ref_b, 1)
    llm.engine.check_integrity()


def test_prompt_logprobs_survive_preemption_mid_prefill(tiny_model: Path, reference: Any) -> None:  # noqa: F811
    # 14 blocks of 8 tokens for three 40-token prompts growing to 56: the newest is preempted, also while
    # its prompt is half computed (its recomputation must not repeat the entries it has)
    llm = LLM(
        str(tiny_model),
        dtype="float32",
        device="cpu",
        max_num_batched_tokens=16,
        block_size=8,
        num_kv_blocks=14,
    )
    prompts = _prompts(3, 40, seed=1)
    sp = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, prompt_logprobs=2)
    outs = llm.generate(prompts, sp)
    assert llm.engine.scheduler.num_preemptions >= 2
    assert sum(o.metrics.preemptions for o in outs if o.metrics is not None) >= 2
    for out, prompt in zip(outs, prompts, strict=True):
        _check(out, prompt, _ref(reference, prompt), 2)


def test_prompt_logprobs_validation() -> None:
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)


# -- HTTP -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(shared_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{shared_server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(shared_server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=shared_server.url, timeout=60) as c:
        yield c


def _offsets_follow_tokens(lp: Any) -> None:
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    for i in range(1, len(lp.tokens)):
        assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1])


def test_echo_with_logprobs_as_openai_shapes_them(
    client: openai.OpenAI,
    reference: Any,
) -> None:
    kw: dict[str, Any] = dict(model=MODEL_NAME, max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    n = len(LONG_PROMPT)
    echoed = client.completions.create(prompt=LONG_PROMPT, echo=True, logprobs=2, **kw)
    again = client.completions.create(prompt=LONG_PROMPT, echo=True, logprobs=2, **kw)  # would hit the cache
    alone = client.completions.create(prompt=LONG_PROMPT, logprobs=2, **kw)  # no echo: served by the cache
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert alone.usage is not None and alone.usage.prompt_tokens_details is not None
    assert alone.usage.prompt_tokens_details.cached_tokens > 0
    lp, lp2, gen = echoed.choices[0].logprobs, again.choices[0].logprobs, alone.choices[0].logprobs
    assert lp is not None and lp2 is not None and gen is not None
    assert lp.top_logprobs is not None and lp.token_logprobs is not None and lp.tokens is not None
    assert len(lp.tokens) == n + 3
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # nothing precedes the first token
    ref = _ref(reference, LONG_PROMPT)
    for i in range(1, n):
        assert lp.token_logprobs[i] == pytest.approx(ref[i - 1, LONG_PROMPT[i]].item(), abs=TOL)
        top = lp.top_logprobs[i]
        assert top is not None and lp.tokens[i] in top and 1 <= len(top) <= 3
    assert lp.tokens[n:] == gen.tokens and lp.token_logprobs[n:] == pytest.approx(gen.token_logprobs, abs=TOL)
    assert gen.top_logprobs is not None
    for t, g in zip(lp.top_logprobs[n:], gen.top_logprobs, strict=True):
        assert t is not None and g is not None and t.keys() == g.keys()
    assert lp2.token_logprobs == pytest.approx(lp.token_logprobs, abs=TOL) and lp2.tokens == lp.tokens
    assert echoed.choices[0].text.endswith(alone.choices[0].text)
    # a text prompt: the offsets index the returned text (prompt, then completion)
    text = client.completions.create(prompt="Once upon a time", echo=True, logprobs=1, **kw).choices[0]
    assert text.logprobs is not None and text.logprobs.tokens is not None
    _offsets_follow_tokens(text.logprobs)
    assert "".join(text.logprobs.tokens) == text.text and text.text.startswith("Once upon a time")


def test_echo_logprobs_streamed_and_prompt_only(client: openai.OpenAI, http: httpx.Client) -> None:
    body = {"model": MODEL_NAME, "prompt": "Once upon a time", "echo": True, "logprobs": 1, "temperature": 0}
    whole = http.post("/v1/completions", json={**body, "max_tokens": 4, "ignore_eos": True}).json()
    with http.stream(
        "POST", "/v1/completions", json={**body, "max_tokens": 4, "ignore_eos": True, "stream": True}
    ) as r:
        events = [e for e in sse_events(r.iter_lines()) if isinstance(e, dict)]
    choices = [c for e in events for c in e["choices"]]  # type: ignore[attr-defined]
    joined: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for c in choices:
        for key in joined:
            joined[key] += (c["logprobs"] or {}).get(key, [])
    expect = whole["choices"][0]
    assert "".join(c["text"] for c in choices) == expect["text"]
    assert joined["tokens"] == expect["logprobs"]["tokens"]
    assert joined["text_offset"] == expect["logprobs"]["text_offset"]
    assert joined["token_logprobs"] == pytest.approx(expect["logprobs"]["token_logprobs"], abs=TOL)
    assert choices[-1]["finish_reason"] == "length" and choices[-1]["text"] == ""
    # max_tokens 0 (OpenAI's scoring call): the prompt and its logprobs, no completion
    scored = client.completions.create(
        model=MODEL_NAME, prompt="Once upon a time", echo=True, logprobs=0, max_tokens=0
    )
    choice = scored.choices[0]
    assert choice.text == "Once upon a time" and choice.finish_reason == "length"
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert choice.logprobs.tokens == expect["logprobs"]["tokens"][: len(choice.logprobs.tokens)]
    assert scored.usage is not None and scored.usage.completion_tokens == 0
    assert len(choice.logprobs.tokens) == scored.usage.prompt_tokens
    assert choice.logprobs.token_logprobs[1:] == pytest.approx(
        expect["logprobs"]["token_logprobs"][1 : scored.usage.prompt_tokens], abs=TOL
    )


def test_vllm_prompt_logprobs_field(client: openai.OpenAI, reference: Any) -> None:
    r = client.completions.create(
        model=MODEL_NAME, prompt=LONG_PROMPT, max_tokens=1, extra_body={"prompt_logprobs": 2}
    )
    plp = r.choices[0].model_extra["prompt_logprobs"]  # type: ignore[index]
    ref = _ref(reference, LONG_PROMPT)
    assert len(plp) == len(LONG_PROMPT) and plp[0] is None
    for i in range(1, len(LONG_PROMPT)):
        entry = {int(t): v for t, v in plp[i].items()}
        mine = entry[LONG_PROMPT[i]]
        assert mine["logprob"] == pytest.approx(ref[i - 1, LONG_PROMPT[i]].item(), abs=TOL)
        assert mine["rank"] == int((ref[i - 1] >= ref[i - 1, LONG_PROMPT[i]]).sum())
        assert sorted(v["rank"] for t, v in entry.items() if v["rank"] <= 2) == [1, 2]
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=1,
        extra_body={"prompt_logprobs": 0},
    )
    plp = chat.model_extra["prompt_logprobs"]  # type: ignore[index]
    assert chat.usage is not None and len(plp) == chat.usage.prompt_tokens and plp[0] is None
    assert all(len(e) == 1 for e in plp[1:])


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
        ({"prompt": "hi", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
        ({"prompt": "hi", "prompt_logprobs": 21}, "prompt_logprobs"),
        ({"prompt": "hi", "echo": True, "logprobs": 21}, "logprobs"),
    ],
)
def test_bad_prompt_logprob_requests_are_400(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    r = http.post("/v1/completions", json={"model": MODEL_NAME, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
