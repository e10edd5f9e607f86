"""LLMEngine: add_request / step / abort around the shared step loop (engine/core.py).

Owns the tokenizer and the text-level work the core leaves out: detokenization, stop strings and the
outputs, done after each step (or, with async output, while the next step computes).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from glassbox.anatomy import merge_metrics
from glassbox.config import EngineConfig
from glassbox.engine import tp_runtime
from glassbox.engine.bursts import BurstSizer
from glassbox.engine.checkpoint import open_checkpoint
from glassbox.engine.core import Appended, CoreStep, EngineCore
from glassbox.engine.device import resolve_device
from glassbox.engine.draft_model import DraftModelProposer, make_proposer, open_draft
from glassbox.engine.request_check import check_request
from glassbox.engine.scheduler import Scheduler
from glassbox.engine.sequence import Sequence
from glassbox.engine.state_inputs import block_manager, prefix_caching, spec_rows_per_slot
from glassbox.engine.structured import GrammarCompiler
from glassbox.models.facts import ModelFacts
from glassbox.models.sources import resolve_model
from glassbox.outputs import CompletionOutput, RequestOutput
from glassbox.sampling_params import SamplingParams
from glassbox.tokenizer.detokenizer import IncrementalDetokenizer
from glassbox.tokenizer.stop_checker import StopChecker

logger = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """One engine step, for metrics and the planner's calibration."""

    start: float
    duration_s: float  # the whole step: schedule, execute, post-process (detokenize, stop checks)
    num_prefill_tokens: int
    num_decode_tokens: int  # decode rows computed, over all of the step's passes (a burst runs several)
    batch_size: int
    phase: str  # "prefill" | "decode" | "mixed"
    kv_usage: float
    # of duration_s, launch to sampled tokens: the model forward and sampling (with async output, also the
    # previous step's post-processing that overlapped them)
    execute_s: float = 0.0
    passes: int = 1  # forward passes: a greedy decode burst (engine/bursts.py) runs 1 + its lookahead


@dataclass
class EngineCounters:
    """Cumulative totals. ``prompt_tokens``: every prompt token of every sequence, counted once as its
    prefill reaches it, whether computed (in any chunk) or served by the prefix cache (vLLM's
    prompt_tokens_total); ``cached_prompt_tokens`` the latter part. Recomputation after a preemption adds
    nothing. ``generation_tokens``: tokens sampled."""

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    # speculative decoding (vLLM's spec_decode_* counters): rows that verified drafts, drafts, accepted
    # drafts, and accepted drafts by position (the i-th draft of a row accepted)
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)


@dataclass
class _SeqState:
    seq: Sequence
    detok: IncrementalDetokenizer
    stops: StopChecker
    text: str = ""
    prompt_counted: int = 0  # prompt positions already in EngineCounters.prompt_tokens


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    states: list[_SeqState]

    @property
    def finished(self) -> bool:
        return all(s.seq.finish_reason is not None for s in self.states)


class LLMEngine:
    """The real engine: EngineCore on a TorchExecutor, plus text. Not thread-safe: one caller drives
    add_request/step/abort."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        if config.load_format == "dummy" and config.model is None:
            raise ValueError("--load-format dummy needs a MODEL (a directory or .gguf file) for the shapes")
        self.source = resolve_model(config.model)
        checkpoint = open_checkpoint(self.source)
        logger.info("serving %s", self.source.describe())
        self.facts: ModelFacts = checkpoint.facts
        caching = prefix_caching(config, self.facts)  # hybrid models: engine/state_inputs.py
        self.model_name = config.served_model_name or self.source.name
        self.tokenizer = checkpoint.tokenizer
        self.grammars = GrammarCompiler(self.tokenizer, self.facts.vocab_size)  # structured outputs
        limit = self.facts.max_positions
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(
                f"--max-model-len {config.max_model_len} exceeds the model's limit of {limit} positions"
            )
        self.max_model_len = config.max_model_len or limit
        default_batch = 8192 if resolve_device(config.device).type == "cuda" else 2048
        self.max_num_batched_tokens = batch = config.max_num_batched_tokens or default_batch
        draft = open_draft(config, self.tokenizer, self.facts, self.max_model_len, batch)  # before the KV
        self.executor = tp_runtime.executor(  # a TorchExecutor; with tensor parallelism, rank 0's
            config,
            None if config.load_format == "dummy" else checkpoint,
            self.facts,
            self.max_model_len,
            batch,
            draft_kv_bytes_per_token=draft.kv_bytes_per_token if draft is not None else 0.0,
        )
        self.model_config = self.executor.model_config
        self.executor.eos_ids = self.tokenizer.eos_token_ids
        if self.executor.block_formats:
            logger.info("weights kept in blocks: %s", ", ".join(self.executor.block_formats))
        plan, ex = self.executor.kv_plan, self.executor
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens, %.3f GiB (%s, %s)",
            *(plan.num_blocks, plan.block_size, plan.num_tokens, plan.gib, ex.device, ex.kv_dtype),
        )
        self.block_manager = block_manager(
            plan, caching, self.executor.model_config, spec_rows_per_slot(config)
        )  # hybrid: + state slots
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, batch)
        self.scheduler.proposer = make_proposer(config, self.executor, draft, self.max_model_len, batch)
        self.core = EngineCore(
            self.scheduler, self.executor, self.max_model_len, self.tokenizer.eos_token_ids
        )
        if self.executor.burst_rows and self.scheduler.proposer is None and config.num_scheduler_steps != 1:
            self.scheduler.burst_rows = self.executor.burst_rows  # greedy decode bursts (engine/bursts.py)
            self.core.bursts = BurstSizer(config.num_scheduler_steps)
        cuda = self.executor.device.type == "cuda"
        self.async_output = cuda if config.async_output is None else config.async_output
        self._deferred: list[Appended] = []  # tokens whose text work is still to do
        self.requests: dict[str, _Request] = {}
        self.step_records: deque[StepRecord] = deque(maxlen=100_000)
        self.counters = EngineCounters()
        self._seq_ids = itertools.count()

    # -- requests ------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        arrival_time: float | None = None,
        tokenize_s: float | None = None,
    ) -> None:
        """Queue a request; raises ValueError (RequestCheckError) at once if it could never run.

        A text prompt is tokenized here and timed; for token ids, ``tokenize_s`` is how long the caller's
        tokenization took (the server's), and ``arrival_time`` (time.perf_counter) when it ended.
        """
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        t0 = time.perf_counter()
        if isinstance(prompt, str):
            text: str | None = prompt
            ids = self.tokenizer.encode(prompt)
        else:
            text, ids = None, list(prompt)
        t1 = time.perf_counter()
        arrival = t1 if arrival_time is None else arrival_time
        if tokenize_s is None:
            tokenize_s = t1 - t0
        max_tokens = check_request(
            ids,
            params.max_tokens,
            self.facts.vocab_size,
            self.max_model_len,
            self.kv_capacity_tokens,
            params=params,
        )
        if params.max_tokens is None:
            params = replace(params, max_tokens=max_tokens)
        spec = (
            params.structured_outputs
        )  # a bad one raises GrammarError (ValueError) before anything is queued
        states = []
        for i in range(params.n):
            seq = Sequence(next(self._seq_ids), request_id, ids, params, i, arrival, tokenize_s)
            if spec is not None:
                seq.grammar = self.grammars.new_state(spec, len(ids), params.stop_token_ids)
            detok = IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
            states.append(_SeqState(seq, detok, StopChecker(params.stop, params.include_stop_str_in_output)))
        self.requests[request_id] = _Request(request_id, text, ids, params, states)
        for st in states:
            self.core.add(st.seq)

    @property
    def kv_capacity_tokens(self) -> int:
        """Token slots in the whole KV cache: no request may need more."""
        return self.executor.kv_plan.num_tokens

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """End a request now (finish_reason "abort"), freeing its blocks; None if it is unknown."""
        req = self.requests.get(request_id)
        if req is None:
            return None
        mine = [e for e in self._deferred if e.seq.request_id == request_id]
        if mine:  # text work still owed: a sequence that ended on its own reports why
            self._deferred = [e for e in self._deferred if e.seq.request_id != request_id]
            for e in mine:
                self._emit(e)
        for st in req.states:
            if st.seq.finish_reason is None:
                self._finish(st.seq, "abort")
        del self.requests[request_id]
        return self._output(req)

    def get_sequences(self, request_id: str) -> list[Sequence]:
        """The live sequences of a request (empty once it has finished and been reported)."""
        req = self.requests.get(request_id)
        return [st.seq for st in req.states] if req else []

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    @property
    def has_work(self) -> bool:
        """Sequences to schedule, or outputs still to post-process (async output)."""
        return self.core.has_unfinished or bool(self._deferred)

    # -- the loop ------------------------------------------------------------
    def step(self, sink: Callable[[list[RequestOutput]], None] | None = None) -> list[RequestOutput]:
        """Schedule, execute and post-process one batch; outputs of the requests that moved.

        With async output, the text work of a step (detokenize, stop strings, outputs) runs during the
        next step's device work, so each step returns the previous step's outputs; a sequence ended by a
        stop string then has one extra token computed, which is dropped. ``sink``, if given, gets the
        outputs as soon as they exist (with async output, while the device computes) before they are
        returned.
        """
        t0 = time.perf_counter()
        outputs: list[RequestOutput] = []

        def overlap() -> None:  # while the device computes: the previous step's text work
            nonlocal outputs
            outputs = self._flush(sink)

        step = self.core.step(overlap if self.async_output else None)
        if step is None:
            return self._flush(sink)
        for s in step.batch.scheduled:
            if not s.is_decode:
                self._count_prompt(s.seq, s.start, s.start + s.num_new_tokens)
        self.counters.generation_tokens += len(step.appended)
        if step.verified:
            self._count_spec(step)
        self._deferred.extend(step.appended)
        if not self.async_output:
            outputs = self._flush(sink)
        self._record(step, t0, time.perf_counter())
        return outputs

    def _count_prompt(self, seq: Sequence, start: int, end: int) -> None:
        """Count the prompt positions up to ``end`` not counted yet: those before ``start`` the prefix
        cache served (at a sequence's first schedule), the rest this step computes."""
        req = self.requests.get(seq.request_id)  # (gone if the overlapped text work just finished it)
        st = req.states[seq.index] if req is not None else None
        end = min(end, len(seq.prompt_token_ids))
        if st is not None and end > st.prompt_counted:
            self.counters.cached_prompt_tokens += max(0, min(start, end) - st.prompt_counted)
            self.counters.prompt_tokens += end - st.prompt_counted
            st.prompt_counted = end

    def _count_spec(self, step: CoreStep) -> None:
        c = self.counters
        for k, n in step.verified:
            c.spec_drafts += 1
            c.spec_draft_tokens += k
            c.spec_accepted_tokens += n
            if len(c.spec_accepted_per_pos) < k:
                c.spec_accepted_per_pos.extend([0] * (k - len(c.spec_accepted_per_pos)))
            for i in range(n):
                c.spec_accepted_per_pos[i] += 1

    def _flush(self, sink: Callable[[list[RequestOutput]], None] | None = None) -> list[RequestOutput]:
        """Do the deferred text work; the outputs of the requests it moved (finished ones leave)."""
        entries, self._deferred = self._deferred, []
        touched: dict[str, None] = {}
        for e in entries:
            if self._emit(e):
                touched[e.seq.request_id] = None
        outputs = []
        for rid in touched:
            req = self.requests[rid]
            outputs.append(self._output(req))
            if req.finished:
                del self.requests[rid]
        if sink is not None and outputs:
            sink(outputs)
        return outputs

    def _emit(self, e: Appended) -> bool:
        """Detokenize one appended token and apply the stop strings; False if its request is gone."""
        seq = e.seq
        req = self.requests.get(seq.request_id)
        if req is None:
            return False
        if seq.finish_reason is not None:
            return True  # ended by an earlier token's stop string
        st = req.states[seq.index]
        delta = st.detok.add([e.token])
        if e.ended is not None and e.ended[0] == "stop":
            st.text += st.stops.flush()
            self._finish(seq, "stop", e.ended[1])
            return True
        emit, matched = st.stops.feed(delta)
        st.text += emit
        if matched is not None and e.num_output_tokens >= seq.sampling_params.min_tokens:
            seq.drop_after(e.num_output_tokens)  # a speculative step may have appended tokens past it
            self._finish(seq, "stop", matched)
        elif e.ended is not None:
            emit, matched = st.stops.feed(st.detok.flush())
            st.text += emit + ("" if matched else st.stops.flush())
            self._finish(seq, "length" if matched is None else "stop", matched)
        return True

    def _finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        self.core.finish(seq)  # a token that ended the sequence has already taken it off the scheduler
        st = self.requests[seq.request_id].states[seq.index]
        seq.finish(reason, stop_reason, time.perf_counter(), st.detok.elapsed_s)
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1

    def _record(self, step: CoreStep, t0: float, t_end: float) -> None:
        b = step.batch
        self.step_records.append(
            StepRecord(
                t0,
                t_end - t0,
                b.num_prefill_tokens,
                b.num_decode_tokens * b.passes,
                len(b.scheduled),
                b.phase,
                self.block_manager.usage,
                step.done - step.launched,
                b.passes,
            )
        )

    def _output(self, req: _Request) -> RequestOutput:
        outs = []
        for st in req.states:
            seq = st.seq
            outs.append(  # the token and logprob lists are copied when read, not every step
                CompletionOutput.snapshot(
                    seq.index,
                    st.text,
                    seq.token_ids,
                    len(seq.prompt_token_ids),
                    seq.logprobs,
                    seq.finish_reason,
                    seq.stop_reason,
                )
            )
        finished = req.finished
        metrics = req.states[0].seq.metrics if finished else None
        if finished and len(req.states) > 1:
            metrics = merge_metrics([st.seq.metrics for st in req.states], shared_prompt=True)
        out = RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, finished, metrics)
        for st in req.states:  # complete lists are no longer written to: shared, not copied
            if st.seq.prompt_logprobs is not None and not st.seq.needs_prompt_logprobs:
                out.prompt_logprobs, out.prompt_ranks = st.seq.prompt_logprobs, st.seq.prompt_ranks
                break
        return out

    # -- introspection -------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def check_integrity(self) -> None:
        live = list(self.scheduler.running) + list(self.scheduler.waiting)
        self.block_manager.check_integrity(live)
        if isinstance(self.scheduler.proposer, DraftModelProposer):  # the draft model's pool too
            self.scheduler.proposer.check_integrity(self.scheduler.running)
