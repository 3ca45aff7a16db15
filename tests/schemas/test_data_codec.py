"""Schemas and codec: round-trips for arbitrary valid values, and fuzzing that shows malformed
bytes only ever produce CodecError (or a valid value), never another exception or a huge
allocation."""

from __future__ import annotations

import dataclasses
import math
import struct
import subprocess
import sys
import tracemalloc
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.codec import (
    EXT_NUMPY,
    MAX_NDIM,
    CodecError,
    decode,
    decode_array,
    encode,
    encode_array,
    schema_name,
)
from schemas.data import (
    SCHEMA_VERSION,
    SCHEMAS,
    Experience,
    ExperienceGroup,
    Metric,
    SyncEvent,
    Task,
)

# Budgets sized for two slow cores: generating whole experiences is the expensive part, so
# the heavy fuzzing mutates a fixed corpus and only a few generated messages are mutated.
_HC = [HealthCheck.too_slow, HealthCheck.data_too_large]
FAST = settings(max_examples=30, deadline=None, suppress_health_check=_HC)
FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=_HC)
FEW = settings(max_examples=15, deadline=None, suppress_health_check=_HC)

# ------------------------------------------------------------------------------------------
# Deep comparison (the dataclasses use identity equality because of the arrays)
# ------------------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Equal values, arrays equal in kind (numpy vs torch), dtype, shape and bytes."""
    if isinstance(a, np.ndarray):
        # The wire is little-endian: a big-endian input comes back as its little-endian twin.
        return (
            isinstance(b, np.ndarray)
            and a.dtype.newbyteorder("<") == b.dtype
            and a.shape == b.shape
            and np.ascontiguousarray(a, b.dtype).tobytes() == b.tobytes()
        )
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            # an empty tensor may keep a 0 stride through contiguous(), which view() refuses
            and (a.numel() == 0 or a.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            == b.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        )
    if type(a) in SCHEMAS.values():
        return type(a) is type(b) and all(
            same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__
        )
    if type(a) is int and type(b) is float:  # an int given for a float field
        return a == b
    if isinstance(a, np.generic):  # a numpy scalar travels as a Python number
        return same(a.item(), b)
    if isinstance(a, str):  # a str subclass travels as a str
        return type(b) is str and a == b
    if isinstance(a, float):
        return isinstance(b, float) and (a == b or (math.isnan(a) and math.isnan(b)))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list) and len(a) == len(b) and all(map(same, a, b))
    return type(a) is type(b) and a == b


# ------------------------------------------------------------------------------------------
# Strategies
# ------------------------------------------------------------------------------------------

NP_DTYPES = ["?", "i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8", "f2", "f4", "f8", "c8", "c16"]
TORCH_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
]

text = st.text(max_size=12)  # arbitrary unicode, incl. surrogates-free astral chars
floats = st.floats(allow_nan=True, allow_infinity=True)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | floats
    | text
    | st.binary(max_size=8)
)
plain = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(text, c, max_size=3),
    max_leaves=12,
)
plain_dict = st.dictionaries(text, plain, max_size=4)
float_dict = st.dictionaries(text, floats, max_size=4)


@st.composite
def np_arrays(draw: Any, dtypes: list[str] = NP_DTYPES, shape: Any = None) -> np.ndarray:
    dt = np.dtype(draw(st.sampled_from(dtypes)))
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = draw(st.binary(min_size=n, max_size=n))
    if dt.kind == "b":  # only 0/1 bytes are bools (others are normalized on encode)
        raw = bytes(b & 1 for b in raw)
    a = np.frombuffer(raw, dt).reshape(shape)
    if draw(st.booleans()) and dt.itemsize > 1:
        a = a.astype(dt.newbyteorder(">"))  # big-endian input must come back little-endian
    if draw(st.booleans()) and a.ndim >= 1:
        a = a[::-1]  # non-contiguous input (negative stride)
    return a


@st.composite
def torch_tensors(draw: Any, dtypes: list[Any] = TORCH_DTYPES, shape: Any = None) -> Any:
    dt = draw(st.sampled_from(dtypes))
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    itemsize = torch.empty((), dtype=dt).element_size()
    n = int(np.prod(shape, dtype=np.int64)) * itemsize
    raw = bytearray(draw(st.binary(min_size=n, max_size=n)))
    if dt == torch.bool:  # only 0/1 bytes are valid bools
        raw = bytearray(b & 1 for b in raw)
    if n == 0:
        return torch.empty(shape, dtype=dt)
    return torch.frombuffer(raw, dtype=dt).reshape(shape)


def arrays(kinds: str, length: int, allow_torch: bool = True) -> Any:
    """1-D arrays of one dtype kind and a given length, numpy or (optionally) torch."""
    np_dts = {
        "iu": ["i1", "u1", "i2", "i4", "i8", "u4"],
        "f": ["f2", "f4", "f8"],
        "b": ["?"],
    }[kinds]
    t_dts = {
        "iu": [torch.int32, torch.int64, torch.uint8],
        "f": [torch.float32, torch.bfloat16, torch.float16],
        "b": [torch.bool],
    }[kinds]
    s = np_arrays(np_dts, shape=(length,))
    if allow_torch:
        s = s | torch_tensors(t_dts, shape=(length,))
    return s


def finite(a: Any) -> Any:
    """``a`` with NaN and infinities made 0 (validate() refuses them in rewards, log-probs,
    advantages and returns), same dtype, byte order and strides."""
    if isinstance(a, np.ndarray):
        out = a.copy()
        out[~np.isfinite(a)] = 0
        return out
    return torch.nan_to_num(a, nan=0.0, posinf=0.0, neginf=0.0)


def nonnegative(a: Any) -> Any:
    """``a`` with negative token ids made 0 (validate() refuses them)."""
    if isinstance(a, np.ndarray):
        out = a.copy()
        out[a < 0] = 0
        return out
    return a.clamp(min=0)


@st.composite
def experiences(
    draw: Any, ids: tuple[str, str, str] | None = None, eid: str | None = None
) -> Experience:
    prompt = draw(st.integers(0, 6))
    resp = draw(st.integers(0, 6))
    task_id, group_id, run_id = ids or (draw(text), draw(text), draw(text))

    def opt(s: Any) -> Any:
        return draw(st.none() | s)

    dpo = draw(st.booleans())
    return Experience(
        id=eid if eid is not None else draw(text),
        task_id=task_id,
        group_id=group_id,
        run_id=run_id,
        tokens=draw(
            (arrays("iu", prompt + resp, allow_torch=False) | arrays("iu", prompt + resp)).map(
                nonnegative
            )
        ),
        prompt_length=prompt,
        logprobs=opt(arrays("f", resp).map(finite)),
        action_mask=opt(arrays("b", resp)),
        reward=opt(st.floats(allow_nan=False, allow_infinity=False) | st.integers(-5, 5)),
        token_level_reward=opt(arrays("f", resp).map(finite)),
        advantages=opt(arrays("f", resp).map(finite)),
        returns=opt(arrays("f", resp).map(finite)),
        model_version=draw(st.integers(0, 2**40)),
        prompt_truncated=draw(st.booleans()),
        response_truncated=draw(st.booleans()),
        messages=opt(st.lists(plain_dict, max_size=3)),
        prompt_text=opt(text),
        response_text=opt(text),
        chosen=draw(arrays("iu", 3).map(nonnegative)) if dpo else None,
        rejected=draw(arrays("iu", 2).map(nonnegative)) if dpo else None,
        teacher_logprobs=opt(
            arrays("f", resp) | np_arrays(["f4"], shape=(resp, draw(st.integers(0, 3))))
        ),
        info=draw(plain_dict),
        created_at=draw(floats),
    )


@st.composite
def groups(draw: Any) -> ExperienceGroup:
    ids = (draw(text), draw(st.text(min_size=1, max_size=12)), draw(text))
    n = draw(st.integers(0, 4))
    return ExperienceGroup(
        group_id=ids[1],
        task_id=ids[0],
        run_id=ids[2],
        model_version=draw(st.integers(0, 1000)),
        experiences=[draw(experiences(ids=ids, eid=f"{ids[1]}/{i}")) for i in range(n)],
        is_eval=draw(st.booleans()),
        taskset=draw(text),
        metrics=draw(float_dict),
        created_at=draw(floats),
    )


tasks = st.builds(
    Task,
    task_id=text,
    raw=plain_dict,
    workflow=text,
    reward_fn=st.none() | text,
    rollout_args=plain_dict,
    workflow_args=plain_dict,
    reward_fn_args=plain_dict,
    repeat_times=st.integers(1, 64),
    is_eval=st.booleans(),
    taskset=text,
    index=st.integers(0, 10**9),
    epoch=st.integers(0, 100),
    format=plain_dict,
)
sync_events = st.builds(
    SyncEvent,
    kind=st.sampled_from(["request", "ready", "weights_sent", "loaded", "timeout", "failed"]),
    model_version=st.integers(0, 10**6),
    method=st.sampled_from(["nccl", "checkpoint"]),
    step=st.integers(0, 10**6),
    source=text,
    checkpoint_path=st.none() | text,
    rendezvous=st.none() | st.just("127.0.0.1:29500"),
    missing=st.lists(text, max_size=3),
    info=plain_dict,
    created_at=floats,
)
metrics = st.builds(
    Metric,
    role=text,
    step=st.integers(-1, 10**6),
    kind=st.sampled_from(["train", "rollout", "eval", "sync"]),
    values=float_dict,
    taskset=st.none() | text,
    created_at=floats,
)
any_message = st.one_of(tasks, experiences(), groups(), sync_events, metrics)


def small_group() -> ExperienceGroup:
    exps = [
        Experience(
            id=f"g/{i}",
            task_id="t",
            group_id="g",
            run_id="r",
            tokens=np.arange(6, dtype=np.int32),
            prompt_length=3,
            logprobs=np.full(3, -0.5, np.float32),
            action_mask=np.array([1, 0, 1], bool),
            reward=float(i),
            info={"acc": 1.0},
        )
        for i in range(2)
    ]
    return ExperienceGroup(group_id="g", task_id="t", run_id="r", model_version=3, experiences=exps)


def decodes_or_codec_error(data: bytes) -> None:
    """The fuzz contract: CodecError, or a value that is valid (re-encodes cleanly)."""
    try:
        obj = decode(data)
    except CodecError:
        return
    encode(obj)  # a decoded value is a valid value


# ------------------------------------------------------------------------------------------
# Round-trips
# ------------------------------------------------------------------------------------------


@FAST
@given(any_message)
def test_roundtrip_any_message(obj: Any) -> None:
    back = decode(encode(obj), type(obj))
    assert same(obj, back)
    assert type(back) is type(obj)


@FAST
@given(np_arrays() | torch_tensors())
def test_roundtrip_arrays(a: Any) -> None:
    assert same(a, decode_array(encode_array(a)))


def test_numpy_decodes_zero_copy_read_only_and_torch_writable() -> None:
    g = small_group()
    g.experiences[0].teacher_logprobs = torch.tensor([1.5, -2.0, 0.25], dtype=torch.bfloat16)
    back = decode(encode(g), ExperienceGroup)
    tokens = back.experiences[0].tokens
    assert not tokens.flags.writeable and not tokens.flags.owndata
    t = back.experiences[0].teacher_logprobs
    assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
    t += 1  # writable
    assert t.tolist() == [2.5, -1.0, 1.25]


def test_group_helpers() -> None:
    g = small_group()
    assert g.reward_mean == 0.5 and g.token_count == 12
    assert g.experiences[0].response_length == 3
    assert g.msg_id() == small_group().msg_id() == "r/g/v3"
    assert ExperienceGroup(group_id="g", task_id="t", run_id="r").reward_mean is None
    assert schema_name(g) == schema_name(ExperienceGroup) == "experience_group"


def test_numpy_scalars_encode_as_python_numbers() -> None:
    m = Metric(role="trainer", step=np.int64(3), kind="train", values={"loss": np.float32(0.5)})
    back = decode(encode(m), Metric)
    assert back.step == 3 and type(back.step) is int and back.values == {"loss": 0.5}


def test_schema_does_not_import_torch() -> None:
    code = (
        "import sys, numpy as np; from schemas.codec import encode, decode; "
        "from schemas.data import Metric; decode(encode(Metric('r', 1, 'train', {'a': 1.0}))); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ------------------------------------------------------------------------------------------
# Fuzzing: only CodecError or a valid value
# ------------------------------------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    decodes_or_codec_error(data)


@FUZZ
@given(st.binary(max_size=64))
def test_random_bytes_with_valid_prefix(tail: bytes) -> None:
    # Get past the envelope so the fuzz reaches payload and array parsing.
    head = b"".join(msgpack.packb(x) for x in ("schema", "experience", "version", 1, "payload"))
    decodes_or_codec_error(b"\x83" + head + tail)


def rich_experience() -> Experience:
    """Every optional field set: DPO pair, messages, unicode text, bf16 torch teacher."""
    return Experience(
        id="g/ü",
        task_id="t",
        group_id="g",
        run_id="r",
        tokens=np.arange(7, dtype=np.int32),
        prompt_length=4,
        logprobs=np.full(3, -1.0, np.float32),
        action_mask=np.array([True, False, True]),
        reward=0.5,
        token_level_reward=np.zeros(3, np.float32),
        advantages=np.ones(3, np.float32),
        returns=np.ones(3, np.float64),
        model_version=2,
        prompt_truncated=True,
        messages=[{"role": "user", "content": "2+2 ⇒ ?"}, {"role": "tool", "content": None}],
        prompt_text="2+2",
        response_text="4 🙂",
        chosen=np.array([5, 6], np.int64),
        rejected=np.array([7], np.int64),
        teacher_logprobs=torch.tensor([-0.5, -1.0, -2.0], dtype=torch.bfloat16),
        info={"parts": {"acc": 1.0, "fmt": [1, 2, None]}, "bytes": b"\x00"},
        created_at=1.0,
    )


CORPUS = [
    encode(small_group()),
    encode(rich_experience()),
    encode(Task(task_id="t/1", raw={"q": "1+1", "a": 2, "n": [{"x": 1.5}]}, workflow="math")),
    encode(SyncEvent(kind="timeout", model_version=3, missing=["explorer"], info={"s": 1.0})),
    encode(Metric(role="trainer", step=1, kind="train", values={"loss": 0.25}, taskset="x")),
]


def mutate(raw: bytes, data: st.DataObject) -> bytes:
    """One random edit: bit flip, truncation, insertion or overwrite."""
    if not raw:
        return raw
    raw = bytearray(raw)
    op = data.draw(st.sampled_from(["flip", "truncate", "insert", "overwrite"]))
    pos = data.draw(st.integers(0, len(raw) - 1))
    if op == "flip":
        raw[pos] ^= 1 << data.draw(st.integers(0, 7))
    elif op == "truncate":
        del raw[pos:]
    elif op == "insert":
        raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
    else:
        chunk = data.draw(st.binary(min_size=1, max_size=8))
        raw[pos : pos + len(chunk)] = chunk
    return bytes(raw)


def test_corpus_reencodes_byte_identical() -> None:
    """Decoding then encoding gives the same bytes: the codec is deterministic."""
    for raw in CORPUS:
        assert encode(decode(raw)) == raw
    back = decode(CORPUS[1], Experience)
    assert same(rich_experience(), back) and back.response_length == 3


@settings(max_examples=200, deadline=None, suppress_health_check=_HC)
@given(st.sampled_from(CORPUS), st.data())
def test_mutated_corpus(raw: bytes, data: st.DataObject) -> None:
    for _ in range(data.draw(st.integers(1, 3))):
        raw = mutate(raw, data)
    decodes_or_codec_error(raw)


@FEW
@given(any_message, st.data())
def test_mutated_generated_messages(obj: Any, data: st.DataObject) -> None:
    decodes_or_codec_error(mutate(encode(obj), data))


def test_error_messages_stay_short_for_huge_values() -> None:
    env = msgpack.unpackb(CORPUS[0], raw=False, ext_hook=msgpack.ExtType)
    env["payload"]["task_id"] = list(range(100_000))
    with pytest.raises(CodecError) as e:
        decode(msgpack.packb(env))
    assert str(e.value) == "ExperienceGroup.task_id: expected str, got array"
    env = msgpack.unpackb(CORPUS[0], raw=False, ext_hook=msgpack.ExtType)
    env["payload"]["experiences"][0]["info"]["x" * 10**6] = {1: 2}
    with pytest.raises(CodecError, match="keys must be str") as e:
        decode(msgpack.packb(env))
    assert len(str(e.value)) < 300


def test_truncation_and_bit_flips_at_every_position() -> None:
    raw = encode(small_group())
    for i in range(len(raw)):
        with pytest.raises(CodecError):
            decode(raw[:i])
        for bit in (0, 3, 7):
            flipped = bytearray(raw)
            flipped[i] ^= 1 << bit
            decodes_or_codec_error(bytes(flipped))


# ------------------------------------------------------------------------------------------
# Absurd arrays: rejected before allocation
# ------------------------------------------------------------------------------------------


def ext_message(ext_data: bytes, code: int = EXT_NUMPY) -> bytes:
    """An Experience whose tokens field is the given raw ext payload."""
    payload = {
        "id": "e",
        "task_id": "t",
        "group_id": "g",
        "run_id": "r",
        "tokens": msgpack.ExtType(code, ext_data),
        "prompt_length": 0,
    }
    return msgpack.packb({"schema": "experience", "version": SCHEMA_VERSION, "payload": payload})


def refused_peak(msg: bytes, match: str) -> int:
    """Decode ``msg``, which must fail with a CodecError matching ``match``; returns the peak
    bytes Python allocated meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(CodecError, match=match):
            decode(msg)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def header(dtype: bytes, shape: tuple[int, ...]) -> bytes:
    return (
        bytes([len(dtype)]) + dtype + bytes([len(shape)]) + struct.pack(f"<{len(shape)}q", *shape)
    )


@pytest.mark.parametrize(
    "shape,match",
    [
        ((2**40,), "outside"),
        ((2**31, 2**31), "needs"),
        ((2**20, 2**20), "needs"),
        ((-1,), "outside"),
        ((0, 2**62), "outside"),
    ],
)
@pytest.mark.parametrize("code", [1, 2])
def test_absurd_shape_is_rejected_without_allocating(shape: tuple, match: str, code: int) -> None:
    dtype = b"<i4" if code == 1 else b"int32"
    msg = ext_message(header(dtype, shape) + b"\0" * 16, code)
    assert refused_peak(msg, match) < 1 << 20


def test_encode_refuses_a_dim_the_reader_refuses() -> None:
    """encode checks its own bytes' types only (not a full decode): the packer must refuse
    on its own what the reader would, here a zero-size array with a dim over MAX_DIM."""
    with pytest.raises(CodecError, match="exceeds"):
        encode_array(np.empty((0, 2**33), np.float32))
    e = Experience(id="e", task_id="t", group_id="g", run_id="r", tokens=np.arange(3, dtype=np.int32),
                   prompt_length=3, teacher_logprobs=np.empty((0, 2**33), np.float32))
    with pytest.raises(CodecError, match="exceeds"):
        encode(e)


def test_array_header_errors() -> None:
    with pytest.raises(CodecError, match="ndim"):
        decode(ext_message(header(b"<i4", (1,) * (MAX_NDIM + 1))))
    with pytest.raises(CodecError, match="unsupported numpy dtype"):
        decode(ext_message(header(b"|O8", (1,)) + b"\0" * 8))
    with pytest.raises(CodecError, match="unsupported torch dtype"):
        decode(ext_message(header(b"qint8", (1,)) + b"\0", code=2))
    with pytest.raises(CodecError, match="truncated"):
        decode(ext_message(b"\x03<i4\x02" + b"\0" * 9))
    with pytest.raises(CodecError, match="bytes other than 0 and 1"):
        decode(ext_message(header(b"|b1", (2,)) + b"\x01\x02"))
    with pytest.raises(CodecError, match="bytes other than 0 and 1"):
        decode(ext_message(header(b"bool", (2,)) + b"\x00\x07", code=2))
    with pytest.raises(CodecError, match="unknown msgpack ext type 9"):
        decode(ext_message(b"", code=9))


def test_bool_bytes_other_than_0_1_are_normalized_on_encode() -> None:
    back = decode_array(encode_array(np.frombuffer(b"\x00\x02\x01", bool)))
    assert back.view(np.uint8).tolist() == [0, 1, 1]


def test_torch_grad_noncontiguous_and_meta_tensors() -> None:
    t = torch.arange(6.0, requires_grad=True).reshape(2, 3).t()
    back = decode_array(encode_array(t))
    assert not back.requires_grad and back.is_contiguous() and torch.equal(back, t.detach())
    with pytest.raises(CodecError, match="cannot read the data of a meta tensor"):
        encode_array(torch.empty(3, device="meta"))
    with pytest.raises(CodecError, match="only dense tensors"):
        encode_array(torch.eye(2).to_sparse())


def test_unsupported_array_dtypes_refused_on_encode() -> None:
    for bad in (np.array(["a"]), np.array([object()]), np.zeros(2, np.longdouble)):
        with pytest.raises(CodecError, match="unsupported numpy dtype"):
            encode_array(bad)


# ------------------------------------------------------------------------------------------
# Envelope and field errors
# ------------------------------------------------------------------------------------------


def envelope(**over: Any) -> bytes:
    env = msgpack.unpackb(encode(small_group()), raw=False, ext_hook=msgpack.ExtType)
    env.update(over)
    return msgpack.packb(env)


def test_unknown_version_and_schema() -> None:
    with pytest.raises(CodecError, match="unsupported version 4"):
        decode(envelope(version=4))
    with pytest.raises(CodecError, match="unknown schema"):
        decode(envelope(schema="pickle"))
    with pytest.raises(CodecError, match="message: object missing required field version"):
        decode(msgpack.packb({"schema": "metric"}))
    with pytest.raises(CodecError, match="message: expected object, got array"):
        decode(msgpack.packb([1, 2]))
    with pytest.raises(CodecError, match="max_bytes"):
        decode(encode(small_group()), max_bytes=10)
    with pytest.raises(CodecError, match="expected bytes"):
        decode("text")  # type: ignore[arg-type]


def test_hand_written_payload_fills_defaults_in_any_key_order() -> None:
    tokens = msgpack.ExtType(EXT_NUMPY, header(b"<i4", (2,)) + b"\x01\0\0\0\x02\0\0\0")
    payload = {"prompt_length": 1, "tokens": tokens, "run_id": "r", "group_id": "g"}
    payload |= {"task_id": "t", "id": "e", "reward": 1}
    exp = decode(msgpack.packb({"schema": "experience", "version": 1, "payload": payload}))
    assert exp.tokens.tolist() == [1, 2] and exp.response_length == 1
    assert exp.reward == 1.0 and exp.info == {} and exp.logprobs is None and exp.model_version == 0


def test_wrong_expected_type() -> None:
    with pytest.raises(CodecError, match="expected a Metric, got a ExperienceGroup"):
        decode(encode(small_group()), Metric)


def test_wrong_field_type_names_the_field() -> None:
    group = small_group()
    env = msgpack.unpackb(encode(group), raw=False, ext_hook=msgpack.ExtType)
    env["payload"]["experiences"][1]["reward"] = "high"
    with pytest.raises(
        CodecError,
        match=r"ExperienceGroup.experiences\[1\].reward: expected float \| null, got str",
    ):
        decode(msgpack.packb(env))
    env = msgpack.unpackb(encode(small_group()), raw=False, ext_hook=msgpack.ExtType)
    env["payload"]["experiences"][0]["tokens"] = [1, 2, 3]
    with pytest.raises(CodecError, match=r"experiences\[0\].tokens: expected numpy array"):
        decode(msgpack.packb(env))
    env = msgpack.unpackb(encode(group), raw=False, ext_hook=msgpack.ExtType)
    env["payload"]["bogus"] = 1
    assert same(group, decode(msgpack.packb(env)))  # unknown fields are ignored
    del env["payload"]["bogus"], env["payload"]["group_id"]
    with pytest.raises(CodecError, match="ExperienceGroup: object missing required field group_id"):
        decode(msgpack.packb(env))


def test_encode_checks_types_at_the_producer() -> None:
    g = small_group()
    g.experiences[0].tokens = [1, 2, 3]  # type: ignore[assignment]
    with pytest.raises(CodecError, match=r"experiences\[0\].tokens"):
        encode(g)
    with pytest.raises(CodecError, match=r"Task.raw.a\[0\]: expected plain data"):
        encode(Task(task_id="t", raw={"a": [{1, 2}]}, workflow="w"))
    with pytest.raises(CodecError, match="keys must be str"):
        encode(Task(task_id="t", raw={1: 2}, workflow="w"))  # type: ignore[dict-item]
    with pytest.raises(CodecError, match="not a schema type"):
        encode({"a": 1})
    deep: Any = 1
    for _ in range(100):
        deep = [deep]
    with pytest.raises(CodecError, match="nested deeper"):
        encode(Task(task_id="t", raw={"d": deep}, workflow="w"))


def test_validate_errors_name_the_field() -> None:
    def exp(**kw: Any) -> Experience:
        base: dict[str, Any] = dict(
            id="e",
            task_id="t",
            group_id="g",
            run_id="r",
            tokens=np.arange(5, dtype=np.int32),
            prompt_length=2,
        )
        base.update(kw)
        return Experience(**base)

    cases = [
        (dict(prompt_length=6), "Experience.prompt_length"),
        (
            dict(logprobs=np.zeros(2, np.float32)),
            r"Experience.logprobs: length 2 != response length 3",
        ),
        (dict(action_mask=np.ones(3, np.int32)), "Experience.action_mask: expected bool dtype"),
        (dict(advantages=np.zeros((3, 1), np.float32)), "Experience.advantages: expected a 1-D"),
        (dict(tokens=np.zeros(5, np.float32)), "Experience.tokens: expected int or uint"),
        (dict(chosen=np.zeros(2, np.int32)), "Experience.rejected: DPO needs both"),
        (dict(model_version=-1), "Experience.model_version"),
        # poison that used to pass the codec and stop a consumer further on
        (dict(model_version=2**63), r"Experience.model_version: must be in \[0, 2\*\*63\)"),
        (dict(reward=float("nan")), "Experience.reward: must be finite, got nan"),
        (dict(reward=float("-inf")), "Experience.reward: must be finite"),
        (dict(logprobs=np.array([0, np.nan, 0], np.float32)), "Experience.logprobs: holds NaN"),
        (dict(advantages=torch.tensor([0.0, 0.0, float("inf")])), "Experience.advantages: holds"),
        (dict(tokens=np.array([1, -5, 2, 3, 4], np.int32)), "Experience.tokens: negative token"),
        (dict(id="é" * 241), "Experience.id: 482 bytes, longer than 480"),
    ]
    for kw, match in cases:
        with pytest.raises(ValueError, match=match):
            exp(**kw).validate()
        with pytest.raises(CodecError, match=match):
            encode(exp(**kw))
    exp(teacher_logprobs=np.zeros((3, 4), np.float32)).validate()  # top-k teacher is fine

    g = small_group()
    g.experiences[1].group_id = "other"
    with pytest.raises(ValueError, match=r"experiences\[1\].group_id"):
        g.validate()
    g = small_group()
    g.experiences[1].id = g.experiences[0].id
    with pytest.raises(ValueError, match="duplicate experience id"):
        g.validate()
    g = small_group()
    g.group_id = ""
    for e in g.experiences:
        e.group_id = ""
    with pytest.raises(ValueError, match="ExperienceGroup.group_id: must not be empty"):
        g.validate()
    g = small_group()
    g.experiences[0].id = ""
    with pytest.raises(ValueError, match=r"experiences\[0\].id: must not be empty"):
        g.validate()
    with pytest.raises(ValueError, match="Task.repeat_times"):
        Task(task_id="t", raw={}, workflow="w", repeat_times=0).validate()
    with pytest.raises(ValueError, match="SyncEvent.kind"):
        SyncEvent(kind="", model_version=1).validate()


def test_invalid_payload_is_codec_error_on_decode() -> None:
    env = msgpack.unpackb(encode(small_group()), raw=False, ext_hook=msgpack.ExtType)
    env["payload"]["experiences"][0]["prompt_length"] = 99
    with pytest.raises(CodecError, match=r"experiences\[0\].prompt_length: 99 is outside"):
        decode(msgpack.packb(env))


# ------------------------------------------------------------------------------------------
# Encode refuses exactly what validate() refuses; masks; versions
# ------------------------------------------------------------------------------------------


def bench_group(n_exp: int = 3, tokens: int = 40, prompt: int = 8) -> ExperienceGroup:
    """The hot-path shape: numpy int32 tokens, float32 logprobs/advantages, a bool mask."""
    rng = np.random.default_rng(1)
    r = tokens - prompt
    exps = [
        Experience(
            id=f"g/{i}",
            task_id="t",
            group_id="g",
            run_id="r",
            tokens=rng.integers(0, 1000, tokens, dtype=np.int32),
            prompt_length=prompt,
            logprobs=rng.standard_normal(r, dtype=np.float32),
            action_mask=rng.integers(0, 2, r).astype(bool),
            reward=float(i),
            advantages=np.full(r, 0.5, np.float32),
            model_version=2,
            info={"acc": 1.0, "n": 3, "tag": "x"},
        )
        for i in range(n_exp)
    ]
    return ExperienceGroup(group_id="g", task_id="t", run_id="r", model_version=2, experiences=exps)


def test_decoded_arrays_do_not_alias_a_mutable_buffer() -> None:
    buf = bytearray(encode(bench_group()))
    back = decode(buf, ExperienceGroup)
    before = back.experiences[0].tokens.copy()
    buf[:] = bytes(len(buf))
    assert np.array_equal(back.experiences[0].tokens, before)


def test_long_bool_masks_are_checked_and_normalized() -> None:
    n = 3000
    raw = np.ones(n, np.uint8)
    raw[n - 1] = 2
    mask = np.frombuffer(raw.tobytes(), bool)
    assert decode_array(encode_array(mask)).view(np.uint8).max() == 1
    with pytest.raises(CodecError, match="bytes other than 0 and 1"):
        decode(ext_message(header(b"|b1", (n,)) + raw.tobytes()))
    g = bench_group(n_exp=1, tokens=n + 8, prompt=8)
    g.experiences[0].action_mask = mask
    back = decode(encode(g), ExperienceGroup)
    assert back.experiences[0].action_mask.view(np.uint8).max() == 1


@st.composite
def loose_experiences(draw: Any) -> Experience:
    """Experiences with arrays of random kinds, lengths and ranks: often invalid."""

    def arr(required: bool = False) -> Any:
        if not required and draw(st.booleans()):
            return None
        kind = draw(st.sampled_from(["i4", "u1", "f4", "f2", "?", "c8"]))
        shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=2)))
        a = np.zeros(shape, kind)
        return torch.from_numpy(a) if kind != "u1" and draw(st.booleans()) else a

    chosen = arr()
    return Experience(
        id="e",
        task_id="t",
        group_id="g",
        run_id="r",
        tokens=arr(required=True),
        prompt_length=draw(st.integers(-1, 5)),
        logprobs=arr(),
        action_mask=arr(),
        token_level_reward=arr(),
        advantages=arr(),
        returns=arr(),
        chosen=chosen,
        rejected=arr() if draw(st.booleans()) else chosen,
        teacher_logprobs=arr(),
        model_version=draw(st.integers(-1, 2)),
    )


class _Name(str):
    """A str subclass: valid, written as a plain str."""


@st.composite
def nearly_valid_experiences(draw: Any) -> Experience:
    """Experiences in the hot-path shape with at most one field off: by a length, a dtype, a
    rank, a byte order, a stride or an exact type (valid but not written as is)."""
    r = 6
    f4 = np.arange(r, dtype=np.float32)
    good: dict[str, Any] = dict(
        id="e", tokens=np.arange(10, dtype=np.int32), prompt_length=4, logprobs=f4,
        action_mask=np.ones(r, bool), reward=1.0, advantages=None, chosen=None, rejected=None,
        teacher_logprobs=None, model_version=0, info={"a": 1, "b": "x"},
    )  # fmt: skip
    off: dict[str, list[Any]] = {
        "id": [_Name("e")],
        "tokens": [np.arange(10, dtype=">i4"), np.arange(10.0), np.arange(20, dtype=np.int32)[::2],
                   np.arange(10, dtype=np.int32).reshape(2, 5)],
        "prompt_length": [0, 10, 11, -1],
        "logprobs": [None, f4[:-1], f4.astype(np.int32), f4.reshape(r, 1), torch.from_numpy(f4),
                     f4.astype(">f4"), np.arange(2 * r, dtype=np.float32)[::2]],
        "action_mask": [None, np.ones(r + 1, bool), np.ones(r, np.uint8)],
        "reward": [None, 1, np.float32(1)],
        "advantages": [f4, f4.astype(np.float64), f4.astype(np.float16), f4[:2]],
        "chosen": [np.arange(3)],
        "teacher_logprobs": [f4, np.zeros((r, 2), np.float32), f4[:1]],
        "model_version": [3, -1],
        "info": [{}, {"a": np.float32(1)}, {"a": [1, {"b": 2.0}]}],
    }  # fmt: skip
    name = draw(st.sampled_from([None, *off]))
    if name is not None:
        good[name] = draw(st.sampled_from(off[name]))
        if name == "chosen" and draw(st.booleans()):
            good["rejected"] = np.arange(2)  # a complete DPO pair (valid)
    return Experience(task_id="t", group_id="g", run_id="r", **good)


@settings(max_examples=300, deadline=None, suppress_health_check=_HC)
@given(st.one_of(loose_experiences(), nearly_valid_experiences()), st.data())
def test_encode_refuses_exactly_what_validate_refuses(e: Experience, data: st.DataObject) -> None:
    """On often invalid experiences, alone and in groups (a shared id, a foreign group id, a
    negative version): encode raises CodecError with validate()'s message exactly when
    validate() refuses, never another exception, and what it writes decodes to the same."""
    other = dataclasses.replace(
        e,
        id=data.draw(st.sampled_from(["e", "e2"])),
        group_id=data.draw(st.sampled_from(["g", "h"])),
    )
    g = ExperienceGroup(
        group_id="g",
        task_id="t",
        run_id="r",
        model_version=data.draw(st.integers(-1, 1)),
        experiences=[e, other],
    )
    for obj in (e, g):
        try:
            obj.validate()
            refusal = None
        except ValueError as err:
            refusal = str(err)
        if refusal is None:
            assert same(obj, decode(encode(obj), type(obj)))
        else:
            with pytest.raises(CodecError) as err:
                encode(obj)
            assert str(err.value) == refusal


@pytest.mark.parametrize("n_exp", [1, 3])
def test_bad_bool_bytes_in_a_group_are_refused_and_normalized(n_exp: int) -> None:
    g = bench_group(n_exp=n_exp)
    env = unpacked(g)
    mask = env["payload"]["experiences"][-1]["action_mask"]
    env["payload"]["experiences"][-1]["action_mask"] = msgpack.ExtType(
        mask.code, mask.data[:-1] + b"\x02"
    )
    with pytest.raises(CodecError, match=r"experiences\[\d\].action_mask: .*bytes other than 0"):
        decode(msgpack.packb(env), ExperienceGroup)
    raw = bytearray(g.experiences[-1].action_mask.tobytes())
    raw[0] = 7
    g.experiences[-1].action_mask = np.frombuffer(bytes(raw), bool)
    assert decode(encode(g), ExperienceGroup).experiences[-1].action_mask.view(np.uint8).max() == 1


def unpacked(obj: Any) -> dict[str, Any]:
    return msgpack.unpackb(encode(obj), raw=False, ext_hook=msgpack.ExtType)


def test_arrays_travel_inline_as_documented() -> None:
    """The layout the module docstring promises a non-Python reader, checked byte by byte."""
    env = unpacked(rich_experience())
    assert list(env) == ["schema", "version", "payload"]
    assert env["schema"] == "experience" and env["version"] == SCHEMA_VERSION == 3
    p = env["payload"]
    assert list(p) == [f.name for f in dataclasses.fields(Experience)]
    tokens = p["tokens"]
    assert tokens.code == EXT_NUMPY
    assert tokens.data == header(b"<i4", (7,)) + np.arange(7, dtype="<i4").tobytes()
    assert p["action_mask"].data == header(b"|b1", (3,)) + b"\x01\x00\x01"
    bf16 = p["teacher_logprobs"]
    assert bf16.code == 2 and bf16.data.startswith(b"\x08bfloat16\x01")
    two_d = encode_array(np.zeros((2, 3), ">f8"))  # big-endian in, little-endian out
    assert two_d == b"\x01" + header(b"<f8", (2, 3)) + bytes(48)


def test_version_1_messages_still_decode_and_version_2_says_rerun() -> None:
    """Version 1 has this layout; version 2 (an array table) is refused with advice."""
    g = small_group()
    env = unpacked(g)
    env["version"] = 1
    assert same(g, decode(msgpack.packb(env), ExperienceGroup))
    env["version"] = 2
    env["arrays"] = msgpack.ExtType(3, struct.pack("<IQ", 0, 0))
    with pytest.raises(CodecError, match=r"unsupported version 2 .*older trinity: re-run"):
        decode(msgpack.packb(env))


def test_unknown_fields_are_ignored_and_ext_values_refused_in_plain_data() -> None:
    group = small_group()
    env = unpacked(group)
    env["payload"]["added_later"] = {"x": 1}  # a newer producer's optional field
    assert same(group, decode(msgpack.packb(env), ExperienceGroup))
    env["payload"]["experiences"][0]["info"]["x"] = msgpack.ExtType(1, b"")
    with pytest.raises(CodecError, match=r"experiences\[0\].info.x: expected plain data"):
        decode(msgpack.packb(env))
    env = unpacked(small_group())
    env["payload"]["experiences"][1]["info"]["t"] = msgpack.Timestamp(1)
    with pytest.raises(CodecError, match=r"experiences\[1\].info.t: expected plain data"):
        decode(msgpack.packb(env))
