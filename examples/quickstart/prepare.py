"""Build the quickstart's model and data offline (first use only; a second call is a no-op).

    python examples/quickstart/prepare.py [--out examples/quickstart/_build] [--force]

What it writes under ``--out``:

* ``model/``: a random-weight Qwen2 (hidden 128, 2 layers, ~0.3M parameters) with the
  character tokenizer of ``storage/tiny.py``: nothing is downloaded.
* ``data/train.jsonl`` (700 rows) and ``data/test.jsonl`` (200 rows, disjoint questions):
  two-digit plus one-digit additions, ``{"question": "47+8=?", "answer": "55"}``.
* ``sft/train.jsonl``: the SFT warmup's demonstrations of the 700 training sums, written by
  a deliberately weak teacher that forgets the carry 3 times out of 5 (each training sum
  appears 5 times; for sums with a carry, 3 of the 5 answers are off by ten: ``47+8=45``).

Why an imperfect teacher: that is the situation RL with a verifiable reward is for. The SFT
warmup learns the answer format and the easy sums, and learns to drop the carry more often
than not, so its greedy answer to a carry sum is usually wrong while its samples are often
right. GRPO's 0/1 reward tells the two apart and moves the model to the right answer: a gain
over the warmup that is visible within minutes on a CPU. Without the weak teacher the warmup
either stops short of learning addition or learns it so well there is little left to gain,
and where it ends depends on the seed (measured, see NOTES.md).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from anywhere in a checkout

N_TRAIN, N_TEST, SEED = 700, 200, 0
#: Of the 5 demonstrations of a sum with a carry, how many forget it.
FORGOTTEN, COPIES = 3, 5


def addition_rows(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    """All 900 sums ``a + b`` (a in 10..99, b in 0..9), shuffled, split into train/test."""
    rows = [{"question": f"{a}+{b}=?", "answer": str(a + b)} for a in range(10, 100) for b in range(10)]
    random.Random(seed).shuffle(rows)
    return rows[:N_TRAIN], rows[N_TRAIN:N_TRAIN + N_TEST]


def weak_teacher(rows: list[dict]) -> list[dict]:
    """``COPIES`` demonstrations per sum; for a sum with a carry ``FORGOTTEN`` of them drop it."""
    out = []
    for r in rows:
        a, b = (int(x) for x in r["question"][:-2].split("+"))
        carry = a % 10 + b >= 10
        for i in range(COPIES):
            answer = a + b - 10 if carry and i < FORGOTTEN else a + b
            out.append({"question": r["question"], "answer": str(answer)})
    random.Random(SEED + 1).shuffle(out)
    return out


def prepare(out: Path, force: bool = False, seed: int = SEED) -> Path:
    """Write the assets under ``out``; ``seed`` draws the model's initial weights (the data
    stay the same for every seed, so figures over seeds compare like with like)."""
    from storage.datafiles import write_jsonl
    from storage.tiny import build_tiny_model

    done = out / ".complete"
    if done.exists() and not force:
        print(f"quickstart assets already in {out}")
        return out
    build_tiny_model(out / "model", seed=seed, hidden_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, intermediate_size=256,
                     max_position_embeddings=64)
    train, test = addition_rows()
    for path, rows in (("data/train", train), ("data/test", test), ("sft/train", weak_teacher(train))):
        write_jsonl(out / f"{path}.jsonl", rows)
    done.write_text("ok\n")
    print(f"quickstart assets written to {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "_build"))
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    ap.add_argument("--seed", type=int, default=SEED, help="seed of the model's initial weights")
    a = ap.parse_args()
    prepare(Path(a.out), a.force, a.seed)
