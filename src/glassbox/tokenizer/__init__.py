"""Tokenizers, chat templates, incremental detokenization and stop strings."""

from glassbox.tokenizer.detokenizer import IncrementalDetokenizer
from glassbox.tokenizer.hf_tokenizer import Tokenizer
from glassbox.tokenizer.stop_checker import StopChecker

__all__ = ["Tokenizer", "IncrementalDetokenizer", "StopChecker"]
