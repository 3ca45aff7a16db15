"""sudoku_workflow: upstream's boards, prompt, move parsing, rules and per-step rewards, on the
real transformers engine."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from roles.explorer.workflows.base import ModelHandle
from roles.explorer.workflows.registry import get_workflow
from roles.explorer.workflows.sudoku import new_puzzle, parse_moves, play, prompt, valid
from schemas.config import InferenceModelConfig
from schemas.data import Task

SOLVED = [[(3 * (r % 3) + r // 3 + c) % 9 + 1 for c in range(9)] for r in range(9)]


def test_generated_puzzles_are_solvable_half_boards_the_same_from_a_seed():
    for seed in range(5):
        puzzle, solution = new_puzzle(seed)
        assert (puzzle, solution) == new_puzzle(seed)
        assert valid(solution) and all(0 not in row for row in solution)
        assert sum(row.count(0) for row in puzzle) == 40  # upstream's "medium": 81 // 2
        assert all(p in (0, s) for pr, sr in zip(puzzle, solution, strict=True) for p, s in zip(pr, sr, strict=True))
    assert new_puzzle(0) != new_puzzle(1)


def test_rules_and_rewards_are_upstreams():
    assert valid(SOLVED)
    assert not valid([[1, 1] + [0] * 7] + [[0] * 9] * 8)  # a row
    assert not valid([[5] + [0] * 8, [5] + [0] * 8] + [[0] * 9] * 7)  # a column
    assert not valid([[1, 2, 3] + [0] * 6, [4, 1] + [0] * 7] + [[0] * 9] * 7)  # a block
    assert parse_moves("0 2 4\n\n1 3 5\n") == [(0, 2, 4), (1, 3, 5)]
    for bad in ("", "0 2", "0 2 x", "9 0 1", "0 0 0", "\n".join(["0 0 1"] * 6), "0 2 4 then"):
        assert parse_moves(bad) is None, bad
    board = [row[:] for row in SOLVED]
    board[0][0] = board[8][8] = 0
    assert play(board, SOLVED, [(0, 0, SOLVED[0][0])]) == (0.0, False)  # progress
    assert play(board, SOLVED, [(8, 8, SOLVED[8][8])]) == (1.0, True)  # solved
    board[4][4] = 0
    assert play(board, SOLVED, [(0, 0, 1)]) == (-1.0, True)  # the cell is not empty
    assert play([row[:] for row in board], SOLVED, [(4, 4, SOLVED[4][3])]) == (-1.0, True)  # a repeat in its row
    assert play(board, SOLVED, None) == (-1.0, True)  # no parse
    text = prompt(SOLVED, 3, stuck=True)
    assert "Current step: 3\nRemaining steps: 17\n" in text and "up to 5 moves per step" in text
    assert text.endswith("Please follow the rules and output format strictly.")
    assert "Current board:\n1 2 3 4 5 6 7 8 9\n" in text


@pytest.fixture(scope="module")
def engine(tiny_model: Path):
    from roles.explorer.engines.hf import HFEngine

    return HFEngine(InferenceModelConfig(model_path=str(tiny_model), engine_type="transformers",
                                         dtype="float32", max_model_len=4096, seed=0))


async def test_an_episode_gives_one_experience_a_step_each_with_its_reward(engine):
    """A random tiny model writes no valid move: one step, reward -1, the row's board kept."""
    puzzle, solution = new_puzzle(3)
    task = Task(task_id="s/0", raw={"puzzle": puzzle, "solution": solution}, workflow="sudoku_workflow",
                workflow_args={}, rollout_args={"max_tokens": 8})
    wf = get_workflow("sudoku_workflow")(task=task, model=ModelHandle(engine, asyncio.get_running_loop()))
    assert wf.board == puzzle and not wf.repeatable and not wf.reads_prompt
    exps = await wf.run_async()
    assert len(exps) == 1 and exps[0].reward == -1.0 and exps[0].info["step"] == 0
    assert exps[0].info["env_state_hash"] == "".join(str(v) for row in puzzle for v in row)
    assert exps[0].response_length > 0 and "Current board:" in (exps[0].prompt_text or engine.tokenizer.decode(
        exps[0].tokens[:exps[0].prompt_length]))
    with pytest.raises(ValueError, match="9 rows of 9 numbers"):
        get_workflow("sudoku_workflow")(task=Task(task_id="s/1", raw={"puzzle": [[0]], "solution": [[1]]},
                                                  workflow="sudoku_workflow"),
                                        model=ModelHandle(engine, asyncio.get_running_loop()))
