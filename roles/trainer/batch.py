"""From a list of experiences to padded tensors, and from a batch to micro-batches.

Layout: ``input_ids`` (B x L, right padded) holds prompt + response; the response part of the
per-token quantities is ``B x T`` (T = longest response) and ``resp_index`` says where in the
``L-1`` next-token predictions each response token sits (position ``prompt_length - 1 + t``
predicts response token ``t``). DPO experiences become two rows each (chosen, rejected), which
is the pairing :func:`ops.policy_losses.dpo_loss` expects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from schemas.data import Experience


@dataclass
class Batch:
    input_ids: torch.Tensor  # B x L
    attention_mask: torch.Tensor  # B x L
    resp_index: torch.Tensor  # B x T, index into the L-1 predictions
    action_mask: torch.Tensor  # B x T bool
    old_logprob: torch.Tensor  # B x T
    advantages: torch.Tensor  # B x T
    returns: torch.Tensor  # B x T
    rewards: torch.Tensor  # B
    expert_mask: torch.Tensor  # B bool
    group_ids: list[str]
    ids: list[str]
    has_old: torch.Tensor  # B bool: the rollout engine's logprobs are known
    versions: torch.Tensor  # B long: the weights version each row was generated with

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    def select(self, rows: Sequence[int]) -> Batch:
        """Rows ``rows`` as their own batch, trimmed to their longest sequence/response."""
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        am = self.attention_mask[idx]
        L = max(int(am.sum(-1).max()), 2)
        return Batch(
            self.input_ids[idx, :L], am[:, :L], self.resp_index[idx].clamp(max=L - 2), self.action_mask[idx],
            self.old_logprob[idx], self.advantages[idx], self.returns[idx],
            self.rewards[idx], self.expert_mask[idx],
            [self.group_ids[i] for i in rows], [self.ids[i] for i in rows], self.has_old[idx], self.versions[idx],
        )


def _rows(exps: Sequence[Experience]) -> list[tuple[Experience, np.ndarray, int, str]]:
    """(experience, tokens, prompt_length, row id) per training row."""
    rows = []
    for e in exps:
        if e.chosen is not None and e.rejected is not None:
            p = np.asarray(e.tokens)[: e.prompt_length]
            rows.append((e, np.concatenate([p, np.asarray(e.chosen)]), e.prompt_length, e.id + "#chosen"))
            rows.append((e, np.concatenate([p, np.asarray(e.rejected)]), e.prompt_length, e.id + "#rejected"))
        else:
            rows.append((e, np.asarray(e.tokens), e.prompt_length, e.id))
    return rows


def collate(exps: Sequence[Experience], pad_token_id: int = 0) -> Batch:
    """Pad experiences into a :class:`Batch` (raises ValueError naming an experience without
    response tokens)."""
    rows = _rows(exps)
    if not rows:
        raise ValueError("collate: empty batch")
    B = len(rows)
    L = max(len(t) for _, t, _, _ in rows)
    T = max(max(len(t) - p for _, t, p, _ in rows), 1)
    ids = torch.full((B, L), pad_token_id, dtype=torch.long)
    am = torch.zeros(B, L, dtype=torch.long)
    ri = torch.zeros(B, T, dtype=torch.long)
    act = torch.zeros(B, T, dtype=torch.bool)
    old = torch.zeros(B, T)
    adv = torch.zeros(B, T)
    ret = torch.zeros(B, T)
    rew = torch.zeros(B)
    expert = torch.zeros(B, dtype=torch.bool)
    has_old = torch.zeros(B, dtype=torch.bool)
    for i, (e, tok, p, _) in enumerate(rows):
        n, r = len(tok), len(tok) - p
        if r <= 0 or p <= 0:
            raise ValueError(f"experience {e.id!r}: needs >= 1 prompt and >= 1 response token (prompt {p}, total {n})")
        ids[i, :n] = torch.as_tensor(tok.astype(np.int64))
        am[i, :n] = 1
        ri[i, :r] = torch.arange(p - 1, n - 1)
        is_pair = e.chosen is not None
        act[i, :r] = True if (e.action_mask is None or is_pair) else torch.from_numpy(np.array(e.action_mask, dtype=bool))
        if e.logprobs is not None and not is_pair:
            old[i, :r] = torch.from_numpy(np.array(e.logprobs, dtype=np.float32))
            has_old[i] = True
        if e.advantages is not None:
            adv[i, :r] = torch.from_numpy(np.array(e.advantages, dtype=np.float32))
        if e.returns is not None:
            ret[i, :r] = torch.from_numpy(np.array(e.returns, dtype=np.float32))
        rew[i] = 0.0 if e.reward is None else float(e.reward)
        expert[i] = bool(e.info.get("is_expert", False))
    versions = torch.tensor([e.model_version for e, _, _, _ in rows], dtype=torch.long)
    return Batch(ids, am, ri, act, old, adv, ret, rew, expert, [r[0].advantage_group for r in rows], [r[3] for r in rows],
                 has_old, versions)


def per_micro_batch(batch: Batch, mbs: Sequence[Sequence[int]], fn: Callable[[Batch], torch.Tensor]) -> torch.Tensor:
    """``fn`` (one ``B' x T`` tensor per micro-batch, e.g. log-probs or values) over the
    whole batch, assembled back into ``B x T`` rows in batch order."""
    out = torch.zeros_like(batch.old_logprob)
    for rows in mbs:
        out[torch.as_tensor(list(rows))] = fn(batch.select(rows))
    return out


#: Padding share above which :func:`micro_batches` regroups rows by length.
PADDING_TARGET = 0.10


def micro_batches(
    lengths: Sequence[int],
    *,
    use_dynamic_bsz: bool,
    max_token_len: int | None,
    micro_batch_size: int,
    pair: bool = False,
    groups: Sequence[str] | None = None,
) -> list[list[int]]:
    """Split rows into micro-batches: by a token budget (``use_dynamic_bsz``: rows while the
    padded size ``rows * longest`` stays within ``max_token_len``; a row longer than the
    budget goes alone) or by ``micro_batch_size`` rows. ``pair`` keeps rows 2k and 2k+1
    together (DPO). Pure, so it is unit-tested on lengths alone.

    With ``groups`` (each row's advantage group) and a token budget, a group's rows go in one
    micro-batch where the group fits the budget, so its prompt runs once (:mod:`.prefix`);
    a group that does not fit is split row by row.

    Rows go in batch order unless more than :data:`PADDING_TARGET` of what the micro-batches
    compute would be padding; then longest first (rows of like length together) where that
    pads less. Each micro-batch's loss is weighted by its share of the tokens, so the order
    changes no update, only the rounding: a batch that pads little keeps its order, and with
    it the exact numbers of earlier runs (the quickstart's SFT stage, measured)."""
    unit = 2 if pair else 1
    by_tokens = use_dynamic_bsz and bool(max_token_len)
    if groups is not None and by_tokens and not pair:
        units = _group_units(lengths, groups, max_token_len or 0)
    else:
        units = [list(range(i, min(i + unit, len(lengths)))) for i in range(0, len(lengths), unit)]
    out = _fill(units, lengths, by_tokens, max_token_len, max(micro_batch_size, unit))
    if padding_fraction(lengths, out) > PADDING_TARGET:
        units.sort(key=lambda u: -max(lengths[i] for i in u))
        by_length = _fill(units, lengths, by_tokens, max_token_len, max(micro_batch_size, unit))
        if padding_fraction(lengths, by_length) < padding_fraction(lengths, out):
            out = by_length
    return out


def _group_units(lengths: Sequence[int], groups: Sequence[str], max_token_len: int) -> list[list[int]]:
    """Each group's rows as one unit (in the order groups first appear), or one unit per row
    for a group whose padded size exceeds ``max_token_len``."""
    by_group: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    units: list[list[int]] = []
    for rows in by_group.values():
        fits = len(rows) * max(lengths[i] for i in rows) <= max_token_len
        units += [rows] if fits else [[i] for i in rows]
    return units


def _fill(units: list[list[int]], lengths: Sequence[int], by_tokens: bool, max_token_len: int | None,
          max_rows: int) -> list[list[int]]:
    """Micro-batches of consecutive ``units`` within the token budget or row count."""
    out: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for u in units:
        ul = max(lengths[i] for i in u)
        fits = (len(cur) + len(u)) * max(longest, ul) <= (max_token_len or 0) if by_tokens else len(cur) + len(u) <= max_rows
        if cur and not fits:
            out.append(cur)
            cur, longest = [], 0
        cur += u
        longest = max(longest, ul)
    if cur:
        out.append(cur)
    return out


def padding_fraction(lengths: Sequence[int], mbs: Sequence[Sequence[int]]) -> float:
    """The share of the tokens computed on micro-batches ``mbs`` that are padding (each
    micro-batch is as long as its longest row)."""
    computed = sum(len(mb) * max(lengths[i] for i in mb) for mb in mbs if mb)
    return 1.0 - sum(lengths[i] for mb in mbs for i in mb) / max(computed, 1)
