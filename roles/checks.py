"""The files a configuration names, checked before any work, the same way by every command.

Why one module: a newcomer who forgot ``prepare.py`` must read ``model.model_path: ... does
not exist`` whichever command they ran (``trinity run``, a role alone under honcho,
``trinity debug``), not a Hugging Face or vLLM error from deep inside a role. So every entry
point that loads a configuration calls :func:`preflight` (or :func:`check_inputs`) with its
own name, and each checks exactly the inputs it reads:

* ``model.model_path`` (stage 0's; later stages start from the previous stage's checkpoint):
  the explorer, the trainer and the buffer (tokenizer, vocabulary) read it;
* ``explorer.rollout_model.model_path`` when set apart from it, tasksets and eval tasksets:
  the explorer, and ``trinity debug`` (which runs the explorer's workflows);
* the trainer's file datasets (``experience_buffer``, ``auxiliary_buffers``): the buffer;
* the bus's files (``nats.tls_*``, ``nats.creds_file``, ``nats.nkey_seed_file``): whatever
  connects to NATS (every role, ``run``, ``inspect``, ``server``);
* the names of workflows and reward functions (the explorer's) and of experience operators
  (the buffer's): an unknown one is listed with the valid names.

``trinity run`` and ``trinity config`` check them all. A dataset that exists is also opened and
its first row read (a wrong split, an empty file, a row without the prompt key fails here,
named with its config key); one row per dataset keeps this fast, rows further in are checked by
the readers. Every entry point fails with exit 2 and the same lines; ``trinity config`` alone
only warns about inputs not set or not there (a config may be printed on a machine without the data).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from schemas.config import TrinityConfig
from schemas.loader import ConfigError

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
    check: Check | None = None  #: opens it and reads the first row (datasets)
    ident: str = ""  #: stages inherit the global datasets: each one is checked once


def _dataset_kind(cfg: TrinityConfig) -> str:
    """What the trainer's file buffer reads: DPO pairs or SFT conversations."""
    from ops.algorithms import resolve

    try:
        return "dpo" if resolve(cfg.algorithm.algorithm_type).schema == "dpo" else "sft"
    except ValueError:  # an unknown algorithm is reported by the config loader
        return "sft"


def _inputs(cfg: TrinityConfig, first: bool, where: str) -> list[Input]:
    """Every input stage ``cfg`` names (``first``: the stage whose model is the user's)."""
    from storage.tasksets import check_dataset, check_taskset

    ei, ti = cfg.buffer.explorer_input, cfg.buffer.trainer_input
    explorer, buffer = frozenset({"explorer"}), frozenset({"buffer"})
    out: list[Input] = []

    def ident(c: object, kind: str) -> str:
        return json.dumps([kind, c.model_dump(mode="json")], sort_keys=True)  # type: ignore[attr-defined]

    if first:
        out.append(Input(f"{where}model.model_path", cfg.model.model_path or None,
                         frozenset({"explorer", "trainer", "buffer"})))
        rollout = cfg.explorer.rollout_model
        if rollout.engine_type != "external" and rollout.model_path and rollout.model_path != cfg.model.model_path:
            out.append(Input(f"{where}explorer.rollout_model.model_path", rollout.model_path, explorer))
        for j, aux in enumerate(cfg.explorer.auxiliary_models):
            if aux.engine_type != "external" and aux.model_path:
                out.append(Input(f"{where}explorer.auxiliary_models[{j}].model_path", aux.model_path, explorer))
        n = cfg.nats
        for name in ("tls_ca_file", "tls_cert_file", "tls_key_file", "creds_file", "nkey_seed_file"):
            if getattr(n, name):
                out.append(Input(f"nats.{name}", getattr(n, name), frozenset({"bus"})))
    if ei.taskset is not None and cfg.mode in ("both", "colocate", "explore"):
        ts = ei.taskset
        out.append(Input(f"{where}buffer.explorer_input.taskset.path", ts.path, explorer,
                         lambda ts=ts: check_taskset(ts), ident(ts, "task")))
    for j, ts in enumerate(ei.eval_tasksets):
        out.append(Input(f"{where}buffer.explorer_input.eval_tasksets[{j}].path", ts.path, explorer,
                         lambda ts=ts: check_taskset(ts), ident(ts, "task")))
    eb = ti.experience_buffer
    if eb is not None and eb.storage_type == "file":
        kind = _dataset_kind(cfg)
        out.append(Input(f"{where}buffer.trainer_input.experience_buffer.path", eb.path, buffer,
                         lambda eb=eb, kind=kind: check_dataset(eb, kind), ident(eb, kind)))  # type: ignore[misc]
    for name, b in ti.auxiliary_buffers.items():
        out.append(Input(f"{where}buffer.trainer_input.auxiliary_buffers.{name}.path", b.path, buffer,
                         lambda b=b: check_dataset(b, "sft"), ident(b, "sft")))
    return out


def _missing_requirements(cfg: TrinityConfig, where: str, needs: frozenset[str]) -> list[str]:
    """Inputs a stage's mode needs but the config does not name at all."""
    out = []
    if needs & {"explorer", "trainer"} and not cfg.model.model_path:  # the buffer can do without
        out.append(f"{where}model.model_path: not set")
    if "explorer" in needs:
        ei = cfg.buffer.explorer_input
        if cfg.mode in ("both", "colocate", "explore") and ei.taskset is None:
            out.append(f"{where}buffer.explorer_input.taskset: mode {cfg.mode} needs a taskset")
        if cfg.mode == "bench" and not ei.eval_tasksets:
            out.append(f"{where}buffer.explorer_input.eval_tasksets: mode bench needs one")
    return out


def check_names(cfg: TrinityConfig, where: str, needs: frozenset[str]) -> list[str]:
    """The workflows and reward functions a stage's tasksets name (the explorer runs them)
    and its experience operators (the buffer runs them): one line per unknown name, listing
    the valid ones. Algorithm parts are checked when the config loads (``roles/settings.py``);
    plugin folders are imported by then."""
    import ops

    out = []
    ei = cfg.buffer.explorer_input
    if "explorer" in needs:
        from roles.explorer.workflows.registry import get_workflow

        named = [("taskset", ei.taskset)] if cfg.mode in ("both", "colocate", "explore") else []
        named += [(f"eval_tasksets[{j}]", ts) for j, ts in enumerate(ei.eval_tasksets)]
        for key, ts in named:
            if ts is None:
                continue
            if ts.default_workflow_type:
                try:
                    get_workflow(ts.default_workflow_type)
                except KeyError as e:
                    out.append(f"{where}buffer.explorer_input.{key}.default_workflow_type: {e.args[0]}")
            if ts.default_reward_fn_type:
                try:
                    ops.get("reward_fn", ts.default_reward_fn_type)
                except ValueError as e:
                    out.append(f"{where}buffer.explorer_input.{key}.default_reward_fn_type: {e}")
    if "trainer" in needs and cfg.model.lora_configs and cfg.mode != "explore":
        out += check_lora(cfg, where)
    if "buffer" in needs and cfg.mode in ("both", "colocate", "explore", "train", "serve"):
        from roles.buffer.pipeline import Pipeline

        try:
            Pipeline.from_config(cfg.data_processor.experience_pipeline.operators, None)
        except ValueError as e:
            out.append(f"{where}{e}")
    return out


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

        from storage.lora import LoraError, check_targets

        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_path)))
        try:
            check_targets(model, lc)
        except LoraError as e:
            out.append(f"{where}{e}")
    return out


def check_inputs(stages: list[TrinityConfig], entry: str) -> tuple[list[str], list[str]]:
    """``(problems, missing)`` for entry point ``entry`` (a key of :data:`NEEDS`): one line per
    input it reads that cannot be used, naming its config key and the file, row or split; and
    one line per input that is not set or whose path does not exist."""
    from storage.datafiles import TasksetError

    needs = NEEDS[entry]
    problems: list[str] = []
    missing: list[str] = []
    seen: set[str] = set()
    for i, s in enumerate(stages):
        where = f"stages[{i}] ({s.name.rsplit('/', 1)[-1]})." if len(stages) > 1 else ""
        if i == 0:
            missing += _missing_requirements(s, where, needs)
        elif "explorer" in needs:  # a later stage's model is its predecessor's checkpoint
            missing += [p for p in _missing_requirements(s, where, needs) if "model_path" not in p]
        problems += [p for p in check_names(s, where, needs) if p not in problems]
        for item in _inputs(s, i == 0, where):
            if not item.readers & needs or not item.path:
                continue
            if item.ident:
                if item.ident in seen:
                    continue
                seen.add(item.ident)
            if not Path(item.path).expanduser().exists():
                missing.append(f"{item.key}: {item.path} does not exist")
                continue
            if item.check is None:
                continue
            try:
                item.check()
            except TasksetError as e:
                problems.append(f"{item.key.removesuffix('.path')}: {e}")
            except OSError as e:
                problems.append(f"{item.key.removesuffix('.path')}: {item.path}: cannot read: {e}")
    return problems, missing


def preflight(stages: list[TrinityConfig], entry: str = "run") -> None:
    """Raise :class:`ConfigError` naming every input ``entry`` reads that is missing or
    unusable: what every command runs before it does any work."""
    problems, missing = check_inputs(stages, entry)
    if problems or missing:
        raise ConfigError(missing + problems)
