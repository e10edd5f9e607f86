"""LLMEngine: add_request / step / abort. Owns the tokenizer, the scheduler and the executor."""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from glassbox.config import EngineConfig
from glassbox.engine.block_manager import BlockManager
from glassbox.engine.model_runner import TorchExecutor, resolve_device
from glassbox.engine.scheduler import Scheduler, SchedulerOutput
from glassbox.engine.sequence import RequestMetrics, Sequence
from glassbox.models.model_config import ModelConfig
from glassbox.outputs import CompletionOutput, RequestOutput, SampleResult
from glassbox.sampling_params import SamplingParams
from glassbox.tokenizer.detokenizer import IncrementalDetokenizer
from glassbox.tokenizer.hf_tokenizer import Tokenizer
from glassbox.tokenizer.stop_checker import StopChecker

logger = logging.getLogger(__name__)

DEMO_MODEL_DIR = Path(__file__).resolve().parent.parent / "demo"


def resolve_model_dir(model: str | None) -> Path:
    """The model directory: the given path, or the bundled demo model when none is given."""
    path = DEMO_MODEL_DIR if model is None else Path(model)
    if not path.is_dir():
        raise FileNotFoundError(
            f"model directory not found: {path} (downloads are not supported; pass a local HF dir)"
        )
    return path


@dataclass
class StepRecord:
    """One engine step, for metrics and the planner's calibration."""

    start: float
    duration_s: float  # the whole step: schedule, execute, post-process (detokenize, stop checks)
    num_prefill_tokens: int
    num_decode_tokens: int
    batch_size: int
    phase: str  # "prefill" | "decode" | "mixed"
    kv_usage: float
    # of duration_s, launch to sampled tokens: the model forward and sampling (with async output, also the
    # previous step's post-processing that overlapped them)
    execute_s: float = 0.0


@dataclass
class EngineCounters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)


@dataclass
class _SeqState:
    seq: Sequence
    detok: IncrementalDetokenizer
    stops: StopChecker
    text: str = ""


@dataclass
class _Sampled:
    """A token appended to its sequence whose text work (detokenize, stop strings) is still to do."""

    seq: Sequence
    token: int
    num_output_tokens: int  # the sequence's count with this token
    ended: tuple[str, int | None] | None  # from the token alone: ("stop", stop token) | ("length", None)


@dataclass
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    states: list[_SeqState]
    tokenize_s: float = 0.0

    @property
    def finished(self) -> bool:
        return all(s.seq.finish_reason is not None for s in self.states)


class LLMEngine:
    """The engine loop's core. Not thread-safe: one caller drives add_request/step/abort."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.model_dir = (
            resolve_model_dir(config.model) if config.load_format != "dummy" or config.model else None
        )
        if self.model_dir is None:
            raise ValueError("--load-format dummy needs a MODEL directory or config.json for the shapes")
        self.model_config = ModelConfig.from_dir(self.model_dir)
        self.model_name = config.served_model_name or (
            self.model_dir.name if config.model else "glassbox-demo"
        )
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        limit = self.model_config.max_position_embeddings
        if config.max_model_len is not None and config.max_model_len > limit:
            raise ValueError(
                f"--max-model-len {config.max_model_len} exceeds the model's limit of {limit} positions"
            )
        self.max_model_len = config.max_model_len or limit
        default_batch = 8192 if resolve_device(config.device).type == "cuda" else 2048
        self.max_num_batched_tokens = config.max_num_batched_tokens or default_batch
        self.executor = TorchExecutor(
            config,
            None if config.load_format == "dummy" else self.model_dir,
            self.model_config,
            self.max_model_len,
            self.max_num_batched_tokens,
        )
        self.executor.eos_ids = self.tokenizer.eos_token_ids
        plan = self.executor.kv_plan
        logger.info(
            "KV cache: %d blocks x %d tokens = %d tokens, %.3f GiB (%s, %s)",
            plan.num_blocks,
            plan.block_size,
            plan.num_tokens,
            plan.gib,
            self.executor.device,
            self.executor.kv_dtype,
        )
        self.block_manager = BlockManager(plan.num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, self.max_num_batched_tokens)
        cuda = self.executor.device.type == "cuda"
        self.async_output = cuda if config.async_output is None else config.async_output
        self._deferred: list[_Sampled] = []
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
    ) -> None:
        """Queue a request; raises ValueError at once if it is invalid or could never run."""
        params = params or SamplingParams()
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        t0 = time.perf_counter()
        arrival = t0 if arrival_time is None else arrival_time
        if isinstance(prompt, str):
            text: str | None = prompt
            ids = self.tokenizer.encode(prompt)
        else:
            text, ids = None, list(prompt)
        tokenize_s = time.perf_counter() - t0
        self._validate(ids, params)
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - len(ids)
        if params.max_tokens is None:
            params = replace(params, max_tokens=max_tokens)
        states = []
        for i in range(params.n):
            seq = Sequence(next(self._seq_ids), request_id, ids, params, index=i, arrival_time=arrival)
            seq.metrics.tokenize_s = tokenize_s
            detok = IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
            states.append(_SeqState(seq, detok, StopChecker(params.stop, params.include_stop_str_in_output)))
        self.requests[request_id] = _Request(request_id, text, ids, params, states, tokenize_s)
        for st in states:
            self.scheduler.add(st.seq)

    def _validate(self, ids: list[int], params: SamplingParams) -> None:
        if not ids:
            raise ValueError("prompt is empty: it must hold at least one token")
        vocab = self.model_config.vocab_size
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be in [0, {vocab}); got {bad[:5]}")
        max_tokens = params.max_tokens if params.max_tokens is not None else 1
        total = len(ids) + max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) = {total} exceeds the maximum model "
                f"length of {self.max_model_len} tokens"
            )
        capacity = self.block_manager_capacity_tokens
        if total > capacity:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) = {total} exceeds the whole KV cache "
                f"({capacity} tokens); raise the KV cache size or shorten the request"
            )

    @property
    def block_manager_capacity_tokens(self) -> int:
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
        return self.scheduler.num_unfinished > 0 or bool(self._deferred)

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
        sched = self.scheduler.schedule()
        if sched.empty:
            return self._flush(sink)
        t_exec = time.perf_counter()
        pending = self.executor.launch(sched)
        outputs = self._flush(sink) if self.async_output else []  # while the device computes
        results = pending.result()
        t1 = time.perf_counter()
        self.scheduler.update(sched)
        self._postprocess(sched, results, t1)
        if not self.async_output:
            outputs = self._flush(sink)
        self._record(sched, t0, t1 - t_exec, time.perf_counter())
        return outputs

    def _postprocess(self, sched: SchedulerOutput, results: dict[int, SampleResult], now: float) -> None:
        for s in sched.scheduled:
            seq = s.seq
            if s.start == 0 and s.seq.num_output_tokens == 0:
                self.counters.prompt_tokens += s.num_new_tokens
            res = results.get(seq.seq_id)
            if res is None or seq.is_finished:  # finished: a stop string ended it after this step began
                continue
            self._append(seq, res, now)

    def _append(self, seq: Sequence, res: SampleResult, now: float) -> None:
        """Add the token and end the sequence at once if the token alone ends it (stop token, EOS,
        length), so that the next step does not schedule it; its text work is deferred."""
        sp = seq.sampling_params
        seq.append_token(res.token_id)
        self.counters.generation_tokens += 1
        m = seq.metrics
        if m.first_token_time is None:
            m.first_token_time = now
        m.last_token_time = now
        m.token_times.append(now)
        if seq.logprobs is not None and res.logprobs is not None:
            seq.logprobs.append(res.logprobs)
        t = res.token_id
        n_out = seq.num_output_tokens
        assert sp.max_tokens is not None
        ended: tuple[str, int | None] | None = None
        if n_out >= sp.min_tokens and t in sp.stop_token_ids:
            ended = ("stop", t)
        elif n_out >= sp.min_tokens and not sp.ignore_eos and t in self.tokenizer.eos_token_ids:
            ended = ("stop", None)
        elif n_out >= sp.max_tokens or len(seq) >= self.max_model_len:
            ended = ("length", None)
        if ended is not None:
            self.scheduler.finish(seq)  # its blocks are free for the next step
        self._deferred.append(_Sampled(seq, t, n_out, ended))

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

    def _emit(self, e: _Sampled) -> bool:
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
            self._finish(seq, "stop", matched)
        elif e.ended is not None:
            emit, matched = st.stops.feed(st.detok.flush())
            st.text += emit + ("" if matched else st.stops.flush())
            self._finish(seq, "length" if matched is None else "stop", matched)
        return True

    def _finish(self, seq: Sequence, reason: str, stop_reason: int | str | None = None) -> None:
        seq.finish_reason = reason
        seq.stop_reason = stop_reason
        if not seq.is_finished:  # a token that ended the sequence has already taken it off the scheduler
            self.scheduler.finish(seq)
        m = seq.metrics
        m.finished_time = time.perf_counter()
        m.output_tokens = seq.num_output_tokens
        st = self.requests[seq.request_id].states[seq.index]
        m.detokenize_s = st.detok.elapsed_s
        m.finalize()
        self.counters.finished[reason] = self.counters.finished.get(reason, 0) + 1

    def _record(self, sched: SchedulerOutput, t0: float, execute_s: float, t_end: float) -> None:
        self.step_records.append(
            StepRecord(
                t0,
                t_end - t0,
                sched.num_prefill_tokens,
                sched.num_decode_tokens,
                len(sched.scheduled),
                sched.phase,
                self.block_manager.usage,
                execute_s,
            )
        )

    def _output(self, req: _Request) -> RequestOutput:
        outs = []
        for st in req.states:
            seq = st.seq
            outs.append(
                CompletionOutput(
                    seq.index,
                    st.text,
                    seq.output_token_ids,
                    list(seq.logprobs) if seq.logprobs is not None else None,
                    seq.finish_reason,
                    seq.stop_reason,
                )
            )
        finished = req.finished
        metrics = req.states[0].seq.metrics if finished else None
        if finished and len(req.states) > 1:
            metrics = _merge_metrics([st.seq for st in req.states])
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, outs, finished, metrics)

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


def _merge_metrics(seqs: list[Sequence]) -> RequestMetrics:
    """A request with n > 1: one anatomy; timings from the first sequence, output tokens summed."""
    first = seqs[0].metrics
    last = max((s.metrics for s in seqs), key=lambda m: m.finished_time or 0.0)
    m = replace(
        first,
        finished_time=last.finished_time,
        output_tokens=sum(s.num_output_tokens for s in seqs),
        preemptions=sum(s.metrics.preemptions for s in seqs),
        token_times=list(first.token_times),
    )
    m.finalize()
    return m
