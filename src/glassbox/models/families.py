"""The one table of model families (torch-free): a row per Hugging Face architecture.

A row says how a checkpoint names the family (config.json's ``architectures`` and ``model_type``, a GGUF
file's ``general.architecture``) and what the engine has for it: the module that builds it, a forward on
the CPU's C kernels, a tensor-parallel split, tensors stored fused. Like mini-sglang's models/register.py:
a new family is its file in models/ and a row here. Code is named as "module:attribute" and imported only
by the engine (the planner reads this table without torch).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

_LLAMA = "glassbox.models.llama:LlamaForCausalLM"
_LLAMA_CPU = "glassbox.models.llama_native:bind"
_QWEN_NEXT = "glassbox.models.qwen3_next:Qwen3NextForCausalLM"
_HYBRID_CPU = "glassbox.models.hybrid_native:bind"


@dataclass(frozen=True)
class Family:
    """One model family."""

    architecture: str  # the Hugging Face class name (config.json ``architectures[0]``)
    model_type: str  # config.json ``model_type`` (a multimodal checkpoint's text model: see ``aliases``)
    model: str | None  # "module:Class" that runs it; None: the planner describes it, the engine does not
    gguf: str | None = None  # llama.cpp's ``general.architecture`` for it
    cpu_forward: str | None = None  # "module:function" binding a forward on the CPU's C kernels
    tensor_parallel: bool = False  # models/tensor_parallel.py splits it
    fused: bool = False  # stores q/k/v and gate/up fused (models/fused_parts.py cuts them as read)
    aliases: tuple[str, ...] = ()  # other model_type spellings that mean it ("gemma3": its text model)
    base_model: str | None = None  # its headless class ("LlamaModel"): an embedding checkpoint's architecture
    task: str = "generate"  # or "embed" / "rerank": an encoder (engine/embedding_model.py builds it)
    # multimodal architectures whose text model it runs (their towers ignored: models/multimodal.py)
    multimodal: tuple[str, ...] = ()
    # "module:function" splitting a built model over tensor-parallel ranks, where not tensor_parallel.apply_tp
    tp_split: str | None = None

    def model_class(self) -> Any:
        """The nn.Module class that runs it (imports torch); ValueError where the engine has none."""
        if self.model is None:
            raise ValueError(f"architecture {self.architecture!r} is described by the planner only")
        return _resolve(self.model)

    def split_for_tp(self) -> Any | None:
        """The function splitting a built model over tensor-parallel ranks where the family has its own."""
        return None if self.tp_split is None else _resolve(self.tp_split)

    def bind_cpu_forward(self) -> Any | None:
        """The function that binds its forward on the CPU kernels, or None (the PyTorch ops run it)."""
        return None if self.cpu_forward is None else _resolve(self.cpu_forward)


def _resolve(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


FAMILIES: dict[str, Family] = {
    f.architecture: f
    for f in (
        Family("LlamaForCausalLM", "llama", _LLAMA, "llama", _LLAMA_CPU, True, base_model="LlamaModel"),
        Family("MistralForCausalLM", "mistral", _LLAMA, "mistral", _LLAMA_CPU, True, base_model="MistralModel"),
        Family("Qwen2ForCausalLM", "qwen2", _LLAMA, "qwen2", _LLAMA_CPU, True, base_model="Qwen2Model"),
        Family("Qwen3ForCausalLM", "qwen3", _LLAMA, "qwen3", _LLAMA_CPU, True, base_model="Qwen3Model"),
        # Llama layers with routed experts (models/moe.py); llama.cpp writes Mixtral as "llama" with experts
        Family("MixtralForCausalLM", "mixtral", _LLAMA, None, _LLAMA_CPU, True),
        Family("Qwen2MoeForCausalLM", "qwen2_moe", _LLAMA, "qwen2moe", _LLAMA_CPU, True),
        Family("Qwen3MoeForCausalLM", "qwen3_moe", _LLAMA, "qwen3moe", _LLAMA_CPU, True),
        # Llama layers with sinks and its own experts (models/gpt_oss.py)
        Family(
            "GptOssForCausalLM", "gpt_oss", "glassbox.models.gpt_oss:GptOssForCausalLM", "gpt-oss", _LLAMA_CPU,
            True,
        ),
        # its fused qkv/gate_up tensors cut as read (models/fused_parts.py)
        Family("Phi3ForCausalLM", "phi3", _LLAMA, "phi3", _LLAMA_CPU, True, fused=True),
        Family(
            "Gemma3ForCausalLM", "gemma3_text", "glassbox.models.gemma3:Gemma3ForCausalLM", "gemma3", None, True,
            aliases=("gemma3",), base_model="Gemma3TextModel",
        ),
        # per-layer inputs, shared KV, full layers of their own geometry, experts beside the MLP (models/gemma4.py)
        Family(
            "Gemma4ForCausalLM", "gemma4_text", "glassbox.models.gemma4:Gemma4ForCausalLM", "gemma4", None, True,
            aliases=("gemma4",), multimodal=("Gemma4ForConditionalGeneration",),
            tp_split="glassbox.models.gemma4_tp:apply_gemma4_tp",
        ),
        # hybrid: a recurrent state beside the KV (layers/state_cache.py); decode recurrences in C
        Family("Qwen3NextForCausalLM", "qwen3_next", _QWEN_NEXT, "qwen3next", _HYBRID_CPU),  # Gated DeltaNet + gated attention
        Family("Qwen3_5ForCausalLM", "qwen3_5_text", _QWEN_NEXT, "qwen35", _HYBRID_CPU),
        Family("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text", _QWEN_NEXT, "qwen35moe", _HYBRID_CPU),
        # Mamba-2 + attention + MLP/MoE (models/nemotron_h.py)
        Family("NemotronHForCausalLM", "nemotron_h", "glassbox.models.nemotron_h:NemotronHForCausalLM", "nemotron_h", _HYBRID_CPU),
        # encoders (models/bert.py), served by the embedding runner
        Family("BertModel", "bert", "glassbox.models.bert:BertModel", task="embed"),
        Family("BertForSequenceClassification", "bert", "glassbox.models.bert:BertForSequenceClassification",
               task="rerank"),
    )
}  # fmt: skip

_DECODERS = [f for f in FAMILIES.values() if f.task == "generate"]
_BY_TYPE = {t: f for f in _DECODERS for t in (f.model_type, *f.aliases)}
_BY_GGUF = {f.gguf: f for f in _DECODERS if f.gguf is not None}
# other GGUF architectures llama.cpp writes for a family: Nemotron-H with routed experts (Nemotron 3)
_BY_GGUF["nemotron_h_moe"] = _BY_GGUF["nemotron_h"]
_BY_BASE = {f.base_model: f for f in _DECODERS if f.base_model is not None}


def family_of_type(model_type: str) -> Family | None:
    """The family a config.json ``model_type`` names, or None."""
    return _BY_TYPE.get(model_type)


def family_of_base(architecture: str) -> Family | None:
    """The decoder family whose headless class ``architecture`` names ("Qwen3Model"), or None."""
    return _BY_BASE.get(architecture)


def encoders(model_type: str) -> tuple[str, ...]:
    """The encoder architectures of a model_type ("bert": BertModel, BertForSequenceClassification)."""
    return tuple(a for a, f in FAMILIES.items() if f.task != "generate" and f.model_type == model_type)


def family_of_gguf(arch: str) -> Family | None:
    """The family a GGUF ``general.architecture`` names, or None."""
    return _BY_GGUF.get(arch)


def engine_family(architecture: str) -> Family:
    """The row of an architecture the engine runs; ValueError naming the supported ones."""
    fam = FAMILIES.get(architecture)
    if fam is None or fam.model is None or fam.task != "generate":
        supported = ", ".join(f.architecture for f in _DECODERS if f.model is not None)
        raise ValueError(
            f"architecture {architecture or '(none)'!r} is not supported by the engine; supported: {supported}"
        )
    return fam


def model_types() -> tuple[str, ...]:
    """Every config.json model_type the planner can describe (canonical spellings)."""
    return tuple(f.model_type for f in _DECODERS)


def gguf_architectures() -> tuple[str, ...]:
    """Every GGUF architecture read (beside "llama" with experts: Mixtral)."""
    return tuple(_BY_GGUF)
