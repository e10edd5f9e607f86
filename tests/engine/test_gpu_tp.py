"""Tensor parallelism on CUDA (skipped without a GPU; not yet run on one): TP=2 float32 greedy tokens and
logprobs equal to TP=1 on the same device, over NCCL where the machine has two GPUs, else over gloo with
both ranks on GPU 0 (``GLASSBOX_TP_BACKEND=gloo``: the device-side path, sharding, step broadcast and
Triton kernels on each rank's shard, without NCCL). Steps are eager under TP on CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_gpu import with_engine
from test_tensor_parallel import GREEDY
from tiny_models import build_tiny_model

from glassbox.engine import tp_runtime
from glassbox.llm import LLM

CUDA = torch.cuda.is_available()
PROMPTS = [[1, 5, 9, 20, 33], list(range(3, 60))]


@pytest.fixture(autouse=True)
def _leave_group() -> object:
    yield
    tp_runtime.shutdown()


def _tokens(llm: LLM) -> list:
    return [
        (o.token_ids, [o.logprobs[j][t] for j, t in enumerate(o.token_ids)])
        for o in llm.generate(PROMPTS, GREEDY)
    ]


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("arch", ["llama", "qwen3_moe"])
def test_tp2_on_cuda_matches_tp1(tmp_path: Path, arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.device_count() < 2:  # the workers are spawned with this environment
        monkeypatch.setenv("GLASSBOX_TP_BACKEND", "gloo")
    d = build_tiny_model(arch, tmp_path)
    kw = dict(dtype="float32", device="cuda", max_num_seqs=2, memory_utilization=0.2)
    ref = with_engine(d, _tokens, **kw)
    got = with_engine(d, _tokens, tensor_parallel_size=2, **kw)
    for (toks, lps), (ref_toks, ref_lps) in zip(got, ref, strict=True):
        assert toks == ref_toks
        assert max(abs(a - b) for a, b in zip(lps, ref_lps, strict=True)) < 1e-4
