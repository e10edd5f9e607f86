"""Train glassbox's bundled demo model: a tiny Llama that completes Python, from text on every machine.

The data is the CPython standard library's own sources (found with ``sysconfig``), so the whole run needs
nothing but this repository and a Python install: no model hub, no dataset download. The script

1. splits the stdlib ``.py`` files into train and held-out sets by a hash of their relative path,
2. trains a byte-level BPE tokenizer on the train files (``glassbox.tokenizer.training``),
3. trains a Llama-architecture model (GQA, RoPE, SwiGLU, RMSNorm, tied embeddings) in fp32 with AdamW,
   linear warmup and cosine decay, on random windows drawn by a seeded generator,
4. measures perplexity on the held-out files with the weights as shipped (bf16),
5. writes a Hugging Face directory: config.json, model.safetensors (bf16), tokenizer.json,
   tokenizer_config.json (with a chat template), generation_config.json and a model card README.md.

Reproducibility is by steps: the same ``--steps``, ``--seed`` and ``--threads`` on the same Python version
(the stdlib is the data) and the same torch build give the same weights. ``--time-budget-s`` is only a
safety net; the card records whether it cut the run short.

Usage::

    python tools/train_demo_model.py --time-budget-s 0     # the shipped model (~25 min on one idle core)
    python tools/train_demo_model.py --steps 20 --out /tmp/demo-smoke   # a quick smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import shlex
import sys
import sysconfig
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, LlamaForCausalLM

from glassbox.perf.hardware import cpu_name
from glassbox.tokenizer.training import (
    BOS,
    EOS,
    EOT,
    iter_texts,
    save_hf_tokenizer,
    special_token_id,
    stdlib_python_files,
    train_bpe,
)

log = logging.getLogger("train_demo_model")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "src" / "glassbox" / "demo"
SAMPLE_PROMPT = "def fibonacci(n):"
HELDOUT_MODULUS = 50  # a file is held out when crc32(relative path) % 50 == 0: about 2% of files


@dataclass(frozen=True)
class Shape:
    """The model and tokenizer shape (fixed: the demo model is one artefact, not a sweep)."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 768
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5


@dataclass(frozen=True)
class TrainArgs:
    """Optimisation settings; every field is written to the model card."""

    steps: int
    batch_size: int
    seq_len: int
    lr: float
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    seed: int
    threads: int
    time_budget_s: float


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags; defaults produce the shipped model."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    p.add_argument("--steps", type=int, default=700, help="optimizer steps (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step (default: %(default)s)")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default: %(default)s)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed for init and data order (default: %(default)s)")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads; 1 is fastest on a busy shared machine (default: %(default)s)",
    )
    p.add_argument(
        "--time-budget-s",
        type=float,
        default=1680.0,
        help="stop training early past this many seconds of training; 0 = no limit (default: %(default)s)",
    )
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be >= 1")
    if args.threads < 1:
        p.error("--threads must be >= 1")
    return args


# ----------------------------------------------------------------------------------------------------- data


def split_files(files: list[Path], root: Path) -> tuple[list[Path], list[Path]]:
    """Split files into (train, held-out) by a stable hash of each path relative to root."""
    train: list[Path] = []
    held: list[Path] = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        (held if zlib.crc32(rel.encode()) % HELDOUT_MODULUS == 0 else train).append(path)
    if not held or not train:
        raise RuntimeError(f"degenerate split: {len(train)} train files, {len(held)} held-out files")
    return train, held


def encode_files(tok: Tokenizer, files: list[Path], eos_id: int) -> tuple[torch.Tensor, int, int]:
    """Token ids of all readable files as one stream, each file followed by EOS.

    Returns (ids, number of files read, number of UTF-8 bytes read).
    """
    texts = list(iter_texts(files, extra=""))[1:]  # iter_texts yields the `extra` text first
    ids: list[int] = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos_id)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    return torch.tensor(ids, dtype=torch.long), len(texts), n_bytes


def sample_batch(data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """Random windows of seq_len + 1 tokens; the generator fixes the data order."""
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=gen)
    return torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()])  # (batch, seq_len + 1)


# ---------------------------------------------------------------------------------------------------- model


def build_config(shape: Shape, bos_id: int, eos_id: int) -> LlamaConfig:
    """A LlamaConfig for the demo shape, with tied input/output embeddings."""
    return LlamaConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        max_position_embeddings=shape.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": shape.rope_theta},
        rms_norm_eps=shape.rms_norm_eps,
        hidden_act="silu",
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=0.02,
    )


def count_params(model: torch.nn.Module) -> int:
    """Unique parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())


def lr_at(step: int, args: TrainArgs) -> float:
    """Linear warmup to args.lr, then cosine decay to args.lr * min_lr_ratio at the last step."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = (step - args.warmup_steps) / max(1, args.steps - args.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return args.lr * (args.min_lr_ratio + (1.0 - args.min_lr_ratio) * cosine)


def make_optimizer(model: torch.nn.Module, args: TrainArgs) -> torch.optim.Optimizer:
    """AdamW with weight decay on matrices only (not on norms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, foreach=True)


def train(model: LlamaForCausalLM, data: torch.Tensor, args: TrainArgs) -> dict[str, float | int | bool]:
    """Run the optimisation loop; returns the run's summary numbers."""
    gen = torch.Generator().manual_seed(args.seed)
    opt = make_optimizer(model, args)
    model.train()
    t0 = time.perf_counter()
    ema_loss = float("nan")
    losses: list[float] = []
    step_times: list[float] = []
    step = 0
    stopped_early = False
    for step in range(args.steps):
        if args.time_budget_s > 0 and time.perf_counter() - t0 > args.time_budget_s:
            stopped_early = True
            log.warning(
                "time budget of %.0f s reached: stopping at step %d of %d",
                args.time_budget_s,
                step,
                args.steps,
            )
            break
        t_step = time.perf_counter()
        lr = lr_at(step, args)
        for group in opt.param_groups:
            group["lr"] = lr
        batch = sample_batch(data, args.batch_size, args.seq_len, gen)
        logits = model(input_ids=batch[:, :-1]).logits  # (batch, seq_len, vocab)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        value = loss.item()
        losses.append(value)
        step_times.append(time.perf_counter() - t_step)
        ema_loss = value if math.isnan(ema_loss) else 0.95 * ema_loss + 0.05 * value
        if step % 25 == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - t0
            eta = elapsed / (step + 1) * (args.steps - step - 1)
            log.info(
                "step %5d/%d  loss %.4f  ema %.4f  lr %.2e  %.1f s elapsed  eta %.0f s",
                step,
                args.steps,
                value,
                ema_loss,
                lr,
                elapsed,
                eta,
            )
    else:
        step = args.steps
    wall = time.perf_counter() - t0
    tail = losses[-50:]
    return {
        "steps_done": step,
        "stopped_early": stopped_early,
        "train_wall_s": wall,
        "median_step_s": sorted(step_times)[len(step_times) // 2],
        "final_loss_last50": sum(tail) / len(tail),
        "final_loss_last_step": losses[-1],
    }


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, data: torch.Tensor, seq_len: int, batch_size: int) -> float:
    """Mean next-token cross-entropy (nats) over non-overlapping seq_len windows of data."""
    model.eval()
    n_windows = (data.numel() - 1) // seq_len
    total, count = 0.0, 0
    for first in range(0, n_windows, batch_size):
        idx = range(first, min(n_windows, first + batch_size))
        batch = torch.stack([data[i * seq_len : i * seq_len + seq_len + 1] for i in idx])
        logits = model(input_ids=batch[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1), reduction="sum"
        )
        total += loss.item()
        count += batch[:, 1:].numel()
    return total / count


@torch.no_grad()
def greedy_sample(model_dir: Path, prompt: str, max_new_tokens: int) -> str:
    """Reload the saved directory with transformers and greedily continue prompt; returns the new text."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=False))


# ----------------------------------------------------------------------------------------------------- save


def save_model(
    model: LlamaForCausalLM, out: Path, bos_id: int, eos_ids: list[int], rope_theta: float
) -> None:
    """Write config.json, model.safetensors (bf16) and generation_config.json to out."""
    model.bfloat16()
    model.config.dtype = torch.bfloat16
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_ids, pad_token_id=eos_ids[0], do_sample=False
    )
    model.save_pretrained(out, safe_serialization=True)
    # Older loaders (transformers 4.x, other engines) read `rope_theta` and `torch_dtype` at the top level.
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.setdefault("rope_theta", rope_theta)
    cfg.setdefault("torch_dtype", "bfloat16")
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def dir_size(path: Path) -> int:
    """Total bytes of the files directly in path."""
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def write_card(out: Path, facts: dict[str, Any]) -> None:
    """The model card: what the model is, how it was made, how well it does, and what it is not."""
    f = facts
    text = f"""---
license: apache-2.0
library_name: transformers
pipeline_tag: text-generation
tags: [llama, code, toy, glassbox-demo]
---

# glassbox demo model: a tiny Python-completion Llama

This is the model that `glassbox` serves when it is given no model (`LLM(model=None)`, `glassbox serve`
with no argument). It exists so that glassbox runs its whole pipeline, tokenizer to paged-KV decode to
streamed text, on a machine with no access to a model hub. It was trained from scratch by
`tools/train_demo_model.py` on the CPython standard library's own Python sources, which every Python
install carries.

## What it is, and what it is not

- **It is** a {f["params_m"]:.1f}M-parameter toy that continues Python source code: give it `def`, `class`,
  `import` or a docstring and it writes something that looks like the standard library.
- **It is not** an assistant. It was never trained on conversations or instructions; the chat template in
  `tokenizer_config.json` exists so that chat endpoints can be exercised, not because the model can chat.
  Its answers to questions are nonsense.
- **It is not** correct code. It has seen about {f["tokens_seen_m"]:.1f}M tokens; what it writes is
  Python-shaped, often with wrong names, wrong logic and unbalanced structure. Do not run it.
- **It is** a real Llama checkpoint: grouped-query attention ({f["heads"]} query heads sharing
  {f["kv_heads"]} key/value heads), RoPE, SwiGLU MLP, RMSNorm, tied input/output embeddings, bf16 weights
  with Hugging Face parameter names. It loads in `transformers` (`AutoModelForCausalLM`,
  `AutoTokenizer`) as well as in glassbox, which makes it useful for parity tests.

## Architecture

| field | value |
|---|---|
| architecture | `LlamaForCausalLM` (`model_type: llama`) |
| parameters | {f["params"]:,} (tied embeddings counted once; {f["embed_params"]:,} in the embedding) |
| layers | {f["layers"]} |
| hidden size | {f["hidden"]} |
| MLP intermediate size | {f["intermediate"]} |
| attention heads / KV heads / head dim | {f["heads"]} / {f["kv_heads"]} / {f["head_dim"]} |
| vocabulary | {f["vocab"]} (byte-level BPE; special tokens {", ".join(f"`{t}`" for t in f["specials"])}) |
| max position embeddings | {f["max_pos"]} (trained on {f["seq_len"]}-token windows only) |
| RoPE theta | {f["rope_theta"]:g} |
| weights on disk | bf16, `model.safetensors` |

## Data

The `.py` files of the CPython {f["python_version"]} standard library (`sysconfig.get_paths()["stdlib"]`,
without `site-packages` and `test` directories). A file is held out when `crc32(relative path) % {HELDOUT_MODULUS} == 0`.

| split | files | bytes | tokens |
|---|---|---|---|
| train | {f["train_files"]:,} | {f["train_bytes"]:,} | {f["train_tokens"]:,} |
| held out | {f["held_files"]:,} | {f["held_bytes"]:,} | {f["held_tokens"]:,} |

The tokenizer was trained on the train files only. Files are joined into one token stream, each followed by
`{EOS}`; no `{BOS}` is added, matching `add_bos_token: false` at inference.

## Training

| field | value |
|---|---|
| steps | {f["steps_done"]}{" (stopped early by the time budget; asked for " + str(f["steps"]) + ")" if f["stopped_early"] else ""} |
| batch | {f["batch_size"]} sequences x {f["seq_len"]} tokens = {f["batch_size"] * f["seq_len"]:,} tokens per step |
| tokens seen | {f["tokens_seen"]:,} (about {f["epochs"]:.2f} epochs of the train split) |
| optimizer | AdamW (betas 0.9, 0.95; weight decay {f["weight_decay"]} on matrices), grad clip {f["grad_clip"]} |
| learning rate | peak {f["lr"]:g}, {f["warmup_steps"]} warmup steps, cosine decay to {f["min_lr_ratio"]:g} x peak |
| precision | fp32 training, weights cast to bf16 for saving |
| data order | random windows drawn by `torch.Generator().manual_seed({f["seed"]})` |
| hardware | {f["hardware"]}; torch threads: {f["threads"]} |
| software | Python {f["python_version"]}, torch {f["torch_version"]}, transformers {f["transformers_version"]}, tokenizers {f["tokenizers_version"]} |
| training wall time | {f["train_wall_s"] / 60:.1f} min ({f["total_wall_s"] / 60:.1f} min for the whole script; median {f["median_step_s"]:.2f} s per step) |

## Results

| metric | value |
|---|---|
| final train loss (mean of the last 50 steps) | {f["final_loss_last50"]:.3f} nats/token |
| held-out loss (bf16 weights as shipped) | {f["held_loss"]:.3f} nats/token |
| held-out perplexity | {f["held_ppl"]:.2f} |
| held-out bits per byte | {f["held_bpb"]:.3f} |

Greedy continuation of `{SAMPLE_PROMPT}` ({f["sample_tokens"]} new tokens, transformers, bf16 weights in fp32):

```python
{SAMPLE_PROMPT}{f["sample"]}
```

## Reproduce

```bash
{f["command"]}
```

Reproducibility is by steps. The same command on the same Python version (the stdlib *is* the data), torch
build and thread count gives the same weights; a different thread count or CPU may change floating-point
reduction order and so the last digits of the results.

## Files

| file | bytes |
|---|---|
{f["file_table"]}
"""
    (out / "README.md").write_text(text)


# ----------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    """Train, evaluate and save the demo model; returns a process exit code."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    t_start = time.perf_counter()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)

    shape = Shape()
    targs = TrainArgs(
        steps=args.steps,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        lr=args.lr,
        min_lr_ratio=0.1,
        warmup_steps=min(100, max(1, args.steps // 10)),
        weight_decay=0.1,
        grad_clip=1.0,
        seed=args.seed,
        threads=args.threads,
        time_budget_s=args.time_budget_s,
    )

    root = Path(sysconfig.get_paths()["stdlib"])
    train_files, held_files = split_files(stdlib_python_files(), root)
    log.info("stdlib at %s: %d train files, %d held-out files", root, len(train_files), len(held_files))

    t = time.perf_counter()
    tok = train_bpe(iter_texts(train_files), shape.vocab_size)
    bos_id, eos_id, eot_id = (special_token_id(tok, s) for s in (BOS, EOS, EOT))
    train_data, n_train_files, train_bytes = encode_files(tok, train_files, eos_id)
    held_data, n_held_files, held_bytes = encode_files(tok, held_files, eos_id)
    log.info(
        "tokenizer: vocab %d in %.1f s; train %d tokens (%.2f bytes/token), held-out %d tokens",
        tok.get_vocab_size(),
        time.perf_counter() - t,
        train_data.numel(),
        train_bytes / train_data.numel(),
        held_data.numel(),
    )

    config = build_config(shape, bos_id, eos_id)
    model = LlamaForCausalLM(config)
    n_params = count_params(model)
    log.info("model: %d parameters (%.2fM)", n_params, n_params / 1e6)

    summary = train(model, train_data, targs)

    # Evaluate the weights as shipped: round to bf16, compute in fp32.
    model.bfloat16().float()
    held_loss = evaluate(model, held_data, targs.seq_len, batch_size=16)
    held_ppl = math.exp(held_loss)
    held_bpb = held_loss * held_data.numel() / (held_bytes * math.log(2))
    log.info("held-out loss %.4f, perplexity %.2f, %.3f bits/byte", held_loss, held_ppl, held_bpb)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("README.md", "config.json", "generation_config.json", "model.safetensors"):
        (out / stale).unlink(missing_ok=True)
    save_model(model, out, bos_id, [eos_id, eot_id], shape.rope_theta)
    save_hf_tokenizer(tok, out, model_max_length=shape.max_position_embeddings)

    sample_tokens = 48
    sample = greedy_sample(out, SAMPLE_PROMPT, sample_tokens)
    log.info("greedy continuation of %r: %r", SAMPLE_PROMPT, sample)

    tokens_seen = int(summary["steps_done"]) * targs.batch_size * targs.seq_len
    cmd_args = [
        "python",
        "tools/train_demo_model.py",
        "--steps",
        str(args.steps),
        "--batch-size",
        str(args.batch_size),
        "--seq-len",
        str(args.seq_len),
        "--lr",
        str(args.lr),
        "--seed",
        str(args.seed),
        "--threads",
        str(args.threads),
        "--time-budget-s",
        "0" if not summary["stopped_early"] else str(args.time_budget_s),
    ]
    if out.resolve() != DEFAULT_OUT.resolve():
        cmd_args += ["--out", str(out)]
    facts: dict[str, Any] = {
        **asdict(shape),
        **asdict(targs),
        **summary,
        "params": n_params,
        "params_m": n_params / 1e6,
        "embed_params": model.model.embed_tokens.weight.numel(),
        "layers": shape.num_hidden_layers,
        "hidden": shape.hidden_size,
        "intermediate": shape.intermediate_size,
        "heads": shape.num_attention_heads,
        "kv_heads": shape.num_key_value_heads,
        "vocab": tok.get_vocab_size(),
        "specials": [BOS, EOS, EOT, "<|user|>", "<|assistant|>", "<|system|>"],
        "max_pos": shape.max_position_embeddings,
        "python_version": platform.python_version(),
        "train_files": n_train_files,
        "train_bytes": train_bytes,
        "train_tokens": train_data.numel(),
        "held_files": n_held_files,
        "held_bytes": held_bytes,
        "held_tokens": held_data.numel(),
        "tokens_seen": tokens_seen,
        "tokens_seen_m": tokens_seen / 1e6,
        "epochs": tokens_seen / train_data.numel(),
        "hardware": f"{cpu_name()} ({os.cpu_count()} cores visible)",
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "tokenizers_version": tokenizers.__version__,
        "held_loss": held_loss,
        "held_ppl": held_ppl,
        "held_bpb": held_bpb,
        "sample": sample,
        "sample_tokens": sample_tokens,
        "command": shlex.join(cmd_args),
        "total_wall_s": time.perf_counter() - t_start,
        "file_table": "",
    }
    files = sorted(p for p in out.iterdir() if p.is_file())
    facts["file_table"] = "\n".join(f"| `{p.name}` | {p.stat().st_size:,} |" for p in files)
    write_card(out, facts)
    files = sorted(p for p in out.iterdir() if p.is_file())
    total = dir_size(out)
    log.info("wrote %s: %d files, %.2f MB", out, len(files), total / 1e6)
    if total > 32 * 1024 * 1024:
        log.error("demo directory is %.1f MB, over the 32 MB limit", total / 1e6)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
