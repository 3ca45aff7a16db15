"""A reward class registered as Trinity-RFT's reward guide does: ``RewardFn``, built with the
taskset's ``reward_fn_args``, called with ``response`` and ``truth``, returning named scores."""

from trinity.common.rewards import REWARD_FUNCTIONS, RewardFn


@REWARD_FUNCTIONS.register_module("digit_match_reward")
class DigitMatchReward(RewardFn):
    """1 when the response's digits are the answer's, ``partial`` when it has any digit."""

    def __init__(self, partial: float = 0.0, **kwargs):
        self.partial = partial

    def __call__(self, response: str, truth: str = None, **kwargs) -> dict:
        digits = "".join(c for c in response if c.isdigit())
        if digits and digits == str(truth).strip():
            return {"digit_match": 1.0}
        return {"digit_match": self.partial if digits else 0.0}
