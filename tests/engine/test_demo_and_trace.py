"""The bundled demo model in glassbox vs transformers, the offline CLI, and `glassbox trace`."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from glassbox import LLM, SamplingParams
from glassbox.kernels import native
from glassbox.models.sources import DEMO_MODEL_DIR
from glassbox.trace import run_trace

PROMPTS = ["def fibonacci(n):", "import os\n", "class Stack:\n    def push(self, item):\n"]


@pytest.fixture(scope="module")
def demo() -> LLM:
    return LLM("glassbox-demo", dtype="float32")  # the bundled demo, by name


def test_demo_greedy_matches_transformers(demo: LLM) -> None:
    import transformers as tf

    hf = tf.AutoModelForCausalLM.from_pretrained(DEMO_MODEL_DIR, dtype=torch.float32)
    tok = tf.AutoTokenizer.from_pretrained(DEMO_MODEL_DIR)
    outs = demo.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = tok(prompt, return_tensors="pt").input_ids
        assert out.prompt_token_ids == ids[0].tolist()  # same tokenization
        with torch.no_grad():
            ref = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=16,
                min_new_tokens=16,
                do_sample=False,
                pad_token_id=1,
            )
        assert out.token_ids == ref[0, ids.shape[1] :].tolist()
        assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)


def _fresh_cache(tmp_path: Path) -> str:
    """An empty GLASSBOX_CACHE_DIR (no probe result, nothing cached) but for the C kernels this process
    built, which a subprocess would otherwise compile again (~20 s on 2 cores)."""
    lib = native.library()
    if lib is not None:
        (tmp_path / "native").mkdir(exist_ok=True)
        shutil.copy(lib._name, tmp_path / "native")
    return str(tmp_path)


def test_generate_cli_runs_offline_with_no_model(tmp_path: Path) -> None:
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GLASSBOX_CACHE_DIR=_fresh_cache(tmp_path)
    )
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "glassbox.cli",
            "generate",
            "--max-tokens",
            "8",
            "--json",
            "def fibonacci(n):",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["token_ids"]) == 8 and out["finish_reason"] == "length"
    assert out["metrics"]["output_tokens"] == 8


def test_trace_phases_are_consistent(demo: LLM) -> None:
    from glassbox.perf.probe import get_hardware

    # a preset, not this machine's probe: under load the probe's FLOP/s can fall below the demo model's 0.5
    # FLOP per byte and make its decode look compute-bound (seen once in CI)
    hw = get_hardware("strix-halo")
    r = run_trace(demo.engine, "def fibonacci(n):", 12, hw)
    ph = r["phases"]
    ms = {k: ph[k].get("ms", 0.0) for k in ("tokenize", "queue", "prefill")}
    ttft, e2e = ph["first_token"]["ttft_ms"], r["e2e_ms"]
    assert ms["tokenize"] + ms["queue"] + ms["prefill"] <= ttft * 1.0001 + 1e-6
    assert ttft <= e2e
    assert ph["decode"]["tokens"] == 11  # the first token comes out of the prefill
    assert ph["prefill"]["tokens"] + ph["prefill"]["cached_tokens"] == ph["tokenize"]["tokens"]
    assert ph["decode"]["ceiling_tok_s"] > 0 and ph["prefill"]["ceiling_tok_s"] > 0
    assert 0 < ph["decode"]["fraction"] and ph["decode"]["bound"] == "memory"
    assert ph["decode"]["itl_ms_p50"] <= ph["decode"]["itl_ms_p99"]
    growth = r["kv_cache"]["growth"]
    assert growth and growth == sorted(growth, key=lambda g: g["blocks"])
    assert r["kv_cache"]["blocks"] == -(-(ph["tokenize"]["tokens"] + 11) // r["kv_cache"]["block_size"])


def test_trace_cli_json(tmp_path: Path) -> None:
    env = dict(os.environ, GLASSBOX_CACHE_DIR=_fresh_cache(tmp_path))
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "glassbox.cli",
            "trace",
            "--model",
            "glassbox-demo",
            "--max-tokens",
            "6",
            "--json",
            "x = 1",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out["phases"]) == {"tokenize", "queue", "prefill", "first_token", "decode", "detokenize"}
    assert out["roofline"]["bandwidth_gbs"] > 0
    assert list(tmp_path.glob("probe-*.json")), "the probe result was not cached"


def _finite(obj: object) -> bool:
    """Every number in a JSON-ready structure is finite (no NaN, no inf)."""
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return not isinstance(obj, float) or math.isfinite(obj)


def test_trace_of_an_immediate_eos(
    demo: LLM, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request whose first token is EOS (logit_bias forces it): a report with no decode, nothing divided
    by zero, no NaN/inf, and the renderer says so."""
    from glassbox.perf.probe import get_hardware
    from glassbox.trace_cli import render

    monkeypatch.setenv("COLUMNS", "240")  # rich's table: no wrapped cells
    eos = min(demo.engine.tokenizer.eos_token_ids)
    params = SamplingParams(temperature=0.0, max_tokens=8, logit_bias={eos: 100.0})
    r = run_trace(demo.engine, "def fibonacci(n):", 8, get_hardware("strix-halo"), params=params)
    assert r["finish_reason"] == "stop" and r["output_tokens"] == 1 and r["text"] == ""
    dec = r["phases"]["decode"]
    assert dec["tokens"] == 0 and dec["tok_s"] == 0.0 and "fraction" not in dec and dec["ceiling_tok_s"] > 0
    assert r["phases"]["prefill"]["fraction"] > 0
    prompt_tokens, bs = r["phases"]["tokenize"]["tokens"], r["kv_cache"]["block_size"]
    assert r["kv_cache"]["blocks"] == -(-prompt_tokens // bs) > 0  # the prefill's blocks, freed at the end
    assert _finite(r)
    json.dumps(r, allow_nan=False)
    render(r)
    out = capsys.readouterr().out
    assert (
        "none: the first token ended the request" in out and "answer:" in out and "finish_reason=stop" in out
    )


def test_trace_applies_the_chat_template(demo: LLM) -> None:
    """chat=True tokenizes the prompt as one user message through the model's template (the same ids as
    the tokenizer's own encode_chat); raw text gets the plain encoding."""
    tok = demo.engine.tokenizer
    assert tok.chat_template is not None
    prompt = "What is 2 + 2?"
    chat = run_trace(demo.engine, prompt, 3, None, chat=True)
    raw = run_trace(demo.engine, prompt, 3, None)
    want = tok.encode_chat([{"role": "user", "content": prompt}], add_generation_prompt=True)
    assert chat["phases"]["tokenize"]["tokens"] == len(want) > len(tok.encode(prompt))
    assert raw["phases"]["tokenize"]["tokens"] == len(tok.encode(prompt))
    assert chat["chat_template"] and not raw["chat_template"] and chat["prompt"] == prompt


def test_trace_flags_a_fraction_above_100_percent(
    demo: LLM, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held against a machine far slower than this one, the measured rates exceed their ceilings: the
    report marks the fractions and says the hardware figure was wrong."""
    import dataclasses

    from glassbox.perf.probe import get_hardware
    from glassbox.trace_cli import render

    monkeypatch.setenv("COLUMNS", "240")
    slow = dataclasses.replace(get_hardware("strix-halo"), bandwidth_gbs=1e-4, tflops={"fp32": 1e-9})
    r = run_trace(demo.engine, "def fibonacci(n):", 6, slow)
    assert r["phases"]["decode"]["fraction"] > 1 and r["phases"]["decode"]["probe_wrong"]
    assert any("probe was wrong" in w for w in r["roofline"]["warnings"])
    render(r)
    out = capsys.readouterr().out
    assert "(above 100%: the probe was wrong)" in out
