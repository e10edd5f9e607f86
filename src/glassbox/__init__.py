"""glassbox: an LLM inference engine whose every request is a glass box.

The public names load on first use, so that commands which need no model (``glassbox bench``,
``glassbox plan``) start without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from glassbox.anatomy import RequestMetrics
    from glassbox.llm import LLM
    from glassbox.outputs import CompletionOutput, RequestOutput
    from glassbox.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics"]
__version__ = "0.1.0"

_WHERE = {
    "LLM": "glassbox.llm",
    "SamplingParams": "glassbox.sampling_params",
    "RequestOutput": "glassbox.outputs",
    "CompletionOutput": "glassbox.outputs",
    "RequestMetrics": "glassbox.engine.sequence",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    raise AttributeError(f"module 'glassbox' has no attribute {name!r}")
