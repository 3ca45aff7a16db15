"""``split_reward``: 1 for every response to a task whose answer is even (a group of equal
rewards, which ``drop_equal_reward_groups`` drops), the response length's parity otherwise (a
group with signal, most of the time): steps that lose about half their groups, for the test
of dynamic sampling's fill."""

from ops.registry import register


@register("reward_fn", "split_reward")
def split_reward(response: str, truth: object = None, *, prompt: str | None = None) -> dict[str, float]:
    even = str(truth).strip().lstrip("-").isdigit() and int(str(truth).strip()) % 2 == 0
    return {"accuracy": 1.0 if even else float(len(response) % 2)}
