"""The CUDA sizing reckoned with no GPU: unified-memory detection, the KV budget on a discrete GPU and on
a DGX Spark's shared RAM, and the message when CUDA runs without triton."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest
import torch

from glassbox.engine.device import DeviceMemory, is_unified_memory, kv_budget, triton_usable
from glassbox.engine.kv_plan import GiB


def test_integrated_gpus_and_the_spark_are_unified_memory() -> None:
    assert is_unified_memory(SimpleNamespace(is_integrated=True, major=8, minor=7))  # a Jetson Orin
    assert is_unified_memory(SimpleNamespace(is_integrated=False, major=12, minor=1))  # GB10
    assert not is_unified_memory(SimpleNamespace(is_integrated=False, major=9, minor=0))  # H100
    assert not is_unified_memory(SimpleNamespace(major=12, minor=0))  # a discrete Blackwell, older torch


def test_discrete_budget_is_utilization_of_the_device_less_what_is_held() -> None:
    mem = DeviceMemory(total=80 * GiB, free=60 * GiB, reserved=18 * GiB, allocated=16 * GiB, unified=False)
    budget, how = kv_budget(mem, 0.9, peak=2 * GiB, reserve=GiB // 4)
    others = 80 - 60 - 18  # GiB held by other processes and the context
    assert budget == int(80 * GiB * 0.9) - 16 * GiB - 2 * GiB - others * GiB - GiB // 4
    assert "other processes 2.00 GiB" in how


def test_unified_budget_comes_from_mem_available() -> None:
    """128 GiB of RAM, 100 available after the weights: mem_get_info's figures are not used."""
    mem = DeviceMemory(
        total=128 * GiB,
        free=40 * GiB,
        reserved=16 * GiB,
        allocated=16 * GiB,
        unified=True,
        mem_available=100 * GiB,
    )
    budget, how = kv_budget(mem, 0.9, peak=2 * GiB, reserve=0)
    assert budget == int(100 * GiB * 0.9) - 2 * GiB
    assert "MemAvailable 100.0 GiB" in how and "unified memory" in how


def test_cuda_without_triton_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    with caplog.at_level(logging.WARNING, logger="glassbox.engine.device"):
        assert not triton_usable(torch.device("cuda"))
    assert "triton is not installed" in caplog.text and "without CUDA graphs" in caplog.text
    assert not triton_usable(torch.device("cpu"))
