"""Tensor parallelism on the CPU (gloo, spawned local ranks): float32 greedy token-exact with transformers
and with TP=1, each rank holding only its shards, and a dead or hung rank failing requests loudly."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tiny_models import build_tiny_model, hf_greedy

from glassbox import distributed as distributed
from glassbox.config import EngineConfig
from glassbox.engine import tp_model, tp_runtime
from glassbox.engine.async_engine import AsyncEngine, RequestError
from glassbox.llm import LLM
from glassbox.models.config_reader import facts_from_dir
from glassbox.models.model_config import ModelConfig
from glassbox.models.tensor_parallel import check_tp, sharded_safetensors
from glassbox.sampling_params import SamplingParams

MAX_NEW = 6
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_NEW, ignore_eos=True, logprobs=1)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]], list]:
    d = build_tiny_model("llama", tmp_path_factory.mktemp("tp"))  # 4 heads, 2 KV heads: split by head
    prompts = [[1, 5, 9, 20, 33], list(range(3, 63)), [7] * 3, list(range(100, 130))]
    return d, prompts, hf_greedy(d, prompts, MAX_NEW)


@pytest.fixture(autouse=True)
def _leave_group() -> object:
    yield
    tp_runtime.shutdown()  # each test's engine leaves the group (and reaps its workers)


def _check(outs: list, ref: list, tol: float) -> None:
    for i, (out, (toks, lps)) in enumerate(zip(outs, ref, strict=True)):
        assert out.token_ids == toks, f"prompt {i}: {out.token_ids} != {toks}"
        for j, t in enumerate(toks):
            assert abs(out.logprobs[j][t] - lps[j]) < tol


def test_tp2_greedy_matches_transformers_and_tp1(llama: tuple[Path, list[list[int]], list]) -> None:
    d, prompts, ref = llama
    one = LLM(str(d), dtype="float32", max_num_seqs=2).generate(prompts, GREEDY)
    # 6 blocks x 16 tokens: the 60-token prompt's 5th block is not there beside two others: preemption
    llm = LLM(str(d), dtype="float32", tensor_parallel_size=2, max_num_seqs=3, num_kv_blocks=6)
    two = llm.generate(prompts, GREEDY)
    _check(two, ref, 1e-4)
    _check(two, [(o.token_ids, [o.logprobs[j][t] for j, t in enumerate(o.token_ids)]) for o in one], 1e-5)
    assert llm.engine.scheduler.num_preemptions > 0
    # the bytes each rank's model holds: half of every split tensor, the norms whole
    ranks, total = llm.engine.executor.rank_weight_bytes, _file_bytes(d)
    assert len(ranks) == 2 and all(0.45 * total < r < 0.55 * total for r in ranks), (ranks, total)


def _file_bytes(d: Path) -> int:
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        return sum(f.get_tensor(k).numel() * 4 for k in f.keys())  # noqa: SIM118


def test_each_rank_reads_only_its_shards(llama: tuple[Path, list[list[int]], list]) -> None:
    d = llama[0]
    cfg = ModelConfig.from_facts(facts_from_dir(d))
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        full = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    shards = [dict(sharded_safetensors(d, cfg, r, 2)) for r in range(2)]
    for name, t in full.items():
        a, b = shards[0][name], shards[1][name]
        if "norm" in name:
            assert torch.equal(a, t) and torch.equal(b, t)
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            assert a.shape[1] == t.shape[1] // 2 and torch.equal(torch.cat([a, b], 1), t)
        else:  # q/k/v, gate/up, embedding, LM head: by output rows (heads, FFN columns, vocabulary)
            assert a.shape[0] == t.shape[0] // 2 and torch.equal(torch.cat([a, b], 0), t), name
    held = [sum(t.numel() for t in s.values()) for s in shards]
    norms = sum(t.numel() for n, t in full.items() if "norm" in n)
    assert held[0] == held[1] == (sum(t.numel() for t in full.values()) - norms) // 2 + norms


def test_tp2_moe_with_shared_expert_matches_transformers(tmp_path: Path) -> None:
    """Qwen2-MoE (8 experts, top-2, a gated shared expert, one dense layer): each expert split by FFN width."""
    d = build_tiny_model("qwen2_moe", tmp_path)
    prompts = [[1, 5, 9, 20, 33], list(range(3, 40))]
    ref = hf_greedy(d, prompts, MAX_NEW)
    llm = LLM(str(d), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(prompts, GREEDY), ref, 1e-4)
    ranks, total = llm.engine.executor.rank_weight_bytes, _file_bytes(d)
    assert all(0.45 * total < r < 0.55 * total for r in ranks), (ranks, total)


def _wait_error(llm: LLM, world: int, limit_s: float) -> float:
    t0 = time.monotonic()
    with pytest.raises(distributed.TensorParallelError, match=f"rank 0 of {world}"):
        llm.generate([[1, 2, 3]], GREEDY)
    took = time.monotonic() - t0
    assert took < limit_s
    with pytest.raises(distributed.TensorParallelError, match="failed"):  # at once from then on
        llm.generate([[1, 2, 3]], GREEDY)
    return took


def test_tp3_replicated_kv_head_padded_vocab_tied_then_a_killed_worker(tmp_path: Path) -> None:
    """Qwen3 (q/k norms, tied embeddings) with 6 heads and 1 KV head on 3 ranks: the KV head replicated,
    the 512-token vocabulary in shards of 171 rows (the last zero-padded). Then a worker is killed: the
    next request fails within seconds."""
    d = build_tiny_model(
        "qwen3", tmp_path, num_attention_heads=6, num_key_value_heads=1, intermediate_size=96
    )
    prompts = [[1, 5, 9, 20, 33], list(range(3, 40))]
    ref = hf_greedy(d, prompts, MAX_NEW)
    llm = LLM(str(d), dtype="float32", tensor_parallel_size=3)
    _check(llm.generate(prompts, GREEDY), ref, 1e-4)
    assert llm.engine.executor.kv_caches[0].shape[3] == 1
    worker = tp_runtime._PROCS[1]
    worker.kill()
    worker.join(5)
    _wait_error(llm, 3, 10)


def test_hung_worker_fails_within_the_timeout_and_stops_the_server_engine(
    llama: tuple[Path, list[list[int]], list], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GLASSBOX_TP_TIMEOUT", "3")
    llm = LLM(str(llama[0]), dtype="float32", tensor_parallel_size=2)
    assert llm.generate([[1, 2, 3]], GREEDY)[0].token_ids
    pid = tp_runtime._PROCS[0].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        took = _wait_error(llm, 2, 12)
        assert took >= 2.5  # the timeout, not a broken socket
    finally:
        os.kill(pid, signal.SIGKILL)

    async def serve_one() -> tuple[
        bool, str
    ]:  # the server's engine thread: the request errs, health goes bad
        engine = AsyncEngine(llm.engine)
        engine.start()
        stream = engine.add_request("r", [1, 2, 3], GREEDY)
        with pytest.raises(RequestError) as err:
            async for _ in stream:
                pass
        await asyncio.sleep(0.05)
        return engine.is_running, str(err.value)

    running, message = asyncio.run(asyncio.wait_for(serve_one(), 20))
    assert not running and "tensor-parallel group has failed" in message


def test_refusals_and_launch_plans(llama: tuple[Path, list[list[int]], list]) -> None:
    cfg = ModelConfig.from_facts(facts_from_dir(llama[0]))
    with pytest.raises(ValueError, match="attention sinks"):
        check_tp(dataclasses.replace(cfg, attention_sinks=True), 2)
    with pytest.raises(ValueError, match="Gemma3ForCausalLM has no tensor-parallel split"):
        check_tp(dataclasses.replace(cfg, architecture="Gemma3ForCausalLM"), 2)
    with pytest.raises(ValueError, match="expert FFN width 33"):
        check_tp(dataclasses.replace(cfg, layer_moe=(True, True), moe_intermediate_size=33), 2)
    with pytest.raises(ValueError, match="must divide the model's 4 heads"):
        check_tp(cfg, 3)
    with pytest.raises(ValueError, match="CPU \\(gloo\\) only so far: NCCL"):
        tp_model.check_run(2, torch.device("cuda"), EngineConfig(), None, cfg)
    t0 = time.monotonic()  # refused before any rank is spawned
    with pytest.raises(ValueError, match="--tensor-parallel-size 2 with --quantization is not built"):
        LLM(str(llama[0]), dtype="float32", tensor_parallel_size=2, quantization="int8")
    assert time.monotonic() - t0 < 2 and distributed.state() is None and not tp_runtime._PROCS
    with pytest.raises(ValueError, match="--nnodes"):
        EngineConfig(tensor_parallel_size=2, nnodes=3)
    base = EngineConfig(tensor_parallel_size=4, nnodes=2, node_rank=1, master_addr="10.0.0.1")
    plan = tp_runtime.launch_plan(base, env={})
    assert (plan.rank, plan.spawn, plan.addr, plan.port) == (2, (3,), "10.0.0.1", 29500)
    env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "7"}
    assert tp_runtime.launch_plan(base, env=env) == tp_runtime.Launch(1, 4, "h", 7, ())
