"""``math_workflow`` that takes 0.3 s longer per task (registered as ``slow_math_workflow``;
``workflow_args: {delay: s}`` for another delay): rollout-bound steps for the tests where
several explorers share a run, so that explorers started a few seconds in still find most of
the taskset ahead of them, and for a kill that must land inside a step."""

import asyncio

from roles.explorer.workflows.math import MathWorkflow
from roles.explorer.workflows.registry import register_workflow


@register_workflow("slow_math_workflow")
class SlowMath(MathWorkflow):
    async def run_async(self):
        await asyncio.sleep(float(self.task.workflow_args.get("delay", 0.3)))
        return await super().run_async()
