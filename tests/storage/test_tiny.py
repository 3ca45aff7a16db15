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
