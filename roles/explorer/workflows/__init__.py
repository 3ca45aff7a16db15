"""Workflows: what turns a task into experiences (see :mod:`.base` for the interface)."""

from roles.explorer.workflows.base import ModelHandle, Workflow
from roles.explorer.workflows.multi_turn import MultiTurnWorkflow, StepWiseWorkflow
from roles.explorer.workflows.registry import WORKFLOWS, get_workflow, register_workflow

__all__ = ["WORKFLOWS", "ModelHandle", "MultiTurnWorkflow", "StepWiseWorkflow", "Workflow",
           "get_workflow", "register_workflow"]
