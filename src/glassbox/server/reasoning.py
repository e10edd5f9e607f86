"""Reasoning content: a thinking model's ``<think>...</think>`` split from its answer (``--reasoning-parser``).

Both parsers follow vLLM's current semantics:

- ``deepseek_r1``: the text before ``</think>`` is reasoning, whether or not the output opened with
  ``<think>`` (R1's template opens it in the prompt); no ``</think>`` yet: all of it is reasoning.
- ``qwen3``: the same, and ``<tool_call>`` also ends the reasoning (it stays in the content, for the tool
  parser); with ``chat_template_kwargs: {"enable_thinking": false}`` everything is content.

For both, a prompt whose last ``<think>`` is already closed (a template that writes an empty
``<think></think>`` block when thinking is off) makes the whole output content. A ``<think>`` in the
output is dropped. The split is a pure function of the text so far (``split``); streaming sends the
difference between successive splits, holding back a tail that could still grow into a marker, so a
streamed reply equals the one-shot one.
"""

from __future__ import annotations

from glassbox.server.tool_parsers import partial_suffix

START = "<think>"
END = "</think>"


class ReasoningParser:
    """deepseek_r1's rule; subclasses add markers that also end the reasoning."""

    name = "deepseek_r1"
    implicit_ends: tuple[str, ...] = ()  # markers that end the reasoning and stay in the content

    def __init__(self, prompt: str = "", enable_thinking: bool = True) -> None:
        start, end = prompt.rfind(START), prompt.rfind(END)
        self.off = end > start or not enable_thinking

    def split(self, text: str, final: bool = True) -> tuple[str, str]:
        """(reasoning, content) of ``text``; unless ``final``, a tail of the reasoning that could begin a
        marker is held back (left out of both)."""
        if self.off:
            return "", text
        head = text
        i = head.find(START)
        if i >= 0:
            end = head.find(END)
            if end < 0 or i < end:
                head = head[:i] + head[i + len(START) :]
        cut, skip = head.find(END), len(END)
        for marker in self.implicit_ends:
            j = head.find(marker)
            if j >= 0 and (cut < 0 or j < cut):
                cut, skip = j, 0
        if cut >= 0:
            return head[:cut], head[cut + skip :]
        if final:
            return head, ""
        markers = (END, *self.implicit_ends) + (() if START in text else (START,))
        held = max(partial_suffix(head, m) for m in markers)
        return head[: len(head) - held], ""


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
    implicit_ends = ("<tool_call>",)


REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    p.name: p for p in (ReasoningParser, Qwen3ReasoningParser)
}


class ReasoningStream:
    """Feeds a reply's text through a parser piece by piece; returns (reasoning, content) pieces."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent = (0, 0)  # characters of reasoning and of content sent

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        self.text += delta
        reasoning, content = self.parser.split(self.text, final)
        r0, c0 = self.sent
        self.sent = (max(r0, len(reasoning)), max(c0, len(content)))
        return reasoning[r0:], content[c0:]

    def finish(self) -> tuple[str, str]:
        return self.feed("", final=True)
