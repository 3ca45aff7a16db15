"""Trinity-RFT's ``frozen_lake_workflow``: an agent walks gymnasium's FrozenLake, one
conversation (concatenated multi-turn) per episode.

Faithful to upstream's (``trinity/common/workflows/envs/frozen_lake``, itself after rLLM's):

* **the lake**: each task row gives ``size``, ``p`` (the chance a tile is frozen) and ``seed``;
  the map is drawn from ``seed`` with the same random calls in the same order, so a row makes
  the same lake here as there, and redrawn until a search from S finds G within
  ``env_max_steps`` (upstream's depth-first search, quirks included: it can reject a map
  whose only short path it reaches late). ``workflow_args.desc`` gives a fixed map instead.
* **the rules**: gymnasium's ``FrozenLakeEnv`` itself (``is_slippery``: a move goes sideways
  2 times in 3), reset with the row's seed.
* **what the model sees**: upstream's system prompt, then each turn
  ``Current Observation (k):`` and the grid (`` P \\t`` player, `` _ \\t`` frozen, `` O \\t``
  hole, `` G \\t`` goal), a hint when the last move changed nothing, and the steps left.
* **what it must answer**: the last ```` ```...``` ```` block, ``Up``/``Down``/``Left``/``Right``
  (any case) or 1-4; anything else is no move.
* **the end**: the goal (reward 1) or a hole (0) ends the episode; so do ``agent_max_steps``
  turns, or the response budget (``max_tokens``: every assistant and user token after the
  first prompt counts against it), which flags the experience ``response_truncated``.

Ours besides: ``workflow_args.system_prompt`` replaces upstream's (a tiny model that reads no
English gains nothing from 1,400 characters of it).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from roles.explorer.workflows.multi_turn import MultiTurnWorkflow
from schemas.data import Experience

#: Upstream's system prompt, word for word (its example's model was trained on it).
SYSTEM_PROMPT = """You are Qwen, created by Alibaba Cloud. You are a helpful assistant. You are walking on a frozen lake.

FrozenLake Quick Guide
Goal: Reach the goal (G). Player (P) and Goal (G) must overlap.

Symbols:
_ Frozen | O Hole | G Goal | P Player

Rules:
1. Avoid falling into holes (O).
2. Frozen tiles are slippery, you may move perpendicular to your intended direction.

Valid Action (separated by | ):
Up | Down | Left | Right

Rewards:
Fall into hole: 0
Reach goal: +1.0

You will be provided the current observation, please decide on the next Action.
You should show your thought process and then input the final action in ``` ```.
You should only output the NEXT ACTION at each interation in the ``` ```. For example, if you want to move up, you should output ```Up```.
You should plan ahead and need to achieve it in minimum number of steps.
You should be aware that frozen tiles can be slippery, but the chance is small and you should not overthink it.

Please show your thinking process and put the final action in ``` ```. In every turn, the final action MUST be one of Up, Down, Left, Right.
"""

INVALID_HINT = (
    "\nYour last response is invalid. Your position didn't change at all. You may need to "
    "recheck your thinking process, action outputted, and the format of response. Remember, "
    "you should only output the NEXT ACTION at each interation in the ``` ```. For example, if "
    "you want to move up, you should output ```Up```."
)

#: The model's actions (upstream numbers them 1-4) -> gymnasium's (0 left, 1 down, 2 right, 3 up).
ACTIONS = {"left": 1, "down": 2, "right": 3, "up": 4}
TO_GYM = {1: 0, 2: 1, 3: 2, 4: 3}
#: A rendered cell: player, frozen, hole, goal (the start renders as frozen).
CELLS = {"P": " P \t", "F": " _ \t", "S": " _ \t", "H": " O \t", "G": " G \t"}


def parse_action(response: str) -> int:
    """The action (1-4) in the response's last ```` ```...``` ```` block, 0 when there is none."""
    blocks = re.findall(r"```(.*?)```", response, re.DOTALL)
    if not blocks:
        return 0
    text = blocks[-1].strip().lower()
    if text in ACTIONS:
        return ACTIONS[text]
    return int(text) if text.isdigit() and int(text) in ACTIONS.values() else 0


def reaches_goal(board: list[list[str]], max_steps: int) -> bool:
    """Upstream's validity check, the same depth-first search: a stack of (row, col, steps)
    from S, each cell expanded once, G found as a neighbour of a cell within ``max_steps``."""
    size = len(board)
    start = next((r, c) for r in range(size) for c in range(size) if board[r][c] == "S")
    stack, seen = [(start[0], start[1], 0)], set()
    while stack:
        r, c, steps = stack.pop()
        if steps > max_steps or (r, c) in seen:
            continue
        seen.add((r, c))
        for dr, dc in ((1, 0), (0, 1), (-1, 0), (0, -1)):
            nr, nc = r + dr, c + dc
            if not (0 <= nr < size and 0 <= nc < size):
                continue
            if board[nr][nc] == "G":
                return True
            if board[nr][nc] != "H":
                stack.append((nr, nc, steps + 1))
    return False


def random_lake(size: int, p: float, seed: int, max_steps: int) -> list[str]:
    """A ``size`` x ``size`` lake whose goal S reaches within ``max_steps``: upstream's draws
    from ``numpy.random.default_rng(seed)`` (what gymnasium's ``seeding.np_random`` makes)."""
    rng = np.random.default_rng(seed)
    p = min(1.0, p)
    while True:
        board = rng.choice(["F", "H"], (size, size), p=[p, 1 - p]).tolist()
        while True:
            sr, sc, gr, gc = (int(rng.integers(0, size)) for _ in range(4))
            if (sr, sc) != (gr, gc):
                break
        board[sr][sc], board[gr][gc] = "S", "G"
        if reaches_goal(board, max_steps):
            return ["".join(row) for row in board]


def render_lake(desc: list[str], state: int) -> str:
    """The grid as upstream renders it (``tiny_rgb_array``), the player (state ``row * ncol +
    col``, gymnasium's) as ``P``."""
    here = divmod(state, len(desc[0]))
    return "\n".join("".join(CELLS["P" if (r, c) == here else cell] for c, cell in enumerate(row))
                     for r, row in enumerate(desc))


def user_turn(step: int, obs: str, unchanged: bool, max_steps: int) -> str:
    """What the model is told before its ``step``-th move (``unchanged``: its last move left
    the observation as it was)."""
    text = (f"Current Observation ({step}): \n{obs}\nYou have not achieved the goal, "
            "P has not reached G yet. Please give the next action.")
    if step > 0 and unchanged:
        text += INVALID_HINT
    return text + f"\nThe maximum number of steps remaining is {max_steps - step}."


class FrozenLakeWorkflow(MultiTurnWorkflow):
    """One episode on the task row's lake (see the module's docstring)."""

    is_async = True
    reads_prompt = False  # the row holds a lake (seed, size, p), the prompt is the workflow's

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        try:
            from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv
        except ImportError as e:
            raise ImportError(
                "frozen_lake_workflow needs gymnasium: pip install 'gymnasium>=1.0' "
                "(or this project's [envs] extra)"
            ) from e
        args, raw = self.args, self.task.raw
        self.agent_max_steps = int(args.get("agent_max_steps", 10))
        self.system_prompt = str(args.get("system_prompt", SYSTEM_PROMPT))
        self.seed = int(raw.get("seed", 42))
        desc = args.get("desc") or random_lake(
            int(raw.get("size", 1)), float(raw.get("p", 0.8)), self.seed, int(args.get("env_max_steps", 8)))
        self.desc = [str(row) for row in desc]
        self.env = FrozenLakeEnv(desc=self.desc, is_slippery=bool(args.get("is_slippery", False)))

    def observation(self) -> str:
        """The grid as upstream renders it, the player where the environment has it."""
        return render_lake(self.desc, int(self.env.s))

    def move(self, action: int) -> tuple[float, bool]:
        """One environment step for a model action (0: no move); (reward, episode over)."""
        if action not in TO_GYM:
            return 0.0, False
        _, reward, terminated, _, _ = self.env.step(TO_GYM[action])
        return float(reward), bool(terminated)

    def budget(self) -> int:
        """Tokens the whole episode may generate (upstream's ``max_response_tokens``)."""
        limits = getattr(self.model.engine, "limits", None)
        return int(self.rollout_args.get("max_tokens") or getattr(limits, "max_response_tokens", None) or 10240)

    async def run_async(self) -> list[Experience]:
        self.env.reset(seed=self.seed)
        render = self.model.engine.apply_chat_template
        messages: list[dict[str, Any]] = [{"role": "system", "content": self.system_prompt}]
        budget, first_len = self.budget(), None
        rewards: list[float] = []
        obs, last_obs, done, truncated, calls = self.observation(), None, False, False, []
        for step in range(self.agent_max_steps):
            messages.append({"role": "user", "content": user_turn(step, obs, last_obs == obs, self.agent_max_steps)})
            n = len(render(messages, True))
            first_len = n if first_len is None else first_len
            left = budget - (n - first_len)
            limit = getattr(getattr(self.model.engine, "limits", None), "max_model_len", None)
            left = left if limit is None else min(left, limit - n)  # (ours: upstream's engine errs)
            if left <= 0:  # the episode's responses (and the observations between) used it up
                messages.pop()
                rewards.append(0.0)
                truncated = True
                break
            out = await self.model.achat(messages, n=1, **{**self.rollout_args, "max_tokens": left})
            calls.append(out[0])
            reply = out[0].response_text or ""
            messages.append({"role": "assistant", "content": reply})
            reward, done = self.move(parse_action(reply))
            rewards.append(reward)
            last_obs, obs = obs, self.observation()
            if done:
                break
        exp = self.conversation_experience(
            messages, reward=float(sum(rewards)), turn_experiences=calls,
            info={"env_steps": len(rewards) - truncated, "env_done": int(done), "test_score": float(sum(rewards))})
        exp.response_truncated = exp.response_truncated or truncated
        return [exp]
