"""Tensor parallelism in the planner: the links between ranks and what an all-reduce over them costs.

With TP over N ranks (Megatron's split, as glassbox's engine/tensor_parallel.py runs it) every rank holds
1/N of each linear (q/k/v and gate/up by output rows, o and down by input columns), 1/N of the KV heads
(a rank holds at least one: with fewer KV heads than ranks they are replicated) and its norms whole. A
step then streams and multiplies 1/N of the weights and KV on each rank at once, and pays two all-reduces
per layer (after attention-out and after MLP-down) of the step's activations (tokens x hidden at the
activation width), one more after the vocab-parallel embedding, and an all-gather of the sampled rows'
logits after the vocab-parallel LM head. Communication is not overlapped with compute (a rank waits for
its sum before the next layer): its time adds to the step.

Ring all-reduce of S bytes over N ranks: each rank sends and receives 2 (N - 1) / N x S bytes in
2 (N - 1) steps (reduce-scatter then all-gather), so t = 2 (N - 1) / N x S / B + 2 (N - 1) x alpha, with B
the link bandwidth per direction and alpha the latency of one step (Patarasuk & Yuan 2009; NCCL's
"bus bandwidth" convention, nccl-tests doc/PERFORMANCE.md). An all-gather is half of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from glassbox.models.facts import ModelFacts


@dataclass(frozen=True)
class Interconnect:
    """A link between ranks: bandwidth per direction (bytes/s) and the latency of one ring step (s)."""

    name: str
    bandwidth_bytes_s: float
    latency_s: float
    source: str


INTERCONNECTS: dict[str, Interconnect] = {
    i.name: i
    for i in (
        Interconnect(
            "200gbe-roce",
            25e9,
            8e-6,
            "DGX Spark's ConnectX-7 port: 200 Gb/s = 25 GB/s per direction (NVIDIA DGX Spark datasheet); "
            "8 us per ring step is an assumption (RDMA one-way latency is ~2-3 us, NCCL's per-step "
            "protocol and kernel-launch costs over RoCE add several us)",
        ),
        Interconnect(
            "nvlink",
            450e9,
            3e-6,
            "H100 SXM NVLink 4: 900 GB/s total = 450 GB/s per direction (NVIDIA H100 datasheet); "
            "3 us per ring step is an assumption (NCCL's low-latency protocol on NVLink)",
        ),
        Interconnect(
            "pcie",
            25e9,
            10e-6,
            "PCIe 4.0 x16: 31.5 GB/s raw per direction, ~25 GB/s achieved peer to peer (PCI-SIG spec; "
            "the 25 is an assumption); 10 us per ring step is an assumption",
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
    return (
        2.0 * (size - 1) / size * message_bytes / link.bandwidth_bytes_s + 2.0 * (size - 1) * link.latency_s
    )


def ring_allgather_s(total_bytes: float, size: int, link: Interconnect | None) -> float:
    """Seconds for a ring all-gather whose result is ``total_bytes`` (each rank contributes 1/size)."""
    if size <= 1 or total_bytes <= 0:
        return 0.0
    assert link is not None
    return (size - 1) / size * total_bytes / link.bandwidth_bytes_s + (size - 1) * link.latency_s


def layer_allreduce_s(facts: ModelFacts, tp: TensorParallel, tokens: int) -> float:
    """One layer's communication in a step of ``tokens`` rows: two all-reduces of tokens x hidden."""
    return 2.0 * ring_allreduce_s(tokens * facts.hidden_size * ACTIVATION_BYTES, tp.size, tp.link)


def step_comm_s(facts: ModelFacts, tp: TensorParallel, tokens: int, logit_rows: int) -> float:
    """A whole step's communication: every layer's two all-reduces, the embedding's all-reduce and the
    all-gather of ``logit_rows`` rows of float32 logits."""
    if tp.size == 1 or tokens == 0:
        return 0.0
    embed = ring_allreduce_s(tokens * facts.hidden_size * ACTIVATION_BYTES, tp.size, tp.link)
    logits = ring_allgather_s(logit_rows * facts.vocab_size * 4.0, tp.size, tp.link)
    return facts.num_layers * layer_allreduce_s(facts, tp, tokens) + embed + logits
