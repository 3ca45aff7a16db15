"""Build the FrozenLake example's model and data offline (a second call is a no-op).

    python examples/frozen_lake/prepare.py [--out examples/frozen_lake/_build] [--force]

The game is upstream's ``frozen_lake_workflow`` unchanged (gymnasium's FrozenLake, its lakes
drawn from each row's ``size``/``p``/``seed``, its observation text and ```` ```Up``` ````
answers), on small lakes: 3x3 and 4x4, mostly frozen (``p`` 0.75-0.9), not slippery.

What it writes under ``--out``:

* ``model/``: the tiny random-weight Qwen2 of ``storage/tiny.py``, 4,096 positions (an
  episode is ~700 characters, one token each; 8 turns with "invalid move" hints ~3,000), its
  characters and the two upstream's game writes: the backtick of ```` ```Up``` ```` and the
  tab between the lake's cells.
* ``data/train.jsonl`` (2,000 rows) and ``data/test.jsonl`` (64 other seeds), the columns of
  upstream's ``get_frozen_lake_data.py`` (``seed``, ``size``, ``p``).
* ``sft/train.jsonl``: episodes of a weak teacher as conversations, rendered by the workflow's
  own functions: at each turn it takes a shortest safe path's next move 3 times in 5 and a
  random move otherwise (a wall or a hole too).

Why: after the warm-up the model reads the lake and answers in the format, as well as its
teacher; GRPO on whole episodes (one experience each) moves it toward the shortest path.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # run from anywhere in a checkout

SEED, N_TRAIN, N_TEST, DEMOS = 0, 2000, 64, 3000
SIZES, P_RANGE, ENV_MAX_STEPS, AGENT_MAX_STEPS = (3, 4), (0.75, 0.9), 6, 8
#: The system prompt (``workflow_args.system_prompt``): the tiny model reads no English.
SYSTEM = "lake"
MOVES = {"Left": (0, -1), "Down": (1, 0), "Right": (0, 1), "Up": (-1, 0)}


def rows(n: int, rng: random.Random) -> list[dict]:
    return [{"seed": rng.randrange(100_000), "size": rng.choice(SIZES), "p": round(rng.uniform(*P_RANGE), 3)}
            for _ in range(n)]


def best_move(desc: list[str], pos: tuple[int, int]) -> str:
    """The first move of a shortest path from ``pos`` to G that steps on no hole."""
    n = len(desc)
    first: dict[tuple[int, int], str | None] = {pos: None}
    todo = deque([pos])
    while todo:
        r, c = todo.popleft()
        if desc[r][c] == "G":
            return first[(r, c)] or "Up"
        for name, (dr, dc) in MOVES.items():
            nxt = (r + dr, c + dc)
            if 0 <= nxt[0] < n and 0 <= nxt[1] < n and nxt not in first and desc[nxt[0]][nxt[1]] != "H":
                first[nxt] = first[(r, c)] or name
                todo.append(nxt)
    raise ValueError(f"no path to G on {desc}")


def teacher_episode(row: dict, rng: random.Random) -> dict:
    """One episode of the weak teacher, as the workflow would record it."""
    from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

    from roles.explorer.workflows.frozen_lake import (
        ACTIONS,
        TO_GYM,
        random_lake,
        render_lake,
        user_turn,
    )

    desc = random_lake(row["size"], row["p"], row["seed"], ENV_MAX_STEPS)
    env = FrozenLakeEnv(desc=desc, is_slippery=False)
    env.reset(seed=row["seed"])
    msgs = [{"role": "system", "content": SYSTEM}]
    obs, last = render_lake(desc, int(env.s)), None
    for step in range(AGENT_MAX_STEPS):
        msgs.append({"role": "user", "content": user_turn(step, obs, last == obs, AGENT_MAX_STEPS)})
        pos = divmod(int(env.s), len(desc))
        move = best_move(desc, pos) if rng.random() < 0.6 else rng.choice(list(MOVES))
        msgs.append({"role": "assistant", "content": f"```{move}```"})
        _, _, done, _, _ = env.step(TO_GYM[ACTIONS[move.lower()]])
        last, obs = obs, render_lake(desc, int(env.s))
        if done:
            break
    return {"messages": msgs}


def prepare(out: Path, force: bool = False, seed: int = SEED) -> Path:
    """Write the assets under ``out``; ``seed`` draws the model's initial weights (the data
    stay the same for every seed, so figures over seeds compare like with like)."""
    from storage.datafiles import write_jsonl
    from storage.tiny import build_tiny_model

    done = out / ".complete"
    if done.exists() and not force:
        print(f"FrozenLake assets already in {out}")
        return out
    build_tiny_model(out / "model", seed=seed, max_position_embeddings=4096, extra_chars="`\t")
    rng = random.Random(SEED)
    train, test = rows(N_TRAIN, rng), rows(N_TEST, rng)
    demos = [teacher_episode(r, rng) for r in rows(DEMOS, rng)]
    for path, data in (("data/train", train), ("data/test", test), ("sft/train", demos)):
        write_jsonl(out / f"{path}.jsonl", data)
    done.write_text("ok\n")
    print(f"FrozenLake assets written to {out}")
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "_build"))
    ap.add_argument("--force", action="store_true", help="rebuild even if present")
    ap.add_argument("--seed", type=int, default=SEED, help="seed of the model's initial weights")
    a = ap.parse_args()
    prepare(Path(a.out), a.force, a.seed)
