"""Seed config values accepted with their meaning (issue #33 item 5): the guide's veRL block
(``trainer:`` keys at the top level or in ``trainer.trainer_config``, ``actor_rollout_ref``,
``critic``), the FAQ's ``trainer.ppo_max_token_len_per_gpu`` and ``log.level=debug``, veRL's
``ppo_mini_batch_size`` (overridden by ``buffer.train_batch_size``: one update per batch), and
``trainer.resume_mode`` / ``resume_from_path``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml

from schemas.loader import ConfigError, load_config

#: The guide's "veRL Trainer Configuration (Advanced)" block, copied from the seeds'
#: configuration.md as it is.
GUIDE_VERL_BLOCK = """
actor_rollout_ref:
  hybrid_engine: True
  model:
    external_lib: null
    override_config: { }
    enable_gradient_checkpointing: True
    use_remove_padding: True
    use_fused_kernels: False
    fused_kernel_options:
      impl_backend: None
  actor:
    strategy: fsdp  # This is for backward-compatibility
    # ppo_micro_batch_size: 8 # will be deprecated, use ppo_micro_batch_size_per_gpu
    ppo_micro_batch_size_per_gpu: 4
    use_dynamic_bsz: True
    ppo_max_token_len_per_gpu: 16384 # n * ${data.max_model_len}
    grad_clip: 1.0
    ppo_epochs: 1
    shuffle: False
    ulysses_sequence_parallel_size: 1 # sp size
    entropy_from_logits_with_chunking: false
    entropy_checkpointing: false
    checkpoint:
      load_contents: ['model', 'optimizer', 'extra']
      save_contents: ['model', 'optimizer', 'extra']
    optim:
      lr: 1e-6
      lr_warmup_steps_ratio: 0.  # the total steps will be injected during runtime
      # min_lr_ratio: null   # only useful for warmup with cosine
      warmup_style: constant  # select from constant/cosine
      total_training_steps: -1  # must be override by program
    fsdp_config:
      wrap_policy:
        # transformer_layer_cls_to_wrap: None
        min_num_params: 0
      param_offload: False
      optimizer_offload: False
      fsdp_size: -1
      forward_prefetch: False
  ref:
    fsdp_config:
      param_offload: False
      wrap_policy:
        # transformer_layer_cls_to_wrap: None
        min_num_params: 0
      fsdp_size: -1
      forward_prefetch: False
    # log_prob_micro_batch_size: 4 # will be deprecated, use log_prob_micro_batch_size_per_gpu
    log_prob_micro_batch_size_per_gpu: 4
    log_prob_use_dynamic_bsz: ${actor_rollout_ref.actor.use_dynamic_bsz}
    log_prob_max_token_len_per_gpu: ${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}
    ulysses_sequence_parallel_size: ${actor_rollout_ref.actor.ulysses_sequence_parallel_size} # sp size
    entropy_from_logits_with_chunking: ${actor_rollout_ref.actor.entropy_from_logits_with_chunking}
    entropy_checkpointing: ${actor_rollout_ref.actor.entropy_checkpointing}

critic:
  strategy: fsdp
  optim:
    lr: 1e-5
    lr_warmup_steps_ratio: 0.  # the total steps will be injected during runtime
    # min_lr_ratio: null   # only useful for warmup with cosine
    warmup_style: constant  # select from constant/cosine
    total_training_steps: -1  # must be override by program
  model:
    override_config: { }
    external_lib: ${actor_rollout_ref.model.external_lib}
    enable_gradient_checkpointing: True
    use_remove_padding: False
    fsdp_config:
      param_offload: False
      optimizer_offload: False
      wrap_policy:
        # transformer_layer_cls_to_wrap: None
        min_num_params: 0
      fsdp_size: -1
      forward_prefetch: False
  ppo_micro_batch_size_per_gpu: 8
  forward_micro_batch_size_per_gpu: ${critic.ppo_micro_batch_size_per_gpu}
  use_dynamic_bsz: ${actor_rollout_ref.actor.use_dynamic_bsz}
  ppo_max_token_len_per_gpu: 32768 # (${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}) * 2
  forward_max_token_len_per_gpu: ${critic.ppo_max_token_len_per_gpu}
  ulysses_sequence_parallel_size: 1 # sp size
  ppo_epochs: ${actor_rollout_ref.actor.ppo_epochs}
  shuffle: ${actor_rollout_ref.actor.shuffle}
  grad_clip: 1.0
  cliprange_value: 0.5

trainer:
  balance_batch: True
  # total_training_steps: null
  resume_mode: auto
  resume_from_path: ""
  critic_warmup: 0
  default_hdfs_dir: null
  remove_previous_ckpt_in_save: False
  del_local_ckpt_after_load: False
  max_actor_ckpt_to_keep: 5
  max_critic_ckpt_to_keep: 5
"""


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def load(path: Path, env: dict[str, str] | None = None):
    return load_config(path, environ=env or {}, dotenv_file=None)


def _check_guide_block(loaded) -> None:
    """What the guide's veRL block means here, wherever its sections were written."""
    c = loaded.config
    t = c.trainer
    assert t.max_checkpoints_to_keep == 5  # max_actor_ckpt_to_keep (the critic's agrees)
    assert (t.resume_mode, t.resume_from_path, t.balance_batch, t.critic_warmup) == ("auto", "", True, 0)
    assert (t.micro_batch_size_per_gpu, t.use_dynamic_bsz, t.max_token_len_per_gpu) == (4, True, 16384)
    assert (t.grad_clip, t.ppo_epochs, t.ppo_shuffle, t.ppo_mini_batch_size) == (1.0, 1, False, None)
    assert c.algorithm.optimizer.lr == 1e-6
    # null and false veRL switches ask for nothing trinity lacks: no warning about them
    for key in ("default_hdfs_dir", "remove_previous_ckpt_in_save", "del_local_ckpt_after_load",
                "max_critic_ckpt_to_keep", "resume_from_path"):
        assert not [w for w in loaded.warnings if key in w], loaded.warnings


def test_the_guides_whole_verl_block_loads_with_its_meaning(tmp_path):
    loaded = load(write(tmp_path, GUIDE_VERL_BLOCK))
    _check_guide_block(loaded)
    c = loaded.config
    assert (c.critic.optim.lr, c.critic.grad_clip, c.critic.cliprange_value) == (1e-5, 1.0, 0.5)
    assert loaded.sources["trainer.max_checkpoints_to_keep"].endswith("as trainer.max_actor_ckpt_to_keep")
    assert loaded.sources["trainer.max_token_len_per_gpu"].endswith(
        "as actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    # what trinity does not read is named, each with why
    ignored = [w.split(" is ignored")[0] for w in loaded.warnings if " is ignored" in w]
    assert "actor_rollout_ref" in ignored and "critic.model" in ignored and "critic.strategy" in ignored
    # ...and the guide's critic block spells its schedule with the deprecated warmup_style
    deprecated = ["critic.optim.warmup_style is deprecated; use lr_scheduler_type"]
    assert [w for w in loaded.warnings if " is ignored (from file " not in w] == deprecated, loaded.warnings
    assert c.critic.optim.lr_scheduler_type == "constant"


def test_the_guides_verl_block_inside_trainer_config_means_the_same(tmp_path):
    block = yaml.safe_load(GUIDE_VERL_BLOCK.replace("${", "$ {"))  # interpolations: not needed here
    nested = {"trainer": {"trainer_config": {"actor_rollout_ref": {"actor": block["actor_rollout_ref"]["actor"]},
                                             "trainer": block["trainer"]}}}
    loaded = load(write(tmp_path, yaml.safe_dump(nested)))
    _check_guide_block(loaded)
    assert loaded.sources["trainer.resume_mode"].endswith("as trainer.trainer_config.trainer.resume_mode")
    assert loaded.sources["trainer.max_checkpoints_to_keep"].endswith(
        "as trainer.trainer_config.trainer.max_actor_ckpt_to_keep")
    # the actor's leftovers (strategy, fsdp_config, ...) are ignored with one warning
    assert [w for w in loaded.warnings if w.startswith("trainer.trainer_config is ignored")]


@pytest.mark.parametrize("where", ["trainer", "trainer.trainer_config.trainer"])
def test_verl_trainer_keys_with_no_meaning_here_warn_when_they_ask_for_something(tmp_path, where):
    keys = {"default_hdfs_dir": "hdfs://nn/ckpt", "remove_previous_ckpt_in_save": True, "del_local_ckpt_after_load": True}
    node: dict = {}
    top = node
    for part in where.split("."):
        node = node.setdefault(part, {})
    node.update(keys)
    loaded = load(write(tmp_path, yaml.safe_dump(top)))
    for key in keys:
        hit = [w for w in loaded.warnings if w.startswith(f"{where}.{key} is ignored (from file ")]
        assert len(hit) == 1, loaded.warnings
    assert "HDFS upload is not implemented" in " ".join(loaded.warnings)
    assert "trainer.max_checkpoints_to_keep: 1 keeps only the newest" in " ".join(loaded.warnings)
    assert not [w for w in loaded.warnings if w.startswith("trainer.trainer_config is ignored")]


def test_checkpoint_counts_trinitys_name_wins_and_disagreement_is_named(tmp_path):
    loaded = load(write(tmp_path, """
        trainer: {max_actor_ckpt_to_keep: 3, max_critic_ckpt_to_keep: 2}
    """))
    assert loaded.config.trainer.max_checkpoints_to_keep == 3
    assert [w for w in loaded.warnings if w.startswith("trainer.max_critic_ckpt_to_keep (2, from file")
            and "is overridden by trainer.max_checkpoints_to_keep (3, from file" in w
            and "as trainer.max_actor_ckpt_to_keep" in w]
    critic_only = load(write(tmp_path, "trainer: {max_critic_ckpt_to_keep: 2}\n", "d.yaml"))
    assert critic_only.config.trainer.max_checkpoints_to_keep == 2 and not critic_only.warnings
    own = load(write(tmp_path, "trainer: {max_checkpoints_to_keep: 4, max_actor_ckpt_to_keep: 4}\n", "e.yaml"))
    assert own.config.trainer.max_checkpoints_to_keep == 4 and not own.warnings  # same value: nothing to say


def test_total_training_steps_is_verls_name_of_total_steps(tmp_path):
    loaded = load(write(tmp_path, "trainer: {trainer_config: {trainer: {total_training_steps: 7}}}\n"))
    assert loaded.config.trainer.total_steps == 7
    unset = load(write(tmp_path, "trainer: {total_training_steps: null}\n", "d.yaml"))
    assert unset.config.trainer.total_steps is None and not unset.warnings


@pytest.mark.parametrize("level", ["debug", "Debug", "DEBUG"])
def test_log_level_in_any_case(tmp_path, level):
    loaded = load(write(tmp_path, f"log: {{level: {level}}}\n"))
    assert loaded.config.log.level == "DEBUG"
    assert load(None, env={"TRINITY_LOG__LEVEL": level.lower()}).config.log.level == "DEBUG"
    with pytest.raises(ConfigError, match="log.level: got 'loud'"):
        load(write(tmp_path, "log: {level: loud}\n", "bad.yaml"))


def test_ppo_max_token_len_per_gpu_is_verls_name_of_max_token_len_per_gpu(tmp_path):
    loaded = load(write(tmp_path, "trainer: {ppo_max_token_len_per_gpu: 8192}\n"))
    assert loaded.config.trainer.max_token_len_per_gpu == 8192
    assert loaded.sources["trainer.max_token_len_per_gpu"].endswith("as trainer.ppo_max_token_len_per_gpu")
    assert not loaded.warnings
    both = load(write(tmp_path, "trainer: {ppo_max_token_len_per_gpu: 8192, max_token_len_per_gpu: 4096}\n", "d.yaml"))
    assert both.config.trainer.max_token_len_per_gpu == 4096  # trinity's name wins, and says so
    assert [w for w in both.warnings
            if w.startswith("trainer.ppo_max_token_len_per_gpu (8192, from file")
            and "is overridden by trainer.max_token_len_per_gpu (4096, from file" in w]


@pytest.mark.parametrize("where", ["", "trainer.trainer_config."])
def test_verls_ppo_mini_batch_size_leaves_one_update_per_batch(tmp_path, where):
    from ops.algorithms import resolve
    from roles.trainer.main import mini_batch_rows
    from roles.trainer.step import StepRunner

    node: dict = {"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2}}}
    if where:
        node = {"trainer": {"trainer_config": node}}
    node.update({"algorithm": {"algorithm_type": "grpo", "repeat_times": 4}, "buffer": {"batch_size": 4}})
    loaded = load(write(tmp_path, yaml.safe_dump(node)))
    cfg = loaded.config
    assert cfg.trainer.ppo_mini_batch_size is None and mini_batch_rows(cfg) is None
    runner = StepRunner(object(), resolve("grpo", kl_loss_fn="none"), mini_batch_rows=mini_batch_rows(cfg))
    assert runner.mini_batches(cfg.buffer.train_batch_size, step=1) == [list(range(16))]  # one update
    hit = [w for w in loaded.warnings if w.startswith(f"{where}actor_rollout_ref.actor.ppo_mini_batch_size is ignored")]
    assert len(hit) == 1 and "overridden by buffer.train_batch_size" in hit[0], loaded.warnings
    # trinity's own name still splits the batch
    own = load(write(tmp_path, "algorithm: {repeat_times: 4}\ntrainer: {ppo_mini_batch_size: 2}\n", "d.yaml"))
    assert mini_batch_rows(own.config) == 8


def test_resume_path_needs_a_global_step_folder(tmp_path):
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, "trainer: {resume_mode: resume_path}\n"))
    assert "trainer.resume_from_path: required when trainer.resume_mode is 'resume_path'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        load(write(tmp_path, f"trainer: {{resume_mode: resume_path, resume_from_path: {tmp_path}/ckpt}}\n"))
    assert f"trainer.resume_from_path: '{tmp_path}/ckpt' is not a global_step_N checkpoint folder" in str(e.value)
    ok = load(write(tmp_path, f"trainer: {{resume_mode: resume_path, resume_from_path: {tmp_path}/global_step_3/}}\n"))
    assert ok.config.trainer.resume_mode == "resume_path"
    stray = load(write(tmp_path, f"trainer: {{resume_from_path: {tmp_path}/global_step_3}}\n"))
    assert [w for w in stray.warnings if w.startswith("trainer.resume_from_path is ignored: trainer.resume_mode is 'auto'")]
    with pytest.raises(ConfigError, match="trainer.resume_mode: got 'sometimes'"):
        load(write(tmp_path, "trainer: {resume_mode: sometimes}\n"))


def test_a_missing_resume_folder_is_named_before_the_run_starts(tmp_path):
    from roles.launch.checks import check_inputs

    model = tmp_path / "model"
    model.mkdir()
    missing = tmp_path / "old" / "global_step_3"
    cfg = load(write(tmp_path, f"""
        mode: train
        model: {{model_path: {model}}}
        trainer: {{resume_mode: resume_path, resume_from_path: {missing}}}
    """)).config
    for entry in ("run", "trainer"):
        _, lines = check_inputs([cfg], entry)
        assert f"trainer.resume_from_path: {missing} does not exist" in lines
    _, lines = check_inputs([cfg], "explorer")  # the explorer does not read it
    assert not [m for m in lines if "resume_from_path" in m]
    (missing / "actor").mkdir(parents=True)
    assert not [m for m in check_inputs([cfg], "trainer")[1] if "resume_from_path" in m]


def test_stages_after_the_first_do_not_inherit_the_resume_settings(tmp_path):
    loaded = load(write(tmp_path, f"""
        trainer: {{resume_mode: resume_path, resume_from_path: {tmp_path}/global_step_2}}
        stages:
          - stage_name: sft
            algorithm: {{algorithm_type: sft}}
            buffer: {{trainer_input: {{experience_buffer: {{path: /d}}}}}}
          - stage_name: rl
          - stage_name: again
            trainer: {{resume_mode: disable}}
    """))
    first, second, third = loaded.stages
    assert (first.trainer.resume_mode, first.trainer.resume_from_path) == ("resume_path", f"{tmp_path}/global_step_2")
    assert (second.trainer.resume_mode, second.trainer.resume_from_path) == ("auto", "")
    assert third.trainer.resume_mode == "disable"


def test_an_empty_section_means_its_defaults(tmp_path):
    loaded = load(write(tmp_path, """
        algorithm:
          # nothing set here
        trainer:
        buffer:
          explorer_input:
            eval_tasksets:
          trainer_input:
            auxiliary_buffers:
              sft:
    """))
    c = loaded.config
    assert c.algorithm.algorithm_type == "ppo" and c.trainer.resume_mode == "auto"
    assert c.buffer.explorer_input.eval_tasksets == []
    assert list(c.buffer.trainer_input.auxiliary_buffers) == ["sft"]
    with pytest.raises(ConfigError, match="project: got None"):  # a scalar left empty is still wrong
        load(write(tmp_path, "project:\n", "d.yaml"))
