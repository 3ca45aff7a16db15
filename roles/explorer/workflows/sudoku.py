"""Trinity-RFT's ``sudoku_workflow``: the model fills a 9x9 Sudoku a few cells a step, each step
its own experience with its own reward.

Faithful to upstream's (``trinity/common/workflows/envs/sudoku``):

* **the board**: the row's ``puzzle`` and ``solution`` (9 lists of 9 ints, 0 for empty); a row
  without them gets a fresh puzzle, a solved board with half its cells (40) emptied. Upstream
  draws that one from Python's global random state; here from the row's ``seed`` column (else
  its task id), so a rerun sees the same puzzles.
* **a step**: one single-turn chat with upstream's prompt (the rules, the step count, the
  board, a hint when the last step changed nothing); the reply is 1 to 5 lines of
  ``row col value`` (0-based row and column, value 1-9).
* **the end and the rewards**: a reply that does not parse, fills a cell that is not empty,
  or breaks a row, column or 3x3 block ends the episode with reward -1 for that step; the
  solved board ends it with 1; any other step gets 0; at most 20 steps. Every step's reward is
  its own (upstream's), so the algorithm decides how steps share credit (``multi_step_grpo``;
  ``gigpo`` also compares the steps taken from one board: ``info["env_state_hash"]``, ours).
"""

from __future__ import annotations

import random
import zlib
from typing import Any

from roles.explorer.workflows.base import Workflow
from schemas.data import Experience

SIZE, BLOCK = 9, 3
MAX_STEPS, MAX_MOVES = 20, 5

Board = list[list[int]]


def valid(board: Board) -> bool:
    """No value twice in a row, a column or a block (0 is empty and may repeat)."""
    lines = [list(row) for row in board] + [list(col) for col in zip(*board, strict=True)]
    lines += [[board[r][c] for r in range(br, br + BLOCK) for c in range(bc, bc + BLOCK)]
              for br in range(0, SIZE, BLOCK) for bc in range(0, SIZE, BLOCK)]
    for line in lines:
        filled = [v for v in line if v]
        if len(filled) != len(set(filled)):
            return False
    return True


def _fill(board: Board, rng: random.Random) -> bool:
    """Complete ``board`` in place by backtracking over shuffled values; False if it cannot."""
    empty = next(((r, c) for r in range(SIZE) for c in range(SIZE) if board[r][c] == 0), None)
    if empty is None:
        return True
    r, c = empty
    for v in rng.sample(range(1, SIZE + 1), SIZE):
        board[r][c] = v
        if valid(board) and _fill(board, rng):
            return True
    board[r][c] = 0
    return False


def new_puzzle(seed: int, holes: int = SIZE * SIZE // 2) -> tuple[Board, Board]:
    """(puzzle, solution): a random solved board, then ``holes`` random cells emptied."""
    rng = random.Random(seed)
    solution = [[0] * SIZE for _ in range(SIZE)]
    _fill(solution, rng)
    puzzle = [row[:] for row in solution]
    for i in rng.sample(range(SIZE * SIZE), holes):
        puzzle[i // SIZE][i % SIZE] = 0
    return puzzle, solution


def parse_moves(text: str) -> list[tuple[int, int, int]] | None:
    """The reply's ``row col value`` lines; None when any non-empty line is not one, a number is
    out of range, or there are none or more than :data:`MAX_MOVES`."""
    moves = []
    for line in text.strip().splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            r, c, v = (int(p) for p in parts) if len(parts) == 3 else (None, None, None)
        except ValueError:
            return None
        if r is None or not (0 <= r < SIZE and 0 <= c < SIZE and 1 <= v <= SIZE):
            return None
        moves.append((r, c, v))
    return moves if 0 < len(moves) <= MAX_MOVES else None


def prompt(board: Board, step: int, stuck: bool) -> str:
    """Upstream's step prompt, word for word."""
    text = ("You are playing a Sudoku game.\n\n"
            "Rules:\n"
            "- The board is 9x9.\n"
            "- 0 means empty.\n"
            "- Numbers 1–9 must appear exactly once in every row, column, and 3x3 block.\n"
            "- You may only fill empty cells.\n\n"
            "Task:\n"
            "- In each step, output ONE OR MORE valid moves.\n"
            f"- You may output up to {MAX_MOVES} moves per step.\n\n"
            "Output format (STRICT):\n"
            "row col value\n"
            "row col value\n\n"
            "Example:\n"
            "0 2 4\n"
            "1 3 5\n\n"
            f"Current step: {step}\n"
            f"Remaining steps: {MAX_STEPS - step}\n\n"
            "Current board:\n" + "\n".join(" ".join(str(v) for v in row) for row in board) + "\n")
    if stuck:
        text += "\nYour previous response was invalid or had no effect. Please follow the rules and output format strictly."
    return text


def play(board: Board, solution: Board, moves: list[tuple[int, int, int]] | None) -> tuple[float, bool]:
    """Apply ``moves`` to ``board`` in place: (the step's reward, whether the episode ends)."""
    if moves is None:
        return -1.0, True
    for r, c, v in moves:
        if board[r][c] != 0:
            return -1.0, True
        board[r][c] = v
    if not valid(board):
        return -1.0, True
    return (1.0, True) if board == solution else (0.0, False)


class SudokuWorkflow(Workflow):
    """One Sudoku episode on the row's board (see the module's docstring)."""

    is_async = True
    repeatable = False  # one episode per call: its steps are turns of one episode
    reads_prompt = False  # the row holds a board, the prompt is the workflow's

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        raw = self.task.raw
        if "puzzle" in raw and "solution" in raw:
            self.board, self.solution = [list(r) for r in raw["puzzle"]], [list(r) for r in raw["solution"]]
            if len(self.board) != SIZE or any(len(r) != SIZE for r in self.board + self.solution):
                raise ValueError(f"task {self.task.task_id}: puzzle and solution must be 9 rows of 9 numbers")
        else:
            seed = raw.get("seed")
            self.board, self.solution = new_puzzle(int(seed) if seed is not None else zlib.crc32(self.task.task_id.encode()))

    async def run_async(self) -> list[Experience]:
        exps: list[Experience] = []
        stuck = False
        for step in range(MAX_STEPS):
            messages = [{"role": "user", "content": prompt(self.board, step, stuck)}]
            [exp] = await self.model.achat(messages, n=1, **self.rollout_args)
            before = [row[:] for row in self.board]
            exp.reward, over = play(self.board, self.solution, parse_moves(exp.response_text or ""))
            # the board the step was taken from: GiGPO compares the steps taken from one state
            exp.info.update(step=step, env_state_hash="".join(str(v) for row in before for v in row))
            exps.append(exp)
            stuck = self.board == before
            if over:
                break
        return exps
