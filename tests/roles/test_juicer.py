"""Data-Juicer (the real py-data-juicer package) in the experience and task pipelines, and the
configuration guide's data snippets as a Trinity-RFT user writes them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from roles.buffer.pipeline import Pipeline
from schemas.config import OperatorConfig
from schemas.data import Experience, ExperienceGroup
from schemas.loader import load_config

#: A Data-Juicer recipe in the style of Trinity-RFT's ``dj_scoring_exp.yaml``, offline ops only.
RECIPE = {"project_name": "dj-scoring-exp", "np": 1, "process": [
    {"text_length_filter": {"min_len": 3, "max_len": 40}}, {"alphanumeric_filter": {"min_ratio": 0.5}}]}


def _group(texts: list[str]) -> ExperienceGroup:
    exps = [Experience(id=f"g/{i}", task_id="t/0", group_id="g", run_id="r", tokens=np.arange(6, dtype=np.int32),
                       prompt_length=3, reward=1.0, response_text=t) for i, t in enumerate(texts)]
    return ExperienceGroup(group_id="g", task_id="t/0", run_id="r", experiences=exps)


def test_guide_experience_pipeline_runs_real_data_juicer_filters_then_shapes_rewards(tmp_path: Path) -> None:
    """The guide's ``experience_pipeline``: ``data_juicer`` with a recipe file, then
    ``reward_shaping_mapper`` on a stat it computed. The filters' stats land in each
    experience's ``info``; what they reject is dropped (``keep_filtered`` keeps and scores it);
    a mapper (it would rewrite text the tokens no longer match) and an unknown op are refused
    when the pipeline is built, naming the operator."""
    recipe = tmp_path / "dj_scoring_exp.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    ops = [OperatorConfig(name="data_juicer", args={"config_path": str(recipe)}),
           OperatorConfig(name="reward_shaping_mapper", args={"reward_shaping_configs": [
               {"stats_key": "text_len", "op_type": "ADD", "weight": 0.01}]})]
    out = Pipeline.from_config(ops, None)(_group(["the answer is 42", "x", "!!!!!!!!!!", "#### 17 is the sum"]))
    assert [e.response_text for e in out.experiences] == ["the answer is 42", "#### 17 is the sum"]
    assert [e.info["text_len"] for e in out.experiences] == [16.0, 18.0]
    assert [round(e.reward, 4) for e in out.experiences] == [1.16, 1.18]
    assert "alnum_ratio" in out.experiences[0].info
    keep = Pipeline.from_config([OperatorConfig(name="data_juicer", args={"config_path": str(recipe),
                                                                          "keep_filtered": True})], None)
    assert len(keep(_group(["fine text", "x"])).experiences) == 2
    with pytest.raises(ValueError, match=r"operators\[0\] \(data_juicer\): recipe operator 0: clean_email_mapper is a Mapper"):
        Pipeline.from_config([OperatorConfig(name="data_juicer", args={"operators": [{"clean_email_mapper": None}]})], None)
    with pytest.raises(ValueError, match=r"'no_such_filter' is not a Data-Juicer operator"):
        Pipeline.from_config([OperatorConfig(name="data_juicer", args={"operators": ["no_such_filter"]})], None)
    with pytest.raises(ValueError, match=r"args.config_path: no Data-Juicer recipe at"):
        Pipeline.from_config([OperatorConfig(name="data_juicer", args={"config_path": str(tmp_path / "nope.yaml")})], None)


def _guide_config(tmp_path: Path, tasks: Path, **data_processor: object) -> Path:
    """A config in the seeds' shape with the guide's task-selector snippet (two feature
    columns, BOTS's kwargs) and the given ``data_processor``."""
    cfg = {
        "project": "guide", "name": "data", "mode": "both", "checkpoint_root_dir": str(tmp_path / "ckpt"),
        "model": {"model_path": str(tmp_path / "model")},
        "algorithm": {"algorithm_type": "grpo", "repeat_times": 4},
        "buffer": {"batch_size": 2, "total_epochs": 1, "explorer_input": {
            "tasksets": [{"name": "my_taskset", "storage_type": "file", "path": str(tasks),
                          "format": {"prompt_key": "question", "response_key": "answer"},
                          "task_selector": {"selector_type": "difficulty_based", "feature_keys": ["correct", "uncertainty"],
                                            "kwargs": {"m": 16, "lamb": 0.2, "rho": 0.2, "target_reward": 0.9,
                                                       "tau": 0.5, "do_sample": True}}}],
            "default_workflow_type": "math_workflow", "default_reward_fn_type": "math_reward"}},
        "data_processor": data_processor,
    }
    path = tmp_path / "guide.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _tasks(path: Path, n: int = 12) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"question": f"{i}+{i}={' ' * (i % 4)}?", "answer": str(2 * i), "correct": 0.1 * (i % 5),
             "uncertainty": min(1.0, 0.1 * (i % 5) + 0.4)} for i in range(n)]
    (path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_guide_selector_snippet_and_data_processor_load(tmp_path: Path) -> None:
    """The guide's task-selector snippet with the ``pass_rate_calculator`` it asks for, and
    its ``data_processor`` (a ``task_pipeline`` of Data-Juicer ops, an experience pipeline of
    ``data_juicer`` then ``reward_shaping_mapper``) load without a warning; the task pipeline
    runs once, keeps the rows its filter keeps with their stats as columns, and its output
    is the training taskset."""
    from roles.launch.checks import preflight
    from storage.juicer import run_task_pipeline
    from storage.tiny import build_tiny_model

    build_tiny_model(tmp_path / "model")
    tasks = _tasks(tmp_path / "tasks")
    recipe = tmp_path / "dj_scoring_exp.yaml"
    recipe.write_text(yaml.safe_dump(RECIPE))
    path = _guide_config(tmp_path, tasks, experience_pipeline={"operators": [
        {"name": "pass_rate_calculator"},
        {"name": "data_juicer", "args": {"config_path": str(recipe)}},
        {"name": "reward_shaping_mapper", "args": {"reward_shaping_configs": [
            {"stats_key": "text_len", "op_type": "ADD", "weight": 1.0}]}}]})
    loaded = load_config(str(path))
    assert loaded.warnings == [] and loaded.config.data_processor.experience_pipeline.operators[1].name == "data_juicer"
    preflight([loaded.config], "run")

    # the guide's task_pipeline, on a single taskset (its output becomes that taskset)
    raw = yaml.safe_load(path.read_text())
    ts = raw["buffer"]["explorer_input"].pop("tasksets")[0]
    ts.pop("path")
    raw["buffer"]["explorer_input"]["taskset"] = ts
    raw["data_processor"] = {"task_pipeline": {
        "num_process": 1, "inputs": [str(tasks / "train.jsonl")], "target_fields": ["question"],
        "operators": [{"name": "text_length_filter", "args": {"min_len": 0, "max_len": 6}},
                      {"name": "whitespace_normalization_mapper"}]},
        "experience_pipeline": {"operators": [{"name": "pass_rate_calculator"}]}}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    loaded = load_config(str(path))
    assert [w for w in loaded.warnings if "num_process" not in w] == []
    cfg = loaded.config
    assert cfg.buffer.explorer_input.taskset.path.endswith("task_pipeline")
    preflight([cfg], "run")  # runs the pipeline: the checks then read its output
    out = Path(cfg.buffer.explorer_input.taskset.path) / "train.jsonl"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows and all(r["text_len"] <= 6 for r in rows) and len(rows) < 12
    assert {"question", "answer", "correct", "uncertainty", "text_len"} <= set(rows[0])
    before = out.stat().st_mtime_ns
    assert run_task_pipeline(cfg) == out and out.stat().st_mtime_ns == before  # done once
    # an input that is not there fails before start, naming it
    raw["data_processor"]["task_pipeline"]["inputs"] = [str(tmp_path / "nowhere.jsonl")]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    from schemas.loader import ConfigError

    with pytest.raises(ConfigError, match=r"data_processor.task_pipeline.inputs\[0\]: no file .*nowhere.jsonl"):
        preflight([load_config(str(path)).config], "run")
    # no taskset at all: "the output will be set to the explorer input automatically", with the
    # default format, said in a warning
    raw["data_processor"]["task_pipeline"]["inputs"] = [str(tasks / "train.jsonl")]
    del raw["buffer"]["explorer_input"]["taskset"]
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    loaded = load_config(str(path))
    assert loaded.config.buffer.explorer_input.taskset.path.endswith("task_pipeline")
    assert any("buffer.explorer_input.taskset is made from" in w for w in loaded.warnings)


def test_without_the_package_the_error_names_it() -> None:
    """Without py-data-juicer installed (here: its import blocked), a pipeline that names a
    Data-Juicer operator fails when it is built, naming the package and the extra."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['data_juicer'] = None\n"
            "from roles.buffer.pipeline import Pipeline\nfrom schemas.config import OperatorConfig\n"
            "Pipeline.from_config([OperatorConfig(name='data_juicer', args={'operators': ['text_length_filter']})], None)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 1
    assert ("data_processor.experience_pipeline.operators[0] (data_juicer): the data_juicer operators need "
            "the py-data-juicer package: pip install -e \".[data-juicer]\"") in out.stderr, out.stderr[-2000:]
