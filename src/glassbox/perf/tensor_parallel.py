"""Tensor parallelism in the planner: the links between ranks and what a collective over them costs.

With TP over N ranks (Megatron's split, as glassbox's engine/tensor_parallel.py runs it) every rank holds
1/N of each linear (q/k/v and gate/up by output rows, o and down by input columns), 1/N of the KV heads
(a rank holds at least one: with fewer KV heads than ranks they are replicated) and its norms whole. A
step then streams and multiplies 1/N of the weights and KV on each rank at once, and pays two all-reduces
per layer (after attention-out and after MLP-down) of the step's activations (tokens x hidden at the
activation width), one more after the vocab-parallel embedding, and an all-gather of the sampled rows'
logits after the vocab-parallel LM head. Communication is not overlapped with compute (a rank waits for
its sum before the next layer): its time adds to the step.

One all-reduce of S bytes over N ranks (NCCL's ring; Patarasuk & Yuan 2009, nccl-tests
doc/PERFORMANCE.md's "bus bandwidth"):

    t = call + 2 (N - 1) x hop + 2 (N - 1) / N x S / B

``call`` is the fixed cost of one collective call (kernel launch, NCCL's proxy handing the work to the
NIC, the completion the next kernel waits on), ``hop`` the latency of each of the ring's 2 (N - 1) steps,
B the bus bandwidth per direction. An all-gather is half of the steps and bytes. A step of an engine
whose ranks sit in different boxes also pays ``step_sync_s`` once: the driver sending the scheduled batch
to the other boxes' workers and collecting their results (vLLM's multi-node executor), not hidden by
CUDA graphs. The 200gbe-roce figures are fitted on published DGX Spark measurements (see INTERCONNECTS).
"""

from __future__ import annotations

from dataclasses import dataclass

from glassbox.models.facts import ModelFacts


@dataclass(frozen=True)
class Interconnect:
    """A link between ranks: bus bandwidth per direction (bytes/s), the latency of one ring step (s), the
    fixed cost of one collective call (s) and of one engine step spread over boxes (s)."""

    name: str
    bandwidth_bytes_s: float
    latency_s: float
    source: str
    call_s: float = 0.0
    step_sync_s: float = 0.0


# Two DGX Sparks over one QSFP cable, NCCL over RoCE (fit rows and sources: benchmarks/results/planner-fit-*.md):
# - all_reduce_perf between two GB10s (nccl-tests 2.20, NCCL 2.31, MTU 9000), 8 KB: 27.8 us out of place, 16 KB
#   31.9 us (github.com/NVIDIA/dgx-spark-playbooks/pull/103): call + 2 hop = 27.8 - 0.4 (bytes) = 27.4 us.
# - the 48 KB all-reduce of a four-Spark TP decode step under NCCL: 54-64 us, 59 typical
#   (github.com/local-inference-lab/b12x/pull/295): call + 6 hop = 59 - 3.3 (bytes) = 55.7 us.
#   Two equations: hop = (55.7 - 27.4) / 4 = 7.1 us, call = 27.4 - 14.2 = 13.2 us.
# - bus bandwidth: all_gather_perf busbw 18.9-21.0 GB/s at 16 GB (dgx-spark-playbooks issue #25), "busbw ~20-24
#   GB/s" with both RoCE halves pinned (the nccl playbook, nvidia/nccl/README.md): 21 GB/s.
# - step_sync_s: fitted on gpt-oss-120b MXFP4 on vLLM, 58.82 tok/s on one Spark and 75.96 on two (TP=2) (Spark
#   Arena leaderboard, reported by sectorhq.co "Nvidia DGX Spark Boosts Open-Weight LLM Performance"): 5.1 ms.
SPARK_ROCE_CALL_S = 13.2e-6
SPARK_ROCE_HOP_S = 7.1e-6
SPARK_ROCE_STEP_SYNC_S = 5.1e-3

INTERCONNECTS: dict[str, Interconnect] = {
    i.name: i
    for i in (
        Interconnect(
            "200gbe-roce",
            21e9,
            SPARK_ROCE_HOP_S,
            "DGX Spark pair, one QSFP cable, NCCL over RoCE: 21 GB/s bus bandwidth (nccl-tests all_gather on "
            "two GB10s); 13.2 us per collective call + 7.1 us per ring step (nccl-tests all_reduce 8 KB: 27.8 "
            "us; a TP4 decode step's 48 KB all-reduce: 59 us); 5.1 ms per step spread over the boxes (fitted "
            "on gpt-oss-120b vLLM TP=1 vs TP=2 decode); sources in perf/tensor_parallel.py",
            call_s=SPARK_ROCE_CALL_S,
            step_sync_s=SPARK_ROCE_STEP_SYNC_S,
        ),
        Interconnect(
            "nvlink",
            450e9,
            3e-6,
            "H100 SXM NVLink 4: 900 GB/s total = 450 GB/s per direction (NVIDIA H100 datasheet); "
            "3 us per ring step is an assumption (NCCL's low-latency protocol on NVLink); ranks in one box: "
            "no per-step sync across boxes",
        ),
        Interconnect(
            "pcie",
            25e9,
            10e-6,
            "PCIe 4.0 x16: 31.5 GB/s raw per direction, ~25 GB/s achieved peer to peer (PCI-SIG spec; "
            "the 25 is an assumption); 10 us per ring step is an assumption; ranks in one box",
        ),
    )
}
INTERCONNECT_CHOICES = tuple(INTERCONNECTS)
ACTIVATION_BYTES = 2.0  # the all-reduced activations travel in bf16 (glassbox's CPU TP in float32: 4)


def get_interconnect(name: str) -> Interconnect:
    try:
        return INTERCONNECTS[name]
    except KeyError:
        raise ValueError(f"--interconnect must be one of {', '.join(INTERCONNECTS)}, got {name!r}") from None


@dataclass(frozen=True)
class TensorParallel:
    """N ranks joined by ``link`` (size 1: no parallelism, no link needed)."""

    size: int = 1
    link: Interconnect | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"--tensor-parallel-size must be >= 1, got {self.size}")
        if self.size > 1 and self.link is None:
            raise ValueError("tensor parallelism needs an interconnect")


def check_tp(facts: ModelFacts, size: int) -> None:
    """ValueError unless the model's heads split over ``size`` ranks (KV heads: split or replicated)."""
    if size == 1:
        return
    heads, kv = facts.num_heads, facts.num_kv_heads
    if heads % size:
        raise ValueError(f"--tensor-parallel-size {size} must divide the model's {heads} attention heads")
    if kv and kv % size and size % kv:
        raise ValueError(
            f"--tensor-parallel-size {size} and the model's {kv} KV heads: one must divide the other"
        )


def kv_share(facts: ModelFacts, size: int) -> float:
    """Share of the KV cache each rank holds: its KV heads over all (at least one head per rank)."""
    kv = facts.num_kv_heads
    if size == 1:
        return 1.0
    return max(kv // size, 1) / kv if kv else 1.0 / size


def ring_allreduce_s(message_bytes: float, size: int, link: Interconnect | None) -> float:
    """Seconds for a ring all-reduce of ``message_bytes`` over ``size`` ranks (0 for one rank)."""
    if size <= 1 or message_bytes <= 0:
        return 0.0
    assert link is not None
    steps = 2.0 * (size - 1)
    return link.call_s + steps * link.latency_s + steps / size * message_bytes / link.bandwidth_bytes_s


def ring_allgather_s(total_bytes: float, size: int, link: Interconnect | None) -> float:
    """Seconds for a ring all-gather whose result is ``total_bytes`` (each rank contributes 1/size)."""
    if size <= 1 or total_bytes <= 0:
        return 0.0
    assert link is not None
    steps = float(size - 1)
    return link.call_s + steps * link.latency_s + steps / size * total_bytes / link.bandwidth_bytes_s


def layer_allreduce_s(facts: ModelFacts, tp: TensorParallel, tokens: int) -> float:
    """One layer's communication in a step of ``tokens`` rows: two all-reduces of tokens x hidden."""
    return 2.0 * ring_allreduce_s(tokens * facts.hidden_size * ACTIVATION_BYTES, tp.size, tp.link)


def step_comm_s(facts: ModelFacts, tp: TensorParallel, tokens: int, logit_rows: int) -> float:
    """A whole step's communication: every layer's two all-reduces, the embedding's all-reduce, the
    all-gather of ``logit_rows`` rows of float32 logits and the link's per-step sync across boxes."""
    if tp.size == 1 or tokens == 0:
        return 0.0
    assert tp.link is not None
    embed = ring_allreduce_s(tokens * facts.hidden_size * ACTIVATION_BYTES, tp.size, tp.link)
    logits = ring_allgather_s(logit_rows * facts.vocab_size * 4.0, tp.size, tp.link)
    return facts.num_layers * layer_allreduce_s(facts, tp, tokens) + embed + logits + tp.link.step_sync_s
