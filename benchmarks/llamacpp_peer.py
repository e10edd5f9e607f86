"""llama.cpp (through llama-cpp-python) as a batch-1 peer in the CPU benchmark.

It runs the GGUF written by ``benchmarks/gguf_export.py`` from the same checkpoint glassbox serves, so both
engines multiply the same numbers. Timing is wall clock (``time.perf_counter``) around llama.cpp's own
``eval`` calls; loading the model and one short warm-up pass are outside the timed region. Greedy choices
are the argmax of the last position's logits, read straight from llama.cpp (no sampler chain).

* prefill: one ``eval`` of the whole prompt after ``reset()``, plus reading its last logits (the first
  output token), so ``prefill_tok_s = prompt_tokens / that time``.
* decode: ``n_decode`` steps, each ``eval`` of the previous token plus its argmax, so
  ``decode_tok_s = n_decode / decode time``; ``output_tokens`` counts those steps (the token chosen from the
  prefill logits is not among them).

llama.cpp's own defaults are kept: logical batch 2048, physical micro-batch 512, and flash attention on
(llama.cpp's "auto" turns it on for the CPU backend; llama-cpp-python would otherwise switch it off, which
costs prefill speed at long prompts). The KV cache is llama.cpp's default f16.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

N_BATCH = 2048  # llama.cpp's default logical batch (tokens handed to one llama_decode)
N_UBATCH = 512  # llama.cpp's default physical micro-batch


def llamacpp_version() -> str:
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__}"


def load_llama(
    gguf_path: Path, n_ctx: int, n_threads: int = 2, flash_attn: bool = True, use_mmap: bool = True
) -> Any:
    """A llama_cpp.Llama on ``gguf_path`` for CPU use with ``n_threads`` threads for prefill and decode.

    ``use_mmap=False``: the weights are read into llama.cpp's own memory (as glassbox holds them), not
    served from the page cache, which a machine short of memory evicts and re-reads from disk."""
    from llama_cpp import Llama

    return Llama(
        model_path=str(gguf_path),
        n_ctx=n_ctx,
        n_batch=min(N_BATCH, n_ctx),
        n_ubatch=N_UBATCH,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        n_gpu_layers=0,
        logits_all=False,
        flash_attn=flash_attn,
        use_mmap=use_mmap,
        verbose=False,
    )


def greedy_next(llm: Any) -> int:
    """The argmax of the logits at the last evaluated position."""
    import llama_cpp

    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    logits = np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),))
    return int(np.argmax(logits))


def _warm_up(llm: Any, n_vocab: int) -> None:
    """Touch every weight page and the compute graphs once (short prompt, two decode steps), then reset."""
    llm.reset()
    llm.eval([i % n_vocab for i in range(1, 17)])
    for _ in range(2):
        llm.eval([greedy_next(llm)])
    llm.reset()


def _context_for(n_tokens: int) -> int:
    """A context size that holds ``n_tokens`` (rounded up to llama.cpp's 256-token padding)."""
    return max(256, -(-(n_tokens + 8) // 256) * 256)


def measure_llamacpp(
    gguf_path: Path,
    prompt_ids: list[int],
    n_decode: int,
    n_threads: int = 2,
    flash_attn: bool = True,
) -> dict[str, Any]:
    """Batch-1 prefill of ``prompt_ids`` then ``n_decode`` greedy decode steps in llama.cpp.

    Returns prefill_tok_s, decode_tok_s, prompt_tokens, output_tokens and version, plus prefill_s,
    decode_s, n_threads, flash_attn, load_avg_1m (the machine's 1-minute load average when the run began:
    ggml's spinning thread barriers make llama.cpp collapse when other processes want the same cores, so a
    figure taken at a load above the core count is not worth reporting) and output_ids (the first token from
    the prefill logits followed by the ``n_decode`` decoded ones) for parity checks.
    """
    if not prompt_ids:
        raise ValueError("prompt_ids is empty")
    llm = load_llama(Path(gguf_path), _context_for(len(prompt_ids) + n_decode), n_threads, flash_attn)
    try:
        n_vocab = llm.n_vocab()
        _warm_up(llm, n_vocab)

        llm.reset()
        load_avg = os.getloadavg()[0]
        t0 = time.perf_counter()
        llm.eval(list(prompt_ids))
        tok = greedy_next(llm)
        prefill_s = time.perf_counter() - t0

        out = [tok]
        t1 = time.perf_counter()
        for _ in range(n_decode):
            llm.eval([tok])
            tok = greedy_next(llm)
            out.append(tok)
        decode_s = time.perf_counter() - t1
    finally:
        llm.close()
    return {
        "prefill_tok_s": len(prompt_ids) / prefill_s,
        "decode_tok_s": n_decode / decode_s if n_decode else 0.0,
        "prompt_tokens": len(prompt_ids),
        "output_tokens": n_decode,
        "version": llamacpp_version(),
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "n_threads": n_threads,
        "flash_attn": flash_attn,
        "load_avg_1m": load_avg,
        "output_ids": out,
    }


def measure_llamacpp_prefill(
    gguf_path: Path, n_tokens: int, n_threads: int = 2, flash_attn: bool = True, seed: int = 0
) -> float:
    """Prefill throughput (tok/s) of one ``n_tokens``-token prompt of seeded random ids, batch 1."""
    llm = load_llama(Path(gguf_path), _context_for(n_tokens), n_threads, flash_attn)
    try:
        n_vocab = llm.n_vocab()
        prompt = np.random.default_rng(seed).integers(0, n_vocab, size=n_tokens).tolist()
        _warm_up(llm, n_vocab)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        greedy_next(llm)
        elapsed = time.perf_counter() - t0
    finally:
        llm.close()
    return n_tokens / elapsed


def llamacpp_greedy(
    gguf_path: Path, prompts: list[list[int]], max_new_tokens: int, n_threads: int = 2
) -> list[list[int]]:
    """llama.cpp's greedy continuation (token ids, no EOS stop) of each prompt; for parity checks."""
    longest = max(len(p) for p in prompts) + max_new_tokens
    llm = load_llama(Path(gguf_path), _context_for(longest), n_threads)
    try:
        results = []
        for ids in prompts:
            llm.reset()
            llm.eval(list(ids))
            toks: list[int] = []
            for step in range(max_new_tokens):
                toks.append(greedy_next(llm))
                if step + 1 < max_new_tokens:
                    llm.eval([toks[-1]])
            results.append(toks)
    finally:
        llm.close()
    return results
