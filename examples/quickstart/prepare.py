"""Build the quickstart's model and data offline (first use only; a second call is a no-op).

    python examples/quickstart/prepare.py [--out examples/quickstart/_build] [--force]

What it writes under ``--out``:

* ``model/``: a random-weight Qwen2 (hidden 128, 2 layers, ~0.3M parameters) with the
  character tokenizer of ``storage/tiny.py``: nothing is downloaded.
* ``data/train.jsonl`` (700 rows) and ``data/test.jsonl`` (200 rows, disjoint questions):
  two-digit plus one-digit additions, ``{"question": "47+8=?", "answer": "55"}``.

Why this task: a model this small cannot memorise 900 sums from a few hundred SFT steps, but
it learns the answer format and the easy cases, leaving sums whose carry it gets wrong often
enough that sampled rollouts contain both right and wrong answers. That is what GRPO needs to
learn from, and what makes its gain over the SFT warmup visible within minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from anywhere in a checkout

N_TRAIN, N_TEST, SEED = 700, 200, 0


def addition_rows(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """All 900 sums ``a + b`` (a in 10..99, b in 0..9), shuffled, split into train/test."""
    rows = [{"question": f"{a}+{b}=?", "answer": str(a + b)} for a in range(10, 100) for b in range(10)]
    random.Random(seed).shuffle(rows)
    return rows[:N_TRAIN], rows[N_TRAIN:N_TRAIN + N_TEST]


def prepare(out: Path, force: bool = False) -> Path:
    from storage.tiny import build_tiny_model

    done = out / ".complete"
    if done.exists() and not force:
        print(f"quickstart assets already in {out}")
        return out
    build_tiny_model(out / "model", seed=SEED, hidden_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
                     max_position_embeddings=64)
    train, test = addition_rows()
    (out / "data").mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("test", test)):
        with open(out / "data" / f"{name}.jsonl", "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    done.write_text("ok\n")
    print(f"quickstart assets written to {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "_build"))
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    a = ap.parse_args()
    prepare(Path(a.out), a.force)
