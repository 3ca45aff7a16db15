"""Workflow names -> classes, and loading a user's workflow by module path or plugin dir.

A taskset names its workflow (``default_workflow_type``). The name is one of the built-ins
below, a ``module.path:ClassName`` / ``module.path.ClassName`` importable from ``sys.path``,
or a name registered by a file in ``TRINITY_PLUGIN_DIRS`` (``roles/runtime/plugins.py``: every entry
point imports them before it checks the config), with :func:`register_workflow`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from roles.explorer.workflows.base import Workflow
from roles.explorer.workflows.frozen_lake import FrozenLakeWorkflow
from roles.explorer.workflows.math import (
    MathBoxedWorkflow,
    MathEvalWorkflow,
    MathWorkflow,
    OnPolicyDistillMathWorkflow,
    OnPolicyDistillWorkflow,
    SimpleWorkflow,
)
from roles.explorer.workflows.rubric import RubricJudgeOpenAIWorkflow, RubricJudgeWorkflow
from roles.explorer.workflows.ruler import MathRULERWorkflow, MathTrainableRULERWorkflow
from roles.explorer.workflows.sciworld import SciWorldWorkflow
from roles.explorer.workflows.sudoku import SudokuWorkflow
from roles.explorer.workflows.tool_call import ToolCallWorkflow
from roles.runtime.plugins import load_plugin_dirs

__all__ = ["REFUSED", "WORKFLOWS", "get_workflow", "load_plugin_dirs", "reads_prompt", "register_workflow"]

#: Upstream's ``async_*`` twins are the same classes: every workflow here runs on the event loop.
WORKFLOWS: dict[str, type[Workflow]] = {
    "simple_workflow": SimpleWorkflow,
    "async_simple_workflow": SimpleWorkflow,
    "math_workflow": MathWorkflow,
    "async_math_workflow": MathWorkflow,
    "math_boxed_workflow": MathBoxedWorkflow,
    "async_math_boxed_workflow": MathBoxedWorkflow,
    # upstream's math_rm_workflow differs from simple_workflow only in calling its reward as
    # RM-Gallery's (response, messages, ground_truth); every reward here takes the same arguments
    "math_rm_workflow": SimpleWorkflow,
    "async_math_rm_workflow": SimpleWorkflow,
    "math_eval_workflow": MathEvalWorkflow,
    "async_math_eval_workflow": MathEvalWorkflow,
    "on_policy_distill_workflow": OnPolicyDistillWorkflow,
    "on_policy_distill_math_workflow": OnPolicyDistillMathWorkflow,
    "frozen_lake_workflow": FrozenLakeWorkflow,
    "sciworld_workflow": SciWorldWorkflow,
    "sudoku_workflow": SudokuWorkflow,
    "math_ruler_workflow": MathRULERWorkflow,
    "async_math_ruler_workflow": MathRULERWorkflow,
    "math_trainable_ruler_workflow": MathTrainableRULERWorkflow,
    "rubric_judge_workflow": RubricJudgeWorkflow,
    "rubric_judge_openai_workflow": RubricJudgeOpenAIWorkflow,
    "tool_call_workflow": ToolCallWorkflow,
    "toolcall_workflow": ToolCallWorkflow,  # what upstream's ToolACE examples write (its registry lacks it)
}


#: Trinity-RFT's workflows that are not here, and why: naming one is refused with this reason.
ALFWORLD = ("needs ALFWorld's game files: pip install alfworld && alfworld-download (it fetches them "
            "from GitHub; ALFWorld cannot generate them without the ALFRED dataset)")
AGENTSCOPE = ("runs an AgentScope agent (the agentscope 1.x package, not a dependency here); an agent on "
              "the OpenAI API trains through explorer.rollout_model.enable_openai_api (docs/agents.md)")
REFUSED: dict[str, str] = {
    "alfworld_workflow": ALFWORLD,
    "step_wise_alfworld_workflow": ALFWORLD,
    "RAFT_alfworld_workflow": ALFWORLD,
    "RAFT_reflect_alfworld_workflow": ALFWORLD,
    "agentscope_workflow_adapter_v1": AGENTSCOPE,
    "agentscope_react_workflow": AGENTSCOPE,
    "as_react_workflow": AGENTSCOPE,
    "agentscope_react_math_workflow": AGENTSCOPE,
    "agentscope_v1_react_search_workflow": AGENTSCOPE + "; and a web search API",
    "intercode_sql_workflow": "runs each episode's SQL in a Docker container (its image_name, "
                              "docker-env-sql) against InterCode's Spider databases: needs Docker",
    "email_search_workflow": "searches the Enron mailbox its prepare_data.py builds from the Hugging Face hub, "
                             "with an LLM judge: not built here",
    "agentscope_workflow_adapter": "needs the agentscope package (deprecated upstream too)",
    "agentscopev0_react_math_workflow": "needs agentscope 0.x (deprecated upstream too)",
    "simple_mm_workflow": "multi-modal data is not implemented",
    "async_simple_mm_workflow": "multi-modal data is not implemented",
    "webshop_workflow": "needs the WebShop environment (a Java search server and its setup.sh)",
    "thinking_budget_workflow": "vLLM's per-request thinking_token_budget (it forces the reasoning's end): "
                                "neither engine here has it yet",
}


def register_workflow(name: str) -> Callable[[type[Workflow]], type[Workflow]]:
    """Class decorator: make a workflow available under ``name``."""

    def deco(cls: type[Workflow]) -> type[Workflow]:
        WORKFLOWS[name] = cls
        return cls

    return deco


def get_workflow(name: str) -> type[Workflow]:
    """The workflow class for ``name``; a clear KeyError naming what was tried."""
    if name in WORKFLOWS:
        return WORKFLOWS[name]
    if ":" in name or "." in name:
        mod_name, _, cls_name = name.partition(":") if ":" in name else name.rpartition(".")
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError) as e:
            hint = ""
            if isinstance(e, ModuleNotFoundError) and e.name and mod_name.startswith(e.name):
                hint = (f" (a dotted path resolves from the working directory and installed packages: "
                        f"run where its {e.name.split('.')[0]}/ folder is, as Trinity-RFT's examples run "
                        f"from its repository's root; working directory: {os.getcwd()})")
            raise KeyError(f"workflow {name!r}: cannot import {cls_name} from {mod_name}: {e}{hint}") from e
        if isinstance(cls, type) and not issubclass(cls, Workflow) and hasattr(cls, "as_our_workflow"):
            cls = cls.as_our_workflow(name)  # a Trinity-RFT workflow class (the trinity package)
        if not (isinstance(cls, type) and issubclass(cls, Workflow)):
            raise KeyError(f"workflow {name!r}: {cls!r} is not a Workflow subclass")
        WORKFLOWS[name] = cls
        return cls
    if name in REFUSED:
        raise KeyError(f"workflow {name!r} (Trinity-RFT's) is not available here: {REFUSED[name]}")
    raise KeyError(f"unknown workflow {name!r}; known: {sorted(WORKFLOWS)} (or module.path:Class)")


def reads_prompt(name: str | None) -> bool:
    """Whether workflow ``name`` needs its task rows' prompt column (``Workflow.reads_prompt``);
    an unknown name or none says True (the config check names it)."""
    if not name:
        return True
    try:
        return get_workflow(name).reads_prompt
    except KeyError:
        return True
