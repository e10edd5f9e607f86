"""The Executor boundary: run one scheduled batch, return the sampled token of each row that samples.

Two implementations: TorchExecutor (engine/torch_executor.py, a real model on CPU or CUDA) and the
planner's SimulatedExecutor (perf/simulator.py, a roofline cost model on a virtual clock). The step loop
(engine/core.py) calls ``launch(batch)``, may do host work while the device computes, then reads
``result()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from glassbox.engine.scheduler import SchedulerOutput
from glassbox.outputs import SampleResult


class PendingStep(Protocol):
    """A launched step whose sampled tokens may still be on the device."""

    def result(self) -> dict[int, SampleResult]:
        """{seq_id: SampleResult} for every scheduled sequence with ``samples`` set; waits if needed."""
        ...


class Executor(Protocol):
    def launch(self, batch: SchedulerOutput) -> PendingStep:
        """Queue the batch: compute its new tokens' KV and sample for rows that reach their sequence's end."""
        ...


@dataclass
class ReadyStep:
    """A step whose draws are known when it is launched (the simulator's; a CPU decode burst's)."""

    results: dict[int, SampleResult]

    def result(self) -> dict[int, SampleResult]:
        return self.results
