"""How long a greedy decode burst may be (engine/scheduler.py ``ScheduledSeq.lookahead``).

A burst picks k + 1 tokens per row in one engine step (models/llama_burst.py), so the step's host work
(scheduling, inputs, sampling, appending, text) is paid once for k + 1 tokens; the cost is that a burst's
tokens reach the client together, and a request that arrives during one waits for its end. So bursts are
sized by time: as many steps as take ``BURST_S`` at the measured time per step (a thin model's steps, well
under a millisecond, go in bursts; a step of a few milliseconds or more is not burst at all), or a fixed
count (``--num-scheduler-steps``). The measured time is the executor's time per token of the decode-only
steps so far (an exponential average), so it follows the machine's load.
"""

from __future__ import annotations

from glassbox.config import MAX_SCHEDULER_STEPS

BURST_S = 0.004  # a burst's length in time, about: below what a reader of a stream can see
SMOOTHING = 0.2  # the weight of each new decode step in the average


class BurstSizer:
    """The lookahead to give the next step: ``steps - 1`` for a fixed count, else from the time per token."""

    def __init__(self, steps: int | None) -> None:
        self.steps = steps
        self.per_token_s: float | None = None

    def lookahead(self) -> int:
        if self.steps is not None:
            return self.steps - 1
        if self.per_token_s is None:
            return 0
        return max(0, min(MAX_SCHEDULER_STEPS, int(BURST_S / self.per_token_s)) - 1)

    def observe(self, seconds: float, tokens_per_row: int) -> None:
        """A decode-only step took ``seconds`` from launch to its tokens, ``tokens_per_row`` per row."""
        t = seconds / tokens_per_row
        self.per_token_s = (
            t if self.per_token_s is None else (1 - SMOOTHING) * self.per_token_s + SMOOTHING * t
        )
