"""A sentence-transformers checkpoint's pipeline, read from its files (no sentence-transformers import).

``modules.json`` lists the modules in order: the Transformer (the directory's own config.json and weights;
``sentence_bert_config.json`` holds its ``max_seq_length`` and ``do_lower_case``), then Pooling
(``1_Pooling/config.json``: its modes, in either the 2.x boolean keys or the newer ``pooling_mode``), any
Dense layers (``2_Dense/config.json`` + ``model.safetensors``: a linear and its activation) and Normalize
(L2). ``SentenceHead`` runs everything after the Transformer on the pooled rows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from glassbox.layers.encoder_attention import Segments
from glassbox.layers.pooling import POOLING_MODES, pool

MODULES_FILE = "modules.json"
# the 2.x config keys, in the order sentence-transformers concatenates their vectors
_LEGACY_MODES = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# Dense activations by sentence-transformers' saved class path (its torch.nn classes)
_ACTIVATIONS: dict[str, nn.Module] = {
    "torch.nn.modules.linear.Identity": nn.Identity(),
    "torch.nn.modules.activation.Tanh": nn.Tanh(),
    "torch.nn.modules.activation.ReLU": nn.ReLU(),
    "torch.nn.modules.activation.GELU": nn.GELU(),
    "torch.nn.modules.activation.Sigmoid": nn.Sigmoid(),
}


@dataclass(frozen=True)
class DenseSpec:
    folder: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a key of _ACTIVATIONS


@dataclass(frozen=True)
class SentencePipeline:
    """What a sentence-transformers directory asks after its Transformer module."""

    pooling: tuple[str, ...]  # modes, concatenated in this order
    dense: tuple[DenseSpec, ...]
    normalize: bool
    max_seq_length: int | None  # inputs are cut (or refused) past this many tokens (capped by the positions)
    do_lower_case: bool  # the text is lower-cased before tokenizing


def has_pipeline(model_dir: Path) -> bool:
    return (model_dir / MODULES_FILE).is_file()


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def pooling_modes(cfg: dict[str, Any]) -> tuple[str, ...]:
    """A Pooling config's modes: ``pooling_mode`` (a name or a list), else the 2.x booleans (mean if none)."""
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = tuple(m for key, m in _LEGACY_MODES.items() if cfg.get(key))
        modes = modes or ("mean",)
    else:
        modes = (mode,) if isinstance(mode, str) else tuple(mode)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad:
        raise ValueError(f"pooling mode(s) {bad} are not supported (supported: {', '.join(POOLING_MODES)})")
    return modes


def _dense(folder: Path) -> DenseSpec:
    cfg = _json(folder / "config.json")
    if not cfg:
        raise ValueError(f"{folder}: a Dense module without its config.json")
    if cfg.get("use_residual"):
        raise ValueError(f"{folder}: Dense with use_residual is not supported")
    act = str(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if act not in _ACTIVATIONS:
        raise ValueError(f"{folder}: Dense activation {act!r} is not supported ({', '.join(_ACTIVATIONS)})")
    if not (folder / "model.safetensors").is_file():
        raise ValueError(f"{folder}: Dense weights must be in model.safetensors (pickled .bin is not read)")
    return DenseSpec(
        folder, int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)), act
    )


def read_pipeline(model_dir: Path) -> SentencePipeline:
    """The pipeline ``modules.json`` describes; ValueError naming a module glassbox does not run."""
    modules = json.loads((model_dir / MODULES_FILE).read_text(encoding="utf-8"))
    if not isinstance(modules, list) or not modules:
        raise ValueError(f"{model_dir / MODULES_FILE}: expected a list of modules")
    pooling: tuple[str, ...] = ()
    dense: list[DenseSpec] = []
    normalize = False
    st = _json(model_dir / "sentence_bert_config.json")
    for i, module in enumerate(sorted(modules, key=lambda m: int(m.get("idx", 0)))):
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        folder = model_dir / str(module.get("path", ""))
        if kind == "Transformer":
            if i != 0:
                raise ValueError(f"{model_dir}: the Transformer must be the first module")
            st = st or _json(folder / "sentence_bert_config.json")
        elif kind == "Pooling":
            pooling = pooling_modes(_json(folder / "config.json"))
        elif kind == "Dense":
            dense.append(_dense(folder))
        elif kind == "Normalize":
            normalize = True
        else:
            raise ValueError(f"sentence-transformers module {module.get('type')!r} is not supported")
    if not pooling:
        raise ValueError(f"{model_dir}: no Pooling module (token embeddings alone are not served)")
    modalities = st.get("modality_config")
    if isinstance(modalities, dict) and "message" in modalities:  # sentence-transformers 6's own saves
        raise ValueError(
            f"{model_dir}: sentence_bert_config.json renders texts through the chat template (modality "
            "'message'), which is not supported; the published layout ({'max_seq_length': N}) embeds plain text"
        )
    # sentence-transformers 5+ keeps the limit as the tokenizer's model_max_length instead
    length = st.get("max_seq_length") or _json(model_dir / "tokenizer_config.json").get("model_max_length")
    return SentencePipeline(
        pooling=pooling,
        dense=tuple(dense),
        normalize=normalize,
        max_seq_length=int(length) if length else None,
        do_lower_case=bool(st.get("do_lower_case", False)),
    )


class SentenceHead(nn.Module):
    """Pooling, the Dense layers and Normalize, on float32 rows (the pooled vectors are few and small)."""

    def __init__(self, pipeline: SentencePipeline, hidden_size: int) -> None:
        super().__init__()
        self.modes = pipeline.pooling
        self.normalize = pipeline.normalize
        width = hidden_size * len(self.modes)
        layers: list[nn.Module] = []
        for spec in pipeline.dense:
            if spec.in_features != width:
                raise ValueError(f"{spec.folder}: Dense in_features {spec.in_features} != {width} coming in")
            linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
            state = load_file(str(spec.folder / "model.safetensors"))
            state = {k.removeprefix("linear."): v.float() for k, v in state.items()}
            linear.load_state_dict(state)  # strict: a missing or extra tensor is an error
            layers += [linear, _ACTIVATIONS[spec.activation]]
            width = spec.out_features
        self.dense = nn.Sequential(*layers)
        self.dimension = width
        self.requires_grad_(False)

    def forward(self, hidden: torch.Tensor, seg: Segments) -> torch.Tensor:  # (T, H) -> (N, dimension)
        x = self.dense(pool(hidden, seg, self.modes))
        return F.normalize(x, dim=-1) if self.normalize else x
