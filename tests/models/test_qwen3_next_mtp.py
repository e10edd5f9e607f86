"""The MTP head of Qwen3.5 (models/qwen3_next_mtp.py), as the engine loads it from a checkpoint's
``mtp.*`` weights, against a float64 reference written here from the published formulation (vLLM's
qwen3_next_mtp: u_t = fc([norm_e(embed(x_{t+1})) | norm_h(h_t)]), one gated full-attention decoder layer
with a SiLU-gated MLP, the final norm; (1 + w) RMSNorms; rotary on the first quarter of each head, the
rotate-half convention; attention causal over the head's own positions, K/V heads shared by pairs).

The head runs its positions in two calls (a catch-up of 7, then 3 one at a time, as drafts run), each
reading the K/V the earlier ones left in its cache. Tolerance 1e-4: float32 against float64 through a
64-wide layer of a few matmuls and softmaxes over <= 10 positions (rounding ~1e-6 per op, values O(1)
after the final norm); a wrong concat order, norm, rotary or cache row is O(1) off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hybrid_models import build_hybrid_model
from mtp_models import add_mtp
from safetensors.torch import load_file

from glassbox import LLM
from glassbox.models.qwen3_next_mtp import MtpCache, Qwen3NextMtp

TOL = 1e-4  # see the module docstring
EPS = 1e-6  # the tiny config's rms_norm_eps


def _norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1.0 + w)


def _rotate(x: torch.Tensor, pos: torch.Tensor, rot: int, theta: float) -> torch.Tensor:
    inv = 1.0 / theta ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    f = pos[:, None].double() * inv[None, :]
    cos, sin = torch.cat([f, f], -1).cos()[:, None], torch.cat([f, f], -1).sin()[:, None]
    r, rest = x[..., :rot], x[..., rot:]
    half = torch.cat([-r[..., rot // 2 :], r[..., : rot // 2]], -1)
    return torch.cat([r * cos + half * sin, rest], -1)


def reference(w: dict[str, torch.Tensor], ids: list[int], hidden: torch.Tensor) -> torch.Tensor:
    """g_t for positions 0..T-1 (ids: x_{t+1}; hidden: h_t), float64, plain torch."""
    p = {k: v.double() for k, v in w.items()}
    heads, kv, d = 4, 2, 16
    x = (
        torch.cat(
            [
                _norm(p["model.embed_tokens.weight"][ids], p["mtp.pre_fc_norm_embedding.weight"]),
                _norm(hidden.double(), p["mtp.pre_fc_norm_hidden.weight"]),
            ],
            -1,
        )
        @ p["mtp.fc.weight"].T
    )
    t = x.shape[0]
    pre = "mtp.layers.0."
    a = _norm(x, p[pre + "input_layernorm.weight"])
    qg = (a @ p[pre + "self_attn.q_proj.weight"].T).view(t, heads, 2 * d)
    q, gate = qg[..., :d], qg[..., d:]
    k = (a @ p[pre + "self_attn.k_proj.weight"].T).view(t, kv, d)
    v = (a @ p[pre + "self_attn.v_proj.weight"].T).view(t, kv, d)
    q, k = _norm(q, p[pre + "self_attn.q_norm.weight"]), _norm(k, p[pre + "self_attn.k_norm.weight"])
    pos = torch.arange(t)
    q, k = _rotate(q, pos, d // 4, 10000.0), _rotate(k, pos, d // 4, 10000.0)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    s = torch.einsum("thd,shd->hts", q, k) / d**0.5
    s = s.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.einsum("hts,shd->thd", s.softmax(-1), v) * torch.sigmoid(gate)
    x = x + o.reshape(t, heads * d) @ p[pre + "self_attn.o_proj.weight"].T
    m = _norm(x, p[pre + "post_attention_layernorm.weight"])
    gu = torch.nn.functional.silu(m @ p[pre + "mlp.gate_proj.weight"].T) * (
        m @ p[pre + "mlp.up_proj.weight"].T
    )
    x = x + gu @ p[pre + "mlp.down_proj.weight"].T
    return _norm(x, p["mtp.norm.weight"])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mtp_head")
    return add_mtp(build_hybrid_model("qwen3_5", root), root / "qwen3_5-mtp")


def test_head_matches_the_published_formulation(model_dir: Path) -> None:
    llm = LLM(
        str(model_dir), dtype="float32", speculative_config={"method": "mtp", "num_speculative_tokens": 2}
    )
    model = llm.engine.executor.model
    head = model.get_submodule("mtp")
    assert isinstance(head, Qwen3NextMtp)
    w = load_file(model_dir / "model.safetensors")
    torch.manual_seed(0)
    ids = torch.randint(0, 512, (10,)).tolist()
    hidden = torch.randn(10, 64)
    want = reference(w, ids, hidden)
    cache = MtpCache(2, 16, torch.float32, torch.device("cpu"))
    embed = model.get_submodule("model.embed_tokens")
    with torch.inference_mode():
        got = [head(embed(torch.tensor(ids[:7])), hidden[:7], 0, cache)]
        cache.length = 7
        for t in range(7, 10):
            got.append(head(embed(torch.tensor(ids[t : t + 1])), hidden[t : t + 1], t, cache))
    err = (torch.cat(got).double() - want).abs().max().item()
    assert err < TOL, err
    # the head's logits are the shared LM head's: draft 1 is the reference's argmax
    lm = w["lm_head.weight"].double()
    assert int((want[-1] @ lm.T).argmax()) == int(model.compute_logits(got[-1]).argmax())


def test_proposer_drafts_match_the_reference(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proposer inside a running engine (greedy, k = 2, the prompt in chunks of 8 so its hidden states
    arrive over three steps and its first catch-up spans them; a random head, so that drafts depend on
    every input, rarely accepted): every proposal it makes equals
    the reference head's argmaxes fed transformers' final hidden states (after the final norm) of the
    sequence so far, draft 2 from the reference's own output row. Argmaxes are compared: float32 against
    float64 differences (~1e-5) are far below these models' logit gaps (>= 1e-3 here)."""
    import transformers as tf

    from glassbox import SamplingParams
    from glassbox.engine.mtp_proposer import MtpProposer

    spec = {"method": "mtp", "num_speculative_tokens": 2}
    engine = LLM(str(model_dir), dtype="float32", speculative_config=spec, max_num_batched_tokens=8).engine
    proposer = engine.scheduler.proposer
    assert isinstance(proposer, MtpProposer)
    seen: list[tuple[list[int], list[int]]] = []
    propose = proposer.propose_batch

    def recording(asks: list[tuple[Any, int]]) -> list[list[int]]:
        out = propose(asks)
        seen.extend((list(seq.token_ids), d) for (seq, _), d in zip(asks, out, strict=True) if d)
        return out

    monkeypatch.setattr(proposer, "propose_batch", recording)
    prompt = [7, 41, 99, 3, 250, 18, 77, 400, 12, 5, 61, 300, 9, 150, 33, 2, 88, 71]
    engine.add_request("r", prompt, SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    final: list[int] = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            final = list(out.prompt_token_ids or []) + list(out.outputs[0].token_ids)
    assert len(seen) >= 15 and len(final) == len(prompt) + 40
    model = tf.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        h = model.model(input_ids=torch.tensor([final])).last_hidden_state[0]  # (L, H), causal
    w = load_file(model_dir / "model.safetensors")
    lm = w["lm_head.weight"].double()
    for ids, drafts in seen:
        assert ids == final[: len(ids)]
        n = len(ids)
        g = reference(w, ids[1:], h[: n - 1])
        want = [int((g[-1] @ lm.T).argmax())]
        g2 = reference(w, ids[1:] + want, torch.cat([h[: n - 1], g[-1:].float()]))
        want.append(int((g2[-1] @ lm.T).argmax()))
        assert drafts == want[: len(drafts)], (n, drafts, want)
    assert seen[0][0] == prompt + final[len(prompt) : len(prompt) + 1]  # the first: after the prompt
