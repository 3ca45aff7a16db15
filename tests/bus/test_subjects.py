"""Names must be valid for NATS and JetStream and never collide across runs."""

import pytest

from bus.subjects import KINDS, names


def test_names_of_a_run() -> None:
    n = names("proj.exp-1")
    assert n.exp == "trinity.proj.exp-1.exp"
    assert n.dlq == "trinity.proj.exp-1.dlq"
    assert n.rpc("batch") == "trinity.proj.exp-1.rpc.batch"
    assert n.stream("exp") == "TRINITY_proj_exp-1_EXP"
    assert n.kv_bucket == "trinity_proj_exp-1"
    assert [n.kind_of_stream(n.stream(k)) for k in KINDS] == list(KINDS)
    assert n.kind_of_stream("OTHER") is None


@pytest.mark.parametrize("bad", ["", "a..b", "a.*", "a.>", "a b", ".a", "a.", "a/b"])
def test_bad_run_ids_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="run id"):
        names(bad)


def test_bad_rpc_and_kind() -> None:
    with pytest.raises(ValueError):
        names("a.b").rpc("x.y")
    with pytest.raises(ValueError):
        names("a.b").subject("nope")


def test_streams_keep_case() -> None:
    # Folding case would let two runs share (and rewrite) one stream.
    assert names("P.n").stream("exp") != names("p.n").stream("exp")
