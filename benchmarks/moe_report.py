"""Tables (Markdown) of a benchmarks/moe_compare.py result: per shape and thread count, the medians over the
rounds, every round's figures and the paired bursts' glassbox / llama.cpp ratios.

    python benchmarks/moe_report.py benchmarks/results/moe-compare-<date>.json > tables.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _f(v: Any, nd: int = 2) -> str:
    return f"{v:,.{nd}f}" if isinstance(v, float | int) else "-"


def shape_tables(name: str, res: dict[str, Any]) -> list[str]:
    b = res["bytes"]
    g = b["params_by_group"]
    out = [
        f"### {name}, {res['layers']} layers",
        "",
        f"Bytes read per batch-1 token: {b['bytes_per_token'] / 1e6:,.1f} MB = weights "
        f"{b['weight_bytes_per_token'] / 1e6:,.1f} MB (attention {2 * g['attention'] / 1e6:,.1f}, router "
        f"{2 * g['router'] / 1e6:,.2f}, active experts {2 * g['experts_active'] / 1e6:,.1f}, norms "
        f"{2 * g['norms'] / 1e6:,.2f}, LM head {2 * g['lm_head'] / 1e6:,.1f}, one embedding row) + KV cache "
        f"{b['kv_bytes_per_token_mean'] / 1e6:,.2f} MB (mean over the decode). Checkpoint "
        f"{b['checkpoint_bytes'] / 2**30:,.2f} GiB; GGUF {res['gguf_bytes'] / 2**30:,.2f} GiB.",
        "",
    ]
    for key, rows in res["rounds"].items():
        med = res["median"][key]
        out += [
            f"**{key.replace('=', ' = ')}** (medians of {len(rows)} rounds; tok/s)",
            "",
            "| figure | glassbox | llama.cpp | transformers | roofline |",
            "|---|---:|---:|---:|---:|",
            f"| decode, batch 1 | {_f(med.get('glassbox_b1_tok_s'))} | {_f(med.get('llama_cpp_b1_tok_s'))} | "
            f"{_f(med.get('transformers_b1_tok_s'))} | {_f(med.get('roofline_tok_s'))} |",
            f"| batch 1, fraction of the roofline | {_f(med.get('glassbox_b1_fraction_of_roofline'))} | "
            f"{_f(med.get('llama_cpp_b1_fraction_of_roofline'))} | "
            f"{_f(med.get('transformers_b1_fraction_of_roofline'))} | 1 |",
        ]
        over = [
            e
            for e in ("glassbox", "llama_cpp", "transformers")
            if (med.get(f"{e}_b1_fraction_of_roofline") or 0) > 1
        ]
        if over:  # a rate above its ceiling: the read probe under-measured the machine, not a faster engine
            out.append(f"| (above 1: the read probe was wrong, too low, for {', '.join(over)}) | | | | |")
        for n in (8, 32):
            if f"glassbox_b{n}_tok_s" in med:
                out.append(
                    f"| aggregate, {n} sequences | {_f(med.get(f'glassbox_b{n}_tok_s'), 1)} | - | "
                    f"{_f(med.get(f'transformers_b{n}_tok_s'), 1)} | |"
                )
        out += ["", "| round | idle | read GB/s | glassbox / llama.cpp, each burst (idle before it) | "
                "median | glassbox / transformers b1, b8, b32 |", "|---|---:|---:|---|---:|---|"]  # fmt: skip
        for r in rows:
            bursts = ", ".join(f"{x['ratio']:.2f} ({x['idle']:.2f})" for x in r.get("b1_bursts", []))
            hf = ", ".join(_f(r.get(f"glassbox_over_transformers_b{n}")) for n in (1, 8, 32))
            out.append(
                f"| {r['round']} | {r['idle']:.2f} | {r['read_gbs']:.1f} | {bursts} | "
                f"{_f(r.get('glassbox_over_llama_cpp_b1'))} | {hf} |"
            )
        out.append("")
    return out


def render(result: dict[str, Any]) -> str:
    lines: list[str] = []
    for name, res in result["shapes"].items():
        lines += shape_tables(name, res) if "error" not in res else [f"### {name}: {res['error']}", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(json.loads(Path(sys.argv[1]).read_text())))
