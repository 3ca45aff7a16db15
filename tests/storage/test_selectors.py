"""Task selectors and the taskset scheduler: Trinity-RFT's names, exact mixing, exact resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.config import FormatConfig, TaskSelectorConfig, TasksetConfig
from storage.datafiles import TasksetError
from storage.scheduler import TaskScheduler, allocate, schedule
from storage.selectors import DifficultySelector, make_selector
from storage.tasksets import TaskReader, TaskSpec, check_taskset

ROWS = [{"question": f"{i}+{i}", "answer": str(2 * i), "level": i % 3, "easy": (i * 7) % 10} for i in range(30)]


def _reader(name: str, rows: list[dict], batch: int, selector: str = "sequential", **kw) -> TaskReader:
    spec = TaskSpec(taskset=name, workflow="math_workflow", repeat_times=4)
    sel = make_selector(selector, rows, seed=3, feature_keys=kw.pop("feature_keys", ()),
                        kwargs=kw.pop("kwargs", None))
    return TaskReader(rows, spec, batch_size=batch, selector=sel, seed=3, **kw)


def test_offline_easy2hard_sorts_by_feature_keys_largest_first(tmp_path: Path) -> None:
    """``offline_easy2hard`` serves rows by ``feature_keys`` descending (larger = easier, as
    Trinity-RFT reads them), ties in file order, the same order every epoch; a row without the
    column fails naming the field and the row."""
    r = _reader("t", ROWS, 10, "offline_easy2hard", feature_keys=["easy"], total_epochs=2)
    first = [t.index for t in r.read_batch(30)]
    assert [ROWS[i]["easy"] for i in first] == sorted((row["easy"] for row in ROWS), reverse=True)
    assert [t.index for t in r.read_batch(30)] == first
    two = make_selector("offline_easy2hard", ROWS, feature_keys=["level", "easy"])
    picked = two.pick(0, 30)
    assert [(ROWS[i]["level"], ROWS[i]["easy"]) for i in picked] == sorted(
        ((row["level"], row["easy"]) for row in ROWS), reverse=True)
    with pytest.raises(TasksetError, match=r"feature_keys: row 2 has easy=None"):
        make_selector("offline_easy2hard", ROWS[:2] + [{"question": "x"}], feature_keys=["easy"])
    with pytest.raises(TasksetError, match="feature_keys: offline_easy2hard sorts by them"):
        make_selector("offline_easy2hard", ROWS)
    # checked before a run starts, on every row (trinity config / run preflight)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    cfg = TasksetConfig(name="t", path=str(path), format=FormatConfig(prompt_key="question"),
                        task_selector=TaskSelectorConfig(selector_type="offline_easy2hard", feature_keys=["hard"]))
    with pytest.raises(TasksetError, match=r"t.jsonl: line 1: missing key 'hard' \(task_selector.feature_keys\)"):
        check_taskset(cfg)
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS[:5] + [dict(ROWS[5], easy="high")]))
    cfg.task_selector.feature_keys = ["easy"]
    with pytest.raises(TasksetError, match=r"t.jsonl: line 6: key 'easy' \(task_selector.feature_keys\): expected a finite"):
        check_taskset(cfg)


def test_difficulty_based_picks_rows_near_the_target_and_resumes_exactly() -> None:
    """``difficulty_based`` with ``kwargs`` ``target_reward: 0.5, tau: 0``: after pass rates of
    1.0 (level 0), 0.5 (level 1) and 0.0 (level 2) for a few rows, it picks level-1 rows,
    including ones never seen (their prior is their level's pool: ``feature_keys: [level]``).
    Its state goes through JSON (the cursor) and picks the same rows again; unknown kwargs
    fail naming them."""
    sel = make_selector("difficulty_based", ROWS, seed=1, feature_keys=["level"],
                        kwargs={"target_reward": 0.5, "tau": 0})
    seen = [0, 1, 2, 3, 4, 5]
    sel.update(seen, [{0: 1.0, 1: 0.5, 2: 0.0}[ROWS[i]["level"]] for i in seen])
    picked = sel.pick(100, 8)
    assert all(ROWS[i]["level"] == 1 for i in picked), [ROWS[i]["level"] for i in picked]
    assert set(picked) - set(seen), "unseen rows of the right level are picked too"
    again = make_selector("difficulty_based", ROWS, seed=1, feature_keys=["level"],
                          kwargs={"target_reward": 0.5, "tau": 0})
    again.load_state_dict(json.loads(json.dumps(sel.state_dict())))
    assert again.pick(100, 8) == picked and again.state_dict() == sel.state_dict()
    # sampling by softmax(score / tau), and Thompson draws: seeded by (seed, offset)
    for kwargs, near in (({"tau": 0.05}, 8), ({"tau": 0.05, "do_sample": True}, 3)):
        soft = make_selector("difficulty_based", ROWS, seed=1, feature_keys=["level"],
                             kwargs={"target_reward": 0.5, **kwargs})
        soft.update(seen, [{0: 1.0, 1: 0.5, 2: 0.0}[ROWS[i]["level"]] for i in seen])
        draws = soft.pick(7, 10)
        assert draws == soft.pick(7, 10) and len(set(draws)) == 10 and draws != soft.pick(8, 10)
        assert sum(ROWS[i]["level"] == 1 for i in draws) >= near
    with pytest.raises(TasksetError, match=r"kwargs: unknown temperature"):
        make_selector("difficulty_based", ROWS, kwargs={"temperature": 1})
    with pytest.raises(TasksetError, match=r"kwargs: sequential takes none"):
        make_selector("sequential", ROWS, kwargs={"tau": 1})
    # two reference pass rates: Trinity-RFT's interpolation by the estimated capability
    refs = [{"weak": 0.1 * (i % 5), "strong": min(1.0, 0.1 * (i % 5) + 0.5)} for i in range(20)]
    bots = DifficultySelector(refs, ["weak", "strong"], {"target_reward": 0.5, "tau": 0}, seed=0)
    bots.update([0, 1], [0.3, 0.3])
    assert bots.capability is not None and 0.0 <= bots.prior().min() <= bots.prior().max() <= 1.0


@pytest.mark.parametrize("kwargs,message", [
    ({"target_reward": float("nan")}, "kwargs.target_reward: got nan; need a pass rate: 0 <= target_reward <= 1"),
    ({"target_reward": 5}, "kwargs.target_reward: got 5; need a pass rate"),
    ({"tau": float("nan")}, "kwargs.tau: got nan; need tau >= 0"),
    ({"rho": float("nan")}, "kwargs.rho: got nan; need rho >= 0"),
    ({"m": float("inf")}, "kwargs.m: got inf; need m > 0"),
    ({"lamb": -0.1}, "kwargs.lamb: got -0.1; need 0 <= lamb < 1"),
    ({"m": "16"}, "kwargs.m: a number is needed, got '16'"),
    ({"adaptive_rho": "false"}, "kwargs.adaptive_rho: true or false, got 'false'"),
])
def test_difficulty_based_refuses_settings_that_would_make_selection_uniform(kwargs, message) -> None:
    """A NaN ``tau``/``target_reward``/``rho``, a target no pass rate reaches or an infinite
    ``m`` left every score alike (or NaN) and selection silently uniform; a string flag read as
    true. Refused, naming the kwarg, without any data (the check before start) and when made."""
    from storage.selectors import check_selector_config

    with pytest.raises(TasksetError) as e:
        check_selector_config("difficulty_based", [], kwargs, "buffer.explorer_input.taskset.task_selector")
    assert str(e.value).startswith(f"buffer.explorer_input.taskset.task_selector.{message}"), str(e.value)
    with pytest.raises(TasksetError, match="task_selector.kwargs."):
        make_selector("difficulty_based", ROWS, kwargs=kwargs)
    edges = {"target_reward": 0, "tau": 0, "m": 0.5, "lamb": 0, "rho": 0, "do_sample": True, "adaptive_rho": False}
    assert check_selector_config("difficulty_based", ["level"], edges)["target_reward"] == 0


def test_a_row_drawn_twice_makes_two_groups() -> None:
    """``random`` draws rows with replacement: each draw is its own task (``draw``), so the two
    groups of a row drawn twice in an epoch get different group ids."""
    from schemas.data import group_id

    r = _reader("t", ROWS, 30, "random")
    tasks = r.read_batch()
    assert len({t.index for t in tasks}) < 30, "the seed draws some row twice"
    assert len({group_id(t) for t in tasks}) == 30


def test_scheduler_mixes_by_weight_exactly_and_resumes() -> None:
    """Weights 0.7/0.3 over 10-task steps give 7/3 every step, 0.75/0.25 alternate 8/2 and 7/3;
    a spent taskset's share goes to the others; the state goes through JSON and the next steps
    are the same; no weight anywhere is an error naming the field."""
    assert allocate(10, [0.7, 0.3], [0.0, 0.0], [99, 99])[0] == [7, 3]
    got, credit = [], [0.0, 0.0]
    for _ in range(4):
        n, credit = allocate(10, [0.75, 0.25], credit, [99, 99])
        got.append(n)
    assert got == [[8, 2], [7, 3], [8, 2], [7, 3]]
    assert allocate(10, [0.5, 0.5], [0.0, 0.0], [3, 99])[0] == [3, 7]
    with pytest.raises(ValueError, match="no taskset with tasks left has a weight above 0"):
        allocate(4, [0.0, 0.0], [0.0, 0.0], [9, 9])
    ramp = schedule([(0, 1.0), (10, 0.0)])
    assert [ramp(s) for s in (0, 5, 10, 20)] == [1.0, 0.5, 0.0, 0.0]

    def make() -> TaskScheduler:
        a = _reader("a", ROWS[:20], 10, "shuffle", drop_last=False, total_epochs=3)
        b = _reader("b", ROWS[20:], 10, drop_last=False, total_epochs=1)
        return TaskScheduler([a, b], [lambda s: 0.6, lambda s: 0.4], batch_size=10)

    s = make()
    first = [s.next_batch() for _ in range(2)]
    assert [[t.taskset for t in b].count("b") for b in first] == [4, 4]
    saved = json.loads(json.dumps(s.state_dict()))
    rest = []
    while batch := s.next_batch():
        rest.append([(t.taskset, t.index, t.draw) for t in batch])
    # b (10 rows, one epoch) is spent after 8 of its rows and 2 more: a fills its share
    assert all(len(b) == 10 for b in rest) and sum(len(b) for b in first + rest) == 70
    resumed = make()
    resumed.load_state_dict(saved)
    again = []
    while batch := resumed.next_batch():
        again.append([(t.taskset, t.index, t.draw) for t in batch])
    assert again == rest
    # a step in flight, rebuilt from the cursor's picks: the same tasks
    picks = TaskScheduler.picks(first[1])
    assert [(t.taskset, t.index, t.draw) for t in make().rebuild(picks)] == [
        (t.taskset, t.index, t.draw) for t in first[1]]
    zero = TaskScheduler([_reader("a", ROWS, 4)], [lambda s: 0.0], batch_size=4)
    with pytest.raises(TasksetError, match=r"buffer.explorer_input.tasksets: at step 0: no taskset"):
        zero.next_batch()
