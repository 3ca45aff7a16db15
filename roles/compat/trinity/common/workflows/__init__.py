"""Trinity-RFT's workflow registry: ``@WORKFLOWS.register_module("name")`` on a
:class:`Workflow` subclass makes ``name`` a ``default_workflow_type`` here (our workflow map,
``roles.explorer.workflows.registry``). One of our own workflow classes registers as itself.

``SimpleWorkflow``, ``MathWorkflow``, ``MathBoxedWorkflow`` (and ``Async*``) are upstream's
classes to subclass; the config names (``math_workflow``...) run our own workflows."""

from __future__ import annotations

from roles.explorer.workflows.base import Workflow as OurWorkflow
from roles.explorer.workflows.registry import WORKFLOWS as OURS
from trinity.common.workflows.customized_math_workflows import (
    AsyncMathBoxedWorkflow,
    MathBoxedWorkflow,
)
from trinity.common.workflows.workflow import (
    AsyncMathWorkflow,
    AsyncSimpleWorkflow,
    BaseSimpleWorkflow,
    MathWorkflow,
    SimpleWorkflow,
    Task,
    UpstreamWorkflow,
    Workflow,
)
from trinity.utils.registry import Registry


def _install(name: str, cls: type, force: bool) -> None:
    OURS[name] = cls if issubclass(cls, OurWorkflow) else cls.as_our_workflow(name)


def _check(cls: type) -> str | None:
    if isinstance(cls, type) and issubclass(cls, (Workflow, OurWorkflow)):
        return None
    return "is not a Workflow subclass (trinity.common.workflows.Workflow)"


WORKFLOWS = Registry("workflows", _install, lambda: OURS, _check)

#: upstream's other built-in workflow classes, by the name a config gives each
_BY_NAME = {
    "MathEvalWorkflow": "math_eval_workflow", "AsyncMathEvalWorkflow": "async_math_eval_workflow",
    "MathRMWorkflow": "math_rm_workflow", "AsyncMathRMWorkflow": "async_math_rm_workflow",
    "ToolCallWorkflow": "tool_call_workflow", "MathRULERWorkflow": "math_ruler_workflow",
    "AsyncMathRULERWorkflow": "async_math_ruler_workflow", "MathTrainableRULERWorkflow": "math_trainable_ruler_workflow",
    "RubricJudgeWorkflow": "rubric_judge_workflow", "RubricJudgeWorkflowWithAPI": "rubric_judge_openai_workflow",
    "OnPolicyDistillWorkflow": "on_policy_distill_workflow", "OnPolicyDistillMathWorkflow": "on_policy_distill_math_workflow",
    "FrozenLakeWorkflow": "frozen_lake_workflow", "SciWorldWorkflow": "sciworld_workflow", "SudokuWorkflow": "sudoku_workflow",
    "MultiTurnWorkflow": None,
}


def __getattr__(name: str) -> object:
    if name in _BY_NAME:
        use = _BY_NAME[name]
        how = f"name it in a config as {use!r} (this project's own class runs it)" if use else \
            "write the conversation in run() and return one Experience per episode"
        raise ImportError(f"trinity.common.workflows.{name}: upstream's class is not here to subclass; {how}, "
                          "or subclass SimpleWorkflow, MathWorkflow or MathBoxedWorkflow (docs/plugins.md)")
    raise AttributeError(f"module 'trinity.common.workflows' has no attribute {name!r}")

__all__ = ["WORKFLOWS", "AsyncMathBoxedWorkflow", "AsyncMathWorkflow", "AsyncSimpleWorkflow", "BaseSimpleWorkflow",
           "MathBoxedWorkflow", "MathWorkflow", "SimpleWorkflow", "Task", "UpstreamWorkflow", "Workflow"]
