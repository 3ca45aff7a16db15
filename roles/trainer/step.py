"""One training step: micro-batches, log-probs, the configured loss from ``ops``, one update.

Why the micro-batch weights: the loss of the whole batch is a token mean (or sequence mean);
a micro-batch's own mean, weighted by its share of the batch's tokens (or sequences), sums to
exactly that, so the update does not depend on how the batch was split.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import numpy as np
import torch

import ops
from ops.advantages import ENTROPY_ADVANTAGE_FNS
from ops.algorithms import AlgorithmSpec, hyperparameters
from ops.entropy import ENTROPY_DATA
from ops.kl import kl_loss, kl_penalty
from ops.logits import entropy_from_logits, logprobs_from_logits
from ops.mismatch import SUM_ABS, SUM_KL, mismatch_metrics, mismatch_sums
from ops.policy_losses import M2_THRESHOLD, MINI_BATCH_MASKED, PART_WEIGHTED, m2po_token_mask
from schemas.data import Experience

from .batch import Batch, collate, micro_batches, padding_fraction, per_micro_batch
from .engine import TorchEngine, TrainEngine
from .prefix import shared_prompt_logits, shared_prompts
from .ranks import shard_rows


def token_logprobs(engine_or_model: Any, mb: Batch, temperature: float, with_entropy: bool,
                   entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of each response token of ``mb`` (B x T); the entropy without
    a gradient unless ``entropy_grad`` (it is then only a metric).

    Rows that share a prompt (a GRPO group) run it once (:mod:`.prefix`); otherwise one
    forward, with the vocabulary projection only from the first response position on."""
    model = hf_model(engine_or_model)
    shared = shared_prompts(mb, model) if model is not None else None
    if shared is not None:
        logits, targets = shared_prompt_logits(model, mb, *shared)
        lp, ent = _scores(logits, targets.to(logits.device), temperature, with_entropy, entropy_grad)
        pad = (0, mb.resp_index.shape[1] - lp.shape[1])  # to the batch's response width
        return torch.nn.functional.pad(lp, pad), None if ent is None else torch.nn.functional.pad(ent, pad)
    idx = mb.resp_index
    if model is not None:  # the logits before the earliest response are never read
        start = int(idx[:, 0].min())
        dev = next(model.parameters()).device
        logits = model(input_ids=mb.input_ids.to(dev), attention_mask=mb.attention_mask.to(dev),
                       logits_to_keep=mb.input_ids.shape[1] - start).logits
        idx = (idx - start).clamp(min=0)  # columns past a row's end hold 0: any valid index
    else:
        logits = engine_or_model.forward_logits(mb.input_ids, mb.attention_mask)
    logits = logits[:, :-1]
    targets = mb.input_ids[:, 1:].to(logits.device)[:, -logits.shape[1]:]
    # scores at every kept position, then the response columns: no B x T x V copy of the logits
    lp, ent = _scores(logits, targets, temperature, with_entropy, entropy_grad)
    idx = idx.to(lp.device)
    return lp.gather(1, idx), None if ent is None else ent.gather(1, idx)


def hf_model(engine_or_model: Any) -> Any:
    """The Hugging Face model to call directly: the single-process engine's, or a model given
    as is (the reference model); None for an engine whose forward is its own (DeepSpeed)."""
    if isinstance(engine_or_model, TorchEngine):
        return engine_or_model.model
    return None if hasattr(engine_or_model, "forward_logits") else engine_or_model


def _scores(logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool,
            entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (float32, on the CPU) of ``targets`` under ``logits`` (B x R x V), and the
    entropy there when ``with_entropy``."""
    lp = logprobs_from_logits(logits, targets, temperature).float().cpu()
    ent = None
    if with_entropy:
        ent = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature).float().to(lp.device)
    return lp, ent


#: the raw sums :func:`ops.mismatch.mismatch_metrics` turns into the step's figures
MISMATCH_SUMS = (SUM_ABS, SUM_KL)


class StepRunner:
    """Computes one step's loss with the algorithm's parts and applies it to an engine."""

    def __init__(self, engine: TrainEngine, spec: AlgorithmSpec, *, ref_model: Any = None, critic: Any = None,
                 critic_warmup: int = 0, temperature: float = 1.0, use_dynamic_bsz: bool = True,
                 max_token_len: int | None = None, micro_batch_size: int = 4, pad_token_id: int = 0,
                 balance_batch: bool = True, ppo_epochs: int = 1, mini_batch_rows: int | None = None,
                 shuffle: bool = False, bypass_old_logprobs: bool = True) -> None:
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
        self.balance_batch = balance_batch
        self.ppo_epochs = ppo_epochs
        self.mini_batch_rows = mini_batch_rows  # None: the whole batch
        self.shuffle = shuffle
        self.bypass_old_logprobs = bypass_old_logprobs  # the rollout engine's log-probs are "old"
        self.policy_fn = ops.get("policy_loss_fn", spec.policy_loss_fn)
        self.entropy_fn = ops.get("entropy_loss_fn", spec.entropy_loss_fn)
        # entropy is always measured (a per-step metric); it is a loss term only with an
        # entropy_loss_fn whose coefficient is not 0 (GRPO's default is 0: then backward does
        # not go through it, a third of a tiny model's step)
        self.with_entropy = True
        entropy_args = {**hyperparameters(self.entropy_fn, ENTROPY_DATA), **spec.entropy_loss_fn_args}
        self.entropy_grad = spec.entropy_loss_fn != "none" and entropy_args.get("entropy_coef", 1.0) != 0
        # The KL-in-reward coefficient changes step to step when adaptive; checkpoints keep it.
        self.kl_coef = float(spec.kl_penalty_fn_args.get("kl_coef", 0.001))

    def _scores(self, model: Any, mb: Batch, with_entropy: bool,
                entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:func:`token_logprobs` in the dtype the trainer computes in (``engine.autocast``):
        the policy's and the reference model's, old and new, all in one."""
        with self.engine.autocast():
            return token_logprobs(model, mb, self.temperature, with_entropy, entropy_grad)

    @torch.no_grad()
    def _batch_logprobs(self, model: Any, batch: Batch, mbs: list[list[int]], dp: Any = None,
                        fillers: int = 0) -> torch.Tensor:
        """``model``'s log-probs of the rows in ``mbs`` (B x T, zeros elsewhere); with several
        ranks each computes its rows and the sum is every row. ``fillers``: forwards whose
        result is dropped, for a model whose forward is collective (ZeRO-3) on a rank with
        fewer micro-batches than the others."""
        def fn(mb: Batch) -> torch.Tensor:
            return self._scores(model, mb, False)[0]

        out = per_micro_batch(batch, mbs, fn)
        for _ in range(fillers):
            fn(batch.select(self._filler(batch, mbs)))
        return out if dp is None else dp.sum_tensor(out)

    def _batch_scores(self, batch: Batch, mbs: list[list[int]], dp: Any = None,
                      fillers: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """The policy's log-probs and entropies (B x T) of the rows in ``mbs``, one forward per
        micro-batch, without gradients (as :meth:`_batch_logprobs`)."""
        lp_all, ent_all = torch.zeros_like(batch.old_logprob), torch.zeros_like(batch.old_logprob)
        with torch.no_grad():
            for rows in mbs:
                lp, ent = self._scores(self.engine, batch.select(rows), True, False)
                idx = torch.as_tensor(list(rows))
                lp_all[idx], ent_all[idx] = lp.float(), ent.float()
            for _ in range(fillers):
                self._scores(self.engine, batch.select(self._filler(batch, mbs)), True, False)
        return (lp_all, ent_all) if dp is None else (dp.sum_tensor(lp_all), dp.sum_tensor(ent_all))

    def _m2po_mask(self, batch: Batch, rows: list[int], mbs: list[list[int]], dp: Any,
                   fillers: int) -> tuple[torch.Tensor, dict[str, float]]:
        """M2PO's token mask over the whole mini-batch ``rows`` (B x T, every rank the same),
        from the policy's log-probs now, before this update: one more forward of its rows."""
        now = self._batch_logprobs(self.engine, batch, mbs, dp, fillers)
        old = torch.where(batch.has_old.unsqueeze(-1), batch.old_logprob, now)
        idx = torch.as_tensor(rows)
        threshold = float(self.spec.policy_loss_fn_args.get("m2_threshold", M2_THRESHOLD))
        part, metrics = m2po_token_mask((now - old)[idx], batch.action_mask[idx], batch.advantages[idx], threshold)
        mask = torch.zeros_like(batch.action_mask, dtype=torch.bool)
        mask[idx] = part
        return mask, metrics

    def _filler(self, batch: Batch, mbs: list[list[int]]) -> list[int]:
        """Rows to run a weightless micro-batch on (any will do: its loss is multiplied by 0)."""
        return mbs[0] if mbs else ([0, 1] if self.spec.policy_loss_fn == "dpo" else [0])

    def _advantages_in_trainer(self, batch: Batch, mbs: list[list[int]], ref_all: torch.Tensor | None,
                               dp: Any = None, fillers: int = 0) -> tuple[torch.Tensor | None, dict[str, float]]:
        """Advantages that need the whole batch, the critic or the reference model: values
        (critic), the KL penalty in the reward (reference vs the sampler's log-probs), then
        the advantage function. Returns the values (the critic's old predictions) and metrics.
        With several ranks each has the whole batch's inputs by now, so each computes the
        same advantages (and adaptive KL coefficient) as one process would."""
        spec = self.spec
        if not (spec.advantage_fn and spec.compute_advantage_in_trainer):
            return None, {}
        metrics: dict[str, float] = {}
        values = self.critic.values(batch, mbs) if self.critic is not None else None
        rewards = batch.rewards
        if spec.kl_penalty_fn != "none":
            old = batch.old_logprob
            if not bool(batch.has_old.all()):  # the whole batch: every rank decides the same
                old = torch.where(batch.has_old.unsqueeze(-1), old,
                                  self._batch_logprobs(self.engine, batch, mbs, dp, fillers))
            args = {**spec.kl_penalty_fn_args, "kl_coef": self.kl_coef}
            rewards, km = kl_penalty(rewards, old, ref_all, batch.action_mask, kl_fn=spec.kl_penalty_fn, **args)
            self.kl_coef = km.get("next_kl_coef", self.kl_coef)
            metrics.update({f"kl_penalty/{k}": v for k, v in km.items()})
        data: dict[str, torch.Tensor] = {"old_logprob": batch.old_logprob}
        if spec.advantage_fn in ENTROPY_ADVANTAGE_FNS:  # the current policy's, one more forward
            data["old_logprob"], data["entropy"] = self._batch_scores(batch, mbs, dp, fillers)
        res = ops.get("advantage_fn", spec.advantage_fn)(
            action_mask=batch.action_mask, rewards=rewards, group_ids=batch.group_ids, values=values,
            **data, **spec.advantage_fn_args)
        batch.advantages = res.advantages.float()
        batch.returns = res.returns.float()
        if res.action_mask is not None:  # the function dropped tokens from the loss (CLIP-B)
            batch.action_mask = res.action_mask.to(batch.action_mask.dtype)
        metrics.update({f"advantage/{k}": v for k, v in res.metrics.items()})
        return values, metrics

    def _split(self, rows: list[int], lengths: list[int], dp: Any,
               groups: list[str] | None = None) -> tuple[list[list[int]], int]:
        """This rank's share of ``rows`` (all of them in one process) as micro-batches, and how
        many weightless ones it adds so every rank runs as many (ZeRO's collectives run inside
        each forward/backward)."""
        pair = self.spec.policy_loss_fn == "dpo"
        if dp is not None:
            mine = shard_rows([lengths[r] for r in rows], dp.rank, dp.world, pair, self.balance_batch)
            rows = [rows[i] for i in mine]
        local = micro_batches([lengths[r] for r in rows], use_dynamic_bsz=self.use_dynamic_bsz,
                              max_token_len=self.max_token_len, micro_batch_size=self.micro_batch_size, pair=pair,
                              groups=None if groups is None else [groups[r] for r in rows])
        mbs = [[rows[i] for i in mb] for mb in local]
        return mbs, (0 if dp is None else dp.max(len(mbs)) - len(mbs))

    def mini_batches(self, n_rows: int, step: int) -> list[list[int]]:
        """The row sets of this step's optimizer updates, in order: ``ppo_epochs`` passes, each
        split into mini-batches of ``mini_batch_rows`` rows (whole DPO pairs; the last may be
        smaller), shuffled per pass with ``shuffle`` (seeded by step and pass: a resumed run
        makes the same updates). Pure, so it is unit-tested on sizes alone."""
        unit = 2 if self.spec.policy_loss_fn == "dpo" else 1
        units = [list(range(i, min(i + unit, n_rows))) for i in range(0, n_rows, unit)]
        per = max((self.mini_batch_rows or n_rows) // unit, 1)
        out = []
        for epoch in range(self.ppo_epochs):
            order = list(range(len(units)))
            if self.shuffle:
                g = torch.Generator().manual_seed(step * 1_000_003 + epoch)
                order = torch.randperm(len(units), generator=g).tolist()
            for i in range(0, len(order), per):
                out.append(sorted(r for u in order[i:i + per] for r in units[u]))
        return out

    def run(self, exps: list[Experience], step: int, dp: Any = None) -> dict[str, float]:
        """Train on ``exps`` as step ``step``; returns the step's metrics.

        The step makes one optimizer update per mini-batch of :meth:`mini_batches` (one for the
        whole batch by default); with several, the "old" log-probs every update's ratio
        starts from are fixed before the first (the rollout engine's, else the model's now),
        and the metrics are the updates' mean.

        With several processes (``dp``, a :class:`~roles.trainer.ranks.DataParallel`) every
        rank calls this with the whole batch and trains on its share of each mini-batch's
        rows. Each micro-batch is weighted by its share of the mini-batch's tokens (or
        sequences) times the number of ranks, since DeepSpeed averages the ranks' gradients:
        the update is the one a single process would make, and so are the metrics."""
        t0 = time.perf_counter()
        batch = collate(exps, self.pad)
        lengths = batch.attention_mask.sum(-1).tolist()
        everything = list(range(batch.size))
        mbs, fillers = self._split(everything, lengths, dp, batch.group_ids)
        # the reference model's log-probs, once for the step: the KL penalty in the reward and
        # the policy loop (KL loss, DPO) both use them; critic-warmup steps need them only for
        # the penalty
        needs_ref = self.spec.kl_penalty_fn != "none" or step > self.critic_warmup
        ref_all = self._batch_logprobs(self.ref, batch, mbs, dp) if self.ref is not None and needs_ref else None
        updates = self.mini_batches(batch.size, step)
        recompute = ~batch.has_old if self.bypass_old_logprobs else torch.ones_like(batch.has_old)
        gap: dict[str, float] | None = None  # the engine's log-probs against the trainer's
        if bool(recompute.any()) and (len(updates) > 1 or not self.bypass_old_logprobs):
            now = self._batch_logprobs(self.engine, batch, mbs, dp, fillers)  # every rank: every row
            gap = fresh_gap(now, batch, step)  # before the trainer's replace the engine's
            batch.old_logprob = torch.where(recompute.unsqueeze(-1), now, batch.old_logprob)
            batch.has_old = torch.ones_like(batch.has_old)
        old_values, extra = self._advantages_in_trainer(batch, mbs, ref_all, dp, fillers)
        if self.critic is not None and old_values is not None:
            parts = [self.critic.update(batch, self._split(rows, lengths, None, batch.group_ids)[0], old_values) for rows in updates]
            extra.update(_mean(parts))
        if step <= self.critic_warmup:  # PPO: the critic learns first, the actor waits
            return {**extra, "critic_warmup": 1.0, "step_time_s": time.perf_counter() - t0}
        # else the first update runs on the weights the trainer held at the step's start: its
        # log-probs there and the engine's measure the gap
        done = [self._update(batch, rows, lengths, ref_all, step, dp, measure=gap is None and i == 0)
                for i, rows in enumerate(updates)]
        out = _mean([metrics for metrics, _, _ in done])
        if dp is not None:  # each rank's parts are weighted by its share of each mini-batch
            total: dict[str, float] = defaultdict(float)
            for part in dp.gather(out):
                for k, v in part.items():
                    total[k] += v
            out = dict(total)
        if gap is not None:  # over the whole batch, the same on every rank: added after their sum
            out.update(gap)
        out = {k: v for k, v in out.items() if k not in MISMATCH_SUMS} | mismatch_metrics(out)
        dt = time.perf_counter() - t0
        out.update(extra)
        out.update({
            "grad_norm": sum(g for _, g, _ in done) / len(done), "lr": self.engine.lr,
            "updates": float(len(updates)), "micro_batches": float(sum(n for _, _, n in done)),
            "tokens": float(batch.num_tokens), "tokens_per_s": batch.num_tokens / max(dt, 1e-9), "step_time_s": dt,
            # of the tokens this rank's micro-batches compute, the share that is padding
            "padding_fraction": padding_fraction(lengths, mbs),
        })
        return out

    def _update(self, batch: Batch, rows: list[int], lengths: list[int], ref_all: torch.Tensor | None,
                step: int, dp: Any, measure: bool = False) -> tuple[dict[str, float], float, int]:
        """One optimizer update on the mini-batch ``rows`` (this rank's share of them):
        (metrics weighted by this rank's share of the mini-batch, grad norm, micro-batches).
        ``measure``: also the engine/trainer log-prob gap (:mod:`ops.mismatch`) as sums."""
        pair = self.spec.policy_loss_fn == "dpo"
        mbs, fillers = self._split(rows, lengths, dp, batch.group_ids)
        n_mb = len(mbs) + fillers
        seq_mode = self.spec.loss_agg_mode != "token-mean" or pair
        token_total = max(int(batch.action_mask[torch.as_tensor(rows)].sum()), 1)
        world = 1 if dp is None else dp.world
        sums: dict[str, float] = defaultdict(float)
        filler = self._filler(batch, mbs)
        experts = int(batch.expert_mask[torch.as_tensor(rows)].sum())
        chosen = None
        if self.spec.policy_loss_fn in MINI_BATCH_MASKED:
            chosen, mm = self._m2po_mask(batch, rows, mbs, dp, fillers)
            for k, v in mm.items():  # the mini-batch's own figures: each rank's part of their sum
                sums[k] += v / world
        for i in range(n_mb):
            mb_rows = mbs[i] if i < len(mbs) else filler
            mb = batch.select(mb_rows)
            share = 0.0 if i >= len(mbs) else (len(mb_rows) / len(rows) if seq_mode else int(mb.action_mask.sum()) / token_total)
            ref_lp = None if ref_all is None else ref_all[torch.as_tensor(mb_rows)]
            lp, ent = self._scores(self.engine, mb, self.with_entropy, self.entropy_grad)
            old = torch.where(mb.has_old.unsqueeze(-1), mb.old_logprob, lp.detach())
            mask = mb.action_mask
            parts = {}
            if self.spec.policy_loss_fn in PART_WEIGHTED and share > 0:  # each part: a mean over its rows
                e = int(mb.expert_mask.sum())
                parts["part_weights"] = ((len(mb_rows) - e) / max(len(rows) - experts, 1) / share,
                                         e / max(experts, 1) / share)
            if chosen is not None:
                parts["m2po_mask"] = chosen[torch.as_tensor(mb_rows)]
            loss, m = self.policy_fn(lp, old, mb.advantages, mask, ref_logprob=ref_lp, expert_mask=mb.expert_mask,
                                     global_step=step, **parts, **self.spec.policy_loss_fn_args)
            if ref_lp is not None and self.spec.kl_loss_fn != "none" and self.spec.policy_loss_fn != "dpo":
                kl, km = kl_loss(lp, ref_lp, mask, kl_fn=self.spec.kl_loss_fn, old_logprob=old, **self.spec.kl_loss_fn_args)
                loss = loss + kl
                m.update(km)
            if ent is not None and self.spec.entropy_loss_fn != "none":
                el, em = self.entropy_fn(ent, mask, expert_mask=mb.expert_mask, **self.spec.entropy_loss_fn_args)
                loss = loss + el
                m.update(em)
            elif ent is not None:
                m["entropy"] = float((ent * mask).sum() / mask.sum().clamp(min=1))
            self.engine.backward(loss * (share * world), last=i == n_mb - 1)
            m["loss"] = float(loss.detach())
            for k, v in m.items():
                sums[k] += share * float(v)
            if measure and i < len(mbs):  # each rank its rows: the ranks' sums add up
                for k, v in fresh_gap(lp, mb, step).items():
                    sums[k] += v
        return dict(sums), self.engine.step(), n_mb


def fresh_gap(trainer_lp: torch.Tensor, batch: Batch, step: int) -> dict[str, float]:
    """:func:`ops.mismatch.mismatch_sums` of the trainer's log-probs against the engine's
    (``batch.old_logprob`` while they are the engine's) on the rows the engine generated on the
    weights step ``step`` starts from (version ``step - 1``): older rows are policy lag, not
    the engines' gap."""
    fresh = batch.has_old & (batch.versions == step - 1)
    return mismatch_sums(trainer_lp, batch.old_logprob, batch.action_mask & fresh.unsqueeze(-1))


def _mean(parts: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each metric over the updates that report it (one update: itself)."""
    keys = dict.fromkeys(k for p in parts for k in p)
    return {k: sum(p[k] for p in parts if k in p) / sum(1 for p in parts if k in p) for k in keys}


def batch_metrics(exps: list[Experience], step: int) -> dict[str, float]:
    """What a step's metrics say about the batch itself (size, reward, staleness: how many
    versions behind the trainer the experiences were generated; with a teacher, the
    sampled-token estimate of the student's KL from it), over the whole batch."""
    out = {"batch_size": float(len(exps)),
           "reward_mean": sum(float(e.reward or 0.0) for e in exps) / max(len(exps), 1)}
    scored = [e for e in exps if e.teacher_logprobs is not None and e.logprobs is not None
              and np.ndim(e.teacher_logprobs) == 1]
    if scored:  # on-policy distillation: how far the student's samples are from the teacher
        gap = np.concatenate([np.asarray(e.logprobs, np.float64) - np.asarray(e.teacher_logprobs, np.float64)
                              for e in scored])
        out["distill/teacher_kl"] = float(gap.mean()) if gap.size else 0.0
    versions = [e.model_version for e in exps if e.chosen is None and not e.info.get("is_expert")]
    if versions:
        out["staleness_mean"] = float(step - 1 - sum(versions) / len(versions))
        out["staleness_max"] = float(step - 1 - min(versions))
    return out
