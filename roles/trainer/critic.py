"""The PPO critic: a value model trained beside the actor in the trainer process.

Why a token-classification head: ``AutoModelForTokenClassification`` with one label is the
causal LM's backbone plus a linear ``score`` head, loads from the same Hugging Face folder as
the actor (the head starts at random, as in veRL) and saves back as a normal HF model, so the
critic needs no weight format of its own. Dropout is turned off: a value estimate should not
change between the pass that computes advantages and the pass that trains.

The value of response token ``t`` is the critic's output at the position that predicts it
(``resp_index``), i.e. the value of the state before that token was generated.
"""

from __future__ import annotations

from typing import Any

import torch

from ops.value import value_loss
from schemas.config import CriticConfig
from storage.hf_config import override_rope

from .batch import Batch, per_micro_batch
from .engine import TorchEngine


def load_value_model(path: str, overrides: dict[str, Any] | None = None) -> Any:
    from transformers import AutoConfig, AutoModelForTokenClassification
    from transformers.utils import logging as hf_logging

    config = override_rope(AutoConfig.from_pretrained(path), **(overrides or {}))
    config.num_labels = 1
    config.classifier_dropout = 0.0
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "score.weight newly initialized" is expected here
    try:
        model = AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=torch.float32)
    finally:
        hf_logging.set_verbosity(level)
    if torch.cuda.is_available():
        model = model.cuda()
    return model


class Critic:
    """Value model + its own optimizer; ``values`` for advantages, ``update`` per step."""

    def __init__(self, model: Any, cfg: CriticConfig, *, total_steps: int) -> None:
        self.cfg = cfg
        self.engine = TorchEngine(model, cfg.optim, total_steps=total_steps, grad_clip=cfg.grad_clip)

    @property
    def model(self) -> Any:
        return self.engine.model

    def forward(self, mb: Batch) -> torch.Tensor:
        """Values of ``mb``'s response tokens (B x T), with gradient."""
        out = self.engine.forward_logits(mb.input_ids, mb.attention_mask)[..., 0][:, :-1]
        return out.gather(1, mb.resp_index.to(out.device)).float().cpu()

    @torch.no_grad()
    def values(self, batch: Batch, micro_batches: list[list[int]]) -> torch.Tensor:
        """Values of the whole batch (B x T), computed micro-batch by micro-batch."""
        return per_micro_batch(batch, micro_batches, self.forward) * batch.action_mask

    def update(self, batch: Batch, micro_batches: list[list[int]], old_values: torch.Tensor) -> dict[str, float]:
        """One optimizer step on the clipped value loss towards ``batch.returns`` over the rows
        of ``micro_batches`` (a token mean over those rows: micro-batch losses weighted by
        their share of tokens)."""
        rows = torch.as_tensor([r for mb in micro_batches for r in mb])
        total = max(int(batch.action_mask[rows].sum()), 1)
        sums: dict[str, float] = {}
        for rows in micro_batches:
            mb = batch.select(rows)
            idx = torch.as_tensor(rows)
            loss, m = value_loss(self.forward(mb), old_values[idx], mb.returns, mb.action_mask,
                                 cliprange_value=self.cfg.cliprange_value)
            w = int(mb.action_mask.sum()) / total
            self.engine.backward(loss * w)
            for k, x in m.items():
                sums[f"critic/{k}"] = sums.get(f"critic/{k}", 0.0) + w * x
        sums["critic/grad_norm"] = self.engine.step()
        sums["critic/lr"] = self.engine.lr
        return sums

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the critic (resume continues its training exactly)."""
        return {"model": self.model.state_dict(), "engine": self.engine.optimizer_state()}

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.engine.load_optimizer_state(state["engine"])
