"""Pickle-free msgpack codec for the messages in :mod:`schemas.data`.

A message is the msgpack map ``{"schema": name, "version": SCHEMA_VERSION, "payload": {...}}``
where the payload maps field names to values. An array travels either inline, as a msgpack
ext type whose data is a small header (dtype string, ndim, int64 dims) followed by the raw
little-endian element bytes (ext 1 a numpy array, ext 2 a torch tensor, so bfloat16 and
float8, which numpy lacks, survive), or, for the common 1-D numpy arrays of an Experience, in
the message's array table (``"arrays"``, ext 3, see "The array table"), its field holding its
index there. A message from the bus is data, never code: there is no pickle, and decoding
anything malformed raises :class:`CodecError` (a ValueError) saying what is wrong, without
allocating more than the message's own size.

numpy arrays decode zero-copy (``np.frombuffer`` on the message bytes), hence **read-only**;
torch tensors decode to a writable copy (torch has no read-only tensors). torch is imported
only when a tensor is encoded or a torch ext is decoded, so ``import schemas`` stays light.

Speed: ExperienceGroup and Experience are the hot path (every rollout crosses the bus). The
reference codec below handles them with hand-written fast paths, and when ``msgspec`` is
installed a second route writes and parses them in C (see "Accelerated path"): same bytes,
same objects, same errors, several times faster. Everything else takes the reference path.

The message size is simply ``len(encode(obj))``; the bus uses it to keep messages under
``max_payload``.
"""

from __future__ import annotations

import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import MISSING, fields
from operator import attrgetter
from typing import Any

import msgpack
import numpy as np

try:  # optional accelerator for the hot schemas, see "Accelerated path" below
    import msgspec
except ImportError:  # pragma: no cover - without it the reference path does everything
    msgspec = None

from .data import (
    SCHEMA_VERSION,
    SCHEMAS,
    Experience,
    ExperienceGroup,
    Metric,
    SyncEvent,
    Task,
    _plainly_valid,
)

__all__ = [
    "CodecError",
    "decode",
    "decode_array",
    "encode",
    "encode_array",
    "schema_name",
    "MAX_NDIM",
    "MAX_DIM",
]


class CodecError(ValueError):
    """The one error for anything that cannot be encoded or decoded; the message names the
    field and what was expected versus what was found."""


EXT_NUMPY = 1
EXT_TORCH = 2
#: Arrays with more dims are rejected (numpy itself allows 64).
MAX_NDIM = 32
#: Largest single dim accepted. Dims of non-empty arrays are already bounded by the byte
#: count; this bounds zero-size arrays such as shape (0, 2**62), whose strides would overflow.
MAX_DIM = 1 << 32
#: Nesting depth allowed in plain-data fields (info, raw, messages, ...).
MAX_DEPTH = 64

_BIG_ENDIAN_HOST = sys.byteorder == "big"

# --------------------------------------------------------------------------------------------
# Arrays
# --------------------------------------------------------------------------------------------

# Standard numpy dtypes, keyed by their little-endian wire string (b"<f4", b"|b1", ...).
# Anything else (object, strings, structured, datetime, long double) is refused both ways.
_NP_BY_WIRE: dict[bytes, np.dtype] = {}
_NP_PREFIX: dict[np.dtype, bytes] = {}
for _c in "?bBhHiIlLqQefdFD":
    # On a little-endian host this is numpy's own singleton (np.dtype("<i4") is
    # np.dtype("i4")), so the dict lookups below hit by identity without a dtype __eq__, and
    # decoded arrays carry the same singletons when they are encoded again.
    _dt = np.dtype("<" + _c)
    _w = _dt.str.encode()
    _NP_BY_WIRE[_w] = _dt
    _NP_PREFIX[_dt] = bytes([len(_w)]) + _w

# torch dtypes allowed on the wire, by name; resolved against the installed torch lazily.
_TORCH_NAMES = (
    "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 bfloat16 float32 float64"
    " complex64 complex128 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz"
).split()
_torch_by_wire: dict[bytes, tuple[Any, int]] | None = None
_torch_prefix: dict[Any, bytes] = {}

_DIMS = [struct.Struct(f"<{n}q") for n in range(MAX_NDIM + 1)]
_NDIM = [bytes([n]) for n in range(MAX_NDIM + 1)]
_PACK_DIM = _DIMS[1].pack

# Hot-path tables, built from the ones above. Encode side: dtype -> (prefix + ndim 1, is
# bool). Decode side: the first 4 bytes of a 1-D header (dtype length 3, dtype string) ->
# (dtype, itemsize, is bool); the 13-byte header of such an array is then "<4sBq".
_NP_FAST: dict[np.dtype, tuple[bytes, bool]] = {
    dt: (p + _NDIM[1], dt.kind == "b") for dt, p in _NP_PREFIX.items()
}
_NP_HEAD4: dict[bytes, tuple[np.dtype, int, bool]] = {
    p: (dt, dt.itemsize, dt.kind == "b") for dt, p in _NP_PREFIX.items() if len(p) == 4
}
_HEAD13 = struct.Struct("<4sBq")
_UNPACK_HEAD13 = _HEAD13.unpack_from
#: Bool masks up to this many bytes are checked in one ``bytes.translate`` pass (about ten
#: instructions a byte, no setup); longer ones by a numpy reduction (fixed setup, then
#: vectorized).
_BOOL_SMALL = 1024
_TO_BOOL = bytes([0] + [1] * 255)  # translate table: every nonzero byte becomes 1
#: An encoder buffer (msgpack Packer, msgspec bytearray) kept per thread for the next message
#: is dropped instead once a message grew it past this.
_KEEP_PACKER_BYTES = 1 << 20
_frombuffer = np.frombuffer


def _torch() -> Any:
    """Import torch on first use and build its dtype tables."""
    global _torch_by_wire
    import torch

    if _torch_by_wire is None:
        table: dict[bytes, tuple[Any, int]] = {}
        for name in _TORCH_NAMES:
            dt = getattr(torch, name, None)
            if dt is not None:
                w = name.encode()
                table[w] = (dt, torch.empty((), dtype=dt).element_size())
                _torch_prefix[dt] = bytes([len(w)]) + w
        _torch_by_wire = table
    return torch


def _is_tensor(x: Any) -> bool:
    """True if ``x`` is a torch tensor, without importing torch (no torch, no tensors)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _header(prefix: bytes, shape: tuple[int, ...]) -> bytes:
    nd = len(shape)
    if nd > MAX_NDIM:
        raise CodecError(f"array: ndim {nd} exceeds {MAX_NDIM}")
    return prefix + _NDIM[nd] + _DIMS[nd].pack(*shape)


def _bool_bytes(a: np.ndarray) -> bytes:
    """The C-order bytes of a bool array, each 0 or 1: bools built from raw bytes (say 2)
    travel as true bools, since numpy and torch would carry them silently and give odd sums
    and comparisons."""
    raw = a.tobytes()
    if len(raw) <= _BOOL_SMALL or np.frombuffer(raw, np.uint8).max() > 1:
        raw = raw.translate(_TO_BOOL)  # returns raw itself when nothing changes
    return raw


def _pack_numpy(a: np.ndarray) -> bytes:
    """Header and C-order little-endian bytes of any numpy array (the general path; the
    common 1-D case is inlined in :func:`_pack_array`)."""
    dt = a.dtype
    prefix = _NP_PREFIX.get(dt)
    if prefix is None:  # big-endian or exotic dtype: convert to the little-endian twin
        le = dt.newbyteorder("<")
        prefix = _NP_PREFIX.get(le)
        if prefix is None:
            raise CodecError(f"array: unsupported numpy dtype {dt} (bool/int/uint/float/complex)")
        a = a.astype(le)
    if dt.kind == "b":
        return _header(prefix, a.shape) + _bool_bytes(a)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    # One copy: the header and the array's own buffer are joined straight into the ext data.
    return b"".join((_header(prefix, a.shape), a.data))


def _pack_torch(t: Any) -> bytes:
    torch = _torch()
    if t.layout != torch.strided or t.is_quantized:
        raise CodecError(f"tensor: only dense tensors are supported, got layout {t.layout}")
    prefix = _torch_prefix.get(t.dtype)
    if prefix is None:
        raise CodecError(f"tensor: unsupported torch dtype {t.dtype}")
    try:
        t = t.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.resolve_conj().resolve_neg().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, NotImplementedError, TypeError) as e:  # e.g. a meta tensor
        raise CodecError(f"tensor: cannot read the data of a {t.device} tensor: {e}") from None
    if _BIG_ENDIAN_HOST:  # pragma: no cover - no big-endian machines here
        raise CodecError("tensor: big-endian hosts are not supported")
    return b"".join((_header(prefix, tuple(t.shape)), raw))


def _parse_header(data: bytes) -> tuple[bytes, tuple[int, ...], int, int]:
    """Split ext data into (dtype wire string, shape, element count, data offset), checking
    everything that can be checked before any allocation."""
    n = len(data)
    if n < 2:
        raise CodecError(f"array: header truncated ({n} bytes)")
    k = data[0]
    if n < k + 2:
        raise CodecError("array: header truncated in dtype")
    wire = data[1 : 1 + k]
    ndim = data[1 + k]
    if ndim > MAX_NDIM:
        raise CodecError(f"array: ndim {ndim} exceeds {MAX_NDIM}")
    offset = 2 + k + 8 * ndim
    if n < offset:
        raise CodecError(f"array: header truncated in shape (ndim {ndim}, {n} bytes)")
    shape = _DIMS[ndim].unpack_from(data, 2 + k)
    if ndim == 1:  # the common case
        count = shape[0]
        if 0 <= count <= MAX_DIM:
            return wire, shape, count, offset
    count = 1
    for d in shape:
        if d < 0 or d > MAX_DIM:
            raise CodecError(f"array: dim {d} in shape {shape} is outside [0, {MAX_DIM}]")
        count *= d
    return wire, shape, count, offset


def _bool_bytes_ok(data: bytes | memoryview, offset: int, count: int) -> bool:
    """True if the ``count`` bytes at ``offset`` are all 0 or 1. A bool byte other than 0/1 is
    not a bool: numpy and torch would carry it silently and give odd sums and comparisons."""
    if count <= _BOOL_SMALL:
        return not bytes(data[offset : offset + count]).translate(None, b"\0\1")
    return np.frombuffer(data, np.uint8, count, offset).max() <= 1


def _check_bool_bytes(data: bytes, offset: int) -> None:
    """Refuse a message whose bool array (the rest of ``data``) holds other bytes."""
    if not _bool_bytes_ok(data, offset, len(data) - offset):
        raise CodecError("array: bool array holds bytes other than 0 and 1")


def _unpack_numpy(data: bytes) -> np.ndarray:
    wire, shape, count, offset = _parse_header(data)
    dt = _NP_BY_WIRE.get(wire)
    if dt is None:
        raise CodecError(f"array: unsupported numpy dtype {wire!r}")
    if len(data) - offset != count * dt.itemsize:
        raise CodecError(
            f"array: shape {shape} of {wire.decode()} needs {count * dt.itemsize} bytes, "
            f"message has {len(data) - offset}"
        )
    if count == 0:
        return np.empty(shape, dt)
    if dt.kind == "b":
        _check_bool_bytes(data, offset)
    # Zero-copy: a read-only view of the message bytes.
    a = np.frombuffer(data, dt, count, offset)
    return a if len(shape) == 1 else a.reshape(shape)


def _unpack_torch(data: bytes) -> Any:
    wire, shape, count, offset = _parse_header(data)
    torch = _torch()
    assert _torch_by_wire is not None
    entry = _torch_by_wire.get(wire)
    if entry is None:
        raise CodecError(f"tensor: unsupported torch dtype {wire!r}")
    dt, itemsize = entry
    if len(data) - offset != count * itemsize:
        raise CodecError(
            f"tensor: shape {shape} of {wire.decode()} needs {count * itemsize} bytes, "
            f"message has {len(data) - offset}"
        )
    if count == 0:
        return torch.empty(shape, dtype=dt)
    if itemsize == 1 and wire == b"bool":
        _check_bool_bytes(data, offset)
    # torch has no read-only tensors: copy into a bytearray so the tensor may be written.
    buf = bytearray(memoryview(data)[offset:])
    return torch.frombuffer(buf, dtype=dt).reshape(shape)


def encode_array(a: Any) -> bytes:
    """Encode one numpy array or torch tensor alone (header + raw bytes): the ext payload the
    codec embeds, also usable on its own (e.g. by a store that keeps arrays)."""
    ext = _pack_array(a, "array", "value")
    return bytes([ext.code]) + ext.data


def decode_array(data: bytes) -> Any:
    """Inverse of :func:`encode_array`; raises CodecError on anything malformed."""
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) < 1:
        raise CodecError("array: expected non-empty bytes")
    data = bytes(data)
    if data[0] not in (EXT_NUMPY, EXT_TORCH):
        raise CodecError(f"array: unknown array type {data[0]}")
    return _ext_hook(data[0], data[1:])


# --------------------------------------------------------------------------------------------
# The array table (schema version 2)
#
# An Experience holds up to nine arrays and a group of 8 holds ~24; as one ext each, every
# array costs a Python call on each side (header, join, Ext; parse, frombuffer), which was
# half of the codec's time. So in version 2 the common arrays (1-D numpy, a standard
# little-endian dtype) travel in one table at the end of the envelope, ``"arrays": ext 3``,
# and their fields hold the array's index in it: small ints that msgpack writes and parses in
# C. The table is
#
#     u32 n | u64 b | n x u8 dtype code (index into _TABLE_WIRES) | n x u64 element counts |
#     the bool arrays' bytes (b in all), then the other arrays' bytes, each in index order
#
# Each index must be used by exactly one field. Everything else (torch tensors, n-D arrays,
# big-endian, numpy subclasses) still travels inline as ext 1/2, and version 1 messages
# (every array inline, no table) still decode.
# --------------------------------------------------------------------------------------------

EXT_TABLE = 3
_TABLE_WIRES = (b"|b1", b"|i1", b"|u1", b"<i2", b"<u2", b"<i4", b"<u4", b"<i8", b"<u8",
                b"<f2", b"<f4", b"<f8", b"<c8", b"<c16")  # fmt: skip
_TABLE_DTYPES = tuple(_NP_BY_WIRE[w] for w in _TABLE_WIRES)
_TABLE_CODE: dict[np.dtype, int] = {dt: i for i, dt in enumerate(_TABLE_DTYPES)}
_TABLE_ITEMSIZES = tuple(dt.itemsize for dt in _TABLE_DTYPES)
_BOOL_CODE = _TABLE_CODE[np.dtype(bool)]
#: n arrays, then the bytes of the bool arrays (which come first, so one check covers all)
_TABLE_HEAD = struct.Struct("<IQ")
#: Arrays one table may hold (a group of 8 has ~24). Past it, encoders put arrays inline, and
#: decode refuses a bigger table: each entry is 9 bytes on the wire but a ~150-byte array
#: object, so an unbounded table of empty arrays would let a 9 MB message cost 170 MB.
MAX_TABLE_ARRAYS = 4096


class _Table:
    """A decoded array table: the arrays by index, until the fields that name them take
    them. Not a list, so that a table anywhere but ``"arrays"`` is refused as the wrong type."""

    __slots__ = ("arrays",)

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays

    def __repr__(self) -> str:
        return f"<array table of {len(self.arrays)}>"


def _table_head(arrays: list[np.ndarray], codes: list[int], bool_bytes: int) -> bytes:
    n = len(arrays)
    return _TABLE_HEAD.pack(n, bool_bytes) + bytes(codes) + struct.pack(f"<{n}Q", *map(len, arrays))


def _table_ext(arrays: list[np.ndarray], codes: list[int]) -> msgpack.ExtType:
    """Reference encoder of a table: bool bytes made 0/1 and strided arrays made contiguous
    (the accelerated encoder gives way to this one for both, so the bytes agree)."""
    bools = [_bool_bytes(a) for a, c in zip(arrays, codes, strict=True) if c == _BOOL_CODE]
    others = [
        a if a.flags.c_contiguous else np.ascontiguousarray(a)
        for a, c in zip(arrays, codes, strict=True)
        if c != _BOOL_CODE
    ]
    head = _table_head(arrays, codes, sum(map(len, bools)))
    return _new_tuple(_ExtType, (EXT_TABLE, b"".join([head, *bools, *others])))


#: The envelope's last key, as msgpack writes it.
_ARRAYS_KEY = msgpack.packb("arrays")
_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}


def _ext_head(code: int, size: int) -> bytes:
    """The msgpack header of an ext of ``size`` bytes, the smallest form, as msgpack and
    msgspec write it."""
    fix = _FIXEXT.get(size)
    if fix is not None:
        return bytes((fix, code))
    if size <= 0xFF:
        return struct.pack(">BBb", 0xC7, size, code)
    if size <= 0xFFFF:
        return struct.pack(">BHb", 0xC8, size, code)
    return struct.pack(">BIb", 0xC9, size, code)


def _parse_table(data: bytes | memoryview) -> _Table:
    """The arrays of a table, as read-only views of ``data``. numpy checks each view against
    the buffer's length before making it, so no count can make it allocate.

    Why slices: making an array from a buffer costs twice what slicing one does, so each
    region (the bools, then the others) gets one view per dtype, made when first needed, and
    each array is a slice of it. An array whose offset is not a multiple of its item size
    (after an odd-sized one) is made from the buffer instead. A slice past the end would be
    cut short silently, so the counts must add up to each region's size exactly."""
    size = len(data)
    if size < _TABLE_HEAD.size:
        raise CodecError(f"array table: truncated ({size} bytes)")
    n, bool_bytes = _TABLE_HEAD.unpack_from(data)
    if n > MAX_TABLE_ARRAYS:
        raise CodecError(f"array table: {n} arrays exceed {MAX_TABLE_ARRAYS}")
    start = _TABLE_HEAD.size + 9 * n
    if size < start or bool_bytes > size - start:
        raise CodecError(f"array table: header of {n} arrays does not fit in {size} bytes")
    codes = bytes(data[_TABLE_HEAD.size : _TABLE_HEAD.size + n])
    counts = struct.unpack_from(f"<{n}Q", data, _TABLE_HEAD.size + n)
    if bool_bytes and not _bool_bytes_ok(data, start, bool_bytes):
        raise CodecError("array: bool array holds bytes other than 0 and 1")
    nd, dts, sizes = _ndarray, _TABLE_DTYPES, _TABLE_ITEMSIZES
    bools = nd((bool_bytes,), dts[_BOOL_CODE], data, start)
    other = start + bool_bytes  # where the other arrays' region starts
    rest = size - other  # and its size
    views: list[Any] = [None] * len(dts)  # per dtype code: a view of the whole region
    at_bool = at = 0  # bytes into each region
    arrays = []
    try:
        for code, k in zip(codes, counts, strict=True):
            if code == _BOOL_CODE:
                arrays.append(bools[at_bool : at_bool + k])
                at_bool += k
                continue
            itemsize = sizes[code]
            if at % itemsize:
                arrays.append(nd((k,), dts[code], data, other + at))
            else:
                view = views[code]
                if view is None:
                    view = views[code] = nd((rest // itemsize,), dts[code], data, other)
                i = at // itemsize
                arrays.append(view[i : i + k])
            at += k * itemsize
    except IndexError:
        raise CodecError(f"array table: unknown dtype code {max(codes)}") from None
    except (TypeError, ValueError):  # numpy: "buffer is too small", "array is too big"
        at = -1
    if at_bool != bool_bytes or at != rest:
        raise CodecError(f"array table: the counts of its {n} arrays do not fit its {size} bytes")
    return _Table(arrays)


#: Experience fields that hold arrays: on the wire, each is a table index, an ext or nil.
_ARRAY_FIELDS = ("tokens", "logprobs", "action_mask", "token_level_reward", "advantages",
                 "returns", "chosen", "rejected", "teacher_logprobs")  # fmt: skip


def _take_arrays(payload: Any, table: _Table | None, used: list[bool], where: str) -> None:
    """Reference decoder: replace the table indices in one Experience payload map by their
    arrays, in place. Anything that is not a map, and any field that is not an int, is left
    for the field checks to judge."""
    if type(payload) is not dict:
        return
    arrays = table.arrays if table is not None else []
    for name in _ARRAY_FIELDS:
        v = payload.get(name)
        if type(v) is not int:
            continue
        if not 0 <= v < len(arrays):
            raise CodecError(
                f"{where}.{name}: array index {v} is outside the message's table of {len(arrays)}"
            )
        if used[v]:
            raise CodecError(f"{where}.{name}: array index {v} is used by another field too")
        used[v] = True
        payload[name] = arrays[v]


_ExtType = msgpack.ExtType
# ExtType's own __new__ re-checks its arguments in Python; ours are known good (a constant
# code and bytes), so build the namedtuple directly. msgpack packs it like any ExtType.
_new_tuple = tuple.__new__


def _pack_array(a: Any, where: str, name: str) -> msgpack.ExtType:
    """Encode-side check of an array field: the array as its ext type, ready for msgpack."""
    if type(a) is np.ndarray:
        fast = _NP_FAST.get(a.dtype)
        if fast is not None and a.ndim == 1:
            # The hot path: a 1-D array of a standard little-endian dtype.
            prefix_1d, is_bool = fast
            head = prefix_1d + _PACK_DIM(len(a))
            if is_bool:
                return _new_tuple(_ExtType, (EXT_NUMPY, head + _bool_bytes(a)))
            try:
                # One copy: header and array buffer joined straight into the ext data. join
                # asks for a simple (C-contiguous) buffer, which numpy refuses for a strided
                # array: that one takes the general path.
                return _new_tuple(_ExtType, (EXT_NUMPY, b"".join((head, a))))
            except TypeError:
                pass
        return _new_tuple(_ExtType, (EXT_NUMPY, _pack_numpy(a)))
    if isinstance(a, np.ndarray):  # subclasses travel as plain arrays
        return _new_tuple(_ExtType, (EXT_NUMPY, _pack_numpy(np.asarray(a))))
    if _is_tensor(a):
        return _new_tuple(_ExtType, (EXT_TORCH, _pack_torch(a)))
    return _fail(where, name, "numpy array or torch tensor", a)


def _pack_field_array(a: Any, where: str, name: str) -> int | msgpack.ExtType:
    """Encode side of an Experience array field: its index in this message's array table
    (``_local.table``) for a 1-D numpy array of a standard little-endian dtype, otherwise the
    array inline as an ext."""
    if type(a) is np.ndarray and a.ndim == 1:
        code = _TABLE_CODE.get(a.dtype)
        table = _local.table
        if code is not None and len(table) < MAX_TABLE_ARRAYS:
            table.append((a, code))
            return len(table) - 1
    return _pack_array(a, where, name)


def _pack_opt_array(a: Any, where: str, name: str) -> int | msgpack.ExtType | None:
    return None if a is None else _pack_field_array(a, where, name)


def _default(obj: Any) -> Any:
    """msgpack hook for values it does not know: numpy scalars become plain Python numbers.
    Anything else is refused (no pickle fallback); array fields are packed by their checks."""
    if isinstance(obj, np.bool_ | np.integer | np.floating):
        return obj.item()
    raise CodecError(f"cannot encode a {type(obj).__name__}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_NUMPY:
        # Hot path, inlined: a non-empty 1-D array of a standard dtype whose header and byte
        # count agree. Anything else, and every error, goes through _unpack_numpy.
        if len(data) > 13:
            key, ndim, count = _UNPACK_HEAD13(data)
            fast = _NP_HEAD4.get(key)
            if fast is not None and ndim == 1 and 0 < count <= MAX_DIM:
                dt, itemsize, is_bool = fast
                if len(data) - 13 == count * itemsize:
                    if is_bool:
                        _check_bool_bytes(data, 13)
                    return _frombuffer(data, dt, count, 13)  # zero-copy, read-only
        return _unpack_numpy(data)
    if code == EXT_TORCH:
        return _unpack_torch(data)
    if code == EXT_TABLE:
        return _parse_table(data)
    raise CodecError(f"unknown msgpack ext type {code}")


# --------------------------------------------------------------------------------------------
# Field checks: one function per wire type. Each takes (value, where, name) and returns the
# value (possibly normalized, e.g. int -> float) or raises CodecError naming ``where.name``.
# The path string is only built on failure: the hot path must not format 23 strings per
# experience.
# --------------------------------------------------------------------------------------------


def _short(v: Any) -> str:
    """A bounded repr: a hostile 60 MB string or list must not become a 60 MB error message."""
    if isinstance(v, str | bytes | bytearray):
        return repr(v[:48]) + ("..." if len(v) > 48 else "")
    if isinstance(v, list | tuple | dict):
        return f"of length {len(v)}"
    r = repr(v)  # scalars, Timestamp, arrays (numpy and torch summarize large ones)
    return r if len(r) <= 60 else r[:57] + "..."


def _describe(v: Any) -> str:
    return f"{type(v).__name__} {_short(v)}"


def _fail(where: str, name: str, expected: str, v: Any) -> Any:
    raise CodecError(f"{where}.{name}: expected {expected}, got {_describe(v)}")


def _str(v: Any, where: str, name: str) -> str:
    if type(v) is str or isinstance(v, str):
        return v
    return _fail(where, name, "str", v)


def _opt_str(v: Any, where: str, name: str) -> str | None:
    if v is None or isinstance(v, str):
        return v
    return _fail(where, name, "str or None", v)


def _int(v: Any, where: str, name: str) -> int:
    if type(v) is int:
        return v
    if isinstance(v, np.integer):  # encode side only: msgpack never yields numpy scalars
        return int(v)
    return _fail(where, name, "int", v)


def _float(v: Any, where: str, name: str) -> float:
    t = type(v)
    if t is float:
        return v
    if t is int or isinstance(v, np.integer | np.floating):
        return float(v)
    return _fail(where, name, "float", v)


def _opt_float(v: Any, where: str, name: str) -> float | None:
    if v is None or type(v) is float:
        return v
    return _float(v, where, name)


def _bool(v: Any, where: str, name: str) -> bool:
    if type(v) is bool:
        return v
    if isinstance(v, np.bool_):
        return bool(v)
    return _fail(where, name, "bool", v)


def _array(v: Any, where: str, name: str) -> Any:
    if type(v) is np.ndarray or isinstance(v, np.ndarray) or _is_tensor(v):
        return v
    return _fail(where, name, "numpy array or torch tensor", v)


def _opt_array(v: Any, where: str, name: str) -> Any:
    if v is None or type(v) is np.ndarray:
        return v
    return _array(v, where, name)


_SCALARS = (str, int, float, bool, bytes, type(None))
_NP_SCALARS = (np.bool_, np.integer, np.floating)


def _path(node: tuple) -> str:
    """Flatten the (parent, suffix) chain that _plain keeps instead of formatting paths."""
    parts = []
    while type(node) is tuple:
        node, suffix = node
        parts.append(suffix)
    return node + "".join(reversed(parts))


def _plain(v: Any, where: str, name: str) -> Any:
    """Plain data (what JSON holds, plus bytes): None/bool/int/float/str/bytes, lists and
    str-keyed dicts, at most MAX_DEPTH deep. Iterative, so depth cannot blow the stack."""
    stack: list[tuple[Any, Any, int]] = [(v, (where, "." + name), 0)]
    while stack:
        x, path, depth = stack.pop()
        if isinstance(x, dict):
            if depth >= MAX_DEPTH:
                raise CodecError(f"{_path(path)}: nested deeper than {MAX_DEPTH}")
            for k, y in x.items():
                if not isinstance(k, str):
                    raise CodecError(f"{_path(path)}: keys must be str, got {_describe(k)}")
                if type(y) not in _SCALARS:
                    stack.append((y, (path, f".{k}"), depth + 1))
        elif isinstance(x, list | tuple):
            if depth >= MAX_DEPTH:
                raise CodecError(f"{_path(path)}: nested deeper than {MAX_DEPTH}")
            for i, y in enumerate(x):
                if type(y) not in _SCALARS:
                    stack.append((y, (path, f"[{i}]"), depth + 1))
        elif not isinstance(x, _SCALARS + _NP_SCALARS):
            raise CodecError(
                f"{_path(path)}: expected plain data (None/bool/int/float/str/bytes/list/dict),"
                f" got {_describe(x)}"
            )
    return v


def _dict(v: Any, where: str, name: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        return _fail(where, name, "dict", v)
    return _plain(v, where, name) if v else v


def _opt_dict_list(v: Any, where: str, name: str) -> list[dict[str, Any]] | None:
    if v is None:
        return None
    if not isinstance(v, list):
        return _fail(where, name, "list of dicts or None", v)
    for i, m in enumerate(v):
        if not isinstance(m, dict):
            _fail(where, f"{name}[{i}]", "dict", m)
    return _plain(v, where, name)


def _str_list(v: Any, where: str, name: str) -> list[str]:
    if not isinstance(v, list):
        return _fail(where, name, "list of str", v)
    for i, s in enumerate(v):
        if not isinstance(s, str):
            _fail(where, f"{name}[{i}]", "str", s)
    return v


def _float_dict(v: Any, where: str, name: str) -> dict[str, float]:
    if not isinstance(v, dict):
        return _fail(where, name, "dict of str to float", v)
    out = v
    for k, x in v.items():
        if not isinstance(k, str):
            raise CodecError(f"{where}.{name}: keys must be str, got {_describe(k)}")
        if type(x) is not float:
            if out is v:
                out = dict(v)
            out[k] = _float(x, where, f"{name}[{k!r}]")
    return out


# --------------------------------------------------------------------------------------------
# Schemas: (field name, check) in dataclass field order, checked against the dataclass below.
# --------------------------------------------------------------------------------------------

Check = Callable[[Any, str, str], Any]

_EXPERIENCE: tuple[tuple[str, Check], ...] = (
    ("id", _str),
    ("task_id", _str),
    ("group_id", _str),
    ("run_id", _str),
    ("tokens", _array),
    ("prompt_length", _int),
    ("logprobs", _opt_array),
    ("action_mask", _opt_array),
    ("reward", _opt_float),
    ("token_level_reward", _opt_array),
    ("advantages", _opt_array),
    ("returns", _opt_array),
    ("model_version", _int),
    ("prompt_truncated", _bool),
    ("response_truncated", _bool),
    ("messages", _opt_dict_list),
    ("prompt_text", _opt_str),
    ("response_text", _opt_str),
    ("chosen", _opt_array),
    ("rejected", _opt_array),
    ("teacher_logprobs", _opt_array),
    ("info", _dict),
    ("created_at", _float),
)


def _experiences_in(v: Any, where: str, name: str) -> list[Experience]:
    """Decode side of ExperienceGroup.experiences: build each (validated by the group)."""
    if not isinstance(v, list):
        return _fail(where, name, "list of experiences", v)
    out = []
    for i, p in enumerate(v):
        e = _experience_in(p)
        if e is None:  # anything unusual, and every error: the general, checked path
            e = _build(Experience, p, f"{where}.{name}[{i}]", validate=False)
        out.append(e)
    return out


def _experiences_out(v: Any, where: str, name: str) -> list[dict[str, Any]]:
    """Encode side of ExperienceGroup.experiences: check and flatten each to a payload map."""
    if not isinstance(v, list | tuple):
        return _fail(where, name, "list of Experience", v)
    out = []
    for i, e in enumerate(v):
        if type(e) is not Experience:
            _fail(where, f"{name}[{i}]", "Experience", e)
        out.append(_experience_out(e, f"{where}.{name}[{i}]"))
    return out


_GROUP: tuple[tuple[str, Check], ...] = (
    ("group_id", _str),
    ("task_id", _str),
    ("run_id", _str),
    ("model_version", _int),
    ("experiences", _experiences_in),
    ("is_eval", _bool),
    ("taskset", _str),
    ("metrics", _float_dict),
    ("created_at", _float),
)

_TASK: tuple[tuple[str, Check], ...] = (
    ("task_id", _str),
    ("raw", _dict),
    ("workflow", _str),
    ("reward_fn", _opt_str),
    ("rollout_args", _dict),
    ("workflow_args", _dict),
    ("reward_fn_args", _dict),
    ("repeat_times", _int),
    ("is_eval", _bool),
    ("taskset", _str),
    ("index", _int),
    ("epoch", _int),
    ("format", _dict),
)

_SYNC: tuple[tuple[str, Check], ...] = (
    ("kind", _str),
    ("model_version", _int),
    ("method", _str),
    ("step", _int),
    ("source", _str),
    ("checkpoint_path", _opt_str),
    ("rendezvous", _opt_str),
    ("missing", _str_list),
    ("info", _dict),
    ("created_at", _float),
)

_METRIC: tuple[tuple[str, Check], ...] = (
    ("role", _str),
    ("step", _int),
    ("kind", _str),
    ("values", _float_dict),
    ("taskset", _opt_str),
    ("created_at", _float),
)


# Checks that differ on the encode side: arrays are packed to ext types while checked, and
# nested experiences are flattened to payload maps.
_ENCODE_SIDE: dict[Check, Check] = {
    _array: _pack_field_array,
    _opt_array: _pack_opt_array,
    _experiences_in: _experiences_out,
}


class _Spec:
    """Everything the codec needs about one schema, precomputed once."""

    __slots__ = ("cls", "name", "names", "decode_fields", "encode_fields", "get")

    def __init__(self, cls: type, name: str, spec: tuple[tuple[str, Check], ...]) -> None:
        declared = fields(cls)
        names = tuple(n for n, _ in spec)
        if names != tuple(f.name for f in declared):  # a field added to data.py only
            raise RuntimeError(f"codec spec for {cls.__name__} does not match its fields")
        self.cls = cls
        self.name = name
        self.names = names
        # Defaults as zero-argument callables, so mutable defaults are fresh per object.
        defaults = tuple(
            f.default_factory
            if f.default_factory is not MISSING
            else (None if f.default is MISSING else (lambda d=f.default: d))
            for f in declared
        )
        self.decode_fields = tuple((n, c, d) for (n, c), d in zip(spec, defaults, strict=True))
        self.encode_fields = tuple((n, _ENCODE_SIDE.get(c, c)) for n, c in spec)
        self.get = attrgetter(*names)


_SPECS: dict[type, _Spec] = {}
for _name, _cls, _s in (
    ("task", Task, _TASK),
    ("experience", Experience, _EXPERIENCE),
    ("experience_group", ExperienceGroup, _GROUP),
    ("sync_event", SyncEvent, _SYNC),
    ("metric", Metric, _METRIC),
):
    assert SCHEMAS[_name] is _cls
    _SPECS[_cls] = _Spec(_cls, _name, _s)
if set(_SPECS) != set(SCHEMAS.values()):
    raise RuntimeError("every schema in SCHEMAS needs a codec spec")
_SPEC_BY_NAME = {s.name: s for s in _SPECS.values()}


def schema_name(obj: Any) -> str:
    """Wire name of a schema instance or class (e.g. for a ``Trinity-Schema`` header)."""
    spec = _SPECS.get(obj if isinstance(obj, type) else type(obj))
    if spec is None:
        raise CodecError(f"not a schema type: {_describe(obj)}")
    return spec.name


# --------------------------------------------------------------------------------------------
# Experience hot path. A group of 8 x 1024 tokens must encode and decode in a fraction of the
# time NATS takes to move it, so the Experience payload is handled by two functions written
# out field by field: exact ``type(x) is`` checks in one expression, no per-field calls. They
# only ever take the common case; anything else (a torch tensor, an int for a float, a
# missing field, a wrong type) goes to the general path above, which normalizes it or raises
# the CodecError naming the field. So the fast path changes speed, never results.
# --------------------------------------------------------------------------------------------

_ndarray = np.ndarray
_STR_ONLY = frozenset((str,))
_SCALAR_TYPES = frozenset(_SCALARS)


def _flat_plain(d: dict) -> bool:
    """True if ``d`` is a flat map of str to scalars (so :func:`_plain` would accept it),
    checked in C; False means "ask _plain", which also walks nested data."""
    return _STR_ONLY.issuperset(map(type, d)) and _SCALAR_TYPES.issuperset(map(type, d.values()))


def _experience_out(e: Experience, where: str) -> dict[str, Any]:
    """Encode side: the payload map of one Experience (field order as in the dataclass)."""
    reward = e.reward
    prompt_text = e.prompt_text
    response_text = e.response_text
    info = e.info
    if not (
        type(e.id) is str
        and type(e.task_id) is str
        and type(e.group_id) is str
        and type(e.run_id) is str
        and type(e.prompt_length) is int
        and (reward is None or type(reward) is float)
        and type(e.model_version) is int
        and type(e.prompt_truncated) is bool
        and type(e.response_truncated) is bool
        and (prompt_text is None or type(prompt_text) is str)
        and (response_text is None or type(response_text) is str)
        and type(info) is dict
        and type(e.created_at) is float
    ):
        return _payload(e, where)
    pack = _pack_field_array
    logprobs = e.logprobs
    action_mask = e.action_mask
    token_level_reward = e.token_level_reward
    advantages = e.advantages
    returns = e.returns
    messages = e.messages
    chosen = e.chosen
    rejected = e.rejected
    teacher_logprobs = e.teacher_logprobs
    return {
        "id": e.id,
        "task_id": e.task_id,
        "group_id": e.group_id,
        "run_id": e.run_id,
        "tokens": pack(e.tokens, where, "tokens"),
        "prompt_length": e.prompt_length,
        "logprobs": None if logprobs is None else pack(logprobs, where, "logprobs"),
        "action_mask": None if action_mask is None else pack(action_mask, where, "action_mask"),
        "reward": reward,
        "token_level_reward": None
        if token_level_reward is None
        else pack(token_level_reward, where, "token_level_reward"),
        "advantages": None if advantages is None else pack(advantages, where, "advantages"),
        "returns": None if returns is None else pack(returns, where, "returns"),
        "model_version": e.model_version,
        "prompt_truncated": e.prompt_truncated,
        "response_truncated": e.response_truncated,
        "messages": None if messages is None else _opt_dict_list(messages, where, "messages"),
        "prompt_text": prompt_text,
        "response_text": response_text,
        "chosen": None if chosen is None else pack(chosen, where, "chosen"),
        "rejected": None if rejected is None else pack(rejected, where, "rejected"),
        "teacher_logprobs": None
        if teacher_logprobs is None
        else pack(teacher_logprobs, where, "teacher_logprobs"),
        "info": info if not info or _flat_plain(info) else _plain(info, where, "info"),
        "created_at": e.created_at,
    }


def _experience_in(p: Any) -> Experience | None:
    """Decode side: the Experience of a payload map whose fields all have their usual types
    (numpy arrays, flat info, no messages); None for anything else.

    The dataclass's own ``__init__`` matches the keys to fields and fills the defaults of
    missing ones; any key it does not take (unknown, bytes, a required one missing) is a
    TypeError, and the general path then says which."""
    if type(p) is not dict:
        return None
    try:
        e = Experience(**p)
    except TypeError:
        return None
    nd = _ndarray
    reward = e.reward
    logprobs = e.logprobs
    action_mask = e.action_mask
    token_level_reward = e.token_level_reward
    advantages = e.advantages
    returns = e.returns
    prompt_text = e.prompt_text
    response_text = e.response_text
    chosen = e.chosen
    rejected = e.rejected
    teacher_logprobs = e.teacher_logprobs
    info = e.info
    if (
        type(e.id) is str
        and type(e.task_id) is str
        and type(e.group_id) is str
        and type(e.run_id) is str
        and type(e.tokens) is nd
        and type(e.prompt_length) is int
        and (logprobs is None or type(logprobs) is nd)
        and (action_mask is None or type(action_mask) is nd)
        and (reward is None or type(reward) is float)
        and (token_level_reward is None or type(token_level_reward) is nd)
        and (advantages is None or type(advantages) is nd)
        and (returns is None or type(returns) is nd)
        and type(e.model_version) is int
        and type(e.prompt_truncated) is bool
        and type(e.response_truncated) is bool
        and e.messages is None
        and (prompt_text is None or type(prompt_text) is str)
        and (response_text is None or type(response_text) is str)
        and (chosen is None or type(chosen) is nd)
        and (rejected is None or type(rejected) is nd)
        and (teacher_logprobs is None or type(teacher_logprobs) is nd)
        and type(info) is dict
        and (not info or _flat_plain(info))
        and type(e.created_at) is float
    ):
        return e
    return None


def _payload(obj: Any, where: str | None = None) -> dict[str, Any]:
    """Check every field of ``obj`` and return its payload map (field name -> wire value)."""
    spec = _SPECS[type(obj)]
    where = where or spec.cls.__name__
    return {
        n: check(v, where, n)
        for (n, check), v in zip(spec.encode_fields, spec.get(obj), strict=True)
    }


def _build(cls: type, payload: Any, where: str, validate: bool = True) -> Any:
    """Construct ``cls`` from a decoded payload map, checking each field's type."""
    spec = _SPECS[cls]
    if type(payload) is not dict:
        raise CodecError(f"{where}: expected a {cls.__name__} map, got {_describe(payload)}")
    if tuple(payload) == spec.names:  # fast path: every field, in the order encode writes
        args = [
            check(v, where, name)
            for (name, check, _), v in zip(spec.decode_fields, payload.values(), strict=True)
        ]
        return _construct(cls, args, validate)
    get = payload.get
    args = []
    found = 0
    for name, check, default in spec.decode_fields:
        v = get(name, MISSING)
        if v is MISSING:
            if default is None:
                raise CodecError(f"{where}.{name}: required field is missing")
            args.append(default())
        else:
            found += 1
            args.append(check(v, where, name))
    if found != len(payload):
        unknown = [_short(k) for k in payload if k not in spec.names]
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise CodecError(f"{where}: unknown field(s) {', '.join(unknown[:5])}{more}")
    return _construct(cls, args, validate)


def _construct(cls: type, args: list[Any], validate: bool) -> Any:
    obj = cls(*args)
    return _validated(obj) if validate else obj


def _validated(obj: Any) -> Any:
    """``obj`` after its ``validate()``, whose ValueError becomes a CodecError."""
    try:
        obj.validate()
    except ValueError as e:
        raise CodecError(str(e)) from None
    return obj


# --------------------------------------------------------------------------------------------
# Accelerated path (msgspec) for ExperienceGroup and Experience
#
# Everything above is the reference codec: it defines what is valid and says what is wrong.
# When msgspec is installed, the two hot schemas first try a faster route to the *same* bytes
# and the *same* objects: msgspec writes and parses the msgpack structure in C (map keys
# matched against the fields without creating a str per key, types checked as they are read)
# and the checks left to Python are the ones msgspec cannot express. This route only ever
# takes messages it fully understands; for anything else (an unusual type, any error, any
# doubt) it returns None and the reference codec starts again from the beginning, so errors
# and edge cases behave exactly as without msgspec. tests/schemas checks the two routes
# against each other (same bytes out, same objects back) on generated and mutated messages.
# --------------------------------------------------------------------------------------------


def _exact_plain(v: Any) -> bool:
    """True if ``v`` is plain data of exact builtin types (what msgspec and msgpack write
    identically and what :func:`_plain` accepts unchanged), at most MAX_DEPTH deep."""
    stack = [(v, 0)]
    while stack:
        x, depth = stack.pop()
        t = type(x)
        if t is dict:
            if depth >= MAX_DEPTH or not _STR_ONLY.issuperset(map(type, x)):
                return False
            children = x.values()
        elif t is list:
            if depth >= MAX_DEPTH:
                return False
            children = x
        else:
            return t in _SCALAR_TYPES
        for y in children:
            if type(y) not in _SCALAR_TYPES:
                stack.append((y, depth + 1))
    return True


def _fast_array(a: Any) -> bool:
    """A numpy array or a torch tensor (call sites test ``type(a) is ndarray`` first)."""
    return type(a) is _ndarray or _is_tensor(a)


class _Collect:
    """The array table an encode is building: arrays in index order, their dtype codes, and
    the bool ones and the others apart (the table writes the bools first)."""

    __slots__ = ("arrays", "codes", "bools", "others")

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []
        self.codes: list[int] = []
        self.bools: list[np.ndarray] = []
        self.others: list[np.ndarray] = []


def _table_index(a: Any, t: _Collect) -> int:
    """Encode side: ``a``'s index in the table ``t`` builds, if ``a`` is an array the table
    takes (an exact 1-D numpy array of a standard little-endian dtype, as
    :func:`_pack_field_array` decides); else -1, and the caller gives way."""
    if type(a) is not _ndarray or a.ndim != 1:
        return -1
    code = _TABLE_CODE.get(a.dtype)
    if code is None:
        return -1
    arrays = t.arrays
    arrays.append(a)
    t.codes.append(code)
    (t.bools if code == _BOOL_CODE else t.others).append(a)
    return len(arrays) - 1


def _wire_values(e: Experience, t: _Collect) -> tuple[Any, ...] | None:
    """Encode side: the field values of ``e`` as the wire takes them, its arrays as table
    indices, if every field has the exact type the wire takes as is (no int for a float, no
    numpy scalar, no str subclass, plain info, arrays the table takes) and ``e`` passes
    :func:`_plainly_valid` (so ``validate`` has nothing to say). None otherwise: the
    reference encoder then normalizes it (torch tensors, 2-D teacher logprobs, ...) or raises
    naming the field."""
    reward = e.reward
    messages = e.messages
    prompt_text = e.prompt_text
    response_text = e.response_text
    info = e.info
    if not (
        type(e.id) is str
        and type(e.task_id) is str
        and type(e.group_id) is str
        and type(e.run_id) is str
        and (reward is None or type(reward) is float)
        and type(e.prompt_truncated) is bool
        and type(e.response_truncated) is bool
        and (
            messages is None
            or (
                type(messages) is list
                and all(type(m) is dict for m in messages)
                and _exact_plain(messages)
            )
        )
        and (prompt_text is None or type(prompt_text) is str)
        and (response_text is None or type(response_text) is str)
        and type(info) is dict
        and (not info or _flat_plain(info) or _exact_plain(info))
        and type(e.created_at) is float
        and _plainly_valid(e)  # also: prompt_length and model_version are ints
    ):
        return None
    # in field order: that is the order the reference encoder numbers them in
    ix = _table_index
    lp, am, tlr, adv, ret = e.logprobs, e.action_mask, e.token_level_reward, e.advantages, e.returns
    ch, rj, tl = e.chosen, e.rejected, e.teacher_logprobs
    ti = ix(e.tokens, t)
    lp = None if lp is None else ix(lp, t)
    am = None if am is None else ix(am, t)
    tlr = None if tlr is None else ix(tlr, t)
    adv = None if adv is None else ix(adv, t)
    ret = None if ret is None else ix(ret, t)
    ch = None if ch is None else ix(ch, t)
    rj = None if rj is None else ix(rj, t)
    tl = None if tl is None else ix(tl, t)
    if -1 in (ti, lp, am, tlr, adv, ret, ch, rj, tl):
        return None
    return (
        e.id, e.task_id, e.group_id, e.run_id, ti, e.prompt_length, lp, am, reward, tlr, adv,
        ret, e.model_version, e.prompt_truncated, e.response_truncated, messages, prompt_text,
        response_text, ch, rj, tl, info, e.created_at,
    )  # fmt: skip


_FLOAT_ONLY = frozenset((float,))


if msgspec is not None:

    def _ms_ext_hook(code: int, data: memoryview) -> Any:
        """The table from a memoryview of the message (its arrays are read-only views of the
        message); inline arrays through the reference hook on a copy."""
        if code == EXT_TABLE:
            return _parse_table(data)
        if code == EXT_NUMPY and len(data) > 13:
            n = len(data)
            key, ndim, count = _UNPACK_HEAD13(data)
            fast = _NP_HEAD4.get(key)
            if fast is not None and ndim == 1 and 0 < count <= MAX_DIM:
                dt, itemsize, is_bool = fast
                if n - 13 == count * itemsize:
                    if is_bool and not _bool_bytes_ok(data, 13, count):
                        raise CodecError("bool bytes")
                    return _frombuffer(data, dt, count, 13)
        return _ext_hook(code, bytes(data))

    _ms_local = threading.local()

    def _ms_struct(cls: type, wire: dict[Check, Any]) -> Any:
        """A msgspec Struct mirroring a schema dataclass: same field names, order and
        defaults; the types msgspec checks itself, ``Any`` where Python checks after."""
        spec = _SPECS[cls]
        out = []
        for f, (name, check, _) in zip(fields(cls), spec.decode_fields, strict=True):
            t = wire[check]
            if f.default_factory is not MISSING:
                out.append((name, t, msgspec.field(default_factory=f.default_factory)))
            elif f.default is not MISSING:
                out.append((name, t, f.default))
            else:
                out.append((name, t))
        return msgspec.defstruct(f"_{cls.__name__}Wire", out, forbid_unknown_fields=True)

    _WIRE_TYPES: dict[Check, Any] = {
        _str: str,
        _opt_str: str | None,
        _int: int,
        _float: float,  # msgspec takes an int here and makes it a float, as _float does
        _opt_float: float | None,
        _bool: bool,
        _array: Any,
        _opt_array: Any,
        _dict: dict[str, Any],
        _opt_dict_list: Any,
        _float_dict: dict[str, float],
    }
    _ExperienceWire = _ms_struct(Experience, _WIRE_TYPES)
    _GroupWire = _ms_struct(
        ExperienceGroup, {**_WIRE_TYPES, _experiences_in: list[_ExperienceWire]}
    )
    _astuple = msgspec.structs.astuple
    _GROUP_EXPERIENCES = _SPECS[ExperienceGroup].names.index("experiences")
    _ARRAY_INDEX = tuple(_SPECS[Experience].names.index(n) for n in _ARRAY_FIELDS)

    def _envelope_type(name: str, payload: Any) -> Any:
        return msgspec.defstruct(
            f"_{name}_envelope",
            [("version", int), ("payload", payload), ("arrays", Any, None)],
            tag_field="schema",
            tag=name,
            forbid_unknown_fields=True,
        )

    _ms_encoder = msgspec.msgpack.Encoder()
    _ms_decoder = msgspec.msgpack.Decoder(
        _envelope_type("experience_group", _GroupWire)
        | _envelope_type("experience", _ExperienceWire),
        ext_hook=_ms_ext_hook,
    )

    def _ms_experience(w: Any, arrays: list[np.ndarray] | None, refs: list[int]) -> Any:
        """The Experience of a decoded wire struct, its table indices replaced by arrays
        (noted in ``refs``), if its Any-typed fields are right; None otherwise."""
        args = _astuple(w)
        if arrays is not None:
            args = list(args)
            for i in _ARRAY_INDEX:
                v = args[i]
                if type(v) is int:
                    refs.append(v)
                    args[i] = arrays[v]  # an IndexError sends it to the reference path
        e = Experience(*args)
        nd = _ndarray
        tokens = e.tokens
        logprobs = e.logprobs
        action_mask = e.action_mask
        token_level_reward = e.token_level_reward
        advantages = e.advantages
        returns = e.returns
        chosen = e.chosen
        rejected = e.rejected
        teacher_logprobs = e.teacher_logprobs
        if not (
            (type(tokens) is nd or _fast_array(tokens))
            and (logprobs is None or type(logprobs) is nd or _fast_array(logprobs))
            and (action_mask is None or type(action_mask) is nd or _fast_array(action_mask))
            and (
                token_level_reward is None
                or type(token_level_reward) is nd
                or _fast_array(token_level_reward)
            )
            and (advantages is None or type(advantages) is nd or _fast_array(advantages))
            and (returns is None or type(returns) is nd or _fast_array(returns))
            and (chosen is None or type(chosen) is nd or _fast_array(chosen))
            and (rejected is None or type(rejected) is nd or _fast_array(rejected))
            and (
                teacher_logprobs is None
                or type(teacher_logprobs) is nd
                or _fast_array(teacher_logprobs)
            )
        ):
            return None
        info, messages = e.info, e.messages
        if info and not _flat_plain(info):
            _plain(info, "", "info")  # a CodecError sends the message to the reference path
        if messages is not None:
            _opt_dict_list(messages, "", "messages")
        return e

    def _ms_wire(obj: Any, t: _Collect) -> Any:
        """The wire struct of an ExperienceGroup or Experience, its arrays numbered into
        ``t``, if it takes the fast route (see :func:`_wire_values`); None otherwise. msgspec
        writes a Struct as the map of its fields in order, the bytes the reference encoder
        writes for the dataclass, and knowing the arrays up front needs no hook."""
        if type(obj) is Experience:
            v = _wire_values(obj, t)
            return None if v is None else _ExperienceWire(*v)
        gid, tid, rid, version = obj.group_id, obj.task_id, obj.run_id, obj.model_version
        exps, metrics = obj.experiences, obj.metrics
        if not (
            type(gid) is str
            and type(tid) is str
            and type(rid) is str
            and type(version) is int
            and version >= 0
            and type(exps) is list
            and type(obj.is_eval) is bool
            and type(obj.taskset) is str
            and type(metrics) is dict
            and (
                not metrics
                or (
                    _STR_ONLY.issuperset(map(type, metrics))
                    and _FLOAT_ONLY.issuperset(map(type, metrics.values()))
                )
            )
            and type(obj.created_at) is float
        ):
            return None
        wire = []
        seen: set[str] = set()
        for e in exps:  # what ExperienceGroup.validate checks besides each experience
            if type(e) is not Experience or e.id in seen:
                return None
            if e.group_id != gid or e.task_id != tid or e.run_id != rid:
                return None
            seen.add(e.id)
            v = _wire_values(e, t)
            if v is None:
                return None
            wire.append(_ExperienceWire(*v))
        return _GroupWire(
            gid, tid, rid, version, wire, obj.is_eval, obj.taskset, metrics, obj.created_at
        )

    def _fast_encode(obj: Any, spec: _Spec) -> bytes | None:
        """The envelope with its payload as wire structs and the array table last. msgspec
        writes the 3-key envelope into this thread's buffer (whose pages stay mapped from one
        message to the next); the table is then appended by the one join that also makes the
        message, so the arrays' bytes are copied once, straight from the arrays into it (a
        64 KB copy costs ~50 us on these machines). None: the reference path decides."""
        t = _Collect()
        try:
            payload = _ms_wire(obj, t)
        except Exception:  # an unhashable id, a failing __eq__: the reference path explains
            return None
        arrays = t.arrays
        if payload is None or len(arrays) > MAX_TABLE_ARRAYS:
            return None
        local = _ms_local
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = bytearray()
        else:
            local.buf = None  # taken
        bools = t.bools
        try:
            _ms_encoder.encode_into(
                {"schema": spec.name, "version": SCHEMA_VERSION, "payload": payload}, buf
            )
            if buf[0] != 0x83:  # msgspec wrote the 3-key map as a fixmap
                return None
            buf[0] = 0x84  # ... and it gets a 4th key: "arrays", the table
            bool_bytes = sum(map(len, bools))
            head = _table_head(arrays, t.codes, bool_bytes)
            size = len(head) + bool_bytes + sum(a.nbytes for a in t.others)
            ext = _ext_head(EXT_TABLE, size)
            # join refuses a strided array (TypeError): the reference path copies it
            out = b"".join([buf, _ARRAYS_KEY, ext, head, *bools, *t.others])
        except Exception:  # the reference path says what is wrong
            return None
        finally:
            if len(buf) <= _KEEP_PACKER_BYTES:
                local.buf = buf
        at = len(buf) + len(_ARRAYS_KEY) + len(ext) + len(head)  # the bools come first
        if bool_bytes and not _bool_bytes_ok(out, at, bool_bytes):
            return None  # bools built from raw bytes: the reference path makes them 0/1
        return out

    def _fast_decode(data: bytes, expect: type | None) -> Any:
        try:
            env = _ms_decoder.decode(data)
            table = env.arrays
            if table is None:
                if env.version != 1 and env.version != SCHEMA_VERSION:
                    return None
                arrays = None
            elif env.version == SCHEMA_VERSION and type(table) is _Table:
                arrays = table.arrays
            else:
                return None
            refs: list[int] = []
            w = env.payload
            if type(w) is _ExperienceWire:
                if expect is not None and expect is not Experience:
                    return None
                obj = _ms_experience(w, arrays, refs)
            else:
                if expect is not None and expect is not ExperienceGroup:
                    return None
                exps = []
                for x in w.experiences:
                    e = _ms_experience(x, arrays, refs)
                    if e is None:
                        return None
                    exps.append(e)
                args = list(_astuple(w))
                args[_GROUP_EXPERIENCES] = exps
                obj = ExperienceGroup(*args)
            if obj is None:
                return None
            if arrays is not None:  # every table entry used once, by exactly one field
                n = len(arrays)
                if len(refs) != n or (n and (min(refs) < 0 or len(set(refs)) != n)):
                    return None
            obj.validate()
            return obj
        except Exception:  # anything at all: the reference path decides and explains
            return None

else:  # pragma: no cover
    _fast_encode = _fast_decode = None


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------

#: Whether encode/decode try the msgspec route first (tests turn it off to exercise the
#: reference path alone).
_accelerated = msgspec is not None

_local = threading.local()


def _pack(envelope: dict[str, Any]) -> bytes:
    """msgpack the envelope with this thread's Packer. A fresh Packer per message (what
    ``msgpack.packb`` does) allocates and faults in a new 256 KiB buffer every time, a
    good part of the whole encode; the Packer resets itself after each message, also when
    packing fails. A re-entrant call finds none to take and uses a fresh one."""
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = msgpack.Packer(default=_default, use_bin_type=True)
    else:
        _local.packer = None  # taken
    out = packer.pack(envelope)
    if len(out) <= _KEEP_PACKER_BYTES:
        _local.packer = packer
    return out


def encode(obj: Any) -> bytes:
    """Encode a schema instance (Task, Experience, ExperienceGroup, SyncEvent, Metric).

    Checks every field's type and calls ``validate()`` first, so a bad message fails at the
    producer rather than poisoning a consumer. Raises CodecError naming the field.
    """
    spec = _SPECS.get(type(obj))
    if spec is None:
        raise CodecError(f"cannot encode {_describe(obj)}: not a schema type")
    if _accelerated and (spec.cls is ExperienceGroup or spec.cls is Experience):
        out = _fast_encode(obj, spec)
        if out is not None:
            return out
    with_table = spec.cls is ExperienceGroup or spec.cls is Experience
    if with_table:
        table = _local.table = []  # (array, dtype code), filled by _pack_field_array
    payload = _experience_out(obj, "Experience") if spec.cls is Experience else _payload(obj)
    try:
        obj.validate()
    except ValueError as e:
        raise CodecError(str(e)) from None
    envelope = {"schema": spec.name, "version": SCHEMA_VERSION, "payload": payload}
    if with_table:
        envelope["arrays"] = _table_ext([a for a, _ in table], [c for _, c in table])
    try:
        return _pack(envelope)
    except CodecError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        raise CodecError(f"{spec.cls.__name__}: cannot encode: {e}") from None


def decode(data: bytes, expect: type | None = None, *, max_bytes: int = 64 << 20) -> Any:
    """Decode a message produced by :func:`encode`.

    ``expect`` (a schema class) rejects messages of any other schema. Anything malformed
    (not msgpack, truncated, wrong field types, unknown schema or version, absurd array
    shapes, more than ``max_bytes``) raises CodecError; nothing else escapes. numpy arrays in
    the result are read-only views of ``data``.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"message: expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise CodecError(f"message: {len(data)} bytes exceeds max_bytes={max_bytes}")
    if _accelerated:
        # Arrays come out as views of the message: copy a mutable buffer first, so that no
        # one can change a decoded (validated) array behind its back.
        obj = _fast_decode(data if type(data) is bytes else bytes(data), expect)
        if obj is not None:
            return obj
    try:
        env = msgpack.unpackb(
            data,
            ext_hook=_ext_hook,
            raw=False,
            strict_map_key=True,
            use_list=True,
            timestamp=0,
        )
    except CodecError:
        raise
    except Exception as e:  # msgpack's own errors: truncated, extra data, bad utf-8, ...
        raise CodecError(
            f"message: not a valid msgpack message ({type(e).__name__}: {e})"
        ) from None
    if type(env) is not dict or not _ENVELOPE <= set(env) <= _ENVELOPE_TABLE:
        got = f"keys {[_short(k) for k in list(env)[:5]]}" if type(env) is dict else _describe(env)
        raise CodecError(
            f"message: expected a map with keys schema, version, payload (and arrays); got {got}"
        )
    name, version = env["schema"], env["version"]
    spec = _SPEC_BY_NAME.get(name) if isinstance(name, str) else None
    if spec is None:
        raise CodecError(f"message: unknown schema {_describe(name)}; known: {sorted(SCHEMAS)}")
    if type(version) is not int or version not in _READ_VERSIONS:
        raise CodecError(
            f"message: unsupported version {_short(version)} of schema {name!r} "
            f"(this build reads versions {', '.join(map(str, _READ_VERSIONS))})"
        )
    if expect is not None and spec.cls is not expect:
        exp = getattr(expect, "__name__", repr(expect))
        raise CodecError(f"message: expected a {exp}, got a {spec.cls.__name__} ({name!r})")
    used = _take_table(env, spec, version)
    try:
        if spec.cls is Experience:
            obj = _experience_in(env["payload"])
            if obj is not None:
                obj = _validated(obj)
        else:
            obj = None
        if obj is None:
            obj = _build(spec.cls, env["payload"], spec.cls.__name__)
    except CodecError:
        raise
    except Exception as e:  # a bug here must still not take the consumer down
        raise CodecError(f"{spec.cls.__name__}: cannot decode ({type(e).__name__}: {e})") from None
    if not all(used):
        unused = [i for i, u in enumerate(used) if not u]
        raise CodecError(
            f"message: array table entries {unused[:5]}{' ...' if len(unused) > 5 else ''} "
            "are not used by any field"
        )
    return obj


_ENVELOPE = frozenset(("schema", "version", "payload"))
_ENVELOPE_TABLE = _ENVELOPE | {"arrays"}
#: Versions decode reads: 1 (every array inline) and the current one (the array table).
_READ_VERSIONS = (1, SCHEMA_VERSION)


def _take_table(env: dict[str, Any], spec: _Spec, version: int) -> list[bool]:
    """Reference decoder: put the arrays of the envelope's table into the payload's fields
    that name them (in place). Returns which table entries were used; every one must be."""
    has_arrays = spec.cls is ExperienceGroup or spec.cls is Experience
    if "arrays" in env:
        if version == 1 or not has_arrays:
            raise CodecError(
                f"message: a version {version} {spec.name!r} message carries no array table"
            )
        if type(env["arrays"]) is not _Table:
            raise CodecError(
                f"message: arrays: expected an array table (ext {EXT_TABLE}), "
                f"got {_describe(env['arrays'])}"
            )
    if version == 1 or not has_arrays:
        return []
    table = env.get("arrays")
    used = [False] * (len(table.arrays) if table is not None else 0)
    payload = env["payload"]
    if spec.cls is Experience:
        _take_arrays(payload, table, used, "Experience")
    elif type(payload) is dict and type(payload.get("experiences")) is list:
        for i, p in enumerate(payload["experiences"]):
            _take_arrays(p, table, used, f"ExperienceGroup.experiences[{i}]")
    return used
