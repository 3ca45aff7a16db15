"""``docs/protocol.md`` is generated from the code (``roles/tools/protocol_doc.py``): it must be what
the code generates now, so a change to the wire comes with its page."""

from __future__ import annotations

from roles.tools.protocol_doc import PAGE, render


def test_protocol_page_is_generated_from_the_code():
    assert PAGE.read_text() == render(), "docs/protocol.md is stale: run `python -m roles.tools.protocol_doc`"


def test_the_page_names_every_stream_rpc_and_key():
    from bus.subjects import KINDS
    from schemas import keys
    from schemas.rpc import RPCS

    page = render()
    assert all(f"trinity.<run>.{k}`" in page for k in KINDS)
    assert all(f"trinity.<run>.rpc.{name}`" in page for name, *_ in RPCS)
    # every key constant of schemas/keys.py is in the table (families by their prefix)
    names = [v for k, v in vars(keys).items() if k.isupper() and isinstance(v, str)]
    listed = [k.name for k in keys.KEYS]
    missing = [v for v in names if not any(row.startswith(v) for row in listed)]
    assert not missing, f"keys without a row in schemas.keys.KEYS: {missing}"


def test_every_kv_key_holds_a_record_of_schemas_state():
    from schemas.keys import KEYS
    from schemas.state import RECORDS

    assert {k.record for k in KEYS} == set(RECORDS), "a KV record no key holds, or a key whose record is not in RECORDS"
