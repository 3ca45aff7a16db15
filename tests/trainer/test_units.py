"""Pure parts of the buffer, trainer and synchronizer: policy, micro-batches, schedule,
pipeline operators, batch collation, the batch protocol."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ops.algorithms import resolve
from roles.buffer.pipeline import (
    Pipeline,
    drop_equal_reward_groups,
    invalid_reward_filter,
    reward_filter,
    reward_shaping,
    reward_std_filter,
)
from roles.synchronizer.main import missing_roles, overdue
from roles.trainer.batch import collate, micro_batches, padding_fraction
from roles.trainer.engine import lr_factor
from roles.weightsync.policy import explorer_requests, required_version, trainer_offers
from schemas.config import OperatorConfig
from schemas.data import Experience, ExperienceGroup
from schemas.rpc import BatchReply, BatchRequest, Commit, experiences
from schemas.state import Offer


def test_required_version_fixed_interval_and_offset():
    assert [required_version(s, 2, 0) for s in range(7)] == [0, 0, 2, 2, 4, 4, 6]
    assert [required_version(s, 2, 1) for s in range(7)] == [0, 0, 0, 2, 2, 4, 4]
    assert [required_version(s, 1, 0) for s in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="sync_interval"):
        required_version(3, 0)


def test_who_offers_and_who_asks():
    assert [trainer_offers(s, 3, "fixed") for s in range(7)] == [False, False, False, True, False, False, True]
    assert not trainer_offers(3, 3, "explorer_driven")
    assert trainer_offers(2, 2, "trainer_driven")
    assert [explorer_requests(s, 2, 1, "explorer_driven") for s in range(6)] == [False, False, False, True, False, True]
    assert not explorer_requests(4, 2, 0, "fixed")


def test_synchronizer_overdue_and_missing():
    offer = Offer(version=4, method="nccl", seq=1, ts=100.0)
    assert overdue(offer, 2, 200.0, 50.0)
    assert not overdue(offer, 4, 200.0, 50.0)
    assert not overdue(offer, 2, 120.0, 50.0)
    assert not overdue(None, 0, 1e9, 1.0)
    hb = {"trainer": {"ts": 190.0}, "explorer": {"ts": 10.0}}
    assert missing_roles(hb, 200.0, 30.0) == ["explorer"]
    assert missing_roles({}, 200.0, 30.0) == ["explorer", "trainer"]


def test_micro_batches_by_tokens_rows_and_pairs():
    lengths = [10, 10, 30, 5, 5, 5]
    assert micro_batches(lengths, use_dynamic_bsz=True, max_token_len=40, micro_batch_size=1) == [[0, 1], [2], [3, 4, 5]]
    assert micro_batches(lengths, use_dynamic_bsz=False, max_token_len=None, micro_batch_size=4) == [[0, 1, 2, 3], [4, 5]]
    assert micro_batches([50, 50], use_dynamic_bsz=True, max_token_len=10, micro_batch_size=1) == [[0], [1]]
    assert micro_batches(lengths, use_dynamic_bsz=False, max_token_len=None, micro_batch_size=3, pair=True) == [[0, 1], [2, 3], [4, 5]]
    # in batch order, more than half of what these micro-batches compute would be padding:
    # rows of like length go together instead
    mixed = [30, 5, 30, 5]
    assert padding_fraction(mixed, [[0, 1], [2, 3]]) == pytest.approx(1 - 70 / 120)
    assert micro_batches(mixed, use_dynamic_bsz=False, max_token_len=None, micro_batch_size=2) == [[0, 2], [1, 3]]
    assert micro_batches(mixed, use_dynamic_bsz=True, max_token_len=60, micro_batch_size=1) == [[0, 2], [1, 3]]
    assert padding_fraction(mixed, [[0, 2], [1, 3]]) == 0.0


def test_micro_batches_keep_a_group_whole_where_it_fits():
    """Groups interleaved in the batch (a, b, a, b): each group's rows in one micro-batch, so
    its prompt runs once; a group wider than the budget goes row by row; without groups the
    rows go in batch order."""
    lengths, groups = [10, 10, 10, 10], ["a", "b", "a", "b"]
    assert micro_batches(lengths, use_dynamic_bsz=True, max_token_len=20, micro_batch_size=1,
                         groups=groups) == [[0, 2], [1, 3]]
    assert micro_batches(lengths, use_dynamic_bsz=True, max_token_len=20, micro_batch_size=1) == [[0, 1], [2, 3]]
    wide = ["a", "a", "a", "b"]  # a: 3 x 10 > 20
    assert micro_batches(lengths, use_dynamic_bsz=True, max_token_len=20, micro_batch_size=1,
                         groups=wide) == [[0, 1], [2, 3]]
    # by rows (use_dynamic_bsz false) and DPO pairs keep their own rules
    assert micro_batches(lengths, use_dynamic_bsz=False, max_token_len=None, micro_batch_size=2,
                         groups=groups) == [[0, 1], [2, 3]]


def test_lr_schedule_warmup_then_cosine_to_floor():
    f = [lr_factor(s, total_steps=10, warmup_steps=2, scheduler="cosine", min_lr_ratio=0.1) for s in range(11)]
    assert f[0] == pytest.approx(0.5) and f[1] == pytest.approx(1.0) and f[2] == pytest.approx(1.0)
    assert f[10] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[2:], f[3:], strict=False))
    assert lr_factor(7, total_steps=10, warmup_steps=0, scheduler="constant", min_lr_ratio=0.1) == 1.0


def _group(rewards, gid="g"):
    exps = [Experience(id=f"{gid}/{i}", task_id="t", group_id=gid, run_id="r",
                       tokens=np.arange(6 + i, dtype=np.int32), prompt_length=3,
                       logprobs=np.full(3 + i, -1.0, np.float32), action_mask=np.ones(3 + i, bool), reward=r)
            for i, r in enumerate(rewards)]
    return ExperienceGroup(group_id=gid, task_id="t", run_id="r", experiences=exps)


def test_pipeline_shapes_filters_and_computes_grpo_advantages():
    pipe = Pipeline.from_config(
        [OperatorConfig(name="reward_shaping", args={"scale": 2.0, "bias": -1.0}),
         OperatorConfig(name="drop_equal_reward_groups")], resolve("grpo"))
    g = pipe(_group([0.0, 1.0, 1.0, 0.0]))
    assert [e.reward for e in g.experiences] == [-1.0, 1.0, 1.0, -1.0]
    adv = [float(e.advantages[0]) for e in g.experiences]
    assert adv[0] < 0 < adv[1] and adv[0] == pytest.approx(-adv[1])
    assert all(len(e.advantages) == e.response_length for e in g.experiences)
    assert pipe(_group([1.0, 1.0])) is None and pipe.dropped == {"drop_equal_reward_groups": 1}
    assert drop_equal_reward_groups(_group([0.5])) is not None
    assert reward_shaping(_group([3.0]), clip=[0, 1]).experiences[0].reward == 1.0


def test_the_buffers_group_advantage_metrics_are_averaged_for_its_metric_event():
    """GRPO's and GiGPO's metrics are computed where the advantages are, in the buffer: each
    group's go into its metrics, and the pipeline hands their mean over the groups since the last
    publish to the buffer's metric event (then starts again)."""
    pipe = Pipeline.from_config([], resolve("grpo", advantage_fn_args={"std_threshold": 0.0}))
    g = pipe(_group([0.0, 1.0]))
    assert g.metrics["advantage/reward_mean"] == pytest.approx(0.5)
    assert pipe(_group([1.0, 1.0])) is None  # std 0: dropped, and its metrics still count
    means = pipe.take_advantage_means()
    assert means["advantage/reward_mean"] == pytest.approx(0.75)
    assert means["advantage/filtered_count"] == pytest.approx(1.0)
    assert pipe.take_advantage_means() == {}


def test_trinity_rft_reward_filters_keep_what_upstreams_keep():
    """Upstream's ``reward_filter`` keeps experiences with reward >= threshold (per experience);
    ``reward_std_filter`` drops groups of one or with rewards' std <= threshold;
    ``invalid_reward_filter`` drops None and NaN rewards."""
    rewards = lambda g: None if g is None else [e.reward for e in g.experiences]  # noqa: E731
    assert rewards(reward_filter(_group([-1.0, 0.0, 0.5]))) == [0.0, 0.5]
    assert rewards(reward_filter(_group([0.2, 0.7]), threshold=0.5)) == [0.7]
    assert reward_filter(_group([0.1]), threshold=0.5) is None
    assert reward_std_filter(_group([1.0, 1.0])) is None and reward_std_filter(_group([1.0])) is None
    assert rewards(reward_std_filter(_group([0.0, 1.0]))) == [0.0, 1.0]  # std 0.5
    assert reward_std_filter(_group([0.0, 1.0]), threshold=0.5) is None
    assert rewards(invalid_reward_filter(_group([1.0, float("nan"), None]))) == [1.0]
    pipe = Pipeline.from_config([OperatorConfig(name="reward_filter", args={"threshold": 0.5})], resolve("grpo"))
    assert rewards(pipe(_group([0.0, 1.0, 1.0]))) == [1.0, 1.0]


def test_dapo_dynamic_sampling_keeps_mixed_outcomes_and_mask_response_truncated_keeps_the_reward():
    """Upstream's DAPO operators: a group stays when 0 < #correct < G, correct by the
    outcome (``info["accuracy"]``, else the reward) above ``correct_threshold``, so a length
    penalty on a correct answer does not make a group mixed; a truncated response stays in its
    group with no token trained on."""
    from roles.buffer.pipeline import dapo_dynamic_sampling, mask_response_truncated

    g = _group([0.9, 0.7])  # both correct, one penalised for length: all correct, dropped
    for e in g.experiences:
        e.info["accuracy"] = 1.0
    assert dapo_dynamic_sampling(g) is None
    assert dapo_dynamic_sampling(_group([0.0, 0.0, 0.0])) is None  # all wrong
    assert dapo_dynamic_sampling(_group([1.0])) is None  # a group of one
    assert dapo_dynamic_sampling(_group([1.0, 0.0, -1.0])) is not None
    assert dapo_dynamic_sampling(_group([1.0, 0.5]), correct_threshold=0.5) is not None  # 0.5 is not above
    with pytest.raises(ValueError, match="no 'accuracy' in its info and no reward"):
        dapo_dynamic_sampling(_group([1.0, None]))
    g = _group([1.0, 0.0])
    g.experiences[1].response_truncated = True
    g = mask_response_truncated(g)
    assert [e.action_mask.tolist() for e in g.experiences] == [[True] * 3, [False] * 4]
    assert [e.reward for e in g.experiences] == [1.0, 0.0]
    pipe = Pipeline.from_config([OperatorConfig(name="mask_response_truncated"),
                                 OperatorConfig(name="dapo_dynamic_sampling")], resolve("dapo"))
    out = pipe(g)
    assert out is not None and float(abs(out.experiences[1].advantages).sum()) == 0.0
    assert float(abs(out.experiences[0].advantages).sum()) > 0
    # fill (ours): the explorer draws more tasks for the dropped groups, as for drop_equal_reward_groups
    from schemas.config import ExperiencePipelineConfig

    assert ExperiencePipelineConfig(operators=[OperatorConfig(name="dapo_dynamic_sampling")]).fill_rounds() == 0
    assert ExperiencePipelineConfig(operators=[OperatorConfig(
        name="dapo_dynamic_sampling", args={"fill": True, "max_fill_rounds": 2})]).fill_rounds() == 2


def test_pipeline_rejects_unknown_operator_and_args():
    with pytest.raises(ValueError, match=r"operators\[0\].name: unknown 'nope'"):
        Pipeline.from_config([OperatorConfig(name="nope")], None)
    with pytest.raises(ValueError, match=r"operators\[0\] \(reward_shaping\).args"):
        Pipeline.from_config([OperatorConfig(name="reward_shaping", args={"scael": 1})], None)


def test_pipeline_checks_argument_types_against_the_signature():
    """Arguments are checked against each operator's annotations (strictly), plugins'
    included; a parameter without an annotation takes anything."""
    from roles.buffer.pipeline import OPERATORS

    with pytest.raises(ValueError, match=r"^data_processor.experience_pipeline.operators\[0\].args.scale: got 'big'; "
                                         r"reward_shaping takes float$"):
        Pipeline.from_config([OperatorConfig(name="reward_shaping", args={"scale": "big"})], None)
    with pytest.raises(ValueError, match=r"operators\[1\].args.fill: got 'true'; drop_equal_reward_groups takes bool"):
        Pipeline.from_config([OperatorConfig(name="drop_truncated"),
                              OperatorConfig(name="drop_equal_reward_groups", args={"fill": "true"})], None)
    with pytest.raises(ValueError, match=r"operators\[0\].args.clip: got \[0.0, nan\]; NaN is no setting"):
        Pipeline.from_config([OperatorConfig(name="reward_shaping", args={"clip": [0.0, float("nan")]})], None)

    def mine(group, *, factor: int, note=None):
        return group

    OPERATORS["mine_for_test"] = mine
    try:
        with pytest.raises(ValueError, match=r"operators\[0\].args.factor: got 1.5; mine_for_test takes int"):
            Pipeline.from_config([OperatorConfig(name="mine_for_test", args={"factor": 1.5})], None)
        Pipeline.from_config([OperatorConfig(name="mine_for_test", args={"factor": 2, "note": ["any", 1]})], None)
    finally:
        del OPERATORS["mine_for_test"]
    g = _group([0.0, 1.0])
    pipe = Pipeline.from_config([OperatorConfig(name="reward_shaping", args={"scale": 2, "clip": [-1, 1.5]})], None)
    assert [e.reward for e in pipe(g).experiences] == [0.0, 1.5]


def test_reward_shaping_mapper_and_pass_rate_as_trinity_rft_writes_them():
    """The configuration guide's ``reward_shaping_mapper`` (``reward_shaping_configs`` of
    ``{stats_key, op_type, weight}``) shapes rewards by experience stats in order; an entry
    without ``stats_key`` fails when the pipeline is built, naming it; an experience without
    the stat fails naming it (the buffer quarantines that group). ``pass_rate_calculator``
    before a dropping operator still reports the dropped group's pass rate."""
    shaping = {"reward_shaping_configs": [{"stats_key": "llm_quality_score", "op_type": "ADD", "weight": 1.0},
                                          {"stats_key": "length_ratio", "op_type": "MUL", "weight": 0.5}]}
    pipe = Pipeline.from_config([OperatorConfig(name="pass_rate_calculator"),
                                 OperatorConfig(name="reward_shaping_mapper", args=shaping),
                                 OperatorConfig(name="drop_equal_reward_groups")], None)
    assert pipe.feeds_back
    g = _group([1.0, 0.0])
    for e, q in zip(g.experiences, (0.5, 0.25), strict=True):
        e.info.update(llm_quality_score=q, length_ratio=2.0)
    out, rate = pipe.run(g)
    assert rate == 0.5 and [e.reward for e in out.experiences] == [1.5, 0.25]
    same = _group([1.0, 1.0])
    for e in same.experiences:
        e.info.update(llm_quality_score=0.0, length_ratio=1.0)
    assert pipe.run(same) == (None, 1.0)  # dropped, and its pass rate still goes back
    with pytest.raises(ValueError, match=r"operators\[0\] \(reward_shaping_mapper\).args.reward_shaping_configs\[0\]"
                                         r".stats_key: missing"):
        Pipeline.from_config([OperatorConfig(name="reward_shaping_mapper", args={
            "reward_shaping_configs": [{"op_type": "ADD", "weight": 1.0}]})], None)
    with pytest.raises(ValueError, match=r"reward_shaping_configs\[0\].op_type: 'POW'"):
        Pipeline.from_config([OperatorConfig(name="reward_shaping_mapper", args={
            "reward_shaping_configs": [{"stats_key": "x", "op_type": "POW"}]})], None)
    bare = _group([1.0, 0.0])
    with pytest.raises(ValueError, match=r"experiences\[0\].info\['llm_quality_score'\]: missing"):
        pipe.run(bare)
    thr = Pipeline.from_config([OperatorConfig(name="pass_rate_calculator", args={"success_threshold": 0.9})], None)
    assert thr.run(_group([1.0, 0.5, 0.95, 0.0]))[1] == 0.5


def test_collate_aligns_response_positions_and_dpo_pairs():
    g = _group([0.0, 1.0])
    b = collate(g.experiences)
    assert b.input_ids.shape == (2, 7) and b.action_mask.sum().item() == 3 + 4
    # response token t of row 1 is predicted at position prompt_length - 1 + t
    assert b.resp_index[1].tolist() == [2, 3, 4, 5]
    assert b.has_old.all()
    dpo = Experience(id="d", task_id="d", group_id="d", run_id="r", tokens=np.arange(4, dtype=np.int32),
                     prompt_length=4, chosen=np.array([7, 8], np.int32), rejected=np.array([9], np.int32))
    b = collate([dpo])
    assert b.size == 2 and b.input_ids[0, 4:6].tolist() == [7, 8] and b.input_ids[1, 4].item() == 9
    assert b.action_mask.sum(-1).tolist() == [2, 1]
    with pytest.raises(ValueError, match="experience 'x'"):
        collate([Experience(id="x", task_id="x", group_id="x", run_id="r", tokens=np.arange(3, dtype=np.int32), prompt_length=3)])


def test_batch_protocol_round_trip_and_errors():
    """The trainer-buffer RPC bodies are codec records: they round-trip, and a malformed one is
    refused naming the record and field."""
    from schemas import codec
    from schemas.codec import CodecError

    req = codec.decode(codec.encode(BatchRequest(3, 8, 2, 1.5)), BatchRequest)
    assert (req.step, req.n, req.trainer_version, req.timeout) == (3, 8, 2, 1.5)
    with pytest.raises(CodecError, match="message: expected object, got int"):
        codec.decode(b"\x01garbage", BatchRequest)
    with pytest.raises(CodecError, match="BatchRequest: step 0 and n 8 must be >= 1"):
        codec.encode(BatchRequest(0, 8))
    with pytest.raises(CodecError, match=r"BatchRequest.n: expected int, got str"):
        codec.decode(codec.encode(BatchRequest(3, 8)).replace(b"\xa1n\x08", b"\xa1n\xa1x"), BatchRequest)
    with pytest.raises(CodecError, match="expected a BatchRequest, got a Commit"):
        codec.decode(codec.encode(Commit(2)), BatchRequest)
    with pytest.raises(CodecError, match="Commit.upto: must be >= 0"):
        codec.encode(Commit(-1))

    e = _group([1.0]).experiences[0]
    rep = codec.decode(codec.encode(BatchReply(3, [codec.encode(e)], [2], 8)), BatchReply)
    assert rep.partial and experiences(rep)[0].id == e.id and experiences(rep)[0].info["use_count"] == 2
    assert np.array_equal(experiences(rep)[0].tokens, e.tokens)
    with pytest.raises(CodecError, match="BatchReply.use_counts: 2 counts for 1 items"):
        codec.encode(BatchReply(3, [codec.encode(e)], [2, 1], 8))


def test_shard_rows_splits_by_tokens_keeps_pairs_and_covers_every_row():
    from roles.trainer.ranks import shard_rows

    lengths = [30, 10, 10, 10, 20, 20]
    parts = [shard_rows(lengths, r, 2) for r in range(2)]
    assert sorted(parts[0] + parts[1]) == list(range(6))
    assert parts == [[0, 1, 2], [3, 4, 5]]  # 50 and 50 tokens, each in batch order
    pairs = [shard_rows(lengths, r, 2, pair=True) for r in range(2)]
    assert all(i + 1 in p for p in pairs for i in p if i % 2 == 0)  # chosen with its rejected
    assert [shard_rows([5], r, 3) for r in range(3)] == [[0], [], []]  # fewer rows than ranks


def test_trainer_processes_follow_the_cluster_split(tmp_path):
    from roles.cli import launch_trainer_ranks
    from roles.runtime.placement import device_plan, trainer_ranks
    from schemas.config import TrinityConfig

    def cfg(**kw):
        base = {"mode": "both", "cluster": {"gpu_per_node": 8},
                "explorer": {"rollout_model": {"engine_num": 2, "tensor_parallel_size": 2}}}
        base.update(kw)
        return TrinityConfig.model_validate(base)

    def ranks(c):
        plan = device_plan([c])
        return trainer_ranks(plan), plan.gpus("trainer")

    assert ranks(cfg()) == (4, (4, 5, 6, 7))  # explorer GPUs first, the trainer the rest
    assert ranks(cfg(mode="train")) == (8, tuple(range(8)))
    assert ranks(cfg(cluster={"gpu_per_node": 0})) == (1, ())
    with pytest.raises(ValueError, match="cluster.gpu_per_node: 4 .*none to the trainer"):
        ranks(cfg(cluster={"gpu_per_node": 4}))
    with pytest.raises(ValueError, match="cluster.node_num"):
        ranks(cfg(cluster={"gpu_per_node": 8, "node_num": 2}))
    with pytest.raises(ValueError, match="trainer.trainer_type: 'pytorch' trains in one process"):
        c = cfg(mode="train", trainer={"trainer_type": "pytorch"})
        launch_trainer_ranks([c], device_plan([c]))


def test_flash_attention_only_on_a_gpu_with_the_package():
    from roles.trainer.engine import attn_implementation

    if not torch.cuda.is_available():
        assert attn_implementation() is None  # SDPA: FlashAttention kernels are CUDA-only


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_the_trainer_loads_flash_attention_when_installed(tmp_path):
    pytest.importorskip("flash_attn")
    from roles.trainer.engine import load_model
    from storage.tiny import build_tiny_model

    model = load_model(build_tiny_model(tmp_path / "m"), dtype=torch.bfloat16)
    assert model.config._attn_implementation == "flash_attention_2"
