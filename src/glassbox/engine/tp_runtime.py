"""Tensor parallelism's processes: which rank this process is, the local ranks it spawns, the gloo group,
and a worker's loop.

Rank 0 runs the scheduler, the API and its share of every step; before each forward it broadcasts the
step's inputs (token ids, positions, attention metadata, sampled rows: engine/tp_model.py) and every
worker runs the same forward, so their all-reduces pair up. Workers never schedule or sample.

Where the ranks come from:
- one host: ``--tensor-parallel-size N`` spawns ranks 1..N-1 (torch.multiprocessing, spawn) on a free port;
- several hosts: each runs the same command with ``--nnodes M --node-rank i --master-addr A --master-port P``
  and holds ranks [i N/M, (i+1) N/M); node 0's first rank is rank 0 (the server), the other nodes only work;
- torchrun: ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` in the environment name this process's
  rank; nothing is spawned.
Rank 0 hosts the rendezvous store and watches the workers it spawned until all have joined: one that
exits first (a script without the ``__main__`` guard re-runs its top in the worker) fails the start at
once. A rank that dies later breaks its peers' next collective, mostly at once (the socket closes) but on some paths
only at the timeout (seen once in a test); one that hangs fails it after ``GLASSBOX_TP_TIMEOUT`` seconds
(default 30): TensorParallelError, which stops rank 0's
engine loudly. Workers wait for steps on a group with a long timeout (the server may idle); rank 0's end of
it has the short one.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.process import BaseProcess

import torch
import torch.distributed as dist

from glassbox.config import EngineConfig
from glassbox.distributed import (
    TensorParallelError,
    TPState,
    broadcast_object,
    compute_backend,
    cpu_lists,
    failed,
    set_state,
    state,
)
from glassbox.engine import tp_model
from glassbox.engine.checkpoint import Checkpoint, open_checkpoint
from glassbox.engine.device import resolve_device
from glassbox.engine.torch_executor import TorchExecutor
from glassbox.models.facts import ModelFacts
from glassbox.models.model_config import ModelConfig
from glassbox.models.sources import resolve_model

logger = logging.getLogger(__name__)

IDLE_TIMEOUT = timedelta(days=365)  # workers wait for the next step as long as the server idles


def timeout_s() -> float:
    return float(os.environ.get("GLASSBOX_TP_TIMEOUT", "30"))


@dataclass(frozen=True)
class Launch:
    """This process's rank, the group's size and rendezvous, and the local ranks it spawns."""

    rank: int
    world: int
    addr: str
    port: int
    spawn: tuple[int, ...]
    local: int = 0  # this process's index among its host's ranks: its GPU on CUDA


def launch_plan(config: EngineConfig, env: dict[str, str] | None = None) -> Launch:
    env = dict(os.environ) if env is None else env
    world = config.tensor_parallel_size
    if "RANK" in env and "WORLD_SIZE" in env:  # started by torchrun (or by hand with its variables)
        if int(env["WORLD_SIZE"]) != world:
            raise ValueError(
                f"WORLD_SIZE={env['WORLD_SIZE']} but --tensor-parallel-size {world}: they must agree"
            )
        addr, port = env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500"))
        return Launch(int(env["RANK"]), world, addr, port, (), int(env.get("LOCAL_RANK", "0")))
    local = world // config.nnodes
    first = config.node_rank * local
    port = config.master_port or (_free_port() if config.nnodes == 1 else 29500)
    return Launch(first, world, config.master_addr, port, tuple(range(first + 1, first + local)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_group(
    rank: int,
    world: int,
    addr: str,
    port: int,
    procs: Sequence[BaseProcess] = (),
    local: int = 0,
    cuda: bool = False,
) -> None:
    """Join the group and set state(): a compute group with the short timeout (NCCL on CUDA, this process
    on GPU ``local``; else gloo), a gloo control group (step broadcasts) with a long one. Rank 0 hosts the
    rendezvous store and waits for every rank to join it, watching ``procs`` (the workers it spawned): one
    that exits first fails the start at once (``_await_ranks``) rather than after GLASSBOX_TP_START_TIMEOUT."""
    start = timedelta(seconds=float(os.environ.get("GLASSBOX_TP_START_TIMEOUT", "300")))
    bind_cpus(local)
    if cuda:
        # "cuda" is this GPU from here on: the executor's tensors, its budget (ranks share GPUs only under
        # GLASSBOX_TP_BACKEND=gloo: NCCL's are refused with fewer GPUs than ranks, tp_model.check_run)
        torch.cuda.set_device(local % max(1, torch.cuda.device_count()))
    store = dist.TCPStore(addr, port, world, is_master=rank == 0, timeout=start, wait_for_workers=False)
    if rank == 0:
        _await_ranks(store, world, start, procs)
    else:
        store.set(f"{JOINED}/{rank}", "1")
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=start)
    t = timeout_s()
    # the step broadcast: rank 0 sends within the timeout, workers may wait for it as long as the server idles
    control = dist.new_group(backend="gloo", timeout=timedelta(seconds=t) if rank == 0 else IDLE_TIMEOUT)
    backend = compute_backend(cuda)
    compute = dist.new_group(backend=backend, timeout=timedelta(seconds=t))
    set_state(TPState(rank, world, compute, control, t))
    where = f"cuda:{local}, " if cuda else ""
    logger.info(
        "tensor-parallel rank %d of %d joined (%s%s, %s:%d, %g s timeout)", rank, world, where, backend, addr,
        port, t,
    )  # fmt: skip


def bind_cpus(local: int) -> None:
    """With ``GLASSBOX_TP_CPU_BIND`` (a CPU list a local rank: "0-15|16-31"), all of this process's threads on
    its rank's CPUs, before it loads anything (so that, by first touch, its weights and cache are in those CPUs'
    NUMA node), and its torch threads one a CPU unless GLASSBOX_NUM_THREADS says otherwise."""
    spec = os.environ.get("GLASSBOX_TP_CPU_BIND")
    if not spec:
        return
    cpus = cpu_lists(spec)[local]
    tasks = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]
    for tid in tasks:  # every thread there is (a thread pool made earlier too); later ones inherit it
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that has ended since
            pass
    if "GLASSBOX_NUM_THREADS" not in os.environ:
        torch.set_num_threads(len(cpus))
    logger.info("tensor-parallel local rank %d bound to CPUs %s", local, sorted(cpus))


JOINED = "glassbox/joined"  # each rank's key in the rendezvous store once it has connected


def _await_ranks(store: dist.TCPStore, world: int, start: timedelta, procs: Sequence[BaseProcess]) -> None:
    """Rank 0: wait until ranks 1..world-1 have joined the store; TensorParallelError at once where a
    spawned worker has exited first, or when the start-up timeout passes (naming the missing ranks)."""
    keys = [f"{JOINED}/{r}" for r in range(1, world)]
    deadline = time.monotonic() + start.total_seconds()
    while not store.check(keys):
        dead = [p for p in procs if p.exitcode is not None]
        if dead:
            raise TensorParallelError(
                f"tensor-parallel worker {dead[0].name} exited (code {dead[0].exitcode}) before joining the "
                "group: its error is above. (A script that makes LLM(..., tensor_parallel_size=N) must do it "
                'under `if __name__ == "__main__":`: the workers are spawned, and re-run the script\'s top.)'
            )
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys, start=1) if not store.check([k])]
            raise TensorParallelError(
                f"tensor-parallel ranks {missing} did not join within {start.total_seconds():g} s "
                "(GLASSBOX_TP_START_TIMEOUT): are they started, with the same --master-addr/--master-port?"
            )
        time.sleep(0.05)


def spawn(plan: Launch, config: EngineConfig) -> list[BaseProcess]:
    """Start this host's other ranks as processes that run ``_worker_main``."""
    ctx = torch.multiprocessing.get_context("spawn")
    procs: list[BaseProcess] = []
    for rank in plan.spawn:
        p = ctx.Process(
            target=_worker_main,
            args=(rank, plan.world, plan.addr, plan.port, config, plan.local + rank - plan.rank),
            daemon=True,
            name=f"rank {rank}",
        )
        p.start()
        procs.append(p)
    return procs


_PROCS: list[BaseProcess] = []  # the workers this process spawned as rank 0


def start(config: EngineConfig) -> None:
    """Rank 0 (the engine's process), with tensor_parallel_size > 1: spawn the local workers and join the
    group (``shutdown`` undoes it; also at exit)."""
    if config.tensor_parallel_size == 1:
        return
    if state() is not None:
        raise ValueError("this process already runs a tensor-parallel engine (one per process)")
    plan = launch_plan(config)
    if plan.rank != 0:
        raise ValueError(
            f"this process is tensor-parallel rank {plan.rank}: only rank 0 runs the engine (glassbox serve "
            "runs the other ranks as workers)"
        )
    if not _PROCS:
        atexit.register(shutdown)
    _PROCS.extend(spawn(plan, config))
    try:
        init_group(0, plan.world, plan.addr, plan.port, _PROCS, plan.local, _on_cuda(config))
    except Exception:
        shutdown()
        raise


def executor(
    config: EngineConfig,
    checkpoint: Checkpoint | None,
    facts: ModelFacts,
    max_model_len: int,
    batch: int,
    draft_kv_bytes_per_token: float = 0.0,
) -> TorchExecutor:
    """The engine's executor; with tensor_parallel_size > 1, rank 0's, the other ranks started first (and
    stopped again if this rank cannot start)."""
    if config.tensor_parallel_size > 1:  # refuse before spawning anything
        cfg = ModelConfig.from_facts(facts)
        device = resolve_device(config.device)
        tp_model.check_run(config.tensor_parallel_size, device, config, checkpoint, cfg)
    start(config)
    try:
        return TorchExecutor(
            config, checkpoint, facts, max_model_len, batch, draft_kv_bytes_per_token=draft_kv_bytes_per_token
        )
    except BaseException:
        shutdown()
        raise


def work(config: EngineConfig) -> bool:
    """``glassbox serve`` on a process that is not rank 0: spawn this host's other ranks, work until rank 0
    stops; True. False on rank 0's host process (it serves)."""
    plan = launch_plan(config)
    if plan.rank == 0:
        return False
    procs = spawn(plan, config)
    try:
        run_worker(plan.rank, plan.world, plan.addr, plan.port, config, plan.local)
    finally:
        for p in procs:
            p.join(timeout=5.0)
    return True


def _worker_main(rank: int, world: int, addr: str, port: int, config: EngineConfig, local: int) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s"
    )
    try:
        run_worker(rank, world, addr, port, config, local)
    except TensorParallelError as e:
        logger.error("%s; worker exits", e)
        raise SystemExit(1) from None


def _on_cuda(config: EngineConfig) -> bool:
    return resolve_device(config.device).type == "cuda"


def run_worker(rank: int, world: int, addr: str, port: int, config: EngineConfig, local: int = 0) -> None:
    """Join the group, build this rank's executor, then run each step rank 0 broadcasts until it sends None
    (or its connection breaks: TensorParallelError)."""
    # Ctrl-C reaches every process of the terminal's group: a worker leaves when rank 0 says so (or its
    # connection closes), so that rank 0's shutdown can still reach it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    init_group(rank, world, addr, port, local=local, cuda=_on_cuda(config))
    executor = build_executor(config)
    logger.info("rank %d: %.1f MiB of weights, waiting for steps", rank, executor.weight_bytes / 2**20)
    while True:
        inputs = broadcast_object(None)
        if inputs is None:
            return
        tp_model.run_step(executor, inputs)


def build_executor(config: EngineConfig) -> TorchExecutor:
    """The executor a worker runs: the same checkpoint and sizes as rank 0's LLMEngine builds."""
    checkpoint = open_checkpoint(resolve_model(config.model))
    facts = checkpoint.facts
    max_len = config.max_model_len or facts.max_positions
    default_batch = 8192 if resolve_device(config.device).type == "cuda" else 2048
    batch = config.max_num_batched_tokens or default_batch
    ckpt = None if config.load_format == "dummy" else checkpoint
    return TorchExecutor(replace(config), ckpt, facts, max_len, batch)


def shutdown() -> None:
    """Rank 0: tell the workers to return (if the group still works), reap the local ones, leave the group."""
    s = state()
    if s is not None and s.rank == 0 and not failed():
        try:
            broadcast_object(None)
        except TensorParallelError:
            pass
    for p in _PROCS:
        p.join(timeout=0.0 if failed() else 5.0)  # a broken group's workers may never hear
        if p.is_alive():
            p.terminate()
            p.join(timeout=5.0)
    _PROCS.clear()
    set_state(None)
