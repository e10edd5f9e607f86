"""`glassbox bench` against two real servers on the same weights: glassbox and llama.cpp's server.

It exports the bundled demo model (or --model DIR) to GGUF (a --model FILE.gguf is served as it is by
both), starts `glassbox serve` and
`python -m llama_cpp.server` (from `pip install 'llama-cpp-python[server]'`) on this machine, runs the
same closed-loop workload against each with `glassbox bench --json`, and writes
benchmarks/results/bench-peers-<date>.json with both runs side by side.

    .venv/bin/python benchmarks/bench_peers.py [--model DIR] [--concurrency 1,4] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_export import export_gguf  # noqa: E402

from glassbox.models.sources import DEMO_MODEL_DIR  # noqa: E402
from glassbox.perf.hardware import cpu_name  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not ready in {timeout:.0f} s")


def _bench(url: str, args: argparse.Namespace, extra: list[str]) -> dict[str, Any]:
    cmd = [
        sys.executable,
        "-m",
        "glassbox.cli",
        "bench",
        url,
        "--concurrency",
        args.concurrency,
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--output-tokens",
        str(args.output_tokens),
        "--num-requests",
        str(args.num_requests),
        "--json",
        *extra,
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"bench failed: {r.stderr[-2000:]}")
    return dict(json.loads(r.stdout))


def _serve(cmd: list[str], url: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    _wait_ready(url, proc)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def main() -> int:
    ap = argparse.ArgumentParser(description="glassbox vs llama.cpp's server under `glassbox bench`")
    ap.add_argument("--model", type=Path, default=DEMO_MODEL_DIR)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--num-requests", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    work = RESULTS.parent / ".peer-work"
    work.mkdir(exist_ok=True)
    gguf = args.model if args.model.suffix == ".gguf" else work / f"{args.model.name}.gguf"
    if not gguf.is_file():
        export_gguf(args.model, gguf)
    c_max = max(int(c) for c in args.concurrency.split(","))
    ctx = args.prompt_tokens + args.output_tokens + 64
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch_version()},
        "model": str(args.model.name),
        "threads": args.threads,
        "workload": vars(args) | {"model": str(args.model)},
    }
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _serve(
        [
            sys.executable,
            "-m",
            "glassbox.cli",
            "serve",
            str(args.model),
            "--port",
            str(port),
            "--max-num-seqs",
            str(c_max),
            "--max-model-len",
            str(max(ctx, 512)),
        ],
        url,
        work / "glassbox.log",
    )
    try:
        result["glassbox"] = _bench(url, args, [])
    finally:
        _stop(proc)
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # llama.cpp splits its context between --n_parallel slots: give each slot a whole request
    proc = _serve(
        [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf),
            "--port",
            str(port),
            "--n_threads",
            str(args.threads),
            "--n_ctx",
            str(ctx * c_max),
            "--n_batch",
            "512",
        ],
        url,
        work / "llamacpp.log",
    )
    try:
        result["llama.cpp"] = _bench(url, args, ["--tokenizer", str(args.model)])
    finally:
        _stop(proc)
    out = RESULTS / f"bench-peers-{result['date']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'server':10s} {'c':>3s} {'out tok/s':>10s} {'TTFT p50':>9s} {'TPOT p50':>9s} {'failed':>6s}")
    for name in ("glassbox", "llama.cpp"):
        for run in result[name]["runs"]:
            print(
                f"{name:10s} {run['concurrency']:>3} {run['output_tok_s']:10.1f} "
                f"{run['ttft_s']['p50'] or 0:9.3f} {run['tpot_s']['p50'] or 0:9.4f} {run['failed']:>6}"
            )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
