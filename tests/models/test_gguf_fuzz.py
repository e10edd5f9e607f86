"""Malformed GGUF files (issue 40, item 2): a corpus of mutations of one small valid file, built here, each
read by the reader (one GGUFError naming the file, nothing else raised, no hang, no memory beyond what the
valid file costs) and by the CLI (one line on stderr, no traceback).

Fields are found in the valid file by their bytes (the key and tensor names, GGUF's fixed header), not by
glassbox's own parser.
"""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
from gguf_factory import Spec, write_model

from glassbox.models.gguf_check import GGUFError
from glassbox.models.gguf_reader import open_gguf
from glassbox.tokenizer.gguf_tokenizer import tokenizer_from_gguf_path

TOKENS_KEY = b"tokenizer.ggml.tokens"
TENSOR = b"token_embd.weight"
# A read of the valid tiny file takes ~50 ms here; a malformed one may take at most this long. A hang (one
# iteration per claimed element: 2**40) would take hours, so the bound separates the two on any machine.
SECONDS_PER_FILE = 10.0
RANDOM_MUTATIONS = 150


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = tmp_path_factory.mktemp("gguf-fuzz") / "valid.gguf"
    write_model(path, Spec(vocab=64, hidden=32, ffn=64, layers=1))
    return path.read_bytes()


def _put(data: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into("<" + fmt, out, offset, value)
    return bytes(out)


def _tensor_fields(data: bytes) -> tuple[int, int, int]:
    """Offsets of TENSOR's name length, its n_dims and its type (its single u64 dims follow n_dims)."""
    name = data.index(TENSOR, data.index(TOKENS_KEY) + len(TOKENS_KEY))  # in the tensor table
    n_dims = name + len(TENSOR)
    (dims,) = struct.unpack_from("<I", data, n_dims)
    return name - 8, n_dims, n_dims + 4 + 8 * dims


def corpus(data: bytes) -> dict[str, bytes]:
    """Named mutations of ``data``: the nine of the issue, then more truncations, lengths and types."""
    tokens = data.index(TOKENS_KEY)
    array = tokens + len(TOKENS_KEY)  # u32 value type (9), u32 element type, u64 count
    name_len, n_dims, ttype = _tensor_fields(data)
    cases = {
        "magic only": data[:4],
        "cut at 64 bytes": data[:64],
        "cut in the tensor data": data[: len(data) - 7],
        "first key's length 2**40": _put(data, 24, "Q", 2**40),
        "first key's length 2**62": _put(data, 24, "Q", 2**62),
        "vocabulary array length 2**40": _put(data, array + 8, "Q", 2**40),
        "key/value count 2**62": _put(data, 16, "Q", 2**62),
        "tensor count 2**40": _put(data, 8, "Q", 2**40),
        "n_dims 0xFFFFFFFF": _put(data, n_dims, "I", 0xFFFFFFFF),
        # beyond the nine
        "empty file": b"",
        "header only": data[:24],
        "cut in the vocabulary": data[: tokens + 200],
        "cut in the tensor table": data[: name_len + 12],
        "first token's length 2**40": _put(data, array + 16, "Q", 2**40),
        "tensor name length 2**40": _put(data, name_len, "Q", 2**40),
        "dimension 2**40": _put(data, n_dims + 4, "Q", 2**40),
        "tensor type 99": _put(data, ttype, "I", 99),
        "tensor offset 2**60": _put(data, ttype + 4, "Q", 2**60),
        "value type 13": _put(data, array, "I", 13),
        "array element type 0xFFFFFFFF": _put(data, array + 4, "I", 0xFFFFFFFF),
        "version 1": _put(data, 4, "I", 1),
        "version 99": _put(data, 4, "I", 99),
        "wrong magic": b"GGUX" + data[4:],
        "key/value count 0": _put(data, 16, "Q", 0),  # no architecture, no vocabulary
        "tensor count 0": _put(data, 8, "Q", 0),
    }
    rng = random.Random(40)
    head = data.index(TENSOR, array) + 64  # the header, metadata and tensor table
    for i in range(RANDOM_MUTATIONS):
        out = bytearray(data)
        at = rng.randrange(8, head - 8)
        if i % 2:
            struct.pack_into("<Q", out, at, rng.choice([2**32 - 1, 2**40, 2**63 - 1, rng.getrandbits(64)]))
        else:
            out[at] = rng.randrange(256)
        cases[f"random mutation {i} at {at}"] = bytes(out)
    return cases


def _read(path: Path) -> None:
    open_gguf(path)
    tokenizer_from_gguf_path(path)


def _peak_bytes(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
    except GGUFError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def test_every_malformed_file_is_one_gguf_error(valid: bytes, tmp_path: Path) -> None:
    """Each mutation: GGUFError (naming the file) or a clean read; never another exception, never slow,
    never more memory than reading the valid file (x2: the reader's objects vary a little with the layout)."""
    good = tmp_path / "good.gguf"
    good.write_bytes(valid)
    budget = 2 * _peak_bytes(lambda: _read(good)) + (1 << 20)
    failures, errors = [], 0
    for name, data in corpus(valid).items():
        path = tmp_path / "case.gguf"
        path.write_bytes(data)
        t0 = time.perf_counter()
        try:
            peak = _peak_bytes(lambda p=path: _read(p))  # type: ignore[misc]
        except Exception as e:  # noqa: BLE001 - the point: anything but GGUFError is a failure
            failures.append(f"{name}: {type(e).__name__}: {e}")
            continue
        elapsed = time.perf_counter() - t0
        if elapsed > SECONDS_PER_FILE or peak > budget:
            failures.append(f"{name}: {elapsed:.1f} s, {peak} bytes (budget {budget})")
        try:
            _read(path)
        except GGUFError as e:
            errors += 1
            if str(path) not in str(e) or "\n" in str(e):
                failures.append(f"{name}: the message does not name the file on one line: {e}")
    assert not failures, "\n".join(failures)
    assert errors >= 25  # the named cases (two may read cleanly: no tensors, or no metadata fails later)


@pytest.mark.parametrize(
    ("command", "case"),
    [
        ("generate", "magic only"),
        ("generate", "n_dims 0xFFFFFFFF"),
        ("serve", "vocabulary array length 2**40"),
    ],
)
def test_cli_prints_one_line_for_a_malformed_file(
    valid: bytes, tmp_path: Path, command: str, case: str
) -> None:
    path = tmp_path / "bad.gguf"
    path.write_bytes(corpus(valid)[case])
    args = ["--model", str(path), "hi"] if command == "generate" else [str(path), "--port", "0"]
    proc = subprocess.run(
        [sys.executable, "-m", "glassbox.cli", command, *args, "--device", "cpu"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"glassbox {command}: error: {path}: not a valid GGUF file: "), lines[0]
