"""A streaming GGUF header reader: key/values and the tensor table, never tensor data.

gguf-py's `GGUFReader` builds Python objects for every token of a vocabulary, which takes
seconds per file. This reader walks the same bytes but treats string arrays as one region:
it locates every element with a vectorised pass and verifies the result exactly, falling back
to a plain loop when the fast path cannot prove itself. Tokens stay as raw bytes until asked for.

Every length read from the file is checked against the file size before anything is
allocated from it, and every problem raises `GGUFFormatError` with a one-line reason.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np
from gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
    Keys,
)

from specreg.errors import GGUFError

SUPPORTED_VERSIONS = (2, 3)
_MAGIC_BYTES = struct.pack("<I", GGUF_MAGIC)  # b"GGUF"
_FIRST_READ = 16 << 20  # most real headers (tokens, merges, tensor table) fit; else we grow
_MAX_DIMS = 4  # GGML_MAX_DIMS

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")

# Scalar value types: numpy dtype and struct format, straight from the GGUF spec.
_SCALAR: dict[GGUFValueType, tuple[str, struct.Struct]] = {
    GGUFValueType.UINT8: ("<u1", struct.Struct("<B")),
    GGUFValueType.INT8: ("<i1", struct.Struct("<b")),
    GGUFValueType.UINT16: ("<u2", struct.Struct("<H")),
    GGUFValueType.INT16: ("<i2", struct.Struct("<h")),
    GGUFValueType.UINT32: ("<u4", struct.Struct("<I")),
    GGUFValueType.INT32: ("<i4", struct.Struct("<i")),
    GGUFValueType.FLOAT32: ("<f4", struct.Struct("<f")),
    GGUFValueType.BOOL: ("<u1", struct.Struct("<?")),
    GGUFValueType.UINT64: ("<u8", struct.Struct("<Q")),
    GGUFValueType.INT64: ("<i8", struct.Struct("<q")),
    GGUFValueType.FLOAT64: ("<f8", struct.Struct("<d")),
}
_VALID_TYPES = {int(t) for t in GGUFValueType}


class GGUFFormatError(GGUFError):
    """The bytes are not a GGUF header llama.cpp would accept."""


class _NeedMore(Exception):
    """The buffer ends before the header does; read more of the file and start again."""

    def __init__(self, at_least: int = 0) -> None:
        super().__init__(at_least)
        self.at_least = at_least


@dataclass(frozen=True)
class StringArray:
    """An array of GGUF strings kept as the raw serialized region.

    `offsets[i]` is where element i's 8-byte length field starts inside `raw`;
    `offsets[n]` is the end of the region. Elements decode on access.
    """

    raw: bytes
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def item_bytes(self, i: int) -> bytes:
        start = int(self.offsets[i]) + 8
        return self.raw[start : int(self.offsets[i + 1])]

    def __getitem__(self, i: int) -> str:
        return self.item_bytes(i).decode("utf-8", errors="replace")

    def region(self, start: int = 0, stop: int | None = None) -> bytes:
        """The serialized bytes of elements [start, stop): equal regions mean equal elements."""
        stop = len(self) if stop is None else stop
        return self.raw[int(self.offsets[start]) : int(self.offsets[stop])]

    def tolist(self) -> list[str]:
        return [self[i] for i in range(len(self))]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type{self.ggml_type}"

    @property
    def n_bytes(self) -> int | None:
        """Bytes of tensor data, or None for a quant type gguf-py does not know."""
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        except (ValueError, KeyError):
            return None
        return self.n_elements // block * size


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    kv: dict[str, Any]
    """Scalars as Python values; numeric arrays as numpy arrays; string arrays as StringArray."""
    kv_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]]
    """Per key: the value type, and for arrays the element type."""
    tensors: tuple[TensorInfo, ...]
    data_offset: int
    """Where tensor data starts (the header size, aligned)."""
    file_size: int
    alignment: int = GGUF_DEFAULT_ALIGNMENT
    header_sha256: str = field(default="", compare=False)
    """Hash of the header bytes: the file's identity without reading tensor data."""

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)


def _open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open `path` for reading without ever blocking: a FIFO opened plainly waits for a
    writer forever, so it is opened non-blocking and refused like any non-regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GGUFFormatError("not a regular file (a FIFO, device or folder): not read")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_header(path: str | os.PathLike[str]) -> GGUFHeader:
    """Read the GGUF header of `path`. Raises GGUFFormatError (bad file) or OSError (unreadable)."""
    with _open_regular(path) as f:
        file_size = os.fstat(f.fileno()).st_size
        want = min(file_size, _FIRST_READ)
        buf = f.read(want)
        while True:
            try:
                return _parse(buf, file_size)
            except _NeedMore as more:
                if len(buf) >= file_size:  # pragma: no cover - _parse raises a format error instead
                    raise GGUFFormatError("file ends inside the GGUF header (truncated)") from None
                want = min(file_size, max(len(buf) * 4, more.at_least + more.at_least // 4))
                f.seek(0)
                buf = f.read(want)
                if len(buf) < want:
                    raise GGUFFormatError(
                        "file shrank while being read (still being written?)"
                    ) from None


def parse_header_bytes(buf: bytes, file_size: int | None = None) -> GGUFHeader:
    """Parse a header from bytes already in memory (tests, fuzzing)."""
    try:
        return _parse(buf, len(buf) if file_size is None else file_size)
    except _NeedMore:
        raise GGUFFormatError("file ends inside the GGUF header (truncated)") from None


def parse_string_array(raw: bytes, count: int) -> StringArray:
    """Rebuild a StringArray from its serialized region (as stored by the registry)."""
    cur = _Cursor(raw, len(raw))
    try:
        offsets = _string_offsets(cur, "stored vocabulary", count)
    except _NeedMore:
        raise GGUFFormatError("stored vocabulary is truncated") from None
    return StringArray(raw, offsets)


def has_gguf_magic(path: str | os.PathLike[str]) -> bool:
    try:
        with _open_regular(path) as f:
            return f.read(4) == _MAGIC_BYTES
    except (OSError, GGUFFormatError):
        return False


class _Cursor:
    """Bounds-checked reads over `buf`, a prefix of a file of `file_size` bytes."""

    __slots__ = ("buf", "pos", "file_size", "blen")

    def __init__(self, buf: bytes, file_size: int) -> None:
        self.buf = buf
        self.pos = 0
        self.file_size = file_size
        self.blen = len(buf)

    def need(self, n: int, what: str) -> None:
        end = self.pos + n
        if end > self.blen:
            if end > self.file_size:
                raise GGUFFormatError(
                    f"{what} at byte {self.pos} needs {n} bytes but the file has "
                    f"{self.file_size - self.pos} left (truncated or corrupt)"
                )
            raise _NeedMore(end)

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def raw_string(self, what: str) -> bytes:
        n = self.u64(f"length of {what}")
        if n > self.file_size - self.pos:
            raise GGUFFormatError(
                f"{what} claims {n} bytes at byte {self.pos - 8}, beyond the file's end "
                "(truncated or corrupt)"
            )
        self.need(n, what)
        s = self.buf[self.pos : self.pos + n]
        self.pos += n
        return s

    def string(self, what: str) -> str:
        raw = self.raw_string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return raw.decode("utf-8", errors="replace")


def _value_type(code: int, key: str) -> GGUFValueType:
    if code not in _VALID_TYPES:
        raise GGUFFormatError(f"key '{key}' has unknown value type {code}")
    return GGUFValueType(code)


def _parse(buf: bytes, file_size: int) -> GGUFHeader:
    cur = _Cursor(buf, file_size)
    cur.need(4, "magic")
    magic = buf[:4]
    if magic != _MAGIC_BYTES:
        raise GGUFFormatError(f"not a GGUF file (magic {magic!r}, expected b'GGUF')")
    cur.pos = 4
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in SUPPORTED_VERSIONS:
            raise GGUFFormatError(
                f"big-endian GGUF (version {swapped}); llama.cpp on this host reads "
                "little-endian files only: convert it again without --bigendian"
            )
        if version == 1:
            raise GGUFFormatError("GGUF version 1 is no longer supported by llama.cpp")
        raise GGUFFormatError(f"unknown GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.u64("tensor count")
    n_kv = cur.u64("key/value count")
    # Each KV needs at least 8 (key length) + 4 (type) bytes, each tensor at least 8+4+4+8.
    if n_kv * 12 > file_size or n_tensors * 24 > file_size:
        raise GGUFFormatError(
            f"header claims {n_kv} keys and {n_tensors} tensors, more than the file's "
            f"{file_size} bytes can hold (truncated or corrupt)"
        )

    kv: dict[str, Any] = {}
    kv_types: dict[str, tuple[GGUFValueType, GGUFValueType | None]] = {}
    for _ in range(n_kv):
        key = cur.string("key")
        if key in kv:
            raise GGUFFormatError(f"duplicate key '{key}'")
        vtype = _value_type(cur.u32(f"type of '{key}'"), key)
        if vtype == GGUFValueType.ARRAY:
            etype = _value_type(cur.u32(f"array type of '{key}'"), key)
            count = cur.u64(f"array length of '{key}'")
            kv[key] = _read_array(cur, key, etype, count)
            kv_types[key] = (vtype, etype)
        else:
            kv[key] = _read_scalar(cur, key, vtype)
            kv_types[key] = (vtype, None)

    tensors = []
    seen: set[str] = set()
    for _ in range(n_tensors):
        name = cur.string("tensor name")
        if name in seen:
            raise GGUFFormatError(f"duplicate tensor '{name}'")
        seen.add(name)
        n_dims = cur.u32(f"dimension count of tensor '{name}'")
        if n_dims > _MAX_DIMS:
            raise GGUFFormatError(f"tensor '{name}' has {n_dims} dimensions (max {_MAX_DIMS})")
        cur.need(8 * n_dims, f"shape of tensor '{name}'")
        shape = struct.unpack_from(f"<{n_dims}Q", buf, cur.pos)
        cur.pos += 8 * n_dims
        ggml_type = cur.u32(f"type of tensor '{name}'")
        offset = cur.u64(f"offset of tensor '{name}'")
        tensors.append(TensorInfo(name, tuple(int(d) for d in shape), ggml_type, offset))

    alignment = kv.get(Keys.General.ALIGNMENT, GGUF_DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFFormatError(f"general.alignment must be a power of two, got {alignment!r}")
    data_offset = -(-cur.pos // alignment) * alignment
    return GGUFHeader(
        version=version,
        kv=kv,
        kv_types=kv_types,
        tensors=tuple(tensors),
        data_offset=data_offset,
        file_size=file_size,
        alignment=alignment,
        header_sha256=hashlib.sha256(memoryview(buf)[: cur.pos]).hexdigest(),
    )


def _read_scalar(cur: _Cursor, key: str, vtype: GGUFValueType) -> Any:
    if vtype == GGUFValueType.STRING:
        return cur.string(f"value of '{key}'")
    _, st = _SCALAR[vtype]
    cur.need(st.size, f"value of '{key}'")
    (v,) = st.unpack_from(cur.buf, cur.pos)
    cur.pos += st.size
    return v


def _read_array(cur: _Cursor, key: str, etype: GGUFValueType, count: int) -> Any:
    if etype == GGUFValueType.ARRAY:
        raise GGUFFormatError(f"key '{key}' is an array of arrays, which llama.cpp rejects")
    remaining = cur.file_size - cur.pos
    if etype == GGUFValueType.STRING:
        if count * 8 > remaining:
            raise GGUFFormatError(
                f"array '{key}' claims {count} strings, more than the file's "
                f"{remaining} remaining bytes can hold"
            )
        offsets = _string_offsets(cur, key, count)
        start, end = int(offsets[0]), int(offsets[-1])
        arr = StringArray(cur.buf[start:end], offsets - start)
        cur.pos = end
        return arr
    dtype, st = _SCALAR[etype]
    nbytes = count * st.size
    if nbytes > remaining:
        raise GGUFFormatError(
            f"array '{key}' claims {count} elements ({nbytes} bytes), beyond the file's "
            "end (truncated or corrupt)"
        )
    cur.need(nbytes, f"array '{key}'")
    values = np.frombuffer(cur.buf, dtype=dtype, count=count, offset=cur.pos).copy()
    cur.pos += nbytes
    if etype == GGUFValueType.BOOL:
        values = values.astype(bool)
    return values


def _string_offsets(cur: _Cursor, key: str, count: int) -> np.ndarray:
    """Absolute offsets of the `count` length fields starting at cur.pos, plus the end."""
    if count >= 256:
        fast = _string_offsets_vectorised(cur.buf, cur.pos, count)
        if fast is not None:
            return fast
        if cur.blen < cur.file_size and cur.blen - cur.pos < count * 64:
            # Probably just cut off by our read size: read more rather than loop.
            raise _NeedMore(cur.pos + count * 64)
    return _string_offsets_loop(cur, key, count)


def _string_offsets_loop(cur: _Cursor, key: str, count: int) -> np.ndarray:
    offsets = np.empty(count + 1, dtype=np.int64)
    pos = cur.pos
    buf, blen, size = cur.buf, cur.blen, cur.file_size
    unpack = _U64.unpack_from
    for i in range(count):
        offsets[i] = pos
        if pos + 8 > blen:
            cur.pos = pos
            cur.need(8, f"element {i} of '{key}'")
        (n,) = unpack(buf, pos)
        pos += 8 + n
        if pos > blen:
            if pos > size:
                raise GGUFFormatError(
                    f"element {i} of '{key}' claims {n} bytes, beyond the file's end "
                    "(truncated or corrupt)"
                )
            raise _NeedMore(pos)
    offsets[count] = pos
    return offsets


_local = threading.local()


def _scratch(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three boolean rows of at least `n`, kept per thread (scans parse on two threads)."""
    rows: np.ndarray | None = getattr(_local, "rows", None)
    if rows is None or rows.shape[1] < n:
        rows = np.empty((3, n + n // 4), dtype=bool)
        _local.rows = rows
    return rows[0], rows[1], rows[2]


def _string_offsets_vectorised(buf: bytes, start: int, count: int) -> np.ndarray | None:
    """Find the length fields of a string array without a Python-level loop.

    A length below 2**16 is stored as 8 bytes whose top six are zero, and token or merge
    text practically never contains six NULs in a row, so each field ends where a run of
    at least six zero bytes ends. We take the first `count` such run ends as candidates
    and then *prove* them: the first field must start at `start` and each field must
    start exactly where the previous element's bytes end. Any violation (an empty
    string, NULs in text, a truncated buffer) returns None and the caller loops instead.
    """
    blen = len(buf)
    window = min(blen - start, count * 18)  # 8-byte length + ~10 bytes of text, grown on demand
    while True:
        if window < 16:
            return None
        arr = np.frombuffer(buf, dtype=np.uint8, count=window, offset=start)
        # Three reused scratch rows instead of fresh temporaries: a vocabulary is megabytes,
        # and fresh arrays cost a page fault per 4 KB, about half the parse's system time.
        s0, s1, s2 = _scratch(window)
        w = window
        z = np.equal(arr, 0, out=s0[:w])  # zero bytes
        z2 = np.logical_and(z[:-1], z[1:], out=s1[: w - 1])  # zeros at i, i+1
        z4 = np.logical_and(z2[:-2], z2[2:], out=s2[: w - 3])  # zeros at i..i+3
        z6 = np.logical_and(z4[: w - 6], z2[4 : w - 2], out=s2[: w - 6])  # zeros at i..i+5
        nonzero_after = np.logical_not(z[6:], out=s1[: w - 6])
        ends = np.flatnonzero(np.logical_and(z6, nonzero_after, out=s2[: w - 6])) + 6
        if len(ends) >= count:
            break
        if start + window >= blen:
            return None
        window = min(blen - start, window * 2)
    starts = ends[:count] - 8
    if starts[0] != 0:
        return None
    lengths = np.ndarray(shape=(window - 7,), dtype="<u8", buffer=buf, offset=start, strides=(1,))[
        starts
    ].astype(np.int64)
    if np.any(lengths < 0) or np.any(starts[1:] != starts[:-1] + 8 + lengths[:-1]):
        return None
    end = int(starts[-1] + 8 + lengths[-1])
    if end > window:
        return None
    offsets = np.empty(count + 1, dtype=np.int64)
    offsets[:count] = starts + start
    offsets[count] = start + end
    return offsets
