"""A run that cannot succeed ends non-zero, naming why (``roles/runtime/verdicts.py``), instead of
waiting out ``sync_timeout`` and ending 0 with nothing trained."""

from __future__ import annotations

import time

import pytest

from bus.server import free_port

from .helpers import run_to_end, tiny_run_config, trinity

pytestmark = pytest.mark.slow


def test_a_stats_key_no_experience_carries_ends_the_run_with_exit_1_naming_it(tmp_path, tiny_model, arith):
    """The config mistake of issue 54: ``reward_shaping_mapper`` shaping by a stat no
    experience carries (a typo). Every group is dead-lettered for that reason; after a step's
    worth (``buffer.batch_size`` 3) the buffer ends the run: exit 1 well within 150 s (not
    after the explorer's 300 s wait for weights), the last line naming the stats_key, the
    summary listing the dead letters."""
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False, extra={
        "synchronizer.sync_timeout": 300,  # the quickstart's: the run must not wait it out
        "data_processor.experience_pipeline.operators": [
            {"name": "reward_shaping_mapper", "args": {"reward_shaping_configs": [
                {"stats_key": "llm_quality_scor", "op_type": "ADD", "weight": 1.0}]}}]})
    t0 = time.monotonic()
    rc, text = run_to_end(cfg, tmp_path / "run.log", timeout=240)
    seconds = time.monotonic() - t0
    last = text.rstrip().splitlines()[-1]
    assert rc == 1, text[-4000:]
    assert seconds < 150, f"{seconds:.0f}s\n{text[-4000:]}"
    assert last.startswith("trinity run: failed: "), text[-4000:]
    assert "info['llm_quality_scor']: missing" in last and "3 groups in a row" in last, last
    assert "buffer ended the run (exit 3" in text
    assert "message(s) dead-lettered" in text and "reward_shaping_mapper's stats_key names it" in text
    assert "trainer_finished" not in text  # nothing pretended to finish
    print(f"ended in {seconds:.1f}s: {last}")


def test_a_trainer_short_of_its_total_steps_ends_the_run_with_exit_1(tmp_path, tiny_model, arith):
    """``mode: train`` on a file dataset that runs out before ``total_steps`` (24 rows, 8 a
    step, one epoch: 3 of 10 steps): the trainer checkpoints what it trained, then the run
    ends with exit 1 saying so, rather than "done"."""
    fmt = {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer", "system_prompt": ""}
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False, extra={
        "mode": "train", "algorithm.algorithm_type": "sft",
        "buffer.train_batch_size": 8, "buffer.total_steps": 10, "buffer.total_epochs": 1,
        "buffer.trainer_input": {"experience_buffer": {"name": "sft", "storage_type": "file", "path": str(arith),
                                                       "split": "train", "format": fmt}}})
    rc, text = run_to_end(cfg, tmp_path / "run.log", timeout=240)
    last = text.rstrip().splitlines()[-1]
    assert rc == 1, text[-4000:]
    assert last == ("trinity run: failed: the trainer finished after 3 of 10 steps (total_steps): its input "
                    "ran out (a dataset's total_epochs, or experience the buffer dead-lettered or dropped)"), text[-4000:]
    assert (tmp_path / "ckpt/t/r/global_step_3/actor").is_dir()  # what it trained is kept


CONSTANT_REWARD = '''
from ops.registry import register


@register("reward_fn", "constant_reward")
def constant_reward(response, truth=None, *, prompt=None):
    return {"accuracy": 0.0}
'''


def test_a_wait_for_weights_with_nothing_trained_ends_the_run_with_exit_1(tmp_path, tiny_model, arith):
    """Every group's rewards are equal (a reward that always pays 0) and
    ``drop_equal_reward_groups`` drops each one: nothing is dead-lettered, nothing stored, the
    trainer never gets a batch. The explorer's wait for the weights of its step 2 times out
    (``sync_timeout`` 15 s) with nothing trained: the run ends with exit 1 saying so, instead
    of exploring on with the starting weights."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "constant_reward.py").write_text(CONSTANT_REWARD)
    cfg = tiny_run_config(tmp_path / "c.yaml", model=tiny_model, data=arith, port=free_port(), stages=False, extra={
        "synchronizer.sync_timeout": 15, "explorer.eval_on_startup": False,
        "buffer.explorer_input.default_reward_fn_type": "constant_reward",
        "data_processor.experience_pipeline.operators": [{"name": "drop_equal_reward_groups"}]})
    log = tmp_path / "run.log"
    p = trinity("run", "--config", str(cfg), log=log, env_extra={"TRINITY_PLUGIN_DIRS": str(plugins)})
    try:
        p.wait(timeout=240)
    finally:
        if p.poll() is None:
            p.kill()
    text = log.read_text(errors="replace")
    last = text.rstrip().splitlines()[-1]
    assert p.returncode == 1, text[-4000:]
    assert last.startswith("trinity run: failed: the explorer waited 15s (synchronizer.sync_timeout) for the "
                           "weights of its step 2 and the trainer has trained no step"), text[-4000:]
    assert "explorer ended the run (exit 3" in text
