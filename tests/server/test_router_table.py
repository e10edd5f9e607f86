"""The multi-model server's table, without starting it (server/router_serve.py): what --models-dir finds, and
the engine flags each model's process gets, read back by `glassbox serve`'s own parser."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from gguf import GGMLQuantizationType as Q
from gguf_factory import Spec, write_model

from glassbox.cli import build_parser
from glassbox.engine_args import config_from_args
from glassbox.models.sources import DEMO_MODEL_DIR
from glassbox.server.router_serve import engine_argv, models_in_dir


def test_models_dir_finds_directories_and_gguf_checkpoints(tmp_path: Path) -> None:
    shutil.copytree(DEMO_MODEL_DIR, tmp_path / "demo-copy")
    write_model(tmp_path / "tiny-Q8_0.gguf", Spec(qtype=Q.Q8_0))
    write_model(tmp_path / "split.gguf", Spec(qtype=Q.Q8_0), split_max_tensors=8)  # split-0000N-of-0000M
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "empty").mkdir()
    found = {m.name: m for m in models_in_dir(tmp_path)}
    assert set(found) == {"demo-copy", "tiny-Q8_0", "split"}, sorted(found)
    shards = sorted(p.name for p in tmp_path.glob("split-*.gguf"))
    assert len(shards) > 1 and found["split"].path.name == shards[0]
    assert [f.name for f in found["split"].files] == shards
    assert found["demo-copy"].format == "hf" and found["tiny-Q8_0"].format == "gguf"


def _parse(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(["serve", *argv])


def test_each_model_gets_the_flags_serve_was_given() -> None:
    given = ["--models", "a,b", "--dtype", "float32", "--max-num-seqs", "4", "--max-model-len", "512",
             "--no-enable-prefix-caching", "--enforce-eager", "--kv-cache-dtype", "int8",
             "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
             "--max-queue-len", "3", "--shutdown-timeout", "2"]  # fmt: skip
    args = _parse(given)
    child = _parse(["model-dir", *engine_argv(args)])  # as the child's `glassbox serve` reads them
    expected = config_from_args(args)
    got = config_from_args(child)
    expected.model = got.model = None
    assert got == expected
    for flag in (
        "enable_auto_tool_choice",
        "tool_call_parser",
        "reasoning_parser",
        "max_queue_len",
        "shutdown_timeout",
    ):
        assert getattr(child, flag) == getattr(args, flag), flag
    assert engine_argv(_parse(["--models", "a"])) == []  # defaults are not repeated
