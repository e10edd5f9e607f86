"""The bundled demo model (src/glassbox/demo/): complete, small, a real Llama, and trained on Python.

These tests hold the directory written by tools/train_demo_model.py against what glassbox and its users rely
on: every file present, under the size limit, loadable by transformers, a GQA Llama with tied embeddings in
bf16, a working chat template, and weights that actually learned Python (a random model fails the last two).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

import glassbox

transformers = pytest.importorskip("transformers")

DEMO_DIR = Path(glassbox.__file__).resolve().parent / "demo"
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "README.md",
)
MAX_BYTES = 32_000_000
PROMPT = "def fibonacci(n):"
# A small, ordinary function that is not in the standard library; a model that learned Python finds it
# predictable, a random one pays about ln(vocab) nats per token.
PYTHON_SNIPPET = '''def count_words(path):
    """Return a dict mapping each word in the file to the number of times it occurs."""
    counts = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            for word in line.split():
                counts[word] = counts.get(word, 0) + 1
    return counts
'''


@pytest.fixture(scope="module")
def config() -> dict[str, Any]:
    return json.loads((DEMO_DIR / "config.json").read_text())


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return transformers.AutoTokenizer.from_pretrained(DEMO_DIR)


@pytest.fixture(scope="module")
def model() -> Any:
    m = transformers.AutoModelForCausalLM.from_pretrained(DEMO_DIR, dtype=torch.float32)
    m.eval()
    return m


def test_demo_dir_has_every_file() -> None:
    missing = [name for name in REQUIRED_FILES if not (DEMO_DIR / name).is_file()]
    assert not missing, f"demo model is missing {missing}; run tools/train_demo_model.py"


def test_demo_dir_fits_size_limit() -> None:
    total = sum(p.stat().st_size for p in DEMO_DIR.rglob("*") if p.is_file())
    assert total <= MAX_BYTES, f"demo directory is {total:,} bytes, over {MAX_BYTES:,}"


def test_config_is_a_gqa_llama_with_tied_embeddings(config: dict[str, Any]) -> None:
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    assert 1 < kv_heads < heads and heads % kv_heads == 0, (
        "the demo model must exercise grouped-query attention"
    )
    assert config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] >= 2048


def test_safetensors_are_bf16_with_hf_names(config: dict[str, Any]) -> None:
    with safe_open(str(DEMO_DIR / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
        tensors = {name: f.get_slice(name) for name in names}
        dtypes = {name: t.get_dtype() for name, t in tensors.items()}
        shapes = {name: t.get_shape() for name, t in tensors.items()}
    assert set(dtypes.values()) == {"BF16"}
    assert "model.embed_tokens.weight" in names
    assert "lm_head.weight" not in names, "tied embeddings: the output head is the input embedding"
    assert "model.layers.0.self_attn.q_proj.weight" in names
    assert "model.norm.weight" in names
    n_params = sum(math.prod(s) for s in shapes.values())
    assert 5_000_000 <= n_params <= 15_000_000, n_params
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    k_shape = shapes["model.layers.0.self_attn.k_proj.weight"]
    assert k_shape == [config["num_key_value_heads"] * head_dim, config["hidden_size"]]


def test_generation_config_stops_on_eos(tokenizer: Any) -> None:
    gen = json.loads((DEMO_DIR / "generation_config.json").read_text())
    eos = gen["eos_token_id"]
    eos_ids = eos if isinstance(eos, list) else [eos]
    assert tokenizer.eos_token_id in eos_ids


def test_tokenizer_round_trips_code_and_unicode(tokenizer: Any) -> None:
    text = PYTHON_SNIPPET + "# café 你好 🚀\n"
    ids = tokenizer(text).input_ids
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode("utf-8")) / 2, "BPE merges should compress Python source"


def test_chat_template_renders(tokenizer: Any) -> None:
    messages = [
        {"role": "system", "content": "You complete code."},
        {"role": "user", "content": "Write fibonacci."},
    ]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.startswith(tokenizer.bos_token)
    assert "<|user|>Write fibonacci.<|eot|>" in text
    assert text.endswith("<|assistant|>")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert ids[0] == tokenizer.bos_token_id


def test_model_finds_python_predictable(model: Any, tokenizer: Any) -> None:
    """A trained model pays far less than ln(vocab) nats per token on unseen Python; a random one does not."""
    ids = tokenizer(PYTHON_SNIPPET, return_tensors="pt").input_ids
    with torch.no_grad():
        loss = model(input_ids=ids, labels=ids).loss.item()
    assert loss < 0.5 * math.log(model.config.vocab_size), f"loss {loss:.2f} nats/token"


def test_greedy_continuation_looks_like_python(model: Any, tokenizer: Any) -> None:
    ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False)
    text = tokenizer.decode(out[0, ids.shape[1] :])
    assert "\n    " in text, f"expected an indented body, got {text!r}"
    keywords = ("return", "if ", "for ", "while ", "raise ", "yield ", " = ", "(")
    assert any(k in text for k in keywords), f"expected Python-ish tokens, got {text!r}"
