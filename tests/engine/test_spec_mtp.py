"""Speculative decoding with the target's own MTP head (``{"method": "mtp"}``, engine/mtp_proposer.py) on
tiny Qwen3-Next and Qwen3.5-MoE checkpoints given MTP weights (tests/helpers/mtp_models.py; transformers
ignores them). Greedy output token-identical to transformers' (and so to decoding without drafts),
logprobs within 1e-4 (the reason is in tests/models/test_hybrid_parity.py), drafts accepted and rejected,
batches mixing prompt chunks and verify rows, preemption and recompute; the proposer's state checked after
every step; sampled tokens following transformers' exact joint distribution (the statistical test of
tests/engine/test_spec_decode.py); one clear error for each model the method cannot run.

The targets copy their input often (test_spec_hybrid's embedding scaled by 3) and the heads are built to
propose their input token again (``copy_bias``), so drafts are accepted often, not always; the head's
numerics are checked on their own in tests/models/test_qwen3_next_mtp.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import test_spec_hybrid
import torch
from hybrid_models import build_hybrid_model
from mtp_models import add_mtp
from test_spec_decode import _chi2_pvalue, _tv
from test_spec_hybrid import _model, run_checked

from glassbox import LLM, SamplingParams
from glassbox.engine.llm_engine import LLMEngine
from glassbox.engine.mtp_proposer import MtpProposer

refs = test_spec_hybrid.refs  # the fixture (its prompts and transformers' continuations), per module


def _mtp_model(arch: str, root: Path) -> Path:
    return add_mtp(_model(arch, root), root / f"{arch}-mtp", copy_bias=1.0)


def _engine(d: Path, k: int = 3, **kw: Any) -> LLMEngine:
    spec = {"method": "mtp", "num_speculative_tokens": k}
    return LLM(str(d), dtype="float32", speculative_config=spec, **kw).engine


class _Checked:
    """The engine checked after every step, the MTP proposer's state too."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        proposer = engine.scheduler.proposer
        assert isinstance(proposer, MtpProposer)
        self.proposer = proposer
        self.inner = engine.check_integrity

    def __call__(self) -> None:
        self.inner()
        self.proposer.check_integrity(self.engine.scheduler.running)


@pytest.mark.parametrize("arch", ["qwen3_next", "qwen3_5_moe"])
def test_greedy_identical_with_mtp_drafts(
    refs: dict[str, Any], arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three sequences at a time, later prompts prefilled beside verify rows; drafts at every position
    accepted somewhere, rejected elsewhere."""
    d0, prompts, ref = refs["get"](arch)
    d = _mtp_model(arch, refs["root"])
    assert (d / "model.safetensors").stat().st_size > (d0 / "model.safetensors").stat().st_size
    engine = _engine(d, max_num_seqs=3)
    monkeypatch.setattr(engine, "check_integrity", _Checked(engine))
    run_checked(engine, prompts, ref)
    c = engine.counters
    assert 0 < c.spec_accepted_tokens < c.spec_draft_tokens, (c.spec_accepted_tokens, c.spec_draft_tokens)
    assert c.spec_accepted_per_pos[0] > 0 and c.spec_accepted_per_pos[1] > 0, c.spec_accepted_per_pos
    assert any(r.phase == "mixed" for r in engine.step_records), "no step mixed prompt and verify rows"
    assert engine.scheduler.proposer is not None and not engine.scheduler.proposer.seqs  # type: ignore[attr-defined]


def test_greedy_identical_with_mtp_chunks_and_preemption(
    refs: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prompts in chunks of a 32-token budget and few KV blocks, so that sequences are preempted and
    recomputed (the head's state dropped and rebuilt from the recomputed hidden states)."""
    _, prompts, ref = refs["get"]("qwen3_next")
    d = _mtp_model("qwen3_next", refs["root"])
    engine = _engine(d, k=2, max_num_seqs=5, num_kv_blocks=8, max_num_batched_tokens=32)
    monkeypatch.setattr(engine, "check_integrity", _Checked(engine))
    run_checked(engine, prompts, ref)
    c = engine.counters
    assert engine.scheduler.num_preemptions > 0 and 0 < c.spec_accepted_tokens < c.spec_draft_tokens


def test_sampled_tokens_follow_the_model(refs: dict[str, Any]) -> None:
    """400 continuations of three tokens of a prompt whose tokens are the only ones top-k keeps (a logit
    bias of 30 lifts them above whatever the copying target prefers), the head proposing its input token
    (one of the three, accepted often, not always; the 400 share the prompt, so the head starts at the
    first position each computed: MtpCache.first), against transformers' exact joint distribution: Pearson's chi-square p > 1e-3 and a total variation under 0.2
    (27 cells: its expected value at n = 400 is below 0.5 * sqrt(2 / pi) * sum(sqrt(p)) / sqrt(n) <= 0.11,
    the bound at a uniform p)."""
    import transformers as tf

    d = _mtp_model("qwen3_5_moe", refs["root"])
    a, b, c = 101, 202, 303
    prompt = [5, a, b, c, a, c, b, b, a, c, c, a, b, a, a, c, b, c]
    bias = {a: 30.0, b: 30.0, c: 30.0}
    n = 400
    engine = _engine(d, max_num_seqs=256)
    sp = SamplingParams(
        n=n, temperature=0.9, top_k=3, logit_bias=bias, max_tokens=3, seed=11, ignore_eos=True
    )
    engine.add_request("s", prompt, sp)
    out = None
    while engine.has_unfinished_requests():
        for o in engine.step():
            out = o if o.finished else out
    assert out is not None and out.metrics is not None
    counts: dict[tuple[int, ...], int] = {}
    for o in out.outputs:
        counts[tuple(o.token_ids)] = counts.get(tuple(o.token_ids), 0) + 1
    assert out.metrics.spec_draft_tokens >= 400 and 0.05 < out.metrics.spec_acceptance_rate < 1.0
    model = tf.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    exact: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(3):
        ctxs = list(exact)
        with torch.no_grad():
            x = model(input_ids=torch.tensor([prompt + list(t) for t in ctxs])).logits[:, -1].float()
        for t, v in bias.items():
            x[:, t] += v
        x = x / 0.9
        probs = x.masked_fill(x < x.topk(3, dim=-1).values[:, -1:], float("-inf")).softmax(-1)
        exact = {
            ctx + (t,): pc * float(probs[i, t])
            for i, (ctx, pc) in enumerate(zip(ctxs, exact.values(), strict=True))
            for t in (a, b, c)
        }
    assert sum(exact.values()) == pytest.approx(1.0, abs=1e-5)
    assert _chi2_pvalue(exact, counts, n) > 1e-3
    assert _tv(exact, counts, n) < 0.2


def test_models_without_mtp_are_refused(refs: dict[str, Any]) -> None:
    root = refs["root"]
    plain = _model("qwen3_next", root)  # no mtp_num_hidden_layers, no mtp.* weights
    with pytest.raises(ValueError, match=r"method 'mtp'.*declares no MTP layers"):
        _engine(plain)
    declared = root / "qwen3_next-declared"  # the config says one, the weights are not there
    if not declared.exists():
        import shutil

        shutil.copytree(plain, declared)
        cfg = json.loads((declared / "config.json").read_text())
        (declared / "config.json").write_text(json.dumps(cfg | {"mtp_num_hidden_layers": 1}))
    with pytest.raises(ValueError, match=r"method 'mtp' needs the checkpoint's MTP weights \(mtp\.\*\)"):
        _engine(declared)
    with pytest.raises(ValueError, match=r"method 'mtp'.*Nemotron-H's MTP layers are not read"):
        _engine(build_hybrid_model("nemotron_h", root))
    with pytest.raises(ValueError, match="the mtp method .* takes no model"):
        LLM(str(plain), speculative_config={"method": "mtp", "num_speculative_tokens": 2, "model": "x"})
