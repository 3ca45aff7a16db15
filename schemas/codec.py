"""The wire format: msgpack messages for :mod:`schemas.data`, no pickle, one route each way.

A reader in any language needs only a msgpack library and this page.

**Message.** One msgpack map with three keys::

    {"schema": str, "version": int, "payload": map}

``schema`` names the type: a key of :data:`schemas.data.SCHEMAS` (``"task"``, ``"experience"``,
``"experience_group"``, ``"sync_event"``, ``"metric"``, ``"task_order"``, ``"task_done"``, ``"task_feedback"``,
``"batch_request"``, ``"batch_reply"``, ``"commit"``, ``"weights_header"``). ``version`` is :data:`schemas.data.SCHEMA_VERSION` (3);
readers refuse any version they do not know rather than misread it (this build also reads
version 1, whose layout is the same; version 2 put arrays in a side table and is refused with
a "re-run" error). ``payload`` maps the field names of that dataclass in ``schemas/data.py``
to their values, in declaration order (readers accept any order, fill a missing optional
field with its default, and ignore keys they do not know).

**Values.** Strings are UTF-8 ``str``, ints msgpack ints (at most 64 bits), floats msgpack
float64 (a float field also takes an int), ``None`` nil, bytes bin. Fields typed ``dict[str, Any]``/``list[dict[str, Any]]``
(``info``, ``raw``, ``messages``, ...) hold *plain data*: nil, bool, int, float, str, bin,
arrays and str-keyed maps of those, at most :data:`MAX_DEPTH` deep. An ``ExperienceGroup``'s
``experiences`` is an array of Experience payload maps.

**Arrays** (the ``np.ndarray`` fields: ``tokens``, ``logprobs``, ``action_mask``, ...) are a
msgpack ext value, type 1 for a numpy array or 2 for a torch tensor, whose data is::

    u8 k | k bytes dtype (ASCII) | u8 ndim | ndim x int64 dims (little-endian) | elements

The elements are little-endian, C order, ``prod(dims) * itemsize`` bytes exactly. A numpy
dtype is its little-endian ``dtype.str`` (``"<i4"``, ``"<f4"``, ``"|b1"``, ...: bool, signed
and unsigned ints of 1-8 bytes, float16/32/64, complex64/128); a torch dtype is its name
(``"bfloat16"``, ``"float8_e4m3fn"``, ``"int32"``, ...). Bool elements are the bytes 0 or 1.
At most :data:`MAX_NDIM` dims, each in ``[0, MAX_DIM]``.

**Guarantees.** Decoding never runs code (no pickle, no eval) and raises :class:`CodecError`
(a ValueError) naming the field for anything malformed, from bad msgpack to an array whose
header and bytes disagree; an array is only made once its byte count matches its header, so
no header can make the decoder allocate more than the message holds. ``encode`` runs the
very checks ``decode`` runs (the object's, then msgspec's types on the bytes it wrote), so a
producer cannot send what a consumer would refuse. numpy arrays decode to read-only arrays over a copy of their bytes;
torch tensors to writable ones. torch is imported only when a tensor is encoded or decoded.
"""

from __future__ import annotations

import math
import re
import struct
import sys
from dataclasses import fields
from typing import Any

import msgspec
import numpy as np

from .data import SCHEMA_VERSION, SCHEMAS, ExperienceGroup, TaskOrder
from .state import RECORDS as STATE_RECORDS

__all__ = [
    "CodecError", "decode", "decode_array", "decode_value", "encode", "encode_array", "encode_value", "schema_name",
]


class CodecError(ValueError):
    """The one error for anything that cannot be encoded or decoded; the message names the
    field and what was expected versus what was found."""


EXT_NUMPY = 1
EXT_TORCH = 2
#: Arrays with more dims are refused (numpy itself allows 64).
MAX_NDIM = 32
#: Largest single dim. Non-empty arrays are bounded by their bytes already; this bounds
#: zero-size ones such as shape (0, 2**62), whose strides would overflow.
MAX_DIM = 1 << 32
#: Nesting depth allowed in plain-data fields (info, raw, messages, ...).
MAX_DEPTH = 64
#: Versions decode reads: 1 has the same layout as the current one.
READ_VERSIONS = (1, SCHEMA_VERSION)

# --------------------------------------------------------------------------------------------
# Arrays
# --------------------------------------------------------------------------------------------

#: numpy dtypes on the wire, by their little-endian dtype string (object, str, datetime,
#: structured and long double are refused both ways).
_NUMPY = {np.dtype("<" + c).str: np.dtype("<" + c) for c in "?bBhHiIlLqQefdFD"}
_TORCH_NAMES = (
    "bool uint8 int8 int16 int32 int64 uint16 uint32 uint64 float16 bfloat16 float32 float64"
    " complex64 complex128 float8_e4m3fn float8_e5m2 float8_e4m3fnuz float8_e5m2fnuz"
).split()
_BOOL_BYTES = bytes([0] + [1] * 255)  # translate table: every nonzero byte becomes 1


def _torch_dtypes() -> dict[str, Any]:
    """torch's dtypes by wire name (imported on first use: no tensor, no torch)."""
    import torch

    return {n: getattr(torch, n) for n in _TORCH_NAMES if hasattr(torch, n)}


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _array_bytes(dtype: str, shape: tuple[int, ...], data: Any) -> bytes:
    """Ext data: the header of the layout above, then the elements."""
    if len(shape) > MAX_NDIM:
        raise CodecError(f"array: ndim {len(shape)} exceeds {MAX_NDIM}")
    if any(d > MAX_DIM for d in shape):  # only a zero-size array can have one
        raise CodecError(f"array: a dim of shape {shape} exceeds {MAX_DIM}")
    wire = dtype.encode()
    head = bytes([len(wire)]) + wire + bytes([len(shape)]) + struct.pack(f"<{len(shape)}q", *shape)
    return b"".join((head, data))


def _pack_numpy(a: np.ndarray) -> msgspec.msgpack.Ext:
    dt = _NUMPY.get(a.dtype.newbyteorder("<").str)
    if dt is None:
        raise CodecError(f"array: unsupported numpy dtype {a.dtype} (bool/int/uint/float/complex)")
    a = a.astype(dt, order="C", copy=False)  # little-endian, C order; no copy if it is
    data = a.tobytes().translate(_BOOL_BYTES) if dt.kind == "b" else a.data
    return msgspec.msgpack.Ext(EXT_NUMPY, _array_bytes(dt.str, a.shape, data))


def _pack_torch(t: Any) -> msgspec.msgpack.Ext:
    import torch

    name = str(t.dtype).removeprefix("torch.")
    if t.layout != torch.strided or t.is_quantized:
        raise CodecError(f"tensor: only dense tensors are supported, got layout {t.layout}")
    if name not in _TORCH_NAMES:
        raise CodecError(f"tensor: unsupported torch dtype {t.dtype}")
    if sys.byteorder != "little":  # pragma: no cover - no big-endian machines here
        raise CodecError("tensor: big-endian hosts are not supported")
    try:
        t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    except (RuntimeError, NotImplementedError, TypeError) as e:  # e.g. a meta tensor
        raise CodecError(f"tensor: cannot read the data of a {t.device} tensor: {e}") from None
    if name == "bool":
        raw = raw.translate(_BOOL_BYTES)
    return msgspec.msgpack.Ext(EXT_TORCH, _array_bytes(name, tuple(t.shape), raw))


def _unpack(code: int, data: bytes) -> Any:
    """An array from ext data, every header field checked before anything is allocated."""
    what = "array" if code == EXT_NUMPY else "tensor"
    n = len(data)
    k = data[0] if n else 0
    if n < k + 2:
        raise CodecError(f"{what}: header truncated ({n} bytes)")
    wire, ndim = data[1 : 1 + k].decode("ascii", "replace"), data[1 + k]
    if ndim > MAX_NDIM:
        raise CodecError(f"{what}: ndim {ndim} exceeds {MAX_NDIM}")
    start = 2 + k + 8 * ndim
    if n < start:
        raise CodecError(f"{what}: header truncated in shape (ndim {ndim}, {n} bytes)")
    shape = struct.unpack_from(f"<{ndim}q", data, 2 + k)
    if any(d < 0 or d > MAX_DIM for d in shape):
        raise CodecError(f"{what}: a dim of shape {shape} is outside [0, {MAX_DIM}]")
    count = math.prod(shape)
    if code == EXT_NUMPY:
        dt = _NUMPY.get(wire)
        if dt is None:
            raise CodecError(f"array: unsupported numpy dtype {wire!r}")
        itemsize, is_bool = dt.itemsize, dt.kind == "b"
    else:
        dt = _torch_dtypes().get(wire)
        if dt is None:
            raise CodecError(f"tensor: unsupported torch dtype {wire!r}")
        itemsize, is_bool = dt.itemsize, wire == "bool"
    if n - start != count * itemsize:
        raise CodecError(
            f"{what}: shape {shape} of {wire} needs {count * itemsize} bytes, message has "
            f"{n - start}"
        )
    if is_bool and data[start:].translate(None, b"\0\1"):
        raise CodecError(f"{what}: bool array holds bytes other than 0 and 1")
    if code == EXT_NUMPY:
        return np.frombuffer(data, dt, count, start).reshape(shape)  # read-only, no copy
    import torch

    if count == 0:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(bytearray(data[start:]), dtype=dt).reshape(shape)  # writable


def _pack_array(a: Any) -> msgspec.msgpack.Ext:
    if isinstance(a, np.ndarray):
        return _pack_numpy(a)
    if _is_tensor(a):
        return _pack_torch(a)
    raise CodecError(f"array: expected a numpy array or torch tensor, got {_describe(a)}")


def encode_array(a: Any) -> bytes:
    """One numpy array or torch tensor alone: its ext type byte, then its ext data."""
    ext = _pack_array(a)
    return bytes([ext.code]) + ext.data


def decode_array(data: bytes) -> Any:
    """Inverse of :func:`encode_array`; raises CodecError on anything malformed."""
    if not isinstance(data, bytes | bytearray | memoryview) or len(data) < 1:
        raise CodecError("array: expected non-empty bytes")
    data = bytes(data)
    if data[0] not in (EXT_NUMPY, EXT_TORCH):
        raise CodecError(f"array: unknown array type {data[0]}")
    return _unpack(data[0], data[1:])


# --------------------------------------------------------------------------------------------
# Encoding what msgspec does not know: arrays and numpy scalars
# --------------------------------------------------------------------------------------------


def _enc_hook(obj: Any) -> Any:
    """Values msgspec does not know: arrays become ext values, numpy scalars Python numbers;
    anything else is refused (there is no pickle fallback)."""
    if isinstance(obj, np.ndarray) or _is_tensor(obj):
        return _pack_array(obj)
    if isinstance(obj, np.bool_ | np.integer | np.floating):
        return obj.item()
    for plain in (str, int, float, bytes):  # subclasses (str enums, ...) travel as their base
        if isinstance(obj, plain):
            return plain(obj)
    raise TypeError(f"cannot encode a {type(obj).__name__}")


def _short(v: Any) -> str:
    """A bounded repr: a hostile 60 MB string must not become a 60 MB error message."""
    if isinstance(v, str | bytes | bytearray):
        return repr(v[:48]) + ("..." if len(v) > 48 else "")
    if isinstance(v, list | tuple | dict | set):
        return f"of length {len(v)}"
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _describe(v: Any) -> str:
    return f"{type(v).__name__} {_short(v)}"


# --------------------------------------------------------------------------------------------
# Plain data: what the Any-typed fields may hold, checked on both sides
# --------------------------------------------------------------------------------------------

_SCALARS = (type(None), bool, int, float, str, bytes)


def _check_plain(value: Any, where: str) -> None:
    """Raise CodecError naming the path unless ``value`` is plain data (see the module doc).
    Iterative, so no depth can blow the stack. numpy scalars pass: encode makes them plain."""
    stack = [(value, where, 0)]
    while stack:
        x, path, depth = stack.pop()
        if isinstance(x, _SCALARS) or isinstance(x, np.bool_ | np.integer | np.floating):
            continue
        if depth >= MAX_DEPTH:
            raise CodecError(f"{path}: nested deeper than {MAX_DEPTH}")
        if isinstance(x, dict):
            for k, y in x.items():
                if not isinstance(k, str):
                    raise CodecError(f"{path}: keys must be str, got {_describe(k)}")
                stack.append((y, f"{path}.{k if len(k) <= 48 else k[:45] + '...'}", depth + 1))
        elif isinstance(x, list | tuple):
            stack.extend((y, f"{path}[{i}]", depth + 1) for i, y in enumerate(x))
        else:
            raise CodecError(
                f"{path}: expected plain data (None/bool/int/float/str/bytes/list/dict), "
                f"got {_describe(x)}"
            )


#: Per schema class: its wire name, its plain-data fields, its array fields (name, optional).
_NAMES = {cls: name for name, cls in SCHEMAS.items()}
_PLAIN = {cls: tuple(f.name for f in fields(cls) if "Any" in str(f.type)) for cls in _NAMES}
_ARRAYS = {
    cls: tuple((f.name, "None" in str(f.type)) for f in fields(cls) if "Array" in str(f.type))
    for cls in _NAMES
}


def _check_plain_fields(obj: Any, where: str) -> None:
    for name in _PLAIN[type(obj)]:
        _check_plain(getattr(obj, name), f"{where}.{name}")
    for i, e in enumerate(obj.experiences if isinstance(obj, ExperienceGroup) else ()):
        if type(e) in _PLAIN:
            _check_plain_fields(e, f"{where}.experiences[{i}]")
    task = obj.task if isinstance(obj, TaskOrder) else None
    if type(task) in _PLAIN:
        _check_plain_fields(task, f"{where}.task")


def _unpack_fields(obj: Any, where: str, unpack: bool = True) -> None:
    """Replace the ext values msgspec left in ``obj``'s array fields by their arrays
    (``unpack`` false: only check that they are ext values of a known type)."""
    for name, optional in _ARRAYS[type(obj)]:
        v = getattr(obj, name)
        if v is None and optional:
            continue
        if not isinstance(v, msgspec.msgpack.Ext):
            raise CodecError(
                f"{where}.{name}: expected numpy array or torch tensor (ext 1 or 2), "
                f"got {_describe(v)}"
            )
        if v.code not in (EXT_NUMPY, EXT_TORCH):
            raise CodecError(f"{where}.{name}: unknown msgpack ext type {v.code}")
        if not unpack:
            continue
        try:
            setattr(obj, name, _unpack(v.code, v.data))
        except CodecError as e:
            raise CodecError(f"{where}.{name}: {e}") from None
    for i, e in enumerate(obj.experiences if isinstance(obj, ExperienceGroup) else ()):
        _unpack_fields(e, f"{where}.experiences[{i}]", unpack)


def schema_name(obj: Any) -> str:
    """Wire name of a schema instance or class (e.g. for a ``Trinity-Schema`` header)."""
    name = _NAMES.get(obj if isinstance(obj, type) else type(obj))
    if name is None:
        raise CodecError(f"not a schema type: {_describe(obj)}")
    return name


# --------------------------------------------------------------------------------------------
# encode / decode
# --------------------------------------------------------------------------------------------


class _Envelope(msgspec.Struct):
    schema: str
    version: int
    payload: msgspec.Raw  # decoded in a second pass, once the schema is known


_ENVELOPE = msgspec.msgpack.Decoder(_Envelope)
_DECODERS = {cls: msgspec.msgpack.Decoder(cls) for cls in _NAMES}
_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
#: msgspec's "<what> - at `$<path>`"
_AT = re.compile(r"(?s)(.*) - at `\$(.*)`$")


def _field_error(e: Exception, where: str) -> CodecError:
    """msgspec's error as ours: ``Where.path: what``."""
    text = str(e)
    m = _AT.match(text)
    if m:
        what, path = m.groups()
        where += path
        text = what
    text = text.replace("`", "")
    return CodecError(f"{where}: {text[:1].lower()}{text[1:]}")


def encode(obj: Any) -> bytes:
    """Encode a schema instance (any class of :data:`schemas.data.SCHEMAS`).

    Runs every check :func:`decode` runs (field types, plain data, ``validate()``), so a bad
    message fails at its producer rather than at a consumer. Raises CodecError naming the
    field."""
    cls = type(obj)
    name = _NAMES.get(cls)
    if name is None:
        raise CodecError(f"cannot encode {_describe(obj)}: not a schema type")
    _check_plain_fields(obj, cls.__name__)
    checked = True
    try:
        obj.validate()  # first, so that a producer gets the cross-field rule it broke
    except ValueError as e:
        raise CodecError(str(e)) from None
    except (TypeError, AttributeError):
        checked = False  # a field of the wrong type: the decode below names it
    try:
        data = _ENCODER.encode({"schema": name, "version": SCHEMA_VERSION, "payload": obj})
    except CodecError:
        raise
    except (TypeError, ValueError, OverflowError) as e:
        bad = next((f.name for f in fields(cls) if not _encodes(getattr(obj, f.name))), "")
        raise CodecError(f"{cls.__name__}.{bad}: cannot encode: {e}") from None
    if checked:  # the consumer's type checks, here at the producer (the rest ran above)
        _typed(data, cls)
    else:
        decode(data, cls)
    return data


def _encodes(value: Any) -> bool:
    try:
        _ENCODER.encode(value)
        return True
    except (TypeError, ValueError, OverflowError, CodecError):
        return False


def decode(data: bytes, expect: type | None = None, *, max_bytes: int = 64 << 20) -> Any:
    """Decode a message produced by :func:`encode`.

    ``expect`` (a schema class) refuses messages of any other schema. Anything malformed
    (not msgpack, truncated, wrong field types, unknown schema or version, absurd arrays,
    more than ``max_bytes``) raises CodecError; nothing else escapes."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise CodecError(f"message: expected bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise CodecError(f"message: {len(data)} bytes exceeds max_bytes={max_bytes}")
    obj = _typed(data, expect, unpack=True)
    try:
        obj.validate()  # the cross-field rules; its errors name the field already
    except ValueError as e:
        raise CodecError(str(e)) from None
    return obj


def _typed(data: bytes, expect: type | None, unpack: bool = False) -> Any:
    """The schema instance ``data`` holds, every field of its declared type (msgspec's
    checks). ``unpack``: also its arrays made and its plain data checked (what a consumer
    needs); without, array fields are only checked to be ext values of a known type, which is
    all :func:`encode` needs to ask of the bytes it has just written from checked fields."""
    where = "message"
    try:
        env = _ENVELOPE.decode(data)
        cls = _schema(env, expect)
        where = cls.__name__
        obj = _DECODERS[cls].decode(env.payload)
        _unpack_fields(obj, where, unpack)
        if unpack:
            _check_plain_fields(obj, where)
    except CodecError:
        raise
    except msgspec.ValidationError as e:
        raise _field_error(e, where) from None
    except msgspec.DecodeError as e:
        raise CodecError(f"{where}: not a valid msgpack message ({e})") from None
    except UnicodeDecodeError as e:
        raise CodecError(f"{where}: a string is not valid UTF-8 ({e.reason})") from None
    except RecursionError:
        raise CodecError(f"{where}: nested too deep") from None
    except Exception as e:  # a bug here must still not take the consumer down
        raise CodecError(f"{where}: cannot decode ({type(e).__name__}: {e})") from None
    return obj


def _schema(env: _Envelope, expect: type | None) -> type:
    """The class an envelope's payload decodes to, once its schema and version are known."""
    cls = SCHEMAS.get(env.schema)
    if cls is None:
        raise CodecError(f"message: unknown schema {_short(env.schema)}; known: {sorted(SCHEMAS)}")
    if env.version not in READ_VERSIONS:
        rerun = " (written by an older trinity: re-run)" if env.version < SCHEMA_VERSION else ""
        raise CodecError(
            f"message: unsupported version {env.version} of schema {env.schema!r}{rerun}; "
            f"this build reads versions {', '.join(map(str, READ_VERSIONS))}"
        )
    if expect is not None and cls is not expect:
        exp = getattr(expect, "__name__", repr(expect))
        raise CodecError(f"message: expected a {exp}, got a {cls.__name__} ({env.schema!r})")
    return cls


# --------------------------------------------------------------------------------------------
# KV values: the JSON form
# --------------------------------------------------------------------------------------------
#
# A KV value (schemas/state.py) is the record's fields as one JSON object, no envelope: the
# key says which record it holds (schemas/keys.py), and ``nats kv get`` prints it as it is.
# Readers ignore fields they do not know and fill a missing optional one with its default.

_JSON_DECODERS = {cls: msgspec.json.Decoder(cls) for cls in STATE_RECORDS}
_JSON_ENCODER = msgspec.json.Encoder()


def encode_value(obj: Any) -> bytes:
    """A KV record (a class of :data:`schemas.state.RECORDS`) as JSON, after the checks
    :func:`decode_value` runs; raises CodecError naming the field."""
    cls = type(obj)
    if cls not in _JSON_DECODERS:
        raise CodecError(f"cannot store {_describe(obj)} in KV: not a record of schemas.state")
    data = _JSON_ENCODER.encode(obj)
    decode_value(data, cls, cls.__name__)  # the reader's checks, here at the writer
    return data


def decode_value(data: bytes, cls: type, where: str) -> Any:
    """The KV record ``cls`` that ``data`` holds; CodecError naming ``where`` (the key) and the
    field for anything else: not JSON, a field missing or of the wrong type, a broken rule."""
    try:
        obj = _JSON_DECODERS[cls].decode(data)
    except msgspec.ValidationError as e:
        raise CodecError(f"{where}: {_field_error(e, cls.__name__)}") from None
    except msgspec.DecodeError as e:
        raise CodecError(f"{where}: not JSON ({e})") from None
    try:
        obj.validate()
    except ValueError as e:
        raise CodecError(f"{where}: {e}") from None
    return obj
