"""The shared-prompt forward (``roles/trainer/prefix.py``) gives the plain forward's log-probs,
entropies and gradients, on groups with different prompt and response lengths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from roles.trainer.batch import collate
from roles.trainer.prefix import prompt_owners, shared_prompts
from roles.trainer.step import token_logprobs
from schemas.data import Experience


def _groups(prompt_lengths: list[int], responses: list[list[int]], vocab: int = 50, seed: int = 0) -> list[Experience]:
    """One group per prompt length; group g has a response of each length in responses[g]."""
    rng = np.random.default_rng(seed)
    out = []
    for g, (p, lens) in enumerate(zip(prompt_lengths, responses, strict=True)):
        prompt = rng.integers(3, vocab, p)
        for k, r in enumerate(lens):
            out.append(Experience(id=f"{g}-{k}", task_id=str(g), group_id=str(g), run_id="r",
                                  tokens=np.concatenate([prompt, rng.integers(3, vocab, r)]).astype(np.int32),
                                  prompt_length=p))
    return out


def _reference(model, mb) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy from one full forward of every row, written out plainly."""
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, mb.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1).gather(1, mb.resp_index)
    ent = -(logp.exp() * logp).sum(-1).gather(1, mb.resp_index)
    return lp * mb.action_mask, ent * mb.action_mask


@pytest.fixture(scope="module")
def model(tiny_model: Path):
    from roles.trainer.engine import load_model

    return load_model(tiny_model)


EXPS = _groups([7, 12, 5, 9], [[4, 1, 6], [3, 3], [2], [5, 2, 8, 1]])


def test_rows_with_the_same_prompt_share_it():
    owners, firsts = prompt_owners(collate(EXPS))
    assert owners == [0, 0, 0, 1, 1, 2, 3, 3, 3, 3]
    assert firsts == [0, 3, 5, 6]


def test_shared_prompt_log_probs_and_entropy_equal_the_full_forward(model):
    mb = collate(EXPS)
    assert shared_prompts(mb, model)
    with torch.no_grad():
        lp, ent = token_logprobs(model, mb, 1.0, True)
        ref_lp, ref_ent = _reference(model, mb)
    assert torch.allclose(lp * mb.action_mask, ref_lp, atol=1e-5), (lp - ref_lp).abs().max()
    assert torch.allclose(ent * mb.action_mask, ref_ent, atol=1e-4), (ent - ref_ent).abs().max()


def test_shared_prompt_gradients_equal_the_full_forward(model):
    mb = collate(EXPS)
    weights = torch.linspace(0.5, 1.5, mb.action_mask.numel()).view_as(mb.action_mask) * mb.action_mask

    def grads(fn) -> dict[str, torch.Tensor]:
        model.zero_grad()
        (fn() * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    shared = grads(lambda: token_logprobs(model, mb, 0.7, False)[0])
    full = grads(lambda: _reference_at(model, mb, 0.7))
    assert shared.keys() == full.keys()
    for name, g in full.items():
        assert torch.allclose(shared[name], g, atol=1e-5, rtol=1e-4), name


def _reference_at(model, mb, temperature: float) -> torch.Tensor:
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1] / temperature
    logp = torch.log_softmax(logits, -1)
    return logp.gather(-1, mb.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1).gather(1, mb.resp_index)


def test_rows_without_a_shared_prompt_take_one_forward_with_the_same_result(model):
    mb = collate(_groups([6, 9, 4], [[3], [5], [2]]))
    assert not shared_prompts(mb, model)
    with torch.no_grad():
        lp, _ = token_logprobs(model, mb, 1.0, False)
        ref_lp, _ = _reference(model, mb)
    assert torch.allclose(lp * mb.action_mask, ref_lp, atol=1e-5)


def test_gradient_checkpointing_takes_the_plain_forward(tiny_model: Path):
    from roles.trainer.engine import load_model

    m = load_model(tiny_model, gradient_checkpointing=True).train()
    assert not shared_prompts(collate(EXPS), m)  # its layers drop the cache in training
