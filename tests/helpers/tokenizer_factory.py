"""Test helper: a small trained byte-level BPE tokenizer directory in Hugging Face's layout (cached)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from glassbox.tokenizer import training

TRAIN_FILES = 60  # stdlib sources; enough for real merges, trains in well under a second
FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")

_cache: dict[int, dict[str, bytes]] = {}  # vocab_size -> file name -> contents, trained once per process


def _train(vocab_size: int) -> dict[str, bytes]:
    tok = training.train_bpe(training.iter_texts(training.stdlib_python_files(TRAIN_FILES)), vocab_size)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        training.save_hf_tokenizer(tok, root)
        eos_id = training.special_token_id(tok, training.EOS)
        (root / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id}) + "\n")
        return {name: (root / name).read_bytes() for name in FILES}


def build_tokenizer_dir(out_dir: Path, vocab_size: int = 512) -> Path:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json (eos_token_id = EOS) to out_dir.

    Training runs once per vocab_size per process; later calls write the cached bytes. Returns out_dir.
    """
    if vocab_size not in _cache:
        _cache[vocab_size] = _train(vocab_size)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in _cache[vocab_size].items():
        (out_dir / name).write_bytes(data)
    return out_dir
