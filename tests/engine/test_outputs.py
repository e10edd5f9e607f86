"""RequestOutput's cumulative lists: each step's output holds that step's tokens however late it is read,
while the engine copies no token list per step."""

from __future__ import annotations

from pathlib import Path

from tiny_models import build_tiny_model

from glassbox import LLM, SamplingParams
from glassbox.outputs import CompletionOutput


def test_a_snapshot_keeps_its_step() -> None:
    tokens, logprobs = [7, 8, 9, 100], [{100: -0.5}]
    out = CompletionOutput.snapshot(0, "x", tokens, 3, logprobs, None, None)
    tokens.append(101)
    logprobs.append({101: -1.0})
    assert out.num_tokens == 1
    assert out.token_ids == [100] and out.logprobs == [{100: -0.5}]
    assert out == CompletionOutput(0, "x", [100], [{100: -0.5}])
    assert "token_ids=[100]" in repr(out)


def test_every_step_output_is_its_prefix_read_after_the_end(tmp_path: Path) -> None:
    llm = LLM(str(build_tiny_model("llama", tmp_path)), dtype="float32", num_kv_blocks=16)
    eng = llm.engine
    eng.add_request(
        "r", [5, 6, 7, 8], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=1)
    )
    steps = []
    while eng.has_work:
        steps += [o for o in eng.step() if o.request_id == "r"]
    final = steps[-1].outputs[0]
    assert final.finished and final.num_tokens == 6 and final.logprobs is not None
    for o in steps:
        c = o.outputs[0]
        n = c.num_tokens
        assert c.token_ids == final.token_ids[:n] and c.logprobs == final.logprobs[:n]
    assert [o.outputs[0].num_tokens for o in steps] == list(range(1, 7))
