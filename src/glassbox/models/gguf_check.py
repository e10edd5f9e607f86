"""A GGUF file's layout checked against its size before the gguf package reads it.

The gguf package's reader trusts every length in the file: a string, array, key/value or tensor count of
2**40 reads past the end (IndexError) or loops once per claimed element; ``n_dims`` 0xFFFFFFFF asks for
four billion dimensions. ``check_gguf_layout`` walks the header, the key/value pairs and the tensor table
with every read bounded by the bytes left: a count is compared with what that many entries need at the
least before anything is allocated or iterated, and each tensor's data must lie inside the file. Its cost
is one pass over the metadata (one unpack per string of the vocabulary). Every failure, here or later in
the gguf package, is a ``GGUFError`` naming the file and what is wrong.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

HEADER_BYTES = 24  # magic, version (u32), tensor count (u64), key/value count (u64)
SUPPORTED_VERSIONS = (2, 3)
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_ARRAY_NESTING = 8
DEFAULT_ALIGNMENT = 32
# GGUFValueType: scalar sizes in bytes; 8 = string (u64 length + bytes), 9 = array (u32 type, u64 count)
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_MIN_VALUE_BYTES = {**_SCALAR_BYTES, _STRING: 8, _ARRAY: 12}
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset


class GGUFError(ValueError):
    """A GGUF file glassbox cannot read; the message names the file and the fault (``malformed``: the file
    breaks the format, else it is well formed but unsupported)."""

    def __init__(self, path: str | Path, what: str, malformed: bool = True) -> None:
        super().__init__(f"{path}: {'not a valid GGUF file: ' if malformed else ''}{what}")
        self.path = Path(path)
        self.what = what


@contextlib.contextmanager
def gguf_errors(path: str | Path) -> Iterator[None]:
    """Any failure while reading ``path``'s metadata or building from it, as one GGUFError: the gguf
    package's and numpy's own exceptions (IndexError, KeyError, struct and type errors) name the fault,
    and a ValueError of ours (an unsupported architecture) gains the file's name."""
    try:
        yield
    except GGUFError:
        raise
    except KeyError as e:
        raise GGUFError(path, f"a metadata key or tensor it needs is missing: {e}") from None
    except (IndexError, TypeError, OverflowError, AttributeError, struct.error, UnicodeError) as e:
        raise GGUFError(path, f"{type(e).__name__}: {e}") from None  # (UnicodeError is a ValueError)
    except ValueError as e:
        raise GGUFError(path, str(e), malformed=False) from None


class _Cursor:
    """Reads from a buffer, every read bounded by its end."""

    def __init__(self, data: mmap.mmap | bytes, order: str) -> None:
        self.data = data
        self.size = len(data)
        self.pos = 0
        self.order = order

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise ValueError(
                f"{what} needs {n} bytes at offset {self.pos}, but the file ends {self.left()} bytes later"
            )

    def unpack(self, fmt: str, what: str) -> int:
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(self.order + fmt, self.data, self.pos)
        self.pos += n
        return int(value)

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def string(self, what: str) -> bytes:
        n = self.unpack("Q", f"the length of {what}")
        self.need(n, f"{what} ({n} bytes)")
        raw = bytes(self.data[self.pos : self.pos + n])
        self.pos += n
        return raw


def _short(raw: bytes, limit: int = 64) -> str:
    text = raw[:limit].decode("utf-8", errors="replace")
    return repr(text + ("..." if len(raw) > limit else ""))


def _value(c: _Cursor, kind: int, what: str, depth: int = 0) -> int | None:
    """Skip one value of type ``kind``; return it when it is a u32 (general.alignment's type)."""
    if kind in _SCALAR_BYTES:
        if kind == 4:
            return c.unpack("I", what)
        c.skip(_SCALAR_BYTES[kind], what)
        return None
    if kind == _STRING:
        c.skip(c.unpack("Q", f"the length of {what}"), f"{what} (a string)")
        return None
    if kind != _ARRAY:
        raise ValueError(f"{what} has value type {kind}, which GGUF does not define (0-12)")
    if depth >= MAX_ARRAY_NESTING:
        raise ValueError(f"{what} nests arrays more than {MAX_ARRAY_NESTING} deep")
    element = c.unpack("I", f"the element type of {what}")
    count = c.unpack("Q", f"the length of {what}")
    if element not in _MIN_VALUE_BYTES:
        raise ValueError(f"{what} is an array of value type {element}, which GGUF does not define (0-12)")
    if count * _MIN_VALUE_BYTES[element] > c.left():
        raise ValueError(
            f"{what} claims {count} elements, more than the {c.left()} bytes left in the file can hold"
        )
    if element in _SCALAR_BYTES:
        c.skip(count * _SCALAR_BYTES[element], what)
    elif element == _STRING:  # a vocabulary: one length per string, no call per element
        for i in range(count):
            c.skip(c.unpack("Q", f"the length of {what}[{i}]"), f"{what}[{i}] (a string)")
    else:
        for i in range(count):
            _value(c, element, f"{what}[{i}]", depth + 1)
    return None


def _tensor(c: _Cursor, index: int) -> tuple[str, int, int]:
    """(name, offset, bytes) of one tensor-table entry."""
    name = c.string(f"the name of tensor {index}")
    label = f"tensor {_short(name)}"
    n_dims = c.unpack("I", f"the dimension count of {label}")
    if n_dims > MAX_DIMS:
        raise ValueError(f"{label} has {n_dims} dimensions; GGUF allows at most {MAX_DIMS}")
    dims = [c.unpack("Q", f"the dimensions of {label}") for _ in range(n_dims)]
    kind = c.unpack("I", f"the type of {label}")
    offset = c.unpack("Q", f"the data offset of {label}")
    try:
        qtype = GGMLQuantizationType(kind)
        block, block_bytes = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ValueError(f"{label} has tensor type {kind}, which ggml does not define") from None
    elements = 1
    for d in dims:
        elements *= d
    if dims and dims[0] % block:
        raise ValueError(
            f"{label} has {dims[0]} values per row, not a multiple of {qtype.name}'s block of {block}"
        )
    return name.decode("utf-8", errors="replace"), offset, elements // block * block_bytes


def _check(c: _Cursor) -> None:
    tensors = c.unpack("Q", "the tensor count")
    kvs = c.unpack("Q", "the key/value count")
    if kvs * _MIN_KV_BYTES > c.left():
        raise ValueError(
            f"the header claims {kvs} key/value pairs, more than the file's {c.size} bytes can hold"
        )
    if tensors * _MIN_TENSOR_BYTES > c.left():
        raise ValueError(f"the header claims {tensors} tensors, more than the file's {c.size} bytes can hold")
    alignment = DEFAULT_ALIGNMENT
    for i in range(kvs):
        key = c.string(f"key {i}")
        kind = c.unpack("I", f"the value type of key {_short(key)}")
        value = _value(c, kind, f"key {_short(key)}")
        if key == b"general.alignment":
            if value is None or value == 0 or value & (value - 1):
                raise ValueError(f"general.alignment must be a u32 power of two, got {value} (type {kind})")
            alignment = value
    entries = [_tensor(c, i) for i in range(tensors)]
    data_start = -(-c.pos // alignment) * alignment
    for name, offset, nbytes in entries:
        if data_start + offset + nbytes > c.size:
            raise ValueError(
                f"the data of tensor {name!r} (bytes {data_start + offset} to {data_start + offset + nbytes}) lies "
                f"past the end of the file ({c.size} bytes)"
            )


def check_gguf_layout(path: str | Path) -> None:
    """Raise GGUFError unless every length, count and offset in ``path``'s header, metadata and tensor
    table fits inside the file."""
    p = Path(path)
    try:
        size = p.stat().st_size
    except OSError as e:
        raise GGUFError(p, f"cannot be read: {e.strerror}") from None
    if size < HEADER_BYTES:
        raise GGUFError(p, f"the file has {size} bytes, fewer than GGUF's {HEADER_BYTES}-byte header")
    with p.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise GGUFError(
                p, f"it does not start with the magic b'GGUF' (it starts with {bytes(data[:4])!r})"
            )
        (version,) = struct.unpack_from("<I", data, 4)
        order = "<" if version & 0xFFFF else ">"  # a big-endian file, as the gguf package detects one
        (version,) = struct.unpack_from(order + "I", data, 4)
        if version not in SUPPORTED_VERSIONS:
            raise GGUFError(p, f"version {version} is not one the reader supports (2 or 3)")
        cursor = _Cursor(data, order)
        cursor.pos = 8
        try:
            _check(cursor)
        except ValueError as e:
            raise GGUFError(p, str(e)) from None
