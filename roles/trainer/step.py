"""One training step: micro-batches, log-probs, the configured loss from ``ops``, one update.

Why the micro-batch weights: the loss of the whole batch is a token mean (or sequence mean);
a micro-batch's own mean, weighted by its share of the batch's tokens (or sequences), sums to
exactly that, so the update does not depend on how the batch was split.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import torch

import ops
from ops.algorithms import AlgorithmSpec
from ops.kl import kl_loss, kl_penalty
from ops.logits import entropy_from_logits, logprobs_from_logits
from schemas.data import Experience

from .batch import Batch, collate, micro_batches, per_micro_batch


def token_logprobs(engine_or_model: Any, mb: Batch, temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of each response token of ``mb`` (B x T)."""
    if hasattr(engine_or_model, "forward_logits"):
        logits = engine_or_model.forward_logits(mb.input_ids, mb.attention_mask)
    else:
        dev = next(engine_or_model.parameters()).device
        logits = engine_or_model(input_ids=mb.input_ids.to(dev), attention_mask=mb.attention_mask.to(dev)).logits
    logits = logits[:, :-1]
    idx = mb.resp_index.to(logits.device)
    lp_full = logprobs_from_logits(logits, mb.input_ids[:, 1:].to(logits.device), temperature)
    lp = lp_full.gather(1, idx).float().cpu() if logits.device.type != "cpu" else lp_full.gather(1, idx).float()
    ent = None
    if with_entropy:
        ent = entropy_from_logits(logits, temperature).gather(1, idx).float()
        ent = ent.to(lp.device)
    return lp, ent


class StepRunner:
    """Computes one step's loss with the algorithm's parts and applies it to an engine."""

    def __init__(self, engine: Any, spec: AlgorithmSpec, *, ref_model: Any = None, critic: Any = None,
                 critic_warmup: int = 0, temperature: float = 1.0, use_dynamic_bsz: bool = True,
                 max_token_len: int | None = None, micro_batch_size: int = 4, pad_token_id: int = 0) -> None:
        if spec.use_critic and critic is None:
            raise ValueError(f"algorithm {spec.algorithm_type!r} (advantage_fn {spec.advantage_fn!r}) needs a critic")
        if spec.use_reference and ref_model is None:
            raise ValueError(f"algorithm {spec.algorithm_type!r} needs a reference model")
        self.engine = engine
        self.spec = spec
        self.ref = ref_model
        self.critic = critic
        self.critic_warmup = critic_warmup
        self.temperature = temperature
        self.use_dynamic_bsz = use_dynamic_bsz
        self.max_token_len = max_token_len
        self.micro_batch_size = micro_batch_size
        self.pad = pad_token_id
        self.policy_fn = ops.get("policy_loss_fn", spec.policy_loss_fn)
        self.entropy_fn = ops.get("entropy_loss_fn", spec.entropy_loss_fn)
        # entropy is always measured (a per-step metric); it is a loss only with entropy_loss_fn
        self.with_entropy = True
        # The KL-in-reward coefficient changes step to step when adaptive; checkpoints keep it.
        self.kl_coef = float(spec.kl_penalty_fn_args.get("kl_coef", 0.001))

    @torch.no_grad()
    def _batch_logprobs(self, model: Any, batch: Batch, mbs: list[list[int]]) -> torch.Tensor:
        return per_micro_batch(batch, mbs, lambda mb: token_logprobs(model, mb, self.temperature, False)[0])

    def _advantages_in_trainer(self, batch: Batch, mbs: list[list[int]],
                               ref_all: torch.Tensor | None) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Advantages that need the whole batch, the critic or the reference model: values
        (critic), the KL penalty in the reward (reference vs the sampler's log-probs), then
        the advantage function. Returns the values (the critic's old predictions) and metrics."""
        spec = self.spec
        if not (spec.advantage_fn and spec.compute_advantage_in_trainer):
            return None, {}
        metrics: dict[str, float] = {}
        values = self.critic.values(batch, mbs) if self.critic is not None else None
        rewards = batch.rewards
        if spec.kl_penalty_fn != "none":
            old = batch.old_logprob
            if not bool(batch.has_old.all()):
                old = torch.where(batch.has_old.unsqueeze(-1), old, self._batch_logprobs(self.engine, batch, mbs))
            args = {**spec.kl_penalty_fn_args, "kl_coef": self.kl_coef}
            rewards, km = kl_penalty(rewards, old, ref_all, batch.action_mask, kl_fn=spec.kl_penalty_fn, **args)
            self.kl_coef = km.get("next_kl_coef", self.kl_coef)
            metrics.update({f"kl_penalty/{k}": v for k, v in km.items()})
        res = ops.get("advantage_fn", spec.advantage_fn)(
            action_mask=batch.action_mask, rewards=rewards, group_ids=batch.group_ids, values=values,
            old_logprob=batch.old_logprob, **spec.advantage_fn_args)
        batch.advantages = res.advantages.float()
        batch.returns = res.returns.float()
        metrics.update({f"advantage/{k}": v for k, v in res.metrics.items()})
        return values, metrics

    def run(self, exps: list[Experience], step: int) -> dict[str, float]:
        """Train on ``exps`` as step ``step``; returns the step's metrics."""
        t0 = time.perf_counter()
        batch = collate(exps, self.pad)
        lengths = batch.attention_mask.sum(-1).tolist()
        mbs = micro_batches(lengths, use_dynamic_bsz=self.use_dynamic_bsz, max_token_len=self.max_token_len,
                            micro_batch_size=self.micro_batch_size, pair=self.spec.policy_loss_fn == "dpo")
        # the reference model's log-probs, once for the step: the KL penalty in the reward and
        # the policy loop (KL loss, DPO) both use them; critic-warmup steps need them only for
        # the penalty
        needs_ref = self.spec.kl_penalty_fn != "none" or step > self.critic_warmup
        ref_all = self._batch_logprobs(self.ref, batch, mbs) if self.ref is not None and needs_ref else None
        old_values, extra = self._advantages_in_trainer(batch, mbs, ref_all)
        if self.critic is not None and old_values is not None:
            extra.update(self.critic.update(batch, mbs, old_values))
        if step <= self.critic_warmup:  # PPO: the critic learns first, the actor waits
            return {**extra, "critic_warmup": 1.0, "step_time_s": time.perf_counter() - t0}
        token_total = max(int(batch.action_mask.sum()), 1)
        seq_mode = self.spec.loss_agg_mode != "token-mean" or self.spec.policy_loss_fn == "dpo"
        sums: dict[str, float] = defaultdict(float)
        for i, rows in enumerate(mbs):
            mb = batch.select(rows)
            w = len(rows) / batch.size if seq_mode else int(mb.action_mask.sum()) / token_total
            ref_lp = None if ref_all is None else ref_all[torch.as_tensor(rows)]
            lp, ent = token_logprobs(self.engine, mb, self.temperature, self.with_entropy)
            old = torch.where(mb.has_old.unsqueeze(-1), mb.old_logprob, lp.detach())
            mask = mb.action_mask
            loss, m = self.policy_fn(lp, old, mb.advantages, mask, ref_logprob=ref_lp,
                                     expert_mask=mb.expert_mask, global_step=step, **self.spec.policy_loss_fn_args)
            if ref_lp is not None and self.spec.kl_loss_fn != "none" and self.spec.policy_loss_fn != "dpo":
                kl, km = kl_loss(lp, ref_lp, mask, kl_fn=self.spec.kl_loss_fn, **self.spec.kl_loss_fn_args)
                loss = loss + kl
                m.update(km)
            if ent is not None and self.spec.entropy_loss_fn != "none":
                el, em = self.entropy_fn(ent, mask, expert_mask=mb.expert_mask, **self.spec.entropy_loss_fn_args)
                loss = loss + el
                m.update(em)
            elif ent is not None:
                m["entropy"] = float((ent * mask).sum() / mask.sum().clamp(min=1))
            if i < len(mbs) - 1 and hasattr(self.engine, "engine"):  # DeepSpeed: accumulate
                self.engine.backward(loss * w, last=False)
            else:
                self.engine.backward(loss * w)
            m["loss"] = float(loss.detach())
            for k, v in m.items():
                sums[k] += w * float(v)
        grad_norm = self.engine.step()
        dt = time.perf_counter() - t0
        out = {**sums, **extra}
        out.update({
            "grad_norm": grad_norm, "lr": self.engine.lr, "batch_size": float(len(exps)),
            "micro_batches": float(len(mbs)), "tokens": float(batch.num_tokens),
            "tokens_per_s": batch.num_tokens / max(dt, 1e-9), "step_time_s": dt,
            "reward_mean": float(batch.rewards.mean()),
        })
        versions = [e.model_version for e in exps if e.chosen is None and not e.info.get("is_expert")]
        if versions:
            out["staleness_mean"] = float(step - 1 - sum(versions) / len(versions))
            out["staleness_max"] = float(step - 1 - min(versions))
        return out
