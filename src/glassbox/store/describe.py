"""What a stored model is, read from its checkpoint (torch-free): architecture, quantization, size,
whether glassbox can serve it and, if not, why; for ``glassbox show``, its chat template and capabilities.

Decided from the one table of families (models/families.py) and the checkpoint readers (config.json via
models/config_reader.py, GGUF via models/gguf_reader.py): a checkpoint they refuse is not servable, with
their message as the reason. The task (generate / embed / rerank) follows engine/embedding_model's
``checkpoint_task`` rules, restated here because that module imports torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from glassbox.models.config_reader import facts_from_dir, facts_from_gguf, read_config
from glassbox.models.facts import ModelFacts
from glassbox.models.families import FAMILIES, engine_family, family_of_base, family_of_type
from glassbox.models.gguf_reader import GGUFCheckpoint, open_gguf
from glassbox.store.stored import StoredModel

ST_MODULES = "modules.json"  # a sentence-transformers pipeline (models/sentence_transformers.py)
INDEX_SUFFIX = ".safetensors.index.json"


@dataclass
class ModelInfo:
    """A stored model's facts as `glassbox list` and `show` report them."""

    model: StoredModel
    architecture: str = ""
    quantization: str = ""
    parameters: int = 0
    context_length: int = 0
    task: str = "generate"
    servable: bool = False
    reason: str | None = None  # why it cannot be served
    facts: ModelFacts | None = None
    chat_template: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)  # a GGUF file's general.* keys

    def capabilities(self) -> list[str]:
        """What it does, in Ollama's words: completion or embedding; tools and thinking where its chat
        template renders tools or a thinking block."""
        if self.task != "generate":
            return ["embedding"] if self.task == "embed" else ["rerank"]
        caps = ["completion"]
        template = self.chat_template or ""
        if "tools" in template:
            caps.append("tools")
        if "<think>" in template or "enable_thinking" in template:
            caps.append("thinking")
        return caps

    def row(self) -> dict[str, Any]:
        """`glassbox list --json`'s entry."""
        m = self.model
        return {
            "name": m.name,
            "source": m.source,
            "format": {"gguf": "gguf", "hf": "safetensors"}.get(m.format, m.format),
            "size": m.size,
            "quantization": self.quantization,
            "architecture": self.architecture,
            "parameters": self.parameters,
            "context_length": self.context_length,
            "task": self.task,
            "servable": self.servable,
            "reason": self.reason,
            "path": str(m.path),
            "revision": m.revision,
            "notes": list(m.notes),
        }


def describe(model: StoredModel, template: bool = False) -> ModelInfo:
    """Read ``model``'s checkpoint (metadata only); ``template``: its chat template too."""
    info = ModelInfo(model)
    if model.problem is not None:
        info.reason = model.problem
        return info
    try:
        if model.format == "gguf":
            _gguf(info, open_gguf(model.path), template)
        else:
            _hf(info, model.path, template)
    except (ValueError, KeyError, OSError, json.JSONDecodeError) as e:
        info.reason = str(e) or type(e).__name__
        return info
    info.servable = info.reason is None
    return info


def _gguf(info: ModelInfo, checkpoint: GGUFCheckpoint, template: bool) -> None:
    meta = checkpoint.metadata
    info.metadata = {k: v for k, v in meta.items() if k.startswith("general.") and isinstance(v, str | int)}
    info.architecture = str(meta.get("general.architecture", ""))
    facts = facts_from_gguf(checkpoint, info.model.name)
    _facts(info, facts)
    file_type = meta.get("general.file_type")
    if isinstance(file_type, int) and file_type in LlamaFileType._value2member_map_:
        info.quantization = LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    else:
        info.quantization = facts.native_quant.main if facts.native_quant else facts.dtype
    engine_family(facts.architecture)  # ValueError naming the supported ones
    if template:
        from glassbox.tokenizer.gguf_tokenizer import chat_template

        info.chat_template = chat_template(meta)


def _hf(info: ModelInfo, path: Path, template: bool) -> None:
    cfg = read_config(path)
    arch = str((cfg.get("architectures") or [""])[0])
    info.architecture = arch or str(cfg.get("model_type", ""))
    family = FAMILIES.get(arch) or family_of_type(str(cfg.get("model_type", "")))
    if family is not None and family.task != "generate":  # an encoder (models/bert.py)
        info.task = family.task
        info.quantization = str(cfg.get("torch_dtype") or cfg.get("dtype") or "")
        info.context_length = int(cfg.get("max_position_embeddings") or 0)
    else:
        if (path / ST_MODULES).is_file() or family_of_base(arch) is not None:
            info.task = "embed"  # a decoder's base model, or a sentence-transformers pipeline
        facts = facts_from_dir(path, info.model.name)  # ValueError naming the supported model types
        _facts(info, facts)
        info.quantization = facts.native_quant.describe() if facts.native_quant else facts.dtype
        if info.task == "generate":
            engine_family(facts.architecture or arch)
    missing = _missing_weights(path)
    if missing:
        info.reason = missing
    elif not (path / "tokenizer.json").is_file():
        info.reason = f"no tokenizer.json in {path}"
    if template and (path / "tokenizer.json").is_file():
        from glassbox.tokenizer.hf_tokenizer import Tokenizer

        info.chat_template = Tokenizer.from_dir(path).chat_template


def _facts(info: ModelInfo, facts: ModelFacts) -> None:
    info.facts = facts
    info.parameters = facts.total_params
    info.context_length = facts.max_context


def _missing_weights(path: Path) -> str | None:
    """Why a Hugging Face directory's weights are incomplete, or None."""
    for index in sorted(path.glob("*" + INDEX_SUFFIX)):
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        absent = sorted(s for s in shards if not (path / s).is_file())
        if absent:
            return f"{index.name} names shards that are not there: {', '.join(absent[:4])}"
        return None
    if not any(path.glob("*.safetensors")):
        return f"no *.safetensors weights in {path}"
    return None
