"""glassbox: an LLM inference engine whose every request is a glass box."""

from glassbox.engine.sequence import RequestMetrics
from glassbox.llm import LLM
from glassbox.outputs import CompletionOutput, RequestOutput
from glassbox.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "RequestMetrics"]
__version__ = "0.1.0"
