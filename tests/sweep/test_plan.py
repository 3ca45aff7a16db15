"""``trinity sweep``'s plan: which runs ``--set KEY=V1,V2`` makes, and what keeps runs from
sharing one trainer and one engine (named by run and field)."""

from __future__ import annotations

from pathlib import Path

import pytest

from roles.tools.sweep.plan import LABEL_MAX, check_shared, expand, split_values
from schemas.config import TrinityConfig


def test_every_combination_is_a_run_with_its_own_name():
    runs = expand("calc", ["algorithm.optimizer.lr=1e-5,3e-5", "algorithm.repeat_times=4",
                           "algorithm.kl_coef=0.0,0.1"])
    assert [r.name for r in runs] == ["calc-lr1e-5-kl_coef0.0", "calc-lr1e-5-kl_coef0.1",
                                      "calc-lr3e-5-kl_coef0.0", "calc-lr3e-5-kl_coef0.1"]
    assert [r.slot for r in runs] == ["run0", "run1", "run2", "run3"]
    assert runs[1].overrides == ["algorithm.repeat_times=4", "algorithm.optimizer.lr=1e-5",
                                 "algorithm.kl_coef=0.1", "name=calc-lr1e-5-kl_coef0.1"]
    assert runs[2].choices == {"algorithm.optimizer.lr": "3e-5", "algorithm.kl_coef": "0.0"}


def test_lists_and_quoted_commas_are_one_value():
    assert split_values("[q_proj,v_proj],all-linear") == ["[q_proj,v_proj]", "all-linear"]
    assert split_values("'a,b',c") == ["'a,b'", "c"]
    assert split_values("{x: 1, y: 2}") == ["{x: 1, y: 2}"]


@pytest.mark.parametrize("sets,match", [
    (["algorithm.optimizer.lr=1e-5"], "no swept value"),
    (["algorithm.optimizer.lr=1e-5,1e-5"], "appears twice"),
    (["name=a,b"], "names its runs itself"),
    (["algorithm.optimizer.lr"], "KEY=VALUE"),
    (["algorithm.optimizer.lr=,"], "value 1 is empty"),
    (["algorithm.optimizer.lr=1e-3,", "x=1"], "value 2 is empty"),
    # 1e-3 and 3e-3 would never run: every run would take the second --set's value
    (["algorithm.optimizer.lr=1e-3,3e-3", "algorithm.optimizer.lr=1e-2,3e-2"], "swept twice"),
])
def test_what_is_not_a_sweep_is_refused(sets, match):
    with pytest.raises(ValueError, match=match):
        expand("calc", sets)


def _run(name, **kw) -> TrinityConfig:
    base = dict(project="t", name=name, mode="both",
                model={"model_path": "m", "lora_configs": [{"lora_rank": 8}]},
                synchronizer={"sync_method": "nccl"},
                explorer={"rollout_model": {"engine_type": "transformers"}},
                trainer={"trainer_type": "pytorch"})
    for k, v in kw.items():
        base[k] = {**base.get(k, {}), **v} if isinstance(v, dict) else v
    return TrinityConfig(**base)


def test_runs_that_can_share():
    assert check_shared({"a": _run("a"), "b": _run("b", algorithm={"optimizer": {"lr": 1e-3}})}) == []


@pytest.mark.parametrize("kw,field", [
    ({"model": {"model_path": "m", "lora_configs": None}}, "model.lora_configs"),
    ({"synchronizer": {"sync_method": "checkpoint"}}, "synchronizer.sync_method"),
    ({"explorer": {"rollout_model": {"engine_type": "vllm"}}}, "explorer.rollout_model.engine_type"),
    ({"trainer": {"trainer_type": "deepspeed"}}, "trainer.trainer_type"),
    ({"mode": "train"}, "mode"),
    ({"model": {"model_path": "other", "lora_configs": [{"lora_rank": 8}]}}, "model.model_path differs"),
])
def test_what_keeps_runs_from_sharing_is_named(kw, field):
    problems = check_shared({"a": _run("a"), "b": _run("b", **kw)})
    assert any(p.startswith("run b:") and field in p for p in problems), problems


def test_runs_serving_the_api_on_one_port_are_refused():
    api = {"rollout_model": {"engine_type": "transformers", "enable_openai_api": True}}
    problems = check_shared({"a": _run("a", explorer=api), "b": _run("b", explorer=api)})
    assert any("explorer.openai_api.port" in p for p in problems), problems
    free = {**api, "openai_api": {"port": 0}}
    assert check_shared({"a": _run("a", explorer=free), "b": _run("b", explorer=free)}) == []


def test_the_example_sweep_loads_and_can_share(tmp_path):
    from pathlib import Path

    from roles.tools.sweep.launch import load_runs

    example = Path(__file__).resolve().parents[2] / "examples" / "sweep" / "lora_grpo.yaml"
    runs = expand("lora_grpo", ["algorithm.optimizer.lr=1e-3,3e-3"])
    loaded = load_runs(str(example), str(tmp_path / ".env"), runs)  # raises naming what cannot share
    cfgs = [lc.config for lc in loaded.values()]
    assert [c.name for c in cfgs] == ["lora_grpo-lr1e-3", "lora_grpo-lr3e-3"]
    assert [c.algorithm.optimizer.lr for c in cfgs] == [1e-3, 3e-3]
    assert cfgs[0].checkpoint_job_dir != cfgs[1].checkpoint_job_dir and cfgs[0].run_id != cfgs[1].run_id


def test_a_sweep_that_names_no_sync_method_takes_the_broadcast_not_the_cpu_default(tmp_path):
    """On one CPU machine an unnamed sync_method is memory; a sweep's shared engine takes each
    run's adapter by broadcast, so its runs are pinned to nccl (every role process loads the
    pinned overrides from the sweep file)."""
    from pathlib import Path

    from roles.tools.sweep.launch import load_runs

    example = Path(__file__).resolve().parents[2] / "examples" / "sweep" / "lora_grpo.yaml"
    text = example.read_text().replace("sync_method: nccl, ", "")
    assert text != example.read_text()
    (tmp_path / "s.yaml").write_text(text)
    runs = expand("lora_grpo", ["algorithm.optimizer.lr=1e-3,3e-3"])
    loaded = load_runs(str(tmp_path / "s.yaml"), str(tmp_path / ".env"), runs)
    assert [lc.config.synchronizer.sync_method for lc in loaded.values()] == ["nccl", "nccl"]
    assert all("synchronizer.sync_method=nccl" in r.overrides for r in runs)


def test_values_whose_tags_collide_or_are_long_get_distinct_short_names():
    """``a b`` and ``a/b`` both read ``a_b``: two runs of one name were merged (each
    experience trained twice); a 348-character value made a file name too long."""
    runs = expand("n", ["explorer.system_prompt=a b,a/b"])
    assert len({r.name for r in runs}) == 2
    long = expand("n", ["explorer.system_prompt=" + "x" * 348 + ",short"])
    assert len({r.name for r in long}) == 2 and all(len(r.name) <= 2 + LABEL_MAX for r in long)
    for r in runs + long:  # every name is one the config accepts
        TrinityConfig(project="t", name=r.name)


def test_a_sweep_of_more_runs_than_max_runs_is_refused_before_anything_loads(tmp_path):
    """200 swept values started 402 processes (~100 GB); --max-runs bounds it, exit 2."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "roles.cli", "sweep", "--config", str(tmp_path / "none.yaml"),
                        "--set", "algorithm.optimizer.lr=1e-3,2e-3,3e-3", "--max-runs", "2"],
                       capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert r.returncode == 2 and "3 runs; this sweep may start at most 2 (--max-runs" in r.stderr, r.stderr
    assert not (tmp_path / "checkpoints").exists()


def test_max_runs_below_two_is_refused_not_read_as_the_default(tmp_path):
    import subprocess
    import sys

    for bad in ("0", "-3"):
        r = subprocess.run([sys.executable, "-m", "roles.cli", "sweep", "--config", str(tmp_path / "none.yaml"),
                            "--set", "algorithm.optimizer.lr=1e-3,2e-3", "--max-runs", bad],
                           capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
        assert r.returncode == 2 and f"--max-runs {bad}: a sweep is at least 2 runs" in r.stderr, r.stderr
