"""Build the calculator agent example's model and data offline (a second call is a no-op).

    python examples/agent_calculator/prepare.py [--out examples/agent_calculator/_build] [--force]

What it writes under ``--out``:

* ``model/``: the tiny random-weight Qwen2 of ``storage/tiny.py`` with the tool-calling chat
  template (``TOOL_CHAT_TEMPLATE``: tools in a system line, ``<tool_call>{json}</tool_call>``,
  tool results in ``t:<tool_response>...`` turns).
* ``data/train.jsonl`` (2000 rows), ``data/test.jsonl`` (200, disjoint): three-digit sums
  ``{"question": "482+396=?", "answer": "878"}``, beyond what the tiny model can add in its
  head, easy with the ``add`` tool.
* ``sft/train.jsonl``: demonstrations of the agent's conversation (question, tool call, tool
  result, answer) by a weak teacher that miscopies: for 3 of its 5 demonstrations of a sum it
  swaps the last two digits of ``b`` in the tool call (then answers with the tool's, wrong,
  result).

Why a weak teacher (as in the quickstart): after the warm-up the model uses the tool and
answers with its result, but its greedy copy of ``b`` is usually the swapped one, while its
samples are often right; the 0/1 reward tells them apart and RL fixes the copy.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from anywhere in a checkout

N_TRAIN, N_TEST, SEED = 2000, 200, 0
MISCOPIED, COPIES = 3, 5
ADD_TOOL = {"type": "function", "function": {
    "name": "add",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}


def sums(seed: int = SEED) -> tuple[list[dict], list[dict]]:
    rng = random.Random(seed)
    seen, rows = set(), []
    while len(rows) < N_TRAIN + N_TEST:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        if (a, b) not in seen:
            seen.add((a, b))
            rows.append({"question": f"{a}+{b}=?", "answer": str(a + b)})
    return rows[:N_TRAIN], rows[N_TRAIN:]


def miscopy(b: int) -> int:
    """``b`` with its last two digits swapped (the weak teacher's mistake)."""
    s = str(b)
    return int(s[:-2] + s[-1] + s[-2])


def demonstration(question: str, b_used: int) -> dict:
    a, b = (int(x) for x in question[:-2].split("+"))
    result = str(a + b_used)
    call = {"id": "c0", "type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b_used}}}
    return {"messages": [{"role": "user", "content": question},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c0", "content": result},
                         {"role": "assistant", "content": result}],
            "tools": [ADD_TOOL]}


def weak_teacher(rows: list[dict]) -> list[dict]:
    out = []
    for r in rows:
        b = int(r["question"][:-2].split("+")[1])
        for i in range(COPIES):
            out.append(demonstration(r["question"], miscopy(b) if i < MISCOPIED else b))
    random.Random(SEED + 1).shuffle(out)
    return out


def prepare(out: Path, force: bool = False, seed: int = SEED) -> Path:
    """Write the assets under ``out``; ``seed`` draws the model's initial weights (the data
    stay the same for every seed, so figures over seeds compare like with like)."""
    from storage.datafiles import write_jsonl
    from storage.tiny import TOOL_CHAT_TEMPLATE, build_tiny_model

    done = out / ".complete"
    if done.exists() and not force:
        print(f"calculator assets already in {out}")
        return out
    build_tiny_model(out / "model", seed=seed, max_position_embeddings=384, chat_template=TOOL_CHAT_TEMPLATE)
    train, test = sums()
    for path, rows in (("data/train", train), ("data/test", test), ("sft/train", weak_teacher(train))):
        write_jsonl(out / f"{path}.jsonl", rows)
    done.write_text("ok\n")
    print(f"calculator assets written to {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "_build"))
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    ap.add_argument("--seed", type=int, default=SEED, help="seed of the model's initial weights")
    a = ap.parse_args()
    prepare(Path(a.out), a.force, a.seed)
