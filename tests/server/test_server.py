"""The OpenAI-compatible server, end to end: a real `glassbox serve` process on a tiny model, driven by
the official openai client and raw httpx. No mocks."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from server_harness import (  # noqa: F401  (fixtures)
    MAX_MODEL_LEN,
    MAX_NUM_SEQS,
    MODEL_NAME,
    NUM_KV_BLOCKS,
    ServerProcess,
    metric_value,
    server_factory,
    sse_events,
    start_server,
    tiny_model,
)

from glassbox.server.protocol import ChatCompletionResponse, CompletionResponse

ANATOMY_KEYS = {
    "queue_s",
    "prefill_s",
    "ttft_s",
    "decode_s",
    "e2e_s",
    "prompt_tokens",
    "cached_prompt_tokens",
    "output_tokens",
    "prefill_tok_s",
    "decode_tok_s",
}


@pytest.fixture(scope="module")
def server(shared_server: ServerProcess) -> ServerProcess:
    return shared_server  # (test_server_api.py uses it too)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def stream_lines(http: httpx.Client, path: str, body: dict[str, Any]) -> list[str]:
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(r.iter_lines())


CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Say something about cats."}]


# -- basics ----------------------------------------------------------------------------------------------


def test_models_health_tokenize(client: openai.OpenAI, http: httpx.Client) -> None:
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert http.get(f"/v1/models/{MODEL_NAME}").json()["max_model_len"] == MAX_MODEL_LEN
    health = http.get("/health").json()
    assert (
        health["status"] == "ok"
        and health["kv_cache_free_blocks"] == health["kv_cache_total_blocks"] == NUM_KV_BLOCKS
    )
    ids = http.post("/tokenize", json={"prompt": "Hello world"}).json()
    assert ids["count"] == len(ids["tokens"]) > 0 and ids["max_model_len"] == MAX_MODEL_LEN
    text = http.post("/detokenize", json={"tokens": ids["tokens"]}).json()["prompt"]
    assert text.endswith("Hello world")
    chat_ids = http.post("/tokenize", json={"messages": CHAT}).json()
    assert chat_ids["count"] > ids["count"]
    assert http.get("/openapi.json").json()["paths"].keys() >= {"/v1/completions", "/v1/chat/completions"}


def test_completion_stream_equals_nonstream(client: openai.OpenAI, http: httpx.Client) -> None:
    body = {
        "model": MODEL_NAME,
        "prompt": "Once upon a time",
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
    }
    full = client.completions.create(
        **{k: v for k, v in body.items() if k != "ignore_eos"}, extra_body={"ignore_eos": True}
    )
    CompletionResponse.model_validate(full.model_dump())
    assert full.choices[0].finish_reason == "length" and full.usage is not None
    assert full.usage.completion_tokens == 24
    lines = stream_lines(http, "/v1/completions", {**body, "stream": True})
    events = sse_events(iter(lines))
    assert [line for line in lines if line][-1] == "data: [DONE]" and events.count("[DONE]") == 1
    chunks = [e for e in events if isinstance(e, dict)]
    assert "".join(c["choices"][0]["text"] for c in chunks) == full.choices[0].text
    finishing = [c for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert len(finishing) == 1 and finishing[0]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1] is finishing[0] and ANATOMY_KEYS <= set(chunks[-1]["metrics"])
    assert all("metrics" not in c for c in chunks[:-1])


def test_chat_stream_equals_nonstream_with_usage(client: openai.OpenAI) -> None:
    kw: dict[str, Any] = dict(
        model=MODEL_NAME, messages=CHAT, max_tokens=20, temperature=0, extra_body={"ignore_eos": True}
    )
    full = client.chat.completions.create(**kw)
    ChatCompletionResponse.model_validate(full.model_dump())
    assert full.choices[0].message.role == "assistant" and full.choices[0].finish_reason == "length"
    u = full.usage
    assert (
        u is not None
        and u.prompt_tokens + u.completion_tokens == u.total_tokens
        and u.completion_tokens == 20
    )
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 1
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.model_dump(exclude={"prompt_tokens_details"}) == u.model_dump(
        exclude={"prompt_tokens_details"}
    )
    assert all(c.usage is None for c in chunks[:-1])
    metrics = last.model_extra["metrics"]  # type: ignore[index]
    assert metrics["output_tokens"] == 20 and metrics["prompt_tokens"] == u.prompt_tokens


def test_nonstream_metrics_anatomy(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL_NAME,
        prompt="The anatomy of a request",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    m = r.model_extra["metrics"]  # type: ignore[index]
    assert ANATOMY_KEYS <= set(m)
    assert (
        m["prompt_tokens"] == r.usage.prompt_tokens and m["output_tokens"] == r.usage.completion_tokens == 12
    )
    assert 0 <= m["queue_s"] <= m["ttft_s"] <= m["e2e_s"] and m["prefill_s"] > 0 and m["decode_s"] > 0
    assert m["ttft_s"] + m["decode_s"] == pytest.approx(m["e2e_s"], abs=1e-3)
    assert m["decode_tok_s"] > 0 and m["prefill_tok_s"] > 0


def test_n3_indices(client: openai.OpenAI, http: httpx.Client) -> None:
    r = client.completions.create(
        model=MODEL_NAME, prompt="Pick a word:", max_tokens=8, n=3, temperature=1.0, seed=7
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert r.usage.completion_tokens == r.model_extra["metrics"]["output_tokens"]  # type: ignore[index]
    chat = client.chat.completions.create(model=MODEL_NAME, messages=CHAT, max_tokens=6, n=3, seed=3)
    assert sorted(c.index for c in chat.choices) == [0, 1, 2]
    events = sse_events(
        iter(
            stream_lines(
                http,
                "/v1/chat/completions",
                {"messages": CHAT, "max_tokens": 6, "n": 3, "seed": 3, "stream": True},
            )
        )
    )
    finish = [
        c["choices"][0]["index"]
        for c in events
        if isinstance(c, dict) and c["choices"] and c["choices"][0]["finish_reason"]
    ]
    assert sorted(finish) == [0, 1, 2]
    streamed = {i: "" for i in range(3)}
    for c in events:
        if isinstance(c, dict) and c["choices"]:
            streamed[c["choices"][0]["index"]] += c["choices"][0]["delta"].get("content", "")
    assert streamed == {c.index: c.message.content for c in chat.choices}  # same seed, same samples


def test_batch_prompts(client: openai.OpenAI, http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"prompt": "Hello"}).json()["tokens"]
    r = client.completions.create(
        model=MODEL_NAME, prompt=["Hello", "Goodbye"], n=2, max_tokens=5, temperature=0
    )
    assert sorted(c.index for c in r.choices) == [0, 1, 2, 3]
    by_ids = client.completions.create(model=MODEL_NAME, prompt=[ids, ids], max_tokens=5, temperature=0)
    assert [c.text for c in by_ids.choices] == [r.choices[0].text, r.choices[0].text]
    assert by_ids.usage.prompt_tokens == 2 * len(ids)


def test_stop_strings_cut_exactly(client: openai.OpenAI, http: httpx.Client) -> None:
    base: dict[str, Any] = dict(
        model=MODEL_NAME, prompt="A story:", max_tokens=40, temperature=0, extra_body={"ignore_eos": True}
    )
    text = client.completions.create(**base).choices[0].text
    candidates = [
        i for i in range(3, len(text) - 3) if "\ufffd" not in text[i : i + 3] and text[i : i + 3].strip()
    ]
    assert candidates, text
    stop = text[candidates[0] : candidates[0] + 3]
    cut = text.index(stop)
    r = client.completions.create(**base, stop=[stop])
    assert r.choices[0].text == text[:cut] and r.choices[0].finish_reason == "stop"
    assert r.model_extra is not None
    kept = client.completions.create(
        **{**base, "extra_body": {"ignore_eos": True, "include_stop_str_in_output": True}}, stop=stop
    )
    assert kept.choices[0].text == text[: cut + len(stop)]
    events = sse_events(
        iter(
            stream_lines(
                http,
                "/v1/completions",
                {
                    "prompt": "A story:",
                    "max_tokens": 40,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stop": stop,
                    "stream": True,
                },
            )
        )
    )
    assert "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict)) == text[:cut]


def test_logprobs_formats(client: openai.OpenAI) -> None:
    r = client.completions.create(
        model=MODEL_NAME,
        prompt="Hello",
        max_tokens=6,
        temperature=0,
        logprobs=3,
        extra_body={"ignore_eos": True},
    )
    lp = r.choices[0].logprobs
    assert lp is not None and len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    joined = "".join(lp.tokens)  # a token holding part of a UTF-8 character shows as U+FFFD on its own
    assert joined == r.choices[0].text or "\ufffd" in joined
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs, strict=True):
        assert chosen <= 0 and 1 <= len(top) <= 3 and max(top.values()) == pytest.approx(chosen)  # greedy
    c = client.chat.completions.create(
        model=MODEL_NAME,
        messages=CHAT,
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    content = c.choices[0].logprobs.content
    assert len(content) == 5 and all(len(t.top_logprobs) == 2 and t.bytes is not None for t in content)
    assert content[0].logprob == pytest.approx(content[0].top_logprobs[0].logprob)


# -- bad input: every row is a 4xx with an OpenAI error body, and the server keeps answering ----------------


BAD: list[tuple[str, Any, int, str | None]] = [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": -0.1}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"prompt": [600]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [5, -1]}, 400, "prompt[1]"),  # the id at fault
    ("/v1/completions", {"prompt": [[5, 6], [10**6]]}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["ok", ""]}, 400, "prompt"),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "min_tokens": 20, "max_tokens": 10}, 400, "min_tokens"),
    ("/v1/completions", {"prompt": "hi", "stop": ["ok", ""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "hi", "stop_token_ids": [-1]}, 400, "stop_token_ids[0]"),
    ("/v1/completions", {"prompt": "hi", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("/v1/completions", {"prompt": "hi", "logit_bias": {"5": -101}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),  # 0 only with echo
    ("/v1/completions", {"prompt": "hi", "model": "no-such-model"}, 404, "model"),
    ("/v1/completions", "{not json", 400, None),
    ("/v1/completions", '{"prompt": "hi", "temperature": NaN}', 400, "temperature"),
    ("/v1/completions", "[1, 2]", 400, None),
    ("/v1/completions", b"\xff\xfe", 400, None),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, None),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 10**9}, 400, "max_tokens"),
    (
        "/v1/chat/completions",
        {"messages": CHAT, "tools": [{"type": "function"}]},
        400,
        "tools[0]",
    ),  # a tool without its function
    ("/v1/chat/completions", {"messages": CHAT, "model": "gpt-4"}, 404, "model"),
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": "a", "messages": CHAT}, 400, "prompt"),
    ("/detokenize", {"tokens": [-5]}, 400, "tokens[0]"),
    ("/detokenize", {"tokens": [10**30]}, 400, "tokens"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"), BAD, ids=[f"{i}-{row[0]}" for i, row in enumerate(BAD)]
)
def test_bad_input_is_4xx(http: httpx.Client, path: str, body: Any, status: int, param: str | None) -> None:
    if isinstance(body, (str, bytes)):
        r = http.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = http.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if body == {"prompt": "hi", "max_tokens": MAX_MODEL_LEN}:
        assert str(MAX_MODEL_LEN) in err["message"]


# the dashboard's data endpoints (GET, read-only): bad query parameters are 400s naming the parameter
DASHBOARD_BAD = [
    ("/dashboard/events?interval=abc", "interval"),
    ("/dashboard/events?interval=0", "interval"),
    ("/dashboard/events?interval=nan", "interval"),
    ("/dashboard/events?interval=inf", "interval"),
    ("/dashboard/events?history=-1", "history"),
    ("/dashboard/events?history=1.5", "history"),
    ("/dashboard/events?history=1&history=2", "history"),
    ("/dashboard/events?since=3", "since"),
    ("/dashboard/plan?prompt_tokens=0", "prompt_tokens"),
    (f"/dashboard/plan?output_tokens={MAX_MODEL_LEN + 1}", "output_tokens"),
    ("/dashboard/plan?concurrency=two", "concurrency"),
    ("/dashboard/plan?interval=1", "interval"),
]


@pytest.mark.parametrize(("url", "param"), DASHBOARD_BAD, ids=[row[0] for row in DASHBOARD_BAD])
def test_dashboard_bad_query_is_400(http: httpx.Client, url: str, param: str) -> None:
    r = http.get(url)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param and err["type"] == "invalid_request_error", err
    unknown = param == "since" or (param == "interval" and url.startswith("/dashboard/plan"))
    assert err["code"] == ("unsupported_parameter" if unknown else "invalid_value"), err


def test_dashboard_data_is_read_only(http: httpx.Client) -> None:
    for path in ("/dashboard/events", "/dashboard/plan"):
        r = http.post(path, json={})
        assert r.status_code == 405, r.text
        assert r.json()["error"]["type"] == "invalid_request_error"


def test_server_answers_after_bad_input(client: openai.OpenAI, http: httpx.Client) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=0)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=CHAT)
    assert (
        http.post("/v1/completions", content="hello", headers={"content-type": "text/plain"}).status_code
        == 400
    )
    assert http.get("/v1/nothing-here").status_code == 404
    assert http.get("/health").status_code == 200
    assert client.completions.create(model=MODEL_NAME, prompt="hi", max_tokens=2).choices[0].finish_reason


# -- load ------------------------------------------------------------------------------------------------


def test_32_concurrent_over_4_slots_all_complete(server: ServerProcess) -> None:
    async def run() -> list[Any]:
        aclient = openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120
        )
        async with aclient:
            return list(
                await asyncio.gather(
                    *(
                        aclient.completions.create(
                            model=MODEL_NAME,
                            prompt=f"Request number {i}",
                            max_tokens=16,
                            temperature=0,
                            extra_body={"ignore_eos": True},
                        )
                        for i in range(32)
                    )
                )
            )

    results = asyncio.run(run())
    assert len(results) == 32
    assert all(r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 16 for r in results)
    queue = [r.model_extra["metrics"]["queue_s"] for r in results]
    assert max(queue) > 0.01, queue  # beyond max-num-seqs, requests waited (and the wait was measured)
    assert server.health()["num_requests_running"] == 0


def _wait_for(predicate: Any, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout} s")


@pytest.fixture(scope="module")
def storm_server(
    tiny_model: Path,  # noqa: F811
    server_factory: list[ServerProcess],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> ServerProcess:
    """Room for requests long enough (~1,000 tokens) that none can finish before its client leaves."""
    s = start_server(
        tiny_model,
        tmp_path_factory.mktemp("storm-logs"),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--max-model-len",
        "1024",
        "--num-kv-blocks",
        "300",
    )
    server_factory.append(s)
    return s


def test_disconnect_storm_frees_everything(storm_server: ServerProcess) -> None:
    server = storm_server
    http = httpx.Client(base_url=server.url, timeout=30)
    start = server.health()
    free0 = start["kv_cache_free_blocks"]
    body = {"prompt": "Tell me a very long story", "max_tokens": 960, "ignore_eos": True, "stream": True}
    clients = [httpx.Client(base_url=server.url, timeout=60) for _ in range(16)]
    streams = []
    for i, c in enumerate(clients):
        path = "/v1/chat/completions" if i % 2 else "/v1/completions"
        req = {**body, "messages": CHAT} if i % 2 else body
        if i % 2:
            req.pop("prompt")
        s = c.stream("POST", path, json=req)
        r = s.__enter__()
        assert r.status_code == 200
        streams.append((s, r))
    _wait_for(lambda: server.health()["num_requests_running"] == MAX_NUM_SEQS, 10)
    assert server.health()["num_requests_waiting"] > 0
    for (s, _r), c in zip(streams, clients, strict=True):
        s.__exit__(None, None, None)
        c.close()
    took = _wait_for(
        lambda: (
            (h := server.health())["num_requests_running"] == 0
            and h["num_requests_waiting"] == 0
            and h["kv_cache_free_blocks"] == free0
        ),
        2.0,
    )
    text = http.get("/metrics").text
    assert metric_value(text, "glassbox:num_requests_running") == 0
    assert metric_value(text, "glassbox:kv_cache_free_blocks") == free0
    assert metric_value(text, "glassbox:request_success_total", 'finished_reason="abort"') >= 16
    http.close()
    print(f"storm of 16 disconnects freed in {took:.3f} s")


def test_nonstream_disconnect_aborts(server: ServerProcess) -> None:
    free0 = server.health()["kv_cache_free_blocks"]
    done = threading.Event()

    def fire() -> None:
        try:
            httpx.post(
                f"{server.url}/v1/completions",
                json={"prompt": "x", "max_tokens": 500, "ignore_eos": True},
                timeout=0.3,
            )
        except httpx.TimeoutException:
            pass
        done.set()

    threading.Thread(target=fire, daemon=True).start()
    assert done.wait(5)
    _wait_for(
        lambda: (h := server.health())["num_requests_running"] == 0 and h["kv_cache_free_blocks"] == free0,
        2.0,
    )


def test_metrics_names(http: httpx.Client) -> None:
    text = http.get("/metrics").text
    for name in (
        "num_requests_running",
        "num_requests_waiting",
        "kv_cache_usage_perc",
        "prompt_tokens_total",
        "generation_tokens_total",
        "num_preemptions_total",
        "prefix_cache_queries_total",
        "prefix_cache_hits_total",
    ):
        metric_value(text, "glassbox:" + name)
    assert metric_value(text, "glassbox:request_success_total", 'finished_reason="length"') > 0
    for name in (
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "request_prefill_time_seconds",
        "request_decode_time_seconds",
        "iteration_tokens_total",
    ):
        assert metric_value(text, f"glassbox:{name}_count") > 0
    assert metric_value(text, "glassbox:step_duration_seconds_count", 'phase="decode"') > 0
    assert metric_value(text, "glassbox:step_duration_seconds_count", 'phase="prefill"') > 0
    assert metric_value(text, "glassbox:prefix_cache_hits_total") > 0  # the shared CHAT prefix was reused
