"""The draft-model proposer: a smaller model sharing the target's tokenizer proposes k tokens per sequence
and step, greedily, and the target verifies them (engine/spec_decode.py).

Design, kept simple:

- The draft runs on its own ``TorchExecutor`` (same device, eager: no CUDA graphs) with its own paged KV
  cache and its own ``BlockManager`` (no prefix caching). The KV budget the target alone would get is split
  between the two caches in proportion to their bytes per token, so both hold the same number of tokens
  (``TorchExecutor(draft_kv_bytes_per_token=...)``); with an explicit ``--num-kv-blocks`` each gets that
  many blocks.
- Per sequence it keeps a shadow ``Sequence`` (the tokens in its cache, its block table). At each step the
  scheduler asks once for every decoding sequence; the draft first finds how much of its cache still
  holds the sequence's tokens (its earlier proposals that the target accepted count; after a rejection the
  rest is trimmed off, ``BlockManager.trim``), then catches up with the tokens since (the whole prompt the
  first time, in chunks of the token budget), the last of which gives the first draft, then decodes k - 1
  more. Every proposing sequence runs in the same forward passes: about k passes per step (more only while
  a long prompt is caught up). The catch-up of a few tokens runs as decode rows (the int8 GEMV and the
  one-call CPU step where the draft's weights are in blocks).
- Proposals are the argmax of the draft's logits: deterministic given the sequence, so the draft
  distribution q is one-hot and spec_decode's acceptance rule (accept x with probability p(x), else draw
  from p without x) is the general rejection-sampling rule for that q: the tokens follow the target's
  distribution exactly, and greedy output is the target's greedy output, whatever the draft proposes.
- If the draft's pool cannot hold a sequence's tokens and drafts, that sequence gets fewer or no drafts
  this step (the target is never preempted for the draft). A finished, aborted or preempted sequence's
  draft blocks are freed (``release``, called by the scheduler).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from glassbox.config import EngineConfig
from glassbox.engine.block_manager import BlockManager
from glassbox.engine.checkpoint import open_checkpoint
from glassbox.engine.kv_plan import KVCachePlan
from glassbox.engine.mtp_proposer import mtp_proposer
from glassbox.engine.ngram import NgramProposer
from glassbox.engine.scheduler import Proposer, ScheduledSeq
from glassbox.engine.sequence import Sequence
from glassbox.engine.torch_executor import TorchExecutor
from glassbox.models.facts import ModelFacts
from glassbox.models.sources import resolve_model
from glassbox.tokenizer.hf_tokenizer import Tokenizer

logger = logging.getLogger(__name__)

VOCAB_SAMPLE = 512  # token ids compared between the two vocabularies, evenly spread
SAMPLE_TEXT = "Hello, world! def f(x):\n    return x * 2  # ünïcödé 123 <|im_start|>user"


def check_vocabulary(
    target: Tokenizer, target_facts: ModelFacts, draft: Tokenizer, draft_facts: ModelFacts
) -> None:
    """ValueError unless the draft reads and writes token ids as the target does: the same vocabulary size
    (model and tokenizer), the same special and EOS ids, the same strings for a spread of ids, the same
    encoding of a sample text."""

    def fail(what: str) -> ValueError:
        return ValueError(
            f"--speculative-config: the draft model does not share the target's vocabulary: {what}"
        )

    if draft_facts.vocab_size != target_facts.vocab_size:
        raise fail(f"vocab_size {draft_facts.vocab_size} != the target's {target_facts.vocab_size}")
    if draft.vocab_size != target.vocab_size:
        raise fail(f"the tokenizer holds {draft.vocab_size} tokens, the target's {target.vocab_size}")
    pairs = {
        "special token ids": (draft.all_special_ids, target.all_special_ids),
        "EOS ids": (draft.eos_token_ids, target.eos_token_ids),
        "BOS id": (draft.bos_token_id, target.bos_token_id),
    }
    for what, (mine, theirs) in pairs.items():
        if mine != theirs:
            raise fail(f"{what} {sorted(mine) if isinstance(mine, set) else mine} != the target's "
                       f"{sorted(theirs) if isinstance(theirs, set) else theirs}")  # fmt: skip
    step = max(1, target.vocab_size // VOCAB_SAMPLE)
    for i in [*range(0, target.vocab_size, step), target.vocab_size - 1]:
        if draft.id_to_token(i) != target.id_to_token(i):
            raise fail(
                f"token id {i} is {draft.id_to_token(i)!r} there, {target.id_to_token(i)!r} in the target"
            )
    if draft.encode(SAMPLE_TEXT) != target.encode(SAMPLE_TEXT):
        raise fail(f"{SAMPLE_TEXT!r} encodes differently")


def open_draft(
    config: EngineConfig,
    tokenizer: Tokenizer,
    facts: ModelFacts,
    max_model_len: int,
    max_num_batched_tokens: int,
) -> TorchExecutor | None:
    """The draft model's executor (weights loaded, KV cache not yet: ``make_proposer`` sizes it after the
    target's), or None without a draft model. Checks the vocabulary before loading any weights."""
    sc = config.speculative
    if sc is None or sc.method != "draft_model":
        return None
    assert sc.model is not None
    checkpoint = open_checkpoint(resolve_model(sc.model))
    check_vocabulary(tokenizer, facts, checkpoint.tokenizer, checkpoint.facts)
    if checkpoint.facts.hybrid is not None:
        raise ValueError(
            f"--speculative-config: the draft model {sc.model} is a hybrid model (recurrent states), which "
            "the draft proposer cannot roll back; use a non-hybrid draft model or ngram"
        )
    # the target's --device and --dtype settings; the draft's weights as stored (a GGUF keeps its blocks), eager
    dcfg = replace(
        config,
        model=sc.model,
        quantization=None,
        enforce_eager=True,
        num_kv_blocks=None,
        speculative_config=None,
    )
    draft = TorchExecutor(
        dcfg,
        None if config.load_format == "dummy" else checkpoint,
        checkpoint.facts,
        min(max_model_len, checkpoint.facts.max_positions),
        max_num_batched_tokens,
        defer_kv=True,
    )
    logger.info("draft model %s", checkpoint.source.describe())
    return draft


def make_proposer(
    config: EngineConfig,
    target: TorchExecutor,
    draft: TorchExecutor | None,
    max_model_len: int,
    max_num_batched_tokens: int,
) -> Proposer | None:
    """The proposer ``--speculative-config`` asks for (None without one); a draft model gets its KV cache
    here, as many blocks as the target's."""
    sc = config.speculative
    if sc is None:
        return None
    logger.info("speculative decoding: %s", sc.to_dict())
    if sc.method == "mtp":
        return mtp_proposer(target, sc.num_speculative_tokens, max_model_len)
    if draft is None:
        return NgramProposer(
            sc.num_speculative_tokens, sc.prompt_lookup_min, sc.prompt_lookup_max, max_model_len
        )
    draft_len = min(max_model_len, draft.facts.max_positions)
    plan = KVCachePlan(
        target.num_kv_blocks, target.block_size, round(draft.kv_bytes_per_token * target.block_size)
    )
    draft.allocate_kv(plan, draft_len)
    logger.info("draft KV cache: %d blocks, %.3f GiB", plan.num_blocks, plan.gib)
    bm = BlockManager(plan.num_blocks, target.block_size, enable_prefix_caching=False)
    return DraftModelProposer(draft, bm, sc.num_speculative_tokens, draft_len, max_num_batched_tokens)


@dataclass
class _Draft:
    """A sequence as the draft model holds it: ``seq.token_ids[:synced]`` are the target sequence's tokens,
    then the draft's own proposals; ``seq.num_computed_tokens`` of them are in the draft's cache."""

    seq: Sequence
    synced: int = 0


@dataclass
class DraftStats:
    """What the draft model did: forward passes, the rows they computed, and their time (seconds)."""

    passes: int = 0
    rows: int = 0
    seconds: float = 0.0


class DraftModelProposer:
    """Greedy proposals of up to ``k`` tokens per sequence from a draft model (see the module docstring)."""

    def __init__(
        self,
        executor: TorchExecutor,
        block_manager: BlockManager,
        k: int,
        max_model_len: int,
        max_num_batched_tokens: int,
    ) -> None:
        self.executor = executor
        self.block_manager = block_manager
        self.k = k
        self.max_model_len = max_model_len  # the target's limit, or the draft's where that is lower
        self.max_num_batched_tokens = max_num_batched_tokens
        self.states: dict[int, _Draft] = {}  # by the target sequence's seq_id
        self.stats = DraftStats()

    def release(self, seq: Sequence) -> None:
        st = self.states.pop(seq.seq_id, None)
        if st is not None:
            self.block_manager.free_seq(st.seq)

    def propose_batch(self, asks: list[tuple[Sequence, int]]) -> list[list[int]]:
        t0 = time.perf_counter()
        out: list[list[int]] = [[] for _ in asks]
        work: list[tuple[int, _Draft, int]] = []  # (index in asks, its draft state, how many drafts)
        bm = self.block_manager
        for i, (seq, max_drafts) in enumerate(asks):
            limit = min(self.k, max_drafts, self.max_model_len - len(seq))
            if limit <= 0:
                continue
            st = self._sync(seq)
            # it computes positions up to len(seq) + limit - 2 (the last draft is not fed back)
            room = (len(st.seq.block_table) + bm.num_free_blocks) * bm.block_size - len(seq) + 1
            limit = min(limit, room)
            if limit > 0:
                bm.grow(st.seq, len(seq) + limit - 1)
                work.append((i, st, limit))
        if work:
            self._run(work, out)
        self.stats.seconds += time.perf_counter() - t0
        return out

    def _sync(self, seq: Sequence) -> _Draft:
        """Bring ``seq``'s draft state up to its tokens: keep the cache over the prefix that still holds
        them (at most all but the last token, whose logits give the first draft), trim the rest."""
        st = self.states.get(seq.seq_id)
        if st is None:
            st = self.states[seq.seq_id] = _Draft(
                Sequence(seq.seq_id, seq.request_id, [], seq.sampling_params)
            )
        d = st.seq
        end = min(d.num_computed_tokens, len(seq) - 1)
        valid = min(st.synced, end)
        while valid < end and d.token_ids[valid] == seq.token_ids[valid]:
            valid += 1
        d.num_computed_tokens = valid
        d.token_ids[valid:] = seq.token_ids[valid:]
        st.synced = len(seq)
        self.block_manager.trim(d, valid)
        return st

    def _run(self, work: list[tuple[int, _Draft, int]], out: list[list[int]]) -> None:
        """Catch every draft sequence up (chunked by the token budget) and draw its first proposal, then
        decode the others, all sequences in the same passes."""
        pending = list(work)
        while pending:  # catch-up passes: most sequences need one or two tokens, a new one its prompt
            budget = self.max_num_batched_tokens
            rows: dict[bool, list[tuple[ScheduledSeq, int]]] = {True: [], False: []}  # as decode rows or not
            rest = []
            for item in pending:
                d = item[1].seq
                n = min(len(d) - d.num_computed_tokens, budget)
                if n < len(d) - d.num_computed_tokens:
                    rest.append(item)  # (the rest of a long prompt in the next pass)
                if n > 0:
                    budget -= n
                    s = ScheduledSeq(d, d.num_computed_tokens, n, d.num_computed_tokens + n == len(d), False)
                    rows[s.start > 0 and n <= self.k + 1].append((s, item[0]))
            ordered = rows[True] + rows[False]
            tokens = self._pass([s for s, _ in rows[True]], [s for s, _ in rows[False]])
            for (s, i), token in zip(ordered, tokens, strict=True):
                if s.samples:
                    out[i].append(token)
            pending = rest
        active = [item for item in work if item[2] > 1]
        for j in range(1, self.k):  # decode passes: feed the last proposal, draw the next
            active = [item for item in active if item[2] > j]
            if not active:
                break
            step = []
            for i, st, _ in active:
                st.seq.token_ids.append(out[i][-1])
                step.append(ScheduledSeq(st.seq, st.seq.num_computed_tokens, 1, True, True))
            for (i, _, _), token in zip(active, self._pass(step, []), strict=True):
                out[i].append(token)
        for i, st, _ in work:  # the last proposal: in the draft's tokens, not in its cache
            st.seq.token_ids.append(out[i][-1])

    def _pass(self, decodes: list[ScheduledSeq], prefills: list[ScheduledSeq]) -> list[int]:
        """One forward of the draft; each row set's computed count advanced; the argmax after each."""
        logits = self.executor.last_logits(decodes, prefills)
        for s in decodes + prefills:
            s.seq.num_computed_tokens += s.num_new_tokens
        self.stats.passes += 1
        self.stats.rows += sum(s.num_new_tokens for s in decodes + prefills)
        return [int(t) for t in logits.argmax(dim=-1).tolist()]

    def check_integrity(self, running: list[Sequence]) -> None:
        """Assert the draft's pool is consistent, held only by running sequences, each holding the blocks
        of its computed tokens and no more."""
        live = {s.seq_id for s in running}
        assert set(self.states) <= live, f"draft state kept for {set(self.states) - live}"
        bm = self.block_manager
        for st in self.states.values():
            assert len(st.seq.block_table) == bm.blocks_needed(st.seq.num_computed_tokens)
        bm.check_integrity([st.seq for st in self.states.values()])
