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

__all__ = ["WORKFLOWS", "AsyncMathBoxedWorkflow", "AsyncMathWorkflow", "AsyncSimpleWorkflow", "BaseSimpleWorkflow",
           "MathBoxedWorkflow", "MathWorkflow", "SimpleWorkflow", "Task", "UpstreamWorkflow", "Workflow"]
