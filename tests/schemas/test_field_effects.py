"""Nothing accepted is ignored in silence: every field of the settings changes what the program
does, or is declared as changing nothing (``schemas.config.UNUSED_FIELDS``) and warned about
when set.

Why mutation testing and not a scan for the field's name: a name shared by two objects, or a
value read and then dropped, passes a scan. Here each leaf field is set to another valid value,
in a realistic configuration loaded as a user's would be (a YAML file through
:func:`schemas.loader.load_config` with the roles' algorithm resolver, so ``derive()`` runs),
and :func:`observe` runs the functions the roles run to turn a configuration into behaviour
(readers, rollouts through the explorer's engines and runners, the trainer's engine and step
runner, the buffer's service, the weight-sync plan, the device plan, the bus's stream, consumer
and connection settings, ...). A field whose new value changes what those return is *proven*.

Some fields act only while processes run (timeouts, retries, reconnects): :data:`RUNTIME_EFFECTS`
names, for each, an existing test that exercises that effect. A field the loader replaces or
overrides tells the user so with a warning naming it (*warned*). Every other field fails the test
with its path: it is accepted and changes nothing, in silence.

The configurations are built once per module from real small files (``storage/tiny.py``'s
model and arithmetic taskset); nothing starts a process or a NATS server, and no model but the
tiny one is loaded. Model servers are recorders: vLLM's engine and an external OpenAI server
answer with fixed texts, so what the roles send them (prompts, sampling, engine arguments) is
what is compared. Effects that need a GPU machine (DeepSpeed's config, vLLM's GPU arguments)
are observed with the roles' own modules seeing a GPU (:func:`gpu_view`).

Verdicts besides *proven*, *warned* and :data:`RUNTIME_EFFECTS`: a field with a single valid
value (*only*), and a switch whose other value the loader refuses naming it (*refused*).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import copy
import dataclasses
import functools
import json
import os
import threading
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import annotated_types
import pytest
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from roles.explorer.workflows import register_workflow
from roles.explorer.workflows.math import MathWorkflow
from schemas.config import UNUSED_FIELDS, TrinityConfig
from schemas.derive import unused_settings
from storage.scheduler import scheduler_from_config

ROOT = Path(__file__).resolve().parents[2]
#: The key the agent probe presents to the explorer's OpenAI API (which checks none by default).
API_KEY = "probe-key"


# --------------------------------------------------------------------------------------------
# the fields
# --------------------------------------------------------------------------------------------


def _models(annotation: object) -> list[tuple[str, type[BaseModel]]]:
    """The settings models inside a field's type, with the path suffix each one takes:
    ``""`` (the model itself, or Optional), ``"[]"`` (list items), ``"{}"`` (dict values)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple):
        return [("[]" + s, m) for a in args for s, m in _models(a)]
    if origin is dict:
        return [("{}" + s, m) for s, m in _models(args[-1])]
    if origin in (typing.Union, types.UnionType):
        return [x for a in args for x in _models(a)]
    return []


def field_paths(model: type[BaseModel], prefix: str = "") -> list[tuple[str, FieldInfo]]:
    """``(dotted path, field)`` of every leaf field reachable from ``model``. ``stages`` is
    left out: the loader merges each stage into a whole configuration of these same fields."""
    out = []
    for name, f in model.model_fields.items():
        path = f"{prefix}{name}"
        if name == "stages":
            continue
        subs = _models(f.annotation)
        if not subs:
            out.append((path, f))
            continue
        for suffix, sub in subs:
            out += field_paths(sub, f"{path}{suffix}.")
    return out


def declared_unused(path: str) -> bool:
    """The field, or a section it belongs to, is in UNUSED_FIELDS."""
    parts = path.split(".")
    return any(".".join(parts[:i]) in UNUSED_FIELDS or ".".join(parts[:i]).removesuffix("[]") in UNUSED_FIELDS
               for i in range(1, len(parts) + 1))


# --------------------------------------------------------------------------------------------
# the configurations
# --------------------------------------------------------------------------------------------


@register_workflow("field_effects_agent")
class AgentProbe(MathWorkflow):
    """A math workflow shaped like an agent: one rollout per call (not repeatable, so
    ``explorer.concurrent_mode`` decides how a task's rollouts run), reporting in each
    experience's ``info`` what a workflow sees of the runner: its arguments, the calls its
    model handle recorded, and how its rollouts ran (built on a runner thread; more than one
    running at once)."""

    repeatable = False
    running = 0
    peak = 0

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.on_thread = threading.current_thread() is not threading.main_thread()

    async def run_async(self) -> list[Any]:
        cls = type(self)
        cls.running += 1
        cls.peak = max(cls.peak, cls.running)
        try:
            await asyncio.sleep(0.001)  # the others of a concurrent run start meanwhile
            exps = await super().run_async()
            how = "thread" if self.on_thread else ("together" if cls.peak > 1 else "one by one")
        finally:
            cls.running -= 1
            if cls.running == 0:
                cls.peak = 0
        for e in exps:
            e.info.update(args=dict(self.args), recorded=len(self.model.extract_history()), ran=how)
        return exps


def _task_rows(n: int, seed: int) -> list[dict[str, Any]]:
    """Arithmetic tasks with every column a taskset's ``format`` can name, each column with
    its own content, so that naming another one changes the prompt, the answer or the
    workflow. The last row lacks ``message`` (skipped under ``skip_invalid_rows``: which rows
    are invalid depends on ``prompt_type`` and ``messages_key``)."""
    from storage.tiny import arithmetic_rows

    rows = []
    for i, r in enumerate(arithmetic_rows(n, seed)):
        q, a = r["question"], r["answer"]
        rows.append({
            "question": q, "answer": a, "q2": f"again {q}", "a2": "#### 0",
            "sys": f"system {i}", "message": [{"role": "user", "content": q}],
            "message2": [{"role": "user", "content": f"twice {q}"}],
            "wf": "math_boxed_workflow", "rf": "format_reward",
        })
    rows[-1].pop("message")
    return rows


def _sft_rows(n: int) -> list[dict[str, Any]]:
    """SFT/DPO rows in both layouts (plaintext columns and message lists), with a second
    column of each kind, tools, and per-row system prompts. The last row has a conversation
    but no answer columns (invalid for plaintext SFT and DPO: skipped under
    ``skip_invalid_rows``)."""
    tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
    rows = []
    for i in range(n):
        q = f"{i}+1=?"
        conv = [{"role": "user", "content": q}, {"role": "assistant", "content": str(i + 1)},
                {"role": "user", "content": "sure?"}, {"role": "assistant", "content": "yes"}]
        rows.append({
            "prompt": q, "response": str(i + 1), "p2": f"again {q}", "r2": "0", "sys": f"system {i}",
            "message": conv, "message2": conv[:2],
            "tools": json.dumps(tools), "tools2": json.dumps([]),
            "chosen": str(i + 1), "rejected": "9", "c2": "yes", "x2": "no",
        })
    # no answer: invalid as plaintext SFT or DPO
    rows.append({"prompt": "1+1=?", "message": rows[0]["message"], "message2": rows[0]["message2"]})
    return rows


@dataclasses.dataclass
class Files:
    """The real small files the configurations name."""

    root: Path
    model: Path
    tasks: Path
    sft: Path
    other_file: Path
    template: Path
    port: int  #: a free port for the explorer's OpenAI API


def build_files(root: Path) -> Files:
    """Two tiny models (the second for a changed ``model_path``), a LoRA adapter of the first,
    a taskset and an SFT/DPO dataset (each with a second subset), a chat template file."""
    from storage.datafiles import write_jsonl
    from storage.tiny import build_tiny_model

    model = build_tiny_model(root / "model")
    build_tiny_model(root / "model2", seed=1)
    _write_adapter(model, root / "adapter")
    tasks = root / "tasks"
    for sub, seed in (("", 0), ("other", 1)):
        write_jsonl(tasks / sub / "train.jsonl", _task_rows(6, seed))
        write_jsonl(tasks / sub / "test.jsonl", _task_rows(4, seed + 10))
    sft = root / "sft"
    write_jsonl(sft / "train.jsonl", _sft_rows(6))
    write_jsonl(sft / "test.jsonl", _sft_rows(6)[::-1])
    write_jsonl(sft / "other" / "train.jsonl", _sft_rows(5))
    other = root / "a-file.txt"
    other.write_text("not read as anything in particular\n")
    template = root / "template.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] + '> ' + m['content'] }}{% endfor %}")
    from bus.server import free_port

    return Files(root, model, tasks, sft, other, template, free_port())


def _write_adapter(model: Path, folder: Path) -> None:
    """A PEFT adapter of the tiny model (what ``model.lora_configs[0].path`` starts from)."""
    import torch

    from roles.trainer.engine import load_model
    from schemas.config import LoraConfig
    from storage import lora

    peft_model = lora.wrap(load_model(model), LoraConfig(lora_rank=4, target_modules=["q_proj"]))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.01)
    lora.save_adapter(peft_model, folder)


def load(raw: dict[str, Any], where: Path) -> Any:
    """Load ``raw`` as a user's YAML file is loaded (``roles.runtime.config.load`` without its
    plugin folders and hub look-ups: the algorithm resolver, then ``derive()``). The file is
    written and read with libyaml's safe dumper and loader: the same YAML, several times
    faster than the pure-Python ones (hundreds of configurations are loaded here)."""
    from roles.runtime.config import resolve_algorithm
    from schemas.loader import load_config

    p = where / "config.yaml"
    p.write_text(yaml.dump(raw, Dumper=yaml.CSafeDumper, sort_keys=False))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(yaml, "safe_load", lambda text: yaml.load(text, Loader=yaml.CSafeLoader))
        return load_config(p, environ={}, dotenv_file=None, algorithm_resolver=resolve_algorithm)


#: The tiny model's chat template, also rendering tools and ``enable_thinking`` (the tiny
#: tokenizer's own ignores both, which would hide the settings that pass them).
TEMPLATE = (
    "{% if enable_thinking %}{{ 'think\\n' }}{% endif %}"
    "{% if tools %}{{ 's:tools:' }}{% for t in tools %}{{ t['function']['name'] }}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}{{ 'a:' + m['content'] + eos_token }}"
    "{% else %}{{ m['role'][0] + ':' + m['content'] + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}"
)


def base_grpo(f: Files) -> dict[str, Any]:
    """The main configuration: GRPO-style RL with CHORD's expert data (mix_chord: a replay
    store of rollouts plus an SFT auxiliary buffer), a training and an eval taskset, a judge
    model beside the rollout engine, four GPUs, a priority replay buffer and an experience
    operator. Values are set away from the defaults where the default would hide a field
    (a shuffled taskset: its seed matters)."""
    return {
        "project": "proj", "name": "exp", "mode": "both",
        "checkpoint_root_dir": str(f.root / "ckpt"),
        "algorithm": {"algorithm_type": "mix_chord", "repeat_times": 4,
                      "optimizer": {"lr": 1e-5, "lr_warmup_steps": 2, "lr_scheduler_type": "cosine"}},
        "model": {"model_path": str(f.model), "max_model_len": 96, "max_response_tokens": 32,
                  "custom_chat_template": TEMPLATE},
        "cluster": {"node_num": 1, "gpu_per_node": 4},
        "trainer": {"total_steps": 20},
        "buffer": {
            "batch_size": 2, "total_epochs": 1,
            "explorer_input": {
                "taskset": {"name": "train", "path": str(f.tasks), "split": "train",
                            "format": {"prompt_key": "question", "response_key": "answer",
                                       "system_prompt": "be brief"},
                            "task_selector": {"selector_type": "shuffle", "seed": 5},
                            "skip_invalid_rows": True},
                "eval_tasksets": [{"name": "eval", "path": str(f.tasks), "split": "test",
                                   "format": {"response_key": "answer"},
                                   "task_selector": {"selector_type": "shuffle", "seed": 5},
                                   "skip_invalid_rows": True}],
                "default_workflow_type": "math_workflow",
                "default_reward_fn_type": "math_reward",
            },
            "trainer_input": {
                "experience_buffer": {"name": "exp_buffer", "storage_type": "queue",
                                      "replay_buffer": {"enable": True, "reuse_cooldown_time": 1.0}},
                "auxiliary_buffers": {"sft": {"name": "sft", "path": str(f.sft), "split": "train",
                                              "format": {"prompt_type": "plaintext", "prompt_key": "prompt",
                                                         "response_key": "response"},
                                              "data_selector": {"selector_type": "shuffle", "seed": 5},
                                              "skip_invalid_rows": True}},
            },
        },
        "explorer": {
            "rollout_model": {"engine_type": "vllm", "engine_num": 1, "tensor_parallel_size": 1,
                              "enable_openai_api": True},
            "openai_api": {"port": f.port},
            "auxiliary_models": [{"model_path": str(f.model), "engine_type": "vllm"}],
            "dynamic_timeout": {"enable": True, "warmup_min_steps": 2},
            "eval_interval": 1,
        },
        "nats": {"max_payload": 1024 * 1024, "user": "trinity"},
        "data_processor": {"experience_pipeline": {"operators": [
            {"name": "reward_shaping", "args": {"scale": 2.0}}]}},
    }


def base_ppo(f: Files) -> dict[str, Any]:
    """PPO with its critic, a LoRA adapter and checkpoint syncs in a train/explore split: the
    settings that only these use (critic, LoRA, the trainer's sync steps)."""
    cfg = base_grpo(f)
    cfg["algorithm"] = {"algorithm_type": "ppo", "repeat_times": 2}
    cfg["mode"] = "train"
    cfg["model"]["lora_configs"] = [{"lora_rank": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}]
    cfg["synchronizer"] = {"sync_method": "checkpoint", "sync_style": "trainer_driven"}
    cfg["buffer"]["trainer_input"].pop("auxiliary_buffers")
    cfg["trainer"]["critic_warmup"] = 1
    cfg["critic"] = {"optim": {"lr": 1e-5, "lr_scheduler_type": "cosine"}}
    cfg["buffer"]["explorer_input"]["eval_tasksets"][0]["format"]["prompt_key"] = "question"
    return cfg


def base_chord_messages(f: Files) -> dict[str, Any]:
    """CHORD with expert conversations (messages with tools, every assistant turn trained)."""
    cfg = base_grpo(f)
    cfg["buffer"]["trainer_input"]["auxiliary_buffers"]["sft"]["format"] = {
        "prompt_type": "messages", "messages_key": "message", "tools_key": "tools",
        "enable_concatenated_multi_turn": True}
    return cfg


def base_agent(f: Files) -> dict[str, Any]:
    """Agent-shaped rollouts (:class:`AgentProbe`): how a task's rollouts run and what a
    workflow's model handle records."""
    cfg = base_grpo(f)
    cfg["buffer"]["explorer_input"]["default_workflow_type"] = "field_effects_agent"
    cfg["explorer"]["concurrent_mode"] = "asynchronous"
    return cfg


def base_sft(f: Files) -> dict[str, Any]:
    """SFT on a file dataset of conversations with tools: the dataset settings of the
    experience buffer (file only) and multi-turn SFT."""
    cfg = base_grpo(f)
    cfg["algorithm"] = {"algorithm_type": "sft"}
    cfg["mode"] = "train"
    cfg["buffer"]["trainer_input"] = {"experience_buffer": {
        "name": "sft_data", "storage_type": "file", "path": str(f.sft), "split": "train",
        "format": {"prompt_type": "messages", "messages_key": "message", "tools_key": "tools",
                   "enable_concatenated_multi_turn": True},
        "data_selector": {"selector_type": "shuffle", "seed": 5}}}
    cfg["trainer"]["deepspeed"] = {"zero_stage": 3}
    return cfg


def base_sft_plain(f: Files) -> dict[str, Any]:
    """SFT on plaintext columns (prompt, response, per-row system prompt)."""
    cfg = base_sft(f)
    cfg["buffer"]["trainer_input"]["experience_buffer"]["format"] = {
        "prompt_type": "plaintext", "prompt_key": "prompt", "response_key": "response", "system_prompt": "hi"}
    cfg["buffer"]["trainer_input"]["experience_buffer"]["skip_invalid_rows"] = True
    return cfg


def base_dpo(f: Files) -> dict[str, Any]:
    """DPO on a file dataset of chosen/rejected answers."""
    cfg = base_sft_plain(f)
    cfg["algorithm"] = {"algorithm_type": "dpo"}
    return cfg


def base_serve(f: Files) -> dict[str, Any]:
    """Online RL (``mode: serve``): the explorer's OpenAI API, no taskset; rollouts from an
    external OpenAI-compatible server (its URL and key from the environment variables
    ``model.external_model`` names)."""
    cfg = base_grpo(f)
    cfg["algorithm"] = {"algorithm_type": "reinforceplusplus", "repeat_times": 1}
    cfg["mode"] = "serve"
    cfg["model"]["external_model"] = {"enable": True, "model_name": "served"}
    cfg["buffer"]["explorer_input"] = {}
    cfg["buffer"]["trainer_input"].pop("auxiliary_buffers")
    return cfg


#: The configurations every field is tried on, in order: a field proven on the first is not
#: tried on the others. Several, because a field may act only under another setting (a
#: critic's optimizer only with a critic, a dataset's format only with a file buffer).
def base_mixed(f: Files) -> dict[str, Any]:
    """:func:`base_grpo` with two training tasksets mixed by weight (``tasksets``), the
    first with its own workflow (:func:`base_agent`'s probe)."""
    raw = base_grpo(f)
    ei = raw["buffer"]["explorer_input"]
    first = ei.pop("taskset")
    second = copy.deepcopy(first) | {"name": "train2", "task_selector": {"selector_type": "sequential"},
                                     "weight": 1.0}
    ei["tasksets"] = [first | {"weight_schedule": [{"step": 0, "weight": 1.0}, {"step": 4, "weight": 3.0}],
                               "default_workflow_type": "field_effects_agent"}, second]
    raw["buffer"]["batch_size"] = 4  # a step of two tasks of each: the first taskset's two are base_grpo's first step
    return raw


BASES: dict[str, Callable[[Files], dict[str, Any]]] = {
    "grpo": base_grpo, "mixed": base_mixed, "agent": base_agent, "ppo": base_ppo, "chord_messages": base_chord_messages,
    "sft": base_sft, "sft_plain": base_sft_plain, "dpo": base_dpo, "serve": base_serve,
}


# --------------------------------------------------------------------------------------------
# one field, another value
# --------------------------------------------------------------------------------------------

#: "No value": :func:`override_for` has none; :func:`with_value` creates the sections only.
_NONE = object()

#: Values to set where the generic rule (:func:`other_value`) cannot know a valid one: names of
#: columns, files, workflows, algorithm parts, their arguments. Keys match a path or its tail
#: (``format.prompt_key`` matches every taskset's and buffer's); the longest match wins.
#: Callables get the files.
OVERRIDES: dict[str, Any] = {
    "data_selector.feature_keys": ["answer"],
    "data_selector.kwargs": {"target_reward": 0.5},
    "project": "proj2",
    "name": "exp2",
    "mode": "train",
    "checkpoint_root_dir": lambda f: str(f.root / "ckpt2"),
    "algorithm.algorithm_type": "grpo",
    "algorithm.loss_agg_mode": "seq-mean-token-sum",
    "algorithm.sample_strategy": "default",
    "algorithm.sample_strategy_args": {"expert_data_ratio": 0.75},
    "algorithm.advantage_fn": "rloo",
    "algorithm.advantage_fn_args": {"epsilon": 0.5},
    "algorithm.kl_penalty_fn": "k3",
    "algorithm.kl_penalty_fn_args": {"kl_coef": 0.5},
    "algorithm.policy_loss_fn": "ppo",
    "algorithm.policy_loss_fn_args": {"clip_range": 0.5},
    "algorithm.kl_loss_fn": "k3",
    "algorithm.kl_loss_fn_args": {"kl_coef": 0.5},
    "algorithm.entropy_loss_fn": "none",
    "algorithm.entropy_loss_fn_args": {"entropy_coef": 0.5},
    "optimizer.betas": [0.5, 0.5],
    "lr_warmup_steps": 3,  # -1 and 0 both mean no warmup steps here (the ratio is 0)
    "warmup_style": "cosine",
    "critic.optim.warmup_style": "constant",  # the ppo base's critic schedule is cosine
    "optim.betas": [0.5, 0.5],
    "lora_configs[].lora_dtype": "bfloat16",
    "min_response_tokens": 3,
    "enable_prompt_truncation": False,
    "model.model_path": lambda f: str(f.root / "model2"),
    "model.critic_model_path": lambda f: str(f.root / "model2"),
    "model.custom_chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "model.chat_template_path": lambda f: str(f.template),
    "model.rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "model.external_model.base_url_env": "OTHER_BASE_URL",
    "model.external_model.api_key_env": "OTHER_API_KEY",
    "model.lora_configs[].path": lambda f: str(f.root / "adapter"),
    "model.lora_configs[].target_modules": "all-linear",
    "explorer.rollout_model.model_path": lambda f: str(f.root / "model2"),
    "explorer.auxiliary_models[].model_path": lambda f: str(f.root / "model2"),
    "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "rope_scaling": {"rope_type": "linear", "factor": 2.0},
    "extra_engine_args": {"max_num_seqs": 4},
    "explorer.env_vars": {"TRINITY_FIELD_EFFECT": "1"},
    "explorer.openai_api.host": "0.0.0.0",
    "explorer.openai_api.port": lambda f: f.port + 1,
    "explorer.openai_api.api_key": API_KEY + "2",
    "explorer.openai_api.max_n": 1,
    "explorer.openai_api.max_tokens_per_request": 10,
    "explorer.concurrent_mode": "multi-threading",
    "synchronizer.explorer_sync_interval": 2,
    "synchronizer.trainer_sync_interval": 2,
    "nats.stream_max_bytes": 1 << 30,
    # datasets and tasksets: other columns of the same files, another split or subset
    "taskset.path": lambda f: str(f.tasks / "other"),
    "eval_tasksets[].path": lambda f: str(f.tasks / "other"),
    "experience_buffer.path": lambda f: str(f.root / "replay"),  # queue: the store's folder
    "auxiliary_buffers{}.path": lambda f: str(f.sft / "other"),
    "eval_tasksets[].repeat_times": 2,
    "trainer.trainer_type": "pytorch",  # auto is DeepSpeed on a GPU machine
    "taskset.split": "test",
    "eval_tasksets[].split": "train",
    "split": "test",
    "subset_name": "other",
    "taskset.format.prompt_key": "q2",
    "eval_tasksets[].format.prompt_key": "question",
    "taskset.format.response_key": "a2",
    "tasksets[].format.prompt_key": "q2",
    "tasksets[].format.response_key": "a2",
    "tasksets[].path": lambda f: str(f.tasks / "other"),
    "tasksets[].split": "test",
    "eval_tasksets[].format.response_key": "a2",
    "format.prompt_key": "p2",
    "format.response_key": "r2",
    "format.system_prompt_key": "sys",
    "format.messages_key": "message2",
    "format.tools_key": "tools2",
    "format.chosen_key": "c2",
    "format.rejected_key": "x2",
    "format.workflow_key": "wf",
    "format.reward_fn_key": "rf",
    "format.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "default_workflow_type": "math_boxed_workflow",
    "default_eval_workflow_type": "math_boxed_workflow",
    "default_reward_fn_type": "format_reward",
    "workflow_args": {"temperature_bonus": 1},
    "top_k": 5,  # -1 and 0 both turn top-k off
    "rollout_args.stop": ["\n"],  # a reply ends at its first newline
    "reward_fn_args": {"pattern": "^#.*"},
    "replay_buffer.priority_fn_args": {"decay": 3.0},
    "experience_buffer.name": "renamed",
    "data_processor.experience_pipeline.operators[].name": "drop_truncated",
    "data_processor.experience_pipeline.operators[].args": {"scale": 3.0},
    "monitor.monitor_args": {"mode": "offline"},
    "log.level": "DEBUG",
    "nats.url": "nats://127.0.0.1:4333",
    "nats.store_dir": lambda f: str(f.root / "nats2"),
    "nats.creds_file": lambda f: str(f.other_file),
    "nats.nkey_seed_file": lambda f: str(f.other_file),
    "nats.tls_ca_file": lambda f: _ca_bundle(),
    "nats.tls_cert_file": lambda f: str(f.other_file),
    "nats.tls_key_file": lambda f: str(f.other_file),
    "trainer.resume_from_path": lambda f: str(f.root / "ckpt" / "proj" / "exp" / "global_step_1"),
}


def _ca_bundle() -> str:
    """A real CA bundle (certifi's, which httpx brings): TLS with it loads."""
    import certifi

    return certifi.where()


def override_for(path: str, files: Files) -> Any:
    """The :data:`OVERRIDES` value for ``path``, or ``_NONE`` when it has none."""
    keys = [k for k in OVERRIDES if path == k or path.endswith("." + k)]
    if not keys:
        return _NONE
    value = OVERRIDES[max(keys, key=len)]
    return value(files) if callable(value) else copy.deepcopy(value)


class OnlyValue(Exception):
    """The field has one valid value: nothing to set it to, nothing it could ignore."""


def _bounds(field: FieldInfo) -> tuple[float | None, float | None, bool, bool]:
    """(lower, upper, lower strict, upper strict) of a numeric field's constraints."""
    lo = hi = None
    lo_strict = hi_strict = False
    for m in field.metadata:
        if isinstance(m, annotated_types.Ge):
            lo = m.ge
        elif isinstance(m, annotated_types.Gt):
            lo, lo_strict = m.gt, True
        elif isinstance(m, annotated_types.Le):
            hi = m.le
        elif isinstance(m, annotated_types.Lt):
            hi, hi_strict = m.lt, True
    return lo, hi, lo_strict, hi_strict


def _fits(v: float, field: FieldInfo) -> bool:
    lo, hi, lo_strict, hi_strict = _bounds(field)
    if lo is not None and (v < lo or (lo_strict and v == lo)):
        return False
    return not (hi is not None and (v > hi or (hi_strict and v == hi)))


def other_value(path: str, field: FieldInfo, current: Any, files: Files) -> Any:
    """A valid value for ``path`` other than ``current``: an :data:`OVERRIDES` entry, else by
    the field's type (a bool flipped, a number moved within its bounds, another Literal
    choice, a string changed, None given a value)."""
    forced = override_for(path, files)
    if forced is not _NONE:
        return forced
    ann = field.annotation
    args = [a for a in typing.get_args(ann) if a is not type(None)]
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        ann = args[0] if len(args) == 1 else ann
    if typing.get_origin(ann) is typing.Literal:
        others = [c for c in typing.get_args(ann) if c != current]
        if not others:
            raise OnlyValue(f"{path}: {current!r} is its only valid value")
        return others[0]
    if ann is bool:
        return not current
    if ann in (int, float):
        lo = _bounds(field)[0]
        if current is None:
            candidates = [1, 2, 8] if ann is int else [0.5, 1.0, 2.0]
        elif ann is int:
            candidates = [current + 1, current - 1, max(int(lo or 0), 1) + 1]
        else:
            candidates = [current * 2 if current else 0.5, current / 2, current + 0.5, (lo or 0) + 0.25]
        for v in candidates:
            if v != current and _fits(v, field):
                return v
        raise AssertionError(f"{path}: no other value fits the bounds; add it to OVERRIDES")
    if ann is str or (typing.get_origin(ann) is typing.Annotated and typing.get_args(ann)[0] is str):
        return "other" if not current else f"{current}2"
    raise AssertionError(f"{path}: cannot make a value of {field.annotation}; add it to OVERRIDES")


def _segments(path: str) -> list[tuple[str, str]]:
    """``a.b[].c{}.d`` -> ``[("a", ""), ("b", "[]"), ("c", "{}"), ("d", "")]``."""
    out = []
    for seg in path.split("."):
        kind = seg[-2:] if seg.endswith(("[]", "{}")) else ""
        out.append((seg[: len(seg) - len(kind)], kind))
    return out


def concrete(path: str, raw: dict[str, Any]) -> str | None:
    """``path`` as it names a value in ``raw`` (``[0]``, the dict's first key), as the loader's
    warnings spell it; None when ``raw`` has no list item or dict entry there."""
    node: Any = raw
    parts = []
    for name, kind in _segments(path):
        node = node.get(name) if isinstance(node, dict) else None
        if kind == "[]":
            if not node:
                return None
            parts.append(f"{name}[0]")
            node = node[0]
        elif kind == "{}":
            if not node:
                return None
            key = next(iter(node))
            parts.append(f"{name}.{key}")
            node = node[key]
        else:
            parts.append(name)
    return ".".join(parts)


def current_value(cfg: TrinityConfig, path: str) -> Any:
    """The value at ``path`` of a validated (not yet derived) config; under a section that
    is not set (None), the field's default."""
    node: Any = cfg
    model: type[BaseModel] = TrinityConfig
    for name, kind in _segments(path):
        f = model.model_fields[name]
        value = getattr(node, name) if node is not None else f.get_default(call_default_factory=True)
        if kind == "[]":
            value = value[0] if value else None
        elif kind == "{}":
            value = next(iter(value.values())) if value else None
        subs = _models(f.annotation)
        if subs:
            model = subs[0][1]
        node = value
    return node


def has_sections(cfg: TrinityConfig, path: str) -> bool:
    """Is every section above ``path``'s leaf there in ``cfg``? (An optional section left out
    is None: ``taskset``, ``task_selector``; the others take their defaults.)"""
    node: Any = cfg
    for name, kind in _segments(path)[:-1]:
        node = getattr(node, name)
        if kind and node:
            node = node[0] if kind == "[]" else next(iter(node.values()))
        if node is None:
            return False
    return True


def with_value(raw: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``raw`` with ``path`` set to ``value`` (sections created as needed; only
    those when ``value`` is ``_NONE``)."""
    out = copy.deepcopy(raw)
    node = out
    segs = _segments(path)
    for name, kind in segs[:-1]:
        if kind == "[]":
            node = node[name][0]
        elif kind == "{}":
            node = next(iter(node[name].values()))
        else:
            if node.get(name) is None:
                node[name] = {}
            node = node[name]
    if value is not _NONE:
        node[segs[-1][0]] = value
    return out


# --------------------------------------------------------------------------------------------
# what the program does with a configuration
# --------------------------------------------------------------------------------------------


_LOOP: list[asyncio.AbstractEventLoop] = []


def run(coro: Any) -> Any:
    """``coro`` on this module's event loop: one loop for every observation, so its worker
    threads (``asyncio.to_thread``) are started once, not for every probe."""
    if not _LOOP:
        _LOOP.append(asyncio.new_event_loop())
    return _LOOP[0].run_until_complete(coro)


def plain(x: Any) -> Any:
    """``x`` as comparable plain data: dataclasses and models as dicts, arrays as lists,
    floats rounded (a value computed the same way twice must compare equal), objects by
    their class and public state."""
    import numpy as np
    import torch

    if isinstance(x, bool | int | str) or x is None:
        return x
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, BaseModel):
        return plain(x.model_dump())
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [plain(v) for v in x]
    if isinstance(x, set | frozenset):
        return sorted(map(repr, x))
    if isinstance(x, np.ndarray | np.generic | torch.Tensor):
        return plain(x.tolist())
    if isinstance(x, Path):
        return str(x)
    if callable(x) and hasattr(x, "__qualname__"):
        return x.__qualname__
    import re

    return re.sub(r" at 0x[0-9a-f]+", "", repr(x))


def _attrs(obj: Any, names: str) -> dict[str, Any]:
    return {n: plain(getattr(obj, n)) for n in names.split()}


class _EngineArgs:
    """vLLM's ``AsyncEngineArgs``: keeps what it is given."""

    def __init__(self, **kw: Any) -> None:
        self.kw = kw


class _FakeLLM:
    """vLLM's ``AsyncLLM`` as :class:`roles.explorer.engines.vllm.VLLMEngine` drives it, without
    a model: each request is recorded (prompt ids, sampling parameters, LoRA request) and
    answered with a fixed text per sample (a tool call when the prompt shows tools)."""

    output_handler = None

    def __init__(self, args: _EngineArgs) -> None:
        self.args = args.kw
        self.requests: list[dict[str, Any]] = []

    @classmethod
    def from_engine_args(cls, args: _EngineArgs) -> _FakeLLM:
        return cls(args)

    async def generate(self, prompt: dict[str, Any], params: Any, request_id: str,
                       lora_request: Any = None) -> Any:
        self.requests.append({"prompt": list(prompt["prompt_token_ids"]), "params": plain(params),
                              "lora": lora_request.lora_path if lora_request else None})
        tok = _tokenizer()
        tools = "tools:" in tok.decode(prompt["prompt_token_ids"])
        texts = [f'<tool_call>{{"name":"add","arguments":{{"a":{i}}}}}</tool_call>' if tools else f"#### {i}"
                 for i in range(params.n)]
        outs = [types.SimpleNamespace(token_ids=tok.encode(t, add_special_tokens=False)[: params.max_tokens],
                                      logprobs=None, finish_reason="stop") for t in texts]
        yield types.SimpleNamespace(outputs=outs, prompt_logprobs=None)

    async def reset_prefix_cache(self) -> None:
        return None

    def shutdown(self) -> None:
        return None


class _FakeOpenAI:
    """openai's ``AsyncOpenAI`` as an external engine (:mod:`roles.explorer.engines.external`)
    uses it: keeps its server and key, records each chat request and answers with a fixed
    text per choice (no server is reached)."""

    def __init__(self, base_url: str, api_key: str) -> None:
        self.base_url, self.api_key = base_url, api_key
        self.requests: list[Any] = []
        self.chat = types.SimpleNamespace(completions=types.SimpleNamespace(create=self._create))

    async def _create(self, **kw: Any) -> Any:
        self.requests.append(plain(kw))
        return types.SimpleNamespace(choices=[
            types.SimpleNamespace(message=types.SimpleNamespace(content=f"#### {i}"), logprobs=None,
                                  finish_reason="stop") for i in range(kw.get("n", 1))])

    async def close(self) -> None:
        return None


_TOKENIZER: list[Any] = []


def _tokenizer() -> Any:
    if not _TOKENIZER:
        from storage.tiny import build_tokenizer

        _TOKENIZER.append(build_tokenizer())
    return _TOKENIZER[0]


class _Delegate:
    """An object whose attributes are ``target``'s, but for those given."""

    def __init__(self, target: Any, **own: Any) -> None:
        self._target = target
        self.__dict__.update(own)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)


#: The roles' modules whose own decisions depend on a GPU being there (the trainer's engine
#: and dtype, vLLM's engine arguments).
GPU_DECIDERS = ("roles.trainer.main", "roles.trainer.deepspeed_engine", "roles.explorer.engines.vllm")


@contextlib.contextmanager
def gpu_view(mp: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """What a GPU machine's roles would do: in the modules of :data:`GPU_DECIDERS`,
    ``torch.cuda.is_available()`` answers True (the libraries below them, peft, transformers,
    DeepSpeed, keep seeing this machine), and ``deepspeed.initialize`` records its config
    (yielded) instead of building an engine."""
    import importlib

    import deepspeed
    import torch

    configs: list[dict[str, Any]] = []

    def initialize(*, model: Any, optimizer: Any, lr_scheduler: Any, config: dict[str, Any]) -> Any:
        configs.append(config)
        return types.SimpleNamespace(module=model), optimizer, None, lr_scheduler

    on_gpu = _Delegate(torch, cuda=_Delegate(torch.cuda, is_available=lambda: True))
    with mp.context() as m:
        for name in GPU_DECIDERS:
            m.setattr(importlib.import_module(name), "torch", on_gpu)
        m.setattr(deepspeed, "initialize", initialize)
        yield configs


def _engine_summary(engine: Any) -> dict[str, Any]:
    """What an actor's or critic's train engine will do: its optimizer's settings, the
    learning-rate factor over the first steps, the gradient clip, the model it trains."""
    from storage import lora

    model = engine.model
    groups = [{k: v for k, v in g.items() if k != "params"} for g in engine.optimizer.param_groups]
    out = {
        "engine": type(engine).__name__,
        "optimizer": type(engine.optimizer).__name__,
        "groups": plain(groups),
        "lr_factors": plain([engine.scheduler.lr_lambdas[0](s) for s in (0, 1, 2, 3, 5, 8, 13, 50, 99)]),
        "grad_clip": plain(getattr(engine, "grad_clip", None)),
        "zero_stage": getattr(engine, "zero_stage", None),
        "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "param_sum": plain(float(sum(p.detach().double().sum() for p in model.parameters()))),
        "dtypes": sorted({str(p.dtype) for p in model.parameters() if p.requires_grad}),
        "gradient_checkpointing": bool(getattr(model, "is_gradient_checkpointing", False)),
        "config": plain({k: getattr(model.config, k, None) for k in ("rope_scaling", "rope_theta")}),
    }
    if lora.is_lora(model):
        pc = model.peft_config["default"]
        out["lora"] = plain({"r": pc.r, "alpha": pc.lora_alpha, "targets": sorted(pc.target_modules),
                             "modules": sorted({n.split(".lora_")[0].rsplit(".", 1)[-1]
                                                for n, _ in model.named_parameters() if ".lora_" in n})})
    return out


def probe_trainer(cfg: TrinityConfig, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """The trainer process as :class:`roles.trainer.main.Trainer` builds it on a GPU machine
    (:func:`gpu_view`: the DeepSpeed engine's config recorded): the models it loads, its
    engine's optimizer and schedule, its step runner's splits of a batch, the critic."""
    from roles.trainer import deepspeed_engine
    from roles.trainer import main as trainer_main

    out: dict[str, Any] = {}
    loads: list[Any] = []
    real_load = trainer_main.load_model

    def load_model(path: Any, *a: Any, **kw: Any) -> Any:
        loads.append(plain([str(path), a, kw]))
        return real_load(path, *a, **kw)

    with gpu_view(mp) as ds_configs, mp.context() as m:
        m.setattr(trainer_main, "load_model", load_model)
        m.setattr(deepspeed_engine, "load_model", load_model)
        t = trainer_main.Trainer(cfg)
    r = t.runner
    out["trainer"] = {
        "job": str(t.job), "step": t.step, "engine": _engine_summary(t.engine), "ds_config": plain(ds_configs),
        "loads": loads,
        "runner": _attrs(r, "critic_warmup temperature use_dynamic_bsz max_token_len micro_batch_size pad "
                            "balance_batch ppo_epochs mini_batch_rows shuffle bypass_old_logprobs "
                            "with_entropy entropy_grad kl_coef policy_fn entropy_fn"),
        "reference": type(r.ref).__name__,
        "mini_batches": r.mini_batches(8, 3),
        # how run() splits a batch of these lengths into micro-batches, alone and as rank 0 of 2
        "micro_batches": r._split(list(range(8)), [5, 40, 7, 33, 12, 9, 60, 3], None)[0],
        "rank0_rows": r._split(list(range(8)), [5, 40, 7, 33, 12, 9, 60, 3], _TwoRanks())[0],
    }
    if r.critic is not None:
        out["trainer"]["critic"] = {"engine": _engine_summary(r.critic.engine),
                                    "cliprange_value": r.critic.cfg.cliprange_value}
    out["total_steps"] = trainer_main.total_steps(cfg)
    out["mini_batch_rows"] = trainer_main.mini_batch_rows(cfg)
    return out


class _TwoRanks:
    """Rank 0 of two data-parallel trainer processes (:class:`roles.trainer.ranks.DataParallel`'s
    face to the step runner)."""

    rank, world = 0, 2

    def max(self, n: int) -> int:
        return n


def _task(t: Any) -> dict[str, Any]:
    """A task as the runners get it: which row, workflow and reward function, how many
    rollouts. Its ``format``, ``rollout_args`` and ``*_args`` are left out: they are handed
    on as they are (to the workflow, the engine, the reward function), and what those make of
    them is in the rollouts and the engine requests (a key passed on and never read must not
    count as an effect)."""
    return _attrs(t, "task_id workflow reward_fn repeat_times is_eval taskset index epoch raw")


def _reader(reader: Any) -> dict[str, Any]:
    skipped = reader.rowset.skipped if reader.rowset is not None else None
    return {"state": plain(reader.state_dict()), "batches": len(reader), "skipped": skipped,
            "drop_last": reader.drop_last}


async def _explore(cfg: TrinityConfig, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """The explorer as :func:`roles.explorer.main.run_explorer` builds it (engines, runners;
    vLLM and an external server recorded: :class:`_FakeLLM`, :class:`_FakeOpenAI`) running its
    leader's step loop (:class:`roles.explorer.explore.Leader`) over the whole taskset, with the run's task queue
    and KV state in memory (:class:`_Queue`, :class:`_KV`) and its evaluations recorded; then
    an evaluation (:func:`roles.explorer.eval.evaluate`) and, when the explorer serves its
    OpenAI API, an agent's requests."""
    import openai

    from roles.explorer import core
    from roles.explorer import explore as explore_mod
    from roles.explorer.engines import vllm as vllm_mod
    from roles.explorer.eval import eval_readers, evaluate
    from roles.runtime.role import Heartbeat, RoleContext

    out: dict[str, Any] = {}
    engines: list[Any] = []
    auxiliary: list[list[Any]] = []
    with mp.context() as m:
        m.setattr(vllm_mod, "_vllm_classes", lambda: (_EngineArgs, _FakeLLM))
        m.setattr(openai, "AsyncOpenAI", _FakeOpenAI)
        try:
            engines, auxiliary = await _engines(cfg)
            out["engines"] = [_engine(e) for e in engines]
            out["auxiliary"] = [[_engine(e) for e in es] for es in auxiliary]
            kv = _KV()
            ctx = RoleContext(cfg, nc=None, js=None, pub=_Pub(), state=kv, stop=asyncio.Event(),
                              beat=Heartbeat(kv), log=None)
            explorer = core.Explorer(ctx, engines, sync=core.NoSync(), auxiliary=auxiliary)
            explorer.beat(cfg.explorer.name)  # as the leader beats
            pool = explorer.pool
            out["pool"] = {"size": pool.size, "timeout": pool.timeout, "teacher": pool.teacher,
                           "env": {k: os.environ.get(k) for k in cfg.explorer.env_vars}}
            out["explorer"] = {"name": explorer.me.split("-")[0], "beat": ctx.beat.name}
            sync = await core.make_sync(cfg, None, None, None)
            out["sync_client"] = {"kind": type(sync).__name__, "plan": plain(getattr(sync, "plan", None)),
                                  "interval": getattr(sync, "interval", None)}
            if cfg.buffer.explorer_input.training():
                out["train_readers"] = [_reader(r) for r in scheduler_from_config(cfg).readers]
                queue, evals = _Queue(pool), []

                async def record_eval(cfg: Any, pool: Any, step: int, publish: Any = None, final: bool = False) -> list:
                    evals.append([step, final])
                    return []

                async def no_report(metric: Any) -> None:
                    return None

                m.setattr(explore_mod, "evaluate", record_eval)
                m.setattr(core, "evaluate", record_eval)
                m.setattr(explore_mod, "TaskQueue", lambda nc, cfg, pub: queue)
                explorer.report = no_report
                stats = await explore_mod.Leader(explorer).run(core.NoSync())
                out["run"] = {"steps": stats.steps, "evals": evals, "failed": stats.failed,
                              "cursor": plain(kv.values.get(core.CURSOR_KEY)),
                              "tasks": [[t["task_id"] for t in step] for step in queue.steps]}
                out["tasks"] = queue.steps[0] if queue.steps else []
                out["split"] = [p.repeat for p in pool.split(queue.first[0].task)] if queue.first else []
                out["rollouts"] = [_result(r) for r in queue.first]
                cut = []  # the dynamic timeout after these successes, as the explorer's steps go by
                for step in range(4):
                    pool.steps_seen = step
                    cut.append(pool.current_timeout() < pool.timeout)
                out["timeout_cut"] = cut
            out["eval_readers"] = [_reader(r) for r in eval_readers(cfg)]
            out["eval_tasks"] = [_task(t) for r in eval_readers(cfg) for b in r for t in b]
            run_task, eval_results = pool.run_task, []

            async def recorded(task: Any) -> Any:
                eval_results.append(await run_task(task))
                return eval_results[-1]

            m.setattr(pool, "run_task", recorded)
            out["eval"] = [plain(mt.values) | {"taskset": mt.taskset} for mt in await evaluate(cfg, pool, 0)]
            out["eval_rollouts"] = sorted((_result(r) for r in eval_results), key=repr)
            if cfg.mode == "serve" or cfg.explorer.rollout_model.enable_openai_api:
                out["api"] = await _agent_requests(explorer)
            out["requests"] = [e.llm.requests if isinstance(getattr(e, "llm", None), _FakeLLM) else
                               e.client.requests if isinstance(getattr(e, "client", None), _FakeOpenAI) else None
                               for e in engines]
        finally:
            await _close(engines, auxiliary)
    return out


class _KV:
    """The run's KV state (``bus.RunState``) as the leading explorer uses it, in memory."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def get(self, key: str) -> Any:
        return self.values.get(key)

    async def put(self, key: str, value: Any) -> None:
        self.values[key] = value

    async def set_model_version(self, name: str, version: int) -> None:
        return None

    async def heartbeat(self, name: str, **kw: Any) -> None:
        return None


class _Pub:
    """The bus publisher as the leading explorer uses it (metrics go nowhere)."""

    async def flush(self) -> None:
        return None

    async def publish_event(self, event: Any) -> None:
        return None


class _Queue:
    """The run's task queue (``roles.explorer.queue.TaskQueue``) worked by this process alone:
    a step's tasks run on the pool when the leader waits for them. Keeps each step's tasks and
    the first step's results."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.done: dict[int, Any] = {}
        self.floor = 0
        self.steps: list[list[dict[str, Any]]] = []
        self.first: list[Any] = []

    async def start(self, done_from: int) -> None:
        return None

    async def put(self, step: int, tasks: list[Any], version: int) -> None:
        self.steps.append([_task(t) for t in tasks])

    async def wait_step(self, step: int, tasks: list[Any], minimum: int, wait_after_min: float) -> list[Any]:
        results = [await self.pool.run_task(t) for t in tasks]
        self.first = self.first or results
        return results

    async def next_done_seq(self) -> int:
        return 1

    async def drained(self) -> None:
        return None

    async def close(self) -> None:
        return None


#: A tool an agent offers the model (the probe's request).
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}


async def _agent_requests(explorer: Any) -> dict[str, Any]:
    """An agent's requests to the explorer's OpenAI API (:meth:`Explorer.start_api`): a tool
    call asked for with two choices and a large ``max_tokens``, then the model list."""
    import httpx

    from roles.explorer.core import stop_auxiliary_apis

    url = await explorer.start_api()
    try:
        out: dict[str, Any] = {"url": url}
        headers = {"Authorization": f"Bearer {API_KEY}"}
        body = {"model": explorer.api.model_name, "messages": [{"role": "user", "content": "3+4=?"}],
                "tools": [ADD_TOOL], "n": 2, "max_tokens": 60}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=10, verify=False) as client:
            r = await client.post("/v1/episodes/probe/chat/completions", json=body)
            got = r.json()
            for k in ("id", "created"):  # fresh per response
                got.pop(k, None)
            for choice in got.get("choices", []):
                for call in choice["message"].get("tool_calls") or []:
                    call.pop("id")
            out["chat"] = [r.status_code, got]
            r = await client.get("/v1/models")
            models = r.json()
            for model in models.get("data", []):
                model.pop("created")
            out["models"] = [r.status_code, models]
        return out
    finally:
        await explorer.api.stop()
        await stop_auxiliary_apis(explorer.pool)


async def _engines(cfg: TrinityConfig) -> tuple[list[Any], list[list[Any]]]:
    """The rollout and auxiliary engines, on the GPUs of the device plan, as
    :func:`roles.explorer.main.run_explorer` creates them."""
    from roles.explorer.engines import create_auxiliary, create_engines
    from roles.runtime.placement import device_plan
    from storage.lora import adapter_sync

    plan = device_plan([cfg])
    gpus = plan.engine_devices(plan.of("rollout engine")) if plan.gpu_per_node else None
    aux_gpus = ([plan.engine_devices(plan.of(f"auxiliary {i} engine"))
                 for i in range(len(cfg.explorer.auxiliary_models))] if plan.gpu_per_node else None)
    engines = await create_engines(cfg.explorer.rollout_model, cfg.model.external_model, adapter_sync(cfg), gpus)
    try:
        auxiliary = await create_auxiliary(cfg.explorer.auxiliary_models, cfg.model.external_model, aux_gpus)
    except BaseException:
        await _close(engines, [])
        raise
    return engines, auxiliary


async def _close(engines: list[Any], auxiliary: list[list[Any]]) -> None:
    for e in engines + [a for es in auxiliary for a in es]:
        with contextlib.suppress(Exception):
            await e.close()


def _engine(e: Any) -> dict[str, Any]:
    """A rollout engine as built: its class, limits, chat template settings, default
    sampling and, for vLLM, the engine arguments."""
    out: dict[str, Any] = {"kind": type(e).__name__, "name": e.name,
                           "tp": e.tensor_parallel_size, "template_kwargs": plain(e.template_kwargs)}
    if getattr(e, "tokenizer", None) is not None:
        out["template"] = e.tokenizer.chat_template
    if hasattr(e, "limits"):
        out["limits"] = plain(e.limits)
    if hasattr(e, "sampling_params"):
        out["default_sampling"] = plain(e.sampling_params(1, 8, {}))
        out["lora"] = plain(e.lora_request)
    if isinstance(getattr(e, "llm", None), _FakeLLM):
        args = dict(e.llm.args)
        if "hf_overrides" in args:  # functools.partial(override_rope, ...)
            args["hf_overrides"] = plain(args["hf_overrides"].keywords)
        out["args"] = plain(args)
    if hasattr(e, "client"):  # an external server
        out["client"] = [str(e.client.base_url), e.client.api_key, e.model_name]
    if hasattr(e, "device"):
        out["dtype"] = str(next(e.model.parameters()).dtype)
    return out


def _result(r: Any) -> dict[str, Any]:
    exps = r.group.experiences if r.group else []
    return {"error": r.error, "attempts": r.attempts,
            "experiences": [_attrs(e, "tokens prompt_length reward info response_truncated prompt_truncated "
                                      "messages response_text") for e in exps]}


def probe_explorer(cfg: TrinityConfig, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """The explorer at work on this machine (:func:`_explore`), what it shares with the other
    explorers of a run, and the vLLM engine arguments a GPU machine would use."""
    from roles.explorer.core import served_model_name
    from roles.explorer.engines import vllm as vllm_mod
    from roles.explorer.explore import over_rollout_minimum
    from roles.explorer.lease import join_fingerprint

    out = run(_explore(cfg, mp))
    out["over_rollout_minimum"] = over_rollout_minimum(8, cfg)
    out["fingerprint"] = plain(join_fingerprint(cfg))
    out["served_model"] = served_model_name(cfg)
    if all(m.engine_type == "vllm" for m in [cfg.explorer.rollout_model, *cfg.explorer.auxiliary_models]):
        with gpu_view(mp), mp.context() as m:
            m.setattr(vllm_mod, "_vllm_classes", lambda: (_EngineArgs, _FakeLLM))
            engines, auxiliary = run(_engines(cfg))
        out["gpu_engines"] = [_engine(e) for e in engines + [a for es in auxiliary for a in es]]
        run(_close(engines, auxiliary))
    return out


def _sample_group() -> Any:
    """A rollout group of four experiences (small token ids: inside the tiny vocabulary)."""
    import numpy as np

    from schemas.data import Experience, ExperienceGroup

    exps = [Experience(id=f"g/{i}", task_id="t", group_id="g", run_id="r",
                       tokens=np.arange(3, 13, dtype=np.int32) + i, prompt_length=4,
                       logprobs=-np.full(6, 0.5, dtype=np.float32), action_mask=np.ones(6, dtype=bool),
                       reward=float(i % 3), response_truncated=i == 3)
            for i in range(4)]
    return ExperienceGroup(group_id="g", task_id="t", run_id="r", model_version=0, experiences=exps)


def probe_buffer(cfg: TrinityConfig, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """The buffer's service as :func:`roles.buffer.main.build_service` builds it: its replay
    store, the first batch it serves (datasets, expert data), what its pipeline does to a
    group."""
    from roles.buffer.main import build_service
    from schemas import codec
    from schemas.rpc import BatchRequest

    svc = build_service(cfg)
    try:
        out: dict[str, Any] = {
            "store": None if svc.store is None else {
                "path": str(svc.store.path),
                **_attrs(svc.store, "mode capacity reuse_cooldown_time priority_fn")},
            "plan": plain(svc.plan(8, 3)), "max_read_timeout": svc.max_read_timeout, "vocab": svc.vocab,
            "files": {name: {"rows": len(b.reader.rows), "epochs_rows": b.reader.total_samples,
                             "max_length": b.max_length, "kind": b.kind}
                      for name, b in (({"main": svc.main_file} if svc.main_file else {}) | svc.aux).items()},
        }
        group = svc.pipeline(_sample_group())
        out["pipeline"] = None if group is None else [_attrs(e, "reward advantages returns") for e in group.experiences]
        reply = run(svc.batch(BatchRequest(1, cfg.buffer.train_batch_size, 0, 0.0)))
        out["batch"] = [_attrs(codec.decode(item), "id tokens prompt_length action_mask chosen rejected "
                                                   "response_truncated info") for item in reply.items]
        return out
    finally:
        if svc.store is not None:
            svc.store.close()


def probe_sync(cfg: TrinityConfig, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """When and how weights move: the trainer's sync client (plan, receivers, bucket size)."""
    from roles.weightsync.broadcast import bucket_bytes, receivers
    from schemas.state import SyncPlan

    plan = SyncPlan.from_config(cfg.synchronizer)
    return {"plan": plain(plan), "receivers": receivers(cfg), "bucket": bucket_bytes(cfg, "nccl")}


def probe_placement(cfg: TrinityConfig, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """Which GPUs each process gets (``trinity run``'s device plan) and the roles it starts."""
    from roles.launch.run import fresh_name
    from roles.launch.stages import roles_needed
    from roles.runtime.placement import device_plan, trainer_ranks, visible_devices

    plan = device_plan([cfg])
    return {"plan": plain(plan), "ranks": trainer_ranks(plan),
            "visible": {p: visible_devices(plan, p) for p in ("explorer", "trainer", "buffer")},
            "roles": roles_needed([cfg]), "renamed": fresh_name(cfg) is not None}


class _FakeNATS:
    """nats-py's client as :func:`bus.connect` drives it: records the connect arguments and
    the options it sets afterwards."""

    max_payload = 0

    def __init__(self) -> None:
        self.options: dict[str, Any] = {}
        self.connected_url = None
        self.is_closed = False

    async def connect(self, reconnect_to_server_handler: Any = None, **kw: Any) -> None:
        self.options.update({k: v for k, v in kw.items() if not k.endswith("_cb")})

    def jetstream(self, **kw: Any) -> dict[str, Any]:
        return kw


def probe_bus(cfg: TrinityConfig, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """The bus as the roles set it up: stream and consumer configs, the publisher's limits,
    the connection's options (nats-py's client recorded), and the embedded server ``trinity
    run`` starts (its config file, not the process). Each part on its own: one refused (an
    embedded server that cannot apply a setting) does not hide the others."""
    import bus
    from bus import connection, server
    from bus.streams import stream_config
    from bus.subjects import KINDS

    n = cfg.nats

    def streams() -> Any:
        return [plain(stream_config(n, cfg.run_id, k).as_dict()) for k in KINDS]

    def consumer() -> Any:
        c = bus.Consumer(_FakeNATS(), n, cfg.run_id, "exp", "buffer")
        return {"config": plain(c.consumer_config().as_dict()), "batch": c.batch_size(), "stale_after": c.stale_after}

    def publisher() -> Any:
        pub = bus.Publisher(_FakeNATS(), n, cfg.run_id)
        return {"chunk": pub.chunk_size, "jetstream": plain(pub.js)}

    def connect() -> Any:
        with mp.context() as m:
            m.setattr(connection, "NATS", _FakeNATS)
            nc = run(bus.connect(n, name="probe"))
        return {**plain({k: v for k, v in nc.options.items() if k != "tls"}), "tls": nc.options.get("tls") is not None}

    def embedded() -> Any:
        with mp.context() as m:
            m.setattr(server, "is_listening", lambda *a, **kw: False)
            m.setattr(server.EmbeddedServer, "start", lambda self: self)
            srv = server.ensure_server(n, n.store_dir or server.default_store_dir(n, cfg.checkpoint_root_dir))
        return srv and server.render_config(**srv._render)  # the file its start() writes

    return {name: _part(fn) for name, fn in (("streams", streams), ("consumer", consumer), ("publisher", publisher),
                                              ("connection", connect), ("server", embedded))}


def _part(fn: Callable[[], Any]) -> Any:
    """``fn()``, or the error it raised (which is what the program does then)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any failure is an observation
        return f"error: {type(e).__name__}: {e}"


def probe_misc(cfg: TrinityConfig, mp: pytest.MonkeyPatch) -> dict[str, Any]:
    """The resolved algorithm every role runs, and the monitor's check of its arguments."""
    from roles.runtime.config import algorithm_spec
    from roles.runtime.monitor import monitor_args_problems

    return {"algorithm": plain(algorithm_spec(cfg)), "monitor_problems": monitor_args_problems(cfg.monitor),
            "run_id": cfg.run_id}


PROBES: dict[str, Callable[[TrinityConfig, pytest.MonkeyPatch], dict[str, Any]]] = {
    "misc": probe_misc, "placement": probe_placement, "sync": probe_sync, "bus": probe_bus,
    "explorer": probe_explorer, "trainer": probe_trainer, "buffer": probe_buffer,
}


_LOADED: dict[str, Any] = {}


def _cached(load: Callable[..., Any]) -> Callable[..., Any]:
    """``load`` (a model or tokenizer from a folder) done once per distinct arguments; each
    caller gets its own copy, as if it had read the folder itself."""

    import torch

    def cached(*args: Any, **kw: Any) -> Any:
        key = repr((load.__qualname__, args, sorted(kw.items())))
        if key not in _LOADED:
            rng = torch.get_rng_state()  # the first load must not draw more than the copies do
            _LOADED[key] = load(*args, **kw)
            torch.set_rng_state(rng)
        return copy.deepcopy(_LOADED[key])

    return cached


def observe(cfg: TrinityConfig) -> dict[str, Any]:
    """What the roles make of ``cfg``, flattened to ``probe.key -> value``. A probe that raises
    records its error instead (a setting that makes a role fail changes what it does). The
    process environment is restored afterwards (runners set ``explorer.env_vars``, DeepSpeed
    its launcher variables). Models and tokenizers are read from their folders once
    (:func:`_cached`), and the replay store's files are not flushed to disk (their
    durability is not what is observed; a flush costs more than the rest of a store's
    opening)."""
    import lmdb
    import torch
    import transformers

    from roles.trainer import critic, deepspeed_engine, engine
    from roles.trainer import main as trainer_main

    out: dict[str, Any] = {}
    env = dict(os.environ)
    try:
        with pytest.MonkeyPatch.context() as mp:
            for module in (trainer_main, deepspeed_engine):
                mp.setattr(module, "load_model", _cached(engine.load_model))
            mp.setattr(critic, "load_value_model", _cached(critic.load_value_model))
            mp.setattr(transformers.AutoTokenizer, "from_pretrained", _cached(transformers.AutoTokenizer.from_pretrained))
            mp.setattr(lmdb, "open", functools.partial(lmdb.open, sync=False, metasync=False))
            for name, probe in PROBES.items():
                if name in ("explorer", "trainer"):
                    torch.manual_seed(0)  # what starts at random (a critic's head, a LoRA adapter) starts alike
                got = _part(lambda: probe(cfg, mp))  # noqa: B023 - called at once
                if isinstance(got, str):
                    out[name] = got
                    continue
                for k, v in got.items():
                    out[f"{name}.{k}"] = plain(v)
    finally:
        os.environ.clear()
        os.environ.update(env)
    return out


# --------------------------------------------------------------------------------------------
# effects that only running processes show
# --------------------------------------------------------------------------------------------

#: Fields whose effect :func:`observe` cannot see (it happens while processes run: timeouts,
#: retries, reconnects, servers), each with the test that exercises that effect. The test is
#: checked to exist and to mention the field.
RUNTIME_EFFECTS: dict[str, str] = {
    # read by the start's GPU-memory check, which runs where a GPU is (its size stood in for)
    "ignore_validator_suggestions":
        "tests/roles/test_fit.py::test_the_start_refuses_what_does_not_fit_unless_ignore_validator_suggestions",
    "buffer.trainer_input.experience_buffer.total_epochs":
        "tests/trainer/test_buffer.py::test_a_file_buffers_own_total_epochs_bounds_its_rows",
    **{f"data_processor.task_pipeline.{leaf}": "tests/roles/test_juicer.py::test_guide_selector_snippet_and_data_processor_load"
       for leaf in ("operators[].name", "operators[].args", "config_path", "inputs", "target_fields")},
    **{f"buffer.explorer_input.{ts}.{sel}.{leaf}": f"tests/storage/test_selectors.py::{test}"
       for ts in ("taskset", "tasksets[]", "eval_tasksets[]")
       for sel in ("task_selector", "data_selector")
       for leaf, test in (("feature_keys", "test_offline_easy2hard_sorts_by_feature_keys_largest_first"),
                          ("kwargs", "test_difficulty_based_picks_rows_near_the_target_and_resumes_exactly"))},
    "cluster.cpu_tuning": "tests/roles/test_cli.py::test_cpu_tuning_applies_where_the_setting_says",
    "explorer.max_retry_times":
        "tests/explorer/test_engines_workflows.py::test_failing_workflow_is_counted_and_others_published",
    "explorer.over_rollout.wait_after_min":
        "tests/explorer/test_engines_workflows.py::test_over_rollout_goes_on_without_the_slow_task_and_publishes_it_later",
    "explorer.runner_state_report_interval":
        "tests/explorer/test_engines_workflows.py::test_over_rollout_goes_on_without_the_slow_task_and_publishes_it_later",
    "explorer.dynamic_timeout.ratio":
        "tests/explorer/test_engines_workflows.py::test_dynamic_timeout_cuts_a_task_far_slower_than_the_others",
    "explorer.bench_on_latest_checkpoint":
        "tests/run/test_modes.py::test_train_and_explore_side_by_side_then_bench_over_the_checkpoints",
    "explorer.openai_api.episode_timeout": "tests/api/test_server.py::test_idle_episodes_expire_and_are_counted",
    "explorer.openai_api.enable_concatenated_multi_turn":
        "tests/api/test_server.py::test_tool_call_is_parsed_and_the_tool_result_turn_is_rendered",
    "trainer.save_interval": "tests/run/test_run_e2e.py::test_train_mode_saves_every_save_interval_and_prunes",
    "trainer.max_checkpoints_to_keep": "tests/run/test_run_e2e.py::test_train_mode_saves_every_save_interval_and_prunes",
    "trainer.save_hf_checkpoint": "tests/trainer/test_lora.py::test_a_resumed_lora_trainer_continues_exactly",
    "trainer.resume_mode": "tests/trainer/test_resume_mode.py::test_resume_mode_chooses_where_the_trainer_starts",
    "monitor.monitor_type": "tests/roles/test_monitor.py::test_wandb_takes_the_seed_monitor_args_and_logs_offline",
    "monitor.monitor_args": "tests/roles/test_monitor.py::test_wandb_takes_the_seed_monitor_args_and_logs_offline",
    # the trainer calls keep_trajectories with it after each step (tests/run/test_studio.py reads them)
    "monitor.trajectory_steps": "tests/storage/test_trajectories.py::test_monitor_trajectory_steps_keeps_the_newest_steps_whole",
    # the level's effect on the role's log; roles/cli.py passes log.level to setup_logging
    "log.level": "tests/roles/test_logs.py::test_level_filters",
    "nats.connect_wait": "tests/bus/test_connection.py::test_connect_waits_for_a_starting_server",
    # the buffer's tidy, once a minute
    "nats.stream_keep": "tests/bus/test_retention.py::test_the_buffer_tidies_by_its_settings",
    "buffer.trainer_input.experience_buffer.keep_used_groups":
        "tests/bus/test_retention.py::test_the_buffer_tidies_by_its_settings",
}


# --------------------------------------------------------------------------------------------
# the verdict
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Base:
    """A base configuration: as written, validated (before ``derive()``), what the loader
    warned about, what :func:`observe` saw."""

    name: str
    raw: dict[str, Any]
    pre: TrinityConfig
    warnings: list[str]
    observed: dict[str, Any]


@dataclasses.dataclass
class Verdict:
    """What became of one field: ``proven`` (observe() changed: ``detail`` names the probes),
    ``warned`` (the loader warned naming it), ``only`` (it has one valid value), ``refused``
    (any other value fails the load, naming the field), ``invalid`` (no base took the new
    value, for another reason: a missing :data:`OVERRIDES` entry) or ``silent``."""

    path: str
    kind: str
    detail: str


class World:
    """The files, the base configurations (loaded and observed once each, when first
    needed) and a scratch folder for the mutated ones."""

    def __init__(self, root: Path) -> None:
        self.files = build_files(root / "files")
        self.scratch = root / "scratch"
        self.scratch.mkdir()
        self._bases: dict[str, Base] = {}

    def base(self, name: str, sections_for: str = "") -> Base:
        """Base ``name``, with the sections above ``sections_for`` created empty where it
        has none (a mutated field is compared with this: creating the section may change
        things by itself). Observed twice: a difference there would prove every field."""
        if name not in self._bases:
            self._bases[name] = self._load(name, BASES[name](self.files))
        base = self._bases[name]
        if not sections_for or concrete(sections_for, base.raw) is None:
            return base
        parent = f"{name} with {sections_for.rsplit('.', 1)[0]}"
        if parent not in self._bases:
            self._bases[parent] = (base if has_sections(base.pre, sections_for) else
                                   self._load(parent, with_value(base.raw, sections_for, _NONE)))
        return self._bases[parent]

    def _load(self, name: str, raw: dict[str, Any]) -> Base:
        loaded = load(raw, self.scratch)
        first, second = observe(loaded.config), observe(loaded.config)
        assert first == second, f"{name}: observe() differs between two runs: " + ", ".join(
            k for k in first if first[k] != second.get(k))
        return Base(name, raw, TrinityConfig.model_validate(copy.deepcopy(raw)), loaded.warnings, first)

    def mutate(self, path: str, field: FieldInfo, base: Base) -> tuple[str, Any]:
        """Load ``base`` with ``path`` changed: ``("skip", why)`` when the base has no such
        list item or entry, ``("only", why)`` when the field has no other valid value,
        ``("invalid", error)``, or ``("loaded", LoadedConfig)``."""
        if concrete(path, base.raw) is None:
            return "skip", f"{base.name} has no {path}"
        current = current_value(base.pre, path)
        try:
            value = other_value(path, field, current, self.files)
        except OnlyValue as e:
            return "only", str(e)
        from schemas.loader import ConfigError

        try:
            return "loaded", load(with_value(base.raw, path, value), self.scratch)
        except ConfigError as e:
            return "invalid", f"{base.name}: {value!r}: {e}"

    def verdict(self, path: str, field: FieldInfo) -> Verdict:
        """Try ``path`` on each base in turn (:func:`bases_for`) until one shows an effect."""
        notes, warned, loaded_any = [], "", False
        for name in bases_for(path):
            base = self.base(name, path)
            kind, got = self.mutate(path, field, base)
            if kind == "only":
                return Verdict(path, "only", got)
            if kind != "loaded":
                notes.append(got)
                continue
            loaded_any = True
            where = concrete(path, base.raw)
            new = [w for w in got.warnings if w not in base.warnings and where in w]
            warned = warned or (new[0] if new else "")
            seen = observe(got.config)
            changed = sorted(k for k in seen.keys() | base.observed.keys() if seen.get(k) != base.observed.get(k))
            if changed:
                return Verdict(path, "proven", f"{base.name}: {', '.join(changed)}")
        if not loaded_any:
            refused = [n for n in notes if " has no " not in n]
            if field.annotation is bool and refused and all(path in n for n in refused):
                return Verdict(path, "refused", refused[0])
            return Verdict(path, "invalid", "no base took the new value: " + "; ".join(notes))
        if warned:
            return Verdict(path, "warned", warned)
        return Verdict(path, "silent", "; ".join(notes))


#: Where to try a field first (path prefix -> bases): only speed depends on it, a field not
#: proven there is tried on every other base.
FIRST_TRIED: dict[str, list[str]] = {
    "buffer.explorer_input.tasksets": ["mixed"],
    "buffer.trainer_input.experience_buffer.format.chosen_key": ["dpo"],
    "buffer.trainer_input.experience_buffer.format.rejected_key": ["dpo"],
    "buffer.trainer_input.experience_buffer.format.": ["sft", "sft_plain"],
    "buffer.trainer_input.experience_buffer.": ["grpo", "sft", "sft_plain"],
    "critic.": ["ppo"],
    "model.lora_configs": ["ppo"],
    "model.external_model.": ["serve"],
}


def bases_for(path: str) -> list[str]:
    """The bases to try ``path`` on, in order: :data:`FIRST_TRIED`'s, then the others."""
    first = next((v for k, v in sorted(FIRST_TRIED.items(), key=lambda kv: -len(kv[0])) if path.startswith(k)), [])
    # the mixed base has no ``taskset`` section, and creating one beside its tasksets is refused
    return first + [b for b in BASES if b not in first and b != "mixed"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    """The files and bases, shared by the tests of this module; afterwards the event loop and
    the loaded models go."""
    with pytest.MonkeyPatch.context() as mp:
        # where an external engine's server and key come from (model.external_model.*_env)
        for var, value in (("OPENAI_BASE_URL", "http://127.0.0.1:9/v1"), ("OPENAI_API_KEY", "key"),
                           ("OTHER_BASE_URL", "http://127.0.0.1:10/v1"), ("OTHER_API_KEY", "other-key")):
            mp.setenv(var, value)
        yield World(tmp_path_factory.mktemp("field_effects"))
    if _LOOP:
        loop = _LOOP.pop()
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
    _LOADED.clear()


def test_every_field_changes_what_the_roles_do(world: World) -> None:
    """Each accepted field is proven by :func:`observe`, exercised by a test named in
    :data:`RUNTIME_EFFECTS`, warned about by the loader when set, or declared in
    ``UNUSED_FIELDS``; the message lists every other field with what was tried."""
    paths = field_paths(TrinityConfig)
    assert len(paths) > 300, "the walk missed the nested sections"
    verdicts = [world.verdict(p, f) for p, f in paths if not declared_unused(p) and p not in RUNTIME_EFFECTS]
    silent = [f"{v.path}: {v.kind}: {v.detail}" for v in verdicts if v.kind not in ("proven", "warned", "only", "refused")]
    assert not silent, "fields accepted and ignored in silence:\n  " + "\n  ".join(silent)


def _test_source(ref: str) -> str | None:
    """The source of the test function ``file::name`` names (None: no such file or test)."""
    file, _, name = ref.partition("::")
    path = ROOT / file
    if not name.startswith("test_") or not path.is_file():
        return None
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            return ast.get_source_segment(text, node)
    return None


def test_runtime_effects_name_tests_that_exercise_the_field() -> None:
    """Each :data:`RUNTIME_EFFECTS` entry is a field (not one declared unused) and names an
    existing test function whose source mentions it (its dotted path or leaf name)."""
    paths = {p for p, _ in field_paths(TrinityConfig)}
    bad = []
    for path, ref in RUNTIME_EFFECTS.items():
        src = _test_source(ref)
        if path not in paths or declared_unused(path):
            bad.append(f"{path}: not a field, or declared unused")
        elif src is None:
            bad.append(f"{path}: no test {ref}")
        elif path not in src and path.rsplit(".", 1)[-1] not in src:
            bad.append(f"{path}: {ref} does not mention it")
    assert not bad, bad


def test_unused_fields_exist_warn_when_set_and_change_nothing(world: World) -> None:
    """Each ``UNUSED_FIELDS`` entry names a real field (or section). Set to another value in a
    configuration that has it, the loader warns naming it, and :func:`observe` sees no change:
    a field that changes something is used, and its warning would tell the user a lie."""
    fields = field_paths(TrinityConfig)
    unknown = [u for u in UNUSED_FIELDS if not any(p == u or p.startswith(u + ".") for p, _ in fields)]
    assert not unknown, unknown
    problems = []
    for path, field in fields:
        if not declared_unused(path):
            continue
        for name in bases_for(path):
            base = world.base(name, path)
            kind, got = world.mutate(path, field, base)
            if kind in ("loaded", "only"):
                break
        else:
            problems.append(f"{path}: no configuration takes another value")
            continue
        if kind == "only":  # nothing else can be set: nothing to warn about
            continue
        entry = max((u for u in UNUSED_FIELDS if path == u or path.startswith(u + ".")), key=len)
        where = concrete(entry, base.raw)  # the warning names the entry: the field or its section
        if not any(w.startswith(f"{where} is accepted but has no effect") for w in got.warnings):
            problems.append(f"{path}: set to another value, no warning names {where}")
        seen = observe(got.config)
        changed = sorted(k for k in seen.keys() | base.observed.keys() if seen.get(k) != base.observed.get(k))
        if changed:
            problems.append(f"{path}: declared unused, but changes {', '.join(changed)} ({base.name})")
    assert not problems, "\n  ".join(problems)


def test_setting_an_unused_field_warns_naming_it() -> None:
    cfg = TrinityConfig.model_validate({
        "model": {"trust_remote_code": True},
        "trainer": {"save_strategy": "single_node"},
        "buffer": {"explorer_input": {"eval_tasksets": [
            {"name": "t", "path": "/x", "format": {"chosen_key": "c", "image_key": "img"}}]},
            "trainer_input": {"auxiliary_buffers": {"sft": {"path": "/x", "capacity": 5}}}},
    })
    warned = dict(unused_settings(cfg))
    assert set(warned) == {
        "model.trust_remote_code", "trainer.save_strategy",
        "buffer.explorer_input.eval_tasksets[0].format.chosen_key",
        "buffer.explorer_input.eval_tasksets[0].format.image_key",
        "buffer.trainer_input.auxiliary_buffers.sft.capacity",
    }, warned
    assert unused_settings(TrinityConfig()) == []  # defaults ask for nothing
