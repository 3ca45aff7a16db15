"""Will a run fit its GPUs (``roles/runtime/fit.py`` over ``ops/memory.py``)? The plan's
memory lines and the refusal with the settings that would fit, on a Qwen2-0.5B-shaped model
(its config alone: the parameters are counted on the meta device)."""

from __future__ import annotations

import json

import pytest

from roles.runtime.fit import describe_memory, fit_problems, model_shape
from roles.runtime.placement import device_plan
from schemas.config import TrinityConfig

pytestmark = pytest.mark.unit

QWEN2_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
             "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
             "max_position_embeddings": 32768}


@pytest.fixture
def model(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(QWEN2_05B))
    return str(tmp_path / "m")


def cfg(model: str, **kw) -> TrinityConfig:
    base = {"mode": "both", "cluster": {"gpu_per_node": 2}, "model": {"model_path": model, "max_model_len": 2048},
            "algorithm": {"algorithm_type": "grpo"}}
    return TrinityConfig.model_validate({**base, **kw})


def test_the_shape_is_read_from_the_config_alone(model):
    m = model_shape(model)
    assert not isinstance(m, str)
    assert (m.hidden, m.layers, m.vocab, m.kv_width) == (896, 24, 151936, 2 * 2 * 64)
    assert 490e6 < m.params < 500e6  # Qwen2-0.5B: 494M, the embedding tied
    assert "not a local model folder" in model_shape("Qwen/Qwen2.5-0.5B")


def test_the_plan_shows_each_gpus_processes_and_a_gpu_too_small_is_refused_with_what_fits(model):
    c = cfg(model)
    plan = device_plan([c])
    lines = describe_memory(plan, [c], 80.0)
    assert lines[0] == "memory per GPU (estimated, ops/memory.py) of 80 GiB (this machine's GPU 0):"
    assert "  node 0 GPU 0: rollout engine 0 (vllm, tp 1) 90% of the GPU (gpu_memory_utilization)" in lines
    trainer = next(line for line in lines if "GPU 1" in line)
    assert "trainer rank" in trainer and "optimizer" in trainer and "reference" in trainer
    assert fit_problems(plan, [c], 80.0) == []
    (why,) = fit_problems(plan, [c], 8.0)
    assert why.startswith("node 0 GPU 1: the estimate is ") and "trainer.deepspeed.offload_optimizer: true" in why
    assert "ignore_validator_suggestions: true" in why
    # the vLLM engine's own GPU: its share is reserved, the engine sizes itself inside it
    assert not any("GPU 0" in p for p in fit_problems(plan, [c], 8.0))


def test_colocated_engine_and_trainer_add_up_on_one_gpu(model):
    c = cfg(model, mode="colocate", cluster={"gpu_per_node": 1}, synchronizer={"sync_method": "memory"},
            explorer={"rollout_model": {"engine_type": "transformers"}})
    plan = device_plan([c])
    line = next(x for x in describe_memory(plan, [c], None) if x.startswith("  node 0 GPU 0"))
    assert "rollout engine 0 (transformers, tp 1)" in line and "kv cache" in line and "trainer rank" in line
    (why,) = fit_problems(plan, [c], 6.0)
    assert "rollout engine 0" in why and "trainer rank" in why


def test_a_cpu_plan_has_no_memory_lines_and_an_unreadable_model_says_so(model):
    assert describe_memory(device_plan([cfg(model, cluster={"gpu_per_node": 0})]), [cfg(model)], None) == []
    hub = cfg("Qwen/Qwen2.5-0.5B")
    assert describe_memory(device_plan([hub]), [hub], None) == [
        "memory: not estimated ('Qwen/Qwen2.5-0.5B' is not a local model folder)"]


def test_the_start_refuses_what_does_not_fit_unless_ignore_validator_suggestions(model, monkeypatch, capsys):
    """On a machine whose GPU is 8 GiB (its size stood in for: this one has none) the start's
    check refuses the plan; ``ignore_validator_suggestions: true`` turns it into a warning."""
    import roles.launch.checks as checks

    monkeypatch.setattr(checks, "gpu_gib", lambda: 8.0)
    (why,) = checks.gpu_fit_problems([cfg(model)])
    assert "node 0 GPU 1" in why
    assert checks.gpu_fit_problems([cfg(model, ignore_validator_suggestions=True)]) == []
    assert "trinity: warning: node 0 GPU 1" in capsys.readouterr().err
    assert checks.gpu_fit_problems([cfg(model, cluster={"gpu_per_node": 0})]) == []
