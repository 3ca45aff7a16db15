"""The cut-offs that end a run non-zero (``roles/runtime/verdicts.py``): a step's worth of groups
dead-lettered for one reason, a trainer short of its steps, a wait for weights with nothing
trained. Pure functions, plus the buffer's ingest feeding the dead-letter streak."""

from __future__ import annotations

import pytest

from roles.runtime.verdicts import (
    DeadLetterStreak,
    nothing_trained,
    reason_key,
    short_of_steps,
    streak_limit,
)

TYPO = ("ValueError: ExperienceGroup.experiences[{i}].info['llm_quality_scor']: missing; "
        "reward_shaping_mapper's stats_key names it")


def streak_of(events: list[str | None | bool]) -> DeadLetterStreak:
    """The streak after ``events`` in order: a reason (dead-lettered), True (stored), None
    (neither: an evaluation group, one an operator dropped)."""
    s = DeadLetterStreak()
    for ev in events:
        s = s.after(stored=ev is True, dead_letter=ev if isinstance(ev, str) else None)
    return s


def test_a_steps_worth_of_one_reason_ends_the_run_naming_the_reason_and_count():
    s = streak_of([TYPO.format(i=0), TYPO.format(i=0), TYPO.format(i=2)])
    assert s.count == 3 and s.reason == TYPO.format(i=0)  # the first reason, as dead-lettered
    cause = s.cause(3)
    assert cause is not None and "llm_quality_scor" in cause and "3 groups in a row" in cause
    assert streak_of([TYPO.format(i=0)] * 2).cause(3) is None  # short of a step's worth


def test_numbers_do_not_tell_reasons_apart_words_do():
    assert reason_key(TYPO.format(i=0)) == reason_key(TYPO.format(i=7))
    assert reason_key("token id 1000000 is past (151936)") == reason_key("token id 99 is past (151936)")
    assert reason_key(TYPO.format(i=0)) != reason_key(TYPO.format(i=0).replace("scor", "score"))


def test_a_stored_group_resets_the_streak_a_dropped_or_eval_group_does_not():
    bad = TYPO.format(i=0)
    assert streak_of([bad, bad, True, bad, bad]).cause(3) is None
    assert streak_of([bad, None, bad, None, None, bad]).cause(3) is not None
    assert streak_of([bad, bad, True]) == DeadLetterStreak()


def test_chaos_poison_never_ends_a_run():
    """The chaos bench's poison (tests/run/poison.py, bench/chaos.py): a burst of messages
    each failing for its own reason, at a few steps of a run whose good groups are stored in
    between. Varied reasons never add up, and a stored group ends any streak."""
    poison = [  # the reasons tests/run/test_poison.py finds on the dead-letter stream
        "ValueError: ExperienceGroup.group_id: must not be empty",
        "ValueError: ExperienceGroup.experiences[0].id: 500 bytes, longer than 480",
        "ValueError: ExperienceGroup.model_version: must be in [0, 2**63)",
        "ValueError: ExperienceGroup.experiences[1].reward: must be finite, got nan",
        "ValueError: ExperienceGroup.experiences[0].tokens: token id 1000000 is past the model's vocabulary (200)",
        "CodecError: not a trinity message",
    ]
    burst = streak_of(poison)
    assert burst.count == 1 and burst.cause(streak_limit(3)) is None
    run: list[str | None | bool] = []
    for _ in range(3):  # three rounds, good groups between them
        run += [True, True, True, *poison, True, True]
    assert streak_of(run).cause(streak_limit(1)) is None


def test_one_bad_message_never_ends_a_run_even_with_batch_size_1():
    assert streak_limit(1) == 2 and streak_limit(16) == 16
    assert streak_of([TYPO.format(i=0)]).cause(streak_limit(1)) is None
    assert streak_of([TYPO.format(i=0)] * 2).cause(streak_limit(1)) is not None


@pytest.mark.parametrize(("trained", "total", "fails"), [
    (0, 4, True), (3, 4, True), (4, 4, False), (5, 4, False),  # a resumed trainer past its total
    (0, None, True), (1, None, False),
])
def test_a_trainer_that_finished_short_of_its_steps_fails_the_run(trained, total, fails):
    cause = short_of_steps(trained, total)
    assert (cause is not None) == fails
    if fails and total is not None:
        assert f"after {trained} of {total} steps" in cause


@pytest.mark.parametrize(("explorer", "trainer", "hopeless"), [
    (0, None, True), (0, 0, True), (0, 2, False), (3, 0, False), (3, 3, False),
])
def test_a_timed_out_wait_for_weights_is_hopeless_only_with_nothing_trained(explorer, trainer, hopeless):
    assert nothing_trained(explorer, trainer) is hopeless


def test_the_buffers_ingest_counts_a_typo_in_stats_key(tmp_path):
    """The buffer's own ingest, with the pipeline of the config mistake (a ``stats_key`` no
    experience carries): every group is quarantined for one reason and the streak names it;
    a stored group (the operator fixed) would reset it."""
    from roles.buffer.pipeline import Pipeline, reward_shaping_mapper
    from roles.buffer.service import BufferService
    from storage.replay import ReplayStore
    from tests.conftest import make_group

    shaping = [{"stats_key": "llm_quality_scor", "op_type": "ADD", "weight": 1.0}]
    pipeline = Pipeline(operators=[("reward_shaping_mapper",
                                    lambda g: reward_shaping_mapper(g, reward_shaping_configs=shaping))])
    with ReplayStore(tmp_path / "r") as store:
        service = BufferService(store, pipeline, vocab=200_000)
        _, bad, _ = service.ingest([make_group(group_id=f"g{i}", n=2, tokens=16, prompt=4) for i in range(2)])
        assert sorted(bad) == [0, 1] and service.streak.cause(streak_limit(3)) is None
        service.ingest([make_group(group_id="g2", n=2, tokens=16, prompt=4)])
        cause = service.streak.cause(streak_limit(3))
        assert cause is not None and "info['llm_quality_scor']: missing" in cause, cause
        service.pipeline = Pipeline()  # the operator gone: the next group is stored
        added, bad, _ = service.ingest([make_group(group_id="g3", n=2, tokens=16, prompt=4)])
        assert added == 2 and not bad and service.streak == DeadLetterStreak()
