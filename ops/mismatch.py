"""How far the rollout engine's log-probs are from the trainer's, for the same tokens under the
same weights.

Why: GRPO and PPO take the engine's log-probs as the "old" policy's by default
(``algorithm.bypass_old_logprobs``), so the importance ratio ``exp(new - old)`` divides the
trainer's numbers by the engine's. The two compute the same function with different kernels,
and often in another dtype (vLLM in bfloat16 against a float32 or bfloat16 trainer): where they
disagree, the ratio is off 1 before any update, clipping fires on tokens the policy never moved,
and the gradient is biased. The trainer measures the gap on the rows whose weights it still
holds (``Experience.model_version`` equal to its own) and reports it each step.

The figures, over the response tokens measured (``d = engine - trainer`` per token):

* ``rollout/logprob_diff_mean``: the mean of ``|d|``;
* ``rollout/kl``: the mean of ``exp(-d) - 1 + d``, the unbiased non-negative ("k3") estimate of
  KL(engine || trainer) from tokens the engine sampled (Schulman, "Approximating KL
  Divergence", 2020);
* ``rollout/logprob_diff_tokens``: how many tokens that is (0: no row was on the trainer's
  weights, e.g. ``synchronizer.sync_offset`` above 0 with one update per step).
"""

from __future__ import annotations

import torch

SUM_ABS, SUM_KL, TOKENS = "rollout/logprob_diff_sum", "rollout/kl_sum", "rollout/logprob_diff_tokens"


def mismatch_sums(trainer_lp: torch.Tensor, engine_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Sums over the tokens in ``mask`` (B x T bool) of ``|d|`` and ``exp(-d) - 1 + d``, and
    their count: sums so that micro-batches and ranks add up (:func:`mismatch_metrics` divides)."""
    m = mask.bool()
    d = (engine_lp.detach().double() - trainer_lp.detach().double())[m]
    return {SUM_ABS: float(d.abs().sum()), SUM_KL: float((torch.exp(-d) - 1 + d).sum()), TOKENS: float(d.numel())}


def mismatch_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The reported figures from summed :func:`mismatch_sums` (none when nothing was measured)."""
    n = sums.get(TOKENS, 0.0)
    if not n:
        return {TOKENS: 0.0} if TOKENS in sums else {}
    return {"rollout/logprob_diff_mean": sums[SUM_ABS] / n, "rollout/kl": sums[SUM_KL] / n, TOKENS: n}
