"""A model name is a name, never a path (glassbox/store/names.py): traversal, absolute paths, URL schemes and
digests are refused before any store is read, and a manifest's digest cannot point outside Ollama's blobs/.
The anchors: Ollama's digest path traversal in /api/pull (a layer digest of ``sha256:../../..``) and MLX's
relative model paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from store_factory import add_ollama_model

from glassbox.store import ollama_store
from glassbox.store.names import BadModelName, check_name, parse_hub_name, parse_ollama_name

BAD = [
    "",
    "   ",
    "../etc/passwd",
    "..",
    "library/../../etc/passwd:latest",
    "models/./x",
    "/etc/passwd",
    "~/models/x",
    "C:\\models\\x",
    "file:///etc/passwd",
    "file:etc/passwd",
    "http://evil.example/x.gguf",
    "https://huggingface.co/org/repo",
    "sha256:" + "a" * 64,
    "smollm2@sha256:" + "a" * 64,
    "smollm2:135m\x00.gguf",
    ".hidden/model",
    "x" * 300,
]
GOOD = [
    "qwen2.5:1.5b",
    "Qwen/Qwen2.5-1.5B-Instruct",
    "hf.co/org/repo:Q4_K_M",
    "library/x:latest",
    "glassbox-demo",
]


@pytest.mark.parametrize("name", BAD)
def test_path_url_and_digest_names_are_refused(name: str) -> None:
    with pytest.raises(BadModelName):
        check_name(name)


@pytest.mark.parametrize("name", GOOD)
def test_model_names_pass(name: str) -> None:
    assert check_name(name) == name


def test_parsed_parts_cannot_climb_out() -> None:
    for name in ("../x", "a/../x:tag", "x:../../y", "a/b/c/d", "x:.."):
        assert parse_ollama_name(name) is None, name
    assert parse_ollama_name("qwen2.5:1.5b") is not None
    assert parse_ollama_name("qwen2.5").parts() == ("registry.ollama.ai", "library", "qwen2.5", "latest")  # type: ignore[union-attr]
    for name in ("../x", "org/..", "org/x--y", "a/b/c"):
        assert parse_hub_name(name) is None, name
    assert str(parse_hub_name("hf.co/org/repo:Q4_K_M")) == "org/repo:Q4_K_M"


def test_a_manifest_digest_that_escapes_blobs_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "ollama"
    secret = tmp_path / "secret"
    secret.write_text("not a model")
    manifest = add_ollama_model(store, "evil", "latest", None)
    body = json.loads(manifest.read_text())
    body["layers"].insert(0, {"mediaType": "application/vnd.ollama.image.model", "size": 11,
                              "digest": "sha256:../../secret"})  # fmt: skip
    manifest.write_text(json.dumps(body))
    name = parse_ollama_name("evil")
    assert name is not None
    with pytest.raises(ValueError, match="not sha256:<64 hex digits>"):
        ollama_store.find(name, [store])
    assert ollama_store.scan([store]) == []  # listed: skipped (and logged), never read
