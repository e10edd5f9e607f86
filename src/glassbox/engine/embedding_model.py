"""A model that embeds texts (or scores text pairs), built for one device: whole sequences in, one float32
vector (or relevance score) per sequence out. No KV cache is kept.

Three kinds of checkpoint run here:
- BERT encoders (models/bert.py): ``BertModel`` with a sentence-transformers pipeline (pooling, Dense,
  Normalize: models/sentence_transformers.py), and ``BertForSequenceClassification`` as a reranker;
- a decoder family's base model (``Gemma3TextModel``: EmbeddingGemma's layout; ``Qwen3Model``, ...), or any
  generative checkpoint with sentence-transformers files, run as an encoder by its own forward
  (engine/encoder_forward.py), bidirectional where config.json says ``use_bidirectional_attention``;
- the generative model a server already runs (``--pooling``): its own weights, last-token (or mean/CLS)
  pooling of the final hidden states, L2-normalized.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from glassbox.config import EngineConfig
from glassbox.engine.device import resolve_device
from glassbox.engine.encoder_forward import decoder_hidden
from glassbox.layers.encoder_attention import Segments
from glassbox.layers.host import parts_to_device
from glassbox.models import bert
from glassbox.models.causal_lm import CausalLM
from glassbox.models.config_reader import facts_from_config, read_config
from glassbox.models.families import FAMILIES, family_of_base
from glassbox.models.loader import build_model, load_weights
from glassbox.models.model_config import TORCH_DTYPES, ModelConfig
from glassbox.models.safetensors_files import safetensors_tensors
from glassbox.models.sentence_transformers import SentenceHead, SentencePipeline, has_pipeline, read_pipeline
from glassbox.models.sources import ModelSource, resolve_model
from glassbox.quant.blocks.linear import block_kernel_rows
from glassbox.tokenizer.hf_tokenizer import Tokenizer

if TYPE_CHECKING:
    from glassbox.engine.llm_engine import LLMEngine

logger = logging.getLogger(__name__)

# --pooling (config.POOLINGS) as sentence-transformers' modes
POOLINGS = {"last": "lasttoken", "mean": "mean", "cls": "cls"}

# (ids of each sequence, token types of each or None) -> (N, dimension) float32, or (N,) scores
Run = Callable[[list[list[int]], list[list[int]] | None], torch.Tensor]


@dataclass
class EmbeddingModel:
    """What the embedding runner (engine/async_embedder.py) and the server need of a model that embeds."""

    task: str  # "embed" | "rerank"
    name: str
    tokenizer: Tokenizer
    max_tokens: int  # the most tokens of one input (longer: cut, or refused)
    dimension: int  # the embedding's size (rerank: 1)
    normalized: bool  # vectors come out L2-normalized
    # the sizes ``dimensions`` may ask for (Matryoshka: a prefix of the vector, renormalized); () only the
    # full size, None any size up to it (config.json ``is_matryoshka`` without a list)
    matryoshka: tuple[int, ...] | None
    device: torch.device
    do_lower_case: bool
    vocab_size: int  # rows of the token table: token ids must be below it
    run: Run
    description: str
    flops_per_token: float  # 2 x parameters in the per-token path (for the anatomy's roofline)

    def dimensions_ok(self, n: int) -> bool:
        if n == self.dimension:
            return True
        return 0 < n < self.dimension and (self.matryoshka is None or n in self.matryoshka)


def checkpoint_task(source: ModelSource) -> str:
    """What ``--task auto`` serves a checkpoint as: "embed", "rerank" or "generate"."""
    if source.format != "hf":
        return "generate"
    cfg = read_config(source.path, missing_ok=True)
    arch = str((cfg.get("architectures") or [""])[0])
    # an encoder's row (models/families.py) says its task; a decoder's base model (no LM head) embeds
    family = FAMILIES.get(arch)
    if family is not None and family.task != "generate":
        return family.task
    if has_pipeline(source.path) or family_of_base(arch) is not None:
        return "embed"
    return "generate"


def _dtype(name: str, stored: torch.dtype, device: torch.device) -> torch.dtype:
    if name != "auto":
        return TORCH_DTYPES[name]
    return torch.bfloat16 if stored == torch.float16 and device.type == "cpu" else stored


def _threads() -> None:
    if "GLASSBOX_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["GLASSBOX_NUM_THREADS"]))


def _matryoshka(cfg: dict[str, Any]) -> tuple[int, ...] | None:
    """vLLM's config.json keys: ``matryoshka_dimensions`` (the sizes) or ``is_matryoshka`` (any size)."""
    dims = cfg.get("matryoshka_dimensions")
    if isinstance(dims, list) and dims:
        return tuple(int(d) for d in dims)
    return None if cfg.get("is_matryoshka") else ()


def _limit(config: EngineConfig, pipeline: SentencePipeline | None, positions: int) -> int:
    limit = pipeline.max_seq_length if pipeline is not None and pipeline.max_seq_length else positions
    if config.max_model_len is not None:
        if config.max_model_len > positions:
            raise ValueError(
                f"--max-model-len {config.max_model_len} is past the model's {positions} positions"
            )
        limit = config.max_model_len
    return min(limit, positions)


def open_embedding_model(config: EngineConfig, task: str) -> EmbeddingModel:
    """Build ``config.model`` for ``task`` ("embed" | "rerank"); ValueError for what glassbox cannot run so."""
    source = resolve_model(config.model)
    if source.format != "hf":
        raise ValueError("embedding models are read from Hugging Face directories, not GGUF files")
    if config.tensor_parallel_size > 1:
        raise ValueError("--tensor-parallel-size is not supported for embedding and reranking models")
    _threads()
    cfg = read_config(source.path)
    if cfg.get("quantization_config"):
        raise ValueError("quantized embedding checkpoints are not supported (16/32-bit weights only)")
    name = config.served_model_name or source.name
    device = resolve_device(config.device)
    tokenizer = Tokenizer.from_dir(source.path)
    pipeline = read_pipeline(source.path) if has_pipeline(source.path) else None
    if cfg.get("model_type") == "bert":
        return _bert(config, task, source.path, cfg, name, device, tokenizer, pipeline)
    if task != "embed":
        raise ValueError(f"--task {task}: only BertForSequenceClassification checkpoints rerank")
    return _decoder(config, source.path, cfg, name, device, tokenizer, pipeline)


def _head(pipeline: SentencePipeline | None, pooling: str | None, hidden: int, default: str) -> SentenceHead:
    """The checkpoint's own pipeline (``--pooling`` replacing only its pooling), or without one ``--pooling``
    (default ``default``) then Normalize."""
    if pipeline is None:
        return SentenceHead(SentencePipeline((POOLINGS[pooling or default],), (), True, None, False), hidden)
    if pooling is not None:
        if pipeline.dense:
            raise ValueError(
                "--pooling cannot replace the pooling of a pipeline with Dense layers (their inputs)"
            )
        pipeline = replace(pipeline, pooling=(POOLINGS[pooling],))
    return SentenceHead(pipeline, hidden)


def _bert(
    config: EngineConfig,
    task: str,
    path: Path,
    cfg: dict[str, Any],
    name: str,
    device: torch.device,
    tokenizer: Tokenizer,
    pipeline: SentencePipeline | None,
) -> EmbeddingModel:
    bc = bert.BertConfig.from_config(cfg)
    if task == "rerank" and bc.architecture != "BertForSequenceClassification":
        raise ValueError("--task rerank needs a cross-encoder (BertForSequenceClassification)")
    if task == "embed" and bc.architecture != "BertModel":
        raise ValueError(f"--task embed: {bc.architecture} is a reranker (serve it with --task rerank)")
    if task == "rerank" and config.pooling is not None:
        raise ValueError("--pooling does not apply to a reranker (it scores its [CLS] row)")
    if task == "rerank" and bc.num_labels != 1:
        raise ValueError(f"a reranker gives one score per pair; this classifier has {bc.num_labels} labels")
    dtype = _dtype(config.dtype, bc.dtype, device)
    model = bert.build_bert(bc).to(dtype)
    model.to_empty(device=device)
    load_weights(model, _bert_names(safetensors_tensors(path), bc.architecture), str(path))
    model.eval().requires_grad_(False)
    limit = _limit(config, pipeline, bc.max_position_embeddings)
    flops = 2.0 * sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
    what = f"{bc.architecture} ({bc.num_layers} layers, hidden {bc.hidden_size}) on {device} in {dtype}"
    if task == "rerank":
        assert isinstance(model, bert.BertForSequenceClassification)
        cross = model

        def score(ids: list[list[int]], types: list[list[int]] | None) -> torch.Tensor:
            x, tt, seg = _flat(ids, types, device)
            # one logit per pair; its sigmoid, as sentence-transformers' CrossEncoder
            with torch.inference_mode():
                return torch.sigmoid(cross(x, tt, seg).float()[:, 0]).cpu()

        return EmbeddingModel(
            "rerank", name, tokenizer, limit, 1, False, (), device, False, bc.vocab_size, score, what, flops
        )
    assert isinstance(model, bert.BertModel)
    encoder = model
    head = _head(pipeline, config.pooling, bc.hidden_size, "cls").to(device)

    def embed(ids: list[list[int]], types: list[list[int]] | None) -> torch.Tensor:
        x, tt, seg = _flat(ids, types, device)
        with torch.inference_mode():
            return head(encoder(x, tt, seg), seg).cpu()

    lower = pipeline.do_lower_case if pipeline is not None else False
    return EmbeddingModel(
        "embed", name, tokenizer, limit, head.dimension, head.normalize, _matryoshka(cfg), device, lower,
        bc.vocab_size, embed, what, flops,
    )  # fmt: skip


def _bert_names(weights: Iterator[tuple[str, torch.Tensor]], arch: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Checkpoint names as the module has them: a BertModel's without ``bert.`` (its pooler and
    pre-training heads skipped), a classifier's with it."""
    for name, tensor in weights:
        if arch == "BertModel":
            name = name.removeprefix("bert.")
            if name.startswith(("pooler.", "cls.")):
                continue
        elif not name.startswith(("bert.", "classifier.")):
            name = "bert." + name
        yield name, tensor


def _flat(
    ids: list[list[int]], types: list[list[int]] | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, Segments]:
    """(T,) ids, (T,) token types (zeros without), and the sequences' layout, on ``device``."""
    seg = Segments.build([len(s) for s in ids], device)
    flat_types = [t for s in types for t in s] if types is not None else [0] * seg.num_tokens
    x, tt = parts_to_device([[t for s in ids for t in s], flat_types], torch.long, device)
    return x, tt, seg


def _decoder(
    config: EngineConfig,
    path: Path,
    cfg: dict[str, Any],
    name: str,
    device: torch.device,
    tokenizer: Tokenizer,
    pipeline: SentencePipeline | None,
) -> EmbeddingModel:
    arch = str((cfg.get("architectures") or [""])[0])
    facts = facts_from_config(cfg, name)
    base = family_of_base(arch)  # a base model's weights run by its family (without "model.")
    facts = replace(facts, architecture=base.architecture if base is not None else arch)
    # the LM head is never run: tied to the table so that no weight is missing or allocated for it
    mc = replace(ModelConfig.from_facts(facts), tie_word_embeddings=True)
    dtype = _dtype(config.dtype, mc.torch_dtype, device)
    model = build_model(mc, _decoder_names(safetensors_tensors(path)), dtype, device, where=str(path))
    causal = not cfg.get("use_bidirectional_attention", False)
    limit = _limit(config, pipeline, facts.max_positions)
    what = (
        f"{arch} ({mc.num_layers} layers, {'causal' if causal else 'bidirectional'}) on {device} in {dtype}"
    )
    flops = 2.0 * (facts.total_params - 2 * facts.params["embed"])
    return _pooled_decoder(model, dtype, causal, _head(pipeline, config.pooling, mc.hidden_size, "last"),
                           name, tokenizer, limit, _matryoshka(cfg), device,
                           pipeline.do_lower_case if pipeline else False, mc.vocab_size, what, flops)  # fmt: skip


def _decoder_names(weights: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A base model's names under ``model.``; an LM head dropped (tied to the table instead)."""
    for name, tensor in weights:
        if not name.startswith("lm_head."):
            yield (name if name.startswith("model.") else "model." + name), tensor


def _pooled_decoder(
    model: CausalLM,
    dtype: torch.dtype,
    causal: bool,
    head: SentenceHead,
    name: str,
    tokenizer: Tokenizer,
    limit: int,
    matryoshka: tuple[int, ...] | None,
    device: torch.device,
    lower: bool,
    vocab_size: int,
    what: str,
    flops: float,
) -> EmbeddingModel:
    head = head.to(device)

    def embed(ids: list[list[int]], types: list[list[int]] | None) -> torch.Tensor:
        x, _, seg = _flat(ids, None, device)
        # block weights as in a prompt step (the dequantized weight's GEMM): each text's hidden states are its
        # prefill's, whatever the batch's row count
        with torch.inference_mode(), block_kernel_rows(False, prompt=True):
            return head(decoder_hidden(model, x, seg, causal, dtype), seg).cpu()

    return EmbeddingModel(
        "embed", name, tokenizer, limit, head.dimension, head.normalize, matryoshka, device, lower,
        vocab_size, embed, what, flops,
    )  # fmt: skip


def generator_embeddings(engine: LLMEngine, pooling: str) -> EmbeddingModel:
    """Embeddings from the model a generation engine runs (``--pooling``): its weights, pooled final hidden
    states, L2-normalized; run beside the engine's steps, with a scratch cache (nothing is kept)."""
    if engine.config.tensor_parallel_size > 1:
        raise ValueError("--pooling is not supported with --tensor-parallel-size > 1")
    executor = engine.executor
    model = executor.model
    head = _head(None, pooling, model.config.hidden_size, pooling)
    what = f"{engine.model_name}'s final hidden states, {pooling} pooling, normalized"
    return _pooled_decoder(model, executor.dtype, True, head, engine.model_name, engine.tokenizer,
                           engine.max_model_len, (), executor.device, False,
                           executor.model_config.vocab_size, what, float(executor.flops_per_token))  # fmt: skip
