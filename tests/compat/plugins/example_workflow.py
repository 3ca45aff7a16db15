# ruff: noqa: UP006, UP035, RUF100 - the guide's code as it is written there
"""A workflow plugin written exactly as Trinity-RFT's workflow guide shows it ("Full Code
Example", docs/sphinx_doc/source/tutorial/develop_workflow.md), registered with
``@WORKFLOWS.register_module`` as its newer guide does, its reward computed by the reward
class the taskset names (``task.reward_fn``, as upstream's own workflows do)."""

from typing import List

from trinity.common.experience import Experience
from trinity.common.models.model import ModelWrapper
from trinity.common.workflows import WORKFLOWS, Task, Workflow


@WORKFLOWS.register_module("example_workflow")
class ExampleWorkflow(Workflow):
    can_reset: bool = True
    can_repeat: bool = True

    def __init__(self, task: Task, model: ModelWrapper, auxiliary_models: List):
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.question = task.raw_task.get("question")
        self.answer = task.raw_task.get("answer")
        self.rollout_args = task.rollout_args
        self.reward_fn = task.reward_fn(**task.reward_fn_args)

    def calculate_reward(self, response: str, truth: str) -> float:
        return sum(self.reward_fn(response=response, truth=truth).values())

    def run(self) -> List[Experience]:
        # call the model to generate multiple responses
        responses = self.model.chat(
            [
                {
                    "role": "user",
                    "content": f"Question:\n{self.question}",
                }
            ],
            n=self.rollout_args.n,
            temperature=self.rollout_args.temperature,
        )
        experiences = []
        for response in responses:
            # calulcate reward
            reward: float = self.calculate_reward(response.response_text, self.answer)
            # construct Experience
            experiences.append(
                Experience(
                    tokens=response.tokens,
                    prompt_length=response.prompt_length,
                    reward=reward,
                    logprobs=response.logprobs,
                )
            )
        return experiences

    def reset(self, task: Task):
        self.question = task.raw_task.get("question")
        self.answer = task.raw_task.get("answer")

    def set_repeat_times(self, repeat_times, run_id_base):
        self.repeat_times = repeat_times
        self.run_id_base = run_id_base
