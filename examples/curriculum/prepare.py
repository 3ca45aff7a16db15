"""Build the curriculum example's assets: the quickstart's, with each sum's difficulty.

    python examples/curriculum/prepare.py [--out examples/curriculum/_build] [--seed 0]

The quickstart's model, SFT demonstrations and sums (``examples/quickstart/prepare.py``), and
a ``carry`` column on the training sums (1 when the ones digits carry): after the warm-up the
sums without a carry are solved (pass rate ~1, a GRPO group of them teaches nothing) and
those with a carry are not, so which sums a step trains on decides how much it can learn.
``difficulty_based`` pools its pass-rate estimates by that column: a sum never drawn yet
starts from what its level's sums scored.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from anywhere in a checkout

from examples.quickstart.prepare import SEED, prepare  # noqa: E402


def with_carry(rows: list[dict]) -> list[dict]:
    """Each ``a+b=?`` row with ``carry``: 1 when ``a``'s ones digit plus ``b`` is 10 or more."""
    out = []
    for r in rows:
        a, b = (int(x) for x in r["question"][:-2].split("+"))
        out.append(r | {"carry": int(a % 10 + b >= 10)})
    return out


def prepare_curriculum(out: Path, force: bool = False, seed: int = SEED) -> Path:
    from storage.datafiles import load_rows, resolve_data_files, write_jsonl

    done = out / ".curriculum"
    if done.exists() and not force:
        print(f"curriculum assets already in {out}")
        return out
    prepare(out, force, seed)
    train = resolve_data_files(str(out / "data"), None, "train")
    write_jsonl(out / "data" / "train.jsonl", with_carry(load_rows(train, []).rows))
    done.write_text("ok\n")
    print(f"curriculum assets written to {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "_build"))
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    ap.add_argument("--seed", type=int, default=SEED, help="seed of the model's initial weights")
    a = ap.parse_args()
    prepare_curriculum(Path(a.out), a.force, a.seed)
