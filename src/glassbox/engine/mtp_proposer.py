"""The MTP proposer: the target checkpoint's own multi-token-prediction head (models/qwen3_next_mtp.py)
proposes k tokens per sequence and step, greedily; the target verifies them (engine/spec_decode.py).

- Every target step hands its final hidden states to ``capture`` (TorchExecutor.hidden_sink): each row's
  h at its position, kept per sequence until the head has consumed it. Rows of rejected drafts are kept
  too and cut off at the next proposal (only positions < the sequence's computed count are the target's).
- A proposal for a sequence of L tokens (L - 1 computed) first runs the head over the positions it has
  not seen, t = c..L-2 (inputs x_{t+1} and h_t), writing their K/V to the sequence's ``MtpCache`` (dense,
  positions 0..L-2 final); its last row's logits give draft 1. Drafts 2..k each run one more row at the
  next position, fed the previous row's output as h and the previous draft as x; their K/V lie past the
  final ones and are overwritten by the next catch-up. The argmax is a deterministic proposal, so the
  acceptance rule keeps the target's distribution and greedy output (engine/spec_decode.py).
- A sequence whose first positions the target never ran (a prompt partly served from the prefix cache;
  a parallel-sampling sibling's shared prompt) has no hidden states there: the head starts at the first
  position it has, attending to no K/V before it (``MtpCache.first``), so its drafts see less context
  (they stay proposals: the verification keeps the output exact). A preempted sequence (``release``)
  starts over when recomputed.

Memory: per sequence, one attention layer's K/V per token in the model's dtype, doubling capacity (at most
2x its tokens), plus the hidden rows of the last step; outside the KV budget (the ``MtpStats`` report it).
Sequences run one at a time through the head (no batching across sequences).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from glassbox.engine.scheduler import ScheduledSeq
from glassbox.engine.sequence import Sequence
from glassbox.engine.torch_executor import TorchExecutor
from glassbox.layers.gated_attention import GatedAttention
from glassbox.layers.host import to_device
from glassbox.models.qwen3_next_mtp import MtpCache, Qwen3NextMtp


@dataclass
class _Seq:
    cache: MtpCache
    hidden_start: int = 0  # the position of hidden's first row
    hidden: torch.Tensor | None = None  # (n, H): the target's rows at hidden_start..hidden_start+n-1


@dataclass
class MtpStats:
    """What the head did: its forward calls, the rows they computed, the bytes its caches hold."""

    calls: int = 0
    rows: int = 0
    cache_bytes: int = 0
    gaps: int = 0  # sequences whose head started past position 0 (positions the target never ran)


class MtpProposer:
    """Greedy proposals of up to ``k`` tokens per sequence from the target's MTP head."""

    def __init__(
        self,
        head: Qwen3NextMtp,
        embed: torch.nn.Module,  # the target's embed_tokens
        logits: Callable[[torch.Tensor], torch.Tensor],  # the target's compute_logits: (S, H) -> (S, V)
        k: int,
        max_model_len: int,
    ) -> None:
        self.head, self.embed, self.k, self.max_model_len = head, embed, k, max_model_len
        self.compute_logits = logits
        attn = head.layers[0].get_submodule("self_attn")
        assert isinstance(attn, GatedAttention)
        self.kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.seqs: dict[int, _Seq] = {}
        self.stats = MtpStats()

    def _state(self, seq: Sequence, like: torch.Tensor) -> _Seq:
        st = self.seqs.get(seq.seq_id)
        if st is None:
            st = self.seqs[seq.seq_id] = _Seq(MtpCache(self.kv_heads, self.head_dim, like.dtype, like.device))
        return st

    def capture(self, rows: list[ScheduledSeq], hidden: torch.Tensor) -> torch.Tensor:
        """Keep each row's final hidden state (``hidden``: (T, H), the step's rows in ``rows``' order)."""
        off = 0
        for s in rows:
            n = s.num_new_tokens
            st = self._state(s.seq, hidden)
            new = hidden[off : off + n].clone()  # (a CUDA graph's output buffer is reused)
            off += n
            if st.hidden is not None and st.hidden_start <= s.start <= st.hidden_start + st.hidden.shape[0]:
                new = torch.cat([st.hidden[: s.start - st.hidden_start], new])
            else:
                st.hidden_start = s.start
            st.hidden = new
        return hidden

    def release(self, seq: Sequence) -> None:
        self.seqs.pop(seq.seq_id, None)

    def propose_batch(self, asks: list[tuple[Sequence, int]]) -> list[list[int]]:
        with torch.inference_mode():
            out = [self._propose(seq, min(self.k, m, self.max_model_len - len(seq))) for seq, m in asks]
        self.stats.cache_bytes = sum(st.cache.nbytes for st in self.seqs.values())
        return out

    def _propose(self, seq: Sequence, limit: int) -> list[int]:
        st = self.seqs.get(seq.seq_id)
        last = len(seq) - 1  # the last token's position: h exists for positions < last
        if limit <= 0 or st is None:
            return []
        c = st.cache.length
        if c >= last:  # nothing computed since the last proposal at this length: no row to feed
            return []
        if st.hidden is None or st.hidden_start + st.hidden.shape[0] < last or st.hidden_start >= last:
            return []
        if st.hidden_start > c:  # positions c..hidden_start-1 never ran: the head starts after them
            self.stats.gaps += 1
            c = st.cache.first = st.cache.length = st.hidden_start
        # catch up over positions c..last-1: inputs x_{t+1}, h_t
        h = st.hidden[c - st.hidden_start : last - st.hidden_start]
        g = self._run(seq.token_ids[c + 1 : last + 1], h, c, st.cache)[-1:]
        st.cache.length = last
        st.hidden, st.hidden_start = None, last
        drafts = [int(self.compute_logits(g).argmax(dim=-1))]
        for pos in range(last, last + limit - 1):  # each draft's row at the position after the last
            g = self._run([drafts[-1]], g, pos, st.cache)
            drafts.append(int(self.compute_logits(g).argmax(dim=-1)))
        return drafts

    def _run(self, ids: list[int], hidden: torch.Tensor, start: int, cache: MtpCache) -> torch.Tensor:
        t = to_device(ids, torch.long, hidden.device)
        self.stats.calls += 1
        self.stats.rows += len(ids)
        return self.head(self.embed(t), hidden, start, cache)

    def check_integrity(self, running: list[Sequence]) -> None:
        """Assert state is kept only for running sequences, none past its tokens."""
        live = {s.seq_id: s for s in running}
        assert set(self.seqs) <= set(live), f"MTP state kept for {set(self.seqs) - set(live)}"
        for sid, st in self.seqs.items():
            assert st.cache.length < len(live[sid]), "MTP K/V past the sequence's tokens"


def mtp_proposer(target: TorchExecutor, k: int, max_model_len: int) -> MtpProposer:
    """The proposer on the target's MTP head (built with the model: ModelConfig.with_mtp), fed every step's
    hidden states."""
    if target.tp is not None:
        raise ValueError("--speculative-config: method 'mtp' does not run with tensor parallelism yet")
    model = target.model
    head = model.get_submodule("mtp")
    assert isinstance(head, Qwen3NextMtp)
    embed = model.get_submodule("model.embed_tokens")
    proposer = MtpProposer(head, embed, model.compute_logits, k, max_model_len)
    target.hidden_sink = proposer.capture
    return proposer
