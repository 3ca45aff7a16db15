"""The tiny model folder loads as a hub model would: ``AutoTokenizer`` (what vLLM, the trainer
and transformers use) gives the ids ``build_tokenizer`` gives, whitespace included."""

from __future__ import annotations

from storage.tiny import TOOL_CHAT_TEMPLATE, build_tiny_model, build_tokenizer

TEXT = 's:tools:{"name": "add"}\nu:964+494=?\na:<tool_call>{"a": 964, "b": 494}</tool_call></s>t:ok \n'


def test_a_saved_tiny_model_keeps_every_space_and_newline(tmp_path):
    from transformers import AutoTokenizer

    out = build_tiny_model(tmp_path / "m", chat_template=TOOL_CHAT_TEMPLATE)
    loaded, built = AutoTokenizer.from_pretrained(out), build_tokenizer()
    ids = loaded(TEXT)["input_ids"]
    assert ids == built(TEXT)["input_ids"]
    assert loaded.decode(ids) == TEXT
    assert len(ids) == len(TEXT) - len("</s>") + 1  # one token per character, eos one token
    msgs = [{"role": "user", "content": "1 + 2"}, {"role": "assistant", "content": "3"}]
    assert loaded.decode(loaded.apply_chat_template(msgs, tokenize=True)["input_ids"]).count(" ") >= 2


def test_extra_characters_get_their_own_tokens_after_the_others(tmp_path):
    """FrozenLake's answers are ```Up``` and its lake has tabs: neither is in CHARS."""
    from transformers import AutoTokenizer

    text = " _ \t G \t\n```Up```"
    plain = build_tokenizer()
    assert plain.unk_token_id in plain(text)["input_ids"]
    out = build_tiny_model(tmp_path / "m", extra_chars="`\t")
    loaded = AutoTokenizer.from_pretrained(out)
    ids = loaded(text)["input_ids"]
    assert loaded.unk_token_id not in ids and len(ids) == len(text) and loaded.decode(ids) == text
    assert len(loaded) == len(plain) + 2 and loaded("a+1")["input_ids"] == plain("a+1")["input_ids"]
