"""The Executor boundary: run one scheduled batch, return the sampled token of each finishing row.

Two implementations: TorchExecutor (engine/model_runner.py, a real model on CPU or CUDA) and the
planner's SimulatedExecutor (perf/simulator.py, a roofline cost model on a virtual clock). The LLMEngine
drives TorchExecutor through its split form, ``launch(batch)`` then ``PendingStep.result()``, so that host
work runs between the two while a GPU computes (``execute`` is the two in one).
"""

from __future__ import annotations

from typing import Protocol

from glassbox.engine.scheduler import SchedulerOutput
from glassbox.outputs import SampleResult


class Executor(Protocol):
    num_kv_blocks: int
    block_size: int

    def execute(self, batch: SchedulerOutput) -> dict[int, SampleResult]:
        """Compute the batch's new tokens' KV and sample for rows that reach their sequence's end.

        Returns {seq_id: SampleResult} for every scheduled sequence with ``samples`` set.
        """
        ...
