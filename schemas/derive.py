"""Derived defaults: the values Trinity-RFT's configuration guide says "default to X".

:func:`derive` runs on a validated :class:`schemas.config.TrinityConfig`, after the sources are
merged. It fills, among others: the model's token limits (any two give the third), the train
batch size, each taskset's name, repeat times, workflow and rollout arguments, the experience
buffer, the rollout engine's limits, the trainer's token budget, the sync intervals. Each
value it fills is recorded as :data:`DERIVED` in ``sources``, so ``trinity config --sources``
shows it; combinations no single field can check are returned as problems, and settings it
overrides or ignores as warnings.

Why a module of its own: these are rules about what the settings mean, one after another,
changed whenever a section gains a field; :mod:`schemas.loader` is about where values come from
(files, env, ``--set``), merging and error messages, and calls :func:`derive` once per
validated config. The provenance labels live here because both use them; the dependency points
one way (the loader imports this module, never the reverse).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from schemas.config import (
    UNUSED_FIELDS,
    ExperienceBufferConfig,
    TasksetConfig,
    TrinityConfig,
)
from schemas.modes import MODES

#: The name of a checkpoint folder (``storage.checkpoints.STEP_DIR_RE``; not imported: this
#: module stays free of torch).
STEP_FOLDER = re.compile(r"^global_step_(\d+)$")

#: ``sources`` label of a value nobody set.
DEFAULT = "default"
#: ``sources`` label of a value :func:`derive` filled.
DERIVED = "derived"


def derive(cfg: TrinityConfig, sources: dict[str, str], warnings: list[str],
           notes: list[str] | None = None) -> list[str]:
    """Fill the defaults the configuration guide describes as derived. Returns problems found.
    ``notes`` gets a line for each default chosen by a rule a user should hear of (the rollout
    engine on a CPU machine): not a mistake, so not a warning.

    Each derived value is recorded as ``derived`` in ``sources`` so ``--sources`` shows it.
    The steps run in this order because later ones read what earlier ones filled (the
    tasksets' ``max_tokens`` is the derived ``max_response_tokens``, the engines read the
    experience buffer the step before made).
    """
    d = _Derivation(cfg, sources, warnings, notes if notes is not None else [])
    _token_limits(d)
    template = _model_paths(d)
    _algorithm(d)
    _batch_sizes(d)
    _task_pipeline(d)
    _tasksets(d)
    _experience_buffer(d)
    _over_rollout(d)
    _engines(d, template)
    _trainer(d)
    _old_logprobs(d)
    _synchronizer(d)
    _bus(d)
    warnings += [f"{path} is accepted but has no effect: {why}" for path, why in unused_settings(cfg)]
    return d.problems


@dataclass
class _Derivation:
    """One config being derived: where each value came from, and what was found."""

    cfg: TrinityConfig
    sources: dict[str, str]
    warnings: list[str]
    notes: list[str]
    problems: list[str] = field(default_factory=list)

    def put(self, obj: Any, attr: str, value: Any, path: str) -> None:
        setattr(obj, attr, value)
        self.sources[path] = DERIVED

    def user_set(self, path: str) -> bool:
        return path in self.sources and self.sources[path] not in (DEFAULT, DERIVED)


def _token_limits(d: _Derivation) -> None:
    """The model's token limits: any two of (max_model_len, max_prompt_tokens,
    max_response_tokens) give the third."""
    m = d.cfg.model
    if (
        m.max_model_len is None
        and m.max_prompt_tokens is not None
        and m.max_response_tokens is not None
    ):
        d.put(m, "max_model_len", m.max_prompt_tokens + m.max_response_tokens, "model.max_model_len")
    elif (
        m.max_model_len is not None
        and m.max_response_tokens is not None
        and m.max_prompt_tokens is None
    ):
        d.put(
            m,
            "max_prompt_tokens",
            m.max_model_len - m.max_response_tokens,
            "model.max_prompt_tokens",
        )
    elif (
        m.max_model_len is not None
        and m.max_prompt_tokens is not None
        and m.max_response_tokens is None
    ):
        d.put(
            m,
            "max_response_tokens",
            m.max_model_len - m.max_prompt_tokens,
            "model.max_response_tokens",
        )
    if m.max_prompt_tokens is not None and m.max_prompt_tokens <= 0:
        d.problems.append(
            f"model.max_prompt_tokens: got {m.max_prompt_tokens}; expected > 0 (max_model_len must exceed max_response_tokens)"
        )
    if m.max_response_tokens is not None and m.min_response_tokens >= m.max_response_tokens:
        d.problems.append(
            f"model.min_response_tokens: got {m.min_response_tokens}; expected less than model.max_response_tokens ({m.max_response_tokens})"
        )
    if (
        m.max_model_len is not None
        and m.max_prompt_tokens is not None
        and m.max_response_tokens is not None
    ):
        if m.max_prompt_tokens + m.max_response_tokens > m.max_model_len:
            d.warnings.append(
                f"model: max_prompt_tokens + max_response_tokens ({m.max_prompt_tokens} + {m.max_response_tokens}) exceeds max_model_len ({m.max_model_len}); long responses will be cut at max_model_len"
            )


def _model_paths(d: _Derivation) -> str | None:
    """The critic starts from the model; the chat template is read from its file once
    (the engines and the trainer's datasets share it). Returns the template."""
    m = d.cfg.model
    if not m.critic_model_path:
        d.put(m, "critic_model_path", m.model_path, "model.critic_model_path")
    template = m.custom_chat_template
    if m.chat_template_path:
        try:
            with open(os.path.expanduser(m.chat_template_path), encoding="utf-8") as f:
                template = f.read()
        except (OSError, UnicodeDecodeError) as e:
            d.problems.append(f"model.chat_template_path: {m.chat_template_path}: cannot read: {e}")
    return template


def _algorithm(d: _Derivation) -> None:
    """DPO's pairs, and the deprecated scheduler alias."""
    alg = d.cfg.algorithm
    cfg = d.cfg
    if alg.algorithm_type == "dpo" and alg.repeat_times != 2:
        d.put(alg, "repeat_times", 2, "algorithm.repeat_times")
    # the deprecated alias fills lr_scheduler_type (what the train engines read) unless the
    # user set that too, which then wins: what `trinity config` shows is what trains
    for o, where in ((alg.optimizer, "algorithm.optimizer"), (cfg.critic.optim, "critic.optim")):
        if o.warmup_style is not None:
            d.warnings.append(f"{where}.warmup_style is deprecated; use lr_scheduler_type")
            if not d.user_set(f"{where}.lr_scheduler_type"):
                d.put(o, "lr_scheduler_type", o.warmup_style, f"{where}.lr_scheduler_type")


def _batch_sizes(d: _Derivation) -> None:
    """The train batch and the trainer's steps from the explorer's."""
    buf = d.cfg.buffer
    alg = d.cfg.algorithm
    tr = d.cfg.trainer
    if buf.train_batch_size == 0:
        d.put(buf, "train_batch_size", buf.batch_size * alg.repeat_times, "buffer.train_batch_size")
    if tr.total_steps is None and buf.total_steps is not None:
        d.put(tr, "total_steps", buf.total_steps, "trainer.total_steps")


def _task_pipeline(d: _Derivation) -> None:
    """One training taskset or several, not both; a task pipeline's output is the training
    taskset (Trinity-RFT's rule)."""
    ei = d.cfg.buffer.explorer_input
    cfg = d.cfg
    if ei.taskset is not None and ei.tasksets:
        d.problems.append("buffer.explorer_input.tasksets: set it or buffer.explorer_input.taskset, not both")
    tp = cfg.data_processor.task_pipeline
    if tp is not None and tp.inputs:  # its output is the training taskset (Trinity-RFT's rule)
        out = task_pipeline_dir(cfg)
        if ei.tasksets:
            d.problems.append("data_processor.task_pipeline.inputs: its output is the one training taskset; "
                            "buffer.explorer_input.tasksets mixes several")
        else:
            if ei.taskset is None:  # "the output will be set to the explorer input automatically"
                d.put(ei, "taskset", TasksetConfig(name="taskset"), "buffer.explorer_input.taskset")
                d.warnings.append("buffer.explorer_input.taskset is made from data_processor.task_pipeline's "
                                "output with the default format (prompt_key 'prompt', ...); set the "
                                "taskset to choose its format and workflow")
            if ei.taskset.path and ei.taskset.path != out:
                d.warnings.append(f"buffer.explorer_input.taskset.path ({ei.taskset.path}) is replaced by the "
                                f"task pipeline's output ({out})")
            d.put(ei.taskset, "path", out, "buffer.explorer_input.taskset.path")
            d.put(ei.taskset, "split", "train", "buffer.explorer_input.taskset.split")
            d.put(ei.taskset, "subset_name", None, "buffer.explorer_input.taskset.subset_name")


def _tasksets(d: _Derivation) -> None:
    """Each taskset's name, repeat times, workflow, reward and rollout arguments."""
    ei = d.cfg.buffer.explorer_input
    alg = d.cfg.algorithm
    m = d.cfg.model
    tasksets = [(path, ts, False) for path, ts in ei.training()] + [
        (f"buffer.explorer_input.eval_tasksets[{i}]", ts, True)
        for i, ts in enumerate(ei.eval_tasksets)
    ]
    # unique per role: a training and an eval taskset may share one (upstream's FrozenLake
    # examples do); their metrics stay apart by kind (``rollout/...`` and ``eval/<name>/...``)
    seen_names: dict[tuple[bool, str], str] = {}
    for path, ts, is_eval in tasksets:
        if not ts.name:
            name = (f"eval_{path[-2]}" if is_eval else "taskset" if path.endswith("taskset")
                    else f"taskset_{path[-2]}")
            d.put(ts, "name", name, f"{path}.name")
        if (is_eval, ts.name) in seen_names:
            role = "eval" if is_eval else "training"
            d.problems.append(f"{path}.name: {ts.name!r} is also the name of {seen_names[is_eval, ts.name]}; "
                            f"{role} taskset names must be unique")
        seen_names[is_eval, ts.name] = path
        if is_eval:
            if ts.repeat_times is None:
                d.put(ts, "repeat_times", 1, f"{path}.repeat_times")
            wf = ei.default_eval_workflow_type or ei.default_workflow_type
        else:
            if ts.repeat_times is not None and ts.repeat_times != alg.repeat_times:
                d.warnings.append(
                    f"{path}.repeat_times ({ts.repeat_times}) is overridden by algorithm.repeat_times ({alg.repeat_times})"
                )
            if ts.repeat_times != alg.repeat_times:
                d.put(ts, "repeat_times", alg.repeat_times, f"{path}.repeat_times")
            wf = ei.default_workflow_type
        if ts.default_workflow_type is None and wf is not None:
            d.put(ts, "default_workflow_type", wf, f"{path}.default_workflow_type")
        if ts.default_reward_fn_type is None and ei.default_reward_fn_type is not None:
            d.put(
                ts,
                "default_reward_fn_type",
                ei.default_reward_fn_type,
                f"{path}.default_reward_fn_type",
            )
        if getattr(ts, "weight", None) is not None and getattr(ts, "weight_schedule", None):
            d.warnings.append(f"{path}.weight ({ts.weight}) is replaced by {path}.weight_schedule")
        if ts.data_selector is not None:
            d.warnings.append(f"{path}.data_selector is the older name of task_selector; use task_selector")
            d.put(ts, "task_selector", ts.data_selector, f"{path}.task_selector")
            d.put(ts, "data_selector", None, f"{path}.data_selector")
        ra = ts.rollout_args
        for attr, value in (
            ("temperature", m.temperature),
            ("top_p", m.top_p),
            ("top_k", m.top_k),
            ("max_tokens", m.max_response_tokens),
        ):
            if getattr(ra, attr) is None and value is not None:
                d.put(ra, attr, value, f"{path}.rollout_args.{attr}")
        if ra.n != ts.repeat_times:
            if ra.n is not None and ra.n != 1:
                d.warnings.append(f"{path}.rollout_args.n ({ra.n}) is replaced by the taskset's "
                                f"repeat_times ({ts.repeat_times}): rollouts per task are repeat_times")
            d.put(ra, "n", ts.repeat_times, f"{path}.rollout_args.n")


def _experience_buffer(d: _Derivation) -> None:
    """The trainer's input: made when absent, its storage checked against the algorithm."""
    ti = d.cfg.buffer.trainer_input
    alg = d.cfg.algorithm
    if ti.experience_buffer is None:
        d.put(
            ti,
            "experience_buffer",
            ExperienceBufferConfig(name="experience_buffer"),
            "buffer.trainer_input.experience_buffer",
        )
    eb = ti.experience_buffer
    ebp = "buffer.trainer_input.experience_buffer"
    if not eb.name:
        d.put(eb, "name", "experience_buffer", f"{ebp}.name")
    if (
        alg.algorithm_type in ("sft", "dpo")
        and eb.storage_type == "queue"
        and not d.user_set(f"{ebp}.storage_type")
    ):
        d.put(eb, "storage_type", "file", f"{ebp}.storage_type")
    if eb.storage_type == "sql" and alg.algorithm_type in ("sft", "dpo"):
        d.problems.append(
            f"{ebp}.storage_type: 'sql' here is the experience store the buffer writes; reading an "
            f"{alg.algorithm_type} dataset from a database is not implemented (use storage_type: file)"
        )
    elif eb.storage_type == "sql" and "://" not in (eb.path or ""):
        d.problems.append(
            f"{ebp}.path: storage_type 'sql' needs a SQLAlchemy database URL here "
            f"(sqlite:///experiences.db, postgresql://user@host/db), got {eb.path!r}"
        )
    elif eb.storage_type == "queue" and eb.path and "://" not in eb.path and eb.path.endswith((".db", ".json", ".jsonl")):
        # Trinity-RFT backs its queue up to a JSON file named here (a database URL: storage/sql.py)
        d.warnings.append(
            f"{ebp}.path {eb.path!r}: queue backups to JSON files are not implemented; the replay "
            f"store lives under the run directory (<job>/buffer/{eb.name}), and every experience "
            "stays on the run's stream (trinity inspect --tail 5 --stream exp); a database URL "
            "(sqlite:///experiences.db) here gets every experience in Trinity-RFT's SQL table"
        )
        d.put(eb, "path", None, f"{ebp}.path")
    if eb.storage_type == "file" and not eb.path:
        d.problems.append(
            f"{ebp}.path: required when storage_type is 'file' (the {alg.algorithm_type} dataset)"
        )


def _over_rollout(d: _Derivation) -> None:
    """Over-rollout (Trinity-RFT applies it only under a dynamic sync style) and dynamic
    timeouts: their ranges, and what is not built."""
    ex = d.cfg.explorer
    cfg = d.cfg
    orc = ex.over_rollout
    if not 0 <= orc.ratio < 1:
        d.problems.append(f"explorer.over_rollout.ratio: must be in [0, 1), got {orc.ratio}")
    elif orc.ratio > 0 and cfg.synchronizer.sync_style == "fixed":
        d.warnings.append(
            "explorer.over_rollout.ratio is ignored with synchronizer.sync_style 'fixed' "
            "(every step waits for all its tasks); use explorer_driven or trainer_driven"
        )
    if orc.return_partial_tasks:
        d.problems.append(
            "explorer.over_rollout.return_partial_tasks: not implemented; a task is "
            "published only when all its rollouts succeeded"
        )
    if ex.dynamic_timeout.enable and ex.dynamic_timeout.ratio <= 0:
        d.problems.append(
            f"explorer.dynamic_timeout.ratio: must be > 0, got {ex.dynamic_timeout.ratio}"
        )


def _engines(d: _Derivation, template: str | None) -> None:
    """The rollout and auxiliary engines, and the trainer's datasets, inherit the model's
    limits and template."""
    ex = d.cfg.explorer
    m = d.cfg.model
    ti = d.cfg.buffer.trainer_input
    ebp, eb = "buffer.trainer_input.experience_buffer", ti.experience_buffer
    rm = ex.rollout_model
    for attr in (
        "max_model_len",
        "max_prompt_tokens",
        "max_response_tokens",
        "min_response_tokens",
        "enable_prompt_truncation",
        "repetition_penalty",
    ):
        if getattr(rm, attr) is None and getattr(m, attr) is not None:
            d.put(rm, attr, getattr(m, attr), f"explorer.rollout_model.{attr}")
    if rm.model_path is None and m.model_path:
        d.put(rm, "model_path", m.model_path, "explorer.rollout_model.model_path")
    for attr, value in (("chat_template", template), ("enable_thinking", m.enable_thinking),
                        ("rope_scaling", m.rope_scaling), ("rope_theta", m.rope_theta)):
        if getattr(rm, attr) is None and value is not None:
            d.put(rm, attr, value, f"explorer.rollout_model.{attr}")
    # the trainer's datasets are rendered with the trained model's template
    datasets = [(ebp, eb)] + [(f"buffer.trainer_input.auxiliary_buffers.{k}", b)
                              for k, b in ti.auxiliary_buffers.items()]
    for path, b in datasets:
        for attr, value in (("chat_template", template), ("enable_thinking", m.enable_thinking)):
            if getattr(b.format, attr) is None and value is not None:
                d.put(b.format, attr, value, f"{path}.format.{attr}")
    for j, aux in enumerate(ex.auxiliary_models):  # judges, teachers: same limits by default
        if not aux.model_path:
            d.problems.append(f"explorer.auxiliary_models[{j}].model_path: required")
        for attr in ("max_model_len", "max_prompt_tokens", "max_response_tokens", "min_response_tokens",
                     "enable_prompt_truncation"):
            if getattr(aux, attr) is None and getattr(m, attr) is not None:
                d.put(aux, attr, getattr(m, attr), f"explorer.auxiliary_models[{j}].{attr}")
    if m.external_model.enable and rm.engine_type != "external":
        d.put(rm, "engine_type", "external", "explorer.rollout_model.engine_type")
    if d.cfg.cluster.gpu_per_node == 0:
        for path, engine in [("explorer.rollout_model", rm),
                             *((f"explorer.auxiliary_models[{j}]", a) for j, a in enumerate(ex.auxiliary_models))]:
            if engine.engine_type == "vllm" and "engine_type" not in engine.model_fields_set:
                d.put(engine, "engine_type", "transformers", f"{path}.engine_type")
                d.notes.append(f"{path}.engine_type: transformers, {CPU_ENGINE_WHY}")
            if engine.dtype == "float16" and "dtype" in engine.model_fields_set:
                d.warnings.append(f"{path}.dtype: float16 runs as float32 on a CPU machine (cluster.gpu_per_node: "
                                  "0), as the trainer there: no CPU computes float16 fast (bfloat16 runs where the "
                                  "CPU has it natively, AVX512-BF16 or AMX, and float32 elsewhere)")


#: Why a CPU machine's engines run on transformers unless ``engine_type`` says otherwise.
CPU_ENGINE_WHY = (
    "the default on a CPU machine (cluster.gpu_per_node: 0): vLLM-CPU busy-polls a core for 1 s "
    "after every message, which made the quickstart 2x slower, and on SmolLM2-135M it was no faster "
    "(docs/performance.md#vllm-on-cpu); set engine_type: vllm to use it"
)


def _trainer(d: _Derivation) -> None:
    """The trainer's backend, gradient clip, resume and offload."""
    tr = d.cfg.trainer
    alg = d.cfg.algorithm
    cfg = d.cfg
    if tr.trainer_type == "verl":
        d.warnings.append(
            "trainer.trainer_type 'verl': trinity has no veRL backend; using 'auto' (DeepSpeed on GPU, PyTorch on CPU)"
        )
        d.put(tr, "trainer_type", "auto", "trainer.trainer_type")
    if tr.ulysses_sequence_parallel_size > 1:
        d.warnings.append(
            f"trainer.ulysses_sequence_parallel_size={tr.ulysses_sequence_parallel_size} is ignored: "
            "sequence parallelism is not implemented; each GPU holds whole sequences (the same "
            "loss, more memory per GPU)"
        )
        d.put(tr, "ulysses_sequence_parallel_size", 1, "trainer.ulysses_sequence_parallel_size")
    # the optimizer's clip_grad is Trinity-RFT's other spelling of trainer.grad_clip
    if d.user_set("algorithm.optimizer.clip_grad") and not d.user_set("trainer.grad_clip"):
        d.put(tr, "grad_clip", alg.optimizer.clip_grad, "trainer.grad_clip")
    if d.user_set("critic.optim.clip_grad") and not d.user_set("critic.grad_clip"):
        d.put(cfg.critic, "grad_clip", cfg.critic.optim.clip_grad, "critic.grad_clip")
    # resume: the folder's existence is checked with the other inputs (roles/launch/checks.py), its
    # form here, so a config printed on a machine without the checkpoint still loads
    if tr.resume_mode == "resume_path":
        if not tr.resume_from_path:
            d.problems.append("trainer.resume_from_path: required when trainer.resume_mode is 'resume_path' "
                            "(a global_step_N checkpoint folder)")
        elif not STEP_FOLDER.match(os.path.basename(os.path.normpath(tr.resume_from_path))):
            d.problems.append(f"trainer.resume_from_path: {tr.resume_from_path!r} is not a global_step_N "
                            "checkpoint folder")
    elif tr.resume_from_path:
        d.warnings.append(f"trainer.resume_from_path is ignored: trainer.resume_mode is {tr.resume_mode!r} "
                        "(set resume_mode: resume_path to load it)")
    if tr.param_offload and not tr.deepspeed.offload_param:
        d.put(tr.deepspeed, "offload_param", True, "trainer.deepspeed.offload_param")
    if tr.optimizer_offload and not tr.deepspeed.offload_optimizer:
        d.put(tr.deepspeed, "offload_optimizer", True, "trainer.deepspeed.offload_optimizer")


#: Policy losses that take no old policy (sft, dpo) or need the engine's as it (m2po).
_OWN_OLD_LOGPROBS = ("sft", "dpo", "m2po")


def _old_logprobs(d: _Derivation) -> None:
    """Whose log-probs are the old policy's: the rollout engine's (``bypass_old_logprobs``, one
    forward a step saved) only where it computes in the trainer's dtype. A bfloat16 engine's
    against a float32 trainer's (DeepSpeed with ``bf16: false``) would put the importance
    ratio off 1 before any update."""
    cfg, alg = d.cfg, d.cfg.algorithm
    if (d.user_set("algorithm.bypass_old_logprobs") or not alg.bypass_old_logprobs
            or alg.policy_loss_fn in _OWN_OLD_LOGPROBS or "trainer" not in MODES[cfg.mode].roles
            or cfg.cluster.gpu_per_node == 0):  # on a CPU the engines and trainer share one dtype
        return
    engine, trainer = engine_dtype(cfg), trainer_dtype(cfg)
    if engine is None or engine == trainer:
        return
    d.put(alg, "bypass_old_logprobs", False, "algorithm.bypass_old_logprobs")
    d.notes.append(
        f"algorithm.bypass_old_logprobs: false, as the rollout engine computes in {engine} and the trainer in "
        f"{trainer}: the trainer computes the old policy's log-probs itself (one more forward a step); set it "
        "true to take the engine's (their gap is the trainer's rollout/kl metric)")


def engine_dtype(cfg: TrinityConfig) -> str | None:
    """The dtype a GPU's rollout engine computes log-probs in; None where unknown (``auto``:
    the checkpoint's; an external API). (On a CPU the engines and the PyTorch trainer compute
    in bfloat16 where the CPU has it natively, else float32: ``roles/runtime/cpu_tuning.py``.)"""
    rm = cfg.explorer.rollout_model
    if rm.engine_type not in ("vllm", "transformers"):
        return None
    return None if rm.dtype == "auto" else rm.dtype


def trainer_dtype(cfg: TrinityConfig) -> str:
    """The dtype a GPU's trainer computes log-probs in: DeepSpeed's (``trainer_type`` auto or
    deepspeed) bfloat16 with its ``bf16``; the PyTorch trainer's bfloat16 (autocast) beside a
    bfloat16 engine (``roles/trainer/main.py`` compute_dtype); else float32."""
    tr, rm = cfg.trainer, cfg.explorer.rollout_model
    if tr.trainer_type in ("auto", "deepspeed"):
        return "bfloat16" if tr.deepspeed.bf16 else "float32"
    return "bfloat16" if rm.dtype == "bfloat16" else "float32"


def _synchronizer(d: _Derivation) -> None:
    """Sync intervals; the method a mode without live weights can use; memory, unasked, on one
    CPU machine."""
    sy = d.cfg.synchronizer
    cfg = d.cfg
    for attr in ("explorer_sync_interval", "trainer_sync_interval"):
        if getattr(sy, attr) is None:
            d.put(sy, attr, sy.sync_interval, f"synchronizer.{attr}")
    if cfg.mode == "colocate" and sy.sync_method == "nccl":  # one device: no broadcast group
        if d.user_set("synchronizer.sync_method"):
            d.warnings.append("synchronizer.sync_method 'nccl' cannot join two processes on one device "
                              "(NCCL refuses two ranks on one GPU); mode 'colocate' uses 'memory'")
        d.put(sy, "sync_method", "memory", "synchronizer.sync_method")
    if (sy.sync_method == "nccl" and not d.user_set("synchronizer.sync_method") and MODES[cfg.mode].weights == "live"
            and cfg.cluster.gpu_per_node == 0 and cfg.cluster.node_num == 1):
        # a CPU machine, unasked: trainer and engines share its memory, and shared memory moves
        # weights 5-10x faster than nccl's CPU backend (gloo, loopback TCP; docs/performance.md)
        d.put(sy, "sync_method", "memory", "synchronizer.sync_method")
    if sy.sync_method in ("nccl", "memory") and MODES[cfg.mode].weights != "live":
        if d.user_set("synchronizer.sync_method"):
            d.warnings.append(
                f"synchronizer.sync_method {sy.sync_method!r} needs trainer and explorer together; "
                f"mode {cfg.mode!r} uses 'checkpoint'"
            )
        d.put(sy, "sync_method", "checkpoint", "synchronizer.sync_method")


def _bus(d: _Derivation) -> None:
    """The embedded server's store under the checkpoint root."""
    cfg = d.cfg
    if cfg.nats.store_dir is None:
        d.put(cfg.nats, "store_dir", os.path.join(cfg.checkpoint_root_dir, "nats"), "nats.store_dir")


def unused_settings(cfg: TrinityConfig) -> list[tuple[str, str]]:
    """``(path, why)`` of every :data:`UNUSED_FIELDS` field whose value is not its default:
    the user asked for something trinity does not do. (By value, not by source: a list is one
    source entry, and a field left at its default asks for nothing.)"""
    out: list[tuple[str, str]] = []
    for pattern, why in UNUSED_FIELDS.items():
        *parents, leaf = pattern.split(".")
        nodes: list[tuple[str, Any]] = [("", cfg)]
        for seg in parents:
            name = seg.rstrip("[]{}")
            nxt: list[tuple[str, Any]] = []
            for where, node in nodes:
                child = getattr(node, name, None)
                here = f"{where}.{name}" if where else name
                if seg.endswith("[]"):
                    nxt += [(f"{here}[{i}]", c) for i, c in enumerate(child or [])]
                elif seg.endswith("{}"):
                    nxt += [(f"{here}.{k}", c) for k, c in (child or {}).items()]
                elif child is not None:
                    nxt.append((here, child))
            nodes = nxt
        for where, node in nodes:
            field = type(node).model_fields[leaf]
            default = field.default_factory() if field.default_factory else field.default  # type: ignore[call-arg]
            if getattr(node, leaf) != default:
                out.append((f"{where}.{leaf}", why))
    return out


def task_pipeline_dir(cfg: TrinityConfig) -> str:
    """Where ``data_processor.task_pipeline`` writes the training taskset (``train.jsonl``)."""
    return os.path.join(cfg.checkpoint_job_dir, "task_pipeline")
