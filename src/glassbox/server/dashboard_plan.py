"""The dashboard's ceilings: this machine's roofline per engine step, and ``glassbox plan --hardware local``
for the served model beside what the server measured.

The hardware figures are ``perf.probe.probe_local``'s (the cached probe that ``plan --hardware local`` and
``glassbox trace`` use; measured once, in a worker thread, when none is cached). A step's bytes and FLOPs
are the planner's cost model (``perf.cost_model.step_cost``) over the step's rows, as ``glassbox trace``
holds a request against the roofline; achieved = those / the step's execute time.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from array import array
from collections import OrderedDict
from typing import Any

from glassbox.dtypes import kv_element_bytes
from glassbox.engine.llm_engine import LLMEngine
from glassbox.models.model_config import dtype_name
from glassbox.perf.cost_model import step_cost
from glassbox.perf.engine_profiles import get_engine
from glassbox.perf.hardware import HardwareSpec
from glassbox.perf.memory_plan import KV_DTYPES
from glassbox.perf.planner import PlanRequest, plan
from glassbox.perf.probe import probe_local
from glassbox.perf.quant import resolve_scheme
from glassbox.perf.simulator import percentile
from glassbox.trace import weight_quant

logger = logging.getLogger(__name__)

_PLAN_CACHE = 32  # (prompt, output, concurrency) predictions kept
# the measured medians set beside the plan's figures
MEASURED_KEYS = ("queue_s", "prefill_s", "ttft_s", "decode_s", "e2e_s", "prefill_tok_s", "decode_tok_s")


class Ceilings:
    """This machine's roofline for the served engine and the planner's predictions, computed lazily."""

    def __init__(self, engine: LLMEngine) -> None:
        self.facts = engine.facts
        self.dtype = dtype_name(engine.executor.dtype)
        self.device = engine.executor.device.type
        self.quant = weight_quant(engine)
        self.model_path = str(engine.source.path)
        kv = engine.config.kv_cache_dtype
        self.kv_cache_dtype = kv if kv in KV_DTYPES else "auto"
        self.kv_bytes = kv_element_bytes(dtype_name(engine.executor.kv_dtype), self.facts.head_dim)
        self.scheme = resolve_scheme(self.quant, self.facts.native_quant, self.dtype, False, None)
        self.ideal = get_engine("ideal")
        self.hw: HardwareSpec | None = None
        self.error: str | None = None
        self._probe: asyncio.Task[None] | None = None
        self._lock = threading.Lock()  # one probe or plan at a time (they share the probe's cache file)
        self._plans: OrderedDict[tuple[int, int, int], dict[str, Any]] = OrderedDict()

    # -- the probe ---------------------------------------------------------------------------------------
    def start_probe(self) -> None:
        """Load (or, the first time on this machine, measure) the probe in a worker thread."""
        if self._probe is None:
            self._probe = asyncio.get_running_loop().create_task(self._load())

    async def ready(self) -> None:
        """Start the probe if need be and wait for it (it may fail: see ``error``)."""
        self.start_probe()
        assert self._probe is not None
        await asyncio.shield(self._probe)

    async def _load(self) -> None:
        try:
            self.hw = await asyncio.to_thread(self._locked_probe)
        except Exception as e:  # a probe that cannot run leaves the dashboard without ceilings, not broken
            logger.exception("hardware probe failed")
            self.error = f"{type(e).__name__}: {e}"

    def _locked_probe(self) -> HardwareSpec:
        with self._lock:
            return probe_local(self.device, self.dtype)

    @property
    def status(self) -> str:
        return "ready" if self.hw is not None else ("failed" if self.error else "probing")

    def roofline(self) -> dict[str, Any] | None:
        """The ceilings the step view draws against, None until the probe is loaded."""
        hw = self.hw
        if hw is None:
            return None
        return {
            "bandwidth_gbs": hw.bandwidth_gbs,
            "tflops": hw.peak_flops(self.dtype) / 1e12,
            "dtype": self.dtype,
            "weights": self.scheme.label,
            "source": hw.source,
        }

    def step_figures(self, flat: array[int], execute_s: float) -> tuple[float, float] | None:
        """(achieved GB/s, achieved TFLOP/s) of a step of rows (new tokens, context before)."""
        hw = self.hw
        if hw is None or execute_s <= 0:
            return None
        rows = list(zip(flat[0::2], flat[1::2], strict=True))
        cost = step_cost(self.facts, self.scheme, hw, self.ideal, rows, self.kv_bytes)
        return cost.bytes_moved / execute_s / 1e9, cost.flops / execute_s / 1e12

    # -- plan vs measured --------------------------------------------------------------------------------
    def predict(self, prompt_tokens: int, output_tokens: int, concurrency: int) -> dict[str, Any]:
        """``glassbox plan --hardware local`` for the served model and weights (cached; blocking: call it
        in a worker thread)."""
        key = (prompt_tokens, output_tokens, concurrency)
        with self._lock:
            if key in self._plans:
                self._plans.move_to_end(key)
                return self._plans[key]
            req = PlanRequest(
                model=self.model_path,
                hardware="local",
                quant=self.quant,
                prompt_tokens=prompt_tokens,
                output_tokens=output_tokens,
                concurrency=(1,) if concurrency <= 1 else (1, concurrency),
                kv_cache_dtype=self.kv_cache_dtype,
            )
            full = plan(req)
            out = {
                "ttft_s": full["ttft_s"],
                "e2e_s": full["e2e_s"],
                "prefill_tok_s": full["prefill"]["tok_s"],
                "prefill_ceiling_tok_s": full["prefill"]["ceiling_tok_s"],
                "prefill_bound": full["prefill"]["bound"],
                "decode_tok_s": full["decode"]["tok_s"],
                "decode_ceiling_tok_s": full["decode"]["ceiling_tok_s"],
                "decode_bound": full["decode"]["bound"],
                "tpot_s": full["decode"]["step_s"],
                "concurrency": full["concurrency"],
                "hardware": full["hardware"],
                "quant": full["quant"]["scheme"],
                "engine": full["engine"]["name"],
                "warnings": full["warnings"],
            }
            self._plans[key] = out
            while len(self._plans) > _PLAN_CACHE:
                self._plans.popitem(last=False)
            return out


def measured(metrics: list[dict[str, float | int]]) -> dict[str, Any]:
    """Medians of finished requests' figures, with the workload they describe (median prompt and output
    tokens) and TPOT = decode_s / (output_tokens - 1)."""
    out: dict[str, Any] = {"requests": len(metrics)}
    if not metrics:
        return out
    for key in MEASURED_KEYS:
        values = [
            float(m[key]) for m in metrics if key not in ("prefill_tok_s", "decode_tok_s") or m[key] > 0
        ]
        out[key] = percentile(values, 0.5) if values else None
    tpots = [
        float(m["decode_s"]) / (int(m["output_tokens"]) - 1) for m in metrics if int(m["output_tokens"]) > 1
    ]
    out["tpot_s"] = percentile(tpots, 0.5) if tpots else None
    out["prompt_tokens"] = round(percentile([float(m["prompt_tokens"]) for m in metrics], 0.5))
    out["output_tokens"] = round(percentile([float(m["output_tokens"]) for m in metrics], 0.5))
    return out
