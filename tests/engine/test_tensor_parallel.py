"""Tensor parallelism on the CPU (gloo, spawned local ranks): float32 greedy token-exact with transformers
and with TP=1, each rank holding only its shards, and a dead or hung rank failing requests loudly."""

from __future__ import annotations

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
from glassbox.llm import LLM
from glassbox.models.config_reader import facts_from_dir
from glassbox.models.model_config import ModelConfig
from glassbox.models.tensor_parallel import check_tp, sharded_safetensors
from glassbox.sampling_params import SamplingParams
from glassbox.tokenizer.hf_tokenizer import Tokenizer

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
    # trace: rank 0's time in collectives, per phase; a step makes 2 all-reduces a layer, one for the
    # vocab-parallel embedding and one all-gather of the logits, and one broadcast
    from glassbox.trace import run_trace

    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    tp = run_trace(llm.engine, "the moon", 5, None, params=params)["tensor_parallel"]
    per_step = 2 * llm.engine.facts.num_layers + 2
    assert tp["ranks"] == 2 and tp["rank_weight_bytes"] == llm.engine.executor.rank_weight_bytes
    assert (tp["prefill"]["collectives"], tp["decode"]["collectives"]) == (per_step, 4 * per_step)
    for ph in ("prefill", "decode"):  # inside rank 0's steps
        assert 0 < tp[ph]["collective_ms"] + tp[ph]["broadcast_ms"] < tp[ph]["step_ms"]
        assert 0 < tp[ph]["share"] < 1
    # the bytes each rank's model holds: half of every split tensor, the norms whole
    ranks, total = llm.engine.executor.rank_weight_bytes, _file_bytes(d)
    assert len(ranks) == 2 and all(0.45 * total < r < 0.55 * total for r in ranks), (ranks, total)


def test_tp4_mistral_with_replicated_kv_heads_matches_transformers(tmp_path: Path) -> None:
    """Four ranks over two KV heads (each replicated on two ranks), Mistral's sliding window past the
    prompt: token-exact with transformers."""
    d = build_tiny_model("mistral", tmp_path)
    prompts = [list(range(3, 63)), [1, 5, 9, 20, 33]]  # 60 + 6 tokens: past the 48-token window
    ref = hf_greedy(d, prompts, MAX_NEW)
    _check(
        LLM(str(d), dtype="float32", tensor_parallel_size=4, max_num_seqs=2).generate(prompts, GREEDY),
        ref,
        1e-4,
    )


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
    # 3 ranks: the 512-row vocabulary in shards of 171 rows, the last zero-padded
    embed = [dict(sharded_safetensors(d, cfg, r, 3))["model.embed_tokens.weight"] for r in range(3)]
    table = full["model.embed_tokens.weight"]
    assert [e.shape[0] for e in embed] == [171] * 3 and not embed[2][170:].any()
    assert torch.equal(torch.cat(embed)[:512], table)
    held = [sum(t.numel() for t in s.values()) for s in shards]
    norms = sum(t.numel() for n, t in full.items() if "norm" in n)
    assert held[0] == held[1] == (sum(t.numel() for t in full.values()) - norms) // 2 + norms


def test_tp2_moe_with_shared_expert_matches_transformers_then_a_killed_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Qwen2-MoE (8 experts, top-2, a gated shared expert, one dense layer): each expert split by FFN width.
    Then a worker is killed. The step timeout is 5 s here: gloo notices a dead peer at once on most paths,
    but only at the timeout (30 s by default) on others (a CI run saw 30 s once)."""
    monkeypatch.setenv("GLASSBOX_TP_TIMEOUT", "5")
    d = build_tiny_model("qwen2_moe", tmp_path)
    prompts = [[1, 5, 9, 20, 33], list(range(3, 40))]
    ref = hf_greedy(d, prompts, MAX_NEW)
    llm = LLM(str(d), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(prompts, GREEDY), ref, 1e-4)
    ranks, total = llm.engine.executor.rank_weight_bytes, _file_bytes(d)
    assert all(0.45 * total < r < 0.55 * total for r in ranks), (ranks, total)
    # a killed worker: the next request fails within seconds, and every one after it at once
    worker = tp_runtime._PROCS[0]
    worker.kill()
    worker.join(5)
    t0 = time.monotonic()
    with pytest.raises(distributed.TensorParallelError, match="rank 0 of 2"):
        llm.generate([[1, 2, 3]], GREEDY)
    assert time.monotonic() - t0 < 10
    with pytest.raises(distributed.TensorParallelError, match="has failed"):
        llm.generate([[1, 2, 3]], GREEDY)


def _worker_pid(parent: int) -> int:
    """The spawned rank among ``parent``'s children (not multiprocessing's resource tracker)."""
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(stat[1]) == parent and b"spawn_main" in cmd:
            return int(entry.name)
    raise AssertionError(f"no spawned rank under {parent}")


def test_server_tp2_answers_then_a_hung_worker_fails_requests_and_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`glassbox serve --tensor-parallel-size 2` of a Qwen3 (q/k norms, tied embeddings) with one KV head
    (replicated on both ranks) answers the openai client with transformers' greedy tokens; a worker that
    stops answering fails the next request after GLASSBOX_TP_TIMEOUT and /health goes 503."""
    from openai import InternalServerError, OpenAI
    from server_harness import MODEL_NAME, start_server

    d = build_tiny_model("qwen3", tmp_path, num_key_value_heads=1)
    prompts = [list(range(3, 40))]
    ref = hf_greedy(d, prompts, MAX_NEW)
    monkeypatch.setenv("GLASSBOX_TP_TIMEOUT", "2")
    server = start_server(d, tmp_path, "--tensor-parallel-size", "2", "--dtype", "float32")
    try:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=30)
        out = client.completions.create(
            model=MODEL_NAME, prompt=prompts[0], max_tokens=MAX_NEW, temperature=0, logprobs=1
        )
        assert out.usage is not None and out.usage.completion_tokens == MAX_NEW
        assert out.choices[0].text == Tokenizer.from_dir(d).decode(ref[0][0])
        pid = _worker_pid(server.proc.pid)
        os.kill(pid, signal.SIGSTOP)
        try:
            t0 = time.monotonic()
            with pytest.raises(InternalServerError, match="rank 0 of 2"):
                client.completions.create(model=MODEL_NAME, prompt=prompts[0], max_tokens=2)
            assert 1.8 <= time.monotonic() - t0 < 12  # the timeout, not a broken socket; never a hang
            assert server.health()["status"] == "unavailable"
        finally:
            os.kill(pid, signal.SIGKILL)
    finally:
        server.stop()


def test_refusals_and_launch_plans(
    llama: tuple[Path, list[list[int]], list], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = ModelConfig.from_facts(facts_from_dir(llama[0]))
    check_tp(dataclasses.replace(cfg, attention_sinks=True), 2)  # gpt-oss's sinks split by head
    with pytest.raises(
        ValueError, match="NemotronHForCausalLM has no tensor-parallel split"
    ):  # a family to come
        check_tp(dataclasses.replace(cfg, architecture="NemotronHForCausalLM"), 2)
    with pytest.raises(ValueError, match="expert FFN width 33"):
        check_tp(dataclasses.replace(cfg, layer_moe=(True, True), moe_intermediate_size=33), 2)
    with pytest.raises(ValueError, match="must divide the model's 4 heads"):
        check_tp(cfg, 3)
    if torch.cuda.device_count() < 2:  # NCCL: a GPU a rank (GLASSBOX_TP_BACKEND=gloo lets ranks share one)
        with pytest.raises(ValueError, match="on CUDA runs a rank a GPU \\(NCCL\\): this host has [01] GPU"):
            tp_model.check_run(2, torch.device("cuda"), EngineConfig(), None, cfg)
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # torchrun: one rank on this host, one on another
        with pytest.raises(ValueError, match="this host has [01] GPU\\(s\\) for its 1 ranks"):
            tp_model.check_run(2, torch.device("cuda"), EngineConfig(), None, cfg)
        monkeypatch.setenv("GLASSBOX_TP_BACKEND", "gloo")
        tp_model.check_run(2, torch.device("cuda"), EngineConfig(), None, cfg)
        monkeypatch.delenv("GLASSBOX_TP_BACKEND")
        monkeypatch.delenv("LOCAL_WORLD_SIZE")
    cpu = torch.device("cpu")
    tp_model.check_run(4, cpu, EngineConfig(quantization="fp8"), None, cfg)  # a scale per row: any K shard
    t0 = time.monotonic()  # refused before any rank is spawned
    with pytest.raises(ValueError, match="--tensor-parallel-size 4 with --quantization nvfp4: o_proj's 64"):
        LLM(str(llama[0]), dtype="float32", tensor_parallel_size=4, quantization="nvfp4")
    assert time.monotonic() - t0 < 2 and distributed.state() is None and not tp_runtime._PROCS
    with pytest.raises(ValueError, match="--nnodes"):
        EngineConfig(tensor_parallel_size=2, nnodes=3)
    base = EngineConfig(tensor_parallel_size=4, nnodes=2, node_rank=1, master_addr="10.0.0.1")
    plan = tp_runtime.launch_plan(base, env={})
    assert (plan.rank, plan.spawn, plan.addr, plan.port) == (2, (3,), "10.0.0.1", 29500)
    env = {"RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "7"}
    assert tp_runtime.launch_plan(base, env=env) == tp_runtime.Launch(1, 4, "h", 7, ())
    env |= {"RANK": "3", "LOCAL_RANK": "1"}  # torchrun's second process on the second host: its GPU 1
    assert tp_runtime.launch_plan(base, env=env) == tp_runtime.Launch(3, 4, "h", 7, (), local=1)


def test_tp2_gemma3_matches_transformers(tmp_path: Path) -> None:
    """Gemma 3 (scaled embedding, q/k norms, local and global layers, softcapped logits) over two ranks: its
    4 heads and 2 KV heads split, token-exact with transformers."""
    d = build_tiny_model("gemma3", tmp_path)
    prompts = [list(range(3, 63)), [1, 5, 9, 20, 33]]  # 60 tokens: past the 40-token window
    ref = hf_greedy(d, prompts, MAX_NEW)
    llm = LLM(str(d), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(prompts, GREEDY), ref, 1e-4)
    ranks, total = llm.engine.executor.rank_weight_bytes, _file_bytes(d)
    assert all(0.45 * total < r < 0.55 * total for r in ranks), (ranks, total)


def test_tp2_gpt_oss_matches_transformers(tmp_path: Path) -> None:
    """gpt-oss (sinks, q/k/v/o biases, alternating windows, experts with biases stored transposed with gate
    and up interleaved) over two ranks: token-exact with transformers; each rank reads its sinks and half of
    every expert, and the experts' down bias on rank 0 only."""
    d = build_tiny_model("gpt_oss", tmp_path)
    prompts = [list(range(3, 40)), [1, 5, 9, 20, 33]]  # 37 tokens: past the 16-token window
    ref = hf_greedy(d, prompts, MAX_NEW)
    llm = LLM(str(d), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(prompts, GREEDY), ref, 1e-4)
    cfg = ModelConfig.from_facts(facts_from_dir(d))
    shards = [dict(sharded_safetensors(d, cfg, r, 2)) for r in range(2)]
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        for name in (n for n in f.keys() if ".experts." in n or n.endswith("sinks")):  # noqa: SIM118
            t, a, b = f.get_tensor(name), shards[0][name], shards[1][name]
            if name.endswith("down_proj_bias"):
                assert torch.equal(a, t) and not b.any()
            else:  # sinks and biases by their last dim, gate_up (E, H, 2I) by 2I, down (E, I, H) by I
                dim = 1 if name.endswith("down_proj") else t.dim() - 1
                assert torch.equal(torch.cat([a, b], dim), t), name


def test_a_worker_that_dies_before_joining_fails_the_start_at_once(tmp_path: Path) -> None:
    """A script without the ``__main__`` guard: each spawned worker re-runs its top and dies in
    multiprocessing's bootstrap check before joining the group. Rank 0 sees it exit and says so, instead
    of waiting out the 300 s start-up timeout."""
    import subprocess
    import sys

    script = tmp_path / "no_guard.py"
    demo = Path(__file__).parents[2] / "src" / "glassbox" / "demo"
    script.write_text(
        "from glassbox.llm import LLM\n"
        f"LLM({str(demo)!r}, dtype='float32', device='cpu', tensor_parallel_size=2)\n"
    )
    t0 = time.monotonic()
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=240)
    assert run.returncode != 0
    assert "worker rank 1 exited (code 1) before joining the group" in run.stderr, run.stderr[-2000:]
    assert "__main__" in run.stderr and time.monotonic() - t0 < 120


def test_step_inputs_move_whole() -> None:
    """A step's inputs as rank 0 broadcasts them (CPU copies) and as a worker takes them (its device):
    every tensor of the tuple, of the attention metadata and of its nested prefill layout moved, the rest
    kept."""
    from glassbox.layers.attention import AttentionMetadata, PrefillSeq, build_paged_prefill

    meta = AttentionMetadata(
        slot_mapping=torch.arange(4), num_decode=1, decode_block_tables=torch.zeros(1, 2, dtype=torch.long),
        decode_context_lens=torch.tensor([3]), prefills=[PrefillSeq(1, 3, 0, torch.tensor([2]))],
        backend="triton", paged_prefill=build_paged_prefill([(0, 3, [2])], 16, torch.device("cpu")),
    )  # fmt: skip
    inputs = (torch.arange(4), torch.arange(4), meta, None, (True, False))
    out = tp_model.moved(inputs, torch.device("meta"))
    left: list[str] = []

    def walk(obj: object, where: str) -> None:
        if isinstance(obj, torch.Tensor):
            if obj.device.type != "meta":
                left.append(where)
        elif isinstance(obj, tuple | list):
            for i, o in enumerate(obj):
                walk(o, f"{where}[{i}]")
        elif dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                walk(getattr(obj, f.name), f"{where}.{f.name}")

    walk(out, "inputs")
    assert not left, left
    assert (
        out[2].num_decode == 1 and out[2].backend == "triton" and out[3] is None and out[4] == (True, False)
    )
    assert out[2].paged_prefill.block_m == 16 and inputs[2].slot_mapping.device.type == "cpu"  # a copy


@pytest.mark.parametrize("method", ["draft_model"])  # "ngram" passed too (kept out of CI for time)
def test_tp2_speculative_decoding_matches_tp1(method: str) -> None:
    """Speculative decoding under TP=2: each verification step (a row per draft) is one broadcast forward,
    so the workers run it as any step; a draft model runs whole on rank 0 alone (loaded before the group
    forms: no shard, no collectives). The demo model (code: n-gram drafts get accepted; as its own draft
    model every draft is) gives TP=1's greedy tokens without drafts."""
    demo = str(Path(__file__).parents[2] / "src" / "glassbox" / "demo")
    prompts = [
        "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n",
        "class Stack:\n    def push(self, x):\n",
    ]
    sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=1)
    ref = [(o.token_ids, [o.logprobs[j][t] for j, t in enumerate(o.token_ids)])
           for o in LLM(demo, dtype="float32", max_num_seqs=2).generate(prompts, sp)]  # fmt: skip
    spec = (
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
        if method == "ngram"
        else {"model": demo, "num_speculative_tokens": 3}
    )
    llm = LLM(demo, dtype="float32", tensor_parallel_size=2, max_num_seqs=2, speculative_config=spec)
    outs = llm.generate(prompts, sp)
    _check(outs, ref, 1e-4)
    for o in outs:
        m = o.metrics
        assert m is not None and m.spec_accepted_tokens > 0
        assert method == "ngram" or m.spec_accepted_tokens == m.spec_draft_tokens  # its own draft


@pytest.mark.parametrize("arch", ["gpt_oss"])  # "llama" passed too (kept out of CI for time)
def test_tp2_bf16_on_packed_shards_matches_tp1(tmp_path: Path, arch: str) -> None:
    """bf16 on the CPU: each rank's linears in the fast CPU layouts (glassbox's tiles or oneDNN's, as at
    TP=1), the row-parallel ones inside their all-reduce with the bias after the sum (gpt-oss's o_proj
    bias; added per rank it moves logprobs by ~0.6); MoE experts packed per rank. TP=1's greedy tokens,
    logprobs within bf16's rounding of the partial sums."""
    d = build_tiny_model(arch, tmp_path)
    prompts = [[1, 5, 9, 20, 33], list(range(3, 60))]
    one = LLM(str(d), dtype="bfloat16", max_num_seqs=2)
    ref = [
        (o.token_ids, [o.logprobs[j][t] for j, t in enumerate(o.token_ids)])
        for o in one.generate(prompts, GREEDY)
    ]
    llm = LLM(str(d), dtype="bfloat16", tensor_parallel_size=2, max_num_seqs=2)
    _check(llm.generate(prompts, GREEDY), ref, 0.05)
    assert llm.engine.executor.packed == one.engine.executor.packed > 0  # rank 0's


def test_ranks_bound_to_their_cpus(
    llama: tuple[Path, list[list[int]], list], monkeypatch: pytest.MonkeyPatch
) -> None:
    """GLASSBOX_TP_CPU_BIND gives each local rank its CPUs (and as many torch threads) before it loads:
    rank 0 (this process) on the first list, the spawned worker on the second; the tokens are TP=1's. A list
    count other than the host's ranks, or a list that is not one, is refused naming the variable."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    d, prompts, ref = llama
    cfg = ModelConfig.from_facts(facts_from_dir(d))
    for bad, match in (("0", "has 1 CPU lists for this host's 2 ranks"), ("0|x", "'x' is not a CPU list")):
        monkeypatch.setenv("GLASSBOX_TP_CPU_BIND", bad)
        with pytest.raises(ValueError, match=f"GLASSBOX_TP_CPU_BIND='{bad}'.*{match}"):
            tp_model.check_run(2, torch.device("cpu"), EngineConfig(), None, cfg)
    monkeypatch.setenv("GLASSBOX_TP_CPU_BIND", f"{cpus[0]}|{cpus[1]}")
    threads = torch.get_num_threads()
    try:
        llm = LLM(str(d), dtype="float32", tensor_parallel_size=2, max_num_seqs=2)
        pid = tp_runtime._PROCS[0].pid
        assert pid is not None and torch.get_num_threads() == 1
        for who, cpu in ((os.getpid(), cpus[0]), (pid, cpus[1])):  # every thread of rank 0 and of rank 1
            assert _thread_cpus(who) == {frozenset({cpu})}, who
        _check(llm.generate(prompts[:2], GREEDY), ref[:2], 1e-4)
    finally:  # this test process serves the others after it
        for tid in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(tid), cpus)
        torch.set_num_threads(threads)


def _thread_cpus(pid: int) -> set[frozenset[int]]:
    """The CPU sets of the threads of process ``pid`` (those that have not ended meanwhile)."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.add(frozenset(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            pass
    return out
