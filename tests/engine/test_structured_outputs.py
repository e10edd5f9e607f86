"""Structured outputs end to end: a real `glassbox serve` on a tiny random model sampled at temperature 1.0
(its unconstrained text is noise, so a valid output is the grammar mask's doing), outputs checked by
independent validators (the jsonschema package, Python's re); and the engine in process for what the HTTP
side cannot see: constrained and unconstrained rows in one step, preemption, async output."""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from server_harness import (  # noqa: F401  (fixtures)
    MODEL_NAME,
    ServerProcess,
    server_factory,
    sse_events,
    start_server,
    tiny_model,
)

ADDRESS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "pattern": "^[A-Za-z]{1,8}$"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
    },
    "required": ["zip"],
    "additionalProperties": False,
}
# bounded languages: max_tokens below covers the longest text each allows, so every output must finish
SCHEMAS: list[dict[str, Any]] = [
    {  # nested object, enum, bounded integer, required fields
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "role": {"enum": ["admin", "user", "guest"]},
            "address": ADDRESS,
        },
        "required": ["name", "age", "role", "address"],
        "additionalProperties": False,
    },
    {  # an array of objects with optional fields
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{2}$"},
                        "qty": {"type": "integer", "minimum": 1, "maximum": 9},
                        "gift": {"type": "boolean"},
                    },
                    "required": ["sku", "qty"],
                    "additionalProperties": False,
                },
            },
            "total": {"type": "integer", "minimum": 0, "maximum": 9999},
        },
        "required": ["items"],
        "additionalProperties": False,
    },
    {  # an array of enums, anyOf with null, const
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
            "ok": {"type": "boolean"},
            "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 5}]},
            "version": {"const": "v1"},
        },
        "required": ["tags", "ok", "note", "version"],
        "additionalProperties": False,
    },
    {
        "type": "array",
        "items": {"type": "integer", "minimum": -50, "maximum": 50},
        "minItems": 2,
        "maxItems": 5,
    },
]
MAX_TOKENS = 320
CHAT = [{"role": "user", "content": "Describe a user as JSON."}]


@pytest.fixture(scope="module")
def server(
    tiny_model: Path,  # noqa: F811
    server_factory: list[ServerProcess],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> ServerProcess:
    s = start_server(
        tiny_model, tmp_path_factory.mktemp("logs"), "--max-num-seqs", "8", "--max-model-len", "512"
    )
    server_factory.append(s)
    return s


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Any:
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _post_all(http: httpx.Client, calls: list[tuple[str, dict[str, Any]]]) -> list[httpx.Response]:
    """Send the requests at once (the engine batches them), answers in order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(lambda c: http.post(c[0], json={"model": MODEL_NAME, **c[1]}), calls))


def _texts(r: httpx.Response) -> list[tuple[str, str]]:
    """(text, finish_reason) of each choice."""
    assert r.status_code == 200, r.text
    return [
        (c["message"]["content"] if "message" in c else c["text"], c["finish_reason"])
        for c in r.json()["choices"]
    ]


def test_json_schemas_at_temperature_1_always_validate(http: httpx.Client) -> None:
    """50 requests over 4 schemas, both endpoints and all three spellings, sampled at temperature 1.0."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for i in range(50):
        schema = SCHEMAS[i % len(SCHEMAS)]
        common = {"temperature": 1.0, "max_tokens": MAX_TOKENS, "seed": i}
        if i % 3 == 0:
            rf = {
                "type": "json_schema",
                "json_schema": {"name": f"s{i % 4}", "schema": schema, "strict": True},
            }
            calls.append(("/v1/chat/completions", {"messages": CHAT, "response_format": rf, **common}))
        elif i % 3 == 1:
            calls.append(("/v1/completions", {"prompt": "data = ", "guided_json": schema, **common}))
        else:
            calls.append(
                ("/v1/completions", {"prompt": "{", "structured_outputs": {"json": schema}, **common})
            )
    control = ("/v1/completions", {"prompt": "data = ", "temperature": 1.0, "max_tokens": 40, "seed": 0})
    *answers, free = _post_all(http, [*calls, control])
    for i, r in enumerate(answers):
        ((text, finish),) = _texts(r)
        assert finish == "stop", (i, text)
        jsonschema.validate(json.loads(text), SCHEMAS[i % len(SCHEMAS)])
    with pytest.raises(ValueError):  # without the mask this model writes no JSON
        json.loads(_texts(free)[0][0])


def test_n2_stream_json_object_and_cut_short(http: httpx.Client) -> None:
    schema = SCHEMAS[0]
    rf = {"type": "json_schema", "json_schema": {"name": "user", "schema": schema}}
    body = {"messages": CHAT, "response_format": rf, "temperature": 1.0, "max_tokens": MAX_TOKENS}
    two, streamed, obj, short = _post_all(
        http,
        [
            ("/v1/chat/completions", {**body, "n": 2, "seed": 7}),
            ("/v1/chat/completions", {**body, "seed": 8, "stream": True}),
            (
                "/v1/completions",
                {"prompt": "x", "response_format": {"type": "json_object"}, "max_tokens": 24},
            ),
            ("/v1/chat/completions", {**body, "max_tokens": 6}),
        ],
    )
    ((text, finish),) = _texts(short)  # max_tokens wins over the grammar: a prefix, "length"
    assert finish == "length" and text.startswith('{"name": ')
    with pytest.raises(ValueError):
        json.loads(text)
    outs = _texts(two)
    assert len(outs) == 2
    for text, finish in outs:
        assert finish == "stop"
        jsonschema.validate(json.loads(text), schema)
    events = sse_events(iter(streamed.text.splitlines()))
    chunks = [e for e in events if isinstance(e, dict) and e["choices"]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    jsonschema.validate(json.loads(text), schema)
    ((text, finish),) = _texts(obj)  # any JSON object: may be cut by max_tokens
    assert text.startswith("{")
    if finish == "stop":
        assert isinstance(json.loads(text), dict)


REGEX = r"[A-Z]{2,4}-[0-9]{1,3}(-(red|green|blue))?"
CHOICES = ["yes", "no", "maybe later"]
GBNF = 'root ::= greeting " " name\ngreeting ::= "hello" | "hi"\nname ::= [a-z] [a-z]? [a-z]?'
LARK = 'start: "(" num ("," num)? ")"\nnum: /[0-9]{1,2}/'
RUNS = 8  # regex and choice requests each (seeds 0..7), and one more of each below


def test_regex_choice_and_grammars_always_match(http: httpx.Client) -> None:
    calls: list[tuple[str, dict[str, Any]]] = []
    for i in range(RUNS):
        common = {"prompt": "value = ", "temperature": 1.0, "max_tokens": 40, "seed": i}
        calls.append(("/v1/completions", {**common, "guided_regex": REGEX}))
        calls.append(("/v1/completions", {**common, "structured_outputs": {"choice": CHOICES}}))
    calls.append(("/v1/chat/completions", {"messages": CHAT, "guided_choice": CHOICES, "temperature": 1.0}))
    calls.append(
        ("/v1/completions", {"prompt": "x", "guided_grammar": GBNF, "temperature": 1.0, "max_tokens": 20})
    )
    calls.append(
        ("/v1/completions", {"prompt": "x", "structured_outputs": {"grammar": LARK}, "temperature": 1.0})
    )
    stopped = {"prompt": "v", "guided_regex": REGEX, "stop": ["-"], "temperature": 1.0, "max_tokens": 40}
    calls.append(("/v1/completions", stopped))  # a stop string inside the match cuts it as usual
    answers = _post_all(http, calls)
    text, finish = _texts(answers[2 * RUNS + 3])[0]
    assert re.fullmatch("[A-Z]{2,4}", text) and finish == "stop", text
    for r, (_, body) in zip(answers[: 2 * RUNS], calls[: 2 * RUNS], strict=True):
        ((text, finish),) = _texts(r)
        assert finish == "stop"
        if "guided_regex" in body:
            assert re.fullmatch(REGEX, text), text
        else:
            assert text in CHOICES
    assert _texts(answers[2 * RUNS])[0] in [(c, "stop") for c in CHOICES]
    gbnf, lark = _texts(answers[2 * RUNS + 1])[0], _texts(answers[2 * RUNS + 2])[0]
    assert re.fullmatch(r"(hello|hi) [a-z]{1,3}", gbnf[0]) and gbnf[1] == "stop", gbnf
    assert re.fullmatch(r"\([0-9]{1,2}(,[0-9]{1,2})?\)", lark[0]) and lark[1] == "stop", lark


def test_logprobs_see_the_mask(http: httpx.Client) -> None:
    """Logprobs are taken after the mask (vLLM's default): at every position the probability mass lies on
    the tokens the grammar allows (the top 5 hold them all), and forbidden ones are reported at vLLM's
    floor of -9999. Once the choice is written only EOS and the request's stop token remain."""
    (stop_id,) = http.post("/tokenize", json={"prompt": "Q", "add_special_tokens": False}).json()["tokens"]
    body = {"messages": CHAT, "guided_choice": ["yes"], "logprobs": True, "top_logprobs": 5}
    r = http.post("/v1/chat/completions", json={**body, "temperature": 1.0, "stop_token_ids": [stop_id]})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["message"]["content"] == "yes" and choice["finish_reason"] == "stop"
    content = choice["logprobs"]["content"]
    for t in content:
        allowed = [x["logprob"] for x in t["top_logprobs"] if x["logprob"] > -9999.0]
        assert sum(math.exp(v) for v in allowed) == pytest.approx(1.0, abs=1e-4), t
    last = {x["token"] for x in content[-1]["top_logprobs"] if x["logprob"] > -9999.0}
    assert last == {"<|end_of_text|>", "Q"}
    assert [x["logprob"] for x in content[-1]["top_logprobs"][2:]] == [-9999.0] * 3


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "objectx"}},
                }
            },
            "response_format",
            "objectx",
        ),
        (
            {"guided_json": {"type": "object", "properties": {"a": {"$ref": "#/defs/missing"}}}},
            "guided_json",
            "missing",
        ),
        ({"guided_regex": "[a-"}, "guided_regex", "regex"),
        (
            {"structured_outputs": {"grammar": "root ::= undefined_rule"}},
            "structured_outputs",
            "undefined_rule",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        ({"response_format": {"type": "yaml"}}, "response_format", "yaml"),
        ({"guided_json": "{not json"}, "guided_json", "JSON"),
        ({"guided_choice": []}, "guided_choice", "choice"),
        ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex", "one"),
        ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs", "structural_tag"),
        ({"guided_choice": ["a"], "min_tokens": 2}, "min_tokens", "min_tokens"),
    ],
)
def test_bad_constraints_are_400(http: httpx.Client, body: dict[str, Any], param: str, words: str) -> None:
    r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "x", **body})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"], err


# -- in process: what the HTTP side cannot see -----------------------------------------------------------


def test_engine_batches_constrained_rows_with_free_ones_through_preemption(tiny_model: Path) -> None:  # noqa: F811
    """Greedy unconstrained rows give the tokens they give alone while constrained rows (n = 2, temperature
    1.0) share their steps; a KV cache too small for all of them preempts and recomputes sequences, with
    async output on, and every constrained output still validates."""
    from glassbox import LLM, SamplingParams
    from glassbox.structured_outputs import StructuredOutputs

    llm = LLM(str(tiny_model), dtype="float32", max_num_seqs=8, num_kv_blocks=14, async_output=True)
    budget = 180  # the longest text SCHEMAS[1] allows, and within the cache (14 x 16 tokens)
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["def f(x):", "import os"]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, free)]
    assert llm.engine.scheduler.num_preemptions == 0
    schema = SCHEMAS[1]
    sp = SamplingParams(
        n=2, temperature=1.0, seed=3, max_tokens=budget, structured_outputs=StructuredOutputs(json=schema)
    )
    outs = llm.generate(prompts + ["class A:", "x = [", "return"], [free, free, sp, sp, sp])
    assert [o.outputs[0].token_ids for o in outs[:2]] == alone
    assert llm.engine.scheduler.num_preemptions > 0
    assert max(r.batch_size for r in llm.engine.step_records) == 8  # 2 free + 3 x n=2 constrained rows
    for o in outs[2:]:
        assert len(o.outputs) == 2
        for c in o.outputs:
            assert c.finish_reason == "stop", c.text
            jsonschema.validate(json.loads(c.text), schema)


def test_apply_bitmask_matches_the_bits() -> None:
    """The mask layout read bit by bit in Python: token t allowed iff bit t % 32 of word t // 32 is set;
    only the listed rows change; tokens past the mask's 32 * W are forbidden."""
    import torch

    from glassbox.engine.structured import apply_bitmask

    g = torch.Generator().manual_seed(0)
    vocab, words = 70, 2  # 64 tokens covered, 6 past the mask
    logits = torch.randn(5, vocab, generator=g)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (2, words), dtype=torch.int32, generator=g)
    rows = [3, 1]
    out = logits.clone()
    apply_bitmask(out, bitmask, torch.tensor(rows))
    for r in range(5):
        for t in range(vocab):
            if r not in rows:
                allowed = True
            else:
                word = int(bitmask[rows.index(r), t // 32]) & 0xFFFFFFFF if t < 32 * words else 0
                allowed = bool((word >> (t % 32)) & 1)
            assert out[r, t].item() == (logits[r, t].item() if allowed else float("-inf")), (r, t)


def test_compiled_grammars_are_cached_least_recently_used_out(tiny_model: Path) -> None:  # noqa: F811
    from glassbox.engine.structured import GrammarCompiler, GrammarError
    from glassbox.structured_outputs import StructuredOutputs
    from glassbox.tokenizer.hf_tokenizer import Tokenizer

    compiler = GrammarCompiler(Tokenizer.from_dir(tiny_model), 512, cache_size=2)
    a, b, c = (StructuredOutputs(regex=r) for r in ("a+", "b+", "c+"))
    first = compiler.compile(a)
    assert compiler.compile(StructuredOutputs(regex="a+")) is first  # equal constraint, same entry
    compiler.compile(b)
    compiler.compile(c)  # evicts a, the least recently used
    assert (compiler.hits, compiler.misses) == (1, 3)
    assert compiler.compile(a) is not first and compiler.misses == 4
    same = StructuredOutputs(json={"type": "object", "properties": {"x": {"type": "integer"}}})
    assert (
        same.key == StructuredOutputs(json='{"type": "object", "properties": {"x": {"type": "integer"}}}').key
    )
    with pytest.raises(GrammarError, match="invalid JSON schema"):
        compiler.compile(StructuredOutputs(json={"type": "nope"}))
