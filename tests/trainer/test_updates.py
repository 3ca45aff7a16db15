"""Several optimizer updates per batch (``ppo_epochs``, ``ppo_mini_batch_size``, veRL's
names), old log-probs the updates share, and the other trainer settings that change the
update (``bypass_old_logprobs``, ``balance_batch``, ``optimizer_type``, rope overrides)."""

from __future__ import annotations

import pytest
import torch

from ops.algorithms import resolve
from roles.trainer.ranks import shard_rows
from roles.trainer.step import StepRunner
from tests.explorer.helpers import load

from .helpers import groups, write_config


def _runner(**kw) -> StepRunner:
    return StepRunner(object(), resolve("grpo", kl_loss_fn="none"), **kw)


def test_mini_batches_cover_every_row_once_per_epoch():
    r = _runner(ppo_epochs=2, mini_batch_rows=3)
    assert r.mini_batches(7, step=1) == [[0, 1, 2], [3, 4, 5], [6]] * 2
    assert _runner().mini_batches(5, step=1) == [[0, 1, 2, 3, 4]]
    s = _runner(ppo_epochs=3, mini_batch_rows=4, shuffle=True)
    ups = s.mini_batches(8, step=5)
    assert len(ups) == 6 and ups == s.mini_batches(8, step=5)  # seeded: a resume repeats it
    for e in range(3):
        assert sorted(ups[2 * e] + ups[2 * e + 1]) == list(range(8))
    assert ups[:2] != s.mini_batches(8, step=6)[:2] or ups[2:4] != s.mini_batches(8, step=6)[2:4]
    dpo = StepRunner(object(), resolve("dpo"), ref_model=object(), mini_batch_rows=3)  # whole pairs: rows 2k, 2k+1
    assert dpo.mini_batches(8, step=1) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_unbalanced_shards_are_contiguous_blocks():
    lengths = [9, 1, 1, 9, 5, 5, 5]
    assert [shard_rows(lengths, r, 2, balance=False) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6]]
    assert [shard_rows(lengths, r, 2, pair=True, balance=False) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6]]
    balanced = [shard_rows(lengths, r, 2) for r in (0, 1)]
    assert sorted(balanced[0] + balanced[1]) == list(range(7))


def _cfg(tmp_path, tiny_model, trainer=None, algorithm=None, model=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    return load(write_config(
        tmp_path / "c.yaml", project="t", name="u", checkpoint_root_dir=str(tmp_path / "ckpt"),
        model={"model_path": str(tiny_model), "max_model_len": 64, **(model or {})},
        algorithm={"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {"lr": 1e-3},
                   "kl_loss_fn": "none", **(algorithm or {})},
        trainer={"trainer_type": "pytorch", "save_hf_checkpoint": "never", **(trainer or {})},
        buffer={"batch_size": 2, "total_steps": 4},
    ))


def _batch(logprobs: bool = True) -> list:
    """Two GRPO groups with their advantages (as the buffer computes them)."""
    from roles.buffer.pipeline import group_advantages

    out = []
    for g in groups("t.u", 0, 2, size=4):
        for e in g.experiences:
            e.logprobs = e.logprobs if logprobs else None
        out += group_advantages(g, resolve("grpo")).experiences
    return out


@pytest.mark.slow
def test_epochs_and_mini_batches_make_several_updates_from_one_old_policy(tmp_path, tiny_model):
    from roles.trainer.main import Trainer

    one = Trainer(_cfg(tmp_path / "a", tiny_model))
    m1 = one.train(_batch(logprobs=False), 1)
    assert m1["updates"] == 1.0 and one.engine.optimizer.state_dict()["state"][0]["step"] == 1
    # veRL's names, as a migrated Trinity-RFT config writes them, mean the same; the mini-batch
    # size is trinity's own (veRL's is overridden by buffer.train_batch_size: tests/schemas)
    cfg = _cfg(tmp_path / "b", tiny_model, trainer={"ppo_mini_batch_size": 1, "trainer_config": {
        "actor_rollout_ref": {"actor": {"ppo_epochs": 2, "shuffle": True}}}})
    assert (cfg.trainer.ppo_epochs, cfg.trainer.ppo_mini_batch_size, cfg.trainer.ppo_shuffle) == (2, 1, True)
    many = Trainer(cfg)
    assert many.runner.mini_batch_rows == 4  # 1 task x repeat_times 4
    m = many.train(_batch(logprobs=False), 1)
    assert m["updates"] == 4.0 and many.engine.optimizer.state_dict()["state"][0]["step"] == 4
    # the rollouts carry no log-probs here: the updates after the first start from the old
    # policy fixed before them, so their ratios move and the clip can bite
    assert m["loss"] != pytest.approx(m1["loss"])
    assert all(torch.isfinite(torch.tensor(v)) for v in m.values())


@pytest.mark.slow
def test_old_logprobs_come_from_the_trainer_without_bypass(tmp_path, tiny_model):
    from roles.trainer.main import Trainer

    batch = _batch()
    for e in batch:  # a rollout engine whose log-probs are far below the trainer's
        e.logprobs = e.logprobs * 0 - 20.0
    by = Trainer(_cfg(tmp_path / "a", tiny_model))
    m_by = by.train(batch, 1)
    fresh = Trainer(_cfg(tmp_path / "b", tiny_model, algorithm={"bypass_old_logprobs": False}))
    m_fresh = fresh.train(batch, 1)
    # with the engine's -5.0 the ratio is far from 1 and PPO clips; recomputed, it is 1
    assert m_by["pg_clipfrac"] > 0.3, m_by  # the rows with a positive advantage
    assert m_fresh["pg_clipfrac"] == 0.0, m_fresh


@pytest.mark.slow
def test_rope_overrides_reach_the_trained_model_and_its_checkpoint(tmp_path, tiny_model):
    from roles.trainer.main import Trainer

    tr = Trainer(_cfg(tmp_path, tiny_model, model={"rope_theta": 5000.0}))
    assert tr.engine.model.config.rope_parameters["rope_theta"] == 5000.0
    tr.save(final=True)  # the checkpoint the next stage and the engines load carries it
    from transformers import AutoConfig

    from storage import checkpoints as ckpt

    saved = AutoConfig.from_pretrained(ckpt.hf_dir(tr.job, tr.step))
    assert saved.rope_parameters["rope_theta"] == 5000.0


@pytest.mark.slow
def test_m2po_chooses_its_mask_over_the_whole_mini_batch_however_micro_batches_split_it(tmp_path, tiny_model):
    """M2PO's mask is chosen once per update over all its rows (the paper sorts every token of
    the mini-batch): one row per micro-batch and every row in one give the same mask, the same
    loss and the same update; and rollouts a stale policy sampled get some tokens masked."""
    from roles.trainer.main import Trainer

    batch = _batch()
    g = torch.Generator().manual_seed(0)
    for e in batch:  # a behaviour policy off from the trainer's by up to +-0.6 nats a token
        e.logprobs = e.logprobs + (torch.rand(len(e.logprobs), generator=g).numpy() - 0.5) * 1.2
    runs = []
    for name, mb in (("one", 1), ("all", 8)):
        tr = Trainer(_cfg(tmp_path / name, tiny_model, algorithm={"algorithm_type": "m2po"},
                          trainer={"use_dynamic_bsz": False, "micro_batch_size_per_gpu": mb}))
        m = tr.train(batch, 1)
        runs.append((m, {k: v.detach().clone() for k, v in tr.engine.model.state_dict().items()}))
    (m1, w1), (m8, w8) = runs
    assert m1["micro_batches"] == 8.0 and m8["micro_batches"] == 1.0
    assert 0.0 < m1["m2po/masked_fraction"] < m1["m2po/trust_region_fraction"]
    for k in ("m2po/masked_fraction", "m2po/m2_before", "m2po/m2_after", "loss"):
        assert m1[k] == pytest.approx(m8[k], rel=1e-4, abs=1e-6), k
    assert all(torch.allclose(w1[k], w8[k], atol=1e-5) for k in w1)


def test_m2po_refuses_recomputed_old_logprobs(tmp_path, tiny_model):
    from schemas.loader import ConfigError

    with pytest.raises(ConfigError, match="algorithm.bypass_old_logprobs: false; policy_loss_fn 'm2po'"):
        _cfg(tmp_path, tiny_model, algorithm={"algorithm_type": "m2po", "bypass_old_logprobs": False})


@pytest.mark.slow
def test_unset_micro_batch_tokens_are_sized_from_free_memory_and_keep_groups_whole(tmp_path, tiny_model):
    """No ``max_token_len_per_gpu``: the trainer sizes micro-batches to its memory (a tiny
    model's whole batch: one micro-batch, each group's prompt run once), not to twice
    ``max_model_len`` (128 tokens here: three micro-batches for these two groups of 4, one
    of them splitting a group). Set, the value decides."""
    from roles.trainer.budget import MOST_TOKENS, derive, free_bytes
    from roles.trainer.main import Trainer

    cfg = _cfg(tmp_path / "a", tiny_model)
    assert cfg.trainer.max_token_len_per_gpu is None
    budget = derive(cfg, torch.device("cpu"))
    assert 64 <= budget.tokens <= MOST_TOKENS and "GiB free on cpu" in budget.why, budget
    assert free_bytes(torch.device("cpu")) > 0
    auto = Trainer(cfg)
    assert auto.runner.max_token_len >= 1024  # ~18 KiB a token: a quarter of any machine's RAM holds more
    assert auto.train(_batch(), 1)["micro_batches"] == 1.0
    fixed = Trainer(_cfg(tmp_path / "b", tiny_model, trainer={"max_token_len_per_gpu": 40}))
    assert fixed.runner.max_token_len == 40
    assert fixed.train(_batch(), 1)["micro_batches"] > 1.0


@pytest.mark.slow
def test_the_engines_log_prob_gap_is_measured_on_rows_of_the_trainers_weights(tmp_path, tiny_model):
    """``rollout/*`` (ops/mismatch.py): the gap between the engine's log-probs and the
    trainer's, over the rows generated on the weights the step starts from; rows of older
    weights (policy lag, not the engines' disagreement) are left out."""
    from roles.trainer.batch import collate
    from roles.trainer.main import Trainer
    from roles.trainer.step import token_logprobs

    trainer = Trainer(_cfg(tmp_path, tiny_model))
    batch = _batch()
    with torch.no_grad():
        own = token_logprobs(trainer.engine, collate(batch), 1.0, False)[0]
    fresh_tokens = 0
    for i, e in enumerate(batch):
        r = e.response_length
        if i < 4:  # the first group: generated on the weights step 2 starts from (version 1)
            e.model_version, e.logprobs = 1, own[i, :r].numpy() + 0.1
            fresh_tokens += r
        else:  # the second: a version older, far off: not the engine's gap, not counted
            e.model_version, e.logprobs = 0, own[i, :r].numpy() - 20.0
    m = trainer.train(batch, 2)
    assert m["rollout/logprob_diff_tokens"] == fresh_tokens
    assert m["rollout/logprob_diff_mean"] == pytest.approx(0.1, abs=1e-4)
    assert m["rollout/kl"] == pytest.approx(float(torch.exp(torch.tensor(-0.1)) - 1 + 0.1), rel=1e-3)
    assert not any(k.endswith("_sum") for k in m)
    # recomputing the old log-probs (bypass off): measured against the engine's before they go
    own_old = Trainer(_cfg(tmp_path / "own", tiny_model, algorithm={"bypass_old_logprobs": False}))
    m2 = own_old.train(batch, 2)
    assert m2["rollout/logprob_diff_tokens"] == fresh_tokens
    assert m2["rollout/logprob_diff_mean"] == pytest.approx(0.1, abs=1e-4)
    for e in batch:
        e.model_version = 0
    assert trainer.train(batch, 3)["rollout/logprob_diff_tokens"] == 0.0  # nothing on its weights: said so


@pytest.mark.slow
def test_the_trainer_computes_in_bfloat16_where_the_cpu_has_it(tmp_path, tiny_model, monkeypatch):
    """On a CPU with native bfloat16 (TRINITY_CPU_BF16=1 stands in for its flags here) the
    PyTorch trainer's forwards run under bfloat16 autocast beside a bfloat16 engine, its
    weights and optimizer float32; float32 without the flag or beside a float32 engine."""
    from roles.trainer.batch import collate
    from roles.trainer.main import Trainer
    from roles.trainer.step import token_logprobs

    monkeypatch.setenv("TRINITY_CPU_BF16", "0")
    assert Trainer(_cfg(tmp_path / "a", tiny_model)).engine.compute_dtype is None
    monkeypatch.setenv("TRINITY_CPU_BF16", "1")
    cfg = _cfg(tmp_path / "b", tiny_model)
    cfg.explorer.rollout_model.dtype = "float32"
    assert Trainer(cfg).engine.compute_dtype is None  # beside a float32 engine
    bf16 = Trainer(_cfg(tmp_path / "c", tiny_model))
    assert bf16.engine.compute_dtype == torch.bfloat16
    batch = _batch()
    with torch.no_grad():
        exact = token_logprobs(bf16.engine, collate(batch), 1.0, False)[0]  # float32: no autocast here
    for i, e in enumerate(batch):
        e.logprobs = exact[i, :e.response_length].numpy()
    m = bf16.train(batch, 1)
    assert all(p.dtype == torch.float32 for p in bf16.engine.model.parameters())
    # the float32 log-probs against the bfloat16 forward's: a gap, small on this model
    assert 0 < m["rollout/logprob_diff_mean"] < 0.1 and m["rollout/logprob_diff_tokens"] > 0
    assert torch.isfinite(torch.tensor(m["loss"])) and m["grad_norm"] > 0
