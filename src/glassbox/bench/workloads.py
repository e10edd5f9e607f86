"""Workloads: what each benchmark request asks for.

A synthetic workload has a prompt length and an output length (and optionally a shared prefix); its
prompts are built fresh for every run so that one run's prompts never warm the prefix cache for the next.
A dataset workload reads prompts from a JSONL file. ``default_grid`` gives nine workloads (three prompt
sizes x three output sizes) scaled to the server's context limit.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from glassbox.bench.tokens import PromptBuilder, TokenCounter

SIZES = ("small", "medium", "large")
# (cap, share of the context) for each prompt size and output size; a size is min(cap, share x context)
PROMPT_SIZES = ((128, 1 / 8), (1024, 1 / 4), (8192, 1 / 2))
OUTPUT_SIZES = ((32, 1 / 32), (128, 1 / 8), (512, 1 / 4))
DEFAULT_CONTEXT = 4096  # assumed when the server does not say


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: the prompt text, how many tokens to ask for, and its expected prompt length."""

    prompt: str
    max_tokens: int
    prompt_tokens: int | None  # as built or counted; None when unknown


@dataclass
class Workload:
    """A named request shape. ``dataset`` set: prompts come from it; otherwise they are synthetic."""

    name: str
    prompt_tokens: int
    output_tokens: int
    shared_prefix_tokens: int = 0
    dataset: list[RequestSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.dataset and self.prompt_tokens < 1:
            raise ValueError(f"--prompt-tokens must be at least 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"--output-tokens must be at least 1, got {self.output_tokens}")
        if not 0 <= self.shared_prefix_tokens <= self.prompt_tokens and not self.dataset:
            raise ValueError(
                f"--shared-prefix-tokens must be in [0, {self.prompt_tokens}] "
                f"(the prompt length), got {self.shared_prefix_tokens}"
            )

    def requests(self, builder: PromptBuilder, seed: int, prefix_seed: int = 0) -> Iterator[RequestSpec]:
        """An endless stream of requests for one run; ``seed`` makes each run's prompts its own, while
        ``prefix_seed`` (the benchmark's seed) picks the prefix every run of a shared-prefix workload shares."""
        if self.dataset:
            start = seed % len(self.dataset)
            i = 0
            while True:
                yield self.dataset[(start + i) % len(self.dataset)]
                i += 1
        rng = random.Random(f"{self.name}/{seed}")
        prefix, prefix_body = "", 0
        if self.shared_prefix_tokens:
            # the prefix is shared by every request of every run of this workload
            prefix = builder.prefix(
                self.shared_prefix_tokens, random.Random(f"{self.name}/prefix/{prefix_seed}")
            )
            prefix_body = builder.prefix_body_tokens(self.shared_prefix_tokens)
        while True:
            text = builder.prompt(self.prompt_tokens, rng, prefix, prefix_body)
            yield RequestSpec(text, self.output_tokens, self.prompt_tokens)


def _size(cap: int, share: float, context: int) -> int:
    return max(1, min(cap, int(share * context)))


def default_grid(context: int | None) -> list[Workload]:
    """Nine workloads: prompts small/medium/large x outputs small/medium/large, within ``context``."""
    ctx = context or DEFAULT_CONTEXT
    grid = []
    for pname, (pcap, pshare) in zip(SIZES, PROMPT_SIZES, strict=True):
        for oname, (ocap, oshare) in zip(SIZES, OUTPUT_SIZES, strict=True):
            grid.append(Workload(f"{pname}-{oname}", _size(pcap, pshare, ctx), _size(ocap, oshare, ctx)))
    return grid


def shared_prefix_pair(prompt_tokens: int, output_tokens: int, prefix_tokens: int | None) -> list[Workload]:
    """The same shape twice: unique prompts, then prompts that share a prefix (default: 3/4 of the prompt).

    Side by side they show prefix caching: the shared run's TTFT and prefill time drop by the cached part.
    """
    prefix = prefix_tokens if prefix_tokens else (3 * prompt_tokens) // 4
    return [
        Workload("unique-prefix", prompt_tokens, output_tokens),
        Workload("shared-prefix", prompt_tokens, output_tokens, shared_prefix_tokens=prefix),
    ]


def workload_names() -> list[str]:
    """Names --workload accepts."""
    return ["grid", "shared-prefix"] + [f"{p}-{o}" for p in SIZES for o in SIZES]


def named_workloads(
    name: str, context: int | None, prompt_tokens: int, output_tokens: int, prefix_tokens: int | None
) -> list[Workload]:
    """The workloads --workload NAME stands for."""
    if name == "grid":
        return default_grid(context)
    if name == "shared-prefix":
        return shared_prefix_pair(prompt_tokens, output_tokens, prefix_tokens)
    for w in default_grid(context):
        if w.name == name:
            return [w]
    raise ValueError(f"--workload must be one of {workload_names()}, got {name!r}")


def load_dataset(path: str | Path, default_output_tokens: int, name: str | None = None) -> Workload:
    """A JSONL file, one request a line: {"prompt": str, "output_tokens"|"max_tokens": int (optional),
    "prompt_tokens": int (optional)}. "text" is accepted for "prompt"."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"--dataset file not found: {p}")
    specs: list[RequestSpec] = []
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"--dataset {p}:{lineno}: not JSON ({e.msg})") from None
        prompt = row.get("prompt", row.get("text")) if isinstance(row, dict) else None
        if not isinstance(prompt, str):
            raise ValueError(f"--dataset {p}:{lineno}: each line needs a string 'prompt'")
        out = row.get("output_tokens", row.get("max_tokens", default_output_tokens))
        n_prompt = row.get("prompt_tokens")
        specs.append(RequestSpec(prompt, int(out), int(n_prompt) if isinstance(n_prompt, int) else None))
    if not specs:
        raise ValueError(f"--dataset {p} holds no prompts")
    mean_out = round(sum(s.max_tokens for s in specs) / len(specs))
    return Workload(name or p.stem, prompt_tokens=0, output_tokens=max(mean_out, 1), dataset=specs)


def count_dataset(workload: Workload, counter: TokenCounter) -> None:
    """Fill in missing prompt lengths of a dataset workload with ``counter``; set its mean prompt length."""
    specs = [
        s if s.prompt_tokens is not None else RequestSpec(s.prompt, s.max_tokens, counter.count(s.prompt))
        for s in workload.dataset
    ]
    workload.dataset = specs
    workload.prompt_tokens = round(sum(s.prompt_tokens or 0 for s in specs) / len(specs))


def load_label(run: dict[str, Any]) -> str:
    """'c=4' for a closed-loop run, '2/s' for an open-loop one."""
    return f"c={run['concurrency']}" if run.get("concurrency") is not None else f"{run['rate']:g}/s"
