"""A workflow written only against the OpenAI client, as an agent developer writes one:
``self.model.get_openai_client()`` for the model, ``extract_experience_from_history()`` for
what it did. Registered as ``openai_agent`` (load with ``--plugin-dir`` or
``TRINITY_PLUGIN_DIRS``)."""

from roles.explorer.workflows.base import Workflow
from roles.explorer.workflows.registry import register_workflow


@register_workflow("openai_agent")
class OpenAIAgent(Workflow):
    repeatable = False  # one conversation per rollout

    def run(self):
        client = self.model.get_openai_client()
        model = client.models.list().data[0].id
        question = self.task.raw["question"]
        r = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}],
            seed=self.args.get("seed"), max_tokens=8)  # the taskset's rollout_args apply too
        answer = (r.choices[0].message.content or "").strip()
        reward = float(answer == str(self.task.raw["answer"]).strip())
        exps = self.model.extract_experience_from_history()
        for e in exps:
            e.reward = reward
        return exps
