"""OpenAI API details on a real `glassbox serve` process (issue 18, item 4): logprobs as OpenAI and vLLM
shape them, system_fingerprint, the stream's closing chunks, validation and error codes, /tokenize's chat
options, logit_bias, echo, CORS, and the prompt-token metrics under chunked prefill and prefix caching.

The server is the one test_server.py uses (server_harness.shared_server): a 32-token step budget, so
that a 70-token prompt is prefilled in chunks, and CORS on for one origin."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import (  # noqa: F401  (fixtures)
    MAX_MODEL_LEN,
    MODEL_NAME,
    ORIGIN,
    STEP_BUDGET,
    ServerProcess,
    metric_value,
    sse_events,
    tiny_model,
)

VOCAB = 512  # the tiny model's
CHAT = [{"role": "user", "content": "Tell me about cats."}]
LONG_PROMPT = [(7 * i) % 400 + 20 for i in range(70)]  # 70 token ids: three prefill chunks


@pytest.fixture(scope="module")
def server(shared_server: ServerProcess) -> ServerProcess:
    return shared_server


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def _events(http: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with http.stream("POST", path, json={**body, "stream": True}) as r:
        assert r.status_code == 200, r.read()
        events = sse_events(r.iter_lines())
    assert events[-1] == "[DONE]"
    return [e for e in events if isinstance(e, dict)]


# -- logprobs ---------------------------------------------------------------------------------------------


def test_completion_top_logprobs_hold_the_sampled_token(client: openai.OpenAI) -> None:
    """OpenAI (and vLLM): up to logprobs + 1 entries, the sampled token always among them; 0 gives it alone."""
    kw: dict[str, Any] = dict(model=MODEL_NAME, prompt="Once", max_tokens=8, temperature=2.0, seed=11)
    zero = client.completions.create(**kw, logprobs=0).choices[0].logprobs
    assert zero is not None and zero.top_logprobs is not None
    for token, lp, top in zip(zero.tokens, zero.token_logprobs, zero.top_logprobs, strict=True):
        assert top == {token: pytest.approx(lp)}
    two = client.completions.create(**kw, logprobs=2).choices[0].logprobs
    assert two is not None and two.tokens == zero.tokens  # the same seed draws the same tokens
    outside = 0
    for token, lp, top in zip(two.tokens, two.token_logprobs, two.top_logprobs, strict=True):
        assert token in top and 2 <= len(top) <= 3
        if "\ufffd" not in token:  # (token ids with the same text share one key: it keeps the best value)
            assert top[token] == pytest.approx(lp)
        best_two = sorted(top.values(), reverse=True)[:2]
        outside += lp < best_two[-1]
        if "\ufffd" not in token:  # a third entry only for a sampled token outside the best 2 (a partial
            assert len(top) == 3 or lp >= best_two[-1]  # UTF-8 token's key may be a top token's too)
    assert outside > 0  # at temperature 2 some draws fall outside the two most likely


def test_chat_top_logprobs_are_the_k_most_likely(client: openai.OpenAI) -> None:
    """OpenAI's chat top_logprobs: the k most likely tokens, whether or not the sampled one is among them."""
    r = client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, max_tokens=8, temperature=2.0, seed=5, logprobs=True, top_logprobs=1
    )
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(len(t.top_logprobs) == 1 for t in content)
    assert all(t.logprob <= t.top_logprobs[0].logprob + 1e-6 for t in content)
    assert any(t.logprob < t.top_logprobs[0].logprob - 1e-6 for t in content)


# -- metrics ----------------------------------------------------------------------------------------------


def _wait_metrics(http: httpx.Client, generation_total: float) -> str:
    deadline = time.monotonic() + 5
    while True:
        text = http.get("/metrics").text
        if metric_value(text, "glassbox:generation_tokens_total") >= generation_total:
            return text
        assert time.monotonic() < deadline, "the metrics did not catch up"
        time.sleep(0.02)


def test_prompt_tokens_count_cache_hits_and_every_chunk(client: openai.OpenAI, http: httpx.Client) -> None:
    """prompt_tokens_total: every prompt token once per sequence, prefilled in chunks or served by the prefix
    cache (vLLM's meaning); prompt_tokens_cached_total the latter; iteration_tokens_total the tokens each step
    computed, never over the step budget."""
    before = http.get("/metrics").text

    def value(text: str, name: str, labels: str = "") -> float:
        return metric_value(text, "glassbox:" + name, labels)

    computed = 0
    cached = []
    for _ in range(2):
        r = client.completions.create(
            model=MODEL_NAME, prompt=LONG_PROMPT, max_tokens=2, temperature=0, extra_body={"ignore_eos": True}
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        cached.append(r.usage.prompt_tokens_details.cached_tokens or 0)
        computed += len(LONG_PROMPT) - cached[-1] + 1  # the prompt's uncached part, then one decode step
    assert cached[0] == 0 and cached[1] > 0
    after = _wait_metrics(http, value(before, "generation_tokens_total") + 4)
    assert value(after, "prompt_tokens_total") - value(before, "prompt_tokens_total") == 2 * len(LONG_PROMPT)
    assert (
        value(after, "prompt_tokens_cached_total") - value(before, "prompt_tokens_cached_total") == cached[1]
    )
    steps = value(after, "iteration_tokens_total_count") - value(before, "iteration_tokens_total_count")
    assert steps == 3 + 1 + 1 + 1  # 32 + 32 + 6 prompt tokens, a decode step; 6 uncached, a decode step
    within = f'le="{float(STEP_BUDGET)}"'
    assert (
        value(after, "iteration_tokens_total_bucket", within)
        - value(before, "iteration_tokens_total_bucket", within)
        == steps
    )
    tokens = value(after, "iteration_tokens_total_sum") - value(before, "iteration_tokens_total_sum")
    assert tokens == computed


# -- response shape ---------------------------------------------------------------------------------------


def test_system_fingerprint_everywhere_and_stable(client: openai.OpenAI, http: httpx.Client) -> None:
    a = client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2)
    b = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=2)
    fp = a.system_fingerprint
    assert fp and fp.startswith("fp_") and b.system_fingerprint == fp
    chunks = _events(http, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert {c["system_fingerprint"] for c in chunks} == {fp}


def test_system_fingerprint_follows_version_model_and_settings() -> None:
    from glassbox.config import EngineConfig
    from glassbox.server.state import system_fingerprint

    base = system_fingerprint("model a", "cpu", EngineConfig(model="a"), "1.0")
    assert base == system_fingerprint("model a", "cpu", EngineConfig(model="a"), "1.0")
    for other in (
        system_fingerprint("model a", "cpu", EngineConfig(model="a"), "1.1"),
        system_fingerprint("model b", "cpu", EngineConfig(model="a"), "1.0"),
        system_fingerprint("model a", "cuda:0", EngineConfig(model="a"), "1.0"),
        system_fingerprint("model a", "cpu", EngineConfig(model="a", kv_cache_dtype="int8"), "1.0"),
    ):
        assert other != base and other.startswith("fp_")


def test_finish_reason_comes_in_its_own_chunk(http: httpx.Client) -> None:
    """As OpenAI streams: content chunks carry finish_reason null; then one chunk per choice with an empty
    delta (completions: empty text) and the reason; then, when asked, the usage chunk; usage is null before."""
    body = {
        "messages": CHAT,
        "max_tokens": 5,
        "n": 2,
        "temperature": 0,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    chunks = _events(http, "/v1/chat/completions", body)
    assert all("usage" in c and c["usage"] is None for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10
    closing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] is not None]
    assert sorted(c["choices"][0]["index"] for c in closing) == [0, 1]
    for c in closing:
        assert c["choices"][0]["delta"] == {} and c["choices"][0]["finish_reason"] == "length"
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert content and all(c["choices"][0]["finish_reason"] is None for c in content)
    text_chunks = _events(http, "/v1/completions", {"prompt": "hi", "max_tokens": 4, "ignore_eos": True})
    assert text_chunks[-1]["choices"][0]["text"] == "" and text_chunks[-1]["choices"][0]["finish_reason"]
    assert all(c["choices"][0]["finish_reason"] is None for c in text_chunks[:-1])


# -- validation and error codes ---------------------------------------------------------------------------


RAW_BAD: list[tuple[str, str, int, str | None, str | None]] = [
    ("/v1/completions", '{"prompt": "hi", "stop_token_ids": [512]}', 400, "stop_token_ids", "invalid_value"),
    ("/v1/completions", '{"prompt": "hi", "seed": 1e30}', 400, "seed", "invalid_type"),  # strict: a decimal
    (
        "/v1/completions",
        '{"prompt": "hi", "seed": 9223372036854775808}',
        400,
        "seed",
        "integer_above_max_value",
    ),
    (
        "/v1/completions",
        '{"prompt": "hi", "seed": -9223372036854775809}',
        400,
        "seed",
        "integer_below_min_value",
    ),
    ("/v1/completions", '{"prompt": "hi \\ud800"}', 400, "prompt", "invalid_value"),
    ("/v1/completions", '{"prompt": ["ok", "\\udfff x"]}', 400, "prompt[1]", "invalid_value"),
    ("/v1/completions", '{"prompt": "hi", "stop": ["\\ud83d"]}', 400, "stop[0]", "invalid_value"),
    (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "a\\ud800"}]}',
        400,
        "messages[0].content",
        "invalid_value",
    ),
    (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "a", "x": "\\ud800"}]}',
        400,
        "messages[0].x",
        "invalid_value",
    ),
    ("/tokenize", '{"prompt": "\\ud800"}', 400, "prompt", "invalid_value"),
    ("/v1/completions", '{"prompt": "hi", "logit_bias": {"five": 1}}', 400, "logit_bias", "invalid_value"),
    ("/v1/completions", '{"prompt": "hi", "logit_bias": {"5": 100.5}}', 400, "logit_bias", "invalid_value"),
    ("/v1/completions", '{"prompt": "hi", "logit_bias": {"512": 1}}', 400, "logit_bias", "invalid_value"),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 0}', 400, "max_tokens", "invalid_value"),
    ("/v1/completions", '{"prompt": "hi", "model": "gpt-4"}', 404, "model", "model_not_found"),
    (
        "/v1/chat/completions",
        '{"messages": [{"role": "user", "content": "a"}], "model": "x"}',
        404,
        "model",
        "model_not_found",
    ),
    (
        "/v1/completions",
        '{"prompt": "hi", "max_tokens": ' + str(MAX_MODEL_LEN - 1) + "}",
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    (
        "/v1/completions",
        '{"prompt": [' + ", ".join(["5"] * MAX_MODEL_LEN) + "]}",
        400,
        "prompt",
        "context_length_exceeded",
    ),
    (
        "/tokenize",
        '{"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}',
        400,
        "tools[0]",
        "invalid_value",
    ),
    (
        "/tokenize",
        '{"messages": [{"role": "user", "content": "a"}], "add_generation_prompt": true, "continue_final_message": true}',
        400,
        "continue_final_message",
        "invalid_value",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param", "code"), RAW_BAD, ids=[f"{i}" for i in range(len(RAW_BAD))]
)
def test_bad_input_names_param_and_code(
    http: httpx.Client, path: str, body: str, status: int, param: str | None, code: str | None
) -> None:
    r = http.post(path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and (err["param"], err["code"]) == (param, code), err


def test_seed_at_the_int64_edges_is_accepted(http: httpx.Client) -> None:
    for seed in (2**63 - 1, -(2**63)):
        r = http.post(
            "/v1/completions", json={"prompt": "hi", "max_tokens": 2, "seed": seed, "temperature": 1}
        )
        assert r.status_code == 200, r.text


def test_openai_client_sees_model_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=CHAT)  # type: ignore[arg-type]
    assert e.value.code == "model_not_found" and e.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e2:
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=MAX_MODEL_LEN)
    assert e2.value.code == "context_length_exceeded"


# -- /tokenize --------------------------------------------------------------------------------------------


def test_tokenize_chat_options_match_transformers(tiny_model: Path, http: httpx.Client) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tiny_model)
    chat = [*CHAT, {"role": "assistant", "content": "Cats are"}]
    for options in (
        {"add_generation_prompt": True},
        {"add_generation_prompt": False},
        {"continue_final_message": True},  # implies add_generation_prompt false when that is not given
        {"continue_final_message": True, "add_generation_prompt": False},
    ):
        r = http.post("/tokenize", json={"messages": chat, "return_token_strs": True, **options})
        assert r.status_code == 200, r.text
        text = hf.apply_chat_template(
            chat,
            tokenize=False,
            add_generation_prompt=options.get("add_generation_prompt", False),
            continue_final_message=options.get("continue_final_message", False),
        )
        ids = hf.encode(text, add_special_tokens=False)
        assert r.json()["tokens"] == ids, options
        assert r.json()["token_strs"] == hf.convert_ids_to_tokens(ids)
    plain = http.post("/tokenize", json={"prompt": "Hello cats"}).json()
    assert "token_strs" not in plain or plain["token_strs"] is None
    cont = http.post(
        "/v1/chat/completions",
        json={
            "messages": chat,
            "continue_final_message": True,
            "add_generation_prompt": False,
            "max_tokens": 1,
        },
    ).json()
    assert cont["usage"]["prompt_tokens"] == len(
        hf.encode(
            hf.apply_chat_template(chat, tokenize=False, continue_final_message=True),
            add_special_tokens=False,
        )
    )


# -- logit_bias and echo ----------------------------------------------------------------------------------


def test_logit_bias_steers_greedy_and_sampled_rows(
    tiny_model: Path,  # noqa: F811
    client: openai.OpenAI,
    http: httpx.Client,
) -> None:
    from transformers import AutoTokenizer

    plain = (
        client.completions.create(model=MODEL_NAME, prompt="Once", max_tokens=1, temperature=0, logprobs=2)
        .choices[0]
        .logprobs
    )
    assert plain is not None and plain.top_logprobs is not None
    (first, _), (second, _) = sorted(plain.top_logprobs[0].items(), key=lambda kv: -kv[1])[:2]
    hf = AutoTokenizer.from_pretrained(tiny_model)
    first_ids = [i for i in range(VOCAB) if hf.decode([i]) == first]
    assert first_ids
    banned = client.completions.create(
        model=MODEL_NAME,
        prompt="Once",
        max_tokens=1,
        temperature=0,
        logit_bias={str(i): -100 for i in first_ids},
    )
    assert banned.choices[0].text == second  # greedy honors the bias: the runner-up wins
    forced = 300
    forced_text = http.post("/detokenize", json={"tokens": [forced]}).json()["prompt"]
    for top_k, temperature in ((None, 0.0), (5, 1.0)):
        r = client.completions.create(
            model=MODEL_NAME,
            prompt="Once",
            max_tokens=4,
            temperature=temperature,
            seed=3,
            logit_bias={str(forced): 100},
            extra_body={"ignore_eos": True, "top_k": top_k},
        )
        assert r.choices[0].text == forced_text * 4, (top_k, temperature)
    chat = client.chat.completions.create(
        model=MODEL_NAME, messages=CHAT, max_tokens=3, temperature=0, logit_bias={str(forced): 100}
    )
    assert chat.choices[0].message.content == forced_text * 3


def test_echo_prepends_the_prompt(client: openai.OpenAI, http: httpx.Client) -> None:
    kw: dict[str, Any] = dict(model=MODEL_NAME, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    plain = client.completions.create(prompt="Once upon", **kw).choices[0].text
    echoed = client.completions.create(prompt="Once upon", echo=True, **kw).choices[0].text
    assert echoed == "Once upon" + plain
    ids = http.post("/tokenize", json={"prompt": "Once upon", "add_special_tokens": False}).json()["tokens"]
    by_ids = client.completions.create(prompt=ids, echo=True, **kw).choices[0].text
    assert by_ids == "Once upon" + client.completions.create(prompt=ids, **kw).choices[0].text
    chunks = _events(
        http,
        "/v1/completions",
        {"prompt": "Once upon", "echo": True, "max_tokens": 4, "temperature": 0, "ignore_eos": True},
    )
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == echoed


# -- CORS -------------------------------------------------------------------------------------------------


def test_cors_allows_only_the_given_origins(http: httpx.Client) -> None:
    preflight = {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    ok = http.options("/v1/chat/completions", headers={"Origin": ORIGIN, **preflight})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in ok.headers["access-control-allow-methods"]
    bad = http.options("/v1/chat/completions", headers={"Origin": "http://evil.example", **preflight})
    assert bad.status_code == 400 and "access-control-allow-origin" not in bad.headers
    r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}, headers={"Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
