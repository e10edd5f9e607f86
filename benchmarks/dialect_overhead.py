"""The same request through each door of one `glassbox serve` (OpenAI chat, Anthropic Messages, Ollama chat,
Responses), in turns: what does a dialect's translation cost?

Starts `glassbox serve` on the default model (SmolLM2-135M-Instruct) with prefix caching off (every
request prefills its whole prompt), then each round sends the same conversation (a system prompt and a
question; greedy, at most 64 tokens: the same reply through every door) through each door in turn,
streamed, in a shuffled order. Per request: the server's anatomy from the stream's last event (tokenize_s,
ttft_s, decode_s, e2e_s) and the client's time to the first text and to the end of the stream; the client
minus the server (tokenize + ttft, tokenize + e2e) is what lies outside the engine: HTTP, the
translation, the output's formatting. Reports medians per door and ratios to the OpenAI door, with the
load average; writes results/dialect-overhead-DATE.json.

    .venv/bin/python benchmarks/dialect_overhead.py [--rounds 8] [--url http://127.0.0.1:8000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEM = "You are a patient history teacher who explains events in plain words."
QUESTION = "Tell me about the French Revolution: its causes, its main events and what it changed."
MAX_TOKENS = 64


# door -> (path, request body)
def _bodies(model: str) -> dict[str, tuple[str, dict[str, Any]]]:
    chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    return {
        "openai": (
            "/v1/chat/completions",
            {"model": model, "messages": chat, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True},
        ),
        "anthropic": (
            "/v1/messages",
            {
                "model": model,
                "system": SYSTEM,
                "messages": chat[1:],
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "stream": True,
            },
        ),
        "ollama": (
            "/api/chat",
            {"model": model, "messages": chat, "options": {"temperature": 0, "num_predict": MAX_TOKENS}},
        ),
        "responses": (
            "/v1/responses",
            {
                "model": model,
                "instructions": SYSTEM,
                "input": QUESTION,
                "max_output_tokens": MAX_TOKENS,
                "temperature": 0,
                "stream": True,
            },
        ),
    }


def _sse(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[len("data: ") :])


def _text_and_metrics(door: str, event: dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(the text an event adds, the anatomy it carries) in ``door``'s stream format."""
    if door == "openai":
        choices = event.get("choices") or [{}]
        return choices[0].get("delta", {}).get("content") or "", event.get("metrics")
    if door == "anthropic":
        delta = event.get("delta", {}) if event.get("type") == "content_block_delta" else {}
        return delta.get("text", ""), event.get("metrics")
    if door == "ollama":
        return event.get("message", {}).get("content", ""), event.get("metrics")
    text = event.get("delta", "") if event.get("type") == "response.output_text.delta" else ""
    done = event.get("type") in ("response.completed", "response.incomplete")
    return text, (event.get("response") or {}).get("metrics") if done else None


def measure(client: httpx.Client, door: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    first: float | None = None
    text, metrics = "", None
    with client.stream("POST", path, json=body) as r:
        r.raise_for_status()
        lines = r.iter_lines()
        events: Iterator[dict[str, Any]] = (
            (json.loads(line) for line in lines if line) if door == "ollama" else _sse(lines)
        )
        for event in events:
            piece, m = _text_and_metrics(door, event)
            if piece and first is None:
                first = time.perf_counter() - t0
            text += piece
            metrics = m or metrics
    end = time.perf_counter() - t0
    assert metrics is not None and first is not None, door
    return {
        "text": text,
        "client_ttft_s": first,
        "client_e2e_s": end,
        **{k: metrics[k] for k in ("tokenize_s", "queue_s", "prefill_s", "ttft_s", "decode_s", "e2e_s")},
        "prompt_tokens": metrics["prompt_tokens"],
        "output_tokens": metrics["output_tokens"],
        "outside_ttft_s": first - metrics["tokenize_s"] - metrics["ttft_s"],
        "outside_e2e_s": end - metrics["tokenize_s"] - metrics["e2e_s"],
    }


def start_server(port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "glassbox.cli", "serve", "--port", str(port), "--device", "cpu"]
    cmd += ["--no-enable-prefix-caching", "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not come up")


def translation_cost(repeat: int = 200) -> dict[str, tuple[float, float]]:
    """Microseconds to turn each door's JSON body into the chat request the engine path takes (pydantic
    validation and translation; the OpenAI door's is its validation alone), for this benchmark's request
    and for one with 16 Claude-Code-sized tools (tests/dialect_server.claude_code_tools); mean of
    ``repeat`` runs."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
    from dialect_server import claude_code_tools

    from glassbox.server import anthropic_request, ollama_request, responses_request
    from glassbox.server.protocol import ChatCompletionRequest

    tools = claude_code_tools()
    functions = [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]},
        }
        for t in tools
    ]
    translate: dict[str, Callable[[dict[str, Any]], Any]] = {
        "openai": lambda b: ChatCompletionRequest.model_validate(b),
        "anthropic": lambda b: anthropic_request.chat_request(
            anthropic_request.MessagesRequest.model_validate(b)
        ),
        "ollama": lambda b: ollama_request.chat_request(
            ollama_request.ChatRequest.model_validate(b), b["model"], False
        ),
        "responses": lambda b: (
            responses_request.translate(responses_request.ResponsesRequest.model_validate(b), []).chat
        ),
    }
    out: dict[str, tuple[float, float]] = {}
    for door, (_, body) in _bodies("m").items():
        big = dict(body)
        if door == "anthropic":
            big["tools"] = tools
        elif door == "responses":
            big["tools"] = [{"type": "function", **f["function"]} for f in functions]
        else:
            big["tools"] = functions
        times = []
        for b in (body, big):
            raw = json.dumps(b)
            t0 = time.perf_counter()
            for _ in range(repeat):
                translate[door](json.loads(raw))
            times.append((time.perf_counter() - t0) / repeat * 1e6)
        out[door] = (times[0], times[1])
    return out


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--url", help="an already running server (prefix caching off)")
    ap.add_argument("--port", type=int, default=8123)
    args = ap.parse_args()
    proc = None if args.url else start_server(args.port)
    url = args.url or f"http://127.0.0.1:{args.port}"
    try:
        with httpx.Client(base_url=url, timeout=300) as client:
            model = client.get("/v1/models").json()["data"][0]["id"]
            bodies = _bodies(model)
            doors = list(bodies)
            for door in doors:  # warm-up: one of each
                measure(client, door, *bodies[door])
            rows: dict[str, list[dict[str, Any]]] = {d: [] for d in doors}
            load: list[float] = []
            rng = random.Random(0)
            for _ in range(args.rounds):
                # shuffled: no door always first, nor always after the same one
                for door in rng.sample(doors, len(doors)):
                    rows[door].append(measure(client, door, *bodies[door]))
                load.append(os.getloadavg()[0])
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    texts = {d: {r["text"] for r in rows[d]} for d in doors}
    assert all(t == texts["openai"] for t in texts.values()), texts  # the same reply through every door
    prompts = {d: {r["prompt_tokens"] for r in rows[d]} for d in doors}
    assert all(p == prompts["openai"] for p in prompts.values()), prompts  # from the same prompt
    keys: list[tuple[str, Callable[[float], str]]] = [
        ("ttft_s", lambda v: f"{v * 1e3:8.1f}"),
        ("decode_s", lambda v: f"{v * 1e3:8.1f}"),
        ("e2e_s", lambda v: f"{v * 1e3:8.1f}"),
        ("client_ttft_s", lambda v: f"{v * 1e3:8.1f}"),
        ("client_e2e_s", lambda v: f"{v * 1e3:8.1f}"),
        ("outside_ttft_s", lambda v: f"{v * 1e3:8.2f}"),
        ("outside_e2e_s", lambda v: f"{v * 1e3:8.2f}"),
    ]
    summary = {d: {key: _median(rows[d], key) for key, _ in keys} for d in doors}
    # within each round the doors ran back to back: their ratios to the OpenAI door drift less than times
    ratios = {
        d: {
            key: statistics.median(r[key] / o[key] for r, o in zip(rows[d], rows["openai"], strict=True))
            for key in ("ttft_s", "decode_s", "e2e_s")
        }
        for d in doors[1:]
    }
    cost = translation_cost()
    print(
        f"{args.rounds} rounds, medians in ms (outside_*: the client's time minus the server's tokenize + ttft or e2e); load average {statistics.median(load):.2f}; "
        f"prompt {rows['openai'][0]['prompt_tokens']} tokens, output {rows['openai'][0]['output_tokens']}"
    )
    print(f"{'door':10}" + "".join(f"{key:>16}" for key, _ in keys))
    for d in doors:
        print(f"{d:10}" + "".join(f"{fmt(summary[d][key]):>16}" for key, fmt in keys))
    print(
        "median per-round ratio to openai (ttft, decode, e2e): "
        + ", ".join(
            f"{d} {ratios[d]['ttft_s']:.3f} {ratios[d]['decode_s']:.3f} {ratios[d]['e2e_s']:.3f}"
            for d in doors[1:]
        )
    )
    print(
        "translation into the chat request, in process, median us (this request; with 16 Claude-Code-sized tools):"
    )
    for d, (small, large) in cost.items():
        print(f"  {d:10} {small:8.1f} {large:10.1f}")
    RESULTS.mkdir(exist_ok=True)
    out = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "load_average_median": statistics.median(load),
        "rounds": args.rounds,
        "summary_medians_s": summary,
        "per_round_ratio_medians": ratios,
        "translation_us": cost,
        "rows": rows,
    }
    (RESULTS / f"dialect-overhead-{time.strftime('%Y-%m-%d')}.json").write_text(
        json.dumps(out, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
