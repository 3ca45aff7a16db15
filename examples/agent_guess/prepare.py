"""Build the guessing-game agent example's model and data offline (a second call is a no-op).

    python examples/agent_guess/prepare.py [--out examples/agent_guess/_build] [--force]

The game: find a secret number in 1..7 with at most 3 calls of the ``guess`` tool, which
answers "correct" (the episode ends) or "higher"/"lower" with the range left, e.g.
"higher: 5-7". Reward 1 for finding it. Halving the range every time always wins; other
splits lose some numbers. The range in the answer makes the game Markov: the model needs
to read the last tool message, not to remember its earlier guesses, which a 0.3M-parameter
model does not do (it played "higher" after 4 and after 8 alike when told only "higher").

What it writes under ``--out``:

* ``model/``: the tiny random-weight Qwen2 of ``storage/tiny.py`` with the tool-calling chat
  template (``TOOL_CHAT_TEMPLATE``), 512 positions (a 4-turn game is ~470 tokens).
* ``data/train.jsonl`` (600 games, random secrets), ``data/test.jsonl`` (every secret once).
* ``sft/train.jsonl``: games played by a weak teacher that, at each guess, tries the
  smallest number still possible 3 times in 5 (and halves the range otherwise): its greedy
  policy, counting up, finds 3 of the 7 secrets; halving finds all 7.

Why: after the warm-up the model plays the game (tool calls, reading the answers), its
greedy play is the teacher's majority (counting up), and its samples sometimes halve;
step-wise GRPO (every guess one experience, the game's reward on each) moves it to
halving. What did not learn (2026-11-24): 1..15 in 4 guesses, where the model did not learn
to read two-digit ranges from 3000 demonstrations, and a teacher splitting at the quarter
instead of counting up, whose games RL can barely tell apart (halving first wins 78% of
them, the quarter 69%).
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from anywhere in a checkout

HIGH, TURNS, N_TRAIN, DEMOS, SEED = 7, 3, 600, 3000, 0
QUESTION = f"1-{HIGH}?"
GUESS_TOOL = {"type": "function", "function": {
    "name": "guess", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}}


def teacher_game(secret: int, rng: random.Random) -> dict:
    """One game of the weak teacher as a conversation with tool calls."""
    lo, hi = 1, HIGH
    msgs: list[dict] = [{"role": "user", "content": QUESTION}]
    for t in range(TURNS):
        g = lo if rng.random() < 0.6 else (lo + hi) // 2
        call = {"id": f"c{t}", "type": "function", "function": {"name": "guess", "arguments": {"n": g}}}
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        if g == secret:
            msgs.append({"role": "tool", "tool_call_id": f"c{t}", "content": "correct"})
            break
        lo, hi = (g + 1, hi) if secret > g else (lo, g - 1)
        result = f"{'higher' if secret > g else 'lower'}: {lo}-{hi}"
        msgs.append({"role": "tool", "tool_call_id": f"c{t}", "content": result})
    return {"messages": msgs, "tools": [GUESS_TOOL]}


def prepare(out: Path, force: bool = False, seed: int = SEED) -> Path:
    """Write the assets under ``out``; ``seed`` draws the model's initial weights (the data
    stay the same for every seed, so figures over seeds compare like with like)."""
    from storage.datafiles import write_jsonl
    from storage.tiny import TOOL_CHAT_TEMPLATE, build_tiny_model

    done = out / ".complete"
    if done.exists() and not force:
        print(f"guessing-game assets already in {out}")
        return out
    build_tiny_model(out / "model", seed=seed, max_position_embeddings=512, chat_template=TOOL_CHAT_TEMPLATE)
    rng = random.Random(SEED)
    train = [{"question": QUESTION, "secret": rng.randint(1, HIGH)} for _ in range(N_TRAIN)]
    test = [{"question": QUESTION, "secret": s} for s in range(1, HIGH + 1)]
    demos = [teacher_game(rng.randint(1, HIGH), rng) for _ in range(DEMOS)]
    for path, rows in (("data/train", train), ("data/test", test), ("sft/train", demos)):
        write_jsonl(out / f"{path}.jsonl", rows)
    done.write_text("ok\n")
    print(f"guessing-game assets written to {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "_build"))
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    ap.add_argument("--seed", type=int, default=SEED, help="seed of the model's initial weights")
    a = ap.parse_args()
    prepare(Path(a.out), a.force, a.seed)
