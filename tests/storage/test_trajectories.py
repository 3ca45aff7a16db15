"""``storage/trajectories.py``: what the trainer keeps of each step for the studio."""

from __future__ import annotations

import numpy as np
import pytest

from schemas.codec import encode
from schemas.data import Experience
from storage.trajectories import keep_trajectories, read_step, steps


def _exp(i: int) -> Experience:
    return Experience(id=f"t/{i}@0/0", task_id=f"t/{i}", group_id=f"t/{i}@0", run_id="r",
                      tokens=np.arange(5, dtype=np.int32), prompt_length=2, reward=float(i),
                      logprobs=np.full(3, -0.1, np.float32), messages=[{"role": "user", "content": "hi"}])


@pytest.mark.unit
def test_monitor_trajectory_steps_keeps_the_newest_steps_whole(tmp_path):
    """``monitor.trajectory_steps``: N keeps the newest N steps, -1 all, 0 writes nothing;
    a kept step reads back exactly as trained on."""
    for step in range(1, 6):
        keep_trajectories(tmp_path / "a", step, [_exp(step), _exp(step + 10)], 2)
        keep_trajectories(tmp_path / "all", step, [_exp(step)], -1)
        keep_trajectories(tmp_path / "none", step, [_exp(step)], 0)
    assert steps(tmp_path / "a") == [4, 5] and steps(tmp_path / "all") == [1, 2, 3, 4, 5]
    assert steps(tmp_path / "none") == [] and not (tmp_path / "none").exists()
    back = read_step(tmp_path / "a", 5)
    assert [e.id for e in back] == ["t/5@0/0", "t/15@0/0"] and back[0].reward == 5.0
    assert back[0].messages == [{"role": "user", "content": "hi"}] and back[0].tokens.tolist() == [0, 1, 2, 3, 4]
    assert not list((tmp_path / "a" / "trajectories").glob(".*"))  # no temporary file left
    with pytest.raises(FileNotFoundError):
        read_step(tmp_path / "a", 1)


@pytest.mark.unit
def test_records_already_encoded_are_kept_as_they_came(tmp_path):
    """The trainer passes the batch's records as the buffer sent them (bytes), not encoded
    again; they read back like experiences passed as objects."""
    keep_trajectories(tmp_path, 1, [encode(_exp(1)), _exp(2)], 1)
    back = read_step(tmp_path, 1)
    assert [e.id for e in back] == ["t/1@0/0", "t/2@0/0"] and back[0].logprobs.tolist() == pytest.approx([-0.1] * 3)
