"""BERT encoders (BertModel, BertForSequenceClassification) with Hugging Face parameter names.

What sets BERT apart from the decoders of this folder:
- bidirectional attention over whole sequences (layers/encoder_attention.py), no KV cache;
- absolute learned positions and token types (segment A/B of a pair) added to the word embeddings, then a
  LayerNorm;
- post-LN blocks: x = LN(x + attn(x)); x = LN(x + down(act(up(x)))), biases everywhere, exact GELU;
- a sequence classifier (cross-encoder rerankers): tanh(pooler(h[CLS])) then a linear to ``num_labels``.

A batch is whole sequences laid end to end (``Segments``): (T,) ids, positions and token types in, (T, H)
hidden states out. Dropout is absent (inference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from glassbox.layers.activation import get_activation
from glassbox.layers.encoder_attention import Segments, encoder_attention
from glassbox.models.families import encoders

ARCHITECTURES = encoders("bert")  # models/families.py


@dataclass(frozen=True)
class BertConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    hidden_act: str
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    num_labels: int  # BertForSequenceClassification's outputs (1: a relevance score)
    dtype: torch.dtype  # the checkpoint's (float32 when the config names none, as transformers)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> BertConfig:
        """From a config.json dict (models/config_reader.read_config); ValueError on what this code does
        not run."""
        archs = cfg.get("architectures") or ["BertModel"]
        arch = str(archs[0])
        if cfg.get("model_type") != "bert" or arch not in ARCHITECTURES:
            raise ValueError(
                f"not a BERT checkpoint glassbox runs ({arch}; supported: {', '.join(ARCHITECTURES)})"
            )
        kind = cfg.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise ValueError(f"BERT position_embedding_type {kind!r} is not supported (only 'absolute')")
        hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
        if hidden % heads:
            raise ValueError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        labels = cfg.get("id2label")
        num_labels = len(labels) if isinstance(labels, dict) and labels else int(cfg.get("num_labels", 2))
        name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")
        dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}.get(name)
        if dtype is None:
            raise ValueError(f"BERT checkpoint dtype {name!r} is not supported")
        return cls(
            architecture=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            intermediate_size=int(cfg["intermediate_size"]),
            hidden_act=str(cfg.get("hidden_act", "gelu")),
            max_position_embeddings=int(cfg.get("max_position_embeddings", 512)),
            type_vocab_size=int(cfg.get("type_vocab_size", 2)),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            num_labels=num_labels,
            dtype=dtype,
        )


class BertEmbeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position_embeddings = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, token_types: torch.Tensor
    ) -> torch.Tensor:  # each (T,) -> (T, H)
        x = self.word_embeddings(input_ids) + self.token_type_embeddings(token_types)
        return self.LayerNorm(x + self.position_embeddings(positions))


class BertSelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.num_heads, self.head_dim = cfg.num_heads, cfg.head_dim
        self.query = nn.Linear(h, h)
        self.key = nn.Linear(h, h)
        self.value = nn.Linear(h, h)

    def forward(self, x: torch.Tensor, seg: Segments) -> torch.Tensor:  # (T, H) -> (T, H)
        t = x.shape[0]
        q, k, v = (p(x).view(t, self.num_heads, self.head_dim) for p in (self.query, self.key, self.value))
        return encoder_attention(q, k, v, seg, self.head_dim**-0.5).reshape(t, -1)


class BertSelfOutput(nn.Module):
    """LN(x + dense(attn)): the attention block's projection and post-norm (HF: attention.output)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(attn) + x)


class BertAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(cfg)
        self.output = BertSelfOutput(cfg)

    def forward(self, x: torch.Tensor, seg: Segments) -> torch.Tensor:
        return self.output(self.self(x, seg), x)


class BertIntermediate(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.act = get_activation(cfg.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (T, H) -> (T, I)
        return self.act(self.dense(x))


class BertOutput(nn.Module):
    """LN(x + dense(h)): the feed-forward block's down projection and post-norm (HF: layer.N.output)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)
        self.LayerNorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:  # h (T, I), x (T, H) -> (T, H)
        return self.LayerNorm(self.dense(h) + x)


class BertLayer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(cfg)
        self.intermediate = BertIntermediate(cfg)
        self.output = BertOutput(cfg)

    def forward(self, x: torch.Tensor, seg: Segments) -> torch.Tensor:
        x = self.attention(x, seg)
        return self.output(self.intermediate(x), x)


class BertEncoder(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(cfg) for _ in range(cfg.num_layers))

    def forward(self, x: torch.Tensor, seg: Segments) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, seg)
        return x


class BertPooler(nn.Module):
    """tanh(dense(h)) of each sequence's first ([CLS]) row."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, first: torch.Tensor) -> torch.Tensor:  # (N, H) -> (N, H)
        return torch.tanh(self.dense(first))


class BertModel(nn.Module):
    """The encoder: token rows in, final hidden states out (no pooler: a sentence-transformers pipeline
    pools them itself; a checkpoint's ``pooler.*`` tensors are not loaded)."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.encoder = BertEncoder(cfg)

    def forward(
        self, input_ids: torch.Tensor, token_types: torch.Tensor, seg: Segments
    ) -> torch.Tensor:  # (T,), (T,) -> (T, H)
        return self.encoder(self.embeddings(input_ids, seg.position, token_types), seg)


class BertForSequenceClassification(nn.Module):
    """A cross-encoder: ``classifier(pooler(h[CLS]))`` per sequence, (N, num_labels) logits."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.config = cfg
        self.bert = BertModel(cfg)
        self.bert.pooler = BertPooler(cfg)
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_labels)

    def forward(
        self, input_ids: torch.Tensor, token_types: torch.Tensor, seg: Segments
    ) -> torch.Tensor:  # (T,), (T,) -> (N, num_labels)
        hidden = self.bert(input_ids, token_types, seg)
        first = hidden.index_select(0, seg.first)
        pooler = self.bert.pooler
        assert isinstance(pooler, BertPooler)
        return self.classifier(pooler(first))


def build_bert(cfg: BertConfig) -> nn.Module:
    """The module for ``cfg.architecture``, on the meta device (the caller materializes and loads it)."""
    with torch.device("meta"):
        return BertModel(cfg) if cfg.architecture == "BertModel" else BertForSequenceClassification(cfg)
