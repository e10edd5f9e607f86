"""Read a GGUF checkpoint (llama.cpp / Ollama): an HF-style config, and the weights under HF names, dequantized.

``open_gguf(path)`` parses the metadata and tensor tables of every shard (no tensor data is read), builds the
config (see :mod:`glassbox.models.gguf_config`) and maps each tensor name to its Hugging Face parameter name.
``GGUFCheckpoint.tensors()`` then dequantizes one tensor at a time to float32, in the Hugging Face shape and
row order (llama.cpp stores the Q/K projections of llama-family models with the rotary pairs interleaved;
they are put back in the half-split order transformers uses; Gemma's (1 + w) norm weights, stored with the 1
added, get it taken off again). Names: models/gguf_names.py (a MoE layer's experts are 3-D, stacked per
projection); ``stored_tensors`` hands out the packable tensors' raw blocks (engine/checkpoint.py).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderField, ReaderTensor
from gguf.quants import dequantize

from glassbox.models.fused_parts import fused_rows, split_rows
from glassbox.models.gguf_check import check_gguf_layout, gguf_errors
from glassbox.models.gguf_config import (
    NORM_OFFSETS,
    PERMUTED_QK_ARCHITECTURES,
    build_config,
    file_dtype,
    hf_architecture,
)
from glassbox.models.gguf_gemma4 import gemma4_config
from glassbox.models.gguf_hybrid import as_hf_values, linear_row_order, mtp_layer
from glassbox.models.gguf_names import hf_tensor_name
from glassbox.models.gguf_nemotron_h import NEMOTRON_H_ARCHITECTURES, nemotron_h_config, nemotron_h_values

logger = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
# llama.cpp's gguf-split naming: <stem>-00001-of-00003.gguf (1-based, five digits).
_SHARD_NAME = re.compile(r"^(?P<stem>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)


def is_gguf(path: str | Path) -> bool:
    """Whether ``path`` names a GGUF file: a name ending in .gguf, or a file starting with the GGUF magic."""
    p = Path(path)
    if p.name.lower().endswith(".gguf"):
        return True
    if not p.is_file():
        return False
    with p.open("rb") as f:
        return f.read(4) == GGUF_MAGIC


def gguf_shard_paths(path: str | Path) -> list[Path]:
    """All files of the checkpoint ``path`` belongs to, in order.

    ``path`` may be a single .gguf file, any shard of a split (``name-00002-of-00003.gguf``), or a directory
    holding exactly one checkpoint. Raises FileNotFoundError when the file or a shard is missing.
    """
    p = Path(path)
    if p.is_dir():
        firsts = {
            _first_shard_name(q) for q in p.iterdir() if q.is_file() and q.name.lower().endswith(".gguf")
        }
        if len(firsts) != 1:
            found = ", ".join(sorted(firsts)) or "none"
            raise ValueError(f"directory {p} must hold exactly one GGUF checkpoint; found: {found}")
        p = p / firsts.pop()
    match = _SHARD_NAME.match(p.name)
    if match is None:
        if not p.is_file():
            raise FileNotFoundError(f"GGUF file not found: {p}")
        return [p]
    count, index = int(match["count"]), int(match["index"])
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"{p.name}: shard number {index} is outside 1..{count}")
    shards = [p.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise FileNotFoundError(
            f"GGUF checkpoint {shards[0].name} is split into {count} shards; missing in {p.parent}: "
            + ", ".join(missing)
        )
    return shards


def _first_shard_name(p: Path) -> str:
    match = _SHARD_NAME.match(p.name)
    return f"{match['stem']}-00001-of-{match['count']}.gguf" if match else p.name


# ---- metadata ----


def _scalar(value: Any, kind: GGUFValueType) -> Any:
    if kind == GGUFValueType.BOOL:
        return bool(value)
    if kind == GGUFValueType.FLOAT32:
        # The shortest decimal that rounds to this float32: 1e-05, not 9.999999747378752e-06.
        return float(str(np.float32(value)))
    if kind == GGUFValueType.FLOAT64:
        return float(value)
    return int(value)


def field_value(f: ReaderField) -> Any:
    """The Python value of one GGUF metadata field (str, int, float, bool, or a list of those)."""
    kind = f.types[0]
    if kind == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
    if kind != GGUFValueType.ARRAY:
        return _scalar(f.parts[f.data[0]][0], kind)
    if len(f.types) != 2:  # arrays of arrays: nothing we read uses them
        return None
    element = f.types[1]
    if element == GGUFValueType.STRING:
        return [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
    if not f.data:
        return []
    values = np.concatenate([f.parts[i] for i in f.data])
    if element == GGUFValueType.BOOL:
        return [bool(v) for v in values]
    return values.tolist()


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """Every metadata key of a GGUF file with its Python value (the GGUF.* header fields left out)."""
    return {k: field_value(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")}


# ---- tensors ----


@functools.cache
def _can_dequantize(qtype: GGMLQuantizationType) -> bool:
    """Whether the gguf package can dequantize ``qtype`` (probed once with one all-zero block)."""
    if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return True
    sizes = GGML_QUANT_SIZES.get(qtype)
    if sizes is None:
        return False
    try:
        dequantize(np.zeros((1, sizes[1]), dtype=np.uint8), qtype)
    except (NotImplementedError, ValueError, TypeError):
        return False
    return True


def supported_tensor_types() -> list[str]:
    """Names of the GGML tensor types this reader can dequantize (as the installed gguf package allows)."""
    return [t.name for t in GGMLQuantizationType if _can_dequantize(t)]


def hf_shape(t: ReaderTensor) -> tuple[int, ...]:
    """A tensor's shape in PyTorch order (GGUF lists the fastest-moving dimension first)."""
    return tuple(int(d) for d in reversed(t.shape.tolist()))


def unpermute_rotary_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order for llama-family models.

    Per head, llama.cpp stores the rotary pairs interleaved (rows x0,y0,x1,y1,...); transformers keeps the two
    halves apart (x0,x1,...,y0,y1,...). Works on weights (rows, cols) and on biases (rows,).
    """
    rows = w.shape[0]
    if rows % (2 * heads):
        raise ValueError(
            f"cannot undo the rotary row order: {rows} rows is not a multiple of 2 x {heads} heads"
        )
    half = rows // heads // 2
    return w.reshape(heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantize_tensor(t: ReaderTensor) -> np.ndarray:
    """A GGUF tensor as a new float32 array in PyTorch shape (raises ValueError for an unsupported type)."""
    if not _can_dequantize(t.tensor_type):
        raise ValueError(
            f"GGUF tensor {t.name!r} has type {t.tensor_type.name}, which cannot be dequantized; "
            f"supported types: {', '.join(supported_tensor_types())}"
        )
    values = dequantize(t.data, t.tensor_type)
    if t.tensor_type == GGMLQuantizationType.F32:  # a view of the memory-mapped file: copy it out
        return np.array(values, dtype=np.float32).reshape(hf_shape(t))
    return np.asarray(values, dtype=np.float32).reshape(hf_shape(t))


@dataclass
class GGUFCheckpoint:
    """A GGUF checkpoint: its shard files, HF config, tensor types and (lazily) its dequantized tensors."""

    paths: list[Path]  # all shards, in order
    config: dict[str, Any]  # an HF config.json-equivalent dict
    tensor_types: dict[str, str]  # HF parameter name -> GGML type name ("Q4_1", "F32", ...)
    metadata: dict[str, Any] = field(default_factory=dict, repr=False)  # first shard's key/values
    _readers: list[GGUFReader] = field(default_factory=list, repr=False)
    _names: dict[str, str] = field(default_factory=dict, repr=False)  # GGUF tensor name -> HF name

    @property
    def architecture(self) -> str:
        """The GGUF ``general.architecture`` ("llama", "qwen2", ...)."""
        return str(self.metadata["general.architecture"])

    def tensors(self, skip: set[str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
        """(HF name, float32 array in HF shape) for every weight (but those named in ``skip``), dequantized
        one at a time, in file order."""
        for reader in self._readers:
            for t in reader.tensors:
                name = self._names.get(t.name)
                if name is None or (skip is not None and skip.issuperset(self._parts(name))):
                    continue
                values = self._hf_row_order(t.name, dequantize_tensor(t))
                for part, rows in split_rows(name, values, len(values), self.config):
                    if skip is None or part not in skip:
                        yield part, self.as_hf(part, rows)

    def as_hf(self, name: str, values: np.ndarray) -> np.ndarray:
        """A dequantized tensor (or a tensor-parallel shard of it) as Hugging Face holds it: Gemma's norm
        weights without llama.cpp's + 1, a shared expert's gate (H,) as (1, H)."""
        norm_offset = NORM_OFFSETS.get(self.architecture, 0.0)
        if norm_offset and name.endswith("norm.weight"):
            values -= np.float32(norm_offset)  # float32, as the file stores it
        if name.endswith("shared_expert_gate.weight") and values.ndim == 1:
            values = values.reshape(1, -1)  # llama.cpp reads it as a vector; Hugging Face (1, H)
        if self.architecture in NEMOTRON_H_ARCHITECTURES:  # models/gguf_nemotron_h.py
            return nemotron_h_values(name, values)
        return as_hf_values(self.architecture, name, values)  # a hybrid's transforms (models/gguf_hybrid.py)

    def stored_tensors(
        self, types: set[str], ndim: int = 2
    ) -> Iterator[tuple[str, str, np.ndarray, tuple[int, ...]]]:
        """(HF name, GGML type, raw block bytes (rows, row bytes), HF shape) of the ``ndim``-D tensors whose
        type is in ``types``, as stored (no dequantization), rows in the Hugging Face order (Q/K un-permuted);
        3-D tensors (a layer's stacked experts) as (E, rows, row bytes)."""
        for reader in self._readers:
            for t in reader.tensors:
                name = self._names.get(t.name)
                if name is None or t.tensor_type.name not in types or len(t.shape) != ndim:
                    continue
                raw, shape = self._hf_row_order(t.name, np.asarray(t.data)), hf_shape(t)
                for part, rows in split_rows(name, raw, shape[0], self.config):
                    yield part, t.tensor_type.name, rows, (len(rows), *shape[1:])

    def _parts(self, name: str) -> list[str]:
        """The parameters the tensor ``name`` fills: itself, or a fused tensor's parts."""
        parts = fused_rows(name, self.config)
        return [name] if parts is None else [p for p, _, _ in parts]

    def _hf_row_order(self, gguf_name: str, rows: np.ndarray) -> np.ndarray:
        """The rows of tensor ``gguf_name`` (values or raw blocks) in the Hugging Face order: llama.cpp stores
        the Q and K projections of llama/mistral with their rotary rows permuted."""
        heads = self.permuted_heads(gguf_name)
        rows = linear_row_order(self.architecture, gguf_name, rows, self.config)  # Qwen3-Next's ssm_ba
        return rows if heads is None else unpermute_rotary_rows(rows, heads)

    def permuted_heads(self, gguf_name: str) -> int | None:
        """The heads of a tensor stored with each head's rotary rows permuted (llama/mistral Q and K), or
        None: the rows are in the Hugging Face order (the permutation stays within a head)."""
        part = gguf_name.split(".")[2] if gguf_name.startswith("blk.") else ""
        key = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}.get(part)
        if key is None or self.architecture not in PERMUTED_QK_ARCHITECTURES:
            return None
        return int(self.config[key])

    def entries(self) -> Iterator[tuple[str, ReaderTensor]]:
        """(HF name, the file's tensor: GGML type, shape, memory-mapped data) of every weight, in file order
        (tensor parallelism reads each rank's slices of them: models/gguf_shards.py)."""
        for reader in self._readers:
            for t in reader.tensors:
                name = self._names.get(t.name)
                if name is not None:
                    yield name, t

    def stored_sizes(self) -> dict[str, tuple[int, int]]:
        """HF name -> (elements, bytes as stored in the file): what the planner costs a GGUF by."""
        sizes = {}
        for reader in self._readers:
            for t in reader.tensors:
                name = self._names.get(t.name)
                if name is None:
                    continue
                rows = hf_shape(t)[0]
                for part, a, b in fused_rows(name, self.config) or [(name, 0, rows)]:
                    share = (b - a) / rows
                    sizes[part] = (round(int(t.n_elements) * share), round(int(t.n_bytes) * share))
        return sizes

    def state_dict(self) -> dict[str, np.ndarray]:
        """All tensors at once (convenient for small models and tests)."""
        return dict(self.tensors())


def open_gguf(path: str | Path) -> GGUFCheckpoint:
    """Open a GGUF checkpoint (a file, any shard of a split, or a directory holding one).

    Reads metadata from the first shard and the tensor tables of all shards; no tensor data is read yet.
    Raises GGUFError (a ValueError naming the file) for a malformed file, an unsupported architecture or
    tensor type, or an unknown tensor, and FileNotFoundError for a missing file or shard.
    """
    paths = gguf_shard_paths(path)
    with gguf_errors(paths[0]):
        return _open(paths)


def read_gguf(path: Path) -> GGUFReader:
    """The gguf package's reader of one file, once its layout is checked (``check_gguf_layout``);
    GGUFError for a file it cannot read."""
    check_gguf_layout(path)
    with gguf_errors(path):
        return GGUFReader(path)


def _open(paths: list[Path]) -> GGUFCheckpoint:
    readers = [read_gguf(p) for p in paths]
    metadata = read_metadata(readers[0])
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ValueError(f"{paths[0]} has no general.architecture; is it a GGUF model file?")
    hf_architecture(arch, metadata)  # raises ValueError naming an unsupported architecture early
    _check_split(paths, readers, metadata)

    names: dict[str, str] = {}
    types: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    rope_freqs: np.ndarray | None = None
    rope_factors: dict[str, np.ndarray] = {}  # Phi-3's LongRoPE lists
    for p, reader in zip(paths, readers, strict=True):
        for t in reader.tensors:
            if t.name in shapes:
                raise ValueError(f"GGUF tensor {t.name!r} appears twice (second time in {p.name})")
            shapes[t.name] = hf_shape(t)
            if mtp_layer(arch, t.name, metadata):  # a hybrid's multi-token-prediction block: not read
                continue
            hf = hf_tensor_name(t.name, arch)
            if t.name == "rope_freqs.weight":
                rope_freqs = dequantize_tensor(t)
            if t.name in ("rope_factors_long.weight", "rope_factors_short.weight"):
                rope_factors[t.name.split("_")[2].split(".")[0]] = dequantize_tensor(t)
            if hf is None:
                logger.debug("ignoring redundant GGUF tensor %s", t.name)
                continue
            if not _can_dequantize(t.tensor_type):
                raise ValueError(
                    f"GGUF tensor {t.name!r} ({hf}) has type {t.tensor_type.name}, which this reader cannot "
                    f"dequantize; supported types: {', '.join(supported_tensor_types())}"
                )
            names[t.name] = hf
            types[hf] = t.tensor_type.name
    if arch == "gemma4":  # per-layer shapes of its own (models/gguf_gemma4.py)
        config = gemma4_config(metadata, shapes, rope_freqs, file_dtype(list(types.values())))
    elif arch in NEMOTRON_H_ARCHITECTURES:  # per-layer block kinds of its own (models/gguf_nemotron_h.py)
        config = nemotron_h_config(arch, metadata, shapes, file_dtype(list(types.values())))
    else:
        config = build_config(metadata, shapes, list(types.values()), rope_freqs, rope_factors)
    for hf in list(types):  # a fused tensor's type is each of its parts'
        parts = fused_rows(hf, config)
        if parts:
            kind = types.pop(hf)
            types.update((part, kind) for part, _, _ in parts)
    return GGUFCheckpoint(
        paths=paths, config=config, tensor_types=types, metadata=metadata, _readers=readers, _names=names
    )


def _check_split(paths: list[Path], readers: list[GGUFReader], metadata: dict[str, Any]) -> None:
    """The split.* metadata (when present) must agree with the shard files found."""
    count = metadata.get("split.count")
    if count is not None and int(count) != len(paths):
        raise ValueError(f"{paths[0].name} says it is split into {count} shards but {len(paths)} were found")
    for i, (p, reader) in enumerate(zip(paths, readers, strict=True)):
        f = reader.fields.get("split.no")
        if f is not None and int(field_value(f)) != i:
            raise ValueError(
                f"{p.name} is shard {int(field_value(f)) + 1} by its metadata, not shard {i + 1}"
            )
