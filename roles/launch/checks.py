"""The files a configuration names, checked before any work, the same way by every command.

Why one module: a newcomer who forgot ``prepare.py`` must read ``model.model_path: ... does
not exist`` whichever command they ran (``trinity run``, a role alone under honcho,
``trinity debug``), not a Hugging Face or vLLM error from deep inside a role. So every entry
point that loads a configuration calls :func:`preflight` (or :func:`check_inputs`) with its
own name, and each checks exactly the inputs it reads:

* ``model.model_path`` (stage 0's; later stages start from the previous stage's checkpoint):
  the explorer, the trainer and the buffer (tokenizer, vocabulary) read it; a local folder the
  trainer or a local rollout engine loads must be a Hugging Face model folder (config.json);
* ``explorer.rollout_model.model_path`` when set apart from it, tasksets and eval tasksets:
  the explorer, and ``trinity debug`` (which runs the explorer's workflows);
* the trainer's file datasets (``experience_buffer``, ``auxiliary_buffers``): the buffer;
* the bus's files (``nats.tls_*``, ``nats.creds_file``, ``nats.nkey_seed_file``): whatever
  connects to NATS (every role, ``run``, ``inspect``, ``server``);
* the names of workflows and reward functions (the explorer's) and of experience operators
  (the buffer's): an unknown one is listed with the valid names.

``trinity run`` and ``trinity config`` check them all. A dataset that exists is also opened and
every row read, in one streamed pass that keeps none (a wrong split, an empty file, a line that
is not JSON, a row without the prompt key or with a list for a prompt fails here, named with
its config key, file and line; with ``skip_invalid_rows`` such rows are only counted, and a
dataset with none valid fails): a bad row further in would otherwise fail the explorer
mid-run, three times. Every entry point fails with exit 2 and the same lines; ``trinity config`` alone
only warns about inputs not set or not there (a config may be printed on a machine without the data).

Model and dataset paths may be Hugging Face hub ids (``Org/Name[@revision]``,
:mod:`storage.hub`). :func:`resolve_hub_paths` points them at the hub cache's snapshots: the
config loader does it from the cache only (``roles/runtime/config.py``: every process and
``trinity config`` see local paths), and :func:`preflight` downloads what its command reads and
the cache lacks (unless ``HF_HUB_OFFLINE``); a hub id still unresolved is named with the
``hf download`` command that fixes it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ops
from ops.algorithms import resolve
from ops.memory import GIB
from ops.rewards import check_reward_options
from roles.runtime.fit import fit_problems
from roles.runtime.hub_paths import resolve_hub_paths, stage_prefix, uses_critic
from roles.runtime.placement import PlanError, colocated_on_gpu, device_plan
from schemas.config import TrinityConfig
from schemas.loader import ConfigError
from schemas.modes import MODES
from storage.datafiles import TasksetError
from storage.hub import RepoType, hub_origin, not_cached_message, parse_hub_id
from storage.juicer import run_task_pipeline
from storage.lora import LoraError, check_targets

Check = Callable[[], None]

#: What each entry point reads: a subset of explorer, trainer, buffer (their inputs) and bus.
NEEDS: dict[str, frozenset[str]] = {
    "run": frozenset({"explorer", "trainer", "buffer", "bus"}),
    "config": frozenset({"explorer", "trainer", "buffer", "bus"}),
    "explorer": frozenset({"explorer", "bus"}),
    "trainer": frozenset({"trainer", "bus"}),
    "buffer": frozenset({"buffer", "bus"}),
    "synchronizer": frozenset({"bus"}),
    "debug": frozenset({"explorer"}),
    "inspect": frozenset({"bus"}),
    "server": frozenset({"bus"}),
}


@dataclass
class Input:
    """One file or folder a configuration names."""

    key: str  #: the config key, as the user wrote it (``stages[1] (sft).buffer...`` in stages)
    path: str | None
    readers: frozenset[str]
    check: Check | None = None  #: opens it and reads every row (datasets)
    ident: str = ""  #: stages inherit the global datasets: each one is checked once
    repo_type: RepoType = "model"  #: what a hub id in ``path`` names
    model_for: frozenset[str] = frozenset()  #: readers that load it as a model (config.json and weights)


def _dataset_kind(cfg: TrinityConfig) -> str:
    """What the trainer's file buffer reads: DPO pairs or SFT conversations."""

    try:
        return "dpo" if resolve(cfg.algorithm.algorithm_type).schema == "dpo" else "sft"
    except ValueError:  # an unknown algorithm is reported by the config loader
        return "sft"




def _inputs(cfg: TrinityConfig, first: bool, where: str) -> list[Input]:
    """Every input stage ``cfg`` names (``first``: the stage whose model is the user's)."""
    from roles.explorer.workflows.registry import reads_prompt
    from storage.tasksets import check_dataset, check_taskset

    ei, ti = cfg.buffer.explorer_input, cfg.buffer.trainer_input
    explorer, buffer = frozenset({"explorer"}), frozenset({"buffer"})
    out: list[Input] = []

    def ident(c: object, kind: str) -> str:
        return json.dumps([kind, c.model_dump(mode="json")], sort_keys=True)  # type: ignore[attr-defined]

    if first:
        mode, rollout = MODES[cfg.mode], cfg.explorer.rollout_model
        local = rollout.engine_type != "external"  # else a tokenizer folder is enough
        loads = (frozenset({"trainer"}) if mode.trains else frozenset()) | (
            explorer if mode.explores and local and rollout.model_path in (None, "", cfg.model.model_path)
            else frozenset())
        out.append(Input(f"{where}model.model_path", cfg.model.model_path or None,
                         frozenset({"explorer", "trainer", "buffer"}), model_for=loads))
        critic = cfg.model.critic_model_path
        if critic and critic != cfg.model.model_path and uses_critic(cfg):
            out.append(Input(f"{where}model.critic_model_path", critic, frozenset({"trainer"}),
                             model_for=frozenset({"trainer"})))
        if local and rollout.model_path and rollout.model_path != cfg.model.model_path:
            out.append(Input(f"{where}explorer.rollout_model.model_path", rollout.model_path, explorer,
                             model_for=explorer))
        for j, aux in enumerate(cfg.explorer.auxiliary_models):
            if aux.engine_type != "external" and aux.model_path:
                out.append(Input(f"{where}explorer.auxiliary_models[{j}].model_path", aux.model_path, explorer,
                                 model_for=explorer))
        n = cfg.nats
        for name in ("tls_ca_file", "tls_cert_file", "tls_key_file", "creds_file", "nkey_seed_file"):
            if getattr(n, name):
                out.append(Input(f"nats.{name}", getattr(n, name), frozenset({"bus"})))
    resume = cfg.trainer.resume_from_path
    if cfg.trainer.resume_mode == "resume_path" and resume and MODES[cfg.mode].trains:
        # absolute: a relative checkpoint folder is no hub id
        out.append(Input(f"{where}trainer.resume_from_path", str(Path(resume).expanduser().absolute()),
                         frozenset({"trainer"})))
    # each taskset's workflow (derive filled it from the explorer_input defaults) says whether
    # its rows need a prompt column
    for path, ts in ei.training() if MODES[cfg.mode].reads_taskset else []:
        out.append(Input(f"{where}{path}.path", ts.path, explorer,
                         lambda ts=ts: check_taskset(ts, reads_prompt(ts.default_workflow_type)),
                         ident(ts, "task"), "dataset"))
    for j, ts in enumerate(ei.eval_tasksets):
        out.append(Input(f"{where}buffer.explorer_input.eval_tasksets[{j}].path", ts.path, explorer,
                         lambda ts=ts: check_taskset(ts, reads_prompt(ts.default_workflow_type)),
                         ident(ts, "task"), "dataset"))
    eb = ti.experience_buffer
    if eb is not None and eb.storage_type == "file":
        kind = _dataset_kind(cfg)
        out.append(Input(f"{where}buffer.trainer_input.experience_buffer.path", eb.path, buffer,
                         lambda eb=eb, kind=kind: check_dataset(eb, kind), ident(eb, kind),  # type: ignore[misc]
                         "dataset"))
    for name, b in ti.auxiliary_buffers.items():
        out.append(Input(f"{where}buffer.trainer_input.auxiliary_buffers.{name}.path", b.path, buffer,
                         lambda b=b: check_dataset(b, "sft"), ident(b, "sft"), "dataset"))
    return out


def _missing_requirements(cfg: TrinityConfig, where: str, needs: frozenset[str]) -> list[str]:
    """Inputs a stage's mode needs but the config does not name at all."""
    out = []
    if needs & {"explorer", "trainer"} and not cfg.model.model_path:  # the buffer can do without
        out.append(f"{where}model.model_path: not set")
    if "explorer" in needs:
        ei = cfg.buffer.explorer_input
        if MODES[cfg.mode].reads_taskset and not ei.training():
            out.append(f"{where}buffer.explorer_input.taskset: mode {cfg.mode} needs a taskset")
        if MODES[cfg.mode].weights == "each" and not ei.eval_tasksets:
            out.append(f"{where}buffer.explorer_input.eval_tasksets: mode bench needs one")
    return out


def check_names(cfg: TrinityConfig, where: str, needs: frozenset[str]) -> list[str]:
    """The workflows and reward functions a stage's tasksets name (the explorer runs them),
    their selectors' settings, and its experience operators with their arguments (the buffer
    runs them): one line per unknown name, listing the valid ones, or per bad setting.
    Algorithm parts are checked when the config loads (``roles/runtime/config.py``); plugin folders
    are imported by then."""

    out = []
    ei = cfg.buffer.explorer_input
    if "explorer" in needs:
        from roles.explorer.workflows.registry import get_workflow
        from storage.selectors import check_selector_config

        named = ([(path.removeprefix("buffer.explorer_input."), ts) for path, ts in ei.training()]
                 if MODES[cfg.mode].reads_taskset else [])
        named += [(f"eval_tasksets[{j}]", ts) for j, ts in enumerate(ei.eval_tasksets)]
        if MODES[cfg.mode].reads_taskset:
            out += [f"{where}{p}" for p in check_task_selection(cfg)]
        for key, ts in named:
            if ts is None:
                continue
            sel, field = ((ts.data_selector, "data_selector") if ts.data_selector is not None
                          else (ts.task_selector, "task_selector"))
            try:  # its settings, before any row is read (a NaN tau, target_reward: 5)
                check_selector_config(sel.selector_type, sel.feature_keys, sel.kwargs,
                                      f"{where}buffer.explorer_input.{key}.{field}")
            except TasksetError as e:
                out.append(str(e))
            cls = None
            if ts.default_workflow_type:
                try:
                    cls = get_workflow(ts.default_workflow_type)
                except KeyError as e:
                    out.append(f"{where}buffer.explorer_input.{key}.default_workflow_type: {e.args[0]}")
                else:
                    out += [f"{where}buffer.explorer_input.{key}.workflow_args.{line}"
                            for line in cls.check_args(ts.workflow_args)]
                    judges = cls.auxiliary_required
                    if judges > len(cfg.explorer.auxiliary_models):
                        out.append(f"{where}explorer.auxiliary_models: workflow {ts.default_workflow_type!r} "
                                   f"({key}) asks auxiliary model 0 to judge its rollouts: list {judges} "
                                   f"(model_path, engine_type), {len(cfg.explorer.auxiliary_models)} listed")
                    if (getattr(cls, "reward_required", False) and not ts.default_reward_fn_type
                            and not ts.format.reward_fn_key):
                        out.append(f"{where}buffer.explorer_input.{key}.default_reward_fn_type: not set; workflow "
                                   f"{ts.default_workflow_type!r} scores with the reward function you name "
                                   f"(known: {', '.join(ops.names('reward_fn'))})")
            if ts.default_reward_fn_type:
                try:
                    ops.get("reward_fn", ts.default_reward_fn_type)
                except ValueError as e:
                    out.append(f"{where}buffer.explorer_input.{key}.default_reward_fn_type: {e}")
            reward = ts.default_reward_fn_type or getattr(cls, "default_reward_fn", None)
            if reward in ops.names("reward_fn"):  # the one the workflow will call, with these options
                out += [f"{where}buffer.explorer_input.{key}.reward_fn_args.{line}"
                        for line in check_reward_options(ops.get("reward_fn", reward), ts.reward_fn_args)]
    if "trainer" in needs and cfg.model.lora_configs and MODES[cfg.mode].trains:
        out += check_lora(cfg, where)
    if "buffer" in needs and MODES[cfg.mode].stores_experience:
        from roles.buffer.pipeline import Pipeline

        try:
            Pipeline.from_config(cfg.data_processor.experience_pipeline.operators, None)
        except ValueError as e:
            out.append(f"{where}{e}")
    return out


def check_task_selection(cfg: TrinityConfig) -> list[str]:
    """How the training tasksets are mixed and selected, where it would only fail once
    running: every weight 0 at some step (no step could take a task), and a ``difficulty_based``
    selector without ``pass_rate_calculator`` (it would never learn). Weights that are not
    finite numbers >= 0 fail sooner, when the config loads."""
    out = []
    training = cfg.buffer.explorer_input.training()
    if len(training) > 1:
        from storage.scheduler import schedule

        mixed = cfg.buffer.explorer_input.tasksets
        steps = sorted({0} | {p.step for ts in mixed for p in ts.weight_schedule})
        for step in steps:
            total = 0.0
            for ts in mixed:
                if ts.weight_schedule:
                    total += schedule([(p.step, p.weight) for p in ts.weight_schedule])(step)
                else:
                    total += 1.0 if ts.weight is None else ts.weight
            if total <= 0:
                out.append(f"buffer.explorer_input.tasksets[].weight: 0 for every taskset at step {step}; "
                           "no step could take a task")
                break
    operators = [op.name for op in cfg.data_processor.experience_pipeline.operators]
    for path, ts in training:
        if ts.task_selector.selector_type == "difficulty_based" and "pass_rate_calculator" not in operators:
            out.append(f"{path}.task_selector.selector_type: difficulty_based learns from pass rates; add "
                       "{name: pass_rate_calculator} to data_processor.experience_pipeline.operators")
    return out


def check_stage_settings(stages: list[TrinityConfig], i: int, where: str, needs: frozenset[str]) -> list[str]:
    """Settings of stage ``i`` that would only fail (or do nothing) once running: the monitor's
    ``monitor_args`` for its backend (the explorer and trainer open a monitor), the device
    plan, and a trainer
    stage with ``save_hf_checkpoint: never`` that a later stage starts from (it would leave
    nothing to start from: the run would die between the stages)."""
    from roles.runtime.monitor import monitor_args_problems

    s = stages[i]
    out = []
    if i == 0 and needs & {"explorer", "trainer"}:  # global sections: stages do not override them
        out += monitor_args_problems(s.monitor)
        try:  # every GPU process's share (plans that do not fit are refused)
            device_plan(stages)
        except PlanError as e:
            out.append(str(e))
        why = colocated_on_gpu(stages)  # planned, not startable yet
        if why:
            out.append(why)
    if (i + 1 < len(stages) and MODES[s.mode].trains
            and s.trainer.save_hf_checkpoint == "never"):
        nxt = stages[i + 1].name.rsplit("/", 1)[-1]
        out.append(f"{where}trainer.save_hf_checkpoint: 'never', but stage {nxt!r} starts from this "
                   "stage's final Hugging Face checkpoint; use 'last'")
    return out


def numa_nodes() -> int:
    """NUMA nodes this machine has online (``/sys``; 1 where it does not say)."""
    online = Path("/sys/devices/system/node/online")
    try:
        spans = [part.split("-") for part in online.read_text().strip().split(",") if part]
    except OSError:
        return 1
    return max(1, sum(int(span[-1]) - int(span[0]) + 1 for span in spans))


def cpu_tensor_parallel_problems(cfg: TrinityConfig, where: str) -> list[str]:
    """vLLM on CPU runs a tensor-parallel engine as one worker per NUMA node, and fails to
    start (minutes in, then again on every restart) where there are fewer nodes than workers;
    Trinity-RFT's GPU configs set ``tensor_parallel_size: 2`` for their judge models."""
    nodes = numa_nodes()
    models = [("explorer.rollout_model", cfg.explorer.rollout_model),
              *((f"explorer.auxiliary_models[{j}]", m) for j, m in enumerate(cfg.explorer.auxiliary_models))]
    wide = [(key, m) for key, m in models if m.engine_type == "vllm" and m.tensor_parallel_size > nodes]
    if not wide:  # torch only when needed: ``trinity run`` stays light (fast to lock and to exit)
        return []
    import torch

    if torch.cuda.is_available():
        return []
    return [f"{where}{key}.tensor_parallel_size: {m.tensor_parallel_size}: vLLM on CPU runs one worker per "
            f"NUMA node and this machine has {nodes}; set it to 1 (or engine_type: transformers)"
            for key, m in wide]


def check_lora(cfg: TrinityConfig, where: str) -> list[str]:
    """``model.lora_configs[0]`` against the trainer's engine and model: ZeRO-3 (merged weights
    need whole tensors), an adapter ``path`` that is no PEFT folder, ``target_modules`` that
    match no linear layer (checked on the model built on the meta device: no weights read)."""
    lc = cfg.model.lora_configs[0]
    key = f"{where}model.lora_configs[0]"
    out = []
    d = cfg.trainer.deepspeed
    if cfg.trainer.trainer_type in ("deepspeed", "auto") and d.zero_stage == 3:
        out.append(f"{key}: LoRA trains with trainer.deepspeed.zero_stage 0-2 (ZeRO-3 partitions the base "
                   "weights the merged model needs whole); set zero_stage: 2, or trainer_type: pytorch")
    if lc.path and not (Path(lc.path).expanduser() / "adapter_config.json").is_file():
        out.append(f"{key}.path: {lc.path} is not a PEFT adapter folder (no adapter_config.json)")
    model_path = Path(cfg.model.model_path).expanduser()
    if (model_path / "config.json").is_file():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM


        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_path)))
        try:
            check_targets(model, lc)
        except LoraError as e:
            out.append(f"{where}{e}")
    return out


def check_sql_store(cfg: TrinityConfig, where: str, needs: frozenset[str]) -> list[str]:
    """The SQL experience store's database (the buffer's): its driver installed, its URL one
    the buffer can open (``storage/sql.py``)."""
    eb = cfg.buffer.trainer_input.experience_buffer
    if "buffer" not in needs or eb is None or eb.storage_type == "file" or "://" not in (eb.path or ""):
        return []
    key = f"{where}buffer.trainer_input.experience_buffer.path"
    try:
        import sqlalchemy  # noqa: F401 - the store's one dependency, an optional one
    except ImportError as e:
        return [f"{key}: {eb.path}: the SQL experience store needs SQLAlchemy ({e}): pip install 'trinity[sql]'"]
    from storage.sql import check_url

    problem = check_url(eb.path)
    return [f"{key}: {problem}"] if problem else []


def not_a_model(path: Path) -> str | None:
    """Why the local ``path`` is no Hugging Face model folder (None: it has ``config.json``),
    with what it seems to be instead. Why before start: the trainer's or vLLM's own error
    comes late, from deep inside a role, without naming the config key."""
    if not path.is_dir():
        return "is a file; a model is a Hugging Face model folder (config.json, weights, tokenizer)"
    if (path / "config.json").is_file():
        return None
    names = sorted(p.name for p in path.iterdir())
    if not names:
        return "is an empty folder, not a Hugging Face model folder (config.json, weights, tokenizer)"
    if "adapter_config.json" in names:
        return ("holds a PEFT adapter, not a model: set the base model here and the adapter as "
                "model.lora_configs[0].path")
    if (path / "actor" / "huggingface" / "config.json").is_file():
        return f"is a checkpoint step folder, not a model folder: use {path / 'actor' / 'huggingface'}"
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"is not a Hugging Face model folder: no config.json (it holds {shown})"


def check_inputs(stages: list[TrinityConfig], entry: str) -> tuple[list[str], list[str]]:
    """``(problems, missing)`` for entry point ``entry`` (a key of :data:`NEEDS`): one line per
    input it reads that cannot be used, naming its config key and the file, row or split; and
    one line per input that is not set or whose path does not exist."""

    needs = NEEDS[entry]
    problems: list[str] = []
    missing: list[str] = []
    seen: set[str] = set()
    for i, s in enumerate(stages):
        where = stage_prefix(stages, i)
        if i == 0:
            missing += _missing_requirements(s, where, needs)
        elif "explorer" in needs:  # a later stage's model is its predecessor's checkpoint
            missing += [p for p in _missing_requirements(s, where, needs) if "model_path" not in p]
        problems += [p for p in check_names(s, where, needs) if p not in problems]
        problems += [p for p in check_stage_settings(stages, i, where, needs) if p not in problems]
        problems += [p for p in check_sql_store(s, where, needs) if p not in problems]
        for item in _inputs(s, i == 0, where):
            if not item.readers & needs or not item.path:
                continue
            if item.ident:
                if item.ident in seen:
                    continue
                seen.add(item.ident)
            if not Path(item.path).expanduser().exists():
                if parse_hub_id(item.path):  # not in the hub cache either (resolve_hub_paths)
                    missing.append(not_cached_message(item.key, item.path, item.repo_type))
                else:
                    missing.append(f"{item.key}: {item.path} does not exist")
                continue
            origin = hub_origin(item.path)  # a resolved hub id: show what the user wrote too
            if item.model_for & needs:
                problem = not_a_model(Path(item.path).expanduser())
                if problem:
                    shown = f"{item.path} (hub {origin})" if origin else item.path
                    problems.append(f"{item.key}: {shown} {problem}")
            if item.check is None:
                continue
            name = item.key.removesuffix(".path")
            if origin:
                name += f" (hub {origin})"
            try:
                item.check()
            except TasksetError as e:
                problems.append(f"{name}: {e}")
            except OSError as e:
                problems.append(f"{name}: {item.path}: cannot read: {e}")
    return problems, missing


def run_task_pipelines(stages: list[TrinityConfig], entry: str) -> list[str]:
    """Run each stage's ``data_processor.task_pipeline`` (its output is the taskset the
    checks then read); one line per failure."""
    out = []
    for i, s in enumerate(stages):
        tp = s.data_processor.task_pipeline
        if tp is None or not tp.inputs or "explorer" not in NEEDS[entry] or not MODES[s.mode].reads_taskset:
            continue

        try:
            run_task_pipeline(s)
        except ValueError as e:
            out.append(f"{stage_prefix(stages, i)}{e}")
    return out


def preflight(stages: list[TrinityConfig], entry: str = "run") -> None:
    """Raise :class:`ConfigError` naming every input ``entry`` reads that is missing or
    unusable: what every command runs before it does any work.

    Hub ids it reads that the cache lacks are downloaded first (``HF_HUB_OFFLINE`` unset) and
    ``stages`` point at the snapshots: the work that follows runs on local paths."""
    hub_errors, failed = resolve_hub_paths(stages, NEEDS[entry], download=True)
    hub_errors += run_task_pipelines(stages, entry)
    problems, missing = check_inputs(stages, entry)
    if entry != "config" and "explorer" in NEEDS[entry]:  # what this machine runs (config may be for another)
        problems += [p for i, s in enumerate(stages) for p in cpu_tensor_parallel_problems(s, stage_prefix(stages, i))]
    if entry != "config" and NEEDS[entry] & {"trainer", "explorer"}:
        problems += gpu_fit_problems(stages)
    missing = [m for m in missing if m.split(": ", 1)[0] not in failed]
    if hub_errors or problems or missing:
        raise ConfigError(hub_errors + missing + problems)


def gpu_gib() -> float | None:
    """GiB of this machine's first GPU, None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(0).total_memory / GIB


def gpu_fit_problems(stages: list[TrinityConfig]) -> list[str]:
    """A device plan whose trainer or engines would not fit this machine's GPUs (the estimate
    of :mod:`roles.runtime.fit`), with the settings that would; printed as a warning instead
    under ``ignore_validator_suggestions: true``. Nothing on a machine without a GPU."""
    if stages[0].cluster.gpu_per_node == 0 or (size := gpu_gib()) is None:
        return []
    try:
        plan = device_plan(stages)
    except PlanError:
        return []  # check_stage_settings names it
    found = fit_problems(plan, stages, size)
    if found and stages[0].ignore_validator_suggestions:
        for p in found:
            print(f"trinity: warning: {p}", file=sys.stderr)
        return []
    return found
