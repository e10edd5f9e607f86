"""Hybrid models' parts on their own: the scans against transformers' torch paths, the state slots'
bookkeeping, the cache plan, the facts (parameter counts against transformers', state bytes by hand) and
the clear errors."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hybrid_models import build_hybrid_model, hybrid_config
from safetensors.torch import load_file, save_file
from tokenizer_factory import build_tokenizer_dir

from glassbox import SamplingParams
from glassbox.config import EngineConfig
from glassbox.engine.block_manager import BlockManager
from glassbox.engine.kv_plan import plan_hybrid_cache
from glassbox.engine.llm_engine import LLMEngine
from glassbox.engine.scheduler import Scheduler
from glassbox.engine.sequence import Sequence
from glassbox.kernels import native
from glassbox.layers.gated_delta_rule import delta_chunked, delta_step, l2_normalize
from glassbox.layers.ssd_scan import ssd_chunked, ssd_step
from glassbox.models.config_reader import facts_from_config, facts_from_dir
from glassbox.models.model_config import ModelConfig
from glassbox.models.tensor_parallel import check_tp

# float32 scans of O(1) inputs summed in another order (a chunk's matrix products against a token loop
# or transformers' own chunking): each output is a sum of <= 64 terms of magnitude <= ~10 per step of
# the state, so ~64 * 1.2e-7 * 10 ~ 1e-4 absolute at worst; observed ~1e-5
SCAN_TOL = dict(rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("length", [1, 63, 64, 65, 150])
def test_delta_rule_chunked_equals_steps_and_transformers(length: int) -> None:
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule

    gen = torch.Generator().manual_seed(length)
    h, dk, dv = 4, 16, 8
    q, k = torch.randn(length, h, dk, generator=gen), torch.randn(length, h, dk, generator=gen)
    v = torch.randn(length, h, dv, generator=gen)
    g, beta = -torch.rand(length, h, generator=gen), torch.rand(length, h, generator=gen)
    s0 = 0.1 * torch.randn(h, dk, dv, generator=gen)
    qn, kn = l2_normalize(q) * dk**-0.5, l2_normalize(k)
    out, state = delta_chunked(qn, kn, v, g, beta, s0)
    s, steps = s0[None], []
    for t in range(length):
        o, s = delta_step(qn[t : t + 1], kn[t : t + 1], v[t : t + 1], g[t : t + 1], beta[t : t + 1], s)
        steps.append(o)
    torch.testing.assert_close(out, torch.cat(steps), **SCAN_TOL)
    torch.testing.assert_close(state, s[0], **SCAN_TOL)
    ref, ref_state = torch_chunk_gated_delta_rule(
        q[None], k[None], v[None], g[None], beta[None], initial_state=s0[None],
        output_final_state=True, use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    torch.testing.assert_close(out, ref[0], **SCAN_TOL)
    torch.testing.assert_close(state, ref_state[0], **SCAN_TOL)


@pytest.mark.parametrize("length", [1, 8, 21])
def test_ssd_chunked_equals_steps_and_transformers(length: int) -> None:
    from transformers.models.nemotron_h.modeling_nemotron_h import mamba2_chunk_scan

    gen = torch.Generator().manual_seed(length)
    h, p, groups, n, chunk = 4, 8, 2, 16, 8
    x, dt_raw = torch.randn(length, h, p, generator=gen), torch.randn(length, h, generator=gen)
    a, d, bias = (
        -torch.rand(h, generator=gen) - 0.1,
        torch.randn(h, generator=gen),
        torch.rand(h, generator=gen),
    )
    b, c = torch.randn(length, groups, n, generator=gen), torch.randn(length, groups, n, generator=gen)
    s0 = 0.1 * torch.randn(h, p, n, generator=gen)
    dt = F.softplus(dt_raw + bias)
    bh, ch = b.repeat_interleave(h // groups, dim=1), c.repeat_interleave(h // groups, dim=1)
    y, state = ssd_chunked(x, dt, a, bh, ch, d, s0, chunk)
    s, steps = s0[None], []
    for t in range(length):
        o, s = ssd_step(x[t : t + 1], dt[t : t + 1], a, bh[t : t + 1], ch[t : t + 1], d, s)
        steps.append(o)
    torch.testing.assert_close(y, torch.cat(steps), **SCAN_TOL)
    torch.testing.assert_close(state, s[0], **SCAN_TOL)
    ref, ref_state = mamba2_chunk_scan(
        x[None], dt_raw[None], a, b[None], c[None], chunk, D=d, dt_bias=bias, initial_states=s0[None],
        dt_softplus=True, return_final_states=True,
    )  # fmt: skip
    torch.testing.assert_close(y, ref[0], **SCAN_TOL)
    torch.testing.assert_close(state, ref_state[0], **SCAN_TOL)


def _seq(i: int, n: int = 5) -> Sequence:
    return Sequence(i, str(i), list(range(1, n + 1)), SamplingParams(max_tokens=4))


def test_state_slots_are_taken_and_given_back_with_the_blocks() -> None:
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False, num_state_slots=2)
    a, b, c = _seq(0), _seq(1), _seq(2)
    for s in (a, b):
        assert bm.can_allocate(s, 5)
        bm.allocate(s)
        bm.grow(s, 5)
    assert {a.state_slot, b.state_slot} == {0, 1} and bm.num_free_slots == 0
    assert bm.num_free_blocks == 4 and not bm.can_allocate(c, 5)  # blocks enough, no slot
    bm.check_integrity([a, b, c])
    bm.free_seq(a)
    assert a.state_slot is None and bm.can_allocate(c, 5)
    bm.allocate(c)
    bm.grow(c, 5)
    bm.check_integrity([a, b, c])
    c.state_slot = b.state_slot  # a slot held twice: the check catches it
    with pytest.raises(AssertionError, match="held by two sequences"):
        bm.check_integrity([a, b, c])
    c.state_slot = None  # a slot lost (held by nobody, not free)
    with pytest.raises(AssertionError):
        bm.check_integrity([a, b, c])


def test_scheduler_admits_no_more_sequences_than_slots() -> None:
    bm = BlockManager(num_blocks=64, block_size=4, enable_prefix_caching=False, num_state_slots=2)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=100)
    seqs = [_seq(i) for i in range(4)]
    sched.waiting = deque(seqs)
    out = sched.schedule()
    assert [s.seq for s in out.scheduled] == seqs[:2] and len(sched.waiting) == 2
    bm.check_integrity(seqs)
    sched.finish(seqs[0])
    assert [s.seq for s in sched.schedule().scheduled][-1] is seqs[2]
    bm.check_integrity(seqs)


def test_plan_takes_the_states_out_of_the_budget() -> None:
    per_token, bs, state = 256.0, 16, 9600
    plan = plan_hybrid_cache(1 << 20, per_token, bs, state, max_num_seqs=8)
    assert plan.num_state_slots == 8
    assert plan.num_blocks == int(((1 << 20) - 8 * state) // (per_token * bs))
    small = plan_hybrid_cache(3 * (state + per_token * bs), per_token, bs, state, max_num_seqs=8)
    assert small.num_state_slots == 3 and small.num_blocks == 3  # each slot with one block at least


def _config_dir(arch: str, tmp: Path) -> tuple[Path, object]:
    import transformers as tf

    cfg = hybrid_config(arch, 512, 1)
    cfg.save_pretrained(tmp)
    return tmp, tf.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h"])
def test_parameter_count_is_transformers(arch: str, tmp_path: Path) -> None:
    d, model = _config_dir(arch, tmp_path)
    assert facts_from_dir(d).total_params == sum(p.numel() for p in model.parameters())  # type: ignore[attr-defined]


def test_state_bytes_by_hand(tmp_path: Path) -> None:
    """Qwen3-Next's tiny model: 3 Gated DeltaNet layers, each a conv window of 3 inputs of
    [q | k | v] = 2 * 2 * 16 + 4 * 8 = 96 channels and 4 v heads' 16 x 8 matrices; 1 attention layer with
    2 KV heads of 16. Nemotron-H's: 3 Mamba layers, conv 3 x (64 + 2 * 2 * 16), 4 heads' 16 x 16 matrices."""
    qwen = facts_from_dir(_config_dir("qwen3_next", tmp_path / "q")[0])
    per_layer = 3 * 96 + 4 * 16 * 8
    assert qwen.hybrid is not None and qwen.hybrid.state_bytes(4, 4) == 3 * per_layer * 4  # the engine's
    assert qwen.state_bytes_per_seq == 3 * per_layer * 2  # a serving engine's: bf16 throughout
    assert qwen.kv_bytes_per_token(2) == 1 * 2 * 2 * 16 * 2
    nemo = facts_from_dir(_config_dir("nemotron_h", tmp_path / "n")[0])
    conv, ssm = 3 * (64 + 2 * 2 * 16), 4 * 16 * 16
    assert nemo.hybrid is not None and nemo.hybrid.state_bytes(4, 4) == 3 * (conv + ssm) * 4
    assert nemo.state_bytes_per_seq == 3 * (conv * 2 + ssm * 4)  # float32 mamba_ssm_cache_dtype
    assert nemo.layer_mixers == ("mamba", "none", "mamba", "full", "mamba", "none")


def test_unknown_layer_kinds_are_named() -> None:
    nemo = hybrid_config("nemotron_h", 512, 1).to_dict()
    nemo.pop("layers_block_type")
    with pytest.raises(ValueError, match=r"unknown layer kind\(s\) 'X' in hybrid_override_pattern"):
        facts_from_config(nemo | {"hybrid_override_pattern": "M*X-"})
    qwen = hybrid_config("qwen3_next", 512, 1).to_dict()
    types = ["linear_attention", "sliding_attention", "linear_attention", "full_attention"]
    with pytest.raises(ValueError, match="unknown layer kind.*'sliding_attention' in layer_types"):
        facts_from_config(qwen | {"layer_types": types})


def test_hybrid_refusals(tmp_path: Path) -> None:
    d, _ = _config_dir("qwen3_5", tmp_path)
    with pytest.raises(ValueError, match="no tensor-parallel split"):
        check_tp(ModelConfig.from_facts(facts_from_dir(d)), 2)
    build_tokenizer_dir(d)
    spec = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    # speculative decoding runs (tests/engine/test_spec_hybrid.py): a scratch state row per draft per slot
    engine = LLMEngine(EngineConfig(model=str(d), load_format="dummy", speculative_config=spec))
    assert engine.block_manager.scratch is not None and engine.block_manager.scratch.per_slot == 2


def test_missing_state_tensor_is_named(tmp_path: Path) -> None:
    d = build_hybrid_model("nemotron_h", tmp_path)
    weights = load_file(d / "model.safetensors")
    del weights["backbone.layers.2.mixer.A_log"]
    save_file(weights, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"weights missing from .*model\.layers\.2\.mixer\.A_log"):
        LLMEngine(EngineConfig(model=str(d), dtype="float32"))


def test_state_checkpoints_follow_their_blocks() -> None:
    """A prompt chunk stops at the prompt's checkpoint boundary; the state there is saved, a later
    identical prompt restores it, and reusing the block drops it (the integrity check catches one kept)."""
    bm = BlockManager(num_blocks=6, block_size=4, num_state_slots=1, num_checkpoints=2)
    a = _seq(0, n=10)  # boundary (10 - 1) // 4 * 4 = 8
    assert bm.can_allocate(a, 10) and bm.allocate(a) == 0
    assert bm.chunk_end(a, 0, 10) == 8 and bm.chunk_end(a, 8, 2) == 2
    bm.grow(a, 8)
    a.num_computed_tokens = 8
    bm.commit(a)
    assert bm.take_state_copies() == ([(0, 1)], [])  # slot 0 -> checkpoint row 1 (rows follow the slots)
    bm.check_integrity([a])
    bm.free_seq(a)
    b = _seq(1, n=10)
    assert bm.can_allocate(b, 2) and bm.allocate(b) == 8
    assert bm.take_state_copies() == ([], [(1, 0)])  # row 1 -> b's slot 0
    bm.free_seq(b)
    c = Sequence(2, "2", list(range(100, 124)), SamplingParams(max_tokens=4))
    bm.allocate(c)
    bm.grow(c, 24)  # all six blocks: the cached ones are reused, and their checkpoint goes with them
    assert bm.checkpoints is not None and not bm.checkpoints.rows
    bm.check_integrity([c])
    bm.checkpoints.rows[12345] = bm.checkpoints.free_rows.pop()
    with pytest.raises(AssertionError, match="outlived its block"):
        bm.check_integrity([c])


def test_the_activation_profile_runs_a_hybrid_model(tmp_path: Path) -> None:
    """CUDA sizes its cache after one long prefill (engine/profile_run.py); a hybrid model's state layers
    get a slot of their own there (run here on the CPU, where the same forward runs)."""
    from glassbox.engine.profile_run import profile_prefill
    from glassbox.models.loader import build_model

    d = build_hybrid_model("nemotron_h", tmp_path)
    mc = ModelConfig.from_facts(facts_from_dir(d))
    model = build_model(mc, None, torch.float32, torch.device("cpu"))
    profile_prefill(model, mc, 40, 16, torch.float32, "torch", torch.float32, torch.device("cpu"))


@pytest.mark.skipif(native.library() is None, reason="no C compiler: the PyTorch ops run")
@pytest.mark.parametrize("rows", [1, 3])
def test_c_decode_recurrences_equal_the_pytorch_ops(rows: int) -> None:
    """kernels/cpu_recurrent.c in place on the state rows of the given slots (others untouched) against
    the PyTorch steps on gathered copies; float32 sums of <= 128 terms in another order, so within
    SCAN_TOL."""
    from glassbox.kernels import cpu_recurrent

    gen = torch.Generator().manual_seed(rows)
    cache = torch.randn(5, 7 + 4 * 16 * 8, generator=gen) * 0.1  # 5 slots, a 7-element conv part
    mats = cache[:, 7:].view(5, 4, 16, 8)
    slots = torch.tensor([3, 0, 4][:rows])
    q, k = (
        l2_normalize(torch.randn(rows, 4, 16, generator=gen)) / 4,
        l2_normalize(torch.randn(rows, 4, 16, generator=gen)),
    )
    v, g, beta = (
        torch.randn(rows, 4, 8, generator=gen),
        -torch.rand(rows, 4, generator=gen),
        torch.rand(rows, 4, generator=gen),
    )
    ref_o, ref_s = delta_step(q, k, v, g, beta, mats[slots].clone())
    before = cache.clone()
    o = cpu_recurrent.delta_step(q, k, v, g, beta, mats, slots)
    torch.testing.assert_close(o, ref_o, **SCAN_TOL)
    torch.testing.assert_close(mats[slots], ref_s, **SCAN_TOL)
    others = [i for i in range(5) if i not in slots.tolist()]
    assert torch.equal(cache[others], before[others]) and torch.equal(cache[:, :7], before[:, :7])

    x, dt = torch.randn(rows, 4, 16, generator=gen), torch.rand(rows, 4, generator=gen)
    a, d = -torch.rand(4, generator=gen), torch.randn(4, generator=gen)
    b, c = torch.randn(rows, 4, 8, generator=gen), torch.randn(rows, 4, 8, generator=gen)
    ref_y, ref_s = ssd_step(x, dt, a, b, c, d, mats[slots].clone())
    y = cpu_recurrent.ssd_step(x, dt, a, b, c, d, mats, slots)
    torch.testing.assert_close(y, ref_y, **SCAN_TOL)
    torch.testing.assert_close(mats[slots], ref_s, **SCAN_TOL)


@pytest.mark.parametrize("arch", ["granitehybrid", "falcon-h1"])
def test_hybrid_gguf_files_are_refused_by_name(arch: str, tmp_path: Path) -> None:
    """GGUF files of hybrid architectures glassbox does not read (those it reads: test_gguf_hybrid.py,
    test_gguf_qwen35.py, test_gguf_nemotron_h.py): one clear message."""
    import gguf
    import numpy as np

    from glassbox.perf.model_presets import load_model_facts

    path = tmp_path / f"{arch}.gguf"
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(4)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=f"GGUF architecture '{arch}' is not supported"):
        load_model_facts(str(path))
