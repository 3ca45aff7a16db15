"""Settings: sources and precedence, Trinity-RFT YAML compatibility, derived defaults, errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from schemas.config import TrinityConfig
from schemas.loader import ConfigError, load_config, to_yaml

ROOT = Path(__file__).resolve().parents[2]
GSM8K = ROOT / "examples" / "grpo_gsm8k" / "gsm8k.yaml"


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def load(path=None, overrides=(), env=None, dotenv=None):
    return load_config(path, overrides, environ=env or {}, dotenv_file=dotenv)


def test_every_field_has_a_docstring():
    missing = []

    def walk(model, prefix):
        for name, f in model.model_fields.items():
            if not f.description:
                missing.append(prefix + name)
            ann = getattr(f.annotation, "model_fields", None)
            if ann is not None:
                walk(f.annotation, prefix + name + ".")

    walk(TrinityConfig, "")
    assert missing == []


def test_seed_gsm8k_config_loads_unchanged_with_derived_defaults():
    loaded = load(GSM8K)
    c = loaded.config
    assert c.algorithm.algorithm_type == "grpo"
    assert c.buffer.train_batch_size == 1024  # 128 tasks x 8 repeats
    assert loaded.source_of("buffer.train_batch_size") == "derived"
    assert c.model.max_prompt_tokens == 2048 - 1024
    assert c.buffer.explorer_input.taskset.repeat_times == 8
    assert c.buffer.explorer_input.taskset.rollout_args.n == 8
    assert c.buffer.explorer_input.eval_tasksets[0].repeat_times == 1
    assert c.buffer.explorer_input.eval_tasksets[0].default_workflow_type == "math_workflow"
    assert c.model.model_path == "Qwen/Qwen2.5-1.5B-Instruct"  # ${oc.env:...,default}
    assert c.checkpoint_root_dir == "./checkpoints"
    # 'sqlite:///gsm8k.db' is Trinity-RFT's experience database: the SQL store (storage/sql.py)
    assert c.buffer.trainer_input.experience_buffer.path == "sqlite:///gsm8k.db"
    assert not any("sqlite" in w for w in loaded.warnings)


def test_oc_env_and_node_interpolation(tmp_path):
    p = write(
        tmp_path,
        """
        model:
          model_path: ${oc.env:MY_MODEL,/models/default}
          critic_model_path: ${model.model_path}
          max_model_len: 100
          max_response_tokens: 40
        name: run_${model.max_model_len}
    """,
    )
    c = load(p, env={"MY_MODEL": "/m/x"}).config
    assert c.model.model_path == "/m/x"
    assert c.model.critic_model_path == "/m/x"
    assert c.name == "run_100"
    assert load(p).config.model.model_path == "/models/default"


def test_missing_env_without_default_names_the_key(tmp_path):
    p = write(tmp_path, "model:\n  model_path: ${oc.env:NOPE_NOT_SET}\n")
    with pytest.raises(
        ConfigError, match=r"model\.model_path: environment variable 'NOPE_NOT_SET' is not set"
    ):
        load(p)


def test_precedence_cli_over_env_over_dotenv_over_file(tmp_path):
    p = write(
        tmp_path, "algorithm:\n  repeat_times: 2\nbuffer:\n  batch_size: 3\nproject: fromfile\n"
    )
    dotenv = write(
        tmp_path, "TRINITY_ALGORITHM__REPEAT_TIMES=5\nTRINITY_PROJECT=fromdotenv\n", ".env"
    )
    env = {"TRINITY_ALGORITHM__REPEAT_TIMES": "6"}
    loaded = load(p, env=env, dotenv=dotenv)
    assert loaded.config.algorithm.repeat_times == 6
    assert loaded.source_of("algorithm.repeat_times") == "env TRINITY_ALGORITHM__REPEAT_TIMES"
    assert loaded.config.project == "fromdotenv"
    assert loaded.source_of("project").startswith(".env")
    assert loaded.source_of("buffer.batch_size").startswith("file ")
    loaded = load(p, overrides=["algorithm.repeat_times=7"], env=env, dotenv=dotenv)
    assert loaded.config.algorithm.repeat_times == 7
    assert loaded.source_of("algorithm.repeat_times") == "cli"
    assert loaded.config.buffer.train_batch_size == 21


def test_trinity_config_env_names_the_file(tmp_path):
    p = write(tmp_path, "project: viaenv\n")
    assert load(env={"TRINITY_CONFIG": str(p)}).config.project == "viaenv"


def test_misspelled_key_suggests_the_right_one(tmp_path):
    p = write(tmp_path, "algoritm:\n  algorithm_type: grpo\n")
    with pytest.raises(ConfigError) as e:
        load(p)
    assert "algoritm: unknown key" in str(e.value)
    assert "did you mean 'algorithm'" in str(e.value)


def test_nested_misspelling_and_env_misspelling(tmp_path):
    p = write(tmp_path, "buffer:\n  explorer_input:\n    taskset:\n      prompt_key: q\n")
    with pytest.raises(
        ConfigError, match=r"buffer\.explorer_input\.taskset\.prompt_key: unknown key"
    ):
        load(p)
    with pytest.raises(
        ConfigError,
        match=r"algorithm\.repeat_timez: unknown key \(from env TRINITY_ALGORITHM__REPEAT_TIMEZ\); did you mean 'algorithm\.repeat_times'",
    ):
        load(env={"TRINITY_ALGORITHM__REPEAT_TIMEZ": "3"})


def test_wrong_type_and_value_name_path_value_and_expectation(tmp_path):
    p = write(tmp_path, "algorithm:\n  repeat_times: many\nmode: sideways\n")
    with pytest.raises(ConfigError) as e:
        load(p)
    msg = str(e.value)
    assert "algorithm.repeat_times: got 'many'" in msg and "valid integer" in msg
    assert "mode: got 'sideways'" in msg and "'both'" in msg
    assert "from file" in msg


def test_unimplemented_trinity_sections_warn_once_and_are_ignored(tmp_path):
    p = write(
        tmp_path,
        """
        trainer:
          trainer_config:
            actor_rollout_ref: {}
            foo: 1
          save_interval: 5
        actor_rollout_ref:
          hybrid_engine: true
        service:
          data_juicer: {server_url: 'http://x'}
    """,
    )
    loaded = load(p)
    assert loaded.config.trainer.save_interval == 5
    joined = "\n".join(loaded.warnings)
    assert "trainer.trainer_config is ignored" in joined
    assert "actor_rollout_ref is ignored" in joined
    assert "service is ignored" in joined
    assert len(loaded.warnings) == len(set(loaded.warnings))


def test_stages_inherit_global_config(tmp_path):
    p = write(
        tmp_path,
        """
        name: exp
        algorithm: {algorithm_type: grpo, repeat_times: 4}
        buffer: {batch_size: 2, explorer_input: {taskset: {path: /data/t}}}
        stages:
          - stage_name: sft_warmup
            mode: train
            algorithm: {algorithm_type: sft}
            buffer:
              train_batch_size: 16
              total_steps: 10
              trainer_input: {experience_buffer: {name: sft, path: /data/sft}}
          - stage_name: rft
    """,
    )
    loaded = load(p)
    sft, rft = loaded.stages
    assert sft.name == "exp/sft_warmup" and rft.name == "exp/rft"
    assert sft.mode == "train" and rft.mode == "both"
    assert sft.algorithm.algorithm_type == "sft" and sft.algorithm.repeat_times == 4
    assert sft.buffer.trainer_input.experience_buffer.storage_type == "file"
    assert sft.buffer.train_batch_size == 16 and sft.trainer.total_steps == 10
    assert rft.algorithm.algorithm_type == "grpo" and rft.buffer.train_batch_size == 8
    assert sft.trainer.save_hf_checkpoint == "last"


def test_bad_key_inside_a_stage_names_the_stage(tmp_path):
    p = write(tmp_path, "stages:\n  - stage_name: a\n    algorithm: {algoritm_type: sft}\n")
    with pytest.raises(ConfigError, match=r"stages\[0\]\.algorithm\.algoritm_type: unknown key"):
        load(p)


def test_sources_rendering(tmp_path):
    p = write(tmp_path, "algorithm:\n  repeat_times: 2\n")
    text = to_yaml(load(p, env={"TRINITY_BUFFER__BATCH_SIZE": "3"}), with_sources=True)
    assert "repeat_times: 2  # file " in text
    assert "batch_size: 3  # env TRINITY_BUFFER__BATCH_SIZE" in text
    assert "train_batch_size: 6  # derived" in text
    assert "lr: 1.0e-06  # default" in text


def test_yaml_syntax_error_and_missing_file_name_the_file(tmp_path):
    p = write(tmp_path, "a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(p)
    with pytest.raises(ConfigError, match="nothere.yaml.*not found"):
        load(tmp_path / "nothere.yaml")


def test_set_override_syntax_errors():
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load(overrides=["algorithm.repeat_times"])


def test_algorithm_parts_resolved_from_ops_in_roles_settings(tmp_path):
    from roles.runtime.config import resolve_algorithm

    p = write(
        tmp_path, "algorithm: {algorithm_type: grpo, policy_loss_fn_args: {clip_range: 0.1}}\n"
    )
    c = load_config(p, environ={}, dotenv_file=None, algorithm_resolver=resolve_algorithm).config
    assert c.algorithm.repeat_times == 2  # grpo's default group size, not the config default 1
    assert c.algorithm.advantage_fn == "grpo" and c.algorithm.policy_loss_fn == "ppo"
    assert c.algorithm.policy_loss_fn_args["clip_range"] == 0.1
    bad = write(tmp_path, "algorithm: {algorithm_type: grpo, kl_loss_fn: k9}\n", "bad.yaml")
    with pytest.raises(
        ConfigError, match=r"algorithm\.kl_loss_fn: unknown kl_fn 'k9'; valid names: .*k3"
    ):
        load_config(bad, environ={}, dotenv_file=None, algorithm_resolver=resolve_algorithm)


def test_exponent_floats_read_as_numbers_as_omegaconf_reads_them(tmp_path):
    """Upstream's DAPO writes ``clip_ratio_c: 1.0e6``: PyYAML (YAML 1.1) reads a string, and a
    free-form part setting kept it (refused now: not a number); Trinity-RFT's OmegaConf and
    YAML 1.2 read a float. From the file and from --set alike."""
    from roles.runtime.config import resolve_algorithm

    p = write(tmp_path, "algorithm: {algorithm_type: ppo, policy_loss_fn_args: {clip_ratio_c: 1.0e6}}\n"
                        "trainer: {max_token_len_per_gpu: 1e4}\n")
    c = load_config(p, ["algorithm.kl_loss_fn_args={kl_coef: 1e-3}"], environ={}, dotenv_file=None,
                    algorithm_resolver=resolve_algorithm).config
    assert c.algorithm.policy_loss_fn_args["clip_ratio_c"] == 1e6
    assert c.algorithm.kl_loss_fn_args["kl_coef"] == 1e-3
    assert c.trainer.max_token_len_per_gpu == 10000


def test_stage_switching_algorithm_drops_global_parts(tmp_path):
    from roles.runtime.config import resolve_algorithm

    p = write(
        tmp_path,
        """
        algorithm: {algorithm_type: grpo, repeat_times: 4, policy_loss_fn_args: {clip_range: 0.1}, optimizer: {lr: 0.5}}
        stages:
          - stage_name: sft
            mode: train
            algorithm: {algorithm_type: sft}
            buffer: {trainer_input: {experience_buffer: {path: /d}}}
          - stage_name: rl
    """,
    )
    loaded = load_config(p, environ={}, dotenv_file=None, algorithm_resolver=resolve_algorithm)
    sft, rl = loaded.stages
    assert sft.algorithm.policy_loss_fn == "sft" and sft.algorithm.optimizer.lr == 0.5
    assert rl.algorithm.policy_loss_fn_args["clip_range"] == 0.1


def test_dotenv_like_honchos_selects_the_file_and_ignores_other_programs_variables(tmp_path):
    """A ``.env`` for honcho holds TRINITY_CONFIG, process settings and other programs'
    variables beside config values: only the config values are config."""
    yml = tmp_path / "exp.yaml"
    yml.write_text("project: p\nname: from_yaml\n")
    env = tmp_path / ".env"
    env.write_text(f"TRINITY_CONFIG={yml}\nTRINITY_WEIGHT_SYNC_HOST=10.0.0.1\nCUDA_VISIBLE_DEVICES=0\n"
                   "TRINITY_BUFFER__BATCH_SIZE=7\n")
    c = load_config(None, environ={}, dotenv_file=env).config
    assert (c.name, c.buffer.batch_size) == ("from_yaml", 7)
    env.write_text("TRINITY_BUFER__BATCH_SIZE=7\n")  # a typo of ours is still an error, named
    with pytest.raises(ConfigError, match="trinity_bufer"):
        load_config(str(yml), environ={}, dotenv_file=env)


def test_over_rollout_and_dynamic_timeout_checks(tmp_path):
    fixed = load(write(tmp_path, "explorer:\n  over_rollout: {ratio: 0.25}\n"))
    assert any("explorer.over_rollout.ratio is ignored with synchronizer.sync_style 'fixed'" in w
               for w in fixed.warnings)
    p = write(tmp_path, """
        synchronizer: {sync_style: explorer_driven}
        explorer:
          over_rollout: {ratio: 1.5, return_partial_tasks: true}
          dynamic_timeout: {enable: true, ratio: 0}
    """)
    with pytest.raises(ConfigError) as e:
        load(p)
    msg = str(e.value)
    assert "explorer.over_rollout.ratio: must be in [0, 1), got 1.5" in msg
    assert "explorer.over_rollout.return_partial_tasks: not implemented" in msg
    assert "explorer.dynamic_timeout.ratio: must be > 0" in msg


def test_verl_actor_settings_map_to_trinitys_and_lose_to_them(tmp_path):
    p = write(tmp_path, """
        trainer:
          ppo_epochs: 3
          trainer_config:
            actor_rollout_ref:
              actor: {ppo_epochs: 2, ppo_mini_batch_size: 4, shuffle: true, grad_clip: 0.5,
                      ppo_micro_batch_size_per_gpu: 2, use_dynamic_bsz: false, optim: {lr: 2.0e-5}}
    """)
    loaded = load(p)
    t = loaded.config.trainer
    assert (t.ppo_epochs, t.ppo_shuffle, t.grad_clip) == (3, True, 0.5)
    assert (t.micro_batch_size_per_gpu, t.use_dynamic_bsz) == (2, False)
    assert loaded.config.algorithm.optimizer.lr == 2.0e-5
    assert loaded.sources["trainer.ppo_shuffle"].endswith("as trainer.trainer_config.actor_rollout_ref.actor.shuffle")
    assert loaded.sources["trainer.ppo_epochs"].startswith("file")  # trinity's own name won
    # veRL's mini-batch size is overridden by buffer.train_batch_size (the FAQ): one update per batch
    assert t.ppo_mini_batch_size is None
    verl = [w for w in loaded.warnings if "trainer_config" in w]
    assert len(verl) == 2, verl
    assert verl[0].startswith("trainer.trainer_config.actor_rollout_ref.actor.ppo_epochs (2, from file")
    assert "is overridden by trainer.ppo_epochs (3, from file" in verl[0]
    assert verl[1].startswith("trainer.trainer_config.actor_rollout_ref.actor.ppo_mini_batch_size is ignored")
    assert "overridden by buffer.train_batch_size" in verl[1]


def test_model_level_settings_reach_the_engines_and_datasets(tmp_path):
    (tmp_path / "t.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    p = write(tmp_path, f"""
        model: {{model_path: /m, chat_template_path: {tmp_path / 't.jinja'}, custom_chat_template: ignored,
                enable_thinking: false, rope_theta: 5000.0, top_k: 5}}
        algorithm: {{optimizer: {{clip_grad: 0.3}}}}
        buffer:
          explorer_input:
            taskset: {{name: t, path: /d, rollout_args: {{n: 8}}}}
          trainer_input:
            experience_buffer: {{name: sft, storage_type: file, path: /d,
                                format: {{chat_template: own}}}}
            auxiliary_buffers: {{expert: {{path: /d}}}}
    """)
    loaded = load(p)
    c = loaded.config
    rm = c.explorer.rollout_model
    assert rm.chat_template.startswith("{% for m") and rm.enable_thinking is False and rm.rope_theta == 5000.0
    assert c.buffer.trainer_input.experience_buffer.format.chat_template == "own"  # its own wins
    aux = c.buffer.trainer_input.auxiliary_buffers["expert"].format
    assert aux.chat_template.startswith("{% for m") and aux.enable_thinking is False
    assert c.buffer.explorer_input.taskset.rollout_args.top_k == 5
    assert c.trainer.grad_clip == 0.3  # the optimizer's spelling of it
    assert any("rollout_args.n (8) is replaced" in w for w in loaded.warnings)
    bad = write(tmp_path, "model: {model_path: /m, chat_template_path: /nowhere.jinja}", "bad.yaml")
    with pytest.raises(ConfigError, match="model.chat_template_path: /nowhere.jinja: cannot read"):
        load(bad)


@pytest.mark.parametrize("path", ["gsm8k.db", "backup.jsonl", "backup.json"])
def test_a_queue_backup_path_is_warned_not_silently_dropped(path):
    loaded = load(overrides=[f"buffer.trainer_input.experience_buffer.path={path}"])
    eb = loaded.config.buffer.trainer_input.experience_buffer
    assert eb.path is None  # the replay store lives under the run directory
    assert any(w.startswith(f"buffer.trainer_input.experience_buffer.path {path!r}: queue backups")
               for w in loaded.warnings), loaded.warnings


@pytest.mark.parametrize("section", ["algorithm.optimizer", "critic.optim"])
def test_the_deprecated_warmup_style_fills_lr_scheduler_type_unless_that_is_set(section):
    alone = load(overrides=[f"{section}.warmup_style=cosine"])
    both = load(overrides=[f"{section}.warmup_style=constant", f"{section}.lr_scheduler_type=cosine"])
    for loaded, expected in ((alone, "cosine"), (both, "cosine")):  # what the engines read
        opt = loaded.config.algorithm.optimizer if section == "algorithm.optimizer" else loaded.config.critic.optim
        assert opt.lr_scheduler_type == expected
        assert f"{section}.warmup_style is deprecated; use lr_scheduler_type" in loaded.warnings


@pytest.mark.parametrize("field,value,says", [
    ("name", "col a", "use letters, digits"),  # and col_a gave one run id: two runs trained each other's
    ("name", "../../x", "no '/'"),  # a job folder outside checkpoint_root_dir
    ("name", "/abs", "use letters, digits"),
    ("name", "a..b", "use letters, digits"),
    ("name", "x" * 121, "at most 120"),
    ("project", "a/b", "use letters, digits"),
    ("project", "<project_name>", "placeholder"),
])
def test_a_name_that_is_no_safe_folder_and_subject_is_refused(field, value, says):
    with pytest.raises(ValueError, match=says) as e:
        TrinityConfig(**{field: value})
    assert field in str(e.value)


def test_names_with_dots_and_stages_load():
    assert TrinityConfig(project="qwen2.5", name="gsm8k-1.5b_grpo").run_id == "qwen2.5.gsm8k-1.5b_grpo"
    assert TrinityConfig(name="n/sft").checkpoint_job_dir.endswith("n/sft")


def test_older_trinity_rft_names_load_as_todays_with_a_warning(tmp_path):
    """Upstream's own tests still write ``vllm_async``; older configs ``online``/``offline`` and
    ``dynamic_by_*``; retired keys (PRs #226, #227) warn and are dropped instead of stopping."""
    p = write(tmp_path, """
        buffer: {max_retry_times: 3, max_retry_interval: 1}
        data_processor: {data_processor_url: "http://127.0.0.1:5005/data_processor"}
        explorer:
          rollout_model: {engine_type: vllm_async}
          auxiliary_models: [{model_path: /m, engine_type: VLLM_ASYNC}]
        synchronizer: {sync_method: Offline, sync_style: dynamic_by_explorer}
    """)
    loaded = load(p)
    cfg = loaded.config
    assert cfg.explorer.rollout_model.engine_type == "vllm"
    assert cfg.explorer.auxiliary_models[0].engine_type == "vllm"
    assert (cfg.synchronizer.sync_method, cfg.synchronizer.sync_style) == ("checkpoint", "explorer_driven")
    said = "\n".join(loaded.warnings)
    for says in ("explorer.rollout_model.engine_type: 'vllm_async' is an older Trinity-RFT name; read as 'vllm'",
                 "explorer.auxiliary_models[0].engine_type: 'VLLM_ASYNC'",
                 "synchronizer.sync_method: 'Offline'", "synchronizer.sync_style: 'dynamic_by_explorer'",
                 "buffer.max_retry_times is ignored", "PR #227", "explorer.max_retry_times",
                 "buffer.max_retry_interval is ignored", "data_processor.data_processor_url is ignored"):
        assert says in said, says
    with pytest.raises(ConfigError, match=r"engine_type.*'sglang'"):  # a name we lack still stops
        load(p, ["explorer.rollout_model.engine_type=sglang"])


def test_a_training_and_an_eval_taskset_may_share_a_name_but_not_two_of_one_role(tmp_path):
    p = write(tmp_path, """
        buffer:
          explorer_input:
            taskset: {name: frozenlake, path: /d}
            eval_tasksets: [{name: frozenlake, path: /d}]
    """)
    ei = load(p).config.buffer.explorer_input
    assert ei.taskset.name == ei.eval_tasksets[0].name == "frozenlake"
    with pytest.raises(ConfigError, match=r"eval_tasksets\[1\]\.name: 'frozenlake' is also the name of .*"
                                          r"eval_tasksets\[0\]; eval taskset names must be unique"):
        load(p, ["buffer.explorer_input.eval_tasksets=[{name: frozenlake, path: /d}, {name: frozenlake, path: /e}]"])


def test_a_setting_with_one_value_here_says_why_the_others_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"taskset.storage_type: got 'sql'.*expected input should be 'file' "
                                          r"\(Where tasks come from. Only ``file``"):
        load(None, ["buffer.explorer_input.taskset.storage_type=sql"])


def test_sequence_parallelism_is_warned_and_read_as_one():
    """Upstream's examples set it (11 of them to 2): the loss is the same without it."""
    loaded = load(None, ["trainer.ulysses_sequence_parallel_size=2", "model.max_model_len=100"])
    assert loaded.config.trainer.ulysses_sequence_parallel_size == 1
    assert loaded.config.trainer.max_token_len_per_gpu is None  # sized at start: whole sequences per GPU
    assert any("ulysses_sequence_parallel_size=2 is ignored: sequence parallelism is not implemented" in w
               for w in loaded.warnings)


def test_upstreams_mix_batch_layout_args_are_warned_and_dropped():
    """Trinity-RFT's mix examples write the batch layout into the loss's args; the trainer counts it."""
    loaded = load(None, ["algorithm.algorithm_type=mix", "algorithm.policy_loss_fn_args={mu: 0.2, ngpus_trainer: 4, "
                         "train_batch_size_usual: 256, sft_loss_agg_mode: token-mean}"])
    assert loaded.config.algorithm.policy_loss_fn_args == {"mu": 0.2, "sft_loss_agg_mode": "token-mean"}
    assert any("ngpus_trainer, train_batch_size_usual ignored" in w for w in loaded.warnings)
    other = load(None, ["algorithm.algorithm_type=ppo", "algorithm.policy_loss_fn_args={ngpus_trainer: 4}"])
    assert other.config.algorithm.policy_loss_fn_args == {"ngpus_trainer": 4}  # only mix's: ppo refuses it


def test_tinker_is_refused_as_a_remote_service_and_its_off_switch_ignored():
    with pytest.raises(ConfigError, match=r"model.tinker.enable: true: Tinker trains on Thinking Machines' remote service"):
        load(None, ["model.tinker={enable: true}"])
    assert any("model.tinker" in w for w in load(None, ["model.tinker={enable: false}"]).warnings)


def test_sync_method_memory_loads_as_upstream_writes_it(tmp_path):
    """sync_method: memory (upstream's name, its one-GPU sync): weights through shared memory
    (roles/weightsync/memory.py); a value trinity lacks still names the ones it takes."""
    assert load(write(tmp_path, "synchronizer: {sync_method: memory}\n")).config.synchronizer.sync_method == "memory"
    with pytest.raises(ConfigError, match=r"synchronizer\.sync_method: got 'ipc'.*'nccl', 'checkpoint' or 'memory'"):
        load(write(tmp_path, "synchronizer: {sync_method: ipc}\n"))


def test_weights_move_through_memory_by_default_on_one_cpu_machine(tmp_path):
    """Unasked, on one CPU machine, the weights go through shared memory (5-10x gloo's rate,
    docs/performance.md); a method the config names is kept, GPUs and several nodes keep
    nccl's broadcast, and a mode without live weights still loads checkpoints."""
    def method(text: str = "", *sets: str) -> tuple[str, str]:
        lc = load(write(tmp_path, text or "project: p\n"), overrides=list(sets))
        return lc.config.synchronizer.sync_method, lc.sources.get("synchronizer.sync_method", "default")

    assert method() == ("memory", "derived")
    assert method("synchronizer: {sync_method: nccl}\n")[0] == "nccl"
    assert method("", "synchronizer.sync_method=nccl")[0] == "nccl"
    assert method("", "cluster.gpu_per_node=2")[0] == "nccl"
    assert method("", "cluster.node_num=2")[0] == "nccl"
    assert method("", "mode=train")[0] == "checkpoint"


def test_set_reaches_into_a_list_item_by_index(tmp_path):
    """Trinity-RFT's configs list their judge models and stages: ``--set`` changes one field of
    one item (the rest of the item, and the other items, stay as the file has them)."""
    p = write(tmp_path, """
        explorer:
          auxiliary_models:
            - {model_path: judge, tensor_parallel_size: 2, engine_num: 1}
            - {model_path: other, tensor_parallel_size: 2}
        """)
    loaded = load(p, overrides=["explorer.auxiliary_models.0.tensor_parallel_size=1"])
    judge, other = loaded.config.explorer.auxiliary_models
    assert (judge.model_path, judge.tensor_parallel_size, other.tensor_parallel_size) == ("judge", 1, 2)
    assert loaded.sources["explorer.auxiliary_models[0].tensor_parallel_size"] == "cli"
    with pytest.raises(ConfigError, match=r"explorer.auxiliary_models.2: explorer.auxiliary_models has 2 item"):
        load(p, overrides=["explorer.auxiliary_models.2.model_path=x"])
    with pytest.raises(ConfigError, match=r"explorer.auxiliary_models.-1: explorer.auxiliary_models is a list; "
                                          r"name an item by its index from 0"):
        load(p, overrides=["explorer.auxiliary_models.-1.model_path=x"])


@pytest.mark.parametrize("root", ["", "trainer: {trainer_config: "])
@pytest.mark.parametrize(("verl", "ours", "value"), [
    ("model: {enable_gradient_checkpointing: false}", "trainer.deepspeed.gradient_checkpointing", False),
    ("actor: {fsdp_config: {param_offload: true}}", "trainer.deepspeed.offload_param", True),
    ("actor: {fsdp_config: {optimizer_offload: true}}", "trainer.deepspeed.offload_optimizer", True),
])
def test_verl_memory_settings_reach_ours(tmp_path, root, verl, ours, value):
    """The settings a GPU user sets to fit a model (the FAQ's out-of-memory answer) are read
    into trinity's, at the top level or in Trinity-RFT's inline veRL block, never dropped."""
    text = f"{root}{{actor_rollout_ref: {{{verl}}}}}" + ("}" if root else "")
    loaded = load(write(tmp_path, text + "\n"))
    node = loaded.config
    for part in ours.split("."):
        node = getattr(node, part)
    assert node is value
    assert "as " in loaded.sources[ours] and "actor_rollout_ref" in loaded.sources[ours]
    assert not [w for w in loaded.warnings if "actor_rollout_ref" in w], loaded.warnings


@pytest.mark.parametrize("key", ["entropy_from_logits_with_chunking", "entropy_checkpointing"])
def test_verl_entropy_memory_switches_are_always_on_here(tmp_path, key):
    """trinity computes the entropy in blocks and recomputes it in backward (ops/logits.py):
    veRL's switch for it set true asks for what is done (quiet), false is named in a warning."""
    on = load(write(tmp_path, f"actor_rollout_ref: {{actor: {{{key}: true}}}}\n"))
    assert not [w for w in on.warnings if key in w], on.warnings
    off = load(write(tmp_path, f"actor_rollout_ref: {{actor: {{{key}: false}}}}\n"))
    assert [w for w in off.warnings if key in w and "ops/logits.py" in w], off.warnings


def test_a_cpu_machines_engines_default_to_transformers_and_say_so(tmp_path):
    """vLLM-CPU busy-polls a core after every message (docs/performance.md#vllm-on-cpu): on a
    CPU machine an engine whose type nobody set runs on transformers, in a note; a type set
    anywhere (file, stage, --set) and a GPU machine keep vLLM."""
    p = write(tmp_path, """
        model: {model_path: /m}
        explorer:
          auxiliary_models: [{model_path: /judge}, {model_path: /teacher, engine_type: vllm}]
        stages:
          - {stage_name: a}
          - {stage_name: b, explorer: {rollout_model: {engine_type: vllm}}}
    """)
    loaded = load(p)
    a, b = loaded.stages
    for cfg in (loaded.config, a):
        assert cfg.explorer.rollout_model.engine_type == "transformers"
    assert b.explorer.rollout_model.engine_type == "vllm"
    assert [m.engine_type for m in a.explorer.auxiliary_models] == ["transformers", "vllm"]
    assert [n.split(":")[0] for n in loaded.notes] == ["explorer.rollout_model.engine_type",
                                                        "explorer.auxiliary_models[0].engine_type"]
    assert "busy-polls" in loaded.notes[0] and "set engine_type: vllm" in loaded.notes[0]
    assert not [w for w in loaded.warnings if "engine_type" in w]
    assert load(p, ["explorer.rollout_model.engine_type=vllm"]).config.explorer.rollout_model.engine_type == "vllm"
    gpu = load(p, ["cluster.gpu_per_node=1"])
    assert gpu.config.explorer.rollout_model.engine_type == "vllm" and not gpu.notes


def test_the_trainer_computes_the_old_log_probs_where_the_engines_dtype_differs(tmp_path):
    """bypass_old_logprobs (the engine's log-probs as the old policy's) only where engine and
    trainer compute in one dtype: a bfloat16 vLLM beside a float32 trainer would put the ratio
    off 1 before any update. Said in a note; a value set, m2po (which needs the engine's) and an
    unknown dtype keep it."""
    p = write(tmp_path, """
        model: {model_path: /m}
        cluster: {gpu_per_node: 1}
        trainer: {deepspeed: {bf16: false}}
    """)
    loaded = load(p)
    assert loaded.config.algorithm.bypass_old_logprobs is False
    assert [n for n in loaded.notes if n.startswith("algorithm.bypass_old_logprobs: false")]
    assert "bfloat16" in loaded.notes[0] and "float32" in loaded.notes[0] and "rollout/kl" in loaded.notes[0]
    assert load(p, ["trainer.deepspeed.bf16=true"]).config.algorithm.bypass_old_logprobs  # DeepSpeed bf16: one dtype
    # the PyTorch trainer computes in the engine's bfloat16 (autocast), not in float16
    assert load(p, ["trainer.trainer_type=pytorch"]).config.algorithm.bypass_old_logprobs
    fp16 = ["trainer.trainer_type=pytorch", "explorer.rollout_model.dtype=float16"]
    assert not load(p, fp16).config.algorithm.bypass_old_logprobs
    for kept in (["algorithm.bypass_old_logprobs=true"], ["algorithm.policy_loss_fn=m2po"],
                 ["explorer.rollout_model.dtype=float32", "trainer.trainer_type=pytorch"],
                 ["explorer.rollout_model.dtype=auto"], ["cluster.gpu_per_node=0"]):
        same = load(p, kept)
        assert same.config.algorithm.bypass_old_logprobs, kept
        assert not [n for n in same.notes if "bypass_old_logprobs" in n], kept
