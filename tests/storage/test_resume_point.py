"""Which checkpoint a starting trainer loads (``trainer.resume_mode``): the job's latest, none,
or a given ``global_step_N`` folder; and a trainer restarted within its session always goes on
from its own latest checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import checkpoints as ck

SESSION = 1700000000.25


def _job(tmp_path: Path, name: str, latest: int | None, session: float | None = None) -> Path:
    """A job dir whose latest committed checkpoint is ``latest``, written by ``session``."""
    job = tmp_path / name
    job.mkdir(parents=True)
    if latest is not None:
        (ck.actor_dir(job, latest)).mkdir(parents=True)
        ck.write_meta(job, "trainer", {"latest_iteration": latest, "session": session})
        ck.write_latest(job, latest)
    return job


def test_auto_resumes_the_jobs_latest_checkpoint(tmp_path):
    job = _job(tmp_path, "a", 30, session=1.0)
    assert ck.resume_point(job, "auto", session=SESSION) == (job, 30)
    assert ck.resume_point(_job(tmp_path, "empty", None), "auto", session=SESSION) is None


def test_disable_starts_from_the_model_beside_an_older_runs_checkpoints(tmp_path):
    job = _job(tmp_path, "a", 30, session=1.0)
    assert ck.resume_point(job, "disable", session=SESSION) is None
    assert ck.resume_point(job, "disable") is None  # no session known: never "our own"


def test_resume_path_loads_the_folder_it_names(tmp_path):
    other = _job(tmp_path, "other", 12)
    job = _job(tmp_path, "a", None)
    assert ck.resume_point(job, "resume_path", str(ck.step_dir(other, 12)), SESSION) == (other, 12)
    assert ck.resume_point(job, "resume_path", f"{ck.step_dir(other, 12)}/", SESSION) == (other, 12)
    # this job's own older step: a roll back
    own = _job(tmp_path, "b", 30, session=1.0)
    (ck.actor_dir(own, 10)).mkdir(parents=True)
    assert ck.resume_point(own, "resume_path", str(ck.step_dir(own, 10)), SESSION) == (own, 10)
    with pytest.raises(ck.CheckpointError, match="trainer.resume_from_path: .* no actor/ checkpoint folder"):
        ck.resume_point(job, "resume_path", str(tmp_path / "gone" / "global_step_4"), SESSION)
    with pytest.raises(ck.CheckpointError, match="is not a global_step_N folder"):
        ck.resume_point(job, "resume_path", str(other), SESSION)


@pytest.mark.parametrize("mode", ["auto", "disable", "resume_path"])
def test_a_restart_in_the_same_session_resumes_its_own_checkpoint(tmp_path, mode):
    other = _job(tmp_path, "other", 12)
    job = _job(tmp_path, "a", 5, session=SESSION)
    assert ck.resume_point(job, mode, str(ck.step_dir(other, 12)), SESSION) == (job, 5)


def test_a_meta_written_before_a_crashed_commit_is_not_taken_for_its_checkpoint(tmp_path):
    """The meta file is written just before the commit: after a crash between the two, this
    session's meta sits beside an older run's latest step, which must not be resumed."""
    job = _job(tmp_path, "a", 30, session=1.0)
    ck.write_meta(job, "trainer", {"latest_iteration": 3, "session": SESSION})
    assert ck.resume_point(job, "disable", session=SESSION) is None
