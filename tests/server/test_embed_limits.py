"""Embedding inputs too long for the model (issue 40, item 4, for the embedding doors): refused before they
are tokenized, or with ``truncate`` cut unread past twice the longest text the model's tokens can cover,
the vectors still those of sentence-transformers (which tokenizes all of it, then truncates)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from embedding_models import assert_close, tiny_qwen3_embedder

from glassbox import LLM
from glassbox.tokenizer.request_text import max_text_chars


def test_long_inputs_are_refused_unread_or_cut(tmp_path: Path) -> None:
    from sentence_transformers import SentenceTransformer

    path = tiny_qwen3_embedder(tmp_path)
    llm = LLM(str(path), device="cpu")
    assert llm.embedding is not None
    bound = max_text_chars(llm.tokenizer, llm.embedding.max_tokens)
    assert bound is not None  # byte-level BPE without a normalizer: a bound exists
    words = "def main():\n    return value + other * 3\n"
    text = words * (3 * bound // len(words))  # past twice the bound: the cut is taken
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="characters, more than the"):
        llm.embed(words * 300_000)  # 12 MB: refused on its length
    assert time.perf_counter() - t0 < 2  # tokenizing 5 MB took 10 s on this machine
    st = SentenceTransformer(str(path), device="cpu")
    assert_close(llm.embed([text, words], truncate=True), st.encode([text, words], convert_to_tensor=True))
